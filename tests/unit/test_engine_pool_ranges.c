/* tests/unit/test_engine_pool_ranges.c: claiming work in per-worker ranges with
 * stealing (engine/threadpool.c, pool_ranges_*; used by engine/matmul.c).
 *
 * Alone, a participant takes its own range front to back, then the others'
 * from their backs; concurrently, every item is handed out exactly once,
 * each participant's own items come in increasing order (the contiguous
 * stream the matmul wants), and a participant that arrives late, or never,
 * has its range finished by the others. Edge cases: no items, fewer items
 * than ranges, more participants than ranges. */
#include "engine/engine_impl.h"
#include "tests/test.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void test_alone(void)
{
	struct pool_ranges r;
	/* 10 items, 2 ranges: [0, 5) and [5, 10) */
	engine_pool_ranges_init(&r, 10, 2);
	const int64_t want[] = {0, 1, 2, 3, 4, 9, 8, 7, 6, 5};
	for (size_t i = 0; i < CM_ARRAY_LEN(want); i++)
		CHECK_EQ_INT(engine_pool_ranges_claim(&r, 0), want[i]);
	CHECK_EQ_INT(engine_pool_ranges_claim(&r, 0), -1);
	CHECK_EQ_INT(engine_pool_ranges_claim(&r, 1), -1);

	/* participant 1 first: its own range, then range 0 from the back */
	engine_pool_ranges_init(&r, 5, 2);
	const int64_t want1[] = {2, 3, 4, 1, 0};
	for (size_t i = 0; i < CM_ARRAY_LEN(want1); i++)
		CHECK_EQ_INT(engine_pool_ranges_claim(&r, 1), want1[i]);
	CHECK_EQ_INT(engine_pool_ranges_claim(&r, 1), -1);
}

static void test_edges(void)
{
	struct pool_ranges r;
	engine_pool_ranges_init(&r, 0, 4);
	CHECK_EQ_INT(engine_pool_ranges_claim(&r, 0), -1);
	CHECK_EQ_INT(engine_pool_ranges_claim(&r, 3), -1);

	/* fewer items than ranges: one item per range, nothing lost */
	engine_pool_ranges_init(&r, 3, 8);
	CHECK_EQ_INT(r.n, 3);
	int seen[3] = {0};
	int64_t c;
	for (int k = 0; k < 3; k++) {
		c = engine_pool_ranges_claim(&r, 7); /* 7 % 3: range 1 */
		CHECK(c >= 0 && c < 3);
		if (c >= 0 && c < 3)
			seen[c]++;
	}
	CHECK_EQ_INT(engine_pool_ranges_claim(&r, 7), -1);
	CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);

	/* more participants than POOL_RANGES, and n <= 0 */
	engine_pool_ranges_init(&r, 1000, 1000);
	CHECK_EQ_INT(r.n, POOL_RANGES);
	engine_pool_ranges_init(&r, 1000, 0);
	CHECK_EQ_INT(r.n, 1);
	int64_t sum = 0, n = 0;
	while ((c = engine_pool_ranges_claim(&r, 5)) >= 0) {
		sum += c;
		n++;
	}
	CHECK_EQ_INT(n, 1000);
	CHECK_EQ_INT(sum, 999 * 1000 / 2);
}

enum { TOTAL = 200000, THREADS = 4 };

struct run {
	struct pool_ranges *r;
	_Atomic int *count; /* per item */
	int ith;
	int delay_ms; /* before the first claim; < 0: never claims */
	pthread_barrier_t *bar;
	int64_t got, own, own_unordered;
};

static void *worker(void *arg)
{
	struct run *w = arg;
	pthread_barrier_wait(w->bar);
	if (w->delay_ms < 0)
		return NULL;
	if (w->delay_ms > 0)
		nanosleep(&(struct timespec){0, w->delay_ms * 1000000L}, NULL);
	int64_t lo = (int64_t)TOTAL * w->ith / THREADS, hi = (int64_t)TOTAL * (w->ith + 1) / THREADS;
	int64_t last_own = -1, c;
	while ((c = engine_pool_ranges_claim(w->r, w->ith)) >= 0) {
		atomic_fetch_add(&w->count[c], 1);
		w->got++;
		if (c >= lo && c < hi) {
			w->own++;
			/* own items come front to back (a thief takes from
			 * the back, so the owner never sees a smaller one) */
			if (c <= last_own)
				w->own_unordered++;
			last_own = c;
		}
		/* a little work per item, so that the threads overlap */
		for (volatile int k = 0; k < 50; k++)
			;
	}
	return NULL;
}

