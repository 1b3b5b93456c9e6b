/* edgelm.h: libedgelm, the C client of the edgelm daemon (edgelmd).
 *
 *   #include <edgelm.h>            cc app.c $(pkg-config --cflags --libs edgelm)
 *
 *   edgelm_client *c;
 *   struct edgelm_error e;
 *   if (edgelm_connect(NULL, &c, &e) != 0) { fprintf(stderr, "%s\n", e.message); ... }
 *   struct edgelm_params p;
 *   edgelm_params_init(&p);
 *   p.max_tokens = 64;
 *   struct edgelm_result r;
 *   if (edgelm_generate(c, "Once upon a time", &p, &r, &e) == 0)
 *           printf("%s\n", r.text);
 *   edgelm_result_free(&r);
 *   edgelm_close(c);
 *
 * The protocol underneath is JSON over an nng req0 socket (docs/protocol.md).
 * A client handle may be used from several threads at once: every call runs
 * on its own nng context. Requests are never resent by the library's
 * transport (nng's req resend timer is disabled), so a long generation runs
 * once; streaming uses idempotent long-polls, which the library retries after
 * a timeout or reconnect without losing or repeating text.
 *
 * Every function returns 0 or a negative EDGELM_E_* code, and fills the
 * optional `err` with the code and a one-line message. This header needs no
 * other edgelm header. */
#ifndef EDGELM_H
#define EDGELM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EDGELM_API __attribute__((visibility("default")))
#else
#define EDGELM_API
#endif

#define EDGELM_DEFAULT_URL "ipc:///run/edgelm/edgelm.sock"
#define EDGELM_ID_MAX 64

enum edgelm_status {
	EDGELM_OK = 0,
	/* on this side */
	EDGELM_E_INVALID_ARG = -1, /* bad argument to a library function */
	EDGELM_E_NOMEM = -2,
	EDGELM_E_CONNECT = -3,    /* cannot connect: no daemon, bad URL, permissions */
	EDGELM_E_TIMEOUT = -4,    /* no reply within the timeout */
	EDGELM_E_CONNECTION = -5, /* the connection was lost while waiting */
	EDGELM_E_PROTOCOL = -6,   /* the reply is not what the protocol says */
	EDGELM_E_ABORTED = -7,    /* the stream callback stopped the generation */
	/* from the daemon: -(100 + the protocol's error number), see
	 * docs/protocol.md; edgelm_error.server_code holds the wire string */
	EDGELM_E_INVALID_JSON = -101,
	EDGELM_E_UNSUPPORTED_VERSION = -102,
	EDGELM_E_UNKNOWN_OP = -103,
	EDGELM_E_INVALID_FIELD = -104,
	EDGELM_E_TOO_LARGE = -105, /* also: the request exceeds the client's message limit */
	EDGELM_E_PROMPT_TOO_LONG = -106,
	EDGELM_E_QUEUE_FULL = -107, /* retry after edgelm_error.retry_after_ms */
	EDGELM_E_DEADLINE_EXCEEDED = -108,
	EDGELM_E_SHUTTING_DOWN = -109,
	EDGELM_E_NOT_FOUND = -110,
	EDGELM_E_NOT_READY = -111,
	EDGELM_E_UNSUPPORTED = -112,
	EDGELM_E_INTERNAL = -113,
};

/* True for codes the daemon sent (as opposed to local or transport ones). */
static inline bool edgelm_is_server_error(int code)
{
	return code <= -101 && code > -200;
}

struct edgelm_error {
	int code;               /* EDGELM_E_*, 0 when no error */
	char server_code[32];   /* "queue_full", ... for daemon errors, else "" */
	char message[256];      /* one line */
	int64_t retry_after_ms; /* daemon's retry hint, -1 if none */
};

/* A short description of a code ("the queue is full, retry later"). */
EDGELM_API const char *edgelm_strerror(int code);
/* The library's version, e.g. "0.1.0". */
EDGELM_API const char *edgelm_version(void);

/* ---- connection ----------------------------------------------------------- */

