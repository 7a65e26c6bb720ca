/* petrel template — renders a chat template with variables from a JSON file,
 * exactly as transformers' apply_chat_template would (see docs/templates.md). */
#include "cli/cli.h"

#include "base/error.h"
#include "base/mmap.h"
#include "tokenizer/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: petrel template --template FILE --input FILE.json [--now YYYY-MM-DDTHH:MM:SS]\n"
            "       petrel template -m MODEL_DIR [--chat-template FILE] --input FILE.json [--now ...]\n"
            "\n"
            "Renders a chat template (Jinja) with the members of the JSON object in\n"
            "FILE.json as its variables (messages, tools, documents,\n"
            "add_generation_prompt, bos_token, eos_token, enable_thinking, ...), the way\n"
            "transformers' apply_chat_template renders it, and prints the result byte\n"
            "for byte with no newline added.\n"
            "\n"
            "  --template FILE       the template file (.jinja)\n"
            "  -m, --model DIR       use the model's template (tokenizer_config.json\n"
            "                        chat_template, or chat_template.jinja)\n"
            "  --chat-template FILE  with -m: a template file that replaces the model's\n"
            "  --input FILE.json     the variables, one JSON object ('-' = stdin)\n"
            "  --now TIME            pins strftime_now to TIME (local time,\n"
            "                        YYYY-MM-DDTHH:MM:SS); default: the current time\n"
            "\n"
            "Exit status: 0 rendered; 1 the template raised (raise_exception, an\n"
            "undefined value, a sandbox refusal, a type error) or has a syntax error,\n"
            "with the message and template line on stderr; 2 usage error.\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    size_t k;
    while ((k = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *tmpl_path = NULL, *input = NULL, *now_text = NULL, *model = NULL, *override = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(a, "--template") ? &tmpl_path
                           : !strcmp(a, "--input") ? &input
                           : !strcmp(a, "--now") ? &now_text
                           : (!strcmp(a, "-m") || !strcmp(a, "--model")) ? &model
                           : !strcmp(a, "--chat-template") ? &override : NULL;
        if (!dst) return cli_usage_error("template", "unknown option '%s'", a);
        if (i + 1 >= argc) return cli_usage_error("template", "%s needs a value", a);
        *dst = argv[++i];
    }
    if (!tmpl_path && !model) return cli_usage_error("template", "--template FILE (or -m DIR) is required");
    if (tmpl_path && model) return cli_usage_error("template", "give --template or -m, not both");
    if (override && !model) return cli_usage_error("template", "--chat-template goes with -m (use --template alone otherwise)");
    if (!input) return cli_usage_error("template", "--input FILE.json is required");
    struct tm now_tm, *now = NULL;
    if (now_text) {
        if (pt_chat_template_parse_time(now_text, &now_tm) != PT_OK)
            return cli_usage_error("template", "--now: %s", pt_last_error());
        now = &now_tm;
    }
    char *json;
    size_t json_len;
    if (!strcmp(input, "-")) {
        json = read_stdin(&json_len);
        if (!json) {
            fprintf(stderr, "petrel template: error: cannot read stdin\n");
            return 1;
        }
    } else if (pt_read_file(input, &json, &json_len) != PT_OK)
        return cli_fail("template");
    pt_chat_template *t = NULL;
    pt_status st = model ? pt_chat_template_load(model, override, &t) : pt_chat_template_from_file(tmpl_path, &t);
    if (st != PT_OK) {
        free(json);
        return cli_fail("template");
    }
    char *out = NULL;
    size_t out_len = 0;
    st = pt_chat_template_render_json(t, json, json_len, now, &out, &out_len);
    free(json);
    pt_chat_template_free(&t);
    if (st != PT_OK) return cli_fail("template");
    int rc = fwrite(out, 1, out_len, stdout) == out_len ? 0 : 1;
    free(out);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}
