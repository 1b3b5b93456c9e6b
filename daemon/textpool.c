/* daemon/textpool.c: the text workers (textpool.h). */
#include "daemon/textpool.h"

#include <stdio.h>
#include <string.h>

static void *worker_main(void *arg)
{
	struct textpool *tp = arg;
	pthread_setname_np(pthread_self(), "edgelmd:text");
	pthread_mutex_lock(&tp->mu);
	for (;;) {
		while (!tp->head && !tp->stopping)
			pthread_cond_wait(&tp->cv, &tp->mu);
		struct textpool_job *j = tp->head;
		if (!j)
			break;
		tp->head = j->next;
		if (!tp->head)
			tp->tail = &tp->head;
		pthread_mutex_unlock(&tp->mu);
		j->fn(j->arg);
		cm_free(j);
		pthread_mutex_lock(&tp->mu);
		tp->n_jobs--;
	}
	pthread_mutex_unlock(&tp->mu);
	return NULL;
}

int textpool_start(struct textpool *tp, int n_threads, int max_jobs, struct cm_err *err)
{
	memset(tp, 0, sizeof(*tp));
	pthread_mutex_init(&tp->mu, NULL);
	pthread_cond_init(&tp->cv, NULL);
	tp->tail = &tp->head;
	tp->max_jobs = max_jobs;
	tp->n_threads = n_threads;
	tp->th = cm_calloc((size_t)n_threads, sizeof(*tp->th));
	if (!tp->th)
		return cm_err_set(err, -ENOMEM, "out of memory");
	for (int i = 0; i < n_threads; i++) {
		int r = pthread_create(&tp->th[i], NULL, worker_main, tp);
		if (r) {
			textpool_stop(tp);
			return cm_err_set(err, -r, "cannot start a text worker: %s", strerror(r));
		}
		tp->n_started++;
	}
	return 0;
}

int textpool_submit(struct textpool *tp, textpool_fn fn, void *arg)
{
	struct textpool_job *j = cm_malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->fn = fn;
	j->arg = arg;
	j->next = NULL;
	pthread_mutex_lock(&tp->mu);
	int rc = tp->stopping ? -ESHUTDOWN : tp->n_jobs >= tp->max_jobs ? -EAGAIN : 0;
	if (rc == 0) {
		*tp->tail = j;
		tp->tail = &j->next;
		tp->n_jobs++;
		pthread_cond_signal(&tp->cv);
	}
	pthread_mutex_unlock(&tp->mu);
	if (rc)
		cm_free(j);
	return rc;
}

int textpool_load(struct textpool *tp)
{
	pthread_mutex_lock(&tp->mu);
	int n = tp->n_jobs;
	pthread_mutex_unlock(&tp->mu);
	return n;
}

void textpool_stop(struct textpool *tp)
{
	if (!tp->th)
		return;
	pthread_mutex_lock(&tp->mu);
	tp->stopping = true;
	pthread_cond_broadcast(&tp->cv);
	pthread_mutex_unlock(&tp->mu);
	for (int i = 0; i < tp->n_started; i++)
		pthread_join(tp->th[i], NULL);
	cm_free(tp->th);
	tp->th = NULL;
	pthread_cond_destroy(&tp->cv);
	pthread_mutex_destroy(&tp->mu);
}
