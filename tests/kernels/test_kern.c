/* tests/kernels/test_kern.c: half/bfloat conversion, the reference
 * quantizers, and every compiled-in kernel variant against independent
 * expectations.
 *
 * Nothing here checks a function against itself. The expectations come
 * from (a) hand-written known-answer vectors, (b) decoders written in this
 * file straight from gguf-formats §2 with ldexp() (ref_decode), sharing no
 * code with the engine, and (c) error bounds derived from the formats.
 * The variant tests loop over kern_variant_names(), so a new SIMD file is
 * tested as soon as it is listed in kern_select.c; variants this CPU cannot
 * run are reported and skipped. */
#include "engine/kernels/kern.h"
#include "engine/quant.h"

#include "tests/kernels/kern_test_util.h"
#include "tests/test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

static double rng_unif(double lo, double hi)
{
	return lo + (hi - lo) * kt_rng_unit();
}

static double rng_normal(void)
{
	double u = rng_unif(1e-12, 1.0), v = rng_unif(0.0, 1.0);
	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Independent decoders, from the spec text only. */
static double ref_f16(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(1024 + m, e - 25);
	return (h & 0x8000) ? -v : v;
}

static double ref_bf16(uint16_t b)
{
	int e = (b >> 7) & 255, m = b & 127;
	double v;
	if (e == 0)
		v = ldexp(m, -133);
	else if (e == 255)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(128 + m, e - 134);
	return (b & 0x8000) ? -v : v;
}

static const int iq4k[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
			       1,    13,   25,  38,  53,  69,  89,  113 };

/* 6-bit scale/min pair j of a Q4_K/Q5_K scales[12] (§2.4, "k4" packing). */
static void ref_k4(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

/* Decode n elements of `type` to double. When mag is not NULL it gets, per
 * element, |scale part| + |min part| of the value (just |value| for formats
 * without a min): the size of what a kernel's roundings act on. */
static void ref_decode2(uint32_t type, const void *src, int64_t n, double *out, double *mag)
{
	const uint8_t *p = src;
	switch (type) {
	case ENGINE_DTYPE_F32:
		for (int64_t i = 0; i < n; i++) {
			float f;
			memcpy(&f, p + 4 * i, 4);
			out[i] = f;
		}
		break;
	case ENGINE_DTYPE_F16:
		for (int64_t i = 0; i < n; i++)
			out[i] = ref_f16(kt_rd16(p + 2 * i));
		break;
	case ENGINE_DTYPE_BF16:
		for (int64_t i = 0; i < n; i++)
			out[i] = ref_bf16(kt_rd16(p + 2 * i));
		break;
	case ENGINE_DTYPE_Q8_0:
		for (int64_t b = 0; b < n / 32; b++, p += 34) {
			double d = ref_f16(kt_rd16(p));
			for (int j = 0; j < 32; j++)
				out[32 * b + j] = d * (int8_t)p[2 + j];
		}
		break;
	case ENGINE_DTYPE_Q8_1: /* f16 d, f16 s, i8 qs[32] */
		for (int64_t b = 0; b < n / 32; b++, p += 36) {
			double d = ref_f16(kt_rd16(p));
			for (int j = 0; j < 32; j++)
				out[32 * b + j] = d * (int8_t)p[4 + j];
		}
		break;
	case ENGINE_DTYPE_Q4_0:
		for (int64_t b = 0; b < n / 32; b++, p += 18) {
			double d = ref_f16(kt_rd16(p));
			for (int j = 0; j < 16; j++) {
				out[32 * b + j] = d * ((p[2 + j] & 15) - 8);
				out[32 * b + j + 16] = d * ((p[2 + j] >> 4) - 8);
			}
		}
		break;
	case ENGINE_DTYPE_Q4_1: /* f16 d, f16 m, qs[16] */
		for (int64_t b = 0; b < n / 32; b++, p += 20) {
			double d = ref_f16(kt_rd16(p)), m = ref_f16(kt_rd16(p + 2));
			for (int j = 0; j < 32; j++) {
				int q = j < 16 ? p[4 + j] & 15 : p[4 + j - 16] >> 4;
				out[32 * b + j] = d * q + m;
				if (mag)
					mag[32 * b + j] = fabs(d * q) + fabs(m);
			}
		}
		break;
	case ENGINE_DTYPE_Q5_0: /* f16 d, qh[4], qs[16] */
	case ENGINE_DTYPE_Q5_1: /* f16 d, f16 m, qh[4], qs[16] */
	{
		int q51 = type == ENGINE_DTYPE_Q5_1, bs = q51 ? 24 : 22, o = q51 ? 4 : 2;
		for (int64_t b = 0; b < n / 32; b++, p += bs) {
			double d = ref_f16(kt_rd16(p)), m = q51 ? ref_f16(kt_rd16(p + 2)) : 0;
			uint32_t H = p[o] | p[o + 1] << 8 | p[o + 2] << 16 |
				     (uint32_t)p[o + 3] << 24;
			for (int j = 0; j < 32; j++) {
				int lo = j < 16 ? p[o + 4 + j] & 15 : p[o + 4 + j - 16] >> 4;
				int q = lo | (int)((H >> j) & 1) << 4;
				out[32 * b + j] = q51 ? d * q + m : d * (q - 16);
				if (mag)
					mag[32 * b + j] = fabs(out[32 * b + j] - m) + fabs(m);
			}
		}
		break;
	}
	case ENGINE_DTYPE_IQ4_NL:
		for (int64_t b = 0; b < n / 32; b++, p += 18) {
			double d = ref_f16(kt_rd16(p));
			for (int j = 0; j < 16; j++) {
				out[32 * b + j] = d * iq4k[p[2 + j] & 15];
				out[32 * b + j + 16] = d * iq4k[p[2 + j] >> 4];
			}
		}
		break;
	case ENGINE_DTYPE_Q2_K: /* scales[16], qs[64], f16 d, f16 dmin */
		for (int64_t b = 0; b < n / 256; b++, p += 84) {
			double d = ref_f16(kt_rd16(p + 80)), dmin = ref_f16(kt_rd16(p + 82));
			for (int e = 0; e < 256; e++) {
				int h = e / 128, g = (e % 128) / 32, l = e % 32;
				int q = (p[16 + 32 * h + l] >> (2 * g)) & 3;
				int sc = p[e / 16] & 15, m = p[e / 16] >> 4;
				out[256 * b + e] = d * sc * q - dmin * m;
				if (mag)
					mag[256 * b + e] = fabs(d * sc * q) + fabs(dmin * m);
			}
		}
		break;
	case ENGINE_DTYPE_Q3_K: /* hmask[32], qs[64], scales[12], f16 d */
		for (int64_t b = 0; b < n / 256; b++, p += 110) {
			double d = ref_f16(kt_rd16(p + 108));
			const uint8_t *sc = p + 96;
			for (int e = 0; e < 256; e++) {
				int h = e / 128, g = (e % 128) / 32, l = e % 32, i = e / 16;
				int q2 = (p[32 + 32 * h + l] >> (2 * g)) & 3;
				int hb = (p[l] >> (e / 32)) & 1;
				int lo = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4;
				int s6 = (lo | ((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
				out[256 * b + e] = d * s6 * ((q2 | hb << 2) - 4);
			}
		}
		break;
	case ENGINE_DTYPE_Q4_K: /* f16 d, f16 dmin, scales[12], qs[128] */
	case ENGINE_DTYPE_Q5_K: /* ... qh[32] before qs */
	{
		int q5 = type == ENGINE_DTYPE_Q5_K, bs = q5 ? 176 : 144, oq = q5 ? 48 : 16;
		for (int64_t b = 0; b < n / 256; b++, p += bs) {
			double d = ref_f16(kt_rd16(p)), dmin = ref_f16(kt_rd16(p + 2));
			for (int e = 0; e < 256; e++) {
				int sb = e / 32, l = e % 32, sc, m;
				ref_k4(p + 4, sb, &sc, &m);
				int q = (p[oq + 32 * (e / 64) + l] >> (4 * (sb & 1))) & 15;
				if (q5)
					q += 16 * ((p[16 + l] >> sb) & 1);
				out[256 * b + e] = d * sc * q - dmin * m;
				if (mag)
					mag[256 * b + e] = fabs(d * sc * q) + fabs(dmin * m);
			}
		}
		break;
	}
	case ENGINE_DTYPE_Q6_K: /* ql[128], qh[64], i8 scales[16], f16 d */
		for (int64_t b = 0; b < n / 256; b++, p += 210) {
			double d = ref_f16(kt_rd16(p + 208));
			for (int e = 0; e < 256; e++) {
				int h = e / 128, k = (e % 128) / 32, l = e % 32;
				int lo = (p[64 * h + 32 * (k & 1) + l] >> (k < 2 ? 0 : 4)) & 15;
				int hi = (p[128 + 32 * h + l] >> (2 * k)) & 3;
				int sc = (int8_t)p[192 + e / 16];
				out[256 * b + e] = d * sc * ((lo | hi << 4) - 32);
			}
		}
		break;
	case ENGINE_DTYPE_Q8_K: /* f32 d, i8 qs[256], i16 bsums[16] */
		for (int64_t b = 0; b < n / 256; b++, p += 292) {
			float d;
			memcpy(&d, p, 4);
			for (int e = 0; e < 256; e++)
				out[256 * b + e] = (double)d * (int8_t)p[4 + e];
		}
		break;
	case ENGINE_DTYPE_IQ4_XS: /* f16 d, u16 scales_h, scales_l[4], qs[128] */
		for (int64_t b = 0; b < n / 256; b++, p += 136) {
			double d = ref_f16(kt_rd16(p));
			int sh = kt_rd16(p + 2);
			for (int ib = 0; ib < 8; ib++) {
				int ls = ((p[4 + ib / 2] >> (4 * (ib % 2))) & 15) |
					 ((sh >> (2 * ib)) & 3) << 4;
				double *o = out + 256 * b + 32 * ib;
				for (int j = 0; j < 16; j++) {
					uint8_t q = p[8 + 16 * ib + j];
					o[j] = d * (ls - 32) * iq4k[q & 15];
					o[j + 16] = d * (ls - 32) * iq4k[q >> 4];
				}
			}
		}
		break;
	default:
		fprintf(stderr, "ref_decode: type %u not handled\n", type);
		abort();
	}
	bool has_min = type == ENGINE_DTYPE_Q4_1 || type == ENGINE_DTYPE_Q5_1 ||
		       type == ENGINE_DTYPE_Q5_0 || type == ENGINE_DTYPE_Q2_K ||
		       type == ENGINE_DTYPE_Q4_K || type == ENGINE_DTYPE_Q5_K;
	if (mag && !has_min)
		for (int64_t i = 0; i < n; i++)
			mag[i] = fabs(out[i]);
}

static void ref_decode(uint32_t type, const void *src, int64_t n, double *out)
{
	ref_decode2(type, src, n, out, NULL);
}

/* Elements and bytes per block, from the §2.1 table (not from quant_dtype_get). */
static void ref_block(uint32_t type, int *blck, int *size)
{
	static const struct {
		uint32_t t;
		int blck, size;
	} tab[] = {
		{ ENGINE_DTYPE_F32, 1, 4 },	 { ENGINE_DTYPE_F16, 1, 2 },
		{ ENGINE_DTYPE_BF16, 1, 2 },	 { ENGINE_DTYPE_Q4_0, 32, 18 },
		{ ENGINE_DTYPE_Q4_1, 32, 20 },	 { ENGINE_DTYPE_Q5_0, 32, 22 },
		{ ENGINE_DTYPE_Q5_1, 32, 24 },	 { ENGINE_DTYPE_Q8_0, 32, 34 },
		{ ENGINE_DTYPE_Q8_1, 32, 36 },	 { ENGINE_DTYPE_Q2_K, 256, 84 },
		{ ENGINE_DTYPE_Q3_K, 256, 110 }, { ENGINE_DTYPE_Q4_K, 256, 144 },
		{ ENGINE_DTYPE_Q5_K, 256, 176 }, { ENGINE_DTYPE_Q6_K, 256, 210 },
		{ ENGINE_DTYPE_Q8_K, 256, 292 }, { ENGINE_DTYPE_IQ4_NL, 32, 18 },
		{ ENGINE_DTYPE_IQ4_XS, 256, 136 },
	};
	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		if (tab[i].t == type) {
			*blck = tab[i].blck;
			*size = tab[i].size;
			return;
		}
	}
	*blck = 1;
	*size = 0;
}

/* Bytes of n elements, from the §2.1 sizes (not from quant_dtype_row_size). */
static size_t ref_bytes(uint32_t type, int64_t n)
{
	int blck, size;
	ref_block(type, &blck, &size);
	return (size_t)(n / blck) * (size_t)size;
}

/* Offsets of the f16 scale fields inside a block (-1 terminated). */
static const int *half_fields(uint32_t type)
{
	static const int at0[] = { 0, -1 }, at01[] = { 0, 2, -1 }, q2k[] = { 80, 82, -1 },
			 q3k[] = { 108, -1 }, q6k[] = { 208, -1 }, none[] = { -1 };
	switch (type) {
	case ENGINE_DTYPE_Q4_0:
	case ENGINE_DTYPE_Q5_0:
	case ENGINE_DTYPE_Q8_0:
	case ENGINE_DTYPE_IQ4_NL:
	case ENGINE_DTYPE_IQ4_XS:
		return at0;
	case ENGINE_DTYPE_Q4_1:
	case ENGINE_DTYPE_Q5_1:
	case ENGINE_DTYPE_Q8_1:
	case ENGINE_DTYPE_Q4_K:
	case ENGINE_DTYPE_Q5_K:
		return at01;
	case ENGINE_DTYPE_Q2_K:
		return q2k;
	case ENGINE_DTYPE_Q3_K:
		return q3k;
	case ENGINE_DTYPE_Q6_K:
		return q6k;
	}
	return none;
}

/* A random half with a normal exponent in [emin, emax] (biased) and sign. */
static uint16_t rand_half(int emin, int emax, int allow_neg)
{
	uint16_t e = (uint16_t)(emin + (int)(kt_rng_u64() % (uint64_t)(emax - emin + 1)));
	uint16_t h = (uint16_t)((e << 10) | (kt_rng_u64() & 1023));
	if (allow_neg && (kt_rng_u64() & 1))
		h |= 0x8000;
	return h;
}

/* ---- half precision ------------------------------------------------------------- */

static void test_fp16_decode_exhaustive(void)
{
	quant_init();
	quant_init(); /* idempotent */
	for (uint32_t h = 0; h < 65536; h++) {
		float f = quant_fp16_to_f32((uint16_t)h);
		double r = ref_f16((uint16_t)h);
		if (isnan(r)) {
			CHECK_MSG(isnan(f) && !!signbit(f) == !!(h & 0x8000), "half 0x%04x", h);
		} else {
			CHECK_MSG(f == r && !!signbit(f) == !!signbit(r), "half 0x%04x: %g vs %g",
				  h, f, r);
		}
		CHECK_MSG(f2u(quant_fp16_table[h]) == f2u(f), "table entry 0x%04x", h);
		if (test_cur_failed > 10)
			return;
	}
}

static void test_fp16_roundtrip_exhaustive(void)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = (float)ref_f16((uint16_t)h);
		uint16_t r = quant_fp32_to_fp16(f);
		if (isnan(f)) {
			/* Payload aside, a NaN must stay a NaN of the same sign. */
			CHECK_MSG((r & 0x7c00) == 0x7c00 && (r & 0x3ff) &&
					  (r & 0x8000) == (h & 0x8000),
				  "nan 0x%04x -> 0x%04x", h, r);
		} else {
			CHECK_MSG(r == h, "0x%04x -> %g -> 0x%04x", h, f, r);
		}
		if (test_cur_failed > 10)
			return;
	}
}

/* Every midpoint between adjacent finite halves (both signs): a tie goes to
 * the even code, one float ulp either side goes to the nearer code. */
static void test_fp16_rne_midpoints(void)
{
	for (uint32_t h = 0; h < 0x7bff; h++) {
		double lo = ref_f16((uint16_t)h), hi = ref_f16((uint16_t)(h + 1));
		float mid = (float)((lo + hi) / 2);
		CHECK_MSG((double)mid == (lo + hi) / 2, "midpoint of 0x%04x not exact", h);
		uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
		float up = nextafterf(mid, INFINITY), down = nextafterf(mid, 0.0f);
		CHECK_MSG(quant_fp32_to_fp16(mid) == even, "tie above 0x%04x -> 0x%04x", h,
			  quant_fp32_to_fp16(mid));
		CHECK_MSG(quant_fp32_to_fp16(up) == h + 1, "above mid of 0x%04x", h);
		CHECK_MSG(quant_fp32_to_fp16(down) == h, "below mid of 0x%04x", h);
		CHECK_MSG(quant_fp32_to_fp16(-mid) == (even | 0x8000), "negative tie 0x%04x", h);
		CHECK_MSG(quant_fp32_to_fp16(-up) == ((h + 1) | 0x8000), "negative above 0x%04x", h);
		if (test_cur_failed > 10)
			return;
	}
}

static void test_fp16_known_values(void)
{
	static const struct {
		float f;
		uint16_t h;
	} kv[] = {
		{ 0.0f, 0x0000 },
		{ -0.0f, 0x8000 },
		{ 1.0f, 0x3c00 },
		{ -2.0f, 0xc000 },
		{ 0.1f, 0x2e66 },
		{ 0.33333334f, 0x3555 },
		{ 65504.0f, 0x7bff },	    /* largest half */
		{ -65504.0f, 0xfbff },
		{ 65519.0f, 0x7bff },	    /* below the midpoint to 2^16 */
		{ 65520.0f, 0x7c00 },	    /* the midpoint: ties to even = overflow */
		{ -65520.0f, 0xfc00 },
		{ 1e10f, 0x7c00 },
		{ 3.4e38f, 0x7c00 },
		{ 6.103515625e-5f, 0x0400 }, /* smallest normal 2^-14 */
		{ 6.1e-5f, 0x03ff },	    /* just below: largest subnormal */
		{ 5.96e-8f, 0x0001 },	    /* smallest subnormal 2^-24 */
		{ 0x1p-24f, 0x0001 },
		{ 0x1p-25f, 0x0000 },	    /* tie between 0 and 2^-24 -> 0 */
		{ 2.98e-8f, 0x0000 },
		{ 3e-8f, 0x0001 },
		{ 0x1.8p-24f, 0x0002 },    /* 1.5 * 2^-24: tie -> 2 */
		{ 1e-30f, 0x0000 },
		{ -1e-45f, 0x8000 },	    /* f32 subnormal */
		{ 1.00048828125f, 0x3c00 }, /* 1 + 2^-11: tie -> even 1.0 */
		{ 1.00146484375f, 0x3c02 }, /* 1 + 3*2^-11: tie -> even 0x3c02 */
		{ 1.0005f, 0x3c01 },	    /* above the tie */
		{ 2049.0f, 0x6800 },
		{ 2051.0f, 0x6802 },
		{ INFINITY, 0x7c00 },
		{ -INFINITY, 0xfc00 },
	};
	for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
		CHECK_MSG(quant_fp32_to_fp16(kv[i].f) == kv[i].h, "%.9g -> 0x%04x, expected 0x%04x",
			  kv[i].f, quant_fp32_to_fp16(kv[i].f), kv[i].h);

	/* NaNs: a payload only in the low 13 bits must not turn into inf. */
	static const uint32_t nans[] = { 0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu,
					 0xffffffffu };
	for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
		uint16_t r = quant_fp32_to_fp16(u2f(nans[i]));
		CHECK_MSG((r & 0x7c00) == 0x7c00 && (r & 0x3ff) != 0, "nan 0x%08x -> 0x%04x",
			  nans[i], r);
		CHECK_EQ_INT(r >> 15, nans[i] >> 31);
	}
}

/* Random floats over the whole range: the result is a nearest half. */
static void test_fp16_random_nearest(void)
{
	for (int i = 0; i < 200000; i++) {
		float f = u2f((uint32_t)kt_rng_u64());
		if (isnan(f))
			continue;
		uint16_t h = quant_fp32_to_fp16(f);
		double err = fabs(ref_f16(h) - f);
		double af = fabs((double)f);
		if (af >= 65520.0) {
			CHECK_MSG((h & 0x7fff) == 0x7c00, "%g -> 0x%04x", f, h);
			continue;
		}
		/* No neighbour of h is strictly closer. */
		uint16_t mag = h & 0x7fff;
		double e_up = fabs(ref_f16((uint16_t)(h + 1)) - f);
		double e_down = fabs(ref_f16((uint16_t)(h - 1)) - f);
		if (mag < 0x7bff)
			CHECK_MSG(err <= e_up, "%g -> 0x%04x", f, h);
		if (mag > 0)
			CHECK_MSG(err <= e_down, "%g -> 0x%04x", f, h);
		else
			CHECK_MSG(af <= ldexp(1, -25), "%g -> 0x%04x", f, h);
		CHECK_MSG(!!(h & 0x8000) == !!signbit(f), "sign of %g", f);
		if (test_cur_failed > 10)
			return;
	}
}

/* ---- bfloat16 ------------------------------------------------------------------- */

static void test_bf16(void)
{
	/* Exhaustive round trip; NaNs stay NaN and come back quiet. */
	for (uint32_t b = 0; b < 65536; b++) {
		double r = ref_bf16((uint16_t)b);
		float f = quant_bf16_to_f32((uint16_t)b);
		uint16_t back = quant_fp32_to_bf16(f);
		if (isnan(r)) {
			CHECK_MSG(isnan(f), "0x%04x", b);
			CHECK_MSG((back & 0x7f80) == 0x7f80 && (back & 0x40) &&
					  (back & 0x8000) == (b & 0x8000),
				  "nan 0x%04x -> 0x%04x", b, back);
		} else {
			CHECK_MSG(f == r && !!signbit(f) == !!signbit(r), "decode 0x%04x", b);
			CHECK_MSG(back == b, "0x%04x -> 0x%04x", b, back);
		}
		if (test_cur_failed > 10)
			return;
	}
	/* Every midpoint between adjacent finite positive bfloats. */
	for (uint32_t b = 0; b < 0x7f80; b++) {
		uint32_t mid = (b << 16) | 0x8000;
		uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
		CHECK_MSG(quant_fp32_to_bf16(u2f(mid)) == even, "tie at 0x%08x", mid);
		CHECK_MSG(quant_fp32_to_bf16(u2f(mid + 1)) == b + 1, "above 0x%08x", mid);
		CHECK_MSG(quant_fp32_to_bf16(u2f(mid - 1)) == b, "below 0x%08x", mid);
		CHECK_MSG(quant_fp32_to_bf16(u2f(mid | 0x80000000u)) == (even | 0x8000), "neg tie 0x%08x",
			  mid);
		if (test_cur_failed > 10)
			return;
	}
	CHECK_EQ_INT(quant_fp32_to_bf16(1.0f), 0x3f80);
	CHECK_EQ_INT(quant_fp32_to_bf16(-2.0f), 0xc000);
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x3f808000u)), 0x3f80); /* tie -> even */
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x3f818000u)), 0x3f82); /* tie -> even */
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x3f808001u)), 0x3f81);
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x7f7f7fffu)), 0x7f7f);
	CHECK_EQ_INT(quant_fp32_to_bf16(INFINITY), 0x7f80);
	CHECK_EQ_INT(quant_fp32_to_bf16(-INFINITY), 0xff80);
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x00000001u)), 0x0000); /* tiny subnormal */
	CHECK_EQ_INT(quant_fp32_to_bf16(u2f(0x80018000u)), 0x8002);
	uint16_t qn = quant_fp32_to_bf16(u2f(0x7f800001u)); /* signalling, low payload */
	CHECK_MSG((qn & 0x7f80) == 0x7f80 && (qn & 0x7f), "nan -> 0x%04x", qn);
}

