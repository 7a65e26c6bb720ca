/* 4-bit decode matvec kernels streaming from memory (not part of the build or
 * the tests): one thread, four rows per call, group 64, over a buffer far
 * larger than the L3, interleaved in one run with a plain streaming read.
 *   F   the f32-activation kernel as shipped before (vpermps lo / shift+cvt hi)
 *   FP  F plus a software prefetch of the next four rows, one line per step
 *   B   bf16 activations: nibbles OR-ed into bf16 128+q (ternlog), vdpbf16ps,
 *       the offset folded into the bias term; per-lane scales per 128 values
 *   BP  B plus the prefetch
 * Each variant is checked against a double-precision reference first.
 *   cc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 dev/bench_q4_stream.c -o dev/bench_q4_stream
 *   dev/bench_q4_stream [K] [MiB] [reps] [prefetch_bytes] */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define GS 64
static int64_t PF = 4096;

static inline float bf16r(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

#define Q4_STEP(c, l, h)                                                                    \
    do {                                                                                    \
        __m512i v_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((c) + b / 2))); \
        l = _mm512_fmadd_ps(_mm512_permutexvar_ps(v_, lut), xl, l);                         \
        h = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v_, 4)), xh, h);           \
    } while (0)

#define KF(NAME, PREF)                                                                                          \
    static void NAME(float *out, const float *xp, const float *xs, const uint8_t *c0, const float *const *sc,  \
                     const float *const *bi, int64_t K) {                                                      \
        const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);               \
        const uint8_t *c1 = c0 + K / 2, *c2 = c1 + K / 2, *c3 = c2 + K / 2;                                    \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                            \
        int64_t ng = K / GS;                                                                                   \
        for (int64_t g = 0; g < ng; g++) {                                                                     \
            __m512 l0 = _mm512_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;    \
            for (int64_t b = g * GS; b < (g + 1) * GS; b += 32) {                                              \
                if (PREF) _mm_prefetch((const char *)c0 + PF + 2 * b, _MM_HINT_T0);                            \
                __m512 xl = _mm512_loadu_ps(xp + b), xh = _mm512_loadu_ps(xp + b + 16);                        \
                Q4_STEP(c0, l0, h0);                                                                           \
                Q4_STEP(c1, l1, h1);                                                                           \
                Q4_STEP(c2, l2, h2);                                                                           \
                Q4_STEP(c3, l3, h3);                                                                           \
            }                                                                                                  \
            a0 = _mm512_fmadd_ps(_mm512_add_ps(l0, h0), _mm512_set1_ps(sc[0][g]), a0);                         \
            a1 = _mm512_fmadd_ps(_mm512_add_ps(l1, h1), _mm512_set1_ps(sc[1][g]), a1);                         \
            a2 = _mm512_fmadd_ps(_mm512_add_ps(l2, h2), _mm512_set1_ps(sc[2][g]), a2);                         \
            a3 = _mm512_fmadd_ps(_mm512_add_ps(l3, h3), _mm512_set1_ps(sc[3][g]), a3);                         \
        }                                                                                                      \
        for (int64_t g = 0; g < ng; g += 16) {                                                                 \
            __m512 xs_ = _mm512_loadu_ps(xs + g);                                                              \
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(bi[0] + g), xs_, a0);                                         \
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(bi[1] + g), xs_, a1);                                         \
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(bi[2] + g), xs_, a2);                                         \
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(bi[3] + g), xs_, a3);                                         \
        }                                                                                                      \
        out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);                                  \
        out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);                                  \
    }
KF(kf, 0)
KF(kfp, 1)

/* bf16 path. x arranged per 128-value block into 4 vectors of 32 bf16:
 * vector k, element 2i = x[8i+k], element 2i+1 = x[8i+4+k]. */
static void arrange_bf16(uint16_t *xa, const float *x, int64_t K) {
    for (int64_t b = 0; b < K; b += 128)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 16; i++) {
                float f0 = x[b + 8 * i + k], f1 = x[b + 8 * i + 4 + k];
                uint32_t u0, u1;
                memcpy(&u0, &f0, 4), memcpy(&u1, &f1, 4);
                xa[b + 32 * k + 2 * i] = (uint16_t)(u0 >> 16);
                xa[b + 32 * k + 2 * i + 1] = (uint16_t)(u1 >> 16);
            }
}

