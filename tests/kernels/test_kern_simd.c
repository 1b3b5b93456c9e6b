/* tests/kernels/test_kern_simd.c: every SIMD variant this CPU runs against
 * the scalar reference (kern_generic_ops), for every weight type the
 * reference computes, plus the tile kernels against row-by-row dots and
 * whole-model agreement. The decode kernels (gemv) are checked the same way.
 *
 * Inputs are random and adversarial: odd row counts, sizes that leave
 * every tail of the unrolled loops, zero blocks, a single spike per block,
 * scales from 1e-4 to 1e3 (Q8_1 activations store d * sum(q) as f16, so
 * larger activations overflow in the reference too). Error budgets:
 * - the Q8_0 activation quantizer must match the reference byte for byte
 *   (the variants rebuild roundf(), see kern_avx2.c);
 * - axpy_f32 must match bit for bit;
 * - integer formats: every block sum is exact in both, only the float
 *   accumulation order differs, so |diff| <= (nb + 4) * 2^-22 * sum_b |d_w
 *   d_a isum_b| (bounded here by the same sum over |w_i a_i| of the
 *   dequantized values);
 * - float formats accumulate in double in both: |diff| <= 2^-22 * sum |w a|
 *   (one float rounding each, plus double noise). */
#include "engine/engine.h"
#include "engine/kernels/kern.h"
#include "engine/quant.h"

#include "tests/kernels/kern_test_util.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Uniform in [-1, 1). */
static float unif(void)
{
	return (float)(kt_rng_unit() * 2.0 - 1.0);
}

/* Fill x[n] in one of several shapes. */
static void fill(float *x, int64_t n, int mode, int64_t blck)
{
	float scale = 1.0f;
	switch (mode % 6) {
	case 0: /* plain random */
		for (int64_t i = 0; i < n; i++)
			x[i] = unif();
		break;
	case 1: /* tiny */
		scale = 1e-4f;
		/* fallthrough */
	case 2: /* large */
		if (mode % 6 == 2)
			scale = 1e3f; /* Q8_1 keeps d * sum(q) in f16: < 65504 */
		for (int64_t i = 0; i < n; i++)
			x[i] = unif() * scale;
		break;
	case 3: /* every other block zero */
		for (int64_t i = 0; i < n; i++)
			x[i] = (i / blck) % 2 ? unif() : 0.0f;
		break;
	case 4: /* one spike per block */
		for (int64_t i = 0; i < n; i++) {
			int64_t spike = (int64_t)(kt_rng_u64() % (uint64_t)blck);
			x[i] = (i % blck) == spike ? 100.0f : unif() * 0.01f;
		}
		break;
	default: /* per-block scales spread over 8 decades */
		for (int64_t i = 0; i < n; i++) {
			if (i % blck == 0)
				scale = powf(10.0f, (float)(kt_rng_u64() % 8) - 4.0f);
			x[i] = unif() * scale;
		}
		break;
	}
}

/* Variants this CPU runs, other than the scalar one. */
static int variants(const struct kern_ops **out, int max)
{
	struct cm_cpu_isa caps;
	kern_detect_caps(&caps);
	int n = 0;
	for (const char *const *v = kern_variant_names(); *v && n < max; v++) {
		if (strcmp(*v, "scalar") == 0)
			continue;
		const struct kern_ops *k = kern_select(&caps, *v);
		if (!k) {
			fprintf(stderr, "  (variant %s: not supported by this CPU, skipped)\n", *v);
			continue;
		}
		out[n++] = k;
	}
	return n;
}

static double sum_abs_prod(const float *w, const float *a, int64_t n)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += fabs((double)w[i] * (double)a[i]);
	return s;
}

static const struct kern_ops *G = &kern_generic_ops;

/* The row sizes tried: multiples of the block leaving every tail. */
static const int blocks_list[] = {1, 2, 3, 5, 7, 8, 9, 16, 17, 33, 64, 131};

