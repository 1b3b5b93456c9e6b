/* engine/threadpool.c: persistent worker pool, spin-then-sleep, and runs
 * that a descheduled worker cannot stall.
 *
 * engine_pool_run(fn, arg) opens a run: it publishes (fn, arg), stamps a ticket
 * with the run's generation, and bumps the generation the idle workers
 * watch. The caller then calls fn itself as worker 0. A worker joins the
 * run by raising the ticket's count of active workers, which it may do only
 * while the ticket still carries this generation and is open. When the
 * caller's fn returns, all the work has been claimed (fn must claim work
 * from a shared counter: matmul chunks, attention heads), so the caller
 * closes the ticket and waits only for the workers that are inside fn. A
 * worker that was descheduled and wakes up late finds the ticket closed or
 * carrying a newer generation: it never runs a stale task, and nobody
 * waited for it. The price: fn may be called by fewer than nth workers;
 * each call has a distinct ith < nth, and the caller's is always 0.
 *
 * Waiting spins for a bounded time (a decode step issues a few hundred runs
 * per token, a few microseconds apart, so sleeping between them would cost
 * more than the work), then sleeps on a condition variable. Nothing here
 * allocates after engine_pool_new(). */
#include "engine/engine_impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long a waiter spins before it sleeps. 50 us covers the gap between
 * the runs of one token (norms, rope: microseconds) with room to spare,
 * and wastes little of a shared core when the next run is far away. */
#define SPIN_NS 50000ull

/* ticket: generation << 32 | CLOSED | number of workers inside fn */
#define T_CLOSED 0x80000000ull
#define T_ACTIVE 0x7fffffffull

struct worker {
	struct pool *p;
	int ith;
	int cpu; /* -1: not pinned */
	pthread_t th;
};

struct pool {
	int n;
	struct worker *w;
	pool_fn fn;
	void *arg;
	_Alignas(64) atomic_uint gen;
	_Alignas(64) _Atomic uint64_t ticket;
	_Alignas(64) atomic_int sleepers;
	atomic_bool stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* workers wait for a new generation */
	pthread_cond_t done_cv; /* caller waits for the active count to drop */
	bool caller_sleeping;
	bool bound;       /* a caller was pinned as worker 0 ... */
	pthread_t caller; /* ... this one (engine_pool_bind_caller) */
};

/* Spin until pred(p, v) is false or the spin budget is spent; returns
 * whether it is still true. */
static bool spin_while(bool (*pred)(struct pool *, unsigned), struct pool *p, unsigned v)
{
	uint64_t t0 = 0;
	for (unsigned i = 0;; i++) {
		if (!pred(p, v))
			return false;
		if ((i & 63) == 63) {
			uint64_t now = cm_now_ns();
			if (!t0)
				t0 = now;
			else if (now - t0 > SPIN_NS)
				return true;
		}
		cpu_relax();
	}
}

static bool gen_is(struct pool *p, unsigned seen)
{
	return atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
	       !atomic_load_explicit(&p->stop, memory_order_relaxed);
}

static bool workers_inside(struct pool *p, unsigned unused)
{
	(void)unused;
	return (atomic_load_explicit(&p->ticket, memory_order_acquire) & T_ACTIVE) != 0;
}

/* Join run g if it is still open; false if it closed or moved on. */
static bool try_enter(struct pool *p, unsigned g)
{
	uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
	for (;;) {
		if ((unsigned)(t >> 32) != g || (t & T_CLOSED))
			return false;
		if (atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1,
							  memory_order_acq_rel,
							  memory_order_acquire))
			return true;
	}
}

static void leave(struct pool *p)
{
	uint64_t t = atomic_fetch_sub_explicit(&p->ticket, 1, memory_order_acq_rel) - 1;
	if ((t & T_CLOSED) && (t & T_ACTIVE) == 0) {
		pthread_mutex_lock(&p->mu);
		if (p->caller_sleeping)
			pthread_cond_signal(&p->done_cv);
		pthread_mutex_unlock(&p->mu);
	}
}

