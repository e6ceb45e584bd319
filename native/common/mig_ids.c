/* MIG device identities; see mig_ids.h. */
#include "mig_ids.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv1a(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * FNV_PRIME;
    return h;
}

void mokka_mig_uuid(char out[48], const char *gpu_uuid, unsigned gi_id, unsigned gi_profile_id, unsigned ci_id,
                    unsigned ci_profile_id) {
    char key[160];
    snprintf(key, sizeof key, "mokka-mig:%.96s:%u:%u:%u:%u", gpu_uuid, gi_id, gi_profile_id, ci_id, ci_profile_id);
    uint64_t hi = fnv1a(key, FNV_OFFSET), lo = fnv1a(key, hi ^ FNV_PRIME);
    unsigned char b[16];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hi >> (56 - 8 * i)), b[8 + i] = (unsigned char)(lo >> (56 - 8 * i));
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x50); /* version 5 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    snprintf(out, 48, "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static unsigned clamp(unsigned v, unsigned max) { return v < max ? v : max; }

int mokka_mig_item(const char *item, size_t n, const mokka_gpu_t *g, unsigned *gi, unsigned *ci) {
    if (!(g->flags & MOKKA_GPU_MIG_CAPABLE) || g->mig_current != 1) return 0;
    const mokka_mig_t *m = &g->mig;
    char buf[128];
    if (n >= sizeof buf) return 0;
    memcpy(buf, item, n);
    buf[n] = '\0';
    unsigned gpu, want_gi = 0, want_ci = 0, index = 0;
    int by_uuid = 0, by_ids = 0, by_index = 0;
    char tail;
    if (strncmp(buf, "MIG-GPU-", 8) == 0) {
        char *slash = strchr(buf + 4, '/');
        if (!slash || sscanf(slash, "/%u/%u%c", &want_gi, &want_ci, &tail) != 2) return 0;
        *slash = '\0';
        if (strcmp(buf + 4, g->uuid) != 0) return 0;
        by_ids = 1;
    } else if (strncmp(buf, "MIG-", 4) == 0) {
        by_uuid = 1;
    } else if (sscanf(buf, "%u:%u%c", &gpu, &index, &tail) == 2) {
        if (gpu != g->index) return 0;
        by_index = 1;
    } else {
        return 0;
    }
    unsigned k = 0;
    for (unsigned i = 0; i < clamp(m->n_gis, MOKKA_MIG_MAX_GIS); i++) {
        const mokka_gi_t *x = &m->gis[i];
        for (unsigned j = 0; j < clamp(x->n_cis, MOKKA_MIG_MAX_CIS); j++, k++) {
            const mokka_ci_t *c = &x->ci[j];
            int hit = by_uuid ? strncmp(c->uuid, buf, sizeof c->uuid) == 0
                    : by_ids  ? (x->id == want_gi && c->id == want_ci)
                    : by_index && k == index;
            if (hit) {
                *gi = x->id;
                *ci = c->id;
                return 1;
            }
        }
    }
    return 0;
}
