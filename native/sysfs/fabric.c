/* The InfiniBand subnet around the node's adapters: see fabric.h. */
#define _GNU_SOURCE
#include "fabric.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "shim.h"

/* Beside the staged tree: a dot file, which no tool lists (hostsetup/infiniband.py: FABRIC). */
static const char FABRIC[] = "/sys/class/infiniband_mad/.mokka-fabric";

void fabric_free(struct fabric *f) {
    for (int i = 0; i < f->ncounters; i++)
        free(f->counters[i].pairs);
    free(f->nodes), free(f->ports), free(f->links), free(f->counters);
    memset(f, 0, sizeof *f);
}

/* The node's own adapters' links are as their staged ports say now (a fault written there shows
 * at once); the fabric file carries the other nodes' (the local cluster rewrites it). */
static void local_links(struct fabric *f) {
    for (int i = 0; i < 64; i++) {
        char ca[24];
        snprintf(ca, sizeof ca, "mlx5_%d", i);
        uint64_t guid = adapter_guid(ca, "node_guid");
        if (guid == 0)
            break;
        for (int k = 0; k < f->nlinks; k++)
            for (int e = 0; e < 2; e++)
                if (f->links[k].node[e] == guid)
                    f->links[k].up = adapter_port_up(ca, f->links[k].port[e]);
    }
}

/* The fabric file, parsed (empty when there is none). */
void fabric_load(struct fabric *f) {
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
    f->counters = calloc((size_t)lines, sizeof *f->counters);
    if (f->nodes == NULL || f->ports == NULL || f->links == NULL || f->counters == NULL) {
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
        } else if (sscanf(line, "counters %llx %d %n", &a, &f->counters[f->ncounters].port, &n) == 2 && n > 0) {
            struct fcounters *c = &f->counters[f->ncounters];
            size_t size = strlen(line + n) + 2;
            c->pairs = malloc(size);
            if (c->pairs != NULL) {
                snprintf(c->pairs, size, " %s", line + n); /* each pair after a space */
                c->node = a;
                f->ncounters++;
            }
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
    local_links(f);
}

const struct fnode *fabric_node(const struct fabric *f, uint64_t guid) {
    for (int i = 0; i < f->nnodes; i++)
        if (f->nodes[i].guid == guid)
            return &f->nodes[i];
    return NULL;
}

const struct flink *fabric_link(const struct fabric *f, uint64_t node, int port, int *end) {
    for (int i = 0; i < f->nlinks; i++)
        for (int e = 0; e < 2; e++)
            if (f->links[i].node[e] == node && f->links[i].port[e] == port) {
                *end = e;
                return &f->links[i];
            }
    return NULL;
}

const struct fport *fabric_port(const struct fabric *f, uint64_t node, int number) {
    for (int i = 0; i < f->nports; i++)
        if (f->ports[i].node == node && f->ports[i].number == number)
            return &f->ports[i];
    return NULL;
}

const struct fport *fabric_lid(const struct fabric *f, unsigned lid) {
    for (int i = 0; i < f->nports; i++)
        if (f->ports[i].lid == lid)
            return &f->ports[i];
    return NULL;
}

uint64_t fabric_counter(const struct fabric *f, uint64_t node, int port, const char *name) {
    char key[96];
    snprintf(key, sizeof key, " %s=", name);
    for (int i = 0; i < f->ncounters; i++)
        if (f->counters[i].node == node && f->counters[i].port == port) {
            const char *at = strstr(f->counters[i].pairs, key);
            return at != NULL ? strtoull(at + strlen(key), NULL, 10) : 0;
        }
    return 0;
}
