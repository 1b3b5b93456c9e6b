/* tests/unit/test_ipc_json_schema.c: JSON Schema to GBNF (ipc/json_schema.c):
 * the rules each construct makes, and the refusals, each naming the JSON
 * pointer of the part refused; the grammars, compiled by the engine,
 * accept the JSON texts the schema allows (pretty-printed too) and refuse
 * the others; and text sampled under them, from stories260K's real logits
 * and from random logits over the Llama (SPM) and Qwen2 (BPE)
 * vocabularies, always parses and validates against the schema
 * (tests/unit/schema_check.h). */
#include "engine/engine.h"
#include "engine/grammar_impl.h"
#include "ipc/json_schema.h"
#include "tests/test.h"
#include "tests/unit/schema_check.h"

#include <string.h>

/* Fewer seeds over the big vocabularies under the sanitizers: the
 * allowed-set walks are the slow part, and the coverage is the same. */
#if defined(__SANITIZE_ADDRESS__)
#define VOCAB_SEEDS 4
#else
#define VOCAB_SEEDS 20
#endif

/* Not inlined: gcc 12 then takes the result for a pointer to conv's local. */
static __attribute__((noinline)) char *conv(const char *schema, int *ret_rc, struct cm_err *err)
{
	char *g = NULL;
	*ret_rc = ipc_json_schema_to_gbnf(schema, strlen(schema), &g, err);
	return g;
}

/* Convert; the grammar must exist and hold every one of `want` (NULL-ended). */
static void expect_rules(const char *schema, const char *const *want)
{
	struct cm_err err = {0};
	int rc;
	char *g = conv(schema, &rc, &err);
	CHECK_MSG(rc == 0 && g, "%s: %d %s", schema, rc, err.msg);
	for (size_t i = 0; g && want[i]; i++)
		CHECK_MSG(strstr(g, want[i]) != NULL, "%s: no '%s' in\n%s", schema, want[i], g);
	/* the root is the value itself: nothing around it */
	CHECK(g && strncmp(g, "root ::= ", 9) == 0);
	cm_free(g);
}

static void test_primitives(void)
{
	expect_rules("{\"type\":\"string\"}",
	             (const char *[]){"root ::= string\n", "string ::= \"\\\"\" char* \"\\\"\"",
	                              "\\\\\" ( [\"\\\\/bfnrt] | \"u\"", NULL});
	expect_rules("{\"type\":\"integer\"}",
	             (const char *[]){"root ::= integer\n", "integer ::= \"-\"? ( \"0\" | [1-9]",
	                              NULL});
	expect_rules("{\"type\":\"number\"}",
	             (const char *[]){"root ::= number\n", "number ::= integer ( \".\" [0-9]",
	                              "[eE] [-+]?", NULL});
	expect_rules("{\"type\":\"boolean\"}",
	             (const char *[]){"root ::= boolean\n", "\"true\" | \"false\"", NULL});
	expect_rules("{\"type\":\"null\"}", (const char *[]){"null ::= \"null\"", NULL});
	/* several types: alternatives; integer folds into number */
	expect_rules("{\"type\":[\"string\",\"null\"]}",
	             (const char *[]){"::= string | null\n", NULL});
	expect_rules("{\"type\":[\"integer\",\"number\"]}",
	             (const char *[]){"root ::= number\n", NULL});
	/* lower bounds 0 and 1: no sign, no leading zero or no zero */
	expect_rules("{\"type\":\"integer\",\"minimum\":0}",
	             (const char *[]){"root ::= integer-nonneg\n", "integer-nonneg ::= \"0\" | [1-9]",
	                              NULL});
	expect_rules("{\"type\":\"integer\",\"minimum\":0.5}",
	             (const char *[]){"root ::= integer-pos\n", "integer-pos ::= [1-9]", NULL});
	expect_rules("{\"type\":\"integer\",\"exclusiveMinimum\":0}",
	             (const char *[]){"root ::= integer-pos\n", NULL});
	expect_rules("{\"type\":\"integer\",\"exclusiveMinimum\":-0.5}",
	             (const char *[]){"root ::= integer-nonneg\n", NULL});
	expect_rules("{\"type\":\"number\",\"minimum\":0.0}",
	             (const char *[]){"root ::= number-nonneg\n",
	                              "number-nonneg ::= integer-nonneg ( \".\"", NULL});
	expect_rules("{\"minimum\":0}", (const char *[]){"root ::= number-nonneg\n", NULL});
	/* annotations change nothing */
	expect_rules("{\"type\":\"string\",\"title\":\"T\",\"description\":\"d\",\"format\":"
	             "\"date-time\",\"default\":\"x\",\"examples\":[\"y\"]}",
	             (const char *[]){"root ::= string\n", NULL});
}

