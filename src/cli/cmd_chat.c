/* petrel chat: an interactive conversation with the model's chat template.
 * Each stdin line is a user message; the whole history is rendered with the
 * template every turn, and only the tokens after the longest prefix the
 * session already holds are run (the KV cache is reused across turns).
 * Works with stdin as a pipe (one message per line), for scripts and tests. */
#include "cli/args.h"
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: petrel chat -m DIR [options]\n\n"
            "Interactive chat: type a message and press enter; the reply streams to stdout.\n"
            "The conversation is kept and rendered with the model's chat template each turn.\n"
            "Commands: /reset forgets the conversation, /exit (or end of input) quits.\n\n"
            "  --system TEXT        a system message at the start of the conversation\n"
            "  -h, --help           this help\n");
    cli_sampling_help(f);
    cli_common_help(f);
}

typedef struct {
    char *buf;
    size_t len, cap;
} reply_buf;

static int on_token(void *user, const pt_token_info *tok, const char *text, size_t len) {
    (void)tok;
    reply_buf *r = user;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (r->len + len + 1 > r->cap) {
            size_t cap = (r->len + len + 1) * 2;
            char *nb = realloc(r->buf, cap);
            if (!nb) return 1;
            r->buf = nb;
            r->cap = cap;
        }
        memcpy(r->buf + r->len, text, len);
        r->len += len;
        r->buf[r->len] = 0;
    }
    return 0;
}

static void add_msg(cJSON *hist, const char *role, const char *content) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", role);
    cJSON_AddStringToObject(o, "content", content);
    cJSON_AddItemToArray(hist, o);
}

int cmd_chat(int argc, char **argv) {
    const char *cmd = "chat";
    cli_common c;
    cli_sampling smp;
    if (cli_common_init(&c, cmd)) return 2;
    cli_sampling_init(&smp);
    const char *system = NULL;
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
        if ((v = cli_flag_value("--system", argc, argv, &i, &missing))) system = v;
        else if (missing) return cli_usage_error(cmd, "%s needs a value", a);
        else return cli_usage_error(cmd, "unknown option '%s'", a);
    }
    pt_model *m;
    pt_session *s;
    int rc = cli_load(cmd, &c, &m, &s);
    if (rc) return rc;
    rc = 1;
    cJSON *hist = cJSON_CreateArray();
    char *line = NULL;
    size_t cap = 0;
    if (!pt_model_has_tokenizer(m)) {
        fprintf(stderr, "petrel %s: error: %s has no tokenizer (tokenizer.json); chat needs one\n", cmd, c.model_dir);
        goto done;
    }
    if (system) add_msg(hist, "system", system);
    {
        /* fail early when the model has no template */
        char *probe = NULL;
        if (pt_chat_render(m, "[]", 1, NULL, &probe) == PT_ERR_NOT_FOUND) {
            cli_fail(cmd);
            goto done;
        }
        pt_free(probe);
    }
    pt_generate_params gp = cli_sampling_apply(&smp, m);
    int tty = isatty(0);
    for (;;) {
        if (tty) {
            fputs("> ", stderr);
            fflush(stderr);
        }
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            cJSON_Delete(hist);
            hist = cJSON_CreateArray();
            if (system) add_msg(hist, "system", system);
            pt_session_truncate(s, 0);
            continue;
        }
        add_msg(hist, "user", line);
        char *js = cJSON_PrintUnformatted(hist), *rendered = NULL;
        pt_status st = js ? pt_chat_render(m, js, 1, NULL, &rendered) : PT_ERR_NOMEM;
        free(js);
        if (st != PT_OK) {
            cli_fail(cmd);
            goto done;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        st = pt_tokenize(m, rendered, strlen(rendered), 0, &ids, &n);
        pt_free(rendered);
        if (st != PT_OK) {
            cli_fail(cmd);
            goto done;
        }
        /* reuse the longest common prefix of the cache; always run at least one token */
        const int32_t *have = pt_session_tokens(s);
        size_t k = 0, nh = pt_session_n_tokens(s);
        while (k < nh && k < n && have[k] == ids[k]) k++;
        if (k == n && k > 0) k--;
        pt_session_truncate(s, k);
        reply_buf reply = {0};
        pt_finish_reason fin;
        pt_generate_stats stats;
        st = pt_generate(s, ids + k, n - k, &gp, on_token, &reply, &fin, &stats);
        pt_free(ids);
        printf("\n");
        fflush(stdout);
        if (st != PT_OK) {
            free(reply.buf);
            cli_fail(cmd);
            goto done;
        }
        add_msg(hist, "assistant", reply.buf ? reply.buf : "");
        free(reply.buf);
        fprintf(stderr, "[%zu prompt tokens (%zu reused), %zu generated, %.2f tok/s]\n", n, k, stats.n_generated,
                stats.generate_seconds > 0 ? stats.n_generated / stats.generate_seconds : 0.0);
    }
    rc = 0;
done:
    free(line);
    cJSON_Delete(hist);
    pt_session_free(&s);
    pt_model_free(&m);
    return rc;
}
