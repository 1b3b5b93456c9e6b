/* tests/unit/test_tools_ctl_args.c: edgelmctl's numeric options (tools/lib/args.c's
 * parsers since the tenth session; edgelmctl had copies of its own).
 *
 * A bad number is a usage error (exit 1) that names the option; a good one
 * gets past parsing to the connection, which fails against a socket that
 * nobody serves (exit 3): so the largest seed and finite temperatures are
 * taken, and "12k", "1e999", "abc", a negative seed are not. */
#include "common/common.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

#define SOCK "ipc:///nonexistent/edgelm-test.sock"

static void run(const char *args, int want_rc, const char *want_msg)
{
	char cmd[4096], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s --socket %s %s 2>&1", test_bin("edgelmctl"), SOCK, args);
	int rc = test_run_capture(cmd, &out);
	CHECK_MSG(rc == want_rc, "%s: exit %d, want %d: %s", args, rc, want_rc, out);
	if (want_msg)
		CHECK_MSG(out && strstr(out, want_msg) != NULL, "%s: %s", args, out);
	free(out);
}

static void test_bad_numbers(void)
{
	run("generate -n 12k hi", 1, "-n: '12k' is not a positive count");
	run("generate -n 0 hi", 1, "-n: '0' is not a positive count");
	run("generate --temp abc hi", 1, "'abc' is not a number");
	run("generate --temp 1e999 hi", 1, "'1e999' is not a number");
	run("generate --seed -1 hi", 1, "--seed: '-1' is not a seed");
	run("generate --priority 11 hi", 1, "--priority: '11' is not in -10..10");
	run("detokenize 1 2x", 1, "'2x' is not a token id");
	run("--timeout 5s health", 1, "--timeout: '5s' is not a time in ms");
}

static void test_good_numbers(void)
{
	/* parsed, then the connection fails: exit 3 */
	run("generate -n 2 --temp 0.5 --top-p 1 --seed 9223372036854775807 hi", 3, NULL);
	run("generate --priority -10 --deadline 86400000 hi", 3, NULL);
	run("detokenize 0 2147483647", 3, NULL);
	run("--timeout 100 health", 3, NULL);
}

/* --socket repeats and takes comma lists (issue 26): with nobody serving
 * any of them the message counts them all; TLS options are taken, and
 * tls+tcp:// without a CA is a usage error, refused before dialling */
static void test_sockets_and_tls(void)
{
	run("--socket ipc:///nonexistent/b.sock,ipc:///nonexistent/c.sock health", 3,
	    "cannot connect to any of 3 daemons");
	run("-s ipc:///nonexistent/b.sock -s ' ipc:///nonexistent/c.sock , ' health", 3,
	    "cannot connect to any of 3 daemons");
	run("-s tls+tcp://localhost:1 --tls-cert /nonexistent/c.pem --tls-key /nonexistent/k.pem "
	    "health </dev/null",
	    1, "TLS needs a CA file");
	run("-s tls+tcp://localhost:1 --tls-ca /nonexistent/ca.pem health", 3,
	    "/nonexistent/ca.pem");
}

/* --grammar-file and --json-schema: read before connecting, one or the
 * other; what the files hold is the daemon's to judge */
static void test_structured_output_files(void)
{
	const char *tmp = getenv("TEST_TMPDIR");
	if (!tmp) {
		TEST_SKIP("TEST_TMPDIR is not set");
		return;
	}
	char path[512], big[512], args[2048];
	snprintf(path, sizeof(path), "%s/ctl-schema.json", tmp);
	snprintf(big, sizeof(big), "%s/ctl-big.gbnf", tmp);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("{\"type\":\"object\"}\n", f);
	fclose(f);
	f = fopen(big, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	for (int i = 0; i < (64 << 10) + 1; i++)
		fputc('a', f);
	fclose(f);
	snprintf(args, sizeof(args), "generate --json-schema %s hi", path);
	run(args, 3, NULL);
	snprintf(args, sizeof(args), "chat --grammar-file %s </dev/null", path);
	run(args, 3, NULL);
	run("generate --json-schema /nonexistent/s.json hi", 1,
	    "/nonexistent/s.json: No such file or directory");
	snprintf(args, sizeof(args), "generate --grammar-file %s hi", big);
	run(args, 1, "more than 65536 bytes");
	snprintf(args, sizeof(args), "generate --grammar-file %s --json-schema %s hi", path, path);
	run(args, 1, "--grammar-file and --json-schema exclude each other");
	remove(path);
	remove(big);
}

int main(void)
{
	TEST_RUN(test_bad_numbers);
	TEST_RUN(test_good_numbers);
	TEST_RUN(test_sockets_and_tls);
	TEST_RUN(test_structured_output_files);
	return test_finish();
}
