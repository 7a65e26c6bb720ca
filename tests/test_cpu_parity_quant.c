/* Parity of the CPU's production path for MLX-quantized checkpoints: the
 * model loaded in its own dtype (PT_COMPUTE_MODEL, what `petrel run` does on
 * an MLX checkpoint), so the quantized weights stay quantized and the
 * activations are bf16 — the path of the 4-bit integer-piece decode kernel
 * (PETREL_CPU_XINT, qdot_xint_avx512.c; its 8-bit sibling under the same
 * lever), the integer-piece prefill GEMM
 * (PETREL_CPU_XGEMM, gemm_i8_avx512.c) and, with those levers off, the bf16
 * decode kernel and the f32 GEMM. test_parity.c runs the same fixtures in
 * f32 and under --dtype bf16, which dequantizes the weights to bf16 and so
 * never reaches any of these kernels.
 *
 * Against the transformers goldens of every MLX fixture (bf16 reference =
 * the dequantized weights loaded in bf16), with the L1 bf16 gates of
 * DESIGN.md, unchanged:
 *   prefill: the logits of each whole prompt (one call: the GEMM path);
 *   decode:  the same prompt fed one token at a time (T = 1: the decode
 *            kernels), the logits of every position;
 *     each: argmax identical wherever the golden top-1/top-2 margin > 0.05
 *           (MoE fixtures: >= 95% of those positions);
 *   greedy:  the 32-token continuation identical up to the first golden step
 *            with margin <= 0.05 (MoE: a divergence where our own top-2 are
 *            within 2 bf16 ulps is a routing near-tie, as in test_parity.c);
 *   threads: 1 and 2 threads bit-identical (prefill and decode logits).
 * Each in four lever settings (pt_cpu_lever): off (the bf16 / f32 decode
 * kernels, the f32 GEMM); "xint" (the integer-piece kernels and GEMMs, the
 * default on Intel); "bgemm" (the bf16 prefill GEMM, PETREL_CPU_BGEMM, with
 * the bf16 decode kernel: the default on AMD); "amx" (the same on AMX tiles:
 * the prefill default where the CPU has AMX). The path counters
 * (pt_cpu_path_count) prove which kernels ran: under "xint" the 4-bit
 * fixtures' decode reaches the integer-piece kernel and their prefill the
 * integer-piece GEMM, the 8-bit fixture's decode the 8-bit integer-piece
 * kernel and its prefill the 8-bit integer-piece GEMM (PETREL_CPU_XGEMM8; on
 * AVX-512 VNNI; elsewhere the check says so and the gates still run); under
 * "bgemm" the prefill of the 4- and 8-bit fixtures reaches the bf16 GEMM (on
 * AVX-512 BF16), under "amx" its AMX form (PETREL_CPU_AMX; where the CPU has
 * AMX, else the check says so). Each setting's argmax is compared with the levers-off
 * run's. Prints max|Δlogit| and the mean KL against the golden (MEASURE). */
#include "test.h"
#include "golden.h"
#include "parity_util.h"

#include "backend/cpu/cpu_internal.h"
#include "base/mmap.h"
#include "petrel.h"

#include <math.h>
#include <stdint.h>

static pt_model *load(const char *dir, int threads) {
    pt_model_params mp = pt_model_default_params(); /* dtype PT_COMPUTE_MODEL: the checkpoint's own */
    mp.n_threads = threads;
    mp.device = PT_DEVICE_CPU;
    pt_model *m = NULL;
    if (pt_model_load(dir, &mp, &m) != PT_OK) printf("    load %s: %s\n", dir, pt_last_error());
    return m;
}

