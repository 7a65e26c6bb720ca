/* AVX-512 attention over a quantized KV cache (contracts in
 * attn_qkv_fused.h), two entry points on one set of loops:
 * pt_cpu_fused_block_avx512, a 128-key block of the --fused-decode-attn
 * path (online softmax, merged by attn_qkv_fused.c), and
 * pt_cpu_qattn_item_avx512, one (token, KV head) item of the exact path
 * (cpu_attention.c: all keys, the backend's two-pass softmax). What makes
 * them faster than scoring and dequantizing row by row per head:
 *
 *  - GQA heads share every load: a key or value row's codes are widened to
 *    f32 once and multiplied into all G query heads of the group.
 *  - Dequantization is factored out of the inner loops. Scores: per group,
 *    Σ q·x in f32 lanes, then one multiply by the group's scale, and the
 *    bias term bias·Σx added per group after the reduction. Values: with
 *    p_j the softmax weight of key j, Σ_j p_j·(s_jb·q_j + b_jb) =
 *    Σ_j (p_j·s_jb)·q_j + Σ_j p_j·b_jb, so each value lane costs one FMA
 *    per head against a per-(row, group) coefficient, and the bias sums are
 *    added once per block.
 *  - p·V keeps the output of a 32- or 64-lane slice of head_dim in
 *    registers for all G heads across the block's rows (no read-modify-write
 *    of an accumulator row per key, as an axpy does).
 *  - the fused block's exp is a vector polynomial (degree 6 on |r| <= ln2/2, relative error
 *    ~2e-7), not a call per score.
 *
 * 4-bit codes come in bytes of two values (low nibble first): 16 bytes are
 * widened to 32-bit lanes, and `and 15` / `>> 4` give the 16 even and the 16
 * odd values of a 32-value block. Scores use the query pre-permuted the same
 * way; p·V accumulates in that order and un-permutes when it stores.
 *
 * The fused block is not bit-identical to the exact item (online softmax,
 * exp polynomial): the lever is output-changing and gated by
 * tests/test_l3_gate.c and tests/test_kv_fused.c. The exact item sums the
 * products of the plain formula in another order (L2 references held by
 * tests/test_kv_quant.c). Every value depends only on the block or item,
 * never on the thread that computes it. */
#include "backend/cpu/attn_qkv_fused.h"

#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

size_t pt_cpu_fused_block_scratch(int G, int hd, int ng) {
    /* S [G, BLOCK] | coef [BLOCK, G, ng] | bsum [G, ng] | raw [G, hd] */
    return (size_t)G * PT_FUSED_BLOCK + (size_t)PT_FUSED_BLOCK * G * ng + (size_t)G * ng + (size_t)G * hd + 16;
}

