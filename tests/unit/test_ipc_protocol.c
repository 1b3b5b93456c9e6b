/* tests/unit/test_ipc_protocol.c: the request parser against a table of
 * malformed and hostile messages (each must give its exact error code),
 * valid requests parsed into exact structs, encode/decode round trips of
 * requests and of every reply, and every row of the request field table
 * (ipc/protocol_fields.c): round trips per op, refusal by the other ops,
 * its bounds, and its docs.
 *
 * `test_ipc_protocol --doc < docs/protocol.md` prints the file with its
 * generated field tables regenerated (`make docs`,
 * tests/integration/protocol_doc.sh); `--fields` lists "OP FIELD" for every
 * field an op accepts. */
#include "ipc/ipc.h"
#include "ipc/protocol_impl.h"
#include "tests/test.h"

#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>

/* ---- helpers -------------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t len, cap;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

static void sb_rep(struct sbuf *b, const char *s, size_t times)
{
	size_t n = strlen(s);
	for (size_t i = 0; i < times; i++)
		sb_add(b, s, n);
}

/* Parse and return the ipc_errcode (IPC_ERR_NONE on success). */
static enum ipc_errcode parse_code(const char *json, size_t len, const struct ipc_limits *lim,
                                   char *msg, size_t msgcap)
{
	struct ipc_request *r = NULL;
	struct cm_err err = {0};
	int rc = ipc_request_parse(json, len, lim, &r, &err);
	if (msg)
		snprintf(msg, msgcap, "%s", err.msg);
	if (rc == 0) {
		ipc_request_free(r);
		return IPC_ERR_NONE;
	}
	if (r)
		return IPC_ERR_COUNT; /* must not hand out a request on failure */
	if (err.code != rc || !err.msg[0])
		return IPC_ERR_COUNT; /* every failure says what went wrong */
	return ipc_errcode_from_errno(rc);
}

/* ---- the hostile corpus --------------------------------------------------- */

struct bad_case {
	const char *name;
	const char *json; /* NUL-terminated unless len is given */
	size_t len;
	enum ipc_errcode want;
};

#define GEN(extra) "{\"v\":1,\"op\":\"generate\",\"prompt\":\"hi\"" extra "}"

static const struct bad_case bad_cases[] = {
    /* not JSON */
    {"empty", "", 0, IPC_ERR_INVALID_JSON},
    {"whitespace only", "   \n\t ", 0, IPC_ERR_INVALID_JSON},
    {"lone brace", "{", 0, IPC_ERR_INVALID_JSON},
    {"truncated object", "{\"op\":\"health\"", 0, IPC_ERR_INVALID_JSON},
    {"truncated string", "{\"op\":\"gener", 0, IPC_ERR_INVALID_JSON},
    {"trailing garbage", "{\"op\":\"health\"}}", 0, IPC_ERR_INVALID_JSON},
    {"two objects", "{\"op\":\"health\"}{\"op\":\"info\"}", 0, IPC_ERR_INVALID_JSON},
    {"trailing comma", "{\"op\":\"health\",}", 0, IPC_ERR_INVALID_JSON},
    {"single quotes", "{'op':'health'}", 0, IPC_ERR_INVALID_JSON},
    {"bare word", "health", 0, IPC_ERR_INVALID_JSON},
    {"array at top", "[{\"op\":\"health\"}]", 0, IPC_ERR_INVALID_JSON},
    {"string at top", "\"health\"", 0, IPC_ERR_INVALID_JSON},
    {"null at top", "null", 0, IPC_ERR_INVALID_JSON},
    {"number at top", "42", 0, IPC_ERR_INVALID_JSON},
    {"NaN literal", GEN(",\"temperature\":NaN"), 0, IPC_ERR_INVALID_JSON},
    {"Infinity literal", GEN(",\"temperature\":Infinity"), 0, IPC_ERR_INVALID_JSON},
    {"-Infinity literal", GEN(",\"temperature\":-Infinity"), 0, IPC_ERR_INVALID_JSON},
    {"1e999 overflows a double", GEN(",\"temperature\":1e999"), 0, IPC_ERR_INVALID_JSON},
    {"integer beyond int64", GEN(",\"max_tokens\":99999999999999999999"), 0, IPC_ERR_INVALID_JSON},
    {"hex number", GEN(",\"max_tokens\":0x10"), 0, IPC_ERR_INVALID_JSON},
    {"leading plus", GEN(",\"max_tokens\":+5"), 0, IPC_ERR_INVALID_JSON},
    {"duplicate key", "{\"op\":\"health\",\"op\":\"info\"}", 0, IPC_ERR_INVALID_JSON},
    {"duplicate prompt", GEN(",\"prompt\":\"again\""), 0, IPC_ERR_INVALID_JSON},
    {"invalid UTF-8 bytes", "{\"op\":\"generate\",\"prompt\":\"\xff\xfe\"}", 0,
     IPC_ERR_INVALID_JSON},
    {"overlong UTF-8", "{\"op\":\"generate\",\"prompt\":\"\xc0\xaf\"}", 0, IPC_ERR_INVALID_JSON},
    {"UTF-16 surrogate as UTF-8", "{\"op\":\"generate\",\"prompt\":\"\xed\xa0\x80\"}", 0,
     IPC_ERR_INVALID_JSON},
    {"lone surrogate escape", "{\"op\":\"generate\",\"prompt\":\"\\ud800\"}", 0,
     IPC_ERR_INVALID_JSON},
    {"bad escape", "{\"op\":\"generate\",\"prompt\":\"\\x41\"}", 0, IPC_ERR_INVALID_JSON},
    {"raw control character", "{\"op\":\"generate\",\"prompt\":\"a\x01z\"}", 0,
     IPC_ERR_INVALID_JSON},
    {"raw NUL byte outside strings", "{\"op\":\"health\"}\0{}", 16, IPC_ERR_INVALID_JSON},
    {"UTF-8 BOM", "\xef\xbb\xbf{\"op\":\"health\"}", 0, IPC_ERR_INVALID_JSON},
    /* version and op */
    {"version 2", "{\"v\":2,\"op\":\"health\"}", 0, IPC_ERR_UNSUPPORTED_VERSION},
    {"version 0", "{\"v\":0,\"op\":\"health\"}", 0, IPC_ERR_UNSUPPORTED_VERSION},
    {"version as string", "{\"v\":\"1\",\"op\":\"health\"}", 0, IPC_ERR_INVALID_FIELD},
    {"version as real", "{\"v\":1.0,\"op\":\"health\"}", 0, IPC_ERR_INVALID_FIELD},
    {"no op", "{\"v\":1}", 0, IPC_ERR_INVALID_FIELD},
    {"empty object", "{}", 0, IPC_ERR_INVALID_FIELD},
    {"op is a number", "{\"op\":42}", 0, IPC_ERR_INVALID_FIELD},
    {"op is null", "{\"op\":null}", 0, IPC_ERR_INVALID_FIELD},
    {"op is an array", "{\"op\":[\"health\"]}", 0, IPC_ERR_INVALID_FIELD},
    {"unknown op", "{\"op\":\"explode\"}", 0, IPC_ERR_UNKNOWN_OP},
    {"empty op", "{\"op\":\"\"}", 0, IPC_ERR_UNKNOWN_OP},
    {"op in upper case", "{\"op\":\"HEALTH\"}", 0, IPC_ERR_UNKNOWN_OP},
    {"op with NUL", "{\"op\":\"health\\u0000x\"}", 0, IPC_ERR_UNKNOWN_OP},
    {"op with trailing space", "{\"op\":\"health \"}", 0, IPC_ERR_UNKNOWN_OP},
    /* fields of generate */
    {"generate without prompt", "{\"op\":\"generate\"}", 0, IPC_ERR_INVALID_FIELD},
    {"prompt is a number", "{\"op\":\"generate\",\"prompt\":5}", 0, IPC_ERR_INVALID_FIELD},
    {"prompt is null", "{\"op\":\"generate\",\"prompt\":null}", 0, IPC_ERR_INVALID_FIELD},
    {"prompt is an object", "{\"op\":\"generate\",\"prompt\":{}}", 0, IPC_ERR_INVALID_FIELD},
    {"prompt with NUL", "{\"op\":\"generate\",\"prompt\":\"a\\u0000b\"}", 0, IPC_ERR_INVALID_FIELD},
    {"misspelt field", GEN(",\"temprature\":0.5"), 0, IPC_ERR_INVALID_FIELD},
    {"field of another op", GEN(",\"ack\":0"), 0, IPC_ERR_INVALID_FIELD},
    {"NUL in a key", GEN(",\"stream\\u0000\":true"), 0, IPC_ERR_INVALID_JSON},
    {"max_tokens 0", GEN(",\"max_tokens\":0"), 0, IPC_ERR_INVALID_FIELD},
    {"max_tokens negative", GEN(",\"max_tokens\":-5"), 0, IPC_ERR_INVALID_FIELD},
    {"max_tokens real", GEN(",\"max_tokens\":1.5"), 0, IPC_ERR_INVALID_FIELD},
    {"max_tokens string", GEN(",\"max_tokens\":\"10\""), 0, IPC_ERR_INVALID_FIELD},
    {"max_tokens huge", GEN(",\"max_tokens\":9223372036854775807"), 0, IPC_ERR_INVALID_FIELD},
    {"temperature negative", GEN(",\"temperature\":-0.1"), 0, IPC_ERR_INVALID_FIELD},
    {"temperature 1e308", GEN(",\"temperature\":1e308"), 0, IPC_ERR_INVALID_FIELD},
    {"temperature string NaN", GEN(",\"temperature\":\"NaN\""), 0, IPC_ERR_INVALID_FIELD},
    {"temperature bool", GEN(",\"temperature\":true"), 0, IPC_ERR_INVALID_FIELD},
    {"top_p above 1", GEN(",\"top_p\":1.5"), 0, IPC_ERR_INVALID_FIELD},
    {"min_p negative", GEN(",\"min_p\":-1e-9"), 0, IPC_ERR_INVALID_FIELD},
    {"top_k negative", GEN(",\"top_k\":-1"), 0, IPC_ERR_INVALID_FIELD},
    {"repeat_penalty 0", GEN(",\"repeat_penalty\":0"), 0, IPC_ERR_INVALID_FIELD},
    {"frequency_penalty 3", GEN(",\"frequency_penalty\":3"), 0, IPC_ERR_INVALID_FIELD},
    {"presence_penalty -2.5", GEN(",\"presence_penalty\":-2.5"), 0, IPC_ERR_INVALID_FIELD},
    {"penalty_last_n -2", GEN(",\"penalty_last_n\":-2"), 0, IPC_ERR_INVALID_FIELD},
    {"seed negative", GEN(",\"seed\":-1"), 0, IPC_ERR_INVALID_FIELD},
    {"seed real", GEN(",\"seed\":1.0"), 0, IPC_ERR_INVALID_FIELD},
    {"stream as string", GEN(",\"stream\":\"yes\""), 0, IPC_ERR_INVALID_FIELD},
    {"stream as 1", GEN(",\"stream\":1"), 0, IPC_ERR_INVALID_FIELD},
    {"deadline negative", GEN(",\"deadline_ms\":-1"), 0, IPC_ERR_INVALID_FIELD},
    {"deadline over a day", GEN(",\"deadline_ms\":86400001"), 0, IPC_ERR_INVALID_FIELD},
    {"priority 11", GEN(",\"priority\":11"), 0, IPC_ERR_INVALID_FIELD},
    {"stop is a string", GEN(",\"stop\":\"\\n\""), 0, IPC_ERR_INVALID_FIELD},
    {"stop holds a number", GEN(",\"stop\":[1]"), 0, IPC_ERR_INVALID_FIELD},
    {"stop holds an empty string", GEN(",\"stop\":[\"\"]"), 0, IPC_ERR_INVALID_FIELD},
    {"stop holds NUL", GEN(",\"stop\":[\"a\\u0000\"]"), 0, IPC_ERR_INVALID_FIELD},
    {"stop holds nested array", GEN(",\"stop\":[[\"x\"]]"), 0, IPC_ERR_INVALID_FIELD},
    {"id with a space", GEN(",\"id\":\"a b\""), 0, IPC_ERR_INVALID_FIELD},
    {"id empty", GEN(",\"id\":\"\""), 0, IPC_ERR_INVALID_FIELD},
    {"id is a number", GEN(",\"id\":7"), 0, IPC_ERR_INVALID_FIELD},
    {"id with a slash", GEN(",\"id\":\"../etc\""), 0, IPC_ERR_INVALID_FIELD},
    /* chat */
    {"chat without messages", "{\"op\":\"chat\"}", 0, IPC_ERR_INVALID_FIELD},
    {"chat with prompt", "{\"op\":\"chat\",\"prompt\":\"x\",\"messages\":[]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"messages empty", "{\"op\":\"chat\",\"messages\":[]}", 0, IPC_ERR_INVALID_FIELD},
    {"messages an object", "{\"op\":\"chat\",\"messages\":{\"role\":\"user\"}}", 0,
     IPC_ERR_INVALID_FIELD},
    {"message a string", "{\"op\":\"chat\",\"messages\":[\"hi\"]}", 0, IPC_ERR_INVALID_FIELD},
    {"message role unknown",
     "{\"op\":\"chat\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"message role a number", "{\"op\":\"chat\",\"messages\":[{\"role\":1,\"content\":\"x\"}]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"message without content", "{\"op\":\"chat\",\"messages\":[{\"role\":\"user\"}]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"message content null",
     "{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":null}]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"message extra field",
     "{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"b\"}]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"message duplicate role",
     "{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"\"}]}", 0,
     IPC_ERR_INVALID_JSON},
    /* poll, cancel, tokens */
    {"poll without id", "{\"op\":\"poll\",\"ack\":0}", 0, IPC_ERR_INVALID_FIELD},
    {"poll ack negative", "{\"op\":\"poll\",\"id\":\"s1\",\"ack\":-1}", 0, IPC_ERR_INVALID_FIELD},
    {"poll ack real", "{\"op\":\"poll\",\"id\":\"s1\",\"ack\":1.5}", 0, IPC_ERR_INVALID_FIELD},
    {"poll wait an hour", "{\"op\":\"poll\",\"id\":\"s1\",\"wait_ms\":3600000}", 0,
     IPC_ERR_INVALID_FIELD},
    {"poll with prompt", "{\"op\":\"poll\",\"id\":\"s1\",\"prompt\":\"x\"}", 0,
     IPC_ERR_INVALID_FIELD},
    {"cancel without id", "{\"op\":\"cancel\"}", 0, IPC_ERR_INVALID_FIELD},
    {"cancel id null", "{\"op\":\"cancel\",\"id\":null}", 0, IPC_ERR_INVALID_FIELD},
    {"tokenize without text", "{\"op\":\"tokenize\"}", 0, IPC_ERR_INVALID_FIELD},
    {"tokenize add_special 1", "{\"op\":\"tokenize\",\"text\":\"a\",\"add_special\":1}", 0,
     IPC_ERR_INVALID_FIELD},
    {"detokenize without ids", "{\"op\":\"detokenize\"}", 0, IPC_ERR_INVALID_FIELD},
    {"detokenize negative id", "{\"op\":\"detokenize\",\"ids\":[1,-2]}", 0, IPC_ERR_INVALID_FIELD},
    {"detokenize id 2^31", "{\"op\":\"detokenize\",\"ids\":[2147483648]}", 0,
     IPC_ERR_INVALID_FIELD},
    {"detokenize string id", "{\"op\":\"detokenize\",\"ids\":[\"1\"]}", 0, IPC_ERR_INVALID_FIELD},
    {"detokenize real id", "{\"op\":\"detokenize\",\"ids\":[1.0]}", 0, IPC_ERR_INVALID_FIELD},
    {"health with a field", "{\"op\":\"health\",\"verbose\":true}", 0, IPC_ERR_INVALID_FIELD},
    {"info with id", "{\"op\":\"info\",\"id\":\"x\"}", 0, IPC_ERR_INVALID_FIELD},
};

static void test_bad_table(void)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(bad_cases); i++) {
		const struct bad_case *c = &bad_cases[i];
		size_t len = c->len ? c->len : strlen(c->json);
		char msg[256];
		enum ipc_errcode got = parse_code(c->json, len, NULL, msg, sizeof(msg));
		CHECK_MSG(got == c->want, "case '%s': got %s (%s), want %s", c->name,
		          got < IPC_ERR_COUNT ? ipc_errcode_name(got) : "contract violation", msg,
		          ipc_errcode_name(c->want));
	}
	CHECK(CM_ARRAY_LEN(bad_cases) >= 40);
}

