/* A submitted job turned into an HTTP answer: the buffered JSON response, or
 * an SSE stream, in the OpenAI (chat.completion.chunk / text_completion) or
 * Anthropic (message_start ... message_stop) shape.
 *
 * Stream rules: an OpenAI stream always ends with "data: [DONE]", after an
 * error event when generation failed part-way; an Anthropic stream ends with
 * message_stop, or with an error event. Stop strings are already held back by
 * the scheduler; when tools are offered, text that may be the start of a tool
 * call is held back here until it is decided. The client's socket is polled
 * while waiting, so a disconnect cancels the job at its next step.
 */
#include "server/api.h"

#include "base/error.h"
#include "base/json.h"
#include "server/toolcall.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_SLICE_MS 50

/* ------------------------------------------------------------- helpers */

static const char *openai_finish(const pt_srv_job *j, int n_calls) {
    if (n_calls > 0) return "tool_calls";
    return j->finish == PT_SRV_LENGTH ? "length" : "stop";
}

static const char *anthropic_stop(const pt_srv_job *j, int n_calls) {
    if (n_calls > 0) return "tool_use";
    if (j->finish == PT_SRV_LENGTH) return "max_tokens";
    if (j->finish == PT_SRV_STOP_STRING) return "stop_sequence";
    return "end_turn";
}

static cJSON *usage_json(const pt_srv_job *j, int anthropic) {
    cJSON *u = cJSON_CreateObject();
    if (anthropic) {
        cJSON_AddNumberToObject(u, "input_tokens", (double)(j->n_prompt - j->n_cached));
        cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
        cJSON_AddNumberToObject(u, "cache_read_input_tokens", (double)j->n_cached);
        cJSON_AddNumberToObject(u, "output_tokens", (double)j->n_generated);
        return u;
    }
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)j->n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->n_prompt + j->n_generated));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)j->n_cached);
    return u;
}

static cJSON *bytes_json(const char *t) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

static char *tok_text(pt_server *srv, int32_t id) {
    char *t = NULL;
    if (srv->e->token_text(srv->e->model, id, 0, &t) != PT_OK || !t) return strdup("");
    return t;
}

/* A token alone may be part of a UTF-8 sequence (byte-fallback tokens); JSON
 * strings must be valid UTF-8, so each invalid byte becomes U+FFFD here (the
 * raw bytes are reported in "bytes"). */
static char *valid_utf8(const char *t) {
    pt_sbuf b = {0};
    size_t n = strlen(t);
    while (n) {
        long bad = pt_utf8_invalid_offset(t, n);
        if (bad < 0) {
            pt_sbuf_add(&b, t, n);
            break;
        }
        pt_sbuf_add(&b, t, (size_t)bad);
        pt_sbuf_adds(&b, "\xEF\xBF\xBD");
        t += bad + 1;
        n -= (size_t)bad + 1;
    }
    if (!b.data || b.oom) {
        pt_sbuf_free(&b);
        return strdup("");
    }
    return b.data;
}

/* Chat logprobs for tokens [from, to): {"content":[{token,logprob,bytes,top_logprobs}]} */
static cJSON *chat_logprobs(pt_server *srv, const pt_gen *g, const pt_token_info *toks, size_t from,
                            size_t to) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(lp, "content");
    for (size_t i = from; i < to; i++) {
        cJSON *e = cJSON_CreateObject();
        char *t = tok_text(srv, toks[i].id), *v = t ? valid_utf8(t) : NULL;
        cJSON_AddStringToObject(e, "token", v ? v : "");
        cJSON_AddNumberToObject(e, "logprob", toks[i].logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_json(t ? t : ""));
        free(t);
        free(v);
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < toks[i].n_top && k < g->top_logprobs; k++) {
            cJSON *x = cJSON_CreateObject();
            char *tt = tok_text(srv, toks[i].top_ids[k]), *vv = tt ? valid_utf8(tt) : NULL;
            cJSON_AddStringToObject(x, "token", vv ? vv : "");
            cJSON_AddNumberToObject(x, "logprob", toks[i].top_logprobs[k]);
            cJSON_AddItemToObject(x, "bytes", bytes_json(tt ? tt : ""));
            free(tt);
            free(vv);
            cJSON_AddItemToArray(top, x);
        }
        cJSON_AddItemToArray(arr, e);
    }
    return lp;
}

