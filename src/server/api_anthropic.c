/* Anthropic Messages API: POST /v1/messages.
 *
 * The request is translated into the OpenAI-style message list the chat
 * template takes: system (string or text blocks) becomes a system message;
 * tool_use blocks become an assistant message's tool_calls; tool_result
 * blocks become role "tool" messages; tools' input_schema becomes
 * function.parameters. Image and document blocks are refused (400).
 */
#include "server/api.h"

#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Text of a content value: a string or an array of text blocks. */
static int block_text(const cJSON *c, pt_sbuf *out, const char *where, const char *path,
                      pt_http_response *resp) {
    if (cJSON_IsString(c)) {
        pt_sbuf_adds(out, c->valuestring);
        return 1;
    }
    if (!cJSON_IsArray(c)) return pt_api_bad(resp, path, "'%s': expected a string or an array of blocks", where);
    int k = 0;
    for (const cJSON *b = c->child; b; b = b->next, k++) {
        const char *type = pt_json_get_str(b, "type");
        const char *txt = pt_json_get_str(b, "text");
        if (!type || strcmp(type, "text") || !txt)
            return pt_api_bad(resp, path, "'%s[%d]': expected a text block", where, k);
        pt_sbuf_adds(out, txt);
    }
    return 1;
}

static cJSON *convert_messages(const cJSON *root, const char *path, pt_http_response *resp) {
    cJSON *out = cJSON_CreateArray();
    const cJSON *system = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (system && !cJSON_IsNull(system)) {
        pt_sbuf b = {0};
        if (!block_text(system, &b, "system", path, resp)) {
            pt_sbuf_free(&b);
            cJSON_Delete(out);
            return NULL;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", b.data ? b.data : "");
        cJSON_AddItemToArray(out, m);
        pt_sbuf_free(&b);
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        cJSON_Delete(out);
        pt_api_bad(resp, path, "'messages': expected a non-empty array");
        return NULL;
    }
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const char *role = pt_json_get_str(m, "role");
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
            cJSON_Delete(out);
            pt_api_bad(resp, path, "'messages[%d].role': expected user or assistant", i);
            return NULL;
        }
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        pt_sbuf text = {0};
        cJSON *calls = NULL;
        char where[64];
        if (cJSON_IsString(c)) {
            pt_sbuf_adds(&text, c->valuestring);
        } else if (cJSON_IsArray(c)) {
            int k = 0;
            for (const cJSON *b = c->child; b; b = b->next, k++) {
                const char *type = pt_json_get_str(b, "type");
                snprintf(where, sizeof where, "messages[%d].content[%d]", i, k);
                if (type && !strcmp(type, "text") && pt_json_get_str(b, "text")) {
                    pt_sbuf_adds(&text, pt_json_get_str(b, "text"));
                } else if (type && !strcmp(type, "tool_use") && !strcmp(role, "assistant") &&
                           pt_json_get_str(b, "name")) {
                    if (!calls) calls = cJSON_CreateArray();
                    cJSON *tc = cJSON_CreateObject();
                    const char *id = pt_json_get_str(b, "id");
                    cJSON_AddStringToObject(tc, "id", id ? id : "");
                    cJSON_AddStringToObject(tc, "type", "function");
                    cJSON *fn = cJSON_AddObjectToObject(tc, "function");
                    cJSON_AddStringToObject(fn, "name", pt_json_get_str(b, "name"));
                    const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
                    cJSON_AddItemToObject(fn, "arguments",
                                          in ? cJSON_Duplicate(in, 1) : cJSON_CreateObject());
                    cJSON_AddItemToArray(calls, tc);
                } else if (type && !strcmp(type, "tool_result") && !strcmp(role, "user")) {
                    pt_sbuf r = {0};
                    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
                    if (rc && !cJSON_IsNull(rc) && !block_text(rc, &r, where, path, resp)) {
                        pt_sbuf_free(&r);
                        pt_sbuf_free(&text);
                        cJSON_Delete(out);
                        return NULL;
                    }
                    cJSON *tm = cJSON_CreateObject();
                    cJSON_AddStringToObject(tm, "role", "tool");
                    const char *id = pt_json_get_str(b, "tool_use_id");
                    cJSON_AddStringToObject(tm, "tool_call_id", id ? id : "");
                    cJSON_AddStringToObject(tm, "content", r.data ? r.data : "");
                    cJSON_AddItemToArray(out, tm);
                    pt_sbuf_free(&r);
                } else {
                    pt_sbuf_free(&text);
                    cJSON_Delete(calls);
                    cJSON_Delete(out);
                    pt_api_bad(resp, path,
                               "'%s': block type '%s' is not supported here (text, tool_use in "
                               "assistant turns, tool_result in user turns)",
                               where, type ? type : "(none)");
                    return NULL;
                }
            }
        } else {
            cJSON_Delete(out);
            pt_api_bad(resp, path, "'messages[%d].content': expected a string or an array of blocks", i);
            return NULL;
        }
        if (text.len || calls || cJSON_IsString(c)) {
            cJSON *om = cJSON_CreateObject();
            cJSON_AddStringToObject(om, "role", role);
            cJSON_AddStringToObject(om, "content", text.data ? text.data : "");
            if (calls) cJSON_AddItemToObject(om, "tool_calls", calls);
            cJSON_AddItemToArray(out, om);
        }
        pt_sbuf_free(&text);
    }
    return out;
}

