/*
 * The kernel's umad device (ib_umad) for the MAD tools of infiniband-diags (perfquery, ibaddr,
 * sminfo, smpquery): libibumad and libibmad run unmodified; only the device file is answered.
 *
 * /dev/infiniband/umadN opens as one end of a SOCK_SEQPACKET socket pair, whose other end a
 * responder thread holds. libibumad's write() of a struct ib_user_mad (header + MAD) reaches the
 * responder as one message; its answer comes back as one message, which read() and poll() see
 * as they see the kernel's. The ioctls ib_umad takes (agent registration, P_Key index mode) are
 * answered for these descriptors alone; every other descriptor goes to the next ioctl().
 *
 * The node's own adapter answers from its staged sysfs (under MOKKA_SYSFS_ROOT, so a fault
 * written there shows at once); the rest of the subnet (the leaf and spine switches, the other
 * nodes' adapters) from the fabric host setup writes beside it (FABRIC, gpumodel/fabric.py):
 *
 *     SMP, directed route (walked link by link through the fabric) or to a LID:
 *         NodeDescription, NodeInfo, PortInfo; SwitchInfo of a switch
 *     SMP to the SM LID:                 SMInfo (the spine runs the master subnet manager)
 *     PerfMgmt to the port's own LID:    ClassPortInfo, PortCounters, PortCountersExtended
 *
 * An attribute a reachable node does not know is answered with MAD status "unsupported"; a MAD
 * nobody can receive (a LID nobody holds, a path through a link that is down, another node's
 * counters) gets no answer, and the tool times out as it would. Field offsets are the InfiniBand
 * Architecture Specification's (volume 1, chapters 14 and 16); tests read the answers with
 * libibmad's own decoders (smpquery, ibnetdiscover).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <rdma/ib_user_mad.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

enum {
    MAD_SIZE = 256,
    DATA = 64, /* the attribute's data in an SMP and in a PerfMgmt MAD */
    CLASS_SMI = 0x01,
    CLASS_SMI_DIRECT = 0x81,
    CLASS_PERF = 0x04,
    METHOD_GET = 0x01,
    METHOD_SET = 0x02,
    METHOD_GET_RESP = 0x81,
    ATTR_CLASS_PORT_INFO = 0x0001,
    ATTR_NODE_DESC = 0x0010,
    ATTR_NODE_INFO = 0x0011,
    ATTR_PORT_INFO = 0x0015,
    ATTR_SWITCH_INFO = 0x0012,
    ATTR_SM_INFO = 0x0020,
    STATUS_UNSUPPORTED = 0x000c, /* the method/attribute combination is not supported */
    ATTR_PORT_COUNTERS = 0x0012,
    ATTR_PORT_COUNTERS_EXT = 0x001D,
    FDS = 4096, /* descriptors tracked; a umad device opened above this is not answered */
};

/* The subnet around the node's adapters, as host setup (or the local cluster) lays it out. */
static const char FABRIC[] = "/sys/class/infiniband_mad/.mokka-fabric";
static const uint32_t VENDOR_ID = 0x0002c9; /* Mellanox's IEEE OUI, as NodeInfo carries it */
static const uint16_t PERF_CAP_MASK = 0x5a00; /* ClassPortInfo of a ConnectX port's PerfMgmt agent */

static unsigned char g_fds[FDS / 8];

static int tracked(int fd) {
    return fd >= 0 && fd < FDS && (__atomic_load_n(&g_fds[fd / 8], __ATOMIC_ACQUIRE) >> (fd % 8)) & 1;
}

static void track(int fd, int on) {
    if (fd < 0 || fd >= FDS)
        return;
    unsigned char bit = (unsigned char)(1u << (fd % 8));
    if (on)
        __atomic_fetch_or(&g_fds[fd / 8], bit, __ATOMIC_ACQ_REL);
    else
        __atomic_fetch_and(&g_fds[fd / 8], (unsigned char)~bit, __ATOMIC_ACQ_REL);
}

/* ---- the port's staged files ------------------------------------------------------------ */

struct port {
    char ca[64];
    int number;
};

