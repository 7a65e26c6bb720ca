/* The Gated DeltaNet ops of the CPU backend (conv1d_silu, delta_rule,
 * rms_norm_gated, copy_rows, sigmoid_mul) against references written here
 * in double precision from the formulas (architectures.md §9.2), on random
 * inputs:
 *   - the token-by-token delta rule equals the double-precision recurrence;
 *   - the chunked prefill (chunk 64, with a partial last chunk and a nonzero
 *     incoming state) equals the token-by-token recurrence, outputs and final
 *     state;
 *   - a sequence split over two calls equals one call (the state carries);
 *   - conv1d's rolling state: two calls equal one, bit for bit;
 *   - 1 and 2 threads give bit-identical results;
 *   - in bf16, fed transformers' own inputs (tests/fixtures/qwen3_5_text/
 *     trace.bin: prompt 3, layer 0, recorded by tools/oracle/trace_qwen35.py),
 *     conv1d_silu and rms_norm_gated reproduce transformers' bf16 outputs bit
 *     for bit and delta_rule (chunked and token by token) within one bf16 ulp
 *     at no more than 1 element in 1000 (f32 summation order): the rounding
 *     points of docs/qwen3_5.md, op by op. */
#include "test.h"

#include "backend/backend.h"
#include "golden.h"
#include "model/model.h"
#include "petrel.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rs = 12345u;
static float rnd(float lo, float hi) {
    rs = rs * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rs >> 8) / 16777216.0f;
}

static pt_backend *cpu(int threads) {
    pt_cpu_params p = {.n_threads = threads, .act = PT_ACT_F32, .isa = PT_ISA_AUTO};
    pt_backend *be = NULL;
    if (pt_backend_cpu_create(&be, &p) != PT_OK) return NULL;
    return be;
}

enum { HK = 2, HV = 4, DK = 16, DV = 12, T = 150 };
#define LD (2 * HK * DK + HV * DV)

typedef struct {
    float qkv[T * LD], b[T * HV], a[T * HV], A_log[HV], dt_bias[HV], S0[HV * DK * DV];
} inputs;

static void make_inputs(inputs *in) {
    for (int i = 0; i < T * LD; i++) in->qkv[i] = rnd(-1, 1);
    for (int i = 0; i < T * HV; i++) {
        in->b[i] = rnd(-3, 3);
        in->a[i] = rnd(-3, 3);
    }
    for (int h = 0; h < HV; h++) {
        in->A_log[h] = rnd(-1, 1);
        in->dt_bias[h] = rnd(-1, 1);
    }
    for (int i = 0; i < HV * DK * DV; i++) in->S0[i] = rnd(-0.5f, 0.5f);
}

static pt_delta params(const inputs *in, int chunk) {
    pt_delta d = {.n_k_heads = HK, .n_v_heads = HV, .k_dim = DK, .v_dim = DV, .q_scale = 1.0f / sqrtf((float)DK),
                  .A_log = in->A_log, .dt_bias = in->dt_bias, .chunk = chunk};
    return d;
}

/* The recurrence in double: out [T, HV·DV], S [HV, DK, DV] updated. */
static void ref_delta(const inputs *in, double *out, double *S) {
    for (int h = 0; h < HV; h++) {
        const int kh = h / (HV / HK);
        double *Sh = S + (size_t)h * DK * DV;
        for (int t = 0; t < T; t++) {
            const float *row = in->qkv + (size_t)t * LD;
            double q[DK], k[DK], nq = 0, nk = 0;
            for (int i = 0; i < DK; i++) {
                q[i] = row[kh * DK + i];
                k[i] = row[HK * DK + kh * DK + i];
                nq += q[i] * q[i];
                nk += k[i] * k[i];
            }
            for (int i = 0; i < DK; i++) {
                q[i] = q[i] / sqrt(nq + 1e-6) / sqrt((double)DK);
                k[i] = k[i] / sqrt(nk + 1e-6);
            }
            const float *v = row + 2 * HK * DK + h * DV;
            double beta = 1 / (1 + exp(-(double)in->b[t * HV + h]));
            double x = (double)in->a[t * HV + h] + in->dt_bias[h];
            double g = -exp((double)in->A_log[h]) * (x > 20 ? x : log1p(exp(x)));
            for (int i = 0; i < DK * DV; i++) Sh[i] *= exp(g);
            double delta[DV];
            for (int j = 0; j < DV; j++) {
                double m = 0;
                for (int i = 0; i < DK; i++) m += Sh[i * DV + j] * k[i];
                delta[j] = beta * (v[j] - m);
            }
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) Sh[i * DV + j] += k[i] * delta[j];
            for (int j = 0; j < DV; j++) {
                double o = 0;
                for (int i = 0; i < DK; i++) o += Sh[i * DV + j] * q[i];
                out[(size_t)t * HV * DV + h * DV + j] = o;
            }
        }
    }
}

