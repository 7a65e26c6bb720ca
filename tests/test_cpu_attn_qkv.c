/* Attention over a quantized KV cache on the CPU (cpu_attention.c,
 * kernels_avx512.c):
 *  - pt_cpu_qrows_ref dequantizes a cache row as the MLX format does
 *    (pt_mlx_dequantize_row: code·scale + bias, bits equal), for 2..8 bits;
 *  - the AVX-512 kernels attn_scores_tq and attn_pv_q give, bit for bit,
 *    the full-precision chains on those dequantized rows (a score: one f32
 *    fma chain over the dims in order; a P·V sum: one fma chain over the
 *    rows in order), for 4/8 bits, group sizes 32-128, head dims 32-256,
 *    f32 and bf16 parameters, GQA groups of 1-8 (the 4/2/1-head register
 *    blocks), 1-8 tokens a call and the keys cut into runs of 1, 15, 31, 33,
 *    63, 65 (their blocks and partial blocks), writing nothing past n;
 *  - the attention op over a quantized cache gives each token the same bits
 *    whether the token is one of a prefill call's or alone in a decode step
 *    (the tokens' grouping never changes a row), with every kernel table;
 *  - a long decode step split across threads (fewer KV heads than threads)
 *    gives the bits of one thread, full-precision and quantized caches.
 * The kernel checks are skipped without AVX-512. */
#include "test.h"
#include "test_rand.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"
#include "format/mlx_quant.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int avx512_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

#define GUARD 1e30f

/* n random quantized rows of hd values: codes, and scales / biases (spread
 * over octaves, signed biases) stored as dt */
typedef struct {
    uint8_t *codes;
    void *sc, *bi;
    pt_cpu_qrows r;
} qbuf;

static void qbuf_make(qbuf *b, int n, int hd, int bits, int gs, pt_ftype dt) {
    const size_t rb = (size_t)hd * bits / 8, ng = (size_t)(hd / gs), es = pt_ftype_size(dt);
    b->codes = malloc(rb * n + 64);
    b->sc = malloc(es * ng * n + 64);
    b->bi = malloc(es * ng * n + 64);
    for (size_t i = 0; i < rb * n; i++) b->codes[i] = (uint8_t)ru32();
    for (size_t i = 0; i < ng * n; i++) {
        const float s = ldexpf(rf(0.5f, 1.0f), (int)(i % 7) - 6), z = ldexpf(rf(-1.0f, 1.0f), (int)(i % 5) - 3);
        if (dt == PT_FT_BF16) ((uint16_t *)b->sc)[i] = pt_f32_to_bf16(s), ((uint16_t *)b->bi)[i] = pt_f32_to_bf16(z);
        else ((float *)b->sc)[i] = s, ((float *)b->bi)[i] = z;
    }
    b->r = (pt_cpu_qrows){b->codes, b->sc, b->bi, dt, bits, gs, hd};
}

static void qbuf_free(qbuf *b) { free(b->codes), free(b->sc), free(b->bi); }

/* The kernels' shapes: bits 4 and 8 × the head dims hds × the group sizes
 * 32..128 dividing them × f32 and bf16 parameters (at most 64) */
typedef struct {
    int bits, hd, gs;
    pt_ftype dt;
} qshape;

static int qshapes(qshape *out, const int *hds, int nhd) {
    int k = 0;
    for (int bits = 4; bits <= 8; bits += 4)
        for (int hi = 0; hi < nhd; hi++)
            for (int gs = 32; gs <= 128 && gs <= hds[hi] && hds[hi] % gs == 0; gs *= 2)
                for (int dti = 0; dti < 2; dti++) out[k++] = (qshape){bits, hds[hi], gs, dti ? PT_FT_BF16 : PT_FT_F32};
    return k;
}

/* n random rows of shape sh into b, and their values as pt_cpu_qrows_ref gives them */
static float *qbuf_rows(qbuf *b, int n, const qshape *sh) {
    qbuf_make(b, n, sh->hd, sh->bits, sh->gs, sh->dt);
    float *d = malloc(sizeof(float) * (size_t)n * sh->hd);
    pt_cpu_qrows_ref(d, &b->r, n);
    return d;
}

static const char *dtn(pt_ftype dt) { return dt == PT_FT_BF16 ? "bf16" : "f32"; }

