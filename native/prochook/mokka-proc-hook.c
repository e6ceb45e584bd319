/*
 * mokka-proc-hook: an OCI createContainer hook that shows a container the mock node's driver as a
 * GPU node's kernel and driver installation show it to every program there:
 *
 *     mokka-proc-hook --driver DIR [--proc NAME=FILE ...] [--bind DIR=PATH ...] [--link PATH=TARGET ...]
 *                                                           (the OCI state on stdin, as hooks get it)
 *
 * --driver DIR         the container's /proc/driver holds DIR's entries (the staged nvidia and
 *                      nvidia-caps trees: NVIDIA's device plugin maps MIG capabilities through
 *                      nvidia-caps/mig-minors) beside its real ones;
 * --proc NAME=FILE     /proc/NAME is FILE's copy: modules (NVIDIA's mig-parted, behind the MIG
 *                      manager, refuses to run without an nvidia line) and devices (nvidia-ctk
 *                      finds the driver's majors there);
 * --bind DIR=PATH      the host's directory DIR is bound read-only (nosuid, nodev) at PATH in the
 *                      container, its missing directories made (the staged sys/ and proc/ trees
 *                      the sysfs shim reads);
 * --link PATH=TARGET   PATH in the container is a symbolic link to TARGET, as a GPU node's
 *                      libnvidia-ml.so.1 is to the versioned library (whatever the image had at
 *                      PATH, a file or a link, goes: that is the container's own layer).
 *
 * Programs that read these with raw system calls (Go) cannot be served by the LD_PRELOAD shim,
 * and a container's procfs cannot be given files: runc refuses mounts under /proc but a few,
 * and a kernel without modules has no /proc/modules to mount over. So the hook, which runs in the
 * container's mount namespace before pivot_root (runc; the bundle's config.json names the root),
 * mounts a tmpfs over /proc/driver holding its real entries (bound) and DIR's; with --proc, a
 * tmpfs over /proc itself holding every other entry of the real procfs (kept at /proc/.real; self
 * and thread-self link into it, so they resolve per process) and the files given. Process
 * directories are then not listed (/proc/self still reaches the reader's own): only the MIG
 * manager asks for that. The binds and links are what the container spec would otherwise list
 * as mounts: made here, they keep the spec (which containerd 2.x decodes again for every status of
 * every container of the pod) small. Paths in the container are resolved inside its root, as
 * runc resolves a mount's destination: a link in the image never leads out of it.
 * Everything is done on the container's own mounts and layer; an error fails the hook with one line.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_DOC (1 << 20)

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mokka-proc-hook: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* out = a + "/" + b; -1 when it does not fit. */
static int join(char *out, size_t size, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la + 1 + lb + 1 > size)
        return -1;
    memcpy(out, a, la);
    out[la] = '/';
    memcpy(out + la + 1, b, lb + 1);
    return 0;
}

