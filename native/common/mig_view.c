/* Which MIG devices this process may use; see mig_view.h. */
#define _GNU_SOURCE
#include "mig_view.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mig_ids.h"
#include "state_read.h"

mokka_mig_view_t g_mokka_mig_view;

static unsigned clamp(unsigned v, unsigned max) { return v < max ? v : max; }
static unsigned gi_cap_minor(unsigned gpu_minor, unsigned gi) { return 3 + 135 * gpu_minor + 9 * gi; }

static int cap_present(unsigned minor) {
    return minor < MOKKA_CAP_MINORS && (g_mokka_mig_view.caps[minor / 8] >> (minor % 8) & 1);
}

static void scan_caps(void) {
    DIR *dir = opendir("/dev/nvidia-caps");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        unsigned minor;
        char tail;
        if (sscanf(e->d_name, "nvidia-cap%u%c", &minor, &tail) == 1 && minor < MOKKA_CAP_MINORS)
            g_mokka_mig_view.caps[minor / 8] |= (unsigned char)(1u << (minor % 8));
    }
    closedir(dir);
}

static void read_visible_list(const unsigned *slots, unsigned n_slots) {
    const char *env = getenv("NVIDIA_VISIBLE_DEVICES");
    if (!env || !strcmp(env, "all") || !strcmp(env, "void")) return; /* void: the device nodes decide */
    mokka_mig_view_t *v = &g_mokka_mig_view;
    v->by_list = 1;
    for (const char *p = env; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        for (unsigned s = 0; n && s < n_slots; s++) {
            const mokka_gpu_t *g = mokka_gpu_now(slots[s]);
            unsigned gi, ci;
            char item[128];
            snprintf(item, sizeof item, "%.*s", (int)n, p);
            char *rest;
            unsigned long idx = strtoul(item, &rest, 10);
            if (mokka_mig_item(p, n, g, &gi, &ci)) {
                for (unsigned i = 0; i < clamp(g->mig.n_gis, MOKKA_MIG_MAX_GIS); i++)
                    for (unsigned j = 0; j < clamp(g->mig.gis[i].n_cis, MOKKA_MIG_MAX_CIS); j++)
                        if (g->mig.gis[i].id == gi && g->mig.gis[i].ci[j].id == ci && v->n_uuids < MOKKA_MAX_GPUS)
                            memcpy(v->uuids[v->n_uuids++], g->mig.gis[i].ci[j].uuid, 48);
            } else if ((*rest == '\0' && rest != item && idx == g->index) || (n > 4 && !strncmp(g->uuid, item, n))) {
                if (slots[s] < 64) v->whole |= 1ull << slots[s];
            }
        }
        if (!end) break;
        p = end + 1;
    }
}

void mokka_mig_view_init(const unsigned *slots, unsigned n) {
    memset(&g_mokka_mig_view, 0, sizeof g_mokka_mig_view);
    int in_container = 0;
    for (unsigned s = 0; s < n; s++) {
        char node[64];
        snprintf(node, sizeof node, "/dev/nvidia%u", mokka_gpu_now(slots[s])->minor_number);
        in_container |= access(node, F_OK) == 0;
    }
    if (in_container && !getenv("MOKKA_IGNORE_DEVICE_NODES")) {
        g_mokka_mig_view.by_caps = 1;
        scan_caps();
    }
    read_visible_list(slots, n);
}

int mokka_mig_view_sees(const mokka_gpu_t *g, unsigned slot, const mokka_gi_t *gi, const mokka_ci_t *c) {
    const mokka_mig_view_t *v = &g_mokka_mig_view;
    if (v->by_list && !(slot < 64 && (v->whole >> slot & 1))) {
        unsigned k = 0;
        while (k < v->n_uuids && strncmp(v->uuids[k], c->uuid, sizeof c->uuid)) k++;
        if (k == v->n_uuids) return 0;
    }
    if (v->by_caps) {
        unsigned base = gi_cap_minor(g->minor_number, gi->id);
        if (!cap_present(base) || !cap_present(base + 1 + c->id)) return 0;
    }
    return 1;
}
