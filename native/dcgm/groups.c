/* Entity groups and field groups, and watches on them. Watches change nothing here: every
 * value is read live when it is asked for, so a field is "watched" the moment it is named,
 * and dcgmUpdateAllFields only collects the events (Xids) that arrived since the last call. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define MAX_GROUPS 64
#define MAX_FIELD_GROUPS 64

typedef struct {
    int used;
    char name[DCGM_MAX_STR_LENGTH];
    unsigned count;
    dcgmGroupEntityPair_t entities[DCGM_GROUP_MAX_ENTITIES_V2];
} group_t;

typedef struct {
    int used;
    unsigned count;
    unsigned short fields[DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP];
} field_group_t;

static group_t groups[MAX_GROUPS];
static field_group_t field_groups[MAX_FIELD_GROUPS];

/* Group ids: slot + 1 (0 is no group), clear of DCGM's special ids. */
static group_t *group_of(dcgmGpuGrp_t id) {
    if (id < 1 || id > MAX_GROUPS || !groups[id - 1].used) return NULL;
    return &groups[id - 1];
}

static int add(dcgmGroupEntityPair_t *out, int n, int max, dcgm_field_entity_group_t group, unsigned id) {
    if (n < max) out[n] = (dcgmGroupEntityPair_t){group, id};
    return n + 1;
}

/* The entities of a default group type. */
static int defaults(int gpus, int instances, int compute, dcgmGroupEntityPair_t *out, int max) {
    int n = 0;
    for (unsigned i = 0; gpus && i < g_dcgm.gpu_count; i++) n = add(out, n, max, DCGM_FE_GPU, i);
    for (unsigned i = 0; instances && i < g_dcgm.gi_count; i++) n = add(out, n, max, DCGM_FE_GPU_I, i);
    for (unsigned i = 0; compute && i < g_dcgm.ci_count; i++) n = add(out, n, max, DCGM_FE_GPU_CI, i);
    return n < max ? n : max;
}

int mokka_dcgm_group_entities(dcgmGpuGrp_t id, dcgmGroupEntityPair_t *out, int max) {
    if (id == DCGM_GROUP_ALL_GPUS) return defaults(1, 0, 0, out, max);
    if (id == DCGM_GROUP_ALL_ENTITIES) return defaults(1, 1, 1, out, max);
    group_t *g = group_of(id);
    if (!g) return -1;
    int n = (int)g->count < max ? (int)g->count : max;
    memcpy(out, g->entities, (size_t)n * sizeof *out);
    return n;
}

int mokka_dcgm_group_slot(dcgmGpuGrp_t id) {
    if (id == DCGM_GROUP_ALL_GPUS) return MAX_GROUPS - 1; /* the last slot is never a created group's */
    if (id == DCGM_GROUP_ALL_ENTITIES) return MAX_GROUPS - 2;
    return group_of(id) && id <= MAX_GROUPS - 2 ? (int)id - 1 : -1;
}

