/* tuning/state.c: what was applied, the state file, and its printing.
 *
 * The state file lets `edgelmd --restore-tuning` (the unit's ExecStopPost)
 * undo the sysfs changes of a daemon that died without restoring them
 * (kill -9, OOM kill, crash). It is a small text file, rewritten atomically
 * (write <path>.tmp.<pid>, fsync, rename, fsync the directory), so a reader
 * sees the old or the new version, never half of one:
 *
 *   # edgelmd tuning state: `edgelmd --restore-tuning` puts these back
 *   edgelm-tuning-state 1
 *   boot_id 88e4eef0-fecd-48ea-bd3a-c52ca85b47da
 *   pid 4242
 *   change epp devices/system/cpu/cpufreq/policy0/energy_performance_preference balance_performance
 * performance change governor devices/system/cpu/cpufreq/policy0/scaling_governor powersave
 * performance
 *
 * Only process-independent changes are listed (the governor and EPP); nice,
 * affinity, memory locks and the like die with the process. Because
 * --restore-tuning runs as root, a line may only name a cpufreq governor or
 * EPP file relative to the sysfs root, and values are plain words: a
 * tampered file cannot make it write anywhere else. */
#include "tuning/tuning_impl.h"

#include <ctype.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_MAGIC "edgelm-tuning-state"
#define STATE_VERSION 1

void tuning_state_init(struct tuning_state *s)
{
	memset(s, 0, sizeof(*s));
}

void tuning_state_fini(struct tuning_state *s)
{
	if (!s)
		return;
	cm_free(s->changes);
	memset(s, 0, sizeof(*s));
}

struct tuning_change *tuning_state_add(struct tuning_state *s, enum tuning_knob_kind kind,
                                       const char *target, const char *before, const char *after,
                                       bool persistent)
{
	if (s->n_changes == s->cap_changes) {
		int ncap = s->cap_changes ? s->cap_changes * 2 : 16;
		struct tuning_change *nc = cm_realloc(s->changes, (size_t)ncap * sizeof(*nc));
		if (!nc)
			return NULL;
		s->changes = nc;
		s->cap_changes = ncap;
	}
	struct tuning_change *c = &s->changes[s->n_changes++];
	memset(c, 0, sizeof(*c));
	c->kind = kind;
	tuning_strlcpy(c->target, target, sizeof(c->target));
	tuning_strlcpy(c->before, before, sizeof(c->before));
	tuning_strlcpy(c->after, after, sizeof(c->after));
	c->persistent = persistent;
	c->result = 1; /* pending */
	return c;
}

void tuning_change_fail(struct tuning_state *s, struct tuning_change *c, int code, const char *fmt,
                        ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
	va_end(ap);
	if (c->result >= 0)
		s->n_failed++;
	c->result = code < 0 ? code : -EIO;
}

/* devices/system/cpu/cpufreq/policy<N>/{scaling_governor,energy_performance_preference} */
bool tuning_state_target_ok(const char *rel)
{
	static const char pre[] = "devices/system/cpu/cpufreq/policy";
	if (strncmp(rel, pre, sizeof(pre) - 1) != 0)
		return false;
	const char *p = rel + sizeof(pre) - 1;
	if (!isdigit((unsigned char)*p))
		return false;
	while (isdigit((unsigned char)*p))
		p++;
	return strcmp(p, "/scaling_governor") == 0 ||
	       strcmp(p, "/energy_performance_preference") == 0;
}

static bool kind_matches(enum tuning_knob_kind k, const char *rel)
{
	if (k == TUNING_KNOB_GOVERNOR)
		return strstr(rel, "/scaling_governor") != NULL;
	if (k == TUNING_KNOB_EPP)
		return strstr(rel, "/energy_performance_preference") != NULL;
	return false;
}

static int fsync_dir(const char *path)
{
	char tmp[TUNING_PATH_MAX];
	tuning_strlcpy(tmp, path, sizeof(tmp));
	int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return r;
}

