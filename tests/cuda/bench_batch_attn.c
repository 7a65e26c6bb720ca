/* Benchmark of the batched decode attention (issue: continuous batching on
 * CUDA): one batched step's RoPE, cache append and attention over every
 * layer of the llama-3.1-8b shape (32 layers, 32 query heads, 8 KV heads,
 * head_dim 128, bf16 activations and cache) for B rows, each row with its own
 * caches, every row at the same key count — what the server's captured step
 * runs: rope_kv_attention over the rows' K/V pointer table with
 * pt_attn.max_keys the step's key class (128 up to 128 keys, else 256; past
 * 256 keys, 0: the split kernels). Each layer has its own caches, so a step
 * reads far more than the L2 holds. The layers' calls are captured into a
 * CUDA graph per setting and replayed back to back (device time, no launch
 * gaps); settings alternate within each repetition (paired A/B), medians
 * reported: µs per layer, the KV bytes a step must read (K and V rows of
 * every key) and their rate against the device read bandwidth measured in
 * the same run. Each row ends with a hash of the output of a replay from the
 * same state: equal hashes, the same bits.
 * Settings (the backend's A/B switches, set before each capture):
 *   default     the rules as shipped
 *   split       PETREL_CUDA_DEC_SHORT_ROWS_STAGE=4: each warp stages its
 *               split's key rows, then its value rows, in shared memory
 *   split2      split with the plain builds (ROWS_MINB=2)
 *   minb2       PETREL_CUDA_DEC_SHORT_ROWS_MINB=2: the plain builds
 *   l2          PETREL_CUDA_DEC_SHORT_ROWS_L2: the rows' cached keys and
 *               values fetched into the L2 before each block's wait
 *   generic     PETREL_CUDA_DEC_ROWS1=0: the generic kernel where every
 *               split is one task (default: dec_rows1_kernel)
 * Built with CUDA=1 into the GPU bundle; not a test (no pass/fail).
 * The caches hold BATCH_ATTN_CAP slots (default 256; the split count
 * follows the capacity: 4 splits at 256, 16 at a served --ctx 1024).
 * Usage: bench_batch_attn [reps] [rows] [keys ...]   (default 9 64 80 200) */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"

#define LAYERS 32
#define NH 32
#define NKV 8
#define HD 128
#define NSET 6

void pt_cuda_dec_short_rows_l2(int on);   /* attention_short.cu: the rows' L2 prefetch (A/B) */
void pt_cuda_dec_short_rows_minb(int v);  /* attention_short.cu: 2 plain, 4 dense builds, 0 the rule */
void pt_cuda_dec_short_rows_stage(int v); /* attention_short.cu: the rows' staging, -1 the backend's */
void pt_cuda_dec_rows1(int v);            /* attention_short.cu: 0 the generic kernel for one-task splits, -1 the environment's */

static void set(int s) {
    pt_cuda_dec_short_rows_stage(s == 1 || s == 2 ? 4 : -1);
    pt_cuda_dec_short_rows_minb(s == 2 || s == 3 ? 2 : 0);
    pt_cuda_dec_short_rows_l2(s == 4);
    pt_cuda_dec_rows1(s == 5 ? 0 : -1);
}

