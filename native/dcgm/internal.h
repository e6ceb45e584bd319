/* Internal declarations of the mock libdcgm. It keeps no values of its own: every answer is
 * read through NVML at the moment it is asked for, as DCGM's own cache manager reads NVML,
 * from the libnvidia-ml.so.1 this process loads (the node's mock, which maps the node's
 * state; beside this library when staged, else wherever the loader finds it). So DCGM,
 * NVML and nvidia-smi agree, container visibility included: DCGM sees the GPUs NVML sees. */
#ifndef MOKKA_DCGM_INTERNAL_H
#define MOKKA_DCGM_INTERNAL_H

#include <nvml.h>
#include <pthread.h>

#include "abi.h"

#define EXPORT __attribute__((visibility("default")))

/* The NVML entry points DCGM reads through, bound by dlsym at dcgmInit. */
#define MOKKA_NVML_FUNCTIONS(X)                                                                              \
    X(nvmlInit_v2, (void))                                                                                   \
    X(nvmlShutdown, (void))                                                                                  \
    X(nvmlSystemGetDriverVersion, (char *, unsigned))                                                        \
    X(nvmlSystemGetNVMLVersion, (char *, unsigned))                                                          \
    X(nvmlSystemGetCudaDriverVersion_v2, (int *))                                                            \
    X(nvmlDeviceGetCount_v2, (unsigned *))                                                                   \
    X(nvmlDeviceGetHandleByIndex_v2, (unsigned, nvmlDevice_t *))                                             \
    X(nvmlDeviceGetName, (nvmlDevice_t, char *, unsigned))                                                   \
    X(nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned))                                                   \
    X(nvmlDeviceGetSerial, (nvmlDevice_t, char *, unsigned))                                                 \
    X(nvmlDeviceGetBrand, (nvmlDevice_t, nvmlBrandType_t *))                                                 \
    X(nvmlDeviceGetMinorNumber, (nvmlDevice_t, unsigned *))                                                  \
    X(nvmlDeviceGetIndex, (nvmlDevice_t, unsigned *))                                                        \
    X(nvmlDeviceGetPciInfo_v3, (nvmlDevice_t, nvmlPciInfo_t *))                                              \
    X(nvmlDeviceGetVbiosVersion, (nvmlDevice_t, char *, unsigned))                                           \
    X(nvmlDeviceGetInforomImageVersion, (nvmlDevice_t, char *, unsigned))                                    \
    X(nvmlDeviceGetInforomVersion, (nvmlDevice_t, nvmlInforomObject_t, char *, unsigned))                   \
    X(nvmlDeviceGetClockInfo, (nvmlDevice_t, nvmlClockType_t, unsigned *))                                   \
    X(nvmlDeviceGetMaxClockInfo, (nvmlDevice_t, nvmlClockType_t, unsigned *))                                \
    X(nvmlDeviceGetApplicationsClock, (nvmlDevice_t, nvmlClockType_t, unsigned *))                           \
    X(nvmlDeviceGetSupportedMemoryClocks, (nvmlDevice_t, unsigned *, unsigned *))                            \
    X(nvmlDeviceGetSupportedGraphicsClocks, (nvmlDevice_t, unsigned, unsigned *, unsigned *))                \
    X(nvmlDeviceGetCurrentClocksEventReasons, (nvmlDevice_t, unsigned long long *))                          \
    X(nvmlDeviceGetTemperature, (nvmlDevice_t, nvmlTemperatureSensors_t, unsigned *))                        \
    X(nvmlDeviceGetTemperatureThreshold, (nvmlDevice_t, nvmlTemperatureThresholds_t, unsigned *))            \
    X(nvmlDeviceGetFieldValues, (nvmlDevice_t, int, nvmlFieldValue_t *))                                     \
    X(nvmlDeviceGetPowerUsage, (nvmlDevice_t, unsigned *))                                                   \
    X(nvmlDeviceGetTotalEnergyConsumption, (nvmlDevice_t, unsigned long long *))                             \
    X(nvmlDeviceGetPowerManagementLimit, (nvmlDevice_t, unsigned *))                                         \
    X(nvmlDeviceGetPowerManagementDefaultLimit, (nvmlDevice_t, unsigned *))                                  \
    X(nvmlDeviceGetPowerManagementLimitConstraints, (nvmlDevice_t, unsigned *, unsigned *))                  \
    X(nvmlDeviceGetEnforcedPowerLimit, (nvmlDevice_t, unsigned *))                                           \
    X(nvmlDeviceGetPerformanceState, (nvmlDevice_t, nvmlPstates_t *))                                        \
    X(nvmlDeviceGetFanSpeed, (nvmlDevice_t, unsigned *))                                                     \
    X(nvmlDeviceGetPcieReplayCounter, (nvmlDevice_t, unsigned *))                                            \
    X(nvmlDeviceGetPcieThroughput, (nvmlDevice_t, nvmlPcieUtilCounter_t, unsigned *))                        \
    X(nvmlDeviceGetMaxPcieLinkGeneration, (nvmlDevice_t, unsigned *))                                        \
    X(nvmlDeviceGetMaxPcieLinkWidth, (nvmlDevice_t, unsigned *))                                             \
    X(nvmlDeviceGetCurrPcieLinkGeneration, (nvmlDevice_t, unsigned *))                                       \
    X(nvmlDeviceGetCurrPcieLinkWidth, (nvmlDevice_t, unsigned *))                                            \
    X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t, nvmlUtilization_t *))                                    \
    X(nvmlDeviceGetEncoderUtilization, (nvmlDevice_t, unsigned *, unsigned *))                               \
    X(nvmlDeviceGetDecoderUtilization, (nvmlDevice_t, unsigned *, unsigned *))                               \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, nvmlMemory_v2_t *))                                         \
    X(nvmlDeviceGetBAR1MemoryInfo, (nvmlDevice_t, nvmlBAR1Memory_t *))                                       \
    X(nvmlDeviceGetEccMode, (nvmlDevice_t, nvmlEnableState_t *, nvmlEnableState_t *))                        \
    X(nvmlDeviceGetTotalEccErrors, (nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t,              \
                                    unsigned long long *))                                                   \
    X(nvmlDeviceGetRetiredPages, (nvmlDevice_t, nvmlPageRetirementCause_t, unsigned *, unsigned long long *)) \
    X(nvmlDeviceGetRetiredPagesPendingStatus, (nvmlDevice_t, nvmlEnableState_t *))                           \
    X(nvmlDeviceGetRemappedRows, (nvmlDevice_t, unsigned *, unsigned *, unsigned *, unsigned *))             \
    X(nvmlDeviceGetNvLinkState, (nvmlDevice_t, unsigned, nvmlEnableState_t *))                               \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2, (nvmlDevice_t, unsigned, nvmlPciInfo_t *))                        \
    X(nvmlDeviceGetTopologyCommonAncestor, (nvmlDevice_t, nvmlDevice_t, nvmlGpuTopologyLevel_t *))           \
    X(nvmlDeviceGetCpuAffinity, (nvmlDevice_t, unsigned, unsigned long *))                                   \
    X(nvmlDeviceGetPersistenceMode, (nvmlDevice_t, nvmlEnableState_t *))                                     \
    X(nvmlDeviceGetComputeMode, (nvmlDevice_t, nvmlComputeMode_t *))                                         \
    X(nvmlDeviceGetVirtualizationMode, (nvmlDevice_t, nvmlGpuVirtualizationMode_t *))                        \
    X(nvmlDeviceGetMigMode, (nvmlDevice_t, unsigned *, unsigned *))                                          \
    X(nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t, unsigned *))                                            \
    X(nvmlDeviceGetMigDeviceHandleByIndex, (nvmlDevice_t, unsigned, nvmlDevice_t *))                         \
    X(nvmlDeviceGetGpuInstanceId, (nvmlDevice_t, unsigned *))                                                \
    X(nvmlDeviceGetComputeInstanceId, (nvmlDevice_t, unsigned *))                                            \
    X(nvmlDeviceGetGpuInstanceById, (nvmlDevice_t, unsigned, nvmlGpuInstance_t *))                           \
    X(nvmlGpuInstanceGetInfo, (nvmlGpuInstance_t, nvmlGpuInstanceInfo_t *))                                  \
    X(nvmlGpuInstanceGetComputeInstanceById, (nvmlGpuInstance_t, unsigned, nvmlComputeInstance_t *))         \
    X(nvmlComputeInstanceGetInfo_v2, (nvmlComputeInstance_t, nvmlComputeInstanceInfo_t *))                   \
    X(nvmlDeviceGetAttributes_v2, (nvmlDevice_t, nvmlDeviceAttributes_t *))                                 \
    X(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))              \
    X(nvmlEventSetCreate, (nvmlEventSet_t *))                                                                \
    X(nvmlEventSetFree, (nvmlEventSet_t))                                                                    \
    X(nvmlEventSetWait_v2, (nvmlEventSet_t, nvmlEventData_t *, unsigned))                                    \
    X(nvmlDeviceRegisterEvents, (nvmlDevice_t, unsigned long long, nvmlEventSet_t))                          \
    X(nvmlGpmQueryDeviceSupport, (nvmlDevice_t, nvmlGpmSupport_t *))                                         \
    X(nvmlGpmSampleAlloc, (nvmlGpmSample_t *))                                                               \
    X(nvmlGpmSampleFree, (nvmlGpmSample_t))                                                                  \
    X(nvmlGpmSampleGet, (nvmlDevice_t, nvmlGpmSample_t))                                                     \
    X(nvmlGpmMetricsGet, (nvmlGpmMetricsGet_t *))

