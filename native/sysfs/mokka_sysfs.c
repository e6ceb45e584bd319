/*
 * libmokka-sysfs.so: an LD_PRELOAD library that shows C programs a staged PCI sysfs and
 * NVIDIA procfs tree at the real paths.
 *
 * With MOKKA_SYSFS_ROOT=<root> in the environment, lookups of
 *
 *     /sys/bus/pci...          /sys/devices/pci...        (the PCI tree: lspci, hwloc)
 *     /sys/module/nvidia...    /proc/driver/nvidia...     (the driver's footprint)
 *     /proc/modules                                       (the loaded nvidia modules: NVIDIA's
 *                                                          runtime wrappers check it with cat)
 *     /sys/class/infiniband{,_verbs,_mad}...              (the InfiniBand adapters: ibstat,
 *     /dev/infiniband...                                   libibverbs, hwloc's NIC objects)
 *
 * go to <root><path> first (hostsetup/sysfs.py writes that tree). When the staged path does
 * not exist (ENOENT/ENOTDIR) the real path is tried, so the host's own PCI functions stay
 * reachable by name (/sys/class/net/eth0/device/... and the like keep working), while
 * directory listings come from the staged tree alone: /sys/bus/pci/devices lists the mock
 * GPUs only. A merged listing would need readdir interposition per DIR stream (hwloc reads
 * directories through openat + fdopendir) and would collide where a profile's bus id is a
 * real device's; the node being simulated is the profile's, so its PCI bus is too.
 * realpath() answers with the path as the program asked for it (the root is stripped), and
 * readlink() returns the staged links' relative targets, which read like the kernel's.
 *
 * Without MOKKA_SYSFS_ROOT (or with it empty) every hook calls the next definition with its
 * arguments untouched. Only absolute paths are rewritten; a path relative to a directory fd
 * already lands in the staged tree when the fd was opened through the redirect.
 *
 * No allocation: paths are rewritten in a PATH_MAX buffer on the stack (realpath(p, NULL)
 * allocates as libc does). The real functions are found with dlsym(RTLD_NEXT) once each.
 *
 * The same library answers for the staged InfiniBand adapters beyond their files: umad.c serves
 * /dev/infiniband/umadN (the MAD tools), ibverbs.c libibverbs' device verbs (ibv_devinfo), and
 * listing.c lists a container the adapters it was given.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "shim.h"


/* Not declared by current glibc headers (or only under _FORTIFY_SOURCE). */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);
int __xstat(int ver, const char *path, struct stat *buf);
int __xstat64(int ver, const char *path, struct stat64 *buf);
int __lxstat(int ver, const char *path, struct stat *buf);
int __lxstat64(int ver, const char *path, struct stat64 *buf);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags);
char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen);
ssize_t __readlink_chk(const char *path, char *buf, size_t len, size_t buflen);
ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t len, size_t buflen);

/* ---- the root ---------------------------------------------------------------------- */

enum { UNSET = 0, BUSY = 1, OFF = 2, ON = 3 };
static int g_state;            /* atomic: UNSET -> BUSY -> OFF | ON */
static char g_root[PATH_MAX];  /* canonical, no trailing '/'; written once before ON */
static size_t g_rootlen;