typedef struct edgelm_client edgelm_client;

/* Connect to `url` (NULL: $EDGELM_SOCKET, else EDGELM_DEFAULT_URL). Fails at
 * once with EDGELM_E_CONNECT when nothing listens there. After a lost
 * connection the library reconnects by itself. `url` may be a
 * comma-separated list of daemons: see edgelm_connect_ex, whose TLS files
 * this takes from $EDGELM_TLS_CERT, $EDGELM_TLS_KEY and $EDGELM_TLS_CA. */
EDGELM_API int edgelm_connect(const char *url, edgelm_client **ret_client,
                              struct edgelm_error *err);

/* Several daemons (a fleet) and TLS.
 *
 * One client dials every URL on one nng req socket, and nng hands each
 * request to a connected daemon that is free to take it, so requests spread
 * over the daemons that are up; none is a balancer of ours. The connect
 * succeeds when at least one daemon answers; the others are dialled in the
 * background and take requests once they come up. A URL that does not parse
 * or a TLS file that does not load fails the connect.
 *
 * Failover: a request runs on one daemon. When that daemon goes away, the
 * call fails at once with EDGELM_E_CONNECTION (no resend timer, nothing
 * waits for a timeout), and the next call goes to the daemons still
 * connected. The library itself sends a request again only where running it
 * twice is harmless: info, health, metrics, tokenize, detokenize and embed
 * go once more to another daemon (at most once per other endpoint). A
 * generate or chat is never sent again once it may have reached a daemon:
 * the caller sees EDGELM_E_CONNECTION and decides (the library has already
 * asked the daemons to cancel its id). edgelm_call_json is not retried.
 *
 * Streams stay on the daemon that started them: the polls and the cancel of
 * a streaming generate go to that daemon only, on a second req socket per
 * endpoint, dialled the first time a stream needs it. edgelm_cancel by id
 * asks each daemon in turn until one knows the id.
 *
 * TLS (tls+tcp://host:port): the client verifies the daemon's certificate
 * against tls_ca_file and the host name in the URL, and refuses the
 * connection (EDGELM_E_CONNECT) when the name differs or the CA did not sign
 * it. tls_cert_file/tls_key_file are the client's certificate and key (PEM;
 * the key may be in the certificate's file), which a daemon that asks for
 * one checks; its CN names the client to the daemon. */
struct edgelm_connect_opts {
	/* URLs (ipc://, tcp://, tls+tcp://), each of which may itself be a
	 * comma-separated list; none: $EDGELM_SOCKET (may be a list too),
	 * else EDGELM_DEFAULT_URL */
	const char *const *urls;
	size_t n_urls;
	/* PEM files; NULL: $EDGELM_TLS_CERT, $EDGELM_TLS_KEY, $EDGELM_TLS_CA */
	const char *tls_cert_file;
	const char *tls_key_file;
	const char *tls_ca_file;
	uint64_t reserved_[8]; /* zero (edgelm_connect_opts_init) */
};
/* Zeroes *o: every field its default. */
EDGELM_API void edgelm_connect_opts_init(struct edgelm_connect_opts *o);
/* Connect with options (NULL: all defaults, as edgelm_connect(NULL)). */
EDGELM_API int edgelm_connect_ex(const struct edgelm_connect_opts *o, edgelm_client **ret_client,
                                 struct edgelm_error *err);

/* NULL-safe. Returns within 2 s even where nng's own close stalls (nng
 * 1.5.2, Debian 12's, can wait for good after the daemon dropped the
 * connection: nanomsg/nng#1543, fixed in nng 1.8); the socket is then left
 * to a helper thread, which finishes the close if it ever can. */
EDGELM_API void edgelm_close(edgelm_client *c);

/* How long a call waits for its reply, in ms (default 30000; <= 0: forever).
 * A blocking generate waits its deadline_ms plus this, or forever when it has
 * no deadline (a dead daemon is still noticed: the connection drops). After
 * a lost connection a call waits for the library's reconnect at most this
 * long (30000 when this is forever), then fails with EDGELM_E_CONNECTION. */
