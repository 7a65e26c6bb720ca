/* The 8-bit decode kernel with x as integer pieces (qdot_xint_avx512.c,
 * pt_cpu_qdot8_x4_xint[s], the same PETREL_CPU_XINT lever as the 4-bit
 * kernel): the preparation's refusals (K % 128, group size, NaN, infinity,
 * a value that is not bf16); exact integer sums where x, scales and sums are
 * exact; against a double-precision reference within the documented bound
 * (x rounded by at most 2^-21·max|x_g| per value, plus f32 rounding) for
 * wide dynamic ranges, zero groups and subnormals, groups 32/64/128, with the
 * extreme codes 0 and 255; the f32- and bf16-parameter variants
 * bit-identical; and through the backend: the lever on against off (the f32
 * kernel qdot8_x4) within one bf16 ulp, matmul_rows batch invariance when a
 * token that is not exactly bf16 (the f32 kernel) shares the batch, and 1 and
 * 2 threads bit-identical. Skipped without AVX-512 VNNI. */
#include "test.h"
#include "test_rand.h"
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
    xint_check_refusals(pt_cpu_arrange_xint8, x);
}

/* Integer x (|x| <= 31, the extremes present), codes 0..255 (0 and 255
 * included), scales 1 or 2, integer biases: every product and partial sum
 * is an integer below 2^24, and every int32 block sum converts exactly (its
 * low bits are the zeros of x's scaling), so the result must be exact. */
static void test_exact_integers(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    static const int gss[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++)
        for (int64_t K = 128; K <= 512; K *= 2) {
            int gs = gss[gi];
            int64_t ng = K / gs;
            float *x = malloc(sizeof(float) * (size_t)K);
            uint8_t *codes[4];
            uint16_t *sc[4], *bi[4];
            for (int64_t j = 0; j < K; j++) x[j] = (float)((int)(ru32() % 63) - 31);
            x[0] = -31.0f, x[gs + 1] = 31.0f, x[K - 1] = 0.0f;
            for (int r = 0; r < 4; r++) {
                codes[r] = malloc((size_t)K);
                sc[r] = malloc(2 * (size_t)ng), bi[r] = malloc(2 * (size_t)ng);
                for (int64_t j = 0; j < K; j++) codes[r][j] = (uint8_t)ru32();
                codes[r][1] = 255, codes[r][2] = 0;
                for (int64_t g = 0; g < ng; g++) {
                    sc[r][g] = pt_f32_to_bf16((float)(1 + ru32() % 2));
                    bi[r][g] = pt_f32_to_bf16((float)((int)(ru32() % 9) - 4));
                }
            }
            float out[4];
            REQUIRE(xint_run(&xint_kernel8, out, x, (const uint8_t *const *)codes, (const uint16_t *const *)sc,
                              (const uint16_t *const *)bi, K, gs),
                    "refused integer x");
            for (int r = 0; r < 4; r++) {
                double ref = 0;
                for (int64_t j = 0; j < K; j++)
                    ref += ((double)pt_bf16_to_f32(sc[r][j / gs]) * codes[r][j] + pt_bf16_to_f32(bi[r][j / gs])) * x[j];
                CHECK(out[r] == (float)ref, "gs %d K %lld row %d: %.9g vs exact %.9g", gs, (long long)K, r, out[r], ref);
            }
            for (int r = 0; r < 4; r++) free(codes[r]), free(sc[r]), free(bi[r]);
            free(x);
        }
}

/* Random weights (and all-255 rows: the int32 sums at their largest); x of
 * several shapes; against double with the bound. */
