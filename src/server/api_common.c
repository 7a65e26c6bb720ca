/* Request parsing shared by the OpenAI and Anthropic routes: body validation
 * (UTF-8, JSON object), sampling/stop/max-token/response_format fields,
 * chat-template rendering, tokenization and the context check.
 *
 * Every failure is a 400 whose message names the field and what was
 * expected; nothing here guesses a default for a malformed value.
 */
#include "server/api.h"

#include "base/error.h"
#include "base/json.h"
#include "server/json_schema.h"

#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int pt_api_bad(pt_http_response *resp, const char *path, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pt_http_error(resp, path, 400, "invalid_request_error", "%s", msg);
    return 0;
}

cJSON *pt_api_parse_body(const pt_http_request *req, pt_http_response *resp) {
    long bad = pt_utf8_invalid_offset(req->body, req->body_len);
    if (bad >= 0) {
        pt_api_bad(resp, req->path, "request body is not valid UTF-8 (invalid byte at offset %ld)", bad);
        return NULL;
    }
    if (req->body_len == 0) {
        pt_api_bad(resp, req->path, "request body is empty; expected a JSON object");
        return NULL;
    }
    cJSON *root = NULL;
    if (pt_json_parse(req->body, req->body_len, "request body", 1, &root) != PT_OK) {
        pt_api_bad(resp, req->path, "%s", pt_last_error());
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        pt_api_bad(resp, req->path, "request body: expected a JSON object");
        return NULL;
    }
    return root;
}

/* A number field within [lo, hi]: 1 present, 0 absent/null, -1 bad (resp set). */
static int get_num(const cJSON *root, const char *key, double lo, double hi, double *out,
                   const char *path, pt_http_response *resp) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        pt_api_bad(resp, path, "'%s': expected a number", key);
        return -1;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        pt_api_bad(resp, path, "'%s': %g is outside [%g, %g]", key, v->valuedouble, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

static int get_int(const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   const char *path, pt_http_response *resp) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    char what[80];
    snprintf(what, sizeof what, "'%s'", key);
    if (pt_json_to_i64(v, lo, hi, out, what) != PT_OK) {
        pt_api_bad(resp, path, "%s", pt_last_error());
        return -1;
    }
    return 1;
}

static int get_bool(const cJSON *root, const char *key, int *out, const char *path,
                    pt_http_response *resp) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) {
        pt_api_bad(resp, path, "'%s': expected true or false", key);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

static int set_stop(pt_srv_job *j, const cJSON *v, const char *key, const char *path,
                    pt_http_response *resp) {
    if (!v || cJSON_IsNull(v)) return 1;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0) return pt_api_bad(resp, path, "'%s': expected a string or an array of strings", key);
    if (n > 16) return pt_api_bad(resp, path, "'%s': %d stop strings (at most 16)", key, n);
    j->stop = calloc((size_t)n + 1, sizeof(char *));
    if (!j->stop) return pt_api_bad(resp, path, "out of memory");
    const cJSON *e = cJSON_IsString(v) ? v : v->child;
    for (int i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsString(e))
            return pt_api_bad(resp, path, "'%s[%d]': expected a string", key, i);
        if (!e->valuestring[0]) continue;
        j->stop[j->n_stop] = strdup(e->valuestring);
        if (!j->stop[j->n_stop]) return pt_api_bad(resp, path, "out of memory");
        j->n_stop++;
    }
    return 1;
}

static int set_response_format(pt_srv_job *j, const cJSON *rf, const char *path,
                               pt_http_response *resp) {
    if (!rf || cJSON_IsNull(rf)) return 1;
    if (!cJSON_IsObject(rf)) return pt_api_bad(resp, path, "'response_format': expected an object");
    const char *type = pt_json_get_str(rf, "type");
    if (!type) return pt_api_bad(resp, path, "'response_format.type': expected a string");
    if (!strcmp(type, "text")) return 1;
    const cJSON *schema = NULL;
    if (!strcmp(type, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (!cJSON_IsObject(js))
            return pt_api_bad(resp, path, "'response_format.json_schema': expected an object");
        schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!schema)
            return pt_api_bad(resp, path, "'response_format.json_schema.schema': missing");
    } else if (strcmp(type, "json_object") != 0) {
        return pt_api_bad(resp, path,
                          "'response_format.type': '%s' (expected text, json_object or json_schema)",
                          type);
    }
    if (pt_jschema_compile(schema, &j->schema) != PT_OK)
        return pt_api_bad(resp, path, "'response_format' schema: %s", pt_last_error());
    return 1;
}

