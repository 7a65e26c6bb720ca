/* The bf16 prefill GEMM for 4- and 8-bit weights (gemm_bf16_avx512.c,
 * PETREL_CPU_BGEMM): x's conversion and its refusals (a value that is not
 * bf16, infinity, NaN, a subnormal; zero and -0 taken); through the backend
 * for both bit widths and groups 32/64/128, T past the decode path, rows not
 * a multiple of the 32-row panel, against double precision within the
 * output's bf16 rounding and against the f32 GEMM within two bf16 ulps
 * (xint_check_gemm); a call's first tokens bit-identical to the same tokens
 * alone (tiles never mix tokens), 1 and 2 threads bit-identical; a token that
 * is not bf16 sends the whole call to the f32 GEMM, bit-identical to the
 * lever off; and the path counter. The same for the AMX form
 * (PETREL_CPU_AMX) with blocks of 32 tokens, partial and whole, where the CPU
 * has AMX-BF16; and dense bf16 weights on both forms (test_dense). Skipped
 * without AVX-512 BF16 (AMX: without AMX). */
#include "test.h"
#include "test_rand.h"
#include "xint_check.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/half.h"
#include "petrel.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_x_conversion(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX-512 BF16");
    enum { K = 45 }; /* two 16-value vectors and a scalar tail */
    float x[K];
    uint16_t xb[K];
    for (int i = 0; i < K; i++) x[i] = pt_round_bf16(rf(-100, 100));
    x[3] = 0.0f;
    x[40] = -0.0f;
    x[7] = ldexpf(1.0f, -126); /* the smallest normal */
    CHECK(pt_cpu_x_bf16_exact(xb, x, K), "plain bf16 values refused");
    int same = 1;
    for (int i = 0; i < K; i++) same &= pt_bf16_to_f32(xb[i]) == x[i] && (xb[i] >> 15) == (signbit(x[i]) != 0);
    CHECK(same, "converted values differ from x");
    static const int at[2] = {5, 42}; /* in a vector, in the tail */
    for (int a = 0; a < 2; a++) {
        int i = at[a];
        float keep = x[i];
        x[i] = 0.1234567f;
        CHECK(!pt_cpu_x_bf16_exact(xb, x, K), "a value that is not bf16 taken (index %d)", i);
        x[i] = INFINITY;
        CHECK(!pt_cpu_x_bf16_exact(xb, x, K), "infinity taken (index %d)", i);
        x[i] = -NAN;
        CHECK(!pt_cpu_x_bf16_exact(xb, x, K), "NaN taken (index %d)", i);
        x[i] = pt_bf16_to_f32(0x0001); /* a bf16 subnormal: vdpbf16ps would read zero */
        CHECK(!pt_cpu_x_bf16_exact(xb, x, K), "a subnormal taken (index %d)", i);
        x[i] = keep;
    }
    CHECK(pt_cpu_x_bf16_exact(xb, x, K), "restored values refused");
}

/* One GEMM (amx 0: the AVX-512 bf16 GEMM, 1: its AMX form) over T tokens
 * (T0 of them first alone), both bit widths × groups 32/64/128. */
