/* The 4-bit bf16-dot decode kernel (qdot4_x4_bf16 in kernels_avx512.c), two
 * ways of extracting the four nibbles of each 16-bit word, A/B in one run
 * (not part of the build or the tests). One thread, CPU time; four rows per
 * call, group 64, K = 2048; in cache (256 KiB of codes) and from memory
 * (MiB of codes, huge pages). Both variants must give the same bits.
 *   A  three 16-bit shifts (v >> 4, v >> 8, v >> 12), each masked into 0x4300
 *   B  one shift (t = v >> 4); v >> 8 and t >> 8 as byte shuffles (vpshufb)
 *   dev/build.sh && dev/bench_q4_bf16_ab [MiB] [reps] */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define K 2048
#define GS 64
#define PF 8192

static void kern(int variant, float *out, const uint16_t *xa, const uint8_t *const *codes, const float *const *sc) {
    const __m512i m15 = _mm512_set1_epi16(15), mag = _mm512_set1_epi16(0x4300);
    const __m512i shuf = _mm512_set4_epi32((int)0x800f800d, (int)0x800b8009, (int)0x80078005, (int)0x80038001);
    const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __mmask8 smask = 3;
    const uint8_t *c0 = codes[0], *c1 = codes[1], *c2 = codes[2], *c3 = codes[3];
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define ROW(r)                                                                                                   \
    do {                                                                                                         \
        __m512i v_ = _mm512_loadu_si512((const void *)(c##r + b / 2));                                           \
        __m512bh n0_, n1_, n2_, n3_;                                                                             \
        if (variant == 0) {                                                                                      \
            n0_ = (__m512bh)_mm512_ternarylogic_epi32(v_, m15, mag, 0xEA);                                       \
            n1_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 4), m15, mag, 0xEA);                 \
            n2_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v_, 8), m15, mag, 0xEA);                 \
            n3_ = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(v_, 12), mag);                                     \
        } else {                                                                                                 \
            __m512i t_ = _mm512_srli_epi16(v_, 4);                                                               \
            n0_ = (__m512bh)_mm512_ternarylogic_epi32(v_, m15, mag, 0xEA);                                       \
            n1_ = (__m512bh)_mm512_ternarylogic_epi32(t_, m15, mag, 0xEA);                                       \
            n2_ = (__m512bh)_mm512_ternarylogic_epi32(_mm512_shuffle_epi8(v_, shuf), m15, mag, 0xEA);            \
            n3_ = (__m512bh)_mm512_or_si512(_mm512_shuffle_epi8(t_, shuf), mag);                                 \
        }                                                                                                        \
        __m512 d_ = _mm512_dpbf16_ps(_mm512_setzero_ps(), n0_, x0);                                              \
        d_ = _mm512_dpbf16_ps(d_, n1_, x1);                                                                      \
        d_ = _mm512_dpbf16_ps(d_, n2_, x2);                                                                      \
        d_ = _mm512_dpbf16_ps(d_, n3_, x3);                                                                      \
        __m512 s_ = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(smask, sc[r] + g))); \
        a##r = _mm512_fmadd_ps(d_, s_, a##r);                                                                    \
    } while (0)
    for (int64_t b = 0, g = 0; b < K; b += 128, g += 2) {
        _mm_prefetch((const char *)(c0 + PF + 2 * b), _MM_HINT_T0);
        _mm_prefetch((const char *)(c0 + PF + 2 * b + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(c0 + PF + 2 * b + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(c0 + PF + 2 * b + 192), _MM_HINT_T0);
        __m512bh x0 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b));
        __m512bh x1 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 32));
        __m512bh x2 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 64));
        __m512bh x3 = (__m512bh)_mm512_loadu_si512((const void *)(xa + b + 96));
        ROW(0);
        ROW(1);
        ROW(2);
        ROW(3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

static float run(int variant, const uint8_t *codes, size_t rows, const uint16_t *xa, const float *sc, float *y) {
    for (size_t n = 0; n < rows; n += 4) {
        const uint8_t *c[4] = {codes + n * K / 2, codes + (n + 1) * K / 2, codes + (n + 2) * K / 2,
                               codes + (n + 3) * K / 2};
        const float *s[4] = {sc, sc + 32, sc + 64, sc + 96};
        kern(variant, y + n, xa, c, s);
    }
    return y[0];
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoll(argv[1]) : 512;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    size_t big = mib << 20, small = 256 << 10;
    uint8_t *codes = aligned_alloc(2 << 20, big);
    madvise(codes, big, MADV_HUGEPAGE);
    for (size_t i = 0; i < big; i++) codes[i] = (uint8_t)((i * 2654435761u) >> 13);
    uint16_t *xa = aligned_alloc(64, 2 * K);
    for (int i = 0; i < K; i++) xa[i] = (uint16_t)(0x3f00 + (i * 37) % 200); /* bf16 values in [0.5, 2) */
    float sc[128];
    for (int i = 0; i < 128; i++) sc[i] = 0.01f * (float)(i % 7 + 1);
    size_t rows_big = big / (K / 2), rows_small = small / (K / 2);
    float *y0 = malloc(4 * rows_big), *y1 = malloc(4 * rows_big);
    run(0, codes, rows_big, xa, sc, y0);
    run(1, codes, rows_big, xa, sc, y1);
    if (memcmp(y0, y1, 4 * rows_big)) {
        printf("variants differ\n");
        return 1;
    }
    double bs[2] = {1e30, 1e30}, bb[2] = {1e30, 1e30};
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 2; v++) {
            double t0 = now();
            for (int i = 0; i < 64; i++) run(v, codes, rows_small, xa, sc, y0);
            double t1 = now();
            run(v, codes, rows_big, xa, sc, y0);
            double t2 = now();
            if ((t1 - t0) / 64 < bs[v]) bs[v] = (t1 - t0) / 64;
            if (t2 - t1 < bb[v]) bb[v] = t2 - t1;
        }
    for (int v = 0; v < 2; v++)
        printf("%c: in cache %.1f Gweights/s, from memory (%zu MiB) %.1f GB/s of codes\n", 'A' + v,
               rows_small * K / bs[v] / 1e9, mib, big / bb[v] / 1e9);
    return 0;
}