static void test_any(void)
{
	/* {} and true are any value, nested at most 8 deep */
	expect_rules("{}", (const char *[]){"root ::= value\n",
	                                    "value ::= object | array | string | number",
	                                    "value-d8 ::= string | number | boolean | null\n",
	                                    NULL});
	expect_rules("true", (const char *[]){"root ::= value\n", NULL});
	const char *g = ipc_json_object_gbnf();
	CHECK(g && strncmp(g, "root ::= object\n", 16) == 0);
	CHECK(g && strstr(g, "object ::= \"{\" ws ( string \":\" ws value-d1") != NULL);
	CHECK(ipc_json_object_gbnf() == g); /* made once */
}

static void test_whitespace_bounded(void)
{
	struct cm_err err = {0};
	int rc;
	char *g = conv("{\"type\":\"array\"}", &rc, &err);
	CHECK_OK(rc);
	/* the ws rule's line */
	const char *at = g ? strstr(g, "\nws ::= ") : NULL;
	char *ws = at ? strndup(at + 1, strcspn(at + 1, "\n")) : NULL;
	cm_free(g);
	CHECK(ws != NULL);
	if (!ws)
		return;
	/* no repetition operator: a space, or a newline and at most 16 blanks */
	CHECK(!strchr(ws, '*') && !strchr(ws, '+'));
	size_t n = 0;
	for (const char *p = ws; *p; p++)
		n += strncmp(p, "[ \\t]", 5) == 0;
	CHECK_EQ_INT(n, 16);
	free(ws);
}

static void test_object(void)
{
	const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
	                "\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"boolean\"}},"
	                "\"required\":[\"c\",\"a\"],\"additionalProperties\":false}";
	/* a required first, b optional, c required: in the schema's order */
	expect_rules(s, (const char *[]){"root ::= root-1\n",
	                                 "root-1 ::= \"{\" ws root-1-h0 ws \"}\"\n",
	                                 "root-1-h0 ::= \"\\\"a\\\"\" \":\" ws string root-1-t1\n",
	                                 "root-1-t1 ::= ( \",\" ws \"\\\"b\\\"\" \":\" ws integer )? "
	                                 "root-1-t2\n",
	                                 "root-1-t2 ::= \",\" ws \"\\\"c\\\"\" \":\" ws boolean\n",
	                                 NULL});
	/* all optional: the object may be empty, any property may come first */
	expect_rules("{\"properties\":{\"x\":{},\"y\":{}}}",
	             (const char *[]){"root-1 ::= \"{\" ws ( root-1-h0 ws )? \"}\"",
	                              "root-1-h0 ::= \"\\\"x\\\"\" \":\" ws value root-1-t1 | root-1-h1",
	                              "root-1-h1 ::= \"\\\"y\\\"\" \":\" ws value\n", NULL});
	/* no properties: any object, or with additionalProperties false the
	 * empty one */
	expect_rules("{\"type\":\"object\"}", (const char *[]){"root ::= object\n", NULL});
	expect_rules("{\"type\":\"object\",\"additionalProperties\":false}",
	             (const char *[]){"root-1 ::= \"{\" ws \"}\"\n", NULL});
	/* additionalProperties true or {} still generate the listed ones */
	expect_rules("{\"properties\":{\"k\":{}},\"additionalProperties\":true}",
	             (const char *[]){"root-1-h0 ::= \"\\\"k\\\"\"", NULL});
	expect_rules("{\"properties\":{\"k\":{}},\"additionalProperties\":{}}",
	             (const char *[]){"root-1-h0 ::= \"\\\"k\\\"\"", NULL});
	/* keys that need escapes, in JSON and in GBNF */
	expect_rules("{\"properties\":{\"q\\\"\\\\\\n\":{}},\"required\":[\"q\\\"\\\\\\n\"]}",
	             (const char *[]){"root-1-h0 ::= \"\\\"q\\\\\\\"\\\\\\\\\\\\n\\\"\"", NULL});
	/* nesting: rules named after their properties */
	expect_rules("{\"properties\":{\"inner\":{\"properties\":{\"z\":{\"type\":\"null\"}},"
	             "\"required\":[\"z\"]}},\"required\":[\"inner\"]}",
	             (const char *[]){"inner-2 ::= \"{\" ws inner-2-h0 ws \"}\"",
	                              "root-1-h0 ::= \"\\\"inner\\\"\" \":\" ws inner-2\n", NULL});
}

static void test_array(void)
{
	expect_rules("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}",
	             (const char *[]){"root-1 ::= \"[\" ws ( integer ( \",\" ws integer )* ws )? \"]\"",
	                              NULL});
	expect_rules("{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"minItems\":2,\"maxItems\":3}",
	             (const char *[]){"root-1 ::= \"[\" ws null \",\" ws null ( \",\" ws null )? ws "
	                              "\"]\"",
	                              NULL});
	expect_rules("{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"minItems\":1}",
	             (const char *[]){"root-1 ::= \"[\" ws null ( \",\" ws null )* ws \"]\"", NULL});
	expect_rules("{\"type\":\"array\",\"maxItems\":0}",
	             (const char *[]){"root-1 ::= \"[\" ws \"]\"", NULL});
	/* no items: any values */
	expect_rules("{\"items\":{},\"maxItems\":1}",
	             (const char *[]){"root-1 ::= \"[\" ws ( value ws )? \"]\"", NULL});
	/* a long bound becomes a chain of rules, not deep parentheses */
	expect_rules("{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"maxItems\":100}",
	             (const char *[]){"root-1-o1 ::= ( \",\" ws null )?\n",
	                              "root-1-o99 ::= ( \",\" ws null root-1-o98 )?\n",
	                              "root-1 ::= \"[\" ws ( null root-1-o99 ws )? \"]\"", NULL});
}

