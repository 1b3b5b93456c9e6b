/* engine/grammar.c: GBNF grammars (llama.cpp's format, docs/grammar.md)
 * compiled into a pushdown recognizer over Unicode code points, for
 * constrained sampling (docs/engine.md, "Constrained sampling").
 *
 * The compiled form is llama.cpp's: every rule is a flat run of elements,
 * alternatives separated by ALT and ended by END; a character class is a
 * CHAR or CHAR_NOT element followed by RNG_UPPER / CHAR_ALT elements; a
 * group or a repetition becomes a generated rule. A parse state is a set of
 * stacks of element positions whose tops are terminals (grammar_impl.h).
 *
 * For a vocabulary the compile also builds a byte trie of every token's
 * piece (nodes in preorder, so a subtree is a contiguous range and pruning
 * it is one jump). The allowed set of a step walks that trie once against
 * the state: a prefix the grammar refuses drops every token under it. */
#include "engine/grammar_impl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
	GEL_END,       /* end of a rule */
	GEL_ALT,       /* start of another alternative */
	GEL_REF,       /* value: rule id */
	GEL_CHAR,      /* value: code point; a class or a literal's character */
	GEL_CHAR_NOT,  /* a negated class's first character */
	GEL_RNG_UPPER, /* the previous character is the lower end of a range */
	GEL_CHAR_ALT,  /* another character of the class */
	GEL_ANY,       /* '.': any code point */
};

struct gel {
	uint32_t type, value;
};

/* Bounds that keep hostile grammars (the fuzz target) finite. */
#define MAX_RULES 65536
#define MAX_ELEMS (1u << 21)
#define MAX_REPEAT 100000
#define MAX_NEST 512       /* parentheses */
#define MAX_DEPTH 1024     /* stack entries: deeper parses are dropped */
#define EXPAND_BUDGET 20000 /* rule expansions per code point */
#define MAX_STACKS 65536   /* parses alive at once: more are dropped */
/* Longer pieces are never allowed: the trie walk recurses once per byte
 * of a piece, on whatever thread samples (real vocabularies stay under
 * a few hundred bytes). */
#define MAX_PIECE 1024

struct tnode {
	int32_t end; /* index after this node's subtree */
	int32_t tok; /* first token whose piece ends here, -1: none */
	uint8_t byte;
};

struct engine_grammar {
	struct gel *el;
	uint32_t n_el;
	uint32_t *rule_start;
	uint32_t n_rules, root;
	/* the vocabulary (tok != NULL at compile) */
	int32_t n_vocab;
	int32_t eos;
	uint8_t *tflag; /* TF_* per token */
	char *pieces;
	uint32_t *poff, *plen;
	struct tnode *trie; /* [0] is the root */
	int32_t n_trie;
	int32_t *tok_next; /* the next token in a trie node's list */
};

enum { TF_TEXT = 1, TF_EOG = 2 };

/* ---- parser ---------------------------------------------------------------- */

struct rule_b {
	char *name;
	struct gel *el;
	uint32_t n, cap;
	bool defined;
	size_t at; /* where it was defined (or first referenced) */
};

struct parser {
	const char *s, *p, *end;
	struct rule_b *rules;
	uint32_t n_rules, cap_rules;
	uint64_t n_elems;
	int depth;
	struct cm_err *err;
	int rc;
};

static void line_col(const struct parser *ps, size_t at, int *line, int *col)
{
	int l = 1, c = 1;
	for (size_t i = 0; i < at && ps->s + i < ps->end; i++) {
		if (ps->s[i] == '\n') {
			l++;
			c = 1;
		} else if (((unsigned char)ps->s[i] & 0xc0) != 0x80) {
			c++;
		}
	}
	*line = l;
	*col = c;
}

