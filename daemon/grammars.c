/* daemon/grammars.c: compiled grammars, shared by the requests that ask for
 * the same text (serve.h: struct gcache).
 *
 * Compiling a grammar walks the model's whole vocabulary (18-58 ms for
 * Qwen2's 151669 tokens, docs/performance.md section 19), while clients
 * send the same json_schema request after request; a compiled grammar is
 * immutable and may be shared by several samplers on several threads
 * (engine.h), so one compile serves them all. Entries are counted
 * references; up to GCACHE_KEEP that no request holds are kept, least
 * recently used out first, and none outlives the model it was compiled
 * for (a swap bumps the generation). Compiles run outside the lock: two
 * requests for a new text may both compile it, and the second keeps the
 * first's. */
#include "daemon/serve.h"

#include <string.h>

#define GCACHE_KEEP 8 /* compiled grammars kept that no request holds */

struct gcache_entry {
	struct gcache_entry *next;
	uint64_t model_gen;
	char *text;
	size_t len;
	engine_grammar *g;
	int refs;
	uint64_t last_used;
};

void gcache_init(struct gcache *c)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->mu, NULL);
}

static void entry_free(struct gcache_entry *e)
{
	engine_grammar_free(e->g);
	cm_free(e->text);
	cm_free(e);
}

/* Drop unheld entries of an older model, then the least recently used
 * unheld ones beyond GCACHE_KEEP (c->mu held). */
static void trim(struct gcache *c)
{
	int unheld = 0;
	for (struct gcache_entry **p = &c->head; *p;) {
		struct gcache_entry *e = *p;
		if (e->refs == 0 && e->model_gen != c->model_gen) {
			*p = e->next;
			entry_free(e);
			c->n--;
			continue;
		}
		unheld += e->refs == 0;
		p = &e->next;
	}
	while (unheld > GCACHE_KEEP) {
		struct gcache_entry **lru = NULL;
		for (struct gcache_entry **p = &c->head; *p; p = &(*p)->next)
			if ((*p)->refs == 0 && (!lru || (*p)->last_used < (*lru)->last_used))
				lru = p;
		struct gcache_entry *e = *lru;
		*lru = e->next;
		entry_free(e);
		c->n--;
		unheld--;
	}
}

static struct gcache_entry *find(struct gcache *c, uint64_t gen, const char *text, size_t len)
{
	for (struct gcache_entry *e = c->head; e; e = e->next)
		if (e->model_gen == gen && e->len == len && memcmp(e->text, text, len) == 0)
			return e;
	return NULL;
}

int gcache_get(struct gcache *c, const engine_tokenizer *tok, uint64_t model_gen, const char *text,
	       size_t len, struct gcache_entry **ret, struct cm_err *err)
{
	*ret = NULL;
	pthread_mutex_lock(&c->mu);
	if (model_gen > c->model_gen)
		c->model_gen = model_gen;
	struct gcache_entry *e = find(c, model_gen, text, len);
	if (e) {
		e->refs++;
		e->last_used = cm_now_ns();
		c->hits++;
	}
	pthread_mutex_unlock(&c->mu);
	if (e) {
		*ret = e;
		return 0;
	}

	struct gcache_entry *n = cm_calloc(1, sizeof(*n));
	if (!n || !(n->text = cm_malloc(len + 1))) {
		cm_free(n);
		return cm_err_set(err, -ENOMEM, "out of memory");
	}
	memcpy(n->text, text, len);
	n->text[len] = '\0';
	n->len = len;
	n->model_gen = model_gen;
	int rc = engine_grammar_new(tok, text, len, &n->g, err);
	if (rc) {
		entry_free(n);
		return rc;
	}
	pthread_mutex_lock(&c->mu);
	c->compiles++;
	e = find(c, model_gen, text, len);
	if (e) {
		entry_free(n); /* another request compiled it meanwhile */
	} else {
		e = n;
		e->next = c->head;
		c->head = e;
		c->n++;
	}
	e->refs++;
	e->last_used = cm_now_ns();
	trim(c);
	pthread_mutex_unlock(&c->mu);
	*ret = e;
	return 0;
}

const engine_grammar *gcache_grammar(const struct gcache_entry *e)
{
	return e ? e->g : NULL;
}

void gcache_put(struct gcache *c, struct gcache_entry *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&c->mu);
	e->refs--;
	e->last_used = cm_now_ns();
	trim(c);
	pthread_mutex_unlock(&c->mu);
}

void gcache_stats(struct gcache *c, struct gcache_stats *ret)
{
	pthread_mutex_lock(&c->mu);
	ret->entries = c->n;
	ret->compiles = c->compiles;
	ret->hits = c->hits;
	pthread_mutex_unlock(&c->mu);
}

void gcache_fini(struct gcache *c)
{
	/* every request is gone: nothing is held */
	while (c->head) {
		struct gcache_entry *e = c->head;
		c->head = e->next;
		entry_free(e);
	}
	c->n = 0;
	pthread_mutex_destroy(&c->mu);
}
