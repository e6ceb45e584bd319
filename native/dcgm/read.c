/* Reading one field of one entity now, through NVML, in DCGM's units: the whole of what the
 * mock "collects". A value NVML does not have (NOT_SUPPORTED, a lost GPU) is DCGM's blank of
 * the field's type, with the status saying why, which is how consumers skip it.
 *
 * GPU instances and compute instances answer their own memory, name, UUID and activity
 * (through their MIG device); fields DCGM keeps per GPU (clocks, temperatures, power, ECC)
 * are the parent GPU's, as DCGM reports them for an instance. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

typedef struct {
    dcgmFieldValue_v1 *out;
    int type;
} sink_t;

static void put_i64(sink_t *s, nvmlReturn_t r, long long v) {
    s->out->status = mokka_dcgm_from_nvml(r);
    s->out->value.i64 = r == NVML_SUCCESS ? v : DCGM_INT64_BLANK;
}

static void put_dbl(sink_t *s, nvmlReturn_t r, double v) {
    s->out->status = mokka_dcgm_from_nvml(r);
    s->out->value.dbl = r == NVML_SUCCESS ? v : DCGM_FP64_BLANK;
}

static void put_str(sink_t *s, nvmlReturn_t r, const char *v) {
    s->out->status = mokka_dcgm_from_nvml(r);
    snprintf(s->out->value.str, sizeof s->out->value.str, "%s", r == NVML_SUCCESS ? v : DCGM_STR_BLANK);
}

static void put_blank(sink_t *s) {
    if (s->type == DCGM_FT_DOUBLE) put_dbl(s, NVML_ERROR_NOT_SUPPORTED, 0);
    else if (s->type == DCGM_FT_STRING) put_str(s, NVML_ERROR_NOT_SUPPORTED, "");
    else put_i64(s, NVML_ERROR_NOT_SUPPORTED, 0);
}

static nvmlReturn_t nvml_field(nvmlDevice_t d, unsigned id, long long *out) {
    nvmlFieldValue_t v = {.fieldId = id};
    nvmlReturn_t r = NVML(nvmlDeviceGetFieldValues)(d, 1, &v);
    if (r == NVML_SUCCESS) r = v.nvmlReturn;
    if (r != NVML_SUCCESS) return r;
    switch (v.valueType) {
    case NVML_VALUE_TYPE_DOUBLE: *out = (long long)v.value.dVal; break;
    case NVML_VALUE_TYPE_UNSIGNED_INT: *out = v.value.uiVal; break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG: *out = (long long)v.value.ulVal; break;
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG: *out = v.value.sllVal; break;
    default: *out = (long long)v.value.ullVal; break;
    }
    return NVML_SUCCESS;
}

/* ---- profiling (DCGM_FI_PROF_*): GPM on Hopper and later, utilization before it ------ */

static const nvmlGpmMetricId_t gpm_ids[] = {
    NVML_GPM_METRIC_GRAPHICS_UTIL,    NVML_GPM_METRIC_SM_UTIL,          NVML_GPM_METRIC_SM_OCCUPANCY,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,  NVML_GPM_METRIC_DRAM_BW_UTIL,     NVML_GPM_METRIC_FP64_UTIL,
    NVML_GPM_METRIC_FP32_UTIL,        NVML_GPM_METRIC_FP16_UTIL,        NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC,  NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, NVML_GPM_METRIC_IMMA_TENSOR_UTIL, NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    NVML_GPM_METRIC_DFMA_TENSOR_UTIL, NVML_GPM_METRIC_INTEGER_UTIL,     NVML_GPM_METRIC_NVDEC_0_UTIL,
    NVML_GPM_METRIC_NVJPG_0_UTIL,     NVML_GPM_METRIC_NVOFA_0_UTIL,
};
/* DCGM_FI_PROF_* ids in gpm_ids order. */
static const unsigned short prof_fields[] = {1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010,
                                             1011, 1012, 1013, 1014, 1015, 1016, 1017, 1025, 1033};
#define N_PROF (sizeof prof_fields / sizeof *prof_fields)
_Static_assert(sizeof gpm_ids / sizeof *gpm_ids == N_PROF, "one GPM metric per profiling field");

/* The profiling fields a GPU answers (for dcgmProfGetSupportedMetricGroups); their count. */
unsigned mokka_dcgm_prof_fields(unsigned gpu, unsigned short *out) {
    static const unsigned short basic[] = {1001, 1002, 1005, 1009, 1010}; /* from utilization and PCIe counters */
    const unsigned short *f = g_dcgm.gpus[gpu].gpm ? prof_fields : basic;
    unsigned n = g_dcgm.gpus[gpu].gpm ? N_PROF : sizeof basic / sizeof *basic;
    memcpy(out, f, n * sizeof *f);
    return n;
}

