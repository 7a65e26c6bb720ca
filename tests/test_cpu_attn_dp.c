/* bf16-mode attention over a bf16 cache on vdpbf16ps (kernels_avx512.c
 * attn_scores_dp / attn_pv_dp, taken by cpu_attention.c under
 * pt_cpu_lever.attn_dp):
 *  - attn_scores_dp gives, bit for bit, one f32 fma chain per score over the
 *    dims in pairs, dim 2i + 1 then 2i from zero (the instruction's order),
 *    for head dims 32-512, 1-8 heads a group, 1-8 tokens a call and the keys
 *    in blocks and partial blocks, writing nothing past n;
 *  - attn_pv_dp continues each output element's chain over the keys in
 *    pairs, key 2i + 1 then 2i, an odd last key after a zero product, for
 *    head dims 64-256 and 1-7 heads (the 4/2/1-head register blocks);
 *  - the attention op with the lever on gives the bits of those chains with
 *    the softmax kernel between them (decode steps of 4 and of 3 heads a KV
 *    head, a long step split across threads, a prefill call), and with it off the
 *    f32 kernels' bits (the lever changes only the order of the f32 sums);
 *    queries that are not bf16 values keep the f32 kernels.
 * Skipped without AVX512-BF16. */
#include "test.h"
#include "attn_bf16_case.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* the instruction's chain: acc += a[1]·b[1], then += a[0]·b[0] (exact products, one rounding each) */
static float pair_step(float acc, float a0, float a1, float b0, float b1) { return fmaf(a0, b0, fmaf(a1, b1, acc)); }

/* One case: the kernel's scores bit for bit the pair chains, nothing written past n */
static void scores_dp_case(const uint16_t *kc, attn_case *c, int hd, int n, int G, int nt) {
    REQUIRE(pt_cpu_kernels_avx512.attn_scores_dp(c->S, c->lds, c->q, c->qs, nt, G, hd, kc, n), "hd %d not handled", hd);
    int bad = 0, over = 0;
    for (int u = 0; u < nt; u++)
        for (int g = 0; g < G; g++) {
            const float *qr = c->q + u * c->qs + g * hd;
            const float *row = c->S + (int64_t)(u * G + g) * c->lds;
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
                for (int d = 0; d < hd; d += 2)
                    s = pair_step(s, qr[d], qr[d + 1], pt_bf16_to_f32(kc[j * hd + d]), pt_bf16_to_f32(kc[j * hd + d + 1]));
                bad += memcmp(&s, &row[j], 4) != 0;
            }
            for (int j = n; j < c->lds; j++) over += row[j] != GUARD;
        }
    CHECK(bad == 0 && over == 0, "hd %d, G %d, %d tokens, %d keys: %d scores differ, %d written past n", hd, G, nt, n,
          bad, over);
}

static void test_scores_dp_bits(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    REQUIRE(pt_cpu_kernels_avx512.attn_scores_dp != NULL, "the avx512 table has no attn_scores_dp");
    static const int hds[] = {32, 64, 128, 256, 512};
    const int cases = attn_case_each(hds, 5, scores_dp_case);
    CHECK(cases == 300, "ran %d cases", cases);
}

static void test_pv_dp_bits(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->attn_pv_dp != NULL, "the avx512 table has no attn_pv_dp");
    static const int hds[] = {64, 128, 256}, Gs[] = {1, 2, 3, 4, 7}, ns[] = {1, 2, 31, 32, 33, 70};
    int cases = 0;
    for (int hi = 0; hi < 3; hi++)
        for (int ni = 0; ni < 6; ni++)
            for (int gi = 0; gi < 5; gi++) {
                const int hd = hds[hi], n = ns[ni], G = Gs[gi];
                const int64_t ldp = n + 3;
                uint16_t *vc = malloc(sizeof(uint16_t) * (size_t)n * hd);
                float *P = malloc(sizeof(float) * (size_t)G * ldp), *out = malloc(sizeof(float) * (size_t)G * hd),
                      *ref = malloc(sizeof(float) * (size_t)G * hd);
                for (int64_t i = 0; i < (int64_t)n * hd; i++) vc[i] = pt_f32_to_bf16(bfv(-1.0f, 1.0f, (int)(i % 5) - 2));
                for (int64_t i = 0; i < (int64_t)G * ldp; i++) P[i] = bfv(0.0f, 1.0f, -(int)(i % 9));
                for (int i = 0; i < G * hd; i++) out[i] = ref[i] = rf(-0.25f, 0.25f);
                REQUIRE(k->attn_pv_dp(out, P, ldp, G, hd, vc, n), "hd %d not handled", hd);
                for (int g = 0; g < G; g++)
                    for (int d = 0; d < hd; d++) {
                        float acc = ref[g * hd + d];
                        for (int j = 0; j < n; j += 2) {
                            const float p1 = j + 1 < n ? P[g * ldp + j + 1] : 0.0f;
                            const float v1 = j + 1 < n ? pt_bf16_to_f32(vc[(j + 1) * hd + d]) : 0.0f;
                            acc = pair_step(acc, P[g * ldp + j], p1, pt_bf16_to_f32(vc[j * hd + d]), v1);
                        }
                        ref[g * hd + d] = acc;
                    }
                int bad = 0;
                for (int i = 0; i < G * hd; i++) bad += memcmp(&out[i], &ref[i], 4) != 0;
                CHECK(bad == 0, "hd %d, G %d, %d keys: %d of %d outputs differ", hd, G, n, bad, G * hd);
                free(vc), free(P), free(out), free(ref);
                cases++;
            }
    CHECK(cases == 90, "ran %d cases", cases);
}

