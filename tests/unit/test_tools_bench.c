/* tests/unit/test_tools_bench.c: edgelm-bench's tuning switches and its
 * tokenizer benchmark, end to end, on a small synthetic model
 * (`edgelm-gguf mkmodel --shape small`, 1.8 MiB: big enough that the load
 * leaves most of the weights unmapped, so prefault shows).
 * - with no switch every knob is "off";
 * - each switch alone is "applied", with the kernel's evidence in the JSON
 *   (each worker's affinity, the copy's RSS, the weights' residency, VmLck),
 *   and the others stay "off": a switch that were parsed but ignored would
 *   stay "off" or lack the evidence;
 * - --tuning on is edgelmd's default set (pin, prefault, mlock);
 * - refusals are "failed" with the reason, and the run still measures: mlock
 *   under a 64 KiB RLIMIT_MEMLOCK without CAP_IPC_LOCK (one warning), pinning
 *   to cpus this box lacks (a fake big.LITTLE tree: the engine pins
 *   best-effort, the bench must notice), huge pages with THP `never`;
 * - --tokenize on vocab-only GGUFs and on a model, from a file, from the
 *   held-out stories and from the synthetic text;
 * - the figures users compare: time to first token per prompt length, the
 *   load's time and peak RSS, and a peak RSS that leaves out the bench's
 *   own bandwidth buffer (a 4x bigger buffer raises the process's peak by
 *   the difference and the model's not at all). Relations that hold
 *   whatever the box's speed, no timings;
 * - --grammar-file: the side-by-side decode with and without the grammar
 *   is reported, and a bad grammar exits 2 naming its line;
 * - --json-schema: the same with a schema's grammar; a schema outside the
 *   subset exits 2 naming its JSON pointer, and both options at once are a
 *   usage error. */
#include "common/common.h"
#include "tests/test.h"

#include <jansson.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

static char build_dir[512], tmp[1024], model[1100];

static const char *bin(const char *name)
{
	static char b[2][600];
	static int k;
	k ^= 1;
	snprintf(b[k], sizeof(b[k]), "%s/bin/%s", build_dir, name);
	return b[k];
}

static bool setup(void)
{
	if (model[0])
		return true;
	const char *b = getenv("BUILD");
	snprintf(build_dir, sizeof(build_dir), "%s", b && *b ? b : "build");
	snprintf(tmp, sizeof(tmp), "%s/bench_tool.%d", test_tmpdir(), (int)getpid());
	snprintf(model, sizeof(model), "%s/small.gguf", tmp);
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && %s mkmodel --shape small -o '%s' 2>&1", tmp,
	         bin("edgelm-gguf"), model);
	int rc = test_run_capture(cmd, &out);
	free(out);
	if (rc != 0) {
		model[0] = '\0';
		return false;
	}
	return true;
}

/* edgelm-bench on the small model, short runs, --json; `pre` is put
 * before the command (environment, wrappers), `args` after. Returns the
 * parsed object (NULL on failure, with a CHECK); stderr goes to *ret_err
 * when asked. --repack off: repacking writes every Q4_0 weight at load,
 * which would make them resident whether --prefault works or not. */
static json_t *bench(const char *pre, const char *args, char **ret_err)
{
	if (!setup()) {
		CHECK_MSG(false, "edgelm-gguf mkmodel failed");
		return NULL;
	}
	char cmd[16384], errf[4200], *out = NULL;
	snprintf(errf, sizeof(errf), "%s/stderr", tmp);
	snprintf(cmd, sizeof(cmd),
	         "%s %s -m '%s' --repack off --bw-mib 16 --reps 1 --prompts 8 --contexts 0 -n 4 "
	         "--json %s 2>'%s'",
	         pre, bin("edgelm-bench"), model, args, errf);
	int rc = test_run_capture(cmd, &out);
	CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
	json_error_t je;
	json_t *j = json_loads(out, 0, &je);
	CHECK_MSG(j != NULL, "%s: not JSON: %s", args, out);
	free(out);
	if (ret_err) {
		FILE *f = fopen(errf, "r");
		size_t n = 0;
		*ret_err = calloc(1, 65536);
		if (f) {
			n = fread(*ret_err, 1, 65535, f);
			fclose(f);
		}
		(*ret_err)[n] = '\0';
	}
	return j;
}

