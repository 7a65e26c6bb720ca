/* The 4-bit decode kernel with x as exact integer pieces (AVX-512 VNNI), and
 * the preparation of x it reads. Not the int8-activation lever: x is not
 * quantized to 8 bits; see the accuracy bound below.
 *
 * Why: on the development VM vdpbf16ps issues at ~1.3 G/s per core while
 * vpdpbusd issues at ~5.6 G/s (dev/README.md, "instruction rates"), and the
 * bf16 kernel (qdot4_x4_bf16) spends most of its time in its four vdpbf16ps
 * per 128 weights and row. vpdpbusd multiplies 64 unsigned bytes by 64 signed
 * bytes and adds groups of four into 16 int32 lanes: the 4-bit codes are
 * unsigned bytes after one AND (low nibbles) or one shift and AND (high
 * nibbles), so a 64-byte block of codes (128 values) takes two vpdpbusd per
 * 8-bit piece of x.
 *
 * x as integers: per weight group g (gs values) of one token, with e_g the
 * binary exponent of max|x| over the group (|x| < 2^(e_g+1)), each value is
 *   X = round(x · 2^(20 − e_g)),  |X| < 2^21,  x ≈ X · step_g, step_g = 2^(e_g − 20)
 * and X = A·2^14 + B·2^7 + C with A in [−128, 127] (signed byte) and B, C in
 * [0, 127] (non-negative bytes). A bf16 value has 8 significant bits, so X is
 * exact for every x within a factor 2^13 of the group's max (x's last bit is
 * then at or above 2^(e_g−20)); a smaller x is rounded by at most
 * 2^-21·max|x_g| (by at most 2^-121 in a group whose max is under 2^-100,
 * where the step is held at 2^-120 so that it stays a normal float). That is below the f32 rounding the other kernels commit
 * (the bf16 kernel's 128-offset sums lose ~2^-17·max|x_g| per value), and far
 * below the L1 gate (1e-4 of the logits).
 *
 * The dot of a block with its pieces, per row, in one int32 accumulator:
 *   acc = Σ q·A;  acc <<= 7;  acc += Σ q·B;  acc <<= 7;  acc += Σ q·C  (= Σ q·X)
 * Lane i of a block covers values 8i..8i+7 (low nibbles of bytes 4i..4i+3:
 * the even values; high nibbles: the odd ones), |Σ q·X| ≤ 8·15·2^21 < 2^28:
 * exact in int32. Then per lane f += f32(acc) · scale_g · step_g (the lane's
 * group, spread as in the bf16 kernel), and the bias term Σ_g b_g·xs_g at
 * the end. Per 128 weights and row: 3 code ops, 6 vpdpbusd, 2 shifts, one
 * conversion, the scale (permute, multiply) and one FMA, against 7 code
 * ops, 4 vdpbf16ps and the scale for the bf16 kernel. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <string.h>

/* 2^n as a float, for -126 <= n <= 127 (the exponent field alone) */
static inline float pow2f(int n) {
    uint32_t u = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Per 128-value chunk c of a token: 384 bytes, piece p (A, B, C) at
 * c·384 + p·128: the 64 even values, then the 64 odd ones (the order the low
 * and high nibbles of a 64-byte block of codes come in). step[g] as above.
 * Returns 0 (x left to the other kernels) when K % 128 != 0, gs is not 32,
 * 64 or 128, or a value is not finite or not exactly bf16. */
/* rows = 0: the decode layout above; rows = 1: the prefill GEMM's, per token
 * [A: K bytes][B: K][C: K] in natural order (pt_cpu_arrange_xint_rows);
 * rows = 2: the 8-bit decode kernel's, per 64-value chunk c: 192 bytes,
 * piece p at c·192 + p·64 in natural order (pt_cpu_arrange_xint8; K % 128
 * == 0 too: the kernel steps two chunks at a time). */
static int arrange(int8_t *xq, float *step, const float *x, int64_t K, int gs, int rows) {
    if ((rows == 1 ? K % gs : K % 128) || (gs != 32 && gs != 64 && gs != 128)) return 0;
    /* evens / odds of 32 consecutive int32 (two vectors) */
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512i lo16 = _mm512_set1_epi32(0xffff), absm = _mm512_set1_epi32(0x7fffffff),
                  inf = _mm512_set1_epi32(0x7f800000);
    const __m512i xmax = _mm512_set1_epi32((1 << 21) - 1), xmin = _mm512_set1_epi32(-(1 << 21)),
                  m127 = _mm512_set1_epi32(127);
    for (int64_t g0 = 0; g0 < K; g0 += gs) {
        /* max |x| as integer bits (non-negative floats order like their bits); not bf16 or not finite: refuse */
        __m512i mx = _mm512_setzero_si512();
        __mmask16 bad = 0;
        for (int64_t j = g0; j < g0 + gs; j += 16) {
            __m512i u = _mm512_loadu_si512((const void *)(x + j));
            bad |= _mm512_test_epi32_mask(u, lo16);
            __m512i a = _mm512_and_si512(u, absm);
            bad |= _mm512_cmpge_epu32_mask(a, inf);
            mx = _mm512_max_epu32(mx, a);
        }
        if (bad) return 0;
        int eb = (int)((uint32_t)_mm512_reduce_max_epu32(mx) >> 23); /* biased exponent; 0: zero or subnormal */
        int e = (eb ? eb : 1) - 127;
        if (e < -100) e = -100; /* a group of values under 2^-100: the step stays a normal float */
        step[g0 / gs] = pow2f(e - 20);
        const __m512 sh = _mm512_set1_ps((float)(20 - e));
        for (int64_t j = g0; j < g0 + gs; j += 32) {
            /* exact scaling by a power of two (vscalefps), then round to nearest even */
            __m512i X0 = _mm512_cvtps_epi32(_mm512_scalef_ps(_mm512_loadu_ps(x + j), sh));
            __m512i X1 = _mm512_cvtps_epi32(_mm512_scalef_ps(_mm512_loadu_ps(x + j + 16), sh));
            X0 = _mm512_min_epi32(_mm512_max_epi32(X0, xmin), xmax);
            X1 = _mm512_min_epi32(_mm512_max_epi32(X1, xmin), xmax);
            __m512i Xe = _mm512_permutex2var_epi32(X0, ev, X1), Xo = _mm512_permutex2var_epi32(X0, od, X1);
            if (rows) { /* natural order: the pieces of 32 values as they come */
                int8_t *d = xq + j;
                int64_t pk = K; /* distance between the pieces */
                if (rows == 2) d = xq + (j / 64) * 192 + j % 64, pk = 64;
                _mm_storeu_si128((__m128i *)d, _mm512_cvtepi32_epi8(_mm512_srai_epi32(X0, 14)));
                _mm_storeu_si128((__m128i *)(d + 16), _mm512_cvtepi32_epi8(_mm512_srai_epi32(X1, 14)));
                _mm_storeu_si128((__m128i *)(d + pk),
                                 _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srai_epi32(X0, 7), m127)));
                _mm_storeu_si128((__m128i *)(d + pk + 16),
                                 _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srai_epi32(X1, 7), m127)));
                _mm_storeu_si128((__m128i *)(d + 2 * pk), _mm512_cvtepi32_epi8(_mm512_and_si512(X0, m127)));
                _mm_storeu_si128((__m128i *)(d + 2 * pk + 16), _mm512_cvtepi32_epi8(_mm512_and_si512(X1, m127)));
                continue;
            }
            int8_t *d = xq + (j / 128) * 384 + (j % 128) / 2;
            _mm_storeu_si128((__m128i *)d, _mm512_cvtepi32_epi8(_mm512_srai_epi32(Xe, 14)));
            _mm_storeu_si128((__m128i *)(d + 64), _mm512_cvtepi32_epi8(_mm512_srai_epi32(Xo, 14)));
            _mm_storeu_si128((__m128i *)(d + 128),
                             _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srai_epi32(Xe, 7), m127)));
            _mm_storeu_si128((__m128i *)(d + 192),
                             _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srai_epi32(Xo, 7), m127)));
            _mm_storeu_si128((__m128i *)(d + 256), _mm512_cvtepi32_epi8(_mm512_and_si512(Xe, m127)));
            _mm_storeu_si128((__m128i *)(d + 320), _mm512_cvtepi32_epi8(_mm512_and_si512(Xo, m127)));
        }
    }
    return 1;
}

