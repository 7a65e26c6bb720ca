/* The CUDA MoE decode path (moe_decode.cu, PETREL_CUDA_MOE_V2) against the
 * per-item kernels it replaces, in one process (pt_cuda_moe_select):
 *  - routing: the warp-per-token kernel gives the same experts and the same
 *    weight bits as the block kernel (128 experts top-8, odd counts, ties,
 *    renormalization and per-expert scales, f32 and bf16 modes);
 *  - experts: the fused gate|up + GLU and down + combine kernels give the
 *    same bits as gate/up GEMVs + GLU + down GEMV + combine at one token of
 *    the Qwen3-30B-A3B expert shape (where the per-item GEMV takes one warp
 *    per row), and agree to rounding at 3 tokens over other shapes (fused
 *    gate|up, 8-bit, group 32 and 128, a bias, top-2 with few warps per
 *    block);
 *  - batch invariance: a token's output is the same bits alone and inside a
 *    batch of tokens with other experts (3, 16 and 64 tokens: alone it takes
 *    the per-item grid, in the batch the expert grid — tiles of up to four
 *    items of one expert, three where the 8-bit K = 2048 staging is larger,
 *    expert counts that leave partial tiles, in both of its shapes —, so the
 *    grids are held to the same bits);
 *  - dense bf16 expert stacks (moe_dense.cu, up to 32 items): the same bits
 *    as the per-item path at 1, 3 and 16 tokens in both activation modes,
 *    alone and batched;
 *  - an expert index outside the stack is PT_ERR_RANGE naming it.
 * The CPU parity of both paths is test_cuda_ops' test_moe. Built with
 * CUDA=1 and run on the GPU machine; without a GPU every test is SKIP. */
#include "test.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "test_rand.h"
#include "gpu_util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

void pt_cuda_moe_select(int v2); /* moe_decode.cu: 1 the decode path, 0 the per-item kernels, -1 the environment */
long pt_cuda_moe_dense_launches(void); /* moe_dense.cu: launches of the dense bf16 expert kernels */
unsigned long long pt_cuda_moe_route_warp_count(void); /* moe_decode.cu: launches of the warp routing kernel */
void pt_cuda_moe_expert_min(int b); /* moe_grid.cu: the decode path's expert grid from b items up (<= 0: default) */
void pt_cuda_moe_tile_shape(int s); /* moe_grid.cu: the expert grid's shape, 0 wide, 1 lean, -1 by size */

static pt_backend *G_[2]; /* [act]: 0 f32, 1 bf16 */
static int have_gpu;

static int setup(void) {
    if (have_gpu) return 1;
    if (!gpu_usable(NULL)) return 0;
    for (int a = 0; a < 2; a++) {
        if (!gpu_backend_create(&G_[a], a ? PT_ACT_BF16 : PT_ACT_F32)) return 0;
        pt_backend_limits lim = {.max_tokens = 64, .max_ctx = 64, .max_heads = 4, .max_head_dim = 64,
                                 .max_cols = 2048, .max_ffn = 768, .max_top_k = 8};
        if (G_[a]->ops->reserve(G_[a], &lim) != PT_OK) return 0;
    }
    have_gpu = 1;
    return 1;
}
#define NEED_GPU()                                             \
    do {                                                       \
        if (!setup()) TEST_SKIP("no usable CUDA device here"); \
    } while (0)

/* ---- routing ---- */

