/* Fixture parity of the CUDA backend against the CPU backend for the paths
 * the quantized KV cache, the DeltaNet ops and flash attention added: the
 * same model directory loaded on both devices, the same 40-token prompt.
 *   fp32: the logits of every position within 1e-4 × max|logit| (DESIGN.md's
 *         strict bound); --kv-quant 4|8 on llama with prefill chunks of 7
 *         (quantized prefill attention after the first chunk's conversion)
 *         and 1 (every position a decode step), --quantized-kv-start;
 *         qwen3_5_text (chunked delta rule, and token by token),
 *         qwen3_5_moe, qwen3_5_mlx_q4; qwen3_moe (dense bf16 experts) one
 *         position per step, so every token takes the MoE decode kernels.
 *   greedy: 12 tokens after a 30-token prompt identical (up to a CPU
 *         near-tie within 2 bf16 ulps): the model dtype (bf16: the prompt
 *         through the tensor-core flash kernel) and f32, and f32 with
 *         --kv-quant 4|8. In bf16 with a quantized cache, K/V that differ by
 *         one bf16 step between the backends can move a 4-bit code and the
 *         greedy path with it; that case is reported, not gated.
 * Reported, not gated: the demo model with --kv-quant 4 (a 4-bit code on a
 * rounding boundary: the CPU's AVX2 and AVX-512 paths differ by the same
 * amount there). Not covered: gemma2 with --kv-quant 8, the same effect
 * (docs/cuda.md).
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU every test reports SKIP. */
#include "test.h"

#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/mmap.h"
#include "petrel.h"

#include <math.h>
#include <stdlib.h>

enum { NP = 40, NG = 12 };

static int gpu(void) {
    char why[512];
    return pt_cuda_device_count(why, sizeof why) > 0;
}

static pt_model *load(const char *dir, pt_device dev, pt_compute_dtype dt, int kq, int gs, int pc, int start) {
    pt_model_params mp = pt_model_default_params();
    mp.device = dev;
    mp.dtype = dt;
    mp.n_threads = 2;
    if (kq) mp.kv_quant = kq, mp.kv_group_size = gs;
    if (pc) mp.prefill_chunk = pc;
    if (start) mp.quantized_kv_start = start;
    pt_model *m = NULL;
    pt_status s = pt_model_load(dir, &mp, &m);
    CHECK(s == PT_OK, "%s on %s: %s", dir, dev == PT_DEVICE_CUDA ? "cuda" : "cpu", pt_last_error());
    return m;
}

static float *eval(pt_model *m, const int32_t *ids, int n) {
    pt_session *s = NULL;
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)pt_model_vocab_size(m));
    pt_status st = pt_session_create(m, NULL, &s);
    if (st == PT_OK) st = pt_session_eval_logits(s, ids, (size_t)n, lg);
    CHECK(st == PT_OK, "eval: %s", pt_last_error());
    pt_session_free(&s);
    if (st != PT_OK) free(lg), lg = NULL;
    return lg;
}

/* fp32 logits of every position, CPU vs CUDA.
 * The gate is max|dlogit| <= 1e-4 x max|logit|. With a quantized cache there
 * is a second way to pass: the two devices' f32 K/V differ in the last bits
 * (other summation orders in the norms and GEMVs), and a value that sits on
 * a quantization boundary then takes the neighbouring code on one device
 * (one step of its group's scale; the cache bytes are identical for
 * identical inputs — test_cuda_kvq checks that). Such a flip moves the
 * logits by a fraction of what quantization itself changes, so the case also
 * passes when max|dlogit| <= 0.25 x E_q, E_q = max|CPU quantized − CPU
 * full-precision logits| measured here. Wrong quantization semantics (group
 * size, rounding, scale, start) move the logits by about E_q and fail. */
