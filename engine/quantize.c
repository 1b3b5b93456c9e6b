/* engine/quantize.c: quantizing an F32/F16/BF16 model as it loads
 * (engine_params.quantize), with edgelm-quantize's recipe and row
 * conversion (quantize_recipe.c), so the tensors hold the bytes of the file
 * that tool writes.
 *
 * Two steps around the model's reading of its tensors (model.c):
 * - plan: the type of every tensor and its place in one 2 MiB-aligned
 *   anonymous region (reserved, not yet touched), the tensors the recipe
 *   leaves alone (norms, biases: small) copied there at once, and the
 *   file's tensor table pointed at the region with the new types, so the
 *   model reads a quantized file's table and its info and the caller's
 *   memory check (before_weights) see the quantized sizes;
 * - run: the matrices converted (or copied, where the type stays) on the
 *   pool, a chunk of rows per item in file order; as a tensor's last chunk
 *   ends its file pages are let go (MADV_DONTNEED: the mapping is private
 *   and read-only, the page cache keeps them), so the peak is about the
 *   region, never the file and the region together.
 * The views then lie in the engine's own anonymous memory as after
 * repacking's copy (weights_anon), and repacking rewrites them in place. */
#include "engine/engine_impl.h"

#include <stdio.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HUGE_2M ((size_t)2 << 20)
/* Source bytes per work item: big enough to amortize the counter, small
 * enough that every thread of a small model gets work. */
#define ITEM_BYTES ((size_t)256 << 10)
#define TENSOR_ALIGN 64
/* Items per pool run, per participant. A worker joins a run only if it
 * is awake while the run is open (threadpool.c); one run for the whole
 * model ran on the loading thread alone whenever the workers had not
 * started yet, so the work goes in many short runs. */
#define ITEMS_PER_RUN 16

struct qitem {
	uint32_t t;     /* tensor index */
	int64_t r0, r1; /* rows */
};

struct quant_load {
	const struct quant_recipe *r;
	struct gguf_tensor *src; /* the file's table as it was */
	uint8_t *region;
	size_t len;     /* whole 2 MiB pages */
	double seconds; /* the plan's */
	struct qitem *it;
	int64_t n_it;
	_Atomic int64_t *left;                  /* per tensor: items not done */
	const struct gguf_tensor *file_tensors; /* the table as the model reads it */
	float *tmp;                             /* per participant, the widest row as f32 */
	size_t widest;                          /* floats of it */
	uintptr_t page;
	bool release;
	_Atomic int rc;
	int64_t end; /* the open run's items end here */
	_Alignas(64) atomic_long next;
};

const char *engine_quantize_names(void)
{
	return quant_recipe_names();
}

int engine_quantize_check(const char *name, struct cm_err *err)
{
	if (!name || !*name || quant_recipe_find(name))
		return 0;
	if (quant_recipe_needs_imatrix(name))
		return cm_err_set(err, -ENOTSUP,
		                  "quantize: %s needs an importance matrix, which edgelm does not "
		                  "compute (quantize the file with llama-quantize --imatrix)",
		                  name);
	return cm_err_set(err, -EINVAL, "quantize: unknown type '%s' (one of: %s)", name,
	                  quant_recipe_names());
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool is_float(uint32_t type)
{
	return type == ENGINE_DTYPE_F32 || type == ENGINE_DTYPE_F16 || type == ENGINE_DTYPE_BF16;
}

static void lower(char *s)
{
	for (; *s; s++)
		if (*s >= 'A' && *s <= 'Z')
			*s = (char)(*s - 'A' + 'a');
}

void engine_quantize_free(struct quant_load *q)
{
	if (!q)
		return;
	if (q->region)
		munmap(q->region, q->len);
	cm_free(q->src);
	cm_free(q->it);
	cm_free((void *)q->left);
	cm_free(q->tmp);
	cm_free(q);
}

/* Whether the file is to be loaded as stored: a matrix the recipe covers is
 * quantized already, or no tensor changes type. note says so. */
static bool as_stored(const struct gguf_file *f, const uint32_t *type, char *note, size_t cap)
{
	unsigned n_q[ENGINE_DTYPE_COUNT] = {0};
	uint32_t most = 0;
	bool changes = false;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		changes |= type[i] != t->type;
		if (quant_recipe_covers(t) && !is_float(t->type) && t->type < ENGINE_DTYPE_COUNT &&
		    ++n_q[t->type] > n_q[most])
			most = t->type;
	}
	if (n_q[most]) {
		char nm[16];
		snprintf(nm, sizeof(nm), "%s", quant_dtype_name(most));
		lower(nm);
		snprintf(note, cap, "file already quantized (%s): loaded as stored", nm);
		return true;
	}
	if (!changes) {
		snprintf(note, cap, "no tensor changes type: loaded as stored");
		return true;
	}
	return false;
}

