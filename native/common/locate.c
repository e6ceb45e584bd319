/* Finding and mapping the state: $MOKKA_STATE, else the library's own file.
 *
 * A file holds the state either from its first byte (a state file) or, in a library file,
 * at the offset its trailer names (see mokka_state.h). Everything is validated before any
 * field is trusted: magic, layout version and record sizes, and that the records fit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state_read.h"

mokka_map_t g_state;

_Static_assert(sizeof(mokka_header_t) % 8 == 0, "header keeps 8-byte alignment of the copies");
_Static_assert(sizeof(mokka_node_t) % 8 == 0, "node section keeps 8-byte alignment of the records");
_Static_assert(sizeof(mokka_gpu_t) % 8 == 0, "records keep 8-byte alignment");
_Static_assert(sizeof(mokka_trailer_t) == 24, "trailer is three 64-bit words");

static void complain(const char *path, const char *why) {
    if (getenv("MOKKA_QUIET")) return;
    fprintf(stderr, "mokka: cannot use state file %s: %s\n", path, why);
}

int mokka_library_file(const void *self, char *out, size_t size) {
    Dl_info info;
    if (dladdr(self, &info) && info.dli_fname && info.dli_fname[0] == '/')
        return snprintf(out, size, "%s", info.dli_fname) < (int)size ? 0 : -1;
    /* Loaded by a relative path: the kernel's record of the mapping is absolute. */
    FILE *maps = fopen("/proc/self/maps", "re");
    if (!maps) return -1;
    char line[PATH_MAX + 128];
    int found = -1;
    uintptr_t addr = (uintptr_t)self;
    while (found != 0 && fgets(line, sizeof line, maps)) {
        uintptr_t lo, hi;
        int at = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &at) < 2 || addr < lo || addr >= hi || !at) continue;
        char *path = line + at;
        path[strcspn(path, "\n")] = '\0';
        if (path[0] == '/') found = snprintf(out, size, "%s", path) < (int)size ? 0 : -1;
        break;
    }
    fclose(maps);
    return found;
}

/* Where the region lies in the open file: from byte 0 (a state file) or where the
 * trailer at the end says (a library carrying its state). NULL, or why not. */
const char *mokka_find_region(int fd, uint64_t file_size, uint64_t *offset, uint64_t *size) {
    uint64_t magic = 0;
    if (file_size < sizeof(mokka_header_t) && file_size < sizeof(mokka_trailer_t))
        return "truncated (shorter than the header)";
    if (pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic && magic == MOKKA_STATE_MAGIC) {
        *offset = 0;
        *size = file_size;
        return NULL;
    }
    mokka_trailer_t t;
    if (pread(fd, &t, sizeof t, (off_t)(file_size - sizeof t)) != (ssize_t)sizeof t || t.magic != MOKKA_TRAILER_MAGIC)
        return "not a Mokka state file (bad magic), nor a library carrying one";
    uint64_t room = file_size - sizeof t;
    if (t.state_offset % MOKKA_STATE_ALIGN != 0 || t.state_offset > room || t.state_size > room - t.state_offset)
        return "truncated or corrupt (the trailer points outside the file)";
    *offset = t.state_offset;
    *size = t.state_size;
    return NULL;
}

static const char *validate(const mokka_header_t *h, uint64_t size) {
    if (size < sizeof(mokka_header_t)) return "truncated (shorter than the header)";
    if (h->magic != MOKKA_STATE_MAGIC) return "not a Mokka state file (bad magic)";
    if (h->version != MOKKA_STATE_VERSION || h->header_size != sizeof(mokka_header_t) ||
        h->node_size != sizeof(mokka_node_t) || h->gpu_size != sizeof(mokka_gpu_t))
        return "written for another layout version; regenerate it with this Mokka";
    if (h->gpu_count > MOKKA_MAX_GPUS) return "corrupt (more GPUs than any layout holds)";
    uint64_t copy = sizeof(mokka_node_t) + (uint64_t)h->gpu_count * sizeof(mokka_gpu_t);
    if (size < sizeof(mokka_header_t) + 2 * copy) return "truncated or corrupt (GPU records missing)";
    return NULL;
}

mokka_map_status_t mokka_map_state(const char *carrier) {
    char path[PATH_MAX];
    const char *env = getenv("MOKKA_STATE");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else if (carrier) {
        snprintf(path, sizeof path, "%s", carrier);
    } else {
        complain("(unknown)", "cannot locate the library carrying the state; set MOKKA_STATE");
        return MOKKA_MAP_MISSING;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        complain(path, strerror(errno));
        return MOKKA_MAP_MISSING;
    }
    struct stat st = {0};
    const char *why = NULL;
    uint64_t offset = 0, size = 0;
    if (fstat(fd, &st) != 0)
        why = strerror(errno);
    else if (S_ISDIR(st.st_mode))
        why = "is a directory; MOKKA_STATE names a state file (or a library carrying one)";
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    else
        why = mokka_find_region(fd, (uint64_t)st.st_size, &offset, &size);
    if (why) {
        close(fd);
        complain(path, why);
        return (st.st_mode & S_IFMT) == S_IFREG ? MOKKA_MAP_INVALID : MOKKA_MAP_MISSING;
    }
    if (size < sizeof(mokka_header_t)) {
        close(fd);
        complain(path, "truncated (shorter than the header)");
        return MOKKA_MAP_INVALID;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, (off_t)offset);
    close(fd);
    if (map == MAP_FAILED) {
        complain(path, strerror(errno));
        return MOKKA_MAP_MISSING;
    }
    const mokka_header_t *h = map;
    why = validate(h, size);
    if (why) {
        munmap(map, (size_t)size);
        complain(path, why);
        return MOKKA_MAP_INVALID;
    }
    size_t copy = sizeof(mokka_node_t) + (size_t)h->gpu_count * sizeof(mokka_gpu_t);
    const char *first = (const char *)map + sizeof(mokka_header_t);
    g_state = (mokka_map_t){
        .hdr = h,
        .node = {(const mokka_node_t *)first, (const mokka_node_t *)(first + copy)},
        .gpus = {(const mokka_gpu_t *)(first + sizeof(mokka_node_t)),
                 (const mokka_gpu_t *)(first + copy + sizeof(mokka_node_t))},
        .copy_size = copy,
        .map = map,
        .map_size = (size_t)size,
    };
    return MOKKA_MAP_OK;
}

void mokka_unmap_state(void) {
    if (g_state.map) munmap(g_state.map, g_state.map_size);
    memset(&g_state, 0, sizeof g_state);
}
