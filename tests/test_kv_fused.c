/* The --fused-decode-attn CPU kernel (src/backend/cpu/attn_qkv_fused.c)
 * against the exact quantized attention (cpu_attention.c) on the same cache:
 * contexts of one to several blocks (PT_CPU_FUSED_BLOCK keys), full and sliding windows over a ring
 * that has wrapped, GQA, soft-cap, 4- and 8-bit codes, f32 and bf16
 * activations. Bounds (the kernel computes the same sums in another order and
 * normalizes once at the end): f32 max|Δ| <= 1e-5·max|out|; bf16 (the exact
 * path rounds every probability to bf16 before p·V) max|Δ| <= 2e-2·max|out|.
 * And the fused result is bit-identical for 1, 2 and 3 threads. Every case
 * runs with the backend's best kernels (AVX-512 here: in bf16 mode where
 * pt_cpu_attn_dp_on, the factored vdpbf16ps kernels fused_scores_dp /
 * fused_pv_dp, tests/test_cpu_fused_dp.c; else the quantized attention
 * kernels attn_scores_tq / attn_pv_q on each block) and with the
 * scalar table (rows dequantized for the generic loops), over GQA groups of
 * 1, 2, 4 and 8 heads and head sizes 32-256 (the AVX-512 P·V kernel's 4/2/1-
 * head blocks and 32/64-dim slices). */
#include "test.h"

#include "backend/backend.h"
#include "base/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float rnd(float lo, float hi) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}

typedef struct {
    int bits, gs, window, cap, pos;
    float softcap;
    int nkv, G, hd;
} kcase;

static pt_backend *mk(int nth, pt_act_dtype act, pt_cpu_isa isa) {
    pt_backend *be = NULL;
    pt_cpu_params p = {.n_threads = nth, .act = act, .isa = isa};
    return pt_backend_cpu_create(&be, &p) == PT_OK ? be : NULL;
}

/* Fills a quantized cache with positions 0..c->pos through kv_append, then
 * runs one decode query at c->pos, exact and fused. */
static void run_case(const kcase *c, pt_act_dtype act, pt_cpu_isa isa) {
    const int nkv = c->nkv, G = c->G, hd = c->hd, nh = nkv * G, ng = hd / c->gs;
    pt_backend *be[3] = {mk(1, act, isa), mk(2, act, isa), mk(3, act, isa)};
    REQUIRE(be[0] && be[1] && be[2], "backends");
    pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = c->cap, .bits = c->bits, .group_size = c->gs,
                      .dtype = act == PT_ACT_BF16 ? PT_FT_BF16 : PT_FT_F32};
    size_t es = act == PT_ACT_BF16 ? 2 : 4, rows = (size_t)nkv * c->cap;
    kv.k = malloc(rows * hd * c->bits / 8);
    kv.v = malloc(rows * hd * c->bits / 8);
    kv.k_scales = malloc(rows * ng * es);
    kv.k_biases = malloc(rows * ng * es);
    kv.v_scales = malloc(rows * ng * es);
    kv.v_biases = malloc(rows * ng * es);
    float *k = malloc(sizeof(float) * nkv * hd), *v = malloc(sizeof(float) * nkv * hd);
    float *q = malloc(sizeof(float) * nh * hd), *out[4];
    for (int i = 0; i < 4; i++) out[i] = malloc(sizeof(float) * nh * hd);
    for (int32_t p = 0; p <= c->pos; p++) {
        for (int i = 0; i < nkv * hd; i++) {
            k[i] = rnd(-2, 2);
            v[i] = rnd(-1, 1);
        }
        REQUIRE(be[0]->ops->kv_append(be[0], &kv, k, v, 1, &p) == PT_OK, "append: %s", pt_last_error());
    }
    for (int i = 0; i < nh * hd; i++) q[i] = act == PT_ACT_BF16 ? pt_round_bf16(rnd(-1.5f, 1.5f)) : rnd(-1.5f, 1.5f);
    pt_attn a = {.n_heads = nh, .head_dim = hd, .scale = 0.125f, .softcap = c->softcap, .window = c->window};
    int32_t pos = c->pos;
    REQUIRE(be[1]->ops->attention(be[1], out[0], q, 1, &pos, &kv, &a) == PT_OK, "exact: %s", pt_last_error());
    a.fused_decode = 1;
    for (int t = 0; t < 3; t++)
        REQUIRE(be[t]->ops->attention(be[t], out[1 + t], q, 1, &pos, &kv, &a) == PT_OK, "fused: %s", pt_last_error());
    double md = 0, mo = 0;
    for (int i = 0; i < nh * hd; i++) {
        double d = fabs((double)out[0][i] - out[2][i]);
        if (d > md) md = d;
        if (fabs(out[0][i]) > mo) mo = fabs(out[0][i]);
    }
    double bound = act == PT_ACT_BF16 ? 2e-2 : 1e-5;
    printf("MEASURE fused-decode-attn %s %s %d-bit g%d %dx%d heads of %d window %d ring %d pos %d softcap %g: max|d| "
           "%.3g of max|out| %.3g (ratio %.3g, bound %.0e)\n",
           isa == PT_ISA_SCALAR ? "scalar" : "best-isa", act == PT_ACT_BF16 ? "bf16" : "f32", c->bits, c->gs, nkv, G,
           hd, c->window, c->cap, c->pos, c->softcap, md, mo, md / mo, bound);
    CHECK(md <= bound * mo, "fused vs exact: max|d| %.3g exceeds %.0e x %.3g", md, bound, mo);
    CHECK(!memcmp(out[1], out[2], sizeof(float) * nh * hd) && !memcmp(out[1], out[3], sizeof(float) * nh * hd),
          "fused output depends on the thread count");
    void *bufs[] = {kv.k, kv.v, kv.k_scales, kv.k_biases, kv.v_scales, kv.v_biases, k, v, q,
                    out[0], out[1], out[2], out[3]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (int t = 0; t < 3; t++) pt_backend_free(&be[t]);
}

static void test_fused_vs_exact(void) {
    static const kcase cases[] = {
        {4, 64, 0, 700, 650, 0, 2, 4, 64},     /* 2 blocks, full cache */
        {4, 64, 0, 1700, 1650, 0, 2, 4, 64},   /* 4 blocks */
        {8, 64, 0, 1700, 1650, 0, 1, 8, 128},
        {8, 32, 0, 700, 650, 0, 2, 4, 64},
        {4, 32, 300, 320, 900, 0, 2, 4, 64},   /* sliding window over a wrapped ring */
        {8, 64, 300, 320, 900, 30, 2, 4, 64},  /* with soft-cap */
        {4, 64, 0, 130, 5, 0, 2, 4, 64},       /* one short block */
        {4, 64, 0, 400, 390, 0, 1, 2, 256},    /* gemma-3-4b-like group, 64-lane slices */
        {8, 64, 0, 400, 390, 0, 1, 2, 256},
        {4, 32, 0, 300, 260, 0, 2, 1, 32},     /* 32-wide heads: 32-lane slices */
        {8, 32, 16, 40, 200, 0, 1, 8, 32},     /* 8 heads per KV head */
        {4, 64, 0, 300, 299, 0, 1, 8, 128},
    };
    for (int is = 0; is < 2; is++)
        for (int am = 0; am < 2; am++)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                run_case(&cases[i], am ? PT_ACT_BF16 : PT_ACT_F32, is ? PT_ISA_SCALAR : PT_ISA_AUTO);
                if (test_failed_current) return;
            }
}

int main(void) {
    TEST_RUN(test_fused_vs_exact);
    return test_summary();
}
