/* Per-device getters: every value comes from the mapped state record. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define NEED(p)                                        \
    do {                                               \
        if (!(p)) return NVML_ERROR_INVALID_ARGUMENT;  \
    } while (0)

/* Read one live u32 field; NOT_SUPPORTED when the profile marks it absent. */
#define U32_GETTER(fn, field)                                    \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) { \
        GET_GPU(device, g);                                      \
        NEED(out);                                               \
        uint32_t v;                                              \
        MOKKA_READ(g, v = g->field);                                \
        if (mokka_is_na(v)) return NVML_ERROR_NOT_SUPPORTED;     \
        *out = v;                                                \
        return NVML_SUCCESS;                                     \
    }

/* A value every board of the kind reports the same way; still validates the handle. */
#define CONSTANT_GETTER(fn, type, value)                         \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, type *out) {     \
        GET_GPU(device, g);                                      \
        (void)g;                                                 \
        NEED(out);                                               \
        *out = (value);                                          \
        return NVML_SUCCESS;                                     \
    }

#define STRING_GETTER(fn, field)                                               \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, char *out, unsigned int length) { \
        GET_GPU(device, g);                                                    \
        return COPY_FIELD(out, length, g->field);                       \
    }

/* Identity a lost GPU's existing handle still answers (internal.h, GET_GPU_IDENTITY). */
#define IDENTITY_STRING_GETTER(fn, field)                                      \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, char *out, unsigned int length) { \
        GET_GPU_IDENTITY(device, g);                                           \
        return COPY_FIELD(out, length, g->field);                              \
    }

/* ---- identity ---------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *out, unsigned int length) {
    MIG_ANSWERS(device, mokka_mig_name(device, out, length));
    GET_GPU(device, g);
    return COPY_FIELD(out, length, g->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *out, unsigned int length) {
    MIG_ANSWERS(device, mokka_mig_uuid_of(device, out, length));
    GET_GPU_IDENTITY(device, g);
    return COPY_FIELD(out, length, g->uuid);
}

STRING_GETTER(nvmlDeviceGetSerial, serial)
STRING_GETTER(nvmlDeviceGetBoardPartNumber, board_part_number)
STRING_GETTER(nvmlDeviceGetVbiosVersion, vbios_version)
STRING_GETTER(nvmlDeviceGetInforomImageVersion, inforom_image)
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    GET_GPU_IDENTITY(device, g);
    NEED(minor);
    *minor = g->minor_number;
    return NVML_SUCCESS;
}
U32_GETTER(nvmlDeviceGetBoardId, board_id)
U32_GETTER(nvmlDeviceGetModuleId, module_id)
U32_GETTER(nvmlDeviceGetNumGpuCores, num_cores)
U32_GETTER(nvmlDeviceGetMemoryBusWidth, memory_bus_width)
U32_GETTER(nvmlDeviceGetIrqNum, irq)

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type) {
    GET_GPU(device, g);
    NEED(type);
    *type = (nvmlBrandType_t)g->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    GET_GPU(device, g);
    NEED(arch);
    *arch = g->architecture;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    GET_GPU(device, g);
    NEED(major && minor);
    *major = (int)g->cc_major;
    *minor = (int)g->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object, char *version,
                                                unsigned int length) {
    GET_GPU(device, g);
    switch (object) {
    case NVML_INFOROM_OEM: return COPY_FIELD(version, length, g->inforom_oem);
    case NVML_INFOROM_ECC: return COPY_FIELD(version, length, g->inforom_ecc);
    case NVML_INFOROM_POWER: return COPY_FIELD(version, length, g->inforom_power);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

CONSTANT_GETTER(nvmlDeviceGetInforomConfigurationChecksum, unsigned int, 0)

EXPORT nvmlReturn_t nvmlDeviceValidateInforom(nvmlDevice_t device) {
    GET_GPU(device, g);
    (void)g;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int *multi) {
    GET_GPU(device, g);
    NEED(multi);
    *multi = (g->flags & MOKKA_GPU_MULTI_GPU_BOARD) ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    MIG_ANSWERS(device, mokka_mig_attributes(device, attributes, sizeof *attributes));
    GET_GPU(device, g);
    (void)g;
    NEED(attributes);
    return NVML_ERROR_NOT_SUPPORTED; /* MIG-only on real boards; a full GPU says so */
}
/* v1: the layout before memorySizeMB. */
EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    MIG_ANSWERS(device, mokka_mig_attributes(device, attributes, offsetof(nvmlDeviceAttributes_t, memorySizeMB)));
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

EXPORT nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t device, nvmlPlatformInfo_t *info) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(info);
    unsigned int version = info->version;
    if (version != nvmlPlatformInfo_v1 && version != nvmlPlatformInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->moduleId = (unsigned char)g->module_id;
    return NVML_SUCCESS;
}

/* ---- PCI --------------------------------------------------------------------------- */

static void fill_pci(const mokka_gpu_t *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", g->pci_domain & 0xffff, g->pci_bus,
             g->pci_device, g->pci_function);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", g->pci_domain, g->pci_bus, g->pci_device,
             g->pci_function);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    GET_GPU_IDENTITY(device, g);
    NEED(pci);
    fill_pci(g, pci);
    return NVML_SUCCESS;
}

