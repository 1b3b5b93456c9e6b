/* tests/unit/test_ipc_json_schema.c: JSON Schema to GBNF (ipc/json_schema.c):
 * the rules each construct makes, and the refusals, each naming the JSON
 * pointer of the part refused. */
#include "ipc/json_schema.h"
#include "tests/test.h"

#include <string.h>

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
    {"{\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0}}}", -ENOTSUP,
     "#/properties/n/minimum: "},
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
	TEST_RUN(test_refusals);
	TEST_RUN(test_bounds);
	TEST_RUN(test_out_of_memory);
	return test_finish();
}
