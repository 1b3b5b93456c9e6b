/* tools/lib/bench_daemon.c: `edgelm-bench --daemon URL`, the daemon under
 * concurrent load, measured from the client side through libedgelm.
 *
 * (a) aggregate decode tokens/s with 1, 4 and 8 concurrent streams (each
 *     generates --n tokens from a short prompt; aggregate = all tokens / wall
 *     time from the common start to the last finish), and the speed-up over
 *     one stream: continuous batching reads the weights once per step for
 *     every running sequence, so it should grow with the number of streams;
 * (b) time to first token of a short request, idle and while a long prompt
 *     (--long tokens, default 2000) is being prefilled: the scheduler's
 *     chunked prefill should keep the second within 2x the first;
 * (c) with --http URL, the cost of the HTTP front: (a)'s streams run both
 *     as libedgelm streams over the socket and as SSE streams over
 *     /v1/completions, alternating, and the table gives both and their
 *     ratio (the HTTP client is a plain socket: HTTP/1.0, so the stream
 *     ends with the connection and needs no chunked decoding);
 * (d) with --compare URL, two sets of daemons side by side: (a)'s streams
 *     run against the --daemon set and the --compare set, alternating, and
 *     the table gives both sets' tokens/s and median request latency (e.g.
 *     ipc:// against tls+tcp:// on one daemon: the cost of TLS; or three
 *     daemons against one).
 *
 * --daemon and --compare take what edgelmctl's --socket takes: repeated,
 * or a comma-separated list (one client dials them all and nng spreads the
 * requests over them, ipc/edgelm.h), with --tls-cert, --tls-key and
 * --tls-ca for tls+tcp:// (else $EDGELM_TLS_CERT, ...). Each run shares one
 * client among its concurrent requests, as an application would. */
#include "tools/lib/tools.h"

#include "common/common.h"
#include "ipc/edgelm.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <netdb.h>
#include <sys/socket.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BD_MAX_URLS 16

/* A set of daemons and how to reach them. */
struct bd_target {
	const char *urls[BD_MAX_URLS];
	size_t n_urls;
	const char *tls_cert, *tls_key, *tls_ca; /* NULL: the environment's */
	char label[512];                         /* the URLs, comma-separated */
};

static int bd_connect(const struct bd_target *t, edgelm_client **ret, struct edgelm_error *e)
{
	struct edgelm_connect_opts o;
	edgelm_connect_opts_init(&o);
	o.urls = t->urls;
	o.n_urls = t->n_urls;
	o.tls_cert_file = t->tls_cert;
	o.tls_key_file = t->tls_key;
	o.tls_ca_file = t->tls_ca;
	return edgelm_connect_ex(&o, ret, e);
}

struct bd_job {
	edgelm_client *client; /* shared by a run's jobs */
	const char *http;      /* "HOST:PORT": stream over HTTP instead */
	const char *key;  /* its API key, or NULL */
	bool stream;      /* over the socket: edgelm_generate_stream */
	const char *prompt;
	int max_tokens;
	double t_start, t_end, ttft_ms;
	int64_t tokens;
	int rc;
	pthread_barrier_t *bar;
};

static int bd_ignore_text(const char *text, size_t len, void *user)
{
	(void)text;
	(void)len;
	(void)user;
	return 0;
}

static int http_connect(const char *hostport)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	if (!colon || (size_t)(colon - hostport) >= sizeof(host))
		return -1;
	memcpy(host, hostport, (size_t)(colon - hostport));
	host[colon - hostport] = '\0';
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	if (getaddrinfo(host, colon + 1, &hints, &ai) != 0)
		return -1;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

/* One streamed completion over HTTP: the tokens from the usage chunk, the
 * first content event's time as the TTFT. */
