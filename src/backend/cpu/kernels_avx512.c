/* AVX-512 kernels (compiled with the Makefile's AVX-512 flags; selected at
 * runtime only when cpuid reports AVX-512 F/BW/VL/DQ). Same contracts as
 * kernels_scalar.c; results differ from scalar only in summation order.
 *
 * Quantized dots use the factored form: per group, Σ q·x in f32 lanes, then
 * one multiply by the group's scale; the bias term (bias·Σx) is added by the
 * caller. Codes are widened byte → int32 (vpmovzxbd) and converted to f32;
 * 4-bit codes are split into low/high nibbles *after* widening (and 15,
 * shift 4 on 32-bit lanes) against x pre-permuted into [even | odd] halves
 * (pt_cpu_permute_x4), which avoids any cross-lane shuffle. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline __mmask16 tail_mask(int64_t r) { return (__mmask16)((1u << r) - 1u); }

static float dot_f32(const float *x, const float *w, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(w + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(w + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, w + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512 maskz_load_bf16(__mmask16 m, const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

static float dot_bf16(const float *x, const uint16_t *w, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load_bf16(w + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), load_bf16(w + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), load_bf16(w + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), load_bf16(w + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load_bf16(w + i), a0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), maskz_load_bf16(m, w + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static float dot_f16(const float *x, const uint16_t *w, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i + 16))), a1);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))), a0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i)), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static void axpy_bf16(float *y, float a, const uint16_t *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_bf16(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, maskz_load_bf16(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* K % gs == 0 and gs % 32 == 0 (validated at prepare_weight). */
static float qdot4(const float *xp, const uint8_t *codes, const float *sc, int64_t K, int gs) {
    const __m512i m15 = _mm512_set1_epi32(15);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 32) {
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + b / 2)));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, m15));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
            s0 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xp + b), s0);
            s1 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp + b + 16), s1);
        }
        /* alternate accumulators between groups: halves the dependency chain */
        if (g & 1) acc1 = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), _mm512_set1_ps(sc[g]), acc1);
        else acc0 = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), _mm512_set1_ps(sc[g]), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static float qdot8(const float *x, const uint8_t *codes, const float *sc, int64_t K, int gs) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 32) {
            __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + b))));
            __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + b + 16))));
            s0 = _mm512_fmadd_ps(q0, _mm512_loadu_ps(x + b), s0);
            s1 = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + b + 16), s1);
        }
        if (g & 1) acc1 = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), _mm512_set1_ps(sc[g]), acc1);
        else acc0 = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), _mm512_set1_ps(sc[g]), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* ---- four rows at once (decode) ----
 * Low nibbles go through vpermps against a table of 0..15 (it uses only the
 * low 4 bits of each index, so no mask is needed) and high nibbles through
 * shift + convert: this splits the work between the two vector ports instead
 * of piling both conversions on the one that converts. */

/* Software prefetch in the decode kernels. The four rows of a call are
 * consecutive in memory (rows of a matrix, or consecutive cache rows of a
 * KV head), and the next calls read the blocks of four rows that follow.
 * Each 64-byte step of the current rows prefetches one line of a linear
 * sweep that runs pt_cpu_pf_offset(K, bits) bytes ahead of the block's
 * start — PT_CPU_PF_AHEAD (8 KiB) rounded up to whole blocks — at the
 * block's rate (4 rows' bytes per K values), so each line of a later block is
 * requested before any of its four rows reach it. (Before, the sweep ran a
 * fixed 8 KiB ahead: fine while a block is at most 8 KiB, but from K = 8192
 * at 4 bits — llama's down projections — rows 2 and 3 of each block were
 * read before the sweep got to them.) Rows are only a few KiB, too short
 * for the hardware prefetcher to ramp up on each new stream: measured
 * streaming from memory, one thread, 4-bit K = 2048, 5.3 -> 9.8 GB/s
 * (dev/bench_q4_stream; 6-8 KiB ahead was best, 1-2 KiB too close, 16 KiB
 * too far). A prefetch past the end of a buffer is harmless (prefetches
 * never fault). The hint: prefetchnta where pt_cpu_lever.pfnta is on (by
 * default on AMD: on a Zen 5 core it streams the 4-bit decode kernel at
 * 82-87% of the read instead of 78-80%, one thread; bench/RESULTS.md, CPU
 * thirteenth round), else prefetcht0 (Intel: nta was the slower there,
 * dev/README.md). Each kernel reads the lever once into `nta`. */
#define PF_LINE(p)                                                                                               \
    (nta ? _mm_prefetch((const char *)(p), _MM_HINT_NTA) : _mm_prefetch((const char *)(p), _MM_HINT_T0))

#define Q4_STEP(c, l, h)                                                                        \
    do {                                                                                        \
        __m512i v_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((c) + b / 2)));     \
        l = _mm512_fmadd_ps(_mm512_permutexvar_ps(v_, lut), xl, l);                             \
        h = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v_, 4)), xh, h);               \
    } while (0)

/* Adds Σ_g bi[g]·xs[g] for the four rows into their accumulators. */
#define BIAS_TERM()                                                                              \
    for (int64_t g = 0; g < ng; g += 16) {                                                       \
        __mmask16 m_ = ng - g >= 16 ? (__mmask16)0xffff : tail_mask(ng - g);                     \
        __m512 xs_ = _mm512_maskz_loadu_ps(m_, xs + g);                                          \
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_, bi[0] + g), xs_, a0);                     \
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_, bi[1] + g), xs_, a1);                     \
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_, bi[2] + g), xs_, a2);                     \
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_, bi[3] + g), xs_, a3);                     \
    }

static void qdot4_x4(float *out, const float *xp, const float *xs, const uint8_t *const *codes, const float *const *sc,
                     const float *const *bi, int64_t K, int gs) {
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 4); /* see PF_LINE */
    const int nta = pt_cpu_lever.pfnta > 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        __m512 l0 = _mm512_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 32) {
            PF_LINE(pf + 2 * b); /* this step reads 4 × 16 bytes */
            __m512 xl = _mm512_loadu_ps(xp + b), xh = _mm512_loadu_ps(xp + b + 16);
            Q4_STEP(c0, l0, h0);
            Q4_STEP(c1, l1, h1);
            Q4_STEP(c2, l2, h2);
            Q4_STEP(c3, l3, h3);
        }
        a0 = _mm512_fmadd_ps(_mm512_add_ps(l0, h0), _mm512_set1_ps(sc[0][g]), a0);
        a1 = _mm512_fmadd_ps(_mm512_add_ps(l1, h1), _mm512_set1_ps(sc[1][g]), a1);
        a2 = _mm512_fmadd_ps(_mm512_add_ps(l2, h2), _mm512_set1_ps(sc[2][g]), a2);
        a3 = _mm512_fmadd_ps(_mm512_add_ps(l3, h3), _mm512_set1_ps(sc[3][g]), a3);
    }
    BIAS_TERM();
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

/* ---- four 4-bit rows with bf16 activations (decode, bf16 mode) ----
 * A 64-byte load holds 128 codes as 32 16-bit words; word i holds values
 * 4i..4i+3 in its four nibbles. Nibble k of every word, OR-ed into 0x4300,
 * is the bf16 number 128 + q exactly (exponent 2^7, q in the low mantissa
 * bits, ulp 1): one vpternlogd ((v >> 4k) & 15 | 0x4300) per 32 codes, no
 * conversion. vdpbf16ps then multiplies the pairs of words (2i, 2i+1) —
 * values 8i+k and 8i+4+k — with x arranged the same way
 * (pt_cpu_arrange_x4_bf16) and adds both products into f32 lane i. The
 * products (128+q)·x are exact in f32 (8-bit by 8-bit significands).
 * The offset comes out in the bias term:
 *   Σ_g s_g·Σ_j (128+q_j)·x_j + Σ_g (b_g − 128·s_g)·Σ_j x_j = Σ_g Σ_j (s_g·q_j + b_g)·x_j.
 * Lane i of a block covers values 8i..8i+7, all in one group (gs >= 32), so
 * the scales multiply per lane: a vector of the block's 128/gs scales
 * spread by one vpermps. Measured (dev/bench_q4_stream, one thread, in
 * cache): 27.3 vs 23.6 Gweights/s for qdot4_x4; the offset costs accuracy
 * relative to the f32 kernel (~2e-6 of the result instead of ~2e-7), far
 * below the bf16 rounding of the output. */
/* One body for both parameter types (p16 is a compile-time constant at each
 * call): p16 = 0 reads f32 scales/biases (converted by the caller), p16 = 1
 * the bf16 ones in the weight itself. A bf16 value widens to f32 exactly
 * (the 16 bits become the high half of the f32), so both give the same f32
 * operands and the same bits; p16 saves the caller's conversion pass (8
 * conversions of ng values per 4 rows, written to scratch and read back,
 * ~4% of a decode step's CPU time in a profile). The block's scales are
 * widened by one word permute: word 2i+1 of lane i takes the block's scale
 * of lane i's group, word 2i becomes zero. */
static inline __attribute__((always_inline)) void q4bf16_body(float *out, const uint16_t *xa, const float *xs,
                                                              const uint8_t *const *codes, const void *const *sc,
                                                              const void *const *bi, int64_t K, int gs, int p16) {
    const __m512i m15 = _mm512_set1_epi16(15), mag = _mm512_set1_epi16(0x4300);
    /* lane i of a block belongs to its group (8i)/gs */
    const __m512i sidx = gs == 32   ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                         : gs == 64 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                    : _mm512_setzero_si512();
    /* the same selection for 16-bit words: lane i's high word (2i+1) <- scale word sidx[i] */
    const __m512i widx = _mm512_slli_epi32(sidx, 16);
    const __mmask8 smask = (__mmask8)((1u << (128 / gs)) - 1u);
    const int64_t gpb = 128 / gs; /* groups per block */
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 4); /* see PF_LINE */
    const int nta = pt_cpu_lever.pfnta > 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define QB_SCALE(r)                                                                                               \
    (p16 ? _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(                                                    \
               (__mmask32)0xAAAAAAAAu, widx,                                                                      \
               _mm512_zextsi128_si512(_mm_maskz_loadu_epi16(smask, (const uint16_t *)sc[r] + g))))               \
         : _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(smask, (const float *)sc[r] + g))))
#define QB_ROW(r)                                                                                                \
    do {                                                                                                         \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                           \
        __m512bh n0_ = (__m512bh)_mm512_ternarylogic_epi32(v_, m15, mag, 0xEA); /* (A & B) | C */                 \
        __m512bh n1_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 4), m15, mag, 0xEA);             \
        __m512bh n2_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 8), m15, mag, 0xEA);             \
        __m512bh n3_ = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(v_, 12), mag);                                \
        __m512 d_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n0_, x0);                                              \
        d_ = _mm512_dpbf16_ps(d_, n1_, x1);                                                                      \
        d_ = _mm512_dpbf16_ps(d_, n2_, x2);                                                                      \
        d_ = _mm512_dpbf16_ps(d_, n3_, x3);                                                                      \
        a##r = _mm512_fmadd_ps(d_, QB_SCALE(r), a##r);                                                           \
    } while (0)
    for (int64_t b = 0, g = 0; b < K; b += 128, g += gpb) {
        PF_LINE(pf + 2 * b); /* this block reads 4 × 64 bytes */
        PF_LINE(pf + 2 * b + 64);
        PF_LINE(pf + 2 * b + 128);
        PF_LINE(pf + 2 * b + 192);
        __m512bh x0 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b));
        __m512bh x1 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 32));
        __m512bh x2 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 64));
        __m512bh x3 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 96));
        QB_ROW(0);
        QB_ROW(1);
        QB_ROW(2);
        QB_ROW(3);
    }
#undef QB_ROW
#undef QB_SCALE
    /* bias term with the offset: Σ_g (b_g − 128·s_g)·xs_g */
    const __m512 m128 = _mm512_set1_ps(-128.0f);
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g += 16) {
        __mmask16 m_ = ng - g >= 16 ? (__mmask16)0xffff : tail_mask(ng - g);
        __m512 xs_ = _mm512_maskz_loadu_ps(m_, xs + g);
#define QB_LD(p)                                                                                                   \
    (p16 ? _mm512_castsi512_ps(                                                                                    \
               _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m_, (const uint16_t *)(p) + g)), 16)) \
         : _mm512_maskz_loadu_ps(m_, (const float *)(p) + g))
#define QB_BIAS(r) a##r = _mm512_fmadd_ps(_mm512_fmadd_ps(QB_LD(sc[r]), m128, QB_LD(bi[r])), xs_, a##r);
        QB_BIAS(0) QB_BIAS(1) QB_BIAS(2) QB_BIAS(3)
#undef QB_BIAS
#undef QB_LD
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

static void qdot4_x4_bf16(float *out, const uint16_t *xa, const float *xs, const uint8_t *const *codes,
                          const float *const *sc, const float *const *bi, int64_t K, int gs) {
    q4bf16_body(out, xa, xs, codes, (const void *const *)sc, (const void *const *)bi, K, gs, 0);
}

static void qdot4_x4_bf16s(float *out, const uint16_t *xa, const float *xs, const uint8_t *const *codes,
                           const uint16_t *const *sc, const uint16_t *const *bi, int64_t K, int gs) {
    q4bf16_body(out, xa, xs, codes, (const void *const *)sc, (const void *const *)bi, K, gs, 1);
}

#define Q8_STEP(c, s0, s1)                                                                                      \
    do {                                                                                                        \
        s0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((c) + b)))), \
                             x0, s0);                                                                           \
        s1 = _mm512_fmadd_ps(                                                                                   \
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((c) + b + 16)))), x1, s1); \
    } while (0)

