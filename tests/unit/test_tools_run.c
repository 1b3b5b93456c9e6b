/* tests/unit/test_tools_run.c: edgelm-run end to end, as a user runs it.
 * - greedy text for every reference prompt equals the reference story, with
 *   the default KV cache (f16) and the prompt prefilled in one chunk or in
 *   chunks of 3 (--batch);
 * - --json gives the reference ids and top logits: within 1e-3 with
 *   --kv-type f32, within 0.03 with the default f16 cache;
 * - --tokenize prints the reference prompt ids (on the model and on a
 *   vocab-only GGUF);
 * - --quantize TYPE gives the output of the file edgelm-quantize writes for
 *   TYPE, and says what it cost;
 * - --embed prints a unit vector of n_embd values, --json the same as
 *   JSON; --pooling changes it, and an unknown pooling is a usage error;
 * - --grammar-file: the output matches the grammar and ends with it; a bad
 *   grammar exits 2 with its line and column;
 * - --json-schema: the output is JSON of the schema's shape; a schema
 *   outside the subset exits 2 naming the JSON pointer; not with
 *   --grammar-file;
 * - usage errors exit 1. */
#include "common/common.h"
#include "tests/test.h"

#include <jansson.h>

static const char *bin(void)
{
	return test_bin("edgelm-run");
}

/* Single-quote a string for the shell. */
static void shq(char *dst, size_t cap, const char *s)
{
	size_t k = 0;
	dst[k++] = '\'';
	for (; *s && k + 5 < cap; s++) {
		if (*s == '\'') {
			memcpy(dst + k, "'\\''", 4);
			k += 4;
		} else {
			dst[k++] = *s;
		}
	}
	dst[k++] = '\'';
	dst[k] = '\0';
}

static json_t *ref;

static bool need_ref(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m) ||
	    !test_file_exists(test_data_path("reference/stories260K-f32.json"))) {
		TEST_SKIP_DATA("stories260K model or reference not found under $EDGELM_TESTDATA");
		return false;
	}
	if (!ref)
		ref = json_load_file(test_data_path("reference/stories260K-f32.json"), 0, NULL);
	return ref != NULL;
}

static void reference_text(const char *opts)
{
	if (!need_ref())
		return;
	char model[4096];
	snprintf(model, sizeof(model), "%s", test_data_path("models/stories260K-f32.gguf"));
	size_t i;
	json_t *item;
	json_array_foreach(ref, i, item) {
		char q[1024], cmd[16384], *out = NULL;
		shq(q, sizeof(q), json_string_value(json_object_get(item, "prompt")));
		size_t n_steps = json_array_size(json_object_get(item, "steps"));
		snprintf(cmd, sizeof(cmd), "%s -m '%s' -p %s -n %zu --temp 0 -q %s", bin(), model, q,
			 n_steps, opts);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
		const char *want = json_string_value(json_object_get(item, "text"));
		size_t wl = strlen(want);
		CHECK_MSG(strncmp(out, want, wl) == 0 && strcmp(out + wl, "\n") == 0,
			  "prompt %zu (%s):\n got: %s\nwant: %s", i, opts, out, want);
		free(out);
	}
}

static void test_reference_text(void)
{
	reference_text("");
}

/* The prompt prefilled in chunks of 3 tokens, or 1, with an f32 cache; a
 * q8_0 cache runs (its greedy text may leave the reference's: its bounds
 * are in test_engine_model_ref.c). */
static void test_reference_text_options(void)
{
	reference_text("--batch 3");
	reference_text("-b 1 --kv-type f32");
	if (!need_ref())
		return;
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon a time' -n 32 --temp 0 -q --kv-type q8_0",
		 bin(), test_data_path("models/stories260K-f32.gguf"));
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK(out && strlen(out) > 32);
	free(out);
}