/* The layout of _v1 and _v2 (and of the unversioned legacy names): busId[16] in the
 * 4-digit-domain form, five ids, four reserved words: 52 bytes, where v3 has 68. The caller
 * holds only those 52 bytes, so nothing beyond them may be written. */
typedef struct {
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved[4];
} pci_info_legacy_t;
_Static_assert(sizeof(pci_info_legacy_t) == 52, "the legacy nvmlPciInfo_t is 52 bytes");

static void write_legacy_pci(const nvmlPciInfo_t *full, void *out) {
    pci_info_legacy_t legacy;
    memset(&legacy, 0, sizeof legacy);
    memcpy(legacy.busId, full->busIdLegacy, sizeof legacy.busId);
    legacy.domain = full->domain;
    legacy.bus = full->bus;
    legacy.device = full->device;
    legacy.pciDeviceId = full->pciDeviceId;
    legacy.pciSubSystemId = full->pciSubSystemId;
    memcpy(out, &legacy, sizeof legacy);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    GET_GPU_IDENTITY(device, g);
    NEED(pci);
    nvmlPciInfo_t full;
    fill_pci(g, &full);
    write_legacy_pci(&full, pci);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v2(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(pci);
    if (pci->version != nvmlPciInfoExt_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlPciInfo_t full;
    fill_pci(g, &full);
    memset(pci, 0, sizeof *pci);
    pci->version = nvmlPciInfoExt_v1;
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    pci->baseClass = (g->pci_class >> 16) & 0xff;
    pci->subClass = (g->pci_class >> 8) & 0xff;
    memcpy(pci->busId, full.busId, sizeof pci->busId);
    return NVML_SUCCESS;
}

U32_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
U32_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_device_max_gen)
U32_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
U32_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_cur_gen)
U32_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_cur_width)
U32_GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replay_counter)

