/* Sampler tests: greedy, temperature distribution, top-k/top-p/min-p sets,
 * penalties, mask, logprobs, seeds, parameter validation. */
#include "test.h"

#include "runtime/sampler.h"

#include <math.h>

static pt_sampling_params params(void) {
    pt_sampling_params sp = {0};
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    sp.repetition_penalty = 1.0f;
    sp.repeat_last_n = 64;
    sp.seed = 1234;
    return sp;
}

static void test_greedy(void) {
    pt_sampler s;
    REQUIRE(pt_sampler_init(&s, 5) == PT_OK, "init");
    float lg[5] = {0.1f, 3.0f, -2.0f, 3.0f, 1.0f};
    pt_sampling_params sp = params();
    sp.temperature = 0;
    pt_token_info ti;
    REQUIRE(pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 1, "ties go to the lowest id, got %d", ti.id);
    uint8_t allow[5] = {1, 0, 1, 1, 1};
    REQUIRE(pt_sampler_sample(&s, lg, &sp, NULL, 0, allow, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 3, "mask excludes id 1, got %d", ti.id);
    uint8_t none[5] = {0};
    CHECK(pt_sampler_sample(&s, lg, &sp, NULL, 0, none, &ti) == PT_ERR_INVALID_ARG, "empty mask is an error");
    pt_sampler_free(&s);
}

static void counts(float *lg, int V, pt_sampling_params *sp, int n, int *cnt) {
    pt_sampler s;
    pt_sampler_init(&s, V);
    pt_sampler_seed(&s, sp->seed);
    memset(cnt, 0, sizeof(int) * (size_t)V);
    for (int i = 0; i < n; i++) {
        pt_token_info ti;
        if (pt_sampler_sample(&s, lg, sp, NULL, 0, NULL, &ti) != PT_OK) break;
        cnt[ti.id]++;
    }
    pt_sampler_free(&s);
}

static void test_distribution(void) {
    float lg[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int cnt[4];
    pt_sampling_params sp = params();
    int n = 40000;
    counts(lg, 4, &sp, n, cnt);
    double want[4] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < 4; i++)
        CHECK(fabs(cnt[i] / (double)n - want[i]) < 0.012, "p[%d] = %.4f, want %.2f", i, cnt[i] / (double)n,
              want[i]);
    /* temperature 0.5 squares the probabilities: 0.25:0.09:0.0225:0.0025 */
    sp.temperature = 0.5f;
    counts(lg, 4, &sp, n, cnt);
    double z = 0.25 + 0.09 + 0.0225 + 0.0025;
    CHECK(fabs(cnt[0] / (double)n - 0.25 / z) < 0.012, "T=0.5: p0 %.4f want %.4f", cnt[0] / (double)n, 0.25 / z);
    printf("MEASURE sampler T=0.5 frequencies %.4f %.4f %.4f %.4f over %d draws\n", cnt[0] / (double)n,
           cnt[1] / (double)n, cnt[2] / (double)n, cnt[3] / (double)n, n);
}

static void test_filters(void) {
    float lg[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int cnt[4];
    pt_sampling_params sp = params();
    sp.top_k = 2;
    counts(lg, 4, &sp, 5000, cnt);
    CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[0] > 0 && cnt[1] > 0, "top_k 2: %d %d %d %d", cnt[0], cnt[1], cnt[2],
          cnt[3]);
    CHECK(fabs(cnt[0] / 5000.0 - 0.625) < 0.03, "top_k renormalizes: %.3f", cnt[0] / 5000.0);
    sp = params();
    sp.top_p = 0.6f; /* 0.5 < 0.6 <= 0.8: keeps {0, 1} */
    counts(lg, 4, &sp, 5000, cnt);
    CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[1] > 0, "top_p 0.6: %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    sp.top_p = 0.5f; /* exactly the first: keeps {0} */
    counts(lg, 4, &sp, 2000, cnt);
    CHECK(cnt[0] == 2000, "top_p 0.5 keeps only id 0: %d", cnt[0]);
    sp = params();
    sp.min_p = 0.5f; /* keeps p >= 0.25: {0, 1} */
    counts(lg, 4, &sp, 5000, cnt);
    CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[1] > 0, "min_p 0.5: %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
}

/* top-p over a large vocabulary (the thresholded partial sort) against a
 * brute-force nucleus. */
static void test_top_p_large(void) {
    enum { V = 30000 };
    static float lg[V];
    static uint8_t in_nucleus[V];
    uint64_t x = 42;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((x >> 40) % 1000) / 100.0f; /* many ties */
    }
    float mx = 0;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, lg[i]);
    double total = 0;
    for (int i = 0; i < V; i++) total += expf(lg[i] - mx);
    /* brute force: repeatedly take the largest (lowest id on ties) */
    double cum = 0;
    memset(in_nucleus, 0, sizeof in_nucleus);
    int n_nuc = 0;
    while (cum < 0.9 * total) {
        int best = -1;
        for (int i = 0; i < V; i++)
            if (!in_nucleus[i] && (best < 0 || lg[i] > lg[best])) best = i;
        in_nucleus[best] = 1;
        cum += expf(lg[best] - mx);
        n_nuc++;
    }
    pt_sampler s;
    REQUIRE(pt_sampler_init(&s, V) == PT_OK, "init");
    pt_sampling_params sp = params();
    sp.top_p = 0.9f;
    int bad = 0;
    for (int k = 0; k < 300; k++) {
        pt_token_info ti;
        REQUIRE(pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti) == PT_OK, "%s", pt_last_error());
        if (!in_nucleus[ti.id]) bad++;
    }
    CHECK(bad == 0, "%d draws outside the %d-token nucleus", bad, n_nuc);
    pt_sampler_free(&s);
}

