/* Which MIG devices this process may use, as a container runtime and the driver arrange it:
 * NVIDIA_VISIBLE_DEVICES (a GPU's index or UUID: all of its MIG devices; MIG-<uuid>, <gpu>:<mig>,
 * MIG-GPU-<uuid>/<gi>/<ci>: just those), and inside a container (where the node's /dev/nvidiaN
 * exist) only those whose GI and CI capability nodes exist in /dev/nvidia-caps, as the driver
 * grants access. Shared by the mock libraries (NVML, CUDA); each library keeps its own view. */
#ifndef MOKKA_MIG_VIEW_H
#define MOKKA_MIG_VIEW_H

#include <stdint.h>

#include "../mokka_state.h"

#define MOKKA_CAP_MINORS (3 + 135 * 32) /* /proc/driver/nvidia-caps/mig-minors: config, monitor, 32 GPUs */

typedef struct {
    int by_caps;                         /* in a container: only those with capability nodes */
    unsigned char caps[(MOKKA_CAP_MINORS + 7) / 8];
    int by_list;                         /* NVIDIA_VISIBLE_DEVICES names devices */
    uint64_t whole;                      /* slots listed as whole GPUs */
    unsigned n_uuids;
    char uuids[MOKKA_MAX_GPUS][48];      /* MIG devices listed one by one */
} mokka_mig_view_t;

extern mokka_mig_view_t g_mokka_mig_view;

/* Set the view up for the GPUs this process sees: `slots` (state records, n of them), as
 * mokka_visible_slots gives them. */
void mokka_mig_view_init(const unsigned *slots, unsigned n);

/* Whether this process may use CI `c` of GI `gi` on GPU record `g` (a consistent copy), whose
 * state slot is `slot`. */
int mokka_mig_view_sees(const mokka_gpu_t *g, unsigned slot, const mokka_gi_t *gi, const mokka_ci_t *c);

/* The same, answered without a call where nothing restricts the view (the common case). */
static inline int mokka_mig_visible(const mokka_gpu_t *g, unsigned slot, const mokka_gi_t *gi, const mokka_ci_t *c) {
    return !(g_mokka_mig_view.by_list || g_mokka_mig_view.by_caps) || mokka_mig_view_sees(g, slot, gi, c);
}

#endif
