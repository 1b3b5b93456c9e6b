/* tests/unit/test_engine_tokenizer.c: the SPM tokenizer against llama.cpp's test
 * vectors and the stories reference prompts, plus synthetic vocabularies
 * built in memory (byte fallback, special tokens, streaming detokenizer,
 * hostile inputs). */
#include "engine/engine.h"
#include "engine/gguf.h"
#include "tests/test.h"

#include <dirent.h>
#include <jansson.h>
#include <stdint.h>

/* ---- helpers ------------------------------------------------------------- */

static char *read_file(const char *path, size_t *ret_n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 4096, n = 0, r;
	char *buf = malloc(cap + 1);
	while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
		n += r;
		if (n == cap) {
			char *nb = realloc(buf, (cap *= 2) + 1);
			if (!nb)
				free(buf);
			buf = nb;
		}
	}
	fclose(f);
	if (buf)
		buf[n] = '\0';
	*ret_n = n;
	return buf;
}

static bool valid_utf8(const char *s, size_t n)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t i = 0;
	while (i < n) {
		uint8_t c = u[i];
		size_t k;
		uint32_t cp;
		if (c < 0x80) {
			i++;
			continue;
		} else if (c >= 0xc2 && c <= 0xdf) {
			k = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			k = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			k = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		for (size_t j = 1; j <= k; j++) {
			if (i + j >= n || (u[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (u[i + j] & 0x3f);
		}
		if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += k + 1;
	}
	return true;
}

/* Tokenize into a malloc'ed array (NULL on error; *ret_n = count). */
static int32_t *tokenize(const engine_tokenizer *t, const char *s, size_t n, bool add_special,
                         bool parse_special, int *ret_n)
{
	struct cm_err err = {0};
	int cnt = 0;
	int r = engine_tokenize(t, s, n, add_special, parse_special, NULL, 0, &cnt, &err);
	if (r != 0 && r != -ENOBUFS) {
		fprintf(stderr, "tokenize: %d %s\n", r, err.msg);
		return NULL;
	}
	int32_t *ids = malloc(((size_t)cnt + 1) * sizeof(*ids));
	r = engine_tokenize(t, s, n, add_special, parse_special, ids, cnt, ret_n, &err);
	if (r != 0 || *ret_n != cnt) {
		fprintf(stderr, "tokenize (2nd): %d %s\n", r, err.msg);
		free(ids);
		return NULL;
	}
	return ids;
}

static bool ids_eq(const int32_t *a, int na, const int32_t *b, int nb)
{
	return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof(*a)) == 0);
}

static void print_ids(const char *what, const int32_t *a, int n)
{
	fprintf(stderr, "  %s:", what);
	for (int i = 0; i < n; i++)
		fprintf(stderr, " %d", a[i]);
	fputc('\n', stderr);
}

/* ---- (1) llama.cpp's vocab test vectors ------------------------------------ */

static bool is_llama_vocab(const char *path)
{
	struct gguf_file *f = NULL;
	if (gguf_open(path, &f, NULL) != 0)
		return false;
	struct gguf_str m;
	bool ok = gguf_get_str(f, "tokenizer.ggml.model", &m, NULL) == 0 && gguf_str_eq(m, "llama");
	gguf_close(f);
	return ok;
}

static void run_vocab_file(const char *dir, const char *name, int *ret_files)
{
	char path[8400], pin[8500], pout[8500];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!is_llama_vocab(path))
		return;
	snprintf(pin, sizeof(pin), "%s.inp", path);
	snprintf(pout, sizeof(pout), "%s.out", path);
	size_t nin = 0, nout = 0;
	char *inp = read_file(pin, &nin), *out = read_file(pout, &nout);
	if (!inp || !out) {
		free(inp);
		free(out);
		return;
	}
	engine_tokenizer *t = NULL;
	struct cm_err err = {0};
	int r = engine_tokenizer_load(path, &t, &err);
	CHECK_MSG(r == 0, "%s: %s", name, err.msg);
	if (r) {
		free(inp);
		free(out);
		return;
	}
	(*ret_files)++;

	static const char sep[] = "\n__ggml_vocab_test__\n";
	const size_t seplen = sizeof(sep) - 1;
	char *p = inp, *o = out;
	int n_vec = 0, n_pass = 0, n_lossless = 0;
	for (;;) {
		char *e = strstr(p, sep);
		if (!e)
			break; /* the trailing piece after the last separator */
		size_t len = (size_t)(e - p);
		char *nl = strchr(o, '\n');
		if (!nl) {
			CHECK_MSG(0, "%s: .out has fewer lines than .inp", name);
			break;
		}
		*nl = '\0';
		int32_t want[4096];
		int nw = 0;
		for (char *q = o; *q && nw < 4096;) {
			char *end;
			long v = strtol(q, &end, 10);
			if (end == q)
				break;
			want[nw++] = (int32_t)v;
			q = end;
		}
		int ng = 0;
		int32_t *got = tokenize(t, p, len, false, false, &ng);
		n_vec++;
		if (got && ids_eq(got, ng, want, nw)) {
			n_pass++;
		} else {
			fprintf(stderr, "%s: vector %d mismatch, input '%.*s'\n", name, n_vec - 1,
			        (int)len, p);
			if (got)
				print_ids("got ", got, ng);
			print_ids("want", want, nw);
		}
		if (got) {
			char *text = NULL;
			if (engine_detokenize(t, got, ng, false, &text, &err) == 0) {
				if (strlen(text) == len && memcmp(text, p, len) == 0)
					n_lossless++;
				CHECK(valid_utf8(text, strlen(text)));
			}
			free(text);
		}
		free(got);
		p = e + seplen;
		o = nl + 1;
	}
	fprintf(stderr, "%s: %d/%d vectors match, %d/%d round-trip losslessly\n", name, n_pass,
	        n_vec, n_lossless, n_vec);
	CHECK(n_vec > 0);
	CHECK_EQ_INT(n_pass, n_vec);
	engine_tokenizer_free(t);
	free(inp);
	free(out);
}

