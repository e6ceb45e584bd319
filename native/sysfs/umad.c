/*
 * The kernel's umad device (ib_umad) for the MAD tools of infiniband-diags (perfquery, smpquery,
 * ibaddr, sminfo, ibnetdiscover, iblinkinfo): libibumad, libibmad and libibnetdisc run unmodified;
 * only the device file is answered.
 *
 * /dev/infiniband/umadN opens as one end of a SOCK_SEQPACKET socket pair, whose other end a
 * responder thread holds. libibumad's write() of a struct ib_user_mad (header + MAD) reaches the
 * responder as one message; the answer (mad.c) comes back as one message, which read() and poll()
 * see as they see the kernel's. The ioctls ib_umad takes (agent registration, P_Key index mode)
 * are answered for these descriptors alone; every other descriptor goes to the next ioctl().
 *
 * A class the port's agents and the subnet do not answer (mad.c) is another process's: an agent
 * registered with methods to serve (ibping -S) gets the requests other processes send to its
 * port's LID, and its responses go back to them; a request of such a class goes to the process
 * that serves it (relay.c).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <rdma/ib_user_mad.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "adapter.h"
#include "mad.h"
#include "relay.h"
#include "shim.h"

enum { FDS = 4096 }; /* descriptors tracked; a umad device opened above this is not answered */

static unsigned char g_fds[FDS / 8];

static int tracked(int fd) {
    return fd >= 0 && fd < FDS && (__atomic_load_n(&g_fds[fd / 8], __ATOMIC_ACQUIRE) >> (fd % 8)) & 1;
}

static void track(int fd, int on) {
    if (fd < 0 || fd >= FDS)
        return;
    unsigned char bit = (unsigned char)(1u << (fd % 8));
    if (on)
        __atomic_fetch_or(&g_fds[fd / 8], bit, __ATOMIC_ACQ_REL);
    else
        __atomic_fetch_and(&g_fds[fd / 8], (unsigned char)~bit, __ATOMIC_ACQ_REL);
}

/* ---- the responder ---------------------------------------------------------------------- */

enum {
    CLASS_SMI = 0x01,
    CLASS_SMI_DIRECT = 0x81,
    CLASS_PERF = 0x04,
    METHOD_RESPONSE = 0x80, /* the response bit of a MAD's method */
    RELAY_MIN_MS = 100,
    RELAY_MAX_MS = 10000,
};

struct responder {
    int fd;
    char ca[64]; /* the adapter and port this umad device is */
    int port;
};

static struct responder *g_responders[FDS]; /* by the program's descriptor, while it is open */

/* How long a relayed request may wait: what the program asked of the kernel (its timeout, each
 * retry), within bounds. */
static int relay_wait(const struct ib_user_mad *um) {
    long ms = (long)um->hdr.timeout_ms * (long)(um->hdr.retries + 1);
    return ms < RELAY_MIN_MS ? RELAY_MIN_MS : ms > RELAY_MAX_MS ? RELAY_MAX_MS : (int)ms;
}