static int read_text(const struct port *p, const char *rel, char *buf, size_t size) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/%s", p->ca, rel);
    return shim_read(path, buf, size);
}

static uint64_t read_u64(const struct port *p, const char *rel) {
    char buf[128];
    if (read_text(p, rel, buf, sizeof buf) < 0)
        return 0;
    return strtoull(buf, NULL, 0);
}

static uint64_t port_u64(const struct port *p, const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "ports/%d/%s", p->number, name);
    return read_u64(p, rel);
}

/* "4: ACTIVE" and the like: the number before the colon. */
static unsigned port_enum(const struct port *p, const char *name) { return (unsigned)port_u64(p, name); }

/* A GUID as sysfs spells it ("a088:c203:0012:3456"). */
static uint64_t parse_guid(const char *s) {
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s == ':')
            continue;
        int d = (*s >= '0' && *s <= '9') ? *s - '0' : (*s | 0x20) - 'a' + 10;
        if (d < 0 || d > 15)
            break;
        v = v << 4 | (uint64_t)d;
    }
    return v;
}

static uint64_t guid_file(const struct port *p, const char *rel) {
    char buf[128];
    return read_text(p, rel, buf, sizeof buf) < 0 ? 0 : parse_guid(buf);
}

/* The port's GUID: GID 0's interface id (its last four groups). */
static uint64_t port_guid(const struct port *p) {
    char rel[64], buf[128];
    snprintf(rel, sizeof rel, "ports/%d/gids/0", p->number);
    if (read_text(p, rel, buf, sizeof buf) < 20)
        return 0;
    return parse_guid(buf + 20);
}

static int num_ports(const struct port *p) {
    int n = 0;
    char rel[64], buf[64];
    for (int i = 1; i <= 8; i++) {
        snprintf(rel, sizeof rel, "ports/%d/state", i);
        if (read_text(p, rel, buf, sizeof buf) >= 0)
            n = i;
    }
    return n;
}

/* The rate string "400 Gb/sec (4X NDR)": PortInfo's width and extended speed codes. */
static void link_codes(const struct port *p, unsigned *width, unsigned *speed_ext) {
    char rel[64], buf[128];
    snprintf(rel, sizeof rel, "ports/%d/rate", p->number);
    *width = 2, *speed_ext = 0;
    if (read_text(p, rel, buf, sizeof buf) < 0)
        return;
    const char *w = strchr(buf, '(');
    if (w == NULL)
        return;
    static const struct { const char *text; unsigned code; } widths[] = {
        {"(1X", 1}, {"(2X", 16}, {"(4X", 2}, {"(8X", 4}, {"(12X", 8},
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (strncmp(w, widths[i].text, strlen(widths[i].text)) == 0)
            *width = widths[i].code;
    static const struct { const char *text; unsigned code; } speeds[] = {
        {" FDR)", 1}, {" EDR)", 2}, {" HDR)", 4}, {" NDR)", 8},
    };
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++)
        if (strstr(w, speeds[i].text) != NULL)
            *speed_ext = speeds[i].code;
}

/* ---- big-endian fields ------------------------------------------------------------------ */

static void put8(uint8_t *d, int off, uint64_t v) { d[off] = (uint8_t)v; }

static void put16(uint8_t *d, int off, uint64_t v) {
    for (int i = 0; i < 2; i++)
        d[off + i] = (uint8_t)(v >> (8 * (1 - i)));
}

static void put24(uint8_t *d, int off, uint64_t v) {
    for (int i = 0; i < 3; i++)
        d[off + i] = (uint8_t)(v >> (8 * (2 - i)));
}

static void put32(uint8_t *d, int off, uint64_t v) {
    for (int i = 0; i < 4; i++)
        d[off + i] = (uint8_t)(v >> (8 * (3 - i)));
}

static void put64(uint8_t *d, int off, uint64_t v) {
    for (int i = 0; i < 8; i++)
        d[off + i] = (uint8_t)(v >> (8 * (7 - i)));
}