static void qdot8_x4(float *out, const float *x, const float *xs, const uint8_t *const *codes, const float *const *sc,
                     const float *const *bi, int64_t K, int gs) {
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 8); /* see PF_LINE */
    const int nta = pt_cpu_lever.pfnta > 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        __m512 l0 = _mm512_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 32) {
            PF_LINE(pf + 4 * b); /* this step reads 4 × 32 bytes */
            PF_LINE(pf + 4 * b + 64);
            __m512 x0 = _mm512_loadu_ps(x + b), x1 = _mm512_loadu_ps(x + b + 16);
            Q8_STEP(c0, l0, h0);
            Q8_STEP(c1, l1, h1);
            Q8_STEP(c2, l2, h2);
            Q8_STEP(c3, l3, h3);
        }
        a0 = _mm512_fmadd_ps(_mm512_add_ps(l0, h0), _mm512_set1_ps(sc[0][g]), a0);
        a1 = _mm512_fmadd_ps(_mm512_add_ps(l1, h1), _mm512_set1_ps(sc[1][g]), a1);
        a2 = _mm512_fmadd_ps(_mm512_add_ps(l2, h2), _mm512_set1_ps(sc[2][g]), a2);
        a3 = _mm512_fmadd_ps(_mm512_add_ps(l3, h3), _mm512_set1_ps(sc[3][g]), a3);
    }
    BIAS_TERM();
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

static void cvt_bf16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(src + i));
    if (i < n) _mm512_mask_storeu_ps(dst + i, tail_mask(n - i), maskz_load_bf16(tail_mask(n - i), src + i));
}

/* Prefill tiles: R tokens × 32 columns, 2R zmm sums (R = 12 uses 24 of the
 * 32 registers); per k two weight loads and R broadcasts feed 2R FMAs. */
#define GEMM_TILE(R)                                                                                      \
    static void gemm_tile##R(float *c, int64_t ldc, const float *xpk, const float *wp, int64_t kc,         \
                             int first) {                                                                 \
        __m512 lo[R], hi[R];                                                                              \
        for (int t = 0; t < R; t++) {                                                                     \
            lo[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + t * ldc);                           \
            hi[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + t * ldc + 16);                      \
        }                                                                                                 \
        for (int64_t k = 0; k < kc; k++) {                                                                \
            __m512 w0 = _mm512_loadu_ps(wp + k * 32), w1 = _mm512_loadu_ps(wp + k * 32 + 16);             \
            for (int t = 0; t < R; t++) {                                                                 \
                __m512 b = _mm512_set1_ps(xpk[k * 12 + t]);                                               \
                lo[t] = _mm512_fmadd_ps(b, w0, lo[t]);                                                    \
                hi[t] = _mm512_fmadd_ps(b, w1, hi[t]);                                                    \
            }                                                                                             \
        }                                                                                                 \
        for (int t = 0; t < R; t++) {                                                                     \
            _mm512_storeu_ps(c + t * ldc, lo[t]);                                                         \
            _mm512_storeu_ps(c + t * ldc + 16, hi[t]);                                                    \
        }                                                                                                 \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
GEMM_TILE(12)
GEMM_TILE(4)
GEMM_TILE(1)
#pragma GCC pop_options

/* 16 × 16 transposes (four shuffle stages, 64 shuffles per 256 values)
 * instead of one scalar store per value: the panel packing was ~15% of a
 * T = 512 prefill matmul with scalar stores. */
/* a[j] = column j of the 16 rows a[0..15] (lane r = a[r][j]), in registers. */
static inline __attribute__((always_inline)) void transpose16(__m512 a[16]) {
    __m512 b[16];
#pragma GCC unroll 8
    for (int r = 0; r < 16; r += 2) { /* 2×2 blocks of single values */
        b[r] = _mm512_unpacklo_ps(a[r], a[r + 1]);
        b[r + 1] = _mm512_unpackhi_ps(a[r], a[r + 1]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 16; r += 4) { /* pairs */
        a[r] = _mm512_shuffle_ps(b[r], b[r + 2], 0x44);
        a[r + 1] = _mm512_shuffle_ps(b[r], b[r + 2], 0xee);
        a[r + 2] = _mm512_shuffle_ps(b[r + 1], b[r + 3], 0x44);
        a[r + 3] = _mm512_shuffle_ps(b[r + 1], b[r + 3], 0xee);
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) { /* 128-bit lanes: i = 0-3, 8-11 with i + 4 */
        int i = (r / 4) * 4 + r;
        b[i] = _mm512_shuffle_f32x4(a[i], a[i + 4], 0x88);
        b[i + 4] = _mm512_shuffle_f32x4(a[i], a[i + 4], 0xdd);
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
        a[r] = _mm512_shuffle_f32x4(b[r], b[r + 8], 0x88);
        a[r + 8] = _mm512_shuffle_f32x4(b[r], b[r + 8], 0xdd);
    }
}

static void panel_t16(float *wp, int r0, const float *rows, int64_t K) {
    for (int64_t k = 0; k < K; k += 16) {
        __m512 a[16];
        for (int r = 0; r < 16; r++) a[r] = _mm512_loadu_ps(rows + r * K + k);
        transpose16(a);
        for (int j = 0; j < 16; j++) _mm512_storeu_ps(wp + (k + j) * 32 + r0, a[j]); /* a[j] = column j */
    }
}

static void gemm_32(float *c, int64_t ldc, const float *xpk, const float *wp, int mr, int64_t kc, int first) {
    int t = 0;
    if (mr == 12) {
        gemm_tile12(c, ldc, xpk, wp, kc, first);
        return;
    }
    for (; t + 4 <= mr; t += 4) gemm_tile4(c + t * ldc, ldc, xpk + t, wp, kc, first);
    for (; t < mr; t++) gemm_tile1(c + t * ldc, ldc, xpk + t, wp, kc, first);
}

/* ---- attention (head_dim % 64 == 0) ----
 * Scores: each key row is loaded and converted once for a block of B query
 * heads of the same GQA group (B = 4, 2, 1), one f32 chain per head, reduced
 * once per (key, head). P·V: the block's output rows stay in registers
 * (B × 64 dims at a time) across all keys, each value row converted once. */
#define ATTN_BLOCK(B)                                                                                         \
    static void scores_b##B(float *S, int64_t lds, const float *q, int hd, const void *k, int64_t n, int bf) { \
        for (int64_t j = 0; j < n; j++) {                                                                     \
            __m512 acc[B];                                                                                    \
            for (int g = 0; g < B; g++) acc[g] = _mm512_setzero_ps();                                         \
            for (int d = 0; d < hd; d += 16) {                                                                \
                __m512 kv = bf ? load_bf16((const uint16_t *)k + j * hd + d)                                  \
                               : _mm512_loadu_ps((const float *)k + j * hd + d);                              \
                for (int g = 0; g < B; g++) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hd + d), kv, acc[g]); \
            }                                                                                                 \
            for (int g = 0; g < B; g++) S[g * lds + j] = _mm512_reduce_add_ps(acc[g]);                        \
        }                                                                                                     \
    }                                                                                                         \
    static void pv_b##B(float *out, const float *P, int64_t ldp, int hd, const void *v, int64_t n, int bf) {  \
        for (int d0 = 0; d0 < hd; d0 += 64) {                                                                 \
            __m512 o[B][4];                                                                                   \
            for (int g = 0; g < B; g++)                                                                       \
                for (int i = 0; i < 4; i++) o[g][i] = _mm512_loadu_ps(out + g * hd + d0 + 16 * i);            \
            for (int64_t j = 0; j < n; j++) {                                                                 \
                __m512 vv[4];                                                                                 \
                for (int i = 0; i < 4; i++)                                                                   \
                    vv[i] = bf ? load_bf16((const uint16_t *)v + j * hd + d0 + 16 * i)                        \
                               : _mm512_loadu_ps((const float *)v + j * hd + d0 + 16 * i);                    \
                for (int g = 0; g < B; g++) {                                                                 \
                    __m512 p = _mm512_set1_ps(P[g * ldp + j]);                                                \
                    for (int i = 0; i < 4; i++) o[g][i] = _mm512_fmadd_ps(p, vv[i], o[g][i]);                 \
                }                                                                                             \
            }                                                                                                 \
            for (int g = 0; g < B; g++)                                                                       \
                for (int i = 0; i < 4; i++) _mm512_storeu_ps(out + g * hd + d0 + 16 * i, o[g][i]);            \
        }                                                                                                     \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
ATTN_BLOCK(4)
ATTN_BLOCK(2)
ATTN_BLOCK(1)
#pragma GCC pop_options

/* Sum of each of 16 vectors, as one vector (lane i = sum of v[i]): pairwise
 * unpack/shuffle/add in three rounds, 45 instructions instead of 16 full
 * horizontal reductions (~128). */
static inline __m512 hsum16(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: [s(4i), s(4i+1), s(4i+2), s(4i+3)] partial over that lane */
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
    __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

/* Scores of 16 keys at a time: the block's rows converted to f32 once, then
 * per query head 16 independent dot chains and one hsum16. */
static void scores_16(float *S, int64_t lds, const float *q, int G, int hd, const void *k, int64_t j0, int bf) {
    float kf[16 * 256] __attribute__((aligned(64)));
    const float *kr;
    if (bf) {
        for (int jj = 0; jj < 16; jj++)
            for (int d = 0; d < hd; d += 16)
                _mm512_store_ps(kf + jj * hd + d, load_bf16((const uint16_t *)k + (j0 + jj) * hd + d));
        kr = kf;
    } else kr = (const float *)k + j0 * hd;
    for (int g = 0; g < G; g++) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            __m512 qd = _mm512_loadu_ps(q + g * hd + d);
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(kr + jj * hd + d), acc[jj]);
        }
        _mm512_storeu_ps(S + g * lds + j0, hsum16(acc));
    }
}

static int attn_scores(float *S, int64_t lds, const float *q, int G, int hd, const void *k, int64_t n, int bf) {
    if (hd % 64) return 0;
    if (hd <= 256 && n >= 16) {
        int64_t j0 = 0;
        for (; j0 + 16 <= n; j0 += 16) scores_16(S, lds, q, G, hd, k, j0, bf);
        if (j0 == n) return 1;
        /* the last keys: the per-key kernels on the rest */
        S += j0;
        k = (const char *)k + (size_t)j0 * hd * (bf ? 2 : 4);
        n -= j0;
    }
    int g = 0;
    for (; g + 4 <= G; g += 4) scores_b4(S + g * lds, lds, q + g * hd, hd, k, n, bf);
    for (; g + 2 <= G; g += 2) scores_b2(S + g * lds, lds, q + g * hd, hd, k, n, bf);
    for (; g < G; g++) scores_b1(S + g * lds, lds, q + g * hd, hd, k, n, bf);
    return 1;
}

/* ---- attention scores (head_dim % 16 == 0, <= 512) ----
 * S[r·lds + j] = q_r · k_j as one f32 multiply-add chain in d order (from
 * zero, d = 0 first), for the rows r = u·G + g (query head g < G of token
 * u < nt, at q + u·qs + g·hd) and n contiguous keys. Keys go in blocks of
 * 32: the block's rows converted to f32 and transposed once into
 * kT [hd][32] (16 × 16 transposes), so a key is a lane and a row takes its
 * 32 scores as two vector chains, each q element broadcast once for both;
 * the block's elements are read once for all the rows (a prefill chunk's
 * tokens share them: cpu_attention.c passes several tokens of a KV head).
 * A score's bits depend on neither the block, n, the rows beside it nor the
 * number of tokens, so a prefill call's tokens score a key alike however
 * they are grouped. Lanes past n compute on copies of the last key and are
 * not stored.
 * A decode step (one token) with fewer than 4 query heads per KV head takes
 * attn_scores above instead: there the block's transposition costs more
 * than the reductions it saves (one thread, keys in cache, ns a key,
 * attn_scores | this, head 64: G = 1 3.3 | 4.1, G = 2 4.8 | 4.4, G = 4
 * 7.9 | 5.2, G = 8 14.1 | 7.4; head 128: G = 2 8.2 | 8.7, G = 3 9.4 | 12.1,
 * G = 4 11.5 | 9.7; head 256, G = 2: 12.2 | 17.8; bench/RESULTS.md, CPU
 * twelfth round), while 8 tokens × 4 heads a call take 2.6 ns a token and
 * key. */
static void keys_t32(float *kT, const void *k, int64_t nk, int hd, int bf) {
    const size_t rs = (size_t)hd * (bf ? 2 : 4);
    for (int c0 = 0; c0 < 32; c0 += 16) {
        const char *row[16]; /* past n: the last key again, never stored */
        for (int c = 0; c < 16; c++) row[c] = (const char *)k + (size_t)(c0 + c < nk ? c0 + c : nk - 1) * rs;
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __m512 a[16];
            if (bf) {
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) a[c] = load_bf16((const uint16_t *)row[c] + d0);
            } else {
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) a[c] = _mm512_loadu_ps((const float *)row[c] + d0);
            }
            transpose16(a);
#pragma GCC unroll 16
            for (int d = 0; d < 16; d++) _mm512_store_ps(kT + (d0 + d) * 32 + c0, a[d]);
        }
    }
}

/* A 32-key block's scores of rows r0 .. r0 + rb − 1 (keys 0-15 in a0, 16-31
 * in a1), the first nk keys */
static inline __attribute__((always_inline)) void score_rows_store(float *S, int64_t lds, int r0, int rb,
                                                                   const __m512 *a0, const __m512 *a1, int64_t nk) {
    const __mmask16 m0 = nk >= 16 ? 0xffff : (__mmask16)((1u << nk) - 1),
                    m1 = nk >= 32 ? 0xffff : nk <= 16 ? 0 : (__mmask16)((1u << (nk - 16)) - 1);
    for (int i = 0; i < rb; i++) {
        _mm512_mask_storeu_ps(S + (int64_t)(r0 + i) * lds, m0, a0[i]);
        _mm512_mask_storeu_ps(S + (int64_t)(r0 + i) * lds + 16, m1, a1[i]);
    }
}

