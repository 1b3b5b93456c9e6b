/* engine/tokenizer_vocab.c: the vocabulary (docs/gguf-formats.md §5.1):
 * token texts copied into one arena (the GGUF may be closed after
 * engine_tokenizer_new), a text -> id hash map with open addressing,
 * scores and attributes. The bottom of the tokenizer: every other
 * tokenizer_*.c file uses it, and it calls none of them. */
#include "engine/tokenizer_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *engine_tok_esc_text(char buf[64], const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		if (o + 8 > 64) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
			buf[o++] = (char)c;
		} else {
			buf[o++] = '\\';
			buf[o++] = 'x';
			buf[o++] = hex[c >> 4];
			buf[o++] = hex[c & 15];
		}
	}
	buf[o] = '\0';
	return buf;
}

static uint32_t hash_text(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 0x100000001b3ull;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return (uint32_t)h;
}

int32_t engine_tok_lookup(const engine_tokenizer *t, const char *s, size_t n)
{
	uint32_t h = hash_text(s, n);
	for (size_t i = h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
		const struct tok_slot *sl = &t->slots[i];
		if (sl->id < 0)
			return -1;
		if (sl->hash == h && t->len[sl->id] == n && memcmp(tok_text(t, sl->id), s, n) == 0)
			return sl->id;
	}
}

void *engine_tok_grow(void *p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return p;
	size_t nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	void *q = cm_realloc(p, nc * elem);
	if (q)
		*cap = nc;
	return q;
}

/* ---- loading ---------------------------------------------------------------- */

static uint32_t attr_from_type(int32_t type)
{
	switch (type) {
	case 1:
		return ENGINE_TOKEN_NORMAL;
	case 2:
		return ENGINE_TOKEN_UNKNOWN;
	case 3:
		return ENGINE_TOKEN_CONTROL;
	case 4:
		return ENGINE_TOKEN_USER_DEFINED;
	case 5:
		return ENGINE_TOKEN_UNUSED;
	case 6:
		return ENGINE_TOKEN_BYTE;
	default:
		return 0; /* UNDEFINED and unknown types: no attribute */
	}
}

/* A numeric per-token array: absent is fine (*ret_data = NULL), otherwise
 * it must have the given element type and n_vocab elements. */
static int get_vocab_arr(const struct gguf_file *f, const char *key, enum gguf_vtype type,
                         int32_t n_vocab, const void **ret_data, struct cm_err *err)
{
	uint64_t n = 0;
	*ret_data = NULL;
	int r = gguf_get_arr(f, key, type, ret_data, &n, err);
	if (r == -ENOENT) {
		*ret_data = NULL;
		return 0;
	}
	if (r)
		return cm_err_prefix(err, "tokenizer");
	if (n != (uint64_t)n_vocab)
		return cm_err_set(err, -EPROTO,
		                  "tokenizer: %s has %llu elements, expected n_vocab %d", key,
		                  (unsigned long long)n, (int)n_vocab);
	return 0;
}

static int insert_text(engine_tokenizer *t, int32_t id, struct cm_err *err)
{
	const char *s = tok_text(t, id);
	size_t n = t->len[id];
	uint32_t h = hash_text(s, n);
	for (size_t i = h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
		struct tok_slot *sl = &t->slots[i];
		if (sl->id < 0) {
			sl->hash = h;
			sl->id = id;
			return 0;
		}
		if (sl->hash == h && t->len[sl->id] == n &&
		    memcmp(tok_text(t, sl->id), s, n) == 0) {
			char b[64];
			return cm_err_set(err, -EPROTO,
			                  "tokenizer: duplicate token text '%s' (ids %d and %d)",
			                  engine_tok_esc_text(b, s, n), (int)sl->id, (int)id);
		}
	}
}

int engine_tok_vocab_load(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err)
{
	static const char key[] = "tokenizer.ggml.tokens";
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return cm_err_set(err, -EPROTO, "tokenizer: missing %s", key);
	if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING)
		return cm_err_set(err, -EPROTO, "tokenizer: %s is %s, expected an array of strings",
		                  key, gguf_vtype_name(kv->type));
	if (kv->arr_n == 0 || kv->arr_n > INT32_MAX)
		return cm_err_set(err, -EPROTO, "tokenizer: n_vocab %llu out of range (1 .. %d)",
		                  (unsigned long long)kv->arr_n, INT32_MAX);
	const int32_t n = (int32_t)kv->arr_n;
	t->n_vocab = n;

	const void *scores, *types;
	int r = get_vocab_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, n, &scores, err);
	if (r)
		return r;
	r = get_vocab_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, n, &types, err);
	if (r)
		return r;

	struct gguf_str *strs = NULL;
	uint64_t ns = 0;
	r = gguf_arr_strings(f, key, &strs, &ns, err);
	if (r)
		return cm_err_prefix(err, "tokenizer");

	/* Arena size: every text plus its NUL; empty texts become
	 * "[EMPTY_<id>]" (at most 19 bytes). */
	uint64_t total = 0;
	for (int32_t i = 0; i < n; i++)
		total += (strs[i].len ? strs[i].len : 20) + 1;
	if (total > UINT32_MAX) {
		cm_free(strs);
		return cm_err_set(err, -EPROTO,
		                  "tokenizer: token texts total %llu bytes (limit 4 GiB)",
		                  (unsigned long long)total);
	}
	size_t slots = 16;
	while (slots < (size_t)n * 2)
		slots *= 2;
	t->arena = cm_malloc((size_t)total);
	t->off = cm_malloc((size_t)n * sizeof(*t->off));
	t->len = cm_malloc((size_t)n * sizeof(*t->len));
	t->score = cm_malloc((size_t)n * sizeof(*t->score));
	t->attr = cm_malloc((size_t)n * sizeof(*t->attr));
	t->flags = cm_calloc((size_t)n, sizeof(*t->flags));
	t->slots = cm_malloc(slots * sizeof(*t->slots));
	if (!t->arena || !t->off || !t->len || !t->score || !t->attr || !t->flags || !t->slots) {
		cm_free(strs);
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory for %d tokens", (int)n);
	}
	t->slot_mask = slots - 1;
	for (size_t i = 0; i < slots; i++)
		t->slots[i].id = -1;

	uint32_t o = 0;
	for (int32_t i = 0; i < n; i++) {
		t->off[i] = o;
		if (strs[i].len) {
			memcpy(t->arena + o, strs[i].ptr, strs[i].len);
			t->len[i] = (uint32_t)strs[i].len;
		} else {
			t->len[i] = (uint32_t)snprintf(t->arena + o, 20, "[EMPTY_%d]", (int)i);
		}
		o += t->len[i];
		t->arena[o++] = '\0';

		float sc = 0.0f;
		if (scores)
			memcpy(&sc, (const char *)scores + (size_t)i * 4, 4);
		t->score[i] = isnan(sc) ? -INFINITY : sc; /* keeps the merge order total */
		int32_t ty = 1;
		if (types)
			memcpy(&ty, (const char *)types + (size_t)i * 4, 4);
		t->attr[i] = attr_from_type(ty);
	}
	cm_free(strs);

	for (int32_t i = 0; i < n; i++) {
		r = insert_text(t, i, err);
		if (r)
			return r;
	}
	return 0;
}
