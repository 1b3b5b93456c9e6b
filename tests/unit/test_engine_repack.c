/* tests/unit/test_engine_repack.c: load-time repacking into the x16 layout
 * (engine/repack.c, kern.h).
 *
 * On a CPU whose best kernel variant reads the layout, a synthetic Q4_0,
 * Q8_0 and Q4_K_M model loads with repack on and off: on, the tensors are reported
 * repacked; the logits agree with the file layout's (to rounding where
 * both follow the reference's float order, to 2e-2 where the file layout
 * runs a vec_dot with its own order: see check_type); greedy
 * generation is the same; the model file on disk is not modified; a batch
 * and token-by-token processing agree. Off, nothing is repacked. Cut into
 * K-segments, the repacked model gives the same logits bit for bit, on 1, 2
 * and 3 threads.
 *
 * Repacking copies the weights into 2 MiB-aligned anonymous memory advised
 * MADV_HUGEPAGE (info.weights_anon): the region is whole 2 MiB pages, the
 * kernel has the advice (smaps VmFlags "hg"), and a second copy
 * (engine_model_relocate, the hugepages knob) is refused. The copy is made
 * in one pass that lets the file's pages go as it goes: the load's peak
 * resident memory stays near the file's size (it was twice that), with a
 * repacked copy and with the caller's relocation alike. */
#include "engine/engine.h"
#include "engine/kernels/kern.h"
#include "tests/test.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *mkmodel(const char *type)
{
	static char out[4096];
	char args[256];
	snprintf(out, sizeof(out), "%s/edgelm-repack-%d-%s.gguf", test_tmpdir(), (int)getpid(),
		 type);
	snprintf(args, sizeof(args), "--shape small --vocab synthetic --type %s", type);
	return test_mkmodel(out, args) == 0 ? out : NULL;
}

static uint64_t file_hash(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint64_t h = 1469598103934665603ull;
	int c;
	if (!f)
		return 0;
	while ((c = getc(f)) != EOF)
		h = (h ^ (uint64_t)c) * 1099511628211ull;
	fclose(f);
	return h;
}

/* N: a batch large enough that repacked matmuls go in parts of groups
 * (matmul.c, x16_parts), which the K-segment cases below compare with
 * whole rows bit for bit */
enum { N = 130, GEN = 12 };

/* Logits of an N-token batch, then GEN greedy tokens; returns the model's
 * info through *ret_info. */
static void run_threads(const char *path, int threads, int repack, int segment, float *logits,
			int32_t *gen, struct engine_model_info *ret_info)
{
	struct engine_params p = {.n_threads = threads, .isa = getenv("EDGELM_ISA"),
				  .repack = repack, .repack_segment = segment};
	engine_model *m = NULL;
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	memset(ret_info, 0, sizeof(*ret_info));
	CHECK_OK(engine_model_load(path, &p, &m, &err));
	if (!m)
		return;
	engine_model_get_info(m, ret_info);
	int nv = (int)ret_info->n_vocab;
	struct engine_ctx_params cp = {.n_ctx = 160, .n_seq = 1, .n_batch = N};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	if (!c)
		goto out;
	int32_t toks[N], pos[N];
	bool want[N];
	for (int i = 0; i < N; i++) {
		toks[i] = (int32_t)((i * 7919 + 13) % nv);
		pos[i] = i;
		want[i] = true;
	}
	struct engine_batch b = {.n = N, .tokens = toks, .pos = pos, .want_logits = want};
	CHECK_OK(engine_decode(c, &b, &err));
	for (int i = 0; i < N; i++) {
		const float *l = engine_get_logits(c, i);
		CHECK(l != NULL);
		if (l)
			memcpy(logits + (size_t)i * nv, l, (size_t)nv * sizeof(float));
	}
	for (int g = 0; g < GEN; g++) {
		const float *l = engine_get_logits_last(c);
		int best = 0;
		for (int i = 1; i < nv; i++)
			best = l[i] > l[best] ? i : best;
		gen[g] = best;
		CHECK_OK(engine_eval(c, &gen[g], 1, N + g, &err));
	}
out:
	engine_ctx_free(c);
	engine_model_free(m);
}

