/* tests/unit/test_monitor_registry.c: metric families, label sets, and
 * lock-free updates. */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <pthread.h>
#include <string.h>

static monitor *new_monitor(void)
{
	struct monitor_params p;
	monitor_params_default(&p);
	p.max_series = 8;
	monitor *m = NULL;
	struct cm_err e = {0};
	int rc = monitor_new(&p, &m, &e);
	CHECK_MSG(rc == 0, "monitor_new: %s", e.msg);
	return m;
}

static int add(monitor *m, enum monitor_type t, const char *name, const char *const *labels,
               size_t nl, struct cm_err *e)
{
	static const double b[] = {1, 2};
	struct monitor_family_desc d = {
	    .type = t,
	    .name = name,
	    .help = "help",
	    .labels = labels,
	    .n_labels = nl,
	    .buckets = t == MONITOR_TYPE_HISTOGRAM ? b : NULL,
	    .n_buckets = t == MONITOR_TYPE_HISTOGRAM ? 2 : 0,
	};
	return monitor_family_add(m, &d, NULL, e);
}

static void test_names_checked(void)
{
	monitor *m = new_monitor();
	if (!m)
		return;
	struct cm_err e = {0};
	static const char *const le[] = {"le"}, *const dunder[] = {"__x"},
	                         *const twice[] = {"a", "a"}, *const bad[] = {"9a"};
	CHECK_EQ_INT(add(m, MONITOR_TYPE_COUNTER, "x_things", NULL, 0, &e), -EINVAL);
	CHECK(strstr(e.msg, "_total") != NULL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_things_total", NULL, 0, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x:y", NULL, 0, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "9x", NULL, 0, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "", NULL, 0, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_HISTOGRAM, "x_h_seconds", le, 1, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_g", dunder, 1, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_g", twice, 2, &e), -EINVAL);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_g", bad, 1, &e), -EINVAL);
	CHECK_OK(add(m, MONITOR_TYPE_GAUGE, "x_g", le, 1, &e)); /* le is fine off histograms */

	/* histograms: buckets must be finite and increasing */
	struct monitor_family_desc d = {.type = MONITOR_TYPE_HISTOGRAM, .name = "x_h", .help = "h"};
	static const double dec[] = {2, 1}, dup[] = {1, 1};
	d.buckets = dec;
	d.n_buckets = 2;
	CHECK_EQ_INT(monitor_family_add(m, &d, NULL, &e), -EINVAL);
	d.buckets = dup;
	CHECK_EQ_INT(monitor_family_add(m, &d, NULL, &e), -EINVAL);
	d.n_buckets = 0;
	CHECK_EQ_INT(monitor_family_add(m, &d, NULL, &e), -EINVAL);
	d.help = NULL;
	d.buckets = NULL;
	d.type = MONITOR_TYPE_GAUGE;
	CHECK_EQ_INT(monitor_family_add(m, &d, NULL, &e), -EINVAL); /* help required */
	monitor_free(m);
}

/* No two families can produce the same series name. */
static void test_no_duplicate_names(void)
{
	monitor *m = new_monitor();
	if (!m)
		return;
	struct cm_err e = {0};
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "edgelm_load1", NULL, 0, &e), -EEXIST);
	CHECK_OK(add(m, MONITOR_TYPE_HISTOGRAM, "x_lat_seconds", NULL, 0, &e));
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_lat_seconds_count", NULL, 0, &e), -EEXIST);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_lat_seconds_sum", NULL, 0, &e), -EEXIST);
	CHECK_EQ_INT(add(m, MONITOR_TYPE_GAUGE, "x_lat_seconds_bucket", NULL, 0, &e), -EEXIST);
	CHECK_OK(add(m, MONITOR_TYPE_GAUGE, "x_other_count", NULL, 0, &e));
	CHECK_EQ_INT(add(m, MONITOR_TYPE_HISTOGRAM, "x_other", NULL, 0, &e), -EEXIST);
	CHECK(strstr(e.msg, "clashes") != NULL);
	/* A gauge "x_a" next to a gauge "x_a_count" is no clash. */
	CHECK_OK(add(m, MONITOR_TYPE_GAUGE, "x_a", NULL, 0, &e));
	CHECK_OK(add(m, MONITOR_TYPE_GAUGE, "x_a_count", NULL, 0, &e));
	monitor_free(m);
}

static void test_series_by_labels(void)
{
	monitor *m = new_monitor();
	if (!m)
		return;
	const struct monitor_inference *inf = monitor_inference_get(m);
	monitor_series *a, *b, *c;
	const char *v1[] = {"generate", "ok"}, *v2[] = {"generate", "error"};
	CHECK_OK(monitor_series_get(inf->requests, v1, &a, NULL));
	CHECK_OK(monitor_series_get(inf->requests, v2, &b, NULL));
	CHECK_OK(monitor_series_get(inf->requests, v1, &c, NULL));
	CHECK(a == c && a != b);
	monitor_counter_inc(a);
	monitor_counter_add(c, 2);
	monitor_counter_add(a, -5); /* ignored */
	monitor_counter_add(a, 0.0 / 0.0);
	CHECK_NEAR(monitor_series_value(a), 3, 0);
	const char *vnull[] = {"x", NULL};
	struct cm_err e = {0};
	CHECK_EQ_INT(monitor_series_get(inf->requests, vnull, &c, &e), -EINVAL);
	/* the cardinality cap (8 here) */
	int rc = 0;
	for (int i = 0; i < 20 && !rc; i++) {
		char op[16];
		snprintf(op, sizeof(op), "op%d", i);
		const char *v[] = {op, "ok"};
		rc = monitor_series_get(inf->requests, v, &c, &e);
	}
	CHECK_EQ_INT(rc, -ENOSPC);
	/* handles are NULL-safe */
	monitor_counter_inc(NULL);
	monitor_gauge_set(NULL, 1);
	monitor_histogram_observe(NULL, 1);
	CHECK_NEAR(monitor_series_value(NULL), 0, 0);
	/* the standard families exist */
	CHECK(monitor_family_find(m, "edgelm_time_to_first_token_seconds") != NULL);
	CHECK(monitor_family_find(m, "edgelm_cpu_seconds_total") != NULL);
	CHECK(monitor_family_find(m, "nope") == NULL);
	monitor_free(m);
}

