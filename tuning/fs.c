/* tuning/fs.c: configurable roots, small-file access, cpu lists, text
 * helpers, and the config defaults. */
#include "tuning/tuning_impl.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- paths -------------------------------------------------------------- */

void tuning_paths_default(struct tuning_paths *p)
{
	memset(p, 0, sizeof(*p));
	tuning_strlcpy(p->sysfs_root, "/sys", sizeof(p->sysfs_root));
	tuning_strlcpy(p->procfs_root, "/proc", sizeof(p->procfs_root));
	tuning_strlcpy(p->run_root, "/run", sizeof(p->run_root));
	tuning_strlcpy(p->cgroup_root, "/sys/fs/cgroup", sizeof(p->cgroup_root));
	/* /run is a tmpfs: a reboot resets sysfs and removes the state file
	 * together, so a stale file can never "restore" values over a fresh
	 * boot. (The boot id in the file guards the case of a persistent /run.) */
	tuning_strlcpy(p->state_file, "/run/edgelm/tuning.state", sizeof(p->state_file));
}

static int env_path(char *dst, size_t len, const char *var, struct cm_err *err)
{
	const char *v = getenv(var);
	if (!v || !*v)
		return 0;
	if (v[0] != '/')
		return cm_err_set(err, -EINVAL, "tuning: %s=%s: not an absolute path", var, v);
	size_t n = strlen(v);
	while (n > 1 && v[n - 1] == '/')
		n--;
	if (n >= len)
		return cm_err_set(err, -ENAMETOOLONG, "tuning: %s: path too long", var);
	memcpy(dst, v, n);
	dst[n] = '\0';
	return 1;
}

int tuning_paths_from_env(struct tuning_paths *p, struct cm_err *err)
{
	int r;
	tuning_paths_default(p);
	if ((r = env_path(p->sysfs_root, sizeof(p->sysfs_root), "EDGELM_SYSFS_ROOT", err)) < 0)
		return r;
	if (r > 0) {
		/* the cgroup fs follows the sysfs root unless set on its own */
		if (strlen(p->sysfs_root) + sizeof("/fs/cgroup") > sizeof(p->cgroup_root))
			return cm_err_set(err, -ENAMETOOLONG, "tuning: EDGELM_SYSFS_ROOT too long");
		snprintf(p->cgroup_root, sizeof(p->cgroup_root), "%.500s/fs/cgroup",
		         strcmp(p->sysfs_root, "/") == 0 ? "" : p->sysfs_root);
	}
	if ((r = env_path(p->procfs_root, sizeof(p->procfs_root), "EDGELM_PROCFS_ROOT", err)) < 0)
		return r;
	if ((r = env_path(p->run_root, sizeof(p->run_root), "EDGELM_RUN_ROOT", err)) < 0)
		return r;
	if ((r = env_path(p->cgroup_root, sizeof(p->cgroup_root), "EDGELM_CGROUP_ROOT", err)) < 0)
		return r;
	if ((r = env_path(p->state_file, sizeof(p->state_file), "EDGELM_TUNING_STATE", err)) < 0)
		return r;
	return 0;
}

bool tuning_paths_is_live(const struct tuning_paths *p)
{
	return strcmp(p->procfs_root, "/proc") == 0;
}

/* ---- files -------------------------------------------------------------- */

static int vpath(char *buf, size_t len, const char *root, const char *fmt, va_list ap)
{
	int n = snprintf(buf, len, "%s/", strcmp(root, "/") == 0 ? "" : root);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	int m = vsnprintf(buf + n, len - (size_t)n, fmt, ap);
	if (m < 0 || (size_t)m >= len - (size_t)n)
		return -ENAMETOOLONG;
	return 0;
}

int tuning_fs_path(char *buf, size_t len, const char *root, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = vpath(buf, len, root, fmt, ap);
	va_end(ap);
	return r;
}

static void rstrip(char *s, size_t n)
{
	while (n > 0 && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
}

int tuning_fs_read(const char *path, char *buf, size_t len)
{
	if (len == 0)
		return -EINVAL;
	buf[0] = '\0';
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t got = 0;
	for (;;) {
		if (got == len - 1) {
			char extra;
			ssize_t k = read(fd, &extra, 1);
			close(fd);
			buf[got] = '\0';
			return k > 0 ? -EFBIG : (int)got;
		}
		ssize_t k = read(fd, buf + got, len - 1 - got);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			int e = -errno;
			close(fd);
			buf[0] = '\0';
			return e;
		}
		if (k == 0)
			break;
		got += (size_t)k;
	}
	close(fd);
	buf[got] = '\0';
	rstrip(buf, got);
	return (int)strlen(buf);
}