static void json_mode(const char *opts, double tol)
{
	if (!need_ref())
		return;
	json_t *item = json_array_get(ref, 0);
	char q[1024], cmd[16384], *out = NULL;
	shq(q, sizeof(q), json_string_value(json_object_get(item, "prompt")));
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p %s -n 16 --temp 0 -q --json --top-logits 8 %s",
		 bin(), test_data_path("models/stories260K-f32.gguf"), q, opts);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	json_t *steps = json_object_get(item, "steps");
	char *line = out, *save = NULL;
	int k = 0;
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save), k++) {
		json_error_t je;
		json_t *j = json_loads(line, 0, &je);
		CHECK_MSG(j != NULL, "line %d is not JSON: %s", k, line);
		json_t *st = json_array_get(steps, (size_t)k);
		CHECK_EQ_INT(json_integer_value(json_object_get(j, "id")),
			     json_integer_value(json_object_get(st, "token")));
		CHECK(json_is_string(json_object_get(j, "text")));
		json_t *top = json_object_get(j, "top"), *rtop = json_object_get(st, "top");
		CHECK_EQ_INT(json_array_size(top), 8);
		for (size_t t = 0; t < json_array_size(top) && t < json_array_size(rtop); t++) {
			json_t *a = json_array_get(top, t), *b = json_array_get(rtop, t);
			CHECK_EQ_INT(json_integer_value(json_array_get(a, 0)),
				     json_integer_value(json_array_get(b, 0)));
			CHECK_NEAR(json_number_value(json_array_get(a, 1)),
				   json_number_value(json_array_get(b, 1)), tol);
		}
		json_decref(j);
	}
	CHECK_EQ_INT(k, 16);
	free(out);
}

static void test_json_mode(void)
{
	json_mode("--kv-type f32", 1e-3);
	json_mode("", 0.03); /* the default f16 cache: test_engine_model_ref.c's bound */
}

static void test_tokenize_mode(void)
{
	if (!need_ref())
		return;
	const char *files[] = {"models/stories260K-f32.gguf", "models/stories260K-f16.gguf"};
	for (size_t f = 0; f < CM_ARRAY_LEN(files); f++) {
		size_t i;
		json_t *item;
		json_array_foreach(ref, i, item) {
			char q[1024], cmd[16384], *out = NULL;
			shq(q, sizeof(q), json_string_value(json_object_get(item, "prompt")));
			snprintf(cmd, sizeof(cmd), "%s -m '%s' -p %s --tokenize", bin(),
				 test_data_path(files[f]), q);
			CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
			json_t *got = json_loads(out, 0, NULL);
			CHECK_MSG(json_equal(got, json_object_get(item, "prompt_tokens")),
				  "prompt %zu: %s", i, out);
			json_decref(got);
			free(out);
		}
	}
	/* vocab-only GGUF (no tensors at all) */
	const char *v = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
	if (test_file_exists(v)) {
		char cmd[16384], *out = NULL;
		snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Hello world' --tokenize", bin(), v);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
		CHECK_STREQ(out, "[1, 15043, 3186]\n");
		free(out);
	}
	/* vocabularies of architectures the engine does not run: tokenizing
	 * needs none (issue 25); generating from them is still refused */
	static const struct {
		const char *file, *want;
	} other[] = {
		{"vocab/ggml-vocab-gpt-2.gguf", "[15496, 995]\n"},
		{"vocab/ggml-vocab-starcoder.gguf", "[8302, 5810]\n"},
	};
	for (size_t k = 0; k < CM_ARRAY_LEN(other); k++) {
		const char *p = test_data_path(other[k].file);
		if (!test_file_exists(p))
			continue;
		char cmd[16384], *out = NULL;
		snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Hello world' --tokenize", bin(), p);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
		CHECK_MSG(out && strcmp(out, other[k].want) == 0, "%s: %s", other[k].file, out);
		free(out);
		snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Hello world' -n 2 2>&1", bin(), p);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
		CHECK_MSG(out && strstr(out, "is not supported"), "%s", out);
		free(out);
	}
}

