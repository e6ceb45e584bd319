/* Readers hammering a live state: 16 threads call NVML getters on GPU 0 until stdin
 * closes, checking invariants the test's writer keeps in every update:
 *   nvmlDeviceGetMemoryInfo_v2: used == reserved
 *   nvmlDeviceGetComputeRunningProcesses_v3: every record has the same pid, and
 *   usedGpuMemory == pid << 20 (a copy spanning many cache lines)
 * Prints "reads N torn T values V" (V: how many distinct values the readers saw, so the
 * test can tell they overlapped the writer).
 *   usage: torn_readers LIBNVIDIA-ML */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define THREADS 16

static nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_v2_t *);
static nvmlReturn_t (*get_procs)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
static nvmlDevice_t device;
static volatile int stop;
static unsigned long long reads, torn, changes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *reader(void *arg) {
    (void)arg;
    unsigned long long my_reads = 0, my_torn = 0, my_changes = 0, last = 0;
    while (!stop) {
        nvmlMemory_v2_t m = {.version = nvmlMemory_v2};
        if (get_memory(device, &m) != NVML_SUCCESS || m.used != m.reserved) my_torn++;
        nvmlProcessInfo_t p[16];
        unsigned int n = 16;
        if (get_procs(device, &n, p) != NVML_SUCCESS) {
            my_torn++;
        } else {
            for (unsigned i = 0; i < n; i++)
                if (p[i].pid != p[0].pid || p[i].usedGpuMemory != (unsigned long long)p[i].pid << 20) my_torn++;
            if (n && p[0].pid != last) my_changes++, last = p[0].pid;
        }
        my_reads += 2;
    }
    pthread_mutex_lock(&lock);
    reads += my_reads, torn += my_torn, changes += my_changes;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "%s\n", dlerror()), 2;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(lib, "nvmlInit_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) = (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    get_memory = (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo_v2");
    get_procs = (nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (init() != NVML_SUCCESS || by_index(0, &device) != NVML_SUCCESS) return fprintf(stderr, "init failed\n"), 1;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, reader, NULL);
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    stop = 1;
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    printf("reads %llu torn %llu values %llu\n", reads, torn, changes);
    return 0;
}
