/* petrel bench: prompt processing (pp) and token generation (tg) speed, on a
 * model directory or a synthetic model of a published shape, with the
 * achieved bandwidth against the machine's measured read bandwidth.
 *
 * Method (llama-bench's): a pp test prefills `depth` tokens untimed, then
 * times prefilling n_prompt random tokens; a tg test prefills `depth` tokens
 * untimed, then times n_gen single-token decode steps (each step runs the
 * whole model and the lm_head and samples greedily, as generation does —
 * on the GPU with --gpu-sampling on, pipelined on CUDA unless
 * PETREL_CUDA_PIPELINE=0 — then feeds the sampled id back). Each test
 * runs -r times after one untimed warm-up; a repetition's clock stops when
 * the device has finished its work (pt_session_sync: on CUDA a prefill and
 * the pipelined last decode step return once enqueued); tokens/s is reported
 * as the mean, standard deviation and median over the repetitions.
 *
 * gbps = bytes a step must read / time: for tg, the weights one decode step
 * reads (MoE: the active experts' share) plus the KV cache at the average
 * depth; for pp, the weights once per forward chunk plus the cache. bw_fraction
 * = gbps / the read bandwidth measured here (a >= 2 GiB streaming read with
 * the same number of threads). The KV bytes count what attention reads: each
 * attending layer (KV-shared layers re-read their donor's cache) over its
 * window, at the cache's storage width (bf16 rows, or codes plus bf16 scales
 * and biases when quantized).
 *
 * tflops (pp rows on CUDA) = FLOPs a prompt token costs (pp_flops_per_token:
 * 2 per linear weight the token passes, attention's QKᵀ and p·V at the
 * token's mean causal depth) × tokens/s; mma_fraction = tflops / the bf16
 * tensor-core rate measured here (a cuBLAS --mma-n³ bf16 GEMM).
 *
 * --kv-ab runs several KV-cache configurations as one paired A/B: one session
 * per cache mode, each filled to the depth by its own prefill (configurations
 * that differ only in --fused-decode-attn share a session: prefill never uses
 * the fused kernel, so their caches would be filled identically), and every
 * repetition of a test runs once per configuration in turn (A B C A B C ...),
 * so machine noise lands on all of them alike. */
#include "backend/cuda/cuda.h"
#include "cli/args.h"
#include "cli/cli.h"

#include "base/error.h"
#include "base/threadpool.h"
#include "model/model.h"
#include "runtime/bandwidth.h"
#include "runtime/kv_cache.h"
#include "runtime/session.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: petrel bench (-m DIR | --synthetic NAME --quant q4|q8|bf16) [options]\n\n"
            "Measures prompt processing (pp) and token generation (tg) tokens/s.\n\n"
            "  --synthetic NAME     a published shape with random weights: %s\n"
            "  --quant q4|q8|bf16   weights of the synthetic model (MLX affine, group 64, or bf16)\n"
            "  -p N[,N...]          prompt lengths for pp tests (default 512; 0 = none)\n"
            "  -n N[,N...]          generated tokens for tg tests (default 128; 0 = none)\n"
            "  -d N[,N...]          context depth before each test (default 0)\n"
            "  -r N                 repetitions per test (default 5); the median is reported too\n"
            "  --bw-gib N           size of the bandwidth measurement buffer in GiB (default 2; 0 skips\n"
            "                       the measurement and reports bw_fraction 0)\n"
            "  --bw-interleave      on the CPU: keep the bandwidth buffer and take one read pass after\n"
            "                       every timed repetition; each row's 'of BW' is then against the\n"
            "                       median of its own passes (column 'read GB/s'), the bandwidth while\n"
            "                       that row ran, which on a shared host moves from minute to minute\n"
            "                       (holds --bw-gib GiB of memory for the whole run)\n"
            "  --mma-n N            on CUDA: size of the square bf16 cuBLAS GEMM (N×N×N) whose measured\n"
            "                       rate pp rows report a fraction of (default 8192; 0 skips it); pp rows\n"
            "                       gain TFLOP/s (FLOPs per prompt token × t/s) and 'of MMA'\n"
            "  --kv-ab LIST         paired A/B of KV-cache configurations in one run, e.g.\n"
            "                       off,8,4,4+fused: each item a --kv-quant value, '+fused' adding\n"
            "                       --fused-decode-attn on; one session per cache mode, each filled by\n"
            "                       its own prefill; the repetitions of every test alternate between\n"
            "                       the configurations (pp rows skip '+fused' items: prefill does not\n"
            "                       use the fused kernel)\n"
            "  --json               stdout holds only a JSON array, one row per test, with\n"
            "                       llama-bench's keys (n_prompt, n_gen, n_depth, avg_ts, stddev_ts)\n"
            "                       plus median_ts, samples_ts, gbps, bw_fraction and kv (on CUDA also\n"
            "                       tflops, mma_fraction and mma_measured_tflops; 0 on tg rows; with\n"
            "                       --bw-interleave also bw_row_gbps and bw_samples_gbps)\n"
            "  -h, --help           this help\n\n"
            "A tg step samples greedily and feeds the sampled id back; on CUDA the loop is pipelined\n"
            "(the next step enqueued before the host reads the id) unless PETREL_CUDA_PIPELINE=0.\n",
            pt_synthetic_names());
    cli_common_help(f);
}