static void test_qrows_ref_is_mlx_dequant(void) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    int rows = 0;
    for (int bi = 0; bi < 6; bi++)
        for (int dti = 0; dti < 2; dti++) {
            const int hd = 128, gs = 32, n = 5;
            const pt_ftype dt = dti ? PT_FT_BF16 : PT_FT_F32;
            qbuf b;
            qbuf_make(&b, n, hd, bits[bi], gs, dt);
            float got[5 * 128], want[128];
            pt_cpu_qrows_ref(got, &b.r, n);
            const size_t rb = (size_t)hd * bits[bi] / 8, ng = hd / gs, es = pt_ftype_size(dt);
            for (int j = 0; j < n; j++) {
                pt_mlx_dequantize_row((const uint32_t *)(b.codes + j * rb), (const char *)b.sc + j * ng * es,
                                      (const char *)b.bi + j * ng * es, dti ? PT_DTYPE_BF16 : PT_DTYPE_F32, bits[bi],
                                      gs, hd, want);
                CHECK(!memcmp(got + j * hd, want, sizeof want), "%d bits, %s parameters, row %d: not the MLX values",
                      bits[bi], dti ? "bf16" : "f32", j);
                rows++;
            }
            qbuf_free(&b);
        }
    CHECK(rows == 60, "checked %d rows", rows);
}

static void test_qscores_bits_and_cuts(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->attn_scores_tq != NULL, "the avx512 table has no attn_scores_tq");
    static const int hds[] = {32, 64, 128, 256}, Gs[] = {1, 2, 4, 6}, ntv[] = {1, 3, 8};
    static const int cuts[] = {0, 1, 15, 31, 33}; /* 0: the whole range in one call */
    const int n = 77, NT = 8;
    qshape sh[64];
    const int nsh = qshapes(sh, hds, 4);
    int cases = 0;
    for (int si = 0; si < nsh; si++) {
        const int hd = sh[si].hd, bits = sh[si].bits, gs = sh[si].gs;
        qbuf b;
        float *kd = qbuf_rows(&b, n, &sh[si]);
        for (int gi = 0; gi < 4; gi++) {
            const int G = Gs[gi];
            const int64_t qs = (int64_t)G * hd + 16, lds = n + 5;
            float *q = malloc(sizeof(float) * (size_t)qs * NT), *ref = malloc(sizeof(float) * NT * G * n);
            float *S = malloc(sizeof(float) * (size_t)NT * G * lds);
            for (int64_t i = 0; i < qs * NT; i++) q[i] = ldexpf(rf(-0.5f, 0.5f), (int)(i % 13) - 6);
            for (int u = 0; u < NT; u++)
                for (int g = 0; g < G; g++)
                    for (int j = 0; j < n; j++) {
                        float s = 0.0f;
                        for (int d = 0; d < hd; d++) s = fmaf(q[u * qs + g * hd + d], kd[j * hd + d], s);
                        ref[(u * G + g) * n + j] = s;
                    }
            for (int ni = 0; ni < 3; ni++)
                for (int ci = 0; ci < 5; ci++) {
                    const int nt = ntv[ni], step = cuts[ci] ? cuts[ci] : n;
                    for (int64_t i = 0; i < (int64_t)NT * G * lds; i++) S[i] = GUARD;
                    for (int u0 = 0; u0 < NT; u0 += nt) {
                        const int m = NT - u0 < nt ? NT - u0 : nt;
                        for (int j0 = 0; j0 < n; j0 += step) {
                            const pt_cpu_qrows kr = pt_cpu_qrows_at(&b.r, j0);
                            const int ok = k->attn_scores_tq(S + (int64_t)u0 * G * lds + j0, lds, q + u0 * qs, qs, m,
                                                             G, &kr, n - j0 < step ? n - j0 : step);
                            CHECK(ok, "%d bits, hd %d, gs %d: not handled", bits, hd, gs);
                        }
                    }
                    int bad = 0, outside = 0;
                    for (int row = 0; row < NT * G; row++) {
                        for (int j = 0; j < n; j++) bad += memcmp(&ref[row * n + j], &S[(int64_t)row * lds + j], 4) != 0;
                        for (int j = n; j < lds; j++) outside += S[(int64_t)row * lds + j] != GUARD;
                    }
                    CHECK(bad == 0 && outside == 0,
                          "%d bits, hd %d, gs %d, %s, G %d, nt %d, runs %d: %d scores differ from the chain, %d "
                          "written past n",
                          bits, hd, gs, dtn(sh[si].dt), G, nt, step, bad, outside);
                    cases++;
                }
            free(q), free(ref), free(S);
        }
        free(kd);
        qbuf_free(&b);
    }
    /* bits 2 × (hd 32: 1 gs, 64: 2, 128: 3, 256: 3) × 2 dtypes × 4 G × 3 nt × 5 cuts */
    CHECK(cases == 2 * 9 * 2 * 4 * 3 * 5, "ran %d cases", cases);
}

