/* tests/unit/test_engine_quant_agree.c: quantized models against F32, teacher-forced
 * on the held-out stories ($EDGELM_TESTDATA/reference/stories-heldout.jsonl,
 * token ids fed as they are, one story per batch).
 *
 * Top-1 agreement = share of positions where the quantized model's argmax
 * equals the F32 model's. Bars:
 * - stories260K quantized to Q8_0 by our edgelm-quantize: >= 97%
 *   (ffn_down stays F16: its rows of 172 do not divide the block);
 * - stories3M Q8_0 as llama.cpp wrote it: >= 99.0% (llama.cpp measures
 *   99.50% for this file, models/README.md);
 * - Q4_0 figures are printed for docs/engine.md, with a loose floor that
 *   only catches a broken kernel.
 * - stories3M Q6_K, Q4_K_M and Q4_0 as llama.cpp wrote them, and Q6_K and
 *   Q4_K_M made by our edgelm-quantize: at least llama.cpp's own figure for
 *   the type (models/README.md, all 400 stories) minus MARGIN (MARGIN_Q4_0
 *   for Q4_0). The 3M checks use the first 10 stories (about 2.5k
 *   positions) to stay fast; the margins cover the subset's sampling spread
 *   (a binomial standard error of 0.21 points at 98.9%, 0.32 at 97.4%, 0.7
 *   at 84%, with positions of one story correlated) and nothing else.
 * All of the above with an f32 KV cache: they measure the weights alone.
 * - KV cache types: the F32 models with an f16 or q8_0 KV cache against the
 *   same model with an f32 cache (>= KV_F16_AGREE, KV_Q8_AGREE), and
 *   stories3M Q4_0 with the default (f16) cache against F32 with f32: the
 *   deployed combination keeps the Q4_0 bar.
 * EDGELM_AGREE_STORIES=N limits the number of stories read (default 400; the
 * checks use at most 50 of stories260K, 10 of stories3M); EDGELM_AGREE_3M=0
 * skips the stories3M checks (the sanitizer pass). */
#include "engine/engine.h"
#include "tests/test.h"

#include <jansson.h>
#include <time.h>
#include <sys/wait.h>

#define MARGIN 0.010
#define MARGIN_Q4_0 0.025
/* KV cache types against f32, same weights (docs/engine.md, "The KV
 * cache"): measured f16 99.94% (stories260K) and 99.96% (stories3M); q8_0
 * 97.80% (stories260K: head rows of 8 values share a block scale) and
 * 99.88%. */
#define KV_F16_AGREE 0.995
#define KV_Q8_AGREE 0.97

struct story {
	int32_t *ids;
	int n;
};

static struct story *stories;
static int n_stories;

static int load_stories(void)
{
	if (stories)
		return 0;
	FILE *f = fopen(test_data_path("reference/stories-heldout.jsonl"), "r");
	if (!f)
		return -1;
	int limit = 400;
	const char *e = getenv("EDGELM_AGREE_STORIES");
	if (e && atoi(e) > 0)
		limit = atoi(e);
	stories = calloc((size_t)limit, sizeof(*stories));
	char *line = NULL;
	size_t cap = 0;
	while (n_stories < limit && getline(&line, &cap, f) > 0) {
		json_error_t je;
		json_t *j = json_loads(line, 0, &je);
		json_t *ids = json_object_get(j, "ids");
		size_t n = json_array_size(ids);
		if (n >= 2) {
			struct story *s = &stories[n_stories++];
			s->n = (int)n;
			s->ids = malloc(n * sizeof(int32_t));
			for (size_t i = 0; i < n; i++)
				s->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
		}
		json_decref(j);
	}
	free(line);
	fclose(f);
	return n_stories > 0 ? 0 : -1;
}