static int route_case(int a, int64_t T, int E, int k, int renorm, int scaled) {
    pt_backend *G = G_[a];
    float *logits = malloc((size_t)(T * E) * 4), *pes = malloc((size_t)E * 4);
    fill_act(logits, T * E, -3, 3, a);
    if (T > 1 && E > 4) logits[E + 2] = logits[E + 3]; /* a tie in token 1: the lower index wins */
    for (int e = 0; e < E; e++) pes[e] = rf(0.5f, 1.5f);
    float *ld = put(G, logits, (size_t)(T * E) * 4), *pesd = put(G, pes, (size_t)E * 4);
    float *wd = put(G, NULL, (size_t)(T * k) * 4);
    int32_t *idd = put(G, NULL, (size_t)(T * k) * 4);
    int32_t *i0 = malloc((size_t)(T * k) * 4), *i1 = malloc((size_t)(T * k) * 4);
    float *w0 = malloc((size_t)(T * k) * 4), *w1 = malloc((size_t)(T * k) * 4);
    pt_moe_route p = {E, k, renorm, scaled ? pesd : NULL};
    int ok = 1;
    const unsigned long long n0 = pt_cuda_moe_route_warp_count();
    for (int v = 0; v < 2 && ok; v++) {
        pt_cuda_moe_select(v);
        pt_status s = G->ops->moe_route(G, idd, wd, ld, T, &p);
        if (s == PT_OK) s = G->ops->download(G, v ? i1 : i0, idd, (size_t)(T * k) * 4);
        if (s == PT_OK) s = G->ops->download(G, v ? w1 : w0, wd, (size_t)(T * k) * 4);
        CHECK(s == PT_OK, "moe_route (path %d): %s", v, pt_last_error());
        ok = s == PT_OK;
    }
    if (ok) {
        CHECK(memcmp(i0, i1, (size_t)(T * k) * 4) == 0, "E=%d k=%d act=%d: the experts differ", E, k, a);
        CHECK(memcmp(w0, w1, (size_t)(T * k) * 4) == 0, "E=%d k=%d act=%d renorm=%d: the weights differ", E, k, a,
              renorm);
        ok = memcmp(i0, i1, (size_t)(T * k) * 4) == 0 && memcmp(w0, w1, (size_t)(T * k) * 4) == 0;
        /* the warp kernel takes up to 512 experts and 64 picks, the block kernel the rest */
        const int warp = E <= 512 && k <= 64;
        const unsigned long long ran = pt_cuda_moe_route_warp_count() - n0;
        CHECK(ran == (unsigned long long)warp, "E=%d k=%d: the warp kernel ran %llu times", E, k, ran);
        ok = ok && ran == (unsigned long long)warp;
    }
    pt_cuda_moe_select(-1);
    G->ops->dealloc(G, ld), G->ops->dealloc(G, pesd), G->ops->dealloc(G, wd), G->ops->dealloc(G, idd);
    free(logits), free(pes), free(i0), free(i1), free(w0), free(w1);
    return ok;
}

static void test_moe_route_warp(void) {
    NEED_GPU();
    for (int a = 0; a < 2; a++) {
        if (!route_case(a, 5, 128, 8, 1, 0)) return;  /* Qwen3 MoE */
        if (!route_case(a, 3, 128, 8, 0, 1)) return;  /* no renormalization, per-expert scales */
        if (!route_case(a, 4, 7, 3, 1, 1)) return;    /* fewer experts than a warp */
        if (!route_case(a, 6, 200, 6, 1, 0)) return;  /* not a multiple of 32 */
        if (!route_case(a, 1, 64, 64, 1, 0)) return;  /* every expert picked */
        if (!route_case(a, 7, 64, 40, 1, 1)) return;  /* more picks than lanes */
        if (!route_case(a, 5, 512, 10, 1, 0)) return; /* Qwen3-Next: the most experts in registers */
        if (!route_case(a, 3, 300, 8, 0, 1)) return;  /* 10 logits per lane */
        if (!route_case(a, 3, 600, 8, 1, 0)) return;  /* above: the block kernel on both paths */
    }
}

/* ---- experts ---- */

typedef struct {
    rand_qweight q;
    int ok;
} stack;

