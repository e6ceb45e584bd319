/* Observer for `mokka bench fault`: how soon an NVML consumer sees a fault.
 *   bench_fault LIB watch GPU    read nvmlDeviceGetTemperature(GPU) in a tight loop; print
 *                                "MONOTONIC_NS VALUE" each time the value changes
 *   bench_fault LIB events       sleep in nvmlEventSetWait (Xid events of every GPU); print
 *                                "MONOTONIC_NS GPU XID" for each event as it returns
 * Both print "ready" once set up, and stop when stdin closes. Timestamps are CLOCK_MONOTONIC,
 * the clock Python's time.monotonic_ns() reads, so the bench compares them with its own. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

static void *watch_stdin(void *arg) {
    (void)arg;
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    stop = 1;
    return NULL;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "bench_fault: %s missing\n", name);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIB watch GPU | LIB events\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "bench_fault: %s\n", dlerror()), 2;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))sym(lib, "nvmlInit_v2");
    nvmlReturn_t (*count_fn)(unsigned *) = (nvmlReturn_t (*)(unsigned *))sym(lib, "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    if (init() != NVML_SUCCESS) return fprintf(stderr, "bench_fault: nvmlInit failed\n"), 1;
    pthread_t t;
    pthread_create(&t, NULL, watch_stdin, NULL);

    if (!strcmp(argv[2], "watch") && argc > 3) {
        nvmlReturn_t (*temp)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned *) =
            (nvmlReturn_t (*)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned *))sym(lib, "nvmlDeviceGetTemperature");
        nvmlDevice_t dev;
        if (by_index((unsigned)atoi(argv[3]), &dev) != NVML_SUCCESS) return 1;
        unsigned last = 0, v = 0;
        temp(dev, NVML_TEMPERATURE_GPU, &last);
        printf("ready\n");
        fflush(stdout);
        while (!stop) {
            if (temp(dev, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS && v != last) {
                printf("%lld %u\n", now_ns(), v);
                fflush(stdout);
                last = v;
            }
        }
        return 0;
    }
    if (!strcmp(argv[2], "events")) {
        nvmlReturn_t (*create)(nvmlEventSet_t *) = (nvmlReturn_t (*)(nvmlEventSet_t *))sym(lib, "nvmlEventSetCreate");
        nvmlReturn_t (*reg)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) =
            (nvmlReturn_t (*)(nvmlDevice_t, unsigned long long, nvmlEventSet_t))sym(lib, "nvmlDeviceRegisterEvents");
        nvmlReturn_t (*wait)(nvmlEventSet_t, nvmlEventData_t *, unsigned) =
            (nvmlReturn_t (*)(nvmlEventSet_t, nvmlEventData_t *, unsigned))sym(lib, "nvmlEventSetWait_v2");
        nvmlReturn_t (*index_of)(nvmlDevice_t, unsigned *) =
            (nvmlReturn_t (*)(nvmlDevice_t, unsigned *))sym(lib, "nvmlDeviceGetIndex");
        nvmlEventSet_t set;
        unsigned n = 0;
        if (create(&set) != NVML_SUCCESS || count_fn(&n) != NVML_SUCCESS) return 1;
        for (unsigned i = 0; i < n; i++) {
            nvmlDevice_t dev;
            if (by_index(i, &dev) == NVML_SUCCESS) reg(dev, nvmlEventTypeXidCriticalError, set);
        }
        printf("ready\n");
        fflush(stdout);
        while (!stop) {
            nvmlEventData_t e;
            if (wait(set, &e, 200) != NVML_SUCCESS) continue;
            long long at = now_ns();
            unsigned index = 0;
            index_of(e.device, &index);
            printf("%lld %u %llu\n", at, index, e.eventData);
            fflush(stdout);
        }
        return 0;
    }
    fprintf(stderr, "bench_fault: unknown mode %s\n", argv[2]);
    return 2;
}