/* Logits of every position of ids, one token per call (the decode path). */
static int eval_stepwise(pt_model *m, const int32_t *ids, int n, float *out) {
    pt_session *s = NULL;
    int V = pt_model_vocab_size(m);
    pt_session_params sp = {.n_ctx = n + 40 < pt_model_max_ctx(m) ? n + 40 : pt_model_max_ctx(m)};
    int ok = pt_session_create(m, &sp, &s) == PT_OK;
    for (int i = 0; ok && i < n; i++) {
        ok = pt_session_prompt(s, &ids[i], 1) == PT_OK;
        if (ok) memcpy(out + (size_t)i * V, pt_session_logits(s), sizeof(float) * (size_t)V);
    }
    if (!ok) printf("    stepwise eval: %s\n", pt_last_error());
    pt_session_free(&s);
    return ok;
}

typedef struct {
    long gated, agree;
    double maxd, maxl, kl;
    long rows;
} gate_acc;

/* top-1 index and top-1 minus top-2 of one row */
static int top2(const float *x, int V, float *margin) {
    int b = 0;
    float t1 = -INFINITY, t2 = -INFINITY;
    for (int v = 0; v < V; v++) {
        if (x[v] > t1) t2 = t1, t1 = x[v], b = v;
        else if (x[v] > t2) t2 = x[v];
    }
    *margin = t1 - t2;
    return b;
}

/* The bf16 argmax gate of one prompt's logits [n, V] against the golden;
 * am/mg receive our argmax and margin per position. */
static void gate_logits(gate_acc *acc, const char *what, const float *ours, const float *gold, const float *margin,
                        const float *gold32, int n, int V, int *am, float *mg) {
    for (int t = 0; t < n; t++) {
        const float *a = ours + (size_t)t * V, *g = gold + (size_t)t * V;
        for (int v = 0; v < V; v++) {
            acc->maxd = fmax(acc->maxd, fabs(a[v] - g[v]));
            acc->maxl = fmax(acc->maxl, fabs(g[v]));
        }
        acc->kl += parity_kl_row(g, a, V);
        acc->rows++;
        am[t] = top2(a, V, &mg[t]);
        if (margin[t] <= 0.05f) continue;
        acc->gated++;
        int ga = golden_argmax(g, V);
        if (ga == am[t]) acc->agree++;
        else
            printf("INFO %s position %d: argmax %d vs golden %d (golden margin %.4f, our margin %.4f, f32 golden "
                   "argmax %d)\n",
                   what, t, am[t], ga, margin[t], mg[t], gold32 ? golden_argmax(gold32 + (size_t)t * V, V) : -1);
    }
}

/* How a fixture is gated against the golden. */
enum {
    GATE_DENSE, /* L1 bf16: every gated position, greedy up to a golden near-tie */
    GATE_MOE,   /* L1 bf16 for MoE: >= 95% of gated positions, greedy up to a routing near-tie */
    GATE_NONE,  /* measured and printed only (why: the fixture's test function) */
};

#define MAXP 8
/* lever settings: 0 off, 1 the integer-piece kernels and GEMMs, 2 the bf16 GEMM, 3 its AMX form */
#define NLV 4
static const char *const lever_name[NLV] = {"off", "xint", "bgemm", "amx"};

