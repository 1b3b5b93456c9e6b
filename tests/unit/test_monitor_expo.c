/* tests/unit/test_monitor_expo.c: Prometheus text format, JSON, and the
 * atomically written node_exporter textfile. */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a small checker of the text format -------------------------------------- */

struct fam_seen {
	char name[128];
	int help, type;
	char type_name[64];
	bool closed; /* a later family started: no more samples allowed */
};

/* Base family of a sample name: strip _bucket/_sum/_count for histograms. */
static struct fam_seen *find_fam(struct fam_seen *f, int n, const char *name)
{
	for (int i = 0; i < n; i++) {
		size_t k = strlen(f[i].name);
		if (strncmp(name, f[i].name, k) != 0)
			continue;
		const char *rest = name + k;
		if (!*rest)
			return &f[i];
		if (strcmp(f[i].type_name, "histogram") == 0 &&
		    (!strcmp(rest, "_bucket") || !strcmp(rest, "_sum") || !strcmp(rest, "_count")))
			return &f[i];
	}
	return NULL;
}

/* Returns NULL if `text` is well-formed, else a static message. */
static const char *check_exposition(const char *text)
{
	static char why[512];
	static struct fam_seen fams[256];
	static char series[4096][256];
	int nf = 0, ns = 0;
	struct fam_seen *cur = NULL;
	double last_le = -1e300, last_cum = -1;
	char hist_key[256] = "";
	size_t len = strlen(text);
	if (!len || text[len - 1] != '\n')
		return "does not end with a newline";
	char *copy = strdup(text), *save = NULL;
	const char *res = NULL;
	for (char *l = strtok_r(copy, "\n", &save); l && !res; l = strtok_r(NULL, "\n", &save)) {
		char name[128], rest[64];
		if (sscanf(l, "# HELP %127s", name) == 1 ||
		    sscanf(l, "# TYPE %127s %63s", name, rest) == 2) {
			bool help = l[2] == 'H';
			struct fam_seen *f = NULL;
			for (int i = 0; i < nf; i++)
				if (!strcmp(fams[i].name, name))
					f = &fams[i];
			if (!f) {
				if (cur)
					cur->closed = true;
				f = &fams[nf++];
				memset(f, 0, sizeof(*f));
				snprintf(f->name, sizeof(f->name), "%s", name);
				cur = f;
			}
			if (f != cur || (help ? f->help++ : f->type++)) {
				snprintf(why, sizeof(why), "%s: repeated or ungrouped HELP/TYPE",
				         name);
				res = why;
			}
			if (!help) {
				snprintf(f->type_name, sizeof(f->type_name), "%s", rest);
				if (!f->help) {
					snprintf(why, sizeof(why), "%s: TYPE before HELP", name);
					res = why;
				}
			}
			continue;
		}
		if (l[0] == '#')
			continue;
		/* sample: name{labels} value */
		size_t k = strcspn(l, "{ ");
		snprintf(name, sizeof(name), "%.*s", (int)k, l);
		struct fam_seen *f = find_fam(fams, nf, name);
		if (!f || !f->type || f->closed || f != cur) {
			snprintf(why, sizeof(why), "sample '%s' outside its family's group", l);
			res = why;
			break;
		}
		const char *sp = strrchr(l, ' ');
		char *end;
		double v = strtod(sp + 1, &end);
		if (*end || end == sp + 1) {
			snprintf(why, sizeof(why), "bad value in '%s'", l);
			res = why;
			break;
		}
		for (int i = 0; i < ns; i++) {
			if (!strncmp(series[i], l, (size_t)(sp - l)) && series[i][sp - l] == '\0') {
				snprintf(why, sizeof(why), "duplicate series '%.200s'", series[i]);
				res = why;
			}
		}
		if (ns < 4096)
			snprintf(series[ns++], sizeof(series[0]), "%.*s", (int)(sp - l), l);
		/* histogram buckets: ascending le, cumulative, +Inf == _count */
		const char *le = strstr(l, "le=\"");
		size_t nk = strlen(name);
		if (nk > 7 && !strcmp(name + nk - 7, "_bucket")) {
			char key[256];
			snprintf(key, sizeof(key), "%.*s", (int)(le ? le - l : 0), l);
			if (strcmp(key, hist_key) != 0) {
				snprintf(hist_key, sizeof(hist_key), "%s", key);
				last_le = -1e300;
				last_cum = -1;
			}
			double lev = strncmp(le + 4, "+Inf", 4) == 0 ? 1e308 : strtod(le + 4, NULL);
			if (lev <= last_le || v < last_cum) {
				snprintf(why, sizeof(why), "bucket out of order: '%s'", l);
				res = why;
			}
			last_le = lev;
			last_cum = v;
		} else if (nk > 6 && !strcmp(name + nk - 6, "_count") &&
		           !strcmp(f->type_name, "histogram")) {
			if (last_le != 1e308 || v != last_cum) {
				snprintf(why, sizeof(why), "_count %g != +Inf bucket %g ('%s')", v,
				         last_cum, l);
				res = why;
			}
		}
	}
	free(copy);
	return res;
}