/* Read a whole stream into a NUL-terminated buffer (NULL when too large or unreadable). */
static char *slurp(FILE *f) {
    char *buf = malloc(MAX_DOC + 1);
    if (!buf)
        return NULL;
    size_t n = fread(buf, 1, MAX_DOC, f);
    if (ferror(f) || !feof(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* The JSON string value of the first "key" at or after `from`: copied (unescaped) into out. */
static const char *json_string(const char *from, const char *key, char *out, size_t size) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    for (const char *p = strstr(from, quoted); p; p = strstr(p + 1, quoted)) {
        const char *q = p + strlen(quoted);
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
            q++;
        if (*q != ':')
            continue;
        q++;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
            q++;
        if (*q != '"')
            continue;
        size_t n = 0;
        for (q++; *q && *q != '"'; q++) {
            char c = *q;
            if (c == '\\') {
                c = *++q;
                if (c != '"' && c != '\\' && c != '/')
                    return NULL; /* \uXXXX and the like: not in the paths runtimes write */
            }
            if (n + 1 >= size)
                return NULL;
            out[n++] = c;
        }
        if (*q != '"')
            return NULL;
        out[n] = '\0';
        return q;
    }
    return NULL;
}

/* The container's root directory: config.json's root.path, relative to the bundle when not absolute. */
static int container_root(char *root, size_t size) {
    char *state = slurp(stdin);
    if (!state)
        return fail("cannot read the OCI state on stdin");
    char bundle[PATH_MAX];
    const char *found = json_string(state, "bundle", bundle, sizeof bundle);
    free(state);
    if (!found)
        return fail("the OCI state on stdin names no bundle");
    char config[PATH_MAX];
    if (join(config, sizeof config, bundle, "config.json") != 0)
        return fail("%s: path too long", bundle);
    FILE *f = fopen(config, "re");
    if (!f)
        return fail("%s: %s", config, strerror(errno));
    char *doc = slurp(f);
    fclose(f);
    if (!doc)
        return fail("%s: cannot read it", config);
    const char *at = strstr(doc, "\"root\"");
    char path[PATH_MAX];
    found = at ? json_string(at, "path", path, sizeof path) : NULL;
    free(doc);
    if (!found)
        return fail("%s: no root.path", config);
    int bad = path[0] == '/' ? (strlen(path) + 1 > size ? -1 : (memcpy(root, path, strlen(path) + 1), 0))
                             : join(root, size, bundle, path);
    return bad == 0 ? 0 : fail("%s: root path too long", config);
}

/* An O_PATH descriptor of `path` (absolute, in the container) resolved inside the container's root
 * `rootfd` as the container will see it: symbolic links, absolute ones too, stay inside. -1 with
 * errno set when it does not resolve. */
static int resolve_in(int rootfd, const char *path) {
    struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    const char *relative = path[0] == '/' ? path + 1 : path;
    return (int)syscall(SYS_openat2, rootfd, *relative ? relative : ".", &how, sizeof how);
}

/* The directory `path` in the container: an O_PATH descriptor, its missing directories made
 * (mode 0755, as runc makes a mount's destination; a dangling link of the image's is followed and
 * its target made, inside the root); -1 after one line on failure. */
static int make_dirs_at(int rootfd, const char *path, int depth) {
    char prefix[PATH_MAX];
    if (strlen(path) + 1 > sizeof prefix)
        return fail("%s: path too long", path), -1;
    if (depth > 16)
        return fail("%s: too many levels of links", path), -1;
    int fd = resolve_in(rootfd, "/");
    for (const char *p = path; fd >= 0 && *p;) {
        while (*p == '/')
            p++;
        const char *end = strchrnul(p, '/');
        if (end == p)
            break;
        memcpy(prefix, path, (size_t)(end - path));
        prefix[end - path] = '\0';
        char name[NAME_MAX + 1];
        if ((size_t)(end - p) > NAME_MAX)
            return close(fd), fail("%s: name too long", path), -1;
        memcpy(name, p, (size_t)(end - p));
        name[end - p] = '\0';
        int next = resolve_in(rootfd, prefix);
        if (next < 0 && errno == ENOENT) {
            if (mkdirat(fd, name, 0755) == 0) {
                next = resolve_in(rootfd, prefix);
            } else if (errno == EEXIST) { /* a dangling link: make where it leads, then the rest */
                char target[PATH_MAX], rest[PATH_MAX];
                ssize_t n = readlinkat(fd, name, target, sizeof target - 1);
                close(fd);
                if (n <= 0)
                    return fail("%s: %s", prefix, n < 0 ? strerror(errno) : "empty link"), -1;
                target[n] = '\0';
                int len = target[0] == '/' ? snprintf(rest, sizeof rest, "%s%s", target, end)
                                           : snprintf(rest, sizeof rest, "%.*s%s%s", (int)(p - path), path, target, end);
                if (len < 0 || (size_t)len >= sizeof rest)
                    return fail("%s: path too long", prefix), -1;
                return make_dirs_at(rootfd, rest, depth + 1);
            } else {
                return close(fd), fail("mkdir %s: %s", prefix, strerror(errno)), -1;
            }
        }
        close(fd);
        if (next < 0)
            return fail("%s: %s", prefix, strerror(errno)), -1;
        fd = next;
        p = end;
    }
    if (fd < 0)
        return fail("%s: %s", path, strerror(errno)), -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode))
        return close(fd), fail("%s: not a directory in the container", path), -1;
    return fd;
}

