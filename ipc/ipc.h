/* ipc/ipc.h: the daemon's message interface. JSON requests arrive on an nng
 * rep0 socket; this module turns them into plain `struct ipc_request`s,
 * hands each one to a handler that the daemon registers, and encodes the
 * daemon's typed replies back into JSON. It knows nothing of the engine.
 *
 * The protocol itself (fields, ranges, defaults, streaming) is documented in
 * docs/protocol.md; the field names and the error-code table live only in
 * ipc/protocol.c.
 *
 * Threading: the handler runs on one of nng's threads and must not block; it
 * either answers at once or keeps the call and answers later from any thread
 * (ipc_call_reply / ipc_call_error), exactly once per call. */
#ifndef EDGELM_IPC_H
#define EDGELM_IPC_H

#include "common/common.h"

/* ---- error codes --------------------------------------------------------- */

/* Every failure a client can see. The stable wire string, the errno used for
 * struct cm_err and the description of each code are in ONE table in
 * ipc/protocol.c; libedgelm's EDGELM_E_* server codes are -(100 + code).
 * Append only: the numeric values are part of libedgelm's ABI. */
enum ipc_errcode {
	IPC_ERR_NONE = 0,
	IPC_ERR_INVALID_JSON = 1,        /* "invalid_json", -EBADMSG */
	IPC_ERR_UNSUPPORTED_VERSION = 2, /* "unsupported_version", -EPROTONOSUPPORT */
	IPC_ERR_UNKNOWN_OP = 3,          /* "unknown_op", -ENOSYS */
	IPC_ERR_INVALID_FIELD = 4,       /* "invalid_field", -EINVAL */
	IPC_ERR_TOO_LARGE = 5,           /* "too_large", -EMSGSIZE */
	IPC_ERR_PROMPT_TOO_LONG = 6,     /* "prompt_too_long", -E2BIG */
	IPC_ERR_QUEUE_FULL = 7,          /* "queue_full", -EAGAIN */
	IPC_ERR_DEADLINE_EXCEEDED = 8,   /* "deadline_exceeded", -ETIMEDOUT */
	IPC_ERR_SHUTTING_DOWN = 9,       /* "shutting_down", -ESHUTDOWN */
	IPC_ERR_NOT_FOUND = 10,          /* "not_found", -ENOENT */
	IPC_ERR_NOT_READY = 11,          /* "not_ready", -EBUSY */
	IPC_ERR_UNSUPPORTED = 12,        /* "unsupported", -EOPNOTSUPP */
	IPC_ERR_INTERNAL = 13,           /* "internal", -EIO (and any other errno) */
	IPC_ERR_COUNT
};

/* "invalid_json", ...; "internal" for out-of-range values. */
const char *ipc_errcode_name(enum ipc_errcode code);
/* A one-line description for people ("the queue is full, retry later"). */
const char *ipc_errcode_describe(enum ipc_errcode code);
/* The reverse of ipc_errcode_name; IPC_ERR_NONE when `name` is unknown. */
enum ipc_errcode ipc_errcode_from_name(const char *name);
/* The negative errno of a code, and back: a daemon that holds a cm_err from
 * any module maps err->code with ipc_errcode_from_errno (unknown -> internal). */
int ipc_errcode_to_errno(enum ipc_errcode code);
enum ipc_errcode ipc_errcode_from_errno(int neg_errno);

/* ---- limits -------------------------------------------------------------- */

#define IPC_PROTOCOL_VERSION 1
#define IPC_DEFAULT_URL "ipc:///run/edgelm/edgelm.sock"
#define IPC_ID_MAX 64 /* bytes of a request/stream id */

/* Defaults of struct ipc_limits. */
#define IPC_DEFAULT_MAX_PROMPT_BYTES ((size_t)1 << 20)
#define IPC_DEFAULT_MAX_MESSAGES 1024
#define IPC_DEFAULT_MAX_STOP 16
#define IPC_DEFAULT_MAX_STOP_BYTES 256
#define IPC_DEFAULT_MAX_IDS 65536
#define IPC_MAX_LOGIT_BIAS 1024 /* tokens in one logit_bias */
/* a logit_bias entry as written compactly: "2147483647":-1.2345678901234567e-05, */
#define IPC_LOGIT_BIAS_ROOM (IPC_MAX_LOGIT_BIAS * 40)
/* bytes of a grammar as JSON, or of a json_schema as compact JSON; the
 * two are exclusive, so the message room grows by one of them */