static void test_quant_act_exact(void)
{
	const struct kern_ops *v[8];
	int nv = variants(v, 8);
	for (int vi = 0; vi < nv; vi++) {
		for (uint32_t at = 0; at < ENGINE_DTYPE_COUNT; at++) {
			if (!G->quant_act[at] || at == ENGINE_DTYPE_F32)
				continue;
			const struct dtype_info *di = quant_dtype_get(at);
			for (int mode = 0; mode < 7; mode++)
				for (size_t bi = 0; bi < CM_ARRAY_LEN(blocks_list); bi++) {
					int64_t n = (int64_t)blocks_list[bi] * di->blck;
					float *x = kt_xcalloc((size_t)n * sizeof(float));
					size_t rs = kern_act_row_size(at, n);
					uint8_t *r = kt_xcalloc(rs), *q = kt_xcalloc(rs);
					if (mode < 6)
						fill(x, n, mode, 32);
					else /* ties of both signs for the largest magnitude */
						for (int64_t i = 0; i < n; i++)
							x[i] = (float)((int)(kt_rng_u64() % 5) - 2) * 0.5f;
					G->quant_act[at](x, r, n);
					v[vi]->quant_act[at](x, q, n);
					CHECK_MSG(memcmp(r, q, rs) == 0, "%s: %s activations, n %lld, mode %d",
						  v[vi]->name, quant_dtype_name(at), (long long)n, mode);
					/* the fused converter: the same bytes, and
					 * kern_act_aux()'s floats bit for bit */
					size_t al = kern_act_aux_len(at, n);
					if (v[vi]->quant_act_aux[at] && al) {
						float *ra = kt_xcalloc(al * sizeof(float));
						float *qa = kt_xcalloc(al * sizeof(float));
						memset(q, 0x5a, rs);
						kern_act_aux(at, r, n, ra);
						v[vi]->quant_act_aux[at](x, q, n, qa);
						CHECK_MSG(memcmp(r, q, rs) == 0 &&
							  memcmp(ra, qa, al * sizeof(float)) == 0,
							  "%s: fused %s activations and aux, n %lld, mode %d",
							  v[vi]->name, quant_dtype_name(at), (long long)n, mode);
						free(ra);
						free(qa);
					}
					free(x);
					free(r);
					free(q);
				}
		}
	}
}

/* The F16 row converter (the F16 KV cache) against quant_fp32_to_fp16 on a sweep
 * of bit patterns: every exponent (subnormal outputs, the overflow edge,
 * inf, NaNs with payloads) with mantissas stepped finely, at every length
 * 1..40 so that the vector loop and its tail both run. */
static void test_quant_f16_sweep(void)
{
	const struct kern_ops *v[8];
	int nv = variants(v, 8);
	enum { N = 1 << 16 };
	float *x = kt_xcalloc(N * sizeof(float));
	uint16_t *r = kt_xcalloc(N * sizeof(uint16_t)), *q = kt_xcalloc(N * sizeof(uint16_t));
	for (int vi = 0; vi < nv; vi++) {
		if (!v[vi]->quant_act[ENGINE_DTYPE_F16])
			continue;
		for (uint32_t base = 0; base < 1u << 16; base++) {
			/* base: sign, exponent and top 7 mantissa bits; all of
			 * them at the exponents where the conversion changes
			 * regime (102: the smallest nonzero result, 112/113:
			 * subnormal/normal halves, 142/143: the overflow edge,
			 * 255: inf and NaN), two per exponent elsewhere */
			uint32_t e = (base >> 7) & 0xff;
			if (base % 64 != 0 && e != 102 && e != 112 && e != 113 && e != 142 &&
			    e != 143 && e != 255)
				continue;
			for (int i = 0; i < N; i++) {
				uint32_t u = base << 16 | (uint32_t)((i * 7919u) & 0xffffu);
				memcpy(&x[i], &u, 4);
			}
			G->quant_act[ENGINE_DTYPE_F16](x, r, N);
			v[vi]->quant_act[ENGINE_DTYPE_F16](x, q, N);
			int bad = -1;
			for (int i = 0; i < N && bad < 0; i++)
				if (r[i] != q[i])
					bad = i;
			CHECK_MSG(bad < 0, "%s: f16 rows, bits %08x: %04x, want %04x", v[vi]->name,
				  bad < 0 ? 0 : (unsigned)(base << 16 | ((bad * 7919u) & 0xffffu)),
				  bad < 0 ? 0 : q[bad], bad < 0 ? 0 : r[bad]);
		}
		for (int n = 1; n <= 40; n++) {
			for (int i = 0; i < n; i++)
				x[i] = unif() * 1e3f;
			memset(r, 0, 64 * sizeof(uint16_t));
			memset(q, 0, 64 * sizeof(uint16_t));
			G->quant_act[ENGINE_DTYPE_F16](x, r, n);
			v[vi]->quant_act[ENGINE_DTYPE_F16](x, q, n);
			CHECK_MSG(memcmp(r, q, 64 * sizeof(uint16_t)) == 0,
				  "%s: f16 row of %d (tail, no write past it)", v[vi]->name, n);
		}
	}
	free(x);
	free(r);
	free(q);
}

