/* Continuous batching (pt_session_decode_batch, docs/batching.md): batch
 * invariance as a tested property. For each model (the bundled 4-bit demo
 * model and the family fixtures: 8-bit, mixed 3/6-bit, QK-norm, MoE, sliding
 * window + sandwich norms, MiniCPM scales, longrope, Gemma 4 per-layer inputs
 * and KV sharing, Gemma 4 MoE; the demo model with quantized KV), a request's greedy
 * tokens and its logits bit for bit are the same whether it is decoded alone
 * or in a batch with others:
 *   - batch sizes 1..8, sessions at different positions;
 *   - sessions joining (prefilled between steps) and leaving at different
 *     steps, one cancelled mid-batch;
 *   - the reference decoded with 1 thread, the batches with 1 and 2 threads
 *     (with 2, padded to the CUDA graph buckets as on the GPU).
 * Plus the argument checks (nothing changes on a rejected call). */
#include "test.h"
#include "batch_check.h"

#include "base/mmap.h"
#include "petrel.h"
#include "runtime/batch.h" /* pt_batch_set_padding, pt_session_decode_rows */

#include <stdint.h>

enum { MAXS = 8, STEPS = 6 };

static int g_kv_quant;    /* --kv-quant for the next loads (0 = off) */
static int g_want_table;  /* require that steps ran in table mode (runtime/batch.c) */
static int g_chunk;       /* --prefill-chunk for the next loads (0 = default) */

static pt_model *load(const char *dir, int threads, pt_compute_dtype dt) {
    pt_model_params mp = pt_model_default_params();
    if (g_kv_quant) {
        mp.kv_quant = g_kv_quant;
        mp.quantized_kv_start = 8; /* converted mid-run: some sessions before, some after */
    }
    if (g_chunk) mp.prefill_chunk = g_chunk;
    mp.n_threads = threads;
    mp.dtype = dt;
    mp.device = PT_DEVICE_CPU;
    pt_model *m = NULL;
    if (pt_model_load(dir, &mp, &m) != PT_OK) printf("    load %s: %s\n", dir, pt_last_error());
    return m;
}

/* Prompt of session i: lengths differ so the sessions decode at different
 * positions; session 7's is long enough to cross a longrope switch (64). */
static int prompt_len(int i) { return i == 7 ? 60 : 2 + 3 * i; }

/* The schedules of one model loaded with th threads, checked against r. */
typedef void (*schedules_fn)(pt_model *m, const batch_ref *r, const char *dir, pt_compute_dtype dt, int th,
                             int every_size);

/* Loads dir with 1 thread, decodes the reference on it (tokenwise: every
 * prompt one token at a time, the reference of the rows path), then runs the
 * schedules on that model and on the model loaded with 2 threads (padded to
 * the CUDA graph buckets: 1, 2, 4, 8 rows, padding rows at position -1, as
 * the GPU runs them). what names the check in the line of an absent model. */
static void check_threads(const char *what, const char *dir, pt_compute_dtype dt, int tokenwise, int every_size,
                          schedules_fn schedules) {
    if (!pt_is_dir(dir)) {
        printf("INFO %s: %s absent, skipped\n", what, dir);
        return;
    }
    pt_model *m1 = load(dir, 1, dt);
    CHECK(m1, "load %s", dir);
    if (!m1) return;
    batch_ref r;
    int ok = tokenwise ? batch_ref_make_tokenwise(m1, &r, MAXS, STEPS, prompt_len)
                       : batch_ref_make(m1, &r, MAXS, STEPS, prompt_len);
    CHECK(ok, "%s: reference decode: %s", dir, pt_last_error());
    for (int th = 1; ok && th <= 2; th++) {
        pt_model *m = th == 1 ? m1 : load(dir, 2, dt);
        CHECK(m, "load %s with 2 threads", dir);
        if (!m) break;
        if (th == 2) CHECK(pt_batch_set_padding(m, 1) == PT_OK, "padding: %s", pt_last_error());
        schedules(m, &r, dir, dt, th, every_size);
        if (g_want_table) {
            int64_t cnt[3];
            pt_batch_counts(m, cnt);
            CHECK(cnt[1] > 0, "%s threads %d: no step ran in table mode (%lld graph, %lld table, %lld row)", dir, th,
                  (long long)cnt[0], (long long)cnt[1], (long long)cnt[2]);
        }
        if (m != m1) pt_model_free(&m);
    }
    batch_ref_free(&r);
    pt_model_free(&m1);
}

