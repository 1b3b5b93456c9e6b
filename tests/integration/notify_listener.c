/* tests/integration/notify_listener.c: a fake systemd for integration tests.
 *
 *   notify_listener [-t SECS] PATH
 *
 * Binds an AF_UNIX datagram socket at PATH (a stale file is replaced) and
 * prints one line per datagram received, to stdout, flushed at once:
 *
 *   <monotonic seconds, 6 decimals> pid=<sender pid> <field> <field>...
 *
 * e.g. `12345.678901 pid=4242 RELOADING=1 MONOTONIC_USEC=12345678123`. The
 * fields are the datagram's newline-separated assignments joined by single
 * spaces (a STATUS= text keeps its own spaces, so match it with a regex
 * anchored on the field name). The time is CLOCK_MONOTONIC, the clock of
 * MONOTONIC_USEC, so the two compare directly; the pid comes from the
 * kernel's SCM_CREDENTIALS, as systemd's NotifyAccess=main check uses.
 *
 * Runs until SIGTERM/SIGINT, or until SECS seconds (default 2) after a
 * datagram holding STOPPING=1. The socket file is removed on exit. Start it,
 * wait for PATH to exist, then run the daemon with NOTIFY_SOCKET=PATH (and
 * WATCHDOG_USEC=... to test the watchdog cadence). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static double now_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool has_field(const char *msg, size_t len, const char *field)
{
	size_t fl = strlen(field);

	for (size_t i = 0; i + fl <= len; i++) {
		if ((i == 0 || msg[i - 1] == '\n') && memcmp(msg + i, field, fl) == 0 &&
		    (i + fl == len || msg[i + fl] == '\n'))
			return true;
	}
	return false;
}

int main(int argc, char **argv)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct sigaction act = {.sa_handler = on_signal};
	double linger = 2.0, stop_at = 0;
	const char *path;
	int one = 1, fd, opt;

	while ((opt = getopt(argc, argv, "t:")) != -1) {
		if (opt == 't') {
			linger = atof(optarg);
		} else {
			fprintf(stderr, "usage: %s [-t SECS] PATH\n", argv[0]);
			return 2;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, "usage: %s [-t SECS] PATH\n", argv[0]);
		return 2;
	}
	path = argv[optind];
	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "notify_listener: %s: path too long\n", path);
		return 2;
	}
	strcpy(sa.sun_path, path);
	sigaction(SIGTERM, &act, NULL);
	sigaction(SIGINT, &act, NULL);

	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0) {
		perror("notify_listener: socket");
		return 1;
	}
	(void)unlink(path);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "notify_listener: bind %s: %s\n", path, strerror(errno));
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	while (!stop) {
		char buf[8192], cbuf[CMSG_SPACE(sizeof(struct ucred))];
		struct iovec iov = {buf, sizeof(buf) - 1};
		struct msghdr mh = {.msg_iov = &iov,
		                    .msg_iovlen = 1,
		                    .msg_control = cbuf,
		                    .msg_controllen = sizeof(cbuf)};
		struct pollfd pfd = {fd, POLLIN, 0};
		int timeout = -1;
		long pid = 0;
		ssize_t n;

		if (stop_at > 0) {
			double left = stop_at - now_mono();
			if (left <= 0)
				break;
			timeout = (int)(left * 1000) + 1;
		}
		if (poll(&pfd, 1, timeout) <= 0)
			continue; /* timeout (checked above) or EINTR (stop) */
		n = recvmsg(fd, &mh, MSG_DONTWAIT);
		if (n < 0)
			continue;
		buf[n] = '\0';
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
				struct ucred uc;
				memcpy(&uc, CMSG_DATA(c), sizeof(uc));
				pid = uc.pid;
			}
		}
		if (has_field(buf, (size_t)n, "STOPPING=1") && stop_at == 0)
			stop_at = now_mono() + linger;
		/* Fields joined by spaces; a trailing newline adds nothing. */
		while (n > 0 && buf[n - 1] == '\n')
			buf[--n] = '\0';
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] == '\n' || buf[i] == '\0')
				buf[i] = ' ';
		printf("%.6f pid=%ld %s\n", now_mono(), pid, buf);
	}
	close(fd);
	(void)unlink(path);
	return 0;
}