int pt_cpu_arrange_xint(int8_t *xq, float *step, const float *x, int64_t K, int gs) {
    return arrange(xq, step, x, K, gs, 0);
}

int pt_cpu_arrange_xint_rows(int8_t *xq, float *step, const float *x, int64_t K, int gs) {
    return arrange(xq, step, x, K, gs, 1);
}

int pt_cpu_arrange_xint8(int8_t *xq, float *step, const float *x, int64_t K, int gs) {
    return arrange(xq, step, x, K, gs, 2);
}

/* vpdpbusd through inline asm: gcc 12 copies every accumulator to another
 * register and back around _mm512_dpbusd_epi32 (see gemm_i8_avx512.c). */
#define XI_DPBUSD(acc, u8, s8) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8))

/* One body for both parameter types, as q4bf16_body in kernels_avx512.c:
 * p16 = 1 reads the bf16 scales/biases in the weight, p16 = 0 f32 copies. */
static inline __attribute__((always_inline)) void xint_body(float *out, const int8_t *xq, const float *xstep,
                                                            const float *xs, const uint8_t *const *codes,
                                                            const void *const *sc, const void *const *bi, int64_t K,
                                                            int gs, int p16) {
    const __m512i m15 = _mm512_set1_epi8(15);
    /* lane i of a block belongs to its group (8i)/gs */
    const __m512i sidx = gs == 32   ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                         : gs == 64 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                    : _mm512_setzero_si512();
    /* the same selection for 16-bit words: lane i's high word (2i+1) <- scale word sidx[i] */
    const __m512i widx = _mm512_slli_epi32(sidx, 16);
    const __mmask8 smask = (__mmask8)((1u << (128 / gs)) - 1u);
    const int64_t gpb = 128 / gs; /* groups per block */
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 4); /* the sweep of kernels_avx512.c PF_LINE */
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
#define XI_SCALE(r)                                                                                               \
    (p16 ? _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(                                                    \
               (__mmask32)0xAAAAAAAAu, widx,                                                                      \
               _mm512_zextsi128_si512(_mm_maskz_loadu_epi16(smask, (const uint16_t *)sc[r] + g))))               \
         : _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(smask, (const float *)sc[r] + g))))
