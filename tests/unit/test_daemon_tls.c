/* test_daemon_tls: the real edgelmd (stories260K) on a tls+tcp:// listener
 * with mutual TLS, as a remote box of a fleet meets it:
 * - a client whose certificate the CA signed is served;
 * - a client with no certificate, one from another CA and an expired one
 *   are refused during the handshake;
 * - the certificate's CN is the caller's identity (tls:CN): bob cannot poll
 *   or cancel alice's generation (not_found), and both may use one id;
 *   tenant_weights takes tls:NAME entries;
 * - a tls+tcp:// listener without a certificate and key, or with a file that
 *   is missing or not PEM, or a key not the certificate's, stops the start
 *   with a message naming it;
 * - plain tcp:// and TLS without a CA log that clients are not
 *   authenticated;
 * - a reload (SIGHUP) reads the files again, at unchanged paths, for new
 *   connections, and keeps the old ones when the new fail the checks.
 * The certificates are made here with the openssl CLI, in TEST_TMPDIR. The
 * client is a plain nng req0 socket with nng's TLS configuration. */
#include "common/common.h"
#include "tests/test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[4096], tls_url[128], tcp_url[128], log_path[4200];
static const char *model;
static const char *conf_path = "/dev/null";
static pid_t daemon_pid = -1;

/* A CA, the server's certificate (localhost, 127.0.0.1), clients alice,
 * bob and carol (CN nobody configured) from it, mallory from another CA,
 * and alice's certificate expired in 2020 (openssl ca, for its -startdate
 * and -enddate). Each client's cert and key together in NAME.pem, as
 * nng_tls_config_cert_key_file wants. */
static const char gen_script[] =
    "set -e\n"
    "cd \"$1\"\n"
    "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\" "
    "2>/dev/null; }\n"
    "ca() { key $1.key; openssl req -x509 -new -key $1.key -subj \"/CN=$2\" -days 30 "
    "-out $1.crt; }\n"
    "csr() { key $1.key; openssl req -new -key $1.key -subj \"/CN=$2\" -out $1.csr; }\n"
    "sign() { openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial "
    "-days 30 -out $1.crt $3 2>/dev/null; cat $1.crt $1.key > $1.pem; }\n"
    "ca ca 'edgelm test CA'\n"
    "ca other 'another CA'\n"
    "csr server localhost\n"
    "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext\n"
    "sign server ca '-extfile san.ext'\n"
    "for n in alice bob carol; do csr $n $n; sign $n ca; done\n"
    "csr mallory alice; sign mallory other\n"
    "csr odd1 'eve smith'; sign odd1 ca\n"
    "csr odd2 'x,y=z'; sign odd2 ca\n"
    "printf '[ca]\\ndefault_ca=d\\n[d]\\ndatabase=index.txt\\nnew_certs_dir=.\\n"
    "serial=serial\\ndefault_md=sha256\\npolicy=p\\nunique_subject=no\\n"
    "[p]\\ncommonName=supplied\\n' > ca.cnf\n"
    ": > index.txt; echo 01 > serial\n"
    "csr expired alice\n"
    "openssl ca -batch -config ca.cnf -cert ca.crt -keyfile ca.key -in expired.csr "
    "-out expired.crt -startdate 20200101000000Z -enddate 20200102000000Z 2>/dev/null\n"
    "cat expired.crt expired.key > expired.pem\n"
    "printf 'not a certificate\\n' > junk.crt\n";

static int gen_certs(void)
{
	char script[4200];
	snprintf(script, sizeof(script), "%s/gen.sh", dir);
	FILE *f = fopen(script, "w");
	if (!f)
		return -1;
	fputs(gen_script, f);
	fclose(f);
	char cmd[8600];
	snprintf(cmd, sizeof(cmd), "sh '%s' '%s'", script, dir);
	return system(cmd) == 0 ? 0 : -1;
}

static const char *path_of(const char *name)
{
	static char buf[4][4200];
	static int i;
	char *p = buf[i++ % 4];
	snprintf(p, sizeof(buf[0]), "%s/%s", dir, name);
	return p;
}

/* A port on 127.0.0.1 nothing listens on now. */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int port = -1;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* One request over tls_url with the client certificate `pem` (NULL: none).
 * Returns the reply, or NULL when the connection was refused. */
