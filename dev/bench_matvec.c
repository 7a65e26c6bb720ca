/* Decode matvec benchmark for the CPU backend (not part of the build or the
 * tests): y = x·Wᵀ at T = 1 over a working set larger than the L3, so the
 * weights stream from memory, compared with a plain streaming read of the
 * same bytes with the same threads (the roofline). Prints GB/s and the
 * fraction of the read bandwidth.
 *
 *   dev/build.sh && dev/bench_matvec [bits 0|4|8] [group] [rows] [cols] [threads] [MiB] [reps]
 * bits 0 = bf16 weights. One thread: CPU time. */
#include "backend/backend.h"
#include "base/error.h"
#include "base/half.h"
#include "base/threadpool.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* one thread: the thread's CPU time (set in main), which other processes on
 * the shared machine disturb far less than wall time */
static clockid_t clk = CLOCK_MONOTONIC;
static double now(void) {
    struct timespec ts;
    clock_gettime(clk, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const uint8_t *p;
    size_t n;
    float out[64];
} rd_ctx;

/* streaming read: sum of 64-byte lines, split across threads */
static void rd_run(void *arg, int ith, int nth) {
    rd_ctx *r = arg;
    long b, e;
    pt_split_range((long)(r->n / 256), ith, nth, &b, &e);
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = b; i < e; i++) {
        const __m512i *q = (const __m512i *)(r->p + (size_t)i * 256);
        a0 = _mm512_add_epi32(a0, _mm512_load_si512(q));
        a1 = _mm512_add_epi32(a1, _mm512_load_si512(q + 1));
        a2 = _mm512_add_epi32(a2, _mm512_load_si512(q + 2));
        a3 = _mm512_add_epi32(a3, _mm512_load_si512(q + 3));
    }
    r->out[ith] = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}

int main(int argc, char **argv) {
    int bits = argc > 1 ? atoi(argv[1]) : 4;
    int gs = argc > 2 ? atoi(argv[2]) : 64;
    int64_t N = argc > 3 ? atoll(argv[3]) : 8192, K = argc > 4 ? atoll(argv[4]) : 2048;
    int nth = argc > 5 ? atoi(argv[5]) : 2;
    size_t mib = argc > 6 ? (size_t)atoll(argv[6]) : 1024;
    int reps = argc > 7 ? atoi(argv[7]) : 5;
    if (nth == 1) clk = CLOCK_THREAD_CPUTIME_ID;
    size_t code_bytes = bits ? (size_t)N * K * bits / 8 : (size_t)N * K * 2;
    size_t param_bytes = bits ? 2 * (size_t)N * (K / gs) * 2 : 0;
    size_t mat_bytes = code_bytes + param_bytes;
    int nmat = (int)((mib << 20) / mat_bytes);
    if (nmat < 1) nmat = 1;
    uint8_t *codes = aligned_alloc(64, code_bytes * nmat);
    uint16_t *params = bits ? aligned_alloc(64, param_bytes * nmat) : NULL;
    /* huge pages for the streaming read too (prepare_weight advises the weights) */
    madvise((void *)((uintptr_t)codes & ~(uintptr_t)4095), code_bytes * nmat, MADV_HUGEPAGE);
    for (size_t i = 0; i < code_bytes * nmat; i++) codes[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t i = 0; bits && i < param_bytes * nmat / 2; i++) params[i] = pt_f32_to_bf16(0.01f * (float)(i % 7) - 0.03f);
    pt_backend *be, *be32;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) {
        fprintf(stderr, "%s\n", pt_last_error());
        return 1;
    }
    cp.act = PT_ACT_F32;
    if (pt_backend_cpu_create(&be32, &cp) != PT_OK) return 1;
    pt_backend *be8;
    cp.act = PT_ACT_BF16;
    cp.int8_act = 1;
    if (pt_backend_cpu_create(&be8, &cp) != PT_OK) return 1;
    pt_matrix *w = calloc(nmat, sizeof *w);
    for (int m = 0; m < nmat; m++) {
        w[m] = (pt_matrix){.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = gs,
                           .data = codes + code_bytes * m};
        if (bits) {
            w[m].scales = (const uint8_t *)params + param_bytes * m;
            w[m].biases = (const uint8_t *)params + param_bytes * m + param_bytes / 2;
        }
        if (be->ops->prepare_weight(be, &w[m], "w") != PT_OK) {
            fprintf(stderr, "%s\n", pt_last_error());
            return 1;
        }
    }
    float *x = aligned_alloc(64, K * 4), *y = aligned_alloc(64, N * 4);
    for (int64_t i = 0; i < K; i++) x[i] = pt_round_bf16((float)((i * 37) % 101) / 50.0f - 1.0f);
    pt_pool *pool;
    pt_pool_create(&pool, nth);
    rd_ctx rc = {.p = codes, .n = code_bytes * nmat};
    double best_mv = 1e30, best_rd = 1e30, best_32 = 1e30, best_8 = 1e30;
    for (int r = 0; r < reps; r++) { /* interleaved: read, bf16-act matvec, f32-act matvec, ... */
        double t0 = now();
        pt_pool_run(pool, rd_run, &rc);
        double t1 = now();
        for (int m = 0; m < nmat; m++) be->ops->matmul(be, y, x, 1, &w[m], 0);
        double t2 = now();
        for (int m = 0; m < nmat; m++) be32->ops->matmul(be32, y, x, 1, &w[m], 0);
        double t3 = now();
        for (int m = 0; m < nmat; m++) be8->ops->matmul(be8, y, x, 1, &w[m], 0);
        double t4 = now();
        if (t4 - t3 < best_8) best_8 = t4 - t3;
        if (t1 - t0 < best_rd) best_rd = t1 - t0;
        if (t2 - t1 < best_mv) best_mv = t2 - t1;
        if (t3 - t2 < best_32) best_32 = t3 - t2;
    }
    printf("int8-act lever: %.1f GB/s (%.0f%% of read) | ", (double)mat_bytes * nmat / best_8 / 1e9,
           100 * ((double)mat_bytes * nmat / best_8) / ((double)code_bytes * nmat / best_rd));
    printf("f32-act path: %.1f GB/s (%.0f%% of read) | ", (double)mat_bytes * nmat / best_32 / 1e9,
           100 * ((double)mat_bytes * nmat / best_32) / ((double)code_bytes * nmat / best_rd));
    double gb_rd = (double)code_bytes * nmat / best_rd / 1e9, gb_mv = (double)mat_bytes * nmat / best_mv / 1e9;
    printf("isa=%s bits=%d gs=%d N=%lld K=%lld threads=%d mats=%d (%.0f MiB): read %.1f GB/s, bf16-act matvec %.1f GB/s "
           "(%.0f%% of read), %.2f Gweights/s\n",
           pt_backend_cpu_isa_name(be), bits, gs, (long long)N, (long long)K, nth, nmat,
           (double)mat_bytes * nmat / 1048576.0, gb_rd, gb_mv, 100 * gb_mv / gb_rd,
           (double)N * K * nmat / best_mv / 1e9);
    pt_pool_free(&pool);
    pt_backend_free(&be);
    pt_backend_free(&be32);
    pt_backend_free(&be8);
    return 0;
}
