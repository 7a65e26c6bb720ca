/* Quantized KV on Gemma 4, checked against an independent computation.
 *
 * The L2 references (tests/test_kv_quant.c) cover the llama fixture; Gemma 4
 * has no quantized-KV oracle, and 4-bit KV costs far more there than on the
 * other families (docs/flags.md "The L3 gate"). This test tells a bug from
 * the arithmetic of the format: a reference run of the same fixture keeps a
 * full-precision cache and replaces every K/V row by its quantize ->
 * dequantize image, computed here from the rule written in
 * src/format/mlx_quant.h (fp32; w_max from 0, round half away from zero,
 * w = q·scale + bias), at the moments DESIGN.md "Quantized KV, exactly"
 * fixes: with --quantized-kv-start 0 the first prefill chunk appends (and
 * attends to) full-precision rows, before the second chunk every row already
 * in the cache is converted, and every later row is converted as it is
 * written. It wraps the backend's kv_append, so the model, its attention
 * kernel (exact, full precision) and its KV-sharing are the engine's, and the
 * quantization is this file's. Shared layers (gemma4_e's layers 2-3) read
 * the donor's converted rows in both runs; rings wrap (window 16, chunks of
 * 5); gemma4_moe's full layer has attention_k_eq_v.
 *
 * Gates, per Gemma 4 fixture and for 4 and 8 bits: the quantized engine's
 * logits (prompt positions and 31 teacher-forced decode steps) within
 * 1e-4 × max|logit| of the reference (DESIGN.md's L2 gate; measured up to
 * 8e-6: the engine sums the same products in another order, and Gemma 4's
 * scale-1 attention amplifies rounding), greedy choice identical, and every
 * layer's hidden state on the prompt within 1e-5 of its scale. Printed
 * (MEASURE): the deltas, and the mean KL of each bit width against L1 with
 * K only, V only and both quantized — the numbers docs/flags.md records. */
#include "test.h"
#include "parity_util.h"

#include "base/error.h"
#include "golden.h"
#include "model/model.h"
#include "petrel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_STEPS 32
#define MAX_CACHES 64
#define MAX_HID 16

/* ---- the reference quantizer (mlx_quant.h's rule, written out again) ---- */

/* One group of gs values, in place: quantize to `bits`, dequantize. */
static void fake_quant_group(float *w, int gs, int bits) {
    const float n_bins = (float)((1 << bits) - 1);
    float w_max = 0.0f, w_min = INFINITY;
    for (int i = 0; i < gs; i++) {
        if (w[i] > w_max) w_max = w[i];
        if (w[i] < w_min) w_min = w[i];
    }
    float scale = (w_max - w_min) / n_bins;
    if (scale < 1e-7f) scale = 1e-7f;
    int neg = fabsf(w_min) > fabsf(w_max);
    float edge = neg ? w_min : w_max;
    if (!neg) scale = -scale;
    float q0 = roundf(edge / scale), bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }
    for (int i = 0; i < gs; i++) {
        float q = roundf((w[i] - bias) / scale);
        if (q < 0.0f) q = 0.0f;
        if (q > n_bins) q = n_bins;
        w[i] = q * scale + bias;
    }
}

/* ---- kv_append wrapper: the reference's conversion schedule ---- */

typedef struct {
    void *key;      /* the cache's K buffer identifies it */
    int appends;    /* kv_append calls so far */
    int converted;  /* rows in the cache are quantize->dequantize images */
    int64_t high;   /* positions written */
} fq_cache;

static struct {
    const pt_backend_ops *orig;
    pt_backend_ops ops;
    int bits, gs, do_k, do_v;
    fq_cache c[MAX_CACHES];
    int n;
} fq;

static void fq_reset(void) {
    memset(fq.c, 0, sizeof fq.c);
    fq.n = 0;
}

static void fq_rows(float *x, int64_t rows, int hd) {
    for (int64_t r = 0; r < rows; r++)
        for (int g = 0; g < hd / fq.gs; g++) fake_quant_group(x + r * hd + g * fq.gs, fq.gs, fq.bits);
}

