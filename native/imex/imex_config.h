/* The IMEX daemon's configuration file, as NVIDIA's nvidia-imex and nvidia-imex-ctl read it:
 * KEY=VALUE lines, '#' comments. The mock tools read the keys below; others are ignored. */
#ifndef MOKKA_IMEX_CONFIG_H
#define MOKKA_IMEX_CONFIG_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IMEX_DEFAULT_CONFIG "/etc/nvidia-imex/config.cfg"

struct imex_config {
    int server_port;          /* SERVER_PORT: peers connect to each other here */
    int cmd_port;             /* IMEX_CMD_PORT: nvidia-imex-ctl asks the daemon here */
    int cmd_enabled;          /* IMEX_CMD_ENABLED */
    char cmd_ip[64];          /* IMEX_CMD_BIND_INTERFACE_IP */
    char nodes_file[512];     /* IMEX_NODE_CONFIG_FILE: one peer (address or name) per line */
};

/* 0 on success; -1 when the file cannot be read (errno set). */
static inline int imex_config_read(const char *path, struct imex_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->server_port = 50000;
    cfg->cmd_port = 50005;
    cfg->cmd_enabled = 1;
    snprintf(cfg->cmd_ip, sizeof(cfg->cmd_ip), "127.0.0.1");
    snprintf(cfg->nodes_file, sizeof(cfg->nodes_file), "/etc/nvidia-imex/nodes_config.cfg");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[1024];
    while (fgets(line, sizeof(line), f) != NULL) {
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '#' || *p == '\0')
            continue;
        char *eq = strchr(p, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        char *key = p, *value = eq + 1;
        for (char *e = key + strlen(key); e > key && isspace((unsigned char)e[-1]);)
            *--e = '\0';
        while (isspace((unsigned char)*value))
            value++;
        for (char *e = value + strlen(value); e > value && isspace((unsigned char)e[-1]);)
            *--e = '\0';
        if (strcmp(key, "SERVER_PORT") == 0)
            cfg->server_port = atoi(value);
        else if (strcmp(key, "IMEX_CMD_PORT") == 0)
            cfg->cmd_port = atoi(value);
        else if (strcmp(key, "IMEX_CMD_ENABLED") == 0)
            cfg->cmd_enabled = atoi(value);
        else if (strcmp(key, "IMEX_CMD_BIND_INTERFACE_IP") == 0 && *value)
            snprintf(cfg->cmd_ip, sizeof(cfg->cmd_ip), "%s", value);
        else if (strcmp(key, "IMEX_NODE_CONFIG_FILE") == 0 && *value)
            snprintf(cfg->nodes_file, sizeof(cfg->nodes_file), "%s", value);
    }
    fclose(f);
    return 0;
}

#endif
