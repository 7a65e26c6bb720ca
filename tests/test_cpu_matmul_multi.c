/* The CPU backend's matmul_multi (pt_cpu_matmul_multi, cpu_matmul.c) called
 * directly: on the decode path it prepares x once and runs the rows of all
 * the weights as one pool job. Every output must be bit-identical to the
 * separate matmul (rows == 0) / matmul_rows (rows == 1) of its weight, with
 * 1 and 2 threads, for 4- and 8-bit weights of groups 32/64/128, K with and
 * without the bf16 kernel's K % 128 == 0, row counts that are not multiples
 * of 4 (padding between weights in the shared row space) and large enough
 * for claims to cross weight boundaries, bf16 and f32 activations, a token
 * whose x is not exactly bf16 (the f32 kernel beside the bf16 one), the
 * int8 lever, T past the decode path (the prefill GEMMs with x prepared once
 * for all the weights: bf16, integer-piece, int8 lever; the separate calls
 * where none takes it), mixed bits (the separate calls); nothing past a
 * weight's rows is written. Also: the 4-bit
 * bf16 kernel reading bf16 scales/biases itself gives the bits of the one
 * fed f32 copies; and the decode split's two forms (one contiguous share
 * per thread with stealing, or guided claims) give the same bits. (The op table
 * wiring and the backend-independent contract are checked by
 * tests/test_matmul_multi.c.) */
#include "test.h"
#include "test_rand.h" /* ru32, rf, rand_qweight; the default seed */

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/half.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { GUARD = 8, TMAX = 6 };

/* One configuration: n weights of rows Ns[i] (bits[i], group gs), T tokens. */
static void check_case(int nth, pt_act_dtype act, int int8_act, int64_t K, const int *bits, int gs, const int64_t *Ns,
                       int n, int64_t T, int rows, int odd_token) {
    char what[160];
    snprintf(what, sizeof what, "nth %d act %d i8 %d K %lld gs %d bits %d.. n %d T %lld rows %d odd %d", nth, (int)act,
             int8_act, (long long)K, gs, bits[0], n, (long long)T, rows, odd_token);
    pt_backend *be = NULL;
    pt_cpu_params cp = {.n_threads = nth, .act = act, .int8_act = int8_act};
    REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "%s: %s", what, pt_last_error());
    rand_qweight q[4];
    const pt_matrix *ws[4];
    float *ya[4], *yb[4];
    int64_t maxN = 0;
    for (int i = 0; i < n; i++) {
        rand_qweight_make(&q[i], Ns[i], K, bits[i], gs, i == 1, 0);
        REQUIRE(be->ops->prepare_weight(be, &q[i].w, "w") == PT_OK, "%s: %s", what, pt_last_error());
        ws[i] = &q[i].w;
        if (Ns[i] > maxN) maxN = Ns[i];
    }
    pt_backend_limits lim = {.max_tokens = TMAX, .max_cols = K};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "%s", what);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    for (int64_t i = 0; i < T * K; i++) x[i] = act == PT_ACT_BF16 ? pt_round_bf16(rf(-2, 2)) : rf(-2, 2);
    if (odd_token) x[(T - 1) * K + 5] = 0.1234567f; /* not a bf16 value: that token keeps the f32 kernel */
    for (int i = 0; i < n; i++) {
        ya[i] = malloc(sizeof(float) * (size_t)(T * Ns[i] + GUARD));
        yb[i] = malloc(sizeof(float) * (size_t)(T * Ns[i] + GUARD));
        for (int64_t j = 0; j < T * Ns[i] + GUARD; j++) ya[i][j] = yb[i][j] = -777.0f;
        pt_status s = rows ? be->ops->matmul_rows(be, ya[i], x, T, ws[i], 0) : be->ops->matmul(be, ya[i], x, T, ws[i], 0);
        REQUIRE(s == PT_OK, "%s: %s", what, pt_last_error());
    }
    REQUIRE(pt_cpu_matmul_multi(be, n, yb, x, T, ws, rows) == PT_OK, "%s: %s", what, pt_last_error());
    for (int i = 0; i < n; i++) {
        CHECK(memcmp(ya[i], yb[i], sizeof(float) * (size_t)(T * Ns[i])) == 0, "%s: weight %d differs", what, i);
        for (int j = 0; j < GUARD; j++) CHECK(yb[i][T * Ns[i] + j] == -777.0f, "%s: weight %d wrote past its end", what, i);
        free(ya[i]), free(yb[i]), rand_qweight_free(&q[i]);
    }
    free(x);
    pt_backend_free(&be);
}

