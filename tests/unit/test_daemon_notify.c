/* tests/unit/test_daemon_notify.c: daemon/notify.c against a fake systemd,
 * an AF_UNIX datagram socket in $TEST_TMPDIR named by NOTIFY_SOCKET. Each
 * call must send exactly one datagram with exactly the protocol's text. */
#include "daemon/notify.h"

#include "tests/test.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int sock = -1;
static char sock_path[108];

static uint64_t mono_usec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The next datagram as a string, "" when none arrives within ms. */
static const char *recv_one(int ms)
{
	static char buf[4096];
	struct pollfd p = {sock, POLLIN, 0};
	ssize_t n;

	buf[0] = '\0';
	if (poll(&p, 1, ms) != 1)
		return buf;
	n = recv(sock, buf, sizeof(buf) - 1, MSG_DONTWAIT);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static int fake_systemd_start(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int n =
	    snprintf(sock_path, sizeof(sock_path), "%s/notify.%d", test_tmpdir(), (int)getpid());

	if (n < 0 || (size_t)n >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, sock_path);
	unlink(sock_path);
	sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sock < 0)
		return -errno;
	if (bind(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -errno;
	return 0;
}

static void env_systemd(const char *wd_usec, const char *wd_pid)
{
	char pid[32];

	setenv("NOTIFY_SOCKET", sock_path, 1);
	if (wd_usec)
		setenv("WATCHDOG_USEC", wd_usec, 1);
	else
		unsetenv("WATCHDOG_USEC");
	if (wd_pid && strcmp(wd_pid, "self") == 0) {
		snprintf(pid, sizeof(pid), "%d", (int)getpid());
		setenv("WATCHDOG_PID", pid, 1);
	} else if (wd_pid) {
		setenv("WATCHDOG_PID", wd_pid, 1);
	} else {
		unsetenv("WATCHDOG_PID");
	}
	daemon_notify_init();
}

static void test_messages(void)
{
	env_systemd("30000000", "self");
	CHECK(daemon_notify_enabled());
	CHECK_EQ_INT(daemon_watchdog_usec(), 30000000);

	daemon_notify_ready();
	CHECK_STREQ(recv_one(1000), "READY=1");
	daemon_notify_status("loading %s: %d%%", "tiny.gguf", 40);
	CHECK_STREQ(recv_one(1000), "STATUS=loading tiny.gguf: 40%");
	daemon_notify_status("two\nlines");
	CHECK_STREQ(recv_one(1000), "STATUS=two lines");
	daemon_notify_watchdog();
	CHECK_STREQ(recv_one(1000), "WATCHDOG=1");
	daemon_notify_stopping();
	CHECK_STREQ(recv_one(1000), "STOPPING=1");
	daemon_notify_extend_timeout(45000000);
	CHECK_STREQ(recv_one(1000), "EXTEND_TIMEOUT_USEC=45000000");

	uint64_t before = mono_usec();
	daemon_notify_reloading();
	uint64_t after = mono_usec();
	const char *m = recv_one(1000);
	uint64_t t = 0;
	CHECK_MSG(sscanf(m, "RELOADING=1\nMONOTONIC_USEC=%" SCNu64, &t) == 1, "got '%s'", m);
	CHECK_MSG(t >= before && t <= after,
	          "MONOTONIC_USEC=%" PRIu64 " not in [%" PRIu64 ", %" PRIu64 "]", t, before, after);
	char want[64];
	snprintf(want, sizeof(want), "RELOADING=1\nMONOTONIC_USEC=%" PRIu64, t);
	CHECK_STREQ(m, want);

	/* Nothing else was sent. */
	CHECK_STREQ(recv_one(50), "");
}

static void test_watchdog_env(void)
{
	env_systemd("2000000", NULL); /* no WATCHDOG_PID: for us */
	CHECK_EQ_INT(daemon_watchdog_usec(), 2000000);
	env_systemd("2000000", "1"); /* for another process */
	CHECK_EQ_INT(daemon_watchdog_usec(), 0);
	env_systemd(NULL, NULL);
	CHECK_EQ_INT(daemon_watchdog_usec(), 0);
	env_systemd("banana", "self");
	CHECK_EQ_INT(daemon_watchdog_usec(), 0);
	env_systemd("3000000", "self");
	CHECK_EQ_INT(daemon_watchdog_usec(), 3000000);
	/* The daemon may be asked again later; the environment stays. */
	CHECK(getenv("NOTIFY_SOCKET") != NULL);
	CHECK(getenv("WATCHDOG_USEC") != NULL);
}

static void test_disabled(void)
{
	unsetenv("NOTIFY_SOCKET");
	setenv("WATCHDOG_USEC", "1000000", 1);
	unsetenv("WATCHDOG_PID");
	daemon_notify_init();
	CHECK(!daemon_notify_enabled());
	CHECK_EQ_INT(daemon_watchdog_usec(), 0);
	daemon_notify_ready();
	daemon_notify_status("x");
	daemon_notify_watchdog();
	daemon_notify_reloading();
	daemon_notify_stopping();
	daemon_notify_extend_timeout(1);
	CHECK_STREQ(recv_one(50), "");
}

int main(void)
{
	int r = fake_systemd_start();

	if (r < 0) {
		fprintf(stderr, "cannot bind a notify socket in %s: %s\n", test_tmpdir(),
		        strerror(-r));
		return 1;
	}
	TEST_RUN(test_messages);
	TEST_RUN(test_watchdog_env);
	TEST_RUN(test_disabled);
	close(sock);
	unlink(sock_path);
	return test_finish();
}