static unsigned pcie_gen_mbps(unsigned gen) {
    static const unsigned per_lane[] = {0, 2500, 5000, 8000, 16000, 32000, 64000, 128000};
    return gen < sizeof per_lane / sizeof *per_lane ? per_lane[gen] : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieSpeed(nvmlDevice_t device, unsigned int *speed) {
    GET_GPU(device, g);
    NEED(speed);
    *speed = pcie_gen_mbps(g->pcie_cur_gen);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t device, unsigned int *speed) {
    GET_GPU(device, g);
    NEED(speed);
    *speed = pcie_gen_mbps(g->pcie_max_gen);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value) {
    GET_GPU(device, g);
    NEED(value);
    switch (counter) {
    case NVML_PCIE_UTIL_TX_BYTES: MOKKA_READ(g, *value = g->pcie_tx_kbps); return NVML_SUCCESS;
    case NVML_PCIE_UTIL_RX_BYTES: MOKKA_READ(g, *value = g->pcie_rx_kbps); return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

CONSTANT_GETTER(nvmlDeviceGetBusType, nvmlBusType_t, NVML_BUS_TYPE_PCIE)

/* ---- memory ------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    uint64_t total, reserved = 0, used;
    if (mokka_is_mig_handle(device)) {
        nvmlReturn_t r = mokka_mig_memory(device, &total, &used);
        if (r != NVML_SUCCESS) return r;
        NEED(memory);
        memory->total = total, memory->used = used, memory->free = total - used;
        return NVML_SUCCESS;
    }
    GET_GPU(device, g);
    NEED(memory);
    MOKKA_READ(g, (total = g->mem_total, reserved = g->mem_reserved, used = mokka_metric(g, MOKKA_METRIC_MEM_USED)));
    if (used > total - reserved) used = total - reserved;
    /* v1 folds the reserved memory into "used", as the real library does. */
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    GET_GPU(device, g);
    NEED(memory);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t total, reserved = 0, used;
    if (mokka_is_mig_handle(device)) {
        nvmlReturn_t r = mokka_mig_memory(device, &total, &used);
        if (r != NVML_SUCCESS) return r;
    } else {
        MOKKA_READ(g, (total = g->mem_total, reserved = g->mem_reserved, used = mokka_metric(g, MOKKA_METRIC_MEM_USED)));
        if (used > total - reserved) used = total - reserved;
    }
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    MIG_ANSWERS(device, mokka_mig_bar1(device, bar1));
    GET_GPU(device, g);
    NEED(bar1);
    MOKKA_READ(g, (bar1->bar1Total = g->bar1_total, bar1->bar1Used = g->bar1_used));
    bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetConfComputeProtectedMemoryUsage(nvmlDevice_t device, nvmlMemory_t *memory) {
    GET_GPU(device, g);
    (void)g;
    NEED(memory);
    memset(memory, 0, sizeof *memory);
    return NVML_SUCCESS;
}

/* ---- power ------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    GET_GPU(device, g);
    NEED(power);
    MOKKA_READ(g, *power = (unsigned int)mokka_metric(g, MOKKA_METRIC_POWER));
    return NVML_SUCCESS;
}

#define POWER_GETTER(fn, field)                                       \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {  \
        GET_GPU(device, g);                                           \
        NEED(out);                                                    \
        if (!(g->flags & MOKKA_GPU_POWER_MANAGEMENT)) return NVML_ERROR_NOT_SUPPORTED; \
        MOKKA_READ(g, *out = g->field);                                  \
        return NVML_SUCCESS;                                          \
    }

POWER_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit)
POWER_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, power_default_limit)
POWER_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_enforced_limit)

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *min, unsigned int *max) {
    GET_GPU(device, g);
    NEED(min && max);
    if (!(g->flags & MOKKA_GPU_POWER_MANAGEMENT)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, (*min = g->power_min_limit, *max = g->power_max_limit));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    GET_GPU(device, g);
    NEED(mode);
    *mode = (g->flags & MOKKA_GPU_POWER_MANAGEMENT) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

uint64_t mokka_energy_mj(const mokka_gpu_t *g) {
    uint64_t base;
    uint32_t mw;
    MOKKA_READ(g, (base = g->energy_mj, mw = g->power_usage));
    /* Energy keeps accumulating at the current draw since boot, as a real counter does. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return base + (uint64_t)mw * (uint64_t)ts.tv_sec;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    GET_GPU(device, g);
    NEED(energy);
    *energy = mokka_energy_mj(g);
    return NVML_SUCCESS;
}

CONSTANT_GETTER(nvmlDeviceGetPowerSource, nvmlPowerSource_t, NVML_POWER_SOURCE_AC)

/* ---- performance state, clocks ----------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *state) {
    GET_GPU(device, g);
    NEED(state);
    MOKKA_READ(g, *state = (nvmlPstates_t)g->pstate);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *state) {
    return nvmlDeviceGetPerformanceState(device, state);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedPerformanceStates(nvmlDevice_t device, nvmlPstates_t *states, unsigned int size) {
    GET_GPU(device, g);
    NEED(states);
    if (size < 2 * sizeof *states) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < size / sizeof *states; i++) states[i] = NVML_PSTATE_UNKNOWN;
    states[0] = (nvmlPstates_t)g->pstate;
    return NVML_SUCCESS;
}

/* One clock domain from one of the record's clock tables (given by its offset). */
static nvmlReturn_t clock_from(const mokka_gpu_t *g, size_t table, nvmlClockType_t type, unsigned int *clock) {
    NEED(clock);
    if ((unsigned)type >= MOKKA_CLOCK_DOMAINS) return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t v;
    if (table == offsetof(mokka_gpu_t, clock_current)) {
        uint64_t now = mokka_wall_ms();
        MOKKA_READ(g, v = mokka_clock_at(g, type, now, 0));
    } else {
        MOKKA_READ(g, v = ((const uint32_t *)((const char *)g + table))[type]);
    }
    if (mokka_is_na(v)) return NVML_ERROR_NOT_SUPPORTED;
    if (v == (uint32_t)MOKKA_DEPRECATED) return NVML_ERROR_DEPRECATED;
    *clock = v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    GET_GPU(device, g);
    return clock_from(g, offsetof(mokka_gpu_t, clock_current), type, clock);
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    GET_GPU(device, g);
    return clock_from(g, offsetof(mokka_gpu_t, clock_max), type, clock);
}
EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    GET_GPU(device, g);
    return clock_from(g, offsetof(mokka_gpu_t, clock_app), type, clock);
}
EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    GET_GPU(device, g);
    return clock_from(g, offsetof(mokka_gpu_t, clock_default_app), type, clock);
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    GET_GPU(device, g);
    return clock_from(g, offsetof(mokka_gpu_t, clock_boost), type, clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t type, nvmlClockId_t id, unsigned int *clock) {
    GET_GPU(device, g);
    switch (id) {
    case NVML_CLOCK_ID_CURRENT: return clock_from(g, offsetof(mokka_gpu_t, clock_current), type, clock);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET: return clock_from(g, offsetof(mokka_gpu_t, clock_app), type, clock);
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT: return clock_from(g, offsetof(mokka_gpu_t, clock_default_app), type, clock);
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX: return clock_from(g, offsetof(mokka_gpu_t, clock_boost), type, clock);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count, unsigned int *clocks) {
    GET_GPU(device, g);
    NEED(count);
    unsigned n = g->n_mem_clocks;
    if (n == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (n > MOKKA_MAX_MEM_CLOCKS) n = MOKKA_MAX_MEM_CLOCKS;
    if (*count < n || !clocks) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) clocks[i] = g->mem_clocks[i];
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int mem, unsigned int *count,
                                                         unsigned int *clocks) {
    GET_GPU(device, g);
    NEED(count);
    for (unsigned i = 0; i < g->n_mem_clocks && i < MOKKA_MAX_MEM_CLOCKS; i++) {
        if (g->mem_clocks[i] != mem) continue;
        unsigned n = g->n_gfx_clocks[i];
        if (n > MOKKA_MAX_GFX_CLOCKS) n = MOKKA_MAX_GFX_CLOCKS;
        if (*count < n || !clocks) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned j = 0; j < n; j++) clocks[j] = g->gfx_clocks[i][j];
        *count = n;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    GET_GPU(device, g);
    NEED(reasons);
    uint64_t now = mokka_wall_ms();
    MOKKA_READ(g, *reasons = mokka_event_reasons_at(g, now, 0));
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}
EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    GET_GPU(device, g);
    NEED(reasons);
    *reasons = g->supported_event_reasons;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetAutoBoostedClocksEnabled(nvmlDevice_t device, nvmlEnableState_t *enabled,
                                                          nvmlEnableState_t *default_enabled) {
    GET_GPU(device, g);
    (void)g;
    (void)enabled; (void)default_enabled;
    return NVML_ERROR_NOT_SUPPORTED; /* datacenter boards report N/A */
}

CONSTANT_GETTER(nvmlDeviceGetAdaptiveClockInfoStatus, unsigned int, NVML_ADAPTIVE_CLOCKING_INFO_STATUS_ENABLED)

CONSTANT_GETTER(nvmlDeviceGetGpcClkVfOffset, int, 0)
EXPORT nvmlReturn_t nvmlDeviceGetMemClkVfOffset(nvmlDevice_t device, int *offset) {
    return nvmlDeviceGetGpcClkVfOffset(device, offset);
}

/* ---- temperature, fans ------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *temp) {
    GET_GPU(device, g);
    NEED(temp);
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    MOKKA_READ(g, *temp = (unsigned int)mokka_metric(g, MOKKA_METRIC_TEMP_GPU));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(temperature);
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t t;
    MOKKA_READ(g, t = (uint32_t)mokka_metric(g, MOKKA_METRIC_TEMP_GPU));
    temperature->temperature = (int)t;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t type,
                                                      unsigned int *temp) {
    GET_GPU(device, g);
    NEED(temp);
    if ((unsigned)type >= MOKKA_THRESHOLD_COUNT || (unsigned)type >= NVML_TEMPERATURE_THRESHOLD_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t v;
    MOKKA_READ(g, v = g->thresholds[type]);
    if (mokka_is_na(v)) return NVML_ERROR_NOT_SUPPORTED;
    *temp = v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *count) {
    GET_GPU(device, g);
    NEED(count);
    *count = g->fan_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    GET_GPU(device, g);
    NEED(speed);
    if (g->fan_count == 0) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, *speed = g->fan_speed);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    GET_GPU(device, g);
    if (fan >= g->fan_count) return g->fan_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    return nvmlDeviceGetFanSpeed(device, speed);
}

EXPORT nvmlReturn_t nvmlDeviceGetTargetFanSpeed(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    return nvmlDeviceGetFanSpeed_v2(device, fan, speed);
}

/* ---- utilization ------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    GET_GPU(device, g);
    NEED(util);
    if (mokka_mig_enabled(g)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, (util->gpu = (unsigned int)mokka_metric(g, MOKKA_METRIC_UTIL_GPU),
                   util->memory = (unsigned int)mokka_metric(g, MOKKA_METRIC_UTIL_MEMORY)));
    return NVML_SUCCESS;
}

#define ENGINE_UTIL(fn, field)                                                                   \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *util, unsigned int *period_us) {   \
        GET_GPU(device, g);                                                                      \
        NEED(util && period_us);                                                                 \
        if (mokka_mig_enabled(g)) return NVML_ERROR_NOT_SUPPORTED;                                \
        MOKKA_READ(g, *util = g->field);                                                            \
        *period_us = 167000;                                                                     \
        return NVML_SUCCESS;                                                                     \
    }

ENGINE_UTIL(nvmlDeviceGetEncoderUtilization, util_encoder)
ENGINE_UTIL(nvmlDeviceGetDecoderUtilization, util_decoder)
ENGINE_UTIL(nvmlDeviceGetJpgUtilization, util_jpeg)
ENGINE_UTIL(nvmlDeviceGetOfaUtilization, util_ofa)

EXPORT nvmlReturn_t nvmlDeviceGetEncoderCapacity(nvmlDevice_t device, nvmlEncoderType_t type, unsigned int *capacity) {
    GET_GPU(device, g);
    (void)g;
    NEED(capacity);
    if (type > NVML_ENCODER_QUERY_HEVC) return NVML_ERROR_INVALID_ARGUMENT;
    *capacity = 100;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t device, unsigned int *sessions, unsigned int *fps,
                                              unsigned int *latency) {
    GET_GPU(device, g);
    (void)g;
    NEED(sessions && fps && latency);
    *sessions = *fps = *latency = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderSessions(nvmlDevice_t device, unsigned int *count, nvmlEncoderSessionInfo_t *info) {
    GET_GPU(device, g);
    (void)g;
    (void)info;
    NEED(count);
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFBCStats(nvmlDevice_t device, nvmlFBCStats_t *stats) {
    GET_GPU(device, g);
    (void)g;
    NEED(stats);
    memset(stats, 0, sizeof *stats);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFBCSessions(nvmlDevice_t device, unsigned int *count, nvmlFBCSessionInfo_t *info) {
    return nvmlDeviceGetEncoderSessions(device, count, (nvmlEncoderSessionInfo_t *)info);
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count, unsigned long long last_seen) {
    GET_GPU(device, g);
    (void)samples;
    (void)last_seen;
    NEED(count);
    (void)g;
    *count = 0;
    return NVML_ERROR_NOT_FOUND; /* no samples in the window, as an idle board answers */
}

/* ---- modes ------------------------------------------------------------------------- */

#define MODE_GETTER(fn, field)                                                \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, nvmlEnableState_t *mode) {    \
        GET_GPU(device, g);                                                   \
        NEED(mode);                                                           \
        uint32_t v;                                                           \
        MOKKA_READ(g, v = g->field);                                             \
        if (mokka_is_na(v)) return NVML_ERROR_NOT_SUPPORTED;                  \
        *mode = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;             \
        return NVML_SUCCESS;                                                  \
    }

MODE_GETTER(nvmlDeviceGetPersistenceMode, persistence_mode)
MODE_GETTER(nvmlDeviceGetDisplayMode, display_mode)
MODE_GETTER(nvmlDeviceGetDisplayActive, display_active)
MODE_GETTER(nvmlDeviceGetAccountingMode, accounting_mode)

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    GET_GPU(device, g);
    NEED(mode);
    MOKKA_READ(g, *mode = (nvmlComputeMode_t)g->compute_mode);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    GET_GPU(device, g);
    NEED(current && pending);
    uint32_t c, p;
    MOKKA_READ(g, (c = g->ecc_current, p = g->ecc_pending));
    if (mokka_is_na(c)) return NVML_ERROR_NOT_SUPPORTED;
    *current = c ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = p ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    GET_GPU(device, g);
    NEED(mode);
    if (mokka_is_na(g->ecc_current)) return NVML_ERROR_NOT_SUPPORTED;
    *mode = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

/* MIG mode, instances and MIG device handles: native/src/mig.c. */

EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, nvmlGpuVirtualizationMode_t *mode) {
    GET_GPU(device, g);
    NEED(mode);
    *mode = (nvmlGpuVirtualizationMode_t)g->virtualization_mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t device, unsigned int *size) {
    GET_GPU(device, g);
    NEED(size);
    *size = g->accounting_buffer;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count, unsigned int *pids) {
    GET_GPU(device, g);
    (void)g;
    (void)pids;
    NEED(count);
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetC2cModeInfoV(nvmlDevice_t device, nvmlC2cModeInfo_v1_t *info) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(info);
    if (mokka_is_na(g->c2c_mode)) return NVML_ERROR_NOT_SUPPORTED;
    info->isC2cEnabled = g->c2c_mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, nvmlConfComputeMemSizeInfo_t *info) {
    GET_GPU(device, g);
    NEED(info);
    info->protectedMemSizeKib = 0;
    info->unprotectedMemSizeKib = g->mem_total / 1024;
    return NVML_SUCCESS;
}

