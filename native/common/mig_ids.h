/* MIG device identities shared by the mock libraries: the MIG UUID a compute instance gets,
 * and which MIG device an NVIDIA_VISIBLE_DEVICES entry names (`MIG-<uuid>`, `<gpu>:<mig>`,
 * the pre-R470 `MIG-GPU-<uuid>/<gi>/<ci>`). */
#ifndef MOKKA_MIG_IDS_H
#define MOKKA_MIG_IDS_H

#include <stddef.h>

#include "../mokka_state.h"

/* "MIG-" and a name-based UUID of the parent and the instances (gpumodel/mig.py mig_uuid). */
void mokka_mig_uuid(char out[48], const char *gpu_uuid, unsigned gi_id, unsigned gi_profile_id, unsigned ci_id,
                    unsigned ci_profile_id);

/* Whether `item` (one NVIDIA_VISIBLE_DEVICES entry, `n` bytes) names a MIG device of GPU record
 * `g` (read from a consistent copy); if so, its GI and CI ids. `<gpu>:<mig>` counts the GPU's
 * MIG devices in node order (ascending GI, then CI id). */
int mokka_mig_item(const char *item, size_t n, const mokka_gpu_t *g, unsigned *gi, unsigned *ci);

#endif