/* --logit-bias and --ignore-eos: the end-of-text token (2) pushed to
 * the top ends the run at once, unless --ignore-eos, which runs to -n;
 * an id the model lacks is a usage error (exit 1) naming it */
static int count_lines(const char *s)
{
	int n = 0;
	for (; s && *s; s++)
		n += *s == '\n';
	return n;
}

static void test_bias_ignore_eos(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m)) {
		TEST_SKIP_DATA("no %s", m);
		return;
	}
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon a time' -n 5 --temp 0 -q --json "
		 "--logit-bias 2=100", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK_MSG(count_lines(out) == 1 && strncmp(out, "{\"id\":2,", 8) == 0, "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon a time' -n 5 --temp 0 -q --json "
		 "--logit-bias 2=100 --ignore-eos", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK_MSG(count_lines(out) == 5, "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once' -n 5 --logit-bias 512=-100 2>&1", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	CHECK_MSG(out && strstr(out, "token 512 is not in the vocabulary"), "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once' --logit-bias 5 2>&1", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
}

/* --context-shift: a generation of 100 tokens in a context of 32 goes on
 * (--ignore-eos), and its first tokens are those of the run that stops at
 * the context; --keep bounds what a shift may keep. */
static void test_context_shift(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m)) {
		TEST_SKIP_DATA("no %s", m);
		return;
	}
	char cmd[16384], *full = NULL, *shifted = NULL, *out = NULL;
	const char *common = "-p 'Once upon a time' -c 32 -n 100 --temp 0 -q --json "
			     "--top-logits 0 --ignore-eos";
	snprintf(cmd, sizeof(cmd), "%s -m '%s' %s", bin(), m, common);
	CHECK_EQ_INT(test_run_capture(cmd, &full), 0);
	/* 5 prompt tokens: one token for each of the 27 free positions */
	CHECK_MSG(count_lines(full) == 27, "%d lines", count_lines(full));
	snprintf(cmd, sizeof(cmd), "%s -m '%s' %s --context-shift", bin(), m, common);
	CHECK_EQ_INT(test_run_capture(cmd, &shifted), 0);
	CHECK_MSG(count_lines(shifted) == 100, "%d lines", count_lines(shifted));
	CHECK(full && shifted && strncmp(full, shifted, strlen(full)) == 0);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' %s --context-shift --keep -1", bin(), m, common);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK_MSG(count_lines(out) == 100, "%d lines", count_lines(out));
	free(out);
	/* keeping 31 of 32 leaves nothing to drop: it stops at the context */
	snprintf(cmd, sizeof(cmd), "%s -m '%s' %s --context-shift --keep 31 2>&1", bin(), m,
		 common);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK(out && strstr(out, "leaves nothing to drop") != NULL);
	free(out);
	free(full);
	free(shifted);
}

/* --top-logits 0 --json gives empty "top" lists; it indexed ids[-1] and
 * died with heap corruption. */
static void test_top_logits_zero(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m)) {
		TEST_SKIP_DATA("no %s", m);
		return;
	}
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once' -n 3 --temp 0 -q --json --top-logits 0",
		 bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK_MSG(count_lines(out) == 3 && strstr(out, "\"top\":[]}\n"), "%s", out);
	free(out);
}