static double max_rel(const float *a, const double *b, size_t n) {
    double md = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - b[i]));
        mx = fmax(mx, fabs(b[i]));
    }
    return md / (mx > 0 ? mx : 1);
}

static void test_delta_rule(void) {
    static inputs in;
    make_inputs(&in);
    pt_backend *be = cpu(1), *be2 = cpu(2);
    REQUIRE(be && be2, "CPU backend");
    static double ro[T * HV * DV], rS[HV * DK * DV];
    for (int i = 0; i < HV * DK * DV; i++) rS[i] = in.S0[i];
    ref_delta(&in, ro, rS);
    static float o_tok[T * HV * DV], S_tok[HV * DK * DV], o_chk[T * HV * DV], S_chk[HV * DK * DV];
    static float o_2[T * HV * DV], S_2[HV * DK * DV], o_sp[T * HV * DV], S_sp[HV * DK * DV];
    /* token by token */
    memcpy(S_tok, in.S0, sizeof S_tok);
    pt_delta d0 = params(&in, 0), d64 = params(&in, 64);
    CHECK(be->ops->delta_rule(be, o_tok, in.qkv, in.b, in.a, T, S_tok, &d0) == PT_OK, "delta_rule");
    double eo = max_rel(o_tok, ro, T * HV * DV), es = max_rel(S_tok, rS, HV * DK * DV);
    printf("MEASURE deltanet recurrence vs double: output %.3g, state %.3g (relative to the largest)\n", eo, es);
    CHECK(eo < 1e-5 && es < 1e-5, "recurrence vs double reference: %.3g / %.3g", eo, es);
    /* chunked, 64 + 64 + 22 rows */
    memcpy(S_chk, in.S0, sizeof S_chk);
    CHECK(be->ops->delta_rule(be, o_chk, in.qkv, in.b, in.a, T, S_chk, &d64) == PT_OK, "delta_rule chunked");
    eo = max_rel(o_chk, ro, T * HV * DV);
    es = max_rel(S_chk, rS, HV * DK * DV);
    double eto = 0, ets = 0, mo = 0, ms = 0;
    for (int i = 0; i < T * HV * DV; i++) {
        eto = fmax(eto, fabs(o_chk[i] - o_tok[i]));
        mo = fmax(mo, fabs(o_tok[i]));
    }
    for (int i = 0; i < HV * DK * DV; i++) {
        ets = fmax(ets, fabs(S_chk[i] - S_tok[i]));
        ms = fmax(ms, fabs(S_tok[i]));
    }
    printf("MEASURE deltanet chunked (64) vs token by token: output %.3g, state %.3g; vs double %.3g / %.3g\n",
           eto / mo, ets / ms, eo, es);
    CHECK(eto <= 1e-5 * mo && ets <= 1e-5 * ms, "chunked vs recurrence: %.3g / %.3g", eto / mo, ets / ms);
    CHECK(eo < 1e-5 && es < 1e-5, "chunked vs double reference: %.3g / %.3g", eo, es);
    /* two calls (100 + 50 tokens) equal one */
    const int T1 = 100;
    memcpy(S_sp, in.S0, sizeof S_sp);
    CHECK(be->ops->delta_rule(be, o_sp, in.qkv, in.b, in.a, T1, S_sp, &d64) == PT_OK, "first part");
    CHECK(be->ops->delta_rule(be, o_sp + T1 * HV * DV, in.qkv + T1 * LD, in.b + T1 * HV, in.a + T1 * HV, T - T1,
                              S_sp, &d64) == PT_OK,
          "second part");
    eo = max_rel(o_sp, ro, T * HV * DV);
    es = max_rel(S_sp, rS, HV * DK * DV);
    CHECK(eo < 1e-5 && es < 1e-5, "split chunked calls vs double reference: %.3g / %.3g", eo, es);
    /* threads: bit-identical, both forms */
    for (int k = 0; k < 2; k++) {
        const pt_delta *d = k ? &d64 : &d0;
        memcpy(S_2, in.S0, sizeof S_2);
        CHECK(be2->ops->delta_rule(be2, o_2, in.qkv, in.b, in.a, T, S_2, d) == PT_OK, "delta_rule, 2 threads");
        CHECK(!memcmp(o_2, k ? o_chk : o_tok, sizeof o_2) && !memcmp(S_2, k ? S_chk : S_tok, sizeof S_2),
              "%s: 1 vs 2 threads differ", k ? "chunked" : "token by token");
    }
    pt_backend_free(&be);
    pt_backend_free(&be2);
}

