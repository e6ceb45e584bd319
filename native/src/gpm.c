/* GPU Performance Monitoring (GPM): Hopper and later boards (NVML's contract).
 *
 * A consumer allocates two samples, fills them with nvmlGpmSampleGet some time apart and asks
 * nvmlGpmMetricsGet for metrics over the interval between them. A sample here is a snapshot of
 * the GPU's live utilization figures (the state's util_* and PCIe throughput), taken under
 * the latch, with the time it was taken; a metric is the mean of its two snapshots' values,
 * so a live update between the samples shows up half-way, as a busy period covering half
 * an interval would. How the GPU's activity splits into the finer metrics (SM occupancy,
 * tensor and floating-point pipes) is not in the state: fixed shares of the GPU utilization
 * stand in for it, documented beside each. Boards older than Hopper answer
 * isSupportedDevice = 0 and NOT_SUPPORTED for samples. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define GPM_SAMPLE_MAGIC 0x4d50474bu /* "KGPM" */

struct nvmlGpmSample_st {
    uint32_t magic;
    uint32_t filled;     /* nvmlGpmSampleGet ran */
    uint32_t slot;       /* the GPU's record in the state */
    uint32_t util_gpu, util_memory, util_decoder, util_jpeg, util_ofa;
    uint32_t pcie_tx_kbps, pcie_rx_kbps, nvlinks;
    uint64_t taken_ns;
};

static int gpm_supported(const mokka_gpu_t *g) { return g->architecture >= NVML_DEVICE_ARCH_HOPPER; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    RELEASE_GATE();
    GET_GPU(device, g);
    if (!support) return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned)gpm_supported(g);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t device, unsigned int *state) {
    RELEASE_GATE();
    GET_GPU(device, g);
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpm_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
    *state = 0; /* no streaming: samples are taken on demand */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    RELEASE_GATE();
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = GPM_SAMPLE_MAGIC;
    *sample = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    RELEASE_GATE();
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    RELEASE_GATE();
    GET_GPU(device, g);
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpm_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
    sample->slot = ((const struct nvmlDevice_st *)device)->slot;
    MOKKA_READ(g, (sample->util_gpu = (uint32_t)mokka_metric(g, MOKKA_METRIC_UTIL_GPU),
                   sample->util_memory = (uint32_t)mokka_metric(g, MOKKA_METRIC_UTIL_MEMORY),
                   sample->util_decoder = g->util_decoder, sample->util_jpeg = g->util_jpeg,
                   sample->util_ofa = g->util_ofa, sample->pcie_tx_kbps = g->pcie_tx_kbps,
                   sample->pcie_rx_kbps = g->pcie_rx_kbps, sample->nvlinks = g->nvlink_count));
    sample->taken_ns = now_ns();
    sample->filled = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpu_instance, nvmlGpmSample_t sample) {
    RELEASE_GATE();
    GET_GPU(device, g);
    (void)gpu_instance;
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    return gpm_supported(g) ? NVML_ERROR_NOT_FOUND : NVML_ERROR_NOT_SUPPORTED; /* no GPU instances */
}

typedef struct {
    unsigned id;
    const char *short_name, *long_name, *unit;
} metric_info_t;

static const metric_info_t METRICS[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, "gr_util", "graphics utilization", "%"},
    {NVML_GPM_METRIC_SM_UTIL, "sm_util", "SM utilization", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy", "SM occupancy", "%"},
    {NVML_GPM_METRIC_INTEGER_UTIL, "integer_util", "integer utilization", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, "any_tensor_util", "tensor utilization", "%"},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "dfma_tensor_util", "DFMA tensor utilization", "%"},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "hmma_tensor_util", "HMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_DMMA_TENSOR_UTIL, "dmma_tensor_util", "DMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "imma_tensor_util", "IMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_util", "DRAM bandwidth utilization", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, "fp64_util", "FP64 utilization", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, "fp32_util", "FP32 utilization", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, "fp16_util", "FP16 utilization", "%"},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_tx", "PCIe TX", "MiB/sec"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_rx", "PCIe RX", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_rx", "NvLink RX", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_tx", "NvLink TX", "MiB/sec"},
};

