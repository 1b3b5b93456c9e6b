/* engine/tokenizer_bpe.c: the byte-level BPE ("gpt2") tokenizer model
 * (docs/gguf-formats.md §5.5, §5.6).
 *
 * A raw fragment of the special-token partition goes through:
 *   1. invalid UTF-8 -> U+FFFD, one per bad byte, so that the regex engine
 *      only ever sees valid UTF-8;
 *   2. the pre-tokenizer of tokenizer.ggml.pre: a list of regexes applied
 *      as successive refinement (each regex splits every current segment
 *      into its matches and the gaps between them; nothing is dropped). The
 *      regexes are PCRE2 patterns compiled once per tokenizer with UTF and
 *      UCP (so \s, \p{L}, \p{N} are Unicode classes), JIT-compiled when
 *      the library supports it;
 *   3. per segment, byte-level BPE. Every byte of the segment stands for
 *      one character of GPT-2's byte -> unicode map, and every such
 *      character is a token of a complete byte-level vocabulary, so the
 *      symbols are token ids from the start and a merge is a lookup of the
 *      pair (left id, right id) in a hash table giving (rank, merged id).
 *      Merges run lowest rank first, ties leftmost, with a binary heap and
 *      lazy deletion of stale candidates: O(n log n) per segment.
 *
 * Merges whose parts or result are not tokens cannot take part in id-based
 * merging and are left out; real vocabularies have none (llama.cpp would
 * split such a result into single bytes at the end anyway).
 *
 * Detokenization: the decoded bytes of every NORMAL token are computed once
 * at build time (inverse byte map), stored at the same offsets as the token
 * texts, so a piece is a plain copy. */
#include "engine/tokenizer_impl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pre-tokenizers (§5.5) ------------------------------------------------ */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL
#define RE_PUNCT "[\\p{P}\\$\\+<=>\\^~\\|]+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

#define PRE_MAX_RE 6

struct pre_def {
	const char *names; /* NUL-separated list, ended by an empty name */
	bool add_bos, ignore_merges, clean_spaces;
	const char *re[PRE_MAX_RE];
};

/* The deepseek-llm letter class of the model's tokenizer.json. Written
 * with \x{} escapes: a rendering as literal characters is easily
 * NFC-normalized (U+212A KELVIN SIGN -> K, U+2126 -> U+03A9, ...), which
 * turns ranges like U+1F5F-U+1F7D around. */
#define RE_DS_LETTERS                                                                              \
	"\\s?["                                                                                    \
	"A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"             \
	"\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-"             \
	"\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-"              \
	"\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-"                    \
	"\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-"             \
	"\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-"             \
	"\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-"             \
	"\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}"               \
	"\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-"             \
	"\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-"             \
	"\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"               \
	"\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"               \
	"\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-"              \
	"\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-"              \
	"\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-"             \
	"\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-"             \
	"\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                   \
	"\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-"               \
	"\\x{118DF}\\x{1E900}-\\x{1E943}]+"
#define RE_DS_PUNCT                                                                                \
	"\\s?[!-/"                                                                                 \
	":-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"
#define RE_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"

