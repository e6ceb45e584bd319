/* Time-varying metrics without a daemon: every read evaluates the metric's pattern (or the
 * override a fault put in its place) at the wall clock, so each process on the node, and
 * every node with the same seed, reads the same series. The clock-event reasons follow
 * from the values (thermal and power slowdowns), and nvmlDeviceGetSamples returns the
 * history the same functions give for past instants.
 *
 * Patterns (mokka_state.h, MOKKA_PATTERN_*):
 *   constant   a
 *   sine       a + b * sin(2 pi (t / period + phase)), the phase drawn from the seed
 *   walk       a bounded random walk between a and b, one step per period: smooth value
 *              noise in three octaves (periods 1, 4 and 16 steps), so any instant is
 *              computed directly from the clock, with no history to keep
 *   busy       a while the GPU has no processes, b while it has some
 *   ramp       a until start, then straight to b over period, then b
 * No libm: the sine is a rational approximation (error below 0.2 % of the amplitude). */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "internal.h"

#define SAMPLE_MS 167    /* sample period of the Samples API: nvidia-smi's 1/6 s utilization period */
#define SAMPLE_DEPTH 120 /* samples kept per type: the last 20 s */

uint64_t mokka_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* splitmix64's finalizer: a well-mixed 64-bit hash. */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A uniform number in [0, 1) for step k of stream `seed`. */
static double uniform(uint64_t seed, uint64_t k) { return (double)(mix(seed ^ mix(k)) >> 11) * 0x1.0p-53; }

/* sin(2 pi x) for x in [0, 1): Bhaskara I's approximation on each half turn. */
static double sine_turn(double x) {
    double half = x < 0.5 ? x : x - 0.5; /* in [0, 0.5): the angle pi * 2 * half in [0, pi) */
    double p = half * 2.0 * (1.0 - half * 2.0);
    double s = 16.0 * p / (5.0 - 4.0 * p);
    return x < 0.5 ? s : -s;
}

static double smooth(double f) { return f * f * (3.0 - 2.0 * f); }

/* Value noise in [0, 1): one octave, period `steps` walk steps. */
static double octave(uint64_t seed, uint64_t t_ms, uint64_t step_ms) {
    uint64_t k = t_ms / step_ms;
    double f = (double)(t_ms % step_ms) / (double)step_ms;
    double v0 = uniform(seed, k), v1 = uniform(seed, k + 1);
    return v0 + (v1 - v0) * smooth(f);
}

static int64_t pattern_at(const mokka_pattern_t *p, uint64_t t_ms, unsigned processes) {
    uint64_t period = p->period_ms ? p->period_ms : 1;
    switch (p->kind) {
    case MOKKA_PATTERN_SINE: {
        uint64_t phase = p->seed % period;
        double x = (double)((t_ms + phase) % period) / (double)period;
        double v = (double)p->a + (double)p->b * sine_turn(x);
        return (int64_t)(v < 0 ? v - 0.5 : v + 0.5);
    }
    case MOKKA_PATTERN_WALK: {
        double n = 0.5 * octave(p->seed, t_ms, period) + 0.3 * octave(p->seed + 1, t_ms, 4 * period) +
                   0.2 * octave(p->seed + 2, t_ms, 16 * period);
        return p->a + (int64_t)(n * (double)(p->b - p->a) + 0.5);
    }
    case MOKKA_PATTERN_BUSY: return processes ? p->b : p->a;
    case MOKKA_PATTERN_RAMP: {
        if (t_ms <= p->start_ms) return p->a;
        uint64_t into = t_ms - p->start_ms;
        if (into >= period) return p->b;
        return p->a + (int64_t)((double)(p->b - p->a) * (double)into / (double)period);
    }
    default: return p->a; /* constant */
    }
}

static uint64_t static_value(const mokka_gpu_t *g, unsigned metric) {
    switch (metric) {
    case MOKKA_METRIC_POWER: return g->power_usage;
    case MOKKA_METRIC_TEMP_GPU: return g->temp_gpu;
    case MOKKA_METRIC_TEMP_MEMORY: return g->temp_memory;
    case MOKKA_METRIC_UTIL_GPU: return g->util_gpu;
    case MOKKA_METRIC_UTIL_MEMORY: return g->util_memory;
    case MOKKA_METRIC_MEM_USED: return g->mem_used;
    case MOKKA_METRIC_CLOCK_SM: return g->clock_current[NVML_CLOCK_SM];
    case MOKKA_METRIC_CLOCK_MEM: return g->clock_current[NVML_CLOCK_MEM];
    default: return 0;
    }
}

/* `past`: t_ms is a sample's time, before which an override did not yet apply. A read of
 * the present always sees the override: the coarse clock may lag the writer's clock by a
 * tick, and a fault must show at the very next call. */
