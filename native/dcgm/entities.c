/* DCGM's entities as NVML shows them: GPUs (gpuId = NVML index), their MIG GPU instances and
 * compute instances (hierarchy), PCIe/NVLink topology, link states and entity status. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static void discover_mig(unsigned gpu, nvmlDevice_t device) {
    unsigned current = 0, pending = 0, max = 0;
    if (NVML(nvmlDeviceGetMigMode)(device, &current, &pending) != NVML_SUCCESS || current != NVML_DEVICE_MIG_ENABLE)
        return;
    if (NVML(nvmlDeviceGetMaxMigDeviceCount)(device, &max) != NVML_SUCCESS) return;
    for (unsigned i = 0; i < max; i++) {
        nvmlDevice_t mig;
        unsigned gi, ci;
        nvmlDeviceAttributes_t attr;
        if (NVML(nvmlDeviceGetMigDeviceHandleByIndex)(device, i, &mig) != NVML_SUCCESS) continue;
        if (NVML(nvmlDeviceGetGpuInstanceId)(mig, &gi) != NVML_SUCCESS ||
            NVML(nvmlDeviceGetComputeInstanceId)(mig, &ci) != NVML_SUCCESS ||
            NVML(nvmlDeviceGetAttributes_v2)(mig, &attr) != NVML_SUCCESS)
            continue;
        nvmlGpuInstance_t gih;
        nvmlGpuInstanceInfo_t giinfo = {0};
        nvmlComputeInstance_t cih;
        nvmlComputeInstanceInfo_t ciinfo = {0};
        if (NVML(nvmlDeviceGetGpuInstanceById)(device, gi, &gih) != NVML_SUCCESS ||
            NVML(nvmlGpuInstanceGetInfo)(gih, &giinfo) != NVML_SUCCESS ||
            NVML(nvmlGpuInstanceGetComputeInstanceById)(gih, ci, &cih) != NVML_SUCCESS ||
            NVML(nvmlComputeInstanceGetInfo_v2)(cih, &ciinfo) != NVML_SUCCESS)
            continue;
        int known = 0;
        for (unsigned k = 0; k < g_dcgm.gi_count; k++) known |= g_dcgm.gis[k].gpu == gpu && g_dcgm.gis[k].gi == gi;
        if (!known && g_dcgm.gi_count < MOKKA_DCGM_MAX_INSTANCES)
            g_dcgm.gis[g_dcgm.gi_count++] = (mokka_dcgm_instance_t){
                .gpu = gpu, .gi = gi, .profile = giinfo.profileId, .slices = attr.gpuInstanceSliceCount, .mig = mig};
        if (g_dcgm.ci_count < MOKKA_DCGM_MAX_INSTANCES)
            g_dcgm.cis[g_dcgm.ci_count++] = (mokka_dcgm_instance_t){.gpu = gpu,
                                                                    .gi = gi,
                                                                    .ci = ci,
                                                                    .profile = ciinfo.profileId,
                                                                    .slices = attr.computeInstanceSliceCount,
                                                                    .mig = mig};
    }
}

/* Called with the lock held. */
dcgmReturn_t mokka_dcgm_discover(void) {
    unsigned count = 0;
    nvmlReturn_t r = NVML(nvmlDeviceGetCount_v2)(&count);
    if (r != NVML_SUCCESS) return mokka_dcgm_from_nvml(r);
    if (count > DCGM_MAX_NUM_DEVICES) count = DCGM_MAX_NUM_DEVICES;
    g_dcgm.gi_count = g_dcgm.ci_count = 0;
    if (!g_dcgm.events && NVML(nvmlEventSetCreate)(&g_dcgm.events) != NVML_SUCCESS) g_dcgm.events = NULL;
    for (unsigned i = 0; i < count; i++) {
        mokka_dcgm_gpu_t *gpu = &g_dcgm.gpus[i];
        memset(gpu, 0, sizeof *gpu);
        if (NVML(nvmlDeviceGetHandleByIndex_v2)(i, &gpu->device) != NVML_SUCCESS) return DCGM_ST_NVML_ERROR;
        NVML(nvmlDeviceGetUUID)(gpu->device, gpu->uuid, sizeof gpu->uuid);
        nvmlGpmSupport_t support = {.version = NVML_GPM_SUPPORT_VERSION};
        gpu->gpm = NVML(nvmlGpmQueryDeviceSupport)(gpu->device, &support) == NVML_SUCCESS && support.isSupportedDevice;
        if (g_dcgm.events) NVML(nvmlDeviceRegisterEvents)(gpu->device, nvmlEventTypeXidCriticalError, g_dcgm.events);
        discover_mig(i, gpu->device);
    }
    g_dcgm.gpu_count = count;
    return DCGM_ST_OK;
}