/* ---- known-answer vectors ------------------------------------------------------- */

static void test_q8_0_known_answer(void)
{
	/* Dequantize: d = 0.5 (0x3800). */
	static const uint8_t blk[34] = {
		0x00, 0x38, 0x01, 0xff, 0x7f, 0x80, 0x00, 0x02, 0xfe, 0x40, 0xc0, 0x10,
		0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f, 0x11, 0x13, 0x15, 0x17, 0x19,
		0x1b, 0x1d, 0x1f, 0x21, 0x23, 0x25, 0x27, 0x29, 0x2b, 0x81,
	};
	static const float want[32] = {
		0.5f, -0.5f, 63.5f, -64.0f, 0.0f, 1.0f, -1.0f, 32.0f, -32.0f, 8.0f, 1.5f,
		2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f, 8.5f, 9.5f, 10.5f, 11.5f, 12.5f,
		13.5f, 14.5f, 15.5f, 16.5f, 17.5f, 18.5f, 19.5f, 20.5f, 21.5f, -63.5f,
	};
	float y[32];
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_Q8_0, blk, y, 32));
	for (int j = 0; j < 32; j++)
		CHECK_MSG(y[j] == want[j], "elem %d: %g, expected %g", j, y[j], want[j]);

	/* Subnormal scale 2^-24 (0x0001), q = 127 and -128. */
	uint8_t sub[34] = { 0x01, 0x00, 0x7f, 0x80 };
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_Q8_0, sub, y, 32));
	CHECK(y[0] == 127.0f * 0x1p-24f && y[1] == -128.0f * 0x1p-24f && y[2] == 0.0f);

	/* Quantize: amax = 127 makes d = 1 exactly; roundf() rounds halves
	 * away from zero. */
	static const float x[32] = {
		127.0f, -127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49f, -1.51f, 0.0f, 100.2f, -64.7f,
		126.5f, 3.0f, 0.25f, -0.75f, 50.5f, 8, 9, 10, 11, 12, 13, 14, 15,
		16, 17, 18, 19, 20, 21, 22, -23,
	};
	static const int8_t q[32] = {
		127, -127, 3, -3, 1, -1, 1, -2, 0, 100, -65, 127, 3, 0, -1, 51,
		8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, -23,
	};
	uint8_t out[34];
	quant_quantize_row_q8_0_ref(x, out, 32);
	CHECK(out[0] == 0x00 && out[1] == 0x3c);
	for (int j = 0; j < 32; j++)
		CHECK_MSG((int8_t)out[2 + j] == q[j], "q[%d] = %d, expected %d", j,
			  (int8_t)out[2 + j], q[j]);

	/* amax = 63.5: d = 0.5 (0x3800), 1/d = 2. */
	float x2[32] = { 63.5f, 0.25f, -0.75f, -63.5f, 0.2f };
	quant_quantize_row_q8_0_ref(x2, out, 32);
	CHECK(out[0] == 0x00 && out[1] == 0x38);
	CHECK((int8_t)out[2] == 127 && (int8_t)out[3] == 1 && (int8_t)out[4] == -2);
	CHECK((int8_t)out[5] == -127 && (int8_t)out[6] == 0 && (int8_t)out[7] == 0);

	/* All zeros: d = 0 and 1/d is taken as 0, so no NaN anywhere. */
	float z[64] = { 0 };
	uint8_t out2[68];
	memset(out2, 0x55, sizeof(out2));
	quant_quantize_row_q8_0_ref(z, out2, 64);
	for (int j = 0; j < 68; j++)
		CHECK_MSG(out2[j] == 0, "byte %d = 0x%02x", j, out2[j]);
}

