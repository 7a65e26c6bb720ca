/* The 4-bit decode kernels alone, A/B in one process (not part of the build
 * or the tests): the bf16 kernel (qdot4_x4_bf16s, bf16 parameters as stored)
 * against the integer-piece kernel (pt_cpu_qdot4_x4_xints), one thread, CPU
 * time, alternating per repetition; K values per row, group 64, 4-row calls
 * over N rows, rows in cache (first size) and streamed from memory (second
 * size, huge-page-backed when the kernel allows it). Prints Gweights/s and GB/s of codes +
 * scales/biases (medians over repetitions).
 *   make && dev/build.sh && dev/bench_decode_ab_kernel [K] [cache KiB] [stream MiB] [reps] */
#include "backend/cpu/cpu_internal.h"
#include "base/half.h"
#include "kernel_ab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static float sink;

/* one pass over all rows: variant 0 = bf16 kernel, 1 = integer pieces */
static double pass(int v, const wt *w, const uint16_t *xa, const int8_t *xq, const float *st, const float *xs) {
    int64_t K = w->K, ng = K / GS;
    double t0 = cpu_now();
    for (int64_t n = 0; n < w->N; n += 4) {
        const uint8_t *codes[4];
        const uint16_t *sc[4], *bi[4];
        for (int r = 0; r < 4; r++) {
            codes[r] = w->codes + (n + r) * K / 2;
            sc[r] = w->sc + (n + r) * ng;
            bi[r] = w->bi + (n + r) * ng;
        }
        float out[4];
        if (v == 0) pt_cpu_kernels_avx512.qdot4_x4_bf16s(out, xa, xs, codes, sc, bi, K, GS);
        else pt_cpu_qdot4_x4_xints(out, xq, st, xs, codes, sc, bi, K, GS);
        sink += out[0];
    }
    return cpu_now() - t0;
}

int main(int argc, char **argv) {
    int64_t K = argc > 1 ? atoll(argv[1]) : 2048;
    int64_t cache_kib = argc > 2 ? atoll(argv[2]) : 256, stream_mib = argc > 3 ? atoll(argv[3]) : 512;
    int reps = argc > 4 ? atoi(argv[4]) : 9;
    if (K % 128 || reps < 1 || reps > 99) {
        fprintf(stderr, "K must be a multiple of 128, reps 1..99\n");
        return 1;
    }
    float *x = malloc(sizeof(float) * (size_t)K), *xs = malloc(sizeof(float) * (size_t)K), *st = malloc(sizeof(float) * (size_t)K);
    uint16_t *xa = aligned_alloc(64, (size_t)K * 2);
    int8_t *xq = aligned_alloc(64, (size_t)K * 3);
    uint32_t s = 777;
    for (int64_t i = 0; i < K; i++) x[i] = pt_round_bf16((float)((int)((s = s * 1664525u + 1013904223u) >> 16) - 32768) / 16384.0f);
    for (int64_t g = 0; g < K / GS; g++) {
        float a = 0;
        for (int64_t j = g * GS; j < (g + 1) * GS; j++) a += x[j];
        xs[g] = a;
    }
    if (!pt_cpu_arrange_x4_bf16(xa, x, K) || !pt_cpu_arrange_xint(xq, st, x, K, GS)) {
        fprintf(stderr, "x not arranged\n");
        return 1;
    }
    const int64_t sizes[2] = {cache_kib << 10, stream_mib << 20};
    for (int si = 0; si < 2; si++) {
        wt w;
        int64_t N = sizes[si] / (K / 2) / 4 * 4;
        if (N < 4) N = 4;
        make(&w, N, K, 4, 0.01f);
        int64_t inner = si == 0 ? (int64_t)((256ll << 20) / (N * K / 2)) : 1; /* ~256 MiB of codes per timing */
        if (inner < 1) inner = 1;
        double t[2][99];
        for (int rep = 0; rep < reps; rep++)
            for (int v = 0; v < 2; v++) {
                double a = 0;
                for (int64_t i = 0; i < inner; i++) a += pass(v, &w, xa, xq, st, xs);
                t[v][rep] = a / inner;
            }
        double bytes = (double)N * K / 2 + 2.0 * N * (K / GS) * 2;
        printf("%s: N %lld K %lld (%.1f MiB codes)\n", si ? "streaming" : "in cache", (long long)N, (long long)K,
               N * K / 2 / 1048576.0);
        for (int v = 0; v < 2; v++) {
            qsort(t[v], (size_t)reps, sizeof(double), cmpd);
            double m = t[v][reps / 2];
            printf("  %-16s %6.2f Gweights/s  %6.2f GB/s\n", v ? "integer pieces" : "bf16 kernel", N * K / m / 1e9,
                   bytes / m / 1e9);
        }
        munmap(w.codes, (size_t)(N * K / 2));
        munmap(w.sc, (size_t)(N * K / GS) * 2);
        munmap(w.bi, (size_t)(N * K / GS) * 2);
    }
    printf("(sink %g)\n", sink);
    return 0;
}