static int perr_at(struct parser *ps, const char *at, const char *fmt, ...) CM_PRINTF(3, 4);
static int perr_at(struct parser *ps, const char *at, const char *fmt, ...)
{
	if (ps->rc)
		return ps->rc;
	char msg[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int l, c;
	line_col(ps, (size_t)(at - ps->s), &l, &c);
	ps->rc = cm_err_set(ps->err, -EINVAL, "grammar: line %d, column %d: %s", l, c, msg);
	return ps->rc;
}

static int oom(struct parser *ps)
{
	if (!ps->rc)
		ps->rc = cm_err_set(ps->err, -ENOMEM, "grammar: out of memory");
	return ps->rc;
}

static bool is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

/* Spaces, tabs and comments; newlines too where newline_ok. */
static void skip_space(struct parser *ps, bool newline_ok)
{
	while (ps->p < ps->end) {
		char c = *ps->p;
		if (c == ' ' || c == '\t') {
			ps->p++;
		} else if (c == '#') {
			while (ps->p < ps->end && *ps->p != '\n')
				ps->p++;
		} else if (newline_ok && (c == '\n' || c == '\r')) {
			ps->p++;
		} else {
			break;
		}
	}
}

static int add_rule(struct parser *ps, const char *name, size_t n, size_t at)
{
	if (ps->n_rules >= MAX_RULES)
		return perr_at(ps, ps->s + at, "more than %d rules", MAX_RULES);
	if (ps->n_rules == ps->cap_rules) {
		uint32_t cap = ps->cap_rules ? ps->cap_rules * 2 : 32;
		struct rule_b *r = cm_realloc(ps->rules, cap * sizeof(*r));
		if (!r)
			return oom(ps);
		ps->rules = r;
		ps->cap_rules = cap;
	}
	struct rule_b *r = &ps->rules[ps->n_rules];
	memset(r, 0, sizeof(*r));
	r->name = cm_strndup(name, n);
	if (!r->name)
		return oom(ps);
	r->at = at;
	return (int)ps->n_rules++;
}

/* The id of the named rule, created (undefined) if new. */
static int symbol(struct parser *ps, const char *name, size_t n, size_t at)
{
	for (uint32_t i = 0; i < ps->n_rules; i++)
		if (strlen(ps->rules[i].name) == n && memcmp(ps->rules[i].name, name, n) == 0)
			return (int)i;
	return add_rule(ps, name, n, at);
}

/* A generated rule (a group or a repetition), named after its parent. */
static int gen_rule(struct parser *ps, uint32_t parent, size_t at)
{
	char name[160];
	/* a "/" no user rule name has: the two cannot collide */
	snprintf(name, sizeof(name), "%.100s/%u", ps->rules[parent].name, ps->n_rules);
	int id = add_rule(ps, name, strlen(name), at);
	if (id >= 0)
		ps->rules[id].defined = true;
	return id;
}

static int push(struct parser *ps, uint32_t rule, uint32_t type, uint32_t value)
{
	if (ps->rc)
		return ps->rc;
	struct rule_b *r = &ps->rules[rule];
	if (++ps->n_elems > MAX_ELEMS)
		return perr_at(ps, ps->p, "grammar too large (more than %u elements)", MAX_ELEMS);
	if (r->n == r->cap) {
		uint32_t cap = r->cap ? r->cap * 2 : 16;
		struct gel *e = cm_realloc(r->el, cap * sizeof(*e));
		if (!e)
			return oom(ps);
		r->el = e;
		r->cap = cap;
	}
	r->el[r->n++] = (struct gel){type, value};
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* One character of a literal or class: an escape or a UTF-8 sequence.
 * Returns the code point, or -1 after an error. */
static int32_t parse_char(struct parser *ps)
{
	const char *at = ps->p;
	unsigned char c = (unsigned char)*ps->p;
	if (c == '\\') {
		if (ps->p + 1 >= ps->end) {
			perr_at(ps, at, "unfinished escape at the end of the input");
			return -1;
		}
		char e = ps->p[1];
		ps->p += 2;
		int nhex = 0;
		switch (e) {
		case 'n': return '\n';
		case 't': return '\t';
		case 'r': return '\r';
		case '\\': return '\\';
		case '"': return '"';
		case '[': return '[';
		case ']': return ']';
		case 'x': nhex = 2; break;
		case 'u': nhex = 4; break;
		case 'U': nhex = 8; break;
		default:
			perr_at(ps, at, "bad escape '\\%c' (known: \\n \\t \\r \\\\ \\\" \\[ \\] "
			                "\\xXX \\uXXXX \\UXXXXXXXX)",
			        e >= 0x20 && e < 0x7f ? e : '?');
			return -1;
		}
		uint32_t v = 0;
		for (int i = 0; i < nhex; i++) {
			int h = ps->p < ps->end ? hexval(*ps->p) : -1;
			if (h < 0) {
				perr_at(ps, at, "bad escape: '\\%c' needs %d hex digits", e, nhex);
				return -1;
			}
			v = v << 4 | (uint32_t)h;
			ps->p++;
		}
		if (v > 0x10ffff) {
			perr_at(ps, at, "bad escape: U+%X is beyond U+10FFFF", v);
			return -1;
		}
		return (int32_t)v;
	}
	int need = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
	         : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
	if (need == 0 || ps->end - ps->p < need) {
		perr_at(ps, at, "invalid UTF-8");
		return -1;
	}
	uint32_t v = need == 1 ? c : c & (0x7f >> need);
	for (int i = 1; i < need; i++) {
		unsigned char b = (unsigned char)ps->p[i];
		if ((b & 0xc0) != 0x80) {
			perr_at(ps, at, "invalid UTF-8");
			return -1;
		}
		v = v << 6 | (b & 0x3f);
	}
	ps->p += need;
	return (int32_t)v;
}

static int parse_alternates(struct parser *ps, uint32_t rule, bool nested);

/* Repeat the elements [start, n) of `rule` min..max times (max < 0:
 * unbounded), as llama.cpp does: min copies, then a chain of generated
 * optional rules (or one right-recursive rule). */
static int repeat(struct parser *ps, uint32_t rule, uint32_t start, long min, long max,
                  const char *at)
{
	struct rule_b *r = &ps->rules[rule];
	uint32_t len = r->n - start;
	if (len == 0)
		return perr_at(ps, at, "nothing before '%c' to repeat", *at);
	struct gel *item = cm_malloc(len * sizeof(*item));
	if (!item)
		return oom(ps);
	memcpy(item, r->el + start, len * sizeof(*item));
	ps->rules[rule].n = start;
	ps->n_elems -= len;
	for (long i = 0; i < min && !ps->rc; i++)
		for (uint32_t k = 0; k < len; k++)
			push(ps, rule, item[k].type, item[k].value);
	long n_opt = max < 0 ? 1 : max - min;
	int last = -1;
	for (long i = 0; i < n_opt && !ps->rc; i++) {
		int id = gen_rule(ps, rule, (size_t)(at - ps->s));
		if (id < 0)
			break;
		for (uint32_t k = 0; k < len; k++)
			push(ps, (uint32_t)id, item[k].type, item[k].value);
		if (max < 0)
			push(ps, (uint32_t)id, GEL_REF, (uint32_t)id);
		else if (i > 0)
			push(ps, (uint32_t)id, GEL_REF, (uint32_t)last);
		push(ps, (uint32_t)id, GEL_ALT, 0);
		push(ps, (uint32_t)id, GEL_END, 0);
		last = id;
	}
	if (last >= 0)
		push(ps, rule, GEL_REF, (uint32_t)last);
	cm_free(item);
	return ps->rc;
}

static long parse_int(struct parser *ps)
{
	const char *at = ps->p;
	long v = 0;
	if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
		return -1;
	while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
		v = v * 10 + (*ps->p - '0');
		if (v > MAX_REPEAT) {
			perr_at(ps, at, "repetition count above %d", MAX_REPEAT);
			return -2;
		}
		ps->p++;
	}
	return v;
}

static int parse_sequence(struct parser *ps, uint32_t rule, bool nested)
{
	uint32_t last = ps->rules[rule].n;
	bool have_last = false;
	while (ps->p < ps->end && !ps->rc) {
		const char *at = ps->p;
		char c = *ps->p;
		if (c == '"') {
			ps->p++;
			last = ps->rules[rule].n;
			have_last = true;
			while (ps->p < ps->end && *ps->p != '"' && !ps->rc) {
				if (*ps->p == '\n')
					break;
				int32_t cp = parse_char(ps);
				if (cp >= 0)
					push(ps, rule, GEL_CHAR, (uint32_t)cp);
			}
			if (ps->rc)
				return ps->rc;
			if (ps->p >= ps->end || *ps->p != '"')
				return perr_at(ps, at, "unterminated string literal");
			ps->p++;
		} else if (c == '[') {
			ps->p++;
			last = ps->rules[rule].n;
			have_last = true;
			uint32_t first = GEL_CHAR;
			if (ps->p < ps->end && *ps->p == '^') {
				first = GEL_CHAR_NOT;
				ps->p++;
			}
			bool any = false;
			while (ps->p < ps->end && *ps->p != ']' && !ps->rc) {
				if (*ps->p == '\n')
					break;
				int32_t lo = parse_char(ps);
				if (lo < 0)
					return ps->rc;
				push(ps, rule, any ? GEL_CHAR_ALT : first, (uint32_t)lo);
				any = true;
				if (ps->end - ps->p >= 2 && *ps->p == '-' && ps->p[1] != ']') {
					ps->p++;
					const char *hat = ps->p;
					int32_t hi = parse_char(ps);
					if (hi < 0)
						return ps->rc;
					if (hi < lo)
						return perr_at(ps, hat, "range end U+%X before its start U+%X",
						               (unsigned)hi, (unsigned)lo);
					push(ps, rule, GEL_RNG_UPPER, (uint32_t)hi);
				}
			}
			if (ps->rc)
				return ps->rc;
			if (ps->p >= ps->end || *ps->p != ']')
				return perr_at(ps, at, "unterminated character class");
			if (!any)
				return perr_at(ps, at, "empty character class");
			ps->p++;
		} else if (is_name_char(c)) {
			const char *name = ps->p;
			while (ps->p < ps->end && is_name_char(*ps->p))
				ps->p++;
			int id = symbol(ps, name, (size_t)(ps->p - name), (size_t)(name - ps->s));
			if (id < 0)
				return ps->rc;
			last = ps->rules[rule].n;
			have_last = true;
			push(ps, rule, GEL_REF, (uint32_t)id);
		} else if (c == '(') {
			if (++ps->depth > MAX_NEST)
				return perr_at(ps, at, "parentheses nested deeper than %d", MAX_NEST);
			ps->p++;
			skip_space(ps, true);
			int id = gen_rule(ps, rule, (size_t)(at - ps->s));
			if (id < 0)
				return ps->rc;
			if (parse_alternates(ps, (uint32_t)id, true))
				return ps->rc;
			push(ps, (uint32_t)id, GEL_END, 0);
			if (ps->p >= ps->end || *ps->p != ')')
				return perr_at(ps, at, "'(' without its ')'");
			ps->p++;
			ps->depth--;
			last = ps->rules[rule].n;
			have_last = true;
			push(ps, rule, GEL_REF, (uint32_t)id);
		} else if (c == '.') {
			ps->p++;
			last = ps->rules[rule].n;
			have_last = true;
			push(ps, rule, GEL_ANY, 0);
		} else if (c == '*' || c == '+' || c == '?') {
			if (!have_last)
				return perr_at(ps, at, "nothing before '%c' to repeat", c);
			ps->p++;
			repeat(ps, rule, last, c == '+', c == '?' ? 1 : -1, at);
			have_last = false;
		} else if (c == '{') {
			if (!have_last)
				return perr_at(ps, at, "nothing before '{' to repeat");
			ps->p++;
			skip_space(ps, nested);
			long min = parse_int(ps), max;
			if (min == -2)
				return ps->rc;
			if (min < 0)
				return perr_at(ps, ps->p, "expected a number after '{'");
			skip_space(ps, nested);
			if (ps->p < ps->end && *ps->p == ',') {
				ps->p++;
				skip_space(ps, nested);
				if (ps->p < ps->end && *ps->p == '}') {
					max = -1;
				} else {
					max = parse_int(ps);
					if (max == -2)
						return ps->rc;
					if (max < 0)
						return perr_at(ps, ps->p, "expected a number or '}'");
					if (max < min)
						return perr_at(ps, at, "repetition {%ld,%ld}: max below min",
						               min, max);
				}
			} else {
				max = min;
			}
			skip_space(ps, nested);
			if (ps->p >= ps->end || *ps->p != '}')
				return perr_at(ps, at, "'{' without its '}'");
			ps->p++;
			repeat(ps, rule, last, min, max, at);
			have_last = false;
		} else {
			break;
		}
		skip_space(ps, nested);
	}
	return ps->rc;
}

static int parse_alternates(struct parser *ps, uint32_t rule, bool nested)
{
	for (;;) {
		if (parse_sequence(ps, rule, nested))
			return ps->rc;
		if (!nested) {
			/* a top-level rule may go on with a line that starts with '|' */
			const char *save = ps->p;
			skip_space(ps, true);
			if (ps->p >= ps->end || *ps->p != '|')
				ps->p = save;
		}
		if (ps->p >= ps->end || *ps->p != '|')
			return 0;
		push(ps, rule, GEL_ALT, 0);
		ps->p++;
		skip_space(ps, true);
	}
}

static int parse_rule(struct parser *ps)
{
	const char *name = ps->p;
	while (ps->p < ps->end && is_name_char(*ps->p))
		ps->p++;
	if (ps->p == name)
		return perr_at(ps, name, "expected a rule name");
	size_t n = (size_t)(ps->p - name);
	skip_space(ps, false);
	if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3) != 0)
		return perr_at(ps, ps->p, "expected '::=' after the rule name '%.*s'",
		               (int)CM_MIN(n, 60), name);
	ps->p += 3;
	skip_space(ps, true);
	int id = symbol(ps, name, n, (size_t)(name - ps->s));
	if (id < 0)
		return ps->rc;
	struct rule_b *r = &ps->rules[id];
	if (r->defined) {
		int l, c;
		line_col(ps, r->at, &l, &c);
		return perr_at(ps, name, "rule '%.*s' defined twice (first at line %d)",
		               (int)CM_MIN(n, 60), name, l);
	}
	r->defined = true;
	r->at = (size_t)(name - ps->s);
	if (parse_alternates(ps, (uint32_t)id, false))
		return ps->rc;
	push(ps, (uint32_t)id, GEL_END, 0);
	skip_space(ps, false);
	if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r') {
		if (*ps->p == ')')
			return perr_at(ps, ps->p, "')' without its '('");
		return perr_at(ps, ps->p, "unexpected '%c'",
		               (unsigned char)*ps->p >= 0x20 && (unsigned char)*ps->p < 0x7f ? *ps->p
		                                                                               : '?');
	}
	return ps->rc;
}

