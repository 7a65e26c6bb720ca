/* Benchmark of the CUDA prefill matmul (T > 64 rows, bf16 activations) on
 * the llama-3.2-1b and llama-3.1-8b projection shapes, MLX 4-bit and 8-bit
 * g64 and bf16: for each shape and T, the time of one matmul call through
 * the backend's op table with (a) dequantize (old one-thread-per-32-values
 * kernel) + cuBLAS, (b) the one-word-per-thread dequantize + cuBLAS, (c) the
 * fused tensor-core kernel (gemm_tc.cu), with TFLOP/s (2·T·N·K over the
 * time), and the largest difference between (c) and (b) relative to the
 * largest output. Timings: host clock around a stream synchronization over
 * batches of calls, median of the batches. Built with CUDA=1 into the GPU
 * bundle; not a test (no pass/fail). Usage: bench_prefill_gemm [batches] */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"

void pt_cuda_prefill_select(long long tc_max_t, int dequant_old); /* matmul.cu, for benchmarks */


static pt_backend *G;

static double time_mm(float *y, const float *x, int64_t T, const pt_matrix *w, int batches) {
    double t[32];
    if (batches > 32) batches = 32;
    for (int i = 0; i < 2; i++)
        if (G->ops->matmul(G, y, x, T, w, 0) != PT_OK) DIE("matmul");
    if (G->ops->sync(G) != PT_OK) DIE("sync");
    const int inner = T >= 1024 ? 4 : 10;
    for (int b = 0; b < batches; b++) {
        double t0 = now();
        for (int i = 0; i < inner; i++) G->ops->matmul(G, y, x, T, w, 0);
        if (G->ops->sync(G) != PT_OK) DIE("sync");
        t[b] = (now() - t0) / inner;
    }
    qsort(t, (size_t)batches, sizeof t[0], cmpd);
    return t[batches / 2];
}

