/* The pipelined decode (runtime/session.c pt_session_sample_ahead,
 * model/forward.c pt_fwd_ahead_*) against the same calls unpipelined
 * (PETREL_CUDA_PIPELINE=0, read per call), on CUDA models from the fixtures:
 *   - conversations through pt_generate: a first turn that ends by
 *     max_tokens, by a cancel from the callback, or by an eos token (the
 *     ways a sampled token is never run through the model, so its step
 *     ahead must leave no trace), then a turn that continues from the held
 *     logits and a turn with a new prompt: the same ids and log-probabilities
 *     (bit for bit: a greedy row's log-probability runs beside the next step,
 *     PETREL_CUDA_SAMPLE_EARLY_ID), the same finish,
 *     the same context (n_tokens and tokens) and bit-identical host logits
 *     after the first turn, greedy and seeded sampling (top-k/top-p,
 *     min-p with penalties, top-k beyond what the GPU sorts, so the host
 *     samples and the step ahead is dropped), with bf16 and 4-bit KV;
 *   - the session calls themselves: a prompt of another id than the one
 *     sampled, a truncation and a second sample while a step is ahead all
 *     drop it, and the session goes on exactly as the unpipelined one;
 *   - that the pipeline was in fact used where it applies (steps taken) and
 *     not where it cannot (Qwen3.5's recurrent state, rotating caches);
 *   - a greedy row without a log-probability sampled inside the step's own
 *     graph (PETREL_CUDA_STEP_SAMPLE=1, set here for every pipelined run:
 *     session.h step_sampled > 0; no other row), and the same conversations
 *     with it unset (the default: the sampler after each step);
 *   - the one-row GEMVs' shared-memory carveout preference
 *     (PETREL_CUDA_CARVE) on and off: the same logits bit for bit.
 * Not the speed (petrel bench, bench/RESULTS.md). */
#include "test.h"
#include "gpu_util.h"

#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/mmap.h"
#include "model/model.h"
#include "petrel.h"
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

#define NEED_GPU()                                \
    do {                                          \
        if (!gpu_usable("no GPU")) {              \
            TEST_SKIP("no usable CUDA device");   \
            return;                               \
        }                                         \
    } while (0)

static void set_pipe(int on) { setenv("PETREL_CUDA_PIPELINE", on ? "1" : "0", 1); }

static pt_model *load(const char *dir, int kv4) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    mp.n_threads = 2;
    mp.gpu_sampling = PT_LEVER_ON;
    mp.compiled_decode = PT_LEVER_ON;
    if (kv4) {
        mp.kv_quant = 4;
        mp.quantized_kv_start = 8; /* converted during the 20-token prompt */
    }
    pt_model *m = NULL;
    pt_status s = pt_model_load(dir, &mp, &m);
    CHECK(s == PT_OK, "%s: %s", dir, pt_last_error());
    return m;
}

enum { MAXT = 96 };
typedef struct {
    int32_t ids[MAXT];
    float lp[MAXT]; /* each token's log-probability */
    int n;
    int cancel_at; /* the callback cancels after this many tokens (-1: never) */
} toks;

static int collect(void *user, const pt_token_info *ti, const char *text, size_t len) {
    (void)text, (void)len;
    toks *t = user;
    if (ti->id >= 0 && t->n < MAXT) t->lp[t->n] = ti->logprob, t->ids[t->n++] = ti->id;
    return t->cancel_at >= 0 && t->n >= t->cancel_at;
}

/* One conversation's observable results. */
typedef struct {
    toks t[3];
    pt_finish_reason fin[3];
    size_t n_tok[3];
    int32_t ctx[256];
    float *logits; /* [V] the host logits after turn 1 */
    uint64_t taken;
    uint64_t sampled; /* samples the steps' own graphs made */
} transcript;

/* mode 0: turn 1 ends by max_tokens; 1: by a cancel after 9 tokens; 2: by
 * the eos token eos (the model's eos set replaced for the turn). */