/* ---- checks: undefined rules, left recursion --------------------------------- */

static bool end_of_seq(const struct gel *e)
{
	return e->type == GEL_END || e->type == GEL_ALT;
}

/* A rule that can match the empty string. */
static void find_nullable(const engine_grammar *g, bool *nullable)
{
	bool changed = true;
	while (changed) {
		changed = false;
		for (uint32_t r = 0; r < g->n_rules; r++) {
			if (nullable[r])
				continue;
			const struct gel *e = g->el + g->rule_start[r];
			bool alt_ok = true;
			for (;; e++) {
				if (end_of_seq(e)) {
					if (alt_ok) {
						nullable[r] = changed = true;
						break;
					}
					if (e->type == GEL_END)
						break;
					alt_ok = true;
				} else if (e->type != GEL_REF || !nullable[e->value]) {
					alt_ok = false;
				}
			}
		}
	}
}

/* Rules a rule can reach without consuming input: a cycle there would make
 * the recognizer expand forever. Returns a rule on a cycle, -1 if none,
 * -2 when out of memory. An iterative DFS: frames of (rule, next element,
 * still at the left edge of the alternative). */
static int find_left_cycle(const engine_grammar *g, const bool *nullable)
{
	uint32_t n = g->n_rules;
	uint8_t *color = cm_calloc(n, 1);
	uint32_t *stk = cm_malloc((size_t)n * 3 * sizeof(*stk));
	int found = -2;
	if (!color || !stk)
		goto out;
	found = -1;
	for (uint32_t s = 0; s < n && found < 0; s++) {
		if (color[s])
			continue;
		uint32_t sp = 0;
		stk[sp++] = s;
		stk[sp++] = g->rule_start[s];
		stk[sp++] = 1;
		color[s] = 1;
		while (sp && found < 0) {
			uint32_t r = stk[sp - 3], pos = stk[sp - 2], left = stk[sp - 1];
			const struct gel *e = &g->el[pos];
			if (e->type == GEL_END) {
				color[r] = 2;
				sp -= 3;
				continue;
			}
			stk[sp - 2] = pos + 1;
			if (e->type == GEL_ALT) {
				stk[sp - 1] = 1;
				continue;
			}
			if (e->type != GEL_REF || !nullable[e->value])
				stk[sp - 1] = 0;
			if (!left || e->type != GEL_REF)
				continue;
			uint32_t t = e->value;
			if (color[t] == 1) {
				found = (int)t;
			} else if (color[t] == 0) {
				color[t] = 1;
				stk[sp++] = t;
				stk[sp++] = g->rule_start[t];
				stk[sp++] = 1;
			}
		}
	}
out:
	cm_free(color);
	cm_free(stk);
	return found;
}

/* ---- vocabulary and trie --------------------------------------------------- */

