/*
 * MADs between processes, through the subnet's relay directory (relay.h).
 *
 * A server agent (ibping -S) on the port whose LID is L, registered for class C, listens on the
 * SOCK_SEQPACKET socket "<L>.<C>" there. A request to (L, C) from any process that shares the
 * directory (another container, another node of the cluster) connects to it and sends the
 * struct ib_user_mad with its MAD, the header's LID the requester's; the server's process gets it
 * on its umad device, answers with a response method and the same transaction ID, and that
 * answer goes back on the requester's connection. Nobody listening, or no answer in time: no
 * answer, and the requesting tool times out as towards a node that does not run the server.
 *
 * Socket paths go through /proc/self/fd/<directory> so that a deep relay directory still fits a
 * socket address (108 bytes).
 */
#define _GNU_SOURCE
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/ib_user_mad.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

enum {
    PENDING = 32,           /* requests a server's process may hold unanswered at once */
    QP1_QKEY = 0x80010000,  /* the GSI's well-known Q_Key */
    TID_OFFSET = 8,         /* a MAD's transaction ID */
    REQUEST_WAIT_MS = 5000, /* a connection that sends nothing is dropped */
};

/* ---- where ------------------------------------------------------------------------------ */

/* The relay directory, opened O_PATH (the caller closes it), or -1. */
static int relay_dir(void) {
    const char *root = shim_root();
    if (root == NULL) {
        errno = ENOENT;
        return -1;
    }
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/ib-relay", root) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

static void address(struct sockaddr_un *sa, int dir, unsigned lid, uint8_t cls) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    snprintf(sa->sun_path, sizeof sa->sun_path, "/proc/self/fd/%d/%u.%02x", dir, lid, cls);
}

static uint64_t tid_of(const uint8_t *msg) {
    uint64_t tid;
    memcpy(&tid, msg + sizeof(struct ib_user_mad) + TID_OFFSET, sizeof tid);
    return tid;
}

/* ---- the server's side ------------------------------------------------------------------ */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t tid;
    int conn; /* -1: free */
} g_pending[PENDING] = {[0 ... PENDING - 1] = {0, -1}};

static void hold(uint64_t tid, int conn) {
    static int evict; /* all held: the slots give way in turn, and that request goes unanswered */
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    for (int i = 0; i < PENDING && slot < 0; i++)
        if (g_pending[i].conn < 0)
            slot = i;
    if (slot < 0) {
        slot = evict;
        evict = (evict + 1) % PENDING;
        close(g_pending[slot].conn);
    }
    g_pending[slot].tid = tid;
    g_pending[slot].conn = conn;
    pthread_mutex_unlock(&g_lock);
}

int relay_respond(const uint8_t *msg, size_t len) {
    uint64_t tid = tid_of(msg);
    int conn = -1;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < PENDING; i++)
        if (g_pending[i].conn >= 0 && g_pending[i].tid == tid) {
            conn = g_pending[i].conn;
            g_pending[i].conn = -1;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    if (conn < 0)
        return 0;
    (void)send(conn, msg, len, MSG_NOSIGNAL);
    close(conn);
    return 1;
}

struct server {
    int listener, app;
    uint32_t agent;
};

/* One request from a fresh connection, handed to the server's process; the connection is held
 * until its answer (relay_respond). */
static void take(struct server *s, int conn) {
    uint8_t msg[sizeof(struct ib_user_mad) + 256];
    struct pollfd p = {conn, POLLIN, 0};
    if (poll(&p, 1, REQUEST_WAIT_MS) != 1 || recv(conn, msg, sizeof msg, 0) != (ssize_t)sizeof msg) {
        close(conn);
        return;
    }
    struct ib_user_mad *um = (struct ib_user_mad *)msg;
    um->hdr.id = s->agent;
    um->hdr.status = 0;
    um->hdr.qpn = htonl(1);
    um->hdr.qkey = htonl(QP1_QKEY);
    hold(tid_of(msg), conn);
    (void)send(s->app, msg, sizeof msg, MSG_NOSIGNAL);
}

static void *listen_loop(void *arg) {
    struct server *s = arg;
    for (;;) {
        struct pollfd p[2] = {{s->listener, POLLIN, 0}, {s->app, 0, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents & (POLLHUP | POLLERR | POLLNVAL))
            break; /* the process closed its umad device */
        if (p[0].revents & POLLIN) {
            int conn = accept4(s->listener, NULL, NULL, SOCK_CLOEXEC);
            if (conn >= 0)
                take(s, conn);
        }
    }
    close(s->listener);
    close(s->app);
    free(s);
    return NULL;
}

int relay_serve(int app, unsigned lid, uint8_t cls, uint32_t agent) {
    int dir = relay_dir();
    if (dir < 0)
        return -1;
    struct sockaddr_un sa;
    address(&sa, dir, lid, cls);
    int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct server *s = malloc(sizeof *s);
    int dup_app = fcntl(app, F_DUPFD_CLOEXEC, 0);
    int ok = listener >= 0 && s != NULL && dup_app >= 0;
    if (ok) {
        unlink(sa.sun_path); /* a server that ended without removing it: this one serves now */
        ok = bind(listener, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(listener, 16) == 0;
        /* any process given an adapter may ask, whoever it runs as (connecting needs write access) */
        ok = ok && chmod(sa.sun_path, 0777) == 0;
    }
    int saved = errno;
    close(dir);
    if (ok) {
        s->listener = listener, s->app = dup_app, s->agent = agent;
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        saved = pthread_create(&t, &attr, listen_loop, s);
        pthread_attr_destroy(&attr);
        ok = saved == 0;
    }
    if (!ok) {
        if (listener >= 0)
            close(listener);
        if (dup_app >= 0)
            close(dup_app);
        free(s);
        errno = saved;
        return -1;
    }
    return 0;
}

/* ---- the requester's side --------------------------------------------------------------- */

int relay_request(uint8_t *msg, size_t len, unsigned slid, unsigned dlid, uint8_t cls, int timeout_ms) {
    int dir = relay_dir();
    if (dir < 0)
        return 0;
    struct sockaddr_un sa;
    address(&sa, dir, dlid, cls);
    int conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    int ok = conn >= 0 && connect(conn, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(dir);
    struct ib_user_mad *um = (struct ib_user_mad *)msg;
    uint32_t agent = um->hdr.id;
    uint64_t tid = tid_of(msg);
    if (ok) {
        um->hdr.lid = htons((uint16_t)slid);
        ok = send(conn, msg, len, MSG_NOSIGNAL) == (ssize_t)len;
    }
    if (ok) {
        struct pollfd p = {conn, POLLIN, 0};
        ok = poll(&p, 1, timeout_ms) == 1 && recv(conn, msg, len, 0) == (ssize_t)len && tid_of(msg) == tid;
    }
    if (conn >= 0)
        close(conn);
    if (!ok)
        return 0;
    um->hdr.id = agent;
    um->hdr.status = 0;
    um->hdr.lid = htons((uint16_t)dlid);
    return 1;
}