static void bd_run_http(struct bd_job *j)
{
	char body[512], req[1024];
	int bl = snprintf(body, sizeof(body),
			  "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":true,"
			  "\"stream_options\":{\"include_usage\":true}}",
			  j->prompt, j->max_tokens);
	char auth[320] = "";
	if (j->key)
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", j->key);
	int rl = snprintf(req, sizeof(req),
			  "POST /v1/completions HTTP/1.0\r\nHost: edgelm\r\n%sContent-Type: "
			  "application/json\r\nContent-Length: %d\r\n\r\n%s",
			  auth, bl, body);
	j->rc = -1;
	int fd = http_connect(j->http);
	if (fd < 0) {
		fprintf(stderr, "edgelm-bench: cannot connect to %s\n", j->http);
		return;
	}
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	j->t_start = cm_now();
	if (!buf || write(fd, req, (size_t)rl) != rl) {
		free(buf);
		close(fd);
		return;
	}
	double first = 0;
	for (;;) {
		if (len + 4096 > cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb)
				break;
			buf = nb;
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n <= 0)
			break;
		len += (size_t)n;
		buf[len] = '\0';
		if (!first && strstr(buf, "data: {"))
			first = cm_now();
	}
	j->t_end = cm_now();
	close(fd);
	if (buf && len) {
		const char *u = strstr(buf, "\"completion_tokens\":");
		if (strncmp(buf, "HTTP/1.", 7) == 0 && strncmp(buf + 9, "200", 3) == 0 && u &&
		    strstr(buf, "data: [DONE]")) {
			j->tokens = strtoll(u + 20, NULL, 10);
			j->ttft_ms = first ? (first - j->t_start) * 1e3 : -1;
			j->rc = 0;
		} else {
			fprintf(stderr, "edgelm-bench: HTTP: %.200s\n", buf);
		}
	}
	free(buf);
}

static void *bd_run(void *arg)
{
	struct bd_job *j = arg;
	if (j->http) {
		if (j->bar)
			pthread_barrier_wait(j->bar);
		bd_run_http(j);
		return NULL;
	}
	edgelm_client *c = j->client;
	struct edgelm_error e;
	if (j->bar)
		pthread_barrier_wait(j->bar);
	struct edgelm_params p;
	edgelm_params_init(&p);
	p.max_tokens = j->max_tokens;
	p.temperature = 0;
	struct edgelm_result r = {0};
	j->t_start = cm_now();
	j->rc = j->stream ? edgelm_generate_stream(c, j->prompt, &p, bd_ignore_text, NULL, &r, &e)
			  : edgelm_generate(c, j->prompt, &p, &r, &e);
	j->t_end = cm_now();
	if (j->rc == 0) {
		j->tokens = r.completion_tokens;
		j->ttft_ms = r.ttft_ms;
	} else {
		fprintf(stderr, "edgelm-bench: generate: %s\n", e.message);
	}
	edgelm_result_free(&r);
	return NULL;
}

/* The median of v[0..n) (sorted in place), -1 for none. */
static double median(double *v, int n)
{
	for (int a = 1; a < n; a++)
		for (int b = a; b > 0 && v[b] < v[b - 1]; b--) {
			double t = v[b];
			v[b] = v[b - 1];
			v[b - 1] = t;
		}
	return n ? v[n / 2] : -1;
}

/* n concurrent generations; returns aggregate tokens/s, < 0 on failure, and
 * (ret_lat_ms, may be NULL) the median of the requests' latencies, start to
 * last token. http: over the HTTP front (HOST:PORT) instead of the socket;
 * stream: socket streams. */