/* The attention op over a bf16 cache in bf16 mode against the chains above,
 * token by token: scores (pairs), the softmax kernel, p·V (pairs), the
 * output rounded to bf16. One KV head of `hd` per case, its G query heads. */
static void op_reference(float *out, const float *q, const uint16_t *K, const uint16_t *V, int T, const int32_t *pos,
                         int nh, int hd, float scale) {
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    for (int t = 0; t < T; t++) {
        const int n = pos[t] + 1;
        float *S = malloc(sizeof(float) * (size_t)n);
        for (int h = 0; h < nh; h++) {
            const float *qr = q + ((int64_t)t * nh + h) * hd;
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
                for (int d = 0; d < hd; d += 2)
                    s = pair_step(s, qr[d], qr[d + 1], pt_bf16_to_f32(K[j * hd + d]), pt_bf16_to_f32(K[j * hd + d + 1]));
                S[j] = s;
            }
            k->softmax_row(S, n, scale, 1);
            for (int d = 0; d < hd; d++) {
                float acc = 0.0f;
                for (int j = 0; j < n; j += 2) {
                    const float p1 = j + 1 < n ? S[j + 1] : 0.0f;
                    const float v1 = j + 1 < n ? pt_bf16_to_f32(V[(j + 1) * hd + d]) : 0.0f;
                    acc = pair_step(acc, S[j], p1, pt_bf16_to_f32(V[j * hd + d]), v1);
                }
                out[((int64_t)t * nh + h) * hd + d] = pt_bf16_to_f32(pt_f32_to_bf16(acc));
            }
        }
        free(S);
    }
}

static void test_attention_op_dp(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    const int saved = pt_cpu_lever.attn_dp, saved_amx = pt_cpu_lever.attn_amx;
    pt_cpu_lever.attn_amx = 0; /* the prefill calls' scores on the pair kernels, not on AMX tiles */
    struct {
        int nh, hd, T, n_ctx, threads;
    } cs[] = {
        {4, 64, 1, 300, 1},   /* a decode step, 4 heads a KV head: the many-row scores */
        {3, 64, 1, 200, 2},   /* 3 heads: the many-row scores on bf16 pairs only */
        {8, 128, 1, 2600, 2}, /* 2600 keys, one KV head, two threads: the split step */
        {4, 64, 9, 40, 2},    /* a prefill call */
        {6, 256, 5, 70, 1},
    };
    int runs = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int nh = cs[ci].nh, hd = cs[ci].hd, T = cs[ci].T, cap = cs[ci].n_ctx;
        pt_backend *be;
        pt_cpu_params cp = {.n_threads = cs[ci].threads, .act = PT_ACT_BF16};
        REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "backend: %s", pt_last_error());
        pt_kv_layer kv = {.n_kv = 1, .head_dim = hd, .capacity = cap, .dtype = PT_FT_BF16};
        kv.k = calloc((size_t)cap * hd, 2), kv.v = calloc((size_t)cap * hd, 2);
        float *K = malloc(sizeof(float) * (size_t)cap * hd), *V = malloc(sizeof(float) * (size_t)cap * hd);
        int32_t *pos = malloc(sizeof(int32_t) * cap);
        for (int64_t i = 0; i < (int64_t)cap * hd; i++) K[i] = bfv(-1.0f, 1.0f, 0), V[i] = bfv(-1.0f, 1.0f, 0);
        for (int i = 0; i < cap; i++) pos[i] = i;
        CHECK(be->ops->kv_append(be, &kv, K, V, cap, pos) == PT_OK, "append: %s", pt_last_error());
        float *q = malloc(sizeof(float) * (size_t)T * nh * hd), *on = malloc(sizeof(float) * (size_t)T * nh * hd),
              *off = malloc(sizeof(float) * (size_t)T * nh * hd), *ref = malloc(sizeof(float) * (size_t)T * nh * hd);
        for (int64_t i = 0; i < (int64_t)T * nh * hd; i++) q[i] = bfv(-2.0f, 2.0f, 0);
        int32_t *qp = malloc(sizeof(int32_t) * T);
        for (int t = 0; t < T; t++) qp[t] = cap - T + t;
        pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
        pt_cpu_lever.attn_dp = 1;
        const long s0 = pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_S], v0 = pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_PV];
        CHECK(be->ops->attention(be, on, q, T, qp, &kv, &p) == PT_OK, "lever on: %s", pt_last_error());
        const long s1 = pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_S], v1 = pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_PV];
        CHECK(s1 > s0 && v1 > v0, "case %zu: the pair kernels did not run (scores %ld, p·V %ld calls)", ci, s1 - s0,
              v1 - v0);
        pt_cpu_lever.attn_dp = 0;
        CHECK(be->ops->attention(be, off, q, T, qp, &kv, &p) == PT_OK, "lever off: %s", pt_last_error());
        CHECK(pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_S] == s1 && pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_PV] == v1,
              "case %zu: the pair kernels ran with the lever off", ci);
        op_reference(ref, q, kv.k, kv.v, T, qp, nh, hd, p.scale);
        int bad = 0, same = 0;
        double dmax = 0, vmax = 0;
        for (int64_t i = 0; i < (int64_t)T * nh * hd; i++) {
            bad += memcmp(&on[i], &ref[i], 4) != 0;
            same += memcmp(&on[i], &off[i], 4) == 0;
            dmax = fmax(dmax, fabs((double)on[i] - off[i]));
            vmax = fmax(vmax, fabs((double)off[i]));
        }
        CHECK(bad == 0, "case %zu (%d heads of %d, %d tokens at %d keys, %d threads): %d of %d outputs not the chains'",
              ci, nh, hd, T, cap, cs[ci].threads, bad, T * nh * hd);
        /* off: the f32 kernels' bits, which differ from the pair chains' only in the sums' order: the same
         * bf16 output mostly, never further than a few of its rounding steps */
        CHECK(dmax <= 0.02 * vmax && same > T * nh * hd / 2,
              "case %zu: lever off differs by %g (outputs up to %g), %d of %d equal", ci, dmax, vmax, same, T * nh * hd);
        runs++;
        free(kv.k), free(kv.v), free(K), free(V), free(pos), free(q), free(on), free(off), free(ref), free(qp);
        pt_backend_free(&be);
    }
    pt_cpu_lever.attn_dp = saved;
    pt_cpu_lever.attn_amx = saved_amx;
    CHECK(runs == 5, "ran %d cases", runs);
}

