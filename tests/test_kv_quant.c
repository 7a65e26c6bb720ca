/* L2 parity: the quantized KV cache (DESIGN.md "Quantized KV, exactly")
 * against the llama fixture's quantized-KV references (tests/fixtures/README.md
 * "Quantized-KV references"): 8-bit, 4-bit, per-layer kv_config.json, and a
 * late start (conversion after the second prefill chunk).
 *
 * Each scenario loads the fp32 fixture with the scenario's levers
 * (--kv-quant, --kv-group-size, --prefill-chunk, --quantized-kv-start),
 * checks which layers get quantized, prefills prompt 3 in chunks and compares
 * the logits of every position, then feeds the reference's greedy tokens one
 * by one and compares each step's logits; the greedy choice must match at
 * every step. Gate (the L1 strict check, applied to the quantized reference):
 * max|Δlogit| <= 1e-4 × max|logit|. Prints max|Δ| and the mean KL. */
#include "test.h"

#include "golden.h"
#include "model/model.h"
#include "petrel.h"
#include "runtime/kv_cache.h"

#include <math.h>
#include <string.h>

static double kl(const float *ref, const float *ours, int V) {
    double mr = -INFINITY, mo = -INFINITY, sr = 0, so = 0, k = 0;
    for (int i = 0; i < V; i++) {
        if (ref[i] > mr) mr = ref[i];
        if (ours[i] > mo) mo = ours[i];
    }
    for (int i = 0; i < V; i++) {
        sr += exp(ref[i] - mr);
        so += exp(ours[i] - mo);
    }
    for (int i = 0; i < V; i++) {
        double lp = ref[i] - mr - log(sr), lq = ours[i] - mo - log(so);
        k += exp(lp) * (lp - lq);
    }
    return k;
}

/* max|a-b| and max|a| over n values, accumulated */
static void diff(const float *ref, const float *ours, int64_t n, double *maxd, double *maxl) {
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)ref[i] - ours[i]);
        if (d > *maxd) *maxd = d;
        if (fabs(ref[i]) > *maxl) *maxl = fabs(ref[i]);
    }
}

static void run_scenario(const golden *g, int s, int threads) {
    golden_qkv q;
    REQUIRE(golden_qkv_get(g, s, &q) == 0, "scenario %d present", s);
    int n_ids = 0;
    const int32_t *ids = golden_prompt_ids(g, 3, &n_ids);
    REQUIRE(ids && n_ids == q.n_prompt, "prompt 3 has the scenario's %d ids (found %d)", q.n_prompt, n_ids);
    pt_model_params mp = pt_model_default_params();
    mp.dtype = PT_COMPUTE_F32;
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = threads;
    mp.kv_quant = q.kv_bits ? q.kv_bits : PT_KV_QUANT_CONFIG;
    mp.kv_group_size = q.group_size;
    mp.prefill_chunk = q.prefill_chunk;
    mp.quantized_kv_start = q.quantized_kv_start;
    pt_model *m = NULL;
    REQUIRE(pt_model_load("tests/fixtures/llama", &mp, &m) == PT_OK, "load: %s", pt_last_error());
    REQUIRE(q.n_layers == m->net.n_layers, "layer count %d vs %d", q.n_layers, m->net.n_layers);
    for (int l = 0; l < q.n_layers; l++) {
        int bits, gs;
        pt_kv_layer_quant(m, l, &bits, &gs);
        CHECK(bits == q.layer_bits[l], "scenario %d layer %d: %d bits, reference %d", s, l, bits, q.layer_bits[l]);
        if (bits) CHECK(gs == q.group_size, "scenario %d layer %d: group size %d, reference %d", s, l, gs, q.group_size);
    }
    int V = q.vocab;
    pt_session *ss = NULL;
    pt_session_params sp = {.n_ctx = q.n_prompt + q.n_greedy + 4};
    REQUIRE(pt_session_create(m, &sp, &ss) == PT_OK, "session: %s", pt_last_error());
    float *out = malloc((size_t)q.n_prompt * V * sizeof *out);
    REQUIRE(out, "memory");
    CHECK(pt_session_eval_logits(ss, ids, (size_t)q.n_prompt, out) == PT_OK, "prefill: %s", pt_last_error());
    double maxd = 0, maxl = 0, klsum = 0;
    int nkl = 0;
    diff(q.prompt_logits, out, (int64_t)q.n_prompt * V, &maxd, &maxl);
    for (int i = 0; i < q.n_prompt; i++, nkl++) klsum += kl(q.prompt_logits + (size_t)i * V, out + (size_t)i * V, V);
    const float *last = pt_session_logits(ss);
    CHECK(last && golden_argmax(last, V) == q.greedy[0], "scenario %d: first greedy token %d, reference %d", s,
          last ? golden_argmax(last, V) : -1, q.greedy[0]);
    int greedy_ok = 1;
    for (int j = 0; j + 1 < q.n_greedy; j++) {
        int32_t t = q.greedy[j];
        if (pt_session_prompt(ss, &t, 1) != PT_OK) {
            CHECK(0, "decode step %d: %s", j, pt_last_error());
            break;
        }
        const float *lg = pt_session_logits(ss);
        const float *ref = q.step_logits + (size_t)j * V;
        diff(ref, lg, V, &maxd, &maxl);
        klsum += kl(ref, lg, V);
        nkl++;
        if (golden_argmax(lg, V) != q.greedy[j + 1]) greedy_ok = 0;
    }
    printf("MEASURE kv_quant scenario %d (bits %d, chunk %d, start %d, %d threads): max|dlogit| %.3g, max|logit| "
           "%.3g, ratio %.3g, mean KL %.3g over %d positions\n",
           s, q.kv_bits, q.prefill_chunk, q.quantized_kv_start, threads, maxd, maxl, maxd / maxl, klsum / nkl, nkl);
    CHECK(maxd <= 1e-4 * maxl, "scenario %d: max|dlogit| %.3g exceeds 1e-4 x max|logit| %.3g", s, maxd, maxl);
    CHECK(greedy_ok, "scenario %d: greedy differs from the reference", s);
    free(out);
    pt_session_free(&ss);
    pt_model_free(&m);
}

