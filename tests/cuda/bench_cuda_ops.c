/* Benchmark of the CUDA backend's decode-critical ops on real model shapes
 * (llama-3.2-1b and llama-3.1-8b projections, MLX 4-bit g64 and 8-bit g64,
 * bf16): quantized GEMV at T = 1 and the device-to-device copy rate as the
 * roofline, plus decode attention over a bf16 cache at several depths.
 * Prints one table; timings are medians of repeated batches measured with the
 * host clock around a stream synchronization (launch overhead included, as a
 * decode step without a graph pays it). Built with CUDA=1 into the GPU
 * bundle; not a test (no pass/fail). Usage: bench_cuda_ops [reps] */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"
#include "mini_decode.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"


/* Median seconds per call of fn over `batches` batches of `inner` calls. */
typedef pt_status (*bench_fn)(void *ctx);
static double time_it(pt_backend *be, bench_fn fn, void *ctx, int inner, int batches) {
    double t[64];
    if (batches > 64) batches = 64;
    for (int i = 0; i < 3; i++)
        if (fn(ctx) != PT_OK) DIE("warm-up");
    if (be->ops->sync(be) != PT_OK) DIE("sync");
    for (int b = 0; b < batches; b++) {
        double t0 = now();
        for (int i = 0; i < inner; i++) fn(ctx);
        if (be->ops->sync(be) != PT_OK) DIE("sync");
        t[b] = (now() - t0) / inner;
    }
    qsort(t, (size_t)batches, sizeof t[0], cmpd);
    return t[batches / 2];
}

typedef struct {
    pt_backend *be;
    float *y, *x;
    pt_matrix *w;
} mm_ctx;
static pt_status mm_run(void *p) {
    mm_ctx *c = p;
    return c->be->ops->matmul(c->be, c->y, c->x, 1, c->w, 0);
}

typedef struct {
    pt_backend *be;
    float *out, *q;
    int32_t *pos;
    pt_kv_layer *kv;
    pt_attn *p;
} at_ctx;
static pt_status at_run(void *p) {
    at_ctx *c = p;
    return c->be->ops->attention(c->be, c->out, c->q, 1, c->pos, c->kv, c->p);
}