static void test_vocab_vectors(void)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", test_data_path("vocab"));
	DIR *d = opendir(dir);
	if (!d) {
		TEST_SKIP_DATA("no vocab directory at %s (set EDGELM_TESTDATA)", dir);
		return;
	}
	struct dirent *e;
	int n_files = 0;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0)
			run_vocab_file(dir, e->d_name, &n_files);
	}
	closedir(d);
	if (n_files == 0)
		TEST_SKIP_DATA("no SPM vocab with test vectors in %s", dir);
}

/* ---- (2) the stories models' prompts ---------------------------------------- */

static void check_stories(const char *model, const char *ref)
{
	char mpath[4096];
	snprintf(mpath, sizeof(mpath), "%s", test_data_path(model));
	const char *rpath = test_data_path(ref);
	if (!test_file_exists(mpath) || !test_file_exists(rpath)) {
		TEST_SKIP_DATA("missing %s or %s", mpath, rpath);
		return;
	}
	engine_tokenizer *t = NULL;
	struct cm_err err = {0};
	int r = engine_tokenizer_load(mpath, &t, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r)
		return;
	json_error_t jerr;
	json_t *root = json_load_file(rpath, 0, &jerr);
	CHECK_MSG(root && json_is_array(root), "%s: %s", rpath, jerr.text);
	size_t i;
	json_t *o;
	int n_prompts = 0;
	json_array_foreach(root, i, o)
	{
		const char *prompt = json_string_value(json_object_get(o, "prompt"));
		json_t *want = json_object_get(o, "prompt_tokens");
		CHECK(prompt && json_is_array(want));
		if (!prompt || !json_is_array(want))
			continue;
		int n = 0;
		int32_t *got = tokenize(t, prompt, strlen(prompt), true, false, &n);
		CHECK(got != NULL);
		bool eq = got && (size_t)n == json_array_size(want);
		for (int k = 0; eq && k < n; k++)
			eq = json_integer_value(json_array_get(want, (size_t)k)) == got[k];
		CHECK_MSG(eq, "%s: prompt '%s'", ref, prompt);
		free(got);
		n_prompts++;

		/* The generated text is the streamed pieces of the steps. */
		const char *text = json_string_value(json_object_get(o, "text"));
		json_t *steps = json_object_get(o, "steps");
		if (!text || !json_is_array(steps))
			continue;
		struct engine_detok d;
		engine_detok_init(&d, t);
		size_t cap = strlen(text) + 4096, used = 0;
		char *buf = malloc(cap);
		size_t k;
		json_t *st;
		json_array_foreach(steps, k, st)
		{
			int32_t id = (int32_t)json_integer_value(json_object_get(st, "token"));
			int m = engine_detok_push(&d, t, id, buf + used, cap - used);
			CHECK(m >= 0);
			if (m > 0)
				used += (size_t)m;
		}
		int m = engine_detok_flush(&d, buf + used, cap - used);
		used += m > 0 ? (size_t)m : 0;
		CHECK_MSG(used == strlen(text) && memcmp(buf, text, used) == 0,
		          "%s: prompt '%s': streamed '%.*s'", ref, prompt, (int)used, buf);
		free(buf);
	}
	CHECK(n_prompts > 0);
	json_decref(root);
	engine_tokenizer_free(t);
}

static void test_stories260k(void)
{
	check_stories("models/stories260K-f32.gguf", "reference/stories260K-f32.json");
}

static void test_stories3m(void)
{
	check_stories("models/stories3M-f32.gguf", "reference/stories3M-f32.json");
}

/* ---- (3) synthetic vocabularies ------------------------------------------------ */

enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };

struct vb {
	char *texts[1024];
	float scores[1024];
	int32_t types[1024];
	int n;
	const char *name;     /* general.name, optional */
	const char *model;    /* default "llama" */
	int add_space_prefix; /* -1: absent */
	int add_eos;          /* -1: absent */
	int bos_id;           /* -1: absent */
	bool no_scores, no_types, scores_as_i32, short_types;
};