#define IPC_MAX_GRAMMAR_BYTES ((size_t)64 << 10)
#define IPC_GRAMMAR_ROOM (IPC_MAX_GRAMMAR_BYTES + 32)

/* The smallest message limit, rounded up to 64 KiB, that holds any request
 * within the other limits as libedgelm writes it: the longest text, stop
 * strings of control characters (6 bytes a byte), 48 bytes of frame a chat
 * message, the longest logit_bias, the longest grammar and 4 KiB for the
 * other fields; or max_ids ids of 12 bytes. The
 * client's and the server's defaults both come from it. */
#define IPC_JSON_ESCAPE_MAX 6 /* \u001f */
#define IPC_MSG_ROOM(messages, stop, stop_bytes)                                                   \
	((size_t)4096 + IPC_ID_MAX + (size_t)48 * (messages) +                                      \
	 (size_t)(stop) * (IPC_JSON_ESCAPE_MAX * (size_t)(stop_bytes) + 3) +                        \
	 (size_t)IPC_LOGIT_BIAS_ROOM + IPC_GRAMMAR_ROOM)
#define IPC_MSG_BYTES(prompt, messages, stop, stop_bytes, ids)                                     \
	((CM_MAX((size_t)(prompt) + IPC_MSG_ROOM(messages, stop, stop_bytes),                      \
	         (size_t)12 * (ids) + 4096) +                                                      \
	  0xffff) &                                                                                \
	 ~(size_t)0xffff)
#define IPC_DEFAULT_MAX_MSG_BYTES                                                                  \
	IPC_MSG_BYTES(IPC_DEFAULT_MAX_PROMPT_BYTES, IPC_DEFAULT_MAX_MESSAGES, IPC_DEFAULT_MAX_STOP, \
	              IPC_DEFAULT_MAX_STOP_BYTES, IPC_DEFAULT_MAX_IDS) /* 1216 KiB */

/* Bounds checked before and while parsing. A zero field means its default.
 *
 * Texts (a prompt, chat contents summed, tokenize text) count the bytes they
 * take inside a JSON string written with the fewest escapes (`"` `\` \b \f \n
 * \r \t: 2, other control characters: 6, any other byte: 1), so a limit means
 * the same however a client escapes, and the message limit follows from it. */
struct ipc_limits {
	size_t max_msg_bytes;    /* whole message (also NNG_OPT_RECVMAXSZ); default
	                          * IPC_MSG_BYTES of the other limits: 1216 KiB */
	unsigned max_depth;      /* JSON nesting; default 32, checked before parsing */
	size_t max_values;       /* JSON values in one message; default 262144 */
	size_t max_prompt_bytes; /* prompt, chat contents summed, tokenize text, as
	                          * JSON (above); 1 MiB */
	size_t max_messages;     /* chat messages; default 1024 */
	size_t max_stop;         /* stop strings; default 16 */
	size_t max_stop_bytes;   /* bytes of one stop string; default 256 */
	size_t max_ids;          /* detokenize ids; default 65536 */
	int32_t max_tokens;      /* upper bound of max_tokens; default 1048576 */
	uint32_t max_wait_ms;    /* upper bound of poll wait_ms; default 60000 */
};

/* Fill every zero field of `lim` with its default; max_msg_bytes last, from
 * the others as filled (IPC_MSG_BYTES; SIZE_MAX if that overflows). */
void ipc_limits_fill(struct ipc_limits *lim);

/* ---- requests ------------------------------------------------------------ */