static void test_q4_0_known_answer(void)
{
	/* max = -8 (largest |x|, negative) so d = 1 and q = min(15, trunc(x + 8.5)). */
	float x[32] = {
		-8.0f, 7.0f, 7.6f, 0.0f, 0.5f, -0.5f, 0.49f, -3.2f,
		1.5f, -1.5f, 3.7f, -7.9f, 2.0f, -2.0f, 6.5f, -6.5f,
	};
	for (int i = 0; i < 16; i++)
		x[16 + i] = (float)(i - 8) + 0.25f; /* -> q = i */
	static const uint8_t want[18] = {
		0x00, 0x3c, 0x00, 0x1f, 0x2f, 0x38, 0x49, 0x58, 0x68,
		0x75, 0x8a, 0x97, 0xac, 0xb0, 0xca, 0xd6, 0xef, 0xf2,
	};
	uint8_t out[18];
	quant_quantize_row_q4_0_ref(x, out, 32);
	for (int j = 0; j < 18; j++)
		CHECK_MSG(out[j] == want[j], "byte %d = 0x%02x, expected 0x%02x", j, out[j],
			  want[j]);

	/* ...and back: d * (q - 8). */
	static const float deq[32] = {
		-8, 7, 7, 0, 1, 0, 0, -3, 2, -1, 4, -8, 2, -2, 7, -6,
		-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7,
	};
	float y[32];
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_Q4_0, want, y, 32));
	for (int j = 0; j < 32; j++)
		CHECK_MSG(y[j] == deq[j], "elem %d: %g, expected %g", j, y[j], deq[j]);

	/* max = +4 (positive): d = -0.5 (0xb800), 1/d = -2. */
	float x2[32] = {
		4.0f, -4.0f, 1.0f, -1.0f, 0.25f, -0.25f, 0.0f, 3.5f,
		-3.5f, 0.3f, -0.3f, 2.0f, -2.0f, 3.9f, -3.9f, 1.75f,
	};
	static const uint8_t want2[18] = {
		0x00, 0xb8, 0x80, 0x8f, 0x86, 0x8a, 0x88, 0x89, 0x88,
		0x81, 0x8f, 0x87, 0x89, 0x84, 0x8c, 0x80, 0x8f, 0x85,
	};
	quant_quantize_row_q4_0_ref(x2, out, 32);
	for (int j = 0; j < 18; j++)
		CHECK_MSG(out[j] == want2[j], "byte %d = 0x%02x, expected 0x%02x", j, out[j],
			  want2[j]);

	/* Dequantize with d = 2 (0x4000): 0x9f -> lo 7*2, hi 1*2. */
	uint8_t blk[18] = { 0x00, 0x40, 0x9f, 0x0f, 0xf0 };
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_Q4_0, blk, y, 32));
	CHECK(y[0] == 14.0f && y[16] == 2.0f);
	CHECK(y[1] == 14.0f && y[17] == -16.0f);
	CHECK(y[2] == -16.0f && y[18] == 14.0f);
	CHECK(y[3] == -16.0f && y[19] == -16.0f); /* zero bytes: q = 0 -> -8 */

	/* All zeros: every q = 8 (the zero code) and d = 0 / -8 = -0, stored as
	 * 0x8000 -- ggml writes the same bytes. */
	float z[32] = { 0 };
	quant_quantize_row_q4_0_ref(z, out, 32);
	CHECK(out[0] == 0x00 && out[1] == 0x80);
	for (int j = 2; j < 18; j++)
		CHECK_MSG(out[j] == 0x88, "byte %d = 0x%02x", j, out[j]);
}

/* vec_dot on hand-made blocks with results worked out by hand. */
static void test_vec_dot_known_answer(void)
{
	const struct kern_ops *g = &kern_generic_ops;
	uint8_t w8[68], a8[68], w4[36];
	float s = -1;

	/* Q8_0: d_w = 0.5, q_w = 2; d_a = 0.25, q_a = 3: 32 * 0.5*0.25*6 = 24/block. */
	for (int b = 0; b < 2; b++) {
		w8[34 * b] = 0x00, w8[34 * b + 1] = 0x38;
		a8[34 * b] = 0x00, a8[34 * b + 1] = 0x34;
		memset(w8 + 34 * b + 2, 2, 32);
		memset(a8 + 34 * b + 2, 3, 32);
	}
	g->t[ENGINE_DTYPE_Q8_0].vec_dot(64, &s, w8, a8);
	CHECK_NEAR(s, 48.0, 0.0);

	/* Q4_0: d = 2, bytes 0x9f: lo = +7, hi = +1. Activation d = 1, q = 1 for
	 * j < 16 and -2 for j >= 16: 2 * (16*7 - 16*2) = 160 per block. */
	for (int b = 0; b < 2; b++) {
		w4[18 * b] = 0x00, w4[18 * b + 1] = 0x40;
		memset(w4 + 18 * b + 2, 0x9f, 16);
		a8[34 * b] = 0x00, a8[34 * b + 1] = 0x3c;
		memset(a8 + 34 * b + 2, 1, 16);
		memset(a8 + 34 * b + 18, 0xfe, 16);
	}
	a8[34 + 1] = 0xbc; /* second block: d_a = -1 */
	g->t[ENGINE_DTYPE_Q4_0].vec_dot(64, &s, w4, a8);
	CHECK_NEAR(s, 0.0, 0.0);
	g->t[ENGINE_DTYPE_Q4_0].vec_dot(32, &s, w4, a8);
	CHECK_NEAR(s, 160.0, 0.0);

	/* F16 weights 1.5 (0x3e00) and -0.25 (0xb400) against 2, 4: 3 - 1 = 2. */
	uint8_t wh[4] = { 0x00, 0x3e, 0x00, 0xb4 };
	float a2[2] = { 2.0f, 4.0f };
	g->t[ENGINE_DTYPE_F16].vec_dot(2, &s, wh, a2);
	CHECK_NEAR(s, 2.0, 0.0);
	/* BF16 1.5 (0x3fc0) and -0.25 (0xbe80). */
	uint8_t wb[4] = { 0xc0, 0x3f, 0x80, 0xbe };
	g->t[ENGINE_DTYPE_BF16].vec_dot(2, &s, wb, a2);
	CHECK_NEAR(s, 2.0, 0.0);
}

/* ---- quantization error bounds ---------------------------------------------------
 *
 * Q8_0 (block amax A): d = A/127 in f32, q = roundf(x * (1/d)), |q| <= 127, and
 * the file stores d_h = fp16(d). Then
 *     |x - d_h q| <= |x - d q| + |q| |d - d_h| <= d/2 + 127 |d - d_h|,
 * with |d - d_h| <= 2^-11 d for a normal half (2^-25 absolute when subnormal),
 * so about A/254 + A/2048 ~= A/226. A few f32 ulps of A cover the rounding of
 * x * (1/d); we allow 1e-6 A.
 *
 * Q4_0 (signed element of largest magnitude M, A = |M|): d = M / -8, t = x/d in
 * [-8, 8], q = min(15, trunc(t + 8.5)), x' = d_h (q - 8). When t < 7.5 the
 * truncation rounds t to the nearest integer, so |x - d(q-8)| <= |d|/2 = A/16.
 * When t >= 7.5 (only elements of the sign opposite to M, with |x| >= 15A/16)
 * the code clamps at 15, q - 8 = 7, and the error is up to |d| = A/8. The fp16
 * rounding of d adds |q - 8| |d - d_h| <= 8 |d - d_h| (<= A/2048 when normal).
 */

static double q8_0_bound(double amax, double d_h, int q)
{
	double d = amax / 127.0;
	return d / 2 + fabs((double)q) * fabs(d - d_h) + 1e-6 * amax;
}

/* Check quantized Q8_0 bytes y (from x) against the bound; returns failures. */
static int check_q8_0_bound(const float *x, const uint8_t *y, int64_t n, const char *what)
{
	int bad = 0;
	for (int64_t b = 0; b < n / 32; b++) {
		const uint8_t *blk = y + 34 * b;
		double amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmax(amax, fabs((double)x[32 * b + j]));
		double d = amax / 127.0, d_h = ref_f16(kt_rd16(blk));
		/* The stored scale is d correctly rounded to half. */
		double ulp = d_h >= ldexp(1, -14) ? ldexp(d_h, -10) : ldexp(1, -24);
		if (!(fabs(d - d_h) <= ulp / 2 * (1 + 1e-6)) || signbit(d_h)) {
			if (bad++ < 5)
				fprintf(stderr, "  %s: block %lld: d %.9g stored as %.9g\n", what,
					(long long)b, d, d_h);
		}
		for (int j = 0; j < 32; j++) {
			int q = (int8_t)blk[2 + j];
			double xv = x[32 * b + j], err = fabs(xv - d_h * q);
			double bound = q8_0_bound(amax, d_h, q);
			if (!(err <= bound) || q < -127) {
				if (bad++ < 5)
					fprintf(stderr,
						"  %s: block %lld elem %d: x %.9g q %d d %.9g "
						"err %.3g > %.3g\n",
						what, (long long)b, j, xv, q, d_h, err, bound);
			}
		}
	}
	return bad;
}

static int check_q4_0_bound(const float *x, const uint8_t *y, int64_t n, const char *what)
{
	int bad = 0;
	for (int64_t b = 0; b < n / 32; b++) {
		const uint8_t *blk = y + 18 * b;
		double amax = 0, max = 0;
		for (int j = 0; j < 32; j++) {
			if (amax < fabs((double)x[32 * b + j])) {
				amax = fabs((double)x[32 * b + j]);
				max = x[32 * b + j];
			}
		}
		double d = max / -8.0, d_h = ref_f16(kt_rd16(blk));
		double ulp = fabs(d_h) >= ldexp(1, -14) ? ldexp(fabs(d_h), -10) : ldexp(1, -24);
		if (!(fabs(d - d_h) <= ulp / 2 * (1 + 1e-6))) {
			if (bad++ < 5)
				fprintf(stderr, "  %s: block %lld: d %.9g stored as %.9g\n", what,
					(long long)b, d, d_h);
		}
		for (int j = 0; j < 32; j++) {
			int nib = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
			double xv = x[32 * b + j];
			double t = d != 0 ? xv / d : 0;
			double c = t >= 7.5 - 1e-4 ? 1.0 : 0.5;
			double bound = c * fabs(d) + 8 * fabs(d - d_h) + 1e-6 * amax;
			double err = fabs(xv - d_h * (nib - 8));
			if (!(err <= bound)) {
				if (bad++ < 5)
					fprintf(stderr,
						"  %s: block %lld elem %d: x %.9g q %d d %.9g "
						"err %.3g > %.3g\n",
						what, (long long)b, j, xv, nib, d_h, err, bound);
			}
		}
	}
	return bad;
}

/* Test inputs: gaussian blocks with per-block scales over many decades, the
 * occasional all-zero block, exact ties and (when huge != 0) one huge element.
 * The largest usable magnitude is bounded by the f16 scale: 65504 * 127 for
 * Q8_0, 65504 * 8 for Q4_0; beyond that d overflows to inf (as in ggml). */
static void fill_input(float *x, int64_t n, float huge)
{
	for (int64_t b = 0; b < n / 32; b++) {
		double scale = exp(rng_unif(-9, 9));
		int kind = (int)(kt_rng_u64() % 8);
		for (int j = 0; j < 32; j++) {
			float v;
			switch (kind) {
			case 0:
				v = 0.0f;
				break;
			case 1: /* ties for q8_0: amax 127 -> d 1, x = k + 0.5 */
				v = j == 0 ? 127.0f
					   : (float)((int)(kt_rng_u64() % 200) - 100) + 0.5f;
				break;
			case 2: /* subnormal-half scales */
				v = (float)(rng_normal() * 1e-5);
				break;
			default:
				v = (float)(rng_normal() * scale);
			}
			x[32 * b + j] = v;
		}
	}
	if (huge != 0 && n > 0)
		x[kt_rng_u64() % (uint64_t)n] = huge;
}

