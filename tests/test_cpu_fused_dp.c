/* --fused-decode-attn's factored products on vdpbf16ps (kernels_avx512.c
 * fused_scores_dp / fused_pv_dp, with pt_cpu_fq_prep's query operands),
 * against the same sums in double over the same operands:
 *  - scores: S[g][j] = Σ_b sc_jb·Σ_{e∈b} q_ge·c_je + bi_jb·Σ_{e∈b} q_ge for
 *    4- and 8-bit codes, groups of 32-128, heads of 32-512 dims, 1-8 and 12
 *    query heads (the 8/4/2/1-head blocks), 1-130 keys (the transposes'
 *    16-key sets and partial sets), nothing written past n in any row;
 *  - P·V: out[g][e] += Σ_j bf16(P_gj·sc_jb)·c_je + P_gj·bi_jb (out's
 *    previous values kept), odd and partial key blocks, zero probabilities.
 * The kernels' error is f32 rounding only: within 4e-6 of the sum of the
 * terms' magnitudes (the 128 + code operands included); a dim, key, group or
 * nibble taken from the wrong place is off by about a code step times a
 * scale, tens of thousands of times that. Then the attention op with the
 * lever on takes these kernels (path counter) and stays within the fused
 * kernel's bound of the exact path (tests/test_kv_fused.c has the rest).
 * Skipped without AVX512-BF16. */
#include "test.h"
#include "test_rand.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 1e30f

typedef struct {
    int bits, gs, hd;
    int64_t n;
    uint8_t *codes;
    uint16_t *sc, *bi; /* bf16 [n, ng] */
} qrows_buf;

static void make_rows(qrows_buf *r, int bits, int gs, int hd, int64_t n) {
    const int ng = hd / gs;
    r->bits = bits, r->gs = gs, r->hd = hd, r->n = n;
    r->codes = malloc((size_t)n * hd * bits / 8 + 64);
    r->sc = malloc(sizeof(uint16_t) * (size_t)n * ng);
    r->bi = malloc(sizeof(uint16_t) * (size_t)n * ng);
    for (int64_t i = 0; i < n * hd * bits / 8 + 64; i++) r->codes[i] = (uint8_t)ru32();
    for (int64_t i = 0; i < n * ng; i++) {
        r->sc[i] = pt_f32_to_bf16(rf(0.002f, 0.2f) / (bits == 4 ? 1.0f : 16.0f));
        r->bi[i] = pt_f32_to_bf16(rf(-1.0f, 1.0f));
    }
}
static void free_rows(qrows_buf *r) { free(r->codes), free(r->sc), free(r->bi); }

static pt_cpu_qrows view(const qrows_buf *r) {
    return (pt_cpu_qrows){r->codes, r->sc, r->bi, PT_FT_BF16, r->bits, r->gs, r->hd};
}

/* code of value e of row j (MLX packing: value i at bits i·bits of the little-endian words) */
static int code_at(const qrows_buf *r, int64_t j, int e) {
    const uint8_t *row = r->codes + (size_t)j * r->hd * r->bits / 8;
    return r->bits == 8 ? row[e] : (row[e / 2] >> (4 * (e % 2))) & 15;
}

