/* Continuous batching on the GPU (docs/batching.md): batch invariance as a
 * tested property of the CUDA batched decode step. A request's greedy tokens
 * and its logits, bit for bit, are the same whether it is decoded alone
 * (pt_session_prompt, T = 1: the single-session compiled decode graph) or in
 * a batch with others (pt_session_decode_batch: one CUDA graph per batch-size
 * bucket, multi-sequence attention, matmul_rows):
 *   - batch sizes 1..8, 13 and 16 (buckets 1, 2, 4, 8, 16; 13 runs in the
 *     16-row graph with 3 padding rows), sessions at different positions;
 *   - sessions joining (prefilled between steps) and leaving at different
 *     steps, two of them cancelled mid-batch;
 *   - the same step run eagerly (--compiled-decode off);
 *   - with 8-bit quantized KV converting mid-run (those sessions' steps run
 *     the per-sequence ops row by row, outside the graphs);
 *   - on the bundled 4-bit demo model (bf16 and f32 activations), on the
 *     llama-3.2-1b shape with random 4-bit weights (the real projection
 *     widths of the fast GEMV), and on the family fixtures the CUDA backend
 *     runs (QK-norm, sliding window + sandwich norms, MoE, MiniCPM's
 *     longrope, whose per-row table choice keeps its steps out of graphs).
 * Prompt rows: tests/cuda/test_cuda_batch_rows.c.
 * The test also checks that the steps ran where they should (from a graph,
 * or eagerly in table mode) rather than in the row-by-row fallback. On a
 * machine without a usable GPU it reports that and skips. */
#include "test.h"
#include "batch_check.h"

#include "backend/cuda/cuda.h"
#include "base/mmap.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"
#include "runtime/batch.h"

#include <stdint.h>

enum { MAXS = 16, STEPS = 6 };

static int prompt_len(int i) { return 2 + 3 * i; }

static int g_kv_quant; /* --kv-quant for the next loads (0 = off) */

static pt_model *load(const char *dir, pt_compute_dtype dt, int compiled) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    if (g_kv_quant) {
        mp.kv_quant = g_kv_quant;
        mp.quantized_kv_start = 8; /* each session's cache converts at its own step */
    }
    mp.dtype = dt;
    mp.compiled_decode = compiled ? PT_LEVER_ON : PT_LEVER_OFF;
    pt_model *m = NULL;
    if (strncmp(dir, "synthetic:", 10) == 0) {
        if (pt_model_synthetic(dir + 10, "q4", &mp, &m) != PT_OK) printf("INFO %s: %s\n", dir, pt_last_error());
    } else if (pt_model_load(dir, &mp, &m) != PT_OK) {
        printf("INFO %s on CUDA: %s\n", dir, pt_last_error());
    }
    return m;
}

/* want_graph: 1 = the compiled run must have replayed graphs and the eager
 * one run in table mode; 0 = both in table mode, eagerly (longrope); -1 =
 * quantized KV: steps with a converted cache must have run in row mode. */
