/* Micro-benchmark of an NVML library (Mokka's or any other), loaded by path.
 *   bench_nvml LIB init        one fresh-process measurement: dlopen and nvmlInit_v2 times (us)
 *   bench_nvml LIB calls N     ns per call of nvmlDeviceGetPowerUsage and nvmlDeviceGetMemoryInfo
 *   bench_nvml - run CMD...    run CMD; print its wall time and peak RSS (on stderr). Measured from this small
 *                              process, so the child's peak is not inflated by a large parent
 *                              (ru_maxrss survives exec: a child forked from Python starts at
 *                              Python's size). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned *);
typedef int (*handle_fn)(unsigned, void **);
typedef int (*power_fn)(void *, unsigned *);
typedef struct { unsigned long long total, free, used; } memory_t;
typedef int (*memory_fn)(void *, memory_t *);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "bench: %s missing\n", name);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIB init | LIB calls N\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[2], "run")) {
        double start = now_ns();
        pid_t pid = fork();
        if (pid == 0) {
            execvp(argv[3], argv + 3);
            _exit(127);
        }
        int status;
        struct rusage usage;
        if (pid < 0 || wait4(pid, &status, 0, &usage) < 0) return 2;
        fprintf(stderr, "wall_ms %.3f\nmaxrss_kb %ld\nexit %d\n", (now_ns() - start) / 1e6, usage.ru_maxrss,
               WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        return 0;
    }
    double t0 = now_ns();
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    double t1 = now_ns();
    if (!lib) {
        fprintf(stderr, "bench: %s\n", dlerror());
        return 2;
    }
    int r = ((init_fn)sym(lib, "nvmlInit_v2"))();
    double t2 = now_ns();
    if (r != 0) {
        fprintf(stderr, "bench: nvmlInit_v2 returned %d\n", r);
        return 1;
    }
    if (!strcmp(argv[2], "init")) {
        printf("load_us %.1f\ninit_us %.1f\n", (t1 - t0) / 1e3, (t2 - t1) / 1e3);
        return 0;
    }
    long n = argc > 3 ? atol(argv[3]) : 1000000;
    unsigned count = 0;
    ((count_fn)sym(lib, "nvmlDeviceGetCount_v2"))(&count);
    if (count == 0) return 1;
    void *dev[64];
    handle_fn by_index = (handle_fn)sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    for (unsigned i = 0; i < count && i < 64; i++) by_index(i, &dev[i]);
    power_fn power = (power_fn)sym(lib, "nvmlDeviceGetPowerUsage");
    memory_fn memory = (memory_fn)sym(lib, "nvmlDeviceGetMemoryInfo");
    volatile unsigned long long sink = 0;
    unsigned mw;
    memory_t m;
    for (long i = 0; i < 10000; i++) power(dev[i % count], &mw);
    double a = now_ns();
    for (long i = 0; i < n; i++) {
        power(dev[i % count], &mw);
        sink += mw;
    }
    double b = now_ns();
    for (long i = 0; i < n; i++) {
        memory(dev[i % count], &m);
        sink += m.free;
    }
    double c = now_ns();
    printf("power_ns %.2f\nmemory_ns %.2f\n", (b - a) / n, (c - b) / n);
    return sink == 42 ? 3 : 0;
}
