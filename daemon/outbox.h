/* daemon/outbox.h: replies built under the serving lock, encoded and sent
 * after it is dropped.
 *
 * Code that holds the lock (the scheduler publishing tokens, a handler
 * answering a poll) copies what a reply needs into an outbox_msg and adds
 * it to a local list; once the lock is dropped, an nng thread sends the
 * list itself (outbox_send), and the scheduler hands it to the sender
 * thread (outbox_post), so JSON encoding and nng sends never run on the
 * engine's thread or under the lock. */
#ifndef EDGELM_DAEMON_OUTBOX_H
#define EDGELM_DAEMON_OUTBOX_H

#include "ipc/ipc.h"

#include <pthread.h>

struct outbox_msg {
	struct outbox_msg *next;
	ipc_call *call;
	struct ipc_reply rep; /* its pointers point into the fields below */
	char id[IPC_ID_MAX + 1];
	char *text; /* owned */
	char *msg;  /* owned: an error's message */
	void *lp;   /* owned: the logprobs the reply points to */
	void *embd; /* owned: the embeddings the reply points to */
};

/* A list of messages being built. */
struct outbox_list {
	struct outbox_msg *head, **tail;
};
#define OUTBOX_LIST_INIT(l) ((l)->head = NULL, (l)->tail = &(l)->head)

/* A new message for `call` replying `op` with `id`; added to `l`. On
 * allocation failure the call is completed at once with an internal error
 * and NULL is returned. */
struct outbox_msg *outbox_add(struct outbox_list *l, ipc_call *call, enum ipc_op op,
			      const char *id);
/* Copy text into m (m->rep's text fields are the caller's to point). */
int outbox_set_text(struct outbox_msg *m, const char *text, size_t len);
/* An error reply; msg may be NULL (the code's description). */
void outbox_error(struct outbox_list *l, ipc_call *call, const char *id, enum ipc_errcode code,
		  int64_t retry_after_ms, const char *msg);

/* Encode and send every message of the list, and free them (no lock held). */
void outbox_send(struct outbox_list *l);

/* The sender thread. */
struct outbox {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	bool started, stopping;
	struct outbox_list q;
};
int outbox_start(struct outbox *ob, struct cm_err *err);
/* Hand a list to the sender thread (it takes the messages; l is emptied). */
void outbox_post(struct outbox *ob, struct outbox_list *l);
/* Send what is queued, then stop the thread. */
void outbox_stop(struct outbox *ob);

#endif
