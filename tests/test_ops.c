/* Backend op tests, the ops that read weights: matmul and embed, every CPU
 * implementation against a plain C reference (computed in double, written
 * here independently of the backend), on random inputs and several shapes
 * including odd sizes, for every ISA this CPU supports (scalar, avx2, avx512),
 * in f32 and bf16 activation modes. Tolerance per element: atol + rtol·|ref|;
 * a NaN always fails. Covers dense f32/bf16/f16 weights, every bits/group-size
 * combination of MLX quantized matmul and embed, the prefill GEMM's panels and
 * K blocks, the bf16-dot kernel, the int8-activation lever, the weights
 * prepare_weight refuses, and the PETREL_CPU_ISA selection. Not the other ops
 * (tests/test_ops_layer.c); the shared helpers are in tests/cpu_op_check.h. */
#include "cpu_op_check.h"

#include "base/error.h"

#include <math.h>
#include <stdint.h>

/* ref[T, N] (+ magnitude mag[T, N] = Σ|w·x|) of x·Wᵀ for expert e */
static void ref_matmul(const tweight *t, int64_t e, const float *x, int64_t T, double *ref, double *mag) {
    int64_t N = t->w.rows, K = t->w.cols;
    for (int64_t i = 0; i < T; i++)
        for (int64_t n = 0; n < N; n++) {
            const double *w = t->deq + (e * N + n) * K;
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) {
                s += w[k] * x[i * K + k];
                m += fabs(w[k] * x[i * K + k]);
            }
            if (t->bias) s += t->bias[e * N + n];
            ref[i * N + n] = s;
            mag[i * N + n] = m + 1.0;
        }
}

/* ---- matmul ---- */

static int check_matmul_case(pt_backend *be, tweight *tw, int64_t T, int64_t e, const char *what) {
    int64_t N = tw->w.rows, K = tw->w.cols;
    float *x = malloc(sizeof(float) * (size_t)(T * K)), *y = malloc(sizeof(float) * (size_t)(T * N));
    double *ref = malloc(sizeof(double) * (size_t)(T * N)), *mag = malloc(sizeof(double) * (size_t)(T * N));
    if (be->act == PT_ACT_BF16) fill_bf16vals(x, T * K, -1, 1);
    else fill(x, T * K, -1, 1);
    ref_matmul(tw, e, x, T, ref, mag);
    pt_status s = be->ops->matmul(be, y, x, T, &tw->w, e);
    int ok = s == PT_OK;
    CHECK(ok, "%s: matmul returned %s: %s", what, pt_status_name(s), pt_last_error());
    for (int64_t i = 0; ok && i < T * N; i++) {
        double r = ref[i];
        double atol = 3e-6 * mag[i], rtol = be->act == PT_ACT_BF16 ? 1.0 / 128 : 1e-5;
        if (isnan(y[i]) || fabs(y[i] - r) > atol + rtol * fabs(r)) {
            CHECK(0, "%s: y[%lld] = %.8g, expected %.8g (mag %.3g)", what, (long long)i, y[i], r, mag[i]);
            ok = 0;
        }
    }
    free(x), free(y), free(ref), free(mag);
    return ok;
}

static void test_matmul_dense(void) {
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {33, 64}, {65, 300}, {16, 1031}};
    static const int64_t Ts[] = {1, 2, 5, 17};
    for (size_t ii = 0; ii < 3; ii++) {
        pt_backend *be = mk(2, PT_ACT_F32, all_isas[ii]);
        if (!be) continue;
        for (int dt = 0; dt < 3; dt++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    tweight tw;
                    tw_make(&tw, 0, shapes[s][0], shapes[s][1], (pt_ftype)dt, 0, 0, (int)(s & 1));
                    REQUIRE(be->ops->prepare_weight(be, &tw.w, "w") == PT_OK, "prepare: %s", pt_last_error());
                    char what[256];
                    snprintf(what, sizeof what, "%s %s N=%lld K=%lld T=%lld", pt_backend_cpu_isa_name(be),
                             pt_ftype_name((pt_ftype)dt), (long long)shapes[s][0], (long long)shapes[s][1],
                             (long long)Ts[ti]);
                    int ok = check_matmul_case(be, &tw, Ts[ti], 0, what);
                    tw_free(&tw);
                    if (!ok) {
                        pt_backend_free(&be);
                        return;
                    }
                }
        pt_backend_free(&be);
    }
}

