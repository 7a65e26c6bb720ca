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
 * 2 threads bit-identical; and the prefill GEMM on the same pieces
 * (PETREL_CPU_XGEMM8, test_gemm8). Skipped without AVX-512 VNNI. */
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
    xint_check_refusals(pt_cpu_arrange_xint8, x);
}

/* Integer x (|x| <= 31, the extremes present), codes 0..255 (0 and 255
 * included), scales 1 or 2, integer biases: every product and partial sum
 * is an integer below 2^24, and every int32 block sum converts exactly (its
 * low bits are the zeros of x's scaling), so the result must be exact. */
static void test_exact_integers(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    xint_check_exact(&xint_kernel8, 8, 31);
}

/* Random weights (and all-255 rows: the int32 sums at their largest); x of
 * several shapes; against double with the bound. */
static void test_bound(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    xint_check_bound(&xint_kernel8, 8, 2688); /* past the kernel's 2048-value blocks of scale·step, with a tail */
}

/* Two avx512 backends (2 threads and 1) and an 8-bit random weight of
 * N x K, groups gs, rows [0, n255) every code 255, prepared on the first;
 * both reserved for T tokens of K. 1: ready; 0: the backend ISA is not
 * avx512 (nothing held); -1: an error (message set, nothing held). */
typedef struct {
    pt_backend *be, *be1;
    rand_qweight q;
} xb_pair;

static int xb_open(xb_pair *p, int N, int K, int T, int gs, int n255) {
    p->be = p->be1 = NULL;
    int ok = xint_avx512_backend(&p->be, 2) && xint_avx512_backend(&p->be1, 1);
    if (!ok || !p->be || !p->be1) {
        pt_backend_free(&p->be);
        pt_backend_free(&p->be1);
        return ok ? 0 : -1;
    }
    rand_qweight_make(&p->q, N, K, 8, gs, 1, 0);
    for (int n = 0; n < n255; n++) memset(p->q.codes + (size_t)n * K, 255, K);
    pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
    if (p->be->ops->prepare_weight(p->be, &p->q.w, "w") == PT_OK && p->be->ops->reserve(p->be, &lim) == PT_OK &&
        p->be1->ops->reserve(p->be1, &lim) == PT_OK)
        return 1;
    rand_qweight_free(&p->q);
    pt_backend_free(&p->be);
    pt_backend_free(&p->be1);
    return -1;
}

static void xb_close(xb_pair *p) {
    rand_qweight_free(&p->q);
    pt_backend_free(&p->be);
    pt_backend_free(&p->be1);
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
        xb_pair p;
        const int r = xb_open(&p, N, K, T, gss[gi], 0);
        REQUIRE(r >= 0, "%s", pt_last_error());
        if (r == 0) TEST_SKIP("backend ISA is not avx512");
        pt_backend *be = p.be, *be1 = p.be1;
        const rand_qweight q = p.q;
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
        xb_close(&p);
    }
}

/* The prefill GEMM of 8-bit weights on the same pieces (PETREL_CPU_XGEMM8,
 * tile8x3q8 in gemm_i8_avx512.c), groups 32/64/128, T past the decode path:
 * against double within the bf16 rounding of the output plus the bound
 * (rows of all-255 codes against tokens at the largest |X| in some groups:
 * the per-piece int32 sums at their limit); against the f32 GEMM (lever
 * off) within two bf16 ulps; a call of fewer tokens (other tiles) and 1 vs
 * 2 threads bit-identical; the path counter; and a token that is not bf16:
 * the call takes the f32 GEMM, bit-identical to the lever off. */
static void test_gemm8(void) {
    if (!xint_available()) TEST_SKIP("no AVX-512 VNNI");
    enum { N = 45, K = 640, T = 11, T2 = 5 };
    static const int gss[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        int gs = gss[gi];
        xb_pair p;
        const int r = xb_open(&p, N, K, T, gs, 3); /* rows 0-2: every code 255 */
        REQUIRE(r >= 0, "%s", pt_last_error());
        if (r == 0) TEST_SKIP("backend ISA is not avx512");
        pt_backend *be = p.be, *be1 = p.be1;
        const rand_qweight q = p.q;
        static float x[T * K], y1[T * N], y0[T * N], y2[T * N];
        for (int64_t i = 0; i < T * K; i++) {
            int t = (int)(i / K);
            float v = t % 3 == 2 ? ldexpf(rf(-1, 1), (int)(ru32() % 30) - 20) : rf(-3, 3); /* wide ranges */
            if (t % 4 == 1) v = (i / gs) % 2 ? 1.9921875f : -1.9921875f; /* |X| at its largest, both signs */
            x[i] = pt_round_bf16(v);
        }
        int saved = pt_cpu_lever.xgemm8;
        int saved_bgemm = pt_cpu_lever.bgemm, saved_amx = pt_cpu_lever.amx; /* the integer-piece GEMM, not a bf16 one */
        pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
        pt_cpu_lever.xgemm8 = 1;
        long c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XGEMM8]);
        REQUIRE(be->ops->matmul(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XGEMM8]) - c0 == 1, "gs %d: the call missed the 8-bit GEMM", gs);
        REQUIRE(be1->ops->matmul(be1, y2, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(y1, y2, sizeof y1) == 0, "gs %d: 1 and 2 threads differ", gs);
        REQUIRE(be->ops->matmul(be, y2, x + (T - T2) * K, T2, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(y1 + (T - T2) * N, y2, sizeof(float) * T2 * N) == 0, "gs %d: the last %d tokens changed alone",
              gs, T2);
        pt_cpu_lever.xgemm8 = 0;
        REQUIRE(be->ops->matmul(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        xint_check_gemm(q.codes, 8, q.sc, q.bi, q.bias, x, y1, y0, T, N, K, gs);
        x[5 * K + 3] = 0.1234567f; /* not bf16: the f32 GEMM for the call */
        pt_cpu_lever.xgemm8 = 1;
        c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XGEMM8]);
        REQUIRE(be->ops->matmul(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XGEMM8]) == c0, "gs %d: a non-bf16 call counted", gs);
        pt_cpu_lever.xgemm8 = 0;
        REQUIRE(be->ops->matmul(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(y1, y0, sizeof y1) == 0, "gs %d: a non-bf16 token did not send the call to the f32 GEMM", gs);
        pt_cpu_lever.xgemm8 = saved;
        pt_cpu_lever.bgemm = saved_bgemm;
        pt_cpu_lever.amx = saved_amx;
        xb_close(&p);
    }
}

int main(void) {
    TEST_RUN(test_refusals);
    TEST_RUN(test_exact_integers);
    TEST_RUN(test_bound);
    TEST_RUN(test_backend);
    TEST_RUN(test_gemm8);
    return test_summary();
}