static void test_q8_0_roundtrip_bound(void)
{
	static const int64_t sizes[] = { 32, 64, 4096, 32 * 33 };
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		int64_t n = sizes[si];
		float *x = kt_xmalloc((size_t)n * sizeof(float));
		uint8_t *y = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q8_0, n));
		for (int rep = 0; rep < 20; rep++) {
			fill_input(x, n, (rep & 1) ? 1e6f : 0.0f);
			CHECK_OK(quant_quantize_row(ENGINE_DTYPE_Q8_0, x, y, n));
			CHECK_EQ_INT(check_q8_0_bound(x, y, n, "q8_0"), 0);
		}
		free(x);
		free(y);
	}
}

/* In each block, set the neighbour of the largest element to about minus it:
 * its t = x/d is just under 8, so it hits the clamp at 15. */
static void put_opposite_max(float *x, int64_t n)
{
	for (int64_t b = 0; b < n / 32; b++) {
		float *xb = x + 32 * b;
		int k = 0;
		for (int j = 1; j < 32; j++)
			if (fabsf(xb[j]) > fabsf(xb[k]))
				k = j;
		xb[(k + 1) % 32] = -xb[k] * 0.99999f;
	}
}

static void test_q4_0_roundtrip_bound(void)
{
	static const int64_t sizes[] = { 32, 64, 4096, 32 * 33 };
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		int64_t n = sizes[si];
		float *x = kt_xmalloc((size_t)n * sizeof(float));
		uint8_t *y = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q4_0, n));
		for (int rep = 0; rep < 20; rep++) {
			fill_input(x, n, (rep & 1) ? -4e5f : 0.0f);
			/* Put the far side of the range in some blocks: x = -max. */
			if (rep % 3 == 0)
				put_opposite_max(x, n);
			CHECK_OK(quant_quantize_row(ENGINE_DTYPE_Q4_0, x, y, n));
			CHECK_EQ_INT(check_q4_0_bound(x, y, n, "q4_0"), 0);
		}
		free(x);
		free(y);
	}
}

/* measured rms / max: Q4_1 .078/.065, Q5_0 .043/.056, Q5_1 .038/.031,
 * Q2_K .297/.331, Q3_K .150/.197, Q4_K .072/.072, Q5_K .036/.047,
 * Q6_K .018/.016, IQ4_NL .076/.083, IQ4_XS .077/.086 */
#define RT_Q4_1 0.10, 0.085
#define RT_Q5_0 0.055, 0.072
#define RT_Q5_1 0.050, 0.041
#define RT_Q2_K 0.39, 0.43
#define RT_Q3_K 0.195, 0.26
#define RT_Q4_K 0.093, 0.094
#define RT_Q5_K 0.047, 0.061
#define RT_Q6_K 0.023, 0.021
#define RT_IQ4_NL 0.10, 0.11
#define RT_IQ4_XS 0.10, 0.11
/* ---- the other quantizers: error budgets --------------------------------------- */

/* quantize -> dequantize per type on spans of 256 Gaussian values with a
 * random scale per span: the RMS of the relative squared error per span, and
 * the largest |error| over the span's largest |x|. Budgets are the measured
 * values rounded up by about 1.3x (K-quant searches trade a somewhat larger
 * worst case for a smaller RMS error): they catch a broken scale search or
 * bit layout, not a last-digit change. Q8_1 / Q8_K have exact bounds below. */
static const struct {
	uint32_t type;
	double rel_rms, max_rel;
} rt_budget[] = {
	{ ENGINE_DTYPE_Q4_1, RT_Q4_1 },	    { ENGINE_DTYPE_Q5_0, RT_Q5_0 },
	{ ENGINE_DTYPE_Q5_1, RT_Q5_1 },	    { ENGINE_DTYPE_Q2_K, RT_Q2_K },
	{ ENGINE_DTYPE_Q3_K, RT_Q3_K },	    { ENGINE_DTYPE_Q4_K, RT_Q4_K },
	{ ENGINE_DTYPE_Q5_K, RT_Q5_K },	    { ENGINE_DTYPE_Q6_K, RT_Q6_K },
	{ ENGINE_DTYPE_IQ4_NL, RT_IQ4_NL }, { ENGINE_DTYPE_IQ4_XS, RT_IQ4_XS },
};

static void test_roundtrip_budget(void)
{
	const int64_t n = 256 * 16;
	float *x = kt_xmalloc((size_t)n * sizeof(float));
	uint8_t *y = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q8_K, n));
	double *r = kt_xmalloc((size_t)n * sizeof(double));
	for (size_t ti = 0; ti < sizeof(rt_budget) / sizeof(rt_budget[0]); ti++) {
		uint32_t type = rt_budget[ti].type;
		double sum_rel = 0, worst = 0;
		int spans = 0;
		for (int rep = 0; rep < 8; rep++) {
			for (int64_t b = 0; b < n / 256; b++) {
				double sc = exp(rng_unif(-6, 6));
				for (int j = 0; j < 256; j++)
					x[256 * b + j] = (float)(rng_normal() * sc);
			}
			CHECK_OK(quant_quantize_row(type, x, y, n));
			ref_decode(type, y, n, r);
			for (int64_t b = 0; b < n / 256; b++, spans++) {
				double amax = 0, emax = 0, ss = 0, ee = 0;
				for (int j = 0; j < 256; j++) {
					double xv = x[256 * b + j], e = r[256 * b + j] - xv;
					amax = fmax(amax, fabs(xv));
					emax = fmax(emax, fabs(e));
					ss += xv * xv;
					ee += e * e;
				}
				sum_rel += ee / ss;
				worst = fmax(worst, emax / amax);
			}
		}
		double rms = sqrt(sum_rel / spans);
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "%-7s rel rms %.5f, max %.5f\n", quant_dtype_name(type), rms,
				worst);
		CHECK_MSG(rms <= rt_budget[ti].rel_rms, "%s: relative rms error %.5f > %.5f",
			  quant_dtype_name(type), rms, rt_budget[ti].rel_rms);
		CHECK_MSG(worst <= rt_budget[ti].max_rel, "%s: max error %.5f of amax > %.5f",
			  quant_dtype_name(type), worst, rt_budget[ti].max_rel);
		/* Zeros stay zeros, with no NaN anywhere. */
		memset(x, 0, (size_t)n * sizeof(float));
		CHECK_OK(quant_quantize_row(type, x, y, n));
		ref_decode(type, y, n, r);
		int bad = 0;
		for (int64_t i = 0; i < n; i++)
			bad += r[i] != 0;
		CHECK_MSG(!bad, "%s: %d non-zero elements from zeros", quant_dtype_name(type), bad);
	}
	free(x);
	free(y);
	free(r);
}

/* Q8_K (§2.4): the element of largest |x| maps to -127 exactly, d = 1/iscale
 * may be negative, every |q| <= 127, bsums are the sums of 16, and the error
 * is at most |d|/2 (plus the float rounding of iscale * x). Q8_1: Q8_0's
 * rules plus s = fp16(d * sum q). */
static void test_act_quantizers(void)
{
	const int64_t n = 256 * 8;
	float *x = kt_xmalloc((size_t)n * sizeof(float));
	uint8_t *y = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q8_K, n));
	double *r = kt_xmalloc((size_t)n * sizeof(double));
	for (int rep = 0; rep < 10; rep++) {
		fill_input(x, n, (rep & 1) ? -1e6f : 0.0f);
		CHECK_OK(quant_quantize_row(ENGINE_DTYPE_Q8_K, x, y, n));
		ref_decode(ENGINE_DTYPE_Q8_K, y, n, r);
		int bad = 0;
		for (int64_t b = 0; b < n / 256; b++) {
			const uint8_t *blk = y + 292 * b;
			float d;
			memcpy(&d, blk, 4);
			int k = 0;
			for (int j = 1; j < 256; j++)
				if (fabsf(x[256 * b + j]) > fabsf(x[256 * b + k]))
					k = j;
			if (x[256 * b + k] == 0) {
				for (int j = 0; j < 292; j++)
					bad += blk[j] != 0;
				continue;
			}
			bad += (int8_t)blk[4 + k] != -127;
			bad += (d < 0) != (x[256 * b + k] > 0);
			for (int i = 0; i < 16; i++) {
				int sum = 0;
				for (int j = 0; j < 16; j++)
					sum += (int8_t)blk[4 + 16 * i + j];
				bad += (int16_t)kt_rd16(blk + 260 + 2 * i) != sum;
			}
			for (int j = 0; j < 256; j++) {
				double e = fabs(r[256 * b + j] - x[256 * b + j]);
				double lim = fabs(d) * 0.5 * (1 + 1e-5);
				lim += 1e-6 * fabs(x[256 * b + k]);
				bad += !(e <= lim);
				bad += (int8_t)blk[4 + j] == -128;
			}
		}
		CHECK_MSG(!bad, "q8_K: %d violations", bad);

		CHECK_OK(quant_quantize_row(ENGINE_DTYPE_Q8_1, x, y, n));
		uint8_t *q8 = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q8_0, n));
		quant_quantize_row_q8_0_ref(x, q8, n);
		bad = 0;
		for (int64_t b = 0; b < n / 32; b++) {
			const uint8_t *blk = y + 36 * b, *ref = q8 + 34 * b;
			int sum = 0;
			float amax = 0;
			bad += kt_rd16(blk) != kt_rd16(ref) || memcmp(blk + 4, ref + 2, 32) != 0;
			for (int j = 0; j < 32; j++) {
				sum += (int8_t)blk[4 + j];
				amax = fmaxf(amax, fabsf(x[32 * b + j]));
			}
			/* s uses the float scale, before its rounding to f16. */
			bad += kt_rd16(blk + 2) != quant_fp32_to_fp16((float)sum * (amax / 127.0f));
		}
		CHECK_MSG(!bad, "q8_1: %d blocks differ from Q8_0 + s", bad);
		free(q8);
	}
	free(x);
	free(y);
	free(r);
}

/* ---- known answers for the new layouts (bytes written by hand) ------------------- */

static void check_elems(uint32_t type, const uint8_t *blk, int n, const int *idx,
			const float *want, int count)
{
	float *y = kt_xmalloc((size_t)n * sizeof(float));
	CHECK_OK(quant_dequantize_row(type, blk, y, n));
	for (int i = 0; i < count; i++)
		CHECK_MSG(y[idx[i]] == want[i], "%s elem %d: %g, expected %g", quant_dtype_name(type),
			  idx[i], y[idx[i]], want[i]);
	free(y);
}

