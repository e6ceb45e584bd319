/* DCGM field metadata, one FIELD(name, id, type, size, tag, scope, entity level) per line.
 * Facts only, read and written down by hand (not copied): field ids from dcgm_fields.h; type,
 * size (0 = variable/unspecified), tag, scope and entity level as NVIDIA/DCGM registers them
 * in dcgmlib/src/dcgm_fields.cpp. No include guard: this is expanded inside a FIELD macro. */

/* --- global (no entity) --- */
FIELD(DCGM_FI_DRIVER_VERSION,                           1, 's', 0, "driver_version",                    DCGM_FS_GLOBAL, DCGM_FE_NONE)
FIELD(DCGM_FI_NVML_VERSION,                             2, 's', 0, "nvml_version",                      DCGM_FS_GLOBAL, DCGM_FE_NONE)
FIELD(DCGM_FI_PROCESS_NAME,                             3, 's', 0, "process_name",                      DCGM_FS_GLOBAL, DCGM_FE_NONE)
FIELD(DCGM_FI_DEV_COUNT,                                4, 'i', 8, "device_count",                      DCGM_FS_GLOBAL, DCGM_FE_NONE)
FIELD(DCGM_FI_CUDA_DRIVER_VERSION,                      5, 'i', 0, "cuda_driver_version",               DCGM_FS_GLOBAL, DCGM_FE_NONE)

