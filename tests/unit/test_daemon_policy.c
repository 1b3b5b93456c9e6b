/* tests/unit/test_daemon_policy.c: the batching policy (daemon/policy.h)
 * step by step, without a model, threads or a daemon.
 *
 * - prompt shares: shortest remaining first; a short prompt whole, past
 *   the chunk; a long one cut to the chunk (and reported cut); no partial
 *   chunk beside a prompt that completes; but a long prompt passed over
 *   POLICY_PREFILL_MAX_WAIT steps in a row takes its chunk anyway, so a
 *   steady stream of short prompts cannot starve it;
 * - fair share: one identity's 20 queued requests do not hold back
 *   another's one; weights; priorities within an identity; an identity
 *   back from idleness earns no credit; prefill shares by identity;
 * - the prefix cache's slot choice; tenant_weights parsing. */
#include "daemon/policy.h"

#include "tests/test.h"

enum { N = 4 };

struct seqs {
	struct policy_prefill_seq s[N];
	int left[N], waited[N], fed[N];
	int n;
};

/* One step over the prompts with left[i] > 0; counts[i] = tokens i got. */
static int step(struct policy *p, struct seqs *q, const int tenant[N], int budget, int room,
		bool *ret_chunked, int counts[N])
{
	q->n = 0;
	for (int i = 0; i < N; i++) {
		counts[i] = 0;
		if (q->left[i] > 0)
			q->s[q->n++] = (struct policy_prefill_seq){tenant ? tenant[i] : 0, q->left[i],
								   &q->waited[i], 0, &counts[i]};
	}
	bool chunked = false;
	int added = policy_prefill(p, q->s, q->n, budget, room, &chunked);
	int sum = 0;
	for (int i = 0; i < q->n; i++) {
		*(int *)q->s[i].user = q->s[i].take;
		sum += q->s[i].take;
	}
	CHECK_EQ_INT(sum, added);
	for (int i = 0; i < N; i++) {
		q->left[i] -= counts[i];
		q->fed[i] += counts[i];
	}
	if (ret_chunked)
		*ret_chunked = chunked;
	return added;
}

static void put(struct seqs *q, int i, int n)
{
	q->left[i] = n;
	q->fed[i] = 0;
	q->waited[i] = 0;
}

static void test_policy_prefill_rules(void)
{
	struct policy p;
	CHECK_OK(policy_init(&p, NULL));
	CHECK_EQ_INT(policy_tenant_get(&p, "uid:0"), 0);
	struct seqs q = {0};
	int c[N];
	bool chunked;

	/* a long prompt alone: cut to the chunk, and said so */
	put(&q, 0, 100);
	CHECK_EQ_INT(step(&p, &q, NULL, 8, 512, &chunked, c), 8);
	CHECK_EQ_INT(c[0], 8);
	CHECK(chunked);
	/* a short prompt arrives: whole (20 > the chunk of 8), and the long
	 * one carries nothing in that step */
	put(&q, 1, 20);
	step(&p, &q, NULL, 8, 512, &chunked, c);
	CHECK_EQ_INT(c[1], 20);
	CHECK_EQ_INT(c[0], 0);
	CHECK(!chunked);
	/* next step, the long one goes on */
	step(&p, &q, NULL, 8, 512, &chunked, c);
	CHECK_EQ_INT(c[0], 8);
	CHECK_EQ_INT(q.fed[0], 16);
	/* shortest remaining first: 30 and 10 tokens, both whole */
	put(&q, 1, 30);
	put(&q, 2, 10);
	step(&p, &q, NULL, 8, 512, NULL, c);
	CHECK_EQ_INT(c[2], 10);
	CHECK_EQ_INT(c[1], 30);
	CHECK(q.s[0].user == &c[2]); /* the 10 first */
	CHECK_EQ_INT(c[0], 0);
	/* a full batch: nothing past the room */
	put(&q, 1, 30);
	put(&q, 2, 10);
	CHECK_EQ_INT(step(&p, &q, NULL, 8, 12, NULL, c), 10); /* the 10 fit, the 30 do not */
	CHECK_EQ_INT(c[1], 0);
	policy_fini(&p);
}

