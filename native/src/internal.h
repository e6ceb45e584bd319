/* Internal declarations shared by the mock NVML library's translation units. */
#ifndef MOKKA_INTERNAL_H
#define MOKKA_INTERNAL_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <stddef.h>
#include <stdint.h>

#include "../mokka_state.h"

#define EXPORT __attribute__((visibility("default")))
#define MOKKA_HANDLE_MAGIC 0x4d4f4b41u
#define MOKKA_SEQ_GAVE_UP 1u /* never a value a reader starts from: those are even */

#ifndef MOKKA_DEFAULT_NVML_VERSION
#define MOKKA_DEFAULT_NVML_VERSION "12.550.163.01"
#endif
#ifndef MOKKA_DEFAULT_CUDA_VERSION
#define MOKKA_DEFAULT_CUDA_VERSION 12040
#endif

struct nvmlDevice_st {
    uint32_t magic;
    uint32_t visible_index;      /* index as this process sees it */
    const mokka_gpu_t *gpu;
};

typedef struct {
    const mokka_header_t *hdr;
    const mokka_gpu_t *gpus;     /* hdr->gpu_count records */
    size_t map_size;
    unsigned visible_count;
    struct nvmlDevice_st devices[MOKKA_MAX_GPUS];
} mokka_ctx_t;

extern mokka_ctx_t g_mokka;
extern int g_mokka_refcount;

/* seqlock read side: retry STMT until it ran against an unchanged, even `seq`. */
uint32_t mokka_seq_begin(void);
int mokka_seq_retry(uint32_t start);
#define MOKKA_READ(stmt)                                  \
    do {                                                  \
        uint32_t mokka_seq_;                              \
        do {                                              \
            mokka_seq_ = mokka_seq_begin();               \
            stmt;                                         \
        } while (mokka_seq_retry(mokka_seq_));            \
    } while (0)

/* Validate an nvmlDevice_t and fetch its record; returns from the caller on error. */
nvmlReturn_t mokka_device(nvmlDevice_t device, const mokka_gpu_t **out);
#define GET_GPU(device, g)                                         \
    const mokka_gpu_t *g;                                          \
    do {                                                           \
        nvmlReturn_t r_ = mokka_device((device), &g);              \
        if (r_ != NVML_SUCCESS) return r_;                         \
    } while (0)

uint64_t mokka_energy_mj(const mokka_gpu_t *g);
/* The visible GPU at a PCI bus id (4- or 8-digit domain), or NULL. */
const mokka_gpu_t *mokka_gpu_by_bus_id(const char *bus_id);
/* The GPU's processes of one type (0 compute, 1 graphics, 2 MPS), copied under the seqlock. */
unsigned mokka_processes(const mokka_gpu_t *g, unsigned type, mokka_process_t out[MOKKA_MAX_PROCS]);
nvmlReturn_t mokka_copy_string(char *dst, unsigned int length, const char *src, size_t src_size);
#define COPY_FIELD(dst, length, field) mokka_copy_string((dst), (length), (field), sizeof(field))
static inline int mokka_is_na(uint32_t v) { return v == (uint32_t)MOKKA_NA; }

#endif