static void logits_case(const char *dir, int kq, int gs, int pc, int start, int gate) {
    if (!pt_is_dir(dir)) {
        printf("INFO %s absent, skipped\n", dir);
        return;
    }
    pt_model *mc = load(dir, PT_DEVICE_CPU, PT_COMPUTE_F32, kq, gs, pc, start);
    pt_model *mg = load(dir, PT_DEVICE_CUDA, PT_COMPUTE_F32, kq, gs, pc, start);
    if (mc && mg) {
        int32_t ids[NP];
        const int V = pt_model_vocab_size(mc);
        for (int i = 0; i < NP; i++) ids[i] = (int32_t)((1 + i * 7) % V);
        float *a = eval(mc, ids, NP), *b = eval(mg, ids, NP);
        if (a && b) {
            double mx = 0, md = 0;
            int nan = 0;
            for (int64_t i = 0; i < (int64_t)NP * V; i++) {
                if (fabs(a[i]) > mx) mx = fabs(a[i]);
                if (isnan(b[i])) nan = 1;
                if (fabs(a[i] - b[i]) > md) md = fabs(a[i] - b[i]);
            }
            double eq = -1; /* E_q: what quantizing the cache changes on the CPU */
            if (kq && md > 1e-4 * mx) {
                pt_model *m0 = load(dir, PT_DEVICE_CPU, PT_COMPUTE_F32, 0, 0, pc, 0);
                float *c = m0 ? eval(m0, ids, NP) : NULL;
                if (c) {
                    eq = 0;
                    for (int64_t i = 0; i < (int64_t)NP * V; i++)
                        if (fabs(a[i] - c[i]) > eq) eq = fabs(a[i] - c[i]);
                }
                free(c);
                pt_model_free(&m0);
            }
            printf("MEASURE %s kv-quant %d (group %d) prefill-chunk %d start %d: max|dlogit| %.3g = %.2e of max|logit|",
                   dir, kq, gs, pc, start, md, md / mx);
            if (eq >= 0) printf(" = %.3f of E_q %.3g (a boundary code flip)", md / eq, eq);
            printf("\n");
            CHECK(!nan, "%s: NaN in the CUDA logits", dir);
            CHECK(!gate || md <= 1e-4 * mx || (eq > 0 && md <= 0.25 * eq),
                  "%s kv-quant %d prefill-chunk %d: max|dlogit| %.3g > 1e-4 x %.3g%s", dir, kq, pc, md, mx,
                  eq >= 0 ? " and > 0.25 x E_q" : "");
        }
        free(a), free(b);
    }
    pt_model_free(&mc);
    pt_model_free(&mg);
}

/* one bf16 ulp at the magnitude of x */
static float ulp_bf16(float x) {
    int e;
    frexpf(fabsf(x) > 0 ? fabsf(x) : 1e-30f, &e);
    return ldexpf(1.0f, e - 8);
}

/* 12 greedy tokens after a 30-token prompt; per step the top two ids, the
 * top1 − top2 margin and the top logit */
static void greedy(pt_model *m, int32_t *out, int32_t (*top2)[2], float *margin, float *topv) {
    pt_session *s = NULL;
    int32_t ids[30];
    const int V = pt_model_vocab_size(m);
    for (int i = 0; i < 30; i++) ids[i] = (int32_t)((3 + i * 11) % V);
    pt_status st = pt_session_create(m, NULL, &s);
    if (st == PT_OK) st = pt_session_prompt(s, ids, 30);
    for (int t = 0; t < NG && st == PT_OK; t++) {
        const float *lg = pt_session_logits(s);
        int b = 0, c = -1;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[b]) c = b, b = i;
            else if (c < 0 || lg[i] > lg[c]) c = i;
        out[t] = b;
        top2[t][0] = b, top2[t][1] = c;
        margin[t] = lg[b] - lg[c];
        topv[t] = lg[b];
        st = pt_session_prompt(s, &out[t], 1);
    }
    CHECK(st == PT_OK, "greedy: %s", pt_last_error());
    pt_session_free(&s);
}

/* Greedy tokens identical, except after a step where the CPU's top two are
 * within 2 bf16 ulps (a near-tie: bf16 rounding decides it) and the GPU
 * picked the other of the two. */
static void greedy_case(const char *dir, pt_compute_dtype dt, int kq, int gs, int info_only) {
    if (!pt_is_dir(dir)) {
        printf("INFO %s absent, skipped\n", dir);
        return;
    }
    pt_model *mc = load(dir, PT_DEVICE_CPU, dt, kq, gs, 0, 0);
    pt_model *mg = load(dir, PT_DEVICE_CUDA, dt, kq, gs, 0, 0);
    if (mc && mg) {
        int32_t a[NG] = {0}, b[NG] = {0}, ta[NG][2], tb[NG][2];
        float ma[NG], mb[NG], va[NG], vb[NG];
        greedy(mc, a, ta, ma, va);
        greedy(mg, b, tb, mb, vb);
        int same = 0;
        while (same < NG && a[same] == b[same]) same++;
        const int tie = same < NG && ma[same] <= 2 * ulp_bf16(va[same]) && b[same] == ta[same][1];
        if (info_only) {
            printf("INFO %s dtype %d kv-quant %d: greedy %s at step %d (cpu %d, cuda %d, cpu margin %.4g)\n", dir,
                   (int)dt, kq, same == NG ? "identical" : "diverges", same, same < NG ? a[same] : 0,
                   same < NG ? b[same] : 0, same < NG ? ma[same] : 0);
        } else if (same < NG && tie)
            printf("INFO %s kv-quant %d: greedy near-tie at step %d (cpu margin %.4g): cpu %d, cuda %d\n", dir, kq,
                   same, ma[same], a[same], b[same]);
        CHECK(info_only || same == NG || tie, "%s kv-quant %d: greedy differs at step %d (cpu %d, cuda %d, cpu margin %.4g)", dir,
              kq, same, same < NG ? a[same] : 0, same < NG ? b[same] : 0, same < NG ? ma[same] : 0);
    }
    pt_model_free(&mc);
    pt_model_free(&mg);
}