void mokka_dcgm_poll_events(void) {
    pthread_mutex_lock(&g_dcgm.lock);
    nvmlEventData_t e;
    while (g_dcgm.events && NVML(nvmlEventSetWait_v2)(g_dcgm.events, &e, 0) == NVML_SUCCESS) {
        for (unsigned i = 0; i < g_dcgm.gpu_count; i++) {
            if (g_dcgm.gpus[i].device != e.device || e.eventType != nvmlEventTypeXidCriticalError) continue;
            g_dcgm.gpus[i].last_xid = (int64_t)e.eventData;
            g_dcgm.gpus[i].xid_ts = mokka_dcgm_now_us();
            g_dcgm.gpus[i].xid_count++;
        }
    }
    pthread_mutex_unlock(&g_dcgm.lock);
}

const char *mokka_dcgm_brand(nvmlBrandType_t brand) {
    static const char *names[] = {"Unknown", "Quadro", "Tesla", "NVS", "Grid", "GeForce", "Titan", "NVIDIA vApps",
                                  "NVIDIA vPC", "NVIDIA vCS", "NVIDIA vWS", "NVIDIA Cloud Gaming", "Quadro RTX",
                                  "NVIDIA RTX", "NVIDIA", "GeForce RTX", "Titan RTX"};
    return (unsigned)brand < sizeof names / sizeof *names ? names[brand] : "Unknown";
}

int mokka_dcgm_entity_exists(dcgm_field_entity_group_t group, unsigned id) {
    switch (group) {
    case DCGM_FE_GPU: return id < g_dcgm.gpu_count;
    case DCGM_FE_GPU_I: return id < g_dcgm.gi_count;
    case DCGM_FE_GPU_CI: return id < g_dcgm.ci_count;
    case DCGM_FE_LINK: /* a GPU's NVLink: parent type in the low byte, link index, then the GPU id */
        return (id & 0xff) == DCGM_FE_GPU && (id >> 8 & 0xffff) <= DCGM_NVLINK_MAX_LINKS_PER_GPU &&
               id >> 24 < g_dcgm.gpu_count;
    default: return 0;
    }
}