#define MOKKA_NVML_POINTER(name, args) nvmlReturn_t(*name) args;
typedef struct {
    MOKKA_NVML_FUNCTIONS(MOKKA_NVML_POINTER)
} mokka_nvml_t;

extern mokka_nvml_t g_nvml;
#define NVML(call) (g_nvml.call)

/* What DCGM calls its GPU entities and their instances, found at dcgmStartEmbedded. GPU ids
 * are NVML's indices (as DCGM numbers them); GPU instance and compute instance entity ids are
 * node-wide ordinals, in order of GPU, then instance id. */
#define MOKKA_DCGM_MAX_INSTANCES (DCGM_MAX_NUM_DEVICES * 8)

typedef struct {
    unsigned gpu;       /* parent GPU id */
    unsigned gi;        /* NVML GPU instance id */
    unsigned ci;        /* NVML compute instance id (compute instances only) */
    unsigned profile;   /* NVML profile id */
    unsigned slices;
    nvmlDevice_t mig;   /* the MIG device handle of its first compute instance, for its memory */
} mokka_dcgm_instance_t;

typedef struct {
    nvmlDevice_t device;
    char uuid[96];
    int gpm;                       /* NVML GPM samples on this board */
    nvmlGpmSample_t samples[2];    /* the last two; metrics over the interval between them */
    int filled;                    /* samples taken so far (0, 1, 2) */
    long long sampled_us;          /* when the newer was taken */
    int64_t last_xid;              /* DCGM_FI_DEV_XID_ERRORS: the last Xid seen */
    int64_t xid_ts;
    unsigned long long xid_count;
} mokka_dcgm_gpu_t;