#define MAX_LIST 16

static int parse_list(const char *cmd, const char *flag, const char *s, int *out, int *n) {
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_LIST) {
            fprintf(stderr, "petrel %s: %s: at most %d values\n", cmd, flag, MAX_LIST);
            return 0;
        }
        if (!cli_parse_int(cmd, flag, tok, 0, 1 << 24, &out[(*n)++])) return 0;
    }
    if (*n == 0) {
        fprintf(stderr, "petrel %s: %s: no value\n", cmd, flag);
        return 0;
    }
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng_state = 88172645463325252ull;
static int32_t rand_id(int vocab) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (int32_t)(rng_state % (uint64_t)vocab);
}

/* Prefills the session to exactly `depth` random tokens (reusing what it
 * holds). A fill of 256 tokens or more is timed and reported on stderr as
 * "fill" (label: the session's KV configuration): one sample of prefill
 * speed over the whole context, which the depth tests pay for anyway. */
static pt_status to_depth(pt_session *s, int depth, int32_t *buf, int vocab, const char *label) {
    if ((int)pt_session_n_tokens(s) > depth) PT_TRY(pt_session_truncate(s, 0));
    int have = (int)pt_session_n_tokens(s);
    if (have == depth) return PT_OK;
    for (int i = 0; i < depth - have; i++) buf[i] = rand_id(vocab);
    double t0 = now_s();
    PT_TRY(pt_session_prompt(s, buf, (size_t)(depth - have)));
    double dt = now_s() - t0;
    if (depth - have >= 256)
        fprintf(stderr, "fill%s%s: %d tokens (depth %d -> %d) in %.1f s = %.2f t/s\n", label && *label ? " KV " : "",
                label ? label : "", depth - have, have, depth, dt, (depth - have) / dt);
    return PT_OK;
}

typedef struct {
    int n_prompt, n_gen, n_depth, reps;
    double *samples;
    double avg, stddev, median, gbps, bw_fraction, tflops, mma_fraction;
    double *bw_samples; /* --bw-interleave: the read pass after each repetition (GB/s) */
    double bw_row;      /* and their median */
} row;