static double bd_concurrent_via(const struct bd_target *tgt, const char *http, const char *key,
				bool stream, int n, int max_tokens, double *ret_lat_ms)
{
	static const char *prompts[] = {"Once upon a time", "The little dog", "One day, a girl",
					"In the park", "Tom and Lily", "The sun was", "A big red ball",
					"Mom said"};
	pthread_t th[64];
	struct bd_job jobs[64];
	pthread_barrier_t bar;
	n = CM_MIN(n, 64);
	edgelm_client *client = NULL;
	if (!http) {
		struct edgelm_error e;
		if (bd_connect(tgt, &client, &e) != 0) {
			fprintf(stderr, "edgelm-bench: %s\n", e.message);
			return -1;
		}
		edgelm_set_timeout(client, 0);
	}
	pthread_barrier_init(&bar, NULL, (unsigned)n);
	for (int i = 0; i < n; i++) {
		jobs[i] = (struct bd_job){.client = client,
					  .http = http,
					  .key = key,
					  .stream = stream,
					  .prompt = prompts[i % CM_ARRAY_LEN(prompts)],
					  .max_tokens = max_tokens,
					  .bar = &bar};
		pthread_create(&th[i], NULL, bd_run, &jobs[i]);
	}
	double t0 = INFINITY, t1 = 0, lat[64];
	int64_t tokens = 0;
	bool ok = true;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		ok = ok && jobs[i].rc == 0;
		t0 = CM_MIN(t0, jobs[i].t_start);
		t1 = CM_MAX(t1, jobs[i].t_end);
		tokens += jobs[i].tokens;
		lat[i] = (jobs[i].t_end - jobs[i].t_start) * 1e3;
	}
	pthread_barrier_destroy(&bar);
	edgelm_close(client);
	if (ret_lat_ms)
		*ret_lat_ms = median(lat, n);
	return ok && t1 > t0 ? (double)tokens / (t1 - t0) : -1;
}

static double bd_concurrent(const struct bd_target *tgt, int n, int max_tokens)
{
	return bd_concurrent_via(tgt, NULL, NULL, false, n, max_tokens, NULL);
}

/* A prompt of about `n` tokens (the daemon's tokenizer counts). */
static char *long_prompt(const struct bd_target *tgt, int n)
{
	static const char *words[] = {"the", "little", "dog", "ran", "to", "park", "and",
				      "saw", "a", "big", "red", "ball", "under", "tree"};
	size_t cap = (size_t)n * 12 + 64, len = 0;
	char *s = malloc(cap);
	if (!s)
		return NULL;
	s[0] = '\0';
	edgelm_client *c = NULL;
	if (bd_connect(tgt, &c, NULL) != 0) {
		free(s);
		return NULL;
	}
	/* grow by words, checking the count every 16 words; then drop words
	 * from the end until it fits: at most n tokens, BOS included */
	size_t word_end[4096];
	int n_words = 0;
	int nt = 0;
	for (int i = 0; n_words < 4096; i++) {
		const char *w = words[(i * 7 + i / 3) % CM_ARRAY_LEN(words)];
		size_t wl = strlen(w);
		if (len + wl + 2 >= cap)
			break;
		if (len)
			s[len++] = ' ';
		memcpy(s + len, w, wl + 1);
		len += wl;
		word_end[n_words++] = len;
		if (i % 16 == 15) {
			int32_t *ids = NULL;
			size_t ntok = 0;
			if (edgelm_tokenize(c, s, true, false, &ids, &ntok, NULL) != 0)
				break;
			edgelm_free(ids);
			nt = (int)ntok;
			if (nt >= n)
				break;
		}
	}
	while (nt > n && n_words > 1) {
		s[word_end[--n_words - 1]] = '\0';
		int32_t *ids = NULL;
		size_t ntok = 0;
		if (edgelm_tokenize(c, s, true, false, &ids, &ntok, NULL) != 0)
			break;
		edgelm_free(ids);
		nt = (int)ntok;
	}
	edgelm_close(c);
	return s;
}

static double bd_ttft(edgelm_client *c)
{
	struct bd_job j = {.client = c, .prompt = "Once upon a time", .max_tokens = 4};
	bd_run(&j);
	return j.rc == 0 ? j.ttft_ms : -1;
}

