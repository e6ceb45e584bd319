/* The part of DCGM's C ABI (libdcgm.so.4, DCGM 4.x) that the mock answers, declared from
 * facts: return codes, entity groups, field types and the layouts of the structures
 * dcgm-exporter passes in. Written down from DCGM's public headers (dcgm_structs.h,
 * dcgm_fields.h, dcgm_errors.h); the build needs none of them, and tests/test_dcgm_abi.py
 * compiles native/test/dcgm_abi_canary.c against the real headers to check that every
 * size, offset, version word and constant below is theirs. */
#ifndef MOKKA_DCGM_ABI_H
#define MOKKA_DCGM_ABI_H

#include <stdint.h>

typedef enum {
    DCGM_ST_OK = 0,
    DCGM_ST_BADPARAM = -1,
    DCGM_ST_GENERIC_ERROR = -3,
    DCGM_ST_MEMORY = -4,
    DCGM_ST_NOT_CONFIGURED = -5,
    DCGM_ST_NOT_SUPPORTED = -6,
    DCGM_ST_INIT_ERROR = -7,
    DCGM_ST_NVML_ERROR = -8,
    DCGM_ST_UNINITIALIZED = -10,
    DCGM_ST_VER_MISMATCH = -12,
    DCGM_ST_UNKNOWN_FIELD = -13,
    DCGM_ST_NO_DATA = -14,
    DCGM_ST_STALE_DATA = -15,
    DCGM_ST_NOT_WATCHED = -16,
    DCGM_ST_NO_PERMISSION = -17,
    DCGM_ST_GPU_IS_LOST = -18,
    DCGM_ST_CONNECTION_NOT_VALID = -21,
    DCGM_ST_GPU_NOT_SUPPORTED = -22,
    DCGM_ST_MAX_LIMIT = -24,
    DCGM_ST_PROFILING_NOT_SUPPORTED = -36,
} dcgmReturn_t;

/* Version words: the structure's size in the low 24 bits, its version above. */
#define MOKKA_DCGM_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((unsigned long)(ver) << 24U)))

typedef uintptr_t dcgmHandle_t;
typedef uintptr_t dcgmGpuGrp_t;
typedef uintptr_t dcgmFieldGrp_t;

#define DCGM_MAX_NUM_DEVICES 32
#define DCGM_MAX_STR_LENGTH 256
#define DCGM_MAX_BLOB_LENGTH 4096
#define DCGM_MAX_CLOCKS 256
#define DCGM_NVLINK_MAX_LINKS_PER_GPU 18
#define DCGM_NVLINK_MAX_LINKS_PER_NVSWITCH 256
#define DCGM_MAX_NUM_SWITCHES 12
#define DCGM_MAX_NUM_CPUS 8
#define DCGM_MAX_NUM_CPU_CORES 1024
#define DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP 128
#define DCGM_GROUP_MAX_ENTITIES_V2 1024
#define DCGM_MAX_TOTAL_INSTANCES_PER_GPU 14
#define DCGM_MAX_HIERARCHY_INFO (DCGM_MAX_NUM_DEVICES * DCGM_MAX_TOTAL_INSTANCES_PER_GPU)
#define DCGM_PROF_MAX_NUM_GROUPS_V2 10
#define DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2 64
#define DCGM_AFFINITY_BITMASK_ARRAY_SIZE 8

#define DCGM_GROUP_ALL_GPUS 0x7fffffff
#define DCGM_GROUP_ALL_ENTITIES 0x7ffffffb
#define DCGM_GEGE_FLAG_ONLY_SUPPORTED 0x00000001

/* Blank values: "no value" in each type. */
#define DCGM_INT32_BLANK 0x7ffffff0
#define DCGM_INT64_BLANK 0x7ffffffffffffff0LL
#define DCGM_FP64_BLANK 140737488355328.0
#define DCGM_STR_BLANK "<<<NULL>>>"

#define DCGM_FT_BINARY 'b'
#define DCGM_FT_DOUBLE 'd'
#define DCGM_FT_INT64 'i'
#define DCGM_FT_STRING 's'
#define DCGM_FT_TIMESTAMP 't'
#define DCGM_FS_GLOBAL 0
#define DCGM_FS_ENTITY 1
#define DCGM_FS_DEVICE DCGM_FS_ENTITY

