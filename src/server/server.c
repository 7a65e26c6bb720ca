/* The server: route table, utility endpoints (/health, /v1, /v1/models,
 * /metrics, /tokenize, /detokenize) and start/stop. The generation routes
 * are in api_openai.c and api_anthropic.c. */
#include "server/server.h"

#include "base/error.h"
#include "base/json.h"
#include "server/api.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

pt_server_params pt_server_default_params(void) {
    pt_server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.n_parallel = 4;
    p.max_queue = 64;
    p.prompt_cache_gib = 2;
    p.max_body = (size_t)16 << 20;
    p.timeout_s = 600;
    return p;
}

static void route_health(void *user, const pt_http_request *req, pt_http_response *resp) {
    (void)user;
    (void)req;
    pt_http_json(resp, 200, strdup("{\"status\":\"ok\"}"));
}

static void route_models(void *user, const pt_http_request *req, pt_http_response *resp) {
    (void)req;
    pt_server *srv = user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(r, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->e->model_id(srv->e->model));
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(long)srv->t_start);
    cJSON_AddStringToObject(m, "owned_by", "petrel");
    cJSON_AddNumberToObject(m, "context_length", pt_srv_sched_n_ctx(srv->sched));
    /* Anthropic's model list shape, for its clients */
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddStringToObject(m, "display_name", srv->e->model_id(srv->e->model));
    cJSON_AddItemToArray(data, m);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    pt_http_json(resp, 200, s);
}

static const struct {
    const char *method, *path, *what;
} endpoints[] = {
    {"POST", "/v1/chat/completions", "OpenAI chat completions (stream with \"stream\": true)"},
    {"POST", "/v1/completions", "OpenAI text completions"},
    {"POST", "/v1/messages", "Anthropic Messages API"},
    {"GET", "/v1/models", "the loaded model"},
    {"GET", "/v1", "this list"},
    {"GET", "/health", "liveness (no API key needed)"},
    {"GET", "/metrics", "Prometheus metrics"},
    {"POST", "/tokenize", "{\"content\": str, \"add_special\": bool} -> {\"tokens\": [int]}"},
    {"POST", "/detokenize", "{\"tokens\": [int]} -> {\"content\": str}"},
};

static void route_index(void *user, const pt_http_request *req, pt_http_response *resp) {
    (void)req;
    pt_server *srv = user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "name", "petrel");
    cJSON_AddStringToObject(r, "version", pt_version());
    cJSON_AddStringToObject(r, "model", srv->e->model_id(srv->e->model));
    cJSON *arr = cJSON_AddArrayToObject(r, "endpoints");
    for (size_t i = 0; i < sizeof endpoints / sizeof endpoints[0]; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "method", endpoints[i].method);
        cJSON_AddStringToObject(e, "path", endpoints[i].path);
        cJSON_AddStringToObject(e, "description", endpoints[i].what);
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    pt_http_json(resp, 200, s);
}