#define XI_ROW(r)                                                                                                 \
    do {                                                                                                          \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                            \
        __m512i lo_ = _mm512_and_si512(v_, m15), hi_ = _mm512_and_si512(_mm512_srli_epi16(v_, 4), m15);           \
        __m512i a_ = _mm512_setzero_si512();                                                                      \
        XI_DPBUSD(a_, lo_, xae);                                                                                  \
        XI_DPBUSD(a_, hi_, xao);                                                                                  \
        a_ = _mm512_slli_epi32(a_, 7);                                                                            \
        XI_DPBUSD(a_, lo_, xbe);                                                                                  \
        XI_DPBUSD(a_, hi_, xbo);                                                                                  \
        a_ = _mm512_slli_epi32(a_, 7);                                                                            \
        XI_DPBUSD(a_, lo_, xce);                                                                                  \
        XI_DPBUSD(a_, hi_, xco);                                                                                  \
        f##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), _mm512_mul_ps(XI_SCALE(r), st), f##r);                     \
    } while (0)
    for (int64_t b = 0, g = 0; b < K; b += 128, g += gpb) {
        _mm_prefetch((const char *)(pf + 2 * b), _MM_HINT_T0); /* this block reads 4 × 64 bytes */
        _mm_prefetch((const char *)(pf + 2 * b + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(pf + 2 * b + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(pf + 2 * b + 192), _MM_HINT_T0);
        const int8_t *xb = xq + 3 * b;
        const __m512i xae = _mm512_loadu_si512((const void *)xb), xao = _mm512_loadu_si512((const void *)(xb + 64));
        const __m512i xbe = _mm512_loadu_si512((const void *)(xb + 128)),
                      xbo = _mm512_loadu_si512((const void *)(xb + 192));
        const __m512i xce = _mm512_loadu_si512((const void *)(xb + 256)),
                      xco = _mm512_loadu_si512((const void *)(xb + 320));
        const __m512 st = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(smask, xstep + g)));
        XI_ROW(0);
        XI_ROW(1);
        XI_ROW(2);
        XI_ROW(3);
    }