static void test_matmul_quant_all_bits(void) {
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    static const int gss[] = {32, 64, 128};
    static const int64_t Ts[] = {1, 3, 6};
    for (size_t ii = 0; ii < 3; ii++) {
        pt_backend *be = mk(2, PT_ACT_F32, all_isas[ii]);
        if (!be) continue;
        for (size_t bi = 0; bi < 6; bi++)
            for (size_t gi = 0; gi < 3; gi++)
                for (size_t ti = 0; ti < 3; ti++) {
                    int gs = gss[gi];
                    int64_t N = 5 + (int64_t)(bi * 3 + gi) % 7, K = gs * (1 + (int64_t)(ti + bi) % 3);
                    pt_ftype dt = (bi + gi) % 2 ? PT_FT_F16 : PT_FT_BF16;
                    tweight tw;
                    tw_make(&tw, ti == 2 ? 3 : 0, N, K, dt, bitss[bi], gs, (int)(gi == 1));
                    REQUIRE(be->ops->prepare_weight(be, &tw.w, "wq") == PT_OK, "prepare: %s", pt_last_error());
                    char what[256];
                    snprintf(what, sizeof what, "%s q%d g%d N=%lld K=%lld T=%lld", pt_backend_cpu_isa_name(be),
                             bitss[bi], gs, (long long)N, (long long)K, (long long)Ts[ti]);
                    int ok = check_matmul_case(be, &tw, Ts[ti], ti == 2 ? 2 : 0, what);
                    tw_free(&tw);
                    if (!ok) {
                        pt_backend_free(&be);
                        return;
                    }
                }
        pt_backend_free(&be);
    }
}

/* Prefill GEMM with several 32-row panels per thread and K over several
 * 256-wide blocks: every panel must use its own rows' scales. */
static void test_matmul_quant_many_panels(void) {
    static const int bitss[] = {4, 3, 8};
    for (int nth = 1; nth <= 2; nth++) {
        pt_backend *be = mk(nth, PT_ACT_F32, PT_ISA_AUTO);
        REQUIRE(be, "backend");
        for (int bi = 0; bi < 3; bi++) {
            tweight tw;
            tw_make(&tw, 0, 101, 640, PT_FT_BF16, bitss[bi], 64, 1);
            char what[96];
            snprintf(what, sizeof what, "q%d N=101 K=640 T=13 threads=%d", bitss[bi], nth);
            int ok = check_matmul_case(be, &tw, 13, 0, what);
            tw_free(&tw);
            if (!ok) break;
        }
        pt_backend_free(&be);
    }
}

static void test_matmul_bf16_mode(void) {
    pt_backend *be = mk(2, PT_ACT_BF16, PT_ISA_AUTO);
    REQUIRE(be, "backend: %s", pt_last_error());
    tweight tw;
    tw_make(&tw, 0, 37, 256, PT_FT_BF16, 0, 0, 1);
    CHECK(check_matmul_case(be, &tw, 1, 0, "bf16 dense T=1"), "dense");
    CHECK(check_matmul_case(be, &tw, 9, 0, "bf16 dense T=9"), "dense");
    tw_free(&tw);
    pt_backend_free(&be);
    /* the quantized decode kernels in bf16 mode, every ISA (AVX-512 has a bf16-dot path for 4-bit) */
    static const int bitss[] = {4, 8, 3}, gss[] = {32, 64, 128};
    for (size_t ii = 0; ii < 3; ii++) {
        be = mk(2, PT_ACT_BF16, all_isas[ii]);
        if (!be) continue;
        for (int bi = 0; bi < 3; bi++)
            for (int gi = 0; gi < 3; gi++)
                for (int64_t T = 1; T <= 5; T += 2) {
                    int64_t N = 9 + gi + 4 * bi, K = gss[gi] * (2 + bi);
                    tw_make(&tw, 0, N, K, PT_FT_BF16, bitss[bi], gss[gi], bi == 1);
                    char what[256];
                    snprintf(what, sizeof what, "%s bf16 q%d g%d N=%lld K=%lld T=%lld", pt_backend_cpu_isa_name(be),
                             bitss[bi], gss[gi], (long long)N, (long long)K, (long long)T);
                    int ok = check_matmul_case(be, &tw, T, 0, what);
                    tw_free(&tw);
                    if (!ok) {
                        pt_backend_free(&be);
                        return;
                    }
                }
        pt_backend_free(&be);
    }
    be = mk(2, PT_ACT_BF16, PT_ISA_AUTO);
    /* outputs are bf16 values */
    float x[64], y[3];
    fill(x, 64, -1, 1);
    tw_make(&tw, 0, 3, 64, PT_FT_F32, 0, 0, 0);
    be->ops->matmul(be, y, x, 1, &tw.w, 0);
    for (int i = 0; i < 3; i++) CHECK(y[i] == pt_round_bf16(y[i]), "output %d not rounded to bf16", i);
    tw_free(&tw);
    pt_backend_free(&be);
}

