/* tests/unit/test_engine_sampler.c: the sampler chain (docs/gguf-formats.md §7). */
#include "engine/engine.h"
#include "tests/test.h"

#include <math.h>
#include <stdbool.h>

static engine_sampler *make(const struct engine_sampler_params *p, int n_vocab)
{
	engine_sampler *s = NULL;
	struct cm_err err = {0};
	int r = engine_sampler_new(p, n_vocab, &s, &err);
	CHECK_MSG(r == 0, "engine_sampler_new: %d %s", r, err.msg);
	return s;
}

/* All filters off, temperature 1. */
static void plain_params(struct engine_sampler_params *p)
{
	engine_sampler_params_default(p);
	p->temp = 1.0f;
	p->top_k = 0;
	p->top_p = 1.0f;
	p->min_p = 0.0f;
}

static void test_defaults(void)
{
	struct engine_sampler_params p;
	engine_sampler_params_default(&p);
	CHECK_NEAR(p.temp, 0.8, 1e-6);
	CHECK_EQ_INT(p.top_k, 40);
	CHECK_NEAR(p.top_p, 0.95, 1e-6);
	CHECK_NEAR(p.min_p, 0.05, 1e-6);
	CHECK_NEAR(p.repeat_penalty, 1.0, 0);
	CHECK_EQ_INT(p.penalty_last_n, 64);
}

static void test_bad_params(void)
{
	struct engine_sampler_params p;
	engine_sampler *s = NULL;
	struct cm_err err = {0};
	plain_params(&p);
	CHECK_EQ_INT(engine_sampler_new(&p, 0, &s, &err), -EINVAL);
	CHECK(s == NULL);
	p.top_p = NAN;
	CHECK_EQ_INT(engine_sampler_new(&p, 10, &s, &err), -EINVAL);
	plain_params(&p);
	p.penalty_last_n = -2;
	CHECK_EQ_INT(engine_sampler_new(&p, 10, &s, &err), -EINVAL);
	plain_params(&p);
	p.repeat_penalty = 0.0f;
	CHECK_EQ_INT(engine_sampler_new(&p, 10, &s, &err), -EINVAL);
	CHECK(err.msg[0] != '\0');
	engine_sampler_free(NULL);
}