static void test_qpv_bits_and_cuts(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->attn_pv_q != NULL, "the avx512 table has no attn_pv_q");
    static const int hds[] = {32, 64, 96, 128, 256}, Gs[] = {1, 2, 3, 4, 8};
    static const int cuts[] = {0, 1, 15, 63, 65};
    const int n = 150;
    qshape sh[64];
    const int nsh = qshapes(sh, hds, 5);
    int cases = 0;
    for (int si = 0; si < nsh; si++) {
        const int hd = sh[si].hd, bits = sh[si].bits, gs = sh[si].gs;
        qbuf b;
        float *vd = qbuf_rows(&b, n, &sh[si]);
        for (int gi = 0; gi < 5; gi++) {
            const int G = Gs[gi];
            const int64_t ldp = n + 3;
            float *P = malloc(sizeof(float) * (size_t)G * ldp), *ref = malloc(sizeof(float) * G * hd);
            float *out = malloc(sizeof(float) * (size_t)(G * hd + 16)), *init = malloc(sizeof(float) * G * hd);
            for (int64_t i = 0; i < (int64_t)G * ldp; i++) P[i] = ldexpf(rf(0.0f, 1.0f), -(int)(i % 9));
            for (int i = 0; i < G * hd; i++) init[i] = rf(-1.0f, 1.0f);
            for (int g = 0; g < G; g++)
                for (int d = 0; d < hd; d++) {
                    float a = init[g * hd + d];
                    for (int j = 0; j < n; j++) a = fmaf(P[g * ldp + j], vd[j * hd + d], a);
                    ref[g * hd + d] = a;
                }
            for (int ci = 0; ci < 5; ci++) {
                const int step = cuts[ci] ? cuts[ci] : n;
                memcpy(out, init, sizeof(float) * G * hd);
                for (int i = 0; i < 16; i++) out[G * hd + i] = GUARD;
                for (int j0 = 0; j0 < n; j0 += step) {
                    const pt_cpu_qrows vr = pt_cpu_qrows_at(&b.r, j0);
                    CHECK(k->attn_pv_q(out, P + j0, ldp, G, &vr, n - j0 < step ? n - j0 : step),
                          "%d bits, hd %d, gs %d: not handled", bits, hd, gs);
                }
                int bad = 0, outside = 0;
                for (int i = 0; i < G * hd; i++) bad += memcmp(&ref[i], &out[i], 4) != 0;
                for (int i = 0; i < 16; i++) outside += out[G * hd + i] != GUARD;
                CHECK(bad == 0 && outside == 0,
                      "%d bits, hd %d, gs %d, %s, G %d, runs %d: %d sums differ from the chain, %d written past the "
                      "heads",
                      bits, hd, gs, dtn(sh[si].dt), G, step, bad, outside);
                cases++;
            }
            free(P), free(ref), free(out), free(init);
        }
        free(vd);
        qbuf_free(&b);
    }
    /* bits 2 × (hd 32: 1 group size, 64: 2, 96: 1, 128: 3, 256: 3) × 2 dtypes × 5 G × 5 cuts */
    CHECK(cases == 2 * 10 * 2 * 5 * 5, "ran %d cases", cases);
    /* shapes left to the generic loops */
    qbuf b;
    float out[64] = {0}, P[4] = {1, 1, 1, 1};
    qbuf_make(&b, 4, 64, 2, 32, PT_FT_F32);
    CHECK(k->attn_pv_q(out, P, 4, 1, &b.r, 4) == 0, "2-bit values handled");
    float S[4] = {GUARD, GUARD, GUARD, GUARD};
    CHECK(k->attn_scores_tq(S, 4, out, 64, 1, 1, &b.r, 4) == 0, "2-bit keys handled");
    CHECK(S[0] == GUARD, "a refused call wrote scores");
    qbuf_free(&b);
}

/* The op: a prefill call's tokens against the same tokens one decode step
 * each, over a quantized cache already holding every row (bits compared). */
