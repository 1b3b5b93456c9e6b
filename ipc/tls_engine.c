/* ipc/tls_engine.c: a TLS engine for nng over mbedTLS (server_impl.h), in
 * place of the one nng 1.5.2 is built with, for one thing that one lacks:
 * the peer certificate's subject CN. nng 1.5.2 has no NNG_OPT_TLS_PEER_CN
 * (1.6 added it) and no other way from a pipe to its certificate; its
 * public engine API (nng/supplemental/tls/engine.h) lets us run the
 * handshake ourselves and keep the CN with the connection. A pipe's
 * NNG_OPT_TLS_VERIFIED is answered by our `verified` on the caller's
 * thread, under the connection's lock: it leaves the CN in a thread-local
 * for ipc_tls_peer_cn to copy. (It relies on nng calling the engine on
 * the getter's thread, which 1.5.2's tls_get_verified does.)
 *
 * It also lets a reload change the certificates of a listener in use,
 * which nng's configuration objects refuse once used: a configuration
 * holds its mbedTLS state in a counted bundle that
 * ipc_tls_engine_swap replaces for the connections made after it.
 *
 * Otherwise it does what nng's own mbedTLS engine does (TLS 1.2, buffers
 * and I/O are nng's): only the server's listeners use it, but every TLS
 * configuration this process allocates once it is registered does. */
#include "ipc/server_impl.h"

#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/oid.h>
#include <mbedtls/ssl.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>
#include <nng/supplemental/tls/engine.h>

#define OWN_CERTS_MAX 4 /* own_cert calls kept per configuration */

/* What a connection is set up with. A reload (ipc_tls_engine_swap) puts a
 * new one in its configuration; connections keep the one they started
 * with, hence the count. */
struct bundle {
	atomic_int refs;
	mbedtls_ssl_config cfg;
	mbedtls_x509_crt ca;
	mbedtls_x509_crl crl;
	mbedtls_x509_crt crt[OWN_CERTS_MAX];
	mbedtls_pk_context key[OWN_CERTS_MAX];
	int n_own;
};

struct nng_tls_engine_config {
	pthread_mutex_t mu; /* cur */
	struct bundle *cur;
	char *server_name;
};

struct nng_tls_engine_conn {
	void *tls; /* nng's side, for nng_tls_engine_send/recv */
	struct bundle *b;
	mbedtls_ssl_context ctx;
	char cn[IPC_IDENTITY_MAX + 1]; /* the verified peer's CN, once handshaken */
};

/* The configuration config_init made last on this thread: the one
 * nng_tls_config_alloc just made, for ipc_tls_engine_last_config. */
static _Thread_local nng_tls_engine_config *last_init;

/* What the last `verified` on this thread saw (copied: the connection may
 * go as soon as nng lets go of its lock). */
static _Thread_local char last_cn[IPC_IDENTITY_MAX + 1];