static void test_kquant_known_answer(void)
{
	uint8_t b[292];

	/* Q4_K: d = 1 (0x3c00), dmin = 0.5 (0x3800); sc0..3 = 1..4 with
	 * bits 6-7 of byte 0 = 01 (so sc4 gets 16 + 1), m0..3 = 5..8, bytes
	 * 8..11 = low nibbles sc4..7 = 1,3,5,7 / m4..7 = 2,4,6,8. qs[i] =
	 * (i % 16) | (15 - i % 16) << 4. */
	memset(b, 0, sizeof(b));
	b[0] = 0x00, b[1] = 0x3c, b[2] = 0x00, b[3] = 0x38;
	const uint8_t sc4[12] = { 1 | 0x40, 2, 3, 4, 5, 6, 7, 8, 0x21, 0x43, 0x65, 0x87 };
	memcpy(b + 4, sc4, 12);
	for (int i = 0; i < 128; i++)
		b[16 + i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
	/* e 0: sb 0, qs[0] low = 0 -> 1*1*0 - 0.5*5; e 33: sb 1, qs[1] high = 14
	 * -> 2*14 - 3; e 130: sb 4, qs[66] low = 2 -> 17*2 - 0.5*2; e 200: sb 6,
	 * qs[104] low = 8 -> 5*8 - 3; e 255: sb 7, qs[127] high = 0 -> -4. */
	static const int i4[] = { 0, 33, 130, 200, 255 };
	static const float w4[] = { -2.5f, 25.0f, 33.0f, 37.0f, -4.0f };
	check_elems(ENGINE_DTYPE_Q4_K, b, 256, i4, w4, 5);

	/* Q5_K: the same fields plus qh[32] (at 16) before qs (at 48): qh[1]
	 * bit 1 adds 16 to e 33, qh[8] bit 6 to e 200. */
	uint8_t b5[176] = { 0 };
	memcpy(b5, b, 16);
	memcpy(b5 + 48, b + 16, 128);
	b5[16 + 1] = 0x02, b5[16 + 8] = 0x40;
	static const float w5[] = { -2.5f, 57.0f, 33.0f, 117.0f, -4.0f };
	check_elems(ENGINE_DTYPE_Q5_K, b5, 256, i4, w5, 5);

	/* Q6_K: ql (0), qh (128), scales (192), d (208) = 0.25 (0x3400).
	 * e 0: ql[0] low 0x3, qh[0] bits 0-1 = 2 -> q = 35 - 32 = 3, scale 2:
	 * 1.5. e 100: h 0, k 3, l 4: ql[36] high = 0xa, qh[4] bits 6-7 = 1 ->
	 * 26 - 32 = -6, scales[6] = -4: 6. e 255: h 1, k 3, l 31: ql[127]
	 * high = 0xf, qh[95] bits 6-7 = 3 -> 31, scales[15] = -128: -992. */
	uint8_t b6[210] = { 0 };
	b6[0] = 0x03, b6[128] = 0x02;
	b6[36] = 0xa0, b6[128 + 4] = 0x40;
	b6[127] = 0xf0, b6[128 + 63] = 0xc0;
	b6[192] = 2, b6[192 + 6] = (uint8_t)-4, b6[192 + 15] = 0x80;
	b6[208] = 0x00, b6[209] = 0x34;
	static const int i6[] = { 0, 100, 255, 1 };
	static const float w6[] = { 1.5f, 6.0f, -992.0f, -16.0f };
	check_elems(ENGINE_DTYPE_Q6_K, b6, 256, i6, w6, 4);

	/* Q3_K: hmask (0), qs (32), scales (96), d (108) = 1. Scale 0: low
	 * nibble of scales[0] = 0x1, high bits (scales[8] bits 0-1) = 2 ->
	 * 33 - 32 = 1; scale 9: high nibble of scales[1] = 0xf, scales[9]
	 * bits 4-5 = 0 -> 15 - 32 = -17. e 0: q2 = qs[0] & 3 = 3, hmask[0]
	 * bit 0 set -> 7 - 4 = 3 -> 3. e 150: i 9, h 1, g 0, l 22: q2 =
	 * qs[54] & 3 = 1, hmask[22] bit 4 clear -> 1 - 4 = -3 -> 51. */
	uint8_t b3[110] = { 0 };
	b3[32] = 0x03, b3[0] = 0x01;
	b3[32 + 54] = 0x01;
	b3[96] = 0x01, b3[96 + 8] = 0x02, b3[96 + 1] = 0xf0;
	b3[108] = 0x00, b3[109] = 0x3c;
	static const int i3[] = { 0, 150, 1 };
	static const float w3[] = { 3.0f, 51.0f, -4.0f };
	check_elems(ENGINE_DTYPE_Q3_K, b3, 256, i3, w3, 3);

	/* Q2_K: scales (0), qs (16), d (80) = 1, dmin (82) = 2. scales[0] =
	 * 0x13 (sc 3, m 1); scales[10] = 0x20 (sc 0, m 2). e 0: qs[0] & 3 = 2
	 * -> 6 - 2 = 4; e 161: h 1, g 1, l 1: (qs[33] >> 2) & 3 = 3, sb16 10
	 * -> 0 - 4 = -4. */
	uint8_t b2[84] = { 0 };
	b2[0] = 0x13, b2[10] = 0x20;
	b2[16] = 0x02, b2[16 + 33] = 0x0c;
	b2[80] = 0x00, b2[81] = 0x3c, b2[82] = 0x00, b2[83] = 0x40;
	static const int i2[] = { 0, 161, 1 };
	static const float w2[] = { 4.0f, -4.0f, -2.0f };
	check_elems(ENGINE_DTYPE_Q2_K, b2, 256, i2, w2, 3);

	/* IQ4_XS: d (0) = 0.5, scales_h (2) = 0x0002 (sub-block 0 high bits
	 * 2), scales_l[0] = 0x01 (sub-block 0 low 1 -> ls 33 -> 1; sub-block 1
	 * low 0, high 0 -> ls 0 -> -32). qs[0] = 0xf0: e 0 K[0] = -127, e 16
	 * K[15] = 113; qs[16] = 0x08: e 32 K[8] = 1 -> -16. */
	uint8_t bx[136] = { 0 };
	bx[0] = 0x00, bx[1] = 0x38, bx[2] = 0x02, bx[4] = 0x01;
	bx[8] = 0xf0, bx[8 + 16] = 0x08;
	static const int ix[] = { 0, 16, 32 };
	static const float wx[] = { -63.5f, 56.5f, -16.0f };
	check_elems(ENGINE_DTYPE_IQ4_XS, bx, 256, ix, wx, 3);

	/* Q5_0: d = 1, qh = bit 0 and bit 17, qs[0] = 0x21, qs[1] = 0x00:
	 * e 0 = (1 | 16) - 16 = 1, e 16 = 2 - 16 = -14, e 17 = (0 | 16) - 16
	 * = 0, e 1 = -16. Q5_1 with m = -1: e 0 = 17 - 1 = 16. */
	uint8_t q5[24] = { 0x00, 0x3c, 0x01, 0x00, 0x02, 0x00, 0x21 };
	static const int i50[] = { 0, 16, 17, 1 };
	static const float w50[] = { 1.0f, -14.0f, 0.0f, -16.0f };
	check_elems(ENGINE_DTYPE_Q5_0, q5, 32, i50, w50, 4);
	uint8_t q51[24] = { 0x00, 0x3c, 0x00, 0xbc, 0x01, 0x00, 0x02, 0x00, 0x21 };
	static const float w51[] = { 16.0f, 1.0f, 15.0f, -1.0f };
	check_elems(ENGINE_DTYPE_Q5_1, q51, 32, i50, w51, 4);

	/* Q6_K / Q4_K quantizer on a ramp: every byte reproduced by decoding
	 * is within the budget, and a constant block is exact. */
	float cst[256];
	for (int j = 0; j < 256; j++)
		cst[j] = -3.0f;
	CHECK_OK(quant_quantize_row(ENGINE_DTYPE_Q6_K, cst, b, 256));
	float yy[256];
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_Q6_K, b, yy, 256));
	CHECK_MSG(fabsf(yy[7] + 3.0f) <= 3.0f * 0x1p-10f, "Q6_K constant: %g", yy[7]);
}

/* quant_quantize_row / quant_dequantize_row dispatch for the float types and errors. */
static void test_row_dispatch(void)
{
	float x[64], y[64];
	uint8_t buf[256];
	for (int i = 0; i < 64; i++)
		x[i] = (float)(rng_normal() * 1000);

	CHECK_OK(quant_quantize_row(ENGINE_DTYPE_F32, x, buf, 64));
	CHECK(memcmp(buf, x, sizeof(x)) == 0);
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_F32, buf, y, 64));
	CHECK(memcmp(y, x, sizeof(x)) == 0);

	CHECK_OK(quant_quantize_row(ENGINE_DTYPE_F16, x, buf, 63));
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_F16, buf, y, 63));
	for (int i = 0; i < 63; i++) {
		CHECK(kt_rd16(buf + 2 * i) == quant_fp32_to_fp16(x[i]));
		CHECK(y[i] == ref_f16(kt_rd16(buf + 2 * i)));
		/* nearest half: relative error <= 2^-11 */
		CHECK(fabs(y[i] - x[i]) <= ldexp(fabs(x[i]), -11));
	}
	CHECK_OK(quant_quantize_row(ENGINE_DTYPE_BF16, x, buf, 63));
	CHECK_OK(quant_dequantize_row(ENGINE_DTYPE_BF16, buf, y, 63));
	for (int i = 0; i < 63; i++) {
		CHECK(y[i] == ref_bf16(kt_rd16(buf + 2 * i)));
		CHECK(fabs(y[i] - x[i]) <= ldexp(fabs(x[i]), -8));
	}

	/* Types without (de)quantizers, bad lengths, removed ids. */
	CHECK(quant_quantize_row(ENGINE_DTYPE_IQ2_XXS, x, buf, 256) < 0);
	CHECK(quant_dequantize_row(ENGINE_DTYPE_TQ1_0, buf, y, 256) < 0);
	CHECK(quant_quantize_row(ENGINE_DTYPE_Q4_K, x, buf, 32) < 0);
	CHECK(quant_quantize_row(ENGINE_DTYPE_Q8_0, x, buf, 33) < 0);
	CHECK(quant_dequantize_row(ENGINE_DTYPE_Q4_0, buf, y, 48) < 0);
	CHECK(quant_dequantize_row(4, buf, y, 32) < 0);
	CHECK(quant_dequantize_row(1000, buf, y, 32) < 0);
	CHECK(quant_quantize_row(ENGINE_DTYPE_F16, x, buf, -1) < 0);
	CHECK_OK(quant_quantize_row(ENGINE_DTYPE_Q8_0, x, buf, 0));
}

/* ---- variants ------------------------------------------------------------------- */

/* The variant under test; the generic table is the oracle for cross-checks. */
static const struct kern_ops *V;
static const char *V_name;

enum wmode { W_RANDOM, W_ZERO, W_ZERO_SCALE, W_MAX_POS, W_MAX_NEG, W_MAX_MIX, W_COUNT };
static const char *const wmode_names[W_COUNT] = { "random", "zero", "zero-scale",
						  "max+", "max-", "max-mixed" };

/* Weight bytes of `type` built directly (not through our quantizers). */
static void make_weight(uint32_t type, int64_t n, enum wmode m, uint8_t *w)
{
	size_t bytes = ref_bytes(type, n);
	if (m == W_ZERO) {
		memset(w, 0, bytes);
		return;
	}
	switch (type) {
	case ENGINE_DTYPE_F32:
		for (int64_t i = 0; i < n; i++) {
			float v = m == W_RANDOM || m == W_ZERO_SCALE ? (float)rng_normal()
				  : m == W_MAX_POS			 ? 3e18f
				  : m == W_MAX_NEG			 ? -3e18f
				  : (i & 1)				 ? 3e18f
									 : -2.9e18f;
			memcpy(w + 4 * i, &v, 4);
		}
		break;
	case ENGINE_DTYPE_F16:
	case ENGINE_DTYPE_BF16:
		for (int64_t i = 0; i < n; i++) {
			uint16_t h;
			if (type == ENGINE_DTYPE_F16) {
				h = m == W_MAX_POS ? 0x7bff
				    : m == W_MAX_NEG ? 0xfbff
				    : m == W_MAX_MIX ? ((i & 1) ? 0x7bff : 0xfbfe)
						     : (uint16_t)(kt_rng_u64() & 0xffff);
				if ((h & 0x7c00) == 0x7c00) /* no inf/nan */
					h &= 0xbfff;
			} else {
				h = m == W_MAX_POS ? 0x5e80 /* 2^62 */
				    : m == W_MAX_NEG ? 0xde80
				    : m == W_MAX_MIX ? ((i & 1) ? 0x5e80 : 0xde7f)
						     : (uint16_t)(((kt_rng_u64() % 60 + 97) << 7) |
								  (kt_rng_u64() & 0x807f));
			}
			w[2 * i] = (uint8_t)h;
			w[2 * i + 1] = (uint8_t)(h >> 8);
		}
		break;
	case ENGINE_DTYPE_Q8_0:
	case ENGINE_DTYPE_Q4_0: {
		int q8 = type == ENGINE_DTYPE_Q8_0;
		size_t bs = q8 ? 34 : 18, nq = q8 ? 32 : 16;
		for (int64_t b = 0; b < n / 32; b++) {
			uint8_t *blk = w + bs * b;
			uint16_t d = m == W_ZERO_SCALE ? 0
				     : m == W_RANDOM   ? rand_half(1, 22, 1)
				     : (b & 1)	       ? 0xfbff
							: 0x7bff; /* -+65504 */
			blk[0] = (uint8_t)d;
			blk[1] = (uint8_t)(d >> 8);
			for (size_t j = 0; j < nq; j++) {
				uint8_t v;
				if (m == W_RANDOM || m == W_ZERO_SCALE)
					v = (uint8_t)kt_rng_u64(); /* includes q8 -128 */
				else if (m == W_MAX_POS)
					v = q8 ? 0x7f : 0xff; /* +127 / +7 */
				else if (m == W_MAX_NEG)
					v = q8 ? 0x80 : 0x00; /* -128 / -8 */
				else
					v = q8 ? ((j & 1) ? 0x81 : 0x7f) : ((j & 1) ? 0x0f : 0xf0);
				blk[2 + j] = v;
			}
		}
		break;
	}
	default: {
		/* Any other block format: every byte random (or all-ones / zero /
		 * alternating for the extreme modes), then the f16 scales set as
		 * for Q8_0. Random bytes include every scale, min and code. */
		int blck, bs;
		ref_block(type, &blck, &bs);
		for (int64_t b = 0; b < n / blck; b++) {
			uint8_t *blk = w + (size_t)bs * b;
			for (int j = 0; j < bs; j++)
				blk[j] = m == W_RANDOM || m == W_ZERO_SCALE ? (uint8_t)kt_rng_u64()
					 : m == W_MAX_POS		   ? 0xff
					 : m == W_MAX_NEG		   ? 0x00
					 : (j & 1)			   ? 0xf0
									   : 0x0f;
			for (const int *f = half_fields(type); *f >= 0; f++) {
				uint16_t d = m == W_ZERO_SCALE ? 0
					     : m == W_RANDOM   ? rand_half(1, 22, 1)
					     : (b & 1)	       ? 0xfbff
								: 0x7bff;
				blk[*f] = (uint8_t)d;
				blk[*f + 1] = (uint8_t)(d >> 8);
			}
		}
		break;
	}
	}
}

