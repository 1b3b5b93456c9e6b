/* monitor/top.c: the `edgelmctl top` view.
 *
 * monitor_top_render() turns one metrics JSON text (monitor_json_render's
 * schema) into a plain-text frame; it is a pure function, so tests feed it
 * JSON and check the text. monitor_top_run() is the interactive loop that
 * edgelmctl calls with a callback fetching that JSON over IPC: it knows
 * nothing of IPC, only of the terminal. */
#include "monitor/monitor_impl.h"

#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

/* ---- frame buffer ------------------------------------------------------------ */

struct frame {
	char *p;
	size_t n, cap;
	int width;
};

CM_PRINTF(2, 3) static void out(struct frame *f, const char *fmt, ...)
{
	if (f->n + 1 >= f->cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(f->p + f->n, f->cap - f->n, fmt, ap);
	va_end(ap);
	if (k > 0)
		f->n = CM_MIN(f->n + (size_t)k, f->cap - 1);
}

/* End a line, cutting it at the frame width. */
static void endl(struct frame *f, size_t line_start)
{
	if (f->n > line_start + (size_t)f->width) {
		f->n = line_start + (size_t)f->width;
		f->p[f->n] = '\0';
	}
	out(f, "\n");
}

static void bar(struct frame *f, double ratio, int w)
{
	if (!(ratio >= 0))
		ratio = 0;
	if (ratio > 1)
		ratio = 1;
	int k = (int)lround(ratio * w);
	out(f, "[");
	for (int i = 0; i < w; i++)
		out(f, "%c", i < k ? '|' : ' ');
	out(f, "]");
}

static void human_bytes(char *buf, size_t cap, double v)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int i = 0;
	if (!(v >= 0)) {
		snprintf(buf, cap, "-");
		return;
	}
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

/* ---- JSON lookups --------------------------------------------------------------- */

/* The series of metric `name` whose label `key` equals `val` (key NULL: the
 * first series). */
static json_t *series_of(json_t *metrics, const char *name, const char *key, const char *val)
{
	json_t *fam = json_object_get(metrics, name);
	json_t *arr = fam ? json_object_get(fam, "series") : NULL;
	size_t i;
	json_t *s;
	json_array_foreach(arr, i, s)
	{
		if (!key)
			return s;
		json_t *l = json_object_get(json_object_get(s, "labels"), key);
		if (json_is_string(l) && strcmp(json_string_value(l), val) == 0)
			return s;
	}
	return NULL;
}

static double val(json_t *metrics, const char *name, const char *key, const char *v)
{
	json_t *s = series_of(metrics, name, key, v);
	json_t *x = s ? json_object_get(s, "value") : NULL;
	return json_is_number(x) ? json_number_value(x) : NAN;
}

static double sum_all(json_t *metrics, const char *name)
{
	json_t *fam = json_object_get(metrics, name);
	json_t *arr = fam ? json_object_get(fam, "series") : NULL;
	double t = 0;
	size_t i;
	json_t *s;
	json_array_foreach(arr, i, s)
	{
		json_t *x = json_object_get(s, "value");
		if (json_is_number(x))
			t += json_number_value(x);
	}
	return t;
}

static const char *jstr(json_t *x)
{
	const char *s = json_string_value(x);
	return s ? s : "";
}

static double pct(double r)
{
	return isnan(r) ? 0 : r * 100;
}

/* ---- one frame ------------------------------------------------------------------ */

static void render_cpus(struct frame *f, json_t *mt)
{
	json_t *fam = json_object_get(mt, "edgelm_cpu_busy_ratio");
	json_t *arr = fam ? json_object_get(fam, "series") : NULL;
	int bw = f->width - 17;
	size_t i;
	json_t *s;
	if (!json_array_size(arr)) {
		size_t ls = f->n;
		out(f, "cpu   (waiting for the second sample)");
		endl(f, ls);
		return;
	}
	json_array_foreach(arr, i, s)
	{
		const char *id =
		    json_string_value(json_object_get(json_object_get(s, "labels"), "cpu"));
		double r = json_number_value(json_object_get(s, "value"));
		size_t ls = f->n;
		out(f, "cpu%-3s", id ? id : "?");
		bar(f, r, bw);
		out(f, " %4.0f%%", pct(r));
		endl(f, ls);
	}
	size_t ls = f->n;
	out(f, "      steal %.0f%%  iowait %.0f%%  load %.2f %.2f %.2f  running %.0f  blocked %.0f",
	    pct(val(mt, "edgelm_cpu_steal_ratio", NULL, NULL)),
	    pct(val(mt, "edgelm_cpu_iowait_ratio", NULL, NULL)),
	    val(mt, "edgelm_load1", NULL, NULL), val(mt, "edgelm_load5", NULL, NULL),
	    val(mt, "edgelm_load15", NULL, NULL), val(mt, "edgelm_procs_running", NULL, NULL),
	    val(mt, "edgelm_procs_blocked", NULL, NULL));
	endl(f, ls);
}

static void render_memory(struct frame *f, json_t *mt)
{
	char a[32], b[32], c[32], d[32];
	int bw = f->width - 17;
	double total = val(mt, "edgelm_memory_total_bytes", NULL, NULL);
	double avail = val(mt, "edgelm_memory_available_bytes", NULL, NULL);
	double used = val(mt, "edgelm_memory_used_ratio", NULL, NULL);
	size_t ls = f->n;
	out(f, "mem   ");
	bar(f, used, bw);
	out(f, " %4.0f%%", pct(used));
	endl(f, ls);
	human_bytes(a, sizeof(a), avail);
	human_bytes(b, sizeof(b), total);
	ls = f->n;
	out(f, "      available %s of %s", a, b);
	double cg = val(mt, "edgelm_cgroup_memory_current_bytes", NULL, NULL);
	if (!isnan(cg)) {
		double cgmax = val(mt, "edgelm_cgroup_memory_max_bytes", NULL, NULL);
		human_bytes(c, sizeof(c), cg);
		human_bytes(d, sizeof(d), cgmax);
		if (isnan(cgmax))
			out(f, "  cgroup %s (no limit)", c);
		else
			out(f, "  cgroup %s of %s (%.0f%%)", c, d, pct(cg / cgmax));
	}
	endl(f, ls);

	double st = val(mt, "edgelm_swap_total_bytes", NULL, NULL);
	double su = val(mt, "edgelm_swap_used_bytes", NULL, NULL);
	ls = f->n;
	out(f, "swap  ");
	bar(f, st > 0 ? su / st : 0, bw);
	out(f, " %4.0f%%", st > 0 ? pct(su / st) : 0);
	endl(f, ls);
	human_bytes(a, sizeof(a), su);
	human_bytes(b, sizeof(b), st);
	human_bytes(c, sizeof(c), val(mt, "edgelm_swap_in_bytes_per_second", NULL, NULL));
	human_bytes(d, sizeof(d), val(mt, "edgelm_swap_out_bytes_per_second", NULL, NULL));
	ls = f->n;
	out(f, "      used %s of %s  in %s/s  out %s/s  major faults %.0f/s", a, b, c, d,
	    val(mt, "edgelm_major_page_faults_per_second", NULL, NULL));
	endl(f, ls);
}

static double psi(json_t *mt, const char *res)
{
	json_t *fam = json_object_get(mt, "edgelm_pressure_stall_ratio");
	json_t *arr = fam ? json_object_get(fam, "series") : NULL;
	size_t i;
	json_t *s;
	json_array_foreach(arr, i, s)
	{
		json_t *l = json_object_get(s, "labels");
		if (strcmp(jstr(json_object_get(l, "resource")), res) == 0 &&
		    strcmp(jstr(json_object_get(l, "kind")), "some") == 0)
			return json_number_value(json_object_get(s, "value"));
	}
	return NAN;
}

static void render_rest(struct frame *f, json_t *mt)
{
	char a[32], b[32];
	size_t ls = f->n;
	double pc = psi(mt, "cpu"), pm = psi(mt, "memory"), pi = psi(mt, "io");
	if (isnan(pc) && isnan(pm) && isnan(pi))
		out(f, "psi   not available");
	else
		out(f, "psi   cpu %.0f%%  memory %.0f%%  io %.0f%%  (stalled, last interval)",
		    pct(pc), pct(pm), pct(pi));
	double thr = val(mt, "edgelm_cgroup_cpu_throttled_ratio", NULL, NULL);
	if (!isnan(thr))
		out(f, "  throttled %.0f%%", pct(thr));
	endl(f, ls);

	human_bytes(a, sizeof(a), val(mt, "edgelm_process_resident_memory_bytes", NULL, NULL));
	human_bytes(b, sizeof(b), val(mt, "edgelm_process_locked_memory_bytes", NULL, NULL));
	ls = f->n;
	out(f, "proc  rss %s  locked %s  threads %.0f  workers busy %.0f%% wait %.0f%%", a, b,
	    val(mt, "edgelm_process_threads", NULL, NULL),
	    pct(val(mt, "edgelm_worker_busy_ratio", NULL, NULL)),
	    pct(val(mt, "edgelm_worker_wait_ratio", NULL, NULL)));
	endl(f, ls);

	double bw = val(mt, "edgelm_weight_bandwidth_bytes_per_second", NULL, NULL);
	double bwr = val(mt, "edgelm_weight_bandwidth_utilization_ratio", NULL, NULL);
	human_bytes(a, sizeof(a), bw);
	ls = f->n;
	out(f, "tok/s prefill %.1f  decode %.1f  weights %s/s",
	    val(mt, "edgelm_prefill_tokens_per_second", NULL, NULL),
	    val(mt, "edgelm_decode_tokens_per_second", NULL, NULL), a);
	if (!isnan(bwr))
		out(f, " (%.0f%% of peak)", pct(bwr));
	endl(f, ls);

	ls = f->n;
	out(f, "queue running %.0f  queued %.0f  kv %.0f%%  requests %.0f",
	    val(mt, "edgelm_sequences_running", NULL, NULL),
	    val(mt, "edgelm_sequences_queued", NULL, NULL),
	    pct(val(mt, "edgelm_kv_cache_usage_ratio", NULL, NULL)),
	    sum_all(mt, "edgelm_requests_total"));
	endl(f, ls);
}

static void render_flags(struct frame *f, json_t *flags)
{
	const char *k;
	json_t *v;
	int on = 0;
	json_object_foreach(flags, k, v)
	{
		if (!json_is_true(json_object_get(v, "on")))
			continue;
		size_t ls = f->n;
		out(f, "%s %s: %s", on ? "     " : "flags", k, jstr(json_object_get(v, "reason")));
		endl(f, ls);
		on++;
	}
	if (!on) {
		size_t ls = f->n;
		out(f, "flags none");
		endl(f, ls);
	}
}

int monitor_top_render(const char *json, int width, char *buf, size_t cap, struct cm_err *err)
{
	if (!buf || cap == 0)
		return cm_err_set(err, -EINVAL, "top: no buffer");
	buf[0] = '\0';
	struct frame f = {.p = buf, .cap = cap, .width = CM_MIN(CM_MAX(width, 40), 200)};
	json_error_t je;
	json_t *root = json ? json_loads(json, 0, &je) : NULL;
	if (!root)
		return cm_err_set(err, -EPROTO, "top: bad metrics JSON: %s",
		                  json ? je.text : "(null)");
	json_t *mt = json_object_get(root, "metrics");
	json_t *flags = json_object_get(root, "flags");
	if (!json_is_object(mt) || !json_is_object(flags)) {
		json_decref(root);
		return cm_err_set(err, -EPROTO, "top: metrics JSON without metrics or flags");
	}
	double up = json_number_value(json_object_get(root, "uptime_seconds"));
	time_t now = (time_t)json_number_value(json_object_get(root, "time_unix"));
	struct tm tm;
	char clock[16] = "";
	if (now > 0 && localtime_r(&now, &tm))
		strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
	size_t ls = f.n;
	out(&f, "edgelm top  %s  up %dh%02dm  interval %.2fs  (q to quit)", clock, (int)(up / 3600),
	    (int)fmod(up / 60, 60), json_number_value(json_object_get(root, "interval_seconds")));
	endl(&f, ls);
	render_cpus(&f, mt);
	render_memory(&f, mt);
	render_rest(&f, mt);
	render_flags(&f, flags);
	const char *le = json_string_value(json_object_get(root, "last_error"));
	if (le) {
		ls = f.n;
		out(&f, "note  %s", le);
		endl(&f, ls);
	}
	json_decref(root);
	return 0;
}

/* ---- the interactive loop ------------------------------------------------------ */

static volatile sig_atomic_t top_quit;

static void on_signal(int sig)
{
	(void)sig;
	top_quit = 1;
}

static void write_str(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t k = write(fd, s, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return;
		s += k;
		n -= (size_t)k;
	}
}

static int term_width(int fd)
{
	struct winsize ws;
	if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	return 80;
}

int monitor_top_run(monitor_fetch_cb fetch, void *ud, unsigned interval_ms, int in_fd, int out_fd,
                    struct cm_err *err)
{
	if (!fetch)
		return cm_err_set(err, -EINVAL, "top: no fetch callback");
	if (!interval_ms)
		interval_ms = 1000;
	struct termios saved, raw;
	bool in_tty = isatty(in_fd) && tcgetattr(in_fd, &saved) == 0;
	bool out_tty = isatty(out_fd);
	if (in_tty) {
		/* No echo, no line buffering, and Ctrl-C as a byte (ISIG off), so
		 * the terminal is always restored by this function. */
		raw = saved;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ISIG);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		tcsetattr(in_fd, TCSANOW, &raw);
	}
	struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
	sigemptyset(&sa.sa_mask);
	top_quit = 0;
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	if (out_tty)
		write_str(out_fd, "\033[?1049h\033[?25l", 14); /* alternate screen, hide cursor */

	size_t cap = 64 * 1024;
	char *frame = cm_malloc(cap);
	int rc = frame ? 0 : cm_err_set(err, -ENOMEM, "top: out of memory");
	while (!rc && !top_quit) {
		char *json = NULL;
		struct cm_err e = {0};
		int width = out_tty ? term_width(out_fd) : 80;
		int frc = fetch(ud, &json, &e);
		if (frc == 0)
			frc = monitor_top_render(json, width, frame, cap, &e);
		if (frc)
			snprintf(frame, cap, "edgelm top: %s\n(retrying; q to quit)\n",
			         e.msg[0] ? e.msg : "cannot fetch metrics");
		cm_free(json);
		if (out_tty)
			write_str(out_fd, "\033[H\033[2J", 7);
		write_str(out_fd, frame, strlen(frame));
		if (!out_tty)
			write_str(out_fd, "\n", 1);

		/* Wait for the next tick, or a key. */
		uint64_t until = cm_now_ns() + (uint64_t)interval_ms * 1000000ull;
		while (!top_quit) {
			uint64_t now = cm_now_ns();
			if (now >= until)
				break;
			struct pollfd pfd = {.fd = in_fd, .events = POLLIN};
			int n = poll(&pfd, 1, (int)((until - now) / 1000000ull) + 1);
			if (n < 0 && errno != EINTR) {
				top_quit = 1;
				break;
			}
			if (n <= 0)
				continue;
			char c;
			ssize_t k = read(in_fd, &c, 1);
			if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN) ||
			    (k == 1 && (c == 'q' || c == 'Q' || c == 3)))
				top_quit = 1; /* quit key, Ctrl-C, or EOF */
		}
	}
	cm_free(frame);
	if (out_tty)
		write_str(out_fd, "\033[?25h\033[?1049l", 14);
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	if (in_tty)
		tcsetattr(in_fd, TCSANOW, &saved);
	return rc;
}
