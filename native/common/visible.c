/* Which of the node's GPUs this process sees, as a container runtime arranges it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mig_ids.h"
#include "state_read.h"

/* NVIDIA_VISIBLE_DEVICES: "all", "none", "void", or indices / UUIDs separated by commas. */
static int listed(const char *list, const mokka_gpu_t *g) {
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if (n) {
            char item[96];
            if (n >= sizeof item) n = sizeof item - 1;
            memcpy(item, p, n);
            item[n] = '\0';
            char *rest;
            unsigned long idx = strtoul(item, &rest, 10);
            unsigned gi, ci;
            if (mokka_mig_item(item, n, g, &gi, &ci)) {
                return 1; /* one of its MIG devices: MIG-<uuid>, <gpu>:<mig> */
            } else if (*rest == '\0' && rest != item) {
                if (idx == g->index) return 1;
            } else if (strncmp(g->uuid, item, n) == 0) {
                return 1; /* full UUID or a unique prefix, as the runtime accepts */
            }
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static int visible(const mokka_gpu_t *g, const char *env) {
    if (!env) return 1;
    if (!*env || !strcmp(env, "none")) return 0;
    return !strcmp(env, "all") || listed(env, g);
}

static int has_node(const mokka_gpu_t *g) {
    char node[64];
    snprintf(node, sizeof node, "/dev/nvidia%u", g->minor_number);
    return access(node, F_OK) == 0;
}

unsigned mokka_visible_slots(unsigned out[MOKKA_MAX_GPUS]) {
    const char *env = getenv("NVIDIA_VISIBLE_DEVICES");
    unsigned count = g_state.hdr->gpu_count;
    /* Inside a container (as on a real node) the GPUs are those whose /dev/nvidiaN exist.
     * Where none of them exists (a bare host, a CI machine) every GPU is shown. */
    int dev_filter = 0;
    if (!getenv("MOKKA_IGNORE_DEVICE_NODES"))
        for (unsigned i = 0; i < count && !dev_filter; i++) dev_filter = has_node(mokka_gpu_now(i));
    /* "void" tells the runtime to keep out (a CDI spec's containers: nvidia-ctk's, the device
     * plugin's, NVIDIA's DRA driver's; the DRA driver's own privileged pods): what the container
     * sees is its own /dev, the nodes a spec added or, with none of them (a privileged pod on a
     * GPU node), every GPU. "none" is the driver without devices. */
    if (env && !strcmp(env, "void")) env = NULL;
    unsigned n = 0;
    for (unsigned i = 0; i < count; i++) {
        const mokka_gpu_t *g = mokka_gpu_now(i);
        if (!visible(g, env) || (dev_filter && !has_node(g))) continue;
        out[n++] = i;
    }
    return n;
}
