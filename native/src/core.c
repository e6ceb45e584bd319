/* Library lifecycle: find and map the state file, decide which GPUs this process sees,
 * hand out device handles, answer system-wide queries. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

mokka_ctx_t g_mokka;
int g_mokka_refcount;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

_Static_assert(sizeof(mokka_header_t) % 8 == 0, "header keeps 8-byte alignment of the records");
_Static_assert(sizeof(mokka_gpu_t) % 8 == 0, "records keep 8-byte alignment");

uint32_t mokka_seq_begin(void) {
    for (unsigned spins = 0;; spins++) {
        uint32_t s = __atomic_load_n(&g_mokka.hdr->seq, __ATOMIC_ACQUIRE);
        if (!(s & 1)) return s;
        /* A writer that died mid-update must not hang readers: read as is. */
        if (spins > 100000) return MOKKA_SEQ_GAVE_UP;
        if (spins > 64) sched_yield();
    }
}

int mokka_seq_retry(uint32_t start) {
    if (start == MOKKA_SEQ_GAVE_UP) return 0;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&g_mokka.hdr->seq, __ATOMIC_RELAXED) != start;
}

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

nvmlReturn_t mokka_device(nvmlDevice_t device, const mokka_gpu_t **out) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *d = device;
    if (d < g_mokka.devices || d >= g_mokka.devices + g_mokka.visible_count ||
        ((char *)d - (char *)g_mokka.devices) % sizeof *d != 0 || d->magic != MOKKA_HANDLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (__atomic_load_n(&d->gpu->flags, __ATOMIC_RELAXED) & MOKKA_GPU_LOST) return NVML_ERROR_GPU_IS_LOST;
    *out = d->gpu;
    return NVML_SUCCESS;
}

/* ---- finding the state ------------------------------------------------------------ */

static void complain(const char *path, const char *why) {
    if (getenv("MOKKA_QUIET")) return;
    fprintf(stderr, "mokka: cannot use state file %s: %s\n", path, why);
}

static int default_state_path(char *out, size_t size) {
    Dl_info info;
    if (!dladdr((void *)&mokka_device, &info) || !info.dli_fname) return -1;
    char lib[PATH_MAX];
    if (!realpath(info.dli_fname, lib)) snprintf(lib, sizeof lib, "%s", info.dli_fname);
    char *slash = strrchr(lib, '/');
    if (!slash) return -1;
    *slash = '\0';
    return snprintf(out, size, "%s/mokka/state.bin", lib) < (int)size ? 0 : -1;
}

