/* engine/repack.c: load-time repacking of Q4_0/Q8_0 weights into the
 * kernels' x16 layout (kern.h).
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
 * takes its row out of the panel (kern_x16_unpack_row).
 *
 * The work is split into panels that the pool's threads claim from one
 * counter; each thread copies 16 rows to its own scratch and writes the
 * panel back over them. */
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
		uint8_t *panel = (uint8_t *)w->data +
				 (size_t)(c - j->first[i]) * KERN_X16_ROWS * w->row_bytes;
		memcpy(j->scratch[ith], panel, KERN_X16_ROWS * w->row_bytes);
		kern_x16_pack(w->type, j->scratch[ith], w->row_bytes, w->n_in, panel);
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

int engine_model_repack(engine_model *m, int mode, struct cm_err *err)
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
		widest = CM_MAX(widest, KERN_X16_ROWS * w->row_bytes);
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
		j.first[i + 1] = j.first[i] + sel[i]->n_out / KERN_X16_ROWS;
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
			if (mats[i]->data == sel[k]->data)
				mats[i]->n_x16 = sel[k]->n_out / KERN_X16_ROWS * KERN_X16_ROWS;
	if (m->tok_embd.data == m->output.data)
		m->tok_embd.n_x16 = m->output.n_x16;
	m->info.n_x16_tensors = (uint32_t)n_w;
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