static pt_status fq_append(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                           const int32_t *pos) {
    if (kv->bits || kv->dtype != PT_FT_F32) return pt_error(PT_ERR_UNSUPPORTED, "reference: needs an f32 cache");
    fq_cache *c = NULL;
    for (int i = 0; i < fq.n; i++)
        if (fq.c[i].key == kv->k) c = &fq.c[i];
    if (!c) {
        if (fq.n == MAX_CACHES) return pt_error(PT_ERR_RANGE, "reference: too many caches");
        c = &fq.c[fq.n++];
        c->key = kv->k;
    }
    int hd = kv->head_dim;
    if (c->appends > 0 && !c->converted) {
        /* after the first step: every row still in the cache (a ring holds
         * the last `capacity` positions) is converted */
        int64_t p0 = c->high > kv->capacity ? c->high - kv->capacity : 0;
        for (int64_t p = p0; p < c->high; p++)
            for (int h = 0; h < kv->n_kv; h++) {
                size_t off = ((size_t)h * (size_t)kv->capacity + (size_t)(p % kv->capacity)) * (size_t)hd;
                if (fq.do_k) fq_rows((float *)kv->k + off, 1, hd);
                if (fq.do_v) fq_rows((float *)kv->v + off, 1, hd);
            }
        c->converted = 1;
    }
    pt_status st;
    if (c->converted) {
        size_t n = (size_t)T * (size_t)kv->n_kv * (size_t)hd;
        float *kq = malloc(n * sizeof *kq), *vq = malloc(n * sizeof *vq);
        if (!kq || !vq) {
            free(kq);
            free(vq);
            return pt_error(PT_ERR_NOMEM, "reference rows");
        }
        memcpy(kq, k, n * sizeof *kq);
        memcpy(vq, v, n * sizeof *vq);
        if (fq.do_k) fq_rows(kq, (int64_t)n / hd, hd);
        if (fq.do_v) fq_rows(vq, (int64_t)n / hd, hd);
        st = fq.orig->kv_append(be, kv, kq, vq, T, pos);
        free(kq);
        free(vq);
    } else {
        st = fq.orig->kv_append(be, kv, k, v, T, pos);
    }
    c->appends++;
    if (T > 0 && pos[T - 1] + 1 > c->high) c->high = pos[T - 1] + 1;
    return st;
}

/* ---- runs ---- */

/* hidden states of the prompt: [MAX_HID][n, H], entry layer + 1 */
typedef struct {
    float *h;
    int n, L;
    int64_t H;
} hid_buf;

static void on_hidden(void *user, int layer, const float *x, int T, int pos0, int64_t H) {
    hid_buf *b = user;
    if (!b->h || layer + 1 < 0 || layer + 1 >= MAX_HID || pos0 + T > b->n) return;
    if (layer + 1 > b->L) b->L = layer + 1;
    b->H = H;
    memcpy(b->h + ((size_t)(layer + 1) * b->n + pos0) * H, x, sizeof(float) * (size_t)T * H);
}

/* bits > 0: the engine's quantized cache; bits < 0: the reference at -bits
 * (which: 1 = K, 2 = V, 3 = both); 0: L1. Prompt in chunks of `chunk`, then
 * the forced tokens: rows [n + N_STEPS - 1, V] (every prompt position, then
 * each decode step). */
static int run(const char *fixture, int bits, int which, int gs, int chunk, const int32_t *ids, int n,
               const int32_t *force, float *rows, hid_buf *hb) {
    char dir[128];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    pt_model_params mp = pt_model_default_params();
    mp.dtype = PT_COMPUTE_F32;
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = 2;
    mp.kv_quant = bits > 0 ? bits : 0;
    mp.kv_group_size = gs;
    mp.prefill_chunk = chunk;
    mp.quantized_kv_start = 0;
    pt_model *m = NULL;
    if (pt_model_load(dir, &mp, &m) != PT_OK) {
        printf("    load %s: %s\n", dir, pt_last_error());
        return 0;
    }
    if (bits < 0) {
        fq.orig = m->be->ops;
        fq.ops = *m->be->ops;
        fq.ops.kv_append = fq_append;
        fq.bits = -bits;
        fq.gs = gs;
        fq.do_k = which & 1;
        fq.do_v = (which & 2) != 0;
        fq_reset();
        m->be->ops = &fq.ops;
    }
    if (hb) {
        m->hidden_cb = on_hidden;
        m->hidden_user = hb;
    }
    int V = pt_model_vocab_size(m), ok = 1;
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n + N_STEPS + 1};
    ok = pt_session_create(m, &sp, &s) == PT_OK && pt_session_eval_logits(s, ids, (size_t)n, rows) == PT_OK;
    m->hidden_cb = NULL;
    for (int j = 0; ok && j + 1 < N_STEPS; j++) {
        ok = pt_session_prompt(s, &force[j], 1) == PT_OK;
        if (ok) memcpy(rows + (size_t)(n + j) * V, pt_session_logits(s), sizeof(float) * V);
    }
    if (!ok) printf("    run %s bits %d: %s\n", fixture, bits, pt_last_error());
    pt_session_free(&s);
    if (bits < 0) m->be->ops = fq.orig;
    pt_model_free(&m);
    return ok;
}

/* mean KL(a || b) over the decode rows (the rows after the prompt's last
 * position: what the L3 gate measures) */
static double mean_kl(const float *a, const float *b, int n, int V) {
    double s = 0;
    for (int j = n - 1; j < n + N_STEPS - 1; j++) s += parity_kl_row(a + (size_t)j * V, b + (size_t)j * V, V);
    return s / N_STEPS;
}