static const char *status(json_t *j, const char *knob)
{
	const char *s = json_string_value(
	    json_object_get(json_object_get(json_object_get(j, "tuning"), knob), "status"));
	return s ? s : "(missing)";
}

static const char *reason(json_t *j, const char *knob)
{
	const char *s = json_string_value(
	    json_object_get(json_object_get(json_object_get(j, "tuning"), knob), "reason"));
	return s ? s : "";
}

static uint64_t mem(json_t *j, const char *key)
{
	return (uint64_t)json_integer_value(json_object_get(json_object_get(j, "memory"), key));
}

static double num_of(json_t *j, const char *key)
{
	return json_number_value(json_object_get(j, key));
}

/* The load and peak figures, and how they bound each other: the load's
 * peak is within the run's (VmHWM only rises after the reset), the RSS at
 * the end within the peak, the process's peak (the bandwidth buffer in)
 * at least the model's. MiB printed to 0.1. */
static void check_memory(json_t *j)
{
	double load_peak = num_of(j, "load_peak_rss_mib"), load_rss = num_of(j, "load_rss_mib");
	double peak = num_of(j, "peak_rss_mib"), proc = num_of(j, "process_peak_rss_mib");
	double bw = num_of(j, "bw_buffer_mib"), rss = mem(j, "rss_bytes") / 1048576.0;
	CHECK(num_of(j, "load_ms") > 0);
	CHECK_MSG(load_peak > 0 && load_rss > 0 && load_rss <= load_peak + 0.1,
		  "load: peak %g MiB, after %g", load_peak, load_rss);
	CHECK_MSG(load_peak <= peak + 0.1, "load peak %g MiB over the run's %g", load_peak, peak);
	/* +1: what tools_tuning_check allocates after the peak was read */
	CHECK_MSG(rss <= peak + 1, "RSS at the end %g MiB over the peak %g", rss, peak);
	CHECK_MSG(proc >= peak - 0.1 && bw > 0, "process peak %g MiB, model's %g, buffer %g", proc,
		  peak, bw);
	json_t *reset = json_object_get(j, "hwm_reset");
	CHECK(json_is_boolean(reset));
	/* a reset that failed says why */
	const char *why = json_string_value(json_object_get(j, "hwm_reset_error"));
	CHECK_MSG(json_is_true(reset) ? why == NULL : why && *why, "hwm_reset %s, error %s",
		  json_is_true(reset) ? "true" : "false", why ? why : "(none)");
}

/* The figures are there whatever the tuning did. */
static void check_figures(json_t *j)
{
	json_t *d = json_array_get(json_object_get(j, "decode"), 0);
	double tok_s = json_number_value(json_object_get(d, "tok_s"));
	CHECK(tok_s > 0);
	/* the paired ratio: some decode rep over a read sample beside it, so
	 * at most the best decode over the run's lowest read sample */
	double paired = json_number_value(json_object_get(d, "bandwidth_ratio_paired"));
	double wb = json_number_value(json_object_get(j, "weight_bytes_per_token"));
	double low = json_number_value(json_object_get(j, "read_bandwidth_lowest_gbs")) * 1e9;
	CHECK_MSG(paired > 0 && low > 0 && paired <= tok_s * wb / low * 1.001 + 1e-4,
		  "paired ratio %g, bound %g", paired, low > 0 ? tok_s * wb / low : 0);
	/* the one-token step after load is a step, not a first token: renamed */
	CHECK(json_object_get(j, "first_token_ms") == NULL);
	CHECK(json_number_value(json_object_get(j, "first_step_ms")) > 0);
	CHECK(json_number_value(json_object_get(j, "second_step_ms")) > 0);
	CHECK(json_is_integer(json_object_get(j, "first_step_faults")));
	CHECK(mem(j, "weights_bytes") > 0);
	CHECK(mem(j, "rss_bytes") > 0);
	check_memory(j);
	/* each prompt's time to first token holds its prefill (the same reps,
	 * the best of each), give or take the printed digits */
	json_t *pre = json_object_get(j, "prefill"), *e;
	size_t i;
	CHECK(json_array_size(pre) > 0);
	json_array_foreach(pre, i, e) {
		double n = json_number_value(json_object_get(e, "tokens"));
		double ps = json_number_value(json_object_get(e, "tok_s"));
		double ttft = json_number_value(json_object_get(e, "ttft_ms"));
		CHECK_MSG(ps > 0 && ttft > 0 && ttft + 0.006 >= n / ps * 1e3 * 0.999,
			  "prompt %g: %g tok/s, ttft %g ms", n, ps, ttft);
	}
}