static int cmp_piece(const void *a, const void *b, void *ud)
{
	const engine_grammar *g = ud;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	uint32_t lx = g->plen[x], ly = g->plen[y];
	int c = memcmp(g->pieces + g->poff[x], g->pieces + g->poff[y], CM_MIN(lx, ly));
	if (c)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

struct skey {
	uint64_t key; /* the piece's first 8 bytes, big-endian, zero-padded */
	int32_t id;
};

/* Sort token ids by piece bytes: an LSD radix sort on the first 8 bytes
 * (qsort's comparisons were 60 % of a 152k-token compile), then each run
 * of equal keys by the whole piece. The padded key orders as the bytes
 * do, so the result is lexicographic. */
static int sort_pieces(engine_grammar *g, int32_t *ids, int32_t n)
{
	struct skey *a = cm_malloc((size_t)n * sizeof(*a)), *b = cm_malloc((size_t)n * sizeof(*b));
	if (!a || !b) {
		cm_free(a);
		cm_free(b);
		return -ENOMEM;
	}
	for (int32_t i = 0; i < n; i++) {
		const uint8_t *p = (const uint8_t *)g->pieces + g->poff[ids[i]];
		uint32_t len = g->plen[ids[i]];
		uint64_t k = 0;
		for (uint32_t j = 0; j < 8; j++)
			k = k << 8 | (j < len ? p[j] : 0);
		a[i] = (struct skey){k, ids[i]};
	}
	for (int shift = 0; shift < 64; shift += 8) {
		size_t cnt[257] = {0};
		for (int32_t i = 0; i < n; i++)
			cnt[((a[i].key >> shift) & 0xff) + 1]++;
		if (cnt[((a[0].key >> shift) & 0xff) + 1] == (size_t)n)
			continue; /* every key has this byte: nothing to move */
		for (int k = 0; k < 256; k++)
			cnt[k + 1] += cnt[k];
		for (int32_t i = 0; i < n; i++)
			b[cnt[(a[i].key >> shift) & 0xff]++] = a[i];
		struct skey *t = a;
		a = b;
		b = t;
	}
	for (int32_t i = 0; i < n; i++)
		ids[i] = a[i].id;
	for (int32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && a[j].key == a[i].key; j++)
			;
		if (j - i > 1)
			qsort_r(ids + i, (size_t)(j - i), sizeof(*ids), cmp_piece, g);
	}
	cm_free(a);
	cm_free(b);
	return 0;
}

static int build_vocab(engine_grammar *g, const engine_tokenizer *tok, struct cm_err *err)
{
	int32_t n = engine_tokenizer_n_vocab(tok);
	int rc = -ENOMEM;
	int32_t *ids = NULL, *path = NULL;
	char *buf = NULL;
	size_t cap = 256, used = 0, pcap = 1 << 16;
	g->n_vocab = n;
	g->eos = engine_tokenizer_eos(tok);
	g->tflag = cm_calloc((size_t)n, 1);
	g->poff = cm_calloc((size_t)n, sizeof(*g->poff));
	g->plen = cm_calloc((size_t)n, sizeof(*g->plen));
	g->tok_next = cm_malloc((size_t)n * sizeof(*g->tok_next));
	g->pieces = cm_malloc(pcap);
	ids = cm_malloc((size_t)n * sizeof(*ids));
	buf = cm_malloc(cap);
	if (!g->tflag || !g->poff || !g->plen || !g->tok_next || !g->pieces || !ids || !buf)
		goto out;
	int32_t n_text = 0;
	uint32_t maxlen = 0;
	for (int32_t id = 0; id < n; id++) {
		g->tok_next[id] = -1;
		if (engine_tokenizer_is_eog(tok, id)) {
			g->tflag[id] = TF_EOG;
			continue;
		}
		/* control, unknown and unused tokens are never text */
		uint32_t attr = engine_tokenizer_attr(tok, id);
		if (attr & (ENGINE_TOKEN_CONTROL | ENGINE_TOKEN_UNKNOWN | ENGINE_TOKEN_UNUSED))
			continue;
		int k;
		while ((k = engine_token_to_piece(tok, id, false, buf, cap)) == -ENOBUFS &&
		       cap < MAX_PIECE) {
			char *nb = cm_realloc(buf, cap * 2);
			if (!nb)
				goto out;
			buf = nb;
			cap *= 2;
		}
		if (k <= 0)
			continue; /* empty (no progress) or past MAX_PIECE */
		if (used + (size_t)k > pcap) {
			while (used + (size_t)k > pcap)
				pcap *= 2;
			char *np = cm_realloc(g->pieces, pcap);
			if (!np)
				goto out;
			g->pieces = np;
		}
		if (used + (size_t)k > UINT32_MAX) {
			rc = cm_err_set(err, -E2BIG, "grammar: vocabulary text too large");
			goto out_set;
		}
		memcpy(g->pieces + used, buf, (size_t)k);
		g->poff[id] = (uint32_t)used;
		g->plen[id] = (uint32_t)k;
		used += (size_t)k;
		g->tflag[id] = TF_TEXT;
		ids[n_text++] = id;
		if ((uint32_t)k > maxlen)
			maxlen = (uint32_t)k;
	}
	if (n_text > 0 && sort_pieces(g, ids, n_text))
		goto out;

	/* Sorted pieces make a preorder trie: nodes on the current path stay
	 * open, a node's subtree ends when the next piece leaves its prefix. */
	size_t tcap = used + 1;
	g->trie = cm_malloc(tcap * sizeof(*g->trie));
	path = cm_malloc(((size_t)maxlen + 1) * sizeof(*path));
	if (!g->trie || !path)
		goto out;
	g->trie[0] = (struct tnode){0, -1, 0};
	int32_t nt = 1;
	uint32_t depth = 0;
	path[0] = 0;
	const char *prev = NULL;
	uint32_t prevlen = 0;
	for (int32_t i = 0; i < n_text; i++) {
		int32_t id = ids[i];
		const char *p = g->pieces + g->poff[id];
		uint32_t len = g->plen[id], common = 0;
		while (prev && common < len && common < prevlen && p[common] == prev[common])
			common++;
		while (depth > common)
			g->trie[path[depth--]].end = nt;
		for (; depth < len; depth++) {
			g->trie[nt] = (struct tnode){0, -1, (uint8_t)p[depth]};
			path[depth + 1] = nt++;
		}
		int32_t node = path[len];
		g->tok_next[id] = g->trie[node].tok;
		g->trie[node].tok = id;
		prev = p;
		prevlen = len;
	}
	while (depth > 0)
		g->trie[path[depth--]].end = nt;
	g->trie[0].end = nt;
	g->n_trie = nt;
	rc = 0;
	goto out_set;
out:
	rc = cm_err_set(err, -ENOMEM, "grammar: out of memory for the vocabulary");
out_set:
	cm_free(ids);
	cm_free(path);
	cm_free(buf);
	return rc;
}

/* ---- compile ------------------------------------------------------------------ */

void engine_grammar_free(engine_grammar *g)
{
	if (!g)
		return;
	cm_free(g->el);
	cm_free(g->rule_start);
	cm_free(g->tflag);
	cm_free(g->pieces);
	cm_free(g->poff);
	cm_free(g->plen);
	cm_free(g->trie);
	cm_free(g->tok_next);
	cm_free(g);
}

