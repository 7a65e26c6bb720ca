/* GPU sampling (src/backend/cuda/sample.cu, sample_oneblock.cu) against the CPU sampler
 * (src/runtime/sampler.c), token for token:
 *   - the kernel alone on random logit rows (peaked and flat, ties, -inf and
 *     NaN entries, vocabularies from 50 to 151936) over every combination of
 *     greedy / temperature / top-k / top-p / min-p / repetition, presence
 *     and frequency penalties (a token history on the device, windows of 64
 *     and of the whole history), one row per launch and many rows with
 *     their own parameters in one launch: the same id as
 *     pt_sampler_sample_u with the same draw, and the chosen token's
 *     log-probability within 1e-5; rows the GPU hands back (status 1) are
 *     counted and must be the documented cases only;
 *   - the multi-block path (rows without penalties: greedy, a plain draw,
 *     top-k whose slices' union fits, with top-p / min-p after it)
 *     against the one-block kernel (PETREL_CUDA_SAMPLE_MB=0) bit for bit
 *     on every row above, and edge cases: equal maxima across its slice
 *     boundaries, NaN / -inf, huge equal maxima, nothing finite, all-tie rows, up to
 *     16 rows per launch over vocabularies from 50 to 262144;
 *   - the draw: a session sampling on the GPU consumes the session's RNG
 *     stream exactly as the host sampler does (same tokens over a run);
 *   - sessions on a model: pt_generate with --gpu-sampling on vs off on the
 *     same CUDA model (greedy and seeded sampling with penalties, compiled
 *     decode on and off), greedy CUDA vs CPU on the demo model, and the
 *     batched step's rows sampled on the GPU vs the host.
 * Not the speed (petrel bench, bench/RESULTS.md). */
#include "test.h"
#include "test_rand.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/sample.h"
#include "base/error.h"
#include "base/mmap.h"
#include "petrel.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>



static pt_backend *gb;

static int gsetup(void) {
    if (gb) return 1;
    char why[512];
    if (pt_cuda_device_count(why, sizeof why) == 0) {
        printf("INFO no GPU: %s\n", why);
        return 0;
    }
    pt_cuda_params gp = {0, PT_ACT_F32};
    if (pt_backend_cuda_create(&gb, &gp) != PT_OK) {
        printf("INFO cuda backend: %s\n", pt_last_error());
        return 0;
    }
    return 1;
}
#define NEED_GSETUP()                                         \
    do {                                                      \
        if (!gsetup()) {                                      \
            TEST_SKIP("no usable CUDA device");               \
            return;                                           \
        }                                                     \
    } while (0)

