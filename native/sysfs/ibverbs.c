/*
 * libibverbs' device verbs for the staged adapters (ibv_devinfo, and any program that opens an
 * adapter to read its attributes).
 *
 * libibverbs lists the staged adapters by itself (sysfs, and Debian's mlx5 provider matching them
 * by modalias); opening one would hand the provider the kernel's uverbs device, which is not
 * there. So, for an adapter of the staged tree only, ibv_open_device returns a context of the
 * legacy (non-extended) kind, which makes libibverbs' inline wrappers (ibv_query_device_ex,
 * ibv_query_port) fall back to the exported calls answered here from the adapter's sysfs files:
 * ibv_query_device, ibv_query_port, ibv_query_gid, ibv_query_gid_type, ibv_query_pkey,
 * ibv_close_device. The data path is not simulated: ibv_alloc_pd, ibv_create_cq and
 * ibv_create_comp_channel on such a context fail with EOPNOTSUPP. Any other adapter, and every
 * call without MOKKA_SYSFS_ROOT, goes to libibverbs.
 *
 * The structures below are libibverbs' public ABI (IBVERBS_1.1, <infiniband/verbs.h>), declared
 * here so the shim builds without libibverbs-dev; a test compares them with the real header.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "ibverbs_abi.h"
#include "shim.h"

/* The device limits mlx5 reports for a ConnectX-6/7 adapter (ibv_devinfo -v). */
static const struct mokka_ibv_device_attr MLX5_LIMITS = {
    .max_mr_size = UINT64_MAX,
    .page_size_cap = 0xfffffffffffff000ULL,
    .vendor_id = 0x02c9,
    .max_qp = 131072,
    .max_qp_wr = 32768,
    .device_cap_flags = 0x21361c36,
    .max_sge = 30,
    .max_sge_rd = 30,
    .max_cq = 16777216,
    .max_cqe = 4194303,
    .max_mr = 16777216,
    .max_pd = 8388608,
    .max_qp_rd_atom = 16,
    .max_res_rd_atom = 2097152,
    .max_qp_init_rd_atom = 16,
    .atomic_cap = 1, /* IBV_ATOMIC_HCA */
    .max_mw = 16777216,
    .max_mcast_grp = 2097152,
    .max_mcast_qp_attach = 240,
    .max_total_mcast_qp_attach = 503316480,
    .max_ah = 2147483647,
    .max_srq = 8388608,
    .max_srq_wr = 32767,
    .max_srq_sge = 31,
    .max_pkeys = 128,
    .local_ca_ack_delay = 16,
};

/* A context this file made: libibverbs' legacy context (zeroed: abi_compat NULL), and the name. */
struct context {
    struct mokka_ibv_context ctx;
    char name[64];
    struct context *next;
};

static struct context *g_contexts;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static struct context *ours(void *ctx) {
    pthread_mutex_lock(&g_lock);
    struct context *c = g_contexts;
    while (c != NULL && &c->ctx != ctx)
        c = c->next;
    pthread_mutex_unlock(&g_lock);
    return c;
}

/* A GUID file as the network-order value the verbs carry. */
static uint64_t guid_be(const char *name, const char *rel) { return htobe64(adapter_guid(name, rel)); }