static void test_greedy(void)
{
	struct engine_sampler_params p;
	plain_params(&p);
	p.temp = 0.0f;
	engine_sampler *s = make(&p, 6);
	if (!s)
		return;
	float a[6] = {1.0f, 5.0f, 5.0f, 2.0f, -3.0f, 4.9f};
	CHECK_EQ_INT(engine_sampler_sample(s, a), 1); /* tie 1/2 -> lowest id */
	float b[6] = {NAN, 1.0f, NAN, 2.0f, NAN, 0.0f};
	CHECK_EQ_INT(engine_sampler_sample(s, b), 3);
	float c[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
	int32_t id = engine_sampler_sample(s, c);
	CHECK(id >= 0 && id < 6);
	float d[6] = {-INFINITY, -INFINITY, -7.0f, -7.0f, -INFINITY, -8.0f};
	CHECK_EQ_INT(engine_sampler_sample(s, d), 2);
	float e[6] = {0.0f, INFINITY, 0.0f, INFINITY, 0.0f, 0.0f};
	CHECK_EQ_INT(engine_sampler_sample(s, e), 1);
	engine_sampler_free(s);

	/* The default chain with temp <= 0 is greedy too. */
	engine_sampler_params_default(&p);
	p.temp = -1.0f;
	s = make(&p, 6);
	if (!s)
		return;
	CHECK_EQ_INT(engine_sampler_sample(s, a), 1);
	engine_sampler_free(s);
}

static uint64_t lcg_state = 12345;
static float rnd_logit(void)
{
	lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((lcg_state >> 40) & 0xffff) / 6553.6f - 5.0f;
}

static void test_top_k1_is_greedy(void)
{
	enum { NV = 1000 };
	static float l[NV];
	struct engine_sampler_params p;
	plain_params(&p);
	p.top_k = 1;
	p.temp = 2.0f;
	for (int round = 0; round < 20; round++) {
		int best = 0;
		for (int i = 0; i < NV; i++) {
			l[i] = rnd_logit();
			if (l[i] > l[best])
				best = i;
		}
		l[NV - 1] = l[best]; /* a tie: the lower id must win */
		p.seed = (uint64_t)round;
		engine_sampler *s = make(&p, NV);
		if (!s)
			return;
		for (int k = 0; k < 5; k++)
			CHECK_EQ_INT(engine_sampler_sample(s, l), best);
		engine_sampler_free(s);
	}
}

static void test_seed(void)
{
	enum { NV = 100, N = 100 };
	float l[NV];
	for (int i = 0; i < NV; i++)
		l[i] = rnd_logit() * 0.3f;
	struct engine_sampler_params p;
	plain_params(&p);
	p.seed = 42;
	engine_sampler *a = make(&p, NV), *b = make(&p, NV);
	p.seed = 43;
	engine_sampler *c = make(&p, NV);
	if (!a || !b || !c)
		goto out;
	int32_t sa[N];
	int same = 1, diff = 0;
	for (int i = 0; i < N; i++) {
		sa[i] = engine_sampler_sample(a, l);
		int32_t xb = engine_sampler_sample(b, l), xc = engine_sampler_sample(c, l);
		if (sa[i] != xb)
			same = 0;
		if (sa[i] != xc)
			diff++;
	}
	CHECK(same);
	CHECK(diff > 0);
	/* reset restarts the random stream */
	engine_sampler_reset(a);
	for (int i = 0; i < N; i++)
		CHECK_EQ_INT(engine_sampler_sample(a, l), sa[i]);
out:
	engine_sampler_free(a);
	engine_sampler_free(b);
	engine_sampler_free(c);
}

static void test_distribution(void)
{
	const float l[4] = {0.0f, 1.0f, 2.0f, 0.5f};
	double z = 0.0, pr[4];
	for (int i = 0; i < 4; i++)
		z += exp(l[i]);
	for (int i = 0; i < 4; i++)
		pr[i] = exp(l[i]) / z;
	struct engine_sampler_params p;
	plain_params(&p);
	p.seed = 7;
	engine_sampler *s = make(&p, 4);
	if (!s)
		return;
	int cnt[4] = {0};
	const int N = 20000;
	for (int i = 0; i < N; i++) {
		int32_t id = engine_sampler_sample(s, l);
		CHECK(id >= 0 && id < 4);
		if (id >= 0 && id < 4)
			cnt[id]++;
	}
	for (int i = 0; i < 4; i++)
		CHECK_NEAR((double)cnt[i] / N, pr[i], 0.02);
	engine_sampler_free(s);

	/* temperature 2 flattens: p ~ exp(l / 2) */
	p.temp = 2.0f;
	s = make(&p, 4);
	if (!s)
		return;
	z = 0.0;
	for (int i = 0; i < 4; i++)
		z += exp(l[i] / 2.0);
	memset(cnt, 0, sizeof(cnt));
	for (int i = 0; i < N; i++)
		cnt[engine_sampler_sample(s, l) & 3]++;
	for (int i = 0; i < 4; i++)
		CHECK_NEAR((double)cnt[i] / N, exp(l[i] / 2.0) / z, 0.02);
	engine_sampler_free(s);
}

/* Draw many times and return the set of ids seen as a bit mask. */
static unsigned seen_set(const struct engine_sampler_params *p, const float *l, int nv)
{
	engine_sampler *s = make(p, nv);
	if (!s)
		return 0;
	unsigned m = 0;
	for (int i = 0; i < 4000; i++) {
		int32_t id = engine_sampler_sample(s, l);
		if (id >= 0 && id < 32)
			m |= 1u << id;
		else
			m |= 1u << 31;
	}
	engine_sampler_free(s);
	return m;
}

static void test_filters(void)
{
	/* probabilities 0.05, 0.5, 0.15, 0.3, 0.0 (-inf) in shuffled order */
	float l[5] = {logf(0.05f), logf(0.5f), logf(0.15f), logf(0.3f), -INFINITY};
	struct engine_sampler_params p;

	plain_params(&p);
	CHECK_EQ_INT(seen_set(&p, l, 5), 0x0f);
	p.top_k = 2;
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 3));
	p.top_k = 3;
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 2) | (1u << 3));
	p.top_k = 100; /* more than the vocabulary: all */
	CHECK_EQ_INT(seen_set(&p, l, 5), 0x0f);

	plain_params(&p);
	p.top_p = 0.75f; /* 0.5 + 0.3 >= 0.75 */
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 3));
	p.top_p = 0.85f; /* needs 0.15 too */
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 2) | (1u << 3));
	p.top_p = 0.3f; /* the top token alone */
	CHECK_EQ_INT(seen_set(&p, l, 5), 1u << 1);

	plain_params(&p);
	p.min_p = 0.25f; /* p >= 0.125 */
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 2) | (1u << 3));
	p.min_p = 0.4f; /* p >= 0.2 */
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 3));
	p.temp = 5.0f; /* min_p sees untempered probabilities */
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 3));

	/* combined: top_k 3, then top_p 0.75 -> {1,3}; min_p 0.7 -> {1} */
	plain_params(&p);
	p.top_k = 3;
	p.top_p = 0.75f;
	CHECK_EQ_INT(seen_set(&p, l, 5), (1u << 1) | (1u << 3));
	p.min_p = 0.7f;
	CHECK_EQ_INT(seen_set(&p, l, 5), 1u << 1);
}