int pt_api_common_fields(pt_server *srv, const cJSON *root, pt_gen *g, int anthropic,
                         const char *path, pt_http_response *resp) {
    pt_srv_job *j = g->job;
    j->sp = srv->e->default_sampling(srv->e->model);
    double d;
    int64_t i64;
    int r, b;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model))
        return pt_api_bad(resp, path, "'model': expected a string");
    if ((r = get_num(root, "temperature", 0, anthropic ? 1 : 2, &d, path, resp)) < 0) return 0;
    if (r) j->sp.temperature = (float)d;
    if ((r = get_num(root, "top_p", 0, 1, &d, path, resp)) < 0) return 0;
    if (r) j->sp.top_p = (float)d;
    if ((r = get_int(root, "top_k", 0, 1 << 30, &i64, path, resp)) < 0) return 0;
    if (r) j->sp.top_k = (int)i64;
    if ((r = get_num(root, "min_p", 0, 1, &d, path, resp)) < 0) return 0;
    if (r) j->sp.min_p = (float)d;
    if ((r = get_num(root, "repetition_penalty", 0.01, 10, &d, path, resp)) < 0) return 0;
    if (r) j->sp.repetition_penalty = (float)d;
    if ((r = get_num(root, "presence_penalty", -2, 2, &d, path, resp)) < 0) return 0;
    if (r) j->sp.presence_penalty = (float)d;
    if ((r = get_num(root, "frequency_penalty", -2, 2, &d, path, resp)) < 0) return 0;
    if (r) j->sp.frequency_penalty = (float)d;
    if ((r = get_int(root, "seed", INT64_MIN + 1, INT64_MAX, &i64, path, resp)) < 0) return 0;
    if (r) j->sp.seed = (uint64_t)i64;
    else {
        /* an unseeded request still needs a seed; vary it per request */
        static _Atomic uint64_t counter = 0;
        uint64_t k = atomic_fetch_add(&counter, 1) + 1;
        j->sp.seed = (uint64_t)(pt_srv_now() * 1e9) ^ (k * 0x9E3779B97F4A7C15ull);
    }
    int64_t max_tokens = -1;
    const char *mt_keys[] = {"max_tokens", "max_completion_tokens"};
    for (int k = 0; k < (anthropic ? 1 : 2); k++) {
        if ((r = get_int(root, mt_keys[k], 1, 1 << 30, &i64, path, resp)) < 0) return 0;
        if (r) max_tokens = i64;
    }
    if (anthropic && max_tokens < 0) return pt_api_bad(resp, path, "'max_tokens': required");
    j->max_tokens = max_tokens > 0 ? (int)max_tokens : 1 << 30; /* clamped to the context later */
    if ((r = get_bool(root, "stream", &g->stream, path, resp)) < 0) return 0;
    if (!set_stop(j, cJSON_GetObjectItemCaseSensitive(root, anthropic ? "stop_sequences" : "stop"),
                  anthropic ? "stop_sequences" : "stop", path, resp))
        return 0;
    if (anthropic) return 1;

    if ((r = get_int(root, "n", 1, 1, &i64, path, resp)) < 0) {
        pt_api_bad(resp, path, "'n': only n = 1 is supported");
        return 0;
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return pt_api_bad(resp, path, "'stream_options': expected an object");
        if ((r = get_bool(so, "include_usage", &g->include_usage, path, resp)) < 0) return 0;
    }
    /* chat: logprobs is a boolean + top_logprobs; completions: logprobs is an int */
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (g->kind == API_COMPLETION && cJSON_IsNumber(lp)) {
        if ((r = get_int(root, "logprobs", 0, 20, &i64, path, resp)) < 0) return 0;
        g->logprobs = 1;
        g->top_logprobs = (int)i64;
    } else {
        b = 0;
        if ((r = get_bool(root, "logprobs", &b, path, resp)) < 0) return 0;
        g->logprobs = b;
        if ((r = get_int(root, "top_logprobs", 0, 20, &i64, path, resp)) < 0) return 0;
        if (r) {
            if (!g->logprobs)
                return pt_api_bad(resp, path, "'top_logprobs' requires 'logprobs': true");
            g->top_logprobs = (int)i64;
        }
    }
    j->want_logprobs = g->logprobs;
    j->sp.n_logprobs = g->top_logprobs;
    j->sp.no_logprob = !g->logprobs; /* a reply without logprobs spares the sampler that pass */
    if (!set_response_format(j, cJSON_GetObjectItemCaseSensitive(root, "response_format"), path, resp))
        return 0;
    return 1;
}

int pt_api_set_prompt(pt_server *srv, pt_gen *g, const char *text, int add_special,
                      const char *path, pt_http_response *resp) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (srv->e->tokenize(srv->e->model, text, strlen(text), add_special, &ids, &n) != PT_OK)
        return pt_api_bad(resp, path, "tokenizing the prompt: %s", pt_last_error());
    g->job->prompt = ids;
    g->job->n_prompt = n;
    int n_ctx = pt_srv_sched_n_ctx(srv->sched);
    if (n == 0) return pt_api_bad(resp, path, "the prompt is empty (0 tokens)");
    if ((long)n >= (long)n_ctx)
        return pt_api_bad(resp, path,
                          "the prompt has %zu tokens; the context holds %d (leave room for at least "
                          "one generated token)",
                          n, n_ctx);
    return 1;
}

