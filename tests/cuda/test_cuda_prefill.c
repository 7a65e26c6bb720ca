/* The CUDA prefill paths (T > 64 rows) against the CPU backend: the matmul
 * of quantized weights through the bf16 dequantize (the 2/4/8-bit
 * one-word-per-thread kernel, and the 3/5/6-bit generic one) + cuBLAS, with
 * weights large enough to be split into several row chunks of the tile, and
 * the grouped MoE prefill of moe.cu (tokens sorted by expert, each
 * projection of all experts on the grouped tensor-core kernel, or one cuBLAS
 * GEMM per expert where the kernel does not take the weight) for quantized
 * and dense bf16 experts (both paths: a down projection with K = 96),
 * separate and fused gate|up, including an expert index outside the stack (an error, as
 * on the per-item path). bf16 activations (the mode prefill runs in); per
 * element |gpu − cpu| <= atol + rtol·|cpu| as in test_cuda_ops.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU every test reports SKIP. */
#include "op_check.h"

#include <stdlib.h>
#include <string.h>

/* A random weight on both backends ([0] CPU, [1] CUDA). */
typedef struct {
    pt_matrix w[2];
    void *data, *scales, *biases;
} wt2;

static void ft_set(pt_ftype t, void *p, int64_t i, float v) {
    if (t == PT_FT_F32) ((float *)p)[i] = v;
    else if (t == PT_FT_BF16) ((uint16_t *)p)[i] = pt_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = pt_f32_to_f16(v);
}

static int wt_make(wt2 *t, int a, int64_t E, int64_t N, int64_t K, int bits, int gs, pt_ftype st) {
    memset(t, 0, sizeof *t);
    const int64_t EE = E > 0 ? E : 1;
    pt_matrix m = {.rows = N, .cols = K, .n_experts = E, .dtype = bits ? st : PT_FT_BF16, .bits = bits,
                   .group_size = bits ? gs : 0};
    if (!bits) {
        t->data = malloc((size_t)(EE * N * K) * 2);
        for (int64_t i = 0; i < EE * N * K; i++) ft_set(PT_FT_BF16, t->data, i, rf(-0.1f, 0.1f));
    } else {
        const int64_t words = EE * N * K * bits / 32, ng = EE * N * (K / gs);
        t->data = malloc((size_t)words * 4 + 16);
        for (int64_t i = 0; i < words; i++) ((uint32_t *)t->data)[i] = ru32() ^ (ru32() << 21);
        t->scales = malloc((size_t)ng * 4);
        t->biases = malloc((size_t)ng * 4);
        const float amp = 0.2f / (float)((1 << bits) - 1);
        for (int64_t i = 0; i < ng; i++) {
            ft_set(st, t->scales, i, rf(0.5f * amp, 1.5f * amp));
            ft_set(st, t->biases, i, rf(-0.1f, -0.05f));
        }
        m.scales = t->scales;
        m.biases = t->biases;
    }
    m.data = t->data;
    t->w[0] = t->w[1] = m;
    pt_status s = C_[a]->ops->prepare_weight(C_[a], &t->w[0], "w");
    if (s == PT_OK) s = G_[a]->ops->prepare_weight(G_[a], &t->w[1], "w");
    CHECK(s == PT_OK, "prepare_weight: %s", pt_last_error());
    return s == PT_OK;
}
static void wt_free(wt2 *t, int a) {
    C_[a]->ops->release_weight(C_[a], &t->w[0]);
    G_[a]->ops->release_weight(G_[a], &t->w[1]);
    free(t->data);
    free(t->scales);
    free(t->biases);
}

static int run_matmul(int64_t N, int64_t K, int64_t T, int bits, int gs, pt_ftype st) {
    const int a = 1;
    pt_backend *G = G_[a], *C = C_[a];
    wt2 t;
    if (!wt_make(&t, a, 0, N, K, bits, gs, st)) return 0;
    float *x = malloc((size_t)(T * K) * 4), *yc = malloc((size_t)(T * N) * 4), *yg = malloc((size_t)(T * N) * 4);
    fill_act(x, T * K, -1, 1, a);
    float *xd = put(G, x, (size_t)(T * K) * 4), *yd = put(G, NULL, (size_t)(T * N) * 4);
    pt_status s = C->ops->matmul(C, yc, x, T, &t.w[0], 0);
    CHECK(s == PT_OK, "cpu matmul: %s", pt_last_error());
    s = G->ops->matmul(G, yd, xd, T, &t.w[1], 0);
    if (s == PT_OK) s = G->ops->download(G, yg, yd, (size_t)(T * N) * 4);
    CHECK(s == PT_OK, "cuda matmul: %s", pt_last_error());
    char what[128];
    snprintf(what, sizeof what, "matmul N=%lld K=%lld T=%lld bits=%d gs=%d scales=%s", (long long)N, (long long)K,
             (long long)T, bits, gs, pt_ftype_name(st));
    /* bf16 weights (dequantized and rounded) and bf16 outputs */
    int ok = s == PT_OK && compare(what, yg, yc, T * N, 1e-2, 1e-2);
    G->ops->dealloc(G, xd);
    G->ops->dealloc(G, yd);
    wt_free(&t, a);
    free(x), free(yc), free(yg);
    return ok;
}