typedef struct {
    int initialized;               /* dcgmInit */
    int started;                   /* dcgmStartEmbedded / dcgmConnect_v2 */
    pthread_mutex_t lock;
    unsigned gpu_count;
    mokka_dcgm_gpu_t gpus[DCGM_MAX_NUM_DEVICES];
    unsigned gi_count, ci_count;
    mokka_dcgm_instance_t gis[MOKKA_DCGM_MAX_INSTANCES];
    mokka_dcgm_instance_t cis[MOKKA_DCGM_MAX_INSTANCES];
    nvmlEventSet_t events;         /* Xid events of every GPU */
    unsigned health[64];           /* dcgmHealthSystems_t watched, by group slot */
    long long health_since[64];    /* when they were set (Xids from then on count) */
} mokka_dcgm_t;

extern mokka_dcgm_t g_dcgm;

long long mokka_dcgm_now_us(void);

/* nvml.c: bind NVML (dlopen beside this library first), 0 on success. */
int mokka_dcgm_bind_nvml(void);
dcgmReturn_t mokka_dcgm_from_nvml(nvmlReturn_t r);

/* entities.c: (re)discover GPUs and MIG instances; whether an entity exists. */
dcgmReturn_t mokka_dcgm_discover(void);
int mokka_dcgm_entity_exists(dcgm_field_entity_group_t group, unsigned id);
/* DCGM's name of an NVML brand ("Tesla", "NVIDIA", ...). */
const char *mokka_dcgm_brand(nvmlBrandType_t brand);
/* Drain pending Xid events into the GPUs' last_xid. */
void mokka_dcgm_poll_events(void);

/* groups.c: a group's entities (DCGM_GROUP_ALL_* and the created ones); count, or -1. */
int mokka_dcgm_group_entities(dcgmGpuGrp_t group, dcgmGroupEntityPair_t *out, int max);
int mokka_dcgm_group_slot(dcgmGpuGrp_t group); /* index into g_dcgm.health, or -1 */
/* A field group's field ids; count, or -1. */
int mokka_dcgm_field_group(dcgmFieldGrp_t group, const unsigned short **fields);

/* fields.c: the metadata of a field id (NULL: unknown to DCGM or to the mock). */
const dcgm_field_meta_t *mokka_dcgm_field(unsigned short id);
/* Read field `id` of an entity now into `out` (its status, type, timestamp and value). */
void mokka_dcgm_read(dcgm_field_entity_group_t group, unsigned id, unsigned short field, dcgmFieldValue_v1 *out);

#endif