/* The evidence each applied knob must carry. */
static void check_evidence(json_t *j, const char *knob)
{
	json_t *pin = json_object_get(json_object_get(j, "tuning"), "pin");
	if (strcmp(knob, "pin") == 0) {
		json_t *cpus = json_object_get(pin, "cpus"),
		       *obs = json_object_get(pin, "observed");
		CHECK(json_array_size(cpus) > 0);
		CHECK_EQ_INT(json_array_size(obs),
		             json_integer_value(json_object_get(j, "threads")));
		for (size_t i = 0; i < json_array_size(obs); i++) {
			char want[32];
			snprintf(want, sizeof(want), "%lld",
			         (long long)json_integer_value(
			             json_array_get(cpus, i % json_array_size(cpus))));
			CHECK_STREQ(json_string_value(json_array_get(obs, i)), want);
		}
	} else if (strcmp(knob, "hugepages") == 0) {
		CHECK(mem(j, "hugepage_rss_bytes") >= mem(j, "weights_bytes"));
	} else if (strcmp(knob, "prefault") == 0) {
		long pg = sysconf(_SC_PAGESIZE);
		CHECK(mem(j, "weights_resident_before_bytes") >=
		      mem(j, "weights_bytes") / (uint64_t)pg * (uint64_t)pg);
	} else if (strcmp(knob, "mlock") == 0) {
		CHECK(mem(j, "locked_bytes") >= mem(j, "weights_bytes") + mem(j, "kv_bytes"));
	}
}

static const char *const knobs[] = {"pin", "hugepages", "prefault", "mlock"};

/* Whether this test process may lock the small model: root (CAP_IPC_LOCK),
 * or a RLIMIT_MEMLOCK of 1 MiB or more (8 MiB is the kernel's default since
 * 5.16; older ones give 64 KiB, and mlock is then refused), and not in a
 * sanitizer build. */
static const char *mlock_expect(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* the sanitizers make mlock a no-op: the bench must see it, from VmLck */
	return "failed";
#endif
	struct rlimit rl;
	if (geteuid() == 0 || (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur >= (1u << 20)))
		return "applied";
	return "failed";
}

static void test_off(void)
{
	for (int v = 0; v < 2; v++) {
		json_t *j = bench("", v ? "--tuning off" : "", NULL);
		if (!j)
			return;
		for (size_t k = 0; k < CM_ARRAY_LEN(knobs); k++)
			CHECK_STREQ(status(j, knobs[k]), "off");
		CHECK_EQ_INT(mem(j, "locked_bytes"), 0);
		CHECK_EQ_INT(mem(j, "hugepage_rss_bytes"), 0);
		check_figures(j);
		json_decref(j);
	}
}

static void test_each_switch(void)
{
	for (size_t k = 0; k < CM_ARRAY_LEN(knobs); k++) {
		char args[64];
		snprintf(args, sizeof(args), "--%s", knobs[k]);
		json_t *j = bench("", args, NULL);
		if (!j)
			return;
		bool ml = strcmp(knobs[k], "mlock") == 0;
		const char *want = ml ? mlock_expect() : "applied";
		for (size_t o = 0; o < CM_ARRAY_LEN(knobs); o++)
			CHECK_MSG(strcmp(status(j, knobs[o]), o == k ? want : "off") == 0,
			          "%s: %s is %s %s", args, knobs[o], status(j, knobs[o]),
			          reason(j, knobs[o]));
		if (strcmp(want, "applied") == 0)
			check_evidence(j, knobs[k]);
		else
			CHECK_MSG(strstr(reason(j, knobs[k]), "LimitMEMLOCK") ||
			              strstr(reason(j, knobs[k]), "VmLck"),
			          "%s", reason(j, knobs[k]));
		check_figures(j);
		json_decref(j);
	}
}