/* Copies one OpenAI message into the template's form: content parts joined
 * into a string, developer -> system, tool-call arguments parsed into
 * objects (templates print them with tojson). */
static cJSON *template_message(const cJSON *m, int idx, const char *path, pt_http_response *resp) {
    if (!cJSON_IsObject(m)) {
        pt_api_bad(resp, path, "'messages[%d]': expected an object", idx);
        return NULL;
    }
    const char *role = pt_json_get_str(m, "role");
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
    int ok = 0;
    for (int i = 0; role && roles[i]; i++) ok |= !strcmp(role, roles[i]);
    if (!ok) {
        pt_api_bad(resp, path, "'messages[%d].role': expected system, developer, user, assistant or tool",
                   idx);
        return NULL;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "role", strcmp(role, "developer") ? role : "system");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (cJSON_IsString(content)) {
        cJSON_AddStringToObject(out, "content", content->valuestring);
    } else if (cJSON_IsArray(content)) {
        pt_sbuf b = {0};
        int k = 0;
        for (const cJSON *p = content->child; p; p = p->next, k++) {
            const char *type = pt_json_get_str(p, "type");
            const char *txt = pt_json_get_str(p, "text");
            if (!type || strcmp(type, "text") || !txt) {
                pt_sbuf_free(&b);
                cJSON_Delete(out);
                pt_api_bad(resp, path,
                           "'messages[%d].content[%d]': only {\"type\":\"text\",\"text\":...} parts "
                           "are supported",
                           idx, k);
                return NULL;
            }
            pt_sbuf_adds(&b, txt);
        }
        cJSON_AddStringToObject(out, "content", b.data ? b.data : "");
        pt_sbuf_free(&b);
    } else if ((!content || cJSON_IsNull(content)) && calls && !strcmp(role, "assistant")) {
        cJSON_AddStringToObject(out, "content", "");
    } else {
        cJSON_Delete(out);
        pt_api_bad(resp, path, "'messages[%d].content': expected a string or an array of text parts",
                   idx);
        return NULL;
    }
    if (calls && !cJSON_IsNull(calls)) {
        if (!cJSON_IsArray(calls)) {
            cJSON_Delete(out);
            pt_api_bad(resp, path, "'messages[%d].tool_calls': expected an array", idx);
            return NULL;
        }
        cJSON *tc = cJSON_Duplicate(calls, 1);
        for (cJSON *c = tc ? tc->child : NULL; c; c = c->next) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            cJSON *args = fn ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
            if (cJSON_IsString(args)) {
                cJSON *parsed = cJSON_Parse(args->valuestring);
                if (parsed) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
            }
        }
        cJSON_AddItemToObject(out, "tool_calls", tc);
    }
    const char *keep[] = {"tool_call_id", "name", NULL};
    for (int i = 0; keep[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, keep[i]);
        if (cJSON_IsString(v)) cJSON_AddStringToObject(out, keep[i], v->valuestring);
    }
    return out;
}

int pt_api_render_chat(pt_server *srv, const cJSON *messages, const cJSON *tools,
                       const cJSON *kwargs, char **prompt, const char *path,
                       pt_http_response *resp) {
    *prompt = NULL;
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return pt_api_bad(resp, path, "'messages': expected a non-empty array");
    cJSON *msgs = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *m = messages->child; m; m = m->next, i++) {
        cJSON *t = template_message(m, i, path, resp);
        if (!t) {
            cJSON_Delete(msgs);
            return 0;
        }
        cJSON_AddItemToArray(msgs, t);
    }
    cJSON *extra = cJSON_CreateObject();
    if (kwargs && !cJSON_IsNull(kwargs)) {
        if (!cJSON_IsObject(kwargs)) {
            cJSON_Delete(msgs);
            cJSON_Delete(extra);
            return pt_api_bad(resp, path, "'chat_template_kwargs': expected an object");
        }
        for (const cJSON *k = kwargs->child; k; k = k->next)
            cJSON_AddItemToObject(extra, k->string, cJSON_Duplicate(k, 1));
    }
    if (tools) cJSON_AddItemToObject(extra, "tools", cJSON_Duplicate(tools, 1));
    char *mj = cJSON_PrintUnformatted(msgs), *ej = cJSON_PrintUnformatted(extra);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    pt_status st = mj && ej ? srv->e->chat_render(srv->e->model, mj, 1, ej, prompt)
                            : pt_error(PT_ERR_NOMEM, "out of memory");
    free(mj);
    free(ej);
    if (st != PT_OK) {
        *prompt = NULL;
        return pt_api_bad(resp, path, "chat template: %s", pt_last_error());
    }
    return 1;
}
