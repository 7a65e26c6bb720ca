/* petrel quantize IN OUT --bits B --group-size G [--mixed RECIPE]: writes an
 * MLX-format affine-quantized checkpoint that mlx-lm loads (the conversion
 * itself is src/model/quantize.c). Shows a progress bar when stderr is a
 * terminal; prints a one-line summary on stdout. */
#include "cli/cli.h"

#include "base/error.h"
#include "model/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: petrel quantize IN OUT --bits B --group-size G [--mixed RECIPE] [-t N]\n"
            "\n"
            "Writes an MLX-format checkpoint of the float model in IN to the new (or empty)\n"
            "directory OUT, with mlx-lm's tensor names: packed uint32 weights with scales and\n"
            "biases in the model dtype, `quantization` and `quantization_config` in\n"
            "config.json, tokenizer and generation files copied. Every linear layer and\n"
            "embedding whose input width is a multiple of the group size is quantized\n"
            "(embeddings and lm_head included); MoE routers at 8 bits as mlx-lm does.\n"
            "\n"
            "  --bits B           2, 3, 4, 5, 6 or 8 (default 4)\n"
            "  --group-size G     32, 64 or 128 (default 64)\n"
            "  --mixed RECIPE     mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6: mlx-lm's mixed\n"
            "                     recipes (v_proj/down_proj of the first and last eighth of the\n"
            "                     layers and every third layer between, and lm_head, at the high\n"
            "                     width; everything else at the low width)\n"
            "  -t N               threads (default: all CPUs; the output does not depend on it)\n"
            "  --cpu-rule         round as MLX's CPU kernel does (half to even) instead of its\n"
            "                     GPU kernels (what mlx-community checkpoints were made with)\n");
}

typedef struct {
    int tty;
    int last;
} progress;

static void on_progress(void *ctx, int64_t done, int64_t total) {
    progress *p = ctx;
    if (!p->tty || total <= 0) return;
    int pct = (int)(done * 100 / total);
    if (pct == p->last && done != total) return;
    p->last = pct;
    int w = 40, fill = (int)(done * w / total);
    fprintf(stderr, "\rquantizing [");
    for (int i = 0; i < w; i++) fputc(i < fill ? '=' : i == fill ? '>' : ' ', stderr);
    fprintf(stderr, "] %3d%% %.1f/%.1f MiB", pct, (double)done / 1048576.0, (double)total / 1048576.0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static int parse_int(const char *s, int *out) {
    char *e;
    long v = strtol(s, &e, 10);
    if (!*s || *e || v < 0 || v > 1 << 20) return 0;
    *out = (int)v;
    return 1;
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    pt_quantize_params p = {.bits = 4, .group_size = 64, .rule = PT_MLX_RULE_METAL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (i + 1 >= argc || !parse_int(argv[i + 1], &p.n_threads) || p.n_threads < 1)
                return cli_usage_error("quantize", "%s needs a positive thread count", a);
            i++;
        } else if (!strcmp(a, "--bits") || !strcmp(a, "--group-size") || !strcmp(a, "--mixed")) {
            if (i + 1 >= argc) return cli_usage_error("quantize", "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--mixed")) {
                if (!pt_quantize_recipe_valid(v))
                    return cli_usage_error("quantize", "--mixed '%s': expected mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6", v);
                p.mixed = v;
            } else if (!strcmp(a, "--bits")) {
                if (!parse_int(v, &p.bits) || !pt_mlx_bits_ok(p.bits))
                    return cli_usage_error("quantize", "--bits '%s': expected 2, 3, 4, 5, 6 or 8", v);
            } else if (!parse_int(v, &p.group_size) || !pt_mlx_group_ok(p.group_size)) {
                return cli_usage_error("quantize", "--group-size '%s': expected 32, 64 or 128", v);
            }
        } else if (!strcmp(a, "--cpu-rule")) {
            p.rule = PT_MLX_RULE_CPU;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("quantize", "unknown option '%s'", a);
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            return cli_usage_error("quantize", "unexpected argument '%s'", a);
        }
    }
    if (!in || !out) return cli_usage_error("quantize", "expected an input and an output directory");
    progress pr = {.tty = isatty(2), .last = -1};
    p.progress = on_progress;
    p.progress_ctx = &pr;
    pt_quantize_report rep;
    if (pt_quantize_model(in, out, &p, &rep)) return cli_fail("quantize");
    printf("wrote %s: %d tensors in %d shard%s, %d modules quantized, %lld bytes, %.3f bits per weight\n", out,
           rep.n_tensors, rep.n_shards, rep.n_shards == 1 ? "" : "s", rep.n_quantized, (long long)rep.bytes,
           rep.bits_per_weight);
    return 0;
}