static void test_scores(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->fused_scores_dp != NULL, "the avx512 table has no fused_scores_dp");
    static const int shapes[][3] = {{4, 32, 32}, {4, 64, 64}, {4, 32, 64}, {4, 64, 128}, {4, 128, 128}, {4, 32, 96},
                                    {4, 64, 256}, {4, 64, 512}, {8, 32, 32}, {8, 64, 64}, {8, 32, 96}, {8, 64, 128},
                                    {8, 128, 256}};
    static const int Gs[] = {1, 2, 3, 4, 7, 8, 12};
    static const int64_t ns[] = {1, 15, 16, 17, 33, 64, 100, 130};
    int cases = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++) {
                const int bits = shapes[si][0], gs = shapes[si][1], hd = shapes[si][2], G = Gs[gi], ng = hd / gs;
                const int64_t n = ns[ni], lds = n + 3;
                const float K = bits == 4 ? 128.0f : 2176.0f;
                qrows_buf r;
                make_rows(&r, bits, gs, hd, n);
                float *q = malloc(sizeof(float) * (size_t)G * hd), *S = malloc(sizeof(float) * (size_t)G * lds);
                uint32_t *qp = malloc(sizeof(uint32_t) * (size_t)G * hd);
                float *qs = malloc(sizeof(float) * (size_t)G * ng);
                for (int i = 0; i < G * hd; i++) q[i] = pt_round_bf16(rf(-1.0f, 1.0f));
                for (int64_t i = 0; i < G * lds; i++) S[i] = GUARD;
                pt_cpu_fq_prep(qp, qs, q, G, hd, bits, gs);
                const pt_cpu_qrows v = view(&r);
                REQUIRE(k->fused_scores_dp(S, lds, qp, qs, G, &v, n), "%d-bit g%d hd %d not handled", bits, gs, hd);
                int bad = 0, over = 0;
                double worst = 0;
                for (int g = 0; g < G; g++) {
                    for (int64_t j = 0; j < n; j++) {
                        double ref = 0, mag = 0;
                        for (int b = 0; b < ng; b++) {
                            const double s = pt_bf16_to_f32(r.sc[j * ng + b]), z = pt_bf16_to_f32(r.bi[j * ng + b]);
                            double dq = 0, sq = 0, aq = 0;
                            for (int e = b * gs; e < (b + 1) * gs; e++) {
                                const double x = q[g * hd + e];
                                dq += x * code_at(&r, j, e), sq += x, aq += fabs(x);
                            }
                            ref += s * dq + z * sq;
                            mag += aq * (fabs(s) * (K + (bits == 4 ? 15 : 255)) + fabs(z));
                        }
                        const double d = fabs(ref - S[g * lds + j]);
                        if (d / mag > worst) worst = d / mag;
                        bad += !(d <= 4e-6 * mag);
                    }
                    for (int64_t j = n; j < lds; j++) over += S[g * lds + j] != GUARD;
                }
                CHECK(bad == 0 && over == 0,
                      "%d-bit g%d hd %d, G %d, %lld keys: %d scores off (worst %.3g of the magnitudes), %d written "
                      "past n",
                      bits, gs, hd, G, (long long)n, bad, worst, over);
                free(q), free(S), free(qp), free(qs);
                free_rows(&r);
                cases++;
                if (test_failed_current) return;
            }
    printf("INFO fused_scores_dp: %d cases against the double sums\n", cases);
}

static void test_pv(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->fused_pv_dp != NULL, "the avx512 table has no fused_pv_dp");
    static const int shapes[][3] = {{4, 32, 32}, {4, 64, 64}, {4, 32, 64}, {4, 64, 128}, {4, 128, 128}, {4, 32, 96},
                                    {4, 64, 256}, {8, 32, 32}, {8, 64, 64}, {8, 32, 96}, {8, 64, 128}, {8, 128, 512}};
    static const int Gs[] = {1, 2, 3, 4, 5, 8, 12};
    static const int64_t ns[] = {1, 2, 15, 16, 17, 31, 33, 64, 77, 128};
    int cases = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++) {
                const int bits = shapes[si][0], gs = shapes[si][1], hd = shapes[si][2], G = Gs[gi], ng = hd / gs;
                const int64_t n = ns[ni], ldp = n + 5;
                const float K = bits == 4 ? 128.0f : 0.0f; /* the operands' offset: 128 + nibble, or the byte */
                qrows_buf r;
                make_rows(&r, bits, gs, hd, n);
                float *P = malloc(sizeof(float) * (size_t)G * ldp), *out = malloc(sizeof(float) * (size_t)G * hd),
                      *out0 = malloc(sizeof(float) * (size_t)G * hd);
                for (int64_t i = 0; i < G * ldp; i++) P[i] = ru32() % 7 == 0 ? 0.0f : expf(rf(-12.0f, 0.0f));
                for (int i = 0; i < G * hd; i++) out0[i] = out[i] = rf(-2.0f, 2.0f);
                const pt_cpu_qrows v = view(&r);
                REQUIRE(k->fused_pv_dp(out, P, ldp, G, &v, n), "%d-bit g%d hd %d not handled", bits, gs, hd);
                int bad = 0;
                double worst = 0;
                for (int g = 0; g < G; g++)
                    for (int e = 0; e < hd; e++) {
                        const int b = e / gs;
                        double ref = out0[g * hd + e], mag = fabs(ref);
                        for (int64_t j = 0; j < n; j++) {
                            const float p = P[g * ldp + j], s = pt_bf16_to_f32(r.sc[j * ng + b]),
                                        z = pt_bf16_to_f32(r.bi[j * ng + b]);
                            const double w = pt_bf16_to_f32(pt_f32_to_bf16(p * s));
                            ref += w * code_at(&r, j, e) + (double)p * z;
                            mag += fabs(w) * (K + (bits == 4 ? 15 : 255)) + fabs((double)p * z);
                        }
                        const double d = fabs(ref - out[g * hd + e]);
                        if (d / mag > worst) worst = d / mag;
                        bad += !(d <= 4e-6 * mag);
                    }
                CHECK(bad == 0, "%d-bit g%d hd %d, G %d, %lld keys: %d outputs off (worst %.3g of the magnitudes)",
                      bits, gs, hd, G, (long long)n, bad, worst);
                free(P), free(out), free(out0);
                free_rows(&r);
                cases++;
                if (test_failed_current) return;
            }
    printf("INFO fused_pv_dp: %d cases against the double sums\n", cases);
}

