/* Shared pieces of the single-kernel decode A/B benchmarks
 * (dev/bench_decode_ab_kernel.c: 4-bit, dev/bench_decode_ab_kernel8.c:
 * 8-bit): the thread CPU clock, a sort comparison for medians, and a
 * synthetic MLX weight (group GS, bf16 scales/biases, pseudo-random codes)
 * in huge-page-backed memory. Not part of the build or the tests;
 * header-only (static functions, one includer per binary). */
#ifndef PT_DEV_KERNEL_AB_H
#define PT_DEV_KERNEL_AB_H

#include "base/half.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define GS 64 /* the group size of every weight */

/* CPU time of the calling thread, seconds. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* qsort comparison of doubles (ascending). */
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* An N x K weight: codes [N, K*bits/8] bytes, bf16 scales and biases [N, K/GS].
 */
typedef struct {
    uint8_t *codes;
    uint16_t *sc, *bi;
    int64_t N, K;
} wt;

/* n bytes of anonymous memory, huge pages asked for; aborts on failure. */
static void *big(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    madvise(p, n, MADV_HUGEPAGE);
    return p;
}

/* Fills w with an N x K weight of `bits` (4 or 8): codes from a fixed LCG,
 * scale of group i scale_step·(i % 7 + 1), bias -0.02·(i % 5 + 1). */
static void make(wt *w, int64_t N, int64_t K, int bits, float scale_step) {
    const int64_t nc = N * K * bits / 8;
    w->N = N, w->K = K;
    w->codes = big((size_t)nc);
    w->sc = big((size_t)(N * K / GS) * 2);
    w->bi = big((size_t)(N * K / GS) * 2);
    uint32_t s = 12345;
    for (int64_t i = 0; i < nc; i++)
        w->codes[i] = (uint8_t)((s = s * 1664525u + 1013904223u) >> 24);
    for (int64_t i = 0; i < N * K / GS; i++) {
        w->sc[i] = pt_f32_to_bf16(scale_step * (float)((i % 7) + 1));
        w->bi[i] = pt_f32_to_bf16(-0.02f * (float)((i % 5) + 1));
    }
}

#endif
