/* engine/sampler.c: token sampling as llama.cpp's default chain does it
 * (docs/gguf-formats.md §7): penalties -> top_k -> top_p -> min_p ->
 * temperature -> draw.
 *
 * Everything is preallocated in engine_sampler_new(): a candidate array of
 * n_vocab (id, logit) pairs, a per-token count of the penalty window and a
 * ring buffer of the window itself, so engine_sampler_sample() never
 * allocates. top_k uses partial selection (quickselect) and sorts only the
 * survivors; top_p without top_k sorts a growing prefix only as far as the
 * cumulative probability needs.
 *
 * A grammar (engine_grammar, grammar.c) masks the tokens it refuses to
 * -inf at the start of the chain, computed only when the unconstrained
 * choice is refused (engine_sampler_sample below).
 *
 * NaN logits count as -inf: they never win and never poison the softmax.
 * The random stream is xoshiro256** seeded through splitmix64, so a seed
 * reproduces a run exactly (it does not reproduce llama.cpp's mt19937). */
#include "engine/engine.h"
#include "engine/grammar_impl.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Longest penalty window we preallocate; -1 (whole history) needs no ring. */
#define PENALTY_WINDOW_MAX (1 << 24)

struct cand {
	float logit;
	int32_t id;
};

struct engine_sampler {
	struct engine_sampler_params p;
	int n_vocab;
	struct cand *cand; /* n_vocab */
	int32_t *count;    /* n_vocab: occurrences in the penalty window */
	int32_t *ring;     /* penalty_last_n entries (NULL when -1 or 0) */
	float *bias;       /* n_vocab, added to the logits; NULL: no logit_bias */
	int ring_cap, ring_len, ring_pos;
	uint64_t rng[4];
	struct grammar_state *gs; /* NULL: no grammar */
	uint8_t *gmask;           /* n_vocab: the grammar's allowed set */
	const uint8_t *allow;     /* gmask while it applies, else NULL */
};

/* ---- PRNG ------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void rng_seed(engine_sampler *s)
{
	uint64_t x = s->p.seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(engine_sampler *s)
{
	uint64_t *r = s->rng;
	uint64_t out = rotl(r[1] * 5, 7) * 9;
	uint64_t t = r[1] << 17;
	r[2] ^= r[0];
	r[3] ^= r[1];
	r[1] ^= r[2];
	r[0] ^= r[3];
	r[2] ^= t;
	r[3] = rotl(r[3], 45);
	return out;
}

/* Uniform in [0, 1). */
static double rng_uniform(engine_sampler *s)
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* ---- lifecycle ---------------------------------------------------------- */

void engine_sampler_params_default(struct engine_sampler_params *p)
{
	memset(p, 0, sizeof(*p));
	p->temp = 0.8f;
	p->top_k = 40;
	p->top_p = 0.95f;
	p->min_p = 0.05f;
	p->repeat_penalty = 1.0f;
	p->freq_penalty = 0.0f;
	p->presence_penalty = 0.0f;
	p->penalty_last_n = 64;
	p->seed = 0;
}