/* --- device identity, inforom, modes --- */
FIELD(DCGM_FI_DEV_NAME,                                50, 's', 0, "name",                              DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_BRAND,                               51, 's', 0, "brand",                             DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_NVML_INDEX,                          52, 'i', 8, "nvml_index",                        DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_SERIAL,                              53, 's', 0, "serial_number",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_UUID,                                54, 's', 0, "uuid",                              DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_MINOR_NUMBER,                        55, 'i', 8, "minor_number",                      DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_OEM_INFOROM_VER,                     56, 's', 0, "oem_inforom_version",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCI_BUSID,                           57, 's', 0, "pci_busid",                         DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCI_COMBINED_ID,                     58, 'i', 8, "pci_combined_id",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCI_SUBSYS_ID,                       59, 'i', 8, "pci_subsys_id",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_COMPUTE_MODE,                        65, 'i', 8, "compute_mode",                      DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PERSISTENCE_MODE,                    66, 'i', 8, "persistance_mode",                  DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MIG_MODE,                            67, 'i', 8, "mig_mode",                          DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CUDA_VISIBLE_DEVICES_STR,            68, 's', 0, "cuda_visible_devices",              DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_MIG_MAX_SLICES,                      69, 'i', 8, "mig_max_slices",                    DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CPU_AFFINITY_0,                     70, 'i', 8, "cpu_affinity_0",                  DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CPU_AFFINITY_1,                     71, 'i', 8, "cpu_affinity_1",                  DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CPU_AFFINITY_2,                     72, 'i', 8, "cpu_affinity_2",                  DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CPU_AFFINITY_3,                     73, 'i', 8, "cpu_affinity_3",                  DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CC_MODE,                             74, 'i', 8, "cc_mode",                           DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MIG_GI_INFO,                         76, 'b', 0, "mig_gi_info",                       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MIG_CI_INFO,                         77, 'b', 0, "mig_ci_info",                       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ECC_INFOROM_VER,                     80, 's', 0, "ecc_inforom_version",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_INFOROM_VER,                   81, 's', 0, "power_inforom_version",             DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_INFOROM_IMAGE_VER,                   82, 's', 0, "inforom_image_version",             DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_INFOROM_CONFIG_CHECK,                83, 'i', 8, "inforom_config_checksum",           DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_INFOROM_CONFIG_VALID,                84, 'i', 8, "inforom_config_valid",              DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_VBIOS_VERSION,                       85, 's', 0, "vbios_version",                     DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- clocks --- */
FIELD(DCGM_FI_DEV_SM_CLOCK,                           100, 'i', 8, "sm_clock",                          DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MEM_CLOCK,                          101, 'i', 8, "memory_clock",                      DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_VIDEO_CLOCK,                        102, 'i', 8, "video_clock",                       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_APP_SM_CLOCK,                       110, 'i', 8, "sm_app_clock",                      DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_APP_MEM_CLOCK,                      111, 'i', 8, "mem_app_clock",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CLOCKS_EVENT_REASONS,               112, 'i', 0, "current_clocks_event_reasons",      DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MAX_SM_CLOCK,                       113, 'i', 8, "sm_max_clock",                      DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MAX_MEM_CLOCK,                      114, 'i', 8, "memory_max_clock",                  DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MAX_VIDEO_CLOCK,                    115, 'i', 8, "video_max_clock",                   DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- temperature, power, performance state --- */
FIELD(DCGM_FI_DEV_MEMORY_TEMP,                        140, 'i', 8, "memory_temp",                       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_GPU_TEMP,                           150, 'i', 8, "gpu_temp",                          DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MEM_MAX_OP_TEMP,                    151, 'i', 8, "gpu_mem_max_op_temp",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_GPU_MAX_OP_TEMP,                    152, 'i', 8, "gpu_max_op_temp",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_GPU_TEMP_LIMIT,                     153, 'i', 8, "gpu_temp_tlimit",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_USAGE,                        155, 'd', 8, "power_usage",                       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,           156, 'i', 8, "total_energy_consumption",          DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_USAGE_INSTANT,                157, 'd', 8, "power_usage_instant",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_SLOWDOWN_TEMP,                      158, 'i', 8, "slowdown_temp",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_SHUTDOWN_TEMP,                      159, 'i', 8, "shutdown_temp",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_MGMT_LIMIT,                   160, 'd', 8, "power_management_limit",            DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN,               161, 'd', 8, "power_management_limit_min",        DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX,               162, 'd', 8, "power_management_limit_max",        DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF,               163, 'd', 8, "power_management_limit_default",    DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ENFORCED_POWER_LIMIT,               164, 'd', 8, "enforced_power_limit",              DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PSTATE,                             190, 'i', 8, "pstate",                            DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_FAN_SPEED,                          191, 'i', 8, "fan_speed",                         DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- PCIe throughput, utilization, accounting --- */
FIELD(DCGM_FI_DEV_PCIE_TX_THROUGHPUT,                 200, 'i', 8, "pcie_tx_throughput",                DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCIE_RX_THROUGHPUT,                 201, 'i', 8, "pcie_rx_throughput",                DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCIE_REPLAY_COUNTER,                202, 'i', 8, "pcie_replay_counter",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_GPU_UTIL,                           203, 'i', 8, "gpu_utilization",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_MEM_COPY_UTIL,                      204, 'i', 8, "mem_copy_utilization",              DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ACCOUNTING_DATA,                    205, 'b', 0, "accounting_data",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ENC_UTIL,                           206, 'i', 8, "enc_utilization",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_DEC_UTIL,                           207, 'i', 8, "dec_utilization",                   DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- XID, PCIe link, clock-violation counters --- */
FIELD(DCGM_FI_DEV_XID_ERRORS,                         230, 'i', 8, "xid_errors",                        DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_PCIE_MAX_LINK_GEN,                  235, 'i', 8, "pcie_max_link_gen",                 DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH,                236, 'i', 8, "pcie_max_link_width",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCIE_LINK_GEN,                      237, 'i', 8, "pcie_link_gen",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_PCIE_LINK_WIDTH,                    238, 'i', 8, "pcie_link_width",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_POWER_VIOLATION,                    240, 'i', 8, "power_violation",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_THERMAL_VIOLATION,                  241, 'i', 8, "thermal_violation",                 DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_SYNC_BOOST_VIOLATION,               242, 'i', 8, "sync_boost_violation",              DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_BOARD_LIMIT_VIOLATION,              243, 'i', 8, "board_limit_violation",             DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_LOW_UTIL_VIOLATION,                 244, 'i', 8, "low_util_violation",                DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_RELIABILITY_VIOLATION,              245, 'i', 8, "reliability_violation",             DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION,         246, 'i', 8, "app_clock_violation",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION,        247, 'i', 8, "base_clock_violation",              DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- framebuffer --- */
FIELD(DCGM_FI_DEV_FB_TOTAL,                           250, 'i', 8, "fb_total",                          DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_FB_FREE,                            251, 'i', 8, "fb_free",                           DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_FB_USED,                            252, 'i', 8, "fb_used",                           DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_FB_RESERVED,                        253, 'i', 8, "fb_resv",                           DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_DEV_FB_USED_PERCENT,                    254, 'd', 8, "fb_USDP",                           DCGM_FS_DEVICE, DCGM_FE_GPU_CI)

/* --- ECC --- */
FIELD(DCGM_FI_DEV_ECC_CURRENT,                        300, 'i', 8, "ecc",                               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ECC_PENDING,                        301, 'i', 8, "ecc_pending",                       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,                  310, 'i', 8, "ecc_sbe_volatile_total",            DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,                  311, 'i', 8, "ecc_dbe_volatile_total",            DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ECC_SBE_AGG_TOTAL,                  312, 'i', 8, "ecc_sbe_aggregate_total",           DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ECC_DBE_AGG_TOTAL,                  313, 'i', 8, "ecc_dbe_aggregate_total",           DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- retired pages, row remapping --- */
FIELD(DCGM_FI_DEV_RETIRED_SBE,                        390, 'i', 8, "retired_pages_sbe",                 DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_RETIRED_DBE,                        391, 'i', 8, "retired_pages_dbe",                 DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_RETIRED_PENDING,                    392, 'i', 8, "retired_pages_pending",             DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,        393, 'i', 8, "uncorrectable_remapped_rows",       DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,          394, 'i', 8, "correctable_remapped_rows",         DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ROW_REMAP_FAILURE,                  395, 'i', 8, "row_remap_failure",                 DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_ROW_REMAP_PENDING,                  396, 'i', 8, "row_remap_pending",                 DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- NVLink (totals; one per-link example) --- */
FIELD(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,  409, 'i', 8, "nvlink_flit_crc_error_count_total", DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,  419, 'i', 8, "nvlink_data_crc_error_count_total", DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,    429, 'i', 8, "nvlink_replay_error_count_total",   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,  439, 'i', 8, "nvlink_recovery_error_count_total", DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_NVLINK_BANDWIDTH_L0,                440, 'i', 8, "nvlink_bandwidth_l0",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,             449, 'i', 8, "nvlink_bandwidth_total",            DCGM_FS_DEVICE, DCGM_FE_GPU)

/* --- virtualization / vGPU --- */
FIELD(DCGM_FI_DEV_VIRTUAL_MODE,                       500, 'i', 8, "virtualization_mode",               DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_DEV_VGPU_LICENSE_STATUS,                526, 'i', 8, "vgpu_instance_license_status",      DCGM_FS_DEVICE, DCGM_FE_VGPU)

/* --- profiling (DCP) --- */
FIELD(DCGM_FI_PROF_GR_ENGINE_ACTIVE,                 1001, 'd', 0, "gr_engine_active",                  DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_SM_ACTIVE,                        1002, 'd', 0, "sm_active",                         DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_SM_OCCUPANCY,                     1003, 'd', 0, "sm_occupancy",                      DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,               1004, 'd', 0, "tensor_active",                     DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_DRAM_ACTIVE,                      1005, 'd', 0, "dram_active",                       DCGM_FS_DEVICE, DCGM_FE_GPU_I)
FIELD(DCGM_FI_PROF_PIPE_FP64_ACTIVE,                 1006, 'd', 0, "fp64_active",                       DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PIPE_FP32_ACTIVE,                 1007, 'd', 0, "fp32_active",                       DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PIPE_FP16_ACTIVE,                 1008, 'd', 0, "fp16_active",                       DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PCIE_TX_BYTES,                    1009, 'i', 0, "pcie_tx_bytes",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_PROF_PCIE_RX_BYTES,                    1010, 'i', 0, "pcie_rx_bytes",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_PROF_NVLINK_TX_BYTES,                  1011, 'i', 0, "nvlink_tx_bytes",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_PROF_NVLINK_RX_BYTES,                  1012, 'i', 0, "nvlink_rx_bytes",                   DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE,          1013, 'd', 0, "tensor_imma_active",                DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE,          1014, 'd', 0, "tensor_hmma_active",                DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE,          1015, 'd', 0, "tensor_dfma_active",                DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_PIPE_INT_ACTIVE,                  1016, 'd', 0, "integer_active",                    DCGM_FS_DEVICE, DCGM_FE_GPU_CI)
FIELD(DCGM_FI_PROF_NVDEC0_ACTIVE,                    1017, 'd', 0, "nvdec0_active",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_PROF_NVJPG0_ACTIVE,                    1025, 'd', 0, "nvjpg0_active",                     DCGM_FS_DEVICE, DCGM_FE_GPU)
FIELD(DCGM_FI_PROF_NVOFA0_ACTIVE,                    1033, 'd', 0, "nvofa0_active",                     DCGM_FS_DEVICE, DCGM_FE_GPU)

/* Notes on the list above.
 *  - Skipped: none. Every requested field is defined by dcgm_fields.h and was found registered in
 *    dcgm_fields.cpp (the 2025 revision whose macro names match this header); nothing is guessed.
 *    DCGM_FI_DEV_GPU_TEMP_LIMIT (153) is included as well, since it sits in the temperature range.
 *  - Names: 112 is written as DCGM_FI_DEV_CLOCKS_EVENT_REASONS (the header keeps
 *    DCGM_FI_DEV_CLOCK_THROTTLE_REASONS as an alias). 449 and 440 are written under the names that
 *    dcgm-exporter uses, DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL / _L0; in this header those are aliases
 *    of DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL / _L0.
 *  - Sizes are written exactly as DCGM registers them, including the odd ones: 0 for
 *    CUDA_DRIVER_VERSION and CLOCKS_EVENT_REASONS (both int64) and 0 for every PROF_* field.
 *    Tags are also DCGM's own spellings ("persistance_mode", "fb_USDP", "fb_resv").
 *  - DCGM_FS_DEVICE is the header's deprecated alias for DCGM_FS_ENTITY (1).
 *  - Fields taken from dcgm-exporter etc/dcp-metrics-included.csv: all of them were already in
 *    the lists above, so nothing was added for that file.
 *
 * Sanity check: dcgm-exporter default-counters.csv (uncommented lines, 26 in all), with their ids:
 *    1 DRIVER_VERSION             100 SM_CLOCK                   101 MEM_CLOCK
 *  140 MEMORY_TEMP                150 GPU_TEMP                   155 POWER_USAGE
 *  156 TOTAL_ENERGY_CONSUMPTION   202 PCIE_REPLAY_COUNTER        203 GPU_UTIL
 *  204 MEM_COPY_UTIL              206 ENC_UTIL                   207 DEC_UTIL
 *  230 XID_ERRORS                 251 FB_FREE                    252 FB_USED
 *  253 FB_RESERVED                393 UNCORRECTABLE_REMAPPED_ROWS 394 CORRECTABLE_REMAPPED_ROWS
 *  395 ROW_REMAP_FAILURE          449 NVLINK_BANDWIDTH_TOTAL     526 VGPU_LICENSE_STATUS
 * 1001 PROF_GR_ENGINE_ACTIVE     1004 PROF_PIPE_TENSOR_ACTIVE   1005 PROF_DRAM_ACTIVE
 * 1009 PROF_PCIE_TX_BYTES        1010 PROF_PCIE_RX_BYTES
 * All 26 appear in this table. */