/* Legacy completions logprobs: {tokens, token_logprobs, top_logprobs} */
static cJSON *completion_logprobs(pt_server *srv, const pt_gen *g, const pt_token_info *toks,
                                  size_t from, size_t to) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *tk = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tl = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
    for (size_t i = from; i < to; i++) {
        char *t = tok_text(srv, toks[i].id), *v = t ? valid_utf8(t) : NULL;
        cJSON_AddItemToArray(tk, cJSON_CreateString(v ? v : ""));
        free(t);
        free(v);
        cJSON_AddItemToArray(tl, cJSON_CreateNumber(toks[i].logprob));
        cJSON *o = cJSON_CreateObject();
        for (int k = 0; k < toks[i].n_top && k < g->top_logprobs; k++) {
            char *tt = tok_text(srv, toks[i].top_ids[k]), *vv = tt ? valid_utf8(tt) : NULL;
            if (vv && !cJSON_GetObjectItemCaseSensitive(o, vv))
                cJSON_AddNumberToObject(o, vv, toks[i].top_logprobs[k]);
            free(tt);
            free(vv);
        }
        cJSON_AddItemToArray(top, o);
    }
    return lp;
}

static void tool_calls_json(cJSON *parent, const char *key, pt_tool_call *calls, int n,
                            const char *id_base, int with_index) {
    cJSON *arr = cJSON_AddArrayToObject(parent, key);
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        char id[80];
        snprintf(id, sizeof id, "call_%s_%d", id_base, i);
        if (with_index) cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", calls[i].name);
        cJSON_AddStringToObject(fn, "arguments", calls[i].arguments);
        cJSON_AddItemToArray(arr, c);
    }
}

/* Tool calls in the reply; a forced call's reply is the bare JSON, which
 * gets its markers back first so the parser sees the model's own form. */
static int parse_calls(const pt_gen *g, const char *text, size_t len, pt_tool_call **calls,
                       char **content) {
    if (!g->call_prefix) return pt_toolcall_parse(text, len, calls, content);
    pt_sbuf b = {0};
    pt_sbuf_adds(&b, g->call_prefix);
    pt_sbuf_add(&b, text, len);
    pt_sbuf_adds(&b, g->call_suffix ? g->call_suffix : "");
    int n = b.oom ? -1 : pt_toolcall_parse(b.data, b.len, calls, content);
    pt_sbuf_free(&b);
    return n;
}

/* ------------------------------------------------------ buffered answers */

