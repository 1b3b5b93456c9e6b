/* daemon/daemon.h: the daemon's shared state, wired by main.c.
 *
 * Threads: the main thread reads signals (signalfd) and runs start/stop;
 * the scheduler thread (sched.c) owns the engine and every sequence; nng's
 * threads run the IPC handler (ops.c: daemon_handle_call), which parses,
 * looks up and hands work on; text workers (textpool.c) tokenize; a sender
 * thread (outbox.c) encodes and sends the scheduler's replies; the monitor
 * runs its own sampling thread. `mu` guards everything the handler and the
 * scheduler share (daemon/serve.h says what). */
#ifndef EDGELM_DAEMON_H
#define EDGELM_DAEMON_H

#include "daemon/config.h"
#include "engine/engine.h"
#include "http/http.h"
#include "ipc/ipc.h"
#include "monitor/monitor.h"
#include "tuning/tuning.h"

#include <pthread.h>
#include <stdatomic.h>

#define EDGELM_VERSION "0.1.0"

struct daemon_request;
struct sched;

enum daemon_phase { PHASE_LOADING, PHASE_READY, PHASE_DRAINING, PHASE_STOPPED };

struct daemon {
	struct daemon_config cfg;       /* in force (ctx_size as the model allowed, ...) */
	struct daemon_config cfg_given; /* as configured: what a reload compares with */
	const char *config_path;

	/* tuning */
	struct tuning_paths tpaths;
	struct tuning_report treport;
	struct tuning_plan tplan;
	struct tuning_state tstate;
	bool tuning_applied;
	char *tuning_json; /* for info, under mu */

	/* engine, owned by the scheduler thread once it runs */
	engine_model *model;
	engine_ctx *ctx;
	struct engine_model_info minfo;
	struct tuning_hugepage_buf hpbuf; /* the weights' copy when hugepages is on */
	char model_name[256];
	char kv_type_name[16];
	char quant_list[512];

	/* serving */
	ipc_server *srv;
	http_front *http; /* NULL: http_listen is empty */
	monitor *mon;
	const struct monitor_inference *mi;
	monitor_family *fam_requests;
	monitor_series *ipc_selfcheck_failures; /* from ipc_server_stats, each STATUS= */
	monitor_series *ipc_recoveries;
	monitor_family *fam_build_info, *fam_model_info; /* metrics.c */
	monitor_series *build_info, *model_info;         /* the label sets in force */

	struct sched *sched;
	pthread_mutex_t mu;
	_Atomic int phase;      /* enum daemon_phase */
	_Atomic bool reloading; /* a new model loads while the old one serves */
};

/* sched.c */
int sched_new(struct daemon *d, struct sched **ret, struct cm_err *err);
int sched_start(struct sched *s, struct cm_err *err);
/* Drain: queued requests get shutting_down; running ones finish within
 * timeout_ms, then are cancelled; streams stay pollable until delivered or
 * idle for stream_idle_ms. Returns when every stream has gone and the
 * scheduler, text and sender threads have exited. */
void sched_stop(struct sched *s, unsigned timeout_ms);
void sched_free(struct sched *s);
/* Take tenant_weights and admin_uids from d->cfg (start, reload; under
 * d->mu after the start). */
int sched_apply_config(struct sched *s, struct cm_err *err);
/* Ask the scheduler thread to swap in a new model between steps once the
 * running sequences have finished (SIGHUP). Ownership of m and c passes to
 * the scheduler. */
void sched_swap_model(struct sched *s, engine_model *m, engine_ctx *c);
/* Counts for STATUS= lines and metrics. */
void sched_counts(struct sched *s, int *ret_running, int *ret_queued, double *ret_tok_s);

/* The IPC handler (registered with ipc_server_new; userdata = daemon). */
void daemon_handle_call(ipc_call *call, void *userdata);

/* metrics.c: the daemon's own metrics (docs/monitor.md, "The daemon").
 * daemon_metrics_init adds the families once the monitor exists;
 * daemon_metrics_model sets edgelm_build_info and edgelm_model_info to the
 * model in force (after the load and after each swap; takes d->mu). */
void daemon_metrics_init(struct daemon *d);
void daemon_metrics_model(struct daemon *d);
/* The server's on_reply: every reply counted once in
 * edgelm_requests_total{op,outcome} (ipc_reply_fn; userdata = daemon). */
void daemon_count_reply(void *userdata, enum ipc_op op, enum ipc_errcode code);
/* The `outcome` label of a reply: "ok" or the error code's name. */
const char *daemon_outcome_name(enum ipc_errcode code);

#endif