enum ipc_op {
	IPC_OP_NONE = 0,
	IPC_OP_GENERATE,
	IPC_OP_CHAT,
	IPC_OP_POLL,
	IPC_OP_CANCEL,
	IPC_OP_TOKENIZE,
	IPC_OP_DETOKENIZE,
	IPC_OP_INFO,
	IPC_OP_HEALTH,
	IPC_OP_METRICS,
	IPC_OP_EMBED,
	IPC_OP_COUNT
};

/* "generate", ...; NULL for out-of-range values. */
const char *ipc_op_name(enum ipc_op op);

enum ipc_role { IPC_ROLE_SYSTEM, IPC_ROLE_USER, IPC_ROLE_ASSISTANT, IPC_ROLE_COUNT };
const char *ipc_role_name(enum ipc_role role);

struct ipc_message {
	enum ipc_role role;
	const char *content; /* UTF-8, NUL-terminated, no embedded NUL */
	size_t content_len;
};

/* Bits of struct ipc_sampling.set: which fields the client gave. Fields it did
 * not give hold the protocol defaults, which the daemon may override. */
enum {
	IPC_SET_MAX_TOKENS = 1u << 0,
	IPC_SET_TEMPERATURE = 1u << 1,
	IPC_SET_TOP_K = 1u << 2,
	IPC_SET_TOP_P = 1u << 3,
	IPC_SET_MIN_P = 1u << 4,
	IPC_SET_REPEAT_PENALTY = 1u << 5,
	IPC_SET_FREQUENCY_PENALTY = 1u << 6,
	IPC_SET_PRESENCE_PENALTY = 1u << 7,
	IPC_SET_PENALTY_LAST_N = 1u << 8,
	IPC_SET_SEED = 1u << 9,
};

/* Sampling parameters, ranges as in docs/protocol.md. Defaults follow the
 * engine's (llama.cpp's): 256 tokens, temperature 0.8, top_k 40, top_p 0.95,
 * min_p 0.05, no penalties, window 64, random seed. */
struct ipc_sampling {
	uint32_t set; /* IPC_SET_* */
	int32_t max_tokens;
	float temperature; /* 0: greedy */
	int32_t top_k;     /* 0: off */
	float top_p;       /* 1: off */
	float min_p;       /* 0: off */
	float repeat_penalty;
	float frequency_penalty;
	float presence_penalty;
	int32_t penalty_last_n; /* -1: whole context, 0: off */
	uint64_t seed;          /* valid when set & IPC_SET_SEED */
};

/* embed's pooling; the daemon maps it to the engine's (ipc knows no
 * engine). DEFAULT: the model's pooling_type, else mean. */
enum ipc_pooling {
	IPC_POOL_DEFAULT = 0,
	IPC_POOL_MEAN,
	IPC_POOL_CLS,
	IPC_POOL_LAST,
	IPC_POOL_COUNT
};
/* "default", "mean", "cls", "last"; NULL for out-of-range values. */
const char *ipc_pooling_name(enum ipc_pooling p);

/* A parsed, validated request. Every pointer points into memory owned by the
 * request and lives until ipc_request_free. Fields not used by `op` are zero. */
struct ipc_request {
	enum ipc_op op;
	int version;    /* always IPC_PROTOCOL_VERSION after parsing */
	const char *id; /* generate/chat: optional client-chosen id (NULL: the daemon
	                 * assigns one); poll/cancel: the generation named */

	/* generate */
	const char *prompt;
	size_t prompt_len;
	/* chat */
	const struct ipc_message *messages;
	size_t n_messages;
	/* generate and chat */
	struct ipc_sampling sampling;
	const char *const *stop;
	const size_t *stop_len;
	size_t n_stop;
	const int32_t *bias_ids; /* logit_bias: token ids and their biases */
	const float *bias;
	size_t n_bias;
	bool stream;
	bool logprobs;        /* return each generated token's log-probability */
	int32_t top_logprobs; /* and the most likely alternatives, 0..IPC_MAX_TOP_LOGPROBS */
	/* structured output, at most one of them: GBNF text, or a JSON
	 * Schema object as compact JSON text (the daemon converts it) */
	const char *grammar;
	size_t grammar_len;
	const char *json_schema;
	size_t json_schema_len;
	int64_t deadline_ms; /* 0: none; else relative to arrival */
	int32_t priority;    /* -10..10, higher first; default 0 */

