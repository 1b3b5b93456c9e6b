/* tests/kernels/test_kern_attn.c: the attention kernels over F16 and Q8_0
 * KV caches (kern.h: attn_score_*, attn_vsum_*), every compiled-in variant
 * this CPU runs.
 *
 * - The scalar reference against an independent computation in double from
 *   the decoded values (ldexp decoders written here, not the engine's):
 *   score_f16 within one rounding of the exact dot and one of the scale;
 *   score_q8_0 and the vsums within their float roundings (the integer
 *   block sums are exact).
 * - Every other variant against the scalar reference: score_f16 within
 *   (hd + 8) 2^-24 scale sum |q k| (f32 sums in any order); score_q8_0 and
 *   both vsums bit for bit (kern.h: the same float steps in the same order).
 * - Shapes: head_dim 1-17, 31-33, 48, 64, 80, 96, 100, 128, 160, 256, 288
 *   and 1024 (every vector and block tail), 1 to 130 rows, row strides of 1
 *   to 8 heads with the row not at the start of the stride (GQA layouts),
 *   buffers allocated to the last byte read (ASan catches an overread),
 *   guard values after s[n] and o[hd].
 * - Inputs: Gaussian, tiny (f16 subnormals), large (up to 6e4), zeros,
 *   one spike per row; Q8_0 rows made by the reference quantizer (codes in
 *   [-127, 127], zero-padded tails) and random full-range codes.
 *
 * This binary needs no model, so `make check-aarch64` runs it under qemu
 * for the NEON variants too. */
#include "common/common.h"
#include "engine/kernels/kern.h"
#include "engine/quant.h"