static int vb_add(struct vb *v, const char *text, float score, int type)
{
	v->texts[v->n] = strdup(text);
	v->scores[v->n] = score;
	v->types[v->n] = type;
	return v->n++;
}

static void vb_init(struct vb *v)
{
	memset(v, 0, sizeof(*v));
	v->add_space_prefix = -1;
	v->add_eos = -1;
	v->bos_id = -1;
}

static void vb_fini(struct vb *v)
{
	for (int i = 0; i < v->n; i++)
		free(v->texts[i]);
}

/* The base vocabulary: <unk> <s> </s>, 256 byte tokens, then words. */
enum { ID_UNK = 0, ID_BOS = 1, ID_EOS = 2, ID_BYTE0 = 3 };
static int id_sp, id_a, id_b, id_c, id_ab, id_bc, id_abc, id_sp_a, id_aa, id_hello, id_sp_hello,
    id_im_end, id_user, id_e_acute, id_sp_sp;

static void vb_base(struct vb *v)
{
	vb_init(v);
	vb_add(v, "<unk>", 0, T_UNKNOWN);
	vb_add(v, "<s>", 0, T_CONTROL);
	vb_add(v, "</s>", 0, T_CONTROL);
	for (int b = 0; b < 256; b++) {
		char s[8];
		snprintf(s, sizeof(s), "<0x%02X>", b);
		vb_add(v, s, 0, T_BYTE);
	}
	id_sp = vb_add(v, "\xe2\x96\x81", -1.0f, T_NORMAL);
	id_a = vb_add(v, "a", -2.0f, T_NORMAL);
	id_b = vb_add(v, "b", -2.0f, T_NORMAL);
	id_c = vb_add(v, "c", -2.0f, T_NORMAL);
	id_ab = vb_add(v, "ab", -1.0f, T_NORMAL);
	id_bc = vb_add(v, "bc", -0.5f, T_NORMAL);
	id_abc = vb_add(v, "abc", -0.1f, T_NORMAL);
	id_sp_a = vb_add(v,
	                 "\xe2\x96\x81"
	                 "a",
	                 -2.0f, T_NORMAL);
	id_aa = vb_add(v, "aa", -3.0f, T_NORMAL);
	const char *letters[] = {"h", "e", "l", "o", "he", "ll", "llo", "hell"};
	for (size_t i = 0; i < CM_ARRAY_LEN(letters); i++)
		vb_add(v, letters[i], -3.0f - (float)i * 0.1f, T_NORMAL);
	id_hello = vb_add(v, "hello", -1.5f, T_NORMAL);
	id_sp_hello = vb_add(v, "\xe2\x96\x81hello", -1.2f, T_NORMAL);
	id_im_end = vb_add(v, "<|im_end|>", 0, T_USER); /* forced to CONTROL (EOG) */
	id_user = vb_add(v, "<|user|>", 0, T_USER);
	id_e_acute = vb_add(v, "\xc3\xa9", -2.0f, T_NORMAL);
	id_sp_sp = vb_add(v, "\xe2\x96\x81\xe2\x96\x81", -4.0f, T_NORMAL);
}

static uint8_t *vb_gguf(struct vb *v, size_t *ret_size)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	if (gguf_writer_new(&w, &err) != 0)
		return NULL;
	gguf_writer_set_str(w, "general.architecture", "llama");
	if (v->name)
		gguf_writer_set_str(w, "general.name", v->name);
	gguf_writer_set_str(w, "tokenizer.ggml.model", v->model ? v->model : "llama");
	gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->texts, NULL,
	                        (uint64_t)v->n);
	if (v->scores_as_i32) {
		gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_INT32, v->types,
		                    (uint64_t)v->n);
	} else if (!v->no_scores) {
		gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->scores,
		                    (uint64_t)v->n);
	}
	if (!v->no_types)
		gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types,
		                    (uint64_t)(v->short_types ? v->n - 1 : v->n));
	if (v->add_space_prefix >= 0)
		gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix);
	if (v->add_eos >= 0)
		gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
	if (v->bos_id >= 0)
		gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos_id);
	uint8_t *buf = NULL;
	size_t size = 0;
	if (gguf_writer_write_mem(w, &buf, &size, &err) != 0)
		buf = NULL;
	gguf_writer_free(w);
	*ret_size = size;
	return buf;
}

/* Build a tokenizer from v; returns the engine_tokenizer_new status. */
static int vb_build(struct vb *v, engine_tokenizer **ret, struct cm_err *err)
{
	size_t size = 0;
	*ret = NULL;
	uint8_t *buf = vb_gguf(v, &size);
	if (!buf)
		return -1000;
	struct gguf_file *f = NULL;
	int r = gguf_open_mem(buf, size, &f, err);
	if (r == 0) {
		r = engine_tokenizer_new(f, ret, err);
		gguf_close(f);
	}
	cm_free(buf);
	return r;
}

static engine_tokenizer *base_tok(int add_space_prefix, const char *name)
{
	struct vb v;
	vb_base(&v);
	v.add_space_prefix = add_space_prefix;
	v.name = name;
	engine_tokenizer *t = NULL;
	struct cm_err err = {0};
	int r = vb_build(&v, &t, &err);
	CHECK_MSG(r == 0, "build: %d %s", r, err.msg);
	vb_fini(&v);
	return t;
}

