/* petrel serve — the OpenAI/Anthropic-compatible HTTP server (src/server/).
 * Parses flags, loads the model, starts the server and waits for SIGINT or
 * SIGTERM. Every endpoint is described in docs/server.md. */
#include "cli/args.h"
#include "cli/cli.h"

#include "petrel.h"
#include "server/engine.h"
#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: petrel serve -m MODEL_DIR [options]\n\n"
            "OpenAI- and Anthropic-compatible HTTP server. Endpoints: POST /v1/chat/completions,\n"
            "POST /v1/completions, POST /v1/messages, GET /v1/models, GET /v1, GET /health,\n"
            "GET /metrics, POST /tokenize, POST /detokenize (docs/server.md).\n\n"
            "server options:\n"
            "  --host ADDR          bind address (default 127.0.0.1; 0.0.0.0 exposes the server)\n"
            "  --port N             TCP port (default 8080; 0 = any free port, printed at start)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' (or x-api-key) on every\n"
            "                       endpoint but /health; env PETREL_API_KEY\n"
            "  --parallel N         requests generated at once, their tokens in one batched step (default 4)\n"
            "  --queue N            requests allowed to wait for a slot; beyond: 429 (default 64)\n"
            "  --prompt-cache GIB   memory for idle sessions kept for prefix reuse (default 2)\n"
            "  --max-body MB        largest request body; larger gets 413 (default 16)\n"
            "  --timeout S          drop a connection idle for S seconds (default 600)\n"
            "  --ctx N              context per slot (default: min(model max, 4096))\n\n"
            "environment:\n"
            "  PETREL_PROMPT_ROWS=N a joining request's prompt of at most N tokens runs as rows of\n"
            "                       the batched decode steps beside the running streams (0..1024;\n"
            "                       default 64 on CUDA, 0 on the CPU; docs/batching.md)\n"
            "  PETREL_SERVE_PIPELINE=0|1 run each turn's next step on the GPU while the turn's\n"
            "                       tokens are handed out (same replies; default 1 on CUDA, 0 on\n"
            "                       the CPU; docs/batching.md \"Pipelined turns\")\n\n");
    cli_common_help(f);
}

int cmd_serve(int argc, char **argv) {
    cli_common c;
    if (cli_common_init(&c, "serve")) return 2;
    pt_server_params p = pt_server_default_params();
    const char *env_key = getenv("PETREL_API_KEY");
    if (env_key && *env_key) p.api_key = env_key;
    int max_body_mb = 16;
    float cache_gib = (float)p.prompt_cache_gib;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        int r = cli_common_parse(&c, "serve", argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        int missing = 0;
        const char *v;
        if ((v = cli_flag_value("--host", argc, argv, &i, &missing))) p.host = v;
        else if ((v = cli_flag_value("--port", argc, argv, &i, &missing))) {
            if (!cli_parse_int("serve", "--port", v, 0, 65535, &p.port)) return 2;
        } else if ((v = cli_flag_value("--api-key", argc, argv, &i, &missing))) {
            if (!*v) return cli_usage_error("serve", "--api-key: empty key");
            p.api_key = v;
        } else if ((v = cli_flag_value("--parallel", argc, argv, &i, &missing))) {
            if (!cli_parse_int("serve", "--parallel", v, 1, 256, &p.n_parallel)) return 2;
        } else if ((v = cli_flag_value("--queue", argc, argv, &i, &missing))) {
            if (!cli_parse_int("serve", "--queue", v, 0, 100000, &p.max_queue)) return 2;
        } else if ((v = cli_flag_value("--prompt-cache", argc, argv, &i, &missing))) {
            if (!cli_parse_float("serve", "--prompt-cache", v, 0, 1 << 20, &cache_gib)) return 2;
        } else if ((v = cli_flag_value("--max-body", argc, argv, &i, &missing))) {
            if (!cli_parse_int("serve", "--max-body", v, 1, 4096, &max_body_mb)) return 2;
        } else if ((v = cli_flag_value("--timeout", argc, argv, &i, &missing))) {
            if (!cli_parse_int("serve", "--timeout", v, 1, 86400, &p.timeout_s)) return 2;
        } else if (missing) {
            return cli_usage_error("serve", "%s needs a value", argv[i]);
        } else {
            return cli_usage_error("serve", "unknown option '%s'", argv[i]);
        }
        if (missing) return cli_usage_error("serve", "%s needs a value", argv[i]);
    }
    if (!c.model_dir) return cli_usage_error("serve", "-m MODEL_DIR is required");
    p.prompt_cache_gib = cache_gib;
    p.max_body = (size_t)max_body_mb << 20;
    p.n_ctx = c.n_ctx;

    /* SIGINT/SIGTERM are taken by sigwait below; every thread started from
     * here on inherits the blocked mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pt_model *model = NULL;
    if (pt_model_load(c.model_dir, &c.mp, &model) != PT_OK) return cli_fail("serve");
    if (!pt_model_has_tokenizer(model)) {
        fprintf(stderr, "petrel serve: error: %s has no tokenizer.json; the server needs one\n", c.model_dir);
        pt_model_free(&model);
        return 1;
    }
    pt_srv_engine engine;
    pt_server *srv = NULL;
    if (pt_srv_engine_from_model(&engine, model, c.model_dir) != PT_OK ||
        pt_server_start(&engine, &p, &srv) != PT_OK) {
        int rc = cli_fail("serve");
        pt_srv_engine_release(&engine);
        pt_model_free(&model);
        return rc;
    }
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ready = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    int v6 = strchr(p.host, ':') != NULL; /* an IPv6 address goes in brackets in a URL */
    fprintf(stderr,
            "petrel serve: ready on http://%s%s%s:%d  model %s  backend %s  parallel %d  queue %d  "
            "(%.3f s to ready)%s\n",
            v6 ? "[" : "", p.host, v6 ? "]" : "", pt_server_port(srv), pt_model_id(model), pt_model_backend_name(model), p.n_parallel,
            p.max_queue, ready, p.api_key ? "  API key required" : "");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "petrel serve: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    pt_server_stop(&srv);
    pt_srv_engine_release(&engine);
    pt_model_free(&model);
    return 0;
}
