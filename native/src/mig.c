/* Multi-Instance GPU: MIG mode, GPU instances (GIs), compute instances (CIs) and MIG device
 * handles, answered from the state's mokka_mig_t (tables and layout; gpumodel/mig.py has the
 * rules this file mirrors: placement choice, GI ids, CI profiles, MIG UUIDs).
 *
 * Changes (mode, create, destroy) go through the live-state writer (common/state_write.c): the
 * file's lock, then the latch, so every process on the node sees them and they last until
 * destroyed or the node is staged again. A process that cannot open the state for writing (a
 * read-only mount in a container, an unprivileged user) gets NVML_ERROR_NO_PERMISSION, as
 * unprivileged callers do on real hardware.
 *
 * Handles are addresses in fixed tables, one entry per (GPU as this process numbers it, GI id[,
 * CI id]): a handle names an instance by position, and is valid while that instance exists.
 * MIG device handles are struct nvmlDevice_st entries (filled at nvmlInit with their parent's
 * slot) so that getters not specific to MIG answer for the parent. Which MIG devices a process
 * sees (NVIDIA_VISIBLE_DEVICES, capability nodes in a container) is common/mig_view.c's, which
 * the mock libcuda shares. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/mig_ids.h"
#include "../common/mig_view.h"
#include "../common/state_write.h"
#include "internal.h"

#define GI_IDS (MOKKA_MIG_MAX_GI_ID + 1)
#define CI_IDS (MOKKA_MIG_MAX_CI_ID + 1)

struct nvmlGpuInstance_st {
    uint32_t unused;
};
struct nvmlComputeInstance_st {
    uint32_t unused;
};

struct nvmlDevice_st g_mokka_mig_devices[MOKKA_MAX_GPUS][GI_IDS][CI_IDS];
static struct nvmlGpuInstance_st g_gi_handles[MOKKA_MAX_GPUS][GI_IDS];
static struct nvmlComputeInstance_st g_ci_handles[MOKKA_MAX_GPUS][GI_IDS][CI_IDS];

static unsigned clamp(unsigned v, unsigned max) { return v < max ? v : max; }
static int overlaps(unsigned a, unsigned alen, unsigned b, unsigned blen) { return a < b + blen && b < a + alen; }

/* ---- set up at nvmlInit --------------------------------------------------------------- */

void mokka_mig_reset(void) {
    unsigned slots[MOKKA_MAX_GPUS];
    for (unsigned v = 0; v < g_mokka.visible_count; v++) {
        for (unsigned i = 0; i < GI_IDS; i++)
            for (unsigned c = 0; c < CI_IDS; c++)
                g_mokka_mig_devices[v][i][c] = (struct nvmlDevice_st){MOKKA_MIG_HANDLE_MAGIC, v, g_mokka.devices[v].slot,
                                                                       i << 8 | c};
        slots[v] = g_mokka.devices[v].slot;
    }
    mokka_mig_view_init(slots, g_mokka.visible_count); /* which MIG devices this process sees */
}

/* ---- reading the layout ------------------------------------------------------------ */

/* Ids a handle can stand for (a state holding others is corrupt; such records are skipped). */
static int ids_valid(unsigned gi, unsigned ci) { return gi <= MOKKA_MIG_MAX_GI_ID && ci <= MOKKA_MIG_MAX_CI_ID; }

static int mig_on(const mokka_gpu_t *g) { return (g->flags & MOKKA_GPU_MIG_CAPABLE) && g->mig_current == 1; }

static int gi_pos(const mokka_mig_t *m, unsigned id) {
    for (unsigned i = 0; i < clamp(m->n_gis, MOKKA_MIG_MAX_GIS); i++)
        if (m->gis[i].id == id) return (int)i;
    return -1;
}

static int ci_pos(const mokka_gi_t *gi, unsigned id) {
    for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS); j++)
        if (gi->ci[j].id == id) return (int)j;
    return -1;
}

static int profile_pos_by_id(const mokka_mig_t *m, unsigned id) {
    for (unsigned i = 0; i < clamp(m->n_profiles, MOKKA_MIG_MAX_GI_PROFILES); i++)
        if (m->profiles[i].id == id) return (int)i;
    return -1;
}

static const mokka_gi_profile_t *gi_profile(const mokka_mig_t *m, const mokka_gi_t *gi) {
    return &m->profiles[clamp(gi->profile, MOKKA_MIG_MAX_GI_PROFILES - 1)];
}

static const mokka_ci_profile_t *ci_profile(const mokka_gi_profile_t *p, const mokka_ci_t *c) {
    return &p->ci[clamp(c->profile, MOKKA_MIG_MAX_CI_PROFILES - 1)];
}

/* The `index`-th MIG device this process sees on the GPU in `slot`: its GI and CI ids. */
static int nth_device(const mokka_gpu_t *g, unsigned slot, unsigned index, unsigned *gi_id, unsigned *ci_id) {
    if (!mig_on(g)) return 0;
    const mokka_mig_t *m = &g->mig;
    unsigned k = 0;
    for (unsigned i = 0; i < clamp(m->n_gis, MOKKA_MIG_MAX_GIS); i++) {
        const mokka_gi_t *gi = &m->gis[i];
        for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS); j++) {
            if (!ids_valid(gi->id, gi->ci[j].id)) continue; /* a corrupt record: no handle for it */
            if (!mokka_mig_visible(g, slot, gi, &gi->ci[j])) continue;
            if (k++ == index) {
                *gi_id = gi->id;
                *ci_id = gi->ci[j].id;
                return 1;
            }
        }
    }
    return 0;
}

/* The position of MIG device (gi, ci) among those this process sees, or -1 if it is gone. */
static int device_index(const mokka_gpu_t *g, unsigned slot, unsigned gi_id, unsigned ci_id) {
    if (!mig_on(g)) return -1;
    const mokka_mig_t *m = &g->mig;
    int k = 0;
    for (unsigned i = 0; i < clamp(m->n_gis, MOKKA_MIG_MAX_GIS); i++) {
        const mokka_gi_t *gi = &m->gis[i];
        for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS); j++) {
            if (!ids_valid(gi->id, gi->ci[j].id)) continue;
            if (!mokka_mig_visible(g, slot, gi, &gi->ci[j])) continue;
            if (gi->id == gi_id && gi->ci[j].id == ci_id) return k;
            k++;
        }
    }
    return -1;
}

/* ---- handles ----------------------------------------------------------------------- */

