/* Mock nvidia-imex-ctl: asks the node's IMEX daemon (the mock nvidia-imex) on the command address
 * of its configuration.
 *   nvidia-imex-ctl [-c CONFIG | -i IP -p PORT] -q   prints READY or NOT_READY (exit 0)
 *   nvidia-imex-ctl [-c CONFIG | -i IP -p PORT] -N   prints every node of the domain and its state
 * A daemon that cannot be reached: one line on stderr, exit 1. */
#include "imex_config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int usage(const char *why)
{
    fprintf(stderr, "nvidia-imex-ctl: %s (usage: nvidia-imex-ctl [-c CONFIG | -i IP -p PORT] -q|-N)\n", why);
    return 2;
}

int main(int argc, char **argv)
{
    const char *path = IMEX_DEFAULT_CONFIG, *ip = NULL, *request = NULL;
    int port = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc)
            ip = argv[++i];
        else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (strcmp(argv[i], "-q") == 0)
            request = "QUERY\n";
        else if (strcmp(argv[i], "-N") == 0)
            request = "NODES\n";
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: nvidia-imex-ctl [-c CONFIG | -i IP -p PORT] -q|-N   (Mokka's mock; default config %s)\n"
                   "  -q  READY when every node of the domain is connected, else NOT_READY\n"
                   "  -N  the domain's nodes and their state\n",
                   IMEX_DEFAULT_CONFIG);
            return 0;
        } else {
            char why[300];
            snprintf(why, sizeof(why), "unknown argument %s", argv[i]);
            return usage(why);
        }
    }
    if (request == NULL)
        return usage("say -q or -N");
    struct imex_config cfg;
    if (ip == NULL || port == 0) {
        if (imex_config_read(path, &cfg) != 0) {
            fprintf(stderr, "nvidia-imex-ctl: %s: %s\n", path, strerror(errno));
            return 1;
        }
        if (ip == NULL)
            ip = cfg.cmd_ip;
        if (port == 0)
            port = cfg.cmd_port;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
        return usage("the command address must be an IPv4 address");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        send(fd, request, strlen(request), MSG_NOSIGNAL) < 0) {
        fprintf(stderr, "nvidia-imex-ctl: the IMEX daemon at %s:%d does not answer: %s\n", ip, port, strerror(errno));
        return 1;
    }
    char buf[8192];
    ssize_t n;
    size_t total = 0;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
        fwrite(buf, 1, n, stdout);
        total += n;
    }
    close(fd);
    if (total == 0) {
        fprintf(stderr, "nvidia-imex-ctl: the IMEX daemon at %s:%d closed without an answer\n", ip, port);
        return 1;
    }
    return 0;
}
