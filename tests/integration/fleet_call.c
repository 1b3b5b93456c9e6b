/* tests/integration/fleet_call.c: one protocol request over nng, with TLS,
 * for the fleet test (tests/integration/fleet.sh).
 *
 *   fleet_call --socket URL [--tls-cert F --tls-key F] [--tls-ca F]
 *              [--server-name NAME] JSON
 *
 * Dials URL on a req0 socket (blocking: a refused TLS handshake fails the
 * dial), sends JSON, prints the reply on one line. Exit 0 for a reply with
 * "ok":true, 2 for an error reply, 1 when there is no reply. It talks nng
 * directly rather than through libedgelm so a test can send any op (poll,
 * cancel of another's id) and choose the name the server's certificate must
 * carry (--server-name; default the URL's host), which the library takes
 * from the URL only. */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return NULL;
	static char buf[65536];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

static int usage(void)
{
	fprintf(stderr, "usage: fleet_call --socket URL [--tls-cert F --tls-key F] [--tls-ca F] "
	                "[--server-name NAME] JSON\n");
	return 1;
}

int main(int argc, char **argv)
{
	const char *url = NULL, *cert = NULL, *key = NULL, *ca = NULL, *name = NULL,
	           *json = NULL;
	for (int i = 1; i < argc; i++) {
		const char **dst = strcmp(argv[i], "--socket") == 0        ? &url
		                   : strcmp(argv[i], "--tls-cert") == 0    ? &cert
		                   : strcmp(argv[i], "--tls-key") == 0     ? &key
		                   : strcmp(argv[i], "--tls-ca") == 0      ? &ca
		                   : strcmp(argv[i], "--server-name") == 0 ? &name
		                                                           : NULL;
		if (dst && i + 1 < argc)
			*dst = argv[++i];
		else if (!dst && !json)
			json = argv[i];
		else
			return usage();
	}
	if (!url || !json)
		return usage();

	nng_socket s;
	nng_dialer d;
	int rv = nng_req0_open(&s);
	if (rv == 0)
		rv = nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	if (rv == 0)
		rv = nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 20000);
	if (rv == 0)
		rv = nng_dialer_create(&d, s, url);
	if (rv != 0) {
		fprintf(stderr, "fleet_call: %s: %s\n", url, nng_strerror(rv));
		return 1;
	}
	if (strncmp(url, "tls+", 4) == 0) {
		nng_tls_config *cfg;
		rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT);
		if (rv == 0 && ca) {
			rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
			if (rv == 0)
				rv = nng_tls_config_ca_file(cfg, ca);
		}
		/* nng checks no name unless told one: the URL's host, as
		 * libedgelm does */
		nng_url *u = NULL;
		if (rv == 0 && !name && nng_url_parse(&u, url) == 0)
			name = u->u_hostname;
		if (rv == 0 && name)
			rv = nng_tls_config_server_name(cfg, name);
		nng_url_free(u);
		if (rv == 0 && cert) {
			char *c = slurp(cert), *k = slurp(key ? key : cert);
			rv = c && k ? nng_tls_config_own_cert(cfg, c, k, NULL) : NNG_ENOENT;
			free(c);
			free(k);
		}
		if (rv == 0)
			rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
		if (rv != 0) {
			fprintf(stderr, "fleet_call: TLS: %s\n", nng_strerror(rv));
			return 1;
		}
		nng_tls_config_free(cfg);
	}
	if ((rv = nng_dialer_start(d, 0)) != 0) {
		fprintf(stderr, "fleet_call: cannot connect to %s: %s\n", url, nng_strerror(rv));
		return 1;
	}
	char *reply = NULL;
	size_t len = 0;
	rv = nng_send(s, (void *)json, strlen(json), 0);
	if (rv == 0)
		rv = nng_recv(s, &reply, &len, NNG_FLAG_ALLOC);
	if (rv != 0) {
		fprintf(stderr, "fleet_call: %s: %s\n", url, nng_strerror(rv));
		return 1;
	}
	printf("%.*s\n", (int)len, reply);
	int ok = len && memmem(reply, len, "\"ok\":true", 9) != NULL;
	nng_free(reply, len);
	nng_close(s);
	return ok ? 0 : 2;
}