static int bf16_cpu(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}
static void check_fixture(const char *name, int gate) {
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    golden *g = golden_open_fixture(name, err, sizeof err);
    if (!g) {
        CHECK(0, "%s: %s", name, err);
        return;
    }
    pt_model *m1 = load(dir, 1), *m2 = load(dir, 2);
    int n_prompts = golden_n_prompts(g);
    CHECK(n_prompts > 0 && n_prompts <= MAXP, "%s: %d prompts in the golden", name, n_prompts);
    if (!m1 || !m2 || n_prompts <= 0 || n_prompts > MAXP) {
        CHECK(0, "%s: load failed", name);
        goto out;
    }
    int V = pt_model_vocab_size(m1);
    int saved[5] = {pt_cpu_lever.xint, pt_cpu_lever.xgemm, pt_cpu_lever.xgemm8, pt_cpu_lever.bgemm, pt_cpu_lever.amx};
    /* our argmax / margin per prompt, [levers][prefill, decode], for the levers-on vs -off comparisons */
    int *am[NLV][2][MAXP] = {{{0}}};
    float *mg[NLV][2][MAXP] = {{{0}}};
    for (int on = 0; on < NLV; on++) {
        const char *lv = lever_name[on];
        pt_cpu_lever.xint = pt_cpu_lever.xgemm = pt_cpu_lever.xgemm8 = on == 1;
        pt_cpu_lever.bgemm = on == 2;
        pt_cpu_lever.amx = on == 3;
        long c0[PT_CPU_PATH_N];
        for (int i = 0; i < PT_CPU_PATH_N; i++) c0[i] = atomic_load(&pt_cpu_path_count[i]);
        gate_acc acc[2] = {{0}, {0}};
        for (int p = 0; p < n_prompts; p++) {
            int n = 0, nl = 0, vg = 0, nm = 0, n32 = 0, v32 = 0;
            const int32_t *ids = golden_prompt_ids(g, p, &n);
            const float *gold = golden_logits(g, p, GOLDEN_REF_BF16, &nl, &vg);
            const float *margin = golden_margins(g, p, GOLDEN_REF_BF16, &nm);
            const float *gold32 = golden_logits(g, p, GOLDEN_REF_F32, &n32, &v32);
            if (!ids || !gold || !margin || nl != n || nm != n || vg != V) {
                CHECK(0, "%s prompt %d: golden arrays missing or of another shape (vocab %d vs %d)", name, p, vg, V);
                continue;
            }
            if (n32 != n || v32 != V) gold32 = NULL;
            float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
            for (int k = 0; k < 2; k++) {
                am[on][k][p] = malloc(sizeof(int) * (size_t)n);
                mg[on][k][p] = malloc(sizeof(float) * (size_t)n);
                char what[128];
                snprintf(what, sizeof what, "%s prompt %d %s levers %s", name, p, k ? "decode" : "prefill", lv);
                /* prefill: the whole prompt in one call; decode: one token per call */
                int ok = k ? eval_stepwise(m1, ids, n, a) : parity_eval(m1, ids, n, a);
                CHECK(ok, "%s: evaluation failed", what);
                if (!ok) {
                    for (int t = 0; t < n; t++) am[on][k][p][t] = -1, mg[on][k][p][t] = 0;
                    continue;
                }
                gate_logits(&acc[k], what, a, gold, margin, gold32, n, V, am[on][k][p], mg[on][k][p]);
                if (k ? eval_stepwise(m2, ids, n, b) : parity_eval(m2, ids, n, b))
                    CHECK(!memcmp(a, b, sizeof(float) * (size_t)n * V), "%s: 1 vs 2 threads differ", what);
                else CHECK(0, "%s: 2-thread evaluation failed", what);
            }
            free(a);
            free(b);
            /* greedy continuation against the bf16 reference's */
            int steps = 0, sm = 0;
            const int32_t *gg = golden_greedy(g, p, GOLDEN_REF_BF16, &steps);
            const float *gm = golden_greedy_margins(g, p, GOLDEN_REF_BF16, &sm);
            if (!gg || !gm || sm != steps || steps <= 0) continue;
            int32_t *out = malloc(sizeof *out * (size_t)steps);
            float *om = malloc(sizeof *om * 2 * (size_t)steps);
            if (parity_greedy(m2, ids, n, steps, out, om)) {
                int same = 0, decided = steps;
                for (int i = 0; i < steps; i++)
                    if (gm[i] <= 0.05f) {
                        decided = i + 1; /* the token at a near-tie itself may go either way */
                        break;
                    }
                while (same < steps && out[same] == gg[same]) same++;
                int ok = same >= decided - (decided < steps ? 1 : 0);
                printf("MEASURE cpu quant parity %s prompt %d greedy levers %s: %d/%d tokens identical (%d decided "
                       "before a near-tie)\n",
                       name, p, lv, same, steps, decided);
                if (same < steps) {
                    float ours = om[2 * same], ulp = parity_ulp_bf16(om[2 * same + 1]);
                    printf("INFO %s prompt %d greedy levers %s: step %d ours %d vs golden %d; golden margin %.4f, our "
                           "margin %.4f (bf16 ulp %.4f)\n",
                           name, p, lv, same, out[same], gg[same], gm[same], ours, ulp);
                    if (!ok && gate == GATE_MOE && ours <= 2 * ulp) ok = 1; /* routing near-tie, as test_parity.c */
                }
                if (gate != GATE_NONE)
                    CHECK(ok, "%s prompt %d greedy levers %s: diverges at step %d", name, p, lv, same);
            } else CHECK(0, "%s prompt %d: greedy failed", name, p);
            free(out);
            free(om);
        }
        for (int k = 0; k < 2; k++) {
            const char *kind = k ? "decode" : "prefill";
            printf("MEASURE cpu quant parity %s %s levers %s: argmax agreement %ld/%ld where margin > 0.05, "
                   "max|dlogit| %.3g of %.3g, mean KL %.3g%s\n",
                   name, kind, lv, acc[k].agree, acc[k].gated, acc[k].maxd, acc[k].maxl,
                   acc[k].rows ? acc[k].kl / (double)acc[k].rows : 0.0, gate == GATE_NONE ? " (not gated)" : "");
            if (gate == GATE_MOE)
                CHECK(acc[k].agree * 100 >= acc[k].gated * 95, "%s %s levers %s: MoE agreement %ld/%ld below 95%%",
                      name, kind, lv, acc[k].agree, acc[k].gated);
            else if (gate == GATE_DENSE)
                CHECK(acc[k].agree == acc[k].gated, "%s %s levers %s: argmax differs at %ld of %ld gated positions",
                      name, kind, lv, acc[k].gated - acc[k].agree, acc[k].gated);
        }
        long d[PT_CPU_PATH_N];
        for (int i = 0; i < PT_CPU_PATH_N; i++) d[i] = atomic_load(&pt_cpu_path_count[i]) - c0[i];
        printf("INFO %s levers %s: 4-bit decode tokens on the integer-piece kernel %ld, bf16 kernel %ld, f32 kernel "
               "%ld; 8-bit decode tokens on the integer-piece kernel %ld, f32 kernel %ld; prefill calls on the "
               "integer-piece GEMM %ld (8-bit: %ld), bf16 GEMM %ld, f32 GEMM %ld\n",
               name, lv, d[PT_CPU_PATH_XINT], d[PT_CPU_PATH_BF16], d[PT_CPU_PATH_F32], d[PT_CPU_PATH_XINT8],
               d[PT_CPU_PATH_Q8F32], d[PT_CPU_PATH_XGEMM], d[PT_CPU_PATH_XGEMM8], d[PT_CPU_PATH_BGEMM],
               d[PT_CPU_PATH_GEMM]);
        /* the levers reach their kernels (AVX-512 VNNI / BF16; 4- and 8-bit fixtures: decode and prefill), and
         * nothing does when they are off */
        if (on != 2) CHECK(d[PT_CPU_PATH_BGEMM] == 0, "%s levers %s: the bf16 GEMM ran", name, lv);
        if (on != 3) CHECK(d[PT_CPU_PATH_AMX] == 0, "%s levers %s: the AMX GEMM ran", name, lv);
        if (on >= 2) {
            int path = on == 2 ? PT_CPU_PATH_BGEMM : PT_CPU_PATH_AMX;
            CHECK(d[PT_CPU_PATH_XINT] == 0 && d[PT_CPU_PATH_XGEMM] == 0 && d[PT_CPU_PATH_XGEMM8] == 0,
                  "%s levers %s: integer pieces ran", name, lv);
            if (!bf16_cpu() || (on == 3 && !pt_cpu_amx_available()))
                printf("INFO %s: no AVX-512 BF16%s here, the levers %s GEMM is not reachable\n", name,
                       on == 3 ? " / AMX" : "", lv);
            else if (strstr(name, "_q4") || strstr(name, "_q8"))
                CHECK(d[path] > 0, "%s levers %s: its GEMM was not reached", name, lv);
        } else if (!on)
            CHECK(d[PT_CPU_PATH_XINT] == 0 && d[PT_CPU_PATH_XINT8] == 0 && d[PT_CPU_PATH_XGEMM] == 0 &&
                      d[PT_CPU_PATH_XGEMM8] == 0,
                  "%s: integer pieces with the levers off", name);
        else if (!pt_cpu_gemm_i8_available())
            printf("INFO %s: no AVX-512 VNNI here, the integer-piece kernels are not reachable\n", name);
        else if (strstr(name, "_q4"))
            CHECK(d[PT_CPU_PATH_XGEMM] > 0 && d[PT_CPU_PATH_XINT] > 0,
                  "%s levers on: the integer-piece kernels were not reached", name);
        else if (strstr(name, "_q8"))
            CHECK(d[PT_CPU_PATH_XINT8] > 0 && d[PT_CPU_PATH_XGEMM8] > 0,
                  "%s levers on: the 8-bit integer-piece kernel or GEMM was not reached", name);
    }
    pt_cpu_lever.xint = saved[0];
    pt_cpu_lever.xgemm = saved[1];
    pt_cpu_lever.xgemm8 = saved[2];
    pt_cpu_lever.bgemm = saved[3];
    pt_cpu_lever.amx = saved[4];
    /* levers on vs off: the same argmax wherever either run's own top-2 are more than 0.05 apart (MoE:
     * at >= 95% of those positions) */
    for (int on = 1; on < NLV; on++)
        for (int k = 0; k < 2; k++) {
            long cmp = 0, same = 0;
            for (int p = 0; p < n_prompts; p++) {
                int n = 0;
                golden_prompt_ids(g, p, &n);
                if (!am[0][k][p] || !am[on][k][p]) continue;
                for (int t = 0; t < n; t++) {
                    if (mg[0][k][p][t] <= 0.05f && mg[on][k][p][t] <= 0.05f) continue;
                    cmp++;
                    if (am[0][k][p][t] == am[on][k][p][t]) same++;
                    else
                        printf("INFO %s prompt %d %s position %d: levers off %d (margin %.4f), %s %d (margin %.4f)\n",
                               name, p, k ? "decode" : "prefill", t, am[0][k][p][t], mg[0][k][p][t], lever_name[on],
                               am[on][k][p][t], mg[on][k][p][t]);
                }
            }
            printf("MEASURE cpu quant parity %s %s levers %s vs off: argmax identical at %ld/%ld positions\n", name,
                   k ? "decode" : "prefill", lever_name[on], same, cmp);
            if (gate == GATE_MOE) /* a routing near-tie may flip an expert either way (the 95% rule) */
                CHECK(same * 100 >= cmp * 95, "%s %s: levers %s change the argmax at %ld of %ld positions", name,
                      k ? "decode" : "prefill", lever_name[on], cmp - same, cmp);
            else
                CHECK(same == cmp, "%s %s: levers %s change the argmax at %ld of %ld positions", name,
                      k ? "decode" : "prefill", lever_name[on], cmp - same, cmp);
        }
out:
    for (int i = 0; i < NLV; i++)
        for (int k = 0; k < 2; k++)
            for (int p = 0; p < MAXP; p++) {
                free(am[i][k][p]);
                free(mg[i][k][p]);
            }
    pt_model_free(&m1);
    pt_model_free(&m2);
    golden_close(g);
}

