/* The value APIs: latest values of fields for entities (read live, see read.c), values since
 * a time (the exporter's Xid and clock-event counters), and the profiling metric groups. */
#include <stddef.h>
#include <string.h>

#include "internal.h"

unsigned mokka_dcgm_prof_fields(unsigned gpu, unsigned short *out); /* read.c */

EXPORT dcgmReturn_t dcgmEntityGetLatestValues(dcgmHandle_t handle, dcgm_field_entity_group_t group, int id,
                                              unsigned short fields[], unsigned count, dcgmFieldValue_v1 values[]) {
    (void)handle;
    if (!fields || !values || !count || id < 0) return DCGM_ST_BADPARAM;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    for (unsigned i = 0; i < count; i++) mokka_dcgm_read(group, (unsigned)id, fields[i], &values[i]);
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmGetLatestValuesForFields(dcgmHandle_t handle, int gpu, unsigned short fields[], unsigned count,
                                                 dcgmFieldValue_v1 values[]) {
    return dcgmEntityGetLatestValues(handle, DCGM_FE_GPU, gpu, fields, count, values);
}

EXPORT dcgmReturn_t dcgmEntitiesGetLatestValues(dcgmHandle_t handle, dcgmGroupEntityPair_t entities[],
                                                unsigned entity_count, unsigned short fields[], unsigned field_count,
                                                unsigned flags, dcgmFieldValue_v2 values[]) {
    (void)handle, (void)flags; /* every read is live data */
    if (!entities || !fields || !values || !entity_count || !field_count) return DCGM_ST_BADPARAM;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    dcgmFieldValue_v1 v;
    for (unsigned e = 0; e < entity_count; e++) {
        for (unsigned f = 0; f < field_count; f++) {
            dcgmFieldValue_v2 *out = &values[e * field_count + f];
            mokka_dcgm_read(entities[e].entityGroupId, entities[e].entityId, fields[f], &v);
            memset(out, 0, offsetof(dcgmFieldValue_v2, value));
            out->version = dcgmFieldValue_version2;
            out->entityGroupId = entities[e].entityGroupId;
            out->entityId = entities[e].entityId;
            out->fieldId = v.fieldId;
            out->fieldType = v.fieldType;
            out->status = v.status;
            out->ts = v.ts;
            memcpy(&out->value, &v.value, sizeof out->value);
        }
    }
    return DCGM_ST_OK;
}

/* Values since `since` (µs): one sample per field and entity, the live one, except the Xid
 * field, whose sample is the last Xid, stamped when it arrived (none when it is older). */
EXPORT dcgmReturn_t dcgmGetValuesSince_v2(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmFieldGrp_t field_group,
                                          long long since, long long *next, dcgmFieldValueEntityEnumeration_f cb,
                                          void *user) {
    (void)handle;
    if (!cb || !next) return DCGM_ST_BADPARAM;
    if (!g_dcgm.started) return DCGM_ST_UNINITIALIZED;
    mokka_dcgm_poll_events();
    static dcgmGroupEntityPair_t entities[DCGM_GROUP_MAX_ENTITIES_V2];
    const unsigned short *fields;
    int n = mokka_dcgm_group_entities(group, entities, DCGM_GROUP_MAX_ENTITIES_V2);
    int nf = mokka_dcgm_field_group(field_group, &fields);
    if (n < 0 || nf < 0) return DCGM_ST_NOT_CONFIGURED;
    long long now = mokka_dcgm_now_us();
    for (int e = 0; e < n; e++) {
        dcgmFieldValue_v1 values[DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP];
        int count = 0;
        for (int f = 0; f < nf; f++) {
            dcgmFieldValue_v1 *v = &values[count];
            mokka_dcgm_read(entities[e].entityGroupId, entities[e].entityId, fields[f], v);
            if (fields[f] == 230) {
                unsigned gpu = entities[e].entityId;
                if (entities[e].entityGroupId == DCGM_FE_GPU_I) gpu = g_dcgm.gis[gpu].gpu;
                if (entities[e].entityGroupId == DCGM_FE_GPU_CI) gpu = g_dcgm.cis[gpu].gpu;
                if (gpu >= g_dcgm.gpu_count || !g_dcgm.gpus[gpu].xid_count || g_dcgm.gpus[gpu].xid_ts < since)
                    continue;
                v->ts = g_dcgm.gpus[gpu].xid_ts;
            }
            if (v->ts >= since) count++;
        }
        if (count && cb(entities[e].entityGroupId, entities[e].entityId, values, count, user)) break;
    }
    *next = now + 1;
    return DCGM_ST_OK;
}

EXPORT dcgmReturn_t dcgmProfGetSupportedMetricGroups(dcgmHandle_t handle, dcgmProfGetMetricGroups_v3 *groups) {
    (void)handle;
    if (!groups) return DCGM_ST_BADPARAM;
    if (groups->version != dcgmProfGetMetricGroups_version3) return DCGM_ST_VER_MISMATCH;
    if (groups->gpuId >= g_dcgm.gpu_count) return DCGM_ST_BADPARAM;
    unsigned gpu = groups->gpuId;
    memset(groups->metricGroups, 0, sizeof groups->metricGroups);
    /* One group: every field can be watched at once (the mock has no counter multiplexing). */
    dcgmProfMetricGroupInfo_v2 *g = &groups->metricGroups[0];
    g->majorId = 1;
    g->numFieldIds = mokka_dcgm_prof_fields(gpu, g->fieldIds);
    groups->numMetricGroups = 1;
    return DCGM_ST_OK;
}