/* The prefill GEMM walks K in blocks of 1024 inside each panel (partial sums in
 * a per-thread buffer): K = 2112 is two full blocks and a partial one, for
 * dense and 3/4/8-bit weights (3 bits: codes unpacked from a block offset). */
static void test_matmul_gemm_k_blocks(void) {
    static const int bitss[] = {0, 3, 4, 8};
    for (int am = 0; am < 2; am++) {
        pt_backend *be = mk(2, am ? PT_ACT_BF16 : PT_ACT_F32, PT_ISA_AUTO);
        REQUIRE(be, "backend: %s", pt_last_error());
        for (int bi = 0; bi < 4; bi++) {
            tweight tw;
            tw_make(&tw, 0, 37, 2112, PT_FT_BF16, bitss[bi], bitss[bi] ? 64 : 0, 1);
            char what[96];
            snprintf(what, sizeof what, "gemm K=2112 bits=%d act=%s", bitss[bi], am ? "bf16" : "f32");
            int ok = check_matmul_case(be, &tw, 13, 0, what);
            tw_free(&tw);
            if (!ok) break;
        }
        pt_backend_free(&be);
    }
}

/* The AVX-512 bf16-dot kernel for 4-bit rows (bf16 mode, K % 128 == 0): every
 * group size, K up to 4096 (its 128-offset form must stay within the f32
 * tolerance), and the per-token fallback: a token whose x is not exactly bf16
 * takes the f32 kernel without changing the other tokens' rows. */
static void test_matmul_q4_bf16_dot(void) {
    pt_backend *be = mk(2, PT_ACT_BF16, PT_ISA_AUTO);
    REQUIRE(be, "backend: %s", pt_last_error());
    static const int gss[] = {32, 64, 128};
    static const int64_t Ks[] = {128, 384, 4096};
    for (int gi = 0; gi < 3; gi++)
        for (int ki = 0; ki < 3; ki++)
            for (int64_t T = 1; T <= 2; T++) {
                tweight tw;
                tw_make(&tw, 0, 13, Ks[ki], PT_FT_BF16, 4, gss[gi], gi == 1);
                char what[160];
                snprintf(what, sizeof what, "q4 bf16-dot g%d K=%lld T=%lld", gss[gi], (long long)Ks[ki], (long long)T);
                int ok = check_matmul_case(be, &tw, T, 0, what);
                tw_free(&tw);
                if (!ok) goto done;
            }
    {
        int64_t N = 21, K = 256;
        tweight tw;
        tw_make(&tw, 0, N, K, PT_FT_BF16, 4, 64, 0);
        float *x = malloc(sizeof(float) * 3 * K), *yb = malloc(sizeof(float) * 3 * N), *y1 = malloc(sizeof(float) * N);
        fill_bf16vals(x, 3 * K, -1, 1);
        x[K + 5] = 0.1f; /* not a bf16 value: token 1 takes the f32 kernel */
        REQUIRE(be->ops->matmul_rows(be, yb, x, 3, &tw.w, 0) == PT_OK, "matmul_rows");
        for (int t = 0; t < 3; t++) {
            REQUIRE(be->ops->matmul(be, y1, x + t * K, 1, &tw.w, 0) == PT_OK, "matmul");
            CHECK(memcmp(y1, yb + t * N, sizeof(float) * (size_t)N) == 0, "token %d: batched row differs from alone", t);
        }
        double *ref = malloc(sizeof(double) * 3 * N), *mag = malloc(sizeof(double) * 3 * N);
        ref_matmul(&tw, 0, x, 3, ref, mag);
        for (int64_t i = 0; i < 3 * N; i++)
            CHECK(fabs(yb[i] - ref[i]) <= 3e-6 * mag[i] + fabs(ref[i]) / 128, "y[%lld] = %g, expected %g", (long long)i,
                  yb[i], ref[i]);
        free(x), free(yb), free(y1), free(ref), free(mag);
        tw_free(&tw);
    }
done:
    pt_backend_free(&be);
}