static monitor *new_monitor(const char *textfile)
{
	struct monitor_params p;
	monitor_params_default(&p);
	p.textfile_path = textfile;
	monitor *m = NULL;
	struct cm_err e = {0};
	int rc = monitor_new(&p, &m, &e);
	CHECK_MSG(rc == 0, "monitor_new: %s", e.msg);
	return m;
}

static monitor_series *gauge(monitor *m, const char *name, const char *help, const char *label,
                             const char *value)
{
	const char *labels[] = {label};
	struct monitor_family_desc d = {
	    .type = MONITOR_TYPE_GAUGE,
	    .name = name,
	    .help = help,
	    .labels = labels,
	    .n_labels = label ? 1 : 0,
	};
	monitor_family *f = NULL;
	monitor_series *s = NULL;
	CHECK_OK(monitor_family_add(m, &d, &f, NULL));
	const char *v[] = {value};
	if (f)
		CHECK_OK(monitor_series_get(f, v, &s, NULL));
	return s;
}

static void test_text_format(void)
{
	monitor *m = new_monitor(NULL);
	if (!m)
		return;
	const struct monitor_inference *inf = monitor_inference_get(m);
	CHECK_OK(monitor_sample(m, 0, NULL));
	usleep(50000); /* let /proc/stat's ticks move */
	CHECK_OK(monitor_sample(m, 0, NULL));
	monitor_series *s =
	    gauge(m, "x_escape", "back\\slash and\nnewline", "v", "q\"uote\\back\nnl");
	monitor_gauge_set(s, 1);
	monitor_gauge_set(gauge(m, "x_tenth", "h", NULL, NULL), 0.1);
	monitor_gauge_set(gauge(m, "x_big", "h", NULL, NULL), 1e21);
	monitor_gauge_set(gauge(m, "x_nan", "h", NULL, NULL), 0.0 / 0.0);
	monitor_gauge_set(gauge(m, "x_inf", "h", NULL, NULL), 1.0 / 0.0);
	monitor_gauge_set(gauge(m, "x_neg_zero", "h", NULL, NULL), -0.0);
	monitor_gauge_set(gauge(m, "x_third", "h", NULL, NULL), 1.0 / 3);
	/* a labelled family without series is left out */
	const char *l[] = {"a"};
	struct monitor_family_desc d = {MONITOR_TYPE_GAUGE, "x_empty", "h", l, 1, NULL, 0, false};
	CHECK_OK(monitor_family_add(m, &d, NULL, NULL));
	/* a labelled histogram */
	static const double b[] = {0.5, 1, 2};
	const char *hl[] = {"op"};
	struct monitor_family_desc hd = {
	    MONITOR_TYPE_HISTOGRAM, "x_lat_seconds", "h", hl, 1, b, 3, false};
	monitor_family *hf;
	CHECK_OK(monitor_family_add(m, &hd, &hf, NULL));
	monitor_series *h1 = mon_reg_series(hf, "a"), *h2 = mon_reg_series(hf, "b");
	for (int i = 0; i < 10; i++)
		monitor_histogram_observe(h1, i * 0.3);
	monitor_histogram_observe(h2, 5);
	monitor_histogram_observe(inf->ttft, 0.2);
	const char *rv[] = {"generate", "ok"};
	monitor_series *r;
	CHECK_OK(monitor_series_get(inf->requests, rv, &r, NULL));
	monitor_counter_add(r, 7);

	char *t = NULL;
	size_t n = 0;
	CHECK_OK(monitor_prometheus_render(m, &t, &n, NULL));
	if (!t) {
		monitor_free(m);
		return;
	}
	CHECK_EQ_INT(strlen(t), n);
	const char *why = check_exposition(t);
	CHECK_MSG(why == NULL, "%s", why);
	CHECK(strstr(t, "# HELP x_escape back\\\\slash and\\nnewline\n# TYPE x_escape gauge\n"));
	CHECK(strstr(t, "\nx_escape{v=\"q\\\"uote\\\\back\\nnl\"} 1\n"));
	CHECK(strstr(t, "\nx_tenth 0.1\n"));
	CHECK(strstr(t, "\nx_big 1e+21\n"));
	CHECK(strstr(t, "\nx_nan NaN\n"));
	CHECK(strstr(t, "\nx_inf +Inf\n"));
	CHECK(strstr(t, "\nx_neg_zero 0\n"));
	CHECK(strstr(t, "\nx_third 0.33333333333333331\n"));
	CHECK(!strstr(t, "x_empty"));
	CHECK(strstr(t, "\nx_lat_seconds_bucket{op=\"a\",le=\"0.5\"} 2\n"));
	CHECK(strstr(t, "\nx_lat_seconds_bucket{op=\"a\",le=\"2\"} 7\n"));
	CHECK(strstr(t, "\nx_lat_seconds_bucket{op=\"a\",le=\"+Inf\"} 10\n"));
	CHECK(strstr(t, "\nx_lat_seconds_count{op=\"a\"} 10\n"));
	CHECK(strstr(t, "\nx_lat_seconds_sum{op=\"a\"} 13.5\n"));
	CHECK(strstr(t, "\nx_lat_seconds_bucket{op=\"b\",le=\"2\"} 0\n"));
	CHECK(strstr(t, "\nedgelm_time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n"));
	CHECK(strstr(t, "\nedgelm_requests_total{op=\"generate\",outcome=\"ok\"} 7\n"));
	CHECK(strstr(t, "# TYPE edgelm_cpu_seconds_total counter\n"));
	CHECK(strstr(t, "edgelm_cpu_busy_ratio{cpu=\"0\"}"));
	CHECK(strstr(t, "# TYPE edgelm_time_per_output_token_seconds histogram\n"));
	/* Prometheus naming: no ':' anywhere in names, counters end _total */
	for (const char *p = t; (p = strstr(p, "# TYPE ")) != NULL; p++) {
		char nm[128], ty[32];
		CHECK(sscanf(p, "# TYPE %127s %31s", nm, ty) == 2);
		CHECK(!strchr(nm, ':'));
		size_t k = strlen(nm);
		bool total = k > 6 && !strcmp(nm + k - 6, "_total");
		CHECK_MSG(total == !strcmp(ty, "counter"), "%s %s", nm, ty);
	}
	cm_free(t);
	monitor_free(m);
}