/* Two 4-bit fields in one byte. */
static void nibbles(uint8_t *d, int off, unsigned hi, unsigned lo) { d[off] = (uint8_t)((hi & 15) << 4 | (lo & 15)); }

static uint64_t sat(uint64_t v, int bits) {
    uint64_t max = bits >= 64 ? UINT64_MAX : (1ULL << bits) - 1;
    return v > max ? max : v;
}

/* ---- the attributes --------------------------------------------------------------------- */

static void node_desc(const struct port *p, uint8_t *d) {
    char buf[128];
    if (read_text(p, "node_desc", buf, sizeof buf) >= 0)
        memcpy(d, buf, strnlen(buf, 64));
}

static void node_info(const struct port *p, uint8_t *d) {
    uint64_t node = guid_file(p, "node_guid");
    put8(d, 0, 1);  /* BaseVersion */
    put8(d, 1, 1);  /* ClassVersion */
    put8(d, 2, 1);  /* NodeType: channel adapter */
    put8(d, 3, (uint64_t)num_ports(p));
    put64(d, 4, guid_file(p, "sys_image_guid"));
    put64(d, 12, node);
    put64(d, 20, port_guid(p));
    put16(d, 28, 128); /* PartitionCap */
    put16(d, 30, read_u64(p, "device/device"));
    put32(d, 32, read_u64(p, "hw_rev"));
    put8(d, 36, (uint64_t)p->number);
    put24(d, 37, VENDOR_ID);
}

static void port_info(const struct port *p, uint8_t *d) {
    unsigned width, speed_ext;
    link_codes(p, &width, &speed_ext);
    unsigned state = port_enum(p, "state"), phys = port_enum(p, "phys_state");
    int up = state == 4;
    put64(d, 8, 0xfe80000000000000ULL); /* GidPrefix */
    put16(d, 16, port_u64(p, "lid"));
    put16(d, 18, port_u64(p, "sm_lid"));
    put32(d, 20, port_u64(p, "cap_mask"));
    put8(d, 28, (uint64_t)p->number);
    put8(d, 29, 19);                   /* LinkWidthEnabled: 1X, 2X, 4X */
    put8(d, 30, 19);                   /* LinkWidthSupported */
    put8(d, 31, up ? width : 0);       /* LinkWidthActive */
    nibbles(d, 32, 7, state);          /* LinkSpeedSupported (SDR-QDR) | PortState */
    nibbles(d, 33, phys, 2);           /* PortPhysicalState | LinkDownDefaultState: Polling */
    put8(d, 34, port_u64(p, "lid_mask_count") & 7);
    nibbles(d, 35, up ? 1 : 0, 7);     /* LinkSpeedActive (SDR when an extended speed runs) | Enabled */
    nibbles(d, 36, 5, (unsigned)port_u64(p, "sm_sl")); /* NeighborMTU 4096 | MasterSMSL */
    nibbles(d, 37, 3, 0);              /* VLCap: VL0-3 | InitType */
    put8(d, 38, 4);                    /* VLHighLimit */
    put8(d, 39, 8);                    /* VLArbitrationHighCap */
    put8(d, 40, 8);                    /* VLArbitrationLowCap */
    nibbles(d, 41, 0, 5);              /* InitTypeReply | MTUCap 4096 */
    put8(d, 42, 7 << 5 | 18);          /* VLStallCount | HOQLife */
    nibbles(d, 43, up ? 3 : 0, 0);     /* OperationalVLs | partition enforcement and filters */
    put8(d, 50, 1);                    /* GUIDCap */
    put8(d, 51, 18);                   /* ClientReregister | SubnetTimeOut */
    put8(d, 52, 16);                   /* RespTimeValue */
    nibbles(d, 62, up ? speed_ext : 0, 15); /* LinkSpeedExtActive | LinkSpeedExtSupported */
    put8(d, 63, 15);                   /* LinkSpeedExtEnabled */
}

static void perf_class_port_info(uint8_t *d) {
    put8(d, 0, 1); /* BaseVersion */
    put8(d, 1, 1); /* ClassVersion */
    put16(d, 2, PERF_CAP_MASK);
    put8(d, 7, 18); /* RespTimeValue */
}

