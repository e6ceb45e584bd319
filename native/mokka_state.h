/*
 * mokka_state.h — the one definition of Mokka's compiled state.
 *
 * The Python compiler (gpumodel/state.py) feeds this header to cffi and writes the
 * state through it; the native libraries map the same bytes and read them through these
 * structs. The header is kept in the subset of C that cffi's parser accepts: plain
 * structs of fixed-width types, and `#define NAME <integer>` constants. Lines that
 * start with `#` other than such defines are dropped before cffi reads the text.
 *
 * The state region: one mokka_header_t (static facts and the `seq` counter), then two
 * copies of the live data, each a mokka_node_t followed by gpu_count mokka_gpu_t records:
 *
 *     [header][copy 0: node, gpu 0 .. gpu n-1][copy 1: node, gpu 0 .. gpu n-1]
 *
 * Where it lives: a state file of its own (MOKKA_STATE), or — how Mokka stages it — inside
 * the mock library file itself, so a container that gets nothing but
 * libnvidia-ml.so.<version> still sees the node: the file is the ELF image, zero padding up
 * to a multiple of MOKKA_STATE_ALIGN, the state region, and a mokka_trailer_t as the file's
 * last bytes. The dynamic loader maps only the ELF's segments; the library finds the region
 * through the trailer of its own file and maps it MAP_SHARED.
 *
 * Live updates (one writer at a time, serialised by flock on the file; native/writer/)
 * rewrite the copies in place, never by rename (a bind mount pins the inode), as a latch:
 * `seq` odd -> copy 0 is rewritten while readers use copy 1; `seq` even -> copy 1 is
 * rewritten while readers use copy 0. A reader reads copy (seq & 1) and retries only if
 * `seq` moved meanwhile, so a writer killed midway never stalls anyone: readers keep
 * answering from the copy it was not writing, and the next writer repairs the other.
 *
 * Adding a live field: put it in mokka_gpu_t (per GPU) or mokka_node_t (node-wide), fill it
 * in gpumodel/state.py, and bump MOKKA_STATE_VERSION; the writer copies whole records, so
 * nothing else changes.
 *
 * Waiting for a change: every publish ends with a FUTEX_WAKE on `seq` (a shared futex: the
 * key is the file's page, so every process mapping the file, in any mount namespace, shares
 * it). nvmlEventSetWait sleeps in FUTEX_WAIT on the value of `seq` it last checked.
 *
 * Units: bytes, milliwatts, MHz, degrees Celsius, millijoules, percent.
 * MOKKA_NA (all ones) in an integer field means the board does not support it, and the
 * library answers NVML_ERROR_NOT_SUPPORTED; an empty string means the same. In clock
 * fields MOKKA_DEPRECATED means current drivers refuse the query as deprecated.
 */
#ifndef MOKKA_STATE_H
#define MOKKA_STATE_H

#include <stdint.h>

#define MOKKA_STATE_MAGIC 0x41544b4f4b4b4f4d
#define MOKKA_STATE_VERSION 7
#define MOKKA_TRAILER_MAGIC 0x4c5254414b4b4f4d  /* "MOKKATRL" */
#define MOKKA_STATE_ALIGN 65536   /* region offset in a library file: a multiple of every Linux page size */
#define MOKKA_MAX_GPUS 64
#define MOKKA_MAX_NICS 32          /* InfiniBand adapters (gpumodel/profile.py MAX_HCAS) */
#define MOKKA_NA 4294967295
#define MOKKA_DEPRECATED 4294967294 /* the driver answers "deprecated" (NVML_ERROR_DEPRECATED) */
#define MOKKA_MAX_MEM_CLOCKS 8
#define MOKKA_MAX_GFX_CLOCKS 512
#define MOKKA_MAX_PROCS 16
#define MOKKA_MAX_NVLINKS 18
#define MOKKA_CPUSET_WORDS 16
#define MOKKA_THRESHOLD_COUNT 16
#define MOKKA_ECC_LOCATIONS 9
#define MOKKA_EVENT_RING 64        /* events kept per GPU for event sets that fall behind */
#define MOKKA_NVLINK_COUNTERS 4    /* per link: replay, recovery, CRC flit, CRC data (nvmlNvLinkErrorCounter_t) */

/* Clock domains, indexed as nvmlClockType_t: graphics, sm, memory, video. */
#define MOKKA_CLOCK_DOMAINS 4

