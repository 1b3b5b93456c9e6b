/* tools/lib/bench_tokenize.c: `edgelm-bench --tokenize -m MODEL [FILE]`, the
 * tokenizer's speed on English text (issue 4: at least 5 MB/s on this box).
 *
 * The text: FILE; else, when $EDGELM_TESTDATA is set, the 400 held-out stories
 * of $EDGELM_TESTDATA/reference/stories-heldout.jsonl (their "text": 220 kB of
 * simple English); else English-like text from the fixed-seed generator
 * below. It is repeated up to --text-mb MB (default 4; 0: once) and cut into
 * documents of about 4 KiB at line ends, the size of a prompt.
 *
 * Encode: engine_tokenize of each document as plain text (no BOS/EOS, no
 * special-token parsing). Decode: engine_detokenize of each document's ids.
 * MB/s counts text bytes, 10^6 to the MB (the unit); tokens/s the
 * ids produced or consumed. Each figure is the best of --reps passes over
 * the whole text, like the rest of the bench. Only the tokenizer is loaded
 * (engine_tokenizer_load), so a vocab-only GGUF is enough and a full
 * model's weights are not read. */
#include "tools/lib/tools.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_INPUT 2
#define EXIT_RUNTIME 3

#define DOC_MIN 4096  /* a document ends at the first line end after this */
#define DOC_MAX 65536 /* or here (at a character boundary) */

struct buf {
	char *p;
	size_t n, cap;
};

static int buf_add(struct buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = CM_MAX(b->cap * 2, b->n + n + 1 + 4096);
		char *p = cm_realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
	return 0;
}

static int read_file(const char *path, struct buf *b)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -errno;
	char chunk[65536];
	size_t r;
	int ret = 0;
	while (ret == 0 && (r = fread(chunk, 1, sizeof(chunk), f)) > 0)
		ret = buf_add(b, chunk, r);
	if (ret == 0 && ferror(f))
		ret = -EIO;
	fclose(f);
	return ret;
}

/* The "text" of every line of a JSON-lines file, one per line. */
static int read_stories(const char *path, struct buf *b)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int ret = 0;
	while (ret == 0 && (len = getline(&line, &cap, f)) > 0) {
		json_t *j = json_loadb(line, (size_t)len, 0, NULL);
		json_t *t = json_object_get(j, "text");
		if (json_is_string(t)) {
			ret = buf_add(b, json_string_value(t), json_string_length(t));
			if (ret == 0)
				ret = buf_add(b, "\n", 1);
		}
		json_decref(j);
	}
	free(line);
	fclose(f);
	return b->n ? ret : -ENODATA;
}

/* ---- synthetic English ----------------------------------------------------
 * Words drawn with a Zipf-like law (rank r with probability ~ 1/r, the law
 * of word frequencies in English), sentences of 4-17 words with commas and
 * names, paragraphs of 3-8 sentences. Not prose, but the same mix of short
 * common words, spaces and punctuation a tokenizer sees in English. */

static const char *const words[] = {
    "the",      "and",       "a",         "to",        "was",       "he",         "she",
    "it",       "of",        "in",        "they",      "her",       "his",        "said",
    "you",      "with",      "on",        "that",      "for",       "day",        "big",
    "little",   "happy",     "saw",       "went",      "had",       "not",        "but",
    "very",     "play",      "we",        "one",       "so",        "were",       "up",
    "wanted",   "time",      "is",        "all",       "friend",    "mom",        "be",
    "at",       "are",       "what",      "can",       "ball",      "tree",       "dog",
    "cat",      "park",      "sun",       "water",     "house",     "look",       "there",
    "then",     "go",        "did",       "like",      "toy",       "new",        "red",
    "blue",     "came",      "help",      "found",     "car",       "bird",       "fun",
    "good",     "too",       "home",      "do",        "box",       "now",        "out",
    "run",      "jump",      "get",       "sad",       "smiled",    "asked",      "when",
    "laughed",  "made",      "back",      "from",      "toys",      "again",      "after",
    "sky",      "cake",      "flower",    "garden",    "together",  "best",       "many",
    "away",     "around",    "started",   "learned",   "lesson",    "share",      "careful",
    "felt",     "proud",     "know",      "thought",   "because",   "something",  "special",
    "every",    "morning",   "always",    "loved",     "window",    "village",    "important",
    "remember", "beautiful", "surprised", "decided",   "suddenly",  "understood", "different",
    "mountain", "children",  "adventure", "yesterday", "questions", "answered",
};
static const char *const names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"};