/* top_p over a large vocabulary without top_k (the partial sort path). */
static void test_top_p_large(void)
{
	enum { NV = 50000 };
	static float l[NV];
	for (int i = 0; i < NV; i++)
		l[i] = -20.0f - (float)(i % 97) * 0.01f;
	/* 300 tokens share most of the mass equally */
	for (int i = 0; i < 300; i++)
		l[(i * 163) % NV] = 5.0f;
	struct engine_sampler_params p;
	plain_params(&p);
	p.top_p = 0.9f;
	engine_sampler *s = make(&p, NV);
	if (!s)
		return;
	for (int k = 0; k < 500; k++) {
		int32_t id = engine_sampler_sample(s, l);
		CHECK(id >= 0 && id < NV && l[id] == 5.0f);
	}
	engine_sampler_free(s);
}

static void test_penalties(void)
{
	float l[4] = {2.0f, 1.8f, -1.0f, 0.5f};
	struct engine_sampler_params p;
	plain_params(&p);
	p.temp = 0.0f;
	engine_sampler *s;

	/* repeat: 2.0 / 1.5 = 1.33 < 1.8 */
	p.repeat_penalty = 1.5f;
	s = make(&p, 4);
	if (!s)
		return;
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0);
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_reset(s);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0);
	engine_sampler_free(s);

	/* repeat is sign-aware: -1.0 * 1.5 = -1.5 < -1.2 */
	float neg[2] = {-1.0f, -1.2f};
	s = make(&p, 2);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, neg), 1);
	engine_sampler_free(s);

	/* presence: 2.0 - 0.5 = 1.5 < 1.8; 2.0 - 0.1 = 1.9 > 1.8 */
	plain_params(&p);
	p.temp = 0.0f;
	p.presence_penalty = 0.5f;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_free(s);
	p.presence_penalty = 0.1f;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0); /* presence ignores the count */
	engine_sampler_free(s);

	/* frequency: 2.0 - 1 * 0.15 = 1.85 > 1.8; 2.0 - 2 * 0.15 = 1.7 < 1.8 */
	plain_params(&p);
	p.temp = 0.0f;
	p.freq_penalty = 0.15f;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0);
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_free(s);

	/* repeat then frequency: 2.0 / 1.1 - 0.1 = 1.718 < 1.8 */
	p.freq_penalty = 0.1f;
	p.repeat_penalty = 1.1f;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_free(s);

	/* the window: with last_n 2, token 0 falls out after two more */
	plain_params(&p);
	p.temp = 0.0f;
	p.repeat_penalty = 1.5f;
	p.penalty_last_n = 2;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	engine_sampler_accept(s, 3);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_accept(s, 3);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0);
	engine_sampler_accept(s, 99); /* out of range: ignored */
	engine_sampler_accept(s, -1);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0);
	engine_sampler_free(s);

	/* window 0: penalties off */
	p.penalty_last_n = 0;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 0);
	engine_sampler_free(s);

	/* window -1: the whole history */
	p.penalty_last_n = -1;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	for (int i = 0; i < 1000; i++)
		engine_sampler_accept(s, 3);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_free(s);

	/* penalties apply before sampling too: with the top token penalized
	 * away, top_k 1 picks the runner-up */
	plain_params(&p);
	p.top_k = 1;
	p.repeat_penalty = 1.5f;
	s = make(&p, 4);
	if (!s)
		return;
	engine_sampler_accept(s, 0);
	CHECK_EQ_INT(engine_sampler_sample(s, l), 1);
	engine_sampler_free(s);
}