EDGELM_API void edgelm_set_timeout(edgelm_client *c, int timeout_ms);
/* Requests larger than this are refused locally with EDGELM_E_TOO_LARGE
 * (default EDGELM_DEFAULT_MAX_MSG; 0: no check). The daemon drops the
 * connection on messages above its own limit, which a caller would only see
 * as EDGELM_E_CONNECTION. */
EDGELM_API void edgelm_set_max_msg(edgelm_client *c, size_t bytes);
/* The daemon's default message limit: room for any request within the
 * protocol's other limits, e.g. a prompt of 1 MiB (docs/protocol.md). */
#define EDGELM_DEFAULT_MAX_MSG 1245184 /* 1216 KiB */

/* ---- generation ----------------------------------------------------------- */

/* Generation parameters. Always start from edgelm_params_init(), which marks
 * every field "the daemon's default"; set only what you need. Ranges are in
 * docs/protocol.md. */
struct edgelm_params {
	int32_t max_tokens;      /* 0: default */
	float temperature;       /* NaN: default; 0: greedy */
	int32_t top_k;           /* -1: default; 0: off */
	float top_p;             /* NaN: default */
	float min_p;             /* NaN: default */
	float repeat_penalty;    /* NaN: default */
	float frequency_penalty; /* NaN: default */
	float presence_penalty;  /* NaN: default */
	int32_t penalty_last_n;  /* INT32_MIN: default; -1: whole context */
	bool has_seed;           /* false: random */
	uint64_t seed;           /* 0 .. 2^63-1 */
	const char *const *stop; /* stop strings */
	size_t n_stop;
	int64_t deadline_ms;  /* 0: none */
	int32_t priority;     /* -10 .. 10 */
	const char *id;       /* NULL: the library makes a unique one */
	int32_t poll_wait_ms; /* streaming long-poll wait; 0: 2000 */
	/* structured output, at most one (docs/protocol.md): the text must
	 * match a GBNF grammar, or be JSON valid under a JSON Schema, given
	 * as the text of a JSON object; NULL: none. They take the place of
	 * two reserved_ words, so the struct keeps its size on LP64 */
	const char *grammar;
	const char *json_schema;
	uint64_t reserved_[2];
};
EDGELM_API void edgelm_params_init(struct edgelm_params *p);

enum edgelm_finish {
	EDGELM_FINISH_NONE = 0,
	EDGELM_FINISH_STOP,      /* end of text or a stop string */
	EDGELM_FINISH_LENGTH,    /* max_tokens or the context */
	EDGELM_FINISH_CANCELLED, /* edgelm_cancel, or the stream was abandoned */
	EDGELM_FINISH_DEADLINE,  /* deadline_ms passed */
};
EDGELM_API const char *edgelm_finish_name(enum edgelm_finish f); /* "stop", ... */

struct edgelm_result {
	char *text; /* all generated text, NUL-terminated (also when streamed) */
	size_t text_len;
	char id[EDGELM_ID_MAX + 1]; /* the generation's id */
	enum edgelm_finish finish;
	int64_t prompt_tokens, cached_tokens, completion_tokens;
	double queue_ms, ttft_ms, prefill_ms, decode_ms, total_ms; /* NaN if unknown */
	double prefill_tps, decode_tps;
};
/* Frees text and clears the struct; safe on a zeroed or already freed one. */
EDGELM_API void edgelm_result_free(struct edgelm_result *r);

/* Called with each new piece of text (valid UTF-8, not NUL-terminated).
 * Return 0 to go on; anything else cancels the generation and the streaming
 * call returns EDGELM_E_ABORTED (with the text so far in the result). */
typedef int (*edgelm_text_cb)(const char *text, size_t len, void *user);

/* Generate from a prompt and return once the generation finished. `params`
 * may be NULL. On success *ret_result must be freed with edgelm_result_free;
 * on failure it is zeroed (or holds the partial text after EDGELM_E_ABORTED
 * and after transport errors while streaming: free it either way). */
