/* Transparent huge pages for decode weights (not part of the build or the
 * tests): the same 4-bit matrices in two copies, one madvise(MADV_HUGEPAGE)
 * and one madvise(MADV_NOHUGEPAGE), each larger than the L3; a streaming
 * read and the decode matvec (T = 1) over each copy, interleaved
 * (4K read, 4K matvec, 2M read, 2M matvec, ...), best of reps.
 *   dev/build.sh && dev/bench_hugepage [threads] [MiB] [reps] [rows] [cols] */
#include "backend/backend.h"
#include "base/half.h"
#include "base/threadpool.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "stream_read.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* 2 MiB-aligned anonymous mapping with the given THP advice */
static uint8_t *map(size_t bytes, int advice) {
    size_t al = (size_t)2 << 20, n = (bytes + 2 * al) & ~(al - 1);
    uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + al - 1) & ~(uintptr_t)(al - 1));
    madvise(a, n - al, advice);
    return a;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atoll(argv[2]) : 600;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    int64_t N = argc > 4 ? atoll(argv[4]) : 2048, K = argc > 5 ? atoll(argv[5]) : 2048;
    int gs = 64;
    size_t cb = (size_t)N * K / 2, pb = (size_t)N * (K / gs) * 2 * 2, mb = cb + pb;
    int nmat = (int)((mib << 20) / mb);
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    pt_matrix *w[2];
    uint8_t *buf[2];
    for (int h = 0; h < 2; h++) {
        buf[h] = map(mb * nmat, h ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        if (!buf[h]) return 1;
        for (size_t i = 0; i < cb * nmat; i++) buf[h][i] = (uint8_t)(i * 2654435761u >> 13);
        uint16_t *pp = (uint16_t *)(buf[h] + cb * nmat);
        for (size_t i = 0; i < pb * nmat / 2; i++) pp[i] = pt_f32_to_bf16(0.01f * (float)(i % 7) - 0.03f);
        w[h] = calloc(nmat, sizeof *w[h]);
        for (int m = 0; m < nmat; m++) {
            w[h][m] = (pt_matrix){.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = 4, .group_size = gs,
                                  .data = buf[h] + cb * m, .scales = (uint8_t *)pp + pb * m,
                                  .biases = (uint8_t *)pp + pb * m + pb / 2};
            be->ops->prepare_weight(be, &w[h][m], "w");
        }
    }
    float *x = aligned_alloc(64, K * 4), *y = aligned_alloc(64, N * 4);
    for (int64_t i = 0; i < K; i++) x[i] = pt_round_bf16((float)((i * 37) % 101) / 50.0f - 1.0f);
    pt_pool *pool;
    pt_pool_create(&pool, nth);
    double brd[2] = {1e30, 1e30}, bmv[2] = {1e30, 1e30};
    for (int r = 0; r < reps; r++)
        for (int h = 0; h < 2; h++) {
            rd_ctx rc = {.p = buf[h], .n = mb * nmat};
            double t0 = now();
            pt_pool_run(pool, rd_run, &rc);
            double t1 = now();
            for (int m = 0; m < nmat; m++) be->ops->matmul(be, y, x, 1, &w[h][m], 0);
            double t2 = now();
            if (t1 - t0 < brd[h]) brd[h] = t1 - t0;
            if (t2 - t1 < bmv[h]) bmv[h] = t2 - t1;
        }
    for (int h = 0; h < 2; h++)
        printf("%s pages, %d threads, %.0f MiB: read %.1f GB/s, q4 matvec %.1f GB/s (%.0f%% of read)\n", h ? "2M" : "4K",
               nth, mb * nmat / 1048576.0, mb * nmat / brd[h] / 1e9, mb * nmat / bmv[h] / 1e9, 100 * brd[h] / bmv[h]);
    return 0;
}
