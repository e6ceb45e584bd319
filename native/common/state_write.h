/* Changing the live state from inside a mock library (e.g. MIG instances created through
 * NVML): the same path as gpumodel.state.update — the file's flock, a private copy of the live
 * data changed, published through the latch (common/latch.h). Every process on the node sees
 * the change on its next call. */
#ifndef MOKKA_STATE_WRITE_H
#define MOKKA_STATE_WRITE_H

#include "../mokka_state.h"

enum {
    MOKKA_WRITE_OK = 0,
    MOKKA_WRITE_NO_ACCESS = -1, /* the state file cannot be opened for writing (a read-only mount,
                                   an unprivileged process) */
    MOKKA_WRITE_FAILED = -2,    /* missing, unlockable, or not a state of this layout */
};

/* Called with the file locked and a private copy of the live data (the node section and
 * gpu_count records); returns 0 to publish it, anything else to drop it (that value is then
 * mokka_state_change's result). */
typedef int (*mokka_change_fn)(mokka_node_t *node, mokka_gpu_t *gpus, unsigned gpu_count, void *ctx);

/* Apply `change` to the state this library reads ($MOKKA_STATE, else the library's own file). */
int mokka_state_change(mokka_change_fn change, void *ctx);

#endif
