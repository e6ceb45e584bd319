/* Event sets. Registration and waiting work whole: a wait blocks for its timeout and
 * returns TIMEOUT unless the state file recorded a new XID for a registered GPU. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

struct nvmlEventSet_st {
    uint32_t magic;
    pthread_mutex_t lock;
    unsigned long long types[MOKKA_MAX_GPUS];
    uint64_t seen_xids[MOKKA_MAX_GPUS];
};

#define EVENT_SET_MAGIC 0x45564e54u

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = EVENT_SET_MAGIC;
    pthread_mutex_init(&s->lock, NULL);
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!set || set->magic != EVENT_SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    pthread_mutex_destroy(&set->lock);
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    GET_GPU(device, g);
    if (!set || set->magic != EVENT_SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long supported;
    nvmlDeviceGetSupportedEventTypes(device, &supported);
    if (types & ~supported) return NVML_ERROR_NOT_SUPPORTED;
    unsigned slot = ((struct nvmlDevice_st *)device)->visible_index;
    pthread_mutex_lock(&set->lock);
    set->types[slot] |= types;
    MOKKA_READ(g, set->seen_xids[slot] = g->xid_count);
    pthread_mutex_unlock(&set->lock);
    return NVML_SUCCESS;
}

/* nvmlEventSetWait (v1) fills this: the fields before MIG's instance ids (24 bytes). */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} event_data_v1_t;
_Static_assert(sizeof(event_data_v1_t) == offsetof(nvmlEventData_t, gpuInstanceId), "v1 is v2's prefix");

static int pending(nvmlEventSet_t set, nvmlEventData_t *data) {
    for (unsigned i = 0; i < g_mokka.visible_count; i++) {
        if (!(set->types[i] & nvmlEventTypeXidCriticalError)) continue;
        const mokka_gpu_t *g = mokka_handle_gpu(&g_mokka.devices[i]);
        uint64_t count, xid;
        MOKKA_READ(g, (count = g->xid_count, xid = g->last_xid));
        if (count == set->seen_xids[i]) continue;
        set->seen_xids[i] = count;
        memset(data, 0, sizeof *data);
        data->device = &g_mokka.devices[i];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = xid;
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        return 1;
    }
    return 0;
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&set->lock);
        int hit = pending(set, data);
        pthread_mutex_unlock(&set->lock);
        if (hit) return NVML_SUCCESS;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long elapsed = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (elapsed >= timeout_ms) return NVML_ERROR_TIMEOUT;
        long long left = timeout_ms - elapsed;
        struct timespec nap = {0, (left < 50 ? left : 50) * 1000000L};
        while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
        }
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVENT_SET_MAGIC || !data) return NVML_ERROR_INVALID_ARGUMENT;
    return wait_event(set, data, timeout_ms);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVENT_SET_MAGIC || !data) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t full;
    nvmlReturn_t r = wait_event(set, &full, timeout_ms);
    if (r == NVML_SUCCESS) memcpy(data, &full, sizeof(event_data_v1_t));
    return r;
}