INLINE float ld_param(const void *base, int bf, size_t i) {
    return bf ? pt_bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* 16 codes of an 8-bit row as f32 */
INLINE __m512 cvt8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* 16 bytes of a 4-bit row: the 16 even values (lo) and the 16 odd ones (hi) */
INLINE void cvt4(const uint8_t *p, __m512 *lo, __m512 *hi) {
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
}

INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n·ln2, ln2 split in a short high part (exact product) and the rest */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Scores of nb keys (positions p0 ..) for G heads: S[g·lds + j]. */
INLINE void scores(float *S, int64_t lds, const float *qx, const float *qs, const int G, const int bits, int hd, int gs,
                   const pt_kv_layer *kv, int kh, int64_t p0, int64_t nb, float softcap, int bf16) {
    const int ng = hd / gs, pbf = kv->dtype == PT_FT_BF16;
    const int64_t cap = kv->capacity;
    const size_t rb = (size_t)hd * bits / 8; /* code bytes per row */
    const uint8_t *cbase = (const uint8_t *)kv->k + (size_t)kh * cap * rb;
    const size_t pbase = (size_t)kh * cap * ng;
    int64_t slot = p0 % cap;
    for (int64_t j = 0; j < nb; j++, slot = slot + 1 == cap ? 0 : slot + 1) {
        const uint8_t *cr = cbase + (size_t)slot * rb;
        __m512 tot[8];
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) tot[g] = _mm512_setzero_ps();
        for (int b = 0; b < ng; b++) {
            __m512 t[8];
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) t[g] = _mm512_setzero_ps();
            if (bits == 8) {
                for (int i = b * gs; i < (b + 1) * gs; i += 16) {
                    __m512 v = cvt8(cr + i);
#pragma GCC unroll 8
                    for (int g = 0; g < G; g++) t[g] = _mm512_fmadd_ps(v, _mm512_loadu_ps(qx + g * hd + i), t[g]);
                }
            } else {
                for (int i = b * gs; i < (b + 1) * gs; i += 32) {
                    __m512 lo, hi;
                    cvt4(cr + i / 2, &lo, &hi);
#pragma GCC unroll 8
                    for (int g = 0; g < G; g++) {
                        t[g] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(qx + g * hd + i), t[g]);
                        t[g] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(qx + g * hd + i + 16), t[g]);
                    }
                }
            }
            __m512 s = _mm512_set1_ps(ld_param(kv->k_scales, pbf, pbase + (size_t)slot * ng + b));
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) tot[g] = _mm512_fmadd_ps(t[g], s, tot[g]);
        }
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            float r = _mm512_reduce_add_ps(tot[g]);
            for (int b = 0; b < ng; b++) r += ld_param(kv->k_biases, pbf, pbase + (size_t)slot * ng + b) * qs[g * ng + b];
            if (bf16) r = pt_round_bf16(r);
            if (softcap > 0) {
                float c = bf16 ? pt_round_bf16(r / softcap) : r / softcap;
                c = bf16 ? pt_round_bf16(tanhf(c)) : tanhf(c);
                r = bf16 ? pt_round_bf16(c * softcap) : c * softcap;
            }
            S[g * lds + j] = r;
        }
    }
}

/* p·V over nb rows (positions p0 ..) for one slice [c0, c0 + 16·NV) of
 * head_dim, all G heads in registers; coef [nb, G, ng] = p_j·scale_jb.
 * raw [G, hd] holds the running sums without the bias terms, in the codes'
 * order (4-bit: per 32 values the 16 even then the 16 odd ones); first:
 * start from 0 instead of raw. */
INLINE void pv_slice(float *raw, const float *coef, const int G, const int NV, const int bits, int hd, int gs,
                     const uint8_t *cbase, size_t rb, int64_t cap, int64_t p0, int nb, int c0, int first) {
    const int ng = hd / gs;
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            acc[g][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(raw + (size_t)g * hd + c0 + 16 * i);
    int64_t slot = p0 % cap;
    for (int j = 0; j < nb; j++, slot = slot + 1 == cap ? 0 : slot + 1) {
        const uint8_t *cr = cbase + (size_t)slot * rb;
        __m512 v[4];
        if (bits == 8) {
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) v[i] = cvt8(cr + c0 + 16 * i);
        } else {
#pragma GCC unroll 2
            for (int i = 0; i < NV; i += 2) cvt4(cr + (c0 + 16 * i) / 2, &v[i], &v[i + 1]);
        }
        const float *cf = coef + (size_t)j * G * ng;
#pragma GCC unroll 8
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++)
                acc[g][i] = _mm512_fmadd_ps(v[i], _mm512_set1_ps(cf[g * ng + (c0 + 16 * i) / gs]), acc[g][i]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(raw + (size_t)g * hd + c0 + 16 * i, acc[g][i]);
}

/* out[g·ldo + d] = raw + the bias sums bsum [G, ng], in natural order (4-bit:
 * the even / odd halves of each 32 values interleaved back). */
static void pv_finish(float *out, int64_t ldo, const float *raw, const float *bsum, int G, int bits, int hd, int gs) {
    const int ng = hd / gs;
    const __m512i ilo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ihi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int g = 0; g < G; g++) {
        const float *r = raw + (size_t)g * hd;
        float *a = out + (size_t)g * ldo;
        for (int c = 0; c < hd; c += 32) {
            __m512 bb = _mm512_set1_ps(bsum[g * ng + c / gs]);
            __m512 e = _mm512_add_ps(_mm512_loadu_ps(r + c), bb), o = _mm512_add_ps(_mm512_loadu_ps(r + c + 16), bb);
            if (bits == 8) {
                _mm512_storeu_ps(a + c, e);
                _mm512_storeu_ps(a + c + 16, o);
            } else {
                _mm512_storeu_ps(a + c, _mm512_permutex2var_ps(e, ilo, o));
                _mm512_storeu_ps(a + c + 16, _mm512_permutex2var_ps(e, ihi, o));
            }
        }
    }
}