/* The x16 repacked layout: pack/unpack restore the rows byte for byte; the
 * scalar reference agrees with vec_dot to the integer formats' budget; a
 * variant's gemm_x16 equals the reference bit for bit (the same operation
 * sequence, kern.h), for every token count and for one token at a time:
 * decode and prefill give a token the same logits. nr rows: one panel of
 * 16 packed, the rest are the native tail that matmul.c runs on vec_dot. */
static void check_x16(const struct kern_ops *k, uint32_t type, int64_t n, const uint8_t *w,
		      size_t wrs, const uint8_t *a, size_t ars, const float *aux, size_t aux_len,
		      int nr, int nt, const float *dots, const double *bound)
{
	const int P = KERN_X16_ROWS;
	uint8_t *panel = kt_xcalloc(wrs * P), *back = kt_xcalloc(wrs * P);
	float *ref = kt_xcalloc(sizeof(float) * P * nt), *got = kt_xcalloc(sizeof(float) * P * nt);
	float one[KERN_X16_ROWS];
	kern_x16_pack(type, w, wrs, n, panel);
	kern_x16_unpack(type, panel, n, back, wrs);
	CHECK_MSG(memcmp(back, w, wrs * P) == 0, "%s x16 pack/unpack not lossless (n %lld)",
		  quant_dtype_name(type), (long long)n);
	kern_gemm_x16_ref(type, n, P, nt, panel, wrs, a, ars, aux, aux_len, ref, P, false);
	for (int t = 0; t < nt; t++)
		for (int r = 0; r < P; r++)
			CHECK_MSG(fabs((double)ref[t * P + r] - (double)dots[t * nr + r]) <=
					  2 * bound[t * nr + r],
				  "%s x16 reference n %lld row %d tok %d: %.9g vs vec_dot %.9g",
				  quant_dtype_name(type), (long long)n, r, t, ref[t * P + r],
				  dots[t * nr + r]);
	if (k->t[type].gemm_x16) {
		for (int i = 0; i < P * nt; i++)
			got[i] = -12345.678f; /* written, not read: from_s false */
		k->t[type].gemm_x16(n, P, nt, panel, wrs, a, ars, aux, aux_len, got, P, false);
		CHECK_MSG(memcmp(ref, got, sizeof(float) * P * nt) == 0,
			  "%s %s gemm_x16 differs from the reference (n %lld)", k->name,
			  quant_dtype_name(type), (long long)n);
		for (int t = 0; t < nt; t++) {
			for (int r = 0; r < P; r++)
				one[r] = -12345.678f;
			k->t[type].gemm_x16(n, P, 1, panel, wrs, a + t * ars, ars,
					    aux + t * aux_len, aux_len, one, P, false);
			CHECK_MSG(memcmp(one, got + t * P, sizeof(one)) == 0,
				  "%s %s gemm_x16: token %d alone differs from its batch", k->name,
				  quant_dtype_name(type), t);
		}
	}
	free(panel);
	free(back);
	free(ref);
	free(got);
}