int tuning_state_save(const struct tuning_state *s, const char *path, struct cm_err *err)
{
	int n = 0;
	for (int i = 0; i < s->n_changes; i++) {
		const struct tuning_change *c = &s->changes[i];
		n += c->persistent && c->result >= 0 && !(c->restored && c->restore_result >= 0);
	}
	if (n == 0) {
		/* nothing to undo: no file is the clearest state */
		if (unlink(path) < 0 && errno != ENOENT) {
			int e = errno;
			return cm_err_set(err, -e, "tuning state: unlink %s: %s", path,
			                  strerror(e));
		}
		return 0;
	}
	char dir[TUNING_PATH_MAX];
	tuning_strlcpy(dir, path, sizeof(dir));
	char *d = dirname(dir);
	if (mkdir(d, 0755) < 0 && errno != EEXIST) {
		int e = errno;
		return cm_err_set(err, -e, "tuning state: mkdir %s: %s", d, strerror(e));
	}
	char tmp[TUNING_PATH_MAX + 32];
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		int e = errno;
		return cm_err_set(err, -e, "tuning state: %s: %s", tmp, strerror(e));
	}
	FILE *f = fdopen(fd, "w");
	if (!f) {
		int e = errno;
		close(fd);
		unlink(tmp);
		return cm_err_set(err, -e, "tuning state: %s: %s", tmp, strerror(e));
	}
	fprintf(f, "# edgelmd tuning state: `edgelmd --restore-tuning` puts these values back\n");
	fprintf(f, "%s %d\n", STATE_MAGIC, STATE_VERSION);
	fprintf(f, "boot_id %s\n", s->boot_id[0] ? s->boot_id : "-");
	fprintf(f, "pid %ld\n", s->pid);
	for (int i = 0; i < s->n_changes; i++) {
		const struct tuning_change *c = &s->changes[i];
		/* still to undo: applied (or pending) and not restored yet, or
		 * its restore failed and may be retried */
		if (!c->persistent || c->result < 0 || (c->restored && c->restore_result >= 0))
			continue;
		fprintf(f, "change %s %s %s %s\n", tuning_knob_name(c->kind), c->target, c->before,
		        c->after);
	}
	int ret = 0;
	if (fflush(f) != 0 || fsync(fd) != 0)
		ret = -errno;
	if (fclose(f) != 0 && ret == 0)
		ret = -errno;
	if (ret == 0 && rename(tmp, path) != 0)
		ret = -errno;
	if (ret < 0) {
		unlink(tmp);
		return cm_err_set(err, ret, "tuning state: writing %s: %s", path, strerror(-ret));
	}
	(void)fsync_dir(path);
	return 0;
}

int tuning_state_load(const char *path, const struct tuning_paths *paths, struct tuning_state *ret,
                      struct cm_err *err)
{
	char *text = NULL;
	int r = tuning_fs_slurp(path, &text, NULL);
	if (r < 0)
		return cm_err_set(err, r, "tuning state: %s: %s", path, strerror(-r));
	struct tuning_state s;
	tuning_state_init(&s);
	int lineno = 0, version = -1;
	char boot[40] = "";
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		lineno++;
		if (line[0] == '#' || line[0] == '\0')
			continue;
		char w[5][128];
		int nw =
		    sscanf(line, "%127s %127s %127s %127s %127s", w[0], w[1], w[2], w[3], w[4]);
		if (nw == 2 && strcmp(w[0], STATE_MAGIC) == 0) {
			version = atoi(w[1]);
		} else if (nw == 2 && strcmp(w[0], "boot_id") == 0) {
			tuning_strlcpy(boot, strcmp(w[1], "-") == 0 ? "" : w[1], sizeof(boot));
		} else if (nw == 2 && strcmp(w[0], "pid") == 0) {
			s.pid = atol(w[1]);
		} else if (nw == 5 && strcmp(w[0], "change") == 0) {
			enum tuning_knob_kind k = TUNING_KNOB_COUNT;
			for (int i = 0; i < TUNING_KNOB_COUNT; i++)
				if (strcmp(w[1], tuning_knob_name((enum tuning_knob_kind)i)) == 0)
					k = (enum tuning_knob_kind)i;
			if ((k != TUNING_KNOB_GOVERNOR && k != TUNING_KNOB_EPP) ||
			    !tuning_state_target_ok(w[2]) || !kind_matches(k, w[2]) ||
			    !tuning_word_is_plain(w[3]) || !tuning_word_is_plain(w[4])) {
				r = cm_err_set(
				    err, -EBADMSG,
				    "tuning state: %s:%d: refusing '%.80s' (only cpufreq "
				    "governor/EPP files and plain values are allowed)",
				    path, lineno, line);
				goto fail;
			}
			struct tuning_change *c = tuning_state_add(&s, k, w[2], w[3], w[4], true);
			if (!c) {
				r = cm_err_set(err, -ENOMEM, "tuning state: out of memory");
				goto fail;
			}
			c->result = 0;
		} else {
			r = cm_err_set(err, -EBADMSG, "tuning state: %s:%d: malformed line '%.80s'",
			               path, lineno, line);
			goto fail;
		}
	}
	if (version != STATE_VERSION) {
		r = cm_err_set(err, -EBADMSG, "tuning state: %s: not a version %d state file", path,
		               STATE_VERSION);
		goto fail;
	}
	tuning_strlcpy(s.boot_id, boot, sizeof(s.boot_id));
	char now[40];
	tuning_boot_id(paths, now, sizeof(now));
	if (boot[0] && now[0] && strcmp(boot, now) != 0) {
		r = cm_err_set(err, -ESTALE,
		               "tuning state: %s was written in an earlier boot (%s); sysfs was "
		               "reset by the reboot, nothing to restore",
		               path, boot);
		goto fail;
	}
	cm_free(text);
	*ret = s;
	return 0;