static void test_kv_quant_llama(void) {
    if (!gpu()) TEST_SKIP("no usable CUDA device here");
    logits_case("tests/fixtures/llama", 4, 64, 7, 0, 1);
    logits_case("tests/fixtures/llama", 8, 64, 7, 0, 1);
    logits_case("tests/fixtures/llama", 4, 64, 1, 0, 1);
    logits_case("tests/fixtures/llama", 8, 32, 1, 0, 1);
    logits_case("tests/fixtures/llama", 4, 64, 4, 9, 1);
    logits_case("tests/fixtures/gemma2", 4, 32, 7, 0, 1); /* window 16 (a ring), soft-cap */
    /* on the demo model a 4-bit K/V code sits on a rounding boundary (the
     * CPU's own AVX2 and AVX-512 kernels differ by the same 3.9e-3 of
     * max|logit| there, docs/cuda.md): the E_q rule above applies */
    logits_case("models/kjv-llama-4bit", 4, 64, 7, 0, 1);
    logits_case("models/kjv-llama-4bit", 4, 64, 1, 0, 1);
    greedy_case("tests/fixtures/llama", PT_COMPUTE_F32, 4, 64, 0);
    greedy_case("tests/fixtures/llama", PT_COMPUTE_F32, 8, 64, 0);
    greedy_case("models/kjv-llama-4bit", PT_COMPUTE_F32, 4, 64, 0);
    greedy_case("models/kjv-llama-4bit", PT_COMPUTE_F32, 8, 64, 0);
    /* bf16 with a quantized cache: K/V that differ by one bf16 step can move
     * a 4-bit code, and the greedy path with it (docs/cuda.md); reported */
    greedy_case("models/kjv-llama-4bit", PT_COMPUTE_MODEL, 4, 64, 1);
}

static void test_qwen35(void) {
    if (!gpu()) TEST_SKIP("no usable CUDA device here");
    logits_case("tests/fixtures/qwen3_5_text", 0, 0, 0, 0, 1);
    logits_case("tests/fixtures/qwen3_5_text", 0, 0, 1, 0, 1);
    logits_case("tests/fixtures/qwen3_5_text", 8, 32, 9, 0, 1);
    logits_case("tests/fixtures/qwen3_5_moe", 0, 0, 0, 0, 1);
    logits_case("tests/fixtures/qwen3_5_mlx_q4", 0, 0, 1, 0, 1);
    greedy_case("tests/fixtures/qwen3_5_text", PT_COMPUTE_F32, 0, 0, 0);
    greedy_case("tests/fixtures/qwen3_5_text", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("tests/fixtures/qwen3_5_moe", PT_COMPUTE_MODEL, 0, 0, 0);
}

/* qwen3_moe (dense bf16 experts): every position a decode step, so each
 * token's experts run on the decode kernels for bf16 stacks (moe_dense.cu) */
static void test_qwen3_moe(void) {
    if (!gpu()) TEST_SKIP("no usable CUDA device here");
    logits_case("tests/fixtures/qwen3_moe", 0, 0, 1, 0, 1);
    greedy_case("tests/fixtures/qwen3_moe", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("tests/fixtures/qwen3_moe", PT_COMPUTE_F32, 0, 0, 0);
}

static void test_flash_greedy(void) {
    if (!gpu()) TEST_SKIP("no usable CUDA device here");
    greedy_case("tests/fixtures/llama", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("tests/fixtures/gemma2", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("tests/fixtures/gemma3_text", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("tests/fixtures/qwen3", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("models/kjv-llama-4bit", PT_COMPUTE_MODEL, 0, 0, 0);
    greedy_case("models/kjv-llama-4bit", PT_COMPUTE_F32, 0, 0, 0);
}

int main(void) {
    TEST_RUN(test_kv_quant_llama);
    TEST_RUN(test_qwen35);
    TEST_RUN(test_qwen3_moe);
    TEST_RUN(test_flash_greedy);
    return test_summary();
}
