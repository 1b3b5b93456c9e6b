/* tests/unit/test_engine_model_ref.c: the engine against the reference outputs in
 * $EDGELM_TESTDATA/reference (computed in F32 by two independent
 * implementations that agree within 1e-4).
 *
 * - stories260K F32, f32 KV cache: prompt ids identical, all greedy tokens
 *   identical, every recorded logit (top-8 each step, all 512 at step 0)
 *   within 1e-3;
 * - stories260K F16 weights: the same greedy tokens;
 * - stories3M F32 (rows of 256/768, tied output): same checks as 260K;
 * - the same models with an f16 KV cache (the default): all greedy tokens
 *   identical, logits within KV_F16_TOL_* (measured 0.0137 / 0.0018);
 * - with a q8_0 KV cache: teacher-forced top-1 agreement >= KV_Q8_AGREE and
 *   logits within KV_Q8_TOL_* (docs/engine.md, "The KV cache"); over the
 *   held-out stories: test_engine_quant_agree.c;
 * - for every KV type, the result does not depend on the thread count
 *   (bitwise), nor on whether a prompt is fed in one batch, in chunks, token
 *   by token, or beside another sequence in the same batch. */
#include "engine/engine.h"
#include "tests/test.h"

#include <jansson.h>

#define LOGIT_TOL 1e-3
/* Logit bounds with a lossy KV cache, about twice what was measured (all
 * kernel variants): f16 0.0137 on stories260K, 0.0018 on stories3M. */
#define KV_F16_TOL_260K 0.03
#define KV_F16_TOL_3M 0.005
/* q8_0 (query and K both in Q8_0): the greedy picks may flip where two
 * logits nearly tie, so what is held is the teacher-forced top-1 agreement
 * with the reference (measured 98.44% on stories260K, whose head rows of 8
 * share one block scale; 100% on stories3M) and a looser logit bound
 * (measured 0.725 and 0.082). */
#define KV_Q8_AGREE 0.97
#define KV_Q8_TOL_260K 1.5
#define KV_Q8_TOL_3M 0.2

static const enum engine_kv_type kv_types[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_Q8_0};

static json_t *load_ref(const char *name)
{
	json_error_t je;
	json_t *j = json_load_file(test_data_path(name), 0, &je);
	if (!j)
		fprintf(stderr, "cannot parse %s: %s (line %d)\n", name, je.text, je.line);
	return j;
}

static engine_model *load_model(const char *rel, int threads, const char *isa)
{
	struct engine_params p = {.n_threads = threads, .isa = isa};
	struct cm_err err = {0};
	engine_model *m = NULL;
	if (engine_model_load(test_data_path(rel), &p, &m, &err) != 0) {
		fprintf(stderr, "load %s: %s\n", rel, err.msg);
		return NULL;
	}
	return m;
}

static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

struct ref_stats {
	int prompts, tokens, token_mismatch, logits_checked;
	double max_diff;
};

/* Teacher-forced on the reference tokens so that a mismatch is counted once,
 * not cascaded. check_logits: compare the recorded values. */
