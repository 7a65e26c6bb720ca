/* Benchmark of CUDA decode attention at depth (issue: decode at the
 * bandwidth limit): one decode step's attention over every layer of the
 * llama-3.1-8b shape (32 layers, 32 query heads, 8 KV heads, head_dim 128,
 * bf16 activations) at 8k and 32k tokens of KV, for
 *   bf16        full-precision bf16 cache (attention.cu split kernels)
 *   q8 exact    8-bit g64 cache, exact L2 path (kv_quant.cu split kernels)
 *   q4 exact    4-bit g64 cache, exact L2 path
 *   q8 fused    8-bit, --fused-decode-attn (kv_fused.cu)
 *   q4 fused    4-bit, --fused-decode-attn
 * Each layer has its own cache (32 distinct caches, so the step reads far
 * more than the L2 cache holds); the 32 attention calls of a step are
 * captured once into a CUDA graph and replayed back to back, so the time is
 * device time without launch gaps. GB/s counts the KV bytes a step must read
 * (codes + scales + biases, or bf16 rows, for the positions attended), and
 * "of read" is that against the device read bandwidth measured in the same
 * run (pt_cuda_read_bandwidth). The configurations alternate within each
 * repetition (paired A/B), medians reported. Also prints the time of a
 * 2048-token prefill chunk over each quantized cache at the depth (the path
 * a long prompt's fill runs).
 * Each row ends with a hash of the last layer's output (equal hashes: the
 * same bits, e.g. across ring depths, which keep the split count).
 * Built with CUDA=1 into the GPU bundle; not a test (no pass/fail).
 * BENCH_BF16_ONLY=1 times the bf16 cache's decode alone (no quantized
 * cache, no prefill chunk): a few seconds per process, for A/B runs of the
 * full-precision decode attention's switches (PETREL_CUDA_ATTN_V2) or of
 * two builds, run alternately.
 * BENCH_NKV=N takes N KV heads instead of 8 (N dividing 32: BENCH_NKV=4 is GQA 8, the
 * qwen3-30b-a3b group, which runs the fused first block kernel rather than the transposed one).
 * Usage: [BENCH_FUSED_ONLY=1 | BENCH_BF16_ONLY=1] [BENCH_NKV=N] bench_decode_attn [reps] [depth ...] */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"

#define LAYERS 32
#define NH 32
static int NKV = 8; /* BENCH_NKV: 1, 2, 4, 8, 16 or 32 KV heads (GQA 32 .. 1) */
#define HD 128
#define GS 64
#define CHUNK 2048

static float rnd(void) { return (float)(ru() % 20001) / 10000.0f - 1.0f; }

typedef struct {
    const char *name;
    int bits, fused;
    pt_kv_layer kv[LAYERS];
    pt_cuda_graph *g;
    double t[64];
} cfg;

