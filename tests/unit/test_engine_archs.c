/* tests/unit/test_engine_archs.c: llama, qwen2, qwen3, phi3, gemma, gemma2 and
 * gemma3 synthetic models made by `edgelm-gguf mkmodel` load and generate,
 * and a prompt processed in one batch gives the same logits as token by
 * token (1e-4 relative). The small test shapes use the synthetic
 * vocabulary (the phi3 and gemma2/3 ones have sliding windows shorter than
 * the 9-token prompt); the real shapes (llama-3.2-1b, qwen2.5-0.5b,
 * qwen3-0.6b, phi-3-mini, one layer each) use their real vocab files and
 * chat templates. The architectures' math itself is checked against a
 * reference in test_engine_archs_ref.c. */
#include "engine/engine.h"
#include "tests/test.h"

#include <unistd.h>

/* mkmodel into $TEST_TMPDIR; returns the path (static) or NULL. */
static const char *mkmodel(const char *shape, const char *vocab, const char *extra)
{
	static char out[4096];
	char args[8192];
	snprintf(out, sizeof(out), "%s/edgelm-archs-%d-%s.gguf", test_tmpdir(), (int)getpid(),
	         shape);
	snprintf(args, sizeof(args), "--shape %s --vocab '%s' %s", shape, vocab, extra);
	return test_mkmodel(out, args) == 0 ? out : NULL;
}

static engine_model *load(const char *path, const char *isa)
{
	struct engine_params p = {.n_threads = 2, .isa = isa};
	engine_model *m = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(path, &p, &m, &err);
	CHECK_MSG(r == 0, "%s: %s", path, err.msg);
	return m;
}

/* Relative difference of two logit rows: max |a-b| / max |b|. */
static double rel_diff(const float *a, const float *b, int n)
{
	double d = 0, s = 1e-12;
	for (int i = 0; i < n; i++) {
		double x = fabs((double)a[i] - b[i]);
		if (!(x <= d))
			d = x; /* NaN propagates */
		if (fabs(b[i]) > s)
			s = fabs(b[i]);
	}
	return d / s;
}

/* One batch against token by token, then greedy generation. The bound is
 * 1e-4 relative for the scalar kernels (the architecture code) and `tol`
 * for the best variant of this CPU. */
static void batch_vs_tokens(engine_model *m, const char *what, double tol)
{
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	int nv = (int)info.n_vocab;
	enum { N = 9 };
	int32_t toks[N], pos[N];
	bool want[N];
	for (int i = 0; i < N; i++) {
		toks[i] = (int32_t)((i * 7919 + 13) % nv);
		pos[i] = i;
		want[i] = true;
	}
	struct engine_ctx_params cp = {.n_ctx = 64, .n_seq = 1, .n_batch = N};
	engine_ctx *a = NULL, *b = NULL;
	struct cm_err err = {0};
	CHECK_OK(engine_ctx_new(m, &cp, &a, &err));
	CHECK_OK(engine_ctx_new(m, &cp, &b, &err));
	if (!a || !b)
		goto out;
	struct engine_batch bt = {
	    .n = N, .tokens = toks, .pos = pos, .seq = NULL, .want_logits = want};
	CHECK_OK(engine_decode(a, &bt, &err));
	float *batch = malloc((size_t)N * nv * sizeof(float));
	for (int i = 0; i < N; i++) {
		const float *l = engine_get_logits(a, i);
		CHECK(l != NULL);
		if (l)
			memcpy(batch + (size_t)i * nv, l, (size_t)nv * sizeof(float));
	}
	double worst = 0;
	for (int i = 0; i < N; i++) {
		CHECK_OK(engine_eval(b, &toks[i], 1, i, &err));
		const float *l = engine_get_logits_last(b);
		double d = l ? rel_diff(l, batch + (size_t)i * nv, nv) : 1;
		if (!(d <= worst))
			worst = d;
	}
	fprintf(stderr, "%s (%s, %s kernels): batch vs token by token: max relative diff %.3g\n",
	        what, info.arch, info.isa, worst);
	CHECK_MSG(worst <= tol, "%s (%s kernels): %g > %g", what, info.isa, worst, tol);
	free(batch);

	/* greedy generation continues from the batch context */
	int32_t id = 0;
	for (int g = 0; g < 4; g++) {
		const float *l = engine_get_logits_last(a);
		int best = 0;
		for (int i = 1; i < nv; i++)
			best = l[i] > l[best] ? i : best;
		CHECK(isfinite(l[best]));
		id = best;
		CHECK_OK(engine_eval(a, &id, 1, N + g, &err));
	}
	CHECK(id >= 0 && id < nv);
out:
	engine_ctx_free(a);
	engine_ctx_free(b);
}

/* Both kernel sets: scalar and this CPU's best, each held to 1e-4 relative
 * (the matmul uses one kernel path per type whatever the batch size, so the
 * two orders agree; an earlier VNNI decode kernel differed by ~1e-3). */
