/* monitor/http.c: GET /metrics over HTTP with libmicrohttpd.
 *
 * One internal polling thread of libmicrohttpd's own (epoll) serves every
 * connection (a scrape renders in well under a millisecond, and there are
 * one or two scrapers). Bound to one address, 127.0.0.1 by default; errors
 * are never logged by the library (no MHD_USE_ERROR_LOG), they come back as
 * HTTP statuses or from monitor_http_start().
 *
 * Slow clients. MHD's timeout only closes a connection after HTTP_TIMEOUT_S
 * of silence, so clients that send nothing, or a header byte now and then
 * (slowloris), could hold every connection and lock Prometheus out; and
 * behind the default address every peer is 127.0.0.1, so a per-IP limit
 * alone keeps nobody out. So when a new connection takes a peer past
 * HTTP_PER_IP_SOFT connections, or the server past HTTP_CONN_SOFT, the
 * connection that has waited longest for a request (since it connected or
 * got its last reply) is shut down: a new connection always gets in, and a
 * peer pushes out only its own connections until the whole server is
 * crowded. MHD's hard limits, above these, only absorb bursts accepted
 * before an eviction takes effect (the next turn of the loop). */
#include "monitor/monitor_impl.h"

#include "common/net.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define HTTP_CONN_MAX 256    /* MHD_OPTION_CONNECTION_LIMIT */
#define HTTP_CONN_SOFT 192   /* above it, evict the longest-waiting connection */
#define HTTP_PER_IP_MAX 64   /* MHD_OPTION_PER_IP_CONNECTION_LIMIT */
#define HTTP_PER_IP_SOFT 32  /* above it, evict that peer's longest-waiting one */
#define HTTP_TIMEOUT_S 10    /* MHD_OPTION_CONNECTION_TIMEOUT: seconds of silence */

/* One open connection. Every callback that touches these runs on MHD's one
 * polling thread (no thread per connection, no pool), and MHD closes a
 * socket only after the CLOSED notification, so a tracked fd is always the
 * connection's own when it is shut down. */
struct http_conn {
	bool used, evicted;
	int fd;
	uint64_t since_ns; /* connected, or last request completed */
	uint8_t ip_len;
	unsigned char ip[16];
};

/* What monitor.http points to. */
struct http_server {
	struct MHD_Daemon *d;
	struct http_conn conns[HTTP_CONN_MAX];
};

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


static void conn_ip(const struct sockaddr *sa, struct http_conn *hc)
{
	hc->ip_len = 0;
	if (sa && sa->sa_family == AF_INET) {
		memcpy(hc->ip, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		hc->ip_len = 4;
	} else if (sa && sa->sa_family == AF_INET6) {
		memcpy(hc->ip, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
		hc->ip_len = 16;
	}
}

static bool same_ip(const struct http_conn *a, const struct http_conn *b)
{
	return a->ip_len == b->ip_len && memcmp(a->ip, b->ip, a->ip_len) == 0;
}

/* Shutting the socket down makes MHD see the close on its next turn and
 * free the connection as if the client had gone. */
static void evict(struct http_conn *hc)
{
	(void)shutdown(hc->fd, SHUT_RDWR);
	hc->evicted = true;
}

/* After `nc` arrived: keep its peer within HTTP_PER_IP_SOFT and the server
 * within HTTP_CONN_SOFT live connections. */
static void make_room(struct http_server *s, const struct http_conn *nc)
{
	struct http_conn *oldest = NULL, *oldest_ip = NULL;
	unsigned n = 0, n_ip = 0;
	for (size_t i = 0; i < HTTP_CONN_MAX; i++) {
		struct http_conn *hc = &s->conns[i];
		if (!hc->used || hc->evicted)
			continue;
		n++;
		bool mine = same_ip(hc, nc);
		n_ip += mine;
		if (hc == nc)
			continue;
		if (!oldest || hc->since_ns < oldest->since_ns)
			oldest = hc;
		if (mine && (!oldest_ip || hc->since_ns < oldest_ip->since_ns))
			oldest_ip = hc;
	}
	if (n_ip > HTTP_PER_IP_SOFT && oldest_ip)
		evict(oldest_ip);
	else if (n > HTTP_CONN_SOFT && oldest)
		evict(oldest);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
	struct http_server *s = cls;
	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		struct http_conn *hc = *socket_ctx;
		if (hc)
			hc->used = false;
		*socket_ctx = NULL;
		return;
	}
	const union MHD_ConnectionInfo *fd =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	const union MHD_ConnectionInfo *addr =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!fd)
		return;
	for (size_t i = 0; i < HTTP_CONN_MAX; i++) {
		struct http_conn *hc = &s->conns[i];
		if (hc->used)
			continue;
		*hc = (struct http_conn){.used = true, .fd = fd->connect_fd, .since_ns = cm_now_ns()};
		conn_ip(addr ? addr->client_addr : NULL, hc);
		*socket_ctx = hc;
		make_room(s, hc);
		return;
	} /* no free entry: cannot happen below MHD's own limit; left untracked */
}

/* A connection that was just answered starts waiting afresh, so a keep-alive
 * scraper is not the first to go. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
	const union MHD_ConnectionInfo *i =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *hc = i ? i->socket_context : NULL;
	if (hc)
		hc->since_ns = cm_now_ns();
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
	if (cm_parse_addr_port(listen, &ss, &v6))
		return cm_err_set(err, -EINVAL,
		                  "monitor: http: bad listen address '%s' (want ADDR:PORT, "
		                  "[ADDR6]:PORT or off)",
		                  listen);
	uint16_t port = v6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	                   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	struct http_server *s = cm_calloc(1, sizeof(*s));
	if (!s)
		return cm_err_set(err, -ENOMEM, "monitor: http: out of memory");
	errno = 0;
	struct MHD_Daemon *d = MHD_start_daemon(
	    MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0), port, NULL, NULL, handle, m,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned)HTTP_CONN_MAX, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)HTTP_PER_IP_MAX,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_TIMEOUT_S, MHD_OPTION_NOTIFY_CONNECTION,
	    on_connection, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
	if (!d) {
		int rc = errno ? -errno : -EADDRNOTAVAIL;
		cm_free(s);
		return cm_err_set(err, rc, "monitor: http: cannot listen on %s: %s", listen,
		                  strerror(-rc));
	}
	s->d = d;
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	m->http = s;
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
	struct http_server *s = m->http;
	MHD_stop_daemon(s->d); /* closes every connection, then returns */
	cm_free(s);
	m->http = NULL;
	m->http_port = 0;
}