int engine_sampler_new(const struct engine_sampler_params *p, int n_vocab, engine_sampler **ret_s,
                       struct cm_err *err)
{
	*ret_s = NULL;
	if (n_vocab <= 0)
		return cm_err_set(err, -EINVAL, "sampler: n_vocab %d must be positive", n_vocab);
	if (isnan(p->temp) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->repeat_penalty) ||
	    isnan(p->freq_penalty) || isnan(p->presence_penalty))
		return cm_err_set(err, -EINVAL, "sampler: a parameter is NaN");
	if (p->repeat_penalty <= 0.0f || isinf(p->repeat_penalty))
		return cm_err_set(err, -EINVAL,
		                  "sampler: repeat_penalty %g must be positive and finite",
		                  (double)p->repeat_penalty);
	if (p->penalty_last_n < -1 || p->penalty_last_n > PENALTY_WINDOW_MAX)
		return cm_err_set(
		    err, -EINVAL,
		    "sampler: penalty_last_n %d out of range (-1 for the whole history, "
		    "0 for none, at most %d)",
		    (int)p->penalty_last_n, PENALTY_WINDOW_MAX);

	for (int i = 0; i < p->n_bias; i++) {
		if (p->bias_ids[i] < 0 || p->bias_ids[i] >= n_vocab)
			return cm_err_set(err, -EINVAL,
			                  "logit_bias: token %d is not in the vocabulary (0..%d)",
			                  (int)p->bias_ids[i], n_vocab - 1);
		if (isnan(p->bias[i]))
			return cm_err_set(err, -EINVAL, "logit_bias: the bias of token %d is NaN",
			                  (int)p->bias_ids[i]);
	}

	if (p->grammar && grammar_n_vocab(p->grammar) == 0)
		return cm_err_set(err, -EINVAL, "sampler: the grammar was compiled without a vocabulary");
	if (p->grammar && grammar_n_vocab(p->grammar) != n_vocab)
		return cm_err_set(err, -EINVAL,
		                  "sampler: the grammar is for a vocabulary of %d tokens, not %d",
		                  grammar_n_vocab(p->grammar), n_vocab);

	engine_sampler *s = cm_calloc(1, sizeof(*s));
	if (!s)
		return cm_err_set(err, -ENOMEM, "sampler: out of memory");
	if (p->grammar) {
		int r = grammar_state_new(p->grammar, &s->gs, err);
		s->gmask = cm_malloc((size_t)n_vocab);
		if (r || !s->gmask) {
			engine_sampler_free(s);
			return r ? r : cm_err_set(err, -ENOMEM, "sampler: out of memory");
		}
	}
	s->p = *p;
	s->p.bias_ids = NULL; /* the caller's; copied below */
	s->p.bias = NULL;
	if (p->n_bias > 0) {
		s->bias = cm_calloc((size_t)n_vocab, sizeof(*s->bias));
		if (!s->bias) {
			engine_sampler_free(s);
			return cm_err_set(err, -ENOMEM, "sampler: out of memory");
		}
		/* OpenAI: -100 bans; a repeated id takes its last bias */
		for (int i = 0; i < p->n_bias; i++)
			s->bias[p->bias_ids[i]] = p->bias[i] <= -100.0f ? -INFINITY : p->bias[i];
	}
	s->n_vocab = n_vocab;
	s->cand = cm_malloc((size_t)n_vocab * sizeof(*s->cand));
	s->count = cm_calloc((size_t)n_vocab, sizeof(*s->count));
	if (p->penalty_last_n > 0) {
		s->ring_cap = p->penalty_last_n;
		s->ring = cm_malloc((size_t)s->ring_cap * sizeof(*s->ring));
	}
	if (!s->cand || !s->count || (s->ring_cap && !s->ring)) {
		engine_sampler_free(s);
		return cm_err_set(err, -ENOMEM, "sampler: out of memory for %d candidates",
		                  n_vocab);
	}
	rng_seed(s);
	*ret_s = s;
	return 0;
}

void engine_sampler_free(engine_sampler *s)
{
	if (!s)
		return;
	cm_free(s->cand);
	cm_free(s->count);
	cm_free(s->ring);
	cm_free(s->bias);
	grammar_state_free(s->gs);
	cm_free(s->gmask);
	cm_free(s);
}

/* Like llama.cpp's reset: the history is forgotten and the random stream
 * starts over from the seed. */
void engine_sampler_reset(engine_sampler *s)
{
	memset(s->count, 0, (size_t)s->n_vocab * sizeof(*s->count));
	s->ring_len = 0;
	s->ring_pos = 0;
	rng_seed(s);
	if (s->gs)
		grammar_state_reset(s->gs);
}

