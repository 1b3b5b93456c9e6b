/* tools/lib/readfile.c: a small text file read whole (a grammar, a JSON
 * schema), with a bound so a wrong path to a model is an error, not a
 * gigabyte in memory. */
#include "tools/lib/tools.h"

#include <errno.h>
#include <string.h>

int tools_read_file(const char *path, size_t max, char **ret_text, size_t *ret_len,
		    struct cm_err *err)
{
	*ret_text = NULL;
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!f)
		return cm_err_set(err, -errno, "%s: %s", path, strerror(errno));
	size_t n = 0, cap = 4096;
	char *buf = cm_malloc(cap);
	int rc = buf ? 0 : cm_err_set(err, -ENOMEM, "%s: out of memory", path);
	while (!rc) {
		if (n + 1 >= cap) {
			char *nb = cm_realloc(buf, cap * 2);
			if (!nb) {
				rc = cm_err_set(err, -ENOMEM, "%s: out of memory", path);
				break;
			}
			buf = nb;
			cap *= 2;
		}
		size_t got = fread(buf + n, 1, cap - 1 - n, f);
		n += got;
		if (n > max)
			rc = cm_err_set(err, -EFBIG, "%s: more than %zu bytes", path, max);
		else if (got == 0 && ferror(f))
			rc = cm_err_set(err, -EIO, "%s: read error", path);
		else if (got == 0)
			break;
	}
	if (f != stdin)
		fclose(f);
	if (!rc && memchr(buf, '\0', n))
		rc = cm_err_set(err, -EINVAL, "%s: contains a NUL byte", path);
	if (rc) {
		cm_free(buf);
		return rc;
	}
	buf[n] = '\0';
	*ret_text = buf;
	if (ret_len)
		*ret_len = n;
	return 0;
}