static void test_kv_quant_goldens(void) {
    char err[256];
    golden *g = golden_open_fixture("llama", err, sizeof err);
    REQUIRE(g, "%s", err);
    int n = golden_n_qkv(g);
    REQUIRE(n >= 4, "the llama fixture has %d quantized-KV scenarios (expected 4)", n);
    for (int s = 0; s < n; s++) run_scenario(g, s, 2);
    golden_close(g);
}

/* Quantized KV on rotating caches shared across layers (gemma4_e: sliding
 * window 16, layers 2-3 read the caches of 0-1), prefill chunks of 5 so the
 * rings wrap and the conversion happens mid-prompt, then decode steps with
 * the fused kernel: the logits must be bit-identical for 1 and 2 threads
 * (DESIGN.md: CPU output independent of the thread count in every tier). */
static void run_rotating_shared(int threads, int fused, float *out, int n_steps) {
    char err[256];
    golden *g = golden_open_fixture("gemma4_e", err, sizeof err);
    REQUIRE(g, "%s", err);
    int n = 0;
    const int32_t *ids = golden_prompt_ids(g, golden_n_prompts(g) - 1, &n);
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = threads;
    mp.kv_quant = 8;
    mp.kv_group_size = 32;
    mp.prefill_chunk = 5;
    mp.quantized_kv_start = 12;
    mp.fused_decode_attn = fused ? PT_LEVER_ON : PT_LEVER_OFF;
    pt_model *m = NULL;
    REQUIRE(pt_model_load("tests/fixtures/gemma4_e", &mp, &m) == PT_OK, "load: %s", pt_last_error());
    int V = pt_model_vocab_size(m);
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n + n_steps + 1};
    REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "session: %s", pt_last_error());
    REQUIRE(pt_session_eval_logits(s, ids, (size_t)n, out) == PT_OK, "prefill: %s", pt_last_error());
    for (int j = 0; j < n_steps; j++) {
        int32_t t = golden_argmax(pt_session_logits(s), V);
        REQUIRE(pt_session_prompt(s, &t, 1) == PT_OK, "decode: %s", pt_last_error());
        memcpy(out + (size_t)(n + j) * V, pt_session_logits(s), sizeof(float) * V);
    }
    pt_session_free(&s);
    pt_model_free(&m);
    golden_close(g);
}

static void test_kv_quant_rotating_shared_threads(void) {
    const int n_steps = 24, rows = 44 + n_steps, V = 320;
    float *a = calloc((size_t)rows * V, sizeof *a), *b = calloc((size_t)rows * V, sizeof *b);
    REQUIRE(a && b, "memory");
    for (int fused = 0; fused < 2; fused++) {
        run_rotating_shared(1, fused, a, n_steps);
        run_rotating_shared(2, fused, b, n_steps);
        CHECK(!memcmp(a, b, sizeof(float) * (size_t)rows * V),
              "gemma4_e, 8-bit KV, rings, shared caches%s: 1 and 2 threads differ", fused ? ", fused decode" : "");
    }
    free(a);
    free(b);
}

int main(void) {
    TEST_RUN(test_kv_quant_goldens);
    TEST_RUN(test_kv_quant_rotating_shared_threads);
    return test_summary();
}