/* Repetition `rep` of test r (rep -1: the warm-up, not recorded). */
static pt_status run_rep(pt_session *s, row *r, int rep, int32_t *buf, int vocab, const char *label) {
    PT_TRY(to_depth(s, r->n_depth, buf, vocab, label));
    double t0, dt;
    if (r->n_prompt > 0) {
        for (int i = 0; i < r->n_prompt; i++) buf[i] = rand_id(vocab);
        t0 = now_s();
        PT_TRY(pt_session_prompt(s, buf, (size_t)r->n_prompt));
        PT_TRY(pt_session_sync(s)); /* on CUDA the prefill returns once enqueued */
        dt = now_s() - t0;
        if (rep >= 0) r->samples[rep] = r->n_prompt / dt;
    } else {
        /* the decode steps start from a context of depth + 1 tokens; each
         * step samples greedily and feeds the sampled id back, as generation
         * does (on the GPU with --gpu-sampling on, else on the host; on CUDA
         * pipelined unless PETREL_CUDA_PIPELINE=0: the step on the sampled
         * id is enqueued before the host reads it) */
        int32_t id = rand_id(vocab);
        PT_TRY(pt_session_prompt(s, &id, 1));
        pt_sampling_params greedy = pt_sampling_default_params(NULL);
        greedy.temperature = 0;
        greedy.no_logprob = 1; /* as generation without logprobs: no log-sum-exp over the vocabulary */
        pt_token_info ti;
        t0 = now_s();
        for (int i = 0; i < r->n_gen; i++) {
            PT_TRY(pt_session_sample_ahead(s, &greedy, &ti));
            PT_TRY(pt_session_prompt(s, &ti.id, 1));
        }
        PT_TRY(pt_session_sync(s)); /* the last step, enqueued ahead, has run */
        dt = now_s() - t0;
        if (rep >= 0) r->samples[rep] = r->n_gen / dt;
    }
    return pt_session_truncate(s, (size_t)r->n_depth);
}

/* The median of n > 0 values (v unchanged). */
static pt_status median_of(const double *v, int n, double *out) {
    double *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return PT_ERR_NOMEM;
    memcpy(sorted, v, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_d);
    *out = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    free(sorted);
    return PT_OK;
}

static pt_status row_stats(row *r) {
    double sum = 0, sq = 0;
    for (int i = 0; i < r->reps; i++) sum += r->samples[i];
    r->avg = sum / r->reps;
    for (int i = 0; i < r->reps; i++) sq += (r->samples[i] - r->avg) * (r->samples[i] - r->avg);
    r->stddev = r->reps > 1 ? sqrt(sq / (r->reps - 1)) : 0;
    PT_TRY(median_of(r->samples, r->reps, &r->median));
    if (r->bw_samples) PT_TRY(median_of(r->bw_samples, r->reps, &r->bw_row));
    return PT_OK;
}

/* A KV-cache configuration of --kv-ab: the cache mode (--kv-quant value),
 * whether decode uses the fused kernel, and the session serving it. */
#define MAX_KV_CFG 8
typedef struct {
    int kv_quant, fused, sess;
    char name[24];
} kv_cfg;

static int parse_kv_ab(const char *cmd, const char *v, kv_cfg *cfg, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_KV_CFG) {
            fprintf(stderr, "petrel %s: --kv-ab: at most %d configurations\n", cmd, MAX_KV_CFG);
            return 0;
        }
        kv_cfg *c = &cfg[(*n)++];
        memset(c, 0, sizeof *c);
        char *plus = strchr(tok, '+');
        if (plus) {
            if (strcmp(plus, "+fused")) {
                fprintf(stderr, "petrel %s: --kv-ab: '%s': expected off|4|8|config, optionally followed by +fused\n",
                        cmd, tok);
                return 0;
            }
            *plus = 0;
            c->fused = 1;
        }
        if (!strcmp(tok, "off")) c->kv_quant = 0;
        else if (!strcmp(tok, "4") || !strcmp(tok, "8")) c->kv_quant = atoi(tok);
        else if (!strcmp(tok, "config")) c->kv_quant = PT_KV_QUANT_CONFIG;
        else {
            fprintf(stderr, "petrel %s: --kv-ab: '%s': expected off|4|8|config, optionally followed by +fused\n", cmd,
                    tok);
            return 0;
        }
        snprintf(c->name, sizeof c->name, "%s%s", tok, c->fused ? "+fused" : "");
    }
    if (*n == 0) {
        fprintf(stderr, "petrel %s: --kv-ab: no configuration\n", cmd);
        return 0;
    }
    return 1;
}

/* Bytes one attention pass reads from the KV caches with `ctx` positions in
 * the context: every attending layer over min(ctx, window) rows of its (or
 * its donor's) cache, K and V, at the storage width of m's current
 * --kv-quant (pt_kv_layer_quant). */