#undef XI_ROW
#undef XI_SCALE
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g += 16) { /* the bias term: Σ_g b_g·xs_g */
        __mmask16 m_ = ng - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ng - g)) - 1u);
        __m512 xs_ = _mm512_maskz_loadu_ps(m_, xs + g);
#define XI_LD(p)                                                                                                   \
    (p16 ? _mm512_castsi512_ps(                                                                                    \
               _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m_, (const uint16_t *)(p) + g)), 16)) \
         : _mm512_maskz_loadu_ps(m_, (const float *)(p) + g))
        f0 = _mm512_fmadd_ps(XI_LD(bi[0]), xs_, f0);
        f1 = _mm512_fmadd_ps(XI_LD(bi[1]), xs_, f1);
        f2 = _mm512_fmadd_ps(XI_LD(bi[2]), xs_, f2);
        f3 = _mm512_fmadd_ps(XI_LD(bi[3]), xs_, f3);
#undef XI_LD
    }
    out[0] = _mm512_reduce_add_ps(f0);
    out[1] = _mm512_reduce_add_ps(f1);
    out[2] = _mm512_reduce_add_ps(f2);
    out[3] = _mm512_reduce_add_ps(f3);
}

void pt_cpu_qdot4_x4_xint(float *out, const int8_t *xq, const float *xstep, const float *xs,
                          const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                          int gs) {
    xint_body(out, xq, xstep, xs, codes, (const void *const *)sc, (const void *const *)bi, K, gs, 0);
}

void pt_cpu_qdot4_x4_xints(float *out, const int8_t *xq, const float *xstep, const float *xs,
                           const uint8_t *const *codes, const uint16_t *const *sc, const uint16_t *const *bi,
                           int64_t K, int gs) {
    xint_body(out, xq, xstep, xs, codes, (const void *const *)sc, (const void *const *)bi, K, gs, 1);
}

/* ---- 8-bit codes ----
 *
 * The codes are unsigned bytes in natural order, so a 64-byte vector of a
 * row's codes goes into vpdpbusd as it is loaded: lane i multiplies values
 * 4i..4i+3 with the same values' pieces (pt_cpu_arrange_xint8: per 64 values
 * [A | B | C], 64 bytes each). Per 64 weights and row: three vpdpbusd and two
 * shifts into one int32 accumulator, one conversion, one FMA (against eight
 * widenings, eight conversions and eight FMAs per 64 weights and row in
 * qdot8_x4):
 *   acc = Σ q·A;  acc <<= 7;  acc += Σ q·B;  acc <<= 7;  acc += Σ q·C  (= Σ q·X)
 * exact in int32 because a lane sums only four products per vector:
 * |Σ q·X| ≤ 4·255·2^21 < 2^31 (also every partial sum on the way). The
 * accumulator of each vector is converted and scaled on its own (the next
 * vector's would overflow it). The per-lane scale·step: groups of 64 and 128
 * (a group spans two vectors) take a broadcast of one product per vector;
 * groups of 32 (two groups per vector, lanes 0–7 and 8–15) two products
 * spread over the lanes by one permute. The products scale_g·step_g of the
 * four rows are formed for up to XI8_KC values at a time in a small buffer
 * (f32 multiplies of f32 operands: the same value whichever parameter type
 * the caller passes). Same accuracy bound as the 4-bit kernel. */
#define XI8_KC 2048 /* values per block of precomputed scale·step: [4][XI8_KC/32] floats on the stack */
/* Prefetch of the codes. Rows of fewer than 8192 values: the sweep of the other
 * decode kernels (the next 4-row block, linearly, pt_cpu_pf_offset ahead).
 * Longer rows: each of the four rows' streams XI8_PF_ROW bytes ahead of
 * where it reads (the sweep would fetch the next block's first row long
 * before its last, 32+ KiB ahead). Measured one thread, streaming 512 MiB,
 * dev/bench_decode_ab_kernel8 with the other variant built alongside
 * (bench/RESULTS.md): K 8192 per-row 12.3–12.4 GB/s vs sweep 11.1–11.4;
 * K 14336 11.3 vs 9.1; but K 4096 10.4–12.0 vs 12.1–12.9 and K 2048
 * 9.4–9.7 vs 12.8 (a distance shorter than the row there lands in rows the
 * block is already reading). */
