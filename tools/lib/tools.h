/* tools/lib/tools.h: code shared by the command-line tools. */
#ifndef EDGELM_TOOLS_H
#define EDGELM_TOOLS_H

#include "common/common.h"
#include "engine/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- quant_report.c: quantizing on load (engine_params.quantize) -------- */

/* "PROG: quantized N tensors to T on load in S s: A MiB -> B MiB" and the
 * info's note, on o; nothing when no quantizing was asked for. */
void tools_quant_report(FILE *o, const char *prog, const struct engine_model_info *in);
/* The same as `"quantize":{...}` (requested "" when none was asked for). */
void tools_quant_json(FILE *o, const struct engine_model_info *in);

/* ---- mkmodel.c --------------------------------------------------------------- */

/* `edgelm-gguf mkmodel ...`: write a synthetic model of a named real shape.
 * argv[0] is "mkmodel". Returns the process exit code. */
int tools_mkmodel_main(int argc, char **argv);
void tools_mkmodel_usage(FILE *o);

/* `edgelm-bench --daemon URL ...`: load a running daemon with concurrent
 * clients (tools/lib/bench_daemon.c). Returns the process exit code. */
int tools_bench_daemon_main(int argc, char **argv);
void tools_bench_daemon_usage(FILE *o);

/* ---- json_out.c --------------------------------------------------------------- */

/* s as a JSON string, quotes included (s is UTF-8; NULL prints ""). */
void tools_json_str(FILE *o, const char *s);
/* The same for n bytes (which may hold NUL: escaped as \u0000) */
void tools_json_strn(FILE *o, const char *s, size_t n);

/* ---- bench_tokenize.c: `edgelm-bench --tokenize` ---------------------------- */

struct tools_tokbench_params {
	const char *model; /* a model or a vocab-only GGUF (any architecture) */
	const char *text;  /* text file, NULL: the held-out stories, else synthetic */
	double text_mb;    /* repeat the text up to this many MB (10^6 bytes); 0: once */
	int reps;          /* passes over the text, best kept */
	bool json;
};
/* Encode and decode speed of the model's tokenizer. Returns the exit code. */
int tools_bench_tokenize(const struct tools_tokbench_params *p);

/* ---- bench_tuning.c: edgelm-bench's tuning switches -------------------------- */

struct tools_tuning_want {
	bool pin;       /* workers pinned, one per physical core (the tuning plan) */
	bool hugepages; /* weights copied to 2 MiB-aligned anonymous memory */
	bool prefault;  /* weights and KV cache populated before timing */
	bool mlock;     /* weights and KV cache locked; one warning if not allowed */
};
struct tools_tuning;

/* Detect the box and make the tuning plan for `model` (its size) and
 * `threads` (0: one per usable physical core). A failed detection is not an
 * error: every wanted switch is then reported as failed with the reason.
 * -ENOMEM only. */
int tools_tuning_new(const struct tools_tuning_want *w, const char *model, int threads,
		     struct tools_tuning **ret, struct cm_err *err);
/* After engine_model_free: the huge-page copy is freed here. NULL-safe. */
void tools_tuning_free(struct tools_tuning *t);
/* Threads and, with --pin, the plan's cpu list for engine_model_load. */
void tools_tuning_engine_params(const struct tools_tuning *t, struct engine_params *ep);
/* Whether workers are to be pinned, and where worker i goes (-1: anywhere). */
bool tools_tuning_pinned(const struct tools_tuning *t);
int tools_tuning_worker_cpu(const struct tools_tuning *t, int i);
/* After engine_ctx_new, before anything is timed: the huge-page copy, the
 * lock, the prefault, in edgelmd's order; then the weights' residency. */
void tools_tuning_apply(struct tools_tuning *t, engine_model *m, engine_ctx *c);
/* After the runs: check what the kernel did (each worker's affinity, the
 * copy's huge pages, VmLck) and read the memory figures. */
void tools_tuning_check(struct tools_tuning *t, engine_model *m);
/* Bytes of the weights in huge pages (after tools_tuning_check): the
 * hugepages copy's, or the engine's own copy when repacking made one. */
uint64_t tools_tuning_huge_bytes(const struct tools_tuning *t);
/* The report: lines for the table, or `"tuning":{...},"memory":{...}`.
 * The memory figures are of the moment of tools_tuning_check; the peaks
 * are the bench's own (tools_mem_*), which keep its bandwidth buffer out. */
void tools_tuning_print(const struct tools_tuning *t, FILE *o);
void tools_tuning_json(const struct tools_tuning *t, FILE *o);

/* This process's VmRSS and VmHWM (the peak RSS), bytes, from
 * /proc/self/status: 0, or -errno (*ret zeroed) when unreadable. */
struct tools_mem {
	uint64_t rss, hwm;
};
int tools_mem_read(struct tools_mem *ret);
/* Reset VmHWM to the current RSS (writes "5" to /proc/self/clear_refs,
 * Linux 4.0 on), checked by reading it back: 0, or -errno with the reason
 * in err (no clear_refs, not writable, or accepted but VmHWM stayed). */
int tools_mem_hwm_reset(struct cm_err *err);

/* ---- readfile.c ---------------------------------------------------------- */

/* The whole of a text file ("-": stdin) of at most `max` bytes, without NUL,
 * NUL-terminated in *ret_text (cm_free it); its length in *ret_len (may be
 * NULL). 0, or -errno with a message naming the path. */
int tools_read_file(const char *path, size_t max, char **ret_text, size_t *ret_len,
		    struct cm_err *err);

/* ---- numeric arguments (args.c) ----------------------------------------- */

/* All of s as a base-10 number within [lo, hi]: 0, else -1 (*ret unset). */
int tools_parse_long(const char *s, long lo, long hi, long *ret);
/* All of s as a finite number within [lo, hi] (strtod's syntax): 0, else
 * -1 (*ret unset). The float form checks the range before rounding. */
int tools_parse_double(const char *s, double lo, double hi, double *ret);
int tools_parse_float(const char *s, float lo, float hi, float *ret);
/* The same for option `opt` of program `prog`; on failure says "PROG: OPT:
 * 'S' is not a whole number from LO to HI" on stderr and returns -1. The
 * int form wants [lo, hi] within int's range. */
int tools_opt_long(const char *prog, const char *opt, const char *s, long lo, long hi, long *ret);
int tools_opt_int(const char *prog, const char *opt, const char *s, long lo, long hi, int *ret);
/* A comma-separated list of such numbers ("128,512") into out[]: the
 * count, at most max_n (an empty string is the empty list where
 * allow_empty, else an error), or -1 with a message naming what is wrong
 * (an empty entry as in "8,,16", too many values, a bad number). */
int tools_opt_list(const char *prog, const char *opt, const char *s, long lo, long hi, int *out,
		   bool allow_empty, int max_n);

#endif
