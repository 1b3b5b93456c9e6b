/* tools/edgelm-gguf.c: inspect GGUF files.
 *
 *   edgelm-gguf [info] [--json] FILE
 *   edgelm-gguf mkmodel --shape NAME -o OUT.gguf [...]   (tools/lib/mkmodel.c)
 *
 * prints the header, every metadata key (arrays: element type, count and the
 * first few elements; long strings truncated), the tensor table and totals
 * per tensor type. Exit status: 0 ok, 1 usage error, 2 bad input file (one
 * line "edgelm-gguf: <reason>" on stderr).
 *
 * Subcommands are dispatched from one table (`cmds`); a bare FILE means
 * `info FILE`. */
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tools/lib/tools.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "edgelm-gguf"

enum { EXIT_USAGE = 1, EXIT_BADFILE = 2 };

/* How much of a value to show. */
#define STR_SHOW 64     /* bytes of a string */
#define ARR_SHOW 8      /* elements of an array */
#define ARR_STR_SHOW 24 /* bytes of each string inside an array */

struct cmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *args;
	const char *help;
};

static int cmd_info(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const struct cmd cmds[] = {
    {"info", cmd_info, "[--json] FILE", "print header, metadata, tensors and totals"},
    {"mkmodel", tools_mkmodel_main, "--shape NAME -o OUT [--type T] [--vocab FILE] ...",
     "write a synthetic model of a real shape (see 'mkmodel --help')"},
    {"help", cmd_help, "", "this text"},
};

static void usage(FILE *o)
{
	fprintf(o, "usage: " PROG " [--json] FILE\n");
	for (size_t i = 0; i < CM_ARRAY_LEN(cmds); i++)
		fprintf(o, "       " PROG " %s %s\n", cmds[i].name, cmds[i].args);
	fprintf(o, "\n");
	for (size_t i = 0; i < CM_ARRAY_LEN(cmds); i++)
		fprintf(o, "  %-8s %s\n", cmds[i].name, cmds[i].help);
	fprintf(o, "\nExit status: 0 ok, 1 usage error, 2 bad input file.\n");
}

static int cmd_help(int argc, char **argv)
{
	usage(stdout);
	return 0;
}

/* ---- value printing ----------------------------------------------------------- */

/* Length of a valid UTF-8 sequence at p (at most n bytes), 0 if invalid. */
static size_t utf8_len(const uint8_t *p, size_t n)
{
	size_t len;
	uint32_t cp;
	if (p[0] < 0x80)
		return 1;
	if ((p[0] & 0xe0) == 0xc0) {
		len = 2;
		cp = p[0] & 0x1f;
	} else if ((p[0] & 0xf0) == 0xe0) {
		len = 3;
		cp = p[0] & 0x0f;
	} else if ((p[0] & 0xf8) == 0xf0) {
		len = 4;
		cp = p[0] & 0x07;
	} else {
		return 0;
	}
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

/* Print a string quoted, at most `max` bytes of it (0: all). Control
 * characters, quotes and backslashes are escaped; valid UTF-8 is kept;
 * invalid bytes are \xNN in text and U+FFFD in JSON. */
static void put_str(const char *s, uint64_t len, uint64_t max, bool json)
{
	const uint8_t *p = (const uint8_t *)s;
	uint64_t n = max && len > max ? max : len;
	putchar('"');
	for (uint64_t i = 0; i < n;) {
		uint8_t c = p[i];
		if (c == '"' || c == '\\') {
			printf("\\%c", c);
			i++;
		} else if (c == '\n') {
			fputs("\\n", stdout);
			i++;
		} else if (c == '\t') {
			fputs("\\t", stdout);
			i++;
		} else if (c < 0x20 || c == 0x7f) {
			printf(json ? "\\u%04x" : "\\x%02x", c);
			i++;
		} else {
			size_t l = utf8_len(p + i, (size_t)(n - i));
			if (l) {
				fwrite(p + i, 1, l, stdout);
				i += l;
			} else {
				if (json)
					fputs("\\ufffd", stdout);
				else
					printf("\\x%02x", c);
				i++;
			}
		}
	}
	putchar('"');
	if (n < len && !json)
		printf("...(%" PRIu64 " bytes)", len);
}

static void put_double(double d, bool json, bool f32)
{
	if (json && !isfinite(d))
		fputs("null", stdout);
	else
		printf(f32 ? "%.9g" : "%.17g", d);
}

/* One element of a fixed-size type at p (little-endian, unaligned). */
static void put_elem(enum gguf_vtype t, const uint8_t *p, bool json)
{
	uint64_t u = 0;
	size_t sz = gguf_vtype_size(t);
	for (size_t i = 0; i < sz; i++)
		u |= (uint64_t)p[i] << (8 * i);
	switch (t) {
	case GGUF_TYPE_UINT8:
	case GGUF_TYPE_UINT16:
	case GGUF_TYPE_UINT32:
	case GGUF_TYPE_UINT64:
		printf("%" PRIu64, u);
		break;
	case GGUF_TYPE_INT8:
		printf("%d", (int8_t)u);
		break;
	case GGUF_TYPE_INT16:
		printf("%d", (int16_t)u);
		break;
	case GGUF_TYPE_INT32:
		printf("%" PRId32, (int32_t)u);
		break;
	case GGUF_TYPE_INT64:
		printf("%" PRId64, (int64_t)u);
		break;
	case GGUF_TYPE_BOOL:
		fputs(u ? "true" : "false", stdout);
		break;
	case GGUF_TYPE_FLOAT32: {
		uint32_t b = (uint32_t)u;
		float f;
		memcpy(&f, &b, 4);
		put_double(f, json, true);
		break;
	}
	case GGUF_TYPE_FLOAT64: {
		double d;
		memcpy(&d, &u, 8);
		put_double(d, json, false);
		break;
	}
	default:
		fputs(json ? "null" : "?", stdout);
		break;
	}
}

static void put_scalar(const struct gguf_kv *kv, bool json)
{
	if (kv->type == GGUF_TYPE_STRING)
		put_str(kv->v.str.ptr, kv->v.str.len, json ? 0 : STR_SHOW, json);
	else
		put_elem(kv->type, kv->data, json);
}

/* The first ARR_SHOW elements of an array, as "[a, b, ...]". */
static void put_array_head(const struct gguf_kv *kv, bool json)
{
	const uint8_t *p = kv->data;
	uint64_t n = kv->arr_n < ARR_SHOW ? kv->arr_n : ARR_SHOW;
	putchar('[');
	for (uint64_t i = 0; i < n; i++) {
		if (i)
			fputs(", ", stdout);
		if (kv->arr_type == GGUF_TYPE_STRING) {
			uint64_t len;
			memcpy(&len, p, 8); /* validated by gguf_open, little-endian host */
			put_str((const char *)p + 8, len, json ? 0 : ARR_STR_SHOW, json);
			p += 8 + len;
		} else {
			put_elem(kv->arr_type, p, json);
			p += gguf_vtype_size(kv->arr_type);
		}
	}
	if (n < kv->arr_n && !json)
		fputs(", ...", stdout);
	putchar(']');
}

/* ---- info ------------------------------------------------------------------------ */

struct type_total {
	uint64_t tensors, elements, bytes;
};

static uint64_t n_elements(const struct gguf_tensor *t)
{
	return (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
}

static void dims_str(const struct gguf_tensor *t, char *buf, size_t size)
{
	size_t o = (size_t)snprintf(buf, size, "[");
	for (uint32_t d = 0; d < t->n_dims && o < size; d++)
		o += (size_t)snprintf(buf + o, size - o, "%s%" PRId64, d ? ", " : "", t->ne[d]);
	if (o < size)
		snprintf(buf + o, size - o, "]");
}

/* A key or tensor name, unquoted, at most `max` bytes of it. Names may hold
 * any byte, so control bytes, backslashes and non-ASCII bytes are escaped
 * (keys are ASCII by the spec). Returns the columns used. */
static int put_name(const char *name, uint64_t len, uint64_t max)
{
	int w = 0;
	const unsigned char *c = (const unsigned char *)name;
	for (uint64_t i = 0; i < len && i < max; i++) {
		if (c[i] < 0x20 || c[i] >= 0x7f || c[i] == '\\') {
			w += printf("\\x%02x", c[i]);
		} else {
			putchar(c[i]);
			w++;
		}
	}
	if (len > max)
		w += printf("...");
	return w;
}

static void info_text(const char *path, const struct gguf_file *f, const struct type_total *tot)
{
	printf("%s:\n", path);
	printf("  version:      %" PRIu32 "\n", f->version);
	printf("  alignment:    %" PRIu32 "\n", f->alignment);
	printf("  data offset:  %" PRIu64 "\n", f->data_start);
	printf("  file size:    %zu\n", f->size);
	printf("  kv count:     %" PRIu64 "\n", f->n_kv);
	printf("  tensor count: %" PRIu64 "\n", f->n_tensors);

	printf("\nmetadata:\n");
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		fputs("  ", stdout);
		int w = put_name(kv->key.ptr, kv->key.len, STR_SHOW);
		printf("%*s", w < 42 ? 42 - w : 1, "");
		if (kv->type == GGUF_TYPE_ARRAY) {
			char t[40];
			snprintf(t, sizeof(t), "%s[%" PRIu64 "]", gguf_vtype_name(kv->arr_type),
			         kv->arr_n);
			printf("%-16s ", t);
			put_array_head(kv, false);
		} else {
			printf("%-16s ", gguf_vtype_name(kv->type));
			put_scalar(kv, false);
		}
		putchar('\n');
	}

	printf("\ntensors:\n");
	if (f->n_tensors)
		printf("  %5s  %-40s %-8s %-24s %12s %12s\n", "#", "name", "type", "dims", "offset",
		       "bytes");
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		char dims[128];
		dims_str(t, dims, sizeof(dims));
		printf("  %5" PRIu64 "  ", i);
		int w = put_name(t->name, strlen(t->name), GGUF_MAX_NAME);
		printf("%*s %-8s %-24s %12" PRIu64 " %12" PRIu64 "\n", w < 40 ? 40 - w : 0, "",
		       quant_dtype_name(t->type), dims, t->offset, t->nbytes);
	}

	printf("\ntotals:\n");
	uint64_t all_t = 0, all_e = 0, all_b = 0;
	for (uint32_t ty = 0; ty < ENGINE_DTYPE_COUNT; ty++) {
		if (!tot[ty].tensors)
			continue;
		printf("  %-8s %8" PRIu64 " tensors %16" PRIu64 " elements %16" PRIu64 " bytes\n",
		       quant_dtype_name(ty), tot[ty].tensors, tot[ty].elements, tot[ty].bytes);
		all_t += tot[ty].tensors;
		all_e += tot[ty].elements;
		all_b += tot[ty].bytes;
	}
	printf("  %-8s %8" PRIu64 " tensors %16" PRIu64 " elements %16" PRIu64 " bytes\n", "all",
	       all_t, all_e, all_b);
}

static void info_json(const char *path, const struct gguf_file *f, const struct type_total *tot)
{
	fputs("{\"file\": ", stdout);
	put_str(path, strlen(path), 0, true);
	printf(", \"version\": %" PRIu32 ", \"alignment\": %" PRIu32 ", \"data_offset\": %" PRIu64
	       ", \"size\": %zu,\n \"metadata\": [",
	       f->version, f->alignment, f->data_start, f->size);
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", stdout);
		put_str(kv->key.ptr, kv->key.len, 0, true);
		printf(", \"type\": \"%s\"", gguf_vtype_name(kv->type));
		if (kv->type == GGUF_TYPE_ARRAY) {
			printf(", \"elem_type\": \"%s\", \"count\": %" PRIu64 ", \"head\": ",
			       gguf_vtype_name(kv->arr_type), kv->arr_n);
			put_array_head(kv, true);
		} else {
			fputs(", \"value\": ", stdout);
			put_scalar(kv, true);
		}
		putchar('}');
	}
	fputs("],\n \"tensors\": [", stdout);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", stdout);
		put_str(t->name, strlen(t->name), 0, true);
		printf(", \"type\": \"%s\", \"dims\": [", quant_dtype_name(t->type));
		for (uint32_t d = 0; d < t->n_dims; d++)
			printf("%s%" PRId64, d ? ", " : "", t->ne[d]);
		printf("], \"offset\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", t->offset, t->nbytes);
	}
	fputs("],\n \"totals\": {", stdout);
	bool first = true;
	for (uint32_t ty = 0; ty < ENGINE_DTYPE_COUNT; ty++) {
		if (!tot[ty].tensors)
			continue;
		printf("%s\"%s\": {\"tensors\": %" PRIu64 ", \"elements\": %" PRIu64
		       ", \"bytes\": %" PRIu64 "}",
		       first ? "" : ", ", quant_dtype_name(ty), tot[ty].tensors, tot[ty].elements,
		       tot[ty].bytes);
		first = false;
	}
	fputs("}}\n", stdout);
}

