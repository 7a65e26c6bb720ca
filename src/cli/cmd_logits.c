/* petrel logits: float32 little-endian logits [n_tokens x vocab] for every
 * prompt position, written to a file (the parity oracle's view of a model). */
#include "cli/args.h"
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: petrel logits -m DIR --prompt-ids 1,2,3 --out FILE [--dtype f32|bf16] [options]\n\n"
            "Runs the prompt through the model and writes the logits of every position to FILE:\n"
            "float32 little-endian, [n_tokens x vocab], row-major. The ids are used verbatim\n"
            "(no BOS added). Prints \"n_tokens vocab\" to stdout.\n\n"
            "  --prompt-ids IDS     token ids (\"1,2,3\" or \"1 2 3\")\n"
            "  -p, --prompt TEXT    or a text, tokenized with the model's specials (BOS...)\n"
            "  --out FILE           the output file\n"
            "  --dtype f32|bf16     compute dtype: the model's own when absent; bf16 casts weights and\n"
            "                       activations to bf16 like model.to(torch.bfloat16); f32 the same to f32\n"
            "  -h, --help           this help\n");
    cli_common_help(f);
}

int cmd_logits(int argc, char **argv) {
    const char *cmd = "logits";
    cli_common c;
    if (cli_common_init(&c, cmd)) return 2;
    const char *ids_arg = NULL, *prompt = NULL, *out = NULL;
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
        if ((v = cli_flag_value("--prompt-ids", argc, argv, &i, &missing))) ids_arg = v;
        else if (!missing && ((v = cli_flag_value("-p", argc, argv, &i, &missing)) ||
                              (!missing && (v = cli_flag_value("--prompt", argc, argv, &i, &missing)))))
            prompt = v;
        else if (!missing && (v = cli_flag_value("--out", argc, argv, &i, &missing))) out = v;
        else if (!missing && (v = cli_flag_value("--dtype", argc, argv, &i, &missing))) {
            if (!strcmp(v, "f32")) c.mp.dtype = PT_COMPUTE_F32;
            else if (!strcmp(v, "bf16")) c.mp.dtype = PT_COMPUTE_BF16;
            else return cli_usage_error(cmd, "--dtype: bad value '%s' (expected f32 or bf16)", v);
        } else if (missing)
            return cli_usage_error(cmd, "%s needs a value", a);
        else
            return cli_usage_error(cmd, "unknown option '%s'", a);
    }
    if (!out) return cli_usage_error(cmd, "no output file given (--out FILE)");
    int32_t *ids;
    size_t n;
    pt_model *m;
    pt_session *s;
    int rc = cli_load_prompt(cmd, &c, prompt, ids_arg, &ids, &n, &m, &s);
    if (rc) return rc;
    rc = 1;
    float *lg = NULL;
    FILE *f = NULL;
    if (prompt) {
        if (pt_tokenize(m, prompt, strlen(prompt), 1, &ids, &n) != PT_OK) {
            cli_fail(cmd);
            goto done;
        }
        if (n == 0) {
            fprintf(stderr, "petrel %s: error: the prompt tokenizes to no tokens\n", cmd);
            goto done;
        }
    }
    size_t V = (size_t)pt_model_vocab_size(m);
    lg = malloc(n * V * sizeof *lg);
    if (!lg) {
        fprintf(stderr, "petrel %s: error: out of memory for %zu x %zu logits\n", cmd, n, V);
        goto done;
    }
    if (pt_session_eval_logits(s, ids, n, lg) != PT_OK) {
        cli_fail(cmd);
        goto done;
    }
    f = fopen(out, "wb");
    /* x86-64 and aarch64 are little-endian: the floats are written as they are */
    if (!f || fwrite(lg, sizeof *lg, n * V, f) != n * V || fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "petrel %s: error: cannot write %s\n", cmd, out);
        goto done;
    }
    f = NULL;
    printf("%zu %zu\n", n, V);
    rc = 0;
done:
    if (f) fclose(f);
    free(lg);
    free(ids);
    pt_session_free(&s);
    pt_model_free(&m);
    return rc;
}
