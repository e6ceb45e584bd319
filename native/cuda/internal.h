/* Internal declarations of the mock libcuda (driver API) translation units. It answers
 * from the same state as the mock NVML (common/), found through that library's file. */
#ifndef MOKKA_CUDA_INTERNAL_H
#define MOKKA_CUDA_INTERNAL_H

#define __CUDA_API_VERSION_INTERNAL 1 /* declare the legacy (unversioned) entry points too */
#include <cuda.h>
#include <stdint.h>

#include "../common/state_read.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct {
    int initialized;                    /* cuInit succeeded */
    CUresult init_result;               /* what cuInit answered (it answers the same again) */
    unsigned count;                     /* devices this process sees */
    unsigned slots[MOKKA_MAX_GPUS];     /* their records in the state, by ordinal */
} mokka_cuda_t;

extern mokka_cuda_t g_cuda;

/* The record of device ordinal `dev`; returns from the caller on error. */
#define CUDA_GPU(dev, g)                                                         \
    const mokka_gpu_t *g;                                                        \
    do {                                                                         \
        if (!g_cuda.initialized) return CUDA_ERROR_NOT_INITIALIZED;              \
        if ((dev) < 0 || (unsigned)(dev) >= g_cuda.count) return CUDA_ERROR_INVALID_DEVICE; \
        g = mokka_gpu_now(g_cuda.slots[(dev)]);                                  \
    } while (0)

#define CUDA_NEED_INIT()                                                         \
    do {                                                                         \
        if (!g_cuda.initialized) return CUDA_ERROR_NOT_INITIALIZED;              \
    } while (0)

/* Map the state and choose the devices, once; later calls answer the first result. */
CUresult mokka_cuda_init(void);
/* The attribute's value for a GPU record (cuDeviceGetAttribute). */
CUresult mokka_cuda_attribute(const mokka_gpu_t *g, CUdevice_attribute attr, int *out);

#endif