/* One weight type, one variant: vec_dot over rows against the reference,
 * and the tile kernel (if any) against the variant's vec_dot. */
/* The variants whose kernels for `type` follow the reference's float steps
 * in its order: the x86 K-quant kernels (each super-block ends with the
 * reference's own expression) and the NEON kernels of the types added in
 * kern_neon_q.c (one chain per row and token, the reference's). */
static bool bit_exact(const struct kern_ops *k, uint32_t type)
{
	bool kq = type == ENGINE_DTYPE_Q2_K || type == ENGINE_DTYPE_Q3_K ||
		  type == ENGINE_DTYPE_Q5_K || type == ENGINE_DTYPE_IQ4_XS;
	if (strncmp(k->name, "avx", 3) == 0)
		return kq || type == ENGINE_DTYPE_Q4_K || type == ENGINE_DTYPE_Q6_K;
	if (strncmp(k->name, "neon", 4) == 0)
		return kq || type == ENGINE_DTYPE_Q4_1 || type == ENGINE_DTYPE_Q5_0 ||
		       type == ENGINE_DTYPE_Q5_1 || type == ENGINE_DTYPE_IQ4_NL;
	return false;
}

static void check_type(const struct kern_ops *k, uint32_t type, int64_t nblocks, int mode)
{
	const struct dtype_info *di = quant_dtype_get(type);
	uint32_t at = G->t[type].act_type;
	int64_t n = nblocks * di->blck;
	const int nr = 19, nt = 11; /* odd, past one tile of rows, tokens */
	size_t wrs = quant_dtype_row_size(type, n), ars = kern_act_row_size(at, n);
	float *wf = kt_xcalloc((size_t)n * sizeof(float));
	float *af = kt_xcalloc((size_t)n * sizeof(float));
	float *wd = kt_xcalloc((size_t)n * sizeof(float));
	float *ad = kt_xcalloc((size_t)n * sizeof(float));
	uint8_t *w = kt_xcalloc(wrs * nr), *a = kt_xcalloc(ars * nt);
	size_t aux_len = kern_act_aux_len(at, n);
	float *aux = kt_xcalloc((aux_len ? aux_len : 1) * nt * sizeof(float));
	float *s = kt_xcalloc(sizeof(float) * nr * nt), *dots = kt_xcalloc(sizeof(float) * nr * nt);
	double *bound = kt_xcalloc(sizeof(double) * nr * nt);

	for (int r = 0; r < nr; r++) {
		fill(wf, n, mode + r, di->blck);
		if (quant_quantize_row(type, wf, w + r * wrs, n) != 0)
			goto out; /* no quantizer for this type: nothing to feed it */
	}
	for (int t = 0; t < nt; t++) {
		fill(af, n, mode + 3 * t, 32);
		G->quant_act[at](af, a + t * ars, n);
		if (aux_len)
			kern_act_aux(at, a + t * ars, n, aux + t * aux_len);
	}
	for (int r = 0; r < nr; r++) {
		G->t[type].dequant(w + r * wrs, wd, n);
		for (int t = 0; t < nt; t++) {
			float ref, got;
			/* the activation as the kernels see it */
			if (at == ENGINE_DTYPE_F32)
				memcpy(ad, a + t * ars, (size_t)n * sizeof(float));
			else
				(void)quant_dequantize_row(at, a + t * ars, ad, n);
			double sap = sum_abs_prod(wd, ad, n);
			double tol = at == ENGINE_DTYPE_F32 ? 0x1p-22 * sap
							    : (double)(nblocks + 4) * 0x1p-22 * sap;
			tol = tol * 1.01 + 1e-30;
			G->t[type].vec_dot(n, &ref, w + r * wrs, a + t * ars);
			k->t[type].vec_dot(n, &got, w + r * wrs, a + t * ars);
			if (!isfinite(ref)) {
				CHECK_MSG(isnan(ref) ? isnan(got) : got == ref,
					  "%s %s: non-finite %g vs %g", k->name, di->name, got, ref);
			} else {
				CHECK_MSG(fabs((double)ref - (double)got) <= tol,
					  "%s %s vec_dot n %lld mode %d row %d tok %d: %.9g vs ref "
					  "%.9g (tol %.3g)",
					  k->name, di->name, (long long)n, mode, r, t, got, ref, tol);
			}
			/* kernels that take the reference's own float steps in
			 * its order: bit-identical */
			if (bit_exact(k, type))
				CHECK_MSG(memcmp(&ref, &got, sizeof(ref)) == 0,
					  "%s %s not bit-identical: %.9g vs %.9g", k->name, di->name,
					  got, ref);
			dots[t * nr + r] = got;
			bound[t * nr + r] = tol;
		}
	}
	if (k->t[type].gemv) {
		/* one token at a time, all rows, then rows in odd groups */
		for (int t = 0; t < nt; t++) {
			float g1[19], g2[19];
			const float *x = aux_len ? aux + t * aux_len : NULL;
			k->t[type].gemv(n, nr, 1, w, wrs, a + t * ars, ars, x, aux_len, g1, 1);
			for (int r0 = 0; r0 < nr; r0 += 7)
				k->t[type].gemv(n, CM_MIN(7, nr - r0), 1, w + r0 * wrs, wrs,
						a + t * ars, ars, x, aux_len, g2 + r0, 1);
			for (int r = 0; r < nr; r++) {
				CHECK_MSG(fabs((double)g1[r] - (double)dots[t * nr + r]) <=
						  2 * bound[t * nr + r],
					  "%s %s gemv n %lld mode %d row %d tok %d: %.9g vs %.9g",
					  k->name, di->name, (long long)n, mode, r, t, g1[r],
					  dots[t * nr + r]);
				CHECK(g1[r] == g2[r] || (isnan(g1[r]) && isnan(g2[r])));
			}
			/* with a tile kernel, gemv must equal it bit for bit */
			if (k->t[type].gemm) {
				float g3[19];
				k->t[type].gemm(n, nr, 1, w, wrs, a + t * ars, ars, x, aux_len, g3,
						(size_t)nr);
				CHECK_MSG(memcmp(g1, g3, sizeof(float) * nr) == 0,
					  "%s %s gemv differs from gemm (n %lld, tok %d)", k->name,
					  di->name, (long long)n, t);
			}
		}
	}
	if (k->t[type].gemm) {
		/* whole tile, then row and token sub-tiles: same values */
		k->t[type].gemm(n, nr, nt, w, wrs, a, ars, aux_len ? aux : NULL, aux_len, s,
				(size_t)nr);
		for (int i = 0; i < nr * nt; i++)
			CHECK_MSG(fabs((double)s[i] - (double)dots[i]) <= 2 * bound[i],
				  "%s %s gemm n %lld mode %d [%d]: %.9g vs vec_dot %.9g", k->name,
				  di->name, (long long)n, mode, i, s[i], dots[i]);
		float *s2 = kt_xcalloc(sizeof(float) * nr * nt);
		for (int r0 = 0; r0 < nr; r0 += 5)
			for (int t0 = 0; t0 < nt; t0 += 3) {
				int rr = CM_MIN(5, nr - r0), tt = CM_MIN(3, nt - t0);
				k->t[type].gemm(n, rr, tt, w + r0 * wrs, wrs, a + t0 * ars, ars,
						aux_len ? aux + t0 * aux_len : NULL, aux_len,
						s2 + t0 * nr + r0, (size_t)nr);
			}
		CHECK_MSG(memcmp(s, s2, sizeof(float) * nr * nt) == 0,
			  "%s %s gemm depends on the tiling (n %lld)", k->name, di->name,
			  (long long)n);
		free(s2);
	}
	if (kern_x16_supported(type))
		check_x16(k, type, n, w, wrs, a, ars, aux, aux_len, nr, nt, dots, bound);
out:
	free(wf);
	free(af);
	free(wd);
	free(ad);
	free(w);
	free(a);
	free(aux);
	free(s);
	free(dots);
	free(bound);
}