static void port_counters(const struct port *p, uint8_t *d) {
    put8(d, 1, (uint64_t)p->number); /* PortSelect */
    put16(d, 2, 0xffff);             /* CounterSelect */
    put16(d, 4, sat(port_u64(p, "counters/symbol_error"), 16));
    put8(d, 6, sat(port_u64(p, "counters/link_error_recovery"), 8));
    put8(d, 7, sat(port_u64(p, "counters/link_downed"), 8));
    put16(d, 8, sat(port_u64(p, "counters/port_rcv_errors"), 16));
    put16(d, 10, sat(port_u64(p, "counters/port_rcv_remote_physical_errors"), 16));
    put16(d, 12, sat(port_u64(p, "counters/port_rcv_switch_relay_errors"), 16));
    put16(d, 14, sat(port_u64(p, "counters/port_xmit_discards"), 16));
    put8(d, 16, sat(port_u64(p, "counters/port_xmit_constraint_errors"), 8));
    put8(d, 17, sat(port_u64(p, "counters/port_rcv_constraint_errors"), 8));
    nibbles(d, 19, (unsigned)sat(port_u64(p, "counters/local_link_integrity_errors"), 4),
            (unsigned)sat(port_u64(p, "counters/excessive_buffer_overrun_errors"), 4));
    put16(d, 22, sat(port_u64(p, "counters/VL15_dropped"), 16));
    /* The data counters count 4-byte words, as sysfs does. */
    put32(d, 24, sat(port_u64(p, "counters/port_xmit_data"), 32));
    put32(d, 28, sat(port_u64(p, "counters/port_rcv_data"), 32));
    put32(d, 32, sat(port_u64(p, "counters/port_xmit_packets"), 32));
    put32(d, 36, sat(port_u64(p, "counters/port_rcv_packets"), 32));
    put32(d, 40, sat(port_u64(p, "counters/port_xmit_wait"), 32));
}

static void port_counters_ext(const struct port *p, uint8_t *d) {
    static const char *const names[] = {
        "port_xmit_data",        "port_rcv_data",        "port_xmit_packets",      "port_rcv_packets",
        "unicast_xmit_packets",  "unicast_rcv_packets",  "multicast_xmit_packets", "multicast_rcv_packets",
    };
    char rel[96];
    put8(d, 1, (uint64_t)p->number);
    put16(d, 2, 0xffff);
    for (int i = 0; i < 8; i++) {
        snprintf(rel, sizeof rel, "counters/%s", names[i]);
        put64(d, 8 + 8 * i, port_u64(p, rel));
    }
}

/* ---- the fabric ------------------------------------------------------------------------- */

struct fnode {
    uint64_t guid;
    int sw;
    int ports;
    unsigned device_id;
    char desc[65];
};

struct fport {
    uint64_t node, guid;
    int number;
    unsigned lid;
};

struct flink {
    uint64_t node[2];
    int port[2];
    int up;
    char rate[24]; /* "(4X NDR)", as the rate parsers read it */
};

struct fabric {
    struct fnode *nodes;
    struct fport *ports;
    struct flink *links;
    int nnodes, nports, nlinks;
};

static void fabric_free(struct fabric *f) {
    free(f->nodes), free(f->ports), free(f->links);
    memset(f, 0, sizeof *f);
}

/* The node's own adapters' links are as their staged ports say now (a fault written there shows
 * at once); the fabric file carries the other nodes' (the local cluster rewrites it). */
static void fabric_local_links(struct fabric *f) {
    for (int i = 0; i < 64; i++) {
        struct port hca = {.number = 1};
        snprintf(hca.ca, sizeof hca.ca, "mlx5_%d", i);
        uint64_t guid = guid_file(&hca, "node_guid");
        if (guid == 0)
            break;
        for (int k = 0; k < f->nlinks; k++)
            for (int e = 0; e < 2; e++)
                if (f->links[k].node[e] == guid) {
                    hca.number = f->links[k].port[e];
                    f->links[k].up = port_enum(&hca, "state") == 4;
                }
    }
}

