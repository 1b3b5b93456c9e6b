/* tests/fuzz/fuzz_tokenizer.c: libFuzzer entry point for the tokenizer.
 *
 * Four tokenizers are built once from a small synthetic SPM vocabulary
 * made in memory (byte tokens <0x00>..<0xFF>, words and merges, control
 * tokens <s> </s> <|im_start|> <|im_end|>, user-defined tags with shared
 * prefixes): with and without add_space_prefix, and with and without the
 * Phi-3 RSTRIP rule. The first input byte picks one; the rest is the text.
 *
 * For parse_special true and false: the -ENOBUFS protocol must report the
 * same count as a successful call, every id must be in range, the whole
 * detokenization must be valid UTF-8 and equal the streamed one, and every
 * streamed chunk must end on a character boundary. For the plain variant
 * (no prefix, no RSTRIP) tokenize -> detokenize must give the text back
 * whenever that is possible (valid UTF-8 without NUL or U+2581).
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

enum { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER = 4, BYTE = 6 };

static engine_tokenizer *toks[4];

static engine_tokenizer *build(bool space_prefix, bool phi3)
{
	/* clang-format off */
	static const char *const words[] = {
		"\xe2\x96\x81", "a", "b", "c", "e", "h", "i", "n", "o", "r", "s", "t", "th", "he",
		"in", "er", "an", "the", "\xe2\x96\x81t", "\xe2\x96\x81th", "\xe2\x96\x81the",
		"\xe2\x96\x81\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81",
		"\xe2\x96\x81" "a", "\xe2\x96\x81" "an", "\xe2\x96\x81in", "ing", "\xc3\xa9",
		"\xe6\x97\xa5", "\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac", "\xd0\xbf",
		"\xd0\xbf\xd1\x80", "\n", "\n\n", "\xf0\x9f\x98\x80", "<", ">", "|",
	};
	static const char *const specials[][2] = {
		{"<|im_start|>", "3"}, {"<|im_end|>", "3"}, {"<|user|>", "4"}, {"<|im", "4"},
		{"<tool>", "4"}, {"\n\n\n", "4"}, {"<|end|>", "4"},
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
		/* longer words score higher, with a twist so ties also occur */
		texts[n] = strdup(words[i]), types[n] = NORMAL;
		scores[n++] = (float)strlen(words[i]) * 0.5f - (float)(i % 3);
	}
	for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++) {
		texts[n] = strdup(specials[i][0]), types[n] = specials[i][1][0] - '0';
		scores[n++] = 0;
	}

	engine_tokenizer *t = NULL;
	struct gguf_writer *w = NULL;
	uint8_t *buf = NULL;
	size_t size = 0;
	struct gguf_file *f = NULL;
	REQUIRE(gguf_writer_new(&w, NULL) == 0);
	REQUIRE(gguf_writer_set_str(w, "general.name", phi3 ? "fuzz-phi3" : "fuzz") == 0);
	REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == 0);
	REQUIRE(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts,
	                                NULL, (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores,
	                            (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
	                            (uint64_t)n) == 0);
	REQUIRE(gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix) == 0);
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

/* Detokenize both ways; return the whole text (malloc'ed). */
static char *detok_both(const engine_tokenizer *t, bool space_prefix, const int32_t *ids, int n,
                        bool special)
{
	char *whole = NULL;
	REQUIRE(engine_detokenize(t, ids, n, special, &whole, NULL) == 0);
	size_t wl = strlen(whole);
	REQUIRE(valid_utf8((const uint8_t *)whole, wl));
	if (special)
		return whole; /* the stream renders no control tokens */

	struct engine_detok d;
	engine_detok_init(&d, t);
	d.first = space_prefix; /* as engine_detokenize does for a whole sequence */
	size_t cap = 64 * (size_t)n + 16, used = 0;
	char *stream = malloc(cap);
	REQUIRE(stream);
	for (int i = 0; i < n; i++) {
		int k = engine_detok_push(&d, t, ids[i], stream + used, cap - used);
		REQUIRE(k >= 0);
		REQUIRE(valid_utf8((const uint8_t *)stream + used, (size_t)k));
		used += (size_t)k;
	}
	int k = engine_detok_flush(&d, stream + used, cap - used);
	REQUIRE(k >= 0 && k <= 9);
	used += (size_t)k;
	REQUIRE(valid_utf8((const uint8_t *)stream, used));
	/* The same bytes; a byte token <0x00> ends the C string early. */
	REQUIRE(used >= wl && memcmp(stream, whole, wl) == 0);
	REQUIRE(used == wl || stream[wl] == '\0');
	free(stream);
	return whole;
}

static bool roundtrip_possible(const uint8_t *s, size_t n)
{
	if (!valid_utf8(s, n) || memchr(s, 0, n))
		return false;
	for (size_t i = 0; i + 2 < n; i++) {
		if (s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81)
			return false;
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!toks[0]) {
		for (int v = 0; v < 4; v++)
			toks[v] = build(v & 1, v & 2);
	}
	if (size == 0)
		return 0;
	int variant = data[0] & 3;
	const engine_tokenizer *t = toks[variant];
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	const int nv = engine_tokenizer_n_vocab(t);

	for (int ps = 0; ps < 2; ps++) {
		int n = -1;
		int r = engine_tokenize(t, text, len, ps, ps, NULL, 0, &n, NULL);
		REQUIRE(r == -ENOBUFS || (r == 0 && n == 0));
		REQUIRE(n >= 0 && (size_t)n <= 4 * len + 2);
		int32_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
		REQUIRE(ids);
		int n2 = -1;
		if (n > 0) {
			REQUIRE(engine_tokenize(t, text, len, ps, ps, ids, n - 1, &n2, NULL) ==
			        -ENOBUFS);
			REQUIRE(n2 == n);
		}
		REQUIRE(engine_tokenize(t, text, len, ps, ps, ids, n, &n2, NULL) == 0);
		REQUIRE(n2 == n);
		for (int i = 0; i < n; i++)
			REQUIRE(ids[i] >= 0 && ids[i] < nv);

		/* without add_special, no BOS; the plain variant round-trips */
		if (ps)
			REQUIRE(n >= 1 && ids[0] == engine_tokenizer_bos(t));
		const int32_t *body = ids + ps;
		int nb = n - ps;
		char *whole = detok_both(t, variant & 1, body, nb, false);
		if (variant == 0 && !ps && roundtrip_possible((const uint8_t *)text, len))
			REQUIRE(strlen(whole) == len && memcmp(whole, text, len) == 0);
		free(whole);
		whole = detok_both(t, variant & 1, body, nb, true);
		if (variant == 0 && ps && roundtrip_possible((const uint8_t *)text, len))
			REQUIRE(strlen(whole) == len && memcmp(whole, text, len) == 0);
		free(whole);
		free(ids);
	}
	return 0;
}
