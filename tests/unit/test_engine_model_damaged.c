/* tests/unit/test_engine_model_damaged.c: models that are valid GGUF containers but
 * wrong as models. Each must fail engine_model_load() with a precise message
 * (never a crash; the ASan pass of `make check` checks for leaks), and
 * edgelm-run must exit with code 2 and one line on stderr that says what.
 *
 * The fixtures derive from a small synthetic llama model built here with the
 * GGUF writer, so no external data is needed. */
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/test.h"

#include <sys/wait.h>
#include <unistd.h>

#define E 32
#define FF 64
#define NL 2
#define NV 300

struct fixture {
	const char *drop_key;      /* key to remove */
	const char *drop_tensor;   /* tensor to leave out */
	const char *arch;          /* architecture string */
	const char *bad_shape;     /* tensor written with a wrong shape */
	const char *bad_type;      /* tensor written as I32 (valid GGUF, not a weight type) */
	const char *extra_tensor;  /* an unexpected tensor */
	int bad_u32_key;           /* embedding_length written as 0 */
	int head_count_kv;         /* overrides head_count_kv when not 0 */
	bool no_tokens;            /* no tokenizer */
};

static float wbuf[NV * E * 4];

/* Build a model file into `path` (returns 0) following the fixture. */
static int build(const char *path, const struct fixture *fx)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	if (gguf_writer_new(&w, &err))
		return -1;
	const char *arch = fx->arch ? fx->arch : "llama";
	char key[128];
#define K(s) (snprintf(key, sizeof(key), "%s." s, arch), key)
	gguf_writer_set_str(w, "general.architecture", arch);
	gguf_writer_set_u32(w, K("context_length"), 64);
	gguf_writer_set_u32(w, K("embedding_length"), fx->bad_u32_key ? 0 : E);
	gguf_writer_set_u32(w, K("block_count"), NL);
	gguf_writer_set_u32(w, K("feed_forward_length"), FF);
	gguf_writer_set_u32(w, K("attention.head_count"), 4);
	gguf_writer_set_u32(w, K("attention.head_count_kv"), fx->head_count_kv ? (uint32_t)fx->head_count_kv : 2);
	gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f);
#undef K
	if (!fx->no_tokens) {
		static char names[NV][16];
		const char *toks[NV];
		for (int i = 0; i < NV; i++) {
			if (i < 3)
				snprintf(names[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
			else if (i < 259)
				snprintf(names[i], 16, "<0x%02X>", i - 3);
			else
				snprintf(names[i], 16, "t%d", i);
			toks[i] = names[i];
		}
		gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
		gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, NV);
	}
	if (fx->drop_key)
		gguf_writer_remove(w, fx->drop_key);
	for (size_t i = 0; i < CM_ARRAY_LEN(wbuf); i++)
		wbuf[i] = (float)((i * 7919) % 101) / 1000.0f - 0.05f;

	struct {
		char name[64];
		int64_t ne0, ne1;
		int dims;
	} t[64];
	int n = 0;
#define ADD(nm, a, b, d)                                                  \
	do {                                                              \
		snprintf(t[n].name, 64, "%s", nm);                        \
		t[n].ne0 = (a), t[n].ne1 = (b), t[n].dims = (d), n++;     \
	} while (0)
	ADD("token_embd.weight", E, NV, 2);
	ADD("output_norm.weight", E, 1, 1);
	char nm[64];
	for (int l = 0; l < NL; l++) {
#define N(s) (snprintf(nm, 64, "blk.%d." s, l), nm)
		ADD(N("attn_norm.weight"), E, 1, 1);
		ADD(N("attn_q.weight"), E, E, 2);
		ADD(N("attn_k.weight"), E, E / 2, 2);
		ADD(N("attn_v.weight"), E, E / 2, 2);
		ADD(N("attn_output.weight"), E, E, 2);
		ADD(N("ffn_norm.weight"), E, 1, 1);
		ADD(N("ffn_gate.weight"), E, FF, 2);
		ADD(N("ffn_up.weight"), E, FF, 2);
		ADD(N("ffn_down.weight"), FF, E, 2);
#undef N
	}
	if (fx->extra_tensor)
		ADD(fx->extra_tensor, E, 1, 1);
#undef ADD
	int r = 0;
	for (int i = 0; i < n && r == 0; i++) {
		if (fx->drop_tensor && strcmp(t[i].name, fx->drop_tensor) == 0)
			continue;
		int64_t ne[2] = {t[i].ne0, t[i].ne1};
		uint32_t type = ENGINE_DTYPE_F32;
		const void *data = wbuf;
		if (fx->bad_shape && strcmp(t[i].name, fx->bad_shape) == 0)
			ne[1] += 1;
		if (fx->bad_type && strcmp(t[i].name, fx->bad_type) == 0)
			type = ENGINE_DTYPE_I32; /* valid GGUF, never a weight type */
		r = gguf_writer_add_tensor(w, t[i].name, type, (uint32_t)t[i].dims, ne, data, &err);
	}
	if (r == 0)
		r = gguf_writer_write(w, path, &err);
	if (r)
		fprintf(stderr, "fixture: %s\n", err.msg);
	gguf_writer_free(w);
	return r;
}

