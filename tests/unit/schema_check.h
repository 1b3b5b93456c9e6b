/* tests/unit/schema_check.h: a small JSON Schema validator for the subset
 * ipc/json_schema.c converts (type, enum, const, properties, required,
 * additionalProperties, items, minItems, maxItems, minLength, maxLength,
 * minimum, exclusiveMinimum, anyOf, oneOf, $ref into the document),
 * written from the JSON Schema
 * spec rather than from the converter, so the tests that sample under a
 * converted grammar check the output against the schema itself. */
#ifndef EDGELM_TESTS_SCHEMA_CHECK_H
#define EDGELM_TESTS_SCHEMA_CHECK_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool sc_type_ok(json_t *v, const char *t)
{
	if (strcmp(t, "string") == 0)
		return json_is_string(v);
	if (strcmp(t, "integer") == 0)
		return json_is_integer(v) ||
		       (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
	if (strcmp(t, "number") == 0)
		return json_is_number(v);
	if (strcmp(t, "boolean") == 0)
		return json_is_boolean(v);
	if (strcmp(t, "null") == 0)
		return json_is_null(v);
	if (strcmp(t, "object") == 0)
		return json_is_object(v);
	if (strcmp(t, "array") == 0)
		return json_is_array(v);
	return false;
}

/* JSON equality with 1 == 1.0, as JSON Schema's enum and const compare. */
static bool sc_equal(json_t *a, json_t *b)
{
	if (json_is_number(a) && json_is_number(b))
		return json_number_value(a) == json_number_value(b);
	if (json_typeof(a) != json_typeof(b))
		return false;
	if (json_is_array(a)) {
		if (json_array_size(a) != json_array_size(b))
			return false;
		for (size_t i = 0; i < json_array_size(a); i++)
			if (!sc_equal(json_array_get(a, i), json_array_get(b, i)))
				return false;
		return true;
	}
	if (json_is_object(a)) {
		const char *k;
		json_t *x;
		if (json_object_size(a) != json_object_size(b))
			return false;
		json_object_foreach (a, k, x) {
			json_t *y = json_object_get(b, k);
			if (!y || !sc_equal(x, y))
				return false;
		}
		return true;
	}
	return json_equal(a, b);
}

static size_t sc_utf8_len(const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xc0) != 0x80;
	return k;
}

/* The value at "#/a/b" in root (no escapes beyond ~0 ~1 needed here). */
static json_t *sc_resolve(json_t *root, const char *ref)
{
	if (strcmp(ref, "#") == 0)
		return root;
	if (strncmp(ref, "#/", 2) != 0)
		return NULL;
	json_t *t = root;
	char seg[256];
	const char *p = ref + 1;
	while (*p == '/' && t) {
		p++;
		size_t n = 0;
		while (*p && *p != '/' && n < sizeof(seg) - 1) {
			if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
				seg[n++] = p[1] == '0' ? '~' : '/';
				p += 2;
			} else {
				seg[n++] = *p++;
			}
		}
		seg[n] = '\0';
		t = json_object_get(t, seg);
	}
	return t;
}

#define SC_FAIL(...)                                                                               \
	do {                                                                                       \
		snprintf(why, cap, __VA_ARGS__);                                                   \
		return false;                                                                      \
	} while (0)

/* Whether v is valid under schema s (root: the whole document, for $ref);
 * why says where it is not. */