/* delays[i] for participant i; returns items claimed by participant 1 */
static int64_t run_threads(const int delays[THREADS])
{
	struct pool_ranges r;
	_Atomic int *count = calloc(TOTAL, sizeof(*count));
	CHECK(count != NULL);
	if (!count)
		return -1;
	engine_pool_ranges_init(&r, TOTAL, THREADS);
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, THREADS);
	pthread_t th[THREADS];
	struct run w[THREADS];
	for (int i = 0; i < THREADS; i++) {
		w[i] = (struct run){.r = &r, .count = count, .ith = i, .delay_ms = delays[i],
				    .bar = &bar};
		pthread_create(&th[i], NULL, worker, &w[i]);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
	int bad = 0;
	for (int i = 0; i < TOTAL; i++)
		bad += count[i] != 1;
	CHECK_MSG(bad == 0, "%d items not handed out exactly once", bad);
	int64_t got = 0;
	for (int i = 0; i < THREADS; i++) {
		got += w[i].got;
		CHECK_MSG(w[i].own_unordered == 0, "participant %d: %lld own items out of order", i,
			  (long long)w[i].own_unordered);
	}
	CHECK_EQ_INT(got, TOTAL);
	free(count);
	return w[1].got;
}

static void test_concurrent(void)
{
	const int none[THREADS] = {0, 0, 0, 0};
	run_threads(none);
}

static void test_late_and_absent(void)
{
	/* participant 1 arrives 100 ms late: the others have finished its
	 * range by then (the run is a few ms of work) */
	const int late[THREADS] = {0, 100, 0, 0};
	int64_t g = run_threads(late);
	CHECK_MSG(g < TOTAL / THREADS, "the late participant still had its whole range (%lld)",
		  (long long)g);
	/* participant 1 never comes; participant 3 neither */
	const int absent[THREADS] = {0, -1, 0, -1};
	CHECK_EQ_INT(run_threads(absent), 0);
}

static int my_cpus(char *buf, size_t cap)
{
	cpu_set_t set;
	int n = 0;
	buf[0] = '\0';
	if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0)
		return -1;
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set)) {
			size_t l = strlen(buf);
			snprintf(buf + l, cap - l, "%s%d", n++ ? "," : "", i);
		}
	return n;
}

struct bind_arg {
	struct pool *p;
	char cpus[256];
};

static void *bind_thread(void *argp)
{
	struct bind_arg *a = argp;
	engine_pool_bind_caller(a->p);
	my_cpus(a->cpus, sizeof(a->cpus));
	return NULL;
}

/* Worker 0 is the thread that decodes: making a pinned pool leaves the
 * maker's affinity alone (edgelmd's main thread, and the IPC threads it
 * starts after loading, had been pinned to worker 0's cpu with it), and
 * binding pins the caller. */
static void test_bind_caller(void)
{
	char before[256], after[256];
	if (my_cpus(before, sizeof(before)) < 2) {
		TEST_SKIP("this thread may run on one cpu only: nothing to tell apart");
		return;
	}
	int last = -1;
	cpu_set_t set;
	CHECK(pthread_getaffinity_np(pthread_self(), sizeof(set), &set) == 0);
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set))
			last = i;
	struct pool *p = NULL;
	struct cm_err err = {0};
	int cpus[2] = {last, last};
	CHECK_OK(engine_pool_new(2, cpus, 2, &p, &err));
	if (!p)
		return;
	my_cpus(after, sizeof(after));
	CHECK_STREQ(after, before);
	struct bind_arg a = {.p = p};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, bind_thread, &a) == 0);
	pthread_join(th, NULL);
	char want[16];
	snprintf(want, sizeof(want), "%d", last);
	CHECK_STREQ(a.cpus, want);
	my_cpus(after, sizeof(after));
	CHECK_STREQ(after, before);
	engine_pool_free(p);
}

int main(void)
{
	TEST_RUN(test_alone);
	TEST_RUN(test_edges);
	TEST_RUN(test_concurrent);
	TEST_RUN(test_late_and_absent);
	TEST_RUN(test_bind_caller);
	return test_finish();
}