static void test_checker_catches_errors(void)
{
	CHECK(check_exposition("# HELP a h\n# TYPE a gauge\na 1\n") == NULL);
	CHECK(check_exposition("# HELP a h\n# TYPE a gauge\na 1") != NULL);
	CHECK(check_exposition("# HELP a h\n# TYPE a gauge\na 1\na 2\n") != NULL);
	CHECK(check_exposition("# HELP a h\n# TYPE a gauge\n# HELP b h\n# TYPE b gauge\na 1\n") !=
	      NULL);
	CHECK(check_exposition("# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
	                       "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n") != NULL);
	CHECK(check_exposition("# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
	                       "h_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n") != NULL);
}

static void test_json(void)
{
	monitor *m = new_monitor(NULL);
	if (!m)
		return;
	const struct monitor_inference *inf = monitor_inference_get(m);
	CHECK_OK(monitor_sample(m, 0, NULL));
	usleep(50000); /* let /proc/stat's ticks move */
	CHECK_OK(monitor_sample(m, 0, NULL));
	monitor_histogram_observe(inf->queue_wait, 0.002);
	monitor_gauge_set(gauge(m, "x_nan", "h", NULL, NULL), 0.0 / 0.0);
	monitor_gauge_set(gauge(m, "x_label", "h", "k", "v\"x"), 2);
	char *t = NULL;
	size_t n;
	CHECK_OK(monitor_json_render(m, &t, &n, NULL));
	json_error_t je;
	json_t *root = t ? json_loads(t, 0, &je) : NULL;
	CHECK_MSG(root != NULL, "bad JSON: %s", root ? "" : je.text);
	if (root) {
		CHECK_EQ_INT(json_integer_value(json_object_get(root, "version")), 1);
		CHECK_EQ_INT(json_integer_value(json_object_get(root, "samples")), 2);
		CHECK_STREQ(json_string_value(json_object_get(root, "reader")), "libproc2");
		json_t *flags = json_object_get(root, "flags");
		CHECK_EQ_INT(json_object_size(flags), MONITOR_FLAG_COUNT);
		CHECK(json_is_false(json_object_get(json_object_get(flags, "swapping"), "on")));
		json_t *mt = json_object_get(root, "metrics");
		json_t *qw = json_object_get(mt, "edgelm_queue_wait_seconds");
		CHECK_STREQ(json_string_value(json_object_get(qw, "type")), "histogram");
		json_t *s0 = json_array_get(json_object_get(qw, "series"), 0);
		json_t *bk = json_object_get(s0, "buckets");
		json_t *last = json_array_get(bk, json_array_size(bk) - 1);
		CHECK_STREQ(json_string_value(json_object_get(last, "le")), "+Inf");
		CHECK_EQ_INT(json_integer_value(json_object_get(last, "count")), 1);
		CHECK_EQ_INT(json_integer_value(json_object_get(s0, "count")), 1);
		CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(bk, 1), "count")),
		             1);
		json_t *nan =
		    json_array_get(json_object_get(json_object_get(mt, "x_nan"), "series"), 0);
		CHECK(json_is_null(json_object_get(nan, "value")));
		json_t *lab =
		    json_array_get(json_object_get(json_object_get(mt, "x_label"), "series"), 0);
		CHECK_STREQ(json_string_value(json_object_get(json_object_get(lab, "labels"), "k")),
		            "v\"x");
		json_t *cpu = json_object_get(mt, "edgelm_cpu_busy_ratio");
		CHECK(json_array_size(json_object_get(cpu, "series")) >= 1);
		json_decref(root);
	}
	cm_free(t);
	monitor_free(m);
}

