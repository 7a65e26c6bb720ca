/* Continuous batching on the GPU, prompt rows (pt_session_decode_rows, the
 * server's step, docs/batching.md "Prompt rows"): prompts fed as rows in
 * pieces of 1 to 64 tokens beside other sessions' pieces and decode rows —
 * all joining at once, and on a join/leave/cancel schedule — from the
 * bucket graphs and eagerly (--compiled-decode off), must leave every
 * session's logits bit-identical to the session run alone one token at a
 * time (the compiled single-token decode). On the demo model (bf16 and f32
 * activations, and 8-bit quantized KV converting inside the pieces), the
 * llama-3.2-1b shape with random 4-bit weights, Gemma 3 (sliding window)
 * and Qwen3 (QK-norm); the llama-3.2-1b shape with each setting of the
 * prepared-x hand-offs (PETREL_CUDA_TC_WG_XO 2, 1, 0: the attention's
 * output handed on as the output projection's x, the GLU's as the down
 * projection's, neither; the hand-offs counted). The compiled runs must have
 * replayed the bucket graphs. On a machine without a usable GPU it reports that and skips. */
#include "test.h"
#include "batch_check.h"
#include "batch_gpu.h" /* g_kv_quant, load, gpu_ok */

#include "backend/cuda/cuda.h"
#include "base/mmap.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"
#include "runtime/batch.h"

#include <stdint.h>

/* gemv_tc.cu: the hand-offs of a GEMV's prepared x (as PETREL_CUDA_TC_WG_XO: 2 the batched rows' attention's to
 * the output projection too; -1: the environment), hand-offs taken so far */
void pt_cuda_tc_wg_xo(int v);
unsigned long long pt_cuda_tc_wg_xo_count(void);

enum { MAXS = 16, STEPS = 6 };

static int prompt_len(int i) { return 2 + 3 * i; }

/* Prompts as rows: the reference runs each prompt one token at a time. */
static void check_rows(const char *dir, pt_compute_dtype dt) {
    if (strncmp(dir, "synthetic:", 10) && !pt_is_dir(dir)) {
        printf("INFO batch rows: %s absent, skipped\n", dir);
        return;
    }
    pt_model *m1 = load(dir, dt, 1);
    if (!m1) {
        CHECK(strncmp(dir, "models/", 7) && strncmp(dir, "synthetic:", 10), "%s must load on CUDA", dir);
        return;
    }
    batch_ref r;
    int ok = batch_ref_make_tokenwise(m1, &r, MAXS, STEPS, prompt_len);
    CHECK(ok, "%s: reference decode: %s", dir, pt_last_error());
    for (int compiled = 1; ok && compiled >= 0; compiled--) {
        pt_model *m = compiled ? m1 : load(dir, dt, 0);
        CHECK(m, "load %s eagerly", dir);
        if (!m) break;
        int64_t c0[3], c1[3];
        pt_batch_counts(m, c0);
        int full[MAXS], zero[MAXS] = {0}, max_rows = 0;
        for (int i = 0; i < MAXS; i++) full[i] = STEPS;
        int piece[MAXS] = {5, 1, 2, 3, 64, 4, 7, 8, 16, 9, 64, 6, 3, 11, 2, 33};
        int bad = batch_run_rows(m, &r, MAXS, zero, full, piece, &max_rows);
        CHECK(bad == 0, "%s dtype %d compiled %d: prompts as rows, all joining at once: %d mismatches (largest step %d "
              "rows)", dir, (int)dt, compiled, bad, max_rows);
        int join[MAXS] = {0, 1, 0, 2, 3, 0, 5, 1, 0, 4, 2, 0, 1, 3, 0, 6};
        int last[MAXS] = {STEPS, STEPS, 2, STEPS, 4, 1, STEPS, 3, STEPS, 5, STEPS, 3, STEPS, STEPS, 2, STEPS};
        int piece2[MAXS] = {64, 3, 1, 64, 2, 5, 64, 13, 1, 2, 4, 64, 8, 7, 64, 3};
        bad = batch_run_rows(m, &r, MAXS, join, last, piece2, &max_rows);
        CHECK(bad == 0, "%s dtype %d compiled %d: prompts as rows, join/leave schedule: %d mismatches", dir, (int)dt,
              compiled, bad);
        pt_batch_counts(m, c1);
        printf("INFO %s rows dtype %d compiled %d: %lld steps from graphs, %lld eager table steps, %lld row-mode\n",
               dir, (int)dt, compiled, (long long)(c1[0] - c0[0]), (long long)(c1[1] - c0[1]),
               (long long)(c1[2] - c0[2]));
        if (!g_kv_quant && compiled) CHECK(c1[0] > c0[0], "%s: prompt-row steps did not replay graphs", dir);
        if (m != m1) pt_model_free(&m);
    }
    batch_ref_free(&r);
    pt_model_free(&m1);
}

static void test_batch_cuda_rows(void) {
    if (!gpu_ok()) TEST_SKIP("no GPU");
    check_rows("models/kjv-llama-4bit", PT_COMPUTE_MODEL);
    check_rows("models/kjv-llama-4bit", PT_COMPUTE_F32);
    /* the hand-offs of a GEMV's prepared x (PETREL_CUDA_TC_WG_XO): 2 (default) the GLU's and the attention's
     * outputs, 1 the GLU's alone, 0 none; every logit the tokenwise one each way, none taken at 0, and the steps
     * of 33..64 rows taking the output projections' hand-offs at 2 on top of the GLU's (an unsplit gate/up's only:
     * 1 may take none here) */
    unsigned long long taken[3];
    for (int v = 2; v >= 0; v--) {
        pt_cuda_tc_wg_xo(v);
        const unsigned long long x0 = pt_cuda_tc_wg_xo_count();
        check_rows("synthetic:llama-3.2-1b", PT_COMPUTE_MODEL);
        taken[v] = pt_cuda_tc_wg_xo_count() - x0;
    }
    pt_cuda_tc_wg_xo(-1);
    CHECK(taken[0] == 0 && taken[2] > taken[1],
          "hand-offs taken on the llama-3.2-1b shape at PETREL_CUDA_TC_WG_XO=0/1/2: %llu/%llu/%llu (want none at 0 "
          "and more at 2 than at 1)",
          taken[0], taken[1], taken[2]);
    check_rows("tests/fixtures/gemma3_text", PT_COMPUTE_MODEL);
    check_rows("tests/fixtures/qwen3", PT_COMPUTE_MODEL);
    g_kv_quant = 8;
    check_rows("models/kjv-llama-4bit", PT_COMPUTE_MODEL);
    g_kv_quant = 0;
}

int main(void) {
    TEST_RUN(test_batch_cuda_rows);
    return test_summary();
}