int engine_grammar_new(const engine_tokenizer *tok, const char *gbnf, size_t len,
                       engine_grammar **ret_g, struct cm_err *err)
{
	*ret_g = NULL;
	struct parser ps = {.s = gbnf, .p = gbnf, .end = gbnf + len, .err = err};
	engine_grammar *g = NULL;
	if (!gbnf && len)
		return cm_err_set(err, -EINVAL, "grammar: no text");
	skip_space(&ps, true);
	while (ps.p < ps.end && !ps.rc) {
		parse_rule(&ps);
		skip_space(&ps, true);
	}
	if (ps.rc)
		goto out;
	for (uint32_t i = 0; i < ps.n_rules; i++)
		if (!ps.rules[i].defined) {
			perr_at(&ps, ps.s + ps.rules[i].at, "undefined rule '%s'", ps.rules[i].name);
			goto out;
		}
	int root = -1;
	for (uint32_t i = 0; i < ps.n_rules; i++)
		if (strcmp(ps.rules[i].name, "root") == 0)
			root = (int)i;
	if (root < 0) {
		perr_at(&ps, ps.end, "no rule 'root' (the start symbol)");
		goto out;
	}

	g = cm_calloc(1, sizeof(*g));
	if (!g || !(g->rule_start = cm_malloc(ps.n_rules * sizeof(*g->rule_start))) ||
	    !(g->el = cm_malloc((ps.n_elems ? ps.n_elems : 1) * sizeof(*g->el)))) {
		oom(&ps);
		goto out;
	}
	g->n_rules = ps.n_rules;
	g->root = (uint32_t)root;
	for (uint32_t i = 0; i < ps.n_rules; i++) {
		g->rule_start[i] = g->n_el;
		memcpy(g->el + g->n_el, ps.rules[i].el, ps.rules[i].n * sizeof(*g->el));
		g->n_el += ps.rules[i].n;
	}
	bool *nullable = cm_calloc(g->n_rules, sizeof(*nullable));
	if (!nullable) {
		oom(&ps);
		goto out;
	}
	find_nullable(g, nullable);
	int cyc = find_left_cycle(g, nullable);
	cm_free(nullable);
	if (cyc == -2) {
		oom(&ps);
		goto out;
	}
	if (cyc >= 0) {
		perr_at(&ps, ps.s + ps.rules[cyc].at,
		        "rule '%s' can reach itself without consuming input (left recursion, "
		        "or a repetition of something that can be empty)",
		        ps.rules[cyc].name);
		goto out;
	}
	if (tok) {
		ps.rc = build_vocab(g, tok, err);
		if (ps.rc)
			goto out;
	}
out:
	for (uint32_t i = 0; i < ps.n_rules; i++) {
		cm_free(ps.rules[i].name);
		cm_free(ps.rules[i].el);
	}
	cm_free(ps.rules);
	if (ps.rc) {
		engine_grammar_free(g);
		return ps.rc;
	}
	*ret_g = g;
	return 0;
}

int grammar_n_vocab(const engine_grammar *g)
{
	return g->n_vocab;
}

int32_t grammar_fallback_token(const engine_grammar *g)
{
	return g->eos >= 0 && g->eos < g->n_vocab ? g->eos : 0;
}

/* ---- recognizer ------------------------------------------------------------------ */

struct srec {
	uint32_t off, len;
};

/* A growable store of stacks; a range of its records is one state. */
struct sset {
	int32_t *d;
	size_t nd, capd;
	struct srec *r;
	size_t nr, capr;
};

/* An unfinished UTF-8 sequence: its bits so far, the bytes still due and
 * its whole length. */
struct u8p {
	uint32_t value;
	int remain, len;
};

/* A state interned for the trie walk: its records in memo, and a hash of
 * their contents. */
struct mstate {
	uint32_t r0, r1;
	uint64_t hash;
};

/* A memoized transition: state `from`, moved by the code points that
 * move exactly the stacks in `sig`, gives state `to` (-1: none). */
struct mtrans {
	uint64_t sig;
	int32_t from, to;
};

struct grammar_state {
	const engine_grammar *g;
	struct sset cur, lv, todo;
	struct u8p part;
	bool oom;
	int32_t tmp[MAX_DEPTH + 2];
	long budget;
	/* the stacks of the state being built, by hash: slot k holds record
	 * dd[k] when dd_gen[k] is the current generation */
	uint32_t *dd, *dd_gen, gen;
	size_t dd_cap; /* a power of two, at least twice the state's stacks */
	/* the walk's memo, kept across steps until it grows too big */
	struct sset memo;
	struct mstate *ms;
	size_t n_ms, cap_ms;
	int32_t *ms_hash; /* open addressing: state ids by content hash, -1 empty */
	size_t ms_hash_cap;
	struct mtrans *tr; /* open addressing by (from, sig); from -1: empty */
	size_t n_tr, cap_tr;
	/* asc[id * 128 + c]: the state after ASCII c from state id (-1 none,
	 * -3 not known yet): most trie nodes are ASCII, and this makes them
	 * one load each */
	int32_t *asc;
};

static void sset_free(struct sset *s)
{
	cm_free(s->d);
	cm_free(s->r);
}

/* Append a stack of a[0..na) plus up to two more entries (-1: none). */
static bool sset_push(struct grammar_state *st, struct sset *s, const int32_t *a, size_t na,
                      int32_t x, int32_t y)
{
	size_t n = na + (x >= 0) + (y >= 0);
	if (s->nd + n > s->capd) {
		size_t cap = s->capd ? s->capd : 256;
		while (s->nd + n > cap)
			cap *= 2;
		int32_t *d = cm_realloc(s->d, cap * sizeof(*d));
		if (!d)
			return !(st->oom = true);
		s->d = d;
		s->capd = cap;
	}
	if (s->nr == s->capr) {
		size_t cap = s->capr ? s->capr * 2 : 64;
		struct srec *r = cm_realloc(s->r, cap * sizeof(*r));
		if (!r)
			return !(st->oom = true);
		s->r = r;
		s->capr = cap;
	}
	int32_t *o = s->d + s->nd;
	if (na)
		memcpy(o, a, na * sizeof(*a));
	if (x >= 0)
		o[na++] = x;
	if (y >= 0)
		o[na++] = y;
	s->r[s->nr++] = (struct srec){(uint32_t)s->nd, (uint32_t)n};
	s->nd += n;
	return true;
}

/* A new state starts being built: its dedupe table empties at once. */
static void new_gen(struct grammar_state *st)
{
	st->budget = EXPAND_BUDGET;
	if (++st->gen == 0) {
		memset(st->dd_gen, 0, st->dd_cap * sizeof(*st->dd_gen));
		st->gen = 1;
	}
}

static size_t dd_slot(const struct sset *out, uint32_t rec, size_t mask)
{
	const int32_t *a = out->d + out->r[rec].off;
	size_t n = out->r[rec].len;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint32_t)a[i]) * 0x100000001b3ull;
	return (h ^ (h >> 29)) & mask;
}

/* Double the dedupe table, re-adding the records [from, out->nr). */
static bool dd_grow(struct grammar_state *st, const struct sset *out, size_t from)
{
	size_t cap = st->dd_cap * 2;
	uint32_t *dd = cm_malloc(cap * sizeof(*dd)), *gen = cm_calloc(cap, sizeof(*gen));
	if (!dd || !gen) {
		cm_free(dd);
		cm_free(gen);
		return false;
	}
	cm_free(st->dd);
	cm_free(st->dd_gen);
	st->dd = dd;
	st->dd_gen = gen;
	st->dd_cap = cap;
	st->gen = 1;
	for (size_t i = from; i < out->nr; i++) {
		size_t k = dd_slot(out, (uint32_t)i, cap - 1);
		while (gen[k] == 1)
			k = (k + 1) & (cap - 1);
		dd[k] = (uint32_t)i;
		gen[k] = 1;
	}
	return true;
}

/* Add a[0..n) to out's records from `from` on (the state being built),
 * unless already there: a hash set, since ambiguous grammars make many. */
static void emit(struct grammar_state *st, struct sset *out, size_t from, const int32_t *a,
                 size_t n)
{
	if (out->nr - from >= MAX_STACKS)
		return;
	if ((out->nr - from + 1) * 2 > st->dd_cap && !dd_grow(st, out, from)) {
		st->oom = true;
		return;
	}
	uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint32_t)a[i]) * 0x100000001b3ull;
	size_t mask = st->dd_cap - 1, k = (h ^ (h >> 29)) & mask;
	for (; st->dd_gen[k] == st->gen; k = (k + 1) & mask) {
		struct srec r = out->r[st->dd[k]];
		if (r.len == n && memcmp(out->d + r.off, a, n * sizeof(*a)) == 0)
			return;
	}
	if (sset_push(st, out, a, n, -1, -1)) {
		st->dd[k] = (uint32_t)(out->nr - 1);
		st->dd_gen[k] = st->gen;
	}
}

