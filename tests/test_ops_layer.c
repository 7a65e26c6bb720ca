/* Backend op tests, the ops of a layer other than matmul and embed: rms_norm,
 * rope, attention over full and quantized KV caches (and the conversion of a
 * cache to quantized), GLU and elementwise ops, MoE routing and the MoE FFN,
 * argmax; and 1 vs 2 vs 3 threads bit-identical. Each CPU implementation
 * against a plain C reference (computed in double, written here independently
 * of the backend), on random inputs and several shapes including odd sizes,
 * for every ISA this CPU supports (scalar, avx2, avx512), in f32 and bf16
 * activation modes. Tolerance per element: atol + rtol·|ref|; a NaN always
 * fails. Not matmul or embed (tests/test_ops.c); the shared helpers are in
 * tests/cpu_op_check.h. */
#include "cpu_op_check.h"

#include "base/error.h"
#include "format/mlx_quant.h"

#include <math.h>
#include <stdint.h>

/* ---- memory ---- */

/* The backend's allocations, heap-sized and mapped (256 KiB and more): 64-byte
 * aligned, zeroed (also a heap block reusing memory a freed block had
 * filled), writable to their last byte, and freed again. */
static void test_alloc(void) {
    static const size_t sizes[] = {0, 1, 64, 100000, (size_t)256 << 10, (size_t)3 << 20, (size_t)64 << 20};
    pt_backend *be = mk(1, PT_ACT_F32, PT_ISA_AUTO);
    REQUIRE(be, "backend");
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t n = sizes[i];
            uint8_t *p = be->ops->alloc(be, n);
            REQUIRE(p, "alloc %zu: %s", n, pt_last_error());
            CHECK(((uintptr_t)p & 63) == 0, "alloc %zu: not 64-byte aligned", n);
            int zero = 1;
            for (size_t j = 0; j < n; j += n > 4096 ? 4093 : 1) zero &= p[j] == 0;
            if (n) zero &= p[n - 1] == 0;
            CHECK(zero, "alloc %zu (round %d): not zeroed", n, round);
            if (n) memset(p, 0xa5, n); /* dirty it for the next round's heap blocks */
            be->ops->dealloc(be, p);
        }
    be->ops->dealloc(be, NULL);
    pt_backend_free(&be);
}

/* ---- rms_norm ---- */

static void test_rms_norm(void) {
    static const int64_t Ds[] = {1, 7, 64, 257};
    for (size_t ii = 0; ii < 3; ii++)
        for (int am = 0; am < 2; am++) {
            pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
            pt_backend *be = mk(2, act, all_isas[ii]);
            if (!be) continue;
            for (size_t di = 0; di < 4; di++)
                for (int style = 0; style < 4; style++)
                    for (int fused = 0; fused < 2; fused++) {
                        int64_t T = 3, D = Ds[di];
                        float *x = malloc(sizeof(float) * (size_t)(T * D)), *y = malloc(sizeof(float) * (size_t)(T * D));
                        float *res = malloc(sizeof(float) * (size_t)(T * D));
                        uint16_t *w = malloc(2 * (size_t)D);
                        double *ref = malloc(sizeof(double) * (size_t)(T * D));
                        double *rres = malloc(sizeof(double) * (size_t)(T * D));
                        fill_bf16vals(x, T * D, -2, 2);
                        fill_bf16vals(res, T * D, -2, 2);
                        for (int64_t i = 0; i < D; i++) w[i] = pt_f32_to_bf16(rf(-1.5f, 1.5f));
                        for (int64_t t = 0; t < T; t++) {
                            double ss = 0;
                            for (int64_t i = 0; i < D; i++) {
                                double v = x[t * D + i];
                                if (fused) v = rres[t * D + i] = rnd_act(act, (double)res[t * D + i] + v);
                                ss += v * v;
                            }
                            double inv = 1.0 / sqrt(ss / D + 1e-5);
                            for (int64_t i = 0; i < D; i++) {
                                double v = fused ? rres[t * D + i] : x[t * D + i], wi = pt_bf16_to_f32(w[i]);
                                double xn = v * inv;
                                ref[t * D + i] = style == PT_RMS_W       ? rnd_act(act, wi * rnd_act(act, xn))
                                                 : style == PT_RMS_W_F32 ? rnd_act(act, xn * wi)
                                                 : style == PT_RMS_1PW   ? rnd_act(act, xn * (1 + wi))
                                                                          : rnd_act(act, xn);
                            }
                        }
                        pt_status s = be->ops->rms_norm(be, y, x, fused ? res : NULL, T, D, w, PT_FT_BF16,
                                                        (pt_rms_style)style, 1e-5f);
                        char what[256];
                        snprintf(what, sizeof what, "%s rms_norm act=%d D=%lld style=%d fused=%d",
                                 pt_backend_cpu_isa_name(be), am, (long long)D, style, fused);
                        int ok = s == PT_OK && close_enough(what, y, ref, T * D, 1e-6, am ? 1.0 / 128 : 1e-5);
                        if (ok && fused) ok = close_enough("residual", res, rres, T * D, 1e-6, am ? 1.0 / 128 : 1e-6);
                        free(x), free(y), free(res), free(w), free(ref), free(rres);
                        if (!ok) {
                            pt_backend_free(&be);
                            return;
                        }
                    }
            pt_backend_free(&be);
        }
}

/* Prefill rows through the kernel table's 16-row RMSNorm (AVX-512:
 * rms_norm16) against each row alone (the scalar row loop), bit for bit:
 * 37 rows (two blocks of 16 and a tail of 5), every style, with and without
 * the residual, bf16 and f32 activations, f32 / bf16 / f16 weights, D on and
 * off the multiples of 16, a row of zeros and rows of large and tiny values;
 * 1 and 2 threads (the pool's chunks move the blocks). */
