/*
 * MADs between processes (relay.c): what a port's own agents and the subnet do not answer (a
 * vendor class such as ibping's) goes to the process that registered a server agent for it on
 * the destination LID, through the subnet's relay directory ($MOKKA_SYSFS_ROOT/ib-relay: one
 * directory that every node of a local cluster, and every container given an adapter, shares).
 */
#ifndef MOKKA_RELAY_H
#define MOKKA_RELAY_H

#include <stddef.h>
#include <stdint.h>

/* Serve requests for class `cls` sent to LID `lid`: each arrives on `app` (the responder's end
 * of a umad socket pair; duplicated here) as the kernel delivers a request to agent `agent`.
 * 0, or -1 (errno set) when the relay directory is missing or the socket cannot be made. */
int relay_serve(int app, unsigned lid, uint8_t cls, uint32_t agent);

/* `msg` (a struct ib_user_mad and its MAD) is a server's response: sent back to the requester
 * waiting for its transaction ID. 1 when one was waiting. */
int relay_respond(const uint8_t *msg, size_t len);

/* `msg`, a request from LID `slid` to class `cls` of LID `dlid`, handed to the process serving
 * them; its answer written over `msg` (1), or 0 when nobody answered within `timeout_ms`. */
int relay_request(uint8_t *msg, size_t len, unsigned slid, unsigned dlid, uint8_t cls, int timeout_ms);

#endif