int engine_quantize_plan(engine_model *m, const char *name, struct quant_load **ret,
                         struct cm_err *err)
{
	struct gguf_file *f = m->file;
	struct engine_model_info *in = &m->info;
	double t0 = now_s();
	*ret = NULL;
	int r = engine_quantize_check(name, err);
	if (r)
		return r;
	const struct quant_recipe *rc = quant_recipe_find(name);
	snprintf(in->quant_requested, sizeof(in->quant_requested), "%s", rc->name);

	const uint64_t nt = f->n_tensors;
	struct quant_load *q = cm_calloc(1, sizeof(*q));
	uint32_t *type = cm_calloc(nt + 1, sizeof(*type));
	uint64_t *off = cm_calloc(nt + 1, sizeof(*off));
	if (!q || !type || !off) {
		r = cm_err_set(err, -ENOMEM, "quantize: out of memory");
		goto fail;
	}
	q->r = rc;
	struct quant_shape shape;
	quant_recipe_shape(f, &shape);
	char note[120], first[sizeof(in->quant_note)] = "";
	int n_fallback = 0;
	for (uint64_t i = 0; i < nt; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		type[i] = quant_recipe_tensor(rc, &shape, t, note, sizeof(note));
		if (note[0] && n_fallback++ == 0)
			snprintf(first, sizeof(first), "%s: %s", t->name, note);
	}
	if (as_stored(f, type, in->quant_note, sizeof(in->quant_note)))
		goto fail; /* r is 0: nothing to do */

	/* the region's layout: every tensor, in the table's order */
	uint64_t pos = 0;
	for (uint64_t i = 0; i < nt; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		uint64_t n, rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
		size_t row = quant_dtype_row_size(type[i], t->ne[0]);
		if (!row || cm_mul_overflow_u64(rows, row, &n) || n > SIZE_MAX / 4 ||
		    pos > SIZE_MAX / 4) {
			r = cm_err_set(err, -EINVAL, "quantize: tensor '%s': size overflows",
			               t->name);
			goto fail;
		}
		off[i] = pos;
		pos = (pos + n + TENSOR_ALIGN - 1) & ~(uint64_t)(TENSOR_ALIGN - 1);
		in->quant_bytes_in += t->nbytes;
		in->quant_bytes_out += n;
		in->n_quantized += type[i] != t->type;
		if (quant_recipe_covers(t)) {
			int64_t per = (int64_t)CM_MAX((size_t)1, ITEM_BYTES / t->row_bytes);
			q->n_it += ((int64_t)rows + per - 1) / per;
		}
	}
	q->len = ((size_t)pos + HUGE_2M - 1) & ~(HUGE_2M - 1);
	if (q->len == 0)
		q->len = HUGE_2M;
	q->region = engine_anon_alloc(q->len);
	q->src = cm_malloc(nt * sizeof(*q->src) + 1);
	q->it = cm_calloc((size_t)q->n_it + 1, sizeof(*q->it));
	q->left = cm_calloc(nt + 1, sizeof(*q->left));
	if (!q->region || !q->src || !q->it || !q->left) {
		r = cm_err_set(err, -ENOMEM, "quantize: out of memory (%.1f MiB for the weights)",
		               (double)q->len / (1 << 20));
		goto fail;
	}
	memcpy(q->src, f->tensors, nt * sizeof(*q->src));

	/* The matrices the recipe covers are run()'s work, in chunks of rows;
	 * the rest (norms, biases: small) is copied now, as the model reads
	 * its vectors while it loads. */
	q->n_it = 0;
	for (uint64_t i = 0; i < nt; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		uint8_t *dst = q->region + off[i];
		int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
		if (quant_recipe_covers(t)) {
			int64_t per = (int64_t)CM_MAX((size_t)1, ITEM_BYTES / t->row_bytes);
			for (int64_t r0 = 0; r0 < rows; r0 += per) {
				q->it[q->n_it++] =
				    (struct qitem){(uint32_t)i, r0, CM_MIN(rows, r0 + per)};
				q->left[i]++;
			}
			q->widest = CM_MAX(q->widest, (size_t)t->ne[0]);
		} else {
			memcpy(dst, t->data, t->nbytes);
		}
		t->type = type[i];
		t->row_bytes = quant_dtype_row_size(type[i], t->ne[0]);
		t->nbytes = (uint64_t)rows * t->row_bytes;
		t->data = dst;
	}
	in->n_fallback = n_fallback;
	if (n_fallback)
		snprintf(in->quant_note, sizeof(in->quant_note),
		         "%d tensor%s kept wider than %s (first %.140s)", n_fallback,
		         n_fallback == 1 ? "" : "s", rc->name, first);
	cm_free(type);
	cm_free(off);
	q->seconds = now_s() - t0;
	*ret = q;
	return 0;
fail:
	cm_free(type);
	cm_free(off);
	engine_quantize_free(q);
	return r;
}

