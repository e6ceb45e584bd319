/* SRAM ECC error status (MOKKA_GPU_SRAM_STATUS: Ampere and later unless the profile says
 * otherwise, ECC on): the counts behind nvidia-smi's
 * "SRAM Correctable / Uncorrectable Parity / Uncorrectable SEC-DED", "SRAM Threshold
 * Exceeded" and "Aggregate Uncorrectable SRAM Sources" lines. Older boards answer
 * NOT_SUPPORTED, and nvidia-smi then prints the plain SRAM Correctable/Uncorrectable
 * pair from the per-location counters instead (as a real T4 does, and as captures of
 * Ampere boards under drivers 515 and 535.54 show). The counts come from
 * the SRAM location of the state's ECC counters: uncorrectable ones are reported as
 * SEC-DED (not parity) and attributed to "Other", as the state keeps no finer split. */
#include <string.h>

#include "internal.h"

enum { LOC_SRAM = NVML_MEMORY_LOCATION_SRAM };

EXPORT nvmlReturn_t nvmlDeviceGetSramEccErrorStatus(nvmlDevice_t device, nvmlEccSramErrorStatus_t *status) {
    RELEASE_GATE();
    GET_GPU(device, g);
    if (!status) return NVML_ERROR_INVALID_ARGUMENT;
    if (status->version != nvmlEccSramErrorStatus_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!(g->flags & MOKKA_GPU_SRAM_STATUS) || mokka_is_na(g->ecc_current) || !g->ecc_current)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long vc, vu, ac, au;
    MOKKA_READ(g, (vc = g->ecc_counts[0][0][LOC_SRAM], vu = g->ecc_counts[1][0][LOC_SRAM],
                   ac = g->ecc_counts[0][1][LOC_SRAM], au = g->ecc_counts[1][1][LOC_SRAM]));
    memset(status, 0, sizeof *status);
    status->version = nvmlEccSramErrorStatus_v1;
    status->volatileCor = vc;
    status->volatileUncSecDed = vu;
    status->aggregateCor = ac;
    status->aggregateUncSecDed = au;
    status->aggregateUncBucketOther = au;
    status->bThresholdExceeded = 0;
    return NVML_SUCCESS;
}
