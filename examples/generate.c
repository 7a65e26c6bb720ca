/* A minimal program embedding petrel through its public header only:
 * load a model, tokenize a prompt (or take ids), stream a greedy
 * continuation, print the stats, free everything.
 *
 *   build/examples/generate MODEL_DIR "prompt text" [max_tokens]
 *   build/examples/generate MODEL_DIR --ids 1,2,3 [max_tokens]
 *
 * Built by `make` (every examples/NAME.c) against build/libpetrel.a. */
#include "petrel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int on_token(void *user, const pt_token_info *tok, const char *text, size_t len) {
    int *print_ids = user;
    if (*print_ids) {
        if (tok->id >= 0) printf("%d ", tok->id);
    } else {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return 0; /* non-zero would stop generation */
}

static int fail(const char *what) {
    fprintf(stderr, "generate: %s: %s\n", what, pt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR (\"prompt\" | --ids 1,2,3) [max_tokens]\n", argv[0]);
        return 2;
    }
    int by_ids = !strcmp(argv[2], "--ids");
    const char *prompt = by_ids ? (argc > 3 ? argv[3] : "") : argv[2];
    int max_tokens = argc > (by_ids ? 4 : 3) ? atoi(argv[by_ids ? 4 : 3]) : 32;

    pt_model_params mp = pt_model_default_params();
    mp.n_threads = 1;
    pt_model *model = NULL;
    if (pt_model_load(argv[1], &mp, &model) != PT_OK) return fail("loading the model");

    int32_t *ids = NULL;
    size_t n = 0;
    if (by_ids) {
        ids = malloc((strlen(prompt) / 2 + 1) * sizeof *ids);
        for (char *p = (char *)prompt, *end; ids && *p; p = *end ? end + 1 : end) {
            ids[n++] = (int32_t)strtol(p, &end, 10);
            if (end == p) break;
        }
    } else if (pt_tokenize(model, prompt, strlen(prompt), 1, &ids, &n) != PT_OK) {
        pt_model_free(&model);
        return fail("tokenizing");
    }

    pt_session_params sp = pt_session_default_params();
    sp.n_ctx = 256;
    pt_session *session = NULL;
    if (pt_session_create(model, &sp, &session) != PT_OK) {
        pt_free(ids);
        pt_model_free(&model);
        return fail("creating a session");
    }
    pt_generate_params gp = pt_generate_default_params(model);
    gp.max_tokens = max_tokens;
    gp.sampling.temperature = 0; /* greedy */
    int print_ids = by_ids || !pt_model_has_tokenizer(model);
    pt_finish_reason finish;
    pt_generate_stats stats;
    pt_status st = pt_generate(session, ids, n, &gp, on_token, &print_ids, &finish, &stats);
    printf("\n");
    if (st == PT_OK)
        fprintf(stderr, "%zu prompt tokens, %zu generated (%.1f tok/s), finish %d, on %s\n", stats.n_prompt,
                stats.n_generated, stats.generate_seconds > 0 ? stats.n_generated / stats.generate_seconds : 0.0,
                (int)finish, pt_model_backend_name(model));
    pt_free(ids);
    pt_session_free(&session);
    pt_model_free(&model);
    return st == PT_OK ? 0 : fail("generating");
}