/* A short prompt completing in every step must not starve the long one. */
static void test_policy_no_starvation(void)
{
	struct policy p;
	CHECK_OK(policy_init(&p, NULL));
	policy_tenant_get(&p, "uid:0");
	struct seqs q = {0};
	put(&q, 0, 1000);
	int c[N], longest_wait = 0, wait = 0, fed_steps = 0;
	for (int st = 0; st < 60; st++) {
		put(&q, 1 + st % 2, 12); /* a new short prompt every step */
		step(&p, &q, NULL, 8, 512, NULL, c);
		CHECK_EQ_INT(c[1 + st % 2], 12);
		if (c[0] > 0) {
			fed_steps++;
			wait = 0;
		} else if (++wait > longest_wait) {
			longest_wait = wait;
		}
	}
	CHECK_MSG(longest_wait <= POLICY_PREFILL_MAX_WAIT, "the long prompt waited %d steps",
		  longest_wait);
	CHECK_MSG(fed_steps >= 60 / (POLICY_PREFILL_MAX_WAIT + 1), "fed in %d of 60 steps",
		  fed_steps);
	CHECK_EQ_INT(q.fed[0], 8 * fed_steps);
	policy_fini(&p);
}

/* Two identities with long prompts share the prompt tokens by weight. */
static void test_policy_prefill_tenants(void)
{
	struct policy p;
	CHECK_OK(policy_init(&p, NULL));
	struct policy_weight w[1];
	int nw = 0;
	CHECK_OK(policy_weights_parse("uid:2=3", w, &nw, NULL));
	policy_set_weights(&p, w, nw);
	int a = policy_tenant_get(&p, "uid:1"), b = policy_tenant_get(&p, "uid:2");
	int tenant[N] = {a, a, b, b};
	struct seqs q = {0};
	/* uid:1 has two long prompts, uid:2 two (weight 3) */
	for (int i = 0; i < N; i++)
		put(&q, i, 100000);
	int c[N];
	for (int st = 0; st < 400; st++)
		step(&p, &q, tenant, 64, 512, NULL, c);
	double fa = q.fed[0] + q.fed[1], fb = q.fed[2] + q.fed[3];
	CHECK_MSG(fb / fa > 2.5 && fb / fa < 3.5, "uid:1 %.0f tokens, uid:2 %.0f (weight 3)", fa,
		  fb);
	policy_fini(&p);
}

struct item {
	struct policy_item qi;
	int who, n;
};

/* uid A queues 20, then uid B one: B's is admitted next. */
static void test_policy_fair_admission(void)
{
	struct policy p;
	CHECK_OK(policy_init(&p, NULL));
	struct item it[21];
	int a = policy_tenant_get(&p, "uid:1000");
	for (int i = 0; i < 20; i++) {
		it[i] = (struct item){.qi = {.tenant = a}, .who = 0, .n = i};
		policy_enqueue(&p, &it[i].qi);
	}
	/* A's first is admitted, then B arrives */
	struct item *first = (struct item *)policy_next(&p);
	CHECK(first == &it[0]);
	int b = policy_tenant_get(&p, "uid:1001");
	it[20] = (struct item){.qi = {.tenant = b}, .who = 1, .n = 0};
	policy_enqueue(&p, &it[20].qi);
	struct item *next = (struct item *)policy_next(&p);
	CHECK(next == &it[20]);
	/* then A's in order */
	for (int i = 1; i < 20; i++) {
		struct item *x = (struct item *)policy_next(&p);
		CHECK(x == &it[i]);
	}
	CHECK(policy_next(&p) == NULL);
	CHECK_EQ_INT(p.n_queued, 0);
	policy_fini(&p);
}

/* Weights: 3:1 shares while both have work; an idle identity earns no
 * credit; priorities order one identity's own queue. */
