/* Per-device queries: name, UUID, memory, PCI location, attributes (a MIG device's own name,
 * UUID, memory and SMs; the rest its parent's). */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* A MIG device is named after its parent and its compute instance's profile, "NVIDIA
 * A100-SXM4-80GB MIG 1g.10gb" (as CUDA and PyTorch report it on real nodes). */
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    CUDA_DEVICE(dev, d, g);
    const char *text = d->is_mig ? d->name : g->name;
    size_t n = strnlen(text, d->is_mig ? sizeof d->name : sizeof g->name);
    /* Truncated to fit, as the real driver does. */
    if (n >= (size_t)len) n = (size_t)len - 1;
    memcpy(name, text, n);
    name[n] = '\0';
    return CUDA_SUCCESS;
}

static int nibble(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "GPU-8b3a...", "MIG-6d5f...": the 16 bytes behind the text form. */
static CUresult uuid_bytes(const char *text, CUuuid *uuid) {
    const char *p = text;
    if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0) p += 4;
    unsigned char out[16];
    unsigned n = 0;
    for (; *p && n < 32; p++) {
        if (*p == '-') continue;
        int v = nibble(*p);
        if (v < 0) return CUDA_ERROR_UNKNOWN;
        out[n / 2] = (unsigned char)(n % 2 ? (out[n / 2] | v) : (v << 4));
        n++;
    }
    if (n != 32) return CUDA_ERROR_UNKNOWN;
    memcpy(uuid->bytes, out, sizeof out);
    return CUDA_SUCCESS;
}

/* The first entry point answers a MIG device's parent's UUID; _v2 (CUDA 11.4) the MIG device's
 * own, "which uniquely identifies the subscribed MIG compute instance" (CUDA driver API). */
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    CUDA_GPU(dev, g);
    return uuid_bytes(g->uuid, uuid);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    CUDA_DEVICE(dev, d, g);
    return uuid_bytes(d->is_mig ? d->uuid : g->uuid, uuid);
}

EXPORT CUresult cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice dev) {
    (void)luid;
    (void)mask;
    CUDA_GPU(dev, g);
    (void)g;
    return CUDA_ERROR_NOT_SUPPORTED; /* Windows only */
}

/* A MIG device's memory is its GPU instance's (an A100-SXM4-80GB 1g.10gb: 9728 MiB). */
static uint64_t total_memory(const mokka_cuda_device_t *d, const mokka_gpu_t *g) {
    return d->is_mig ? d->memory : g->mem_total;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    CUDA_DEVICE(dev, d, g);
    *bytes = (size_t)total_memory(d, g);
    return CUDA_SUCCESS;
}

/* The CUDA 2.x entry point answers in 32 bits. */
EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    CUDA_DEVICE(dev, d, g);
    uint64_t total = total_memory(d, g);
    *bytes = total > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    CUDA_DEVICE(dev, d, g);
    return mokka_cuda_attribute(d, g, attr, value);
}

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
    CUDA_GPU(dev, g);
    *major = (int)g->cc_major;
    *minor = (int)g->cc_minor;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
    if (!bus_id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    CUDA_GPU(dev, g);
    char text[32];
    snprintf(text, sizeof text, "%04X:%02X:%02X.%X", g->pci_domain & 0xffff, g->pci_bus, g->pci_device,
             g->pci_function);
    size_t n = strlen(text);
    if (n >= (size_t)len) n = (size_t)len - 1;
    memcpy(bus_id, text, n);
    bus_id[n] = '\0';
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id) {
    if (!dev || !bus_id) return CUDA_ERROR_INVALID_VALUE;
    CUDA_NEED_INIT();
    unsigned dom, bus, device, fn = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &device, &fn) < 3) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < g_cuda.count; i++) { /* a GPU's MIG devices share its bus id: the first */
        const mokka_gpu_t *g = mokka_gpu_now(g_cuda.devices[i].slot);
        if (g->pci_domain == dom && g->pci_bus == bus && g->pci_device == device && g->pci_function == fn) {
            *dev = (CUdevice)i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}
