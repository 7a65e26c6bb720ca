/* A prefill call's attention on AMX tiles (kernels_avx512.c
 * attn_scores_amx and attn_pv_amx, taken by cpu_attention.c under
 * pt_cpu_lever.attn_amx):
 *  - each score within the f32 bound of the exact sum of its bf16 products
 *    (hd · 2^-24 · Σ|q_d·k_d|), for head dims 32-256, 1-8 heads a group,
 *    1-8 tokens a call, 1-77 keys (single, partial and whole 32-key
 *    blocks), nothing written past n; head dims that are not whole 32-dim
 *    steps, or above 256, not handled;
 *  - a score's bits do not depend on the call's other rows or keys: a row
 *    and key give the same bits among 8 tokens and alone, and with the key
 *    at another place of its block;
 *  - P·V: each sum within the f32 bound of the exact one (n + 1 terms of
 *    2^-24), head dims 64-256, 1-37 rows, 1-600 keys, every lead; a row's
 *    sums the same bits alone and among others, and with the keys before
 *    its own dropped at the same lead;
 *  - the attention op: a prefill call takes both kernels (counted), a decode
 *    step neither; its outputs are the f32 kernels' within a few bf16
 *    rounding steps; one and two threads give the same bits; f32-valued
 *    queries keep the f32 kernels (the tiles would round them).
 * Skipped without AMX-BF16 (or when the OS refuses the tile state). */
#include "test.h"
#include "attn_bf16_case.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


static int have_amx(void) { return test_cpu_avx512_bf16() && pt_cpu_amx_available(); }

/* One case: every score within hd·2^-24 of its terms' magnitudes of the exact sum, nothing written past n */
static void scores_amx_case(const uint16_t *kc, attn_case *c, int hd, int n, int G, int nt) {
    REQUIRE(pt_cpu_kernels_avx512.attn_scores_amx(c->S, c->lds, c->q, c->qs, nt, G, hd, kc, n), "hd %d not handled",
            hd);
    int bad = 0, over = 0;
    double worst = 0;
    for (int u = 0; u < nt; u++)
        for (int g = 0; g < G; g++) {
            const float *qr = c->q + u * c->qs + g * hd;
            const float *row = c->S + (int64_t)(u * G + g) * c->lds;
            for (int j = 0; j < n; j++) {
                double s = 0, a = 0;
                for (int d = 0; d < hd; d++) {
                    const double pr = (double)qr[d] * pt_bf16_to_f32(kc[j * hd + d]);
                    s += pr, a += fabs(pr);
                }
                const double err = fabs(row[j] - s), bound = hd * ldexp(a, -24);
                if (!(err <= bound)) bad++;
                if (a > 0 && err / a > worst) worst = err / a;
            }
            for (int j = n; j < c->lds; j++) over += row[j] != GUARD;
        }
    CHECK(bad == 0 && over == 0,
          "hd %d, G %d, %d tokens, %d keys: %d scores past the bound (worst %.3g of Σ|q·k|), %d written past n", hd, G,
          nt, n, bad, worst, over);
}

