/* Binding NVML: the node's libnvidia-ml.so.1, looked up first beside this library (where
 * `mokka driver-root`, host setup and the container injections stage both), then wherever the
 * dynamic loader finds it. Already loaded (go-nvml in the exporter, say), it is the same copy. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

mokka_nvml_t g_nvml;

static void *open_nvml(void) {
    Dl_info info;
    if (dladdr((void *)open_nvml, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        char path[PATH_MAX];
        const char *slash = strrchr(info.dli_fname, '/');
        int n = snprintf(path, sizeof path, "%.*s/libnvidia-ml.so.1", (int)(slash - info.dli_fname), info.dli_fname);
        if (n > 0 && (size_t)n < sizeof path) {
            void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
            if (h) return h;
        }
    }
    return dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
}

int mokka_dcgm_bind_nvml(void) {
    static void *handle;
    if (handle) return 0;
    void *h = open_nvml();
    if (!h) {
        if (!getenv("MOKKA_QUIET")) fprintf(stderr, "mokka: libdcgm: cannot load libnvidia-ml.so.1: %s\n", dlerror());
        return -1;
    }
    mokka_nvml_t bound;
#define BIND(name, args)                                                                              \
    if (!(*(void **)&bound.name = dlsym(h, #name))) {                                                 \
        if (!getenv("MOKKA_QUIET")) fprintf(stderr, "mokka: libdcgm: libnvidia-ml.so.1 lacks %s\n", #name); \
        dlclose(h);                                                                                   \
        return -1;                                                                                    \
    }
    MOKKA_NVML_FUNCTIONS(BIND)
#undef BIND
    g_nvml = bound;
    handle = h;
    return 0;
}

dcgmReturn_t mokka_dcgm_from_nvml(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return DCGM_ST_OK;
    case NVML_ERROR_NOT_SUPPORTED: return DCGM_ST_NOT_SUPPORTED;
    case NVML_ERROR_GPU_IS_LOST: return DCGM_ST_GPU_IS_LOST;
    case NVML_ERROR_NO_PERMISSION: return DCGM_ST_NO_PERMISSION;
    case NVML_ERROR_UNINITIALIZED: return DCGM_ST_UNINITIALIZED;
    case NVML_ERROR_INVALID_ARGUMENT: return DCGM_ST_BADPARAM;
    case NVML_ERROR_NOT_FOUND: return DCGM_ST_NO_DATA;
    default: return DCGM_ST_NVML_ERROR;
    }
}
