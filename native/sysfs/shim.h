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

/* `path` under the staged root in `buf` (PATH_MAX), or NULL when it is not redirected. */
const char *shim_map(const char *path, char *buf);

/* The staged file `path` (an absolute path as the program names it) read into `buf`, its
 * trailing newline cut: the length, or -1 when it is missing. */
int shim_read(const char *path, char *buf, size_t size);

/* The whole staged file `path` (NUL-terminated, its length in *len; the caller frees it), or NULL. */
char *shim_read_all(const char *path, size_t *len);

/* umad.c: `path` is one of the staged umad devices: a descriptor served by the MAD responder
 * (or -1, errno set); -2 when `path` is no umad device. */
int umad_open(const char *path, int flags);

#endif
