/* AVX-512 block kernel of the --fused-decode-attn CPU path (contract in
 * attn_qkv_fused.h). What makes it faster than the exact quantized path:
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
 *  - exp is a vector polynomial (degree 6 on |r| <= ln2/2, relative error
 *    ~2e-7), not a call per score.
 *
 * 4-bit codes come in bytes of two values (low nibble first): 16 bytes are
 * widened to 32-bit lanes, and `and 15` / `>> 4` give the 16 even and the 16
 * odd values of a 32-value block. Scores use the query pre-permuted the same
 * way; p·V accumulates in that order and un-permutes when it stores.
 *
 * Not bit-identical to the exact path (other summation order, exp
 * polynomial, factored p·V): the fused lever is output-changing and gated
 * by tests/test_l3_gate.c and tests/test_kv_fused.c. Every value depends
 * only on the block, never on the thread that computes it. */
#include "backend/cpu/attn_qkv_fused.h"

#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

size_t pt_cpu_fused_block_scratch(int G, int hd, int ng) {
    /* S [G, BLOCK] | coef [BLOCK, G, ng] | bsum [G, ng] | tmp [hd] */
    return (size_t)G * PT_FUSED_BLOCK + (size_t)PT_FUSED_BLOCK * G * ng + (size_t)G * ng + (size_t)hd + 16;
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

/* Scores of nb keys for G heads: S[g·BLOCK + j]. */
INLINE void scores(float *S, const float *qx, const float *qs, const int G, const int bits, int hd, int gs,
                   const pt_kv_layer *kv, int kh, int64_t p0, int nb, float softcap, int bf16) {
    const int ng = hd / gs, pbf = kv->dtype == PT_FT_BF16;
    const int64_t cap = kv->capacity;
    const size_t rb = (size_t)hd * bits / 8; /* code bytes per row */
    const uint8_t *cbase = (const uint8_t *)kv->k + (size_t)kh * cap * rb;
    const size_t pbase = (size_t)kh * cap * ng;
    int64_t slot = p0 % cap;
    for (int j = 0; j < nb; j++, slot = slot + 1 == cap ? 0 : slot + 1) {
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
            S[g * PT_FUSED_BLOCK + j] = r;
        }
    }
}

/* p·V over the block for one slice [c0, c0 + 16·NV) of head_dim, all G heads
 * in registers; coef [nb, G, ng] = p_j·scale_jb, bsum [G, ng] = Σ_j p_j·bias_jb. */
INLINE void pv_slice(float *part, const float *coef, const float *bsum, const int G, const int NV, const int bits,
                     int hd, int gs, const uint8_t *cbase, size_t rb, int64_t cap, int64_t p0, int nb, int c0) {
    const int ng = hd / gs;
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) acc[g][i] = _mm512_setzero_ps();
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
    /* store with the bias sums; 4-bit: lanes of vectors 2i / 2i+1 are the even
     * / odd values of a 32-value block, interleaved back here */
    const __m512i ilo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ihi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        float *a = part + (size_t)g * (2 + hd) + 2;
        if (bits == 8) {
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++)
                _mm512_storeu_ps(a + c0 + 16 * i,
                                 _mm512_add_ps(acc[g][i], _mm512_set1_ps(bsum[g * ng + (c0 + 16 * i) / gs])));
        } else {
#pragma GCC unroll 2
            for (int i = 0; i < NV; i += 2) {
                __m512 bb = _mm512_set1_ps(bsum[g * ng + (c0 + 16 * i) / gs]);
                __m512 e = _mm512_add_ps(acc[g][i], bb), o = _mm512_add_ps(acc[g][i + 1], bb);
                _mm512_storeu_ps(a + c0 + 16 * i, _mm512_permutex2var_ps(e, ilo, o));
                _mm512_storeu_ps(a + c0 + 16 * i + 16, _mm512_permutex2var_ps(e, ihi, o));
            }
        }
    }
}

INLINE void block(float *part, const float *qx, const float *qs, const int G, const int bits, const pt_kv_layer *kv,
                  int kh, int64_t p0, int nb, float softcap, int bf16, float *scr) {
    const int hd = kv->head_dim, gs = kv->group_size, ng = hd / gs, pbf = kv->dtype == PT_FT_BF16;
    const int64_t cap = kv->capacity;
    float *S = scr, *coef = S + (size_t)G * PT_FUSED_BLOCK, *bsum = coef + (size_t)PT_FUSED_BLOCK * G * ng;
    scores(S, qx, qs, G, bits, hd, gs, kv, kh, p0, nb, softcap, bf16);
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
    /* coefficients p_j·scale_jb and bias sums Σ_j p_j·bias_jb */
    const size_t pbase = (size_t)kh * cap * ng;
    for (int i = 0; i < G * ng; i++) bsum[i] = 0.0f;
    int64_t slot = p0 % cap;
    for (int j = 0; j < nb; j++, slot = slot + 1 == cap ? 0 : slot + 1) {
        float *cf = coef + (size_t)j * G * ng;
        for (int b = 0; b < ng; b++) {
            float s = ld_param(kv->v_scales, pbf, pbase + (size_t)slot * ng + b),
                  o = ld_param(kv->v_biases, pbf, pbase + (size_t)slot * ng + b);
            for (int g = 0; g < G; g++) {
                float pj = S[(size_t)g * PT_FUSED_BLOCK + j];
                cf[g * ng + b] = pj * s;
                bsum[g * ng + b] += pj * o;
            }
        }
    }
    const size_t rb = (size_t)hd * bits / 8;
    const uint8_t *vbase = (const uint8_t *)kv->v + (size_t)kh * cap * rb;
    if (G <= 4 && hd % 64 == 0)
        for (int c0 = 0; c0 < hd; c0 += 64) pv_slice(part, coef, bsum, G, 4, bits, hd, gs, vbase, rb, cap, p0, nb, c0);
    else
        for (int c0 = 0; c0 < hd; c0 += 32) pv_slice(part, coef, bsum, G, 2, bits, hd, gs, vbase, rb, cap, p0, nb, c0);
}

#define CASE_G(n)                                                                                                 \
    case n:                                                                                                       \
        if (kv->bits == 8) block(part, qx, qs, n, 8, kv, kh, p0, nb, softcap, bf16, scr);                          \
        else block(part, qx, qs, n, 4, kv, kh, p0, nb, softcap, bf16, scr);                                        \
        return 1;

int pt_cpu_fused_block_avx512(float *part, const float *qx, const float *qs, int G, const pt_kv_layer *kv, int kh,
                              int64_t p0, int nb, float softcap, int bf16, float *scr) {
    if ((kv->bits != 4 && kv->bits != 8) || (kv->dtype != PT_FT_BF16 && kv->dtype != PT_FT_F32) ||
        kv->group_size < 32 || kv->head_dim % 32 || kv->head_dim % kv->group_size || nb < 1 || nb > PT_FUSED_BLOCK)
        return 0;
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