static json_t *tls_call_url(const char *url, const char *pem, const char *req)
{
	nng_socket s;
	nng_dialer d;
	nng_tls_config *cfg = NULL;
	json_t *j = NULL;
	if (nng_req0_open(&s) != 0)
		return NULL;
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 20000);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
	if (nng_dialer_create(&d, s, url) != 0 ||
	    nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT) != 0 ||
	    nng_tls_config_ca_file(cfg, path_of("ca.crt")) != 0 ||
	    nng_tls_config_server_name(cfg, "localhost") != 0 ||
	    nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED) != 0 ||
	    (pem && nng_tls_config_cert_key_file(cfg, pem, NULL) != 0) ||
	    nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg) != 0)
		goto out;
	/* a blocking start: it returns once the TLS and SP handshakes are
	 * done, or with why they failed */
	if (nng_dialer_start(d, 0) != 0)
		goto out;
	char *buf = NULL;
	size_t len = 0;
	if (nng_send(s, (void *)req, strlen(req), 0) == 0 &&
	    nng_recv(s, &buf, &len, NNG_FLAG_ALLOC) == 0) {
		j = json_loadb(buf, len, 0, NULL);
		nng_free(buf, len);
	}
out:
	nng_close(s);
	if (cfg)
		nng_tls_config_free(cfg);
	return j;
}

static json_t *tls_call(const char *who, const char *req)
{
	char name[64];
	if (!who)
		return tls_call_url(tls_url, NULL, req);
	snprintf(name, sizeof(name), "%s.pem", who);
	return tls_call_url(tls_url, path_of(name), req);
}

static const char *err_code(json_t *j)
{
	return json_string_value(json_object_get(json_object_get(j, "error"), "code"));
}

static bool is_ok(json_t *j)
{
	return json_is_true(json_object_get(j, "ok"));
}


/* Run edgelmd with `sets` (--set KEY=VALUE each); with `wait`, until alice's
 * health call answers. Its stderr goes to log_path. */
static int start(const char *const *sets, int n_sets, bool wait)
{
	const char *argv[64];
	int n = 0;
	argv[n++] = "edgelmd";
	argv[n++] = "--config";
	argv[n++] = conf_path;
	argv[n++] = "--model";
	argv[n++] = model;
	argv[n++] = "--listen";
	argv[n++] = tls_url;
	argv[n++] = "--listen";
	argv[n++] = tcp_url;
	argv[n++] = "--metrics-listen";
	argv[n++] = "off";
	argv[n++] = "--threads";
	argv[n++] = "1";
	argv[n++] = "--set";
	argv[n++] = "tuning=false";
	argv[n++] = "--set";
	argv[n++] = "log_level=debug";
	for (int i = 0; i < n_sets && n < 60; i++) {
		argv[n++] = "--set";
		argv[n++] = sets[i];
	}
	argv[n] = NULL;
	static int n_started;
	snprintf(log_path, sizeof(log_path), "%s/edgelmd-%d.log", dir, ++n_started);
	daemon_pid = fork();
	if (daemon_pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execv(test_bin("edgelmd"), (char *const *)argv);
		_exit(127);
	}
	if (!wait)
		return 0;
	for (int i = 0; i < 300; i++) {
		json_t *j = tls_call("alice", "{\"op\":\"health\"}");
		bool ready = is_ok(j) && json_is_string(json_object_get(j, "status")) &&
		             strcmp(json_string_value(json_object_get(j, "status")), "ready") == 0;
		json_decref(j);
		if (ready)
			return 0;
		if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) {
			fprintf(stderr, "edgelmd exited early; log in %s\n", log_path);
			daemon_pid = -1;
			return -1;
		}
		usleep(50000);
	}
	return -1;
}

/* SIGTERM (or, for a daemon that stops by itself, nothing) and its exit
 * status. */
static int stop(bool term)
{
	if (daemon_pid <= 0)
		return -1;
	if (term)
		kill(daemon_pid, SIGTERM);
	int st = -1;
	for (int i = 0; i < 600; i++) {
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid)
			break;
		usleep(50000);
	}
	if (!WIFEXITED(st)) {
		kill(daemon_pid, SIGKILL);
		waitpid(daemon_pid, NULL, 0);
	}
	daemon_pid = -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool log_has(const char *needle)
{
	char *text = NULL;
	FILE *f = fopen(log_path, "r");
	bool found = false;
	if (!f)
		return false;
	size_t cap = 1 << 20;
	text = calloc(1, cap);
	if (text) {
		size_t n = fread(text, 1, cap - 1, f);
		text[n] = '\0';
		found = strstr(text, needle) != NULL;
	}
	free(text);
	fclose(f);
	return found;
}

