/* tests/unit/test_daemon_log.c: daemon/log.c's sinks and level filter, with
 * stderr redirected to a file in $TEST_TMPDIR. */
#include "daemon/log.h"

#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static char out_path[4096];
static int saved_stderr = -1;

/* Point stderr at a fresh file. */
static void capture(void)
{
	int fd;

	snprintf(out_path, sizeof(out_path), "%s/log.%d", test_tmpdir(), (int)getpid());
	fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (saved_stderr < 0)
		saved_stderr = dup(STDERR_FILENO);
	dup2(fd, STDERR_FILENO);
	close(fd);
}

/* Restore stderr; return what was written (static buffer). */
static const char *captured(void)
{
	static char buf[1 << 16];
	FILE *f;
	size_t n;

	dup2(saved_stderr, STDERR_FILENO);
	f = fopen(out_path, "r");
	n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	buf[n] = '\0';
	if (f)
		fclose(f);
	return buf;
}

static void env_clear(void)
{
	unsetenv("JOURNAL_STREAM");
	unsetenv("INVOCATION_ID");
	unsetenv("NOTIFY_SOCKET");
}

static void test_plain(void)
{
	env_clear();
	capture();
	CHECK_OK(daemon_log_init("info"));
	log_warning("model %s: %d tensors", "tiny", 3);
	log_debug("not shown");
	daemon_log(LOG_INFO, "42", "done\nin two lines");
	log_err("bad");
	CHECK_STREQ(captured(), "edgelmd: warning: model tiny: 3 tensors\n"
	                        "edgelmd: info: [42] done in two lines\n"
	                        "edgelmd: err: bad\n");
}

static void test_levels(void)
{
	env_clear();
	CHECK_EQ_INT(daemon_log_init("loud"), -EINVAL);
	CHECK_EQ_INT(daemon_log_set_level("error"), -EINVAL);
	capture();
	CHECK_OK(daemon_log_set_level("warning"));
	log_notice("hidden");
	log_info("hidden");
	log_warning("w");
	CHECK_OK(daemon_log_set_level("debug"));
	log_debug("d");
	CHECK_STREQ(captured(), "edgelmd: warning: w\nedgelmd: debug: d\n");
}

static void test_prefix_under_systemd(void)
{
	env_clear();
	setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
	capture();
	CHECK_OK(daemon_log_init("info"));
	log_warning("w");
	daemon_log(LOG_ERR, "r1", "e");
	log_info("i");
	CHECK_STREQ(captured(), "<4>w\n<3>[r1] e\n<6>i\n");

	env_clear();
	setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1);
	capture();
	CHECK_OK(daemon_log_init("info"));
	log_notice("n");
	CHECK_STREQ(captured(), "<5>n\n");
	env_clear();
}

/* JOURNAL_STREAM naming another file is not our stream: prefix lines. When
 * it names our stderr, the journal is used; with no journald here, the
 * entry still reaches stderr as a prefix line (never lost). */
static void test_journal_stream_detection(void)
{
	struct stat st;
	char js[64];
	const char *out;

	env_clear();
	setenv("INVOCATION_ID", "x", 1);
	setenv("JOURNAL_STREAM", "1:2", 1);
	capture();
	CHECK_OK(daemon_log_init("info"));
	log_info("a");
	CHECK_STREQ(captured(), "<6>a\n");

	capture();
	fstat(STDERR_FILENO, &st);
	snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
	         (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", js, 1);
	CHECK_OK(daemon_log_init("info"));
	daemon_log_set_model("tiny.gguf");
	daemon_log(LOG_INFO, "7", "b");
	daemon_log_set_model(NULL);
	out = captured();
	if (access("/run/systemd/journal/socket", W_OK) == 0)
		CHECK_STREQ(out, ""); /* went to the journal */
	else
		CHECK_STREQ(out, "<6>[7] b\n");
	env_clear();
}

static void *writer(void *arg)
{
	for (int i = 0; i < 200; i++)
		daemon_log(LOG_INFO, arg, "line %d of a message long enough to tear if unlocked",
		           i);
	return NULL;
}

static void test_threads_whole_lines(void)
{
	pthread_t t[4];
	const char *ids[4] = {"a", "b", "c", "d"};
	const char *out, *p;
	int lines = 0;

	env_clear();
	capture();
	CHECK_OK(daemon_log_init("info"));
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, writer, (void *)ids[i]);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	out = captured();
	for (p = out; *p;) {
		const char *nl = strchr(p, '\n');
		int n;
		char id;
		if (!nl)
			break;
		CHECK_MSG(sscanf(p, "edgelmd: info: [%c] line %d of a message", &id, &n) == 2,
		          "torn line: %.80s", p);
		lines++;
		p = nl + 1;
	}
	CHECK_EQ_INT(lines, 800);
}

int main(void)
{
	TEST_RUN(test_plain);
	TEST_RUN(test_levels);
	TEST_RUN(test_prefix_under_systemd);
	TEST_RUN(test_journal_stream_detection);
	TEST_RUN(test_threads_whole_lines);
	unlink(out_path);
	return test_finish();
}