static void test_rms_norm_rows(void) {
    static const int64_t Ds[] = {7, 64, 257, 2048};
    static const pt_ftype wts[] = {PT_FT_BF16, PT_FT_F16, PT_FT_F32};
    enum { T = 37 };
    for (int am = 0; am < 2; am++)
        for (int nth = 1; nth <= 2; nth++) {
            pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
            pt_backend *be = mk(nth, act, PT_ISA_AVX512);
            if (!be) TEST_SKIP("no AVX-512");
            for (size_t di = 0; di < 4; di++)
                for (int style = 0; style < 4; style++)
                    for (int fused = 0; fused < 2; fused++) {
                        int64_t D = Ds[di];
                        pt_ftype wt = wts[(di + (size_t)style) % 3];
                        float *x = malloc(sizeof(float) * (size_t)(T * D)), *y = malloc(sizeof(float) * (size_t)(T * D));
                        float *y1 = malloc(sizeof(float) * (size_t)(T * D)), *res = malloc(sizeof(float) * (size_t)(T * D));
                        float *res1 = malloc(sizeof(float) * (size_t)(T * D)), *wf = malloc(sizeof(float) * (size_t)D);
                        uint16_t *wh = malloc(2 * (size_t)D);
                        fill_bf16vals(x, T * D, -2, 2);
                        fill_bf16vals(res, T * D, -2, 2);
                        for (int64_t i = 0; i < D; i++) x[5 * D + i] = res[5 * D + i] = 0.0f; /* sum of squares 0 */
                        for (int64_t i = 0; i < D; i++) x[20 * D + i] *= 3.0e18f, x[33 * D + i] *= 1.0e-19f;
                        for (int64_t i = 0; i < D; i++) {
                            wf[i] = rf(-1.5f, 1.5f);
                            wh[i] = wt == PT_FT_F16 ? pt_f32_to_f16(wf[i]) : pt_f32_to_bf16(wf[i]);
                        }
                        const void *w = wt == PT_FT_F32 ? (const void *)wf : (const void *)wh;
                        memcpy(res1, res, sizeof(float) * (size_t)(T * D));
                        pt_status s = be->ops->rms_norm(be, y, x, fused ? res : NULL, T, D, w, wt,
                                                        (pt_rms_style)style, 1e-5f);
                        for (int64_t t = 0; t < T && s == PT_OK; t++)
                            s = be->ops->rms_norm(be, y1 + t * D, x + t * D, fused ? res1 + t * D : NULL, 1, D, w,
                                                  wt, (pt_rms_style)style, 1e-5f);
                        int same = s == PT_OK && !memcmp(y, y1, sizeof(float) * (size_t)(T * D)) &&
                                   (!fused || !memcmp(res, res1, sizeof(float) * (size_t)(T * D)));
                        CHECK(same, "rms_norm rows: act=%d threads=%d D=%lld style=%d fused=%d wtype=%d: 37 rows "
                                    "differ from the rows alone", am, nth, (long long)D, style, fused, (int)wt);
                        free(x), free(y), free(y1), free(res), free(res1), free(wf), free(wh);
                        if (!same) {
                            pt_backend_free(&be);
                            return;
                        }
                    }
            pt_backend_free(&be);
        }
}

/* ---- rope ---- */

/* The attention references' softmax over the scores sc[lo..qp] (their
 * maximum m) and its p·V for one head: row out of head_dim hd, V's rows
 * [j][nkv][hd] at KV head kh; rounded to the activation dtype where the
 * backends round. */
static void ref_softmax_pv(double *sc, int lo, int qp, double m, const float *V, int nkv, int kh, int hd,
                           pt_act_dtype act, double *out) {
    double sum = 0;
    for (int j = lo; j <= qp; j++) sum += (sc[j] = exp(sc[j] - m));
    for (int j = lo; j <= qp; j++) sc[j] = rnd_act(act, sc[j] / sum);
    for (int i = 0; i < hd; i++) {
        double o = 0;
        for (int j = lo; j <= qp; j++) o += sc[j] * V[((size_t)j * nkv + kh) * hd + i];
        out[i] = rnd_act(act, o);
    }
}

static void test_rope(void) {
    static const int cfg[][3] = {{8, 8, 1}, {64, 64, 3}, {64, 16, 2}, {80, 80, 1}}; /* hd, rot, heads */
    for (int am = 0; am < 2; am++) {
        pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
        pt_backend *be = mk(2, act, PT_ISA_AUTO);
        REQUIRE(be, "backend");
        for (int ci = 0; ci < 4; ci++) {
            int hd = cfg[ci][0], rot = cfg[ci][1], nh = cfg[ci][2];
            int64_t T = 5;
            float inv[64];
            for (int i = 0; i < rot / 2; i++) inv[i] = (ci == 2 && i >= 4) ? 0.0f : powf(10000.0f, -2.0f * i / rot);
            pt_rope r = {.rot_dim = rot, .inv_freq = inv, .attn_scale = ci == 3 ? 1.25f : 1.0f};
            int32_t pos[5] = {0, 1, 7, 100, 4095};
            float *x = malloc(sizeof(float) * (size_t)(T * nh * hd));
            double *ref = malloc(sizeof(double) * (size_t)(T * nh * hd));
            fill_bf16vals(x, T * nh * hd, -2, 2);
            for (int64_t t = 0; t < T; t++)
                for (int h = 0; h < nh; h++) {
                    const float *v = x + (t * nh + h) * hd;
                    double *o = ref + (t * nh + h) * hd;
                    for (int i = 0; i < hd; i++) o[i] = v[i];
                    for (int i = 0; i < rot / 2; i++) {
                        float th = (float)pos[t] * inv[i];
                        double c = rnd_act(act, cos((double)th) * r.attn_scale),
                               s = rnd_act(act, sin((double)th) * r.attn_scale);
                        double a = v[i], b = v[i + rot / 2];
                        o[i] = rnd_act(act, rnd_act(act, a * c) + rnd_act(act, -b * s));
                        o[i + rot / 2] = rnd_act(act, rnd_act(act, b * c) + rnd_act(act, a * s));
                    }
                }
            REQUIRE(be->ops->rope(be, x, T, nh, hd, pos, &r) == PT_OK, "rope");
            char what[256];
            snprintf(what, sizeof what, "rope act=%d hd=%d rot=%d", am, hd, rot);
            /* f32 mode: cosf/sinf of large angles differ from the double reference by a few ulp */
            int ok = close_enough(what, x, ref, T * nh * hd, am ? 1e-2 : 2e-5, am ? 1.0 / 64 : 1e-5);
            free(x), free(ref);
            if (!ok) break;
        }
        pt_backend_free(&be);
    }
}

