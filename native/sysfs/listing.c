/* Listings of the InfiniBand classes, as a container's network namespace shows them.
 *
 * The kernel lists in /sys/class/infiniband (and infiniband_verbs, infiniband_mad) the RDMA
 * devices of the reader's network namespace once RDMA's namespace mode is exclusive, as DRA NIC
 * drivers and RDMA device plugins set it; in the default shared mode every namespace sees every
 * adapter. The node's staged tree holds every adapter, so a container given some adapters
 * (their /dev/infiniband/uverbsN, as such a driver passes them) would list them all. Here a
 * program that sees some uverbs devices lists only their adapters (with their uverbs, umad and
 * issm entries); one that sees none lists every adapter, as in the shared mode. "Sees" is as the
 * shim resolves the path: the staged /dev/infiniband first (a staged node: all of them), then the
 * container's own.
 *
 * Only listings change: nvidia-smi topo -m (hwloc: openat + fdopendir + readdir), libibverbs
 * (opendir + readdir) and libibumad (scandir) then name the given adapters alone, and ibstat
 * finds no other by name (it looks names up in the listing); a file path still resolves. The streams on a class directory of the staged tree are
 * remembered from opendir/fdopendir to closedir; every other stream passes through untouched.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

enum { NOT_A_CLASS = -1, CLASS_DEVICES, CLASS_VERBS, CLASS_MAD };
enum { MAX_ADAPTERS = 64, MAX_STREAMS = 64, NAME_MAX_CA = 64 };

/* ---- which adapters the program was given ------------------------------------------- */

static struct {
    int filtered;                        /* some uverbs devices are visible, not all */
    char given[MAX_ADAPTERS][NAME_MAX_CA]; /* the adapters whose uverbs device is visible */
    int n_given;
} g_view;
static pthread_once_t g_view_once = PTHREAD_ONCE_INIT;

/* uverbsN of the staged tree, in order (they are numbered from 0 without gaps), and whether the
 * program sees its device node. */
static void view_init(void) {
    int seen = 0, total = 0;
    for (int n = 0; n < MAX_ADAPTERS; n++) {
        char path[PATH_MAX], ca[NAME_MAX_CA];
        snprintf(path, sizeof path, "/sys/class/infiniband_verbs/uverbs%d/ibdev", n);
        if (shim_read(path, ca, sizeof ca) <= 0)
            break;
        total++;
        snprintf(path, sizeof path, "/dev/infiniband/uverbs%d", n);
        int saved = errno;
        int present = access(path, F_OK) == 0; /* the hooked access: staged, then the container's */
        errno = saved;
        if (present) {
            memcpy(g_view.given[g_view.n_given++], ca, sizeof ca);
            seen++;
        }
    }
    g_view.filtered = seen > 0 && seen < total;
}

static int given(const char *ca) {
    for (int i = 0; i < g_view.n_given; i++)
        if (strcmp(g_view.given[i], ca) == 0)
            return 1;
    return 0;
}

/* Entry `name` of class directory `klass` belongs to an adapter the program was not given. */
static int hidden(int klass, const char *name) {
    pthread_once(&g_view_once, view_init);
    if (!g_view.filtered || name[0] == '.')
        return 0;
    if (klass == CLASS_DEVICES)
        return !given(name);
    if (strcmp(name, "abi_version") == 0)
        return 0;
    char path[PATH_MAX], ca[NAME_MAX_CA];
    snprintf(path, sizeof path, "/sys/class/%s/%s/ibdev", klass == CLASS_VERBS ? "infiniband_verbs" : "infiniband_mad",
             name);
    return shim_read(path, ca, sizeof ca) > 0 && !given(ca);
}

/* ---- which streams list a class ------------------------------------------------------- */

/* The class a path of the staged tree (under the root) lists; a real path lists none. */
static int class_of(const char *path) {
    static const char *const names[] = {"/sys/class/infiniband", "/sys/class/infiniband_verbs",
                                        "/sys/class/infiniband_mad"};
    const char *p = shim_unrooted(path);
    if (p == NULL)
        return NOT_A_CLASS;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    for (int k = 0; k < 3; k++)
        if (strlen(names[k]) == n && strncmp(p, names[k], n) == 0)
            return k;
    return NOT_A_CLASS;
}