static void test_prefill_matmul(void) {
    NEED_GPU();
    static const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            if (!run_matmul(67 + 16 * gi, 256 + 128 * gi, 65 + 40 * gi, bits[bi], gss[gi], PT_FT_BF16)) return;
    if (!run_matmul(96, 512, 80, 4, 64, PT_FT_F16)) return;  /* non-bf16 scales */
    if (!run_matmul(96, 512, 80, 8, 32, PT_FT_F32)) return;
    /* more rows than one tile of 32M bf16 values holds at K = 4096: two chunks */
    if (!run_matmul(9000, 4096, 66, 4, 64, PT_FT_BF16)) return;
    REPORT();
}

/* moe_ffn at T rows (T >= 257: the grouped path) against the CPU. */
static int run_moe(int64_t T, int E, int k, int64_t H, int64_t I, int bits, int fused, int bad) {
    const int a = 1;
    pt_backend *G = G_[a], *C = C_[a];
    const int64_t B = T * k;
    float *logits = malloc((size_t)(T * E) * 4), *wc = malloc((size_t)B * 4);
    int32_t *ic = malloc((size_t)B * 4);
    fill_act(logits, T * E, -2, 2, a);
    pt_moe_route rc = {E, k, 1, NULL};
    CHECK(C->ops->moe_route(C, ic, wc, logits, T, &rc) == PT_OK, "cpu route: %s", pt_last_error());
    if (bad) ic[B / 2] = E + 90;
    float *wd = put(G, wc, (size_t)B * 4);
    int32_t *idd = put(G, ic, (size_t)B * 4);
    wt2 g, u, d;
    int ok = wt_make(&g, a, E, fused ? 2 * I : I, H, bits, 64, PT_FT_BF16);
    if (ok && !fused) ok = wt_make(&u, a, E, I, H, bits, 32, PT_FT_BF16);
    if (ok) ok = wt_make(&d, a, E, H, I, bits, 32, PT_FT_BF16);
    float *x = malloc((size_t)(T * H) * 4), *yc = malloc((size_t)(T * H) * 4), *yg = malloc((size_t)(T * H) * 4);
    fill_act(x, T * H, -1, 1, a);
    float *xd = put(G, x, (size_t)(T * H) * 4), *yd = put(G, NULL, (size_t)(T * H) * 4);
    if (ok) {
        pt_status s = G->ops->moe_ffn(G, yd, xd, T, idd, wd, k, &g.w[1], fused ? NULL : &u.w[1], &d.w[1], PT_GLU_SILU);
        if (s == PT_OK) s = G->ops->download(G, yg, yd, (size_t)(T * H) * 4);
        if (bad) {
            CHECK(s == PT_ERR_RANGE && strstr(pt_last_error(), "outside"), "bad expert: %s %s", pt_status_name(s),
                  pt_last_error());
            ok = s == PT_ERR_RANGE;
        } else {
            CHECK(s == PT_OK, "cuda moe_ffn: %s", pt_last_error());
            s = C->ops->moe_ffn(C, yc, x, T, ic, wc, k, &g.w[0], fused ? NULL : &u.w[0], &d.w[0], PT_GLU_SILU);
            CHECK(s == PT_OK, "cpu moe_ffn: %s", pt_last_error());
            char what[96];
            snprintf(what, sizeof what, "moe_ffn T=%lld E=%d k=%d bits=%d fused=%d", (long long)T, E, k, bits, fused);
            ok = s == PT_OK && compare(what, yg, yc, T * H, 2e-2, 2e-2);
        }
    }
    wt_free(&g, a), wt_free(&d, a);
    if (!fused) wt_free(&u, a);
    G->ops->dealloc(G, xd), G->ops->dealloc(G, yd), G->ops->dealloc(G, wd), G->ops->dealloc(G, idd);
    free(logits), free(wc), free(ic), free(x), free(yc), free(yg);
    return ok;
}

static void test_prefill_moe(void) {
    NEED_GPU();
    pt_backend_limits lim = {.max_tokens = 512, .max_cols = 4096, .max_ffn = 128, .max_top_k = 4};
    REQUIRE(G_[1]->ops->reserve(G_[1], &lim) == PT_OK && C_[1]->ops->reserve(C_[1], &lim) == PT_OK, "reserve: %s",
            pt_last_error());
    if (!run_moe(300, 8, 2, 256, 96, 4, 0, 0)) return;   /* grouped, quantized, gate and up */
    if (!run_moe(300, 8, 2, 256, 96, 4, 1, 0)) return;   /* fused gate|up */
    if (!run_moe(301, 16, 4, 256, 128, 8, 0, 0)) return; /* 8-bit, some experts with few rows */
    if (!run_moe(260, 5, 2, 128, 64, 0, 0, 0)) return;   /* dense bf16 experts (the tensor-core kernel reads them) */
    if (!run_moe(500, 4, 2, 256, 128, 0, 1, 0)) return;  /* dense, fused gate|up, two tiles of rows per expert */
    if (!run_moe(300, 8, 2, 256, 96, 0, 0, 0)) return;   /* dense, down's K = 96: gate/up on the kernel, down on cuBLAS */
    if (!run_moe(100, 8, 2, 256, 96, 4, 0, 0)) return;   /* below the threshold: the per-item GEMV */
    if (!run_moe(300, 8, 2, 256, 96, 4, 0, 1)) return;   /* an expert index outside the stack */
    REPORT();
}

int main(void) {
    TEST_RUN(test_prefill_matmul);
    TEST_RUN(test_prefill_moe);
    teardown();
    return test_summary();
}
