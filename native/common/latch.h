/* The latch's write side (see mokka_state.h): validating a region and publishing a new copy of
 * the live data. One definition for both writers: libmokka-state.so (what gpumodel/state.py
 * calls) and the NVML library's own changes (common/state_write.c: MIG instances created or
 * destroyed through NVML). The caller holds the file's flock.
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
 * barriers on x86-64 (whose stores are already ordered).
 *
 * Every publish ends by waking whoever sleeps in FUTEX_WAIT on `seq` (nvmlEventSetWait): a
 * shared futex, keyed by the file's page, so sleepers in every process (containers too) wake. */
#ifndef MOKKA_LATCH_H
#define MOKKA_LATCH_H

#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../mokka_state.h"

/* Bytes of one copy of the live data (node section and GPU records). */
static inline uint64_t mokka_latch_copy_size(const mokka_header_t *h) {
    return (uint64_t)h->node_size + (uint64_t)h->gpu_count * h->gpu_size;
}

/* Whether `region_size` bytes at `h` are a whole region of this layout. */
static inline int mokka_latch_region_ok(const mokka_header_t *h, uint64_t region_size) {
    return region_size >= sizeof(mokka_header_t) && h->magic == MOKKA_STATE_MAGIC &&
           h->version == MOKKA_STATE_VERSION && h->header_size == sizeof(mokka_header_t) &&
           h->node_size == sizeof(mokka_node_t) && h->gpu_size == sizeof(mokka_gpu_t) &&
           h->gpu_count <= MOKKA_MAX_GPUS && region_size >= sizeof(mokka_header_t) + 2 * mokka_latch_copy_size(h);
}

/* The copy readers use now (the one to start a change from): 0 or 1. */
static inline int mokka_latch_stable_copy(const mokka_header_t *h) {
    return (int)(__atomic_load_n(&h->seq, __ATOMIC_ACQUIRE) & 1);
}

/* Wake every process sleeping on the counter (a no-op system call when none is). */
static inline void mokka_latch_wake(mokka_header_t *h) { syscall(SYS_futex, &h->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* Both copies rewritten whole (mokka_latch_publish without the wake). */
static inline void mokka_latch_write_whole(void *region, const void *live) {
    mokka_header_t *h = region;
    uint64_t size = mokka_latch_copy_size(h);
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
}

/* Make `live` (one whole copy) what every reader sees. */
static inline void mokka_latch_publish(void *region, const void *live) {
    mokka_latch_write_whole(region, live);
    mokka_latch_wake(region);
}

/* The same as mokka_latch_publish where `live` differs from what readers see in a few records
 * only: when the counter is at rest and both copies are equal (no writer died midway), only the
 * records (and node section) that changed are written, copy 1 first, then copy 0, with the same
 * counter steps; otherwise the whole copies are written. Each page written through a shared file
 * mapping costs a fault, so a change to one GPU writes one record's pages, not every GPU's. */
static inline void mokka_latch_publish_changes(void *region, const void *live) {
    mokka_header_t *h = region;
    uint64_t size = mokka_latch_copy_size(h);
    char *copy0 = (char *)region + sizeof(mokka_header_t), *copy1 = copy0 + size;
    uint32_t s = __atomic_load_n(&h->seq, __ATOMIC_RELAXED);
    if ((s & 1) || memcmp(copy0, copy1, size) != 0) {
        mokka_latch_publish(region, live);
        return;
    }
    const char *in = live;
    for (int pass = 0; pass < 2; pass++) {
        char *target = pass == 0 ? copy1 : copy0; /* seq even: readers on copy 0, then on copy 1 */
        uint64_t off = 0;
        for (uint32_t i = 0; i <= h->gpu_count; i++) {
            uint64_t len = i == 0 ? h->node_size : h->gpu_size;
            const char *now = (pass == 0 ? copy0 : copy1) + off; /* what the other copy held */
            if (pass == 0 ? memcmp(in + off, now, len) != 0 : memcmp(in + off, target + off, len) != 0)
                memcpy(target + off, in + off, len);
            off += len;
        }
        __atomic_store_n(&h->seq, ++s, __ATOMIC_RELEASE);
        __atomic_thread_fence(__ATOMIC_RELEASE);
    }
    mokka_latch_wake(h);
}

#endif
