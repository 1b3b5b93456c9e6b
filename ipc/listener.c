/* ipc/listener.c: the server's listeners (server_impl.h): creating and
 * starting one, with the checks of an ipc:// path, the socket file's mode
 * and group, and the io lock around nng calls. server.c and selfcheck.c
 * stand on it. */
#include "ipc/server_impl.h"

bool ipc_io_begin(struct ipc_server *srv)
{
	if (pthread_rwlock_tryrdlock(&srv->io) != 0)
		return false;
	if (atomic_load(&srv->closing)) {
		pthread_rwlock_unlock(&srv->io);
		return false;
	}
	return true;
}

void ipc_io_end(struct ipc_server *srv)
{
	pthread_rwlock_unlock(&srv->io);
}

int ipc_nng_to_errno(int rv)
{
	switch (rv) {
	case NNG_ENOMEM:
		return -ENOMEM;
	case NNG_EADDRINUSE:
		return -EADDRINUSE;
	case NNG_EADDRINVAL:
		return -EINVAL;
	case NNG_ENOTSUP:
		return -ENOTSUP;
	case NNG_EPERM:
		return -EPERM;
	case NNG_ENOENT:
		return -ENOENT;
	default:
		return -EIO;
	}
}

/* What is at an ipc:// path, for the message refusing it; NULL: a socket. */
static const char *file_kind(mode_t m)
{
	if (S_ISSOCK(m))
		return NULL;
	if (S_ISREG(m))
		return "a regular file";
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISLNK(m))
		return "a symbolic link";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	return "an unknown kind of file";
}

/* Whether a server answers on the socket file `path`. A bare connect() and
 * close(), as nng's own probe of an existing file does, can wedge an nng
 * 1.5.2 server there (see the top); exchanging SP headers first, as a req0
 * peer, makes the close an ordinary disconnect. */
static bool socket_is_live(const char *path)
{
	static const unsigned char hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* req0 */
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(path);
	if (len >= sizeof(sa.sun_path))
		return false; /* nng refuses the path itself */
	memcpy(sa.sun_path, path, len + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return false;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		bool live = errno == EAGAIN; /* a full backlog; nothing was accepted */
		close(fd);
		return live;
	}
	unsigned char peer[8];
	size_t got = 0;
	if (send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) == (ssize_t)sizeof(hdr)) {
		/* Close only once the server's header is here: its write is done. */
		uint64_t end = cm_now_ns() + 1000000000u;
		while (got < sizeof(peer)) {
			uint64_t now = cm_now_ns();
			if (now >= end)
				break;
			struct pollfd pfd = {.fd = fd, .events = POLLIN};
			int r = poll(&pfd, 1, (int)((end - now) / 1000000) + 1);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			ssize_t n = recv(fd, peer + got, sizeof(peer) - got, 0);
			if (n < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (n <= 0)
				break;
			got += (size_t)n;
		}
	}
	close(fd);
	return true;
}

/* Before nng binds an ipc:// path: refuse anything but a socket (nng would
 * delete it) and a socket a server answers on (nng's probe of it can wedge
 * that server). A stale socket is left for nng to replace. */
static int listener_path_check(const struct listener *L, struct cm_err *err)
{
	struct stat st;
	if (lstat(L->path, &st) != 0)
		return 0; /* absent, or nng says why */
	const char *kind = file_kind(st.st_mode);
	if (kind)
		return cm_err_set(err, -EEXIST,
		                  "ipc: %s is %s, not a socket: refusing to replace it", L->path,
		                  kind);
	if (socket_is_live(L->path))
		return cm_err_set(err, -EADDRINUSE,
		                  "ipc: cannot listen on %s: %s (is another edgelmd running?)",
		                  L->url, nng_strerror(NNG_EADDRINUSE));
	return 0;
}

int ipc_listener_create(struct ipc_server *srv, struct listener *L, const char *url,
                        struct cm_err *err)
{
	int rv = nng_listener_create(&L->l, srv->sock, url);
	if (rv != 0)
		return cm_err_set(err, ipc_nng_to_errno(rv), "ipc: listen URL '%s': %s", url,
		                  nng_strerror(rv));
	L->created = true;
	rv = nng_listener_set_size(L->l, NNG_OPT_RECVMAXSZ, srv->lim.max_msg_bytes);
	if (rv != 0)
		return cm_err_set(err, ipc_nng_to_errno(rv),
		                  "ipc: %s: cannot set the message limit: %s", url,
		                  nng_strerror(rv));
	if (L->tls && (rv = nng_listener_set_ptr(L->l, NNG_OPT_TLS_CONFIG, srv->tls)) != 0)
		return cm_err_set(err, ipc_nng_to_errno(rv), "ipc: %s: cannot set its TLS configuration: %s",
		                  url, nng_strerror(rv));
	/* nng chmods between bind() and listen(): no one connects before
	 * the mode is right (socket_file_setup still sets it, and the group). */
	if (L->path && srv->socket_mode >= 0) {
		rv = nng_listener_set_int(L->l, NNG_OPT_IPC_PERMISSIONS, srv->socket_mode);
		if (rv != 0)
			return cm_err_set(err, ipc_nng_to_errno(rv), "ipc: %s: cannot set mode %o: %s",
			                  url, srv->socket_mode, nng_strerror(rv));
	}
	return 0;
}

