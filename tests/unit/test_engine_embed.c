/* tests/unit/test_engine_embed.c: embeddings (engine_embed, want_embd).
 *
 * - pooling names parse and print both ways;
 * - the hidden state is the one the logits come from: W_out . h equals the
 *   engine's logits (the teacher: a plain dot product over the F32 file);
 * - an embedding-only batch computes no logits;
 * - same input, same vector; unit norm; chunking (n_batch) and sharing a
 *   batch with other sequences change nothing beyond 1e-5;
 * - cls is the first token's state normalised, last the last one's, mean
 *   differs from both;
 * - empty input, an input longer than the context and pooling none are
 *   refused;
 * - <arch>.pooling_type in the file is reported and is the default (a copy
 *   of the model with the key set); none there means mean. */
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/gguf.h"
#include "tests/test.h"

#define MODEL "models/stories260K-f32.gguf"
#define TOL 1e-5

static const char *const texts[] = {
	"Once upon a time there was a little dog.",
	"The cat sat on the mat and looked at the sun.",
	"Tim and Sue went to the park to play with a big red ball.",
};

static engine_model *load(void)
{
	if (!test_file_exists(test_data_path(MODEL))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", MODEL);
		return NULL;
	}
	struct engine_params p = {.n_threads = 2};
	struct cm_err err = {0};
	engine_model *m = NULL;
	if (engine_model_load(test_data_path(MODEL), &p, &m, &err) != 0)
		fprintf(stderr, "load: %s\n", err.msg);
	CHECK(m);
	return m;
}

static engine_ctx *new_ctx(engine_model *m, uint32_t n_seq, uint32_t n_batch, uint32_t n_ctx)
{
	struct engine_ctx_params cp = {.n_ctx = n_ctx, .n_seq = n_seq, .n_batch = n_batch,
				       .kv_type = ENGINE_KV_F32};
	struct cm_err err = {0};
	engine_ctx *c = NULL;
	CHECK_EQ_INT(engine_ctx_new(m, &cp, &c, &err), 0);
	return c;
}

static int tokenize(engine_model *m, const char *text, int32_t *ids, int max)
{
	int n = 0;
	CHECK_EQ_INT(engine_tokenize(engine_model_tokenizer(m), text, strlen(text), true, false,
				     ids, max, &n, NULL),
		     0);
	return n;
}

static double max_diff(const float *a, const float *b, int n)
{
	double d = 0;
	for (int i = 0; i < n; i++)
		d = fmax(d, fabs((double)a[i] - b[i]));
	return d;
}

static double norm(const float *v, int n)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)v[i] * v[i];
	return sqrt(ss);
}

static void test_pooling_names(void)
{
	enum engine_pooling p;
	static const char *const names[] = {"none", "mean", "cls", "last"};
	for (int i = 0; i < 4; i++) {
		CHECK_EQ_INT(engine_pooling_parse(names[i], &p), 0);
		CHECK_EQ_INT((int)p, i);
		CHECK(strcmp(engine_pooling_name(p), names[i]) == 0);
	}
	CHECK_EQ_INT(engine_pooling_parse("MEAN", &p), 0);
	CHECK_EQ_INT((int)p, ENGINE_POOL_MEAN);
	CHECK_EQ_INT(engine_pooling_parse("rank", &p), -ENOENT);
	CHECK_EQ_INT(engine_pooling_parse(NULL, &p), -ENOENT);
	CHECK(strcmp(engine_pooling_name(ENGINE_POOL_UNSPECIFIED), "unspecified") == 0);
	CHECK(strcmp(engine_pooling_name((enum engine_pooling)9), "?") == 0);
}

/* The teacher: logits = W_out . h over the F32 output matrix. */
static void test_hidden_state_teacher(void)
{
	engine_model *m = load();
	if (!m)
		return;
	struct engine_model_info in;
	engine_model_get_info(m, &in);
	CHECK_EQ_INT(in.pooling, ENGINE_POOL_UNSPECIFIED); /* the file has no pooling_type */
	CHECK_EQ_INT((int)engine_pooling_resolve(m, ENGINE_POOL_UNSPECIFIED), ENGINE_POOL_MEAN);
	CHECK_EQ_INT((int)engine_pooling_resolve(m, ENGINE_POOL_CLS), ENGINE_POOL_CLS);
	engine_ctx *c = new_ctx(m, 1, 64, 0);
	int32_t ids[64], pos[64];
	bool wl[64], we[64];
	int n = tokenize(m, texts[0], ids, 64);
	for (int i = 0; i < n; i++) {
		pos[i] = i;
		wl[i] = i % 3 == 0;
		we[i] = i % 2 == 0;
	}
	struct engine_batch b = {.n = n, .tokens = ids, .pos = pos, .want_logits = wl,
				 .want_embd = we};
	CHECK_EQ_INT(engine_decode(c, &b, NULL), 0);
	const struct weight *w = &m->output;
	CHECK_EQ_INT((int)w->type, ENGINE_DTYPE_F32);
	int checked = 0;
	double worst = 0;
	for (int i = 0; i < n; i++) {
		const float *h = engine_get_embd(c, i), *l = engine_get_logits(c, i);
		CHECK((h != NULL) == we[i]);
		if (!h || !l)
			continue;
		for (int64_t v = 0; v < w->n_out; v++) {
			const float *row = (const float *)((const char *)w->data + v * w->row_bytes);
			double dot = 0;
			for (int64_t k = 0; k < w->n_in; k++)
				dot += (double)row[k] * h[k];
			worst = fmax(worst, fabs(dot - l[v]));
		}
		checked++;
	}
	CHECK(checked >= 2);
	CHECK_MSG(worst < 1e-3, "W_out . h vs logits: %g", worst);

	/* embeddings only: no logits, no output matmul */
	engine_seq_truncate(c, 0, 0);
	b.want_logits = NULL;
	CHECK_EQ_INT(engine_decode(c, &b, NULL), 0);
	for (int i = 0; i < n; i++)
		CHECK(engine_get_logits(c, i) == NULL);
	CHECK(engine_get_logits_last(c) == NULL);
	CHECK(engine_get_embd(c, n) == NULL);
	engine_ctx_free(c);
	engine_model_free(m);
}

