/* libFuzzer target over the server's request-body handling: the first input
 * byte picks a route (chat completions, completions, Anthropic messages) and
 * the rest is the request body, handed to the route handler exactly as the
 * HTTP layer would (UTF-8 check, JSON parse, field validation, chat template,
 * tokenization, constrained-decoding schema compilation, generation through
 * the real scheduler on the byte-level test model, response or SSE stream
 * building). The same bytes also go through the tool-call parser and, when
 * they are JSON, the schema compiler and matcher. Must never crash, leak or
 * read out of bounds. */
#include "../tests/test_server_engine.h"
#include "server/api.h"
#include "server/json_schema.h"
#include "server/toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static tm_model model = {.max_ctx = 96};
static pt_srv_engine engine;
static pt_server *srv;

static void drain(pt_http_response *r) {
    if (r->stream) {
        char buf[4096];
        for (int guard = 0; guard < 100000; guard++)
            if (r->stream(r->stream_ctx, buf, sizeof buf) <= 0) break;
        r->stream_free(r->stream_ctx);
    }
    pt_sbuf_free(&r->body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv) {
        tm_engine(&engine, &model);
        pt_server_params p = pt_server_default_params();
        p.port = 0;
        p.n_parallel = 2;
        if (pt_server_start(&engine, &p, &srv) != PT_OK) abort();
    }
    if (size < 1) return 0;
    char *body = malloc(size);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    body[size - 1] = 0;
    static const char *paths[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages"};
    int route = data[0] % 3;
    pt_http_request req = {.method = "POST", .path = paths[route], .body = body, .body_len = size - 1, .fd = -1};
    pt_http_response resp = {0};
    if (route == 0) pt_route_chat(srv, &req, &resp);
    else if (route == 1) pt_route_completions(srv, &req, &resp);
    else pt_route_messages(srv, &req, &resp);
    drain(&resp);

    pt_tool_call *calls = NULL;
    char *content = NULL;
    int n = pt_toolcall_parse(body, size - 1, &calls, &content);
    pt_toolcall_free(calls, n > 0 ? n : 0);
    free(content);
    int in_call;
    pt_toolcall_stream_safe(body, size - 1, &in_call);

    cJSON *j = cJSON_ParseWithLength(body, size - 1);
    if (j) {
        pt_jschema *s = NULL;
        if (pt_jschema_compile(j, &s) == PT_OK) {
            pt_jsm m;
            pt_jsm_init(&m, s);
            pt_jsm_feed(&m, body, size - 1);
            pt_jsm_accepts(&m);
            pt_jschema_free(&s);
        }
        cJSON_Delete(j);
    }
    free(body);
    return 0;
}
