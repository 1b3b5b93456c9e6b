/* engine/model_weights.c: the weight table, every tensor view of a model in
 * one list (engine_impl.h), and where the views' bytes lie. Loading fills
 * it (model_load.c); relocation, repacking (repack.c) and the model's info
 * walk it, so none of them repeats the model's list of fields. */
#include "engine/engine_impl.h"

#include <sys/mman.h>

static int weights_push(struct engine_weights *ws, struct engine_wref ref)
{
	if (ws->n == ws->cap) {
		int cap = ws->cap ? ws->cap * 2 : 64;
		struct engine_wref *n = cm_realloc(ws->ref, (size_t)cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		ws->ref = n;
		ws->cap = cap;
	}
	ws->ref[ws->n++] = ref;
	return 0;
}

int engine_weights_add_matrix(struct engine_weights *ws, struct weight *w,
			      enum engine_wref_kind kind)
{
	return weights_push(ws, (struct engine_wref){.kind = kind, .w = w});
}

int engine_weights_add_vector(struct engine_weights *ws, const float **v)
{
	return weights_push(ws, (struct engine_wref){.kind = ENGINE_WREF_VECTOR, .v = v});
}

void engine_weights_span(const struct engine_weights *ws, void **ret_addr, size_t *ret_len)
{
	*ret_addr = ws->relocated ? ws->relocated : (void *)ws->file->base;
	/* the engine's own copy in whole 2 MiB pages: an mlock of a range
	 * that ends inside a huge page would split it */
	*ret_len = ws->own_copy ? ws->own_copy_len : ws->file->size;
}

/* p moved into buf when it points into the file's bytes [old, old + size) */
static const void *rebased(const void *p, const uint8_t *old, size_t size, uint8_t *buf)
{
	const uint8_t *q = p;
	return q && q >= old && q < old + size ? buf + (q - old) : p;
}

void engine_weights_rebase(struct engine_weights *ws, void *buf)
{
	const uint8_t *old = ws->file->base;
	size_t size = ws->file->size;
	for (int i = 0; i < ws->n; i++) {
		struct engine_wref *r = &ws->ref[i];
		if (r->kind == ENGINE_WREF_VECTOR)
			*r->v = rebased(*r->v, old, size, buf);
		else
			r->w->data = rebased(r->w->data, old, size, buf);
	}
	ws->relocated = buf;
	/* The file mapping stays (metadata is still read from it), but its
	 * pages need not stay resident: compute reads only the copy now. */
	if (ws->file->mapped)
		(void)madvise((void *)old, size, MADV_DONTNEED);
}

void engine_weights_fini(struct engine_weights *ws)
{
	if (ws->own_copy)
		munmap(ws->own_copy, ws->own_copy_len);
	cm_free(ws->ref);
	memset(ws, 0, sizeof(*ws));
}