/* ---- ECC, retired pages, remapped rows --------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                nvmlEccCounterType_t counter, unsigned long long *count) {
    GET_GPU(device, g);
    NEED(count);
    if ((unsigned)type > 1 || (unsigned)counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (mokka_is_na(g->ecc_current)) return NVML_ERROR_NOT_SUPPORTED;
    uint64_t sum = 0;
    MOKKA_READ(g, {
        sum = 0;
        for (unsigned i = 0; i < MOKKA_ECC_LOCATIONS; i++) sum += g->ecc_counts[type][counter][i];
    });
    *count = sum;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                    nvmlEccCounterType_t counter, nvmlMemoryLocation_t location,
                                                    unsigned long long *count) {
    GET_GPU(device, g);
    NEED(count);
    if ((unsigned)type > 1 || (unsigned)counter > 1 || (unsigned)location >= MOKKA_ECC_LOCATIONS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mokka_is_na(g->ecc_current)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, *count = g->ecc_counts[type][counter][location]);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDetailedEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                   nvmlEccCounterType_t counter, nvmlEccErrorCounts_t *counts) {
    GET_GPU(device, g);
    NEED(counts);
    if ((unsigned)type > 1 || (unsigned)counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (mokka_is_na(g->ecc_current)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, {
        counts->l1Cache = g->ecc_counts[type][counter][NVML_MEMORY_LOCATION_L1_CACHE];
        counts->l2Cache = g->ecc_counts[type][counter][NVML_MEMORY_LOCATION_L2_CACHE];
        counts->deviceMemory = g->ecc_counts[type][counter][NVML_MEMORY_LOCATION_DEVICE_MEMORY];
        counts->registerFile = g->ecc_counts[type][counter][NVML_MEMORY_LOCATION_REGISTER_FILE];
    });
    return NVML_SUCCESS;
}

/* Retired pages are counted in the record (faults add them); their addresses are derived
 * from the cause and the page's number, the same on every call. */