static void test_conv1d(void) {
    enum { C = 40, K = 4, TT = 9 };
    static float x[TT * C], w[C * K], st[(K - 1) * C], st0[(K - 1) * C], y[TT * C], y2[TT * C], st2[(K - 1) * C];
    for (int i = 0; i < TT * C; i++) x[i] = rnd(-2, 2);
    for (int i = 0; i < C * K; i++) w[i] = rnd(-1, 1);
    for (int i = 0; i < (K - 1) * C; i++) st0[i] = rnd(-2, 2);
    pt_backend *be = cpu(1);
    REQUIRE(be, "CPU backend");
    memcpy(st, st0, sizeof st);
    CHECK(be->ops->conv1d_silu(be, y, x, TT, C, K, w, PT_FT_F32, st) == PT_OK, "conv1d_silu");
    double md = 0;
    for (int t = 0; t < TT; t++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int j = 0; j < K; j++) {
                int r = t + j - (K - 1); /* row of X = [state; x] relative to x */
                double xv = r < 0 ? st0[(r + K - 1) * C + c] : x[r * C + c];
                s += (double)w[c * K + j] * xv;
            }
            md = fmax(md, fabs(y[t * C + c] - s / (1 + exp(-s))));
        }
    CHECK(md < 1e-5, "conv1d_silu vs reference: max|Δ| %.3g", md);
    for (int j = 0; j < K - 1; j++)
        for (int c = 0; c < C; c++)
            CHECK(st[j * C + c] == x[(TT - (K - 1) + j) * C + c], "state row %d channel %d: the last inputs", j, c);
    /* two calls (4 + 5 tokens) equal one, bit for bit */
    memcpy(st2, st0, sizeof st2);
    CHECK(be->ops->conv1d_silu(be, y2, x, 4, C, K, w, PT_FT_F32, st2) == PT_OK, "first part");
    CHECK(be->ops->conv1d_silu(be, y2 + 4 * C, x + 4 * C, TT - 4, C, K, w, PT_FT_F32, st2) == PT_OK, "second part");
    CHECK(!memcmp(y, y2, sizeof y) && !memcmp(st, st2, sizeof st), "conv1d over two calls differs from one call");
    pt_backend_free(&be);
}

static void test_gated_norm_and_gate(void) {
    enum { R = 6, D = 16 };
    float x[R * D], z[R * D], w[D], y[R * D], c[R * 2 * D], q[R * D];
    for (int i = 0; i < R * D; i++) {
        x[i] = rnd(-2, 2);
        z[i] = rnd(-3, 3);
    }
    for (int i = 0; i < D; i++) w[i] = rnd(0.5f, 1.5f);
    pt_backend *be = cpu(1);
    REQUIRE(be, "CPU backend");
    CHECK(be->ops->rms_norm_gated(be, y, x, z, R, D, w, PT_FT_F32, 1e-6f) == PT_OK, "rms_norm_gated");
    double md = 0;
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        double inv = 1 / sqrt(ss / D + 1e-6);
        for (int i = 0; i < D; i++) {
            double zz = z[r * D + i];
            md = fmax(md, fabs(y[r * D + i] - x[r * D + i] * inv * w[i] * zz / (1 + exp(-zz))));
        }
    }
    CHECK(md < 1e-5, "rms_norm_gated vs reference: %.3g", md);
    /* [q | gate] rows split, then q·σ(gate) */
    for (int i = 0; i < R * 2 * D; i++) c[i] = rnd(-3, 3);
    CHECK(be->ops->copy_rows(be, q, D, c + D, 2 * D, R, D) == PT_OK, "copy_rows");
    int same = 1;
    for (int r = 0; r < R; r++) same &= !memcmp(q + r * D, c + r * 2 * D + D, D * sizeof(float));
    CHECK(same, "copy_rows took the wrong elements");
    CHECK(be->ops->sigmoid_mul(be, y, x, q, R * D) == PT_OK, "sigmoid_mul");
    md = 0;
    for (int i = 0; i < R * D; i++) md = fmax(md, fabs(y[i] - x[i] / (1 + exp(-(double)q[i]))));
    CHECK(md < 1e-6, "sigmoid_mul vs reference: %.3g", md);
    pt_backend_free(&be);
}

/* bf16 ulps between two bf16-representable floats (large if signs differ) */
static long ulps_bf16(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    if ((x ^ y) & 0x80000000u) return a == b ? 0 : 1L << 20;
    long d = (long)(x >> 16) - (long)(y >> 16);
    return d < 0 ? -d : d;
}

/* elements of ours that differ from ref, and the largest distance in ulps */
static void count_diff(const float *ours, const float *ref, int64_t n, long *differ, long *worst) {
    *differ = *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        long u = ulps_bf16(ours[i], ref[i]);
        if (u) (*differ)++;
        if (u > *worst) *worst = u;
    }
}

