/* Helpers shared by the CUDA benchmarks (tests/cuda/bench_*.c,
 * dev/cuda_gemv_bench.c): a monotonic clock, a seeded xorshift source, a
 * comparison for sorting timings (medians), DIE for a failed engine call,
 * backend memory or death (bench_alloc),
 * the benchmarks' CUDA backend (bench_cuda_open) and the median of a
 * captured graph's replays (bench_graph_median_us).
 * Header-only: each benchmark includes it once. Not a test harness. */
#ifndef PT_TESTS_CUDA_BENCH_UTIL_H
#define PT_TESTS_CUDA_BENCH_UTIL_H

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
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

/* n bytes of backend memory; dies when there are none. */
static inline void *bench_alloc(pt_backend *be, size_t n) {
    void *p = be->ops->alloc(be, n);
    if (!p) DIE("alloc %zu", n);
    return p;
}

/* A CUDA backend on device 0 with bf16 activations; prints the device line
 * the results are recorded with. Dies when there is none. */
/* Up to max integers from a list such as "0 1" or "0,1" (GEMV_LOOPS): the
 * count read; stops at the first thing that is not a number. */
static inline int bench_ints(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s) {
            if (*s != ',' && *s != ' ') break;
            s++;
            continue;
        }
        out[n++] = (int)v;
        s = end;
    }
    return n;
}

static inline pt_backend *bench_cuda_open(void) {
    pt_backend *be = NULL;
    pt_cuda_params cp = {0, PT_ACT_BF16};
    if (pt_backend_cuda_create(&be, &cp) != PT_OK) DIE("cuda backend");
    pt_cuda_device_info info;
    pt_cuda_device_query(0, &info);
    char desc[300];
    pt_cuda_device_describe(&info, desc, sizeof desc);
    printf("device: %s\n", desc);
    return be;
}

/* Ends the graph capture begun on be, replays it once (warm-up), then times
 * 5 replays: the median µs of one replay divided by per (the passes it
 * holds). Frees the graph. Dies when capture or a replay fails. */
static inline double bench_graph_median_us(pt_backend *be, double per) {
    pt_cuda_graph *g = NULL;
    if (pt_cuda_graph_end(be, &g) != PT_OK) DIE("end");
    pt_cuda_graph_launch(be, g);
    be->ops->sync(be);
    double t[5];
    for (int i = 0; i < 5; i++) {
        const double t0 = now();
        pt_cuda_graph_launch(be, g);
        if (be->ops->sync(be) != PT_OK) DIE("sync");
        t[i] = (now() - t0) / per;
    }
    pt_cuda_graph_free(&g);
    qsort(t, 5, sizeof t[0], cmpd);
    return t[2] * 1e6;
}

#endif