char *pt_api_openai_response(pt_server *srv, pt_gen *g) {
    pt_srv_job *j = g->job;
    const char *model = srv->e->model_id(srv->e->model);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", g->id);
    cJSON_AddStringToObject(r, "object", g->kind == API_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)g->created);
    cJSON_AddStringToObject(r, "model", model);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    const char *text = j->text.data ? j->text.data : "";
    int n_calls = 0;
    if (g->kind == API_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        pt_tool_call *calls = NULL;
        char *content = NULL;
        if (g->tools) n_calls = parse_calls(g, text, j->text.len, &calls, &content);
        if (n_calls > 0) {
            if (content && content[0]) cJSON_AddStringToObject(msg, "content", content);
            else cJSON_AddNullToObject(msg, "content");
            tool_calls_json(msg, "tool_calls", calls, n_calls, g->id + 9, 0);
        } else {
            n_calls = 0;
            cJSON_AddStringToObject(msg, "content", text);
        }
        cJSON_AddNullToObject(msg, "refusal");
        pt_toolcall_free(calls, n_calls > 0 ? n_calls : 0);
        free(content);
        if (g->logprobs) cJSON_AddItemToObject(c, "logprobs", chat_logprobs(srv, g, j->toks, 0, j->n_toks));
        else cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddStringToObject(c, "text", text);
        if (g->logprobs)
            cJSON_AddItemToObject(c, "logprobs", completion_logprobs(srv, g, j->toks, 0, j->n_toks));
        else cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", openai_finish(j, n_calls));
    cJSON_AddItemToArray(choices, c);
    cJSON_AddItemToObject(r, "usage", usage_json(j, 0));
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

char *pt_api_anthropic_response(pt_server *srv, pt_gen *g) {
    pt_srv_job *j = g->job;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", g->id);
    cJSON_AddStringToObject(r, "type", "message");
    cJSON_AddStringToObject(r, "role", "assistant");
    cJSON_AddStringToObject(r, "model", srv->e->model_id(srv->e->model));
    cJSON *content = cJSON_AddArrayToObject(r, "content");
    const char *text = j->text.data ? j->text.data : "";
    pt_tool_call *calls = NULL;
    char *rest = NULL;
    int n_calls = g->tools ? parse_calls(g, text, j->text.len, &calls, &rest) : 0;
    if (n_calls < 0) n_calls = 0;
    const char *body = n_calls ? (rest ? rest : "") : text;
    if (body[0] || n_calls == 0) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", body);
        cJSON_AddItemToArray(content, b);
    }
    for (int i = 0; i < n_calls; i++) {
        cJSON *b = cJSON_CreateObject();
        char id[80];
        snprintf(id, sizeof id, "toolu_%s_%d", g->id + 4, i);
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", id);
        cJSON_AddStringToObject(b, "name", calls[i].name);
        cJSON *in = cJSON_Parse(calls[i].arguments);
        cJSON_AddItemToObject(b, "input", in ? in : cJSON_CreateObject());
        cJSON_AddItemToArray(content, b);
    }
    cJSON_AddStringToObject(r, "stop_reason", anthropic_stop(j, n_calls));
    if (j->finish == PT_SRV_STOP_STRING && j->stop_index >= 0 && j->stop_index < j->n_stop)
        cJSON_AddStringToObject(r, "stop_sequence", j->stop[j->stop_index]);
    else cJSON_AddNullToObject(r, "stop_sequence");
    cJSON_AddItemToObject(r, "usage", usage_json(j, 1));
    pt_toolcall_free(calls, n_calls);
    free(rest);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

/* ------------------------------------------------------------- waiting */

/* Waits until the job has more text/tokens than seen, or finished. Returns
 * 0, or -1 when the client went away (the job is then cancelled). */
static int wait_progress(pt_srv_job *j, int fd, size_t text_seen, size_t toks_seen) {
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->finish != PT_SRV_RUNNING || j->text.len > text_seen || j->n_toks > toks_seen) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        int rc = pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (rc == ETIMEDOUT && pt_http_peer_closed(fd)) {
            pthread_mutex_unlock(&j->mu);
            pt_srv_job_cancel(j);
            return -1;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return 0;
}

void pt_api_record(pt_server *srv, pt_srv_job *j) {
    static const double bounds[PT_SRV_N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,    2.5,   5,    10,  30};
    pthread_mutex_lock(&srv->mu);
    if (j->finish == PT_SRV_CANCELLED) srv->n_cancelled++;
    else if (j->finish == PT_SRV_ERROR) srv->n_errors++;
    else srv->completions_ok++;
    double dur = j->t_done - j->t_submit;
    pt_srv_histogram *hs[2] = {&srv->h_request, &srv->h_ttft};
    double vals[2] = {dur, j->t_first_token ? j->t_first_token - j->t_submit : -1};
    for (int h = 0; h < 2; h++) {
        if (vals[h] < 0) continue;
        int b = 0;
        while (b < PT_SRV_N_BUCKETS && vals[h] > bounds[b]) b++;
        hs[h]->count[b]++;
        hs[h]->sum += vals[h];
        hs[h]->n++;
    }
    pthread_mutex_unlock(&srv->mu);
}

/* ------------------------------------------------------------ streaming */

typedef struct gen_stream {
    pt_server *srv;
    pt_gen g;
    int fd;
    size_t text_seen, toks_seen;
    size_t content_sent; /* bytes of job text released as content */
    int in_call;
    pt_sbuf out;
    size_t out_off;
    int started, ended, recorded;
    int block_open, block_index; /* anthropic content blocks */
} gen_stream;

static void sse_data(pt_sbuf *out, const char *event, cJSON *obj) {
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (event) pt_sbuf_printf(out, "event: %s\n", event);
    pt_sbuf_adds(out, "data: ");
    pt_sbuf_adds(out, s ? s : "{}");
    pt_sbuf_adds(out, "\n\n");
    free(s);
}

static cJSON *openai_chunk(gen_stream *st) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", st->g.id);
    cJSON_AddStringToObject(r, "object",
                            st->g.kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)st->g.created);
    cJSON_AddStringToObject(r, "model", st->srv->e->model_id(st->srv->e->model));
    return r;
}