/* The AVX-512 kernel table's rope_rot against the scalar ISA's loop, bit for
 * bit: head dims and rotary widths on and off the multiples of 32 (half
 * widths 4, 20, 32, 64), bf16 and f32 activations, ±0, huge and tiny values
 * in x, 1 and 3 heads, positions up to 4095. */
static void test_rope_rows(void) {
    static const int cfg[][3] = {{8, 8, 1}, {64, 40, 3}, {64, 64, 3}, {128, 128, 1}}; /* hd, rot, heads */
    for (int am = 0; am < 2; am++) {
        pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
        pt_backend *bv = mk(2, act, PT_ISA_AVX512), *bs = mk(2, act, PT_ISA_SCALAR);
        if (!bv || !bs) {
            pt_backend_free(&bv);
            pt_backend_free(&bs);
            TEST_SKIP("no AVX-512");
        }
        for (int ci = 0; ci < 4; ci++) {
            int hd = cfg[ci][0], rot = cfg[ci][1], nh = cfg[ci][2];
            int64_t T = 37, n = T * nh * hd;
            float inv[64];
            for (int i = 0; i < rot / 2; i++) inv[i] = powf(500000.0f, -2.0f * i / rot);
            pt_rope r = {.rot_dim = rot, .inv_freq = inv, .attn_scale = ci == 1 ? 1.25f : 1.0f};
            int32_t pos[37];
            for (int t = 0; t < T; t++) pos[t] = t * 113 % 4096;
            float *x = malloc(sizeof(float) * (size_t)n), *xs = malloc(sizeof(float) * (size_t)n);
            fill_bf16vals(x, n, -2, 2);
            x[0] = 0.0f, x[rot / 2] = -0.0f, x[1] = -0.0f, x[1 + rot / 2] = 0.0f, x[hd + 2] = 3.0e30f, x[hd + 3] = -1.0e-30f;
            memcpy(xs, x, sizeof(float) * (size_t)n);
            REQUIRE(bv->ops->rope(bv, x, T, nh, hd, pos, &r) == PT_OK && bs->ops->rope(bs, xs, T, nh, hd, pos, &r) == PT_OK,
                    "rope");
            int same = !memcmp(x, xs, sizeof(float) * (size_t)n);
            CHECK(same, "rope act=%d hd=%d rot=%d heads=%d: the AVX-512 kernel differs from the scalar loop", am, hd,
                  rot, nh);
            free(x), free(xs);
        }
        pt_backend_free(&bv);
        pt_backend_free(&bs);
    }
}

/* ---- attention ---- */

typedef struct {
    int nh, nkv, hd, T, pos0, window;
    float softcap;
    pt_ftype dt;
    int ring; /* capacity = window + T - 1 + ring slack instead of the full length */
} attn_case;

static int run_attn_case(pt_backend *be, const attn_case *c, float *out_keep) {
    int nh = c->nh, nkv = c->nkv, hd = c->hd, T = c->T;
    int S = c->pos0 + T;
    int64_t cap = c->ring ? c->window + T - 1 + c->ring : S + 3;
    float *K = malloc(sizeof(float) * (size_t)S * nkv * hd), *Vv = malloc(sizeof(float) * (size_t)S * nkv * hd);
    float *q = malloc(sizeof(float) * (size_t)T * nh * hd), *out = malloc(sizeof(float) * (size_t)T * nh * hd);
    double *ref = malloc(sizeof(double) * (size_t)T * nh * hd);
    fill_bf16vals(K, (int64_t)S * nkv * hd, -1, 1);
    fill_bf16vals(Vv, (int64_t)S * nkv * hd, -1, 1);
    fill_bf16vals(q, (int64_t)T * nh * hd, -1, 1);
    pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = cap, .dtype = c->dt};
    size_t es = c->dt == PT_FT_F32 ? 4 : 2;
    kv.k = be->ops->alloc(be, es * (size_t)cap * nkv * hd);
    kv.v = be->ops->alloc(be, es * (size_t)cap * nkv * hd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(S));
    for (int i = 0; i < S; i++) pos[i] = i;
    /* history in chunks of 2, then this chunk */
    for (int p0 = 0; p0 < c->pos0; p0 += 2) {
        int n = c->pos0 - p0 < 2 ? c->pos0 - p0 : 2;
        be->ops->kv_append(be, &kv, K + (size_t)p0 * nkv * hd, Vv + (size_t)p0 * nkv * hd, n, pos + p0);
    }
    be->ops->kv_append(be, &kv, K + (size_t)c->pos0 * nkv * hd, Vv + (size_t)c->pos0 * nkv * hd, T, pos + c->pos0);
    pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .softcap = c->softcap,
                 .window = c->window};
    pt_status st = be->ops->attention(be, out, q, T, pos + c->pos0, &kv, &p);
    int ok = st == PT_OK;
    CHECK(ok, "attention: %s", pt_last_error());
    pt_act_dtype act = be->act;
    double *sc = malloc(sizeof(double) * (size_t)S);
    for (int t = 0; ok && t < T; t++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv), qp = c->pos0 + t;
            int lo = c->window && qp - c->window + 1 > 0 ? qp - c->window + 1 : 0;
            double m = -INFINITY;
            for (int j = lo; j <= qp; j++) {
                double s = 0;
                for (int i = 0; i < hd; i++) s += (double)q[(t * nh + h) * hd + i] * K[((size_t)j * nkv + kh) * hd + i];
                s = rnd_act(act, rnd_act(act, s) * p.scale);
                if (c->softcap > 0) s = rnd_act(act, rnd_act(act, tanh(rnd_act(act, s / c->softcap))) * c->softcap);
                sc[j] = s;
                if (s > m) m = s;
            }
            ref_softmax_pv(sc, lo, qp, m, Vv, nkv, kh, hd, act, ref + (t * nh + h) * hd);
        }
    if (ok) {
        char what[256];
        snprintf(what, sizeof what, "%s attn nh=%d nkv=%d hd=%d T=%d pos0=%d win=%d cap=%d dt=%s act=%d",
                 pt_backend_cpu_isa_name(be), nh, nkv, hd, T, c->pos0, c->window, c->softcap > 0,
                 pt_ftype_name(c->dt), act);
        ok = close_enough(what, out, ref, (int64_t)T * nh * hd, act ? 2e-2 : 2e-6, act ? 1.0 / 64 : 1e-5);
    }
    if (out_keep) memcpy(out_keep, out, sizeof(float) * (size_t)T * nh * hd);
    be->ops->dealloc(be, kv.k);
    be->ops->dealloc(be, kv.v);
    free(K), free(Vv), free(q), free(out), free(ref), free(pos), free(sc);
    return ok;
}

