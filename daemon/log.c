/* daemon/log.c: the daemon's log, three sinks chosen once at init:
 *
 *  journal  stderr is journald's stream (JOURNAL_STREAM names the device and
 *           inode of our stderr): sd_journal_sendv with PRIORITY, MESSAGE,
 *           SYSLOG_IDENTIFIER, the caller's CODE_FILE/CODE_LINE/CODE_FUNC
 *           (sd_journal_sendv adds none) and our fields
 *           EDGELM_REQUEST_ID/EDGELM_MODEL,
 *           so `journalctl EDGELM_REQUEST_ID=42` finds one request.
 *  kmsg     under systemd but not on the journal stream (INVOCATION_ID or
 *           NOTIFY_SOCKET set, e.g. StandardError=file:): "<N>message" lines,
 *           the sd-daemon.h prefixes that journald and syslog parse.
 *  plain    a terminal: "edgelmd: warning: message".
 *
 * Each entry is formatted into one buffer and written with one write(2), so
 * lines from concurrent threads never interleave; only the model name (which
 * a reload may change) takes a lock. */
#include "daemon/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <pthread.h>

#include <systemd/sd-journal.h>

enum log_sink { SINK_PLAIN, SINK_PREFIX, SINK_JOURNAL };

static const char *const level_names[] = {
    [LOG_ERR] = "err",   [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
    [LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

static atomic_int log_max = LOG_INFO;
static enum log_sink log_sink = SINK_PLAIN;
static pthread_mutex_t model_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_model[256];

static int level_parse(const char *s)
{
	for (int i = 0; i < (int)(sizeof(level_names) / sizeof(level_names[0])); i++)
		if (level_names[i] && strcmp(s, level_names[i]) == 0)
			return i;
	return -EINVAL;
}

/* JOURNAL_STREAM is "DEV:INODE" of the stream journald gave us; it is only
 * ours if stderr is still that stream (a child may inherit the variable with
 * a different stderr). */
static bool stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	/* sd_journal_sendv drops entries silently when journald's socket is
	 * missing: then stay on stderr. */
	if (access("/run/systemd/journal/socket", W_OK) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

int daemon_log_init(const char *level)
{
	const char *inv = getenv("INVOCATION_ID"), *ns = getenv("NOTIFY_SOCKET");
	int r = daemon_log_set_level(level);

	if (stderr_is_journal())
		log_sink = SINK_JOURNAL;
	else if ((inv && *inv) || (ns && *ns))
		log_sink = SINK_PREFIX;
	else
		log_sink = SINK_PLAIN;
	return r;
}

int daemon_log_set_level(const char *level)
{
	int l = level_parse(level);

	if (l < 0)
		return l;
	atomic_store(&log_max, l);
	return 0;
}

void daemon_log_set_model(const char *model)
{
	pthread_mutex_lock(&model_lock);
	snprintf(log_model, sizeof(log_model), "%s", model ? model : "");
	pthread_mutex_unlock(&model_lock);
}

static void write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		buf += n;
		len -= (size_t)n;
	}
}

struct code_loc {
	const char *file, *func;
	int line;
};

static int send_journal(int prio, const char *req_id, const struct code_loc *at, const char *msg)
{
	char f_msg[4200], f_prio[16], f_req[160], f_model[300], f_file[300], f_line[32], f_func[160];
	struct iovec iov[8];
	int n = 0;

	snprintf(f_msg, sizeof(f_msg), "MESSAGE=%s", msg);
	snprintf(f_prio, sizeof(f_prio), "PRIORITY=%d", prio);
	iov[n++] = (struct iovec){f_msg, strlen(f_msg)};
	iov[n++] = (struct iovec){f_prio, strlen(f_prio)};
	iov[n++] = (struct iovec){(char *)"SYSLOG_IDENTIFIER=edgelmd", 25};
	if (at->file) {
		snprintf(f_file, sizeof(f_file), "CODE_FILE=%s", at->file);
		snprintf(f_line, sizeof(f_line), "CODE_LINE=%d", at->line);
		snprintf(f_func, sizeof(f_func), "CODE_FUNC=%s", at->func ? at->func : "");
		iov[n++] = (struct iovec){f_file, strlen(f_file)};
		iov[n++] = (struct iovec){f_line, strlen(f_line)};
		iov[n++] = (struct iovec){f_func, strlen(f_func)};
	}
	if (req_id && *req_id) {
		snprintf(f_req, sizeof(f_req), "EDGELM_REQUEST_ID=%s", req_id);
		iov[n++] = (struct iovec){f_req, strlen(f_req)};
	}
	pthread_mutex_lock(&model_lock);
	if (log_model[0]) {
		snprintf(f_model, sizeof(f_model), "EDGELM_MODEL=%s", log_model);
		iov[n++] = (struct iovec){f_model, strlen(f_model)};
	}
	pthread_mutex_unlock(&model_lock);
	return sd_journal_sendv(iov, n);
}

void daemon_log_at(const char *file, int line_no, const char *func, int prio, const char *req_id,
		   const char *fmt, ...)
{
	const struct code_loc at = {file, func, line_no};
	char msg[4096], line[4300];
	va_list ap;
	int len;

	if (prio < 0)
		prio = LOG_ERR;
	if (prio > LOG_DEBUG)
		prio = LOG_DEBUG;
	if (prio > atomic_load(&log_max))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* One entry, one line. */
	for (char *p = msg; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';

	if (log_sink == SINK_JOURNAL && send_journal(prio, req_id, &at, msg) >= 0)
		return;
	if (log_sink == SINK_PLAIN) {
		/* LOG_ERR..LOG_DEBUG all have names; clamped above. */
		const char *name = level_names[prio] ? level_names[prio] : "err";
		if (req_id && *req_id)
			len = snprintf(line, sizeof(line), "edgelmd: %s: [%s] %s\n", name, req_id,
			               msg);
		else
			len = snprintf(line, sizeof(line), "edgelmd: %s: %s\n", name, msg);
	} else {
		/* Also the journal's fallback when the journal socket is gone. */
		if (req_id && *req_id)
			len = snprintf(line, sizeof(line), "<%d>[%s] %s\n", prio, req_id, msg);
		else
			len = snprintf(line, sizeof(line), "<%d>%s\n", prio, msg);
	}
	if (len < 0)
		return;
	if ((size_t)len >= sizeof(line)) {
		len = sizeof(line) - 1;
		line[len - 1] = '\n';
	}
	write_all(STDERR_FILENO, line, (size_t)len);
}