/* every_size: batch sizes 1..8; else 1, 3 and 8 (the fixtures, for time). */
static void decode_schedules(pt_model *m, const batch_ref *r, const char *dir, pt_compute_dtype dt, int th,
                             int every_size) {
    int full[MAXS], zero[MAXS] = {0}, max_b = 0;
    for (int i = 0; i < MAXS; i++) full[i] = STEPS;
    /* batch sizes 1..8, all joining together (different positions) */
    for (int n = 1; n <= MAXS; n++) {
        if (!every_size && n != 1 && n != 3 && n != MAXS) continue;
        int bad = batch_run(m, r, n, zero, full, &max_b);
        CHECK(bad == 0 && max_b == n, "%s dtype %d threads %d: batch of %d: %d mismatches", dir, (int)dt, th, n, bad);
    }
    /* joining and leaving between steps; session 2 cancelled after 2 steps,
     * session 5 after 1 */
    int join[MAXS] = {0, 1, 0, 2, 3, 0, 5, 1}, last[MAXS] = {STEPS, STEPS, 2, STEPS, 4, 1, STEPS, 3};
    int bad = batch_run(m, r, MAXS, join, last, &max_b);
    CHECK(bad == 0, "%s dtype %d threads %d: join/leave schedule: %d mismatches", dir, (int)dt, th, bad);
}

static void check_model(const char *dir, pt_compute_dtype dt, int every_size) {
    check_threads("batch", dir, dt, 0, every_size, decode_schedules);
}

static void test_batch_invariance_demo(void) {
    g_want_table = 1;
    check_model("models/kjv-llama-4bit", PT_COMPUTE_MODEL, 1);
    g_want_table = 0;
    check_model("models/kjv-llama-4bit", PT_COMPUTE_F32, 0);
    g_kv_quant = 8; /* quantized KV: each session's cache converts at its own step */
    check_model("models/kjv-llama-4bit", PT_COMPUTE_MODEL, 0);
    g_kv_quant = 0;
}

static void test_batch_invariance_families(void) {
    const char *dirs[] = {"tests/fixtures/llama",       "tests/fixtures/llama_mlx_q8", "tests/fixtures/llama_mlx_mixed_3_6",
                          "tests/fixtures/qwen3",       "tests/fixtures/qwen3_moe",    "tests/fixtures/qwen3_moe_mlx_q4",
                          "tests/fixtures/gemma3_text", "tests/fixtures/minicpm",     "tests/fixtures/gemma4_e",
                          "tests/fixtures/gemma4_moe",  "tests/fixtures/qwen3_5_text"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) check_model(dirs[i], PT_COMPUTE_MODEL, 0);
}

/* Prompts as rows (pt_session_decode_rows, the server's step): each session
 * joins at its step and feeds its prompt piece[i] tokens per step beside the
 * others' prompt pieces and decode rows; every logits row must equal the
 * session run alone one token at a time. Threads and padding as above. */
static void rows_schedules(pt_model *m, const batch_ref *r, const char *dir, pt_compute_dtype dt, int th,
                           int every_size) {
    (void)every_size;
    int full[MAXS], zero[MAXS] = {0}, max_rows = 0;
    for (int i = 0; i < MAXS; i++) full[i] = STEPS;
    /* session 4's prompt in one piece; session 7's 60 tokens 8 at a time */
    int piece[MAXS] = {5, 1, 2, 3, 64, 4, 7, 8};
    int bad = batch_run_rows(m, r, MAXS, zero, full, piece, &max_rows);
    CHECK(bad == 0 && max_rows > MAXS, "%s dtype %d threads %d: prompts as rows, all joining at once: %d mismatches "
          "(largest step %d rows)", dir, (int)dt, th, bad, max_rows);
    /* joining and leaving between steps, sessions 2 and 5 cancelled */
    int join[MAXS] = {0, 1, 0, 2, 3, 0, 5, 1}, last[MAXS] = {STEPS, STEPS, 2, STEPS, 4, 1, STEPS, 3};
    int piece2[MAXS] = {64, 3, 1, 64, 2, 5, 64, 13};
    bad = batch_run_rows(m, r, MAXS, join, last, piece2, &max_rows);
    CHECK(bad == 0, "%s dtype %d threads %d: prompts as rows, join/leave schedule: %d mismatches", dir, (int)dt, th,
          bad);
    /* one session alone, its whole prompt in one step */
    int one[MAXS] = {64};
    bad = batch_run_rows(m, r, 1, zero, full, one, &max_rows);
    CHECK(bad == 0, "%s dtype %d threads %d: one session's prompt as one step of rows: %d mismatches", dir, (int)dt,
          th, bad);
}

static void check_rows(const char *dir, pt_compute_dtype dt) {
    check_threads("batch rows", dir, dt, 1, 0, rows_schedules);
}

static void test_batch_rows_demo(void) {
    g_want_table = 1;
    check_rows("models/kjv-llama-4bit", PT_COMPUTE_MODEL);
    g_want_table = 0;
    check_rows("models/kjv-llama-4bit", PT_COMPUTE_F32);
    /* quantized KV from position 8: pieces that cross it run in two parts
     * (the rows after the conversion read the quantized cache, as alone) */
    g_kv_quant = 8;
    check_rows("models/kjv-llama-4bit", PT_COMPUTE_MODEL);
    g_kv_quant = 0;
}

