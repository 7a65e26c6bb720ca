/* The cases of the int8 lever's AMX GEMM (gemm_i8_avx512.c amx8_panels),
 * shared by tests/test_cpu_amx_i8.c (the real tiles, where the CPU has
 * AMX-INT8) and tests/test_cpu_amx_emul.c (the tile operations emulated in
 * C, on any AVX-512 VNNI CPU): 4- and 8-bit weights × groups 32/64/128, bf16
 * and f32 activations, with and without a bias, T past the decode path in
 * one partial block of 32 tokens (11), a whole and a partial one (45) and
 * three (77), rows not a multiple of the 32-row panel: bit-identical to the
 * lever's VNNI GEMM (the same exact integer sums folded by the same
 * operations), a call's first tokens bit-identical to the same tokens alone,
 * 1 and 2 threads bit-identical, the path counters proving which GEMM ran;
 * matmul_multi's weights bit-identical to separate calls; and the name of
 * the prefill path.
 *
 * What it is: static test functions for one test binary each. What it is
 * not: a test by itself (no main). */
#ifndef PT_TESTS_AMX_I8_CASES_H
#define PT_TESTS_AMX_I8_CASES_H

#include "test.h"
#include "test_rand.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/half.h"
#include "petrel.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int available(void) { return pt_cpu_gemm_i8_available() && pt_cpu_amx_i8_available(); }

/* An int8-lever CPU backend of `threads` threads, or NULL when its ISA is
 * not avx512 (the caller skips) or creating it failed (CHECKed). */
static pt_backend *lever_backend(int threads, pt_act_dtype act) {
    pt_cpu_params cp = {.n_threads = threads, .act = act, .int8_act = 1};
    pt_backend *be = NULL;
    pt_status st = pt_backend_cpu_create(&be, &cp);
    CHECK(st == PT_OK, "creating the backend: %s", pt_last_error());
    if (st == PT_OK && strcmp(pt_backend_cpu_isa_name(be), "avx512")) pt_backend_free(&be);
    return st == PT_OK ? be : NULL;
}

/* y = w·x with the AMX lever on (amx 1) or off; CHECKs that the named GEMM
 * ran exactly once. */
static void run(pt_backend *be, float *y, const float *x, int T, const pt_matrix *w, int amx, const char *what) {
    int path = amx ? PT_CPU_PATH_AMX8 : PT_CPU_PATH_I8GEMM;
    pt_cpu_lever.amx = amx;
    long c0 = atomic_load(&pt_cpu_path_count[path]);
    REQUIRE(be->ops->matmul(be, y, x, T, w, 0) == PT_OK, "%s", pt_last_error());
    CHECK(atomic_load(&pt_cpu_path_count[path]) == c0 + 1, "%s: the %s GEMM did not run", what, amx ? "AMX" : "VNNI");
}

static void check_case(pt_act_dtype act, int bits, int gs, int with_bias, int T, int T0) {
    enum { N = 45, K = 512 };
    char what[96];
    snprintf(what, sizeof what, "%s act, %d-bit, group %d, bias %d, T %d", act == PT_ACT_BF16 ? "bf16" : "f32", bits,
             gs, with_bias, T);
    pt_backend *be = lever_backend(2, act), *be1 = lever_backend(1, act);
    if (!be || !be1) {
        pt_backend_free(&be);
        pt_backend_free(&be1);
        TEST_SKIP("backend ISA is not avx512");
    }
    float *x = malloc(sizeof(float) * (size_t)T * K), *y1 = malloc(sizeof(float) * (size_t)T * N),
          *y0 = malloc(sizeof(float) * (size_t)T * N), *ya = malloc(sizeof(float) * (size_t)T * N);
    rand_qweight q;
    rand_qweight_make(&q, N, K, bits, gs, with_bias, 0);
    pt_matrix w1 = q.w;
    REQUIRE(be->ops->prepare_weight(be, &q.w, "w") == PT_OK, "%s", pt_last_error());
    REQUIRE(be1->ops->prepare_weight(be1, &w1, "w") == PT_OK, "%s", pt_last_error());
    pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK && be1->ops->reserve(be1, &lim) == PT_OK, "%s", pt_last_error());
    for (int64_t i = 0; i < (int64_t)T * K; i++) { /* wide ranges in some tokens, exact zeros in others */
        float v = i / K % 3 == 2 ? ldexpf(rf(-1, 1), (int)(ru32() % 30) - 20) : rf(-3, 3);
        x[i] = i / K % 5 == 4 && i % K < 128 ? 0.0f : pt_round_bf16(v);
    }
    run(be, y1, x, T, &q.w, 1, what);
    run(be, y0, x, T, &q.w, 0, what);
    int64_t bad = -1;
    for (int64_t i = 0; i < (int64_t)T * N && bad < 0; i++)
        if (memcmp(&y1[i], &y0[i], sizeof(float))) bad = i;
    CHECK(bad < 0, "%s: AMX and VNNI differ at token %lld row %lld (%.9g vs %.9g)", what, (long long)(bad / N),
          (long long)(bad % N), bad < 0 ? 0.0 : y1[bad], bad < 0 ? 0.0 : y0[bad]);
    int finite = 1;
    for (int64_t i = 0; i < (int64_t)T * N; i++) finite &= isfinite(y1[i]) && y1[i] != 0.0f;
    CHECK(finite, "%s: an output is zero or not finite", what);
    run(be, ya, x, T0, &q.w, 1, what);
    CHECK(memcmp(ya, y1, sizeof(float) * (size_t)T0 * N) == 0, "%s: tokens 0-%d differ alone and among %d", what,
          T0 - 1, T);
    run(be1, ya, x, T, &w1, 1, what);
    CHECK(memcmp(ya, y1, sizeof(float) * (size_t)T * N) == 0, "%s: 1 and 2 threads differ", what);
    rand_qweight_free(&q);
    pt_backend_free(&be);
    pt_backend_free(&be1);
    free(x), free(y1), free(y0), free(ya);
}