void engine_sampler_accept(engine_sampler *s, int32_t id)
{
	if (id < 0 || id >= s->n_vocab || s->p.penalty_last_n == 0)
		return;
	if (s->p.penalty_last_n < 0) {
		if (s->count[id] < INT32_MAX)
			s->count[id]++;
		return;
	}
	if (s->ring_len == s->ring_cap) {
		s->count[s->ring[s->ring_pos]]--;
		s->ring_len--;
	}
	s->ring[s->ring_pos] = id;
	s->ring_pos = (s->ring_pos + 1) % s->ring_cap;
	s->ring_len++;
	s->count[id]++;
}

/* ---- stages --------------------------------------------------------------- */

static bool penalties_on(const engine_sampler *s)
{
	return s->p.penalty_last_n != 0 &&
	       (s->p.repeat_penalty != 1.0f || s->p.freq_penalty != 0.0f ||
	        s->p.presence_penalty != 0.0f);
}

/* The logit of token i after NaN cleanup, logit_bias and penalties. */
static inline float adjusted_logit(const engine_sampler *s, const float *logits, int i, bool pen)
{
	float l = logits[i];
	if (isnan(l) || (s->allow && !s->allow[i]))
		return -INFINITY;
	if (s->bias)
		l += s->bias[i]; /* -inf for a ban */
	if (pen) {
		int32_t c = s->count[i];
		if (c > 0) {
			l = l > 0.0f ? l / s->p.repeat_penalty : l * s->p.repeat_penalty;
			l -= (float)c * s->p.freq_penalty + s->p.presence_penalty;
			if (isnan(l))
				l = -INFINITY;
		}
	}
	return l;
}

/* Candidate order: higher logit first, ties to the lower id, so that every
 * sort and selection below is deterministic. */
static inline bool cand_before(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static inline void cand_swap(struct cand *a, struct cand *b)
{
	struct cand t = *a;
	*a = *b;
	*b = t;
}

/* Rearrange c[0..n) so that its first k entries are the k best (in any
 * order). Iterative quickselect with a median-of-three pivot. */
static void select_top(struct cand *c, int n, int k)
{
	int lo = 0, hi = n - 1;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (cand_before(&c[mid], &c[lo]))
			cand_swap(&c[mid], &c[lo]);
		if (cand_before(&c[hi], &c[lo]))
			cand_swap(&c[hi], &c[lo]);
		if (cand_before(&c[hi], &c[mid]))
			cand_swap(&c[hi], &c[mid]);
		struct cand pivot = c[mid];
		int i = lo, j = hi;
		while (i <= j) {
			while (cand_before(&c[i], &pivot))
				i++;
			while (cand_before(&pivot, &c[j]))
				j--;
			if (i <= j) {
				cand_swap(&c[i], &c[j]);
				i++;
				j--;
			}
		}
		/* Now [lo, j] <= pivot position <= [i, hi]. */
		if (k - 1 <= j)
			hi = j;
		else if (k - 1 >= i)
			lo = i;
		else
			break;
	}
}

/* Sort c[0..n) best first: heapsort (n is small after top_k, and bounded
 * worst case otherwise). */
static void sift_down(struct cand *c, int n, int i)
{
	for (;;) {
		int w = i, l = 2 * i + 1, r = l + 1;
		/* A min-heap in "before" order, so the worst entry is at the root. */
		if (l < n && cand_before(&c[w], &c[l]))
			w = l;
		if (r < n && cand_before(&c[w], &c[r]))
			w = r;
		if (w == i)
			return;
		cand_swap(&c[i], &c[w]);
		i = w;
	}
}

static void sort_cands(struct cand *c, int n)
{
	for (int i = n / 2 - 1; i >= 0; i--)
		sift_down(c, n, i);
	for (int end = n - 1; end > 0; end--) {
		cand_swap(&c[0], &c[end]);
		sift_down(c, end, 0);
	}
}

