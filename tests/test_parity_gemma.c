/* Parity of the Gemma 4 fixtures petrel runs against their transformers
 * goldens (tests/fixtures/<name>/golden.bin; tests/fixtures/README.md), with
 * the L1 gates of DESIGN.md:
 *   fp32: max|Δlogit| <= 1e-4 × max|logit| over every position of every
 *         prompt; greedy continuation identical (up to a golden near-tie,
 *         margin < 1e-3);
 *   bf16: argmax identical wherever the golden top-1/top-2 margin > 0.05
 *         (MoE fixtures: on >= 95% of those positions — a routing near-tie
 *         flips an expert);
 *   threads: 1-thread and 2-thread fp32 logits bit-identical;
 *   hidden states: every layer's output on the hidden prompt against the
 *         per-layer goldens (the same 1e-4 relative bound, per layer), which
 *         locates a divergence when the logits drift.
 * Prints max|Δ|, max|logit|, the mean KL and per-layer deltas (MEASURE). */
#include "test.h"

#include "golden.h"
#include "model/model.h"
#include "petrel.h"

#include <math.h>

static pt_model *load(const char *dir, pt_compute_dtype dt, int threads) {
    pt_model_params mp = pt_model_default_params();
    mp.dtype = dt;
    mp.n_threads = threads;
    mp.device = PT_DEVICE_CPU;
    pt_model *m = NULL;
    if (pt_model_load(dir, &mp, &m) != PT_OK) printf("    load %s: %s\n", dir, pt_last_error());
    return m;
}

static int eval(pt_model *m, const int32_t *ids, int n, float *out) {
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n + 40};
    int ok = pt_session_create(m, &sp, &s) == PT_OK && pt_session_eval_logits(s, ids, (size_t)n, out) == PT_OK;
    if (!ok) printf("    eval: %s\n", pt_last_error());
    pt_session_free(&s);
    return ok;
}

static double kl_row(const float *p_, const float *q_, int V) {
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, k = 0;
    for (int i = 0; i < V; i++) {
        if (p_[i] > mp) mp = p_[i];
        if (q_[i] > mq) mq = q_[i];
    }
    for (int i = 0; i < V; i++) {
        sp += exp(p_[i] - mp);
        sq += exp(q_[i] - mq);
    }
    for (int i = 0; i < V; i++) {
        double lp = p_[i] - mp - log(sp), lq = q_[i] - mq - log(sq);
        k += exp(lp) * (lp - lq);
    }
    return k;
}

/* hidden-state capture: entry layer+1 of [L+2, n, H] */
static float *hid;
static int hid_n, hid_L;
static int64_t hid_H;
static void on_hidden(void *user, int layer, const float *x, int T, int pos0, int64_t H) {
    (void)user;
    if (!hid || layer + 1 > hid_L + 1 || pos0 + T > hid_n) return;
    memcpy(hid + ((size_t)(layer + 1) * hid_n + pos0) * H, x, sizeof(float) * (size_t)T * H);
    (void)hid_H;
}