/* The attention op: the fused lever on a 4-bit bf16 cache runs its blocks on
 * these kernels where attn_dp is on, and not where it is off; both stay
 * within tests/test_kv_fused.c's bf16 bound of the exact path. */
static void test_op_path(void) {
    if (!test_cpu_avx512_bf16()) TEST_SKIP("no AVX512-BF16");
    const int saved = pt_cpu_lever.attn_dp, nkv = 2, G = 4, nh = nkv * G, hd = 64, gs = 64, cap = 1300, pos = 1200;
    pt_backend *be = NULL;
    pt_cpu_params cp = {.n_threads = 2, .act = PT_ACT_BF16};
    REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "backend");
    pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = cap, .bits = 4, .group_size = gs, .dtype = PT_FT_BF16};
    const size_t rows = (size_t)nkv * cap;
    kv.k = malloc(rows * hd / 2), kv.v = malloc(rows * hd / 2);
    kv.k_scales = malloc(rows * 2), kv.k_biases = malloc(rows * 2), kv.v_scales = malloc(rows * 2),
    kv.v_biases = malloc(rows * 2);
    float *kr = malloc(sizeof(float) * nkv * hd), *vr = malloc(sizeof(float) * nkv * hd),
          *q = malloc(sizeof(float) * nh * hd), *o[3];
    for (int i = 0; i < 3; i++) o[i] = malloc(sizeof(float) * nh * hd);
    for (int32_t p = 0; p <= pos; p++) {
        for (int i = 0; i < nkv * hd; i++) kr[i] = rf(-2, 2), vr[i] = rf(-1, 1);
        REQUIRE(be->ops->kv_append(be, &kv, kr, vr, 1, &p) == PT_OK, "append: %s", pt_last_error());
    }
    for (int i = 0; i < nh * hd; i++) q[i] = pt_round_bf16(rf(-1.5f, 1.5f));
    pt_attn a = {.n_heads = nh, .head_dim = hd, .scale = 0.125f};
    int32_t p = pos;
    REQUIRE(be->ops->attention(be, o[0], q, 1, &p, &kv, &a) == PT_OK, "exact: %s", pt_last_error());
    a.fused_decode = 1;
    for (int on = 0; on < 2; on++) {
        pt_cpu_lever.attn_dp = on;
        const long c0 = pt_cpu_path_count[PT_CPU_PATH_FUSED_DP];
        REQUIRE(be->ops->attention(be, o[1 + on], q, 1, &p, &kv, &a) == PT_OK, "fused: %s", pt_last_error());
        const long runs = pt_cpu_path_count[PT_CPU_PATH_FUSED_DP] - c0;
        CHECK(on ? runs == (long)nkv * ((pos + PT_CPU_FUSED_BLOCK) / PT_CPU_FUSED_BLOCK) : runs == 0,
              "lever %d: %ld blocks on the factored kernels", on, runs);
        double md = 0, mo = 0;
        for (int i = 0; i < nh * hd; i++) {
            md = fmax(md, fabs((double)o[0][i] - o[1 + on][i]));
            mo = fmax(mo, fabs((double)o[0][i]));
        }
        printf("MEASURE fused-decode-attn bf16 4-bit g64 2x4 heads of 64, %d keys (blocks of %d), attn_dp %d: max|d| %.3g of max|out| "
               "%.3g vs exact\n",
               pos + 1, PT_CPU_FUSED_BLOCK, on, md, mo);
        CHECK(md <= 2e-2 * mo, "lever %d: fused vs exact %.3g of %.3g", on, md, mo);
    }
    CHECK(memcmp(o[1], o[2], sizeof(float) * nh * hd) != 0, "the factored kernels gave the other path's bits");
    pt_cpu_lever.attn_dp = saved;
    void *bufs[] = {kv.k, kv.v, kv.k_scales, kv.k_biases, kv.v_scales, kv.v_biases, kr, vr, q, o[0], o[1], o[2]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    pt_backend_free(&be);
}

int main(void) {
    TEST_RUN(test_scores);
    TEST_RUN(test_pv);
    TEST_RUN(test_op_path);
    return test_summary();
}