static void test_attention_grouping_invariant(void) {
    static const pt_cpu_isa isas[] = {PT_ISA_SCALAR, PT_ISA_AVX2, PT_ISA_AVX512};
    static const struct {
        int bits, gs, hd, nh, nkv, window;
        float softcap;
    } cs[] = {{4, 64, 64, 8, 2, 0, 0}, {8, 32, 128, 8, 1, 0, 0}, {4, 32, 96, 6, 2, 0, 0},
              {4, 64, 64, 4, 2, 40, 0}, {8, 64, 64, 4, 4, 0, 30.0f}, {5, 32, 64, 4, 2, 0, 0}};
    int runs = 0;
    for (size_t ii = 0; ii < 3; ii++)
        for (int act = 0; act < 2; act++)
            for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
                pt_backend *be = NULL;
                pt_cpu_params cp = {.n_threads = 2, .act = act ? PT_ACT_BF16 : PT_ACT_F32, .isa = isas[ii]};
                if (pt_backend_cpu_create(&be, &cp) != PT_OK) continue;
                const int hd = cs[ci].hd, nh = cs[ci].nh, nkv = cs[ci].nkv, S = 90, T = 21, p0 = S - T;
                const int ng = hd / cs[ci].gs;
                const pt_ftype dt = act ? PT_FT_BF16 : PT_FT_F32;
                const size_t es = act ? 2 : 4, wb = (size_t)hd * cs[ci].bits / 8;
                pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = S, .dtype = dt, .bits = cs[ci].bits,
                                  .group_size = cs[ci].gs};
                kv.k = be->ops->alloc(be, wb * S * nkv), kv.v = be->ops->alloc(be, wb * S * nkv);
                kv.k_scales = be->ops->alloc(be, es * ng * S * nkv), kv.k_biases = be->ops->alloc(be, es * ng * S * nkv);
                kv.v_scales = be->ops->alloc(be, es * ng * S * nkv), kv.v_biases = be->ops->alloc(be, es * ng * S * nkv);
                float *K = malloc(sizeof(float) * S * nkv * hd), *V = malloc(sizeof(float) * S * nkv * hd);
                float *q = malloc(sizeof(float) * T * nh * hd), *o1 = malloc(sizeof(float) * T * nh * hd),
                      *o2 = malloc(sizeof(float) * T * nh * hd);
                fill_act(K, (int64_t)S * nkv * hd, -2, 2, act);
                fill_act(V, (int64_t)S * nkv * hd, -1, 1, act);
                fill_act(q, (int64_t)T * nh * hd, -1, 1, act);
                int32_t pos[90];
                for (int i = 0; i < S; i++) pos[i] = i;
                CHECK(be->ops->kv_append(be, &kv, K, V, S, pos) == PT_OK, "append: %s", pt_last_error());
                pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .window = cs[ci].window,
                             .softcap = cs[ci].softcap};
                CHECK(be->ops->attention(be, o1, q, T, pos + p0, &kv, &p) == PT_OK, "prefill: %s", pt_last_error());
                for (int t = 0; t < T; t++)
                    CHECK(be->ops->attention(be, o2 + (size_t)t * nh * hd, q + (size_t)t * nh * hd, 1, pos + p0 + t,
                                             &kv, &p) == PT_OK,
                          "step: %s", pt_last_error());
                int bad = 0;
                for (int i = 0; i < T * nh * hd; i++) bad += memcmp(&o1[i], &o2[i], 4) != 0;
                CHECK(bad == 0, "%s, %s, %d bits g%d hd %d heads %d/%d window %d softcap %g: %d of %d outputs differ",
                      pt_backend_cpu_isa_name(be), act ? "bf16" : "f32", cs[ci].bits, cs[ci].gs, hd, nh, nkv,
                      cs[ci].window, cs[ci].softcap, bad, T * nh * hd);
                runs++;
                void *bufs[] = {kv.k, kv.v, kv.k_scales, kv.k_biases, kv.v_scales, kv.v_biases};
                for (int i = 0; i < 6; i++) be->ops->dealloc(be, bufs[i]);
                free(K), free(V), free(q), free(o1), free(o2);
                pt_backend_free(&be);
            }
    CHECK(runs >= 12, "ran %d configurations", runs);
}

/* A decode step with fewer KV heads than threads over 2048+ keys splits its
 * scores, softmax and P·V across the threads (cpu_attention.c attn_split):
 * bits against one thread (which never splits), full-precision and quantized
 * caches, GQA groups of 1/2/4/5 (both score kernels), rings that wrapped,
 * windows, soft-cap. */