static void batch_vs_tokens_isas(const char *path, const char *what, const char *arch)
{
	static const char *const isas[] = {"scalar", NULL};
	for (int k = 0; k < 2; k++) {
		engine_model *m = load(path, isas[k] ? isas[k] : getenv("EDGELM_ISA"));
		if (!m)
			continue;
		struct engine_model_info info;
		engine_model_get_info(m, &info);
		CHECK_STREQ(info.arch, arch);
		batch_vs_tokens(m, what, 1e-4);
		engine_model_free(m);
	}
}

static void run_small(const char *shape, const char *arch)
{
	const char *path = mkmodel(shape, "synthetic", "");
	CHECK(path != NULL);
	if (!path)
		return;
	batch_vs_tokens_isas(path, shape, arch);
	unlink(path);
}

static void test_small_llama(void)
{
	run_small("small", "llama");
}

static void test_small_qwen2(void)
{
	run_small("small-qwen2", "qwen2");
}

static void test_small_qwen3(void)
{
	run_small("small-qwen3", "qwen3");
}

static void test_small_phi3(void)
{
	run_small("small-phi3", "phi3");
}

static void test_small_gemma(void)
{
	run_small("small-gemma", "gemma");
}

static void test_small_gemma2(void)
{
	run_small("small-gemma2", "gemma2");
}

static void test_small_gemma3(void)
{
	run_small("small-gemma3", "gemma3");
}

/* A real shape with one layer and its vocab: loads, the chat prompt
 * tokenizes with its control tokens, the model generates. */
static void run_real(const char *shape, const char *vocab, const char *arch,
                     enum engine_chat_format want_fmt, const char *eot)
{
#if defined(__SANITIZE_ADDRESS__)
	TEST_SKIP("the real shapes take minutes under ASan");
	return;
#endif
	char vpath[4200];
	snprintf(vpath, sizeof(vpath), "%s/ggml-vocab-%s.gguf", test_data_path("vocab"), vocab);
	if (!test_file_exists(vpath)) {
		TEST_SKIP_DATA("no %s", vpath);
		return;
	}
	const char *path = mkmodel(shape, vpath, "--layers 1 --type Q8_0 --ctx 256");
	CHECK(path != NULL);
	if (!path)
		return;
	engine_model *m = load(path, getenv("EDGELM_ISA"));
	if (!m)
		goto out;
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	CHECK_STREQ(info.arch, arch);
	const engine_tokenizer *t = engine_model_tokenizer(m);

	enum engine_chat_format f;
	struct cm_err err = {0};
	CHECK_OK(engine_chat_detect(m, NULL, &f, &err));
	CHECK_MSG(f == want_fmt, "%s: %s", shape, engine_chat_format_name(f));
	static const struct engine_chat_msg msgs[] = {{ENGINE_CHAT_USER, "Hello", 5}};
	char *prompt = NULL;
	size_t plen = 0;
	CHECK_OK(engine_chat_render(f, msgs, 1, true, &prompt, &plen, &err));
	int32_t ids[256];
	int n = 0;
	CHECK_OK(engine_tokenize(t, prompt, plen, true, true, ids, 256, &n, &err));
	int32_t eot_id = engine_tokenizer_find(t, eot, strlen(eot));
	CHECK(eot_id >= 0 && engine_tokenizer_is_eog(t, eot_id));
	bool has_eot = false;
	for (int i = 0; i < n; i++)
		has_eot |= ids[i] == eot_id;
	CHECK_MSG(has_eot, "%s: the rendered prompt has no single %s token", shape, eot);
	free(prompt);
	engine_model_free(m);
	m = NULL;
	batch_vs_tokens_isas(path, shape, arch);
out:
	engine_model_free(m);
	unlink(path);
}

static void test_real_llama32(void)
{
	run_real("llama-3.2-1b", "llama-bpe", "llama", ENGINE_CHAT_LLAMA3, "<|eot_id|>");
}

static void test_real_qwen25(void)
{
	/* the qwen2 vocab file carries Qwen3's template */
	run_real("qwen2.5-0.5b", "qwen2", "qwen2", ENGINE_CHAT_QWEN3, "<|im_end|>");
}

static void test_real_qwen3(void)
{
	run_real("qwen3-0.6b", "qwen2", "qwen3", ENGINE_CHAT_QWEN3, "<|im_end|>");
}

static void test_real_phi3(void)
{
	run_real("phi-3-mini", "phi-3", "phi3", ENGINE_CHAT_PHI3, "<|end|>");
}

int main(void)
{
	TEST_RUN(test_small_llama);
	TEST_RUN(test_small_qwen2);
	TEST_RUN(test_small_qwen3);
	TEST_RUN(test_small_phi3);
	TEST_RUN(test_small_gemma);
	TEST_RUN(test_small_gemma2);
	TEST_RUN(test_small_gemma3);
	TEST_RUN(test_real_llama32);
	TEST_RUN(test_real_qwen25);
	TEST_RUN(test_real_qwen3);
	TEST_RUN(test_real_phi3);
	return test_finish();
}