/* Cases that need building: sizes, depth, counts. */
static void test_bad_built(void)
{
	struct sbuf b = {0};
	char msg[256];
	int n = 0;

	/* 10000 levels of arrays: refused by the scan, never reaches jansson */
	sb_rep(&b, "[", 10000);
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, msg, sizeof(msg)), IPC_ERR_INVALID_JSON);
	CHECK(strstr(msg, "nested") != NULL);
	b.len = 0, n++;

	/* 100000 levels of objects, closed properly */
	sb_rep(&b, "{\"a\":", 100000);
	sb_str(&b, "1");
	sb_rep(&b, "}", 100000);
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_JSON);
	b.len = 0, n++;

	/* depth 33 inside a field of a valid request */
	sb_str(&b, "{\"op\":\"health\",\"x\":");
	sb_rep(&b, "[", 32);
	sb_rep(&b, "]", 32);
	sb_str(&b, "}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_JSON);
	b.len = 0, n++;

	/* depth exactly 32 passes the scan; the field is then unknown */
	sb_str(&b, "{\"op\":\"health\",\"x\":");
	sb_rep(&b, "[", 31);
	sb_rep(&b, "]", 31);
	sb_str(&b, "}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_FIELD);
	b.len = 0, n++;

	/* brackets inside a string do not count as nesting */
	sb_str(&b, "{\"op\":\"generate\",\"prompt\":\"\\\"");
	sb_rep(&b, "[{", 5000);
	sb_str(&b, "\\\\\"}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, msg, sizeof(msg)), IPC_ERR_NONE);
	b.len = 0, n++;

	/* a 100 MB message: refused by size before any scan */
	sb_str(&b, "{\"op\":\"generate\",\"prompt\":\"");
	size_t big = 100u << 20;
	b.p = realloc(b.p, big + 64);
	memset(b.p + b.len, 'a', big);
	b.len += big;
	memcpy(b.p + b.len, "\"}", 3);
	b.len += 2;
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_TOO_LARGE);
	b.len = 0, n++;

	/* a 2 MiB prompt: over the default message limit (1216 KiB) */
	sb_str(&b, "{\"op\":\"generate\",\"prompt\":\"");
	sb_rep(&b, "x", 2u << 20);
	sb_str(&b, "\"}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_TOO_LARGE);
	/* ... and with a larger message limit, over the prompt limit */
	struct ipc_limits lim = {.max_msg_bytes = 4u << 20};
	CHECK_EQ_INT(parse_code(b.p, b.len, &lim, NULL, 0), IPC_ERR_PROMPT_TOO_LONG);
	b.len = 0, n++;

	/* a huge key */
	sb_str(&b, "{\"op\":\"health\",\"");
	sb_rep(&b, "k", 100000);
	sb_str(&b, "\":1}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, msg, sizeof(msg)), IPC_ERR_INVALID_FIELD);
	CHECK(strlen(msg) < 200);
	b.len = 0, n++;

	/* a prompt with 10^6 stop strings (4 MB): too large for the default
	 * message limit, too many values for the default scan, and too many stop
	 * strings when both limits are raised */
	sb_str(&b, "{\"op\":\"generate\",\"prompt\":\"p\",\"stop\":[\"s\"");
	sb_rep(&b, ",\"s\"", 999999);
	sb_str(&b, "]}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_TOO_LARGE);
	lim = (struct ipc_limits){.max_msg_bytes = 16u << 20};
	CHECK_EQ_INT(parse_code(b.p, b.len, &lim, NULL, 0), IPC_ERR_TOO_LARGE);
	lim.max_values = 4u << 20;
	CHECK_EQ_INT(parse_code(b.p, b.len, &lim, msg, sizeof(msg)), IPC_ERR_INVALID_FIELD);
	CHECK(strstr(msg, "stop") != NULL);
	b.len = 0, n++;

	/* 17 stop strings, and one of 257 bytes */
	sb_str(&b, "{\"op\":\"generate\",\"prompt\":\"p\",\"stop\":[\"s\"");
	sb_rep(&b, ",\"s\"", 16);
	sb_str(&b, "]}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_FIELD);
	b.len = 0, n++;
	sb_str(&b, "{\"op\":\"generate\",\"prompt\":\"p\",\"stop\":[\"");
	sb_rep(&b, "s", 257);
	sb_str(&b, "\"]}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_FIELD);
	b.len = 0, n++;

	/* 300000 ids in under 1 MiB: too many JSON values */
	sb_str(&b, "{\"op\":\"detokenize\",\"ids\":[0");
	sb_rep(&b, ",0", 299999);
	sb_str(&b, "]}");
	CHECK(b.len < (1u << 20));
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_TOO_LARGE);
	b.len = 0, n++;

	/* 70000 ids: over max_ids */
	sb_str(&b, "{\"op\":\"detokenize\",\"ids\":[1");
	sb_rep(&b, ",1", 69999);
	sb_str(&b, "]}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_TOO_LARGE);
	b.len = 0, n++;

	/* tokenize text over the prompt limit */
	lim = (struct ipc_limits){.max_prompt_bytes = 1000};
	sb_str(&b, "{\"op\":\"tokenize\",\"text\":\"");
	sb_rep(&b, "t", 1001);
	sb_str(&b, "\"}");
	CHECK_EQ_INT(parse_code(b.p, b.len, &lim, NULL, 0), IPC_ERR_TOO_LARGE);
	b.len = 0, n++;

	/* chat contents summed over the prompt limit */
	sb_str(&b, "{\"op\":\"chat\",\"messages\":[");
	for (int i = 0; i < 3; i++) {
		sb_str(&b, i ? ",{\"role\":\"user\",\"content\":\""
		             : "{\"role\":\"user\",\"content\":\"");
		sb_rep(&b, "c", 400);
		sb_str(&b, "\"}");
	}
	sb_str(&b, "]}");
	CHECK_EQ_INT(parse_code(b.p, b.len, &lim, NULL, 0), IPC_ERR_PROMPT_TOO_LONG);
	b.len = 0, n++;

	/* 1025 chat messages */
	sb_str(&b, "{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"\"}");
	sb_rep(&b, ",{\"role\":\"user\",\"content\":\"\"}", 1024);
	sb_str(&b, "]}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_FIELD);
	b.len = 0, n++;

	/* a 65-byte id */
	sb_str(&b, "{\"op\":\"cancel\",\"id\":\"");
	sb_rep(&b, "i", 65);
	sb_str(&b, "\"}");
	CHECK_EQ_INT(parse_code(b.p, b.len, NULL, NULL, 0), IPC_ERR_INVALID_FIELD);
	b.len = 0, n++;

	/* a NULL buffer */
	CHECK_EQ_INT(parse_code(NULL, 0, NULL, NULL, 0), IPC_ERR_INVALID_JSON);
	n++;

	free(b.p);
	/* with the table: well over the 40 hostile requests the issue asks for */
	CHECK(n + (int)CM_ARRAY_LEN(bad_cases) >= 40);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "hostile requests: %zu table + %d built\n", CM_ARRAY_LEN(bad_cases),
		        n);
}

/* ---- valid requests ------------------------------------------------------- */

static struct ipc_request *parse_ok(const char *json)
{
	struct ipc_request *r = NULL;
	struct cm_err err = {0};
	int rc = ipc_request_parse(json, strlen(json), NULL, &r, &err);
	CHECK_MSG(rc == 0, "parse of %s failed: %s", json, err.msg);
	return r;
}

static void test_valid_generate_full(void)
{
	struct ipc_request *r = parse_ok(
	    "{\"v\":1,\"op\":\"generate\",\"id\":\"req-1.a:B_2\",\"prompt\":\"Once upon a time\","
	    "\"max_tokens\":64,\"temperature\":0.7,\"top_k\":20,\"top_p\":0.9,\"min_p\":0.1,"
	    "\"repeat_penalty\":1.1,\"frequency_penalty\":-0.5,\"presence_penalty\":2,"
	    "\"penalty_last_n\":-1,\"seed\":9223372036854775807,\"stop\":[\"\\n\\n\",\"The "
	    "end\"],\"stream\":true,\"deadline_ms\":5000,\"priority\":-3}");
	if (!r)
		return;
	CHECK_EQ_INT(r->op, IPC_OP_GENERATE);
	CHECK_EQ_INT(r->version, 1);
	CHECK_STREQ(r->id, "req-1.a:B_2");
	CHECK_STREQ(r->prompt, "Once upon a time");
	CHECK_EQ_INT(r->prompt_len, 16);
	const struct ipc_sampling *s = &r->sampling;
	CHECK_EQ_INT(s->set, IPC_SET_MAX_TOKENS | IPC_SET_TEMPERATURE | IPC_SET_TOP_K |
	                         IPC_SET_TOP_P | IPC_SET_MIN_P | IPC_SET_REPEAT_PENALTY |
	                         IPC_SET_FREQUENCY_PENALTY | IPC_SET_PRESENCE_PENALTY |
	                         IPC_SET_PENALTY_LAST_N | IPC_SET_SEED);
	CHECK_EQ_INT(s->max_tokens, 64);
	CHECK(s->temperature == 0.7f);
	CHECK_EQ_INT(s->top_k, 20);
	CHECK(s->top_p == 0.9f);
	CHECK(s->min_p == 0.1f);
	CHECK(s->repeat_penalty == 1.1f);
	CHECK(s->frequency_penalty == -0.5f);
	CHECK(s->presence_penalty == 2.0f);
	CHECK_EQ_INT(s->penalty_last_n, -1);
	CHECK(s->seed == 9223372036854775807ull);
	CHECK_EQ_INT(r->n_stop, 2);
	CHECK_STREQ(r->stop[0], "\n\n");
	CHECK_EQ_INT(r->stop_len[0], 2);
	CHECK_STREQ(r->stop[1], "The end");
	CHECK(r->stream);
	CHECK_EQ_INT(r->deadline_ms, 5000);
	CHECK_EQ_INT(r->priority, -3);
	CHECK(r->messages == NULL && r->n_messages == 0);
	ipc_request_free(r);
}

static void test_valid_generate_defaults(void)
{
	struct ipc_request *r = parse_ok("{\"op\":\"generate\",\"prompt\":\"\"}");
	if (!r)
		return;
	CHECK_EQ_INT(r->op, IPC_OP_GENERATE);
	CHECK(r->id == NULL);
	CHECK_STREQ(r->prompt, "");
	CHECK_EQ_INT(r->prompt_len, 0);
	CHECK_EQ_INT(r->sampling.set, 0);
	CHECK_EQ_INT(r->sampling.max_tokens, 256);
	CHECK(r->sampling.temperature == 0.8f);
	CHECK_EQ_INT(r->sampling.top_k, 40);
	CHECK(r->sampling.top_p == 0.95f);
	CHECK(r->sampling.min_p == 0.05f);
	CHECK(r->sampling.repeat_penalty == 1.0f);
	CHECK(r->sampling.frequency_penalty == 0.0f);
	CHECK(r->sampling.presence_penalty == 0.0f);
	CHECK_EQ_INT(r->sampling.penalty_last_n, 64);
	CHECK(!r->stream);
	CHECK_EQ_INT(r->n_stop, 0);
	CHECK_EQ_INT(r->deadline_ms, 0);
	CHECK_EQ_INT(r->priority, 0);
	ipc_request_free(r);

	/* integers are accepted for real fields, and unicode escapes decoded */
	r = parse_ok("{\"op\":\"generate\",\"prompt\":\"caf\\u00e9 \\ud83d\\ude00\","
	             "\"temperature\":1,\"top_p\":1,\"min_p\":0}");
	if (!r)
		return;
	CHECK_STREQ(r->prompt, "caf\xc3\xa9 \xf0\x9f\x98\x80");
	CHECK_EQ_INT(r->prompt_len, 10);
	CHECK(r->sampling.temperature == 1.0f && r->sampling.top_p == 1.0f &&
	      r->sampling.min_p == 0.0f);
	ipc_request_free(r);
}

static void test_valid_chat(void)
{
	struct ipc_request *r = parse_ok(
	    "{\"op\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
	    "{\"content\":\"Hi\",\"role\":\"user\"},{\"role\":\"assistant\",\"content\":\"\"}],"
	    "\"max_tokens\":8,\"stream\":false}");
	if (!r)
		return;
	CHECK_EQ_INT(r->op, IPC_OP_CHAT);
	CHECK_EQ_INT(r->n_messages, 3);
	CHECK_EQ_INT(r->messages[0].role, IPC_ROLE_SYSTEM);
	CHECK_STREQ(r->messages[0].content, "Be brief.");
	CHECK_EQ_INT(r->messages[0].content_len, 9);
	CHECK_EQ_INT(r->messages[1].role, IPC_ROLE_USER);
	CHECK_STREQ(r->messages[1].content, "Hi");
	CHECK_EQ_INT(r->messages[2].role, IPC_ROLE_ASSISTANT);
	CHECK_EQ_INT(r->messages[2].content_len, 0);
	CHECK_EQ_INT(r->sampling.max_tokens, 8);
	CHECK_EQ_INT(r->sampling.set, IPC_SET_MAX_TOKENS);
	CHECK(r->prompt == NULL);
	ipc_request_free(r);
}

static void test_valid_others(void)
{
	struct ipc_request *r =
	    parse_ok("{\"op\":\"poll\",\"id\":\"s-1\",\"ack\":123,\"wait_ms\":0}");
	if (r) {
		CHECK_EQ_INT(r->op, IPC_OP_POLL);
		CHECK_STREQ(r->id, "s-1");
		CHECK_EQ_INT(r->ack, 123);
		CHECK_EQ_INT(r->wait_ms, 0);
		ipc_request_free(r);
	}
	r = parse_ok("{\"op\":\"poll\",\"id\":\"s-1\"}");
	if (r) {
		CHECK_EQ_INT(r->ack, 0);
		CHECK_EQ_INT(r->wait_ms, 1000);
		ipc_request_free(r);
	}
	r = parse_ok("{\"op\":\"cancel\",\"id\":\"abc\"}");
	if (r) {
		CHECK_EQ_INT(r->op, IPC_OP_CANCEL);
		CHECK_STREQ(r->id, "abc");
		ipc_request_free(r);
	}
	r = parse_ok("{\"op\":\"tokenize\",\"text\":\"Hello world\",\"add_special\":false,"
	             "\"parse_special\":true}");
	if (r) {
		CHECK_EQ_INT(r->op, IPC_OP_TOKENIZE);
		CHECK_STREQ(r->text, "Hello world");
		CHECK_EQ_INT(r->text_len, 11);
		CHECK(!r->add_special && r->parse_special);
		ipc_request_free(r);
	}
	r = parse_ok("{\"op\":\"tokenize\",\"text\":\"x\"}");
	if (r) {
		CHECK(r->add_special && !r->parse_special);
		ipc_request_free(r);
	}
	r = parse_ok("{\"op\":\"detokenize\",\"ids\":[1,0,2147483647]}");
	if (r) {
		CHECK_EQ_INT(r->op, IPC_OP_DETOKENIZE);
		CHECK_EQ_INT(r->n_ids, 3);
		CHECK(r->ids[0] == 1 && r->ids[1] == 0 && r->ids[2] == INT32_MAX);
		ipc_request_free(r);
	}
	r = parse_ok("{\"op\":\"detokenize\",\"ids\":[]}");
	if (r) {
		CHECK_EQ_INT(r->n_ids, 0);
		ipc_request_free(r);
	}
	static const char *const simple[] = {"info", "health", "metrics"};
	static const enum ipc_op simple_op[] = {IPC_OP_INFO, IPC_OP_HEALTH, IPC_OP_METRICS};
	for (int i = 0; i < 3; i++) {
		char buf[64];
		snprintf(buf, sizeof(buf), " {\"v\" : 1 , \"op\" : \"%s\"}\n", simple[i]);
		r = parse_ok(buf);
		if (r) {
			CHECK_EQ_INT(r->op, simple_op[i]);
			ipc_request_free(r);
		}
	}
}

/* Allocation failures anywhere in parsing give `internal`, never a crash or
 * a leak (ASan checks the leak part). */
static void test_parse_alloc_failures(void)
{
	const char *json = "{\"op\":\"chat\",\"id\":\"x\",\"messages\":[{\"role\":\"user\","
	                   "\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}],"
	                   "\"stop\":[\"q\",\"r\"]}";
	int ok = 0;
	for (long n = 0; n < 40; n++) {
		struct ipc_request *r = NULL;
		struct cm_err err = {0};
		cm_alloc_fail_reset(n);
		int rc = ipc_request_parse(json, strlen(json), NULL, &r, &err);
		cm_alloc_fail_reset(-1);
		if (rc == 0) {
			ok++;
			CHECK_EQ_INT(r->n_messages, 2);
			ipc_request_free(r);
		} else {
			CHECK_EQ_INT(ipc_errcode_from_errno(rc), IPC_ERR_INTERNAL);
			CHECK(r == NULL);
		}
	}
	CHECK(ok > 0);
}

/* ---- error table ---------------------------------------------------------- */

static void test_error_table(void)
{
	for (int i = 1; i < IPC_ERR_COUNT; i++) {
		const char *n = ipc_errcode_name((enum ipc_errcode)i);
		CHECK(n && *n);
		CHECK_EQ_INT(ipc_errcode_from_name(n), i);
		int e = ipc_errcode_to_errno((enum ipc_errcode)i);
		CHECK(e < 0);
		CHECK_EQ_INT(ipc_errcode_from_errno(e), i);
		CHECK(strlen(ipc_errcode_describe((enum ipc_errcode)i)) > 5);
		for (int j = 1; j < i; j++) {
			CHECK(strcmp(n, ipc_errcode_name((enum ipc_errcode)j)) != 0);
			CHECK(e != ipc_errcode_to_errno((enum ipc_errcode)j));
		}
	}
	/* the stable strings the protocol documents */
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_INVALID_JSON), "invalid_json");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_UNKNOWN_OP), "unknown_op");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_INVALID_FIELD), "invalid_field");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_PROMPT_TOO_LONG), "prompt_too_long");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_QUEUE_FULL), "queue_full");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_DEADLINE_EXCEEDED), "deadline_exceeded");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_SHUTTING_DOWN), "shutting_down");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_NOT_FOUND), "not_found");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_TOO_LARGE), "too_large");
	CHECK_STREQ(ipc_errcode_name(IPC_ERR_INTERNAL), "internal");
	CHECK_EQ_INT(ipc_errcode_from_errno(-ENOMEM), IPC_ERR_INTERNAL);
	CHECK_EQ_INT(ipc_errcode_from_name("no_such_code"), IPC_ERR_NONE);
	CHECK_STREQ(ipc_errcode_name((enum ipc_errcode)99), "internal");
}

