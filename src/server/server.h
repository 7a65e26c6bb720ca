/* `petrel serve` as a library: the HTTP routes (OpenAI, Anthropic and
 * utility endpoints) over the scheduler and an engine table.
 *
 * Endpoints (docs/server.md describes each):
 *   POST /v1/chat/completions  POST /v1/completions  POST /v1/messages
 *   GET /v1/models  GET /v1  GET /health  GET /metrics
 *   POST /tokenize  POST /detokenize
 */
#ifndef PT_SERVER_SERVER_H
#define PT_SERVER_SERVER_H

#include "server/engine.h"

typedef struct pt_server pt_server;

typedef struct pt_server_params {
    const char *host;      /* default 127.0.0.1 */
    int port;              /* default 8080; 0 = ephemeral (pt_server_port) */
    const char *api_key;   /* NULL = open */
    int n_ctx;             /* per slot; 0 = engine default */
    int n_parallel;        /* default 4 */
    int max_queue;         /* default 64 */
    double prompt_cache_gib; /* default 2 */
    size_t max_body;       /* default 16 MiB */
    int timeout_s;         /* idle connection timeout, default 600 */
} pt_server_params;

pt_server_params pt_server_default_params(void);

/* Starts the scheduler and the HTTP listener. The engine must outlive the server. */
pt_status pt_server_start(pt_srv_engine *engine, const pt_server_params *p, pt_server **out);
int pt_server_port(const pt_server *s);
/* Stops listening, fails outstanding requests, frees everything. NULL-safe. */
void pt_server_stop(pt_server **s);

#endif
