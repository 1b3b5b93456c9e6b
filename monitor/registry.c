/* monitor/registry.c: metric families and their labelled series.
 *
 * The structure (family list, each family's series list) only grows, under
 * one mutex; nothing is freed before mon_reg_fini(), so a series handle can be
 * cached forever and updated without a lock. Values are doubles stored as
 * their bit patterns in 64-bit atomics: a gauge set is one store, an add is
 * a compare-exchange loop (uncontended in practice: one scheduler thread). A
 * histogram keeps one non-cumulative count per bucket; the renderer sums
 * them, so the +Inf bucket always equals the count it prints. */
#include "monitor/monitor_impl.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

static inline uint64_t d2u(double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof(u));
	return u;
}

static inline double u2d(uint64_t u)
{
	double d;
	memcpy(&d, &u, sizeof(d));
	return d;
}

double mon_load_double(const _Atomic uint64_t *p)
{
	return u2d(atomic_load_explicit((_Atomic uint64_t *)p, memory_order_relaxed));
}

bool mon_series_visible(const struct monitor_series *s)
{
	return !s->fam->info || mon_load_double(&s->v) != 0;
}

static void atomic_add_double(_Atomic uint64_t *p, double d)
{
	uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(p, &old, d2u(u2d(old) + d),
	                                              memory_order_relaxed, memory_order_relaxed))
		;
}

void monitor_counter_add(monitor_series *s, double v)
{
	if (!s || !(v > 0) || isinf(v))
		return;
	atomic_add_double(&s->v, v);
}

void monitor_counter_inc(monitor_series *s)
{
	monitor_counter_add(s, 1.0);
}

void monitor_counter_set(monitor_series *s, double v)
{
	if (!s || !(v >= 0) || isinf(v))
		return;
	atomic_store_explicit(&s->v, d2u(v), memory_order_relaxed);
}

void monitor_gauge_set(monitor_series *s, double v)
{
	if (s)
		atomic_store_explicit(&s->v, d2u(v), memory_order_relaxed);
}

void monitor_gauge_add(monitor_series *s, double v)
{
	if (s)
		atomic_add_double(&s->v, v);
}

void monitor_histogram_observe(monitor_series *s, double v)
{
	if (!s || !s->buckets || isnan(v))
		return;
	const struct monitor_family *f = s->fam;
	size_t lo = 0, hi = f->n_buckets; /* first bound >= v, or n_buckets */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (f->buckets[mid] < v)
			lo = mid + 1;
		else
			hi = mid;
	}
	atomic_fetch_add_explicit(&s->buckets[lo], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
	atomic_add_double(&s->v, v);
}

double monitor_series_value(const monitor_series *s)
{
	return s ? mon_load_double(&s->v) : 0.0;
}

/* ---- names ------------------------------------------------------------- */

bool mon_name_valid(const char *s)
{
	if (!s || !*s)
		return false;
	for (const char *c = s; *c; c++) {
		bool alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
		bool digit = *c >= '0' && *c <= '9';
		if (!alpha && !(digit && c != s))
			return false;
	}
	return true;
}

static bool ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), k = strlen(suf);
	return n >= k && strcmp(s + n - k, suf) == 0;
}

/* Does `name` collide with family f or, if f is a histogram, with one of its
 * _bucket/_sum/_count series? Callers check both directions. */
static bool name_clashes(const struct monitor_family *f, const char *name)
{
	static const char *const sfx[] = {"_bucket", "_sum", "_count"};
	if (strcmp(f->name, name) == 0)
		return true;
	size_t fn = strlen(f->name), n = strlen(name);
	for (size_t i = 0; i < CM_ARRAY_LEN(sfx); i++) {
		size_t k = strlen(sfx[i]);
		/* name is one of f's histogram series */
		if (f->type == MONITOR_TYPE_HISTOGRAM && n == fn + k &&
		    strncmp(name, f->name, fn) == 0 && strcmp(name + fn, sfx[i]) == 0)
			return true;
	}
	return false;
}

/* ---- families ---------------------------------------------------------- */

static void series_free(struct monitor_series *s, size_t n_labels)
{
	if (!s)
		return;
	if (s->values)
		for (size_t i = 0; i < n_labels; i++)
			cm_free(s->values[i]);
	cm_free(s->values);
	cm_free((void *)s->buckets);
	cm_free(s);
}