/* logit_bias: a ban is never drawn (greedy or not, whatever the seed), a
 * bias moves the argmax, ids outside the vocabulary are refused, and when
 * everything else is banned the one token left is chosen. */
static void test_logit_bias(void)
{
	enum { NV = 64 };
	float l[NV];
	for (int i = 0; i < NV; i++)
		l[i] = (float)(i % 7) * 0.5f;
	l[10] = 9.0f; /* the argmax */
	l[11] = 8.0f;
	struct engine_sampler_params p;
	plain_params(&p);
	p.temp = 0.0f;
	int32_t ids[] = {10, 3};
	float bias[] = {-100.0f, 20.0f};
	p.bias_ids = ids;
	p.bias = bias;
	p.n_bias = 1;
	engine_sampler *s = make(&p, NV);
	if (s)
		CHECK_EQ_INT(engine_sampler_sample(s, l), 11); /* the ban moves it on */
	engine_sampler_free(s);
	p.n_bias = 2;
	s = make(&p, NV);
	if (s)
		CHECK_EQ_INT(engine_sampler_sample(s, l), 3); /* 1.5 + 20 wins */
	engine_sampler_free(s);

	/* sampling: the banned argmax never comes out in 2000 draws */
	plain_params(&p);
	p.bias_ids = ids;
	p.bias = bias;
	p.n_bias = 1;
	for (uint64_t seed = 0; seed < 20; seed++) {
		p.seed = seed;
		s = make(&p, NV);
		int hits = 0;
		for (int k = 0; s && k < 100; k++)
			hits += engine_sampler_sample(s, l) == 10;
		CHECK_MSG(hits == 0, "seed %llu: the banned token came %d times",
			  (unsigned long long)seed, hits);
		engine_sampler_free(s);
	}

	/* every token banned but one, even below the others */
	int32_t all[NV - 1];
	float ban[NV - 1];
	for (int i = 0, k = 0; i < NV; i++)
		if (i != 40) {
			all[k] = i;
			ban[k++] = -100.0f;
		}
	l[40] = -1e30f;
	p.bias_ids = all;
	p.bias = ban;
	p.n_bias = NV - 1;
	for (int greedy = 0; greedy < 2; greedy++) {
		p.temp = greedy ? 0.0f : 1.0f;
		s = make(&p, NV);
		if (s)
			CHECK_EQ_INT(engine_sampler_sample(s, l), 40);
		engine_sampler_free(s);
	}
	/* with every logit -inf too, the first token not banned */
	float dead[NV];
	for (int i = 0; i < NV; i++)
		dead[i] = -INFINITY;
	s = make(&p, NV);
	if (s)
		CHECK_EQ_INT(engine_sampler_sample(s, dead), 40);
	engine_sampler_free(s);

	/* ids outside the vocabulary, NaN */
	int32_t bad_id[] = {NV};
	float one[] = {1.0f}, nan_b[] = {NAN};
	p.bias_ids = bad_id;
	p.bias = one;
	p.n_bias = 1;
	struct cm_err err = {0};
	engine_sampler *t = NULL;
	CHECK(engine_sampler_new(&p, NV, &t, &err) == -EINVAL && !t);
	CHECK(strstr(err.msg, "not in the vocabulary") != NULL);
	int32_t neg[] = {-1};
	p.bias_ids = neg;
	CHECK(engine_sampler_new(&p, NV, &t, &err) == -EINVAL && !t);
	p.bias_ids = ids;
	p.bias = nan_b;
	CHECK(engine_sampler_new(&p, NV, &t, &err) == -EINVAL && !t);
}