/* (c): socket streams against HTTP streams, alternating, medians. */
static int bd_http_compare(const struct bd_target *tgt, const char *http, const char *key,
			   const int *streams, int n_streams, int n_gen, int reps, bool json)
{
	if (bd_concurrent_via(tgt, http, key, true, 1, 4, NULL) < 0) {
		fprintf(stderr, "edgelm-bench: cannot stream over HTTP from %s\n", http);
		return 3;
	}
	if (json)
		printf("{\"daemon\":\"%s\",\"http\":\"%s\",\"tokens_per_stream\":%d,\"reps\":%d,"
		       "\"streams\":[",
		       tgt->label, http, n_gen, reps);
	else
		printf("streams   socket tok/s   HTTP tok/s   HTTP/socket  (medians of %d, "
		       "alternating)\n",
		       reps);
	for (int i = 0; i < n_streams; i++) {
		double a[100], b[100], ratio[100];
		for (int r = 0; r < reps; r++) {
			a[r] = bd_concurrent_via(tgt, NULL, NULL, true, streams[i], n_gen, NULL);
			b[r] = bd_concurrent_via(tgt, http, key, true, streams[i], n_gen, NULL);
			if (a[r] < 0 || b[r] < 0)
				return 3;
			ratio[r] = b[r] / a[r];
		}
		double ma = median(a, reps), mb = median(b, reps), mr = median(ratio, reps);
		if (json)
			printf("%s{\"n\":%d,\"socket_tok_s\":%.2f,\"http_tok_s\":%.2f,"
			       "\"http_over_socket\":%.4f}",
			       i ? "," : "", streams[i], ma, mb, mr);
		else
			printf("%7d   %12.2f   %10.2f   %10.3f\n", streams[i], ma, mb, mr);
	}
	if (json)
		printf("]}\n");
	return 0;
}

/* (d): the --daemon set against the --compare set, alternating, medians of
 * tokens/s and of the median request latency. */
static int bd_target_compare(const struct bd_target *a, const struct bd_target *b,
			     const int *streams, int n_streams, int n_gen, int reps, bool json)
{
	if (bd_concurrent(b, 1, 4) < 0) {
		fprintf(stderr, "edgelm-bench: cannot generate through %s\n", b->label);
		return 3;
	}
	if (json)
		printf("{\"daemon\":\"%s\",\"compare\":\"%s\",\"tokens_per_stream\":%d,"
		       "\"reps\":%d,\"streams\":[",
		       a->label, b->label, n_gen, reps);
	else
		printf("A: %s\nB: %s\n"
		       "streams   A tok/s   B tok/s   B/A     A latency ms   B latency ms  "
		       "(medians of %d, alternating)\n",
		       a->label, b->label, reps);
	for (int i = 0; i < n_streams; i++) {
		double ta[100], tb[100], la[100], lb[100], ratio[100];
		for (int r = 0; r < reps; r++) {
			ta[r] = bd_concurrent_via(a, NULL, NULL, false, streams[i], n_gen, &la[r]);
			tb[r] = bd_concurrent_via(b, NULL, NULL, false, streams[i], n_gen, &lb[r]);
			if (ta[r] < 0 || tb[r] < 0)
				return 3;
			ratio[r] = tb[r] / ta[r];
		}
		double mta = median(ta, reps), mtb = median(tb, reps), mr = median(ratio, reps);
		double mla = median(la, reps), mlb = median(lb, reps);
		if (json)
			printf("%s{\"n\":%d,\"a_tok_s\":%.2f,\"b_tok_s\":%.2f,\"b_over_a\":%.4f,"
			       "\"a_latency_ms\":%.2f,\"b_latency_ms\":%.2f}",
			       i ? "," : "", streams[i], mta, mtb, mr, mla, mlb);
		else
			printf("%7d   %7.2f   %7.2f   %5.3f   %12.2f   %12.2f\n", streams[i], mta, mtb,
			       mr, mla, mlb);
	}
	if (json)
		printf("]}\n");
	return 0;
}

