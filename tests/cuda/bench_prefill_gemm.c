/* Benchmark of the CUDA prefill matmul (T > 64 rows, bf16 activations) on
 * the llama-3.2-1b and llama-3.1-8b projection shapes, MLX 4-bit and 8-bit
 * g64 and bf16: for each shape and T, the time of one matmul call through
 * the backend's op table with (a) dequantize (old one-thread-per-32-values
 * kernel) + cuBLAS, (b) the one-word-per-thread dequantize + cuBLAS (on the
 * weight as the engine uploads it: 4/8-bit repacked for the decode GEMV,
 * whose own dequantize kernel serves both (a) and (b) then), (c) the fused
 * tensor-core kernel (gemm_tc.cu) on an MLX-layout copy, with TFLOP/s (2·T·N·K over the
 * time), and the largest difference between (c) and (b) relative to the
 * largest output. Timings: host clock around a stream synchronization over
 * batches of calls, median of the batches. Built with CUDA=1 into the GPU
 * bundle; not a test (no pass/fail). Usage: bench_prefill_gemm [batches]
 * (BENCH_NO_Q8=1: the 4-bit and bf16 rows only).
 *
 * Two more modes for the prefill A/B runs (bench/RESULTS.md):
 *   bench_prefill_gemm flash [batches] — the prefill attention op alone on
 *     the llama-3.1-8b layer shape (32 heads over 8 KV heads of 128, bf16
 *     cache), chunks of 512 and 2048 from position 0, the old and the
 *     pipelined flash kernel: µs per call and TFLOP/s (4·128 FLOPs per head
 *     and causal key pair, the model's work);
 *   bench_prefill_gemm engine [reps] [model...] — whole prefills through
 *     the engine (synthetic q4 models, default llama-3.2-1b and
 *     llama-3.1-8b): pp512 and pp2048 under three configurations in turn
 *     (A: the old flash kernel, x converted per weight; B: the pipelined
 *     flash kernel; C: B plus x converted once per matmul_multi), one
 *     warm-up and `reps` alternating rounds; t/s per round. With
 *     BENCH_PROFILE=1 the first timed pp2048 of A and of C run between
 *     cudaProfilerStart/Stop, for `ncu --profile-from-start off`. */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"

#include <cuda_profiler_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"

void pt_cuda_prefill_select(long long tc_max_t, int dequant_old); /* matmul.cu, for benchmarks */
void pt_cuda_prefill_multi(int on);                                /* matmul.cu */
void pt_cuda_flash_select(int v);                                  /* flash_attn.cu */
void pt_cuda_tc_select(int on); /* gemv_tc_repack.cu: 0 keeps the MLX layout at upload */


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

/* The prefill attention op alone, old vs pipelined kernel, 8b layer shape. */
static int flash_mode(int batches) {
    enum { NH = 32, NKV = 8, HD = 128, CAP = 2048 };
    const int64_t cn = (int64_t)NKV * CAP * HD, qn = (int64_t)2048 * NH * HD;
    uint16_t *kh = malloc((size_t)cn * 2);
    float *qh = malloc((size_t)qn * 4);
    int32_t pos[2048];
    for (int64_t i = 0; i < cn; i++) kh[i] = pt_f32_to_bf16((float)(ru() & 0xffff) / 21845.0f - 1.5f);
    for (int64_t i = 0; i < qn; i++) qh[i] = pt_round_bf16((float)(ru() & 0xffff) / 16384.0f - 2.0f);
    for (int t = 0; t < 2048; t++) pos[t] = t;
    pt_kv_layer kv = {.n_kv = NKV, .head_dim = HD, .capacity = CAP, .dtype = PT_FT_BF16};
    kv.k = G->ops->alloc(G, (size_t)cn * 2), kv.v = G->ops->alloc(G, (size_t)cn * 2);
    float *q = G->ops->alloc(G, (size_t)qn * 4), *o = G->ops->alloc(G, (size_t)qn * 4);
    int32_t *pd = G->ops->alloc(G, sizeof pos);
    if (!kv.k || !kv.v || !q || !o || !pd || G->ops->upload(G, kv.k, kh, (size_t)cn * 2) != PT_OK ||
        G->ops->upload(G, kv.v, kh, (size_t)cn * 2) != PT_OK || G->ops->upload(G, q, qh, (size_t)qn * 4) != PT_OK ||
        G->ops->upload(G, pd, pos, sizeof pos) != PT_OK)
        DIE("flash buffers");
    pt_attn p = {.n_heads = NH, .head_dim = HD, .scale = 1.0f / sqrtf((float)HD)};
    printf("| T | kernel | µs per call | TFLOP/s |\n|---|---|---|---|\n");
    for (int T = 512; T <= 2048; T *= 4)
        for (int v = 1; v <= 2; v++) {
            pt_cuda_flash_select(v);
            double t[32];
            int nb = batches > 32 ? 32 : batches;
            for (int i = 0; i < 2; i++)
                if (G->ops->attention(G, o, q, T, pd, &kv, &p) != PT_OK) DIE("attention");
            if (G->ops->sync(G) != PT_OK) DIE("sync");
            for (int b = 0; b < nb; b++) {
                double t0 = now();
                for (int i = 0; i < 5; i++) G->ops->attention(G, o, q, T, pd, &kv, &p);
                if (G->ops->sync(G) != PT_OK) DIE("sync");
                t[b] = (now() - t0) / 5;
            }
            qsort(t, (size_t)nb, sizeof t[0], cmpd);
            const double fl = 4.0 * HD * NH * ((double)T * (T + 1) / 2); /* causal: key pairs */
            printf("| %d | %s | %.1f | %.1f |\n", T, v == 1 ? "old" : "pipelined", t[nb / 2] * 1e6,
                   fl / t[nb / 2] * 1e-12);
            fflush(stdout);
        }
    pt_cuda_flash_select(-1);
    G->ops->dealloc(G, kv.k), G->ops->dealloc(G, kv.v), G->ops->dealloc(G, q), G->ops->dealloc(G, o);
    G->ops->dealloc(G, pd);
    free(kh), free(qh);
    return 0;
}