static const metric_info_t *metric_info(unsigned id) {
    for (size_t i = 0; i < sizeof METRICS / sizeof *METRICS; i++)
        if (METRICS[i].id == id) return &METRICS[i];
    return NULL;
}

/* One metric from one sample; NOT_SUPPORTED for metrics the board has no engine for. */
static nvmlReturn_t metric_value(const struct nvmlGpmSample_st *s, unsigned id, double *out) {
    double gpu = s->util_gpu;
    switch (id) {
    case NVML_GPM_METRIC_GRAPHICS_UTIL:
    case NVML_GPM_METRIC_SM_UTIL: *out = gpu; return NVML_SUCCESS;
    case NVML_GPM_METRIC_SM_OCCUPANCY: *out = gpu / 2; return NVML_SUCCESS;      /* half the warps resident */
    case NVML_GPM_METRIC_ANY_TENSOR_UTIL:
    case NVML_GPM_METRIC_HMMA_TENSOR_UTIL: *out = gpu / 2; return NVML_SUCCESS;  /* half-precision tensor work */
    case NVML_GPM_METRIC_FP32_UTIL: *out = gpu / 4; return NVML_SUCCESS;
    case NVML_GPM_METRIC_INTEGER_UTIL:
    case NVML_GPM_METRIC_FP16_UTIL: *out = gpu / 10; return NVML_SUCCESS;
    case NVML_GPM_METRIC_DFMA_TENSOR_UTIL:
    case NVML_GPM_METRIC_DMMA_TENSOR_UTIL:
    case NVML_GPM_METRIC_IMMA_TENSOR_UTIL:
    case NVML_GPM_METRIC_FP64_UTIL: *out = 0; return NVML_SUCCESS;
    case NVML_GPM_METRIC_DRAM_BW_UTIL: *out = s->util_memory; return NVML_SUCCESS;
    case NVML_GPM_METRIC_PCIE_TX_PER_SEC: *out = s->pcie_tx_kbps / 1024.0; return NVML_SUCCESS;
    case NVML_GPM_METRIC_PCIE_RX_PER_SEC: *out = s->pcie_rx_kbps / 1024.0; return NVML_SUCCESS;
    case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC:
    case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC:
        if (!s->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
        *out = 0;
        return NVML_SUCCESS;
    default: break;
    }
    if (id >= NVML_GPM_METRIC_NVDEC_0_UTIL && id <= NVML_GPM_METRIC_NVDEC_7_UTIL) {
        *out = s->util_decoder;
        return NVML_SUCCESS;
    }
    if (id >= NVML_GPM_METRIC_NVJPG_0_UTIL && id <= NVML_GPM_METRIC_NVJPG_7_UTIL) {
        *out = s->util_jpeg;
        return NVML_SUCCESS;
    }
    if (id == NVML_GPM_METRIC_NVOFA_0_UTIL) {
        *out = s->util_ofa;
        return NVML_SUCCESS;
    }
    if (id >= NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC && id <= NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC) {
        if ((id - NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC) / 2 >= s->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
        *out = 0;
        return NVML_SUCCESS;
    }
    return id < NVML_GPM_METRIC_MAX ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    RELEASE_GATE();
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!get) return NVML_ERROR_INVALID_ARGUMENT;
    if (get->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct nvmlGpmSample_st *a = get->sample1, *b = get->sample2;
    if (!a || !b || a->magic != GPM_SAMPLE_MAGIC || b->magic != GPM_SAMPLE_MAGIC || !a->filled || !b->filled ||
        a->slot != b->slot || b->taken_ns <= a->taken_ns || get->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < get->numMetrics; i++) {
        nvmlGpmMetric_t *m = &get->metrics[i];
        double va = 0, vb = 0;
        m->nvmlReturn = metric_value(a, m->metricId, &va);
        if (m->nvmlReturn == NVML_SUCCESS) m->nvmlReturn = metric_value(b, m->metricId, &vb);
        m->value = m->nvmlReturn == NVML_SUCCESS ? (va + vb) / 2 : 0;
        const metric_info_t *info = metric_info(m->metricId);
        m->metricInfo.shortName = info ? (char *)info->short_name : NULL;
        m->metricInfo.longName = info ? (char *)info->long_name : NULL;
        m->metricInfo.unit = info ? (char *)info->unit : NULL;
    }
    return NVML_SUCCESS;
}
