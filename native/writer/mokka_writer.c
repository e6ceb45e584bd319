/* libmokka-state.so: the one write path of a live state (see mokka_state.h).
 *
 * gpumodel/state.py loads it through cffi, holds the file's flock (writers serialise; a
 * killed writer's lock dies with it), builds the new copy in private memory and calls
 * mokka_state_publish, which rewrites both copies in place as a latch (common/latch.h, the
 * same code the NVML library uses for its own changes). Exports only mokka_state_*. */
#include "../common/latch.h"

#define EXPORT __attribute__((visibility("default")))

enum { PUBLISHED = 0, BAD_REGION = -1, BAD_SIZE = -2 };

/* The copy readers use now (the one to start a change from): 0 or 1. */
EXPORT int mokka_state_stable_copy(const void *region, uint64_t region_size) {
    if (!mokka_latch_region_ok(region, region_size)) return BAD_REGION;
    return mokka_latch_stable_copy(region);
}

/* Make `live` (one copy: node section and records) what every reader sees. The caller
 * holds the file's lock. Returns 0, or a negative error for a region or size mismatch. */
EXPORT int mokka_state_publish(void *region, uint64_t region_size, const void *live, uint64_t live_size) {
    if (!mokka_latch_region_ok(region, region_size)) return BAD_REGION;
    if (live_size != mokka_latch_copy_size(region)) return BAD_SIZE;
    mokka_latch_publish(region, live);
    return PUBLISHED;
}
