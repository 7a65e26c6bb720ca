/* matmul_multi (backend.h) on the CPU backend, through
 * pt_backend_matmul_multi: the op when the backend has it, else the separate
 * calls. Each output must be bit-identical to a separate matmul (rows == 0)
 * and matmul_rows (rows == 1) of its weight, for 4- and 8-bit weights of
 * groups 32/64/128, T = 1, 3, 17, 64, 2 and 3 weights of different row
 * counts over the same x, with and without a bias, in bf16 and f32
 * activation mode; the outputs must not touch anything past their rows; bad
 * arguments (n outside 1..4, weights of different K) are errors.
 * (tests/cuda/test_gemv_batch.c checks the CUDA grouped launch.) */
#include "test.h"
#define OP_CHECK_SEED 0x2545f4914f6cdd1dull /* this test's inputs */
#include "test_rand.h"            /* ru32, rf, rand_qweight */

#include "backend/backend.h"
#include "base/error.h"
#include "base/half.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void qw_free(pt_backend *be, rand_qweight *q) {
    be->ops->release_weight(be, &q->w);
    rand_qweight_free(q);
}

enum { KDIM = 256, TMAX = 64, GUARD = 16 };
static const int64_t Ns[3] = {80, 48, 16};

/* One (bits, gs, bias) weight set, every T, n and rows mode; 0 on failure. */
static int check_set(pt_backend *be, int bits, int gs, int with_bias, const char *mode) {
    rand_qweight q[3];
    for (int i = 0; i < 3; i++) {
        rand_qweight_make(&q[i], Ns[i], KDIM, bits, gs, with_bias, 0);
        if (be->ops->prepare_weight(be, &q[i].w, "w") != PT_OK) {
            CHECK(0, "prepare: %s", pt_last_error());
            for (int j = 0; j <= i; j++) qw_free(be, &q[j]);
            return 0;
        }
    }
    float *x = malloc(sizeof(float) * TMAX * KDIM);
    for (int64_t i = 0; i < TMAX * KDIM; i++) x[i] = pt_round_bf16(rf(-2, 2));
    float *ym[3], *ys[3];
    for (int i = 0; i < 3; i++) {
        ym[i] = malloc(sizeof(float) * (TMAX * Ns[i] + GUARD));
        ys[i] = malloc(sizeof(float) * (TMAX * Ns[i]));
    }
    static const int Ts[] = {1, 3, 17, 64};
    int ok = 1;
    for (int ti = 0; ti < 4 && ok; ti++)
        for (int n = 2; n <= 3 && ok; n++)
            for (int rows = 0; rows < 2 && ok; rows++) {
                const int64_t T = Ts[ti];
                const pt_matrix *ws[3] = {&q[0].w, &q[1].w, &q[2].w};
                for (int i = 0; i < n; i++) {
                    for (int64_t j = 0; j < T * Ns[i] + GUARD; j++) ym[i][j] = -7.0f; /* sentinel */
                    pt_status st = rows ? be->ops->matmul_rows(be, ys[i], x, T, ws[i], 0)
                                        : be->ops->matmul(be, ys[i], x, T, ws[i], 0);
                    if (st != PT_OK) {
                        CHECK(0, "separate matmul%s: %s", rows ? "_rows" : "", pt_last_error());
                        ok = 0;
                    }
                }
                if (!ok) break;
                pt_status st = pt_backend_matmul_multi(be, n, ym, x, T, ws, rows);
                if (st != PT_OK) {
                    CHECK(0, "matmul_multi: %s", pt_last_error());
                    ok = 0;
                    break;
                }
                for (int i = 0; i < n && ok; i++) {
                    for (int64_t j = 0; j < T * Ns[i] && ok; j++)
                        if (memcmp(&ym[i][j], &ys[i][j], 4)) {
                            CHECK(0,
                                  "%s %d-bit g%d%s T=%lld n=%d %s: weight %d (N %lld) row %lld col %lld: "
                                  "multi %.9g, separate %.9g",
                                  mode, bits, gs, with_bias ? " bias" : "", (long long)T, n,
                                  rows ? "matmul_rows" : "matmul", i, (long long)Ns[i], (long long)(j / Ns[i]),
                                  (long long)(j % Ns[i]), ym[i][j], ys[i][j]);
                            ok = 0;
                        }
                    for (int64_t j = T * Ns[i]; j < T * Ns[i] + GUARD && ok; j++)
                        if (ym[i][j] != -7.0f) {
                            CHECK(0, "%s: weight %d written past its %lld rows", mode, i, (long long)T);
                            ok = 0;
                        }
                }
            }
    for (int i = 0; i < 3; i++) {
        free(ym[i]), free(ys[i]);
        qw_free(be, &q[i]);
    }
    free(x);
    return ok;
}

