/* Mock nvidia-imex: the IMEX daemon of a node in an NVLink domain, as far as what watches it can
 * tell. It reads the configuration NVIDIA's daemon is given (see imex_config.h) and the node list
 * (IMEX_NODE_CONFIG_FILE: one address or host name per line), keeps a TCP connection with every
 * other node of the list on SERVER_PORT, sending a heartbeat line each second, and answers
 * nvidia-imex-ctl on IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT.
 *
 *   this node   the first listed address that is local and whose SERVER_PORT it can bind
 *   a peer      connected while its heartbeats arrive (3 s of silence: lost) and ours reach it
 *   READY       every other listed node that resolves is connected (a name that does not resolve
 *               yet is not a member); NOT_READY otherwise
 *
 * Names are resolved again every 2 s and the node list is re-read on SIGUSR1, as NVIDIA's daemon
 * does when the compute-domain daemon rewrites /etc/hosts and the list. It stays in the
 * foreground and logs to stdout; SIGTERM ends it. No memory is exported: only the contracts of
 * readiness and liveness. */
#define _GNU_SOURCE
#include "imex_config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PEERS 128
#define MAX_CONNS 256
#define HEARTBEAT_S 1.0
#define SILENCE_S 3.0
#define RESOLVE_S 2.0

struct peer {
    char name[256];
    int resolved;
    struct in_addr addr;
    int out_fd;      /* our connection to it: -1 none */
    int out_up;      /* connect() finished */
    double last_try, last_sent, last_heard;
    int was_connected;
};

struct conn {
    int fd;
    int cmd; /* 1: nvidia-imex-ctl, 0: a peer's heartbeats */
    char buf[512];
    size_t len;
};

static struct imex_config cfg;
static struct peer peers[MAX_PEERS];
static int npeers;
static int self = -1;
static int listen_fd = -1, cmd_fd = -1;
static struct conn conns[MAX_CONNS];
static int nconns;
static volatile sig_atomic_t reload, stop;
static int was_ready = -1;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void say(const char *fmt, ...)
{
    char when[32];
    time_t t = time(NULL);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", gmtime(&t));
    printf("[%s] nvidia-imex (mock): ", when);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        reload = 1;
    else
        stop = 1;
}

static void close_out(struct peer *p)
{
    if (p->out_fd >= 0)
        close(p->out_fd);
    p->out_fd = -1;
    p->out_up = 0;
}

static int connected(const struct peer *p, double t)
{
    return p->out_up && p->last_heard > 0 && t - p->last_heard < SILENCE_S;
}

static int domain_ready(double t)
{
    if (self < 0)
        return 0;
    for (int i = 0; i < npeers; i++)
        if (i != self && peers[i].resolved && !connected(&peers[i], t))
            return 0;
    return 1;
}

static int resolve(const char *name, struct in_addr *out)
{
    if (inet_pton(AF_INET, name, out) == 1)
        return 1;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(name, NULL, &hints, &res) != 0 || res == NULL)
        return 0;
    *out = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 1;
}

/* Re-read the node list (keeping what is known of nodes that stay) and resolve every name. */
static void load_nodes(void)
{
    FILE *f = fopen(cfg.nodes_file, "r");
    if (f == NULL) {
        say("cannot read the node list %s: %s", cfg.nodes_file, strerror(errno));
        return;
    }
    struct peer fresh[MAX_PEERS];
    int n = 0;
    char line[512];
    while (n < MAX_PEERS && fgets(line, sizeof(line), f) != NULL) {
        char *p = line, *e;
        while (isspace((unsigned char)*p))
            p++;
        for (e = p; *e && !isspace((unsigned char)*e) && *e != '#';)
            e++;
        *e = '\0';
        if (*p == '\0')
            continue;
        memset(&fresh[n], 0, sizeof(fresh[n]));
        snprintf(fresh[n].name, sizeof(fresh[n].name), "%.255s", p);
        fresh[n].out_fd = -1;
        fresh[n].resolved = resolve(p, &fresh[n].addr);
        n++;
    }
    fclose(f);
    int new_self = -1;
    for (int i = 0; i < n; i++) {
        int kept = 0;
        for (int j = 0; j < npeers; j++) {
            if (strcmp(peers[j].name, fresh[i].name) != 0 || peers[j].resolved != fresh[i].resolved ||
                peers[j].addr.s_addr != fresh[i].addr.s_addr)
                continue;
            struct in_addr a = fresh[i].addr;
            fresh[i] = peers[j];
            fresh[i].addr = a;
            peers[j].out_fd = -1; /* moved */
            if (j == self)
                new_self = i;
            kept = 1;
            break;
        }
        if (!kept && self >= 0 && fresh[i].resolved && fresh[i].addr.s_addr == peers[self].addr.s_addr)
            new_self = i;
    }
    for (int j = 0; j < npeers; j++)
        close_out(&peers[j]);
    memcpy(peers, fresh, sizeof(struct peer) * n);
    npeers = n;
    self = new_self;
}

