/* engine/repack.c: load-time repacking of weights (Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL, Q8_0, Q4_K, Q6_K; Q2_K, Q3_K, Q5_K, IQ4_XS where the variant has
 * their kernels) into the kernels' x16 layout (kern.h).
 *
 * It works on the weight table it is given (struct engine_weights) and
 * knows nothing of the model; model.c calls it once the weights are loaded.
 *
 * The panels take exactly the bytes of the 16 rows they replace, so each
 * matrix is rewritten in place. The pages written become the process's own
 * memory either way (info.x16_bytes; the file is never modified), so the
 * weights are first copied into a 2 MiB-aligned anonymous buffer advised
 * MADV_HUGEPAGE (info.weights_anon), which transparent huge pages can back
 * and a file mapping never is; where that copy cannot be made, the
 * matrices are rewritten in the file's private mapping. An output tied to
 * the token embedding is repacked too, and the embedding lookup takes its
 * row out of the panels (engine_x16_row).
 *
 * K-segments. A matrix whose panels are longer than a segment (by type,
 * segment_default() below; engine_params.repack_segment) is cut along its
 * rows into segments of equal block counts (even where possible, so that
 * blocks stay in pairs), each packed as panels of its own. The rows go in
 * groups of ENGINE_X16_GROUP (the last group may have fewer whole panels);
 * a group holds its first segment's panels, then its second's, and so on:
 *     group g: [seg 0: panel 0 .. panel 7][seg 1: panel 0 .. panel 7] ...
 * so that a group is still one forward stream, while the kernel reads a
 * segment's slice of the activation again after a few KiB of weights
 * instead of after a whole row's. Why that pays is not settled, so the
 * segment sizes are measured per type (docs/performance.md §4). matmul.c
 * runs a group's segments one after the other into the same output, the
 * kernels' accumulators starting from it (kern.h's from_s), so the results
 * equal one pass over the whole rows bit for bit.
 *
 * The copy and the repacking are one pass over the file (load_copy()
 * below): the pool's threads claim its items from one counter and pack a
 * group's panels straight from the file's rows. Only where no copy can
 * be had are the matrices rewritten in the file's private mapping, each
 * group through a thread's scratch. */
#include "engine/engine_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

struct repack_job {
	struct weight **w;
	int n_w;
	int64_t *first;    /* panel ids of matrix i: [first[i], first[i + 1]) */
	uint8_t **scratch; /* per participant, 16 rows of the widest matrix */
	_Alignas(64) atomic_long next;
};

/* The default K-segment of a panel, by type (0: rows not cut), as paired
 * decode runs chose them (docs/performance.md §4). */
static size_t segment_default(uint32_t type)
{
	return type == ENGINE_DTYPE_Q4_0 || type == ENGINE_DTYPE_Q8_0 ? 12288 : 0;
}

/* Blocks per K-segment for a matrix of `type` whose 16-row panels are
 * `panel` bytes of nb blocks (nb: not cut). */
static int64_t segment_blocks(uint32_t type, int64_t nb, size_t panel, int seg_bytes)
{
	size_t sb = seg_bytes > 0 ? (size_t)seg_bytes : segment_default(type);
	if (seg_bytes < 0 || sb == 0 || panel <= sb)
		return nb;
	int64_t ns = (int64_t)((panel + sb - 1) / sb);
	int64_t b = (nb + ns - 1) / ns;
	b += b & 1;
	return CM_MIN(b, nb);
}

/* Rows of the group that starts at row r0: 128, or the whole panels left */
static int group_rows(const struct weight *w, int64_t r0)
{
	int64_t left = w->n_out / KERN_X16_ROWS * KERN_X16_ROWS - r0;
	return (int)CM_MIN((int64_t)ENGINE_X16_GROUP, left);
}

/* Pack the group of w's rows that starts at r0 from `rows` (the group's
 * rows in the file's layout, w->row_bytes apart, not overlapping the
 * destination) into its panels where w->data lies. */
