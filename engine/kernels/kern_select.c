/* engine/kernels/kern_select.c: CPU feature detection and the choice of
 * kernel variant.
 *
 * Built without ISA flags and without <immintrin.h>. A variant is usable
 * when the CPU implements its instructions AND the OS saves the registers
 * they use (XCR0), otherwise the first vector instruction would fault: the
 * usable set of common/cpu.h's probe, which tuning reports too. */
#include "engine/kernels/kern.h"

#include "common/common.h"

#include <pthread.h>
#include <string.h>
#include <strings.h>

/* ---- AMX permission ---------------------------------------------------------- */

bool kern_amx_request(void)
{
	return cm_amx_request() == 0 && cm_amx_permitted();
}

/* ---- variants ---------------------------------------------------------------- */

/* Variant tables list only what they accelerate; everything else (types a
 * variant leaves NULL, dequantizers, helpers) comes from the variant it
 * builds on (in the end the generic table) when the tables are merged,
 * once, on first use. */
extern const struct kern_ops kern_amx_ops, kern_avx512vnni_ops, kern_avx512_ops,
	kern_avxvnni_ops, kern_avx2_ops, kern_neon_dotprod_ops, kern_neon_ops;
/* Part tables: a variant's kernels for more weight types, in files of their
 * own (kern.h, "part tables"), overlaid on the variant's table in order. */
extern const struct kern_ops kern_avx2_q32_ops, kern_avx2_kq_ops, kern_neon_q_ops,
	kern_neon_dotprod_q_ops;

static bool caps_none(const struct cm_cpu_isa *c)
{
	(void)c;
	return true;
}

#if !defined(EDGELM_NO_ISA_VARIANTS) && defined(__x86_64__)
static bool caps_avx2(const struct cm_cpu_isa *c)
{
	return c->avx2 && c->fma && c->f16c;
}

static bool caps_avxvnni(const struct cm_cpu_isa *c)
{
	return caps_avx2(c) && c->avxvnni;
}

static bool caps_avx512(const struct cm_cpu_isa *c)
{
	return caps_avx2(c) && c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq;
}

static bool caps_avx512vnni(const struct cm_cpu_isa *c)
{
	return caps_avx512(c) && c->avx512vnni;
}

/* Linux hands a process the AMX tile state only once it has asked
 * (arch_prctl(ARCH_REQ_XCOMP_PERM), the tuning knob `amx`); before that the
 * first tile instruction raises SIGILL. The engine does not ask on its own,
 * so that `amx off` keeps AMX off: it uses the tiles when the permission is
 * already held. */
static bool caps_amx(const struct cm_cpu_isa *c)
{
	return caps_avx512vnni(c) && c->amx_tile && c->amx_int8 && cm_amx_permitted();
}

static const struct kern_ops *const avx2_parts[] = { &kern_avx2_q32_ops, &kern_avx2_kq_ops,
						       NULL };

#define KERN_ISA_VARIANTS(X)                                                       \
	X("amx", &kern_amx_ops, caps_amx, "avx512vnni", NULL)                      \
	X("avx512vnni", &kern_avx512vnni_ops, caps_avx512vnni, "avx512", NULL)     \
	X("avx512", &kern_avx512_ops, caps_avx512, "avx2", NULL)                   \
	X("avxvnni", &kern_avxvnni_ops, caps_avxvnni, "avx2", NULL)                \
	X("avx2", &kern_avx2_ops, caps_avx2, "scalar", avx2_parts)
#elif !defined(EDGELM_NO_ISA_VARIANTS) && defined(__aarch64__)
static bool caps_neon(const struct cm_cpu_isa *c)
{
	return c->neon;
}

static bool caps_dotprod(const struct cm_cpu_isa *c)
{
	return c->neon && c->dotprod;
}

static const struct kern_ops *const neon_parts[] = { &kern_neon_q_ops, NULL };
static const struct kern_ops *const neon_dotprod_parts[] = { &kern_neon_dotprod_q_ops, NULL };