EDGELM_API int edgelm_generate(edgelm_client *c, const char *prompt,
                               const struct edgelm_params *params, struct edgelm_result *ret_result,
                               struct edgelm_error *err);

/* The same, streaming: `cb` sees the text as it is produced. */
EDGELM_API int edgelm_generate_stream(edgelm_client *c, const char *prompt,
                                      const struct edgelm_params *params, edgelm_text_cb cb,
                                      void *user, struct edgelm_result *ret_result,
                                      struct edgelm_error *err);

struct edgelm_message {
	const char *role; /* "system", "user", "assistant" */
	const char *content;
};

/* Chat: the whole conversation is sent each turn (the daemon's prefix cache
 * makes the shared part cheap). `cb` NULL: blocking, else streaming. */
EDGELM_API int edgelm_chat(edgelm_client *c, const struct edgelm_message *messages,
                           size_t n_messages, const struct edgelm_params *params, edgelm_text_cb cb,
                           void *user, struct edgelm_result *ret_result, struct edgelm_error *err);

/* Cancel a generation by id. *ret_cancelled (may be NULL) is false when it had
 * already finished. EDGELM_E_NOT_FOUND when the daemon does not know it
 * (with several daemons: when none does and all answered). */
EDGELM_API int edgelm_cancel(edgelm_client *c, const char *id, bool *ret_cancelled,
                             struct edgelm_error *err);

/* ---- tokens and status ---------------------------------------------------- */

/* Token ids of `text` (free *ret_ids with edgelm_free). */
EDGELM_API int edgelm_tokenize(edgelm_client *c, const char *text, bool add_special,
                               bool parse_special, int32_t **ret_ids, size_t *ret_n,
                               struct edgelm_error *err);
/* Text of token ids (free *ret_text with edgelm_free). */
EDGELM_API int edgelm_detokenize(edgelm_client *c, const int32_t *ids, size_t n, char **ret_text,
                                 struct edgelm_error *err);

/* ---- embeddings ------------------------------------------------------------ */

/* Embeddings of texts[0..n) (the embed op): one unit vector per text, of the
 * model's embedding length *ret_dim, text i's at (*ret_values)[i * dim].
 * pooling: NULL for the model's default, else "mean", "cls" or "last";
 * truncate cuts a text longer than the context instead of failing with
 * EDGELM_E_PROMPT_TOO_LONG. ret_tokens (may be NULL) gets each text's token
 * count. Free *ret_values and *ret_tokens with edgelm_free. */
EDGELM_API int edgelm_embed(edgelm_client *c, const char *const *texts, size_t n,
                            const char *pooling, bool truncate, float **ret_values,
                            size_t *ret_dim, int64_t **ret_tokens, struct edgelm_error *err);

/* The daemon's reply as JSON text (free with edgelm_free): the model, its
 * architecture and quant types, context, ISA and kernels, threads, tuning
 * state and version. */
EDGELM_API int edgelm_info(edgelm_client *c, char **ret_json, struct edgelm_error *err);

enum edgelm_health {
	EDGELM_HEALTH_LOADING,
	EDGELM_HEALTH_READY,
	EDGELM_HEALTH_DRAINING,
};
/* Health; *ret_json (may be NULL) receives the whole reply with the reasons. */
EDGELM_API int edgelm_health(edgelm_client *c, enum edgelm_health *ret_status, char **ret_json,
                             struct edgelm_error *err);

/* The daemon's metrics as JSON: {"metrics":[{"name","type","labels","value"}]}. */
EDGELM_API int edgelm_metrics(edgelm_client *c, char **ret_json, struct edgelm_error *err);

/* Send any request (JSON text) and receive the reply JSON (NUL-terminated, free
 * with edgelm_free). Returns 0 for an ok reply, the EDGELM_E_* of the error
 * for an error reply (*ret_reply is set in both cases), or a transport error
 * (then *ret_reply is NULL). */
EDGELM_API int edgelm_call_json(edgelm_client *c, const char *request, size_t len, char **ret_reply,
                                size_t *ret_len, struct edgelm_error *err);

EDGELM_API void edgelm_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