static void test_quantize(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m)) {
		TEST_SKIP_DATA("no %s", m);
		return;
	}
	char model[4096], qf[4096], cmd[16384], *a = NULL, *b = NULL, *err = NULL;
	snprintf(model, sizeof(model), "%s", m);
	snprintf(qf, sizeof(qf), "%s/run-q4_k_m-%d.gguf", test_tmpdir(), (int)getpid());
	snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' q4_k_m >/dev/null 2>&1",
		 test_bin("edgelm-quantize"), model, qf);
	CHECK_EQ_INT(system(cmd), 0);
	const char *opts = "-p 'Once upon a time' -n 12 --temp 0 -q --json -t 2";
	snprintf(cmd, sizeof(cmd), "%s -m '%s' %s --quantize q4_k_m", bin(), model, opts);
	CHECK_EQ_INT(test_run_capture(cmd, &a), 0);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' %s", bin(), qf, opts);
	CHECK_EQ_INT(test_run_capture(cmd, &b), 0);
	CHECK_MSG(a && b && strcmp(a, b) == 0, "on load:\n%s\nfile:\n%s", a, b);
	/* without -q: what it cost, and the fallbacks (rows of 64 and 172) */
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p Once -n 1 --quantize Q4_K_M 2>&1 >/dev/null",
		 bin(), model);
	CHECK_EQ_INT(test_run_capture(cmd, &err), 0);
	CHECK_MSG(err && strstr(err, "quantized 37 tensors to Q4_K_M on load in ") &&
			  strstr(err, "MiB -> ") && strstr(err, "kept wider than Q4_K_M"),
		  "%s", err);
	free(a);
	free(b);
	free(err);
	unlink(qf);
}

static void test_embed_mode(void)
{
	if (!need_ref())
		return;
	const char *m = test_data_path("models/stories260K-f32.gguf");
	char cmd[8192], *out = NULL, *out2 = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon a time' --embed --json -q", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	json_t *j = json_loads(out ? out : "", 0, NULL);
	json_t *e = json_object_get(j, "embedding");
	CHECK(json_array_size(e) == 64); /* stories260K's n_embd */
	CHECK_STREQ(json_string_value(json_object_get(j, "pooling")), "mean");
	CHECK(json_integer_value(json_object_get(j, "n_tokens")) == 5);
	double ss = 0;
	for (size_t i = 0; i < json_array_size(e); i++)
		ss += json_number_value(json_array_get(e, i)) * json_number_value(json_array_get(e, i));
	CHECK_MSG(fabs(ss - 1) < 1e-5, "norm^2 %g", ss);
	/* the text form carries the same values */
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon a time' --embed -q", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out2), 0);
	char *p = out2 ? out2 : "";
	for (size_t i = 0; i < json_array_size(e); i++) {
		char *end;
		double v = strtod(p, &end);
		CHECK(end != p && fabs(v - json_number_value(json_array_get(e, i))) < 1e-7);
		p = end;
	}
	json_decref(j);
	free(out);
	free(out2);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon a time' --embed --pooling cls --json -q",
		 bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	j = json_loads(out ? out : "", 0, NULL);
	CHECK_STREQ(json_string_value(json_object_get(j, "pooling")), "cls");
	json_decref(j);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p hi --embed --pooling rank 2>/dev/null", bin(), m);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
}

static void test_grammar_file(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m)) {
		TEST_SKIP_DATA("no %s", m);
		return;
	}
	char g[4096], cmd[16384], *out = NULL;
	snprintf(g, sizeof(g), "%s/g.gbnf", test_tmpdir());
	FILE *f = fopen(g, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("# three to five words and a full stop\n"
	      "root ::= \"Once\" (\" \" [a-z]+){3,5} \".\"\n", f);
	fclose(f);
	for (int k = 0; k < 2; k++) {
		snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon' -n 200 -q --seed 7 %s "
			 "--grammar-file '%s'", bin(), m, k ? "--temp 1" : "--temp 0", g);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
		size_t n = out ? strlen(out) : 0;
		bool ok = n > 7 && strncmp(out, "Once ", 5) == 0 && out[n - 1] == '\n' &&
			  out[n - 2] == '.';
		int words = 0;
		for (size_t i = 0; ok && i + 2 < n; i++) {
			if (out[i] == ' ')
				words++;
			else if (i > 4 && (out[i] < 'a' || out[i] > 'z'))
				ok = false;
		}
		CHECK_MSG(ok && words >= 3 && words <= 5, "k %d: \"%s\"", k, out ? out : "");
		free(out);
	}
	f = fopen(g, "w");
	if (f) {
		fputs("root ::= \"a\"\n  | (\"b\"\n", f);
		fclose(f);
	}
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once' --grammar-file '%s' 2>&1", bin(), m, g);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
	CHECK_MSG(out && strstr(out, "line 2, column 5: '(' without its ')'"), "%s", out);
	free(out);
}