uint64_t mokka_metric_at(const mokka_gpu_t *g, unsigned metric, uint64_t t_ms, int past) {
    const mokka_pattern_t *p = &g->faults.override[metric];
    if (p->kind == MOKKA_PATTERN_NONE || (past && t_ms < p->start_ms)) p = &g->patterns[metric];
    if (p->kind == MOKKA_PATTERN_NONE || (past && t_ms < p->start_ms)) return static_value(g, metric);
    int64_t v = pattern_at(p, t_ms, g->n_procs);
    return v < 0 ? 0 : (uint64_t)v;
}

/* A varying metric's value is a pure function of the state (its latch counter names it) and
 * the coarse clock, which ticks every few milliseconds: the library remembers the last value
 * computed per GPU and metric, and a getter called again within the same tick of an
 * unchanged state answers from there. An entry is stored only when the counter did not move
 * while it was computed from the copy that counter names, so it never holds a torn value.
 * Threads share the entries: each has its own small seqlock (a writer that finds it taken
 * just skips storing), so a reader never takes a value from a half-written entry. No TLS:
 * that would tie the library to the dynamic loader's __tls_get_addr. */
typedef struct {
    uint32_t lock;  /* odd while a thread writes the entry */
    uint32_t seq;   /* the state's latch counter the value belongs to */
    uint64_t t_ms;  /* the coarse clock it belongs to */
    uint64_t value;
} memo_t;

static memo_t memo[MOKKA_MAX_GPUS * MOKKA_METRICS];

static int in_copy(const mokka_gpu_t *g, uint32_t seq) {
    const mokka_gpu_t *first = g_state.gpus[seq & 1];
    return g >= first && g < first + g_state.hdr->gpu_count;
}