#define B_ROW(r)                                                                                               \
    do {                                                                                                       \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                         \
        __m512bh n0_ = (__m512bh)_mm512_ternarylogic_epi32(v_, m15, mag, 0xEA);                                 \
        __m512bh n1_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 4), m15, mag, 0xEA);           \
        __m512bh n2_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 8), m15, mag, 0xEA);           \
        __m512bh n3_ = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(v_, 12), mag);                              \
        __m512 d_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n0_, x0);                                            \
        d_ = _mm512_dpbf16_ps(d_, n1_, x1);                                                                    \
        d_ = _mm512_dpbf16_ps(d_, n2_, x2);                                                                    \
        d_ = _mm512_dpbf16_ps(d_, n3_, x3);                                                                    \
        __m512 s_ = _mm512_permutexvar_ps(sidx, _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(sc[r] + 2 * (b / 128))))); \
        a##r = _mm512_fmadd_ps(d_, s_, a##r);                                                                  \
    } while (0)

#define KB(NAME, PREF)                                                                                         \
    static void NAME(float *out, const uint16_t *xa, const float *xs, const uint8_t *c0, const float *const *sc, \
                     const float *const *bi, int64_t K) {                                                     \
        const __m512i m15 = _mm512_set1_epi16(15), mag = _mm512_set1_epi16(0x4300);                           \
        const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);               \
        const uint8_t *c1 = c0 + K / 2, *c2 = c1 + K / 2, *c3 = c2 + K / 2;                                   \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                           \
        int64_t ng = K / GS;                                                                                  \
        for (int64_t b = 0; b < K; b += 128) {                                                                \
            if (PREF) {                                                                                       \
                _mm_prefetch((const char *)c0 + PF + 2 * b, _MM_HINT_T0);                                     \
                _mm_prefetch((const char *)c0 + PF + 2 * b + 64, _MM_HINT_T0);                                \
                _mm_prefetch((const char *)c0 + PF + 2 * b + 128, _MM_HINT_T0);                               \
                _mm_prefetch((const char *)c0 + PF + 2 * b + 192, _MM_HINT_T0);                               \
            }                                                                                                 \
            __m512bh x0 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b));                               \
            __m512bh x1 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 32));                          \
            __m512bh x2 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 64));                          \
            __m512bh x3 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 96));                          \
            B_ROW(0);                                                                                         \
            B_ROW(1);                                                                                         \
            B_ROW(2);                                                                                         \
            B_ROW(3);                                                                                         \
        }                                                                                                     \
        /* bias term with the 128 offset folded in: (b - 128 s)·xs */                                         \
        const __m512 o128 = _mm512_set1_ps(-128.0f);                                                          \
        for (int64_t g = 0; g < ng; g += 16) {                                                                \
            __m512 xs_ = _mm512_loadu_ps(xs + g);                                                             \
            a0 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[0] + g), o128, _mm512_loadu_ps(bi[0] + g)), xs_, a0); \
            a1 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[1] + g), o128, _mm512_loadu_ps(bi[1] + g)), xs_, a1); \
            a2 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[2] + g), o128, _mm512_loadu_ps(bi[2] + g)), xs_, a2); \
            a3 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[3] + g), o128, _mm512_loadu_ps(bi[3] + g)), xs_, a3); \
        }                                                                                                     \
        out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);                                 \
        out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);                                 \
    }
KB(kb, 0)
KB(kbp, 1)


#define B2_ROW(r)                                                                                              \
    do {                                                                                                       \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                         \
        __m512bh n0_ = (__m512bh)_mm512_ternarylogic_epi32(v_, m15, mag, 0xEA);                                 \
        __m512bh n1_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 4), m15, mag, 0xEA);           \
        __m512bh n2_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 8), m15, mag, 0xEA);           \
        __m512bh n3_ = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(v_, 12), mag);                              \
        __m512 d_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n0_, x0);                                            \
        __m512 e_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n2_, x2);                                            \
        d_ = _mm512_dpbf16_ps(d_, n1_, x1);                                                                    \
        e_ = _mm512_dpbf16_ps(e_, n3_, x3);                                                                    \
        __m512 s_ = _mm512_permutexvar_ps(sidx, _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(sc[r] + 2 * (b / 128))))); \
        a##r = _mm512_fmadd_ps(_mm512_add_ps(d_, e_), s_, a##r);                                               \
    } while (0)