static const attn_case attn_cases[] = {
    {4, 4, 8, 1, 0, 0, 0, PT_FT_F32, 0},      {8, 2, 64, 1, 37, 0, 0, PT_FT_BF16, 0},
    {6, 1, 80, 5, 0, 0, 0, PT_FT_F32, 0},     {8, 2, 64, 7, 9, 0, 0, PT_FT_BF16, 0},
    {4, 2, 32, 6, 11, 4, 0, PT_FT_F32, 1},    {4, 2, 32, 1, 40, 5, 50.0f, PT_FT_BF16, 0},
    {2, 1, 16, 3, 20, 6, 30.0f, PT_FT_F32, 0}, {8, 8, 128, 3, 64, 0, 0, PT_FT_BF16, 0},
};

/* Runs case ci of an attention test on a backend; 0 ends the test. */
typedef int (*case_fn)(pt_backend *be, size_t ci);

/* Every case on two threads, for each ISA and both activation modes (the
 * ISAs the machine lacks skipped); stops at the first failing case. */
static void run_on_backends(case_fn run, size_t n) {
    for (size_t ii = 0; ii < 3; ii++)
        for (int am = 0; am < 2; am++) {
            pt_backend *be = mk(2, am ? PT_ACT_BF16 : PT_ACT_F32, all_isas[ii]);
            if (!be) continue;
            for (size_t ci = 0; ci < n; ci++)
                if (!run(be, ci)) {
                    pt_backend_free(&be);
                    return;
                }
            pt_backend_free(&be);
        }
}

static int attn_case_at(pt_backend *be, size_t ci) { return run_attn_case(be, &attn_cases[ci], NULL); }

static void test_attention(void) { run_on_backends(attn_case_at, sizeof attn_cases / sizeof attn_cases[0]); }

static void test_attention_errors(void) {
    pt_backend *be = mk(1, PT_ACT_F32, PT_ISA_AUTO);
    REQUIRE(be, "backend");
    float buf[64] = {0}, out[64];
    pt_kv_layer kv = {.n_kv = 1, .head_dim = 8, .capacity = 2, .dtype = PT_FT_F32, .k = buf, .v = buf};
    pt_attn p = {.n_heads = 1, .head_dim = 8, .scale = 1};
    int32_t pos[1] = {5};
    CHECK(be->ops->attention(be, out, buf, 1, pos, &kv, &p) == PT_ERR_RANGE, "window exceeds the ring");
    /* a ring of window + chunk - 2 rows: the chunk's last row overwrote a key its first query needs */
    int32_t pos3[3] = {10, 11, 12};
    float q3[24] = {0}, out3[24];
    pt_kv_layer ring = {.n_kv = 1, .head_dim = 8, .capacity = 4, .dtype = PT_FT_F32, .k = buf, .v = buf};
    pt_attn pw = {.n_heads = 1, .head_dim = 8, .scale = 1, .window = 3};
    CHECK(be->ops->attention(be, out3, q3, 3, pos3, &ring, &pw) == PT_ERR_RANGE, "ring too small for the chunk");
    ring.capacity = 5;
    CHECK(be->ops->attention(be, out3, q3, 3, pos3, &ring, &pw) == PT_OK, "ring of window + chunk - 1: %s",
          pt_last_error());
    kv.capacity = 8;
    kv.bits = 7;
    kv.group_size = 8;
    CHECK(be->ops->attention(be, out, buf, 1, pos, &kv, &p) == PT_ERR_UNSUPPORTED, "7-bit KV reports unsupported");
    pt_backend_free(&be);
}

/* ---- quantized KV ---- */

typedef struct {
    int nh, nkv, hd, T, pos0, window, bits, gs, ring;
} qattn_case;