/* Dense 4-bit and 8-bit Llama: the L1 bf16 gate holds. */
static void test_llama_mlx_q4(void) { check_fixture("llama_mlx_q4", GATE_DENSE); }
static void test_llama_mlx_q8(void) { check_fixture("llama_mlx_q8", GATE_DENSE); }
static void test_qwen3_moe_mlx_q4(void) { check_fixture("qwen3_moe_mlx_q4", GATE_MOE); }
static void test_gemma4_moe_mlx_q4(void) { check_fixture("gemma4_moe_mlx_q4", GATE_MOE); }
/* Measured, not gated against the bf16 golden: the bf16 reference rounds
 * every dequantized weight to bf16 (model.to(torch.bfloat16)), the quantized
 * kernels do not (MLX's factored form, scale·Σq·x + bias·Σx in f32), and on
 * these two fixtures that difference alone moves gated argmaxes: the same
 * positions disagree when the weights are dequantized to dense f32 and run
 * through the dense kernels (no quantized kernel involved), and at most of
 * them our argmax is the f32 reference's. qwen3_5_mlx_q4's own bf16 and f32
 * references disagree at 5–14% of positions by up to 6.7 logits (its
 * golden.json), llama_mlx_mixed_3_6 differs at one position of golden margin
 * 0.0625 (one bf16 ulp), where ours is the f32 reference's argmax. Their
 * 3/6-bit and 4-bit kernels are still held here to thread invariance, to the
 * levers reaching their kernels and to the levers changing no decision. */
