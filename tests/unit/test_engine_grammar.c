/* tests/unit/test_engine_grammar.c: GBNF grammars (docs/grammar.md): each
 * construct accepting and refusing text at the code point level, each
 * class of error with its line and column, and constrained sampling with
 * real vocabularies (Llama 2's SPM, Qwen2's BPE) and stories260K: every
 * sampled token is allowed, the text matches, EOS only where accepting. */
#include "engine/grammar_impl.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Fewer sampling steps under the sanitizers: the allowed-set walks are the
 * slow part, and the coverage is the same. */
#if defined(__SANITIZE_ADDRESS__)
#define STEPS_SCALE 4
#else
#define STEPS_SCALE 1
#endif

/* -1: refused on the way, 0: a valid prefix only, 1: a complete match. */
static int match(const char *gbnf, const char *text, size_t n)
{
	engine_grammar *g = NULL;
	struct cm_err err = {0};
	int r = engine_grammar_new(NULL, gbnf, strlen(gbnf), &g, &err);
	CHECK_MSG(r == 0, "%s: %s", gbnf, err.msg);
	if (r)
		return -2;
	struct grammar_state *st = NULL;
	CHECK_OK(grammar_state_new(g, &st, &err));
	int res = -1;
	if (grammar_state_feed(st, text, n) == 0)
		res = grammar_state_accepting(st) ? 1 : 0;
	grammar_state_free(st);
	engine_grammar_free(g);
	return res;
}

struct mcase {
	const char *gbnf, *text;
	int want;
};

static void test_constructs(void)
{
	static const struct mcase cases[] = {
	    /* literals and escapes */
	    {"root ::= \"abc\"", "abc", 1},
	    {"root ::= \"abc\"", "ab", 0},
	    {"root ::= \"abc\"", "abd", -1},
	    {"root ::= \"abc\"", "abcd", -1},
	    {"root ::= \"\"", "", 1},
	    {"root ::= \"a\\n\\t\\\"\\\\\"", "a\n\t\"\\", 1},
	    {"root ::= \"\\x41\\u00e9\\U0001F600\"", "A\xc3\xa9\xf0\x9f\x98\x80", 1},
	    {"root ::= \"\xc3\xa9t\xc3\xa9\"", "\xc3\xa9t\xc3\xa9", 1},
	    {"root ::= \"\\r\\[\\]\"", "\r[]", 1},
	    /* classes */
	    {"root ::= [a-z0-9_]", "q", 1},
	    {"root ::= [a-z0-9_]", "_", 1},
	    {"root ::= [a-z0-9_]", "7", 1},
	    {"root ::= [a-z0-9_]", "A", -1},
	    {"root ::= [^a-z\"]", "A", 1},
	    {"root ::= [^a-z\"]", "q", -1},
	    {"root ::= [^a-z\"]", "\"", -1},
	    {"root ::= [^a-z\"]", "\xc3\xa9", 1},
	    {"root ::= [\\x00-\\x1f]", "\x1f", 1},
	    {"root ::= [a-]", "-", 1},
	    {"root ::= [\xc3\xa0-\xc3\xbf]", "\xc3\xa9", 1},
	    {"root ::= [\xc3\xa0-\xc3\xbf]", "\xc3\x80", -1},
	    {"root ::= .", "\xe2\x82\xac", 1},
	    {"root ::= . .", "x", 0},
	    /* alternation and grouping */
	    {"root ::= \"a\" | \"b\" | \"cd\"", "cd", 1},
	    {"root ::= \"a\" | \"b\" | \"cd\"", "c", 0},
	    {"root ::= \"a\" | \"b\" | \"cd\"", "e", -1},
	    {"root ::= \"x\" (\"a\" | \"b\") \"y\"", "xby", 1},
	    {"root ::= \"x\" (\"a\" | \"b\") \"y\"", "xy", -1},
	    {"root ::= (\"a\" (\"b\" | \"c\"))", "ac", 1},
	    {"root ::= \"a\" ()", "a", 1},
	    /* repetition */
	    {"root ::= \"a\"*", "", 1},
	    {"root ::= \"a\"*", "aaaa", 1},
	    {"root ::= \"a\"+", "", 0},
	    {"root ::= \"a\"+", "aaa", 1},
	    {"root ::= \"a\"? \"b\"", "b", 1},
	    {"root ::= \"a\"? \"b\"", "ab", 1},
	    {"root ::= \"a\"? \"b\"", "aab", -1},
	    {"root ::= \"ab\"*", "abab", 1},
	    {"root ::= \"ab\"*", "aba", 0},
	    {"root ::= [0-9]{3}", "123", 1},
	    {"root ::= [0-9]{3}", "12", 0},
	    {"root ::= [0-9]{3}", "1234", -1},
	    {"root ::= [0-9]{2,}", "1", 0},
	    {"root ::= [0-9]{2,}", "123456", 1},
	    {"root ::= [0-9]{1,3}", "123", 1},
	    {"root ::= [0-9]{1,3}", "1234", -1},
	    {"root ::= [0-9]{0,2} \"x\"", "x", 1},
	    {"root ::= [0-9]{0,2} \"x\"", "12x", 1},
	    {"root ::= [0-9]{ 2 , 3 }", "12", 1},
	    {"root ::= (\"a\" | \"b\"){2}", "ba", 1},
	    /* rules, references, recursion, comments, multi-line rules */
	    {"root ::= item (\",\" item)*\nitem ::= [a-z]+", "ab,c,de", 1},
	    {"root ::= item (\",\" item)*\nitem ::= [a-z]+", "ab,,c", -1},
	    {"root ::= \"(\" root \")\" | \"x\"", "((x))", 1},
	    {"root ::= \"(\" root \")\" | \"x\"", "((x)", 0},
	    {"# a comment\nroot ::= a # another\n\na ::= \"q\" # end", "q", 1},
	    {"root ::=\n  \"a\" (\n    \"b\"\n  | \"c\"\n  )", "ac", 1},
	    {"root ::= \"a\"\n  | \"b\"\n\n  | \"c\"", "c", 1},
	    {"root ::= \"a\" |\n  \"b\"", "b", 1},
	    {"root ::= x\nx ::= y \"!\"\ny ::= \"\" | \"y\"", "!", 1},
	    {"root ::= list\nlist ::= \"[\" (elem (\",\" elem)*)? \"]\"\nelem ::= list | [0-9]",
	     "[1,[2,[]],3]", 1},
	    {"root ::= a\r\na ::= \"z\"\r\n", "z", 1},
	    {"root-rule ::= \"k\"\nroot ::= root-rule", "k", 1},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		int got = match(cases[i].gbnf, cases[i].text, strlen(cases[i].text));
		CHECK_MSG(got == cases[i].want, "case %zu: %s on \"%s\": %d, want %d", i,
		          cases[i].gbnf, cases[i].text, got, cases[i].want);
	}
}