#define BW_ROW(r)                                                                                              \
    do {                                                                                                       \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                         \
        __m512bh n0_ = (__m512bh)_mm512_permutexvar_epi16(v_, tab);                                            \
        __m512bh n1_ = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v_, 4), tab);                      \
        __m512bh n2_ = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v_, 8), tab);                      \
        __m512bh n3_ = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v_, 12), tab);                     \
        __m512 d_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n0_, x0);                                            \
        __m512 e_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n2_, x2);                                            \
        d_ = _mm512_dpbf16_ps(d_, n1_, x1);                                                                    \
        e_ = _mm512_dpbf16_ps(e_, n3_, x3);                                                                    \
        __m512 s_ = _mm512_permutexvar_ps(sidx, _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(sc[r] + 2 * (b / 128))))); \
        a##r = _mm512_fmadd_ps(_mm512_add_ps(d_, e_), s_, a##r);                                               \
    } while (0)

#define KB2(NAME, ROW, OFS)                                                                                    \
    static void NAME(float *out, const uint16_t *xa, const float *xs, const uint8_t *c0, const float *const *sc, \
                     const float *const *bi, int64_t K) {                                                     \
        const __m512i m15 = _mm512_set1_epi16(15), mag = _mm512_set1_epi16(0x4300);                           \
        __m512i tab = _mm512_setzero_si512();                                                                 \
        { uint16_t t_[32]; for (int i = 0; i < 32; i++) { float f = (float)(i & 15); uint32_t u; memcpy(&u, &f, 4); t_[i] = (uint16_t)(u >> 16); } tab = _mm512_loadu_si512(t_); } \
        (void)m15, (void)mag, (void)tab;                                                                      \
        const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);               \
        const uint8_t *c1 = c0 + K / 2, *c2 = c1 + K / 2, *c3 = c2 + K / 2;                                   \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                           \
        int64_t ng = K / GS;                                                                                  \
        for (int64_t b = 0; b < K; b += 128) {                                                                \
            _mm_prefetch((const char *)c0 + PF + 2 * b, _MM_HINT_T0);                                         \
            _mm_prefetch((const char *)c0 + PF + 2 * b + 64, _MM_HINT_T0);                                    \
            _mm_prefetch((const char *)c0 + PF + 2 * b + 128, _MM_HINT_T0);                                   \
            _mm_prefetch((const char *)c0 + PF + 2 * b + 192, _MM_HINT_T0);                                   \
            __m512bh x0 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b));                               \
            __m512bh x1 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 32));                          \
            __m512bh x2 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 64));                          \
            __m512bh x3 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 96));                          \
            ROW(0);                                                                                           \
            ROW(1);                                                                                           \
            ROW(2);                                                                                           \
            ROW(3);                                                                                           \
        }                                                                                                     \
        const __m512 o128 = _mm512_set1_ps(OFS);                                                              \
        for (int64_t g = 0; g < ng; g += 16) {                                                                \
            __m512 xs_ = _mm512_loadu_ps(xs + g);                                                             \
            a0 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[0] + g), o128, _mm512_loadu_ps(bi[0] + g)), xs_, a0); \
            a1 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[1] + g), o128, _mm512_loadu_ps(bi[1] + g)), xs_, a1); \
            a2 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[2] + g), o128, _mm512_loadu_ps(bi[2] + g)), xs_, a2); \
            a3 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(sc[3] + g), o128, _mm512_loadu_ps(bi[3] + g)), xs_, a3); \
        }                                                                                                     \
        out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);                                 \
        out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);                                 \
    }
KB2(kb2, B2_ROW, -128.0f)
KB2(kbw, BW_ROW, 0.0f)

