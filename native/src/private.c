/* nvidia-smi's private door: nvmlInternalGetExportTable.
 *
 * nvidia-smi asks for a table by a 16-byte id and refuses to run without it. Slot 0 holds
 * the table's size in bytes; nvidia-smi calls only slots below that size. A table that
 * declares only its size slot is accepted, and nvidia-smi then reads everything through
 * the public API, which this library serves from the state. Every other slot id is
 * refused with NVML_ERROR_INVALID_ARGUMENT, as the real library refuses ids it does not
 * know. */
#include <string.h>

#include "internal.h"

static const unsigned char SMI_TABLE_ID[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                               0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};

static const struct {
    size_t size;
} smi_table = {sizeof smi_table};

EXPORT nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *id) {
    if (!table || !id) return NVML_ERROR_INVALID_ARGUMENT;
    if (memcmp(id, SMI_TABLE_ID, sizeof SMI_TABLE_ID) != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *table = &smi_table;
    return NVML_SUCCESS;
}