static dcgmReturn_t all_devices(unsigned *ids, int *count) {
    if (!ids || !count) return DCGM_ST_BADPARAM;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    for (unsigned i = 0; i < g_dcgm.gpu_count; i++) ids[i] = i;
    *count = (int)g_dcgm.gpu_count;
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGetAllDevices(dcgmHandle_t handle, unsigned *ids, int *count) {
    (void)handle;
    return all_devices(ids, count);
}

EXPORT dcgmReturn_t dcgmGetAllSupportedDevices(dcgmHandle_t handle, unsigned *ids, int *count) {
    (void)handle;
    return all_devices(ids, count);
}

EXPORT dcgmReturn_t dcgmGetEntityGroupEntities(dcgmHandle_t handle, dcgm_field_entity_group_t group,
                                               dcgm_field_eid_t *entities, int *count, unsigned flags) {
    (void)handle, (void)flags;
    if (!entities || !count) return DCGM_ST_BADPARAM;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    unsigned n = group == DCGM_FE_GPU     ? g_dcgm.gpu_count
                 : group == DCGM_FE_GPU_I  ? g_dcgm.gi_count
                 : group == DCGM_FE_GPU_CI ? g_dcgm.ci_count
                                           : 0; /* no NvSwitches, CPUs, ConnectX cards or links as entities */
    if ((int)n > *count) {
        *count = (int)n;
        return DCGM_ST_MAX_LIMIT;
    }
    for (unsigned i = 0; i < n; i++) entities[i] = i;
    *count = (int)n;
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGetGpuStatus(dcgmHandle_t handle, unsigned gpu, DcgmEntityStatus_t *status) {
    (void)handle;
    if (!status) return DCGM_ST_BADPARAM;
    if (gpu >= g_dcgm.gpu_count) {
        *status = DcgmEntityStatusUnknown;
        return DCGM_ST_OK;
    }
    unsigned minor;
    nvmlReturn_t r = NVML(nvmlDeviceGetMinorNumber)(g_dcgm.gpus[gpu].device, &minor);
    *status = r == NVML_ERROR_GPU_IS_LOST ? DcgmEntityStatusLost : DcgmEntityStatusOk;
    return DCGM_ST_OK;
}

static void copy_string(char *out, size_t size, nvmlReturn_t r, const char *value) {
    snprintf(out, size, "%s", r == NVML_SUCCESS ? value : DCGM_STR_BLANK);
}

EXPORT dcgmReturn_t dcgmGetDeviceAttributes(dcgmHandle_t handle, unsigned gpu, dcgmDeviceAttributes_v3 *a) {
    (void)handle;
    if (!a) return DCGM_ST_BADPARAM;
    if (a->version != dcgmDeviceAttributes_version3) return DCGM_ST_VER_MISMATCH;
    if (gpu >= g_dcgm.gpu_count) return DCGM_ST_BADPARAM;
    nvmlDevice_t d = g_dcgm.gpus[gpu].device;
    memset(a, 0, sizeof *a);
    a->version = dcgmDeviceAttributes_version3;

    a->clockSets.version = dcgmDeviceSupportedClockSets_version1;
    unsigned mem[16], nmem = 16;
    if (NVML(nvmlDeviceGetSupportedMemoryClocks)(d, &nmem, mem) == NVML_SUCCESS) {
        for (unsigned m = 0; m < nmem && a->clockSets.count < DCGM_MAX_CLOCKS; m++) {
            unsigned gfx[512], ngfx = 512;
            if (NVML(nvmlDeviceGetSupportedGraphicsClocks)(d, mem[m], &ngfx, gfx) != NVML_SUCCESS) continue;
            for (unsigned k = 0; k < ngfx && a->clockSets.count < DCGM_MAX_CLOCKS; k++)
                a->clockSets.clockSet[a->clockSets.count++] =
                    (dcgmClockSet_v1){.version = dcgmClockSet_version1, .memClock = mem[m], .smClock = gfx[k]};
        }
    }

    unsigned v;
    a->thermalSettings.version = dcgmDeviceThermals_version1;
    a->thermalSettings.slowdownTemp =
        NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, &v) ? DCGM_INT32_BLANK : v;
    a->thermalSettings.shutdownTemp =
        NVML(nvmlDeviceGetTemperatureThreshold)(d, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, &v) ? DCGM_INT32_BLANK : v;

    unsigned lo, hi;
    dcgmDevicePowerLimits_v1 *p = &a->powerLimits;
    p->version = dcgmDevicePowerLimits_version1;
    p->curPowerLimit = NVML(nvmlDeviceGetPowerManagementLimit)(d, &v) ? DCGM_INT32_BLANK : v / 1000;
    p->defaultPowerLimit = NVML(nvmlDeviceGetPowerManagementDefaultLimit)(d, &v) ? DCGM_INT32_BLANK : v / 1000;
    p->enforcedPowerLimit = NVML(nvmlDeviceGetEnforcedPowerLimit)(d, &v) ? DCGM_INT32_BLANK : v / 1000;
    if (NVML(nvmlDeviceGetPowerManagementLimitConstraints)(d, &lo, &hi) == NVML_SUCCESS) {
        p->minPowerLimit = lo / 1000;
        p->maxPowerLimit = hi / 1000;
    } else {
        p->minPowerLimit = p->maxPowerLimit = DCGM_INT32_BLANK;
    }

    dcgmDeviceIdentifiers_v1 *id = &a->identifiers;
    char s[DCGM_MAX_STR_LENGTH];
    id->version = dcgmDeviceIdentifiers_version1;
    nvmlBrandType_t brand;
    nvmlReturn_t r = NVML(nvmlDeviceGetBrand)(d, &brand);
    copy_string(id->brandName, sizeof id->brandName, r, mokka_dcgm_brand(brand));
    r = NVML(nvmlDeviceGetName)(d, s, sizeof s);
    copy_string(id->deviceName, sizeof id->deviceName, r, s);
    nvmlPciInfo_t pci;
    r = NVML(nvmlDeviceGetPciInfo_v3)(d, &pci);
    copy_string(id->pciBusId, sizeof id->pciBusId, r, pci.busId);
    if (r == NVML_SUCCESS) {
        id->pciDeviceId = pci.pciDeviceId;
        id->pciSubSystemId = pci.pciSubSystemId;
    }
    r = NVML(nvmlDeviceGetSerial)(d, s, sizeof s);
    copy_string(id->serial, sizeof id->serial, r, s);
    r = NVML(nvmlDeviceGetUUID)(d, s, sizeof s);
    copy_string(id->uuid, sizeof id->uuid, r, s);
    r = NVML(nvmlDeviceGetVbiosVersion)(d, s, sizeof s);
    copy_string(id->vbios, sizeof id->vbios, r, s);
    r = NVML(nvmlDeviceGetInforomImageVersion)(d, s, sizeof s);
    copy_string(id->inforomImageVersion, sizeof id->inforomImageVersion, r, s);
    r = NVML(nvmlSystemGetDriverVersion)(s, sizeof s);
    copy_string(id->driverVersion, sizeof id->driverVersion, r, s);
    nvmlGpuVirtualizationMode_t mode;
    id->virtualizationMode = NVML(nvmlDeviceGetVirtualizationMode)(d, &mode) == NVML_SUCCESS ? (unsigned)mode : 0;

    dcgmDeviceMemoryUsage_v1 *m = &a->memoryUsage;
    m->version = dcgmDeviceMemoryUsage_version1;
    nvmlMemory_v2_t fb = {.version = nvmlMemory_v2};
    if (NVML(nvmlDeviceGetMemoryInfo_v2)(d, &fb) == NVML_SUCCESS) {
        m->fbTotal = (unsigned)(fb.total >> 20);
        m->fbUsed = (unsigned)(fb.used >> 20);
        m->fbFree = (unsigned)(fb.free >> 20);
    }
    nvmlBAR1Memory_t bar1;
    if (NVML(nvmlDeviceGetBAR1MemoryInfo)(d, &bar1) == NVML_SUCCESS) m->bar1Total = (unsigned)(bar1.bar1Total >> 20);

    a->settings.version = dcgmDeviceSettings_version2;
    nvmlEnableState_t persistence;
    if (NVML(nvmlDeviceGetPersistenceMode)(d, &persistence) == NVML_SUCCESS)
        a->settings.persistenceModeEnabled = persistence == NVML_FEATURE_ENABLED;
    unsigned current, pending;
    if (NVML(nvmlDeviceGetMigMode)(d, &current, &pending) == NVML_SUCCESS)
        a->settings.migModeEnabled = current == NVML_DEVICE_MIG_ENABLE;
    return DCGM_ST_OK;
}

/* The GPU's active NVLinks (a bit per link) and the PCI bus ID each one's far end has. */
static unsigned active_links(nvmlDevice_t d, char remote[][32]) {
    unsigned mask = 0;
    for (unsigned l = 0; l < DCGM_NVLINK_MAX_LINKS_PER_GPU; l++) {
        nvmlEnableState_t active;
        remote[l][0] = 0;
        if (NVML(nvmlDeviceGetNvLinkState)(d, l, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
        nvmlPciInfo_t pci;
        if (NVML(nvmlDeviceGetNvLinkRemotePciInfo_v2)(d, l, &pci) == NVML_SUCCESS)
            snprintf(remote[l], 32, "%s", pci.busId);
        mask |= 1u << l;
    }
    return mask;
}

/* Paths to the other GPUs as DCGM's topology counts them: the PCIe level of their common ancestor,
 * and the NVLinks that reach each one, directly or through NVSwitches (a switched fabric reaches
 * every other GPU over all of the GPU's active links). */
EXPORT dcgmReturn_t dcgmGetDeviceTopology(dcgmHandle_t handle, unsigned gpu, dcgmDeviceTopology_v1 *t) {
    (void)handle;
    if (!t) return DCGM_ST_BADPARAM;
    if (gpu >= g_dcgm.gpu_count) return DCGM_ST_BADPARAM;
    nvmlDevice_t d = g_dcgm.gpus[gpu].device;
    memset(t, 0, sizeof *t);
    t->version = dcgmDeviceTopology_version1;
    NVML(nvmlDeviceGetCpuAffinity)(d, DCGM_AFFINITY_BITMASK_ARRAY_SIZE, t->cpuAffinityMask);
    char remote[DCGM_NVLINK_MAX_LINKS_PER_GPU][32];
    unsigned mask = active_links(d, remote);
    char bus[DCGM_MAX_NUM_DEVICES][32]; /* every GPU's bus ID, read once */
    int to_gpus = 0;                    /* some link ends at a GPU: not a switched fabric */
    for (unsigned k = 0; k < g_dcgm.gpu_count; k++) {
        nvmlPciInfo_t pci;
        bus[k][0] = 0;
        if (NVML(nvmlDeviceGetPciInfo_v3)(g_dcgm.gpus[k].device, &pci) == NVML_SUCCESS)
            snprintf(bus[k], sizeof bus[k], "%s", pci.busId);
        for (unsigned l = 0; l < DCGM_NVLINK_MAX_LINKS_PER_GPU; l++)
            to_gpus |= (mask >> l & 1) && bus[k][0] && !strcmp(bus[k], remote[l]);
    }
    for (unsigned other = 0; other < g_dcgm.gpu_count; other++) {
        if (other == gpu) continue;
        nvmlGpuTopologyLevel_t level;
        unsigned path = 0;
        if (NVML(nvmlDeviceGetTopologyCommonAncestor)(d, g_dcgm.gpus[other].device, &level) == NVML_SUCCESS) {
            path = level == NVML_TOPOLOGY_INTERNAL     ? DCGM_TOPOLOGY_BOARD
                   : level == NVML_TOPOLOGY_SINGLE     ? DCGM_TOPOLOGY_SINGLE
                   : level == NVML_TOPOLOGY_MULTIPLE   ? DCGM_TOPOLOGY_MULTIPLE
                   : level == NVML_TOPOLOGY_HOSTBRIDGE ? DCGM_TOPOLOGY_HOSTBRIDGE
                   : level == NVML_TOPOLOGY_NODE       ? DCGM_TOPOLOGY_CPU
                                                       : DCGM_TOPOLOGY_SYSTEM;
        }
        unsigned links = 0;
        if (bus[other][0]) {
            for (unsigned l = 0; l < DCGM_NVLINK_MAX_LINKS_PER_GPU; l++)
                if ((mask >> l & 1) && !strcmp(remote[l], bus[other])) links |= 1u << l;
            if (!to_gpus) links = mask;
        }
        unsigned nlinks = (unsigned)__builtin_popcount(links);
        if (nlinks) path |= DCGM_TOPOLOGY_NVLINK1 << (nlinks - 1);
        t->gpuPaths[t->numGpus].gpuId = other;
        t->gpuPaths[t->numGpus].path = path;
        t->gpuPaths[t->numGpus].localNvLinkIds = links;
        t->numGpus++;
    }
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGetNvLinkLinkStatus(dcgmHandle_t handle, dcgmNvLinkStatus_v4 *s) {
    (void)handle;
    if (!s) return DCGM_ST_BADPARAM;
    if (s->version != dcgmNvLinkStatus_version4) return DCGM_ST_VER_MISMATCH;
    memset(s, 0, sizeof *s);
    s->version = dcgmNvLinkStatus_version4;
    for (unsigned i = 0; i < g_dcgm.gpu_count; i++) {
        s->gpus[i].entityId = i;
        for (unsigned l = 0; l < DCGM_NVLINK_MAX_LINKS_PER_GPU; l++) {
            nvmlEnableState_t active;
            nvmlReturn_t r = NVML(nvmlDeviceGetNvLinkState)(g_dcgm.gpus[i].device, l, &active);
            s->gpus[i].linkState[l] = r != NVML_SUCCESS          ? DcgmNvLinkLinkStateNotSupported
                                      : active == NVML_FEATURE_ENABLED ? DcgmNvLinkLinkStateUp
                                                                      : DcgmNvLinkLinkStateDown;
        }
    }
    s->numGpus = g_dcgm.gpu_count;
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGetNvLinkP2PStatus(dcgmHandle_t handle, dcgmNvLinkP2PStatus_v1 *s) {
    (void)handle;
    if (!s) return DCGM_ST_BADPARAM;
    if (s->version != dcgmNvLinkP2PStatus_version1) return DCGM_ST_VER_MISMATCH;
    for (unsigned i = 0; i < g_dcgm.gpu_count; i++) {
        dcgmDeviceTopology_v1 t = {.version = dcgmDeviceTopology_version1};
        s->gpus[i].entityId = i;
        for (unsigned k = 0; k < DCGM_MAX_NUM_DEVICES; k++) s->gpus[i].linkStatus[k] = DcgmNvLinkP2pStatusNotSupported;
        if (dcgmGetDeviceTopology(handle, i, &t) != DCGM_ST_OK) continue;
        for (unsigned k = 0; k < t.numGpus; k++)
            if (t.gpuPaths[k].localNvLinkIds) s->gpus[i].linkStatus[t.gpuPaths[k].gpuId] = DcgmNvLinkP2pStatusOK;
    }
    s->numGpus = g_dcgm.gpu_count;
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGetGpuInstanceHierarchy(dcgmHandle_t handle, dcgmMigHierarchy_v2 *h) {
    (void)handle;
    if (!h) return DCGM_ST_BADPARAM;
    if (h->version != dcgmMigHierarchy_version2) return DCGM_ST_VER_MISMATCH;
    memset(h->entityList, 0, sizeof h->entityList);
    h->count = 0;
    pthread_mutex_lock(&g_dcgm.lock);
    /* Each GPU instance, then its compute instances (consumers attach a compute instance to
     * the GPU instance listed before it). */
    for (unsigned k = 0; k < g_dcgm.gi_count && h->count < DCGM_MAX_HIERARCHY_INFO; k++) {
        const mokka_dcgm_instance_t *gi = &g_dcgm.gis[k];
        dcgmMigHierarchyInfo_v2 *e = &h->entityList[h->count++];
        e->entity = (dcgmGroupEntityPair_t){DCGM_FE_GPU_I, k};
        e->parent = (dcgmGroupEntityPair_t){DCGM_FE_GPU, gi->gpu};
        snprintf(e->info.gpuUuid, sizeof e->info.gpuUuid, "%s", g_dcgm.gpus[gi->gpu].uuid);
        e->info.nvmlGpuIndex = gi->gpu;
        e->info.nvmlInstanceId = gi->gi;
        e->info.nvmlComputeInstanceId = (unsigned)-1;
        e->info.nvmlMigProfileId = gi->profile;
        e->info.nvmlProfileSlices = gi->slices;
        for (unsigned c = 0; c < g_dcgm.ci_count && h->count < DCGM_MAX_HIERARCHY_INFO; c++) {
            const mokka_dcgm_instance_t *ci = &g_dcgm.cis[c];
            if (ci->gpu != gi->gpu || ci->gi != gi->gi) continue;
            e = &h->entityList[h->count++];
            e->entity = (dcgmGroupEntityPair_t){DCGM_FE_GPU_CI, c};
            e->parent = (dcgmGroupEntityPair_t){DCGM_FE_GPU_I, k};
            snprintf(e->info.gpuUuid, sizeof e->info.gpuUuid, "%s", g_dcgm.gpus[ci->gpu].uuid);
            e->info.nvmlGpuIndex = ci->gpu;
            e->info.nvmlInstanceId = ci->gi;
            e->info.nvmlComputeInstanceId = ci->ci;
            e->info.nvmlMigProfileId = ci->profile;
            e->info.nvmlProfileSlices = ci->slices;
        }
    }
    pthread_mutex_unlock(&g_dcgm.lock);
    return DCGM_ST_OK;
}

/* CPUs as DCGM entities exist only on Grace systems (DCGM's CPU module needs NVIDIA's CPU driver). */
EXPORT dcgmReturn_t dcgmGetCpuHierarchy(dcgmHandle_t handle, dcgmCpuHierarchy_v1 *h) {
    (void)handle;
    if (!h) return DCGM_ST_BADPARAM;
    return DCGM_ST_NOT_SUPPORTED;
}