#include "tests/kernels/kern_test_util.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double rng_normal(void)
{
	double u = kt_rng_unit() + 1e-12, v = kt_rng_unit();
	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* IEEE half from its bits, by the definition (independent of quant.c). */
static double dec_f16(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
	return (h & 0x8000) ? -v : v;
}

static const int head_dims[] = {1,  2,  3,  4,  5,  6,  7,  8,   9,   12,  15,  16,  17,  31,
				32, 33, 48, 64, 80, 96, 100, 128, 160, 256, 288, 1024};
static const int row_counts[] = {1, 2, 3, 7, 15, 16, 17, 33, 130};

static float value(int mode)
{
	switch (mode % 5) {
	case 0:
		return (float)rng_normal();
	case 1: /* f16 subnormals and tiny normals */
		return (float)(rng_normal() * 1e-6);
	case 2: /* large, still finite in f16 */
		return (float)((kt_rng_unit() * 2 - 1) * 6e4);
	case 3:
		return 0.0f;
	default: /* mostly small, a few spikes */
		return kt_rng_u64() % 17 == 0 ? 300.0f : (float)(rng_normal() * 0.01);
	}
}

/* A cache of n rows for one head: rows `stride` bytes apart, the head's row
 * at byte `off` of each; the buffer ends at the last byte of the last row. */
struct cache {
	uint8_t *buf;
	const uint8_t *rows; /* buf + off */
	size_t stride, row_bytes;
	int n, hd;
};

static void cache_alloc(struct cache *c, int n, int hd, size_t row_bytes, int heads, int head)
{
	c->n = n;
	c->hd = hd;
	c->row_bytes = row_bytes;
	c->stride = row_bytes * (size_t)heads;
	size_t off = row_bytes * (size_t)head;
	size_t len = off + (size_t)(n - 1) * c->stride + row_bytes;
	c->buf = kt_xcalloc(len);
	/* fill the other heads with noise: a kernel must not read them */
	for (size_t i = 0; i < len; i++)
		c->buf[i] = (uint8_t)kt_rng_u64();
	c->rows = c->buf + off;
}

static uint8_t *row(struct cache *c, int i)
{
	return (uint8_t *)c->rows + (size_t)i * c->stride;
}

static void fill_f16(struct cache *c, int mode)
{
	for (int i = 0; i < c->n; i++)
		for (int j = 0; j < c->hd; j++) {
			uint16_t h = quant_fp32_to_fp16(value(mode + i));
			memcpy(row(c, i) + 2 * j, &h, 2);
		}
}

/* Q8_0 rows: from floats by the reference quantizer, zero-padded to whole
 * blocks (as the engine stores them); mode 5: random codes in [-127, 127]
 * and random scales. */
static void fill_q8(struct cache *c, int mode)
{
	int nb = (c->hd + QK8_0 - 1) / QK8_0;
	float *x = kt_xcalloc(sizeof(float) * (size_t)nb * QK8_0);
	for (int i = 0; i < c->n; i++) {
		if (mode == 5) {
			struct block_q8_0 *b = (struct block_q8_0 *)row(c, i);
			for (int k = 0; k < nb; k++) {
				b[k].d = quant_fp32_to_fp16((float)(kt_rng_unit() * 0.1));
				for (int j = 0; j < QK8_0; j++)
					b[k].qs[j] = k * QK8_0 + j < c->hd
							? (int8_t)((int)(kt_rng_u64() % 255) - 127)
							: 0;
			}
			continue;
		}
		for (int j = 0; j < c->hd; j++)
			x[j] = value(mode + i);
		quant_quantize_row_q8_0_ref(x, row(c, i), (int64_t)nb * QK8_0);
	}
	free(x);
}

/* Query values, drawn from another distribution than the rows'. */
static float rnd_q(int mode)
{
	return value(mode + 2);
}

/* ---- the scalar reference against double ------------------------------------ */

static void test_reference_f16(void)
{
	const struct kern_ops *G = &kern_generic_ops;
	int bad = 0;
	for (size_t hi = 0; hi < CM_ARRAY_LEN(head_dims); hi++)
		for (int mode = 0; mode < 5; mode++) {
			int hd = head_dims[hi], n = row_counts[(hi + (size_t)mode) % CM_ARRAY_LEN(row_counts)];
			struct cache c;
			cache_alloc(&c, n, hd, (size_t)hd * 2, 1 + mode % 4, mode % 4);
			fill_f16(&c, mode);
			float *q = kt_xcalloc(sizeof(float) * (size_t)hd);
			float *w = kt_xcalloc(sizeof(float) * (size_t)n);
			float *s = kt_xcalloc(sizeof(float) * (size_t)(n + 1));
			float *o = kt_xcalloc(sizeof(float) * (size_t)(hd + 1));
			for (int j = 0; j < hd; j++)
				q[j] = rnd_q(mode);
			for (int i = 0; i < n; i++)
				w[i] = (float)kt_rng_unit();
			float scale = 1.0f / sqrtf((float)hd);
			G->attn_score_f16(hd, n, q, c.rows, c.stride, scale, s);
			G->attn_vsum_f16(hd, n, w, c.rows, c.stride, o);
			for (int i = 0; i < n; i++) {
				double e = 0, m = 0;
				for (int j = 0; j < hd; j++) {
					double kv = dec_f16(kt_rd16(row(&c, i) + 2 * j));
					e += (double)q[j] * kv;
					m += fabs((double)q[j] * kv);
				}
				/* one rounding of the dot, one of the product with scale */
				double tol = 0x1p-23 * fabs(e) * scale + 0x1p-40 * m * scale + 1e-38;
				if (!(fabs(s[i] - e * scale) <= tol)) {
					if (bad++ < 5)
						fprintf(stderr, "score_f16 hd %d row %d: %.9g vs %.9g\n", hd,
							i, s[i], e * scale);
				}
			}
			for (int j = 0; j < hd; j++) {
				double e = 0, m = 0;
				for (int i = 0; i < n; i++) {
					double kv = dec_f16(kt_rd16(row(&c, i) + 2 * j));
					e += (double)w[i] * kv;
					m += fabs((double)w[i] * kv);
				}
				if (!(fabs(o[j] - e) <= (2.0 * n + 2) * 0x1p-24 * m + 1e-38)) {
					if (bad++ < 5)
						fprintf(stderr, "vsum_f16 hd %d elem %d: %.9g vs %.9g\n", hd,
							j, o[j], e);
				}
			}
			free(c.buf);
			free(q);
			free(w);
			free(s);
			free(o);
		}
	CHECK_EQ_INT(bad, 0);
}

static void test_reference_q8_0(void)
{
	const struct kern_ops *G = &kern_generic_ops;
	int bad = 0;
	for (size_t hi = 0; hi < CM_ARRAY_LEN(head_dims); hi++)
		for (int mode = 0; mode < 6; mode++) {
			int hd = head_dims[hi], nb = (hd + QK8_0 - 1) / QK8_0;
			int n = row_counts[(hi + (size_t)mode) % CM_ARRAY_LEN(row_counts)];
			size_t rb = (size_t)nb * sizeof(struct block_q8_0);
			struct cache c, qc;
			cache_alloc(&c, n, hd, rb, 1 + mode % 4, mode % 4);
			fill_q8(&c, mode);
			cache_alloc(&qc, 1, hd, rb, 1, 0);
			fill_q8(&qc, mode == 5 ? 5 : 0);
			float *w = kt_xcalloc(sizeof(float) * (size_t)n);
			float *s = kt_xcalloc(sizeof(float) * (size_t)n);
			float *o = kt_xcalloc(sizeof(float) * (size_t)hd);
			for (int i = 0; i < n; i++)
				w[i] = (float)kt_rng_unit();
			float scale = 0.125f;
			G->attn_score_q8_0(hd, n, qc.rows, c.rows, c.stride, scale, s);
			G->attn_vsum_q8_0(hd, n, w, c.rows, c.stride, o);
			const struct block_q8_0 *qb = (const struct block_q8_0 *)qc.rows;
			for (int i = 0; i < n; i++) {
				const struct block_q8_0 *kb = (const struct block_q8_0 *)row(&c, i);
				double e = 0, m = 0;
				for (int b = 0; b < nb; b++) {
					long isum = 0;
					for (int j = 0; j < QK8_0; j++)
						isum += (long)qb[b].qs[j] * kb[b].qs[j];
					double t = dec_f16(qb[b].d) * dec_f16(kb[b].d) * (double)isum;
					e += t;
					m += fabs(t);
				}
				/* per block: the scale product, the product with isum and
				 * the sum, each rounded once; then the scale */
				double tol = (3.0 * nb + 2) * 0x1p-24 * m * scale + 1e-38;
				if (!(fabs(s[i] - e * scale) <= tol) && bad++ < 5)
					fprintf(stderr, "score_q8_0 hd %d row %d: %.9g vs %.9g\n", hd, i,
						s[i], e * scale);
			}
			for (int j = 0; j < hd; j++) {
				double e = 0, m = 0;
				for (int i = 0; i < n; i++) {
					const struct block_q8_0 *kb = (const struct block_q8_0 *)row(&c, i);
					double t = (double)w[i] * dec_f16(kb[j / QK8_0].d) *
						   kb[j / QK8_0].qs[j % QK8_0];
					e += t;
					m += fabs(t);
				}
				if (!(fabs(o[j] - e) <= (3.0 * n + 2) * 0x1p-24 * m + 1e-38) && bad++ < 5)
					fprintf(stderr, "vsum_q8_0 hd %d elem %d: %.9g vs %.9g\n", hd, j,
						o[j], e);
			}
			free(c.buf);
			free(qc.buf);
			free(w);
			free(s);
			free(o);
		}
	CHECK_EQ_INT(bad, 0);
}

/* ---- every variant against the scalar reference ----------------------------- */

static const struct kern_ops *V;
static const char *V_name;

static void test_variant_f16(void)
{
	const struct kern_ops *G = &kern_generic_ops;
	int bad = 0, cases = 0;
	for (size_t hi = 0; hi < CM_ARRAY_LEN(head_dims); hi++)
		for (size_t ri = 0; ri < CM_ARRAY_LEN(row_counts); ri++) {
			int hd = head_dims[hi], n = row_counts[ri], mode = (int)(hi + ri);
			if (hd == 1024 && n > 17)
				continue;
			struct cache c;
			cache_alloc(&c, n, hd, (size_t)hd * 2, 1 + (int)ri % 8, (int)ri % 8);
			fill_f16(&c, mode);
			float *q = kt_xcalloc(sizeof(float) * (size_t)hd);
			float *w = kt_xcalloc(sizeof(float) * (size_t)n);
			float *s0 = kt_xcalloc(sizeof(float) * (size_t)(n + 1));
			float *s1 = kt_xcalloc(sizeof(float) * (size_t)(n + 1));
			float *o0 = kt_xcalloc(sizeof(float) * (size_t)(hd + 1));
			float *o1 = kt_xcalloc(sizeof(float) * (size_t)(hd + 1));
			for (int j = 0; j < hd; j++)
				q[j] = rnd_q(mode);
			for (int i = 0; i < n; i++)
				w[i] = (float)kt_rng_unit();
			s1[n] = o1[hd] = 1234.5f; /* guards */
			for (int j = 0; j < hd; j++)
				o1[j] = NAN; /* overwritten, never read */
			float scale = 1.0f / sqrtf((float)hd);
			G->attn_score_f16(hd, n, q, c.rows, c.stride, scale, s0);
			V->attn_score_f16(hd, n, q, c.rows, c.stride, scale, s1);
			G->attn_vsum_f16(hd, n, w, c.rows, c.stride, o0);
			V->attn_vsum_f16(hd, n, w, c.rows, c.stride, o1);
			for (int i = 0; i < n; i++) {
				double m = 0;
				for (int j = 0; j < hd; j++)
					m += fabs((double)q[j] *
						  quant_fp16_to_f32(kt_rd16(row(&c, i) + 2 * j)));
				double tol = (hd + 8) * 0x1p-24 * scale * m + 1e-38;
				if (!(fabs((double)s1[i] - s0[i]) <= tol) && bad++ < 5)
					fprintf(stderr, "%s score_f16 hd %d n %d row %d: %.9g vs %.9g\n",
						V_name, hd, n, i, s1[i], s0[i]);
			}
			if (memcmp(o0, o1, sizeof(float) * (size_t)hd) != 0 && bad++ < 5)
				fprintf(stderr, "%s vsum_f16 hd %d n %d: not bit-identical\n", V_name, hd,
					n);
			CHECK(s1[n] == 1234.5f && o1[hd] == 1234.5f);
			cases++;
			free(c.buf);
			free(q);
			free(w);
			free(s0);
			free(s1);
			free(o0);
			free(o1);
		}
	CHECK_EQ_INT(bad, 0);
	CHECK(cases > 200);
}

static void test_variant_q8_0(void)
{
	const struct kern_ops *G = &kern_generic_ops;
	int bad = 0, cases = 0;
	for (size_t hi = 0; hi < CM_ARRAY_LEN(head_dims); hi++)
		for (size_t ri = 0; ri < CM_ARRAY_LEN(row_counts); ri++) {
			int hd = head_dims[hi], n = row_counts[ri], mode = (int)(hi + ri) % 6;
			int nb = (hd + QK8_0 - 1) / QK8_0;
			if (hd == 1024 && n > 17)
				continue;
			size_t rb = (size_t)nb * sizeof(struct block_q8_0);
			struct cache c, qc;
			cache_alloc(&c, n, hd, rb, 1 + (int)ri % 8, (int)ri % 8);
			fill_q8(&c, mode);
			cache_alloc(&qc, 1, hd, rb, 1, 0);
			fill_q8(&qc, mode == 5 ? 5 : (int)ri % 5);
			float *w = kt_xcalloc(sizeof(float) * (size_t)n);
			float *s0 = kt_xcalloc(sizeof(float) * (size_t)(n + 1));
			float *s1 = kt_xcalloc(sizeof(float) * (size_t)(n + 1));
			float *o0 = kt_xcalloc(sizeof(float) * (size_t)(hd + 1));
			float *o1 = kt_xcalloc(sizeof(float) * (size_t)(hd + 1));
			for (int i = 0; i < n; i++)
				w[i] = (float)kt_rng_unit();
			s1[n] = o1[hd] = 1234.5f;
			for (int j = 0; j < hd; j++)
				o1[j] = NAN;
			float scale = 1.0f / sqrtf((float)hd);
			G->attn_score_q8_0(hd, n, qc.rows, c.rows, c.stride, scale, s0);
			V->attn_score_q8_0(hd, n, qc.rows, c.rows, c.stride, scale, s1);
			G->attn_vsum_q8_0(hd, n, w, c.rows, c.stride, o0);
			V->attn_vsum_q8_0(hd, n, w, c.rows, c.stride, o1);
			if (memcmp(s0, s1, sizeof(float) * (size_t)n) != 0 && bad++ < 5) {
				int i = 0;
				while (i < n && s0[i] == s1[i])
					i++;
				fprintf(stderr, "%s score_q8_0 hd %d n %d row %d: %.9g vs %.9g\n", V_name,
					hd, n, i, s1[i], s0[i]);
			}
			if (memcmp(o0, o1, sizeof(float) * (size_t)hd) != 0 && bad++ < 5) {
				int j = 0;
				while (j < hd && o0[j] == o1[j])
					j++;
				fprintf(stderr, "%s vsum_q8_0 hd %d n %d elem %d: %.9g vs %.9g\n", V_name,
					hd, n, j, o1[j], o0[j]);
			}
			CHECK(s1[n] == 1234.5f && o1[hd] == 1234.5f);
			cases++;
			free(c.buf);
			free(qc.buf);
			free(w);
			free(s0);
			free(s1);
			free(o0);
			free(o1);
		}
	CHECK_EQ_INT(bad, 0);
	CHECK(cases > 200);
}

/* The several-head kernels (kern.h: _mq), where the variant has them:
 * each head's scores and weighted sum bit for bit the variant's single-head
 * kernel's, for 1 to 9 heads (groups of 4 and their remainders), heads
 * strided apart with guard values between them, every shape above. */
static void test_variant_mq(void)
{
	if (!V->attn_score_f16_mq && !V->attn_vsum_f16_mq) {
		fprintf(stderr, "%s: no several-head kernels (model.c loops the heads)\n", V_name);
		return;
	}
	CHECK_MSG(V->attn_score_f16_mq && V->attn_vsum_f16_mq, "%s: one mq kernel of two",
		  V_name);
	if (!V->attn_score_f16_mq || !V->attn_vsum_f16_mq)
		return;
	int bad = 0, cases = 0;
	for (size_t hi = 0; hi < CM_ARRAY_LEN(head_dims); hi++)
		for (size_t ri = 0; ri < CM_ARRAY_LEN(row_counts); ri++) {
			int hd = head_dims[hi], n = row_counts[ri], mode = (int)(hi + ri);
			int nq = 1 + (int)((hi * 3 + ri) % 9);
			if (hd == 1024 && n > 17)
				continue;
			struct cache c;
			cache_alloc(&c, n, hd, (size_t)hd * 2, 1 + (int)ri % 8, (int)ri % 8);
			fill_f16(&c, mode);
			/* per head: hd values then a guard; n scores then a guard */
			size_t qs = (size_t)hd + 3, ss = (size_t)n + 5;
			float *q = kt_xcalloc(sizeof(float) * qs * (size_t)nq);
			float *w = kt_xcalloc(sizeof(float) * ss * (size_t)nq);
			float *s0 = kt_xcalloc(sizeof(float) * ss * (size_t)nq);
			float *s1 = kt_xcalloc(sizeof(float) * ss * (size_t)nq);
			float *o0 = kt_xcalloc(sizeof(float) * qs * (size_t)nq);
			float *o1 = kt_xcalloc(sizeof(float) * qs * (size_t)nq);
			for (size_t i = 0; i < qs * (size_t)nq; i++) {
				q[i] = rnd_q(mode);
				o1[i] = 1234.5f;
			}
			for (size_t i = 0; i < ss * (size_t)nq; i++) {
				w[i] = (float)kt_rng_unit();
				s1[i] = 1234.5f;
			}
			float scale = 1.0f / sqrtf((float)hd);
			V->attn_score_f16_mq(hd, n, nq, q, qs, c.rows, c.stride, scale, s1, ss);
			V->attn_vsum_f16_mq(hd, n, nq, w, ss, c.rows, c.stride, o1, qs);
			for (int h = 0; h < nq; h++) {
				size_t hq = (size_t)h * qs, hs = (size_t)h * ss;
				V->attn_score_f16(hd, n, q + hq, c.rows, c.stride, scale, s0 + hs);
				V->attn_vsum_f16(hd, n, w + hs, c.rows, c.stride, o0 + hq);
				if (memcmp(s0 + hs, s1 + hs, sizeof(float) * (size_t)n) != 0 &&
				    bad++ < 5)
					fprintf(stderr, "%s score_f16_mq hd %d n %d head %d of %d\n",
						V_name, hd, n, h, nq);
				if (memcmp(o0 + hq, o1 + hq, sizeof(float) * (size_t)hd) != 0 &&
				    bad++ < 5)
					fprintf(stderr, "%s vsum_f16_mq hd %d n %d head %d of %d\n",
						V_name, hd, n, h, nq);
				for (size_t g = (size_t)n; g < ss; g++)
					CHECK(s1[hs + g] == 1234.5f);
				for (size_t g = (size_t)hd; g < qs; g++)
					CHECK(o1[hq + g] == 1234.5f);
			}
			cases++;
			free(c.buf);
			free(q);
			free(w);
			free(s0);
			free(s1);
			free(o0);
			free(o1);
		}
	CHECK_EQ_INT(bad, 0);
	CHECK(cases > 200);
}

/* n = 0 rows: scores untouched, the weighted sum is zero. */
static void test_variant_empty(void)
{
	uint8_t k[64] = {0};
	float q[32] = {0}, s[1] = {7.0f}, o[32];
	for (int j = 0; j < 32; j++)
		o[j] = NAN;
	V->attn_score_f16(32, 0, q, k, 64, 1.0f, s);
	V->attn_score_q8_0(32, 0, k, k, 34, 1.0f, s);
	CHECK(s[0] == 7.0f);
	V->attn_vsum_f16(32, 0, q, k, 64, o);
	for (int j = 0; j < 32; j++)
		CHECK(o[j] == 0.0f);
	for (int j = 0; j < 32; j++)
		o[j] = NAN;
	V->attn_vsum_q8_0(32, 0, q, k, 34, o);
	for (int j = 0; j < 32; j++)
		CHECK(o[j] == 0.0f);
}

static void test_tables(void)
{
	struct cm_cpu_isa caps;
	kern_detect_caps(&caps);
	for (const char *const *nm = kern_variant_names(); *nm; nm++) {
		const struct kern_ops *k = kern_select(&caps, *nm);
		if (!k)
			continue;
		CHECK_MSG(k->attn_score_f16 && k->attn_score_q8_0 && k->attn_vsum_f16 &&
				  k->attn_vsum_q8_0,
			  "%s lacks an attention kernel", *nm);
	}
}

static void run_variant_test(void (*fn)(void), const char *test)
{
	static char name[128];
	snprintf(name, sizeof(name), "%s/%s", V_name, test);
	test_run_one(fn, name);
}

int main(void)
{
	kt_rng_seed(0x6a09e667f3bcc909ull);
	quant_init();
	TEST_RUN(test_tables);
	TEST_RUN(test_reference_f16);
	TEST_RUN(test_reference_q8_0);

	struct cm_cpu_isa caps;
	kern_detect_caps(&caps);
	for (const char *const *nm = kern_variant_names(); *nm; nm++) {
		V = kern_select(&caps, *nm);
		V_name = *nm;
		if (!V) {
			fprintf(stderr, "variant %s: not supported by this CPU, not tested\n", *nm);
			continue;
		}
		fprintf(stderr, "variant %s: score_f16 %s, score_q8_0 %s, vsum_f16 %s, vsum_q8_0 %s\n",
			*nm, V->attn_score_f16 == kern_generic_ops.attn_score_f16 ? "scalar" : "own",
			V->attn_score_q8_0 == kern_generic_ops.attn_score_q8_0 ? "scalar" : "own",
			V->attn_vsum_f16 == kern_generic_ops.attn_vsum_f16 ? "scalar" : "own",
			V->attn_vsum_q8_0 == kern_generic_ops.attn_vsum_q8_0 ? "scalar" : "own");
		run_variant_test(test_variant_f16, "f16");
		run_variant_test(test_variant_q8_0, "q8_0");
		run_variant_test(test_variant_mq, "mq");
		run_variant_test(test_variant_empty, "empty");
	}
	return test_finish();
}
