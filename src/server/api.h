/* Internal to src/server: the state the route handlers share, request-field
 * parsing common to the OpenAI and Anthropic APIs, and the generation stream
 * that turns a scheduler job into an HTTP response (buffered or SSE) in
 * either API's shape.
 */
#ifndef PT_SERVER_API_H
#define PT_SERVER_API_H

#include "server/engine.h"
#include "server/http.h"
#include "server/sched.h"
#include "server/server.h"

#include <cjson/cJSON.h>
#include <pthread.h>

/* Latency histogram buckets (seconds) for /metrics. */
#define PT_SRV_N_BUCKETS 12

typedef struct pt_srv_histogram {
    uint64_t count[PT_SRV_N_BUCKETS + 1]; /* last = +Inf */
    double sum;
    uint64_t n;
} pt_srv_histogram;

/* How the model's chat template writes a tool call (learned by probing it). */
typedef enum pt_tool_format {
    PT_TOOLS_UNKNOWN = 0,
    PT_TOOLS_QWEN,  /* <tool_call>{"name","arguments"}</tool_call> */
    PT_TOOLS_LLAMA, /* {"name","parameters"} */
    PT_TOOLS_GEMMA, /* ```tool_code name(...)``` */
} pt_tool_format;

struct pt_server {
    pt_srv_engine *e;
    pt_srv_sched *sched;
    pt_http_server *http;
    pt_server_params p;
    double t_start;

    pthread_mutex_t mu; /* metrics below */
    uint64_t http_by_class[6]; /* 1xx..5xx by status/100 */
    uint64_t n_429, n_cancelled, n_errors;
    uint64_t completions_ok;
    pt_srv_histogram h_request, h_ttft;
    pt_tool_format tool_format; /* valid once tool_format_known */
    int tool_format_known;
};

typedef enum { API_CHAT, API_COMPLETION, API_MESSAGES } pt_api_kind;

/* A request being turned into a job, with the options that shape its answer. */
typedef struct pt_gen {
    pt_api_kind kind;
    pt_srv_job *job;
    int stream;
    int include_usage;
    int logprobs, top_logprobs;
    int tools;    /* tool calls are parsed out of the reply */
    const char *call_prefix, *call_suffix; /* a forced tool call's markers, or NULL */
    char id[48];
    long created;
} pt_gen;

/* Validation failure: fills resp with a 400 and returns 0. */
int pt_api_bad(pt_http_response *resp, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses the body as a JSON object after checking UTF-8 (400 on failure). */
cJSON *pt_api_parse_body(const pt_http_request *req, pt_http_response *resp);

/* Sampling, stop, max-token and response_format fields common to the APIs,
 * applied to g->job. `anthropic` selects field names (stop_sequences). */
int pt_api_common_fields(pt_server *srv, const cJSON *root, pt_gen *g, int anthropic,
                         const char *path, pt_http_response *resp);

/* Tokenizes the prompt text into the job and checks it against the context. */
int pt_api_set_prompt(pt_server *srv, pt_gen *g, const char *text, int add_special,
                      const char *path, pt_http_response *resp);

/* Submits the job and answers: waits and calls finish_json for a buffered
 * response, or sets up the SSE stream. Takes over g->job. */
void pt_api_run(pt_server *srv, pt_gen *g, const pt_http_request *req, pt_http_response *resp);

/* Renders messages (an OpenAI-style array) through the chat template. */
int pt_api_render_chat(pt_server *srv, const cJSON *messages, const cJSON *tools,
                       const cJSON *kwargs, char **prompt, const char *path,
                       pt_http_response *resp);

/* Forced tool calls (api_tools.c): constrains g's job to one call of the
 * offered tools (only: NULL or the one name allowed). 400 in resp on failure. */
int pt_api_force_tool_call(pt_server *srv, pt_gen *g, const cJSON *tools, const char *only,
                           const char *path, pt_http_response *resp);
/* Appends a forced call's opening marker to the rendered prompt (realloc). 0 on OOM. */
int pt_api_prompt_with_prefix(const pt_gen *g, char **prompt);
pt_tool_format pt_api_tool_format(pt_server *srv);

/* Records a finished job in the metrics. */
void pt_api_record(pt_server *srv, pt_srv_job *job);

/* Route handlers (api_openai.c, api_anthropic.c). */
void pt_route_chat(void *user, const pt_http_request *req, pt_http_response *resp);
void pt_route_completions(void *user, const pt_http_request *req, pt_http_response *resp);
void pt_route_messages(void *user, const pt_http_request *req, pt_http_response *resp);

/* Response builders for a finished job, per API (used buffered and at the
 * end of a stream). */
char *pt_api_openai_response(pt_server *srv, pt_gen *g);
char *pt_api_anthropic_response(pt_server *srv, pt_gen *g);

#endif