/* Make c[0..want) the `want` best of c[0..n), sorted, given that
 * c[0..have) already are the `have` best, sorted. */
static void extend_sorted(struct cand *c, int n, int have, int want)
{
	if (want > n)
		want = n;
	if (want <= have)
		return;
	select_top(c + have, n - have, want - have);
	sort_cands(c + have, want - have);
}

/* When no logit is above -inf (all NaN, or banned): the first token that
 * is not banned. */
static int32_t fallback_token(const engine_sampler *s)
{
	for (int i = 0; s->bias && i < s->n_vocab; i++)
		if (s->bias[i] != -INFINITY)
			return i;
	return 0;
}

static int32_t sample_plain(engine_sampler *s, const float *logits)
{
	const int nv = s->n_vocab;
	const bool pen = penalties_on(s);

	/* Greedy: the argmax of the penalized logits, ties to the lowest id. */
	if (s->p.temp <= 0.0f || s->p.top_k == 1) {
		int32_t best = 0;
		float bl = -INFINITY;
		for (int i = 0; i < nv; i++) {
			float l = adjusted_logit(s, logits, i, pen);
			if (l > bl) {
				bl = l;
				best = i;
			}
		}
		return bl == -INFINITY ? fallback_token(s) : best;
	}

	/* Candidates: every token with a finite or +inf logit. */
	struct cand *c = s->cand;
	int n = 0;
	float lmax = -INFINITY;
	int32_t imax = 0;
	for (int i = 0; i < nv; i++) {
		float l = adjusted_logit(s, logits, i, pen);
		if (l == -INFINITY)
			continue;
		if (l > lmax) {
			lmax = l;
			imax = i;
		}
		c[n].logit = l;
		c[n].id = i;
		n++;
	}
	if (n == 0)
		return fallback_token(s); /* everything NaN or -inf */
	if (isinf(lmax))
		return imax; /* +inf dominates every softmax: the first one wins */

	/* top_k: keep the k best, sorted. */
	int sorted = 0;
	if (s->p.top_k > 0 && s->p.top_k < n) {
		select_top(c, n, s->p.top_k);
		n = s->p.top_k;
		sort_cands(c, n);
		sorted = n;
	}

	/* top_p on untempered probabilities: the shortest best-first prefix
	 * whose mass reaches top_p. Without top_k, sort only as far as needed. */
	if (s->p.top_p < 1.0f && n > 1) {
		double sum = 0.0;
		for (int i = 0; i < n; i++)
			sum += exp((double)c[i].logit - lmax);
		double target = (double)s->p.top_p * sum, cum = 0.0;
		int keep = n;
		for (int i = 0; i < n; i++) {
			if (i >= sorted) {
				int want = sorted < 64 ? 64 : sorted * 4;
				extend_sorted(c, n, sorted, want);
				sorted = want < n ? want : n;
			}
			cum += exp((double)c[i].logit - lmax);
			if (cum >= target) {
				keep = i + 1;
				break;
			}
		}
		n = keep;
		if (sorted > n)
			sorted = n;
	}

	/* min_p: keep logits >= max + ln(min_p), i.e. p >= min_p * p_max. The
	 * maximum always survives; the filter preserves order. */
	if (s->p.min_p > 0.0f && n > 1) {
		float cut = lmax + logf(s->p.min_p);
		int m = 0;
		for (int i = 0; i < n; i++) {
			if (c[i].logit >= cut)
				c[m++] = c[i];
		}
		n = m;
	}

	/* Temperature, then the draw from the softmax. A temperature so small
	 * that 1/T overflows is greedy. */
	double inv_t = 1.0 / (double)s->p.temp;
	if (!isfinite(inv_t))
		return imax;
	double sum = 0.0;
	for (int i = 0; i < n; i++)
		sum += exp(((double)c[i].logit - lmax) * inv_t);
	double u = rng_uniform(s) * sum, cum = 0.0;
	for (int i = 0; i < n; i++) {
		cum += exp(((double)c[i].logit - lmax) * inv_t);
		if (u < cum)
			return c[i].id;
	}
	/* Rounding left u at the very top: take the last candidate with mass. */
	for (int i = n - 1; i > 0; i--) {
		if (exp(((double)c[i].logit - lmax) * inv_t) > 0.0)
			return c[i].id;
	}
	return c[0].id;
}