/* The fabric file, parsed (empty when there is none). */
static void fabric_load(struct fabric *f) {
    memset(f, 0, sizeof *f);
    size_t len;
    char *text = shim_read_all(FABRIC, &len);
    if (text == NULL)
        return;
    int lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    f->nodes = calloc((size_t)lines, sizeof *f->nodes);
    f->ports = calloc((size_t)lines, sizeof *f->ports);
    f->links = calloc((size_t)lines, sizeof *f->links);
    if (f->nodes == NULL || f->ports == NULL || f->links == NULL) {
        fabric_free(f);
        free(text);
        return;
    }
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        unsigned long long a, b;
        int n = 0;
        if (sscanf(line, "node %llx %*s %d %u %n", &a, &f->nodes[f->nnodes].ports, &f->nodes[f->nnodes].device_id, &n) == 3 && n > 0) {
            struct fnode *x = &f->nodes[f->nnodes++];
            x->guid = a;
            x->sw = strstr(line, " SW ") != NULL;
            snprintf(x->desc, sizeof x->desc, "%s", line + n);
        } else if (sscanf(line, "port %llx %d %llx %u", &a, &f->ports[f->nports].number, &b, &f->ports[f->nports].lid) == 4) {
            f->ports[f->nports].node = a;
            f->ports[f->nports++].guid = b;
        } else {
            struct flink *l = &f->links[f->nlinks];
            char w[8], sp[8];
            if (sscanf(line, "link %llx %d %llx %d %d %7s %7s", &a, &l->port[0], &b, &l->port[1], &l->up, w, sp) == 7) {
                l->node[0] = a, l->node[1] = b;
                snprintf(l->rate, sizeof l->rate, "(%s %s)", w, sp);
                f->nlinks++;
            }
        }
    }
    free(text);
    fabric_local_links(f);
}

static const struct fnode *fabric_node(const struct fabric *f, uint64_t guid) {
    for (int i = 0; i < f->nnodes; i++)
        if (f->nodes[i].guid == guid)
            return &f->nodes[i];
    return NULL;
}

/* The link at (node, port), and which of its ends that is. */
static const struct flink *fabric_link(const struct fabric *f, uint64_t node, int port, int *end) {
    for (int i = 0; i < f->nlinks; i++)
        for (int e = 0; e < 2; e++)
            if (f->links[i].node[e] == node && f->links[i].port[e] == port) {
                *end = e;
                return &f->links[i];
            }
    return NULL;
}

static const struct fport *fabric_port(const struct fabric *f, uint64_t node, int number) {
    for (int i = 0; i < f->nports; i++)
        if (f->ports[i].node == node && f->ports[i].number == number)
            return &f->ports[i];
    return NULL;
}

static const struct fport *fabric_lid(const struct fabric *f, unsigned lid) {
    for (int i = 0; i < f->nports; i++)
        if (f->ports[i].lid == lid)
            return &f->ports[i];
    return NULL;
}

/* The rate text "(4X NDR)": PortInfo's width and extended speed codes. */
static void rate_codes(const char *text, unsigned *width, unsigned *speed_ext) {
    *width = 2, *speed_ext = 0;
    const char *w = strchr(text, '(');
    if (w == NULL)
        return;
    static const struct { const char *text; unsigned code; } widths[] = {
        {"(1X", 1}, {"(2X", 16}, {"(4X", 2}, {"(8X", 4}, {"(12X", 8},
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (strncmp(w, widths[i].text, strlen(widths[i].text)) == 0)
            *width = widths[i].code;
    static const struct { const char *text; unsigned code; } speeds[] = {
        {" FDR)", 1}, {" EDR)", 2}, {" HDR)", 4}, {" NDR)", 8},
    };
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++)
        if (strstr(w, speeds[i].text) != NULL)
            *speed_ext = speeds[i].code;
}

/* ---- what another node of the fabric answers ------------------------------------------- */

