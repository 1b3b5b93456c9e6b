/* daemon/outbox.c: deferred replies and the sender thread (outbox.h). */
#include "daemon/outbox.h"

#include <stdio.h>
#include <string.h>

struct outbox_msg *outbox_add(struct outbox_list *l, ipc_call *call, enum ipc_op op,
			      const char *id)
{
	struct outbox_msg *m = cm_calloc(1, sizeof(*m));
	if (!m) {
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return NULL;
	}
	m->call = call;
	m->rep.op = op;
	m->rep.retry_after_ms = -1;
	if (id) {
		snprintf(m->id, sizeof(m->id), "%s", id);
		m->rep.id = m->id;
	}
	*l->tail = m;
	l->tail = &m->next;
	return m;
}

int outbox_set_text(struct outbox_msg *m, const char *text, size_t len)
{
	cm_free(m->text);
	m->text = cm_malloc(len + 1);
	if (!m->text)
		return -ENOMEM;
	memcpy(m->text, text, len);
	m->text[len] = '\0';
	return 0;
}

void outbox_error(struct outbox_list *l, ipc_call *call, const char *id, enum ipc_errcode code,
		  int64_t retry_after_ms, const char *msg)
{
	struct outbox_msg *m = outbox_add(l, call, IPC_OP_NONE, id);
	if (!m)
		return;
	m->rep.error = code;
	m->rep.retry_after_ms = retry_after_ms;
	if (msg && (m->msg = cm_strdup(msg)))
		m->rep.message = m->msg;
}

static void msg_free(struct outbox_msg *m)
{
	cm_free(m->text);
	cm_free(m->msg);
	cm_free(m->lp);
	cm_free(m->embd);
	cm_free(m);
}

void outbox_send(struct outbox_list *l)
{
	struct outbox_msg *m = l->head;
	OUTBOX_LIST_INIT(l);
	while (m) {
		struct outbox_msg *next = m->next;
		if (m->rep.error != IPC_ERR_NONE)
			ipc_call_error(m->call, m->rep.error, m->rep.retry_after_ms,
				       m->rep.message ? "%s" : NULL, m->rep.message);
		else
			ipc_call_reply_encode(m->call, &m->rep);
		msg_free(m);
		m = next;
	}
}

static void *sender_main(void *arg)
{
	struct outbox *ob = arg;
	pthread_setname_np(pthread_self(), "edgelmd:send");
	pthread_mutex_lock(&ob->mu);
	for (;;) {
		while (!ob->q.head && !ob->stopping)
			pthread_cond_wait(&ob->cv, &ob->mu);
		if (!ob->q.head)
			break;
		struct outbox_list l = ob->q;
		OUTBOX_LIST_INIT(&ob->q);
		pthread_mutex_unlock(&ob->mu);
		outbox_send(&l);
		pthread_mutex_lock(&ob->mu);
	}
	pthread_mutex_unlock(&ob->mu);
	return NULL;
}

int outbox_start(struct outbox *ob, struct cm_err *err)
{
	memset(ob, 0, sizeof(*ob));
	pthread_mutex_init(&ob->mu, NULL);
	pthread_cond_init(&ob->cv, NULL);
	OUTBOX_LIST_INIT(&ob->q);
	int r = pthread_create(&ob->th, NULL, sender_main, ob);
	if (r)
		return cm_err_set(err, -r, "cannot start the sender thread: %s", strerror(r));
	ob->started = true;
	return 0;
}

void outbox_post(struct outbox *ob, struct outbox_list *l)
{
	if (!l->head)
		return;
	if (!ob->started) { /* no thread (stopped or never started): send here */
		outbox_send(l);
		return;
	}
	pthread_mutex_lock(&ob->mu);
	*ob->q.tail = l->head;
	ob->q.tail = l->tail;
	pthread_cond_signal(&ob->cv);
	pthread_mutex_unlock(&ob->mu);
	OUTBOX_LIST_INIT(l);
}

void outbox_stop(struct outbox *ob)
{
	if (!ob->started)
		return;
	pthread_mutex_lock(&ob->mu);
	ob->stopping = true;
	pthread_cond_signal(&ob->cv);
	pthread_mutex_unlock(&ob->mu);
	pthread_join(ob->th, NULL);
	ob->started = false;
	pthread_cond_destroy(&ob->cv);
	pthread_mutex_destroy(&ob->mu);
}
