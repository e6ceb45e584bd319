/* Micro-benchmark of an NVML library (Mokka's or any other), loaded by path.
 *   bench_nvml LIB init        one fresh-process measurement: dlopen and nvmlInit_v2 times (us)
 *   bench_nvml LIB calls N     ns per call of nvmlDeviceGetPowerUsage and nvmlDeviceGetMemoryInfo
 *   bench_nvml LIB mig N       with MIG on GPU 0 and a MIG device at index 0, in a writable state: ns per
 *                              nvmlDeviceGetMigDeviceHandleByIndex and per nvmlDeviceGetMemoryInfo on the
 *                              MIG device; us per create + destroy of a 1g GPU instance (profile ID 19) and
 *                              its compute instance (N / 10000 cycles)
 *   bench_nvml - run CMD...    run CMD; print its wall time and peak RSS (on stderr). Measured from this small
 *                              process, so the child's peak is not inflated by a large parent
 *                              (ru_maxrss survives exec: a child forked from Python starts at
 *                              Python's size). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
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
typedef int (*mig_index_fn)(void *, unsigned, void **);
typedef int (*create_gi_fn)(void *, unsigned, void **);
typedef int (*create_ci_fn)(void *, unsigned, void **);
typedef int (*destroy_fn)(void *);

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

static int mig(void *lib, long n) {
    void *dev, *m, *gi, *ci;
    if (((handle_fn)sym(lib, "nvmlDeviceGetHandleByIndex_v2"))(0, &dev)) return 1;
    mig_index_fn by_index = (mig_index_fn)sym(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
    memory_fn memory = (memory_fn)sym(lib, "nvmlDeviceGetMemoryInfo");
    create_gi_fn create_gi = (create_gi_fn)sym(lib, "nvmlDeviceCreateGpuInstance");
    create_ci_fn create_ci = (create_ci_fn)sym(lib, "nvmlGpuInstanceCreateComputeInstance");
    destroy_fn destroy_gi = (destroy_fn)sym(lib, "nvmlGpuInstanceDestroy");
    destroy_fn destroy_ci = (destroy_fn)sym(lib, "nvmlComputeInstanceDestroy");
    if (by_index(dev, 0, &m)) {
        fprintf(stderr, "bench: no MIG device at index 0 of GPU 0\n");
        return 1;
    }
    volatile unsigned long long sink = 0;
    memory_t mem;
    for (long i = 0; i < 10000; i++) by_index(dev, 0, &m);
    double a = now_ns();
    for (long i = 0; i < n; i++) {
        by_index(dev, 0, &m);
        sink += (unsigned long long)(uintptr_t)m;
    }
    double b = now_ns();
    for (long i = 0; i < n; i++) {
        memory(m, &mem);
        sink += mem.total;
    }
    double c = now_ns();
    long cycles = n / 10000 > 0 ? n / 10000 : 1;
    for (long i = 0; i < cycles; i++) {
        if (create_gi(dev, 19, &gi) || create_ci(gi, 0, &ci) || destroy_ci(ci) || destroy_gi(gi)) {
            fprintf(stderr, "bench: create/destroy failed (is the state writable, with room for a 1g?)\n");
            return 1;
        }
    }
    double d = now_ns();
    printf("mig_handle_ns %.2f\nmig_memory_ns %.2f\ncreate_destroy_us %.2f\n", (b - a) / n, (c - b) / n,
           (d - c) / cycles / 1e3);
    return sink == 42 ? 3 : 0;
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
    if (!strcmp(argv[2], "mig")) return mig(lib, n);
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
