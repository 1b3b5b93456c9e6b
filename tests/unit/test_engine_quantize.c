/* tests/unit/test_engine_quantize.c: quantizing on load
 * (engine_params.quantize, engine/quantize.c).
 *
 * For stories260K F32 and F16 and stories3M F32 (when present; synthetic
 * F16 and BF16 models of the small shape always, and of the qwen2, phi3 and
 * gemma3 test shapes) and the types Q8_0, Q4_0, Q4_K_M and
 * Q6_K: the model quantized on load holds the same tensors, byte for byte,
 * as the file build/bin/edgelm-quantize writes for that type, and gives the
 * same logits (bit for bit) and greedy tokens, with repacking off and on.
 * stories260K's FFN rows (172) divide no block of 32 or 256: those tensors
 * fall back as the tool's do, and the info says so. A quantized file with
 * quantize set loads as stored with a note; an unknown name is -EINVAL, a
 * mix that needs an importance matrix -ENOTSUP. The load's peak RSS stays
 * near the quantized size, not the file's plus it. */
#include "engine/engine_impl.h"
#include "tests/test.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { PROMPT = 8, GEN = 12 };

/* The tool's output for `in` and `type` in TEST_TMPDIR, or NULL. */
static const char *quantize_file(const char *in, const char *tag, const char *type)
{
	static char out[4096];
	char cmd[12288];
	snprintf(out, sizeof(out), "%s/q-%d-%s-%s.gguf", test_tmpdir(), (int)getpid(), tag, type);
	snprintf(cmd, sizeof(cmd), "'%s' -t 2 '%s' '%s' %s >/dev/null 2>&1",
	         test_bin("edgelm-quantize"), in, out, type);
	if (system(cmd) != 0) {
		fprintf(stderr, "failed: %s\n", cmd);
		return NULL;
	}
	return out;
}

static engine_model *load(const char *path, const char *quantize, int repack, int threads)
{
	struct engine_params p = {.n_threads = threads,
	                          .isa = getenv("EDGELM_ISA"),
	                          .repack = repack,
	                          .quantize = quantize};
	engine_model *m = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(path, &p, &m, &err);
	CHECK_MSG(r == 0, "%s (quantize %s): %s", path, quantize ? quantize : "-", err.msg);
	return m;
}

/* Every tensor of a (as loaded) equals b's of the same name: type, size
 * and bytes. Only with repacking off: repacked matrices are rewritten. */
static void check_tensors(const engine_model *a, const engine_model *b)
{
	CHECK_EQ_INT((int)a->file->n_tensors, (int)b->file->n_tensors);
	for (uint64_t i = 0; i < a->file->n_tensors; i++) {
		const struct gguf_tensor *ta = &a->file->tensors[i];
		const struct gguf_tensor *tb = gguf_tensor_by_name(b->file, ta->name);
		CHECK_MSG(tb != NULL, "%s missing", ta->name);
		if (!tb)
			continue;
		CHECK_MSG(ta->type == tb->type, "%s: %s vs %s", ta->name,
		          engine_dtype_name(ta->type), engine_dtype_name(tb->type));
		CHECK_MSG(ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0,
		          "%s: bytes differ", ta->name);
	}
}

/* Logits of a prompt and GEN greedy tokens (each step's logits too). */
static void run(engine_model *m, float *logits, int32_t *gen)
{
	struct engine_model_info in;
	engine_model_get_info(m, &in);
	int nv = (int)in.n_vocab;
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	struct engine_ctx_params cp = {.n_ctx = 64, .n_seq = 1, .n_batch = 16};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	if (!c)
		return;
	int32_t toks[PROMPT];
	for (int i = 0; i < PROMPT; i++)
		toks[i] = (int32_t)((i * 37 + 1) % nv);
	CHECK_OK(engine_eval(c, toks, PROMPT, 0, &err));
	for (int g = 0; g < GEN; g++) {
		const float *l = engine_get_logits_last(c);
		memcpy(logits + (size_t)g * nv, l, (size_t)nv * sizeof(float));
		int32_t best = 0;
		for (int v = 1; v < nv; v++)
			if (l[v] > l[best])
				best = v;
		gen[g] = best;
		CHECK_OK(engine_eval(c, &best, 1, PROMPT + g, &err));
	}
	engine_ctx_free(c);
}

