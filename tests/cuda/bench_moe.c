/* The MoE block of one qwen3-30b-a3b layer (128 experts, top-8, hidden
 * 2048, expert width 768, 4-bit group 64) on CUDA: routing (moe_route) and
 * the experts (moe_ffn), three paths in one process, alternating, for T =
 * 1 .. 256 tokens: "old" the per-item kernels (PETREL_CUDA_MOE_V2=0), the
 * decode path (moe_decode.cu) with its per-item grid at every T ("item")
 * and with its expert grid at every T in its two shapes ("wide", "lean"; the
 * default takes the grid from two tokens up, lean below 1024 items). Each
 * number is µs per layer:
 * the median of 5 replays of a CUDA graph of NL passes, each pass over its
 * own router logits (so the passes pick different experts and the ~330 MB
 * stack does not sit in L2). Also prints the weight bytes a T = 1 pass
 * reads (8 experts × gate, up, down codes + scales + biases) and the rate
 * that makes. The paths' outputs are compared bit for bit.
 * `bench_moe bf16`: the same layer with dense bf16 experts: "old" (the
 * per-item GEMVs, GLU and combine), "item" (moe_dense.cu's two kernels at
 * every size) and "wide"/"lean" both the default dispatch (those kernels up
 * to 32 items, the per-item GEMVs above).
 * Not a test; built with the CUDA test binaries (make gpu-bundle) and run on
 * the GPU machine: bench_moe. Numbers in bench/RESULTS.md. */
#include "bench_util.h"

#include "base/half.h"

#include <string.h>

void pt_cuda_moe_select(int v2);     /* moe_decode.cu: 1 the decode path, 0 the per-item kernels */
void pt_cuda_moe_expert_min(int b); /* moe_grid.cu: its expert grid from b items up (<= 0: default) */
void pt_cuda_moe_tile_shape(int s); /* moe_grid.cu: the grid's shape, 0 wide, 1 lean, -1 by size */

enum { E = 128, K = 8, H = 2048, I = 768, GS = 64, NL = 16, TMAX = 256, NPATH = 4 };

void pt_cuda_moe_dense_max(int b); /* moe_dense.cu: most items of the dense bf16 kernels (<= 0: default) */

static int dense; /* bench_moe bf16: dense bf16 experts */

/* path 0 old, 1 the decode path's per-item grid, 2 its expert grid wide, 3 lean;
 * dense bf16: 1 moe_dense.cu's kernels at every size, 2 and 3 the default dispatch */
static void select_path(int v) {
    pt_cuda_moe_select(v > 0);
    pt_cuda_moe_dense_max(v == 1 ? 1 << 30 : 0);
    pt_cuda_moe_expert_min(v == 1 ? 1 << 30 : 1);
    pt_cuda_moe_tile_shape(v == 3);
}

static void make_stack(pt_backend *be, pt_matrix *w, int64_t N, int64_t Kc) {
    const int64_t R = (int64_t)E * N;
    if (dense) {
        uint16_t *d = malloc((size_t)(R * Kc) * 2);
        for (int64_t i = 0; i < R * Kc; i++) d[i] = pt_f32_to_bf16(((ru() & 0xffff) / 65536.0f - 0.5f) * 0.1f);
        *w = (pt_matrix){.rows = N, .cols = Kc, .n_experts = E, .dtype = PT_FT_BF16, .data = d};
        if (be->ops->prepare_weight(be, w, "experts") != PT_OK) DIE("prepare");
        free(d);
        return;
    }
    uint32_t *d = malloc((size_t)(R * Kc / 2));
    uint16_t *sc = malloc((size_t)(R * Kc / GS) * 2), *bi = malloc((size_t)(R * Kc / GS) * 2);
    for (int64_t i = 0; i < R * Kc / 8; i++) d[i] = ru();
    for (int64_t i = 0; i < R * Kc / GS; i++) {
        sc[i] = pt_f32_to_bf16(((ru() & 0xffff) / 65536.0f - 0.5f) * 0.02f);
        bi[i] = pt_f32_to_bf16(((ru() & 0xffff) / 65536.0f - 0.5f) * 0.2f);
    }
    *w = (pt_matrix){.rows = N, .cols = Kc, .n_experts = E, .dtype = PT_FT_BF16, .bits = 4, .group_size = GS,
                     .data = d, .scales = sc, .biases = bi};
    if (be->ops->prepare_weight(be, w, "experts") != PT_OK) DIE("prepare");
    free(d), free(sc), free(bi);
}

typedef struct {
    pt_backend *be;
    pt_matrix g, u, d;
    float *logits[NL], *x, *y, *wts;
    int32_t *idx;
} moe_set;

static void pass(moe_set *s, int l, int T) {
    pt_backend *be = s->be;
    const pt_moe_route rp = {E, K, 1, NULL};
    if (be->ops->moe_route(be, s->idx, s->wts, s->logits[l], T, &rp) != PT_OK) DIE("route");
    if (be->ops->moe_ffn(be, s->y, s->x, T, s->idx, s->wts, K, &s->g, &s->u, &s->d, PT_GLU_SILU) != PT_OK)
        DIE("moe_ffn");
}

/* µs per pass (median of 5 graph replays), what 0: routing + experts, 1: routing alone */
static double time_graph(moe_set *s, int T, int what) {
    pt_backend *be = s->be;
    const pt_moe_route rp = {E, K, 1, NULL};
    for (int l = 0; l < NL; l++) pass(s, l, T); /* eager first */
    if (be->ops->sync(be) != PT_OK) DIE("sync");
    if (pt_cuda_graph_begin(be) != PT_OK) DIE("begin");
    for (int l = 0; l < NL; l++) {
        if (what == 1) {
            if (be->ops->moe_route(be, s->idx, s->wts, s->logits[l], T, &rp) != PT_OK) DIE("route");
        } else pass(s, l, T);
    }
    return bench_graph_median_us(be, NL);
}