static void fabric_node_info(const struct fabric *f, const struct fnode *x, int ingress, uint8_t *d) {
    const struct fport *p = fabric_port(f, x->guid, x->sw ? 0 : ingress);
    put8(d, 0, 1);
    put8(d, 1, 1);
    put8(d, 2, x->sw ? 2 : 1); /* NodeType: switch or channel adapter */
    put8(d, 3, (uint64_t)x->ports);
    put64(d, 4, x->guid);
    put64(d, 12, x->guid);
    put64(d, 20, p != NULL ? p->guid : x->guid);
    put16(d, 28, x->sw ? 8 : 128);
    put16(d, 30, x->device_id);
    put8(d, 36, (uint64_t)ingress);
    put24(d, 37, VENDOR_ID);
}

/* PortInfo of port `number` of `x` (0: a switch's management port), asked through port
 * `ingress` (its LocalPortNum); `cap`: the capability mask the fabric's adapters carry (the
 * local port's). */
static void fabric_port_info(const struct fabric *f, const struct fnode *x, int number, int ingress, uint32_t cap,
                             uint8_t *d) {
    int end = 0;
    const struct flink *l = number > 0 ? fabric_link(f, x->guid, number, &end) : NULL;
    const struct fport *p = fabric_port(f, x->guid, x->sw ? 0 : number);
    const struct fport *sm = fabric_lid(f, 1);
    unsigned width = 2, speed_ext = 0;
    if (l != NULL)
        rate_codes(l->rate, &width, &speed_ext);
    int up = x->sw && number == 0 ? 1 : l != NULL && l->up;
    unsigned state = up ? 4 : 1, phys = up ? 5 : (l != NULL ? 3 : 2); /* Disabled when cabled, else Polling */
    put64(d, 8, 0xfe80000000000000ULL);
    put16(d, 16, p != NULL ? p->lid : 0);
    put16(d, 18, sm != NULL ? sm->lid : 0);
    put32(d, 20, x->sw ? (number == 0 ? 0x0042484a : 0) : cap); /* a switch: port 0 carries it */
    put8(d, 28, (uint64_t)ingress);
    put8(d, 29, 19);
    put8(d, 30, 19);
    put8(d, 31, up ? width : 0);
    nibbles(d, 32, 7, state);
    nibbles(d, 33, x->sw && number == 0 ? 5 : phys, 2);
    nibbles(d, 35, up ? 1 : 0, 7);
    nibbles(d, 36, 5, 0);
    nibbles(d, 37, 3, 0);
    put8(d, 38, 4);
    put8(d, 39, 8);
    put8(d, 40, 8);
    nibbles(d, 41, 0, 5);
    put8(d, 42, 7 << 5 | 18);
    nibbles(d, 43, up ? 3 : 0, 0);
    put8(d, 50, x->sw ? 0 : 1);
    put8(d, 51, 18);
    put8(d, 52, 16);
    nibbles(d, 62, up ? speed_ext : 0, 15);
    put8(d, 63, 15);
}

static void switch_info(uint8_t *d) {
    put16(d, 0, 0xc000); /* LinearFDBCap */
    put16(d, 4, 0x4000); /* MulticastFDBCap */
    put16(d, 6, 0xbfff); /* LinearFDBTop */
    put8(d, 11, 18 << 3); /* LifeTimeValue */
    put16(d, 14, 8);      /* PartitionEnforcementCap */
    put8(d, 16, 0x08);    /* EnhancedPort0 */
    put16(d, 18, 0xc000); /* MulticastFDBTop */
}

static void sm_info(uint64_t guid, uint8_t *d) {
    put64(d, 0, guid);
    put32(d, 16, (uint64_t)time(NULL)); /* ActCount: the SM's activity counter, always moving */
    nibbles(d, 20, 0, 3);               /* Priority | SMState: master */
}

/* ---- the responder ---------------------------------------------------------------------- */

static uint16_t get16(const uint8_t *d, int off) { return (uint16_t)(d[off] << 8 | d[off + 1]); }