static void test_policy_weights(void)
{
	struct policy p;
	CHECK_OK(policy_init(&p, NULL));
	struct policy_weight w[4];
	int nw = 0;
	CHECK_OK(policy_weights_parse("uid:1=3, 2=1", w, &nw, NULL));
	CHECK_EQ_INT(nw, 2);
	CHECK_STREQ(w[1].name, "uid:2");
	policy_set_weights(&p, w, nw);
	int a = policy_tenant_get(&p, "uid:1"), b = policy_tenant_get(&p, "uid:2");
	static struct item it[200];
	for (int i = 0; i < 100; i++) {
		it[i] = (struct item){.qi = {.tenant = a}, .who = 0};
		it[100 + i] = (struct item){.qi = {.tenant = b}, .who = 1};
		policy_enqueue(&p, &it[i].qi);
		policy_enqueue(&p, &it[100 + i].qi);
	}
	int got[2] = {0};
	for (int k = 0; k < 80; k++)
		got[((struct item *)policy_next(&p))->who]++;
	CHECK_MSG(got[0] == 60 && got[1] == 20, "3:1 weights gave %d:%d", got[0], got[1]);
	/* drain b, let a run alone for a while, then b comes back: b does not
	 * get a burst for the time it was away */
	while (p.tenants[b].n_queued) {
		struct item *x = (struct item *)policy_next(&p);
		if (x->who == 0)
			policy_enqueue(&p, &x->qi);
	}
	for (int k = 0; k < 30; k++) {
		struct item *x = (struct item *)policy_next(&p);
		CHECK_EQ_INT(x->who, 0);
		policy_enqueue(&p, &x->qi);
	}
	for (int i = 0; i < 10; i++)
		policy_enqueue(&p, &it[100 + i].qi);
	int run_b = 0, max_run_b = 0;
	for (int k = 0; k < 20; k++) {
		struct item *x = (struct item *)policy_next(&p);
		run_b = x->who == 1 ? run_b + 1 : 0;
		max_run_b = CM_MAX(max_run_b, run_b);
		policy_enqueue(&p, &x->qi);
	}
	CHECK_MSG(max_run_b <= 1, "b came back and ran %d in a row", max_run_b);
	/* priorities within one identity */
	struct policy p2;
	CHECK_OK(policy_init(&p2, NULL));
	int t = policy_tenant_get(&p2, "anonymous");
	struct item lo = {.qi = {.tenant = t, .priority = -1}}, hi = {.qi = {.tenant = t, .priority = 5}},
		    mid = {.qi = {.tenant = t}};
	policy_enqueue(&p2, &lo.qi);
	policy_enqueue(&p2, &mid.qi);
	policy_enqueue(&p2, &hi.qi);
	CHECK(policy_next(&p2) == &hi.qi);
	CHECK(policy_next(&p2) == &mid.qi);
	policy_dequeue(&p2, &lo.qi); /* removal from anywhere */
	CHECK(policy_next(&p2) == NULL);
	policy_fini(&p2);
	policy_fini(&p);
}

