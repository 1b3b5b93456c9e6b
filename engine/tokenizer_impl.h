/* engine/tokenizer_impl.h: what the tokenizer's files share, grouped by
 * the file that defines it, lowest layer first (the layers: tokenizer.c).
 * Not for use outside engine/ (tests may include it). */
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
	bool spm_words;    /* SPM: no token joins a word to the next (tokenizer_spm.c) */
	int32_t *special;  /* CONTROL, USER_DEFINED and UNKNOWN ids, longest text first */
	int32_t n_special;
	int32_t byte_tok[256]; /* SPM byte fallback, -1 if none */
	struct bpe *bpe;       /* BPE model state, NULL for SPM */
};

static inline const char *tok_text(const engine_tokenizer *t, int32_t id)
{
	return t->arena + t->off[id];
}

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
	/* SPM scratch (tokenizer_spm.c), grown as needed and reused across fragments */
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

/* ---- detokenization: the bytes of one token's piece ------------------------ */

struct piece {
	const uint8_t *s;
	size_t n, i;
	enum { PIECE_EMPTY, PIECE_VERBATIM, PIECE_UNESCAPE, PIECE_BYTE } mode;
	uint8_t byte;
};

/* ---- vocabulary (tokenizer_vocab.c) ------------------------------------------ */

/* Texts, scores and types of tokenizer.ggml.*, and the text -> id map. */
int engine_tok_vocab_load(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err);
/* Exact text -> id, -1 if absent. */
int32_t engine_tok_lookup(const engine_tokenizer *t, const char *s, size_t n);
/* Grow an array to hold `need` elements; NULL (and p untouched) on failure. */
void *engine_tok_grow(void *p, size_t *cap, size_t need, size_t elem);
/* A printable rendering of s[0..n) for messages: at most ~40 bytes, other
 * bytes as \xNN. Returns buf. */
const char *engine_tok_esc_text(char buf[64], const char *s, size_t n);

/* ---- SPM model (tokenizer_spm.c) ---------------------------------------------- */

/* The SPM defaults of the special ids and flags (before loading). */
void engine_spm_defaults(engine_tokenizer *t);
/* Byte fallback and the word-by-word check, once the vocabulary is loaded. */
void engine_spm_build(engine_tokenizer *t);
/* One raw fragment -> ids; prefix: prepend an escaped space. */
int engine_spm_tokenize_raw(struct tok_run *r, const char *s, size_t n, bool prefix);
void engine_spm_run_fini(struct tok_run *r); /* frees r's SPM scratch */
void engine_spm_piece(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc);

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

/* ---- special tokens (tokenizer_special.c) ------------------------------------- */

/* Special ids, flags (EOG, strip) and the partition's candidates, after
 * the vocabulary is loaded. */
int engine_tok_special_load(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err);
/* The special-token partition of text[0..len): *ret_mark (malloc'ed, len
 * entries; the caller frees it) holds 0 for raw bytes, id + 1 where a
 * special token starts and -1 for the rest of it or stripped whitespace.
 * *ret_mark is NULL when no special token can occur: the text is all raw. */
int engine_tok_special_mark(const engine_tokenizer *t, const char *text, size_t len,
                            bool parse_special, int32_t **ret_mark, struct cm_err *err);

#endif