/* Queries that are not bf16 values keep the f32 kernels (the pair kernels
 * would round them): the lever on gives the lever-off bits and no pair
 * kernel runs. */
static void test_attention_op_dp_needs_bf16_queries(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    const int saved = pt_cpu_lever.attn_dp, nh = 4, hd = 64, cap = 100;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = 1, .act = PT_ACT_BF16};
    REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "backend: %s", pt_last_error());
    pt_kv_layer kv = {.n_kv = 1, .head_dim = hd, .capacity = cap, .dtype = PT_FT_BF16};
    kv.k = calloc((size_t)cap * hd, 2), kv.v = calloc((size_t)cap * hd, 2);
    float *K = malloc(sizeof(float) * cap * hd), *V = malloc(sizeof(float) * cap * hd);
    int32_t *pos = malloc(sizeof(int32_t) * cap);
    for (int i = 0; i < cap * hd; i++) K[i] = bfv(-1.0f, 1.0f, 0), V[i] = bfv(-1.0f, 1.0f, 0);
    for (int i = 0; i < cap; i++) pos[i] = i;
    CHECK(be->ops->kv_append(be, &kv, K, V, cap, pos) == PT_OK, "append: %s", pt_last_error());
    float q[4 * 64], on[4 * 64], off[4 * 64];
    for (int i = 0; i < nh * hd; i++) q[i] = rf(-2.0f, 2.0f); /* f32 values */
    const int32_t qp = cap - 1;
    pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 0.125f};
    pt_cpu_lever.attn_dp = 1;
    const long s0 = pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_S], v0 = pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_PV];
    CHECK(be->ops->attention(be, on, q, 1, &qp, &kv, &p) == PT_OK, "lever on: %s", pt_last_error());
    CHECK(pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_S] == s0 && pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_PV] == v0,
          "the pair kernels ran on f32-valued queries");
    pt_cpu_lever.attn_dp = 0;
    CHECK(be->ops->attention(be, off, q, 1, &qp, &kv, &p) == PT_OK, "lever off: %s", pt_last_error());
    CHECK(!memcmp(on, off, sizeof on), "f32-valued queries: the lever changed the output");
    pt_cpu_lever.attn_dp = saved;
    free(kv.k), free(kv.v), free(K), free(V), free(pos);
    pt_backend_free(&be);
}

int main(void) {
    TEST_RUN(test_scores_dp_bits);
    TEST_RUN(test_pv_dp_bits);
    TEST_RUN(test_attention_op_dp);
    TEST_RUN(test_attention_op_dp_needs_bf16_queries);
    return test_summary();
}