static void test_tuning_on(void)
{
	/* edgelmd's defaults: pin, prefault, mlock; huge pages off */
	json_t *j = bench("", "--tuning on", NULL);
	if (!j)
		return;
	CHECK_STREQ(status(j, "pin"), "applied");
	CHECK_STREQ(status(j, "prefault"), "applied");
	CHECK_STREQ(status(j, "mlock"), mlock_expect());
	CHECK_STREQ(status(j, "hugepages"), "off");
	json_decref(j);
	j = bench("", "--hugepages --tuning on", NULL);
	if (!j)
		return;
	for (size_t k = 0; k < CM_ARRAY_LEN(knobs); k++) {
		const char *want = strcmp(knobs[k], "mlock") == 0 ? mlock_expect() : "applied";
		CHECK_MSG(strcmp(status(j, knobs[k]), want) == 0, "%s: %s %s", knobs[k],
		          status(j, knobs[k]), reason(j, knobs[k]));
		if (strcmp(want, "applied") == 0)
			check_evidence(j, knobs[k]);
	}
	json_decref(j);
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

static void test_mlock_refused(void)
{
	if (system("command -v prlimit >/dev/null 2>&1") != 0) {
		TEST_SKIP("prlimit missing");
		return;
	}
	/* root holds CAP_IPC_LOCK, which overrides the limit: drop it too */
	bool root = geteuid() == 0;
	if (root && system("command -v setpriv >/dev/null 2>&1") != 0) {
		TEST_SKIP("setpriv missing (needed as root)");
		return;
	}
	char *err = NULL;
	json_t *j = bench(root ? "setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock "
	                         "prlimit --memlock=65536"
	                       : "prlimit --memlock=65536",
	                  "--tuning on", &err);
	if (!j)
		return;
	CHECK_STREQ(status(j, "mlock"), "failed");
	CHECK_MSG(strstr(reason(j, "mlock"), "LimitMEMLOCK=infinity") != NULL, "%s",
	          reason(j, "mlock"));
	CHECK_STREQ(status(j, "pin"), "applied");
	CHECK_STREQ(status(j, "prefault"), "applied");
	CHECK_EQ_INT(mem(j, "locked_bytes"), 0);
	CHECK_MSG(count(err, "LimitMEMLOCK=infinity") == 1, "stderr: %s", err);
	check_figures(j);
	free(err);
	json_decref(j);
}

/* A fake tree from tests/data/tuning/mktree.sh; returns the env prefix. */
static const char *fake_box(const char *box, const char *thp)
{
	static char env[8192];
	char cmd[8192], *out = NULL;
	snprintf(cmd, sizeof(cmd), "sh tests/data/tuning/mktree.sh %s '%s/%s' 2>&1", box, tmp, box);
	int rc = test_run_capture(cmd, &out);
	free(out);
	CHECK_EQ_INT(rc, 0);
	if (thp) {
		snprintf(cmd, sizeof(cmd), "%s/%s/sys/kernel/mm/transparent_hugepage/enabled", tmp,
		         box);
		FILE *f = fopen(cmd, "w");
		CHECK(f != NULL);
		if (f) {
			fprintf(f, "%s\n", thp);
			fclose(f);
		}
	}
	snprintf(env, sizeof(env),
	         "EDGELM_SYSFS_ROOT='%s/%s/sys' EDGELM_PROCFS_ROOT='%s/%s/proc' "
	         "EDGELM_RUN_ROOT='%s/%s/run'",
	         tmp, box, tmp, box, tmp, box);
	return env;
}

static void test_pin_refused(void)
{
	if (!setup())
		return;
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_ISSET(4, &set)) {
		TEST_SKIP("this box has cpu 4: pinning to the fake big cores would work");
		return;
	}
	/* the fake big.LITTLE box puts 2 workers on its big cores 4 and 5 */
	json_t *j = bench(fake_box("biglittle", NULL), "--pin -t 2", NULL);
	if (!j)
		return;
	CHECK_STREQ(status(j, "pin"), "failed");
	CHECK_MSG(strstr(reason(j, "pin"), "could not pin") != NULL, "%s", reason(j, "pin"));
	check_figures(j);
	json_decref(j);
}

/* Repacking already copied the weights into 2 MiB-aligned anonymous
 * memory (engine.h, info.weights_anon): --hugepages reports that as
 * applied, makes no second copy, and the evidence holds. */