static void test_bound(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    static const int gss[3] = {32, 64, 128};
    for (int kind = 0; kind < 5; kind++)
        for (int gi = 0; gi < 3; gi++) {
            int gs = gss[gi];
            int64_t K = 2688, ng = K / gs; /* past the kernel's 2048-value blocks of scale·step, with a tail */
            float *x = malloc(sizeof(float) * (size_t)K);
            for (int64_t j = 0; j < K; j++) {
                float v;
                if (kind == 0) v = rf(-2, 2); /* ordinary activations */
                else if (kind == 1) /* 50 octaves in every group, some zeros */
                    v = (ru32() % 8 == 0) ? 0.0f : ldexpf(rf(1, 2), (int)(ru32() % 50) - 40) * (ru32() % 2 ? 1 : -1);
                else if (kind == 2) v = j / gs == 3 ? 0.0f : rf(-100, 100); /* a group of zeros */
                else if (kind == 3) v = ldexpf(rf(-1, 1), -130);          /* subnormals (bf16 keeps some bits) */
                else v = (j % 4 == 0) ? -1.0f : -0.9921875f; /* all near -max: |Σ q·X| at its bound with q = 255 */
                x[j] = pt_round_bf16(v);
            }
            rand_qweight q;
            rand_qweight_make(&q, 4, K, 8, gs, 0, 0);
            if (kind == 4) memset(q.codes, 255, (size_t)(4 * K));
            const uint8_t *codes[4];
            const uint16_t *sc[4], *bi[4];
            for (int r = 0; r < 4; r++) {
                codes[r] = (const uint8_t *)q.codes + r * K;
                sc[r] = q.sc + r * ng;
                bi[r] = q.bi + r * ng;
            }
            float out[4], xs[128];
            REQUIRE(xint_run(&xint_kernel8, out, x, codes, sc, bi, K, gs), "kind %d gs %d refused", kind, gs);
            xint_group_sums(xs, x, K, gs);
            for (int r = 0; r < 4; r++) {
                double ref = 0, mag = 0, xr = 0;
                for (int64_t g = 0; g < ng; g++) {
                    double s = pt_bf16_to_f32(sc[r][g]), b = pt_bf16_to_f32(bi[r][g]), mx = 0, sq = 0;
                    for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
                        int qv = codes[r][j];
                        ref += s * qv * x[j];
                        mag += fabs(s * qv * x[j]);
                        mx = fmax(mx, fabs(x[j]));
                        sq += fabs(s) * qv;
                    }
                    ref += b * xs[g];
                    mag += fabs(b * xs[g]);
                    /* x's rounding: at most 2^-21·max|x_g| per value, and 2^-121 where the step is held at
                     * 2^-120 (a group whose max is under 2^-100; arrange() in qdot_xint_avx512.c) */
                    xr += fmax(ldexp(mx, -21), ldexp(1.0, -121)) * sq;
                }
                double err = fabs(out[r] - ref), tol = xr + 8e-6 * mag + 1e-37;
                CHECK(err <= tol, "kind %d gs %d row %d: %.9g vs %.9g (err %.3g, bound %.3g)", kind, gs, r, out[r], ref,
                      err, tol);
            }
            rand_qweight_free(&q);
            free(x);
        }
}

/* Through the backend, groups 32/64/128: the lever on against off (the f32
 * kernel) within one bf16 ulp; a bf16 token's row unchanged when a non-bf16
 * token joins its matmul_rows batch; 1 and 2 threads bit-identical; and the
 * path counters: the lever's tokens went through the integer-piece kernel. */
static void test_backend(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    enum { N = 37, K = 640, T = 3 };
    static const int gss[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        pt_backend *be = NULL, *be1 = NULL;
        REQUIRE(xint_avx512_backend(&be, 2) && xint_avx512_backend(&be1, 1), "%s", pt_last_error());
        if (!be || !be1) {
            pt_backend_free(&be);
            pt_backend_free(&be1);
            TEST_SKIP("backend ISA is not avx512");
        }
        rand_qweight q;
        rand_qweight_make(&q, N, K, 8, gss[gi], 1, 0);
        REQUIRE(be->ops->prepare_weight(be, &q.w, "w") == PT_OK, "%s", pt_last_error());
        pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
        REQUIRE(be->ops->reserve(be, &lim) == PT_OK && be1->ops->reserve(be1, &lim) == PT_OK, "%s", pt_last_error());
        float x[T * K], y1[T * N], y0[T * N], yb[T * N], yt[T * N];
        fill_act(x, T * K, -3, 3, 1);
        int saved = pt_cpu_lever.xint;
        pt_cpu_lever.xint = 1;
        long c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XINT8]);
        REQUIRE(be->ops->matmul_rows(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XINT8]) - c0 == T, "gs %d: %ld of %d tokens on the kernel",
              gss[gi], atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XINT8]) - c0, T);
        REQUIRE(be1->ops->matmul_rows(be1, yt, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(y1, yt, sizeof yt) == 0, "gs %d: 1 and 2 threads differ", gss[gi]);
        pt_cpu_lever.xint = 0;
        REQUIRE(be->ops->matmul_rows(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        for (int i = 0; i < T * N; i++) /* both round to bf16: at most one bf16 ulp apart */
            CHECK(fabsf(y1[i] - y0[i]) <= ldexpf(fabsf(y0[i]), -7) + 1e-30f, "gs %d y[%d] %g (xint) vs %g (f32 kernel)",
                  gss[gi], i, y1[i], y0[i]);
        pt_cpu_lever.xint = 1;
        x[2 * K + 9] = 0.1234567f; /* token 2 is not bf16: the f32 kernel for it alone */
        REQUIRE(be->ops->matmul_rows(be, yb, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(yb, y1, sizeof(float) * 2 * N) == 0, "gs %d: tokens 0-1 changed when token 2 joined", gss[gi]);
        pt_cpu_lever.xint = 0;
        REQUIRE(be->ops->matmul_rows(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(yb + 2 * N, y0 + 2 * N, sizeof(float) * N) == 0, "gs %d: the non-bf16 token is not the f32 kernel's",
              gss[gi]);
        pt_cpu_lever.xint = saved;
        rand_qweight_free(&q);
        pt_backend_free(&be);
        pt_backend_free(&be1);
    }
}

int main(void) {
    TEST_RUN(test_refusals);
    TEST_RUN(test_exact_integers);
    TEST_RUN(test_bound);
    TEST_RUN(test_backend);
    return test_summary();
}
