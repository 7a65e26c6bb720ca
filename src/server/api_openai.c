/* OpenAI routes: POST /v1/chat/completions and POST /v1/completions.
 * Request parsing specific to each; everything shared is in api_common.c
 * and the answer (buffered or streamed) in api_stream.c. */
#include "server/api.h"

#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void new_id(pt_gen *g, const char *prefix) {
    static _Atomic unsigned long counter = 0;
    unsigned long n = ++counter;
    snprintf(g->id, sizeof g->id, "%s%08lx%08lx", prefix, (unsigned long)time(NULL) & 0xffffffffUL, n);
    g->created = (long)time(NULL);
}

/* tools: an array of {"type":"function","function":{"name",...}}; tool_choice
 * "none" hides them from the template (no call is wanted). */
static int parse_tools(const cJSON *root, const cJSON **tools, int *forced, const char **only,
                       const char *path, pt_http_response *resp) {
    *tools = NULL;
    *forced = 0;
    *only = NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!t || cJSON_IsNull(t)) return 1;
    if (!cJSON_IsArray(t)) return pt_api_bad(resp, path, "'tools': expected an array");
    int i = 0;
    for (const cJSON *e = t->child; e; e = e->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(e, "function");
        const char *type = pt_json_get_str(e, "type");
        if (!type || strcmp(type, "function") || !cJSON_IsObject(fn) || !pt_json_get_str(fn, "name"))
            return pt_api_bad(resp, path,
                              "'tools[%d]': expected {\"type\":\"function\",\"function\":{\"name\":...}}", i);
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc)) {
            const char *v = tc->valuestring;
            if (strcmp(v, "none") && strcmp(v, "auto") && strcmp(v, "required"))
                return pt_api_bad(resp, path, "'tool_choice': expected none, auto, required or an object");
            if (!strcmp(v, "none")) return 1;
            *forced = !strcmp(v, "required");
        } else if (cJSON_IsObject(tc)) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            *only = pt_json_get_str(fn, "name");
            if (!*only)
                return pt_api_bad(resp, path,
                                  "'tool_choice': expected {\"type\":\"function\",\"function\":{\"name\":...}}");
            *forced = 1;
        } else {
            return pt_api_bad(resp, path, "'tool_choice': expected none, auto, required or an object");
        }
    }
    if (cJSON_GetArraySize(t) > 0) *tools = t;
    return 1;
}

void pt_route_chat(void *user, const pt_http_request *req, pt_http_response *resp) {
    pt_server *srv = user;
    cJSON *root = pt_api_parse_body(req, resp);
    if (!root) return;
    pt_gen g = {.kind = API_CHAT};
    new_id(&g, "chatcmpl-");
    g.job = pt_srv_job_new();
    char *prompt = NULL;
    const cJSON *tools = NULL;
    const char *only = NULL;
    int forced = 0;
    if (!g.job) {
        pt_http_error(resp, req->path, 500, "server_error", "out of memory");
        goto done;
    }
    if (!pt_api_common_fields(srv, root, &g, 0, req->path, resp)) goto done;
    if (!parse_tools(root, &tools, &forced, &only, req->path, resp)) goto done;
    g.tools = tools != NULL;
    if (tools && forced && !pt_api_force_tool_call(srv, &g, tools, only, req->path, resp)) goto done;
    if (!pt_api_render_chat(srv, cJSON_GetObjectItemCaseSensitive(root, "messages"), tools,
                            cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs"), &prompt,
                            req->path, resp))
        goto done;
    if (!pt_api_prompt_with_prefix(&g, &prompt)) {
        pt_http_error(resp, req->path, 500, "server_error", "out of memory");
        goto done;
    }
    /* the template writes every special token itself (BOS included) */
    if (!pt_api_set_prompt(srv, &g, prompt, 0, req->path, resp)) goto done;
    pt_api_run(srv, &g, req, resp);
done:
    free(prompt);
    pt_srv_job_release(g.job);
    cJSON_Delete(root);
}

void pt_route_completions(void *user, const pt_http_request *req, pt_http_response *resp) {
    pt_server *srv = user;
    cJSON *root = pt_api_parse_body(req, resp);
    if (!root) return;
    pt_gen g = {.kind = API_COMPLETION};
    new_id(&g, "cmpl-");
    g.job = pt_srv_job_new();
    if (!g.job) {
        pt_http_error(resp, req->path, 500, "server_error", "out of memory");
        goto done;
    }
    if (!pt_api_common_fields(srv, root, &g, 0, req->path, resp)) goto done;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        if (!pt_api_set_prompt(srv, &g, p->valuestring, 1, req->path, resp)) goto done;
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(p->child)) {
        /* token ids, used verbatim */
        int n = cJSON_GetArraySize(p), vocab = srv->e->vocab_size(srv->e->model), i = 0;
        g.job->prompt = malloc((size_t)n * sizeof(int32_t));
        if (!g.job->prompt) {
            pt_http_error(resp, req->path, 500, "server_error", "out of memory");
            goto done;
        }
        for (const cJSON *e = p->child; e; e = e->next, i++) {
            int64_t v;
            char what[48];
            snprintf(what, sizeof what, "'prompt[%d]'", i);
            if (pt_json_to_i64(e, 0, vocab - 1, &v, what) != PT_OK) {
                pt_api_bad(resp, req->path, "%s (token ids must be within the vocabulary)", pt_last_error());
                goto done;
            }
            g.job->prompt[i] = (int32_t)v;
        }
        g.job->n_prompt = (size_t)n;
        if (n >= pt_srv_sched_n_ctx(srv->sched)) {
            pt_api_bad(resp, req->path, "the prompt has %d tokens; the context holds %d", n,
                       pt_srv_sched_n_ctx(srv->sched));
            goto done;
        }
    } else {
        pt_api_bad(resp, req->path, "'prompt': expected a string, a one-string array or an array of token ids");
        goto done;
    }
    pt_api_run(srv, &g, req, resp);
done:
    pt_srv_job_release(g.job);
    cJSON_Delete(root);
}