static void family_free(struct monitor_family *f)
{
	if (!f)
		return;
	for (struct monitor_series *s = f->head, *n; s; s = n) {
		n = s->next;
		series_free(s, f->n_labels);
	}
	for (size_t i = 0; i < f->n_labels; i++)
		cm_free(f->labels[i]);
	cm_free(f->name);
	cm_free(f->help);
	cm_free(f->buckets);
	cm_free(f);
}

int mon_reg_init(struct mon_reg *r, unsigned max_series)
{
	memset(r, 0, sizeof(*r));
	r->max_series = max_series ? max_series : 256;
	return -pthread_mutex_init(&r->mu, NULL);
}

void mon_reg_fini(struct mon_reg *r)
{
	for (struct monitor_family *f = r->head, *n; f; f = n) {
		n = f->next;
		family_free(f);
	}
	r->head = r->tail = NULL;
	pthread_mutex_destroy(&r->mu);
}

static int desc_check(const struct monitor_family_desc *d, struct cm_err *err)
{
	if (!d || !mon_name_valid(d->name))
		return cm_err_set(err, -EINVAL, "monitor: bad metric name '%s'",
		                  d && d->name ? d->name : "(null)");
	if (d->type != MONITOR_TYPE_COUNTER && d->type != MONITOR_TYPE_GAUGE &&
	    d->type != MONITOR_TYPE_HISTOGRAM)
		return cm_err_set(err, -EINVAL, "monitor: %s: bad type %d", d->name, (int)d->type);
	bool total = ends_with(d->name, "_total");
	if (d->type == MONITOR_TYPE_COUNTER && !total)
		return cm_err_set(err, -EINVAL, "monitor: counter %s must end in _total", d->name);
	if (d->type != MONITOR_TYPE_COUNTER && total)
		return cm_err_set(err, -EINVAL, "monitor: only counters end in _total: %s",
		                  d->name);
	if (!d->help || !*d->help)
		return cm_err_set(err, -EINVAL, "monitor: %s: help text required", d->name);
	if (d->n_labels > MON_MAX_LABELS || (d->n_labels && !d->labels))
		return cm_err_set(err, -EINVAL, "monitor: %s: %zu labels (max %d)", d->name,
		                  d->n_labels, MON_MAX_LABELS);
	for (size_t i = 0; i < d->n_labels; i++) {
		const char *l = d->labels[i];
		if (!mon_name_valid(l) || strncmp(l, "__", 2) == 0)
			return cm_err_set(err, -EINVAL, "monitor: %s: bad label name '%s'", d->name,
			                  l ? l : "(null)");
		if (d->type == MONITOR_TYPE_HISTOGRAM && strcmp(l, "le") == 0)
			return cm_err_set(err, -EINVAL, "monitor: %s: label 'le' is reserved",
			                  d->name);
		for (size_t j = 0; j < i; j++)
			if (strcmp(l, d->labels[j]) == 0)
				return cm_err_set(err, -EINVAL, "monitor: %s: label '%s' twice",
				                  d->name, l);
	}
	if (d->type == MONITOR_TYPE_HISTOGRAM) {
		if (d->n_buckets == 0 || d->n_buckets > MON_MAX_BUCKETS || !d->buckets)
			return cm_err_set(err, -EINVAL, "monitor: %s: %zu buckets (1..%d)", d->name,
			                  d->n_buckets, MON_MAX_BUCKETS);
		for (size_t i = 0; i < d->n_buckets; i++)
			if (!isfinite(d->buckets[i]) || (i && d->buckets[i] <= d->buckets[i - 1]))
				return cm_err_set(err, -EINVAL,
				                  "monitor: %s: buckets must be finite and "
				                  "strictly increasing",
				                  d->name);
	} else if (d->n_buckets) {
		return cm_err_set(err, -EINVAL, "monitor: %s: buckets on a non-histogram", d->name);
	}
	size_t nl = strlen(d->name);
	if (d->info &&
	    (d->type != MONITOR_TYPE_GAUGE || nl < 5 || strcmp(d->name + nl - 5, "_info")))
		return cm_err_set(err, -EINVAL,
		                  "monitor: %s: info families are gauges ending in _info", d->name);
	return 0;
}

