/* nvmlDeviceGetFieldValues: the field ids consumers ask for, answered from the state. */
#include <string.h>
#include <sys/time.h>

#include "internal.h"

static void set_u(nvmlFieldValue_t *f, unsigned long long v) {
    f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    f->value.ullVal = v;
    f->nvmlReturn = NVML_SUCCESS;
}

static void set_ui(nvmlFieldValue_t *f, unsigned v) {
    f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    f->value.uiVal = v;
    f->nvmlReturn = NVML_SUCCESS;
}

static void set_si(nvmlFieldValue_t *f, int v) {
    f->valueType = NVML_VALUE_TYPE_SIGNED_INT;
    f->value.siVal = v;
    f->nvmlReturn = NVML_SUCCESS;
}

/* Power fields carry a scope in scopeId: the GPU, the whole module (superchips), or memory. */
static void power_field(const mokka_gpu_t *g, nvmlFieldValue_t *f) {
    uint32_t v = (uint32_t)MOKKA_NA;
    int instant = f->fieldId == NVML_FI_DEV_POWER_AVERAGE || f->fieldId == NVML_FI_DEV_POWER_INSTANT;
    switch (f->scopeId) {
    case NVML_POWER_SCOPE_GPU:
        switch (f->fieldId) {
        case NVML_FI_DEV_POWER_MIN_LIMIT: v = g->power_min_limit; break;
        case NVML_FI_DEV_POWER_MAX_LIMIT: v = g->power_max_limit; break;
        case NVML_FI_DEV_POWER_DEFAULT_LIMIT: v = g->power_default_limit; break;
        case NVML_FI_DEV_POWER_CURRENT_LIMIT:
        case NVML_FI_DEV_POWER_REQUESTED_LIMIT: v = g->power_limit; break;
        default: v = (uint32_t)mokka_metric(g, MOKKA_METRIC_POWER);
        }
        break;
    case NVML_POWER_SCOPE_MODULE:
        switch (f->fieldId) {
        case NVML_FI_DEV_POWER_MIN_LIMIT: v = g->module_power_min_limit; break;
        case NVML_FI_DEV_POWER_MAX_LIMIT: v = g->module_power_max_limit; break;
        case NVML_FI_DEV_POWER_DEFAULT_LIMIT: v = g->module_power_default_limit; break;
        case NVML_FI_DEV_POWER_CURRENT_LIMIT:
        case NVML_FI_DEV_POWER_REQUESTED_LIMIT: v = g->module_power_limit; break;
        default: v = g->module_power_usage;
        }
        break;
    case NVML_POWER_SCOPE_MEMORY:
        if (f->fieldId == NVML_FI_DEV_POWER_AVERAGE) v = g->memory_power_usage;
        break;
    default: f->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; return;
    }
    (void)instant;
    if (!mokka_is_na(v)) set_ui(f, v);
}

/* T.Limit thresholds (Ada and later): how far each threshold lies from the GPU's
 * max operating temperature, in degrees; negative means above it. */
static void tlimit_field(const mokka_gpu_t *g, nvmlFieldValue_t *f) {
    uint32_t gpu_max = g->thresholds[NVML_TEMPERATURE_THRESHOLD_GPU_MAX];
    if (!(g->flags & MOKKA_GPU_TLIMIT) || mokka_is_na(gpu_max)) return;
    uint32_t th = (uint32_t)MOKKA_NA;
    switch (f->fieldId) {
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: th = g->thresholds[NVML_TEMPERATURE_THRESHOLD_SHUTDOWN]; break;
    case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: th = g->thresholds[NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]; break;
    case NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: th = gpu_max; break;
    case NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT:
        /* Boards with a memory sensor report the memory limit at the GPU's own T.Limit. */
        if (!mokka_is_na(g->temp_memory)) set_si(f, 0);
        return;
    }
    if (!mokka_is_na(th)) set_si(f, (int)gpu_max - (int)th);
}

static unsigned long long ecc_total(const mokka_gpu_t *g, int type, int counter) {
    unsigned long long sum = 0;
    for (unsigned i = 0; i < MOKKA_ECC_LOCATIONS; i++) sum += g->ecc_counts[type][counter][i];
    return sum;
}

/* NVLink error counters a fault injected, per link: nvmlNvLinkErrorCounter_t order. */
enum { NV_REPLAY = 0, NV_RECOVERY = 1, NV_CRC_FLIT = 2, NV_CRC_DATA = 3 };

static unsigned long long nvlink_errors(const mokka_gpu_t *g, unsigned link, unsigned counter) {
    unsigned long long sum = 0;
    unsigned links = g->nvlink_count < MOKKA_MAX_NVLINKS ? g->nvlink_count : MOKKA_MAX_NVLINKS;
    if (link != ~0u) return link < links ? g->faults.nvlink_errors[link][counter] : 0;
    for (unsigned l = 0; l < links; l++) sum += g->faults.nvlink_errors[l][counter];
    return sum;
}

/* The per-link counter fields: L0..L5 and the total in one block of seven ids, L6..L11 in
 * another block of six. Returns 1 when `id` is one of them. */