	/* poll */
	uint64_t ack;     /* bytes of the stream's text the client holds */
	uint32_t wait_ms; /* long-poll limit; default 1000 */

	/* tokenize */
	const char *text;
	size_t text_len;
	bool add_special;   /* default true */
	bool parse_special; /* default false */
	/* detokenize */
	const int32_t *ids;
	size_t n_ids;
	bool special; /* render control tokens as their text; default false */
	/* embed: the texts (input, a string or a list of them; none empty) */
	const char *const *inputs;
	const size_t *input_lens;
	size_t n_inputs;
	int32_t pooling; /* enum ipc_pooling */
	bool truncate;   /* cut inputs longer than the context instead of refusing */

	struct ipc_arena *arena_; /* private */
};

/* Parse and validate one message. `lim` may be NULL (defaults). On success
 * stores a new request in *ret_req (free with ipc_request_free) and returns 0.
 * On failure returns the negative errno of the failure's ipc_errcode (map it
 * with ipc_errcode_from_errno) and describes it in `err`, naming the field;
 * nesting deeper than max_depth is rejected by a linear scan before jansson
 * sees the message, so no input can exhaust the stack. */
int ipc_request_parse(const char *json, size_t len, const struct ipc_limits *lim,
                      struct ipc_request **ret_req, struct cm_err *err);
/* As ipc_request_parse, and stores in *ret_op (may be NULL) the op the
 * envelope named when it is a known one, even when a later field failed;
 * else IPC_OP_NONE. The server counts refused requests by op with it. */
int ipc_request_parse_op(const char *json, size_t len, const struct ipc_limits *lim,
                         struct ipc_request **ret_req, enum ipc_op *ret_op, struct cm_err *err);
void ipc_request_free(struct ipc_request *req); /* NULL-safe */

/* A request with every field at its protocol default (for encoders). */
void ipc_request_init(struct ipc_request *req, enum ipc_op op);

/* Encode a request as JSON (used by libedgelm and the tests); fields equal to
 * their defaults and not flagged in sampling.set are left out. Stores a
 * NUL-terminated cm_malloc'd string in *ret_json (length in *ret_len if not
 * NULL). Returns 0 or a negative errno. */
int ipc_request_encode(const struct ipc_request *req, char **ret_json, size_t *ret_len,
                       struct cm_err *err);

/* ---- replies ------------------------------------------------------------- */

enum ipc_finish {
	IPC_FINISH_NONE = 0, /* not finished (poll chunks before the last) */
	IPC_FINISH_STOP,     /* end of generation token or a stop string */
	IPC_FINISH_LENGTH,   /* max_tokens or the context */
	IPC_FINISH_CANCELLED,
	IPC_FINISH_DEADLINE,
	IPC_FINISH_COUNT
};
const char *ipc_finish_name(enum ipc_finish f);

struct ipc_usage {
	int64_t prompt_tokens;
	int64_t cached_tokens; /* of the prompt, reused from the prefix cache */
	int64_t completion_tokens;
};

/* A generated token's log-probability under the model (a log softmax of
 * its raw logits), with the most likely alternatives, best first. Token
 * texts are the tokens' bytes (invalid UTF-8 encodes as U+FFFD, so the
 * pieces of a character split over tokens do not add up to it). */
#define IPC_MAX_TOP_LOGPROBS 20
struct ipc_logprob_top {
	const char *token;
	size_t token_len;
	float logprob; /* -inf encodes as null */
};
struct ipc_logprob {
	const char *token;
	size_t token_len;
	float logprob;
	const struct ipc_logprob_top *top;
	size_t n_top;
};

/* Milliseconds and tokens per second; a non-finite value encodes as null. */
struct ipc_timings {
	double queue_ms;
	double ttft_ms; /* arrival to first generated token */
	double prefill_ms;
	double decode_ms;
	double total_ms;
	double prefill_tps;
	double decode_tps;
};

/* generate / chat. With `stream` set, only the id is sent (the stream's
 * start); otherwise the whole result. */