static void test_embed_pooling(void)
{
	engine_model *m = load();
	if (!m)
		return;
	int E = (int)m->hp.n_embd;
	engine_ctx *c = new_ctx(m, 1, 64, 0);
	int32_t ids[64], pos[64];
	bool we[64];
	int n = tokenize(m, texts[1], ids, 64);
	float mean[E], mean2[E], cls[E], last[E], h0[E], hn[E];
	CHECK_EQ_INT(engine_embed(c, 0, ids, n, ENGINE_POOL_UNSPECIFIED, mean, NULL), 0);
	CHECK_EQ_INT(engine_seq_len(c, 0), 0);
	CHECK_EQ_INT(engine_embed(c, 0, ids, n, ENGINE_POOL_MEAN, mean2, NULL), 0);
	CHECK(memcmp(mean, mean2, sizeof(mean)) == 0);
	CHECK(fabs(norm(mean, E) - 1) < 1e-6);
	CHECK_EQ_INT(engine_embed(c, 0, ids, n, ENGINE_POOL_CLS, cls, NULL), 0);
	CHECK_EQ_INT(engine_embed(c, 0, ids, n, ENGINE_POOL_LAST, last, NULL), 0);
	CHECK(fabs(norm(cls, E) - 1) < 1e-6 && fabs(norm(last, E) - 1) < 1e-6);

	/* the states of a plain decode, normalised by hand */
	for (int i = 0; i < n; i++) {
		pos[i] = i;
		we[i] = true;
	}
	struct engine_batch b = {.n = n, .tokens = ids, .pos = pos, .want_embd = we};
	CHECK_EQ_INT(engine_decode(c, &b, NULL), 0);
	double sum[E];
	memset(sum, 0, sizeof(sum));
	for (int i = 0; i < n; i++)
		for (int k = 0; k < E; k++)
			sum[k] += engine_get_embd(c, i)[k];
	memcpy(h0, engine_get_embd(c, 0), sizeof(h0));
	memcpy(hn, engine_get_embd(c, n - 1), sizeof(hn));
	float hm[E];
	for (int k = 0; k < E; k++)
		hm[k] = (float)(sum[k] / n);
	engine_embd_normalize(h0, E);
	engine_embd_normalize(hn, E);
	engine_embd_normalize(hm, E);
	CHECK_MSG(max_diff(cls, h0, E) < TOL, "cls %g", max_diff(cls, h0, E));
	CHECK_MSG(max_diff(last, hn, E) < TOL, "last %g", max_diff(last, hn, E));
	CHECK_MSG(max_diff(mean, hm, E) < TOL, "mean %g", max_diff(mean, hm, E));
	CHECK(max_diff(mean, cls, E) > 1e-3 && max_diff(mean, last, E) > 1e-3 &&
	      max_diff(cls, last, E) > 1e-3);

	/* refusals */
	struct cm_err err = {0};
	CHECK_EQ_INT(engine_embed(c, 0, ids, 0, ENGINE_POOL_MEAN, mean2, &err), -EINVAL);
	CHECK_EQ_INT(engine_embed(c, 0, ids, n, ENGINE_POOL_NONE, mean2, &err), -EINVAL);
	CHECK_EQ_INT(engine_embed(c, 1, ids, n, ENGINE_POOL_MEAN, mean2, &err), -EINVAL);
	engine_ctx_free(c);

	engine_ctx *small = new_ctx(m, 1, 8, 8);
	CHECK_EQ_INT(engine_embed(small, 0, ids, n, ENGINE_POOL_MEAN, mean2, &err), -ENOSPC);
	CHECK(strstr(err.msg, "context") != NULL);
	engine_ctx_free(small);
	engine_model_free(m);
}

/* Chunks of 5 tokens, and three inputs side by side in one batch, give the
 * single-batch vectors. */