static unsigned long long retired_page_address(unsigned cause, unsigned k) {
    return ((unsigned long long)(cause + 1) << 32) | ((unsigned long long)(k + 1) << 12);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                 unsigned int *count, unsigned long long *addresses,
                                                 unsigned long long *timestamps) {
    GET_GPU(device, g);
    NEED(count);
    if ((unsigned)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(g->flags & MOKKA_GPU_RETIRE_SUPPORTED)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n;
    MOKKA_READ(g, n = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? g->retired_dbe : g->retired_sbe);
    if (*count < n || (n && !addresses)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        addresses[k] = retired_page_address(cause, k);
        if (timestamps) timestamps[k] = 0;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                                              unsigned long long *addresses) {
    return nvmlDeviceGetRetiredPages_v2(device, cause, count, addresses, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *pending) {
    GET_GPU(device, g);
    NEED(pending);
    if (!(g->flags & MOKKA_GPU_RETIRE_SUPPORTED)) return NVML_ERROR_NOT_SUPPORTED;
    uint32_t p;
    MOKKA_READ(g, p = g->faults.retired_pending);
    *pending = p ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    GET_GPU(device, g);
    NEED(corr && unc && pending && failure);
    if (!(g->flags & MOKKA_GPU_REMAP_SUPPORTED)) return NVML_ERROR_NOT_SUPPORTED;
    uint32_t flags;
    MOKKA_READ(g, (*corr = g->remap_correctable, *unc = g->remap_uncorrectable, flags = g->flags));
    *pending = (flags & MOKKA_GPU_REMAP_PENDING) ? 1 : 0;
    *failure = (flags & MOKKA_GPU_REMAP_FAILURE) ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t device, nvmlRowRemapperHistogramValues_t *values) {
    GET_GPU(device, g);
    NEED(values);
    if (!(g->flags & MOKKA_GPU_REMAP_SUPPORTED)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, {
        values->max = g->remap_histogram[0];
        values->high = g->remap_histogram[1];
        values->partial = g->remap_histogram[2];
        values->low = g->remap_histogram[3];
        values->none = g->remap_histogram[4];
    });
    return NVML_SUCCESS;
}

/* ---- processes --------------------------------------------------------------------- */

unsigned mokka_processes(const mokka_gpu_t *g, unsigned type, mokka_process_t out[MOKKA_MAX_PROCS]) {
    mokka_process_t all[MOKKA_MAX_PROCS];
    unsigned n_all;
    MOKKA_READ(g, {
        n_all = g->n_procs < MOKKA_MAX_PROCS ? g->n_procs : MOKKA_MAX_PROCS;
        memcpy(all, g->procs, sizeof all);
    });
    unsigned n = 0;
    for (unsigned i = 0; i < n_all; i++)
        if (all[i].type == type) out[n++] = all[i];
    return n;
}

static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned type, unsigned int *count, void *infos,
                                   size_t record, int with_ids) {
    GET_GPU(device, g);
    NEED(count);
    mokka_process_t procs[MOKKA_MAX_PROCS];
    unsigned n = mokka_processes(g, type, procs);
    if (*count < n || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        nvmlProcessInfo_v2_t p;
        memset(&p, 0, sizeof p);
        p.pid = procs[k].pid;
        p.usedGpuMemory = procs[k].used_memory;
        p.gpuInstanceId = p.computeInstanceId = 0xFFFFFFFFu;
        memcpy((char *)infos + k * record, &p, with_ids ? record : sizeof(nvmlProcessInfo_v1_t));
    }
    *count = n;
    return NVML_SUCCESS;
}

#define PROCESS_GETTERS(base, type)                                                                          \
    EXPORT nvmlReturn_t base(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i) {                     \
        return list_processes(d, type, c, i, sizeof(nvmlProcessInfo_v1_t), 0);                               \
    }                                                                                                        \
    EXPORT nvmlReturn_t base##_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i) {                \
        return list_processes(d, type, c, i, sizeof(nvmlProcessInfo_v2_t), 1);                               \
    }                                                                                                        \
    EXPORT nvmlReturn_t base##_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {                   \
        return list_processes(d, type, c, i, sizeof(nvmlProcessInfo_t), 1);                                 \
    }

