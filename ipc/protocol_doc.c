/* ipc/protocol_doc.c: the request field table as the per-op field tables of
 * docs/protocol.md.
 *
 * docs/protocol.md marks each generated section:
 *
 *   <!-- generated: fields of generate (make docs) -->
 *   ... replaced ...
 *   <!-- end generated -->
 *
 * (`fields of chat beyond generate` lists only what chat adds and names the
 * rest). `make docs` pipes the file through ipc_protocol_doc_update (the
 * hidden `--doc` mode of tests/unit/test_ipc_protocol), and
 * tests/integration/protocol_doc.sh fails when the committed file differs
 * from its regeneration. Not part of libedgelm (ipc/module.mk). */
#include "ipc/protocol_impl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define BEGIN_MARK "<!-- generated: fields of "
#define END_MARK "<!-- end generated -->"

/* A cell: '|' escaped, so code spans such as "a"|"b" stay in their cell. */
static void md_cell(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			fputc('\\', out);
		fputc(*s, out);
	}
}

static const char *type_doc(const struct ipc_field *f)
{
	switch (f->type) {
	case IPC_FT_INT:
		return "integer";
	case IPC_FT_NUM:
		return "number";
	case IPC_FT_BOOL:
		return "boolean";
	case IPC_FT_TEXT:
		return "string";
	case IPC_FT_CUSTOM:
		return f->kind->json_type;
	case IPC_FT_ENVELOPE:
		break;
	}
	return "";
}

static void default_doc(const struct ipc_field *f, char *buf, size_t cap)
{
	const char *note = f->def_doc;
	if (f->flags & IPC_F_REQUIRED) {
		snprintf(buf, cap, "required");
		return;
	}
	if (note && note[0] != '(') {
		snprintf(buf, cap, "%s", note);
		return;
	}
	switch (f->type) {
	case IPC_FT_INT:
		snprintf(buf, cap, "%lld", (long long)f->def);
		break;
	case IPC_FT_NUM:
		snprintf(buf, cap, "%g", f->def);
		break;
	case IPC_FT_BOOL:
		snprintf(buf, cap, "%s", f->def != 0 ? "true" : "false");
		break;
	default:
		snprintf(buf, cap, "none");
		break;
	}
	if (note) {
		size_t used = strlen(buf);
		snprintf(buf + used, cap - used, " %s", note);
	}
}

static void int_doc(long long x, char *buf, size_t cap)
{
	if (x == LLONG_MAX)
		snprintf(buf, cap, "2^63-1");
	else if (x == INT32_MAX)
		snprintf(buf, cap, "2^31-1");
	else
		snprintf(buf, cap, "%lld", x);
}

/* The range under the default limits (the daemon may set others). */
static void range_doc(const struct ipc_field *f, char *buf, size_t cap)
{
	struct ipc_limits lim = {0};
	char lo[32], hi[32];
	ipc_limits_fill(&lim);
	buf[0] = '\0';
	switch (f->type) {
	case IPC_FT_INT:
		int_doc(f->min, lo, sizeof(lo));
		int_doc(ipc_field_max(f, &lim), hi, sizeof(hi));
		snprintf(buf, cap, "%s .. %s", lo, hi);
		break;
	case IPC_FT_NUM:
		snprintf(buf, cap, "%s%g .. %g", (f->flags & IPC_F_MIN_OPEN) ? "> " : "",
		         (double)f->fmin, (double)f->fmax);
		break;
	case IPC_FT_TEXT:
		snprintf(buf, cap, "≤ %s as JSON (see [Limits](#limits))",
		         ipc_doc_bytes(ipc_field_text_max(f, &lim), lo, sizeof(lo)));
		break;
	case IPC_FT_CUSTOM:
		f->kind->range_doc(&lim, buf, cap);
		break;
	case IPC_FT_BOOL:
	case IPC_FT_ENVELOPE:
		break;
	}
}

static void row_doc(FILE *out, const struct ipc_field *f)
{
	char def[160], range[160];
	default_doc(f, def, sizeof(def));
	range_doc(f, range, sizeof(range));
	fprintf(out, "| `%s` | ", f->name);
	md_cell(out, type_doc(f));
	fputs(" | ", out);
	md_cell(out, def);
	fputs(" | ", out);
	md_cell(out, range);
	fputs(" | ", out);
	md_cell(out, f->doc ? f->doc : "");
	fputs(" |\n", out);
}