/* coef [nb, G, ng] = p_j·scale_jb for nb rows from position p0 (P [G, ldp]:
 * the weights, row j at P[g·ldp + j]); bsum [G, ng] += Σ_j p_j·bias_jb. */
static void pv_coef(float *coef, float *bsum, const float *P, int64_t ldp, int G, const pt_kv_layer *kv, int kh,
                    int64_t p0, int nb) {
    const int hd = kv->head_dim, ng = hd / kv->group_size, pbf = kv->dtype == PT_FT_BF16;
    const int64_t cap = kv->capacity;
    const size_t pbase = (size_t)kh * cap * ng;
    int64_t slot = p0 % cap;
    for (int j = 0; j < nb; j++, slot = slot + 1 == cap ? 0 : slot + 1) {
        float *cf = coef + (size_t)j * G * ng;
        for (int b = 0; b < ng; b++) {
            float s = ld_param(kv->v_scales, pbf, pbase + (size_t)slot * ng + b),
                  o = ld_param(kv->v_biases, pbf, pbase + (size_t)slot * ng + b);
            for (int g = 0; g < G; g++) {
                float pj = P[(size_t)g * ldp + j];
                cf[g * ng + b] = pj * s;
                bsum[g * ng + b] += pj * o;
            }
        }
    }
}

/* p·V over nb rows from position p0 into raw (see pv_slice), every slice */
INLINE void pv_rows(float *raw, const float *coef, const int G, const int bits, const pt_kv_layer *kv, int kh,
                    int64_t p0, int nb, int first) {
    const int hd = kv->head_dim, gs = kv->group_size;
    const int64_t cap = kv->capacity;
    const size_t rb = (size_t)hd * bits / 8;
    const uint8_t *vbase = (const uint8_t *)kv->v + (size_t)kh * cap * rb;
    if (G <= 4 && hd % 64 == 0)
        for (int c0 = 0; c0 < hd; c0 += 64) pv_slice(raw, coef, G, 4, bits, hd, gs, vbase, rb, cap, p0, nb, c0, first);
    else
        for (int c0 = 0; c0 < hd; c0 += 32) pv_slice(raw, coef, G, 2, bits, hd, gs, vbase, rb, cap, p0, nb, c0, first);
}

INLINE void block(float *part, const float *qx, const float *qs, const int G, const int bits, const pt_kv_layer *kv,
                  int kh, int64_t p0, int nb, float softcap, int bf16, float *scr) {
    const int hd = kv->head_dim, gs = kv->group_size, ng = hd / gs;
    float *S = scr, *coef = S + (size_t)G * PT_FUSED_BLOCK, *bsum = coef + (size_t)PT_FUSED_BLOCK * G * ng,
          *raw = bsum + (size_t)G * ng;
    scores(S, PT_FUSED_BLOCK, qx, qs, G, bits, hd, gs, kv, kh, p0, nb, softcap, bf16);
    /* block max, e^(s - m), sum, per head */
    for (int g = 0; g < G; g++) {
        float *sg = S + (size_t)g * PT_FUSED_BLOCK;
        __m512 vm = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < nb; j += 16) {
            __mmask16 m = nb - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - j)) - 1u);
            vm = _mm512_mask_max_ps(vm, m, vm, _mm512_maskz_loadu_ps(m, sg + j));
        }
        float mx = _mm512_reduce_max_ps(vm);
        __m512 vmx = _mm512_set1_ps(mx), vl = _mm512_setzero_ps();
        for (int j = 0; j < nb; j += 16) {
            __mmask16 m = nb - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - j)) - 1u);
            __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + j), vmx)));
            _mm512_mask_storeu_ps(sg + j, m, e);
            vl = _mm512_add_ps(vl, e);
        }
        float *pg = part + (size_t)g * (2 + hd);
        pg[0] = mx;
        pg[1] = _mm512_reduce_add_ps(vl);
    }
    for (int i = 0; i < G * ng; i++) bsum[i] = 0.0f;
    pv_coef(coef, bsum, S, PT_FUSED_BLOCK, G, kv, kh, p0, nb);
    pv_rows(raw, coef, G, bits, kv, kh, p0, nb, 1);
    pv_finish(part + 2, 2 + hd, raw, bsum, G, bits, hd, gs);
}