static void run_reference(engine_model *m, json_t *ref, enum engine_kv_type kv, bool check_logits,
			  double tol, struct ref_stats *st)
{
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	const engine_tokenizer *tok = engine_model_tokenizer(m);
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	struct engine_ctx_params cp = {.n_seq = 1, .n_batch = 64, .kv_type = kv};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	if (!c)
		return;
	size_t pi;
	json_t *item;
	json_array_foreach(ref, pi, item) {
		const char *prompt = json_string_value(json_object_get(item, "prompt"));
		json_t *ptoks = json_object_get(item, "prompt_tokens");
		json_t *steps = json_object_get(item, "steps");
		CHECK(prompt && ptoks && steps);
		if (!prompt || !ptoks || !steps)
			continue;
		int32_t ids[1024];
		int n = 0;
		CHECK_OK(engine_tokenize(tok, prompt, strlen(prompt), true, false, ids, 1024, &n,
					 &err));
		CHECK_EQ_INT(n, (long long)json_array_size(ptoks));
		for (int i = 0; i < n && i < (int)json_array_size(ptoks); i++)
			CHECK_EQ_INT(ids[i], json_integer_value(json_array_get(ptoks, (size_t)i)));
		engine_seq_truncate(c, 0, 0);
		CHECK_OK(engine_eval(c, ids, n, 0, &err));
		int pos = n;
		size_t si;
		json_t *step;
		json_array_foreach(steps, si, step) {
			const float *l = engine_get_logits_last(c);
			int want = (int)json_integer_value(json_object_get(step, "token"));
			int got = argmax(l, (int)info.n_vocab);
			st->tokens++;
			if (got != want) {
				st->token_mismatch++;
				if (kv != ENGINE_KV_Q8_0)
					fprintf(stderr, "prompt %zu step %zu: token %d, reference %d\n",
						pi, si, got, want);
			}
			if (check_logits) {
				size_t ti;
				json_t *pair;
				json_array_foreach(json_object_get(step, "top"), ti, pair) {
					int id = (int)json_integer_value(json_array_get(pair, 0));
					double v = json_number_value(json_array_get(pair, 1));
					double d = fabs(l[id] - v);
					st->max_diff = d > st->max_diff ? d : st->max_diff;
					st->logits_checked++;
					CHECK_MSG(d <= tol, "prompt %zu step %zu id %d: %f vs %f", pi, si,
						  id, l[id], v);
				}
				json_t *all = json_object_get(step, "logits");
				if (all) {
					CHECK_EQ_INT(json_array_size(all), info.n_vocab);
					for (size_t k = 0; k < json_array_size(all) && k < info.n_vocab;
					     k++) {
						double v = json_number_value(json_array_get(all, k));
						double d = fabs(l[k] - v);
						st->max_diff = d > st->max_diff ? d : st->max_diff;
						st->logits_checked++;
						CHECK_MSG(d <= tol, "prompt %zu step 0 id %zu: %f vs %f",
							  pi, k, l[k], v);
					}
				}
			}
			int32_t next = want;
			if (si + 1 < json_array_size(steps)) {
				CHECK_OK(engine_eval(c, &next, 1, pos, &err));
				pos++;
			}
		}
		st->prompts++;
	}
	engine_ctx_free(c);
}

/* Greedy tokens identical (min_agree 1) or at least min_agree of them,
 * teacher-forced; logits within tol. */
static void check_model_kv(const char *model, const char *ref_name, enum engine_kv_type kv,
			   double tol, double min_agree)
{
	if (!test_file_exists(test_data_path(model)) || !test_file_exists(test_data_path(ref_name))) {
		TEST_SKIP_DATA("%s or %s not found under $EDGELM_TESTDATA (%s)", model, ref_name,
			  test_data_path(""));
		return;
	}
	json_t *ref = load_ref(ref_name);
	engine_model *m = load_model(model, 0, NULL);
	CHECK(ref && m);
	if (ref && m) {
		struct ref_stats st = {0};
		run_reference(m, ref, kv, true, tol, &st);
		double agree = st.tokens ? 1.0 - (double)st.token_mismatch / st.tokens : 0;
		if (min_agree >= 1.0)
			CHECK_EQ_INT(st.token_mismatch, 0);
		else
			CHECK_MSG(agree >= min_agree, "top-1 agreement %.4f below %.4f", agree,
				  min_agree);
		CHECK(st.prompts >= 5 && st.tokens >= 5 * 64);
		fprintf(stderr,
			"%s, %s KV: %d prompts, %d tokens, %d mismatches (top-1 agreement %.2f%%), "
			"%d logits, max |diff| %.2e\n",
			model, engine_kv_type_name(kv), st.prompts, st.tokens, st.token_mismatch,
			100 * agree, st.logits_checked, st.max_diff);
	}
	engine_model_free(m);
	json_decref(ref);
}

