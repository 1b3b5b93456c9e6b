/* engine/tokenizer_impl.h: what tokenizer.c (vocabulary, special tokens,
 * SPM, detokenization) and tokenizer_bpe.c (byte-level BPE) share. Not for
 * use outside engine/ (tests may include it). */
#ifndef EDGELM_TOKENIZER_IMPL_H
#define EDGELM_TOKENIZER_IMPL_H

#include "engine/engine.h"
#include "engine/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tok_model {
	TOK_MODEL_SPM,
	TOK_MODEL_BPE,
};

/* Per-token flags that are not public attributes. */
enum {
	TOK_F_LSTRIP = 1 << 0, /* strip whitespace before this special token */
	TOK_F_RSTRIP = 1 << 1, /* ... and after it */
	TOK_F_EOG = 1 << 2,    /* ends generation */
};

struct tok_slot {
	uint32_t hash;
	int32_t id; /* -1: empty */
};

struct bpe; /* tokenizer_bpe.c */

struct engine_tokenizer {
	enum tok_model model;
	int32_t n_vocab;
	char *arena;   /* every text, each NUL-terminated */
	uint32_t *off; /* text of id i: arena + off[i], len[i] bytes */
	uint32_t *len;
	float *score;
	uint32_t *attr; /* enum engine_token_attr bits */
	uint8_t *flags; /* TOK_F_* */
	struct tok_slot *slots;
	size_t slot_mask;
	int32_t bos, eos, unk, eot, eom; /* -1 when absent */
	bool add_bos, add_eos, add_space_prefix;
	bool clean_spaces; /* BPE: whole-sequence detok cleanup (§5.6) */
	bool spm_words;    /* SPM: no token joins a word to the next (tokenizer.c) */
	int32_t *special;  /* CONTROL, USER_DEFINED and UNKNOWN ids, longest text first */
	int32_t n_special;
	int32_t byte_tok[256]; /* SPM byte fallback, -1 if none */
	struct bpe *bpe;       /* BPE model state, NULL for SPM */
};

static inline const char *tok_text(const engine_tokenizer *t, int32_t id)
{
	return t->arena + t->off[id];
}

/* Exact text -> id, -1 if absent. */
int32_t engine_tok_lookup(const engine_tokenizer *t, const char *s, size_t n);

/* ---- one tokenize call ---------------------------------------------------- */

struct spm_sym;
struct spm_pair;
struct bpe_scratch;

struct tok_run {
	const engine_tokenizer *t;
	int32_t *out;
	int64_t max, n;    /* ids are counted past max, stored up to it */
	bool prev_special; /* the previous fragment was a token, or there was none */
	struct cm_err *err;
	/* SPM scratch, grown as needed and reused across fragments */
	char *esc;
	size_t esc_cap;
	struct spm_sym *sym;
	size_t sym_cap;
	struct spm_pair *heap;
	size_t heap_cap, heap_n;
	/* BPE scratch (tokenizer_bpe.c), created on first use */
	struct bpe_scratch *bs;
};

static inline void emit(struct tok_run *r, int32_t id)
{
	if (r->n < r->max)
		r->out[r->n] = id;
	r->n++;
}

/* Grow an array to hold `need` elements; NULL (and p untouched) on failure. */
void *engine_tok_grow(void *p, size_t *cap, size_t need, size_t elem);

/* ---- detokenization: the bytes of one token's piece ------------------------ */

struct piece {
	const uint8_t *s;
	size_t n, i;
	enum { PIECE_EMPTY, PIECE_VERBATIM, PIECE_UNESCAPE, PIECE_BYTE } mode;
	uint8_t byte;
};

/* ---- BPE model (tokenizer_bpe.c) -------------------------------------------- */

/* Defaults, merges, the pre-tokenizer of tokenizer.ggml.pre and the decoded
 * pieces. Called after the vocabulary and the special ids are loaded; the
 * defaults are applied before by engine_bpe_defaults(). */
void engine_bpe_defaults(engine_tokenizer *t, const struct gguf_file *f);
int engine_bpe_build(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err);
void engine_bpe_free(struct bpe *b); /* NULL-safe */
/* One raw fragment of the special-token partition -> ids. */
int engine_bpe_tokenize_raw(struct tok_run *r, const char *s, size_t n);
void engine_bpe_scratch_free(struct bpe_scratch *bs); /* NULL-safe */
void engine_bpe_piece(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc);
/* clean_spaces post-processing of a whole detokenized text, in place;
 * returns the new length. */
size_t engine_bpe_clean_spaces(char *s, size_t n);
/* The pre-tokenizer's name in force (for messages and tests). */
const char *engine_bpe_pre_name(const engine_tokenizer *t);

#endif