/* chmod and chgrp a socket file; the mode failing is fatal (the socket would
 * be open to the wrong users), the group is best effort. */
static int socket_file_setup(struct ipc_server *srv, const struct listener *L, struct cm_err *warn)
{
	if (srv->socket_mode >= 0 && chmod(L->path, (mode_t)srv->socket_mode) != 0)
		return cm_err_set(warn, -errno, "ipc: chmod %o %s: %s", srv->socket_mode, L->path,
		                  strerror(errno));
	if (!srv->socket_group)
		return 0;
	struct group gr, *res = NULL;
	char buf[4096];
	int e = getgrnam_r(srv->socket_group, &gr, buf, sizeof(buf), &res);
	if (!res) {
		cm_err_set(warn, e ? -e : -ENOENT, "ipc: socket group '%s' of %s: %s",
		           srv->socket_group, L->path, e ? strerror(e) : "no such group");
		return 1;
	}
	/* Under the unit the socket is born in its group (Group=edgelm), and
	 * the unit's seccomp filter would refuse even a no-op chown: only
	 * change what differs. */
	struct stat st;
	if (stat(L->path, &st) == 0 && st.st_gid == gr.gr_gid)
		return 0;
	if (chown(L->path, (uid_t)-1, gr.gr_gid) != 0) {
		cm_err_set(warn, -errno, "ipc: chgrp %s %s: %s", srv->socket_group, L->path,
		           strerror(errno));
		return 1;
	}
	return 0;
}

/* A started tcp:// listener's address: the URL to listen on again (its
 * port, even if 0 was asked for) and the address the self-check dials
 * (loopback for a wildcard address). */
static int tcp_addrs(struct listener *L)
{
	nng_sockaddr sa;
	char host[INET6_ADDRSTRLEN], url[INET6_ADDRSTRLEN + 32];
	if (nng_listener_get_addr(L->l, NNG_OPT_LOCADDR, &sa) != 0)
		return -EIO;
	if (sa.s_family == NNG_AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&L->probe_sa;
		in->sin_family = AF_INET;
		in->sin_port = sa.s_in.sa_port; /* both in network order */
		in->sin_addr.s_addr = sa.s_in.sa_addr;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(url, sizeof(url), "tcp://%s:%u", host, ntohs(in->sin_port));
		if (in->sin_addr.s_addr == htonl(INADDR_ANY))
			in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		L->probe_salen = sizeof(*in);
	} else if (sa.s_family == NNG_AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&L->probe_sa;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = sa.s_in6.sa_port;
		memcpy(&in6->sin6_addr, sa.s_in6.sa_addr, 16);
		in6->sin6_scope_id = sa.s_in6.sa_scope;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(url, sizeof(url), "tcp://[%s]:%u", host, ntohs(in6->sin6_port));
		if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
			in6->sin6_addr = in6addr_loopback;
		L->probe_salen = sizeof(*in6);
	} else {
		return -EAFNOSUPPORT;
	}
	return (L->listen_url = cm_strdup(url)) ? 0 : -ENOMEM;
}

/* Start one listener; a failed chgrp goes to `warn` (the return is 0). */
int ipc_listener_start(struct ipc_server *srv, struct listener *L, struct cm_err *warn,
                       struct cm_err *err)
{
	int rc;
	if (L->path && (rc = listener_path_check(L, err)))
		return rc;
	int rv = nng_listener_start(L->l, 0);
	if (rv != 0) {
		const char *hint = rv == NNG_EADDRINUSE ? " (is another edgelmd running?)" : "";
		return cm_err_set(err, ipc_nng_to_errno(rv), "ipc: cannot listen on %s: %s%s", L->url,
		                  nng_strerror(rv), hint);
	}
	L->started = true;
	if (L->path) {
		struct cm_err w = {0};
		rc = socket_file_setup(srv, L, &w);
		if (rc < 0)
			return cm_err_set(err, rc, "%s", w.msg);
		if (rc > 0 && warn)
			*warn = w;
		struct stat st;
		if (lstat(L->path, &st) == 0) {
			L->dev = st.st_dev;
			L->ino = st.st_ino;
		}
		struct sockaddr_un *un = (struct sockaddr_un *)&L->probe_sa;
		size_t len = strlen(L->path);
		if (!L->checked && len < sizeof(un->sun_path)) {
			un->sun_family = AF_UNIX;
			memcpy(un->sun_path, L->path, len + 1);
			L->probe_salen = sizeof(*un);
			L->checked = true;
		}
	} else if (!L->checked && strncmp(L->url, "tcp://", 6) == 0) {
		if ((rc = tcp_addrs(L)))
			return cm_err_set(err, rc, "ipc: %s: cannot read the bound address",
			                  L->url);
		L->checked = true;
	}
	return 0;
}