static void test_string_lengths(void)
{
	expect_rules("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
	             (const char *[]){"root-1 ::= \"\\\"\" char char ( char )? \"\\\"\"\n", NULL});
	expect_rules("{\"type\":\"string\",\"minLength\":1}",
	             (const char *[]){"root-1 ::= \"\\\"\" char ( char )* \"\\\"\"\n", NULL});
	expect_rules("{\"type\":\"string\",\"minLength\":2.0}",
	             (const char *[]){"root-1 ::= \"\\\"\" char char ( char )* \"\\\"\"\n", NULL});
}

static void test_enum_const(void)
{
	expect_rules("{\"enum\":[\"red\",\"gr\\\"n\",1,2.5,true,null,[1],{\"a\":1}]}",
	             (const char *[]){"root-1 ::= \"\\\"red\\\"\" | \"\\\"gr\\\\\\\"n\\\"\" | \"1\" | "
	                              "\"2.5\" | \"true\" | \"null\" | \"[1]\" | \"{\\\"a\\\":1}\"\n",
	                              NULL});
	/* reals keep the fewest digits, and stay reals */
	expect_rules("{\"enum\":[0.1,3.0]}",
	             (const char *[]){"root-1 ::= \"0.1\" | \"3.0\"\n", NULL});
	/* with a type, only the values of that type */
	expect_rules("{\"type\":\"string\",\"enum\":[\"a\",1]}",
	             (const char *[]){"root-1 ::= \"\\\"a\\\"\"\n", NULL});
	expect_rules("{\"const\":\"only\"}",
	             (const char *[]){"root-1 ::= \"\\\"only\\\"\"\n", NULL});
	/* a string with a non-ASCII character and a control character */
	expect_rules("{\"const\":\"\xc3\xa9\\u0001\"}",
	             (const char *[]){"root-1 ::= \"\\\"\xc3\xa9\\\\u0001\\\"\"\n", NULL});
}

static void test_any_of_and_refs(void)
{
	expect_rules("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"title\":\"T\"}",
	             (const char *[]){"root-1 ::= string | null\n", NULL});
	expect_rules("{\"oneOf\":[{\"const\":1},{\"type\":\"boolean\"}]}",
	             (const char *[]){"root-2 ::= root-1 | boolean\n", NULL});
	/* $defs and definitions; the same target is one rule however often
	 * it is named; a recursive schema refers to its own rule */
	const char *tree =
	    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
	    "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"kids\"]}},"
	    "\"definitions\":{\"n\":{\"type\":\"null\"}},\"type\":\"object\","
	    "\"properties\":{\"a\":{\"$ref\":\"#/$defs/node\"},\"b\":{\"$ref\":\"#/$defs/node\"},"
	    "\"c\":{\"$ref\":\"#/definitions/n\"}}}";
	expect_rules(tree, (const char *[]){"node-2 ::= node-3\n",
	                                    "kids-4 ::= \"[\" ws ( node-2 ( \",\" ws node-2 )* ws )? "
	                                    "\"]\"\n",
	                                    "root-1-h0 ::= \"\\\"a\\\"\" \":\" ws node-2 root-1-t1",
	                                    "root-1-t1 ::= ( \",\" ws \"\\\"b\\\"\" \":\" ws node-2 )?",
	                                    "n-5 ::= null\n", NULL});
	struct cm_err err = {0};
	int rc;
	char *g = conv(tree, &rc, &err);
	CHECK(g && !strstr(g, "node-6")); /* no second rule for node */
	cm_free(g);
	/* "#" is the root itself; pointer escapes in a name */
	expect_rules("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2}",
	             (const char *[]){"root ::= root-1\n",
	                              "root-1 ::= \"[\" ws ( root ( \",\" ws root )? ws )? \"]\"\n",
	                              NULL});
	expect_rules("{\"$defs\":{\"a/b\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/a~1b\"}",
	             (const char *[]){"root ::= a-b-1\n", "a-b-1 ::= null\n", NULL});
}

static void test_long_names(void)
{
	/* a property name of 600 bytes: its literal whole, in its optional tail */
	char key[601], schema[1024], want[700];
	memset(key, 'k', 600);
	key[600] = '\0';
	snprintf(schema, sizeof(schema), "{\"properties\":{\"a\":{},\"%s\":{}},\"required\":[\"a\"]}",
	         key);
	snprintf(want, sizeof(want), "( \",\" ws \"\\\"%s\\\"\" \":\" ws value )?", key);
	expect_rules(schema, (const char *[]){want, NULL});
}

