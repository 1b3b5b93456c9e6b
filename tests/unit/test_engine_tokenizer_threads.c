/* tests/unit/test_engine_tokenizer_threads.c: one tokenizer used by several
 * threads at once gives every thread the ids (and text) it gives alone.
 *
 * The daemon relies on it: its text workers tokenize prompts and serve
 * tokenize/detokenize while others do the same (engine.h: the tokenizer
 * functions are re-entrant). Run under `make SAN=thread` too. */
#include "engine/engine.h"
#include "tests/test.h"

#include <pthread.h>

enum { THREADS = 4, ROUNDS = 6 };

struct work {
	const engine_tokenizer *tok;
	const char *text;
	size_t len;
	const int32_t *want;
	int n_want;
	const char *want_text;
	int mismatches;
};

static void *worker(void *arg)
{
	struct work *w = arg;
	int32_t *ids = malloc((w->len + 8) * sizeof(int32_t));
	for (int r = 0; r < ROUNDS && ids; r++) {
		int n = 0;
		if (engine_tokenize(w->tok, w->text, w->len, true, false, ids, (int)w->len + 8, &n,
				    NULL) != 0 ||
		    n != w->n_want || memcmp(ids, w->want, (size_t)n * sizeof(int32_t)) != 0)
			w->mismatches++;
		char *text = NULL;
		if (engine_detokenize(w->tok, ids, n, false, &text, NULL) != 0 ||
		    strcmp(text, w->want_text) != 0)
			w->mismatches++;
		free(text);
	}
	free(ids);
	return NULL;
}

static void run_vocab(const char *name)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf", test_data_path("vocab"), name);
	if (!test_file_exists(path)) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA/vocab", path);
		return;
	}
	engine_tokenizer *tok = NULL;
	struct cm_err err = {0};
	CHECK_OK(engine_tokenizer_load(path, &tok, &err));
	if (!tok)
		return;
	/* texts of different shapes per thread: words, digits, accents, code */
	static const char *base[THREADS] = {
		"Once upon a time, there was a little girl named Lily. ",
		"3.14159 x 2 = 6.28318; 1234567890 apples and 42 pears!! ",
		"Ça va? Grüße aus Köln — naïve café, 東京 и Москва. ",
		"int main(void) { return printf(\"%d\\n\", 1 << 4); } ",
	};
	struct work w[THREADS];
	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++) {
		size_t bl = strlen(base[i]), len = bl * 200;
		char *t = malloc(len + 1);
		for (size_t k = 0; k < len; k++)
			t[k] = base[i][k % bl];
		t[len] = '\0';
		int32_t *ids = malloc((len + 8) * sizeof(int32_t));
		int n = 0;
		CHECK_OK(engine_tokenize(tok, t, len, true, false, ids, (int)len + 8, &n, NULL));
		char *back = NULL;
		CHECK_OK(engine_detokenize(tok, ids, n, false, &back, NULL));
		w[i] = (struct work){tok, t, len, ids, n, back, 0};
	}
	for (int i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, &w[i]);
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		CHECK_MSG(w[i].mismatches == 0, "%s: thread %d differed %d times", name, i,
			  w[i].mismatches);
		free((char *)w[i].text);
		free((int32_t *)w[i].want);
		free((char *)w[i].want_text);
	}
	engine_tokenizer_free(tok);
}

static void test_tokenizer_threads_spm(void)
{
	run_vocab("llama-spm");
}

static void test_tokenizer_threads_bpe(void)
{
	run_vocab("llama-bpe");
	run_vocab("qwen2");
}

int main(void)
{
	TEST_RUN(test_tokenizer_threads_spm);
	TEST_RUN(test_tokenizer_threads_bpe);
	return test_finish();
}