static void test_multi_bit_identical(void) {
    static const int64_t Ns[4] = {301, 13, 517, 6}; /* not multiples of 4; > one guided claim in total */
    static const int gss[3] = {32, 64, 128};
    for (int nth = 1; nth <= 2; nth++)
        for (int b = 4; b <= 8; b += 4)
            for (int gi = 0; gi < 3; gi++)
                for (int64_t K = 256; K <= 384; K += 128) { /* 384: K % 128 == 0 too; 256 + 64 below */
                    int bits[4] = {b, b, b, b};
                    for (int n = 1; n <= 4; n++) {
                        check_case(nth, PT_ACT_BF16, 0, K, bits, gss[gi], Ns, n, 1, 0, 0);
                        if (test_failed_current) return;
                    }
                    check_case(nth, PT_ACT_F32, 0, K, bits, gss[gi], Ns, 3, 2, 0, 0);
                    check_case(nth, PT_ACT_BF16, 0, K, bits, gss[gi], Ns, 3, 3, 0, 1);
                    check_case(nth, PT_ACT_BF16, 0, K, bits, gss[gi], Ns, 2, 5, 1, 1);
                    check_case(nth, PT_ACT_BF16, 1, K, bits, gss[gi], Ns, 3, 1, 0, 0);
                    check_case(nth, PT_ACT_BF16, 1, K, bits, gss[gi], Ns, 2, 4, 1, 0);
                    if (test_failed_current) return;
                }
}

/* The decode split (pt_cpu_lever.split): one contiguous share per thread
 * with stealing against the guided claims from one counter, 2 and 3
 * threads, 4- and 8-bit weights: matmul_rows and matmul_multi outputs
 * bit-identical between the two splits (which thread computes a row never
 * changes its bits), and matmul_multi against the separate calls under the
 * contiguous split (check_case). */
static void test_split_bit_identical(void) {
    static const int64_t Ns[3] = {517, 13, 301};
    int saved = pt_cpu_lever.split;
    for (int nth = 2; nth <= 3; nth++)
        for (int b = 4; b <= 8; b += 4) {
            int bits[3] = {b, b, b};
            pt_cpu_lever.split = 1;
            check_case(nth, PT_ACT_BF16, 0, 384, bits, 64, Ns, 3, 1, 0, 0);
            check_case(nth, PT_ACT_BF16, 0, 384, bits, 64, Ns, 3, 3, 1, 1);
            pt_backend *be = NULL;
            pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
            REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "%s", pt_last_error());
            rand_qweight q[3];
            const pt_matrix *ws[3];
            for (int i = 0; i < 3; i++) {
                rand_qweight_make(&q[i], Ns[i], 384, b, 64, 0, 0);
                REQUIRE(be->ops->prepare_weight(be, &q[i].w, "w") == PT_OK, "%s", pt_last_error());
                ws[i] = &q[i].w;
            }
            pt_backend_limits lim = {.max_tokens = TMAX, .max_cols = 384};
            REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "%s", pt_last_error());
            float x[3 * 384], y[2][3][3 * 517], *yp[2][3];
            for (int i = 0; i < 3 * 384; i++) x[i] = pt_round_bf16(rf(-2, 2));
            for (int sp = 0; sp < 2; sp++) {
                pt_cpu_lever.split = sp;
                for (int i = 0; i < 3; i++) yp[sp][i] = y[sp][i];
                REQUIRE(be->ops->matmul_rows(be, y[sp][0], x, 3, ws[0], 0) == PT_OK, "%s", pt_last_error());
                REQUIRE(pt_cpu_matmul_multi(be, 2, yp[sp] + 1, x, 1, ws + 1, 0) == PT_OK, "%s", pt_last_error());
            }
            CHECK(memcmp(y[0][0], y[1][0], sizeof(float) * 3 * 517) == 0, "nth %d bits %d: matmul_rows differs", nth, b);
            CHECK(memcmp(y[0][1], y[1][1], sizeof(float) * 13) == 0 && memcmp(y[0][2], y[1][2], sizeof(float) * 301) == 0,
                  "nth %d bits %d: matmul_multi differs", nth, b);
            for (int i = 0; i < 3; i++) rand_qweight_free(&q[i]);
            pt_backend_free(&be);
        }
    pt_cpu_lever.split = saved;
}

