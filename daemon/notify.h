/* daemon/notify.h: the systemd notification protocol (libsystemd's
 * sd-daemon). Every function is a no-op when NOTIFY_SOCKET is unset, so the
 * daemon behaves the same in the foreground. Thread-safe (one datagram per
 * call). */
#ifndef EDGELM_DAEMON_NOTIFY_H
#define EDGELM_DAEMON_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Read NOTIFY_SOCKET and the watchdog settings (sd_watchdog_enabled, which
 * honours WATCHDOG_PID). Call once, on the main thread, before threads exist. */
void daemon_notify_init(void);
bool daemon_notify_enabled(void);
/* The watchdog interval in microseconds, 0 when disabled. Ping at least
 * every half of it. */
uint64_t daemon_watchdog_usec(void);

void daemon_notify_ready(void);                          /* READY=1 */
void daemon_notify_status(const char *fmt, ...)          /* STATUS=... */
	__attribute__((format(printf, 1, 2)));
void daemon_notify_watchdog(void);                       /* WATCHDOG=1 */
void daemon_notify_reloading(void);                      /* RELOADING=1 + MONOTONIC_USEC */
void daemon_notify_stopping(void);                       /* STOPPING=1 */
void daemon_notify_extend_timeout(uint64_t usec);        /* EXTEND_TIMEOUT_USEC */

#endif
