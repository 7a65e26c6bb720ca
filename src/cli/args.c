/* Common model-running flags and value parsers (see args.h). */
#include "cli/args.h"

#include "cli/cli.h"
#include "base/threadpool.h"
#include "runtime/levers.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *cli_flag_value(const char *name, int argc, char **argv, int *i, int *missing) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    *missing = 0;
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != 0) return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    (*i)++;
    return argv[*i];
}

int cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = s && *s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || errno || *end || v < lo || v > hi) {
        fprintf(stderr, "petrel %s: %s: bad value '%s' (expected an integer in %ld..%ld)\n", cmd, flag,
                s ? s : "", lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = s && *s && *s != '-' ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *s == '-' || errno || *end) {
        fprintf(stderr, "petrel %s: %s: bad value '%s' (expected a non-negative integer)\n", cmd, flag,
                s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_float(const char *cmd, const char *flag, const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = s && *s ? strtod(s, &end) : 0;
    if (!s || !*s || errno || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "petrel %s: %s: bad value '%s' (expected a number in [%g, %g])\n", cmd, flag,
                s ? s : "", lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

int cli_parse_ids(const char *cmd, const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        if (!isdigit((unsigned char)*p)) {
            fprintf(stderr, "petrel %s: --prompt-ids: '%s' is not a token id (expected non-negative integers "
                            "separated by commas or spaces)\n",
                    cmd, p);
            free(v);
            return 0;
        }
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || x > INT32_MAX) {
            fprintf(stderr, "petrel %s: --prompt-ids: token id out of range near '%.20s'\n", cmd, p);
            free(v);
            return 0;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                free(v);
                return 0;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p && *p != ' ' && *p != ',' && *p != '\t' && *p != '\n') {
            fprintf(stderr, "petrel %s: --prompt-ids: unexpected '%c' after a token id\n", cmd, *p);
            free(v);
            return 0;
        }
    }
    if (k == 0) {
        fprintf(stderr, "petrel %s: --prompt-ids: the prompt is empty (give at least one token id)\n", cmd);
        free(v);
        return 0;
    }
    *ids = v;
    *n = k;
    return 1;
}

static int set_device(cli_common *c, const char *cmd, const char *what, const char *v) {
    if (!strcmp(v, "cpu")) c->mp.device = PT_DEVICE_CPU;
    else if (!strcmp(v, "cuda")) c->mp.device = PT_DEVICE_CUDA;
    else if (!strcmp(v, "auto")) c->mp.device = PT_DEVICE_AUTO;
    else {
        fprintf(stderr, "petrel %s: %s: bad value '%s' (expected cuda, cpu or auto)\n", cmd, what, v);
        return 0;
    }
    return 1;
}

static int set_tier(cli_common *c, const char *cmd, const char *what, const char *v) {
    int t = !strcmp(v, "l1") || !strcmp(v, "1") ? 1 : !strcmp(v, "l2") || !strcmp(v, "2") ? 2
                                                  : !strcmp(v, "l3") || !strcmp(v, "3") ? 3 : 0;
    if (!t) {
        fprintf(stderr, "petrel %s: %s: bad value '%s' (expected l1, l2 or l3)\n", cmd, what, v);
        return 0;
    }
    pt_levers_apply_tier(&c->mp, t);
    c->tier = t;
    return 1;
}

int cli_common_init(cli_common *c, const char *cmd) {
    memset(c, 0, sizeof *c);
    c->mp = pt_model_default_params();
    const char *e;
    if ((e = getenv("PETREL_MODEL")) && *e) c->model_dir = e;
    if ((e = getenv("PETREL_THREADS")) && *e && !cli_parse_int(cmd, "PETREL_THREADS", e, 0, 4096, &c->mp.n_threads))
        return 2;
    if ((e = getenv("PETREL_DEVICE")) && *e && !set_device(c, cmd, "PETREL_DEVICE", e)) return 2;
    if ((e = getenv("PETREL_CTX")) && *e && !cli_parse_int(cmd, "PETREL_CTX", e, 1, 1 << 30, &c->n_ctx)) return 2;
    if ((e = getenv("PETREL_CHAT_TEMPLATE")) && *e) c->mp.chat_template_path = e;
    if ((e = getenv("PETREL_TIER")) && *e && !set_tier(c, cmd, "PETREL_TIER", e)) return 2;
    for (int i = 0; pt_lever_names[i]; i++) {
        const char *env = pt_lever_env_name(pt_lever_names[i]);
        if ((e = getenv(env)) && *e && pt_lever_set(&c->mp, pt_lever_names[i], e) != PT_OK) {
            fprintf(stderr, "petrel %s: %s: %s\n", cmd, env, pt_last_error());
            return 2;
        }
    }
    return 0;
}

int cli_common_parse(cli_common *c, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v;
    int missing = 0;
#define MISSING(name)                                                           \
    do {                                                                        \
        if (missing) {                                                          \
            fprintf(stderr, "petrel %s: %s needs a value\n", cmd, name);        \
            return -1;                                                          \
        }                                                                       \
    } while (0)
    if (!strcmp(a, "--l1") || !strcmp(a, "--l2") || !strcmp(a, "--l3")) {
        set_tier(c, cmd, a, a + 2);
        return 1;
    }
    if ((v = cli_flag_value("-m", argc, argv, i, &missing)) ||
        (!missing && (v = cli_flag_value("--model", argc, argv, i, &missing)))) {
        c->model_dir = v;
        return 1;
    }
    MISSING("-m/--model");
    if ((v = cli_flag_value("-t", argc, argv, i, &missing)) ||
        (!missing && (v = cli_flag_value("--threads", argc, argv, i, &missing))))
        return cli_parse_int(cmd, "-t/--threads", v, 0, 4096, &c->mp.n_threads) ? 1 : -1;
    MISSING("-t/--threads");
    if ((v = cli_flag_value("--device", argc, argv, i, &missing))) return set_device(c, cmd, "--device", v) ? 1 : -1;
    MISSING("--device");
    if ((v = cli_flag_value("--ctx", argc, argv, i, &missing)))
        return cli_parse_int(cmd, "--ctx", v, 1, 1 << 30, &c->n_ctx) ? 1 : -1;
    MISSING("--ctx");
    if ((v = cli_flag_value("--chat-template", argc, argv, i, &missing))) {
        c->mp.chat_template_path = v;
        return 1;
    }
    MISSING("--chat-template");
    if (a[0] == '-' && a[1] == '-') {
        for (int k = 0; pt_lever_names[k]; k++) {
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", pt_lever_names[k]);
            if ((v = cli_flag_value(flag, argc, argv, i, &missing))) {
                if (pt_lever_set(&c->mp, pt_lever_names[k], v) != PT_OK) {
                    fprintf(stderr, "petrel %s: %s\n", cmd, pt_last_error());
                    return -1;
                }
                return 1;
            }
            MISSING(flag);
        }
    }
#undef MISSING
    return 0;
}

void cli_common_help(FILE *f) {
    fprintf(f,
            "model options (each also read from the environment variable in brackets):\n"
            "  -m, --model DIR          model directory (config.json + safetensors) [PETREL_MODEL]\n"
            "  -t, --threads N          CPU threads; 0 = all online CPUs [PETREL_THREADS]\n"
            "  --device cuda|cpu|auto   where to run (default auto) [PETREL_DEVICE]\n"
            "  --ctx N                  context length in tokens (default min(model max, 4096)) [PETREL_CTX]\n"
            "  --chat-template FILE     a Jinja chat template overriding the model's [PETREL_CHAT_TEMPLATE]\n"
            "parity tiers (pure aliases over the levers below; a later flag overrides them) [PETREL_TIER=l1|l2|l3]:\n"
            "  --l1   reproduce the reference: --kv-quant off --compiled-decode on --fused-decode-attn off --int8-act off\n"
            "  --l2   quantized-KV semantics:  --kv-quant config --compiled-decode on --fused-decode-attn off --int8-act off\n"
            "  --l3   fastest, no oracle:      --kv-quant 4 --compiled-decode on --fused-decode-attn on --int8-act on\n"
            "levers:\n"
            "  --kv-quant off|4|8|config    quantized KV cache (default off) [PETREL_KV_QUANT]\n"
            "  --kv-group-size 32|64|128    KV quantization group (default 64) [PETREL_KV_GROUP_SIZE]\n"
            "  --quantized-kv-start N       quantize the cache once it holds N tokens (default 0) [PETREL_QUANTIZED_KV_START]\n"
            "  --prefill-chunk N            prompt tokens per forward chunk (default 2048) [PETREL_PREFILL_CHUNK]\n"
            "  --compiled-decode on|off     CUDA-graph decode step (CUDA only; n/a on the cpu) [PETREL_COMPILED_DECODE]\n"
            "  --fused-decode-attn on|off   online-softmax decode attention over quantized KV [PETREL_FUSED_DECODE_ATTN]\n"
            "  --int8-act on|off            int8 activations on the CPU [PETREL_INT8_ACT]\n"
            "  --gpu-sampling on|off        sample on the GPU, same tokens as the host sampler (CUDA only;\n"
            "                               masks and top-n logprobs sample on the host) [PETREL_GPU_SAMPLING]\n"
            "  (tiers, measured effects and speedups of every lever: docs/flags.md)\n");
}

void cli_print_config(FILE *f, cli_common *c) {
    pt_model_params p = c->mp;
    pt_levers_resolve(&p);
    pt_device dev = p.device == PT_DEVICE_CUDA ? PT_DEVICE_CUDA : PT_DEVICE_CPU;
    pt_levers_for_device(&p, dev);
    char buf[1024];
    pt_levers_format(&p, dev, buf, sizeof buf);
    char thr[48], ctx[48];
    if (p.n_threads > 0) snprintf(thr, sizeof thr, "%d", p.n_threads);
    else snprintf(thr, sizeof thr, "%d (all online CPUs)", pt_cpu_count());
    if (c->n_ctx > 0) snprintf(ctx, sizeof ctx, "%d", c->n_ctx);
    else snprintf(ctx, sizeof ctx, "default (min(model maximum, 4096))");
    fprintf(f, "device: %s\nthreads: %s\nctx: %s\ntier: %s\n%s",
            p.device == PT_DEVICE_CUDA ? "cuda" : p.device == PT_DEVICE_CPU ? "cpu" : "auto (cpu)", thr, ctx,
            c->tier ? (c->tier == 1 ? "l1" : c->tier == 2 ? "l2" : "l3") : "none", buf);
}

int cli_load(const char *cmd, cli_common *c, pt_model **model, pt_session **session) {
    *model = NULL;
    *session = NULL;
    if (!c->model_dir) {
        cli_usage_error(cmd, "no model given (-m DIR, or PETREL_MODEL)");
        return 2;
    }
    if (pt_model_load(c->model_dir, &c->mp, model) != PT_OK) return cli_fail(cmd);
    pt_session_params sp = pt_session_default_params();
    sp.n_ctx = c->n_ctx;
    if (pt_session_create(*model, &sp, session) != PT_OK) {
        int rc = cli_fail(cmd);
        pt_model_free(model);
        return rc;
    }
    return 0;
}

int cli_load_prompt(const char *cmd, cli_common *c, const char *prompt, const char *ids_arg, int32_t **ids,
                    size_t *n_ids, pt_model **model, pt_session **session) {
    *ids = NULL;
    *n_ids = 0;
    if (!prompt && !ids_arg) return cli_usage_error(cmd, "no prompt given (-p TEXT or --prompt-ids IDS)");
    if (prompt && ids_arg) return cli_usage_error(cmd, "give either -p TEXT or --prompt-ids IDS, not both");
    if (prompt && !*prompt) return cli_usage_error(cmd, "the prompt is empty");
    if (ids_arg && !cli_parse_ids(cmd, ids_arg, ids, n_ids)) return 2;
    int rc = cli_load(cmd, c, model, session);
    if (rc) {
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

enum { S_TEMP = 1, S_TOPK = 2, S_TOPP = 4, S_MINP = 8, S_SEED = 16, S_REP = 32, S_REPN = 64, S_PRES = 128, S_FREQ = 256 };

void cli_sampling_init(cli_sampling *s) {
    memset(s, 0, sizeof *s);
    s->max_tokens = 256;
}

int cli_sampling_parse(cli_sampling *s, const char *cmd, int argc, char **argv, int *i) {
    const char *v;
    int missing = 0;
#define FLAG(name) ((v = cli_flag_value(name, argc, argv, i, &missing)) != NULL || missing)
#define NEED(name)                                                       \
    if (missing) {                                                       \
        fprintf(stderr, "petrel %s: %s needs a value\n", cmd, name);     \
        return -1;                                                       \
    }
    if (FLAG("--max-tokens")) {
        NEED("--max-tokens");
        return cli_parse_int(cmd, "--max-tokens", v, 0, 1 << 30, &s->max_tokens) ? 1 : -1;
    }
    if (FLAG("--temp")) {
        NEED("--temp");
        s->set |= S_TEMP;
        return cli_parse_float(cmd, "--temp", v, 0, 100, &s->v.temperature) ? 1 : -1;
    }
    if (FLAG("--top-k")) {
        NEED("--top-k");
        s->set |= S_TOPK;
        return cli_parse_int(cmd, "--top-k", v, 0, 1 << 30, &s->v.top_k) ? 1 : -1;
    }
    if (FLAG("--top-p")) {
        NEED("--top-p");
        s->set |= S_TOPP;
        if (!cli_parse_float(cmd, "--top-p", v, 0, 1, &s->v.top_p)) return -1;
        if (s->v.top_p <= 0) {
            fprintf(stderr, "petrel %s: --top-p: bad value '%s' (expected a number in (0, 1])\n", cmd, v);
            return -1;
        }
        return 1;
    }
    if (FLAG("--min-p")) {
        NEED("--min-p");
        s->set |= S_MINP;
        return cli_parse_float(cmd, "--min-p", v, 0, 1, &s->v.min_p) ? 1 : -1;
    }
    if (FLAG("--seed")) {
        NEED("--seed");
        s->set |= S_SEED;
        return cli_parse_u64(cmd, "--seed", v, &s->v.seed) ? 1 : -1;
    }
    if (FLAG("--repeat-penalty")) {
        NEED("--repeat-penalty");
        s->set |= S_REP;
        if (!cli_parse_float(cmd, "--repeat-penalty", v, 0, 100, &s->v.repetition_penalty)) return -1;
        if (s->v.repetition_penalty <= 0) {
            fprintf(stderr, "petrel %s: --repeat-penalty: bad value '%s' (expected a number > 0)\n", cmd, v);
            return -1;
        }
        return 1;
    }
    if (FLAG("--repeat-last-n")) {
        NEED("--repeat-last-n");
        s->set |= S_REPN;
        return cli_parse_int(cmd, "--repeat-last-n", v, 0, 1 << 30, &s->v.repeat_last_n) ? 1 : -1;
    }
    if (FLAG("--presence-penalty")) {
        NEED("--presence-penalty");
        s->set |= S_PRES;
        return cli_parse_float(cmd, "--presence-penalty", v, -100, 100, &s->v.presence_penalty) ? 1 : -1;
    }
    if (FLAG("--frequency-penalty")) {
        NEED("--frequency-penalty");
        s->set |= S_FREQ;
        return cli_parse_float(cmd, "--frequency-penalty", v, -100, 100, &s->v.frequency_penalty) ? 1 : -1;
    }
    if (FLAG("--stop")) {
        NEED("--stop");
        if (!*v) {
            fprintf(stderr, "petrel %s: --stop: the stop string is empty\n", cmd);
            return -1;
        }
        if (s->n_stop == CLI_MAX_STOP) {
            fprintf(stderr, "petrel %s: --stop: at most %d stop strings\n", cmd, CLI_MAX_STOP);
            return -1;
        }
        s->stop[s->n_stop++] = v;
        return 1;
    }
#undef FLAG
#undef NEED
    return 0;
}

pt_generate_params cli_sampling_apply(const cli_sampling *s, const pt_model *m) {
    pt_generate_params g = pt_generate_default_params(m);
    g.max_tokens = s->max_tokens;
    if (s->set & S_TEMP) g.sampling.temperature = s->v.temperature;
    if (s->set & S_TOPK) g.sampling.top_k = s->v.top_k;
    if (s->set & S_TOPP) g.sampling.top_p = s->v.top_p;
    if (s->set & S_MINP) g.sampling.min_p = s->v.min_p;
    if (s->set & S_SEED) g.sampling.seed = s->v.seed;
    if (s->set & S_REP) g.sampling.repetition_penalty = s->v.repetition_penalty;
    if (s->set & S_REPN) g.sampling.repeat_last_n = s->v.repeat_last_n;
    if (s->set & S_PRES) g.sampling.presence_penalty = s->v.presence_penalty;
    if (s->set & S_FREQ) g.sampling.frequency_penalty = s->v.frequency_penalty;
    g.stop = s->stop;
    g.n_stop = s->n_stop;
    g.sampling.no_logprob = 1; /* the commands print text, never a token's log-probability */
    return g;
}

void cli_sampling_help(FILE *f) {
    fprintf(f,
            "sampling (defaults: the model's generation_config.json, else temperature 1, no filters):\n"
            "  --max-tokens N           tokens to generate at most (default 256)\n"
            "  --temp T                 temperature; 0 = greedy\n"
            "  --top-k K                keep the K most likely tokens (0 = off)\n"
            "  --top-p P                nucleus: the smallest set holding P of the probability (1 = off)\n"
            "  --min-p P                drop tokens below P x the top probability (0 = off)\n"
            "  --seed S                 random seed (default 0); a seed reproduces a run\n"
            "  --repeat-penalty R       repetition penalty over the last --repeat-last-n tokens (1 = off)\n"
            "  --repeat-last-n N        penalty window (default 64; 0 = whole context)\n"
            "  --presence-penalty P     subtract P from tokens already present (0 = off)\n"
            "  --frequency-penalty P    subtract P x count from tokens already present (0 = off)\n"
            "  --stop STR               stop when the text contains STR (repeatable; STR not printed)\n");
}
