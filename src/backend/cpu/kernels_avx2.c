/* AVX2 + FMA + F16C kernels (compiled with the Makefile's AVX2 flags;
 * selected at runtime when cpuid reports AVX2 and FMA but not AVX-512, or
 * with PETREL_CPU_ISA=avx2). Same contracts and the same factored quantized
 * form as kernels_avx512.c, on 8-lane vectors: a 32-value 4-bit block is two
 * 8-byte halves, half h's low nibbles against xp[8h..8h+8) and high nibbles
 * against xp[16+8h..16+8h+8). Tails go through a scalar loop. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_f32(const float *x, const float *w, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(w + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(w + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    float t = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) t += x[i] * w[i];
    return t;
}

static inline __m256 load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static float dot_bf16(const float *x, const uint16_t *w, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_bf16(w + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load_bf16(w + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), load_bf16(w + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), load_bf16(w + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_bf16(w + i), a0);
    float t = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) t += x[i] * pt_bf16_to_f32(w[i]);
    return t;
}

static float dot_f16(const float *x, const uint16_t *w, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8))),
                             a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), a0);
    float t = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++) t += x[i] * pt_f16_to_f32(w[i]);
    return t;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_bf16(float *y, float a, const uint16_t *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_bf16(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * pt_bf16_to_f32(x[i]);
}

static inline __m256i load8_u8_epi32(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static float qdot4(const float *xp, const uint8_t *codes, const float *sc, int64_t K, int gs) {
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 32) {
            const uint8_t *c = codes + b / 2;
            __m256i v0 = load8_u8_epi32(c), v1 = load8_u8_epi32(c + 8);
            s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), _mm256_loadu_ps(xp + b), s0);
            s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m15)), _mm256_loadu_ps(xp + b + 8), s1);
            s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), _mm256_loadu_ps(xp + b + 16), s0);
            s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), _mm256_loadu_ps(xp + b + 24), s1);
        }
        if (g & 1) acc1 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(sc[g]), acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(sc[g]), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1));
}

static float qdot8(const float *x, const uint8_t *codes, const float *sc, int64_t K, int gs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 16) {
            s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(load8_u8_epi32(codes + b)), _mm256_loadu_ps(x + b), s0);
            s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(load8_u8_epi32(codes + b + 8)), _mm256_loadu_ps(x + b + 8), s1);
        }
        if (g & 1) acc1 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(sc[g]), acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(sc[g]), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1));
}

static void qdot4_x4(float *out, const float *xp, const float *xs, const uint8_t *const *codes, const float *const *sc,
                     const float *const *bi, int64_t K, int gs) {
    for (int r = 0; r < 4; r++) out[r] = qdot4(xp, codes[r], sc[r], K, gs) + dot_f32(bi[r], xs, K / gs);
}

static void qdot8_x4(float *out, const float *x, const float *xs, const uint8_t *const *codes, const float *const *sc,
                     const float *const *bi, int64_t K, int gs) {
    for (int r = 0; r < 4; r++) out[r] = qdot8(x, codes[r], sc[r], K, gs) + dot_f32(bi[r], xs, K / gs);
}

static void cvt_bf16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(src + i));
    for (; i < n; i++) dst[i] = pt_bf16_to_f32(src[i]);
}

/* 2 tokens × 32 columns per pass (8 of the 16 ymm registers hold sums). */
static void gemm_32(float *c, int64_t ldc, const float *xpk, const float *wp, int mr, int64_t kc, int first) {
    for (int t = 0; t < mr; t += 2) {
        int two = t + 1 < mr;
        float *c0 = c + t * ldc, *c1 = c + (t + 1) * ldc;
        __m256 a0, a1, a2, a3, b0, b1, b2, b3;
        if (first) {
            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = _mm256_setzero_ps();
        } else {
            a0 = _mm256_loadu_ps(c0), a1 = _mm256_loadu_ps(c0 + 8), a2 = _mm256_loadu_ps(c0 + 16),
            a3 = _mm256_loadu_ps(c0 + 24);
            b0 = b1 = b2 = b3 = _mm256_setzero_ps();
            if (two)
                b0 = _mm256_loadu_ps(c1), b1 = _mm256_loadu_ps(c1 + 8), b2 = _mm256_loadu_ps(c1 + 16),
                b3 = _mm256_loadu_ps(c1 + 24);
        }
        for (int64_t k = 0; k < kc; k++) {
            const float *wk = wp + k * 32;
            __m256 w0 = _mm256_loadu_ps(wk), w1 = _mm256_loadu_ps(wk + 8), w2 = _mm256_loadu_ps(wk + 16),
                   w3 = _mm256_loadu_ps(wk + 24);
            __m256 x0 = _mm256_broadcast_ss(xpk + k * 12 + t);
            a0 = _mm256_fmadd_ps(x0, w0, a0), a1 = _mm256_fmadd_ps(x0, w1, a1);
            a2 = _mm256_fmadd_ps(x0, w2, a2), a3 = _mm256_fmadd_ps(x0, w3, a3);
            __m256 x1 = _mm256_broadcast_ss(xpk + k * 12 + t + (two ? 1 : 0));
            b0 = _mm256_fmadd_ps(x1, w0, b0), b1 = _mm256_fmadd_ps(x1, w1, b1);
            b2 = _mm256_fmadd_ps(x1, w2, b2), b3 = _mm256_fmadd_ps(x1, w3, b3);
        }
        _mm256_storeu_ps(c0, a0), _mm256_storeu_ps(c0 + 8, a1), _mm256_storeu_ps(c0 + 16, a2),
            _mm256_storeu_ps(c0 + 24, a3);
        if (two)
            _mm256_storeu_ps(c1, b0), _mm256_storeu_ps(c1 + 8, b1), _mm256_storeu_ps(c1 + 16, b2),
                _mm256_storeu_ps(c1 + 24, b3);
    }
}

const pt_cpu_kernels pt_cpu_kernels_avx2 = {
    .name = "avx2",
    .dot_f32 = dot_f32,
    .dot_bf16 = dot_bf16,
    .dot_f16 = dot_f16,
    .axpy_f32 = axpy_f32,
    .axpy_bf16 = axpy_bf16,
    .qdot4 = qdot4,
    .qdot8 = qdot8,
    .qdot4_x4 = qdot4_x4,
    .panel_t16 = pt_cpu_panel_t16_ref,
    .qdot8_x4 = qdot8_x4,
    .cvt_bf16 = cvt_bf16,
    .dequant_q = pt_cpu_dequant_q_ref,
    .qdot4_x4_i8 = pt_cpu_qdot4_x4_i8_ref,
    .qdot8_x4_i8 = pt_cpu_qdot8_x4_i8_ref,
    .gemm_32 = gemm_32,
};
