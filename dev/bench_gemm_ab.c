/* A/B of the prefill inner kernels on already-dequantized f32 weights, one
 * thread, interleaved in one run (the machine is shared): A = one dot
 * product per (token, row) (the first prefill path), B = the packed 12 × 32
 * register tile (gemm_32). Both over the same [T, K] x and [N, K] W.
 *   dev/build.sh && dev/bench_gemm_ab [T] [N] [K] [reps] */
#include "backend/cpu/cpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time of this thread: robust to other processes */
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int64_t T = argc > 1 ? atoll(argv[1]) : 96, N = argc > 2 ? atoll(argv[2]) : 512, K = argc > 3 ? atoll(argv[3]) : 2048;
    int reps = argc > 4 ? atoi(argv[4]) : 10;
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    float *x = aligned_alloc(64, T * K * 4), *w = aligned_alloc(64, N * K * 4), *y = aligned_alloc(64, T * N * 4);
    for (int64_t i = 0; i < T * K; i++) x[i] = (float)(i % 7) - 3;
    for (int64_t i = 0; i < N * K; i++) w[i] = (float)(i % 5) - 2;
    int64_t tiles = (T + 11) / 12, KC = 256;
    float *xpk = aligned_alloc(64, tiles * 12 * KC * 4), *wp = aligned_alloc(64, KC * 32 * 4);
    double ba = 1e30, bb = 1e30, bc = 1e30, tkern = 0;
    float *yc = aligned_alloc(64, (size_t)(N / 32 + 1) * (size_t)tiles * 12 * 32 * 4);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int64_t n = 0; n < N; n++)
            for (int64_t t = 0; t < T; t++) y[t * N + n] = k->dot_f32(x + t * K, w + n * K, K);
        double t1 = now();
        for (int64_t kc0 = 0; kc0 < K; kc0 += KC) {
            for (int64_t ti = 0; ti < tiles; ti++)
                for (int64_t t = 0; t < 12; t++)
                    for (int64_t kk = 0; kk < KC; kk++)
                        xpk[ti * 12 * KC + kk * 12 + t] = ti * 12 + t < T ? x[(ti * 12 + t) * K + kc0 + kk] : 0;
            for (int64_t p0 = 0; p0 < N; p0 += 32) {
                for (int rr = 0; rr < 32; rr++)
                    for (int64_t kk = 0; kk < KC; kk++) wp[kk * 32 + rr] = w[(p0 + rr) * K + kc0 + kk];
                double tk = now();
                for (int64_t ti = 0; ti < tiles; ti++) {
                    int mr = (int)(T - ti * 12 < 12 ? T - ti * 12 : 12);
                    k->gemm_32(y + ti * 12 * N + p0, N, xpk + ti * 12 * KC, wp, mr, KC, kc0 == 0);
                }
                tkern += now() - tk;
            }
        }
        double t2 = now();
        /* C: B with each panel's outputs in a contiguous [T][32] buffer (no 4 KiB-aliased rows) */
        for (int64_t kc0 = 0; kc0 < K; kc0 += KC) {
            for (int64_t ti = 0; ti < tiles; ti++)
                for (int64_t t = 0; t < 12; t++)
                    for (int64_t kk = 0; kk < KC; kk++)
                        xpk[ti * 12 * KC + kk * 12 + t] = ti * 12 + t < T ? x[(ti * 12 + t) * K + kc0 + kk] : 0;
            for (int64_t p0 = 0; p0 < N; p0 += 32) {
                for (int rr = 0; rr < 32; rr++)
                    for (int64_t kk = 0; kk < KC; kk++) wp[kk * 32 + rr] = w[(p0 + rr) * K + kc0 + kk];
                float *cb = yc + (p0 / 32) * tiles * 12 * 32;
                for (int64_t ti = 0; ti < tiles; ti++) {
                    int mr = (int)(T - ti * 12 < 12 ? T - ti * 12 : 12);
                    k->gemm_32(cb + ti * 12 * 32, 32, xpk + ti * 12 * KC, wp, mr, KC, kc0 == 0);
                }
            }
        }
        double t3 = now();
        if (t3 - t2 < bc) bc = t3 - t2;
        if (t1 - t0 < ba) ba = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
    }
    double f = 2.0 * T * N * K;
    printf("T=%lld N=%lld K=%lld: A dot per (t,n) %.1f GFLOP/s | B packed 12x32 tile %.1f GFLOP/s (B/A %.2fx) | "
           "C = B into a contiguous buffer %.1f GFLOP/s\n",
           (long long)T, (long long)N, (long long)K, f / ba / 1e9, f / bb / 1e9, ba / bb, f / bc / 1e9);
    printf("  B's tile calls alone: %.1f GFLOP/s\n", f * reps / tkern / 1e9);
    return 0;
}