/* The int8-activation lever: decode matmuls quantize x per weight group
 * (step max|x|/127, round to nearest even) and take integer dots. Checked
 * against that exact semantics (tight) and against the f32 reference (loose). */
static void test_matmul_int8_act(void) {
    static const int bitss[] = {4, 8}, gss[] = {32, 64, 128};
    for (size_t ii = 0; ii < 3; ii++) {
        pt_backend *be = NULL;
        pt_cpu_params p = {.n_threads = 2, .act = PT_ACT_F32, .isa = all_isas[ii], .int8_act = 1};
        if (pt_backend_cpu_create(&be, &p) != PT_OK) continue;
        for (int bi = 0; bi < 2; bi++)
            for (int gi = 0; gi < 3; gi++)
                for (int ti = 0; ti < 4; ti++) { /* T >= 4: prefill (the VNNI GEMM on AVX-512) */
                    static const int64_t Ts[] = {1, 2, 5, 13};
                    int64_t T = Ts[ti];
                    int gs = gss[gi];
                    /* T > 4: several panels of 32 rows; K = 96: a 4-bit tail chunk of 32 */
                    int64_t N = (T > 4 ? 70 : 6) + gi, K = gs * (gi == 0 ? 2 + T : 2);
                    tweight tw;
                    tw_make(&tw, 0, N, K, PT_FT_BF16, bitss[bi], gs, 1);
                    float *x = malloc(sizeof(float) * (size_t)(T * K)), *y = malloc(sizeof(float) * (size_t)(T * N));
                    double *ref = malloc(sizeof(double) * (size_t)(T * N)), *mag = malloc(sizeof(double) * (size_t)(T * N));
                    fill(x, T * K, -1, 1);
                    ref_matmul(&tw, 0, x, T, ref, mag);
                    REQUIRE(be->ops->matmul(be, y, x, T, &tw.w, 0) == PT_OK, "matmul");
                    int ok = 1;
                    for (int64_t t = 0; t < T && ok; t++)
                        for (int64_t n = 0; n < N && ok; n++) {
                            /* the lever's semantics: codes·scale against quantized x, the
                             * bias part (deq = s·q + b) against the exact group sums of x */
                            double q = tw.bias[n];
                            for (int64_t g = 0; g < K / gs; g++) {
                                float amax = 0;
                                for (int64_t j = g * gs; j < (g + 1) * gs; j++) amax = fmaxf(amax, fabsf(x[t * K + j]));
                                float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
                                double b = pt_bf16_to_f32(((const uint16_t *)tw.biases)[n * (K / gs) + g]);
                                for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
                                    double xq = (double)d * (double)lrintf(x[t * K + j] * id);
                                    q += (tw.deq[n * K + j] - b) * xq + b * x[t * K + j];
                                }
                            }
                            double got = y[t * N + n];
                            if (isnan(got) || fabs(got - q) > 2e-5 * mag[t * N + n] ||
                                fabs(got - ref[t * N + n]) > 0.02 * mag[t * N + n]) {
                                CHECK(0, "%s int8 q%d g%d K=%lld: y[%lld,%lld] = %.7g, lever semantics %.7g, exact %.7g",
                                      pt_backend_cpu_isa_name(be), bitss[bi], gs, (long long)K, (long long)t,
                                      (long long)n, got, q, ref[t * N + n]);
                                ok = 0;
                            }
                        }
                    free(x), free(y), free(ref), free(mag);
                    tw_free(&tw);
                    if (!ok) {
                        pt_backend_free(&be);
                        return;
                    }
                }
        pt_backend_free(&be);
    }
}

static void test_prepare_weight_rejects(void) {
    pt_backend *be = mk(1, PT_ACT_F32, PT_ISA_AUTO);
    REQUIRE(be, "backend");
    uint32_t d[64] = {0};
    uint16_t s[8] = {0};
    pt_matrix w = {.rows = 2, .cols = 64, .dtype = PT_FT_BF16, .bits = 7, .group_size = 64, .data = d, .scales = s,
                   .biases = s};
    CHECK(be->ops->prepare_weight(be, &w, "layers.0.q_proj") == PT_ERR_UNSUPPORTED, "bits 7");
    CHECK(strstr(pt_last_error(), "layers.0.q_proj") && strstr(pt_last_error(), "bits 7"), "msg: %s", pt_last_error());
    w.bits = 4;
    w.group_size = 48;
    CHECK(be->ops->prepare_weight(be, &w, "w") == PT_ERR_UNSUPPORTED, "gs 48");
    w.group_size = 128;
    CHECK(be->ops->prepare_weight(be, &w, "w") == PT_ERR_INVALID_ARG, "64 cols, group 128");
    w.group_size = 32;
    w.scales = NULL;
    CHECK(be->ops->prepare_weight(be, &w, "w") == PT_ERR_INVALID_ARG, "no scales");
    pt_backend_free(&be);
}

