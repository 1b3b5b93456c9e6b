/* tools/ctl/top.c: edgelmctl top, the monitor's frame renderer fed by the
 * metrics op. */
#include "tools/ctl/ctl.h"
#include "monitor/monitor.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int top_fetch(void *ud, char **ret_json, struct cm_err *err)
{
	edgelm_client *c = ud;
	struct edgelm_error e;
	char *reply = NULL;
	int rc = edgelm_metrics(c, &reply, &e);
	if (rc != 0)
		return cm_err_set(err, -EIO, "%s", e.message);
	json_t *root = json_loads(reply, 0, NULL);
	edgelm_free(reply);
	json_t *doc = root ? json_object_get(root, "metrics") : NULL;
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(root);
	if (!text)
		return cm_err_set(err, -EPROTO, "the daemon's metrics are not a monitor document");
	*ret_json = cm_strdup(text);
	free(text);
	return *ret_json ? 0 : cm_err_set(err, -ENOMEM, "out of memory");
}

int ctl_cmd_top(int argc, char **argv)
{
	long interval = 1000;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			ctl_usage_command("top", stdout);
			return EXIT_OK;
		}
		if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
			char *end;
			interval = strtol(argv[++i], &end, 10);
			if (*end || interval < 100 || interval > 60000)
				return ctl_usage_error("top", "--interval wants 100..60000 ms");
			continue;
		}
		return ctl_usage_error("top", "unknown argument '%s'", argv[i]);
	}
	edgelm_client *c = NULL;
	int code = ctl_connect(&c);
	if (code)
		return code;
	struct cm_err err = {0};
	int rc = monitor_top_run(top_fetch, c, (unsigned)interval, STDIN_FILENO, STDOUT_FILENO,
				 &err);
	edgelm_close(c);
	if (rc) {
		fprintf(stderr, "edgelmctl: top: %s\n", err.msg);
		return EXIT_SERVER;
	}
	return EXIT_OK;
}