static void test_hugepages_repacked(void)
{
	json_t *j = bench("", "--repack on --hugepages", NULL);
	if (!j)
		return;
	if (!json_is_true(json_object_get(j, "weights_anon"))) {
		TEST_SKIP("the %s kernels do not repack: no engine copy",
		          json_string_value(json_object_get(j, "isa")));
		json_decref(j);
		return;
	}
	CHECK_MSG(strcmp(status(j, "hugepages"), "applied") == 0, "hugepages: %s %s",
	          status(j, "hugepages"), reason(j, "hugepages"));
	const char *d = json_string_value(json_object_get(
	    json_object_get(json_object_get(j, "tuning"), "hugepages"), "detail"));
	CHECK_MSG(d && strstr(d, "no copy made"), "detail: %s", d ? d : "(none)");
	check_evidence(j, "hugepages");
	CHECK(mem(j, "weights_bytes") % (2u << 20) == 0);
	json_decref(j);
}

/* --repack-segment: the small shape's panels (2.3-6.9 KiB) are under the
 * default segment, so nothing is cut; 1000-byte segments cut every matrix
 * of two blocks or more; -1 none; the JSON says how many. */
static void test_repack_segment(void)
{
	static const struct {
		const char *args;
		bool cut;
	} cases[] = {
		{"--repack on", false},
		{"--repack on --repack-segment 1000", true},
		{"--repack on --repack-segment -1", false},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		json_t *j = bench("", cases[i].args, NULL);
		if (!j)
			return;
		json_int_t n = json_integer_value(json_object_get(j, "repacked_tensors"));
		json_int_t cut = json_integer_value(json_object_get(j, "repacked_segmented"));
		if (n == 0) {
			TEST_SKIP("the %s kernels do not repack",
			          json_string_value(json_object_get(j, "isa")));
			json_decref(j);
			return;
		}
		CHECK(json_is_integer(json_object_get(j, "repacked_segmented")));
		CHECK_MSG(cases[i].cut ? cut > 0 && cut <= n : cut == 0,
		          "%s: %lld of %lld tensors in K-segments", cases[i].args, (long long)cut,
		          (long long)n);
		json_decref(j);
	}
}

/* --quantize on the small model (Q4_0): loaded as stored, and the JSON
 * says so; a name that needs an importance matrix is a usage error. */
static void test_quantize(void)
{
	json_t *j = bench("", "--quantize q8_0", NULL);
	if (!j)
		return;
	json_t *q = json_object_get(j, "quantize");
	CHECK(json_is_object(q));
	CHECK_MSG(json_string_value(json_object_get(q, "requested")) &&
			  strcmp(json_string_value(json_object_get(q, "requested")), "Q8_0") == 0,
		  "requested");
	CHECK(json_integer_value(json_object_get(q, "tensors")) == 0);
	const char *note = json_string_value(json_object_get(q, "note"));
	CHECK_MSG(note && strstr(note, "file already quantized (q4_0)"), "%s", note ? note : "");
	json_decref(j);
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' --quantize q2_k_s 2>&1", bin("edgelm-bench"), model);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	CHECK_MSG(out && strstr(out, "importance matrix"), "%s", out);
	free(out);
}

static void test_hugepages_blocked(void)
{
	if (!setup())
		return;
	json_t *j = bench(fake_box("vm", "always madvise [never]"), "--hugepages", NULL);
	if (!j)
		return;
	CHECK_STREQ(status(j, "hugepages"), "failed");
	CHECK_MSG(strstr(reason(j, "hugepages"), "transparent_hugepage") != NULL, "%s",
	          reason(j, "hugepages"));
	CHECK_EQ_INT(mem(j, "hugepage_rss_bytes"), 0);
	check_figures(j);
	json_decref(j);
}

/* The bandwidth buffer is the bench's, not the model's: 64 vs 256 MiB of
 * it moves the process's peak by about 192 MiB and the model's by noise.
 * Also: a time to first token for each prompt length. */