static void test_scores_amx_bound(void) {
    if (!have_amx()) TEST_SKIP("no AMX-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->attn_scores_amx != NULL, "the avx512 table has no attn_scores_amx");
    static const int hds[] = {32, 64, 128, 256};
    const int cases = attn_case_each(hds, 4, scores_amx_case);
    CHECK(cases == 240, "ran %d cases", cases);
    float S[4], q[96] = {0};
    uint16_t kc[96] = {0};
    CHECK(!k->attn_scores_amx(S, 4, q, 96, 1, 1, 80, kc, 1), "hd 80 (not whole 32-dim steps) was handled");
    CHECK(!k->attn_scores_amx(S, 4, q, 96, 1, 1, 288, kc, 1), "hd 288 (above 256) was handled");
}

/* The same row and key give the same bits whatever else the call holds */
static void test_scores_amx_independent(void) {
    if (!have_amx()) TEST_SKIP("no AMX-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    enum { hd = 64, G = 4, NT = 8, N = 77, OFF = 7 };
    const int64_t qs = (int64_t)G * hd, lds = N;
    uint16_t *kc = malloc(sizeof(uint16_t) * N * hd);
    float *q = malloc(sizeof(float) * NT * qs), *all = malloc(sizeof(float) * NT * G * lds),
          *one = malloc(sizeof(float) * G * lds), *off = malloc(sizeof(float) * NT * G * lds);
    for (int i = 0; i < N * hd; i++) kc[i] = pt_f32_to_bf16(bfv(-1.0f, 1.0f, i % 3));
    for (int i = 0; i < NT * qs; i++) q[i] = bfv(-2.0f, 2.0f, 0);
    REQUIRE(k->attn_scores_amx(all, lds, q, qs, NT, G, hd, kc, N), "not handled");
    int diff_one = 0, diff_off = 0;
    for (int u = 0; u < NT; u++) {
        REQUIRE(k->attn_scores_amx(one, lds, q + u * qs, qs, 1, G, hd, kc, N), "not handled");
        for (int i = 0; i < G * N; i++) diff_one += memcmp(&one[i], &all[(int64_t)u * G * lds + i], 4) != 0;
    }
    /* the keys from OFF on: each key at another place of its 32-key block */
    REQUIRE(k->attn_scores_amx(off, lds, q, qs, NT, G, hd, kc + OFF * hd, N - OFF), "not handled");
    for (int r = 0; r < NT * G; r++)
        for (int j = 0; j < N - OFF; j++) diff_off += memcmp(&off[r * lds + j], &all[r * lds + OFF + j], 4) != 0;
    CHECK(diff_one == 0, "%d scores differ between a token alone and among %d", diff_one, NT);
    CHECK(diff_off == 0, "%d scores differ with the keys %d places on", diff_off, OFF);
    free(kc), free(q), free(all), free(one), free(off);
}

/* acc += P·V on tiles: within the f32 bound of the exact sums ((n + 1) · 2^-24 · the terms' magnitudes) over
 * head dims 64-256, 1-37 rows and 1-600 keys (chunks of the value pairs, partial steps) and every lead;
 * nothing written past the rows; other head dims and leads not handled */
static void test_pv_amx_bound(void) {
    if (!have_amx()) TEST_SKIP("no AMX-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->attn_pv_amx != NULL, "the avx512 table has no attn_pv_amx");
    static const int hds[] = {64, 128, 256}, Rs[] = {1, 16, 37}, ns[] = {1, 31, 33, 300, 600}, leads[] = {0, 5, 31};
    int cases = 0;
    for (int hi = 0; hi < 3; hi++)
        for (int ni = 0; ni < 5; ni++) {
            const int hd = hds[hi], n = ns[ni];
            uint16_t *v = malloc(sizeof(uint16_t) * (size_t)n * hd);
            for (int64_t i = 0; i < (int64_t)n * hd; i++) v[i] = pt_f32_to_bf16(bfv(-1.0f, 1.0f, (int)(i % 5) - 2));
            for (int ri = 0; ri < 3; ri++)
                for (int li = 0; li < 3; li++) {
                    const int R = Rs[ri], lead = leads[li];
                    const int64_t ldp = n + 3;
                    float *P = malloc(sizeof(float) * (size_t)R * ldp), *acc = malloc(sizeof(float) * (size_t)(R + 1) * hd),
                          *a0 = malloc(sizeof(float) * (size_t)R * hd);
                    for (int64_t i = 0; i < R * ldp; i++) P[i] = bfv(0.0f, 1.0f, -(int)(i % 4));
                    for (int64_t i = 0; i < (int64_t)R * hd; i++) acc[i] = a0[i] = bfv(-1.0f, 1.0f, 0);
                    for (int i = 0; i < hd; i++) acc[(int64_t)R * hd + i] = GUARD;
                    REQUIRE(k->attn_pv_amx(acc, P, ldp, R, hd, v, n, lead), "hd %d not handled", hd);
                    int bad = 0, over = 0;
                    for (int r = 0; r < R; r++)
                        for (int d = 0; d < hd; d++) {
                            double s = a0[(int64_t)r * hd + d], m = fabs(s);
                            for (int j = 0; j < n; j++) {
                                const double t = (double)P[r * ldp + j] * pt_bf16_to_f32(v[(int64_t)j * hd + d]);
                                s += t, m += fabs(t);
                            }
                            if (!(fabs(acc[(int64_t)r * hd + d] - s) <= (n + 1) * ldexp(m, -24))) bad++;
                        }
                    for (int i = 0; i < hd; i++) over += acc[(int64_t)R * hd + i] != GUARD;
                    CHECK(bad == 0 && over == 0, "hd %d, %d rows, %d keys, lead %d: %d sums past the bound, %d written past",
                          hd, R, n, lead, bad, over);
                    free(P), free(acc), free(a0);
                    cases++;
                }
            free(v);
        }
    CHECK(cases == 135, "ran %d cases", cases);
    float acc[96] = {0}, P[4] = {0};
    uint16_t v[96] = {0};
    CHECK(!k->attn_pv_amx(acc, P, 4, 1, 96, v, 1, 0), "hd 96 was handled");
    CHECK(!k->attn_pv_amx(acc, P, 4, 1, 64, v, 1, 32), "lead 32 was handled");
}

/* A row's sums do not depend on the call's other rows, nor on keys before its own that the call holds with zero
 * probabilities when the lead puts each key at the same place */
static void test_pv_amx_independent(void) {
    if (!have_amx()) TEST_SKIP("no AMX-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    enum { hd = 64, R = 20, N = 150, OFF = 37 };
    uint16_t *v = malloc(sizeof(uint16_t) * N * hd);
    float *P = malloc(sizeof(float) * R * N), *all = calloc((size_t)R * hd, sizeof(float)),
          *one = malloc(sizeof(float) * hd), *late = calloc((size_t)R * hd, sizeof(float));
    for (int i = 0; i < N * hd; i++) v[i] = pt_f32_to_bf16(bfv(-1.0f, 1.0f, i % 3));
    for (int i = 0; i < R * N; i++) P[i] = (i % N) < OFF ? 0.0f : bfv(0.0f, 1.0f, -(i % 3));
    REQUIRE(k->attn_pv_amx(all, P, N, R, hd, v, N, 0), "not handled");
    int diff_one = 0, diff_late = 0;
    for (int r = 0; r < R; r++) {
        memset(one, 0, sizeof(float) * hd);
        REQUIRE(k->attn_pv_amx(one, P + r * N, N, 1, hd, v, N, 0), "not handled");
        diff_one += memcmp(one, all + r * hd, sizeof(float) * hd) != 0;
    }
    /* the keys from OFF on alone, key OFF at slot OFF mod 32 of its step as in the whole call */
    REQUIRE(k->attn_pv_amx(late, P + OFF, N, R, hd, v + OFF * hd, N - OFF, OFF % 32), "not handled");
    diff_late = memcmp(late, all, sizeof(float) * R * hd) != 0;
    CHECK(diff_one == 0, "%d of %d rows differ alone and among %d", diff_one, R, R);
    CHECK(!diff_late, "the keys from %d on with lead %d differ from the whole call with zero probabilities before", OFF,
          OFF % 32);
    free(v), free(P), free(all), free(one), free(late);
}

typedef struct {
    pt_backend *be;
    pt_kv_layer kv;
} cache;

/* a backend of `threads` threads with a bf16 cache of cap rows K, V [cap, nkv·hd] */
static void cache_make(cache *c, int threads, int nkv, int hd, int cap, const float *K, const float *V) {
    pt_cpu_params cp = {.n_threads = threads, .act = PT_ACT_BF16};
    REQUIRE(pt_backend_cpu_create(&c->be, &cp) == PT_OK, "backend: %s", pt_last_error());
    c->kv = (pt_kv_layer){.n_kv = nkv, .head_dim = hd, .capacity = cap, .dtype = PT_FT_BF16};
    c->kv.k = calloc((size_t)cap * nkv * hd, 2), c->kv.v = calloc((size_t)cap * nkv * hd, 2);
    int32_t *pos = malloc(sizeof(int32_t) * cap);
    for (int i = 0; i < cap; i++) pos[i] = i;
    CHECK(c->be->ops->kv_append(c->be, &c->kv, K, V, cap, pos) == PT_OK, "append: %s", pt_last_error());
    free(pos);
}

static void cache_free(cache *c) {
    free(c->kv.k), free(c->kv.v);
    pt_backend_free(&c->be);
}

static long amx_calls(void) { return pt_cpu_path_count[PT_CPU_PATH_ATTN_AMX]; }
static long amx_pv_calls(void) { return pt_cpu_path_count[PT_CPU_PATH_ATTN_AMX_PV]; }

static void test_attention_op_amx(void) {
    if (!have_amx()) TEST_SKIP("no AMX-BF16");
    const int saved = pt_cpu_lever.attn_amx, saved_dp = pt_cpu_lever.attn_dp;
    pt_cpu_lever.attn_dp = 0;
    enum { nh = 8, nkv = 2, hd = 64, cap = 150, T = 19 };
    cache c1, c2;
    float *K = malloc(sizeof(float) * cap * nkv * hd), *V = malloc(sizeof(float) * cap * nkv * hd);
    for (int i = 0; i < cap * nkv * hd; i++) K[i] = bfv(-1.0f, 1.0f, 0), V[i] = bfv(-1.0f, 1.0f, 0);
    cache_make(&c1, 1, nkv, hd, cap, K, V);
    cache_make(&c2, 2, nkv, hd, cap, K, V);
    free(K), free(V);
    float *q = malloc(sizeof(float) * T * nh * hd), *on1 = malloc(sizeof(float) * T * nh * hd),
          *on2 = malloc(sizeof(float) * T * nh * hd), *off = malloc(sizeof(float) * T * nh * hd);
    for (int i = 0; i < T * nh * hd; i++) q[i] = bfv(-2.0f, 2.0f, 0);
    int32_t qp[T];
    for (int t = 0; t < T; t++) qp[t] = cap - T + t;
    pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    pt_cpu_lever.attn_amx = 1;
    long a0 = amx_calls(), v0 = amx_pv_calls();
    CHECK(c1.be->ops->attention(c1.be, on1, q, T, qp, &c1.kv, &p) == PT_OK, "lever on: %s", pt_last_error());
    CHECK(amx_calls() > a0 && amx_pv_calls() > v0, "a prefill call did not take the AMX scores and P·V");
    CHECK(c2.be->ops->attention(c2.be, on2, q, T, qp, &c2.kv, &p) == PT_OK, "two threads: %s", pt_last_error());
    CHECK(!memcmp(on1, on2, sizeof(float) * T * nh * hd), "one and two threads differ");
    /* a decode step keeps the f32 kernels */
    a0 = amx_calls(), v0 = amx_pv_calls();
    CHECK(c1.be->ops->attention(c1.be, on2, q, 1, &qp[T - 1], &c1.kv, &p) == PT_OK, "decode: %s", pt_last_error());
    CHECK(amx_calls() == a0 && amx_pv_calls() == v0, "a decode step took the AMX kernels");
    pt_cpu_lever.attn_amx = 0;
    a0 = amx_calls(), v0 = amx_pv_calls();
    CHECK(c1.be->ops->attention(c1.be, off, q, T, qp, &c1.kv, &p) == PT_OK, "lever off: %s", pt_last_error());
    CHECK(amx_calls() == a0 && amx_pv_calls() == v0, "the AMX kernels ran with the lever off");
    /* the same exact products summed in another order: the same bf16 output mostly, never further than a few
     * of its rounding steps */
    int same = 0;
    double dmax = 0, vmax = 0;
    for (int i = 0; i < T * nh * hd; i++) {
        same += memcmp(&on1[i], &off[i], 4) == 0;
        dmax = fmax(dmax, fabs((double)on1[i] - off[i]));
        vmax = fmax(vmax, fabs((double)off[i]));
    }
    CHECK(dmax <= 0.02 * vmax && same > T * nh * hd / 2, "lever on differs by %g (outputs up to %g), %d of %d equal",
          dmax, vmax, same, T * nh * hd);
    /* f32-valued queries keep the f32 kernels: the lever-off bits */
    for (int i = 0; i < T * nh * hd; i++) q[i] = rf(-2.0f, 2.0f);
    CHECK(c1.be->ops->attention(c1.be, off, q, T, qp, &c1.kv, &p) == PT_OK, "f32 queries, off: %s", pt_last_error());
    pt_cpu_lever.attn_amx = 1;
    a0 = amx_calls(), v0 = amx_pv_calls();
    CHECK(c1.be->ops->attention(c1.be, on1, q, T, qp, &c1.kv, &p) == PT_OK, "f32 queries, on: %s", pt_last_error());
    CHECK(amx_calls() == a0 && amx_pv_calls() == v0, "the AMX kernels ran on f32-valued queries");
    CHECK(!memcmp(on1, off, sizeof(float) * T * nh * hd), "f32-valued queries: the lever changed the output");
    pt_cpu_lever.attn_amx = saved;
    pt_cpu_lever.attn_dp = saved_dp;
    free(q), free(on1), free(on2), free(off);
    cache_free(&c1);
    cache_free(&c2);
}

int main(void) {
    TEST_RUN(test_scores_amx_bound);
    TEST_RUN(test_scores_amx_independent);
    TEST_RUN(test_pv_amx_bound);
    TEST_RUN(test_pv_amx_independent);
    TEST_RUN(test_attention_op_amx);
    return test_summary();
}