enum amode { A_QUANT, A_ZERO, A_ZERO_SCALE, A_MAX_POS, A_MAX_NEG, A_HUGE, A_COUNT };
static const char *const amode_names[A_COUNT] = { "quantized", "zero", "zero-scale",
						  "max+", "max-", "one-huge" };

/* Activation bytes in layout act_type. A_QUANT and A_HUGE go through the
 * variant's activation quantizer; the others are written directly (|q| <= 127,
 * as every quantizer produces). */
static void make_act(uint32_t act_type, int64_t n, enum amode m, float *x, uint8_t *a)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(rng_normal() * exp(rng_unif(-3, 3)));
	/* Q8_1's s = fp16(d * sum q) overflows to inf once a block's sum passes
	 * 65504 (a limit of the format, as in ggml): its extremes stay below. */
	const bool q81 = act_type == ENGINE_DTYPE_Q8_1;
	if (m == A_HUGE)
		x[kt_rng_u64() % (uint64_t)n] = q81 ? -6e4f : -1e6f;
	if (m == A_QUANT || m == A_HUGE || act_type != ENGINE_DTYPE_Q8_0) {
		if (act_type != ENGINE_DTYPE_Q8_0 && m != A_QUANT && m != A_HUGE) {
			float big = q81 ? 2047.0f : 65504.0f;
			float v = m == A_MAX_POS ? big : m == A_MAX_NEG ? -big : 0.0f;
			for (int64_t i = 0; i < n; i++)
				x[i] = v;
		}
		V->quant_act[act_type](x, a, n);
		return;
	}
	for (int64_t b = 0; b < n / 32; b++) {
		uint8_t *blk = a + 34 * b;
		uint16_t d = m == A_ZERO || m == A_ZERO_SCALE ? 0
			     : (b % 3 == 2)		      ? 0xfbff
							      : 0x7bff;
		blk[0] = (uint8_t)d;
		blk[1] = (uint8_t)(d >> 8);
		for (int j = 0; j < 32; j++) {
			int q = m == A_ZERO	       ? 0
				: m == A_ZERO_SCALE ? (int)(kt_rng_u64() % 255) - 127
				: m == A_MAX_POS    ? 127
						    : -127;
			blk[2 + j] = (uint8_t)(int8_t)q;
		}
	}
}

/* Compare one vec_dot against the f64 dot of the decoded operands.
 *
 * Tolerances, with S = sum |w_i a_i| and u = 2^-24:
 * - integer formats: each block's int32 sum is exact; d_w*d_a and the product
 *   with the sum round twice, and the nb-term float accumulation adds at
 *   most nb*u*S, so |s - ref| <= (nb + 2) u S. We allow 2 u per term (any
 *   summation order, fused or not) -- about 1.5e-5 S at n = 4096;
 * - float formats, generic: the double sum is off by at most n 2^-53 S, then
 *   one rounding to float: u |ref| + n 2^-53 S;
 * - float formats, other variants (f32 accumulation in any order): (n + 2) u S.
 */
static void check_dot(uint32_t type, int64_t n, const uint8_t *w, const uint8_t *a,
		      const char *label)
{
	const struct kern_type_ops *to = &V->t[type];
	double *dw = kt_xmalloc((size_t)n * sizeof(double));
	double *da = kt_xmalloc((size_t)n * sizeof(double));
	double *mw = kt_xmalloc((size_t)n * sizeof(double));
	ref_decode2(type, w, n, dw, mw);
	ref_decode(to->act_type, a, n, da);
	double ref = 0, S = 0, Sm = 0;
	for (int64_t i = 0; i < n; i++) {
		ref += dw[i] * da[i];
		S += fabs(dw[i] * da[i]);
		Sm += mw[i] * fabs(da[i]);
	}
	double tol;
	const double u = 0x1p-24;
	int blck, bsz;
	ref_block(type, &blck, &bsz);
	if (blck > 1) {
		/* Per block: exact integer sums, then a handful of roundings
		 * (d_w d_a, int -> float, the product, a min term, the sum),
		 * each relative to the scale or min part (Sm >= S). */
		tol = 2 * (double)(n / blck + 4) * u * Sm;
	} else if (V == &kern_generic_ops)
		tol = u * fabs(ref) + (double)n * 0x1p-53 * S;
	else
		tol = (double)(n + 2) * u * S;
	tol += 1e-37; /* denormal noise when S == 0 */
	if (to->act_type == ENGINE_DTYPE_Q8_1) {
		/* Q4_1/Q5_1 use the activation's s = fp16(d sum q) for the min
		 * term: its rounding is part of the format, so it is allowed
		 * exactly, block by block. */
		for (int64_t b = 0; b < n / 32; b++) {
			const uint8_t *ab = a + 36 * b;
			double d = ref_f16(kt_rd16(ab)), sh = ref_f16(kt_rd16(ab + 2)), sq = 0;
			for (int j = 0; j < 32; j++)
				sq += (int8_t)ab[4 + j];
			int wbs = type == ENGINE_DTYPE_Q4_1 ? 20 : 24;
			double mwt = ref_f16(kt_rd16(w + wbs * b + 2));
			tol += fabs(mwt) * fabs(sh - d * sq) * (1 + 4 * u);
		}
	}

	float s = NAN;
	to->vec_dot(n, &s, w, a);
	CHECK_MSG(fabs(s - ref) <= tol, "%s %s n=%lld %s: %.9g vs f64 %.9g (tol %.3g)", V_name,
		  quant_dtype_name(type), (long long)n, label, s, ref, tol);
	if (S == 0)
		CHECK_MSG(s == 0, "%s %s %s: %g, expected exactly 0", V_name, quant_dtype_name(type),
			  label, s);

	/* Same inputs through the oracle, when it reads the same layout. */
	const struct kern_type_ops *go = &kern_generic_ops.t[type];
	if (V != &kern_generic_ops && go->act_type == to->act_type) {
		float sg = NAN;
		go->vec_dot(n, &sg, w, a);
		CHECK_MSG(fabs(s - sg) <= 2 * tol, "%s %s n=%lld %s: %.9g vs generic %.9g", V_name,
			  quant_dtype_name(type), (long long)n, label, s, sg);
	}
	free(dw);
	free(da);
	free(mw);
}

static const uint32_t wtypes[] = {
	ENGINE_DTYPE_F32,  ENGINE_DTYPE_F16,  ENGINE_DTYPE_BF16,   ENGINE_DTYPE_Q8_0,
	ENGINE_DTYPE_Q4_0, ENGINE_DTYPE_Q4_1, ENGINE_DTYPE_Q5_0,   ENGINE_DTYPE_Q5_1,
	ENGINE_DTYPE_Q2_K, ENGINE_DTYPE_Q3_K, ENGINE_DTYPE_Q4_K,   ENGINE_DTYPE_Q5_K,
	ENGINE_DTYPE_Q6_K, ENGINE_DTYPE_IQ4_NL, ENGINE_DTYPE_IQ4_XS,
};

/* The activation layout each weight type pairs with (§2.6). */
static uint32_t want_act(uint32_t type)
{
	switch (type) {
	case ENGINE_DTYPE_F32:
	case ENGINE_DTYPE_F16:
	case ENGINE_DTYPE_BF16:
		return ENGINE_DTYPE_F32;
	case ENGINE_DTYPE_Q4_1:
	case ENGINE_DTYPE_Q5_1:
		return ENGINE_DTYPE_Q8_1;
	case ENGINE_DTYPE_Q2_K:
	case ENGINE_DTYPE_Q3_K:
	case ENGINE_DTYPE_Q4_K:
	case ENGINE_DTYPE_Q5_K:
	case ENGINE_DTYPE_Q6_K:
	case ENGINE_DTYPE_IQ4_XS:
		return ENGINE_DTYPE_Q8_K;
	default:
		return ENGINE_DTYPE_Q8_0;
	}
}

static void test_variant_table(void)
{
	CHECK(V->name && *V->name);
	for (size_t ti = 0; ti < sizeof(wtypes) / sizeof(wtypes[0]); ti++) {
		const struct kern_type_ops *to = &V->t[wtypes[ti]];
		CHECK_MSG(to->vec_dot && to->dequant, "%s: %s missing", V_name,
			  quant_dtype_name(wtypes[ti]));
		CHECK_MSG(to->act_type < ENGINE_DTYPE_COUNT && V->quant_act[to->act_type],
			  "%s: %s: no quantizer for act type %u", V_name, quant_dtype_name(wtypes[ti]),
			  to->act_type);
	}
	for (size_t ti = 0; ti < sizeof(wtypes) / sizeof(wtypes[0]); ti++)
		CHECK_MSG(V->t[wtypes[ti]].act_type == want_act(wtypes[ti]), "%s: %s act type %u",
			  V_name, quant_dtype_name(wtypes[ti]), V->t[wtypes[ti]].act_type);
	CHECK(V->dot_f32 && V->axpy_f32);
}

static void test_variant_dequant(void)
{
	static const int64_t sizes[] = { 32, 64, 4096, 32 * 33 };
	for (size_t ti = 0; ti < sizeof(wtypes) / sizeof(wtypes[0]); ti++) {
		uint32_t type = wtypes[ti];
		int blck, bsz;
		ref_block(type, &blck, &bsz);
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			/* K-quants: 256, 512, 4096 and 256 * 33 elements. */
			int64_t n = blck == 256 ? sizes[si] * 8 : sizes[si];
			uint8_t *w = kt_xmalloc(ref_bytes(type, n));
			float *y = kt_xmalloc((size_t)n * sizeof(float));
			double *r = kt_xmalloc((size_t)n * sizeof(double));
			for (int m = 0; m < W_COUNT; m++) {
				make_weight(type, n, (enum wmode)m, w);
				ref_decode(type, w, n, r);
				V->t[type].dequant(w, y, n);
				int bad = 0;
				/* d * q is exact in f32 for the 32-blocks; K-quants
				 * round d * scale * q (and the min) in float, within
				 * a few units of the scale and min parts. */
				double *mg = kt_xmalloc((size_t)n * sizeof(double));
				ref_decode2(type, w, n, r, mg);
				for (int64_t i = 0; i < n; i++) {
					double t = blck == 256 ? 3 * 0x1p-24 * mg[i] : 0;
					if (type == ENGINE_DTYPE_Q4_1 || type == ENGINE_DTYPE_Q5_1)
						t = 0x1p-24 * mg[i];
					bad += !(fabs((double)y[i] - r[i]) <= t);
				}
				free(mg);
				CHECK_MSG(!bad, "%s %s n=%lld %s: %d elements differ", V_name,
					  quant_dtype_name(type), (long long)n, wmode_names[m], bad);
			}
			free(w);
			free(y);
			free(r);
		}
	}
}

static void test_variant_vec_dot(void)
{
	static const int64_t qsizes[] = { 32, 64, 4096, 32 * 33 };
	static const int64_t fsizes[] = { 1, 3, 31, 32, 33, 64, 1000, 4096, 32 * 33 };
	for (size_t ti = 0; ti < sizeof(wtypes) / sizeof(wtypes[0]); ti++) {
		uint32_t type = wtypes[ti];
		static const int64_t ksizes[] = { 256, 512, 4096, 256 * 5 };
		int blck, bsz;
		ref_block(type, &blck, &bsz);
		bool quant = blck > 1;
		const int64_t *sizes = blck == 256 ? ksizes : quant ? qsizes : fsizes;
		size_t nsizes = quant ? 4 : sizeof(fsizes) / sizeof(fsizes[0]);
		uint32_t at = V->t[type].act_type;
		for (size_t si = 0; si < nsizes; si++) {
			int64_t n = sizes[si];
			uint8_t *w = kt_xmalloc(ref_bytes(type, n));
			uint8_t *a = kt_xmalloc(ref_bytes(at, n) + 64);
			float *x = kt_xmalloc((size_t)n * sizeof(float));
			for (int wm = 0; wm < W_COUNT; wm++) {
				for (int am = 0; am < A_COUNT; am++) {
					int reps = wm == W_RANDOM && am == A_QUANT ? 8 : 1;
					for (int r = 0; r < reps; r++) {
						char label[64];
						make_weight(type, n, (enum wmode)wm, w);
						make_act(at, n, (enum amode)am, x, a);
						snprintf(label, sizeof(label), "w %s, a %s",
							 wmode_names[wm], amode_names[am]);
						check_dot(type, n, w, a, label);
					}
				}
			}
			free(w);
			free(a);
			free(x);
		}
		if (test_cur_failed > 20)
			return;
	}
}

/* The x16 repacked layout: pack then unpack restores any bytes; where the
 * variant has gemm_x16, it equals the scalar reference kern_gemm_x16_ref()
 * bit for bit (kern.h: the same operation sequence), for 2 panels, every
 * token count from 1 to 17, and each token alone gives what it gives
 * in its batch. The reference itself is held to vec_dot's bound in
 * test_kern_simd.c; here, on the scalar variant, to the generic vec_dot
 * within 1e-5 relative of the row's absolute sum. K-segments (kern.h,
 * the accumulators start from s): the row's blocks cut in two, each part
 * packed as panels of its own and run one after the other into the same
 * output, give the whole row's result bit for bit, in the reference and
 * in every variant's kernel. */
