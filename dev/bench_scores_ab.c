/* The AVX-512 attention score kernels in cache (not part of the build or the
 * tests), one thread: A = attn_scores a token per call (a decode step's
 * kernel), B = attn_scores_t with 8 tokens per call (a prefill group of
 * cpu_attention.c), C = attn_scores_t a token per call; G = 4 heads of 64,
 * bf16 keys; ns per (token, key), and the largest |A - B| (two orders of
 * the same sums) and whether B and C give the same bits (they must).
 *   dev/build.sh && dev/bench_scores_ab [keys] [reps] */
#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 2040;
    int reps = argc > 2 ? atoi(argv[2]) : 200, G = 4, hd = 64, NT = 8;
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    uint16_t *K = aligned_alloc(64, n * hd * 2);
    float *q = aligned_alloc(64, NT * G * hd * 4), *Sa = aligned_alloc(64, NT * G * n * 4),
          *Sb = aligned_alloc(64, NT * G * n * 4);
    for (int64_t i = 0; i < n * hd; i++) K[i] = pt_f32_to_bf16((float)((i * 7) % 19) / 19.0f - 0.5f);
    for (int i = 0; i < NT * G * hd; i++) q[i] = (float)(i % 17) / 17.0f - 0.5f;
    float *Sc = aligned_alloc(64, NT * G * n * 4);
    double ba = 1e30, bb = 1e30, bc = 1e30, maxd = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int u = 0; u < NT; u++) k->attn_scores(Sa + u * G * n, n, q + u * G * hd, G, hd, K, n, 1);
        double t1 = now();
        k->attn_scores_t(Sb, n, q, G * hd, NT, G, hd, K, n, 1);
        double t2 = now();
        for (int u = 0; u < NT; u++) k->attn_scores_t(Sc + u * G * n, n, q + u * G * hd, G * hd, 1, G, hd, K, n, 1);
        double t3 = now();
        if (t1 - t0 < ba) ba = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
        if (t3 - t2 < bc) bc = t3 - t2;
    }
    for (int64_t i = 0; i < (int64_t)NT * G * n; i++) maxd = fmax(maxd, fabs(Sa[i] - Sb[i]));
    printf("keys=%lld G=%d hd=%d, ns a (token, key): A %.2f, B (%d tokens a call) %.2f, C %.2f; A/B %.2fx; "
           "max |A-B| %.2g; B, C same bits: %s\n",
           (long long)n, G, hd, ba / n / NT * 1e9, NT, bb / n / NT * 1e9, bc / n / NT * 1e9, ba / bb, maxd,
           memcmp(Sb, Sc, sizeof(float) * NT * G * n) ? "NO" : "yes");
    return 0;
}