/* A GPM metric over the interval between the GPU's two latest samples, a new one taken when
 * the newer is older than 100 ms (the first read takes two). Percent, or MiB/s. */
static nvmlReturn_t gpm_metric(unsigned gpu, unsigned index, double *out) {
    mokka_dcgm_gpu_t *g = &g_dcgm.gpus[gpu];
    long long now = mokka_dcgm_now_us();
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_dcgm.lock);
    for (int s = 0; s < 2 && r == NVML_SUCCESS; s++)
        if (!g->samples[s]) r = NVML(nvmlGpmSampleAlloc)(&g->samples[s]);
    while (r == NVML_SUCCESS && (g->filled < 2 || now - g->sampled_us > 100000)) {
        nvmlGpmSample_t older = g->samples[0];
        g->samples[0] = g->samples[1];
        g->samples[1] = older; /* the oldest is overwritten */
        r = NVML(nvmlGpmSampleGet)(g->device, g->samples[1]);
        if (r == NVML_SUCCESS && g->filled < 2) g->filled++;
        g->sampled_us = now;
    }
    if (r == NVML_SUCCESS) {
        nvmlGpmMetricsGet_t m = {.version = NVML_GPM_METRICS_GET_VERSION,
                                 .numMetrics = 1,
                                 .sample1 = g->samples[0],
                                 .sample2 = g->samples[1]};
        m.metrics[0].metricId = gpm_ids[index];
        r = NVML(nvmlGpmMetricsGet)(&m);
        if (r == NVML_SUCCESS) r = m.metrics[0].nvmlReturn;
        if (r == NVML_SUCCESS) *out = m.metrics[0].value;
    }
    pthread_mutex_unlock(&g_dcgm.lock);
    return r;
}

static void read_prof(sink_t *s, unsigned gpu, nvmlDevice_t d, unsigned short field) {
    unsigned index = 0;
    while (index < N_PROF && prof_fields[index] != field) index++;
    if (index == N_PROF) return put_blank(s);
    if (g_dcgm.gpus[gpu].gpm) {
        double v = 0;
        nvmlReturn_t r = gpm_metric(gpu, index, &v);
        if (field == 1009 || field == 1010 || field == 1011 || field == 1012) /* MiB/s -> bytes/s */
            return put_i64(s, r, (long long)(v * 1048576.0));
        return put_dbl(s, r, v / 100.0);
    }
    nvmlUtilization_t u;
    unsigned kbps;
    nvmlReturn_t r;
    switch (field) {
    case 1001:
    case 1002: r = NVML(nvmlDeviceGetUtilizationRates)(d, &u); return put_dbl(s, r, u.gpu / 100.0);
    case 1005: r = NVML(nvmlDeviceGetUtilizationRates)(d, &u); return put_dbl(s, r, u.memory / 100.0);
    case 1009:
        r = NVML(nvmlDeviceGetPcieThroughput)(d, NVML_PCIE_UTIL_TX_BYTES, &kbps);
        return put_i64(s, r, (long long)kbps * 1024);
    case 1010:
        r = NVML(nvmlDeviceGetPcieThroughput)(d, NVML_PCIE_UTIL_RX_BYTES, &kbps);
        return put_i64(s, r, (long long)kbps * 1024);
    default: return put_blank(s);
    }
}

/* ---- everything else ------------------------------------------------------------------ */

static void read_memory(sink_t *s, nvmlDevice_t d, unsigned short field) {
    nvmlMemory_v2_t m = {.version = nvmlMemory_v2};
    nvmlReturn_t r = NVML(nvmlDeviceGetMemoryInfo_v2)(d, &m);
    switch (field) {
    case 250: return put_i64(s, r, (long long)(m.total >> 20));
    case 251: return put_i64(s, r, (long long)(m.free >> 20));
    case 252: return put_i64(s, r, (long long)(m.used >> 20));
    case 253: return put_i64(s, r, (long long)(m.reserved >> 20));
    default: return put_dbl(s, r, m.total ? 100.0 * (double)m.used / (double)m.total : 0);
    }
}

static void read_name(sink_t *s, nvmlDevice_t d, int instance) {
    char name[DCGM_MAX_STR_LENGTH];
    nvmlReturn_t r = NVML(nvmlDeviceGetName)(d, name, sizeof name);
    const char *mig = instance && r == NVML_SUCCESS ? strstr(name, " MIG ") : NULL;
    put_str(s, r, mig ? mig + 5 : name); /* an instance's name is its profile's: "1g.10gb" */
}

