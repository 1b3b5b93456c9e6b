/* tests/fuzz/fuzz_grammar.c: libFuzzer entry point for GBNF grammars
 * (engine/grammar.c).
 *
 * The input is a grammar, optionally followed by a NUL byte and text. The
 * grammar is compiled without a vocabulary and for a small synthetic SPM
 * vocabulary built once in memory (byte tokens, pieces that split UTF-8,
 * JSON punctuation, control tokens); both compiles must agree. When it
 * compiles: the text fed at once and fed a byte at a time must be refused
 * or accepted alike; then for a few steps the trie walk's allowed set must
 * equal one check per token, and a token from it must be accepted.
 * Violations trap, so libFuzzer and the replay driver both report them. */
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/grammar_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                                                 \
	do {                                                                                       \
		if (!(x))                                                                          \
			__builtin_trap();                                                          \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, BYTE = 6 };

static engine_tokenizer *tok;

static engine_tokenizer *build(void)
{
	/* clang-format off */
	static const char *const words[] = {
		"\xe2\x96\x81", "a", "b", "ab", "abc", "{", "}", "[", "]", "\"", ":", ",",
		"\xe2\x96\x81the", "true", "null", "12", "0", "-", "\n", "\\", "\xc3\xa9",
		"\xc3", "\xa9", "\xe2\x82", "\xf0\x9f\x98\x80", "{\"", "\":", "\",\"", "x\xc3",
	};
	/* clang-format on */
	enum { MAX = 3 + 256 + 64 };
	char *texts[MAX];
	float scores[MAX];
	int32_t types[MAX];
	int n = 0;
	texts[n] = strdup("<unk>"), types[n] = UNKNOWN, scores[n++] = 0;
	texts[n] = strdup("<s>"), types[n] = CONTROL, scores[n++] = 0;
	texts[n] = strdup("</s>"), types[n] = CONTROL, scores[n++] = 0;
	for (int b = 0; b < 256; b++) {
		char s[8];
		snprintf(s, sizeof(s), "<0x%02X>", b);
		texts[n] = strdup(s), types[n] = BYTE, scores[n++] = 0;
	}
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		texts[n] = strdup(words[i]), types[n] = NORMAL;
		scores[n++] = (float)strlen(words[i]);
	}
	engine_tokenizer *t = NULL;
	struct gguf_writer *w = NULL;
	uint8_t *buf = NULL;
	size_t size = 0;
	struct gguf_file *f = NULL;
	REQUIRE(gguf_writer_new(&w, NULL) == 0);
	REQUIRE(gguf_writer_set_str(w, "general.name", "fuzz-grammar") == 0);
	REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == 0);
	REQUIRE(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts,
	                                NULL, (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores,
	                            (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
	                            (uint64_t)n) == 0);
	REQUIRE(gguf_writer_write_mem(w, &buf, &size, NULL) == 0);
	REQUIRE(gguf_open_mem(buf, size, &f, NULL) == 0);
	REQUIRE(engine_tokenizer_new(f, &t, NULL) == 0);
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
	for (int i = 0; i < n; i++)
		free(texts[i]);
	return t;
}

/* Fed at once or a byte at a time: the same verdict, the same state. */
static void check_text(const engine_grammar *g, const char *text, size_t n)
{
	struct grammar_state *a = NULL, *b = NULL;
	REQUIRE(grammar_state_new(g, &a, NULL) == 0);
	REQUIRE(grammar_state_new(g, &b, NULL) == 0);
	int ra = grammar_state_feed(a, text, n);
	int rb = 0;
	for (size_t i = 0; i < n && rb == 0; i++)
		rb = grammar_state_feed(b, text + i, 1);
	REQUIRE((ra == 0) == (rb == 0));
	if (ra == 0) {
		REQUIRE(grammar_state_accepting(a) == grammar_state_accepting(b));
		REQUIRE(grammar_state_done(a) == grammar_state_done(b));
	}
	grammar_state_free(a);
	grammar_state_free(b);
}

/* The trie walk against a check per token, then a step with an allowed one. */
static void check_tokens(const engine_grammar *g, uint32_t pick)
{
	int nv = engine_tokenizer_n_vocab(tok);
	uint8_t *mask = malloc((size_t)nv);
	struct grammar_state *st = NULL;
	REQUIRE(mask && grammar_state_new(g, &st, NULL) == 0);
	for (int step = 0; step < 6; step++) {
		int cnt = grammar_state_allowed(st, mask), cnt2 = 0;
		int32_t chosen = -1;
		for (int i = 0; i < nv; i++) {
			bool ok = grammar_state_allows(st, i);
			REQUIRE(ok == (mask[i] != 0));
			if (ok && (chosen < 0 || (uint32_t)i % 7 == pick % 7))
				chosen = i;
			cnt2 += ok;
		}
		REQUIRE(cnt == cnt2);
		if (grammar_state_done(st)) {
			for (int i = 0; i < nv; i++)
				REQUIRE(!mask[i] || engine_tokenizer_is_eog(tok, i));
		}
		if (chosen < 0 || engine_tokenizer_is_eog(tok, chosen))
			break;
		REQUIRE(grammar_state_advance(st, chosen) == 0);
		pick = pick * 31 + 7;
	}
	grammar_state_free(st);
	free(mask);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!tok)
		tok = build();
	if (size > 1 << 16)
		return 0;
	const char *s = (const char *)data;
	const char *nul = memchr(s, '\0', size);
	size_t glen = nul ? (size_t)(nul - s) : size;
	const char *text = nul ? nul + 1 : "";
	size_t tlen = nul ? size - glen - 1 : 0;

	engine_grammar *g0 = NULL, *g1 = NULL;
	struct cm_err e0 = {0}, e1 = {0};
	int r0 = engine_grammar_new(NULL, s, glen, &g0, &e0);
	int r1 = engine_grammar_new(tok, s, glen, &g1, &e1);
	REQUIRE(r0 == r1);
	REQUIRE((r0 == 0) == (g0 != NULL));
	if (r0) {
		REQUIRE(e0.msg[0] != '\0' && strcmp(e0.msg, e1.msg) == 0);
		return 0;
	}
	check_text(g0, text, tlen);
	check_tokens(g1, (uint32_t)size);
	engine_grammar_free(g0);
	engine_grammar_free(g1);
	return 0;
}
