/* The 8-bit decode kernels alone, A/B in one process (not part of the build
 * or the tests): the f32 kernel (qdot8_x4, x in f32, scales/biases converted
 * from bf16 per 4-row block as mm_direct_q48 does) against the integer-piece
 * kernel (pt_cpu_qdot8_x4_xints, bf16 parameters as stored) and a plain
 * streaming read of the same bytes (codes + scales + biases), one thread,
 * CPU time, alternating per repetition; K values per row, group 64, 4-row
 * calls over N rows, rows in cache (first size) and streamed from memory
 * (second size, huge-page-backed). Prints Gweights/s and GB/s (medians over
 * repetitions) and the spread (min–max).
 *   make && dev/build.sh && dev/bench_decode_ab_kernel8 [K] [cache KiB] [stream MiB] [reps] */
#include "backend/cpu/cpu_internal.h"
#include "base/half.h"
#include "kernel_ab.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* ALT_KERNEL: a fourth variant, alt_qdot8_x4_xints — a copy of
 * qdot_xint_avx512.c built with other settings and its symbols renamed, e.g.
 *   cc -O2 -Iinclude -Isrc -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 \
 *      -Dpt_cpu_qdot8_x4_xints=alt_qdot8_x4_xints -Dpt_cpu_arrange_xint8=alt_arrange8 ... (every
 *      exported symbol) -c -o /tmp/alt.o copy.c
 *   cc ... -DALT_KERNEL -o /tmp/k8alt dev/bench_decode_ab_kernel8.c /tmp/alt.o build/libpetrel.a ...
 * (how the prefetch variants in bench/RESULTS.md were compared in one process) */
#ifdef ALT_KERNEL
#define NV 4
void alt_qdot8_x4_xints(float *out, const int8_t *xq, const float *xstep, const float *xs,
                        const uint8_t *const *codes, const uint16_t *const *sc, const uint16_t *const *bi, int64_t K,
                        int gs);
#else
#define NV 3
#endif

static float sink;

static long long rd(const uint8_t *p, size_t n) {
    __m512i a = _mm512_setzero_si512();
    for (size_t i = 0; i + 256 <= n; i += 256) {
        const __m512i *q = (const __m512i *)(p + i);
        a = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_add_epi32(_mm512_loadu_si512(q), _mm512_loadu_si512(q + 1)),
                                                 _mm512_add_epi32(_mm512_loadu_si512(q + 2), _mm512_loadu_si512(q + 3))));
    }
    return _mm512_reduce_add_epi32(a);
}

/* one pass over all rows: v 0 = f32 kernel, 1 = integer pieces, 2 = plain read */
static double pass(int v, const wt *w, const float *x, const int8_t *xq, const float *st, const float *xs,
                   float *prm) {
    int64_t K = w->K, ng = K / GS;
    double t0 = cpu_now();
    if (v == 2) {
        sink += (float)(rd(w->codes, (size_t)(w->N * K)) + rd((const uint8_t *)w->sc, (size_t)(w->N * ng) * 2) +
                        rd((const uint8_t *)w->bi, (size_t)(w->N * ng) * 2));
        return cpu_now() - t0;
    }
    for (int64_t n = 0; n < w->N; n += 4) {
        const uint8_t *codes[4];
        const uint16_t *sc[4], *bi[4];
        const float *scf[4], *bif[4];
        for (int r = 0; r < 4; r++) {
            codes[r] = w->codes + (n + r) * K;
            sc[r] = w->sc + (n + r) * ng;
            bi[r] = w->bi + (n + r) * ng;
            if (v == 0) { /* as mm_direct_q48: the block's parameters converted to f32 */
                pt_cpu_kernels_avx512.cvt_bf16(prm + r * 2 * ng, sc[r], ng);
                pt_cpu_kernels_avx512.cvt_bf16(prm + r * 2 * ng + ng, bi[r], ng);
                scf[r] = prm + r * 2 * ng;
                bif[r] = prm + r * 2 * ng + ng;
            }
        }
        float out[4];
        if (v == 0) pt_cpu_kernels_avx512.qdot8_x4(out, x, xs, codes, scf, bif, K, GS);
#ifdef ALT_KERNEL
        else if (v == 3) alt_qdot8_x4_xints(out, xq, st, xs, codes, sc, bi, K, GS);
#endif
        else pt_cpu_qdot8_x4_xints(out, xq, st, xs, codes, sc, bi, K, GS);
        sink += out[0];
    }
    return cpu_now() - t0;
}