/* ---- with mutual TLS ---------------------------------------------------------- */

static void test_tls_served(void)
{
	json_t *j = tls_call("alice", "{\"op\":\"generate\",\"prompt\":\"Once\",\"max_tokens\":4,"
	                              "\"temperature\":0}");
	CHECK_MSG(is_ok(j), "alice's generate: %s", j ? json_dumps(j, JSON_COMPACT) : "(none)");
	json_decref(j);
	/* tcp:// is served too, unauthenticated, and said so */
	CHECK(log_has("tcp:// clients are not authenticated"));
	CHECK(!log_has("TLS clients are not authenticated"));
}

static void test_tls_refused(void)
{
	static const char *const who[] = {NULL, "mallory", "expired"};
	for (size_t i = 0; i < CM_ARRAY_LEN(who); i++) {
		json_t *j = tls_call(who[i], "{\"op\":\"health\"}");
		CHECK_MSG(!j, "%s was served: %s", who[i] ? who[i] : "no certificate",
		          json_dumps(j, JSON_COMPACT));
		json_decref(j);
	}
	/* and the daemon still serves the others */
	json_t *j = tls_call("alice", "{\"op\":\"health\"}");
	CHECK(is_ok(j));
	json_decref(j);
}

/* The certificate's CN is the identity: bob sees alice's generation as
 * absent, carol (a CN no one configured) too, and alice still owns it. */
static void test_tls_identity(void)
{
	json_t *j = tls_call("alice", "{\"op\":\"generate\",\"prompt\":\"__edgelm_test_stall__ Once\","
	                              "\"max_tokens\":200,\"temperature\":1,\"stream\":true}");
	CHECK_MSG(is_ok(j), "alice's stream: %s", j ? json_dumps(j, JSON_COMPACT) : "(none)");
	char rid[128];
	const char *id = json_string_value(json_object_get(j, "id"));
	snprintf(rid, sizeof(rid), "%s", id ? id : "");
	json_decref(j);
	static const char *const fmts[] = {"{\"op\":\"poll\",\"id\":\"%s\",\"ack\":0,\"wait_ms\":0}",
	                                   "{\"op\":\"cancel\",\"id\":\"%s\"}"};
	static const char *const others[] = {"bob", "carol"};
	char req[512];
	for (size_t w = 0; w < CM_ARRAY_LEN(others); w++)
		for (size_t i = 0; i < CM_ARRAY_LEN(fmts); i++) {
			snprintf(req, sizeof(req), fmts[i], rid);
			json_t *o = tls_call(others[w], req);
			CHECK_MSG(err_code(o) && strcmp(err_code(o), "not_found") == 0, "%s %s: %s",
			          others[w], req, o ? json_dumps(o, JSON_COMPACT) : "(none)");
			json_decref(o);
		}
	snprintf(req, sizeof(req), fmts[0], rid);
	j = tls_call("alice", req);
	CHECK_MSG(is_ok(j), "alice's poll: %s", j ? json_dumps(j, JSON_COMPACT) : "(none)");
	json_decref(j);
	snprintf(req, sizeof(req), fmts[1], rid);
	j = tls_call("alice", req);
	CHECK(is_ok(j) && json_is_true(json_object_get(j, "cancelled")));
	json_decref(j);

	/* client-chosen ids are per identity: alice and bob both have "mine" */
	const char *gen = "{\"op\":\"generate\",\"id\":\"mine\",\"prompt\":\"Once\","
	                  "\"max_tokens\":4,\"temperature\":0,\"stream\":true}";
	json_t *a = tls_call("alice", gen), *b = tls_call("bob", gen);
	CHECK_MSG(is_ok(a) && is_ok(b), "alice: %s, bob: %s", a ? json_dumps(a, JSON_COMPACT) : "-",
	          b ? json_dumps(b, JSON_COMPACT) : "-");
	json_decref(a);
	json_decref(b);
	j = tls_call("alice", "{\"op\":\"cancel\",\"id\":\"mine\"}");
	CHECK(is_ok(j));
	json_decref(j);
	j = tls_call("bob", "{\"op\":\"poll\",\"id\":\"mine\",\"ack\":0,\"wait_ms\":2000}");
	CHECK_MSG(is_ok(j), "bob's own stream: %s", j ? json_dumps(j, JSON_COMPACT) : "-");
	json_decref(j);
}

/* A CN that could not be written in tenant_weights (a space, a comma)
 * is served as tls:anonymous: two such certificates share it. */