static void *serve(void *arg) {
    struct responder *r = arg;
    uint8_t msg[sizeof(struct ib_user_mad) + MAD_SIZE];
    for (;;) {
        ssize_t n = recv(r->fd, msg, sizeof msg, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            break;
        if (n < (ssize_t)sizeof msg)
            continue;
        struct ib_user_mad *um = (struct ib_user_mad *)msg;
        uint8_t *mad = msg + sizeof(struct ib_user_mad);
        uint8_t cls = mad[1];
        if (mad[3] & METHOD_RESPONSE) { /* a served request's answer */
            relay_respond(msg, sizeof msg);
            continue;
        }
        unsigned lid = (unsigned)adapter_port_num(r->ca, r->port, "lid"), dlid = ntohs(um->hdr.lid);
        if (mad_answer(r->ca, r->port, mad, (uint16_t)dlid)) {
            um->hdr.status = 0;
            um->hdr.lid = htons((uint16_t)lid);
        } else if (cls == CLASS_SMI || cls == CLASS_SMI_DIRECT || cls == CLASS_PERF ||
                   !relay_request(msg, sizeof msg, lid, dlid, cls, relay_wait(um))) {
            continue; /* nobody answers: the program times out */
        }
        um->hdr.length = (uint32_t)sizeof msg;
        if (send(r->fd, msg, sizeof msg, MSG_NOSIGNAL) < 0)
            break;
    }
    close(r->fd);
    free(r);
    return NULL;
}

int umad_open(const char *path, int flags) {
    static const char prefix[] = "/dev/infiniband/umad";
    if (path == NULL || strncmp(path, prefix, sizeof prefix - 1) != 0 || !shim_enabled())
        return -2;
    const char *num = path + sizeof prefix - 1;
    char *end;
    long index = strtol(num, &end, 10);
    if (end == num || *end != '\0' || index < 0)
        return -2;
    /* The device node as the program sees it (staged, or passed to a container): none, no device. */
    if (access(path, F_OK) != 0)
        return -2;
    char rel[PATH_MAX], ca[64], buf[64];
    snprintf(rel, sizeof rel, "/sys/class/infiniband_mad/umad%ld/ibdev", index);
    if (shim_read(rel, ca, sizeof ca) <= 0)
        return -2; /* not a staged device: the real one (or ENOENT) */
    snprintf(rel, sizeof rel, "/sys/class/infiniband_mad/umad%ld/port", index);
    if (shim_read(rel, buf, sizeof buf) <= 0)
        return -2;
    struct responder *r = malloc(sizeof *r);
    if (r == NULL) {
        errno = ENOMEM;
        return -1;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        free(r);
        return -1;
    }
    if (sv[0] >= FDS) {
        close(sv[0]), close(sv[1]), free(r);
        errno = EMFILE;
        return -1;
    }
    if (!(flags & O_CLOEXEC))
        fcntl(sv[0], F_SETFD, 0);
    if (flags & O_NONBLOCK)
        fcntl(sv[0], F_SETFL, O_NONBLOCK);
    r->fd = sv[1];
    snprintf(r->ca, sizeof r->ca, "%s", ca);
    r->port = atoi(buf);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, serve, r);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        close(sv[0]), close(sv[1]), free(r);
        errno = err;
        return -1;
    }
    __atomic_store_n(&g_responders[sv[0]], r, __ATOMIC_RELEASE);
    track(sv[0], 1);
    return sv[0];
}

/* An agent registered on `fd` with methods to serve (a bit of `methods` set): it serves its
 * class on the port's LID for other processes. */
static void registered(int fd, uint32_t agent, uint8_t cls, const void *methods, size_t size) {
    static const uint8_t none[16];
    struct responder *r = __atomic_load_n(&g_responders[fd], __ATOMIC_ACQUIRE);
    if (r == NULL || memcmp(methods, none, size) == 0 || cls == CLASS_SMI || cls == CLASS_SMI_DIRECT ||
        cls == CLASS_PERF)
        return;
    (void)relay_serve(r->fd, (unsigned)adapter_port_num(r->ca, r->port, "lid"), cls, agent);
}

/* ---- ib_umad's ioctls, and forgetting a closed descriptor -------------------------------- */

HOOK int ioctl(int fd, unsigned long request, ...) {
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (!tracked(fd))
        return CALL(ioctl, -1, fd, request, arg);
    static uint32_t next_agent;
    switch (request) {
    case IB_USER_MAD_REGISTER_AGENT: {
        struct ib_user_mad_reg_req *req = arg;
        req->id = __atomic_fetch_add(&next_agent, 1, __ATOMIC_RELAXED);
        registered(fd, req->id, req->mgmt_class, req->method_mask, sizeof req->method_mask);
        return 0;
    }
    case IB_USER_MAD_REGISTER_AGENT2: {
        struct ib_user_mad_reg_req2 *req = arg;
        req->id = __atomic_fetch_add(&next_agent, 1, __ATOMIC_RELAXED);
        registered(fd, req->id, req->mgmt_class, req->method_mask, sizeof req->method_mask);
        return 0;
    }
    case IB_USER_MAD_UNREGISTER_AGENT:
    case IB_USER_MAD_ENABLE_PKEY:
        return 0;
    default:
        errno = ENOTTY;
        return -1;
    }
}

HOOK int close(int fd) {
    if (tracked(fd)) {
        __atomic_store_n(&g_responders[fd], NULL, __ATOMIC_RELEASE);
        track(fd, 0);
    }
    return CALL(close, -1, fd);
}
