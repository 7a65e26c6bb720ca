/* petrel generate: a prompt (text or ids) in, streamed text out, a stats
 * line on stderr. */
#include "cli/args.h"
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: petrel generate -m DIR (-p TEXT | --prompt-ids 1,2,3) [options]\n\n"
            "Generates text from a prompt and streams it to stdout; a stats line (prompt and\n"
            "generation tokens/s, time to first token) goes to stderr.\n\n"
            "prompt:\n"
            "  -p, --prompt TEXT        the prompt text (tokenized with the model's BOS/specials)\n"
            "  --prompt-ids IDS         token ids (\"1,2,3\" or \"1 2 3\"), used verbatim: no BOS added\n"
            "  --chat                   wrap -p TEXT as a user message in the chat template\n"
            "  --system TEXT            with --chat: a system message first\n"
            "output:\n"
            "  --print-ids              print the generated token ids (space-separated, one line)\n"
            "                           instead of the text (the default without a tokenizer)\n"
            "  --print-config           print the resolved device, threads, tier and levers, then exit\n"
            "  -h, --help               this help\n");
    cli_sampling_help(f);
    cli_common_help(f);
}

typedef struct {
    int print_ids;
    int n_printed;
} stream_ctx;

static int on_token(void *user, const pt_token_info *tok, const char *text, size_t len) {
    stream_ctx *c = user;
    if (c->print_ids) {
        if (tok->id >= 0) printf(c->n_printed++ ? " %d" : "%d", tok->id);
    } else if (len) {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return 0;
}

/* Renders [{system}, {user: text}] with the chat template. */
static int chat_prompt(pt_model *m, const char *system, const char *text, char **out) {
    cJSON *msgs = cJSON_CreateArray();
    if (system) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "role", "system");
        cJSON_AddStringToObject(s, "content", system);
        cJSON_AddItemToArray(msgs, s);
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", text);
    cJSON_AddItemToArray(msgs, u);
    char *js = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    if (!js) return 0;
    pt_status st = pt_chat_render(m, js, 1, NULL, out);
    free(js);
    return st == PT_OK;
}

int cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    cli_common c;
    cli_sampling smp;
    if (cli_common_init(&c, cmd)) return 2;
    cli_sampling_init(&smp);
    const char *prompt = NULL, *ids_arg = NULL, *system = NULL;
    int chat = 0, print_ids = 0, print_config = 0;
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
        r = cli_sampling_parse(&smp, cmd, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if ((v = cli_flag_value("-p", argc, argv, &i, &missing)) ||
            (!missing && (v = cli_flag_value("--prompt", argc, argv, &i, &missing))))
            prompt = v;
        else if (!missing && (v = cli_flag_value("--prompt-ids", argc, argv, &i, &missing)))
            ids_arg = v;
        else if (!missing && (v = cli_flag_value("--system", argc, argv, &i, &missing)))
            system = v;
        else if (missing)
            return cli_usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--chat"))
            chat = 1;
        else if (!strcmp(a, "--print-ids"))
            print_ids = 1;
        else if (!strcmp(a, "--print-config"))
            print_config = 1;
        else
            return cli_usage_error(cmd, "unknown option '%s'", a);
    }
    if (print_config) {
        cli_print_config(stdout, &c);
        return 0;
    }
    if (chat && ids_arg) return cli_usage_error(cmd, "--chat applies to -p TEXT, not to --prompt-ids");
    int32_t *ids;
    size_t n_ids;
    pt_model *m;
    pt_session *s;
    int rc = cli_load_prompt(cmd, &c, prompt, ids_arg, &ids, &n_ids, &m, &s);
    if (rc) return rc;
    rc = 1;
    if (prompt) {
        char *rendered = NULL;
        const char *text = prompt;
        if (chat) {
            if (!chat_prompt(m, system, prompt, &rendered)) {
                cli_fail(cmd);
                goto done;
            }
            text = rendered;
        }
        /* a rendered template already holds its special tokens */
        pt_status st = pt_tokenize(m, text, strlen(text), !chat, &ids, &n_ids);
        free(rendered);
        if (st != PT_OK) {
            cli_fail(cmd);
            goto done;
        }
        if (n_ids == 0) {
            fprintf(stderr, "petrel %s: error: the prompt tokenizes to no tokens\n", cmd);
            goto done;
        }
    }
    if (!print_ids && !pt_model_has_tokenizer(m)) {
        fprintf(stderr, "petrel %s: note: the model has no tokenizer; printing token ids\n", cmd);
        print_ids = 1;
    }
    pt_generate_params gp = cli_sampling_apply(&smp, m);
    stream_ctx sc = {.print_ids = print_ids};
    pt_finish_reason fin;
    pt_generate_stats stats;
    if (pt_generate(s, ids, n_ids, &gp, on_token, &sc, &fin, &stats) != PT_OK) {
        if (sc.n_printed || !print_ids) printf("\n");
        cli_fail(cmd);
        goto done;
    }
    printf("\n");
    fflush(stdout);
    double pp = stats.prompt_seconds > 0 ? stats.n_prompt / stats.prompt_seconds : 0;
    double tg = stats.generate_seconds > 0 ? stats.n_generated / stats.generate_seconds : 0;
    static const char *const reasons[] = {"length", "eos", "stop", "cancelled"};
    fprintf(stderr,
            "prompt: %zu tokens, %.2f tok/s | generation: %zu tokens, %.2f tok/s | first token: %.1f ms | "
            "finish: %s | %s\n",
            stats.n_prompt, pp, stats.n_generated, tg, stats.first_token_seconds * 1e3, reasons[fin],
            pt_model_backend_name(m));
    rc = 0;
done:
    free(ids);
    pt_session_free(&s);
    pt_model_free(&m);
    return rc;
}