static void test_decode_split_bits(void) {
    static const struct {
        int bits, nh, nkv, hd, window, cap, pos;
        float softcap;
        int bf;
    } cs[] = {{0, 4, 1, 64, 0, 5000, 4100, 0, 1}, {0, 2, 1, 128, 0, 3000, 2999, 0, 0}, {0, 8, 2, 64, 0, 2600, 2500, 0, 1},
              {0, 5, 1, 64, 2300, 2400, 5000, 30.0f, 1}, {4, 4, 1, 64, 0, 4000, 3333, 0, 1},
              {8, 2, 1, 128, 0, 2500, 2400, 0, 1}, {4, 8, 2, 64, 2100, 2200, 4321, 0, 0}, {4, 1, 1, 96, 0, 2100, 2099, 0, 1}};
    int runs = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        pt_backend *b1 = NULL, *b3 = NULL;
        const pt_act_dtype act = cs[ci].bf ? PT_ACT_BF16 : PT_ACT_F32;
        pt_cpu_params p1 = {.n_threads = 1, .act = act}, p3 = {.n_threads = 3, .act = act};
        REQUIRE(pt_backend_cpu_create(&b1, &p1) == PT_OK && pt_backend_cpu_create(&b3, &p3) == PT_OK, "backends");
        const int hd = cs[ci].hd, nh = cs[ci].nh, nkv = cs[ci].nkv, cap = cs[ci].cap, bits = cs[ci].bits, gs = 32;
        const pt_ftype dt = cs[ci].bf ? PT_FT_BF16 : PT_FT_F32;
        const size_t es = cs[ci].bf ? 2 : 4;
        pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = cap, .dtype = dt, .bits = bits, .group_size = gs};
        const size_t rowb = bits ? (size_t)hd * bits / 8 : (size_t)hd * es, pb = bits ? es * (hd / gs) : 0;
        kv.k = malloc(rowb * cap * nkv), kv.v = malloc(rowb * cap * nkv);
        if (bits) {
            kv.k_scales = malloc(pb * cap * nkv), kv.k_biases = malloc(pb * cap * nkv);
            kv.v_scales = malloc(pb * cap * nkv), kv.v_biases = malloc(pb * cap * nkv);
        }
        /* the ring's rows as kv_append leaves them: the last `cap` positions up to pos */
        const int n_app = cs[ci].pos + 1 < cap ? cs[ci].pos + 1 : cap, p0 = cs[ci].pos + 1 - n_app;
        float *K = malloc(sizeof(float) * (size_t)n_app * nkv * hd), *V = malloc(sizeof(float) * (size_t)n_app * nkv * hd);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_app);
        fill_act(K, (int64_t)n_app * nkv * hd, -2, 2, cs[ci].bf);
        fill_act(V, (int64_t)n_app * nkv * hd, -1, 1, cs[ci].bf);
        for (int i = 0; i < n_app; i++) pos[i] = p0 + i;
        CHECK(b1->ops->kv_append(b1, &kv, K, V, n_app, pos) == PT_OK, "append: %s", pt_last_error());
        float *q = malloc(sizeof(float) * nh * hd), *o1 = malloc(sizeof(float) * nh * hd), *o3 = malloc(sizeof(float) * nh * hd);
        fill_act(q, (int64_t)nh * hd, -1, 1, cs[ci].bf);
        pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .window = cs[ci].window,
                     .softcap = cs[ci].softcap};
        const int32_t qp = cs[ci].pos;
        CHECK(b1->ops->attention(b1, o1, q, 1, &qp, &kv, &p) == PT_OK, "1 thread: %s", pt_last_error());
        CHECK(b3->ops->attention(b3, o3, q, 1, &qp, &kv, &p) == PT_OK, "3 threads: %s", pt_last_error());
        int bad = 0;
        for (int i = 0; i < nh * hd; i++) bad += memcmp(&o1[i], &o3[i], 4) != 0;
        CHECK(bad == 0, "case %zu (%d bits, %s, heads %d/%d of %d, window %d, ring %d at %d): %d of %d outputs differ",
              ci, bits, cs[ci].bf ? "bf16" : "f32", nh, nkv, hd, cs[ci].window, cap, qp, bad, nh * hd);
        runs++;
        free(kv.k), free(kv.v), free(kv.k_scales), free(kv.k_biases), free(kv.v_scales), free(kv.v_biases);
        free(K), free(V), free(pos), free(q), free(o1), free(o3);
        pt_backend_free(&b1), pt_backend_free(&b3);
    }
    CHECK(runs == 8, "ran %d cases", runs);
}

int main(void) {
    TEST_RUN(test_qrows_ref_is_mlx_dequant);
    TEST_RUN(test_qscores_bits_and_cuts);
    TEST_RUN(test_qpv_bits_and_cuts);
    TEST_RUN(test_attention_grouping_invariant);
    TEST_RUN(test_decode_split_bits);
    return test_summary();
}