#define KERN_ISA_VARIANTS(X)                                                           \
	X("neon-dotprod", &kern_neon_dotprod_ops, caps_dotprod, "neon", neon_dotprod_parts) \
	X("neon", &kern_neon_ops, caps_neon, "scalar", neon_parts)
#else
#define KERN_ISA_VARIANTS(X)
#endif

/* The compiled-in variants, best first: {name, table, CPU predicate, the
 * variant it builds on, its part tables (NULL-terminated, or NULL)}. A
 * variant's predicate implies that of the one it builds on. A new variant
 * is one line here (plus its predicate above). */
#define KERN_VARIANTS(X) KERN_ISA_VARIANTS(X) X("scalar", &kern_generic_ops, caps_none, NULL, NULL)

static const struct variant {
	const char *name;
	const struct kern_ops *ops;
	bool (*supported)(const struct cm_cpu_isa *caps);
	const char *under;
	const struct kern_ops *const *parts;
} variants[] = {
#define VARIANT_ENTRY(n, o, p, u, pt) { n, o, p, u, pt },
	KERN_VARIANTS(VARIANT_ENTRY)
#undef VARIANT_ENTRY
};

static const char *const variant_names[] = {
#define VARIANT_NAME(n, o, p, u, pt) n,
	KERN_VARIANTS(VARIANT_NAME)
#undef VARIANT_NAME
	NULL,
};

static struct kern_ops merged[CM_ARRAY_LEN(variants)];
static pthread_once_t merge_once = PTHREAD_ONCE_INIT;

/* m = the merged table under v, overlaid with what v defines. */
static void merge_one(struct kern_ops *m, const struct kern_ops *under, const struct kern_ops *v)
{
	const struct kern_ops *g = under;
	*m = *under;
	m->name = v->name;
	for (size_t t = 0; t < ENGINE_DTYPE_COUNT; t++) {
		const struct kern_type_ops *vt = &v->t[t];
		if (vt->vec_dot) {
			/* a tile kernel of the layer below only if it reads the
			 * same activation layout */
			if (vt->gemm || vt->act_type != g->t[t].act_type)
				m->t[t].gemm = vt->gemm;
			if (vt->gemv || vt->act_type != g->t[t].act_type)
				m->t[t].gemv = vt->gemv;
			if (vt->gemm_x16 || vt->act_type != g->t[t].act_type)
				m->t[t].gemm_x16 = vt->gemm_x16;
			m->t[t].act_type = vt->act_type;
			m->t[t].vec_dot = vt->vec_dot;
		} else if (vt->act_type == g->t[t].act_type) {
			if (vt->gemm)
				m->t[t].gemm = vt->gemm;
			if (vt->gemv)
				m->t[t].gemv = vt->gemv;
			if (vt->gemm_x16)
				m->t[t].gemm_x16 = vt->gemm_x16;
		}
		if (vt->dequant)
			m->t[t].dequant = vt->dequant;
		if (v->quant_act[t])
			m->quant_act[t] = v->quant_act[t];
		if (v->quant_act_aux[t])
			m->quant_act_aux[t] = v->quant_act_aux[t];
	}
	if (v->dot_f32)
		m->dot_f32 = v->dot_f32;
	if (v->axpy_f32)
		m->axpy_f32 = v->axpy_f32;
	if (v->silu_mul_f32)
		m->silu_mul_f32 = v->silu_mul_f32;
	if (v->exp_sum_f32)
		m->exp_sum_f32 = v->exp_sum_f32;
	if (v->read_stream)
		m->read_stream = v->read_stream;
	if (v->read_stream_chain)
		m->read_stream_chain = v->read_stream_chain;
	/* the several-head kernels come with their single-head kernel (kern.h:
	 * bit for bit the same results), never from the layer below it */
	if (v->attn_score_f16) {
		m->attn_score_f16 = v->attn_score_f16;
		m->attn_score_f16_mq = v->attn_score_f16_mq;
	}
	if (v->attn_score_q8_0)
		m->attn_score_q8_0 = v->attn_score_q8_0;
	if (v->attn_vsum_f16) {
		m->attn_vsum_f16 = v->attn_vsum_f16;
		m->attn_vsum_f16_mq = v->attn_vsum_f16_mq;
	}
	if (v->attn_vsum_q8_0)
		m->attn_vsum_q8_0 = v->attn_vsum_q8_0;
	if (!m->read_stream)
		m->read_stream = kern_read_stream_generic;
}

