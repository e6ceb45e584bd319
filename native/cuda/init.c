/* cuInit: find the node's state and enumerate the devices this process sees (enumerate.c:
 * GPUs and MIG devices, NVIDIA_VISIBLE_DEVICES and device nodes as the NVML mock has them, then
 * CUDA_VISIBLE_DEVICES), once; the version and device count. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

mokka_cuda_t g_cuda;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* The file carrying the state: the NVML mock, beside this library or wherever the dynamic
 * loader finds libnvidia-ml.so.1 for this process (a container's library directory). */
static int state_carrier(char *out, size_t size) {
    char self[PATH_MAX];
    if (mokka_library_file((const void *)&mokka_cuda_init, self, sizeof self) == 0) {
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            if (snprintf(out, size, "%s/libnvidia-ml.so.1", self) < (int)size && access(out, R_OK) == 0) return 0;
        }
    }
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    void *sym = nvml ? dlsym(nvml, "nvmlInit_v2") : NULL;
    return sym ? mokka_library_file(sym, out, size) : -1;
}

CUresult mokka_cuda_init(void) {
    pthread_mutex_lock(&g_lock);
    if (!g_cuda.initialized && g_cuda.init_result == CUDA_SUCCESS) {
        char carrier[PATH_MAX];
        switch (mokka_map_state(state_carrier(carrier, sizeof carrier) == 0 ? carrier : NULL)) {
        case MOKKA_MAP_OK: {
            g_cuda.count = mokka_cuda_enumerate();
            if (g_cuda.count == 0) {
                g_cuda.init_result = CUDA_ERROR_NO_DEVICE;
                mokka_unmap_state();
            } else {
                g_cuda.initialized = 1;
            }
            break;
        }
        case MOKKA_MAP_MISSING: g_cuda.init_result = CUDA_ERROR_NO_DEVICE; break;
        default: g_cuda.init_result = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
        }
    }
    CUresult r = g_cuda.initialized ? CUDA_SUCCESS : g_cuda.init_result;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return mokka_cuda_init();
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    /* Answered without cuInit, as the real driver does: the state's CUDA version when
     * it can be read, else the default the library reports. */
    if (!g_cuda.initialized) mokka_cuda_init();
    *version = g_cuda.initialized ? (int)g_state.hdr->cuda_version : 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    CUDA_NEED_INIT();
    *count = (int)g_cuda.count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    CUDA_NEED_INIT();
    if (ordinal < 0 || (unsigned)ordinal >= g_cuda.count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
