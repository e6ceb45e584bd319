/* Which CUDA devices a process sees, and in which order, as the driver enumerates them.
 *
 * The GPUs are those the NVML mock shows (NVIDIA_VISIBLE_DEVICES, device nodes). A GPU in MIG
 * mode is no CUDA device of its own: its MIG devices (compute instances) are, as far as this
 * process may use them (common/mig_view.c: NVIDIA_VISIBLE_DEVICES' MIG forms, capability nodes
 * in a container); in MIG mode with no compute instance it offers nothing. CUDA_VISIBLE_DEVICES
 * then picks among them in the order given: `MIG-<uuid>` and `MIG-GPU-<uuid>/<gi>/<ci>` one MIG
 * device; an ordinal names a GPU, a GPU UUID or a prefix of one likewise, and of a GPU in MIG mode
 * that means its MIG devices (inferred: no document says so; a GPU UUID of a MIG-mode A100 gave
 * one CUDA device in github.com/XuehaiPan/nvitop/pull/8); an entry that matches nothing ends the
 * list.
 *
 * What the driver then enumerates (NVIDIA MIG user guide, "CUDA Device Enumeration"):
 * - from R570: one compute instance per GPU instance (the first listed), at most 64 MIG devices
 *   in all, and every GPU without MIG beside them;
 * - before R570 (CUDA 11/R450 to CUDA 12/R525 as the guide words it): a single MIG device (the
 *   first), and no GPU without MIG once a MIG device is enumerated.
 * The reported driver (the state's) decides which. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/mig_ids.h"
#include "../common/mig_view.h"
#include "internal.h"

#define PER_GPU (MOKKA_MIG_MAX_GIS * MOKKA_MIG_MAX_CIS)
#define MAX_CANDIDATES (MOKKA_MAX_GPUS * PER_GPU)

typedef struct {
    unsigned slot;
    unsigned short is_mig, gi, ci;
} candidate_t;

static candidate_t g_candidates[MAX_CANDIDATES];

static unsigned clamp(unsigned v, unsigned max) { return v < max ? v : max; }

static int mig_on(const mokka_gpu_t *g) { return (g->flags & MOKKA_GPU_MIG_CAPABLE) && g->mig_current == 1; }

/* What GPU `slot` offers: itself, or the MIG devices this process may use (none in MIG mode
 * without compute instances). */
static unsigned offered(unsigned slot, candidate_t *out) {
    const mokka_gpu_t *g = mokka_gpu_now(slot);
    unsigned n = 0;
    MOKKA_READ(g, {
        n = 0;
        if (!mig_on(g)) {
            out[n++] = (candidate_t){slot, 0, 0, 0};
        } else {
            for (unsigned i = 0; i < clamp(g->mig.n_gis, MOKKA_MIG_MAX_GIS); i++) {
                const mokka_gi_t *gi = &g->mig.gis[i];
                for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS); j++)
                    if (gi->id <= MOKKA_MIG_MAX_GI_ID && gi->ci[j].id <= MOKKA_MIG_MAX_CI_ID &&
                        mokka_mig_visible(g, slot, gi, &gi->ci[j]))
                        out[n++] = (candidate_t){slot, 1, (unsigned short)gi->id, (unsigned short)gi->ci[j].id};
            }
        }
    });
    return n;
}

static int same(const candidate_t *a, const candidate_t *b) {
    return a->slot == b->slot && a->is_mig == b->is_mig && a->gi == b->gi && a->ci == b->ci;
}

/* The candidates of `all` (n) that one CUDA_VISIBLE_DEVICES entry names, appended to `out`. */
static unsigned named(const char *item, size_t len, const unsigned *gpus, unsigned n_gpus, const candidate_t *all,
                      unsigned n, candidate_t *out) {
    unsigned k = 0;
    char *rest;
    long idx = strtol(item, &rest, 10);
    if (rest != item && *rest == '\0') {
        if (idx < 0 || (unsigned long)idx >= n_gpus) return 0;
        for (unsigned i = 0; i < n; i++)
            if (all[i].slot == gpus[idx]) out[k++] = all[i];
        return k;
    }
    if (strncmp(item, "MIG-", 4) == 0) {
        for (unsigned s = 0; s < n_gpus; s++) {
            unsigned gi, ci;
            const mokka_gpu_t *g = mokka_gpu_now(gpus[s]);
            int hit;
            MOKKA_READ(g, hit = mokka_mig_item(item, len, g, &gi, &ci));
            if (!hit) continue;
            candidate_t want = {gpus[s], 1, (unsigned short)gi, (unsigned short)ci};
            for (unsigned i = 0; i < n; i++)
                if (same(&all[i], &want)) out[k++] = all[i];
            return k;
        }
        return 0;
    }
    for (unsigned s = 0; s < n_gpus; s++) {
        if (strncmp(mokka_gpu_now(gpus[s])->uuid, item, len) != 0) continue;
        for (unsigned i = 0; i < n; i++)
            if (all[i].slot == gpus[s]) out[k++] = all[i];
        return k;
    }
    return 0;
}