int tuning_fs_readf(char *buf, size_t len, const char *root, const char *fmt, ...)
{
	char path[TUNING_PATH_MAX * 2];
	va_list ap;
	va_start(ap, fmt);
	int r = vpath(path, sizeof(path), root, fmt, ap);
	va_end(ap);
	if (r < 0) {
		if (len)
			buf[0] = '\0';
		return r;
	}
	return tuning_fs_read(path, buf, len);
}

int tuning_fs_read_ll(long long *ret, const char *root, const char *fmt, ...)
{
	char path[TUNING_PATH_MAX * 2], buf[64];
	va_list ap;
	va_start(ap, fmt);
	int r = vpath(path, sizeof(path), root, fmt, ap);
	va_end(ap);
	if (r < 0)
		return r;
	r = tuning_fs_read(path, buf, sizeof(buf));
	if (r < 0)
		return r;
	char *end;
	errno = 0;
	long long v = strtoll(buf, &end, 10);
	if (end == buf || errno)
		return -EINVAL;
	*ret = v;
	return 0;
}

int tuning_fs_slurp(const char *path, char **ret, size_t *ret_len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t cap = 4096, n = 0;
	char *buf = cm_malloc(cap);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		if (n + 1 >= cap) {
			if (cap > (64u << 20)) { /* procfs files are small; refuse runaway input */
				cm_free(buf);
				close(fd);
				return -EFBIG;
			}
			char *nb = cm_realloc(buf, cap * 2);
			if (!nb) {
				cm_free(buf);
				close(fd);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t k = read(fd, buf + n, cap - 1 - n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			int e = -errno;
			cm_free(buf);
			close(fd);
			return e;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	buf[n] = '\0';
	*ret = buf;
	if (ret_len)
		*ret_len = n;
	return 0;
}

int tuning_fs_write(const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t n = strlen(value);
	ssize_t k;
	do
		k = write(fd, value, n);
	while (k < 0 && errno == EINTR);
	int e = k < 0 ? -errno : (size_t)k != n ? -EIO : 0;
	if (close(fd) < 0 && e == 0)
		e = -errno;
	return e;
}

bool tuning_fs_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

/* ---- text --------------------------------------------------------------- */

int tuning_text_field(const char *text, const char *key, char *buf, size_t len)
{
	size_t kl = strlen(key);
	for (const char *p = text; p && *p;) {
		const char *eol = strchr(p, '\n');
		size_t ll = eol ? (size_t)(eol - p) : strlen(p);
		if (ll > kl && strncmp(p, key, kl) == 0 &&
		    (p[kl] == ':' || p[kl] == ' ' || p[kl] == '\t')) {
			const char *v = p + kl;
			const char *end = p + ll;
			/* "key\t: value" (cpuinfo) or "key: value" or "key value" */
			while (v < end && (*v == ' ' || *v == '\t'))
				v++;
			if (v < end && *v == ':')
				v++;
			while (v < end && (*v == ' ' || *v == '\t'))
				v++;
			size_t vl = (size_t)(end - v);
			while (vl > 0 && isspace((unsigned char)v[vl - 1]))
				vl--;
			if (len) {
				size_t c = vl < len - 1 ? vl : len - 1;
				memcpy(buf, v, c);
				buf[c] = '\0';
			}
			return 0;
		}
		p = eol ? eol + 1 : NULL;
	}
	if (len)
		buf[0] = '\0';
	return -ENOENT;
}

int tuning_text_kib(const char *text, const char *key, uint64_t *ret)
{
	char v[64];
	int r = tuning_text_field(text, key, v, sizeof(v));
	if (r < 0)
		return r;
	char *end;
	unsigned long long x = strtoull(v, &end, 10);
	if (end == v)
		return -EINVAL;
	while (*end == ' ')
		end++;
	if (*end == 'k' || *end == 'K')
		x *= 1024;
	*ret = x;
	return 0;
}

void tuning_text_bracketed(const char *text, char *buf, size_t len)
{
	const char *a = strchr(text, '['), *b = a ? strchr(a, ']') : NULL;
	if (!a || !b) {
		/* a file with one value and no brackets names it plainly */
		if (!strchr(text, ' '))
			tuning_strlcpy(buf, text, len);
		else if (len)
			buf[0] = '\0';
		return;
	}
	size_t n = (size_t)(b - a - 1);
	if (n >= len)
		n = len - 1;
	memcpy(buf, a + 1, n);
	buf[n] = '\0';
}

bool tuning_word_in(const char *list, const char *word)
{
	size_t wl = strlen(word);
	if (wl == 0)
		return false;
	for (const char *p = list; *p;) {
		while (*p && isspace((unsigned char)*p))
			p++;
		const char *s = p;
		while (*p && !isspace((unsigned char)*p))
			p++;
		if ((size_t)(p - s) == wl && strncmp(s, word, wl) == 0)
			return true;
	}
	return false;
}

bool tuning_word_is_plain(const char *v)
{
	size_t n = strlen(v);
	if (n == 0 || n > 63)
		return false;
	for (const char *p = v; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("_.:+-", *p))
			return false;
	return true;
}

void tuning_strlcpy(char *dst, const char *src, size_t len)
{
	if (!len)
		return;
	size_t n = strlen(src);
	if (n >= len)
		n = len - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

void tuning_fmt_bytes(char *buf, size_t len, uint64_t b)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	size_t u = 0;
	while (v >= 1024 && u + 1 < CM_ARRAY_LEN(unit)) {
		v /= 1024;
		u++;
	}
	if (u == 0 || v >= 100 || v == (double)(uint64_t)v)
		snprintf(buf, len, "%.0f %s", v, unit[u]);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
}

void tuning_boot_id(const struct tuning_paths *paths, char *buf, size_t len)
{
	if (tuning_fs_readf(buf, len, paths->procfs_root, "sys/kernel/random/boot_id") < 0 && len)
		buf[0] = '\0';
}

/* ---- cpu sets ----------------------------------------------------------- */

int tuning_cpuset_count(const struct tuning_cpuset *s)
{
	int n = 0;
	for (size_t i = 0; i < CM_ARRAY_LEN(s->bits); i++)
		n += __builtin_popcountll(s->bits[i]);
	return n;
}

int tuning_cpuset_next(const struct tuning_cpuset *s, int from)
{
	if (from < 0)
		from = 0;
	for (int w = from / 64; w < (int)CM_ARRAY_LEN(s->bits); w++) {
		uint64_t b = s->bits[w];
		if (w == from / 64)
			b &= ~0ull << (from % 64);
		if (b)
			return w * 64 + __builtin_ctzll(b);
	}
	return -1;
}

void tuning_cpuset_and(struct tuning_cpuset *d, const struct tuning_cpuset *s)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(d->bits); i++)
		d->bits[i] &= s->bits[i];
}

void tuning_cpuset_or(struct tuning_cpuset *d, const struct tuning_cpuset *s)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(d->bits); i++)
		d->bits[i] |= s->bits[i];
}