static void test_peak_excludes_bw(void)
{
	static const int sizes[2] = {64, 256};
	double peak[2], proc[2];
	for (int k = 0; k < 2; k++) {
		char args[128];
		snprintf(args, sizeof(args), "--bw-mib %d --prompts 8,16,32", sizes[k]);
		json_t *j = bench("", args, NULL);
		if (!j)
			return;
		check_figures(j);
		double bw = num_of(j, "bw_buffer_mib");
		/* all of it touched; its own mapping, so nothing else counted */
		CHECK_MSG(bw >= sizes[k] && bw <= sizes[k] + 0.1, "buffer %g MiB for --bw-mib %d",
			  bw, sizes[k]);
		peak[k] = num_of(j, "peak_rss_mib");
		proc[k] = num_of(j, "process_peak_rss_mib");
		json_t *pre = json_object_get(j, "prefill");
		CHECK_EQ_INT(json_array_size(pre), 3);
		for (size_t i = 0; i < json_array_size(pre); i++) {
			json_t *e = json_array_get(pre, i);
			CHECK_EQ_INT(json_integer_value(json_object_get(e, "tokens")), 8 << i);
			CHECK(json_number_value(json_object_get(e, "ttft_ms")) > 0);
		}
		json_decref(j);
	}
	double grow = sizes[1] - sizes[0];
	CHECK_MSG(proc[1] - proc[0] >= grow * 0.9, "process peak %g -> %g MiB", proc[0], proc[1]);
	CHECK_MSG(fabs(peak[1] - peak[0]) < grow / 4, "model peak %g -> %g MiB", peak[0], peak[1]);
}

static void test_grammar_file(void)
{
	if (!setup())
		return;
	char g[2048], args[2200];
	snprintf(g, sizeof(g), "%s/g.gbnf", tmp);
	FILE *f = fopen(g, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("root ::= [a-z ]{1,6} \".\"\n", f);
	fclose(f);
	snprintf(args, sizeof(args), "--grammar-file '%s'", g);
	json_t *j = bench("", args, NULL);
	if (!j)
		return;
	json_t *gr = json_object_get(j, "grammar");
	CHECK(json_is_object(gr));
	CHECK_EQ_INT(json_integer_value(json_object_get(gr, "tokens")), 4);
	CHECK(json_number_value(json_object_get(gr, "compile_ms")) >= 0);
	CHECK(json_number_value(json_object_get(gr, "tok_s")) > 0);
	CHECK(json_number_value(json_object_get(gr, "plain_tok_s")) > 0);
	CHECK(json_number_value(json_object_get(gr, "sample_ms")) >= 0);
	json_decref(j);
	f = fopen(g, "w");
	if (f) {
		fputs("root ::= \"a\"\nroot ::= \"b\"\n", f);
		fclose(f);
	}
	char cmd[8192], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' --bw-mib 16 --contexts 0 -n 4 --grammar-file '%s' 2>&1",
	         bin("edgelm-bench"), model, g);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
	CHECK_MSG(out && strstr(out, "line 2, column 1: rule 'root' defined twice"), "%s", out);
	free(out);
}

static void test_json_schema(void)
{
	if (!setup())
		return;
	char sch[2048], g[2048], args[4400];
	snprintf(sch, sizeof(sch), "%s/s.json", tmp);
	snprintf(g, sizeof(g), "%s/s.gbnf", tmp);
	FILE *f = fopen(sch, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"cat\",\"dog\"]},"
	      "\"n\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"n\"]}\n", f);
	fclose(f);
	snprintf(args, sizeof(args), "--json-schema '%s'", sch);
	json_t *j = bench("", args, NULL);
	if (!j)
		return;
	json_t *gr = json_object_get(j, "grammar");
	CHECK(json_is_object(gr));
	CHECK(json_is_true(json_object_get(gr, "json_schema")));
	CHECK_EQ_INT(json_integer_value(json_object_get(gr, "tokens")), 4);
	CHECK(json_number_value(json_object_get(gr, "tok_s")) > 0);
	CHECK(json_number_value(json_object_get(gr, "plain_tok_s")) > 0);
	json_decref(j);
	f = fopen(sch, "w");
	if (f) {
		fputs("{\"type\":\"string\",\"pattern\":\"^a+$\"}\n", f);
		fclose(f);
	}
	char cmd[8192], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' --bw-mib 16 --contexts 0 -n 4 --json-schema '%s' 2>&1",
	         bin("edgelm-bench"), model, sch);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
	CHECK_MSG(out && strstr(out, "#/pattern"), "%s", out);
	free(out);
	out = NULL;
	f = fopen(g, "w");
	if (f) {
		fputs("root ::= \"a\"\n", f);
		fclose(f);
	}
	snprintf(cmd, sizeof(cmd),
	         "%s -m '%s' --bw-mib 16 --contexts 0 -n 4 --json-schema '%s' --grammar-file '%s' "
	         ">/dev/null 2>&1",
	         bin("edgelm-bench"), model, sch, g);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
}