static int nvlink_lane_field(const mokka_gpu_t *g, nvmlFieldValue_t *f) {
    static const struct {
        unsigned low, high, counter;
    } blocks[] = {
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, NV_CRC_FLIT},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, NV_CRC_DATA},
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, NV_REPLAY},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, NV_RECOVERY},
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L11, NV_CRC_FLIT},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L11, NV_CRC_DATA},
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L11, NV_REPLAY},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L11, NV_RECOVERY},
    };
    unsigned id = f->fieldId;
    for (unsigned b = 0; b < sizeof blocks / sizeof *blocks; b++) {
        if (id < blocks[b].low || id > blocks[b].high) continue;
        unsigned link = (b < 4 ? 0 : 6) + (id - blocks[b].low);
        int total = b < 4 && id == blocks[b].high;
        if (g->nvlink_count && (total || link < g->nvlink_count))
            set_u(f, nvlink_errors(g, total ? ~0u : link, blocks[b].counter));
        return 1;
    }
    return 0;
}

static void one_field(const mokka_gpu_t *g, nvmlFieldValue_t *f) {
    f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    int ecc = !mokka_is_na(g->ecc_current);
    int remap = (g->flags & MOKKA_GPU_REMAP_SUPPORTED) != 0;
    unsigned links = g->nvlink_count;
    switch (f->fieldId) {
    case NVML_FI_DEV_ECC_CURRENT: if (ecc) set_u(f, g->ecc_current); break;
    case NVML_FI_DEV_ECC_PENDING: if (ecc) set_u(f, g->ecc_pending); break;
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL: if (ecc) set_u(f, ecc_total(g, 0, 0)); break;
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL: if (ecc) set_u(f, ecc_total(g, 1, 0)); break;
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL: if (ecc) set_u(f, ecc_total(g, 0, 1)); break;
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL: if (ecc) set_u(f, ecc_total(g, 1, 1)); break;
    case NVML_FI_DEV_RETIRED_SBE: if (g->flags & MOKKA_GPU_RETIRE_SUPPORTED) set_u(f, g->retired_sbe); break;
    case NVML_FI_DEV_RETIRED_DBE: if (g->flags & MOKKA_GPU_RETIRE_SUPPORTED) set_u(f, g->retired_dbe); break;
    case NVML_FI_DEV_RETIRED_PENDING:
        if (g->flags & MOKKA_GPU_RETIRE_SUPPORTED) set_u(f, g->faults.retired_pending != 0);
        break;
    case NVML_FI_DEV_MEMORY_TEMP:
        if (!mokka_is_na(g->temp_memory)) set_ui(f, (unsigned)mokka_metric(g, MOKKA_METRIC_TEMP_MEMORY));
        break;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY: set_u(f, mokka_energy_mj(g)); break;
    case NVML_FI_DEV_POWER_AVERAGE:
    case NVML_FI_DEV_POWER_INSTANT:
    case NVML_FI_DEV_POWER_MIN_LIMIT:
    case NVML_FI_DEV_POWER_MAX_LIMIT:
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT:
    case NVML_FI_DEV_POWER_CURRENT_LIMIT:
    case NVML_FI_DEV_POWER_REQUESTED_LIMIT: power_field(g, f); break;
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: tlimit_field(g, f); break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: set_ui(f, g->pcie_replay_counter); break;
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: set_ui(f, 0); break;
    case NVML_FI_DEV_REMAPPED_COR: if (remap) set_u(f, g->remap_correctable); break;
    case NVML_FI_DEV_REMAPPED_UNC: if (remap) set_u(f, g->remap_uncorrectable); break;
    case NVML_FI_DEV_REMAPPED_PENDING: if (remap) set_u(f, (g->flags & MOKKA_GPU_REMAP_PENDING) != 0); break;
    case NVML_FI_DEV_REMAPPED_FAILURE: if (remap) set_u(f, (g->flags & MOKKA_GPU_REMAP_FAILURE) != 0); break;
    case NVML_FI_DEV_NVLINK_LINK_COUNT: if (links) set_ui(f, links); break;
    case NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT: if (links) set_ui(f, links); break;
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: if (links) set_ui(f, g->nvlink_speed_mbps); break;
    case NVML_FI_DEV_NVLINK_GET_SPEED:
        if (links && f->scopeId < links) set_ui(f, g->nvlink_speed_mbps);
        break;
    case NVML_FI_DEV_NVLINK_GET_STATE:
        if (links && f->scopeId < links) set_ui(f, g->nvlink_active_mask >> f->scopeId & 1);
        break;
    case NVML_FI_DEV_NVLINK_GET_VERSION:
        if (links && f->scopeId < links) set_ui(f, g->nvlink_version);
        break;
    /* nvidia-smi nvlink -e: per link (scopeId) */
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
        if (links && f->scopeId < links) set_u(f, nvlink_errors(g, f->scopeId, NV_REPLAY));
        break;
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
        if (links && f->scopeId < links) set_u(f, nvlink_errors(g, f->scopeId, NV_RECOVERY));
        break;
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
        if (links && f->scopeId < links) set_u(f, nvlink_errors(g, f->scopeId, NV_CRC_FLIT));
        break;
    default:
        if (nvlink_lane_field(g, f)) {
        } else if (f->fieldId >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 && f->fieldId <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L5) {
            if (f->fieldId - NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 < links) set_ui(f, g->nvlink_speed_mbps);
        } else if (f->fieldId >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 && f->fieldId <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L11) {
            if (f->fieldId - NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 + 6 < links) set_ui(f, g->nvlink_speed_mbps);
        } else if (f->fieldId >= NVML_FI_MAX) {
            f->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        }
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    GET_GPU(device, g);
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    long long now = (long long)tv.tv_sec * 1000000 + tv.tv_usec;
    for (int i = 0; i < count; i++) {
        MOKKA_READ(g, one_field(g, &values[i]));
        values[i].timestamp = now;
        values[i].latencyUsec = 0;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceClearFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    GET_GPU(device, g);
    (void)g;
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}