static void pack_group(const struct weight *w, int64_t r0, const uint8_t *rows)
{
	const struct dtype_info *ti = quant_dtype_get(w->type);
	int64_t nb = w->n_in / ti->blck, sb = w->x16_seg;
	int nr = group_rows(w, r0);
	for (int64_t b0 = 0; b0 < nb; b0 += sb) {
		int64_t n = CM_MIN(sb, nb - b0) * ti->blck;
		uint8_t *seg = (uint8_t *)engine_x16_segment(w, r0, nr, b0);
		size_t srs = quant_dtype_row_size(w->type, n);
		const uint8_t *src = rows + (size_t)b0 * ti->size;
		for (int p = 0; p < nr; p += KERN_X16_ROWS)
			kern_x16_pack(w->type, src + (size_t)p * w->row_bytes, w->row_bytes, n,
				      seg + (size_t)p * srs);
	}
}

/* In place (the file's private mapping): a group's rows go to the thread's
 * scratch first, then come back as panels. */
static void repack_worker(void *arg, int ith, int nth)
{
	struct repack_job *j = arg;
	(void)nth;
	for (;;) {
		int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		if (c >= j->first[j->n_w])
			break;
		int i = 0;
		while (c >= j->first[i + 1])
			i++;
		struct weight *w = j->w[i];
		int64_t r0 = (c - j->first[i]) * ENGINE_X16_GROUP;
		uint8_t *rows = j->scratch[ith];
		memcpy(rows, (uint8_t *)w->data + (size_t)r0 * w->row_bytes,
		       (size_t)group_rows(w, r0) * w->row_bytes);
		pack_group(w, r0, rows);
	}
}

void engine_x16_row(const struct weight *w, int64_t r, void *row)
{
	const struct dtype_info *ti = quant_dtype_get(w->type);
	int64_t r0 = r / ENGINE_X16_GROUP * ENGINE_X16_GROUP, nb = w->n_in / ti->blck;
	int64_t sb = w->x16_seg;
	int nr = group_rows(w, r0);
	int64_t p = (r - r0) / KERN_X16_ROWS;
	for (int64_t b0 = 0; b0 < nb; b0 += sb) {
		int64_t n = CM_MIN(sb, nb - b0) * ti->blck;
		size_t srs = quant_dtype_row_size(w->type, n);
		const uint8_t *panel = engine_x16_segment(w, r0, nr, b0) +
				       (size_t)p * KERN_X16_ROWS * srs;
		kern_x16_unpack_row(w->type, panel, n, (int)(r % KERN_X16_ROWS),
				    (uint8_t *)row + (size_t)b0 * ti->size);
	}
}

int engine_repack_parse(const char *s, int *ret_mode)
{
	if (!s || strcmp(s, "auto") == 0)
		*ret_mode = 0;
	else if (strcmp(s, "on") == 0)
		*ret_mode = 1;
	else if (strcmp(s, "off") == 0)
		*ret_mode = -1;
	else
		return -EINVAL;
	return 0;
}

#define HUGE_2M ((size_t)2 << 20)

/* ---- one pass from the file to the copy ----------------------------------
 * The copy is made in one pass over the file, in file order: work items
 * that are either a piece of bytes copied as they are, or a group of a
 * repacked matrix packed straight from the file's rows into its place in
 * the copy. As an item ends, the file pages it read (those wholly inside
 * it) are let go with MADV_DONTNEED: the mapping is private, read-only and
 * never written, so the page cache still has them and nothing is lost.
 * The process then holds about the copy, never the copy and the file's
 * pages together (2x the model at the peak, before). */
struct load_item {
	int64_t off, len; /* the file's bytes it reads */
	int mat;	  /* the matrix whose group it packs, or -1: a copy */
	int64_t r0;	  /* the group's first row */
};

struct load_job {
	struct weight **w; /* the matrices repacked (views already on dst) */
	const uint8_t *src;
	uint8_t *dst;
	struct load_item *it;
	int64_t n_it, cap;
	uintptr_t page;
	bool release; /* src is the file's mapping: its pages may go */
	_Alignas(64) atomic_long next;
};