/* CUDA_VISIBLE_DEVICES applied to the candidates (in place); how many remain. */
static unsigned apply_cuda_visible(const char *list, const unsigned *gpus, unsigned n_gpus, candidate_t *all,
                                   unsigned n) {
    static candidate_t chosen[MAX_CANDIDATES], found[PER_GPU];
    unsigned count = 0;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[128];
        if (len >= sizeof item) len = sizeof item - 1;
        memcpy(item, p, len);
        item[len] = '\0';
        unsigned hits = len ? named(item, len, gpus, n_gpus, all, n, found) : 0;
        unsigned added = 0;
        for (unsigned h = 0; h < hits; h++) {
            int dup = 0;
            for (unsigned c = 0; c < count && !dup; c++) dup = same(&chosen[c], &found[h]);
            if (!dup && count < MAX_CANDIDATES) chosen[count++] = found[h], added++;
        }
        if (!added) break; /* nothing (new) named: the list ends here */
        if (!end) break;
        p = end + 1;
    }
    memcpy(all, chosen, count * sizeof *all);
    return count;
}

static int from_r570(void) { return atoi(g_state.hdr->driver_version) >= 570; }

/* The enumeration rules of the reported driver (see the head of this file), in place. */
static unsigned driver_rules(candidate_t *c, unsigned n) {
    unsigned k = 0, migs = 0;
    if (!from_r570()) {
        for (unsigned i = 0; i < n; i++)
            if (c[i].is_mig) {
                c[0] = c[i];
                return 1;
            }
        return n;
    }
    for (unsigned i = 0; i < n; i++) {
        if (c[i].is_mig) {
            int taken = 0;
            for (unsigned j = 0; j < k && !taken; j++) taken = c[j].is_mig && c[j].slot == c[i].slot && c[j].gi == c[i].gi;
            if (taken || migs == MOKKA_CUDA_MAX_MIG) continue;
            migs++;
        }
        c[k++] = c[i];
    }
    return k;
}

/* A MIG device's facts from its instance's records; 0 if it is gone. */
static int mig_facts(const candidate_t *c, mokka_cuda_device_t *d) {
    const mokka_gpu_t *g = mokka_gpu_now(c->slot);
    int found;
    MOKKA_READ(g, {
        found = 0;
        const mokka_mig_t *m = &g->mig;
        for (unsigned i = 0; i < clamp(m->n_gis, MOKKA_MIG_MAX_GIS) && !found; i++) {
            const mokka_gi_t *gi = &m->gis[i];
            if (gi->id != c->gi) continue;
            for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS) && !found; j++) {
                if (gi->ci[j].id != c->ci) continue;
                const mokka_gi_profile_t *gp = &m->profiles[clamp(gi->profile, MOKKA_MIG_MAX_GI_PROFILES - 1)];
                const mokka_ci_profile_t *cp = &gp->ci[clamp(gi->ci[j].profile, MOKKA_MIG_MAX_CI_PROFILES - 1)];
                d->multiprocessors = cp->multiprocessor_count;
                d->memory = gp->memory_mib * 1024 * 1024;
                memcpy(d->uuid, gi->ci[j].uuid, sizeof d->uuid);
                snprintf(d->name, sizeof d->name, "%.*s MIG %.*s", (int)sizeof g->name, g->name, (int)sizeof cp->name,
                         cp->name);
                found = 1;
            }
        }
    });
    d->uuid[sizeof d->uuid - 1] = '\0';
    return found;
}

unsigned mokka_cuda_enumerate(void) {
    unsigned gpus[MOKKA_MAX_GPUS];
    unsigned n_gpus = mokka_visible_slots(gpus);
    mokka_mig_view_init(gpus, n_gpus);
    unsigned n = 0;
    for (unsigned s = 0; s < n_gpus; s++) n += offered(gpus[s], g_candidates + n);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cvd) n = apply_cuda_visible(cvd, gpus, n_gpus, g_candidates, n);
    n = driver_rules(g_candidates, n);
    unsigned count = 0;
    for (unsigned i = 0; i < n && count < MOKKA_CUDA_MAX_DEVICES; i++) {
        mokka_cuda_device_t *d = &g_cuda.devices[count];
        memset(d, 0, sizeof *d);
        d->slot = g_candidates[i].slot;
        d->is_mig = g_candidates[i].is_mig;
        d->gi = g_candidates[i].gi;
        d->ci = g_candidates[i].ci;
        if (d->is_mig && !mig_facts(&g_candidates[i], d)) continue; /* destroyed meanwhile */
        count++;
    }
    return count;
}