static void test_vec_dot_all_types(void)
{
	const struct kern_ops *v[8];
	int nv = variants(v, 8);
	int tried = 0;
	for (int vi = 0; vi < nv; vi++)
		for (uint32_t t = 0; t < ENGINE_DTYPE_COUNT; t++) {
			if (!G->t[t].vec_dot || !v[vi]->t[t].vec_dot)
				continue;
			for (size_t bi = 0; bi < CM_ARRAY_LEN(blocks_list); bi++) {
				int64_t nb = blocks_list[bi];
				if (quant_dtype_get(t)->blck == 1)
					nb *= 3; /* float types: n = 3, 6, ... odd tails */
				if (quant_dtype_get(t)->blck == QK_K && nb > 17)
					continue; /* keep the K-quants fast */
				check_type(v[vi], t, nb, (int)bi);
				tried++;
			}
		}
	if (nv == 0)
		TEST_SKIP("no SIMD variant runs on this CPU");
	CHECK(nv == 0 || tried > 0);
}

static void test_f32_helpers(void)
{
	const struct kern_ops *v[8];
	int nv = variants(v, 8);
	for (int vi = 0; vi < nv; vi++)
		for (int n = 1; n < 300; n += 7) {
			float *x = kt_xcalloc(sizeof(float) * n), *y = kt_xcalloc(sizeof(float) * n);
			float *y1 = kt_xcalloc(sizeof(float) * n);
			float *y2 = kt_xcalloc(sizeof(float) * n);
			fill(x, n, n, 32);
			fill(y, n, n + 1, 32);
			float ref = G->dot_f32(n, x, y), got = v[vi]->dot_f32(n, x, y);
			CHECK_MSG(fabs((double)ref - got) <= 0x1p-22 * sum_abs_prod(x, y, n) + 1e-30,
				  "%s dot_f32 n %d: %.9g vs %.9g", v[vi]->name, n, got, ref);
			memcpy(y1, y, sizeof(float) * n);
			memcpy(y2, y, sizeof(float) * n);
			G->axpy_f32(n, 0.37f, x, y1);
			v[vi]->axpy_f32(n, 0.37f, x, y2);
			CHECK_MSG(memcmp(y1, y2, sizeof(float) * n) == 0, "%s axpy_f32 n %d",
				  v[vi]->name, n);
			free(x);
			free(y);
			free(y1);
			free(y2);
		}
}

