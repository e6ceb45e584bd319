/* nvidia-smi's private door: nvmlInternalGetExportTable.
 *
 * nvidia-smi asks for a table by a 16-byte id and refuses to run without it. Slot 0 holds
 * the table's size in bytes; nvidia-smi calls only the slots below that size, each slot
 * being a function pointer. Every other id is refused with NVML_ERROR_INVALID_ARGUMENT,
 * as the real library refuses ids it does not know.
 *
 * The table declares the real 550 size (0x7d8; nvidia-smi 535 calls nothing above 0x798).
 * Slots whose contract was established by experiment (a logging table, nvidia-smi 550.163.01
 * and 535.261.03, then changing one slot's answer and watching what nvidia-smi printed) are
 * served; every other slot answers NVML_ERROR_NOT_SUPPORTED without looking at its
 * arguments, which are not all pointers (0x488's second argument is a microsecond
 * timestamp, 0x528's is the integer 1). NOT_SUPPORTED makes the -q fields those slots feed
 * print "N/A" instead of the "Uninitialized" a size-8 table leaves.
 *
 * Established contracts (the same offsets in 535, 550 and 555 unless said otherwise). Each
 * was found by logging every slot call with its first six argument registers, then answering
 * one slot with chosen values and reading what each nvidia-smi printed (`-q`, `-q -x`,
 * `--query-gpu`); arguments listed are the ones nvidia-smi fills, registers beyond them held
 * left-over values:
 *   0x240 (device, unsigned int *supported): dmon/pmon ask it once per GPU. Failing it, or
 *         writing 0, prints "Not supported on the device(s)"; writing a non-zero 32-bit
 *         value lets dmon print its rows from the public API.
 *   0x288 (unsigned int index, char *buf, unsigned int length = 0x22): the PCI bus id of the
 *         GPU nvidia-smi enumerates as `index`, asked once per GPU in every mode. It is only
 *         printed when the GPU's handle cannot be had: "Unable to determine the device handle
 *         for GPU<bus id>: GPU is lost." (index instead when the slot fails). Answered in the
 *         4-digit-domain form real reports show ("0000:41:00.0"), lost GPUs included.
 *   0x360 (device, unsigned int *milliwatts): the enforced power limit for
 *         `--query-gpu=enforced.power.limit` (N/A when the slot fails, although the public
 *         nvmlDeviceGetEnforcedPowerLimit answers; `-q` uses the public call).
 *   0x6a8 / 0x6b0 / 0x6b8 (device, unsigned int *count, record *buf): compute / MPS /
 *         graphics processes. *count comes in as the capacity (500 in plain and -q, 250 in
 *         --query-compute-apps) and goes out as the number written. 4128-byte records:
 *         u32 pid at 0, u64 used memory in bytes at 8, u32 GPU instance id at 16 and compute
 *         instance id at 20 (0xFFFFFFFF prints N/A), name inline at 32 (NUL-terminated).
 *         0x6b0 is called only after 0x6a8 succeeds, 0x6b8 only after 0x6b0 does, and
 *         nothing is listed unless all three succeed; a pid in both the compute and the MPS
 *         list prints as type "M+C", graphics as "G". pmon (through a worker thread) also
 *         needs them: while they fail it retries forever and never prints.
 *   0x710 (device, struct { u32 outbound; u32 inbound; } *caps): PCIe atomic capabilities,
 *         "Atomic Caps Outbound/Inbound" in -q. Each word is a bit mask nvidia-smi prints as
 *         names: bit 0 FETCHADD_32, 1 FETCHADD_64, 2 SWAP_32, 3 SWAP_64, 4 CAS_32, 5 CAS_64,
 *         6 CAS_128 (higher bits print nothing); a word of 0 prints N/A.
 *   0x738 (device, char *buf, unsigned int length): GPU Part Number (length 0x50).
 *   0x768 has the same shape (length 0x14) and feeds FRU Part Number; real boards print
 *         N/A there, so it stays unsupported.
 *   0x780 (device, int *degrees): the GPU's T.Limit temperature, the margin between its
 *         temperature and its maximum operating temperature ("GPU T.Limit Temp",
 *         `temperature.gpu.tlimit`). Its success also switches the threshold lines of -q
 *         from "GPU Shutdown/Slowdown/Max Operating Temp" (public thresholds) to their
 *         "... T.Limit Temp" forms, which nvidia-smi reads as field values
 *         (NVML_FI_DEV_TEMPERATURE_*_TLIMIT, see fields.c). Real Ada, Hopper and Blackwell
 *         boards answer it; older ones print N/A and the plain thresholds.
 *   0x7c8 in 550 and 555, 0x798 in 535 (device, unsigned int *mode): sparse operation mode,
 *         0 printed Disabled, anything else Enabled. Each release calls only its own offset
 *         (535's table ends at 0x7a8, and 550/555 never call 0x798), so both are served.
 *   0x0b8 (const char *bus_id_a, const char *bus_id_b, int *level): `topo -m` asks it for
 *         every GPU pair (8-digit-domain bus id strings), and for every GPU and NIC pair (the
 *         NIC's bus id with a 4-digit domain, as hwloc found it in sysfs), and fails the whole
 *         matrix ("Failed to run topology matrix") unless it answers. Levels 0..4 are PIX, PXB,
 *         PHB, NODE, SYS and 5..22 NV1..NV18; nvidia-smi itself substitutes NV# for pairs
 *         it finds joined by NVLink through the public API.
 * Slots seen but left unsupported: 0x0d0 (called once per output line with nvidia-smi's
 * own format string "nvidia-smi %s: %s\n": a debug log), 0x488 (pmon, per-process
 * utilization since a timestamp), 0x528 (IBMNPU relaxed ordering; 555 also calls it with 2),
 * 0x688 (voltage), 0x730 (PCIe host max gen: the host's, not the board's), 0x740 (deferred
 * memory clock), 0x790 (addressing mode). What else feeds -q comes from the public API:
 * the SRAM ECC lines (nvmlDeviceGetSramEccErrorStatus), fabric health
 * (nvmlDeviceGetGpuFabricInfoV) and 555's capabilities (nvmlDeviceGetCapabilities). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static const unsigned char SMI_TABLE_ID[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                               0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};

#define SMI_TABLE_SIZE 0x7d8
#define SLOT(offset) ((offset) / 8)

enum { PROC_RECORD = 4128, PROC_NAME_AT = 32 };

static nvmlReturn_t unsupported(void) { return NVML_ERROR_NOT_SUPPORTED; }

static nvmlReturn_t sampling_supported(nvmlDevice_t device, unsigned int *supported) {
    GET_GPU(device, g);
    (void)g;
    if (!supported) return NVML_ERROR_INVALID_ARGUMENT;
    *supported = 1;
    return NVML_SUCCESS;
}

static nvmlReturn_t processes(nvmlDevice_t device, unsigned type, unsigned int *count, unsigned char *buf) {
    GET_GPU(device, g);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    mokka_process_t procs[MOKKA_MAX_PROCS];
    unsigned n = mokka_processes(g, type, procs);
    if (*count < n || (n && !buf)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        unsigned char *r = buf + (size_t)k * PROC_RECORD;
        memset(r, 0, PROC_RECORD);
        uint32_t no_instance = 0xFFFFFFFFu;
        memcpy(r, &procs[k].pid, 4);
        memcpy(r + 8, &procs[k].used_memory, 8);
        memcpy(r + 16, &no_instance, 4);
        memcpy(r + 20, &no_instance, 4);
        size_t len = strnlen(procs[k].name, sizeof procs[k].name);
        memcpy(r + PROC_NAME_AT, procs[k].name, len); /* record was zeroed: terminated */
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t compute_processes(nvmlDevice_t d, unsigned int *count, unsigned char *buf) {
    return processes(d, 0, count, buf);
}
static nvmlReturn_t mps_processes(nvmlDevice_t d, unsigned int *count, unsigned char *buf) {
    return processes(d, 2, count, buf);
}
static nvmlReturn_t graphics_processes(nvmlDevice_t d, unsigned int *count, unsigned char *buf) {
    return processes(d, 1, count, buf);
}