/* One OpenAI chunk carrying content text and/or logprobs and/or a finish reason. */
static void openai_delta(gen_stream *st, const char *text, size_t len, size_t tok_from,
                         size_t tok_to, const char *finish, int role) {
    cJSON *r = openai_chunk(st);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = malloc(len + 1);
    if (t) {
        memcpy(t, text, len);
        t[len] = 0;
    }
    pt_srv_job *j = st->g.job;
    if (st->g.kind == API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (len || role) cJSON_AddStringToObject(d, "content", t ? t : "");
        if (st->g.logprobs && tok_to > tok_from)
            cJSON_AddItemToObject(c, "logprobs", chat_logprobs(st->srv, &st->g, j->toks, tok_from, tok_to));
        else cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
        if (st->g.logprobs && tok_to > tok_from)
            cJSON_AddItemToObject(c, "logprobs",
                                  completion_logprobs(st->srv, &st->g, j->toks, tok_from, tok_to));
        else cJSON_AddNullToObject(c, "logprobs");
    }
    free(t);
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    sse_data(&st->out, NULL, r);
}

static void anthropic_text(gen_stream *st, const char *text, size_t len) {
    if (!len) return;
    if (!st->block_open) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "content_block_start");
        cJSON_AddNumberToObject(e, "index", st->block_index);
        cJSON *b = cJSON_AddObjectToObject(e, "content_block");
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", "");
        sse_data(&st->out, "content_block_start", e);
        st->block_open = 1;
    }
    char *t = malloc(len + 1);
    if (!t) return;
    memcpy(t, text, len);
    t[len] = 0;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", "content_block_delta");
    cJSON_AddNumberToObject(e, "index", st->block_index);
    cJSON *d = cJSON_AddObjectToObject(e, "delta");
    cJSON_AddStringToObject(d, "type", "text_delta");
    cJSON_AddStringToObject(d, "text", t);
    free(t);
    sse_data(&st->out, "content_block_delta", e);
}

static void anthropic_block_stop(gen_stream *st) {
    if (!st->block_open) return;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", "content_block_stop");
    cJSON_AddNumberToObject(e, "index", st->block_index);
    sse_data(&st->out, "content_block_stop", e);
    st->block_open = 0;
    st->block_index++;
}

static void stream_start(gen_stream *st) {
    pt_srv_job *j = st->g.job;
    if (st->g.kind == API_MESSAGES) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "message_start");
        cJSON *m = cJSON_AddObjectToObject(e, "message");
        cJSON_AddStringToObject(m, "id", st->g.id);
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "model", st->srv->e->model_id(st->srv->e->model));
        cJSON_AddArrayToObject(m, "content");
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
        cJSON *u = cJSON_AddObjectToObject(m, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", (double)j->n_prompt);
        cJSON_AddNumberToObject(u, "output_tokens", 0);
        sse_data(&st->out, "message_start", e);
        pt_sbuf_adds(&st->out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    } else if (st->g.kind == API_CHAT) {
        openai_delta(st, "", 0, 0, 0, NULL, 1);
    }
}

static void stream_error(gen_stream *st, const char *msg) {
    int anth = st->g.kind == API_MESSAGES;
    pt_sbuf e = {0};
    pt_http_error_json(&e, anth, anth ? "api_error" : "server_error", msg);
    if (anth) pt_sbuf_adds(&st->out, "event: error\n");
    pt_sbuf_adds(&st->out, "data: ");
    pt_sbuf_add(&st->out, e.data ? e.data : "{}", e.len);
    pt_sbuf_adds(&st->out, "\n\n");
    pt_sbuf_free(&e);
    if (!anth) pt_sbuf_adds(&st->out, "data: [DONE]\n\n");
}