static bool sc_valid(json_t *root, json_t *s, json_t *v, char *why, size_t cap, int depth)
{
	if (depth > 64)
		SC_FAIL("schema nested too deep");
	if (json_is_true(s))
		return true;
	if (!json_is_object(s))
		SC_FAIL("schema is not an object");
	json_t *k;
	if ((k = json_object_get(s, "$ref"))) {
		json_t *t = sc_resolve(root, json_string_value(k));
		if (!t)
			SC_FAIL("$ref %s unresolved", json_string_value(k));
		if (!sc_valid(root, t, v, why, cap, depth + 1))
			return false;
	}
	if ((k = json_object_get(s, "type"))) {
		bool ok = false;
		if (json_is_string(k))
			ok = sc_type_ok(v, json_string_value(k));
		for (size_t i = 0; json_is_array(k) && i < json_array_size(k) && !ok; i++)
			ok = sc_type_ok(v, json_string_value(json_array_get(k, i)));
		if (!ok)
			SC_FAIL("type mismatch");
	}
	if ((k = json_object_get(s, "const")) && !sc_equal(k, v))
		SC_FAIL("not the const");
	if ((k = json_object_get(s, "enum"))) {
		bool ok = false;
		for (size_t i = 0; i < json_array_size(k) && !ok; i++)
			ok = sc_equal(json_array_get(k, i), v);
		if (!ok)
			SC_FAIL("not in the enum");
	}
	if ((k = json_object_get(s, "anyOf"))) {
		bool ok = false;
		char w[128];
		for (size_t i = 0; i < json_array_size(k) && !ok; i++)
			ok = sc_valid(root, json_array_get(k, i), v, w, sizeof(w), depth + 1);
		if (!ok)
			SC_FAIL("no anyOf alternative");
	}
	if ((k = json_object_get(s, "oneOf"))) {
		int n = 0;
		char w[128];
		for (size_t i = 0; i < json_array_size(k); i++)
			n += sc_valid(root, json_array_get(k, i), v, w, sizeof(w), depth + 1);
		if (n != 1)
			SC_FAIL("%d oneOf alternatives match", n);
	}
	if (json_is_number(v)) {
		double x = json_number_value(v);
		if ((k = json_object_get(s, "minimum")) && x < json_number_value(k))
			SC_FAIL("below minimum");
		if ((k = json_object_get(s, "exclusiveMinimum")) && x <= json_number_value(k))
			SC_FAIL("not above exclusiveMinimum");
	}
	if (json_is_string(v)) {
		size_t n = sc_utf8_len(json_string_value(v), json_string_length(v));
		if ((k = json_object_get(s, "minLength")) && n < (size_t)json_number_value(k))
			SC_FAIL("string shorter than minLength");
		if ((k = json_object_get(s, "maxLength")) && n > (size_t)json_number_value(k))
			SC_FAIL("string longer than maxLength");
	}
	if (json_is_array(v)) {
		size_t n = json_array_size(v);
		if ((k = json_object_get(s, "minItems")) && n < (size_t)json_number_value(k))
			SC_FAIL("fewer items than minItems");
		if ((k = json_object_get(s, "maxItems")) && n > (size_t)json_number_value(k))
			SC_FAIL("more items than maxItems");
		if ((k = json_object_get(s, "items")))
			for (size_t i = 0; i < n; i++)
				if (!sc_valid(root, k, json_array_get(v, i), why, cap, depth + 1))
					return false;
	}
	if (json_is_object(v)) {
		json_t *props = json_object_get(s, "properties");
		json_t *addl = json_object_get(s, "additionalProperties");
		if ((k = json_object_get(s, "required")))
			for (size_t i = 0; i < json_array_size(k); i++)
				if (!json_object_get(v, json_string_value(json_array_get(k, i))))
					SC_FAIL("required '%s' missing",
					        json_string_value(json_array_get(k, i)));
		const char *key;
		json_t *x;
		json_object_foreach (v, key, x) {
			json_t *ps = props ? json_object_get(props, key) : NULL;
			if (ps) {
				if (!sc_valid(root, ps, x, why, cap, depth + 1))
					return false;
			} else if (json_is_false(addl)) {
				SC_FAIL("additional property '%s'", key);
			}
		}
	}
	return true;
}

/* text parses as one JSON value and is valid under the schema text. */
static bool sc_check_text(const char *schema_text, const char *text, char *why, size_t cap)
{
	json_t *s = json_loads(schema_text, 0, NULL);
	json_error_t je;
	json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
	bool ok;
	if (!s) {
		snprintf(why, cap, "the schema does not parse");
		ok = false;
	} else if (!v) {
		snprintf(why, cap, "not JSON: %.60s", je.text);
		ok = false;
	} else {
		ok = sc_valid(s, s, v, why, cap, 0);
	}
	json_decref(s);
	json_decref(v);
	return ok;
}

#endif