struct ipc_gen_reply {
	bool stream;
	const char *text;
	size_t text_len;
	/* with the request's logprobs: every generated token's, in order */
	bool has_logprobs;
	const struct ipc_logprob *logprobs;
	size_t n_logprobs;
	enum ipc_finish finish;
	struct ipc_usage usage;
	struct ipc_timings timings;
};

/* poll: the stream's text from byte `offset` (the request's ack) on. `done`
 * only when the stream has finished and `text` reaches its end; then finish,
 * usage and timings are set. */
struct ipc_poll_reply {
	uint64_t offset;
	uint64_t next; /* decoded replies: the offset after this chunk (the next ack);
	                * the encoder ignores it and sends offset + text_len */
	const char *text;
	size_t text_len;
	/* with the request's logprobs: the tokens whose text ends in this
	 * chunk (at the end, every token not sent yet) */
	bool has_logprobs;
	const struct ipc_logprob *logprobs;
	size_t n_logprobs;
	bool done;
	enum ipc_finish finish;
	struct ipc_usage usage;
	struct ipc_timings timings;
};

struct ipc_cancel_reply {
	bool cancelled; /* false: it had already finished (and is now freed) */
};

struct ipc_tokenize_reply {
	const int32_t *ids;
	size_t n_ids;
};

struct ipc_detokenize_reply {
	const char *text;
	size_t text_len;
};

/* embed: one unit vector per input, in the inputs' order. */
struct ipc_embedding {
	const float *values;
	size_t n_values; /* the model's embedding length */
	int64_t tokens;  /* of the input, after any truncation */
};
struct ipc_embed_reply {
	const struct ipc_embedding *data;
	size_t n;
	const char *pooling; /* the pooling used: "mean", "cls", "last" */
	int64_t prompt_tokens; /* all inputs' tokens */
};

struct ipc_info_reply {
	const char *version;      /* edgelm version */
	const char *model;        /* file or name */
	const char *architecture; /* "llama", ... */
	const char *const *quant_types;
	size_t n_quant_types;
	int64_t n_ctx; /* context length in tokens */
	int64_t n_vocab;
	const char *isa;     /* kernel variant chosen */
	const char *kernels; /* free text, e.g. per dtype */
	int32_t threads;
	const char *tuning_json; /* optional JSON object, embedded as "tuning" */
};

enum ipc_health_status {
	IPC_HEALTH_LOADING,
	IPC_HEALTH_READY,
	IPC_HEALTH_DRAINING,
	IPC_HEALTH_COUNT
};
const char *ipc_health_name(enum ipc_health_status s);

struct ipc_health_reply {
	enum ipc_health_status status;
	const char *const *reasons; /* why not ready / what is degraded */
	size_t n_reasons;
};

struct ipc_metric_label {
	const char *name;
	const char *value;
};

/* One sample, as the monitor exports it: the Prometheus name, its type
 * ("counter", "gauge"; histograms as their _bucket/_sum/_count samples). */
struct ipc_metric {
	const char *name;
	const char *type;
	const struct ipc_metric_label *labels;
	size_t n_labels;
	double value; /* NaN/Inf encode as null */
};

/* Either a JSON object made by the daemon (monitor_json_render's text, schema
 * in docs/monitor.md), sent as "metrics": {...}; or, when json is NULL, a
 * list of samples sent as "metrics": [...]. Decoding fills the same field. */
struct ipc_metrics_reply {
	const char *json;
	const struct ipc_metric *items;
	size_t n_items;
};

/* A reply to any op, or an error when `error` != IPC_ERR_NONE (then only
 * message and retry_after_ms count). `id` is echoed when not NULL. */
struct ipc_reply {
	enum ipc_op op; /* may be IPC_OP_NONE for errors */
	const char *id;
	enum ipc_errcode error;
	const char *message;
	int64_t retry_after_ms; /* < 0: none */
	union {
		struct ipc_gen_reply gen; /* generate, chat */
		struct ipc_poll_reply poll;
		struct ipc_cancel_reply cancel;
		struct ipc_tokenize_reply tokenize;
		struct ipc_detokenize_reply detokenize;
		struct ipc_info_reply info;
		struct ipc_health_reply health;
		struct ipc_metrics_reply metrics;
		struct ipc_embed_reply embed;
	} u;
	struct ipc_arena *arena_; /* private: set only on decoded replies */
};