static void stream_finish(gen_stream *st) {
    pt_srv_job *j = st->g.job;
    int anth = st->g.kind == API_MESSAGES;
    const char *text = j->text.data ? j->text.data : "";
    pt_tool_call *calls = NULL;
    char *rest = NULL;
    int n_calls = 0;
    if (st->g.tools) {
        /* release held text: tool calls, or content after all */
        n_calls = parse_calls(&st->g, text + st->content_sent, j->text.len - st->content_sent, &calls,
                                    &rest);
        if (n_calls < 0) n_calls = 0;
        const char *tail = n_calls ? (rest ? rest : "") : text + st->content_sent;
        size_t tail_len = n_calls ? strlen(tail) : j->text.len - st->content_sent;
        if (anth) anthropic_text(st, tail, tail_len);
        else if (tail_len) openai_delta(st, tail, tail_len, st->toks_seen, st->toks_seen, NULL, 0);
    }
    if (anth) {
        anthropic_block_stop(st);
        for (int i = 0; i < n_calls; i++) {
            char id[80];
            snprintf(id, sizeof id, "toolu_%s_%d", st->g.id + 4, i);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "type", "content_block_start");
            cJSON_AddNumberToObject(e, "index", st->block_index);
            cJSON *b = cJSON_AddObjectToObject(e, "content_block");
            cJSON_AddStringToObject(b, "type", "tool_use");
            cJSON_AddStringToObject(b, "id", id);
            cJSON_AddStringToObject(b, "name", calls[i].name);
            cJSON_AddObjectToObject(b, "input");
            sse_data(&st->out, "content_block_start", e);
            e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "type", "content_block_delta");
            cJSON_AddNumberToObject(e, "index", st->block_index);
            cJSON *d = cJSON_AddObjectToObject(e, "delta");
            cJSON_AddStringToObject(d, "type", "input_json_delta");
            cJSON_AddStringToObject(d, "partial_json", calls[i].arguments);
            sse_data(&st->out, "content_block_delta", e);
            st->block_open = 1;
            anthropic_block_stop(st);
        }
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "message_delta");
        cJSON *d = cJSON_AddObjectToObject(e, "delta");
        cJSON_AddStringToObject(d, "stop_reason", anthropic_stop(j, n_calls));
        if (j->finish == PT_SRV_STOP_STRING && j->stop_index >= 0 && j->stop_index < j->n_stop)
            cJSON_AddStringToObject(d, "stop_sequence", j->stop[j->stop_index]);
        else cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddItemToObject(e, "usage", usage_json(j, 1));
        sse_data(&st->out, "message_delta", e);
        pt_sbuf_adds(&st->out, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    } else {
        if (n_calls > 0) {
            cJSON *r = openai_chunk(st);
            cJSON *choices = cJSON_AddArrayToObject(r, "choices");
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "index", 0);
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            tool_calls_json(d, "tool_calls", calls, n_calls, st->g.id + 9, 1);
            cJSON_AddNullToObject(c, "finish_reason");
            cJSON_AddItemToArray(choices, c);
            sse_data(&st->out, NULL, r);
        }
        openai_delta(st, "", 0, 0, 0, openai_finish(j, n_calls), 0);
        if (st->g.include_usage) {
            cJSON *r = openai_chunk(st);
            cJSON_AddArrayToObject(r, "choices");
            cJSON_AddItemToObject(r, "usage", usage_json(j, 0));
            sse_data(&st->out, NULL, r);
        }
        pt_sbuf_adds(&st->out, "data: [DONE]\n\n");
    }
    pt_toolcall_free(calls, n_calls);
    free(rest);
}

/* Produces the next SSE bytes (blocking until the job progresses). */
static void stream_advance(gen_stream *st) {
    pt_srv_job *j = st->g.job;
    /* Held for the whole step: the job's buffers may be reallocated by the
     * inference thread whenever it appends. */
    pthread_mutex_lock(&j->mu);
    pt_srv_finish fin = j->finish;
    size_t text_len = j->text.len, n_toks = j->n_toks;
    const char *text = j->text.data ? j->text.data : "";
    size_t send_to = text_len;
    if (st->g.tools) {
        if (st->in_call) send_to = st->content_sent;
        else send_to = pt_toolcall_stream_safe(text, text_len, &st->in_call);
        if (send_to < st->content_sent) send_to = st->content_sent;
    }
    if (fin == PT_SRV_ERROR) {
        char msg[600];
        snprintf(msg, sizeof msg, "generation failed: %s", j->error);
        pthread_mutex_unlock(&j->mu);
        stream_error(st, msg);
        st->ended = 1;
        return;
    }
    if (send_to > st->content_sent || n_toks > st->toks_seen) {
        if (st->g.kind == API_MESSAGES) anthropic_text(st, text + st->content_sent, send_to - st->content_sent);
        else openai_delta(st, text + st->content_sent, send_to - st->content_sent, st->toks_seen, n_toks,
                          NULL, 0);
        st->content_sent = send_to;
        st->toks_seen = n_toks;
    }
    st->text_seen = text_len;
    if (fin != PT_SRV_RUNNING) {
        stream_finish(st);
        st->ended = 1;
    }
    pthread_mutex_unlock(&j->mu);
}