static void check_model(const char *model, const char *ref_name, double tol)
{
	check_model_kv(model, ref_name, ENGINE_KV_F32, tol, 1.0);
}

static void test_stories260k_f32(void)
{
	check_model("models/stories260K-f32.gguf", "reference/stories260K-f32.json", LOGIT_TOL);
}

static void test_stories260k_f16(void)
{
	/* F16 weights: same tokens; logits within a looser, measured bound. */
	check_model("models/stories260K-f16.gguf", "reference/stories260K-f32.json", 0.02);
}

static void test_stories3m_f32(void)
{
	check_model("models/stories3M-f32.gguf", "reference/stories3M-f32.json", LOGIT_TOL);
}

static void test_stories260k_kv_f16(void)
{
	check_model_kv("models/stories260K-f32.gguf", "reference/stories260K-f32.json",
		       ENGINE_KV_F16, KV_F16_TOL_260K, 1.0);
}

static void test_stories3m_kv_f16(void)
{
	check_model_kv("models/stories3M-f32.gguf", "reference/stories3M-f32.json", ENGINE_KV_F16,
		       KV_F16_TOL_3M, 1.0);
}

/* head_dim 8: one zero-padded Q8_0 block per head row */
static void test_stories260k_kv_q8_0(void)
{
	check_model_kv("models/stories260K-f32.gguf", "reference/stories260K-f32.json",
		       ENGINE_KV_Q8_0, KV_Q8_TOL_260K, KV_Q8_AGREE);
}

static void test_stories3m_kv_q8_0(void)
{
	check_model_kv("models/stories3M-f32.gguf", "reference/stories3M-f32.json", ENGINE_KV_Q8_0,
		       KV_Q8_TOL_3M, KV_Q8_AGREE);
}

/* The default (ENGINE_KV_DEFAULT) is f16. */
static void test_kv_default(void)
{
	enum engine_kv_type t = ENGINE_KV_DEFAULT;
	CHECK_STREQ(engine_kv_type_name(ENGINE_KV_DEFAULT), "f16");
	CHECK_STREQ(engine_kv_type_name(ENGINE_KV_Q8_0), "q8_0");
	CHECK_STREQ(engine_kv_type_list(), "f32|f16|q8_0");
	CHECK_OK(engine_kv_type_from_name("Q8_0", &t));
	CHECK_EQ_INT(t, ENGINE_KV_Q8_0);
	CHECK_EQ_INT(engine_kv_type_from_name("q4_0", &t), -ENOENT);
	CHECK_EQ_INT(engine_kv_type_from_name("", &t), -ENOENT);
}

/* Generate greedily n tokens after `prompt` and return all the logits seen
 * (n_vocab * n floats, malloc'ed). */
static float *greedy_trace_kv(engine_model *m, const char *prompt, int n, bool one_by_one,
			      enum engine_kv_type kv, uint32_t n_batch)
{
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	struct engine_ctx_params cp = {.n_seq = 1, .n_batch = n_batch, .kv_type = kv};
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	if (engine_ctx_new(m, &cp, &c, &err) != 0)
		return NULL;
	float *out = malloc(sizeof(float) * info.n_vocab * (size_t)n);
	int32_t ids[256];
	int np = 0;
	engine_tokenize(engine_model_tokenizer(m), prompt, strlen(prompt), true, false, ids, 256,
			&np, &err);
	if (one_by_one) {
		for (int i = 0; i < np; i++)
			CHECK_OK(engine_eval(c, &ids[i], 1, i, &err));
	} else {
		CHECK_OK(engine_eval(c, ids, np, 0, &err));
	}
	for (int s = 0; s < n; s++) {
		const float *l = engine_get_logits_last(c);
		memcpy(out + (size_t)s * info.n_vocab, l, sizeof(float) * info.n_vocab);
		int32_t t = argmax(l, (int)info.n_vocab);
		CHECK_OK(engine_eval(c, &t, 1, np + s, &err));
	}
	engine_ctx_free(c);
	return out;
}