static void test_names_do_not_collide(void)
{
	/* properties named like the shared rules get numbered rules */
	expect_rules("{\"properties\":{\"string\":{\"type\":\"string\",\"maxLength\":1},"
	             "\"value-d1\":{\"type\":\"array\"}},\"required\":[\"string\"]}",
	             (const char *[]){"string-2 ::= ", "value-d1-3 ::= ", "\nstring ::= ",
	                              "\nvalue-d1 ::= ", NULL});
}

struct refusal {
	const char *schema;
	int code;
	const char *where; /* in the message */
};

static const struct refusal refusals[] = {
    {"{\"type\":\"string\",\"pattern\":\"a+\"}", -ENOTSUP, "#/pattern: "},
    {"{\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":5}}}", -ENOTSUP,
     "#/properties/n/minimum: 'minimum' 5 is not supported"},
    {"{\"type\":\"integer\",\"minimum\":-1}", -ENOTSUP, "#/minimum: "},
    {"{\"type\":\"number\",\"minimum\":1}", -ENOTSUP, "#/minimum: "},
    {"{\"type\":\"number\",\"exclusiveMinimum\":0}", -ENOTSUP, "#/exclusiveMinimum: "},
    {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":0}", -ENOTSUP, "#/minimum: "},
    {"{\"type\":\"integer\",\"maximum\":9}", -ENOTSUP, "#/maximum: "},
    {"{\"type\":\"string\",\"minimum\":0}", -ENOTSUP, "#: keywords of numbers"},
    {"{\"type\":\"integer\",\"minimum\":\"0\"}", -EINVAL, "#/minimum: "},
    {"{\"allOf\":[{}]}", -ENOTSUP, "#/allOf: "},
    {"{\"if\":{},\"then\":{}}", -ENOTSUP, "#/if: "},
    {"{\"not\":{}}", -ENOTSUP, "#/not: "},
    {"{\"type\":\"object\",\"patternProperties\":{}}", -ENOTSUP, "#/patternProperties: "},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", -ENOTSUP,
     "#/additionalProperties: "},
    {"{\"type\":\"array\",\"items\":[{}]}", -ENOTSUP, "#/items: "},
    {"{\"type\":\"array\",\"prefixItems\":[{}]}", -ENOTSUP, "#/prefixItems: "},
    {"{\"type\":\"array\",\"uniqueItems\":true}", -ENOTSUP, "#/uniqueItems: "},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"x\",\"pattern\":\".\"}}",
     -ENOTSUP, "#/items/pattern: "},
    {"{\"type\":\"array\",\"maxItems\":100000}", -ENOTSUP, "#/maxItems: "},
    {"{\"type\":\"string\",\"maxLength\":1025}", -ENOTSUP, "#/maxLength: "},
    {"{\"$ref\":\"http://example.com/s.json\"}", -ENOTSUP, "#/$ref: "},
    {"{\"$ref\":\"#/$defs/x\",\"type\":\"string\"}", -ENOTSUP, "#: "},
    {"{\"anyOf\":[{}],\"properties\":{}}", -ENOTSUP, "#: "},
    {"{\"type\":\"string\",\"properties\":{}}", -ENOTSUP, "#: "},
    {"{\"items\":{},\"properties\":{}}", -ENOTSUP, "#: "},
    {"{\"enum\":[1],\"maxLength\":2}", -ENOTSUP, "#: "},
    {"{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", -ENOTSUP, "#/required/0: "},
    {"{\"type\":\"object\",\"required\":[\"b\"]}", -ENOTSUP, "#/required: "},
    {"{\"properties\":{\"a~/\":{\"anyOf\":[{},{\"nullable\":true}]}}}", -ENOTSUP,
     "#/properties/a~0~1/anyOf/1/nullable: "},
    {"{\"$defs\":{\"d\":{\"contains\":{}}},\"$ref\":\"#/$defs/d\"}", -ENOTSUP,
     "#/$defs/d/contains: "},
    {"false", -ENOTSUP, "#: "},
    /* not a valid schema */
    {"{\"type\":\"strnig\"}", -EINVAL, "#/type: "},
    {"{\"type\":[]}", -EINVAL, "#/type: "},
    {"{\"type\":\"array\",\"minItems\":-1}", -EINVAL, "#/minItems: "},
    {"{\"type\":\"array\",\"minItems\":1.5}", -EINVAL, "#/minItems: "},
    {"{\"type\":\"array\",\"minItems\":\"2\"}", -EINVAL, "#/minItems: "},
    {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", -EINVAL, "#: "},
    {"{\"enum\":[]}", -EINVAL, "#/enum: "},
    {"{\"type\":\"string\",\"enum\":[1]}", -EINVAL, "#: "},
    {"{\"$ref\":\"#/$defs/none\"}", -EINVAL, "#/$ref: "},
    {"{\"$ref\":5}", -EINVAL, "#/$ref: "},
    {"{\"properties\":[]}", -EINVAL, "#/properties: "},
    {"{\"properties\":{\"a\":{}},\"required\":\"a\"}", -EINVAL, "#/required: "},
    {"{\"properties\":{\"a\":5}}", -EINVAL, "#/properties/a: "},
    {"[1,2]", -EINVAL, "#: "},
    {"{\"type\":", -EINVAL, "invalid JSON"},
    {"", -EINVAL, "invalid JSON"},
    {"{\"a\":1,\"a\":2}", -EINVAL, "invalid JSON"},
};

