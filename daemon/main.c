/* daemon/main.c: edgelmd's start, main loop and stop.
 *
 * main() reads as a sequence: the command line, the configuration (the
 * one-shot modes end there), then the start steps of `steps[]` run forward
 * (CPU detection and plan -> model file -> signals blocked before any
 * thread -> tuning applied -> monitor -> model loaded, fit-checked, warmed
 * up -> memory locked -> scheduler -> socket bound, READY=1), the signal
 * loop, and the steps' stops in exact reverse. The socket's stop is the
 * drain: STOPPING=1, new work gets shutting_down (polls and cancels are
 * still served), queued requests refused, running ones finish within
 * drain_timeout_ms, streams delivered (or idle for stream_idle_ms), then
 * the socket closes; the scheduler, model, monitor and tuning follow.
 * SIGHUP: RELOADING=1, reload the config file; reloadable keys change in
 * place; a new model is loaded beside the old one and swapped in between
 * steps; then READY=1.
 *
 * Exit codes: 0 ok, 1 usage or configuration, 2 bad model file, 3 runtime
 * failure (socket, threads), 4 not enough memory for model + KV cache. */
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/log.h"
#include "daemon/notify.h"

#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

/* The unit's RestartPreventExitStatus= lists the codes a restart cannot
 * cure (configuration, model, and mlock = on refused). */
enum { EXIT_USAGE = 1, EXIT_MODEL = 2, EXIT_RUNTIME = 3, EXIT_MEMORY = 4, EXIT_MLOCK = 5 };

static void usage(FILE *o)
{
	fprintf(o,
		"usage: edgelmd [options]\n"
		"\n"
		"  --config FILE          configuration file (default " DAEMON_CONFIG_PATH ")\n"
		"  --model FILE           GGUF model (overrides `model`)\n"
		"  --listen URL           nng URL to serve, repeatable (ipc://, tcp://, tls+tcp://)\n"
		"  --metrics-listen A:P   Prometheus endpoint, or `off`\n"
		"  --threads N, --ctx N, --parallel N, --isa NAME\n"
		"  --set KEY=VALUE        any configuration key (repeatable)\n"
		"  --foreground           accepted for systemd units (edgelmd never forks)\n"
		"  --check                print the CPU report and what tuning would change, then exit\n"
		"  --check-config         check the configuration and the model file, then exit\n"
		"  --print-config         print the effective configuration and exit\n"
		"  --print-config-doc     print the configuration reference (Markdown) and exit\n"
		"  --restore-tuning       undo tuning left by a crashed daemon (state file), then exit\n"
		"  --tune-cpufreq         set the governor and EPP only (privileged unit helper), exit\n"
		"  --no-cpufreq           leave governor and EPP to --tune-cpufreq (the unit's split)\n"
		"  --version, --help\n"
		"\n"
		"Exit codes: 0 ok, 1 usage or configuration, 2 bad model, 3 runtime failure,\n"
		"4 not enough memory.\n");
}

static void to_tuning_config(const struct daemon_config *c, struct tuning_config *t)
{
	tuning_config_default(t);
	t->threads = c->threads;
	t->pin = c->pin;
	snprintf(t->governor, sizeof(t->governor), "%s", c->tuning ? c->governor : "keep");
	snprintf(t->epp, sizeof(t->epp), "%s", c->tuning ? c->epp : "keep");
	t->nice = c->tuning && c->nice != 99 ? c->nice : TUNING_KEEP;
	t->sched_batch = c->tuning && c->sched_batch;
	if (!c->tuning || tuning_ioprio_parse(c->load_ioprio, &t->load_ioprio, &t->load_ioprio_level))
		tuning_ioprio_parse("keep", &t->load_ioprio, &t->load_ioprio_level);
	/* "try" and "on" both lock; they differ in what a failure means (lock_memory) */
	const char *ml = strcmp(c->mlock, "try") == 0 ? "on" : c->mlock;
	if (!c->tuning || tuning_mlock_parse(ml, &t->mlock))
		tuning_mlock_parse("off", &t->mlock);
	t->hugepages = c->tuning && c->hugepages;
	t->prefault = c->tuning && c->prefault;
	if (!c->tuning || tuning_numa_parse(c->numa, &t->numa))
		tuning_numa_parse("off", &t->numa);
	t->oom_score_adj = c->tuning && c->oom_score_adj != 9999 ? c->oom_score_adj : TUNING_KEEP;
	if (!c->tuning)
		t->pin = false;
}