static void test_tls_odd_cn(void)
{
	json_t *j = tls_call("odd1", "{\"op\":\"generate\",\"id\":\"odd\",\"prompt\":\"Once\","
	                             "\"max_tokens\":2,\"temperature\":0,\"stream\":true}");
	CHECK_MSG(is_ok(j), "odd1: %s", j ? json_dumps(j, JSON_COMPACT) : "(refused)");
	json_decref(j);
	j = tls_call("odd2", "{\"op\":\"cancel\",\"id\":\"odd\"}");
	CHECK_MSG(is_ok(j), "odd2 is not odd1's identity: %s",
	          j ? json_dumps(j, JSON_COMPACT) : "(refused)");
	json_decref(j);
	j = tls_call("alice", "{\"op\":\"cancel\",\"id\":\"odd\"}");
	CHECK(err_code(j) && strcmp(err_code(j), "not_found") == 0);
	json_decref(j);
}

/* ---- reload ------------------------------------------------------------------- */

static int copy_file(const char *from, const char *to)
{
	char cmd[20000];
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s.new' && mv '%s.new' '%s'", from, to, to, to);
	return system(cmd) == 0 ? 0 : -1;
}

/* Wait (bounded) until the log has `needle`. */
static bool log_wait(const char *needle)
{
	for (int i = 0; i < 200; i++) {
		if (log_has(needle))
			return true;
		usleep(50000);
	}
	return false;
}

/* A reload reads the files again, at the same paths: a new client CA
 * lets its clients in and shuts the old CA's out; files that fail the
 * checks leave the previous ones in place. */
static void test_tls_reload(void)
{
	char conf[4400], text[16000], clients_ca[4200];
	snprintf(clients_ca, sizeof(clients_ca), "%s", path_of("clients-ca.crt"));
	snprintf(conf, sizeof(conf), "%s/reload.conf", dir);
	snprintf(text, sizeof(text), "tls_cert_file %s\ntls_key_file %s\ntls_ca_file %s\n",
	         path_of("server.crt"), path_of("server.key"), clients_ca);
	FILE *f = fopen(conf, "w");
	if (!f || copy_file(path_of("ca.crt"), clients_ca) != 0) {
		CHECK(!"cannot write the configuration");
		if (f)
			fclose(f);
		return;
	}
	fputs(text, f);
	fclose(f);
	conf_path = conf;
	const char *sets[] = {"log_level=info"};
	int rc = start(sets, 1, true);
	conf_path = "/dev/null";
	if (rc != 0) {
		CHECK(!"edgelmd did not start with the reload configuration");
		stop(true);
		return;
	}
	json_t *j = tls_call("mallory", "{\"op\":\"health\"}");
	CHECK(!j);
	json_decref(j);

	CHECK_OK(copy_file(path_of("other.crt"), clients_ca));
	kill(daemon_pid, SIGHUP);
	CHECK(log_wait("TLS certificates read again"));
	j = tls_call("mallory", "{\"op\":\"health\"}");
	CHECK_MSG(is_ok(j), "the new CA's client: %s", j ? json_dumps(j, JSON_COMPACT) : "(refused)");
	json_decref(j);
	j = tls_call("alice", "{\"op\":\"health\"}");
	CHECK_MSG(!j, "the old CA's client was served: %s", json_dumps(j, JSON_COMPACT));
	json_decref(j);

	CHECK_OK(copy_file(path_of("junk.crt"), clients_ca));
	kill(daemon_pid, SIGHUP);
	CHECK(log_wait("new TLS connections keep the previous certificates"));
	j = tls_call("mallory", "{\"op\":\"health\"}");
	CHECK_MSG(is_ok(j), "after a bad reload: %s", j ? json_dumps(j, JSON_COMPACT) : "(refused)");
	json_decref(j);
	CHECK_EQ_INT(stop(true), 0);
}

/* ---- configuration errors ----------------------------------------------------- */

/* edgelmd with `sets` stops at start, and its log has `needle`. */
static void expect_start_error(const char *const *sets, int n, const char *needle)
{
	start(sets, n, false);
	int st = stop(false);
	CHECK_MSG(st != 0, "edgelmd exited %d, expected an error (%s)", st, needle);
	CHECK_MSG(log_has(needle), "'%s' not in %s", needle, log_path);
}