static void test_refusals(void)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(refusals); i++) {
		const struct refusal *r = &refusals[i];
		struct cm_err err = {0};
		int rc;
		char *g = conv(r->schema, &rc, &err);
		CHECK_MSG(rc == r->code && !g, "%s: %d, expected %d", r->schema, rc, r->code);
		CHECK_MSG(err.code == rc && strncmp(err.msg, "json_schema: ", 13) == 0 &&
		              strstr(err.msg, r->where),
		          "%s: message '%s' does not name '%s'", r->schema, err.msg, r->where);
		cm_free(g);
	}
}

static void test_bounds(void)
{
	/* nesting beyond IPC_SCHEMA_MAX_DEPTH is refused, not a deep recursion */
	char buf[4096];
	size_t n = 0;
	for (int i = 0; i < 80; i++)
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "{\"items\":");
	n += (size_t)snprintf(buf + n, sizeof(buf) - n, "{}");
	for (int i = 0; i < 80; i++)
		buf[n++] = '}';
	buf[n] = '\0';
	struct cm_err err = {0};
	int rc;
	char *g = conv(buf, &rc, &err);
	CHECK_EQ_INT(rc, -ENOTSUP);
	CHECK(strstr(err.msg, "deeper than 64") != NULL);
	cm_free(g);
	/* a grammar too large: nested arrays of long bounds multiply */
	const char *big = "{\"$defs\":{\"s\":{\"type\":\"string\",\"maxLength\":1024}},"
	                  "\"type\":\"object\",\"properties\":{";
	char *s = cm_malloc(1 << 20);
	CHECK(s != NULL);
	if (!s)
		return;
	n = (size_t)snprintf(s, 1 << 20, "%s", big);
	for (int i = 0; i < 200; i++)
		n += (size_t)snprintf(s + n, (1 << 20) - n,
		                      "%s\"p%d\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":1024}",
		                      i ? "," : "", i);
	snprintf(s + n, (1 << 20) - n, "}}");
	g = conv(s, &rc, &err);
	CHECK_EQ_INT(rc, -E2BIG);
	CHECK(g == NULL);
	cm_free(s);
}

static void test_out_of_memory(void)
{
	/* every allocation failing in turn: an error, never a crash or leak */
	const char *s = "{\"$defs\":{\"d\":{\"enum\":[1,2.5]}},\"type\":\"object\","
	                "\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/d\"},"
	                "\"maxItems\":20},\"b\":{\"type\":\"string\",\"maxLength\":2}},"
	                "\"required\":[\"b\"]}";
	int ok = 0;
	for (long after = 0; after < 400; after++) {
		cm_alloc_fail_reset(after);
		struct cm_err err = {0};
		int rc;
		char *g = conv(s, &rc, &err);
		cm_alloc_fail_reset(-1);
		CHECK(rc == 0 || rc == -ENOMEM);
		CHECK((rc == 0) == (g != NULL));
		ok += rc == 0;
		cm_free(g);
	}
	CHECK(ok > 0);
}


/* ---- the grammars at work ------------------------------------------------- */

/* -1: refused on the way, 0: a valid prefix only, 1: a complete match,
 * 2: matched and done (nothing may follow). */
static int accepts(const engine_grammar *g, const char *text)
{
	struct grammar_state *st = NULL;
	if (grammar_state_new(g, &st, NULL) != 0)
		return -2;
	int res = -1;
	if (grammar_state_feed(st, text, strlen(text)) == 0)
		res = grammar_state_done(st) ? 2 : grammar_state_accepting(st) ? 1 : 0;
	grammar_state_free(st);
	return res;
}

static engine_grammar *compile(const char *schema)
{
	struct cm_err err = {0};
	int rc;
	char *g = conv(schema, &rc, &err);
	CHECK_MSG(rc == 0, "%s: %s", schema, err.msg);
	engine_grammar *eg = NULL;
	if (g) {
		rc = engine_grammar_new(NULL, g, strlen(g), &eg, &err);
		CHECK_MSG(rc == 0, "%s: %s\n%s", schema, err.msg, g);
	}
	cm_free(g);
	return eg;
}

struct accept_case {
	const char *text;
	int want; /* as accepts() */
};

static void expect_accepts(const char *schema, const struct accept_case *cases, size_t n)
{
	engine_grammar *g = compile(schema);
	for (size_t i = 0; g && i < n; i++) {
		int got = accepts(g, cases[i].text);
		CHECK_MSG(got == cases[i].want, "%s: \"%s\": %d, expected %d", schema, cases[i].text,
		          got, cases[i].want);
		/* and the validator agrees on the complete ones */
		if (cases[i].want >= 1) {
			char why[128];
			CHECK_MSG(sc_check_text(schema, cases[i].text, why, sizeof(why)), "%s: %s: %s",
			          schema, cases[i].text, why);
		}
	}
	engine_grammar_free(g);
}