/* The source loaded with `type` against the tool's file for it. */
static void check_type(const char *src, const char *tag, const char *type, bool expect_fallback)
{
	const char *qf = quantize_file(src, tag, type);
	CHECK_MSG(qf != NULL, "edgelm-quantize %s %s", src, type);
	if (!qf)
		return;
	for (int repack = -1; repack <= 1; repack += 2) {
		engine_model *a = load(src, type, repack, 2), *b = load(qf, NULL, repack, 2);
		if (!a || !b) {
			engine_model_free(a);
			engine_model_free(b);
			break;
		}
		struct engine_model_info ia, ib;
		engine_model_get_info(a, &ia);
		engine_model_get_info(b, &ib);
		CHECK(strcasecmp(ia.quant_requested, type) == 0);
		CHECK(ia.n_quantized > 0);
		CHECK(ia.weights_anon);
		CHECK(ia.quant_bytes_out < ia.quant_bytes_in || strcasecmp(type, "q8_0") == 0);
		CHECK(ia.quant_seconds >= 0);
		CHECK(ia.weight_bytes == ib.weight_bytes);
		for (int t = 0; t < ENGINE_TYPE_SLOTS; t++)
			CHECK_MSG(ia.type_counts[t] == ib.type_counts[t], "%s: %u %s vs %u", type,
			          ia.type_counts[t], engine_dtype_name((uint32_t)t),
			          ib.type_counts[t]);
		CHECK_EQ_INT((int)ia.n_x16_tensors, (int)ib.n_x16_tensors);
		if (expect_fallback) {
			CHECK(ia.n_fallback > 0);
			CHECK_MSG(strstr(ia.quant_note, "kept wider") != NULL, "note: %s",
			          ia.quant_note);
		}
		if (repack < 0)
			check_tensors(a, b);
		int nv = (int)ia.n_vocab;
		float *la = calloc((size_t)GEN * nv, sizeof(float));
		float *lb = calloc((size_t)GEN * nv, sizeof(float));
		int32_t ga[GEN], gb[GEN];
		run(a, la, ga);
		run(b, lb, gb);
		CHECK_MSG(memcmp(ga, gb, sizeof(ga)) == 0, "%s %s repack %d: tokens differ", tag,
		          type, repack);
		CHECK_MSG(memcmp(la, lb, (size_t)GEN * nv * sizeof(float)) == 0,
		          "%s %s repack %d: logits differ", tag, type, repack);
		free(la);
		free(lb);
		engine_model_free(a);
		engine_model_free(b);
	}
	unlink(qf);
}

static const char *const types[] = {"q8_0", "q4_0", "q4_k_m", "q6_k"};

static void check_model(const char *rel, const char *tag, bool fallback)
{
	const char *p = test_data_path(rel);
	if (!test_file_exists(p)) {
		TEST_SKIP_DATA("%s not found", p);
		return;
	}
	char src[4096];
	snprintf(src, sizeof(src), "%s", p);
	for (size_t i = 0; i < CM_ARRAY_LEN(types); i++)
		check_type(src, tag, types[i], fallback);
}

static void test_260k_f32(void)
{
	check_model("models/stories260K-f32.gguf", "260k-f32", true);
}

static void test_260k_f16(void)
{
	check_model("models/stories260K-f16.gguf", "260k-f16", true);
}

static void test_3m_f32(void)
{
	check_model("models/stories3M-f32.gguf", "3m-f32", false);
}

/* Without shared data too: a synthetic F16 model. */
static void test_synthetic_f16(void)
{
	char out[4096];
	snprintf(out, sizeof(out), "%s/q-%d-small-f16.gguf", test_tmpdir(), (int)getpid());
	if (test_mkmodel(out, "--shape small --vocab synthetic --type F16")) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	check_type(out, "small", "q4_k_m", false);
	check_type(out, "small", "q8_0", false);
	unlink(out);
}

/* BF16 sources dequantize through their own row function. */
static void test_synthetic_bf16(void)
{
	char out[4096];
	snprintf(out, sizeof(out), "%s/q-%d-small-bf16.gguf", test_tmpdir(), (int)getpid());
	if (test_mkmodel(out, "--shape small --layers 2 --vocab synthetic --type BF16")) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	check_type(out, "small-bf16", "q4_0", false);
	check_type(out, "small-bf16", "q6_k", false);
	unlink(out);
}

/* The other architectures' tensors: qwen2's biases, phi3's fused
 * attn_qkv (its own rule in the K mixes), gemma's tied output. */