static void test_multi_other_shapes(void) {
    static const int64_t Ns[3] = {40, 24, 8};
    int bits4[3] = {4, 4, 4}, mixed[3] = {4, 8, 4};
    for (int nth = 1; nth <= 2; nth++) {
        check_case(nth, PT_ACT_BF16, 0, 320, bits4, 64, Ns, 3, 1, 0, 0); /* K % 128 != 0: the f32 kernel */
        /* prefill GEMMs: x prepared once for all the weights (or, when no GEMM takes it, the separate calls) */
        int bits8[3] = {8, 8, 8};
        check_case(nth, PT_ACT_BF16, 0, 256, bits4, 64, Ns, 3, 6, 0, 0); /* the bf16 (or integer-piece) GEMM */
        check_case(nth, PT_ACT_BF16, 0, 256, bits8, 32, Ns, 3, 6, 0, 0); /* 8-bit */
        check_case(nth, PT_ACT_BF16, 1, 256, bits4, 64, Ns, 3, 6, 0, 0); /* the int8 lever's VNNI GEMM */
        check_case(nth, PT_ACT_BF16, 1, 256, bits8, 128, Ns, 3, 6, 0, 0);
        check_case(nth, PT_ACT_BF16, 0, 256, bits4, 64, Ns, 3, 6, 0, 1); /* x not bf16: the f32 GEMM, separate */
        check_case(nth, PT_ACT_F32, 0, 256, bits4, 64, Ns, 3, 6, 0, 0);  /* f32 activations: separate */
        check_case(nth, PT_ACT_BF16, 0, 256, mixed, 64, Ns, 3, 1, 0, 0); /* mixed bits: separate calls */
        int b6[3] = {6, 6, 6};
        check_case(nth, PT_ACT_BF16, 0, 256, b6, 64, Ns, 2, 1, 0, 0); /* 6 bits: separate calls */
    }
}

static void test_multi_bad_args(void) {
    pt_backend *be = NULL;
    pt_cpu_params cp = {.n_threads = 2, .act = PT_ACT_BF16};
    REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "%s", pt_last_error());
    rand_qweight a, b;
    rand_qweight_make(&a, 8, 256, 4, 64, 0, 0);
    rand_qweight_make(&b, 8, 128, 4, 64, 0, 0);
    const pt_matrix *ws[5] = {&a.w, &b.w, &a.w, &a.w, &a.w};
    float y0[16], y1[16];
    float *ys[5] = {y0, y1, y0, y0, y0};
    float x[256] = {0};
    CHECK(pt_cpu_matmul_multi(be, 2, ys, x, 1, ws, 0) == PT_ERR_INVALID_ARG, "different K accepted");
    CHECK(pt_cpu_matmul_multi(be, 0, ys, x, 1, ws, 0) == PT_ERR_INVALID_ARG, "n = 0 accepted");
    ws[1] = &a.w;
    CHECK(pt_cpu_matmul_multi(be, 5, ys, x, 1, ws, 0) == PT_ERR_INVALID_ARG, "n = 5 accepted");
    rand_qweight_free(&a), rand_qweight_free(&b);
    pt_backend_free(&be);
}

/* The 4-bit bf16 decode kernel reading bf16 scales/biases itself
 * (pt_cpu_lever.scale16) gives the bits of the kernel fed f32 copies. */
static void test_scale16_bit_identical(void) {
    static const int gss[3] = {32, 64, 128};
    static const int64_t Ks[3] = {256, 384, 2176}; /* 2176 / 128 = 17 groups: a masked tail in the bias term */
    for (int nth = 1; nth <= 2; nth++)
        for (int gi = 0; gi < 3; gi++)
            for (int ki = 0; ki < 3; ki++)
                for (int64_t T = 1; T <= 3; T++) {
                    int64_t K = Ks[ki], N = 37;
                    pt_backend *be = NULL;
                    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
                    REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "%s", pt_last_error());
                    rand_qweight q;
                    rand_qweight_make(&q, N, K, 4, gss[gi], 1, 0);
                    REQUIRE(be->ops->prepare_weight(be, &q.w, "w") == PT_OK, "%s", pt_last_error());
                    pt_backend_limits lim = {.max_tokens = TMAX, .max_cols = K};
                    REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "reserve");
                    float *x = malloc(sizeof(float) * (size_t)(T * K)), *y0 = malloc(sizeof(float) * (size_t)(T * N)),
                          *y1 = malloc(sizeof(float) * (size_t)(T * N));
                    for (int64_t i = 0; i < T * K; i++) x[i] = pt_round_bf16(rf(-2, 2));
                    int saved = pt_cpu_lever.scale16;
                    pt_cpu_lever.scale16 = 0;
                    pt_status s0 = be->ops->matmul_rows(be, y0, x, T, &q.w, 0);
                    pt_cpu_lever.scale16 = 1;
                    pt_status s1 = be->ops->matmul_rows(be, y1, x, T, &q.w, 0);
                    pt_cpu_lever.scale16 = saved;
                    CHECK(s0 == PT_OK && s1 == PT_OK, "matmul: %s", pt_last_error());
                    CHECK(memcmp(y0, y1, sizeof(float) * (size_t)(T * N)) == 0, "nth %d gs %d K %lld T %lld differ", nth,
                          gss[gi], (long long)K, (long long)T);
                    free(x), free(y0), free(y1), rand_qweight_free(&q);
                    pt_backend_free(&be);
                    if (test_failed_current) return;
                }
}

int main(void) {
    TEST_RUN(test_scale16_bit_identical);
    TEST_RUN(test_multi_bit_identical);
    TEST_RUN(test_multi_other_shapes);
    TEST_RUN(test_split_bit_identical);
    TEST_RUN(test_multi_bad_args);
    return test_summary();
}
