/*
 * What a port's management agents and the subnet around it answer.
 *
 * The node's own adapter answers from its staged sysfs (adapter.h: a fault written there shows
 * at once); the rest of the subnet (the leaf and spine switches, the other nodes' adapters) from
 * the fabric (fabric.h):
 *
 *     SMP, directed route (walked link by link through the fabric) or to a LID:
 *         NodeDescription, NodeInfo, PortInfo; SwitchInfo of a switch
 *     SMP to the SM LID:                 SMInfo (the spine runs the master subnet manager)
 *     PerfMgmt to a LID:                 ClassPortInfo, PortCounters, PortCountersExtended: the
 *                                        node's own ports from their files, another node's as
 *                                        the fabric last copied them, a switch's all zero
 *
 * An attribute a reachable node does not know is answered with MAD status "unsupported"; a MAD
 * nobody can receive (a LID nobody holds, a path through a link that is down) gets no answer,
 * and the tool times out as it would. Field offsets are the InfiniBand
 * Architecture Specification's (volume 1, chapters 14 and 16); tests read the answers with
 * libibmad's own decoders (smpquery, perfquery, ibnetdiscover).
 */
#define _GNU_SOURCE
#include "mad.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "adapter.h"
#include "fabric.h"

enum {
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
    ATTR_SWITCH_INFO = 0x0012,
    ATTR_PORT_INFO = 0x0015,
    ATTR_SM_INFO = 0x0020,
    ATTR_PORT_COUNTERS = 0x0012,
    ATTR_PORT_COUNTERS_EXT = 0x001D,
    STATUS_UNSUPPORTED = 0x000c, /* the method/attribute combination is not supported */
    INITIAL_PATH = 128,          /* a directed-route SMP's initial path */
};

static const uint32_t VENDOR_ID = 0x0002c9;       /* Mellanox's IEEE OUI, as NodeInfo carries it */
static const uint16_t PERF_CAP_MASK = 0x5a00;     /* ClassPortInfo of a ConnectX port's PerfMgmt agent */
static const uint32_t SWITCH_CAP_MASK = 0x0042484a; /* a switch's port 0 (extended speeds among them) */

/* ---- big-endian fields ------------------------------------------------------------------ */