/* A character may arrive a byte at a time (tokens split UTF-8). */
static void test_partial_utf8(void)
{
	const char *gbnf = "root ::= [\xc3\xa0-\xc3\xbf] \"\xe2\x82\xac\"";
	engine_grammar *g = NULL;
	struct grammar_state *st = NULL;
	CHECK_OK(engine_grammar_new(NULL, gbnf, strlen(gbnf), &g, NULL));
	CHECK_OK(grammar_state_new(g, &st, NULL));
	CHECK_OK(grammar_state_feed(st, "\xc3", 1));
	CHECK(!grammar_state_accepting(st));
	CHECK_OK(grammar_state_feed(st, "\xa9\xe2", 2));
	CHECK_OK(grammar_state_feed(st, "\x82", 1));
	CHECK(!grammar_state_accepting(st));
	CHECK_EQ_INT(grammar_state_feed(st, "\x83", 1), -EINVAL); /* U+20AC, not U+20C3 */
	CHECK_OK(grammar_state_feed(st, "\xac", 1));
	CHECK(grammar_state_accepting(st));
	CHECK(grammar_state_done(st));
	grammar_state_reset(st);
	CHECK_EQ_INT(grammar_state_feed(st, "\xc3\x80", 2), -EINVAL); /* below the range */
	CHECK_EQ_INT(grammar_state_feed(st, "\xc2", 1), -EINVAL);     /* no completion fits */
	CHECK_EQ_INT(grammar_state_feed(st, "\xa9", 1), -EINVAL);     /* a stray continuation */
	CHECK_EQ_INT(grammar_state_feed(st, "a", 1), -EINVAL);
	grammar_state_free(st);
	/* compiled without a vocabulary: no sampler takes it */
	struct engine_sampler_params sp;
	engine_sampler_params_default(&sp);
	sp.grammar = g;
	engine_sampler *s = NULL;
	struct cm_err err = {0};
	CHECK_EQ_INT(engine_sampler_new(&sp, 100, &s, &err), -EINVAL);
	CHECK(s == NULL && strstr(err.msg, "without a vocabulary") != NULL);
	engine_grammar_free(g);

	/* invalid UTF-8 is refused even where the code point would fit: the
	 * client would see U+FFFD */
	static const struct mcase bad[] = {
	    {"root ::= \" \"", "\xc0\xa0", -1},             /* overlong space */
	    {"root ::= \" \"", "\xc0", -1},
	    {"root ::= [^x]", "\xe0\x80\xa0", -1},          /* overlong */
	    {"root ::= [^x]", "\xed\xa0\x80", -1},          /* a surrogate */
	    {"root ::= [^x]", "\xf4\x90\x80\x80", -1},     /* past U+10FFFF */
	    {"root ::= [^x]", "\xf0\x80\x80\xa0", -1},     /* overlong */
	    {"root ::= [^x]", "\xf4\x8f\xbf\xbf", 1},      /* U+10FFFF */
	    {"root ::= [^x]", "\xed\x9f\xbf", 1},           /* U+D7FF */
	    {"root ::= [\\x00-\\x7f]", "\xc2", -1},       /* no completion is ASCII */
	    {"root ::= [\\u0800-\\uffff]", "\xe0", 0},    /* E0 A0..BF fits */
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		int got = match(bad[i].gbnf, bad[i].text, strlen(bad[i].text));
		CHECK_MSG(got == bad[i].want, "bad %zu: %s: %d, want %d", i, bad[i].gbnf, got,
		          bad[i].want);
	}
}