/* Encode a reply. Text that is not valid UTF-8 is sent with each bad byte
 * replaced by U+FFFD (poll offsets stay byte offsets of the daemon's text).
 * Stores a NUL-terminated cm_malloc'd string in *ret_json. */
int ipc_reply_encode(const struct ipc_reply *r, char **ret_json, size_t *ret_len,
                     struct cm_err *err);

/* Shorthand for an error reply; `id` and `msg` may be NULL (then the code's
 * description is sent), retry_after_ms < 0 for none. */
int ipc_error_encode(enum ipc_errcode code, const char *id, const char *msg, int64_t retry_after_ms,
                     char **ret_json, size_t *ret_len);

/* Decode a reply (libedgelm, tests). `expect` is the op of the request, so
 * that the union is read right; an error reply decodes with `error` set.
 * Free with ipc_reply_free. */
int ipc_reply_decode(const char *json, size_t len, enum ipc_op expect, struct ipc_reply **ret_reply,
                     struct cm_err *err);
void ipc_reply_free(struct ipc_reply *r); /* NULL-safe; decoded replies only */

/* ---- server -------------------------------------------------------------- */

typedef struct ipc_server ipc_server;
typedef struct ipc_call ipc_call;

/* Called on an nng thread for every valid request while the server is not
 * draining. It must not block. It owns `call` and must complete it exactly
 * once, now or later, from any thread, with ipc_call_reply or ipc_call_error.
 * Malformed requests never reach it: they are answered by the server. */
typedef void (*ipc_handler_fn)(ipc_call *call, void *userdata);

/* Something the daemon should log, from the self-check thread (the server
 * keeps no log): `level` is a syslog priority (LOG_ERR, LOG_WARNING,
 * LOG_NOTICE), `msg` one line. `userdata` is the handler's. It must not call
 * ipc_server_stop or ipc_server_free. */
typedef void (*ipc_event_fn)(void *userdata, int level, const char *msg);

/* Called once for every request answered, on the thread that completes it
 * (the self-check's round trips excepted): the request's op (IPC_OP_NONE
 * when the message named no known op) and the error code sent, or
 * IPC_ERR_NONE. It covers the requests the server refuses itself (malformed,
 * draining), which never reach the handler, so a daemon can count every
 * reply by outcome. `userdata` is the handler's. It must not block. */
typedef void (*ipc_reply_fn)(void *userdata, enum ipc_op op, enum ipc_errcode code);

/* The self-check (struct ipc_server_params.selfcheck_ms): the period the
 * daemon should use, and the default bound of one round trip. */
#define IPC_SELFCHECK_DEFAULT_MS 2000
#define IPC_SELFCHECK_TIMEOUT_MS 2000

