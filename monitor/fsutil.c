/* monitor/fsutil.c: reading small procfs/sysfs files.
 *
 * Every file goes through one growable buffer owned by the sampler, so a
 * sample allocates nothing once the buffer has grown to the largest file
 * (/proc/stat on a many-core box, mostly its "intr" line). */
#include "monitor/monitor_impl.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MON_FILE_MAX (16u << 20)

void mon_buf_fini(struct mon_buf *b)
{
	cm_free(b->p);
	b->p = NULL;
	b->cap = 0;
}

static int buf_grow(struct mon_buf *b, size_t need)
{
	if (need <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < need)
		cap *= 2;
	if (cap > MON_FILE_MAX)
		return -EFBIG;
	char *p = cm_realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

long mon_read_file(struct mon_buf *b, const char *path)
{
	int rc = buf_grow(b, 4096);
	if (rc)
		return rc;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t len = 0;
	for (;;) {
		if (len + 1 >= b->cap && (rc = buf_grow(b, b->cap * 2)) != 0)
			break;
		ssize_t n = read(fd, b->p + len, b->cap - 1 - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (rc)
		return rc;
	b->p[len] = '\0';
	return (long)len;
}

int mon_read_u64(struct mon_buf *b, const char *path, uint64_t *ret)
{
	long n = mon_read_file(b, path);
	if (n < 0)
		return (int)n;
	const char *s = b->p;
	while (*s == ' ' || *s == '\t')
		s++;
	if (strncmp(s, "max", 3) == 0) {
		*ret = UINT64_MAX;
		return 0;
	}
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (end == s || errno)
		return -EPROTO;
	*ret = v;
	return 0;
}

bool mon_kv_u64(const char *text, const char *key, uint64_t *ret)
{
	size_t k = strlen(key);
	for (const char *l = text; l && *l;) {
		const char *s = l + k;
		if (strncmp(l, key, k) == 0 && (*s == ' ' || *s == '\t' || *s == ':')) {
			while (*s == ' ' || *s == '\t' || *s == ':')
				s++;
			char *end;
			unsigned long long v = strtoull(s, &end, 10);
			if (end == s)
				return false;
			*ret = v;
			return true;
		}
		l = strchr(l, '\n');
		if (l)
			l++;
	}
	return false;
}