#define SCORE_ROWS(RB)                                                                                        \
    static void score_rows##RB(float *S, int64_t lds, const float *q, int64_t qs, int G, int r0, const float *kT, \
                               int hd, int64_t nk) {                                                         \
        const float *qr[RB];                                                                                  \
        __m512 a0[RB], a1[RB];                                                                                \
        for (int i = 0; i < RB; i++) {                                                                        \
            qr[i] = q + (int64_t)((r0 + i) / G) * qs + (int64_t)((r0 + i) % G) * hd;                          \
            a0[i] = _mm512_setzero_ps();                                                                      \
            a1[i] = _mm512_setzero_ps();                                                                      \
        }                                                                                                     \
        for (int d = 0; d < hd; d++) {                                                                        \
            const __m512 k0 = _mm512_load_ps(kT + d * 32), k1 = _mm512_load_ps(kT + d * 32 + 16);            \
            for (int i = 0; i < RB; i++) {                                                                    \
                const __m512 qd = _mm512_set1_ps(qr[i][d]);                                                   \
                a0[i] = _mm512_fmadd_ps(qd, k0, a0[i]);                                                       \
                a1[i] = _mm512_fmadd_ps(qd, k1, a1[i]);                                                       \
            }                                                                                                 \
        }                                                                                                     \
        score_rows_store(S, lds, r0, RB, a0, a1, nk);                                                         \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
SCORE_ROWS(8)
SCORE_ROWS(4)
SCORE_ROWS(2)
SCORE_ROWS(1)
#pragma GCC pop_options

/* Rows r < R of a transposed block's scores (kT [hd][32], nk keys) */
static inline void score_block(float *S, int64_t lds, const float *q, int64_t qs, int R, int G, const float *kT,
                               int hd, int64_t nk) {
    int r = 0;
    for (; r + 8 <= R; r += 8) score_rows8(S, lds, q, qs, G, r, kT, hd, nk);
    for (; r + 4 <= R; r += 4) score_rows4(S, lds, q, qs, G, r, kT, hd, nk);
    for (; r + 2 <= R; r += 2) score_rows2(S, lds, q, qs, G, r, kT, hd, nk);
    for (; r < R; r++) score_rows1(S, lds, q, qs, G, r, kT, hd, nk);
}

static int attn_scores_t(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, int hd, const void *k,
                       int64_t n, int bf) {
    if (hd % 16 || hd > 512) return 0;
    float kT[512 * 32] __attribute__((aligned(64)));
    const int R = nt * G;
    const size_t rs = (size_t)hd * (bf ? 2 : 4);
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int64_t nk = n - j0 < 32 ? n - j0 : 32;
        /* the next block's rows on their way while this one is transposed and scored (streamed from memory,
         * its 16-row strided loads alone ran 15-35% behind the row-wise loads of attn_scores) */
        const int64_t nn = n - j0 - 32 < 32 ? n - j0 - 32 : 32;
        if (nn > 0) {
            const char *next = (const char *)k + (size_t)(j0 + 32) * rs;
            for (size_t o = 0; o < (size_t)nn * rs; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
        }
        keys_t32(kT, (const char *)k + (size_t)j0 * rs, nk, hd, bf);
        score_block(S + j0, lds, q, qs, R, G, kT, hd, nk);
    }
    return 1;
}

/* ---- quantized KV rows (4/8-bit MLX codes) ----
 * Values are scale·code + bias, product and sum each rounded, as
 * pt_cpu_qrows_ref computes them. */

/* scale·code + bias with both roundings (pt_cpu_qrows_ref's value): ex = 1
 * where the scales are bf16 values — then scale·code (8 + 8 significant
 * bits) is exact in f32, the product's rounding is no rounding, and one
 * fused multiply-add gives the same bits */
static inline __attribute__((always_inline)) __m512 dq_val(__m512 code, __m512 s, __m512 z, int ex) {
    return ex ? _mm512_fmadd_ps(code, s, z) : _mm512_add_ps(_mm512_mul_ps(code, s), z);
}

/* P·V over n quantized value rows (attn_pv_q): the block's outputs in
 * registers (B heads × 32 dims) across 64 rows at a time, each row's codes
 * widened once for the B heads and dequantized in registers with the
 * operations of pt_cpu_qrows_ref, so each sum is the chain attn_pv runs
 * on the dequantized rows. 4-bit rows come as a byte's two values (the
 * low nibbles are the even values of 32, the high ones the odd), so the
 * accumulators hold the 32 dims as [even | odd], sorted back at the
 * block's store. The block's scales and biases are converted to f32 first
 * (each then a broadcast operand); the rows 16 ahead are prefetched. 32-dim
 * slices keep the 4-head block's accumulators, codes and constants within
 * the 32 vector registers (64-dim slices spilled). */
#define PVQ_ROWS 64
static inline __attribute__((always_inline)) void pvq(float *out, const float *P, int64_t ldp, const pt_cpu_qrows *r,
                                                      int64_t n, const int B, const int NV, const int bits,
                                                      const int ex) {
    const int hd = r->hd, gs = r->gs, ng = hd / gs, W = 16 * NV;
    const size_t rb = (size_t)hd * bits / 8, pb = (size_t)ng * pt_ftype_size(r->dt);
    float sf[PVQ_ROWS * 16] __attribute__((aligned(64))), zf[PVQ_ROWS * 16] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < n; j0 += PVQ_ROWS) {
        const int64_t j1 = n - j0 < PVQ_ROWS ? n : j0 + PVQ_ROWS;
        const int np = (int)(j1 - j0) * ng;
        const float *sp = (const float *)r->sc + j0 * ng, *zp = (const float *)r->bi + j0 * ng;
        if (r->dt == PT_FT_BF16) {
            const uint16_t *s16 = (const uint16_t *)r->sc + j0 * ng, *z16 = (const uint16_t *)r->bi + j0 * ng;
            for (int i = 0; i < np; i += 16) {
                const __mmask16 m = np - i >= 16 ? (__mmask16)0xffff : tail_mask(np - i);
                _mm512_store_ps(sf + i, maskz_load_bf16(m, s16 + i));
                _mm512_store_ps(zf + i, maskz_load_bf16(m, z16 + i));
            }
            sp = sf, zp = zf;
        }
        for (int d0 = 0; d0 < hd; d0 += W) {
            const int b0 = d0 / gs, b1 = (d0 + W - 1) / gs; /* W <= 64: at most two groups (gs = 32) */
            __m512 o[8][4];
            for (int g = 0; g < B; g++)
                for (int i = 0; i < NV; i += 2) {
                    const float *x = out + g * hd + d0 + 16 * i;
                    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
                    if (bits == 4) {
                        o[g][i] = _mm512_permutex2var_ps(
                            x0, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), x1);
                        o[g][i + 1] = _mm512_permutex2var_ps(
                            x0, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), x1);
                    } else
                        o[g][i] = x0, o[g][i + 1] = x1;
                }
            for (int64_t j = j0; j < j1; j++) {
                const uint8_t *c = r->codes + (size_t)j * rb;
                if (d0 == 0) {
                    _mm_prefetch((const char *)c + 16 * rb, _MM_HINT_T0);
                    _mm_prefetch((const char *)r->sc + (size_t)(j + 16) * pb, _MM_HINT_T0);
                    _mm_prefetch((const char *)r->bi + (size_t)(j + 16) * pb, _MM_HINT_T0);
                }
                const size_t pi = (size_t)(j - j0) * ng;
                __m512 v[4];
                for (int i = 0; i < NV; i += 2) {
                    __m512i w0, w1;
                    if (bits == 4) {
                        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + (d0 + 16 * i) / 2)));
                        w0 = _mm512_and_si512(x, _mm512_set1_epi32(15)), w1 = _mm512_srli_epi32(x, 4);
                    } else {
                        w0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + d0 + 16 * i)));
                        w1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + d0 + 16 * i + 16)));
                    }
                    const int bb = i < 2 ? b0 : b1;
                    const __m512 s = _mm512_set1_ps(sp[pi + bb]), z = _mm512_set1_ps(zp[pi + bb]);
                    v[i] = dq_val(_mm512_cvtepi32_ps(w0), s, z, ex);
                    v[i + 1] = dq_val(_mm512_cvtepi32_ps(w1), s, z, ex);
                }
                for (int g = 0; g < B; g++) {
                    const __m512 p = _mm512_set1_ps(P[g * ldp + j]);
                    for (int i = 0; i < NV; i++) o[g][i] = _mm512_fmadd_ps(p, v[i], o[g][i]);
                }
            }
            for (int g = 0; g < B; g++)
                for (int i = 0; i < NV; i += 2) {
                    float *y = out + g * hd + d0 + 16 * i;
                    if (bits == 4) {
                        _mm512_storeu_ps(y, _mm512_permutex2var_ps(o[g][i],
                                                                   _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20,
                                                                                     5, 21, 6, 22, 7, 23),
                                                                   o[g][i + 1]));
                        _mm512_storeu_ps(y + 16, _mm512_permutex2var_ps(o[g][i],
                                                                        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27,
                                                                                          12, 28, 13, 29, 14, 30, 15,
                                                                                          31),
                                                                        o[g][i + 1]));
                    } else {
                        _mm512_storeu_ps(y, o[g][i]);
                        _mm512_storeu_ps(y + 16, o[g][i + 1]);
                    }
                }
        }
    }
}
/* 4-bit: 32-dim slices (two accumulators a head: with 64 the 4-head block
 * spilled); 8-bit: 64-dim slices where the head allows */
#define PVQ_FNS(B)                                                                                                \
    static void pvq4_b##B(float *out, const float *P, int64_t ldp, const pt_cpu_qrows *r, int64_t n) {            \
        if (r->dt == PT_FT_BF16) pvq(out, P, ldp, r, n, B, 2, 4, 1);                                               \
        else pvq(out, P, ldp, r, n, B, 2, 4, 0);                                                                   \
    }                                                                                                              \
    static void pvq8_b##B(float *out, const float *P, int64_t ldp, const pt_cpu_qrows *r, int64_t n) {            \
        const int ex = r->dt == PT_FT_BF16;                                                                        \
        if (r->hd % 64) {                                                                                          \
            if (ex) pvq(out, P, ldp, r, n, B, 2, 8, 1);                                                            \
            else pvq(out, P, ldp, r, n, B, 2, 8, 0);                                                               \
        } else if (ex)                                                                                             \
            pvq(out, P, ldp, r, n, B, 4, 8, 1);                                                                    \
        else                                                                                                       \
            pvq(out, P, ldp, r, n, B, 4, 8, 0);                                                                    \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
PVQ_FNS(4)
PVQ_FNS(2)
PVQ_FNS(1)
#pragma GCC pop_options

/* A P·V kernel of a block of heads over quantized value rows */
typedef void (*qpv_fn)(float *out, const float *P, int64_t ldp, const pt_cpu_qrows *v, int64_t n);

/* G heads' P·V in blocks of 4, 2 and 1 heads (f[0], f[1], f[2]) */
static void qpv_heads(const qpv_fn *f, float *out, const float *P, int64_t ldp, int G, const pt_cpu_qrows *v,
                      int64_t n) {
    const int hd = v->hd;
    int g = 0;
    for (; g + 4 <= G; g += 4) f[0](out + g * hd, P + g * ldp, ldp, v, n);
    for (; g + 2 <= G; g += 2) f[1](out + g * hd, P + g * ldp, ldp, v, n);
    for (; g < G; g++) f[2](out + g * hd, P + g * ldp, ldp, v, n);
}

static int attn_pv_q(float *out, const float *P, int64_t ldp, int G, const pt_cpu_qrows *v, int64_t n) {
    static const qpv_fn f4[3] = {pvq4_b4, pvq4_b2, pvq4_b1}, f8[3] = {pvq8_b4, pvq8_b2, pvq8_b1};
    const int hd = v->hd;
    if ((v->bits != 4 && v->bits != 8) || hd % 32 || v->gs % 32 || v->dt == PT_FT_F16 || hd / v->gs > 16) return 0;
    qpv_heads(v->bits == 4 ? f4 : f8, out, P, ldp, G, v, n);
    return 1;
}

/* sv[b·16 + l], bv[b·16 + l] = scale and bias of group b of key l < nk
 * (rows of ng parameters from p, keys past nk: 0); perm: the rows of 2 or 4
 * groups deinterleaved by permutes rather than gathers (the same values) */
static inline void qparams16(float *sv, float *bv, const pt_cpu_qrows *r, int64_t j, int nk, int perm) {
    const int ng = r->hd / r->gs, n = ng * nk;
    const size_t es = pt_ftype_size(r->dt), o = (size_t)j * ng * es;
    float ts[256] __attribute__((aligned(64))), tb[256] __attribute__((aligned(64)));
    float *ds = ng == 1 ? sv : ts, *db = ng == 1 ? bv : tb;
    for (int i = 0; i < (n ? n : 1); i += 16) { /* nk = 0: zeros */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        if (r->dt == PT_FT_BF16) {
            _mm512_store_ps(ds + i, maskz_load_bf16(m, (const uint16_t *)((const char *)r->sc + o) + i));
            _mm512_store_ps(db + i, maskz_load_bf16(m, (const uint16_t *)((const char *)r->bi + o) + i));
        } else {
            _mm512_store_ps(ds + i, _mm512_maskz_loadu_ps(m, (const float *)((const char *)r->sc + o) + i));
            _mm512_store_ps(db + i, _mm512_maskz_loadu_ps(m, (const float *)((const char *)r->bi + o) + i));
        }
    }
    if (ng == 1) return;
    const __mmask16 m = nk >= 16 ? (__mmask16)0xffff : tail_mask(nk);
    const __m512i lane = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(ng));
    if (perm && (ng == 2 || ng == 4)) { /* the [key][group] rows deinterleaved by permutes: in the fused kernels
                                         * (a gather took ~20% of a scores call at head 128, group 64; 1.1x faster
                                         * at 2048 and 8192 keys); the exact path's key transposes measured 3-6%
                                         * slower with them at 8192 keys, so they keep the gathers */
        for (int g = 0; g < ng; g++) {
            const __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32(g)); /* key k's value at k·ng + g */
            for (int h = 0; h < 2; h++) {
                const float *t = h ? tb : ts;
                __m512 v;
                if (ng == 2)
                    v = _mm512_permutex2var_ps(_mm512_load_ps(t), idx, _mm512_load_ps(t + 16));
                else /* keys 0-7 from t[0..31], keys 8-15 from t[32..63] (the same indices less 32) */
                    v = _mm512_shuffle_f32x4(_mm512_permutex2var_ps(_mm512_load_ps(t), idx, _mm512_load_ps(t + 16)),
                                             _mm512_permutex2var_ps(_mm512_load_ps(t + 32), idx, _mm512_load_ps(t + 48)),
                                             0x44);
                _mm512_store_ps((h ? bv : sv) + g * 16, _mm512_maskz_mov_ps(m, v));
            }
        }
        return;
    }
    for (int g = 0; g < ng; g++) {
        const __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32(g));
        _mm512_store_ps(sv + g * 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, ts, 4));
        _mm512_store_ps(bv + g * 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, tb, 4));
    }
}