#define XI8_PF_ROWWISE_K 8192
#define XI8_PF_ROW 4096

static inline __attribute__((always_inline)) void xint8_body(float *out, const int8_t *xq, const float *xstep,
                                                             const float *xs, const uint8_t *const *codes,
                                                             const void *const *sc, const void *const *bi, int64_t K,
                                                             int gs, int p16) {
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    const uint8_t *pf = c0 + pt_cpu_pf_offset(K, 8); /* the sweep of kernels_avx512.c PF_LINE */
    /* lane i of vector v (values 64v + 4i ..) belongs to group (64v + 4i)/gs of the block */
    const __m512i lidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    float ss[4][XI8_KC / 32] __attribute__((aligned(64)));
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t k0 = 0; k0 < K; k0 += XI8_KC) {
        const int64_t kc = K - k0 < XI8_KC ? K - k0 : XI8_KC, g0 = k0 / gs, ngc = kc / gs;
        /* ss[r][j] = scale_r[g0 + j] · step[g0 + j] */
        for (int64_t j = 0; j < ngc; j += 16) {
            __mmask16 m_ = ngc - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ngc - j)) - 1u);
            __m512 st_ = _mm512_maskz_loadu_ps(m_, xstep + g0 + j);
            for (int r = 0; r < 4; r++) {
                __m512 s_ = p16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m_, (const uint16_t *)sc[r] + g0 + j)), 16))
                                : _mm512_maskz_loadu_ps(m_, (const float *)sc[r] + g0 + j);
                _mm512_store_ps(&ss[r][j], _mm512_mul_ps(s_, st_));
            }
        }