static int cmd_info(int argc, char **argv)
{
	bool json = false;
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--") && i + 1 < argc && !path) {
			path = argv[++i];
		} else if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, PROG ": unknown option '%s'\n", argv[i]);
			usage(stderr);
			return EXIT_USAGE;
		} else if (!path) {
			path = argv[i];
		} else {
			fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[i]);
			return EXIT_USAGE;
		}
	}
	if (!path) {
		fprintf(stderr, PROG ": missing FILE\n");
		usage(stderr);
		return EXIT_USAGE;
	}

	struct gguf_file *f = NULL;
	struct cm_err err = {0};
	if (gguf_open(path, &f, &err) != 0) {
		fprintf(stderr, PROG ": %s\n", err.msg);
		return EXIT_BADFILE;
	}
	struct type_total tot[ENGINE_DTYPE_COUNT] = {{0}};
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		if (t->type < ENGINE_DTYPE_COUNT) { /* always: gguf_open checked it */
			tot[t->type].tensors++;
			tot[t->type].elements += n_elements(t);
			tot[t->type].bytes += t->nbytes;
		}
	}
	if (json)
		info_json(path, f, tot);
	else
		info_text(path, f, tot);
	gguf_close(f);
	if (fflush(stdout) != 0 || ferror(stdout)) { /* not the input's fault: not 2 */
		fprintf(stderr, PROG ": error writing output\n");
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))
		return cmd_help(argc - 1, argv + 1);
	for (size_t i = 0; i < CM_ARRAY_LEN(cmds); i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	/* `edgelm-gguf [--json] FILE`: info, with argv[0] standing in for the
	 * subcommand name. */
	return cmd_info(argc, argv);
}
