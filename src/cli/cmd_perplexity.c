/* petrel perplexity: exp(mean negative log-likelihood) of a text under the
 * model. The text is tokenized once (with the model's specials) and split
 * into windows of --ctx tokens; each window is evaluated from an empty
 * context and every token after its first is scored. */
#include "cli/args.h"
#include "cli/cli.h"

#include "base/mmap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: petrel perplexity -m DIR -f TEXT_FILE [options]\n\n"
            "Prints the perplexity of the text: exp of the mean negative log-likelihood of each\n"
            "token given the ones before it, over windows of --ctx tokens (default: the model's\n"
            "maximum, at most 4096), each window starting from an empty context.\n\n"
            "  -f, --file FILE      the text (read byte for byte)\n"
            "  --max-windows N      score at most N windows (default all)\n"
            "  -h, --help           this help\n");
    cli_common_help(f);
}

int cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity";
    cli_common c;
    if (cli_common_init(&c, cmd)) return 2;
    const char *file = NULL;
    int max_windows = 0;
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
        if ((v = cli_flag_value("-f", argc, argv, &i, &missing)) ||
            (!missing && (v = cli_flag_value("--file", argc, argv, &i, &missing))))
            file = v;
        else if (!missing && (v = cli_flag_value("--max-windows", argc, argv, &i, &missing))) {
            if (!cli_parse_int(cmd, "--max-windows", v, 1, 1 << 30, &max_windows)) return 2;
        } else if (missing)
            return cli_usage_error(cmd, "%s needs a value", a);
        else
            return cli_usage_error(cmd, "unknown option '%s'", a);
    }
    if (!file) return cli_usage_error(cmd, "no text given (-f FILE)");
    char *text = NULL;
    size_t len = 0;
    if (pt_read_file(file, &text, &len) != PT_OK) return cli_fail(cmd);
    pt_model *m;
    pt_session *s;
    int rc = cli_load(cmd, &c, &m, &s);
    if (rc) {
        free(text);
        return rc;
    }
    rc = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    float *lg = NULL;
    if (pt_tokenize(m, text, len, 1, &ids, &n) != PT_OK) {
        cli_fail(cmd);
        goto done;
    }
    if (n < 2) {
        fprintf(stderr, "petrel %s: error: %s holds %zu token(s); at least 2 are needed\n", cmd, file, n);
        goto done;
    }
    size_t V = (size_t)pt_model_vocab_size(m), W = (size_t)pt_session_n_ctx(s);
    /* evaluate in blocks so the logits buffer stays small */
    size_t B = W < 128 ? W : 128;
    lg = malloc(B * V * sizeof *lg);
    if (!lg) {
        fprintf(stderr, "petrel %s: error: out of memory\n", cmd);
        goto done;
    }
    double nll = 0;
    size_t scored = 0;
    int windows = 0;
    for (size_t w0 = 0; w0 + 1 < n; w0 += W) {
        if (max_windows && windows == max_windows) break;
        size_t wn = n - w0 < W ? n - w0 : W;
        if (wn < 2) break;
        pt_session_truncate(s, 0);
        for (size_t b = 0; b < wn; b += B) {
            size_t bn = wn - b < B ? wn - b : B;
            if (pt_session_eval_logits(s, ids + w0 + b, bn, lg) != PT_OK) {
                cli_fail(cmd);
                goto done;
            }
            /* row r predicts token w0 + b + r + 1 (inside the window) */
            for (size_t r = 0; r < bn && b + r + 1 < wn; r++) {
                const float *row = lg + r * V;
                int32_t next = ids[w0 + b + r + 1];
                double mx = -INFINITY, sum = 0;
                for (size_t k = 0; k < V; k++) mx = row[k] > mx ? row[k] : mx;
                for (size_t k = 0; k < V; k++) sum += exp((double)row[k] - mx);
                nll -= (double)row[next] - mx - log(sum);
                scored++;
            }
        }
        windows++;
        fprintf(stderr, "window %d: %zu tokens, running perplexity %.4f\n", windows, wn, exp(nll / (double)scored));
    }
    printf("perplexity: %.4f over %zu scored tokens (%d window%s of up to %zu tokens)\n", exp(nll / (double)scored),
           scored, windows, windows == 1 ? "" : "s", W);
    rc = 0;
done:
    free(lg);
    free(ids);
    free(text);
    pt_session_free(&s);
    pt_model_free(&m);
    return rc;
}