static void run(const char *path, int repack, int segment, float *logits, int32_t *gen,
		struct engine_model_info *ret_info)
{
	run_threads(path, 2, repack, segment, logits, gen, ret_info);
}

static void check_type(const char *type)
{
	const char *path = mkmodel(type);
	CHECK_MSG(path != NULL, "mkmodel %s failed", type);
	if (!path)
		return;
	uint64_t h0 = file_hash(path);
	struct engine_model_info on, off;
	enum { MAXV = 1 << 16 };
	float *l_on = calloc((size_t)N * MAXV, sizeof(float));
	float *l_off = calloc((size_t)N * MAXV, sizeof(float));
	float *l_seg = calloc((size_t)N * MAXV, sizeof(float));
	int32_t g_on[GEN], g_off[GEN], g_seg[GEN];
	run(path, 1, 0, l_on, g_on, &on);
	run(path, -1, 0, l_off, g_off, &off);
	CHECK(off.n_x16_tensors == 0 && off.x16_bytes == 0);
	if (on.n_x16_tensors == 0) {
		TEST_SKIP("kernel variant %s has no x16 kernels for %s", on.isa, type);
		goto out;
	}
	CHECK(on.x16_bytes > 0 && on.x16_bytes <= on.weight_bytes);
	/* every matrix of the small shape (n_embd 256, n_ff 768) is repacked;
	 * the output is too, unless tied to the embedding */
	CHECK_MSG(on.n_x16_tensors >= 7 * on.n_layer, "%u tensors repacked", on.n_x16_tensors);
	int nv = (int)on.n_vocab;
	double worst = 0, scale = 1e-12;
	for (size_t i = 0; i < (size_t)N * nv; i++) {
		double d = fabs((double)l_on[i] - l_off[i]);
		if (!(d <= worst))
			worst = d;
		if (fabs(l_off[i]) > scale)
			scale = fabs(l_off[i]);
	}
	/* The x16 kernels follow the reference's float sequence; so does the
	 * file layout's tile kernel where the variant has one (avx512vnni),
	 * and the K-quants' vec_dot everywhere: then the two layouts agree to
	 * rounding. A variant that runs the file's Q4_0/Q8_0 through vec_dot
	 * (avx2, avxvnni: lanes summed at the end) differs from it by its
	 * float order, which a random 4-layer model amplifies to ~6e-3; so do
	 * the file layout's kernels of the other 32-element types (no FMA). */
	const struct kern_ops *ko = kern_select(NULL, getenv("EDGELM_ISA"));
	bool q4q8 = strcmp(type, "Q4_0") == 0 || strcmp(type, "Q8_0") == 0;
	bool same_order = ko && (strncmp(type, "Q4_K", 4) == 0 || strncmp(type, "Q5_K", 4) == 0 ||
				 strncmp(type, "Q3_K", 4) == 0 || strcmp(type, "Q2_K") == 0 ||
				 strcmp(type, "IQ4_XS") == 0 ||
				 (q4q8 && ko->t[ENGINE_DTYPE_Q4_0].gemm &&
				  ko->t[ENGINE_DTYPE_Q8_0].gemm));
	double bound = same_order ? 1e-5 : 2e-2;
	fprintf(stderr, "%s: %u tensors repacked (%.1f KiB), logits max relative diff %.3g "
		"(bound %g)\n", type, on.n_x16_tensors, (double)on.x16_bytes / 1024, worst / scale,
		bound);
	CHECK_MSG(worst / scale <= bound, "%s: repacked logits differ by %g relative", type,
		  worst / scale);
	CHECK_MSG(memcmp(g_on, g_off, sizeof(g_on)) == 0, "%s: greedy tokens differ", type);
	/* K-segments (repack.c): 1000-byte segments cut every matrix of two
	 * blocks or more (the small shape's panels are 2.3-10 KiB, under the
	 * default), the tied output included, which the embedding lookup
	 * then reads back through them; the logits are the same bit for bit */
	struct engine_model_info seg;
	run(path, 1, 1000, l_seg, g_seg, &seg);
	CHECK(seg.n_x16_tensors == on.n_x16_tensors);
	CHECK_MSG(memcmp(l_seg, l_on, (size_t)N * nv * sizeof(float)) == 0,
		  "%s: logits with K-segments differ from the whole rows'", type);
	CHECK_MSG(memcmp(g_seg, g_on, sizeof(g_on)) == 0, "%s: greedy tokens differ (segments)",
		  type);
	/* and on 1 and 3 threads: a group's segments are one worker's (into
	 * l_off's buffer, done with above) */
	for (int nth = 1; nth <= 3; nth += 2) {
		struct engine_model_info ti;
		int32_t g_t[GEN];
		run_threads(path, nth, 1, 1000, l_off, g_t, &ti);
		CHECK_MSG(memcmp(l_off, l_seg, (size_t)N * nv * sizeof(float)) == 0,
			  "%s: logits with K-segments on %d threads differ from 2 threads'", type,
			  nth);
		CHECK(memcmp(g_t, g_seg, sizeof(g_t)) == 0);
	}
	CHECK_MSG(file_hash(path) == h0, "%s: the model file changed on disk", type);
out:
	free(l_on);
	free(l_off);
	free(l_seg);
	unlink(path);
}

