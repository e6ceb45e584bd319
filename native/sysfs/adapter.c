/* An InfiniBand adapter's staged files: see adapter.h. */
#define _GNU_SOURCE
#include "adapter.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

int adapter_text(const char *ca, const char *rel, char *buf, size_t size) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/%s", ca, rel);
    return shim_read(path, buf, size);
}

uint64_t adapter_num(const char *ca, const char *rel) {
    char buf[128];
    return adapter_text(ca, rel, buf, sizeof buf) < 0 ? 0 : strtoull(buf, NULL, 0);
}

uint64_t adapter_port_num(const char *ca, int port, const char *file) {
    char rel[128];
    snprintf(rel, sizeof rel, "ports/%d/%s", port, file);
    return adapter_num(ca, rel);
}

uint64_t guid_parse(const char *s) {
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s == ':')
            continue;
        int c = *s | 0x20, d = (*s >= '0' && *s <= '9') ? *s - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0)
            break;
        v = v << 4 | (uint64_t)d;
    }
    return v;
}

uint64_t adapter_guid(const char *ca, const char *rel) {
    char buf[128];
    return adapter_text(ca, rel, buf, sizeof buf) < 0 ? 0 : guid_parse(buf);
}

uint64_t adapter_port_guid(const char *ca, int port) {
    char rel[64], buf[128];
    snprintf(rel, sizeof rel, "ports/%d/gids/0", port);
    return adapter_text(ca, rel, buf, sizeof buf) < 20 ? 0 : guid_parse(buf + 20);
}

int adapter_ports(const char *ca) {
    int n = 0;
    char rel[64], buf[64];
    for (int i = 1; i <= 8; i++) {
        snprintf(rel, sizeof rel, "ports/%d/state", i);
        if (adapter_text(ca, rel, buf, sizeof buf) >= 0)
            n = i;
    }
    return n;
}

int adapter_port_up(const char *ca, int port) { return adapter_port_num(ca, port, "state") == 4; }

struct ib_rate rate_parse(const char *text) {
    struct ib_rate r = {0, SPEED_UNKNOWN};
    const char *w = strchr(text, '(');
    if (w == NULL)
        return r;
    static const struct { const char *text; unsigned code; } widths[] = {
        {"(1X ", 1}, {"(2X ", 16}, {"(4X ", 2}, {"(8X ", 4}, {"(12X ", 8},
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (strncmp(w, widths[i].text, strlen(widths[i].text)) == 0)
            r.width = widths[i].code;
    static const struct { const char *text; enum ib_speed speed; } speeds[] = {
        {" SDR)", SPEED_SDR}, {" DDR)", SPEED_DDR}, {" QDR)", SPEED_QDR}, {" FDR10)", SPEED_FDR10},
        {" FDR)", SPEED_FDR}, {" EDR)", SPEED_EDR}, {" HDR)", SPEED_HDR}, {" NDR)", SPEED_NDR},
        {" XDR)", SPEED_XDR},
    };
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++)
        if (strstr(w, speeds[i].text) != NULL)
            r.speed = speeds[i].speed;
    return r;
}

struct ib_rate adapter_rate(const char *ca, int port) {
    char rel[64], buf[128];
    snprintf(rel, sizeof rel, "ports/%d/rate", port);
    if (adapter_text(ca, rel, buf, sizeof buf) < 0)
        return (struct ib_rate){0, SPEED_UNKNOWN};
    return rate_parse(buf);
}