static void check_gemm(int amx, int T, int T0) {
    enum { N = 45, K = 512 };
    static const int gss[3] = {32, 64, 128};
    int path = amx ? PT_CPU_PATH_AMX : PT_CPU_PATH_BGEMM;
    const char *nm = amx ? "amx" : "bgemm";
    int saved[5] = {pt_cpu_lever.bgemm, pt_cpu_lever.xgemm, pt_cpu_lever.xgemm8, pt_cpu_lever.xint, pt_cpu_lever.amx};
    float *x = malloc(sizeof(float) * (size_t)T * K), *y1 = malloc(sizeof(float) * (size_t)T * N),
          *y0 = malloc(sizeof(float) * (size_t)T * N), *ya = malloc(sizeof(float) * (size_t)T * N);
    for (int bits = 4; bits <= 8; bits += 4)
        for (int gi = 0; gi < 3; gi++) {
            int gs = gss[gi];
            pt_backend *be = NULL, *be1 = NULL;
            REQUIRE(xint_avx512_backend(&be, 2) && xint_avx512_backend(&be1, 1), "%s", pt_last_error());
            if (!be || !be1) {
                pt_backend_free(&be);
                pt_backend_free(&be1);
                TEST_SKIP("backend ISA is not avx512");
            }
            rand_qweight q;
            rand_qweight_make(&q, N, K, bits, gs, 1, 0);
            pt_matrix w1 = q.w;
            REQUIRE(be->ops->prepare_weight(be, &q.w, "w") == PT_OK, "%s", pt_last_error());
            REQUIRE(be1->ops->prepare_weight(be1, &w1, "w") == PT_OK, "%s", pt_last_error());
            pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
            REQUIRE(be->ops->reserve(be, &lim) == PT_OK && be1->ops->reserve(be1, &lim) == PT_OK, "%s",
                    pt_last_error());
            for (int64_t i = 0; i < (int64_t)T * K; i++) /* wide ranges in some tokens */
                x[i] = pt_round_bf16(i / K % 3 == 2 ? ldexpf(rf(-1, 1), (int)(ru32() % 30) - 20) : rf(-3, 3));
            pt_cpu_lever.xgemm = pt_cpu_lever.xgemm8 = 0; /* off: the f32 GEMM */
            pt_cpu_lever.bgemm = !amx;
            pt_cpu_lever.amx = amx;
            long c0 = atomic_load(&pt_cpu_path_count[path]);
            REQUIRE(be->ops->matmul(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
            CHECK(atomic_load(&pt_cpu_path_count[path]) == c0 + 1, "%s bits %d gs %d: the GEMM did not run", nm, bits,
                  gs);
            pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
            REQUIRE(be->ops->matmul(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
            xint_check_gemm(q.codes, bits, q.sc, q.bi, q.bias, x, y1, y0, T, N, K, gs);
            /* the first T0 tokens alone, and one thread */
            pt_cpu_lever.bgemm = !amx;
            pt_cpu_lever.amx = amx;
            REQUIRE(be->ops->matmul(be, ya, x, T0, &q.w, 0) == PT_OK, "%s", pt_last_error());
            CHECK(memcmp(ya, y1, sizeof(float) * (size_t)T0 * N) == 0, "%s bits %d gs %d: tokens 0-%d differ alone and among %d",
                  nm, bits, gs, T0 - 1, T);
            REQUIRE(be1->ops->matmul(be1, ya, x, T, &w1, 0) == PT_OK, "%s", pt_last_error());
            CHECK(memcmp(ya, y1, sizeof(float) * (size_t)T * N) == 0, "%s bits %d gs %d: 1 and 2 threads differ", nm,
                  bits, gs);
            /* a token that is not bf16: the whole call on the f32 GEMM */
            x[(T / 2) * K + 3] = 0.1234567f;
            c0 = atomic_load(&pt_cpu_path_count[path]);
            REQUIRE(be->ops->matmul(be, y1, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
            CHECK(atomic_load(&pt_cpu_path_count[path]) == c0, "%s bits %d gs %d: a non-bf16 call counted", nm, bits,
                  gs);
            pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
            REQUIRE(be->ops->matmul(be, y0, x, T, &q.w, 0) == PT_OK, "%s", pt_last_error());
            CHECK(memcmp(y1, y0, sizeof(float) * (size_t)T * N) == 0,
                  "%s bits %d gs %d: a non-bf16 token did not send the call to the f32 GEMM", nm, bits, gs);
            rand_qweight_free(&q);
            pt_backend_free(&be);
            pt_backend_free(&be1);
        }
    free(x), free(y1), free(y0), free(ya);
    pt_cpu_lever.bgemm = saved[0];
    pt_cpu_lever.xgemm = saved[1];
    pt_cpu_lever.xgemm8 = saved[2];
    pt_cpu_lever.xint = saved[3];
    pt_cpu_lever.amx = saved[4];
}

static void test_gemm(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX-512 BF16");
    check_gemm(0, 11, 4);
}

/* Dense bf16 weights on the same GEMM (amx 0: AVX-512, 1: AMX), one group of
 * K with scale 1 and bias 0: against double precision within the output's
 * bf16 rounding (subnormal weights count as zero there, as the instructions
 * read them), against the f32 GEMM within two bf16 ulps; the first T0 tokens
 * alone and one thread bit-identical; a token that is not bf16 sends the call
 * to the f32 GEMM; the path counter. */
static void check_dense(int amx, int T, int T0, int K) {
    enum { N = 45 };
    char nm[40];
    snprintf(nm, sizeof nm, "%s dense K %d", amx ? "amx" : "bgemm", K);
    int saved[2] = {pt_cpu_lever.bgemm, pt_cpu_lever.amx};
    float *x = malloc(sizeof(float) * (size_t)T * K), *y1 = malloc(sizeof(float) * (size_t)T * N),
          *y0 = malloc(sizeof(float) * (size_t)T * N), *ya = malloc(sizeof(float) * (size_t)T * N);
    uint16_t *wd = malloc(sizeof(uint16_t) * (size_t)N * K), bias[N];
    for (int64_t i = 0; i < (int64_t)N * K; i++) wd[i] = pt_f32_to_bf16(rf(-0.2f, 0.2f));
    wd[3] = 0x0001, wd[K + 7] = 0x8003, wd[5 * K + 90] = 0x007f; /* subnormals */
    for (int i = 0; i < N; i++) bias[i] = pt_f32_to_bf16(rf(-1, 1));
    pt_matrix w = {.rows = N, .cols = K, .dtype = PT_FT_BF16, .data = wd, .bias = bias, .bias_dtype = PT_FT_BF16};
    pt_matrix w1 = w;
    pt_backend *be = NULL, *be1 = NULL;
    REQUIRE(xint_avx512_backend(&be, 2) && xint_avx512_backend(&be1, 1), "%s", pt_last_error());
    if (!be || !be1) {
        pt_backend_free(&be);
        pt_backend_free(&be1);
        free(x), free(y1), free(y0), free(ya), free(wd);
        TEST_SKIP("backend ISA is not avx512");
    }
    REQUIRE(be->ops->prepare_weight(be, &w, "w") == PT_OK, "%s", pt_last_error());
    REQUIRE(be1->ops->prepare_weight(be1, &w1, "w") == PT_OK, "%s", pt_last_error());
    pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK && be1->ops->reserve(be1, &lim) == PT_OK, "%s", pt_last_error());
    for (int64_t i = 0; i < (int64_t)T * K; i++)
        x[i] = pt_round_bf16(i / K % 3 == 2 ? ldexpf(rf(-1, 1), (int)(ru32() % 30) - 20) : rf(-3, 3));
    pt_cpu_lever.bgemm = !amx;
    pt_cpu_lever.amx = amx;
    long c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]);
    REQUIRE(be->ops->matmul(be, y1, x, T, &w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]) == c0 + 1, "%s: the GEMM did not run", nm);
    pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
    REQUIRE(be->ops->matmul(be, y0, x, T, &w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]) == c0 + 1, "%s: the levers off still counted", nm);
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++)
        for (int n = 0; n < N && bad < 3; n++) {
            double ref = pt_bf16_to_f32(bias[n]), mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                uint16_t b = wd[(size_t)n * K + k];
                double wv = (b & 0x7f80) ? pt_bf16_to_f32(b) : 0.0;
                ref += wv * x[(size_t)t * K + k], mag += fabs(wv * x[(size_t)t * K + k]);
            }
            double got = y1[(size_t)t * N + n], f32 = y0[(size_t)t * N + n];
            if (fabs(got - ref) > ldexp(fabs(ref), -8) + ldexp(mag, -20) ||
                fabs(got - f32) > ldexp(fabs(f32), -7) + ldexp(mag, -20)) {
                CHECK(0, "%s: t %d n %d: %.9g, double %.9g, f32 GEMM %.9g", nm, t, n, got, ref, f32);
                bad++;
            }
        }
    pt_cpu_lever.bgemm = !amx;
    pt_cpu_lever.amx = amx;
    REQUIRE(be->ops->matmul(be, ya, x, T0, &w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(memcmp(ya, y1, sizeof(float) * (size_t)T0 * N) == 0, "%s: tokens 0-%d differ alone and among %d", nm, T0 - 1,
          T);
    REQUIRE(be1->ops->matmul(be1, ya, x, T, &w1, 0) == PT_OK, "%s", pt_last_error());
    CHECK(memcmp(ya, y1, sizeof(float) * (size_t)T * N) == 0, "%s: 1 and 2 threads differ", nm);
    x[(T / 2) * K + 3] = 0.1234567f; /* not bf16: the f32 GEMM */
    c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]);
    REQUIRE(be->ops->matmul(be, y1, x, T, &w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]) == c0, "%s: a non-bf16 call counted", nm);
    pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
    REQUIRE(be->ops->matmul(be, y0, x, T, &w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(memcmp(y1, y0, sizeof(float) * (size_t)T * N) == 0, "%s: a non-bf16 token did not take the f32 GEMM", nm);
    pt_backend_free(&be);
    pt_backend_free(&be1);
    free(x), free(y1), free(y0), free(ya), free(wd);
    pt_cpu_lever.bgemm = saved[0];
    pt_cpu_lever.amx = saved[1];
}

/* K not a multiple of 32: the f32 GEMM, whatever the switches. */
static void check_dense_refused(void) {
    enum { N = 40, K = 80, T = 9 };
    uint16_t *wd = malloc(sizeof(uint16_t) * N * K);
    float *x = malloc(sizeof(float) * T * K), *y1 = malloc(sizeof(float) * T * N), *y0 = malloc(sizeof(float) * T * N);
    for (int i = 0; i < N * K; i++) wd[i] = pt_f32_to_bf16(rf(-0.2f, 0.2f));
    for (int i = 0; i < T * K; i++) x[i] = pt_round_bf16(rf(-3, 3));
    pt_matrix w = {.rows = N, .cols = K, .dtype = PT_FT_BF16, .data = wd};
    pt_backend *be = NULL;
    REQUIRE(xint_avx512_backend(&be, 2), "%s", pt_last_error());
    if (be) {
        int saved[2] = {pt_cpu_lever.bgemm, pt_cpu_lever.amx};
        REQUIRE(be->ops->prepare_weight(be, &w, "w") == PT_OK, "%s", pt_last_error());
        pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
        REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "%s", pt_last_error());
        pt_cpu_lever.bgemm = pt_cpu_lever.amx = 1;
        long c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]);
        REQUIRE(be->ops->matmul(be, y1, x, T, &w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_DENSE16]) == c0, "dense K %d: the bf16 GEMM ran", K);
        pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
        REQUIRE(be->ops->matmul(be, y0, x, T, &w, 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(y1, y0, sizeof(float) * T * N) == 0, "dense K %d: not the f32 GEMM's bits", K);
        pt_cpu_lever.bgemm = saved[0];
        pt_cpu_lever.amx = saved[1];
        pt_backend_free(&be);
    }
    free(wd), free(x), free(y1), free(y0);
}

