/* engine/tokenizer.c: the tokenizer (docs/gguf-formats.md §5).
 *
 * Layout of this file:
 *   - vocabulary: token texts copied into one arena (the GGUF may be closed
 *     after engine_tokenizer_new), a text -> id hash map with open
 *     addressing, scores, attributes, special ids and flags;
 *   - the special-token partition (§5.3), shared by every model;
 *   - the SPM ("llama") model: escaping, score-ordered merging (§5.4), byte
 *     fallback and the piece rules of §5.6. Functions specific to SPM are
 *     prefixed spm_; a BPE ("gpt2") model will get its own file with the
 *     same hooks (raw fragment -> ids, id -> piece) and a case in the
 *     model switches below;
 *   - detokenization: token pieces, and a streaming UTF-8 sanitizer that
 *     never emits part of a character.
 *
 * Bounds: tokenize is O(n log n) in the text length for SPM (a binary heap
 * of merge candidates, with stale entries skipped on pop). The special-token
 * partition indexes the text's byte pairs once and then visits, for each
 * candidate token, only positions where its first two bytes occur, so a text
 * made of 100k special-looking tags costs O(tags * candidates sharing a
 * prefix), not a scan of every fragment by every candidate. */
#include "engine/tokenizer_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest text engine_tokenize() accepts, so that the id count (at most
 * three per byte plus BOS/EOS) always fits an int. */
#define TOK_MAX_TEXT ((size_t)1 << 28)

/* ---- helpers ---------------------------------------------------------------- */

/* A printable rendering of s[0..n) for messages: at most ~40 bytes, other
 * bytes as \xNN. */
static const char *esc_text(char buf[64], const char *s, size_t n)
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

/* Grow an array to hold `need` elements; NULL (and p untouched) on failure. */
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

static bool contains_ci(const char *s, size_t n, const char *needle)
{
	size_t k = strlen(needle);
	for (size_t i = 0; i + k <= n; i++) {
		size_t j = 0;
		while (j < k) {
			char c = s[i + j];
			if (c >= 'A' && c <= 'Z')
				c = (char)(c - 'A' + 'a');
			if (c != needle[j])
				break;
			j++;
		}
		if (j == k)
			return true;
	}
	return false;
}

/* ---- building ----------------------------------------------------------------- */

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
			                  esc_text(b, s, n), (int)sl->id, (int)id);
		}
	}
}

/* Token texts, scores and types, and the text -> id map. */
static int load_vocab(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err)
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

/* A special id: absent keeps the default; negative or >= n_vocab is
 * ignored (llama.cpp warns and keeps the default). */
static int get_id(const struct gguf_file *f, const char *key, int32_t n_vocab, int32_t *id,
                  struct cm_err *err)
{
	int64_t v;
	int r = gguf_get_i64(f, key, &v, err);
	if (r == -ENOENT)
		return 0;
	if (r)
		return cm_err_prefix(err, "tokenizer");
	if (v >= 0 && v < n_vocab)
		*id = (int32_t)v;
	return 0;
}

static int get_flag(const struct gguf_file *f, const char *key, bool *b, struct cm_err *err)
{
	int r = gguf_get_bool(f, key, b, err);
	if (r == -ENOENT)
		return 0;
	return r ? cm_err_prefix(err, "tokenizer") : 0;
}

