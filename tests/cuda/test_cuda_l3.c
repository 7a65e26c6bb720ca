/* The L3 gate on CUDA (DESIGN.md "Numerics and parity tiers"): the
 * output-changing --fused-decode-attn lever of the CUDA backend
 * (src/backend/cuda/kv_fused.cu) against the frozen snapshot of L1 outputs
 * that tests/test_l3_gate.c holds the CPU's levers to
 * (tests/fixtures/l3_snapshot/<fixture>.bin: the greedy trajectory of 32
 * tokens after the fixture's last golden prompt and the L1 logits that chose
 * each; format in tests/test_l3_gate.c).
 *
 * Each configuration runs on the GPU in f32 (the snapshot's dtype),
 * teacher-forced on the snapshot's trajectory, with group size 32 (the
 * fixtures' heads are 32 and 64 wide): L1 itself (the baseline: how far the
 * CUDA backend sits from the CPU snapshot), --kv-quant 4 (exact attention),
 * --kv-quant 4 and 8 with --fused-decode-attn on. Every one is held to the
 * tier's bound — mean KL(L1 || config) <= 0.02 nats per step and top-1
 * agreement >= 90% — and the fused kernel's own delta (fused vs exact at 4
 * bits, same cache) to the same bound; the deltas are printed as MEASURE
 * lines (docs/flags.md records them next to the speedup). As on the CPU,
 * 4-bit KV on gemma4_e exceeds the tier bound by itself (not gated there;
 * the fused kernel's own delta is).
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU it reports SKIP. */
#include "test.h"
#include "l3_snapshot.h"

#include "backend/cuda/cuda.h"
#include "base/mmap.h"
#include "golden.h"
#include "petrel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KL_BOUND 0.02
#define TOP1_BOUND 0.90

static const char *const fixtures[] = {"llama", "gemma2", "gemma3_text", "gemma4_e", "llama_mlx_q4"};

typedef struct {
    const char *name;
    int kv_quant, fused;
} config;

/* Runs configuration c on CUDA in f32, teacher-forced on the snapshot's
 * trajectory: rows [n_steps, V] and their argmax. */
static int run_config(const char *fixture, const l3_snap *s, const config *c, float *rows, int32_t *top) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    mp.dtype = PT_COMPUTE_F32;
    mp.n_threads = 2;
    mp.kv_quant = c->kv_quant;
    mp.kv_group_size = 32;
    mp.fused_decode_attn = c->fused ? PT_LEVER_ON : PT_LEVER_OFF;
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fixture);
    pt_model *m = NULL;
    if (pt_model_load(dir, &mp, &m) != PT_OK) {
        printf("    load %s: %s\n", dir, pt_last_error());
        return 0;
    }
    const int V = (int)pt_model_vocab_size(m);
    pt_session *ss = NULL;
    pt_session_params sp = {.n_ctx = s->n_prompt + s->n_steps + 1};
    int ok = V == s->vocab && pt_session_create(m, &sp, &ss) == PT_OK &&
             pt_session_prompt(ss, s->ids, (size_t)s->n_prompt) == PT_OK;
    for (int j = 0; ok && j < s->n_steps; j++) {
        const float *lg = pt_session_logits(ss);
        memcpy(rows + (size_t)j * V, lg, (size_t)V * sizeof(float));
        top[j] = golden_argmax(lg, V);
        if (j + 1 < s->n_steps) ok = pt_session_prompt(ss, &s->greedy[j], 1) == PT_OK;
    }
    if (!ok) printf("    %s %s: %s\n", fixture, c->name, pt_last_error());
    pt_session_free(&ss);
    pt_model_free(&m);
    return ok;
}

static void test_cuda_l3_gate(void) {
    char why[512];
    if (pt_cuda_device_count(why, sizeof why) == 0) TEST_SKIP("no usable CUDA device here");
    static const config cfgs[] = {
        {"L1", 0, 0},
        {"kv-quant 4", 4, 0}, /* the fused kernel's own delta is taken against this one */
        {"kv-quant 4 + fused-decode-attn", 4, 1},
        {"kv-quant 8 + fused-decode-attn", 8, 1},
    };
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        const char *fx = fixtures[f];
        l3_snap s;
        REQUIRE(l3_snap_read(fx, &s), "%s: reading the snapshot", fx);
        const size_t nr = (size_t)s.n_steps * s.vocab;
        float *rows = malloc(4 * nr), *base = malloc(4 * nr);
        int32_t *top = malloc(4 * (size_t)s.n_steps), *base_top = malloc(4 * (size_t)s.n_steps);
        REQUIRE(rows && base && top && base_top, "memory");
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            if (!run_config(fx, &s, &cfgs[c], rows, top)) {
                CHECK(0, "%s: %s did not run on CUDA: %s", fx, cfgs[c].name, pt_last_error());
                continue;
            }
            double mk, ag;
            l3_delta(&s, s.logits, s.greedy, rows, top, &mk, NULL, &ag);
            printf("MEASURE l3 cuda %s %s vs L1 snapshot: mean KL %.3g, top-1 agreement %.3f (bound: mean KL <= %.3g, "
                   "agreement >= %.2f)\n",
                   fx, cfgs[c].name, mk, ag, KL_BOUND, TOP1_BOUND);
            if (!strcmp(fx, "gemma4_e") && cfgs[c].kv_quant == 4)
                printf("INFO l3 cuda %s %s: 4-bit KV exceeds the tier bound on Gemma 4 (not gated)\n", fx,
                       cfgs[c].name);
            else
                CHECK(mk <= KL_BOUND && ag >= TOP1_BOUND, "%s %s on CUDA: mean KL %.3g, agreement %.3f outside the "
                      "bound", fx, cfgs[c].name, mk, ag);
            if (cfgs[c].kv_quant == 4 && !cfgs[c].fused) {
                memcpy(base, rows, 4 * nr);
                memcpy(base_top, top, 4 * (size_t)s.n_steps);
            } else if (cfgs[c].kv_quant == 4) { /* the fused kernel alone */
                l3_delta(&s, base, base_top, rows, top, &mk, NULL, &ag);
                printf("MEASURE l3 cuda %s fused-decode-attn vs exact attention (kv-quant 4): mean KL %.3g, top-1 "
                       "agreement %.3f\n",
                       fx, mk, ag);
                CHECK(mk <= KL_BOUND && ag >= TOP1_BOUND, "%s: fused vs exact on CUDA outside the bound", fx);
            }
        }
        free(rows), free(base), free(top), free(base_top);
        l3_snap_free(&s);
    }
}

int main(void) {
    TEST_RUN(test_cuda_l3_gate);
    return test_summary();
}
