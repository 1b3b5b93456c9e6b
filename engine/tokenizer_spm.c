/* engine/tokenizer_spm.c: the SPM ("llama") tokenizer model
 * (docs/gguf-formats.md §5.4, §5.6): spaces escaped as U+2581,
 * score-ordered merging, byte fallback and the piece rules.
 *
 * Tokenize is O(n log n) in the text length: a heap of merge candidates,
 * with stale entries skipped on pop. Uses the vocabulary only. */
#include "engine/tokenizer_impl.h"

#include <string.h>

/* ---- setup ---------------------------------------------------------- */

void engine_spm_defaults(engine_tokenizer *t)
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

void engine_spm_build(engine_tokenizer *t)
{
	spm_build_bytes(t);
	spm_check_words(t);
}

/* ---- tokenize ----------------------------------------------------------------------- */

struct spm_sym {
	int32_t off, n; /* bytes of the escaped text; n == 0: merged away */
	int32_t prev, next;
};

struct spm_pair {
	float score;  /* of the token the merge would make */
	int32_t left; /* left symbol */
	int32_t size; /* combined byte length when pushed (stale check) */
};

void engine_spm_run_fini(struct tok_run *r)
{
	cm_free(r->esc);
	cm_free(r->sym);
	cm_free(r->heap);
}

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
int engine_spm_tokenize_raw(struct tok_run *r, const char *s, size_t n, bool prefix)
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
void engine_spm_piece(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc)
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