static cJSON *convert_tools(const cJSON *root, const char *path, pt_http_response *resp, int *bad,
                            int *forced, const char **only) {
    *bad = 0;
    *forced = 0;
    *only = NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!t || cJSON_IsNull(t)) return NULL;
    if (!cJSON_IsArray(t)) {
        *bad = 1;
        pt_api_bad(resp, path, "'tools': expected an array");
        return NULL;
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const char *tct = cJSON_IsObject(tc) ? pt_json_get_str(tc, "type") : NULL;
    if (tc && !cJSON_IsNull(tc) && (!tct || (strcmp(tct, "auto") && strcmp(tct, "any") &&
                                             strcmp(tct, "tool") && strcmp(tct, "none")))) {
        *bad = 1;
        pt_api_bad(resp, path, "'tool_choice': expected {\"type\": auto|any|tool|none}");
        return NULL;
    }
    if (tct && !strcmp(tct, "none")) return NULL;
    if (tct && !strcmp(tct, "any")) *forced = 1;
    if (tct && !strcmp(tct, "tool")) {
        *only = pt_json_get_str(tc, "name");
        if (!*only) {
            *bad = 1;
            pt_api_bad(resp, path, "'tool_choice': {\"type\":\"tool\"} needs a \"name\"");
            return NULL;
        }
        *forced = 1;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *e = t->child; e; e = e->next, i++) {
        const char *name = pt_json_get_str(e, "name");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(e, "input_schema");
        if (!name || !cJSON_IsObject(schema)) {
            cJSON_Delete(out);
            *bad = 1;
            pt_api_bad(resp, path, "'tools[%d]': expected {\"name\":..., \"input_schema\":{...}}", i);
            return NULL;
        }
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(f, "function");
        cJSON_AddStringToObject(fn, "name", name);
        const char *desc = pt_json_get_str(e, "description");
        if (desc) cJSON_AddStringToObject(fn, "description", desc);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
        cJSON_AddItemToArray(out, f);
    }
    if (cJSON_GetArraySize(out) == 0) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

void pt_route_messages(void *user, const pt_http_request *req, pt_http_response *resp) {
    pt_server *srv = user;
    cJSON *root = pt_api_parse_body(req, resp);
    if (!root) return;
    static _Atomic unsigned long counter = 0;
    pt_gen g = {.kind = API_MESSAGES};
    snprintf(g.id, sizeof g.id, "msg_%08lx%08lx", (unsigned long)time(NULL) & 0xffffffffUL, ++counter);
    g.created = (long)time(NULL);
    g.job = pt_srv_job_new();
    cJSON *msgs = NULL, *tools = NULL;
    char *prompt = NULL;
    int bad = 0, forced = 0;
    const char *only = NULL;
    if (!g.job) {
        pt_http_error(resp, req->path, 500, "api_error", "out of memory");
        goto done;
    }
    if (!pt_api_common_fields(srv, root, &g, 1, req->path, resp)) goto done;
    if (!(msgs = convert_messages(root, req->path, resp))) goto done;
    tools = convert_tools(root, req->path, resp, &bad, &forced, &only);
    if (bad) goto done;
    g.tools = tools != NULL;
    if (tools && forced && !pt_api_force_tool_call(srv, &g, tools, only, req->path, resp)) goto done;
    if (!pt_api_render_chat(srv, msgs, tools, NULL, &prompt, req->path, resp)) goto done;
    if (!pt_api_prompt_with_prefix(&g, &prompt)) {
        pt_http_error(resp, req->path, 500, "api_error", "out of memory");
        goto done;
    }
    if (!pt_api_set_prompt(srv, &g, prompt, 0, req->path, resp)) goto done;
    pt_api_run(srv, &g, req, resp);
done:
    free(prompt);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    pt_srv_job_release(g.job);
    cJSON_Delete(root);
}
