/* monitor/psi.c: Pressure Stall Information, /proc/pressure/{cpu,memory,io}.
 *
 * Each file has a "some" line and (memory, io, and cpu since 5.13) a "full"
 * line: "some avg10=1.23 avg60=0.50 avg300=0.10 total=123456". The avgN are
 * kernel-smoothed percentages; avg10 decays over tens of seconds, so the
 * classifier uses `total` (microseconds stalled, cumulative) and takes its
 * delta per sample, which reacts within one sample. A kernel without PSI
 * (CONFIG_PSI off or psi=0) has no such files: that is not an error. */
#include "monitor/monitor_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char *const mon_psi_names[PSI_N] = {"cpu", "memory", "io"};

int mon_psi_parse(const char *text, struct psi_res *r)
{
	memset(r, 0, sizeof(*r));
	for (const char *l = text; l && *l;) {
		char kind[8];
		struct psi_line pl = {.have = true};
		if (sscanf(l, "%7s avg10=%lf avg60=%lf avg300=%lf total=%" SCNu64, kind, &pl.avg10,
		           &pl.avg60, &pl.avg300, &pl.total) == 5) {
			if (strcmp(kind, "some") == 0)
				r->some = pl;
			else if (strcmp(kind, "full") == 0)
				r->full = pl;
		}
		l = strchr(l, '\n');
		if (l)
			l++;
	}
	if (!r->some.have)
		return -EPROTO;
	r->present = true;
	return 0;
}

int mon_psi_read(struct mon_buf *b, const char *procfs, struct psi_res r[PSI_N], struct cm_err *err)
{
	int first = 0;
	for (int i = 0; i < PSI_N; i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/pressure/%s", procfs, mon_psi_names[i]);
		memset(&r[i], 0, sizeof(r[i]));
		long n = mon_read_file(b, path);
		if (n == -ENOENT || n == -EOPNOTSUPP)
			continue;
		int rc = n < 0 ? (int)n : mon_psi_parse(b->p, &r[i]);
		if (rc && !first)
			first = cm_err_set(err, rc, "monitor: %s: %s", path,
			                   rc == -EPROTO ? "unexpected format" : strerror(-rc));
	}
	return first;
}