static void test_embed_batching(void)
{
	engine_model *m = load();
	if (!m)
		return;
	int E = (int)m->hp.n_embd;
	engine_ctx *one = new_ctx(m, 1, 128, 0), *chunked = new_ctx(m, 1, 5, 0),
		   *multi = new_ctx(m, 3, 192, 0);
	int32_t ids[3][64], all_ids[192], all_pos[192], all_seq[192];
	bool we[192];
	int n[3], T = 0;
	float ref[3][E], v[E];
	for (int s = 0; s < 3; s++) {
		n[s] = tokenize(m, texts[s], ids[s], 64);
		CHECK_EQ_INT(engine_embed(one, 0, ids[s], n[s], ENGINE_POOL_MEAN, ref[s], NULL), 0);
		CHECK_EQ_INT(engine_embed(chunked, 0, ids[s], n[s], ENGINE_POOL_MEAN, v, NULL), 0);
		CHECK_MSG(max_diff(v, ref[s], E) < TOL, "chunked %g", max_diff(v, ref[s], E));
		for (int i = 0; i < n[s]; i++, T++) {
			all_ids[T] = ids[s][i];
			all_pos[T] = i;
			all_seq[T] = s;
			we[T] = true;
		}
	}
	struct engine_batch b = {.n = T, .tokens = all_ids, .pos = all_pos, .seq = all_seq,
				 .want_embd = we};
	CHECK_EQ_INT(engine_decode(multi, &b, NULL), 0);
	for (int s = 0, t = 0; s < 3; s++) {
		double sum[E];
		memset(sum, 0, sizeof(sum));
		for (int i = 0; i < n[s]; i++, t++)
			for (int k = 0; k < E; k++)
				sum[k] += engine_get_embd(multi, t)[k];
		for (int k = 0; k < E; k++)
			v[k] = (float)(sum[k] / n[s]);
		engine_embd_normalize(v, E);
		CHECK_MSG(max_diff(v, ref[s], E) < TOL, "shared batch %g", max_diff(v, ref[s], E));
	}
	/* different inputs, different vectors */
	CHECK(max_diff(ref[0], ref[1], E) > 1e-3);
	engine_ctx_free(one);
	engine_ctx_free(chunked);
	engine_ctx_free(multi);
	engine_model_free(m);
}

/* A copy of the model with llama.pooling_type = v, at path. */
static int write_with_pooling(const char *path, uint32_t v)
{
	struct gguf_file *f = NULL;
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	int rc = gguf_open(test_data_path(MODEL), &f, &err);
	if (!rc)
		rc = gguf_writer_new(&w, &err);
	if (!rc)
		rc = gguf_writer_copy_kv(w, f, NULL, NULL);
	if (!rc)
		rc = gguf_writer_set_u32(w, "llama.pooling_type", v);
	for (uint64_t i = 0; !rc && i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, &err);
	}
	if (!rc)
		rc = gguf_writer_write(w, path, &err);
	if (rc)
		fprintf(stderr, "write %s: %s\n", path, err.msg);
	gguf_writer_free(w);
	gguf_close(f);
	return rc;
}

static void test_pooling_from_file(void)
{
	if (!test_file_exists(test_data_path(MODEL))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", MODEL);
		return;
	}
	static const struct {
		uint32_t v;
		int info, used;
	} cases[] = {{3, ENGINE_POOL_LAST, ENGINE_POOL_LAST}, {2, ENGINE_POOL_CLS, ENGINE_POOL_CLS},
		     {0, ENGINE_POOL_NONE, ENGINE_POOL_MEAN}, {4, ENGINE_POOL_UNSPECIFIED, ENGINE_POOL_MEAN}};
	char path[4200];
	snprintf(path, sizeof(path), "%s/pooling.gguf", test_tmpdir());
	for (size_t k = 0; k < CM_ARRAY_LEN(cases); k++) {
		CHECK_EQ_INT(write_with_pooling(path, cases[k].v), 0);
		struct engine_params p = {.n_threads = 1};
		engine_model *m = NULL;
		CHECK_EQ_INT(engine_model_load(path, &p, &m, NULL), 0);
		if (!m)
			continue;
		struct engine_model_info in;
		engine_model_get_info(m, &in);
		CHECK_EQ_INT(in.pooling, cases[k].info);
		CHECK_EQ_INT((int)engine_pooling_resolve(m, ENGINE_POOL_UNSPECIFIED), cases[k].used);
		int E = (int)in.n_embd;
		engine_ctx *c = new_ctx(m, 1, 64, 0);
		int32_t ids[64];
		int n = tokenize(m, texts[0], ids, 64);
		float a[E], b[E];
		CHECK_EQ_INT(engine_embed(c, 0, ids, n, ENGINE_POOL_UNSPECIFIED, a, NULL), 0);
		CHECK_EQ_INT(engine_embed(c, 0, ids, n, (enum engine_pooling)cases[k].used, b, NULL), 0);
		CHECK(memcmp(a, b, sizeof(a)) == 0);
		engine_ctx_free(c);
		engine_model_free(m);
	}
}

int main(void)
{
	TEST_RUN(test_pooling_names);
	TEST_RUN(test_hidden_state_teacher);
	TEST_RUN(test_embed_pooling);
	TEST_RUN(test_embed_batching);
	TEST_RUN(test_pooling_from_file);
	return test_finish();
}