static void test_histogram_buckets(void)
{
	monitor *m = new_monitor();
	if (!m)
		return;
	monitor_series *h = monitor_inference_get(m)->ttft; /* 0.025 .. 60 */
	monitor_histogram_observe(h, 0.025);                /* le="0.025" includes its bound */
	monitor_histogram_observe(h, 0.026);
	monitor_histogram_observe(h, 60);
	monitor_histogram_observe(h, 61);        /* only +Inf */
	monitor_histogram_observe(h, -1);        /* below everything: first bucket */
	monitor_histogram_observe(h, 0.0 / 0.0); /* ignored */
	const struct monitor_family *f = h->fam;
	CHECK_EQ_INT(atomic_load(&h->buckets[0]), 2);
	CHECK_EQ_INT(atomic_load(&h->buckets[1]), 1);
	CHECK_EQ_INT(atomic_load(&h->buckets[f->n_buckets - 1]), 1);
	CHECK_EQ_INT(atomic_load(&h->buckets[f->n_buckets]), 1);
	CHECK_EQ_INT(atomic_load(&h->count), 5);
	CHECK_NEAR(monitor_series_value(h), 0.025 + 0.026 + 60 + 61 - 1, 1e-9);
	monitor_free(m);
}

struct hammer {
	monitor_series *c, *g, *h;
	int n;
};

static void *hammer_main(void *arg)
{
	struct hammer *hm = arg;
	for (int i = 0; i < hm->n; i++) {
		monitor_counter_add(hm->c, 1);
		monitor_gauge_add(hm->g, 0.5);
		monitor_histogram_observe(hm->h, (i % 7) * 0.1);
	}
	return NULL;
}

/* Updates from many threads lose nothing (the CAS loop under contention). */
static void test_concurrent_updates(void)
{
	monitor *m = new_monitor();
	if (!m)
		return;
	const struct monitor_inference *inf = monitor_inference_get(m);
	struct hammer hm = {inf->generation_tokens, inf->queued, inf->tpot, 50000};
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, hammer_main, &hm);
	/* render meanwhile: must not block or tear */
	for (int i = 0; i < 20; i++) {
		char *t;
		CHECK_OK(monitor_prometheus_render(m, &t, NULL, NULL));
		cm_free(t);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	CHECK_NEAR(monitor_series_value(hm.c), 200000, 0);
	CHECK_NEAR(monitor_series_value(hm.g), 100000, 0);
	CHECK_EQ_INT(atomic_load(&hm.h->count), 200000);
	uint64_t sum = 0;
	for (size_t i = 0; i <= hm.h->fam->n_buckets; i++)
		sum += atomic_load(&hm.h->buckets[i]);
	CHECK_EQ_INT(sum, 200000);
	monitor_free(m);
}

static void test_counter_set_and_gauges(void)
{
	monitor *m = new_monitor();
	if (!m)
		return;
	const struct monitor_inference *inf = monitor_inference_get(m);
	monitor_counter_set(inf->prompt_tokens, 1234);
	CHECK_NEAR(monitor_series_value(inf->prompt_tokens), 1234, 0);
	monitor_counter_set(inf->prompt_tokens, -1); /* refused */
	CHECK_NEAR(monitor_series_value(inf->prompt_tokens), 1234, 0);
	monitor_gauge_set(inf->running, 3);
	monitor_gauge_add(inf->running, -1);
	CHECK_NEAR(monitor_series_value(inf->running), 2, 0);
	monitor_free(m);
}

/* Allocation failures at every point of monitor_new unwind cleanly (run
 * under ASan to see leaks). */
static void test_new_alloc_failures(void)
{
	int ok = 0;
	for (long n = 0; n < 2000 && !ok; n += 7) {
		cm_alloc_fail_reset(n);
		monitor *m = NULL;
		struct cm_err e = {0};
		int rc = monitor_new(NULL, &m, &e);
		cm_alloc_fail_reset(-1);
		if (rc == 0) {
			ok = 1;
			monitor_free(m);
		} else {
			CHECK_EQ_INT(rc, -ENOMEM);
			CHECK(m == NULL);
		}
	}
	CHECK(ok);
}

int main(void)
{
	TEST_RUN(test_names_checked);
	TEST_RUN(test_no_duplicate_names);
	TEST_RUN(test_series_by_labels);
	TEST_RUN(test_histogram_buckets);
	TEST_RUN(test_concurrent_updates);
	TEST_RUN(test_counter_set_and_gauges);
	TEST_RUN(test_new_alloc_failures);
	return test_finish();
}
