/* tests/unit/test_daemon_grammars.c: the daemon's shared compiled grammars
 * (daemon/grammars.c): the same text for the same model compiles once,
 * another model's generation compiles again and retires the old entry
 * once no request holds it, at most 8 unheld entries are kept, errors are
 * not kept, and threads getting and putting the same text share it. */
#include "daemon/serve.h"
#include "tests/test.h"

#include <pthread.h>

static const char *const ga = "root ::= \"a\" [0-9]*";
static const char *const gb = "root ::= \"b\"";

static void test_shared(void)
{
	struct gcache c;
	gcache_init(&c);
	struct gcache_entry *e1 = NULL, *e2 = NULL, *e3 = NULL;
	struct gcache_stats st;
	CHECK_OK(gcache_get(&c, NULL, 1, ga, strlen(ga), &e1, NULL));
	CHECK_OK(gcache_get(&c, NULL, 1, ga, strlen(ga), &e2, NULL));
	CHECK(e1 && e1 == e2 && gcache_grammar(e1) != NULL);
	CHECK_OK(gcache_get(&c, NULL, 1, gb, strlen(gb), &e3, NULL));
	CHECK(e3 && e3 != e1);
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.compiles, 2);
	CHECK_EQ_INT(st.hits, 1);
	CHECK_EQ_INT(st.entries, 2);
	gcache_put(&c, e1);
	gcache_put(&c, e2);
	gcache_put(&c, e3);
	gcache_put(&c, NULL);
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.entries, 2); /* kept, unheld */

	/* a swapped model: compiled again; the old entries go once unheld */
	struct gcache_entry *old = NULL, *nw = NULL;
	CHECK_OK(gcache_get(&c, NULL, 1, ga, strlen(ga), &old, NULL));
	CHECK_OK(gcache_get(&c, NULL, 2, ga, strlen(ga), &nw, NULL));
	CHECK(old && nw && old != nw);
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.entries, 2); /* gb's (gen 1, unheld) went; old is held */
	gcache_put(&c, old);
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.entries, 1);
	gcache_put(&c, nw);

	/* an error is the engine's, and nothing is kept */
	struct cm_err err = {0};
	struct gcache_entry *bad = NULL;
	const char *gx = "root ::= (";
	CHECK_EQ_INT(gcache_get(&c, NULL, 2, gx, strlen(gx), &bad, &err), -EINVAL);
	CHECK(bad == NULL && strstr(err.msg, "grammar: line 1") != NULL);
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.entries, 1);

	/* at most 8 unheld, the least recently used out first */
	struct gcache_entry *keep = NULL;
	CHECK_OK(gcache_get(&c, NULL, 2, ga, strlen(ga), &keep, NULL));
	for (int i = 0; i < 12; i++) {
		char g[64];
		snprintf(g, sizeof(g), "root ::= \"x%d\"", i);
		struct gcache_entry *e = NULL;
		CHECK_OK(gcache_get(&c, NULL, 2, g, strlen(g), &e, NULL));
		gcache_put(&c, e);
	}
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.entries, 9); /* 8 unheld and the held one */
	struct gcache_entry *again = NULL;
	CHECK_OK(gcache_get(&c, NULL, 2, ga, strlen(ga), &again, NULL));
	CHECK(again == keep);
	gcache_put(&c, again);
	gcache_put(&c, keep);
	gcache_fini(&c);
}

struct worker {
	struct gcache *c;
	int bad;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < 200; i++) {
		const char *g = i % 3 ? ga : gb;
		struct gcache_entry *e = NULL;
		if (gcache_get(w->c, NULL, 1, g, strlen(g), &e, NULL) != 0 || !gcache_grammar(e))
			w->bad++;
		gcache_put(w->c, e);
	}
	return NULL;
}

static void test_threads(void)
{
	struct gcache c;
	gcache_init(&c);
	struct worker w[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){&c, 0};
		CHECK_OK(pthread_create(&th[i], NULL, worker_main, &w[i]));
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ_INT(w[i].bad, 0);
	}
	struct gcache_stats st;
	gcache_stats(&c, &st);
	CHECK_EQ_INT(st.entries, 2);
	CHECK(st.compiles >= 2 && st.compiles <= 8); /* a race compiles twice at most a thread */
	CHECK_EQ_INT(st.compiles + st.hits, 800);
	gcache_fini(&c);
}

int main(void)
{
	TEST_RUN(test_shared);
	TEST_RUN(test_threads);
	return test_finish();
}