static void test_grammars_accept(void)
{
	static const struct accept_case obj[] = {
	    {"{\"a\":\"x\",\"c\":true}", 2},
	    {"{\"a\": \"x\", \"b\": -12, \"c\": false}", 2},
	    {"{\n  \"a\": \"\\u00e9\\n\",\n  \"c\": true\n}", 2},
	    {"{\"a\":\"\xc3\xa9t\xc3\xa9\",\"c\":true}", 2},
	    {"{\"a\":\"x\"", 0},             /* a prefix */
	    {"{\"c\":true,\"a\":\"x\"}", -1}, /* out of order */
	    {"{\"a\":\"x\"}", -1},            /* c is required: no "}" yet */
	    {"{\"a\":\"x\",\"c\":true,}", -1},
	    {"{\"a\":\"x\",\"z\":1,\"c\":true}", -1}, /* unlisted */
	    {"{\"a\":1,\"c\":true}", -1},
	    {"{\"a\":\"x\",\"b\":1.5,\"c\":true}", -1}, /* b is an integer */
	    {"{\"a\":\"x\",\"b\":01,\"c\":true}", -1},
	    {"{\"a\":\"\x01\",\"c\":true}", -1}, /* raw control character */
	    {"{\"a\":\"\\q\",\"c\":true}", -1},
	    {" {\"a\":\"x\",\"c\":true}", -1}, /* nothing before the value */
	    {"{\"a\":\"x\",\"c\":true} ", -1}, /* nor after */
	    {"{  \"a\":\"x\",\"c\":true}", -1}, /* one space at most */
	    {"{\n                 \"a\":\"x\",\"c\":true}", -1}, /* 17 blanks */
	    {"{\n                \"a\":\"x\",\"c\":true}", 2},
	};
	expect_accepts("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
	               "\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"boolean\"}},"
	               "\"required\":[\"a\",\"c\"]}",
	               obj, CM_ARRAY_LEN(obj));
	static const struct accept_case opt[] = {
	    {"{}", 2}, {"{ }", 2}, {"{\"y\":null}", 2}, {"{\"x\":1, \"y\":null}", 2},
	    {"{\"y\":null,\"x\":1}", -1}, {"{,\"y\":null}", -1},
	};
	expect_accepts("{\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"null\"}}}", opt,
	               CM_ARRAY_LEN(opt));
	static const struct accept_case num[] = {
	    {"0", 1}, {"-0.5", 1}, {"1e5", 1}, {"2.25E-3", 1}, {"12", 1},
	    {"1234567890123456", 1}, {"12345678901234567", -1}, /* 16 digits at most */
	    {"01", -1}, {".5", -1}, {"1.", 0}, {"+1", -1}, {"1e", 0},
	};
	expect_accepts("{\"type\":\"number\"}", num, CM_ARRAY_LEN(num));
	static const struct accept_case nonneg[] = {
	    {"0", 2}, {"7", 1}, {"-1", -1}, {"-0", -1}, {"01", -1},
	};
	expect_accepts("{\"type\":\"integer\",\"minimum\":0}", nonneg, CM_ARRAY_LEN(nonneg));
	static const struct accept_case pos[] = {
	    {"1", 1}, {"10", 1}, {"0", -1}, {"-3", -1},
	};
	expect_accepts("{\"type\":\"integer\",\"exclusiveMinimum\":0}", pos, CM_ARRAY_LEN(pos));
	static const struct accept_case nnum[] = {
	    {"0.5", 1}, {"0", 1}, {"3e-2", 1}, {"-0.5", -1},
	};
	expect_accepts("{\"type\":\"number\",\"minimum\":0}", nnum, CM_ARRAY_LEN(nnum));
	static const struct accept_case arr[] = {
	    {"[\"a\"]", 2}, {"[\"ab\",\"c\",\"d\"]", 2}, {"[ \"a\" ]", 2}, {"[\n  \"a\",\n  \"b\"\n]", 2},
	    {"[]", -1}, {"[\"a\",\"b\",\"c\",\"d\"]", -1}, {"[\"abc\"]", -1}, {"[\"\"]", 2},
	};
	expect_accepts("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},"
	               "\"minItems\":1,\"maxItems\":3}",
	               arr, CM_ARRAY_LEN(arr));
	static const struct accept_case en[] = {
	    {"\"red\"", 2}, {"null", 2}, {"2.5", 2}, {"true", 2}, {"\"green\"", -1}, {"3", -1},
	    {"2", 0},
	};
	expect_accepts("{\"enum\":[\"red\",null,2.5,true]}", en, CM_ARRAY_LEN(en));
	static const struct accept_case tree[] = {
	    {"{\"v\":1,\"kids\":[]}", 2},
	    {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]}]}", 2},
	    {"{\"v\":1,\"kids\":[{\"v\":2}]}", -1},
	    {"\"leaf\"", 2},
	};
	expect_accepts("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
	               "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
	               "\"required\":[\"v\",\"kids\"]}},\"anyOf\":[{\"$ref\":\"#/$defs/n\"},"
	               "{\"const\":\"leaf\"}]}",
	               tree, CM_ARRAY_LEN(tree));
	/* JSON mode: any object, nested at most 8 deep */
	engine_grammar *g = NULL;
	const char *jo = ipc_json_object_gbnf();
	CHECK_OK(engine_grammar_new(NULL, jo, strlen(jo), &g, NULL));
	if (g) {
		CHECK_EQ_INT(accepts(g, "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}"), 2);
		CHECK_EQ_INT(accepts(g, "{}"), 2);
		CHECK_EQ_INT(accepts(g, "[1]"), -1);
		CHECK_EQ_INT(accepts(g, "\"x\""), -1);
		CHECK_EQ_INT(accepts(g, "{\"a\":[[[[[[[1]]]]]]]}"), 2);   /* 8 deep */
		CHECK_EQ_INT(accepts(g, "{\"a\":[[[[[[[[1]]]]]]]]}"), -1); /* 9 */
	}
	engine_grammar_free(g);
}