/* MADV_DONTNEED the pages wholly inside [p0, p1) of the file's mapping */
static void release(const struct quant_load *q, const uint8_t *p0, const uint8_t *p1)
{
	uintptr_t a0 = ((uintptr_t)p0 + q->page - 1) & ~(q->page - 1);
	uintptr_t a1 = (uintptr_t)p1 & ~(q->page - 1);
	if (a1 > a0)
		(void)madvise((void *)a0, a1 - a0, MADV_DONTNEED);
}

static void run_worker(void *arg, int ith, int nth)
{
	struct quant_load *q = arg;
	(void)nth;
	for (;;) {
		int64_t c = atomic_fetch_add_explicit(&q->next, 1, memory_order_relaxed);
		if (c >= q->end)
			break;
		const struct qitem *it = &q->it[c];
		const struct gguf_tensor *s = &q->src[it->t];
		const struct gguf_tensor *d = &q->file_tensors[it->t];
		int r = 0;
		if (s->type == d->type)
			memcpy((uint8_t *)d->data + (size_t)it->r0 * d->row_bytes,
			       (const uint8_t *)s->data + (size_t)it->r0 * s->row_bytes,
			       (size_t)(it->r1 - it->r0) * s->row_bytes);
		else
			r = quant_convert_rows(s, d->type, (void *)d->data, it->r0, it->r1,
			                       q->tmp + (size_t)ith * q->widest);
		if (r)
			atomic_store_explicit(&q->rc, r, memory_order_relaxed);
		if (!q->release)
			continue;
		/* the item's file pages go as it ends (those wholly inside it);
		 * the tensor's last item lets go the pages items shared */
		const uint8_t *b = (const uint8_t *)s->data;
		if (atomic_fetch_sub_explicit(&q->left[it->t], 1, memory_order_acq_rel) == 1)
			release(q, b, b + s->nbytes);
		else
			release(q, b + (size_t)it->r0 * s->row_bytes, b + (size_t)it->r1 * s->row_bytes);
	}
}

int engine_quantize_run(engine_model *m, struct quant_load *q, struct cm_err *err)
{
	double t0 = now_s();
	struct gguf_file *f = m->file;
	struct engine_weights *ws = &m->weights;
	int nth = engine_pool_size(m->pool);
	long page = sysconf(_SC_PAGESIZE);
	q->page = page > 0 ? (uintptr_t)page : 4096;
	q->release = f->mapped;
	q->file_tensors = f->tensors;
	q->tmp =
	    cm_aligned_alloc((size_t)CM_MAX(nth, 1) * CM_MAX(q->widest, (size_t)1) * sizeof(float));
	if (!q->tmp)
		return cm_err_set(err, -ENOMEM, "quantize: out of memory");
	const int64_t per_run = (int64_t)ITEMS_PER_RUN * CM_MAX(nth, 1);
	for (int64_t i = 0; i < q->n_it; i += per_run) {
		q->end = CM_MIN(q->n_it, i + per_run);
		atomic_store_explicit(&q->next, i, memory_order_relaxed);
		engine_pool_run(m->pool, run_worker, q);
	}
	int r = atomic_load_explicit(&q->rc, memory_order_relaxed);
	if (r)
		return cm_err_set(err, r, "quantize: converting the weights to %s failed",
		                  q->r->name);
	/* what is left of the file's pages (shared ones, metadata) goes too:
	 * the model computes from the region alone now */
	if (f->mapped)
		(void)madvise((void *)f->base, f->size, MADV_DONTNEED);
	(void)mprotect(q->region, q->len, PROT_READ); /* a stray write faults */
	/* the region is the model's now, as repacking's copy would be */
	ws->own_copy = q->region;
	ws->own_copy_len = q->len;
	ws->relocated = q->region;
	q->region = NULL;
	m->info.weights_anon = true;
	m->info.quant_seconds = q->seconds + (now_s() - t0);
	return 0;
}
