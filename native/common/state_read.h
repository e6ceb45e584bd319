/* The read side of Mokka's state, shared by every mock library (NVML, CUDA): find the
 * state, validate and map it, read it through the latch, decide which GPUs this process
 * sees. Compiled into each library with hidden visibility: nothing here is exported. */
#ifndef MOKKA_STATE_READ_H
#define MOKKA_STATE_READ_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "../mokka_state.h"

typedef struct {
    const mokka_header_t *hdr;
    const mokka_node_t *node[2];  /* the two copies: node section ... */
    const mokka_gpu_t *gpus[2];   /* ... then hdr->gpu_count records */
    size_t copy_size;             /* bytes from copy 0 to copy 1 */
    void *map;                    /* what was mmapped (page-aligned), for munmap */
    size_t map_size;
} mokka_map_t;

extern mokka_map_t g_state;

/* MOKKA_NA in a field: the board does not support the value. */
static inline int mokka_is_na(uint32_t v) { return v == (uint32_t)MOKKA_NA; }

typedef enum {
    MOKKA_MAP_OK = 0,
    MOKKA_MAP_MISSING,   /* no state where we looked: the "driver" is not loaded */
    MOKKA_MAP_INVALID,   /* found, but truncated, corrupt or of another layout version */
} mokka_map_status_t;

/* Find and map the state into g_state: $MOKKA_STATE if set (a state file or a library
 * file that carries one), else the state the file `carrier` carries (NULL: none known).
 * Says why on stderr on failure (unless MOKKA_QUIET is set). */
mokka_map_status_t mokka_map_state(const char *carrier);

/* The path of the file the library containing address `self` was loaded from, as this
 * process (and its mount namespace) sees it; 0 on success. */
int mokka_library_file(const void *self, char *out, size_t size);
void mokka_unmap_state(void);

/* Where the state region lies in an open file of `file_size` bytes: from byte 0 (a state
 * file) or where a library's trailer says. NULL on success, else why not. */
const char *mokka_find_region(int fd, uint64_t file_size, uint64_t *offset, uint64_t *size);

/* ---- the latch ---------------------------------------------------------------------
 * seq odd: a writer is rewriting copy 0, read copy 1; seq even: read copy 0. A reader
 * retries only when seq moved during its read, i.e. a live writer made progress; a
 * writer that died midway leaves seq still, and readers keep using the intact copy. */

static inline uint32_t mokka_seq_begin(void) { return __atomic_load_n(&g_state.hdr->seq, __ATOMIC_ACQUIRE); }

static inline int mokka_seq_retry(uint32_t start, unsigned *tries) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&g_state.hdr->seq, __ATOMIC_RELAXED) == start) return 0;
    if (++*tries > 64) sched_yield(); /* a writer is busy right now: let it finish */
    return 1;
}

/* The same record in the copy that `seq` names. */
static inline const mokka_gpu_t *mokka_rebase(const mokka_gpu_t *g, uint32_t seq) {
    size_t off = (size_t)((const char *)g - (const char *)g_state.gpus[0]);
    if (off >= g_state.copy_size) off -= g_state.copy_size;
    return (const mokka_gpu_t *)((const char *)g_state.gpus[seq & 1] + off);
}

/* The record of GPU `slot` (index in the state) in the copy readers use now. Fields that
 * never change live may be read through it directly; live ones go through MOKKA_READ. */
static inline const mokka_gpu_t *mokka_gpu_now(unsigned slot) {
    return g_state.gpus[__atomic_load_n(&g_state.hdr->seq, __ATOMIC_RELAXED) & 1] + slot;
}

/* Run STMT against a consistent copy; G (a `const mokka_gpu_t *` variable) is pointed at
 * the record in that copy first, so STMT reads its fields through G. (Variadic: STMT may be a
 * block with commas.) */
#define MOKKA_READ(G, ...)                                    \
    do {                                                      \
        uint32_t mokka_seq_;                                  \
        unsigned mokka_tries_ = 0;                            \
        do {                                                  \
            mokka_seq_ = mokka_seq_begin();                   \
            (G) = mokka_rebase((G), mokka_seq_);              \
            __VA_ARGS__;                                      \
        } while (mokka_seq_retry(mokka_seq_, &mokka_tries_)); \
    } while (0)

/* ---- visibility --------------------------------------------------------------------- */

/* The GPUs this process sees, as state slots in the order it numbers them:
 * NVIDIA_VISIBLE_DEVICES (indices or UUIDs, "all", "none"; "void" leaves it to the device
 * nodes), and where any of the node's /dev/nvidiaN exist (inside a container) only those
 * (MOKKA_IGNORE_DEVICE_NODES turns that off). Returns how many. */
unsigned mokka_visible_slots(unsigned out[MOKKA_MAX_GPUS]);

#endif