static void check_fixture(const char *name, int moe) {
    char dir[128], err[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    golden *g = golden_open_fixture(name, err, sizeof err);
    REQUIRE(g, "%s", err);
    pt_model *m32 = load(dir, PT_COMPUTE_F32, 2), *m1 = load(dir, PT_COMPUTE_F32, 1), *m16 = load(dir, PT_COMPUTE_BF16, 2);
    REQUIRE(m32 && m1 && m16, "%s loads", name);
    int V = pt_model_vocab_size(m32);
    for (int p = 0; p < golden_n_prompts(g); p++) {
        int n = 0, np = 0, gv = 0, nm = 0;
        const int32_t *ids = golden_prompt_ids(g, p, &n);
        const float *ref = golden_logits(g, p, GOLDEN_REF_F32, &np, &gv);
        const float *ref16 = golden_logits(g, p, GOLDEN_REF_BF16, &np, &gv);
        const float *mar16 = golden_margins(g, p, GOLDEN_REF_BF16, &nm);
        REQUIRE(ids && ref && ref16 && mar16 && np == n && gv == V, "%s prompt %d goldens", name, p);
        float *o32 = malloc(sizeof(float) * (size_t)n * V), *o1 = malloc(sizeof(float) * (size_t)n * V),
              *o16 = malloc(sizeof(float) * (size_t)n * V);
        REQUIRE(o32 && o1 && o16, "memory");
        int hp = golden_hidden_prompt(g);
        if (p == hp) {
            int hn = 0, hH = 0, ne = 0;
            golden_hidden(g, p, 0, &hn, &hH, &ne);
            hid_L = ne - 2;
            hid_n = n;
            hid_H = hH;
            hid = calloc((size_t)ne * n * hH, sizeof(float));
            m32->hidden_cb = on_hidden;
        }
        REQUIRE(eval(m32, ids, n, o32) && eval(m1, ids, n, o1) && eval(m16, ids, n, o16), "%s prompt %d runs", name, p);
        m32->hidden_cb = NULL;
        double md = 0, ml = 0, kl = 0;
        int agree = 0, decided = 0;
        for (int64_t i = 0; i < (int64_t)n * V; i++) {
            double d = fabs((double)ref[i] - o32[i]);
            if (d > md) md = d;
            if (fabs(ref[i]) > ml) ml = fabs(ref[i]);
        }
        for (int t = 0; t < n; t++) {
            kl += kl_row(ref + (size_t)t * V, o32 + (size_t)t * V, V) / n;
            if (mar16[t] > 0.05f) {
                decided++;
                agree += golden_argmax(o16 + (size_t)t * V, V) == golden_argmax(ref16 + (size_t)t * V, V);
            }
        }
        printf("MEASURE parity %s prompt %d f32: max|dlogit| %.3g of max|logit| %.3g (ratio %.3g), mean KL %.3g; bf16 "
               "argmax %d/%d where margin > 0.05\n",
               name, p, md, ml, md / ml, kl, agree, decided);
        CHECK(md <= 1e-4 * ml, "%s prompt %d: max|dlogit| %.3g exceeds 1e-4 x %.3g", name, p, md, ml);
        CHECK(moe ? agree >= 0.95 * decided : agree == decided, "%s prompt %d: bf16 argmax %d/%d", name, p, agree,
              decided);
        CHECK(!memcmp(o32, o1, sizeof(float) * (size_t)n * V), "%s prompt %d: 1 and 2 threads differ", name, p);
        if (hid) {
            for (int e = 1; e < hid_L + 2; e++) {
                int hn = 0, hH = 0, ne = 0;
                const float *gh = golden_hidden(g, p, e, &hn, &hH, &ne);
                double hd = 0, hm = 0;
                for (int64_t i = 0; gh && i < (int64_t)hn * hH; i++) {
                    double d = fabs((double)gh[i] - hid[(size_t)e * hn * hH + i]);
                    if (d > hd) hd = d;
                    if (fabs(gh[i]) > hm) hm = fabs(gh[i]);
                }
                printf("MEASURE parity %s hidden entry %d (%s): max|d| %.3g of %.3g\n", name, e,
                       e <= hid_L ? "layer output" : "final norm", hd, hm);
                CHECK(gh && hd <= 1e-4 * hm, "%s hidden entry %d: max|d| %.3g exceeds 1e-4 x %.3g", name, e, hd, hm);
            }
            free(hid);
            hid = NULL;
        }
        /* greedy continuation, fp32 */
        int ng = 0;
        const int32_t *gr = golden_greedy(g, p, GOLDEN_REF_F32, &ng);
        const float *gm = golden_greedy_margins(g, p, GOLDEN_REF_F32, &ng);
        if (gr && gm) {
            pt_session *s = NULL;
            pt_session_params sp = {.n_ctx = n + ng + 1};
            REQUIRE(pt_session_create(m32, &sp, &s) == PT_OK && pt_session_prompt(s, ids, (size_t)n) == PT_OK, "greedy: %s",
                    pt_last_error());
            int same = 0, ok = 1;
            for (int j = 0; j < ng; j++) {
                int32_t t = golden_argmax(pt_session_logits(s), V);
                if (t != gr[j]) {
                    ok = gm[j] < 1e-3f; /* a golden near-tie decides nothing after it */
                    break;
                }
                same++;
                if (j + 1 < ng && pt_session_prompt(s, &t, 1) != PT_OK) {
                    ok = 0;
                    break;
                }
            }
            printf("MEASURE parity %s prompt %d greedy f32: %d/%d identical\n", name, p, same, ng);
            CHECK(ok, "%s prompt %d: greedy differs at step %d", name, p, same);
            pt_session_free(&s);
        }
        free(o32);
        free(o1);
        free(o16);
    }
    pt_model_free(&m32);
    pt_model_free(&m1);
    pt_model_free(&m16);
    golden_close(g);
}

static void test_parity_gemma4_dense(void) { check_fixture("gemma4_dense", 0); }
static void test_parity_gemma4_e(void) { check_fixture("gemma4_e", 0); }
static void test_parity_gemma4_mm(void) { check_fixture("gemma4_mm", 0); }
static void test_parity_gemma4_moe(void) { check_fixture("gemma4_moe", 1); }
static void test_parity_gemma4_moe_mlx_q4(void) { check_fixture("gemma4_moe_mlx_q4", 1); }

int main(void) {
    TEST_RUN(test_parity_gemma4_dense);
    TEST_RUN(test_parity_gemma4_e);
    TEST_RUN(test_parity_gemma4_mm);
    TEST_RUN(test_parity_gemma4_moe);
    TEST_RUN(test_parity_gemma4_moe_mlx_q4);
    return test_summary();
}