static void test_amx_i8_gemm(void) {
    if (!available()) TEST_SKIP("no AMX-INT8 (or the OS refused the tile state) or no AVX-512 VNNI");
    int saved = pt_cpu_lever.amx;
    static const int gss[3] = {32, 64, 128};
    for (int a = 0; a < 2; a++)
        for (int bits = 4; bits <= 8; bits += 4)
            for (int gi = 0; gi < 3; gi++) {
                pt_act_dtype act = a ? PT_ACT_F32 : PT_ACT_BF16;
                check_case(act, bits, gss[gi], gi != 1, 11, 4);
                check_case(act, bits, gss[gi], gi == 1, 45, 32);
            }
    check_case(PT_ACT_BF16, 4, 64, 1, 77, 64);
    pt_cpu_lever.amx = saved;
}

/* q, k, v as one matmul_multi (x prepared once, padded to whole blocks once)
 * against three calls. */
static void test_amx_i8_multi(void) {
    if (!available()) TEST_SKIP("no AMX-INT8 (or the OS refused the tile state) or no AVX-512 VNNI");
    enum { K = 256, T = 37 };
    static const int64_t Ns[3] = {64, 19, 19};
    int saved = pt_cpu_lever.amx;
    pt_cpu_lever.amx = 1;
    pt_backend *be = lever_backend(2, PT_ACT_BF16);
    if (!be) TEST_SKIP("backend ISA is not avx512");
    rand_qweight q[3];
    pt_matrix *ws[3];
    float *x = malloc(sizeof(float) * T * K), *y[3], *ys = malloc(sizeof(float) * T * 64);
    for (int i = 0; i < 3; i++) {
        rand_qweight_make(&q[i], Ns[i], K, 4, 64, i == 0, 0);
        REQUIRE(be->ops->prepare_weight(be, &q[i].w, "w") == PT_OK, "%s", pt_last_error());
        ws[i] = &q[i].w;
        y[i] = malloc(sizeof(float) * T * (size_t)Ns[i]);
    }
    pt_backend_limits lim = {.max_tokens = T, .max_cols = K};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "%s", pt_last_error());
    for (int i = 0; i < T * K; i++) x[i] = pt_round_bf16(rf(-2, 2));
    long c0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_AMX8]);
    REQUIRE(pt_cpu_matmul_multi(be, 3, y, x, T, (const pt_matrix *const *)ws, 0) == PT_OK, "%s", pt_last_error());
    CHECK(atomic_load(&pt_cpu_path_count[PT_CPU_PATH_AMX8]) == c0 + 3, "matmul_multi: the AMX GEMM did not run 3 times");
    for (int i = 0; i < 3; i++) {
        REQUIRE(be->ops->matmul(be, ys, x, T, ws[i], 0) == PT_OK, "%s", pt_last_error());
        CHECK(memcmp(ys, y[i], sizeof(float) * T * (size_t)Ns[i]) == 0, "matmul_multi weight %d differs from its own call",
              i);
    }
    for (int i = 0; i < 3; i++) rand_qweight_free(&q[i]), free(y[i]);
    free(x), free(ys);
    pt_backend_free(&be);
    pt_cpu_lever.amx = saved;
}

/* pt_backend_cpu_quant_paths names the int8 lever's prefill GEMM. */
static void test_amx_i8_paths_name(void) {
    if (!pt_cpu_gemm_i8_available()) TEST_SKIP("no AVX-512 VNNI");
    pt_backend *be = lever_backend(1, PT_ACT_BF16);
    if (!be) TEST_SKIP("backend ISA is not avx512");
    int saved = pt_cpu_lever.amx;
    pt_cpu_lever.amx = 0;
    const char *p = pt_backend_cpu_quant_paths(be);
    CHECK(p && !strcmp(p, "int8 x: decode vnni, prefill vnni"), "amx off: %s", p ? p : "NULL");
    pt_cpu_lever.amx = 1;
    p = pt_backend_cpu_quant_paths(be);
    const char *want = pt_cpu_amx_i8_available() ? "int8 x: decode vnni, prefill amx int8"
                                                 : "int8 x: decode vnni, prefill vnni";
    CHECK(p && !strcmp(p, want), "amx on: %s (want %s)", p ? p : "NULL", want);
    pt_cpu_lever.amx = saved;
    pt_backend_free(&be);
}

#endif