/* The values of one transposed code word x (a key per lane: dims d0 ..
 * d0 + 32/bits − 1) dequantized into kT rows d0.. at column c0 (ex: dq_val) */
static inline __attribute__((always_inline)) void dq_word_ex(float *dst, __m512i x, __m512 s, __m512 z, int bits,
                                                             const int ex) {
    const __m512i mask = _mm512_set1_epi32((1 << bits) - 1);
    const int per = 32 / bits;
#pragma GCC unroll 8
    for (int i = 0; i < per; i++) {
        __m512i v = i ? _mm512_srli_epi32(x, bits * i) : x;
        if (i < per - 1) v = _mm512_and_si512(v, mask);
        _mm512_store_ps(dst + i * 32, dq_val(_mm512_cvtepi32_ps(v), s, z, ex));
    }
}
static inline __attribute__((always_inline)) void dq_word(float *dst, __m512i x, __m512 s, __m512 z, int bits, int ex) {
    if (ex) dq_word_ex(dst, x, s, z, bits, 1);
    else dq_word_ex(dst, x, s, z, bits, 0);
}

/* keys_t32 for quantized keys: the block's rows (nk <= 32) dequantized into
 * kT [hd][32] (lanes past nk: code rows of the last key, parameters 0;
 * computed, never stored as scores). The code words are transposed 16 × 16
 * (a key per lane; rows of 8 words, 4-bit head 64, go 32 keys to one
 * transposition, a key and the one 16 after it sharing a vector), then each
 * value is its shifted and masked code, converted, times its key's scale
 * plus its bias (per-lane vectors of the group's parameters). */
static void keys_t32_q(float *kT, const pt_cpu_qrows *r, int64_t nk) {
    const int bits = r->bits, hd = r->hd, gs = r->gs, per = 32 / bits, nw = hd / per, ex = r->dt == PT_FT_BF16;
    const size_t rb = (size_t)nw * 4;
    float sv[2][256] __attribute__((aligned(64))), bv[2][256] __attribute__((aligned(64)));
    for (int h = 0; h < 2; h++) qparams16(sv[h], bv[h], r, 16 * h, nk - 16 * h < 0 ? 0 : nk - 16 * h > 16 ? 16 : (int)(nk - 16 * h), 0);
    const uint8_t *row[32];
    for (int c = 0; c < 32; c++) row[c] = r->codes + (size_t)(c < nk ? c : nk - 1) * rb;
    if (nw == 8) {
        __m512 a[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++)
            a[c] = _mm512_castsi512_ps(_mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)row[c])),
                _mm256_loadu_si256((const __m256i *)row[c + 16]), 1));
        transpose16(a);
        for (int w = 0; w < 8; w++) {
            const int d0 = w * per, b = d0 / gs;
            dq_word(kT + (size_t)d0 * 32, _mm512_castps_si512(a[w]), _mm512_load_ps(sv[0] + b * 16),
                    _mm512_load_ps(bv[0] + b * 16), bits, ex);
            dq_word(kT + (size_t)d0 * 32 + 16, _mm512_castps_si512(a[w + 8]), _mm512_load_ps(sv[1] + b * 16),
                    _mm512_load_ps(bv[1] + b * 16), bits, ex);
        }
        return;
    }
    for (int h = 0; h < 2; h++)
        for (int w0 = 0; w0 < nw; w0 += 16) {
            const int cnt = nw - w0 < 16 ? nw - w0 : 16;
            const __mmask16 m = cnt == 16 ? (__mmask16)0xffff : tail_mask(cnt);
            __m512 a[16];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++)
                a[c] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(m, row[16 * h + c] + (size_t)w0 * 4));
            transpose16(a);
            for (int w = 0; w < cnt; w++) {
                const int d0 = (w0 + w) * per, b = d0 / gs;
                dq_word(kT + (size_t)d0 * 32 + 16 * h, _mm512_castps_si512(a[w]), _mm512_load_ps(sv[h] + b * 16),
                        _mm512_load_ps(bv[h] + b * 16), bits, ex);
            }
        }
}

static int attn_scores_tq(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, const pt_cpu_qrows *k,
                          int64_t n) {
    const int hd = k->hd;
    if ((k->bits != 4 && k->bits != 8) || hd % 32 || hd > 512 || k->gs % 32 || k->dt == PT_FT_F16) return 0;
    float kT[512 * 32] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int64_t nk = n - j0 < 32 ? n - j0 : 32, nn = n - j0 - 32 < 32 ? n - j0 - 32 : 32;
        const pt_cpu_qrows blk = pt_cpu_qrows_at(k, j0);
        if (nn > 0) pt_cpu_qrows_prefetch(k, j0 + 32, nn); /* the next block's codes and parameters */
        keys_t32_q(kT, &blk, nk);
        score_block(S + j0, lds, q, qs, nt * G, G, kT, hd, nk);
    }
    return 1;
}

static int attn_pv(float *out, const float *P, int64_t ldp, int G, int hd, const void *v, int64_t n, int bf) {
    if (hd % 64) return 0;
    int g = 0;
    for (; g + 4 <= G; g += 4) pv_b4(out + g * hd, P + g * ldp, ldp, hd, v, n, bf);
    for (; g + 2 <= G; g += 2) pv_b2(out + g * hd, P + g * ldp, ldp, hd, v, n, bf);
    for (; g < G; g++) pv_b1(out + g * hd, P + g * ldp, ldp, hd, v, n, bf);
    return 1;
}

/* ---- attention products on vdpbf16ps (attn_scores_dp, attn_pv_dp) ----
 * In bf16 mode over a bf16 cache both products have bf16 operands: the
 * queries and the probabilities are rounded activations, the keys and values
 * bf16 rows. vdpbf16ps multiplies a lane's two bf16 pairs exactly in f32 and
 * adds the odd element's product, then the even one's, into the f32 lane
 * (round to nearest each; inputs and results subnormal in f32 read and
 * written as zero), so
 *   scores: S[r·lds + j] = one f32 chain over the dims in pairs, dim d + 1
 *           then d for d = 0, 2, 4, ... (from zero), whatever nt, n or the
 *           key's place in its block;
 *   p·V:    out[g·hd + d] continues its chain over the keys in pairs, key
 *           j + 1 then j for j = 0, 2, 4, ... of each call (an odd last key
 *           paired with a zero row and probability).
 * Other orders than attn_scores_t's and attn_pv's (the L1 contract is the
 * rounding points, not the order of an f32 sum), with half the multiply-add
 * instructions, no widening of bf16 rows, and a 16 × 16 transpose of 32-bit
 * pairs moving 32 dims of 16 keys (attn_scores_t's moves 16). Used where
 * vdpbf16ps issues at about the FMA rate (cpu_attention.c). */

/* kT [hd/2][32] pairs: entry (i, c) = dims 2i, 2i + 1 of key c (lanes past
 * nk: the last key again, never stored). hd % 32 == 0. */
static void keys_t32_dp(uint32_t *kT, const uint16_t *k, int64_t nk, int hd) {
    for (int c0 = 0; c0 < 32; c0 += 16) {
        const uint16_t *row[16];
        for (int c = 0; c < 16; c++) row[c] = k + (size_t)(c0 + c < nk ? c0 + c : nk - 1) * hd;
        for (int d0 = 0; d0 < hd; d0 += 32) {
            __m512 a[16];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) a[c] = _mm512_loadu_ps((const float *)(row[c] + d0));
            transpose16(a);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) _mm512_store_ps((float *)kT + (d0 / 2 + i) * 32 + c0, a[i]);
        }
    }
}

/* Rows r0 .. r0 + RB − 1 of a block's scores; qp: the rows' queries as bf16
 * pairs, hd/2 words a row */
#define SCORE_ROWS_DP(RB)                                                                                     \
    static void score_rows_dp##RB(float *S, int64_t lds, const uint32_t *qp, int r0, const uint32_t *kT, int hd, \
                                  int64_t nk) {                                                               \
        const int hp = hd / 2;                                                                                \
        __m512 a0[RB], a1[RB];                                                                                \
        for (int i = 0; i < RB; i++) a0[i] = a1[i] = _mm512_setzero_ps();                                     \
        for (int i2 = 0; i2 < hp; i2++) {                                                                     \
            const __m512bh k0 = (__m512bh)_mm512_load_si512(kT + i2 * 32),                                    \
                           k1 = (__m512bh)_mm512_load_si512(kT + i2 * 32 + 16);                               \
            for (int i = 0; i < RB; i++) {                                                                    \
                const __m512bh qd = (__m512bh)_mm512_set1_epi32((int)qp[(r0 + i) * hp + i2]);                 \
                a0[i] = _mm512_dpbf16_ps(a0[i], qd, k0);                                                      \
                a1[i] = _mm512_dpbf16_ps(a1[i], qd, k1);                                                      \
            }                                                                                                 \
        }                                                                                                     \
        score_rows_store(S, lds, r0, RB, a0, a1, nk);                                                         \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
SCORE_ROWS_DP(8)
SCORE_ROWS_DP(4)
SCORE_ROWS_DP(2)
SCORE_ROWS_DP(1)
#pragma GCC pop_options

/* Query rows as bf16 pairs (exact: they hold bf16 values) */
static void pack_pairs(uint32_t *dst, const float *x, int n) {
    for (int d = 0; d < n; d += 32)
        _mm512_storeu_si512((void *)(dst + d / 2),
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + d + 16), _mm512_loadu_ps(x + d)));
}

/* Rows c0 .. c0 + rc − 1 of a call's queries (row r: token r / G, head
 * r % G) as bf16 pairs, hd/2 words a row */
static void pack_query_rows(uint32_t *dst, const float *q, int64_t qs, int G, int c0, int rc, int hd) {
    for (int r = 0; r < rc; r++) pack_pairs(dst + r * (hd / 2), q + (int64_t)((c0 + r) / G) * qs + ((c0 + r) % G) * hd, hd);
}

/* The keys j0 .. j0 + 31 (fewer at the end of n) transposed into kT
 * (keys_t32_dp), the next block's rows fetched meanwhile (as
 * attn_scores_t); returns how many keys the block holds */
