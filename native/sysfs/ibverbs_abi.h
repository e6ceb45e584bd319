/*
 * The parts of libibverbs' public ABI (IBVERBS_1.1, <infiniband/verbs.h>) that ibverbs.c fills,
 * under names of their own so the shim builds without libibverbs-dev. Sizes and offsets are
 * checked against the real header by tests/test_infiniband.py where libibverbs-dev is installed.
 */
#ifndef MOKKA_IBVERBS_ABI_H
#define MOKKA_IBVERBS_ABI_H

#include <pthread.h>
#include <stdint.h>

struct mokka_ibv_device_attr {
    char fw_ver[64];
    uint64_t node_guid; /* network order */
    uint64_t sys_image_guid;
    uint64_t max_mr_size;
    uint64_t page_size_cap;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    int max_qp;
    int max_qp_wr;
    unsigned int device_cap_flags;
    int max_sge;
    int max_sge_rd;
    int max_cq;
    int max_cqe;
    int max_mr;
    int max_pd;
    int max_qp_rd_atom;
    int max_ee_rd_atom;
    int max_res_rd_atom;
    int max_qp_init_rd_atom;
    int max_ee_init_rd_atom;
    uint32_t atomic_cap; /* enum ibv_atomic_cap */
    int max_ee;
    int max_rdd;
    int max_mw;
    int max_raw_ipv6_qp;
    int max_raw_ethy_qp;
    int max_mcast_grp;
    int max_mcast_qp_attach;
    int max_total_mcast_qp_attach;
    int max_ah;
    int max_fmr;
    int max_map_per_fmr;
    int max_srq;
    int max_srq_wr;
    int max_srq_sge;
    uint16_t max_pkeys;
    uint8_t local_ca_ack_delay;
    uint8_t phys_port_cnt;
};

struct mokka_ibv_port_attr {
    uint32_t state; /* enum ibv_port_state */
    uint32_t max_mtu; /* enum ibv_mtu */
    uint32_t active_mtu;
    int gid_tbl_len;
    uint32_t port_cap_flags;
    uint32_t max_msg_sz;
    uint32_t bad_pkey_cntr;
    uint32_t qkey_viol_cntr;
    uint16_t pkey_tbl_len;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t lmc;
    uint8_t max_vl_num;
    uint8_t sm_sl;
    uint8_t subnet_timeout;
    uint8_t init_type_reply;
    uint8_t active_width;
    uint8_t active_speed;
    uint8_t phys_state;
    uint8_t link_layer;
    uint8_t flags;
    uint16_t port_cap_flags2;
};

union mokka_ibv_gid {
    uint8_t raw[16];
};

/* struct ibv_context: the device, 32 legacy operation slots, the descriptors, the lock, and
 * abi_compat (NULL here: not an extended context). */
struct mokka_ibv_context {
    void *device;
    void *ops[32];
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    pthread_mutex_t mutex;
    void *abi_compat;
};

#endif