static void test_reference_bf16(void) {
    char err[512];
    golden *g = golden_open("tests/fixtures/qwen3_5_text/trace.bin", err, sizeof err);
    if (!g) TEST_SKIP("%s", err);
    pt_model_params mp = pt_model_default_params();
    mp.dtype = PT_COMPUTE_BF16;
    mp.n_threads = 1;
    mp.device = PT_DEVICE_CPU;
    pt_model *m = NULL;
    REQUIRE(pt_model_load("tests/fixtures/qwen3_5_text", &mp, &m) == PT_OK, "load: %s", pt_last_error());
    const pt_layer *L = &m->net.layers[0];
    const golden_array *qkv = golden_find(g, "l0.qkv"), *conv = golden_find(g, "l0.conv"),
                       *b = golden_find(g, "l0.b"), *a = golden_find(g, "l0.a"), *z = golden_find(g, "l0.z"),
                       *core = golden_find(g, "l0.core"), *gn = golden_find(g, "l0.gnorm");
    REQUIRE(L->is_linear && qkv && conv && b && a && z && core && gn, "layer 0 and the trace arrays");
    const int64_t C = L->lin_conv_dim, T = qkv->count / C;
    const int Hv = L->delta.n_v_heads, Dv = L->delta.v_dim;
    REQUIRE(qkv->count == T * C && conv->count == T * C && b->count == T * Hv && core->count == T * Hv * Dv &&
                z->count == T * Hv * Dv && gn->count == T * Hv * Dv,
            "trace shapes (T %lld, conv_dim %lld)", (long long)T, (long long)C);
    pt_backend *be = m->be;
    float *y = calloc((size_t)(T * C), sizeof(float)), *st = calloc((size_t)(L->lin_K * C), sizeof(float));
    float *o = calloc((size_t)(T * Hv * Dv), sizeof(float));
    float *S = calloc((size_t)Hv * L->delta.k_dim * Dv, sizeof(float));
    long differ, worst;
    /* conv1d + SiLU from a zero state */
    CHECK(be->ops->conv1d_silu(be, y, qkv->f32, T, C, L->lin_K, L->lin_conv, m->net.norm_type, st) == PT_OK,
          "conv1d_silu");
    count_diff(y, conv->f32, T * C, &differ, &worst);
    printf("MEASURE deltanet bf16 vs transformers: conv1d_silu %ld of %lld elements differ (max %ld ulp)\n", differ,
           (long long)(T * C), worst);
    CHECK(differ == 0, "conv1d_silu: %ld elements differ from transformers' bf16 values", differ);
    /* the delta rule on transformers' conv output, b and a */
    for (int chunk = 64; chunk >= 0; chunk -= 64) {
        pt_delta d = L->delta;
        d.chunk = chunk;
        memset(S, 0, sizeof(float) * (size_t)Hv * d.k_dim * Dv);
        CHECK(be->ops->delta_rule(be, o, conv->f32, b->f32, a->f32, T, S, &d) == PT_OK, "delta_rule");
        count_diff(o, core->f32, T * Hv * Dv, &differ, &worst);
        printf("MEASURE deltanet bf16 vs transformers: delta_rule %s %ld of %lld elements differ (max %ld ulp)\n",
               chunk ? "chunked" : "token by token", differ, (long long)(T * Hv * Dv), worst);
        CHECK(worst <= 1 && differ * 1000 <= T * Hv * Dv,
              "delta_rule (%s): %ld elements differ from transformers' bf16 values, up to %ld ulp",
              chunk ? "chunked" : "token by token", differ, worst);
    }
    /* the gated norm on transformers' delta-rule output and z */
    CHECK(be->ops->rms_norm_gated(be, o, core->f32, z->f32, T * Hv, Dv, L->lin_norm, m->net.norm_type, m->net.eps) ==
              PT_OK,
          "rms_norm_gated");
    count_diff(o, gn->f32, T * Hv * Dv, &differ, &worst);
    printf("MEASURE deltanet bf16 vs transformers: rms_norm_gated %ld of %lld elements differ (max %ld ulp)\n",
           differ, (long long)(T * Hv * Dv), worst);
    CHECK(differ == 0, "rms_norm_gated: %ld elements differ from transformers' bf16 values", differ);
    free(y);
    free(st);
    free(o);
    free(S);
    pt_model_free(&m);
    golden_close(g);
}

int main(void) {
    TEST_RUN(test_delta_rule);
    TEST_RUN(test_conv1d);
    TEST_RUN(test_gated_norm_and_gate);
    TEST_RUN(test_reference_bf16);
    return test_summary();
}