static double kv_read_bytes(const pt_model *m, double ctx) {
    const pt_net *n = &m->net;
    double b = 0;
    for (int l = 0; l < n->n_layers; l++) {
        const pt_layer *L = &n->layers[l];
        if (L->is_linear) continue; /* DeltaNet state: no KV cache */
        const int src = L->kv_shared ? L->kv_src : l;
        const pt_layer *S = &n->layers[src];
        int bits, gs;
        pt_kv_layer_quant(m, src, &bits, &gs);
        double row = bits ? (double)S->head_dim * bits / 8 + 2.0 * (S->head_dim / gs) * pt_ftype_size(n->kv_dtype)
                          : (double)S->head_dim * pt_ftype_size(n->kv_dtype);
        double rows = L->attn.window > 0 && L->attn.window < ctx ? L->attn.window : ctx;
        b += 2.0 * S->n_kv * row * rows;
    }
    return b;
}

/* Multiply-adds of one row through w, as FLOPs (2 per weight; a stack of
 * experts counts all of them: the caller scales by the active share). */
static double mat_flops(const pt_matrix *w) {
    return 2.0 * (double)w->rows * (double)w->cols * (double)(w->n_experts > 1 ? w->n_experts : 1);
}

/* FLOPs per prompt token of a pp test: n_prompt tokens after `depth`, in
 * chunks of `chunk`. Every linear layer the token passes (MoE: the top-k
 * experts' share; no embedding lookup; the lm_head once per chunk, for its
 * last row), plus attention: QKᵀ and p·V, 4·head_dim FLOPs per head and
 * key, at each token's causal key count (capped by a sliding window),
 * averaged over the prompt. The flash kernel's second QKᵀ pass and masked
 * work are not counted: this is the work the model needs. */