/* Bits of mokka_gpu_t.flags. */
#define MOKKA_GPU_LOST 1
#define MOKKA_GPU_MIG_CAPABLE 2
#define MOKKA_GPU_MULTI_GPU_BOARD 4
#define MOKKA_GPU_FABRIC_SUPPORTED 8
#define MOKKA_GPU_REMAP_SUPPORTED 16
#define MOKKA_GPU_RETIRE_SUPPORTED 32
#define MOKKA_GPU_POWER_MANAGEMENT 64
#define MOKKA_GPU_REMAP_PENDING 128
#define MOKKA_GPU_REMAP_FAILURE 256
#define MOKKA_GPU_TLIMIT 512         /* reports T.Limit-relative thresholds (Ada and later) */
#define MOKKA_GPU_SRAM_STATUS 1024   /* answers nvmlDeviceGetSramEccErrorStatus (SRAM parity/SEC-DED split) */

/* MIG (see gpumodel/mig.py): the board's profile tables (fixed) and the layout (live). */
#define MOKKA_MIG_MAX_GI_PROFILES 8
#define MOKKA_MIG_MAX_CI_PROFILES 6
#define MOKKA_MIG_MAX_PLACEMENTS 8
#define MOKKA_MIG_MAX_GIS 8          /* GPU instances at once */
#define MOKKA_MIG_MAX_CIS 8          /* compute instances per GPU instance */
#define MOKKA_MIG_MAX_GI_ID 14       /* GI ids 0..14, CI ids 0..7 */
#define MOKKA_MIG_MAX_CI_ID 7

typedef struct {
    uint32_t index;             /* NVML_COMPUTE_INSTANCE_PROFILE_* */
    uint32_t id;                /* profile ID */
    uint32_t slice_count;       /* compute slices */
    uint32_t instance_count;
    uint32_t multiprocessor_count;
    uint32_t n_placements;
    uint32_t placements[MOKKA_MIG_MAX_PLACEMENTS]; /* starts, in compute slices */
    char name[32];              /* "1c.3g.40gb" */
} mokka_ci_profile_t;

typedef struct {
    uint32_t index;             /* NVML_GPU_INSTANCE_PROFILE_* */
    uint32_t id;                /* the driver's profile ID */
    uint32_t slice_count;       /* GPU slices */
    uint32_t memory_slices;     /* placement size */
    uint32_t instance_count;
    uint32_t multiprocessor_count;
    uint32_t copy_engine_count;
    uint32_t decoder_count;
    uint32_t encoder_count;
    uint32_t jpeg_count;
    uint32_t ofa_count;
    uint32_t first_id;          /* GI ids: first_id + start / memory_slices */
    uint32_t n_placements;
    uint32_t placements[MOKKA_MIG_MAX_PLACEMENTS]; /* starts, in memory slices */
    uint32_t n_ci_profiles;
    uint64_t memory_mib;
    char name[32];              /* "1g.10gb+me" */
    mokka_ci_profile_t ci[MOKKA_MIG_MAX_CI_PROFILES];
} mokka_gi_profile_t;

typedef struct {
    uint32_t id;
    uint32_t profile;           /* index into its GI profile's ci[] */
    uint32_t start;             /* first compute slice */
    uint32_t pad;
    char uuid[48];              /* "MIG-..." */
} mokka_ci_t;

typedef struct {
    uint32_t id;
    uint32_t profile;           /* index into mokka_mig_t.profiles */
    uint32_t start;             /* first memory slice */
    uint32_t n_cis;             /* ci[0 .. n_cis-1], ascending id */
    mokka_ci_t ci[MOKKA_MIG_MAX_CIS];
} mokka_gi_t;

typedef struct {
    uint32_t n_profiles;        /* 0: no table (MIG can still be switched on where capable) */
    uint32_t gpu_slices;
    uint32_t memory_slices;
    uint32_t max_devices;       /* nvmlDeviceGetMaxMigDeviceCount with MIG on */
    mokka_gi_profile_t profiles[MOKKA_MIG_MAX_GI_PROFILES];
    uint32_t n_gis;             /* live: gis[0 .. n_gis-1], ascending id */
    uint32_t pad;
    mokka_gi_t gis[MOKKA_MIG_MAX_GIS];
} mokka_mig_t;

/* Time-varying metrics (gpumodel/dynamic.py compiles them; native/src/dynamic.c evaluates
 * them from the wall clock at every read, so every process on every node with the same
 * seed reads the same series). Index of mokka_gpu_t.patterns and mokka_faults_t.value. */