static void test_read_stream(void)
{
	const struct kern_ops *v[8];
	int nv = variants(v, 8);
	size_t n = 1 << 16;
	uint64_t *buf = cm_aligned_alloc(n);
	CHECK(buf != NULL);
	if (!buf)
		return;
	for (size_t i = 0; i < n / 8; i++)
		buf[i] = kt_rng_u64();
	uint64_t ref = kern_read_stream_generic(buf, n);
	for (int vi = 0; vi < nv; vi++) {
		CHECK(v[vi]->read_stream != NULL);
		if (v[vi]->read_stream)
			CHECK_MSG(v[vi]->read_stream(buf, n) == ref, "%s read_stream", v[vi]->name);
		if (v[vi]->read_stream_chain)
			CHECK_MSG(v[vi]->read_stream_chain(buf, n) == ref, "%s read_stream_chain",
				  v[vi]->name);
	}
#if defined(__x86_64__)
	/* the x86 variants have the chain too (edgelm-bench keeps the better) */
	bool any = false;
	for (int vi = 0; vi < nv; vi++)
		any |= v[vi]->read_stream_chain != NULL;
	CHECK(nv <= 1 || any);
#endif
	cm_free(buf);
}

/* ---- whole models ------------------------------------------------------------ */

/* kv: the KV cache type. The matmul checks below use f32: with a lossy
 * cache, a 1e-7 difference between variants can flip one f16 rounding of
 * K or V, and with quantized weights the next layer's Q8_0 activations
 * turn that into a jump of 1/127 of a block (measured: logits 0.09 apart on
 * stories3M Q4_0/Q8_0 with f16 KV, 1e-6 with f32 KV), which says nothing
 * about the kernels. */
