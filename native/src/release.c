/* Which NVML functions the library of the reported driver release exports.
 *
 * The mock exports every name any known release (native/symbols/nvml-*.txt) or go-nvml
 * knows, so that no consumer dies of a missing symbol. A function the reported release's
 * library lacks must still answer as that library would: by not being there, i.e.
 * NVML_ERROR_FUNCTION_NOT_FOUND (what nvidia-smi prints as "Function Not Found", what
 * go-nvml returns for a symbol it could not resolve, what nvidia-ml-py raises as
 * NVMLError_FunctionNotFound). A reported release between two known ones is judged by the
 * nearest known one at or below it (below the oldest: the oldest). The table of names some
 * known release lacks is generated at build time (gen_releases.py). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern const unsigned mokka_release_count;
extern const unsigned mokka_releases[];
extern const unsigned mokka_partial_count;
extern const char *const mokka_partial_names[];
extern const uint32_t mokka_partial_masks[];

static unsigned reported_release_bit(void) {
    const char *version = g_mokka_refcount > 0 && g_state.hdr ? g_state.hdr->driver_version
                                                               : strchr(MOKKA_DEFAULT_NVML_VERSION, '.') + 1;
    unsigned major = (unsigned)atoi(version), bit = 0;
    for (unsigned i = 0; i < mokka_release_count; i++)
        if (mokka_releases[i] <= major) bit = i;
    return bit;
}

static int by_name(const void *key, const void *entry) { return strcmp(key, *(const char *const *)entry); }

int mokka_release_exports(const char *name) {
    const char *const *hit =
        bsearch(name, mokka_partial_names, mokka_partial_count, sizeof *mokka_partial_names, by_name);
    if (!hit) return 1; /* every known release exports it */
    return (int)(mokka_partial_masks[hit - mokka_partial_names] >> reported_release_bit() & 1);
}