static nvmlReturn_t map_state(void) {
    char path[PATH_MAX];
    const char *env = getenv("MOKKA_STATE");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else if (default_state_path(path, sizeof path) != 0) {
        complain("(unknown)", "cannot locate the library's own directory; set MOKKA_STATE");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        complain(path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(mokka_header_t)) {
        close(fd);
        complain(path, "truncated (shorter than the header)");
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        complain(path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    const mokka_header_t *h = map;
    const char *why = NULL;
    if (h->magic != MOKKA_STATE_MAGIC)
        why = "not a Mokka state file (bad magic)";
    else if (h->version != MOKKA_STATE_VERSION || h->header_size != sizeof(mokka_header_t) ||
             h->gpu_size != sizeof(mokka_gpu_t))
        why = "written for another layout version; regenerate it with this Mokka";
    else if (h->gpu_count > MOKKA_MAX_GPUS ||
             (size_t)st.st_size < sizeof(mokka_header_t) + (size_t)h->gpu_count * sizeof(mokka_gpu_t))
        why = "truncated or corrupt (GPU records missing)";
    if (why) {
        munmap(map, (size_t)st.st_size);
        complain(path, why);
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    g_mokka.hdr = h;
    g_mokka.gpus = (const mokka_gpu_t *)((const char *)map + sizeof(mokka_header_t));
    g_mokka.map_size = (size_t)st.st_size;
    return NVML_SUCCESS;
}

/* ---- which GPUs this process sees ------------------------------------------------- */

static int listed(const char *list, const mokka_gpu_t *g) {
    /* NVIDIA_VISIBLE_DEVICES: "all", "none", "void", or indices / UUIDs separated by commas. */
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if (n) {
            char item[96];
            if (n >= sizeof item) n = sizeof item - 1;
            memcpy(item, p, n);
            item[n] = '\0';
            char *rest;
            unsigned long idx = strtoul(item, &rest, 10);
            if (*rest == '\0' && rest != item) {
                if (idx == g->index) return 1;
            } else if (strncmp(g->uuid, item, n) == 0) {
                return 1; /* full UUID or a unique prefix, as the runtime accepts */
            }
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static int visible(const mokka_gpu_t *g, const char *env) {
    if (!env) return 1;
    if (!*env || !strcmp(env, "none") || !strcmp(env, "void")) return 0;
    return !strcmp(env, "all") || listed(env, g);
}

static int has_node(const mokka_gpu_t *g) {
    char node[64];
    snprintf(node, sizeof node, "/dev/nvidia%u", g->minor_number);
    return access(node, F_OK) == 0;
}

static void choose_visible(void) {
    const char *env = getenv("NVIDIA_VISIBLE_DEVICES");
    /* Inside a container (as on a real node) the GPUs are those whose /dev/nvidiaN exist.
     * Where none of them exists (a bare host, a CI machine) every GPU is shown. */
    int dev_filter = 0;
    if (!getenv("MOKKA_IGNORE_DEVICE_NODES"))
        for (unsigned i = 0; i < g_mokka.hdr->gpu_count && !dev_filter; i++) dev_filter = has_node(&g_mokka.gpus[i]);
    unsigned n = 0;
    for (unsigned i = 0; i < g_mokka.hdr->gpu_count; i++) {
        const mokka_gpu_t *g = &g_mokka.gpus[i];
        if (!visible(g, env) || (dev_filter && !has_node(g))) continue;
        g_mokka.devices[n] = (struct nvmlDevice_st){MOKKA_HANDLE_MAGIC, n, g};
        n++;
    }
    g_mokka.visible_count = n;
}

/* ---- init / shutdown --------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_mokka_refcount == 0) {
        r = map_state();
        if (r == NVML_SUCCESS) choose_visible();
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
        munmap((void *)g_mokka.hdr, g_mokka.map_size);
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
    if (g_mokka.devices[index].gpu->flags & MOKKA_GPU_LOST) return NVML_ERROR_GPU_IS_LOST;
    *device = &g_mokka.devices[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Handle lookups by a key: the first visible GPU the key matches. */
typedef int (*match_fn)(const mokka_gpu_t *g, const char *key);

static nvmlReturn_t handle_by(match_fn match, const char *key, nvmlDevice_t *device) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!key || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_mokka.visible_count; i++) {
        if (match(g_mokka.devices[i].gpu, key)) {
            *device = &g_mokka.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static int uuid_is(const mokka_gpu_t *g, const char *uuid) { return strcmp(g->uuid, uuid) == 0; }
static int serial_is(const mokka_gpu_t *g, const char *serial) { return strcmp(g->serial, serial) == 0; }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return handle_by(uuid_is, uuid, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUIDV(const nvmlUUID_t *uuid, nvmlDevice_t *device) {
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
    return handle_by(bus_id_is, bus_id, &device) == NVML_SUCCESS ? device->gpu : NULL;
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
    GET_GPU(device, g);
    (void)g;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = ((struct nvmlDevice_st *)device)->visible_index;
    return NVML_SUCCESS;
}

/* ---- system ------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    return COPY_FIELD(version, length, g_mokka.hdr->driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    /* Real NVML answers this without nvmlInit, from the library itself. */
    if (g_mokka_refcount > 0) return COPY_FIELD(version, length, g_mokka.hdr->nvml_version);
    return COPY_FIELD(version, length, MOKKA_DEFAULT_NVML_VERSION);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = g_mokka_refcount > 0 ? (int)g_mokka.hdr->cuda_version : MOKKA_DEFAULT_CUDA_VERSION;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!name || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_mokka.hdr->gpu_count; i++) {
        const mokka_gpu_t *g = &g_mokka.gpus[i];
        for (unsigned p = 0; p < g->n_procs && p < MOKKA_MAX_PROCS; p++)
            if (g->procs[p].pid == pid) return COPY_FIELD(name, length, g->procs[p].name);
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
        const mokka_gpu_t *g = g_mokka.devices[i].gpu;
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
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!info || length < 8) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned major = (unsigned)atoi(g_mokka.hdr->driver_version);
    snprintf(info->branch, sizeof info->branch, "r%u_00", major);
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