int main(int argc, char **argv) {
    const char *ce = getenv("BATCH_ATTN_CAP");
    const int cap = ce ? atoi(ce) : 256;
    if (cap < 256 || cap > 32768) DIE("BATCH_ATTN_CAP: 256 to 32768, not %s", ce);
    static const char *names[NSET] = {"default", "split", "split2", "minb2", "l2", "generic"};
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1 || reps > 64) reps = 9;
    int B = argc > 2 ? atoi(argv[2]) : 64;
    if (B < 1 || B > 256) DIE("rows: 1 to 256, not %s", argv[2]);
    int keys[8] = {80, 200}, nk = 2;
    if (argc > 3) {
        nk = 0;
        for (int i = 3; i < argc && nk < 8; i++) {
            keys[nk] = atoi(argv[i]);
            if (keys[nk] < 1 || keys[nk] > cap) DIE("keys: 1 to %d, not %s", cap, argv[i]);
            nk++;
        }
    }
    pt_backend *be = bench_cuda_open();
    pt_backend_limits lim = {.max_tokens = B, .max_ctx = cap, .max_heads = NH, .max_head_dim = HD, .max_cols = 4096,
                             .max_rows = B};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");
    double read_gbs = 0;
    if (pt_cuda_read_bandwidth((size_t)2 << 30, &read_gbs) != PT_OK) DIE("read bandwidth");
    printf("read bandwidth: %.0f GB/s (2 GiB, 16-byte loads)\n", read_gbs);
    printf("batched decode attention, llama-3.1-8b shape: %d layers x (%d heads, %d KV heads, head_dim %d), bf16 "
           "cache, %d rows; median of %d paired repetitions\n",
           LAYERS, NH, NKV, HD, B, reps);

    /* the caches: every layer and row its own K and V [NKV, cap, HD], random bf16 in [-1, 1] */
    const size_t celems = (size_t)NKV * cap * HD, cbytes = celems * 2;
    uint16_t *hc = malloc(cbytes);
    if (!hc) DIE("host cache");
    for (size_t i = 0; i < celems; i++) hc[i] = pt_f32_to_bf16((float)(ru() % 20001) / 10000.0f - 1.0f);
    void **tab = malloc(sizeof(void *) * 2 * B);
    void **tabd = malloc(sizeof(void *) * LAYERS);
    void **caches = malloc(sizeof(void *) * 2 * B * LAYERS);
    if (!tab || !tabd || !caches) DIE("host tables");
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < 2 * B; i++) {
            void *c = bench_alloc(be, cbytes);
            if (be->ops->upload(be, c, hc, cbytes) != PT_OK) DIE("upload cache");
            caches[(size_t)l * 2 * B + i] = tab[i] = c;
        }
        tabd[l] = bench_alloc(be, sizeof(void *) * 2 * B);
        if (be->ops->upload(be, tabd[l], tab, sizeof(void *) * 2 * B) != PT_OK) DIE("upload table");
    }
    /* one step's rows (shared by the layers): q [B, NH, HD], k and v [B, NKV, HD], the RoPE table */
    const size_t nq = (size_t)B * NH * HD, nkv = (size_t)B * NKV * HD;
    float *h = malloc(nq * 4), *out = malloc(nq * 4);
    if (!h || !out) DIE("host rows");
    float *q = bench_alloc(be, nq * 4), *k = bench_alloc(be, nkv * 4), *v = bench_alloc(be, nkv * 4), *o = bench_alloc(be, nq * 4);
    for (size_t i = 0; i < nq; i++) h[i] = (float)(ru() % 20001) / 5000.0f - 2.0f;
    be->ops->upload(be, q, h, nq * 4);
    for (size_t i = 0; i < nkv; i++) h[i] = (float)(ru() % 20001) / 5000.0f - 2.0f;
    be->ops->upload(be, k, h, nkv * 4);
    for (size_t i = 0; i < nkv; i++) h[i] = (float)(ru() % 20001) / 5000.0f - 2.0f;
    be->ops->upload(be, v, h, nkv * 4);
    float inv[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(500000.0f, -2.0f * i / HD);
    float *invd = bench_alloc(be, sizeof inv);
    be->ops->upload(be, invd, inv, sizeof inv);
    const pt_rope rope = {HD, invd, 1.0f};
    const pt_kv_layer shape = {.n_kv = NKV, .head_dim = HD, .capacity = cap, .dtype = PT_FT_BF16};
    int32_t *pos = bench_alloc(be, (size_t)B * 4), *hp = malloc((size_t)B * 4);
    if (!hp) DIE("host positions");

    printf("%-8s %5s %10s %9s %8s %9s  %s\n", "setting", "keys", "KV MB/step", "us/layer", "GB/s", "of read",
           "out hash");
    for (int ki = 0; ki < nk; ki++) {
        const int n = keys[ki];
        for (int b = 0; b < B; b++) hp[b] = n - 1;
        be->ops->upload(be, pos, hp, (size_t)B * 4);
        pt_attn p = {.n_heads = NH, .head_dim = HD, .scale = 1.0f / sqrtf((float)HD),
                     .max_keys = n <= 128 ? 128 : n <= 256 ? 256 : 0};
        pt_cuda_graph *g[NSET] = {0};
        for (int s = 0; s < NSET; s++) {
            set(s);
            if (pt_cuda_graph_begin(be) != PT_OK) DIE("graph begin");
            for (int l = 0; l < LAYERS; l++)
                if (be->ops->rope_kv_attention(be, o, q, k, v, B, pos, &rope, (pt_kv_layer *)&shape,
                                               (void *const *)tabd[l], &p) != PT_OK)
                    DIE("capture %s", names[s]);
            if (pt_cuda_graph_end(be, &g[s]) != PT_OK) DIE("graph end");
        }
        set(-1);
        double t[NSET][64];
        for (int r = -1; r < reps; r++)
            for (int s = 0; s < NSET; s++) {
                const double t0 = now();
                for (int i = 0; i < 5; i++) pt_cuda_graph_launch(be, g[s]);
                if (be->ops->sync(be) != PT_OK) DIE("replay %s", names[s]);
                if (r >= 0) t[s][r] = (now() - t0) / 5;
            }
        const double kvb = 2.0 * B * NKV * (double)n * HD * 2.0 * LAYERS;
        for (int s = 0; s < NSET; s++) {
            qsort(t[s], (size_t)reps, sizeof(double), cmpd);
            const double tm = t[s][reps / 2], gbs = kvb / tm / 1e9;
            pt_cuda_graph_launch(be, g[s]);
            if (be->ops->download(be, out, o, nq * 4) != PT_OK) DIE("download %s", names[s]);
            uint32_t hash = 2166136261u;
            const unsigned char *hb = (const unsigned char *)out;
            for (size_t i = 0; i < nq * 4; i++) hash = (hash ^ hb[i]) * 16777619u;
            printf("%-8s %5d %10.1f %9.2f %8.0f %8.1f%%  %08x\n", names[s], n, kvb / 1e6, tm * 1e6 / LAYERS, gbs,
                   100.0 * gbs / read_gbs, hash);
            pt_cuda_graph_free(&g[s]);
        }
    }
    for (size_t i = 0; i < (size_t)2 * B * LAYERS; i++) be->ops->dealloc(be, caches[i]);
    for (int l = 0; l < LAYERS; l++) be->ops->dealloc(be, tabd[l]);
    be->ops->dealloc(be, q), be->ops->dealloc(be, k), be->ops->dealloc(be, v), be->ops->dealloc(be, o);
    be->ops->dealloc(be, invd), be->ops->dealloc(be, pos);
    pt_backend_free(&be);
    free(hc), free(tab), free(tabd), free(caches), free(h), free(out), free(hp);
    return 0;
}
