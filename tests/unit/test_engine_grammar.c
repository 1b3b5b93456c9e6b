/* tests/unit/test_engine_grammar.c: GBNF grammars (docs/grammar.md): each
 * construct accepting and refusing text at the code point level, and each
 * class of error with its line and column. */
#include "engine/grammar_impl.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* -1: refused on the way, 0: a valid prefix only, 1: a complete match. */
static int match(const char *gbnf, const char *text, size_t n)
{
	engine_grammar *g = NULL;
	struct cm_err err = {0};
	int r = engine_grammar_new(NULL, gbnf, strlen(gbnf), &g, &err);
	CHECK_MSG(r == 0, "%s: %s", gbnf, err.msg);
	if (r)
		return -2;
	struct grammar_state *st = NULL;
	CHECK_OK(grammar_state_new(g, &st, &err));
	int res = -1;
	if (grammar_state_feed(st, text, n) == 0)
		res = grammar_state_accepting(st) ? 1 : 0;
	grammar_state_free(st);
	engine_grammar_free(g);
	return res;
}

struct mcase {
	const char *gbnf, *text;
	int want;
};

static void test_constructs(void)
{
	static const struct mcase cases[] = {
	    /* literals and escapes */
	    {"root ::= \"abc\"", "abc", 1},
	    {"root ::= \"abc\"", "ab", 0},
	    {"root ::= \"abc\"", "abd", -1},
	    {"root ::= \"abc\"", "abcd", -1},
	    {"root ::= \"\"", "", 1},
	    {"root ::= \"a\\n\\t\\\"\\\\\"", "a\n\t\"\\", 1},
	    {"root ::= \"\\x41\\u00e9\\U0001F600\"", "A\xc3\xa9\xf0\x9f\x98\x80", 1},
	    {"root ::= \"\xc3\xa9t\xc3\xa9\"", "\xc3\xa9t\xc3\xa9", 1},
	    {"root ::= \"\\r\\[\\]\"", "\r[]", 1},
	    /* classes */
	    {"root ::= [a-z0-9_]", "q", 1},
	    {"root ::= [a-z0-9_]", "_", 1},
	    {"root ::= [a-z0-9_]", "7", 1},
	    {"root ::= [a-z0-9_]", "A", -1},
	    {"root ::= [^a-z\"]", "A", 1},
	    {"root ::= [^a-z\"]", "q", -1},
	    {"root ::= [^a-z\"]", "\"", -1},
	    {"root ::= [^a-z\"]", "\xc3\xa9", 1},
	    {"root ::= [\\x00-\\x1f]", "\x1f", 1},
	    {"root ::= [a-]", "-", 1},
	    {"root ::= [\xc3\xa0-\xc3\xbf]", "\xc3\xa9", 1},
	    {"root ::= [\xc3\xa0-\xc3\xbf]", "\xc3\x80", -1},
	    {"root ::= .", "\xe2\x82\xac", 1},
	    {"root ::= . .", "x", 0},
	    /* alternation and grouping */
	    {"root ::= \"a\" | \"b\" | \"cd\"", "cd", 1},
	    {"root ::= \"a\" | \"b\" | \"cd\"", "c", 0},
	    {"root ::= \"a\" | \"b\" | \"cd\"", "e", -1},
	    {"root ::= \"x\" (\"a\" | \"b\") \"y\"", "xby", 1},
	    {"root ::= \"x\" (\"a\" | \"b\") \"y\"", "xy", -1},
	    {"root ::= (\"a\" (\"b\" | \"c\"))", "ac", 1},
	    {"root ::= \"a\" ()", "a", 1},
	    /* repetition */
	    {"root ::= \"a\"*", "", 1},
	    {"root ::= \"a\"*", "aaaa", 1},
	    {"root ::= \"a\"+", "", 0},
	    {"root ::= \"a\"+", "aaa", 1},
	    {"root ::= \"a\"? \"b\"", "b", 1},
	    {"root ::= \"a\"? \"b\"", "ab", 1},
	    {"root ::= \"a\"? \"b\"", "aab", -1},
	    {"root ::= \"ab\"*", "abab", 1},
	    {"root ::= \"ab\"*", "aba", 0},
	    {"root ::= [0-9]{3}", "123", 1},
	    {"root ::= [0-9]{3}", "12", 0},
	    {"root ::= [0-9]{3}", "1234", -1},
	    {"root ::= [0-9]{2,}", "1", 0},
	    {"root ::= [0-9]{2,}", "123456", 1},
	    {"root ::= [0-9]{1,3}", "123", 1},
	    {"root ::= [0-9]{1,3}", "1234", -1},
	    {"root ::= [0-9]{0,2} \"x\"", "x", 1},
	    {"root ::= [0-9]{0,2} \"x\"", "12x", 1},
	    {"root ::= [0-9]{ 2 , 3 }", "12", 1},
	    {"root ::= (\"a\" | \"b\"){2}", "ba", 1},
	    /* rules, references, recursion, comments, multi-line rules */
	    {"root ::= item (\",\" item)*\nitem ::= [a-z]+", "ab,c,de", 1},
	    {"root ::= item (\",\" item)*\nitem ::= [a-z]+", "ab,,c", -1},
	    {"root ::= \"(\" root \")\" | \"x\"", "((x))", 1},
	    {"root ::= \"(\" root \")\" | \"x\"", "((x)", 0},
	    {"# a comment\nroot ::= a # another\n\na ::= \"q\" # end", "q", 1},
	    {"root ::=\n  \"a\" (\n    \"b\"\n  | \"c\"\n  )", "ac", 1},
	    {"root ::= \"a\"\n  | \"b\"\n\n  | \"c\"", "c", 1},
	    {"root ::= \"a\" |\n  \"b\"", "b", 1},
	    {"root ::= x\nx ::= y \"!\"\ny ::= \"\" | \"y\"", "!", 1},
	    {"root ::= list\nlist ::= \"[\" (elem (\",\" elem)*)? \"]\"\nelem ::= list | [0-9]",
	     "[1,[2,[]],3]", 1},
	    {"root ::= a\r\na ::= \"z\"\r\n", "z", 1},
	    {"root-rule ::= \"k\"\nroot ::= root-rule", "k", 1},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		int got = match(cases[i].gbnf, cases[i].text, strlen(cases[i].text));
		CHECK_MSG(got == cases[i].want, "case %zu: %s on \"%s\": %d, want %d", i,
		          cases[i].gbnf, cases[i].text, got, cases[i].want);
	}
}

