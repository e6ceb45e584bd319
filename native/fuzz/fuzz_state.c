/* libFuzzer target for the state loader: any byte string given as the state (a state file,
 * or a file ending in a trailer as a library carrying one) must make nvmlInit fail cleanly
 * or yield devices whose getters all behave. The input lives in a memfd named by
 * MOKKA_STATE=/proc/self/fd/N: nothing is written to disk. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../src/internal.h"

static int state_fd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    state_fd = memfd_create("mokka-fuzz-state", 0);
    if (state_fd < 0) {
        perror("memfd_create");
        abort();
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", state_fd);
    setenv("MOKKA_STATE", path, 1);
    setenv("MOKKA_QUIET", "1", 1);
    setenv("MOKKA_IGNORE_DEVICE_NODES", "1", 1);
    return 0;
}

/* The MIG read side: modes, profiles, placements, instances and MIG device handles, whatever
 * tables and layout the input holds (nothing here writes the state). */
static void fuzz_mig(nvmlDevice_t d) {
    unsigned cur, pend, max = 0, n;
    char buf[256];
    nvmlDeviceGetMigMode(d, &cur, &pend);
    nvmlDeviceGetMaxMigDeviceCount(d, &max);
    for (unsigned p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT + 1; p++) {
        nvmlGpuInstanceProfileInfo_v2_t info = {.version = nvmlGpuInstanceProfileInfo_v2};
        nvmlGpuInstanceProfileInfo_t v1;
        if (nvmlDeviceGetGpuInstanceProfileInfo(d, p, &v1) != NVML_SUCCESS) continue;
        nvmlDeviceGetGpuInstanceProfileInfoV(d, p, &info);
        nvmlGpuInstancePlacement_t placements[16];
        n = 16;
        nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, v1.id, placements, &n);
        nvmlDeviceGetGpuInstanceRemainingCapacity(d, v1.id, &n);
        nvmlGpuInstance_t gis[16];
        n = 16;
        if (v1.instanceCount > 16 || nvmlDeviceGetGpuInstances(d, v1.id, gis, &n) != NVML_SUCCESS) continue;
        for (unsigned k = 0; k < n && k < 16; k++) {
            nvmlGpuInstanceInfo_t gi;
            nvmlGpuInstanceGetInfo(gis[k], &gi);
            for (unsigned c = 0; c < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; c++) {
                nvmlComputeInstanceProfileInfo_t ci;
                unsigned left;
                if (nvmlGpuInstanceGetComputeInstanceProfileInfo(gis[k], c, 0, &ci) != NVML_SUCCESS) continue;
                nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gis[k], ci.id, &left);
                nvmlComputeInstance_t cis[16];
                unsigned m = 16;
                if (ci.instanceCount > 16 || nvmlGpuInstanceGetComputeInstances(gis[k], ci.id, cis, &m) != NVML_SUCCESS)
                    continue;
                for (unsigned j = 0; j < m && j < 16; j++) {
                    nvmlComputeInstanceInfo_t info2;
                    nvmlComputeInstanceGetInfo_v2(cis[j], &info2);
                }
            }
        }
    }
    for (unsigned j = 0; j < max && j < 16; j++) {
        nvmlDevice_t m;
        if (nvmlDeviceGetMigDeviceHandleByIndex(d, j, &m) != NVML_SUCCESS) continue;
        nvmlMemory_t mem;
        nvmlDeviceAttributes_t attrs;
        nvmlBAR1Memory_t bar1;
        nvmlDeviceGetName(m, buf, sizeof buf);
        nvmlDeviceGetUUID(m, buf, sizeof buf);
        nvmlDeviceGetMemoryInfo(m, &mem);
        nvmlDeviceGetAttributes_v2(m, &attrs);
        nvmlDeviceGetBAR1MemoryInfo(m, &bar1);
        nvmlDeviceGetGpuInstanceId(m, &n);
        nvmlDeviceGetComputeInstanceId(m, &n);
        nvmlDeviceGetIndex(m, &n);
        nvmlDeviceGetHandleByUUID(buf, &m);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (ftruncate(state_fd, 0) != 0 || pwrite(state_fd, data, size, 0) != (ssize_t)size) return 0;
    if (nvmlInit_v2() != NVML_SUCCESS) return 0;
    unsigned count = 0;
    nvmlDeviceGetCount_v2(&count);
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t d;
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS) continue;
        char buf[256];
        unsigned u, clocks[MOKKA_MAX_MEM_CLOCKS + 1], gfx[MOKKA_MAX_GFX_CLOCKS], n;
        unsigned long long ull;
        nvmlMemory_t mem;
        nvmlPciInfo_t pci;
        nvmlProcessInfo_t procs[32];
        nvmlFieldValue_t field = {.fieldId = NVML_FI_DEV_ECC_SBE_VOL_TOTAL};
        nvmlDeviceGetName(d, buf, sizeof buf);
        nvmlDeviceGetUUID(d, buf, sizeof buf);
        nvmlDeviceGetSerial(d, buf, sizeof buf);
        nvmlDeviceGetVbiosVersion(d, buf, sizeof buf);
        nvmlDeviceGetPciInfo_v3(d, &pci);
        nvmlDeviceGetMemoryInfo(d, &mem);
        nvmlDeviceGetPowerUsage(d, &u);
        nvmlDeviceGetTemperatureThreshold(d, (nvmlTemperatureThresholds_t)(i % 16), &u);
        n = MOKKA_MAX_MEM_CLOCKS + 1;
        nvmlDeviceGetSupportedMemoryClocks(d, &n, clocks);
        for (unsigned m = 0; m < n && m < MOKKA_MAX_MEM_CLOCKS; m++) {
            unsigned k = MOKKA_MAX_GFX_CLOCKS;
            nvmlDeviceGetSupportedGraphicsClocks(d, clocks[m], &k, gfx);
        }
        n = 32;
        nvmlDeviceGetComputeRunningProcesses_v3(d, &n, procs);
        nvmlDeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &ull);
        nvmlDeviceGetTotalEnergyConsumption(d, &ull);
        nvmlDeviceGetNvLinkState(d, i % 20, (nvmlEnableState_t *)&u);
        nvmlDeviceGetFieldValues(d, 1, &field);
        fuzz_mig(d);
    }
    nvmlSystemGetDriverVersion((char[80]){0}, 80);
    nvmlShutdown();
    return 0;
}