typedef enum {
    DCGM_FE_NONE = 0,
    DCGM_FE_GPU,
    DCGM_FE_VGPU,
    DCGM_FE_SWITCH,
    DCGM_FE_GPU_I,
    DCGM_FE_GPU_CI,
    DCGM_FE_LINK,
    DCGM_FE_CPU,
    DCGM_FE_CPU_CORE,
    DCGM_FE_CONNECTX,
    DCGM_FE_COUNT
} dcgm_field_entity_group_t;

typedef unsigned int dcgm_field_eid_t;

typedef enum { DCGM_OPERATION_MODE_AUTO = 1, DCGM_OPERATION_MODE_MANUAL = 2 } dcgmOperationMode_t;

typedef enum {
    DcgmEntityStatusUnknown = 0,
    DcgmEntityStatusOk,
    DcgmEntityStatusUnsupported,
    DcgmEntityStatusInaccessible,
    DcgmEntityStatusLost,
    DcgmEntityStatusFake,
    DcgmEntityStatusDisabled,
    DcgmEntityStatusDetached
} DcgmEntityStatus_t;

typedef enum {
    DCGM_GROUP_DEFAULT = 0,
    DCGM_GROUP_EMPTY = 1,
    DCGM_GROUP_DEFAULT_NVSWITCHES = 2,
    DCGM_GROUP_DEFAULT_INSTANCES = 3,
    DCGM_GROUP_DEFAULT_COMPUTE_INSTANCES = 4,
    DCGM_GROUP_DEFAULT_EVERYTHING = 5,
} dcgmGroupType_t;

typedef struct {
    unsigned short fieldId;
    char fieldType;
    unsigned char size;
    char tag[48];
    int scope;
    int nvmlFieldId;
    dcgm_field_entity_group_t entityLevel;
    void *valueFormat; /* dcgm_field_output_format_t *: dmon's column format (none here) */
} dcgm_field_meta_t;

typedef struct {
    unsigned int version;
    unsigned int persistAfterDisconnect;
    unsigned int timeoutMs;
    unsigned int addressIsUnixSocket;
} dcgmConnectV2Params_v2;

typedef struct {
    dcgm_field_entity_group_t entityGroupId;
    dcgm_field_eid_t entityId;
} dcgmGroupEntityPair_t;

typedef struct {
    unsigned int version;
    unsigned int count;
    char groupName[DCGM_MAX_STR_LENGTH];
    dcgmGroupEntityPair_t entityList[DCGM_GROUP_MAX_ENTITIES_V2];
} dcgmGroupInfo_v3;
#define dcgmGroupInfo_version3 MOKKA_DCGM_VERSION(dcgmGroupInfo_v3, 3)

typedef enum {
    DcgmMigProfileNone = 0,
    DcgmMigProfileGpuInstanceSlice1 = 1,
    DcgmMigProfileGpuInstanceSlice2 = 2,
    DcgmMigProfileGpuInstanceSlice3 = 3,
    DcgmMigProfileGpuInstanceSlice4 = 4,
    DcgmMigProfileGpuInstanceSlice7 = 5,
    DcgmMigProfileGpuInstanceSlice8 = 6,
    DcgmMigProfileGpuInstanceSlice6 = 7,
    DcgmMigProfileComputeInstanceSlice1 = 30,
    DcgmMigProfileComputeInstanceSlice2 = 31,
    DcgmMigProfileComputeInstanceSlice3 = 32,
    DcgmMigProfileComputeInstanceSlice4 = 33,
    DcgmMigProfileComputeInstanceSlice7 = 34,
    DcgmMigProfileComputeInstanceSlice8 = 35,
    DcgmMigProfileComputeInstanceSlice6 = 36,
} dcgmMigProfile_t;

typedef struct {
    char gpuUuid[128];
    unsigned int nvmlGpuIndex;
    unsigned int nvmlInstanceId;
    unsigned int nvmlComputeInstanceId;
    unsigned int nvmlMigProfileId;
    unsigned int nvmlProfileSlices;
} dcgmMigEntityInfo_t;

typedef struct {
    dcgmGroupEntityPair_t entity;
    dcgmGroupEntityPair_t parent;
    dcgmMigEntityInfo_t info;
} dcgmMigHierarchyInfo_v2;

