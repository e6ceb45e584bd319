/*
 * The InfiniBand subnet around the node's adapters, as host setup (or the local cluster) writes
 * it beside the staged tree (gpumodel/fabric.py renders it): nodes (adapters and switches), their
 * ports' GUIDs and LIDs, the links between ports, and the other nodes' adapter ports' counters.
 */
#ifndef MOKKA_FABRIC_H
#define MOKKA_FABRIC_H

#include <stdint.h>

struct fnode {
    uint64_t guid;
    int sw; /* a switch, else a channel adapter */
    int ports;
    unsigned device_id;
    char desc[65];
};

struct fport {
    uint64_t node, guid;
    int number; /* a switch: 0 alone, its management port */
    unsigned lid;
};

struct flink {
    uint64_t node[2];
    int port[2];
    int up;
    char rate[24]; /* "(4X NDR)" */
};

/* An adapter port's counters as the fabric last saw them (the local cluster copies each node's
 * into every other node's fabric): " name=value name=value ...". */
struct fcounters {
    uint64_t node;
    int port;
    char *pairs;
};

struct fabric {
    struct fnode *nodes;
    struct fport *ports;
    struct flink *links;
    struct fcounters *counters;
    int nnodes, nports, nlinks, ncounters;
};

/* The fabric file, parsed (empty when there is none); the node's own adapters' links as their
 * staged ports say now (a fault written there shows at once). */
void fabric_load(struct fabric *f);
void fabric_free(struct fabric *f);

const struct fnode *fabric_node(const struct fabric *f, uint64_t guid);

/* The link at (node, port), and which of its ends that is. */
const struct flink *fabric_link(const struct fabric *f, uint64_t node, int port, int *end);

const struct fport *fabric_port(const struct fabric *f, uint64_t node, int number);

/* The port that holds `lid`. */
const struct fport *fabric_lid(const struct fabric *f, unsigned lid);

/* Counter `name` (its sysfs file name) of port `port` of adapter `node`; 0 when the fabric does
 * not carry it. */
uint64_t fabric_counter(const struct fabric *f, uint64_t node, int port, const char *name);

#endif