static void test_table(void)
{
	if (!setup())
		return;
	char cmd[8192], *out = NULL;
	snprintf(cmd, sizeof(cmd),
	         "%s -m '%s' --bw-mib 16 --reps 1 --prompts 8 --contexts 0 -n 4 --pin --prefault",
	         bin("edgelm-bench"), model);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK_MSG(strstr(out, "pin        applied") && strstr(out, "prefault   applied") &&
	              strstr(out, "hugepages  off") && strstr(out, "mlock      off") &&
	              strstr(out, "first step ") && strstr(out, "time to first token") &&
	              strstr(out, "\nload ") && strstr(out, "peak RSS") &&
	              strstr(out, "bandwidth buffer"),
	          "%s", out);
	free(out);
	/* usage errors */
	snprintf(cmd, sizeof(cmd), "%s -m '%s' --tuning maybe 2>/dev/null", bin("edgelm-bench"),
	         model);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' extra-arg 2>/dev/null", bin("edgelm-bench"), model);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
	/* numbers are whole numbers in range: atoi took "two" as 0 and "12k"
	 * as 12, and ran with them. The lists, one parser for all three of
	 * them: an empty entry, a ninth value (--prompts stopped at eight
	 * without a word, --streams skipped empty entries) and a prompt of 0
	 * tokens (it printed "prefill 0  0.0 tok/s") are refused by name. */
	static const char *const bad_nums[][2] = {
		{"--reps two", "--reps: 'two' is not a whole number"},
		{"--repack-segment 12k", "--repack-segment: '12k' is not a whole number"},
		{"-t -1", "--threads: '-1' is not a whole number"},
		{"--bw-mib 8", "--bw-mib: '8' is not a whole number"},
		{"-n 0", "--n-gen: '0' is not a whole number"},
		{"--batch 99999999999", "--batch: '99999999999' is not a whole number"},
		{"--prompts 8,,16", "--prompts: '8,,16' is not a list"},
		{"--prompts 8,", "--prompts: '8,' is not a list"},
		{"--prompts 1,2,3,4,5,6,7,8,9", "at most 8 values"},
		{"--prompts 0", "--prompts: '0' is not a whole number"},
		{"--contexts 0,x", "--contexts: 'x' is not a whole number"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad_nums); i++) {
		snprintf(cmd, sizeof(cmd), "%s -m '%s' %s 2>&1", bin("edgelm-bench"), model,
			 bad_nums[i][0]);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
		CHECK_MSG(strstr(out, bad_nums[i][1]) != NULL, "%s: %s", bad_nums[i][0], out);
		free(out);
	}
	/* the daemon mode's options too (parsed before it connects) */
	static const char *const bad_streams[][2] = {
		{"--streams 1,x", "--streams: 'x'"},
		{"--streams 1,,4", "--streams: '1,,4' is not a list"},
		{"--streams 1,2,3,4,5,6,7,8,9", "at most 8 values"},
		{"--streams ''", "--streams: '' is not a list"},
		/* two comparisons at once */
		{"--compare ipc:///nonexistent2 --http 127.0.0.1:1", "usage: edgelm-bench --daemon"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad_streams); i++) {
		snprintf(cmd, sizeof(cmd), "%s --daemon ipc:///nonexistent %s 2>&1",
			 bin("edgelm-bench"), bad_streams[i][0]);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
		CHECK_MSG(strstr(out, bad_streams[i][1]) != NULL, "%s: %s", bad_streams[i][0], out);
		free(out);
	}
	/* and edgelm-gguf mkmodel's */
	snprintf(cmd, sizeof(cmd), "%s mkmodel --shape tiny --layers 2x -o /dev/null 2>&1",
		 bin("edgelm-gguf"));
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	CHECK_MSG(strstr(out, "--layers: '2x'") != NULL, "%s", out);
	free(out);
}

/* --tokenize --json; returns the object. */
static json_t *tokbench(const char *env, const char *m, const char *args)
{
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s %s --tokenize -m '%s' --reps 1 --json %s", env,
	         bin("edgelm-bench"), m, args);
	int rc = test_run_capture(cmd, &out);
	CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
	json_t *j = json_loads(out, 0, NULL);
	CHECK_MSG(j != NULL, "%s: not JSON: %s", cmd, out);
	free(out);
	return j;
}

