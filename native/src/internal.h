/* Internal declarations shared by the mock NVML library's translation units. */
#ifndef MOKKA_INTERNAL_H
#define MOKKA_INTERNAL_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/state_read.h"

#define EXPORT __attribute__((visibility("default")))
#define MOKKA_HANDLE_MAGIC 0x4d4f4b41u
#define MOKKA_MIG_HANDLE_MAGIC 0x4d4f4b4du

#ifndef MOKKA_DEFAULT_NVML_VERSION
#define MOKKA_DEFAULT_NVML_VERSION "12.550.163.01"
#endif
#ifndef MOKKA_DEFAULT_CUDA_VERSION
#define MOKKA_DEFAULT_CUDA_VERSION 12040
#endif

struct nvmlDevice_st {
    uint32_t magic;
    uint32_t visible_index;      /* index as this process sees it */
    uint32_t slot;               /* the GPU's record in the state */
    uint32_t pad;
};

typedef struct {
    unsigned visible_count;
    struct nvmlDevice_st devices[MOKKA_MAX_GPUS];
} mokka_ctx_t;

extern mokka_ctx_t g_mokka;
extern int g_mokka_refcount;

/* MIG device handles (native/src/mig.c): one per (GPU as this process numbers it, GI id, CI
 * id), carrying the parent's slot, so getters that are not MIG-specific answer for the parent. */
extern struct nvmlDevice_st g_mokka_mig_devices[MOKKA_MAX_GPUS][MOKKA_MIG_MAX_GI_ID + 1][MOKKA_MIG_MAX_CI_ID + 1];

static inline int mokka_is_mig_handle(const void *device) {
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)g_mokka_mig_devices;
    return p >= base && p - base < sizeof g_mokka_mig_devices;
}
/* The parent of a MIG device handle this process may use (NULL: stale, invisible or not one). */
const struct nvmlDevice_st *mokka_mig_parent(const void *handle);
/* Set up MIG handles and which MIG devices this process sees (from nvmlInit). */
void mokka_mig_reset(void);
/* What MIG device handles answer themselves; the getters in device.c and core.c defer to these. */
nvmlReturn_t mokka_mig_name(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t mokka_mig_uuid_of(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t mokka_mig_index(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t mokka_mig_memory(nvmlDevice_t device, uint64_t *total, uint64_t *used);
nvmlReturn_t mokka_mig_bar1(nvmlDevice_t device, nvmlBAR1Memory_t *bar1);
nvmlReturn_t mokka_mig_attributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes, size_t size);
nvmlReturn_t mokka_mig_handle_by_uuid(const char *uuid, nvmlDevice_t *device);
/* MIG on: queries NVIDIA documents as unsupported on MIG-enabled GPUs (utilization) say so. */
static inline int mokka_mig_enabled(const mokka_gpu_t *g) {
    return (g->flags & MOKKA_GPU_MIG_CAPABLE) && __atomic_load_n(&g->mig_current, __ATOMIC_RELAXED) == 1;
}
#define MIG_ANSWERS(device, call)                       \
    do {                                                \
        if (mokka_is_mig_handle(device)) return (call); \
    } while (0)

/* The record behind a handle, in the copy readers use now. */
static inline const mokka_gpu_t *mokka_handle_gpu(const struct nvmlDevice_st *d) { return mokka_gpu_now(d->slot); }

/* Validate an nvmlDevice_t and fetch its record; returns from the caller on error.
 * `identity`: the call only reads what NVML knows of a GPU without touching it (UUID, PCI
 * location, minor number, index), which a handle obtained before the GPU was lost still
 * answers, so that a consumer can tell which GPU an Xid 79 event came from (the README's
 * "Lost GPUs" says why). Every other call on a lost GPU answers GPU_IS_LOST. */
static inline nvmlReturn_t mokka_device_check(nvmlDevice_t device, const mokka_gpu_t **out, int identity) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    const struct nvmlDevice_st *d = device;
    if (d < g_mokka.devices || d >= g_mokka.devices + g_mokka.visible_count ||
        ((uintptr_t)d - (uintptr_t)g_mokka.devices) % sizeof *d != 0 || d->magic != MOKKA_HANDLE_MAGIC) {
        d = mokka_is_mig_handle(d) ? mokka_mig_parent(d) : NULL; /* a MIG device: its parent */
        if (!d) return NVML_ERROR_INVALID_ARGUMENT;
    }
    const mokka_gpu_t *g = mokka_handle_gpu(d);
    if (!identity && (__atomic_load_n(&g->flags, __ATOMIC_RELAXED) & MOKKA_GPU_LOST)) return NVML_ERROR_GPU_IS_LOST;
    *out = g;
    return NVML_SUCCESS;
}
static inline nvmlReturn_t mokka_device(nvmlDevice_t device, const mokka_gpu_t **out) {
    return mokka_device_check(device, out, 0);
}
#define GET_GPU_CHECKED(device, g, identity)                       \
    const mokka_gpu_t *g;                                          \
    do {                                                           \
        nvmlReturn_t r_ = mokka_device_check((device), &g, (identity)); \
        if (r_ != NVML_SUCCESS) return r_;                         \
    } while (0)
#define GET_GPU(device, g) GET_GPU_CHECKED(device, g, 0)
/* For the identity calls a lost GPU's existing handle still answers. */
#define GET_GPU_IDENTITY(device, g) GET_GPU_CHECKED(device, g, 1)

uint64_t mokka_energy_mj(const mokka_gpu_t *g);
/* The visible GPU at a PCI bus id (4- or 8-digit domain), or NULL. */
const mokka_gpu_t *mokka_gpu_by_bus_id(const char *bus_id);
/* The NUMA node and PCIe switch of a GPU or an InfiniBand adapter by bus id; 0: no such function. */
int mokka_pci_place(const char *bus_id, uint32_t *numa_node, uint32_t *pcie_switch);
/* The GPU's processes of one type (0 compute, 1 graphics, 2 MPS), copied under the seqlock. */
unsigned mokka_processes(const mokka_gpu_t *g, unsigned type, mokka_process_t out[MOKKA_MAX_PROCS]);
/* Time-varying metrics (dynamic.c): read under the latch, like any field of the record. */
uint64_t mokka_wall_ms(void);
uint64_t mokka_metric(const mokka_gpu_t *g, unsigned metric); /* MOKKA_METRIC_*, now */
/* ..._at(t_ms, past): past = 1 for a sample's time (an override applies from its start on),
 * 0 for the present (an override applies at once). */
uint64_t mokka_metric_at(const mokka_gpu_t *g, unsigned metric, uint64_t t_ms, int past);
uint32_t mokka_clock_at(const mokka_gpu_t *g, unsigned domain, uint64_t t_ms, int past); /* a domain's current clock */
unsigned long long mokka_event_reasons_at(const mokka_gpu_t *g, uint64_t t_ms, int past);
nvmlReturn_t mokka_copy_string(char *dst, unsigned int length, const char *src, size_t src_size);
/* The GPU's T.Limit margin: degrees below its maximum operating temperature (thermal.c). */
nvmlReturn_t mokka_tlimit_margin(const mokka_gpu_t *g, int *degrees);

/* Whether the library of the driver release the state reports exports `name` (release.c):
 * functions newer than that release answer as its library would, by not being there. */
int mokka_release_exports(const char *name);
#define RELEASE_GATE()                                                                   \
    do {                                                                                 \
        if (!mokka_release_exports(__func__)) return NVML_ERROR_FUNCTION_NOT_FOUND;      \
    } while (0)
#define COPY_FIELD(dst, length, field) mokka_copy_string((dst), (length), (field), sizeof(field))

#endif