static void test_penalties(void) {
    pt_sampler s;
    REQUIRE(pt_sampler_init(&s, 4) == PT_OK, "init");
    pt_sampling_params sp = params();
    sp.temperature = 0;
    float lg[4] = {2.0f, 1.9f, -1.0f, -1.1f};
    int32_t hist[3] = {0, 0, 2};
    pt_token_info ti;
    sp.repetition_penalty = 2.0f; /* 2 -> 1 so id 1 wins */
    REQUIRE(pt_sampler_sample(&s, lg, &sp, hist, 3, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 1, "repetition penalty: got %d", ti.id);
    sp.repeat_last_n = 1; /* only id 2 in the window: id 0 keeps 2.0 */
    REQUIRE(pt_sampler_sample(&s, lg, &sp, hist, 3, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 0, "repeat_last_n 1: got %d", ti.id);
    sp = params();
    sp.temperature = 0;
    sp.frequency_penalty = 0.06f; /* 2 - 2*0.06 = 1.88 < 1.9 */
    REQUIRE(pt_sampler_sample(&s, lg, &sp, hist, 3, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 1, "frequency penalty: got %d", ti.id);
    sp.frequency_penalty = 0.04f; /* 1.92 > 1.9 */
    REQUIRE(pt_sampler_sample(&s, lg, &sp, hist, 3, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 0, "small frequency penalty: got %d", ti.id);
    sp.frequency_penalty = 0;
    sp.presence_penalty = 0.2f;
    REQUIRE(pt_sampler_sample(&s, lg, &sp, hist, 3, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 1, "presence penalty: got %d", ti.id);
    /* the penalty bookkeeping leaves no state behind */
    sp.presence_penalty = 0;
    REQUIRE(pt_sampler_sample(&s, lg, &sp, hist, 3, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 0, "no penalty: got %d", ti.id);
    pt_sampler_free(&s);
}

static void test_logprobs(void) {
    pt_sampler s;
    REQUIRE(pt_sampler_init(&s, 6) == PT_OK, "init");
    float lg[6] = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};
    pt_sampling_params sp = params();
    sp.temperature = 0;
    sp.n_logprobs = 3;
    pt_token_info ti;
    REQUIRE(pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti) == PT_OK, "%s", pt_last_error());
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(lg[i]);
    CHECK(ti.n_top == 3, "n_top %d", ti.n_top);
    CHECK(ti.top_ids[0] == 1 && ti.top_ids[1] == 4 && ti.top_ids[2] == 3, "top ids %d %d %d", ti.top_ids[0],
          ti.top_ids[1], ti.top_ids[2]);
    CHECK(fabs(ti.logprob - (2.0 - log(z))) < 1e-6, "logprob %g want %g", ti.logprob, 2.0 - log(z));
    CHECK(fabs(ti.top_logprobs[2] - (1.5 - log(z))) < 1e-6, "top logprob %g", ti.top_logprobs[2]);
    sp.n_logprobs = 21;
    CHECK(pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti) == PT_ERR_INVALID_ARG, "n_logprobs 21 rejected");
    /* no_logprob: logprob 0 when no top entries are asked for, the same choice (greedy and a seeded draw);
     * with top entries it is computed anyway */
    sp.n_logprobs = 0;
    for (int draw = 0; draw < 2; draw++) {
        sp.temperature = draw ? 1.0f : 0.0f;
        pt_token_info a, b;
        sp.no_logprob = 0;
        REQUIRE(pt_sampler_sample_u(&s, lg, &sp, NULL, 0, NULL, draw ? 0.6 : -1.0, &a) == PT_OK, "%s", pt_last_error());
        sp.no_logprob = 1;
        REQUIRE(pt_sampler_sample_u(&s, lg, &sp, NULL, 0, NULL, draw ? 0.6 : -1.0, &b) == PT_OK, "%s", pt_last_error());
        CHECK(a.id == b.id, "draw %d: id %d with the log-probability, %d without", draw, a.id, b.id);
        CHECK(fabs(a.logprob - (lg[a.id] - log(z))) < 1e-6, "draw %d: logprob %g", draw, a.logprob);
        CHECK(b.logprob == 0.0f && b.n_top == 0, "draw %d: no_logprob gave logprob %g, %d top", draw, b.logprob,
              b.n_top);
    }
    sp.n_logprobs = 2;
    REQUIRE(pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.n_top == 2 && fabs(ti.logprob - (lg[ti.id] - log(z))) < 1e-6,
          "no_logprob with 2 top entries: %d top, logprob %g", ti.n_top, ti.logprob);
    pt_sampler_free(&s);
}

/* Logprobs over a vocabulary the size of Llama 3's (odd length, so the
 * vectorized log-sum-exp's tail runs): every token's logprob against a
 * double-precision log-softmax, with -inf entries (masked tokens), logits far
 * below the max (exp underflows to 0) and a NaN (skipped by the max). */
static void test_logprobs_large_vocab(void) {
    const int V = 128257;
    float *lg = malloc((size_t)V * sizeof *lg);
    REQUIRE(lg, "alloc");
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        lg[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 40.0 - 25.0);
    }
    lg[5] = -INFINITY, lg[V - 1] = -INFINITY, lg[77] = -300.0f, lg[1000] = 15.5f;
    double mx = 15.5, z = 0; /* thousands of terms within a few units of the max */
    for (int i = 0; i < V; i++)
        if (lg[i] > -INFINITY) z += exp((double)lg[i] - mx);
    double lse = mx + log(z), worst = 0;
    for (int id = 0; id < V; id += 331) {
        if (!(lg[id] > -INFINITY)) continue;
        double e = fabs(pt_logprob_of(lg, V, id) - ((double)lg[id] - lse));
        if (e > worst) worst = e;
    }
    CHECK(worst < 5e-6, "logprob error %g over a 128k vocabulary", worst);
    CHECK(pt_logprob_of(lg, V, 5) == -INFINITY, "a -inf logit has logprob -inf, got %g", pt_logprob_of(lg, V, 5));
    CHECK(fabs(pt_logprob_of(lg, V, 1000) - (15.5 - lse)) < 5e-6, "the max's logprob");
    lg[9] = NAN;
    CHECK(fabs(pt_logprob_of(lg, V, 1000) - (15.5 - lse)) < 5e-6, "a NaN logit does not disturb the others");
    pt_sampler s;
    REQUIRE(pt_sampler_init(&s, V) == PT_OK, "init");
    pt_sampling_params sp = params();
    sp.temperature = 0;
    sp.n_logprobs = 2;
    pt_token_info ti;
    REQUIRE(pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.id == 1000 && fabs(ti.logprob - (15.5 - lse)) < 5e-6, "greedy id %d logprob %g", ti.id, ti.logprob);
    pt_sampler_free(&s);
    free(lg);
}

static void test_seed(void) {
    float lg[50];
    for (int i = 0; i < 50; i++) lg[i] = sinf((float)i) * 2;
    pt_sampling_params sp = params();
    int a[64], b[64], c[64];
    for (int run = 0; run < 3; run++) {
        pt_sampler s;
        pt_sampler_init(&s, 50);
        pt_sampler_seed(&s, run == 2 ? 99 : 7);
        for (int i = 0; i < 64; i++) {
            pt_token_info ti;
            pt_sampler_sample(&s, lg, &sp, NULL, 0, NULL, &ti);
            (run == 0 ? a : run == 1 ? b : c)[i] = ti.id;
        }
        pt_sampler_free(&s);
    }
    CHECK(!memcmp(a, b, sizeof a), "same seed, same tokens");
    CHECK(memcmp(a, c, sizeof a) != 0, "different seeds differ");
}

static void test_validate(void) {
    pt_sampling_params sp = params();
    CHECK(pt_sampling_validate(&sp) == PT_OK, "defaults valid");
    sp.temperature = -1;
    CHECK(pt_sampling_validate(&sp) == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "temperature"), "temp");
    sp = params();
    sp.top_p = 0;
    CHECK(pt_sampling_validate(&sp) == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "top_p"), "top_p");
    sp = params();
    sp.min_p = 1.5f;
    CHECK(pt_sampling_validate(&sp) == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "min_p"), "min_p");
    sp = params();
    sp.repetition_penalty = 0;
    CHECK(pt_sampling_validate(&sp) == PT_ERR_INVALID_ARG, "repetition_penalty");
    sp = params();
    sp.top_k = -2;
    CHECK(pt_sampling_validate(&sp) == PT_ERR_INVALID_ARG, "top_k");
}

int main(void) {
    TEST_RUN(test_greedy);
    TEST_RUN(test_distribution);
    TEST_RUN(test_filters);
    TEST_RUN(test_top_p_large);
    TEST_RUN(test_penalties);
    TEST_RUN(test_logprobs);
    TEST_RUN(test_logprobs_large_vocab);
    TEST_RUN(test_seed);
    TEST_RUN(test_validate);
    return test_summary();
}