static int load_push(struct load_job *j, struct load_item it)
{
	if (j->n_it == j->cap) {
		int64_t cap = j->cap ? j->cap * 2 : 1024;
		struct load_item *n = cm_realloc(j->it, (size_t)cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		j->it = n;
		j->cap = cap;
	}
	j->it[j->n_it++] = it;
	return 0;
}

/* [off, end) as copy items of at most 2 MiB */
static int load_push_copy(struct load_job *j, int64_t off, int64_t end)
{
	for (; off < end; off += (int64_t)HUGE_2M)
		if (load_push(j, (struct load_item){off, CM_MIN((int64_t)HUGE_2M, end - off), -1, 0}))
			return -ENOMEM;
	return 0;
}

static int cmp_data(const void *a, const void *b)
{
	const uint8_t *x = (*(struct weight *const *)a)->data;
	const uint8_t *y = (*(struct weight *const *)b)->data;
	return x < y ? -1 : x > y;
}

/* The items for n_w matrices in sel (views on the file; sorted here by
 * where they lie) and the bytes between and around them. */
static int load_plan(struct load_job *j, struct weight **sel, int n_w, size_t size)
{
	if (n_w > 0) /* (the caller's relocation has none, and sel NULL) */
		qsort(sel, (size_t)n_w, sizeof(*sel), cmp_data);
	int64_t pos = 0;
	for (int i = 0; i < n_w; i++) {
		struct weight *w = sel[i];
		int64_t off = (const uint8_t *)w->data - j->src;
		int64_t rows = w->n_out / KERN_X16_ROWS * KERN_X16_ROWS;
		if (load_push_copy(j, pos, off))
			return -ENOMEM;
		for (int64_t r0 = 0; r0 < rows; r0 += ENGINE_X16_GROUP)
			if (load_push(j, (struct load_item){off + r0 * (int64_t)w->row_bytes,
							    group_rows(w, r0) * (int64_t)w->row_bytes,
							    i, r0}))
				return -ENOMEM;
		pos = off + rows * (int64_t)w->row_bytes;
	}
	return load_push_copy(j, pos, (int64_t)size);
}

static void load_worker(void *arg, int ith, int nth)
{
	struct load_job *j = arg;
	(void)ith, (void)nth;
	for (;;) {
		int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		if (c >= j->n_it)
			break;
		const struct load_item *it = &j->it[c];
		if (it->mat < 0)
			memcpy(j->dst + it->off, j->src + it->off, (size_t)it->len);
		else
			pack_group(j->w[it->mat], it->r0, j->src + it->off);
		/* the pages wholly inside the item: a page it shares with the
		 * next item goes at the end (engine_weights_rebase) */
		uintptr_t a0 = ((uintptr_t)(j->src + it->off) + j->page - 1) & ~(j->page - 1);
		uintptr_t a1 = (uintptr_t)(j->src + it->off + it->len) & ~(j->page - 1);
		if (j->release && a1 > a0)
			(void)madvise((void *)a0, a1 - a0, MADV_DONTNEED);
	}
}

uint8_t *engine_anon_alloc(size_t len)
{
	uint8_t *p = mmap(NULL, len + HUGE_2M, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + len < p + len + HUGE_2M)
		munmap(a + len, (size_t)(p + len + HUGE_2M - (a + len)));
	(void)madvise(a, len, MADV_HUGEPAGE); /* THP off or "never": 4 KiB pages */
	return a;
}

/* Copy the file's bytes to dst (size bytes or more), packing the n_w
 * matrices of sel on the way, on the pool, and point every view into dst.
 * The views of sel must still be on the file. */
static int load_copy(struct engine_weights *ws, struct pool *pool, uint8_t *dst,
		     struct weight **sel, int n_w, struct cm_err *err)
{
	const struct gguf_file *f = ws->file;
	/* caller memory (gguf_open_mem) is never dropped: DONTNEED would
	 * zero it */
	struct load_job j = {.w = sel, .src = f->base, .dst = dst, .release = f->mapped};
	long page = sysconf(_SC_PAGESIZE);
	j.page = page > 0 ? (uintptr_t)page : 4096;
	if (load_plan(&j, sel, n_w, f->size)) {
		cm_free(j.it);
		return cm_err_set(err, -ENOMEM, "model: out of memory");
	}
	/* the panels are written where the views will lie */
	engine_weights_rebase(ws, dst);
	atomic_store_explicit(&j.next, 0, memory_order_relaxed);
	engine_pool_run(pool, load_worker, &j);
	/* what the items left (pages shared by two of them, metadata read
	 * since) goes now */
	if (f->mapped)
		(void)madvise((void *)f->base, f->size, MADV_DONTNEED);
	cm_free(j.it);
	return 0;
}

int engine_weights_copy(struct engine_weights *ws, struct pool *pool, void *dst,
			struct cm_err *err)
{
	return load_copy(ws, pool, dst, NULL, 0, err);
}

/* Copy the weights into 2 MiB-aligned anonymous memory with MADV_HUGEPAGE,
 * repacking sel on the way, and compute from the copy. Returns 1 when
 * the copy was made, 0 when the memory cannot be had (the views stay on
 * the mapping), or a negative errno. */
static int copy_to_anon(struct engine_weights *ws, struct pool *pool, struct weight **sel,
			int n_w, struct cm_err *err)
{
	if (ws->relocated)
		return 0;
	const struct gguf_file *f = ws->file;
	size_t len = (f->size + HUGE_2M - 1) & ~(HUGE_2M - 1);
	uint8_t *a = engine_anon_alloc(len);
	if (!a)
		return 0;
	int r = load_copy(ws, pool, a, sel, n_w, err);
	if (r) {
		munmap(a, len);
		return r;
	}
	/* the last page's tail too: the whole region is resident, as mlock
	 * and the RSS figures count it */
	memset(a + f->size, 0, len - f->size);
	(void)mprotect(a, len, PROT_READ); /* a stray write faults */
	ws->own_copy = a;
	ws->own_copy_len = len;
	return 1;
}

/* The matrices to repack into sel: MATMUL views of a type the variant has
 * x16 kernels for, each data once, their K-segments set. Returns the count. */
static int select_matrices(const struct engine_weights *ws, const struct kern_ops *kern,
			   int seg_bytes, struct weight **sel, uint64_t *ret_bytes,
			   size_t *ret_widest)
{
	int n_w = 0;
	for (int i = 0; i < ws->n; i++) {
		if (ws->ref[i].kind != ENGINE_WREF_MATMUL)
			continue;
		struct weight *w = ws->ref[i].w;
		const struct kern_type_ops *ko = &kern->t[w->type];
		if (!kern_x16_supported(w->type) || !ko->gemm_x16 || w->n_out < KERN_X16_ROWS ||
		    w->n_x16 > 0)
			continue;
		/* a matrix listed twice (shared data) is repacked once */
		bool dup = false;
		for (int k = 0; k < n_w; k++)
			dup |= sel[k]->data == w->data;
		if (dup)
			continue;
		sel[n_w++] = w;
		*ret_bytes += (uint64_t)(w->n_out / KERN_X16_ROWS) * KERN_X16_ROWS * w->row_bytes;
		*ret_widest = CM_MAX(*ret_widest, ENGINE_X16_GROUP * w->row_bytes);
		w->x16_seg = segment_blocks(w->type, w->n_in / quant_dtype_get(w->type)->blck,
					    KERN_X16_ROWS * w->row_bytes, seg_bytes);
	}
	return n_w;
}

/* Rewrite the job's matrices in place, on the pool (the file's private
 * mapping, when no copy could be had); the region is writable only
 * meanwhile, so a stray write faults. */
static int repack_run(struct engine_weights *ws, struct pool *pool, struct repack_job *j,
		      struct cm_err *err)
{
	void *base;
	size_t size;
	engine_weights_span(ws, &base, &size);
	if (mprotect(base, size, PROT_READ | PROT_WRITE) != 0)
		return cm_err_set(err, -errno, "model: repacking: mprotect: %s", strerror(errno));
	/* Make the pages private and writable in one sweep first: a write
	 * fault on a page mapped from the page cache costs a TLB shootdown
	 * to every thread. Older kernels lack the advice; the writes then
	 * fault page by page. */
	long page = sysconf(_SC_PAGESIZE);
	for (int i = 0; i < j->n_w; i++) {
		uintptr_t a0 = (uintptr_t)j->w[i]->data & ~(uintptr_t)(page - 1);
		uintptr_t a1 = (uintptr_t)j->w[i]->data + (size_t)j->w[i]->n_out * j->w[i]->row_bytes;
		(void)madvise((void *)a0, a1 - a0, MADV_POPULATE_WRITE);
	}
	atomic_store_explicit(&j->next, 0, memory_order_relaxed);
	engine_pool_run(pool, repack_worker, j);
	(void)mprotect(base, size, PROT_READ);
	return 0;
}

/* Every matrix view of repacked data reads the new layout, the token
 * embedding included when the output is tied to it. */
static void mark_repacked(struct engine_weights *ws, struct weight **sel, int n_w,
			  uint64_t bytes, struct engine_model_info *info)
{
	for (int i = 0; i < ws->n; i++) {
		if (ws->ref[i].kind == ENGINE_WREF_VECTOR)
			continue;
		struct weight *w = ws->ref[i].w;
		for (int k = 0; k < n_w; k++)
			if (w->data == sel[k]->data) {
				w->n_x16 = sel[k]->n_out / KERN_X16_ROWS * KERN_X16_ROWS;
				w->x16_seg = sel[k]->x16_seg;
			}
	}
	info->n_x16_tensors = (uint32_t)n_w;
	info->n_x16_segmented = 0;
	for (int k = 0; k < n_w; k++)
		info->n_x16_segmented += sel[k]->x16_seg < sel[k]->n_in / quant_dtype_get(sel[k]->type)->blck;
	info->x16_bytes = bytes;
}

int engine_repack(struct engine_weights *ws, const struct kern_ops *kern, struct pool *pool,
		  int mode, int seg_bytes, const char *cache, struct engine_model_info *info,
		  struct cm_err *err)
{
	struct weight **sel = cm_calloc((size_t)ws->n + 1, sizeof(*sel));
	if (!sel)
		return cm_err_set(err, -ENOMEM, "model: out of memory");
	int r = 0, n_w = 0;
	uint64_t bytes = 0;
	size_t widest = 0;
	/* the file's pages can be rewritten only when they are our private
	 * mapping (gguf_open_mem callers own theirs) */
	if (mode < 0 || !ws->file->mapped)
		goto out;
	n_w = select_matrices(ws, kern, seg_bytes, sel, &bytes, &widest);
	if (n_w == 0)
		goto out;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	if (mode == 0 && pages > 0 && page > 0 && bytes > (uint64_t)pages * (uint64_t)page / 2)
		goto out; /* auto: too large to keep a private copy of */

	int nth = engine_pool_size(pool);
	struct repack_job j = {.w = sel, .n_w = n_w};
	char key[REPACK_CACHE_KEY];
	bool cached = cache && *cache && !ws->relocated;
	/* at load, only quantizing has moved the views: the entry's key is
	 * the file's, whose bytes these are not */
	if (cache && *cache && ws->relocated)
		snprintf(info->repack_cache_note, sizeof(info->repack_cache_note),
			 "not used: the weights were quantized on load");
	if (cached) {
		/* a copy made before: mapped, nothing built */
		repack_cache_key(ws, sel, n_w, key);
		if (repack_cache_map(ws, cache, key, info->repack_cache_note,
				     sizeof(info->repack_cache_note)) == 0) {
			info->weights_cached = true;
			mark_repacked(ws, sel, n_w, bytes, info);
			goto done;
		}
	}
	/* (views relocated by the model's caller are rewritten where they lie) */
	r = copy_to_anon(ws, pool, sel, n_w, err);
	if (r < 0)
		goto done;
	if (r == 1) {
		info->weights_anon = true;
		r = 0;
		mark_repacked(ws, sel, n_w, bytes, info);
		if (cached) /* best effort: the load stands either way */
			(void)repack_cache_write(ws, cache, key, info->repack_cache_note,
						 sizeof(info->repack_cache_note));
		goto done;
	}
	j.first = cm_calloc((size_t)n_w + 1, sizeof(*j.first));
	j.scratch = cm_calloc((size_t)nth, sizeof(*j.scratch));
	if (!j.first || !j.scratch) {
		r = cm_err_set(err, -ENOMEM, "model: out of memory");
		goto done;
	}
	for (int t = 0; t < nth; t++)
		if (!(j.scratch[t] = cm_malloc(widest))) {
			r = cm_err_set(err, -ENOMEM, "model: out of memory");
			goto done;
		}
	for (int i = 0; i < n_w; i++)
		j.first[i + 1] = j.first[i] + (sel[i]->n_out / KERN_X16_ROWS * KERN_X16_ROWS +
					       ENGINE_X16_GROUP - 1) / ENGINE_X16_GROUP;
	if ((r = repack_run(ws, pool, &j, err)))
		goto done;
	mark_repacked(ws, sel, n_w, bytes, info);
done:
	/* auto: a failure before the first write leaves the file's layout,
	 * which is slower but right; on asked for it, it is an error */
	if (r && mode == 0)
		r = 0;
	if (j.scratch)
		for (int t = 0; t < nth; t++)
			cm_free(j.scratch[t]);
	cm_free(j.scratch);
	cm_free(j.first);
out:
	cm_free(sel);
	return r;
}