#define MOKKA_METRIC_POWER 0         /* milliwatts (power_usage) */
#define MOKKA_METRIC_TEMP_GPU 1      /* degrees C (temp_gpu) */
#define MOKKA_METRIC_TEMP_MEMORY 2   /* degrees C (temp_memory) */
#define MOKKA_METRIC_UTIL_GPU 3      /* percent (util_gpu) */
#define MOKKA_METRIC_UTIL_MEMORY 4   /* percent (util_memory) */
#define MOKKA_METRIC_MEM_USED 5      /* bytes (mem_used) */
#define MOKKA_METRIC_CLOCK_SM 6      /* MHz (clock_current graphics and SM) */
#define MOKKA_METRIC_CLOCK_MEM 7     /* MHz (clock_current memory) */
#define MOKKA_METRICS 8

/* mokka_pattern_t.kind */
#define MOKKA_PATTERN_NONE 0         /* the record's static field */
#define MOKKA_PATTERN_CONSTANT 1     /* a */
#define MOKKA_PATTERN_SINE 2         /* a + b * sin(2 pi (t + phase) / period), phase from the seed */
#define MOKKA_PATTERN_WALK 3         /* a seeded bounded walk between a and b, one step per period */
#define MOKKA_PATTERN_BUSY 4         /* a while the GPU has no processes, b while it has */
#define MOKKA_PATTERN_RAMP 5         /* a at start_ms, then straight to b over period_ms, then b */

/* Bits of mokka_faults_t.misc. */
#define MOKKA_FAULT_LOGGED 1         /* the kernel log has this GPU's once-per-load UUID lines */
#define MOKKA_FAULT_POWER_LIMIT 2    /* a power-limit fault holds: saved_*_limit are the profile's */
#define MOKKA_FAULT_FABRIC 4         /* a fabric fault holds: saved_fabric is the profile's */

typedef struct {
    uint32_t pid;
    uint32_t type;              /* 0 compute, 1 graphics */
    uint64_t used_memory;       /* bytes */
    char name[64];
} mokka_process_t;

/* A metric's pattern; units are the metric's (see MOKKA_METRIC_*). */
typedef struct {
    uint32_t kind;              /* MOKKA_PATTERN_* */
    uint32_t period_ms;         /* sine: the period; walk: one step; ramp: its duration */
    int64_t a;
    int64_t b;
    uint64_t seed;
    uint64_t start_ms;          /* wall clock (ms since the epoch) it applies from; 0: always */
} mokka_pattern_t;

/* What injected faults changed on one GPU, so that reads see them and `clear` can undo
 * exactly them. An override (kind != NONE) replaces a metric's pattern or static value
 * from its start_ms on (earlier samples still show the profile); counters (ECC, rows,
 * pages) were added to the record's own fields and are remembered here to be taken back. */
typedef struct {
    mokka_pattern_t override[MOKKA_METRICS];
    uint32_t flags_set;         /* MOKKA_GPU_* bits a fault set in flags (lost, remap pending/failure) */
    uint32_t saved_power_limit;         /* the profile's limits while a power-limit fault holds */
    uint32_t saved_enforced_limit;
    uint32_t nvlink_down;       /* links a fault took down (they were up) */
    uint32_t retired_pending;   /* pages wait for a driver reload */
    uint32_t remap_added[2];    /* rows added: correctable, uncorrectable */
    uint32_t retired_added[2];  /* pages added: single-bit, double-bit */
    uint32_t histogram_moved[5];  /* banks moved into each histogram bucket (out of `max`) */
    uint32_t misc;              /* MOKKA_FAULT_* */
    uint32_t saved_fabric;      /* while a fabric fault holds: state | health << 8 | status << 16 */
    uint64_t ecc_added[2][2][MOKKA_ECC_LOCATIONS];  /* as ecc_counts */
    uint64_t nvlink_errors[MOKKA_MAX_NVLINKS][MOKKA_NVLINK_COUNTERS];
} mokka_faults_t;

/* One NVML event. */
typedef struct {
    uint64_t seq;               /* node-wide order: mokka_node_t.events when it was raised */
    uint64_t type;              /* one nvmlEventType* bit */
    uint64_t data;              /* the Xid for Xid events, else 0 */
    uint64_t time_us;           /* wall clock */
    uint32_t gpu_instance;      /* MIG attribution; 0xFFFFFFFF: the whole GPU */
    uint32_t compute_instance;
} mokka_event_t;

/* The GPU's recent events: event number n (1-based) is ring[(n - 1) % MOKKA_EVENT_RING]. */
typedef struct {
    uint64_t count;             /* events raised on this GPU so far */
    mokka_event_t ring[MOKKA_EVENT_RING];
} mokka_events_t;