static void test_synthetic_archs(void)
{
	static const char *const shapes[] = { "small-qwen2", "small-phi3", "small-gemma3" };
	for (size_t i = 0; i < CM_ARRAY_LEN(shapes); i++) {
		char out[4096], args[256];
		snprintf(out, sizeof(out), "%s/q-%d-%s.gguf", test_tmpdir(), (int)getpid(),
		         shapes[i]);
		snprintf(args, sizeof(args), "--shape %s --layers 2 --vocab synthetic --type F16",
		         shapes[i]);
		if (test_mkmodel(out, args)) {
			CHECK_MSG(false, "mkmodel %s failed", shapes[i]);
			continue;
		}
		check_type(out, shapes[i], "q4_k_m", false);
		unlink(out);
	}
}

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

struct hook_seen {
	int calls;
	uint64_t rss; /* VmRSS when called */
	struct engine_model_info info;
};

static int hook(void *ud, const engine_model *m, struct cm_err *err)
{
	struct hook_seen *h = ud;
	(void)err;
	h->calls++;
	h->rss = status_bytes("VmRSS:");
	engine_model_get_info(m, &h->info);
	return 0;
}

/* The load's peak against the file: a 254 MiB F16 model quantized to Q8_0
 * adds about the Q8_0 weights (135 MiB) at its highest, never the F16
 * pages and the result together; the caller's memory check runs before
 * any of it, and sees the quantized size. */
static void test_load_peak(void)
{
	char out[4096];
	snprintf(out, sizeof(out), "%s/q-%d-peak-f16.gguf", test_tmpdir(), (int)getpid());
	if (test_mkmodel(out, "--shape tinyllama-1.1b --layers 3 --vocab synthetic --type F16")) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	struct hook_seen h = { 0 };
	struct engine_params p = { .n_threads = 2, .isa = getenv("EDGELM_ISA"), .repack = 1,
		                   .quantize = "q8_0", .before_weights = hook,
		                   .before_weights_ud = &h };
	struct cm_err err = { 0 };
	engine_model *m = NULL;
	if (!reset_hwm()) {
		TEST_SKIP("/proc/self/clear_refs refused: cannot reset VmHWM");
		unlink(out);
		return;
	}
	uint64_t before = status_bytes("VmRSS:");
	CHECK_OK(engine_model_load(out, &p, &m, &err));
	uint64_t peak = status_bytes("VmHWM:");
	struct engine_model_info in = { 0 };
	if (m)
		engine_model_get_info(m, &in);
	uint64_t size = in.quant_bytes_in, q = in.quant_bytes_out;
	CHECK(size > (200u << 20) && q > 0 && q < size * 6 / 10);
	CHECK(h.calls == 1 && h.info.quant_bytes_out == q && h.info.weight_bytes == q);
	CHECK_MSG(h.rss < before + (32u << 20), "%.1f MiB resident before the weights",
	          (double)(h.rss - before) / (1 << 20));
	/* the quantized copy (2 MiB pages), the tensors in flight, the pool's
	 * stacks: 1.15x the result plus 16 MiB */
	uint64_t bound = q + q * 15 / 100 + (16u << 20);
#ifdef __SANITIZE_ADDRESS__
	bound += 16u << 20; /* ASan's shadow and quarantine of the load's heap */
#endif
	CHECK_MSG(peak - before <= bound,
	          "the load added %.1f MiB at its peak: file tensors %.1f MiB, quantized %.1f "
	          "MiB, bound %.1f MiB",
	          (double)(peak - before) / (1 << 20), (double)size / (1 << 20),
	          (double)q / (1 << 20), (double)bound / (1 << 20));
	engine_model_free(m);
	unlink(out);
}

/* The repack cache is keyed by the file: not used for weights quantized
 * on load, and the note says so; nothing is written. */
static void test_repack_cache_unused(void)
{
	char out[4096], dir[4096], cmd[8400];
	snprintf(out, sizeof(out), "%s/q-%d-rc.gguf", test_tmpdir(), (int)getpid());
	snprintf(dir, sizeof(dir), "%s/q-%d-rc", test_tmpdir(), (int)getpid());
	if (test_mkmodel(out, "--shape small --layers 1 --vocab synthetic --type F16") ||
	    mkdir(dir, 0700) != 0) {
		CHECK_MSG(false, "mkmodel or mkdir failed");
		return;
	}
	struct engine_params p = { .n_threads = 2, .isa = getenv("EDGELM_ISA"), .repack = 1,
		                   .repack_cache = dir, .quantize = "q4_0" };
	struct cm_err err = { 0 };
	engine_model *m = NULL;
	CHECK_OK(engine_model_load(out, &p, &m, &err));
	if (m) {
		struct engine_model_info in;
		engine_model_get_info(m, &in);
		if (in.n_x16_tensors) {
			CHECK(!in.weights_cached);
			CHECK_MSG(strstr(in.repack_cache_note, "quantized on load") != NULL, "note: %s",
			          in.repack_cache_note);
		}
	}
	engine_model_free(m);
	CHECK(rmdir(dir) == 0); /* empty: no entry written */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
	unlink(out);
}

