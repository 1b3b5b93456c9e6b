/* tests/unit/test_engine_tokenizer_bpe.c: every vocab file in $EDGELM_TESTDATA/vocab
 * (SPM and byte-level BPE) against its llama.cpp test vectors, round trips,
 * the GPT-2 byte map and clean_spaces, special tokens, and hostile inputs
 * (random bytes, invalid UTF-8, a megabyte of text, 100k tags). */
#include "engine/tokenizer_impl.h"
#include "tests/test.h"

#include <dirent.h>
#include <stdint.h>
#include <time.h>

/* ---- helpers ------------------------------------------------------------- */

static char *slurp(const char *path, size_t *ret_n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0, k;
	char *buf = malloc(cap + 1);
	while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
		n += k;
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

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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

/* Concatenated pieces (no clean-up, no space stripping): the exact bytes
 * the ids stand for. */
static char *pieces(const engine_tokenizer *t, const int32_t *ids, int n, size_t *ret_len)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);
	for (int i = 0; s && i < n; i++) {
		int k;
		while ((k = engine_token_to_piece(t, ids[i], false, s + len, cap - len)) ==
		       -ENOBUFS) {
			char *ns = realloc(s, cap *= 2);
			if (!ns) {
				free(s);
				return NULL;
			}
			s = ns;
		}
		if (k < 0) {
			free(s);
			return NULL;
		}
		len += (size_t)k;
	}
	*ret_len = len;
	return s;
}

/* Streaming detokenization, token by token, then flush. */
static char *stream(const engine_tokenizer *t, const int32_t *ids, int n, size_t *ret_len)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);
	struct engine_detok d;
	engine_detok_init(&d, t);
	for (int i = 0; s && i <= n; i++) {
		int k;
		for (;;) {
			if (i < n)
				k = engine_detok_push(&d, t, ids[i], s + len, cap - len);
			else
				k = engine_detok_flush(&d, s + len, cap - len);
			if (k != -ENOBUFS)
				break;
			char *ns = realloc(s, cap *= 2);
			if (!ns) {
				free(s);
				return NULL;
			}
			s = ns;
		}
		if (k < 0) {
			free(s);
			return NULL;
		}
		len += (size_t)k;
	}
	*ret_len = len;
	return s;
}

static void print_ids(const char *what, const int32_t *a, int n)
{
	fprintf(stderr, "  %s:", what);
	for (int i = 0; i < n && i < 64; i++)
		fprintf(stderr, " %d", a[i]);
	fputc('\n', stderr);
}

static engine_tokenizer *load_vocab(const char *name)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf", test_data_path("vocab"), name);
	if (!test_file_exists(path))
		return NULL;
	engine_tokenizer *t = NULL;
	struct cm_err err = {0};
	int r = engine_tokenizer_load(path, &t, &err);
	CHECK_MSG(r == 0, "%s: %s", path, err.msg);
	return t;
}

/* ---- (1) the test vectors of every vocab file ------------------------------- */