/* An expert stack [E, N, K] prepared on G; bits 0: dense bf16 weights. */
static int stack_make(stack *s, pt_backend *G, int64_t E, int64_t N, int64_t K, int bits, int gs, int bias) {
    if (bits == 0) {
        uint16_t *w = malloc((size_t)(E * N * K) * 2);
        for (int64_t i = 0; i < E * N * K; i++) w[i] = pt_f32_to_bf16(rf(-0.05f, 0.05f));
        memset(&s->q, 0, sizeof s->q);
        s->q.codes = w;
        s->q.bias = bias ? malloc((size_t)(E * N) * 2) : NULL;
        for (int64_t i = 0; bias && i < E * N; i++) s->q.bias[i] = pt_f32_to_bf16(rf(-1, 1));
        s->q.w = (pt_matrix){.rows = E * N, .cols = K, .dtype = PT_FT_BF16, .data = w, .bias = s->q.bias,
                             .bias_dtype = PT_FT_BF16};
    } else {
        rand_qweight_make(&s->q, E * N, K, bits, gs, bias, 1);
    }
    s->q.w.rows = N;
    s->q.w.n_experts = E;
    pt_status st = G->ops->prepare_weight(G, &s->q.w, "experts");
    CHECK(st == PT_OK, "prepare_weight: %s", pt_last_error());
    s->ok = st == PT_OK;
    return s->ok;
}
static void stack_free(stack *s, pt_backend *G) {
    if (s->ok) G->ops->release_weight(G, &s->q.w);
    rand_qweight_free(&s->q);
}

/* y = moe_ffn over T tokens of x with the given routes, on path v. */
static int run_ffn(pt_backend *G, int v, float *y, const float *x, const int32_t *idx, const float *wts, int64_t T,
                   int k, int64_t H, const pt_matrix *g, const pt_matrix *u, const pt_matrix *d) {
    float *xd = put(G, x, (size_t)(T * H) * 4), *yd = put(G, NULL, (size_t)(T * H) * 4);
    float *wd = put(G, wts, (size_t)(T * k) * 4);
    int32_t *id = put(G, idx, (size_t)(T * k) * 4);
    pt_cuda_moe_select(v);
    pt_status s = G->ops->moe_ffn(G, yd, xd, T, id, wd, k, g, u, d, PT_GLU_SILU);
    if (s == PT_OK) s = G->ops->download(G, y, yd, (size_t)(T * H) * 4);
    pt_cuda_moe_select(-1);
    CHECK(s == PT_OK, "moe_ffn (path %d): %s", v, pt_last_error());
    G->ops->dealloc(G, xd), G->ops->dealloc(G, yd), G->ops->dealloc(G, wd), G->ops->dealloc(G, id);
    return s == PT_OK;
}

