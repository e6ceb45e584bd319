/* nvmlDeviceGetCapabilities (NVML 555 and later): optional device features as a mask. The
 * only capability defined, extended GPU memory (EGM, NVML_DEV_CAP_EGM), is off on every board
 * captured (nvidia-smi 555+ prints "capabilities/egm: disabled"); a real H200 answers
 * capMask 0 (tests/captures/h200/nvml-dump.json). */
#include "internal.h"

EXPORT nvmlReturn_t nvmlDeviceGetCapabilities(nvmlDevice_t device, nvmlDeviceCapabilities_t *caps) {
    RELEASE_GATE();
    GET_GPU(device, g);
    (void)g;
    if (!caps) return NVML_ERROR_INVALID_ARGUMENT;
    if (caps->version != nvmlDeviceCapabilities_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    caps->capMask = 0;
    return NVML_SUCCESS;
}