static void init(void) {
    int expected = UNSET;
    if (!__atomic_compare_exchange_n(&g_state, &expected, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == BUSY)
            ;
        return;
    }
    int saved = errno;
    int state = OFF;
    const char *root = getenv("MOKKA_SYSFS_ROOT");
    if (root != NULL && root[0] != '\0') {
        char *(*rp)(const char *, char *) = NEXT(realpath);
        if (rp == NULL || rp(root, g_root) == NULL) {
            size_t n = strlen(root);
            if (n < sizeof g_root)
                memcpy(g_root, root, n + 1);
            else
                g_root[0] = '\0';
        }
        g_rootlen = strlen(g_root);
        while (g_rootlen > 0 && g_root[g_rootlen - 1] == '/')
            g_root[--g_rootlen] = '\0';
        if (g_root[0] == '/')
            state = ON; /* a root of "/" is the real tree: nothing to do */
    }
    errno = saved;
    __atomic_store_n(&g_state, state, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void mokka_sysfs_init(void) { init(); }

int shim_enabled(void) {
    int s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    if (s < OFF) {
        init();
        s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    }
    return s == ON;
}

const char *shim_root(void) { return shim_enabled() ? g_root : NULL; }

/* ---- which paths ------------------------------------------------------------------- */

static int starts(const char *p, const char *prefix, size_t n) { return strncmp(p, prefix, n) == 0; }

/* `p` continues a matched prefix at a component boundary (or with one of `extra`). */
static int boundary(char c, const char *extra) { return c == '\0' || c == '/' || (c != '\0' && strchr(extra, c)); }

static int redirected(const char *p) {
    if (p[0] != '/')
        return 0;
    if (starts(p, "/sys/", 5)) {
        const char *q = p + 5;
        if (starts(q, "bus/pci", 7))
            return boundary(q[7], "");
        if (starts(q, "devices/pci", 11))
            return 1;
        if (starts(q, "module/nvidia", 13))
            return boundary(q[13], "_");
        if (starts(q, "class/infiniband", 16))
            return boundary(q[16], "_");
        return 0;
    }
    if (starts(p, "/proc/driver/nvidia", 19))
        return boundary(p[19], "-");
    if (starts(p, "/dev/infiniband", 15))
        return boundary(p[15], "");
    return strcmp(p, "/proc/modules") == 0;
}

/* `path` under the root in `buf`, or NULL when it is not redirected (or too long). */
const char *shim_map(const char *path, char *buf) {
    if (path == NULL || !shim_enabled() || !redirected(path))
        return NULL;
    size_t n = strlen(path);
    if (g_rootlen + n >= PATH_MAX)
        return NULL;
    memcpy(buf, g_root, g_rootlen);
    memcpy(buf + g_rootlen, path, n + 1);
    return buf;
}

int shim_read(const char *path, char *buf, size_t size) {
    char staged[PATH_MAX];
    const char *p = shim_map(path, staged);
    if (p == NULL || size == 0)
        return -1;
    int saved = errno;
    int fd = CALL(open, -1, p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved;
        return -1;
    }
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    errno = saved;
    if (n < 0)
        return -1;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    return (int)n;
}

char *shim_read_all(const char *path, size_t *len) {
    char staged[PATH_MAX];
    const char *p = shim_map(path, staged);
    if (p == NULL)
        return NULL;
    int saved = errno;
    int fd = CALL(open, -1, p, O_RDONLY | O_CLOEXEC);
    char *buf = NULL;
    size_t used = 0, cap = 0;
    while (fd >= 0) {
        if (used + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            char *more = realloc(buf, cap);
            if (more == NULL)
                break;
            buf = more;
        }
        ssize_t n = read(fd, buf + used, cap - used - 1);
        if (n <= 0) {
            if (n == 0) {
                buf[used] = '\0';
                *len = used;
                close(fd);
                errno = saved;
                return buf;
            }
            break;
        }
        used += (size_t)n;
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    errno = saved;
    return NULL;
}

/* The staged tree lacks the path: try the real one. */
static int missing(void) { return errno == ENOENT || errno == ENOTDIR; }

/* Staged first, real path when the staged one is missing. `call` uses `P` as the path. */
#define TRY(type, bad, call)                                                  \
    do {                                                                      \
        char buf_[PATH_MAX];                                                  \
        const char *P = shim_map(path, buf_);                                      \
        if (P != NULL) {                                                      \
            int saved_ = errno;                                               \
            type r_ = (call);                                                 \
            if (r_ != (bad) || !missing())                                    \
                return r_;                                                    \
            errno = saved_;                                                   \
        }                                                                     \
        P = path;                                                             \
        return (call);                                                        \
    } while (0)

static int needs_mode(int flags) {
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE)
        return 1;
#endif
    return (flags & O_CREAT) != 0;
}

#define MODE_ARG(flags)                                                       \
    mode_t mode = 0;                                                          \
    if (needs_mode(flags)) {                                                  \
        va_list ap;                                                           \
        va_start(ap, flags);                                                  \
        mode = (mode_t)va_arg(ap, int);                                       \
        va_end(ap);                                                           \
    }

/* ---- open ---------------------------------------------------------------------------- */

/* A umad device (/dev/infiniband/umadN) opens as a descriptor the MAD responder serves. */
#define DEVICE(path, flags)                                                   \
    do {                                                                      \
        int u_ = umad_open(path, flags);                                      \
        if (u_ != -2)                                                         \
            return u_;                                                        \
    } while (0)

HOOK int open(const char *path, int flags, ...) {
    DEVICE(path, flags);
    MODE_ARG(flags);
    TRY(int, -1, CALL(open, -1, P, flags, mode));
}

HOOK int open64(const char *path, int flags, ...) {
    DEVICE(path, flags);
    MODE_ARG(flags);
    TRY(int, -1, CALL(open64, -1, P, flags, mode));
}

HOOK int openat(int dirfd, const char *path, int flags, ...) {
    DEVICE(path, flags);
    MODE_ARG(flags);
    TRY(int, -1, CALL(openat, -1, dirfd, P, flags, mode));
}

HOOK int openat64(int dirfd, const char *path, int flags, ...) {
    DEVICE(path, flags);
    MODE_ARG(flags);
    TRY(int, -1, CALL(openat64, -1, dirfd, P, flags, mode));
}

HOOK int __open_2(const char *path, int flags) {
    DEVICE(path, flags);
    TRY(int, -1, CALL(__open_2, -1, P, flags));
}

HOOK int __open64_2(const char *path, int flags) {
    DEVICE(path, flags);
    TRY(int, -1, CALL(__open64_2, -1, P, flags));
}

HOOK int __openat_2(int dirfd, const char *path, int flags) {
    DEVICE(path, flags);
    TRY(int, -1, CALL(__openat_2, -1, dirfd, P, flags));
}

HOOK int __openat64_2(int dirfd, const char *path, int flags) {
    DEVICE(path, flags);
    TRY(int, -1, CALL(__openat64_2, -1, dirfd, P, flags));
}

HOOK FILE *fopen(const char *path, const char *mode) { TRY(FILE *, NULL, CALL(fopen, NULL, P, mode)); }

HOOK FILE *fopen64(const char *path, const char *mode) { TRY(FILE *, NULL, CALL(fopen64, NULL, P, mode)); }

/* ---- stat ---------------------------------------------------------------------------- */

HOOK int stat(const char *path, struct stat *st) { TRY(int, -1, CALL(stat, -1, P, st)); }

HOOK int stat64(const char *path, struct stat64 *st) { TRY(int, -1, CALL(stat64, -1, P, st)); }

HOOK int lstat(const char *path, struct stat *st) { TRY(int, -1, CALL(lstat, -1, P, st)); }

HOOK int lstat64(const char *path, struct stat64 *st) { TRY(int, -1, CALL(lstat64, -1, P, st)); }

HOOK int fstatat(int dirfd, const char *path, struct stat *st, int flags) {
    TRY(int, -1, CALL(fstatat, -1, dirfd, P, st, flags));
}

HOOK int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) {
    TRY(int, -1, CALL(fstatat64, -1, dirfd, P, st, flags));
}

/* glibc < 2.33 compiled stat() to these; binaries built then (nvidia-smi) still call them. */
HOOK int __xstat(int ver, const char *path, struct stat *st) { TRY(int, -1, CALL(__xstat, -1, ver, P, st)); }

HOOK int __xstat64(int ver, const char *path, struct stat64 *st) {
    TRY(int, -1, CALL(__xstat64, -1, ver, P, st));
}

HOOK int __lxstat(int ver, const char *path, struct stat *st) { TRY(int, -1, CALL(__lxstat, -1, ver, P, st)); }

HOOK int __lxstat64(int ver, const char *path, struct stat64 *st) {
    TRY(int, -1, CALL(__lxstat64, -1, ver, P, st));
}

HOOK int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags) {
    TRY(int, -1, CALL(__fxstatat, -1, ver, dirfd, P, st, flags));
}