static int ffn_case(int a, int64_t T, int64_t E, int k, int64_t H, int64_t I, int bits, int gs, int fused, int bias) {
    pt_backend *G = G_[a];
    stack g, u = {0}, d;
    int ok = stack_make(&g, G, E, fused ? 2 * I : I, H, bits, gs, bias);
    if (ok && !fused) ok = stack_make(&u, G, E, I, H, bits, gs, bias);
    if (ok) ok = stack_make(&d, G, E, H, I, bits, gs, bias);
    else d.ok = 0, d.q.codes = NULL, d.q.sc = d.q.bi = d.q.bias = NULL;
    float *x = malloc((size_t)(T * H) * 4), *wts = malloc((size_t)(T * k) * 4);
    float *y0 = malloc((size_t)(T * H) * 4), *y1 = malloc((size_t)(T * H) * 4), *y2 = malloc((size_t)H * 4);
    int32_t *idx = malloc((size_t)(T * k) * 4);
    fill_act(x, T * H, -1, 1, a);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            /* distinct experts per token, in no particular order; one
             * repeated expert in token 2 (the combine's slot order) */
            idx[t * k + j] = (int32_t)((t * 5 + j * 3 + (j & 1) * 7) % E);
            wts[t * k + j] = a ? pt_round_bf16(rf(0.01f, 0.3f)) : rf(0.01f, 0.3f);
        }
    if (k > 1 && T > 2) idx[2 * k + 1] = idx[2 * k];
    const pt_matrix *gw = &g.q.w, *uw = fused ? NULL : &u.q.w, *dw = &d.q.w;
    if (ok) ok = run_ffn(G, 0, y0, x, idx, wts, T, k, H, gw, uw, dw) && run_ffn(G, 1, y1, x, idx, wts, T, k, H, gw, uw, dw);
    if (ok) {
        /* the per-item GEMV's launch shape (rows per block, warps per row)
         * depends on the batch, and a shape with several rows per block may
         * contract a product differently: the paths agree to rounding, and
         * bit for bit where that GEMV ran one row per warp (the MoE decode
         * shapes at one token: test_moe_decode_same_bits) */
        double worst = 0, mx = 0;
        int64_t diff = 0;
        for (int64_t i = 0; i < T * H; i++) {
            if (memcmp(&y0[i], &y1[i], 4)) diff++;
            const double dd = fabs((double)y0[i] - (double)y1[i]);
            if (dd > worst || isnan(y1[i])) worst = isnan(y1[i]) ? INFINITY : dd;
            if (fabs(y0[i]) > mx) mx = fabs(y0[i]);
        }
        printf("MEASURE moe_ffn E=%lld k=%d H=%lld I=%lld bits=%d gs=%d fused=%d act=%d T=%lld: %lld of %lld outputs "
               "differ from the per-item path, max |diff| %.3g of max |y| %.3g\n",
               (long long)E, k, (long long)H, (long long)I, bits, gs, fused, a, (long long)T, (long long)diff,
               (long long)(T * H), worst, mx);
        /* dense bf16 experts: the decode kernels form each row as the
         * per-item GEMV does (one launch shape at every batch): same bits */
        if (bits == 0) {
            CHECK(diff == 0, "dense bf16 experts, fused=%d act=%d T=%lld: %lld outputs differ from the per-item path",
                  fused, a, (long long)T, (long long)diff);
            ok = diff == 0;
        }
        const double tol = (a ? 2e-2 : 1e-5) * mx;
        CHECK(worst <= tol, "bits=%d gs=%d fused=%d act=%d: max |diff| %.3g from the per-item path > %.3g", bits, gs,
              fused, a, worst, tol);
        ok = ok && worst <= tol;
        /* batch invariance: each token alone gives its row of the batch
         * (alone: the per-item grid; in a batch of T·k > 8 items: the
         * expert grid, so this also holds the two grids to the same bits) */
        for (int64_t t = 0; t < T && ok; t++) {
            ok = run_ffn(G, 1, y2, x + t * H, idx + t * k, wts + t * k, 1, k, H, gw, uw, dw);
            if (ok) {
                CHECK(memcmp(y2, y1 + t * H, (size_t)H * 4) == 0,
                      "T=%lld bits=%d fused=%d k=%d act=%d: token %lld alone differs from its batch row", (long long)T,
                      bits, fused, k, a, (long long)t);
                ok = memcmp(y2, y1 + t * H, (size_t)H * 4) == 0;
            }
        }
    }
    if (ok) {
        /* an expert index outside the stack: an error naming it, no wild read */
        /* (in the last token of the batch: T·k > 8 takes the expert grid) */
        int32_t *bad = malloc((size_t)(T * k) * 4);
        memcpy(bad, idx, (size_t)(T * k) * 4);
        bad[T * k - 1] = (int32_t)(E + 90);
        float *xd = put(G, x, (size_t)(T * H) * 4), *yd = put(G, NULL, (size_t)(T * H) * 4);
        float *wd = put(G, wts, (size_t)(T * k) * 4);
        int32_t *id = put(G, bad, (size_t)(T * k) * 4);
        free(bad);
        pt_cuda_moe_select(1);
        pt_status s = G->ops->moe_ffn(G, yd, xd, T, id, wd, k, gw, uw, dw, PT_GLU_SILU);
        if (s == PT_OK) s = G->ops->sync(G);
        if (s == PT_OK) s = G->ops->download(G, y0, yd, (size_t)(T * H) * 4);
        pt_cuda_moe_select(-1);
        char want[32];
        snprintf(want, sizeof want, "%d", (int)(E + 90));
        CHECK(s == PT_ERR_RANGE && strstr(pt_last_error(), want), "bad expert: %s %s", pt_status_name(s),
              pt_last_error());
        ok = s == PT_ERR_RANGE;
        G->ops->dealloc(G, xd), G->ops->dealloc(G, yd), G->ops->dealloc(G, wd), G->ops->dealloc(G, id);
    }
    stack_free(&g, G);
    if (!fused && u.q.codes) stack_free(&u, G);
    if (d.q.codes) stack_free(&d, G);
    free(x), free(wts), free(y0), free(y1), free(y2), free(idx);
    return ok;
}