fail:
	cm_free(text);
	tuning_state_fini(&s);
	return r;
}

/* ---- printing ----------------------------------------------------------- */

/* "devices/system/cpu/cpufreq/policy3/scaling_governor" -> "policy3" */
static void short_target(const char *t, char *buf, size_t len)
{
	const char *p = strstr(t, "cpufreq/");
	if (p) {
		p += 8;
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n >= len)
			n = len - 1;
		memcpy(buf, p, n);
		buf[n] = '\0';
		return;
	}
	tuning_strlcpy(buf, t, len);
}

void tuning_state_print(FILE *f, const struct tuning_state *s)
{
	if (s->n_changes == 0) {
		fprintf(f, "tuning: nothing was changed\n");
		return;
	}
	for (int i = 0; i < s->n_changes; i++) {
		const struct tuning_change *c = &s->changes[i];
		char t[96];
		short_target(c->target, t, sizeof(t));
		fprintf(f, "  %-14s %-12s %s -> %s", tuning_knob_name(c->kind), t, c->before,
		        c->after);
		if (c->result < 0)
			fprintf(f, ": FAILED: %s", c->reason);
		else if (c->result > 0)
			fprintf(f, ": pending");
		if (c->restored) {
			if (c->restore_result == 0)
				fprintf(f, "; restored %s", c->before);
			else if (c->restore_result > 0)
				fprintf(f, "; left alone: %s", c->restore_note);
			else
				fprintf(f, "; RESTORE FAILED: %s", c->restore_note);
		}
		fputc('\n', f);
	}
}

/* ---- JSON for `info` ---------------------------------------------------- */

struct sbuf {
	char *p;
	size_t n, cap;
	bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t ncap = b->cap ? b->cap : 512;
		while (ncap < b->n + n + 1)
			ncap *= 2;
		char *np = cm_realloc(b->p, ncap);
		if (!np) {
			b->oom = true;
			return;
		}
		b->p = np;
		b->cap = ncap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) CM_PRINTF(2, 3);
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (k > 0)
		sb_put(b, tmp, CM_MIN((size_t)k, sizeof(tmp) - 1));
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_put(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\') {
			char e[2] = {'\\', (char)*p};
			sb_put(b, e, 2);
		} else if (*p < 0x20) {
			sb_printf(b, "\\u%04x", *p);
		} else {
			sb_put(b, (const char *)p, 1);
		}
	}
	sb_put(b, "\"", 1);
}

int tuning_state_json(const struct tuning_state *s, const struct tuning_plan *p, char **ret_json,
                      struct cm_err *err)
{
	struct sbuf b = {0};
	char list[4096];
	sb_put(&b, "{", 1);
	if (p) {
		sb_printf(&b, "\"workers\":%d,\"pinned\":%s,\"worker_cpus\":[", p->n_workers,
		          p->pin ? "true" : "false");
		for (int i = 0; i < p->n_workers; i++)
			sb_printf(&b, "%s%d", i ? "," : "", p->worker_cpus[i]);
		(void)tuning_cpuset_format(&p->service, list, sizeof(list));
		sb_put(&b, "],\"service_cpus\":", 17);
		sb_str(&b, list);
		sb_put(&b, ",\"numa\":", 8);
		sb_str(&b, tuning_numa_name(p->numa));
		sb_printf(&b, ",\"numa_node\":%d,", p->numa_node);
	}
	sb_printf(&b, "\"failed\":%d,\"changes\":[", s->n_failed);
	for (int i = 0; i < s->n_changes; i++) {
		const struct tuning_change *c = &s->changes[i];
		char t[96];
		short_target(c->target, t, sizeof(t));
		sb_put(&b, i ? ",{\"knob\":" : "{\"knob\":", i ? 9 : 8);
		sb_str(&b, tuning_knob_name(c->kind));
		sb_put(&b, ",\"target\":", 10);
		sb_str(&b, t);
		sb_put(&b, ",\"before\":", 10);
		sb_str(&b, c->before);
		sb_put(&b, ",\"after\":", 9);
		sb_str(&b, c->after);
		sb_put(&b, ",\"status\":", 10);
		sb_str(&b, c->restored ? (c->restore_result == 0 ? "restored" : "restore-failed")
		           : c->result == 0 ? "applied"
		           : c->result > 0  ? "pending"
		                            : "failed");
		if (c->result < 0) {
			sb_put(&b, ",\"error\":", 9);
			sb_str(&b, c->reason);
		}
		sb_put(&b, "}", 1);
	}
	sb_put(&b, "]}", 2);
	if (b.oom) {
		cm_free(b.p);
		return cm_err_set(err, -ENOMEM, "tuning: out of memory");
	}
	*ret_json = b.p;
	return 0;
}