/* Whole prefills through the engine, configurations alternating. */
static int engine_mode(int reps, int nm, char **models) {
    static const char *defm[] = {"llama-3.2-1b", "llama-3.1-8b"};
    static const char *cfg_name[] = {"A old", "B flash2", "C flash2+x-once"};
    if (nm == 0) nm = 2, models = (char **)defm;
    const int profile = getenv("BENCH_PROFILE") && !strcmp(getenv("BENCH_PROFILE"), "1");
    printf("| model | test | config | t/s per round |\n|---|---|---|---|\n");
    for (int mi = 0; mi < nm; mi++) {
        pt_model_params mp = pt_model_default_params();
        mp.device = PT_DEVICE_CUDA;
        pt_model *m = NULL;
        if (pt_model_synthetic(models[mi], "q4", &mp, &m) != PT_OK) DIE("synthetic %s", models[mi]);
        pt_session_params sp = pt_session_default_params();
        sp.n_ctx = 2049;
        pt_session *s = NULL;
        if (pt_session_create(m, &sp, &s) != PT_OK) DIE("session");
        const int V = pt_model_vocab_size(m);
        static int32_t ids[2048];
        static const int Ps[] = {512, 2048};
        for (int pi = 0; pi < 2; pi++) {
            double ts[3][16];
            for (int r = -1; r < reps && r < 16; r++)
                for (int c = 0; c < 3; c++) {
                    pt_cuda_flash_select(c == 0 ? 1 : 2);
                    pt_cuda_prefill_multi(c == 2);
                    for (int i = 0; i < Ps[pi]; i++) ids[i] = (int32_t)(ru() % (uint32_t)V);
                    /* BENCH_PROFILE=1: the first timed pp2048 of A and of C between
                     * cudaProfilerStart/Stop (ncu --profile-from-start off) */
                    const int prof = profile && r == 0 && Ps[pi] == 2048 && c != 1;
                    if (prof) cudaProfilerStart();
                    double t0 = now();
                    if (pt_session_prompt(s, ids, (size_t)Ps[pi]) != PT_OK) DIE("prompt");
                    const double dt = now() - t0;
                    if (prof) cudaProfilerStop();
                    if (pt_session_truncate(s, 0) != PT_OK) DIE("truncate");
                    if (r >= 0) ts[c][r] = Ps[pi] / dt;
                }
            for (int c = 0; c < 3; c++) {
                printf("| %s | pp%d | %s |", models[mi], Ps[pi], cfg_name[c]);
                for (int r = 0; r < reps && r < 16; r++) printf(" %.0f", ts[c][r]);
                printf(" |\n");
            }
            fflush(stdout);
        }
        pt_cuda_flash_select(-1);
        pt_cuda_prefill_multi(-1);
        pt_session_free(&s);
        pt_model_free(&m);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "engine")) {
        char why[256];
        if (pt_cuda_device_count(why, sizeof why) == 0) {
            printf("no CUDA device: %s\n", why);
            return 0;
        }
        return engine_mode(argc > 2 ? atoi(argv[2]) : 3, argc > 3 ? argc - 3 : 0, argv + 3);
    }
    const int flash = argc > 1 && !strcmp(argv[1], "flash");
    if (flash) argc--, argv++;
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
    if (flash) {
        flash_mode(batches);
        pt_backend_free(&G);
        return 0;
    }
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
            if (bits == 8 && getenv("BENCH_NO_Q8")) continue; /* BENCH_NO_Q8: 4-bit and bf16 rows only */
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
            /* w: the layout the engine uploads (4/8-bit: repacked for the
             * decode GEMV, dequantized by its own kernel); wm: the MLX layout,
             * which the fused kernel reads */
            pt_matrix wm = w;
            if (G->ops->prepare_weight(G, &w, shapes[si].name) != PT_OK) DIE("prepare");
            if (bits) {
                pt_cuda_tc_select(0);
                if (G->ops->prepare_weight(G, &wm, shapes[si].name) != PT_OK) DIE("prepare (MLX layout)");
                pt_cuda_tc_select(1);
            }
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
                    t_tc = time_mm(y2, x, T, &wm, batches);
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
            if (bits) G->ops->release_weight(G, &wm);
            free(d), free(sc), free(bb);
        }
    G->ops->dealloc(G, x);
    free(xh);
    pt_backend_free(&G);
    return 0;
}
