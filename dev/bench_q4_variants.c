/* A/B of 4-bit decode inner-loop variants (not part of the build or the
 * tests), one thread, in L2, interleaved in one run; each variant is checked
 * against the plain C reference first. Four rows per call, group 64.
 *   V0 lo nibble via vpermps (table 0..15), hi via shift + convert (shipped)
 *   V1 lo via vpermps, hi masked but unshifted (and 0xF0) + convert, against x_odd/16
 *   V2 both via mask/shift + convert
 *   V3 both via vpermps (hi after a shift)
 *   dev/build.sh && dev/bench_q4_variants [rows] [K] [reps] */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define GS 64
typedef __m512 (*lofn)(__m512i v);

#define VARIANT(NAME, LO, HI)                                                                                   \
    static void NAME(float *out, const float *xp, const uint8_t *const *codes, const float *const *sc, int64_t K) { \
        const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);                \
        const __m512i m15 = _mm512_set1_epi32(15), mf0 = _mm512_set1_epi32(0xf0);                               \
        (void)lut, (void)m15, (void)mf0;                                                                        \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                             \
        for (int64_t g = 0; g < K / GS; g++) {                                                                  \
            __m512 l0 = _mm512_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;     \
            for (int64_t b = g * GS; b < (g + 1) * GS; b += 32) {                                               \
                __m512 xl = _mm512_loadu_ps(xp + b), xh = _mm512_loadu_ps(xp + b + 16);                         \
                __m512i v;                                                                                      \
                v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes[0] + b / 2)));                \
                l0 = _mm512_fmadd_ps(LO, xl, l0), h0 = _mm512_fmadd_ps(HI, xh, h0);                             \
                v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes[1] + b / 2)));                \
                l1 = _mm512_fmadd_ps(LO, xl, l1), h1 = _mm512_fmadd_ps(HI, xh, h1);                             \
                v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes[2] + b / 2)));                \
                l2 = _mm512_fmadd_ps(LO, xl, l2), h2 = _mm512_fmadd_ps(HI, xh, h2);                             \
                v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes[3] + b / 2)));                \
                l3 = _mm512_fmadd_ps(LO, xl, l3), h3 = _mm512_fmadd_ps(HI, xh, h3);                             \
            }                                                                                                   \
            a0 = _mm512_fmadd_ps(_mm512_add_ps(l0, h0), _mm512_set1_ps(sc[0][g]), a0);                          \
            a1 = _mm512_fmadd_ps(_mm512_add_ps(l1, h1), _mm512_set1_ps(sc[1][g]), a1);                          \
            a2 = _mm512_fmadd_ps(_mm512_add_ps(l2, h2), _mm512_set1_ps(sc[2][g]), a2);                          \
            a3 = _mm512_fmadd_ps(_mm512_add_ps(l3, h3), _mm512_set1_ps(sc[3][g]), a3);                          \
        }                                                                                                       \
        out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);                                   \
        out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);                                   \
    }

VARIANT(v0, _mm512_permutexvar_ps(v, lut), _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)))
VARIANT(v1, _mm512_permutexvar_ps(v, lut), _mm512_cvtepi32_ps(_mm512_and_si512(v, mf0)))
VARIANT(v2, _mm512_cvtepi32_ps(_mm512_and_si512(v, m15)), _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)))
VARIANT(v3, _mm512_permutexvar_ps(v, lut), _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut))

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 256, K = argc > 2 ? atoll(argv[2]) : 2048;
    int reps = argc > 3 ? atoi(argv[3]) : 2000;
    uint8_t *c = aligned_alloc(64, N * K / 2);
    float *sc = aligned_alloc(64, N * (K / GS) * 4), *x = aligned_alloc(64, K * 4), *xp = aligned_alloc(64, K * 4),
          *xp16 = aligned_alloc(64, K * 4), *y = aligned_alloc(64, N * 4);
    for (int64_t i = 0; i < N * K / 2; i++) c[i] = (uint8_t)((i * 2654435761u) >> 13);
    for (int64_t i = 0; i < N * (K / GS); i++) sc[i] = 0.01f * (float)(i % 9) - 0.04f;
    for (int64_t i = 0; i < K; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int64_t b = 0; b < K; b += 32)
        for (int i = 0; i < 16; i++) {
            xp[b + i] = xp16[b + i] = x[b + 2 * i];
            xp[b + 16 + i] = x[b + 2 * i + 1];
            xp16[b + 16 + i] = x[b + 2 * i + 1] / 16.0f; /* exact: a power of two */
        }
    void (*fn[4])(float *, const float *, const uint8_t *const *, const float *const *, int64_t) = {v0, v1, v2, v3};
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int v = 0; v < 4; v++) { /* correctness against plain C */
        double maxerr = 0;
        for (int64_t n = 0; n < N; n += 4) {
            const uint8_t *cr[4] = {c + n * K / 2, c + (n + 1) * K / 2, c + (n + 2) * K / 2, c + (n + 3) * K / 2};
            const float *sr[4] = {sc + n * (K / GS), sc + (n + 1) * (K / GS), sc + (n + 2) * (K / GS), sc + (n + 3) * (K / GS)};
            float o[4];
            fn[v](o, v == 1 ? xp16 : xp, cr, sr, K);
            for (int r = 0; r < 4; r++) {
                double ref = 0;
                for (int64_t j = 0; j < K; j++) {
                    int q = j % 2 ? cr[r][j / 2] >> 4 : cr[r][j / 2] & 15;
                    ref += (double)sr[r][j / GS] * q * x[j];
                }
                maxerr = fmax(maxerr, fabs(o[r] - ref));
            }
        }
        printf("V%d max |err| vs plain C %.3g\n", v, maxerr);
    }
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 4; v++) {
            double t0 = now();
            for (int64_t n = 0; n < N; n += 4) {
                const uint8_t *cr[4] = {c + n * K / 2, c + (n + 1) * K / 2, c + (n + 2) * K / 2, c + (n + 3) * K / 2};
                const float *sr[4] = {sc + n * (K / GS), sc + (n + 1) * (K / GS), sc + (n + 2) * (K / GS),
                                      sc + (n + 3) * (K / GS)};
                fn[v](y + n, v == 1 ? xp16 : xp, cr, sr, K);
            }
            double t = now() - t0;
            if (t < best[v]) best[v] = t;
        }
    for (int v = 0; v < 4; v++) printf("V%d: %.2f Gweights/s\n", v, (double)N * K / best[v] / 1e9);
    return 0;
}