static void log_tuning_changes(const struct tuning_state *st)
{
	for (int i = 0; i < st->n_changes; i++) {
		const struct tuning_change *ch = &st->changes[i];
		if (ch->result < 0)
			log_warning("tuning: %s %s: not applied: %s, ignoring",
				    tuning_knob_name(ch->kind), ch->target, ch->reason);
		else
			log_info("tuning: %s %s: %s -> %s", tuning_knob_name(ch->kind), ch->target,
				 ch->before, ch->after);
	}
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void on_flag(void *ud, const struct monitor_flag_event *ev)
{
	(void)ud;
	daemon_log(ev->on ? LOG_WARNING : LOG_NOTICE, NULL, "bottleneck %s %s: %s", ev->name,
		   ev->on ? "on" : "off", ev->reason);
}

/* What the load's memory check decided (fit_before_weights) */
struct load_fit {
	struct daemon *d;
	struct engine_ctx_params cp;
};

/* The context as the config asks for it and the memory check, run by the
 * engine once the model's shape is known and before its weights are read
 * or copied: refused there, a model that does not fit never reaches the
 * load's peak (the weights' copy, about the file's size). */
static int fit_before_weights(void *ud, const engine_model *m, struct cm_err *err)
{
	struct load_fit *lf = ud;
	struct daemon *d = lf->d;
	const struct daemon_config *c = &d->cfg;
	struct engine_model_info mi;
	engine_model_get_info(m, &mi);
	lf->cp = (struct engine_ctx_params){
		.n_ctx = c->ctx_size && c->ctx_size < mi.n_ctx ? c->ctx_size : mi.n_ctx,
		.n_seq = c->parallel,
		.n_batch = c->batch_size + c->parallel,
	};
	/* the table admits only the engine's names */
	if (engine_kv_type_from_name(c->kv_type, &lf->cp.kv_type) != 0)
		return cm_err_set(err, -EINVAL, "kv_type '%s' unknown (%s)", c->kv_type,
				  engine_kv_type_list());
	uint64_t kv_tok = engine_model_kv_bytes_per_token(m, lf->cp.kv_type);
	int r = daemon_config_fit_kv_budget(c, kv_tok, &lf->cp.n_ctx, err);
	if (r)
		return r;
	uint64_t kv = kv_tok * lf->cp.n_ctx * lf->cp.n_seq;
	/* quantizing on load keeps about the quantized weights, not the file */
	uint64_t weights = mi.quant_bytes_out ? mi.quant_bytes_out : file_size(c->model);
	if (tuning_memory_fit_check(&d->treport, weights, kv, err) != 0)
		return -ENOMEM;
	return 0;
}

/* Load the model and its context as the config says (main thread). */
static int load_model(struct daemon *d, engine_model **ret_m, engine_ctx **ret_c,
		      struct cm_err *err)
{
	const struct daemon_config *c = &d->cfg;
	struct load_fit lf = {.d = d};
	struct engine_params ep = {
		.n_threads = d->tplan.n_workers > 0 ? d->tplan.n_workers : c->threads,
		.cpus = d->tplan.pin ? d->tplan.worker_cpus : NULL,
		.n_cpus = d->tplan.pin ? d->tplan.n_workers : 0,
		.ctx_max = c->ctx_size,
		.isa = strcmp(c->isa, "auto") == 0 ? NULL : c->isa,
		.before_weights = fit_before_weights,
		.before_weights_ud = &lf,
		.repack_cache = c->repack_cache[0] ? c->repack_cache : NULL,
		.quantize = c->quantize,
	};
	(void)engine_repack_parse(c->repack, &ep.repack); /* the config table checked it */
	/* the kernels follow the ISA the report shows, from the same probe */
	struct cm_cpu_isa isa;
	if (tuning_cpu_engine_isa(&d->treport.cpu, &isa))
		ep.cpu = &isa;
	engine_model *m = NULL;
	engine_ctx *cx = NULL;
	if (c->tuning)
		(void)tuning_thread_sched_batch(c->sched_batch, NULL);
	int r = engine_model_load(c->model, &ep, &m, err);
	if (c->tuning && c->sched_batch)
		(void)tuning_thread_sched_batch(false, NULL);
	if (r)
		return r;
	struct engine_ctx_params cp = lf.cp;
	r = engine_ctx_new(m, &cp, &cx, err);
	if (r) {
		engine_model_free(m);
		return r;
	}
	/* warm-up: one token through every layer, then forget it. The decode
	 * pins this thread to worker 0's cpu (the engine's thread is whoever
	 * decodes): give it its own cpus back, which the IPC threads started
	 * from it inherit; the scheduler's thread binds at its first step. */
	cpu_set_t own;
	bool have_own = pthread_getaffinity_np(pthread_self(), sizeof(own), &own) == 0;
	int32_t bos = engine_tokenizer_bos(engine_model_tokenizer(m));
	int32_t pos0 = 0, seq0 = 0;
	struct engine_batch b = {.n = 1, .tokens = &bos, .pos = &pos0, .seq = &seq0};
	if (bos >= 0 && engine_decode(cx, &b, err) == 0)
		engine_seq_truncate(cx, 0, 0);
	if (have_own)
		(void)pthread_setaffinity_np(pthread_self(), sizeof(own), &own);
	*ret_m = m;
	*ret_c = cx;
	return 0;
}

/* What a load may take before systemd gives up: 120 s, and with quantize
 * 1 s more per 4 MiB of the file, a conservative rate (TinyLlama's F16
 * file to Q4_K_M takes well under that on one core). */
static uint64_t load_timeout_usec(const struct daemon_config *c)
{
	uint64_t us = 120 * 1000000ull;
	if (c->quantize[0])
		us += file_size(c->model) / (4u << 20) * 1000000ull;
	return us;
}

static void set_model_name(struct daemon *d)
{
	const char *slash = strrchr(d->cfg.model, '/');
	snprintf(d->model_name, sizeof(d->model_name), "%.255s", slash ? slash + 1 : d->cfg.model);
	daemon_log_set_model(d->model_name);
}

/* The kernel gives huge pages to anonymous memory, not to a file mapping:
 * copy the weights into 2 MiB-aligned anonymous memory with MADV_HUGEPAGE,
 * and say what it costs. A failure leaves the model on its mapping. */
static void copy_to_hugepages(struct daemon *d)
{
	struct engine_region wr;
	struct cm_err err = {0};
	if (d->minfo.weights_anon) {
		log_info("hugepages: the repacked weights already live in 2 MiB-aligned anonymous "
			 "memory (see the repack line); no copy made");
		return;
	}
	engine_model_region(d->model, &wr);
	if (tuning_hugepage_alloc(&d->tpaths, wr.len, &d->hpbuf, &err) != 0 ||
	    engine_model_relocate(d->model, d->hpbuf.addr, d->hpbuf.len, &err) != 0) {
		log_warning("hugepages: %s; serving from the file mapping", err.msg);
		tuning_hugepage_free(&d->hpbuf);
		memset(&d->hpbuf, 0, sizeof(d->hpbuf));
		return;
	}
	uint64_t rss = 0, huge = 0;
	(void)tuning_memory_rss(&d->tpaths, d->hpbuf.addr, d->hpbuf.len, &rss, &huge, NULL);
	log_info("hugepages: weights copied to anonymous memory (THP %s): %.1f MiB resident, "
		 "%.1f MiB in huge pages",
		 d->hpbuf.thp_enabled[0] ? d->hpbuf.thp_enabled : "unknown",
		 (double)rss / (1 << 20), (double)huge / (1 << 20));
	if (!d->hpbuf.thp_effective)
		log_warning("hugepages: transparent huge pages are off (%s): the copy costs memory "
			    "and brings nothing; set /sys/kernel/mm/transparent_hugepage/enabled to "
			    "madvise", d->hpbuf.thp_enabled);
}

/* Lock and prefault weights and KV cache. Returns -1 only when mlock is
 * "on" (strict) and locking failed; "try" warns once and serves unlocked. */
static int lock_memory(struct daemon *d)
{
	struct tuning_region regs[4];
	struct engine_region er[3];
	engine_model_region(d->model, &er[0]);
	int n = 1 + engine_ctx_regions(d->ctx, &er[1], 2);
	for (int i = 0; i < n; i++)
		regs[i] = (struct tuning_region){er[i].addr, er[i].len, er[i].what};
	struct cm_err err = {0};
	if (tuning_memory_lock(&d->tplan, &d->treport, regs, n, &d->tstate, &err) != 0) {
		if (d->cfg.tuning && strcmp(d->cfg.mlock, "on") == 0) {
			log_err("%s; refusing to start (mlock = on; try: serve unlocked)", err.msg);
			return -1;
		}
		log_warning("%s; serving unlocked", err.msg);
	}
	if (d->cfg.tuning && d->cfg.prefault)
		for (int i = 0; i < n; i++)
			(void)tuning_prefault(regs[i].addr, regs[i].len, i > 0, NULL);
	return 0;
}

static void update_tuning_json(struct daemon *d)
{
	char *json = NULL;
	if (tuning_state_json(&d->tstate, &d->tplan, &json, NULL) != 0)
		json = NULL;
	pthread_mutex_lock(&d->mu);
	cm_free(d->tuning_json);
	d->tuning_json = json;
	pthread_mutex_unlock(&d->mu);
}

/* `--tune-cpufreq`: the unit's privileged ExecStartPre. Only governor and
 * EPP (sysfs, root only under ProtectSystem=strict); their original values go
 * to the state file for ExecStopPost's --restore-tuning. Never fails the
 * start: problems are printed and the exit code is 0. */
static int tune_cpufreq_only(struct daemon *d)
{
	struct cm_err err = {0};
	struct tuning_config tc;
	tuning_config_default(&tc);
	snprintf(tc.governor, sizeof(tc.governor), "%s", d->cfg.tuning ? d->cfg.governor : "keep");
	snprintf(tc.epp, sizeof(tc.epp), "%s", d->cfg.tuning ? d->cfg.epp : "keep");
	tc.nice = TUNING_KEEP;
	tc.oom_score_adj = TUNING_KEEP;
	tc.pin = false;
	tc.sched_batch = false;
	tc.hugepages = false;
	tc.prefault = false;
	tc.amx = false;
	tuning_ioprio_parse("keep", &tc.load_ioprio, &tc.load_ioprio_level);
	tuning_mlock_parse("off", &tc.mlock);
	tuning_numa_parse("off", &tc.numa);
	tuning_report_init(&d->treport);
	tuning_plan_init(&d->tplan);
	tuning_state_init(&d->tstate);
	if (tuning_detect(&d->tpaths, &d->treport, &err) == 0 &&
	    tuning_plan_make(&d->treport, &tc, &d->tplan, &err) == 0) {
		tuning_apply(&d->tplan, &d->tpaths, &d->tstate, &err);
		tuning_state_print(stdout, &d->tstate);
	} else {
		fprintf(stderr, "edgelmd: --tune-cpufreq: %s\n", err.msg);
	}
	tuning_state_fini(&d->tstate);
	tuning_plan_fini(&d->tplan);
	tuning_report_fini(&d->treport);
	return 0;
}

/* The command line's keys (--model, --set, ...), kept for reloads. */
struct overrides {
	const char *key[64], *val[64];
	char *buf[64];
	int n;
};

/* The configuration as given: file, then EDGELM_ISA, then the command line
 * (which replaces the file's listen list). */
static int config_build(struct daemon_config *c, const char *path, bool must_exist,
			const struct overrides *ov, struct cm_err *err)
{
	daemon_config_default(c);
	int r = daemon_config_load(c, path, err);
	if (r == -ENOENT && !must_exist)
		r = 0; /* no default file: flags alone may be enough */
	if (r)
		return r;
	/* EDGELM_ISA, as for the tools: over the file, under the command line */
	const char *env_isa = getenv("EDGELM_ISA");
	if (env_isa && *env_isa && daemon_config_set(c, "isa", env_isa, err) != 0)
		return cm_err_set(err, -EINVAL, "EDGELM_ISA: %s", err->msg);
	for (int i = 0; i < ov->n; i++) {
		/* the first --listen replaces the file's list, the next ones add */
		if (strcmp(ov->key[i], "listen+") == 0)
			r = daemon_config_append(c, "listen", ov->val[i], err);
		else
			r = daemon_config_set(c, ov->key[i], ov->val[i], err);
		if (r)
			return r;
	}
	return 0;
}

static struct overrides g_ov;
static bool g_config_given;

/* Certificates are rotated in place (same paths) as often as not: read
 * the files at every reload, not only when their keys changed. */
static void reload_tls(struct daemon *d)
{
	bool tls = false;
	for (int i = 0; i < d->cfg.n_listen; i++)
		tls |= strncmp(d->cfg.listen[i], "tls+tcp://", 10) == 0;
	if (!tls || !d->srv)
		return;
	struct cm_err err = {0};
	if (ipc_server_tls_reload(d->srv, d->cfg.tls_cert_file, d->cfg.tls_key_file,
	                          d->cfg.tls_ca_file, &err) != 0)
		log_err("reload: %s; new TLS connections keep the previous certificates", err.msg);
	else
		log_notice("reload: TLS certificates read again; new connections use them");
}

static void reload(struct daemon *d)
{
	daemon_notify_reloading();
	log_notice("reloading %s", d->config_path);
	struct daemon_config nc;
	struct cm_err err = {0};
	int r = config_build(&nc, d->config_path, g_config_given, &g_ov, &err);
	if (r == 0)
		r = daemon_config_validate(&nc, &err);
	if (r) {
		log_err("reload: %s; keeping the current configuration", err.msg);
		daemon_notify_ready();
		return;
	}
	const char *key = NULL;
	char old_model[sizeof(d->cfg.model)];
	snprintf(old_model, sizeof(old_model), "%s", d->cfg.model);
	pthread_mutex_lock(&d->mu);
	/* compared with the configuration as given: d->cfg holds what the
	 * start made of it (the context the model allowed, ...) */
	char keys[512];
	daemon_config_restart_keys(&d->cfg_given, &nc, keys, sizeof(keys));
	int what = daemon_config_apply_reload(&d->cfg_given, &nc, &key);
	(void)daemon_config_apply_reload(&d->cfg, &nc, NULL);
	if (sched_apply_config(d->sched, &err) != 0)
		log_err("reload: %s", err.msg); /* checked when parsed: not expected */
	pthread_mutex_unlock(&d->mu);
	daemon_log_set_level(d->cfg.log_level);
	reload_tls(d);
	if (what & 2)
		log_warning("reload: %s changed, which needs a restart; ignoring %s", keys,
			    strchr(keys, ',') ? "them" : "it");
	if (what & 1) {
		engine_model *m = NULL;
		engine_ctx *c = NULL;
		struct daemon_config saved = d->cfg;
		snprintf(d->cfg.model, sizeof(d->cfg.model), "%s", nc.model);
		/* the old model serves on meanwhile: health stays ready */
		atomic_store(&d->reloading, true);
		if (d->cfg.quantize[0])
			daemon_notify_extend_timeout(load_timeout_usec(&d->cfg));
		if (load_model(d, &m, &c, &err) != 0) {
			log_err("reload: cannot load %s: %s; keeping %s", nc.model, err.msg, old_model);
			d->cfg = saved;
			atomic_store(&d->reloading, false);
			daemon_notify_ready();
			return;
		}
		log_notice("reload: %s loaded; swapping it in once running requests finish",
			   nc.model);
		snprintf(d->cfg_given.model, sizeof(d->cfg_given.model), "%s", nc.model);
		pthread_mutex_lock(&d->mu);
		set_model_name(d);
		pthread_mutex_unlock(&d->mu);
		sched_swap_model(d->sched, m, c); /* READY=1 after the swap */
		return;
	}
	daemon_notify_ready();
}

/* ---- the command line ---------------------------------------------------------- */

enum mode {
	MODE_SERVE, MODE_CHECK, MODE_CHECK_CONFIG, MODE_PRINT, MODE_PRINT_DOC, MODE_RESTORE,
	MODE_TUNE_CPUFREQ
};

struct cmdline {
	const char *config_path;
	bool config_given, no_cpufreq;
	enum mode mode;
};

/* Returns -1 to go on, else the exit code (--help, --version, usage errors). */
static int parse_args(int argc, char **argv, struct cmdline *cl, struct overrides *ov)
{
	enum {
		OPT_CONFIG = 256, OPT_MODEL, OPT_LISTEN, OPT_MLISTEN, OPT_THREADS, OPT_CTX,
		OPT_PARALLEL, OPT_ISA, OPT_SET, OPT_FG, OPT_CHECK, OPT_PRINT, OPT_PRINTDOC,
		OPT_RESTORE, OPT_TUNE_CPUFREQ, OPT_NO_CPUFREQ, OPT_VERSION, OPT_CHECK_CONFIG,
	};
	static const struct option opts[] = {
		{"config", required_argument, NULL, OPT_CONFIG},
		{"model", required_argument, NULL, OPT_MODEL},
		{"listen", required_argument, NULL, OPT_LISTEN},
		{"metrics-listen", required_argument, NULL, OPT_MLISTEN},
		{"threads", required_argument, NULL, OPT_THREADS},
		{"ctx", required_argument, NULL, OPT_CTX},
		{"parallel", required_argument, NULL, OPT_PARALLEL},
		{"isa", required_argument, NULL, OPT_ISA},
		{"set", required_argument, NULL, OPT_SET},
		{"foreground", no_argument, NULL, OPT_FG},
		{"check", no_argument, NULL, OPT_CHECK},
		{"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
		{"print-config", no_argument, NULL, OPT_PRINT},
		{"print-config-doc", no_argument, NULL, OPT_PRINTDOC},
		{"restore-tuning", no_argument, NULL, OPT_RESTORE},
		{"tune-cpufreq", no_argument, NULL, OPT_TUNE_CPUFREQ},
		{"no-cpufreq", no_argument, NULL, OPT_NO_CPUFREQ},
		{"version", no_argument, NULL, OPT_VERSION},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	*cl = (struct cmdline){.config_path = DAEMON_CONFIG_PATH, .mode = MODE_SERVE};
	int n_listen = 0, c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		const char *key = NULL;
		switch (c) {
		case OPT_CONFIG: cl->config_path = optarg; cl->config_given = true; break;
		case OPT_MODEL: key = "model"; break;
		/* the first --listen replaces the file's list, later ones add */
		case OPT_LISTEN: key = n_listen++ ? "listen+" : "listen"; break;
		case OPT_MLISTEN: key = "metrics_listen"; break;
		case OPT_THREADS: key = "threads"; break;
		case OPT_CTX: key = "ctx_size"; break;
		case OPT_PARALLEL: key = "parallel"; break;
		case OPT_ISA: key = "isa"; break;
		case OPT_SET: {
			char *eq = strchr(optarg, '=');
			if (!eq || ov->n >= 64) {
				fprintf(stderr, "edgelmd: --set wants KEY=VALUE, got '%s'\n", optarg);
				return EXIT_USAGE;
			}
			ov->buf[ov->n] = strndup(optarg, (size_t)(eq - optarg));
			ov->key[ov->n] = ov->buf[ov->n];
			ov->val[ov->n++] = eq + 1;
			continue;
		}
		case OPT_FG: break;
		case OPT_CHECK: cl->mode = MODE_CHECK; break;
		case OPT_CHECK_CONFIG: cl->mode = MODE_CHECK_CONFIG; break;
		case OPT_PRINT: cl->mode = MODE_PRINT; break;
		case OPT_PRINTDOC: cl->mode = MODE_PRINT_DOC; break;
		case OPT_RESTORE: cl->mode = MODE_RESTORE; break;
		case OPT_TUNE_CPUFREQ: cl->mode = MODE_TUNE_CPUFREQ; break;
		case OPT_NO_CPUFREQ: cl->no_cpufreq = true; break;
		case OPT_VERSION: printf("edgelmd %s\n", EDGELM_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
		if (key && ov->n < 64) {
			ov->buf[ov->n] = NULL;
			ov->key[ov->n] = key;
			ov->val[ov->n++] = optarg;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	return -1;
}

/* Configuration, logging and the tuning paths. Returns -1 to go on. */
static int configure(struct daemon *d, const struct cmdline *cl)
{
	struct cm_err err = {0};
	if (cl->mode == MODE_PRINT_DOC) {
		daemon_config_default(&d->cfg);
		daemon_config_print(stdout, &d->cfg, true);
		return 0;
	}
	/* the log first, so a fatal configuration error reaches the journal at
	 * err priority (journalctl -p err shows why the unit failed) */
	(void)daemon_log_init("info");
	g_config_given = cl->config_given;
	if (config_build(&d->cfg, cl->config_path, cl->config_given, &g_ov, &err) != 0) {
		log_err("%s", err.msg);
		return EXIT_USAGE;
	}
	d->cfg_given = d->cfg;
	d->config_path = cl->config_path;
	if (daemon_log_set_level(d->cfg.log_level) != 0) {
		log_err("bad log_level '%s'", d->cfg.log_level);
		return EXIT_USAGE;
	}
	if (cl->mode == MODE_PRINT) {
		daemon_config_print(stdout, &d->cfg, false);
		return 0;
	}
	if (tuning_paths_from_env(&d->tpaths, &err) != 0) {
		log_err("%s", err.msg);
		return EXIT_USAGE;
	}
	if (d->cfg.state_file[0] && !getenv("EDGELM_TUNING_STATE"))
		snprintf(d->tpaths.state_file, sizeof(d->tpaths.state_file), "%.511s",
			 d->cfg.state_file);
	if (cl->no_cpufreq) {
		/* The unit's privileged helper owns governor and EPP and their state
		 * file; the daemon keeps its own, so it never mistakes the helper's
		 * file for a crash to undo. */
		snprintf(d->cfg.governor, sizeof(d->cfg.governor), "keep");
		snprintf(d->cfg.epp, sizeof(d->cfg.epp), "keep");
		size_t l = strlen(d->tpaths.state_file);
		if (l + 8 < sizeof(d->tpaths.state_file))
			memcpy(d->tpaths.state_file + l, ".daemon", 8);
	}
	if ((cl->mode == MODE_SERVE || cl->mode == MODE_CHECK_CONFIG) &&
	    daemon_config_validate(&d->cfg, &err) != 0) {
		log_err("%s", err.msg);
		return EXIT_USAGE;
	}
	return -1;
}

static int restore_only(struct daemon *d)
{
	struct cm_err err = {0};
	struct tuning_state st;
	tuning_state_init(&st);
	int r = tuning_restore_from_file(&d->tpaths, &st, &err);
	tuning_state_print(stdout, &st);
	tuning_state_fini(&st);
	if (r) {
		fprintf(stderr, "edgelmd: --restore-tuning: %s\n", err.msg);
		return EXIT_RUNTIME;
	}
	return 0;
}

/* ---- start steps ------------------------------------------------------------------ */

/* Each step's start returns 0 or an exit code (having logged why); the
 * steps that started are stopped in exact reverse order. */
struct step {
	const char *name;
	int (*start)(struct daemon *d);
	void (*stop)(struct daemon *d);
};

static int g_sfd = -1;

/* CPU detection and the plan; the model file must be readable. */
static int start_detect(struct daemon *d)
{
	struct cm_err err = {0};
	struct tuning_config tc;
	to_tuning_config(&d->cfg, &tc);
	tc.model_bytes = d->cfg.model[0] ? file_size(d->cfg.model) : 0;
	if (tuning_detect(&d->tpaths, &d->treport, &err) != 0 ||
	    tuning_plan_make(&d->treport, &tc, &d->tplan, &err) != 0) {
		log_err("tuning: %s", err.msg);
		return EXIT_USAGE;
	}
	return 0;
}

/* A clear message before anything is mapped: errno, or what the path is. */
static int check_model_file(struct daemon *d)
{
	struct stat st;
	const char *why = NULL;
	if (stat(d->cfg.model, &st) != 0)
		why = strerror(errno);
	else if (S_ISDIR(st.st_mode))
		why = "a directory, not a GGUF file";
	else if (!S_ISREG(st.st_mode))
		why = "not a regular file (a device, FIFO or socket cannot be mapped)";
	else if (st.st_size == 0)
		why = "the file is empty";
	else if (access(d->cfg.model, R_OK) != 0)
		why = strerror(errno);
	if (why) {
		log_err("cannot read model %s: %s", d->cfg.model, why);
		return EXIT_MODEL;
	}
	return 0;
}

static int start_model_file(struct daemon *d)
{
	int rc = check_model_file(d);
	if (rc)
		return rc;
	daemon_notify_init();
	return 0;
}

/* Signals: blocked before any thread exists, read from a signalfd. */
static int start_signals(struct daemon *d)
{
	(void)d;
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	g_sfd = signalfd(-1, &sigs, SFD_CLOEXEC);
	if (g_sfd < 0) {
		log_err("signalfd: %s", strerror(errno));
		return EXIT_RUNTIME;
	}
	return 0;
}

static void stop_signals(struct daemon *d)
{
	(void)d;
	close(g_sfd);
	g_sfd = -1;
}

static int start_tuning(struct daemon *d)
{
	struct cm_err err = {0};
	tuning_apply(&d->tplan, &d->tpaths, &d->tstate, &err);
	d->tuning_applied = true;
	log_tuning_changes(&d->tstate);
	log_info("tuning: %d workers (%s)", d->tplan.n_workers, d->tplan.threads_note);
	return 0;
}

static void stop_tuning(struct daemon *d)
{
	struct cm_err err = {0};
	if (tuning_restore(&d->tstate, &d->tpaths, &err) != 0)
		log_warning("tuning restore: %s", err.msg);
}

static void stop_monitor(struct daemon *d);

/* The monitor before the model, so the load itself is observed. Serving
 * without metrics beats not serving: its failures are warnings, but for an
 * endpoint that cannot be bound (metrics_bind_required). */
static int start_monitor(struct daemon *d)
{
	struct cm_err err = {0};
	struct monitor_params mp;
	monitor_params_default(&mp);
	mp.interval_ms = d->cfg.monitor_interval_ms;
	mp.textfile_path = d->cfg.metrics_textfile[0] ? d->cfg.metrics_textfile : NULL;
	mp.on_flag = on_flag;
	mp.worker_prefix = "edgelm:w";
	if (monitor_new(&mp, &d->mon, &err) != 0 || monitor_start(d->mon, &err) != 0) {
		log_warning("monitor: %s; serving without metrics", err.msg);
		monitor_free(d->mon);
		d->mon = NULL;
		return 0;
	}
	d->mi = monitor_inference_get(d->mon);
	d->fam_requests = d->mi->requests;
	monitor_gauge_set(d->mi->loading, 1);
	if (d->cfg.peak_bandwidth_gbs > 0)
		monitor_gauge_set(d->mi->peak_bandwidth, d->cfg.peak_bandwidth_gbs * 1e9);
	daemon_metrics_init(d);
	if (strcmp(d->cfg.metrics_listen, "off") != 0 &&
	    monitor_http_start(d->mon, d->cfg.metrics_listen, &err) != 0) {
		/* a scraper would see a dead target, or another process' metrics */
		if (d->cfg.metrics_bind_required) {
			log_err("metrics endpoint %s: %s (set metrics_bind_required no to serve "
				"without it)",
				d->cfg.metrics_listen, err.msg);
			stop_monitor(d); /* a step that fails is not stopped */
			return EXIT_RUNTIME;
		}
		log_warning("metrics endpoint %s: %s; ignoring", d->cfg.metrics_listen, err.msg);
	}
	return 0;
}

static void stop_monitor(struct daemon *d)
{
	if (!d->mon)
		return;
	monitor_http_stop(d->mon);
	monitor_stop(d->mon);
	monitor_free(d->mon);
	d->mon = NULL;
	d->mi = NULL;
	d->fam_requests = NULL;
	d->fam_build_info = d->fam_model_info = NULL;
	d->build_info = d->model_info = NULL;
}

/* What quantizing on load did and cost. */
static void log_quantize(struct daemon *d)
{
	const struct engine_model_info *mi = &d->minfo;
	if (!mi->quant_requested[0])
		return;
	if (mi->n_quantized) {
		struct engine_region wr;
		uint64_t rss = 0, huge = 0;
		engine_model_region(d->model, &wr);
		(void)tuning_memory_rss(&d->tpaths, wr.addr, wr.len, &rss, &huge, NULL);
		log_info("quantize: %u tensors to %s in %.1f s: %.1f MiB in the file -> %.1f MiB "
			 "of private memory (%.1f MiB resident)",
			 mi->n_quantized, mi->quant_requested, mi->quant_seconds,
			 (double)mi->quant_bytes_in / (1 << 20),
			 (double)mi->quant_bytes_out / (1 << 20), (double)rss / (1 << 20));
	}
	if (mi->quant_note[0])
		log_info("quantize %s: %s", mi->quant_requested, mi->quant_note);
}

static void log_model(struct daemon *d)
{
	enum engine_kv_type kvt = engine_ctx_kv_type(d->ctx);
	uint64_t kv = engine_model_kv_bytes_per_token(d->model, kvt) * d->cfg.ctx_size *
		      d->cfg.parallel;
	log_info("model %s: %s, %u layers, %u ctx x %u sequences (%.1f MiB of %s KV), "
		 "kernels %s, %d threads",
		 d->model_name, d->minfo.arch, d->minfo.n_layer, d->cfg.ctx_size, d->cfg.parallel,
		 (double)kv / (1 << 20), engine_kv_type_name(kvt), d->minfo.isa,
		 d->minfo.n_threads);
	log_quantize(d);
	if (!d->minfo.n_x16_tensors)
		return;
	struct engine_region wr;
	uint64_t rss = 0, huge = 0;
	engine_model_region(d->model, &wr);
	if (d->minfo.weights_anon)
		(void)tuning_memory_rss(&d->tpaths, wr.addr, wr.len, &rss, &huge, NULL);
	if (d->minfo.weights_cached)
		log_info("repack: %u tensors in the kernels' x16 layout (%.1f MiB), mapped from "
			 "the repack cache: %s",
			 d->minfo.n_x16_tensors, (double)d->minfo.x16_bytes / (1 << 20),
			 d->minfo.repack_cache_note);
	else
		log_info("repack: %u tensors in the kernels' x16 layout, %.1f MiB of private "
			 "memory (repack=off keeps the file's pages shared); weights in %s, "
			 "%.1f MiB in huge pages%s%s",
			 d->minfo.n_x16_tensors, (double)d->minfo.x16_bytes / (1 << 20),
			 d->minfo.weights_anon ? "anonymous memory" : "the file mapping",
			 (double)huge / (1 << 20), d->minfo.repack_cache_note[0] ? "; repack cache: " : "",
			 d->minfo.repack_cache_note);
}

static int start_model(struct daemon *d)
{
	struct cm_err err = {0};
	daemon_notify_status("loading %s", d->cfg.model);
	daemon_notify_extend_timeout(load_timeout_usec(&d->cfg));
	set_model_name(d);
	(void)tuning_load_begin(&d->tplan, &d->tstate, NULL);
	int r = load_model(d, &d->model, &d->ctx, &err);
	(void)tuning_load_end(&d->tstate, NULL);
	if (r) {
		log_err("%s: %s", d->cfg.model, err.msg);
		return r == -ENOMEM ? EXIT_MEMORY : EXIT_MODEL;
	}
	engine_model_get_info(d->model, &d->minfo);
	snprintf(d->kv_type_name, sizeof(d->kv_type_name), "%s",
		 engine_kv_type_name(engine_ctx_kv_type(d->ctx)));
	/* what the context holds: ctx_size, or the model's, capped by kv_budget_mib */
	d->cfg.ctx_size = engine_ctx_n_ctx(d->ctx);
	log_model(d);
	return 0;
}

static void stop_model(struct daemon *d)
{
	engine_ctx_free(d->ctx);
	engine_model_free(d->model);
	d->ctx = NULL;
	d->model = NULL;
}

/* Huge pages, then locking and prefaulting the weights and the KV cache. */
static int start_memory(struct daemon *d)
{
	if (d->cfg.tuning && d->cfg.hugepages)
		copy_to_hugepages(d);
	if (lock_memory(d) != 0)
		return EXIT_MLOCK;
	update_tuning_json(d);
	if (d->mi) {
		monitor_gauge_set(d->mi->loading, 0);
		monitor_gauge_set(d->mi->workers, d->minfo.n_threads);
		monitor_gauge_set(d->mi->kv_capacity, (double)d->cfg.ctx_size * d->cfg.parallel);
	}
	daemon_metrics_model(d);
	return 0;
}

static int start_scheduler(struct daemon *d)
{
	struct cm_err err = {0};
	if (sched_new(d, &d->sched, &err) != 0 || sched_start(d->sched, &err) != 0) {
		log_err("%s", err.msg);
		return EXIT_RUNTIME;
	}
	return 0;
}

static void stop_scheduler(struct daemon *d)
{
	sched_free(d->sched);
	d->sched = NULL;
}

/* The listener's self-check reports through the daemon's log. */
static void on_ipc_event(void *ud, int level, const char *msg)
{
	(void)ud;
	daemon_log(level, NULL, "%s", msg); /* the server's messages name it */
}

/* Counters of the listener's self-check, mirrored from its stats. */
static void add_ipc_metrics(struct daemon *d)
{
	static const struct {
		const char *name, *help;
	} fams[] = {
	    {"edgelm_ipc_selfcheck_failures_total",
	     "round trips of the socket's self-check that failed"},
	    {"edgelm_ipc_listener_recoveries_total",
	     "listeners closed and re-created after failing the self-check"},
	};
	monitor_series **dst[] = {&d->ipc_selfcheck_failures, &d->ipc_recoveries};
	for (size_t i = 0; d->mon && i < CM_ARRAY_LEN(fams); i++) {
		struct monitor_family_desc fd = {.type = MONITOR_TYPE_COUNTER,
						 .name = fams[i].name,
						 .help = fams[i].help};
		monitor_family *f = NULL;
		if (monitor_family_add(d->mon, &fd, &f, NULL) == 0)
			(void)monitor_series_get(f, NULL, dst[i], NULL);
	}
}

/* Before anything big is loaded: nng must be able to start its threads. */
static int start_ipc_preflight(struct daemon *d)
{
	(void)d;
	struct cm_err err = {0};
	if (ipc_preflight(&err) != 0) {
		log_err("%s", err.msg);
		return EXIT_RUNTIME;
	}
	return 0;
}

/* The socket, then the HTTP front; READY=1 only once both are bound. */
static int start_socket(struct daemon *d)
{
	struct cm_err err = {0};
	const char *urls[DAEMON_MAX_LISTEN];
	for (int i = 0; i < d->cfg.n_listen; i++)
		urls[i] = d->cfg.listen[i];
	struct ipc_server_params sp = {
		.urls = urls,
		.n_urls = (size_t)d->cfg.n_listen,
		.socket_mode = (int)d->cfg.socket_mode,
		.socket_group = d->cfg.socket_group[0] ? d->cfg.socket_group : NULL,
		/* nng 1.5.2 can stop taking connections for good (#1518): the
		 * server checks its listeners and re-creates one that fails */
		.selfcheck_ms = IPC_SELFCHECK_DEFAULT_MS,
		.on_event = on_ipc_event,
		.on_reply = daemon_count_reply,
		.tls_cert_file = d->cfg.tls_cert_file,
		.tls_key_file = d->cfg.tls_key_file,
		.tls_ca_file = d->cfg.tls_ca_file,
	};
	sp.limits.max_msg_bytes = (size_t)d->cfg.max_msg_kib * 1024;
	ipc_server *srv = NULL;
	if (ipc_server_new(&sp, daemon_handle_call, d, &srv, &err) != 0 ||
	    ipc_server_start(srv, &err) != 0) {
		log_err("%s", err.msg);
		ipc_server_free(srv);
		return EXIT_RUNTIME;
	}
	/* the scheduler thread reads it for the watchdog */
	__atomic_store_n(&d->srv, srv, __ATOMIC_RELEASE);
	if (err.code)
		log_warning("%s; ignoring", err.msg);
	add_ipc_metrics(d);
	for (int i = 0; i < d->cfg.n_listen; i++) {
		const char *u = d->cfg.listen[i];
		log_notice("serving %s on %s", d->model_name, u);
		/* network listeners anyone on the network may reach: say so */
		if (strncmp(u, "tcp://", 6) == 0)
			log_warning("%s: tcp:// clients are not authenticated (anyone who reaches "
			            "it can generate); use tls+tcp:// with tls_ca_file",
			            u);
		else if (strncmp(u, "tls+tcp://", 10) == 0 && !d->cfg.tls_ca_file[0])
			log_warning("%s: no tls_ca_file: TLS clients are not authenticated "
			            "(identity tls:anonymous)",
			            u);
	}
	return 0;
}

static void stop_socket(struct daemon *d)
{
	int left = ipc_server_stop(d->srv, 2000);
	if (left)
		log_warning("%d calls still open at shutdown", left);
	/* calls the scheduler still holds are completed by sched_free, harmlessly */
}

/* http/ reaches the op handlers through the socket's server (one request
 * core, two transports). */
static int http_submit(void *core, const char *json, size_t len, const char *identity,
		       http_done_fn done, void *ud)
{
	struct daemon *d = core;
	/* the front serves from before the model loads: 503 until the core is up */
	ipc_server *srv = __atomic_load_n(&d->srv, __ATOMIC_ACQUIRE);
	if (!srv)
		return -EAGAIN;
	return ipc_server_submit(srv, json, len, identity, done, ud);
}

static int start_http(struct daemon *d)
{
	if (d->cfg.n_http_listen == 0)
		return 0;
	struct cm_err err = {0};
	const char *addrs[DAEMON_MAX_LISTEN];
	for (int i = 0; i < d->cfg.n_http_listen; i++)
		addrs[i] = d->cfg.http_listen[i];
	struct http_params hp = {
		.listen = addrs,
		.n_listen = (size_t)d->cfg.n_http_listen,
		.api_key_file = d->cfg.http_api_key_file,
		.max_connections = d->cfg.http_max_connections,
		/* the socket's message limit, and room for OpenAI's envelope */
		.max_body_bytes = (size_t)d->cfg.max_msg_kib * 1024 + 64 * 1024,
		.rate_limit = d->cfg.http_rate_limit,
		.cors_origin = d->cfg.http_cors_origin,
		.submit = http_submit,
		.core = d,
	};
	if (http_front_start(&hp, &d->http, &err) != 0) {
		log_err("%s", err.msg);
		return EXIT_RUNTIME;
	}
	for (int i = 0; i < d->cfg.n_http_listen; i++)
		log_notice("HTTP on %s (port %u)%s; 503 until the model is loaded",
			   d->cfg.http_listen[i], http_front_port(d->http, (size_t)i),
			   d->cfg.http_api_key_file[0] ? ", API keys required" : "");
	return 0;
}

/* Every connection closed; their generations were drained before, and
 * what came since was answered 503. */
static void stop_http(struct daemon *d)
{
	http_front_stop(d->http);
	d->http = NULL;
}

static int start_ready(struct daemon *d)
{
	atomic_store(&d->phase, PHASE_READY);
	daemon_notify_ready();
	daemon_notify_status("ready: %s", d->model_name);
	return 0;
}

/* Drain while both transports are up: running generations finish and
 * their streams are collected over the socket and HTTP alike. */
static void stop_ready(struct daemon *d)
{
	if (!d->sched || !d->srv)
		return;
	daemon_notify_stopping();
	atomic_store(&d->phase, PHASE_DRAINING);
	http_front_drain(d->http);
	sched_stop(d->sched, d->cfg.drain_timeout_ms);
}

static void stop_hugepages(struct daemon *d)
{
	if (d->hpbuf.addr)
		tuning_hugepage_free(&d->hpbuf);
}

static const struct step steps[] = {
	{"detect", start_detect, NULL},
	{"model file", start_model_file, NULL},
	{"ipc preflight", start_ipc_preflight, NULL},
	{"signals", start_signals, stop_signals},
	{"tuning", start_tuning, stop_tuning},
	{"monitor", start_monitor, stop_monitor},
	/* HTTP from before the load, answering 503 while the model loads, as
	 * HTTP clients and load balancers expect (the socket binds last) */
	{"http", start_http, stop_http},
	/* start_memory may copy the weights to huge pages: the copy is freed
	 * once the model that points into it is */
	{"hugepages", NULL, stop_hugepages},
	{"model", start_model, stop_model},
	{"memory", start_memory, NULL},
	{"scheduler", start_scheduler, stop_scheduler},
	{"socket", start_socket, stop_socket},
	{"ready", start_ready, stop_ready},
};

/* ---- running ---------------------------------------------------------------------- */

static void status_line(struct daemon *d)
{
	int running, queued;
	double tps;
	sched_counts(d->sched, &running, &queued, &tps);
	char flags[128] = "";
	if (d->mon) {
		struct monitor_flag_state fl[MONITOR_FLAG_COUNT];
		monitor_flags_get(d->mon, fl);
		for (int i = 0; i < MONITOR_FLAG_COUNT; i++)
			if (fl[i].on) {
				size_t l = strlen(flags);
				snprintf(flags + l, sizeof(flags) - l, " %s",
					 monitor_flag_name((enum monitor_flag)i));
			}
	}
	if (d->mi)
		monitor_gauge_set(d->mi->queued, queued);
	if (d->srv && d->ipc_recoveries) {
		struct ipc_server_stats st;
		ipc_server_stats_get(d->srv, &st);
		monitor_counter_set(d->ipc_selfcheck_failures, (double)st.selfcheck_failures);
		monitor_counter_set(d->ipc_recoveries, (double)st.listener_recoveries);
	}
	daemon_notify_status("%s: %d running, %d queued, %.1f tok/s%s%s", d->model_name, running,
			     queued, running ? tps : 0.0, flags[0] ? ";" : "", flags);
}

/* Signals, and a STATUS= line every few seconds, until SIGTERM/SIGINT. */
static void serve(struct daemon *d)
{
	for (;;) {
		struct pollfd pfd = {.fd = g_sfd, .events = POLLIN};
		if (poll(&pfd, 1, 2000) <= 0) {
			status_line(d);
			continue;
		}
		struct signalfd_siginfo si;
		if (read(g_sfd, &si, sizeof(si)) != sizeof(si))
			continue;
		if (si.ssi_signo == SIGHUP) {
			reload(d);
		} else if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			log_notice("%s: shutting down (drain up to %u ms)",
				   si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT",
				   d->cfg.drain_timeout_ms);
			return;
		}
	}
}

int main(int argc, char **argv)
{
	static struct daemon dd;
	struct daemon *d = &dd;
	struct cmdline cl;
	int rc = parse_args(argc, argv, &cl, &g_ov);
	if (rc >= 0)
		return rc;
	if ((rc = configure(d, &cl)) >= 0)
		return rc;
	if (cl.mode == MODE_RESTORE)
		return restore_only(d);
	if (cl.mode == MODE_TUNE_CPUFREQ)
		return tune_cpufreq_only(d);
	if (cl.mode == MODE_CHECK_CONFIG) {
		if ((rc = check_model_file(d)) == 0)
			printf("edgelmd: %s: configuration OK\n", cl.config_path);
		return rc;
	}

	tuning_report_init(&d->treport);
	tuning_plan_init(&d->tplan);
	tuning_state_init(&d->tstate);
	pthread_mutex_init(&d->mu, NULL);
	atomic_store(&d->phase, PHASE_LOADING);
	rc = 0;
	size_t n = 0;
	if (cl.mode == MODE_CHECK) {
		if ((rc = start_detect(d)) == 0)
			tuning_report_print(stdout, &d->treport, &d->tplan);
	} else {
		for (; n < CM_ARRAY_LEN(steps) && rc == 0; n++)
			if (steps[n].start)
				rc = steps[n].start(d);
		if (rc == 0)
			serve(d);
		else
			n--; /* the step that failed has nothing to stop */
		while (n-- > 0)
			if (steps[n].stop)
				steps[n].stop(d);
		ipc_server_free(d->srv);
	}
	if (rc == 0 && cl.mode == MODE_SERVE)
		log_notice("stopped");
	cm_free(d->tuning_json);
	tuning_state_fini(&d->tstate);
	tuning_plan_fini(&d->tplan);
	tuning_report_fini(&d->treport);
	return rc;
}