/* A quantized file with quantize set: as stored, with a note. */
static void test_already_quantized(void)
{
	const char *p = test_data_path("models/stories3M-q8_0.gguf");
	char path[4096];
	if (test_file_exists(p)) {
		snprintf(path, sizeof(path), "%s", p);
	} else {
		snprintf(path, sizeof(path), "%s/q-%d-small-q8.gguf", test_tmpdir(), (int)getpid());
		if (test_mkmodel(path, "--shape small --vocab synthetic --type Q8_0")) {
			CHECK_MSG(false, "mkmodel failed");
			return;
		}
	}
	engine_model *m = load(path, "q4_k_m", -1, 1);
	if (!m)
		return;
	struct engine_model_info in;
	engine_model_get_info(m, &in);
	CHECK(strcmp(in.quant_requested, "Q4_K_M") == 0);
	CHECK_EQ_INT((int)in.n_quantized, 0);
	CHECK(!in.weights_anon);
	CHECK_MSG(strcmp(in.quant_note, "file already quantized (q8_0): loaded as stored") == 0,
	          "note: %s", in.quant_note);
	engine_model_free(m);
}

static void test_names(void)
{
	struct cm_err err = {0};
	CHECK_OK(engine_quantize_check(NULL, &err));
	CHECK_OK(engine_quantize_check("", &err));
	CHECK_OK(engine_quantize_check("q4_k_m", &err));
	CHECK_OK(engine_quantize_check("Q4_K", &err));
	CHECK_OK(engine_quantize_check("f16", &err));
	CHECK_EQ_INT(engine_quantize_check("q4_k_x", &err), -EINVAL);
	CHECK(strstr(err.msg, "Q4_K_M") != NULL);
	CHECK_EQ_INT(engine_quantize_check("iq2_xxs", &err), -ENOTSUP);
	CHECK(strstr(err.msg, "importance matrix") != NULL);
	CHECK(strncmp(engine_quantize_names(), "Q4_K_M Q4_K_S ", 14) == 0);
	/* every listed name checks */
	char names[512];
	snprintf(names, sizeof(names), "%s", engine_quantize_names());
	int n = 0;
	for (char *s = strtok(names, " "); s; s = strtok(NULL, " "), n++)
		CHECK_OK(engine_quantize_check(s, &err));
	CHECK(n >= 17);
}

/* An unknown or imatrix-only name stops the load. */
static void test_load_refused(void)
{
	char out[4096];
	snprintf(out, sizeof(out), "%s/q-%d-tiny-f32.gguf", test_tmpdir(), (int)getpid());
	if (test_mkmodel(out, "--shape small --layers 1 --vocab synthetic --type F32")) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	struct engine_params p = {.n_threads = 1, .quantize = "q3_x"};
	engine_model *m = NULL;
	struct cm_err err = {0};
	CHECK_EQ_INT(engine_model_load(out, &p, &m, &err), -EINVAL);
	CHECK(m == NULL);
	p.quantize = "IQ1_S";
	CHECK_EQ_INT(engine_model_load(out, &p, &m, &err), -ENOTSUP);
	CHECK(strstr(err.msg, "importance matrix") != NULL);
	p.quantize = "";
	CHECK_OK(engine_model_load(out, &p, &m, &err));
	struct engine_model_info in;
	if (m) {
		engine_model_get_info(m, &in);
		CHECK(in.quant_requested[0] == '\0' && in.n_quantized == 0);
	}
	engine_model_free(m);
	unlink(out);
}

int main(void)
{
	TEST_RUN(test_names);
	TEST_RUN(test_load_refused);
	TEST_RUN(test_already_quantized);
	TEST_RUN(test_synthetic_f16);
	TEST_RUN(test_synthetic_bf16);
	TEST_RUN(test_synthetic_archs);
	TEST_RUN(test_load_peak);
	TEST_RUN(test_repack_cache_unused);
	TEST_RUN(test_260k_f32);
	TEST_RUN(test_260k_f16);
	TEST_RUN(test_3m_f32);
	return test_finish();
}