PROCESS_GETTERS(nvmlDeviceGetComputeRunningProcesses, 0)
PROCESS_GETTERS(nvmlDeviceGetGraphicsRunningProcesses, 1)
PROCESS_GETTERS(nvmlDeviceGetMPSComputeRunningProcesses, 2)

/* ---- topology and affinity --------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int size, unsigned long *set) {
    GET_GPU(device, g);
    NEED(set);
    for (unsigned i = 0; i < size; i++) set[i] = i < MOKKA_CPUSET_WORDS ? (unsigned long)g->cpu_affinity[i] : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int size, unsigned long *set,
                                                        nvmlAffinityScope_t scope) {
    (void)scope;
    return nvmlDeviceGetCpuAffinity(device, size, set);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int size, unsigned long *set,
                                                nvmlAffinityScope_t scope) {
    GET_GPU(device, g);
    (void)scope;
    NEED(set);
    unsigned node = mokka_is_na(g->numa_node) ? 0 : g->numa_node;
    for (unsigned i = 0; i < size; i++) set[i] = 0;
    if (node / 64 < size) set[node / 64] = 1ul << (node % 64);
    return NVML_SUCCESS;
}

/* The GPU's own memory as a NUMA node: only on coherent (C2C) platforms such as Grace
 * Blackwell; a PCIe-attached GPU answers NOT_SUPPORTED (a real H200 does). */
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(node);
    if (mokka_is_na(g->numa_node) || g->c2c_mode != 1) return NVML_ERROR_NOT_SUPPORTED;
    *node = g->numa_node;
    return NVML_SUCCESS;
}