static void hist(pt_sbuf *b, const char *name, const char *help, const pt_srv_histogram *h) {
    static const char *le[PT_SRV_N_BUCKETS] = {"0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                                               "0.5",   "1",    "2.5",   "5",    "10",  "30"};
    pt_sbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < PT_SRV_N_BUCKETS; i++) {
        cum += h->count[i];
        pt_sbuf_printf(b, "%s_bucket{le=\"%s\"} %llu\n", name, le[i], (unsigned long long)cum);
    }
    cum += h->count[PT_SRV_N_BUCKETS];
    pt_sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                   (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
}

static void counter(pt_sbuf *b, const char *name, const char *help, const char *type, double v) {
    pt_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void route_metrics(void *user, const pt_http_request *req, pt_http_response *resp) {
    (void)req;
    pt_server *srv = user;
    pt_srv_sched_stats st;
    pt_srv_sched_get_stats(srv->sched, &st);
    pthread_mutex_lock(&srv->mu);
    pt_server snap = *srv; /* counters only */
    pthread_mutex_unlock(&srv->mu);
    pt_sbuf *b = &resp->body;
    pt_sbuf_adds(b, "# HELP petrel_http_responses_total HTTP responses by status class.\n"
                    "# TYPE petrel_http_responses_total counter\n");
    for (int c = 1; c <= 5; c++)
        pt_sbuf_printf(b, "petrel_http_responses_total{code=\"%dxx\"} %llu\n", c,
                       (unsigned long long)snap.http_by_class[c]);
    counter(b, "petrel_requests_completed_total", "Generation requests that finished normally.",
            "counter", (double)snap.completions_ok);
    counter(b, "petrel_requests_cancelled_total", "Generation requests cancelled by a client disconnect.",
            "counter", (double)snap.n_cancelled);
    counter(b, "petrel_requests_failed_total", "Generation requests that failed during generation.",
            "counter", (double)snap.n_errors);
    counter(b, "petrel_requests_rejected_total", "Requests refused with 429 (queue full).", "counter",
            (double)snap.n_429);
    counter(b, "petrel_prompt_tokens_total", "Prompt tokens of admitted requests.", "counter",
            (double)st.prompt_tokens);
    counter(b, "petrel_generated_tokens_total", "Tokens generated.", "counter",
            (double)st.generated_tokens);
    counter(b, "petrel_prompt_cache_hits_total", "Requests that reused a cached prompt prefix.",
            "counter", (double)st.cache_hits);
    counter(b, "petrel_prompt_cache_reused_tokens_total", "Prompt tokens served from the prompt cache.",
            "counter", (double)st.cache_tokens_reused);
    counter(b, "petrel_prompt_cache_bytes", "Memory held by idle cached sessions.", "gauge",
            (double)st.idle_bytes);
    counter(b, "petrel_queue_depth", "Requests waiting for a slot.", "gauge", (double)st.n_queued);
    counter(b, "petrel_slots_busy", "Slots generating now.", "gauge", (double)st.n_active);
    counter(b, "petrel_slots_total", "Slots (--parallel).", "gauge", (double)srv->p.n_parallel);
    hist(b, "petrel_request_duration_seconds", "Generation request latency, submit to last token.",
         &snap.h_request);
    hist(b, "petrel_time_to_first_token_seconds", "Submit to first generated token.", &snap.h_ttft);
    /* continuous batching: how many slots each decode step carried */
    pt_sbuf_adds(b, "# HELP petrel_batch_size Slots decoded together per decode step.\n"
                    "# TYPE petrel_batch_size histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < PT_SRV_BATCH_BUCKETS; i++) {
        cum += st.batch_hist[i];
        pt_sbuf_printf(b, "petrel_batch_size_bucket{le=\"%d\"} %llu\n", 1 << i, (unsigned long long)cum);
    }
    cum += st.batch_hist[PT_SRV_BATCH_BUCKETS];
    pt_sbuf_printf(b, "petrel_batch_size_bucket{le=\"+Inf\"} %llu\npetrel_batch_size_sum %llu\npetrel_batch_size_count %llu\n",
                   (unsigned long long)cum, (unsigned long long)st.batch_rows, (unsigned long long)st.batch_steps);
    counter(b, "petrel_prompt_rows_total", "Prompt tokens run as rows of the batched steps.", "counter",
            (double)st.prompt_rows);
    counter(b, "petrel_prompt_row_steps_total", "Batched steps that carried prompt rows.", "counter",
            (double)st.prompt_row_steps);
    counter(b, "petrel_scheduler_turns_total", "Scheduler turns that had slots to run.", "counter", (double)st.turns);
    counter(b, "petrel_pipelined_turns_total",
            "Turns whose next step ran on the GPU while their tokens were handed out.", "counter",
            (double)st.piped_turns);
    pt_sbuf_adds(b, "# HELP petrel_scheduler_seconds_total Seconds of those turns by phase.\n"
                    "# TYPE petrel_scheduler_seconds_total counter\n");
    static const char *const phase[3] = {"sample", "tokens", "step"};
    for (int i = 0; i < 3; i++)
        pt_sbuf_printf(b, "petrel_scheduler_seconds_total{phase=\"%s\"} %.6f\n", phase[i], st.phase_s[i]);
    resp->status = 200;
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

static void route_tokenize(void *user, const pt_http_request *req, pt_http_response *resp) {
    pt_server *srv = user;
    cJSON *root = pt_api_parse_body(req, resp);
    if (!root) return;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    int add_special = pt_json_get_bool(root, "add_special");
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    if (!cJSON_IsString(content)) {
        pt_api_bad(resp, req->path, "'content': expected a string");
    } else if (as && !cJSON_IsBool(as)) {
        pt_api_bad(resp, req->path, "'add_special': expected true or false");
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        if (srv->e->tokenize(srv->e->model, content->valuestring, strlen(content->valuestring),
                             add_special == 1, &ids, &n) != PT_OK) {
            pt_api_bad(resp, req->path, "tokenize: %s", pt_last_error());
        } else {
            cJSON *r = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(r, "tokens");
            for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            free(ids);
            char *s = cJSON_PrintUnformatted(r);
            cJSON_Delete(r);
            pt_http_json(resp, 200, s);
        }
    }
    cJSON_Delete(root);
}

static void route_detokenize(void *user, const pt_http_request *req, pt_http_response *resp) {
    pt_server *srv = user;
    cJSON *root = pt_api_parse_body(req, resp);
    if (!root) return;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int vocab = srv->e->vocab_size(srv->e->model);
    int n = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n < 0) {
        pt_api_bad(resp, req->path, "'tokens': expected an array of token ids");
        goto done;
    }
    int i = 0;
    for (const cJSON *e = toks->child; e; e = e->next, i++) {
        int64_t v;
        char what[48];
        snprintf(what, sizeof what, "'tokens[%d]'", i);
        if (pt_json_to_i64(e, 0, vocab - 1, &v, what) != PT_OK) {
            pt_api_bad(resp, req->path, "%s", pt_last_error());
            goto done;
        }
        ids[i] = (int32_t)v;
    }
    char *text = NULL;
    if (srv->e->detokenize(srv->e->model, ids, (size_t)n, 0, &text) != PT_OK) {
        pt_api_bad(resp, req->path, "detokenize: %s", pt_last_error());
        goto done;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "content", text ? text : "");
    free(text);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    pt_http_json(resp, 200, s);
done:
    free(ids);
    cJSON_Delete(root);
}

static const pt_http_route routes[] = {
    {"POST", "/v1/chat/completions", pt_route_chat, 0},
    {"POST", "/v1/completions", pt_route_completions, 0},
    {"POST", "/v1/messages", pt_route_messages, 0},
    {"GET", "/v1/models", route_models, 0},
    {"GET", "/v1", route_index, 0},
    {"GET", "/health", route_health, 1},
    {"GET", "/metrics", route_metrics, 0},
    {"POST", "/tokenize", route_tokenize, 0},
    {"POST", "/detokenize", route_detokenize, 0},
};

static void on_status(void *user, int status) {
    pt_server *srv = user;
    int c = status / 100;
    if (c < 1 || c > 5) return;
    pthread_mutex_lock(&srv->mu);
    srv->http_by_class[c]++;
    pthread_mutex_unlock(&srv->mu);
}

pt_status pt_server_start(pt_srv_engine *engine, const pt_server_params *p, pt_server **out) {
    *out = NULL;
    if (p->prompt_cache_gib < 0 || p->prompt_cache_gib > 1 << 20)
        return pt_error(PT_ERR_INVALID_ARG, "--prompt-cache %g: expected GiB >= 0", p->prompt_cache_gib);
    pt_server *srv = calloc(1, sizeof *srv);
    if (!srv) return pt_error(PT_ERR_NOMEM, "out of memory");
    srv->e = engine;
    srv->p = *p;
    srv->t_start = (double)time(NULL);
    pthread_mutex_init(&srv->mu, NULL);
    size_t cache = (size_t)(p->prompt_cache_gib * 1073741824.0);
    pt_status st = pt_srv_sched_create(engine, p->n_parallel, p->max_queue, cache, p->n_ctx, &srv->sched);
    if (st != PT_OK) {
        pthread_mutex_destroy(&srv->mu);
        free(srv);
        return st;
    }
    pt_http_config hc = {
        .host = p->host,
        .port = p->port,
        .api_key = p->api_key,
        .max_body = p->max_body,
        .max_connections = 1024,
        .timeout_s = p->timeout_s,
        .on_status = on_status,
    };
    st = pt_http_start(&hc, routes, (int)(sizeof routes / sizeof routes[0]), srv, &srv->http);
    if (st != PT_OK) {
        pt_srv_sched_free(&srv->sched);
        pthread_mutex_destroy(&srv->mu);
        free(srv);
        return st;
    }
    *out = srv;
    return PT_OK;
}

int pt_server_port(const pt_server *s) { return pt_http_port(s->http); }

void pt_server_stop(pt_server **ps) {
    pt_server *s = *ps;
    if (!s) return;
    /* the scheduler first: it ends every job, which releases any connection
     * thread waiting on one, so the HTTP daemon can then join them */
    pt_srv_sched_free(&s->sched);
    pt_http_stop(&s->http);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *ps = NULL;
}