static int rng(void *arg, unsigned char *buf, size_t len)
{
	(void)arg;
	while (len) {
		ssize_t n = getrandom(buf, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return MBEDTLS_ERR_SSL_INTERNAL_ERROR;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

static int mk_err(int rv)
{
	switch (rv) {
	case MBEDTLS_ERR_SSL_NO_CLIENT_CERTIFICATE:
	case MBEDTLS_ERR_SSL_CA_CHAIN_REQUIRED:
	case MBEDTLS_ERR_SSL_PEER_VERIFY_FAILED:
	case MBEDTLS_ERR_SSL_NO_USABLE_CIPHERSUITE:
	case MBEDTLS_ERR_X509_CERT_VERIFY_FAILED:
		return NNG_EPEERAUTH;
	case MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY:
		return NNG_ECONNREFUSED;
	case MBEDTLS_ERR_SSL_ALLOC_FAILED:
		return NNG_ENOMEM;
	case MBEDTLS_ERR_SSL_TIMEOUT:
		return NNG_ETIMEDOUT;
	case MBEDTLS_ERR_SSL_CONN_EOF:
		return NNG_ECLOSED;
	default:
		return NNG_ECRYPTO;
	}
}

/* ---- the underlying connection ------------------------------------------- */

static int net_send(void *arg, const unsigned char *buf, size_t len)
{
	struct nng_tls_engine_conn *c = arg;
	size_t sz = len;
	switch (nng_tls_engine_send(c->tls, buf, &sz)) {
	case 0:
		return (int)sz;
	case NNG_EAGAIN:
		return MBEDTLS_ERR_SSL_WANT_WRITE;
	default:
		return MBEDTLS_ERR_NET_SEND_FAILED;
	}
}

static int net_recv(void *arg, unsigned char *buf, size_t len)
{
	struct nng_tls_engine_conn *c = arg;
	size_t sz = len;
	switch (nng_tls_engine_recv(c->tls, buf, &sz)) {
	case 0:
		return (int)sz;
	case NNG_EAGAIN:
		return MBEDTLS_ERR_SSL_WANT_READ;
	default:
		return MBEDTLS_ERR_NET_RECV_FAILED;
	}
}

/* ---- connections --------------------------------------------------------- */

static void bundle_put(struct bundle *b)
{
	if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	mbedtls_ssl_config_free(&b->cfg);
	mbedtls_x509_crt_free(&b->ca);
	mbedtls_x509_crl_free(&b->crl);
	for (int i = 0; i < b->n_own; i++) {
		mbedtls_x509_crt_free(&b->crt[i]);
		mbedtls_pk_free(&b->key[i]);
	}
	free(b);
}

static struct bundle *bundle_get(nng_tls_engine_config *cfg)
{
	pthread_mutex_lock(&cfg->mu);
	struct bundle *b = cfg->cur;
	atomic_fetch_add(&b->refs, 1);
	pthread_mutex_unlock(&cfg->mu);
	return b;
}

static int conn_init(nng_tls_engine_conn *c, void *tls, nng_tls_engine_config *cfg)
{
	c->tls = tls;
	c->b = bundle_get(cfg);
	mbedtls_ssl_init(&c->ctx);
	mbedtls_ssl_set_bio(&c->ctx, c, net_send, net_recv, NULL);
	int rv = mbedtls_ssl_setup(&c->ctx, &c->b->cfg);
	if (rv != 0)
		return mk_err(rv);
	if (cfg->server_name)
		mbedtls_ssl_set_hostname(&c->ctx, cfg->server_name);
	return 0;
}

static void conn_fini(nng_tls_engine_conn *c)
{
	mbedtls_ssl_free(&c->ctx);
	bundle_put(c->b);
}

static void conn_close(nng_tls_engine_conn *c)
{
	(void)mbedtls_ssl_close_notify(&c->ctx);
}

/* The subject CN of a verified peer certificate, if it is one that is
 * safe in an identity and a tenant_weights entry (letters, digits and
 * . _ - @); any other stays "" (the peer is then tls:anonymous). */
static void keep_cn(struct nng_tls_engine_conn *c)
{
	const mbedtls_x509_crt *crt = mbedtls_ssl_get_peer_cert(&c->ctx);
	c->cn[0] = '\0';
	if (!crt || mbedtls_ssl_get_verify_result(&c->ctx) != 0)
		return;
	for (const mbedtls_x509_name *n = &crt->subject; n; n = n->next) {
		if (!n->oid.p || MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &n->oid) != 0)
			continue;
		if (n->val.len == 0 || n->val.len >= sizeof(c->cn) - 4) /* room for "tls:" */
			return;
		for (size_t i = 0; i < n->val.len; i++) {
			unsigned char ch = n->val.p[i];
			if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-' ||
			      ch == '@'))
				return;
		}
		memcpy(c->cn, n->val.p, n->val.len);
		c->cn[n->val.len] = '\0';
		return; /* the first CN */
	}
}

static int conn_handshake(nng_tls_engine_conn *c)
{
	int rv = mbedtls_ssl_handshake(&c->ctx);
	switch (rv) {
	case MBEDTLS_ERR_SSL_WANT_WRITE:
	case MBEDTLS_ERR_SSL_WANT_READ:
		return NNG_EAGAIN;
	case 0:
		keep_cn(c);
		return 0;
	default:
		return mk_err(rv);
	}
}

static int conn_recv(nng_tls_engine_conn *c, uint8_t *buf, size_t *szp)
{
	int rv = mbedtls_ssl_read(&c->ctx, buf, *szp);
	if (rv < 0)
		return rv == MBEDTLS_ERR_SSL_WANT_READ || rv == MBEDTLS_ERR_SSL_WANT_WRITE
		           ? NNG_EAGAIN
		           : mk_err(rv);
	*szp = (size_t)rv;
	return 0;
}