void ipc_fields_doc(FILE *out, enum ipc_op op, enum ipc_op beyond)
{
	size_t rows = 0;
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		if (f->type == IPC_FT_ENVELOPE || !ipc_field_accepts(f, op) ||
		    (beyond != IPC_OP_NONE && ipc_field_accepts(f, beyond)))
			continue;
		if (rows++ == 0)
			fputs("| field | type | default | range | |\n|---|---|---|---|---|\n", out);
		row_doc(out, f);
	}
	if (beyond != IPC_OP_NONE) {
		if (rows++ == 0)
			fputs("| field | type | default | range | |\n|---|---|---|---|---|\n", out);
		fprintf(out, "| all fields of `%s`", ipc_op_name(beyond));
		const char *sep = " except ";
		for (size_t i = 0; i < ipc_n_fields; i++) {
			const struct ipc_field *f = &ipc_fields[i];
			if (f->type != IPC_FT_ENVELOPE && ipc_field_accepts(f, beyond) &&
			    !ipc_field_accepts(f, op)) {
				fprintf(out, "%s`%s`", sep, f->name);
				sep = ", ";
			}
		}
		fputs(" | | | | |\n", out);
	}
	if (rows == 0)
		fputs("No fields besides `v` and `op`.\n", out);
}

/* An op name at *p, advanced past it; IPC_OP_NONE when there is none. */
static enum ipc_op read_op(const char **p)
{
	size_t n = strspn(*p, "abcdefghijklmnopqrstuvwxyz_");
	int op = ipc_op_index(*p, n);
	*p += n;
	return op > 0 ? (enum ipc_op)op : IPC_OP_NONE;
}

/* `<!-- generated: fields of OP [beyond OP2] ... -->` */
static int parse_marker(const char *line, size_t lineno, enum ipc_op *ret_op,
                        enum ipc_op *ret_beyond, struct cm_err *err)
{
	const char *p = line + strlen(BEGIN_MARK);
	*ret_op = read_op(&p);
	*ret_beyond = IPC_OP_NONE;
	if (*ret_op != IPC_OP_NONE && strncmp(p, " beyond ", 8) == 0) {
		p += 8;
		*ret_beyond = read_op(&p);
		if (*ret_beyond == IPC_OP_NONE)
			*ret_op = IPC_OP_NONE;
	}
	if (*ret_op == IPC_OP_NONE || !strstr(p, "-->"))
		return cm_err_set(err, -EINVAL,
		                  "line %zu: a generated section that names no op: %s", lineno,
		                  line);
	return 0;
}

int ipc_protocol_doc_update(FILE *in, FILE *out, struct cm_err *err)
{
	char *line = NULL;
	size_t cap = 0, lineno = 0, open_at = 0;
	ssize_t n;
	int rc = 0;
	while (!rc && (n = getline(&line, &cap, in)) >= 0) {
		lineno++;
		if (open_at) {
			if (strncmp(line, END_MARK, strlen(END_MARK)) == 0) {
				fputs(line, out);
				open_at = 0;
			} else if (strncmp(line, BEGIN_MARK, strlen(BEGIN_MARK)) == 0) {
				rc = cm_err_set(err, -EINVAL,
				                "line %zu: section of line %zu not closed", lineno,
				                open_at);
			}
			continue; /* the old body */
		}
		fputs(line, out);
		if (strncmp(line, BEGIN_MARK, strlen(BEGIN_MARK)) != 0)
			continue;
		enum ipc_op op, beyond;
		line[strcspn(line, "\n")] = '\0';
		rc = parse_marker(line, lineno, &op, &beyond, err);
		if (rc)
			break;
		fputc('\n', out);
		ipc_fields_doc(out, op, beyond);
		fputc('\n', out);
		open_at = lineno;
	}
	free(line);
	if (!rc && open_at)
		rc = cm_err_set(err, -EINVAL, "section of line %zu not closed (%s)", open_at,
		                END_MARK);
	if (!rc && (ferror(in) || ferror(out)))
		rc = cm_err_set(err, -EIO, "read or write error");
	return rc;
}