/* The model tests need the tokenizer (PCRE2), which the aarch64 cross
 * build has not: there this file is built with KERN_TEST_KERNELS_ONLY
 * (tests/module.mk) and runs the kernel tests alone under qemu. */
#ifndef KERN_TEST_KERNELS_ONLY
static int greedy_kv(const char *path, const char *isa, enum engine_kv_type kv, int n_threads,
		     int n_gen, int32_t *out, float *logits_copy, int n_copy)
{
	struct engine_params ep = {.n_threads = n_threads, .isa = isa};
	struct cm_err err = {0};
	engine_model *m = NULL;
	engine_ctx *c = NULL;
	if (engine_model_load(path, &ep, &m, &err) != 0) {
		fprintf(stderr, "%s: %s\n", path, err.msg);
		return -1;
	}
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	struct engine_ctx_params cp = {.n_ctx = 128, .n_seq = 1, .n_batch = 32, .kv_type = kv};
	if (engine_ctx_new(m, &cp, &c, &err) != 0) {
		engine_model_free(m);
		return -1;
	}
	/* a fixed prompt of 9 tokens (prefill: tile kernels), then decode */
	int32_t prompt[9] = {1, 400, 81, 27, 1000 % (int)info.n_vocab, 5, 77, 300, 12};
	for (int i = 0; i < 9; i++)
		prompt[i] %= (int32_t)info.n_vocab;
	int r = engine_eval(c, prompt, 9, 0, &err);
	for (int i = 0; i < n_gen && r == 0; i++) {
		const float *l = engine_get_logits_last(c);
		if (i == 0 && logits_copy)
			memcpy(logits_copy, l, sizeof(float) * (size_t)CM_MIN(n_copy, (int)info.n_vocab));
		int best = 0;
		for (uint32_t j = 1; j < info.n_vocab; j++)
			if (l[j] > l[best])
				best = (int)j;
		out[i] = best;
		r = engine_eval(c, &out[i], 1, 9 + i, &err);
	}
	engine_ctx_free(c);
	engine_model_free(m);
	return r;
}

static int greedy(const char *path, const char *isa, int n_threads, int n_gen, int32_t *out,
		  float *logits_copy, int n_copy)
{
	return greedy_kv(path, isa, ENGINE_KV_F32, n_threads, n_gen, out, logits_copy, n_copy);
}

static bool have(const char *p)
{
	FILE *f = fopen(p, "rb");
	if (f)
		fclose(f);
	return f != NULL;
}

/* The must-show: scalar and the best variant pick the same greedy tokens on
 * stories260K (float weights: both accumulate in double), with the f32 and
 * the default (f16) KV cache. */