static void read_gpu_field(sink_t *s, unsigned gpu, nvmlDevice_t d, unsigned short field) {
    char str[DCGM_MAX_STR_LENGTH];
    unsigned v, v2;
    unsigned long long ull;
    long long ll;
    nvmlReturn_t r;
    nvmlEnableState_t on, pending;
    switch (field) {
    case 51: {
        nvmlBrandType_t b;
        r = NVML(nvmlDeviceGetBrand)(d, &b);
        return put_str(s, r, mokka_dcgm_brand(b));
    }
    case 52: r = NVML(nvmlDeviceGetIndex)(d, &v); return put_i64(s, r, v);
    case 53: r = NVML(nvmlDeviceGetSerial)(d, str, sizeof str); return put_str(s, r, str);
    case 55: r = NVML(nvmlDeviceGetMinorNumber)(d, &v); return put_i64(s, r, v);
    case 56: r = NVML(nvmlDeviceGetInforomVersion)(d, NVML_INFOROM_OEM, str, sizeof str); return put_str(s, r, str);
    case 80: r = NVML(nvmlDeviceGetInforomVersion)(d, NVML_INFOROM_ECC, str, sizeof str); return put_str(s, r, str);
    case 81: r = NVML(nvmlDeviceGetInforomVersion)(d, NVML_INFOROM_POWER, str, sizeof str); return put_str(s, r, str);
    case 82: r = NVML(nvmlDeviceGetInforomImageVersion)(d, str, sizeof str); return put_str(s, r, str);
    case 85: r = NVML(nvmlDeviceGetVbiosVersion)(d, str, sizeof str); return put_str(s, r, str);
    case 57:
    case 58:
    case 59: {
        nvmlPciInfo_t pci;
        r = NVML(nvmlDeviceGetPciInfo_v3)(d, &pci);
        if (field == 57) return put_str(s, r, pci.busId);
        return put_i64(s, r, field == 58 ? pci.pciDeviceId : pci.pciSubSystemId);
    }
    case 65: {
        nvmlComputeMode_t m;
        r = NVML(nvmlDeviceGetComputeMode)(d, &m);
        return put_i64(s, r, m);
    }
    case 66: r = NVML(nvmlDeviceGetPersistenceMode)(d, &on); return put_i64(s, r, on == NVML_FEATURE_ENABLED);
    case 67: r = NVML(nvmlDeviceGetMigMode)(d, &v, &v2); return put_i64(s, r, v);
    case 70:
    case 71:
    case 72:
    case 73: {
        unsigned long mask[4] = {0};
        r = NVML(nvmlDeviceGetCpuAffinity)(d, 4, mask);
        return put_i64(s, r, (long long)mask[field - 70]);
    }
    case 100: r = NVML(nvmlDeviceGetClockInfo)(d, NVML_CLOCK_SM, &v); return put_i64(s, r, v);
    case 101: r = NVML(nvmlDeviceGetClockInfo)(d, NVML_CLOCK_MEM, &v); return put_i64(s, r, v);
    case 102: r = NVML(nvmlDeviceGetClockInfo)(d, NVML_CLOCK_VIDEO, &v); return put_i64(s, r, v);
    case 110: r = NVML(nvmlDeviceGetApplicationsClock)(d, NVML_CLOCK_GRAPHICS, &v); return put_i64(s, r, v);
    case 111: r = NVML(nvmlDeviceGetApplicationsClock)(d, NVML_CLOCK_MEM, &v); return put_i64(s, r, v);
    case 112: r = NVML(nvmlDeviceGetCurrentClocksEventReasons)(d, &ull); return put_i64(s, r, (long long)ull);
    case 113: r = NVML(nvmlDeviceGetMaxClockInfo)(d, NVML_CLOCK_SM, &v); return put_i64(s, r, v);
    case 114: r = NVML(nvmlDeviceGetMaxClockInfo)(d, NVML_CLOCK_MEM, &v); return put_i64(s, r, v);
    case 115: r = NVML(nvmlDeviceGetMaxClockInfo)(d, NVML_CLOCK_VIDEO, &v); return put_i64(s, r, v);
    case 140: r = nvml_field(d, NVML_FI_DEV_MEMORY_TEMP, &ll); return put_i64(s, r, ll);
    case 150: r = NVML(nvmlDeviceGetTemperature)(d, NVML_TEMPERATURE_GPU, &v); return put_i64(s, r, v);
    case 151:
        r = NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_MEM_MAX, &v);
        return put_i64(s, r, v);
    case 152:
        r = NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_GPU_MAX, &v);
        return put_i64(s, r, v);
    case 153: r = nvml_field(d, NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT, &ll); return put_i64(s, r, ll);
    case 158:
        r = NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, &v);
        return put_i64(s, r, v);
    case 159:
        r = NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, &v);
        return put_i64(s, r, v);
    case 155: r = NVML(nvmlDeviceGetPowerUsage)(d, &v); return put_dbl(s, r, v / 1000.0);
    case 156: r = NVML(nvmlDeviceGetTotalEnergyConsumption)(d, &ull); return put_i64(s, r, (long long)ull);
    case 157: r = nvml_field(d, NVML_FI_DEV_POWER_INSTANT, &ll); return put_dbl(s, r, ll / 1000.0);
    case 160: r = NVML(nvmlDeviceGetPowerManagementLimit)(d, &v); return put_dbl(s, r, v / 1000.0);
    case 161:
    case 162:
        r = NVML(nvmlDeviceGetPowerManagementLimitConstraints)(d, &v, &v2);
        return put_dbl(s, r, (field == 161 ? v : v2) / 1000.0);
    case 163: r = NVML(nvmlDeviceGetPowerManagementDefaultLimit)(d, &v); return put_dbl(s, r, v / 1000.0);
    case 164: r = NVML(nvmlDeviceGetEnforcedPowerLimit)(d, &v); return put_dbl(s, r, v / 1000.0);
    case 190: {
        nvmlPstates_t p;
        r = NVML(nvmlDeviceGetPerformanceState)(d, &p);
        return put_i64(s, r, p);
    }
    case 191: r = NVML(nvmlDeviceGetFanSpeed)(d, &v); return put_i64(s, r, v);
    case 200: r = NVML(nvmlDeviceGetPcieThroughput)(d, NVML_PCIE_UTIL_TX_BYTES, &v); return put_i64(s, r, v);
    case 201: r = NVML(nvmlDeviceGetPcieThroughput)(d, NVML_PCIE_UTIL_RX_BYTES, &v); return put_i64(s, r, v);
    case 202: r = NVML(nvmlDeviceGetPcieReplayCounter)(d, &v); return put_i64(s, r, v);
    case 203:
    case 204: {
        nvmlUtilization_t u;
        r = NVML(nvmlDeviceGetUtilizationRates)(d, &u);
        return put_i64(s, r, field == 203 ? u.gpu : u.memory);
    }
    case 206: r = NVML(nvmlDeviceGetEncoderUtilization)(d, &v, &v2); return put_i64(s, r, v);
    case 207: r = NVML(nvmlDeviceGetDecoderUtilization)(d, &v, &v2); return put_i64(s, r, v);
    case 230: {
        mokka_dcgm_poll_events(); /* consumers read without dcgmUpdateAllFields in between */
        pthread_mutex_lock(&g_dcgm.lock);
        long long xid = g_dcgm.gpus[gpu].last_xid;
        pthread_mutex_unlock(&g_dcgm.lock);
        r = NVML(nvmlDeviceGetMinorNumber)(d, &v); /* a lost GPU answers nothing */
        return put_i64(s, r, xid);
    }
    case 235: r = NVML(nvmlDeviceGetMaxPcieLinkGeneration)(d, &v); return put_i64(s, r, v);
    case 236: r = NVML(nvmlDeviceGetMaxPcieLinkWidth)(d, &v); return put_i64(s, r, v);
    case 237: r = NVML(nvmlDeviceGetCurrPcieLinkGeneration)(d, &v); return put_i64(s, r, v);
    case 238: r = NVML(nvmlDeviceGetCurrPcieLinkWidth)(d, &v); return put_i64(s, r, v);
    case 300:
    case 301:
        r = NVML(nvmlDeviceGetEccMode)(d, &on, &pending);
        return put_i64(s, r, (field == 300 ? on : pending) == NVML_FEATURE_ENABLED);
    case 310:
    case 311:
    case 312:
    case 313:
        r = NVML(nvmlDeviceGetTotalEccErrors)(d, field & 1 ? NVML_MEMORY_ERROR_TYPE_UNCORRECTED
                                                            : NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                              field < 312 ? NVML_VOLATILE_ECC : NVML_AGGREGATE_ECC, &ull);
        return put_i64(s, r, (long long)ull);
    case 390:
    case 391:
        v = 0;
        r = NVML(nvmlDeviceGetRetiredPages)(d, field == 390 ? NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
                                                            : NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                                            &v, NULL);
        return put_i64(s, r, v);
    case 392: r = NVML(nvmlDeviceGetRetiredPagesPendingStatus)(d, &on); return put_i64(s, r, on == NVML_FEATURE_ENABLED);
    case 393:
    case 394:
    case 395:
    case 396: {
        unsigned corr, unc, pend, fail;
        r = NVML(nvmlDeviceGetRemappedRows)(d, &corr, &unc, &pend, &fail);
        return put_i64(s, r, field == 393 ? unc : field == 394 ? corr : field == 395 ? fail : pend);
    }
    case 409: r = nvml_field(d, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, &ll); return put_i64(s, r, ll);
    case 419: r = nvml_field(d, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, &ll); return put_i64(s, r, ll);
    case 429: r = nvml_field(d, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, &ll); return put_i64(s, r, ll);
    case 439: r = nvml_field(d, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, &ll); return put_i64(s, r, ll);
    case 449: {
        /* NVLink traffic, in MB/s both ways, from GPM where the board has it; 0 on idle links. */
        r = nvml_field(d, NVML_FI_DEV_NVLINK_LINK_COUNT, &ll);
        if (r != NVML_SUCCESS || ll == 0) return put_i64(s, NVML_ERROR_NOT_SUPPORTED, 0);
        double tx = 0, rx = 0;
        if (g_dcgm.gpus[gpu].gpm && gpm_metric(gpu, 10, &tx) == NVML_SUCCESS) gpm_metric(gpu, 11, &rx);
        return put_i64(s, NVML_SUCCESS, (long long)(tx + rx));
    }
    case 500: {
        nvmlGpuVirtualizationMode_t m;
        r = NVML(nvmlDeviceGetVirtualizationMode)(d, &m);
        return put_i64(s, r, m);
    }
    default: return put_blank(s);
    }
}

