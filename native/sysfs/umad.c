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
 * What one port can answer from its own view (the staged sysfs under MOKKA_SYSFS_ROOT, so a
 * fault written there shows at once):
 *
 *     SMP, directed route with 0 hops or to the port's LID:  NodeDescription, NodeInfo, PortInfo
 *     SMP to the port's SM LID:                               SMInfo (the subnet manager: master)
 *     PerfMgmt to the port's LID:                             ClassPortInfo, PortCounters,
 *                                                              PortCountersExtended
 *
 * Anything else (a LID of another node, a directed route beyond the port) gets no answer, so the
 * tool times out as it does towards a LID nobody holds. Field offsets are the InfiniBand
 * Architecture Specification's (volume 1, chapters 14 and 16); a test decodes the answers with
 * libibmad's own field table.
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
    ATTR_SM_INFO = 0x0020,
    ATTR_PORT_COUNTERS = 0x0012,
    ATTR_PORT_COUNTERS_EXT = 0x001D,
    FDS = 4096, /* descriptors tracked; a umad device opened above this is not answered */
};

/* The subnet manager every staged port names at its SM LID: one master for the whole fabric. */
static const uint64_t SM_GUID = 0xa088c20300000001ULL;
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

static void sm_info(uint8_t *d) {
    put64(d, 0, SM_GUID);
    put32(d, 16, (uint64_t)time(NULL)); /* ActCount: the SM's activity counter, always moving */
    nibbles(d, 20, 0, 3);               /* Priority | SMState: master */
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

/* ---- the responder ---------------------------------------------------------------------- */

static uint16_t get16(const uint8_t *d, int off) { return (uint16_t)(d[off] << 8 | d[off + 1]); }

/* The answer to `mad` (sent to `dlid`) in place: 1 when there is one. */
static int answer(const struct port *p, uint8_t *mad, uint16_t dlid) {
    uint8_t cls = mad[1], method = mad[3];
    uint16_t attr = get16(mad, 16);
    uint8_t *d = mad + DATA;
    uint16_t lid = (uint16_t)port_u64(p, "lid"), sm_lid = (uint16_t)port_u64(p, "sm_lid");
    if (method != METHOD_GET && !(method == METHOD_SET && cls == CLASS_PERF))
        return 0;
    int local = cls == CLASS_SMI_DIRECT ? mad[7] == 0 /* hop count */ : dlid != 0 && dlid == lid;
    if (cls == CLASS_SMI || cls == CLASS_SMI_DIRECT) {
        if (attr == ATTR_SM_INFO && (local || (cls == CLASS_SMI && sm_lid != 0 && dlid == sm_lid))) {
            memset(d, 0, 64);
            sm_info(d);
        } else if (!local) {
            return 0;
        } else if (attr == ATTR_NODE_DESC || attr == ATTR_NODE_INFO || attr == ATTR_PORT_INFO) {
            memset(d, 0, 64);
            if (attr == ATTR_NODE_DESC)
                node_desc(p, d);
            else if (attr == ATTR_NODE_INFO)
                node_info(p, d);
            else
                port_info(p, d);
        } else {
            return 0;
        }
        if (cls == CLASS_SMI_DIRECT)
            mad[4] |= 0x80; /* the D bit: a response travels back along the path */
    } else if (cls == CLASS_PERF && local) {
        /* A Set (perfquery -r) is answered with the counters as they stand: nothing is reset. */
        memset(d, 0, MAD_SIZE - DATA);
        if (attr == ATTR_CLASS_PORT_INFO)
            perf_class_port_info(d);
        else if (attr == ATTR_PORT_COUNTERS)
            port_counters(p, d);
        else if (attr == ATTR_PORT_COUNTERS_EXT)
            port_counters_ext(p, d);
        else
            return 0;
    } else {
        return 0;
    }
    mad[3] = METHOD_GET_RESP;
    mad[4] &= 0x80;
    mad[5] = 0;
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