typedef struct {
    /* identity */
    char name[96];
    char uuid[80];
    char serial[32];
    char board_part_number[32];
    char gpu_part_number[32];
    char vbios_version[32];
    char inforom_image[32];
    char inforom_oem[16];
    char inforom_ecc[16];
    char inforom_power[16];
    char bus_id[32];            /* "00000000:1A:00.0" */
    uint32_t index;             /* index on the node, before any container filtering */
    uint32_t minor_number;
    uint32_t brand;             /* nvmlBrandType_t */
    uint32_t architecture;      /* nvmlDeviceArchitecture_t */
    uint32_t cc_major;
    uint32_t cc_minor;
    uint32_t board_id;
    uint32_t module_id;
    uint32_t flags;             /* MOKKA_GPU_* */
    uint32_t num_cores;
    uint32_t multiprocessor_count;  /* SMs, as CUDA reports them */
    uint32_t pad_sm;
    uint32_t memory_bus_width;

    /* PCI */
    uint32_t pci_domain;
    uint32_t pci_bus;
    uint32_t pci_device;
    uint32_t pci_function;
    uint32_t pci_device_id;     /* (device << 16) | vendor, as NVML reports it */
    uint32_t pci_subsystem_id;  /* (subsystem device << 16) | subsystem vendor */
    uint32_t pci_class;         /* 0x030200 */
    uint32_t pci_revision;
    uint32_t pcie_max_gen;
    uint32_t pcie_cur_gen;
    uint32_t pcie_max_width;
    uint32_t pcie_cur_width;
    uint32_t pcie_device_max_gen;   /* what the GPU could do; pcie_max_gen is what the link allows */
    uint32_t c2c_mode;              /* MOKKA_NA: no C2C link */
    uint32_t pcie_replay_counter;
    uint32_t pcie_tx_kbps;
    uint32_t pcie_rx_kbps;
    uint32_t numa_node;         /* MOKKA_NA: not reported */
    uint32_t irq;
    uint32_t pcie_switch;       /* the PCIe switch it shares with an InfiniBand adapter (1..); 0: none */
    uint64_t cpu_affinity[MOKKA_CPUSET_WORDS];

    /* memory */
    uint64_t mem_total;
    uint64_t mem_reserved;
    uint64_t mem_used;
    uint64_t bar1_total;
    uint64_t bar1_used;

    /* power */
    uint32_t power_usage;
    uint32_t power_limit;
    uint32_t power_default_limit;
    uint32_t power_min_limit;
    uint32_t power_max_limit;
    uint32_t power_enforced_limit;
    uint64_t energy_mj;
    uint32_t memory_power_usage;    /* MOKKA_NA: not metered */
    uint32_t module_power_usage;    /* module (superchip) scope; MOKKA_NA: not a module */
    uint32_t module_power_limit;
    uint32_t module_power_default_limit;
    uint32_t module_power_min_limit;
    uint32_t module_power_max_limit;

    /* temperatures */
    uint32_t temp_gpu;
    uint32_t temp_memory;
    uint32_t thresholds[MOKKA_THRESHOLD_COUNT]; /* nvmlTemperatureThresholds_t order */

    /* clocks */
    uint32_t clock_current[MOKKA_CLOCK_DOMAINS];
    uint32_t clock_max[MOKKA_CLOCK_DOMAINS];
    uint32_t clock_app[MOKKA_CLOCK_DOMAINS];
    uint32_t clock_default_app[MOKKA_CLOCK_DOMAINS];
    uint32_t clock_boost[MOKKA_CLOCK_DOMAINS];
    uint32_t n_mem_clocks;
    uint32_t mem_clocks[MOKKA_MAX_MEM_CLOCKS];
    uint32_t n_gfx_clocks[MOKKA_MAX_MEM_CLOCKS];
    uint32_t gfx_clocks[MOKKA_MAX_MEM_CLOCKS][MOKKA_MAX_GFX_CLOCKS];
    uint64_t clocks_event_reasons;
    uint64_t supported_event_reasons;
    uint32_t pstate;

    /* utilization */
    uint32_t util_gpu;
    uint32_t util_memory;
    uint32_t util_encoder;
    uint32_t util_decoder;
    uint32_t util_jpeg;
    uint32_t util_ofa;

    /* modes: nvmlEnableState_t / nvmlComputeMode_t values, MOKKA_NA when unsupported */
    uint32_t persistence_mode;
    uint32_t compute_mode;
    uint32_t ecc_current;
    uint32_t ecc_pending;
    uint32_t mig_current;
    uint32_t mig_pending;
    uint32_t display_mode;
    uint32_t display_active;
    uint32_t accounting_mode;
    uint32_t accounting_buffer;
    uint32_t virtualization_mode;
    uint32_t fan_count;
    uint32_t fan_speed;

    /* ECC counters: [error type: corrected, uncorrected][counter: volatile, aggregate][location] */
    uint64_t ecc_counts[2][2][MOKKA_ECC_LOCATIONS];

    /* row remapping */
    uint32_t remap_correctable;
    uint32_t remap_uncorrectable;
    uint32_t remap_histogram[5];  /* max, high, partial, low, none */
    uint32_t retired_sbe;
    uint32_t retired_dbe;

    /* NVLink */
    uint32_t nvlink_count;
    uint32_t nvlink_version;
    uint32_t nvlink_speed_mbps;   /* per link, MB/s as nvidia-smi shows "GB/s" x 1000 */
    uint32_t nvlink_active_mask;

    /* fabric (Hopper and later) */
    uint32_t fabric_state;
    uint32_t fabric_status;
    uint32_t clique_id;
    uint32_t fabric_ready_s;        /* wall clock (s since the epoch) the fabric manager is ready at: until then a
                                       Completed probe reads In Progress, as while the fabric is trained; 0: ready */
    uint8_t cluster_uuid[16];

    /* running processes */
    uint32_t n_procs;
    uint32_t pad2;
    mokka_process_t procs[MOKKA_MAX_PROCS];

    /* what nvidia-smi reads through its private table, and NVLink's far ends */
    uint32_t sparse_mode;           /* sparse operation mode 0/1; MOKKA_NA: not supported */
    uint32_t atomic_caps_out;       /* PCIe atomics as nvidia-smi lists them (bit 0 FETCHADD_32, 1 FETCHADD_64, */
    uint32_t atomic_caps_in;        /* 2 SWAP_32, 3 SWAP_64, 4 CAS_32, 5 CAS_64, 6 CAS_128); 0: N/A */
    uint32_t fabric_health;         /* nvmlGpuFabricInfo_v3_t healthMask */
    uint32_t nvlink_remote_device_id;   /* (device << 16) | vendor of the links' far end; 0: not known */
    uint32_t nvlink_remote[MOKKA_MAX_NVLINKS];  /* far end of each link: (domain << 16) | (bus << 8) | (device << 3) | function */

    /* MIG: mig_current / mig_pending above are the mode; this is the table and the layout */
    mokka_mig_t mig;

    /* time-varying metrics and faults (native/src/dynamic.c, gpumodel/faults.py) */
    mokka_pattern_t patterns[MOKKA_METRICS];
    mokka_faults_t faults;
    mokka_events_t events;
} mokka_gpu_t;

