/* engine/tokenizer_detok.c: detokenization (docs/gguf-formats.md §5.6):
 * the bytes of one token's piece, whole-sequence detokenization, and the
 * streaming UTF-8 sanitizer that never emits part of a character. The
 * model's piece rules live with the model (tokenizer_spm.c,
 * tokenizer_bpe.c); this file picks one and calls down into it. */
#include "engine/tokenizer_impl.h"

#include <limits.h>
#include <string.h>

static void piece_init(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc)
{
	switch (t->model) {
	case TOK_MODEL_SPM:
		engine_spm_piece(t, id, special, pc);
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
