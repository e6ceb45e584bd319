/* Prints the layout facts of DCGM's ABI that the mock libdcgm declares: sizes, offsets,
 * version words and constants, one "name value" per line. tests/test_dcgm_abi.py compiles it
 * twice, against DCGM's own headers (-DDCGM_HEADERS) and against native/dcgm/abi.h, and
 * compares the two outputs line by line. */
#include <stddef.h>
#include <stdio.h>

#ifdef DCGM_HEADERS
#include <dcgm_agent.h>
#include <dcgm_errors.h>
#else
#include "dcgm/abi.h"
#endif

#define SIZE(t) printf("sizeof(%s) %zu\n", #t, sizeof(t));
#define OFF(t, m) printf("offsetof(%s, %s) %zu\n", #t, #m, offsetof(t, m));
#define VALUE(c) printf("%s %lld\n", #c, (long long)(c));

int main(void) {
    SIZE(dcgm_field_meta_t) OFF(dcgm_field_meta_t, fieldType) OFF(dcgm_field_meta_t, size)
    OFF(dcgm_field_meta_t, tag) OFF(dcgm_field_meta_t, scope) OFF(dcgm_field_meta_t, entityLevel)
    OFF(dcgm_field_meta_t, valueFormat)
    SIZE(dcgmConnectV2Params_v2) SIZE(dcgmGroupEntityPair_t)
    SIZE(dcgmGroupInfo_v3) OFF(dcgmGroupInfo_v3, entityList) VALUE(dcgmGroupInfo_version3)
    SIZE(dcgmMigEntityInfo_t) SIZE(dcgmMigHierarchyInfo_v2) OFF(dcgmMigHierarchyInfo_v2, info)
    SIZE(dcgmMigHierarchy_v2) VALUE(dcgmMigHierarchy_version2)
    SIZE(dcgmCpuHierarchy_v1) VALUE(dcgmCpuHierarchy_version1)
    SIZE(dcgmClockSet_v1) SIZE(dcgmDeviceSupportedClockSets_v1) SIZE(dcgmDeviceThermals_v1)
    SIZE(dcgmDevicePowerLimits_v1) SIZE(dcgmDeviceIdentifiers_v1) SIZE(dcgmDeviceMemoryUsage_v1)
    SIZE(dcgmDeviceSettings_v2) VALUE(dcgmClockSet_version1) VALUE(dcgmDeviceSupportedClockSets_version1)
    VALUE(dcgmDeviceThermals_version1) VALUE(dcgmDevicePowerLimits_version1)
    VALUE(dcgmDeviceIdentifiers_version1) VALUE(dcgmDeviceMemoryUsage_version1) VALUE(dcgmDeviceSettings_version2)
    SIZE(dcgmDeviceAttributes_v3) VALUE(dcgmDeviceAttributes_version3)
    OFF(dcgmDeviceAttributes_v3, thermalSettings) OFF(dcgmDeviceAttributes_v3, powerLimits)
    OFF(dcgmDeviceAttributes_v3, identifiers) OFF(dcgmDeviceAttributes_v3, memoryUsage)
    OFF(dcgmDeviceAttributes_v3, settings) OFF(dcgmDeviceIdentifiers_v1, pciDeviceId)
    OFF(dcgmDeviceIdentifiers_v1, driverVersion) OFF(dcgmDeviceIdentifiers_v1, virtualizationMode)
    SIZE(dcgmFieldValue_v1) OFF(dcgmFieldValue_v1, status) OFF(dcgmFieldValue_v1, ts) OFF(dcgmFieldValue_v1, value)
    VALUE(dcgmFieldValue_version1)
    SIZE(dcgmFieldValue_v2) OFF(dcgmFieldValue_v2, entityId) OFF(dcgmFieldValue_v2, fieldId)
    OFF(dcgmFieldValue_v2, status) OFF(dcgmFieldValue_v2, ts) OFF(dcgmFieldValue_v2, value)
    VALUE(dcgmFieldValue_version2)
    SIZE(dcgmDeviceTopology_v1) OFF(dcgmDeviceTopology_v1, numGpus) OFF(dcgmDeviceTopology_v1, gpuPaths)
    VALUE(dcgmDeviceTopology_version1)
    SIZE(dcgmNvLinkStatus_v4) OFF(dcgmNvLinkStatus_v4, numNvSwitches) OFF(dcgmNvLinkStatus_v4, nvSwitches)
    VALUE(dcgmNvLinkStatus_version4)
    SIZE(dcgmNvLinkP2PStatus_v1) VALUE(dcgmNvLinkP2PStatus_version1)
    SIZE(dcgmProfMetricGroupInfo_v2) SIZE(dcgmProfGetMetricGroups_v3) OFF(dcgmProfGetMetricGroups_v3, metricGroups)
    VALUE(dcgmProfGetMetricGroups_version3)
    SIZE(dcgmDiagErrorDetail_t) SIZE(dcgmIncidentInfo_t) SIZE(dcgmHealthResponse_v5)
    OFF(dcgmHealthResponse_v5, incidents) VALUE(dcgmHealthResponse_version5)
    SIZE(dcgmVersionInfo_v2) VALUE(dcgmVersionInfo_version2)
    VALUE(DCGM_ST_OK) VALUE(DCGM_ST_BADPARAM) VALUE(DCGM_ST_GENERIC_ERROR) VALUE(DCGM_ST_MEMORY)
    VALUE(DCGM_ST_NOT_CONFIGURED) VALUE(DCGM_ST_NOT_SUPPORTED) VALUE(DCGM_ST_INIT_ERROR) VALUE(DCGM_ST_NVML_ERROR)
    VALUE(DCGM_ST_UNINITIALIZED) VALUE(DCGM_ST_VER_MISMATCH) VALUE(DCGM_ST_UNKNOWN_FIELD) VALUE(DCGM_ST_NO_DATA)
    VALUE(DCGM_ST_STALE_DATA) VALUE(DCGM_ST_NOT_WATCHED) VALUE(DCGM_ST_NO_PERMISSION) VALUE(DCGM_ST_GPU_IS_LOST)
    VALUE(DCGM_ST_CONNECTION_NOT_VALID) VALUE(DCGM_ST_GPU_NOT_SUPPORTED) VALUE(DCGM_ST_MAX_LIMIT)
    VALUE(DCGM_ST_PROFILING_NOT_SUPPORTED)
    VALUE(DCGM_MAX_NUM_DEVICES) VALUE(DCGM_MAX_STR_LENGTH) VALUE(DCGM_MAX_BLOB_LENGTH) VALUE(DCGM_GROUP_ALL_GPUS)
    VALUE(DCGM_GROUP_ALL_ENTITIES) VALUE(DCGM_INT32_BLANK) VALUE(DCGM_INT64_BLANK) VALUE(DCGM_FP64_BLANK)
    VALUE(DCGM_FE_GPU) VALUE(DCGM_FE_GPU_I) VALUE(DCGM_FE_GPU_CI) VALUE(DCGM_FE_LINK) VALUE(DCGM_FE_COUNT)
    VALUE(DCGM_OPERATION_MODE_AUTO) VALUE(DCGM_GROUP_DEFAULT_EVERYTHING) VALUE(DcgmEntityStatusLost)
    VALUE(DcgmNvLinkLinkStateUp) VALUE(DcgmNvLinkP2pStatusNotSupported) VALUE(DCGM_TOPOLOGY_NVLINK1)
    VALUE(DCGM_TOPOLOGY_SYSTEM) VALUE(DCGM_HEALTH_WATCH_DRIVER) VALUE(DCGM_HEALTH_RESULT_FAIL)
    VALUE(DCGM_FR_XID_ERROR) VALUE(DCGM_FR_FALLEN_OFF_BUS) VALUE(DCGM_FR_NVLINK_DOWN) VALUE(DCGM_FR_ROW_REMAP_FAILURE)
    VALUE(DCGM_FR_VOLATILE_DBE_DETECTED) VALUE(DCGM_FR_PENDING_PAGE_RETIREMENTS) VALUE(DCGM_FR_TEMP_VIOLATION)
    VALUE(DCGM_FR_NVLINK_ERROR_THRESHOLD) VALUE(DCGM_FR_PCI_REPLAY_RATE)
    return 0;
}