static int64_t keys_block(uint32_t *kT, const void *k, int64_t j0, int64_t n, int hd) {
    const size_t rs = (size_t)hd * 2;
    const int64_t nk = n - j0 < 32 ? n - j0 : 32, nn = n - j0 - 32 < 32 ? n - j0 - 32 : 32;
    if (nn > 0) {
        const char *next = (const char *)k + (size_t)(j0 + 32) * rs;
        for (size_t o = 0; o < (size_t)nn * rs; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
    }
    keys_t32_dp(kT, (const uint16_t *)k + j0 * hd, nk, hd);
    return nk;
}

/* attn_scores_t's rows and keys (bf16 keys, bf16-valued queries) on
 * vdpbf16ps. Rows go in chunks whose packed queries fit the stack buffer
 * (each chunk transposes the keys again; one chunk up to 64 rows of 256). */
static int attn_scores_dp(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, int hd, const void *k,
                          int64_t n) {
    if (hd % 32 || hd > 512) return 0;
    uint32_t kT[256 * 32] __attribute__((aligned(64)));
    uint32_t qp[8192] __attribute__((aligned(64)));
    const int R = nt * G, hp = hd / 2, RC = (int)(sizeof qp / sizeof qp[0]) / hp;
    for (int c0 = 0; c0 < R; c0 += RC) {
        const int rc = R - c0 < RC ? R - c0 : RC;
        pack_query_rows(qp, q, qs, G, c0, rc, hd);
        float *Sc = S + (int64_t)c0 * lds;
        for (int64_t j0 = 0; j0 < n; j0 += 32) {
            const int64_t nk = keys_block(kT, k, j0, n, hd);
            int r = 0;
            for (; r + 8 <= rc; r += 8) score_rows_dp8(Sc + j0, lds, qp, r, kT, hd, nk);
            for (; r + 4 <= rc; r += 4) score_rows_dp4(Sc + j0, lds, qp, r, kT, hd, nk);
            for (; r + 2 <= rc; r += 2) score_rows_dp2(Sc + j0, lds, qp, r, kT, hd, nk);
            for (; r < rc; r++) score_rows_dp1(Sc + j0, lds, qp, r, kT, hd, nk);
        }
    }
    return 1;
}

/* The lanes e < 16 whose key j + e lies in [0, n) */
static inline __mmask16 key_lanes(int64_t j, int64_t n) {
    const int64_t lo = j < 0 ? -j : 0, hi = n - j < 16 ? n - j : 16;
    if (hi <= lo) return 0;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* attn_scores_t's rows and keys (bf16 keys, bf16-valued queries) on AMX
 * tiles: the queries as bf16 rows (pack_pairs: exact), the keys 32 at a time
 * in attn_scores_dp's kT layout ([hd/2][32] pairs: the B operand of
 * TDPBF16PS, keys 0-15 and 16-31 64 bytes apart in rows of 128), 32 rows
 * × 32 keys a block in four C tiles over hd/32 k steps
 * (PT_CPU_AMX_GROUP, cpu_internal.h), stored and copied into S. A score is
 * the tile unit's sum over its own row and key, so its bits depend on
 * neither the block nor the other rows and keys; rows past the call's are
 * zero and their results dropped. Keys outer, rows inner: each key block is
 * transposed once for all the call's rows. */
static int attn_scores_amx(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, int hd, const void *k,
                           int64_t n) {
    enum { QB = 8192 }; /* bf16 values of packed queries: 64 rows of 128 dims, 32 of 256 */
    if (hd % 32 || hd > 256) return 0;
    uint32_t kT[128 * 32] __attribute__((aligned(64)));
    uint16_t qb[QB] __attribute__((aligned(64)));
    float cb[1024] __attribute__((aligned(64)));
    const int R = nt * G, RC = QB / hd / 32 * 32; /* rows a chunk: whole 32-row blocks */
    const size_t rs = (size_t)hd * 2;
    pt_cpu_amx_config(64, 16);
    for (int c0 = 0; c0 < R; c0 += RC) {
        const int rc = R - c0 < RC ? R - c0 : RC, rp = (rc + 31) / 32 * 32;
        pack_query_rows((uint32_t *)qb, q, qs, G, c0, rc, hd);
        memset(qb + (size_t)rc * hd, 0, (size_t)(rp - rc) * rs);
        float *Sc = S + (int64_t)c0 * lds;
        for (int64_t j0 = 0; j0 < n; j0 += 32) {
            const int64_t nk = keys_block(kT, k, j0, n, hd);
            const __mmask16 m0 = key_lanes(0, nk), m1 = key_lanes(16, nk);
            for (int r0 = 0; r0 < rc; r0 += 32) {
                PT_CPU_AMX_GROUP(bf16, qb + (size_t)r0 * hd, 16 * rs, 64, rs, kT, 2048, hd / 32, cb);
                /* cb [row half][key half][16][16] */
                for (int r = 0; r < 32 && r0 + r < rc; r++) {
                    const float *c = cb + (r / 16) * 512 + (r % 16) * 16;
                    float *dst = Sc + (int64_t)(r0 + r) * lds + j0;
                    _mm512_mask_storeu_ps(dst, m0, _mm512_load_ps(c));
                    if (m1) _mm512_mask_storeu_ps(dst + 16, m1, _mm512_load_ps(c + 256));
                }
            }
        }
    }
    PT_CPU_AMX_RELEASE();
    return 1;
}

/* acc[r·hd + d] += Σ_{j<n} P[r·ldp + j]·v_j[d] for R rows of bf16-valued
 * probabilities over n bf16 rows, on AMX tiles. The keys sit from slot
 * `lead` (0..31) of the first 32-key step on (the slots before and past
 * them zero in both operands), so a caller passing the first key's position
 * mod 32 gets every key into the same step and pair whatever the call's
 * first key. Per chunk of KC slots: the value rows interleaved in key pairs
 * ([KC/2][hd] pairs: TDPBF16PS's B operand, rows of 16 dims 4·hd bytes
 * apart), each 16-row block's probabilities as bf16 rows (exact: they hold
 * bf16 values; A), and per 64 dims four C tiles loaded from acc, one step
 * of 32 slots at a time, stored back. Each output element is the tile
 * unit's f32 sum of its own row's products (AMX's rounding of that sum). */
static int attn_pv_amx(float *acc, const float *P, int64_t ldp, int R, int hd, const void *v, int64_t n, int lead) {
    enum { VP = 16384, KMAX = 512 }; /* pairs of the value chunk (64 KiB); slots a chunk at most */
    if (hd % 64 || hd > 256 || lead < 0 || lead > 31) return 0;
    uint32_t vp[VP] __attribute__((aligned(64)));
    uint16_t pb[16 * KMAX] __attribute__((aligned(64)));
    const int64_t KC = 2 * VP / hd < KMAX ? 2 * VP / hd : KMAX; /* 512 slots at hd 64, 256 at 128, 128 at 256 */
    float cb[16 * 64] __attribute__((aligned(64)));
    const uint16_t *vr = v;
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                            6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0),
                  hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    const int64_t slots = lead + n;
    const long sc = 256; /* C rows in cb: 64 floats */
    pt_cpu_amx_config(64, 16);
    for (int64_t s0 = 0; s0 < slots; s0 += KC) {
        const int64_t ns = slots - s0 < KC ? slots - s0 : KC, ns32 = (ns + 31) / 32 * 32;
        for (int64_t i = 0; i < ns32 / 2; i++) { /* slot s holds key s − lead */
            const int64_t j0 = s0 + 2 * i - lead, j1 = j0 + 1;
            const int ok0 = j0 >= 0 && j0 < n, ok1 = j1 >= 0 && j1 < n;
            for (int d = 0; d < hd; d += 32) {
                const __m512i a = ok0 ? _mm512_loadu_si512((const void *)(vr + j0 * hd + d)) : _mm512_setzero_si512();
                const __m512i b = ok1 ? _mm512_loadu_si512((const void *)(vr + j1 * hd + d)) : _mm512_setzero_si512();
                _mm512_store_si512((void *)(vp + i * hd + d), _mm512_permutex2var_epi16(a, lo_idx, b));
                _mm512_store_si512((void *)(vp + i * hd + d + 16), _mm512_permutex2var_epi16(a, hi_idx, b));
            }
        }
        const long sa = (long)ns32 * 2, sb = (long)hd * 4;
        for (int r0 = 0; r0 < R; r0 += 16) {
            for (int r = 0; r < 16; r++)
                for (int64_t s = 0; s < ns32; s += 32) {
                    __m512 x0 = _mm512_setzero_ps(), x1 = x0;
                    if (r0 + r < R) {
                        const int64_t j = s0 + s - lead; /* the key of slot s */
                        const float *pr = P + (int64_t)(r0 + r) * ldp + j;
                        x0 = _mm512_maskz_loadu_ps(key_lanes(j, n), pr);
                        x1 = _mm512_maskz_loadu_ps(key_lanes(j + 16, n), pr + 16);
                    }
                    _mm512_store_si512((void *)(pb + r * ns32 + s), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
                }
            for (int d0 = 0; d0 < hd; d0 += 64) {
                for (int r = 0; r < 16; r++)
                    for (int t = 0; t < 4; t++)
                        _mm512_store_ps(cb + r * 64 + 16 * t, r0 + r < R ? _mm512_loadu_ps(acc + (int64_t)(r0 + r) * hd +
                                                                                            d0 + 16 * t)
                                                                         : _mm512_setzero_ps());
                __asm__ volatile("tileloadd (%0,%4,1), %%tmm0\n\ttileloadd (%1,%4,1), %%tmm1\n\t"
                                 "tileloadd (%2,%4,1), %%tmm2\n\ttileloadd (%3,%4,1), %%tmm3"
                                 :
                                 : "r"(cb), "r"(cb + 16), "r"(cb + 32), "r"(cb + 48), "r"(sc)
                                 : "memory");
                for (int64_t k = 0; k < ns32; k += 32) {
                    const char *a = (const char *)(pb + k), *b = (const char *)(vp + (k / 2) * hd + d0);
                    __asm__ volatile("tileloadd (%0,%5,1), %%tmm4\n\t"
                                     "tileloadd (%1,%6,1), %%tmm5\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm0\n\t"
                                     "tileloadd (%2,%6,1), %%tmm6\n\ttdpbf16ps %%tmm6, %%tmm4, %%tmm1\n\t"
                                     "tileloadd (%3,%6,1), %%tmm7\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm2\n\t"
                                     "tileloadd (%4,%6,1), %%tmm5\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm3"
                                     :
                                     : "r"(a), "r"(b), "r"(b + 64), "r"(b + 128), "r"(b + 192), "r"(sa), "r"(sb)
                                     : "memory");
                }
                __asm__ volatile("tilestored %%tmm0, (%0,%4,1)\n\ttilestored %%tmm1, (%1,%4,1)\n\t"
                                 "tilestored %%tmm2, (%2,%4,1)\n\ttilestored %%tmm3, (%3,%4,1)"
                                 :
                                 : "r"(cb), "r"(cb + 16), "r"(cb + 32), "r"(cb + 48), "r"(sc)
                                 : "memory");
                for (int r = 0; r < 16 && r0 + r < R; r++)
                    for (int t = 0; t < 4; t++)
                        _mm512_storeu_ps(acc + (int64_t)(r0 + r) * hd + d0 + 16 * t, _mm512_load_ps(cb + r * 64 + 16 * t));
            }
        }
    }
    PT_CPU_AMX_RELEASE();
    return 1;
}

/* p·V for B heads over bf16 rows, 64 dims at a time: two keys' rows
 * interleaved as pairs (unpacklo / unpackhi of 16-bit words), so each
 * 32-dim half of a block sits in two accumulators, dims {8L + 0..3} ("lo")
 * and {8L + 4..7} ("hi") for L = 0..3, brought in and out of that order once
 * per block; each head's probabilities packed as pairs 32 keys at a time. */
#define PV_DP(B)                                                                                              \
    static void pv_dp_b##B(float *out, const float *P, int64_t ldp, int hd, const uint16_t *v, int64_t n) {  \
        const __m512i lo_in = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),    \
                      hi_in = _mm512_add_epi32(lo_in, _mm512_set1_epi32(4)),                                  \
                      out0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),       \
                      out1 = _mm512_add_epi32(out0, _mm512_set1_epi32(8));                                    \
        const __m512i z = _mm512_setzero_si512();                                                             \
        for (int d0 = 0; d0 < hd; d0 += 64) {                                                                 \
            __m512 o[B][4];                                                                                   \
            for (int g = 0; g < B; g++)                                                                       \
                for (int h = 0; h < 2; h++) {                                                                 \
                    const float *src = out + g * hd + d0 + 32 * h;                                            \
                    const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);                   \
                    o[g][2 * h] = _mm512_permutex2var_ps(v0, lo_in, v1);                                      \
                    o[g][2 * h + 1] = _mm512_permutex2var_ps(v0, hi_in, v1);                                  \
                }                                                                                             \
            for (int64_t j0 = 0; j0 < n; j0 += 32) {                                                          \
                const int64_t nb = n - j0 < 32 ? n - j0 : 32;                                                 \
                const __mmask16 m0 = nb >= 16 ? 0xffff : tail_mask(nb),                                       \
                                m1 = nb >= 32 ? 0xffff : nb <= 16 ? 0 : tail_mask(nb - 16);                   \
                uint32_t pk[B][16] __attribute__((aligned(64)));                                              \
                for (int g = 0; g < B; g++)                                                                   \
                    _mm512_store_si512((void *)pk[g],                                                         \
                                       (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, P + g * ldp + j0 + 16), \
                                                                    _mm512_maskz_loadu_ps(m0, P + g * ldp + j0))); \
                for (int64_t t = 0; 2 * t < nb; t++) {                                                        \
                    const uint16_t *ra = v + (j0 + 2 * t) * hd + d0;                                          \
                    const int two = 2 * t + 1 < nb;                                                           \
                    const __m512i a0 = _mm512_loadu_si512((const void *)ra),                                  \
                                  a1 = _mm512_loadu_si512((const void *)(ra + 32)),                           \
                                  b0 = two ? _mm512_loadu_si512((const void *)(ra + hd)) : z,                 \
                                  b1 = two ? _mm512_loadu_si512((const void *)(ra + hd + 32)) : z;            \
                    const __m512bh l0 = (__m512bh)_mm512_unpacklo_epi16(a0, b0),                              \
                                   h0 = (__m512bh)_mm512_unpackhi_epi16(a0, b0),                              \
                                   l1 = (__m512bh)_mm512_unpacklo_epi16(a1, b1),                              \
                                   h1 = (__m512bh)_mm512_unpackhi_epi16(a1, b1);                              \
                    for (int g = 0; g < B; g++) {                                                             \
                        const __m512bh pp = (__m512bh)_mm512_set1_epi32((int)pk[g][t]);                       \
                        o[g][0] = _mm512_dpbf16_ps(o[g][0], pp, l0);                                          \
                        o[g][1] = _mm512_dpbf16_ps(o[g][1], pp, h0);                                          \
                        o[g][2] = _mm512_dpbf16_ps(o[g][2], pp, l1);                                          \
                        o[g][3] = _mm512_dpbf16_ps(o[g][3], pp, h1);                                          \
                    }                                                                                         \
                }                                                                                             \
            }                                                                                                 \
            for (int g = 0; g < B; g++)                                                                       \
                for (int h = 0; h < 2; h++) {                                                                 \
                    float *dst = out + g * hd + d0 + 32 * h;                                                  \
                    _mm512_storeu_ps(dst, _mm512_permutex2var_ps(o[g][2 * h], out0, o[g][2 * h + 1]));        \
                    _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(o[g][2 * h], out1, o[g][2 * h + 1]));   \
                }                                                                                             \
        }                                                                                                     \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
PV_DP(4)
PV_DP(2)
PV_DP(1)
#pragma GCC pop_options

static int attn_pv_dp(float *out, const float *P, int64_t ldp, int G, int hd, const void *v, int64_t n) {
    if (hd % 64) return 0;
    int g = 0;
    for (; g + 4 <= G; g += 4) pv_dp_b4(out + g * hd, P + g * ldp, ldp, hd, v, n);
    for (; g + 2 <= G; g += 2) pv_dp_b2(out + g * hd, P + g * ldp, ldp, hd, v, n);
    for (; g < G; g++) pv_dp_b1(out + g * hd, P + g * ldp, ldp, hd, v, n);
    return 1;
}