/* With a grammar, as llama.cpp does: draw from the unconstrained chain and
 * keep the token if the grammar allows it (one walk of its piece); only on
 * a refusal compute the allowed set (a trie walk) and draw again with the
 * rest masked to -inf, so the masking happens before top_k and the rest. */
int32_t engine_sampler_sample(engine_sampler *s, const float *logits)
{
	if (!s->gs)
		return sample_plain(s, logits);
	int32_t id = sample_plain(s, logits);
	if (grammar_state_allows(s->gs, id))
		return id;
	if (grammar_state_allowed(s->gs, s->gmask) == 0)
		return grammar_fallback_token(s->p.grammar);
	s->allow = s->gmask;
	id = sample_plain(s, logits);
	s->allow = NULL;
	if (s->gmask[id])
		return id;
	/* every allowed token is banned or NaN: the first allowed one */
	for (int i = 0; i < s->n_vocab; i++)
		if (s->gmask[i])
			return i;
	return id;
}

int engine_sampler_advance(engine_sampler *s, int32_t id)
{
	return s->gs ? grammar_state_advance(s->gs, id) : 0;
}

bool engine_sampler_grammar_done(const engine_sampler *s)
{
	return s->gs && grammar_state_done(s->gs);
}

/* ---- log-probabilities ------------------------------------------------------ */

float engine_logprobs(const float *logits, int n_vocab, int32_t id, int n_top, int32_t *top_ids,
		      float *top_lps)
{
	if (n_top > 64)
		n_top = 64;
	if (n_top > n_vocab)
		n_top = n_vocab;
	/* one pass: the maximum and the top list (insertion into a short
	 * sorted array: n_top is small), then the sum of exponentials */
	float mx = -INFINITY;
	int n = 0;
	for (int i = 0; i < n_vocab; i++) {
		float l = isnan(logits[i]) ? -INFINITY : logits[i];
		if (l > mx)
			mx = l;
		if (n_top <= 0 || (n == n_top && !(l > top_lps[n - 1])))
			continue;
		int k = n < n_top ? n++ : n - 1;
		while (k > 0 && l > top_lps[k - 1]) {
			top_lps[k] = top_lps[k - 1];
			top_ids[k] = top_ids[k - 1];
			k--;
		}
		top_lps[k] = l;
		top_ids[k] = i;
	}
	if (mx == -INFINITY || isinf(mx)) {
		/* no finite logit, or +inf ones: the distribution is degenerate */
		bool any = mx > 0; /* +inf: those tokens take all of it */
		for (int k = 0; k < n; k++)
			top_lps[k] = any && top_lps[k] == mx ? 0.0f : -INFINITY;
		float l = id >= 0 && id < n_vocab ? logits[id] : NAN;
		return any && l == mx ? 0.0f : -INFINITY;
	}
	double sum = 0.0;
	for (int i = 0; i < n_vocab; i++)
		if (!isnan(logits[i]))
			sum += exp((double)logits[i] - mx);
	double lse = (double)mx + log(sum);
	for (int k = 0; k < n; k++)
		top_lps[k] = (float)((double)top_lps[k] - lse);
	for (int k = n; k < n_top; k++) {
		top_ids[k] = -1;
		top_lps[k] = -INFINITY;
	}
	if (id < 0 || id >= n_vocab || isnan(logits[id]))
		return -INFINITY;
	return (float)((double)logits[id] - lse);
}