static ssize_t stream_read(void *ctx, char *buf, size_t max) {
    gen_stream *st = ctx;
    while (st->out_off >= st->out.len) {
        st->out.len = 0;
        st->out_off = 0;
        if (st->ended) {
            if (!st->recorded) {
                pt_api_record(st->srv, st->g.job);
                st->recorded = 1;
            }
            return 0;
        }
        if (!st->started) {
            stream_start(st);
            st->started = 1;
            continue;
        }
        if (wait_progress(st->g.job, st->fd, st->text_seen, st->toks_seen) < 0) return -1;
        stream_advance(st);
    }
    size_t n = st->out.len - st->out_off;
    if (n > max) n = max;
    memcpy(buf, st->out.data + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *ctx) {
    gen_stream *st = ctx;
    pt_srv_job *j = st->g.job;
    pthread_mutex_lock(&j->mu);
    int running = j->finish == PT_SRV_RUNNING;
    pthread_mutex_unlock(&j->mu);
    if (running) pt_srv_job_cancel(j); /* the client left mid-stream */
    if (!st->recorded) {
        pthread_mutex_lock(&st->srv->mu);
        st->srv->n_cancelled += running;
        pthread_mutex_unlock(&st->srv->mu);
    }
    pt_srv_job_release(j);
    pt_sbuf_free(&st->out);
    free(st);
}

/* ----------------------------------------------------------------- run */

void pt_api_run(pt_server *srv, pt_gen *g, const pt_http_request *req, pt_http_response *resp) {
    pt_srv_job *j = g->job;
    g->job = NULL;
    if (pt_srv_sched_submit(srv->sched, j) != 0) {
        pthread_mutex_lock(&srv->mu);
        srv->n_429++;
        pthread_mutex_unlock(&srv->mu);
        pt_http_error(resp, req->path, 429, g->kind == API_MESSAGES ? "overloaded_error" : "rate_limit_error",
                      "the server is busy: every slot is in use and the queue is full; retry later");
        snprintf(resp->header_name, sizeof resp->header_name, "Retry-After");
        snprintf(resp->header_value, sizeof resp->header_value, "1");
        pt_srv_job_release(j);
        return;
    }
    if (g->stream) {
        gen_stream *st = calloc(1, sizeof *st);
        if (!st) {
            pt_srv_job_cancel(j);
            pt_srv_job_release(j);
            pt_http_error(resp, req->path, 500, "server_error", "out of memory");
            return;
        }
        st->srv = srv;
        st->g = *g;
        st->g.job = j;
        st->fd = req->fd;
        resp->status = 200;
        resp->content_type = "text/event-stream";
        resp->stream = stream_read;
        resp->stream_ctx = st;
        resp->stream_free = stream_free;
        return;
    }
    /* buffered: wait for the end, watching the client */
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int done = j->finish != PT_SRV_RUNNING;
        size_t tl = j->text.len, tn = j->n_toks;
        pthread_mutex_unlock(&j->mu);
        if (done) break;
        if (wait_progress(j, req->fd, tl, tn) < 0) {
            /* client gone: the job is cancelled; wait for the scheduler to let go */
            pthread_mutex_lock(&j->mu);
            while (j->finish == PT_SRV_RUNNING) pthread_cond_wait(&j->cv, &j->mu);
            pthread_mutex_unlock(&j->mu);
            pt_api_record(srv, j);
            pt_srv_job_release(j);
            pt_http_error(resp, req->path, 499, "cancelled", "client closed the connection");
            return;
        }
    }
    pt_api_record(srv, j);
    g->job = j;
    if (j->finish == PT_SRV_ERROR) {
        pt_http_error(resp, req->path, 500, g->kind == API_MESSAGES ? "api_error" : "server_error",
                      "generation failed: %s", j->error);
    } else if (j->finish == PT_SRV_CANCELLED) {
        pt_http_error(resp, req->path, 499, "cancelled", "the request was cancelled");
    } else {
        char *s = g->kind == API_MESSAGES ? pt_api_anthropic_response(srv, g)
                                          : pt_api_openai_response(srv, g);
        pt_http_json(resp, 200, s);
    }
    g->job = NULL;
    pt_srv_job_release(j);
}