static void merge_all(void)
{
	/* worst first, so that the table a variant builds on is ready */
	for (size_t i = CM_ARRAY_LEN(variants); i-- > 0;) {
		const struct kern_ops *under = &kern_generic_ops;
		for (size_t j = i + 1; variants[i].under && j < CM_ARRAY_LEN(variants); j++)
			if (strcmp(variants[j].name, variants[i].under) == 0)
				under = &merged[j];
		merge_one(&merged[i], under, variants[i].ops);
		for (const struct kern_ops *const *pt = variants[i].parts; pt && *pt; pt++) {
			struct kern_ops base = merged[i];
			merge_one(&merged[i], &base, *pt);
			merged[i].name = variants[i].name;
		}
	}
}

const char *const *kern_variant_names(void)
{
	return variant_names;
}

const struct kern_ops *kern_select(const struct cm_cpu_isa *caps, const char *force)
{
	struct cm_cpu_isa detected;
	bool any = !force || !*force || strcasecmp(force, "auto") == 0;

	if (!caps) {
		kern_detect_caps(&detected);
		caps = &detected;
	}
	(void)pthread_once(&merge_once, merge_all);
	/* "generic" names the scalar table after its file. */
	if (!any && strcasecmp(force, "generic") == 0)
		force = "scalar";
	for (size_t i = 0; i < CM_ARRAY_LEN(variants); i++) {
		const struct variant *v = &variants[i];
		if (!any && strcasecmp(force, v->name) != 0)
			continue;
		if (v->supported(caps))
			return v->ops == &kern_generic_ops ? v->ops : &merged[i];
		if (!any)
			return NULL;
	}
	return NULL;
}

/* ---- helpers for the tile kernels and the bench ---------------------------- */

size_t kern_act_aux_len(uint32_t act_type, int64_t n)
{
	if (act_type == ENGINE_DTYPE_Q8_0 || act_type == ENGINE_DTYPE_Q8_1)
		return (size_t)(n / QK8_0) * 2;
	return 0;
}

void kern_act_aux(uint32_t act_type, const void *a, int64_t n, float *aux)
{
	if (act_type == ENGINE_DTYPE_Q8_1) {
		const struct block_q8_1 *b = a;
		for (int64_t i = 0; i < n / QK8_1; i++) {
			aux[2 * i] = quant_fp16_to_f32(b[i].d);
			aux[2 * i + 1] = quant_fp16_to_f32(b[i].s);
		}
		return;
	}
	if (act_type != ENGINE_DTYPE_Q8_0)
		return;
	const struct block_q8_0 *b = a;
	for (int64_t i = 0; i < n / QK8_0; i++) {
		int32_t sum = 0;
		for (int j = 0; j < QK8_0; j++)
			sum += b[i].qs[j];
		float d = quant_fp16_to_f32(b[i].d);
		aux[2 * i] = d;
		aux[2 * i + 1] = (float)sum;
	}
}

uint64_t kern_read_stream_generic(const void *p, size_t n)
{
	const uint64_t *w = p;
	uint64_t s[8] = {0};
	for (size_t i = 0; i + 8 <= n / 8; i += 8)
		for (int k = 0; k < 8; k++)
			s[k] ^= w[i + (size_t)k];
	return s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
}

/* ---- detection -------------------------------------------------------------- */

void kern_detect_caps(struct cm_cpu_isa *caps)
{
	struct cm_cpu p;
	cm_cpu_probe(&p);
	*caps = p.usable;
}