static void test_dense(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX-512 BF16");
    check_dense_refused();
    check_dense(0, 11, 4, 512);
    check_dense(0, 45, 9, 96); /* K a multiple of 32, not of 64 */
    if (pt_cpu_amx_available()) {
        check_dense(1, 11, 4, 512);
        check_dense(1, 45, 32, 512);
        check_dense(1, 45, 32, 96);
    }
}

/* AMX: T = 11 (one partial block of 32 tokens) and 45 (a whole block and a
 * partial one; its first 32 tokens alone are one whole block). */
static void test_amx(void) {
    if (!test_cpu_avx512_bf16() || !pt_cpu_amx_available()) TEST_SKIP("no AMX-BF16 (or the OS refused the tile state)");
    check_gemm(1, 11, 4);
    check_gemm(1, 45, 32);
}

/* pt_backend_cpu_quant_paths names the kernels the levers select, and
 * nothing for f32 activations. */
static void test_paths_name(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX-512 BF16");
    pt_backend *be = NULL, *bf = NULL;
    REQUIRE(xint_avx512_backend(&be, 1), "%s", pt_last_error());
    if (!be) TEST_SKIP("backend ISA is not avx512");
    pt_cpu_params cp = {.n_threads = 1, .act = PT_ACT_F32};
    REQUIRE(pt_backend_cpu_create(&bf, &cp) == PT_OK, "%s", pt_last_error());
    int saved[4] = {pt_cpu_lever.xint, pt_cpu_lever.xgemm, pt_cpu_lever.bgemm, pt_cpu_lever.amx};
    const char *p;
    pt_cpu_lever.xint = pt_cpu_lever.xgemm = 1;
    pt_cpu_lever.bgemm = pt_cpu_lever.amx = 0;
    p = pt_backend_cpu_quant_paths(be);
    CHECK(p && !strcmp(p, "decode int pieces, prefill int pieces"), "xint levers: %s", p ? p : "NULL");
    pt_cpu_lever.xint = pt_cpu_lever.xgemm = 0;
    pt_cpu_lever.bgemm = 1;
    p = pt_backend_cpu_quant_paths(be);
    CHECK(p && !strcmp(p, "decode bf16, prefill bf16"), "bgemm: %s", p ? p : "NULL");
    pt_cpu_lever.bgemm = 0;
    p = pt_backend_cpu_quant_paths(be);
    CHECK(p && !strcmp(p, "decode bf16, prefill f32"), "all off: %s", p ? p : "NULL");
    pt_cpu_lever.amx = 1;
    p = pt_backend_cpu_quant_paths(be);
    const char *want = pt_cpu_amx_available() ? "decode bf16, prefill amx" : "decode bf16, prefill f32";
    CHECK(p && !strcmp(p, want), "amx: %s (want %s)", p ? p : "NULL", want);
    CHECK(pt_backend_cpu_quant_paths(bf) == NULL, "f32 activations named %s", pt_backend_cpu_quant_paths(bf));
    pt_cpu_lever.xint = saved[0];
    pt_cpu_lever.xgemm = saved[1];
    pt_cpu_lever.bgemm = saved[2];
    pt_cpu_lever.amx = saved[3];
    pt_backend_free(&be);
    pt_backend_free(&bf);
}

int main(void) {
    TEST_RUN(test_x_conversion);
    TEST_RUN(test_gemm);
    TEST_RUN(test_amx);
    TEST_RUN(test_dense);
    TEST_RUN(test_paths_name);
    return test_summary();
}
