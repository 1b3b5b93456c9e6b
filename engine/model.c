/* engine/model.c: the model object. Loading goes in steps: the container
 * (gguf.c), the architecture and its tensors (model_load.c), the
 * tokenizer, the kernel variant, the pool, the info, and repacking
 * (repack.c), which works on the weight table (model_weights.c) alone.
 * Contexts are ctx.c's, the forward pass forward.c's. */
#include "engine/engine_impl.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static void fill_info(engine_model *m)
{
	struct engine_model_info *in = &m->info;
	const struct hparams *hp = &m->hp;
	snprintf(in->arch, sizeof(in->arch), "%s", engine_arch_name(hp->arch));
	in->n_vocab = hp->n_vocab;
	in->n_embd = hp->n_embd;
	in->n_layer = hp->n_layer;
	in->n_head = hp->n_head;
	in->n_head_kv = hp->n_head_kv;
	in->n_ff = hp->n_ff;
	in->head_dim = hp->head_dim;
	in->n_ctx_train = hp->n_ctx_train;
	in->n_ctx = m->n_ctx;
	in->rope_base = hp->rope_base;
	in->norm_eps = hp->eps;
	in->pooling = hp->pooling;
	in->isa = m->kern ? m->kern->name : "none";
	in->n_threads = m->pool ? engine_pool_size(m->pool) : 0;
	/* every matmul reads all of its weight per token; the embedding one row */
	uint64_t per_tok = 0;
	for (int i = 0; i < m->weights.n; i++) {
		const struct engine_wref *r = &m->weights.ref[i];
		if (r->kind == ENGINE_WREF_MATMUL)
			per_tok += (uint64_t)r->w->row_bytes * (uint64_t)r->w->n_out;
	}
	in->weight_bytes_token = per_tok;
	const struct gguf_file *f = m->file;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		in->weight_bytes += t->nbytes;
		uint64_t ne = 1;
		for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
			ne *= (uint64_t)t->ne[d];
		in->n_params += ne;
		if (t->type < CM_ARRAY_LEN(in->type_counts))
			in->type_counts[t->type]++;
	}
}

static int count_cpus(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		int n = CPU_COUNT(&set);
		if (n > 0)
			return n;
	}
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

static int select_kernels(engine_model *m, const struct engine_params *p, struct cm_err *err)
{
	const char *isa = p->isa;
	struct cm_cpu probe;
	struct cm_cpu_isa caps;
	if (p->cpu) {
		caps = *p->cpu;
	} else {
		cm_cpu_probe(&probe);
		caps = probe.usable;
	}
	/* forcing the AMX variant asks for its permission (kern.h); the best
	 * variant uses AMX only when the process already holds it */
	if (isa && strcasecmp(isa, "amx") == 0 && caps.amx_int8)
		(void)kern_amx_request();
	m->kern = kern_select(&caps, isa);
	if (!m->kern)
		return cm_err_set(err, -ENOTSUP,
				  "model: kernel variant '%s' is not available on this CPU/build",
				  isa ? isa : "");
	return 0;
}

int engine_model_load(const char *path, const struct engine_params *p, engine_model **ret_model,
		      struct cm_err *err)
{
	struct engine_params defaults = {0};
	if (!p)
		p = &defaults;
	quant_init();
	engine_model *m = cm_calloc(1, sizeof(*m));
	struct quant_load *q = NULL;
	if (!m)
		return cm_err_set(err, -ENOMEM, "model: out of memory");
	int r = gguf_open(path, &m->file, err);
	if (r)
		goto fail;
	m->weights.file = m->file;
	if ((r = engine_model_read_arch(m, err))) {
		/* tokenizing needs no architecture: a vocabulary of one this
		 * engine does not run (gpt2, starcoder, ...) still loads */
		struct gguf_str arch;
		if (!(p->vocab_only && r == -ENOTSUP) ||
		    gguf_get_str(m->file, "general.architecture", &arch, NULL) != 0)
			goto fail;
		cm_err_clear(err);
		snprintf(m->info.arch, sizeof(m->info.arch), "%.*s", (int)CM_MIN(arch.len, 31),
			 arch.ptr);
	}
	r = engine_tokenizer_new(m->file, &m->tok, err);
	if (r) {
		cm_err_prefix(err, "model");
		goto fail;
	}
	m->hp.n_vocab = (uint32_t)engine_tokenizer_n_vocab(m->tok);
	if (p->vocab_only) {
		m->vocab_only = true;
		*ret_model = m;
		return 0;
	}
	/* quantizing rewrites the tensor table the model then reads */
	if ((r = select_kernels(m, p, err)) ||
	    (p->quantize && *p->quantize && (r = engine_quantize_plan(m, p->quantize, &q, err))) ||
	    (r = engine_model_read_weights(m, err)))
		goto fail;
	m->n_ctx = m->hp.n_ctx_train;
	if (p->ctx_max > 0 && p->ctx_max < m->n_ctx)
		m->n_ctx = p->ctx_max;
	int nt = p->n_threads > 0 ? p->n_threads : count_cpus();
	if ((r = engine_pool_new(nt, p->cpus, p->n_cpus, &m->pool, err)))
		goto fail;
	fill_info(m);
	if (p->before_weights && (r = p->before_weights(p->before_weights_ud, m, err)))
		goto fail;
	if (q && (r = engine_quantize_run(m, q, err)))
		goto fail;
	engine_quantize_free(q);
	q = NULL;
	if ((r = engine_repack(&m->weights, m->kern, m->pool, p->repack, p->repack_segment,
			       p->repack_cache, &m->info, err)))
		goto fail;
	*ret_model = m;
	return 0;
fail:
	engine_quantize_free(q);
	engine_model_free(m);
	return r;
}

void engine_model_free(engine_model *m)
{
	if (!m)
		return;
	engine_pool_free(m->pool);
	engine_tokenizer_free(m->tok);
	for (int i = 0; i < m->n_owned; i++)
		cm_free(m->owned[i]);
	cm_free(m->owned);
	cm_free(m->layers);
	engine_weights_fini(&m->weights);
	gguf_close(m->file);
	cm_free(m);
}

_Static_assert(ENGINE_DTYPE_COUNT <= ENGINE_TYPE_SLOTS, "type_counts has a slot per type id");

const char *engine_dtype_name(uint32_t type)
{
	return quant_dtype_name(type);
}

void engine_model_get_info(const engine_model *m, struct engine_model_info *ret_info)
{
	*ret_info = m->info;
	if (m->vocab_only) {
		ret_info->n_vocab = m->hp.n_vocab;
		ret_info->isa = "none";
	}
}

const engine_tokenizer *engine_model_tokenizer(const engine_model *m)
{
	return m->tok;
}

void engine_model_region(const engine_model *m, struct engine_region *ret)
{
	engine_weights_span(&m->weights, &ret->addr, &ret->len);
	ret->what = "weights";
}

int engine_model_relocate(engine_model *m, void *buf, size_t len, struct cm_err *err)
{
	if (m->vocab_only || m->weights.relocated)
		return cm_err_set(err, -EINVAL, "model: nothing to relocate");
	if (len < m->file->size)
		return cm_err_set(err, -EINVAL, "model: relocation buffer of %zu bytes < %zu", len,
				  m->file->size);
	return engine_weights_copy(&m->weights, m->pool, buf, err);
}