/* ---- --fused-decode-attn's products on vdpbf16ps (fused_scores_dp, fused_pv_dp) ----
 * The L3 fused kernel (attn_qkv_fused.c) over a quantized cache with the
 * dequantization factored out of the products, as the CUDA fused kernel
 * does: a code is a small integer, and a nibble n OR-ed into 0x4300 is the
 * bf16 value 128 + n, so one mask-and-or of a code word gives 16 lanes of two
 * exact bf16 operands and one vdpbf16ps adds two products to each lane:
 *   scores: lane = key, the pair = two dims (pt_cpu_fq_prep's query pairs:
 *           nibbles i and i + 4 of a word); per group b
 *           S += sc·D + (bi − K·sc)·qs_b, D the pair chain over the group's
 *           words from zero, qs_b = Σ q over the group;
 *   P·V:    lane = dim, the pair = two keys (rows 2t, 2t + 1); per head and
 *           group the pair operand w = bf16(p·sc), and once per call
 *           out += acc + (Σ p·bi − K·Σ w).
 * K = 128 for 4 bits. For 8 bits the scores take a byte as lo + 16·hi, its
 * two nibbles separate pair entries with the coefficients q and 16·q (exact
 * in bf16), so K = 128·17 there; P·V takes the byte itself, exact in bf16 as
 * its f32's high half (K = 0). Code words are read as stored (no dequantized rows), 16
 * keys a vector for the scores after a 16 × 16 transpose of the words (4 or
 * 2 key sets a transpose for rows of 4 or 8 words), 16 bytes of two rows a
 * vector for P·V. The only rounding besides the f32 sums is w's; the
 * fused lever's gate (tests/test_l3_gate.c, tests/test_kv_fused.c) bounds
 * the difference from the exact path. */
#define FQ_K4 128.0f
#define FQ_K8 2176.0f

/* (x >> sh) & 0x000F000F | 0x43004300: nibbles sh/4 and sh/4 + 4 of each
 * lane's word as the bf16 pair (128 + n_lo, 128 + n_hi) */
static inline __m512bh fq_pair(__m512i x, int sh) {
    const __m512i v = sh ? _mm512_srli_epi32(x, (unsigned)sh) : x;
    return (__m512bh)_mm512_ternarylogic_epi32(v, _mm512_set1_epi32(0x000F000F), _mm512_set1_epi32(0x43004300), 0xEA);
}

/* Scores of 16 keys (one transposed set: wT[w·16 + lane] = word w of key
 * lane) for B heads from g0 */
static inline __attribute__((always_inline)) void fq_scores16(float *S, int64_t lds, const uint32_t *qp,
                                                               const float *qs, const uint32_t *wT, const float *sv,
                                                               const float *bv, int nk, int ng, int wpg, int npair,
                                                               float K, const int B) {
    /* D of each head in NA chains (pairs 0, 1 | 2, 3 of a word: NA = 2; each pair its own: NA = 4), so
     * that enough dot products are in flight */
    const int NA = B <= 4 ? 4 : 2;
    __m512 s[8], d[8][4];
    for (int g = 0; g < B; g++) s[g] = _mm512_setzero_ps();
    for (int b = 0; b < ng; b++) {
        for (int g = 0; g < B; g++)
            for (int a = 0; a < NA; a++) d[g][a] = _mm512_setzero_ps();
        for (int w = b * wpg; w < (b + 1) * wpg; w++) {
            const __m512i x = _mm512_load_si512((const void *)(wT + w * 16));
            const __m512bh p[4] = {fq_pair(x, 0), fq_pair(x, 4), fq_pair(x, 8), fq_pair(x, 12)};
            for (int g = 0; g < B; g++) {
                const uint32_t *qg = qp + (size_t)g * npair + 4 * w;
                for (int i = 0; i < 4; i++)
                    d[g][i % NA] = _mm512_dpbf16_ps(d[g][i % NA], p[i], (__m512bh)_mm512_set1_epi32((int)qg[i]));
            }
        }
        const __m512 sc = _mm512_load_ps(sv + b * 16), cb = _mm512_fnmadd_ps(_mm512_set1_ps(K), sc, _mm512_load_ps(bv + b * 16));
        for (int g = 0; g < B; g++) {
            __m512 dg = _mm512_add_ps(d[g][0], d[g][1]);
            if (NA == 4) dg = _mm512_add_ps(dg, _mm512_add_ps(d[g][2], d[g][3]));
            s[g] = _mm512_fmadd_ps(sc, dg, s[g]);
            s[g] = _mm512_fmadd_ps(cb, _mm512_set1_ps(qs[g * ng + b]), s[g]);
        }
    }
    const __mmask16 m = nk >= 16 ? (__mmask16)0xffff : tail_mask(nk);
    for (int g = 0; g < B; g++) _mm512_mask_storeu_ps(S + g * lds, m, s[g]);
}
#define FQ_SCORES16(B)                                                                                             \
    static void fq_scores16_b##B(float *S, int64_t lds, const uint32_t *qp, const float *qs, const uint32_t *wT,  \
                                 const float *sv, const float *bv, int nk, int ng, int wpg, int npair, float K) {  \
        fq_scores16(S, lds, qp, qs, wT, sv, bv, nk, ng, wpg, npair, K, B);                                        \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
FQ_SCORES16(8)
FQ_SCORES16(4)
FQ_SCORES16(2)
FQ_SCORES16(1)
#pragma GCC pop_options

static int fused_scores_dp(float *S, int64_t lds, const uint32_t *qp, const float *qs, int G, const pt_cpu_qrows *k,
                           int64_t n) {
    const int bits = k->bits, hd = k->hd, gs = k->gs;
    if ((bits != 4 && bits != 8) || hd % 32 || hd > 512 || gs % 32 || k->dt != PT_FT_BF16) return 0;
    const int nw = hd * bits / 32, wpg = gs * bits / 32, ng = hd / gs, npair = hd * bits / 8;
    const int R = nw == 4 ? 4 : nw == 8 ? 2 : 1; /* key sets a transpose */
    const float K = bits == 4 ? FQ_K4 : FQ_K8;
    const size_t rb = (size_t)nw * 4;
    uint32_t wT[128 * 16] __attribute__((aligned(64))); /* [set][word][lane] (R·nw = 16) or [word][lane] */
    float sv[256] __attribute__((aligned(64))), bv[256] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < n; j0 += 16 * R) {
        const int64_t nkb = n - j0 < 16 * R ? n - j0 : 16 * R, nn = n - j0 - 16 * R < 16 * R ? n - j0 - 16 * R : 16 * R;
        const pt_cpu_qrows blk = pt_cpu_qrows_at(k, j0);
        if (nn > 0) pt_cpu_qrows_prefetch(k, j0 + 16 * R, nn); /* the next block's codes and parameters */
        /* key c of set r is row 16r + c (past the block's keys: its last key again, never stored) */
        if (R > 1) {
            __m512 a[16];
            for (int c = 0; c < 16; c++) {
                const uint8_t *row[4];
                for (int r = 0; r < R; r++) row[r] = blk.codes + (size_t)(16 * r + c < nkb ? 16 * r + c : nkb - 1) * rb;
                __m512i v;
                if (R == 2)
                    v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)row[0])),
                                           _mm256_loadu_si256((const __m256i *)row[1]), 1);
                else {
                    v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)row[0]));
                    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)row[1]), 1);
                    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)row[2]), 2);
                    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)row[3]), 3);
                }
                a[c] = _mm512_castsi512_ps(v);
            }
            transpose16(a); /* a[r·nw + w] = word w of set r's keys */
            for (int i = 0; i < 16; i++) _mm512_store_ps((float *)wT + i * 16, a[i]);
        } else
            for (int w0 = 0; w0 < nw; w0 += 16) {
                const int cnt = nw - w0 < 16 ? nw - w0 : 16;
                const __mmask16 m = cnt == 16 ? (__mmask16)0xffff : tail_mask(cnt);
                __m512 a[16];
                for (int c = 0; c < 16; c++)
                    a[c] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(
                        m, blk.codes + (size_t)(c < nkb ? c : nkb - 1) * rb + 4 * (size_t)w0));
                transpose16(a);
                /* all 16 (past cnt: never read; wT has room, w0 + 16 <= 128): a loop to a run-time count was
                 * compiled as a copy through the stack */
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) _mm512_store_ps((float *)wT + (w0 + i) * 16, a[i]);
            }
        for (int r = 0; r < R; r++) {
            const int nk = nkb - 16 * r > 16 ? 16 : (int)(nkb - 16 * r);
            if (nk <= 0) break;
            qparams16(sv, bv, k, j0 + 16 * r, nk, 1);
            const uint32_t *w = wT + (size_t)r * nw * 16;
            float *Sr = S + j0 + 16 * r;
            int g = 0;
            for (; g + 8 <= G; g += 8) fq_scores16_b8(Sr + g * lds, lds, qp + (size_t)g * npair, qs + g * ng, w, sv, bv, nk, ng, wpg, npair, K);
            for (; g + 4 <= G; g += 4) fq_scores16_b4(Sr + g * lds, lds, qp + (size_t)g * npair, qs + g * ng, w, sv, bv, nk, ng, wpg, npair, K);
            for (; g + 2 <= G; g += 2) fq_scores16_b2(Sr + g * lds, lds, qp + (size_t)g * npair, qs + g * ng, w, sv, bv, nk, ng, wpg, npair, K);
            for (; g < G; g++) fq_scores16_b1(Sr + g * lds, lds, qp + (size_t)g * npair, qs + g * ng, w, sv, bv, nk, ng, wpg, npair, K);
        }
    }
    return 1;
}

/* 16 bytes of rows a and b as 16 lanes a[m] | b[m] << 16 */
static inline __m512i fq_rows16(const uint8_t *a, const uint8_t *b) {
    return _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)a)),
                           _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b)), 16));
}
/* 16 bytes of rows a and b as the bf16 pairs (a[m], b[m]) (a byte is exact in bf16: its f32's high half) */
static inline __m512bh fq_rows16_bf16(const uint8_t *a, const uint8_t *b) {
    const __m512i fa = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)a)))),
                  fb = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b))));
    return (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(fa, 16), fb, _mm512_set1_epi32((int)0xffff0000u), 0xF8);
}

/* One key pair (rows ra and rb, 16-byte chunks from each) of a P·V slice
 * of NC chunks: its pair vectors, then each head's products with the pair's
 * w (head g, vector i: wb[g·256 + off[i]], wb = the pair's entry of wp) */
static inline __attribute__((always_inline)) void fq_pv_pair(__m512 (*o)[4], const uint8_t *ra, const uint8_t *rb,
                                                             const uint32_t *wb, const int *off, const int B,
                                                             const int bits, const int NC, const int one) {
    const int nvec = bits == 4 ? 2 * NC : NC;
    __m512bh x[4];
    for (int c = 0; c < NC; c++) {
        if (bits == 4) {
            const __m512i r = fq_rows16(ra + 16 * c, rb + 16 * c);
            x[2 * c] = fq_pair(r, 0), x[2 * c + 1] = fq_pair(r, 4);
        } else
            x[c] = fq_rows16_bf16(ra + 16 * c, rb + 16 * c);
    }
    for (int g = 0; g < B; g++) {
        const __m512bh w0 = (__m512bh)_mm512_set1_epi32((int)wb[g * 256 + off[0]]);
        for (int i = 0; i < nvec; i++)
            o[g][i] = _mm512_dpbf16_ps(o[g][i], x[i],
                                       one ? w0 : (__m512bh)_mm512_set1_epi32((int)wb[g * 256 + off[i]]));
    }
}

/* The block's nb keys of a slice, a pair at a time (an odd last key with a
 * zero row: its pair's w is 0); one: every vector of the slice in one group
 * (one broadcast a head) */
static inline __attribute__((always_inline)) void fq_pv_keys(__m512 (*o)[4], const uint8_t *c0, size_t rb, int64_t nb,
                                                             const uint32_t *wp, const int *off, const int B,
                                                             const int bits, const int NC, const int one) {
    static const uint8_t zero[64] __attribute__((aligned(64)));
    int64_t t = 0;
    for (; 2 * t + 1 < nb; t++) {
        const uint8_t *ra = c0 + (size_t)(2 * t) * rb;
        fq_pv_pair(o, ra, ra + rb, wp + t, off, B, bits, NC, one);
    }
    if (2 * t < nb) fq_pv_pair(o, c0 + (size_t)(2 * t) * rb, zero, wp + t, off, B, bits, NC, one);
}

/* A slice of NC chunks (4 bits: vectors even, odd of each; 8 bits: one
 * each) over the block's nb keys: accumulators a[g] [vectors][16]; wp
 * [head][group][key pair] */
static inline __attribute__((always_inline)) void fq_pv_slice(float *const *a, const uint8_t *c0, size_t rb, int64_t nb,
                                                              const uint32_t *wp, int s0, int cd, int gs, const int B,
                                                              const int bits, const int NC) {
    const int nvec = bits == 4 ? 2 * NC : NC;
    __m512 o[4][4];
    int off[4];
    for (int i = 0; i < nvec; i++) off[i] = (s0 + (bits == 4 ? i / 2 : i)) * cd / gs * 16;
    for (int g = 0; g < B; g++)
        for (int i = 0; i < nvec; i++) o[g][i] = _mm512_load_ps(a[g] + 16 * i);
    if (off[0] == off[nvec - 1]) fq_pv_keys(o, c0, rb, nb, wp, off, B, bits, NC, 1); /* the slice in one group */
    else fq_pv_keys(o, c0, rb, nb, wp, off, B, bits, NC, 0);
    for (int g = 0; g < B; g++)
        for (int i = 0; i < nvec; i++) _mm512_store_ps(a[g] + 16 * i, o[g][i]);
}

