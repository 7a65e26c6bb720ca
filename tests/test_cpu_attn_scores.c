/* The AVX-512 attention score kernel of prefill calls (kernels_avx512.c
 * attn_scores_t): each score is one f32 multiply-add chain over the head's
 * dims in order, from
 * zero — compared as bits against that chain written out in C (fmaf) — and
 * so it does not depend on how the keys and queries are cut: keys given as
 * one run or as runs of 1, 15, 31, 33 keys (the 32-key blocks and their
 * partial last block), tokens scored alone or 2..8 at a time (the prefill
 * groups of cpu_attention.c), GQA groups of 1, 2, 4, 6 and 8 heads (the
 * 8/4/2/1-row register blocks), head dims 16..512, bf16 and f32 keys. The
 * kernel must not write past the n keys of a row. Skipped without AVX-512. */
#include "test.h"
#include "test_rand.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int avx512_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* The contract's chain: s = fma(q[d], k[d], s) for d = 0, 1, ... from 0. */
static float chain(const float *q, const void *k, int hd, int bf) {
    float s = 0.0f;
    for (int d = 0; d < hd; d++) {
        const float kd = bf ? pt_bf16_to_f32(((const uint16_t *)k)[d]) : ((const float *)k)[d];
        s = fmaf(q[d], kd, s);
    }
    return s;
}

#define GUARD 1e30f

static void test_scores_chain_and_cuts(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->attn_scores_t != NULL, "the avx512 table has no attn_scores_t");
    static const int hds[] = {16, 64, 128, 256, 512};
    static const int Gs[] = {1, 2, 4, 6, 8};
    static const int runs[] = {0, 1, 15, 31, 33}; /* 0: the whole range in one call */
    const int n = 77, NT = 8, QS_PAD = 3;
    int cases = 0, orders_differ = 0;
    for (int hi = 0; hi < 5; hi++)
        for (int gi = 0; gi < 5; gi++)
            for (int bf = 0; bf < 2; bf++) {
                const int hd = hds[hi], G = Gs[gi];
                const int64_t qs = (int64_t)G * hd + QS_PAD * 16; /* tokens' q rows apart by more than G·hd */
                const int64_t lds = n + 5;
                float *q = malloc(sizeof(float) * (size_t)qs * NT);
                void *kk = malloc((size_t)n * hd * (bf ? 2 : 4));
                float *ref = malloc(sizeof(float) * (size_t)NT * G * n);
                float *S = malloc(sizeof(float) * (size_t)NT * G * lds);
                REQUIRE(q && kk && ref && S, "out of memory");
                /* values spread over octaves with signs, so the order of a sum shows in its bits */
                for (int64_t i = 0; i < qs * NT; i++) q[i] = ldexpf(rf(-0.5f, 0.5f), (int)(i % 13) - 6);
                for (int64_t i = 0; i < (int64_t)n * hd; i++) {
                    const float v = ldexpf(rf(-0.5f, 0.5f), (int)(i % 11) - 5);
                    if (bf) ((uint16_t *)kk)[i] = pt_f32_to_bf16(v);
                    else ((float *)kk)[i] = v;
                }
                const size_t es = bf ? 2 : 4;
                for (int u = 0; u < NT; u++)
                    for (int g = 0; g < G; g++)
                        for (int j = 0; j < n; j++) {
                            const float *qg = q + u * qs + g * hd;
                            const void *kj = (const char *)kk + (size_t)j * hd * es;
                            ref[(u * G + g) * n + j] = chain(qg, kj, hd, bf);
                            /* the pairwise order would round differently somewhere: the test can tell orders */
                            if (u == 0 && g == 0) {
                                float a = 0.f, b = 0.f;
                                for (int d = 0; d < hd; d += 2) {
                                    const float k0 = bf ? pt_bf16_to_f32(((const uint16_t *)kj)[d]) : ((const float *)kj)[d];
                                    const float k1 = bf ? pt_bf16_to_f32(((const uint16_t *)kj)[d + 1]) : ((const float *)kj)[d + 1];
                                    a = fmaf(qg[d], k0, a), b = fmaf(qg[d + 1], k1, b);
                                }
                                orders_differ += (a + b) != ref[g * n + j];
                            }
                        }
                for (int nt = 1; nt <= NT; nt++)
                    for (int ri = 0; ri < 5; ri++) {
                        for (int64_t i = 0; i < (int64_t)NT * G * lds; i++) S[i] = GUARD;
                        const int step = runs[ri] ? runs[ri] : n;
                        /* tokens in calls of nt: tokens [u0, u0 + nt) */
                        for (int u0 = 0; u0 < NT; u0 += nt) {
                            const int m = NT - u0 < nt ? NT - u0 : nt;
                            for (int j0 = 0; j0 < n; j0 += step) {
                                const int len = n - j0 < step ? n - j0 : step;
                                const int ok = k->attn_scores_t(S + (int64_t)u0 * G * lds + j0, lds, q + u0 * qs, qs, m,
                                                              G, hd, (const char *)kk + (size_t)j0 * hd * es, len, bf);
                                CHECK(ok, "hd %d: not handled", hd);
                            }
                        }
                        int bad = 0, outside = 0;
                        for (int row = 0; row < NT * G; row++) {
                            for (int j = 0; j < n; j++) {
                                const float a = ref[row * n + j], b = S[(int64_t)row * lds + j];
                                bad += memcmp(&a, &b, 4) != 0;
                            }
                            for (int j = n; j < lds; j++) outside += S[(int64_t)row * lds + j] != GUARD;
                        }
                        CHECK(bad == 0, "hd %d, G %d, bf %d, nt %d, runs %d: %d scores differ from the chain", hd, G,
                              bf, nt, step, bad);
                        CHECK(outside == 0, "hd %d, G %d, nt %d, runs %d: %d values written past n", hd, G, nt, step,
                              outside);
                        cases++;
                    }
                free(q), free(kk), free(ref), free(S);
            }
    CHECK(cases == 5 * 5 * 2 * 8 * 5, "ran %d cases", cases);
    CHECK(orders_differ > 100, "only %d scores tell the chain from a pairwise order", orders_differ);
}

/* Shapes the kernel leaves to the generic loops: a head dim not a multiple
 * of 16, or above 512. */
static void test_scores_refused(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    float q[1040] = {0}, S[4] = {GUARD, GUARD, GUARD, GUARD};
    uint16_t kk[1040] = {0};
    CHECK(k->attn_scores_t(S, 4, q, 24, 1, 1, 24, kk, 2, 1) == 0, "head dim 24 handled");
    CHECK(k->attn_scores_t(S, 4, q, 528, 1, 1, 528, kk, 1, 1) == 0, "head dim 528 handled");
    CHECK(S[0] == GUARD && S[1] == GUARD, "a refused call wrote scores");
}

int main(void) {
    TEST_RUN(test_scores_chain_and_cuts);
    TEST_RUN(test_scores_refused);
    return test_summary();
}