static void test_q4_0(void)
{
	check_type("Q4_0");
}

static void test_q8_0(void)
{
	check_type("Q8_0");
}

/* Q4_K and Q6_K (the mix people download) */
static void test_q4_k_m(void)
{
	check_type("Q4_K_M");
}

/* The other 32-element types with x16 kernels: the bulk of real Qwen2.5
 * mixes (Q5_0 in Q4_K_M, Q5_1 in Q5_K_M, IQ4_NL in Q3_K_M, Q2_K, IQ4_XS) */
static void test_q32_types(void)
{
	check_type("Q4_1");
	check_type("Q5_0");
	check_type("Q5_1");
	check_type("IQ4_NL");
}

/* The K-quants with x16 kernels beside Q4_K and Q6_K, on a variant that
 * has them (avx512vnni; elsewhere only part of a mix would be repacked):
 * the small shape's 256-wide rows keep the mixes' K-types in every
 * matrix */
static void check_kq(const char *mix, uint32_t type)
{
	const struct kern_ops *ko = kern_select(NULL, getenv("EDGELM_ISA"));
	if (!ko || !ko->t[type].gemm_x16) {
		TEST_SKIP("kernel variant %s has no x16 kernel for %s", ko ? ko->name : "?",
			  quant_dtype_name(type));
		return;
	}
	check_type(mix);
}

static void test_kq_types(void)
{
	check_kq("Q5_K_M", ENGINE_DTYPE_Q5_K);
	check_kq("IQ4_XS", ENGINE_DTYPE_IQ4_XS);
	check_kq("Q3_K_M", ENGINE_DTYPE_Q3_K);
	check_kq("Q2_K", ENGINE_DTYPE_Q2_K);
}

/* The VmFlags line of the smaps entry starting at addr ("" if none) */
static void vm_flags(const void *addr, char *out, size_t cap)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	bool in = false;
	out[0] = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b;
		if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = a == (unsigned long)(uintptr_t)addr;
		else if (in && strncmp(line, "VmFlags:", 8) == 0) {
			snprintf(out, cap, "%s", line + 8);
			break;
		}
	}
	fclose(f);
}

