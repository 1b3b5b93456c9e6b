/* tests/fuzz/fuzz_tokenizer_bpe.c: libFuzzer entry point for the byte-level
 * BPE tokenizer.
 *
 * Three tokenizers are built once from a small synthetic byte-level BPE
 * vocabulary made in memory with the GGUF writer (the 256 byte characters
 * of GPT-2's map, a few merges, control tokens <|im_start|> <|im_end|>
 * <|endoftext|> and a user-defined tag), with the pre-tokenizers gpt-2,
 * llama-bpe (ignore_merges) and deepseek-llm (six regexes). The first
 * input byte picks one; the rest is the text.
 *
 * For parse_special true and false: the -ENOBUFS protocol reports the same
 * count as a successful call, every id is in range, streaming
 * detokenization equals the concatenated pieces and is valid UTF-8, and
 * without special tokens in play the pieces give back the text with
 * invalid UTF-8 replaced by U+FFFD (byte-level BPE is lossless).
 * Violations trap, so libFuzzer and the replay driver both report them. */
#include "engine/engine.h"
#include "engine/gguf.h"

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

static engine_tokenizer *toks[3];

/* GPT-2's byte -> code point map, written as UTF-8. */
static void byte_char(int b, char out[3])
{
	int cp = b;
	if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)) {
		int k = 0;
		for (int c = 0; c < b; c++)
			k += !((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae);
		cp = 0x100 + k;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

static engine_tokenizer *build(const char *pre)
{
	/* merges as pairs of plain text; their encoded forms are computed */
	static const char *const merges[][2] = {
	    {" ", "t"},       {"t", "h"},   {" t", "h"}, {"th", "e"},  {" th", "e"}, {"i", "n"},
	    {" ", " "},       {"  ", "  "}, {"e", "r"},  {"\n", "\n"}, {"1", "2"},   {"12", "3"},
	    {"\xc3", "\xa9"}, {"<", "|"},   {"a", "a"},  {"aa", "aa"},
	};
	static const char *const specials[][2] = {
	    {"<|im_start|>", "3"},
	    {"<|im_end|>", "3"},
	    {"<|endoftext|>", "3"},
	    {"<tool>", "4"},
	};
	enum { MAX = 256 + 32 };
	char *texts[MAX];
	int32_t types[MAX];
	char *mtexts[32];
	int n = 0, nm = 0;
	for (int b = 0; b < 256; b++) {
		char c[3];
		byte_char(b, c);
		texts[n] = strdup(c);
		types[n++] = 1;
	}
	for (size_t i = 0; i < sizeof(merges) / sizeof(merges[0]); i++) {
		char l[64] = "", r[64] = "", c[3];
		for (const char *p = merges[i][0]; *p; p++)
			byte_char((uint8_t)*p, c), strcat(l, c);
		for (const char *p = merges[i][1]; *p; p++)
			byte_char((uint8_t)*p, c), strcat(r, c);
		char *m = malloc(strlen(l) + strlen(r) + 2);
		sprintf(m, "%s %s", l, r);
		mtexts[nm++] = m;
		char *tk = malloc(strlen(l) + strlen(r) + 1);
		sprintf(tk, "%s%s", l, r);
		texts[n] = tk;
		types[n++] = 1;
	}
	for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++) {
		texts[n] = strdup(specials[i][0]);
		types[n++] = specials[i][1][0] - '0';
	}

	engine_tokenizer *t = NULL;
	struct gguf_writer *w = NULL;
	uint8_t *buf = NULL;
	size_t size = 0;
	struct gguf_file *f = NULL;
	REQUIRE(gguf_writer_new(&w, NULL) == 0);
	REQUIRE(gguf_writer_set_str(w, "general.name", "fuzz-bpe") == 0);
	REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == 0);
	REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre) == 0);
	REQUIRE(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts,
	                                NULL, (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
	                            (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mtexts,
	                                NULL, (uint64_t)nm) == 0);
	REQUIRE(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)n - 2) == 0);
	REQUIRE(gguf_writer_write_mem(w, &buf, &size, NULL) == 0);
	REQUIRE(gguf_open_mem(buf, size, &f, NULL) == 0);
	REQUIRE(engine_tokenizer_new(f, &t, NULL) == 0);
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
	for (int i = 0; i < n; i++)
		free(texts[i]);
	for (int i = 0; i < nm; i++)
		free(mtexts[i]);
	return t;
}