static int listen_on(struct in_addr addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 64) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* This node: the first listed address it can listen on (a pod's own address; on one machine,
 * the first free one of several local addresses). */
static void find_self(void)
{
    if (self >= 0 && listen_fd >= 0)
        return;
    for (int i = 0; i < npeers; i++) {
        if (!peers[i].resolved)
            continue;
        int fd = listen_on(peers[i].addr, cfg.server_port);
        if (fd < 0)
            continue;
        if (listen_fd >= 0)
            close(listen_fd);
        listen_fd = fd;
        self = i;
        say("this node is #%d %s (%s), listening on port %d; %d node(s) listed in %s", i, peers[i].name,
            inet_ntoa(peers[i].addr), cfg.server_port, npeers, cfg.nodes_file);
        return;
    }
}

static void try_connect(struct peer *p, double t)
{
    p->last_try = t;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct sockaddr_in local = {.sin_family = AF_INET, .sin_addr = peers[self].addr};
    bind(fd, (struct sockaddr *)&local, sizeof(local)); /* heartbeats come from this node's address */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(cfg.server_port), .sin_addr = p->addr};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) {
        close(fd);
        return;
    }
    p->out_fd = fd;
    p->out_up = 0;
}

static void heartbeat(struct peer *p, double t)
{
    char line[64];
    int n = snprintf(line, sizeof(line), "HB %s\n", inet_ntoa(peers[self].addr));
    if (send(p->out_fd, line, n, MSG_NOSIGNAL | MSG_DONTWAIT) != n)
        close_out(p);
    else
        p->last_sent = t;
}

static void add_conn(int fd, int cmd)
{
    if (nconns == MAX_CONNS) {
        close(fd);
        return;
    }
    conns[nconns++] = (struct conn){.fd = fd, .cmd = cmd};
}

static void drop_conn(int i)
{
    close(conns[i].fd);
    conns[i] = conns[--nconns];
}

static void answer(int fd, const char *request, double t)
{
    char out[8192];
    size_t n = 0;
    if (strncmp(request, "QUERY", 5) == 0) {
        n = snprintf(out, sizeof(out), "%s\n", domain_ready(t) ? "READY" : "NOT_READY");
    } else if (strncmp(request, "NODES", 5) == 0) {
        n = snprintf(out, sizeof(out), "Nodes:\n");
        for (int i = 0; i < npeers && n < sizeof(out) - 256; i++) {
            const char *what = i == self                    ? "READY (this node)"
                               : !peers[i].resolved         ? "UNRESOLVED"
                               : connected(&peers[i], t)    ? "READY"
                               : peers[i].was_connected     ? "UNAVAILABLE (connection lost)"
                                                            : "UNAVAILABLE (never connected)";
            n += snprintf(out + n, sizeof(out) - n, "Node #%d - %s - %s - %s\n", i, peers[i].name,
                          peers[i].resolved ? inet_ntoa(peers[i].addr) : "-", what);
        }
        n += snprintf(out + n, sizeof(out) - n, "Domain State: %s\n", domain_ready(t) ? "UP" : "DEGRADED");
    } else {
        n = snprintf(out, sizeof(out), "ERROR unknown request\n");
    }
    if (send(fd, out, n, MSG_NOSIGNAL) < 0)
        return;
}

static void read_conn(int i, double t)
{
    struct conn *c = &conns[i];
    ssize_t got = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, MSG_DONTWAIT);
    if (got <= 0) {
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        drop_conn(i);
        return;
    }
    c->len += got;
    c->buf[c->len] = '\0';
    char *nl;
    while ((nl = strchr(c->buf, '\n')) != NULL) {
        *nl = '\0';
        if (c->cmd) {
            answer(c->fd, c->buf, t);
            drop_conn(i);
            return;
        }
        struct in_addr from;
        if (strncmp(c->buf, "HB ", 3) == 0 && inet_pton(AF_INET, c->buf + 3, &from) == 1)
            for (int p = 0; p < npeers; p++)
                if (p != self && peers[p].resolved && peers[p].addr.s_addr == from.s_addr)
                    peers[p].last_heard = t;
        size_t rest = c->len - (nl + 1 - c->buf);
        memmove(c->buf, nl + 1, rest + 1);
        c->len = rest;
    }
    if (c->len == sizeof(c->buf) - 1)
        drop_conn(i);
}