/* P·V of B heads over n keys, in blocks of 32: per head and group the 16
 * key pairs' w = bf16(p·sc) and the lanes of Σ p·bi and Σ w; then the
 * rows' 16-byte chunks against them, a slice of 4 vectors a head at a time
 * (4 bits: two chunks, each as its even dims 2m and its odd dims 2m + 1
 * of 32 — nibble pairs (128 + n) — 8 bits: four chunks of 16 dims, bytes
 * as bf16) into the accumulators acc (per head in that order), carried
 * across the blocks; last, out += acc (in dim order) + the group's
 * Σ p·bi − K·Σ w (K = 128 for 4 bits, 0 for 8; each sum's 16 lanes added in
 * lane order). */
static inline __attribute__((always_inline)) void fq_pv(float *out, const float *P, int64_t ldp,
                                                        const pt_cpu_qrows *v, int64_t n, const int B, const int bits) {
    const int hd = v->hd, gs = v->gs, ng = hd / gs, nch = hd * bits / 128, cd = 128 / bits, cps = bits == 4 ? 2 : 4;
    const float K = bits == 4 ? FQ_K4 : 0.0f;
    const size_t rb = (size_t)hd * bits / 8;
    float acc[4][512] __attribute__((aligned(64)));
    float sb[4][16][16] __attribute__((aligned(64))), sw[4][16][16] __attribute__((aligned(64)));
    uint32_t wp[4][16][16] __attribute__((aligned(64)));
    float sv[2][256] __attribute__((aligned(64))), bv[2][256] __attribute__((aligned(64)));
    for (int g = 0; g < B; g++) {
        memset(acc[g], 0, sizeof(float) * (size_t)hd);
        memset(sb[g], 0, sizeof(float) * 16 * (size_t)ng);
        memset(sw[g], 0, sizeof(float) * 16 * (size_t)ng);
    }
    const __m512i hmask = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int64_t nb = n - j0 < 32 ? n - j0 : 32;
        const int n0 = nb > 16 ? 16 : (int)nb, n1 = (int)nb - n0;
        qparams16(sv[0], bv[0], v, j0, n0, 1);
        qparams16(sv[1], bv[1], v, j0 + 16, n1, 1);
        const __mmask16 m0 = n0 >= 16 ? (__mmask16)0xffff : tail_mask(n0),
                        m1 = n1 >= 16 ? (__mmask16)0xffff : tail_mask(n1);
        for (int g = 0; g < B; g++) {
            const __m512 p0 = _mm512_maskz_loadu_ps(m0, P + g * ldp + j0),
                         p1 = _mm512_maskz_loadu_ps(m1, P + g * ldp + j0 + 16);
            for (int b = 0; b < ng; b++) {
                /* lane t: keys 2t (low half) and 2t + 1 of the block */
                const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(p1, _mm512_load_ps(sv[1] + b * 16)),
                                                               _mm512_mul_ps(p0, _mm512_load_ps(sv[0] + b * 16)));
                const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)),
                             wo = _mm512_castsi512_ps(_mm512_and_si512(w, hmask));
                _mm512_store_si512((void *)wp[g][b], w);
                _mm512_store_ps(sw[g][b], _mm512_add_ps(_mm512_load_ps(sw[g][b]), _mm512_add_ps(we, wo)));
                const __m512 s = _mm512_fmadd_ps(p0, _mm512_load_ps(bv[0] + b * 16), _mm512_load_ps(sb[g][b]));
                _mm512_store_ps(sb[g][b], _mm512_fmadd_ps(p1, _mm512_load_ps(bv[1] + b * 16), s));
            }
        }
        const uint8_t *c0 = v->codes + (size_t)j0 * rb;
        if (n - j0 > 32) /* the next block's codes and parameters */
            pt_cpu_qrows_prefetch(v, j0 + 32, n - j0 - 32 < 32 ? n - j0 - 32 : 32);
        for (int s0 = 0; s0 < nch; s0 += cps) {
            const int ncs = nch - s0 < cps ? nch - s0 : cps;
            const int base = s0 * (bits == 4 ? 32 : 16);
            float *a[4] = {acc[0] + base, acc[1] + base, acc[2] + base, acc[3] + base};
            const uint8_t *cs = c0 + s0 * 16;
            /* a partial slice: 4 bits one chunk, 8 bits two (hd % 32 == 0: an even number of chunks) */
            if (ncs == cps) fq_pv_slice(a, cs, rb, nb, &wp[0][0][0], s0, cd, gs, B, bits, bits == 4 ? 2 : 4);
            else fq_pv_slice(a, cs, rb, nb, &wp[0][0][0], s0, cd, gs, B, bits, bits == 4 ? 1 : 2);
        }
    }
    for (int g = 0; g < B; g++) {
        float corr[16];
        for (int b = 0; b < ng; b++) {
            float a = 0.0f, z = 0.0f;
            for (int l = 0; l < 16; l++) a += sb[g][b][l], z += sw[g][b][l];
            corr[b] = fmaf(-K, z, a);
        }
        float *y = out + g * hd;
        const float *a = acc[g];
        for (int b = 0, e0 = 0; b < ng; b++) { /* 16 dims at a time, a group's dims a whole number of 16s */
            const __m512 cr = _mm512_set1_ps(corr[b]);
            for (; e0 < (b + 1) * gs; e0 += 16) {
                __m512 v;
                if (bits == 4) { /* chunk c = e0/32: a[32c + m] is dim 32c + 2m, a[32c + 16 + m] dim 32c + 2m + 1 */
                    const int c = e0 / 32, h = e0 % 32 / 16;
                    v = _mm512_permutex2var_ps(_mm512_load_ps(a + 32 * c),
                                               h ? _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14,
                                                                     30, 15, 31)
                                                 : _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22,
                                                                     7, 23),
                                               _mm512_load_ps(a + 32 * c + 16));
                } else
                    v = _mm512_load_ps(a + e0);
                _mm512_storeu_ps(y + e0, _mm512_add_ps(_mm512_loadu_ps(y + e0), _mm512_add_ps(v, cr)));
            }
        }
    }
}
#define FQ_PV(B)                                                                                                   \
    static void fq_pv4_b##B(float *out, const float *P, int64_t ldp, const pt_cpu_qrows *v, int64_t n) {         \
        fq_pv(out, P, ldp, v, n, B, 4);                                                                            \
    }                                                                                                              \
    static void fq_pv8_b##B(float *out, const float *P, int64_t ldp, const pt_cpu_qrows *v, int64_t n) {         \
        fq_pv(out, P, ldp, v, n, B, 8);                                                                            \
    }
#pragma GCC push_options
#pragma GCC optimize("unroll-loops")
FQ_PV(4)
FQ_PV(2)
FQ_PV(1)
#pragma GCC pop_options

static int fused_pv_dp(float *out, const float *P, int64_t ldp, int G, const pt_cpu_qrows *v, int64_t n) {
    static const qpv_fn f4[3] = {fq_pv4_b4, fq_pv4_b2, fq_pv4_b1}, f8[3] = {fq_pv8_b4, fq_pv8_b2, fq_pv8_b1};
    const int hd = v->hd;
    if ((v->bits != 4 && v->bits != 8) || hd % 32 || hd > 512 || v->gs % 32 || v->dt != PT_FT_BF16) return 0;
    qpv_heads(v->bits == 4 ? f4 : f8, out, P, ldp, G, v, n);
    return 1;
}

/* ---- softmax of one attention row (no soft-cap) ----
 * s[j] = round(round(s[j])·scale) (bf16 mode: round = to bf16), then
 * p = exp(s − max) / Σ, rounded. exp is a degree-6 polynomial on
 * r = x − n·ln2 (|r| ≤ ln2/2; relative error ~2 ulp) scaled by 2^n with
 * vscalefps, which underflows to 0 cleanly for very negative x. */
static inline __m512 round_bf16_vec(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_or_ps(v, _mm512_castsi512_ps(_mm512_set1_epi32(0x400000))));
}

static inline __m512 exp_vec(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), ln2hi = _mm512_set1_ps(0.693359375f),
                 ln2lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2hi, x);
    r = _mm512_fnmadd_ps(n, ln2lo, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static void softmax_row(float *s, int64_t n, float scale, int bf16) {
    __m512 vs = _mm512_set1_ps(scale), vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : tail_mask(n - j);
        __m512 v = _mm512_maskz_loadu_ps(m, s + j);
        v = bf16 ? round_bf16_vec(_mm512_mul_ps(round_bf16_vec(v), vs)) : _mm512_mul_ps(v, vs);
        _mm512_mask_storeu_ps(s + j, m, v);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
    }
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax)), vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : tail_mask(n - j);
        __m512 e = exp_vec(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx));
        _mm512_mask_storeu_ps(s + j, m, e);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : tail_mask(n - j);
        __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inv);
        _mm512_mask_storeu_ps(s + j, m, bf16 ? round_bf16_vec(p) : p);
    }
}

static void softmax_part(float *s, int64_t n, int bf16, float *m, float *l) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : tail_mask(n - j);
        __m512 v = _mm512_maskz_loadu_ps(k, s + j);
        if (bf16) _mm512_mask_storeu_ps(s + j, k, v = round_bf16_vec(v));
        vmax = _mm512_mask_max_ps(vmax, k, vmax, v);
    }
    const float mx = _mm512_reduce_max_ps(vmax);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : tail_mask(n - j);
        const __m512 e = exp_vec(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), _mm512_set1_ps(mx)));
        _mm512_mask_storeu_ps(s + j, k, e);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(k, e));
    }
    *m = mx;
    *l = _mm512_reduce_add_ps(vsum);
}

/* SwiGLU (glu op, prefill and decode): silu(g) = g / (1 + exp(−g)) with
 * exp_vec and a true division, so the result is within a few ulp of the
 * scalar expf version (the op's tests hold both to 2e-6 in f32 mode). For
 * g < −88.7 exp overflows to +inf and g / inf = −0, as with expf; for
 * g > 104 exp_vec's clamp gives ~2^-150, i.e. silu(g) = g. Measured: the
 * scalar loop (one libm expf call per element) was most of the "other" ops
 * of a prefill (dev/README.md). */
static void silu_mul(float *y, const float *g, const float *u, int64_t n, int bf16) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp_vec(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        __m512 v = bf16 ? round_bf16_vec(_mm512_mul_ps(round_bf16_vec(s), uv)) : _mm512_mul_ps(s, uv);
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* RoPE of one head's first 2·half values in place: the operations of
 * cpu_ops.c's rope loop on 16 lanes (v[i] = r(r(a·c) + r(−b·s)), v[i + half]
 * = r(r(b·c) + r(a·s)) with a = v[i], b = v[i + half], r = the activation
 * rounding), so the same bits. */
static void rope_rot(float *v, const float *cs, const float *sn, int half, int bf16) {
    for (int i = 0; i < half; i += 16) {
        const __mmask16 m = half - i >= 16 ? (__mmask16)0xffff : tail_mask(half - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, v + i), b = _mm512_maskz_loadu_ps(m, v + half + i);
        const __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, sn + i);
        const __m512 nb = _mm512_xor_ps(b, _mm512_set1_ps(-0.0f)); /* −b: the sign flipped, as the scalar loop */
        __m512 p0 = _mm512_mul_ps(a, c), p1 = _mm512_mul_ps(nb, s), p2 = _mm512_mul_ps(b, c), p3 = _mm512_mul_ps(a, s);
        if (bf16)
            p0 = pt_cpu_round_bf16_x16(p0), p1 = pt_cpu_round_bf16_x16(p1), p2 = pt_cpu_round_bf16_x16(p2),
            p3 = pt_cpu_round_bf16_x16(p3);
        __m512 lo = _mm512_add_ps(p0, p1), hi = _mm512_add_ps(p2, p3);
        if (bf16) lo = pt_cpu_round_bf16_x16(lo), hi = pt_cpu_round_bf16_x16(hi);
        _mm512_mask_storeu_ps(v + i, m, lo);
        _mm512_mask_storeu_ps(v + half + i, m, hi);
    }
}

/* RMSNorm of 16 rows (D values each, rows D apart in y, x and res) with the
 * operations of cpu_ops.c's scalar loop: the residual h = round(h + x)
 * first, each row's sum of squares in order i = 0 … D − 1 in its own lane
 * (the squares of 16 columns transposed 16 × 16, then added one column at a
 * time; zeros past D add nothing), inv = 1 / sqrtf(ss / D + eps), then the
 * style's products with wf (the weights as f32) and roundings. */
static void rms_norm16(float *y, const float *x, float *res, int64_t D, const float *wf, int style, float eps,
                       int bf16) {
    const float *xr[16];
    for (int r = 0; r < 16; r++) {
        xr[r] = x + r * D;
        if (!res) continue;
        float *h = res + r * D;
        for (int64_t i = 0; i < D; i += 16) {
            const __mmask16 m = D - i >= 16 ? (__mmask16)0xffff : tail_mask(D - i);
            __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, h + i), _mm512_maskz_loadu_ps(m, x + r * D + i));
            _mm512_mask_storeu_ps(h + i, m, bf16 ? pt_cpu_round_bf16_x16(v) : v);
        }
        xr[r] = h;
    }
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
        const __mmask16 m = D - i >= 16 ? (__mmask16)0xffff : tail_mask(D - i);
        __m512 a[16];
        for (int r = 0; r < 16; r++) {
            const __m512 v = _mm512_maskz_loadu_ps(m, xr[r] + i);
            a[r] = _mm512_mul_ps(v, v);
        }
        transpose16(a);
        for (int j = 0; j < 16; j++) ss = _mm512_add_ps(ss, a[j]);
    }
    float sv[16];
    _mm512_storeu_ps(sv, ss);
    for (int r = 0; r < 16; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(sv[r] / (float)D + eps)), one = _mm512_set1_ps(1.0f);
        float *yr = y + r * D;
        for (int64_t i = 0; i < D; i += 16) {
            const __mmask16 m = D - i >= 16 ? (__mmask16)0xffff : tail_mask(D - i);
            const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr[r] + i), inv);
            const __m512 w = _mm512_maskz_loadu_ps(m, wf ? wf + i : xr[r] + i);
            __m512 o;
            switch (style) {
            case PT_RMS_W: o = _mm512_mul_ps(w, bf16 ? pt_cpu_round_bf16_x16(v) : v); break;
            case PT_RMS_W_F32: o = _mm512_mul_ps(v, w); break;
            case PT_RMS_1PW: o = _mm512_mul_ps(v, _mm512_add_ps(one, w)); break;
            default: o = v; break;
            }
            _mm512_mask_storeu_ps(yr + i, m, bf16 ? pt_cpu_round_bf16_x16(o) : o);
        }
    }
}