typedef struct {
    unsigned int version;
    unsigned int count;
    dcgmMigHierarchyInfo_v2 entityList[DCGM_MAX_HIERARCHY_INFO];
} dcgmMigHierarchy_v2;
#define dcgmMigHierarchy_version2 MOKKA_DCGM_VERSION(dcgmMigHierarchy_v2, 2)

typedef struct {
    unsigned int version;
    uint64_t bitmask[DCGM_MAX_NUM_CPU_CORES / sizeof(uint64_t) / 8];
} dcgmCpuHierarchyOwnedCores_v1;

typedef struct {
    unsigned int version;
    unsigned int numCpus;
    struct {
        unsigned int cpuId;
        dcgmCpuHierarchyOwnedCores_v1 ownedCores;
    } cpus[DCGM_MAX_NUM_CPUS];
} dcgmCpuHierarchy_v1;
#define dcgmCpuHierarchy_version1 MOKKA_DCGM_VERSION(dcgmCpuHierarchy_v1, 1)

typedef struct {
    int version;
    unsigned int memClock;
    unsigned int smClock;
} dcgmClockSet_v1;
#define dcgmClockSet_version1 MOKKA_DCGM_VERSION(dcgmClockSet_v1, 1)

typedef struct {
    unsigned int version;
    unsigned int count;
    dcgmClockSet_v1 clockSet[DCGM_MAX_CLOCKS];
} dcgmDeviceSupportedClockSets_v1;
#define dcgmDeviceSupportedClockSets_version1 MOKKA_DCGM_VERSION(dcgmDeviceSupportedClockSets_v1, 1)

typedef struct {
    unsigned int version;
    unsigned int slowdownTemp;
    unsigned int shutdownTemp;
} dcgmDeviceThermals_v1;
#define dcgmDeviceThermals_version1 MOKKA_DCGM_VERSION(dcgmDeviceThermals_v1, 1)

typedef struct {
    unsigned int version;
    unsigned int curPowerLimit; /* watts */
    unsigned int defaultPowerLimit;
    unsigned int enforcedPowerLimit;
    unsigned int minPowerLimit;
    unsigned int maxPowerLimit;
} dcgmDevicePowerLimits_v1;
#define dcgmDevicePowerLimits_version1 MOKKA_DCGM_VERSION(dcgmDevicePowerLimits_v1, 1)

typedef struct {
    unsigned int version;
    char brandName[DCGM_MAX_STR_LENGTH];
    char deviceName[DCGM_MAX_STR_LENGTH];
    char pciBusId[DCGM_MAX_STR_LENGTH];
    char serial[DCGM_MAX_STR_LENGTH];
    char uuid[DCGM_MAX_STR_LENGTH];
    char vbios[DCGM_MAX_STR_LENGTH];
    char inforomImageVersion[DCGM_MAX_STR_LENGTH];
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char driverVersion[DCGM_MAX_STR_LENGTH];
    unsigned int virtualizationMode;
} dcgmDeviceIdentifiers_v1;
#define dcgmDeviceIdentifiers_version1 MOKKA_DCGM_VERSION(dcgmDeviceIdentifiers_v1, 1)

typedef struct {
    unsigned int version;
    unsigned int bar1Total; /* MiB */
    unsigned int fbTotal;
    unsigned int fbUsed;
    unsigned int fbFree;
} dcgmDeviceMemoryUsage_v1;
#define dcgmDeviceMemoryUsage_version1 MOKKA_DCGM_VERSION(dcgmDeviceMemoryUsage_v1, 1)

typedef struct {
    unsigned int version;
    unsigned int persistenceModeEnabled;
    unsigned int migModeEnabled;
    unsigned int confidentialComputeMode;
} dcgmDeviceSettings_v2;
#define dcgmDeviceSettings_version2 MOKKA_DCGM_VERSION(dcgmDeviceSettings_v2, 2)

typedef struct {
    unsigned int version;
    dcgmDeviceSupportedClockSets_v1 clockSets;
    dcgmDeviceThermals_v1 thermalSettings;
    dcgmDevicePowerLimits_v1 powerLimits;
    dcgmDeviceIdentifiers_v1 identifiers;
    dcgmDeviceMemoryUsage_v1 memoryUsage;
    dcgmDeviceSettings_v2 settings;
} dcgmDeviceAttributes_v3;
#define dcgmDeviceAttributes_version3 MOKKA_DCGM_VERSION(dcgmDeviceAttributes_v3, 3)

