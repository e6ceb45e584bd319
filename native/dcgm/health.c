/* Health watches (dcgmHealthSet/Get/Check): what DCGM's watches conclude from the same NVML
 * readings, for the faults Mokka injects. Per GPU of the group (an instance counts as its GPU):
 *   PCIe     a lost GPU: fallen off the bus (fail); Xid 79 likewise
 *   memory   volatile double-bit ECC errors, row-remap failure, Xid 48/63/64/92/94/95 (fail);
 *            pages pending retirement (warn)
 *   NVLink   a supported link that is down (fail); CRC/replay/recovery errors (warn); Xid 74 (fail)
 *   thermal  temperature at or above the slowdown threshold (warn)
 *   driver   any other Xid since the watches were set (warn)
 * Rates over time (PCIe replays per minute, power and thermal violation time) are not judged. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

EXPORT dcgmReturn_t dcgmHealthSet(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmHealthSystems_t systems) {
    (void)handle;
    int slot = mokka_dcgm_group_slot(group);
    if (slot < 0) return DCGM_ST_NOT_CONFIGURED;
    mokka_dcgm_poll_events();
    pthread_mutex_lock(&g_dcgm.lock);
    g_dcgm.health[slot] = systems;
    g_dcgm.health_since[slot] = mokka_dcgm_now_us();
    pthread_mutex_unlock(&g_dcgm.lock);
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmHealthGet(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmHealthSystems_t *systems) {
    (void)handle;
    int slot = mokka_dcgm_group_slot(group);
    if (!systems) return DCGM_ST_BADPARAM;
    if (slot < 0) return DCGM_ST_NOT_CONFIGURED;
    *systems = g_dcgm.health[slot];
    return DCGM_ST_OK;
}

typedef struct {
    dcgmHealthResponse_v5 *out;
    unsigned watched;
    unsigned gpu;
} check_t;

__attribute__((format(printf, 5, 6))) static void incident(check_t *c, unsigned system, dcgmHealthWatchResults_t health,
                                                           unsigned code, const char *fmt, ...) {
    if (!(c->watched & system) || c->out->incidentCount >= DCGM_GROUP_MAX_ENTITIES_V2) return;
    dcgmIncidentInfo_t *i = &c->out->incidents[c->out->incidentCount++];
    memset(i, 0, sizeof *i);
    i->system = system;
    i->health = health;
    i->error.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(i->error.msg, sizeof i->error.msg, fmt, ap);
    va_end(ap);
    i->entityInfo = (dcgmGroupEntityPair_t){DCGM_FE_GPU, c->gpu};
    if (health > c->out->overallHealth) c->out->overallHealth = health;
}

static void check_gpu(check_t *c, long long since) {
    nvmlDevice_t d = g_dcgm.gpus[c->gpu].device;
    unsigned u, v;
    if (NVML(nvmlDeviceGetMinorNumber)(d, &u) == NVML_ERROR_GPU_IS_LOST) {
        incident(c, DCGM_HEALTH_WATCH_PCIE, DCGM_HEALTH_RESULT_FAIL, DCGM_FR_FALLEN_OFF_BUS,
                 "GPU %u has fallen off the bus", c->gpu);
        return;
    }
    unsigned long long n;
    if (NVML(nvmlDeviceGetTotalEccErrors)(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &n) ==
            NVML_SUCCESS && n)
        incident(c, DCGM_HEALTH_WATCH_MEM, DCGM_HEALTH_RESULT_FAIL, DCGM_FR_VOLATILE_DBE_DETECTED,
                 "Detected %llu volatile double-bit ECC error(s) in GPU %u.", n, c->gpu);
    nvmlEnableState_t pending;
    if (NVML(nvmlDeviceGetRetiredPagesPendingStatus)(d, &pending) == NVML_SUCCESS && pending == NVML_FEATURE_ENABLED)
        incident(c, DCGM_HEALTH_WATCH_MEM, DCGM_HEALTH_RESULT_WARN, DCGM_FR_PENDING_PAGE_RETIREMENTS,
                 "A pending retired page has been detected in GPU %u.", c->gpu);
    unsigned corr, unc, rpend, fail;
    if (NVML(nvmlDeviceGetRemappedRows)(d, &corr, &unc, &rpend, &fail) == NVML_SUCCESS && fail)
        incident(c, DCGM_HEALTH_WATCH_MEM, DCGM_HEALTH_RESULT_FAIL, DCGM_FR_ROW_REMAP_FAILURE,
                 "GPU %u had uncorrectable memory errors and row remapping failed.", c->gpu);
    for (unsigned l = 0; l < DCGM_NVLINK_MAX_LINKS_PER_GPU; l++) {
        nvmlEnableState_t active;
        if (NVML(nvmlDeviceGetNvLinkState)(d, l, &active) == NVML_SUCCESS && active != NVML_FEATURE_ENABLED)
            incident(c, DCGM_HEALTH_WATCH_NVLINK, DCGM_HEALTH_RESULT_FAIL, DCGM_FR_NVLINK_DOWN,
                     "GPU %u's NvLink link %u is currently down", c->gpu, l);
    }
    static const struct {
        unsigned nvml;
        const char *what;
    } nvlink_errors[] = {{NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "CRC FLIT"},
                         {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, "CRC Data"},
                         {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, "Replay"},
                         {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "Recovery"}};
    for (size_t k = 0; k < sizeof nvlink_errors / sizeof *nvlink_errors; k++) {
        nvmlFieldValue_t f = {.fieldId = nvlink_errors[k].nvml};
        if (NVML(nvmlDeviceGetFieldValues)(d, 1, &f) == NVML_SUCCESS && f.nvmlReturn == NVML_SUCCESS &&
            f.value.ullVal)
            incident(c, DCGM_HEALTH_WATCH_NVLINK, DCGM_HEALTH_RESULT_WARN, DCGM_FR_NVLINK_ERROR_THRESHOLD,
                     "Detected %llu %s NvLink errors on GPU %u's NVLink which exceeds threshold of 0",
                     f.value.ullVal, nvlink_errors[k].what, c->gpu);
    }
    if (NVML(nvmlDeviceGetTemperature)(d, NVML_TEMPERATURE_GPU, &u) == NVML_SUCCESS &&
        NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, &v) == NVML_SUCCESS && u >= v)
        incident(c, DCGM_HEALTH_WATCH_THERMAL, DCGM_HEALTH_RESULT_WARN, DCGM_FR_TEMP_VIOLATION,
                 "Temperature %u of GPU %u exceeded user-specified maximum allowed temperature %u", u, c->gpu, v);
    const mokka_dcgm_gpu_t *g = &g_dcgm.gpus[c->gpu];
    if (g->xid_count && g->xid_ts >= since) {
        unsigned xid = (unsigned)g->last_xid;
        unsigned system = DCGM_HEALTH_WATCH_DRIVER;
        dcgmHealthWatchResults_t result = DCGM_HEALTH_RESULT_WARN;
        unsigned code = DCGM_FR_XID_ERROR;
        if (xid == 48 || xid == 63 || xid == 64 || xid == 92 || xid == 94 || xid == 95)
            system = DCGM_HEALTH_WATCH_MEM, result = DCGM_HEALTH_RESULT_FAIL;
        else if (xid == 74) system = DCGM_HEALTH_WATCH_NVLINK, result = DCGM_HEALTH_RESULT_FAIL;
        else if (xid == 79) system = DCGM_HEALTH_WATCH_PCIE, result = DCGM_HEALTH_RESULT_FAIL, code = DCGM_FR_FALLEN_OFF_BUS;
        if (code == DCGM_FR_FALLEN_OFF_BUS) incident(c, system, result, code, "GPU %u has fallen off the bus", c->gpu);
        else incident(c, system, result, code, "Detected XID %u for GPU %u", xid, c->gpu);
    }
}

EXPORT dcgmReturn_t dcgmHealthCheck(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmHealthResponse_v5 *out) {
    (void)handle;
    if (!out) return DCGM_ST_BADPARAM;
    if (out->version != dcgmHealthResponse_version5) return DCGM_ST_VER_MISMATCH;
    int slot = mokka_dcgm_group_slot(group);
    if (slot < 0) return DCGM_ST_NOT_CONFIGURED;
    mokka_dcgm_poll_events();
    static dcgmGroupEntityPair_t entities[DCGM_GROUP_MAX_ENTITIES_V2];
    int n = mokka_dcgm_group_entities(group, entities, DCGM_GROUP_MAX_ENTITIES_V2);
    out->overallHealth = DCGM_HEALTH_RESULT_PASS;
    out->incidentCount = 0;
    check_t c = {.out = out, .watched = g_dcgm.health[slot]};
    unsigned done = 0; /* GPUs checked, as bits */
    for (int e = 0; e < n; e++) {
        unsigned gpu = entities[e].entityId;
        if (entities[e].entityGroupId == DCGM_FE_GPU_I) gpu = g_dcgm.gis[gpu].gpu;
        else if (entities[e].entityGroupId == DCGM_FE_GPU_CI) gpu = g_dcgm.cis[gpu].gpu;
        else if (entities[e].entityGroupId != DCGM_FE_GPU) continue;
        if (gpu >= g_dcgm.gpu_count || done >> gpu & 1) continue;
        done |= 1u << gpu;
        c.gpu = gpu;
        check_gpu(&c, g_dcgm.health_since[slot]);
    }
    return DCGM_ST_OK;
}
