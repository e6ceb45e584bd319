/* Thermal margins: how far a GPU runs below its maximum operating temperature (T.Limit).
 * nvidia-smi reads it through its private table (private.c, slot 0x780), newer consumers
 * through nvmlDeviceGetMarginTemperature; the T.Limit thresholds are field values (fields.c).
 * Real Ada, Hopper and Blackwell boards report it, older ones do not (MOKKA_GPU_TLIMIT). */
#include "internal.h"

nvmlReturn_t mokka_tlimit_margin(const mokka_gpu_t *g, int *degrees) {
    uint32_t max, now;
    MOKKA_READ(g, (max = g->thresholds[NVML_TEMPERATURE_THRESHOLD_GPU_MAX], now = (uint32_t)mokka_metric(g, MOKKA_METRIC_TEMP_GPU)));
    if (!(g->flags & MOKKA_GPU_TLIMIT) || mokka_is_na(max)) return NVML_ERROR_NOT_SUPPORTED;
    *degrees = (int)max - (int)now;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t device, nvmlMarginTemperature_t *margin) {
    RELEASE_GATE();
    GET_GPU(device, g);
    if (!margin) return NVML_ERROR_INVALID_ARGUMENT;
    if (margin->version != nvmlMarginTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return mokka_tlimit_margin(g, &margin->marginTemperature);
}
