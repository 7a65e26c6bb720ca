/* A/B of the AVX-512 attention score kernels in cache (not part of the build
 * or the tests), one thread, interleaved: A = per-key reductions (the kernel
 * called on runs of 15 keys, below the 16-key block path), B = 16-key blocks
 * with one transposed reduction. G = 4 heads of 64, bf16 keys.
 *   dev/build.sh && dev/bench_scores_ab [keys] [reps] */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 2040;
    int reps = argc > 2 ? atoi(argv[2]) : 2000, G = 4, hd = 64;
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    uint16_t *K = aligned_alloc(64, n * hd * 2);
    float *q = aligned_alloc(64, G * hd * 4), *Sa = aligned_alloc(64, G * n * 4), *Sb = aligned_alloc(64, G * n * 4);
    for (int64_t i = 0; i < n * hd; i++) K[i] = pt_f32_to_bf16((float)((i * 7) % 19) / 19.0f - 0.5f);
    for (int i = 0; i < G * hd; i++) q[i] = (float)(i % 17) / 17.0f - 0.5f;
    double ba = 1e30, bb = 1e30, maxd = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int64_t j = 0; j < n; j += 15) k->attn_scores(Sa + j, n, q, G, hd, K + j * hd, n - j < 15 ? n - j : 15, 1);
        double t1 = now();
        k->attn_scores(Sb, n, q, G, hd, K, n, 1);
        double t2 = now();
        if (t1 - t0 < ba) ba = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
    }
    for (int64_t i = 0; i < G * n; i++) maxd = fmax(maxd, fabs(Sa[i] - Sb[i]));
    printf("keys=%lld G=%d hd=%d: A per-key %.1f ns/key, B 16-key blocks %.1f ns/key (A/B %.2fx), max |A-B| %.2g\n",
           (long long)n, G, hd, ba / n * 1e9, bb / n * 1e9, ba / bb, maxd);
    return 0;
}