/* Expand every stack waiting in st->todo until a terminal is on top (or the
 * stack is empty), adding the results to out from record `from` on. */
static void expand(struct grammar_state *st, struct sset *out, size_t from)
{
	const engine_grammar *g = st->g;
	struct sset *t = &st->todo;
	while (t->nr > 0) {
		struct srec rec = t->r[--t->nr];
		size_t n = rec.len;
		memcpy(st->tmp, t->d + rec.off, n * sizeof(int32_t));
		t->nd = rec.off;
		if (n == 0 || g->el[st->tmp[n - 1]].type != GEL_REF) {
			emit(st, out, from, st->tmp, n);
			continue;
		}
		if (--st->budget < 0)
			continue; /* a pathological grammar: drop what is left */
		int32_t pos = st->tmp[n - 1];
		int32_t next = end_of_seq(&g->el[pos + 1]) ? -1 : pos + 1;
		uint32_t sub = g->rule_start[g->el[pos].value];
		for (;;) {
			int32_t first = end_of_seq(&g->el[sub]) ? -1 : (int32_t)sub;
			if (n - 1 + (next >= 0) + (first >= 0) <= MAX_DEPTH)
				(void)sset_push(st, t, st->tmp, n - 1, next, first);
			while (!end_of_seq(&g->el[sub]))
				sub++;
			if (g->el[sub].type != GEL_ALT)
				break;
			sub++;
		}
	}
}

/* Does the class at el[pos] match cp? *ret_next: the element after it. */
static bool match_char(const struct gel *el, uint32_t pos, uint32_t cp, uint32_t *ret_next)
{
	if (el[pos].type == GEL_ANY) {
		*ret_next = pos + 1;
		return true;
	}
	bool positive = el[pos].type == GEL_CHAR, found = false;
	do {
		if (el[pos + 1].type == GEL_RNG_UPPER) {
			found = found || (el[pos].value <= cp && cp <= el[pos + 1].value);
			pos += 2;
		} else {
			found = found || el[pos].value == cp;
			pos++;
		}
	} while (el[pos].type == GEL_CHAR_ALT);
	*ret_next = pos;
	return found == positive;
}

/* Could the class at el[pos] match a code point that starts with the
 * unfinished sequence p? */
static bool match_partial(const struct gel *el, uint32_t pos, struct u8p p)
{
	static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
	uint32_t lo = p.value << (6 * p.remain), hi = lo | ((1u << (6 * p.remain)) - 1);
	if (p.len >= 2 && p.len <= 4)
		lo = CM_MAX(lo, min_cp[p.len]);
	hi = CM_MIN(hi, 0x10ffffu);
	if (el[pos].type == GEL_ANY)
		return true;
	bool positive = el[pos].type == GEL_CHAR;
	do {
		uint32_t a = el[pos].value, b = a;
		if (el[pos + 1].type == GEL_RNG_UPPER) {
			b = el[pos + 1].value;
			pos += 2;
		} else {
			pos++;
		}
		if (positive && a <= hi && lo <= b)
			return true;
		if (!positive && a <= lo && hi <= b)
			return false; /* every completion is excluded */
	} while (el[pos].type == GEL_CHAR_ALT);
	return !positive;
}

/* One byte into the UTF-8 decoder: the code point when complete, -1 while
 * unfinished, -2 for an invalid byte. Overlong forms, surrogates and code
 * points past U+10FFFF are invalid, as for the detokenizer: byte tokens
 * could otherwise spell a space the grammar wants as C0 A0, which the
 * client would get as U+FFFD. */
static int32_t u8_step(struct u8p *p, uint8_t b)
{
	if (p->remain == 0) {
		if (b < 0x80)
			return b;
		if (b >= 0xc2 && b <= 0xdf) {
			p->value = b & 0x1f;
			p->remain = 1;
		} else if (b >= 0xe0 && b <= 0xef) {
			p->value = b & 0x0f;
			p->remain = 2;
		} else if (b >= 0xf0 && b <= 0xf4) {
			p->value = b & 0x07;
			p->remain = 3;
		} else {
			return -2;
		}
		p->len = p->remain + 1;
		return -1;
	}
	if ((b & 0xc0) != 0x80)
		return -2;
	if (p->remain == p->len - 1 &&
	    ((p->len == 3 && p->value == 0 && b < 0xa0) ||    /* E0: overlong */
	     (p->len == 3 && p->value == 0xd && b > 0x9f) ||  /* ED: surrogates */
	     (p->len == 4 && p->value == 0 && b < 0x90) ||    /* F0: overlong */
	     (p->len == 4 && p->value == 4 && b > 0x8f)))     /* F4: past U+10FFFF */
		return -2;
	p->value = p->value << 6 | (b & 0x3f);
	if (--p->remain > 0)
		return -1;
	uint32_t v = p->value;
	p->value = 0;
	return (int32_t)v;
}

/* The stacks of in's records [a, b) after code point cp, appended to out
 * (which may be in); returns the first new record (the new state is
 * [ret, out->nr)). */
static size_t accept_cp(struct grammar_state *st, const struct sset *in, size_t a, size_t b,
                        uint32_t cp, struct sset *out)
{
	const struct gel *el = st->g->el;
	size_t from = out->nr;
	new_gen(st);
	for (size_t i = a; i < b; i++) {
		struct srec r = in->r[i];
		if (r.len == 0)
			continue;
		int32_t top = in->d[r.off + r.len - 1];
		uint32_t next;
		if (!match_char(el, (uint32_t)top, cp, &next))
			continue;
		(void)sset_push(st, &st->todo, in->d + r.off, r.len - 1,
		                end_of_seq(&el[next]) ? -1 : (int32_t)next, -1);
		expand(st, out, from);
	}
	return from;
}

/* Any stack of s [a, b) that could go on with the unfinished p? */
static bool any_partial(const struct grammar_state *st, const struct sset *s, size_t a, size_t b,
                        struct u8p p)
{
	for (size_t i = a; i < b; i++) {
		struct srec r = s->r[i];
		if (r.len && match_partial(st->g->el, (uint32_t)s->d[r.off + r.len - 1], p))
			return true;
	}
	return false;
}

static void lv_load_cur(struct grammar_state *st)
{
	st->lv.nr = st->lv.nd = 0;
	for (size_t i = 0; i < st->cur.nr; i++)
		(void)sset_push(st, &st->lv, st->cur.d + st->cur.r[i].off, st->cur.r[i].len, -1, -1);
}

void grammar_state_reset(struct grammar_state *st)
{
	const engine_grammar *g = st->g;
	st->cur.nr = st->cur.nd = 0;
	st->todo.nr = st->todo.nd = 0;
	st->part = (struct u8p){0, 0, 0};
	new_gen(st);
	uint32_t pos = g->rule_start[g->root];
	for (;;) {
		(void)sset_push(st, &st->todo, NULL, 0, end_of_seq(&g->el[pos]) ? -1 : (int32_t)pos,
		                -1);
		while (!end_of_seq(&g->el[pos]))
			pos++;
		if (g->el[pos].type != GEL_ALT)
			break;
		pos++;
	}
	expand(st, &st->cur, 0);
}