#define EXPECT_IDS(t, str, add_special, parse_special, ...)                                        \
	do {                                                                                       \
		const int32_t want_[] = {__VA_ARGS__};                                             \
		int n_ = 0;                                                                        \
		int32_t *got_ =                                                                    \
		    tokenize(t, str, sizeof(str) - 1, add_special, parse_special, &n_);            \
		bool ok_ = got_ && ids_eq(got_, n_, want_, (int)CM_ARRAY_LEN(want_));              \
		CHECK_MSG(ok_, "tokenize '%s'", str);                                              \
		if (!ok_) {                                                                        \
			if (got_)                                                                  \
				print_ids("got ", got_, n_);                                       \
			print_ids("want", want_, (int)CM_ARRAY_LEN(want_));                        \
		}                                                                                  \
		free(got_);                                                                        \
	} while (0)

static void expect_detok(const engine_tokenizer *t, const int32_t *ids, int n, bool special,
                         const char *want)
{
	char *text = NULL;
	struct cm_err err = {0};
	int r = engine_detokenize(t, ids, n, special, &text, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r == 0)
		CHECK_STREQ(text, want);
	free(text);
}

static void test_synthetic_basics(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	CHECK_EQ_INT(engine_tokenizer_n_vocab(t), id_sp_sp + 1);
	CHECK_EQ_INT(engine_tokenizer_bos(t), ID_BOS);
	CHECK_EQ_INT(engine_tokenizer_eos(t), ID_EOS);
	CHECK(engine_tokenizer_add_bos(t));
	CHECK(engine_tokenizer_is_eog(t, ID_EOS));
	CHECK(engine_tokenizer_is_eog(t, id_im_end));
	CHECK(!engine_tokenizer_is_eog(t, ID_BOS));
	CHECK(!engine_tokenizer_is_eog(t, -1));
	CHECK(!engine_tokenizer_is_eog(t, 1 << 30));
	CHECK_EQ_INT(engine_tokenizer_attr(t, id_im_end), ENGINE_TOKEN_CONTROL);
	CHECK_EQ_INT(engine_tokenizer_attr(t, id_user), ENGINE_TOKEN_USER_DEFINED);
	CHECK_EQ_INT(engine_tokenizer_attr(t, ID_BYTE0 + 7), ENGINE_TOKEN_BYTE);
	CHECK_EQ_INT(engine_tokenizer_attr(t, -5), 0);
	size_t n = 0;
	CHECK_STREQ(engine_tokenizer_text(t, id_hello, &n), "hello");
	CHECK_EQ_INT(n, 5);
	CHECK(engine_tokenizer_text(t, 99999, &n) == NULL);
	CHECK_EQ_INT(engine_tokenizer_find(t, "<0x41>", 6), ID_BYTE0 + 0x41);
	CHECK_EQ_INT(engine_tokenizer_find(t, "nope", 4), -1);

	/* merging by score: bc (-0.5) first, then abc; ▁ stays alone */
	EXPECT_IDS(t, "abc", false, false, id_sp, id_abc);
	/* equal scores: the leftmost pair merges first */
	engine_tokenizer_free(t);
	t = base_tok(0, NULL);
	if (!t)
		return;
	EXPECT_IDS(t, "aaa", false, false, id_aa, id_a);
	EXPECT_IDS(t, "hello", false, false, id_hello);
	EXPECT_IDS(t, "hello hello", false, false, id_hello, id_sp_hello);
	engine_tokenizer_free(t);

	t = base_tok(1, NULL);
	if (!t)
		return;
	EXPECT_IDS(t, "hello", false, false, id_sp_hello);
	EXPECT_IDS(t, "hello", true, false, ID_BOS, id_sp_hello);
	EXPECT_IDS(t, " a", false, false, id_sp, id_sp_a);
	engine_tokenizer_free(t);
}