static uint64_t gen_state = 0x9e3779b97f4a7c15ull;
static uint32_t gen_next(void)
{
	gen_state ^= gen_state << 13;
	gen_state ^= gen_state >> 7;
	gen_state ^= gen_state << 17;
	return (uint32_t)(gen_state >> 32);
}

static int gen_english(struct buf *b, size_t bytes)
{
	const int n_words = (int)CM_ARRAY_LEN(words);
	int ret = 0;
	while (ret == 0 && b->n < bytes) {
		int n_sent = 3 + (int)(gen_next() % 6);
		for (int s = 0; s < n_sent && ret == 0; s++) {
			int n = 4 + (int)(gen_next() % 14);
			for (int w = 0; w < n && ret == 0; w++) {
				const char *word;
				if (gen_next() % 16 == 0) {
					word = names[gen_next() % CM_ARRAY_LEN(names)];
				} else {
					double u = (gen_next() + 0.5) / 4294967296.0;
					int r = (int)pow(n_words + 1, u) - 1;
					word = words[CM_MIN(CM_MAX(r, 0), n_words - 1)];
				}
				char tmp[32];
				snprintf(tmp, sizeof(tmp), "%s", word);
				if (w == 0 && tmp[0] >= 'a' && tmp[0] <= 'z')
					tmp[0] = (char)(tmp[0] - 'a' + 'A');
				if (w > 0)
					ret = buf_add(b, " ", 1);
				if (ret == 0)
					ret = buf_add(b, tmp, strlen(tmp));
				if (ret == 0 && w + 1 < n && gen_next() % 12 == 0)
					ret = buf_add(b, ",", 1);
			}
			uint32_t e = gen_next() % 25;
			if (ret == 0)
				ret = buf_add(b, e < 20 ? "." : e < 23 ? "!" : "?", 1);
			if (ret == 0 && s + 1 < n_sent)
				ret = buf_add(b, " ", 1);
		}
		if (ret == 0)
			ret = buf_add(b, "\n", 1);
	}
	return ret;
}

/* ---- the benchmark ------------------------------------------------------- */

struct doc {
	size_t off, len; /* in the text */
	size_t id_off;   /* first id in the id arena */
	int n_ids;
};

/* Cut text into documents: each ends at the first '\n' at or after DOC_MIN
 * bytes, or at DOC_MAX bytes backed up to a UTF-8 character start. */
static int cut_documents(const char *text, size_t n, struct doc **ret_docs, size_t *ret_n)
{
	size_t cap = n / DOC_MIN + 2, nd = 0, off = 0;
	struct doc *d = cm_calloc(cap, sizeof(*d));
	if (!d)
		return -ENOMEM;
	while (off < n) {
		size_t end = CM_MIN(off + DOC_MIN, n);
		const char *nl = memchr(text + end, '\n', CM_MIN(n - end, DOC_MAX - DOC_MIN));
		if (nl) {
			end = (size_t)(nl - text) + 1;
		} else {
			end = CM_MIN(off + DOC_MAX, n);
			while (end < n && end > off + 1 &&
			       ((unsigned char)text[end] & 0xc0) == 0x80)
				end--;
		}
		if (nd == cap) {
			struct doc *nd_ = cm_realloc(d, (cap *= 2) * sizeof(*d));
			if (!nd_) {
				cm_free(d);
				return -ENOMEM;
			}
			d = nd_;
		}
		d[nd++] = (struct doc){.off = off, .len = end - off};
		off = end;
	}
	*ret_docs = d;
	*ret_n = nd;
	return 0;
}

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

