/* common/net.c: see common/net.h. */
#include "common/net.h"

#include "common/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int cm_parse_addr_port(const char *s, struct sockaddr_storage *ss, bool *v6)
{
	char host[128];
	const char *port;
	if (s[0] == '[') {
		const char *e = strchr(s, ']');
		if (!e || e[1] != ':' || (size_t)(e - s - 1) >= sizeof(host))
			return -EINVAL;
		memcpy(host, s + 1, (size_t)(e - s - 1));
		host[e - s - 1] = '\0';
		port = e + 2;
	} else {
		const char *c = strrchr(s, ':');
		if (!c || (size_t)(c - s) >= sizeof(host))
			return -EINVAL;
		memcpy(host, s, (size_t)(c - s));
		host[c - s] = '\0';
		port = c + 1;
	}
	char *end;
	long p = strtol(port, &end, 10);
	if (!*port || *end || p < 0 || p > 65535)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)p);
		*v6 = false;
	} else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)p);
		*v6 = true;
	} else {
		return -EINVAL;
	}
	return 0;
}

void cm_random_bytes(void *buf, size_t n)
{
	uint8_t *b = buf;
	size_t got = 0;
	while (got < n) {
		ssize_t r = getrandom(b + got, n - got, 0);
		if (r > 0) {
			got += (size_t)r;
		} else if (r < 0 && errno != EINTR) {
			uint64_t t = cm_now_ns() ^ (uint64_t)(uintptr_t)buf;
			for (; got < n; got++, t = t * 6364136223846793005ull + 1)
				b[got] = (uint8_t)(t >> 56);
		}
	}
}