int main(int argc, char **argv) {
    int64_t K = argc > 1 ? atoll(argv[1]) : 2048;
    size_t mib = argc > 2 ? (size_t)atoll(argv[2]) : 512;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (argc > 4) PF = atoll(argv[4]);
    size_t rowb = (size_t)K / 2, bytes = mib ? mib << 20 : 262144;
    int64_t N = (int64_t)(bytes / rowb) & ~(int64_t)3, ng = K / GS;
    uint8_t *codes = aligned_alloc(64, (size_t)N * rowb + 8192);
    for (size_t i = 0; i < (size_t)N * rowb + 8192; i++) codes[i] = (uint8_t)(i * 2654435761u >> 13);
    float *x = aligned_alloc(64, K * 4), *xp = aligned_alloc(64, K * 4), *xs = aligned_alloc(64, ng * 4 + 64);
    uint16_t *xa = aligned_alloc(64, K * 2);
    for (int64_t i = 0; i < K; i++) x[i] = bf16r(sinf((float)i * 0.37f) * 1.3f);
    for (int64_t b = 0; b < K; b += 32)
        for (int i = 0; i < 16; i++) xp[b + i] = x[b + 2 * i], xp[b + 16 + i] = x[b + 2 * i + 1];
    for (int64_t g = 0; g < ng; g++) {
        float s = 0;
        for (int j = 0; j < GS; j++) s += x[g * GS + j];
        xs[g] = s;
    }
    arrange_bf16(xa, x, K);
    /* per-row scales/biases (same for every row here: the kernel reads them per call) */
    float *sc = aligned_alloc(64, 4 * 4 * (ng + 16)), *bi = aligned_alloc(64, 4 * 4 * (ng + 16));
    for (int64_t i = 0; i < 4 * (ng + 16); i++) sc[i] = bf16r(0.01f + 0.001f * (float)(i % 7)), bi[i] = bf16r(-0.08f + 0.003f * (float)(i % 5));
    const float *scp[4], *bip[4];
    for (int r = 0; r < 4; r++) scp[r] = sc + r * (ng + 16), bip[r] = bi + r * (ng + 16);
    /* correctness on the first block of rows */
    {
        float o[6][4];
        kf(o[0], xp, xs, codes, scp, bip, K);
        kfp(o[1], xp, xs, codes, scp, bip, K);
        kb(o[2], xa, xs, codes, scp, bip, K);
        kbp(o[3], xa, xs, codes, scp, bip, K);
        kb2(o[4], xa, xs, codes, scp, bip, K);
        kbw(o[5], xa, xs, codes, scp, bip, K);
        for (int r = 0; r < 4; r++) {
            double ref = 0;
            for (int64_t i = 0; i < K; i++) {
                int q = (codes[r * rowb + i / 2] >> (4 * (i & 1))) & 15;
                ref += ((double)scp[r][i / GS] * q + bip[r][i / GS]) * x[i];
            }
            printf("row %d ref %.7f  F %.7f  FP %.7f  B %.7f  BP %.7f B2 %.7f BW %.7f\n", r, ref, o[0][r], o[1][r], o[2][r], o[3][r], o[4][r], o[5][r]);
        }
    }
    volatile float sink = 0;
    double best[7] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30};
    for (int rep = 0; rep < reps; rep++) {
        for (int v = 0; v < 7; v++) {
            double t0 = now();
            float o[4], acc = 0;
            if (v == 0) {
                __m512i a = _mm512_setzero_si512();
                for (size_t i = 0; i < (size_t)N * rowb; i += 256) {
                    const __m512i *q = (const __m512i *)(codes + i);
                    a = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_add_epi32(_mm512_load_si512(q), _mm512_load_si512(q + 1)),
                                                             _mm512_add_epi32(_mm512_load_si512(q + 2), _mm512_load_si512(q + 3))));
                }
                acc = (float)_mm512_reduce_add_epi32(a);
            } else
                for (int64_t n = 0; n < N; n += 4) {
                    const uint8_t *c = codes + n * rowb;
                    if (v == 1) kf(o, xp, xs, c, scp, bip, K);
                    else if (v == 2) kfp(o, xp, xs, c, scp, bip, K);
                    else if (v == 3) kb(o, xa, xs, c, scp, bip, K);
                    else if (v == 4) kbp(o, xa, xs, c, scp, bip, K);
                    else if (v == 5) kb2(o, xa, xs, c, scp, bip, K);
                    else kbw(o, xa, xs, c, scp, bip, K);
                    acc += o[0];
                }
            double t = now() - t0;
            sink += acc;
            if (t < best[v]) best[v] = t;
        }
    }
    const char *nm[7] = {"read", "F", "FP", "B", "BP", "B2P", "BWP"};
    double gb = (double)N * rowb / 1e9;
    printf("K=%lld N=%lld %.0f MiB prefetch %lld:", (long long)K, (long long)N, N * rowb / 1048576.0, (long long)PF);
    for (int v = 0; v < 7; v++) printf("  %s %.1f GB/s (%.1f Gw/s)", nm[v], gb / best[v], 2 * gb / best[v]);
    printf("\n");
    return 0;
}