struct ipc_server_params {
	const char *const *urls;  /* ipc:// (socket file), tcp://, tls+tcp://; inproc:// for tests */
	size_t n_urls;            /* 0: IPC_DEFAULT_URL */
	unsigned n_contexts;      /* receivers kept waiting; default 16 */
	unsigned max_contexts;    /* calls in progress at most; default 1024. Beyond it,
	                           * nng holds further requests until a call completes */
	int socket_mode;          /* mode of ipc:// socket files; 0: 0660, -1: leave */
	const char *socket_group; /* group of ipc:// socket files; NULL: leave */
	struct ipc_limits limits; /* limits.max_msg_bytes is also NNG_OPT_RECVMAXSZ:
	                           * a bigger message makes nng drop the connection */
	/* Self-check: every selfcheck_ms a thread dials each ipc:// and tcp://
	 * listener afresh and makes a round trip that the server answers itself
	 * (never the handler). A listener that fails twice in a row is closed and
	 * re-created, which disconnects the clients connected through it (for
	 * failures other than a wedge's, more of them, up to 16, while
	 * re-creating it did not help): nng 1.5.2 (bug #1518) stops taking new
	 * connections on a listener for good when a peer disconnects while the
	 * SP headers are exchanged, which one local connect() and close() does.
	 * Its round trips are not counted as
	 * requests; it needs limits.max_msg_bytes of 256 at least. 0: off. */
	unsigned selfcheck_ms;
	unsigned selfcheck_timeout_ms; /* bound of one dial and round trip;
	                                * 0: IPC_SELFCHECK_TIMEOUT_MS */
	ipc_event_fn on_event;         /* NULL: events are only counted */
	ipc_reply_fn on_reply;         /* NULL: replies are counted in the stats only */
	/* tls+tcp:// listeners: the server's certificate and key (PEM files,
	 * both required) and, optionally, the CA file that client certificates
	 * must chain to. With a CA a client must present a valid certificate
	 * and its subject CN is its identity ("tls:CN"); without one, clients
	 * are not authenticated ("tls:anonymous"). The files are read in
	 * ipc_server_new, and again by ipc_server_tls_reload. */
	const char *tls_cert_file, *tls_key_file, *tls_ca_file;
};

/* Check that nng can start the threads it creates on its first use (7, plus
 * 3 a CPU up to 8 CPUs and 1 a CPU beyond: 13 on 2 CPUs, each with the
 * default stack) within this process's limits (RLIMIT_AS, TasksMax=,
 * RLIMIT_NPROC), with some address space to spare: nng 1.5.2 segfaults,
 * panics or hangs when one of them cannot be created. Returns 0, or -ENOMEM
 * (address space) or -EAGAIN (tasks) with a message naming the limit.
 * ipc_server_new calls it until a server has opened its socket; call it
 * earlier to fail before other work. */
int ipc_preflight(struct cm_err *err);

/* Validate params and open the socket and its listeners (not yet serving).
 * Fails with a clear message when an ipc:// socket's directory is missing,
 * or when ipc_preflight fails. */
int ipc_server_new(const struct ipc_server_params *p, ipc_handler_fn handler, void *userdata,
                   ipc_server **ret_srv, struct cm_err *err);

/* Start listening and receiving, then set the mode and group of ipc:// socket
 * files, and start the self-check. Returns a negative errno (server not
 * serving) on failure: -EEXIST when something other than a socket is at an
 * ipc:// path (nng would delete it), -EADDRINUSE when a server answers there
 * (checked with a full SP handshake, which cannot wedge that server). A
 * stale socket file is replaced. A failed chown to socket_group is not
 * fatal: the server serves, the return is 0 and `err` holds the failure
 * (err->code != 0) for the caller to log. */
int ipc_server_start(ipc_server *srv, struct cm_err *err);

/* Read the TLS files again (the same checks as ipc_server_new): the
 * connections made from now on use them, connected clients keep what they
 * were accepted with. On failure nothing changes. 0 without a tls+tcp://
 * listener. */
int ipc_server_tls_reload(ipc_server *srv, const char *cert_file, const char *key_file,
                          const char *ca_file, struct cm_err *err);

/* From now on answer shutting_down to new requests; calls already handed to
 * the handler are still completed normally. */
void ipc_server_drain(ipc_server *srv);

/* Stop the self-check (joining its thread), drain, wait up to timeout_ms for
 * the handler's calls to complete and their replies to be handed to nng, then
 * close the listeners and the socket
 * (ipc:// socket files are removed). Returns the number of calls still not
 * completed; completing them later is harmless (the reply is dropped and
 * ipc_call_reply returns -ESHUTDOWN) but must happen before ipc_server_free. */
int ipc_server_stop(ipc_server *srv, int timeout_ms);

/* Stop (timeout 0) if needed and free. Every call must have been completed. */
void ipc_server_free(ipc_server *srv); /* NULL-safe */