#define XI8_ROW(r, v, scl)                                                                                        \
    do {                                                                                                          \
        __m512i q_ = _mm512_loadu_si512((const void *)(c##r + k0 + b + 64 * (v)));                                \
        __m512i a_ = _mm512_setzero_si512();                                                                      \
        XI_DPBUSD(a_, q_, xa##v);                                                                                 \
        a_ = _mm512_slli_epi32(a_, 7);                                                                            \
        XI_DPBUSD(a_, q_, xb##v);                                                                                 \
        a_ = _mm512_slli_epi32(a_, 7);                                                                            \
        XI_DPBUSD(a_, q_, xc##v);                                                                                 \
        f##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), scl, f##r);                                                \
    } while (0)
        /* two vectors (128 values) per step: the rows' four streams advance 128 bytes each */
        for (int64_t b = 0; b < kc; b += 128) {
            const int8_t *xb = xq + 3 * (k0 + b);
            const __m512i xa0 = _mm512_loadu_si512((const void *)xb), xb0 = _mm512_loadu_si512((const void *)(xb + 64)),
                          xc0 = _mm512_loadu_si512((const void *)(xb + 128));
            const __m512i xa1 = _mm512_loadu_si512((const void *)(xb + 192)),
                          xb1 = _mm512_loadu_si512((const void *)(xb + 256)),
                          xc1 = _mm512_loadu_si512((const void *)(xb + 320));
            if (K >= XI8_PF_ROWWISE_K) { /* long rows: each row's own stream, XI8_PF_ROW bytes ahead */
                const int64_t o = k0 + b + XI8_PF_ROW;
                _mm_prefetch((const char *)(c0 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(c0 + o + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(c1 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(c1 + o + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(c2 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(c2 + o + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(c3 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(c3 + o + 64), _MM_HINT_T0);
            } else
                for (int l = 0; l < 8; l++) /* the sweep: this step reads 4 × 128 bytes */
                    _mm_prefetch((const char *)(pf + 4 * (k0 + b) + 64 * l), _MM_HINT_T0);
            const int64_t j = b / gs; /* the block's first group, relative to g0 */
            if (gs == 64) {
                XI8_ROW(0, 0, _mm512_set1_ps(ss[0][j]));
                XI8_ROW(1, 0, _mm512_set1_ps(ss[1][j]));
                XI8_ROW(2, 0, _mm512_set1_ps(ss[2][j]));
                XI8_ROW(3, 0, _mm512_set1_ps(ss[3][j]));
                XI8_ROW(0, 1, _mm512_set1_ps(ss[0][j + 1]));
                XI8_ROW(1, 1, _mm512_set1_ps(ss[1][j + 1]));
                XI8_ROW(2, 1, _mm512_set1_ps(ss[2][j + 1]));
                XI8_ROW(3, 1, _mm512_set1_ps(ss[3][j + 1]));
            } else if (gs == 128) {
                const __m512 s0 = _mm512_set1_ps(ss[0][j]), s1 = _mm512_set1_ps(ss[1][j]),
                             s2 = _mm512_set1_ps(ss[2][j]), s3 = _mm512_set1_ps(ss[3][j]);
                XI8_ROW(0, 0, s0);
                XI8_ROW(1, 0, s1);
                XI8_ROW(2, 0, s2);
                XI8_ROW(3, 0, s3);
                XI8_ROW(0, 1, s0);
                XI8_ROW(1, 1, s1);
                XI8_ROW(2, 1, s2);
                XI8_ROW(3, 1, s3);
            } else { /* gs == 32: groups j, j+1 in vector 0, j+2, j+3 in vector 1 */
#define XI8_S32(r, v) _mm512_permutexvar_ps(lidx, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)&ss[r][j + 2 * (v)]))))
                XI8_ROW(0, 0, XI8_S32(0, 0));
                XI8_ROW(1, 0, XI8_S32(1, 0));
                XI8_ROW(2, 0, XI8_S32(2, 0));
                XI8_ROW(3, 0, XI8_S32(3, 0));
                XI8_ROW(0, 1, XI8_S32(0, 1));
                XI8_ROW(1, 1, XI8_S32(1, 1));
                XI8_ROW(2, 1, XI8_S32(2, 1));
                XI8_ROW(3, 1, XI8_S32(3, 1));
#undef XI8_S32
            }
        }
#undef XI8_ROW
    }
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g += 16) { /* the bias term: Σ_g b_g·xs_g */
        __mmask16 m_ = ng - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ng - g)) - 1u);
        __m512 xs_ = _mm512_maskz_loadu_ps(m_, xs + g);
#define XI_LD(p)                                                                                                   \
    (p16 ? _mm512_castsi512_ps(                                                                                    \
               _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m_, (const uint16_t *)(p) + g)), 16)) \
         : _mm512_maskz_loadu_ps(m_, (const float *)(p) + g))
        f0 = _mm512_fmadd_ps(XI_LD(bi[0]), xs_, f0);
        f1 = _mm512_fmadd_ps(XI_LD(bi[1]), xs_, f1);
        f2 = _mm512_fmadd_ps(XI_LD(bi[2]), xs_, f2);
        f3 = _mm512_fmadd_ps(XI_LD(bi[3]), xs_, f3);
#undef XI_LD
    }
    out[0] = _mm512_reduce_add_ps(f0);
    out[1] = _mm512_reduce_add_ps(f1);
    out[2] = _mm512_reduce_add_ps(f2);
    out[3] = _mm512_reduce_add_ps(f3);
}

/* gs as a constant in each instantiation (the branches above fold) */
#define XI8_GS(body_call)                                                                                         \
    switch (gs) {                                                                                                 \
    case 32: body_call(32); break;                                                                                \
    case 64: body_call(64); break;                                                                                \
    default: body_call(128); break;                                                                               \
    }

void pt_cpu_qdot8_x4_xint(float *out, const int8_t *xq, const float *xstep, const float *xs,
                          const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                          int gs) {
#define CALL(G) xint8_body(out, xq, xstep, xs, codes, (const void *const *)sc, (const void *const *)bi, K, G, 0)
    XI8_GS(CALL)
#undef CALL
}

void pt_cpu_qdot8_x4_xints(float *out, const int8_t *xq, const float *xstep, const float *xs,
                           const uint8_t *const *codes, const uint16_t *const *sc, const uint16_t *const *bi,
                           int64_t K, int gs) {
#define CALL(G) xint8_body(out, xq, xstep, xs, codes, (const void *const *)sc, (const void *const *)bi, K, G, 1)
    XI8_GS(CALL)
#undef CALL
}