static void report(double t)
{
    for (int i = 0; i < npeers; i++) {
        if (i == self || !peers[i].resolved)
            continue;
        int up = connected(&peers[i], t);
        if (up && peers[i].was_connected != 1)
            say("node #%d %s (%s) connected", i, peers[i].name, inet_ntoa(peers[i].addr));
        else if (!up && peers[i].was_connected == 1)
            say("node #%d %s (%s) lost: its connection closed or %.0f s passed without a heartbeat", i,
                peers[i].name, inet_ntoa(peers[i].addr), SILENCE_S);
        if (up)
            peers[i].was_connected = 1;
        else if (peers[i].was_connected == 1)
            peers[i].was_connected = 2;
    }
    int ready = domain_ready(t);
    if (ready != was_ready)
        say("domain %s", ready ? "READY: every node connected" : "NOT_READY");
    was_ready = ready;
}

int main(int argc, char **argv)
{
    const char *path = IMEX_DEFAULT_CONFIG;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: nvidia-imex [-c CONFIG]   (Mokka's mock IMEX daemon; default %s)\n", IMEX_DEFAULT_CONFIG);
            return 0;
        } else {
            fprintf(stderr, "nvidia-imex: unknown argument %s (usage: nvidia-imex [-c CONFIG])\n", argv[i]);
            return 2;
        }
    }
    if (imex_config_read(path, &cfg) != 0) {
        fprintf(stderr, "nvidia-imex: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (cfg.cmd_enabled) {
        struct in_addr ip;
        if (inet_pton(AF_INET, cfg.cmd_ip, &ip) != 1 || (cmd_fd = listen_on(ip, cfg.cmd_port)) < 0) {
            fprintf(stderr, "nvidia-imex: %s: cannot listen on IMEX_CMD_BIND_INTERFACE_IP %s port %d: %s\n", path,
                    cfg.cmd_ip, cfg.cmd_port, strerror(errno));
            return 1;
        }
    }
    say("started with %s; commands on %s:%d", path, cfg.cmd_ip, cfg.cmd_port);
    double last_resolve = -1e9;
    while (!stop) {
        double t = now();
        if (reload || t - last_resolve >= RESOLVE_S) {
            if (reload)
                say("SIGUSR1: reading %s again", cfg.nodes_file);
            reload = 0;
            last_resolve = t;
            load_nodes();
            if (self < 0 && listen_fd >= 0) {
                close(listen_fd); /* this node left the list */
                listen_fd = -1;
            }
            find_self();
        }
        struct pollfd fds[2 + MAX_PEERS + MAX_CONNS];
        int kind[2 + MAX_PEERS + MAX_CONNS], nfds = 0;
        if (listen_fd >= 0)
            fds[nfds] = (struct pollfd){listen_fd, POLLIN, 0}, kind[nfds++] = -1;
        if (cmd_fd >= 0)
            fds[nfds] = (struct pollfd){cmd_fd, POLLIN, 0}, kind[nfds++] = -2;
        for (int i = 0; self >= 0 && i < npeers; i++) {
            struct peer *p = &peers[i];
            if (i == self || !p->resolved)
                continue;
            if (p->out_fd < 0 && t - p->last_try >= HEARTBEAT_S)
                try_connect(p, t);
            if (p->out_fd >= 0 && p->out_up && t - p->last_sent >= HEARTBEAT_S)
                heartbeat(p, t);
            if (p->out_fd >= 0)
                fds[nfds] = (struct pollfd){p->out_fd, p->out_up ? POLLIN : POLLOUT, 0}, kind[nfds++] = 1000 + i;
        }
        for (int i = 0; i < nconns; i++)
            fds[nfds] = (struct pollfd){conns[i].fd, POLLIN, 0}, kind[nfds++] = i;
        int n = poll(fds, nfds, 200);
        t = now();
        for (int f = nfds - 1; n > 0 && f >= 0; f--) { /* backwards: drop_conn moves the last conn */
            if (!fds[f].revents)
                continue;
            if (kind[f] < 0) {
                int fd = accept4(fds[f].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0)
                    add_conn(fd, kind[f] == -2);
            } else if (kind[f] >= 1000) {
                struct peer *p = &peers[kind[f] - 1000];
                if (!p->out_up) {
                    int err = 0;
                    socklen_t len = sizeof(err);
                    getsockopt(p->out_fd, SOL_SOCKET, SO_ERROR, &err, &len);
                    if (err)
                        close_out(p);
                    else {
                        p->out_up = 1;
                        heartbeat(p, t);
                    }
                } else {
                    char sink[256];
                    if (recv(p->out_fd, sink, sizeof(sink), MSG_DONTWAIT) == 0)
                        close_out(p); /* the peer went away */
                }
            } else if (kind[f] < nconns) {
                read_conn(kind[f], t);
            }
        }
        report(t);
    }
    say("stopping");
    return 0;
}