HOOK int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags) {
    TRY(int, -1, CALL(__fxstatat64, -1, ver, dirfd, P, st, flags));
}

HOOK int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *st) {
    TRY(int, -1, CALL(statx, -1, dirfd, P, flags, mask, st));
}

/* ---- access -------------------------------------------------------------------------- */

HOOK int access(const char *path, int mode) { TRY(int, -1, CALL(access, -1, P, mode)); }

HOOK int faccessat(int dirfd, const char *path, int mode, int flags) {
    TRY(int, -1, CALL(faccessat, -1, dirfd, P, mode, flags));
}

HOOK int euidaccess(const char *path, int mode) { TRY(int, -1, CALL(euidaccess, -1, P, mode)); }

HOOK int eaccess(const char *path, int mode) { TRY(int, -1, CALL(eaccess, -1, P, mode)); }

/* ---- directories --------------------------------------------------------------------- */

HOOK DIR *opendir(const char *path) { TRY(DIR *, NULL, shim_listing_opened(CALL(opendir, NULL, P), P)); }

/* Shell scripts walk the tree with cd (ibstatus: `cd /sys/class/infiniband; echo *`). */
HOOK int chdir(const char *path) { TRY(int, -1, CALL(chdir, -1, P)); }

HOOK int scandir(const char *path, struct dirent ***list, int (*filter)(const struct dirent *),
                 int (*compar)(const struct dirent **, const struct dirent **)) {
    TRY(int, -1, shim_scandir(P, list, filter, compar));
}