static void test_llama_mlx_mixed_3_6(void) { check_fixture("llama_mlx_mixed_3_6", GATE_NONE); }
static void test_qwen3_5_mlx_q4(void) { check_fixture("qwen3_5_mlx_q4", GATE_NONE); }

/* The bundled demo model (models/kjv-llama-4bit: 4-bit g32, K = 512 / 1408,
 * so every decode matmul can take the integer-piece kernel) against its
 * goldens' bf16 greedy continuations, in the four lever settings; the rule of
 * test_parity_demo.c's bf16 pass: identical up to a near-tie (the
 * reference's f32 margin <= 0.05, or our top-2 within one bf16 ulp). */
static void test_demo(void) {
    const char *dir = "models/kjv-llama-4bit";
    if (!pt_is_file("tests/fixtures/demo/golden.bin") || !pt_is_dir(dir)) TEST_SKIP("demo model or goldens absent");
    char err[512];
    golden *g = golden_open("tests/fixtures/demo/golden.bin", err, sizeof err);
    REQUIRE(g, "%s", err);
    pt_model *m = load(dir, 2);
    if (!m) {
        golden_close(g);
        REQUIRE(0, "demo model load failed");
    }
    int V = pt_model_vocab_size(m);
    int saved[4] = {pt_cpu_lever.xint, pt_cpu_lever.xgemm, pt_cpu_lever.bgemm, pt_cpu_lever.amx};
    for (int on = 0; on < NLV; on++) {
        pt_cpu_lever.xint = pt_cpu_lever.xgemm = on == 1;
        pt_cpu_lever.bgemm = on == 2;
        pt_cpu_lever.amx = on == 3;
        long x0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XINT]), g0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XGEMM]),
             b0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_BGEMM]),
             a0 = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_AMX]);
        int np = 0;
        for (int p = 0;; p++, np++) {
            char nm[64];
            snprintf(nm, sizeof nm, "prompt.%d.ids", p);
            const golden_array *ids = golden_find(g, nm);
            snprintf(nm, sizeof nm, "prompt.%d.greedy.bf16", p);
            const golden_array *gg = golden_find(g, nm);
            snprintf(nm, sizeof nm, "prompt.%d.greedy_margin.f32", p);
            const golden_array *gm = golden_find(g, nm);
            if (!ids) break;
            if (!gg || !gm || gg->dtype != GOLDEN_I32 || ids->dtype != GOLDEN_I32 || !gm->f32 || gm->count < gg->count) {
                CHECK(0, "demo prompt %d: golden arrays missing", p);
                continue;
            }
            int n = (int)ids->count, steps = (int)gg->count;
            const int32_t *gid = gg->data;
            pt_session *s = NULL;
            pt_session_params sp = {.n_ctx = n + steps + 2};
            REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "%s", pt_last_error());
            REQUIRE(pt_session_prompt(s, ids->data, (size_t)n) == PT_OK, "%s", pt_last_error());
            int same = 0, near = 0;
            float ourm = 0;
            for (int i = 0; i < steps; i++) {
                float mg;
                int id = top2(pt_session_logits(s), V, &mg);
                if (id != gid[i]) {
                    const float *lg = pt_session_logits(s);
                    ourm = mg;
                    near = gm->f32[i] <= 0.05f || mg <= parity_ulp_bf16(lg[id]);
                    break;
                }
                same++;
                if (i + 1 < steps) REQUIRE(pt_session_prompt(s, &gid[i], 1) == PT_OK, "%s", pt_last_error());
            }
            pt_session_free(&s);
            printf("MEASURE cpu quant parity demo prompt %d greedy levers %s: %d/%d tokens identical%s\n", p,
                   lever_name[on], same, steps, same < steps ? (near ? " (then a near-tie)" : " (then DIVERGES)") : "");
            if (same < steps)
                printf("INFO demo prompt %d levers %s: step %d, our margin %.4f, golden f32 margin %.4f\n", p,
                       lever_name[on], same, ourm, gm->f32[same]);
            CHECK(same == steps || near, "demo prompt %d greedy levers %s diverges at step %d", p, lever_name[on],
                  same);
        }
        CHECK(np > 0, "demo: no prompts in the golden");
        long dx = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XINT]) - x0,
             dg = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_XGEMM]) - g0,
             db = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_BGEMM]) - b0,
             da = atomic_load(&pt_cpu_path_count[PT_CPU_PATH_AMX]) - a0;
        printf("INFO demo levers %s: %ld decode tokens on the integer-piece kernel, %ld prefill calls on its GEMM, %ld "
               "on the bf16 GEMM, %ld on AMX\n",
               lever_name[on], dx, dg, db, da);
        if (on != 3) CHECK(da == 0, "demo levers %s: the AMX GEMM ran", lever_name[on]);
        if (on == 3 && pt_cpu_amx_available()) CHECK(da > 0, "demo: the AMX GEMM was not reached");
        if (on != 1) CHECK(dx == 0 && dg == 0, "demo levers %s: integer pieces ran", lever_name[on]);
        if (on != 2) CHECK(db == 0, "demo levers %s: the bf16 GEMM ran", lever_name[on]);
        if (on == 1 && pt_cpu_gemm_i8_available())
            CHECK(dx > 0 && dg > 0, "demo: the integer-piece kernels were not reached");
        if (on == 2 && bf16_cpu()) CHECK(db > 0, "demo: the bf16 GEMM was not reached");
    }
    pt_cpu_lever.xint = saved[0];
    pt_cpu_lever.xgemm = saved[1];
    pt_cpu_lever.bgemm = saved[2];
    pt_cpu_lever.amx = saved[3];
    pt_model_free(&m);
    golden_close(g);
}

int main(void) {
    if (!pt_is_dir("tests/fixtures")) {
        printf("SKIP cpu quant parity: tests/fixtures absent\n");
        return test_summary();
    }
    TEST_RUN(test_llama_mlx_q4);
    TEST_RUN(test_llama_mlx_q8);
    TEST_RUN(test_llama_mlx_mixed_3_6);
    TEST_RUN(test_qwen3_moe_mlx_q4);
    TEST_RUN(test_qwen3_5_mlx_q4);
    TEST_RUN(test_gemma4_moe_mlx_q4);
    TEST_RUN(test_demo);
    return test_summary();
}
