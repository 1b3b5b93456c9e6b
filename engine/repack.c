/* engine/repack.c: load-time repacking of Q4_0, Q8_0, Q4_K and Q6_K
 * weights into the kernels' x16 layout (kern.h).
 *
 * The panels take exactly the bytes of the 16 rows they replace, so each
 * matrix is rewritten in place. The pages written become the process's own
 * memory either way (the file is never modified), which is the memory cost
 * reported in info.x16_bytes, so the weights are first copied into a
 * 2 MiB-aligned anonymous buffer advised MADV_HUGEPAGE (info.weights_anon):
 * the kernel backs that with huge pages where transparent huge pages are
 * on, which a file mapping never gets (one TLB entry per 2 MiB instead of
 * per 4 KiB: decode +15% on this box, docs/performance.md §2). Where the
 * copy cannot be made, the matrices are rewritten in the file's private
 * mapping instead. The page cache copy of the file is no longer used and
 * the kernel may drop it. An output
 * tied to the token embedding is repacked too (on Llama 3.2 1B and Qwen2.5
 * 0.5B it is 28-41% of the bytes read per token); the embedding lookup then
 * takes its row out of the panels (engine_x16_row).
 *
 * K-segments. A matrix whose panels are longer than a segment (by type,
 * segment_default() below; engine_params.repack_segment) is cut along its
 * rows into segments of equal block counts (even where possible, so that
 * blocks stay in pairs), each packed as panels of its own (rows as long as
 * the segment). The rows go in groups of ENGINE_X16_GROUP (128; the last
 * group may have fewer whole panels); a group holds its first segment's
 * panels, then its second's, and so on:
 *     group g: [seg 0: panel 0 .. panel 7][seg 1: panel 0 .. panel 7] ...
 * so that a group is still one forward stream, while the kernel reads a
 * segment's slice of the activation again for each of the group's panels
 * after a few KiB of weights instead of after a whole row's. Paired
 * decode runs: TinyLlama and Llama 3.2 Q4_0 +8-20 %, Qwen2.5 +4-8 %
 * (docs/performance.md §4). Why it pays is not settled: the activation's
 * reuse distance is the obvious reading, but the K-quants neither gained
 * nor lost, and Q8_0 lost when cut in groups of 64 rows; so the segment
 * sizes are measured per type. matmul.c runs a group's segments one after
 * the other into the same output, the kernels' accumulators starting from
 * it for every segment but the first (kern.h's from_s), so the results
 * equal one pass over the whole rows bit for bit.
 *
 * The work is split into groups that the pool's threads claim from one
 * counter; each thread copies a group's rows to its own scratch and writes
 * the panels back over them. */
#include "engine/engine_impl.h"

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

/* The default K-segment of a panel, by type (0: rows not cut), from paired
 * decode runs on this box (docs/performance.md §4), with groups of 128
 * rows: Q4_0 and Q8_0 12 KiB (a 2048-element Q4_0 row in two halves:
 * TinyLlama and Llama 3.2 +8-20 %; Q8_0 rows in three: TinyLlama +2-5 %
 * against cutting only rows wider than 2048, and Qwen2.5's 896-element
 * Q8_0 output in two, +2.5 %); 4.6-6.3 KiB Q4_0 segments gained less. The
 * K-quants uncut: 8-40 KiB segments all within 3 % of uncut. */
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
		const struct dtype_info *ti = dtype_get(w->type);
		int64_t r0 = (c - j->first[i]) * ENGINE_X16_GROUP, nb = w->n_in / ti->blck;
		int64_t sb = w->x16_seg;
		int nr = group_rows(w, r0);
		uint8_t *rows = j->scratch[ith];
		memcpy(rows, (uint8_t *)w->data + (size_t)r0 * w->row_bytes,
		       (size_t)nr * w->row_bytes);
		for (int64_t b0 = 0; b0 < nb; b0 += sb) {
			int64_t n = CM_MIN(sb, nb - b0) * ti->blck;
			uint8_t *seg = (uint8_t *)engine_x16_segment(w, r0, nr, b0);
			size_t srs = dtype_row_size(w->type, n);
			const uint8_t *src = rows + (size_t)b0 * ti->size;
			for (int p = 0; p < nr; p += KERN_X16_ROWS)
				kern_x16_pack(w->type, src + (size_t)p * w->row_bytes,
					      w->row_bytes, n, seg + (size_t)p * srs);
		}
	}
}