/* Many alternatives alive at once (a JSON enum of thousands of values):
 * none is dropped. */
static void test_wide_alternation(void)
{
	enum { N = 5000 };
	char *g = malloc((size_t)N * 16 + 32), w[16];
	size_t k = (size_t)sprintf(g, "root ::= ");
	for (int i = 0; i < N; i++)
		k += (size_t)sprintf(g + k, "%s\"w%d\"", i ? " | " : "", i);
	g[k] = '\0';
	static const int picks[] = {0, 1, 999, 1024, 2500, N - 1};
	for (size_t i = 0; i < CM_ARRAY_LEN(picks); i++) {
		snprintf(w, sizeof(w), "w%d", picks[i]);
		CHECK_MSG(match(g, w, strlen(w)) == 1, "%s", w);
	}
	CHECK_EQ_INT(match(g, "w5000", 5), -1);
	CHECK_EQ_INT(match(g, "w49", 3), 1);
	free(g);
}

struct ecase {
	const char *gbnf, *msg;
};

static void test_errors(void)
{
	static const struct ecase cases[] = {
	    {"root ::= foo", "line 1, column 10: undefined rule 'foo'"},
	    {"foo ::= \"a\"", "no rule 'root'"},
	    {"", "no rule 'root'"},
	    {"root ::= \"a\\q\"", "line 1, column 12: bad escape '\\q'"},
	    {"root ::= \"\\x4\"", "bad escape: '\\x' needs 2 hex digits"},
	    {"root ::= \"\\U00110000\"", "beyond U+10FFFF"},
	    {"root ::= (\"a\"", "line 1, column 10: '(' without its ')'"},
	    {"root ::= \"a\")", "line 1, column 13: ')' without its '('"},
	    {"root ::= \"abc", "unterminated string literal"},
	    {"root ::= [abc", "unterminated character class"},
	    {"root ::= []", "empty character class"},
	    {"root ::= [z-a]", "range end"},
	    {"root ::= x\nx ::= x \"a\" | \"b\"", "line 2, column 1: rule 'x' can reach itself"},
	    {"root ::= a\na ::= b? a \"c\"\nb ::= \"b\"", "rule 'a' can reach itself"},
	    {"root ::= (\"a\"?)*", "can reach itself"},
	    {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' defined twice"},
	    {"root = \"a\"", "line 1, column 6: expected '::='"},
	    {"::= \"a\"", "expected a rule name"},
	    {"root ::= *", "nothing before '*'"},
	    {"root ::= \"a\"{2,1}", "max below min"},
	    {"root ::= \"a\"{x}", "expected a number"},
	    {"root ::= \"a\"{1000000}", "repetition count above"},
	    {"root ::= \"a\" ; \"b\"", "line 1, column 14: unexpected ';'"},
	    {"root ::= \"\xff\"", "invalid UTF-8"},
	    {"root ::= \"a\"\n\n   bad ::= x y", "line 3, column 12: undefined rule 'x'"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		engine_grammar *g = NULL;
		struct cm_err err = {0};
		int r = engine_grammar_new(NULL, cases[i].gbnf, strlen(cases[i].gbnf), &g, &err);
		CHECK_MSG(r == -EINVAL, "case %zu: %s: %d", i, cases[i].gbnf, r);
		CHECK(g == NULL);
		CHECK_MSG(strstr(err.msg, cases[i].msg) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
		          err.msg, cases[i].msg);
		engine_grammar_free(g);
	}
	/* deep nesting and huge repetitions are refused, not expanded */
	char deep[3000];
	size_t k = 0;
	k += (size_t)snprintf(deep, sizeof(deep), "root ::= ");
	for (int i = 0; i < 1000; i++)
		deep[k++] = '(';
	deep[k] = '\0';
	engine_grammar *g = NULL;
	struct cm_err err = {0};
	CHECK_EQ_INT(engine_grammar_new(NULL, deep, k, &g, &err), -EINVAL);
	CHECK(strstr(err.msg, "nested deeper") != NULL);
	const char *big = "root ::= \"0123456789012345678901234567890123456789\"{100000}";
	CHECK_EQ_INT(engine_grammar_new(NULL, big, strlen(big), &g, &err), -EINVAL);
	CHECK_MSG(strstr(err.msg, "too large") != NULL, "%s", err.msg);
	/* nested repetitions stay small: a group is one reference */
	const char *nest = "root ::= ((\"ab\"{1000}){1000}){100}";
	CHECK_OK(engine_grammar_new(NULL, nest, strlen(nest), &g, &err));
	engine_grammar_free(g);
}

/* ---- sampling with real vocabularies -------------------------------------- */

static uint64_t rnd_state = 0x1234567;
static uint32_t rnd(void)
{
	rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rnd_state >> 33);
}

static const char *json_gbnf =
    "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws str ws \",\" ws \"\\\"age\\\"\" ws \":\" ws"
    " int ws \",\" ws \"\\\"kind\\\"\" ws \":\" ws kind ws \"}\"\n"
    "str ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\nt] ){0,16} \"\\\"\"\n"
    "int ::= \"-\"? ([0-9] | [1-9] [0-9]{1,5})\n"
    "kind ::= \"\\\"cat\\\"\" | \"\\\"dog\\\"\" | \"\\\"bird\\\"\"\n"
    "ws ::= [ \\t\\n]{0,2}\n";

/* Sample up to max_steps tokens under the grammar from random logits (or
 * greedy) and check every step; returns the number of tokens. */
static int run_sampling(const engine_tokenizer *tok, const engine_grammar *g, float temp,
                        uint64_t seed, int max_steps, bool check_mask)
{
	int nv = engine_tokenizer_n_vocab(tok);
	struct engine_sampler_params sp;
	engine_sampler_params_default(&sp);
	sp.temp = temp;
	sp.seed = seed;
	sp.grammar = g;
	engine_sampler *s = NULL;
	struct cm_err err = {0};
	int r = engine_sampler_new(&sp, nv, &s, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r)
		return 0;
	float *logits = malloc((size_t)nv * sizeof(*logits));
	int32_t *ids = malloc((size_t)(max_steps + 1) * sizeof(*ids));
	uint8_t *mask = malloc((size_t)nv);
	struct grammar_state *shadow = NULL;
	CHECK_OK(grammar_state_new(g, &shadow, NULL));
	int n = 0;
	bool ended = false;
	for (int step = 0; step < max_steps; step++) {
		for (int i = 0; i < nv; i++)
			logits[i] = (float)(rnd() % 20000) / 1000.0f;
		/* sometimes make an end-of-generation token the favourite */
		if (rnd() % 4 == 0)
			logits[engine_tokenizer_eos(tok)] = 100.0f;
		int32_t id = engine_sampler_sample(s, logits);
		bool eog = engine_tokenizer_is_eog(tok, id);
		if (check_mask && step < 3) {
			/* the trie walk agrees with one check per token */
			int cnt = grammar_state_allowed(shadow, mask);
			int cnt2 = 0, bad = 0;
			for (int i = 0; i < nv; i++) {
				bool a = grammar_state_allows(shadow, i);
				cnt2 += a;
				bad += a != (mask[i] != 0);
			}
			CHECK_MSG(bad == 0 && cnt == cnt2, "step %d: %d disagree (%d vs %d)", step,
			          bad, cnt, cnt2);
			CHECK(cnt > 0);
		}
		CHECK_MSG(grammar_state_allows(shadow, id), "step %d: token %d not allowed", step,
		          (int)id);
		CHECK_EQ_INT(engine_sampler_advance(s, id), 0);
		CHECK_EQ_INT(grammar_state_advance(shadow, id), 0);
		if (eog) {
			CHECK_MSG(grammar_state_accepting(shadow), "EOG %d in a non-accepting state",
			          (int)id);
			ended = true;
			break;
		}
		ids[n++] = id;
		if (engine_sampler_grammar_done(s)) {
			/* only the end is left */
			int cnt = grammar_state_allowed(shadow, mask);
			for (int i = 0; i < nv; i++)
				if (mask[i])
					CHECK(engine_tokenizer_is_eog(tok, i));
			CHECK(cnt >= 1);
			CHECK(engine_tokenizer_is_eog(tok, engine_sampler_sample(s, logits)));
			ended = true;
			break;
		}
	}
	CHECK_MSG(ended, "no end after %d steps", max_steps);
	/* the pieces' text, fed at once, is a complete match */
	size_t cap = 1 << 16, len = 0;
	char *text = malloc(cap);
	for (int i = 0; i < n; i++) {
		int k = engine_token_to_piece(tok, ids[i], false, text + len, cap - len);
		CHECK(k >= 0);
		if (k > 0)
			len += (size_t)k;
	}
	/* and it is valid UTF-8: the streaming detokenizer, which turns
	 * anything else into U+FFFD, gives the same bytes */
	struct engine_detok dt;
	engine_detok_init(&dt, tok);
	char *streamed = malloc(cap * 3);
	size_t sl = 0;
	for (int i = 0; i < n; i++) {
		int k = engine_detok_push(&dt, tok, ids[i], streamed + sl, cap * 3 - sl);
		CHECK(k >= 0);
		if (k > 0)
			sl += (size_t)k;
	}
	int k = engine_detok_flush(&dt, streamed + sl, cap * 3 - sl);
	sl += k > 0 ? (size_t)k : 0;
	CHECK_MSG(sl == len && memcmp(streamed, text, len) == 0, "not UTF-8: \"%.*s\"", (int)len,
	          text);
	free(streamed);
	struct grammar_state *fresh = NULL;
	CHECK_OK(grammar_state_new(g, &fresh, NULL));
	CHECK_EQ_INT(grammar_state_feed(fresh, text, len), 0);
	CHECK_MSG(grammar_state_accepting(fresh), "text \"%.*s\" incomplete", (int)len, text);
	grammar_state_free(fresh);
	free(text);
	grammar_state_free(shadow);
	free(mask);
	free(ids);
	free(logits);
	engine_sampler_free(s);
	return n;
}

static void sample_vocab(const char *file)
{
	const char *path = test_data_path(file);
	if (!test_file_exists(path)) {
		TEST_SKIP_DATA("%s not found (set EDGELM_TESTDATA)", path);
		return;
	}
	engine_tokenizer *tok = NULL;
	struct cm_err err = {0};
	int r = engine_tokenizer_load(path, &tok, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r)
		return;
	engine_grammar *g = NULL;
	r = engine_grammar_new(tok, json_gbnf, strlen(json_gbnf), &g, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r == 0) {
		run_sampling(tok, g, 1.0f, 1, 120, true);
		for (int k = 0; k < 4 / STEPS_SCALE; k++)
			run_sampling(tok, g, 0.8f, 10 + (uint64_t)k, 120, false);
		run_sampling(tok, g, 0.0f, 2, 120, false);
		/* a wrong vocabulary size is refused */
		struct engine_sampler_params sp;
		engine_sampler_params_default(&sp);
		sp.grammar = g;
		engine_sampler *s = NULL;
		CHECK_EQ_INT(engine_sampler_new(&sp, 7, &s, &err), -EINVAL);
	}
	engine_grammar_free(g);

	/* open-ended: accepting but never done, so EOS is allowed and other text too */
	const char *open = "root ::= [a-z ]+";
	r = engine_grammar_new(tok, open, strlen(open), &g, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r == 0) {
		struct grammar_state *st = NULL;
		CHECK_OK(grammar_state_new(g, &st, NULL));
		int32_t eos = engine_tokenizer_eos(tok);
		CHECK(!grammar_state_allows(st, eos));
		CHECK_EQ_INT(grammar_state_advance(st, eos), -EINVAL);
		CHECK_OK(grammar_state_feed(st, "ab", 2));
		CHECK(grammar_state_allows(st, eos));
		CHECK(!grammar_state_done(st));
		int32_t bos = engine_tokenizer_bos(tok);
		if (bos >= 0 && !engine_tokenizer_is_eog(tok, bos))
			CHECK(!grammar_state_allows(st, bos)); /* control tokens never */
		grammar_state_free(st);
	}
	engine_grammar_free(g);
	engine_tokenizer_free(tok);
}

static void test_vocab_llama_spm(void)
{
	sample_vocab("vocab/ggml-vocab-llama-spm.gguf");
}

static void test_vocab_qwen2(void)
{
	sample_vocab("vocab/ggml-vocab-qwen2.gguf");
}

/* Real logits: stories260K under a grammar, greedy and sampled. */
static void test_stories260k(void)
{
	const char *path = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(path)) {
		TEST_SKIP_DATA("%s not found (set EDGELM_TESTDATA)", path);
		return;
	}
	struct engine_params mp = {.n_threads = 1};
	engine_model *m = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(path, &mp, &m, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r)
		return;
	const engine_tokenizer *tok = engine_model_tokenizer(m);
	const char *gbnf = "root ::= \"Once\" (\" \" word){3,8} \".\"\nword ::= [a-z]{1,10}\n";
	engine_grammar *g = NULL;
	r = engine_grammar_new(tok, gbnf, strlen(gbnf), &g, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	engine_ctx *c = NULL;
	struct engine_ctx_params cp = {.n_ctx = 128, .n_seq = 1};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	for (int k = 0; k < 2 && g && c; k++) {
		struct engine_sampler_params sp;
		engine_sampler_params_default(&sp);
		sp.temp = k == 0 ? 0.0f : 0.9f;
		sp.seed = 42;
		sp.grammar = g;
		engine_sampler *s = NULL;
		CHECK_OK(engine_sampler_new(&sp, engine_tokenizer_n_vocab(tok), &s, &err));
		int32_t toks[64];
		int n = 0, pos = 0;
		toks[n++] = engine_tokenizer_bos(tok);
		bool done = false;
		for (int step = 0; step < 60 && !done; step++) {
			CHECK_OK(engine_eval(c, toks + n - 1, 1, pos++, &err));
			int32_t id = engine_sampler_sample(s, engine_get_logits_last(c));
			if (engine_tokenizer_is_eog(tok, id)) {
				done = true;
				break;
			}
			CHECK_EQ_INT(engine_sampler_advance(s, id), 0);
			engine_sampler_accept(s, id);
			toks[n++] = id;
			done = engine_sampler_grammar_done(s);
		}
		CHECK(done);
		char *text = NULL;
		CHECK_OK(engine_detokenize(tok, toks + 1, n - 1, false, &text, &err));
		/* the detokenizer drops the first piece's leading space; the
		 * grammar saw the pieces, which here have none to drop */
		CHECK_MSG(text && strncmp(text, "Once ", 5) == 0 && text[strlen(text) - 1] == '.',
		          "\"%s\"", text ? text : "");
		if (text)
			CHECK_EQ_INT(match(gbnf, text, strlen(text)), 1);
		free(text);
		engine_sampler_reset(s);
		engine_seq_truncate(c, 0, 0);
		engine_sampler_free(s);
	}
	engine_ctx_free(c);
	engine_grammar_free(g);
	engine_model_free(m);
}

int main(void)
{
	TEST_RUN(test_constructs);
	TEST_RUN(test_partial_utf8);
	TEST_RUN(test_wide_alternation);
	TEST_RUN(test_errors);
	TEST_RUN(test_vocab_llama_spm);
	TEST_RUN(test_vocab_qwen2);
	TEST_RUN(test_stories260k);
	return test_finish();
}