/* The rows' first k elements packed as panels of their own, the rest as
 * others (each part a matrix with rows of its own length, kern.h's
 * K-segments), run one after the other into one output (poisoned first:
 * the first part must not read it, the second continues from it) by the
 * reference and by the variant's gemm_x16: each gives `whole` (the
 * reference over the whole rows) bit for bit. */
static void check_x16_segments(uint32_t type, int64_t n, int64_t k, const uint8_t *w,
			       size_t wrs, const uint8_t *a, size_t ars, const float *aux,
			       size_t al, int nr, int nt, const float *whole)
{
	uint32_t at = V->t[type].act_type;
	int64_t len[2] = { k, n - k };
	size_t wo[2] = { 0, ref_bytes(type, k) }, ao[2] = { 0, ref_bytes(at, k) };
	size_t xo[2] = { 0, kern_act_aux_len(at, k) };
	uint8_t *seg[2];
	for (int s = 0; s < 2; s++) {
		size_t srs = ref_bytes(type, len[s]);
		seg[s] = kt_xmalloc(srs * (size_t)nr);
		for (int p = 0; p < nr / KERN_X16_ROWS; p++)
			kern_x16_pack(type, w + (size_t)p * KERN_X16_ROWS * wrs + wo[s], wrs,
				      len[s], seg[s] + (size_t)p * KERN_X16_ROWS * srs);
	}
	float *got = kt_xmalloc(sizeof(float) * (size_t)nr * (size_t)nt);
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1 && !V->t[type].gemm_x16)
			break;
		for (int i = 0; i < nr * nt; i++)
			got[i] = -12345.678f;
		for (int s = 0; s < 2; s++) {
			size_t srs = ref_bytes(type, len[s]);
			const float *x = aux ? aux + xo[s] : NULL;
			if (pass == 0)
				kern_gemm_x16_ref(type, len[s], nr, nt, seg[s], srs, a + ao[s],
						  ars, x, al, got, (size_t)nr, s > 0);
			else
				V->t[type].gemm_x16(len[s], nr, nt, seg[s], srs, a + ao[s], ars, x,
						    al, got, (size_t)nr, s > 0);
		}
		CHECK_MSG(memcmp(got, whole, sizeof(float) * (size_t)nr * (size_t)nt) == 0,
			  "%s %s %s: n %lld cut at %lld differs from the whole rows", V_name,
			  pass ? "gemm_x16" : "x16 reference", quant_dtype_name(type), (long long)n,
			  (long long)k);
	}
	free(seg[0]);
	free(seg[1]);
	free(got);
}

static void test_variant_x16(void)
{
	static const uint32_t types[] = { ENGINE_DTYPE_Q4_0, ENGINE_DTYPE_Q8_0,   ENGINE_DTYPE_Q4_K,
					  ENGINE_DTYPE_Q6_K, ENGINE_DTYPE_Q4_1,   ENGINE_DTYPE_Q5_0,
					  ENGINE_DTYPE_Q5_1, ENGINE_DTYPE_IQ4_NL, ENGINE_DTYPE_Q5_K,
					  ENGINE_DTYPE_IQ4_XS, ENGINE_DTYPE_Q3_K,   ENGINE_DTYPE_Q2_K };
	/* three panels: avx512vnni's Q8_0 pairs two of them from
	 * X16_PAIR_MIN_NT (64) tokens on, the third runs alone */
	enum { NR = 48, NT = 130 };
	static const int nts[] = { 1,  2,  3,  4,  5,  6,  7,  8,   9,   10,  11, 12,
				   13, 14, 15, 16, 17, 31, 63, 64, 65, 127, 128, 130 };
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		uint32_t type = types[ti], at = V->t[type].act_type;
		CHECK(kern_x16_supported(type));
		int blck, bsz;
		ref_block(type, &blck, &bsz);
		/* blocks go in pairs (kern.h): one lone block, a pair and an
		 * odd last block, two pairs */
		static const int nbs[] = { 1, 3, 4 };
		for (size_t ni = 0; ni < sizeof(nbs) / sizeof(nbs[0]); ni++) {
			int64_t n = (int64_t)nbs[ni] * blck;
			size_t wrs = ref_bytes(type, n), ars = ref_bytes(at, n);
			size_t al = kern_act_aux_len(at, n);
			uint8_t *w = kt_xmalloc(wrs * NR), *panel = kt_xmalloc(wrs * NR);
			uint8_t *back = kt_xmalloc(wrs * NR);
			uint8_t *a = kt_xmalloc(ars * NT + 64);
			float *x = kt_xmalloc((size_t)n * sizeof(float));
			float *aux = kt_xmalloc((al ? al : 1) * NT * sizeof(float));
			float *ref = kt_xmalloc(sizeof(float) * NR * NT);
			float *got = kt_xmalloc(sizeof(float) * NR * NT);
			for (int r = 0; r < NR; r++)
				make_weight(type, n, r % 5 == 4 ? W_MAX_MIX : W_RANDOM, w + r * wrs);
			for (int t = 0; t < NT; t++) {
				make_act(at, n, t % 4 == 3 ? A_MAX_NEG : A_QUANT, x, a + t * ars);
				if (al)
					kern_act_aux(at, a + t * ars, n, aux + t * al);
			}
			for (int p = 0; p < NR / KERN_X16_ROWS; p++)
				kern_x16_pack(type, w + p * KERN_X16_ROWS * wrs, wrs, n,
					      panel + p * KERN_X16_ROWS * wrs);
			for (int p = 0; p < NR / KERN_X16_ROWS; p++)
				kern_x16_unpack(type, panel + p * KERN_X16_ROWS * wrs, n,
						back + p * KERN_X16_ROWS * wrs, wrs);
			CHECK_MSG(memcmp(w, back, wrs * NR) == 0, "%s x16 pack/unpack n %lld",
				  quant_dtype_name(type), (long long)n);
			for (int i = 0; i < NR * NT; i++)
				ref[i] = -12345.678f;
			kern_gemm_x16_ref(type, n, NR, NT, panel, wrs, a, ars, al ? aux : NULL, al,
					  ref, NR, false);
			for (int cut = 1; cut < nbs[ni]; cut++)
				check_x16_segments(type, n, cut * blck, w, wrs, a, ars,
						   al ? aux : NULL, al, NR, NT, ref);
			if (!V->t[type].gemm_x16) {
				/* the reference against the generic row dot: the same
				 * value for the K-quants (it is that dot), the same up
				 * to float order (1e-4 of the largest output) for the
				 * 32-element formats, whose reference uses fma */
				bool k = blck == 256;
				double big = 0;
				float *d = kt_xmalloc(sizeof(float) * NR * NT);
				for (int t = 0; t < NT; t++)
					for (int r = 0; r < NR; r++) {
						kern_generic_ops.t[type].vec_dot(
							n, &d[t * NR + r], w + r * wrs, a + t * ars);
						if (fabs((double)d[t * NR + r]) > big)
							big = fabs((double)d[t * NR + r]);
					}
				for (int i = 0; i < NR * NT; i++)
					CHECK_MSG(k ? memcmp(&d[i], &ref[i], sizeof(float)) == 0
						    : fabs((double)d[i] - ref[i]) <= 1e-4 * big,
						  "%s x16 reference n %lld [%d]: %.9g vs vec_dot %.9g",
						  quant_dtype_name(type), (long long)n, i, ref[i], d[i]);
				free(d);
			} else {
				/* every token count 1..17, so that every remainder of
				 * every tile size runs, and the counts around 64 and
				 * 128; the output is poisoned first, so a token left
				 * unwritten cannot pass on the last run's value */
				for (size_t k = 0; k < sizeof(nts) / sizeof(nts[0]); k++) {
					int nt = nts[k];
					for (int i = 0; i < NR * NT; i++)
						got[i] = -12345.678f;
					V->t[type].gemm_x16(n, NR, nt, panel, wrs, a, ars, al ? aux : NULL,
							    al, got, NR, false);
					CHECK_MSG(memcmp(got, ref, sizeof(float) * NR * nt) == 0,
						  "%s %s gemm_x16 n %lld nt %d differs from the reference",
						  V_name, quant_dtype_name(type), (long long)n, nt);
				}
			}
			free(w);
			free(panel);
			free(back);
			free(a);
			free(x);
			free(aux);
			free(ref);
			free(got);
		}
	}
}

/* Activation quantizers: the bound above, and against the oracle. SIMD
 * variants may round ties to even where the reference uses roundf(), so they
 * may differ from it by one step, never in the scale. */
static void test_variant_quant_act(void)
{
	static const int64_t sizes[] = { 32, 64, 4096, 32 * 33 };
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		int64_t n = sizes[si];
		float *x = kt_xmalloc((size_t)n * sizeof(float));
		uint8_t *a = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q8_0, n));
		uint8_t *g = kt_xmalloc(ref_bytes(ENGINE_DTYPE_Q8_0, n));
		for (int rep = 0; rep < 10; rep++) {
			fill_input(x, n, (rep & 1) ? 1e6f : 0.0f);
			V->quant_act[ENGINE_DTYPE_Q8_0](x, a, n);
			CHECK_EQ_INT(check_q8_0_bound(x, a, n, V_name), 0);
			quant_quantize_row_q8_0_ref(x, g, n);
			int bad = 0;
			for (int64_t b = 0; b < n / 32; b++) {
				bad += kt_rd16(a + 34 * b) != kt_rd16(g + 34 * b);
				for (int j = 0; j < 32; j++)
					bad += abs((int8_t)a[34 * b + 2 + j] -
						   (int8_t)g[34 * b + 2 + j]) > 1;
			}
			CHECK_MSG(!bad, "%s: %d differences from the reference", V_name, bad);
		}
		/* One huge element: only its block gets the big scale. */
		for (int64_t i = 0; i < n; i++)
			x[i] = (float)rng_normal();
		x[n - 1] = 1e6f;
		V->quant_act[ENGINE_DTYPE_Q8_0](x, a, n);
		CHECK_EQ_INT(check_q8_0_bound(x, a, n, V_name), 0);
		double d_last = ref_f16(kt_rd16(a + 34 * (n / 32 - 1)));
		CHECK_NEAR(d_last, 1e6 / 127, 1e6 / 127 * 0x1p-11);
		CHECK_EQ_INT((int8_t)a[34 * (n / 32 - 1) + 33], 127);
		if (n > 32)
			CHECK(ref_f16(kt_rd16(a)) < 1.0);

		/* Every other converter (F16 rows, Q8_K, ...) and every fused
		 * one: the generic bytes, and kern_act_aux()'s floats, bit for
		 * bit. Inputs with ties of both signs at the largest magnitude
		 * (Q8_K keeps the first) and random ones. */
		for (uint32_t at = 0; at < ENGINE_DTYPE_COUNT; at++) {
			const struct kern_ops *G = &kern_generic_ops;
			if (at == ENGINE_DTYPE_F32 || !V->quant_act[at] || !G->quant_act[at] ||
			    n % quant_dtype_get(at)->blck)
				continue;
			size_t rs = kern_act_row_size(at, n), al = kern_act_aux_len(at, n);
			uint8_t *r = kt_xcalloc(rs), *q = kt_xcalloc(rs);
			float *ra = kt_xcalloc(al * sizeof(float) + 1), *qa = kt_xcalloc(al * sizeof(float) + 1);
			for (int rep = 0; rep < 4; rep++) {
				for (int64_t i = 0; i < n; i++)
					x[i] = rep % 2 ? (float)((int)(kt_rng_u64() % 5) - 2) * 0.5f
						       : (float)rng_normal() * (rep ? 1e3f : 1.0f);
				G->quant_act[at](x, r, n);
				V->quant_act[at](x, q, n);
				CHECK_MSG(memcmp(r, q, rs) == 0, "%s: %s activations, n %lld, rep %d",
					  V_name, quant_dtype_name(at), (long long)n, rep);
				if (V->quant_act_aux[at] && al) {
					memset(q, 0x5a, rs);
					kern_act_aux(at, r, n, ra);
					V->quant_act_aux[at](x, q, n, qa);
					CHECK_MSG(memcmp(r, q, rs) == 0 &&
						  memcmp(ra, qa, al * sizeof(float)) == 0,
						  "%s: fused %s activations, n %lld, rep %d", V_name,
						  quant_dtype_name(at), (long long)n, rep);
				}
			}
			free(r);
			free(q);
			free(ra);
			free(qa);
		}

		/* F32 activations are a plain copy. */
		uint32_t ft = V->t[ENGINE_DTYPE_F32].act_type;
		if (ft == ENGINE_DTYPE_F32) {
			float *c = kt_xmalloc((size_t)n * sizeof(float));
			V->quant_act[ENGINE_DTYPE_F32](x, c, n);
			CHECK(memcmp(c, x, (size_t)n * sizeof(float)) == 0);
			free(c);
		}
		free(x);
		free(a);
		free(g);
	}
}