static float gauss(void) {
    float u = rf(1e-6f, 1.0f), v = rf(0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* A random logit row of one of several shapes. */
static void make_logits(float *lg, int V, int shape) {
    for (int i = 0; i < V; i++) {
        switch (shape) {
        case 0: lg[i] = gauss(); break;                          /* flat-ish */
        case 1: lg[i] = 4.0f * gauss(); break;                   /* peaked */
        case 2: lg[i] = roundf(2.0f * gauss()) * 0.5f; break;    /* many exact ties */
        default: lg[i] = 8.0f * gauss() - 5.0f; break;           /* very peaked */
        }
    }
    if (shape == 2 || shape == 3) /* a few -inf (masked) and one NaN */
        for (int k = 0; k < V / 50 + 1; k++) lg[ru32() % V] = -INFINITY;
    if (shape == 3) lg[ru32() % V] = NAN;
    if (shape == 4) {
        /* equal maxima on both sides of the multi-block sampler's slice
         * boundaries (2048 entries for these vocabularies), NaN and -inf
         * before them */
        static const int at[] = {2047, 2048, 4095, 4096, 6143, 6144};
        for (int k = 0; k < 6; k++)
            if (at[k] < V) lg[at[k]] = 9.0f;
        lg[V - 1] = 9.0f;
        lg[0] = NAN;
        if (V > 2) lg[1] = -NAN;
        if (V > 3) lg[2] = -INFINITY;
    }
    if (shape == 5) /* nothing finite: -inf and NaN only */
        for (int i = 0; i < V; i++) lg[i] = ru32() % 7 ? -INFINITY : NAN;
    if (shape == 6) { /* two equal huge maxima (the first wins a greedy row) and a +0 / -0 pair */
        lg[V / 3] = 1e30f;
        lg[V - 1 - V / 5] = 1e30f;
        lg[V / 2] = -0.0f;
        lg[V / 2 + 1] = 0.0f;
    }
    if (shape == 7) /* signed zeros only: every token ties */
        for (int i = 0; i < V; i++) lg[i] = ru32() % 2 ? 0.0f : -0.0f;
}

/* run_rows' shapes cycle through 0 .. n_shapes - 1 (4..7: edge cases) */
static int n_shapes = 4;

typedef struct {
    float temp, top_p, min_p, rep, pres, freq;
    int top_k, last_n;
} pcase;

static pt_sampling_params to_sp(const pcase *c) {
    pt_sampling_params sp = {0};
    sp.temperature = c->temp;
    sp.top_k = c->top_k;
    sp.top_p = c->top_p;
    sp.min_p = c->min_p;
    sp.repetition_penalty = c->rep;
    sp.presence_penalty = c->pres;
    sp.frequency_penalty = c->freq;
    sp.repeat_last_n = c->last_n;
    sp.seed = 7;
    return sp;
}

static int n_cases_run, n_fallback, n_mismatch, n_ab;
static double worst_lp;
/* run_rows' rows that ask for no log-probability (pt_sampling_params.no_logprob): 0 none, 1 the odd rows, 2
 * every row */
static int no_lp_rows;
static int row_no_lp(int b) { return no_lp_rows == 2 || (no_lp_rows == 1 && b % 2 == 1); }

/* Samples B rows in one launch and compares each with the CPU sampler. */
enum { MAXB = 16 };
static void run_rows(int V, int B, const pcase *cs, int shape_base) {
    float *lg = malloc((size_t)V * B * 4);
    static int32_t hist[MAXB][300];
    int nh[MAXB];
    pt_gsample_row rows[MAXB];
    pt_gsample_out outs[MAXB];
    double us[MAXB];
    float *d_lg = put(gb, NULL, (size_t)V * B * 4);
    float *d_work = put(gb, NULL, (size_t)V * B * 4);
    uint32_t *d_cnt = put(gb, NULL, (size_t)V * B * 4);
    int32_t *d_hist = put(gb, NULL, (size_t)B * 300 * 4);
    void *ctl = put(gb, NULL, pt_gsample_ctl_bytes(B));
    REQUIRE(d_lg && d_work && d_cnt && d_hist && ctl, "device buffers: %s", pt_last_error());
    memset(rows, 0, sizeof rows);
    for (int b = 0; b < B; b++) {
        make_logits(lg + (size_t)b * V, V, (shape_base + b) % n_shapes);
        nh[b] = 1 + (int)(ru32() % 300);
        /* ids from a small set (repeats), some the row's top tokens */
        for (int i = 0; i < nh[b]; i++) hist[b][i] = (int32_t)(ru32() % (uint32_t)(V < 60 ? V : 60));
        us[b] = (double)(ru32() & 0xffffff) / 16777216.0;
        const pcase *c = &cs[b];
        pt_sampling_params sp = to_sp(c);
        rows[b].logits = d_lg + (size_t)b * V;
        rows[b].work = d_work + (size_t)b * V;
        rows[b].counts = d_cnt + (size_t)b * V;
        rows[b].hist = d_hist + (size_t)b * 300;
        rows[b].n_hist = nh[b];
        if (sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
            rows[b].window = sp.repeat_last_n > 0 && sp.repeat_last_n < nh[b] ? sp.repeat_last_n : nh[b];
        rows[b].u = us[b];
        rows[b].temperature = sp.temperature;
        rows[b].top_p = sp.top_p;
        rows[b].min_p = sp.min_p;
        rows[b].rep = sp.repetition_penalty;
        rows[b].presence = sp.presence_penalty;
        rows[b].frequency = sp.frequency_penalty;
        rows[b].top_k = sp.top_k;
        rows[b].greedy = pt_sampling_is_greedy(&sp);
        rows[b].want_logprob = !row_no_lp(b);
    }
    pt_status st = gb->ops->upload(gb, d_lg, lg, (size_t)V * B * 4);
    if (st == PT_OK) st = gb->ops->upload(gb, d_hist, hist, (size_t)B * 300 * 4);
    if (st == PT_OK) st = pt_cuda_sample_rows(gb, rows, B, V, ctl, 0, outs);
    REQUIRE(st == PT_OK, "sample_rows: %s", pt_last_error());
    /* the same launch with every row through the one-block kernel
     * (PETREL_CUDA_SAMPLE_MB=0): the same results, bit for bit */
    pt_gsample_out outs1[MAXB];
    setenv("PETREL_CUDA_SAMPLE_MB", "0", 1);
    st = pt_cuda_sample_rows(gb, rows, B, V, ctl, 0, outs1);
    unsetenv("PETREL_CUDA_SAMPLE_MB");
    REQUIRE(st == PT_OK, "sample_rows (one block per row): %s", pt_last_error());
    for (int b = 0; b < B; b++) {
        n_ab++;
        if (outs[b].status != outs1[b].status) {
            /* the one case the multi-block path hands back where the one
             * block decides: top-k keeping every candidate, then top-p */
            CHECK(outs[b].status == 1 && cs[b].top_k > 0 && cs[b].top_p < 1.0f,
                  "V %d row %d: multi-block status %d, one block status %d (top_k %d top_p %g)", V, b,
                  outs[b].status, outs1[b].status, cs[b].top_k, cs[b].top_p);
            continue;
        }
        CHECK(!memcmp(&outs[b], &outs1[b], sizeof outs[b]),
              "V %d row %d shape %d: multi-block id %d status %d logprob %.9g vs one block id %d status %d "
              "logprob %.9g",
              V, b, (shape_base + b) % n_shapes, outs[b].id, outs[b].status, outs[b].logprob, outs1[b].id,
              outs1[b].status, outs1[b].logprob);
    }
    pt_sampler cpu;
    REQUIRE(pt_sampler_init(&cpu, V) == PT_OK, "sampler init");
    for (int b = 0; b < B; b++) {
        pt_sampling_params sp = to_sp(&cs[b]);
        sp.no_logprob = row_no_lp(b);
        pt_token_info ti;
        pt_status cs_ = pt_sampler_sample_u(&cpu, lg + (size_t)b * V, &sp, hist[b], (size_t)nh[b], NULL,
                                            rows[b].greedy ? -1.0 : us[b], &ti);
        n_cases_run++;
        if (outs[b].status != 0) {
            n_fallback++;
            /* handed back: only top-k above the cap, a nucleus beyond it, or no finite logit */
            CHECK((cs[b].top_k > PT_GSAMPLE_CAP && !rows[b].greedy) || cs[b].top_p < 1.0f || cs_ != PT_OK,
                  "V %d row %d: status %d for a case the GPU must decide (top_k %d top_p %g)", V, b, outs[b].status,
                  cs[b].top_k, cs[b].top_p);
            continue;
        }
        CHECK(cs_ == PT_OK, "cpu: %s", pt_last_error());
        if (outs[b].id != ti.id) {
            n_mismatch++;
            CHECK(0,
                  "V %d row %d shape %d: gpu %d vs cpu %d (T %g top_k %d top_p %g min_p %g rep %g pres %g freq %g "
                  "last_n %d u %.17g)",
                  V, b, (shape_base + b) % n_shapes, outs[b].id, ti.id, cs[b].temp, cs[b].top_k, cs[b].top_p, cs[b].min_p,
                  cs[b].rep, cs[b].pres, cs[b].freq, cs[b].last_n, us[b]);
        }
        if (row_no_lp(b)) { /* not asked for: 0 from both samplers, the id as with it (checked above) */
            CHECK(outs[b].logprob == 0.0f && ti.logprob == 0.0f, "V %d row %d: no log-probability asked for, "
                  "gpu %.9g cpu %.9g", V, b, outs[b].logprob, ti.logprob);
            continue;
        }
        if (isnan(outs[b].logprob) && isnan(ti.logprob)) continue; /* no finite max: NaN on both */
        double d = fabs((double)outs[b].logprob - (double)ti.logprob);
        if (d > worst_lp) worst_lp = d;
        CHECK(d <= 1e-5 * (1 + fabs(ti.logprob)), "V %d row %d: logprob gpu %.9g cpu %.9g", V, b, outs[b].logprob,
              ti.logprob);
    }
    /* the counts must be zero again (the next penalised launch relies on it) */
    uint32_t *cnt = malloc((size_t)V * B * 4);
    REQUIRE(gb->ops->download(gb, cnt, d_cnt, (size_t)V * B * 4) == PT_OK, "download");
    int64_t nz = 0;
    for (int64_t i = 0; i < (int64_t)V * B; i++) nz += cnt[i] != 0;
    CHECK(nz == 0, "%lld penalty counts left non-zero", (long long)nz);
    free(cnt);
    pt_sampler_free(&cpu);
    gb->ops->dealloc(gb, d_lg);
    gb->ops->dealloc(gb, d_work);
    gb->ops->dealloc(gb, d_cnt);
    gb->ops->dealloc(gb, d_hist);
    gb->ops->dealloc(gb, ctl);
    free(lg);
}

static const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
static const int topks[] = {0, 1, 7, 40, 1000, 4096, 5000};
static const float topps[] = {1.0f, 0.95f, 0.7f, 0.2f};
static const float minps[] = {0.0f, 0.05f, 0.3f};

static pcase random_case(void) {
    pcase c;
    c.temp = temps[ru32() % 5];
    c.top_k = topks[ru32() % 7];
    c.top_p = topps[ru32() % 4];
    c.min_p = minps[ru32() % 3];
    int pen = ru32() % 4;
    c.rep = pen & 1 ? 1.3f : 1.0f;
    c.pres = pen & 2 ? 0.5f : 0.0f;
    c.freq = pen == 3 ? 0.25f : 0.0f;
    c.last_n = ru32() % 2 ? 64 : 0;
    return c;
}

/* Every combination once on a mid-size vocabulary, one row per launch. */
static void test_all_combinations(void) {
    NEED_GSETUP();
    for (int t = 0; t < 5; t++)
        for (int k = 0; k < 7; k++)
            for (int p = 0; p < 4; p++)
                for (int mp = 0; mp < 3; mp++)
                    for (int pen = 0; pen < 4; pen++) {
                        pcase c = {temps[t], topps[p], minps[mp], pen & 1 ? 1.3f : 1.0f, pen & 2 ? 0.5f : 0.0f,
                                   pen == 3 ? 0.25f : 0.0f, topks[k], pen ? (pen & 1 ? 64 : 0) : 64};
                        run_rows(8192 + 3, 1, &c, t + k + p + mp + pen);
                    }
    printf("MEASURE gsample combinations: %d rows, %d handed back to the host, %d mismatches, worst |dlogprob| %.3g\n",
           n_cases_run, n_fallback, n_mismatch, worst_lp);
}

/* Random parameter sets over several vocabularies, many rows per launch. */
static void test_random_rows(void) {
    NEED_GSETUP();
    static const int Vs[] = {50, 1000, 32000, 128256, 151936};
    n_cases_run = n_fallback = n_mismatch = 0;
    for (int vi = 0; vi < 5; vi++)
        for (int rep = 0; rep < 6; rep++) {
            enum { B = 12 };
            pcase cs[B];
            for (int b = 0; b < B; b++) cs[b] = random_case();
            run_rows(Vs[vi], B, cs, rep);
        }
    printf("MEASURE gsample random batches: %d rows, %d handed back, %d mismatches, worst |dlogprob| %.3g\n",
           n_cases_run, n_fallback, n_mismatch, worst_lp);
}

/* The multi-block sampler's edge cases (shapes 4..7: ties across its slice
 * boundaries, NaN / -inf, huge equal maxima, nothing finite, all ties) and batches of
 * up to 16 rows mixing its rows with the one-block kernel's, on the
 * vocabularies of the model families: against the CPU sampler and against
 * PETREL_CUDA_SAMPLE_MB=0. */
static void test_multiblock_edges(void) {
    NEED_GSETUP();
    static const int Vs[] = {50, 2049, 6145, 32000, 128256, 151936, 262144};
    n_cases_run = n_fallback = n_mismatch = n_ab = 0;
    n_shapes = 8;
    for (int vi = 0; vi < 7; vi++)
        for (int rep = 0; rep < 4; rep++) {
            enum { B = 16 };
            pcase cs[B];
            for (int b = 0; b < B; b++) {
                cs[b] = random_case();
                if (b % 2 == 0) { /* the multi-block path's rows: no penalties; greedy, a plain draw, top-k */
                    static const int ks[] = {0, 1, 40, 64, 256, 20};
                    cs[b].rep = 1.0f;
                    cs[b].pres = cs[b].freq = 0.0f;
                    cs[b].top_k = ks[(b / 2 + rep) % 6];
                    if (cs[b].top_k == 0) cs[b].top_p = 1.0f;
                }
            }
            run_rows(Vs[vi], rep % 2 ? B : 1 + rep, cs, 4 + rep);
        }
    n_shapes = 4;
    printf("MEASURE gsample multi-block edges: %d rows, %d handed back, %d mismatches, %d compared with one block\n",
           n_cases_run, n_fallback, n_mismatch, n_ab);
}

static pt_model *load_model(const char *dir, pt_device dev, int gpu_sampling, int compiled) {
    pt_model_params mp = pt_model_default_params();
    mp.device = dev;
    if (dev == PT_DEVICE_CPU || compiled == 2) mp.dtype = PT_COMPUTE_F32; /* the cpu vs cuda comparison */
    mp.n_threads = 2;
    mp.gpu_sampling = gpu_sampling ? PT_LEVER_ON : PT_LEVER_OFF;
    mp.compiled_decode = compiled ? PT_LEVER_ON : PT_LEVER_OFF; /* 2: on, f32 */
    pt_model *m = NULL;
    pt_status s = pt_model_load(dir, &mp, &m);
    CHECK(s == PT_OK, "%s: %s", dir, pt_last_error());
    return m;
}

typedef struct {
    int32_t ids[64];
    int n;
} toks;
static int collect(void *user, const pt_token_info *ti, const char *text, size_t len) {
    (void)text, (void)len;
    toks *t = user;
    if (ti->id >= 0 && t->n < 64) t->ids[t->n++] = ti->id;
    return 0;
}

static void gen(pt_model *m, const pt_sampling_params *sp, toks *out) {
    pt_session *s = NULL;
    int32_t prompt[20];
    const int V = pt_model_vocab_size(m);
    for (int i = 0; i < 20; i++) prompt[i] = (int32_t)((5 + i * 13) % V);
    memset(out, 0, sizeof *out);
    pt_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = 40;
    gp.sampling = *sp;
    pt_status st = pt_session_create(m, NULL, &s);
    if (st == PT_OK) st = pt_generate(s, prompt, 20, &gp, collect, out, NULL, NULL);
    CHECK(st == PT_OK, "generate: %s", pt_last_error());
    pt_session_free(&s);
}

/* pt_generate on one CUDA model with GPU sampling on and off: identical
 * tokens (the same draws from the same stream), greedy and sampled, with
 * compiled decode on and off; greedy CUDA == CPU on the demo model. */
static void test_generate_on_off(void) {
    NEED_GSETUP();
    static const char *dirs[] = {"models/kjv-llama-4bit", "tests/fixtures/llama"};
    for (int d = 0; d < 2; d++) {
        const char *dir = dirs[d];
        if (!pt_is_dir(dir)) {
            printf("INFO %s absent, skipped\n", dir);
            continue;
        }
        for (int compiled = 0; compiled < 2; compiled++) {
            pt_model *on = load_model(dir, PT_DEVICE_CUDA, 1, compiled), *off = load_model(dir, PT_DEVICE_CUDA, 0, compiled);
            if (!on || !off) {
                pt_model_free(&on), pt_model_free(&off);
                continue;
            }
            pt_sampling_params sps[4];
            for (int k = 0; k < 4; k++) {
                memset(&sps[k], 0, sizeof sps[k]);
                sps[k].top_p = 1.0f;
                sps[k].repetition_penalty = 1.0f;
                sps[k].repeat_last_n = 64;
                sps[k].seed = 42 + (uint64_t)k;
            }
            sps[1].temperature = 0.9f, sps[1].top_p = 0.9f, sps[1].top_k = 40;
            sps[2].temperature = 1.2f, sps[2].min_p = 0.02f, sps[2].repetition_penalty = 1.2f,
            sps[2].presence_penalty = 0.3f, sps[2].frequency_penalty = 0.2f;
            sps[3].temperature = 0.7f, sps[3].repeat_last_n = 0, sps[3].repetition_penalty = 1.1f;
            for (int k = 0; k < 4; k++) {
                toks a, b;
                gen(on, &sps[k], &a);
                gen(off, &sps[k], &b);
                int same = a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * 4);
                CHECK(same, "%s compiled %d params %d: gpu sampling on/off differ (%d vs %d tokens)", dir, compiled,
                      k, a.n, b.n);
                if (same) printf("INFO %s compiled-decode %d params %d: %d tokens identical on/off\n", dir, compiled, k, a.n);
            }
            if (d == 0 && compiled) {
                /* in f32 (bf16 logits differ between the devices in the last bits) */
                pt_model *cpu = load_model(dir, PT_DEVICE_CPU, 0, 1), *g32 = load_model(dir, PT_DEVICE_CUDA, 1, 2);
                if (cpu && g32) {
                    toks a, b;
                    gen(g32, &sps[0], &a);
                    gen(cpu, &sps[0], &b);
                    int same = 0;
                    while (same < a.n && same < b.n && a.ids[same] == b.ids[same]) same++;
                    printf("INFO %s f32 greedy cuda (gpu sampling) vs cpu: %d of %d tokens identical\n", dir, same, a.n);
                    CHECK(same == a.n && a.n == b.n, "%s: f32 greedy cuda vs cpu differ at %d", dir, same);
                }
                pt_model_free(&cpu);
                pt_model_free(&g32);
            }
            pt_model_free(&on);
            pt_model_free(&off);
        }
    }
}

/* The batched step: rows left on the device and sampled on the GPU equal
 * the host path's tokens (continuous batching with GPU sampling). */
static void test_batch_sessions(void) {
    NEED_GSETUP();
    const char *dir = "tests/fixtures/llama";
    if (!pt_is_dir(dir)) {
        printf("INFO %s absent, skipped\n", dir);
        return;
    }
    pt_model *ms[2] = {load_model(dir, PT_DEVICE_CUDA, 1, 1), load_model(dir, PT_DEVICE_CUDA, 0, 1)};
    int32_t got[2][3][12];
    int n_batched = 0;
    for (int g = 0; g < 2 && ms[0] && ms[1]; g++) {
        pt_session *ss[3] = {0};
        const int V = pt_model_vocab_size(ms[g]);
        pt_sampling_params sp;
        memset(&sp, 0, sizeof sp);
        sp.temperature = 0.8f, sp.top_p = 0.95f, sp.repetition_penalty = 1.1f, sp.repeat_last_n = 64, sp.seed = 9;
        pt_status st = PT_OK;
        for (int i = 0; i < 3 && st == PT_OK; i++) {
            int32_t pr[5];
            for (int j = 0; j < 5; j++) pr[j] = (int32_t)((7 + i * 31 + j * 5) % V);
            st = pt_session_create(ms[g], NULL, &ss[i]);
            if (st == PT_OK) st = pt_session_prompt(ss[i], pr, 5);
        }
        pt_sampling_params sps3[3];
        const pt_sampling_params *spp[3];
        for (int i = 0; i < 3; i++) {
            sps3[i] = sp;
            sps3[i].seed = 9 + (uint64_t)i;
            spp[i] = &sps3[i];
        }
        sps3[1].temperature = 0; /* a greedy row among sampled ones */
        sps3[2].top_k = 5;
        for (int step = 0; step < 12 && st == PT_OK; step++) {
            int32_t ids[3];
            pt_token_info tis[3];
            pt_status sts[3];
            static char errs[3][512];
            uint8_t done[3] = {0};
            /* gpu on: the three rows in one call (the server's turn: one
             * launch once the batch state exists, before it each row through
             * its session's table); off: one by one on the host */
            if (g == 0) {
                pt_session_sample_gpu_rows(ss, spp, tis, sts, errs, done, 3);
                for (int i = 0; i < 3; i++) CHECK(done[i] && sts[i] == PT_OK, "row %d not sampled: %s", i, errs[i]);
                n_batched += done[0] + done[1] + done[2];
            }
            for (int i = 0; i < 3 && st == PT_OK; i++) {
                if (!done[i]) st = pt_session_sample(ss[i], spp[i], NULL, &tis[i]);
                ids[i] = got[g][i][step] = tis[i].id;
            }
            if (st == PT_OK) st = pt_session_decode_batch(ss, ids, 3);
        }
        CHECK(st == PT_OK, "batch: %s", pt_last_error());
        for (int i = 0; i < 3; i++) pt_session_free(&ss[i]);
    }
    if (ms[0] && ms[1]) {
        CHECK(!memcmp(got[0], got[1], sizeof got[0]), "batched sessions: gpu sampling on/off differ");
        CHECK(n_batched == 36, "rows sampled in batched calls: %d of 36", n_batched);
        printf("INFO batched sessions: %d rows sampled in 12 three-row calls, tokens equal to the host path\n",
               n_batched);
    }
    pt_model_free(&ms[0]);
    pt_model_free(&ms[1]);
}

/* Rows that ask for no log-probability: the same ids as the CPU sampler's (which skips its log-sum-exp
 * too) and as the one-block kernel's, logprob 0; every row greedy (the multi-block path runs no pass 2),
 * or mixed with draws and rows that want one, on the multi-block vocabularies. */
static void test_no_logprob(void) {
    NEED_GSETUP();
    static const int Vs[] = {2049, 32000, 128256, 151936};
    n_cases_run = n_fallback = n_mismatch = 0;
    for (int vi = 0; vi < 4; vi++)
        for (int rep = 0; rep < 4; rep++) {
            enum { B = 12 };
            pcase cs[B];
            for (int b = 0; b < B; b++) {
                cs[b] = random_case();
                if (rep < 2) { /* all greedy, no penalties (the multi-block path) */
                    cs[b].temp = 0.0f;
                    cs[b].rep = 1.0f;
                    cs[b].pres = cs[b].freq = 0.0f;
                }
            }
            no_lp_rows = rep % 2 ? 1 : 2;
            run_rows(Vs[vi], B, cs, rep);
        }
    no_lp_rows = 0;
    CHECK(n_cases_run == 4 * 4 * 12, "%d rows compared", n_cases_run);
    printf("MEASURE gsample without log-probabilities: %d rows, %d handed back, %d mismatches\n", n_cases_run,
           n_fallback, n_mismatch);
}

int main(void) {
    TEST_RUN(test_all_combinations);
    TEST_RUN(test_random_rows);
    TEST_RUN(test_multiblock_edges);
    TEST_RUN(test_no_logprob);
    TEST_RUN(test_generate_on_off);
    TEST_RUN(test_batch_sessions);
    if (gb) pt_backend_free(&gb);
    return test_summary();
}