static void converse(pt_model *m, const pt_sampling_params *sp, int mode, int32_t eos, transcript *tr) {
    const int V = pt_model_vocab_size(m);
    memset(tr->t, 0, sizeof tr->t);
    tr->logits = malloc((size_t)V * 4);
    pt_session *s = NULL;
    pt_session_params spp = pt_session_default_params();
    spp.n_ctx = 256;
    pt_status st = pt_session_create(m, &spp, &s);
    REQUIRE(st == PT_OK, "session: %s", pt_last_error());
    int32_t prompt[20], p3[3];
    for (int i = 0; i < 20; i++) prompt[i] = (int32_t)((5 + i * 13) % V);
    for (int i = 0; i < 3; i++) p3[i] = (int32_t)((7 + i * 31) % V);
    pt_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.sampling = *sp;
    gp.max_tokens = 24;
    tr->t[0].cancel_at = mode == 1 ? 9 : -1;
    int32_t *eos_save = m->eos;
    size_t neos_save = m->n_eos;
    if (mode == 2) m->eos = &eos, m->n_eos = 1;
    st = pt_generate(s, prompt, 20, &gp, collect, &tr->t[0], &tr->fin[0], NULL);
    m->eos = eos_save, m->n_eos = neos_save;
    CHECK(st == PT_OK, "turn 1: %s", pt_last_error());
    tr->n_tok[0] = pt_session_n_tokens(s);
    const float *lg = pt_session_logits(s);
    CHECK(lg != NULL, "logits after turn 1: %s", pt_last_error());
    if (lg) memcpy(tr->logits, lg, (size_t)V * 4);
    /* turn 2 continues from the held logits; turn 3 brings a new prompt */
    tr->t[1].cancel_at = tr->t[2].cancel_at = -1;
    gp.max_tokens = 10;
    if (st == PT_OK) st = pt_generate(s, NULL, 0, &gp, collect, &tr->t[1], &tr->fin[1], NULL);
    tr->n_tok[1] = pt_session_n_tokens(s);
    gp.max_tokens = 14;
    if (st == PT_OK) st = pt_generate(s, p3, 3, &gp, collect, &tr->t[2], &tr->fin[2], NULL);
    CHECK(st == PT_OK, "turns 2/3: %s", pt_last_error());
    tr->n_tok[2] = pt_session_n_tokens(s);
    memset(tr->ctx, 0, sizeof tr->ctx);
    memcpy(tr->ctx, pt_session_tokens(s), pt_session_n_tokens(s) * 4);
    tr->taken = s->ahead_taken;
    tr->sampled = s->step_sampled;
    pt_session_free(&s);
}

/* 1 when the two transcripts agree in everything observable. */
static int same_transcript(const transcript *a, const transcript *b, int V, const char *what) {
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        if (a->t[k].n != b->t[k].n || memcmp(a->t[k].ids, b->t[k].ids, (size_t)a->t[k].n * 4)) {
            int d = 0;
            while (d < a->t[k].n && d < b->t[k].n && a->t[k].ids[d] == b->t[k].ids[d]) d++;
            CHECK(0, "%s turn %d: ids differ at %d (%d vs %d tokens)", what, k + 1, d, a->t[k].n, b->t[k].n);
            ok = 0;
        } else if (memcmp(a->t[k].lp, b->t[k].lp, (size_t)a->t[k].n * 4)) {
            CHECK(0, "%s turn %d: log-probabilities differ", what, k + 1);
            ok = 0;
        }
        CHECK(a->fin[k] == b->fin[k], "%s turn %d: finish %d vs %d", what, k + 1, a->fin[k], b->fin[k]);
        CHECK(a->n_tok[k] == b->n_tok[k], "%s turn %d: context %zu vs %zu tokens", what, k + 1, a->n_tok[k],
              b->n_tok[k]);
        ok &= a->fin[k] == b->fin[k] && a->n_tok[k] == b->n_tok[k];
    }
    int ctx_same = !memcmp(a->ctx, b->ctx, sizeof a->ctx);
    int lg_same = !memcmp(a->logits, b->logits, (size_t)V * 4);
    CHECK(ctx_same, "%s: the contexts differ", what);
    CHECK(lg_same, "%s: the logits held after turn 1 differ", what);
    return ok && ctx_same && lg_same;
}