int grammar_state_new(const engine_grammar *g, struct grammar_state **ret_st, struct cm_err *err)
{
	*ret_st = NULL;
	struct grammar_state *st = cm_calloc(1, sizeof(*st));
	if (!st)
		return cm_err_set(err, -ENOMEM, "grammar: out of memory");
	st->g = g;
	/* never NULL buffers, so that empty stacks copy from somewhere */
	struct sset *all[] = {&st->cur, &st->lv, &st->todo};
	for (size_t i = 0; i < CM_ARRAY_LEN(all); i++) {
		all[i]->capd = 256;
		all[i]->capr = 64;
		all[i]->d = cm_malloc(all[i]->capd * sizeof(*all[i]->d));
		all[i]->r = cm_malloc(all[i]->capr * sizeof(*all[i]->r));
		st->oom |= !all[i]->d || !all[i]->r;
	}
	st->dd_cap = 256;
	st->dd = cm_malloc(st->dd_cap * sizeof(*st->dd));
	st->dd_gen = cm_calloc(st->dd_cap, sizeof(*st->dd_gen));
	st->oom |= !st->dd || !st->dd_gen;
	if (!st->oom)
		grammar_state_reset(st);
	if (st->oom) {
		grammar_state_free(st);
		return cm_err_set(err, -ENOMEM, "grammar: out of memory");
	}
	*ret_st = st;
	return 0;
}

void grammar_state_free(struct grammar_state *st)
{
	if (!st)
		return;
	sset_free(&st->cur);
	sset_free(&st->lv);
	sset_free(&st->todo);
	sset_free(&st->memo);
	cm_free(st->ms);
	cm_free(st->ms_hash);
	cm_free(st->tr);
	cm_free(st->asc);
	cm_free(st->dd);
	cm_free(st->dd_gen);
	cm_free(st);
}

/* Run bytes through the current state in lv; the result is lv [*ret_a,
 * lv.nr) with *ret_part. false if refused. */
static bool run_bytes(struct grammar_state *st, const uint8_t *s, size_t n, size_t *ret_a,
                      struct u8p *ret_part)
{
	lv_load_cur(st);
	size_t a = 0;
	struct u8p p = st->part;
	for (size_t i = 0; i < n; i++) {
		int32_t cp = u8_step(&p, s[i]);
		if (cp == -2)
			return false;
		if (cp >= 0) {
			size_t b = st->lv.nr;
			a = accept_cp(st, &st->lv, a, b, (uint32_t)cp, &st->lv);
			if (a == st->lv.nr)
				return false;
		} else if (!any_partial(st, &st->lv, a, st->lv.nr, p)) {
			return false;
		}
	}
	*ret_a = a;
	*ret_part = p;
	return !st->oom;
}

int grammar_state_feed(struct grammar_state *st, const char *s, size_t n)
{
	size_t a;
	struct u8p p;
	if (!run_bytes(st, (const uint8_t *)s, n, &a, &p)) {
		st->oom = false;
		return -EINVAL;
	}
	st->cur.nr = st->cur.nd = 0;
	for (size_t i = a; i < st->lv.nr; i++)
		if (!sset_push(st, &st->cur, st->lv.d + st->lv.r[i].off, st->lv.r[i].len, -1, -1))
			break;
	st->oom = false; /* out of memory keeps what fitted: a subset, never more */
	st->part = p;
	return 0;
}

bool grammar_state_accepting(const struct grammar_state *st)
{
	if (st->part.remain)
		return false;
	for (size_t i = 0; i < st->cur.nr; i++)
		if (st->cur.r[i].len == 0)
			return true;
	return false;
}

bool grammar_state_done(const struct grammar_state *st)
{
	if (st->part.remain)
		return false;
	for (size_t i = 0; i < st->cur.nr; i++)
		if (st->cur.r[i].len != 0)
			return false;
	return true;
}

static bool token_ok(const struct grammar_state *st, int32_t id)
{
	const engine_grammar *g = st->g;
	return id >= 0 && id < g->n_vocab;
}

int grammar_state_advance(struct grammar_state *st, int32_t id)
{
	const engine_grammar *g = st->g;
	if (!token_ok(st, id))
		return -EINVAL;
	if (g->tflag[id] & TF_EOG)
		return grammar_state_accepting(st) ? 0 : -EINVAL;
	if (!(g->tflag[id] & TF_TEXT))
		return -EINVAL;
	return grammar_state_feed(st, g->pieces + g->poff[id], g->plen[id]);
}

bool grammar_state_allows(struct grammar_state *st, int32_t id)
{
	const engine_grammar *g = st->g;
	if (!token_ok(st, id))
		return false;
	if (g->tflag[id] & TF_EOG)
		return grammar_state_accepting(st);
	if (!(g->tflag[id] & TF_TEXT))
		return false;
	size_t a;
	struct u8p p;
	bool ok = run_bytes(st, (const uint8_t *)g->pieces + g->poff[id], g->plen[id], &a, &p);
	st->oom = false;
	return ok;
}

/* ---- the allowed set: a trie walk over memoized states ---------------------- */

/* Past these the memo starts over (a pathological grammar's states). */
#define MEMO_MAX_DATA (1u << 22)
#define MEMO_MAX_STATES (1u << 14)
/* States with an ASCII row (512 bytes each): a walk may intern a state
 * per trie node (an enum of thousands of words does), and those rows
 * would then cost more than the trie; later states go through the hash. */
#define ASC_STATES 4096

static void memo_reset(struct grammar_state *st)
{
	st->memo.nr = st->memo.nd = 0;
	st->n_ms = 0;
	if (st->ms_hash)
		memset(st->ms_hash, 0xff, st->ms_hash_cap * sizeof(*st->ms_hash));
	st->n_tr = 0;
	for (size_t i = 0; i < st->cap_tr; i++)
		st->tr[i].from = -1;
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static uint64_t state_hash(const struct sset *s, size_t a, size_t b)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (b - a);
	for (size_t i = a; i < b; i++) {
		h = mix64(h ^ s->r[i].len);
		for (uint32_t k = 0; k < s->r[i].len; k++)
			h = mix64(h + (uint32_t)s->d[s->r[i].off + k]);
	}
	return h;
}

static bool state_eq(const struct sset *x, size_t a, size_t b, const struct sset *y, size_t c,
                     size_t d)
{
	if (b - a != d - c)
		return false;
	for (size_t i = 0; i < b - a; i++) {
		struct srec p = x->r[a + i], q = y->r[c + i];
		if (p.len != q.len || memcmp(x->d + p.off, y->d + q.off, p.len * sizeof(int32_t)))
			return false;
	}
	return true;
}

/* Grow an open-addressing table of ids to cap (a power of two), rehashed. */
static bool ms_hash_grow(struct grammar_state *st)
{
	size_t cap = st->ms_hash_cap ? st->ms_hash_cap * 2 : 1024;
	int32_t *t = cm_malloc(cap * sizeof(*t));
	if (!t)
		return false;
	memset(t, 0xff, cap * sizeof(*t));
	for (size_t i = 0; i < st->n_ms; i++) {
		size_t k = st->ms[i].hash & (cap - 1);
		while (t[k] >= 0)
			k = (k + 1) & (cap - 1);
		t[k] = (int32_t)i;
	}
	cm_free(st->ms_hash);
	st->ms_hash = t;
	st->ms_hash_cap = cap;
	return true;
}

/* The id of the state s [a, b), added to the memo if new; -1 when out of
 * memory. */
