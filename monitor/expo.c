/* monitor/expo.c: the registry as Prometheus text (format 0.0.4) and as
 * JSON.
 *
 * Prometheus text: per family one "# HELP" (escaping \ and newline) and one
 * "# TYPE" line, then its samples, all grouped; label values escape \, " and
 * newline; a histogram's series give cumulative _bucket{le} lines in
 * ascending order ending with le="+Inf", then _sum and _count, where the
 * +Inf bucket and _count are the same number by construction. Families with
 * no series yet are left out. No timestamps (node_exporter's textfile
 * collector refuses them).
 *
 * JSON (schema in docs/monitor.md) carries the same families plus the flags
 * with their reasons; non-finite values become null. */
#include "monitor/monitor_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a growable string ---------------------------------------------------- */

struct sb {
	char *p;
	size_t n, cap;
	bool oom;
};

static void sb_reserve(struct sb *b, size_t more)
{
	if (b->oom || b->n + more + 1 <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 8192;
	while (cap < b->n + more + 1)
		cap *= 2;
	char *p = cm_realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return;
	}
	b->p = p;
	b->cap = cap;
}

static void sb_putn(struct sb *b, const char *s, size_t n)
{
	sb_reserve(b, n);
	if (b->oom)
		return;
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void sb_puts(struct sb *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

/* Escape for HELP (quotes = false) or a label value (quotes = true). */
static void sb_escaped(struct sb *b, const char *s, bool quotes)
{
	for (const char *c = s; *c; c++) {
		if (*c == '\\')
			sb_puts(b, "\\\\");
		else if (*c == '\n')
			sb_puts(b, "\\n");
		else if (*c == '"' && quotes)
			sb_puts(b, "\\\"");
		else
			sb_putn(b, c, 1);
	}
}

/* Shortest text that reads back as the same double; Go-style specials. */
static void fmt_value(char *buf, size_t cap, double v)
{
	if (isnan(v))
		snprintf(buf, cap, "NaN");
	else if (isinf(v))
		snprintf(buf, cap, "%s", v > 0 ? "+Inf" : "-Inf");
	else if (v == 0)
		snprintf(buf, cap, "0");
	else if (fabs(v) < 9007199254740992.0 && v == floor(v))
		snprintf(buf, cap, "%.0f", v);
	else {
		snprintf(buf, cap, "%.15g", v);
		if (strtod(buf, NULL) != v)
			snprintf(buf, cap, "%.17g", v);
	}
}

static void sb_value(struct sb *b, double v)
{
	char buf[40];
	fmt_value(buf, sizeof(buf), v);
	sb_puts(b, buf);
}

/* name{labels[,le="x"]} */
static void sb_series_name(struct sb *b, const struct monitor_family *f,
                           const struct monitor_series *s, const char *suffix, const char *le)
{
	sb_puts(b, f->name);
	sb_puts(b, suffix);
	if (!f->n_labels && !le)
		return;
	sb_puts(b, "{");
	for (size_t i = 0; i < f->n_labels; i++) {
		if (i)
			sb_puts(b, ",");
		sb_puts(b, f->labels[i]);
		sb_puts(b, "=\"");
		sb_escaped(b, s->values[i], true);
		sb_puts(b, "\"");
	}
	if (le) {
		if (f->n_labels)
			sb_puts(b, ",");
		sb_puts(b, "le=\"");
		sb_puts(b, le);
		sb_puts(b, "\"");
	}
	sb_puts(b, "}");
}

static const char *type_name(enum monitor_type t)
{
	return t == MONITOR_TYPE_COUNTER ? "counter"
	       : t == MONITOR_TYPE_GAUGE ? "gauge"
	                                 : "histogram";
}

/* A family is left out while it has no series to render. */
static bool family_shown(const struct monitor_family *f)
{
	for (const struct monitor_series *s = f->head; s; s = s->next)
		if (mon_series_visible(s))
			return true;
	return false;
}

static void render_family(struct sb *b, const struct monitor_family *f)
{
	sb_puts(b, "# HELP ");
	sb_puts(b, f->name);
	sb_puts(b, " ");
	sb_escaped(b, f->help, false);
	sb_puts(b, "\n# TYPE ");
	sb_puts(b, f->name);
	sb_puts(b, " ");
	sb_puts(b, type_name(f->type));
	sb_puts(b, "\n");
	for (const struct monitor_series *s = f->head; s; s = s->next) {
		if (!mon_series_visible(s))
			continue;
		if (f->type != MONITOR_TYPE_HISTOGRAM) {
			sb_series_name(b, f, s, "", NULL);
			sb_puts(b, " ");
			sb_value(b, mon_load_double(&s->v));
			sb_puts(b, "\n");
			continue;
		}
		uint64_t cum = 0;
		char le[40];
		for (size_t i = 0; i <= f->n_buckets; i++) {
			cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
			if (i < f->n_buckets)
				fmt_value(le, sizeof(le), f->buckets[i]);
			sb_series_name(b, f, s, "_bucket", i < f->n_buckets ? le : "+Inf");
			sb_puts(b, " ");
			sb_value(b, (double)cum);
			sb_puts(b, "\n");
		}
		sb_series_name(b, f, s, "_sum", NULL);
		sb_puts(b, " ");
		sb_value(b, mon_load_double(&s->v));
		sb_puts(b, "\n");
		sb_series_name(b, f, s, "_count", NULL);
		sb_puts(b, " ");
		sb_value(b, (double)cum);
		sb_puts(b, "\n");
	}
}

int monitor_prometheus_render(monitor *m, char **ret_text, size_t *ret_len, struct cm_err *err)
{
	struct sb b = {0};
	sb_reserve(&b, 16384);
	pthread_mutex_lock(&m->reg.mu);
	for (const struct monitor_family *f = m->reg.head; f; f = f->next)
		if (family_shown(f))
			render_family(&b, f);
	pthread_mutex_unlock(&m->reg.mu);
	if (b.oom) {
		cm_free(b.p);
		return cm_err_set(err, -ENOMEM, "monitor: out of memory rendering metrics");
	}
	*ret_text = b.p;
	if (ret_len)
		*ret_len = b.n;
	return 0;
}

/* ---- JSON --------------------------------------------------------------------- */

static json_t *jnum(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

/* json_object_set_new that remembers a failure instead of checking each. */
static void jset(json_t *o, const char *k, json_t *v, bool *bad)
{
	if (!v || json_object_set_new(o, k, v) != 0)
		*bad = true;
}

static void jappend(json_t *a, json_t *v, bool *bad)
{
	if (!v || json_array_append_new(a, v) != 0)
		*bad = true;
}

static json_t *json_family(const struct monitor_family *f, bool *bad)
{
	json_t *o = json_object(), *arr = json_array();
	if (!o || !arr) {
		json_decref(o);
		json_decref(arr);
		*bad = true;
		return NULL;
	}
	jset(o, "type", json_string(type_name(f->type)), bad);
	jset(o, "help", json_string(f->help), bad);
	for (const struct monitor_series *s = f->head; s; s = s->next) {
		if (!mon_series_visible(s))
			continue;
		json_t *js = json_object(), *labels = json_object();
		for (size_t i = 0; labels && i < f->n_labels; i++)
			jset(labels, f->labels[i], json_string(s->values[i]), bad);
		if (js)
			jset(js, "labels", labels, bad);
		else
			json_decref(labels);
		if (js && f->type != MONITOR_TYPE_HISTOGRAM) {
			jset(js, "value", jnum(mon_load_double(&s->v)), bad);
		} else if (js) {
			json_t *bk = json_array();
			uint64_t cum = 0;
			for (size_t i = 0; bk && i <= f->n_buckets; i++) {
				cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
				json_t *e = json_object();
				if (e) {
					jset(e, "le",
					     i < f->n_buckets ? json_real(f->buckets[i])
					                      : json_string("+Inf"),
					     bad);
					jset(e, "count", json_integer((json_int_t)cum), bad);
				}
				jappend(bk, e, bad);
			}
			jset(js, "count", json_integer((json_int_t)cum), bad);
			jset(js, "sum", jnum(mon_load_double(&s->v)), bad);
			jset(js, "buckets", bk, bad);
		}
		jappend(arr, js, bad);
	}
	jset(o, "series", arr, bad);
	return o;
}

int monitor_json_render(monitor *m, char **ret_text, size_t *ret_len, struct cm_err *err)
{
	struct monitor_flag_state fl[MONITOR_FLAG_COUNT];
	double interval;
	uint64_t n_samples;
	char last_error[256];
	pthread_mutex_lock(&m->state_mu);
	memcpy(fl, m->flags, sizeof(fl));
	interval = m->interval;
	n_samples = m->n_samples;
	memcpy(last_error, m->last_error, sizeof(last_error));
	pthread_mutex_unlock(&m->state_mu);

	bool bad = false;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = cm_now_ns();
	json_t *root = json_object(), *flags = json_object(), *metrics = json_object();
	if (!root || !flags || !metrics) {
		json_decref(root);
		json_decref(flags);
		json_decref(metrics);
		return cm_err_set(err, -ENOMEM, "monitor: out of memory rendering JSON");
	}
	jset(root, "version", json_integer(1), &bad);
	jset(root, "time_unix", json_real((double)ts.tv_sec + ts.tv_nsec / 1e9), &bad);
	jset(root, "uptime_seconds", json_real((double)(now - m->created_ns) / 1e9), &bad);
	jset(root, "interval_seconds", json_real(interval), &bad);
	jset(root, "samples", json_integer((json_int_t)n_samples), &bad);
	jset(root, "reader", json_string(m->use_libproc2 ? "libproc2" : "parsers"), &bad);
	jset(root, "last_error", last_error[0] ? json_string(last_error) : json_null(), &bad);
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		json_t *o = json_object();
		if (o) {
			jset(o, "on", json_boolean(fl[f].on), &bad);
			jset(o, "reason", json_string(fl[f].reason), &bad);
			jset(o, "changed_seconds_ago",
			     fl[f].since > 0 ? json_real((double)now / 1e9 - fl[f].since)
			                     : json_null(),
			     &bad);
		}
		jset(flags, monitor_flag_name((enum monitor_flag)f), o, &bad);
	}
	jset(root, "flags", flags, &bad);
	pthread_mutex_lock(&m->reg.mu);
	for (const struct monitor_family *f = m->reg.head; f; f = f->next)
		if (family_shown(f))
			jset(metrics, f->name, json_family(f, &bad), &bad);
	pthread_mutex_unlock(&m->reg.mu);
	jset(root, "metrics", metrics, &bad);

	int rc = 0;
	size_t flags_out = JSON_COMPACT | JSON_PRESERVE_ORDER;
	size_t n = bad ? 0 : json_dumpb(root, NULL, 0, flags_out);
	char *text = n ? cm_malloc(n + 1) : NULL;
	if (!text || json_dumpb(root, text, n, flags_out) != n) {
		cm_free(text);
		rc = cm_err_set(err, -ENOMEM, "monitor: out of memory rendering JSON");
	} else {
		text[n] = '\0';
		*ret_text = text;
		if (ret_len)
			*ret_len = n;
	}
	json_decref(root);
	return rc;
}