int mon_reg_family_add(struct mon_reg *r, const struct monitor_family_desc *d,
                       monitor_family **ret_f, struct cm_err *err)
{
	int rc = desc_check(d, err);
	if (rc)
		return rc;
	struct monitor_family *f = cm_calloc(1, sizeof(*f));
	if (!f)
		return cm_err_set(err, -ENOMEM, "monitor: out of memory");
	f->reg = r;
	f->type = d->type;
	f->name = cm_strdup(d->name);
	f->help = cm_strdup(d->help);
	f->n_labels = d->n_labels;
	f->info = d->info;
	bool oom = !f->name || !f->help;
	for (size_t i = 0; i < d->n_labels; i++)
		oom |= !(f->labels[i] = cm_strdup(d->labels[i]));
	if (d->type == MONITOR_TYPE_HISTOGRAM) {
		f->n_buckets = d->n_buckets;
		f->buckets = cm_malloc(d->n_buckets * sizeof(double));
		if (f->buckets)
			memcpy(f->buckets, d->buckets, d->n_buckets * sizeof(double));
		oom |= !f->buckets;
	}
	if (oom) {
		family_free(f);
		return cm_err_set(err, -ENOMEM, "monitor: out of memory");
	}

	pthread_mutex_lock(&r->mu);
	for (struct monitor_family *o = r->head; o; o = o->next) {
		/* Both directions: o's derived names against ours, ours against o. */
		if (name_clashes(o, f->name) || name_clashes(f, o->name)) {
			pthread_mutex_unlock(&r->mu);
			rc = cm_err_set(err, -EEXIST, "monitor: metric %s clashes with %s", f->name,
			                o->name);
			family_free(f);
			return rc;
		}
	}
	if (r->tail)
		r->tail->next = f;
	else
		r->head = f;
	r->tail = f;
	pthread_mutex_unlock(&r->mu);
	if (ret_f)
		*ret_f = f;
	return 0;
}

monitor_family *mon_reg_family_find(struct mon_reg *r, const char *name)
{
	monitor_family *hit = NULL;
	pthread_mutex_lock(&r->mu);
	for (struct monitor_family *f = r->head; f && !hit; f = f->next)
		if (strcmp(f->name, name) == 0)
			hit = f;
	pthread_mutex_unlock(&r->mu);
	return hit;
}

static bool values_equal(const struct monitor_series *s, const char *const *values, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(s->values[i], values[i]) != 0)
			return false;
	return true;
}

int monitor_series_get(monitor_family *f, const char *const *values, monitor_series **ret_s,
                       struct cm_err *err)
{
	if (!f || (f->n_labels && !values))
		return cm_err_set(err, -EINVAL, "monitor: series of %s: bad arguments",
		                  f ? f->name : "(null)");
	for (size_t i = 0; i < f->n_labels; i++)
		if (!values[i])
			return cm_err_set(err, -EINVAL, "monitor: %s: label %s is NULL", f->name,
			                  f->labels[i]);
	struct mon_reg *r = f->reg;
	pthread_mutex_lock(&r->mu);
	for (struct monitor_series *s = f->head; s; s = s->next) {
		if (values_equal(s, values, f->n_labels)) {
			pthread_mutex_unlock(&r->mu);
			*ret_s = s;
			return 0;
		}
	}
	int rc = 0;
	if (f->n_series >= r->max_series) {
		rc = cm_err_set(err, -ENOSPC, "monitor: %s: more than %u label sets", f->name,
		                r->max_series);
		goto out_unlock;
	}
	struct monitor_series *s = cm_calloc(1, sizeof(*s));
	if (!s)
		goto out_oom;
	s->fam = f;
	s->values = cm_calloc(f->n_labels ? f->n_labels : 1, sizeof(char *));
	if (!s->values)
		goto out_oom_series;
	for (size_t i = 0; i < f->n_labels; i++)
		if (!(s->values[i] = cm_strdup(values[i])))
			goto out_oom_series;
	if (f->type == MONITOR_TYPE_HISTOGRAM) {
		s->buckets = cm_calloc(f->n_buckets + 1, sizeof(*s->buckets));
		if (!s->buckets)
			goto out_oom_series;
	}
	if (f->tail)
		f->tail->next = s;
	else
		f->head = s;
	f->tail = s;
	f->n_series++;
	pthread_mutex_unlock(&r->mu);
	*ret_s = s;
	return 0;

out_oom_series:
	series_free(s, f->n_labels);
out_oom:
	rc = cm_err_set(err, -ENOMEM, "monitor: out of memory");
out_unlock:
	pthread_mutex_unlock(&r->mu);
	return rc;
}

monitor_series *mon_reg_series(monitor_family *f, ...)
{
	const char *v[MON_MAX_LABELS];
	va_list ap;
	if (!f)
		return NULL;
	va_start(ap, f);
	for (size_t i = 0; i < f->n_labels; i++)
		v[i] = va_arg(ap, const char *);
	va_end(ap);
	monitor_series *s = NULL;
	if (monitor_series_get(f, v, &s, NULL))
		return NULL;
	return s;
}
