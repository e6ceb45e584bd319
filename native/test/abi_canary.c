/* ABI canaries: every versioned NVML entry point (and its unversioned legacy name) is
 * called into a buffer of exactly the size of *its* version's struct, twice: followed by
 * 64 canary bytes that must come back untouched, and ending at a PROT_NONE guard page
 * (a write, or a read, past the end kills the process). GPU 0 is expected to carry two
 * processes of each kind (compute, graphics, MPS) and to have NVLinks; event waits need
 * the harness: the program prints "bump" and waits for a line on stdin after the harness
 * recorded a new Xid on GPU 0. MIG calls run on GPU 1 (no processes: MIG mode switches at once),
 * after the program enabled MIG there and created a 3g GPU instance (profile ID 9) with a compute
 * instance: the state it runs against must be writable.
 *
 * Prints one line per call and mode: NAME SIZE MODE rc=N ok|CLOBBERED; exits 1 if any
 * canary was clobbered.   usage: abi_canary LIBNVIDIA-ML */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <dlfcn.h>
#include <nvml.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CANARY 0xA5
#define SLACK 64

static void *lib;
static nvmlDevice_t dev;
static nvmlEventSet_t events;
static nvmlDevice_t mig_gpu;
static nvmlGpuInstance_t gi;
static nvmlComputeInstance_t ci;
static int failed;
static char uuid[96], bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("%s missing\n", name);
        exit(2);
    }
    return p;
}
#define FN(name) ((__typeof__(&name))sym(#name))

typedef nvmlReturn_t (*call_fn)(void *buf);
typedef enum { CANARIES, GUARD_PAGE } mode_t_;

/* Run `call` on a buffer of `size` bytes whose first word is `version` (0: leave it). */
static void probe(const char *name, size_t size, unsigned version, call_fn call, mode_t_ mode) {
    unsigned char *buf, *map = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), maplen = 0;
    if (mode == CANARIES) {
        buf = malloc(size + SLACK);
        memset(buf, CANARY, size + SLACK);
    } else {
        maplen = ((size + page - 1) / page + 1) * page;
        map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        mprotect(map + maplen - page, page, PROT_NONE);
        buf = map + maplen - page - size;
        memset(buf, CANARY, size);
    }
    if (version) memcpy(buf, &version, sizeof version);
    fprintf(stderr, "calling %s (%zu bytes, %s)\n", name, size, mode == CANARIES ? "canaries" : "guard page");
    nvmlReturn_t rc = call(buf);
    int ok = 1;
    if (mode == CANARIES)
        for (size_t i = size; i < size + SLACK; i++) ok &= buf[i] == CANARY;
    printf("%s %zu %s rc=%d %s\n", name, size, mode == CANARIES ? "canaries" : "guard", rc, ok ? "ok" : "CLOBBERED");
    failed |= !ok;
    if (mode == CANARIES) free(buf);
    else munmap(map, maplen);
}

static void both(const char *name, size_t size, unsigned version, call_fn call) {
    probe(name, size, version, call, CANARIES);
    probe(name, size, version, call, GUARD_PAGE);
}

