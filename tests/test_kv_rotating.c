/* Rotating (sliding-window) KV caches on the Gemma fixtures: with
 * --prefill-chunk 5 the sliding layers keep a ring of window + 4 rows (20 for
 * window 16), far shorter than the prompt plus generation (44 + 32), so the
 * ring wraps many times. Held to the transformers goldens like the L1 parity
 * tests: fp32 logits of every prompt position within 1e-4 × max|logit|, and
 * the greedy continuation identical. Then truncation: keeping a prefix whose
 * window the ring still holds works and continues exactly like the first
 * run; keeping one whose window was overwritten is refused (PT_ERR_RANGE). */
#include "test.h"

#include "golden.h"
#include "model/model.h"
#include "petrel.h"
#include "runtime/kv_cache.h"

#include <math.h>

static void check_fixture(const char *fixture) {
    char err[256], dir[128];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    golden *g = golden_open_fixture(fixture, err, sizeof err);
    REQUIRE(g, "%s", err);
    int p = golden_n_prompts(g) - 1, n = 0, n_pos = 0, V = 0, ng = 0;
    const int32_t *ids = golden_prompt_ids(g, p, &n);
    const float *ref = golden_logits(g, p, GOLDEN_REF_F32, &n_pos, &V);
    const int32_t *greedy = golden_greedy(g, p, GOLDEN_REF_F32, &ng);
    const float *gm = golden_greedy_margins(g, p, GOLDEN_REF_F32, &ng);
    REQUIRE(ids && ref && greedy && gm && n_pos == n, "%s: prompt %d goldens", fixture, p);
    pt_model_params mp = pt_model_default_params();
    mp.dtype = PT_COMPUTE_F32;
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = 2;
    mp.prefill_chunk = 5;
    pt_model *m = NULL;
    REQUIRE(pt_model_load(dir, &mp, &m) == PT_OK, "load: %s", pt_last_error());
    int n_ctx = n + ng + 1, rings = 0;
    for (int l = 0; l < m->net.n_layers; l++) {
        int64_t cap = pt_kv_layer_capacity(&m->net, l, n_ctx, 5);
        if (m->net.layers[l].attn.window > 0) {
            CHECK(cap == m->net.layers[l].attn.window + 4, "%s layer %d: ring of %lld rows", fixture, l, (long long)cap);
            rings++;
        }
    }
    CHECK(rings > 0, "%s has sliding-window layers", fixture);
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n_ctx};
    REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "session: %s", pt_last_error());
    float *out = malloc(sizeof(float) * (size_t)n * V), *steps = malloc(sizeof(float) * (size_t)ng * V);
    REQUIRE(out && steps, "memory");
    REQUIRE(pt_session_eval_logits(s, ids, (size_t)n, out) == PT_OK, "prefill: %s", pt_last_error());
    double md = 0, ml = 0;
    for (int64_t i = 0; i < (int64_t)n * V; i++) {
        double d = fabs((double)ref[i] - out[i]);
        if (d > md) md = d;
        if (fabs(ref[i]) > ml) ml = fabs(ref[i]);
    }
    /* greedy past the window, feeding our own choices */
    int same = 0, decided = ng;
    for (int j = 0; j < ng; j++) {
        const float *lg = pt_session_logits(s);
        memcpy(steps + (size_t)j * V, lg, sizeof(float) * V);
        int32_t t = golden_argmax(lg, V);
        if (t != greedy[j]) {
            if (gm[j] < 1e-3f) decided = j; /* a golden near-tie: the rest is not decided */
            break;
        }
        same++;
        if (j + 1 < ng) REQUIRE(pt_session_prompt(s, &t, 1) == PT_OK, "decode: %s", pt_last_error());
    }
    printf("MEASURE rotating %s (ring window+4): prompt max|dlogit| %.3g of max|logit| %.3g; greedy %d/%d identical "
           "(%d tokens past the window)\n",
           fixture, md, ml, same, ng, n + ng - 16);
    CHECK(md <= 1e-4 * ml, "%s: max|dlogit| %.3g exceeds 1e-4 x %.3g", fixture, md, ml);
    CHECK(same >= decided, "%s: greedy differs at step %d", fixture, same);
    /* truncation: the ring holds the last window + 4 positions */
    size_t held = pt_session_n_tokens(s);
    CHECK(pt_session_truncate(s, held - 20) == PT_ERR_RANGE, "%s: truncating past the ring is refused", fixture);
    CHECK(pt_session_n_tokens(s) == held, "a refused truncation changes nothing");
    if (same == ng) {
        REQUIRE(pt_session_truncate(s, held - 3) == PT_OK, "truncate by 3: %s", pt_last_error());
        /* re-feed the last 3 tokens: same logits as the first time */
        int32_t again[3] = {greedy[ng - 4], greedy[ng - 3], greedy[ng - 2]};
        float re[3 * 512];
        REQUIRE(V <= 512, "vocab");
        REQUIRE(pt_session_eval_logits(s, again, 3, re) == PT_OK, "re-feed: %s", pt_last_error());
        double rd = 0;
        for (int i = 0; i < 3 * V; i++) {
            double d = fabs((double)re[i] - steps[(size_t)(ng - 3) * V + i]);
            if (d > rd) rd = d;
        }
        CHECK(rd <= 1e-4 * ml, "%s: after truncation the logits differ by %.3g", fixture, rd);
    }
    CHECK(pt_session_truncate(s, 0) == PT_OK, "truncate to 0");
    free(out);
    free(steps);
    pt_session_free(&s);
    pt_model_free(&m);
    golden_close(g);
}

static void test_rotating_gemma2(void) { check_fixture("gemma2"); }
static void test_rotating_gemma3(void) { check_fixture("gemma3_text"); }

int main(void) {
    TEST_RUN(test_rotating_gemma2);
    TEST_RUN(test_rotating_gemma3);
    return test_summary();
}