/* ---- textfile ----------------------------------------------------------------- */

struct writer {
	monitor *m;
	monitor_series *tick;
	const char *path;
	atomic_int done;
	int errors;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	for (int i = 0; i < 300; i++) {
		monitor_gauge_set(w->tick, i);
		if (monitor_textfile_write(w->m, w->path, NULL))
			w->errors++;
	}
	atomic_store(&w->done, 1);
	return NULL;
}

static void test_textfile_atomic(void)
{
	char dir[4096], path[4200];
	snprintf(dir, sizeof(dir), "%s/edgelm-textfile-XXXXXX", test_tmpdir());
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/edgelm.prom", dir);
	monitor *m = new_monitor(NULL);
	if (!m)
		return;
	struct writer w = {.m = m, .path = path};
	w.tick = gauge(m, "x_tick", "h", NULL, NULL);
	monitor_gauge_set(gauge(m, "zz_last", "the last family", NULL, NULL), 42);
	CHECK_OK(monitor_textfile_write(m, path, NULL));
	pthread_t th;
	pthread_create(&th, NULL, writer_main, &w);
	int reads = 0, torn = 0;
	static char buf[1 << 20];
	while (!atomic_load(&w.done)) {
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = '\0';
		reads++;
		/* whole files only: starts with a HELP line, ends with the last family */
		if (strncmp(buf, "# HELP ", 7) != 0 || n < 12 ||
		    strcmp(buf + n - 11, "zz_last 42\n"))
			torn++;
	}
	pthread_join(th, NULL);
	CHECK_EQ_INT(w.errors, 0);
	CHECK_EQ_INT(torn, 0);
	CHECK(reads > 0);
	struct stat st;
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
	/* no temporary files left behind */
	DIR *d = opendir(dir);
	int entries = 0;
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.' || (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")))
			entries++;
	if (d)
		closedir(d);
	CHECK_EQ_INT(entries, 1);

	/* failures come back as errors with the path */
	struct cm_err e = {0};
	char bad[4300];
	snprintf(bad, sizeof(bad), "%s/missing/edgelm.prom", dir);
	CHECK_EQ_INT(monitor_textfile_write(m, bad, &e), -ENOENT);
	CHECK(strstr(e.msg, "missing") != NULL);
	monitor_free(m);

	/* textfile_path: written after every sample */
	unlink(path);
	m = new_monitor(path);
	if (m) {
		CHECK_OK(monitor_sample(m, 0, NULL));
		CHECK(test_file_exists(path));
		monitor_free(m);
	}
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	TEST_RUN(test_checker_catches_errors);
	TEST_RUN(test_text_format);
	TEST_RUN(test_json);
	TEST_RUN(test_textfile_atomic);
	return test_finish();
}