/* The harness records a new Xid on GPU 0 so that the next wait has an event to write. */
static void bump(void) {
    char line[16];
    printf("bump\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(3);
}

/* Deprecated entry points are exactly the ones whose old layouts need checking. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define CALL(id, expr) static nvmlReturn_t id(void *buf) { (void)buf; return (expr); }

enum { PROCS = 2 };

CALL(pci_v1, FN(nvmlDeviceGetPciInfo)(dev, buf))
CALL(pci_v2, FN(nvmlDeviceGetPciInfo_v2)(dev, buf))
CALL(pci_v3, FN(nvmlDeviceGetPciInfo_v3)(dev, buf))
CALL(pci_ext, FN(nvmlDeviceGetPciInfoExt)(dev, buf))
CALL(remote_v1, FN(nvmlDeviceGetNvLinkRemotePciInfo)(dev, 0, buf))
CALL(remote_v2, FN(nvmlDeviceGetNvLinkRemotePciInfo_v2)(dev, 0, buf))
#define PROC_CALLS(id, base)                                                                 \
    static nvmlReturn_t id##_v1(void *buf) { unsigned n = PROCS; return FN(base)(dev, &n, buf); }      \
    static nvmlReturn_t id##_v2(void *buf) { unsigned n = PROCS; return FN(base##_v2)(dev, &n, buf); } \
    static nvmlReturn_t id##_v3(void *buf) { unsigned n = PROCS; return FN(base##_v3)(dev, &n, buf); }
PROC_CALLS(compute, nvmlDeviceGetComputeRunningProcesses)
PROC_CALLS(graphics, nvmlDeviceGetGraphicsRunningProcesses)
PROC_CALLS(mps, nvmlDeviceGetMPSComputeRunningProcesses)
CALL(grid_v1, FN(nvmlDeviceGetGridLicensableFeatures)(dev, buf))
CALL(grid_v2, FN(nvmlDeviceGetGridLicensableFeatures_v2)(dev, buf))
CALL(grid_v3, FN(nvmlDeviceGetGridLicensableFeatures_v3)(dev, buf))
CALL(grid_v4, FN(nvmlDeviceGetGridLicensableFeatures_v4)(dev, buf))
CALL(memory_v1, FN(nvmlDeviceGetMemoryInfo)(dev, buf))
CALL(memory_v2, FN(nvmlDeviceGetMemoryInfo_v2)(dev, buf))
CALL(attributes_v1, FN(nvmlDeviceGetAttributes)(dev, buf))
CALL(attributes_v2, FN(nvmlDeviceGetAttributes_v2)(dev, buf))
CALL(platform, FN(nvmlDeviceGetPlatformInfo)(dev, buf))
CALL(fabric_v1, FN(nvmlDeviceGetGpuFabricInfo)(dev, buf))
CALL(fabric_v, FN(nvmlDeviceGetGpuFabricInfoV)(dev, buf))
CALL(temperature_v1, FN(nvmlDeviceGetTemperature)(dev, NVML_TEMPERATURE_GPU, buf))
static nvmlReturn_t temperature_v(void *buf) {
    ((nvmlTemperature_v1_t *)buf)->sensorType = NVML_TEMPERATURE_GPU;
    return FN(nvmlDeviceGetTemperatureV)(dev, buf);
}
CALL(c2c, FN(nvmlDeviceGetC2cModeInfoV)(dev, buf))
CALL(count_v1, FN(nvmlDeviceGetCount)(buf))
CALL(count_v2, FN(nvmlDeviceGetCount_v2)(buf))
CALL(index_v1, FN(nvmlDeviceGetHandleByIndex)(0, buf))
CALL(index_v2, FN(nvmlDeviceGetHandleByIndex_v2)(0, buf))
CALL(busid_v1, FN(nvmlDeviceGetHandleByPciBusId)(bus_id, buf))
CALL(busid_v2, FN(nvmlDeviceGetHandleByPciBusId_v2)(bus_id, buf))
CALL(by_uuid, FN(nvmlDeviceGetHandleByUUID)(uuid, buf))
static nvmlReturn_t by_uuid_v(void *buf) {
    nvmlUUID_t key = {.version = nvmlUUID_v1, .type = NVML_UUID_TYPE_ASCII};
    memcpy(key.value.str, uuid, strnlen(uuid, sizeof key.value.str - 1));
    return FN(nvmlDeviceGetHandleByUUIDV)(&key, buf);
}
CALL(cuda_v1, FN(nvmlSystemGetCudaDriverVersion)(buf))
CALL(cuda_v2, FN(nvmlSystemGetCudaDriverVersion_v2)(buf))
CALL(fan_v1, FN(nvmlDeviceGetFanSpeed)(dev, buf))
CALL(fan_v2, FN(nvmlDeviceGetFanSpeed_v2)(dev, 0, buf))
static nvmlReturn_t model_v1(void *buf) { return FN(nvmlDeviceGetDriverModel)(dev, buf, (nvmlDriverModel_t *)buf + 1); }
static nvmlReturn_t model_v2(void *buf) { return FN(nvmlDeviceGetDriverModel_v2)(dev, buf, (nvmlDriverModel_t *)buf + 1); }
static nvmlReturn_t retired_v1(void *buf) {
    unsigned n = 0;
    return FN(nvmlDeviceGetRetiredPages)(dev, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &n, buf);
}
static nvmlReturn_t retired_v2(void *buf) {
    unsigned n = 0;
    return FN(nvmlDeviceGetRetiredPages_v2)(dev, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &n, buf,
                                            (unsigned long long *)buf);
}
CALL(branch, FN(nvmlSystemGetDriverBranch)(buf, NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE))
CALL(addressing, FN(nvmlDeviceGetAddressingMode)(dev, buf))
CALL(pdi, FN(nvmlDeviceGetPdi)(dev, buf))
CALL(repair, FN(nvmlDeviceGetRepairStatus)(dev, buf))
CALL(wait_v1, FN(nvmlEventSetWait)(events, buf, 5000))
CALL(wait_v2, FN(nvmlEventSetWait_v2)(events, buf, 5000))
CALL(gi_profile_v1, FN(nvmlDeviceGetGpuInstanceProfileInfo)(mig_gpu, NVML_GPU_INSTANCE_PROFILE_3_SLICE, buf))
CALL(gi_profile_v, FN(nvmlDeviceGetGpuInstanceProfileInfoV)(mig_gpu, NVML_GPU_INSTANCE_PROFILE_3_SLICE, buf))
CALL(gi_profile_by_id, FN(nvmlDeviceGetGpuInstanceProfileInfoByIdV)(mig_gpu, 9, buf))
/* v1 wrote into a buffer sized by the profile's instance count: 1 for 1g+me (ID 20), which has
 * 7 placements; v2 writes as many as *count allows (here all 7). */
static nvmlReturn_t placements_v1(void *buf) {
    unsigned n = 1;
    return FN(nvmlDeviceGetGpuInstancePossiblePlacements)(mig_gpu, 20, buf, &n);
}
static nvmlReturn_t placements_v2(void *buf) {
    unsigned n = 7;
    return FN(nvmlDeviceGetGpuInstancePossiblePlacements_v2)(mig_gpu, 20, buf, &n);
}
CALL(ci_profile_v1, FN(nvmlGpuInstanceGetComputeInstanceProfileInfo)(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
                                                                     NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, buf))
CALL(ci_profile_v, FN(nvmlGpuInstanceGetComputeInstanceProfileInfoV)(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
                                                                      NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, buf))
CALL(ci_info_v1, FN(nvmlComputeInstanceGetInfo)(ci, buf))
CALL(ci_info_v2, FN(nvmlComputeInstanceGetInfo_v2)(ci, buf))
CALL(init_v1, FN(nvmlInit)())
CALL(init_v2, FN(nvmlInit_v2)())

/* The legacy layouts older versions fill; sizes from their NVML headers. */
enum {
    PCI_INFO_LEGACY = 52,          /* busId[16], 5 ids, 4 reserved: v1 and v2 */
    EVENT_DATA_V1 = 24,            /* device, eventType, eventData: before MIG's ids */
    CI_INFO_V1 = 24,               /* device, gpuInstance, id, profileId: before the placement */
    GRID_FEATURES_COMMON = 8,      /* isGridLicenseSupported, licensableFeaturesCount: what
                                      v1..v3 share (their feature records are smaller) */
};

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "%s\n", dlerror()), 2;
    if (FN(nvmlInit_v2)() != NVML_SUCCESS || FN(nvmlDeviceGetHandleByIndex_v2)(0, &dev) != NVML_SUCCESS) return 2;
    FN(nvmlDeviceGetUUID)(dev, uuid, sizeof uuid);
    nvmlPciInfo_t pci;
    FN(nvmlDeviceGetPciInfo_v3)(dev, &pci);
    memcpy(bus_id, pci.busId, sizeof bus_id);

    both("nvmlInit", 0, 0, init_v1);
    both("nvmlInit_v2", 0, 0, init_v2);
    both("nvmlDeviceGetPciInfo", PCI_INFO_LEGACY, 0, pci_v1);
    both("nvmlDeviceGetPciInfo_v2", PCI_INFO_LEGACY, 0, pci_v2);
    both("nvmlDeviceGetPciInfo_v3", sizeof(nvmlPciInfo_t), 0, pci_v3);
    both("nvmlDeviceGetPciInfoExt", sizeof(nvmlPciInfoExt_v1_t), nvmlPciInfoExt_v1, pci_ext);
    both("nvmlDeviceGetNvLinkRemotePciInfo", PCI_INFO_LEGACY, 0, remote_v1);
    both("nvmlDeviceGetNvLinkRemotePciInfo_v2", sizeof(nvmlPciInfo_t), 0, remote_v2);
    both("nvmlDeviceGetComputeRunningProcesses", PROCS * sizeof(nvmlProcessInfo_v1_t), 0, compute_v1);
    both("nvmlDeviceGetComputeRunningProcesses_v2", PROCS * sizeof(nvmlProcessInfo_v2_t), 0, compute_v2);
    both("nvmlDeviceGetComputeRunningProcesses_v3", PROCS * sizeof(nvmlProcessInfo_t), 0, compute_v3);
    both("nvmlDeviceGetGraphicsRunningProcesses", PROCS * sizeof(nvmlProcessInfo_v1_t), 0, graphics_v1);
    both("nvmlDeviceGetGraphicsRunningProcesses_v2", PROCS * sizeof(nvmlProcessInfo_v2_t), 0, graphics_v2);
    both("nvmlDeviceGetGraphicsRunningProcesses_v3", PROCS * sizeof(nvmlProcessInfo_t), 0, graphics_v3);
    both("nvmlDeviceGetMPSComputeRunningProcesses", PROCS * sizeof(nvmlProcessInfo_v1_t), 0, mps_v1);
    both("nvmlDeviceGetMPSComputeRunningProcesses_v2", PROCS * sizeof(nvmlProcessInfo_v2_t), 0, mps_v2);
    both("nvmlDeviceGetMPSComputeRunningProcesses_v3", PROCS * sizeof(nvmlProcessInfo_t), 0, mps_v3);
    both("nvmlDeviceGetGridLicensableFeatures", GRID_FEATURES_COMMON, 0, grid_v1);
    both("nvmlDeviceGetGridLicensableFeatures_v2", GRID_FEATURES_COMMON, 0, grid_v2);
    both("nvmlDeviceGetGridLicensableFeatures_v3", GRID_FEATURES_COMMON, 0, grid_v3);
    both("nvmlDeviceGetGridLicensableFeatures_v4", sizeof(nvmlGridLicensableFeatures_t), 0, grid_v4);
    both("nvmlDeviceGetMemoryInfo", sizeof(nvmlMemory_t), 0, memory_v1);
    both("nvmlDeviceGetMemoryInfo_v2", sizeof(nvmlMemory_v2_t), nvmlMemory_v2, memory_v2);
    both("nvmlDeviceGetAttributes", offsetof(nvmlDeviceAttributes_t, memorySizeMB), 0, attributes_v1);
    both("nvmlDeviceGetAttributes_v2", sizeof(nvmlDeviceAttributes_t), 0, attributes_v2);
    both("nvmlDeviceGetPlatformInfo(v1)", sizeof(nvmlPlatformInfo_v1_t), nvmlPlatformInfo_v1, platform);
    both("nvmlDeviceGetPlatformInfo(v2)", sizeof(nvmlPlatformInfo_v2_t), nvmlPlatformInfo_v2, platform);
    both("nvmlDeviceGetGpuFabricInfo", sizeof(nvmlGpuFabricInfo_t), 0, fabric_v1);
    both("nvmlDeviceGetGpuFabricInfoV(v2)", sizeof(nvmlGpuFabricInfo_v2_t), nvmlGpuFabricInfo_v2, fabric_v);
    both("nvmlDeviceGetGpuFabricInfoV(v3)", sizeof(nvmlGpuFabricInfo_v3_t), nvmlGpuFabricInfo_v3, fabric_v);
    both("nvmlDeviceGetTemperature", sizeof(unsigned int), 0, temperature_v1);
    both("nvmlDeviceGetTemperatureV", sizeof(nvmlTemperature_v1_t), nvmlTemperature_v1, temperature_v);
    both("nvmlDeviceGetC2cModeInfoV", sizeof(nvmlC2cModeInfo_v1_t), 0, c2c);
    both("nvmlDeviceGetCount", sizeof(unsigned int), 0, count_v1);
    both("nvmlDeviceGetCount_v2", sizeof(unsigned int), 0, count_v2);
    both("nvmlDeviceGetHandleByIndex", sizeof(nvmlDevice_t), 0, index_v1);
    both("nvmlDeviceGetHandleByIndex_v2", sizeof(nvmlDevice_t), 0, index_v2);
    both("nvmlDeviceGetHandleByPciBusId", sizeof(nvmlDevice_t), 0, busid_v1);
    both("nvmlDeviceGetHandleByPciBusId_v2", sizeof(nvmlDevice_t), 0, busid_v2);
    both("nvmlDeviceGetHandleByUUID", sizeof(nvmlDevice_t), 0, by_uuid);
    both("nvmlDeviceGetHandleByUUIDV", sizeof(nvmlDevice_t), 0, by_uuid_v);
    both("nvmlSystemGetCudaDriverVersion", sizeof(int), 0, cuda_v1);
    both("nvmlSystemGetCudaDriverVersion_v2", sizeof(int), 0, cuda_v2);
    both("nvmlDeviceGetFanSpeed", sizeof(unsigned int), 0, fan_v1);
    both("nvmlDeviceGetFanSpeed_v2", sizeof(unsigned int), 0, fan_v2);
    both("nvmlDeviceGetDriverModel", 2 * sizeof(nvmlDriverModel_t), 0, model_v1);
    both("nvmlDeviceGetDriverModel_v2", 2 * sizeof(nvmlDriverModel_t), 0, model_v2);
    both("nvmlDeviceGetRetiredPages", sizeof(unsigned long long), 0, retired_v1);
    both("nvmlDeviceGetRetiredPages_v2", sizeof(unsigned long long), 0, retired_v2);
    both("nvmlSystemGetDriverBranch", sizeof(nvmlSystemDriverBranchInfo_v1_t), nvmlSystemDriverBranchInfo_v1, branch);
    both("nvmlDeviceGetAddressingMode", sizeof(nvmlDeviceAddressingMode_v1_t), nvmlDeviceAddressingMode_v1, addressing);
    both("nvmlDeviceGetPdi", sizeof(nvmlPdi_v1_t), nvmlPdi_v1, pdi);
    both("nvmlDeviceGetRepairStatus", sizeof(nvmlRepairStatus_v1_t), nvmlRepairStatus_v1, repair);

    nvmlReturn_t activation;
    if (FN(nvmlDeviceGetHandleByIndex_v2)(1, &mig_gpu) != NVML_SUCCESS ||
        FN(nvmlDeviceSetMigMode)(mig_gpu, NVML_DEVICE_MIG_ENABLE, &activation) != NVML_SUCCESS || activation ||
        FN(nvmlDeviceCreateGpuInstance)(mig_gpu, 9, &gi) != NVML_SUCCESS ||
        FN(nvmlGpuInstanceCreateComputeInstance)(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &ci) != NVML_SUCCESS)
        return fprintf(stderr, "cannot set up a MIG instance on GPU 1\n"), 2;
    both("nvmlDeviceGetGpuInstanceProfileInfo", sizeof(nvmlGpuInstanceProfileInfo_t), 0, gi_profile_v1);
    both("nvmlDeviceGetGpuInstanceProfileInfoV(v2)", sizeof(nvmlGpuInstanceProfileInfo_v2_t),
         nvmlGpuInstanceProfileInfo_v2, gi_profile_v);
    both("nvmlDeviceGetGpuInstanceProfileInfoV(v3)", sizeof(nvmlGpuInstanceProfileInfo_v3_t),
         nvmlGpuInstanceProfileInfo_v3, gi_profile_v);
    both("nvmlDeviceGetGpuInstanceProfileInfoByIdV(v2)", sizeof(nvmlGpuInstanceProfileInfo_v2_t),
         nvmlGpuInstanceProfileInfo_v2, gi_profile_by_id);
    both("nvmlDeviceGetGpuInstanceProfileInfoByIdV(v3)", sizeof(nvmlGpuInstanceProfileInfo_v3_t),
         nvmlGpuInstanceProfileInfo_v3, gi_profile_by_id);
    both("nvmlDeviceGetGpuInstancePossiblePlacements", sizeof(nvmlGpuInstancePlacement_t), 0, placements_v1);
    both("nvmlDeviceGetGpuInstancePossiblePlacements_v2", 7 * sizeof(nvmlGpuInstancePlacement_t), 0, placements_v2);
    both("nvmlGpuInstanceGetComputeInstanceProfileInfo", sizeof(nvmlComputeInstanceProfileInfo_t), 0, ci_profile_v1);
    both("nvmlGpuInstanceGetComputeInstanceProfileInfoV(v2)", sizeof(nvmlComputeInstanceProfileInfo_v2_t),
         nvmlComputeInstanceProfileInfo_v2, ci_profile_v);
    both("nvmlGpuInstanceGetComputeInstanceProfileInfoV(v3)", sizeof(nvmlComputeInstanceProfileInfo_v3_t),
         nvmlComputeInstanceProfileInfo_v3, ci_profile_v);
    both("nvmlComputeInstanceGetInfo", CI_INFO_V1, 0, ci_info_v1);
    both("nvmlComputeInstanceGetInfo_v2", sizeof(nvmlComputeInstanceInfo_t), 0, ci_info_v2);

    if (FN(nvmlEventSetCreate)(&events) != NVML_SUCCESS ||
        FN(nvmlDeviceRegisterEvents)(dev, nvmlEventTypeXidCriticalError, events) != NVML_SUCCESS)
        return 2;
    for (mode_t_ mode = CANARIES; mode <= GUARD_PAGE; mode++) {
        bump();
        probe("nvmlEventSetWait", EVENT_DATA_V1, 0, wait_v1, mode);
        bump();
        probe("nvmlEventSetWait_v2", sizeof(nvmlEventData_t), 0, wait_v2, mode);
    }
    return failed;
}