static void test_policy_tenants(void)
{
	struct policy p;
	CHECK_OK(policy_init(&p, NULL));
	int a = policy_tenant_get(&p, "uid:5");
	CHECK_EQ_INT(policy_tenant_get(&p, "uid:5"), a);
	CHECK_EQ_INT(policy_tenant_find(&p, "uid:5"), a);
	CHECK_EQ_INT(policy_tenant_find(&p, "uid:6"), -1);
	policy_tenant_put(&p, a);
	CHECK_EQ_INT(policy_tenant_find(&p, "uid:5"), a);
	policy_tenant_put(&p, a);
	CHECK_EQ_INT(policy_tenant_find(&p, "uid:5"), -1); /* no live requests: gone */
	/* many identities over time reuse entries */
	for (int i = 0; i < 5000; i++) {
		char name[32];
		snprintf(name, sizeof(name), "uid:%d", i);
		int t = policy_tenant_get(&p, name);
		CHECK(t >= 0);
		policy_tenant_put(&p, t);
	}
	CHECK(p.n_tenants <= 2);
	char id[POLICY_NAME_MAX];
	policy_identity(1000, id, sizeof(id));
	CHECK_STREQ(id, "uid:1000");
	policy_identity(-1, id, sizeof(id));
	CHECK_STREQ(id, "anonymous");
	/* bad weights */
	static const char *bad[] = {"x", "uid:1", "uid:1=0", "uid:1=-2", "uid:1=1001", "uid:1=abc",
				    "no-such-user-here=2", "=3"};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++)
		CHECK_MSG(policy_weights_parse(bad[i], NULL, NULL, NULL) != 0, "'%s' accepted",
			  bad[i]);
	int nw = -1;
	CHECK_OK(policy_weights_parse("", NULL, &nw, NULL));
	CHECK_EQ_INT(nw, 0);
	struct policy_weight w[2];
	CHECK_OK(policy_weights_parse("root=2.5", w, &nw, NULL));
	CHECK_STREQ(w[0].name, "uid:0");
	CHECK_NEAR(w[0].weight, 2.5, 0);
	policy_fini(&p);
}

static void test_policy_pick_slot(void)
{
	int32_t a[] = {1, 2, 3, 4, 5}, b[] = {1, 2, 9}, prompt[] = {1, 2, 3, 4, 7};
	struct policy_slot sl[3] = {
		{false, a, 5, 10},
		{false, b, 3, 5},
		{true, prompt, 5, 1},
	};
	int reuse = -1;
	/* the longest common prefix (4 tokens) */
	CHECK_EQ_INT(policy_pick_slot(sl, 3, prompt, 5, true, &reuse), 0);
	CHECK_EQ_INT(reuse, 4);
	/* the whole prompt cached: its last token is computed again */
	CHECK_EQ_INT(policy_pick_slot(sl, 3, a, 5, true, &reuse), 0);
	CHECK_EQ_INT(reuse, 4);
	/* without the prefix cache: the least recently used free slot */
	CHECK_EQ_INT(policy_pick_slot(sl, 3, prompt, 5, false, &reuse), 1);
	CHECK_EQ_INT(reuse, 0);
	sl[0].busy = sl[1].busy = true;
	CHECK_EQ_INT(policy_pick_slot(sl, 3, prompt, 5, true, &reuse), -1);
}

static void test_policy_chunk(void)
{
	struct policy_chunk c = {0};
	CHECK_EQ_INT(policy_chunk_size(&c, 256, 0), 256);
	CHECK_EQ_INT(policy_chunk_size(&c, 256, 2), 4 * POLICY_PREFILL_CHUNK_MIN);
	policy_chunk_update(&c, 256, 0.010, 0, 1, false); /* a plain decode step: 10 ms */
	CHECK_EQ_INT(policy_chunk_size(&c, 256, 1), 16);
	/* chunked steps as long as a decode step grow the chunk; longer ones shrink it */
	for (int i = 0; i < 20; i++)
		policy_chunk_update(&c, 256, 0.005, 16, 17, true);
	CHECK_EQ_INT(policy_chunk_size(&c, 256, 1), 256);
	for (int i = 0; i < 20; i++)
		policy_chunk_update(&c, 256, 0.100, 64, 65, true);
	CHECK_EQ_INT(policy_chunk_size(&c, 256, 1), POLICY_PREFILL_CHUNK_MIN);
}

int main(void)
{
	TEST_RUN(test_policy_prefill_rules);
	TEST_RUN(test_policy_no_starvation);
	TEST_RUN(test_policy_prefill_tenants);
	TEST_RUN(test_policy_fair_admission);
	TEST_RUN(test_policy_weights);
	TEST_RUN(test_policy_tenants);
	TEST_RUN(test_policy_pick_slot);
	TEST_RUN(test_policy_chunk);
	return test_finish();
}