static double num(json_t *j, const char *a, const char *b)
{
	json_t *v = json_object_get(j, a);
	return json_number_value(b ? json_object_get(v, b) : v);
}

static void test_tokenize(void)
{
	if (!setup())
		return;
	const char *v = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
	if (!test_file_exists(v)) {
		TEST_SKIP_DATA("vocab files not found under $EDGELM_TESTDATA");
		return;
	}
	/* a file, used once: "Hello world\n" is 3 SPM tokens without BOS */
	char file[1200];
	snprintf(file, sizeof(file), "%s/hello.txt", tmp);
	FILE *f = fopen(file, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("Hello world\n", f);
	fclose(f);
	char args[8192];
	snprintf(args, sizeof(args), "--text-mb 0 '%s'", file);
	json_t *j = tokbench("", v, args);
	if (!j)
		return;
	CHECK_EQ_INT(num(j, "tokens", NULL), 3);
	CHECK_EQ_INT(num(j, "bytes", NULL), 12);
	CHECK_EQ_INT(num(j, "roundtrip_documents", NULL), 1);
	json_decref(j);

	/* the held-out stories (when present), SPM and BPE vocabularies; gpt2 is
	 * an architecture the engine does not run: its tokenizer still loads */
	const char *vocabs[] = {"vocab/ggml-vocab-llama-spm.gguf",
	                        "vocab/ggml-vocab-llama-bpe.gguf", "vocab/ggml-vocab-gpt-2.gguf"};
	char path[4096], env[4200];
	/* the bench finds the stories where this test does (the test's default
	 * ../shared when run by hand without EDGELM_TESTDATA) */
	snprintf(env, sizeof(env), "EDGELM_TESTDATA='%.4096s'", test_data_path("."));
	for (size_t i = 0; i < CM_ARRAY_LEN(vocabs); i++) {
		snprintf(path, sizeof(path), "%s", test_data_path(vocabs[i]));
		j = tokbench(env, path, "--text-mb 0.3");
		if (!j)
			return;
		CHECK(num(j, "bytes", NULL) >= 300000);
		CHECK(num(j, "tokens", NULL) > num(j, "bytes", NULL) / 8);
		CHECK(num(j, "encode", "mb_s") > 0 && num(j, "decode", "mb_s") > 0);
		CHECK(num(j, "encode", "tok_s") > 0 && num(j, "decode", "tok_s") > 0);
		CHECK_EQ_INT(num(j, "roundtrip_documents", NULL), num(j, "documents", NULL));
		const char *src = json_string_value(json_object_get(j, "source"));
		if (test_file_exists(test_data_path("reference/stories-heldout.jsonl")))
			CHECK_MSG(src && strstr(src, "stories-heldout"), "%s", src ? src : "");
		json_decref(j);
	}

	/* a full model (loaded vocab-only) and the synthetic text */
	j = tokbench("env -u EDGELM_TESTDATA", model, "--text-mb 0.2");
	if (!j)
		return;
	const char *src = json_string_value(json_object_get(j, "source"));
	CHECK_MSG(src && strstr(src, "synthetic"), "%s", src ? src : "");
	CHECK(num(j, "bytes", NULL) >= 200000);
	CHECK(num(j, "tokens", NULL) > 0);
	CHECK_EQ_INT(num(j, "roundtrip_documents", NULL), num(j, "documents", NULL));
	json_decref(j);

	/* a missing file: exit 2 */
	char cmd[8192], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s --tokenize -m '%s' /nonexistent.txt 2>/dev/null",
	         bin("edgelm-bench"), v);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
	free(out);
}

int main(void)
{
	TEST_RUN(test_off);
	TEST_RUN(test_each_switch);
	TEST_RUN(test_tuning_on);
	TEST_RUN(test_mlock_refused);
	TEST_RUN(test_pin_refused);
	TEST_RUN(test_hugepages_blocked);
	TEST_RUN(test_hugepages_repacked);
	TEST_RUN(test_repack_segment);
	TEST_RUN(test_peak_excludes_bw);
	TEST_RUN(test_quantize);
	TEST_RUN(test_table);
	TEST_RUN(test_grammar_file);
	TEST_RUN(test_json_schema);
	TEST_RUN(test_tokenize);
	if (tmp[0]) {
		char cmd[8192];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
		(void)!system(cmd);
	}
	return test_finish();
}