static void check_model(const char *dir, pt_compute_dtype dt, int every_size, int want_graph) {
    if (strncmp(dir, "synthetic:", 10) && !pt_is_dir(dir)) {
        printf("INFO batch: %s absent, skipped\n", dir);
        return;
    }
    pt_model *m1 = load(dir, dt, 1);
    if (!m1) { /* a family the CUDA backend does not run yet: said above */
        CHECK(strncmp(dir, "models/", 7) && strncmp(dir, "synthetic:", 10), "%s must load on CUDA", dir);
        return;
    }
    batch_ref r;
    int ok = batch_ref_make(m1, &r, MAXS, STEPS, prompt_len);
    CHECK(ok, "%s: reference decode: %s", dir, pt_last_error());
    for (int compiled = 1; ok && compiled >= 0; compiled--) {
        pt_model *m = compiled ? m1 : load(dir, dt, 0);
        CHECK(m, "load %s eagerly", dir);
        if (!m) break;
        int full[MAXS], zero[MAXS] = {0}, max_b = 0;
        for (int i = 0; i < MAXS; i++) full[i] = STEPS;
        for (int n = 1; n <= MAXS; n++) {
            if (!(n <= 8 || n == 13 || n == 16)) continue;
            if (!every_size && n != 1 && n != 3 && n != 8 && n != 13) continue;
            int bad = batch_run(m, &r, n, zero, full, &max_b);
            CHECK(bad == 0 && max_b == n, "%s dtype %d compiled %d: batch of %d: %d mismatches", dir, (int)dt,
                  compiled, n, bad);
        }
        /* joining and leaving between steps; session 2 cancelled after 2
         * steps, session 5 after 1, session 11 after 3 */
        int join[MAXS] = {0, 1, 0, 2, 3, 0, 5, 1, 0, 4, 2, 0, 1, 3, 0, 6};
        int last[MAXS] = {STEPS, STEPS, 2, STEPS, 4, 1, STEPS, 3, STEPS, 5, STEPS, 3, STEPS, STEPS, 2, STEPS};
        int bad = batch_run(m, &r, MAXS, join, last, &max_b);
        CHECK(bad == 0, "%s dtype %d compiled %d: join/leave schedule: %d mismatches", dir, (int)dt, compiled, bad);
        int64_t cnt[3];
        pt_batch_counts(m, cnt);
        printf("INFO %s dtype %d compiled %d: %lld steps from graphs, %lld eager table steps, %lld row-mode steps\n",
               dir, (int)dt, compiled, (long long)cnt[0], (long long)cnt[1], (long long)cnt[2]);
        if (want_graph < 0) CHECK(cnt[2] > 0, "%s: quantized KV: no step ran in row mode", dir);
        else if (compiled && want_graph) CHECK(cnt[0] > 0 && cnt[2] == 0, "%s: steps did not replay graphs", dir);
        else CHECK(cnt[1] > 0 && cnt[2] == 0, "%s: eager steps did not run in table mode", dir);
        if (m != m1) pt_model_free(&m);
    }
    batch_ref_free(&r);
    pt_model_free(&m1);
}

static int gpu_ok(void) {
    pt_device d;
    char desc[256];
    if (pt_device_resolve(PT_DEVICE_AUTO, &d, desc, sizeof desc) != PT_OK || d != PT_DEVICE_CUDA) {
        printf("INFO no usable GPU (%s): skipped\n", desc);
        return 0;
    }
    return 1;
}

static void test_batch_cuda_demo(void) {
    if (!gpu_ok()) TEST_SKIP("no GPU");
    check_model("models/kjv-llama-4bit", PT_COMPUTE_MODEL, 1, 1);
    check_model("models/kjv-llama-4bit", PT_COMPUTE_F32, 0, 1);
    g_kv_quant = 8; /* quantized caches take the per-sequence ops (row mode) */
    check_model("models/kjv-llama-4bit", PT_COMPUTE_MODEL, 0, -1);
    g_kv_quant = 0;
}

static void test_batch_cuda_llama_1b_shape(void) {
    if (!gpu_ok()) TEST_SKIP("no GPU");
    check_model("synthetic:llama-3.2-1b", PT_COMPUTE_MODEL, 0, 1);
}

static void test_batch_cuda_families(void) {
    if (!gpu_ok()) TEST_SKIP("no GPU");
    check_model("tests/fixtures/qwen3", PT_COMPUTE_MODEL, 0, 1);
    check_model("tests/fixtures/gemma3_text", PT_COMPUTE_MODEL, 0, 1);
    check_model("tests/fixtures/qwen3_moe", PT_COMPUTE_MODEL, 0, 1);
    check_model("tests/fixtures/minicpm", PT_COMPUTE_MODEL, 0, 0); /* longrope: eager table mode */
    check_model("tests/fixtures/llama", PT_COMPUTE_MODEL, 0, 1);
}

int main(void) {
    TEST_RUN(test_batch_cuda_demo);
    TEST_RUN(test_batch_cuda_llama_1b_shape);
    TEST_RUN(test_batch_cuda_families);
    return test_summary();
}