static void run_vocab_file(const char *dir, const char *name, int *ret_files)
{
	char path[8400], pin[8500], pout[8500];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(pin, sizeof(pin), "%s.inp", path);
	snprintf(pout, sizeof(pout), "%s.out", path);
	size_t nin = 0, nout = 0;
	char *inp = slurp(pin, &nin), *out = slurp(pout, &nout);
	if (!inp || !out) {
		free(inp);
		free(out);
		return;
	}
	engine_tokenizer *t = NULL;
	struct cm_err err = {0};
	double t0 = now_s();
	int r = engine_tokenizer_load(path, &t, &err);
	double build_ms = (now_s() - t0) * 1e3;
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
	int n_vec = 0, n_pass = 0, n_exact = 0, n_whole = 0, n_stream = 0;
	for (;;) {
		char *e = strstr(p, sep);
		if (!e)
			break;
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
		if (got && ng == nw && (nw == 0 || memcmp(got, want, (size_t)nw * 4) == 0)) {
			n_pass++;
		} else {
			fprintf(stderr, "%s: vector %d mismatch, input '%.*s'\n", name, n_vec - 1,
			        (int)(len > 200 ? 200 : len), p);
			if (got)
				print_ids("got ", got, ng);
			print_ids("want", want, nw);
		}
		if (got) {
			size_t pl = 0, sl = 0;
			char *pc = pieces(t, got, ng, &pl);
			if (pc && pl == len && memcmp(pc, p, len) == 0)
				n_exact++;
			char *st = stream(t, got, ng, &sl);
			/* streaming equals the pieces whenever the pieces are UTF-8 */
			if (st && pc && sl == pl && memcmp(st, pc, pl) == 0)
				n_stream++;
			char *text = NULL;
			if (engine_detokenize(t, got, ng, false, &text, &err) == 0 &&
			    strlen(text) == len && memcmp(text, p, len) == 0)
				n_whole++;
			free(text);
			free(pc);
			free(st);
		}
		free(got);
		p = e + seplen;
		o = nl + 1;
	}
	fprintf(stderr,
	        "%-34s %3d/%3d vectors match; round trip: pieces %d/%d, whole detokenize %d/%d, "
	        "stream==pieces %d/%d; built in %.0f ms\n",
	        name, n_pass, n_vec, n_exact, n_vec, n_whole, n_vec, n_stream, n_vec, build_ms);
	CHECK(n_vec > 0);
	CHECK_EQ_INT(n_pass, n_vec);
	/* byte-level BPE is lossless: the pieces give back every input */
	if (t->model == TOK_MODEL_BPE)
		CHECK_EQ_INT(n_exact, n_vec);
	engine_tokenizer_free(t);
	free(inp);
	free(out);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
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
	char *names[256];
	int nn = 0;
	struct dirent *e;
	while ((e = readdir(d)) && nn < 256) {
		size_t l = strlen(e->d_name);
		if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0)
			names[nn++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(names, (size_t)nn, sizeof(*names), cmp_str);
	int n_files = 0;
	for (int i = 0; i < nn; i++) {
		run_vocab_file(dir, names[i], &n_files);
		free(names[i]);
	}
	if (n_files == 0)
		TEST_SKIP_DATA("no vocab with test vectors in %s", dir);
}

/* ---- (2) pieces of the BPE machinery ------------------------------------------ */

static void test_clean_spaces(void)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
	    {"Hello , world !", "Hello, world!"},
	    {"a . b ?", "a. b?"},
	    {"it ' s", "it's"},
	    {"he 's here", "he's here"},
	    {"we 're , you 've , I 'm", "we're, you've, I'm"},
	    {"", ""},
	    {" ", " "},
	    {" ,", ","},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[128];
		size_t n = strlen(cases[i].in);
		memcpy(buf, cases[i].in, n);
		n = engine_bpe_clean_spaces(buf, n);
		buf[n] = '\0';
		CHECK_STREQ(buf, cases[i].out);
	}
}

/* Ids of a text, as the pieces they decode to, joined with '|'. */
static void split_str(const engine_tokenizer *t, const char *s, char *out, size_t cap)
{
	int n = 0;
	int32_t *ids = tokenize(t, s, strlen(s), false, false, &n);
	size_t o = 0;
	out[0] = '\0';
	for (int i = 0; ids && i < n; i++) {
		char p[256];
		int k = engine_token_to_piece(t, ids[i], true, p, sizeof(p));
		if (k < 0 || o + (size_t)k + 2 >= cap)
			break;
		if (i)
			out[o++] = '|';
		memcpy(out + o, p, (size_t)k);
		o += (size_t)k;
		out[o] = '\0';
	}
	free(ids);
}

static void test_llama3_pretokenizer(void)
{
	engine_tokenizer *t = load_vocab("llama-bpe");
	if (!t) {
		TEST_SKIP_DATA("no llama-bpe vocab");
		return;
	}
	CHECK_STREQ(engine_bpe_pre_name(t), "llama-bpe");
	CHECK(engine_tokenizer_add_bos(t));
	char buf[512];
	split_str(t, "Hello world", buf, sizeof(buf));
	CHECK_STREQ(buf, "Hello| world");
	split_str(t, " 123 4567", buf, sizeof(buf));
	CHECK_STREQ(buf, " |123| |456|7");
	/* the EOT token is an end of generation and is matched when asked */
	int32_t eot = engine_tokenizer_find(t, "<|eot_id|>", 10);
	CHECK(eot >= 0 && engine_tokenizer_is_eog(t, eot));
	int n = 0;
	int32_t *ids = tokenize(t, "hi<|eot_id|>", 12, true, true, &n);
	CHECK(ids && n == 3 && ids[0] == engine_tokenizer_bos(t) && ids[2] == eot);
	free(ids);
	/* without parse_special the control token is text */
	ids = tokenize(t, "<|eot_id|>", 10, false, false, &n);
	CHECK(ids && n > 1);
	free(ids);
	engine_tokenizer_free(t);
}