static void sampling_sets(pt_sampling_params *sps, int *n) {
    for (int k = 0; k < 5; k++) {
        memset(&sps[k], 0, sizeof sps[k]);
        sps[k].top_p = 1.0f;
        sps[k].repetition_penalty = 1.0f;
        sps[k].repeat_last_n = 64;
        sps[k].seed = 7 + (uint64_t)k;
    }
    /* 0: greedy */
    sps[1].temperature = 0.9f, sps[1].top_p = 0.9f, sps[1].top_k = 40;
    sps[2].temperature = 1.2f, sps[2].min_p = 0.02f, sps[2].repetition_penalty = 1.2f,
    sps[2].presence_penalty = 0.3f, sps[2].frequency_penalty = 0.2f;
    /* top-k beyond the GPU's sorted candidates: every row handed back to the
     * host (where the vocabulary is that large), each step ahead dropped */
    sps[3].temperature = 0.8f, sps[3].top_k = 5000;
    /* greedy without a log-probability: the greedy id's kernel is the sampler's last pass */
    sps[4].no_logprob = 1;
    *n = 5;
}

/* Conversations with the pipeline on and off: identical in everything. */
static void test_conversations(void) {
    NEED_GPU();
    static const struct {
        const char *dir;
        int kv4;
        int expect_pipe; /* 1: steps ahead must be taken; 0: must not be; -1: either */
    } cases[] = {
        {"tests/fixtures/llama", 0, 1},          {"tests/fixtures/llama", 1, 1},
        {"tests/fixtures/llama_mlx_q4", 0, 1},   {"tests/fixtures/qwen3", 0, 1},
        {"tests/fixtures/gemma2", 0, -1},        {"tests/fixtures/qwen3_5_mlx_q4", 0, 0},
        {"models/kjv-llama-4bit", 0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (!pt_is_dir(cases[c].dir)) {
            printf("INFO %s absent, skipped\n", cases[c].dir);
            continue;
        }
        pt_model *m = load(cases[c].dir, cases[c].kv4);
        if (!m) continue;
        const int V = pt_model_vocab_size(m);
        pt_sampling_params sps[5];
        int nsp = 0;
        sampling_sets(sps, &nsp);
        int n_same = 0, n_runs = 0;
        uint64_t taken = 0, sampled = 0;
        for (int k = 0; k < nsp; k++)
            for (int mode = 0; mode < 3; mode++) {
                transcript on, off;
                /* the eos of mode 2: the unpipelined run's 10th token of mode 0 */
                int32_t eos = 0;
                int eos_known = 0;
                if (mode == 2) {
                    set_pipe(0);
                    converse(m, &sps[k], 0, 0, &off);
                    eos_known = off.t[0].n > 9;
                    eos = eos_known ? off.t[0].ids[9] : 0;
                    free(off.logits);
                }
                set_pipe(0);
                converse(m, &sps[k], mode, eos, &off);
                set_pipe(1);
                converse(m, &sps[k], mode, eos, &on);
                char what[300];
                snprintf(what, sizeof what, "%s%s params %d mode %d", cases[c].dir, cases[c].kv4 ? " kv4" : "", k,
                         mode);
                n_same += same_transcript(&on, &off, V, what);
                if (sps[k].no_logprob) {
                    /* the in-step sample off (the default): the sampler after each step */
                    transcript sep;
                    setenv("PETREL_CUDA_STEP_SAMPLE", "0", 1);
                    converse(m, &sps[k], mode, eos, &sep);
                    setenv("PETREL_CUDA_STEP_SAMPLE", "1", 1);
                    char w2[320];
                    snprintf(w2, sizeof w2, "%s (no in-step sample)", what);
                    n_same += same_transcript(&sep, &off, V, w2);
                    n_runs++;
                    CHECK(sep.sampled == 0, "%s: %llu in-step samples with them off", w2,
                          (unsigned long long)sep.sampled);
                    if (cases[c].expect_pipe == 1)
                        CHECK(on.sampled > 0, "%s: no sample inside a step", what);
                    sampled += on.sampled;
                    free(sep.logits);
                } else {
                    CHECK(on.sampled == 0, "%s: %llu in-step samples for a row that may not take them", what,
                          (unsigned long long)on.sampled);
                }
                if (sps[k].no_logprob)
                    for (int t = 0; t < 3; t++)
                        for (int i = 0; i < on.t[t].n; i++)
                            CHECK(on.t[t].lp[i] == 0.0f, "%s turn %d token %d: a log-probability (%.9g) nobody "
                                  "asked for", what, t + 1, i, (double)on.t[t].lp[i]);
                n_runs++;
                CHECK(off.taken == 0, "%s: steps ahead taken with the pipeline off", what);
                if (mode == 2 && eos_known) CHECK(on.fin[0] == PT_FINISH_EOS, "%s: turn 1 did not end at the eos", what);
                taken += on.taken;
                free(on.logits), free(off.logits);
            }
        printf("INFO %s%s: %d of %d conversations identical with the pipeline on/off, %llu steps ahead taken, "
               "%llu samples in a step\n",
               cases[c].dir, cases[c].kv4 ? " (4-bit KV)" : "", n_same, n_runs, (unsigned long long)taken,
               (unsigned long long)sampled);
        if (cases[c].expect_pipe == 1) CHECK(taken > 0, "%s: the pipeline was never used", cases[c].dir);
        if (cases[c].expect_pipe == 0) CHECK(taken == 0, "%s: steps ahead taken where none may run", cases[c].dir);
        pt_model_free(&m);
    }
    set_pipe(1);
}

/* The session calls around a step ahead, scripted: at step i the sampled id
 * is fed (taken), or another id is fed, or the session is truncated by two
 * tokens, or sampled twice; the same script with the pipeline off gives the
 * same ids, context and logits. */
static void script(pt_model *m, int pipe, const pt_sampling_params *sp, int32_t *ids, int *n_ids, float *logits,
                   int32_t *ctx, size_t *n_ctx, uint64_t *taken, uint64_t *sampled) {
    set_pipe(pipe);
    const int V = pt_model_vocab_size(m);
    pt_session *s = NULL;
    pt_session_params spp = pt_session_default_params();
    spp.n_ctx = 128;
    pt_status st = pt_session_create(m, &spp, &s);
    REQUIRE(st == PT_OK, "session: %s", pt_last_error());
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)((3 + i * 17) % V);
    st = pt_session_prompt(s, prompt, 12);
    *n_ids = 0;
    for (int i = 0; i < 40 && st == PT_OK; i++) {
        pt_token_info ti;
        st = pt_session_sample_ahead(s, sp, &ti);
        if (st != PT_OK) break;
        ids[(*n_ids)++] = ti.id;
        if (i % 7 == 3) {
            int32_t other = (ti.id + 1) % V;
            st = pt_session_prompt(s, &other, 1);
        } else if (i % 7 == 5) {
            /* back by two tokens, then the sampled id and another in one chunk */
            st = pt_session_truncate(s, pt_session_n_tokens(s) - 2);
            int32_t two[2] = {ti.id, (ti.id + 3) % V};
            if (st == PT_OK) st = pt_session_prompt(s, two, 2);
        } else if (i % 7 == 6) {
            st = pt_session_sample(s, sp, NULL, &ti); /* a second draw from the same logits */
            if (st == PT_OK) ids[(*n_ids)++] = ti.id;
            if (st == PT_OK) st = pt_session_prompt(s, &ti.id, 1);
        } else {
            st = pt_session_prompt(s, &ti.id, 1);
        }
    }
    CHECK(st == PT_OK, "script (pipeline %d): %s", pipe, pt_last_error());
    const float *lg = pt_session_logits(s);
    CHECK(lg != NULL, "logits: %s", pt_last_error());
    if (lg) memcpy(logits, lg, (size_t)V * 4);
    *n_ctx = pt_session_n_tokens(s);
    memcpy(ctx, pt_session_tokens(s), *n_ctx * 4);
    *taken = s->ahead_taken;
    *sampled = s->step_sampled;
    pt_session_free(&s);
}

