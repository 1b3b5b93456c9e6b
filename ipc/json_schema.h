/* ipc/json_schema.h: JSON Schema to GBNF, for structured output. The
 * engine's grammar (engine_grammar_new) knows no JSON; the daemon and
 * edgelm-run turn a request's `json_schema` into GBNF text here first.
 * docs/grammar.md ("JSON Schema") lists the subset. */
#ifndef EDGELM_IPC_JSON_SCHEMA_H
#define EDGELM_IPC_JSON_SCHEMA_H

#include "common/common.h"

/* Bounds of a conversion: a schema nested deeper, a count (minItems,
 * maxItems, minLength, maxLength) larger, or a grammar longer is refused. */
#define IPC_SCHEMA_MAX_DEPTH 64
#define IPC_SCHEMA_MAX_COUNT 1024
#define IPC_SCHEMA_MAX_GBNF ((size_t)1 << 20)

/* GBNF text for a JSON schema (the common subset: object, properties,
 * required, additionalProperties false, string, integer, number, boolean,
 * null, enum, const, array with items/minItems/maxItems, nesting, anyOf,
 * oneOf, $ref to #/$defs or #/definitions); anything outside it is refused
 * with -ENOTSUP and a message naming the JSON pointer of the unsupported
 * part, a schema that is not valid JSON or breaks its own rules with
 * -EINVAL. The grammar's `root` is the value itself, with no whitespace
 * around it, so generation can end as soon as the value is complete;
 * whitespace between tokens is bounded. *ret_gbnf is cm_malloc'd. */
int ipc_json_schema_to_gbnf(const char *schema_json, size_t len, char **ret_gbnf,
                            struct cm_err *err);

/* GBNF for any JSON object (JSON mode, OpenAI's response_format
 * json_object), nested at most 8 deep; made at the first call and kept.
 * NULL only when that ran out of memory. Thread-safe. */
const char *ipc_json_object_gbnf(void);

#endif
