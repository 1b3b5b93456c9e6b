/* tools/lib/args.c: numeric command-line arguments, parsed strictly.
 *
 * atoi() took "two" as 0 and "12k" as 12: a mistyped option ran with a
 * value nobody asked for. These take all of the string, in base 10, within
 * the option's range, or say what is wrong. */
#include "tools/lib/tools.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int tools_parse_long(const char *s, long lo, long hi, long *ret)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*ret = v;
	return 0;
}

int tools_parse_double(const char *s, double lo, double hi, double *ret)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		return -1;
	*ret = v;
	return 0;
}

int tools_parse_float(const char *s, float lo, float hi, float *ret)
{
	double v;
	if (tools_parse_double(s, lo, hi, &v) != 0)
		return -1;
	*ret = (float)v;
	return 0;
}

int tools_opt_long(const char *prog, const char *opt, const char *s, long lo, long hi, long *ret)
{
	if (tools_parse_long(s, lo, hi, ret) != 0) {
		fprintf(stderr, "%s: %s: '%s' is not a whole number from %ld to %ld\n", prog, opt, s,
			lo, hi);
		return -1;
	}
	return 0;
}

int tools_opt_int(const char *prog, const char *opt, const char *s, long lo, long hi, int *ret)
{
	long v;
	if (tools_opt_long(prog, opt, s, lo, hi, &v) != 0)
		return -1;
	*ret = (int)v;
	return 0;
}

int tools_opt_list(const char *prog, const char *opt, const char *s, long lo, long hi, int *out,
		   bool allow_empty, int max_n)
{
	int n = 0;
	if (!*s && allow_empty)
		return 0;
	for (const char *p = s;; p++) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		char item[32];
		if (len == 0 || len >= sizeof(item)) {
			fprintf(stderr, "%s: %s: '%s' is not a list of whole numbers (N,N,...)\n",
				prog, opt, s);
			return -1;
		}
		if (n == max_n) {
			fprintf(stderr, "%s: %s: '%s': at most %d values\n", prog, opt, s, max_n);
			return -1;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		if (tools_opt_int(prog, opt, item, lo, hi, &out[n]) != 0)
			return -1;
		n++;
		if (!e)
			break;
		p = e;
	}
	return n;
}
