/* monitor/textfile.c: the node_exporter textfile (*.prom).
 *
 * node_exporter's textfile collector reads every *.prom file of its
 * directory at each scrape. To never hand it half a file, the text goes to a
 * hidden temporary file in the same directory (same filesystem, and a name
 * that does not match *.prom), which is then renamed over the target:
 * rename(2) is atomic for readers. No fsync: a crash may lose the last
 * sample, which the next one replaces a second later. */
#include "monitor/monitor_impl.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = write(fd, p, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

int monitor_textfile_write(monitor *m, const char *path, struct cm_err *err)
{
	char dirbuf[4096], basebuf[4096], tmp[8400];
	if (!path || !*path || strlen(path) >= sizeof(dirbuf))
		return cm_err_set(err, -EINVAL, "monitor: textfile: bad path");
	snprintf(dirbuf, sizeof(dirbuf), "%s", path);
	snprintf(basebuf, sizeof(basebuf), "%s", path);
	snprintf(tmp, sizeof(tmp), "%s/.%s.XXXXXX", dirname(dirbuf), basename(basebuf));

	char *text;
	size_t len;
	int rc = monitor_prometheus_render(m, &text, &len, err);
	if (rc)
		return rc;
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		cm_free(text);
		return cm_err_set(err, rc, "monitor: textfile: %s: %s", tmp, strerror(-rc));
	}
	/* mkstemp makes 0600; node_exporter runs as another user. */
	if (fchmod(fd, 0644) < 0 || (rc = write_all(fd, text, len)) != 0) {
		rc = rc ? rc : -errno;
		goto out_unlink;
	}
	if (close(fd) < 0) {
		fd = -1;
		rc = -errno;
		goto out_unlink;
	}
	fd = -1;
	if (rename(tmp, path) < 0) {
		rc = -errno;
		goto out_unlink;
	}
	cm_free(text);
	return 0;

out_unlink:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	cm_free(text);
	return cm_err_set(err, rc, "monitor: textfile: %s: %s", path, strerror(-rc));
}