typedef struct {
    unsigned v;      /* the parent's index as this process sees it */
    unsigned gi, ci; /* instance ids */
    const struct nvmlDevice_st *parent;
} where_t;

static int decode(const void *h, const void *table, size_t entry, size_t per_gpu, size_t count, size_t *pos) {
    uintptr_t off = (uintptr_t)h - (uintptr_t)table;
    if ((uintptr_t)h < (uintptr_t)table || off >= entry * count || off % entry) return 0;
    *pos = off / entry;
    return *pos / per_gpu < g_mokka.visible_count;
}

static nvmlReturn_t gpu_instance(nvmlGpuInstance_t handle, where_t *w, const mokka_gpu_t **out) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    size_t pos;
    if (!decode(handle, g_gi_handles, sizeof **g_gi_handles, GI_IDS, MOKKA_MAX_GPUS * GI_IDS, &pos))
        return NVML_ERROR_INVALID_ARGUMENT;
    w->v = (unsigned)(pos / GI_IDS);
    w->gi = (unsigned)(pos % GI_IDS);
    w->parent = &g_mokka.devices[w->v];
    const mokka_gpu_t *g = mokka_handle_gpu(w->parent);
    int found;
    MOKKA_READ(g, found = mig_on(g) && gi_pos(&g->mig, w->gi) >= 0);
    if (!found) return NVML_ERROR_INVALID_ARGUMENT; /* destroyed: the handle is stale */
    *out = g;
    return NVML_SUCCESS;
}

static nvmlReturn_t compute_instance(nvmlComputeInstance_t handle, where_t *w, const mokka_gpu_t **out) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    size_t pos;
    if (!decode(handle, g_ci_handles, sizeof ***g_ci_handles, GI_IDS * CI_IDS, MOKKA_MAX_GPUS * GI_IDS * CI_IDS, &pos))
        return NVML_ERROR_INVALID_ARGUMENT;
    w->v = (unsigned)(pos / (GI_IDS * CI_IDS));
    w->gi = (unsigned)(pos / CI_IDS % GI_IDS);
    w->ci = (unsigned)(pos % CI_IDS);
    w->parent = &g_mokka.devices[w->v];
    const mokka_gpu_t *g = mokka_handle_gpu(w->parent);
    int found;
    MOKKA_READ(g, {
        int i = mig_on(g) ? gi_pos(&g->mig, w->gi) : -1;
        found = i >= 0 && ci_pos(&g->mig.gis[i], w->ci) >= 0;
    });
    if (!found) return NVML_ERROR_INVALID_ARGUMENT;
    *out = g;
    return NVML_SUCCESS;
}

/* Where a MIG device handle points (no state read). */
static nvmlReturn_t decode_mig(const void *handle, where_t *w) {
    if (g_mokka_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    size_t pos;
    if (!decode(handle, g_mokka_mig_devices, sizeof ***g_mokka_mig_devices, GI_IDS * CI_IDS,
                MOKKA_MAX_GPUS * GI_IDS * CI_IDS, &pos))
        return NVML_ERROR_INVALID_ARGUMENT;
    w->v = (unsigned)(pos / (GI_IDS * CI_IDS));
    w->gi = (unsigned)(pos / CI_IDS % GI_IDS);
    w->ci = (unsigned)(pos % CI_IDS);
    w->parent = &g_mokka.devices[w->v];
    return NVML_SUCCESS;
}

/* The GI and CI records of a MIG device in record `g` (a consistent copy), if it exists and
 * this process sees it. */
static int locate(const mokka_gpu_t *g, const where_t *w, const mokka_gi_t **gi, const mokka_ci_t **ci) {
    if (!mig_on(g)) return 0;
    int i = gi_pos(&g->mig, w->gi);
    if (i < 0) return 0;
    int j = ci_pos(&g->mig.gis[i], w->ci);
    if (j < 0) return 0;
    *gi = &g->mig.gis[i];
    *ci = &g->mig.gis[i].ci[j];
    return mokka_mig_visible(g, w->parent->slot, *gi, *ci);
}

/* A MIG device handle this process may use (its instance still exists and is visible). */
static nvmlReturn_t mig_device(nvmlDevice_t handle, where_t *w, const mokka_gpu_t **out) {
    nvmlReturn_t r = decode_mig(handle, w);
    if (r != NVML_SUCCESS) return r;
    const mokka_gpu_t *g = mokka_handle_gpu(w->parent);
    const mokka_gi_t *gi;
    const mokka_ci_t *ci;
    int found;
    MOKKA_READ(g, found = locate(g, w, &gi, &ci));
    if (!found) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->flags & MOKKA_GPU_LOST) return NVML_ERROR_GPU_IS_LOST;
    *out = g;
    return NVML_SUCCESS;
}

const struct nvmlDevice_st *mokka_mig_parent(const void *handle) {
    where_t w;
    const mokka_gpu_t *g;
    return mig_device((nvmlDevice_t)(uintptr_t)handle, &w, &g) == NVML_SUCCESS ? w.parent : NULL;
}

#define GET_MIG(handle, w, g)                                   \
    where_t w;                                                  \
    const mokka_gpu_t *g;                                       \
    do {                                                        \
        nvmlReturn_t r_ = mig_device((handle), &w, &g);         \
        if (r_ != NVML_SUCCESS) return r_;                      \
    } while (0)

/* ---- mode -------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    if (mokka_is_mig_handle(device)) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_NOT_SUPPORTED;
    GET_GPU(device, g);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, (*current = g->mig_current, *pending = g->mig_pending));
    return NVML_SUCCESS;
}

/* ---- changes through the state writer ---------------------------------------------- */

enum { SET_MODE, CREATE_GI, DESTROY_GI, CREATE_CI, DESTROY_CI };

typedef struct {
    int op;
    unsigned slot;
    unsigned mode;
    unsigned profile_id;
    int placed;
    unsigned start;
    unsigned gi, ci;         /* target ids; CREATE_*: the new id */
    nvmlReturn_t activation; /* SET_MODE */
} change_t;

/* Occupancy of a GPU's memory and GPU slices, for choosing placements. */
typedef struct {
    unsigned n;
    unsigned start[MOKKA_MIG_MAX_GIS], msize[MOKKA_MIG_MAX_GIS], slices[MOKKA_MIG_MAX_GIS], pid[MOKKA_MIG_MAX_GIS];
} gi_occ_t;