static void test_greedy_scalar_vs_best(void)
{
	static const char *const models[] = {"models/stories260K-f32.gguf",
					     "models/stories260K-f16.gguf"};
	int found = 0;
	for (size_t i = 0; i < CM_ARRAY_LEN(models); i++) {
		const char *p = test_data_path(models[i]);
		if (!have(p))
			continue;
		found++;
		int32_t a[32], b[32];
		CHECK_OK(greedy(p, "scalar", 2, 32, a, NULL, 0));
		CHECK_OK(greedy(p, NULL, 2, 32, b, NULL, 0));
		CHECK_MSG(memcmp(a, b, sizeof(a)) == 0, "%s: greedy tokens differ (scalar vs best)",
			  models[i]);
		CHECK_OK(greedy_kv(p, "scalar", ENGINE_KV_DEFAULT, 2, 32, a, NULL, 0));
		CHECK_OK(greedy_kv(p, NULL, ENGINE_KV_DEFAULT, 2, 32, b, NULL, 0));
		CHECK_MSG(memcmp(a, b, sizeof(a)) == 0,
			  "%s, default KV: greedy tokens differ (scalar vs best)", models[i]);
	}
	if (!found)
		TEST_SKIP_DATA("no stories260K models under $EDGELM_TESTDATA/models");
}

/* Quantized weights: the integer block sums are exact in both, the float
 * accumulation order differs, so a near tie may flip a greedy pick; the
 * logits must agree closely (Q4_0: the prefill tile kernel and the decode
 * kernel both run). */
static void test_logits_q4_0_scalar_vs_best(void)
{
	const char *p = test_data_path("models/stories3M-q4_0.gguf");
	if (!have(p)) {
		TEST_SKIP_DATA("%s missing", p);
		return;
	}
	enum { NL = 512 };
	static float la[NL], lb[NL];
	int32_t a[2], b[2];
	CHECK_OK(greedy(p, "scalar", 2, 2, a, la, NL));
	CHECK_OK(greedy(p, NULL, 2, 2, b, lb, NL));
	double mx = 0, md = 0;
	for (int i = 0; i < NL; i++) {
		mx = fmax(mx, fabs(la[i]));
		md = fmax(md, fabs((double)la[i] - lb[i]));
	}
	CHECK_MSG(md <= 1e-3 * mx, "max |logit diff| %.3g of max |logit| %.3g", md, mx);
}

/* Logits do not depend on the thread count, prefill (tile kernels) or not,
 * whatever the KV cache type. */
static void test_threads_bitwise(void)
{
	const char *p = test_data_path("models/stories3M-q4_0.gguf");
	if (!have(p)) {
		TEST_SKIP_DATA("%s missing", p);
		return;
	}
	enum { NL = 512 };
	static const enum engine_kv_type kvs[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_Q8_0};
	for (size_t k = 0; k < CM_ARRAY_LEN(kvs); k++) {
		static float l1[NL], l2[NL], l3[NL];
		int32_t t1[4], t2[4], t3[4];
		CHECK_OK(greedy_kv(p, NULL, kvs[k], 1, 4, t1, l1, NL));
		CHECK_OK(greedy_kv(p, NULL, kvs[k], 2, 4, t2, l2, NL));
		CHECK_OK(greedy_kv(p, NULL, kvs[k], 3, 4, t3, l3, NL));
		CHECK_MSG(memcmp(l1, l2, sizeof(l1)) == 0, "%s KV", engine_kv_type_name(kvs[k]));
		CHECK_MSG(memcmp(l1, l3, sizeof(l1)) == 0, "%s KV", engine_kv_type_name(kvs[k]));
		CHECK(memcmp(t1, t2, sizeof(t1)) == 0 && memcmp(t1, t3, sizeof(t1)) == 0);
	}
}

#endif

int main(void)
{
	kt_rng_seed(0x9e3779b97f4a7c15ull);
	quant_init();
	TEST_RUN(test_quant_act_exact);
	TEST_RUN(test_quant_f16_sweep);
	TEST_RUN(test_vec_dot_all_types);
	TEST_RUN(test_f32_helpers);
	TEST_RUN(test_read_stream);
#ifndef KERN_TEST_KERNELS_ONLY
	TEST_RUN(test_greedy_scalar_vs_best);
	TEST_RUN(test_logits_q4_0_scalar_vs_best);
	TEST_RUN(test_threads_bitwise);
#endif
	return test_finish();
}