EXPORT dcgmReturn_t dcgmGroupCreate(dcgmHandle_t handle, dcgmGroupType_t type, const char *name, dcgmGpuGrp_t *out) {
    (void)handle;
    if (!name || !out) return DCGM_ST_BADPARAM;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    pthread_mutex_lock(&g_dcgm.lock);
    int slot = -1;
    for (int i = 0; i < MAX_GROUPS - 2 && slot < 0; i++)
        if (!groups[i].used) slot = i;
    if (slot < 0) {
        pthread_mutex_unlock(&g_dcgm.lock);
        return DCGM_ST_MAX_LIMIT;
    }
    group_t *g = &groups[slot];
    memset(g, 0, sizeof *g);
    g->used = 1;
    strncpy(g->name, name, sizeof g->name - 1);
    int n = 0;
    switch (type) {
    case DCGM_GROUP_DEFAULT: n = defaults(1, 0, 0, g->entities, DCGM_GROUP_MAX_ENTITIES_V2); break;
    case DCGM_GROUP_DEFAULT_INSTANCES: n = defaults(0, 1, 0, g->entities, DCGM_GROUP_MAX_ENTITIES_V2); break;
    case DCGM_GROUP_DEFAULT_COMPUTE_INSTANCES: n = defaults(0, 0, 1, g->entities, DCGM_GROUP_MAX_ENTITIES_V2); break;
    case DCGM_GROUP_DEFAULT_EVERYTHING: n = defaults(1, 1, 1, g->entities, DCGM_GROUP_MAX_ENTITIES_V2); break;
    default: break; /* empty; and no NvSwitches here */
    }
    g->count = (unsigned)n;
    g_dcgm.health[slot] = 0;
    *out = (dcgmGpuGrp_t)(slot + 1);
    pthread_mutex_unlock(&g_dcgm.lock);
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGroupDestroy(dcgmHandle_t handle, dcgmGpuGrp_t id) {
    (void)handle;
    pthread_mutex_lock(&g_dcgm.lock);
    group_t *g = group_of(id);
    if (g) g->used = 0;
    pthread_mutex_unlock(&g_dcgm.lock);
    return g ? DCGM_ST_OK : DCGM_ST_NOT_CONFIGURED;
}

EXPORT dcgmReturn_t dcgmGroupAddEntity(dcgmHandle_t handle, dcgmGpuGrp_t id, dcgm_field_entity_group_t type,
                                       dcgm_field_eid_t entity) {
    (void)handle;
    if (!mokka_dcgm_entity_exists(type, entity)) return DCGM_ST_BADPARAM;
    pthread_mutex_lock(&g_dcgm.lock);
    group_t *g = group_of(id);
    dcgmReturn_t r = DCGM_ST_OK;
    if (!g) r = DCGM_ST_NOT_CONFIGURED;
    else if (g->count >= DCGM_GROUP_MAX_ENTITIES_V2) r = DCGM_ST_MAX_LIMIT;
    else {
        int present = 0;
        for (unsigned i = 0; i < g->count; i++)
            present |= g->entities[i].entityGroupId == type && g->entities[i].entityId == entity;
        if (!present) g->entities[g->count++] = (dcgmGroupEntityPair_t){type, entity};
    }
    pthread_mutex_unlock(&g_dcgm.lock);
    return r;
}

EXPORT dcgmReturn_t dcgmGroupAddDevice(dcgmHandle_t handle, dcgmGpuGrp_t id, unsigned gpu) {
    return dcgmGroupAddEntity(handle, id, DCGM_FE_GPU, gpu);
}

EXPORT dcgmReturn_t dcgmGroupGetInfo(dcgmHandle_t handle, dcgmGpuGrp_t id, dcgmGroupInfo_v3 *info) {
    (void)handle;
    if (!info) return DCGM_ST_BADPARAM;
    if (info->version != dcgmGroupInfo_version3) return DCGM_ST_VER_MISMATCH;
    pthread_mutex_lock(&g_dcgm.lock);
    int n = mokka_dcgm_group_entities(id, info->entityList, DCGM_GROUP_MAX_ENTITIES_V2);
    if (n >= 0) {
        info->count = (unsigned)n;
        group_t *g = group_of(id);
        snprintf(info->groupName, sizeof info->groupName, "%s",
                 g ? g->name : id == DCGM_GROUP_ALL_GPUS ? "DCGM_ALL_SUPPORTED_GPUS" : "DCGM_ALL_ENTITIES");
    }
    pthread_mutex_unlock(&g_dcgm.lock);
    return n >= 0 ? DCGM_ST_OK : DCGM_ST_NOT_CONFIGURED;
}

EXPORT dcgmReturn_t dcgmFieldGroupCreate(dcgmHandle_t handle, int count, const unsigned short *fields, const char *name,
                                         dcgmFieldGrp_t *out) {
    (void)handle;
    if (!fields || !name || !out || count < 1 || count > DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP) return DCGM_ST_BADPARAM;
    for (int i = 0; i < count; i++)
        if (!mokka_dcgm_field(fields[i])) return DCGM_ST_UNKNOWN_FIELD;
    pthread_mutex_lock(&g_dcgm.lock);
    int slot = -1;
    for (int i = 0; i < MAX_FIELD_GROUPS && slot < 0; i++)
        if (!field_groups[i].used) slot = i;
    if (slot >= 0) {
        field_groups[slot].used = 1;
        field_groups[slot].count = (unsigned)count;
        memcpy(field_groups[slot].fields, fields, (size_t)count * sizeof *fields);
        *out = (dcgmFieldGrp_t)(slot + 1);
    }
    pthread_mutex_unlock(&g_dcgm.lock);
    return slot >= 0 ? DCGM_ST_OK : DCGM_ST_MAX_LIMIT;
}

EXPORT dcgmReturn_t dcgmFieldGroupDestroy(dcgmHandle_t handle, dcgmFieldGrp_t id) {
    (void)handle;
    if (id < 1 || id > MAX_FIELD_GROUPS || !field_groups[id - 1].used) return DCGM_ST_NOT_CONFIGURED;
    field_groups[id - 1].used = 0;
    return DCGM_ST_OK;
}

int mokka_dcgm_field_group(dcgmFieldGrp_t id, const unsigned short **fields) {
    if (id < 1 || id > MAX_FIELD_GROUPS || !field_groups[id - 1].used) return -1;
    *fields = field_groups[id - 1].fields;
    return (int)field_groups[id - 1].count;
}

EXPORT dcgmReturn_t dcgmWatchFields(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmFieldGrp_t fields, long long freq_us,
                                    double max_age, int max_samples) {
    (void)handle, (void)freq_us, (void)max_age, (void)max_samples;
    const unsigned short *ids;
    dcgmGroupEntityPair_t one;
    if (mokka_dcgm_group_entities(group, &one, 1) < 0) return DCGM_ST_NOT_CONFIGURED;
    return mokka_dcgm_field_group(fields, &ids) < 0 ? DCGM_ST_NOT_CONFIGURED : DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmUnwatchFields(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmFieldGrp_t fields) {
    return dcgmWatchFields(handle, group, fields, 0, 0, 0);
}

EXPORT dcgmReturn_t dcgmUpdateAllFields(dcgmHandle_t handle, int wait) {
    (void)handle, (void)wait;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    mokka_dcgm_poll_events();
    return DCGM_ST_OK;
}