static void test_qwen2_specials(void)
{
	engine_tokenizer *t = load_vocab("qwen2");
	if (!t) {
		TEST_SKIP_DATA("no qwen2 vocab");
		return;
	}
	CHECK(!engine_tokenizer_add_bos(t));
	int32_t ims = engine_tokenizer_find(t, "<|im_start|>", 12);
	int32_t ime = engine_tokenizer_find(t, "<|im_end|>", 10);
	CHECK(ims >= 0 && ime >= 0);
	CHECK(engine_tokenizer_is_eog(t, ime));
	CHECK(!engine_tokenizer_is_eog(t, ims));
	const char *s = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
	int n = 0;
	int32_t *ids = tokenize(t, s, strlen(s), true, true, &n);
	CHECK(ids && n >= 6 && ids[0] == ims);
	char *text = NULL;
	CHECK_OK(engine_detokenize(t, ids, n, true, &text, NULL));
	CHECK_STREQ(text, s);
	free(text);
	free(ids);
	/* single digits for qwen2 */
	char buf[256];
	split_str(t, "12345", buf, sizeof(buf));
	CHECK_STREQ(buf, "1|2|3|4|5");
	engine_tokenizer_free(t);
}

/* ---- (3) hostile inputs ---------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

static void hostile(engine_tokenizer *t, const char *name)
{
	/* random bytes (including invalid UTF-8): ids valid, pieces and
	 * streaming agree after sanitizing */
	for (int it = 0; it < 200; it++) {
		char s[300];
		size_t n = rnd() % sizeof(s);
		for (size_t i = 0; i < n; i++)
			s[i] = (char)(rnd() % 4 ? (char)rnd() : "< |>\n \xc3\xa9"[rnd() % 7]);
		int k = 0;
		int32_t *ids = tokenize(t, s, n, rnd() & 1, rnd() & 1, &k);
		CHECK_MSG(ids != NULL, "%s: random bytes", name);
		for (int i = 0; ids && i < k; i++)
			CHECK(ids[i] >= 0 && ids[i] < engine_tokenizer_n_vocab(t));
		size_t sl = 0;
		char *st = ids ? stream(t, ids, k, &sl) : NULL;
		CHECK(!ids || st);
		free(st);
		free(ids);
	}
	/* a megabyte of text: words, whitespace runs, digits, CJK (a quarter
	 * of it under the sanitizers, which are ~20x slower) */
	size_t big = SANITIZED ? 1 << 18 : 1 << 20;
	char *s = malloc(big);
	static const char *const parts[] = {"hello ", "   ", "\n\n", "12345", "\xe4\xb8\xad",
	                                    "!!",     "\t",  "x",    "\xff",  "'s "};
	size_t n = 0;
	while (n + 8 < big) {
		const char *p = parts[rnd() % 10];
		size_t l = strlen(p);
		memcpy(s + n, p, l);
		n += l;
	}
	double t0 = now_s();
	int k = 0;
	int32_t *ids = tokenize(t, s, n, true, true, &k);
	CHECK_MSG(ids && k > 0, "%s: 1 MB", name);
	fprintf(stderr, "%s: 1 MB mixed text in %.0f ms\n", name, (now_s() - t0) * 1e3);
	free(ids);
	/* one whitespace run and one word of a megabyte */
	memset(s, ' ', n);
	s[n - 1] = 'a';
	ids = tokenize(t, s, n, false, false, &k);
	CHECK_MSG(ids && k > 0, "%s: 1 MB of spaces", name);
	free(ids);
	memset(s, 'a', n);
	ids = tokenize(t, s, n, false, false, &k);
	CHECK_MSG(ids && k > 0, "%s: 1 MB word", name);
	free(ids);
	free(s);
	/* 100k special-looking tags */
	static const char *const tags[] = {"<|im_start|>", "<|eot_id|>", "<s>",   "</s>",
	                                   "<|im_",        "<|",         "<unk>", "<|endoftext|>"};
	size_t cap = 100000 * 14; /* 100k tags of at most 13 bytes */
	s = malloc(cap);
	n = 0;
	for (int i = 0; i < 100000; i++) {
		const char *tg = tags[rnd() % 8];
		size_t l = strlen(tg);
		memcpy(s + n, tg, l);
		n += l;
	}
	t0 = now_s();
	ids = tokenize(t, s, n, true, true, &k);
	CHECK_MSG(ids && k > 0, "%s: 100k tags", name);
	fprintf(stderr, "%s: 100k tags in %.0f ms\n", name, (now_s() - t0) * 1e3);
	free(ids);
	free(s);
}

