/* Event sets. Each GPU's record keeps its recent events in a ring (mokka_events_t); an event
 * set remembers, per registered GPU, how many of them it has consumed, so every event raised
 * after nvmlDeviceRegisterEvents is delivered once, in the order it was raised on the node,
 * and quick successive Xids each arrive (a set that falls more than MOKKA_EVENT_RING events
 * behind on a GPU loses the oldest, as a driver's event buffer would).
 *
 * nvmlEventSetWait sleeps without polling: in FUTEX_WAIT on the state's latch counter, which
 * every publish changes and then wakes (native/writer/). The futex is shared: its key is the
 * file's page, so writers in other processes, containers included, wake it. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

struct nvmlEventSet_st {
    uint32_t magic;
    pthread_mutex_t lock;
    unsigned long long types[MOKKA_MAX_GPUS]; /* by visible index */
    uint64_t consumed[MOKKA_MAX_GPUS];        /* events of that GPU delivered or passed over */
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
    if (!set->types[slot]) MOKKA_READ(g, set->consumed[slot] = g->events.count); /* from now on */
    set->types[slot] |= types;
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

/* The first event of GPU `i` the set wants and has not consumed: its number (1-based) in
 * *number and a copy in *out; 0 when there is none. Events it does not want are passed over. */
static int next_wanted(nvmlEventSet_t set, unsigned i, uint64_t *number, mokka_event_t *out) {
    const mokka_gpu_t *g = mokka_handle_gpu(&g_mokka.devices[i]);
    int found = 0;
    uint64_t n = 0;
    MOKKA_READ(g, {
        uint64_t count = g->events.count;
        n = set->consumed[i];
        if (n > count) n = count; /* the state was compiled afresh (host setup re-run): start over */
        if (count > MOKKA_EVENT_RING && n < count - MOKKA_EVENT_RING) n = count - MOKKA_EVENT_RING;
        found = 0;
        for (; n < count; n++) {
            const mokka_event_t *e = &g->events.ring[n % MOKKA_EVENT_RING];
            if (e->type & set->types[i]) {
                *out = *e;
                found = 1;
                break;
            }
        }
    });
    if (!found) set->consumed[i] = n; /* everything up to now was passed over */
    *number = n + 1;
    return found;
}

/* Take the oldest pending event among the set's GPUs, if any. The caller holds the lock. */
static int take_pending(nvmlEventSet_t set, nvmlEventData_t *data) {
    int best = -1;
    uint64_t best_number = 0;
    mokka_event_t best_event = {0}, e;
    for (unsigned i = 0; i < g_mokka.visible_count; i++) {
        uint64_t number;
        if (!set->types[i] || !next_wanted(set, i, &number, &e)) continue;
        if (best < 0 || e.seq < best_event.seq) {
            best = (int)i;
            best_number = number;
            best_event = e;
        }
    }
    if (best < 0) return 0;
    set->consumed[best] = best_number;
    memset(data, 0, sizeof *data);
    data->device = &g_mokka.devices[best];
    data->eventType = best_event.type;
    data->eventData = best_event.data;
    data->gpuInstanceId = best_event.gpu_instance;
    data->computeInstanceId = best_event.compute_instance;
    return 1;
}

static long long monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Sleep until the latch counter moves away from `seen` (a publish), or `ms` pass. */
static void sleep_on_counter(uint32_t seen, long long ms) {
    struct timespec rel = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    long r = syscall(SYS_futex, &g_state.hdr->seq, FUTEX_WAIT, seen, &rel, NULL, 0);
    if (r == 0 || errno == EAGAIN || errno == EINTR || errno == ETIMEDOUT) return;
    /* No futex on this mapping (should not happen on Linux): poll instead. */
    struct timespec nap = {0, (ms < 10 ? ms : 10) * 1000000L};
    nanosleep(&nap, NULL);
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    long long deadline = monotonic_ms() + timeout_ms;
    for (;;) {
        uint32_t seen = __atomic_load_n(&g_state.hdr->seq, __ATOMIC_ACQUIRE);
        pthread_mutex_lock(&set->lock);
        int hit = take_pending(set, data);
        pthread_mutex_unlock(&set->lock);
        if (hit) return NVML_SUCCESS;
        long long left = deadline - monotonic_ms();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        sleep_on_counter(seen, left);
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