static int conn_send(nng_tls_engine_conn *c, const uint8_t *buf, size_t *szp)
{
	int rv = mbedtls_ssl_write(&c->ctx, buf, *szp);
	if (rv < 0)
		return rv == MBEDTLS_ERR_SSL_WANT_READ || rv == MBEDTLS_ERR_SSL_WANT_WRITE
		           ? NNG_EAGAIN
		           : mk_err(rv);
	*szp = (size_t)rv;
	return 0;
}

static bool conn_verified(nng_tls_engine_conn *c)
{
	memcpy(last_cn, c->cn, sizeof(last_cn));
	return mbedtls_ssl_get_verify_result(&c->ctx) == 0;
}

/* ---- configurations ------------------------------------------------------ */

static void config_fini(nng_tls_engine_config *cfg)
{
	bundle_put(cfg->cur);
	free(cfg->server_name);
	pthread_mutex_destroy(&cfg->mu);
}

static int config_init(nng_tls_engine_config *cfg, nng_tls_mode mode)
{
	bool server = mode == NNG_TLS_MODE_SERVER;
	struct bundle *b = calloc(1, sizeof(*b));
	if (!b)
		return NNG_ENOMEM;
	atomic_init(&b->refs, 1);
	mbedtls_ssl_config_init(&b->cfg);
	mbedtls_x509_crt_init(&b->ca);
	mbedtls_x509_crl_init(&b->crl);
	pthread_mutex_init(&cfg->mu, NULL);
	cfg->cur = b;
	int rv = mbedtls_ssl_config_defaults(&b->cfg,
	                                     server ? MBEDTLS_SSL_IS_SERVER : MBEDTLS_SSL_IS_CLIENT,
	                                     MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
	if (rv != 0) {
		config_fini(cfg);
		return mk_err(rv);
	}
	mbedtls_ssl_conf_authmode(&b->cfg,
	                          server ? MBEDTLS_SSL_VERIFY_NONE : MBEDTLS_SSL_VERIFY_REQUIRED);
	mbedtls_ssl_conf_min_version(&b->cfg, MBEDTLS_SSL_MAJOR_VERSION_3,
	                             MBEDTLS_SSL_MINOR_VERSION_3);
	mbedtls_ssl_conf_rng(&b->cfg, rng, NULL);
	last_init = cfg;
	return 0;
}

static int config_server(nng_tls_engine_config *cfg, const char *name)
{
	char *dup = strdup(name);
	if (!dup)
		return NNG_ENOMEM;
	free(cfg->server_name);
	cfg->server_name = dup;
	return 0;
}

static int config_auth(nng_tls_engine_config *cfg, nng_tls_auth_mode mode)
{
	switch (mode) {
	case NNG_TLS_AUTH_MODE_NONE:
		mbedtls_ssl_conf_authmode(&cfg->cur->cfg, MBEDTLS_SSL_VERIFY_NONE);
		return 0;
	case NNG_TLS_AUTH_MODE_OPTIONAL:
		mbedtls_ssl_conf_authmode(&cfg->cur->cfg, MBEDTLS_SSL_VERIFY_OPTIONAL);
		return 0;
	case NNG_TLS_AUTH_MODE_REQUIRED:
		mbedtls_ssl_conf_authmode(&cfg->cur->cfg, MBEDTLS_SSL_VERIFY_REQUIRED);
		return 0;
	default:
		return NNG_EINVAL;
	}
}

static int config_ca_chain(nng_tls_engine_config *cfg, const char *certs, const char *crl)
{
	int rv = mbedtls_x509_crt_parse(&cfg->cur->ca, (const unsigned char *)certs, strlen(certs) + 1);
	if (rv != 0)
		return NNG_ECRYPTO;
	if (crl) {
		rv = mbedtls_x509_crl_parse(&cfg->cur->crl, (const unsigned char *)crl, strlen(crl) + 1);
		if (rv != 0)
			return NNG_ECRYPTO;
	}
	mbedtls_ssl_conf_ca_chain(&cfg->cur->cfg, &cfg->cur->ca, crl ? &cfg->cur->crl : NULL);
	return 0;
}

static int config_own_cert(nng_tls_engine_config *cfg, const char *cert, const char *key,
                           const char *pass)
{
	struct bundle *b = cfg->cur;
	if (b->n_own >= OWN_CERTS_MAX)
		return NNG_ENOSPC;
	mbedtls_x509_crt *crt = &b->crt[b->n_own];
	mbedtls_pk_context *pk = &b->key[b->n_own];
	mbedtls_x509_crt_init(crt);
	mbedtls_pk_init(pk);
	int rv = mbedtls_x509_crt_parse(crt, (const unsigned char *)cert, strlen(cert) + 1);
	if (rv == 0)
		rv = mbedtls_pk_parse_key(pk, (const unsigned char *)key, strlen(key) + 1,
		                          (const unsigned char *)pass, pass ? strlen(pass) : 0);
	if (rv == 0)
		rv = mbedtls_pk_check_pair(&crt->pk, pk);
	if (rv == 0)
		rv = mbedtls_ssl_conf_own_cert(&b->cfg, crt, pk);
	if (rv != 0) {
		mbedtls_x509_crt_free(crt);
		mbedtls_pk_free(pk);
		return rv == MBEDTLS_ERR_SSL_ALLOC_FAILED ? NNG_ENOMEM : NNG_EINVAL;
	}
	b->n_own++;
	return 0;
}

static int config_version(nng_tls_engine_config *cfg, nng_tls_version min, nng_tls_version max)
{
	/* mbedTLS 2.28 speaks up to TLS 1.2 (its 1.3 is experimental and off) */
	if (min > max || min > NNG_TLS_1_2)
		return NNG_ENOTSUP;
	int lo = min <= NNG_TLS_1_0 ? MBEDTLS_SSL_MINOR_VERSION_1
	         : min == NNG_TLS_1_1 ? MBEDTLS_SSL_MINOR_VERSION_2
	                              : MBEDTLS_SSL_MINOR_VERSION_3;
	int hi = max <= NNG_TLS_1_0 ? MBEDTLS_SSL_MINOR_VERSION_1
	         : max == NNG_TLS_1_1 ? MBEDTLS_SSL_MINOR_VERSION_2
	                              : MBEDTLS_SSL_MINOR_VERSION_3;
	mbedtls_ssl_conf_min_version(&cfg->cur->cfg, MBEDTLS_SSL_MAJOR_VERSION_3, lo);
	mbedtls_ssl_conf_max_version(&cfg->cur->cfg, MBEDTLS_SSL_MAJOR_VERSION_3, hi);
	return 0;
}

static nng_tls_engine_config_ops config_ops = {
    .size = sizeof(nng_tls_engine_config),
    .init = config_init,
    .fini = config_fini,
    .server = config_server,
    .auth = config_auth,
    .ca_chain = config_ca_chain,
    .own_cert = config_own_cert,
    .version = config_version,
};

static nng_tls_engine_conn_ops conn_ops = {
    .size = sizeof(nng_tls_engine_conn),
    .init = conn_init,
    .fini = conn_fini,
    .close = conn_close,
    .handshake = conn_handshake,
    .recv = conn_recv,
    .send = conn_send,
    .verified = conn_verified,
};

static const nng_tls_engine engine = {
    .version = NNG_TLS_ENGINE_VERSION,
    .config_ops = &config_ops,
    .conn_ops = &conn_ops,
    .name = "edgelm-mbedtls",
    .description = "edgelm's engine over mbed TLS " MBEDTLS_VERSION_STRING " (keeps the peer CN)",
    .fips_mode = false,
};

int ipc_tls_engine_register(void)
{
	return nng_tls_engine_register(&engine);
}

nng_tls_engine_config *ipc_tls_engine_last_config(void)
{
	return last_init;
}

void ipc_tls_engine_swap(nng_tls_engine_config *live, nng_tls_engine_config *fresh)
{
	struct bundle *b = bundle_get(fresh);
	pthread_mutex_lock(&live->mu);
	struct bundle *old = live->cur;
	live->cur = b;
	pthread_mutex_unlock(&live->mu);
	bundle_put(old);
}

void ipc_tls_peer_cn(nng_pipe p, char *buf, size_t cap)
{
	bool verified = false;
	if (cap)
		buf[0] = '\0';
	last_cn[0] = '\0';
	if (nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified) == 0 && verified)
		snprintf(buf, cap, "%s", last_cn);
}