static void *worker_main(void *argp)
{
	struct worker *w = argp;
	struct pool *p = w->p;
	char name[16];
	snprintf(name, sizeof(name), "edgelm:w%d", w->ith);
	pthread_setname_np(pthread_self(), name);
	if (w->cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(w->cpu, &set);
		/* Pinning is best-effort: a cpuset may forbid it. */
		(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	unsigned seen = atomic_load(&p->gen);
	for (;;) {
		if (spin_while(gen_is, p, seen)) {
			pthread_mutex_lock(&p->mu);
			atomic_fetch_add(&p->sleepers, 1);
			while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->cv, &p->mu);
			atomic_fetch_sub(&p->sleepers, 1);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			break;
		seen = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (!try_enter(p, seen))
			continue; /* late: the run is over or a newer one is open */
		p->fn(p->arg, w->ith, p->n);
		leave(p);
	}
	return NULL;
}

int engine_pool_new(int n_threads, const int *cpus, int n_cpus, struct pool **ret_pool, struct cm_err *err)
{
	if (n_threads < 1)
		n_threads = 1;
	struct pool *p = cm_calloc(1, sizeof(*p));
	if (!p)
		return cm_err_set(err, -ENOMEM, "threadpool: out of memory");
	p->n = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	pthread_cond_init(&p->done_cv, NULL);
	p->w = cm_calloc((size_t)n_threads, sizeof(*p->w));
	if (!p->w) {
		engine_pool_free(p);
		return cm_err_set(err, -ENOMEM, "threadpool: out of memory");
	}
	for (int i = 0; i < n_threads; i++) {
		p->w[i].p = p;
		p->w[i].ith = i;
		p->w[i].cpu = (cpus && n_cpus > 0) ? cpus[i % n_cpus] : -1;
	}
	/* Worker 0 is whoever runs the engine, which need not be the thread
	 * that made the pool (edgelmd loads on its main thread and decodes on
	 * its scheduler's): engine_pool_bind_caller pins that one. */
	for (int i = 1; i < n_threads; i++) {
		int r = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
		if (r != 0) {
			p->n = i; /* only join the ones that started */
			engine_pool_free(p);
			return cm_err_set(err, -r, "threadpool: cannot start worker %d: %s", i,
					  strerror(r));
		}
	}
	*ret_pool = p;
	return 0;
}

void engine_pool_free(struct pool *p)
{
	if (!p)
		return;
	if (p->w) {
		pthread_mutex_lock(&p->mu);
		atomic_store(&p->stop, true);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		for (int i = 1; i < p->n; i++)
			pthread_join(p->w[i].th, NULL);
		cm_free(p->w);
	}
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	pthread_cond_destroy(&p->done_cv);
	cm_free(p);
}

void engine_pool_bind_caller(struct pool *p)
{
	pthread_t self = pthread_self();
	if (p->w[0].cpu < 0 || (p->bound && pthread_equal(p->caller, self)))
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(p->w[0].cpu, &set);
	(void)pthread_setaffinity_np(self, sizeof(set), &set); /* best effort, as workers */
	p->caller = self;
	p->bound = true;
}

int engine_pool_size(const struct pool *p)
{
	return p->n;
}

void engine_pool_run(struct pool *p, pool_fn fn, void *arg)
{
	if (p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	/* No worker is inside fn here (the last run waited for them), and none
	 * can enter before the ticket names the new generation. */
	p->fn = fn;
	p->arg = arg;
	unsigned g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
	atomic_store_explicit(&p->ticket, (uint64_t)g << 32, memory_order_release);
	atomic_store(&p->gen, g); /* seq_cst: pairs with the sleepers check */
	if (atomic_load(&p->sleepers) > 0) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
	fn(arg, 0, p->n);
	atomic_fetch_or_explicit(&p->ticket, T_CLOSED, memory_order_acq_rel);
	if (spin_while(workers_inside, p, 0)) {
		pthread_mutex_lock(&p->mu);
		p->caller_sleeping = true;
		while (workers_inside(p, 0))
			pthread_cond_wait(&p->done_cv, &p->mu);
		p->caller_sleeping = false;
		pthread_mutex_unlock(&p->mu);
	}
}

/* ---- ranges ---------------------------------------------------------------- */

void engine_pool_ranges_init(struct pool_ranges *r, int64_t total, int n)
{
	n = CM_MAX(1, CM_MIN(n, POOL_RANGES));
	if (total < n)
		n = (int)CM_MAX(1, total);
	r->n = n;
	for (int i = 0; i < n; i++) {
		uint64_t f = (uint64_t)(total * i / n), b = (uint64_t)(total * (i + 1) / n);
		atomic_store_explicit(&r->r[i].fb, b << 32 | f, memory_order_relaxed);
	}
}

int64_t engine_pool_ranges_claim(struct pool_ranges *r, int ith)
{
	int own = ith % r->n;
	for (int k = 0; k < r->n; k++) {
		_Atomic uint64_t *p = &r->r[(own + k) % r->n].fb;
		uint64_t v = atomic_load_explicit(p, memory_order_relaxed);
		for (;;) {
			uint32_t f = (uint32_t)v, b = (uint32_t)(v >> 32);
			if (f >= b)
				break;
			/* the owner takes the front, a thief the back */
			uint64_t nv = k == 0 ? v + 1 : (uint64_t)(b - 1) << 32 | f;
			/* relaxed: items are only distributed; the run's end
			 * (engine_pool_run) orders the work done on them */
			if (atomic_compare_exchange_weak_explicit(p, &v, nv, memory_order_relaxed,
								  memory_order_relaxed))
				return k == 0 ? (int64_t)f : (int64_t)b - 1;
		}
	}
	return -1;
}