struct tokbench {
	engine_tokenizer *tok;
	struct buf base, text; /* the source once, and repeated */
	char source[4200];     /* where the text came from, for the report */
	int copies;
	struct doc *docs;
	size_t nd;
	int32_t *ids; /* the id arena */
	/* the figures: the best pass's seconds, and one pass's counts */
	double enc_best, dec_best;
	uint64_t n_tokens, dec_bytes;
	size_t roundtrip; /* documents that decode to their exact text */
};

static void tokbench_free(struct tokbench *b)
{
	cm_free(b->ids);
	cm_free(b->docs);
	cm_free(b->text.p);
	cm_free(b->base.p);
	engine_tokenizer_free(b->tok);
}

/* The text (FILE, the held-out stories, or synthetic English) repeated up
 * to --text-mb. Returns the exit code. */
static int load_text(const struct tools_tokbench_params *p, struct tokbench *b)
{
	const char *data = getenv("EDGELM_TESTDATA");
	char spath[4096] = "";
	if (data && *data)
		snprintf(spath, sizeof(spath), "%s/reference/stories-heldout.jsonl", data);
	size_t want = (size_t)(p->text_mb * 1e6);
	if (p->text) {
		int r = read_file(p->text, &b->base);
		if (r == 0 && b->base.n == 0)
			r = -ENODATA;
		if (r) {
			fprintf(stderr, "edgelm-bench: %s: %s\n", p->text, strerror(-r));
			return EXIT_INPUT;
		}
		snprintf(b->source, sizeof(b->source), "%s", p->text);
	} else if (spath[0] && read_stories(spath, &b->base) == 0) {
		snprintf(b->source, sizeof(b->source), "%s", spath);
	} else {
		b->base.n = 0;
		if (gen_english(&b->base, CM_MAX(want, (size_t)1 << 18)) != 0)
			return EXIT_RUNTIME;
		snprintf(b->source, sizeof(b->source), "synthetic English (no %s)",
		         spath[0] ? spath : "$EDGELM_TESTDATA");
	}
	do {
		if (buf_add(&b->text, b->base.p, b->base.n) != 0) {
			fprintf(stderr, "edgelm-bench: out of memory for the text\n");
			return EXIT_RUNTIME;
		}
		b->copies++;
	} while (b->text.n < want);
	return 0;
}

/* Documents, and each one's place in the id arena. -ENOMEM */
static int cut_text(struct tokbench *b)
{
	if (cut_documents(b->text.p, b->text.n, &b->docs, &b->nd) != 0)
		return -ENOMEM;
	/* Ids never outnumber the bytes (every token stands for at least one
	 * byte), plus an SPM leading space per document. */
	size_t id_cap = b->text.n + 8 * b->nd;
	b->ids = cm_malloc(id_cap * sizeof(int32_t));
	if (!b->ids)
		return -ENOMEM;
	size_t used = 0;
	for (size_t i = 0; i < b->nd; i++) {
		b->docs[i].id_off = used;
		used += b->docs[i].len + 8;
	}
	return 0;
}

/* Every document encoded; returns seconds, < 0 after saying why. */
static double encode_pass(struct tokbench *b)
{
	struct cm_err err = {0};
	b->n_tokens = 0;
	double t0 = cm_now();
	for (size_t i = 0; i < b->nd; i++) {
		struct doc *d = &b->docs[i];
		int r = engine_tokenize(b->tok, b->text.p + d->off, d->len, false, false,
		                        b->ids + d->id_off, (int)(d->len + 8), &d->n_ids, &err);
		if (r) {
			fprintf(stderr, "edgelm-bench: tokenize: %s\n", err.msg);
			return -1;
		}
		b->n_tokens += (uint64_t)d->n_ids;
	}
	return cm_now() - t0;
}

/* Every document decoded (the first pass also checks the round trip);
 * returns seconds, < 0 after saying why. */