static float *greedy_trace(engine_model *m, const char *prompt, int n, bool one_by_one)
{
	return greedy_trace_kv(m, prompt, n, one_by_one, ENGINE_KV_DEFAULT, 64);
}

static void test_threads_invariant(void)
{
	const char *model = "models/stories260K-f32.gguf";
	if (!test_file_exists(test_data_path(model))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", model);
		return;
	}
	engine_model *m1 = load_model(model, 1, NULL), *m2 = load_model(model, 2, NULL);
	engine_model *m3 = load_model(model, 3, NULL);
	CHECK(m1 && m2 && m3);
	for (size_t k = 0; m1 && m2 && m3 && k < CM_ARRAY_LEN(kv_types); k++) {
		int n = 24;
		const char *p = "Lily and Tom went to the park";
		float *a = greedy_trace_kv(m1, p, n, false, kv_types[k], 64);
		float *b = greedy_trace_kv(m2, p, n, false, kv_types[k], 64);
		float *d = greedy_trace_kv(m3, p, n, false, kv_types[k], 64);
		CHECK(a && b && d);
		if (a && b && d) {
			CHECK_MSG(memcmp(a, b, sizeof(float) * 512 * (size_t)n) == 0, "%s KV",
				  engine_kv_type_name(kv_types[k]));
			CHECK_MSG(memcmp(a, d, sizeof(float) * 512 * (size_t)n) == 0, "%s KV",
				  engine_kv_type_name(kv_types[k]));
		}
		free(a);
		free(b);
		free(d);
	}
	engine_model_free(m1);
	engine_model_free(m2);
	engine_model_free(m3);
}

/* One batch, in chunks of 3 (the prefill option) or token by token, alone
 * or beside another sequence: the same logits, bit for bit, for each KV
 * type. Run on F32 and on quantized files, whose kernels have separate
 * one-token and many-token paths (regression: the AVX-512 VNNI decode
 * kernel summed in another order than its tile kernel, so a greedy request
 * could change its text when others shared its steps). */