/* ---- embed ---- */

static void test_embed(void) {
    static const int bitss[] = {0, 2, 3, 4, 5, 6, 8};
    static const int gss[] = {32, 64, 128};
    for (int am = 0; am < 2; am++) {
        pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
        pt_backend *be = mk(2, act, PT_ISA_AUTO);
        REQUIRE(be, "backend");
        for (size_t bi = 0; bi < 7; bi++)
            for (size_t gi = 0; gi < 3; gi++) {
                int bits = bitss[bi], gs = gss[gi];
                int64_t V = 11, H = gs * 2;
                tweight tw;
                tw_make(&tw, 0, V, H, bits ? PT_FT_BF16 : (pt_ftype)(gi % 3), bits, gs, 0);
                REQUIRE(be->ops->prepare_weight(be, &tw.w, "embed") == PT_OK, "prepare");
                int32_t ids[4] = {3, 0, 10, 3};
                float scale = gi == 1 ? pt_round_bf16(sqrtf((float)H)) : 1.0f;
                float *y = malloc(sizeof(float) * 4 * (size_t)H);
                double *ref = malloc(sizeof(double) * 4 * (size_t)H);
                REQUIRE(be->ops->embed(be, y, ids, 4, &tw.w, scale) == PT_OK, "embed: %s", pt_last_error());
                for (int t = 0; t < 4; t++)
                    for (int64_t i = 0; i < H; i++) {
                        double v = rnd_act(act, tw.deq[ids[t] * H + i]);
                        if (scale != 1.0f) v = rnd_act(act, v * scale);
                        ref[t * H + i] = v;
                    }
                char what[256];
                snprintf(what, sizeof what, "embed act=%d bits=%d gs=%d", am, bits, gs);
                int ok = close_enough(what, y, ref, 4 * H, 1e-6, act == PT_ACT_BF16 ? 1.0 / 128 : 1e-6);
                int32_t bad[1] = {(int32_t)V};
                CHECK(be->ops->embed(be, y, bad, 1, &tw.w, 1.0f) == PT_ERR_RANGE, "id out of range");
                free(y), free(ref);
                tw_free(&tw);
                if (!ok) break;
            }
        pt_backend_free(&be);
    }
}

static void test_isa_env(void) {
    setenv("PETREL_CPU_ISA", "bogus", 1);
    pt_backend *be = NULL;
    pt_cpu_params p = {.n_threads = 1};
    CHECK(pt_backend_cpu_create(&be, &p) == PT_ERR_INVALID_ARG, "bogus ISA rejected");
    CHECK(strstr(pt_last_error(), "PETREL_CPU_ISA"), "message names the variable: %s", pt_last_error());
    setenv("PETREL_CPU_ISA", "scalar", 1);
    REQUIRE(pt_backend_cpu_create(&be, &p) == PT_OK, "scalar");
    CHECK(strcmp(pt_backend_cpu_isa_name(be), "scalar") == 0, "isa %s", pt_backend_cpu_isa_name(be));
    pt_backend_free(&be);
    unsetenv("PETREL_CPU_ISA");
    REQUIRE(pt_backend_cpu_create(&be, &p) == PT_OK, "auto");
    printf("INFO cpu backend ISA: %s\n", pt_backend_cpu_isa_name(be));
    pt_backend_free(&be);
}

int main(void) {
    TEST_RUN(test_isa_env);
    TEST_RUN(test_matmul_dense);
    TEST_RUN(test_matmul_quant_all_bits);
    TEST_RUN(test_matmul_quant_many_panels);
    TEST_RUN(test_matmul_bf16_mode);
    TEST_RUN(test_matmul_q4_bf16_dot);
    TEST_RUN(test_matmul_gemm_k_blocks);
    TEST_RUN(test_matmul_int8_act);
    TEST_RUN(test_prepare_weight_rejects);
    TEST_RUN(test_embed);
    return test_summary();
}
