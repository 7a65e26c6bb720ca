/* Tool-call parsing (see toolcall.h). */
#include "server/toolcall.h"

#include "server/sbuf.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *const markers[] = {"<tool_call>", "<|python_tag|>", "```tool_code"};
#define N_MARKERS 3

void pt_toolcall_free(pt_tool_call *calls, int n) {
    for (int i = 0; i < n; i++) {
        free(calls[i].name);
        free(calls[i].arguments);
    }
    free(calls);
}

typedef struct calls_buf {
    pt_tool_call *v;
    int n, cap, oom;
} calls_buf;

static void add_call(calls_buf *b, const char *name, const cJSON *args) {
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 4;
        pt_tool_call *p = realloc(b->v, (size_t)cap * sizeof *p);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->v = p;
        b->cap = cap;
    }
    char *a = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    char *nm = strdup(name);
    if (!a || !nm) {
        free(a);
        free(nm);
        b->oom = 1;
        return;
    }
    b->v[b->n].name = nm;
    b->v[b->n].arguments = a;
    b->n++;
}

/* {"name": N, "arguments"|"parameters": {...}} → a call; 0 if not that shape. */
static int json_call(calls_buf *b, const cJSON *o) {
    if (!cJSON_IsObject(o)) return 0;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(o, "function");
    if (!cJSON_IsString(name) && cJSON_IsObject(fn)) { /* {"type":"function","function":{...}} */
        o = fn;
        name = cJSON_GetObjectItemCaseSensitive(o, "name");
    }
    if (!cJSON_IsString(name) || !name->valuestring[0]) return 0;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) { /* arguments given as a JSON string */
        parsed = cJSON_Parse(args->valuestring);
        if (!cJSON_IsObject(parsed)) {
            cJSON_Delete(parsed);
            return 0;
        }
        args = parsed;
    }
    if (args && !cJSON_IsObject(args)) return 0;
    add_call(b, name->valuestring, args);
    cJSON_Delete(parsed);
    return 1;
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && isspace((unsigned char)*p)) p++;
    return p;
}

/* ---- Qwen / Hermes ---- */
static int parse_qwen(const char *text, size_t len, calls_buf *b, pt_sbuf *content) {
    const char *p = text, *end = text + len;
    const char *open = "<tool_call>", *close = "</tool_call>";
    int found = 0;
    while (p < end) {
        const char *s = memmem(p, (size_t)(end - p), open, strlen(open));
        if (!s) break;
        const char *body = s + strlen(open);
        const char *e = memmem(body, (size_t)(end - body), close, strlen(close));
        const char *body_end = e ? e : end;
        cJSON *j = cJSON_ParseWithLength(body, (size_t)(body_end - body));
        if (!j || !json_call(b, j)) {
            cJSON_Delete(j);
            break; /* not a call: the rest stays content */
        }
        cJSON_Delete(j);
        found++;
        pt_sbuf_add(content, p, (size_t)(s - p));
        p = e ? e + strlen(close) : end;
    }
    if (!found) return 0;
    pt_sbuf_add(content, p, (size_t)(end - p));
    return found;
}

/* ---- Llama 3.x JSON ---- */
static int parse_llama(const char *text, size_t len, calls_buf *b) {
    const char *p = skip_ws(text, text + len), *end = text + len;
    const char *tag = "<|python_tag|>";
    if ((size_t)(end - p) >= strlen(tag) && !memcmp(p, tag, strlen(tag))) p += strlen(tag);
    int found = 0;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end) break;
        if (*p != '{') return 0;
        const char *stop = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &stop, 0);
        if (!j || !json_call(b, j)) {
            cJSON_Delete(j);
            return 0;
        }
        cJSON_Delete(j);
        found++;
        p = skip_ws(stop, end);
        if (p < end && *p == ';') p++;
    }
    return found;
}

/* ---- Gemma tool_code: Python call syntax ---- */
typedef struct py {
    const char *p, *end;
} py;

static cJSON *py_value(py *s, int depth);

static void py_ws(py *s) { s->p = skip_ws(s->p, s->end); }