static void test_variant_f32_helpers(void)
{
	static const int64_t sizes[] = { 0, 1, 7, 31, 64, 1000, 4096 };
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		int64_t n = sizes[si];
		float *a = kt_xmalloc((size_t)(n + 1) * sizeof(float));
		float *b = kt_xmalloc((size_t)(n + 1) * sizeof(float));
		float *y = kt_xmalloc((size_t)(n + 1) * sizeof(float));
		double ref = 0, S = 0;
		for (int64_t i = 0; i < n; i++) {
			a[i] = (float)rng_normal();
			b[i] = (float)(rng_normal() * 100);
			ref += (double)a[i] * b[i];
			S += fabs((double)a[i] * b[i]);
		}
		float s = V->dot_f32(n, a, b);
		CHECK_MSG(fabs(s - ref) <= (double)(n + 2) * 0x1p-24 * S, "%s dot_f32 n=%lld",
			  V_name, (long long)n);
		if (V == &kern_generic_ops)
			CHECK(fabs(s - ref) <= 0x1p-24 * fabs(ref) + (double)n * 0x1p-53 * S);

		/* axpy: each y_i + alpha x_i rounded once (or fused): <= 1 ulp-ish. */
		float alpha = -1.75f;
		for (int64_t i = 0; i < n; i++)
			y[i] = (float)rng_normal();
		y[n] = 12345.0f; /* must stay untouched */
		float *y0 = kt_xmalloc((size_t)(n + 1) * sizeof(float));
		memcpy(y0, y, (size_t)(n + 1) * sizeof(float));
		V->axpy_f32(n, alpha, a, y);
		int bad = 0;
		for (int64_t i = 0; i < n; i++) {
			double e = (double)y0[i] + (double)alpha * a[i];
			bad += !(fabs(y[i] - e) <= 0x1p-23 * (fabs(y0[i]) + fabs(alpha * a[i])));
		}
		CHECK_MSG(!bad, "%s axpy n=%lld: %d bad", V_name, (long long)n, bad);
		CHECK(y[n] == 12345.0f);

		/* silu_mul: against x / (1 + exp(-x)) * u in double, over the
		 * whole float range of x (exp saturating at both ends) */
		for (int64_t i = 0; i < n; i++) {
			a[i] = (float)(rng_normal() * (i % 7 == 6 ? 60.0 : 4.0));
			b[i] = (float)rng_normal();
		}
		if (n > 3) {
			a[0] = 0.0f;
			a[1] = -200.0f;
			a[2] = 200.0f;
			a[3] = -87.0f;
		}
		memcpy(y, a, (size_t)n * sizeof(float));
		y[n] = 12345.0f;
		V->silu_mul_f32(n, y, b);
		bad = 0;
		for (int64_t i = 0; i < n; i++) {
			double x = a[i], e = x / (1.0 + exp(-x)) * b[i];
			bad += !(fabs(y[i] - e) <= 6e-7 * fabs(e) + 1e-30); /* tiny: denormals */
		}
		CHECK_MSG(!bad, "%s silu_mul n=%lld: %d bad", V_name, (long long)n, bad);
		CHECK(y[n] == 12345.0f);

		/* exp_sum: softmax numerators (arguments <= 0) and their sum */
		float mx = -INFINITY;
		for (int64_t i = 0; i < n; i++)
			mx = a[i] > mx ? a[i] : mx;
		memcpy(y, a, (size_t)n * sizeof(float));
		float got = V->exp_sum_f32(n, y, mx);
		double want = 0;
		bad = 0;
		for (int64_t i = 0; i < n; i++) {
			double e = exp((double)a[i] - mx);
			want += e;
			bad += !(fabs(y[i] - e) <= 6e-7 * e + 1e-30);
		}
		CHECK_MSG(!bad, "%s exp_sum n=%lld: %d bad", V_name, (long long)n, bad);
		CHECK_MSG(fabs(got - want) <= 1e-6 * want * (double)(n + 1) + 1e-30,
			  "%s exp_sum n=%lld: sum %.9g vs %.9g", V_name, (long long)n, got, want);
		CHECK(y[n] == 12345.0f);
		free(a);
		free(b);
		free(y);
		free(y0);
	}
}

/* ---- selection and detection ------------------------------------------------- */

static void test_select(void)
{
	struct cm_cpu_isa caps, none;
	memset(&none, 0, sizeof(none));
	kern_detect_caps(&caps);

	const char *const *names = kern_variant_names();
	CHECK(names && names[0]);
	size_t n = 0;
	while (names && names[n])
		n++;
	CHECK(n >= 1 && strcmp(names[n - 1], "scalar") == 0); /* best first: scalar last */

	CHECK(kern_select(&none, NULL) == &kern_generic_ops);
	CHECK(kern_select(&none, "") == &kern_generic_ops);
	CHECK(kern_select(&none, "auto") == &kern_generic_ops);
	CHECK(kern_select(&caps, "scalar") == &kern_generic_ops);
	CHECK(kern_select(&caps, "generic") == &kern_generic_ops);
	CHECK(kern_select(&caps, "no-such-isa") == NULL);
	CHECK(kern_select(NULL, NULL) != NULL);
	CHECK_STREQ(kern_generic_ops.name, "scalar");

	/* auto = the first listed variant this CPU supports. */
	const struct kern_ops *best = kern_select(&caps, NULL);
	for (size_t i = 0; i < n; i++) {
		const struct kern_ops *o = kern_select(&caps, names[i]);
		if (o) {
			CHECK_MSG(o == best, "auto picked %s, first supported is %s", best->name,
				  names[i]);
			break;
		}
	}
	/* With no caps, every variant but scalar must be refused. */
	for (size_t i = 0; i + 1 < n; i++)
		CHECK_MSG(kern_select(&none, names[i]) == NULL, "%s accepted without caps",
			  names[i]);
#if defined(__x86_64__)
	/* amx needs the process's AMX permission as well as the CPU bits: with
	 * the bits claimed, it is offered exactly when the request succeeds
	 * (here, without AMX, never; on an AMX box the request grants it, and
	 * the variant loop in main then tests the real tile kernels) */
	struct cm_cpu_isa ac = caps;
	ac.amx_tile = ac.amx_int8 = true;
	bool perm = kern_amx_request();
	const struct kern_ops *ao = kern_select(&ac, "amx");
	const struct kern_ops *vn = kern_select(&caps, "avx512vnni");
	if (perm && vn)
		CHECK(ao && strcmp(ao->name, "amx") == 0);
	else
		CHECK_MSG(ao == NULL, "amx offered without the permission (request: %d)", perm);
#endif
}

static void test_detect_caps(void)
{
	struct cm_cpu_isa c;
	memset(&c, 0xff, sizeof(c));
	kern_detect_caps(&c);
#if defined(__x86_64__) && defined(__GNUC__)
	/* The compiler's runtime checks CPUID and XCR0 its own way. */
	__builtin_cpu_init();
	CHECK_EQ_INT(c.avx2, !!__builtin_cpu_supports("avx2"));
	CHECK_EQ_INT(c.fma, !!__builtin_cpu_supports("fma"));
	CHECK_EQ_INT(c.avx512f, !!__builtin_cpu_supports("avx512f"));
	CHECK_EQ_INT(c.avx512bw, !!__builtin_cpu_supports("avx512bw"));
	CHECK_EQ_INT(c.avx512vl, !!__builtin_cpu_supports("avx512vl"));
	CHECK_EQ_INT(c.avx512dq, !!__builtin_cpu_supports("avx512dq"));
	CHECK_EQ_INT(c.avx512vnni, !!__builtin_cpu_supports("avx512vnni"));
	CHECK_EQ_INT(c.avx512bf16, !!__builtin_cpu_supports("avx512bf16"));
	CHECK(!c.neon && !c.dotprod && !c.i8mm);
#else
	CHECK(!c.avx2 && !c.avx512f && !c.amx_tile);
#endif
	/* Implications any sane detection keeps. */
	CHECK(!c.avx512bw || c.avx512f);
	CHECK(!c.avxvnni || c.avx2);
	CHECK(!c.dotprod || c.neon);
	fprintf(stderr,
		"caps: avx2 %d fma %d f16c %d avx512f %d bw %d vl %d dq %d vnni %d bf16 %d "
		"avxvnni %d amx %d/%d/%d neon %d dotprod %d i8mm %d\n",
		c.avx2, c.fma, c.f16c, c.avx512f, c.avx512bw, c.avx512vl, c.avx512dq, c.avx512vnni,
		c.avx512bf16, c.avxvnni, c.amx_tile, c.amx_int8, c.amx_bf16, c.neon, c.dotprod,
		c.i8mm);
}

static void test_act_row_size(void)
{
	CHECK_EQ_INT(kern_act_row_size(ENGINE_DTYPE_F32, 100), 400);
	CHECK_EQ_INT(kern_act_row_size(ENGINE_DTYPE_Q8_0, 4096), 4096 / 32 * 34);
	CHECK_EQ_INT(kern_act_row_size(ENGINE_DTYPE_Q8_0, 33), 0);
	CHECK_EQ_INT(kern_act_row_size(ENGINE_DTYPE_Q8_K, 512), 2 * 292);
	CHECK_EQ_INT(kern_act_row_size(ENGINE_DTYPE_F16, 3), 6);
}

static void run_variant_test(void (*fn)(void), const char *test)
{
	static char name[128];
	snprintf(name, sizeof(name), "%s/%s", V_name, test);
	test_run_one(fn, name);
}

#ifdef KERN_TEST_AMX_EMU
/* The AMX tile kernels (kern_amx.c), built again with the tile
 * instructions in software (tests/module.mk: this box has no AMX), once
 * with every token count through the tiles (AMX_MIN_NT 1) and once as
 * built (avx512vnni's kernel below 16 tokens): in the table they extend,
 * avx512vnni's, they must pass the x16 cases bit for bit like every
 * variant's kernels. The model aborts where the hardware would fault (a
 * tile used unconfigured, shapes that do not fit). */
extern const struct kern_ops kern_amx_emu_ops, kern_amx_emu16_ops;

static void test_amx_emulated_one(const struct cm_cpu_isa *caps, const struct kern_ops *amx,
				  const char *name)
{
	static const uint32_t types[] = { ENGINE_DTYPE_Q4_0, ENGINE_DTYPE_Q8_0 };
	const struct kern_ops *under = kern_select(caps, "avx512vnni");
	if (!under) {
		/* its float finish is AVX-512 code */
		fprintf(stderr, "variant amx (emulated): needs avx512vnni, not tested\n");
		return;
	}
	static struct kern_ops emu;
	emu = *under;
	emu.name = name;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		uint32_t t = types[i];
		CHECK_MSG(amx->t[t].act_type == under->t[t].act_type &&
				  amx->t[t].gemm_x16 != NULL && !amx->t[t].vec_dot,
			  "%s table: %s", name, quant_dtype_name(t));
		emu.t[t].gemm_x16 = amx->t[t].gemm_x16;
	}
	V = &emu;
	V_name = name;
	run_variant_test(test_variant_x16, "x16");
}

static void test_amx_emulated(const struct cm_cpu_isa *caps)
{
	test_amx_emulated_one(caps, &kern_amx_emu_ops, "amx (emulated, tiles from 1 token)");
	test_amx_emulated_one(caps, &kern_amx_emu16_ops, "amx (emulated, as built)");
}
#endif

int main(void)
{
	kt_rng_seed(0x2545f4914f6cdd1dull);
	TEST_RUN(test_fp16_decode_exhaustive);
	TEST_RUN(test_fp16_roundtrip_exhaustive);
	TEST_RUN(test_fp16_rne_midpoints);
	TEST_RUN(test_fp16_known_values);
	TEST_RUN(test_fp16_random_nearest);
	TEST_RUN(test_bf16);
	TEST_RUN(test_q8_0_known_answer);
	TEST_RUN(test_q4_0_known_answer);
	TEST_RUN(test_vec_dot_known_answer);
	TEST_RUN(test_q8_0_roundtrip_bound);
	TEST_RUN(test_q4_0_roundtrip_bound);
	TEST_RUN(test_row_dispatch);
	TEST_RUN(test_roundtrip_budget);
	TEST_RUN(test_act_quantizers);
	TEST_RUN(test_kquant_known_answer);
	TEST_RUN(test_select);
	TEST_RUN(test_detect_caps);
	TEST_RUN(test_act_row_size);

	struct cm_cpu_isa caps;
	kern_detect_caps(&caps);
	for (const char *const *nm = kern_variant_names(); *nm; nm++) {
		V = kern_select(&caps, *nm);
		V_name = *nm;
		if (!V) {
			fprintf(stderr, "variant %s: not supported by this CPU, not tested\n", *nm);
			continue;
		}
		run_variant_test(test_variant_table, "table");
		run_variant_test(test_variant_dequant, "dequant");
		run_variant_test(test_variant_vec_dot, "vec_dot");
		run_variant_test(test_variant_x16, "x16");
		run_variant_test(test_variant_quant_act, "quant_act");
		run_variant_test(test_variant_f32_helpers, "f32_helpers");
	}
#ifdef KERN_TEST_AMX_EMU
	test_amx_emulated(&caps);
#endif
	return test_finish();
}