/* The exact quantized attention of one (token, KV head) item: scores of n
 * keys from position lo into S [G, n], the two-pass softmax of the backend
 * (softmax_row: probabilities normalized, rounded to bf16 in bf16 mode), then
 * p·V in blocks of PT_FUSED_BLOCK rows into out [G, hd] (unrounded). */
INLINE void exact_item(float *out, const float *qx, const float *qs, const int G, const int bits,
                       const pt_kv_layer *kv, int kh, int64_t lo, int64_t n, float softcap, int bf16,
                       void (*softmax_row)(float *, int64_t, float, int), float *S, float *scr) {
    const int hd = kv->head_dim, gs = kv->group_size, ng = hd / gs;
    float *coef = scr, *bsum = coef + (size_t)PT_FUSED_BLOCK * G * ng, *raw = bsum + (size_t)G * ng;
    scores(S, n, qx, qs, G, bits, hd, gs, kv, kh, lo, n, softcap, bf16);
    for (int g = 0; g < G; g++) softmax_row(S + (size_t)g * n, n, 1.0f, bf16);
    for (int i = 0; i < G * ng; i++) bsum[i] = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += PT_FUSED_BLOCK) {
        int nb = (int)(n - j0 < PT_FUSED_BLOCK ? n - j0 : PT_FUSED_BLOCK);
        pv_coef(coef, bsum, S + j0, n, G, kv, kh, lo + j0, nb);
        pv_rows(raw, coef, G, bits, kv, kh, lo + j0, nb, j0 == 0);
    }
    pv_finish(out, hd, raw, bsum, G, bits, hd, gs);
}

#define CASE_G(n)                                                                                                 \
    case n:                                                                                                       \
        if (kv->bits == 8) block(part, qx, qs, n, 8, kv, kh, p0, nb, softcap, bf16, scr);                          \
        else block(part, qx, qs, n, 4, kv, kh, p0, nb, softcap, bf16, scr);                                        \
        return 1;

static int shape_ok(const pt_kv_layer *kv, int G) {
    return (kv->bits == 4 || kv->bits == 8) && (kv->dtype == PT_FT_BF16 || kv->dtype == PT_FT_F32) &&
           kv->group_size >= 32 && kv->head_dim % 32 == 0 && kv->head_dim % kv->group_size == 0 && G >= 1 && G <= 8;
}

int pt_cpu_fused_block_avx512(float *part, const float *qx, const float *qs, int G, const pt_kv_layer *kv, int kh,
                              int64_t p0, int nb, float softcap, int bf16, float *scr) {
    if (!shape_ok(kv, G) || nb < 1 || nb > PT_FUSED_BLOCK) return 0;
    switch (G) {
        CASE_G(1)
        CASE_G(2)
        CASE_G(3)
        CASE_G(4)
        CASE_G(5)
        CASE_G(6)
        CASE_G(7)
        CASE_G(8)
    default: return 0;
    }
}

#define CASE_GX(n)                                                                                                \
    case n:                                                                                                       \
        if (kv->bits == 8) exact_item(out, qx, qs, n, 8, kv, kh, lo, nkeys, softcap, bf16, softmax_row, S, scr);   \
        else exact_item(out, qx, qs, n, 4, kv, kh, lo, nkeys, softcap, bf16, softmax_row, S, scr);                 \
        return 1;

int pt_cpu_qattn_item_avx512(float *out, const float *qx, const float *qs, int G, const pt_kv_layer *kv, int kh,
                             int64_t lo, int64_t nkeys, float softcap, int bf16,
                             void (*softmax_row)(float *, int64_t, float, int), float *S, float *scr) {
    if (!shape_ok(kv, G) || nkeys < 1 || !softmax_row) return 0;
    switch (G) {
        CASE_GX(1)
        CASE_GX(2)
        CASE_GX(3)
        CASE_GX(4)
        CASE_GX(5)
        CASE_GX(6)
        CASE_GX(7)
        CASE_GX(8)
    default: return 0;
    }
}
