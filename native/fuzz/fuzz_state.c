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
    }
    nvmlSystemGetDriverVersion((char[80]){0}, 80);
    nvmlShutdown();
    return 0;
}
