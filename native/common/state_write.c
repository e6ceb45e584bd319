/* Changing the live state from inside a mock library; see state_write.h. */
#define _GNU_SOURCE
#include "state_write.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "latch.h"
#include "state_read.h"

/* The file this library maps its state from, as mokka_map_state chose it. */
static int state_path(char *out, size_t size) {
    const char *env = getenv("MOKKA_STATE");
    if (env && *env) {
        size_t n = strlen(env);
        if (n >= size) return -1;
        memcpy(out, env, n + 1);
        return 0;
    }
    return mokka_library_file((const void *)&mokka_state_change, out, size);
}

int mokka_state_change(mokka_change_fn change, void *ctx) {
    char path[PATH_MAX];
    if (state_path(path, sizeof path) != 0) return MOKKA_WRITE_FAILED;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return (errno == EACCES || errno == EROFS || errno == EPERM) ? MOKKA_WRITE_NO_ACCESS : MOKKA_WRITE_FAILED;
    int rc = MOKKA_WRITE_FAILED;
    struct stat st;
    uint64_t offset = 0, size = 0;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) goto out;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || mokka_find_region(fd, (uint64_t)st.st_size, &offset, &size))
        goto out;
    /* MAP_POPULATE: the whole region is read and written, so fault its pages in at once */
    void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, (off_t)offset);
    if (map == MAP_FAILED) goto out;
    mokka_header_t *h = map;
    if (mokka_latch_region_ok(h, size)) {
        uint64_t copy = mokka_latch_copy_size(h);
        char *live = mmap(NULL, (size_t)copy, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (live != MAP_FAILED) {
            const char *stable = (const char *)map + sizeof(mokka_header_t) + (uint64_t)mokka_latch_stable_copy(h) * copy;
            memcpy(live, stable, copy);
            mokka_node_t *node = (mokka_node_t *)live;
            rc = change(node, (mokka_gpu_t *)(live + sizeof(mokka_node_t)), h->gpu_count, ctx);
            if (rc == 0) {
                node->generation++;
                mokka_latch_publish_changes(map, live);
                rc = MOKKA_WRITE_OK;
            }
            munmap(live, (size_t)copy);
        }
    }
    munmap(map, (size_t)size);
out:
    close(fd); /* drops the lock */
    return rc;
}