static void test_hostile_inputs(void)
{
	/* one vocabulary per pre-tokenizer shape, to keep the test quick */
	static const char *const names[] = {"qwen2", "llama-bpe", "deepseek-llm", "falcon",
	                                    "llama-spm"};
	int n = 0;
	size_t nn = SANITIZED ? 2 : sizeof(names) / sizeof(names[0]);
	for (size_t i = 0; i < nn; i++) {
		engine_tokenizer *t = load_vocab(names[i]);
		if (!t)
			continue;
		n++;
		hostile(t, names[i]);
		engine_tokenizer_free(t);
	}
	if (!n)
		TEST_SKIP_DATA("no vocab files");
}

/* ---- (4) synthetic vocabulary: invalid UTF-8 becomes U+FFFD ------------------------ */

static void test_invalid_utf8_fffd(void)
{
	engine_tokenizer *t = load_vocab("gpt-2");
	if (!t) {
		TEST_SKIP_DATA("no gpt-2 vocab");
		return;
	}
	int n1 = 0, n2 = 0;
	int32_t *a = tokenize(t,
	                      "a\xff"
	                      "b",
	                      3, false, false, &n1);
	int32_t *b = tokenize(t,
	                      "a\xef\xbf\xbd"
	                      "b",
	                      5, false, false, &n2);
	CHECK(a && b && n1 == n2 && memcmp(a, b, (size_t)n1 * 4) == 0);
	free(a);
	free(b);
	engine_tokenizer_free(t);
}

/* SPM word-by-word merging gives the ids of whole-text merging. */
static void test_spm_words_equivalent(void)
{
	engine_tokenizer *t = load_vocab("llama-spm");
	if (!t) {
		TEST_SKIP_DATA("no llama-spm vocab");
		return;
	}
	CHECK(t->spm_words);
	static const char *const parts[] = {"hello ",       "   ", "\n\n",  "12345",
	                                    "\xe4\xb8\xad", "!!",  "\t",    "x",
	                                    "\xff",         "'s ", "\xf0 ", "world"};
	size_t cap = 200000, n = 0;
	char *s = malloc(cap);
	while (n + 8 < cap) {
		const char *p = parts[rnd() % 12];
		memcpy(s + n, p, strlen(p));
		n += strlen(p);
	}
	int na = 0, nb = 0;
	int32_t *a = tokenize(t, s, n, true, true, &na);
	t->spm_words = false;
	int32_t *b = tokenize(t, s, n, true, true, &nb);
	CHECK(a && b && na == nb && memcmp(a, b, (size_t)na * 4) == 0);
	free(a);
	free(b);
	free(s);
	engine_tokenizer_free(t);
}

int main(void)
{
	TEST_RUN(test_vocab_vectors);
	TEST_RUN(test_clean_spaces);
	TEST_RUN(test_llama3_pretokenizer);
	TEST_RUN(test_qwen2_specials);
	TEST_RUN(test_invalid_utf8_fffd);
	TEST_RUN(test_hostile_inputs);
	TEST_RUN(test_spm_words_equivalent);
	return test_finish();
}