/* ---- round trips ---------------------------------------------------------- */

static void test_request_roundtrip(void)
{
	static const char *const inputs[] = {
	    "{\"op\":\"generate\",\"prompt\":\"x\"}",
	    "{\"op\":\"generate\",\"id\":\"r1\",\"prompt\":\"tab\\there \\u00e9\","
	    "\"max_tokens\":7,\"temperature\":0.7,\"top_k\":0,\"top_p\":0.95,\"min_p\":0.05,"
	    "\"repeat_penalty\":1.3,\"frequency_penalty\":0.1,\"presence_penalty\":-0.2,"
	    "\"penalty_last_n\":0,\"seed\":42,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
	    "\"deadline_ms\":10,\"priority\":10}",
	    "{\"op\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
	    "{\"role\":\"user\",\"content\":\"u\"}],\"temperature\":0}",
	    "{\"op\":\"poll\",\"id\":\"p\",\"ack\":9007199254740993,\"wait_ms\":60000}",
	    "{\"op\":\"cancel\",\"id\":\"c\"}",
	    "{\"op\":\"tokenize\",\"text\":\"t\",\"add_special\":false,\"parse_special\":true}",
	    "{\"op\":\"detokenize\",\"ids\":[5,6,7]}",
	    "{\"op\":\"info\"}",
	    "{\"op\":\"health\"}",
	    "{\"op\":\"metrics\"}",
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(inputs); i++) {
		struct ipc_request *a = parse_ok(inputs[i]), *b = NULL;
		if (!a)
			continue;
		char *json = NULL;
		size_t len = 0;
		CHECK_OK(ipc_request_encode(a, &json, &len, NULL));
		if (!json) {
			ipc_request_free(a);
			continue;
		}
		CHECK_EQ_INT(len, strlen(json));
		struct cm_err err = {0};
		CHECK_MSG(ipc_request_parse(json, len, NULL, &b, &err) == 0, "%s: %s", json,
		          err.msg);
		if (b) {
			CHECK_EQ_INT(a->op, b->op);
			CHECK((a->id == NULL) == (b->id == NULL));
			if (a->id)
				CHECK_STREQ(a->id, b->id);
			CHECK(a->prompt_len == b->prompt_len &&
			      (!a->prompt || memcmp(a->prompt, b->prompt, a->prompt_len) == 0));
			CHECK(memcmp(&a->sampling, &b->sampling, sizeof(a->sampling)) == 0);
			CHECK_EQ_INT(a->n_messages, b->n_messages);
			for (size_t k = 0; k < a->n_messages && k < b->n_messages; k++) {
				CHECK_EQ_INT(a->messages[k].role, b->messages[k].role);
				CHECK_STREQ(a->messages[k].content, b->messages[k].content);
			}
			CHECK_EQ_INT(a->n_stop, b->n_stop);
			for (size_t k = 0; k < a->n_stop && k < b->n_stop; k++)
				CHECK_STREQ(a->stop[k], b->stop[k]);
			CHECK(a->stream == b->stream && a->deadline_ms == b->deadline_ms &&
			      a->priority == b->priority);
			CHECK(a->ack == b->ack && a->wait_ms == b->wait_ms);
			CHECK(a->text_len == b->text_len &&
			      (!a->text || memcmp(a->text, b->text, a->text_len) == 0));
			CHECK(a->add_special == b->add_special &&
			      a->parse_special == b->parse_special);
			CHECK_EQ_INT(a->n_ids, b->n_ids);
			for (size_t k = 0; k < a->n_ids && k < b->n_ids; k++)
				CHECK_EQ_INT(a->ids[k], b->ids[k]);
		}
		/* floats are written in their shortest form */
		if (i == 1)
			CHECK(strstr(json, "\"temperature\":0.7,") != NULL);
		cm_free(json);
		ipc_request_free(a);
		ipc_request_free(b);
	}
}

/* Encode a reply, check it contains `want` (if given), decode it back. */
static struct ipc_reply *roundtrip(const struct ipc_reply *r, enum ipc_op op, const char *want)
{
	char *json = NULL;
	size_t len;
	struct cm_err err = {0};
	int rc = ipc_reply_encode(r, &json, &len, &err);
	CHECK_MSG(rc == 0, "encode: %s", err.msg);
	if (rc)
		return NULL;
	if (want)
		CHECK_MSG(strstr(json, want) != NULL, "%s not in %s", want, json);
	struct ipc_reply *d = NULL;
	rc = ipc_reply_decode(json, len, op, &d, &err);
	CHECK_MSG(rc == 0, "decode of %s: %s", json, err.msg);
	cm_free(json);
	return d;
}

