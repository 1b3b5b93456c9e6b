/* daemon/metrics.c: the daemon's own metrics beside the monitor's standard
 * families: every IPC reply counted by op and outcome, what is running
 * (edgelm_build_info, edgelm_model_info) and since when
 * (edgelm_start_time_seconds). Label values come from fixed lists (op
 * names, error code names, dtype names) or from the model in force, so the
 * series stay few. */
#include "daemon/serve.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#if defined(__clang__)
#define BUILD_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define BUILD_COMPILER "gcc " __VERSION__
#else
#define BUILD_COMPILER "unknown"
#endif

#if defined(__x86_64__)
#define BUILD_ARCH "x86_64"
#elif defined(__aarch64__)
#define BUILD_ARCH "aarch64"
#else
#define BUILD_ARCH "other"
#endif

const char *daemon_outcome_name(enum ipc_errcode code)
{
	return code == IPC_ERR_NONE ? "ok" : ipc_errcode_name(code);
}

void daemon_count_reply(void *userdata, enum ipc_op op, enum ipc_errcode code)
{
	struct daemon *d = userdata;
	/* A generation's reply (its result, or a stream's id) is counted when
	 * it finishes, with how it finished (store_finish), so that a stream
	 * counts once too. */
	if (code == IPC_ERR_NONE && (op == IPC_OP_GENERATE || op == IPC_OP_CHAT))
		return;
	store_count(d, op, daemon_outcome_name(code));
}

static monitor_family *info_family(monitor *m, const char *name, const char *help,
                                   const char *const *labels, size_t n)
{
	struct monitor_family_desc fd = {.type = MONITOR_TYPE_GAUGE,
	                                 .name = name,
	                                 .help = help,
	                                 .labels = labels,
	                                 .n_labels = n,
	                                 .info = true};
	monitor_family *f = NULL;
	return monitor_family_add(m, &fd, &f, NULL) == 0 ? f : NULL;
}

void daemon_metrics_init(struct daemon *d)
{
	static const char *const build_labels[] = {"version", "isa", "arch", "compiler"};
	static const char *const model_labels[] = {"name", "file", "arch", "type", "kv_type"};
	if (!d->mon)
		return;
	d->fam_build_info = info_family(d->mon, "edgelm_build_info",
	                                "Always 1: the daemon's version, kernel variant in use, "
	                                "CPU architecture and compiler.",
	                                build_labels, CM_ARRAY_LEN(build_labels));
	d->fam_model_info = info_family(d->mon, "edgelm_model_info",
	                                "Always 1: the model being served (replaced by a reload).",
	                                model_labels, CM_ARRAY_LEN(model_labels));
	struct monitor_family_desc fd = {
	    .type = MONITOR_TYPE_GAUGE,
	    .name = "edgelm_start_time_seconds",
	    .help = "Unix time the daemon started; changes() of it counts restarts."};
	monitor_family *f = NULL;
	monitor_series *s = NULL;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (monitor_family_add(d->mon, &fd, &f, NULL) == 0 &&
	    monitor_series_get(f, NULL, &s, NULL) == 0)
		monitor_gauge_set(s, (double)ts.tv_sec + ts.tv_nsec / 1e9);
}

/* The new label set to 1, then the replaced one to 0 (not rendered): a
 * scrape never finds the family empty. */
static void info_set(monitor_family *f, monitor_series **cur, const char *const *vals)
{
	monitor_series *s = NULL;
	if (!f || monitor_series_get(f, vals, &s, NULL) != 0)
		return;
	monitor_gauge_set(s, 1);
	if (*cur && *cur != s)
		monitor_gauge_set(*cur, 0);
	*cur = s;
}

/* The weights' type: the most frequent tensor type other than F32 (norms
 * and biases are F32 in every file), F32 for an all-F32 model. */
static const char *main_dtype(const struct engine_model_info *mi)
{
	uint32_t best = 0, n = 0;
	for (uint32_t t = 1; t < CM_ARRAY_LEN(mi->type_counts); t++)
		if (mi->type_counts[t] > n) {
			n = mi->type_counts[t];
			best = t;
		}
	return engine_dtype_name(best); /* 0: F32 */
}

void daemon_metrics_model(struct daemon *d)
{
	if (!d->fam_build_info && !d->fam_model_info)
		return;
	char isa[32], name[256], file[256], arch[32], kv[16];
	const char *type;
	pthread_mutex_lock(&d->mu);
	snprintf(isa, sizeof(isa), "%s", d->minfo.isa ? d->minfo.isa : "");
	snprintf(file, sizeof(file), "%s", d->model_name);
	snprintf(name, sizeof(name), "%s", d->minfo.name[0] ? d->minfo.name : d->model_name);
	snprintf(arch, sizeof(arch), "%s", d->minfo.arch);
	snprintf(kv, sizeof(kv), "%s", d->kv_type_name);
	type = main_dtype(&d->minfo); /* a static string */
	pthread_mutex_unlock(&d->mu);
	const char *bv[] = {EDGELM_VERSION, isa, BUILD_ARCH, BUILD_COMPILER};
	const char *mv[] = {name, file, arch, type, kv};
	info_set(d->fam_build_info, &d->build_info, bv);
	info_set(d->fam_model_info, &d->model_info, mv);
}