static void test_session_calls(void) {
    NEED_GPU();
    const char *dir = "tests/fixtures/llama";
    if (!pt_is_dir(dir)) {
        TEST_SKIP("%s absent", dir);
        return;
    }
    pt_model *m = load(dir, 0);
    REQUIRE(m != NULL, "model");
    const int V = pt_model_vocab_size(m);
    pt_sampling_params sps[5];
    int nsp = 0;
    sampling_sets(sps, &nsp);
    for (int k = 0; k < nsp; k++) {
        if (k == 3) continue; /* every row handed back to the host: no step ahead to take */
        int32_t ida[96], idb[96], ca[128], cb[128];
        int na = 0, nb = 0;
        size_t nca = 0, ncb = 0;
        uint64_t ta = 0, tb = 0, sa = 0, sb = 0;
        float *la = calloc((size_t)V, 4), *lb = calloc((size_t)V, 4);
        script(m, 1, &sps[k], ida, &na, la, ca, &nca, &ta, &sa);
        script(m, 0, &sps[k], idb, &nb, lb, cb, &ncb, &tb, &sb);
        CHECK(na == nb && !memcmp(ida, idb, (size_t)na * 4), "params %d: sampled ids differ", k);
        CHECK(nca == ncb && !memcmp(ca, cb, nca * 4), "params %d: contexts differ (%zu vs %zu)", k, nca, ncb);
        CHECK(!memcmp(la, lb, (size_t)V * 4), "params %d: final logits differ", k);
        CHECK(ta > 0 && tb == 0, "params %d: steps ahead taken %llu (on) / %llu (off)", k, (unsigned long long)ta,
              (unsigned long long)tb);
        CHECK(sps[k].no_logprob ? sa > 0 : sa == 0, "params %d: %llu samples in a step", k, (unsigned long long)sa);
        printf("INFO script params %d: %d ids, context %zu, steps ahead taken %llu (%llu sampled in the step): "
               "identical on/off\n", k, na, nca, (unsigned long long)ta, (unsigned long long)sa);
        free(la), free(lb);
    }
    set_pipe(1);
    pt_model_free(&m);
}

/* gemv_tc.cu: the one-row GEMV launches' shared-memory carveout preference (1: the most shared memory, 0:
 * the driver's choice, -1: PETREL_CUDA_CARVE) and the launches that asked for it */
void pt_cuda_carve(int on);
unsigned long long pt_cuda_carve_count(void);

/* The carveout is a scheduling preference: the prompt's and 5 greedy steps' logits (eager prompt, graph
 * steps) must be bit-identical with it and without it, and the launches must have asked for it only when
 * on. */
static void test_carve_on_off(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    gpu_forward_on_off_models(pt_cuda_carve, pt_cuda_carve_count, "carveout preference");
}

int main(void) {
    setenv("PETREL_CUDA_STEP_SAMPLE", "1", 1);
    TEST_RUN(test_conversations);
    TEST_RUN(test_session_calls);
    TEST_RUN(test_carve_on_off);
    return test_summary();
}
