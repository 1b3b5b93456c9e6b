/* engine/tokenizer.c: the tokenizer object (docs/gguf-formats.md §5):
 * construction, accessors, and tokenize, which dispatches each fragment of
 * the special-token partition to the model.
 *
 * The files form layers, each calling only the ones below it:
 *   tokenizer.c, tokenizer_detok.c    the object, tokenize; detokenization
 *   tokenizer_special.c               special ids and flags, the partition
 *   tokenizer_spm.c, tokenizer_bpe.c  the two models
 *   tokenizer_vocab.c                 texts, the text -> id map, scores
 * tokenizer_impl.h declares what crosses a file. */
#include "engine/tokenizer_impl.h"

#include <string.h>

/* Longest text engine_tokenize() accepts, so that the id count (at most
 * three per byte plus BOS/EOS) always fits an int. */
#define TOK_MAX_TEXT ((size_t)1 << 28)

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
		                  engine_tok_esc_text(b, model.ptr, model.len));
	}

	engine_tokenizer *t = cm_calloc(1, sizeof(*t));
	if (!t)
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
	t->model = kind;
	t->eot = t->eom = -1;
	if (kind == TOK_MODEL_SPM)
		engine_spm_defaults(t);
	else
		engine_bpe_defaults(t, f);
	r = engine_tok_vocab_load(t, f, err);
	if (!r)
		r = engine_tok_special_load(t, f, err);
	if (!r && kind == TOK_MODEL_BPE)
		r = engine_bpe_build(t, f, err);
	if (r) {
		engine_tokenizer_free(t);
		return r;
	}
	if (kind == TOK_MODEL_SPM)
		engine_spm_build(t);
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

/* ---- tokenize ----------------------------------------------------------------------- */

static void run_fini(struct tok_run *r)
{
	engine_spm_run_fini(r);
	engine_bpe_scratch_free(r->bs);
}

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
		return engine_spm_tokenize_raw(r, s, n,
		                               r->t->add_space_prefix && first_or_after_token);
	case TOK_MODEL_BPE:
		return engine_bpe_tokenize_raw(r, s, n);
	}
	return -EINVAL;
}

/* The text, fragment by fragment: the special tokens the partition marks
 * and the raw text between them. */
static int run_text(struct tok_run *r, const char *text, size_t len, bool parse_special)
{
	int32_t *mark;
	int rc = engine_tok_special_mark(r->t, text, len, parse_special, &mark, r->err);
	if (rc)
		return rc;
	if (!mark)
		return run_fragment(r, text, len, -1);
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
	cm_free(mark);
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
		rc = run_text(&r, text, len, parse_special);
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