HOOK int scandir64(const char *path, struct dirent64 ***list, int (*filter)(const struct dirent64 *),
                   int (*compar)(const struct dirent64 **, const struct dirent64 **)) {
    TRY(int, -1, shim_scandir64(P, list, filter, compar));
}

/* ---- links ----------------------------------------------------------------------------- */

HOOK ssize_t readlink(const char *path, char *out, size_t len) { TRY(ssize_t, -1, CALL(readlink, -1, P, out, len)); }

HOOK ssize_t readlinkat(int dirfd, const char *path, char *out, size_t len) {
    TRY(ssize_t, -1, CALL(readlinkat, -1, dirfd, P, out, len));
}

HOOK ssize_t __readlink_chk(const char *path, char *out, size_t len, size_t outlen) {
    if (len > outlen) /* let libc report the overflow */
        return CALL(__readlink_chk, -1, path, out, len, outlen);
    return readlink(path, out, len);
}

HOOK ssize_t __readlinkat_chk(int dirfd, const char *path, char *out, size_t len, size_t outlen) {
    if (len > outlen)
        return CALL(__readlinkat_chk, -1, dirfd, path, out, len, outlen);
    return readlinkat(dirfd, path, out, len);
}

const char *shim_unrooted(const char *p) {
    if (shim_enabled() && strncmp(p, g_root, g_rootlen) == 0 && p[g_rootlen] == '/')
        return p + g_rootlen;
    return NULL;
}

/* The staged tree's canonical path, shown as the path below the root. */
static const char *unrooted(const char *p) {
    const char *below = shim_unrooted(p);
    return below != NULL ? below : p;
}

HOOK char *realpath(const char *path, char *resolved) {
    char buf[PATH_MAX];
    const char *m = shim_map(path, buf);
    if (m != NULL) {
        int saved = errno;
        char tmp[PATH_MAX];
        if (CALL(realpath, NULL, m, tmp) != NULL) {
            const char *s = unrooted(tmp);
            size_t n = strlen(s) + 1;
            char *out = resolved != NULL ? resolved : malloc(n);
            if (out == NULL) {
                errno = ENOMEM;
                return NULL;
            }
            memmove(out, s, n);
            errno = saved;
            return out;
        }
        if (!missing())
            return NULL;
        errno = saved;
    }
    return CALL(realpath, NULL, path, resolved);
}

HOOK char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen) {
    if (resolvedlen < PATH_MAX) /* let libc report the overflow */
        return CALL(__realpath_chk, NULL, path, resolved, resolvedlen);
    return realpath(path, resolved);
}

HOOK char *canonicalize_file_name(const char *path) { return realpath(path, NULL); }