static void put(uint8_t *d, int off, int bytes, uint64_t v) {
    for (int i = 0; i < bytes; i++)
        d[off + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

/* Two 4-bit fields in one byte. */
static void nibbles(uint8_t *d, int off, unsigned hi, unsigned lo) { d[off] = (uint8_t)((hi & 15) << 4 | (lo & 15)); }

static uint64_t sat(uint64_t v, int bits) {
    uint64_t max = bits >= 64 ? UINT64_MAX : (1ULL << bits) - 1;
    return v > max ? max : v;
}

static uint16_t get16(const uint8_t *d, int off) { return (uint16_t)(d[off] << 8 | d[off + 1]); }

/* ---- NodeInfo and PortInfo, of whichever node ------------------------------------------ */

struct node_facts {
    int sw;
    int ports;
    uint64_t sys_guid, node_guid, port_guid;
    unsigned device_id, revision;
    int local_port; /* the port the SMP arrived on */
};

static void node_info(const struct node_facts *n, uint8_t *d) {
    put(d, 0, 1, 1);               /* BaseVersion */
    put(d, 1, 1, 1);               /* ClassVersion */
    put(d, 2, 1, n->sw ? 2 : 1);   /* NodeType: switch or channel adapter */
    put(d, 3, 1, (uint64_t)n->ports);
    put(d, 4, 8, n->sys_guid);
    put(d, 12, 8, n->node_guid);
    put(d, 20, 8, n->port_guid);
    put(d, 28, 2, n->sw ? 8 : 128); /* PartitionCap */
    put(d, 30, 2, n->device_id);
    put(d, 32, 4, n->revision);
    put(d, 36, 1, (uint64_t)n->local_port);
    put(d, 37, 3, VENDOR_ID);
}

struct port_facts {
    unsigned lid, sm_lid, lmc, sm_sl;
    uint32_t cap_mask;
    int local_port; /* the port the SMP arrived on (LocalPortNum) */
    int up;
    unsigned state, phys;
    struct ib_rate rate;
    int guid_cap;
};

/* PortInfo's extended speed code: FDR 1, EDR 2, HDR 4, NDR 8 (XDR has none in rdma-core 44). */
static unsigned speed_ext(enum ib_speed s) {
    return s == SPEED_FDR ? 1 : s == SPEED_EDR ? 2 : s == SPEED_HDR ? 4 : s == SPEED_NDR ? 8 : 0;
}

static void port_info(const struct port_facts *p, uint8_t *d) {
    put(d, 8, 8, 0xfe80000000000000ULL);         /* GidPrefix */
    put(d, 16, 2, p->lid);
    put(d, 18, 2, p->sm_lid);
    put(d, 20, 4, p->cap_mask);
    put(d, 28, 1, (uint64_t)p->local_port);
    put(d, 29, 1, 19);                           /* LinkWidthEnabled: 1X, 2X, 4X */
    put(d, 30, 1, 19);                           /* LinkWidthSupported */
    put(d, 31, 1, p->up ? p->rate.width : 0);    /* LinkWidthActive */
    nibbles(d, 32, 7, p->state);                 /* LinkSpeedSupported (SDR-QDR) | PortState */
    nibbles(d, 33, p->phys, 2);                  /* PortPhysicalState | LinkDownDefaultState: Polling */
    put(d, 34, 1, p->lmc & 7);
    nibbles(d, 35, p->up ? 1 : 0, 7);            /* LinkSpeedActive (SDR when an extended speed runs) | Enabled */
    nibbles(d, 36, 5, p->sm_sl);                 /* NeighborMTU 4096 | MasterSMSL */
    nibbles(d, 37, 3, 0);                        /* VLCap: VL0-3 | InitType */
    put(d, 38, 1, 4);                            /* VLHighLimit */
    put(d, 39, 1, 8);                            /* VLArbitrationHighCap */
    put(d, 40, 1, 8);                            /* VLArbitrationLowCap */
    nibbles(d, 41, 0, 5);                        /* InitTypeReply | MTUCap 4096 */
    put(d, 42, 1, 7 << 5 | 18);                  /* VLStallCount | HOQLife */
    nibbles(d, 43, p->up ? 3 : 0, 0);            /* OperationalVLs | partition enforcement and filters */
    put(d, 50, 1, (uint64_t)p->guid_cap);        /* GUIDCap */
    put(d, 51, 1, 18);                           /* ClientReregister | SubnetTimeOut */
    put(d, 52, 1, 16);                           /* RespTimeValue */
    nibbles(d, 62, p->up ? speed_ext(p->rate.speed) : 0, 15); /* LinkSpeedExtActive | LinkSpeedExtSupported */
    put(d, 63, 1, 15);                           /* LinkSpeedExtEnabled */
}

/* The node's own adapter, from its files. */
static struct node_facts own_node(const char *ca, int port) {
    return (struct node_facts){
        .sw = 0,
        .ports = adapter_ports(ca),
        .sys_guid = adapter_guid(ca, "sys_image_guid"),
        .node_guid = adapter_guid(ca, "node_guid"),
        .port_guid = adapter_port_guid(ca, port),
        .device_id = (unsigned)adapter_num(ca, "device/device"),
        .revision = (unsigned)adapter_num(ca, "hw_rev"),
        .local_port = port,
    };
}

static struct port_facts own_port(const char *ca, int port) {
    unsigned state = (unsigned)adapter_port_num(ca, port, "state");
    return (struct port_facts){
        .lid = (unsigned)adapter_port_num(ca, port, "lid"),
        .sm_lid = (unsigned)adapter_port_num(ca, port, "sm_lid"),
        .lmc = (unsigned)adapter_port_num(ca, port, "lid_mask_count"),
        .sm_sl = (unsigned)adapter_port_num(ca, port, "sm_sl"),
        .cap_mask = (uint32_t)adapter_port_num(ca, port, "cap_mask"),
        .local_port = port,
        .up = state == 4,
        .state = state,
        .phys = (unsigned)adapter_port_num(ca, port, "phys_state"),
        .rate = adapter_rate(ca, port),
        .guid_cap = 1,
    };
}

/* Another node of the fabric. */
static struct node_facts fabric_node_facts(const struct fabric *f, const struct fnode *x, int ingress) {
    const struct fport *p = fabric_port(f, x->guid, x->sw ? 0 : ingress);
    return (struct node_facts){
        .sw = x->sw,
        .ports = x->ports,
        .sys_guid = x->guid,
        .node_guid = x->guid,
        .port_guid = p != NULL ? p->guid : x->guid,
        .device_id = x->device_id,
        .revision = 0,
        .local_port = ingress,
    };
}

/* Port `number` of `x` (0: a switch's management port), asked through port `ingress`; `cap`:
 * the capability mask the fabric's adapters carry (the local port's). */
static struct port_facts fabric_port_facts(const struct fabric *f, const struct fnode *x, int number, int ingress,
                                           uint32_t cap) {
    int end = 0;
    const struct flink *l = number > 0 ? fabric_link(f, x->guid, number, &end) : NULL;
    const struct fport *p = fabric_port(f, x->guid, x->sw ? 0 : number);
    const struct fport *sm = fabric_lid(f, 1);
    int management = x->sw && number == 0;
    int up = management || (l != NULL && l->up);
    return (struct port_facts){
        .lid = p != NULL ? p->lid : 0,
        .sm_lid = sm != NULL ? sm->lid : 0,
        .cap_mask = x->sw ? (management ? SWITCH_CAP_MASK : 0) : cap,
        .local_port = ingress,
        .up = up,
        .state = up ? 4 : 1,
        .phys = up ? 5 : (l != NULL ? 3 : 2), /* Disabled when cabled, else Polling */
        .rate = l != NULL ? rate_parse(l->rate) : (struct ib_rate){2, SPEED_UNKNOWN},
        .guid_cap = x->sw ? 0 : 1,
    };
}

/* ---- the other attributes --------------------------------------------------------------- */

static void switch_info(uint8_t *d) {
    put(d, 0, 2, 0xc000);  /* LinearFDBCap */
    put(d, 4, 2, 0x4000);  /* MulticastFDBCap */
    put(d, 6, 2, 0xbfff);  /* LinearFDBTop */
    put(d, 11, 1, 18 << 3); /* LifeTimeValue */
    put(d, 14, 2, 8);      /* PartitionEnforcementCap */
    put(d, 16, 1, 0x08);   /* EnhancedPort0 */
    put(d, 18, 2, 0xc000); /* MulticastFDBTop */
}

static void sm_info(uint64_t guid, uint8_t *d) {
    put(d, 0, 8, guid);
    put(d, 16, 4, (uint64_t)time(NULL)); /* ActCount: the SM's activity counter, always moving */
    nibbles(d, 20, 0, 3);                /* Priority | SMState: master */
}

static void perf_class_port_info(uint8_t *d) {
    put(d, 0, 1, 1); /* BaseVersion */
    put(d, 1, 1, 1); /* ClassVersion */
    put(d, 2, 2, PERF_CAP_MASK);
    put(d, 7, 1, 18); /* RespTimeValue */
}

/* Where a PerfMgmt agent's counters come from: one of the node's own adapters (its files), another
 * node's adapter (the fabric), or a switch (none: all zero). */
struct counters {
    const char *ca;          /* the node's own adapter, else NULL */
    const struct fabric *f;  /* another node's adapter: its counters in the fabric, else NULL */
    uint64_t node;
    int port;
};

static uint64_t counter(const struct counters *c, const char *name, int bits) {
    char file[96];
    snprintf(file, sizeof file, "counters/%s", name);
    uint64_t v = c->ca != NULL ? adapter_port_num(c->ca, c->port, file)
                 : c->f != NULL ? fabric_counter(c->f, c->node, c->port, name)
                                : 0;
    return sat(v, bits);
}

static void port_counters(const struct counters *c, uint8_t *d) {
    static const struct { const char *name; int off, bits; } fields[] = {
        {"symbol_error", 4, 16},
        {"link_error_recovery", 6, 8},
        {"link_downed", 7, 8},
        {"port_rcv_errors", 8, 16},
        {"port_rcv_remote_physical_errors", 10, 16},
        {"port_rcv_switch_relay_errors", 12, 16},
        {"port_xmit_discards", 14, 16},
        {"port_xmit_constraint_errors", 16, 8},
        {"port_rcv_constraint_errors", 17, 8},
        {"VL15_dropped", 22, 16},
        /* The data counters count 4-byte words, as sysfs does. */
        {"port_xmit_data", 24, 32},
        {"port_rcv_data", 28, 32},
        {"port_xmit_packets", 32, 32},
        {"port_rcv_packets", 36, 32},
        {"port_xmit_wait", 40, 32},
    };
    put(d, 1, 1, (uint64_t)c->port); /* PortSelect */
    put(d, 2, 2, 0xffff);            /* CounterSelect */
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        put(d, fields[i].off, fields[i].bits / 8, counter(c, fields[i].name, fields[i].bits));
    nibbles(d, 19, (unsigned)counter(c, "local_link_integrity_errors", 4),
            (unsigned)counter(c, "excessive_buffer_overrun_errors", 4));
}

static void port_counters_ext(const struct counters *c, uint8_t *d) {
    static const char *const names[] = {
        "port_xmit_data",       "port_rcv_data",       "port_xmit_packets",      "port_rcv_packets",
        "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets",
    };
    put(d, 1, 1, (uint64_t)c->port);
    put(d, 2, 2, 0xffff);
    for (int i = 0; i < 8; i++)
        put(d, 8 + 8 * i, 8, counter(c, names[i], 64));
}

/* The node's own adapter whose node GUID is `guid` (into `ca`), if any. */
static int own_adapter(uint64_t guid, char *ca, size_t size) {
    for (int i = 0; i < 64; i++) {
        snprintf(ca, size, "mlx5_%d", i);
        uint64_t g = adapter_guid(ca, "node_guid");
        if (g == 0)
            return 0;
        if (g == guid)
            return 1;
    }
    return 0;
}

/* ---- routing and the answer ------------------------------------------------------------- */

/* The node a subnet-management MAD sent from node `self` reaches (0: none) and the port it
 * arrives on. */
static uint64_t reached(const struct fabric *f, const char *ca, int port, uint64_t self, const uint8_t *mad,
                        uint16_t dlid, int *ingress) {
    uint64_t node = self;
    int up = adapter_port_up(ca, port);
    *ingress = port;
    if (mad[1] == CLASS_SMI_DIRECT) {
        int hops = mad[7];
        if (hops > 0 && !up)
            return 0; /* nothing leaves a port that is down */
        for (int k = 1; k <= hops && k < 64; k++) {
            int end;
            const struct flink *l = fabric_link(f, node, mad[INITIAL_PATH + k], &end);
            if (l == NULL || !l->up)
                return 0;
            node = l->node[1 - end], *ingress = l->port[1 - end];
        }
        return node;
    }
    if (dlid == adapter_port_num(ca, port, "lid"))
        return self;
    const struct fport *t = up ? fabric_lid(f, dlid) : NULL;
    const struct fnode *x = t != NULL ? fabric_node(f, t->node) : NULL;
    if (x == NULL)
        return 0;
    int end;
    const struct flink *l = x->sw ? NULL : fabric_link(f, x->guid, t->number, &end);
    if (!x->sw && (l == NULL || !l->up))
        return 0;
    *ingress = t->number;
    return x->guid;
}

/* A subnet-management MAD's attribute (into `d`): 0, or the MAD status; -1: no answer. */
static int smp(const char *ca, int port, const uint8_t *mad, uint16_t dlid, uint8_t *d) {
    uint16_t attr = get16(mad, 16);
    int mod_port = mad[23]; /* the attribute modifier's low byte: PortInfo's port */
    struct fabric f;
    fabric_load(&f);
    int ingress, status = 0;
    uint64_t self = adapter_guid(ca, "node_guid");
    uint64_t node = reached(&f, ca, port, self, mad, dlid, &ingress);
    const struct fnode *x = node != 0 && node != self ? fabric_node(&f, node) : NULL;
    if (node == 0 || (node != self && x == NULL)) {
        fabric_free(&f);
        return -1;
    }
    memset(d, 0, 64);
    const struct fport *p0 = x != NULL && x->sw ? fabric_port(&f, node, 0) : NULL;
    if (attr == ATTR_SM_INFO && p0 != NULL && p0->lid == adapter_port_num(ca, port, "sm_lid")) {
        sm_info(node, d);
    } else if (attr == ATTR_NODE_DESC) {
        char desc[128] = "";
        if (x == NULL)
            adapter_text(ca, "node_desc", desc, sizeof desc);
        else
            snprintf(desc, sizeof desc, "%s", x->desc);
        memcpy(d, desc, strnlen(desc, 64));
    } else if (attr == ATTR_NODE_INFO) {
        struct node_facts n = x == NULL ? own_node(ca, port) : fabric_node_facts(&f, x, ingress);
        node_info(&n, d);
    } else if (attr == ATTR_PORT_INFO) {
        int number = x != NULL && x->sw ? mod_port : mod_port ? mod_port : ingress;
        uint32_t cap = (uint32_t)adapter_port_num(ca, port, "cap_mask");
        struct port_facts p = x == NULL ? own_port(ca, port) : fabric_port_facts(&f, x, number, ingress, cap);
        port_info(&p, d);
    } else if (attr == ATTR_SWITCH_INFO && x != NULL && x->sw) {
        switch_info(d);
    } else {
        status = STATUS_UNSUPPORTED;
    }
    fabric_free(&f);
    return status;
}

/* A PerfMgmt MAD to `dlid` (its attribute into `d`, whose PortSelect names the port): 0, or the
 * MAD status; -1: nobody receives it. A Set (perfquery -r) is answered with the counters as they
 * stand: nothing is reset. */
static int perf(const char *ca, int port, const uint8_t *mad, uint16_t dlid, uint8_t *d) {
    uint16_t attr = get16(mad, 16);
    int select = d[1];
    struct fabric f = {0};
    struct counters c = {.ca = ca, .port = port};
    char other[24];
    if (dlid != adapter_port_num(ca, port, "lid")) { /* routed through the fabric, as an SMP to a LID */
        fabric_load(&f);
        int ingress;
        uint64_t node = reached(&f, ca, port, adapter_guid(ca, "node_guid"), mad, dlid, &ingress);
        const struct fnode *x = node != 0 ? fabric_node(&f, node) : NULL;
        if (x == NULL) {
            fabric_free(&f);
            return -1;
        }
        if (x->sw)
            c = (struct counters){.port = select};
        else if (own_adapter(node, other, sizeof other))
            c = (struct counters){.ca = other, .port = ingress};
        else
            c = (struct counters){.f = &f, .node = node, .port = ingress};
    }
    memset(d, 0, MAD_SIZE - DATA);
    int status = 0;
    if (attr == ATTR_CLASS_PORT_INFO)
        perf_class_port_info(d);
    else if (attr == ATTR_PORT_COUNTERS)
        port_counters(&c, d);
    else if (attr == ATTR_PORT_COUNTERS_EXT)
        port_counters_ext(&c, d);
    else
        status = STATUS_UNSUPPORTED;
    fabric_free(&f);
    return status;
}

int mad_answer(const char *ca, int port, uint8_t *mad, uint16_t dlid) {
    uint8_t cls = mad[1], method = mad[3];
    uint8_t *d = mad + DATA;
    if (method != METHOD_GET && !(method == METHOD_SET && cls == CLASS_PERF))
        return 0;
    int status;
    if (cls == CLASS_SMI || cls == CLASS_SMI_DIRECT) {
        status = smp(ca, port, mad, dlid, d);
        if (status < 0)
            return 0;
    } else if (cls == CLASS_PERF && dlid != 0) {
        status = perf(ca, port, mad, dlid, d);
        if (status < 0)
            return 0;
    } else {
        return 0;
    }
    mad[3] = METHOD_GET_RESP;
    mad[4] = (uint8_t)((cls == CLASS_SMI_DIRECT ? 0x80 : 0) | (status >> 8 & 0x7f)); /* D bit: back along the path */
    mad[5] = (uint8_t)status;
    return 1;
}
