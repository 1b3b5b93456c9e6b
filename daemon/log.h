/* daemon/log.h: the daemon's log. Only daemon/ logs (modules return
 * messages in struct cm_err). Under systemd (JOURNAL_STREAM names our
 * stderr) entries go to journald with their priority and structured fields
 * (EDGELM_REQUEST_ID, EDGELM_MODEL, CODE_FUNC...); otherwise to stderr as
 * "<N>message" lines when NOTIFY_SOCKET/INVOCATION_ID says we run under
 * systemd, or plain "edgelmd: warning: message" lines in a terminal. */
#ifndef EDGELM_DAEMON_LOG_H
#define EDGELM_DAEMON_LOG_H

#include <syslog.h> /* LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO, LOG_DEBUG */

/* level: "err", "warning", "notice", "info", "debug". Returns -EINVAL if unknown. */
int daemon_log_init(const char *level);
int daemon_log_set_level(const char *level);
/* The model name attached to every entry from now on (NULL: none). */
void daemon_log_set_model(const char *model);
/* req_id may be NULL. Thread-safe; one entry per call (no embedded newline).
 * daemon_log() passes the caller's file, line and function, which the
 * journal gets as CODE_FILE, CODE_LINE and CODE_FUNC. */
void daemon_log_at(const char *file, int line, const char *func, int prio, const char *req_id,
		   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
#define daemon_log(prio, req_id, ...) \
	daemon_log_at(__FILE__, __LINE__, __func__, (prio), (req_id), __VA_ARGS__)

#define log_err(...) daemon_log(LOG_ERR, NULL, __VA_ARGS__)
#define log_warning(...) daemon_log(LOG_WARNING, NULL, __VA_ARGS__)
#define log_notice(...) daemon_log(LOG_NOTICE, NULL, __VA_ARGS__)
#define log_info(...) daemon_log(LOG_INFO, NULL, __VA_ARGS__)
#define log_debug(...) daemon_log(LOG_DEBUG, NULL, __VA_ARGS__)

#endif
