/* libFuzzer target for the state loader: any byte string written as the state file
 * must make nvmlInit fail cleanly or yield devices whose getters all behave. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/internal.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(path, sizeof path, "/tmp/mokka-fuzz-%d.bin", (int)getpid());
    setenv("MOKKA_STATE", path, 1);
    setenv("MOKKA_QUIET", "1", 1);
    setenv("MOKKA_IGNORE_DEVICE_NODES", "1", 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
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
    }
    nvmlSystemGetDriverVersion((char[80]){0}, 80);
    nvmlShutdown();
    return 0;
}