static nvmlReturn_t gpu_part_number(nvmlDevice_t device, char *buf, unsigned int length) {
    GET_GPU(device, g);
    char pn[sizeof g->gpu_part_number];
    MOKKA_READ(g, memcpy(pn, g->gpu_part_number, sizeof pn));
    return mokka_copy_string(buf, length, pn, sizeof pn);
}

static nvmlReturn_t bus_id_by_index(unsigned int index, char *buf, unsigned int length) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!buf || index >= g_mokka.visible_count) return NVML_ERROR_INVALID_ARGUMENT;
    const mokka_gpu_t *g = mokka_handle_gpu(&g_mokka.devices[index]); /* lost GPUs too */
    char id[32];
    snprintf(id, sizeof id, "%04X:%02X:%02X.%X", g->pci_domain & 0xffff, g->pci_bus, g->pci_device, g->pci_function);
    return mokka_copy_string(buf, length, id, sizeof id);
}

static nvmlReturn_t enforced_power_limit(nvmlDevice_t device, unsigned int *milliwatts) {
    return nvmlDeviceGetEnforcedPowerLimit(device, milliwatts);
}

static nvmlReturn_t atomic_caps(nvmlDevice_t device, uint32_t caps[2]) {
    GET_GPU(device, g);
    if (!caps) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->atomic_caps_out && !g->atomic_caps_in) return NVML_ERROR_NOT_SUPPORTED;
    caps[0] = g->atomic_caps_out;
    caps[1] = g->atomic_caps_in;
    return NVML_SUCCESS;
}

