/* libmokka-state.so: the one write path of a live state (see mokka_state.h).
 *
 * gpumodel/state.py loads it through cffi, holds the file's flock (writers serialise; a
 * killed writer's lock dies with it), builds the new copy in private memory and calls
 * mokka_state_publish, which rewrites both copies in place as a latch:
 *
 *   seq even: readers use copy 0. First copy 0 -> copy 1 (a writer killed while writing
 *             copy 1 leaves it torn; readers are on copy 0, so it can be rebuilt), then
 *             seq odd: readers move to copy 1.
 *   seq odd:  (also what a writer killed while writing copy 0 leaves) readers use copy 1:
 *             write the new copy 0, make seq even (readers move to it), write copy 1.
 *
 * The ordering readers rely on (they load seq with acquire, read, fence acquire, reload
 * seq) comes from a release store of seq after each copy is written and a release fence
 * after each seq store, before the next copy's writes: `dmb ish` on aarch64, compiler
 * barriers on x86-64 (whose stores are already ordered). Exports only mokka_state_*. */
#include <string.h>

#include "../mokka_state.h"

#define EXPORT __attribute__((visibility("default")))

enum { PUBLISHED = 0, BAD_REGION = -1, BAD_SIZE = -2 };

static uint64_t copy_size(const mokka_header_t *h) {
    return (uint64_t)h->node_size + (uint64_t)h->gpu_count * h->gpu_size;
}

static int check(const mokka_header_t *h, uint64_t region_size) {
    if (region_size < sizeof(mokka_header_t) || h->magic != MOKKA_STATE_MAGIC || h->version != MOKKA_STATE_VERSION ||
        h->header_size != sizeof(mokka_header_t) || h->node_size != sizeof(mokka_node_t) ||
        h->gpu_size != sizeof(mokka_gpu_t) || h->gpu_count > MOKKA_MAX_GPUS ||
        region_size < sizeof(mokka_header_t) + 2 * copy_size(h))
        return BAD_REGION;
    return PUBLISHED;
}

/* The copy readers use now (the one to start a change from): 0 or 1. */
EXPORT int mokka_state_stable_copy(const void *region, uint64_t region_size) {
    const mokka_header_t *h = region;
    if (check(h, region_size) != PUBLISHED) return BAD_REGION;
    return (int)(__atomic_load_n(&h->seq, __ATOMIC_ACQUIRE) & 1);
}

/* Make `live` (one copy: node section and records) what every reader sees. The caller
 * holds the file's lock. Returns 0, or a negative error for a region or size mismatch. */
EXPORT int mokka_state_publish(void *region, uint64_t region_size, const void *live, uint64_t live_size) {
    mokka_header_t *h = region;
    if (check(h, region_size) != PUBLISHED) return BAD_REGION;
    uint64_t size = copy_size(h);
    if (live_size != size) return BAD_SIZE;
    char *copy0 = (char *)region + sizeof(mokka_header_t), *copy1 = copy0 + size;

    uint32_t s = __atomic_load_n(&h->seq, __ATOMIC_RELAXED);
    if (!(s & 1)) {
        memcpy(copy1, copy0, size);
        __atomic_store_n(&h->seq, ++s, __ATOMIC_RELEASE); /* odd: readers on copy 1 */
        __atomic_thread_fence(__ATOMIC_RELEASE);
    }
    memcpy(copy0, live, size);
    __atomic_store_n(&h->seq, ++s, __ATOMIC_RELEASE); /* even: readers on the new copy 0 */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(copy1, live, size);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    return PUBLISHED;
}
