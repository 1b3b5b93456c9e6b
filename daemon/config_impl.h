/* daemon/config_impl.h: the configuration table's rows, for config.c and
 * its unit test (tests/unit/test_daemon_config.c walks the table to check
 * it against struct daemon_config, the docs and the reload mask). Nothing
 * else includes this: the rest of the daemon uses config.h. */
#ifndef EDGELM_DAEMON_CONFIG_IMPL_H
#define EDGELM_DAEMON_CONFIG_IMPL_H

#include "daemon/config.h"

#include <stdbool.h>
#include <stddef.h>

enum opt_type {
	OPT_STRING, /* char[] */
	OPT_INT,    /* int, decimal */
	OPT_UINT,   /* uint32_t, decimal */
	OPT_BOOL,   /* bool: yes/no, true/false, on/off, 1/0 */
	OPT_DOUBLE, /* double */
	OPT_OCTAL,  /* uint32_t, octal (file modes) */
	OPT_LIST,   /* char[DAEMON_MAX_LISTEN][512] and an int count (count_off) */
};

typedef int (*opt_check_fn)(const char *value, struct cm_err *err);

struct opt {
	const char *name;
	enum opt_type type;
	size_t off;          /* offsetof(struct daemon_config, field) */
	size_t size;         /* sizeof the field (string: buffer; list: one entry) */
	const char *def;     /* default, as the text a file would hold */
	double min, max;     /* numbers: inclusive range */
	unsigned flags;      /* enum daemon_config_flags */
	const char *choices; /* strings: the allowed values, "a|b|c" (NULL: any) */
	opt_check_fn check;  /* strings: extra syntax check (NULL: none) */
	long keep;           /* ints: the value spelled "keep" (0: no such value) */
	const char *section; /* starts a section in print (NULL: same section) */
	const char *help;
	size_t count_off;    /* lists: offsetof the int that counts the entries */
};

/* The table's rows, in print order; *ret_n gets their count. */
const struct opt *daemon_config_options(size_t *ret_n);
/* The row of a key, or NULL. */
const struct opt *daemon_config_opt_find(const char *name);
/* Parse `v` into o's field of c, as daemon_config_set does (append: a
 * `listen` line adds a URL instead of replacing the list). 0 or -EINVAL. */
int daemon_config_opt_set(struct daemon_config *c, const struct opt *o, const char *v,
                          bool append, struct cm_err *err);
/* A list's entries and their count in c. */
char (*daemon_config_list(const struct daemon_config *c, const struct opt *o, int *ret_n))[512];
/* Whether a and b hold the same value in o's field. */
bool daemon_config_opt_equal(const struct daemon_config *a, const struct daemon_config *b,
                             const struct opt *o);

#endif