/* The answer to `mad` (sent to `dlid`) in place: 1 when there is one. */
static int answer(const struct port *p, uint8_t *mad, uint16_t dlid) {
    uint8_t cls = mad[1], method = mad[3];
    uint16_t attr = get16(mad, 16);
    uint32_t mod = (uint32_t)get16(mad, 20) << 16 | get16(mad, 22);
    uint8_t *d = mad + DATA;
    uint16_t lid = (uint16_t)port_u64(p, "lid");
    int up = port_enum(p, "state") == 4;
    if (method != METHOD_GET && !(method == METHOD_SET && cls == CLASS_PERF))
        return 0;
    uint16_t status = 0;
    if (cls == CLASS_SMI || cls == CLASS_SMI_DIRECT) {
        /* Which node the SMP reaches, and on which of its ports. */
        struct fabric f;
        fabric_load(&f);
        uint64_t self = guid_file(p, "node_guid");
        uint64_t node = self;
        int ingress = p->number;
        if (cls == CLASS_SMI_DIRECT) {
            int hops = mad[7];
            if (hops > 0 && !up)
                node = 0; /* nothing leaves a port that is down */
            for (int k = 1; k <= hops && node != 0 && k < 64; k++) {
                int end;
                const struct flink *l = fabric_link(&f, node, mad[128 + k], &end);
                if (l == NULL || !l->up) {
                    node = 0;
                    break;
                }
                node = l->node[1 - end], ingress = l->port[1 - end];
            }
        } else if (dlid != lid) {
            const struct fport *t = up ? fabric_lid(&f, dlid) : NULL;
            node = t != NULL ? t->node : 0;
            ingress = t != NULL ? t->number : 0;
            const struct fnode *x = node != 0 ? fabric_node(&f, node) : NULL;
            int end;
            const struct flink *l = x != NULL && !x->sw ? fabric_link(&f, node, ingress, &end) : NULL;
            if (x == NULL || (!x->sw && (l == NULL || !l->up)))
                node = 0;
        }
        const struct fnode *x = node != 0 && node != self ? fabric_node(&f, node) : NULL;
        if (node == 0 || (node != self && x == NULL)) {
            fabric_free(&f);
            return 0;
        }
        memset(d, 0, 64);
        if (attr == ATTR_SM_INFO && x != NULL && x->sw && fabric_port(&f, node, 0) != NULL &&
            fabric_port(&f, node, 0)->lid == port_u64(p, "sm_lid"))
            sm_info(node, d);
        else if (x == NULL && attr == ATTR_NODE_DESC)
            node_desc(p, d);
        else if (x == NULL && attr == ATTR_NODE_INFO)
            node_info(p, d);
        else if (x == NULL && attr == ATTR_PORT_INFO)
            port_info(p, d);
        else if (x != NULL && attr == ATTR_NODE_DESC)
            memcpy(d, x->desc, strnlen(x->desc, 64));
        else if (x != NULL && attr == ATTR_NODE_INFO)
            fabric_node_info(&f, x, ingress, d);
        else if (x != NULL && attr == ATTR_PORT_INFO)
            fabric_port_info(&f, x, x->sw ? (int)(mod & 0xff) : (mod & 0xff) ? (int)(mod & 0xff) : ingress, ingress,
                             (uint32_t)port_u64(p, "cap_mask"), d);
        else if (x != NULL && x->sw && attr == ATTR_SWITCH_INFO)
            switch_info(d);
        else
            status = STATUS_UNSUPPORTED;
        fabric_free(&f);
    } else if (cls == CLASS_PERF && dlid != 0 && dlid == lid) {
        /* A Set (perfquery -r) is answered with the counters as they stand: nothing is reset. */
        memset(d, 0, MAD_SIZE - DATA);
        if (attr == ATTR_CLASS_PORT_INFO)
            perf_class_port_info(d);
        else if (attr == ATTR_PORT_COUNTERS)
            port_counters(p, d);
        else if (attr == ATTR_PORT_COUNTERS_EXT)
            port_counters_ext(p, d);
        else
            status = STATUS_UNSUPPORTED;
    } else {
        return 0;
    }
    mad[3] = METHOD_GET_RESP;
    mad[4] = (uint8_t)((cls == CLASS_SMI_DIRECT ? 0x80 : 0) | (status >> 8 & 0x7f));
    mad[5] = (uint8_t)status;
    return 1;
}