/* engine_logprobs: a log softmax of the raw logits, the top list best
 * first with ties to the lower id, NaN as -inf, degenerate inputs. */
static void test_logprobs(void)
{
	enum { NV = 300 };
	float l[NV];
	for (int i = 0; i < NV; i++)
		l[i] = sinf((float)i * 0.37f) * 4.0f;
	l[7] = NAN;
	l[100] = l[200] = 6.0f; /* a tie at the top */
	int32_t ids[5];
	float lps[5];
	double z = 0.0;
	for (int i = 0; i < NV; i++)
		if (i != 7)
			z += exp((double)l[i]);
	float lp = engine_logprobs(l, NV, 3, 5, ids, lps);
	CHECK(fabs(lp - (l[3] - log(z))) < 1e-5);
	CHECK(ids[0] == 100 && ids[1] == 200);
	CHECK(fabs(lps[0] - (6.0 - log(z))) < 1e-5 && lps[0] == lps[1]);
	for (int k = 1; k < 5; k++)
		CHECK(lps[k] <= lps[k - 1]);
	double sum = 0.0;
	for (int i = 0; i < NV; i++)
		sum += exp((double)engine_logprobs(l, NV, i, 0, NULL, NULL));
	CHECK_MSG(fabs(sum - 1.0) < 1e-5, "probabilities sum to %g", sum);
	CHECK(engine_logprobs(l, NV, 7, 0, NULL, NULL) == -INFINITY);
	CHECK(engine_logprobs(l, NV, NV, 0, NULL, NULL) == -INFINITY);
	/* more than the vocabulary asked for */
	int32_t ids3[8];
	float lps3[8];
	float two[2] = {0.0f, 0.0f};
	CHECK(fabs(engine_logprobs(two, 2, 1, 8, ids3, lps3) - logf(0.5f)) < 1e-6);
	CHECK(ids3[0] == 0 && ids3[1] == 1);
	/* +inf dominates; all -inf has no finite value */
	float inf[3] = {1.0f, INFINITY, 2.0f};
	CHECK(engine_logprobs(inf, 3, 1, 1, ids3, lps3) == 0.0f && ids3[0] == 1);
	CHECK(engine_logprobs(inf, 3, 0, 0, NULL, NULL) == -INFINITY);
	float dead[2] = {-INFINITY, -INFINITY};
	CHECK(engine_logprobs(dead, 2, 0, 0, NULL, NULL) == -INFINITY);
}

int main(void)
{
	TEST_RUN(test_defaults);
	TEST_RUN(test_bad_params);
	TEST_RUN(test_greedy);
	TEST_RUN(test_top_k1_is_greedy);
	TEST_RUN(test_seed);
	TEST_RUN(test_distribution);
	TEST_RUN(test_filters);
	TEST_RUN(test_top_p_large);
	TEST_RUN(test_penalties);
	TEST_RUN(test_logit_bias);
	TEST_RUN(test_logprobs);
	return test_finish();
}