static int run_qattn_case(pt_backend *be, const qattn_case *c) {
    int nh = c->nh, nkv = c->nkv, hd = c->hd, T = c->T, S = c->pos0 + T, ng = hd / c->gs;
    int64_t cap = c->ring ? c->window + T - 1 + c->ring : S;
    pt_act_dtype act = be->act;
    pt_ftype sdt = act == PT_ACT_BF16 ? PT_FT_BF16 : PT_FT_F32;
    pt_dtype sd = act == PT_ACT_BF16 ? PT_DTYPE_BF16 : PT_DTYPE_F32;
    size_t es = sdt == PT_FT_F32 ? 4 : 2, wpr = (size_t)hd * c->bits / 32;
    float *K = malloc(sizeof(float) * (size_t)S * nkv * hd), *V = malloc(sizeof(float) * (size_t)S * nkv * hd);
    float *q = malloc(sizeof(float) * (size_t)T * nh * hd), *out = malloc(sizeof(float) * (size_t)T * nh * hd);
    double *ref = malloc(sizeof(double) * (size_t)T * nh * hd);
    fill_bf16vals(K, (int64_t)S * nkv * hd, -1, 1);
    fill_bf16vals(V, (int64_t)S * nkv * hd, -1, 1);
    fill_bf16vals(q, (int64_t)T * nh * hd, -1, 1);
    pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = cap, .dtype = sdt, .bits = c->bits, .group_size = c->gs};
    kv.k = be->ops->alloc(be, 4 * wpr * (size_t)cap * nkv);
    kv.v = be->ops->alloc(be, 4 * wpr * (size_t)cap * nkv);
    kv.k_scales = be->ops->alloc(be, es * (size_t)ng * cap * nkv);
    kv.k_biases = be->ops->alloc(be, es * (size_t)ng * cap * nkv);
    kv.v_scales = be->ops->alloc(be, es * (size_t)ng * cap * nkv);
    kv.v_biases = be->ops->alloc(be, es * (size_t)ng * cap * nkv);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)S);
    for (int i = 0; i < S; i++) pos[i] = i;
    for (int p0 = 0; p0 < c->pos0; p0 += 3) {
        int n = c->pos0 - p0 < 3 ? c->pos0 - p0 : 3;
        be->ops->kv_append(be, &kv, K + (size_t)p0 * nkv * hd, V + (size_t)p0 * nkv * hd, n, pos + p0);
    }
    pt_status st = be->ops->kv_append(be, &kv, K + (size_t)c->pos0 * nkv * hd, V + (size_t)c->pos0 * nkv * hd, T,
                                      pos + c->pos0);
    pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .window = c->window};
    if (st == PT_OK) st = be->ops->attention(be, out, q, T, pos + c->pos0, &kv, &p);
    int ok = st == PT_OK;
    CHECK(ok, "quantized attention: %s", pt_last_error());
    /* reference: dequantize every row with the MLX quantizer's own codes */
    float *Kd = malloc(sizeof(float) * (size_t)S * nkv * hd), *Vd = malloc(sizeof(float) * (size_t)S * nkv * hd);
    uint32_t *cw = malloc(4 * wpr);
    float scb[2][8];
    for (int64_t r = 0; r < (int64_t)S * nkv; r++) {
        pt_mlx_quantize_row(K + r * hd, hd, c->bits, c->gs, PT_MLX_RULE_METAL, cw, scb[0], scb[1], PT_DTYPE_F32);
        if (sd == PT_DTYPE_BF16)
            for (int g = 0; g < ng; g++) scb[0][g] = pt_round_bf16(scb[0][g]), scb[1][g] = pt_round_bf16(scb[1][g]);
        pt_mlx_dequantize_row(cw, scb[0], scb[1], PT_DTYPE_F32, c->bits, c->gs, hd, Kd + r * hd);
        pt_mlx_quantize_row(V + r * hd, hd, c->bits, c->gs, PT_MLX_RULE_METAL, cw, scb[0], scb[1], PT_DTYPE_F32);
        if (sd == PT_DTYPE_BF16)
            for (int g = 0; g < ng; g++) scb[0][g] = pt_round_bf16(scb[0][g]), scb[1][g] = pt_round_bf16(scb[1][g]);
        pt_mlx_dequantize_row(cw, scb[0], scb[1], PT_DTYPE_F32, c->bits, c->gs, hd, Vd + r * hd);
    }
    double *sc = malloc(sizeof(double) * (size_t)S);
    for (int t = 0; ok && t < T; t++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv), qp = c->pos0 + t;
            int lo = c->window && qp - c->window + 1 > 0 ? qp - c->window + 1 : 0;
            double m = -INFINITY;
            for (int j = lo; j <= qp; j++) {
                double s = 0;
                for (int i = 0; i < hd; i++)
                    s += rnd_act(act, (double)q[(t * nh + h) * hd + i] * p.scale) * Kd[((size_t)j * nkv + kh) * hd + i];
                sc[j] = rnd_act(act, s);
                if (sc[j] > m) m = sc[j];
            }
            ref_softmax_pv(sc, lo, qp, m, Vd, nkv, kh, hd, act, ref + (t * nh + h) * hd);
        }
    if (ok) {
        char what[256];
        snprintf(what, sizeof what, "%s qattn q%d g%d nh=%d nkv=%d hd=%d T=%d pos0=%d win=%d act=%d",
                 pt_backend_cpu_isa_name(be), c->bits, c->gs, nh, nkv, hd, T, c->pos0, c->window, act);
        ok = close_enough(what, out, ref, (int64_t)T * nh * hd, act ? 2e-2 : 1e-5, act ? 1.0 / 64 : 1e-4);
    }
    void *bufs[] = {kv.k, kv.v, kv.k_scales, kv.k_biases, kv.v_scales, kv.v_biases};
    for (int i = 0; i < 6; i++) be->ops->dealloc(be, bufs[i]);
    free(K), free(V), free(q), free(out), free(ref), free(pos), free(Kd), free(Vd), free(cw), free(sc);
    return ok;
}

static const qattn_case qattn_cases[] = {
    {4, 4, 64, 1, 20, 0, 4, 64, 0}, {8, 2, 64, 5, 9, 0, 8, 32, 0}, {4, 1, 128, 3, 30, 0, 4, 128, 0},
    {4, 2, 64, 6, 11, 4, 4, 64, 2}, {2, 2, 32, 2, 7, 0, 2, 32, 0},  {6, 2, 96, 1, 17, 0, 8, 32, 0},
    {4, 2, 64, 16, 59, 0, 4, 64, 0}, {4, 2, 64, 1, 74, 0, 4, 64, 0}, {4, 2, 64, 16, 59, 0, 8, 64, 0},
    {4, 2, 64, 16, 16, 0, 4, 64, 0}, {4, 2, 64, 16, 59, 24, 4, 64, 3}, {8, 2, 128, 16, 59, 24, 8, 64, 3},
};

static int qattn_case_at(pt_backend *be, size_t ci) { return run_qattn_case(be, &qattn_cases[ci]); }

static void test_attention_quantized_kv(void) {
    run_on_backends(qattn_case_at, sizeof qattn_cases / sizeof qattn_cases[0]);
}

/* Converting a full-precision cache gives exactly the rows kv_append would
 * have quantized. */