void engine_x16_row(const struct weight *w, int64_t r, void *row)
{
	const struct dtype_info *ti = dtype_get(w->type);
	int64_t r0 = r / ENGINE_X16_GROUP * ENGINE_X16_GROUP, nb = w->n_in / ti->blck;
	int64_t sb = w->x16_seg;
	int nr = group_rows(w, r0);
	int64_t p = (r - r0) / KERN_X16_ROWS;
	for (int64_t b0 = 0; b0 < nb; b0 += sb) {
		int64_t n = CM_MIN(sb, nb - b0) * ti->blck;
		size_t srs = dtype_row_size(w->type, n);
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

struct copy_job {
	uint8_t *dst;
	const uint8_t *src;
	size_t size;
	_Alignas(64) atomic_long next;
};

/* 2 MiB pieces claimed from one counter: the pool's threads fault the huge
 * pages in (each zeroed by the kernel) and copy in parallel */
static void copy_worker(void *arg, int ith, int nth)
{
	struct copy_job *j = arg;
	(void)ith, (void)nth;
	for (;;) {
		size_t o = (size_t)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) *
			   HUGE_2M;
		if (o >= j->size)
			break;
		memcpy(j->dst + o, j->src + o, CM_MIN(HUGE_2M, j->size - o));
	}
}

/* Copy the weights into 2 MiB-aligned anonymous memory with MADV_HUGEPAGE
 * and compute from the copy. Returns false, and leaves the model on its
 * mapping, when the memory cannot be had. */
static bool copy_to_anon(engine_model *m)
{
	if (m->vocab_only || m->relocated)
		return false;
	size_t len = (m->file->size + HUGE_2M - 1) & ~(HUGE_2M - 1);
	uint8_t *p = mmap(NULL, len + HUGE_2M, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return false;
	uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + len < p + len + HUGE_2M)
		munmap(a + len, (size_t)(p + len + HUGE_2M - (a + len)));
	(void)madvise(a, len, MADV_HUGEPAGE); /* THP off or "never": 4 KiB pages */
	struct copy_job j = {.dst = a, .src = m->file->base, .size = m->file->size};
	atomic_store_explicit(&j.next, 0, memory_order_relaxed);
	pool_run(m->pool, copy_worker, &j);
	/* the last page's tail too: the whole region is resident, as mlock
	 * and the RSS figures count it */
	memset(a + m->file->size, 0, len - m->file->size);
	model_rebase(m, a);
	m->own_copy = a;
	m->own_copy_len = len;
	m->info.weights_anon = true;
	return true;
}

int engine_model_repack(engine_model *m, int mode, int seg_bytes, struct cm_err *err)
{
	struct weight **mats = NULL;
	int n = engine_model_matrices(m, &mats);
	struct weight **sel = cm_calloc((size_t)n + 1, sizeof(*sel));
	if (!mats || !sel) {
		cm_free(mats);
		cm_free(sel);
		return cm_err_set(err, -ENOMEM, "model: out of memory");
	}
	int r = 0, n_w = 0;
	uint64_t bytes = 0;
	size_t widest = 0;
	/* the file's pages can be rewritten only when they are our private
	 * mapping (gguf_open_mem callers own theirs) */
	if (mode < 0 || !m->file->mapped)
		goto out;
	for (int i = 0; i < n; i++) {
		struct weight *w = mats[i];
		const struct kern_type_ops *ko = &m->kern->t[w->type];
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
		bytes += (uint64_t)(w->n_out / KERN_X16_ROWS) * KERN_X16_ROWS * w->row_bytes;
		widest = CM_MAX(widest, ENGINE_X16_GROUP * w->row_bytes);
		w->x16_seg = segment_blocks(w->type, w->n_in / dtype_get(w->type)->blck,
					    KERN_X16_ROWS * w->row_bytes, seg_bytes);
	}
	if (n_w == 0)
		goto out;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	if (mode == 0 && pages > 0 && page > 0 && bytes > (uint64_t)pages * (uint64_t)page / 2)
		goto out; /* auto: too large to keep a private copy of */

	int nth = pool_size(m->pool);
	struct repack_job j = {.w = sel, .n_w = n_w};
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
	/* (a model relocated by its caller is rewritten where it lies) */
	bool copied = copy_to_anon(m);
	void *base = m->relocated ? m->relocated : (void *)m->file->base;
	size_t size = m->own_copy ? m->own_copy_len : m->file->size;
	if (mprotect(base, size, PROT_READ | PROT_WRITE) != 0) {
		r = cm_err_set(err, -errno, "model: repacking: mprotect: %s", strerror(errno));
		goto done;
	}
	/* On the file mapping, make the pages private and writable in one
	 * sweep first: a write fault on a page already mapped from the page
	 * cache replaces a live entry, which costs a TLB shootdown to every
	 * thread of the process (measured: 40% of a TinyLlama load). Older
	 * kernels lack the advice; the writes below then fault page by page. */
	for (int i = 0; i < n_w && !copied; i++) {
		uintptr_t a0 = (uintptr_t)sel[i]->data & ~(uintptr_t)(page - 1);
		uintptr_t a1 = (uintptr_t)sel[i]->data + (size_t)sel[i]->n_out * sel[i]->row_bytes;
		(void)madvise((void *)a0, a1 - a0, MADV_POPULATE_WRITE);
	}
	atomic_store_explicit(&j.next, 0, memory_order_relaxed);
	pool_run(m->pool, repack_worker, &j);
	/* back to read-only: a stray write into the weights faults */
	(void)mprotect(base, size, PROT_READ);
	/* every view of a repacked matrix reads the new layout, the token
	 * embedding included when the output is tied to it */
	for (int i = 0; i < n; i++)
		for (int k = 0; k < n_w; k++)
			if (mats[i]->data == sel[k]->data) {
				mats[i]->n_x16 = sel[k]->n_out / KERN_X16_ROWS * KERN_X16_ROWS;
				mats[i]->x16_seg = sel[k]->x16_seg;
			}
	if (m->tok_embd.data == m->output.data) {
		m->tok_embd.n_x16 = m->output.n_x16;
		m->tok_embd.x16_seg = m->output.x16_seg;
	}
	m->info.n_x16_tensors = (uint32_t)n_w;
	m->info.n_x16_segmented = 0;
	for (int k = 0; k < n_w; k++)
		m->info.n_x16_segmented +=
			sel[k]->x16_seg < sel[k]->n_in / dtype_get(sel[k]->type)->blck;
	m->info.x16_bytes = bytes;
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
	cm_free(mats);
	return r;
}
