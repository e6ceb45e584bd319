/* Field metadata: what DCGM says about each field id it knows (type, entity level, tag),
 * for the fields the mock answers (field_table.h). DcgmFieldGetById hands out pointers into
 * this table, which lives as long as the library. */
#include <stddef.h>

#include "internal.h"

static const dcgm_field_meta_t table[] = {
#define FIELD(name_, id_, type_, size_, tag_, scope_, level_) \
    {.fieldId = id_, .fieldType = type_, .size = size_, .tag = tag_, .scope = scope_, .entityLevel = level_},
#include "field_table.h"
#undef FIELD
};

const dcgm_field_meta_t *mokka_dcgm_field(unsigned short id) {
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (table[i].fieldId == id) return &table[i];
    return NULL;
}

EXPORT int DcgmFieldsInit(void) { return 0; }

EXPORT int DcgmFieldsTerm(void) { return 0; }

EXPORT const dcgm_field_meta_t *DcgmFieldGetById(unsigned short id) { return mokka_dcgm_field(id); }