/* A character may arrive a byte at a time (tokens split UTF-8). */
static void test_partial_utf8(void)
{
	const char *gbnf = "root ::= [\xc3\xa0-\xc3\xbf] \"\xe2\x82\xac\"";
	engine_grammar *g = NULL;
	struct grammar_state *st = NULL;
	CHECK_OK(engine_grammar_new(NULL, gbnf, strlen(gbnf), &g, NULL));
	CHECK_OK(grammar_state_new(g, &st, NULL));
	CHECK_OK(grammar_state_feed(st, "\xc3", 1));
	CHECK(!grammar_state_accepting(st));
	CHECK_OK(grammar_state_feed(st, "\xa9\xe2", 2));
	CHECK_OK(grammar_state_feed(st, "\x82", 1));
	CHECK(!grammar_state_accepting(st));
	CHECK_EQ_INT(grammar_state_feed(st, "\x83", 1), -EINVAL); /* U+20AC, not U+20C3 */
	CHECK_OK(grammar_state_feed(st, "\xac", 1));
	CHECK(grammar_state_accepting(st));
	CHECK(grammar_state_done(st));
	grammar_state_reset(st);
	CHECK_EQ_INT(grammar_state_feed(st, "\xc3\x80", 2), -EINVAL); /* below the range */
	CHECK_EQ_INT(grammar_state_feed(st, "\xc2", 1), -EINVAL);     /* no completion fits */
	CHECK_EQ_INT(grammar_state_feed(st, "\xa9", 1), -EINVAL);     /* a stray continuation */
	CHECK_EQ_INT(grammar_state_feed(st, "a", 1), -EINVAL);
	grammar_state_free(st);
	engine_grammar_free(g);
}