/* One token, top-8, 4-bit group 64, the Qwen3-30B-A3B expert shape and a
 * fused one: the per-item GEMV runs one warp per row there, so the decode
 * path gives its bits exactly in bf16 mode (f32 mode: to f32 rounding). */
static void test_moe_decode_same_bits(void) {
    NEED_GPU();
    for (int a = 1; a >= 0; a--)
        for (int fused = 0; fused < 2; fused++) {
            pt_backend *G = G_[a];
            const int64_t E = 16, H = 2048, I = 768;
            const int k = 8;
            stack g, u = {0}, d;
            int ok = stack_make(&g, G, E, fused ? 2 * I : I, H, 4, 64, 0);
            if (ok && !fused) ok = stack_make(&u, G, E, I, H, 4, 64, 0);
            if (ok) ok = stack_make(&d, G, E, H, I, 4, 64, 0);
            else d.ok = 0, d.q.codes = NULL, d.q.sc = d.q.bi = d.q.bias = NULL;
            float x[2048], y0[2048], y1[2048], wts[8];
            int32_t idx[8];
            fill_act(x, H, -1, 1, a);
            for (int j = 0; j < k; j++) {
                idx[j] = (int32_t)((j * 7 + 3) % E);
                wts[j] = a ? pt_round_bf16(rf(0.01f, 0.3f)) : rf(0.01f, 0.3f);
            }
            const pt_matrix *uw = fused ? NULL : &u.q.w;
            if (ok)
                ok = run_ffn(G, 0, y0, x, idx, wts, 1, k, H, &g.q.w, uw, &d.q.w) &&
                     run_ffn(G, 1, y1, x, idx, wts, 1, k, H, &g.q.w, uw, &d.q.w);
            int64_t diff = 0;
            double worst = 0, mx = 0;
            for (int64_t i = 0; ok && i < H; i++) {
                diff += memcmp(&y0[i], &y1[i], 4) != 0;
                if (fabs((double)y0[i] - y1[i]) > worst || isnan(y1[i]))
                    worst = isnan(y1[i]) ? INFINITY : fabs((double)y0[i] - y1[i]);
                if (fabs(y0[i]) > mx) mx = fabs(y0[i]);
            }
            printf("MEASURE one token act=%d fused=%d: %lld of %lld outputs differ from the per-item path (max %.3g)\n",
                   a, fused, (long long)diff, (long long)H, worst);
            /* bf16 mode: the same bits; f32 mode: to f32 rounding (the GEMV
             * may contract its per-chunk fold differently per launch shape) */
            if (a) CHECK(!ok || diff == 0, "fused=%d: %lld of %lld outputs differ from the per-item path", fused,
                         (long long)diff, (long long)H);
            else CHECK(!ok || worst <= 1e-5 * mx, "fused=%d: max |diff| %.3g of max |y| %.3g", fused, worst, mx);
            if (!a) diff = 0;
            stack_free(&g, G);
            if (!fused && u.q.codes) stack_free(&u, G);
            if (d.q.codes) stack_free(&d, G);
            if (!ok || diff) return;
        }
}

