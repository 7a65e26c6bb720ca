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
 *     longrope, whose per-row table choice keeps its steps out of graphs);
 *   - at the op level, attention_rows over rows of 1 to 5120 keys in one
 *     launch (contexts on both sides of the split decode's thresholds),
 *     each row bit-identical to the T = 1 attention and close to the CPU.
 * Prompt rows: tests/cuda/test_cuda_batch_rows.c.
 * The test also checks that the steps ran where they should (from a graph,
 * or eagerly in table mode) rather than in the row-by-row fallback. On a
 * machine without a usable GPU it reports that and skips. */
#include "test.h"
#include "batch_check.h"
#include "batch_gpu.h" /* g_kv_quant, load, gpu_ok */

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/half.h"
#include "base/mmap.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"
#include "runtime/batch.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MAXS = 16, STEPS = 6 };

static int prompt_len(int i) { return 2 + 3 * i; }

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

/* ---- attention_rows at the split thresholds (op level) --------------------
 * The split decode (attention.cu) gives a split at least minper keys (16;
 * PETREL_CUDA_DEC_MINPER runs the test at others) and uses every split only
 * from nsplit·minper keys on (528 for 8 KV heads on a 132-SM GPU, 2112 at
 * minper 64); below, a row of n keys uses ceil(n / minper) splits, and the
 * launch for many rows loops several splits per block. Rows of 1, 63, 64,
 * 65, ..., 2000, 2111, 2112, 2113, ..., 5000 keys and a padding row go
 * through one attention_rows launch: each row must equal the T = 1 attention on its
 * own cache bit for bit, and the CPU backend's attention within the op
 * tests' tolerance; the padding row must be zeros. Rows share a few caches
 * (the table may point several rows at one cache) to keep uploads small. */

static const int row_keys[] = {1,    63,   64,   65,   2000, 2112, 5000, 13,   127,  128,  129,  1087, 1088, 1089,
                               2111, 2113, 4224, 5120, 2,    700,  3000, 4096, 4097, 14,   33,   1,    64,   2112,
                               5000, 66,   191,  192,  0,    12,   4000, 2500, 1500, 100,  31,   65};
enum { NROWS = (int)(sizeof row_keys / sizeof row_keys[0]), NCACHE = 3, ROWS_CTX = 5120 };

typedef struct {
    int nh, nkv, hd, window, act;
    int64_t cap;
    pt_ftype dt;
    float softcap;
} rows_case;

static uint64_t rows_rng = 0x2545f4914f6cdd1dull;
static float rows_rf(float lo, float hi) {
    rows_rng ^= rows_rng << 13, rows_rng ^= rows_rng >> 7, rows_rng ^= rows_rng << 17;
    return lo + (hi - lo) * (float)((rows_rng >> 11) & 0xffffff) / 16777216.0f;
}

static void *rows_put(pt_backend *be, const void *host, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    if (d && host && be->ops->upload(be, d, host, bytes) != PT_OK) {
        be->ops->dealloc(be, d);
        return NULL;
    }
    return d;
}

static void rows_check(pt_backend *G, pt_backend *C, const rows_case *rc) {
    const int nh = rc->nh, nkv = rc->nkv, hd = rc->hd, bf = rc->act == PT_ACT_BF16;
    const size_t es = rc->dt == PT_FT_F32 ? 4 : 2, celems = (size_t)nkv * (size_t)rc->cap * hd;
    void *hk[NCACHE], *hv[NCACHE], *dk[NCACHE], *dv[NCACHE];
    for (int c = 0; c < NCACHE; c++) {
        hk[c] = malloc(celems * es), hv[c] = malloc(celems * es);
        for (size_t i = 0; i < celems; i++) {
            const float k = rows_rf(-1, 1), v = rows_rf(-1, 1);
            if (es == 4) ((float *)hk[c])[i] = k, ((float *)hv[c])[i] = v;
            else ((uint16_t *)hk[c])[i] = pt_f32_to_bf16(k), ((uint16_t *)hv[c])[i] = pt_f32_to_bf16(v);
        }
        dk[c] = rows_put(G, hk[c], celems * es), dv[c] = rows_put(G, hv[c], celems * es);
        REQUIRE(dk[c] && dv[c], "cache upload: %s", pt_last_error());
    }
    const int64_t qn = (int64_t)NROWS * nh * hd;
    float *q = malloc(qn * 4), *ob = malloc(qn * 4), *o1 = malloc(qn * 4), *oc = malloc((size_t)nh * hd * 4);
    int32_t pos[NROWS];
    void *tab[2 * NROWS];
    for (int64_t i = 0; i < qn; i++) q[i] = bf ? pt_round_bf16(rows_rf(-2, 2)) : rows_rf(-2, 2);
    for (int b = 0; b < NROWS; b++) {
        pos[b] = row_keys[b] - 1; /* 0 keys: a padding row */
        tab[2 * b] = dk[b % NCACHE], tab[2 * b + 1] = dv[b % NCACHE];
    }
    float *qd = rows_put(G, q, qn * 4), *od = rows_put(G, NULL, qn * 4);
    int32_t *pd = rows_put(G, pos, sizeof pos);
    void **td = rows_put(G, tab, sizeof tab);
    REQUIRE(qd && od && pd && td, "buffers: %s", pt_last_error());
    pt_kv_layer shape = {.n_kv = nkv, .head_dim = hd, .capacity = rc->cap, .dtype = rc->dt};
    pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .softcap = rc->softcap,
                 .window = rc->window};
    pt_status st = G->ops->attention_rows(G, od, qd, NROWS, pd, &shape, (void *const *)td, &p);
    CHECK(st == PT_OK, "attention_rows: %s", pt_last_error());
    if (st == PT_OK) st = G->ops->download(G, ob, od, qn * 4);
    for (int b = 0; st == PT_OK && b < NROWS; b++) {
        const size_t off = (size_t)b * nh * hd, bytes = (size_t)nh * hd * 4;
        if (pos[b] < 0) { /* padding: zeros */
            int nz = 0;
            for (size_t i = 0; i < (size_t)nh * hd; i++) nz += ob[off + i] != 0.f;
            CHECK(nz == 0, "padding row %d: %d nonzero outputs", b, nz);
            continue;
        }
        pt_kv_layer kg = shape, kc = shape;
        kg.k = dk[b % NCACHE], kg.v = dv[b % NCACHE];
        kc.k = hk[b % NCACHE], kc.v = hv[b % NCACHE];
        st = G->ops->attention(G, od, qd + off, 1, pd + b, &kg, &p);
        if (st == PT_OK) st = G->ops->download(G, o1 + off, od, bytes);
        CHECK(st == PT_OK, "row %d alone: %s", b, pt_last_error());
        if (st != PT_OK) break;
        CHECK(memcmp(ob + off, o1 + off, bytes) == 0,
              "nh %d nkv %d hd %d window %d: row %d (%d keys): batched differs from alone", nh, nkv, hd, rc->window, b,
              row_keys[b]);
        REQUIRE(C->ops->attention(C, oc, q + off, 1, &pos[b], &kc, &p) == PT_OK, "cpu attention: %s",
                pt_last_error());
        double mx = 0, worst = 0;
        for (int i = 0; i < nh * hd; i++) mx = fabs(oc[i]) > mx ? fabs(oc[i]) : mx;
        const double afrac = bf ? 2e-2 : 1e-5, rtol = bf ? 2e-2 : 1e-4;
        int bad = -1;
        for (int i = 0; i < nh * hd; i++) {
            const double d = fabs((double)o1[off + i] - oc[i]), tol = afrac * mx + rtol * fabs(oc[i]) + 1e-30;
            if (isnan(o1[off + i]) || d > tol) {
                bad = i;
                break;
            }
            worst = d / tol > worst ? d / tol : worst;
        }
        CHECK(bad < 0, "nh %d nkv %d hd %d window %d: row %d (%d keys) element %d: cuda %.9g, cpu %.9g", nh, nkv, hd,
              rc->window, b, row_keys[b], bad, bad < 0 ? 0 : o1[off + bad], bad < 0 ? 0 : oc[bad]);
        if (b == 6) printf("MEASURE attention_rows nh %d hd %d: row of %d keys, worst |diff|/tolerance vs cpu %.3f\n", nh,
                           hd, row_keys[b], worst);
    }
    G->ops->dealloc(G, qd), G->ops->dealloc(G, od), G->ops->dealloc(G, pd), G->ops->dealloc(G, td);
    for (int c = 0; c < NCACHE; c++) {
        G->ops->dealloc(G, dk[c]), G->ops->dealloc(G, dv[c]);
        free(hk[c]), free(hv[c]);
    }
    free(q), free(ob), free(o1), free(oc);
}