static const struct pre_def pre_defs[] = {
    {"default\0\0", false, false, true, {RE_PUNCT, RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt-2\0phi-2\0roberta-bpe\0jina-es\0jina-de\0jina-v1-en\0jina-v2-es\0jina-v2-de\0"
     "jina-v2-code\0gigachat\0mpt\0olmo\0jais\0\0",
     false,
     false,
     true,
     {RE_GPT2}},
    {"llama3\0llama-v3\0llama-bpe\0falcon3\0\0", true, true, true, {RE_LLAMA3}},
    {"dbrx\0smaug-bpe\0chatglm-bpe\0\0", false, false, true, {RE_LLAMA3}},
    {"qwen2\0deepseek-r1-qwen\0\0", false, false, false, {RE_QWEN2}},
    {"stablelm2\0megrez\0\0", false, false, true, {RE_QWEN2}},
    {"smollm\0command-r\0\0", false, false, false, {"\\p{N}", RE_GPT2}},
    {"starcoder\0refact\0codeshell\0exaone\0minerva-7b\0\0",
     false,
     false,
     true,
     {"\\p{N}", RE_GPT2}},
    {"falcon\0\0", false, false, true, {RE_PUNCT, RE_GPT2, "[0-9][0-9][0-9]"}},
    {"deepseek-llm\0\0",
     false,
     false,
     false,
     {"[\\r\\n]", RE_DS_LETTERS, RE_DS_PUNCT, "\\s+$", RE_CJK, "\\p{N}+"}},
    {"deepseek-coder\0\0",
     false,
     false,
     false,
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
    {"deepseek-v3\0\0",
     false,
     false,
     false,
     {"\\p{N}{1,3}", RE_KANA,
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
      "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"tekken\0\0",
     false,
     true,
     false,
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"poro-chat\0bloom\0gpt3-finnish\0\0", false, false, false, {RE_PORO}},
    {"viking\0\0", false, false, false, {RE_PORO, "\\p{N}"}},
};

/* The names of the known pre-tokenizers, for the "unsupported" message. */
static size_t pre_names_list(char *buf, size_t cap)
{
	size_t o = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < CM_ARRAY_LEN(pre_defs); i++) {
		for (const char *nm = pre_defs[i].names; *nm; nm += strlen(nm) + 1) {
			int k = snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", nm);
			if (k < 0 || (size_t)k >= cap - o)
				return o;
			o += (size_t)k;
		}
	}
	return o;
}

static const struct pre_def *pre_find(const char *name, size_t n, const char **ret_name)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(pre_defs); i++) {
		for (const char *nm = pre_defs[i].names; *nm; nm += strlen(nm) + 1) {
			if (strlen(nm) == n && memcmp(nm, name, n) == 0) {
				*ret_name = nm;
				return &pre_defs[i];
			}
		}
	}
	return NULL;
}

/* ---- the model's state --------------------------------------------------- */

struct merge_slot {
	uint64_t key; /* left id << 32 | right id */
	int32_t rank; /* -1: empty */
	int32_t id;   /* the merged token */
};

struct bpe {
	const struct pre_def *pre;
	const char *pre_name;
	pcre2_code *re[PRE_MAX_RE];
	int n_re;
	bool ignore_merges;
	/* GPT-2's map: byte -> code point (UTF-8, 1 or 2 bytes) and token */
	uint8_t enc[256][2];
	uint8_t enc_len[256];
	int32_t byte_id[256]; /* -1 if the character is not a token */
	struct merge_slot *merges;
	size_t merge_mask;
	/* decoded NORMAL pieces: dec + t->off[id], dec_len[id] bytes */
	uint8_t *dec;
	uint32_t *dec_len;
};

/* Scratch of one tokenize call. */
struct bpe_sym {
	int32_t id; /* BPE_DEAD: merged into its left neighbour */
	int32_t prev, next;
};

struct bpe_cand {
	int32_t rank, left;
	int32_t lid, rid; /* the pair's ids when pushed (stale check) */
};

struct bpe_scratch {
	uint8_t *u; /* the fragment as valid UTF-8 */
	size_t u_cap;
	uint32_t *seg, *seg2; /* segments: start, end pairs */
	size_t seg_cap, seg2_cap;
	struct bpe_sym *sym;
	size_t sym_cap;
	struct bpe_cand *heap;
	size_t heap_cap, heap_n;
	char *enc; /* encoded segment, for ignore_merges */
	size_t enc_cap;
	pcre2_match_data *md;
	pcre2_match_context *mctx;
};

#define BPE_DEAD (-2)