struct ipc_server_stats {
	uint64_t received;              /* messages received */
	uint64_t replies;               /* replies sent, errors included */
	uint64_t errors[IPC_ERR_COUNT]; /* error replies by code */
	uint64_t send_failures;         /* replies nng could not send */
	uint32_t contexts;              /* nng contexts open */
	uint32_t in_handler;            /* calls owned by the handler now */
	/* self-check (not counted above) */
	uint64_t selfchecks;          /* round trips that passed */
	uint64_t selfcheck_failures;  /* round trips that failed */
	uint64_t listener_recoveries; /* listeners re-created after failing */
	/* cm_now_ns() when a round last passed on every listener (the start
	 * until then); 0 when the self-check is off. A round in which every
	 * context is held by the handler proves nothing and does not count. */
	uint64_t selfcheck_ok_ns;
};
void ipc_server_stats_get(const ipc_server *srv, struct ipc_server_stats *ret_stats);

/* ---- calls from the daemon's other transports ----------------------------- */

#define IPC_IDENTITY_MAX 63 /* bytes of a submitted call's identity */

/* The reply to a submitted request: its JSON (valid during the callback
 * only). Called exactly once, on any thread, possibly before
 * ipc_server_submit returns; it must not block. */
typedef void (*ipc_submit_done_fn)(void *ud, const char *json, size_t len);

/* Hand one request (protocol JSON) to the handler as if it had arrived on
 * the socket, for a transport of the daemon's own (http/): the same parser,
 * limits, draining and reply counting (on_reply), with no nng context.
 * `identity` ("http:NAME", at most IPC_IDENTITY_MAX bytes) stands for the
 * peer uid: ipc_call_identity returns it, ipc_call_peer gives -1. Returns 0
 * (done will be called), -ENOMEM or -ESHUTDOWN once the server is stopped
 * (done is not called). */
int ipc_server_submit(ipc_server *srv, const char *json, size_t len, const char *identity,
                      ipc_submit_done_fn done, void *ud);

/* ---- calls --------------------------------------------------------------- */

const struct ipc_request *ipc_call_request(const ipc_call *call);
/* CLOCK_MONOTONIC nanoseconds (cm_now_ns) when the message arrived. */
uint64_t ipc_call_arrival_ns(const ipc_call *call);
/* The peer's credentials over ipc:// (-1 when unknown, e.g. tcp://, tls+tcp://). */
void ipc_call_peer(const ipc_call *call, int64_t *ret_pid, int64_t *ret_uid);

/* The caller's identity when it is not a uid, else NULL (ipc:// peers are
 * known by their uid, plain tcp:// peers by nothing): "tls:CN" for a
 * tls+tcp:// client whose certificate the CA verified, "tls:anonymous" for
 * one when no tls_ca_file is set, or what another transport gave
 * ipc_server_submit ("http:NAME"). */
const char *ipc_call_identity(const ipc_call *call);

/* Complete a call with a JSON reply (copied). The call is consumed whatever
 * the result; a negative errno only says the reply could not be queued. */
int ipc_call_reply(ipc_call *call, const char *json, size_t len);
/* Encode `r` (its id defaults to the request's) and complete the call. */
int ipc_call_reply_encode(ipc_call *call, const struct ipc_reply *r);
/* Complete a call with an error; fmt may be NULL (the code's description). */
int ipc_call_error(ipc_call *call, enum ipc_errcode code, int64_t retry_after_ms, const char *fmt,
                   ...) CM_PRINTF(4, 5);

/* libedgelm's edgelm_close waits this long at most for nng's close, which
 * runs in a helper thread (client.c); tests may replace the close itself
 * (NULL: nng_close of the socket with that id). */
#define IPC_CLOSE_WAIT_MS 2000
extern void (*ipc_client_close_fn)(uint32_t sock_id);

/* A call that finds no connection for IPC_REDIAL_AFTER_MS dials the daemon
 * again itself, at most IPC_MAX_REDIALS times a client (client.c: redial).
 * ipc_client_stall_dialer closes the client's first dialer without a
 * reconnect, as a stalled nng reaper leaves it (for tests). */
#define IPC_REDIAL_AFTER_MS 1500
#define IPC_MAX_REDIALS 4
struct edgelm_client;
int ipc_client_stall_dialer(struct edgelm_client *c);

#endif
