/* cuDeviceGetAttribute: what the record says (compute capability, SM count, clocks, PCI
 * location, ECC, compute mode...) and the per-compute-capability limits of NVIDIA's CUDA
 * Programming Guide ("Technical Specifications per Compute Capability"). Attributes this
 * mock does not model answer CUDA_ERROR_INVALID_VALUE rather than an invented number. */
#include "internal.h"

typedef struct {
    unsigned cc;                 /* major * 10 + minor */
    int threads_per_sm, blocks_per_sm, smem_per_sm_kib, smem_optin_kib;
} cc_limits_t;

static const cc_limits_t LIMITS[] = {
    {75, 1024, 16, 64, 64},   {80, 2048, 32, 164, 163}, {86, 1536, 16, 100, 99}, {87, 2048, 16, 164, 163},
    {89, 1536, 24, 100, 99},  {90, 2048, 32, 228, 227}, {100, 2048, 32, 228, 227}, {103, 2048, 32, 228, 227},
    {120, 1536, 32, 100, 99},
};

static const cc_limits_t *limits(const mokka_gpu_t *g) {
    unsigned cc = g->cc_major * 10 + g->cc_minor;
    const cc_limits_t *best = &LIMITS[0];
    for (unsigned i = 0; i < sizeof LIMITS / sizeof *LIMITS; i++)
        if (LIMITS[i].cc <= cc) best = &LIMITS[i]; /* a newer minor than the table knows: its major's */
    return best;
}

enum { CLOCK_SM = 1, CLOCK_MEM = 2 }; /* the record's clock tables, indexed as nvmlClockType_t */

static int khz(uint32_t mhz) { return mokka_is_na(mhz) || mhz == (uint32_t)MOKKA_DEPRECATED ? 0 : (int)(mhz * 1000); }

CUresult mokka_cuda_attribute(const mokka_cuda_device_t *d, const mokka_gpu_t *g, CUdevice_attribute attr, int *out) {
    const cc_limits_t *cc = limits(g);
    int v;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = (int)g->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = (int)g->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: /* a MIG device: its compute instance's */
        v = (int)(d->is_mig ? d->multiprocessors : g->multiprocessor_count);
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = (int)g->pci_bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = (int)g->pci_device; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = (int)g->pci_domain; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = khz(g->clock_max[CLOCK_SM]); break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = khz(g->clock_max[CLOCK_MEM]); break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = mokka_is_na(g->memory_bus_width) ? 0 : (int)g->memory_bus_width; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = g->ecc_current == 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = (int)g->compute_mode; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = (g->flags & MOKKA_GPU_MULTI_GPU_BOARD) != 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: v = (int)g->board_id; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: v = g->c2c_mode == 1; break; /* coherent C2C boards */
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = cc->threads_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = cc->blocks_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = cc->smem_per_sm_kib * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = cc->smem_optin_kib * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 48 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 64 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    *out = v;
    return CUDA_SUCCESS;
}