static inline uint64_t merge_key(int32_t a, int32_t b)
{
	return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static inline size_t merge_hash(uint64_t k)
{
	k ^= k >> 31;
	k *= 0x9e3779b97f4a7c15ull;
	k ^= k >> 29;
	return (size_t)k;
}

static inline const struct merge_slot *merge_find(const struct bpe *b, int32_t l, int32_t r)
{
	uint64_t k = merge_key(l, r);
	for (size_t i = merge_hash(k) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
		const struct merge_slot *s = &b->merges[i];
		if (s->rank < 0)
			return NULL;
		if (s->key == k)
			return s;
	}
}

/* ---- building --------------------------------------------------------------- */

void engine_bpe_defaults(engine_tokenizer *t, const struct gguf_file *f)
{
	t->bos = 11;
	t->eos = 11;
	t->unk = -1;
	t->add_bos = false;
	t->add_eos = false;
	t->add_space_prefix = false;
	t->clean_spaces = true;
	struct gguf_str pre;
	const char *nm;
	if (gguf_get_str(f, "tokenizer.ggml.pre", &pre, NULL) == 0) {
		const struct pre_def *d = pre_find(pre.ptr, pre.len, &nm);
		if (d) {
			t->add_bos = d->add_bos;
			t->clean_spaces = d->clean_spaces;
		}
	}
}

/* GPT-2's byte -> unicode table (§5.5 step 2). */
static void build_byte_map(struct bpe *b)
{
	uint32_t next = 0x100;
	for (int c = 0; c < 256; c++) {
		bool same = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
		uint32_t cp = same ? (uint32_t)c : next++;
		if (cp < 0x80) {
			b->enc[c][0] = (uint8_t)cp;
			b->enc_len[c] = 1;
		} else {
			b->enc[c][0] = (uint8_t)(0xc0 | (cp >> 6));
			b->enc[c][1] = (uint8_t)(0x80 | (cp & 0x3f));
			b->enc_len[c] = 2;
		}
	}
}

/* Inverse of the byte map: code point -> byte, -1 if not in the map. */
static int unmap_cp(uint32_t cp)
{
	if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
		return (int)cp;
	if (cp < 0x100 || cp > 0x143)
		return -1;
	/* the k-th remapped byte, in increasing byte order */
	uint32_t k = cp - 0x100;
	if (k <= 0x20)
		return (int)k; /* 0x00 - 0x20 */
	if (k <= 0x20 + 34)
		return (int)(0x7f + (k - 0x21)); /* 0x7f - 0xa0 */
	return 0xad;
}

/* Decode one UTF-8 character strictly; returns its length, 0 if invalid. */
static size_t u8_decode(const uint8_t *s, size_t n, uint32_t *ret_cp)
{
	uint8_t c = s[0];
	if (c < 0x80) {
		*ret_cp = c;
		return 1;
	}
	size_t need;
	uint32_t cp, min;
	if (c >= 0xc2 && c <= 0xdf) {
		need = 2;
		cp = c & 0x1f;
		min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		need = 3;
		cp = c & 0x0f;
		min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		need = 4;
		cp = c & 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if (need > n)
		return 0;
	for (size_t i = 1; i < need; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	*ret_cp = cp;
	return need;
}

static int build_merges(engine_tokenizer *t, struct bpe *b, const struct gguf_file *f,
                        struct cm_err *err)
{
	static const char key[] = "tokenizer.ggml.merges";
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return cm_err_set(err, -EPROTO, "tokenizer: gpt2 model without %s", key);
	struct gguf_str *strs = NULL;
	uint64_t n = 0;
	int r = gguf_arr_strings(f, key, &strs, &n, err);
	if (r)
		return cm_err_prefix(err, "tokenizer");
	if (n > INT32_MAX / 4) {
		cm_free(strs);
		return cm_err_set(err, -EPROTO, "tokenizer: %llu merges (too many)",
		                  (unsigned long long)n);
	}
	size_t slots = 16;
	while (slots < n * 2)
		slots *= 2;
	b->merges = cm_malloc(slots * sizeof(*b->merges));
	char *cat = NULL;
	size_t cat_cap = 0;
	if (!b->merges) {
		cm_free(strs);
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory for %llu merges",
		                  (unsigned long long)n);
	}
	b->merge_mask = slots - 1;
	for (size_t i = 0; i < slots; i++)
		b->merges[i].rank = -1;

	for (uint64_t m = 0; m < n; m++) {
		const char *s = strs[m].ptr;
		size_t len = strs[m].len;
		const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
		if (!sp)
			continue; /* llama.cpp would refuse the file; a merge less is harmless */
		size_t la = (size_t)(sp - s), lb = len - la - 1;
		int32_t ia = engine_tok_lookup(t, s, la), ib = engine_tok_lookup(t, sp + 1, lb);
		if (ia < 0 || ib < 0)
			continue;
		if (la + lb > cat_cap) {
			void *q = engine_tok_grow(cat, &cat_cap, la + lb, 1);
			if (!q) {
				cm_free(cat);
				cm_free(strs);
				return cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
			}
			cat = q;
		}
		memcpy(cat, s, la);
		memcpy(cat + la, sp + 1, lb);
		int32_t id = engine_tok_lookup(t, cat, la + lb);
		if (id < 0)
			continue;
		uint64_t k = merge_key(ia, ib);
		for (size_t j = merge_hash(k) & b->merge_mask;; j = (j + 1) & b->merge_mask) {
			struct merge_slot *sl = &b->merges[j];
			if (sl->rank < 0) {
				*sl = (struct merge_slot){k, (int32_t)m, id};
				break;
			}
			if (sl->key == k)
				break; /* a repeated merge keeps its first (lowest) rank */
		}
	}
	cm_free(cat);
	cm_free(strs);
	return 0;
}

static int build_pieces(engine_tokenizer *t, struct bpe *b, struct cm_err *err)
{
	size_t total = t->n_vocab ? t->off[t->n_vocab - 1] + t->len[t->n_vocab - 1] + 1 : 1;
	b->dec = cm_malloc(total);
	b->dec_len = cm_malloc((size_t)t->n_vocab * sizeof(*b->dec_len));
	if (!b->dec || !b->dec_len)
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
	for (int32_t id = 0; id < t->n_vocab; id++) {
		const uint8_t *s = (const uint8_t *)tok_text(t, id);
		size_t n = t->len[id], o = 0;
		uint8_t *d = b->dec + t->off[id];
		for (size_t i = 0; i < n;) {
			uint32_t cp;
			size_t k = u8_decode(s + i, n - i, &cp);
			int v = k ? unmap_cp(cp) : -1;
			if (v >= 0) {
				d[o++] = (uint8_t)v;
				i += k;
			} else if (k) {
				memcpy(d + o, s + i, k); /* not a byte-level character: as is */
				o += k;
				i += k;
			} else {
				d[o++] = s[i++];
			}
		}
		b->dec_len[id] = (uint32_t)o;
	}
	return 0;
}

static int build_regexes(struct bpe *b, struct cm_err *err)
{
	for (int i = 0; i < PRE_MAX_RE && b->pre->re[i]; i++) {
		int ec;
		PCRE2_SIZE eo;
		pcre2_code *re =
		    pcre2_compile((PCRE2_SPTR)b->pre->re[i], PCRE2_ZERO_TERMINATED,
		                  PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
		if (!re) {
			char msg[128];
			pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof(msg));
			return cm_err_set(err, -EPROTO,
			                  "tokenizer: pre-tokenizer '%s' regex %d: %s at %zu",
			                  b->pre_name, i, msg, (size_t)eo);
		}
		/* Without JIT support (or memory for it) the interpreter runs. */
		(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
		b->re[b->n_re++] = re;
	}
	return 0;
}

int engine_bpe_build(engine_tokenizer *t, const struct gguf_file *f, struct cm_err *err)
{
	struct gguf_str pre = {0};
	const char *name = "default";
	const struct pre_def *d = &pre_defs[0];
	int r = gguf_get_str(f, "tokenizer.ggml.pre", &pre, err);
	if (r && r != -ENOENT)
		return cm_err_prefix(err, "tokenizer");
	if (r == 0) {
		d = pre_find(pre.ptr, pre.len, &name);
		if (!d) {
			char list[2048];
			pre_names_list(list, sizeof(list));
			return cm_err_set(err, -ENOTSUP,
			                  "tokenizer: unknown pre-tokenizer '%.*s' (supported: %s)",
			                  (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, list);
		}
	}
	struct bpe *b = cm_calloc(1, sizeof(*b));
	if (!b)
		return cm_err_set(err, -ENOMEM, "tokenizer: out of memory");
	t->bpe = b;
	b->pre = d;
	b->pre_name = name;
	b->ignore_merges = d->ignore_merges;
	build_byte_map(b);
	for (int c = 0; c < 256; c++)
		b->byte_id[c] = engine_tok_lookup(t, (const char *)b->enc[c], b->enc_len[c]);
	r = build_regexes(b, err);
	if (!r)
		r = build_merges(t, b, f, err);
	if (!r)
		r = build_pieces(t, b, err);
	return r; /* on failure the caller frees t, and t->bpe with it */
}

void engine_bpe_free(struct bpe *b)
{
	if (!b)
		return;
	for (int i = 0; i < b->n_re; i++)
		pcre2_code_free(b->re[i]);
	cm_free(b->merges);
	cm_free(b->dec);
	cm_free(b->dec_len);
	cm_free(b);
}

const char *engine_bpe_pre_name(const engine_tokenizer *t)
{
	return t->bpe ? t->bpe->pre_name : NULL;
}

/* ---- tokenize ----------------------------------------------------------------- */

void engine_bpe_scratch_free(struct bpe_scratch *bs)
{
	if (!bs)
		return;
	cm_free(bs->u);
	cm_free(bs->seg);
	cm_free(bs->seg2);
	cm_free(bs->sym);
	cm_free(bs->heap);
	cm_free(bs->enc);
	pcre2_match_data_free(bs->md);
	pcre2_match_context_free(bs->mctx);
	cm_free(bs);
}

static int oom(struct tok_run *r)
{
	return cm_err_set(r->err, -ENOMEM, "tokenizer: out of memory");
}

static inline bool cand_better(const struct bpe_cand *a, const struct bpe_cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static int heap_push(struct tok_run *r, struct bpe_cand c)
{
	struct bpe_scratch *bs = r->bs;
	if (bs->heap_n == bs->heap_cap) {
		void *q = engine_tok_grow(bs->heap, &bs->heap_cap, bs->heap_n + 1, sizeof(*bs->heap));
		if (!q)
			return oom(r);
		bs->heap = q;
	}
	struct bpe_cand *h = bs->heap;
	size_t i = bs->heap_n++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_better(&c, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = c;
	return 0;
}

static struct bpe_cand heap_pop(struct bpe_scratch *bs)
{
	struct bpe_cand *h = bs->heap;
	struct bpe_cand top = h[0], last = h[--bs->heap_n];
	size_t n = bs->heap_n, i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && cand_better(&h[c + 1], &h[c]))
			c++;
		if (!cand_better(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (n)
		h[i] = last;
	return top;
}

static int try_pair(struct tok_run *r, int32_t l)
{
	const struct bpe_sym *sym = r->bs->sym;
	if (l < 0 || sym[l].next < 0)
		return 0;
	int32_t a = sym[l].id, b = sym[sym[l].next].id;
	if (a < 0 || b < 0)
		return 0;
	const struct merge_slot *m = merge_find(r->t->bpe, a, b);
	if (!m)
		return 0;
	return heap_push(r, (struct bpe_cand){m->rank, l, a, b});
}

/* A symbol that is not a token (a byte whose character the vocabulary
 * lacks): llama.cpp emits the 1-byte tokens of its encoded bytes, dropping
 * misses. */
static void emit_unknown(struct tok_run *r, uint8_t byte)
{
	const struct bpe *b = r->t->bpe;
	for (int i = 0; i < b->enc_len[byte]; i++) {
		int32_t id = engine_tok_lookup(r->t, (const char *)&b->enc[byte][i], 1);
		if (id >= 0)
			emit(r, id);
	}
}

/* One pre-tokenized segment (§5.5 steps 2-5). */
static int bpe_segment(struct tok_run *r, const uint8_t *s, size_t n)
{
	const struct bpe *b = r->t->bpe;
	struct bpe_scratch *bs = r->bs;
	if (n == 1) {
		if (b->byte_id[s[0]] >= 0)
			emit(r, b->byte_id[s[0]]);
		else
			emit_unknown(r, s[0]);
		return 0;
	}
	if (b->ignore_merges) {
		void *q = engine_tok_grow(bs->enc, &bs->enc_cap, 2 * n, 1);
		if (!q)
			return oom(r);
		bs->enc = q;
		size_t k = 0;
		for (size_t i = 0; i < n; i++) {
			memcpy(bs->enc + k, b->enc[s[i]], b->enc_len[s[i]]);
			k += b->enc_len[s[i]];
		}
		int32_t id = engine_tok_lookup(r->t, bs->enc, k);
		if (id >= 0) {
			emit(r, id);
			return 0;
		}
	}
	void *q = engine_tok_grow(bs->sym, &bs->sym_cap, n, sizeof(*bs->sym));
	if (!q)
		return oom(r);
	bs->sym = q;
	struct bpe_sym *sym = bs->sym;
	for (size_t i = 0; i < n; i++)
		sym[i] = (struct bpe_sym){b->byte_id[s[i]], (int32_t)i - 1, (int32_t)i + 1};
	sym[n - 1].next = -1;
	bs->heap_n = 0;
	int rc;
	for (size_t i = 0; i + 1 < n; i++) {
		if ((rc = try_pair(r, (int32_t)i)))
			return rc;
	}
	while (bs->heap_n) {
		struct bpe_cand c = heap_pop(bs);
		struct bpe_sym *a = &sym[c.left];
		if (a->id != c.lid || a->next < 0 || sym[a->next].id != c.rid)
			continue; /* stale: one side changed since the push */
		const struct merge_slot *m = merge_find(b, c.lid, c.rid);
		int32_t right = a->next;
		a->id = m->id;
		a->next = sym[right].next;
		sym[right].id = BPE_DEAD;
		if (a->next >= 0)
			sym[a->next].prev = c.left;
		if ((rc = try_pair(r, a->prev)) || (rc = try_pair(r, c.left)))
			return rc;
	}
	for (int32_t i = 0; i >= 0; i = sym[i].next) {
		if (sym[i].id >= 0)
			emit(r, sym[i].id);
		else
			emit_unknown(r, s[i]);
	}
	return 0;
}

/* Copy s into bs->u as valid UTF-8: every byte that does not belong to a
 * valid sequence becomes U+FFFD. Returns the new length. */
static size_t sanitize(uint8_t *u, const uint8_t *s, size_t n)
{
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		if (s[i] < 0x80) {
			u[o++] = s[i++];
			continue;
		}
		uint32_t cp;
		size_t k = u8_decode(s + i, n - i, &cp);
		if (k) {
			memcpy(u + o, s + i, k);
			o += k;
			i += k;
		} else {
			memcpy(u + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	return o;
}

static int scratch_init(struct tok_run *r)
{
	struct bpe_scratch *bs = cm_calloc(1, sizeof(*bs));
	if (!bs)
		return oom(r);
	r->bs = bs;
	bs->md = pcre2_match_data_create(4, NULL);
	bs->mctx = pcre2_match_context_create(NULL);
	if (!bs->md || !bs->mctx)
		return oom(r);
	/* Bounds the backtracking of one search: a pathological input gets
	 * PCRE2_ERROR_MATCHLIMIT (handled below), never a hang. */
	pcre2_set_match_limit(bs->mctx, 2000000);
	return 0;
}

/* Next match of re in subject[0..n) from `from`: 1 with [*m0, *m1), 0 for
 * none. When the search fails (match limit, JIT stack), the rest of the
 * segment counts as unmatched: the tokenization of such input may differ
 * from an unbounded engine's, but it always ends. */
static int find(struct bpe_scratch *bs, const pcre2_code *re, const uint8_t *subject, size_t n,
                size_t from, size_t *m0, size_t *m1)
{
	int rc = pcre2_match(re, subject, n, from, PCRE2_NO_UTF_CHECK, bs->md, bs->mctx);
	if (rc < 0)
		return 0;
	PCRE2_SIZE *ov = pcre2_get_ovector_pointer(bs->md);
	if (ov[0] > ov[1] || ov[1] > n)
		return 0; /* \K tricks cannot occur in our patterns; be safe anyway */
	*m0 = ov[0];
	*m1 = ov[1];
	return 1;
}

static int seg_add(struct tok_run *r, uint32_t **v, size_t *cap, size_t *n, size_t a, size_t e)
{
	if (*n + 2 > *cap) {
		void *q = engine_tok_grow(*v, cap, *n + 2, sizeof(**v));
		if (!q)
			return oom(r);
		*v = q;
	}
	(*v)[(*n)++] = (uint32_t)a;
	(*v)[(*n)++] = (uint32_t)e;
	return 0;
}

static inline size_t u8_len_at(const uint8_t *u, size_t i, size_t n)
{
	size_t k = 1;
	while (i + k < n && (u[i + k] & 0xc0) == 0x80)
		k++;
	return k;
}

int engine_bpe_tokenize_raw(struct tok_run *r, const char *s, size_t n)
{
	const struct bpe *b = r->t->bpe;
	int rc;
	if (!r->bs && (rc = scratch_init(r)))
		return rc;
	struct bpe_scratch *bs = r->bs;
	if (n > (UINT32_MAX - 16) / 3)
		return cm_err_set(r->err, -EINVAL, "tokenizer: fragment of %zu bytes too long", n);
	void *q = engine_tok_grow(bs->u, &bs->u_cap, 3 * n + 1, 1);
	if (!q)
		return oom(r);
	bs->u = q;
	size_t len = sanitize(bs->u, (const uint8_t *)s, n);
	const uint8_t *u = bs->u;

	size_t ns = 0;
	if ((rc = seg_add(r, &bs->seg, &bs->seg_cap, &ns, 0, len)))
		return rc;
	for (int k = 0; k < b->n_re; k++) {
		size_t ns2 = 0;
		for (size_t j = 0; j < ns; j += 2) {
			size_t a = bs->seg[j], e = bs->seg[j + 1], cur = 0, seg_n = e - a;
			size_t from = 0, m0, m1;
			while (from < seg_n && find(bs, b->re[k], u + a, seg_n, from, &m0, &m1)) {
				if (m1 == m0) { /* an empty match: step over one character */
					from = m0 + u8_len_at(u + a, m0, seg_n);
					continue;
				}
				if (m0 > cur && (rc = seg_add(r, &bs->seg2, &bs->seg2_cap, &ns2,
				                              a + cur, a + m0)))
					return rc;
				if ((rc = seg_add(r, &bs->seg2, &bs->seg2_cap, &ns2, a + m0,
				                  a + m1)))
					return rc;
				cur = from = m1;
			}
			if (cur < seg_n &&
			    (rc = seg_add(r, &bs->seg2, &bs->seg2_cap, &ns2, a + cur, e)))
				return rc;
		}
		uint32_t *tv = bs->seg;
		size_t tc = bs->seg_cap;
		bs->seg = bs->seg2;
		bs->seg_cap = bs->seg2_cap;
		bs->seg2 = tv;
		bs->seg2_cap = tc;
		ns = ns2;
	}
	for (size_t j = 0; j < ns; j += 2) {
		if ((rc = bpe_segment(r, u + bs->seg[j], bs->seg[j + 1] - bs->seg[j])))
			return rc;
	}
	return 0;
}

/* ---- detokenize (§5.6) ---------------------------------------------------------- */

void engine_bpe_piece(const engine_tokenizer *t, int32_t id, bool special, struct piece *pc)
{
	uint32_t a = t->attr[id];
	pc->i = 0;
	pc->s = (const uint8_t *)tok_text(t, id);
	pc->n = t->len[id];
	if (a & (ENGINE_TOKEN_CONTROL | ENGINE_TOKEN_UNKNOWN)) {
		pc->mode = special ? PIECE_VERBATIM : PIECE_EMPTY;
	} else if (a & ENGINE_TOKEN_USER_DEFINED) {
		pc->mode = PIECE_VERBATIM;
	} else if (a & ENGINE_TOKEN_NORMAL) {
		pc->mode = PIECE_VERBATIM;
		pc->s = t->bpe->dec + t->off[id];
		pc->n = t->bpe->dec_len[id];
	} else {
		pc->mode = PIECE_EMPTY;
	}
}

size_t engine_bpe_clean_spaces(char *s, size_t n)
{
	/* " ?", " !", " .", " ," lose the space */
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (o > 0 && s[o - 1] == ' ' && (c == '?' || c == '!' || c == '.' || c == ','))
			o--;
		s[o++] = c;
	}
	n = o;
	/* " ' " -> "'" */
	o = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\'' && i + 1 < n && s[i + 1] == ' ' && o > 0 && s[o - 1] == ' ') {
			s[o - 1] = '\'';
			i++;
			continue;
		}
		s[o++] = s[i];
	}
	n = o;
	/* " 's", " 'm", " 're", " 've" lose the space */
	o = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ' && i + 2 < n && s[i + 1] == '\'') {
			char c1 = s[i + 2], c2 = i + 3 < n ? s[i + 3] : '\0';
			if (c1 == 's' || c1 == 'm' || (c1 == 'r' && c2 == 'e') ||
			    (c1 == 'v' && c2 == 'e'))
				continue;
		}
		s[o++] = s[i];
	}
	return o;
}