static bool valid_utf8(const uint8_t *u, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = u[i];
		size_t k;
		uint32_t cp;
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			k = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			k = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			k = 3, cp = c & 0x07;
		else
			return false;
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

static size_t seq_len(uint8_t c)
{
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return 2;
	if (c >= 0xe0 && c <= 0xef)
		return 3;
	if (c >= 0xf0 && c <= 0xf4)
		return 4;
	return 0;
}

/* The text with every byte outside a valid sequence as U+FFFD. */
static size_t sanitized(const uint8_t *s, size_t n, uint8_t *out)
{
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		size_t k = seq_len(s[i]);
		if (k > 1 && (i + k > n || !valid_utf8(s + i, k)))
			k = 0;
		if (k) {
			memcpy(out + o, s + i, k);
			o += k;
			i += k;
		} else {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!toks[0]) {
		toks[0] = build("gpt-2");
		toks[1] = build("llama-bpe");
		toks[2] = build("deepseek-llm");
	}
	if (size == 0)
		return 0;
	const engine_tokenizer *t = toks[data[0] % 3];
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	const int nv = engine_tokenizer_n_vocab(t);

	for (int ps = 0; ps < 2; ps++) {
		int n = -1;
		int r = engine_tokenize(t, text, len, ps, ps, NULL, 0, &n, NULL);
		REQUIRE(r == -ENOBUFS || (r == 0 && n == 0));
		REQUIRE(n >= 0 && (size_t)n <= 3 * len + 2);
		int32_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
		REQUIRE(ids);
		int n2 = -1;
		REQUIRE(engine_tokenize(t, text, len, ps, ps, ids, n, &n2, NULL) == 0);
		REQUIRE(n2 == n);
		for (int i = 0; i < n; i++)
			REQUIRE(ids[i] >= 0 && ids[i] < nv);

		/* pieces, and the stream */
		size_t cap = 3 * len + 64, pl = 0, sl = 0;
		uint8_t *pc = malloc(cap), *st = malloc(cap);
		REQUIRE(pc && st);
		struct engine_detok d;
		engine_detok_init(&d, t);
		for (int i = 0; i < n; i++) {
			int k = engine_token_to_piece(t, ids[i], false, (char *)pc + pl, cap - pl);
			REQUIRE(k >= 0);
			pl += (size_t)k;
			k = engine_detok_push(&d, t, ids[i], (char *)st + sl, cap - sl);
			REQUIRE(k >= 0);
			REQUIRE(valid_utf8(st + sl, (size_t)k));
			sl += (size_t)k;
		}
		int k = engine_detok_flush(&d, (char *)st + sl, cap - sl);
		REQUIRE(k >= 0);
		sl += (size_t)k;
		/* pieces of sanitized text are valid UTF-8, so the stream
		 * passes them through unchanged */
		REQUIRE(valid_utf8(pc, pl));
		REQUIRE(sl == pl && memcmp(st, pc, pl) == 0);
		if (!ps) {
			/* no control token matched: lossless up to U+FFFD, unless
			 * the user-defined tag (verbatim anyway) is involved */
			uint8_t *want = malloc(3 * len + 1);
			REQUIRE(want);
			size_t wl = sanitized((const uint8_t *)text, len, want);
			REQUIRE(wl == pl && memcmp(want, pc, pl) == 0);
			free(want);
		}
		char *whole = NULL;
		REQUIRE(engine_detokenize(t, ids, n, ps, &whole, NULL) == 0);
		REQUIRE(valid_utf8((const uint8_t *)whole, strlen(whole)));
		free(whole);
		free(pc);
		free(st);
		free(ids);
	}
	return 0;
}