static void batch_invariant_kv(engine_model *m, enum engine_kv_type kv)
{
	const char *kvn = engine_kv_type_name(kv);
	int n = 16;
	float *a = greedy_trace_kv(m, "The little dog was sad because", n, false, kv, 64);
	float *b = greedy_trace_kv(m, "The little dog was sad because", n, true, kv, 64);
	float *ch = greedy_trace_kv(m, "The little dog was sad because", n, false, kv, 3);
	CHECK_MSG(a && b && memcmp(a, b, sizeof(float) * 512 * (size_t)n) == 0, "%s KV", kvn);
	CHECK_MSG(a && ch && memcmp(a, ch, sizeof(float) * 512 * (size_t)n) == 0,
		  "%s KV, chunks of 3", kvn);
	free(ch);

	/* Two sequences in one batch: each must see exactly what it saw alone. */
	struct engine_ctx_params cp = {.n_seq = 2, .n_batch = 64, .kv_type = kv};
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	const engine_tokenizer *tok = engine_model_tokenizer(m);
	int32_t p0[64], p1[64];
	int n0 = 0, n1 = 0;
	engine_tokenize(tok, "The little dog was sad because", 30, true, false, p0, 64, &n0, &err);
	engine_tokenize(tok, "One day", 7, true, false, p1, 64, &n1, &err);
	int32_t toks[128], pos[128], seq[128];
	bool want[128];
	int k = 0;
	for (int i = 0; i < n1; i++, k++) {
		toks[k] = p1[i], pos[k] = i, seq[k] = 1, want[k] = i == n1 - 1;
	}
	for (int i = 0; i < n0; i++, k++) {
		toks[k] = p0[i], pos[k] = i, seq[k] = 0, want[k] = i == n0 - 1;
	}
	struct engine_batch bt = {.n = k, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
	CHECK_OK(engine_decode(c, &bt, &err));
	const float *l0 = engine_get_logits(c, k - 1);
	CHECK_MSG(l0 && a && memcmp(l0, a, 512 * sizeof(float)) == 0, "%s KV", kvn);
	/* Then decode both sequences together, step by step. */
	int32_t t0 = argmax(l0, 512), t1 = argmax(engine_get_logits(c, n1 - 1), 512);
	for (int s = 1; s < n; s++) {
		int32_t tk[2] = {t1, t0}, ps[2] = {n1 + s - 1, n0 + s - 1}, sq[2] = {1, 0};
		bool w[2] = {true, true};
		struct engine_batch b2 = {.n = 2, .tokens = tk, .pos = ps, .seq = sq, .want_logits = w};
		CHECK_OK(engine_decode(c, &b2, &err));
		const float *l = engine_get_logits(c, 1);
		CHECK_MSG(l && a && memcmp(l, a + (size_t)s * 512, 512 * sizeof(float)) == 0,
			  "%s KV: step %d differs", kvn, s);
		t0 = argmax(l, 512);
		t1 = argmax(engine_get_logits(c, 0), 512);
	}
	engine_ctx_free(c);
	free(a);
	free(b);
}

static void batch_invariant(const char *model)
{
	if (!test_file_exists(test_data_path(model))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", model);
		return;
	}
	engine_model *m = load_model(model, 2, NULL);
	CHECK(m != NULL);
	for (size_t k = 0; m && k < CM_ARRAY_LEN(kv_types); k++)
		batch_invariant_kv(m, kv_types[k]);
	engine_model_free(m);
}

static void test_batch_invariant(void)
{
	batch_invariant("models/stories260K-f32.gguf");
}

static void test_batch_invariant_q8_0(void)
{
	batch_invariant("models/stories3M-q8_0.gguf");
}

static void test_batch_invariant_q4_0(void)
{
	batch_invariant("models/stories3M-q4_0.gguf");
}

static void test_batch_invariant_q4_k_m(void)
{
	batch_invariant("models/stories3M-q4_k_m.gguf");
}

/* KV bytes follow the type: what engine_model_kv_bytes_per_token says is
 * what engine_ctx_regions reports (mlock, prefault, admission), and a
 * prefix copied with engine_seq_copy continues exactly as the original. */
static void test_kv_bytes_and_copy(void)
{
	static const char *const models[] = {"models/stories260K-f32.gguf",
					     "models/stories3M-f32.gguf"};
	for (size_t mi = 0; mi < CM_ARRAY_LEN(models); mi++) {
		if (!test_file_exists(test_data_path(models[mi]))) {
			TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", models[mi]);
			return;
		}
		engine_model *m = load_model(models[mi], 2, NULL);
		CHECK(m != NULL);
		if (!m)
			return;
		struct engine_model_info info;
		engine_model_get_info(m, &info);
		uint64_t kvd = (uint64_t)info.n_head_kv * info.head_dim;
		uint64_t blocks = (uint64_t)info.n_head_kv * ((info.head_dim + 31) / 32);
		CHECK_EQ_INT(engine_model_kv_bytes_per_token(m, ENGINE_KV_F32),
			     2ull * info.n_layer * kvd * 4);
		CHECK_EQ_INT(engine_model_kv_bytes_per_token(m, ENGINE_KV_F16),
			     2ull * info.n_layer * kvd * 2);
		CHECK_EQ_INT(engine_model_kv_bytes_per_token(m, ENGINE_KV_DEFAULT),
			     engine_model_kv_bytes_per_token(m, ENGINE_KV_F16));
		CHECK_EQ_INT(engine_model_kv_bytes_per_token(m, ENGINE_KV_Q8_0),
			     2ull * info.n_layer * blocks * 34);
		for (size_t k = 0; k < CM_ARRAY_LEN(kv_types); k++) {
			struct engine_ctx_params cp = {
				.n_ctx = 64, .n_seq = 3, .n_batch = 16, .kv_type = kv_types[k]};
			engine_ctx *c = NULL;
			struct cm_err err = {0};
			CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
			if (!c)
				continue;
			CHECK_EQ_INT(engine_ctx_kv_type(c), kv_types[k]);
			CHECK_EQ_INT(engine_ctx_n_ctx(c), 64);
			struct engine_region r[4];
			int nr = engine_ctx_regions(c, r, 4);
			uint64_t sum = 0;
			for (int i = 0; i < nr; i++)
				sum += r[i].len;
			CHECK_EQ_INT(sum, engine_model_kv_bytes_per_token(m, kv_types[k]) * 64 * 3);

			/* a 20-token prompt in seq 0 (in chunks of 16); its first 19
			 * positions copied to seq 2, which then computes the last */
			int32_t ids[20];
			for (int i = 0; i < 20; i++)
				ids[i] = (int32_t)((i * 37 + 1) % (int)info.n_vocab);
			CHECK_OK(engine_eval(c, ids, 20, 0, &err));
			float *l0 = malloc(sizeof(float) * info.n_vocab);
			memcpy(l0, engine_get_logits_last(c), sizeof(float) * info.n_vocab);
			CHECK_OK(engine_seq_copy(c, 2, 0, 19));
			CHECK_EQ_INT(engine_seq_len(c, 2), 19);
			int32_t pos = 19, seq = 2;
			struct engine_batch b = {.n = 1, .tokens = &ids[19], .pos = &pos, .seq = &seq};
			CHECK_OK(engine_decode(c, &b, &err));
			CHECK_MSG(memcmp(l0, engine_get_logits_last(c), sizeof(float) * info.n_vocab) ==
					  0,
				  "%s, %s KV: copied prefix", models[mi],
				  engine_kv_type_name(kv_types[k]));
			CHECK_EQ_INT(engine_seq_copy(c, 1, 0, 21), -EINVAL);
			free(l0);
			engine_ctx_free(c);
		}
		struct engine_ctx_params bad = {.n_ctx = 8, .kv_type = (enum engine_kv_type)9};
		engine_ctx *c = NULL;
		struct cm_err err = {0};
		CHECK_EQ_INT(engine_ctx_new(m, &bad, &c, &err), -EINVAL);
		CHECK(strstr(err.msg, "f32|f16|q8_0") != NULL);
		engine_model_free(m);
	}
}

/* Every allocation of engine_ctx_new may fail: -ENOMEM with a message
 * naming the KV type, nothing leaked or read after free (ASan), for each
 * type (regression: the message read the freed context). */
static void test_ctx_alloc_failures(void)
{
	const char *model = "models/stories260K-f32.gguf";
	if (!test_file_exists(test_data_path(model))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", model);
		return;
	}
	engine_model *m = load_model(model, 1, NULL);
	CHECK(m != NULL);
	for (size_t k = 0; m && k < CM_ARRAY_LEN(kv_types); k++) {
		struct engine_ctx_params cp = {.n_ctx = 32, .n_seq = 2, .n_batch = 8,
					       .kv_type = kv_types[k]};
		int after = 0, r = -ENOMEM;
		for (; after < 100 && r == -ENOMEM; after++) {
			engine_ctx *c = NULL;
			struct cm_err err = {0};
			cm_alloc_fail_reset(after);
			r = engine_ctx_new(m, &cp, &c, &err);
			cm_alloc_fail_reset(-1);
			if (r == -ENOMEM && after == 0) /* the context itself */
				CHECK_STREQ(err.msg, "ctx: out of memory");
			else if (r == -ENOMEM)
				CHECK_MSG(strstr(err.msg, engine_kv_type_name(kv_types[k])) != NULL,
					  "%s", err.msg);
			else
				CHECK_OK(r);
			engine_ctx_free(c);
		}
		CHECK_MSG(r == 0 && after > 10, "%s KV: %d allocations", engine_kv_type_name(kv_types[k]),
			  after);
	}
	engine_model_free(m);
}

/* Weights copied elsewhere (the huge-page option) compute the same logits. */
static void test_relocated(void)
{
	const char *model = "models/stories260K-f32.gguf";
	if (!test_file_exists(test_data_path(model))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", model);
		return;
	}
	engine_model *a = load_model(model, 2, NULL), *b = load_model(model, 2, NULL);
	CHECK(a && b);
	if (!a || !b)
		goto out;
	struct engine_region r;
	engine_model_region(b, &r);
	void *buf = cm_aligned_alloc(r.len);
	struct cm_err err = {0};
	CHECK_OK(engine_model_relocate(b, buf, r.len, &err));
	struct engine_region r2;
	engine_model_region(b, &r2);
	CHECK(r2.addr == buf);
	CHECK(engine_model_relocate(b, buf, r.len, &err) == -EINVAL); /* only once */
	float *x = greedy_trace(a, "One day, a big red ball", 12, false);
	float *y = greedy_trace(b, "One day, a big red ball", 12, false);
	CHECK(x && y && memcmp(x, y, sizeof(float) * 512 * 12) == 0);
	free(x);
	free(y);
	engine_model_free(b);
	b = NULL;
	cm_free(buf);
out:
	engine_model_free(a);
	engine_model_free(b);
}

static void test_bad_batches(void)
{
	const char *model = "models/stories260K-f32.gguf";
	if (!test_file_exists(test_data_path(model))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", model);
		return;
	}
	engine_model *m = load_model(model, 1, NULL);
	CHECK(m != NULL);
	if (!m)
		return;
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	struct engine_ctx_params cp = {.n_ctx = 32, .n_seq = 1, .n_batch = 8};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	int32_t tk[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, ps[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
	struct engine_batch b = {.n = 9, .tokens = tk, .pos = ps};
	CHECK_EQ_INT(engine_decode(c, &b, &err), -EINVAL); /* over n_batch */
	b.n = 1;
	int32_t bad_tok = 512;
	b.tokens = &bad_tok;
	CHECK_EQ_INT(engine_decode(c, &b, &err), -EINVAL);
	b.tokens = tk;
	int32_t far = 5;
	b.pos = &far;
	CHECK_EQ_INT(engine_decode(c, &b, &err), -EINVAL); /* gap in positions */
	int32_t past = 32;
	b.pos = &past;
	CHECK_EQ_INT(engine_decode(c, &b, &err), -ENOSPC);
	CHECK(strstr(err.msg, "context") != NULL);
	engine_ctx_free(c);
	engine_model_free(m);
}

int main(void)
{
	TEST_RUN(test_stories260k_f32);
	TEST_RUN(test_stories260k_f16);
	TEST_RUN(test_stories3m_f32);
	TEST_RUN(test_stories260k_kv_f16);
	TEST_RUN(test_stories3m_kv_f16);
	TEST_RUN(test_stories260k_kv_q8_0);
	TEST_RUN(test_stories3m_kv_q8_0);
	TEST_RUN(test_kv_default);
	TEST_RUN(test_threads_invariant);
	TEST_RUN(test_batch_invariant);
	TEST_RUN(test_batch_invariant_q8_0);
	TEST_RUN(test_batch_invariant_q4_0);
	TEST_RUN(test_batch_invariant_q4_k_m);
	TEST_RUN(test_relocated);
	TEST_RUN(test_kv_bytes_and_copy);
	TEST_RUN(test_ctx_alloc_failures);
	TEST_RUN(test_bad_batches);
	return test_finish();
}