int main(int argc, char **argv) {
    int batches = argc > 1 ? atoi(argv[1]) : 5;
    if (batches < 1) batches = 1;
    char why[256];
    if (pt_cuda_device_count(why, sizeof why) == 0) {
        printf("no CUDA device: %s\n", why);
        return 0;
    }
    pt_cuda_params gp = {0, PT_ACT_BF16};
    if (pt_backend_cuda_create(&G, &gp) != PT_OK) DIE("cuda backend");
    const int64_t maxT = 2048, maxK = 14336;
    pt_backend_limits lim = {.max_tokens = maxT, .max_ctx = 4096, .max_heads = 32, .max_head_dim = 128,
                             .max_cols = maxK};
    if (G->ops->reserve(G, &lim) != PT_OK) DIE("reserve");
    float *xh = malloc((size_t)(maxT * maxK) * 4);
    for (int64_t i = 0; i < maxT * maxK; i++) xh[i] = pt_round_bf16(((float)(ru() & 0xffff) / 32768.0f) - 1.0f);
    float *x = G->ops->alloc(G, (size_t)(maxT * maxK) * 4);
    if (!x || G->ops->upload(G, x, xh, (size_t)(maxT * maxK) * 4) != PT_OK) DIE("x");
    static const struct {
        const char *name;
        int64_t N, K;
    } shapes[] = {{"1b q/o", 2048, 2048},     {"1b gate", 8192, 2048},   {"1b down", 2048, 8192},
                  {"8b q/o", 4096, 4096},     {"8b k/v", 1024, 4096},    {"8b gate", 14336, 4096},
                  {"8b down", 4096, 14336}};
    static const int64_t Ts[] = {512, 2048};
    static const int bitss[] = {4, 8, 0};
    printf("| shape | N × K | bits | T | dq old + cuBLAS µs (TF/s) | dq new + cuBLAS µs (TF/s) | fused TC µs (TF/s) | "
           "max|tc − cublas| / max|y| |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int bi = 0; bi < 3; bi++) {
            const int bits = bitss[bi];
            const int64_t N = shapes[si].N, K = shapes[si].K;
            pt_matrix w = {.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = bits ? 64 : 0};
            void *d = NULL, *sc = NULL, *bb = NULL;
            if (bits) {
                const int64_t words = N * K * bits / 32, ng = N * (K / 64);
                d = malloc((size_t)words * 4);
                for (int64_t i = 0; i < words; i++) ((uint32_t *)d)[i] = ru() ^ (ru() << 21);
                sc = malloc((size_t)ng * 2);
                bb = malloc((size_t)ng * 2);
                const float amp = 0.1f / (float)((1 << bits) - 1);
                for (int64_t i = 0; i < ng; i++) {
                    ((uint16_t *)sc)[i] = pt_f32_to_bf16(amp * (0.9f + 0.2f * (float)(ru() & 0xff) / 256.0f));
                    ((uint16_t *)bb)[i] = pt_f32_to_bf16(-0.05f + 0.005f * (float)(ru() & 0xff) / 256.0f);
                }
                w.scales = sc;
                w.biases = bb;
            } else {
                d = malloc((size_t)(N * K) * 2);
                for (int64_t i = 0; i < N * K; i++)
                    ((uint16_t *)d)[i] = pt_f32_to_bf16(0.05f * ((float)(ru() & 0xffff) / 32768.0f - 1.0f));
            }
            w.data = d;
            if (G->ops->prepare_weight(G, &w, shapes[si].name) != PT_OK) DIE("prepare");
            for (int ti = 0; ti < 2; ti++) {
                const int64_t T = Ts[ti];
                float *y = G->ops->alloc(G, (size_t)(T * N) * 4), *y2 = G->ops->alloc(G, (size_t)(T * N) * 4);
                if (!y || !y2) DIE("y");
                const double fl = 2.0 * (double)T * (double)N * (double)K;
                double t_old = 0, t_new, t_tc = 0, rel = -1;
                if (bits) {
                    pt_cuda_prefill_select(0, 1);
                    t_old = time_mm(y, x, T, &w, batches);
                }
                pt_cuda_prefill_select(0, 0);
                t_new = time_mm(y, x, T, &w, batches);
                if (bits) {
                    pt_cuda_prefill_select(1LL << 40, 0);
                    t_tc = time_mm(y2, x, T, &w, batches);
                    float *h1 = malloc((size_t)(T * N) * 4), *h2 = malloc((size_t)(T * N) * 4);
                    if (G->ops->download(G, h1, y, (size_t)(T * N) * 4) != PT_OK ||
                        G->ops->download(G, h2, y2, (size_t)(T * N) * 4) != PT_OK)
                        DIE("download");
                    double mx = 0, md = 0;
                    int nan = 0;
                    for (int64_t i = 0; i < T * N; i++) {
                        if (isnan(h1[i]) || isnan(h2[i])) nan = 1;
                        if (fabs(h1[i]) > mx) mx = fabs(h1[i]);
                        if (fabs(h1[i] - h2[i]) > md) md = fabs(h1[i] - h2[i]);
                    }
                    rel = nan ? INFINITY : md / (mx > 0 ? mx : 1);
                    free(h1), free(h2);
                }
                char a[48] = "—", c[48] = "—", r[32] = "—";
                if (bits) {
                    snprintf(a, sizeof a, "%.1f (%.0f)", t_old * 1e6, fl / t_old * 1e-12);
                    snprintf(c, sizeof c, "%.1f (%.0f)", t_tc * 1e6, fl / t_tc * 1e-12);
                    snprintf(r, sizeof r, "%.2e", rel);
                }
                printf("| %s | %lld × %lld | %s | %lld | %s | %.1f (%.0f) | %s | %s |\n", shapes[si].name, (long long)N,
                       (long long)K, bits == 4 ? "4/g64" : bits == 8 ? "8/g64" : "bf16", (long long)T, a,
                       t_new * 1e6, fl / t_new * 1e-12, c, r);
                fflush(stdout);
                G->ops->dealloc(G, y);
                G->ops->dealloc(G, y2);
            }
            pt_cuda_prefill_select(-1, -1);
            G->ops->release_weight(G, &w);
            free(d), free(sc), free(bb);
        }
    G->ops->dealloc(G, x);
    free(xh);
    pt_backend_free(&G);
    return 0;
}