int main(int argc, char **argv) {
    int64_t K = argc > 1 ? atoll(argv[1]) : 2048;
    int64_t cache_kib = argc > 2 ? atoll(argv[2]) : 512, stream_mib = argc > 3 ? atoll(argv[3]) : 512;
    int reps = argc > 4 ? atoi(argv[4]) : 9;
    if (K % 128 || reps < 1 || reps > 99) {
        fprintf(stderr, "K must be a multiple of 128, reps 1..99\n");
        return 1;
    }
    float *x = malloc(sizeof(float) * (size_t)K), *xs = malloc(sizeof(float) * (size_t)K),
          *st = malloc(sizeof(float) * (size_t)K), *prm = aligned_alloc(64, sizeof(float) * (size_t)(8 * K / GS + 16));
    int8_t *xq = aligned_alloc(64, (size_t)K * 3);
    uint32_t s = 777;
    for (int64_t i = 0; i < K; i++)
        x[i] = pt_round_bf16((float)((int)((s = s * 1664525u + 1013904223u) >> 16) - 32768) / 16384.0f);
    for (int64_t g = 0; g < K / GS; g++) {
        float a = 0;
        for (int64_t j = g * GS; j < (g + 1) * GS; j++) a += x[j];
        xs[g] = a;
    }
    if (!pt_cpu_arrange_xint8(xq, st, x, K, GS)) {
        fprintf(stderr, "x not arranged\n");
        return 1;
    }
    const char *names[4] = {"f32 kernel", "integer pieces", "plain read", "alternative"};
    const int64_t sizes[2] = {cache_kib << 10, stream_mib << 20};
    for (int si = 0; si < 2; si++) {
        wt w;
        int64_t N = sizes[si] / K / 4 * 4;
        if (N < 4) N = 4;
        make(&w, N, K, 8, 0.001f);
        int64_t inner = si == 0 ? (int64_t)((256ll << 20) / (N * K)) : 1; /* ~256 MiB of codes per timing */
        if (inner < 1) inner = 1;
        double t[NV][99];
        for (int rep = 0; rep < reps; rep++)
            for (int v = 0; v < NV; v++) {
                double a = 0;
                for (int64_t i = 0; i < inner; i++) a += pass(v, &w, x, xq, st, xs, prm);
                t[v][rep] = a / inner;
            }
        double bytes = (double)N * K + 2.0 * N * (K / GS) * 2;
        printf("%s: N %lld K %lld (%.1f MiB codes), %d reps\n", si ? "streaming" : "in cache", (long long)N,
               (long long)K, N * K / 1048576.0, reps);
        for (int v = 0; v < NV; v++) {
            qsort(t[v], (size_t)reps, sizeof(double), cmpd);
            double m = t[v][reps / 2];
            printf("  %-16s %6.2f Gweights/s  %6.2f GB/s  (spread %.2f–%.2f GB/s)\n", names[v], N * K / m / 1e9,
                   bytes / m / 1e9, bytes / t[v][reps - 1] / 1e9, bytes / t[v][0] / 1e9);
        }
        munmap(w.codes, (size_t)(N * K));
        munmap(w.sc, (size_t)(N * K / GS) * 2);
        munmap(w.bi, (size_t)(N * K / GS) * 2);
    }
    printf("(sink %g)\n", sink);
    return 0;
}