static double pp_flops_per_token(const pt_model *m, int depth, int n_prompt, int chunk) {
    const pt_net *n = &m->net;
    double lin = 0, att = 0;
    for (int l = 0; l < n->n_layers; l++) {
        const pt_layer *L = &n->layers[l];
        lin += mat_flops(&L->wq) + mat_flops(&L->wk) + mat_flops(&L->wv) + mat_flops(&L->wo);
        lin += mat_flops(&L->lin_qkv) + mat_flops(&L->lin_z) + mat_flops(&L->lin_b) + mat_flops(&L->lin_a) +
               mat_flops(&L->lin_out);
        if (L->is_moe) {
            const double ex = mat_flops(&L->ex_gate) + mat_flops(&L->ex_up) + mat_flops(&L->ex_down);
            lin += mat_flops(&L->router) + ex / L->route.n_experts * L->route.top_k;
            lin += mat_flops(&L->sh_gate) + mat_flops(&L->sh_up) + mat_flops(&L->sh_down) + mat_flops(&L->sh_router);
        }
        if (!L->is_moe || L->moe_dense) lin += mat_flops(&L->w_gate) + mat_flops(&L->w_up) + mat_flops(&L->w_down);
        lin += mat_flops(&L->ple_gate) + mat_flops(&L->ple_proj);
        if (L->is_linear) continue; /* DeltaNet: no attention over a cache */
        /* keys of the token at position t: min(t + 1, window); the mean over t in [depth, depth + n_prompt) */
        const double W = L->attn.window > 0 ? (double)L->attn.window : 1e300;
        double keys = 0;
        for (int t = depth; t < depth + n_prompt; t++) keys += (double)(t + 1) < W ? (double)(t + 1) : W;
        att += 4.0 * L->n_heads * L->head_dim * keys / n_prompt;
    }
    lin += mat_flops(&n->ple_model_proj);
    const double head = mat_flops(&n->lm_head) * ceil((double)n_prompt / chunk) / n_prompt;
    return lin + att + head;
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench";
    cli_common c;
    if (cli_common_init(&c, cmd)) return 2;
    const char *synthetic = NULL, *quant = NULL;
    int pp[MAX_LIST] = {512}, n_pp = 1, tg[MAX_LIST] = {128}, n_tg = 1, dd[MAX_LIST] = {0}, n_dd = 1;
    int reps = 5, json = 0, bw_gib = 2, mma_n = 8192, bw_interleave = 0;
    kv_cfg cfg[MAX_KV_CFG];
    int n_cfg = 0, kv_ab = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 0;
        }
        int r = cli_common_parse(&c, cmd, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if ((v = cli_flag_value("--synthetic", argc, argv, &i, &missing))) synthetic = v;
        else if (!missing && (v = cli_flag_value("--quant", argc, argv, &i, &missing))) quant = v;
        else if (!missing && (v = cli_flag_value("-p", argc, argv, &i, &missing))) {
            if (!parse_list(cmd, "-p", v, pp, &n_pp)) return 2;
        } else if (!missing && (v = cli_flag_value("-n", argc, argv, &i, &missing))) {
            if (!parse_list(cmd, "-n", v, tg, &n_tg)) return 2;
        } else if (!missing && (v = cli_flag_value("-d", argc, argv, &i, &missing))) {
            if (!parse_list(cmd, "-d", v, dd, &n_dd)) return 2;
        } else if (!missing && (v = cli_flag_value("-r", argc, argv, &i, &missing))) {
            if (!cli_parse_int(cmd, "-r", v, 1, 1000, &reps)) return 2;
        } else if (!missing && (v = cli_flag_value("--kv-ab", argc, argv, &i, &missing))) {
            if (!parse_kv_ab(cmd, v, cfg, &n_cfg)) return 2;
            kv_ab = 1;
        } else if (!missing && (v = cli_flag_value("--bw-gib", argc, argv, &i, &missing))) {
            if (!cli_parse_int(cmd, "--bw-gib", v, 0, 64, &bw_gib)) return 2;
            if (bw_gib == 1) return cli_usage_error(cmd, "--bw-gib: 1 GiB is too small (2 or more, or 0 to skip)");
        } else if (!missing && (v = cli_flag_value("--mma-n", argc, argv, &i, &missing))) {
            if (!cli_parse_int(cmd, "--mma-n", v, 0, 32768, &mma_n)) return 2;
            if (mma_n > 0 && mma_n < 256) return cli_usage_error(cmd, "--mma-n: %d is too small (256 or more, or 0 to skip)", mma_n);
        } else if (missing)
            return cli_usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--bw-interleave"))
            bw_interleave = 1;
        else
            return cli_usage_error(cmd, "unknown option '%s'", a);
    }
    if (synthetic && c.model_dir) return cli_usage_error(cmd, "give either -m DIR or --synthetic NAME, not both");
    if (!synthetic && !c.model_dir) return cli_usage_error(cmd, "no model given (-m DIR or --synthetic NAME)");
    if (synthetic && !quant) return cli_usage_error(cmd, "--synthetic needs --quant q4|q8|bf16");
    if (!synthetic && quant) return cli_usage_error(cmd, "--quant applies to --synthetic models only");
    if (bw_interleave && !bw_gib) return cli_usage_error(cmd, "--bw-interleave needs the bandwidth buffer (--bw-gib 2 or more)");

    /* the tests: pp rows then tg rows, for each depth */
    row rows[3 * MAX_LIST * MAX_LIST];
    int n_rows = 0, max_ctx = 1;
    for (int d = 0; d < n_dd; d++) {
        for (int i = 0; i < n_pp; i++)
            if (pp[i] > 0) rows[n_rows++] = (row){.n_prompt = pp[i], .n_depth = dd[d], .reps = reps};
        for (int i = 0; i < n_tg; i++)
            if (tg[i] > 0) rows[n_rows++] = (row){.n_gen = tg[i], .n_depth = dd[d], .reps = reps};
    }
    if (n_rows == 0) return cli_usage_error(cmd, "nothing to measure (-p 0 and -n 0)");
    for (int i = 0; i < n_rows; i++) {
        int need = rows[i].n_depth + rows[i].n_prompt + rows[i].n_gen + 1;
        if (need > max_ctx) max_ctx = need;
    }

    pt_model *m = NULL;
    if (synthetic) {
        if (!json) fprintf(stderr, "building synthetic %s %s (random weights)...\n", synthetic, quant);
        if (pt_model_synthetic(synthetic, quant, &c.mp, &m) != PT_OK) return cli_fail(cmd);
    } else if (pt_model_load(c.model_dir, &c.mp, &m) != PT_OK) {
        return cli_fail(cmd);
    }
    int rc = 1;
    pt_session *sess[MAX_KV_CFG] = {0};
    int n_sess = 0;
    int32_t *buf = NULL;
    double *samples = NULL, *bw_samples = NULL;
    pt_bw_meter *meter = NULL; /* --bw-interleave */
    row *res = NULL; /* [n_rows, n_cfg] */
    pt_session_params sp = {.n_ctx = c.n_ctx ? c.n_ctx : max_ctx};
    if (sp.n_ctx < max_ctx) {
        fprintf(stderr, "petrel %s: error: --ctx %d is smaller than the largest test needs (%d)\n", cmd, sp.n_ctx,
                max_ctx);
        goto done;
    }
    /* the configurations: the levers as given, or --kv-ab's list */
    const int base_kv = m->params.kv_quant, base_fused = m->params.fused_decode_attn;
    if (!kv_ab) {
        n_cfg = 1;
        cfg[0] = (kv_cfg){.kv_quant = base_kv, .fused = base_fused == PT_LEVER_ON};
        snprintf(cfg[0].name, sizeof cfg[0].name, "%s", "");
    }
    /* one session per cache mode; the cache is laid out from m->params when a
     * session is created, so the mode is set for the creation only */
    for (int k = 0; k < n_cfg; k++) {
        cfg[k].sess = -1;
        for (int j = 0; j < k; j++)
            if (cfg[j].kv_quant == cfg[k].kv_quant) cfg[k].sess = cfg[j].sess;
        if (cfg[k].sess >= 0) continue;
        m->params.kv_quant = cfg[k].kv_quant;
        pt_status st = pt_session_create(m, &sp, &sess[n_sess]);
        m->params.kv_quant = base_kv;
        if (st != PT_OK) {
            cli_fail(cmd);
            goto done;
        }
        cfg[k].sess = n_sess++;
    }
    int nth = c.mp.n_threads > 0 ? c.mp.n_threads : pt_cpu_count();
    double bw = 0;
    const int on_gpu = m->device == PT_DEVICE_CUDA;
    if (!json && bw_gib) {
        if (on_gpu) fprintf(stderr, "measuring read bandwidth (%d GiB of GPU memory)...\n", bw_gib);
        else fprintf(stderr, "measuring read bandwidth (%d GiB, %d threads)...\n", bw_gib, nth);
    }
    /* the roofline of the device that runs the model: GPU memory on CUDA */
    if (bw_interleave && on_gpu) {
        fprintf(stderr, "petrel %s: error: --bw-interleave is for the CPU (the GPU's read bandwidth is steady: "
                        "the one measurement serves)\n", cmd);
        goto done;
    }
    pt_status bst = PT_OK;
    if (bw_gib && on_gpu) bst = pt_cuda_read_bandwidth((size_t)bw_gib << 30, &bw);
    else if (bw_gib) { /* the best of three passes; --bw-interleave keeps the meter for a pass after every repetition */
        bst = pt_bw_meter_open(&meter, nth, (size_t)bw_gib << 30);
        if (bst == PT_OK) bst = pt_bw_meter_best(meter, 3, &bw);
        if (!bw_interleave) pt_bw_meter_free(&meter);
    }
    if (bst != PT_OK) {
        cli_fail(cmd);
        goto done;
    }
    /* the matrix roofline of prefill on CUDA: a bf16 cuBLAS GEMM */
    double mma = 0;
    if (on_gpu && mma_n) {
        if (!json) fprintf(stderr, "measuring the bf16 tensor-core rate (cuBLAS %d×%d×%d)...\n", mma_n, mma_n, mma_n);
        if (pt_cuda_matmul_rate(mma_n, &mma) != PT_OK) {
            cli_fail(cmd);
            goto done;
        }
    }
    const pt_net *net = &m->net;
    double wbytes = (double)pt_net_decode_bytes(net);
    int vocab = (int)net->vocab;
    buf = malloc((size_t)max_ctx * sizeof *buf);
    samples = calloc((size_t)n_rows * n_cfg * (size_t)reps, sizeof *samples);
    if (bw_interleave) bw_samples = calloc((size_t)n_rows * n_cfg * (size_t)reps, sizeof *bw_samples);
    res = calloc((size_t)n_rows * n_cfg, sizeof *res);
    if (!buf || !samples || !res || (bw_interleave && !bw_samples)) {
        fprintf(stderr, "petrel %s: error: out of memory\n", cmd);
        goto done;
    }
    if (!json) {
        printf("model: %s | %s | weights read per token %.1f MiB | read bandwidth %.1f GB/s", pt_model_id(m),
               pt_model_backend_name(m), wbytes / 1048576.0, bw);
        if (on_gpu && mma_n) printf(" | bf16 tensor-core rate %.1f TFLOP/s (cuBLAS %d³)", mma, mma_n);
        printf("\n\n| %-14s | %7s | %8s | %20s | %10s | %8s | %7s |%s%s%s\n", "test", "depth", "reps", "t/s (mean ± sd)",
               "median", "GB/s", "of BW", bw_interleave ? " read GB/s |" : "", on_gpu ? " TFLOP/s | of MMA |" : "",
               kv_ab ? " KV cache |" : "");
        printf("|%.*s|%s%s%s\n", 99, "----------------|---------|----------|----------------------|------------|----------|---------",
               bw_interleave ? "-----------|" : "", on_gpu ? "---------|--------|" : "", kv_ab ? "----------|" : "");
        fflush(stdout);
    }
    for (int i = 0; i < n_rows; i++) {
        const row *r0 = &rows[i];
        for (int k = 0; k < n_cfg; k++) {
            res[i * n_cfg + k] = *r0;
            res[i * n_cfg + k].samples = samples + ((size_t)i * n_cfg + k) * reps;
            if (bw_samples) res[i * n_cfg + k].bw_samples = bw_samples + ((size_t)i * n_cfg + k) * reps;
        }
        /* prefill never takes the fused decode kernel: a pp row of a '+fused'
         * configuration would repeat its cache mode's row */
        for (int rep = -1; rep < r0->reps; rep++)
            for (int k = 0; k < n_cfg; k++) {
                if (kv_ab && r0->n_prompt && cfg[k].fused) continue;
                m->params.fused_decode_attn = cfg[k].fused ? PT_LEVER_ON : PT_LEVER_OFF;
                pt_status st = run_rep(sess[cfg[k].sess], &res[i * n_cfg + k], rep, buf, vocab, cfg[k].name);
                m->params.fused_decode_attn = base_fused;
                if (st == PT_OK && meter && rep >= 0) st = pt_bw_meter_pass(meter, &res[i * n_cfg + k].bw_samples[rep]);
                if (st != PT_OK) {
                    cli_fail(cmd);
                    goto done;
                }
            }
        for (int k = 0; k < n_cfg; k++) {
            row *r = &res[i * n_cfg + k];
            if (kv_ab && r->n_prompt && cfg[k].fused) {
                r->reps = 0; /* not measured */
                continue;
            }
            if (row_stats(r) != PT_OK) {
                fprintf(stderr, "petrel %s: error: out of memory\n", cmd);
                goto done;
            }
            m->params.kv_quant = cfg[k].kv_quant; /* the cache width kv_read_bytes counts */
            double bytes_per_tok;
            if (r->n_gen) {
                bytes_per_tok = wbytes + kv_read_bytes(m, r->n_depth + 1 + r->n_gen / 2.0);
            } else {
                int chunk = sess[cfg[k].sess]->fwd.chunk;
                double chunks = ceil((double)r->n_prompt / chunk);
                bytes_per_tok = (wbytes + kv_read_bytes(m, r->n_depth + r->n_prompt / 2.0)) * chunks / r->n_prompt;
                if (on_gpu) {
                    r->tflops = r->median * pp_flops_per_token(m, r->n_depth, r->n_prompt, chunk) / 1e12;
                    r->mma_fraction = mma > 0 ? r->tflops / mma : 0;
                }
            }
            m->params.kv_quant = base_kv;
            r->gbps = r->median * bytes_per_tok / 1e9;
            const double bw_ref = meter ? r->bw_row : bw; /* --bw-interleave: this row's own passes */
            r->bw_fraction = bw_ref > 0 ? r->gbps / bw_ref : 0;
            if (!json) {
                char name[32], ts[40];
                snprintf(name, sizeof name, r->n_gen ? "tg%d" : "pp%d", r->n_gen ? r->n_gen : r->n_prompt);
                snprintf(ts, sizeof ts, "%.2f ± %.2f", r->avg, r->stddev);
                printf("| %-14s | %7d | %8d | %20s | %10.2f | %8.2f | %6.1f%% |", name, r->n_depth, r->reps, ts,
                       r->median, r->gbps, 100 * r->bw_fraction);
                if (meter) printf(" %9.2f |", r->bw_row);
                if (on_gpu && r->n_prompt) printf(" %7.1f | %5.1f%% |", r->tflops, 100 * r->mma_fraction);
                else if (on_gpu) printf(" %7s | %6s |", "-", "-");
                if (kv_ab) printf(" %-8s |", cfg[k].name);
                printf("\n");
                fflush(stdout);
            }
        }
    }
    if (json) {
        cJSON *idj = cJSON_CreateString(pt_model_id(m)); /* escaped for JSON */
        char *id_json = idj ? cJSON_PrintUnformatted(idj) : NULL;
        cJSON_Delete(idj);
        printf("[\n");
        int first = 1;
        for (int i = 0; i < n_rows * n_cfg; i++) {
            row *r = &res[i];
            const kv_cfg *kc = &cfg[i % n_cfg];
            if (r->reps == 0) continue; /* a pp row of a '+fused' configuration */
            char kvname[24];
            snprintf(kvname, sizeof kvname, "%s",
                     kv_ab ? kc->name
                           : kc->kv_quant == PT_KV_QUANT_CONFIG ? "config"
                           : kc->kv_quant == 4                  ? (kc->fused ? "4+fused" : "4")
                           : kc->kv_quant == 8                  ? (kc->fused ? "8+fused" : "8")
                                                                : "off");
            printf("%s  {\"model\": %s, \"backend\": \"cpu\", \"n_threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, "
                   "\"n_depth\": %d, \"n_reps\": %d, \"kv\": \"%s\", \"avg_ts\": %.6f, \"stddev_ts\": %.6f, "
                   "\"median_ts\": %.6f, \"samples_ts\": [",
                   first ? "" : ",\n", id_json ? id_json : "\"?\"", nth, r->n_prompt, r->n_gen, r->n_depth, r->reps,
                   kvname, r->avg, r->stddev, r->median);
            for (int k = 0; k < r->reps; k++) printf("%s%.6f", k ? ", " : "", r->samples[k]);
            printf("], \"gbps\": %.6f, \"bw_fraction\": %.6f, \"bw_measured_gbps\": %.6f", r->gbps, r->bw_fraction,
                   bw);
            if (meter) {
                printf(", \"bw_row_gbps\": %.6f, \"bw_samples_gbps\": [", r->bw_row);
                for (int k = 0; k < r->reps; k++) printf("%s%.6f", k ? ", " : "", r->bw_samples[k]);
                printf("]");
            }
            if (on_gpu)
                printf(", \"tflops\": %.6f, \"mma_fraction\": %.6f, \"mma_measured_tflops\": %.6f", r->tflops,
                       r->mma_fraction, mma);
            printf("}");
            first = 0;
        }
        printf("\n]\n");
        free(id_json);
    }
    rc = 0;
done:
    pt_bw_meter_free(&meter);
    free(bw_samples);
    free(samples);
    free(res);
    free(buf);
    for (int k = 0; k < n_sess; k++) pt_session_free(&sess[k]);
    pt_model_free(&m);
    return rc;
}
