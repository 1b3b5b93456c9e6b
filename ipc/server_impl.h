/* ipc/server_impl.h: the server's state, shared by server.c (the calls,
 * listeners, start and stop) and selfcheck.c (the self-check of the
 * listeners); nothing else includes it. */
#ifndef EDGELM_IPC_SERVER_IMPL_H
#define EDGELM_IPC_SERVER_IMPL_H

#include "ipc/ipc.h"

#include <arpa/inet.h>
#include <grp.h>
#include <nng/nng.h>
#include <netinet/in.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/engine.h>
#include <nng/supplemental/tls/tls.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define SELFCHECK_FAILS 2      /* failed round trips in a row that re-create a listener */
#define SELFCHECK_FAILS_MAX 16 /* ... at most, when re-creating it did not help */
#define SELFCHECK_RETRY_MS 500 /* the next round after a failure, at most */
#define PROBE_MAX 96           /* bytes of the self-check's request */

enum call_state { CALL_IDLE, CALL_RECV, CALL_HANDLER, CALL_SEND };

struct ipc_call {
	struct ipc_server *srv;
	nng_ctx ctx;
	nng_aio *aio;
	_Atomic int state; /* enum call_state */
	struct ipc_request *req;
	uint64_t arrival_ns;
	int64_t peer_pid, peer_uid;
	bool probe; /* answering the self-check */
	/* a call submitted by another transport (ipc_server_submit): no
	 * context; its reply goes to local_done and the call is freed */
	ipc_submit_done_fn local_done;
	void *local_ud;
	char identity[IPC_IDENTITY_MAX + 1];
};

struct listener {
	nng_listener l;
	char *url;
	char *path;       /* ipc:// socket file, else NULL */
	char *listen_url; /* tcp://: the bound address, to listen on again */
	bool tls;         /* tls+tcp:// (not self-checked: the probe speaks plain SP) */
	bool created, started;
	bool checked; /* by the self-check, at probe_sa */
	struct sockaddr_storage probe_sa;
	socklen_t probe_salen;
	dev_t dev; /* of the socket file once started */
	ino_t ino;
	/* the self-check thread's own */
	int sc_fd;      /* its connection while it waits for an answer; -1: none */
	bool sc_header; /* the server's SP header is in */
	size_t sc_got;  /* bytes of the current read */
	unsigned char sc_in[9 + 4 + PROBE_MAX];
	unsigned fails;        /* round trips failed in a row */
	unsigned fails_needed; /* to re-create the listener; 0: SELFCHECK_FAILS */
	bool verified;         /* a round trip passed since it was created */
	char last_event[256];
};

struct ipc_server {
	nng_socket sock;
	bool sock_open;
	struct listener *listeners;
	size_t n_listeners;
	struct ipc_limits lim;
	unsigned n_contexts, max_contexts;
	int socket_mode;
	char *socket_group;
	ipc_handler_fn handler;
	void *userdata;
	ipc_reply_fn on_reply;
	nng_tls_config *tls; /* of the tls+tcp:// listeners; NULL: none */
	nng_tls_engine_config *tls_ecfg; /* its engine side, for reloads */
	atomic_bool tls_verify;          /* a CA is set: every TLS peer is verified */
	pthread_mutex_t tls_mu;          /* reloads one at a time */

	pthread_mutex_t mu; /* calls[], n_calls, waking stop() */
	pthread_cond_t cv;
	/* Held for reading around every nng call on a context or the socket,
	 * for writing around nng_close: nng 1.5.2 can touch freed memory when
	 * nng_ctx_send is still returning on one thread while another closes
	 * the socket. Readers only try the lock, so a callback never waits on
	 * it: a failed try means the server is closing. */
	pthread_rwlock_t io;
	struct ipc_call **calls;
	unsigned n_calls;
	bool started, stopped;

	atomic_bool draining, closing;
	atomic_uint idle;       /* calls in RECV */
	atomic_uint in_handler; /* calls in HANDLER */
	atomic_uint sending;    /* replies handed to nng and not yet sent */

	atomic_uint_fast64_t st_received, st_replies, st_send_failures;
	atomic_uint_fast64_t st_errors[IPC_ERR_COUNT];

	/* self-check */
	unsigned sc_period_ms, sc_timeout_ms;
	ipc_event_fn on_event;
	char probe[PROBE_MAX]; /* the request it sends and the server echoes */
	size_t probe_len;
	pthread_mutex_t sc_mu; /* the waits between rounds */
	pthread_cond_t sc_cv;  /* CLOCK_MONOTONIC */
	atomic_bool sc_quit;
	bool sc_joinable;
	pthread_t sc_thread;
	atomic_uint_fast64_t st_selfchecks, st_selfcheck_failures, st_recoveries,
	    st_selfcheck_ok_ns;
};

/* listener.c: nng calls on the socket are made between these (see `io`) */
bool ipc_io_begin(struct ipc_server *srv);
void ipc_io_end(struct ipc_server *srv);
/* listener.c: (re-)create and start a listener; nng's error as -errno */
int ipc_nng_to_errno(int rv);
int ipc_listener_create(struct ipc_server *srv, struct listener *L, const char *url,
                        struct cm_err *err);
int ipc_listener_start(struct ipc_server *srv, struct listener *L, struct cm_err *warn,
                       struct cm_err *err);
/* tls.c: the listeners' TLS configuration from the PEM files (it
 * registers the engine below first) */
int ipc_tls_config_new(const char *cert_file, const char *key_file, const char *ca_file,
                       nng_tls_config **ret_cfg, nng_tls_engine_config **ret_ecfg,
                       struct cm_err *err);
/* tls_engine.c: our TLS engine, to be registered once nng is initialised
 * (nng's init registers its own); the verified subject CN of a TLS pipe's
 * peer ("" when none) */
int ipc_tls_engine_register(void);
/* The engine side of the configuration nng_tls_config_alloc just made on
 * this thread; move `fresh`'s certificates into `live` for the
 * connections made from now on. */
nng_tls_engine_config *ipc_tls_engine_last_config(void);
void ipc_tls_engine_swap(nng_tls_engine_config *live, nng_tls_engine_config *fresh);
void ipc_tls_peer_cn(nng_pipe p, char *buf, size_t cap);
/* selfcheck.c */
int ipc_selfcheck_start(struct ipc_server *srv);
void ipc_selfcheck_stop(struct ipc_server *srv);

#endif