static void gi_occupancy(const mokka_mig_t *m, gi_occ_t *o) {
    o->n = 0;
    for (unsigned i = 0; i < clamp(m->n_gis, MOKKA_MIG_MAX_GIS); i++) {
        const mokka_gi_profile_t *p = gi_profile(m, &m->gis[i]);
        o->start[o->n] = m->gis[i].start;
        o->msize[o->n] = p->memory_slices;
        o->slices[o->n] = p->slice_count;
        o->pid[o->n++] = p->id;
    }
}

static int memory_free(const gi_occ_t *o, unsigned start, unsigned size) {
    for (unsigned i = 0; i < o->n; i++)
        if (overlaps(start, size, o->start[i], o->msize[i])) return 0;
    return 1;
}

static int gi_fits(const mokka_mig_t *m, const gi_occ_t *o, const mokka_gi_profile_t *p, unsigned start) {
    int placement = 0;
    for (unsigned k = 0; k < clamp(p->n_placements, MOKKA_MIG_MAX_PLACEMENTS); k++) placement |= p->placements[k] == start;
    if (!placement || !memory_free(o, start, p->memory_slices) || o->n >= MOKKA_MIG_MAX_GIS) return 0;
    unsigned slices = p->slice_count, same = 0;
    for (unsigned i = 0; i < o->n; i++) slices += o->slices[i], same += o->pid[i] == p->id;
    return slices <= m->gpu_slices && same < p->instance_count;
}

/* The placement the driver picks (gpumodel/mig.py choose_gi_start): the one blocking the
 * fewest still-free placements of any profile, the lowest start on a tie. */
static int choose_gi_start(const mokka_mig_t *m, const gi_occ_t *o, const mokka_gi_profile_t *p, unsigned *start) {
    int found = 0;
    unsigned best_cost = 0;
    for (unsigned k = 0; k < clamp(p->n_placements, MOKKA_MIG_MAX_PLACEMENTS); k++) {
        unsigned s = p->placements[k];
        if (!gi_fits(m, o, p, s)) continue;
        unsigned cost = 0;
        for (unsigned q = 0; q < clamp(m->n_profiles, MOKKA_MIG_MAX_GI_PROFILES); q++) {
            const mokka_gi_profile_t *other = &m->profiles[q];
            for (unsigned t = 0; t < clamp(other->n_placements, MOKKA_MIG_MAX_PLACEMENTS); t++) {
                unsigned os = other->placements[t];
                if (memory_free(o, os, other->memory_slices) && overlaps(os, other->memory_slices, s, p->memory_slices))
                    cost++;
            }
        }
        if (!found || cost < best_cost) found = 1, best_cost = cost, *start = s;
    }
    return found;
}

static unsigned gi_remaining(const mokka_mig_t *m, const mokka_gi_profile_t *p) {
    gi_occ_t o;
    gi_occupancy(m, &o);
    unsigned n = 0, s;
    while (o.n < MOKKA_MIG_MAX_GIS && choose_gi_start(m, &o, p, &s)) {
        o.start[o.n] = s, o.msize[o.n] = p->memory_slices, o.slices[o.n] = p->slice_count, o.pid[o.n++] = p->id;
        n++;
    }
    return n;
}

static int ci_fits(const mokka_gi_t *gi, const mokka_gi_profile_t *gp, const mokka_ci_profile_t *cp, unsigned start) {
    int placement = 0;
    for (unsigned k = 0; k < clamp(cp->n_placements, MOKKA_MIG_MAX_PLACEMENTS); k++) placement |= cp->placements[k] == start;
    if (!placement || clamp(gi->n_cis, MOKKA_MIG_MAX_CIS) >= MOKKA_MIG_MAX_CIS) return 0;
    unsigned same = 0;
    for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS); j++) {
        const mokka_ci_profile_t *other = ci_profile(gp, &gi->ci[j]);
        if (overlaps(start, cp->slice_count, gi->ci[j].start, other->slice_count)) return 0;
        same += other->id == cp->id;
    }
    return same < cp->instance_count;
}

static int choose_ci_start(const mokka_gi_t *gi, const mokka_gi_profile_t *gp, const mokka_ci_profile_t *cp,
                           unsigned *start) {
    for (unsigned k = 0; k < clamp(cp->n_placements, MOKKA_MIG_MAX_PLACEMENTS); k++)
        if (ci_fits(gi, gp, cp, cp->placements[k])) return *start = cp->placements[k], 1;
    return 0;
}

static unsigned ci_remaining(const mokka_gi_t *gi, const mokka_gi_profile_t *gp, const mokka_ci_profile_t *cp) {
    mokka_gi_t sim = *gi;
    unsigned n = 0, s;
    while (choose_ci_start(&sim, gp, cp, &s)) {
        sim.ci[sim.n_cis++] = (mokka_ci_t){.id = 0, .profile = (uint32_t)(cp - gp->ci), .start = s};
        n++;
    }
    return n;
}

static int ci_profile_pos(const mokka_gi_profile_t *gp, unsigned id) {
    for (unsigned j = 0; j < clamp(gp->n_ci_profiles, MOKKA_MIG_MAX_CI_PROFILES); j++)
        if (gp->ci[j].id == id) return (int)j;
    return -1;
}

static int apply_mode(mokka_gpu_t *g, change_t *c) {
    c->activation = NVML_SUCCESS;
    if (c->mode == g->mig_current) {
        g->mig_pending = c->mode;
        return 0;
    }
    if (g->mig_current == 1 && g->mig.n_gis) return NVML_ERROR_IN_USE;
    g->mig_pending = c->mode;
    if (g->n_procs) { /* the GPU is busy: the change waits for the next reset */
        c->activation = NVML_ERROR_IN_USE;
        return 0;
    }
    g->mig_current = c->mode;
    g->mig.n_gis = 0;
    return 0;
}