void mokka_dcgm_read(dcgm_field_entity_group_t group, unsigned id, unsigned short field, dcgmFieldValue_v1 *out) {
    const dcgm_field_meta_t *meta = mokka_dcgm_field(field);
    memset(out, 0, offsetof(dcgmFieldValue_v1, value) + sizeof(int64_t));
    out->version = dcgmFieldValue_version1;
    out->fieldId = field;
    out->ts = mokka_dcgm_now_us();
    sink_t s = {.out = out, .type = meta ? meta->fieldType : DCGM_FT_INT64};
    out->fieldType = (unsigned short)s.type;
    if (!meta) {
        out->status = DCGM_ST_UNKNOWN_FIELD;
        out->value.i64 = DCGM_INT64_BLANK;
        return;
    }
    char str[DCGM_MAX_STR_LENGTH];
    nvmlReturn_t r;
    int v;
    unsigned u;
    switch (field) { /* node-wide fields, whatever the entity */
    case 1: r = NVML(nvmlSystemGetDriverVersion)(str, sizeof str); return put_str(&s, r, str);
    case 2: r = NVML(nvmlSystemGetNVMLVersion)(str, sizeof str); return put_str(&s, r, str);
    case 4: r = NVML(nvmlDeviceGetCount_v2)(&u); return put_i64(&s, r, u);
    case 5: r = NVML(nvmlSystemGetCudaDriverVersion_v2)(&v); return put_i64(&s, r, v);
    default: break;
    }
    if (!mokka_dcgm_entity_exists(group, id)) {
        put_blank(&s);
        out->status = DCGM_ST_BADPARAM;
        return;
    }
    if (group == DCGM_FE_LINK) return put_blank(&s); /* no per-link fields yet */
    unsigned gpu = id;
    nvmlDevice_t own = NULL; /* an instance's MIG device */
    if (group == DCGM_FE_GPU_I) gpu = g_dcgm.gis[id].gpu, own = g_dcgm.gis[id].mig;
    if (group == DCGM_FE_GPU_CI) gpu = g_dcgm.cis[id].gpu, own = g_dcgm.cis[id].mig;
    nvmlDevice_t d = g_dcgm.gpus[gpu].device;
    int per_instance = own && meta->entityLevel != DCGM_FE_GPU;
    switch (field) {
    case 50: return read_name(&s, per_instance ? own : d, per_instance);
    case 54: r = NVML(nvmlDeviceGetUUID)(per_instance ? own : d, str, sizeof str); return put_str(&s, r, str);
    case 250:
    case 251:
    case 252:
    case 253:
    case 254: return read_memory(&s, per_instance ? own : d, field);
    default: break;
    }
    if (field > 1000) return read_prof(&s, gpu, d, field);
    read_gpu_field(&s, gpu, d, field);
}