/* The expert shapes at 3, 16 and 64 tokens; 0 at the first failure. */
static int experts_cases(void) {
    static const int64_t Ts[] = {3, 16, 64};
    for (int ti = 0; ti < 3; ti++)
        for (int a = 1; a >= 0; a--) {
            const int64_t T = Ts[ti];
            if (!ffn_case(a, T, 16, 8, 2048, 768, 4, 64, 0, 0)) return 0; /* the Qwen3-30B-A3B expert shape */
            if (!ffn_case(a, T, 8, 8, 1024, 512, 4, 64, 1, 0)) return 0;  /* fused gate|up */
            if (!ffn_case(a, T, 12, 8, 1024, 768, 8, 64, 0, 0)) return 0; /* 8-bit */
            if (!ffn_case(a, T, 12, 8, 2048, 768, 8, 64, 1, 0)) return 0; /* 8-bit, K = 2048: 4 chunks per lane */
            if (!ffn_case(a, T, 8, 8, 512, 256, 4, 32, 0, 1)) return 0;   /* group 32, a bias */
            if (!ffn_case(a, T, 8, 2, 256, 128, 4, 128, 1, 0)) return 0;  /* top-2: two warps per down block; group 128 */
        }
    return 1;
}

static void test_moe_decode_experts(void) {
    NEED_GPU();
    /* the expert grid from 9 items up (the default, set here in case it
     * changes): T = 3 takes it at top-8 (24 items), the per-item grid at
     * top-2 (6 items); T = 16 and 64 take it everywhere, one token alone
     * (<= 8 items) never */
    pt_cuda_moe_expert_min(9);
    /* each shape of the expert grid (rows per warp, registers) */
    for (int shape = 0; shape < 2; shape++) {
        pt_cuda_moe_tile_shape(shape);
        printf("INFO expert grid shape %s\n", shape ? "lean" : "wide");
        if (!experts_cases()) break;
    }
    pt_cuda_moe_tile_shape(-1);
    pt_cuda_moe_expert_min(0);
}

/* Dense bf16 expert stacks take the decode path's own kernels (moe_dense.cu:
 * two launches a call, counted) with the per-item path's bits: one token,
 * 3 and 16 tokens, alone against batched, a bad expert index. Shapes: the
 * Qwen3-30B-A3B experts; fused gate|up with a bias and I = 520 (65 chunks:
 * the one-chunk tail of both loops, a partial last block of gate rows);
 * top-2 (two warps per down block). */
static void test_moe_decode_dense(void) {
    NEED_GPU();
    static const int64_t Ts[] = {1, 3, 16};
    for (int ti = 0; ti < 3; ti++)
        for (int a = 1; a >= 0; a--) {
            const int64_t T = Ts[ti];
            const long n0 = pt_cuda_moe_dense_launches();
            if (!ffn_case(a, T, 8, 8, 2048, 768, 0, 0, 0, 0)) return;
            /* two launches a decode-path call: each token alone (8 items); the
             * batch too up to 32 items (T = 16 runs the per-item GEMVs, so
             * its alone-vs-batch check compares the two paths) */
            const long want = 2 * T + (T * 8 <= 32 ? 2 : 0);
            CHECK(pt_cuda_moe_dense_launches() - n0 >= want,
                  "T=%lld: %ld launches of the dense bf16 expert kernels, want at least %ld", (long long)T,
                  pt_cuda_moe_dense_launches() - n0, want);
            if (!ffn_case(a, T, 6, 8, 1024, 520, 0, 0, 1, 1)) return;
            if (!ffn_case(a, T, 4, 2, 256, 136, 0, 0, 0, 0)) return;
        }
}

int main(void) {
    TEST_RUN(test_moe_route_warp);
    TEST_RUN(test_moe_decode_same_bits);
    TEST_RUN(test_moe_decode_experts);
    TEST_RUN(test_moe_decode_dense);
    for (int a = 0; a < 2; a++) pt_backend_free(&G_[a]);
    return test_summary();
}