static int32_t intern(struct grammar_state *st, const struct sset *s, size_t a, size_t b)
{
	uint64_t h = state_hash(s, a, b);
	if ((st->n_ms + 1) * 2 > st->ms_hash_cap && !ms_hash_grow(st))
		return -1;
	size_t k = h & (st->ms_hash_cap - 1);
	for (; st->ms_hash[k] >= 0; k = (k + 1) & (st->ms_hash_cap - 1)) {
		struct mstate *m = &st->ms[st->ms_hash[k]];
		if (m->hash == h && state_eq(s, a, b, &st->memo, m->r0, m->r1))
			return st->ms_hash[k];
	}
	if (st->n_ms == st->cap_ms) {
		size_t cap = st->cap_ms ? st->cap_ms * 2 : 256;
		struct mstate *n = cm_realloc(st->ms, cap * sizeof(*n));
		if (!n)
			return -1;
		st->ms = n;
		if (st->cap_ms < ASC_STATES) {
			int32_t *asc = cm_realloc(st->asc, CM_MIN(cap, ASC_STATES) * 128 * sizeof(*asc));
			if (!asc)
				return -1;
			st->asc = asc;
		}
		st->cap_ms = cap;
	}
	if (st->n_ms < ASC_STATES)
		for (size_t i = 0; i < 128; i++)
			st->asc[st->n_ms * 128 + i] = -3;
	uint32_t r0 = (uint32_t)st->memo.nr;
	for (size_t i = a; i < b; i++)
		if (!sset_push(st, &st->memo, s->d + s->r[i].off, s->r[i].len, -1, -1))
			return -1;
	st->ms[st->n_ms] = (struct mstate){r0, (uint32_t)st->memo.nr, h};
	st->ms_hash[k] = (int32_t)st->n_ms;
	return (int32_t)st->n_ms++;
}

static size_t tr_slot(const struct grammar_state *st, int32_t from, uint64_t sig)
{
	return mix64(sig * 31 + (uint64_t)from) & (st->cap_tr - 1);
}

/* The memoized transition, or -2 if not known. */
static int32_t tr_get(const struct grammar_state *st, int32_t from, uint64_t sig)
{
	if (!st->cap_tr)
		return -2;
	for (size_t k = tr_slot(st, from, sig); st->tr[k].from >= 0; k = (k + 1) & (st->cap_tr - 1))
		if (st->tr[k].from == from && st->tr[k].sig == sig)
			return st->tr[k].to;
	return -2;
}

static void tr_put(struct grammar_state *st, int32_t from, uint64_t sig, int32_t to)
{
	if ((st->n_tr + 1) * 2 > st->cap_tr) {
		size_t cap = st->cap_tr ? st->cap_tr * 2 : 1024;
		struct mtrans *t = cm_malloc(cap * sizeof(*t)), *old = st->tr;
		if (!t)
			return; /* not memoized: only slower */
		for (size_t i = 0; i < cap; i++)
			t[i].from = -1;
		size_t ocap = st->cap_tr;
		st->tr = t;
		st->cap_tr = cap;
		for (size_t i = 0; i < ocap; i++)
			if (old[i].from >= 0) {
				size_t k = tr_slot(st, old[i].from, old[i].sig);
				while (t[k].from >= 0)
					k = (k + 1) & (cap - 1);
				t[k] = old[i];
			}
		cm_free(old);
	}
	size_t k = tr_slot(st, from, sig);
	while (st->tr[k].from >= 0)
		k = (k + 1) & (st->cap_tr - 1);
	st->tr[k] = (struct mtrans){sig, from, to};
	st->n_tr++;
}

/* Which stacks of state id a code point moves (bit i: its i-th stack), for
 * up to 64 stacks; ~0 when there are more (not memoized then). */
static uint64_t match_sig(const struct grammar_state *st, int32_t id, uint32_t cp)
{
	const struct sset *m = &st->memo;
	size_t a = st->ms[id].r0, b = st->ms[id].r1;
	if (b - a > 64)
		return ~(uint64_t)0;
	uint64_t sig = 0;
	uint32_t next;
	for (size_t i = a; i < b; i++) {
		struct srec r = m->r[i];
		if (r.len && match_char(st->g->el, (uint32_t)m->d[r.off + r.len - 1], cp, &next))
			sig |= (uint64_t)1 << (i - a);
	}
	return sig;
}

/* The state after code point cp from state id: -1 if none, -2 out of
 * memory. The result depends only on which stacks cp moves (a class's end
 * does not depend on the character), so it is memoized by that set: a
 * JSON string's characters, at any depth of the trie, share one. */
static int32_t step(struct grammar_state *st, int32_t id, uint32_t cp)
{
	uint64_t sig = match_sig(st, id, cp);
	if (sig == 0)
		return -1;
	int32_t to = sig == ~(uint64_t)0 ? -2 : tr_get(st, id, sig);
	if (to != -2)
		return to;
	st->lv.nr = st->lv.nd = 0;
	(void)accept_cp(st, &st->memo, st->ms[id].r0, st->ms[id].r1, cp, &st->lv);
	to = st->lv.nr ? intern(st, &st->lv, 0, st->lv.nr) : -1;
	if (st->lv.nr && to < 0)
		return -2;
	if (sig != ~(uint64_t)0)
		tr_put(st, id, sig, to);
	return to;
}

/* Children [c, end) of a trie node, against memoized state id with the
 * unfinished sequence p. Every token under a prefix the grammar refuses
 * is skipped with its subtree. */
static int walk(struct grammar_state *st, int32_t c, int32_t end, int32_t id, struct u8p p,
                uint8_t *mask)
{
	const engine_grammar *g = st->g;
	int count = 0;
	for (; c < end; c = g->trie[c].end) {
		struct u8p np = p;
		int32_t cp = u8_step(&np, g->trie[c].byte);
		if (cp == -2)
			continue;
		int32_t nid = id;
		if (cp >= 0 && cp < 128 && id < ASC_STATES) {
			nid = st->asc[(size_t)id * 128 + (size_t)cp];
			if (nid == -3) {
				nid = step(st, id, (uint32_t)cp);
				if (nid != -2)
					st->asc[(size_t)id * 128 + (size_t)cp] = nid;
			}
			if (nid < 0)
				continue;
		} else if (cp >= 0) {
			nid = step(st, id, (uint32_t)cp);
			if (nid < 0)
				continue;
		} else if (!any_partial(st, &st->memo, st->ms[id].r0, st->ms[id].r1, np)) {
			continue;
		}
		for (int32_t t = g->trie[c].tok; t >= 0; t = g->tok_next[t]) {
			mask[t] = 1;
			count++;
		}
		if (c + 1 < g->trie[c].end)
			count += walk(st, c + 1, g->trie[c].end, nid, np, mask);
	}
	return count;
}

int grammar_state_allowed(struct grammar_state *st, uint8_t *mask)
{
	const engine_grammar *g = st->g;
	memset(mask, 0, (size_t)g->n_vocab);
	int count = 0;
	if (grammar_state_accepting(st))
		for (int32_t id = 0; id < g->n_vocab; id++)
			if (g->tflag[id] & TF_EOG) {
				mask[id] = 1;
				count++;
			}
	if (!g->trie)
		return count;
	if (st->memo.nd > MEMO_MAX_DATA || st->n_ms > MEMO_MAX_STATES)
		memo_reset(st);
	int32_t id = intern(st, &st->cur, 0, st->cur.nr);
	if (id < 0) {
		/* out of memory: start over once, then give up (nothing allowed) */
		memo_reset(st);
		id = intern(st, &st->cur, 0, st->cur.nr);
	}
	if (id >= 0)
		count += walk(st, 1, g->trie[0].end, id, st->part, mask);
	st->oom = false;
	return count;
}