static void test_reply_roundtrip(void)
{
	struct ipc_reply r, *d;

	/* generate result */
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_GENERATE;
	r.id = "g1";
	r.u.gen.text = "Once upon a time";
	r.u.gen.text_len = 16;
	r.u.gen.finish = IPC_FINISH_LENGTH;
	r.u.gen.usage = (struct ipc_usage){5, 2, 16};
	r.u.gen.timings = (struct ipc_timings){1.5, 20.25, 10, 100, 131.75, 500, 160};
	d = roundtrip(&r, IPC_OP_GENERATE, "\"finish_reason\":\"length\"");
	if (d) {
		CHECK_EQ_INT(d->error, IPC_ERR_NONE);
		CHECK_STREQ(d->id, "g1");
		CHECK(!d->u.gen.stream);
		CHECK_STREQ(d->u.gen.text, "Once upon a time");
		CHECK_EQ_INT(d->u.gen.finish, IPC_FINISH_LENGTH);
		CHECK(d->u.gen.usage.prompt_tokens == 5 && d->u.gen.usage.cached_tokens == 2 &&
		      d->u.gen.usage.completion_tokens == 16);
		CHECK(d->u.gen.timings.ttft_ms == 20.25 && d->u.gen.timings.decode_tps == 160);
		ipc_reply_free(d);
	}
	/* with logprobs: tokens, their alternatives, -inf as null */
	static const struct ipc_logprob_top tops[] = {{",", 1, -0.03f}, {" there", 6, -3.5f}};
	static const struct ipc_logprob lps[] = {{",", 1, -0.03f, tops, 2},
						 {"\xff", 1, -INFINITY, NULL, 0}};
	r.u.gen.has_logprobs = true;
	r.u.gen.logprobs = lps;
	r.u.gen.n_logprobs = 2;
	d = roundtrip(&r, IPC_OP_GENERATE, "\"logprob\":null");
	if (d) {
		CHECK(d->u.gen.has_logprobs && d->u.gen.n_logprobs == 2);
		if (d->u.gen.n_logprobs == 2) {
			const struct ipc_logprob *a = d->u.gen.logprobs;
			CHECK_STREQ(a[0].token, ",");
			CHECK(a[0].logprob == -0.03f && a[0].n_top == 2);
			CHECK(a[0].n_top == 2 && strcmp(a[0].top[1].token, " there") == 0 &&
			      a[0].top[1].logprob == -3.5f);
			CHECK_STREQ(a[1].token, "\xef\xbf\xbd"); /* bad bytes replaced */
			CHECK(a[1].logprob == -INFINITY && a[1].n_top == 0);
		}
		ipc_reply_free(d);
	}
	r.u.gen.has_logprobs = false;
	d = roundtrip(&r, IPC_OP_GENERATE, "\"text\"");
	if (d) {
		CHECK(!d->u.gen.has_logprobs);
		ipc_reply_free(d);
	}
	/* a stream's start; chat shares the shape */
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_CHAT;
	r.id = "s9";
	r.u.gen.stream = true;
	d = roundtrip(&r, IPC_OP_CHAT, "\"stream\":true");
	if (d) {
		CHECK(d->u.gen.stream);
		CHECK_STREQ(d->id, "s9");
		ipc_reply_free(d);
	}
	/* poll chunks, the last with stats; NaN timings travel as null */
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_POLL;
	r.id = "s9";
	r.u.poll.offset = 10;
	r.u.poll.text = "abc";
	r.u.poll.text_len = 3;
	d = roundtrip(&r, IPC_OP_POLL, "\"next\":13");
	if (d) {
		CHECK(d->u.poll.offset == 10 && d->u.poll.next == 13 && !d->u.poll.done);
		CHECK_STREQ(d->u.poll.text, "abc");
		ipc_reply_free(d);
	}
	r.u.poll.done = true;
	r.u.poll.finish = IPC_FINISH_CANCELLED;
	r.u.poll.timings.queue_ms = NAN;
	r.u.poll.timings.decode_tps = INFINITY;
	d = roundtrip(&r, IPC_OP_POLL, "\"queue_ms\":null");
	if (d) {
		CHECK(d->u.poll.done);
		CHECK_EQ_INT(d->u.poll.finish, IPC_FINISH_CANCELLED);
		CHECK(isnan(d->u.poll.timings.queue_ms) && isnan(d->u.poll.timings.decode_tps));
		CHECK(d->u.poll.timings.ttft_ms == 0);
		ipc_reply_free(d);
	}
	/* invalid UTF-8 from the daemon: replaced, and next still counts bytes */
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_POLL;
	r.id = "u";
	r.u.poll.offset = 0;
	r.u.poll.text = "a\xff\xc3";
	r.u.poll.text_len = 3;
	d = roundtrip(&r, IPC_OP_POLL, "\"next\":3");
	if (d) {
		CHECK_STREQ(d->u.poll.text, "a\xef\xbf\xbd\xef\xbf\xbd");
		CHECK_EQ_INT(d->u.poll.next, 3);
		ipc_reply_free(d);
	}
	/* cancel, tokenize, detokenize */
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_CANCEL;
	r.u.cancel.cancelled = true;
	d = roundtrip(&r, IPC_OP_CANCEL, "\"cancelled\":true");
	if (d) {
		CHECK(d->u.cancel.cancelled);
		CHECK(d->id == NULL);
		ipc_reply_free(d);
	}
	static const int32_t ids[] = {1, 15043, 3186};
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_TOKENIZE;
	r.u.tokenize.ids = ids;
	r.u.tokenize.n_ids = 3;
	d = roundtrip(&r, IPC_OP_TOKENIZE, "\"ids\":[1,15043,3186]");
	if (d) {
		CHECK_EQ_INT(d->u.tokenize.n_ids, 3);
		CHECK(d->u.tokenize.n_ids == 3 && memcmp(d->u.tokenize.ids, ids, sizeof(ids)) == 0);
		ipc_reply_free(d);
	}
	/* embed: floats round-trip exactly (shortest decimal) */
	static const float v0[] = {0.1f, -0.7071068f, 1e-8f}, v1[] = {1.0f, 0.0f, -0.0f};
	static const struct ipc_embedding emb[] = {{v0, 3, 5}, {v1, 3, 1}};
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_EMBED;
	r.u.embed = (struct ipc_embed_reply){emb, 2, "mean", 6};
	d = roundtrip(&r, IPC_OP_EMBED, "\"usage\":{\"prompt_tokens\":6}");
	if (d) {
		CHECK(d->u.embed.n == 2 && d->u.embed.prompt_tokens == 6);
		CHECK(d->u.embed.pooling && strcmp(d->u.embed.pooling, "mean") == 0);
		for (size_t i = 0; d->u.embed.n == 2 && i < 2; i++) {
			CHECK(d->u.embed.data[i].n_values == 3);
			CHECK(d->u.embed.data[i].tokens == emb[i].tokens);
			CHECK(memcmp(d->u.embed.data[i].values, emb[i].values, 3 * sizeof(float)) == 0);
		}
		ipc_reply_free(d);
	}
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_DETOKENIZE;
	r.u.detokenize.text = "nul\0inside";
	r.u.detokenize.text_len = 10;
	d = roundtrip(&r, IPC_OP_DETOKENIZE, "\\u0000");
	if (d) {
		CHECK_EQ_INT(d->u.detokenize.text_len, 10);
		CHECK(memcmp(d->u.detokenize.text, "nul\0inside", 10) == 0);
		ipc_reply_free(d);
	}
	/* info */
	static const char *const qt[] = {"Q4_0", "F32"};
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_INFO;
	r.u.info = (struct ipc_info_reply){.version = "0.1.0",
	                                   .model = "stories260K.gguf",
	                                   .architecture = "llama",
	                                   .quant_types = qt,
	                                   .n_quant_types = 2,
	                                   .n_ctx = 512,
	                                   .n_vocab = 512,
	                                   .isa = "avx2",
	                                   .kernels = "q4_0:avx2",
	                                   .threads = 4,
	                                   .tuning_json = "{\"governor\":\"performance\"}"};
	d = roundtrip(&r, IPC_OP_INFO, "\"tuning\":{\"governor\":\"performance\"}");
	if (d) {
		CHECK_STREQ(d->u.info.architecture, "llama");
		CHECK_EQ_INT(d->u.info.n_quant_types, 2);
		if (d->u.info.n_quant_types == 2)
			CHECK_STREQ(d->u.info.quant_types[1], "F32");
		CHECK_EQ_INT(d->u.info.n_ctx, 512);
		CHECK_EQ_INT(d->u.info.threads, 4);
		CHECK_STREQ(d->u.info.isa, "avx2");
		CHECK_STREQ(d->u.info.tuning_json, "{\"governor\":\"performance\"}");
		ipc_reply_free(d);
	}
	r.u.info.tuning_json = "[not an object";
	char *json = NULL;
	CHECK(ipc_reply_encode(&r, &json, NULL, NULL) < 0);
	CHECK(json == NULL);
	/* health */
	static const char *const reasons[] = {"loading model (41%)"};
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_HEALTH;
	r.u.health.status = IPC_HEALTH_LOADING;
	r.u.health.reasons = reasons;
	r.u.health.n_reasons = 1;
	d = roundtrip(&r, IPC_OP_HEALTH, "\"ready\":false");
	if (d) {
		CHECK_EQ_INT(d->u.health.status, IPC_HEALTH_LOADING);
		CHECK_EQ_INT(d->u.health.n_reasons, 1);
		if (d->u.health.n_reasons == 1)
			CHECK_STREQ(d->u.health.reasons[0], "loading model (41%)");
		ipc_reply_free(d);
	}
	/* metrics */
	static const struct ipc_metric_label lb[] = {{"op", "generate"}, {"code", "ok"}};
	const struct ipc_metric ms[] = {
	    {"edgelm_requests_total", "counter", lb, 2, 12},
	    {"edgelm_kv_usage_ratio", "gauge", NULL, 0, 0.25},
	    {"edgelm_ttft_seconds", "gauge", NULL, 0, NAN},
	};
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_METRICS;
	r.u.metrics.items = ms;
	r.u.metrics.n_items = 3;
	d = roundtrip(&r, IPC_OP_METRICS, "\"labels\":{\"op\":\"generate\",\"code\":\"ok\"}");
	if (d) {
		CHECK_EQ_INT(d->u.metrics.n_items, 3);
		if (d->u.metrics.n_items == 3) {
			CHECK_STREQ(d->u.metrics.items[0].name, "edgelm_requests_total");
			CHECK_STREQ(d->u.metrics.items[0].type, "counter");
			CHECK_EQ_INT(d->u.metrics.items[0].n_labels, 2);
			CHECK(d->u.metrics.items[0].value == 12);
			CHECK(d->u.metrics.items[1].value == 0.25);
			CHECK(isnan(d->u.metrics.items[2].value));
		}
		ipc_reply_free(d);
	}
	/* metrics as the monitor's JSON document, spliced in unchanged */
	const char *doc = "{\"version\":1,\"flags\":{},\"metrics\":{\"edgelm_cpu_busy_ratio\":"
	                  "{\"type\":\"gauge\",\"series\":[{\"labels\":{\"cpu\":\"0\"},"
	                  "\"value\":0.5}]}}}";
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_METRICS;
	r.u.metrics.json = doc;
	char want[512];
	snprintf(want, sizeof(want), "{\"v\":1,\"ok\":true,\"op\":\"metrics\",\"metrics\":%s}",
	         doc);
	d = roundtrip(&r, IPC_OP_METRICS, want);
	if (d) {
		CHECK_STREQ(d->u.metrics.json, doc);
		CHECK_EQ_INT(d->u.metrics.n_items, 0);
		ipc_reply_free(d);
	}
	r.u.metrics.json = "[1,2]";
	json = NULL;
	CHECK(ipc_reply_encode(&r, &json, NULL, NULL) < 0);
	/* errors */
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_GENERATE;
	r.id = "q";
	r.error = IPC_ERR_QUEUE_FULL;
	r.message = "queue full (16 waiting)";
	r.retry_after_ms = 250;
	d = roundtrip(&r, IPC_OP_GENERATE,
	              "\"error\":{\"code\":\"queue_full\",\"message\":\"queue full (16 waiting)\","
	              "\"retry_after_ms\":250}");
	if (d) {
		CHECK_EQ_INT(d->error, IPC_ERR_QUEUE_FULL);
		CHECK_STREQ(d->message, "queue full (16 waiting)");
		CHECK_EQ_INT(d->retry_after_ms, 250);
		ipc_reply_free(d);
	}
	json = NULL;
	size_t len;
	CHECK_OK(ipc_error_encode(IPC_ERR_SHUTTING_DOWN, NULL, NULL, -1, &json, &len));
	if (json) {
		CHECK_STREQ(json, "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"shutting_down\","
		                  "\"message\":\"the daemon is shutting down\"}}");
		CHECK(ipc_reply_decode(json, len, IPC_OP_HEALTH, &d, NULL) == 0);
		if (d) {
			CHECK_EQ_INT(d->error, IPC_ERR_SHUTTING_DOWN);
			CHECK_EQ_INT(d->retry_after_ms, -1);
			ipc_reply_free(d);
		}
		cm_free(json);
	}
}

static void test_reply_decode_hostile(void)
{
	static const char *const bad[] = {
	    "",
	    "[]",
	    "{}",
	    "{\"ok\":1}",
	    "{\"v\":2,\"ok\":true,\"op\":\"health\",\"status\":\"ready\"}",
	    "{\"ok\":true,\"op\":\"info\"}",   /* op mismatch (expect health) */
	    "{\"ok\":true,\"op\":\"health\"}", /* no status */
	    "{\"ok\":true,\"op\":\"health\",\"status\":\"fine\"}",
	    "{\"ok\":false}",
	    "{\"ok\":false,\"error\":{\"code\":5}}",
	    "{\"ok\":true,\"op\":\"health\",\"status\":\"ready\",\"reasons\":[1]}",
	    "{\"ok\":true,\"op\":\"health\",\"status\":\"ready\",\"reasons\":[[[[[[[[[[]]]]]]]]]]}",
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		struct ipc_reply *d = NULL;
		int rc = ipc_reply_decode(bad[i], strlen(bad[i]), IPC_OP_HEALTH, &d, NULL);
		CHECK_MSG(rc < 0 && d == NULL, "decoded: %s", bad[i]);
	}
	/* an error code newer than this client decodes as internal */
	const char *newer = "{\"ok\":false,\"error\":{\"code\":\"quota\",\"message\":\"m\"}}";
	struct ipc_reply *d = NULL;
	CHECK_OK(ipc_reply_decode(newer, strlen(newer), IPC_OP_HEALTH, &d, NULL));
	if (d) {
		CHECK_EQ_INT(d->error, IPC_ERR_INTERNAL);
		ipc_reply_free(d);
	}
}