static void test_anon_copy(void)
{
	const char *path = mkmodel("Q4_0");
	CHECK_MSG(path != NULL, "mkmodel failed");
	if (!path)
		return;
	struct cm_err err = {0};
	for (int repack = 1; repack >= -1; repack -= 2) {
		struct engine_params p = {.n_threads = 2, .isa = getenv("EDGELM_ISA"),
					  .repack = repack};
		engine_model *m = NULL;
		CHECK_OK(engine_model_load(path, &p, &m, &err));
		if (!m)
			break;
		struct engine_model_info info;
		struct engine_region r;
		engine_model_get_info(m, &info);
		engine_model_region(m, &r);
		if (repack < 0 || info.n_x16_tensors == 0) {
			CHECK(!info.weights_anon);
			engine_model_free(m);
			if (repack > 0)
				TEST_SKIP("kernel variant %s has no x16 kernels", info.isa);
			continue;
		}
		CHECK(info.weights_anon);
		const size_t huge = (size_t)2 << 20;
		CHECK_MSG((uintptr_t)r.addr % huge == 0 && r.len % huge == 0,
			  "region %p + %zu not in whole 2 MiB pages", r.addr, r.len);
		CHECK(r.len >= info.weight_bytes);
		char flags[512];
		vm_flags(r.addr, flags, sizeof(flags));
		if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0)
			CHECK_MSG(strstr(flags, " hg") != NULL,
				  "no MADV_HUGEPAGE on the weights: VmFlags%s", flags);
		/* read-only again after repacking */
		CHECK_MSG(strstr(flags, " rd") && !strstr(flags, " wr"), "VmFlags%s", flags);
		/* the hugepages knob's copy has nothing left to do */
		static char buf[4 << 20];
		CHECK(engine_model_relocate(m, buf, sizeof(buf), &err) == -EINVAL);
		engine_model_free(m);
	}
	unlink(path);
}

/* VmHWM or VmRSS of this process in bytes (key "VmHWM:" or "VmRSS:"), 0
 * when /proc says nothing */
static uint64_t status_bytes(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kib = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0)
			(void)sscanf(line + strlen(key), "%llu", &kib);
	fclose(f);
	return (uint64_t)kib << 10;
}

/* Reset VmHWM to the current RSS (Linux 4.0); false where refused */
static bool reset_hwm(void)
{
	FILE *f = fopen("/proc/self/clear_refs", "w");
	if (!f)
		return false;
	bool ok = fputs("5", f) >= 0;
	return fclose(f) == 0 && ok;
}

/* The load's peak: what it adds to the resident set at its highest, against
 * the file's size. Regression: the copy and the file's pages were both
 * resident at the end of the copy (2.0x the file). */
static void check_peak(const char *path, int repack, bool relocate)
{
	struct cm_err err = {0};
	struct engine_params p = {.n_threads = 2, .isa = getenv("EDGELM_ISA"), .repack = repack};
	engine_model *m = NULL;
	FILE *f = fopen(path, "rb");
	long size = -1;
	if (f && fseek(f, 0, SEEK_END) == 0)
		size = ftell(f);
	if (f)
		fclose(f);
	CHECK(size > 0);
	void *buf = NULL;
	if (relocate) /* the caller's buffer is resident before the load */
		CHECK((buf = calloc(1, (size_t)size)) != NULL && memset(buf, 1, (size_t)size));
	if (!reset_hwm()) {
		free(buf);
		TEST_SKIP("/proc/self/clear_refs refused: cannot reset VmHWM");
		return;
	}
	uint64_t before = status_bytes("VmRSS:");
	CHECK_OK(engine_model_load(path, &p, &m, &err));
	if (m && relocate)
		CHECK_OK(engine_model_relocate(m, buf, (size_t)size, &err));
	uint64_t peak = status_bytes("VmHWM:");
	struct engine_model_info info = {0};
	if (m)
		engine_model_get_info(m, &info);
	/* the copy (2 MiB pages), the pool's stacks, the tokenizer: 1.15x
	 * the file plus 16 MiB; a model that was not copied costs less */
	uint64_t bound = (uint64_t)size + (uint64_t)size * 15 / 100 + (16u << 20);
#ifdef __SANITIZE_ADDRESS__
	/* ASan's shadow, redzones and quarantine of the load's heap (the
	 * tokenizer's tables): 172.1 MiB against 171.4 once in a clean clone */
	bound += 16u << 20;
#endif
	if (relocate)
		bound -= (uint64_t)size; /* the buffer was resident already */
	CHECK_MSG(peak - before <= bound,
		  "%s (repack %d%s, %s): the load added %.1f MiB at its peak, file %.1f MiB, "
		  "bound %.1f MiB",
		  path, repack, relocate ? ", relocated" : "", info.weights_anon ? "copied" : "mapped",
		  (double)(peak - before) / (1 << 20), (double)size / (1 << 20),
		  (double)bound / (1 << 20));
	engine_model_free(m);
	free(buf);
}