uint64_t mokka_metric(const mokka_gpu_t *g, unsigned metric) {
    /* The clock is read only when something varies: a static metric costs two loads. */
    if (g->faults.override[metric].kind == MOKKA_PATTERN_NONE && g->patterns[metric].kind == MOKKA_PATTERN_NONE)
        return static_value(g, metric);
    uint32_t seq = __atomic_load_n(&g_state.hdr->seq, __ATOMIC_ACQUIRE);
    uint64_t now = mokka_wall_ms();
    if (!in_copy(g, seq)) return mokka_metric_at(g, metric, now, 0); /* a writer moved on: MOKKA_READ retries */
    memo_t *m = &memo[(size_t)(g - g_state.gpus[seq & 1]) * MOKKA_METRICS + metric];
    uint32_t lock = __atomic_load_n(&m->lock, __ATOMIC_ACQUIRE);
    if (!(lock & 1)) {
        uint32_t m_seq = __atomic_load_n(&m->seq, __ATOMIC_RELAXED);
        uint64_t m_t = __atomic_load_n(&m->t_ms, __ATOMIC_RELAXED), v = __atomic_load_n(&m->value, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&m->lock, __ATOMIC_RELAXED) == lock && m_seq == seq && m_t == now) return v;
    }
    uint64_t v = mokka_metric_at(g, metric, now, 0);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&g_state.hdr->seq, __ATOMIC_RELAXED) != seq) return v; /* computed across a publish */
    lock = __atomic_load_n(&m->lock, __ATOMIC_RELAXED);
    if ((lock & 1) || !__atomic_compare_exchange_n(&m->lock, &lock, lock + 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return v; /* another thread is storing: leave it */
    __atomic_store_n(&m->seq, seq, __ATOMIC_RELAXED);
    __atomic_store_n(&m->t_ms, now, __ATOMIC_RELAXED);
    __atomic_store_n(&m->value, v, __ATOMIC_RELAXED);
    __atomic_store_n(&m->lock, lock + 2, __ATOMIC_RELEASE);
    return v;
}

/* ---- what follows from the values ------------------------------------------------------ */

static int reached(uint64_t value, uint32_t threshold) { return !mokka_is_na(threshold) && value >= threshold; }

unsigned long long mokka_event_reasons_at(const mokka_gpu_t *g, uint64_t t_ms, int past) {
    unsigned long long r = g->clocks_event_reasons;
    uint64_t temp = mokka_metric_at(g, MOKKA_METRIC_TEMP_GPU, t_ms, past);
    if (reached(temp, g->thresholds[NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]))
        r |= nvmlClocksThrottleReasonHwSlowdown | nvmlClocksThrottleReasonHwThermalSlowdown;
    if (reached(temp, g->thresholds[NVML_TEMPERATURE_THRESHOLD_GPU_MAX]) ||
        (!mokka_is_na(g->temp_memory) &&
         reached(mokka_metric_at(g, MOKKA_METRIC_TEMP_MEMORY, t_ms, past), g->thresholds[NVML_TEMPERATURE_THRESHOLD_MEM_MAX])))
        r |= nvmlClocksEventReasonSwThermalSlowdown;
    if ((g->flags & MOKKA_GPU_POWER_MANAGEMENT) && reached(mokka_metric_at(g, MOKKA_METRIC_POWER, t_ms, past), g->power_enforced_limit))
        r |= nvmlClocksEventReasonSwPowerCap;
    if (mokka_metric_at(g, MOKKA_METRIC_UTIL_GPU, t_ms, past) > 0) r &= ~(unsigned long long)nvmlClocksEventReasonGpuIdle;
    return r & g->supported_event_reasons;
}

uint32_t mokka_clock_at(const mokka_gpu_t *g, unsigned domain, uint64_t t_ms, int past) {
    uint32_t v = g->clock_current[domain];
    if (mokka_is_na(v) || v == (uint32_t)MOKKA_DEPRECATED) return v;
    if (domain == NVML_CLOCK_MEM) return (uint32_t)mokka_metric_at(g, MOKKA_METRIC_CLOCK_MEM, t_ms, past);
    if (domain != NVML_CLOCK_GRAPHICS && domain != NVML_CLOCK_SM) return v;
    v = (uint32_t)mokka_metric_at(g, MOKKA_METRIC_CLOCK_SM, t_ms, past);
    /* A hardware slowdown cuts the core clocks by at least half (the NVML documentation of
     * nvmlClocksThrottleReasonHwSlowdown). */
    if (reached(mokka_metric_at(g, MOKKA_METRIC_TEMP_GPU, t_ms, past), g->thresholds[NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]))
        v /= 2;
    return v;
}

/* ---- nvmlDeviceGetSamples ------------------------------------------------------------- */

/* The value of one sampling type at time t, or MOKKA_NA when the type is not supported. */
static uint32_t sample_value(const mokka_gpu_t *g, nvmlSamplingType_t type, uint64_t t_ms) {
    switch (type) {
    case NVML_TOTAL_POWER_SAMPLES: return (uint32_t)mokka_metric_at(g, MOKKA_METRIC_POWER, t_ms, 1);
    case NVML_GPU_UTILIZATION_SAMPLES: return (uint32_t)mokka_metric_at(g, MOKKA_METRIC_UTIL_GPU, t_ms, 1);
    case NVML_MEMORY_UTILIZATION_SAMPLES: return (uint32_t)mokka_metric_at(g, MOKKA_METRIC_UTIL_MEMORY, t_ms, 1);
    case NVML_ENC_UTILIZATION_SAMPLES: return g->util_encoder;
    case NVML_DEC_UTILIZATION_SAMPLES: return g->util_decoder;
    case NVML_JPG_UTILIZATION_SAMPLES: return g->util_jpeg;
    case NVML_OFA_UTILIZATION_SAMPLES: return g->util_ofa;
    case NVML_PROCESSOR_CLK_SAMPLES: return mokka_clock_at(g, NVML_CLOCK_SM, t_ms, 1);
    case NVML_MEMORY_CLK_SAMPLES: return mokka_clock_at(g, NVML_CLOCK_MEM, t_ms, 1);
    case NVML_MODULE_POWER_SAMPLES: return g->module_power_usage;
    default: return (uint32_t)MOKKA_NA;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type, unsigned long long last_seen,
                                         nvmlValueType_t *value_type, unsigned int *count, nvmlSample_t *samples) {
    GET_GPU(device, g);
    if (!count || (samples && *count == 0)) return NVML_ERROR_INVALID_ARGUMENT;
    if ((unsigned)type >= NVML_SAMPLINGTYPE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t mig;
    MOKKA_READ(g, mig = g->mig_current);
    if (mig == NVML_DEVICE_MIG_ENABLE && type <= NVML_DEC_UTILIZATION_SAMPLES && type != NVML_TOTAL_POWER_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED; /* the NVML documentation: not with MIG on */
    uint64_t newest = mokka_wall_ms() / SAMPLE_MS * SAMPLE_MS;
    uint32_t probe;
    MOKKA_READ(g, probe = sample_value(g, type, newest));
    if (mokka_is_na(probe)) return NVML_ERROR_NOT_SUPPORTED;
    if (value_type) *value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (!samples) {
        *count = SAMPLE_DEPTH; /* the sizing call: how many samples the buffer holds */
        return NVML_SUCCESS;
    }
    uint64_t first = newest - (uint64_t)(SAMPLE_DEPTH - 1) * SAMPLE_MS;
    if (last_seen / 1000 >= first) first = (last_seen / 1000 / SAMPLE_MS + 1) * SAMPLE_MS;
    unsigned n = 0;
    for (uint64_t t = first; t <= newest && n < *count; t += SAMPLE_MS) {
        uint32_t v;
        MOKKA_READ(g, v = sample_value(g, type, t));
        samples[n].timeStamp = t * 1000;
        memset(&samples[n].sampleValue, 0, sizeof samples[n].sampleValue);
        samples[n].sampleValue.uiVal = v;
        n++;
    }
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    *count = n;
    return NVML_SUCCESS;
}