/* ---- limits that agree ----------------------------------------------------- */

/* Encode `r`, check the message fits the default limit, parse it with the
 * default limits; the error code (IPC_ERR_NONE on success). */
static enum ipc_errcode encode_parse(const struct ipc_request *r, size_t *ret_len, char *msg,
                                     size_t cap)
{
	char *json = NULL;
	size_t len = 0;
	struct cm_err e = {0};
	if (ipc_request_encode(r, &json, &len, &e) != 0) {
		snprintf(msg, cap, "encode: %.200s", e.msg);
		return IPC_ERR_COUNT;
	}
	*ret_len = len;
	enum ipc_errcode code = parse_code(json, len, NULL, msg, cap);
	cm_free(json);
	return code;
}

/* grammar and json_schema: one or the other, the schema kept as compact
 * JSON, both bounded by IPC_MAX_GRAMMAR_BYTES, which the default message
 * limit holds beside the largest prompt. */
static void test_structured_output(void)
{
	char m[256];
	const char *both[] = {
	    GEN(",\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{}"),
	    GEN(",\"json_schema\":{},\"grammar\":\"root ::= \\\"a\\\"\""),
	    "{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
	    "\"json_schema\":{\"type\":\"object\"},\"grammar\":\"root ::= \\\"{}\\\"\"}",
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(both); i++) {
		CHECK_EQ_INT(parse_code(both[i], strlen(both[i]), NULL, m, sizeof(m)),
		             IPC_ERR_INVALID_FIELD);
		CHECK_STREQ(m, "fields 'grammar' and 'json_schema' exclude each other");
	}

	const char *j = GEN(",\"json_schema\": { \"type\" : \"object\", \"properties\": {\"z\":{}, "
	                    "\"a\": {\"const\": 1.5}}}");
	struct ipc_request *r = NULL;
	struct cm_err err = {0};
	CHECK_OK(ipc_request_parse(j, strlen(j), NULL, &r, &err));
	if (r) {
		CHECK_STREQ(r->json_schema,
		            "{\"type\":\"object\",\"properties\":{\"z\":{},\"a\":{\"const\":1.5}}}");
		CHECK_EQ_INT(r->json_schema_len, strlen(r->json_schema));
		CHECK(r->grammar == NULL);
		ipc_request_free(r);
	}

	/* a schema of 64 KiB as compact JSON passes, one byte more does not;
	 * so does a grammar, next to a prompt of the full 1 MiB */
	size_t room = IPC_MAX_GRAMMAR_BYTES - strlen("{\"description\":\"\"}");
	size_t cap = IPC_MAX_GRAMMAR_BYTES + (2u << 20);
	char *big = malloc(cap);
	CHECK(big != NULL);
	if (!big)
		return;
	for (int extra = 0; extra <= 1; extra++) {
		int n = snprintf(big, cap, "{\"op\":\"generate\",\"prompt\":\"\",\"json_schema\":"
		                           "{\"description\":\"%0*d\"}}",
		                 (int)(room + (size_t)extra), 0);
		CHECK_EQ_INT(parse_code(big, (size_t)n, NULL, m, sizeof(m)),
		             extra ? IPC_ERR_TOO_LARGE : IPC_ERR_NONE);
	}
	CHECK(strstr(m, "json_schema") != NULL);
	size_t n = (size_t)snprintf(big, cap, "{\"op\":\"generate\",\"prompt\":\"");
	memset(big + n, 'p', 1u << 20);
	n += 1u << 20;
	n += (size_t)snprintf(big + n, cap - n, "\",\"grammar\":\"");
	memset(big + n, 'g', IPC_MAX_GRAMMAR_BYTES);
	n += IPC_MAX_GRAMMAR_BYTES;
	n += (size_t)snprintf(big + n, cap - n, "\",\"max_tokens\":1}");
	CHECK(n <= IPC_DEFAULT_MAX_MSG_BYTES);
	CHECK_EQ_INT(parse_code(big, n, NULL, m, sizeof(m)), IPC_ERR_NONE);
	free(big);
}

static void test_limits_default(void)
{
	struct ipc_limits lim = {0};
	ipc_limits_fill(&lim);
	CHECK_EQ_INT(lim.max_prompt_bytes, 1u << 20);
	CHECK_EQ_INT(lim.max_msg_bytes, IPC_DEFAULT_MAX_MSG_BYTES);
	CHECK_EQ_INT(IPC_DEFAULT_MAX_MSG_BYTES, 1216u << 10);
	CHECK(lim.max_msg_bytes > lim.max_prompt_bytes);
	/* derived from the other limits as set, unless set itself */
	lim = (struct ipc_limits){.max_prompt_bytes = 4u << 20};
	ipc_limits_fill(&lim);
	CHECK_EQ_INT(lim.max_msg_bytes, (4u << 20) + (192u << 10));
	lim = (struct ipc_limits){.max_msg_bytes = 12345, .max_prompt_bytes = 4u << 20};
	ipc_limits_fill(&lim);
	CHECK_EQ_INT(lim.max_msg_bytes, 12345);
	lim = (struct ipc_limits){.max_prompt_bytes = SIZE_MAX};
	ipc_limits_fill(&lim);
	CHECK(lim.max_msg_bytes == SIZE_MAX);
}

/* A prompt of exactly the documented 1 MiB could not be sent: the message
 * limit was 1 MiB too, so the envelope pushed it over. Every request at
 * the limits, written as libedgelm writes it, must fit the default message
 * limit and parse with the default limits; one byte more of text is
 * refused with the text's own error, not the message's. */
static void test_prompt_at_limit(void)
{
	const size_t P = IPC_DEFAULT_MAX_PROMPT_BYTES;
	char msg[256];
	size_t len = 0;
	char *text = malloc(P + 2);
	CHECK(text != NULL);
	if (!text)
		return;

	/* generate: ASCII prompt, every other field at its limit */
	static char stops[IPC_DEFAULT_MAX_STOP][IPC_DEFAULT_MAX_STOP_BYTES + 1];
	const char *stop[IPC_DEFAULT_MAX_STOP];
	for (size_t i = 0; i < IPC_DEFAULT_MAX_STOP; i++) {
		memset(stops[i], 0x01, IPC_DEFAULT_MAX_STOP_BYTES); /* \u0001: 6 bytes each */
		stops[i][IPC_DEFAULT_MAX_STOP_BYTES] = '\0';
		stop[i] = stops[i];
	}
	char id[IPC_ID_MAX + 1];
	memset(id, 'i', IPC_ID_MAX);
	id[IPC_ID_MAX] = '\0';
	struct ipc_request r;
	ipc_request_init(&r, IPC_OP_GENERATE);
	r.id = id;
	r.sampling.set = 0x3ff;
	r.sampling.max_tokens = 1 << 20;
	r.sampling.temperature = 1.17549435e-38f;
	r.sampling.top_p = 0.123456789f;
	r.sampling.min_p = 0.987654321f;
	r.sampling.repeat_penalty = 9.87654321f;
	r.sampling.frequency_penalty = -1.23456789f;
	r.sampling.presence_penalty = -1.98765432f;
	r.sampling.penalty_last_n = -1;
	r.sampling.top_k = 1 << 20;
	r.sampling.seed = (uint64_t)INT64_MAX;
	r.stop = stop;
	r.n_stop = IPC_DEFAULT_MAX_STOP;
	r.stream = true;
	r.deadline_ms = 86400000;
	r.priority = -10;
	r.prompt = text;

	memset(text, 'a', P + 1);
	r.prompt_len = P;
	enum ipc_errcode code = encode_parse(&r, &len, msg, sizeof(msg));
	CHECK_MSG(code == IPC_ERR_NONE, "1 MiB prompt: %s (%zu bytes)", msg, len);
	CHECK_MSG(len <= IPC_DEFAULT_MAX_MSG_BYTES, "%zu bytes", len);
	r.prompt_len = P + 1;
	CHECK_EQ_INT(encode_parse(&r, &len, msg, sizeof(msg)), IPC_ERR_PROMPT_TOO_LONG);
	CHECK(strstr(msg, "prompt") != NULL);

	/* characters that need escaping count as JSON writes them: '"' two
	 * bytes, so P/2 of them are the limit */
	memset(text, '"', P / 2 + 1);
	r.prompt_len = P / 2;
	code = encode_parse(&r, &len, msg, sizeof(msg));
	CHECK_MSG(code == IPC_ERR_NONE, "P/2 quotes: %s", msg);
	CHECK(len <= IPC_DEFAULT_MAX_MSG_BYTES);
	r.prompt_len = P / 2 + 1;
	CHECK_EQ_INT(encode_parse(&r, &len, msg, sizeof(msg)), IPC_ERR_PROMPT_TOO_LONG);
	CHECK_MSG(strstr(msg, "as JSON") != NULL, "%s", msg);
	/* control characters six: P/6 of them and 4 ASCII bytes fill it */
	memset(text, 0x1f, P / 6);
	memset(text + P / 6, 'z', 5);
	r.prompt_len = P / 6 + 4;
	code = encode_parse(&r, &len, msg, sizeof(msg));
	CHECK_MSG(code == IPC_ERR_NONE, "P/6 control characters: %s", msg);
	CHECK(len <= IPC_DEFAULT_MAX_MSG_BYTES);
	r.prompt_len = P / 6 + 5;
	CHECK_EQ_INT(encode_parse(&r, &len, msg, sizeof(msg)), IPC_ERR_PROMPT_TOO_LONG);
	/* and a full 1 MiB of them does not fit one message at all */
	memset(text, '"', P);
	r.prompt_len = P;
	CHECK_EQ_INT(encode_parse(&r, &len, msg, sizeof(msg)), IPC_ERR_TOO_LARGE);

	/* chat: 1024 messages, contents 1 MiB as JSON together, with escapes */
	static struct ipc_message ms[IPC_DEFAULT_MAX_MESSAGES];
	size_t per = P / IPC_DEFAULT_MAX_MESSAGES; /* 1024 bytes as JSON each */
	memset(text, 'c', P + 1);
	for (size_t i = 0; i < IPC_DEFAULT_MAX_MESSAGES; i++) {
		text[i * per] = '\n'; /* 2 bytes as JSON */
		ms[i] = (struct ipc_message){.role = IPC_ROLE_ASSISTANT,
		                             .content = text + i * per,
		                             .content_len = per - 1};
	}
	struct ipc_request ch = r;
	ch.op = IPC_OP_CHAT;
	ch.prompt = NULL;
	ch.prompt_len = 0;
	ch.messages = ms;
	ch.n_messages = IPC_DEFAULT_MAX_MESSAGES;
	code = encode_parse(&ch, &len, msg, sizeof(msg));
	CHECK_MSG(code == IPC_ERR_NONE, "chat at the limit: %s (%zu bytes)", msg, len);
	CHECK(len <= IPC_DEFAULT_MAX_MSG_BYTES);
	ms[IPC_DEFAULT_MAX_MESSAGES - 1].content_len++;
	CHECK_EQ_INT(encode_parse(&ch, &len, msg, sizeof(msg)), IPC_ERR_PROMPT_TOO_LONG);

	/* tokenize */
	struct ipc_request tk;
	ipc_request_init(&tk, IPC_OP_TOKENIZE);
	memset(text, 't', P + 1);
	tk.text = text;
	tk.text_len = P;
	tk.add_special = false;
	tk.parse_special = true;
	code = encode_parse(&tk, &len, msg, sizeof(msg));
	CHECK_MSG(code == IPC_ERR_NONE, "tokenize 1 MiB: %s", msg);
	CHECK(len <= IPC_DEFAULT_MAX_MSG_BYTES);
	tk.text_len = P + 1;
	CHECK_EQ_INT(encode_parse(&tk, &len, msg, sizeof(msg)), IPC_ERR_TOO_LARGE);
	CHECK(strstr(msg, "text") != NULL);

	/* detokenize: every id at its largest */
	int32_t *ids = malloc(IPC_DEFAULT_MAX_IDS * sizeof(*ids));
	CHECK(ids != NULL);
	if (ids) {
		for (size_t i = 0; i < IPC_DEFAULT_MAX_IDS; i++)
			ids[i] = INT32_MAX;
		struct ipc_request dt;
		ipc_request_init(&dt, IPC_OP_DETOKENIZE);
		dt.ids = ids;
		dt.n_ids = IPC_DEFAULT_MAX_IDS;
		code = encode_parse(&dt, &len, msg, sizeof(msg));
		CHECK_MSG(code == IPC_ERR_NONE, "detokenize at the limit: %s", msg);
		CHECK(len <= IPC_DEFAULT_MAX_MSG_BYTES);
		free(ids);
	}
	free(text);
}

/* The text limits count each byte as the encoder writes it: for every byte
 * and some multibyte characters, a text of exactly 1000 bytes as JSON (per
 * jansson's encoding, measured) parses with max_prompt_bytes 1000 and one
 * more byte does not. */