static void check_fixture(const char *fx, int gs, int chunk) {
    char err[256];
    golden *g = golden_open_fixture(fx, err, sizeof err);
    REQUIRE(g, "%s", err);
    int n = 0, ng = 0;
    const int32_t *ids = golden_prompt_ids(g, golden_n_prompts(g) - 1, &n);
    const int32_t *force = golden_greedy(g, golden_n_prompts(g) - 1, GOLDEN_REF_F32, &ng);
    REQUIRE(ids && force && ng >= N_STEPS, "%s: prompt and greedy goldens", fx);
    const int V = 320, R = n + N_STEPS - 1;
    float *l1 = malloc(sizeof(float) * (size_t)R * V), *eng = malloc(sizeof(float) * (size_t)R * V),
          *ref = malloc(sizeof(float) * (size_t)R * V);
    float *he = calloc((size_t)MAX_HID * n * 128, sizeof(float)), *hr = calloc((size_t)MAX_HID * n * 128, sizeof(float));
    REQUIRE(l1 && eng && ref && he && hr, "memory");
    REQUIRE(run(fx, 0, 0, gs, chunk, ids, n, force, l1, NULL), "%s L1 runs", fx);
    for (int bits = 8; bits >= 4; bits -= 4) {
        hid_buf be_ = {he, n, 0, 0}, br = {hr, n, 0, 0};
        REQUIRE(run(fx, bits, 3, gs, chunk, ids, n, force, eng, &be_), "%s %d-bit KV runs", fx, bits);
        REQUIRE(run(fx, -bits, 3, gs, chunk, ids, n, force, ref, &br), "%s %d-bit reference runs", fx, bits);
        double md = 0, ml = 0;
        int same = 1;
        for (int64_t i = 0; i < (int64_t)R * V; i++) {
            double d = fabs((double)ref[i] - eng[i]);
            if (d > md) md = d;
            if (fabs(ref[i]) > ml) ml = fabs(ref[i]);
        }
        for (int r = 0; r < R; r++)
            same &= golden_argmax(ref + (size_t)r * V, V) == golden_argmax(eng + (size_t)r * V, V);
        printf("MEASURE kv_gemma4 %s %d-bit (group %d, chunk %d): engine vs quantize->dequantize reference max|dlogit| "
               "%.3g of max|logit| %.3g (ratio %.3g) over %d rows, argmax %s\n",
               fx, bits, gs, chunk, md, ml, md / ml, R, same ? "identical" : "DIFFERS");
        CHECK(md <= 1e-4 * ml, "%s %d-bit KV: max|dlogit| %.3g exceeds 1e-4 x %.3g against the reference", fx, bits, md,
              ml);
        CHECK(same, "%s %d-bit KV: argmax differs from the reference", fx, bits);
        CHECK(be_.L == br.L && be_.L >= 2, "%s: hidden states captured (%d vs %d entries)", fx, be_.L, br.L);
        for (int e = 1; e <= be_.L; e++) {
            double hd = 0, hm = 0;
            for (int64_t i = 0; i < (int64_t)n * be_.H; i++) {
                double d = fabs((double)hr[(size_t)e * n * be_.H + i] - he[(size_t)e * n * be_.H + i]);
                if (d > hd) hd = d;
                if (fabs(hr[(size_t)e * n * be_.H + i]) > hm) hm = fabs(hr[(size_t)e * n * be_.H + i]);
            }
            printf("MEASURE kv_gemma4 %s %d-bit hidden entry %d (%s): max|d| %.3g of %.3g\n", fx, bits, e,
                   e < be_.L ? "layer output" : "final norm", hd, hm);
            CHECK(hd <= 1e-5 * hm, "%s %d-bit hidden entry %d: max|d| %.3g exceeds 1e-5 x %.3g", fx, bits, e, hd, hm);
        }
        /* the cost of the format itself, against L1 (decode rows) */
        double k_both = mean_kl(l1, eng, n, V), k_ref = mean_kl(l1, ref, n, V);
        REQUIRE(run(fx, -bits, 1, gs, chunk, ids, n, force, ref, NULL), "%s K-only reference", fx);
        double k_k = mean_kl(l1, ref, n, V);
        REQUIRE(run(fx, -bits, 2, gs, chunk, ids, n, force, ref, NULL), "%s V-only reference", fx);
        double k_v = mean_kl(l1, ref, n, V);
        printf("MEASURE kv_gemma4 %s %d-bit vs L1, mean KL over %d decode steps: engine %.3g (reference %.3g); K only "
               "%.3g, V only %.3g\n",
               fx, bits, N_STEPS, k_both, k_ref, k_k, k_v);
    }
    free(l1);
    free(eng);
    free(ref);
    free(he);
    free(hr);
    golden_close(g);
}

/* gemma4_e: rings wrap (window 16, chunks of 5 over 44 prompt ids), layers
 * 2-3 share the caches of 0-1, head sizes 32 and 64 */
static void test_kv_gemma4_e(void) { check_fixture("gemma4_e", 32, 5); }
/* gemma4_dense: separate v_proj, no sharing; one chunk */
static void test_kv_gemma4_dense(void) { check_fixture("gemma4_dense", 32, 2048); }
/* gemma4_moe: attention_k_eq_v on the full layer (V = raw K projection) */
static void test_kv_gemma4_moe(void) { check_fixture("gemma4_moe", 32, 7); }

int main(void) {
    TEST_RUN(test_kv_gemma4_e);
    TEST_RUN(test_kv_gemma4_dense);
    TEST_RUN(test_kv_gemma4_moe);
    return test_summary();
}
