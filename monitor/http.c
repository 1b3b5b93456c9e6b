/* monitor/http.c: GET /metrics over HTTP with libmicrohttpd.
 *
 * One internal polling thread of libmicrohttpd's own serves every
 * connection (a scrape renders in well under a millisecond, and there are
 * one or two scrapers). Bound to one address, 127.0.0.1 by default; errors
 * are never logged by the library (no MHD_USE_ERROR_LOG), they come back as
 * HTTP statuses or from monitor_http_start(). */
#include "monitor/monitor_impl.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *body,
                             const char *allow)
{
	struct MHD_Response *r =
	    MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
	if (allow)
		MHD_add_response_header(r, "Allow", allow);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static void free_text(void *p)
{
	cm_free(p);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
	monitor *m = cls;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", "GET, HEAD");
	if (strcmp(url, "/metrics") != 0)
		return reply(c, MHD_HTTP_NOT_FOUND, "not found; metrics are at /metrics\n", NULL);
	char *text;
	size_t len;
	if (monitor_prometheus_render(m, &text, &len, NULL) != 0)
		return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL);
	struct MHD_Response *r =
	    MHD_create_response_from_buffer_with_free_callback(len, text, free_text);
	if (!r) {
		cm_free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", CONTENT_TYPE);
	enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

/* "ADDR:PORT", "[ADDR6]:PORT" or "localhost:PORT". */
static int parse_listen(const char *s, struct sockaddr_storage *ss, bool *v6)
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

int monitor_http_start(monitor *m, const char *listen, struct cm_err *err)
{
	if (!listen || !*listen || strcmp(listen, "off") == 0)
		return 0;
	if (m->http)
		return cm_err_set(err, -EALREADY, "monitor: http: already serving on port %d",
		                  m->http_port);
	struct sockaddr_storage ss;
	bool v6;
	if (parse_listen(listen, &ss, &v6))
		return cm_err_set(err, -EINVAL,
		                  "monitor: http: bad listen address '%s' (want ADDR:PORT, "
		                  "[ADDR6]:PORT or off)",
		                  listen);
	uint16_t port = v6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	                   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	errno = 0;
	struct MHD_Daemon *d = MHD_start_daemon(
	    MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0), port, NULL, NULL, handle, m,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
	if (!d) {
		int rc = errno ? -errno : -EADDRNOTAVAIL;
		return cm_err_set(err, rc, "monitor: http: cannot listen on %s: %s", listen,
		                  strerror(-rc));
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	m->http = d;
	m->http_port = info ? info->port : port;
	return 0;
}

int monitor_http_port(monitor *m)
{
	return m->http ? m->http_port : 0;
}

void monitor_http_stop(monitor *m)
{
	if (!m || !m->http)
		return;
	MHD_stop_daemon(m->http);
	m->http = NULL;
	m->http_port = 0;
}