static int make_dirs(int rootfd, const char *path) { return make_dirs_at(rootfd, path, 0); }

/* The host's directory `from` bound read-only at `to` in the container. */
static int bind_dir(int rootfd, const char *from, const char *to) {
    int fd = make_dirs(rootfd, to);
    if (fd < 0)
        return 1;
    char at[64];
    snprintf(at, sizeof at, "/proc/self/fd/%d", fd);
    int rc = mount(from, at, NULL, MS_BIND | MS_REC, NULL);
    close(fd);
    if (rc != 0)
        return fail("bind %s on %s: %s", from, to, strerror(errno));
    /* The new mount, reached again (the descriptor named what it covers), made read-only. */
    if ((fd = resolve_in(rootfd, to)) < 0)
        return fail("%s: %s", to, strerror(errno));
    snprintf(at, sizeof at, "/proc/self/fd/%d", fd);
    rc = mount(NULL, at, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
    close(fd);
    return rc == 0 ? 0 : fail("remount %s read-only: %s", to, strerror(errno));
}

/* `path` in the container a symbolic link to `target`. */
static int make_link(int rootfd, const char *path, const char *target) {
    const char *slash = strrchr(path, '/');
    if (!slash || !slash[1] || strcmp(slash + 1, ".") == 0 || strcmp(slash + 1, "..") == 0)
        return fail("--link %s: not a file's path", path);
    char dir[PATH_MAX];
    if ((size_t)(slash - path) + 2 > sizeof dir)
        return fail("%s: path too long", path);
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    int dfd = make_dirs(rootfd, dir[0] ? dir : "/"); /* O_PATH: it serves the *at() calls below */
    if (dfd < 0)
        return 1;
    const char *name = slash + 1;
    int rc = 0;
    char had[PATH_MAX];
    ssize_t n = readlinkat(dfd, name, had, sizeof had - 1);
    if (n >= 0 && (size_t)n == strlen(target) && memcmp(had, target, (size_t)n) == 0)
        goto out; /* already so */
    if (unlinkat(dfd, name, 0) != 0) {
        if (errno == EBUSY)
            goto out; /* something is mounted there (the container's own mount): it stays */
        if (errno != ENOENT)
            rc = fail("%s: %s", path, strerror(errno));
    }
    if (rc == 0 && symlinkat(target, dfd, name) != 0)
        rc = fail("symlink %s: %s", path, strerror(errno));
out:
    close(dfd);
    return rc;
}

static int all_digits(const char *s) {
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* Put one entry of the real procfs (at real/name) into the new /proc (at proc/name). */
static int add_entry(const char *real, const char *proc, const char *name) {
    char from[PATH_MAX], to[PATH_MAX];
    if (join(from, sizeof from, real, name) != 0 || join(to, sizeof to, proc, name) != 0)
        return fail("%s/%s: path too long", proc, name);
    struct stat st;
    if (lstat(from, &st) != 0)
        return errno == ENOENT ? 0 : fail("%s: %s", from, strerror(errno));
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        if (strcmp(name, "self") == 0 || strcmp(name, "thread-self") == 0) {
            snprintf(target, sizeof target, ".real/%s", name); /* resolved by the real procfs, per reader */
        } else {
            ssize_t n = readlink(from, target, sizeof target - 1);
            if (n < 0)
                return fail("%s: %s", from, strerror(errno));
            target[n] = '\0'; /* relative ones (mounts -> self/mounts) resolve in the new /proc */
        }
        return symlink(target, to) == 0 ? 0 : fail("symlink %s: %s", to, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        if (mkdir(to, 0555) != 0)
            return fail("mkdir %s: %s", to, strerror(errno));
    } else {
        int fd = open(to, O_CREAT | O_WRONLY | O_CLOEXEC, 0444);
        if (fd < 0)
            return fail("%s: %s", to, strerror(errno));
        close(fd);
    }
    return mount(from, to, NULL, MS_BIND | MS_REC, NULL) == 0 ? 0 : fail("bind %s: %s", from, strerror(errno));
}

static int write_file(const char *path, const char *src) {
    FILE *in = fopen(src, "re");
    if (!in)
        return fail("%s: %s", src, strerror(errno));
    char *text = slurp(in);
    fclose(in);
    if (!text)
        return fail("%s: cannot read it", src);
    FILE *out = fopen(path, "we");
    int ok = out && fputs(text, out) >= 0;
    if (out && fclose(out) != 0)
        ok = 0;
    free(text);
    return ok ? 0 : fail("%s: %s", path, strerror(errno));
}

/* Bind every entry of `from` but those named in `skip` (NULL-terminated) into `to`. */
static int add_entries(const char *from, const char *to, const char *const *skip) {
    DIR *d = opendir(from);
    if (!d)
        return fail("%s: %s", from, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (e->d_name[0] == '.' || all_digits(e->d_name))
            continue;
        int skipped = 0;
        for (const char *const *s = skip; s && *s && !skipped; s++)
            skipped = strcmp(e->d_name, *s) == 0;
        if (!skipped)
            rc = add_entry(from, to, e->d_name);
    }
    closedir(d);
    return rc;
}

#define MAX_FILES 8

/* Keep what is mounted at `target` reachable at `stash` (a new directory in the container's /dev,
 * a tmpfs runc made), then cover `target` with an empty tmpfs named `fsname`. */
static int cover(const char *target, const char *stash, const char *fsname) {
    if (mkdir(stash, 0500) != 0 && errno != EEXIST)
        return fail("mkdir %s: %s", stash, strerror(errno));
    if (mount(target, stash, NULL, MS_BIND | MS_REC, NULL) != 0)
        return fail("bind %s: %s", target, strerror(errno));
    if (mount(fsname, target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555") != 0)
        return fail("tmpfs on %s: %s", target, strerror(errno));
    return 0;
}

/* The tmpfs at `target` read-only from here, as procfs entries are not the container's to create. */
static int seal(const char *target) {
    if (mount(NULL, target, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        return fail("remount %s read-only: %s", target, strerror(errno));
    return 0;
}

/* The container's /proc becomes a tmpfs of the real procfs's entries and the `names` files,
 * copies of `srcs` (n of each). */
static int replace_proc(const char *root, const char *const *names, const char *const *srcs, size_t n) {
    char proc[PATH_MAX], stash[PATH_MAX], real[PATH_MAX];
    /* The new /proc covers the real one, which then moves from its stash into it. */
    if (join(proc, sizeof proc, root, "proc") != 0 || join(stash, sizeof stash, root, "dev/.mokka-proc") != 0 ||
        join(real, sizeof real, proc, ".real") != 0)
        return fail("%s: path too long", root);
    if (cover(proc, stash, "mokka-proc") != 0)
        return 1;
    if (mkdir(real, 0555) != 0)
        return fail("mkdir %s: %s", real, strerror(errno));
    if (mount(stash, real, NULL, MS_MOVE, NULL) != 0)
        return fail("move %s to %s: %s", stash, real, strerror(errno));
    rmdir(stash);
    const char *skip[MAX_FILES + 1];
    for (size_t i = 0; i < n; i++)
        skip[i] = names[i];
    skip[n] = NULL;
    if (add_entries(real, proc, skip) != 0)
        return 1;
    for (size_t i = 0; i < n; i++) {
        char target[PATH_MAX];
        if (join(target, sizeof target, proc, names[i]) != 0)
            return fail("%s: path too long", proc);
        if (write_file(target, srcs[i]) != 0)
            return 1;
    }
    return seal(proc);
}

/* The container's /proc/driver becomes a tmpfs of its real entries and the staged ones. */
static int driver_view(const char *root, const char *staged) {
    char driver[PATH_MAX], stash[PATH_MAX];
    if (join(driver, sizeof driver, root, "proc/driver") != 0 ||
        join(stash, sizeof stash, root, "dev/.mokka-proc-driver") != 0)
        return fail("%s: path too long", root);
    if (cover(driver, stash, "mokka-proc-driver") != 0)
        return 1;
    /* The staged entries first: a real one of the same name (none on a CPU node) stays hidden. */
    DIR *d = opendir(staged);
    if (!d)
        return fail("%s: %s", staged, strerror(errno));
    const char *names[64];
    size_t n = 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        if (n + 1 >= sizeof names / sizeof names[0])
            rc = fail("%s: too many entries", staged);
        else if ((names[n] = strdup(e->d_name)) == NULL)
            rc = fail("out of memory");
        else
            rc = add_entry(staged, driver, names[n++]);
    }
    closedir(d);
    names[n] = NULL;
    if (rc == 0)
        rc = add_entries(stash, driver, names);
    for (size_t i = 0; i < n; i++)
        free((void *)names[i]);
    if (rc != 0)
        return rc;
    if (umount2(stash, MNT_DETACH) != 0)
        return fail("umount %s: %s", stash, strerror(errno));
    rmdir(stash);
    return seal(driver);
}

static int usage(void) {
    fprintf(stderr, "usage: mokka-proc-hook --driver DIR [--proc NAME=FILE ...] [--bind DIR=PATH ...] "
                    "[--link PATH=TARGET ...]  (an OCI createContainer hook: the state on stdin)\n");
    return 2;
}

/* NAME=VALUE split at its first '=' into two new strings; 0 when either side is empty. */
static int split_pair(const char *arg, char **name, char **value) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return 0;
    *name = strndup(arg, (size_t)(eq - arg));
    *value = strdup(eq + 1);
    return *name && *value;
}

int main(int argc, char **argv) {
    const char *driver = NULL;
    char *names[MAX_FILES], *srcs[MAX_FILES], *bind_from[MAX_FILES], *bind_to[MAX_FILES];
    char *link_path[MAX_FILES], *link_target[MAX_FILES];
    size_t n = 0, binds = 0, links = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc)
            return usage();
        const char *opt = argv[i], *arg = argv[i + 1];
        if (strcmp(opt, "--driver") == 0) {
            driver = arg;
        } else if (strcmp(opt, "--proc") == 0 && n < MAX_FILES) {
            if (!split_pair(arg, &names[n], &srcs[n]) || strchr(names[n], '/'))
                return usage();
            n++;
        } else if (strcmp(opt, "--bind") == 0 && binds < MAX_FILES) {
            if (!split_pair(arg, &bind_from[binds], &bind_to[binds]) || bind_to[binds][0] != '/')
                return usage();
            binds++;
        } else if (strcmp(opt, "--link") == 0 && links < MAX_FILES) {
            if (!split_pair(arg, &link_path[links], &link_target[links]) || link_path[links][0] != '/')
                return usage();
            links++;
        } else {
            return usage();
        }
    }
    if (!driver)
        return usage();
    char root[PATH_MAX];
    if (container_root(root, sizeof root) != 0)
        return 1;
    if (binds || links) {
        int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0)
            return fail("%s: %s", root, strerror(errno));
        for (size_t i = 0; i < binds; i++)
            if (bind_dir(rootfd, bind_from[i], bind_to[i]) != 0)
                return 1;
        for (size_t i = 0; i < links; i++)
            if (make_link(rootfd, link_path[i], link_target[i]) != 0)
                return 1;
        close(rootfd);
    }
    if (n && replace_proc(root, (const char *const *)names, (const char *const *)srcs, n) != 0)
        return 1;
    return driver_view(root, driver);
}