int main(int argc, char **argv) {
    /* BENCH_FUSED_ONLY=1: time the fused configurations alone (no bf16 cache, no prefill chunk) */
    const int fonly = getenv("BENCH_FUSED_ONLY") != NULL, bonly = !fonly && getenv("BENCH_BF16_ONLY") != NULL;
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1 || reps > 64) reps = 9;
    int64_t depths[8] = {8192, 32768};
    int nd = 2;
    if (argc > 2) {
        nd = 0;
        for (int i = 2; i < argc && nd < 8; i++) depths[nd++] = atoll(argv[i]);
    }
    if (getenv("BENCH_NKV")) {
        NKV = atoi(getenv("BENCH_NKV"));
        if (NKV < 1 || NKV > NH || NH % NKV) DIE("BENCH_NKV=%s: a divisor of %d", getenv("BENCH_NKV"), NH);
    }
    pt_backend *be = bench_cuda_open();
    int64_t maxd = 0;
    for (int i = 0; i < nd; i++) maxd = depths[i] > maxd ? depths[i] : maxd;
    pt_backend_limits lim = {.max_tokens = CHUNK, .max_ctx = maxd + 1, .max_heads = NH, .max_head_dim = HD,
                             .max_cols = 4096};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");

    /* fill data: one chunk of random K/V rows, appended repeatedly */
    const size_t ce = (size_t)CHUNK * NKV * HD;
    float *h = malloc(ce * 4);
    for (size_t i = 0; i < ce; i++) h[i] = rnd() * 2.0f;
    float *dk = bench_alloc(be, ce * 4), *dv = bench_alloc(be, ce * 4);
    be->ops->upload(be, dk, h, ce * 4);
    for (size_t i = 0; i < ce; i++) h[i] = rnd() * 2.0f;
    be->ops->upload(be, dv, h, ce * 4);
    float *q = bench_alloc(be, (size_t)CHUNK * NH * HD * 4), *o = bench_alloc(be, (size_t)CHUNK * NH * HD * 4);
    for (size_t i = 0; i < ce; i++) h[i] = rnd();
    for (int i = 0; i < NH / NKV; i++) be->ops->upload(be, q + i * ce, h, ce * 4); /* [CHUNK, NH, HD] */
    int32_t *pos = bench_alloc(be, CHUNK * 4), *hp = malloc(CHUNK * 4);

    double read_gbs = 0;
    if (pt_cuda_read_bandwidth((size_t)2 << 30, &read_gbs) != PT_OK) DIE("read bandwidth");
    printf("read bandwidth: %.0f GB/s (2 GiB, 16-byte loads)\n", read_gbs);
    printf("decode attention, llama-3.1-8b shape%s: %d layers x (%d heads, %d KV heads, head_dim %d), group %d; "
           "median of %d paired repetitions\n",
           NKV == 8 ? "" : " (KV heads changed)", LAYERS, NH, NKV, HD, GS, reps);
    const char *v2 = getenv("PETREL_CUDA_ATTN_V2");
    if (bonly) printf("bf16 cache only; PETREL_CUDA_ATTN_V2=%s\n", v2 ? v2 : "(unset)");
    printf("%-10s %6s %10s %10s %9s %8s %9s\n", "kv", "depth", "KV MB/step", "us/step", "us/layer", "GB/s", "of read");

    for (int di = 0; di < nd; di++) {
        const int64_t depth = depths[di], cap = depth + 1;
        static cfg cs[5];
        static const char *names[5] = {"bf16", "q8 exact", "q4 exact", "q8 fused", "q4 fused"};
        static const int cbits[5] = {0, 8, 4, 8, 4};
        for (int c = 0; c < 5; c++) cs[c].name = names[c], cs[c].bits = cbits[c], cs[c].fused = c >= 3;
        double kvbytes[5];
        double fill_s[5] = {0};
        for (int c = 0; c < 5; c++) {
            if ((fonly && c == 0) || (bonly && c > 0)) continue;
            const int bits = cs[c].bits;
            const size_t rows = (size_t)NKV * cap;
            const size_t cb = bits ? rows * HD * bits / 8 : rows * HD * 2, pb = bits ? rows * (HD / GS) * 2 : 0;
            kvbytes[c] = bits ? 2.0 * NKV * (depth + 1) * (HD * bits / 8.0 + 2.0 * (HD / GS) * 2.0)
                              : 2.0 * NKV * (depth + 1) * HD * 2.0;
            kvbytes[c] *= LAYERS;
            const int share = cs[c].fused; /* the fused configurations read the exact ones' caches */
            for (int l = 0; l < LAYERS; l++) {
                pt_kv_layer *kv = &cs[c].kv[l];
                if (share) {
                    *kv = cs[c - 2].kv[l];
                    continue;
                }
                pt_kv_layer z = {.n_kv = NKV, .head_dim = HD, .capacity = cap, .dtype = PT_FT_BF16, .bits = bits,
                                 .group_size = bits ? GS : 0};
                *kv = z;
                kv->k = bench_alloc(be, cb);
                kv->v = bench_alloc(be, cb);
                if (bits) {
                    kv->k_scales = bench_alloc(be, pb), kv->k_biases = bench_alloc(be, pb);
                    kv->v_scales = bench_alloc(be, pb), kv->v_biases = bench_alloc(be, pb);
                }
                for (int64_t p0 = 0; p0 <= depth; p0 += CHUNK) {
                    const int64_t T = depth + 1 - p0 < CHUNK ? depth + 1 - p0 : CHUNK;
                    for (int64_t t = 0; t < T; t++) hp[t] = (int32_t)(p0 + t);
                    be->ops->upload(be, pos, hp, (size_t)T * 4);
                    if (be->ops->kv_append(be, kv, dk, dv, T, pos) != PT_OK) DIE("kv_append");
                }
            }
            if (be->ops->sync(be) != PT_OK) DIE("fill");
            /* a prefill chunk of CHUNK tokens attending to the whole cache (layer 0) */
            if (!share && !fonly && !bonly) {
                for (int64_t t = 0; t < CHUNK; t++) hp[t] = (int32_t)(depth + 1 - CHUNK + t);
                be->ops->upload(be, pos, hp, CHUNK * 4);
                pt_attn p = {.n_heads = NH, .head_dim = HD, .scale = 1.0f / sqrtf((float)HD)};
                double best = 1e9;
                for (int r = 0; r < 3; r++) {
                    double t0 = now();
                    if (be->ops->attention(be, o, q, CHUNK, pos, &cs[c].kv[0], &p) != PT_OK) DIE("prefill chunk");
                    if (be->ops->sync(be) != PT_OK) DIE("prefill sync");
                    if (now() - t0 < best) best = now() - t0;
                }
                fill_s[c] = best;
            }
            /* the decode step: one query at position `depth`, captured */
            if (fonly && !cs[c].fused) continue;
            hp[0] = (int32_t)depth;
            be->ops->upload(be, pos, hp, 4);
            pt_attn p = {.n_heads = NH, .head_dim = HD, .scale = 1.0f / sqrtf((float)HD), .fused_decode = cs[c].fused};
            if (pt_cuda_graph_begin(be) != PT_OK) DIE("graph begin");
            for (int l = 0; l < LAYERS; l++)
                if (be->ops->attention(be, o, q, 1, pos, &cs[c].kv[l], &p) != PT_OK) DIE("capture %s", cs[c].name);
            if (pt_cuda_graph_end(be, &cs[c].g) != PT_OK) DIE("graph end");
        }
        for (int r = -1; r < reps; r++)
            for (int c = 0; c < 5; c++) {
                if ((fonly && !cs[c].fused) || (bonly && c > 0)) continue;
                double t0 = now();
                for (int i = 0; i < 5; i++) pt_cuda_graph_launch(be, cs[c].g);
                if (be->ops->sync(be) != PT_OK) DIE("replay %s", cs[c].name);
                if (r >= 0) cs[c].t[r] = (now() - t0) / 5;
            }
        for (int c = 0; c < 5; c++) {
            if ((fonly && !cs[c].fused) || (bonly && c > 0)) continue;
            qsort(cs[c].t, (size_t)reps, sizeof(double), cmpd);
            const double t = cs[c].t[reps / 2], gbs = kvbytes[c] / t / 1e9;
            /* the last layer's output after one more replay, hashed: equal hashes across builds or
             * settings (ring depth) that keep the split count mean bit-identical results */
            pt_cuda_graph_launch(be, cs[c].g);
            if (be->ops->download(be, h, o, (size_t)NH * HD * 4) != PT_OK) DIE("download %s", cs[c].name);
            uint32_t hash = 2166136261u;
            const unsigned char *hb = (const unsigned char *)h;
            for (size_t i = 0; i < (size_t)NH * HD * 4; i++) hash = (hash ^ hb[i]) * 16777619u;
            printf("%-10s %6lld %10.1f %10.1f %9.2f %8.0f %8.0f%%  out %08x\n", cs[c].name, (long long)depth,
                   kvbytes[c] / 1e6, t * 1e6, t * 1e6 / LAYERS, gbs, 100.0 * gbs / read_gbs, hash);
        }
        for (int c = 0; c < 3 && !fonly && !bonly; c++)
            printf("prefill chunk of %d tokens at depth %lld over %s: %.2f ms per layer\n", CHUNK, (long long)depth,
                   cs[c].name, fill_s[c] * 1e3);
        for (int c = 0; c < 5; c++) {
            pt_cuda_graph_free(&cs[c].g);
            if (cs[c].fused) continue;
            for (int l = 0; l < LAYERS; l++) {
                pt_kv_layer *kv = &cs[c].kv[l];
                void *ps[6] = {kv->k, kv->v, kv->k_scales, kv->k_biases, kv->v_scales, kv->v_biases};
                for (int i = 0; i < 6; i++)
                    if (ps[i]) be->ops->dealloc(be, ps[i]);
            }
        }
    }
    printf("(KV MB/step: the K and V bytes of all layers at the depth; GB/s = that / step time; 'of read': "
           "against the measured read bandwidth)\n");
    free(h), free(hp);
    pt_backend_free(&be);
    return 0;
}
