/* common/net.h: small pieces the daemon's servers and ids share: the
 * "ADDR:PORT" listen syntax of the metrics and HTTP endpoints, and random
 * bytes for ids other clients cannot guess. Not part of libedgelm. */
#ifndef EDGELM_COMMON_NET_H
#define EDGELM_COMMON_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* "ADDR:PORT", "[ADDR6]:PORT" or "localhost:PORT" (numeric addresses only:
 * no name lookups in a daemon's start) into *ss; *v6 says which family.
 * 0 or -EINVAL. */
int cm_parse_addr_port(const char *s, struct sockaddr_storage *ss, bool *v6);

/* n bytes from getrandom; with no entropy source, still unique ones from
 * the clock and the buffer's address. */
void cm_random_bytes(void *buf, size_t n);

#endif