static struct {
    DIR *dir;
    int klass;
} g_streams[MAX_STREAMS];
static int g_n_streams; /* atomic: how many slots are taken (readdir's fast path) */
static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;

/* Remember `dir` when its descriptor is a class directory of the staged tree. */
static DIR *remember(DIR *dir) {
    if (dir == NULL || !shim_enabled())
        return dir;
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd(dir));
    int saved = errno;
    ssize_t n = CALL(readlink, -1, link, target, sizeof target - 1);
    errno = saved;
    if (n <= 0)
        return dir;
    target[n] = '\0';
    int klass = class_of(target);
    if (klass == NOT_A_CLASS)
        return dir;
    pthread_mutex_lock(&g_streams_lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (g_streams[i].dir == NULL) {
            g_streams[i].dir = dir;
            g_streams[i].klass = klass;
            __atomic_add_fetch(&g_n_streams, 1, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_streams_lock);
    return dir;
}

static int stream_class(DIR *dir) {
    if (__atomic_load_n(&g_n_streams, __ATOMIC_ACQUIRE) == 0)
        return NOT_A_CLASS;
    int klass = NOT_A_CLASS;
    pthread_mutex_lock(&g_streams_lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (g_streams[i].dir == dir) {
            klass = g_streams[i].klass;
            break;
        }
    pthread_mutex_unlock(&g_streams_lock);
    return klass;
}

static void forget(DIR *dir) {
    if (__atomic_load_n(&g_n_streams, __ATOMIC_ACQUIRE) == 0)
        return;
    pthread_mutex_lock(&g_streams_lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (g_streams[i].dir == dir) {
            g_streams[i].dir = NULL;
            __atomic_sub_fetch(&g_n_streams, 1, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_streams_lock);
}

/* ---- the hooks -------------------------------------------------------------------------- */

DIR *shim_listing_opened(DIR *dir, const char *path) {
    /* Only a path naming an InfiniBand class costs the descriptor lookup. */
    return path != NULL && strstr(path, "infiniband") != NULL ? remember(dir) : dir;
}

HOOK DIR *fdopendir(int fd) { return remember(CALL(fdopendir, NULL, fd)); }

HOOK int closedir(DIR *dir) {
    forget(dir);
    return CALL(closedir, -1, dir);
}

HOOK struct dirent *readdir(DIR *dir) {
    int klass = stream_class(dir);
    struct dirent *e;
    do
        e = CALL(readdir, NULL, dir);
    while (e != NULL && klass != NOT_A_CLASS && hidden(klass, e->d_name));
    return e;
}

HOOK struct dirent64 *readdir64(DIR *dir) {
    int klass = stream_class(dir);
    struct dirent64 *e;
    do
        e = CALL(readdir64, NULL, dir);
    while (e != NULL && klass != NOT_A_CLASS && hidden(klass, e->d_name));
    return e;
}

/* scandir reads inside libc, past the hooks: its filter drops the hidden entries. */
static __thread int t_class;
static __thread int (*t_filter)(const struct dirent *);
static __thread int (*t_filter64)(const struct dirent64 *);

static int keep(const struct dirent *e) { return !hidden(t_class, e->d_name) && (t_filter == NULL || t_filter(e)); }

static int keep64(const struct dirent64 *e) {
    return !hidden(t_class, e->d_name) && (t_filter64 == NULL || t_filter64(e));
}

int shim_scandir(const char *path, struct dirent ***list, int (*filter)(const struct dirent *),
                 int (*compar)(const struct dirent **, const struct dirent **)) {
    int klass = class_of(path);
    if (klass == NOT_A_CLASS)
        return CALL(scandir, -1, path, list, filter, compar);
    t_class = klass;
    t_filter = filter;
    return CALL(scandir, -1, path, list, keep, compar);
}

int shim_scandir64(const char *path, struct dirent64 ***list, int (*filter)(const struct dirent64 *),
                   int (*compar)(const struct dirent64 **, const struct dirent64 **)) {
    int klass = class_of(path);
    if (klass == NOT_A_CLASS)
        return CALL(scandir64, -1, path, list, filter, compar);
    t_class = klass;
    t_filter64 = filter;
    return CALL(scandir64, -1, path, list, keep64, compar);
}