struct responder {
    int fd;
    struct port port;
};

static void *serve(void *arg) {
    struct responder *r = arg;
    uint8_t msg[sizeof(struct ib_user_mad) + MAD_SIZE];
    for (;;) {
        ssize_t n = recv(r->fd, msg, sizeof msg, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            break;
        if (n < (ssize_t)sizeof msg)
            continue;
        struct ib_user_mad *um = (struct ib_user_mad *)msg;
        uint8_t *mad = msg + sizeof(struct ib_user_mad);
        if (!answer(&r->port, mad, ntohs(um->hdr.lid)))
            continue;
        um->hdr.status = 0;
        um->hdr.length = (uint32_t)sizeof msg;
        um->hdr.lid = htons((uint16_t)port_u64(&r->port, "lid"));
        if (send(r->fd, msg, sizeof msg, MSG_NOSIGNAL) < 0)
            break;
    }
    close(r->fd);
    free(r);
    return NULL;
}

int umad_open(const char *path, int flags) {
    static const char prefix[] = "/dev/infiniband/umad";
    if (path == NULL || strncmp(path, prefix, sizeof prefix - 1) != 0 || !shim_enabled())
        return -2;
    const char *num = path + sizeof prefix - 1;
    char *end;
    long index = strtol(num, &end, 10);
    if (end == num || *end != '\0' || index < 0)
        return -2;
    /* The device node as the program sees it (staged, or passed to a container): none, no device. */
    if (access(path, F_OK) != 0)
        return -2;
    struct port port = {.number = 0};
    char rel[PATH_MAX], buf[64];
    snprintf(rel, sizeof rel, "/sys/class/infiniband_mad/umad%ld/ibdev", index);
    if (shim_read(rel, port.ca, sizeof port.ca) <= 0)
        return -2; /* not a staged device: the real one (or ENOENT) */
    snprintf(rel, sizeof rel, "/sys/class/infiniband_mad/umad%ld/port", index);
    if (shim_read(rel, buf, sizeof buf) <= 0)
        return -2;
    port.number = atoi(buf);
    struct responder *r = malloc(sizeof *r);
    if (r == NULL) {
        errno = ENOMEM;
        return -1;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        free(r);
        return -1;
    }
    if (sv[0] >= FDS) {
        close(sv[0]), close(sv[1]), free(r);
        errno = EMFILE;
        return -1;
    }
    if (!(flags & O_CLOEXEC))
        fcntl(sv[0], F_SETFD, 0);
    if (flags & O_NONBLOCK)
        fcntl(sv[0], F_SETFL, O_NONBLOCK);
    r->fd = sv[1];
    r->port = port;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, serve, r);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        close(sv[0]), close(sv[1]), free(r);
        errno = err;
        return -1;
    }
    track(sv[0], 1);
    return sv[0];
}

/* ---- ib_umad's ioctls, and forgetting a closed descriptor -------------------------------- */

HOOK int ioctl(int fd, unsigned long request, ...) {
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (!tracked(fd))
        return CALL(ioctl, -1, fd, request, arg);
    static uint32_t next_agent;
    switch (request) {
    case IB_USER_MAD_REGISTER_AGENT:
        ((struct ib_user_mad_reg_req *)arg)->id = __atomic_fetch_add(&next_agent, 1, __ATOMIC_RELAXED);
        return 0;
    case IB_USER_MAD_REGISTER_AGENT2:
        ((struct ib_user_mad_reg_req2 *)arg)->id = __atomic_fetch_add(&next_agent, 1, __ATOMIC_RELAXED);
        return 0;
    case IB_USER_MAD_UNREGISTER_AGENT:
    case IB_USER_MAD_ENABLE_PKEY:
        return 0;
    default:
        errno = ENOTTY;
        return -1;
    }
}

HOOK int close(int fd) {
    if (tracked(fd))
        track(fd, 0);
    return CALL(close, -1, fd);
}