static void expect_load_error(const char *name, const struct fixture *fx, const char *want)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/damaged-%s.gguf", test_tmpdir(), name);
	CHECK_OK(build(path, fx));
	engine_model *m = NULL;
	struct cm_err err = {0};
	struct engine_params p = {.n_threads = 1};
	int r = engine_model_load(path, &p, &m, &err);
	CHECK_MSG(r < 0, "%s: loaded", name);
	CHECK(m == NULL);
	CHECK_MSG(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", name, err.msg,
		  want);
	engine_model_free(m);

	/* The tool: exit code 2, one line naming the problem. */
	char cmd[16384], out[4096];
	snprintf(out, sizeof(out), "%s/damaged-%s.err", test_tmpdir(), name);
	snprintf(cmd, sizeof(cmd), "'%s' -m '%s' -p hi -n 1 -q 2>'%s' >/dev/null",
		 test_bin("edgelm-run"), path, out);
	int st = system(cmd);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: edgelm-run status %d", name, st);
	FILE *f = fopen(out, "r");
	char line[1024] = "", extra[16];
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = '\0';
		CHECK_MSG(fgets(extra, sizeof(extra), f) == NULL, "%s: more than one line", name);
		fclose(f);
	}
	CHECK_MSG(strncmp(line, "edgelm-run: ", 12) == 0 && strstr(line, want),
		  "%s: stderr '%s'", name, line);
	remove(out);
	remove(path);
}

static void test_valid_fixture_loads(void)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/valid.gguf", test_tmpdir());
	struct fixture fx = {0};
	CHECK_OK(build(path, &fx));
	engine_model *m = NULL;
	struct cm_err err = {0};
	struct engine_params p = {.n_threads = 1};
	CHECK_OK(engine_model_load(path, &p, &m, &err));
	if (m) {
		engine_ctx *c = NULL;
		CHECK_OK(engine_ctx_new(m, NULL, &c, &err));
		int32_t tok[3] = {1, 260, 270};
		CHECK_OK(engine_eval(c, tok, 3, 0, &err));
		const float *l = engine_get_logits_last(c);
		CHECK(l && isfinite(l[0]));
		engine_ctx_free(c);
	}
	engine_model_free(m);
	remove(path);
}

static void test_missing_tensor(void)
{
	struct fixture fx = {.drop_tensor = "blk.1.ffn_up.weight"};
	expect_load_error("missing-tensor", &fx, "missing tensor 'blk.1.ffn_up.weight'");
}

static void test_missing_output_norm(void)
{
	struct fixture fx = {.drop_tensor = "output_norm.weight"};
	expect_load_error("missing-output-norm", &fx, "missing tensor 'output_norm.weight'");
}

static void test_missing_key(void)
{
	struct fixture fx = {.drop_key = "llama.block_count"};
	expect_load_error("missing-key", &fx, "missing key 'llama.block_count'");
}

static void test_missing_arch(void)
{
	struct fixture fx = {.drop_key = "general.architecture"};
	expect_load_error("missing-arch", &fx, "general.architecture");
}

static void test_wrong_arch(void)
{
	struct fixture fx = {.arch = "gpt2"};
	expect_load_error("wrong-arch", &fx, "architecture 'gpt2' is not supported");
}

static void test_bad_shape(void)
{
	struct fixture fx = {.bad_shape = "blk.0.attn_k.weight"};
	expect_load_error("bad-shape", &fx, "tensor 'blk.0.attn_k.weight' has shape");
}

static void test_unsupported_type(void)
{
	struct fixture fx = {.bad_type = "blk.0.ffn_gate.weight"};
	expect_load_error("bad-type", &fx, "type I32 is not supported");
}

static void test_extra_tensor(void)
{
	struct fixture fx = {.extra_tensor = "blk.7.mystery.weight"};
	expect_load_error("extra-tensor", &fx, "unexpected tensor 'blk.7.mystery.weight'");
}

static void test_zero_embd(void)
{
	struct fixture fx = {.bad_u32_key = 1};
	expect_load_error("zero-embd", &fx, "embedding_length 0 out of range");
}

static void test_bad_gqa(void)
{
	struct fixture fx = {.head_count_kv = 3};
	expect_load_error("bad-gqa", &fx, "head_count_kv 3 does not divide");
}

static void test_no_tokenizer(void)
{
	struct fixture fx = {.no_tokens = true};
	expect_load_error("no-tokenizer", &fx, "tokenizer");
}

static void test_missing_file(void)
{
	engine_model *m = NULL;
	struct cm_err err = {0};
	CHECK(engine_model_load("/nonexistent/model.gguf", NULL, &m, &err) < 0);
	CHECK(strstr(err.msg, "/nonexistent/model.gguf") != NULL);
}

int main(void)
{
	TEST_RUN(test_valid_fixture_loads);
	TEST_RUN(test_missing_tensor);
	TEST_RUN(test_missing_output_norm);
	TEST_RUN(test_missing_key);
	TEST_RUN(test_missing_arch);
	TEST_RUN(test_wrong_arch);
	TEST_RUN(test_bad_shape);
	TEST_RUN(test_unsupported_type);
	TEST_RUN(test_extra_tensor);
	TEST_RUN(test_zero_embd);
	TEST_RUN(test_bad_gqa);
	TEST_RUN(test_no_tokenizer);
	TEST_RUN(test_missing_file);
	return test_finish();
}