static void test_batch_rows_families(void) {
    const char *dirs[] = {"tests/fixtures/llama", "tests/fixtures/qwen3_moe", "tests/fixtures/minicpm",
                          "tests/fixtures/gemma4_e", "tests/fixtures/qwen3_5_text"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) check_rows(dirs[i], PT_COMPUTE_MODEL);
    /* sliding window 16 with a prefill chunk of 8: the ring holds 23
     * positions, and a session's rows of one step (at most the chunk) must
     * not overwrite what its earlier rows still attend to */
    g_chunk = 8;
    check_rows("tests/fixtures/gemma3_text", PT_COMPUTE_MODEL);
    g_chunk = 0;
}

static void test_batch_errors(void) {
    const char *dir = "models/kjv-llama-4bit";
    if (!pt_is_dir(dir)) TEST_SKIP("demo model absent");
    pt_model *m = load(dir, 1, PT_COMPUTE_MODEL), *m2 = load(dir, 1, PT_COMPUTE_MODEL);
    REQUIRE(m && m2, "load");
    int V = pt_model_vocab_size(m);
    pt_session *a = NULL, *b = NULL, *c = NULL;
    pt_session_params sp = pt_session_default_params();
    sp.n_ctx = 4;
    REQUIRE(pt_session_create(m, NULL, &a) == PT_OK && pt_session_create(m, &sp, &b) == PT_OK &&
                pt_session_create(m2, NULL, &c) == PT_OK,
            "sessions");
    int32_t p[4] = {5, 6, 7, 8};
    REQUIRE(pt_session_prompt(a, p, 2) == PT_OK && pt_session_prompt(b, p, 4) == PT_OK, "prompt");
    int32_t ids[2] = {9, 10};
    pt_session *aa[2] = {a, a}, *ab[2] = {a, b}, *ac[2] = {a, c}, *an[2] = {a, NULL};
    CHECK(pt_session_decode_batch(aa, ids, 2) == PT_ERR_INVALID_ARG, "same session twice");
    CHECK(strstr(pt_last_error(), "same session"), "message: %s", pt_last_error());
    CHECK(pt_session_decode_batch(ac, ids, 2) == PT_ERR_INVALID_ARG, "another model");
    CHECK(pt_session_decode_batch(an, ids, 2) == PT_ERR_INVALID_ARG, "NULL session");
    CHECK(pt_session_decode_batch(ab, ids, 0) == PT_ERR_INVALID_ARG, "n = 0");
    CHECK(pt_session_decode_batch(ab, ids, 2) == PT_ERR_RANGE, "session b's context is full");
    CHECK(strstr(pt_last_error(), "session 1"), "message names the index: %s", pt_last_error());
    int32_t bad[1] = {V};
    CHECK(pt_session_decode_batch(ab, bad, 1) == PT_ERR_RANGE, "id outside the vocabulary");
    CHECK(pt_session_n_tokens(a) == 2 && pt_session_n_tokens(b) == 4, "rejected calls change nothing");
    CHECK(pt_session_logits(a) != NULL, "a keeps its logits");
    CHECK(pt_session_decode_batch(ab, ids, 1) == PT_OK && pt_session_n_tokens(a) == 3, "a batch of one");
    CHECK(pt_session_tokens(a)[2] == 9, "the token is appended");
    int cnt[2] = {2, 0}, cnt_full[2] = {1, 1};
    int32_t ids3[3] = {11, 12, 13};
    CHECK(pt_session_decode_rows(ab, ids3, cnt, 2) == PT_ERR_INVALID_ARG, "decode_rows: a count of 0");
    CHECK(strstr(pt_last_error(), "session 1"), "message names the index: %s", pt_last_error());
    CHECK(pt_session_decode_rows(ab, ids3, cnt_full, 2) == PT_ERR_RANGE, "decode_rows: session b's context is full");
    CHECK(pt_session_decode_rows(aa, ids3, cnt_full, 2) == PT_ERR_INVALID_ARG, "decode_rows: same session twice");
    CHECK(pt_session_n_tokens(a) == 3, "rejected calls change nothing");
    CHECK(pt_session_decode_rows(ab, ids3, cnt, 1) == PT_OK && pt_session_n_tokens(a) == 5, "two rows of one session");
    CHECK(pt_session_tokens(a)[3] == 11 && pt_session_tokens(a)[4] == 12, "both tokens are appended");
    pt_session_free(&a);
    pt_session_free(&b);
    pt_session_free(&c);
    pt_model_free(&m);
    pt_model_free(&m2);
}

int main(void) {
    TEST_RUN(test_batch_errors);
    TEST_RUN(test_batch_invariance_demo);
    TEST_RUN(test_batch_invariance_families);
    TEST_RUN(test_batch_rows_demo);
    TEST_RUN(test_batch_rows_families);
    return test_summary();
}