bool tuning_cpuset_equal(const struct tuning_cpuset *a, const struct tuning_cpuset *b)
{
	return memcmp(a->bits, b->bits, sizeof(a->bits)) == 0;
}

static int parse_num(const char **pp, long *ret)
{
	const char *p = *pp;
	if (!isdigit((unsigned char)*p))
		return -EINVAL;
	long v = 0;
	while (isdigit((unsigned char)*p)) {
		v = v * 10 + (*p - '0');
		if (v > 1000000)
			return -ERANGE;
		p++;
	}
	*pp = p;
	*ret = v;
	return 0;
}

int tuning_cpuset_parse(const char *list, struct tuning_cpuset *ret, struct cm_err *err)
{
	struct tuning_cpuset s;
	tuning_cpuset_zero(&s);
	const char *p = list;
	while (isspace((unsigned char)*p))
		p++;
	while (*p && !isspace((unsigned char)*p)) {
		long a, b;
		int r = parse_num(&p, &a);
		if (r < 0)
			goto bad;
		b = a;
		if (*p == '-') {
			p++;
			if ((r = parse_num(&p, &b)) < 0 || b < a)
				goto bad;
		}
		if (b >= TUNING_MAX_CPUS)
			return cm_err_set(err, -ERANGE, "cpu list '%.64s': cpu %ld beyond %d", list,
			                  b, TUNING_MAX_CPUS - 1);
		for (long c = a; c <= b; c++)
			tuning_cpuset_add(&s, (int)c);
		if (*p == ',')
			p++;
		else if (*p && !isspace((unsigned char)*p))
			goto bad;
	}
	while (isspace((unsigned char)*p))
		p++;
	if (*p)
		goto bad;
	*ret = s;
	return 0;
bad:
	return cm_err_set(err, -EINVAL, "cpu list '%.64s': bad syntax", list);
}