static void test_kv_quantize(void) {
    pt_backend *be = mk(1, PT_ACT_BF16, PT_ISA_AUTO);
    REQUIRE(be, "backend");
    int nkv = 2, hd = 64, S = 9, gs = 32, bits = 4, ng = hd / gs;
    float *K = malloc(sizeof(float) * S * nkv * hd), *V = malloc(sizeof(float) * S * nkv * hd);
    fill_bf16vals(K, S * nkv * hd, -2, 2);
    fill_bf16vals(V, S * nkv * hd, -2, 2);
    int32_t pos[9];
    for (int i = 0; i < S; i++) pos[i] = i;
    pt_kv_layer full = {.n_kv = nkv, .head_dim = hd, .capacity = S, .dtype = PT_FT_BF16};
    full.k = be->ops->alloc(be, 2 * S * nkv * hd);
    full.v = be->ops->alloc(be, 2 * S * nkv * hd);
    pt_kv_layer qa = {.n_kv = nkv, .head_dim = hd, .capacity = S, .dtype = PT_FT_BF16, .bits = bits, .group_size = gs};
    pt_kv_layer qb = qa;
    pt_kv_layer *qs[2] = {&qa, &qb};
    for (int i = 0; i < 2; i++) {
        qs[i]->k = be->ops->alloc(be, 4 * S * nkv * hd * bits / 32);
        qs[i]->v = be->ops->alloc(be, 4 * S * nkv * hd * bits / 32);
        qs[i]->k_scales = be->ops->alloc(be, 2 * S * nkv * ng);
        qs[i]->k_biases = be->ops->alloc(be, 2 * S * nkv * ng);
        qs[i]->v_scales = be->ops->alloc(be, 2 * S * nkv * ng);
        qs[i]->v_biases = be->ops->alloc(be, 2 * S * nkv * ng);
    }
    REQUIRE(be->ops->kv_append(be, &full, K, V, S, pos) == PT_OK, "append full");
    REQUIRE(be->ops->kv_append(be, &qa, K, V, S, pos) == PT_OK, "append quantized");
    REQUIRE(be->ops->kv_quantize(be, &qb, &full, 0, S) == PT_OK, "kv_quantize: %s", pt_last_error());
    CHECK(memcmp(qa.k, qb.k, 4 * S * nkv * hd * bits / 32) == 0, "K codes");
    CHECK(memcmp(qa.v, qb.v, 4 * S * nkv * hd * bits / 32) == 0, "V codes");
    CHECK(memcmp(qa.k_scales, qb.k_scales, 2 * S * nkv * ng) == 0 && memcmp(qa.v_biases, qb.v_biases, 2 * S * nkv * ng) == 0,
          "scales/biases");
    CHECK(be->ops->kv_quantize(be, &full, &qa, 0, S) == PT_ERR_INVALID_ARG, "direction checked");
    void *bufs[] = {full.k, full.v, qa.k, qa.v, qa.k_scales, qa.k_biases, qa.v_scales, qa.v_biases,
                    qb.k, qb.v, qb.k_scales, qb.k_biases, qb.v_scales, qb.v_biases};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->dealloc(be, bufs[i]);
    free(K), free(V);
    pt_backend_free(&be);
}

/* ---- glu and elementwise ---- */

static double ref_silu(double g) { return g / (1 + exp(-g)); }
static double ref_gelu(double g) { return 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))); }

static void test_glu_and_elementwise(void) {
    for (int am = 0; am < 2; am++) {
        pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
        pt_backend *be = mk(2, act, PT_ISA_AUTO);
        REQUIRE(be, "backend");
        double rtol = am ? 1.0 / 128 : 2e-6;
        /* range 6: the usual values; range 120 (SwiGLU only): exp(−g) overflowing and underflowing */
        for (int fn = 0; fn < 3; fn++) {
            double range = fn == 2 ? 120 : 6;
            int64_t T = 3, F = fn == 2 ? 333 : 37, ld = 2 * F;
            float *gu = malloc(sizeof(float) * (size_t)(T * ld)), *y = malloc(sizeof(float) * (size_t)(T * F));
            double *ref = malloc(sizeof(double) * (size_t)(T * F));
            fill_bf16vals(gu, T * ld, -range, range);
            for (int64_t t = 0; t < T; t++)
                for (int64_t f = 0; f < F; f++) {
                    double g = gu[t * ld + f], u = gu[t * ld + F + f];
                    ref[t * F + f] = rnd_act(act, rnd_act(act, fn == 1 ? ref_gelu(g) : ref_silu(g)) * u);
                }
            be->ops->glu(be, y, gu, gu + F, T, F, ld, fn == 1 ? PT_GLU_GELU_TANH : PT_GLU_SILU);
            CHECK(close_enough(fn == 1 ? "geglu" : "swiglu", y, ref, T * F, 1e-6, rtol), "glu (range %g)", range);
            free(gu), free(y), free(ref);
        }
        int64_t n = 40000 + 3; /* above the parallel threshold, odd */
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n),
              *y = malloc(sizeof(float) * (size_t)n);
        double *ref = malloc(sizeof(double) * (size_t)n);
        fill_bf16vals(a, n, -40, 40);
        fill_bf16vals(b, n, -3, 3);
        for (int op = 0; op < 5; op++) {
            for (int64_t i = 0; i < n; i++) {
                double A = a[i], B = b[i];
                ref[i] = op == 0   ? rnd_act(act, A + B)
                         : op == 1 ? rnd_act(act, A * B)
                         : op == 2 ? rnd_act(act, A + rnd_act(act, B * 0.3f))
                         : op == 3 ? rnd_act(act, A * 0.3f)
                                   : rnd_act(act, rnd_act(act, tanh(rnd_act(act, A / 30.0))) * 30.0);
            }
            if (op == 0) be->ops->add(be, y, a, b, n);
            if (op == 1) be->ops->mul(be, y, a, b, n);
            if (op == 2) be->ops->add_scaled(be, y, a, b, 0.3f, n);
            if (op == 3) be->ops->scale(be, y, a, 0.3f, n);
            if (op == 4) be->ops->softcap(be, y, a, 30.0f, n);
            char what[256];
            snprintf(what, sizeof what, "elementwise op %d act %d", op, am);
            CHECK(close_enough(what, y, ref, n, 1e-6, rtol), "elementwise");
        }
        free(a), free(b), free(y), free(ref);
        pt_backend_free(&be);
    }
}