static void test_json_schema(void)
{
	const char *m = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(m)) {
		TEST_SKIP_DATA("no %s", m);
		return;
	}
	char js[4096], cmd[16384], *out = NULL;
	snprintf(js, sizeof(js), "%s/s.json", test_tmpdir());
	FILE *f = fopen(js, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
	      "\"maxLength\":8},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"ok\"],"
	      "\"additionalProperties\":false}\n",
	      f);
	fclose(f);
	for (int seed = 1; seed <= 3; seed++) {
		snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once upon' -n 200 -q --temp 1 --seed %d "
			 "--json-schema '%s'", bin(), m, seed, js);
		CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
		json_t *v = out ? json_loads(out, 0, NULL) : NULL;
		json_t *name = json_object_get(v, "name");
		CHECK_MSG(json_is_object(v) && json_object_size(v) == 2 && json_is_string(name) &&
				  json_is_boolean(json_object_get(v, "ok")),
			  "seed %d: \"%s\"", seed, out ? out : "");
		json_decref(v);
		free(out);
	}
	f = fopen(js, "w");
	if (f) {
		fputs("{\"properties\":{\"n\":{\"type\":\"integer\",\"maximum\":9}}}", f);
		fclose(f);
	}
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once' --json-schema '%s' 2>&1", bin(), m, js);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
	CHECK_MSG(out && strstr(out, "json_schema: #/properties/n/maximum: keyword 'maximum' is not "
				     "supported"),
		  "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p 'Once' --json-schema '%s' --grammar-file '%s' "
		 "2>/dev/null", bin(), m, js, js);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
}

static void test_usage_errors(void)
{
	char cmd[16384], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s 2>/dev/null", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m x.gguf --temp abc 2>/dev/null", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
	/* the float options' ranges and finiteness (tools_parse_float) */
	static const char *const bad_floats[] = { "--top-p 1.5", "--min-p -0.1", "--temp 1e999",
						  "--temp nan", "--repeat-penalty 0x" };
	for (size_t i = 0; i < CM_ARRAY_LEN(bad_floats); i++) {
		snprintf(cmd, sizeof(cmd), "%s -m x.gguf %s 2>/dev/null", bin(), bad_floats[i]);
		CHECK_MSG(test_run_capture(cmd, &out) == 1, "%s accepted", bad_floats[i]);
		free(out);
	}
	/* the message names the option, not its value (it said "for abc") */
	snprintf(cmd, sizeof(cmd), "%s -m x.gguf -n abc 2>&1", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	CHECK_MSG(strstr(out, "invalid value 'abc' for --n-predict") != NULL, "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m x.gguf --top-k=1x 2>&1", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	CHECK_MSG(strstr(out, "invalid value '1x' for --top-k") != NULL, "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m /nonexistent.gguf -p hi 2>/dev/null", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 2);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m x.gguf -p hi --kv-type q4_0 2>/dev/null", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s -m x.gguf -p hi --batch 0 2>/dev/null", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 1);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s --help", bin());
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	CHECK(strstr(out, "usage: edgelm-run") != NULL);
	free(out);
}

int main(void)
{
	TEST_RUN(test_reference_text);
	TEST_RUN(test_reference_text_options);
	TEST_RUN(test_json_mode);
	TEST_RUN(test_tokenize_mode);
	TEST_RUN(test_bias_ignore_eos);
	TEST_RUN(test_top_logits_zero);
	TEST_RUN(test_context_shift);
	TEST_RUN(test_quantize);
	TEST_RUN(test_embed_mode);
	TEST_RUN(test_grammar_file);
	TEST_RUN(test_json_schema);
	TEST_RUN(test_usage_errors);
	json_decref(ref);
	return test_finish();
}