static cJSON *py_string(py *s) {
    char q = *s->p++;
    pt_sbuf b = {0};
    while (s->p < s->end && *s->p != q) {
        char c = *s->p++;
        if (c == '\\' && s->p < s->end) {
            char e = *s->p++;
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        }
        pt_sbuf_add(&b, &c, 1);
    }
    if (s->p >= s->end || b.oom) {
        pt_sbuf_free(&b);
        return NULL;
    }
    s->p++;
    cJSON *r = cJSON_CreateString(b.data ? b.data : "");
    pt_sbuf_free(&b);
    return r;
}

static cJSON *py_value(py *s, int depth) {
    if (depth > 32) return NULL;
    py_ws(s);
    if (s->p >= s->end) return NULL;
    char c = *s->p;
    if (c == '"' || c == '\'') return py_string(s);
    if (c == '[' || c == '(') {
        char close = c == '[' ? ']' : ')';
        s->p++;
        cJSON *a = cJSON_CreateArray();
        for (;;) {
            py_ws(s);
            if (s->p < s->end && *s->p == close) {
                s->p++;
                return a;
            }
            cJSON *v = py_value(s, depth + 1);
            if (!v) break;
            cJSON_AddItemToArray(a, v);
            py_ws(s);
            if (s->p < s->end && *s->p == ',') s->p++;
        }
        cJSON_Delete(a);
        return NULL;
    }
    if (c == '{') {
        s->p++;
        cJSON *o = cJSON_CreateObject();
        for (;;) {
            py_ws(s);
            if (s->p < s->end && *s->p == '}') {
                s->p++;
                return o;
            }
            cJSON *k = py_value(s, depth + 1);
            py_ws(s);
            if (!cJSON_IsString(k) || s->p >= s->end || *s->p != ':') {
                cJSON_Delete(k);
                break;
            }
            s->p++;
            cJSON *v = py_value(s, depth + 1);
            if (!v) {
                cJSON_Delete(k);
                break;
            }
            cJSON_AddItemToObject(o, k->valuestring, v);
            cJSON_Delete(k);
            py_ws(s);
            if (s->p < s->end && *s->p == ',') s->p++;
        }
        cJSON_Delete(o);
        return NULL;
    }
    static const struct { const char *w; int kind; } words[] = {
        {"True", 1}, {"False", 2}, {"None", 3}, {"true", 1}, {"false", 2}, {"null", 3}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].w);
        if ((size_t)(s->end - s->p) >= n && !memcmp(s->p, words[i].w, n) &&
            (s->p + n == s->end || !isalnum((unsigned char)s->p[n]))) {
            s->p += n;
            return words[i].kind == 1 ? cJSON_CreateTrue()
                   : words[i].kind == 2 ? cJSON_CreateFalse() : cJSON_CreateNull();
        }
    }
    if (c == '-' || c == '+' || c == '.' || isdigit((unsigned char)c)) {
        char buf[64];
        size_t n = 0;
        while (s->p < s->end && n + 1 < sizeof buf && strchr("+-.eE0123456789", *s->p))
            buf[n++] = *s->p++;
        buf[n] = 0;
        char *e;
        double d = strtod(buf, &e);
        if (*e) return NULL;
        return cJSON_CreateNumber(d);
    }
    return NULL;
}

