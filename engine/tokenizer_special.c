/* engine/tokenizer_special.c: special tokens (docs/gguf-formats.md §5.2,
 * §5.3): their ids and flags from the GGUF and the per-model defaults, the
 * candidate list of the special-token partition, and the partition itself.
 *
 * The partition indexes the text's byte pairs once and then visits, for
 * each candidate token, only positions where its first two bytes occur, so
 * a text made of many special-looking tags costs O(tags * candidates
 * sharing a prefix), not a scan of every fragment by every candidate. It
 * only marks the text; tokenizer.c runs the fragments through the model. */
#include "engine/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

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

int engine_tok_special_load(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err)
{
	int r = load_specials(t, f, err);
	return r ? r : build_special_cache(t, f, err);
}

/* ---- the special-token partition ---------------------------------------------- */

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
int engine_tok_special_mark(const engine_tokenizer *t, const char *text, size_t len,
                            bool parse_special, int32_t **ret_mark, struct cm_err *err)
{
	*ret_mark = NULL;
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
		return 0;

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
		rc =
		    cm_err_set(err, -ENOMEM, "tokenizer: out of memory for %zu bytes of text", len);
		goto out;
	}
	for (size_t i = 0; i < npos; i++)
		start[pair_bucket(u + i, bits) + 1]++;
	for (size_t b = 0; b < nb; b++)
		start[b + 1] += start[b];
	{
		uint32_t *fill = cm_malloc(nb * sizeof(*fill));
		if (!fill) {
			rc = cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
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

	*ret_mark = mark;
	mark = NULL;
out:
	cm_free(mark);
	cm_free(start);
	cm_free(pos);
	return rc;
}
