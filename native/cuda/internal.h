/* Internal declarations of the mock libcuda (driver API) translation units. It answers
 * from the same state as the mock NVML (common/), found through that library's file. */
#ifndef MOKKA_CUDA_INTERNAL_H
#define MOKKA_CUDA_INTERNAL_H

#define __CUDA_API_VERSION_INTERNAL 1 /* declare the legacy (unversioned) entry points too */
#include <cuda.h>
#include <stdint.h>

#include "../common/state_read.h"

#define EXPORT __attribute__((visibility("default")))

/* CUDA enumerates at most 64 MIG devices across all GPUs (NVIDIA MIG user guide, "CUDA
 * Device Enumeration"), beside every GPU without MIG. */
#define MOKKA_CUDA_MAX_MIG 64
#define MOKKA_CUDA_MAX_DEVICES (MOKKA_MAX_GPUS + MOKKA_CUDA_MAX_MIG)

/* One CUDA device: a whole GPU, or a MIG device (one compute instance of a GPU in MIG mode).
 * A MIG device's facts are read once, at cuInit, as the driver's are: they do not change while
 * the instance lives. Everything else comes from the parent's record. */
typedef struct {
    unsigned slot;                      /* the GPU's record in the state (a MIG device's parent) */
    int is_mig;
    unsigned gi, ci;                    /* a MIG device's GPU and compute instance IDs */
    unsigned multiprocessors;           /* its compute instance's SMs */
    uint64_t memory;                    /* bytes: its GPU instance's memory */
    char uuid[48];                      /* "MIG-..." */
    char name[160];                     /* "<parent's name> MIG <compute instance profile>" */
} mokka_cuda_device_t;

typedef struct {
    int initialized;                    /* cuInit succeeded */
    CUresult init_result;               /* what cuInit answered (it answers the same again) */
    unsigned count;                     /* devices this process sees */
    mokka_cuda_device_t devices[MOKKA_CUDA_MAX_DEVICES]; /* by ordinal */
} mokka_cuda_t;

extern mokka_cuda_t g_cuda;

/* Device ordinal `dev` and its GPU record (a MIG device's parent); returns from the caller on error. */
#define CUDA_DEVICE(dev, d, g)                                                   \
    const mokka_cuda_device_t *d;                                                \
    const mokka_gpu_t *g;                                                        \
    do {                                                                         \
        if (!g_cuda.initialized) return CUDA_ERROR_NOT_INITIALIZED;              \
        if ((dev) < 0 || (unsigned)(dev) >= g_cuda.count) return CUDA_ERROR_INVALID_DEVICE; \
        d = &g_cuda.devices[(dev)];                                              \
        g = mokka_gpu_now(d->slot);                                              \
    } while (0)

/* The GPU record of device ordinal `dev`; returns from the caller on error. */
#define CUDA_GPU(dev, g)                                                         \
    CUDA_DEVICE(dev, cuda_device_, g);                                           \
    (void)cuda_device_

#define CUDA_NEED_INIT()                                                         \
    do {                                                                         \
        if (!g_cuda.initialized) return CUDA_ERROR_NOT_INITIALIZED;              \
    } while (0)

/* Map the state and choose the devices, once; later calls answer the first result. */
CUresult mokka_cuda_init(void);
/* The devices this process sees, in ordinal order, into g_cuda (mapped state); how many. */
unsigned mokka_cuda_enumerate(void);
/* The attribute's value for device `d`, whose GPU record is `g` (cuDeviceGetAttribute). */
CUresult mokka_cuda_attribute(const mokka_cuda_device_t *d, const mokka_gpu_t *g, CUdevice_attribute attr, int *out);

#endif