int tuning_cpuset_format(const struct tuning_cpuset *s, char *buf, size_t len)
{
	size_t n = 0;
	if (!len)
		return -ENOSPC;
	buf[0] = '\0';
	for (int c = tuning_cpuset_next(s, 0); c >= 0;) {
		int e = c;
		while (tuning_cpuset_has(s, e + 1))
			e++;
		char item[32];
		int k = e == c ? snprintf(item, sizeof(item), "%s%d", n ? "," : "", c)
		               : snprintf(item, sizeof(item), "%s%d-%d", n ? "," : "", c, e);
		if (n + (size_t)k + 1 > len) {
			if (len >= 4)
				memcpy(buf + (n + 4 <= len ? n : len - 4), "...", 4);
			return -ENOSPC;
		}
		memcpy(buf + n, item, (size_t)k + 1);
		n += (size_t)k;
		c = tuning_cpuset_next(s, e + 1);
	}
	return 0;
}

/* ---- config ------------------------------------------------------------- */

void tuning_config_default(struct tuning_config *c)
{
	memset(c, 0, sizeof(*c));
	c->threads = 0;
	c->pin = true;
	tuning_strlcpy(c->governor, "performance", sizeof(c->governor));
	tuning_strlcpy(c->epp, "performance", sizeof(c->epp));
	c->nice = -5;
	c->sched_batch = false;
	c->load_ioprio = TUNING_IOPRIO_BE;
	c->load_ioprio_level = 7;
	c->mlock = TUNING_MLOCK_ON;
	/* Off by default: the copy costs RSS and measured gains range from
	 * +13 % to -20 % by machine (docs/cpu-kernels.md section 7). */
	c->hugepages = false;
	c->prefault = true;
	c->numa = TUNING_NUMA_AUTO;
	c->numa_node = -1;
	c->oom_score_adj = TUNING_KEEP;
	c->amx = true;
}

static const char *const mlock_names[] = {"off", "on", "all"};
static const char *const numa_names[] = {"auto", "node", "interleave", "off"};

const char *tuning_mlock_name(enum tuning_mlock m)
{
	return (unsigned)m < CM_ARRAY_LEN(mlock_names) ? mlock_names[m] : "?";
}

int tuning_mlock_parse(const char *s, enum tuning_mlock *ret)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(mlock_names); i++)
		if (strcmp(s, mlock_names[i]) == 0) {
			*ret = (enum tuning_mlock)i;
			return 0;
		}
	return -EINVAL;
}

const char *tuning_numa_name(enum tuning_numa n)
{
	return (unsigned)n < CM_ARRAY_LEN(numa_names) ? numa_names[n] : "?";
}

int tuning_numa_parse(const char *s, enum tuning_numa *ret)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(numa_names); i++)
		if (strcmp(s, numa_names[i]) == 0) {
			*ret = (enum tuning_numa)i;
			return 0;
		}
	return -EINVAL;
}

int tuning_ioprio_parse(const char *s, enum tuning_ioprio *ret_class, int *ret_level)
{
	if (strcmp(s, "keep") == 0) {
		*ret_class = TUNING_IOPRIO_KEEP;
		*ret_level = 0;
		return 0;
	}
	if (strcmp(s, "idle") == 0) {
		*ret_class = TUNING_IOPRIO_IDLE;
		*ret_level = 0;
		return 0;
	}
	if (strcmp(s, "be") == 0) {
		*ret_class = TUNING_IOPRIO_BE;
		*ret_level = 7;
		return 0;
	}
	if (strncmp(s, "be:", 3) == 0 && s[3] >= '0' && s[3] <= '7' && s[4] == '\0') {
		*ret_class = TUNING_IOPRIO_BE;
		*ret_level = s[3] - '0';
		return 0;
	}
	return -EINVAL;
}