HOOK struct mokka_ibv_context *ibv_open_device(void *device) {
    const char *(*name_of)(void *) = (const char *(*)(void *))dlsym(RTLD_NEXT, "ibv_get_device_name");
    const char *name = name_of != NULL && device != NULL ? name_of(device) : NULL;
    char buf[64];
    if (name == NULL || !shim_enabled() || adapter_text(name, "node_guid", buf, sizeof buf) < 0)
        return CALL(ibv_open_device, NULL, device);
    struct context *c = calloc(1, sizeof *c);
    if (c == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    c->ctx.device = device;
    c->ctx.cmd_fd = c->ctx.async_fd = -1;
    c->ctx.num_comp_vectors = 1;
    snprintf(c->name, sizeof c->name, "%s", name);
    pthread_mutex_lock(&g_lock);
    c->next = g_contexts;
    g_contexts = c;
    pthread_mutex_unlock(&g_lock);
    return &c->ctx;
}

HOOK int ibv_close_device(struct mokka_ibv_context *ctx) {
    struct context *c = ours(ctx);
    if (c == NULL)
        return CALL(ibv_close_device, -1, ctx);
    pthread_mutex_lock(&g_lock);
    for (struct context **p = &g_contexts; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    free(c);
    return 0;
}

HOOK int ibv_query_device(struct mokka_ibv_context *ctx, struct mokka_ibv_device_attr *attr) {
    struct context *c = ours(ctx);
    if (c == NULL)
        return CALL(ibv_query_device, -1, ctx, attr);
    *attr = MLX5_LIMITS;
    adapter_text(c->name, "fw_ver", attr->fw_ver, sizeof attr->fw_ver);
    attr->node_guid = guid_be(c->name, "node_guid");
    attr->sys_image_guid = guid_be(c->name, "sys_image_guid");
    attr->vendor_part_id = (uint32_t)adapter_num(c->name, "device/device");
    attr->hw_ver = (uint32_t)adapter_num(c->name, "hw_rev");
    attr->phys_port_cnt = (uint8_t)adapter_ports(c->name);
    return 0;
}

/* IBV_SPEED_*, per lane speed; XDR (200 Gb/s a lane) has no code in rdma-core 44's 8-bit field. */
static uint8_t verbs_speed(enum ib_speed s) {
    static const uint8_t codes[] = {
        [SPEED_SDR] = 1, [SPEED_DDR] = 2, [SPEED_QDR] = 4, [SPEED_FDR10] = 8,
        [SPEED_FDR] = 16, [SPEED_EDR] = 32, [SPEED_HDR] = 64, [SPEED_NDR] = 128,
    };
    return (size_t)s < sizeof codes ? codes[s] : 0;
}

HOOK int ibv_query_port(struct mokka_ibv_context *ctx, uint8_t port, struct mokka_ibv_port_attr *attr) {
    struct context *c = ours(ctx);
    if (c == NULL)
        return CALL(ibv_query_port, -1, ctx, port, attr);
    char rel[64], buf[64];
    snprintf(rel, sizeof rel, "ports/%d/state", port);
    if (adapter_text(c->name, rel, buf, sizeof buf) < 0)
        return EINVAL;
    memset(attr, 0, sizeof *attr);
    attr->state = (uint32_t)adapter_port_num(c->name, port, "state");
    attr->max_mtu = 5; /* IBV_MTU_4096 */
    attr->active_mtu = attr->state == 4 ? 5 : 1;
    attr->gid_tbl_len = 0;
    for (int i = 0; i < 256; i++) {
        snprintf(rel, sizeof rel, "ports/%d/gids/%d", port, i);
        if (adapter_text(c->name, rel, buf, sizeof buf) < 0)
            break;
        attr->gid_tbl_len = i + 1;
    }
    attr->port_cap_flags = (uint32_t)adapter_port_num(c->name, port, "cap_mask");
    attr->max_msg_sz = 0x40000000;
    attr->pkey_tbl_len = 128;
    attr->lid = (uint16_t)adapter_port_num(c->name, port, "lid");
    attr->sm_lid = (uint16_t)adapter_port_num(c->name, port, "sm_lid");
    attr->lmc = (uint8_t)adapter_port_num(c->name, port, "lid_mask_count");
    attr->max_vl_num = 3; /* VL0-3 */
    attr->sm_sl = (uint8_t)adapter_port_num(c->name, port, "sm_sl");
    attr->subnet_timeout = 18;
    struct ib_rate rate = adapter_rate(c->name, port);
    attr->active_width = (uint8_t)rate.width;
    attr->active_speed = verbs_speed(rate.speed);
    attr->phys_state = (uint8_t)adapter_port_num(c->name, port, "phys_state");
    snprintf(rel, sizeof rel, "ports/%d/link_layer", port);
    attr->link_layer = adapter_text(c->name, rel, buf, sizeof buf) >= 0 && strcmp(buf, "Ethernet") == 0 ? 2 : 1;
    return 0;
}

HOOK int ibv_query_gid(struct mokka_ibv_context *ctx, uint8_t port, int index, union mokka_ibv_gid *gid) {
    struct context *c = ours(ctx);
    if (c == NULL)
        return CALL(ibv_query_gid, -1, ctx, port, index, gid);
    char rel[64], buf[128];
    snprintf(rel, sizeof rel, "ports/%d/gids/%d", port, index);
    if (adapter_text(c->name, rel, buf, sizeof buf) < 0) {
        errno = EINVAL;
        return -1;
    }
    /* "fe80:0000:0000:0000:a088:c203:0012:3456": the subnet prefix, then the interface id. */
    char prefix[20];
    snprintf(prefix, sizeof prefix, "%.19s", buf);
    uint64_t halves[2] = {htobe64(guid_parse(prefix)), htobe64(strlen(buf) > 20 ? guid_parse(buf + 20) : 0)};
    memcpy(gid->raw, halves, sizeof halves);
    return 0;
}

HOOK int ibv_query_gid_type(struct mokka_ibv_context *ctx, uint8_t port, unsigned int index, unsigned int *type) {
    struct context *c = ours(ctx);
    if (c == NULL)
        return CALL(ibv_query_gid_type, -1, ctx, port, index, type);
    *type = 0; /* IB/RoCE v1: an InfiniBand port's only kind */
    return 0;
}

HOOK int ibv_query_pkey(struct mokka_ibv_context *ctx, uint8_t port, int index, uint16_t *pkey) {
    struct context *c = ours(ctx);
    if (c == NULL)
        return CALL(ibv_query_pkey, -1, ctx, port, index, pkey);
    char rel[64];
    snprintf(rel, sizeof rel, "ports/%d/pkeys/%d", port, index);
    *pkey = htons((uint16_t)adapter_num(c->name, rel));
    return 0;
}

/* The data path is not simulated. */
#define NO_DATA_PATH(fn, ...)                                                 \
    HOOK void *fn(struct mokka_ibv_context *ctx, ##__VA_ARGS__)

NO_DATA_PATH(ibv_alloc_pd) {
    if (ours(ctx) == NULL)
        return CALL(ibv_alloc_pd, NULL, ctx);
    errno = EOPNOTSUPP;
    return NULL;
}

NO_DATA_PATH(ibv_create_comp_channel) {
    if (ours(ctx) == NULL)
        return CALL(ibv_create_comp_channel, NULL, ctx);
    errno = EOPNOTSUPP;
    return NULL;
}

NO_DATA_PATH(ibv_create_cq, int cqe, void *user, void *channel, int vector) {
    if (ours(ctx) == NULL)
        return CALL(ibv_create_cq, NULL, ctx, cqe, user, channel, vector);
    errno = EOPNOTSUPP;
    return NULL;
}