static double decode_pass(struct tokbench *b, bool first)
{
	struct cm_err err = {0};
	b->dec_bytes = 0;
	double t0 = cm_now();
	for (size_t i = 0; i < b->nd; i++) {
		struct doc *d = &b->docs[i];
		char *out = NULL;
		int r = engine_detokenize(b->tok, b->ids + d->id_off, d->n_ids, false, &out, &err);
		if (r) {
			fprintf(stderr, "edgelm-bench: detokenize: %s\n", err.msg);
			return -1;
		}
		size_t ol = strlen(out);
		b->dec_bytes += ol;
		if (first && ol == d->len && memcmp(out, b->text.p + d->off, ol) == 0)
			b->roundtrip++;
		cm_free(out);
	}
	return cm_now() - t0;
}

static void report(const struct tools_tokbench_params *p, const struct tokbench *b)
{
	size_t bytes = b->text.n;
	double enc_mbs = bytes / b->enc_best / 1e6, dec_mbs = b->dec_bytes / b->dec_best / 1e6;
	double enc_tps = b->n_tokens / b->enc_best, dec_tps = b->n_tokens / b->dec_best;
	double bpt = (double)bytes / (double)CM_MAX(b->n_tokens, 1);
	if (p->json) {
		printf("{\"mode\":\"tokenize\",\"model\":");
		tools_json_str(stdout, p->model);
		printf(",\"n_vocab\":%d,\"source\":", engine_tokenizer_n_vocab(b->tok));
		tools_json_str(stdout, b->source);
		printf(
		    ",\"copies\":%d,\"bytes\":%zu,\"documents\":%zu,\"reps\":%d,\"tokens\":%llu,"
		    "\"bytes_per_token\":%.3f,\"encode\":{\"mb_s\":%.3f,\"tok_s\":%.0f,"
		    "\"seconds\":%.4f},\"decode\":{\"mb_s\":%.3f,\"tok_s\":%.0f,\"seconds\":%.4f},"
		    "\"roundtrip_documents\":%zu}\n",
		    b->copies, bytes, b->nd, p->reps, (unsigned long long)b->n_tokens, bpt, enc_mbs,
		    enc_tps, b->enc_best, dec_mbs, dec_tps, b->dec_best, b->roundtrip);
		return;
	}
	printf("tokenizer    %s, %d tokens\n", base_name(p->model),
	       engine_tokenizer_n_vocab(b->tok));
	printf("text         %s, %d cop%s: %.2f MB in %zu documents of ~4 KiB\n", b->source,
	       b->copies, b->copies == 1 ? "y" : "ies", bytes / 1e6, b->nd);
	printf("tokens       %llu, %.2f bytes per token\n", (unsigned long long)b->n_tokens, bpt);
	printf("encode       %.2f MB/s, %.0f tokens/s (best of %d)\n", enc_mbs, enc_tps, p->reps);
	printf("decode       %.2f MB/s, %.0f tokens/s\n", dec_mbs, dec_tps);
	printf("round trip   %zu of %zu documents decode to their exact text\n", b->roundtrip,
	       b->nd);
}

int tools_bench_tokenize(const struct tools_tokbench_params *p)
{
	struct tokbench b = {0};
	struct cm_err err = {0};
	int rc = 0;

	/* the tokenizer alone, as engine_model_load(vocab_only) builds it, but
	 * without the architecture check: the vocab files of architectures the
	 * engine does not run (falcon, gpt2, phi3, starcoder2) are measured too */
	if (engine_tokenizer_load(p->model, &b.tok, &err) != 0) {
		if (strstr(err.msg, p->model))
			fprintf(stderr, "edgelm-bench: %s\n", err.msg);
		else
			fprintf(stderr, "edgelm-bench: %s: %s\n", p->model, err.msg);
		return EXIT_INPUT;
	}
	rc = load_text(p, &b);
	if (!rc && cut_text(&b) != 0)
		rc = EXIT_RUNTIME;
	for (int rep = 0; rep < p->reps && !rc; rep++) {
		double te = encode_pass(&b);
		double td = te < 0 ? -1 : decode_pass(&b, rep == 0);
		if (td < 0) {
			rc = EXIT_RUNTIME;
			break;
		}
		b.enc_best = rep == 0 ? te : CM_MIN(b.enc_best, te);
		b.dec_best = rep == 0 ? td : CM_MIN(b.dec_best, td);
	}
	if (!rc)
		report(p, &b);
	tokbench_free(&b);
	return rc;
}