static void test_text_bytes_as_encoded(void)
{
	static const char *const extra[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
	                                    "\x7f", "/", "\xe2\x80\xa8"};
	struct ipc_limits lim = {.max_prompt_bytes = 1000};
	char unit[8];
	for (int b = 1; b < 128 + (int)CM_ARRAY_LEN(extra); b++) {
		if (b < 128) {
			unit[0] = (char)b;
			unit[1] = '\0';
		} else {
			snprintf(unit, sizeof(unit), "%s", extra[b - 128]);
		}
		/* how many bytes jansson writes for one unit */
		struct ipc_request r;
		ipc_request_init(&r, IPC_OP_TOKENIZE);
		r.text = "";
		char *j0, *j1;
		size_t l0, l1;
		CHECK_OK(ipc_request_encode(&r, &j0, &l0, NULL));
		r.text = unit;
		r.text_len = strlen(unit);
		CHECK_OK(ipc_request_encode(&r, &j1, &l1, NULL));
		size_t w = l1 - l0;
		/* units of it, then ASCII up to exactly 1000 bytes as JSON */
		char text[1100];
		size_t n = 0, json = 0;
		while (json + w <= 1000) {
			memcpy(text + n, unit, strlen(unit));
			n += strlen(unit);
			json += w;
		}
		while (json < 1000) {
			text[n++] = 'a';
			json++;
		}
		r.text = text;
		r.text_len = n;
		char *j;
		size_t l;
		CHECK_OK(ipc_request_encode(&r, &j, &l, NULL));
		CHECK_EQ_INT(l - l0, 1000);
		char m[256];
		enum ipc_errcode code = parse_code(j, l, &lim, m, sizeof(m));
		CHECK_MSG(code == IPC_ERR_NONE, "byte %d (%zu bytes as JSON): %s", b, w, m);
		cm_free(j);
		text[n++] = 'a';
		r.text_len = n;
		CHECK_OK(ipc_request_encode(&r, &j, &l, NULL));
		CHECK_MSG(parse_code(j, l, &lim, NULL, 0) == IPC_ERR_TOO_LARGE, "byte %d: +1 passed",
		          b);
		cm_free(j);
		cm_free(j0);
		cm_free(j1);
	}
}

/* repeat_penalty 1e-300 passed (0, 10] as a double and was stored as 0.0f.
 * Every float field is checked as stored: values that a float holds only
 * as 0 or a denormal are refused, naming the field and its range; the
 * bounds themselves, and the smallest normal float, still pass. */
static void test_float_fields_as_stored(void)
{
	static const struct {
		const char *name;
		float min, max;
		bool min_open;
		size_t off;
	} f[] = {
	    {"temperature", 0, 100, false, offsetof(struct ipc_sampling, temperature)},
	    {"top_p", 0, 1, false, offsetof(struct ipc_sampling, top_p)},
	    {"min_p", 0, 1, false, offsetof(struct ipc_sampling, min_p)},
	    {"repeat_penalty", 0, 10, true, offsetof(struct ipc_sampling, repeat_penalty)},
	    {"frequency_penalty", -2, 2, false, offsetof(struct ipc_sampling, frequency_penalty)},
	    {"presence_penalty", -2, 2, false, offsetof(struct ipc_sampling, presence_penalty)},
	};
	static const char *const tiny[] = {"1e-300", "1e-45",       "1.4e-45",
	                                   "1e-39",  "1.1754e-38",  "-1e-300",
	                                   "-1e-45", "4.9e-324",    "-1e-39"};
	for (size_t i = 0; i < CM_ARRAY_LEN(f); i++) {
		char json[256], m[256];
		for (size_t k = 0; k < CM_ARRAY_LEN(tiny); k++) {
			snprintf(json, sizeof(json), GEN(",\"%s\":%s"), f[i].name, tiny[k]);
			enum ipc_errcode code = parse_code(json, strlen(json), NULL, m, sizeof(m));
			CHECK_MSG(code == IPC_ERR_INVALID_FIELD, "%s: %s", json,
			          code == IPC_ERR_NONE ? "accepted" : m);
			CHECK_MSG(strstr(m, f[i].name) != NULL, "%s: %s", json, m);
			char range[64];
			snprintf(range, sizeof(range), "%c%g, %g]", f[i].min_open ? '(' : '[',
			         (double)f[i].min, (double)f[i].max);
			CHECK_MSG(strstr(m, range) != NULL, "%s: no range %s in: %s", json, range, m);
		}
		/* what passes, and what is stored */
		struct {
			const char *text;
			float want;
		} ok[] = {
		    {"1.1754943508222875e-38", FLT_MIN}, /* the smallest normal float */
		    {"1.17549436e-38", FLT_MIN},         /* rounds up to it */
		    {"0.5", 0.5f},
		    {"1", 1.0f},
		    {"1e-30", 1e-30f},
		};
		for (size_t k = 0; k < CM_ARRAY_LEN(ok); k++) {
			snprintf(json, sizeof(json), GEN(",\"%s\":%s"), f[i].name, ok[k].text);
			struct ipc_request *r = NULL;
			struct cm_err e = {0};
			CHECK_MSG(ipc_request_parse(json, strlen(json), NULL, &r, &e) == 0, "%s: %s",
			          json, e.msg);
			if (r) {
				float got;
				memcpy(&got, (const char *)&r->sampling + f[i].off, sizeof(got));
				CHECK_MSG(got == ok[k].want, "%s: stored %g", json, (double)got);
				ipc_request_free(r);
			}
		}
		/* the bounds */
		float bounds[] = {f[i].min, f[i].max};
		for (int b = f[i].min_open ? 1 : 0; b < 2; b++) {
			snprintf(json, sizeof(json), GEN(",\"%s\":%.9g"), f[i].name,
			         (double)bounds[b]);
			CHECK_MSG(parse_code(json, strlen(json), NULL, m, sizeof(m)) ==
			              IPC_ERR_NONE,
			          "%s: %s", json, m);
		}
		/* just outside them */
		snprintf(json, sizeof(json), GEN(",\"%s\":%.17g"), f[i].name,
		         nextafter((double)f[i].max, INFINITY));
		CHECK_MSG(parse_code(json, strlen(json), NULL, NULL, 0) == IPC_ERR_INVALID_FIELD,
		          "%s accepted", json);
		snprintf(json, sizeof(json), GEN(",\"%s\":%.17g"), f[i].name,
		         f[i].min_open ? (double)f[i].min
		                       : nextafter((double)f[i].min, -INFINITY));
		CHECK_MSG(parse_code(json, strlen(json), NULL, NULL, 0) == IPC_ERR_INVALID_FIELD,
		          "%s accepted", json);
		/* 0 itself where the range holds it, -0 as well */
		snprintf(json, sizeof(json), GEN(",\"%s\":-0.0"), f[i].name);
		CHECK_EQ_INT(parse_code(json, strlen(json), NULL, NULL, 0),
		             f[i].min_open ? IPC_ERR_INVALID_FIELD : IPC_ERR_NONE);
	}
}

/* Numbers that changed on the way between the codec's integer types: a
 * seed or ack above 2^63-1 was encoded as another value (the seed masked,
 * the ack negative), a decoded `threads` was truncated to 32 bits, and a
 * poll reply without `next` near 2^63 overflowed computing it. */
static void test_numbers_not_narrowed(void)
{
	struct ipc_request r;
	char *json = NULL;
	struct cm_err e = {0};
	ipc_request_init(&r, IPC_OP_GENERATE);
	r.prompt = "p";
	r.prompt_len = 1;
	r.sampling.set = IPC_SET_SEED;
	r.sampling.seed = (uint64_t)INT64_MAX + 6;
	CHECK_EQ_INT(ipc_request_encode(&r, &json, NULL, &e), -EINVAL);
	CHECK(strstr(e.msg, "seed") != NULL);
	cm_free(json);
	json = NULL;
	r.sampling.seed = (uint64_t)INT64_MAX;
	CHECK_OK(ipc_request_encode(&r, &json, NULL, NULL));
	CHECK(json && strstr(json, "\"seed\":9223372036854775807") != NULL);
	cm_free(json);
	json = NULL;
	ipc_request_init(&r, IPC_OP_POLL);
	r.id = "s";
	r.ack = (uint64_t)INT64_MAX + 1;
	CHECK_EQ_INT(ipc_request_encode(&r, &json, NULL, &e), -EINVAL);
	CHECK(strstr(e.msg, "ack") != NULL);
	cm_free(json);

	static const struct {
		const char *json;
		enum ipc_op op;
	} bad[] = {
	    {"{\"ok\":true,\"op\":\"info\",\"threads\":4294967297}", IPC_OP_INFO},
	    {"{\"ok\":true,\"op\":\"info\",\"threads\":-2147483649}", IPC_OP_INFO},
	    {"{\"ok\":true,\"op\":\"poll\",\"offset\":9223372036854775807,\"text\":\"abc\"}",
	     IPC_OP_POLL},
	    {"{\"ok\":true,\"op\":\"poll\",\"offset\":9223372036854775806,\"text\":\"abc\"}",
	     IPC_OP_POLL},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		struct ipc_reply *d = NULL;
		int rc = ipc_reply_decode(bad[i].json, strlen(bad[i].json), bad[i].op, &d, NULL);
		CHECK_MSG(rc == -EPROTO && d == NULL, "decoded: %s (threads %d)", bad[i].json,
		          d ? (int)d->u.info.threads : 0);
		ipc_reply_free(d);
	}
	static const char *const good[] = {
	    "{\"ok\":true,\"op\":\"info\",\"threads\":2147483647}",
	    "{\"ok\":true,\"op\":\"poll\",\"offset\":9223372036854775804,\"text\":\"abc\"}",
	};
	struct ipc_reply *d = NULL;
	CHECK_OK(ipc_reply_decode(good[0], strlen(good[0]), IPC_OP_INFO, &d, NULL));
	CHECK(d && d->u.info.threads == INT32_MAX);
	ipc_reply_free(d);
	d = NULL;
	CHECK_OK(ipc_reply_decode(good[1], strlen(good[1]), IPC_OP_POLL, &d, NULL));
	CHECK(d && d->u.poll.next == (uint64_t)INT64_MAX);
	ipc_reply_free(d);
}

/* ---- the request field table ---------------------------------------------- */

/* The custom-shaped fields the tests below know; a new shape needs a sample
 * and a bounds case here. */
static bool custom_known(const struct ipc_field *f)
{
	static const char *const known[] = {"id", "messages", "stop", "logit_bias", "json_schema",
	                                    "ids", "input", "pooling"};
	for (size_t i = 0; i < CM_ARRAY_LEN(known); i++)
		if (strcmp(f->name, known[i]) == 0)
			return true;
	return false;
}

static const struct ipc_message sample_messages[] = {
    {IPC_ROLE_SYSTEM, "Be \"brief\".", 11},
    {IPC_ROLE_USER, "caf\xc3\xa9\n", 6},
};
static const char *const sample_stop[] = {"\n\n", "The end"};
static const size_t sample_stop_len[] = {2, 7};
static const int32_t sample_ids[] = {0, 7, INT32_MAX};
static const int32_t sample_bias_ids[] = {0, 15043, INT32_MAX};
static const float sample_bias[] = {-100.0f, 2.5f, 100.0f};
static const char *const sample_input[] = {"Hello \"world\"", "caf\xc3\xa9\n"};
static const size_t sample_input_len[] = {13, 6};
static const char sample_schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,\"\xc3\xa9\"]}}}";

/* Give field `f` of `r` a sample value other than its default (variant 0),
 * or its lower (1) or upper (2) bound; sampling.set flagged as a parser
 * would. */
static void field_sample(const struct ipc_field *f, struct ipc_request *r, int variant)
{
	static const struct ipc_limits def_lim_zero;
	struct ipc_limits lim = def_lim_zero;
	ipc_limits_fill(&lim);
	switch (f->type) {
	case IPC_FT_INT: {
		long long v = variant == 1 ? f->min : ipc_field_max(f, &lim);
		if (variant == 0)
			v = (long long)f->def == f->min ? f->min + 1 : f->min;
		ipc_field_set_int(f, r, v);
		break;
	}
	case IPC_FT_NUM: {
		float lo = f->fmin;
		if (f->flags & IPC_F_MIN_OPEN)
			lo = f->fmin == 0 ? FLT_MIN : nextafterf(f->fmin, INFINITY);
		float v = variant == 1 ? lo : f->fmax;
		if (variant == 0)
			v = lo + (f->fmax - lo) * 0.3f;
		ipc_field_set_num(f, r, v);
		break;
	}
	case IPC_FT_BOOL:
		ipc_field_set_bool(f, r, variant == 0 ? f->def == 0 : variant == 2);
		break;
	case IPC_FT_TEXT: {
		const char *s = "tab\there \"q\" \xc3\xa9";
		size_t n = strlen(s);
		memcpy((char *)r + f->off, &s, sizeof(s));
		memcpy((char *)r + f->len_off, &n, sizeof(n));
		break;
	}
	case IPC_FT_CUSTOM:
		if (strcmp(f->name, "id") == 0) {
			r->id = "req-1.a:B_2";
		} else if (strcmp(f->name, "messages") == 0) {
			r->messages = sample_messages;
			r->n_messages = CM_ARRAY_LEN(sample_messages);
		} else if (strcmp(f->name, "stop") == 0) {
			r->stop = sample_stop;
			r->stop_len = sample_stop_len;
			r->n_stop = CM_ARRAY_LEN(sample_stop);
		} else if (strcmp(f->name, "ids") == 0) {
			r->ids = sample_ids;
			r->n_ids = CM_ARRAY_LEN(sample_ids);
		} else if (strcmp(f->name, "input") == 0) {
			r->inputs = sample_input;
			r->input_lens = sample_input_len;
			r->n_inputs = CM_ARRAY_LEN(sample_input);
		} else if (strcmp(f->name, "pooling") == 0) {
			r->pooling = variant == 1 ? IPC_POOL_MEAN : IPC_POOL_LAST;
		} else if (strcmp(f->name, "logit_bias") == 0) {
			r->bias_ids = sample_bias_ids;
			r->bias = sample_bias;
			r->n_bias = CM_ARRAY_LEN(sample_bias);
		} else if (strcmp(f->name, "json_schema") == 0) {
			r->json_schema = sample_schema;
			r->json_schema_len = strlen(sample_schema);
		}
		break;
	case IPC_FT_ENVELOPE:
		break;
	}
	r->sampling.set |= f->set_bit;
}

