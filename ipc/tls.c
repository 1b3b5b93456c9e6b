/* ipc/tls.c: the TLS side of tls+tcp:// listeners (server_impl.h): the
 * configuration built from the daemon's PEM files, and the identity of a
 * verified peer. */
#include "ipc/server_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <mbedtls/error.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>

#define PEM_MAX (1u << 20) /* a certificate chain or key file, at most */

/* A whole PEM file as a C string (nng's TLS calls take strings), or NULL
 * with the reason naming the file and its config key. */
static char *pem_read(const char *key, const char *path, struct cm_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		cm_err_set(err, -errno, "ipc: %s %s: %s", key, path, strerror(errno));
		return NULL;
	}
	struct stat st;
	char *buf = NULL;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > PEM_MAX) {
		cm_err_set(err, -EINVAL, "ipc: %s %s: not a regular file of at most 1 MiB", key,
		           path);
		goto out;
	}
	buf = cm_malloc((size_t)st.st_size + 1);
	if (!buf) {
		cm_err_set(err, -ENOMEM, "ipc: out of memory");
		goto out;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			cm_err_set(err, n < 0 ? -errno : -EIO, "ipc: %s %s: %s", key, path,
			           n < 0 ? strerror(errno) : "short read");
			cm_free(buf);
			buf = NULL;
			goto out;
		}
		got += (size_t)n;
	}
	buf[got] = '\0';
	if (!strstr(buf, "-----BEGIN ")) {
		cm_err_set(err, -EINVAL, "ipc: %s %s: not a PEM file", key, path);
		cm_free(buf);
		buf = NULL;
	}
out:
	close(fd);
	return buf;
}

static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static int engine_rv;

static void engine_register(void)
{
	engine_rv = ipc_tls_engine_register();
}

/* Parse the files as the engine will, for a message naming the file at
 * fault (nng would only say "cryptographic error"). */
static int pem_check(const char *cert, const char *cert_file, const char *key,
                     const char *key_file, const char *ca, const char *ca_file,
                     struct cm_err *err)
{
	mbedtls_x509_crt crt, cacrt;
	mbedtls_pk_context pk;
	char why[128];
	int rc = 0, rv;
	mbedtls_x509_crt_init(&crt);
	mbedtls_x509_crt_init(&cacrt);
	mbedtls_pk_init(&pk);
	if ((rv = mbedtls_x509_crt_parse(&crt, (const unsigned char *)cert, strlen(cert) + 1))) {
		mbedtls_strerror(rv, why, sizeof(why));
		rc = cm_err_set(err, -EINVAL, "ipc: tls_cert_file %s: not a valid certificate (%s)",
		                cert_file, why);
	} else if ((rv = mbedtls_pk_parse_key(&pk, (const unsigned char *)key, strlen(key) + 1,
	                                      NULL, 0))) {
		mbedtls_strerror(rv, why, sizeof(why));
		rc = cm_err_set(err, -EINVAL,
		                "ipc: tls_key_file %s: not a valid unencrypted private key (%s)",
		                key_file, why);
	} else if (mbedtls_pk_check_pair(&crt.pk, &pk) != 0) {
		rc = cm_err_set(err, -EINVAL,
		                "ipc: tls_key_file %s is not the key of tls_cert_file %s", key_file,
		                cert_file);
	} else if (ca && (rv = mbedtls_x509_crt_parse(&cacrt, (const unsigned char *)ca,
	                                              strlen(ca) + 1))) {
		mbedtls_strerror(rv, why, sizeof(why));
		rc = cm_err_set(err, -EINVAL, "ipc: tls_ca_file %s: not valid certificates (%s)",
		                ca_file, why);
	}
	mbedtls_pk_free(&pk);
	mbedtls_x509_crt_free(&cacrt);
	mbedtls_x509_crt_free(&crt);
	return rc;
}

int ipc_tls_config_new(const char *cert_file, const char *key_file, const char *ca_file,
                       nng_tls_config **ret_cfg, nng_tls_engine_config **ret_ecfg,
                       struct cm_err *err)
{
	nng_tls_config *cfg = NULL;
	char *cert = NULL, *key = NULL, *ca = NULL;
	int rc = 0, rv;
	*ret_cfg = NULL;
	*ret_ecfg = NULL;
	if (!(cert = pem_read("tls_cert_file", cert_file, err)) ||
	    !(key = pem_read("tls_key_file", key_file, err)) ||
	    (ca_file && *ca_file && !(ca = pem_read("tls_ca_file", ca_file, err)))) {
		rc = err ? err->code : -EINVAL;
		goto out;
	}
	if ((rc = pem_check(cert, cert_file, key, key_file, ca, ca_file, err)))
		goto out;
	/* before the first configuration: each keeps the engine it was made by */
	pthread_once(&engine_once, engine_register);
	if (engine_rv != 0) {
		rc = cm_err_set(err, ipc_nng_to_errno(engine_rv), "ipc: TLS engine: %s",
		                nng_strerror(engine_rv));
		goto out;
	}
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) != 0) {
		rc = cm_err_set(err, ipc_nng_to_errno(rv), "ipc: TLS: %s", nng_strerror(rv));
		goto out;
	}
	nng_tls_engine_config *ecfg = ipc_tls_engine_last_config();
	if ((rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0) {
		rc = cm_err_set(err, -EINVAL,
		                "ipc: tls_cert_file %s, tls_key_file %s: not a valid certificate "
		                "and its unencrypted private key (%s)",
		                cert_file, key_file, nng_strerror(rv));
		goto out;
	}
	if (ca && (rv = nng_tls_config_ca_chain(cfg, ca, NULL)) != 0) {
		rc = cm_err_set(err, -EINVAL, "ipc: tls_ca_file %s: not valid CA certificates (%s)",
		                ca_file, nng_strerror(rv));
		goto out;
	}
	/* with a CA, mutual TLS: a client without a certificate it signed is
	 * refused during the handshake */
	rv = nng_tls_config_auth_mode(cfg, ca ? NNG_TLS_AUTH_MODE_REQUIRED : NNG_TLS_AUTH_MODE_NONE);
	if (rv != 0) {
		rc = cm_err_set(err, ipc_nng_to_errno(rv), "ipc: TLS auth mode: %s",
		                nng_strerror(rv));
		goto out;
	}
	*ret_cfg = cfg;
	*ret_ecfg = ecfg;
	cfg = NULL;
out:
	if (cfg)
		nng_tls_config_free(cfg);
	if (key) {
		explicit_bzero(key, strlen(key));
		cm_free(key);
	}
	cm_free(cert);
	cm_free(ca);
	return rc;
}

int ipc_server_tls_reload(ipc_server *srv, const char *cert_file, const char *key_file,
                          const char *ca_file, struct cm_err *err)
{
	if (!srv || !srv->tls)
		return 0;
	if (!cert_file || !*cert_file || !key_file || !*key_file)
		return cm_err_set(err, -EINVAL,
		                  "ipc: tls+tcp:// needs tls_cert_file and tls_key_file");
	pthread_mutex_lock(&srv->tls_mu);
	nng_tls_config *fresh = NULL;
	nng_tls_engine_config *ecfg = NULL;
	int rc = ipc_tls_config_new(cert_file, key_file, ca_file, &fresh, &ecfg, err);
	if (rc == 0) {
		ipc_tls_engine_swap(srv->tls_ecfg, ecfg);
		atomic_store(&srv->tls_verify, ca_file && *ca_file);
		nng_tls_config_free(fresh); /* its bundle lives on in srv->tls */
	}
	pthread_mutex_unlock(&srv->tls_mu);
	return rc;
}