static engine_model *load(const char *path)
{
	struct engine_params p = {.n_threads = 0};
	struct cm_err err = {0};
	engine_model *m = NULL;
	if (engine_model_load(path, &p, &m, &err) != 0)
		fprintf(stderr, "load %s: %s\n", path, err.msg);
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

/* Argmax at every position of every story (the next-token prediction). */
static int32_t *predictions(engine_model *m, enum engine_kv_type kv, int lim, long *ret_n)
{
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	struct engine_ctx_params cp = {.n_seq = 1, .n_batch = info.n_ctx, .kv_type = kv};
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	if (engine_ctx_new(m, &cp, &c, &err) != 0)
		return NULL;
	long total = 0;
	for (int s = 0; s < lim; s++)
		total += CM_MIN(stories[s].n, (int)info.n_ctx);
	int32_t *pred = malloc(sizeof(int32_t) * (size_t)total);
	int32_t *pos = malloc(sizeof(int32_t) * info.n_ctx);
	bool *want = malloc(info.n_ctx);
	long k = 0;
	for (int s = 0; s < lim && pred && pos && want; s++) {
		int n = CM_MIN(stories[s].n, (int)info.n_ctx);
		for (int i = 0; i < n; i++)
			pos[i] = i, want[i] = true;
		engine_seq_truncate(c, 0, 0);
		struct engine_batch b = {.n = n, .tokens = stories[s].ids, .pos = pos, .want_logits = want};
		if (engine_decode(c, &b, &err) != 0) {
			fprintf(stderr, "decode: %s\n", err.msg);
			free(pred);
			pred = NULL;
			break;
		}
		for (int i = 0; i < n; i++)
			pred[k++] = argmax(engine_get_logits(c, i), (int)info.n_vocab);
	}
	free(pos);
	free(want);
	engine_ctx_free(c);
	*ret_n = k;
	return pred;
}

/* The 3M model costs ~13x the 260K one per token and runs on the scalar
 * kernels in 7 checks here: both models run on subsets to keep the whole
 * test near a minute (EDGELM_AGREE_STORIES lowers them further). */
static int story_limit(const char *model)
{
	return strstr(model, "3M") ? CM_MIN(n_stories, 10) : CM_MIN(n_stories, 50);
}

/* The F32 predictions (f32 KV cache) are computed once per reference model. */
static struct {
	char path[4096];
	int32_t *pred;
	long n;
} ref_cache[2];

static double agreement_kv(const char *ref_path, engine_model *ref, engine_model *q,
			   enum engine_kv_type kv, int lim)
{
	int32_t *a = NULL;
	long n1 = 0, n2 = 0;
	for (size_t i = 0; i < CM_ARRAY_LEN(ref_cache); i++) {
		if (strcmp(ref_cache[i].path, ref_path) == 0) {
			a = ref_cache[i].pred;
			n1 = ref_cache[i].n;
			break;
		}
		if (!ref_cache[i].path[0]) {
			a = predictions(ref, ENGINE_KV_F32, lim, &n1);
			snprintf(ref_cache[i].path, sizeof(ref_cache[i].path), "%s", ref_path);
			ref_cache[i].pred = a;
			ref_cache[i].n = n1;
			break;
		}
	}
	int32_t *b = predictions(q, kv, lim, &n2);
	double r = -1;
	if (a && b && n1 == n2 && n1 > 0) {
		long same = 0;
		for (long i = 0; i < n1; i++)
			same += a[i] == b[i];
		r = (double)same / (double)n1;
	}
	free(b);
	return r;
}

static double agreement(const char *ref_path, engine_model *ref, engine_model *q, int lim)
{
	return agreement_kv(ref_path, ref, q, ENGINE_KV_F32, lim);
}

static int quantize(const char *in, const char *out, const char *type)
{
	char cmd[16384];
	snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' %s >/dev/null 2>&1", test_bin("edgelm-quantize"),
		 in, out, type);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool have_data(const char *model)
{
	/* The sanitizer pass (tests/module.mk, check-san) sets
	 * EDGELM_AGREE_3M=0: under ASan the 3M checks cost a minute and
	 * exercise no code the 260K ones do not; the normal pass runs them. */
	const char *e = getenv("EDGELM_AGREE_3M");
	if (e && strcmp(e, "0") == 0 && strstr(model, "3M")) {
		TEST_SKIP("stories3M checks off (EDGELM_AGREE_3M=0); the normal pass runs them");
		return false;
	}
	if (!test_file_exists(test_data_path(model)) || load_stories() != 0) {
		TEST_SKIP_DATA("%s or reference/stories-heldout.jsonl not found under $EDGELM_TESTDATA",
			  model);
		return false;
	}
	return true;
}

static void check_ours(const char *model, const char *type, double floor)
{
	if (!have_data(model))
		return;
	char ref_path[4096], out[4096];
	snprintf(ref_path, sizeof(ref_path), "%s", test_data_path(model));
	snprintf(out, sizeof(out), "%s/agree-%s.gguf", test_tmpdir(), type);
	CHECK_EQ_INT(quantize(ref_path, out, type), 0);
	engine_model *a = load(ref_path), *b = load(out);
	CHECK(a && b);
	if (a && b) {
		double r = agreement(ref_path, a, b, story_limit(model));
		fprintf(stderr, "%s -> %s (edgelm-quantize): top-1 agreement %.2f%% over %d stories\n",
			model, type, r * 100, story_limit(model));
		CHECK_MSG(r >= floor, "agreement %.4f below %.4f", r, floor);
	}
	engine_model_free(a);
	engine_model_free(b);
	remove(out);
}

static void check_file(const char *model, const char *qmodel, double floor)
{
	if (!have_data(model))
		return;
	if (!test_file_exists(test_data_path(qmodel))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", qmodel);
		return;
	}
	char ref_path[4096];
	snprintf(ref_path, sizeof(ref_path), "%s", test_data_path(model));
	engine_model *a = load(ref_path), *b = load(test_data_path(qmodel));
	CHECK(a && b);
	if (a && b) {
		double r = agreement(ref_path, a, b, story_limit(model));
		fprintf(stderr, "%s (llama.cpp's file): top-1 agreement %.2f%% over %d stories\n",
			qmodel, r * 100, story_limit(model));
		CHECK_MSG(r >= floor, "agreement %.4f below %.4f", r, floor);
	}
	engine_model_free(a);
	engine_model_free(b);
}

static void test_260k_q8_0(void)
{
	check_ours("models/stories260K-f32.gguf", "Q8_0", 0.97);
}

static void test_260k_q4_0(void)
{
	check_ours("models/stories260K-f32.gguf", "Q4_0", 0.50);
}

static void test_3m_q8_0_ours(void)
{
	check_ours("models/stories3M-f32.gguf", "Q8_0", 0.99);
}

static void test_3m_q4_0_ours(void)
{
	check_ours("models/stories3M-f32.gguf", "Q4_0", 0.75);
}

static void test_3m_q8_0_llamacpp(void)
{
	check_file("models/stories3M-f32.gguf", "models/stories3M-q8_0.gguf", 0.99);
}

static void test_3m_q6_k_llamacpp(void)
{
	check_file("models/stories3M-f32.gguf", "models/stories3M-q6_k.gguf", 0.9885 - MARGIN);
}

static void test_3m_q4_k_m_llamacpp(void)
{
	check_file("models/stories3M-f32.gguf", "models/stories3M-q4_k_m.gguf", 0.9743 - MARGIN);
}

static void test_3m_q4_0_llamacpp(void)
{
	check_file("models/stories3M-f32.gguf", "models/stories3M-q4_0.gguf", 0.8368 - MARGIN_Q4_0);
}

static void test_3m_q6_k_ours(void)
{
	check_ours("models/stories3M-f32.gguf", "Q6_K", 0.9885 - MARGIN);
}

static void test_3m_q4_k_m_ours(void)
{
	check_ours("models/stories3M-f32.gguf", "Q4_K_M", 0.9743 - MARGIN);
}

/* The model (or qmodel, when not NULL) with a kv cache against model with
 * an f32 one. */
static void check_kv(const char *model, const char *qmodel, enum engine_kv_type kv, double floor)
{
	if (!have_data(model))
		return;
	if (qmodel && !test_file_exists(test_data_path(qmodel))) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", qmodel);
		return;
	}
	char ref_path[4096];
	snprintf(ref_path, sizeof(ref_path), "%s", test_data_path(model));
	engine_model *a = load(ref_path), *b = qmodel ? load(test_data_path(qmodel)) : a;
	CHECK(a && b);
	if (a && b) {
		double r = agreement_kv(ref_path, a, b, kv, story_limit(model));
		fprintf(stderr, "%s, %s KV cache: top-1 agreement %.2f%% with %s, f32 KV, over %d "
				"stories\n",
			qmodel ? qmodel : model, engine_kv_type_name(kv), r * 100, model,
			story_limit(model));
		CHECK_MSG(r >= floor, "agreement %.4f below %.4f", r, floor);
	}
	if (b != a)
		engine_model_free(b);
	engine_model_free(a);
}

