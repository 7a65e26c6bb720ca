/* Prefill benchmark for the CPU backend (not part of the build or the
 * tests): one T-token chunk through the matmul (q4 g64 weights of the
 * llama-3.2-1b shape: 2048 -> 8192) and through attention (32 query heads,
 * 8 KV heads, head_dim 64, bf16 cache, T keys). Reports GFLOP/s and ms.
 * The matmul also runs, interleaved, on a backend with the int8-activation
 * lever (the VNNI prefill GEMM for 4/8-bit weights). One thread: CPU time
 * (robust to the other processes of a shared machine); more: wall time.
 *
 * N and K (default 8192 and 2048) can be given, e.g. 4096 14336 for
 * llama-3.1-8b's down projection.
 *   dev/build.sh && dev/bench_prefill [T] [threads] [reps] [bits] [N] [K] */
#include "backend/backend.h"
#include "base/error.h"
#include "base/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* with one thread, the process's CPU time: robust to the other processes of a
 * shared machine; with more, wall time */
static clockid_t PT_BENCH_CLOCK = CLOCK_MONOTONIC;
static double now(void) {
    struct timespec ts;
    clock_gettime(PT_BENCH_CLOCK, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 512;
    int nth = argc > 2 ? atoi(argv[2]) : 2;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    int bits = argc > 4 ? atoi(argv[4]) : 4;
    int64_t N = argc > 5 ? atoll(argv[5]) : 8192, K = argc > 6 ? atoll(argv[6]) : 2048, gs = 64;
    if (nth == 1) PT_BENCH_CLOCK = CLOCK_PROCESS_CPUTIME_ID;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    pt_backend *be8;
    cp.int8_act = 1;
    if (pt_backend_cpu_create(&be8, &cp) != PT_OK) return 1;
    size_t cb = bits ? (size_t)N * K * bits / 8 : (size_t)N * K * 2;
    uint8_t *codes = aligned_alloc(64, cb);
    uint16_t *par = aligned_alloc(64, (size_t)N * (K / gs) * 4);
    for (size_t i = 0; i < cb; i++) codes[i] = (uint8_t)(i * 2654435761u >> 13);
    if (!bits)
        for (size_t i = 0; i < cb / 2; i++) ((uint16_t *)codes)[i] = pt_f32_to_bf16(0.01f * (float)(i % 13) - 0.06f);
    for (size_t i = 0; i < (size_t)N * (K / gs) * 2; i++) par[i] = pt_f32_to_bf16(0.01f * (float)(i % 7) - 0.03f);
    pt_matrix w = {.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = bits ? gs : 0, .data = codes};
    if (bits) {
        w.scales = par;
        w.biases = par + N * (K / gs);
    }
    if (be->ops->prepare_weight(be, &w, "w") != PT_OK) return 1;
    pt_matrix w8 = w;
    if (be8->ops->prepare_weight(be8, &w8, "w") != PT_OK) return 1;
    float *x = aligned_alloc(64, (size_t)T * K * 4), *y = aligned_alloc(64, (size_t)T * N * 4);
    for (int64_t i = 0; i < T * K; i++) x[i] = pt_round_bf16((float)((i * 37) % 101) / 50.0f - 1.0f);
    int nh = 32, nkv = 8, hd = 64;
    pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = T, .dtype = PT_FT_BF16};
    kv.k = be->ops->alloc(be, (size_t)T * nkv * hd * 2);
    kv.v = be->ops->alloc(be, (size_t)T * nkv * hd * 2);
    float *q = aligned_alloc(64, (size_t)T * nh * hd * 4), *o = aligned_alloc(64, (size_t)T * nh * hd * 4);
    float *kk = aligned_alloc(64, (size_t)T * nkv * hd * 4);
    for (int64_t i = 0; i < (int64_t)T * nh * hd; i++) q[i] = pt_round_bf16((float)((i * 13) % 17) / 17.0f - 0.5f);
    for (int64_t i = 0; i < (int64_t)T * nkv * hd; i++) kk[i] = pt_round_bf16((float)((i * 7) % 19) / 19.0f - 0.5f);
    int32_t *pos = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < T; i++) pos[i] = i;
    be->ops->kv_append(be, &kv, kk, kk, T, pos);
    pt_attn ap = {.n_heads = nh, .head_dim = hd, .scale = 0.125f};
    double bm = 1e30, ba = 1e30, b8 = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        be->ops->matmul(be, y, x, T, &w, 0);
        double t1 = now();
        be->ops->attention(be, o, q, T, pos, &kv, &ap);
        double t2 = now();
        if (t1 - t0 < bm) bm = t1 - t0;
        double t3 = now();
        be8->ops->matmul(be8, y, x, T, &w8, 0);
        if (now() - t3 < b8) b8 = now() - t3;
        if (t2 - t1 < ba) ba = t2 - t1;
    }
    double fm = 2.0 * N * K * T, fa = 2.0 * 2 * nh * hd * (double)T * (T + 1) / 2;
    printf("isa=%s threads=%d T=%d bits=%d: matmul %dx%lld->%lld %.1f ms (%.1f GFLOP/s); attention %.1f ms (%.1f GFLOP/s)\n",
           pt_backend_cpu_isa_name(be), nth, T, bits, T, (long long)K, (long long)N, bm * 1e3, fm / bm / 1e9, ba * 1e3,
           fa / ba / 1e9);
    printf("  int8-act lever: matmul %.1f ms (%.1f GOP/s)\n", b8 * 1e3, fm / b8 / 1e9);
    pt_backend_free(&be);
    pt_backend_free(&be8);
    return 0;
}