struct ecase {
	const char *gbnf, *msg;
};

static void test_errors(void)
{
	static const struct ecase cases[] = {
	    {"root ::= foo", "line 1, column 10: undefined rule 'foo'"},
	    {"foo ::= \"a\"", "no rule 'root'"},
	    {"", "no rule 'root'"},
	    {"root ::= \"a\\q\"", "line 1, column 12: bad escape '\\q'"},
	    {"root ::= \"\\x4\"", "bad escape: '\\x' needs 2 hex digits"},
	    {"root ::= \"\\U00110000\"", "beyond U+10FFFF"},
	    {"root ::= (\"a\"", "line 1, column 10: '(' without its ')'"},
	    {"root ::= \"a\")", "line 1, column 13: ')' without its '('"},
	    {"root ::= \"abc", "unterminated string literal"},
	    {"root ::= [abc", "unterminated character class"},
	    {"root ::= []", "empty character class"},
	    {"root ::= [z-a]", "range end"},
	    {"root ::= x\nx ::= x \"a\" | \"b\"", "line 2, column 1: rule 'x' can reach itself"},
	    {"root ::= a\na ::= b? a \"c\"\nb ::= \"b\"", "rule 'a' can reach itself"},
	    {"root ::= (\"a\"?)*", "can reach itself"},
	    {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' defined twice"},
	    {"root = \"a\"", "line 1, column 6: expected '::='"},
	    {"::= \"a\"", "expected a rule name"},
	    {"root ::= *", "nothing before '*'"},
	    {"root ::= \"a\"{2,1}", "max below min"},
	    {"root ::= \"a\"{x}", "expected a number"},
	    {"root ::= \"a\"{1000000}", "repetition count above"},
	    {"root ::= \"a\" ; \"b\"", "line 1, column 14: unexpected ';'"},
	    {"root ::= \"\xff\"", "invalid UTF-8"},
	    {"root ::= \"a\"\n\n   bad ::= x y", "line 3, column 12: undefined rule 'x'"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		engine_grammar *g = NULL;
		struct cm_err err = {0};
		int r = engine_grammar_new(NULL, cases[i].gbnf, strlen(cases[i].gbnf), &g, &err);
		CHECK_MSG(r == -EINVAL, "case %zu: %s: %d", i, cases[i].gbnf, r);
		CHECK(g == NULL);
		CHECK_MSG(strstr(err.msg, cases[i].msg) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
		          err.msg, cases[i].msg);
		engine_grammar_free(g);
	}
	/* deep nesting and huge repetitions are refused, not expanded */
	char deep[3000];
	size_t k = 0;
	k += (size_t)snprintf(deep, sizeof(deep), "root ::= ");
	for (int i = 0; i < 1000; i++)
		deep[k++] = '(';
	deep[k] = '\0';
	engine_grammar *g = NULL;
	struct cm_err err = {0};
	CHECK_EQ_INT(engine_grammar_new(NULL, deep, k, &g, &err), -EINVAL);
	CHECK(strstr(err.msg, "nested deeper") != NULL);
	const char *big = "root ::= \"0123456789012345678901234567890123456789\"{100000}";
	CHECK_EQ_INT(engine_grammar_new(NULL, big, strlen(big), &g, &err), -EINVAL);
	CHECK_MSG(strstr(err.msg, "too large") != NULL, "%s", err.msg);
	/* nested repetitions stay small: a group is one reference */
	const char *nest = "root ::= ((\"ab\"{1000}){1000}){100}";
	CHECK_OK(engine_grammar_new(NULL, nest, strlen(nest), &g, &err));
	engine_grammar_free(g);
}

int main(void)
{
	TEST_RUN(test_constructs);
	TEST_RUN(test_partial_utf8);
	TEST_RUN(test_errors);
	return test_finish();
}