static void test_260k_kv_f16(void)
{
	check_kv("models/stories260K-f32.gguf", NULL, ENGINE_KV_F16, KV_F16_AGREE);
}

static void test_260k_kv_q8_0(void)
{
	check_kv("models/stories260K-f32.gguf", NULL, ENGINE_KV_Q8_0, KV_Q8_AGREE);
}

static void test_3m_kv_f16(void)
{
	check_kv("models/stories3M-f32.gguf", NULL, ENGINE_KV_F16, KV_F16_AGREE);
}

static void test_3m_kv_q8_0(void)
{
	check_kv("models/stories3M-f32.gguf", NULL, ENGINE_KV_Q8_0, KV_Q8_AGREE);
}

static void test_3m_q4_0_kv_default(void)
{
	check_kv("models/stories3M-f32.gguf", "models/stories3M-q4_0.gguf", ENGINE_KV_DEFAULT,
		 0.8368 - MARGIN_Q4_0);
}

int main(void)
{
	TEST_RUN(test_260k_q8_0);
	TEST_RUN(test_260k_q4_0);
	TEST_RUN(test_3m_q8_0_ours);
	TEST_RUN(test_3m_q4_0_ours);
	TEST_RUN(test_3m_q8_0_llamacpp);
	TEST_RUN(test_3m_q6_k_llamacpp);
	TEST_RUN(test_3m_q4_k_m_llamacpp);
	TEST_RUN(test_3m_q4_0_llamacpp);
	TEST_RUN(test_3m_q6_k_ours);
	TEST_RUN(test_3m_q4_k_m_ours);
	TEST_RUN(test_260k_kv_f16);
	TEST_RUN(test_260k_kv_q8_0);
	TEST_RUN(test_3m_kv_f16);
	TEST_RUN(test_3m_kv_q8_0);
	TEST_RUN(test_3m_q4_0_kv_default);
	for (int i = 0; i < n_stories; i++)
		free(stories[i].ids);
	for (size_t i = 0; i < CM_ARRAY_LEN(ref_cache); i++)
		free(ref_cache[i].pred);
	free(stories);
	return test_finish();
}
