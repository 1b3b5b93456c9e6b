/* http/http.h: the HTTP front (docs/http.md): OpenAI-compatible endpoints
 * with Server-Sent Events, /health, and the web page, on libmicrohttpd.
 *
 * It knows nothing of the engine and nothing of ipc/: it turns each HTTP
 * request into the daemon's protocol JSON (docs/protocol.md) and hands it
 * to `submit`, which the daemon wires to the same parser and op handlers
 * as the nng socket (ipc_server_submit): one request core, two transports.
 * Replies come back as protocol JSON and are turned into OpenAI's shapes.
 *
 * Threads: libmicrohttpd runs one thread per connection (capped by
 * max_connections), so a generation may block its own connection's thread
 * while it waits for the core, watching its socket at the same time: a
 * client that goes away cancels its generation at once. */
#ifndef EDGELM_HTTP_H
#define EDGELM_HTTP_H

#include "common/common.h"

#include <stdbool.h>
#include <stddef.h>

/* The reply to a submitted request (protocol JSON, valid during the call). */
typedef void (*http_done_fn)(void *ud, const char *json, size_t len);
/* Hand a protocol request to the core as `identity`; 0 when done will be
 * called exactly once (on any thread), else a negative errno: -EAGAIN
 * while the core is not up yet (the front answers 503 "loading"), others
 * when it has stopped (503 "shutting down"). */
typedef int (*http_submit_fn)(void *core, const char *json, size_t len, const char *identity,
			      http_done_fn done, void *ud);

#define HTTP_MAX_LISTEN 8
#define HTTP_DEFAULT_MAX_CONNECTIONS 64
#define HTTP_DEFAULT_TIMEOUT_S 30
#define HTTP_DEFAULT_MAX_BODY ((size_t)1280 * 1024) /* the socket's 1216 KiB and room */

struct http_params {
	const char *const *listen; /* "ADDR:PORT", "[ADDR6]:PORT", "localhost:PORT" */
	size_t n_listen;
	const char *api_key_file; /* "NAME KEY" or "KEY" lines; NULL or "": no auth */
	unsigned max_connections; /* per listener; 0: HTTP_DEFAULT_MAX_CONNECTIONS */
	unsigned timeout_s;       /* idle connections are closed; 0: HTTP_DEFAULT_TIMEOUT_S */
	size_t max_body_bytes;    /* larger bodies get 413; 0: HTTP_DEFAULT_MAX_BODY */
	double rate_limit;        /* requests a second per client address; 0: off */
	const char *cors_origin;  /* Access-Control-Allow-Origin; NULL or "": no CORS */
	http_submit_fn submit;
	void *core;
};

typedef struct http_front http_front;

/* Read the key file, bind every address and serve. Errors name the address
 * or the file's line. */
int http_front_start(const struct http_params *p, http_front **ret, struct cm_err *err);
/* The port bound for listen address i (the one asked for, or the kernel's
 * pick for port 0). */
unsigned http_front_port(const http_front *h, size_t i);
/* From now on new generations get 503 (running ones go on). */
void http_front_drain(http_front *h);
/* Close every connection (their generations are cancelled), join the
 * threads, free. NULL-safe. */
void http_front_stop(http_front *h);

/* Parse the API key file's text: each line "NAME KEY" or "KEY" (then the
 * name is key1, key2, ... by line), # comments and blank lines skipped.
 * Keys are 8-256 printable ASCII characters without spaces. Returns the
 * number of keys (>= 1) or a negative errno with the line in err; *names
 * and *keys are cm_malloc'd arrays of cm_malloc'd strings
 * (http_keys_free). For the daemon and the tests. */
int http_keys_parse(const char *text, char ***names, char ***keys, struct cm_err *err);
void http_keys_free(char **names, char **keys, int n);

#endif