static int load_specials(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err)
{
	int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
	const struct {
		const char *key;
		int32_t *id;
	} ids[] = {
	    {"tokenizer.ggml.bos_token_id", &t->bos},
	    {"tokenizer.ggml.eos_token_id", &t->eos},
	    {"tokenizer.ggml.unknown_token_id", &t->unk},
	    {"tokenizer.ggml.eot_token_id", &t->eot},
	    {"tokenizer.ggml.eom_token_id", &t->eom},
	    {"tokenizer.ggml.fim_pad_token_id", &fim_pad},
	    {"tokenizer.ggml.fim_rep_token_id", &fim_rep},
	    {"tokenizer.ggml.fim_sep_token_id", &fim_sep},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(ids); i++) {
		/* defaults (§5.2) that do not fit the vocabulary are dropped */
		if (*ids[i].id >= t->n_vocab)
			*ids[i].id = -1;
		int r = get_id(f, ids[i].key, t->n_vocab, ids[i].id, err);
		if (r)
			return r;
	}
	int r = get_flag(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
	if (!r)
		r = get_flag(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
	if (!r)
		r = get_flag(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
	if (r)
		return r;

	/* No eot id: the first end-of-turn text found becomes eot (§5.2). */
	static const char *const eot_texts[] = {
	    "<|eot_id|>",
	    "<|im_end|>",
	    "<|end|>",
	    "<end_of_turn>",
	    "<|endoftext|>",
	    "<EOT>",
	    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>", /* DeepSeek */
	};
	for (size_t i = 0; t->eot < 0 && i < CM_ARRAY_LEN(eot_texts); i++) {
		int32_t id = engine_tok_lookup(t, eot_texts[i], strlen(eot_texts[i]));
		if (id >= 0) {
			t->eot = id;
			t->attr[id] = ENGINE_TOKEN_CONTROL;
		}
	}
	if (t->eom < 0) {
		int32_t id = engine_tok_lookup(t, "<|eom_id|>", 10);
		if (id >= 0) {
			t->eom = id;
			t->attr[id] = ENGINE_TOKEN_CONTROL;
		}
	}

	/* End of generation: the ids, plus these texts (forced to CONTROL). */
	static const char *const eog_texts[] = {
	    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
	    "<|endoftext|>", "<|eom_id|>", "<EOT>",
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(eog_texts); i++) {
		int32_t id = engine_tok_lookup(t, eog_texts[i], strlen(eog_texts[i]));
		if (id >= 0) {
			t->flags[id] |= TOK_F_EOG;
			t->attr[id] = ENGINE_TOKEN_CONTROL;
		}
	}
	const int32_t eog_ids[] = {t->eos, t->eot, t->eom, fim_pad, fim_rep, fim_sep};
	for (size_t i = 0; i < CM_ARRAY_LEN(eog_ids); i++) {
		if (eog_ids[i] >= 0)
			t->flags[eog_ids[i]] |= TOK_F_EOG;
	}
	return 0;
}

struct len_id {
	uint32_t len;
	int32_t id;
};

static int cmp_len_id(const void *a, const void *b)
{
	const struct len_id *x = a, *y = b;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* The candidates of the special-token partition, longest first (ties by
 * id, so the order is deterministic), and llama.cpp's per-model strip
 * attributes. */
static int build_special_cache(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err)
{
	const uint32_t want =
	    ENGINE_TOKEN_CONTROL | ENGINE_TOKEN_USER_DEFINED | ENGINE_TOKEN_UNKNOWN;
	int32_t n = 0;
	for (int32_t i = 0; i < t->n_vocab; i++)
		n += (t->attr[i] & want) != 0;
	t->n_special = n;
	if (n == 0)
		return 0;
	struct len_id *v = cm_malloc((size_t)n * sizeof(*v));
	t->special = cm_malloc((size_t)n * sizeof(*t->special));
	if (!v || !t->special) {
		cm_free(v);
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
	}
	n = 0;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		if (t->attr[i] & want)
			v[n++] = (struct len_id){t->len[i], i};
	}
	qsort(v, (size_t)n, sizeof(*v), cmp_len_id);
	for (int32_t i = 0; i < n; i++)
		t->special[i] = v[i].id;
	cm_free(v);

	/* Phi-3 (by general.name): RSTRIP on every special token and </s>,
	 * except <unk>, <s> and <|endoftext|> (§5.3). */
	struct gguf_str name;
	if (gguf_get_str(f, "general.name", &name, NULL) == 0 &&
	    (contains_ci(name.ptr, name.len, "phi-3") || contains_ci(name.ptr, name.len, "phi3"))) {
		for (int32_t i = 0; i < n; i++)
			t->flags[t->special[i]] |= TOK_F_RSTRIP;
		int32_t id = engine_tok_lookup(t, "</s>", 4);
		if (id >= 0)
			t->flags[id] |= TOK_F_RSTRIP;
		static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
		for (size_t i = 0; i < CM_ARRAY_LEN(keep); i++) {
			id = engine_tok_lookup(t, keep[i], strlen(keep[i]));
			if (id >= 0)
				t->flags[id] &= (uint8_t)~TOK_F_RSTRIP;
		}
	}
	return 0;
}

/* ---- SPM model: setup ---------------------------------------------------------- */

static void spm_defaults(engine_tokenizer *t)
{
	t->bos = 1;
	t->eos = 2;
	t->unk = 0;
	t->add_bos = true;
	t->add_eos = false;
	t->add_space_prefix = true;
}

/* Byte fallback: "<0xHH>" (uppercase), else the one-byte token, else unk. */
static void spm_build_bytes(engine_tokenizer *t)
{
	static const char hex[] = "0123456789ABCDEF";
	for (int b = 0; b < 256; b++) {
		char s[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
		char c = (char)b;
		int32_t id = engine_tok_lookup(t, s, 6);
		if (id < 0)
			id = engine_tok_lookup(t, &c, 1);
		if (id < 0)
			id = t->unk;
		t->byte_tok[b] = id;
	}
}

/* Can SPM merge word by word? A word starts at a U+2581 whose left
 * neighbour does not end in one. A merge across that boundary would make a
 * token with a U+2581 preceded by something else; if the vocabulary has no
 * such token, no merge ever crosses a word boundary, and merging each word
 * alone gives the same tokens as merging the whole text (merges in
 * different words never compete). Real SPM vocabularies qualify
 * ("\xe2\x96\x81\xe2\x96\x81" runs of spaces are fine). */
static void spm_check_words(engine_tokenizer *t)
{
	t->spm_words = true;
	for (int32_t id = 0; id < t->n_vocab && t->spm_words; id++) {
		const char *s = tok_text(t, id);
		size_t n = t->len[id];
		for (size_t o = 1; o + 3 <= n; o++) {
			if (memcmp(s + o, "\xe2\x96\x81", 3) != 0)
				continue;
			if (o < 3 || memcmp(s + o - 3, "\xe2\x96\x81", 3) != 0) {
				t->spm_words = false;
				break;
			}
		}
	}
}

/* ---- construction ------------------------------------------------------------------ */

void engine_tokenizer_free(engine_tokenizer *t)
{
	if (!t)
		return;
	cm_free(t->arena);
	cm_free(t->off);
	cm_free(t->len);
	cm_free(t->score);
	cm_free(t->attr);
	cm_free(t->flags);
	cm_free(t->slots);
	cm_free(t->special);
	engine_bpe_free(t->bpe);
	cm_free(t);
}

int engine_tokenizer_new(const struct gguf_file *f, engine_tokenizer **ret_tok, struct cm_err *err)
{
	*ret_tok = NULL;
	struct gguf_str model;
	int r = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
	if (r == -ENOENT)
		return cm_err_set(err, -EPROTO, "tokenizer: missing tokenizer.ggml.model");
	if (r)
		return cm_err_prefix(err, "tokenizer");
	enum tok_model kind;
	if (gguf_str_eq(model, "llama")) {
		kind = TOK_MODEL_SPM;
	} else if (gguf_str_eq(model, "gpt2")) {
		kind = TOK_MODEL_BPE;
	} else {
		char b[64];
		return cm_err_set(err, -ENOTSUP,
		                  "tokenizer model '%s' is not supported (supported: llama, gpt2)",
		                  esc_text(b, model.ptr, model.len));
	}

	engine_tokenizer *t = cm_calloc(1, sizeof(*t));
	if (!t)
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
	t->model = kind;
	t->eot = t->eom = -1;
	if (kind == TOK_MODEL_SPM)
		spm_defaults(t);
	else
		engine_bpe_defaults(t, f);
	r = load_vocab(t, f, err);
	if (!r)
		r = load_specials(t, f, err);
	if (!r)
		r = build_special_cache(t, f, err);
	if (!r && kind == TOK_MODEL_BPE)
		r = engine_bpe_build(t, f, err);
	if (r) {
		engine_tokenizer_free(t);
		return r;
	}
	if (kind == TOK_MODEL_SPM) {
		spm_build_bytes(t);
		spm_check_words(t);
	}
	*ret_tok = t;
	return 0;
}

int engine_tokenizer_load(const char *path, engine_tokenizer **ret_tok, struct cm_err *err)
{
	*ret_tok = NULL;
	struct gguf_file *f = NULL;
	int r = gguf_open(path, &f, err);
	if (r)
		return r;
	r = engine_tokenizer_new(f, ret_tok, err);
	gguf_close(f);
	if (r)
		cm_err_prefix(err, "%s", path);
	return r;
}

/* ---- accessors ------------------------------------------------------------------- */

int engine_tokenizer_n_vocab(const engine_tokenizer *t)
{
	return t->n_vocab;
}

int32_t engine_tokenizer_bos(const engine_tokenizer *t)
{
	return t->bos;
}

int32_t engine_tokenizer_eos(const engine_tokenizer *t)
{
	return t->eos;
}

bool engine_tokenizer_add_bos(const engine_tokenizer *t)
{
	return t->add_bos && t->bos >= 0;
}

bool engine_tokenizer_is_eog(const engine_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_F_EOG);
}

uint32_t engine_tokenizer_attr(const engine_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab ? t->attr[id] : 0;
}

const char *engine_tokenizer_text(const engine_tokenizer *t, int32_t id, size_t *ret_len)
{
	if (id < 0 || id >= t->n_vocab) {
		if (ret_len)
			*ret_len = 0;
		return NULL;
	}
	if (ret_len)
		*ret_len = t->len[id];
	return tok_text(t, id);
}

int32_t engine_tokenizer_find(const engine_tokenizer *t, const char *text, size_t len)
{
	if (!text && len)
		return -1;
	return engine_tok_lookup(t, text ? text : "", len);
}

/* ---- tokenize: shared state ----------------------------------------------------- */

struct spm_sym {
	int32_t off, n; /* bytes of the escaped text; n == 0: merged away */
	int32_t prev, next;
};

struct spm_pair {
	float score;  /* of the token the merge would make */
	int32_t left; /* left symbol */
	int32_t size; /* combined byte length when pushed (stale check) */
};

static void run_fini(struct tok_run *r)
{
	cm_free(r->esc);
	cm_free(r->sym);
	cm_free(r->heap);
	engine_bpe_scratch_free(r->bs);
}

/* ---- SPM model: tokenize ---------------------------------------------------------- */

/* UTF-8 length from the lead byte only (§5.4): 0xC0-0xDF 2, 0xE0-0xEF 3,
 * 0xF0-0xFF 4, everything else (continuation bytes included) 1. */
static inline int32_t spm_char_len(uint8_t c)
{
	static const uint8_t lk[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
	return lk[c >> 4];
}

static inline bool spm_pair_better(const struct spm_pair *a, const struct spm_pair *b)
{
	return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int spm_push(struct tok_run *r, struct spm_pair p)
{
	if (r->heap_n == r->heap_cap) {
		void *q = engine_tok_grow(r->heap, &r->heap_cap, r->heap_n + 1, sizeof(*r->heap));
		if (!q)
			return cm_err_set(r->err, -ENOMEM, "tokenizer: out of memory");
		r->heap = q;
	}
	struct spm_pair *h = r->heap;
	size_t i = r->heap_n++;
	while (i > 0) {
		size_t parent = (i - 1) / 4;
		if (!spm_pair_better(&p, &h[parent]))
			break;
		h[i] = h[parent];
		i = parent;
	}
	h[i] = p;
	return 0;
}

/* The queue is a 4-ary heap: half the levels of a binary one, and the
 * four children of a node share a cache line or two, which matters when a
 * megabyte of text puts a million candidates in it. */
static struct spm_pair spm_pop(struct tok_run *r)
{
	struct spm_pair *h = r->heap;
	struct spm_pair top = h[0], last = h[--r->heap_n];
	size_t n = r->heap_n, i = 0;
	for (;;) {
		size_t c = 4 * i + 1;
		if (c >= n)
			break;
		size_t end = c + 4 < n ? c + 4 : n;
		for (size_t k = c + 1; k < end; k++) {
			if (spm_pair_better(&h[k], &h[c]))
				c = k;
		}
		if (!spm_pair_better(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (n)
		h[i] = last;
	return top;
}

/* Queue the merge of symbols l and l's right neighbour rr if the result is
 * a token. */
static int spm_try_pair(struct tok_run *r, int32_t l, int32_t rr)
{
	if (l < 0 || rr < 0)
		return 0;
	const struct spm_sym *a = &r->sym[l], *b = &r->sym[rr];
	int32_t size = a->n + b->n;
	int32_t id = engine_tok_lookup(r->t, r->esc + a->off, (size_t)size);
	if (id < 0)
		return 0;
	return spm_push(r, (struct spm_pair){r->t->score[id], l, size});
}

static inline bool is_sp(const char *e, const struct spm_sym *y)
{
	return y->n == 3 && memcmp(e + y->off, "\xe2\x96\x81", 3) == 0;
}

static inline bool ends_sp(const char *e, const struct spm_sym *y)
{
	return y->n >= 3 && memcmp(e + y->off + y->n - 3, "\xe2\x96\x81", 3) == 0;
}

/* Merge symbols [a, b) of the escaped text by score, then emit them. */
static int spm_merge(struct tok_run *r, int32_t a0, int32_t b0)
{
	const engine_tokenizer *t = r->t;
	const char *e = r->esc;
	struct spm_sym *sym = r->sym;
	sym[a0].prev = -1;
	sym[b0 - 1].next = -1;
	r->heap_n = 0;
	int rc;
	for (int32_t i = a0; i + 1 < b0; i++) {
		if ((rc = spm_try_pair(r, i, i + 1)))
			return rc;
	}
	while (r->heap_n) {
		struct spm_pair p = spm_pop(r);
		struct spm_sym *a = &sym[p.left];
		/* Stale if the left symbol was merged away, has no right
		 * neighbour, or either side grew since the push. */
		if (a->n == 0 || a->next < 0 || a->n + sym[a->next].n != p.size)
			continue;
		struct spm_sym *b = &sym[a->next];
		a->n += b->n;
		b->n = 0;
		a->next = b->next;
		if (a->next >= 0)
			sym[a->next].prev = p.left;
		if ((rc = spm_try_pair(r, a->prev, p.left)) ||
		    (rc = spm_try_pair(r, p.left, a->next)))
			return rc;
	}

	for (int32_t i = a0; i >= 0; i = sym[i].next) {
		int32_t id = engine_tok_lookup(t, e + sym[i].off, (size_t)sym[i].n);
		if (id >= 0) {
			emit(r, id);
			continue;
		}
		for (int32_t j = 0; j < sym[i].n; j++) {
			uint8_t c = (uint8_t)e[sym[i].off + j];
			if (t->byte_tok[c] < 0)
				return cm_err_set(r->err, -EPROTO,
				                  "tokenizer: no token for byte 0x%02X (no byte "
				                  "fallback and no unknown token)",
				                  c);
			emit(r, t->byte_tok[c]);
		}
	}
	return 0;
}

/* One raw fragment: escape spaces (and prepend one if asked), merge by
 * score (§5.4), emit tokens with byte fallback. */
static int spm_tokenize_raw(struct tok_run *r, const char *s, size_t n, bool prefix)
{
	const engine_tokenizer *t = r->t;
	size_t spaces = 0;
	for (size_t i = 0; i < n; i++)
		spaces += s[i] == ' ';
	size_t elen = n + 2 * spaces + (prefix ? 3 : 0);
	void *q = engine_tok_grow(r->esc, &r->esc_cap, elen, 1);
	if (!q)
		return cm_err_set(r->err, -ENOMEM, "tokenizer: out of memory");
	r->esc = q;
	q = engine_tok_grow(r->sym, &r->sym_cap, elen, sizeof(*r->sym));
	if (!q)
		return cm_err_set(r->err, -ENOMEM, "tokenizer: out of memory");
	r->sym = q;

	char *e = r->esc;
	size_t k = 0;
	if (prefix) {
		memcpy(e, "\xe2\x96\x81", 3);
		k = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(e + k, "\xe2\x96\x81", 3);
			k += 3;
		} else {
			e[k++] = s[i];
		}
	}

	struct spm_sym *sym = r->sym;
	int32_t ns = 0;
	for (size_t off = 0; off < elen;) {
		int32_t l = spm_char_len((uint8_t)e[off]);
		if ((size_t)l > elen - off)
			l = (int32_t)(elen - off);
		sym[ns] = (struct spm_sym){(int32_t)off, l, ns - 1, ns + 1};
		ns++;
		off += (size_t)l;
	}
	if (ns == 0)
		return 0;
	sym[ns - 1].next = -1;
	if (!t->spm_words)
		return spm_merge(r, 0, ns);
	/* Words are independent (see spm_check_words): merge each alone, so
	 * the queue stays small and cache-resident. */
	int32_t start = 0;
	for (int32_t i = 1; i < ns; i++) {
		if (is_sp(e, &sym[i]) && !ends_sp(e, &sym[i - 1])) {
			int rc = spm_merge(r, start, i);
			if (rc)
				return rc;
			start = i;
		}
	}
	return spm_merge(r, start, ns);
}

/* ---- tokenize: fragments ------------------------------------------------------------ */

/* A fragment of the partition: a special token (id >= 0) or raw text. */
static int run_fragment(struct tok_run *r, const char *s, size_t n, int32_t id)
{
	if (id >= 0) {
		emit(r, id);
		r->prev_special = true;
		return 0;
	}
	bool first_or_after_token = r->prev_special;
	r->prev_special = false;
	switch (r->t->model) {
	case TOK_MODEL_SPM:
		return spm_tokenize_raw(r, s, n, r->t->add_space_prefix && first_or_after_token);
	case TOK_MODEL_BPE:
		return engine_bpe_tokenize_raw(r, s, n);
	}
	return -EINVAL;
}

static inline bool is_space(uint8_t c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Bucket of the byte pair at p (the pair index below). */
static inline uint32_t pair_bucket(const uint8_t *p, int bits)
{
	uint32_t v = ((uint32_t)p[0] << 8) | p[1];
	return (v * 2654435761u) >> (32 - bits);
}

/* The special-token partition (§5.3), with llama.cpp's semantics: for
 * each candidate, longest first, each raw fragment is split at the
 * leftmost non-overlapping occurrences. Here the fragments are a marking of
 * the text: mark[i] == 0 raw, id + 1 at the start of a claimed token, -1
 * for the rest of a token or stripped whitespace. An occurrence is claimable
 * iff all its bytes are still raw, which is exactly "lies inside one raw
 * fragment". */
static int partition(struct tok_run *r, const char *text, size_t len, bool parse_special)
{
	const engine_tokenizer *t = r->t;
	const uint8_t *u = (const uint8_t *)text;
	bool present[256] = {false};
	for (size_t i = 0; i < len; i++)
		present[u[i]] = true;

	int32_t n_cand = 0;
	for (int32_t k = 0; k < t->n_special; k++) {
		int32_t id = t->special[k];
		if (!parse_special && !(t->attr[id] & ENGINE_TOKEN_USER_DEFINED))
			continue;
		if (t->len[id] <= len && present[(uint8_t)tok_text(t, id)[0]])
			n_cand++;
	}
	if (n_cand == 0)
		return run_fragment(r, text, len, -1);

	/* Index every byte pair: positions grouped by bucket, ascending. */
	int bits = 8;
	while (bits < 16 && ((size_t)1 << bits) < len)
		bits++;
	size_t nb = (size_t)1 << bits;
	size_t npos = len - 1; /* len >= 1 here */
	int32_t *mark = cm_calloc(len, sizeof(*mark));
	uint32_t *start = cm_calloc(nb + 1, sizeof(*start));
	uint32_t *pos = cm_malloc((npos ? npos : 1) * sizeof(*pos));
	int rc = 0;
	if (!mark || !start || !pos) {
		rc = cm_err_set(r->err, -ENOMEM, "tokenizer: out of memory for %zu bytes of text",
		                len);
		goto out;
	}
	for (size_t i = 0; i < npos; i++)
		start[pair_bucket(u + i, bits) + 1]++;
	for (size_t b = 0; b < nb; b++)
		start[b + 1] += start[b];
	{
		uint32_t *fill = cm_malloc(nb * sizeof(*fill));
		if (!fill) {
			rc = cm_err_set(r->err, -ENOMEM, "tokenizer: out of memory");
			goto out;
		}
		memcpy(fill, start, nb * sizeof(*fill));
		for (size_t i = 0; i < npos; i++)
			pos[fill[pair_bucket(u + i, bits)]++] = (uint32_t)i;
		cm_free(fill);
	}

	for (int32_t k = 0; k < t->n_special; k++) {
		int32_t id = t->special[k];
		if (!parse_special && !(t->attr[id] & ENGINE_TOKEN_USER_DEFINED))
			continue;
		const uint8_t *c = (const uint8_t *)tok_text(t, id);
		size_t L = t->len[id];
		if (L > len || !present[c[0]])
			continue;
		uint8_t fl = t->flags[id];
		size_t next_ok = 0; /* after a claim, the search resumes past it */
		size_t bi = 0, be = 0;
		if (L >= 2) {
			uint32_t b = pair_bucket(c, bits);
			bi = start[b];
			be = start[b + 1];
		}
		size_t p = 0;
		for (;;) {
			/* next candidate position >= next_ok */
			if (L >= 2) {
				while (bi < be && pos[bi] < next_ok)
					bi++;
				if (bi == be)
					break;
				p = pos[bi++];
			} else {
				if (next_ok >= len)
					break;
				const uint8_t *q = memchr(u + next_ok, c[0], len - next_ok);
				if (!q)
					break;
				p = (size_t)(q - u);
				next_ok = p + 1;
			}
			if (p + L > len)
				break; /* positions ascend: no later one fits either */
			if (memcmp(u + p, c, L) != 0)
				continue;
			size_t j = 0;
			while (j < L && mark[p + j] == 0)
				j++;
			if (j < L)
				continue; /* overlaps a claimed token: not inside one fragment */
			mark[p] = id + 1;
			for (j = 1; j < L; j++)
				mark[p + j] = -1;
			if (fl & TOK_F_LSTRIP) {
				for (size_t q = p; q > 0 && mark[q - 1] == 0 && is_space(u[q - 1]);
				     q--)
					mark[q - 1] = -1;
			}
			size_t e = p + L;
			if (fl & TOK_F_RSTRIP) {
				while (e < len && mark[e] == 0 && is_space(u[e]))
					mark[e++] = -1;
			}
			next_ok = e;
		}
	}

	for (size_t i = 0; i < len && !rc;) {
		if (mark[i] > 0) {
			rc = run_fragment(r, NULL, 0, mark[i] - 1);
			i++;
		} else if (mark[i] < 0) {
			i++;
		} else {
			size_t j = i;
			while (j < len && mark[j] == 0)
				j++;
			rc = run_fragment(r, text + i, j - i, -1);
			i = j;
		}
	}
out:
	cm_free(mark);
	cm_free(start);
	cm_free(pos);
	return rc;
}

int engine_tokenize(const engine_tokenizer *t, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t *out, int max, int *ret_n, struct cm_err *err)
{
	if (ret_n)
		*ret_n = 0;
	if ((!text && len) || max < 0 || (max > 0 && !out))
		return cm_err_set(err, -EINVAL, "tokenizer: invalid arguments");
	if (len > TOK_MAX_TEXT)
		return cm_err_set(err, -EINVAL,
		                  "tokenizer: text of %zu bytes exceeds the limit of %zu", len,
		                  TOK_MAX_TEXT);
	struct tok_run r = {.t = t, .out = out, .max = max, .prev_special = true, .err = err};
	int rc = 0;
	if (add_special && t->add_bos && t->bos >= 0)
		emit(&r, t->bos);
	if (len)
		rc = partition(&r, text, len, parse_special);
	if (!rc && add_special && t->add_eos && t->eos >= 0)
		emit(&r, t->eos);
	run_fini(&r);
	if (rc)
		return rc;
	if (ret_n)
		*ret_n = (int)r.n;
	if (r.n > max)
		return cm_err_set(err, -ENOBUFS, "tokenizer: %lld tokens do not fit a buffer of %d",
		                  (long long)r.n, max);
	return 0;
}

/* ---- detokenize --------------------------------------------------------------------- */

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* SPM piece rules (§5.6). */
static void spm_piece(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc)
{
	uint32_t a = t->attr[id];
	const char *s = tok_text(t, id);
	pc->s = (const uint8_t *)s;
	pc->n = t->len[id];
	pc->i = 0;
	if (a & (ENGINE_TOKEN_CONTROL | ENGINE_TOKEN_UNKNOWN))
		pc->mode = special ? PIECE_VERBATIM : PIECE_EMPTY;
	else if (a & ENGINE_TOKEN_USER_DEFINED)
		pc->mode = PIECE_VERBATIM;
	else if (a & ENGINE_TOKEN_NORMAL)
		pc->mode = PIECE_UNESCAPE;
	else if (a & ENGINE_TOKEN_BYTE) {
		int hi = pc->n == 6 ? hex_digit(s[3]) : -1, lo = pc->n == 6 ? hex_digit(s[4]) : -1;
		if (hi >= 0 && lo >= 0 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
			pc->mode = PIECE_BYTE;
			pc->byte = (uint8_t)(hi << 4 | lo);
			pc->n = 1;
		} else {
			pc->mode = PIECE_VERBATIM; /* a BYTE token that is not <0xHH> */
		}
	} else {
		pc->mode = PIECE_EMPTY; /* UNUSED, UNDEFINED */
	}
}

static void piece_init(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc)
{
	switch (t->model) {
	case TOK_MODEL_SPM:
		spm_piece(t, id, special, pc);
		break;
	case TOK_MODEL_BPE:
		engine_bpe_piece(t, id, special, pc);
		break;
	}
}

/* Next byte of the piece, or -1 at its end. */
static int piece_next(struct piece *pc)
{
	switch (pc->mode) {
	case PIECE_EMPTY:
		return -1;
	case PIECE_BYTE:
		if (pc->i++ == 0)
			return pc->byte;
		return -1;
	case PIECE_VERBATIM:
		return pc->i < pc->n ? pc->s[pc->i++] : -1;
	case PIECE_UNESCAPE:
		if (pc->i >= pc->n)
			return -1;
		if (pc->n - pc->i >= 3 && pc->s[pc->i] == 0xe2 && pc->s[pc->i + 1] == 0x96 &&
		    pc->s[pc->i + 2] == 0x81) {
			pc->i += 3;
			return ' ';
		}
		return pc->s[pc->i++];
	}
	return -1;
}

int engine_token_to_piece(const engine_tokenizer *t, int32_t id, bool special, char *buf,
                          size_t cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	struct piece pc;
	piece_init(t, id, special, &pc);
	struct piece count = pc;
	size_t n = 0;
	while (piece_next(&count) >= 0)
		n++;
	if (n > cap || n > INT_MAX)
		return -ENOBUFS;
	int c;
	size_t k = 0;
	while ((c = piece_next(&pc)) >= 0)
		buf[k++] = (char)c;
	return (int)k;
}

struct u8out {
	char *buf;
	size_t cap, n;
	bool overflow;
};

static inline void put(struct u8out *o, const void *s, size_t k)
{
	if (o->overflow || k > o->cap - o->n) {
		o->overflow = true;
		return;
	}
	memcpy(o->buf + o->n, s, k);
	o->n += k;
}

static inline void put_fffd(struct u8out *o)
{
	put(o, "\xef\xbf\xbd", 3);
}

/* Length of the UTF-8 sequence a lead byte starts: 1 for ASCII, 2-4, or 0
 * for a byte that cannot start one (continuations, C0, C1, F5-FF). */
static inline int u8_need(uint8_t c)
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

/* May b follow `lead` at position pos (1..3)? Rejects overlongs,
 * surrogates and code points above U+10FFFF. */
static inline bool u8_cont_ok(uint8_t lead, int pos, uint8_t b)
{
	if ((b & 0xc0) != 0x80)
		return false;
	if (pos == 1) {
		if (lead == 0xe0)
			return b >= 0xa0;
		if (lead == 0xed)
			return b <= 0x9f;
		if (lead == 0xf0)
			return b >= 0x90;
		if (lead == 0xf4)
			return b <= 0x8f;
	}
	return true;
}

/* Feed one byte: complete characters go out, an incomplete valid prefix
 * waits in d->pend, and each byte of a sequence that turns out invalid
 * becomes U+FFFD. */
static void detok_feed(struct engine_detok *d, struct u8out *o, uint8_t b)
{
	for (;;) {
		if (d->n_pend <= 0) {
			int need = u8_need(b);
			if (need == 1)
				put(o, &b, 1);
			else if (need == 0)
				put_fffd(o);
			else {
				d->pend[0] = (char)b;
				d->n_pend = 1;
			}
			return;
		}
		uint8_t lead = (uint8_t)d->pend[0];
		if (u8_cont_ok(lead, d->n_pend, b)) {
			d->pend[d->n_pend++] = (char)b;
			if (d->n_pend >= u8_need(lead)) {
				put(o, d->pend, (size_t)d->n_pend);
				d->n_pend = 0;
			}
			return;
		}
		for (int i = 0; i < d->n_pend; i++)
			put_fffd(o);
		d->n_pend = 0;
		/* and b starts afresh */
	}
}

void engine_detok_init(struct engine_detok *d, const engine_tokenizer *t)
{
	memset(d, 0, sizeof(*d));
	d->first = false; /* a continuation keeps its leading space */
}

static int detok_push(struct engine_detok *d, const engine_tokenizer *t, int32_t id, bool special,
                      char *out, size_t cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	if (d->n_pend < 0 || d->n_pend > 3)
		d->n_pend = 0;
	struct piece pc;
	piece_init(t, id, special, &pc);
	struct engine_detok save = *d;
	struct u8out o = {out, cap > INT_MAX ? INT_MAX : cap, 0, false};
	/* Like llama.cpp's whole-sequence detokenize: the first token loses
	 * one leading space, whatever its piece. */
	bool strip = d->first;
	d->first = false;
	int c;
	while ((c = piece_next(&pc)) >= 0) {
		if (strip) {
			strip = false;
			if (c == ' ')
				continue;
		}
		detok_feed(d, &o, (uint8_t)c);
		if (o.overflow) {
			*d = save;
			return -ENOBUFS;
		}
	}
	return (int)o.n;
}

int engine_detok_push(struct engine_detok *d, const engine_tokenizer *t, int32_t id, char *out,
                      size_t cap)
{
	return detok_push(d, t, id, false, out, cap);
}

int engine_detok_flush(struct engine_detok *d, char *out, size_t cap)
{
	int n = d->n_pend > 0 && d->n_pend <= 3 ? d->n_pend : 0;
	if ((size_t)n * 3 > cap)
		return -ENOBUFS;
	for (int i = 0; i < n; i++)
		memcpy(out + 3 * i, "\xef\xbf\xbd", 3);
	d->n_pend = 0;
	return 3 * n;
}

int engine_detokenize(const engine_tokenizer *t, const int32_t *ids, int n, bool special,
                      char **ret_text, struct cm_err *err)
{
	*ret_text = NULL;
	if (n < 0 || (n > 0 && !ids))
		return cm_err_set(err, -EINVAL, "tokenizer: invalid arguments");
	/* Output bound: each piece byte becomes at most 3 bytes (U+FFFD). */
	uint64_t total = 0;
	for (int i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->n_vocab)
			return cm_err_set(
			    err, -EINVAL,
			    "tokenizer: token %d at position %d out of range (n_vocab %d)",
			    (int)ids[i], i, (int)t->n_vocab);
		total += t->len[ids[i]];
	}
	if (total > (SIZE_MAX - 16) / 3)
		return cm_err_set(err, -ENOMEM, "tokenizer: detokenized text too large");
	size_t cap = (size_t)total * 3 + 12;
	char *buf = cm_malloc(cap + 1);
	if (!buf)
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory for %zu bytes", cap);
	struct engine_detok d;
	engine_detok_init(&d, t);
	d.first = t->add_space_prefix;
	size_t used = 0;
	for (int i = 0; i < n; i++) {
		int k = detok_push(&d, t, ids[i], special, buf + used, cap - used);
		if (k < 0) {
			cm_free(buf);
			return cm_err_set(err, k, "tokenizer: detokenize failed at position %d", i);
		}
		used += (size_t)k;
	}
	int k = engine_detok_flush(&d, buf + used, cap - used);
	if (k < 0) {
		cm_free(buf);
		return cm_err_set(err, k, "tokenizer: detokenize failed at the end");
	}
	used += (size_t)k;
	if (t->clean_spaces)
		used = engine_bpe_clean_spaces(buf, used);
	buf[used] = '\0';
	*ret_text = buf;
	return 0;
}