/* Adds a --daemon/--compare argument to t (the library splits commas). */
static bool bd_target_add(struct bd_target *t, const char *arg)
{
	if (t->n_urls >= BD_MAX_URLS) {
		fprintf(stderr, "edgelm-bench: at most %d --daemon/--compare each\n", BD_MAX_URLS);
		return false;
	}
	t->urls[t->n_urls++] = arg;
	size_t l = strlen(t->label);
	snprintf(t->label + l, sizeof(t->label) - l, "%s%s", l ? "," : "", arg);
	return true;
}

void tools_bench_daemon_usage(FILE *o)
{
	fprintf(o, "usage: edgelm-bench --daemon URL... [--streams LIST] [-n N] [--long N]\n"
		   "                    [--http HOST:PORT [--api-key KEY] [--reps N]]\n"
		   "                    [--compare URL... [--reps N]]\n"
		   "                    [--tls-cert FILE --tls-key FILE] [--tls-ca FILE] [--json]\n"
		   "  --daemon URL    the daemon (ipc://, tcp://, tls+tcp://); repeat it, or give\n"
		   "                  a comma-separated list, for several: one client dials them\n"
		   "                  all and the requests spread over them\n"
		   "  --streams LIST  concurrent streams to compare (default 1,4,8)\n"
		   "  --http HOST:PORT  also stream over the daemon's HTTP front and compare:\n"
		   "                  socket streams and SSE streams alternate, --reps times\n"
		   "                  each (default 5), medians and their ratio are printed\n"
		   "                  (the key: --api-key or $EDGELM_API_KEY)\n"
		   "  --compare URL   a second set of daemons (as --daemon): each stream count\n"
		   "                  runs against both sets, alternating, --reps times; the\n"
		   "                  medians of tokens/s and request latency are printed\n"
		   "  --tls-cert FILE, --tls-key FILE  the client's certificate and key (PEM)\n"
		   "  --tls-ca FILE   the CA that signed the daemons' certificates (tls+tcp://;\n"
		   "                  default $EDGELM_TLS_CERT, $EDGELM_TLS_KEY, $EDGELM_TLS_CA)\n"
		   "  -n N            tokens per stream (default 64)\n"
		   "  --long N        tokens of the long prompt for the TTFT test (default 2000;\n"
		   "                  0 skips it; the daemon's ctx_size must hold it)\n");
}