/* A request of `op` with every required field given (a valid request). */
static void request_minimal(struct ipc_request *r, enum ipc_op op)
{
	ipc_request_init(r, op);
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		if (f->type != IPC_FT_ENVELOPE && ipc_field_accepts(f, op) &&
		    (f->flags & IPC_F_REQUIRED))
			field_sample(f, r, 0);
	}
}

static bool bytes_same(const char *a, size_t an, const char *b, size_t bn)
{
	if (!a || !b)
		return (a == NULL || an == 0) && (b == NULL || bn == 0);
	return an == bn && memcmp(a, b, an) == 0;
}

/* Whether two requests hold the same values, member by member (every
 * scalar through the table); `why` names the first difference. */
static bool request_same(const struct ipc_request *a, const struct ipc_request *b, const char **why)
{
	*why = "op";
	if (a->op != b->op || a->version != b->version)
		return false;
	*why = "id";
	if ((a->id == NULL) != (b->id == NULL) || (a->id && strcmp(a->id, b->id) != 0))
		return false;
	*why = "sampling.set";
	if (a->sampling.set != b->sampling.set)
		return false;
	*why = "messages";
	if (a->n_messages != b->n_messages)
		return false;
	for (size_t k = 0; k < a->n_messages; k++)
		if (a->messages[k].role != b->messages[k].role ||
		    !bytes_same(a->messages[k].content, a->messages[k].content_len,
		                b->messages[k].content, b->messages[k].content_len))
			return false;
	*why = "stop";
	if (a->n_stop != b->n_stop)
		return false;
	for (size_t k = 0; k < a->n_stop; k++)
		if (!bytes_same(a->stop[k], a->stop_len[k], b->stop[k], b->stop_len[k]))
			return false;
	*why = "input";
	if (a->n_inputs != b->n_inputs || a->pooling != b->pooling)
		return false;
	for (size_t k = 0; k < a->n_inputs; k++)
		if (!bytes_same(a->inputs[k], a->input_lens[k], b->inputs[k], b->input_lens[k]))
			return false;
	*why = "ids";
	if (a->n_ids != b->n_ids || (a->n_ids && memcmp(a->ids, b->ids, a->n_ids * 4) != 0))
		return false;
	*why = "json_schema"; /* compact JSON, as the parser keeps it */
	if (!bytes_same(a->json_schema, a->json_schema_len, b->json_schema, b->json_schema_len))
		return false;
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		*why = f->name;
		switch (f->type) {
		case IPC_FT_INT:
			if (ipc_field_get_uint(f, a) != ipc_field_get_uint(f, b))
				return false;
			break;
		case IPC_FT_NUM:
			if (ipc_field_get_num(f, a) != ipc_field_get_num(f, b))
				return false;
			break;
		case IPC_FT_BOOL:
			if (ipc_field_get_bool(f, a) != ipc_field_get_bool(f, b))
				return false;
			break;
		case IPC_FT_TEXT: {
			const char *sa, *sb;
			size_t na, nb;
			memcpy(&sa, (const char *)a + f->off, sizeof(sa));
			memcpy(&sb, (const char *)b + f->off, sizeof(sb));
			memcpy(&na, (const char *)a + f->len_off, sizeof(na));
			memcpy(&nb, (const char *)b + f->len_off, sizeof(nb));
			if (!bytes_same(sa, na, sb, nb))
				return false;
			break;
		}
		case IPC_FT_CUSTOM:
		case IPC_FT_ENVELOPE:
			break;
		}
	}
	*why = NULL;
	return true;
}

/* The table itself: names, docs, ops, bits and defaults in order. */
static void test_fields_table(void)
{
	uint32_t bits = 0;
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		CHECK_MSG(f->name && f->name[0] && f->doc && f->doc[0], "row %zu", i);
		CHECK_MSG(f->ops != 0, "%s: no op", f->name);
		CHECK_MSG(f->type != IPC_FT_CUSTOM || (f->kind && custom_known(f)),
		          "%s: a custom shape this test has no sample for", f->name);
		for (size_t j = 0; j < i; j++)
			CHECK_MSG(strcmp(f->name, ipc_fields[j].name) != 0 ||
			              (f->ops & ipc_fields[j].ops) == 0,
			          "%s: two rows for one op", f->name);
		if (f->set_bit) {
			CHECK_MSG((bits & f->set_bit) == 0, "%s: bit shared", f->name);
			bits |= f->set_bit;
		}
		struct ipc_limits lim = {0};
		ipc_limits_fill(&lim);
		if (f->type == IPC_FT_INT)
			CHECK_MSG(f->min <= (long long)f->def &&
			              (long long)f->def <= ipc_field_max(f, &lim),
			          "%s: default out of range", f->name);
		if (f->type == IPC_FT_NUM)
			CHECK_MSG(f->fmin <= (float)f->def && (float)f->def <= f->fmax &&
			              (!(f->flags & IPC_F_MIN_OPEN) || (float)f->def > f->fmin),
			          "%s: default out of range", f->name);
		if (f->type == IPC_FT_TEXT)
			CHECK_MSG(f->too_long != IPC_ERR_NONE, "%s: no error code", f->name);
	}
	CHECK_EQ_INT(bits, (IPC_SET_SEED << 1) - 1); /* every IPC_SET_* bit has its row */
}

/* Every field round-trips, at a sample value and at both bounds, for each op
 * that accepts it: encoded, then parsed, it is the same request. */
static void test_fields_roundtrip(void)
{
	int n = 0;
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		for (size_t i = 0; i < ipc_n_fields; i++) {
			const struct ipc_field *f = &ipc_fields[i];
			if (f->type == IPC_FT_ENVELOPE || !ipc_field_accepts(f, (enum ipc_op)op))
				continue;
			for (int variant = 0; variant < 3; variant++) {
				struct ipc_request a, *b = NULL;
				request_minimal(&a, (enum ipc_op)op);
				field_sample(f, &a, variant);
				char *json = NULL;
				size_t len = 0;
				struct cm_err err = {0};
				CHECK_OK(ipc_request_encode(&a, &json, &len, &err));
				if (!json)
					continue;
				int rc = ipc_request_parse(json, len, NULL, &b, &err);
				CHECK_MSG(rc == 0, "%s of %s: %s: %s", f->name, ipc_op_name(op),
				          json, err.msg);
				const char *why = NULL;
				if (b)
					CHECK_MSG(request_same(&a, b, &why),
					          "%s of %s (%d): %s differs: %s", f->name,
					          ipc_op_name(op), variant, why, json);
				/* a value other than the default is written */
				if (variant == 0) {
					char key[64];
					snprintf(key, sizeof(key), "\"%s\":", f->name);
					CHECK_MSG(strstr(json, key) != NULL, "%s not written: %s",
					          f->name, json);
				}
				ipc_request_free(b);
				cm_free(json);
				n++;
			}
		}
	}
	CHECK(n >= 3 * 30);
}

/* Insert `"name":value` into the JSON object text `json` (ending in '}'). */
static char *json_with(const char *json, const char *name, const char *value)
{
	size_t n = strlen(json) + strlen(name) + strlen(value) + 8;
	char *s = malloc(n);
	if (s)
		snprintf(s, n, "%.*s,\"%s\":%s}", (int)(strlen(json) - 1), json, name, value);
	return s;
}

/* A field given to an op that has no row for it is invalid_field, named. */
static void test_fields_refused_by_other_ops(void)
{
	int n = 0;
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		if (f->type == IPC_FT_ENVELOPE)
			continue;
		for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
			bool accepted = false;
			for (size_t j = 0; j < ipc_n_fields; j++)
				accepted |= strcmp(ipc_fields[j].name, f->name) == 0 &&
				            ipc_field_accepts(&ipc_fields[j], (enum ipc_op)op);
			if (accepted)
				continue;
			/* a valid value of the field, from an op that takes it */
			int own = 1;
			while (!ipc_field_accepts(f, (enum ipc_op)own))
				own++;
			struct ipc_request r;
			request_minimal(&r, (enum ipc_op)own);
			field_sample(f, &r, 0);
			char *own_json = NULL, *json = NULL;
			CHECK_OK(ipc_request_encode(&r, &own_json, NULL, NULL));
			json_t *o = own_json ? json_loads(own_json, 0, NULL) : NULL;
			char *value = o ? json_dumps(json_object_get(o, f->name),
			                             JSON_COMPACT | JSON_ENCODE_ANY)
			                : NULL;
			CHECK_MSG(value != NULL, "%s: no sample value", f->name);
			request_minimal(&r, (enum ipc_op)op);
			CHECK_OK(ipc_request_encode(&r, &json, NULL, NULL));
			char *bad = json && value ? json_with(json, f->name, value) : NULL;
			char m[256];
			if (bad) {
				CHECK_MSG(parse_code(json, strlen(json), NULL, m, sizeof(m)) ==
				              IPC_ERR_NONE,
				          "%s without %s: %s", ipc_op_name(op), f->name, m);
				enum ipc_errcode code =
				    parse_code(bad, strlen(bad), NULL, m, sizeof(m));
				char want[128];
				snprintf(want, sizeof(want), "unknown field '%s' for op '%s'",
				         f->name, ipc_op_name(op));
				CHECK_MSG(code == IPC_ERR_INVALID_FIELD && strcmp(m, want) == 0,
				          "%s: %s (%s)", bad, m, ipc_errcode_name(code));
				n++;
			}
			free(bad);
			free(value);
			json_decref(o);
			cm_free(json);
			cm_free(own_json);
		}
	}
	CHECK(n >= 100);
}

/* Parse `json` with `lim`; the code, and the message in m. */
#define PARSE(json, lim) parse_code((json), strlen(json), (lim), m, sizeof(m))

static void bounds_int(const struct ipc_field *f, const char *base)
{
	char m[256], v[64], want[128];
	struct ipc_limits lim = {0};
	ipc_limits_fill(&lim);
	long long max = ipc_field_max(f, &lim);
	const long long ok[] = {f->min, max};
	for (int k = 0; k < 2; k++) {
		snprintf(v, sizeof(v), "%lld", ok[k]);
		char *j = json_with(base, f->name, v);
		CHECK_MSG(PARSE(j, NULL) == IPC_ERR_NONE, "%s: %s", j, m);
		free(j);
	}
	snprintf(v, sizeof(v), "%lld", f->min - 1);
	char *j = json_with(base, f->name, v);
	snprintf(want, sizeof(want), "field '%s' is %lld, not in [%lld, %lld]", f->name, f->min - 1,
	         f->min, max);
	CHECK_MSG(PARSE(j, NULL) == IPC_ERR_INVALID_FIELD && strcmp(m, want) == 0, "%s: %s", j, m);
	free(j);
	if (max == LLONG_MAX) {
		/* one more is not a JSON integer here at all */
		j = json_with(base, f->name, "9223372036854775808");
		CHECK_MSG(PARSE(j, NULL) == IPC_ERR_INVALID_JSON, "%s: %s", j, m);
	} else {
		snprintf(v, sizeof(v), "%lld", max + 1);
		j = json_with(base, f->name, v);
		CHECK_MSG(PARSE(j, NULL) == IPC_ERR_INVALID_FIELD, "%s: %s", j, m);
	}
	free(j);
	if (f->limit == IPC_FLIM_NONE)
		return;
	/* a bound that is a limit follows the daemon's setting */
	struct ipc_limits small = {.max_tokens = 5, .max_wait_ms = 7};
	ipc_limits_fill(&small);
	max = ipc_field_max(f, &small);
	CHECK(max == 5 || max == 7);
	snprintf(v, sizeof(v), "%lld", max);
	j = json_with(base, f->name, v);
	CHECK_MSG(PARSE(j, &small) == IPC_ERR_NONE, "%s: %s", j, m);
	free(j);
	snprintf(v, sizeof(v), "%lld", max + 1);
	j = json_with(base, f->name, v);
	CHECK_MSG(PARSE(j, &small) == IPC_ERR_INVALID_FIELD, "%s: %s", j, m);
	free(j);
}

static void bounds_num(const struct ipc_field *f, const char *base)
{
	char m[256], v[64];
	bool open = (f->flags & IPC_F_MIN_OPEN) != 0;
	double lo = open ? (f->fmin == 0 ? FLT_MIN : nextafterf(f->fmin, INFINITY)) : f->fmin;
	const double ok[] = {lo, f->fmax};
	const double bad[] = {open ? (double)f->fmin : nextafter((double)f->fmin, -INFINITY),
	                      nextafter((double)f->fmax, INFINITY)};
	for (int k = 0; k < 2; k++) {
		snprintf(v, sizeof(v), "%.17g", ok[k]);
		char *j = json_with(base, f->name, v);
		CHECK_MSG(PARSE(j, NULL) == IPC_ERR_NONE, "%s: %s", j, m);
		free(j);
		snprintf(v, sizeof(v), "%.17g", bad[k]);
		j = json_with(base, f->name, v);
		CHECK_MSG(PARSE(j, NULL) == IPC_ERR_INVALID_FIELD && strstr(m, f->name), "%s: %s",
		          j, m);
		free(j);
	}
}

/* A string of `n` bytes of `c` as a JSON value. */
static char *jtext(size_t n, char c)
{
	char *s = malloc(n + 3);
	s[0] = '"';
	memset(s + 1, c, n);
	memcpy(s + 1 + n, "\"", 2);
	return s;
}

