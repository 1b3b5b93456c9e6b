/* tests/fuzz/fuzz_json_schema.c: libFuzzer entry point for JSON Schema to
 * GBNF (ipc/json_schema.c).
 *
 * The input is a schema's text. A conversion must either fail with a
 * message and a code among ENOTSUP, EINVAL, E2BIG and ENOMEM, or give a
 * grammar that the engine compiles (the converter never writes GBNF the
 * engine refuses) and whose root accepts no empty text (the value is
 * never empty). Violations trap, so libFuzzer and the replay driver both
 * report them.
 *
 *   make fuzz && build-fuzz/fuzz_json_schema tests/fuzz/corpus/json_schema */
#include "engine/engine.h"
#include "engine/grammar_impl.h"
#include "ipc/json_schema.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                                                 \
	do {                                                                                       \
		if (!(x))                                                                          \
			__builtin_trap();                                                          \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cm_err err = {0};
	char *gbnf = NULL;
	int rc = ipc_json_schema_to_gbnf((const char *)data, size, &gbnf, &err);
	if (rc) {
		REQUIRE(gbnf == NULL && err.code == rc && err.msg[0]);
		REQUIRE(rc == -ENOTSUP || rc == -EINVAL || rc == -E2BIG || rc == -ENOMEM);
		return 0;
	}
	REQUIRE(gbnf && strncmp(gbnf, "root ::= ", 9) == 0);
	engine_grammar *g = NULL;
	rc = engine_grammar_new(NULL, gbnf, strlen(gbnf), &g, &err);
	REQUIRE(rc == 0 || rc == -ENOMEM);
	if (g) {
		struct grammar_state *st = NULL;
		if (grammar_state_new(g, &st, NULL) == 0) {
			REQUIRE(!grammar_state_accepting(st));
			grammar_state_free(st);
		}
	}
	engine_grammar_free(g);
	cm_free(gbnf);
	return 0;
}
