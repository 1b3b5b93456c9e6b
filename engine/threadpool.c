/* engine/threadpool.c: persistent worker pool with a spin-then-sleep
 * barrier.
 *
 * pool_run() publishes (fn, arg) and bumps a generation counter. Workers
 * spin on the counter for a short while (a decode step issues a few hundred
 * runs per token, each well under a millisecond, so sleeping between them
 * would cost more than the work), then fall back to a condition variable.
 * Completion is an atomic countdown that the caller spins on the same way.
 * Nothing here allocates after pool_new(). */
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

#define SPIN_ITERS 20000

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
	atomic_uint gen;
	atomic_int pending;
	atomic_int sleepers;
	atomic_bool stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* workers wait for a new generation */
	pthread_cond_t done_cv; /* caller waits for pending == 0 */
	bool caller_sleeping;
};

static void pool_finish_one(struct pool *p)
{
	if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
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
		unsigned g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
		       !atomic_load_explicit(&p->stop, memory_order_relaxed)) {
			if (++spins < SPIN_ITERS) {
				cpu_relax();
				continue;
			}
			pthread_mutex_lock(&p->mu);
			atomic_fetch_add(&p->sleepers, 1);
			while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->cv, &p->mu);
			atomic_fetch_sub(&p->sleepers, 1);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			break;
		seen = g;
		p->fn(p->arg, w->ith, p->n);
		pool_finish_one(p);
	}
	return NULL;
}

int pool_new(int n_threads, const int *cpus, int n_cpus, struct pool **ret_pool, struct cm_err *err)
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
		pool_free(p);
		return cm_err_set(err, -ENOMEM, "threadpool: out of memory");
	}
	for (int i = 0; i < n_threads; i++) {
		p->w[i].p = p;
		p->w[i].ith = i;
		p->w[i].cpu = (cpus && n_cpus > 0) ? cpus[i % n_cpus] : -1;
	}
	/* Worker 0 is the calling thread; pin it only if asked. */
	if (p->w[0].cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(p->w[0].cpu, &set);
		(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	for (int i = 1; i < n_threads; i++) {
		int r = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
		if (r != 0) {
			p->n = i; /* only join the ones that started */
			pool_free(p);
			return cm_err_set(err, -r, "threadpool: cannot start worker %d: %s", i,
					  strerror(r));
		}
	}
	*ret_pool = p;
	return 0;
}

void pool_free(struct pool *p)
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

int pool_size(const struct pool *p)
{
	return p->n;
}

void pool_run(struct pool *p, pool_fn fn, void *arg)
{
	if (p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
	atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleepers check */
	if (atomic_load(&p->sleepers) > 0) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
	fn(arg, 0, p->n);
	int spins = 0;
	while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
		if (++spins < SPIN_ITERS) {
			cpu_relax();
			continue;
		}
		pthread_mutex_lock(&p->mu);
		p->caller_sleeping = true;
		while (atomic_load(&p->pending) > 0)
			pthread_cond_wait(&p->done_cv, &p->mu);
		p->caller_sleeping = false;
		pthread_mutex_unlock(&p->mu);
	}
}