static int apply_create_gi(mokka_gpu_t *g, change_t *c) {
    mokka_mig_t *m = &g->mig;
    int pos = profile_pos_by_id(m, c->profile_id);
    if (pos < 0) return NVML_ERROR_INVALID_ARGUMENT;
    const mokka_gi_profile_t *p = &m->profiles[pos];
    gi_occ_t o;
    gi_occupancy(m, &o);
    unsigned start = c->start;
    if (c->placed) {
        int valid = 0;
        for (unsigned k = 0; k < clamp(p->n_placements, MOKKA_MIG_MAX_PLACEMENTS); k++) valid |= p->placements[k] == start;
        if (!valid) return NVML_ERROR_INVALID_ARGUMENT;
        if (!gi_fits(m, &o, p, start)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else if (!choose_gi_start(m, &o, p, &start)) {
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    unsigned id = p->first_id + start / p->memory_slices;
    if (id > MOKKA_MIG_MAX_GI_ID || gi_pos(m, id) >= 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned at = 0, n = clamp(m->n_gis, MOKKA_MIG_MAX_GIS);
    while (at < n && m->gis[at].id < id) at++;
    memmove(&m->gis[at + 1], &m->gis[at], (n - at) * sizeof m->gis[0]);
    memset(&m->gis[at], 0, sizeof m->gis[0]);
    m->gis[at].id = id;
    m->gis[at].profile = (uint32_t)pos;
    m->gis[at].start = start;
    m->n_gis = n + 1;
    c->gi = id;
    return 0;
}

static int apply_destroy_gi(mokka_gpu_t *g, change_t *c) {
    mokka_mig_t *m = &g->mig;
    int at = gi_pos(m, c->gi);
    if (at < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->gis[at].n_cis) return NVML_ERROR_IN_USE;
    unsigned n = clamp(m->n_gis, MOKKA_MIG_MAX_GIS);
    memmove(&m->gis[at], &m->gis[at + 1], (n - (unsigned)at - 1) * sizeof m->gis[0]);
    memset(&m->gis[n - 1], 0, sizeof m->gis[0]);
    m->n_gis = n - 1;
    return 0;
}

static int apply_create_ci(mokka_gpu_t *g, change_t *c) {
    mokka_mig_t *m = &g->mig;
    int at = gi_pos(m, c->gi);
    if (at < 0) return NVML_ERROR_INVALID_ARGUMENT;
    mokka_gi_t *gi = &m->gis[at];
    const mokka_gi_profile_t *gp = gi_profile(m, gi);
    int pos = ci_profile_pos(gp, c->profile_id);
    if (pos < 0) return NVML_ERROR_NOT_SUPPORTED;
    const mokka_ci_profile_t *cp = &gp->ci[pos];
    unsigned start = c->start;
    if (c->placed) {
        int valid = 0;
        for (unsigned k = 0; k < clamp(cp->n_placements, MOKKA_MIG_MAX_PLACEMENTS); k++) valid |= cp->placements[k] == start;
        if (!valid) return NVML_ERROR_INVALID_ARGUMENT;
        if (!ci_fits(gi, gp, cp, start)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else if (!choose_ci_start(gi, gp, cp, &start)) {
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    unsigned id = 0, n = clamp(gi->n_cis, MOKKA_MIG_MAX_CIS);
    while (ci_pos(gi, id) >= 0) id++;
    if (id > MOKKA_MIG_MAX_CI_ID) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned k = 0;
    while (k < n && gi->ci[k].id < id) k++;
    memmove(&gi->ci[k + 1], &gi->ci[k], (n - k) * sizeof gi->ci[0]);
    mokka_ci_t *ci = &gi->ci[k];
    memset(ci, 0, sizeof *ci);
    ci->id = id;
    ci->profile = (uint32_t)pos;
    ci->start = start;
    mokka_mig_uuid(ci->uuid, g->uuid, gi->id, gp->id, id, cp->id);
    gi->n_cis = n + 1;
    c->ci = id;
    return 0;
}

static int apply_destroy_ci(mokka_gpu_t *g, change_t *c) {
    mokka_mig_t *m = &g->mig;
    int at = gi_pos(m, c->gi);
    if (at < 0) return NVML_ERROR_INVALID_ARGUMENT;
    mokka_gi_t *gi = &m->gis[at];
    int k = ci_pos(gi, c->ci);
    if (k < 0) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = clamp(gi->n_cis, MOKKA_MIG_MAX_CIS);
    memmove(&gi->ci[k], &gi->ci[k + 1], (n - (unsigned)k - 1) * sizeof gi->ci[0]);
    memset(&gi->ci[n - 1], 0, sizeof gi->ci[0]);
    gi->n_cis = n - 1;
    return 0;
}

static int apply(mokka_node_t *node, mokka_gpu_t *gpus, unsigned count, void *ctx) {
    (void)node;
    change_t *c = ctx;
    if (c->slot >= count) return NVML_ERROR_UNKNOWN;
    mokka_gpu_t *g = &gpus[c->slot];
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE)) return NVML_ERROR_NOT_SUPPORTED;
    if (c->op == SET_MODE) return apply_mode(g, c);
    if (g->mig_current != 1) return NVML_ERROR_NOT_SUPPORTED;
    switch (c->op) {
    case CREATE_GI: return apply_create_gi(g, c);
    case DESTROY_GI: return apply_destroy_gi(g, c);
    case CREATE_CI: return apply_create_ci(g, c);
    case DESTROY_CI: return apply_destroy_ci(g, c);
    default: return NVML_ERROR_UNKNOWN;
    }
}

static nvmlReturn_t change(change_t *c) {
    int rc = mokka_state_change(apply, c);
    if (rc == MOKKA_WRITE_NO_ACCESS) return NVML_ERROR_NO_PERMISSION;
    if (rc < 0) return NVML_ERROR_UNKNOWN;
    return (nvmlReturn_t)rc;
}

EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activationStatus) {
    if (mokka_is_mig_handle(device)) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_NOT_SUPPORTED;
    GET_GPU(device, g);
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE)) return NVML_ERROR_NOT_SUPPORTED;
    if (!activationStatus || mode > NVML_DEVICE_MIG_ENABLE) return NVML_ERROR_INVALID_ARGUMENT;
    change_t c = {.op = SET_MODE, .slot = ((const struct nvmlDevice_st *)device)->slot, .mode = mode};
    nvmlReturn_t r = change(&c);
    if (r == NVML_SUCCESS) *activationStatus = c.activation;
    return r;
}

/* ---- GPU instance profiles --------------------------------------------------------- */

/* A GI profile by NVML index (by_id: by driver ID), copied from a consistent copy. */
static nvmlReturn_t find_gi_profile(nvmlDevice_t device, unsigned key, int by_id, int need_on, mokka_gi_profile_t *out,
                                    const mokka_gpu_t **gpu) {
    if (mokka_is_mig_handle(device)) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_NOT_SUPPORTED;
    GET_GPU(device, g);
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE)) return NVML_ERROR_NOT_SUPPORTED;
    if (!by_id && key >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    int found = 0, on = 0;
    MOKKA_READ(g, {
        on = mig_on(g);
        found = 0;
        for (unsigned i = 0; i < clamp(g->mig.n_profiles, MOKKA_MIG_MAX_GI_PROFILES) && !found; i++) {
            const mokka_gi_profile_t *p = &g->mig.profiles[i];
            if ((by_id ? p->id : p->index) == key) *out = *p, found = 1;
        }
    });
    if (need_on && !on) return NVML_ERROR_NOT_SUPPORTED;
    if (!found) return by_id ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    if (gpu) *gpu = g;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info) {
    mokka_gi_profile_t p;
    nvmlReturn_t r = find_gi_profile(device, profile, 0, 0, &p, NULL);
    if (r != NVML_SUCCESS) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->id = p.id;
    info->isP2pSupported = 0;
    info->sliceCount = p.slice_count;
    info->instanceCount = p.instance_count;
    info->multiprocessorCount = p.multiprocessor_count;
    info->copyEngineCount = p.copy_engine_count;
    info->decoderCount = p.decoder_count;
    info->encoderCount = p.encoder_count;
    info->jpegCount = p.jpeg_count;
    info->ofaCount = p.ofa_count;
    info->memorySizeMB = p.memory_mib;
    return NVML_SUCCESS;
}

/* v2 and v3 differ in one field (isP2pSupported / capabilities at the end); both 152 bytes. */
static nvmlReturn_t gi_profile_v(nvmlDevice_t device, unsigned key, int by_id, nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = info->version;
    if (version != nvmlGpuInstanceProfileInfo_v2 && version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_INVALID_ARGUMENT;
    mokka_gi_profile_t p;
    nvmlReturn_t r = find_gi_profile(device, key, by_id, 1, &p, NULL);
    if (r != NVML_SUCCESS) return r;
    if (version == nvmlGpuInstanceProfileInfo_v2) {
        memset(info, 0, sizeof *info);
        info->version = version;
        info->id = p.id;
        info->isP2pSupported = 0;
        info->sliceCount = p.slice_count;
        info->instanceCount = p.instance_count;
        info->multiprocessorCount = p.multiprocessor_count;
        info->copyEngineCount = p.copy_engine_count;
        info->decoderCount = p.decoder_count;
        info->encoderCount = p.encoder_count;
        info->jpegCount = p.jpeg_count;
        info->ofaCount = p.ofa_count;
        info->memorySizeMB = p.memory_mib;
        snprintf(info->name, sizeof info->name, "MIG %.*s", (int)sizeof p.name, p.name);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof *v3);
        v3->version = version;
        v3->id = p.id;
        v3->sliceCount = p.slice_count;
        v3->instanceCount = p.instance_count;
        v3->multiprocessorCount = p.multiprocessor_count;
        v3->copyEngineCount = p.copy_engine_count;
        v3->decoderCount = p.decoder_count;
        v3->encoderCount = p.encoder_count;
        v3->jpegCount = p.jpeg_count;
        v3->ofaCount = p.ofa_count;
        v3->memorySizeMB = p.memory_mib;
        snprintf(v3->name, sizeof v3->name, "MIG %.*s", (int)sizeof p.name, p.name);
        v3->capabilities = 0;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info) {
    return gi_profile_v(device, profile, 0, info);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info) {
    RELEASE_GATE(); /* first in R580's library */
    return gi_profile_v(device, profileId, 1, info);
}

static nvmlReturn_t placements(nvmlDevice_t device, unsigned profileId, nvmlGpuInstancePlacement_t *out, unsigned *count,
                               int legacy) {
    mokka_gi_profile_t p;
    nvmlReturn_t r = find_gi_profile(device, profileId, 1, 0, &p, NULL);
    if (r != NVML_SUCCESS) return r;
    if (!count || (legacy && !out)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = clamp(p.n_placements, MOKKA_MIG_MAX_PLACEMENTS);
    /* v1 wrote into a buffer sized by the profile's instance count (its documented contract) */
    if (legacy && n > p.instance_count) n = p.instance_count;
    if (out) {
        if (!legacy && *count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned k = 0; k < n; k++) out[k] = (nvmlGpuInstancePlacement_t){p.placements[k], p.memory_slices};
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    return placements(device, profileId, out, count, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    return placements(device, profileId, out, count, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count) {
    mokka_gi_profile_t p;
    const mokka_gpu_t *g;
    nvmlReturn_t r = find_gi_profile(device, profileId, 1, 1, &p, &g);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    MOKKA_READ(g, {
        int pos = profile_pos_by_id(&g->mig, profileId);
        *count = pos < 0 ? 0 : gi_remaining(&g->mig, &g->mig.profiles[pos]);
    });
    return NVML_SUCCESS;
}

/* ---- GPU instances ----------------------------------------------------------------- */

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId, const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *out) {
    mokka_gi_profile_t p;
    nvmlReturn_t r = find_gi_profile(device, profileId, 1, 1, &p, NULL);
    if (r != NVML_SUCCESS) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (placement && placement->size != p.memory_slices) return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvmlDevice_st *d = device;
    change_t c = {.op = CREATE_GI, .slot = d->slot, .profile_id = profileId, .placed = placement != NULL,
                  .start = placement ? placement->start : 0};
    r = change(&c);
    if (r == NVML_SUCCESS) *out = &g_gi_handles[d->visible_index][c.gi];
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstance) {
    return create_gi(device, profileId, NULL, gpuInstance);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *gpuInstance) {
    if (!placement) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, placement, gpuInstance);
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = gpu_instance(gpuInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    change_t c = {.op = DESTROY_GI, .slot = w.parent->slot, .gi = w.gi};
    return change(&c);
}

/* Is the device a MIG-enabled GPU (not a MIG handle)? Else the error to answer. */
static nvmlReturn_t mig_gpu(nvmlDevice_t device, const mokka_gpu_t **out) {
    if (mokka_is_mig_handle(device)) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_NOT_SUPPORTED;
    GET_GPU(device, g);
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE)) return NVML_ERROR_NOT_SUPPORTED;
    int on;
    MOKKA_READ(g, on = mig_on(g));
    if (!on) return NVML_ERROR_NOT_SUPPORTED;
    *out = g;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *instances,
                                              unsigned int *count) {
    const mokka_gpu_t *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS) return r;
    if (!count || !instances) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned ids[MOKKA_MIG_MAX_GIS], n = 0;
    int known;
    MOKKA_READ(g, {
        n = 0;
        known = profile_pos_by_id(&g->mig, profileId) >= 0;
        for (unsigned i = 0; i < clamp(g->mig.n_gis, MOKKA_MIG_MAX_GIS); i++)
            /* never more than the profile's instance count: the caller's buffer holds that many */
            if (gi_profile(&g->mig, &g->mig.gis[i])->id == profileId && ids_valid(g->mig.gis[i].id, 0) &&
                n < gi_profile(&g->mig, &g->mig.gis[i])->instance_count)
                ids[n++] = g->mig.gis[i].id;
    });
    if (!known) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned v = ((const struct nvmlDevice_st *)device)->visible_index;
    for (unsigned k = 0; k < n; k++) instances[k] = &g_gi_handles[v][ids[k]];
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    const mokka_gpu_t *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS) return r;
    if (!gpuInstance || id > MOKKA_MIG_MAX_GI_ID) return NVML_ERROR_INVALID_ARGUMENT;
    int found;
    MOKKA_READ(g, found = gi_pos(&g->mig, id) >= 0);
    if (!found) return NVML_ERROR_NOT_FOUND;
    *gpuInstance = &g_gi_handles[((const struct nvmlDevice_st *)device)->visible_index][id];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = gpu_instance(gpuInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned profile_id = 0, start = 0, size = 0;
    MOKKA_READ(g, {
        int i = gi_pos(&g->mig, w.gi);
        if (i >= 0) {
            const mokka_gi_profile_t *p = gi_profile(&g->mig, &g->mig.gis[i]);
            profile_id = p->id, start = g->mig.gis[i].start, size = p->memory_slices;
        }
    });
    memset(info, 0, sizeof *info);
    info->device = (nvmlDevice_t)(uintptr_t)w.parent;
    info->id = w.gi;
    info->profileId = profile_id;
    info->placement.start = start;
    info->placement.size = size;
    return NVML_SUCCESS;
}

/* ---- compute instance profiles ----------------------------------------------------- */

/* The GI's profile and the CI profile at NVML index `index` (by_id: profile ID). */
static nvmlReturn_t find_ci_profile(nvmlGpuInstance_t gpuInstance, unsigned key, int by_id, where_t *w,
                                    mokka_gi_profile_t *gp, int *pos) {
    const mokka_gpu_t *g;
    nvmlReturn_t r = gpu_instance(gpuInstance, w, &g);
    if (r != NVML_SUCCESS) return r;
    MOKKA_READ(g, {
        int i = gi_pos(&g->mig, w->gi);
        *gp = *gi_profile(&g->mig, &g->mig.gis[i < 0 ? 0 : i]);
    });
    *pos = -1;
    for (unsigned j = 0; j < clamp(gp->n_ci_profiles, MOKKA_MIG_MAX_CI_PROFILES); j++)
        if ((by_id ? gp->ci[j].id : gp->ci[j].index) == key) *pos = (int)j;
    if (*pos < 0) return key >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT && !by_id ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info) {
    where_t w;
    mokka_gi_profile_t gp;
    int pos;
    nvmlReturn_t r = find_ci_profile(gpuInstance, profile, 0, &w, &gp, &pos);
    if (r != NVML_SUCCESS) return r;
    if (!info || engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    const mokka_ci_profile_t *c = &gp.ci[pos];
    memset(info, 0, sizeof *info);
    info->id = c->id;
    info->sliceCount = c->slice_count;
    info->instanceCount = c->instance_count;
    info->multiprocessorCount = c->multiprocessor_count;
    info->sharedCopyEngineCount = gp.copy_engine_count;
    info->sharedDecoderCount = gp.decoder_count;
    info->sharedEncoderCount = gp.encoder_count;
    info->sharedJpegCount = gp.jpeg_count;
    info->sharedOfaCount = gp.ofa_count;
    return NVML_SUCCESS;
}

/* v2 (136 bytes) and v3 (140: capabilities appended). */
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info) {
    if (!info) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = info->version;
    if (version != nvmlComputeInstanceProfileInfo_v2 && version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_INVALID_ARGUMENT;
    where_t w;
    mokka_gi_profile_t gp;
    int pos;
    nvmlReturn_t r = find_ci_profile(gpuInstance, profile, 0, &w, &gp, &pos);
    if (r != NVML_SUCCESS) return r;
    if (engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    const mokka_ci_profile_t *c = &gp.ci[pos];
    size_t size = version == nvmlComputeInstanceProfileInfo_v2 ? sizeof(nvmlComputeInstanceProfileInfo_v2_t)
                                                               : sizeof(nvmlComputeInstanceProfileInfo_v3_t);
    memset(info, 0, size);
    info->version = version;
    info->id = c->id;
    info->sliceCount = c->slice_count;
    info->instanceCount = c->instance_count;
    info->multiprocessorCount = c->multiprocessor_count;
    info->sharedCopyEngineCount = gp.copy_engine_count;
    info->sharedDecoderCount = gp.decoder_count;
    info->sharedEncoderCount = gp.encoder_count;
    info->sharedJpegCount = gp.jpeg_count;
    info->sharedOfaCount = gp.ofa_count;
    snprintf(info->name, sizeof info->name, "MIG %.*s", (int)sizeof c->name, c->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId, unsigned int *count) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = gpu_instance(gpuInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    int known = 0;
    MOKKA_READ(g, {
        int i = gi_pos(&g->mig, w.gi);
        known = 0;
        if (i >= 0) {
            const mokka_gi_t *gi = &g->mig.gis[i];
            const mokka_gi_profile_t *gp = gi_profile(&g->mig, gi);
            int pos = ci_profile_pos(gp, profileId);
            if (pos >= 0) known = 1, *count = ci_remaining(gi, gp, &gp->ci[pos]);
        }
    });
    return known ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t gpuInstance,
                                                                        unsigned int profileId,
                                                                        nvmlComputeInstancePlacement_t *out,
                                                                        unsigned int *count) {
    where_t w;
    mokka_gi_profile_t gp;
    int pos;
    nvmlReturn_t r = find_ci_profile(gpuInstance, profileId, 1, &w, &gp, &pos);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    const mokka_ci_profile_t *c = &gp.ci[pos];
    unsigned n = clamp(c->n_placements, MOKKA_MIG_MAX_PLACEMENTS);
    if (out) {
        if (*count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned k = 0; k < n; k++) out[k] = (nvmlComputeInstancePlacement_t){c->placements[k], c->slice_count};
    }
    *count = n;
    return NVML_SUCCESS;
}

/* ---- compute instances ------------------------------------------------------------- */

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned profileId,
                              const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *out) {
    where_t w;
    mokka_gi_profile_t gp;
    int pos;
    nvmlReturn_t r = find_ci_profile(gpuInstance, profileId, 1, &w, &gp, &pos);
    if (r != NVML_SUCCESS) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (placement && placement->size != gp.ci[pos].slice_count) return NVML_ERROR_INVALID_ARGUMENT;
    change_t c = {.op = CREATE_CI, .slot = w.parent->slot, .profile_id = profileId, .gi = w.gi,
                  .placed = placement != NULL, .start = placement ? placement->start : 0};
    r = change(&c);
    if (r == NVML_SUCCESS) *out = &g_ci_handles[w.v][w.gi][c.ci];
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                         nvmlComputeInstance_t *computeInstance) {
    return create_ci(gpuInstance, profileId, NULL, computeInstance);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t gpuInstance,
                                                                      unsigned int profileId,
                                                                      const nvmlComputeInstancePlacement_t *placement,
                                                                      nvmlComputeInstance_t *computeInstance) {
    if (!placement) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(gpuInstance, profileId, placement, computeInstance);
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = compute_instance(computeInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    change_t c = {.op = DESTROY_CI, .slot = w.parent->slot, .gi = w.gi, .ci = w.ci};
    return change(&c);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *computeInstances, unsigned int *count) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = gpu_instance(gpuInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    if (!count || !computeInstances) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned ids[MOKKA_MIG_MAX_CIS], n = 0;
    int known = 0;
    MOKKA_READ(g, {
        n = 0;
        int i = gi_pos(&g->mig, w.gi);
        known = 0;
        if (i >= 0) {
            const mokka_gi_t *gi = &g->mig.gis[i];
            const mokka_gi_profile_t *gp = gi_profile(&g->mig, gi);
            known = ci_profile_pos(gp, profileId) >= 0;
            for (unsigned j = 0; j < clamp(gi->n_cis, MOKKA_MIG_MAX_CIS); j++)
                if (ci_profile(gp, &gi->ci[j])->id == profileId && ids_valid(0, gi->ci[j].id) &&
                    n < ci_profile(gp, &gi->ci[j])->instance_count) /* the caller's buffer holds that many */
                    ids[n++] = gi->ci[j].id;
        }
    });
    if (!known) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned k = 0; k < n; k++) computeInstances[k] = &g_ci_handles[w.v][w.gi][ids[k]];
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = gpu_instance(gpuInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    if (!computeInstance || id > MOKKA_MIG_MAX_CI_ID) return NVML_ERROR_INVALID_ARGUMENT;
    int found;
    MOKKA_READ(g, {
        int i = gi_pos(&g->mig, w.gi);
        found = i >= 0 && ci_pos(&g->mig.gis[i], id) >= 0;
    });
    if (!found) return NVML_ERROR_NOT_FOUND;
    *computeInstance = &g_ci_handles[w.v][w.gi][id];
    return NVML_SUCCESS;
}

/* v1 (24 bytes: no placement) and v2 (32). */
static nvmlReturn_t ci_info(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info, int with_placement) {
    where_t w;
    const mokka_gpu_t *g;
    nvmlReturn_t r = compute_instance(computeInstance, &w, &g);
    if (r != NVML_SUCCESS) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceInfo_t out;
    memset(&out, 0, sizeof out);
    MOKKA_READ(g, {
        int i = gi_pos(&g->mig, w.gi);
        if (i >= 0) {
            const mokka_gi_t *gi = &g->mig.gis[i];
            int j = ci_pos(gi, w.ci);
            if (j >= 0) {
                const mokka_ci_profile_t *cp = ci_profile(gi_profile(&g->mig, gi), &gi->ci[j]);
                out.profileId = cp->id;
                out.placement.start = gi->ci[j].start;
                out.placement.size = cp->slice_count;
            }
        }
    });
    out.device = (nvmlDevice_t)(uintptr_t)w.parent;
    out.gpuInstance = &g_gi_handles[w.v][w.gi];
    out.id = w.ci;
    memcpy(info, &out, with_placement ? sizeof out : offsetof(nvmlComputeInstanceInfo_t, placement));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
    return ci_info(computeInstance, info, 1);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
    return ci_info(computeInstance, info, 0);
}

/* ---- MIG devices ------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    if (mokka_is_mig_handle(device)) {
        GET_MIG(device, w, g);
        (void)g;
        if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
        *isMigDevice = 1;
        return NVML_SUCCESS;
    }
    GET_GPU(device, g);
    (void)g;
    if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    if (mokka_is_mig_handle(device)) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_NOT_SUPPORTED;
    GET_GPU(device, g);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE)) return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_READ(g, *count = mig_on(g) ? g->mig.max_devices : 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    if (mokka_is_mig_handle(device)) return g_mokka_refcount <= 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    GET_GPU(device, g);
    if (!migDevice) return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvmlDevice_st *d = device;
    unsigned gi = 0, ci = 0, max = 0;
    int found;
    MOKKA_READ(g, (max = mig_on(g) ? g->mig.max_devices : 0, found = nth_device(g, d->slot, index, &gi, &ci)));
    if (max && index >= max) return NVML_ERROR_INVALID_ARGUMENT;
    if (!found) return NVML_ERROR_NOT_FOUND; /* also on GPUs without MIG: what the device plugin expects */
    *migDevice = &g_mokka_mig_devices[d->visible_index][gi][ci];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    if (!mokka_is_mig_handle(migDevice)) {
        GET_GPU(migDevice, g);
        (void)g;
        return NVML_ERROR_INVALID_ARGUMENT; /* a full GPU is not a MIG handle */
    }
    GET_MIG(migDevice, w, g);
    (void)g;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(uintptr_t)w.parent;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!mokka_is_mig_handle(device)) {
        GET_GPU(device, g);
        (void)g;
        return NVML_ERROR_NOT_SUPPORTED;
    }
    GET_MIG(device, w, g);
    (void)g;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = w.gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!mokka_is_mig_handle(device)) {
        GET_GPU(device, g);
        (void)g;
        return NVML_ERROR_NOT_SUPPORTED;
    }
    GET_MIG(device, w, g);
    (void)g;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = w.ci;
    return NVML_SUCCESS;
}

/* What a MIG device is made of, from a consistent copy. */
typedef struct {
    mokka_gi_profile_t gp;
    mokka_ci_profile_t cp;
    char uuid[48];
} mig_facts_t;

static nvmlReturn_t facts(nvmlDevice_t device, where_t *w, const mokka_gpu_t **gpu, mig_facts_t *f) {
    const mokka_gpu_t *g;
    nvmlReturn_t r = mig_device(device, w, &g);
    if (r != NVML_SUCCESS) return r;
    int found;
    MOKKA_READ(g, {
        int i = gi_pos(&g->mig, w->gi), j = i < 0 ? -1 : ci_pos(&g->mig.gis[i], w->ci);
        found = j >= 0;
        if (found) {
            const mokka_gi_t *gi = &g->mig.gis[i];
            f->gp = *gi_profile(&g->mig, gi);
            f->cp = *ci_profile(&f->gp, &gi->ci[j]);
            memcpy(f->uuid, gi->ci[j].uuid, sizeof f->uuid);
        }
    });
    if (!found) return NVML_ERROR_INVALID_ARGUMENT;
    f->uuid[sizeof f->uuid - 1] = '\0';
    f->cp.name[sizeof f->cp.name - 1] = '\0';
    if (gpu) *gpu = g;
    return NVML_SUCCESS;
}

nvmlReturn_t mokka_mig_name(nvmlDevice_t device, char *name, unsigned int length) {
    where_t w;
    const mokka_gpu_t *g;
    mig_facts_t f;
    nvmlReturn_t r = facts(device, &w, &g, &f);
    if (r != NVML_SUCCESS) return r;
    char text[sizeof g->name + 48];
    snprintf(text, sizeof text, "%.*s MIG %s", (int)sizeof g->name, g->name, f.cp.name);
    return mokka_copy_string(name, length, text, sizeof text);
}

nvmlReturn_t mokka_mig_uuid_of(nvmlDevice_t device, char *uuid, unsigned int length) {
    where_t w;
    mig_facts_t f;
    nvmlReturn_t r = facts(device, &w, NULL, &f);
    if (r != NVML_SUCCESS) return r;
    return mokka_copy_string(uuid, length, f.uuid, sizeof f.uuid);
}

nvmlReturn_t mokka_mig_index(nvmlDevice_t device, unsigned int *index) {
    GET_MIG(device, w, g);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    int k;
    MOKKA_READ(g, k = device_index(g, w.parent->slot, w.gi, w.ci));
    if (k < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)k;
    return NVML_SUCCESS;
}

/* Memory: the GI's; all of it free (no process runs in a mock MIG device). One pass over the
 * state: this getter is as hot as a GPU's. */
nvmlReturn_t mokka_mig_memory(nvmlDevice_t device, uint64_t *total, uint64_t *used) {
    where_t w;
    nvmlReturn_t r = decode_mig(device, &w);
    if (r != NVML_SUCCESS) return r;
    const mokka_gpu_t *g = mokka_handle_gpu(w.parent);
    const mokka_gi_t *gi;
    const mokka_ci_t *ci;
    uint64_t mib = 0;
    int found;
    MOKKA_READ(g, {
        found = locate(g, &w, &gi, &ci);
        if (found) mib = gi_profile(&g->mig, gi)->memory_mib;
    });
    if (!found) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->flags & MOKKA_GPU_LOST) return NVML_ERROR_GPU_IS_LOST;
    *total = mib * 1024 * 1024;
    *used = 0;
    return NVML_SUCCESS;
}

/* BAR1: the parent's aperture shared by memory slices (the MiB before the last, as R510-R550
 * show: 8191 MiB for an A100-40GB 1g of 64 GiB, 65535 MiB for an A100-80GB 3g of 128 GiB). */
nvmlReturn_t mokka_mig_bar1(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    where_t w;
    const mokka_gpu_t *g;
    mig_facts_t f;
    nvmlReturn_t r = facts(device, &w, &g, &f);
    if (r != NVML_SUCCESS) return r;
    if (!bar1) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t mib = g->bar1_total / (1024 * 1024), slices = g->mig.memory_slices ? g->mig.memory_slices : 8;
    uint64_t share = mib * f.gp.memory_slices / slices;
    bar1->bar1Total = (share ? share - 1 : 0) * 1024 * 1024;
    bar1->bar1Used = 0;
    bar1->bar1Free = bar1->bar1Total;
    return NVML_SUCCESS;
}

nvmlReturn_t mokka_mig_attributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes, size_t size) {
    where_t w;
    mig_facts_t f;
    nvmlReturn_t r = facts(device, &w, NULL, &f);
    if (r != NVML_SUCCESS) return r;
    if (!attributes) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDeviceAttributes_t a;
    memset(&a, 0, sizeof a);
    a.multiprocessorCount = f.cp.multiprocessor_count;
    a.sharedCopyEngineCount = f.gp.copy_engine_count;
    a.sharedDecoderCount = f.gp.decoder_count;
    a.sharedEncoderCount = f.gp.encoder_count;
    a.sharedJpegCount = f.gp.jpeg_count;
    a.sharedOfaCount = f.gp.ofa_count;
    a.gpuInstanceSliceCount = f.gp.slice_count;
    a.computeInstanceSliceCount = f.cp.slice_count;
    a.memorySizeMB = f.gp.memory_mib;
    memcpy(attributes, &a, size < sizeof a ? size : sizeof a);
    return NVML_SUCCESS;
}

nvmlReturn_t mokka_mig_handle_by_uuid(const char *uuid, nvmlDevice_t *device) {
    if (strncmp(uuid, "MIG-", 4) != 0) return NVML_ERROR_NOT_FOUND;
    for (unsigned v = 0; v < g_mokka.visible_count; v++) {
        const mokka_gpu_t *g = mokka_handle_gpu(&g_mokka.devices[v]);
        unsigned gi = 0, ci = 0;
        int found;
        MOKKA_READ(g, found = mokka_mig_item(uuid, strlen(uuid), g, &gi, &ci) && ids_valid(gi, ci) &&
                              device_index(g, g_mokka.devices[v].slot, gi, ci) >= 0);
        if (found) {
            *device = &g_mokka_mig_devices[v][gi][ci];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