int tools_bench_daemon_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"daemon", required_argument, NULL, 'd'}, {"streams", required_argument, NULL, 's'},
		{"n-gen", required_argument, NULL, 'n'},  {"long", required_argument, NULL, 'l'},
		{"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
		{"http", required_argument, NULL, 'H'},   {"api-key", required_argument, NULL, 'k'},
		{"reps", required_argument, NULL, 'r'},   {"compare", required_argument, NULL, 'C'},
		{"tls-cert", required_argument, NULL, 'c'}, {"tls-key", required_argument, NULL, 'K'},
		{"tls-ca", required_argument, NULL, 'A'}, {NULL, 0, NULL, 0},
	};
	struct bd_target tgt = {0}, cmp = {0};
	const char *http = NULL, *key = getenv("EDGELM_API_KEY");
	int reps = 5;
	int streams[8] = {1, 4, 8}, n_streams = 3, n_gen = 64, n_long = 2000;
	bool json = false, bad = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "d:s:n:l:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'd': bad |= !bd_target_add(&tgt, optarg); break;
		case 'C': bad |= !bd_target_add(&cmp, optarg); break;
		case 'c': tgt.tls_cert = cmp.tls_cert = optarg; break;
		case 'K': tgt.tls_key = cmp.tls_key = optarg; break;
		case 'A': tgt.tls_ca = cmp.tls_ca = optarg; break;
		case 's':
			n_streams = tools_opt_list("edgelm-bench", "--streams", optarg, 1, 1024,
						   streams, false, 8);
			bad |= n_streams < 0;
			break;
		case 'n':
			bad |= tools_opt_int("edgelm-bench", "--n-gen", optarg, 1, 1 << 20, &n_gen) != 0;
			break;
		case 'l':
			bad |= tools_opt_int("edgelm-bench", "--long", optarg, 0, 1 << 20, &n_long) != 0;
			break;
		case 'j': json = true; break;
		case 'H': http = optarg; break;
		case 'k': key = optarg; break;
		case 'r':
			bad |= tools_opt_int("edgelm-bench", "--reps", optarg, 1, 100, &reps) != 0;
			break;
		case 'h': tools_bench_daemon_usage(stdout); return 0;
		default: tools_bench_daemon_usage(stderr); return 1;
		}
	}
	if (!tgt.n_urls || bad || (http && cmp.n_urls)) { /* bad: said as parsed */
		tools_bench_daemon_usage(stderr);
		return 1;
	}
	/* warm-up: one short request */
	if (bd_concurrent(&tgt, 1, 4) < 0) {
		fprintf(stderr, "edgelm-bench: cannot generate through %s\n", tgt.label);
		return 3;
	}
	if (http)
		return bd_http_compare(&tgt, http, key, streams, n_streams, n_gen, reps, json);
	if (cmp.n_urls)
		return bd_target_compare(&tgt, &cmp, streams, n_streams, n_gen, reps, json);
	double tps[8];
	for (int i = 0; i < n_streams; i++) {
		tps[i] = bd_concurrent(&tgt, streams[i], n_gen);
		if (tps[i] < 0)
			return 3;
	}
	double idle = -1, busy = -1;
	edgelm_client *tc = NULL;
	if (n_long > 0 && bd_connect(&tgt, &tc, NULL) != 0)
		return 3;
	if (tc)
		edgelm_set_timeout(tc, 0);
	if (n_long > 0) {
		double iv[3];
		int ni = 0;
		for (int k = 0; k < 3; k++) {
			double t = bd_ttft(tc);
			if (t >= 0)
				iv[ni++] = t;
		}
		idle = ni == 3 ? median(iv, ni) : -1; /* any failure: unknown */
		char *lp = long_prompt(&tgt, n_long);
		if (lp) {
			/* several short requests spread over the long prefill: the
			 * median, since where one lands within a step is chance */
			struct bd_job lj = {.client = tc, .prompt = lp, .max_tokens = 2};
			pthread_t th;
			pthread_create(&th, NULL, bd_run, &lj);
			double v[5];
			int nv = 0;
			usleep(200000); /* let its prefill start */
			for (int k = 0; k < 5; k++) {
				double t = bd_ttft(tc);
				if (t >= 0)
					v[nv++] = t;
				usleep(50000);
			}
			pthread_join(th, NULL);
			if (lj.rc != 0)
				fprintf(stderr, "edgelm-bench: the long prompt failed\n");
			busy = median(v, nv);
			free(lp);
		}
	}
	edgelm_close(tc);
	if (json) {
		printf("{\"daemon\":\"%s\",\"tokens_per_stream\":%d,\"streams\":[", tgt.label,
		       n_gen);
		for (int i = 0; i < n_streams; i++)
			printf("%s{\"n\":%d,\"tok_s\":%.2f,\"speedup\":%.2f}", i ? "," : "", streams[i],
			       tps[i], tps[i] / tps[0]);
		printf("],\"ttft_idle_ms\":%.1f,\"ttft_during_long_prefill_ms\":%.1f,"
		       "\"long_prompt_tokens\":%d}\n",
		       idle, busy, n_long);
	} else {
		for (int i = 0; i < n_streams; i++)
			printf("%2d streams   %8.2f tok/s aggregate  (%.2fx one stream)\n", streams[i],
			       tps[i], tps[i] / tps[0]);
		if (n_long > 0)
			printf("TTFT         %.1f ms idle, %.1f ms while a %d-token prompt prefills "
			       "(%.2fx)\n",
			       idle, busy, n_long, busy / idle);
	}
	return 0;
}
