/* Helpers shared by the CUDA benchmarks (tests/cuda/bench_*.c,
 * dev/cuda_gemv_bench.c): a monotonic clock, a seeded xorshift source, a
 * comparison for sorting timings (medians), and DIE for a failed engine call.
 * Header-only: each benchmark includes it once. Not a test harness. */
#ifndef PT_TESTS_CUDA_BENCH_UTIL_H
#define PT_TESTS_CUDA_BENCH_UTIL_H

#include "petrel.h" /* pt_last_error */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 88172645463325252ull;
static inline uint32_t ru(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

/* qsort comparison of doubles (ascending). */
static inline int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define DIE(...)                                    \
    do {                                            \
        fprintf(stderr, __VA_ARGS__);               \
        fprintf(stderr, ": %s\n", pt_last_error()); \
        exit(1);                                    \
    } while (0)

#endif