static void bounds_text(const struct ipc_field *f, const char *base)
{
	char m[256];
	/* a constant bound (grammar) under the default limits: its text must
	 * fit the message they make */
	bool by_prompt = f->limit == IPC_FLIM_MAX_PROMPT_BYTES;
	struct ipc_limits lim = {.max_prompt_bytes = by_prompt ? 8 : 0};
	ipc_limits_fill(&lim);
	size_t max = ipc_field_text_max(f, &lim);
	CHECK_EQ_INT(max, by_prompt ? 8 : f->max);
	char *t = jtext(max, 'a'), *j = json_with(base, f->name, t);
	CHECK_MSG(PARSE(j, &lim) == IPC_ERR_NONE, "%s: %s", j, m);
	free(t);
	free(j);
	t = jtext(max + 1, 'a');
	j = json_with(base, f->name, t);
	CHECK_MSG(PARSE(j, &lim) == f->too_long, "%s: %s", j, m);
	free(t);
	free(j);
}

/* The custom shapes' bounds, under small limits. */
static void bounds_custom(const struct ipc_field *f, const char *base)
{
	char m[256];
	struct ipc_limits lim = {.max_stop = 2,
	                         .max_stop_bytes = 3,
	                         .max_messages = 2,
	                         .max_prompt_bytes = 4,
	                         .max_ids = 2};
	if (strcmp(f->name, "messages") != 0 && strcmp(f->name, "input") != 0)
		lim.max_prompt_bytes = 0; /* the default: the base request's text fits */
	ipc_limits_fill(&lim);
	static const struct {
		const char *name, *value;
		enum ipc_errcode want;
	} cases[] = {
	    {"id", "\"iiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiii\"",
	     IPC_ERR_NONE},
	    {"id", "\"iiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiii\"",
	     IPC_ERR_INVALID_FIELD},
	    {"id", "\"i\"", IPC_ERR_NONE},
	    {"id", "\"\"", IPC_ERR_INVALID_FIELD},
	    {"stop", "[\"abc\",\"d\"]", IPC_ERR_NONE},
	    {"stop", "[]", IPC_ERR_NONE},
	    {"stop", "[\"a\",\"b\",\"c\"]", IPC_ERR_INVALID_FIELD},
	    {"stop", "[\"abcd\"]", IPC_ERR_INVALID_FIELD},
	    {"stop", "[\"\"]", IPC_ERR_INVALID_FIELD},
	    /* contents: 4 bytes as JSON together ("\n" is 2) */
	    {"messages",
	     "[{\"role\":\"user\",\"content\":\"ab\"},{\"role\":\"user\",\"content\":\"\\n\"}]",
	     IPC_ERR_NONE},
	    {"messages",
	     "[{\"role\":\"user\",\"content\":\"ab\"},{\"role\":\"user\",\"content\":\"c\\n\"}]",
	     IPC_ERR_PROMPT_TOO_LONG},
	    {"messages",
	     "[{\"role\":\"user\",\"content\":\"\"},{\"role\":\"user\",\"content\":\"\"},"
	     "{\"role\":\"user\",\"content\":\"\"}]",
	     IPC_ERR_INVALID_FIELD},
	    {"messages", "[]", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"0\":-100,\"2147483647\":100,\"5\":0.5}", IPC_ERR_NONE},
	    {"logit_bias", "{}", IPC_ERR_NONE},
	    {"logit_bias", "{\"5\":100.01}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"5\":-1000}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"2147483648\":1}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"-1\":1}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"1x\":1}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"\":1}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "{\"5\":\"1\"}", IPC_ERR_INVALID_FIELD},
	    {"logit_bias", "[[5,1]]", IPC_ERR_INVALID_FIELD},
	    /* texts: 2 at most, 4 bytes as JSON together, none empty */
	    {"input", "\"abcd\"", IPC_ERR_NONE},
	    {"input", "[\"ab\",\"\\n\"]", IPC_ERR_NONE},
	    {"input", "\"abcde\"", IPC_ERR_PROMPT_TOO_LONG},
	    {"input", "[\"a\",\"b\",\"c\"]", IPC_ERR_INVALID_FIELD},
	    {"input", "[]", IPC_ERR_INVALID_FIELD},
	    {"input", "\"\"", IPC_ERR_INVALID_FIELD},
	    {"input", "[\"a\",\"\"]", IPC_ERR_INVALID_FIELD},
	    {"input", "[1,2]", IPC_ERR_INVALID_FIELD},
	    {"input", "5", IPC_ERR_INVALID_FIELD},
	    {"pooling", "\"mean\"", IPC_ERR_NONE},
	    {"pooling", "\"cls\"", IPC_ERR_NONE},
	    {"pooling", "\"last\"", IPC_ERR_NONE},
	    {"pooling", "\"rank\"", IPC_ERR_INVALID_FIELD},
	    {"pooling", "\"none\"", IPC_ERR_INVALID_FIELD},
	    {"pooling", "1", IPC_ERR_INVALID_FIELD},
	    {"json_schema", "{}", IPC_ERR_NONE},
	    {"json_schema", "{\"type\":\"string\",\"x\":[1,{\"y\":null}]}", IPC_ERR_NONE},
	    {"json_schema", "[]", IPC_ERR_INVALID_FIELD},
	    {"json_schema", "\"{}\"", IPC_ERR_INVALID_FIELD},
	    {"json_schema", "true", IPC_ERR_INVALID_FIELD},
	    {"ids", "[0,2147483647]", IPC_ERR_NONE},
	    {"ids", "[]", IPC_ERR_NONE},
	    {"ids", "[1,2,3]", IPC_ERR_TOO_LARGE},
	    {"ids", "[-1]", IPC_ERR_INVALID_FIELD},
	    {"ids", "[2147483648]", IPC_ERR_INVALID_FIELD},
	};
	int n = 0;
	for (size_t k = 0; k < CM_ARRAY_LEN(cases); k++) {
		if (strcmp(cases[k].name, f->name) != 0)
			continue;
		char *j = json_with(base, f->name, cases[k].value);
		enum ipc_errcode got = PARSE(j, &lim);
		CHECK_MSG(got == cases[k].want, "%s: %s (%s)", j, m, ipc_errcode_name(got));
		free(j);
		n++;
	}
	CHECK_MSG(n >= 3, "%s: no bounds cases", f->name);
}

/* Each range's bounds pass and one step outside fails, for every op that
 * takes the field. */
static void test_fields_bounds(void)
{
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		/* the op's request without the field under test */
		for (size_t i = 0; i < ipc_n_fields; i++) {
			const struct ipc_field *f = &ipc_fields[i];
			if (f->type == IPC_FT_ENVELOPE || !ipc_field_accepts(f, (enum ipc_op)op))
				continue;
			struct ipc_request r;
			request_minimal(&r, (enum ipc_op)op);
			char *json = NULL;
			CHECK_OK(ipc_request_encode(&r, &json, NULL, NULL));
			json_t *o = json ? json_loads(json, 0, NULL) : NULL;
			char *base = NULL;
			if (o) {
				json_object_del(o, f->name);
				base = json_dumps(o, JSON_COMPACT);
			}
			CHECK(base != NULL);
			if (base) {
				char m[256];
				CHECK_MSG((f->flags & IPC_F_REQUIRED) ||
				              PARSE(base, NULL) == IPC_ERR_NONE,
				          "%s: %s", base, m);
				switch (f->type) {
				case IPC_FT_INT:
					bounds_int(f, base);
					break;
				case IPC_FT_NUM:
					bounds_num(f, base);
					break;
				case IPC_FT_TEXT:
					bounds_text(f, base);
					break;
				case IPC_FT_CUSTOM:
					bounds_custom(f, base);
					break;
				case IPC_FT_BOOL: {
					char *j = json_with(base, f->name, "1");
					CHECK_MSG(PARSE(j, NULL) == IPC_ERR_INVALID_FIELD, "%s", j);
					free(j);
					break;
				}
				case IPC_FT_ENVELOPE:
					break;
				}
				/* and a required field missing */
				if (f->flags & IPC_F_REQUIRED) {
					char want[64];
					snprintf(want, sizeof(want), "missing field '%s'", f->name);
					CHECK_MSG(PARSE(base, NULL) == IPC_ERR_INVALID_FIELD &&
					              strcmp(m, want) == 0,
					          "%s: %s", base, m);
				}
			}
			free(base);
			json_decref(o);
			cm_free(json);
		}
	}
}

/* The docs name every field of every op, and the splicer regenerates only
 * its sections. */
static void test_fields_doc(void)
{
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		char *md = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&md, &len);
		ipc_fields_doc(f, (enum ipc_op)op, IPC_OP_NONE);
		fclose(f);
		bool any = false;
		for (size_t i = 0; i < ipc_n_fields; i++) {
			const struct ipc_field *fi = &ipc_fields[i];
			char row[64];
			if (fi->type == IPC_FT_ENVELOPE || !ipc_field_accepts(fi, (enum ipc_op)op))
				continue;
			snprintf(row, sizeof(row), "\n| `%s` | ", fi->name);
			CHECK_MSG(strstr(md, row) != NULL, "%s: no row for %s", ipc_op_name(op),
			          fi->name);
			any = true;
		}
		if (!any)
			CHECK(strstr(md, "No fields") != NULL);
		free(md);
	}
	/* chat beyond generate: what chat adds, and the rest by name */
	char *md = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&md, &len);
	ipc_fields_doc(f, IPC_OP_CHAT, IPC_OP_GENERATE);
	fclose(f);
	CHECK(strstr(md, "| `messages` | ") != NULL);
	CHECK(strstr(md, "| `temperature` |") == NULL);
	CHECK(strstr(md, "| all fields of `generate` except `prompt` |") != NULL);
	CHECK(strstr(md, "\"system\"\\|\"user\"") != NULL); /* '|' escaped in cells */
	free(md);

	static const struct {
		const char *in;
		int rc;
		const char *has;
	} docs[] = {
	    {"a\n<!-- generated: fields of cancel -->\nold\n<!-- end generated -->\nb\n", 0,
	     "a\n<!-- generated: fields of cancel -->\n\n| field | type | default | range | |\n"
	     "|---|---|---|---|---|\n| `id` | string | required | "},
	    {"<!-- generated: fields of info (x) -->\n<!-- end generated -->\n", 0,
	     "-->\n\nNo fields besides `v` and `op`.\n\n<!-- end generated -->\n"},
	    {"<!-- generated: fields of nothing -->\n<!-- end generated -->\n", -EINVAL, NULL},
	    {"<!-- generated: fields of chat beyond none -->\n<!-- end generated -->\n", -EINVAL,
	     NULL},
	    {"<!-- generated: fields of poll -->\nunclosed\n", -EINVAL, NULL},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(docs); i++) {
		FILE *in = fmemopen((void *)docs[i].in, strlen(docs[i].in), "r");
		md = NULL;
		f = open_memstream(&md, &len);
		struct cm_err err = {0};
		int rc = ipc_protocol_doc_update(in, f, &err);
		fclose(f);
		fclose(in);
		CHECK_MSG(rc == docs[i].rc, "doc %zu: %d %s", i, rc, err.msg);
		if (docs[i].has)
			CHECK_MSG(strstr(md, docs[i].has) != NULL, "doc %zu: %s", i, md);
		if (rc == 0 && docs[i].has) {
			CHECK(strstr(md, "old") == NULL);
			/* regenerating the output changes nothing */
			char *md2 = NULL;
			size_t len2 = 0;
			in = fmemopen(md, len, "r");
			f = open_memstream(&md2, &len2);
			CHECK_OK(ipc_protocol_doc_update(in, f, NULL));
			fclose(f);
			fclose(in);
			CHECK(len2 == len && memcmp(md, md2, len) == 0);
			free(md2);
		}
		free(md);
	}
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--doc") == 0) {
		struct cm_err err = {0};
		if (ipc_protocol_doc_update(stdin, stdout, &err) == 0 && fflush(stdout) == 0)
			return 0;
		fprintf(stderr, "test_ipc_protocol --doc: %s\n", err.msg);
		return 1;
	}
	if (argc == 2 && strcmp(argv[1], "--fields") == 0) {
		/* "OP FIELD" for every field an op accepts (protocol_doc.sh) */
		for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++)
			for (size_t i = 0; i < ipc_n_fields; i++)
				if (ipc_fields[i].type != IPC_FT_ENVELOPE &&
				    ipc_field_accepts(&ipc_fields[i], (enum ipc_op)op))
					printf("%s %s\n", ipc_op_name(op), ipc_fields[i].name);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	TEST_RUN(test_bad_table);
	TEST_RUN(test_bad_built);
	TEST_RUN(test_valid_generate_full);
	TEST_RUN(test_valid_generate_defaults);
	TEST_RUN(test_valid_chat);
	TEST_RUN(test_valid_others);
	TEST_RUN(test_parse_alloc_failures);
	TEST_RUN(test_error_table);
	TEST_RUN(test_request_roundtrip);
	TEST_RUN(test_reply_roundtrip);
	TEST_RUN(test_reply_decode_hostile);
	TEST_RUN(test_limits_default);
	TEST_RUN(test_structured_output);
	TEST_RUN(test_prompt_at_limit);
	TEST_RUN(test_text_bytes_as_encoded);
	TEST_RUN(test_float_fields_as_stored);
	TEST_RUN(test_numbers_not_narrowed);
	TEST_RUN(test_fields_table);
	TEST_RUN(test_fields_roundtrip);
	TEST_RUN(test_fields_refused_by_other_ops);
	TEST_RUN(test_fields_bounds);
	TEST_RUN(test_fields_doc);
	return test_finish();
}