int main(int argc, char **argv) {
    dense = argc > 1 && !strcmp(argv[1], "bf16");
    moe_set s;
    memset(&s, 0, sizeof s);
    s.be = bench_cuda_open();
    pt_backend *be = s.be;
    pt_backend_limits lim = {.max_tokens = TMAX, .max_cols = H, .max_ffn = I, .max_top_k = K, .max_ctx = 16,
                             .max_heads = 1, .max_head_dim = 64};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");
    make_stack(be, &s.g, I, H);
    make_stack(be, &s.u, I, H);
    make_stack(be, &s.d, H, I);
    float *h = malloc((size_t)TMAX * E * 4);
    for (int l = 0; l < NL; l++) {
        for (int i = 0; i < TMAX * E; i++) h[i] = ((ru() & 0xffff) / 65536.0f - 0.5f) * 8.0f;
        s.logits[l] = be->ops->alloc(be, (size_t)TMAX * E * 4);
        if (!s.logits[l] || be->ops->upload(be, s.logits[l], h, (size_t)TMAX * E * 4) != PT_OK) DIE("logits");
    }
    float *xh = malloc((size_t)TMAX * H * 4);
    for (int i = 0; i < TMAX * H; i++) xh[i] = pt_bf16_to_f32(pt_f32_to_bf16(((ru() & 0xffff) / 65536.0f - 0.5f)));
    s.x = be->ops->alloc(be, (size_t)TMAX * H * 4);
    s.y = be->ops->alloc(be, (size_t)TMAX * H * 4);
    s.wts = be->ops->alloc(be, (size_t)TMAX * K * 4);
    s.idx = be->ops->alloc(be, (size_t)TMAX * K * 4);
    if (!s.x || !s.y || !s.wts || !s.idx || be->ops->upload(be, s.x, xh, (size_t)TMAX * H * 4) != PT_OK) DIE("alloc");
    /* bytes one token's pass reads: 8 experts × 3 matrices × (codes + bf16 scales and biases) */
    const double bytes = dense ? (double)K * 3 * I * H * 2 : (double)K * 3 * ((double)I * H / 2 + 2.0 * 2 * I * H / GS);
    printf("qwen3-30b-a3b MoE block (E=%d top-%d H=%d I=%d %s): µs per layer, graphs of %d passes;\n"
           "T=1 reads %.2f MB of expert weights\n",
           E, K, H, I, dense ? "dense bf16" : "4-bit g64", NL, bytes / 1e6);
    /* the paths' outputs, bit for bit, at every T */
    float *yv[NPATH];
    for (int v = 0; v < NPATH; v++) yv[v] = malloc((size_t)TMAX * H * 4);
    static const int Tq[] = {1, 2, 4, 8, 16, 64, 128, 256}, Td[] = {1, 2, 4, 8, 16};
    /* dense bf16: every item reads its expert's rows (no expert grid), so only the decode sizes */
    const int *Ts = dense ? Td : Tq;
    const int NT = dense ? (int)(sizeof Td / sizeof Td[0]) : (int)(sizeof Tq / sizeof Tq[0]);
    for (int ti = 0; ti < NT; ti++) {
        const int T = Ts[ti];
        for (int v = 0; v < NPATH; v++) {
            select_path(v);
            pass(&s, 3, T);
            if (be->ops->download(be, yv[v], s.y, (size_t)T * H * 4) != PT_OK) DIE("download");
        }
        printf("T=%d: outputs of old / item / wide / lean: %s, %s, %s\n", T,
               memcmp(yv[0], yv[1], (size_t)T * H * 4) ? "old DIFFERS from item" : "old = item",
               memcmp(yv[1], yv[2], (size_t)T * H * 4) ? "item DIFFERS from wide" : "item = wide",
               memcmp(yv[1], yv[3], (size_t)T * H * 4) ? "item DIFFERS from lean" : "item = lean");
    }
    printf("%4s %10s %10s %10s %10s %10s %10s %9s %9s\n", "T", "route old", "route new", "moe old", "moe item",
           "moe wide", "moe lean", "new/old", "item GB/s");
    for (int ti = 0; ti < NT; ti++) {
        const int T = Ts[ti];
        double r[NPATH][3], m[NPATH][3]; /* [path][round], alternating */
        for (int round = 0; round < 3; round++)
            for (int v = 0; v < NPATH; v++) {
                select_path(v);
                r[v][round] = v >= 2 ? 0 : time_graph(&s, T, 1);
                m[v][round] = time_graph(&s, T, 0);
            }
        for (int v = 0; v < NPATH; v++) {
            qsort(r[v], 3, sizeof(double), cmpd);
            qsort(m[v], 3, sizeof(double), cmpd);
        }
        /* new = the default dispatch: the per-item grid below 65 items, the lean grid below 1024, else wide */
        const double mnew = dense ? m[2][1] : T * K < 65 ? m[1][1] : T * K < 1024 ? m[3][1] : m[2][1];
        printf("%4d %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8.2fx %9.0f\n", T, r[0][1], r[1][1], m[0][1], m[1][1],
               m[2][1], m[3][1], mnew / m[0][1], T == 1 ? bytes / (m[1][1] * 1e-6) / 1e9 : 0.0);
    }
    for (int v = 0; v < NPATH; v++) free(yv[v]);
    pt_cuda_moe_expert_min(0);
    pt_cuda_moe_tile_shape(-1);
    pt_cuda_moe_dense_max(0);
    pt_cuda_moe_select(-1);
    free(h), free(xh);
    pt_backend_free(&s.be);
    return 0;
}