/* The schema the sampling tests use: nesting, an enum, arrays, required
 * and optional properties, a $ref, anyOf; strings bounded, so random
 * draws end within the step budget. */
static const char *sample_schema =
    "{\"$defs\":{\"tag\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":6}},"
    "\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"kind\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0},"
    "\"score\":{\"type\":[\"number\",\"null\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/tag\"},\"maxItems\":3},"
    "\"owner\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
    "\"ok\":{\"type\":\"boolean\"},\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":0}},"
    "\"required\":[\"id\"],\"additionalProperties\":false},"
    "\"extra\":{\"anyOf\":[{\"const\":1},{\"type\":\"array\",\"items\":{\"type\":\"null\"},"
    "\"maxItems\":2}]}},"
    "\"required\":[\"name\",\"kind\",\"tags\",\"owner\"],\"additionalProperties\":false}";

static uint64_t rnd_state;
static uint32_t rnd(void)
{
	rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rnd_state >> 33);
}

/* Sample under g with temperature 1 until the grammar is done, an
 * end-of-generation token or max_steps; logits from the model (c) or
 * random. The text must parse and validate. */
static void sample_one(const engine_tokenizer *tok, const engine_grammar *g, engine_ctx *c,
                       uint64_t seed, int max_steps, const char *what)
{
	int nv = engine_tokenizer_n_vocab(tok);
	struct engine_sampler_params sp;
	engine_sampler_params_default(&sp);
	sp.temp = 1.0f;
	sp.top_k = 0;
	sp.top_p = 1.0f;
	sp.min_p = 0.0f;
	sp.seed = seed;
	sp.grammar = g;
	engine_sampler *s = NULL;
	struct cm_err err = {0};
	CHECK_OK(engine_sampler_new(&sp, nv, &s, &err));
	float *rl = malloc((size_t)nv * sizeof(*rl));
	int32_t *ids = malloc((size_t)(max_steps + 1) * sizeof(*ids));
	if (!s || !rl || !ids) {
		CHECK(!"out of memory");
		goto out;
	}
	rnd_state = seed * 0x9e3779b97f4a7c15ull + 1;
	int n = 0, pos = 0;
	int32_t last = engine_tokenizer_bos(tok);
	bool done = false;
	for (int step = 0; step < max_steps && !done; step++) {
		const float *logits = rl;
		if (c) {
			if (engine_eval(c, &last, 1, pos++, &err) != 0) {
				CHECK_MSG(0, "%s", err.msg);
				break;
			}
			logits = engine_get_logits_last(c);
		} else {
			for (int i = 0; i < nv; i++)
				rl[i] = (float)(rnd() % 8000) / 1000.0f;
		}
		int32_t id = engine_sampler_sample(s, logits);
		if (engine_tokenizer_is_eog(tok, id))
			break;
		CHECK_EQ_INT(engine_sampler_advance(s, id), 0);
		ids[n++] = last = id;
		done = engine_sampler_grammar_done(s);
	}
	CHECK_MSG(done, "%s seed %llu: not done after %d tokens", what, (unsigned long long)seed,
	          n);
	char *text = NULL;
	CHECK_OK(engine_detokenize(tok, ids, n, false, &text, &err));
	char why[120] = "";
	CHECK_MSG(text && sc_check_text(sample_schema, text, why, sizeof(why)),
	          "%s seed %llu: %s: %s", what, (unsigned long long)seed, why, text ? text : "");
	free(text);
out:
	free(ids);
	free(rl);
	engine_sampler_free(s);
}

static engine_grammar *compile_for(const engine_tokenizer *tok, const char *schema)
{
	struct cm_err err = {0};
	int rc;
	char *g = conv(schema, &rc, &err);
	engine_grammar *eg = NULL;
	if (g && engine_grammar_new(tok, g, strlen(g), &eg, &err) != 0)
		CHECK_MSG(0, "%s", err.msg);
	cm_free(g);
	return eg;
}