/* ---- int8 activations (L3 lever; AVX-512 VNNI on 256-bit vectors) ----
 * vpdpbusd multiplies 32 unsigned codes by 32 signed int8 activations and
 * adds groups of four into 8 int32 lanes: the dot of a 64-value 4-bit chunk
 * is two of them (low nibbles against the even x, high against the odd),
 * with no conversion to float until the end of a group. Integer sums are
 * exact; the only rounding is x's quantization. A 32-value group is half a
 * chunk: lanes 0-3 belong to the first group, 4-7 to the second. */
/* the four rows are spelled out (not arrays indexed in loops) so the sums
 * stay in registers */
#define I8_FOR4(X) X(0) X(1) X(2) X(3)

static inline float hsum256_ps(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}

static void qdot4_x4_i8(float *out, const int8_t *xq, const float *xd, const float *xs, const uint8_t *const *codes,
                        const float *const *sc, const float *const *bi, int64_t K, int gs) {
    if (K % 64) {
        pt_cpu_qdot4_x4_i8_ref(out, xq, xd, xs, codes, sc, bi, K, gs);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 4); /* see PF_LINE */
    const int nta = pt_cpu_lever.pfnta > 0;
    __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
#define Q4I_DOT(acc, cr)                                                                          \
    do {                                                                                          \
        __m256i cb_ = _mm256_loadu_si256((const __m256i *)((cr) + c / 2));                        \
        acc = _mm256_dpbusd_epi32(acc, _mm256_and_si256(cb_, m4), xe);                            \
        acc = _mm256_dpbusd_epi32(acc, _mm256_and_si256(_mm256_srli_epi16(cb_, 4), m4), xo);      \
    } while (0)
    if (gs == 32) {
        for (int64_t c = 0; c < K; c += 64) {
            int64_t g = c / 32;
            PF_LINE(pf + 2 * c); /* this step reads 4 × 32 bytes */
            PF_LINE(pf + 2 * c + 64);
            __m256i xe = _mm256_loadu_si256((const __m256i *)(xq + c)), xo = _mm256_loadu_si256((const __m256i *)(xq + c + 32));
            __m256 dv = _mm256_set_m128(_mm_set1_ps(xd[g + 1]), _mm_set1_ps(xd[g]));
#define Q4I_G32(r)                                                                                             \
    {                                                                                                          \
        __m256i acc = _mm256_setzero_si256();                                                                  \
        Q4I_DOT(acc, c##r);                                                                                    \
        __m256 sv = _mm256_set_m128(_mm_set1_ps(sc[r][g + 1]), _mm_set1_ps(sc[r][g]));                          \
        f##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sv, dv), f##r);                          \
    }
            I8_FOR4(Q4I_G32)
        }
    } else {
        for (int64_t g = 0; g < K / gs; g++) {
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t c = g * gs; c < (g + 1) * gs; c += 64) {
                PF_LINE(pf + 2 * c);
                PF_LINE(pf + 2 * c + 64);
                __m256i xe = _mm256_loadu_si256((const __m256i *)(xq + c)),
                        xo = _mm256_loadu_si256((const __m256i *)(xq + c + 32));
                Q4I_DOT(a0, c0);
                Q4I_DOT(a1, c1);
                Q4I_DOT(a2, c2);
                Q4I_DOT(a3, c3);
            }
            __m256 dg = _mm256_set1_ps(xd[g]);
#define Q4I_FIN(r) f##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a##r), _mm256_mul_ps(_mm256_set1_ps(sc[r][g]), dg), f##r);
            I8_FOR4(Q4I_FIN)
        }
    }
#define I8_OUT(r) out[r] = hsum256_ps(f##r) + dot_f32(bi[r], xs, K / gs);
    I8_FOR4(I8_OUT)
}

/* 512-bit version for K % 128 == 0: a 64-byte block of codes holds 128
 * values; its low nibbles (values 2b) against the 64 even x of the chunk,
 * its high nibbles against the 64 odd ones, two vpdpbusd per row. Lane i of
 * the int32 sums covers values 8i..8i+7, all in group (8i)/gs, so each lane
 * is converted once and scaled by its group's sc·xd (spread by vpermps, as
 * in qdot4_x4_bf16). Integer sums per lane are exact; only the f32 order
 * of the lanes' terms differs from qdot4_x4_i8. The accumulators go
 * through inline asm: gcc 12 moves every accumulator to another register and
 * back around _mm512_dpbusd_epi32 (see gemm_i8_avx512.c). */
#define DPBUSD512(acc, u8, s8) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8))
static void qdot4_x4_i8_128(float *out, const int8_t *xq, const float *xd, const float *xs,
                            const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                            int gs) {
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i sidx = gs == 32   ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                         : gs == 64 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                    : _mm512_setzero_si512();
    const __mmask8 smask = (__mmask8)((1u << (128 / gs)) - 1u);
    const int64_t gpb = 128 / gs;
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 4); /* see PF_LINE */
    const int nta = pt_cpu_lever.pfnta > 0;
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t b = 0, g = 0; b < K; b += 128, g += gpb) {
        PF_LINE(pf + 2 * b); /* this block reads 4 × 64 bytes */
        PF_LINE(pf + 2 * b + 64);
        PF_LINE(pf + 2 * b + 128);
        PF_LINE(pf + 2 * b + 192);
        __m512i xe = _mm512_loadu_si512((const void *)(xq + b)), xo = _mm512_loadu_si512((const void *)(xq + b + 64));
        __m512 d = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(smask, xd + g)));
#define QI_ROW(r)                                                                                                \
    {                                                                                                            \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                           \
        __m512i a_ = _mm512_setzero_si512();                                                                     \
        DPBUSD512(a_, _mm512_and_si512(v_, m4), xe);                                                             \
        DPBUSD512(a_, _mm512_and_si512(_mm512_srli_epi16(v_, 4), m4), xo);                                       \
        __m512 s_ = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(smask, sc[r] + g)));   \
        f##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), _mm512_mul_ps(s_, d), f##r);                              \
    }
        I8_FOR4(QI_ROW)
#undef QI_ROW
    }
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g += 16) { /* the bias term, exact group sums of x */
        __mmask16 m_ = ng - g >= 16 ? (__mmask16)0xffff : tail_mask(ng - g);
        __m512 xs_ = _mm512_maskz_loadu_ps(m_, xs + g);
#define QI_BIAS(r) f##r = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_, bi[r] + g), xs_, f##r);
        I8_FOR4(QI_BIAS)
#undef QI_BIAS
    }
    out[0] = _mm512_reduce_add_ps(f0);
    out[1] = _mm512_reduce_add_ps(f1);
    out[2] = _mm512_reduce_add_ps(f2);
    out[3] = _mm512_reduce_add_ps(f3);
}

static void qdot8_x4_i8(float *out, const int8_t *xq, const float *xd, const float *xs, const uint8_t *const *codes,
                        const float *const *sc, const float *const *bi, int64_t K, int gs) {
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 8); /* see PF_LINE */
    const int nta = pt_cpu_lever.pfnta > 0;
    __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t g = 0; g < K / gs; g++) {
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 32) {
            PF_LINE(pf + 4 * c); /* this step reads 4 × 32 bytes */
            PF_LINE(pf + 4 * c + 64);
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + c));
#define Q8I_DOT(r) a##r = _mm256_dpbusd_epi32(a##r, _mm256_loadu_si256((const __m256i *)(c##r + c)), xv);
            I8_FOR4(Q8I_DOT)
        }
        __m256 dg = _mm256_set1_ps(xd[g]);
        I8_FOR4(Q4I_FIN)
    }
    I8_FOR4(I8_OUT)
}

/* Prefill packing: 32 values per step, codes widened and converted, then
 * scale·q + bias with one FMA (the scalar version rounds twice; both are
 * within the tests' tolerance). */
static void dequant_q(float *dst, const uint8_t *row, int64_t k0, int64_t n, const float *sc, const float *bi, int gs,
                      int bits) {
    const __m512i m15 = _mm512_set1_epi32(15);
    for (int64_t b = 0; b < n; b += 32) {
        int64_t g = (k0 + b) / gs;
        __m512 s = _mm512_set1_ps(sc[g]), o = _mm512_set1_ps(bi[g]);
        __m512 q0, q1;
        if (bits == 8) {
            q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + k0 + b))));
            q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + k0 + b + 16))));
        } else {
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + (k0 + b) / 2)));
            q0 = _mm512_cvtepi32_ps(_mm512_and_si512(v, m15));
            q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
        }
        _mm512_storeu_ps(dst + b, _mm512_fmadd_ps(s, q0, o));
        _mm512_storeu_ps(dst + b + 16, _mm512_fmadd_ps(s, q1, o));
    }
}

/* 16 rows of 16 floats transposed in place: r[l] lane i = r[i] lane l
 * (unpack, then 4-float shuffles, then 128-bit chunk shuffles). */
static inline void tr16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4) { /* r[i + e]: element 4L + e of rows i … i + 3 in chunk L */
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44), r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44), r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int e = 0; e < 4; e++) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88), u1 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
        const __m512 u2 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xDD), u3 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xDD);
        t[e] = _mm512_shuffle_f32x4(u0, u1, 0x88), t[8 + e] = _mm512_shuffle_f32x4(u0, u1, 0xDD);
        t[4 + e] = _mm512_shuffle_f32x4(u2, u3, 0x88), t[12 + e] = _mm512_shuffle_f32x4(u2, u3, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* pt_cpu_group_sums_ref, 16 groups at a time (gs % 16 == 0): 16 values of
 * each group loaded, transposed so vector l holds value j + l of every
 * group, and added in the reference's order j = 0, 1, … from 0.0f, so each
 * sum is the same sequence of rounded additions. Other group sizes and the
 * last ng % 16 groups: the reference. */
static void group_sums(float *xs, const float *x, int64_t K, int gs) {
    const int64_t ng = K / gs;
    int64_t g = 0;
    if (gs % 16 == 0)
        for (; g + 16 <= ng; g += 16) {
            const float *b = x + g * gs;
            __m512 s = _mm512_setzero_ps();
            for (int j = 0; j < gs; j += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(b + (int64_t)i * gs + j);
                tr16(r);
                for (int l = 0; l < 16; l++) s = _mm512_add_ps(s, r[l]);
            }
            _mm512_storeu_ps(xs + g, s);
        }
    if (g < ng) pt_cpu_group_sums_ref(xs + g, x + g * gs, (ng - g) * gs, gs);
}

/* pt_cpu_quant_i8_ref on 16 lanes (gs % 16 == 0, else the reference): the
 * group's max|x| by vmaxps, which like the reference's a > m ? a : m keeps m
 * for a NaN and for an equal value (max is exact, so the lanes' order does
 * not matter; |x| by clearing the sign, and a −0 never replaces the +0 start
 * either way); then x·id, + 1.5·2^23, − 1.5·2^23 as three rounded operations
 * (no FMA), converted exactly and narrowed (|v| <= 127; a NaN gives 0 in both). */
static void quant_i8(int8_t *xi, float *xd, const float *x, int64_t K, int gs) {
    if (gs % 16) {
        pt_cpu_quant_i8_ref(xi, xd, x, K, gs);
        return;
    }
    const int64_t ng = K / gs;
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * gs;
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < gs; j += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xg + j)), m);
        const float amax = _mm512_reduce_max_ps(m);
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        xd[g] = d;
        const __m512 vid = _mm512_set1_ps(id);
        for (int j = 0; j < gs; j += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xg + j), vid);
            v = _mm512_sub_ps(_mm512_add_ps(v, magic), magic);
            _mm_storeu_si128((__m128i *)(xi + g * gs + j), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
        }
    }
}

const pt_cpu_kernels pt_cpu_kernels_avx512 = {
    .name = "avx512",
    .dot_f32 = dot_f32,
    .dot_bf16 = dot_bf16,
    .dot_f16 = dot_f16,
    .axpy_f32 = axpy_f32,
    .axpy_bf16 = axpy_bf16,
    .qdot4 = qdot4,
    .qdot8 = qdot8,
    .qdot4_x4 = qdot4_x4,
    .panel_t16 = panel_t16,
    .qdot8_x4 = qdot8_x4,
    .qdot4_x4_bf16 = qdot4_x4_bf16,
    .qdot4_x4_bf16s = qdot4_x4_bf16s,
    .cvt_bf16 = cvt_bf16,
    .dequant_q = dequant_q,
    .qdot4_x4_i8 = qdot4_x4_i8,
    .qdot8_x4_i8 = qdot8_x4_i8,
    .qdot4_x4_i8_128 = qdot4_x4_i8_128,
    .gemm_32 = gemm_32,
    .attn_scores = attn_scores,
    .attn_scores_t = attn_scores_t,
    .attn_pv = attn_pv,
    .attn_pv_q = attn_pv_q,
    .attn_scores_dp = attn_scores_dp,
    .attn_scores_amx = attn_scores_amx,
    .attn_pv_amx = attn_pv_amx,
    .attn_pv_dp = attn_pv_dp,
    .attn_scores_tq = attn_scores_tq,
    .fused_scores_dp = fused_scores_dp,
    .fused_pv_dp = fused_pv_dp,
    .softmax_row = softmax_row,
    .softmax_part = softmax_part,
    .group_sums = group_sums,
    .quant_i8 = quant_i8,
    .silu_mul = silu_mul,
    .rms_norm16 = rms_norm16,
    .rope_rot = rope_rot,
};
