/* Readers hammering a state a writer is injecting faults into: 16 threads call NVML getters
 * on GPU 0 until stdin closes, checking invariants every fault the test applies keeps:
 *   nvmlDeviceGetUtilizationRates: gpu == memory (one utilization fault sets both)
 *   nvmlDeviceGetRemappedRows: correctable == uncorrectable (each remap fault adds one of each)
 *   nvmlDeviceGetTotalEccErrors: answers (ECC faults change the counters on every update)
 * and one more thread sleeping in nvmlEventSetWait, checking that the Xids it receives come
 * in the order they were raised (the writer's codes count up; events it fell too far behind
 * on are skipped, never delivered out of order).
 * Prints "reads N torn T values V events E disorder D".
 *   usage: fault_readers LIBNVIDIA-ML */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define THREADS 16

static nvmlReturn_t (*get_util)(nvmlDevice_t, nvmlUtilization_t *);
static nvmlReturn_t (*get_rows)(nvmlDevice_t, unsigned *, unsigned *, unsigned *, unsigned *);
static nvmlReturn_t (*get_ecc)(nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t, unsigned long long *);
static nvmlReturn_t (*wait_event)(nvmlEventSet_t, nvmlEventData_t *, unsigned);
static nvmlDevice_t device;
static nvmlEventSet_t events;
static volatile int stop;
static unsigned long long reads, torn, changes, delivered, disorder;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *reader(void *arg) {
    (void)arg;
    unsigned long long my_reads = 0, my_torn = 0, my_changes = 0;
    unsigned last = ~0u;
    while (!stop) {
        nvmlUtilization_t u;
        if (get_util(device, &u) != NVML_SUCCESS || u.gpu != u.memory) my_torn++;
        if (u.gpu != last) my_changes++, last = u.gpu;
        unsigned corr, unc, pending, failure;
        if (get_rows(device, &corr, &unc, &pending, &failure) != NVML_SUCCESS || corr != unc) my_torn++;
        unsigned long long sbe, dbe;
        if (get_ecc(device, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &sbe) != NVML_SUCCESS ||
            get_ecc(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &dbe) != NVML_SUCCESS)
            my_torn++;
        my_reads += 3;
        (void)sbe, (void)dbe; /* two calls: not one snapshot, so only their success is checked */
    }
    pthread_mutex_lock(&lock);
    reads += my_reads, torn += my_torn, changes += my_changes;
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *waiter(void *arg) {
    (void)arg;
    unsigned long long last = 0;
    while (!stop) {
        nvmlEventData_t e;
        if (wait_event(events, &e, 100) != NVML_SUCCESS) continue;
        if (e.eventData <= last) disorder++;
        last = e.eventData;
        delivered++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "%s\n", dlerror()), 2;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(lib, "nvmlInit_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) = (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*create)(nvmlEventSet_t *) = (nvmlReturn_t (*)(nvmlEventSet_t *))dlsym(lib, "nvmlEventSetCreate");
    nvmlReturn_t (*reg)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) =
        (nvmlReturn_t (*)(nvmlDevice_t, unsigned long long, nvmlEventSet_t))dlsym(lib, "nvmlDeviceRegisterEvents");
    get_util = (nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t *))dlsym(lib, "nvmlDeviceGetUtilizationRates");
    get_rows = (nvmlReturn_t (*)(nvmlDevice_t, unsigned *, unsigned *, unsigned *, unsigned *))dlsym(lib, "nvmlDeviceGetRemappedRows");
    get_ecc = (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t, unsigned long long *))dlsym(
        lib, "nvmlDeviceGetTotalEccErrors");
    wait_event = (nvmlReturn_t (*)(nvmlEventSet_t, nvmlEventData_t *, unsigned))dlsym(lib, "nvmlEventSetWait_v2");
    if (init() != NVML_SUCCESS || by_index(0, &device) != NVML_SUCCESS || create(&events) != NVML_SUCCESS ||
        reg(device, nvmlEventTypeXidCriticalError, events) != NVML_SUCCESS)
        return fprintf(stderr, "init failed\n"), 1;
    pthread_t t[THREADS + 1];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, reader, NULL);
    pthread_create(&t[THREADS], NULL, waiter, NULL);
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    stop = 1;
    for (int i = 0; i <= THREADS; i++) pthread_join(t[i], NULL);
    printf("reads %llu torn %llu values %llu events %llu disorder %llu\n", reads, torn, changes, delivered, disorder);
    return 0;
}
