/* tools/ctl/connect.c: the connection to edgelmd (ctl.h), above output.c
 * (which reports its failures) and under the commands. */
#include "tools/ctl/ctl.h"

int ctl_connect(edgelm_client **c)
{
	struct edgelm_error e;
	struct edgelm_connect_opts o;
	edgelm_connect_opts_init(&o);
	o.urls = ctl_g.sockets;
	o.n_urls = ctl_g.n_sockets;
	o.tls_cert_file = ctl_g.tls_cert;
	o.tls_key_file = ctl_g.tls_key;
	o.tls_ca_file = ctl_g.tls_ca;
	int rc = edgelm_connect_ex(&o, c, &e);
	if (rc)
		return ctl_fail(rc, &e);
	edgelm_set_timeout(*c, ctl_g.timeout_ms);
	return 0;
}
