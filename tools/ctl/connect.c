/* tools/ctl/connect.c: the connection to edgelmd (ctl.h), above output.c
 * (which reports its failures) and under the commands. */
#include "tools/ctl/ctl.h"

int ctl_connect(edgelm_client **c)
{
	struct edgelm_error e;
	int rc = edgelm_connect(ctl_g.socket, c, &e);
	if (rc)
		return ctl_fail(rc, &e);
	edgelm_set_timeout(*c, ctl_g.timeout_ms);
	return 0;
}