static void test_matmul_multi_bit_identical(void) {
    static const int bitss[] = {4, 8}, gss[] = {32, 64, 128};
    for (int act = 0; act < 2; act++) {
        pt_backend *be = NULL;
        pt_cpu_params p = {.n_threads = 2, .act = act ? PT_ACT_BF16 : PT_ACT_F32};
        REQUIRE(pt_backend_cpu_create(&be, &p) == PT_OK, "cpu: %s", pt_last_error());
        printf("INFO matmul_multi on the CPU backend: %s\n",
               be->ops->matmul_multi ? "the op" : "not implemented, the separate calls");
        int ok = 1;
        for (int b = 0; b < 2 && ok; b++)
            for (int g = 0; g < 3 && ok; g++)
                for (int bias = 0; bias < 2 && ok; bias++)
                    ok = check_set(be, bitss[b], gss[g], bias, act ? "bf16" : "f32");
        pt_backend_free(&be);
        if (!ok) return;
    }
}

static void test_matmul_multi_bad_args(void) {
    pt_backend *be = NULL;
    pt_cpu_params p = {.n_threads = 1, .act = PT_ACT_BF16};
    REQUIRE(pt_backend_cpu_create(&be, &p) == PT_OK, "cpu: %s", pt_last_error());
    rand_qweight a, b;
    rand_qweight_make(&a, 16, 256, 4, 64, 0, 0);
    rand_qweight_make(&b, 16, 128, 4, 64, 0, 0);
    REQUIRE(be->ops->prepare_weight(be, &a.w, "a") == PT_OK, "prepare: %s", pt_last_error());
    REQUIRE(be->ops->prepare_weight(be, &b.w, "b") == PT_OK, "prepare: %s", pt_last_error());
    float x[256] = {0}, y0[16], y1[16], y2[16], y3[16], y4[16];
    float *ys[5] = {y0, y1, y2, y3, y4};
    const pt_matrix *same[5] = {&a.w, &a.w, &a.w, &a.w, &a.w}, *mixed[2] = {&a.w, &b.w};
    CHECK(pt_backend_matmul_multi(be, 0, ys, x, 1, same, 0) == PT_ERR_INVALID_ARG, "n = 0 accepted");
    CHECK(pt_backend_matmul_multi(be, 5, ys, x, 1, same, 0) == PT_ERR_INVALID_ARG, "n = 5 accepted");
    CHECK(pt_backend_matmul_multi(be, 2, ys, x, 1, mixed, 0) == PT_ERR_INVALID_ARG, "K 256 and 128 accepted");
    CHECK(strstr(pt_last_error(), "128") != NULL, "message names the K: %s", pt_last_error());
    CHECK(pt_backend_matmul_multi(be, 4, ys, x, 1, same, 1) == PT_OK, "n = 4: %s", pt_last_error());
    qw_free(be, &a);
    qw_free(be, &b);
    pt_backend_free(&be);
}

int main(void) {
    TEST_RUN(test_matmul_multi_bit_identical);
    TEST_RUN(test_matmul_multi_bad_args);
    return test_summary();
}