typedef struct {
    unsigned int version;
    unsigned short fieldId;
    unsigned short fieldType;
    int status;
    int64_t ts; /* microseconds since the epoch */
    union {
        int64_t i64;
        double dbl;
        char str[DCGM_MAX_STR_LENGTH];
        char blob[DCGM_MAX_BLOB_LENGTH];
    } value;
} dcgmFieldValue_v1;
#define dcgmFieldValue_version1 MOKKA_DCGM_VERSION(dcgmFieldValue_v1, 1)

typedef struct {
    unsigned int version;
    dcgm_field_entity_group_t entityGroupId;
    dcgm_field_eid_t entityId;
    unsigned short fieldId;
    unsigned short fieldType;
    int status;
    unsigned int unused;
    int64_t ts;
    union {
        int64_t i64;
        double dbl;
        char str[DCGM_MAX_STR_LENGTH];
        char blob[DCGM_MAX_BLOB_LENGTH];
    } value;
} dcgmFieldValue_v2;
#define dcgmFieldValue_version2 MOKKA_DCGM_VERSION(dcgmFieldValue_v2, 2)

typedef int (*dcgmFieldValueEntityEnumeration_f)(dcgm_field_entity_group_t entityGroupId, dcgm_field_eid_t entityId,
                                                 dcgmFieldValue_v1 *values, int numValues, void *userData);

/* dcgmGpuTopologyLevel_t: PCIe paths in the low byte, NVLink link counts above. */
#define DCGM_TOPOLOGY_BOARD 0x1
#define DCGM_TOPOLOGY_SINGLE 0x2
#define DCGM_TOPOLOGY_MULTIPLE 0x4
#define DCGM_TOPOLOGY_HOSTBRIDGE 0x8
#define DCGM_TOPOLOGY_CPU 0x10
#define DCGM_TOPOLOGY_SYSTEM 0x20
#define DCGM_TOPOLOGY_NVLINK1 0x100 /* NVLINKn = NVLINK1 << (n - 1) */

typedef struct {
    unsigned int version;
    unsigned long cpuAffinityMask[DCGM_AFFINITY_BITMASK_ARRAY_SIZE];
    unsigned int numGpus;
    struct {
        unsigned int gpuId;
        unsigned int path; /* dcgmGpuTopologyLevel_t */
        unsigned int localNvLinkIds;
    } gpuPaths[DCGM_MAX_NUM_DEVICES - 1];
} dcgmDeviceTopology_v1;
#define dcgmDeviceTopology_version1 MOKKA_DCGM_VERSION(dcgmDeviceTopology_v1, 1)

typedef enum {
    DcgmNvLinkLinkStateNotSupported = 0,
    DcgmNvLinkLinkStateDisabled = 1,
    DcgmNvLinkLinkStateDown = 2,
    DcgmNvLinkLinkStateUp = 3
} dcgmNvLinkLinkState_t;

typedef struct {
    dcgm_field_eid_t entityId;
    dcgmNvLinkLinkState_t linkState[DCGM_NVLINK_MAX_LINKS_PER_GPU];
} dcgmNvLinkGpuLinkStatus_v3;

typedef struct {
    dcgm_field_eid_t entityId;
    dcgmNvLinkLinkState_t linkState[DCGM_NVLINK_MAX_LINKS_PER_NVSWITCH];
} dcgmNvLinkNvSwitchLinkStatus_t;

typedef struct {
    unsigned int version;
    unsigned int numGpus;
    dcgmNvLinkGpuLinkStatus_v3 gpus[DCGM_MAX_NUM_DEVICES];
    unsigned int numNvSwitches;
    dcgmNvLinkNvSwitchLinkStatus_t nvSwitches[DCGM_MAX_NUM_SWITCHES];
} dcgmNvLinkStatus_v4;
#define dcgmNvLinkStatus_version4 MOKKA_DCGM_VERSION(dcgmNvLinkStatus_v4, 4)

