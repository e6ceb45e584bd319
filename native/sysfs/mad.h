/*
 * What a port's management agents answer (mad.c): the answer to one MAD that libibumad's user
 * sent through the umad device of adapter `ca`'s port `port` (umad.c).
 */
#ifndef MOKKA_MAD_H
#define MOKKA_MAD_H

#include <stdint.h>

enum { MAD_SIZE = 256 };

/* The answer to `mad` (sent to LID `dlid`), written over it: 1 when there is one. */
int mad_answer(const char *ca, int port, uint8_t *mad, uint16_t dlid);

#endif