int main(int argc, char **argv) {
    int batches = argc > 1 ? atoi(argv[1]) : 15;
    pt_backend *be = bench_cuda_open();
    pt_backend_limits lim = {.max_tokens = 1, .max_ctx = 32768, .max_heads = 32, .max_head_dim = 128, .max_cols = 14336};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");

    /* Roofline: device-to-device copy of 2 GiB (bytes read + written). */
    size_t cb = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, cb) != cudaSuccess || cudaMalloc(&b, cb) != cudaSuccess) DIE("cudaMalloc");
    cudaMemset(a, 1, cb);
    cudaDeviceSynchronize();
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
        double t0 = now();
        cudaMemcpy(b, a, cb, cudaMemcpyDeviceToDevice);
        cudaDeviceSynchronize();
        double t = now() - t0;
        if (t < best) best = t;
    }
    double copy_gbs = 2.0 * cb / best / 1e9;
    printf("copy: %.0f GB/s (read + write)\n", copy_gbs);
    cudaFree(a);
    cudaFree(b);
    double read_gbs = 0;
    if (pt_cuda_read_bandwidth((size_t)4 << 30, &read_gbs) != PT_OK) DIE("read bandwidth");
    printf("read: %.0f GB/s (4 GiB, 16-byte loads)\n", read_gbs);

    static const struct { const char *name; int64_t N, K; } shapes[] = {
        {"1b q/o", 2048, 2048},   {"1b k/v", 512, 2048},     {"1b gate/up", 8192, 2048}, {"1b down", 2048, 8192},
        {"8b q/o", 4096, 4096},   {"8b k/v", 1024, 4096},    {"8b gate/up", 14336, 4096}, {"8b down", 4096, 14336},
        {"lm_head 1b", 128256, 2048}, {"lm_head 8b", 128256, 4096},
    };
    static const int kinds[][2] = {{4, 64}, {8, 64}, {0, 0}};
    printf("%-12s %7s %7s %5s %10s %9s %8s\n", "matmul T=1", "N", "K", "bits", "MB", "us", "GB/s");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 3; k++) {
            int bits = kinds[k][0], gs = kinds[k][1];
            int64_t N = shapes[s].N, K = shapes[s].K;
            pt_matrix w = {.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = gs};
            size_t db = bits ? (size_t)N * K * bits / 8 : (size_t)N * K * 2, sb = bits ? (size_t)N * (K / gs) * 2 : 0;
            uint32_t *data = malloc(db);
            uint16_t *sc = bits ? malloc(sb) : NULL, *bi = bits ? malloc(sb) : NULL;
            for (size_t i = 0; i < db / 4; i++) data[i] = ru() ^ (ru() << 16);
            if (!bits)
                for (size_t i = 0; i < db / 2; i++) ((uint16_t *)data)[i] = pt_f32_to_bf16((float)(ru() % 2001) / 1000 - 1);
            for (size_t i = 0; bits && i < sb / 2; i++) {
                sc[i] = pt_f32_to_bf16(0.01f);
                bi[i] = pt_f32_to_bf16(-0.05f);
            }
            w.data = data;
            w.scales = sc;
            w.biases = bi;
            if (be->ops->prepare_weight(be, &w, shapes[s].name) != PT_OK) DIE("prepare");
            free(data), free(sc), free(bi);
            float *x = be->ops->alloc(be, (size_t)K * 4), *y = be->ops->alloc(be, (size_t)N * 4);
            mm_ctx c = {be, y, x, &w};
            double t = time_it(be, mm_run, &c, 20, batches);
            double bytes = (double)db + 2.0 * sb + K * 4.0 + N * 4.0;
            printf("%-12s %7lld %7lld %5d %10.1f %9.2f %8.0f\n", shapes[s].name, (long long)N, (long long)K, bits,
                   bytes / 1e6, t * 1e6, bytes / t / 1e9);
            be->ops->dealloc(be, x);
            be->ops->dealloc(be, y);
            be->ops->release_weight(be, &w);
        }

    /* Decode attention, llama-3.1-8b shape: 32 heads, 8 KV heads, head_dim 128, bf16 cache. */
    printf("%-12s %7s %10s %9s %8s\n", "attention", "depth", "KV MB", "us", "GB/s");
    static const int64_t depths[] = {512, 4096, 8192, 32768};
    for (size_t d = 0; d < 4; d++) {
        int64_t cap = depths[d];
        pt_kv_layer kv = {.n_kv = 8, .head_dim = 128, .capacity = cap, .dtype = PT_FT_BF16};
        size_t kb = (size_t)8 * cap * 128 * 2;
        kv.k = be->ops->alloc(be, kb);
        kv.v = be->ops->alloc(be, kb);
        float *q = be->ops->alloc(be, 32 * 128 * 4), *o = be->ops->alloc(be, 32 * 128 * 4);
        int32_t pos = (int32_t)(cap - 1), *pd = be->ops->alloc(be, 4);
        be->ops->upload(be, pd, &pos, 4);
        pt_attn p = {.n_heads = 32, .head_dim = 128, .scale = 0.088388f};
        at_ctx c = {be, o, q, pd, &kv, &p};
        double t = time_it(be, at_run, &c, 10, batches);
        printf("%-12s %7lld %10.1f %9.2f %8.0f\n", "8b decode", (long long)cap, 2.0 * kb / 1e6, t * 1e6, 2.0 * kb / t / 1e9);
        be->ops->dealloc(be, kv.k), be->ops->dealloc(be, kv.v), be->ops->dealloc(be, q), be->ops->dealloc(be, o);
        be->ops->dealloc(be, pd);
    }
    /* Synthetic decode steps (mini_decode.h) at depth 512: eager launches vs
     * one CUDA graph replay per token. "step" = device time per token with
     * steps queued back to back; "tok/s" = the full per-token loop (upload
     * the token and position, run, download the argmax). */
    static const struct { const char *name; mini_shape s; } models[] = {
        {"llama-3.2-1b q4", {16, 2048, 32, 8, 64, 8192, 128256, 4, 64, 4096}},
        {"llama-3.1-8b q4", {32, 4096, 32, 8, 128, 14336, 128256, 4, 64, 4096}},
    };
    printf("%-16s %-6s %10s %10s %8s %9s\n", "decode", "mode", "step us", "tok/s", "GB/s", "of read");
    for (size_t mi = 0; mi < 2; mi++) {
        mini_model m;
        if (mini_init(&m, be, &models[mi].s) != PT_OK) DIE("mini model");
        int32_t id = 17, pos = 512, out;
        be->ops->upload(be, m.id, &id, 4);
        be->ops->upload(be, m.pos, &pos, 4);
        pt_cuda_graph *g = NULL;
        if (pt_cuda_graph_begin(be) != PT_OK || mini_step(&m) != PT_OK || pt_cuda_graph_end(be, &g) != PT_OK)
            DIE("capture");
        double bytes = mini_bytes(&models[mi].s, 513);
        for (int mode = 0; mode < 2; mode++) {
            for (int i = 0; i < 3; i++) mode ? pt_cuda_graph_launch(be, g) : mini_step(&m);
            be->ops->sync(be);
            double t[16];
            for (int r = 0; r < 9; r++) { /* back to back: device time per step */
                double t0 = now();
                for (int i = 0; i < 10; i++) mode ? pt_cuda_graph_launch(be, g) : mini_step(&m);
                be->ops->sync(be);
                t[r] = (now() - t0) / 10;
            }
            qsort(t, 9, sizeof t[0], cmpd);
            double step = t[4];
            double t0 = now();
            for (int i = 0; i < 20; i++) {
                be->ops->upload(be, m.id, &id, 4);
                be->ops->upload(be, m.pos, &pos, 4);
                mode ? pt_cuda_graph_launch(be, g) : mini_step(&m);
                be->ops->download(be, &out, m.out_id, 4);
                id = out;
            }
            double tok = (now() - t0) / 20;
            printf("%-16s %-6s %10.1f %10.1f %8.0f %8.0f%%\n", models[mi].name, mode ? "graph" : "eager", step * 1e6,
                   1.0 / tok, bytes / step / 1e9, 100.0 * bytes / step / 1e9 / read_gbs);
        }
        pt_cuda_graph_free(&g);
        mini_free(&m);
    }
    printf("(GB/s: weights + KV read per step / step time; 'of read': against the measured read bandwidth)\n");
    pt_backend_free(&be);
    return 0;
}