static void sample_vocab(const char *file)
{
	const char *path = test_data_path(file);
	if (!test_file_exists(path)) {
		TEST_SKIP_DATA("%s not found (set EDGELM_TESTDATA)", path);
		return;
	}
	engine_tokenizer *tok = NULL;
	struct cm_err err = {0};
	int r = engine_tokenizer_load(path, &tok, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r)
		return;
	engine_grammar *g = compile_for(tok, sample_schema);
	for (uint64_t seed = 1; g && seed <= VOCAB_SEEDS; seed++)
		sample_one(tok, g, NULL, seed, 600, file);
	engine_grammar_free(g);
	engine_tokenizer_free(tok);
}

static void test_sample_llama_spm(void)
{
	sample_vocab("vocab/ggml-vocab-llama-spm.gguf");
}

static void test_sample_qwen2(void)
{
	sample_vocab("vocab/ggml-vocab-qwen2.gguf");
}

/* Real logits: stories260K (a model of children's stories, not of JSON)
 * held to the schema, 20 seeds at temperature 1. */
static void test_sample_stories260k(void)
{
	const char *path = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(path)) {
		TEST_SKIP_DATA("%s not found (set EDGELM_TESTDATA)", path);
		return;
	}
	struct engine_params mp = {.n_threads = 1};
	engine_model *m = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(path, &mp, &m, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (r)
		return;
	const engine_tokenizer *tok = engine_model_tokenizer(m);
	engine_grammar *g = compile_for(tok, sample_schema);
	engine_ctx *c = NULL;
	struct engine_ctx_params cp = {.n_ctx = 512, .n_seq = 1};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	for (uint64_t seed = 1; g && c && seed <= 20; seed++) {
		engine_seq_truncate(c, 0, 0);
		sample_one(tok, g, c, seed, 500, "stories260K");
	}
	engine_ctx_free(c);
	engine_grammar_free(g);
	engine_model_free(m);
}

/* A grammar does not take an overlong UTF-8 form for the character it
 * stands for (C1 BB is not '{'): byte-fallback vocabularies have tokens
 * for such bytes, and text made of them is no JSON. */
static void test_overlong_utf8(void)
{
	engine_grammar *g = compile("{\"type\":\"object\",\"properties\":{\"e\":{}}}");
	if (!g)
		return;
	CHECK_EQ_INT(accepts(g, "\xc1\xbb\"e\":1}"), -1);
	CHECK_EQ_INT(accepts(g, "{\"\xe0\x81\xa5\":1}"), -1);
	CHECK_EQ_INT(accepts(g, "{\"e\":\"\xed\xa0\x80\"}"), -1); /* a surrogate */
	CHECK_EQ_INT(accepts(g, "{\"e\":\"\xe0\xa4\x95\"}"), 2);  /* U+0915 */
	engine_grammar_free(g);
}

/* The validator is not vacuous: it refuses what the schema refuses. */
static void test_validator(void)
{
	static const char *bad[] = {
	    "{\"name\":\"x\",\"kind\":\"cow\",\"tags\":[],\"owner\":{\"id\":1}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1.5}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[\"\"],\"owner\":{\"id\":1}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[\"a\",\"b\",\"c\",\"d\"],\"owner\":{\"id\":1}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[],\"owner\":{}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1,\"z\":0}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1},\"extra\":2}",
	    "{\"name\":\"0123456789abc\",\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1}}",
	    "{\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1},\"more\":1}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"age\":-1,\"tags\":[],\"owner\":{\"id\":1}}",
	    "{\"name\":\"x\",\"kind\":\"cat\",\"tags\":[],\"owner\":{\"id\":1,\"n\":0}}",
	    "{\"name\":\"x\",",
	};
	char why[128];
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++)
		CHECK_MSG(!sc_check_text(sample_schema, bad[i], why, sizeof(why)), "%s", bad[i]);
	CHECK(sc_check_text(sample_schema,
	                    "{\"name\":\"\xc3\xa9\",\"kind\":\"dog\",\"age\":3,\"score\":null,"
	                    "\"tags\":[\"a\"],\"owner\":{\"id\":1,\"ok\":true},\"extra\":[null]}",
	                    why, sizeof(why)));
}

int main(void)
{
	TEST_RUN(test_primitives);
	TEST_RUN(test_any);
	TEST_RUN(test_whitespace_bounded);
	TEST_RUN(test_object);
	TEST_RUN(test_array);
	TEST_RUN(test_string_lengths);
	TEST_RUN(test_enum_const);
	TEST_RUN(test_any_of_and_refs);
	TEST_RUN(test_names_do_not_collide);
	TEST_RUN(test_long_names);
	TEST_RUN(test_refusals);
	TEST_RUN(test_bounds);
	TEST_RUN(test_out_of_memory);
	TEST_RUN(test_grammars_accept);
	TEST_RUN(test_validator);
	TEST_RUN(test_overlong_utf8);
	TEST_RUN(test_sample_llama_spm);
	TEST_RUN(test_sample_qwen2);
	TEST_RUN(test_sample_stories260k);
	return test_finish();
}