/* A PCI function beside the GPUs that nvidia-smi topo -m places relative to them: an InfiniBand
 * adapter (gpumodel/infiniband.py). The level between two functions is PIX on one PCIe switch,
 * NODE on one NUMA node, SYS otherwise. */
typedef struct {
    uint32_t pci;               /* (domain << 16) | (bus << 8) | (device << 3) | function */
    uint32_t numa_node;         /* MOKKA_NA: not reported */
    uint32_t pcie_switch;       /* as mokka_gpu_t's; 0: none */
    uint32_t pad;
} mokka_pci_peer_t;

/* Node-wide live data: the start of each copy. */
typedef struct {
    uint64_t generation;        /* completed updates since the state was compiled */
    uint64_t events;            /* events raised on any GPU: orders them across GPUs */
    uint64_t fault_tag;         /* which cluster fault entry the faults came from (k8snode/faultwatch.py); 0: none */
} mokka_node_t;

typedef struct {
    uint64_t magic;             /* MOKKA_STATE_MAGIC */
    uint32_t version;           /* MOKKA_STATE_VERSION */
    uint32_t header_size;       /* sizeof(mokka_header_t) */
    uint32_t node_size;         /* sizeof(mokka_node_t) */
    uint32_t gpu_size;          /* sizeof(mokka_gpu_t) */
    uint32_t gpu_count;
    uint32_t seq;               /* latch counter: readers use copy (seq & 1) */
    char driver_version[32];    /* "550.163.01" */
    char nvml_version[32];      /* "12.550.163.01" */
    uint32_t cuda_version;      /* 12040 */
    uint32_t pad0;
    char profile[64];           /* profile name, for diagnostics */
    uint32_t nic_count;
    uint32_t pad1;
    mokka_pci_peer_t nics[MOKKA_MAX_NICS];
} mokka_header_t;

/* The last bytes of a library file that carries the state. */
typedef struct {
    uint64_t state_offset;      /* where the region starts: a multiple of MOKKA_STATE_ALIGN */
    uint64_t state_size;        /* header + two copies */
    uint64_t magic;             /* MOKKA_TRAILER_MAGIC */
} mokka_trailer_t;

#endif