static void test_load_peak(void)
{
	static char out[4096];
	snprintf(out, sizeof(out), "%s/edgelm-peak-%d.gguf", test_tmpdir(), (int)getpid());
	/* big enough (~100 MiB) that the copy dwarfs what else a load holds */
	if (test_mkmodel(out, "--shape tinyllama-1.1b --layers 3 --vocab synthetic --type Q8_0")) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	check_peak(out, 1, false);  /* the repacked copy */
	check_peak(out, -1, true);  /* the file's bytes into the caller's buffer */
	unlink(out);
}

struct hook_seen {
	int calls;
	uint64_t rss; /* VmRSS when called */
	struct engine_model_info info;
	uint64_t kv_per_token;
	int ret;
};

static int hook(void *ud, const engine_model *m, struct cm_err *err)
{
	struct hook_seen *h = ud;
	h->calls++;
	h->rss = status_bytes("VmRSS:");
	engine_model_get_info(m, &h->info);
	h->kv_per_token = engine_model_kv_bytes_per_token(m, ENGINE_KV_F16);
	return h->ret ? cm_err_set(err, h->ret, "test: refused") : 0;
}

/* engine_params.before_weights runs once, with the shape known and before
 * the weights' copy: a refusal there (the daemon's memory check) stops the
 * load before its peak. */
static void test_before_weights(void)
{
	static char out[4096];
	snprintf(out, sizeof(out), "%s/edgelm-hook-%d.gguf", test_tmpdir(), (int)getpid());
	if (test_mkmodel(out, "--shape tinyllama-1.1b --layers 3 --vocab synthetic --type Q8_0")) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	for (int refuse = 1; refuse >= 0; refuse--) {
		struct hook_seen h = {.ret = refuse ? -ENOMEM : 0};
		struct engine_params p = {.n_threads = 2, .isa = getenv("EDGELM_ISA"), .repack = 1,
					  .before_weights = hook, .before_weights_ud = &h};
		struct cm_err err = {0};
		engine_model *m = NULL;
		uint64_t before = status_bytes("VmRSS:");
		int r = engine_model_load(out, &p, &m, &err);
		CHECK(h.calls == 1);
		CHECK(h.info.n_layer == 3 && h.info.n_x16_tensors == 0 && !h.info.weights_anon);
		CHECK(h.kv_per_token > 0);
		/* nothing of the ~100 MiB of weights resident yet */
		CHECK_MSG(h.rss < before + (32u << 20), "%.1f MiB resident before the weights",
			  (double)(h.rss - before) / (1 << 20));
		if (refuse) {
			CHECK(r == -ENOMEM && m == NULL);
			CHECK(strstr(err.msg, "test: refused") != NULL);
		} else {
			CHECK_OK(r);
		}
		engine_model_free(m);
	}
	unlink(out);
}

static void test_parse(void)
{
	int m = 5;
	CHECK(engine_repack_parse(NULL, &m) == 0 && m == 0);
	CHECK(engine_repack_parse("auto", &m) == 0 && m == 0);
	CHECK(engine_repack_parse("on", &m) == 0 && m == 1);
	CHECK(engine_repack_parse("off", &m) == 0 && m == -1);
	CHECK(engine_repack_parse("yes", &m) == -EINVAL);
	CHECK(engine_repack_parse("", &m) == -EINVAL);
}

int main(void)
{
	TEST_RUN(test_parse);
	TEST_RUN(test_q4_0);
	TEST_RUN(test_q8_0);
	TEST_RUN(test_q4_k_m);
	TEST_RUN(test_q32_types);
	TEST_RUN(test_kq_types);
	TEST_RUN(test_anon_copy);
	TEST_RUN(test_load_peak);
	TEST_RUN(test_before_weights);
	return test_finish();
}