/* ---- MoE ---- */

static void test_moe_route(void) {
    pt_backend *be = mk(1, PT_ACT_F32, PT_ISA_AUTO);
    REQUIRE(be, "backend");
    int E = 9, k = 3;
    int64_t T = 4;
    float logits[36], pes[9], w[12];
    int32_t idx[12];
    fill(logits, 36, -3, 3);
    logits[9 + 2] = logits[9 + 5] = 10.0f; /* a tie: lower index first */
    fill(pes, 9, 0.5f, 2.0f);
    for (int variant = 0; variant < 3; variant++) {
        pt_moe_route r = {.n_experts = E, .top_k = k, .renorm = variant >= 1, .per_expert_scale = variant == 2 ? pes : NULL};
        REQUIRE(be->ops->moe_route(be, idx, w, logits, T, &r) == PT_OK, "route");
        for (int64_t t = 0; t < T; t++) {
            double p[9], m = -1e30, s = 0;
            for (int e = 0; e < E; e++) m = fmax(m, logits[t * E + e]);
            for (int e = 0; e < E; e++) s += (p[e] = exp(logits[t * E + e] - m));
            int used[9] = {0};
            double ts = 0;
            int ri[3];
            for (int j = 0; j < k; j++) {
                int b = -1;
                for (int e = 0; e < E; e++)
                    if (!used[e] && (b < 0 || p[e] > p[b])) b = e;
                used[b] = 1;
                ri[j] = b;
                ts += p[b] / s;
            }
            for (int j = 0; j < k; j++) {
                CHECK(idx[t * k + j] == ri[j], "t %lld slot %d: expert %d, expected %d", (long long)t, j, idx[t * k + j],
                      ri[j]);
                double rw = p[ri[j]] / s;
                if (r.renorm) rw /= ts;
                if (r.per_expert_scale) rw *= pes[ri[j]];
                CHECK(fabs(w[t * k + j] - rw) < 1e-6 + 1e-5 * rw, "weight %g vs %g", w[t * k + j], rw);
            }
        }
        CHECK(idx[k] == 2 && idx[k + 1] == 5, "tie order: %d %d", idx[k], idx[k + 1]);
    }
    pt_backend_free(&be);
}

static void test_moe_ffn(void) {
    for (int fused = 0; fused < 2; fused++)
        for (int am = 0; am < 2; am++) {
            pt_act_dtype act = am ? PT_ACT_BF16 : PT_ACT_F32;
            pt_backend *be = mk(2, act, PT_ISA_AUTO);
            REQUIRE(be, "backend");
            int64_t E = 5, H = 64, I = 32, T = 2;
            int k = 3;
            tweight g, u, d;
            tw_make(&g, E, fused ? 2 * I : I, H, PT_FT_BF16, 4, 32, 0);
            if (!fused) tw_make(&u, E, I, H, PT_FT_BF16, 8, 64, 0);
            tw_make(&d, E, H, I, PT_FT_BF16, 0, 0, 0);
            REQUIRE(be->ops->prepare_weight(be, &g.w, "g") == PT_OK, "prep");
            if (!fused) REQUIRE(be->ops->prepare_weight(be, &u.w, "u") == PT_OK, "prep");
            REQUIRE(be->ops->prepare_weight(be, &d.w, "d") == PT_OK, "prep");
            float x[128], y[128], wts[6] = {0.5f, 0.3f, 0.2f, 0.25f, 0.25f, 0.5f};
            int32_t idx[6] = {4, 0, 2, 1, 3, 4};
            fill_bf16vals(x, T * H, -1, 1);
            double ref[128];
            for (int64_t t = 0; t < T; t++) {
                double acc[64] = {0};
                int order[3] = {0, 1, 2};
                for (int a = 0; a < k; a++) /* ascending expert order */
                    for (int b = a + 1; b < k; b++)
                        if (idx[t * k + order[b]] < idx[t * k + order[a]]) {
                            int tmp = order[a];
                            order[a] = order[b];
                            order[b] = tmp;
                        }
                for (int j = 0; j < k; j++) {
                    int e = idx[t * k + order[j]];
                    double h[32];
                    for (int64_t i = 0; i < I; i++) {
                        double gv = 0, uv = 0;
                        for (int64_t c = 0; c < H; c++) {
                            gv += g.deq[(e * g.w.rows + i) * H + c] * x[t * H + c];
                            uv += (fused ? g.deq[(e * g.w.rows + I + i) * H + c] : u.deq[(e * I + i) * H + c]) *
                                  x[t * H + c];
                        }
                        gv = rnd_act(act, gv), uv = rnd_act(act, uv);
                        h[i] = rnd_act(act, rnd_act(act, ref_silu(gv)) * uv);
                    }
                    for (int64_t o = 0; o < H; o++) {
                        double s = 0;
                        for (int64_t i = 0; i < I; i++) s += d.deq[(e * H + o) * I + i] * h[i];
                        acc[o] = rnd_act(act, acc[o] + rnd_act(act, rnd_act(act, s) * wts[t * k + order[j]]));
                    }
                }
                for (int64_t o = 0; o < H; o++) ref[t * H + o] = acc[o];
            }
            pt_status s = be->ops->moe_ffn(be, y, x, T, idx, wts, k, &g.w, fused ? NULL : &u.w, &d.w, PT_GLU_SILU);
            REQUIRE(s == PT_OK, "moe_ffn: %s", pt_last_error());
            char what[256];
            snprintf(what, sizeof what, "moe_ffn fused=%d act=%d", fused, am);
            CHECK(close_enough(what, y, ref, T * H, am ? 2e-2 : 1e-4, am ? 1.0 / 32 : 1e-4), "moe");
            tw_free(&g);
            if (!fused) tw_free(&u);
            tw_free(&d);
            pt_backend_free(&be);
        }
}