static int parse_gemma(const char *text, size_t len, calls_buf *b, pt_sbuf *content) {
    const char *open = "```tool_code", *end = text + len;
    const char *s = memmem(text, len, open, strlen(open));
    if (!s) return 0;
    const char *body = s + strlen(open);
    const char *close = memmem(body, (size_t)(end - body), "```", 3);
    const char *body_end = close ? close : end;
    py st = {body, body_end};
    int found = 0;
    for (;;) {
        py_ws(&st);
        if (st.p >= st.end) break;
        const char *n0 = st.p;
        while (st.p < st.end && (isalnum((unsigned char)*st.p) || *st.p == '_' || *st.p == '.')) st.p++;
        if (st.p == n0 || st.p >= st.end || *st.p != '(') return 0;
        char name[256];
        size_t nl = (size_t)(st.p - n0) < sizeof name - 1 ? (size_t)(st.p - n0) : sizeof name - 1;
        memcpy(name, n0, nl);
        name[nl] = 0;
        st.p++;
        cJSON *args = cJSON_CreateObject();
        int ok = 0;
        for (;;) {
            py_ws(&st);
            if (st.p < st.end && *st.p == ')') {
                st.p++;
                ok = 1;
                break;
            }
            const char *k0 = st.p;
            while (st.p < st.end && (isalnum((unsigned char)*st.p) || *st.p == '_')) st.p++;
            const char *k1 = st.p;
            py_ws(&st);
            if (k1 == k0 || st.p >= st.end || *st.p != '=') break;
            st.p++;
            cJSON *v = py_value(&st, 0);
            if (!v) break;
            char key[256];
            size_t kl = (size_t)(k1 - k0) < sizeof key - 1 ? (size_t)(k1 - k0) : sizeof key - 1;
            memcpy(key, k0, kl);
            key[kl] = 0;
            cJSON_AddItemToObject(args, key, v);
            py_ws(&st);
            if (st.p < st.end && *st.p == ',') st.p++;
        }
        if (!ok) {
            cJSON_Delete(args);
            return 0;
        }
        add_call(b, name, args);
        cJSON_Delete(args);
        found++;
        py_ws(&st);
        if (st.p < st.end && *st.p == ';') st.p++;
    }
    if (!found) return 0;
    pt_sbuf_add(content, text, (size_t)(s - text));
    if (close) pt_sbuf_add(content, close + 3, (size_t)(end - close - 3));
    return found;
}

int pt_toolcall_parse(const char *text, size_t len, pt_tool_call **calls, char **content) {
    *calls = NULL;
    *content = NULL;
    calls_buf b = {0};
    pt_sbuf c = {0};
    int n = parse_qwen(text, len, &b, &c);
    if (!n) {
        c.len = 0;
        n = parse_gemma(text, len, &b, &c);
    }
    if (!n) {
        c.len = 0;
        n = parse_llama(text, len, &b);
    }
    if (!n) {
        pt_toolcall_free(b.v, b.n);
        b = (calls_buf){0};
        c.len = 0;
        pt_sbuf_add(&c, text, len);
    }
    if (b.oom || c.oom) {
        pt_toolcall_free(b.v, b.n);
        pt_sbuf_free(&c);
        return -1;
    }
    /* trim whitespace left around removed calls */
    size_t s0 = 0, e0 = c.len;
    if (n) {
        while (s0 < e0 && isspace((unsigned char)c.data[s0])) s0++;
        while (e0 > s0 && isspace((unsigned char)c.data[e0 - 1])) e0--;
    }
    *content = malloc(e0 - s0 + 1);
    if (!*content) {
        pt_toolcall_free(b.v, b.n);
        pt_sbuf_free(&c);
        return -1;
    }
    if (e0 > s0) memcpy(*content, c.data + s0, e0 - s0);
    (*content)[e0 - s0] = 0;
    pt_sbuf_free(&c);
    *calls = b.v;
    return n ? b.n : 0;
}

size_t pt_toolcall_stream_safe(const char *text, size_t len, int *in_call) {
    *in_call = 0;
    /* Llama form: a reply whose first non-space byte is '{' or that starts with
     * a prefix of <|python_tag|> is held whole until the end */
    size_t lead = 0;
    while (lead < len && isspace((unsigned char)text[lead])) lead++;
    if (lead < len && text[lead] == '{') {
        *in_call = 1;
        return 0;
    }
    for (int m = 0; m < N_MARKERS; m++) {
        const char *hit = memmem(text, len, markers[m], strlen(markers[m]));
        if (hit) {
            *in_call = 1;
            return (size_t)(hit - text);
        }
    }
    /* hold back a suffix that could still become a marker */
    size_t hold = 0;
    for (int m = 0; m < N_MARKERS; m++) {
        size_t ml = strlen(markers[m]);
        for (size_t k = ml - 1 < len ? ml - 1 : len; k > hold; k--)
            if (!memcmp(text + len - k, markers[m], k)) {
                hold = k;
                break;
            }
    }
    if (lead == len) return 0; /* only whitespace so far: could still open with '{' */
    return len - hold;
}