static void test_byte_fallback(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	/* 'x' is not a token: <0x78> */
	EXPECT_IDS(t, "x", false, false, id_sp, ID_BYTE0 + 0x78);
	/* é is a token, but the 4-byte emoji is not */
	EXPECT_IDS(t, "\xc3\xa9\xf0\x9f\x98\x80", false, false, id_sp, id_e_acute, ID_BYTE0 + 0xf0,
	           ID_BYTE0 + 0x9f, ID_BYTE0 + 0x98, ID_BYTE0 + 0x80);
	/* invalid UTF-8: a lead byte takes up to 3 more bytes as one symbol */
	EXPECT_IDS(t,
	           "\xff"
	           "a",
	           false, false, id_sp, ID_BYTE0 + 0xff, ID_BYTE0 + 'a');
	EXPECT_IDS(t, "\xc3", false, false, id_sp, ID_BYTE0 + 0xc3);
	EXPECT_IDS(t, "a\x80", false, false, id_sp_a, ID_BYTE0 + 0x80);
	/* NUL bytes are text like any other */
	EXPECT_IDS(t, "a\0b", false, false, id_sp_a, ID_BYTE0, id_b);
	/* empty input */
	EXPECT_IDS(t, "", false, false, );
	EXPECT_IDS(t, "", true, true, ID_BOS);
	int n = -1;
	CHECK_OK(engine_tokenize(t, NULL, 0, false, false, NULL, 0, &n, NULL));
	CHECK_EQ_INT(n, 0);

	/* detokenizing the invalid input gives U+FFFD per bad byte */
	const int32_t bad[] = {id_sp, ID_BYTE0 + 0xff, ID_BYTE0 + 0xfe, ID_BYTE0 + 'a',
	                       ID_BYTE0 + 0xc3};
	expect_detok(t, bad, 5, false,
	             "\xef\xbf\xbd\xef\xbf\xbd"
	             "a\xef\xbf\xbd");
	engine_tokenizer_free(t);

	/* Without byte tokens: the single-byte token, else <unk>. */
	struct vb v;
	vb_init(&v);
	vb_add(&v, "<unk>", 0, T_UNKNOWN);
	vb_add(&v, "<s>", 0, T_CONTROL);
	vb_add(&v, "</s>", 0, T_CONTROL);
	int id_x = vb_add(&v, "x", -1, T_NORMAL);
	int id_sp2 = vb_add(&v, "\xe2\x96\x81", -1, T_NORMAL);
	struct cm_err err = {0};
	int r = vb_build(&v, &t, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	vb_fini(&v);
	if (r)
		return;
	EXPECT_IDS(t, "xy", false, false, id_sp2, id_x, ID_UNK);
	engine_tokenizer_free(t);
}

static void test_special_tokens(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	/* parse_special: control tokens in the text are tokens; the raw text
	 * after a token gets the space prefix again */
	EXPECT_IDS(t, "hello<|im_end|>hello", false, true, id_sp_hello, id_im_end, id_sp_hello);
	EXPECT_IDS(t, "<s>hello", true, true, ID_BOS, ID_BOS, id_sp_hello);
	EXPECT_IDS(t, "<s></s>", false, true, ID_BOS, ID_EOS);
	/* without parse_special, control tokens are plain text ... */
	int n = 0;
	int32_t *ids = tokenize(t, "hello<|im_end|>", 15, false, false, &n);
	CHECK(ids != NULL);
	for (int i = 0; ids && i < n; i++)
		CHECK(ids[i] != id_im_end);
	free(ids);
	EXPECT_IDS(t, "<s>", false, false, id_sp, ID_BYTE0 + '<', ID_BYTE0 + 's', ID_BYTE0 + '>');
	/* ... but user-defined tokens still match */
	EXPECT_IDS(t, "<|user|>hello", false, false, id_user, id_sp_hello);
	EXPECT_IDS(t, "a<|user|>", false, false, id_sp_a, id_user);
	/* no RSTRIP outside Phi-3: the spaces stay */
	EXPECT_IDS(t, "<|user|> a", false, false, id_user, id_sp, id_sp_a);
	/* adjacent tokens */
	EXPECT_IDS(t, "<|user|><s>", false, true, id_user, ID_BOS);
	engine_tokenizer_free(t);

	/* Phi-3: RSTRIP on special tokens (not <s>) */
	t = base_tok(-1, "Phi3 mini");
	if (!t)
		return;
	EXPECT_IDS(t, "<|user|>  \n hello", false, false, id_user, id_sp_hello);
	EXPECT_IDS(t, "<s> a", false, true, ID_BOS, id_sp, id_sp_a);
	engine_tokenizer_free(t);

	/* add_space_prefix false */
	t = base_tok(0, NULL);
	if (!t)
		return;
	EXPECT_IDS(t, "hello<|user|>hello", false, false, id_hello, id_user, id_hello);
	const int32_t seq[] = {id_sp_hello, id_hello};
	expect_detok(t, seq, 2, false, " hellohello");
	engine_tokenizer_free(t);
}

static void test_pieces(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	char buf[64];
	int n = engine_token_to_piece(t, id_sp_hello, false, buf, sizeof(buf));
	CHECK_EQ_INT(n, 6);
	CHECK(n == 6 && memcmp(buf, " hello", 6) == 0);
	CHECK_EQ_INT(engine_token_to_piece(t, ID_BYTE0 + 'A', false, buf, sizeof(buf)), 1);
	CHECK(buf[0] == 'A');
	CHECK_EQ_INT(engine_token_to_piece(t, ID_BOS, false, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(engine_token_to_piece(t, ID_UNK, false, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(engine_token_to_piece(t, ID_BOS, true, buf, sizeof(buf)), 3);
	CHECK(memcmp(buf, "<s>", 3) == 0);
	CHECK_EQ_INT(engine_token_to_piece(t, id_user, false, buf, sizeof(buf)), 8);
	CHECK_EQ_INT(engine_token_to_piece(t, id_sp_hello, false, buf, 5), -ENOBUFS);
	CHECK_EQ_INT(engine_token_to_piece(t, -1, false, buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(engine_token_to_piece(t, 100000, false, buf, sizeof(buf)), -EINVAL);

	/* whole-sequence detokenization strips the first token's space */
	const int32_t a[] = {id_sp_hello, id_sp_hello};
	expect_detok(t, a, 2, false, "hello hello");
	const int32_t b[] = {ID_BOS, id_sp_hello, id_im_end};
	expect_detok(t, b, 3, false, " hello");
	expect_detok(t, b, 3, true, "<s> hello<|im_end|>");
	expect_detok(t, NULL, 0, false, "");
	const int32_t bad[] = {id_a, -3};
	char *text = NULL;
	CHECK_EQ_INT(engine_detokenize(t, bad, 2, false, &text, NULL), -EINVAL);
	CHECK(text == NULL);

	/* streaming keeps a continuation's leading space */
	struct engine_detok d;
	engine_detok_init(&d, t);
	CHECK(!d.first);
	n = engine_detok_push(&d, t, id_sp_hello, buf, sizeof(buf));
	CHECK_EQ_INT(n, 6);
	/* too small a buffer: -ENOBUFS and nothing consumed */
	CHECK_EQ_INT(engine_detok_push(&d, t, id_sp_hello, buf, 3), -ENOBUFS);
	CHECK_EQ_INT(engine_detok_push(&d, t, id_sp_hello, buf, 6), 6);
	CHECK_EQ_INT(engine_detok_push(&d, t, -1, buf, 6), -EINVAL);
	engine_tokenizer_free(t);
}

static void test_stream_emoji(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	/* "é😀x" as byte tokens: the emoji arrives one byte at a time */
	const int32_t ids[] = {id_e_acute,      ID_BYTE0 + 0xf0, ID_BYTE0 + 0x9f,
	                       ID_BYTE0 + 0x98, ID_BYTE0 + 0x80, ID_BYTE0 + 'x'};
	const int expect_len[] = {2, 0, 0, 0, 4, 1};
	struct engine_detok d;
	engine_detok_init(&d, t);
	char all[64];
	size_t used = 0;
	for (size_t i = 0; i < CM_ARRAY_LEN(ids); i++) {
		char buf[16];
		int n = engine_detok_push(&d, t, ids[i], buf, sizeof(buf));
		CHECK_EQ_INT(n, expect_len[i]);
		if (n < 0)
			continue;
		memcpy(all + used, buf, (size_t)n);
		used += (size_t)n;
		CHECK(valid_utf8(all, used)); /* every prefix emitted is whole characters */
	}
	CHECK_EQ_INT(engine_detok_flush(&d, all + used, sizeof(all) - used), 0);
	CHECK(used == 7 && memcmp(all, "\xc3\xa9\xf0\x9f\x98\x80x", 7) == 0);

	/* a sequence broken mid-way: U+FFFD for each byte held, then the rest */
	engine_detok_init(&d, t);
	char buf[32];
	CHECK_EQ_INT(engine_detok_push(&d, t, ID_BYTE0 + 0xf0, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(engine_detok_push(&d, t, ID_BYTE0 + 0x9f, buf, sizeof(buf)), 0);
	int n = engine_detok_push(&d, t, id_a, buf, sizeof(buf));
	CHECK_EQ_INT(n, 7);
	CHECK(n == 7 && memcmp(buf,
	                       "\xef\xbf\xbd\xef\xbf\xbd"
	                       "a",
	                       7) == 0);
	/* flush of a pending lead byte */
	CHECK_EQ_INT(engine_detok_push(&d, t, ID_BYTE0 + 0xe2, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(engine_detok_flush(&d, buf, 2), -ENOBUFS);
	CHECK_EQ_INT(engine_detok_flush(&d, buf, sizeof(buf)), 3);
	CHECK_EQ_INT(engine_detok_flush(&d, buf, sizeof(buf)), 0);
	/* overlong and surrogate encodings are invalid */
	const int32_t ovl[] = {ID_BYTE0 + 0xe0, ID_BYTE0 + 0x80, ID_BYTE0 + 0xed, ID_BYTE0 + 0xa0,
	                       ID_BYTE0 + 0x80};
	char *text = NULL;
	CHECK_OK(engine_detokenize(t, ovl, 5, false, &text, NULL));
	CHECK(text && valid_utf8(text, strlen(text)) && strlen(text) == 15);
	free(text);
	engine_tokenizer_free(t);
}

/* Whole and streamed detokenization agree, and the stream is always valid
 * UTF-8, over random id sequences heavy in byte tokens. */
static void test_stream_vs_whole(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	int nv = engine_tokenizer_n_vocab(t);
	uint64_t x = 99;
	for (int round = 0; round < 300; round++) {
		int32_t ids[40];
		int n = 1 + round % 40;
		for (int i = 0; i < n; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			uint32_t r = (uint32_t)(x >> 33);
			ids[i] = (r & 3) ? (int32_t)(ID_BYTE0 + 0x80 + (r >> 8) % 0x78)
			                 : (int32_t)((r >> 8) % (uint32_t)nv);
			if (ids[i] == ID_BYTE0) /* a NUL would end the whole string early */
				ids[i] = ID_BYTE0 + 1;
		}
		char *whole = NULL;
		CHECK_OK(engine_detokenize(t, ids, n, false, &whole, NULL));
		if (!whole)
			continue;
		struct engine_detok d;
		engine_detok_init(&d, t);
		d.first = true; /* as engine_detokenize does */
		char s[40 * 32];
		size_t used = 0;
		for (int i = 0; i < n; i++) {
			int k = engine_detok_push(&d, t, ids[i], s + used, sizeof(s) - used);
			CHECK(k >= 0);
			if (k > 0)
				used += (size_t)k;
			CHECK(valid_utf8(s, used));
		}
		int k = engine_detok_flush(&d, s + used, sizeof(s) - used);
		used += k > 0 ? (size_t)k : 0;
		CHECK(strlen(whole) == used && memcmp(whole, s, used) == 0);
		CHECK(valid_utf8(whole, strlen(whole)));
		free(whole);
	}
	engine_tokenizer_free(t);
}

static void test_enobufs(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	int32_t out[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
	int n = 0;
	struct cm_err err = {0};
	int r = engine_tokenize(t, "hello hello hello", 17, true, false, out, 2, &n, &err);
	CHECK_EQ_INT(r, -ENOBUFS);
	CHECK_EQ_INT(n, 4);
	CHECK(err.msg[0] != '\0');
	CHECK_EQ_INT(out[0], ID_BOS);
	CHECK_EQ_INT(out[1], id_sp_hello);
	CHECK_EQ_INT(out[2], -7); /* nothing written past max */
	CHECK_EQ_INT(engine_tokenize(t, "hello hello hello", 17, true, false, NULL, 0, &n, NULL),
	             -ENOBUFS);
	CHECK_EQ_INT(n, 4);
	CHECK_OK(engine_tokenize(t, "hello hello hello", 17, true, false, out, 4, &n, NULL));
	CHECK_EQ_INT(n, 4);
	CHECK_EQ_INT(engine_tokenize(t, "x", 1, true, false, out, -1, &n, NULL), -EINVAL);
	engine_tokenizer_free(t);
}

static void test_big_inputs(void)
{
	engine_tokenizer *t = base_tok(-1, NULL);
	if (!t)
		return;
	/* 1 MB of random bytes */
	size_t len = 1 << 20;
	char *s = malloc(len);
	uint64_t x = 7;
	for (size_t i = 0; i < len; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		s[i] = (char)(x >> 56);
	}
	for (int ps = 0; ps < 2; ps++) {
		int n = 0;
		double t0 = cm_now();
		int32_t *ids = tokenize(t, s, len, true, ps, &n);
		double dt = cm_now() - t0;
		CHECK(ids != NULL && n > (int)(len / 4));
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "1 MB random (parse_special %d): %d ids, %.3f s\n", ps, n,
			        dt);
		char *text = NULL;
		if (ids)
			CHECK_OK(engine_detokenize(t, ids, n, false, &text, NULL));
		CHECK(text && valid_utf8(text, strlen(text)));
		free(text);
		free(ids);
	}
	/* 1 MB of one letter, and of spaces */
	memset(s, 'a', len);
	int n = 0;
	int32_t *ids = tokenize(t, s, len, false, false, &n);
	CHECK(ids && n == (int)(len / 2) + 1);
	free(ids);
	memset(s, ' ', len);
	ids = tokenize(t, s, len, false, true, &n);
	CHECK(ids && n == (int)(len / 2) + 1);
	free(ids);
	free(s);

	/* 100k special-looking tags, matched and unmatched */
	static const char unit[] = "<s><|im_end|>x<|im_end|<|user|></s";
	size_t ul = sizeof(unit) - 1, reps = 100000;
	s = malloc(ul * reps);
	for (size_t i = 0; i < reps; i++)
		memcpy(s + i * ul, unit, ul);
	for (int ps = 0; ps < 2; ps++) {
		double t0 = cm_now();
		ids = tokenize(t, s, ul * reps, false, ps, &n);
		double dt = cm_now() - t0;
		CHECK(ids != NULL);
		int c_bos = 0, c_end = 0, c_user = 0;
		for (int i = 0; ids && i < n; i++) {
			c_bos += ids[i] == ID_BOS;
			c_end += ids[i] == id_im_end;
			c_user += ids[i] == id_user;
		}
		CHECK_EQ_INT(c_bos, ps ? (int)reps : 0);
		CHECK_EQ_INT(c_end, ps ? (int)reps : 0);
		CHECK_EQ_INT(c_user, (int)reps);
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "100k tags (parse_special %d): %d ids, %.3f s\n", ps, n,
			        dt);
		free(ids);
	}
	free(s);
	engine_tokenizer_free(t);
}

/* ---- metadata validation ------------------------------------------------------ */

static void test_validation(void)
{
	struct vb v;
	engine_tokenizer *t = NULL;
	struct cm_err err = {0};

	vb_base(&v);
	v.model = "bert";
	CHECK_EQ_INT(vb_build(&v, &t, &err), -ENOTSUP);
	CHECK_STREQ(err.msg, "tokenizer model 'bert' is not supported (supported: llama, gpt2)");
	CHECK(t == NULL);
	vb_fini(&v);

	vb_base(&v);
	free(v.texts[id_abc]);
	v.texts[id_abc] = strdup("ab");
	CHECK_EQ_INT(vb_build(&v, &t, &err), -EPROTO);
	char want[128];
	snprintf(want, sizeof(want), "ids %d and %d", id_ab, id_abc);
	CHECK_MSG(strstr(err.msg, want) && strstr(err.msg, "'ab'"), "%s", err.msg);
	vb_fini(&v);

	vb_base(&v);
	v.scores_as_i32 = true;
	CHECK_EQ_INT(vb_build(&v, &t, &err), -EPROTO);
	CHECK(strstr(err.msg, "tokenizer.ggml.scores") != NULL);
	vb_fini(&v);

	vb_base(&v);
	v.short_types = true;
	CHECK_EQ_INT(vb_build(&v, &t, &err), -EPROTO);
	CHECK(strstr(err.msg, "tokenizer.ggml.token_type") != NULL);
	vb_fini(&v);

	/* no tokens at all */
	vb_init(&v);
	CHECK(vb_build(&v, &t, &err) < 0);
	CHECK(t == NULL);
	vb_fini(&v);

	/* missing scores and types: zeros and NORMAL; empty text; a bad bos
	 * id is ignored; add_eos */
	vb_init(&v);
	vb_add(&v, "<unk>", 0, T_UNKNOWN);
	vb_add(&v, "", 0, T_NORMAL);
	vb_add(&v, "q", 0, T_NORMAL);
	v.no_scores = true;
	v.no_types = true;
	v.bos_id = 77;
	v.add_eos = 1;
	int r = vb_build(&v, &t, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	vb_fini(&v);
	if (t) {
		CHECK_STREQ(engine_tokenizer_text(t, 1, NULL), "[EMPTY_1]");
		CHECK_EQ_INT(engine_tokenizer_find(t, "[EMPTY_1]", 9), 1);
		CHECK_EQ_INT(engine_tokenizer_attr(t, 0), ENGINE_TOKEN_NORMAL);
		CHECK_EQ_INT(engine_tokenizer_bos(t), 1); /* the default */
		CHECK_EQ_INT(engine_tokenizer_eos(t), 2);
		/* "q" with a space prefix: ▁ is no token and there are no byte
		 * tokens: <unk> x3 */
		EXPECT_IDS(t, "q", true, false, 1, 0, 0, 0, 2, 2);
		engine_tokenizer_free(t);
	}

	/* load from a missing file */
	CHECK(engine_tokenizer_load("/nonexistent/x.gguf", &t, &err) < 0);
	CHECK(t == NULL);
	engine_tokenizer_free(NULL);
}

/* Every allocation failure is reported as -ENOMEM, without leaks or
 * crashes (ASan run). */
static void test_alloc_failures(void)
{
	struct vb v;
	vb_base(&v);
	size_t size = 0;
	uint8_t *buf = vb_gguf(&v, &size);
	vb_fini(&v);
	struct gguf_file *f = NULL;
	CHECK(buf && gguf_open_mem(buf, size, &f, NULL) == 0);
	if (!f) {
		cm_free(buf);
		return;
	}
	static const char text[] = "<s>hello <|user|> abc\xf0\x9f\x98\x80";
	bool done = false;
	for (long after = 0; after < 200 && !done; after++) {
		engine_tokenizer *t = NULL;
		struct cm_err err = {0};
		int32_t ids[64];
		int n = 0;
		char *out = NULL;
		cm_alloc_fail_reset(after);
		int r = engine_tokenizer_new(f, &t, &err);
		if (r == 0)
			r = engine_tokenize(t, text, sizeof(text) - 1, true, true, ids, 64, &n,
			                    &err);
		if (r == 0)
			r = engine_detokenize(t, ids, n, true, &out, &err);
		cm_alloc_fail_reset(-1);
		CHECK_MSG(r == 0 || r == -ENOMEM, "after %ld: %d %s", after, r, err.msg);
		done = r == 0;
		if (done)
			CHECK_STREQ(out, "<s><s> hello <|user|>  abc\xf0\x9f\x98\x80");
		cm_free(out);
		engine_tokenizer_free(t);
	}
	CHECK(done);
	gguf_close(f);
	cm_free(buf);
}

int main(void)
{
	TEST_RUN(test_vocab_vectors);
	TEST_RUN(test_stories260k);
	TEST_RUN(test_stories3m);
	TEST_RUN(test_synthetic_basics);
	TEST_RUN(test_byte_fallback);
	TEST_RUN(test_special_tokens);
	TEST_RUN(test_pieces);
	TEST_RUN(test_stream_emoji);
	TEST_RUN(test_stream_vs_whole);
	TEST_RUN(test_enobufs);
	TEST_RUN(test_big_inputs);
	TEST_RUN(test_validation);
	TEST_RUN(test_alloc_failures);
	return test_finish();
}
