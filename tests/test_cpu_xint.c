/* The 4-bit decode kernel with x as integer pieces (qdot_xint_avx512.c):
 * the preparation's refusals (K % 128, group size, NaN, infinity, a value
 * that is not bf16); exact integer sums where x, scales and sums are exact
 * (small integers, power-of-two scales, the extreme bf16 significands);
 * against a double-precision reference within the documented bound (x
 * rounded by at most 2^-21·max|x_g| per value, plus f32 rounding) for wide
 * dynamic ranges, zero groups and subnormals, groups 32/64/128; the f32- and
 * bf16-parameter variants bit-identical; and through the backend: the
 * kernel against the bf16 kernel (PETREL_CPU_XINT=0's path) within the same
 * bound, and matmul_rows batch invariance when a token that is not exactly
 * bf16 (the f32 kernel) shares the batch; the prefill GEMM on the same
 * pieces (test_gemm). Skipped without AVX-512 VNNI. */
#include "test.h"
#include "test_rand.h"
#include "xint_cases.h"
#include "xint_check.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/half.h"
#include "petrel.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_refusals(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = pt_round_bf16(rf(-1, 1));
    xint_check_refusals(pt_cpu_arrange_xint, x);
}

/* Integer x (|x| <= 255, largest group values at the extremes of the bf16
 * significand), scales 1 or 2, integer biases: every sum is an exact
 * integer below 2^24, so the result must be exact. */
static void test_exact_integers(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    xint_check_exact(&xint_kernel4, 4, 255);
}

/* Random weights; x of several shapes; against double with the bound. */
static void test_bound(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    xint_check_bound(&xint_kernel4, 4, 2048);
}

/* Through the backend: lever on against off (the bf16 kernel), and a bf16
 * token's row unchanged when a non-bf16 token joins its matmul_rows batch. */
