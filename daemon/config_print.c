/* daemon/config_print.c: the configuration as a file (--print-config) and
 * as the Markdown reference of docs/configuration.md (--print-config-doc),
 * both from config.c's table. */
#include "daemon/config_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- printing ----------------------------------------------------------- */

/* Does the text need quotes to come back unchanged through split_line? */
static bool needs_quotes(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || s[0] == '"' || isspace((unsigned char)s[0]) ||
	    isspace((unsigned char)s[n - 1]))
		return true;
	for (size_t i = 1; i < n; i++)
		if (s[i] == '#' && isspace((unsigned char)s[i - 1]))
			return true;
	return false;
}

static void print_text(FILE *f, const char *s)
{
	if (!needs_quotes(s)) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

/* The value of a scalar option as text, the way the file spells it. */
static void format_value(const struct daemon_config *c, const struct opt *o, char *buf, size_t len)
{
	const void *p = (const char *)c + o->off;

	switch (o->type) {
	case OPT_STRING:
		snprintf(buf, len, "%s", (const char *)p);
		break;
	case OPT_INT:
		if (o->keep && *(const int *)p == o->keep)
			snprintf(buf, len, "keep");
		else
			snprintf(buf, len, "%d", *(const int *)p);
		break;
	case OPT_UINT:
		snprintf(buf, len, "%u", (unsigned)*(const uint32_t *)p);
		break;
	case OPT_OCTAL:
		snprintf(buf, len, "%04o", (unsigned)*(const uint32_t *)p);
		break;
	case OPT_BOOL:
		snprintf(buf, len, "%s", *(const bool *)p ? "yes" : "no");
		break;
	case OPT_DOUBLE:
		/* %.17g round-trips every double; %g first for the common case. */
		snprintf(buf, len, "%g", *(const double *)p);
		if (strtod(buf, NULL) != *(const double *)p)
			snprintf(buf, len, "%.17g", *(const double *)p);
		break;
	case OPT_LIST: {
		int n;
		char(*list)[512] = daemon_config_list(c, o, &n);
		buf[0] = '\0';
		for (int i = 0; i < n; i++) {
			size_t used = strlen(buf);
			snprintf(buf + used, len - used, "%s%s", i ? " " : "", list[i]);
		}
		break;
	}
	}
}


static const char *type_name(const struct opt *o)
{
	switch (o->type) {
	case OPT_STRING:
		return o->choices ? "choice" : "string";
	case OPT_INT:
		return "integer";
	case OPT_UINT:
		return "unsigned";
	case OPT_BOOL:
		return "boolean";
	case OPT_DOUBLE:
		return "number";
	case OPT_OCTAL:
		return "octal";
	case OPT_LIST:
		return "list";
	}
	return "?";
}

/* Markdown cell text: '|' escaped, nothing else touched. */
static void md_cell(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			fputc('\\', f);
		fputc(*s, f);
	}
}

static void print_doc(FILE *f, const struct daemon_config *def)
{
	char buf[DAEMON_MAX_LISTEN * 520];

	fputs("| key | type | default | range | reloadable | description |\n", f);
	fputs("|---|---|---|---|---|---|\n", f);
	size_t n_opts;
	const struct opt *options = daemon_config_options(&n_opts);
	for (size_t i = 0; i < n_opts; i++) {
		const struct opt *o = &options[i];
		char range[96] = "";

		if (o->flags & CONFIG_HIDDEN)
			continue;
		format_value(def, o, buf, sizeof(buf));
		switch (o->type) {
		case OPT_INT:
		case OPT_UINT:
		case OPT_DOUBLE:
			snprintf(range, sizeof(range), "%.15g..%.15g%s", o->min, o->max,
			         o->keep ? ", keep" : "");
			break;
		case OPT_OCTAL:
			snprintf(range, sizeof(range), "%04o..%04o", (unsigned)o->min,
			         (unsigned)o->max);
			break;
		case OPT_BOOL:
			snprintf(range, sizeof(range), "yes, no");
			break;
		case OPT_STRING:
			for (const char *p = o->choices, *bar; p && *p; p = bar ? bar + 1 : NULL) {
				size_t used = strlen(range);
				bar = strchr(p, '|');
				snprintf(range + used, sizeof(range) - used, "%s%.*s",
				         used ? ", " : "", (int)(bar ? bar - p : (long)strlen(p)),
				         p);
			}
			break;
		case OPT_LIST:
			snprintf(range, sizeof(range), "%d..%d entries", o->def[0] ? 1 : 0,
				 DAEMON_MAX_LISTEN);
			break;
		}
		fprintf(f, "| `%s` | %s | ", o->name, type_name(o));
		if (buf[0]) {
			fputc('`', f);
			md_cell(f, buf);
			fputc('`', f);
		} else {
			fputs("\"\"", f);
		}
		fputs(" | ", f);
		md_cell(f, range);
		fprintf(f, " | %s | ", o->flags & CONFIG_RELOADABLE ? "yes" : "no");
		md_cell(f, o->help);
		fputs(" |\n", f);
	}
}

void daemon_config_print(FILE *f, const struct daemon_config *c, bool doc)
{
	struct daemon_config def;
	char buf[DAEMON_MAX_LISTEN * 520];
	char dbuf[DAEMON_MAX_LISTEN * 520];

	daemon_config_default(&def);
	if (doc) {
		print_doc(f, &def);
		return;
	}
	fprintf(f, "# edgelmd configuration (edgelmd --print-config): `key value` lines,\n"
	           "# loadable again with --config. Reloadable keys (SIGHUP) are marked.\n");
	size_t n_opts;
	const struct opt *options = daemon_config_options(&n_opts);
	for (size_t i = 0; i < n_opts; i++) {
		const struct opt *o = &options[i];
		bool same = daemon_config_opt_equal(c, &def, o);

		/* Test-only keys appear only when set. */
		if ((o->flags & CONFIG_HIDDEN) && same)
			continue;
		if (o->section)
			fprintf(f, "\n# ---- %s\n", o->section);
		fprintf(f, "# %s%s\n", o->help,
		        o->flags & CONFIG_RELOADABLE ? " [reloadable]" : "");
		if (same)
			dbuf[0] = '\0';
		else
			format_value(&def, o, dbuf, sizeof(dbuf));
		if (o->type == OPT_LIST) {
			int n;
			char(*list)[512] = daemon_config_list(c, o, &n);
			for (int j = 0; j < n; j++) {
				fprintf(f, "%s ", o->name);
				print_text(f, list[j]);
				fputc('\n', f);
			}
			if (n == 0)
				fprintf(f, "%s \"\"\n", o->name);
			if (!same)
				fprintf(f, "# default: %s %s\n", o->name, dbuf);
			continue;
		}
		format_value(c, o, buf, sizeof(buf));
		fprintf(f, "%s ", o->name);
		print_text(f, buf);
		if (!same) {
			fputs("  # default: ", f);
			fputs(dbuf[0] ? dbuf : "\"\"", f);
		}
		fputc('\n', f);
	}
}

