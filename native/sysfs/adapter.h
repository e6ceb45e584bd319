/*
 * An InfiniBand adapter's staged files (/sys/class/infiniband/<ca>/..., read through the shim's
 * root), as the verbs (ibverbs.c) and the MAD responder (mad.c) read them.
 */
#ifndef MOKKA_ADAPTER_H
#define MOKKA_ADAPTER_H

#include <stddef.h>
#include <stdint.h>

/* The file `rel` of adapter `ca`, its trailing newline cut: the length, or -1 when missing. */
int adapter_text(const char *ca, const char *rel, char *buf, size_t size);

/* A number file (decimal, 0x hex, or "4: ACTIVE": the number before the colon); 0 when missing. */
uint64_t adapter_num(const char *ca, const char *rel);

/* The number file `file` of port `port` (ports/<port>/<file>). */
uint64_t adapter_port_num(const char *ca, int port, const char *file);

/* A GUID file ("a088:c203:0012:3456"), host order; 0 when missing. */
uint64_t adapter_guid(const char *ca, const char *rel);

/* Port `port`'s GUID: GID 0's interface id. */
uint64_t adapter_port_guid(const char *ca, int port);

/* How many ports the adapter has (ports/1, ports/2, ...). */
int adapter_ports(const char *ca);

/* Port `port` is Active. */
int adapter_port_up(const char *ca, int port);

/* A GUID as sysfs and the fabric file spell it, colons or not. */
uint64_t guid_parse(const char *text);

/* A link's rate as sysfs words it ("400 Gb/sec (4X NDR)", or "(4X NDR)"). */
enum ib_speed { SPEED_UNKNOWN, SPEED_SDR, SPEED_DDR, SPEED_QDR, SPEED_FDR10, SPEED_FDR, SPEED_EDR, SPEED_HDR, SPEED_NDR, SPEED_XDR };

struct ib_rate {
    unsigned width; /* the code PortInfo and the verbs share: 1X 1, 4X 2, 8X 4, 12X 8, 2X 16; 0 unknown */
    enum ib_speed speed;
};

struct ib_rate rate_parse(const char *text);

/* Port `port`'s rate (ports/<port>/rate). */
struct ib_rate adapter_rate(const char *ca, int port);

#endif