static void test_tls_config_errors(void)
{
	char cert[4300], key[4300], missing[4300], junk[4300];
	snprintf(cert, sizeof(cert), "tls_cert_file=%s", path_of("server.crt"));
	snprintf(key, sizeof(key), "tls_key_file=%s", path_of("server.key"));
	snprintf(missing, sizeof(missing), "tls_ca_file=%s", path_of("missing.crt"));
	snprintf(junk, sizeof(junk), "tls_cert_file=%s", path_of("junk.crt"));
	const char *none[] = {"log_level=info"};
	expect_start_error(none, 1, "needs tls_cert_file and tls_key_file");
	const char *no_key[] = {cert};
	expect_start_error(no_key, 1, "needs tls_cert_file and tls_key_file");
	const char *absent[] = {cert, key, missing};
	char needle[4400];
	snprintf(needle, sizeof(needle), "tls_ca_file %s: No such file", path_of("missing.crt"));
	expect_start_error(absent, 3, needle);
	const char *not_pem[] = {junk, key};
	snprintf(needle, sizeof(needle), "tls_cert_file %s: not a PEM file", path_of("junk.crt"));
	expect_start_error(not_pem, 2, needle);
	/* a key that is not the certificate's */
	char bob_key[4300];
	snprintf(bob_key, sizeof(bob_key), "tls_key_file=%s", path_of("bob.key"));
	const char *mismatch[] = {cert, bob_key};
	snprintf(needle, sizeof(needle), "tls_key_file %s is not the key of tls_cert_file",
	         path_of("bob.key"));
	expect_start_error(mismatch, 2, needle);
}

/* Without tls_ca_file a TLS client needs no certificate, and the log says
 * that clients are not authenticated. */
static void test_tls_no_ca(void)
{
	char cert[4300], key[4300];
	snprintf(cert, sizeof(cert), "tls_cert_file=%s", path_of("server.crt"));
	snprintf(key, sizeof(key), "tls_key_file=%s", path_of("server.key"));
	const char *sets[] = {cert, key};
	if (start(sets, 2, true) != 0) {
		CHECK(!"edgelmd did not start without a CA");
		stop(true);
		return;
	}
	json_t *j = tls_call(NULL, "{\"op\":\"health\"}");
	CHECK_MSG(is_ok(j), "no certificate, no CA: %s", j ? json_dumps(j, JSON_COMPACT) : "(none)");
	json_decref(j);
	CHECK(log_has("TLS clients are not authenticated"));
	CHECK_EQ_INT(stop(true), 0);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	model = strdup(test_data_path("models/stories260K-f32.gguf"));
	if (!test_file_exists(model)) {
		test_cur_name = "test_daemon_tls";
		TEST_SKIP_DATA("stories260K model not found under $EDGELM_TESTDATA");
		test_n_skip++;
		if (getenv("EDGELM_REQUIRE_DATA"))
			test_n_fail++;
		return test_finish();
	}
	snprintf(dir, sizeof(dir), "%s/tls.XXXXXX", test_tmpdir());
	if (!mkdtemp(dir) || gen_certs() != 0) {
		test_cur_name = "certificates";
		CHECK(!"openssl could not make the test certificates");
		return test_finish();
	}
	snprintf(tls_url, sizeof(tls_url), "tls+tcp://127.0.0.1:%d", free_port());
	snprintf(tcp_url, sizeof(tcp_url), "tcp://127.0.0.1:%d", free_port());

	char cert[4300], key[4300], ca[4300];
	snprintf(cert, sizeof(cert), "tls_cert_file=%s", path_of("server.crt"));
	snprintf(key, sizeof(key), "tls_key_file=%s", path_of("server.key"));
	snprintf(ca, sizeof(ca), "tls_ca_file=%s", path_of("ca.crt"));
	/* tls:NAME in tenant_weights is an identity like the others */
	const char *sets[] = {cert, key, ca, "stream_idle_ms=5000", "watchdog_stall_ms=20",
	                      "tenant_weights=tls:alice=2,tls:bob=1"};
	if (start(sets, 6, true) != 0) {
		test_cur_name = "start";
		CHECK(!"edgelmd did not become ready over tls+tcp://");
		stop(true);
		return test_finish();
	}
	TEST_RUN(test_tls_served);
	TEST_RUN(test_tls_refused);
	TEST_RUN(test_tls_identity);
	TEST_RUN(test_tls_odd_cn);
	test_cur_name = "stop";
	CHECK_EQ_INT(stop(true), 0);
	TEST_RUN(test_tls_config_errors);
	TEST_RUN(test_tls_no_ca);
	TEST_RUN(test_tls_reload);
	return test_finish();
}