typedef enum { DcgmNvLinkP2pStatusOK = 0, DcgmNvLinkP2pStatusNotSupported = 5 } dcgmNvLinkGpuP2PStatus_t;

typedef struct {
    dcgm_field_eid_t entityId;
    dcgmNvLinkGpuP2PStatus_t linkStatus[DCGM_MAX_NUM_DEVICES];
} dcgmNvLinkGpuLinkP2PStatus_v1;

typedef struct {
    unsigned int version;
    unsigned int numGpus;
    dcgmNvLinkGpuLinkP2PStatus_v1 gpus[DCGM_MAX_NUM_DEVICES];
} dcgmNvLinkP2PStatus_v1;
#define dcgmNvLinkP2PStatus_version1 MOKKA_DCGM_VERSION(dcgmNvLinkP2PStatus_v1, 1)

typedef struct {
    unsigned short majorId;
    unsigned short minorId;
    unsigned int numFieldIds;
    unsigned short fieldIds[DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2];
} dcgmProfMetricGroupInfo_v2;

typedef struct {
    unsigned int version;
    unsigned int unused;
    unsigned int gpuId;
    unsigned int numMetricGroups;
    dcgmProfMetricGroupInfo_v2 metricGroups[DCGM_PROF_MAX_NUM_GROUPS_V2];
} dcgmProfGetMetricGroups_v3;
#define dcgmProfGetMetricGroups_version3 MOKKA_DCGM_VERSION(dcgmProfGetMetricGroups_v3, 3)

/* Health. */
#define DCGM_HEALTH_WATCH_PCIE 0x1
#define DCGM_HEALTH_WATCH_NVLINK 0x2
#define DCGM_HEALTH_WATCH_PMU 0x4
#define DCGM_HEALTH_WATCH_MCU 0x8
#define DCGM_HEALTH_WATCH_MEM 0x10
#define DCGM_HEALTH_WATCH_SM 0x20
#define DCGM_HEALTH_WATCH_INFOROM 0x40
#define DCGM_HEALTH_WATCH_THERMAL 0x80
#define DCGM_HEALTH_WATCH_POWER 0x100
#define DCGM_HEALTH_WATCH_DRIVER 0x200
typedef unsigned int dcgmHealthSystems_t; /* an enum of the DCGM_HEALTH_WATCH_* bits */

typedef enum {
    DCGM_HEALTH_RESULT_PASS = 0,
    DCGM_HEALTH_RESULT_WARN = 10,
    DCGM_HEALTH_RESULT_FAIL = 20,
} dcgmHealthWatchResults_t;

typedef struct {
    char msg[1024];
    unsigned int code; /* dcgmError_t: DCGM_FR_* */
} dcgmDiagErrorDetail_t;

typedef struct {
    dcgmHealthSystems_t system;
    dcgmHealthWatchResults_t health;
    dcgmDiagErrorDetail_t error;
    dcgmGroupEntityPair_t entityInfo;
} dcgmIncidentInfo_t;

typedef struct {
    unsigned int version;
    dcgmHealthWatchResults_t overallHealth;
    unsigned int incidentCount;
    dcgmIncidentInfo_t incidents[DCGM_GROUP_MAX_ENTITIES_V2];
} dcgmHealthResponse_v5;
#define dcgmHealthResponse_version5 MOKKA_DCGM_VERSION(dcgmHealthResponse_v5, 5)

/* Health incident codes (dcgmError_t) the mock raises. */
#define DCGM_FR_PCI_REPLAY_RATE 3
#define DCGM_FR_VOLATILE_DBE_DETECTED 4
#define DCGM_FR_PENDING_PAGE_RETIREMENTS 6
#define DCGM_FR_NVLINK_ERROR_THRESHOLD 13
#define DCGM_FR_NVLINK_DOWN 14
#define DCGM_FR_TEMP_VIOLATION 42
#define DCGM_FR_ROW_REMAP_FAILURE 80
#define DCGM_FR_XID_ERROR 101
#define DCGM_FR_FALLEN_OFF_BUS 120

typedef struct {
    unsigned int version;
    char rawBuildInfoString[DCGM_MAX_STR_LENGTH * 2];
} dcgmVersionInfo_v2;
#define dcgmVersionInfo_version2 MOKKA_DCGM_VERSION(dcgmVersionInfo_v2, 2)

#endif