static void test_batch_cuda_attention_rows(void) {
    if (!gpu_ok()) TEST_SKIP("no GPU");
    static const rows_case cs[] = {
        /* the llama-3.1-8b attention shape: 33 splits of >= 64 keys on an H200 */
        {32, 8, 128, 0, PT_ACT_BF16, ROWS_CTX, PT_FT_BF16, 0.f},
        /* GQA 4 over 2 KV heads, f32: a ring cache under a sliding window, soft-cap */
        {8, 2, 64, 2100, PT_ACT_F32, 4096, PT_FT_F32, 30.f},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        pt_backend *G = NULL, *C = NULL;
        pt_cuda_params gp = {0, cs[i].act};
        pt_cpu_params cp = {.n_threads = 2, .act = cs[i].act, .isa = PT_ISA_AUTO};
        REQUIRE(pt_backend_cuda_create(&G, &gp) == PT_OK, "cuda backend: %s", pt_last_error());
        REQUIRE(pt_backend_cpu_create(&C, &cp) == PT_OK, "cpu backend: %s", pt_last_error());
        pt_backend_limits lim = {.max_tokens = 1, .max_ctx = ROWS_CTX, .max_heads = cs[i].nh,
                                 .max_head_dim = cs[i].hd, .max_rows = NROWS};
        REQUIRE(G->ops->reserve(G, &lim) == PT_OK && C->ops->reserve(C, &lim) == PT_OK, "reserve: %s",
                pt_last_error());
        rows_check(G, C, &cs[i]);
        pt_backend_free(&G);
        pt_backend_free(&C);
    }
}

int main(void) {
    TEST_RUN(test_batch_cuda_demo);
    TEST_RUN(test_batch_cuda_llama_1b_shape);
    TEST_RUN(test_batch_cuda_families);
    TEST_RUN(test_batch_cuda_attention_rows);
    return test_summary();
}
