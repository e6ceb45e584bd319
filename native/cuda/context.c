/* Contexts: there is no GPU to run on. Creating or retaining one fails cleanly with
 * CUDA_ERROR_NOT_SUPPORTED; every call that needs a current context answers
 * CUDA_ERROR_INVALID_CONTEXT, as the real driver does while none is current; queries
 * about "no context" succeed. Nothing here allocates or remembers anything. */
#include <stddef.h>

#include "internal.h"

/* The stubs below take the real signatures (checked against cuda.h) and use none of them. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define NO_CONTEXT(decl)                     \
    EXPORT CUresult decl {                   \
        CUDA_NEED_INIT();                    \
        return CUDA_ERROR_INVALID_CONTEXT;   \
    }

#define CANNOT_CREATE(decl, dev)                                               \
    EXPORT CUresult decl {                                                     \
        CUDA_NEED_INIT();                                                      \
        if ((dev) < 0 || (unsigned)(dev) >= g_cuda.count) return CUDA_ERROR_INVALID_DEVICE; \
        return CUDA_ERROR_NOT_SUPPORTED;                                       \
    }

CANNOT_CREATE(cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev), dev)
CANNOT_CREATE(cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev), dev)
CANNOT_CREATE(cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev), dev)
CANNOT_CREATE(cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev), dev)
CANNOT_CREATE(cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev), dev)

NO_CONTEXT(cuCtxDestroy(CUcontext ctx))
NO_CONTEXT(cuCtxDestroy_v2(CUcontext ctx))
NO_CONTEXT(cuCtxPushCurrent(CUcontext ctx))
NO_CONTEXT(cuCtxPushCurrent_v2(CUcontext ctx))
NO_CONTEXT(cuCtxPopCurrent(CUcontext *pctx))
NO_CONTEXT(cuCtxPopCurrent_v2(CUcontext *pctx))
NO_CONTEXT(cuCtxGetDevice(CUdevice *device))
NO_CONTEXT(cuCtxGetFlags(unsigned int *flags))
NO_CONTEXT(cuCtxSetFlags(unsigned int flags))
NO_CONTEXT(cuCtxSynchronize(void))
NO_CONTEXT(cuCtxGetLimit(size_t *value, CUlimit limit))
NO_CONTEXT(cuCtxSetLimit(CUlimit limit, size_t value))
NO_CONTEXT(cuCtxGetCacheConfig(CUfunc_cache *config))
NO_CONTEXT(cuCtxSetCacheConfig(CUfunc_cache config))
NO_CONTEXT(cuCtxGetApiVersion(CUcontext ctx, unsigned int *version))
NO_CONTEXT(cuCtxGetStreamPriorityRange(int *least, int *greatest))
NO_CONTEXT(cuCtxGetId(CUcontext ctx, unsigned long long *id))
NO_CONTEXT(cuMemGetInfo(unsigned int *free_bytes, unsigned int *total))
NO_CONTEXT(cuMemGetInfo_v2(size_t *free_bytes, size_t *total))

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    CUDA_NEED_INIT();
    *pctx = NULL; /* none is current */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    CUDA_NEED_INIT();
    return ctx == NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    CUDA_GPU(dev, g);
    (void)g;
    *flags = 0;
    *active = 0;
    return CUDA_SUCCESS;
}

#define PRIMARY_NOOP(decl, dev)            \
    EXPORT CUresult decl {                 \
        CUDA_GPU(dev, g);                  \
        (void)g;                           \
        return CUDA_SUCCESS;               \
    }

/* Flags may be set before a primary context exists; releasing or resetting one that was
 * never retained changes nothing. */
PRIMARY_NOOP(cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags), dev)
PRIMARY_NOOP(cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags), dev)
PRIMARY_NOOP(cuDevicePrimaryCtxRelease(CUdevice dev), dev)
PRIMARY_NOOP(cuDevicePrimaryCtxRelease_v2(CUdevice dev), dev)
PRIMARY_NOOP(cuDevicePrimaryCtxReset(CUdevice dev), dev)
PRIMARY_NOOP(cuDevicePrimaryCtxReset_v2(CUdevice dev), dev)
