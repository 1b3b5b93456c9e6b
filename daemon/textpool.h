/* daemon/textpool.h: a few threads for text work that must wait neither
 * behind the engine nor in front of cheap requests: tokenizing prompts
 * before admission, tokenize/detokenize ops, chat rendering, encoding
 * large replies. The queue is bounded: a full pool refuses new jobs. */
#ifndef EDGELM_DAEMON_TEXTPOOL_H
#define EDGELM_DAEMON_TEXTPOOL_H

#include "common/common.h"

#include <pthread.h>

typedef void (*textpool_fn)(void *arg);

struct textpool_job {
	textpool_fn fn;
	void *arg;
	struct textpool_job *next;
};

struct textpool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t *th;
	int n_threads, n_started;
	int max_jobs, n_jobs; /* queued and running */
	bool stopping;
	struct textpool_job *head, **tail;
};

int textpool_start(struct textpool *tp, int n_threads, int max_jobs, struct cm_err *err);
/* Queue fn(arg). -EAGAIN when max_jobs are queued or running, -ESHUTDOWN
 * once stopping: the caller still owns arg. */
int textpool_submit(struct textpool *tp, textpool_fn fn, void *arg);
/* Jobs queued or running now. */
int textpool_load(struct textpool *tp);
/* Run what is queued, then join the threads. */
void textpool_stop(struct textpool *tp);

#endif
