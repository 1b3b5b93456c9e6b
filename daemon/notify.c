/* daemon/notify.c: the systemd notification protocol over libsystemd's
 * sd-daemon. Each call sends one datagram (sd_notify opens its own socket
 * per call, so any thread may call these). The environment is read once in
 * daemon_notify_init and never unset (unsetenv is not thread-safe). */
#include "daemon/notify.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <systemd/sd-daemon.h>

static bool notify_enabled;
static uint64_t watchdog_usec;

void daemon_notify_init(void)
{
	const char *s = getenv("NOTIFY_SOCKET");
	uint64_t usec = 0;

	notify_enabled = s && *s;
	/* > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is us. */
	if (sd_watchdog_enabled(0, &usec) > 0)
		watchdog_usec = usec;
	else
		watchdog_usec = 0;
}

bool daemon_notify_enabled(void)
{
	return notify_enabled;
}

uint64_t daemon_watchdog_usec(void)
{
	return notify_enabled ? watchdog_usec : 0;
}

static void send_text(const char *text)
{
	if (notify_enabled)
		(void)sd_notify(0, text);
}

void daemon_notify_ready(void)
{
	send_text("READY=1");
}

void daemon_notify_status(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!notify_enabled)
		return;
	memcpy(msg, "STATUS=", 7);
	va_start(ap, fmt);
	vsnprintf(msg + 7, sizeof(msg) - 7, fmt, ap);
	va_end(ap);
	/* One assignment per line in the protocol: a newline would start a
	 * new (bogus) field. */
	for (char *p = msg; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	send_text(msg);
}

void daemon_notify_watchdog(void)
{
	send_text("WATCHDOG=1");
}

void daemon_notify_reloading(void)
{
	struct timespec ts;
	char msg[64];

	if (!notify_enabled)
		return;
	/* systemd 253+ (Type=notify-reload) wants the CLOCK_MONOTONIC time of
	 * the reload start, so it can tell this reload from an older one. */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%" PRIu64,
	         (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
	send_text(msg);
}

void daemon_notify_stopping(void)
{
	send_text("STOPPING=1");
}

void daemon_notify_extend_timeout(uint64_t usec)
{
	char msg[64];

	if (!notify_enabled)
		return;
	snprintf(msg, sizeof(msg), "EXTEND_TIMEOUT_USEC=%" PRIu64, usec);
	send_text(msg);
}