static void test_backend(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    enum { N = 37, K = 512, T = 3 };
    pt_backend *be = NULL;
    REQUIRE(xint_avx512_backend(&be, 2), "%s", pt_last_error());
    if (!be) TEST_SKIP("backend ISA is not avx512");
    rand_qweight q;
    rand_qweight_make(&q, N, K, 4, 64, 1, 0);
    REQUIRE(be->ops->prepare_weight(be, &q.w, "w") == PT_OK, "%s", pt_last_error());
    pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "%s", pt_last_error());
    float x[T * K], y1[T * N], y0[T * N], yb[T * N];
    fill_act(x, T * K, -3, 3, 1);
    int saved = pt_cpu_lever.xint;
    pt_cpu_lever.xint = 1;
    REQUIRE(be->ops->matmul_rows(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
    pt_cpu_lever.xint = 0;
    REQUIRE(be->ops->matmul_rows(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
    for (int i = 0; i < T * N; i++) /* both round to bf16: at most one bf16 ulp apart */
        CHECK(fabsf(y1[i] - y0[i]) <= ldexpf(fabsf(y0[i]), -7) + 1e-30f, "y[%d] %g (xint) vs %g (bf16 kernel)", i, y1[i],
              y0[i]);
    pt_cpu_lever.xint = 1;
    x[2 * K + 9] = 0.1234567f; /* token 2 is not bf16: the f32 kernel for it alone */
    REQUIRE(be->ops->matmul_rows(be, yb, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(memcmp(yb, y1, sizeof(float) * 2 * N) == 0, "tokens 0-1 changed when token 2 joined");
    pt_cpu_lever.xint = saved;
    rand_qweight_free(&q);
    pt_backend_free(&be);
}

/* The prefill GEMM with x as integer pieces (PETREL_CPU_XGEMM): T past the
 * decode path, groups 32/64/128 (a 128-group is summed in two 64-value
 * integer chunks), against double within the bf16 rounding of the output
 * plus the bound; and against the f32 GEMM (lever off) within two bf16
 * ulps. Also a token that is not bf16: the whole call takes the f32 GEMM,
 * bit-identical to the lever off. */
static void test_gemm(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    enum { N = 45, K = 512, T = 11 };
    static const int gss[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        int gs = gss[gi];
        pt_backend *be = NULL;
        REQUIRE(xint_avx512_backend(&be, 2), "%s", pt_last_error());
        if (!be) TEST_SKIP("backend ISA is not avx512");
        rand_qweight q;
        rand_qweight_make(&q, N, K, 4, gs, 1, 0);
        REQUIRE(be->ops->prepare_weight(be, &q.w, "w") == PT_OK, "%s", pt_last_error());
        pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
        REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "%s", pt_last_error());
        static float x[T * K], y1[T * N], y0[T * N];
        for (int64_t i = 0; i < T * K; i++) /* wide ranges in some tokens */
            x[i] = pt_round_bf16(i / K % 3 == 2 ? ldexpf(rf(-1, 1), (int)(ru32() % 30) - 20) : rf(-3, 3));
        int saved = pt_cpu_lever.xgemm;
        int saved_bgemm = pt_cpu_lever.bgemm, saved_amx = pt_cpu_lever.amx; /* the integer-piece GEMM, not a bf16 one */
        pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
        pt_cpu_lever.xgemm = 1;
        REQUIRE(be->ops->matmul(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        pt_cpu_lever.xgemm = 0;
        REQUIRE(be->ops->matmul(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        xint_check_gemm(q.codes, 4, q.sc, q.bi, q.bias, x, y1, y0, T, N, K, gs);
        x[5 * K + 3] = 0.1234567f; /* not bf16: the f32 GEMM for the call */
        pt_cpu_lever.xgemm = 1;
        REQUIRE(be->ops->matmul(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        pt_cpu_lever.xgemm = 0;
        REQUIRE(be->ops->matmul(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(y1, y0, sizeof y1) == 0, "gs %d: a non-bf16 token did not send the call to the f32 GEMM", gs);
        pt_cpu_lever.xgemm = saved;
        pt_cpu_lever.bgemm = saved_bgemm;
        pt_cpu_lever.amx = saved_amx;
        rand_qweight_free(&q);
        pt_backend_free(&be);
    }
}

/* The demo model (4-bit, group 32, bf16: the integer-piece kernels in its
 * own dtype) over a 48-token prompt, logits at every position (prefill
 * GEMM) and 8 decoded tokens, with both levers on against both off:
 * argmax identical wherever the levers-off top-1/top-2 margin exceeds 0.05
 * (the bf16 gate of the parity tier), max |dlogit| printed; and with the
 * levers on, 1 and 2 threads bit-identical. */
static void test_demo_model(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    pt_model_params mp = pt_model_default_params();
    mp.n_threads = 2;
    pt_model *m = NULL;
    REQUIRE(pt_model_load("models/kjv-llama-4bit", &mp, &m) == PT_OK, "%s", pt_last_error());
    enum { P = 48, D = 8 };
    int V = pt_model_vocab_size(m);
    int32_t ids[P + D];
    for (int i = 0; i < P; i++) ids[i] = (int32_t)(3 + (ru32() % (uint32_t)(V - 3)));
    float *lg[2];
    int saved[2] = {pt_cpu_lever.xint, pt_cpu_lever.xgemm};
    int saved_bgemm = pt_cpu_lever.bgemm, saved_amx = pt_cpu_lever.amx; /* the integer-piece GEMM, not a bf16 one */
    pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
    for (int on = 0; on < 2; on++) {
        pt_cpu_lever.xint = pt_cpu_lever.xgemm = on;
        lg[on] = malloc(sizeof(float) * (size_t)V * (P + D));
        pt_session *s = NULL;
        pt_session_params sp = {.n_ctx = P + D + 2};
        REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "%s", pt_last_error());
        REQUIRE(pt_session_eval_logits(s, ids, P, lg[on]) == PT_OK, "%s", pt_last_error());
        for (int i = 0; i < D; i++) { /* decode: the levers-off run's greedy tokens, fed to both */
            const float *l = pt_session_logits(s);
            if (on == 0) {
                int best = 0;
                for (int v = 1; v < V; v++)
                    if (l[v] > l[best]) best = v;
                ids[P + i] = best;
            }
            REQUIRE(pt_session_prompt(s, &ids[P + i], 1) == PT_OK, "%s", pt_last_error());
            memcpy(lg[on] + (size_t)(P + i) * V, pt_session_logits(s), sizeof(float) * (size_t)V);
        }
        pt_session_free(&s);
    }
    pt_cpu_lever.xint = saved[0];
    pt_cpu_lever.xgemm = saved[1];
    double maxd = 0, maxl = 0;
    int gated = 0, agree = 0;
    for (int r = 0; r < P + D; r++) {
        const float *a = lg[0] + (size_t)r * V, *b = lg[1] + (size_t)r * V;
        int ia = 0, ib = 0;
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int v = 0; v < V; v++) {
            maxd = fmax(maxd, fabs(a[v] - b[v]));
            maxl = fmax(maxl, fabs(a[v]));
            if (a[v] > a[ia]) ia = v;
            if (b[v] > b[ib]) ib = v;
            if (a[v] > t1) t2 = t1, t1 = a[v];
            else if (a[v] > t2) t2 = a[v];
        }
        if (t1 - t2 > 0.05f) {
            gated++;
            agree += ia == ib;
        }
    }
    printf("MEASURE xint demo model (levers on vs off): argmax agreement %d/%d where margin > 0.05, max|dlogit| %.4g "
           "of %.4g\n",
           agree, gated, maxd, maxl);
    CHECK(agree == gated, "argmax differs at %d of %d gated positions", gated - agree, gated);
    /* the levers on with one thread: the same bits as with two (the CPU invariant) */
    pt_model_params mp1 = pt_model_default_params();
    mp1.n_threads = 1;
    pt_model *m1 = NULL;
    REQUIRE(pt_model_load("models/kjv-llama-4bit", &mp1, &m1) == PT_OK, "%s", pt_last_error());
    pt_cpu_lever.xint = pt_cpu_lever.xgemm = 1;
    pt_session *s1 = NULL;
    pt_session_params sp1 = {.n_ctx = P + D + 2};
    REQUIRE(pt_session_create(m1, &sp1, &s1) == PT_OK, "%s", pt_last_error());
    REQUIRE(pt_session_eval_logits(s1, ids, P, lg[0]) == PT_OK, "%s", pt_last_error());
    CHECK(memcmp(lg[0], lg[1], sizeof(float) * (size_t)V * P) == 0, "prompt logits: 1 and 2 threads differ");
    for (int i = 0; i < D; i++) {
        REQUIRE(pt_session_prompt(s1, &ids[P + i], 1) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(pt_session_logits(s1), lg[1] + (size_t)(P + i) * V, sizeof(float) * (size_t)V) == 0,
              "decode step %d: 1 and 2 threads differ", i);
    }
    pt_cpu_lever.xint = saved[0];
    pt_cpu_lever.xgemm = saved[1];
    pt_cpu_lever.bgemm = saved_bgemm;
    pt_cpu_lever.amx = saved_amx;
    pt_session_free(&s1);
    pt_model_free(&m1);
    free(lg[0]), free(lg[1]);
    pt_model_free(&m);
}

int main(void) {
    TEST_RUN(test_refusals);
    TEST_RUN(test_exact_integers);
    TEST_RUN(test_bound);
    TEST_RUN(test_backend);
    TEST_RUN(test_gemm);
    TEST_RUN(test_demo_model);
    return test_summary();
}
