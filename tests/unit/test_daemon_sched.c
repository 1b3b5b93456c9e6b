/* tests/unit/test_daemon_sched.c: the scheduler's prompt rules
 * (daemon/sched.c, add_prefill), step by step, without a model or threads.
 *
 * The daemon's timing tests (test_daemon_serve, edgelm-bench --daemon)
 * measure the effect of these rules; this checks the rules themselves:
 * shortest remaining prompt first; a short prompt whole, past the chunk; a
 * long one cut to the chunk (and reported cut); no partial chunk beside a
 * prompt that completes; but a long prompt passed over PREFILL_MAX_WAIT
 * steps in a row takes its chunk anyway, so that a steady stream of short
 * prompts cannot starve it (a regression test: it could, before).
 *
 * sched.c is included to reach its static functions; the library's copy
 * is then never linked (every symbol it defines is defined here). */
#include "daemon/sched.c"

#include "tests/test.h"

enum { SLOTS = 4, CAP = 4096 };

struct fixture {
	struct sched s;
	struct slot slots[SLOTS];
	struct daemon_request req[SLOTS];
	int32_t tok[CAP], pos[CAP], seq[CAP];
	bool want[CAP];
	struct daemon_request *breq[CAP];
};

static struct fixture *fixture_new(void)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->s.slots = f->slots;
	f->s.n_slots = SLOTS;
	f->s.b_tok = f->tok;
	f->s.b_pos = f->pos;
	f->s.b_seq = f->seq;
	f->s.b_want = f->want;
	f->s.b_req = f->breq;
	f->s.b_cap = CAP;
	return f;
}

static void fixture_free(struct fixture *f)
{
	if (!f)
		return;
	for (int i = 0; i < SLOTS; i++) {
		free(f->req[i].prompt);
		free(f->slots[i].tokens);
	}
	free(f);
}

/* A running request with an n-token prompt in slot i (replacing any) */
static struct daemon_request *put(struct fixture *f, int i, int n)
{
	struct daemon_request *r = &f->req[i];
	free(r->prompt);
	free(f->slots[i].tokens);
	memset(r, 0, sizeof(*r));
	r->prompt = calloc((size_t)n, sizeof(int32_t));
	f->slots[i].tokens = calloc((size_t)n + 1, sizeof(int32_t));
	for (int k = 0; k < n; k++)
		r->prompt[k] = 100 * i + k % 100;
	r->n_prompt = n;
	r->slot = i;
	r->state = RQ_RUNNING;
	f->slots[i].req = r;
	f->slots[i].n_tokens = 0;
	return r;
}

/* One step's prompt tokens: returns how many slot i got */
static int step(struct fixture *f, int budget, int room, int *ret_added, bool *ret_chunked,
		int counts[SLOTS])
{
	bool chunked = false;
	int added = add_prefill(&f->s, 0, budget, room, &chunked);
	for (int i = 0; i < SLOTS; i++)
		counts[i] = 0;
	for (int k = 0; k < added; k++)
		counts[f->seq[k]]++;
	if (ret_added)
		*ret_added = added;
	if (ret_chunked)
		*ret_chunked = chunked;
	return added;
}

static void test_rules(void)
{
	struct fixture *f = fixture_new();
	CHECK(f != NULL);
	if (!f)
		return;
	int c[SLOTS], added;
	bool chunked;

	/* a long prompt alone: cut to the chunk, and said so */
	struct daemon_request *lr = put(f, 0, 100);
	step(f, 8, 512, &added, &chunked, c);
	CHECK_EQ_INT(added, 8);
	CHECK_EQ_INT(c[0], 8);
	CHECK(chunked);
	CHECK_EQ_INT(lr->n_fed, 8);
	/* tokens and positions in order, logits only for a prompt's last */
	for (int k = 0; k < 8; k++) {
		CHECK_EQ_INT(f->pos[k], k);
		CHECK_EQ_INT(f->tok[k], lr->prompt[k]);
		CHECK(!f->want[k]);
	}

	/* a short prompt arrives: whole (20 > the chunk of 8), first, and
	 * the long one carries nothing in that step */
	put(f, 1, 20);
	step(f, 8, 512, &added, &chunked, c);
	CHECK_EQ_INT(c[1], 20);
	CHECK_EQ_INT(c[0], 0);
	CHECK(!chunked);
	CHECK(f->want[19] && f->seq[19] == 1);

	/* next step, the long one goes on */
	step(f, 8, 512, &added, &chunked, c);
	CHECK_EQ_INT(c[0], 8);
	CHECK_EQ_INT(lr->n_fed, 16);

	/* shortest remaining first: 30 and 10 tokens, both whole */
	put(f, 1, 30);
	put(f, 2, 10);
	step(f, 8, 512, &added, NULL, c);
	CHECK_EQ_INT(c[2], 10);
	CHECK_EQ_INT(c[1], 30);
	CHECK_EQ_INT(f->seq[0], 2);
	CHECK_EQ_INT(c[0], 0);

	/* a full batch: nothing past the room */
	put(f, 1, 30);
	put(f, 2, 10);
	step(f, 8, 12, &added, NULL, c);
	CHECK_EQ_INT(added, 10); /* the 10 fit, the 30 do not */
	CHECK_EQ_INT(c[1], 0);
	fixture_free(f);
}

/* A short prompt completing in every step must not starve the long one:
 * it gets its chunk at least every PREFILL_MAX_WAIT + 1 steps. */
static void test_no_starvation(void)
{
	struct fixture *f = fixture_new();
	CHECK(f != NULL);
	if (!f)
		return;
	struct daemon_request *lr = put(f, 0, 1000);
	int c[SLOTS], longest_wait = 0, wait = 0, fed_steps = 0;
	for (int st = 0; st < 60; st++) {
		put(f, 1 + st % 2, 12); /* a new short prompt every step */
		step(f, 8, 512, NULL, NULL, c);
		CHECK_EQ_INT(c[1 + st % 2], 12);
		if (c[0] > 0) {
			fed_steps++;
			wait = 0;
		} else if (++wait > longest_wait) {
			longest_wait = wait;
		}
	}
	CHECK_MSG(longest_wait <= PREFILL_MAX_WAIT, "the long prompt waited %d steps in a row",
		  longest_wait);
	CHECK_MSG(fed_steps >= 60 / (PREFILL_MAX_WAIT + 1), "fed in %d of 60 steps", fed_steps);
	CHECK_EQ_INT(lr->n_fed, 8 * fed_steps);
	fixture_free(f);
}

int main(void)
{
	TEST_RUN(test_rules);
	TEST_RUN(test_no_starvation);
	return test_finish();
}