static nvmlReturn_t tlimit_temperature(nvmlDevice_t device, int *degrees) {
    GET_GPU(device, g);
    if (!degrees) return NVML_ERROR_INVALID_ARGUMENT;
    return mokka_tlimit_margin(g, degrees);
}

static nvmlReturn_t sparse_mode(nvmlDevice_t device, unsigned int *mode) {
    GET_GPU(device, g);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (mokka_is_na(g->sparse_mode)) return NVML_ERROR_NOT_SUPPORTED;
    *mode = g->sparse_mode;
    return NVML_SUCCESS;
}

enum { TOPO_PIX = 0, TOPO_NODE = 3, TOPO_SYS = 4 };

static nvmlReturn_t topology_level(const char *bus_id_a, const char *bus_id_b, int *level) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    uint32_t na, nb, sa, sb;
    if (!bus_id_a || !bus_id_b || !level || !mokka_pci_place(bus_id_a, &na, &sa) || !mokka_pci_place(bus_id_b, &nb, &sb))
        return NVML_ERROR_INVALID_ARGUMENT;
    *level = sa && sa == sb ? TOPO_PIX : na == nb ? TOPO_NODE : TOPO_SYS;
    return NVML_SUCCESS;
}

static void *smi_table[SLOT(SMI_TABLE_SIZE)];
static pthread_once_t smi_table_once = PTHREAD_ONCE_INIT;

static void smi_table_fill(void) {
    smi_table[0] = (void *)(uintptr_t)SMI_TABLE_SIZE;
    for (size_t i = 1; i < SLOT(SMI_TABLE_SIZE); i++) smi_table[i] = (void *)unsupported;
    smi_table[SLOT(0x0b8)] = (void *)topology_level;
    smi_table[SLOT(0x240)] = (void *)sampling_supported;
    smi_table[SLOT(0x6a8)] = (void *)compute_processes;
    smi_table[SLOT(0x6b0)] = (void *)mps_processes;
    smi_table[SLOT(0x6b8)] = (void *)graphics_processes;
    smi_table[SLOT(0x738)] = (void *)gpu_part_number;
    smi_table[SLOT(0x288)] = (void *)bus_id_by_index;
    smi_table[SLOT(0x360)] = (void *)enforced_power_limit;
    smi_table[SLOT(0x710)] = (void *)atomic_caps;
    smi_table[SLOT(0x780)] = (void *)tlimit_temperature;
    smi_table[SLOT(0x798)] = (void *)sparse_mode; /* 535 */
    smi_table[SLOT(0x7c8)] = (void *)sparse_mode; /* 550, 555 */
}

EXPORT nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *id) {
    if (!table || !id) return NVML_ERROR_INVALID_ARGUMENT;
    if (memcmp(id, SMI_TABLE_ID, sizeof SMI_TABLE_ID) != 0) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_once(&smi_table_once, smi_table_fill);
    *table = smi_table;
    return NVML_SUCCESS;
}
