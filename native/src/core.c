/* Library lifecycle: map the state (common/locate.c), decide which GPUs this process sees
 * (common/visible.c), hand out device handles, answer system-wide queries. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

mokka_ctx_t g_mokka;
int g_mokka_refcount;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

nvmlReturn_t mokka_copy_string(char *dst, unsigned int length, const char *src, size_t src_size) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strnlen(src, src_size);
    if (n == src_size) return NVML_ERROR_UNKNOWN; /* unterminated: a corrupt record */
    if (n == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (length < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return NVML_SUCCESS;
}

static void choose_visible(void) {
    unsigned slots[MOKKA_MAX_GPUS];
    unsigned n = mokka_visible_slots(slots);
    for (unsigned i = 0; i < n; i++) g_mokka.devices[i] = (struct nvmlDevice_st){MOKKA_HANDLE_MAGIC, i, slots[i], 0};
    g_mokka.visible_count = n;
    mokka_mig_reset();
}

/* ---- init / shutdown --------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_mokka_refcount == 0) {
        char self[PATH_MAX];
        int found = mokka_library_file((const void *)&nvmlInitWithFlags, self, sizeof self) == 0;
        switch (mokka_map_state(found ? self : NULL)) {
        case MOKKA_MAP_OK: choose_visible(); break;
        case MOKKA_MAP_MISSING: r = NVML_ERROR_DRIVER_NOT_LOADED; break;
        default: r = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
        }
    }
    if (r == NVML_SUCCESS) g_mokka_refcount++;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_mokka_refcount <= 0) {
        r = NVML_ERROR_UNINITIALIZED;
    } else if (--g_mokka_refcount == 0) {
        mokka_unmap_state();
        memset(&g_mokka, 0, sizeof g_mokka);
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ---- device enumeration ------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_mokka.visible_count;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_mokka.visible_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (mokka_handle_gpu(&g_mokka.devices[index])->flags & MOKKA_GPU_LOST) return NVML_ERROR_GPU_IS_LOST;
    *device = &g_mokka.devices[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Handle lookups by a key: the first visible GPU the key matches. A lost GPU has no new
 * handles to give (GPU_IS_LOST), as nvmlDeviceGetHandleByIndex. */
typedef int (*match_fn)(const mokka_gpu_t *g, const char *key);

static nvmlReturn_t find_by(match_fn match, const char *key, nvmlDevice_t *device, int allow_lost) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!key || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_mokka.visible_count; i++) {
        const mokka_gpu_t *g = mokka_handle_gpu(&g_mokka.devices[i]);
        if (match(g, key)) {
            if (!allow_lost && (__atomic_load_n(&g->flags, __ATOMIC_RELAXED) & MOKKA_GPU_LOST))
                return NVML_ERROR_GPU_IS_LOST;
            *device = &g_mokka.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t handle_by(match_fn match, const char *key, nvmlDevice_t *device) {
    return find_by(match, key, device, 0);
}

static int uuid_is(const mokka_gpu_t *g, const char *uuid) { return strcmp(g->uuid, uuid) == 0; }
static int serial_is(const mokka_gpu_t *g, const char *serial) { return strcmp(g->serial, serial) == 0; }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t r = handle_by(uuid_is, uuid, device);
    return r == NVML_ERROR_NOT_FOUND ? mokka_mig_handle_by_uuid(uuid, device) : r;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUIDV(const nvmlUUID_t *uuid, nvmlDevice_t *device) {
    RELEASE_GATE();
    if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (uuid->type != NVML_UUID_TYPE_ASCII) return NVML_ERROR_NOT_FOUND;
    return nvmlDeviceGetHandleByUUID(uuid->value.str, device);
}

static int bus_id_is(const mokka_gpu_t *g, const char *bus_id) {
    /* Accept 4- or 8-digit domains and any case: compare the parsed numbers. */
    unsigned dom, bus, dev, fn;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return 0;
    return g->pci_domain == dom && g->pci_bus == bus && g->pci_device == dev && g->pci_function == fn;
}

const mokka_gpu_t *mokka_gpu_by_bus_id(const char *bus_id) {
    nvmlDevice_t device;
    return find_by(bus_id_is, bus_id, &device, 1) == NVML_SUCCESS ? mokka_handle_gpu(device) : NULL;
}

int mokka_pci_place(const char *bus_id, uint32_t *numa_node, uint32_t *pcie_switch) {
    const mokka_gpu_t *g = mokka_gpu_by_bus_id(bus_id);
    if (g) {
        /* A GPU on a C2C link (Grace: GB200, GB300) is not on the CPU's PCIe at all: a node of its
         * own, so every PCI function reads SYS from it, as nvidia-smi shows on those trays. */
        *numa_node = g->c2c_mode == 1 ? 0x80000000u | (g->pci_domain << 8) | g->pci_bus
                                      : mokka_is_na(g->numa_node) ? 0 : g->numa_node;
        *pcie_switch = g->pcie_switch;
        return 1;
    }
    unsigned dom, bus, dev, fn;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return 0;
    uint32_t pci = (dom << 16) | (bus << 8) | (dev << 3) | fn;
    const mokka_header_t *h = g_state.hdr;
    for (uint32_t i = 0; i < h->nic_count && i < MOKKA_MAX_NICS; i++) {
        if (h->nics[i].pci != pci) continue;
        *numa_node = mokka_is_na(h->nics[i].numa_node) ? 0 : h->nics[i].numa_node;
        *pcie_switch = h->nics[i].pcie_switch;
        return 1;
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    return handle_by(bus_id_is, bus_id, device);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    return handle_by(serial_is, serial, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    MIG_ANSWERS(device, mokka_mig_index(device, index));
    GET_GPU_IDENTITY(device, g);
    (void)g;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = ((struct nvmlDevice_st *)device)->visible_index;
    return NVML_SUCCESS;
}

/* ---- system ------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    return COPY_FIELD(version, length, g_state.hdr->driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    /* Real NVML answers this without nvmlInit, from the library itself. */
    if (g_mokka_refcount > 0) return COPY_FIELD(version, length, g_state.hdr->nvml_version);
    return COPY_FIELD(version, length, MOKKA_DEFAULT_NVML_VERSION);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = g_mokka_refcount > 0 ? (int)g_state.hdr->cuda_version : MOKKA_DEFAULT_CUDA_VERSION;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!name || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_state.hdr->gpu_count; i++) {
        mokka_process_t procs[MOKKA_MAX_PROCS];
        for (unsigned type = 0; type < 3; type++) {
            unsigned n = mokka_processes(mokka_gpu_now(i), type, procs);
            for (unsigned p = 0; p < n; p++)
                if (procs[p].pid == pid) return COPY_FIELD(name, length, procs[p].name);
        }
    }
    char path[64], buf[PATH_MAX];
    snprintf(path, sizeof path, "/proc/%u/exe", pid);
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n <= 0) return NVML_ERROR_NOT_FOUND;
    buf[n] = '\0';
    return mokka_copy_string(name, length, buf, sizeof buf);
}

EXPORT nvmlReturn_t nvmlSystemGetHicVersion(unsigned int *count, nvmlHwbcEntry_t *entries) {
    (void)entries;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlUnitGetCount(unsigned int *count) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGetExcludedDeviceCount(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGetBlacklistDeviceCount(unsigned int *count) { return nvmlGetExcludedDeviceCount(count); }

EXPORT nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpu, unsigned int *count, nvmlDevice_t *devices) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned i = 0; i < g_mokka.visible_count; i++) {
        const mokka_gpu_t *g = mokka_handle_gpu(&g_mokka.devices[i]);
        if (cpu >= 64 * MOKKA_CPUSET_WORDS || !(g->cpu_affinity[cpu / 64] >> (cpu % 64) & 1)) continue;
        if (devices && *count > n) devices[n] = &g_mokka.devices[i];
        n++;
    }
    if (devices && *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverBranch(nvmlSystemDriverBranchInfo_t *info, unsigned int length) {
    RELEASE_GATE();
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!info || length < 8) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned major = (unsigned)atoi(g_state.hdr->driver_version);
    size_t room = length < sizeof info->branch ? length : sizeof info->branch;
    snprintf(info->branch, room, "r%u_00", major);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetConfComputeState(nvmlConfComputeSystemState_t *state) {
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    memset(state, 0, sizeof *state);
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "Not supported when ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}
