/* The library's life: dcgmInit, the embedded "host engine" (which here is only the binding to
 * NVML and the entities found through it: no thread, no cache, no daemon), connections to a
 * host engine (answered in-process the same way), error strings and versions. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

mokka_dcgm_t g_dcgm = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The handle every start and connection gets: one engine per process. */
#define MOKKA_DCGM_HANDLE ((dcgmHandle_t)0x4d4f4b4bu)

long long mokka_dcgm_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

EXPORT dcgmReturn_t dcgmInit(void) {
    pthread_mutex_lock(&g_dcgm.lock);
    g_dcgm.initialized = 1;
    pthread_mutex_unlock(&g_dcgm.lock);
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmShutdown(void) {
    pthread_mutex_lock(&g_dcgm.lock);
    if (g_dcgm.started) {
        if (g_dcgm.events) NVML(nvmlEventSetFree)(g_dcgm.events);
        g_dcgm.events = NULL;
        for (unsigned i = 0; i < g_dcgm.gpu_count; i++)
            for (int s = 0; s < 2; s++)
                if (g_dcgm.gpus[i].samples[s]) NVML(nvmlGpmSampleFree)(g_dcgm.gpus[i].samples[s]);
        NVML(nvmlShutdown)();
    }
    g_dcgm.started = 0;
    g_dcgm.initialized = 0;
    pthread_mutex_unlock(&g_dcgm.lock);
    return DCGM_ST_OK;
}

static dcgmReturn_t start(dcgmHandle_t *handle) {
    if (!handle) return DCGM_ST_BADPARAM;
    if (!g_dcgm.initialized) return DCGM_ST_UNINITIALIZED;
    pthread_mutex_lock(&g_dcgm.lock);
    dcgmReturn_t r = DCGM_ST_OK;
    if (!g_dcgm.started) {
        if (mokka_dcgm_bind_nvml() != 0) r = DCGM_ST_INIT_ERROR;
        else if (NVML(nvmlInit_v2)() != NVML_SUCCESS) r = DCGM_ST_INIT_ERROR;
        else if ((r = mokka_dcgm_discover()) == DCGM_ST_OK) g_dcgm.started = 1;
    }
    pthread_mutex_unlock(&g_dcgm.lock);
    if (r == DCGM_ST_OK) *handle = MOKKA_DCGM_HANDLE;
    return r;
}

EXPORT dcgmReturn_t dcgmStartEmbedded(dcgmOperationMode_t mode, dcgmHandle_t *handle) {
    if (mode != DCGM_OPERATION_MODE_AUTO && mode != DCGM_OPERATION_MODE_MANUAL) return DCGM_ST_BADPARAM;
    return start(handle);
}

EXPORT dcgmReturn_t dcgmStopEmbedded(dcgmHandle_t handle) {
    return handle == MOKKA_DCGM_HANDLE ? DCGM_ST_OK : DCGM_ST_BADPARAM;
}

/* A "remote" host engine is this process's: the node's state is the same wherever it is read. */
EXPORT dcgmReturn_t dcgmConnect_v2(const char *address, dcgmConnectV2Params_v2 *params, dcgmHandle_t *handle) {
    if (!address || !params) return DCGM_ST_BADPARAM;
    return start(handle);
}

EXPORT dcgmReturn_t dcgmDisconnect(dcgmHandle_t handle) {
    return handle == MOKKA_DCGM_HANDLE ? DCGM_ST_OK : DCGM_ST_BADPARAM;
}

EXPORT dcgmReturn_t dcgmVersionInfo(dcgmVersionInfo_v2 *info) {
    if (!info) return DCGM_ST_BADPARAM;
    if (info->version != dcgmVersionInfo_version2) return DCGM_ST_VER_MISMATCH;
    snprintf(info->rawBuildInfoString, sizeof info->rawBuildInfoString,
             "version:4.2.3;arch:x86_64;buildtype:Release;buildplatform:Mokka (mock, answers from NVML);");
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmHostengineVersionInfo(dcgmHandle_t handle, dcgmVersionInfo_v2 *info) {
    (void)handle;
    return dcgmVersionInfo(info);
}

EXPORT const char *errorString(dcgmReturn_t result) {
    switch (result) {
    case DCGM_ST_OK: return "Success";
    case DCGM_ST_BADPARAM: return "Bad parameter passed to function";
    case DCGM_ST_GENERIC_ERROR: return "Generic unspecified error";
    case DCGM_ST_MEMORY: return "Out of memory error";
    case DCGM_ST_NOT_CONFIGURED: return "Setting not configured";
    case DCGM_ST_NOT_SUPPORTED: return "Feature not supported";
    case DCGM_ST_INIT_ERROR: return "DCGM initialization error";
    case DCGM_ST_NVML_ERROR: return "NVML error";
    case DCGM_ST_UNINITIALIZED: return "Object is in undefined state";
    case DCGM_ST_VER_MISMATCH: return "API version mismatch";
    case DCGM_ST_UNKNOWN_FIELD: return "Unknown field identifier";
    case DCGM_ST_NO_DATA: return "No data is available";
    case DCGM_ST_STALE_DATA: return "Only stale data is available";
    case DCGM_ST_NOT_WATCHED: return "Field is not being watched";
    case DCGM_ST_NO_PERMISSION: return "No permission";
    case DCGM_ST_GPU_IS_LOST: return "GPU is lost";
    case DCGM_ST_CONNECTION_NOT_VALID: return "Host engine connection invalid/disconnected";
    case DCGM_ST_GPU_NOT_SUPPORTED: return "This GPU is not supported by DCGM";
    case DCGM_ST_MAX_LIMIT: return "Max limit reached for the object";
    case DCGM_ST_PROFILING_NOT_SUPPORTED: return "Profiling is not supported for this group of GPUs or GPU";
    default: return "Unknown error";
    }
}

/* Referenced by dcgm-exporter, never called by it; outside what the mock covers (policies,
 * diagnostics, accounting, injection, introspection, driver attach/detach). */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define UNSUPPORTED(name, ...) \
    EXPORT dcgmReturn_t name(__VA_ARGS__) { return DCGM_ST_NOT_SUPPORTED; }
UNSUPPORTED(dcgmAttachDriver, dcgmHandle_t h)
UNSUPPORTED(dcgmDetachDriver, dcgmHandle_t h)
UNSUPPORTED(dcgmCreateFakeEntities, dcgmHandle_t h, void *entities)
UNSUPPORTED(dcgmInjectFieldValue, dcgmHandle_t h, unsigned gpu, void *value)
UNSUPPORTED(dcgmGetPidInfo, dcgmHandle_t h, dcgmGpuGrp_t g, void *info)
UNSUPPORTED(dcgmWatchPidFields, dcgmHandle_t h, dcgmGpuGrp_t g, long long freq, double age, int samples)
UNSUPPORTED(dcgmIntrospectGetHostengineCpuUtilization, dcgmHandle_t h, void *out)
UNSUPPORTED(dcgmIntrospectGetHostengineMemoryUsage, dcgmHandle_t h, void *out)
UNSUPPORTED(dcgmPolicyGet, dcgmHandle_t h, dcgmGpuGrp_t g, int count, void *policy, void *status)
UNSUPPORTED(dcgmPolicySet, dcgmHandle_t h, dcgmGpuGrp_t g, void *policy, void *status)
UNSUPPORTED(dcgmPolicyRegister_v2, dcgmHandle_t h, dcgmGpuGrp_t g, unsigned condition, void *cb, uint64_t data)
UNSUPPORTED(dcgmPolicyUnregister, dcgmHandle_t h, dcgmGpuGrp_t g, unsigned condition)
UNSUPPORTED(dcgmRunDiagnostic, dcgmHandle_t h, dcgmGpuGrp_t g, int level, void *response)
