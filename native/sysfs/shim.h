/*
 * What the shim's files share: the hooks' visibility, the next definition of a hooked
 * function, and the staged root (mokka_sysfs.c owns it).
 */
#ifndef MOKKA_SHIM_H
#define MOKKA_SHIM_H

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>

/* Bind dlsym to its oldest version so the shim also loads under glibc < 2.34 (containers). */
#if defined(__x86_64__)
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver dlsym,dlsym@GLIBC_2.17");
#endif

#define HOOK __attribute__((visibility("default")))

/* The next definition of `fn`, looked up once (racing threads store the same pointer). */
#define NEXT(fn)                                                              \
    ({                                                                        \
        static __typeof__(&fn) next_;                                         \
        __typeof__(&fn) f_ = __atomic_load_n(&next_, __ATOMIC_ACQUIRE);       \
        if (f_ == NULL) {                                                     \
            f_ = (__typeof__(&fn))dlsym(RTLD_NEXT, #fn);                      \
            __atomic_store_n(&next_, f_, __ATOMIC_RELEASE);                   \
        }                                                                     \
        f_;                                                                   \
    })

/* Call the next `fn`, or fail with ENOSYS when this libc has none (an old or new glibc). */
#define CALL(fn, fail, ...)                                                   \
    ({                                                                        \
        __typeof__(&fn) c_ = NEXT(fn);                                        \
        c_ ? c_(__VA_ARGS__) : (errno = ENOSYS, (fail));                      \
    })


/* MOKKA_SYSFS_ROOT names a staged tree (the hooks rewrite paths). */
int shim_enabled(void);

/* The staged root (canonical, no trailing '/'), or NULL when the shim is off. */
const char *shim_root(void);

/* `path` under the staged root in `buf` (PATH_MAX), or NULL when it is not redirected. */
const char *shim_map(const char *path, char *buf);

/* The staged file `path` (an absolute path as the program names it) read into `buf`, its
 * trailing newline cut: the length, or -1 when it is missing. */
int shim_read(const char *path, char *buf, size_t size);

/* The whole staged file `path` (NUL-terminated, its length in *len; the caller frees it), or NULL. */
char *shim_read_all(const char *path, size_t *len);

/* `p`, a canonical path under the staged root, as the program names it; NULL when it is not
 * under the root. */
const char *shim_unrooted(const char *p);

/* listing.c: `dir` was opened on `path` (staged or real); remembered when it lists an
 * InfiniBand class of the staged tree, whose entries readdir then filters. Returns `dir`. */
struct __dirstream;
struct __dirstream *shim_listing_opened(struct __dirstream *dir, const char *path);

/* listing.c: scandir/scandir64 of `path` (staged or real), without the entries of the adapters
 * the program was not given when `path` is an InfiniBand class of the staged tree. */
struct dirent;
struct dirent64;
int shim_scandir(const char *path, struct dirent ***list, int (*filter)(const struct dirent *),
                 int (*compar)(const struct dirent **, const struct dirent **));
int shim_scandir64(const char *path, struct dirent64 ***list, int (*filter)(const struct dirent64 *),
                   int (*compar)(const struct dirent64 **, const struct dirent64 **));

/* umad.c: `path` is one of the staged umad devices: a descriptor served by the MAD responder
 * (or -1, errno set); -2 when `path` is no umad device. */
int umad_open(const char *path, int flags);

#endif