static nvmlGpuTopologyLevel_t topology_level(const mokka_gpu_t *a, const mokka_gpu_t *b) {
    if (a == b) return NVML_TOPOLOGY_INTERNAL;
    uint32_t na = mokka_is_na(a->numa_node) ? 0 : a->numa_node, nb = mokka_is_na(b->numa_node) ? 0 : b->numa_node;
    if (na != nb) return NVML_TOPOLOGY_SYSTEM;
    return a->pcie_switch && a->pcie_switch == b->pcie_switch ? NVML_TOPOLOGY_SINGLE : NVML_TOPOLOGY_NODE;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuTopologyLevel_t *level) {
    GET_GPU(d1, a);
    GET_GPU(d2, b);
    NEED(level);
    *level = topology_level(a, b);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level,
                                                     unsigned int *count, nvmlDevice_t *devices) {
    GET_GPU(device, g);
    NEED(count);
    unsigned n = 0;
    for (unsigned i = 0; i < g_mokka.visible_count; i++) {
        const mokka_gpu_t *o = mokka_handle_gpu(&g_mokka.devices[i]);
        if (o == g || topology_level(g, o) > level) continue;
        if (devices && n < *count) devices[n] = &g_mokka.devices[i];
        n++;
    }
    if (devices && *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuP2PCapsIndex_t index,
                                           nvmlGpuP2PStatus_t *status) {
    GET_GPU(d1, a);
    GET_GPU(d2, b);
    NEED(status);
    (void)index;
    *status = (a != b && a->nvlink_count && b->nvlink_count) ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* ---- NVLink ------------------------------------------------------------------------ */

/* A link the board does not have but NVML can name (below NVML_NVLINK_MAX_LINKS: an A100's
 * links 12-17) is not supported on it, as on a GPU without NVLink; only a link number no GPU can
 * have is an invalid argument. nvidia-smi's topology matrix asks every link up to the maximum and
 * gives up on an invalid argument. */
static nvmlReturn_t nvlink_check(const mokka_gpu_t *g, unsigned link) {
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->nvlink_count == 0 || link >= g->nvlink_count) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    GET_GPU(device, g);
    NEED(active);
    nvmlReturn_t r = nvlink_check(g, link);
    if (r) return r;
    uint32_t mask;
    MOKKA_READ(g, mask = g->nvlink_active_mask);
    *active = (mask >> link & 1) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version) {
    GET_GPU(device, g);
    NEED(version);
    nvmlReturn_t r = nvlink_check(g, link);
    if (r) return r;
    *version = g->nvlink_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link, nvmlNvLinkCapability_t cap,
                                                  unsigned int *result) {
    GET_GPU(device, g);
    NEED(result);
    nvlink_check(g, link);
    nvmlReturn_t r = nvlink_check(g, link);
    if (r) return r;
    switch (cap) {
    case NVML_NVLINK_CAP_P2P_SUPPORTED:
    case NVML_NVLINK_CAP_P2P_ATOMICS:
    case NVML_NVLINK_CAP_SYSMEM_ACCESS: *result = 1; return NVML_SUCCESS;
    case NVML_NVLINK_CAP_VALID: *result = 1; return NVML_SUCCESS;
    case NVML_NVLINK_CAP_SYSMEM_ATOMICS:
    case NVML_NVLINK_CAP_SLI_BRIDGE: *result = 0; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    GET_GPU(device, g);
    NEED(pci);
    nvmlReturn_t r = nvlink_check(g, link);
    if (r) return r;
    memset(pci, 0, sizeof *pci);
    uint32_t far = g->nvlink_remote[link];
    if (!mokka_is_na(far)) {
        /* The NVSwitch this link reaches, a PCI function of the node as on HGX baseboards
         * (lspci: "Bridge [0680]: NVIDIA ... NVSwitch"; hwloc marks it subtype NVSwitch). */
        unsigned dom = far >> 16, bus = far >> 8 & 0xff, dev = far >> 3 & 0x1f, fn = far & 7;
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom, bus, dev, fn);
        snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", dom, bus, dev, fn);
        pci->domain = dom;
        pci->bus = bus;
        pci->device = dev;
        pci->pciDeviceId = g->nvlink_remote_device_id;
        pci->pciSubSystemId = g->nvlink_remote_device_id;
        return NVML_SUCCESS;
    }
    /* Far end not known (the profile names no NVSwitches): a placeholder no PCI tree has. */
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", 0xFFFFFFFFu, 0xFF, 0x1F);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "FFFF:FF:1F.0");
    pci->domain = 0xFFFFFFFFu;
    pci->bus = 0xFF;
    pci->device = 0x1F;
    pci->pciDeviceId = 0xFFFFFFFFu;
    return NVML_SUCCESS;
}
/* v1 fills the 52-byte legacy layout (see nvmlDeviceGetPciInfo_v2). */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    NEED(pci);
    nvmlPciInfo_t full;
    nvmlReturn_t r = nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &full);
    if (r == NVML_SUCCESS) write_legacy_pci(&full, pci);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *type) {
    GET_GPU(device, g);
    NEED(type);
    nvmlReturn_t r = nvlink_check(g, link);
    if (r) return r;
    *type = NVML_NVLINK_DEVICE_TYPE_SWITCH;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkErrorCounter_t counter, unsigned long long *value) {
    GET_GPU(device, g);
    NEED(value);
    nvmlReturn_t r = nvlink_check(g, link);
    if (r) return r;
    if ((unsigned)counter >= NVML_NVLINK_ERROR_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *value = 0;
    if ((unsigned)counter < MOKKA_NVLINK_COUNTERS) MOKKA_READ(g, *value = g->faults.nvlink_errors[link][counter]);
    return NVML_SUCCESS;
}

/* ---- fabric ------------------------------------------------------------------------ */

static nvmlReturn_t fabric_fill(const mokka_gpu_t *g, unsigned char *uuid, nvmlReturn_t *status, unsigned int *clique,
                                nvmlGpuFabricState_t *state) {
    if (!(g->flags & MOKKA_GPU_FABRIC_SUPPORTED)) return NVML_ERROR_NOT_SUPPORTED;
    memcpy(uuid, g->cluster_uuid, 16);
    *status = (nvmlReturn_t)g->fabric_status;
    *clique = g->clique_id;
    *state = (nvmlGpuFabricState_t)g->fabric_state;
    /* The fabric manager is not ready yet: the probe is still in progress, its result not known. */
    if (*state == NVML_GPU_FABRIC_STATE_COMPLETED && g->fabric_ready_s && mokka_wall_ms() / 1000 < g->fabric_ready_s) {
        *state = NVML_GPU_FABRIC_STATE_IN_PROGRESS;
        *status = NVML_ERROR_NOT_READY;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    GET_GPU(device, g);
    NEED(info);
    memset(info, 0, sizeof *info);
    return fabric_fill(g, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(info);
    unsigned int version = info->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    size_t size = version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof(nvmlGpuFabricInfo_v3_t);
    memset(info, 0, size);
    info->version = version;
    nvmlReturn_t r = fabric_fill(g, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    if (r == NVML_SUCCESS) info->healthMask = g->fabric_health; /* v2 and v3 both carry it */
    return r;
}

/* ---- misc -------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    GET_GPU(device, g);
    (void)g;
    NEED(types);
    *types = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
             nvmlEventTypeXidCriticalError | nvmlEventTypeClock | nvmlEventTypePowerSourceChange;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuOperationMode(nvmlDevice_t device, nvmlGpuOperationMode_t *current,
                                                  nvmlGpuOperationMode_t *pending) {
    GET_GPU(device, g);
    (void)g;
    (void)current; (void)pending;
    return NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t driver_model(nvmlDevice_t device, nvmlDriverModel_t *current, nvmlDriverModel_t *pending) {
    GET_GPU(device, g);
    (void)g;
    (void)current; (void)pending;
    return NVML_ERROR_NOT_SUPPORTED; /* Windows only */
}
EXPORT nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, nvmlDriverModel_t *current, nvmlDriverModel_t *pending) {
    RELEASE_GATE();
    return driver_model(device, current, pending);
}
EXPORT nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, nvmlDriverModel_t *current, nvmlDriverModel_t *pending) {
    return driver_model(device, current, pending);
}

EXPORT nvmlReturn_t nvmlDeviceGetAPIRestriction(nvmlDevice_t device, nvmlRestrictedAPI_t api, nvmlEnableState_t *state) {
    GET_GPU(device, g);
    (void)g;
    NEED(state);
    if (api >= NVML_RESTRICTED_API_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (api == NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS) return NVML_ERROR_NOT_SUPPORTED;
    *state = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHostVgpuMode(nvmlDevice_t device, nvmlHostVgpuMode_t *mode) {
    GET_GPU(device, g);
    (void)g;
    (void)mode;
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *enabled, unsigned int *default_mode) {
    GET_GPU(device, g);
    NEED(enabled && default_mode);
    *enabled = *default_mode = g->architecture >= NVML_DEVICE_ARCH_TURING;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version) {
    GET_GPU(device, g);
    NEED(version);
    if (g->architecture < NVML_DEVICE_ARCH_TURING) return NVML_ERROR_NOT_SUPPORTED;
    snprintf(version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE, "%s", g_state.hdr->driver_version);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode) {
    RELEASE_GATE();
    GET_GPU(device, g);
    (void)g;
    NEED(mode);
    if (mode->version != nvmlDeviceAddressingMode_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mode->value = NVML_DEVICE_ADDRESSING_MODE_NONE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPdi(nvmlDevice_t device, nvmlPdi_t *pdi) {
    RELEASE_GATE();
    GET_GPU(device, g);
    NEED(pdi);
    if (pdi->version != nvmlPdi_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t h = 1469598103934665603ull; /* a stable per-GPU id derived from the UUID */
    for (const char *p = g->uuid; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    pdi->value = h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRepairStatus(nvmlDevice_t device, nvmlRepairStatus_t *status) {
    RELEASE_GATE();
    GET_GPU(device, g);
    (void)g;
    NEED(status);
    if (status->version != nvmlRepairStatus_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    status->bChannelRepairPending = 0;
    status->bTpcRepairPending = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v4(nvmlDevice_t device, nvmlGridLicensableFeatures_t *features) {
    GET_GPU(device, g);
    (void)g;
    NEED(features);
    memset(features, 0, sizeof *features);
    return NVML_SUCCESS;
}
/* v1..v3: each version's feature records are smaller than v4's; with no feature to list,
 * only the two leading words, which every version shares, are written. */
static nvmlReturn_t no_licensable_features(nvmlDevice_t device, nvmlGridLicensableFeatures_t *features) {
    GET_GPU(device, g);
    (void)g;
    NEED(features);
    features->isGridLicenseSupported = 0;
    features->licensableFeaturesCount = 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v3(nvmlDevice_t d, nvmlGridLicensableFeatures_t *f) {
    return no_licensable_features(d, f);
}
EXPORT nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v2(nvmlDevice_t d, nvmlGridLicensableFeatures_t *f) {
    return no_licensable_features(d, f);
}
EXPORT nvmlReturn_t nvmlDeviceGetGridLicensableFeatures(nvmlDevice_t d, nvmlGridLicensableFeatures_t *f) {
    return no_licensable_features(d, f);
}