/* ---- argmax ---- */

static void test_argmax(void) {
    pt_backend *be = mk(1, PT_ACT_F32, PT_ISA_AUTO);
    REQUIRE(be, "backend");
    float x[12] = {1, 5, 5, 2, NAN, -1, 3, NAN, NAN, NAN, NAN, NAN};
    int32_t out[3];
    be->ops->argmax(be, out, x, 3, 4);
    CHECK(out[0] == 1, "first max on ties: %d", out[0]);
    CHECK(out[1] == 2, "NaN skipped: %d", out[1]);
    CHECK(out[2] == 0, "all NaN row -> 0: %d", out[2]);
    pt_backend_free(&be);
}

/* ---- determinism across thread counts ---- */

static void run_pipeline(pt_backend *be, float *out_mm, float *out_attn) {
    rng = 12345;
    tweight tw;
    tw_make(&tw, 0, 301, 256, PT_FT_BF16, 4, 64, 1);
    be->ops->prepare_weight(be, &tw.w, "w");
    float *x = malloc(sizeof(float) * 7 * 256);
    fill_bf16vals(x, 7 * 256, -1, 1);
    be->ops->matmul(be, out_mm, x, 1, &tw.w, 0);
    be->ops->matmul(be, out_mm + 301, x, 7, &tw.w, 0);
    tw_free(&tw);
    tw_make(&tw, 0, 129, 256, PT_FT_BF16, 0, 0, 0);
    be->ops->matmul(be, out_mm + 8 * 301, x, 1, &tw.w, 0);
    tw_free(&tw);
    free(x);
    attn_case c = {8, 2, 64, 5, 30, 0, 0, PT_FT_BF16, 0};
    run_attn_case(be, &c, out_attn);
}

static void test_quantized_kv_threads(void) {
    /* quantized-KV attention: same bits for 1 and 3 threads */
    float out[2][5 * 8 * 64];
    for (int i = 0; i < 2; i++) {
        pt_backend *be = mk(i ? 3 : 1, PT_ACT_BF16, PT_ISA_AUTO);
        REQUIRE(be, "backend");
        rng = 777;
        int nh = 8, nkv = 2, hd = 64, T = 5, S = 25, gs = 64, ng = 1;
        float *K = malloc(sizeof(float) * S * nkv * hd), *V = malloc(sizeof(float) * S * nkv * hd);
        float *q = malloc(sizeof(float) * T * nh * hd);
        fill_bf16vals(K, S * nkv * hd, -1, 1);
        fill_bf16vals(V, S * nkv * hd, -1, 1);
        fill_bf16vals(q, T * nh * hd, -1, 1);
        pt_kv_layer kv = {.n_kv = nkv, .head_dim = hd, .capacity = S, .dtype = PT_FT_BF16, .bits = 4, .group_size = gs};
        kv.k = be->ops->alloc(be, 4 * (size_t)S * nkv * hd / 8);
        kv.v = be->ops->alloc(be, 4 * (size_t)S * nkv * hd / 8);
        kv.k_scales = be->ops->alloc(be, 2 * (size_t)S * nkv * ng);
        kv.k_biases = be->ops->alloc(be, 2 * (size_t)S * nkv * ng);
        kv.v_scales = be->ops->alloc(be, 2 * (size_t)S * nkv * ng);
        kv.v_biases = be->ops->alloc(be, 2 * (size_t)S * nkv * ng);
        int32_t pos[25];
        for (int j = 0; j < S; j++) pos[j] = j;
        be->ops->kv_append(be, &kv, K, V, S, pos);
        pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 0.125f};
        REQUIRE(be->ops->attention(be, out[i], q, T, pos + S - T, &kv, &p) == PT_OK, "attention");
        void *bufs[] = {kv.k, kv.v, kv.k_scales, kv.k_biases, kv.v_scales, kv.v_biases};
        for (int b = 0; b < 6; b++) be->ops->dealloc(be, bufs[b]);
        free(K), free(V), free(q);
        pt_backend_free(&be);
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "quantized-KV attention differs between 1 and 3 threads");
}

static void test_threads_bit_identical(void) {
    float mm[3][8 * 301 + 129], at[3][5 * 8 * 64];
    int nths[3] = {1, 2, 3};
    for (int am = 0; am < 3; am++) { /* f32, bf16, bf16 with the int8-activation lever */
        for (int i = 0; i < 3; i++) {
            pt_backend *be = NULL;
            pt_cpu_params cp = {.n_threads = nths[i], .act = am ? PT_ACT_BF16 : PT_ACT_F32, .int8_act = am == 2};
            REQUIRE(pt_backend_cpu_create(&be, &cp) == PT_OK, "backend");
            run_pipeline(be, mm[i], at[i]);
            pt_backend_free(&be);
        }
        CHECK(memcmp(mm[0], mm[1], sizeof mm[0]) == 0 && memcmp(mm[0], mm[2], sizeof mm[0]) == 0,
              "matmul differs across thread counts (act %d)", am);
        CHECK(memcmp(at[0], at[1], sizeof at[0]) == 0 && memcmp(at[0], at[2], sizeof at[0]) == 0,
              "attention differs across thread counts (act %d)", am);
    }
}

int main(void) {
    TEST_RUN(test_alloc);
    TEST_RUN(test_rms_norm);
    TEST_RUN(test_rms_norm_rows);
    TEST_RUN(test_rope);
    TEST_RUN(test_rope_rows);
    TEST_RUN(test_attention);
    TEST_RUN(test_attention_errors);
    TEST_RUN(test_attention_quantized_kv);
    TEST_RUN(test_kv_quantize);
    TEST_RUN(test_glu_and_elementwise);
    TEST_RUN(test_moe_route);
    TEST_RUN(test_moe_ffn);
    TEST_RUN(test_argmax);
    TEST_RUN(test_threads_bit_identical);
    TEST_RUN(test_quantized_kv_threads);
    return test_summary();
}
