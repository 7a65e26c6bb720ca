/* JSON Schema → byte matcher → token mask (see json_schema.h).
 *
 * Compilation turns each schema object into a js_node (memoized by the cJSON
 * object it came from, which is what makes recursive $ref terminate). The
 * matcher is a pushdown automaton written out by hand: one frame per open
 * value, the frame kind saying what the next byte may be. A value whose end
 * is only known from the byte after it (a number, an enum candidate that is
 * a prefix of another) is completed when that byte arrives and the byte is
 * then handed to the parent.
 */
#include "server/json_schema.h"

#include "base/error.h"
#include "base/json.h"

#include <stdlib.h>
#include <string.h>

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

typedef struct js_node js_node;
struct js_node {
    unsigned types;
    /* object */
    int n_props;
    char **prop_text;    /* [n_props] the key as it appears inside quotes (JSON-escaped) */
    uint32_t *prop_len;
    js_node **prop;      /* [n_props] */
    uint64_t required;   /* bit i = prop i required */
    js_node *additional; /* NULL = no other keys */
    /* array */
    js_node *items;      /* never NULL for arrays (any) */
    uint32_t min_items, max_items;
    /* enum / const: serialized candidates (compact JSON) */
    int n_enum;
    char **enum_text;
    uint32_t *enum_len;
    /* anyOf */
    int n_any;
    js_node **any;
    const cJSON *src;
    js_node *next_alloc;
};

struct pt_jschema {
    js_node *root;
    js_node *nodes; /* every node, for freeing */
    js_node any_node;
};

/* ---------------------------------------------------------- compilation */

typedef struct compiler {
    pt_jschema *s;
    const cJSON *root;
    int depth;
} compiler;

static js_node *compile_node(compiler *c, const cJSON *sch, const char *where);

static js_node *new_node(compiler *c, const cJSON *src) {
    js_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->src = src;
    n->next_alloc = c->s->nodes;
    c->s->nodes = n;
    n->max_items = UINT32_MAX;
    n->items = &c->s->any_node;
    n->additional = &c->s->any_node;
    return n;
}

static void free_node_contents(js_node *n) {
    for (int i = 0; i < n->n_props; i++) free(n->prop_text[i]);
    free(n->prop_text);
    free(n->prop_len);
    free(n->prop);
    for (int i = 0; i < n->n_enum; i++) free(n->enum_text[i]);
    free(n->enum_text);
    free(n->enum_len);
    free(n->any);
}

static js_node *find_compiled(compiler *c, const cJSON *src) {
    for (js_node *n = c->s->nodes; n; n = n->next_alloc)
        if (n->src == src) return n;
    return NULL;
}

/* Resolves a local reference "#", "#/a/b" (JSON pointer, ~0 ~1 escapes). */
static const cJSON *resolve_ref(const cJSON *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *cur = root;
    const char *p = ref + 1;
    if (!*p) return root;
    if (*p != '/') return NULL;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') { tok[k++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { tok[k++] = '/'; p += 2; }
            else tok[k++] = *p++;
        }
        tok[k] = 0;
        if (cJSON_IsObject(cur)) cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        else if (cJSON_IsArray(cur)) {
            char *e;
            long i = strtol(tok, &e, 10);
            cur = (*e || i < 0) ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else cur = NULL;
        if (!cur) return NULL;
    }
    return cur;
}

static unsigned type_bit(const char *t) {
    if (!strcmp(t, "null")) return T_NULL;
    if (!strcmp(t, "boolean")) return T_BOOL;
    if (!strcmp(t, "integer")) return T_INT;
    if (!strcmp(t, "number")) return T_NUM | T_INT;
    if (!strcmp(t, "string")) return T_STR;
    if (!strcmp(t, "array")) return T_ARR;
    if (!strcmp(t, "object")) return T_OBJ;
    return 0;
}

/* The key text as it appears between the quotes of compact JSON. */
static char *escaped_key(const char *key, uint32_t *len) {
    cJSON *s = cJSON_CreateString(key);
    char *p = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    if (!p) return NULL;
    size_t n = strlen(p);
    memmove(p, p + 1, n - 2); /* drop the quotes */
    p[n - 2] = 0;
    *len = (uint32_t)(n - 2);
    return p;
}

static int is_annotation(const char *k) {
    static const char *ann[] = {"title", "description", "default", "examples", "format",
                                "$schema", "$id", "$comment", "$defs", "definitions",
                                "readOnly", "writeOnly", "deprecated", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return 1;
    return 0;
}

#define FAIL(...) do { pt_error(PT_ERR_INVALID_ARG, __VA_ARGS__); return NULL; } while (0)

static js_node *compile_object_schema(compiler *c, const cJSON *sch, const char *where) {
    js_node *done = find_compiled(c, sch);
    if (done) return done;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sch, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) FAIL("%s/$ref: expected a string", where);
        const cJSON *t = resolve_ref(c->root, ref->valuestring);
        if (!t) FAIL("%s/$ref: cannot resolve '%s' (only local references like #/$defs/Name)", where,
                     ref->valuestring);
        for (const cJSON *k = sch->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && !is_annotation(k->string))
                FAIL("%s: '%s' beside $ref is not supported", where, k->string);
        return compile_node(c, t, ref->valuestring);
    }
    js_node *n = new_node(c, sch);
    if (!n) FAIL("out of memory");
    char sub[512];
    unsigned types = 0;
    int has_type = 0;
    for (const cJSON *k = sch->child; k; k = k->next) {
        const char *key = k->string;
        if (!strcmp(key, "type")) {
            has_type = 1;
            if (cJSON_IsString(k)) {
                types = type_bit(k->valuestring);
                if (!types) FAIL("%s/type: unknown type '%s'", where, k->valuestring);
            } else if (cJSON_IsArray(k)) {
                for (const cJSON *e = k->child; e; e = e->next) {
                    unsigned b = cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
                    if (!b) FAIL("%s/type: expected type names", where);
                    types |= b;
                }
            } else FAIL("%s/type: expected a string or an array of strings", where);
        } else if (!strcmp(key, "properties")) {
            if (!cJSON_IsObject(k)) FAIL("%s/properties: expected an object", where);
            int np = cJSON_GetArraySize(k);
            if (np > 64) FAIL("%s/properties: %d properties (at most 64 supported)", where, np);
            n->n_props = np;
            n->prop_text = calloc((size_t)np + 1, sizeof(char *));
            n->prop_len = calloc((size_t)np + 1, sizeof(uint32_t));
            n->prop = calloc((size_t)np + 1, sizeof(js_node *));
            if (!n->prop_text || !n->prop_len || !n->prop) FAIL("out of memory");
            int i = 0;
            for (const cJSON *p = k->child; p; p = p->next, i++) {
                n->prop_text[i] = escaped_key(p->string, &n->prop_len[i]);
                if (!n->prop_text[i]) FAIL("out of memory");
                snprintf(sub, sizeof sub, "%.300s/properties/%.150s", where, p->string);
                if (!(n->prop[i] = compile_node(c, p, sub))) return NULL;
            }
        } else if (!strcmp(key, "required")) {
            if (!cJSON_IsArray(k)) FAIL("%s/required: expected an array of names", where);
        } else if (!strcmp(key, "additionalProperties")) {
            if (cJSON_IsFalse(k)) n->additional = NULL;
            else if (cJSON_IsTrue(k)) n->additional = &c->s->any_node;
            else {
                snprintf(sub, sizeof sub, "%.400s/additionalProperties", where);
                if (!(n->additional = compile_node(c, k, sub))) return NULL;
            }
        } else if (!strcmp(key, "items")) {
            snprintf(sub, sizeof sub, "%.450s/items", where);
            if (!(n->items = compile_node(c, k, sub))) return NULL;
        } else if (!strcmp(key, "minItems") || !strcmp(key, "maxItems")) {
            double d = cJSON_IsNumber(k) ? k->valuedouble : -1;
            if (d < 0 || d > 1e6 || d != (double)(uint32_t)d)
                FAIL("%s/%s: expected a non-negative integer", where, key);
            if (key[1] == 'i') n->min_items = (uint32_t)d;
            else n->max_items = (uint32_t)d;
        } else if (!strcmp(key, "enum") || !strcmp(key, "const")) {
            const cJSON *vals = k;
            int single = !strcmp(key, "const");
            int nv = single ? 1 : (cJSON_IsArray(k) ? cJSON_GetArraySize(k) : -1);
            if (nv < 1) FAIL("%s/enum: expected a non-empty array", where);
            if (nv > 64) FAIL("%s/enum: %d values (at most 64 supported)", where, nv);
            if (n->n_enum) FAIL("%s: both enum and const", where);
            n->enum_text = calloc((size_t)nv, sizeof(char *));
            n->enum_len = calloc((size_t)nv, sizeof(uint32_t));
            if (!n->enum_text || !n->enum_len) FAIL("out of memory");
            n->n_enum = nv;
            const cJSON *v = single ? k : vals->child;
            for (int i = 0; i < nv; i++, v = v->next) {
                n->enum_text[i] = cJSON_PrintUnformatted(v);
                if (!n->enum_text[i]) FAIL("out of memory");
                n->enum_len[i] = (uint32_t)strlen(n->enum_text[i]);
            }
        } else if (!strcmp(key, "anyOf") || !strcmp(key, "oneOf") || !strcmp(key, "allOf")) {
            int na = cJSON_IsArray(k) ? cJSON_GetArraySize(k) : 0;
            if (na < 1) FAIL("%s/%s: expected a non-empty array of schemas", where, key);
            if (key[1] == 'l' && na != 1)
                FAIL("%s/allOf: only a single member is supported (found %d)", where, na);
            if (n->n_any) FAIL("%s: more than one of anyOf/oneOf/allOf", where);
            n->any = calloc((size_t)na, sizeof(js_node *));
            if (!n->any) FAIL("out of memory");
            n->n_any = na;
            int i = 0;
            for (const cJSON *a = k->child; a; a = a->next, i++) {
                snprintf(sub, sizeof sub, "%.450s/%s/%d", where, key, i);
                if (!(n->any[i] = compile_node(c, a, sub))) return NULL;
            }
        } else if (!is_annotation(key)) {
            FAIL("%s: keyword '%s' is not supported in constrained decoding", where, key);
        }
    }
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) FAIL("%s/required: expected strings", where);
        int found = -1;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(sch, "properties");
        int i = 0;
        for (const cJSON *q = p ? p->child : NULL; q; q = q->next, i++)
            if (!strcmp(q->string, r->valuestring)) found = i;
        if (found < 0) {
            if (!n->additional)
                FAIL("%s/required: '%s' is required but not allowed (not in properties and no "
                     "additionalProperties)", where, r->valuestring);
            FAIL("%s/required: '%s' must also be listed in properties", where, r->valuestring);
        }
        n->required |= 1ull << found;
    }
    if (!has_type) {
        types = T_ANY;
        if (cJSON_GetObjectItemCaseSensitive(sch, "properties") ||
            cJSON_GetObjectItemCaseSensitive(sch, "required") ||
            cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties"))
            types = T_OBJ;
        else if (cJSON_GetObjectItemCaseSensitive(sch, "items")) types = T_ARR;
    }
    n->types = types;
    if (n->min_items > n->max_items) FAIL("%s: minItems > maxItems", where);
    return n;
}

static js_node *compile_node(compiler *c, const cJSON *sch, const char *where) {
    if (++c->depth > 64) FAIL("%s: schema nested too deeply", where);
    js_node *r;
    if (cJSON_IsTrue(sch)) r = &c->s->any_node;
    else if (cJSON_IsFalse(sch)) {
        pt_error(PT_ERR_INVALID_ARG, "%s: schema 'false' admits no value", where);
        r = NULL;
    } else if (!cJSON_IsObject(sch)) {
        pt_error(PT_ERR_INVALID_ARG, "%s: expected a schema object", where);
        r = NULL;
    } else r = compile_object_schema(c, sch, where);
    c->depth--;
    return r;
}

pt_status pt_jschema_compile(const cJSON *schema, pt_jschema **out) {
    *out = NULL;
    pt_jschema *s = calloc(1, sizeof *s);
    if (!s) return pt_error(PT_ERR_NOMEM, "out of memory");
    s->any_node.types = T_ANY;
    s->any_node.items = &s->any_node;
    s->any_node.additional = &s->any_node;
    s->any_node.max_items = UINT32_MAX;
    if (!schema) {
        /* json_object: any object; its members any value */
        js_node *n = calloc(1, sizeof *n);
        if (!n) {
            free(s);
            return pt_error(PT_ERR_NOMEM, "out of memory");
        }
        *n = s->any_node;
        n->types = T_OBJ;
        n->next_alloc = NULL;
        s->nodes = n;
        s->root = n;
        *out = s;
        return PT_OK;
    }
    compiler c = {.s = s, .root = schema};
    s->root = compile_node(&c, schema, "#");
    if (!s->root) {
        pt_jschema_free(&s);
        return PT_ERR_INVALID_ARG;
    }
    *out = s;
    return PT_OK;
}

void pt_jschema_free(pt_jschema **ps) {
    pt_jschema *s = *ps;
    if (!s) return;
    for (js_node *n = s->nodes, *nx; n; n = nx) {
        nx = n->next_alloc;
        free_node_contents(n);
        free(n);
    }
    free(s);
    *ps = NULL;
}

/* -------------------------------------------------------------- matcher */

enum { K_VALUE, K_OBJ, K_KEY, K_ARR, K_STR, K_NUM, K_LIT };
/* object sub-states */
enum { O_OPEN, O_KEY_NEXT, O_COLON, O_AFTER_VAL };
/* array sub-states */
enum { A_OPEN, A_NEED_VAL, A_AFTER_VAL };
/* string sub-states: 0 normal, 1 after '\', 2..5 the hex digits of \u */
enum { S_NORMAL = 0, S_ESC = 1, S_HEX = 2, S_HEX_D = 6 /* 2nd digit after \uD */ };
/* number sub-states */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
/* literal lists */
enum { L_ENUM, L_BOOL, L_NULL };

static const char *const bool_lits[] = {"true", "false"};
static const uint32_t bool_lens[] = {4, 5};
static const char *const null_lits[] = {"null"};
static const uint32_t null_lens[] = {4};

#define MAX_NUM_LEN 24

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static void lit_list(const pt_jsm_frame *f, const char *const **t, const uint32_t **l, int *n) {
    if (f->sub == L_BOOL) { *t = bool_lits; *l = bool_lens; *n = 2; }
    else if (f->sub == L_NULL) { *t = null_lits; *l = null_lens; *n = 1; }
    else {
        const js_node *nd = f->node;
        *t = (const char *const *)nd->enum_text;
        *l = nd->enum_len;
        *n = nd->n_enum;
    }
}

static int obj_can_close(const pt_jsm_frame *f) {
    const js_node *n = f->node;
    return (n->required & ~f->a) == 0;
}

static int obj_can_add_key(const pt_jsm_frame *f) {
    const js_node *n = f->node;
    if (n->additional) return 1;
    uint64_t all = n->n_props >= 64 ? ~0ull : ((1ull << n->n_props) - 1);
    return (all & ~f->a) != 0;
}

/* A child value finished: advance the parent (or mark the thread done). */
static void child_done(pt_jsm_thread *t) {
    if (t->depth == 0) {
        t->done = 1;
        return;
    }
    pt_jsm_frame *p = &t->f[t->depth - 1];
    if (p->kind == K_OBJ) { /* a member's value ended (keys end in K_KEY) */
        if (p->n != UINT32_MAX) p->a |= 1ull << p->n;
        p->sub = O_AFTER_VAL;
        p->ws = 0;
    } else if (p->kind == K_ARR) {
        p->n++;
        p->sub = A_AFTER_VAL;
        p->ws = 0;
    }
}

static int push(pt_jsm_thread *t, uint8_t kind, const void *node) {
    if (t->depth >= PT_JSM_DEPTH) return 0;
    pt_jsm_frame *f = &t->f[t->depth++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->node = node;
    return 1;
}

typedef struct tset {
    pt_jsm *out;
} tset;

static void emit(tset *ts, const pt_jsm_thread *t) {
    if (ts->out->n >= PT_JSM_THREADS) return; /* beyond the cap an alternative is dropped */
    pt_jsm_thread *d = &ts->out->t[ts->out->n++];
    d->depth = t->depth;
    d->done = t->done;
    memcpy(d->f, t->f, (size_t)t->depth * sizeof t->f[0]);
}

static void step(tset *ts, pt_jsm_thread *t, unsigned char c);

/* A byte at the start of a value of `node` (top frame is K_VALUE). */
static void value_start(tset *ts, pt_jsm_thread *t, unsigned char c) {
    pt_jsm_frame *f = &t->f[t->depth - 1];
    const js_node *n = f->node;
    if (is_ws(c)) {
        if (f->ws >= PT_JSM_MAX_WS || t->depth == 1) return;
        f->ws++;
        emit(ts, t);
        return;
    }
    if (n->n_any) {
        for (int i = 0; i < n->n_any; i++) {
            pt_jsm_thread alt;
            alt.depth = t->depth;
            alt.done = 0;
            memcpy(alt.f, t->f, (size_t)t->depth * sizeof t->f[0]);
            alt.f[alt.depth - 1].node = n->any[i];
            value_start(ts, &alt, c);
        }
        return;
    }
    if (n->n_enum) {
        f->kind = K_LIT;
        f->sub = L_ENUM;
        f->a = n->n_enum >= 64 ? ~0ull : ((1ull << n->n_enum) - 1);
        f->n = 0;
        step(ts, t, c);
        return;
    }
    unsigned ty = n->types;
    f->ws = 0;
    if (c == '{' && (ty & T_OBJ)) {
        f->kind = K_OBJ;
        f->sub = O_OPEN;
        f->a = 0;
        f->n = UINT32_MAX;
        emit(ts, t);
    } else if (c == '[' && (ty & T_ARR)) {
        f->kind = K_ARR;
        f->sub = A_OPEN;
        f->n = 0;
        emit(ts, t);
    } else if (c == '"' && (ty & T_STR)) {
        f->kind = K_STR;
        f->sub = S_NORMAL;
        emit(ts, t);
    } else if ((c == '-' || (c >= '0' && c <= '9')) && (ty & (T_INT | T_NUM))) {
        f->kind = K_NUM;
        f->flag = !(ty & T_NUM); /* integer only */
        f->n = 1;
        f->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        emit(ts, t);
    } else if ((c == 't' || c == 'f') && (ty & T_BOOL)) {
        f->kind = K_LIT;
        f->sub = L_BOOL;
        f->a = 3;
        f->n = 0;
        step(ts, t, c);
    } else if (c == 'n' && (ty & T_NULL)) {
        f->kind = K_LIT;
        f->sub = L_NULL;
        f->a = 1;
        f->n = 0;
        step(ts, t, c);
    }
}

/* String body bytes shared by values and free-form keys. Returns 1 if the
 * byte was consumed inside the string, 0 if it is the closing quote, -1 if
 * it is invalid. f->ws counts pending UTF-8 continuation bytes. */
static int string_byte(pt_jsm_frame *f, unsigned char c) {
    if (f->ws) {
        if ((c & 0xC0) != 0x80) return -1;
        f->ws--;
        return 1;
    }
    if (f->sub == S_ESC) {
        if (c == 'u') f->sub = S_HEX;
        else if (strchr("\"\\/bfnrt", c) && c) f->sub = S_NORMAL;
        else return -1;
        return 1;
    }
    if (f->sub >= S_HEX) {
        int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!hex) return -1;
        /* \uD800-\uDFFF (surrogates) are refused: a lone one is invalid JSON
         * and a pair is never needed (raw UTF-8 is allowed in strings). */
        if (f->sub == S_HEX_D && !(c >= '0' && c <= '7')) return -1;
        if (f->sub == S_HEX && (c == 'd' || c == 'D')) f->sub = S_HEX_D;
        else if (f->sub == S_HEX_D) f->sub = S_HEX + 2;
        else f->sub = f->sub == S_HEX + 3 ? S_NORMAL : f->sub + 1;
        return 1;
    }
    if (c == '"') return 0;
    if (c == '\\') {
        f->sub = S_ESC;
        return 1;
    }
    if (c < 0x20 || c == 0x7F) return -1;
    if (c >= 0x80) {
        if (c >= 0xC2 && c <= 0xDF) f->ws = 1;
        else if (c >= 0xE0 && c <= 0xEF) f->ws = 2;
        else if (c >= 0xF0 && c <= 0xF4) f->ws = 3;
        else return -1;
    }
    return 1;
}

static int num_complete(const pt_jsm_frame *f) {
    return f->sub == N_ZERO || f->sub == N_INT || f->sub == N_FRAC || f->sub == N_EXP;
}

/* Pops a completed ambiguous-end frame and hands `c` to the parent. */
static void finish_and_refeed(tset *ts, pt_jsm_thread *t, unsigned char c) {
    t->depth--;
    child_done(t);
    if (t->done) return; /* nothing may follow a complete top-level value */
    step(ts, t, c);
}

static void step(tset *ts, pt_jsm_thread *t, unsigned char c) {
    if (t->done || t->depth == 0) return;
    pt_jsm_frame *f = &t->f[t->depth - 1];
    const js_node *n = f->node;
    switch (f->kind) {
    case K_VALUE:
        value_start(ts, t, c);
        return;
    case K_OBJ:
        if (is_ws(c)) {
            if (f->ws >= PT_JSM_MAX_WS) return;
            f->ws++;
            emit(ts, t);
            return;
        }
        f->ws = 0;
        if (f->sub == O_OPEN || f->sub == O_KEY_NEXT) {
            if (c == '}' && f->sub == O_OPEN && obj_can_close(f)) {
                t->depth--;
                child_done(t);
                emit(ts, t);
            } else if (c == '"' && obj_can_add_key(f)) {
                uint64_t all = n->n_props >= 64 ? ~0ull : ((1ull << n->n_props) - 1);
                if (!push(t, K_KEY, n)) return;
                t->f[t->depth - 1].a = all;
                emit(ts, t);
            }
        } else if (f->sub == O_COLON) {
            if (c != ':') return;
            const js_node *child = f->n == UINT32_MAX ? n->additional : n->prop[f->n];
            f->sub = O_AFTER_VAL; /* in effect once the value completes */
            if (!push(t, K_VALUE, child)) return;
            emit(ts, t);
        } else { /* O_AFTER_VAL */
            if (c == ',' && obj_can_add_key(f)) {
                f->sub = O_KEY_NEXT;
                emit(ts, t);
            } else if (c == '}' && obj_can_close(f)) {
                t->depth--;
                child_done(t);
                emit(ts, t);
            }
        }
        return;
    case K_KEY: {
        pt_jsm_frame *obj = &t->f[t->depth - 2];
        if (f->sub == S_NORMAL && f->ws == 0 && c == '"') {
            int idx = -1;
            for (int i = 0; i < n->n_props; i++)
                if ((f->a >> i & 1) && n->prop_len[i] == f->n) idx = i;
            if (idx >= 0) {
                if (obj->a >> idx & 1) return; /* duplicate key */
                obj->n = (uint32_t)idx;
            } else {
                if (!n->additional) return;
                obj->n = UINT32_MAX;
            }
            t->depth--;
            obj->sub = O_COLON;
            obj->ws = 0;
            emit(ts, t);
            return;
        }
        uint64_t alive = 0;
        for (int i = 0; i < n->n_props; i++)
            if ((f->a >> i & 1) && n->prop_len[i] > f->n &&
                (unsigned char)n->prop_text[i][f->n] == c && !(obj->a >> i & 1))
                alive |= 1ull << i;
        if (!alive && !n->additional) return;
        if (string_byte(f, c) != 1) return;
        f->a = alive;
        f->n++;
        emit(ts, t);
        return;
    }
    case K_ARR: {
        if (is_ws(c)) {
            if (f->ws >= PT_JSM_MAX_WS) return;
            f->ws++;
            emit(ts, t);
            return;
        }
        f->ws = 0;
        if (c == ']' && ((f->sub == A_OPEN && n->min_items == 0) ||
                         (f->sub == A_AFTER_VAL && f->n >= n->min_items))) {
            t->depth--;
            child_done(t);
            emit(ts, t);
            return;
        }
        if (f->sub == A_AFTER_VAL) {
            if (c == ',' && f->n < n->max_items) {
                f->sub = A_NEED_VAL;
                emit(ts, t);
            }
            return;
        }
        if (f->sub == A_OPEN && n->max_items == 0) return;
        if (!push(t, K_VALUE, n->items)) return;
        value_start(ts, t, c);
        return;
    }
    case K_STR: {
        int r = string_byte(f, c);
        if (r < 0) return;
        if (r == 0) {
            t->depth--;
            child_done(t);
        }
        emit(ts, t);
        return;
    }
    case K_NUM: {
        int digit = c >= '0' && c <= '9';
        int next = -1;
        switch (f->sub) {
        case N_MINUS: next = c == '0' ? N_ZERO : digit ? N_INT : -1; break;
        case N_ZERO: next = (c == '.' && !f->flag) ? N_DOT : ((c == 'e' || c == 'E') && !f->flag) ? N_E : -1; break;
        case N_INT: next = digit ? N_INT : (c == '.' && !f->flag) ? N_DOT : ((c == 'e' || c == 'E') && !f->flag) ? N_E : -1; break;
        case N_DOT: next = digit ? N_FRAC : -1; break;
        case N_FRAC: next = digit ? N_FRAC : (c == 'e' || c == 'E') ? N_E : -1; break;
        case N_E: next = (c == '+' || c == '-') ? N_ESIGN : digit ? N_EXP : -1; break;
        case N_ESIGN: next = digit ? N_EXP : -1; break;
        case N_EXP: next = digit ? N_EXP : -1; break;
        }
        if (next >= 0 && f->n < MAX_NUM_LEN) {
            f->sub = (uint8_t)next;
            f->n++;
            emit(ts, t);
            return;
        }
        if (num_complete(f)) finish_and_refeed(ts, t, c);
        return;
    }
    case K_LIT: {
        const char *const *txt;
        const uint32_t *len;
        int nl;
        lit_list(f, &txt, &len, &nl);
        uint64_t alive = 0;
        int complete = 0;
        for (int i = 0; i < nl; i++) {
            if (!(f->a >> i & 1)) continue;
            if (len[i] == f->n) complete = 1;
            else if ((unsigned char)txt[i][f->n] == c) alive |= 1ull << i;
        }
        if (alive) {
            f->a = alive;
            f->n++;
            /* a literal that cannot be extended ends here */
            int extendable = 0, exact = 0;
            for (int i = 0; i < nl; i++) {
                if (!(alive >> i & 1)) continue;
                if (len[i] > f->n) extendable = 1;
                else exact = 1;
            }
            if (exact && !extendable) {
                t->depth--;
                child_done(t);
            }
            emit(ts, t);
        } else if (complete) {
            finish_and_refeed(ts, t, c);
        }
        return;
    }
    }
}

void pt_jsm_init(pt_jsm *m, const pt_jschema *s) {
    m->n = 1;
    pt_jsm_thread *t = &m->t[0];
    t->depth = 0;
    t->done = 0;
    push(t, K_VALUE, s->root);
}

void pt_jsm_copy(pt_jsm *dst, const pt_jsm *src) {
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) {
        dst->t[i].depth = src->t[i].depth;
        dst->t[i].done = src->t[i].done;
        memcpy(dst->t[i].f, src->t[i].f, (size_t)src->t[i].depth * sizeof src->t[i].f[0]);
    }
}

static int feed_byte(pt_jsm *m, unsigned char c, pt_jsm *scratch) {
    scratch->n = 0;
    tset ts = {scratch};
    for (int i = 0; i < m->n; i++) {
        pt_jsm_thread t;
        t.depth = m->t[i].depth;
        t.done = m->t[i].done;
        memcpy(t.f, m->t[i].f, (size_t)t.depth * sizeof t.f[0]);
        step(&ts, &t, c);
    }
    pt_jsm_copy(m, scratch);
    return m->n > 0;
}

int pt_jsm_feed(pt_jsm *m, const char *bytes, size_t n) {
    pt_jsm *scratch = malloc(sizeof *scratch);
    if (!scratch) return 0;
    int ok = m->n > 0;
    for (size_t i = 0; i < n && ok; i++) ok = feed_byte(m, (unsigned char)bytes[i], scratch);
    free(scratch);
    return ok;
}

/* Completes ambiguous-end frames (numbers, enum prefixes) as if the input ended. */
static int thread_accepts(const pt_jsm_thread *src) {
    if (src->done) return 1;
    pt_jsm_thread t = *src;
    while (t.depth > 0) {
        pt_jsm_frame *f = &t.f[t.depth - 1];
        int ok = 0;
        if (f->kind == K_NUM) ok = num_complete(f);
        else if (f->kind == K_LIT) {
            const char *const *txt;
            const uint32_t *len;
            int nl;
            lit_list(f, &txt, &len, &nl);
            for (int i = 0; i < nl; i++)
                if ((f->a >> i & 1) && len[i] == f->n) ok = 1;
        }
        if (!ok) return 0;
        t.depth--;
        child_done(&t);
        if (t.done) return 1;
        /* a parent container still open cannot be complete */
        return 0;
    }
    return 0;
}

int pt_jsm_accepts(const pt_jsm *m) {
    for (int i = 0; i < m->n; i++)
        if (thread_accepts(&m->t[i])) return 1;
    return 0;
}

/* --------------------------------------------------------- vocab & mask */

static const pt_vocab_index *sort_vi;
static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_vi->len[x], ly = sort_vi->len[y];
    int c = memcmp(sort_vi->text[x], sort_vi->text[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : (x < y ? -1 : 1);
}

pt_status pt_vocab_index_build(pt_vocab_index *vi, int n_vocab, char **text, const uint8_t *is_eos) {
    memset(vi, 0, sizeof *vi);
    vi->n_vocab = n_vocab;
    vi->text = text;
    vi->len = malloc((size_t)n_vocab * sizeof *vi->len);
    vi->order = malloc((size_t)n_vocab * sizeof *vi->order);
    vi->lcp = malloc((size_t)n_vocab * sizeof *vi->lcp);
    vi->is_eos = malloc((size_t)n_vocab);
    vi->plain = malloc((size_t)n_vocab);
    if (!vi->len || !vi->order || !vi->lcp || !vi->is_eos || !vi->plain) {
        pt_vocab_index_free(vi);
        return pt_error(PT_ERR_NOMEM, "out of memory indexing the vocabulary");
    }
    for (int i = 0; i < n_vocab; i++) {
        vi->len[i] = (uint32_t)strlen(text[i]);
        if (vi->len[i] > vi->max_len) vi->max_len = vi->len[i];
        vi->order[i] = i;
        vi->is_eos[i] = is_eos[i];
        int plain = vi->len[i] > 0 && pt_utf8_invalid_offset(text[i], vi->len[i]) < 0;
        for (uint32_t k = 0; k < vi->len[i] && plain; k++) {
            unsigned char c = (unsigned char)text[i][k];
            plain = c >= 0x20 && c != 0x7F && c != '"' && c != '\\';
        }
        vi->plain[i] = (uint8_t)plain;
    }
    /* qsort has no context argument; the index is built once, under the
     * server's vocabulary lock, so a file-level pointer is safe here. */
    sort_vi = vi;
    qsort(vi->order, (size_t)n_vocab, sizeof *vi->order, cmp_tok);
    sort_vi = NULL;
    for (int i = 0; i < n_vocab; i++) {
        uint32_t l = 0;
        if (i > 0) {
            int32_t a = vi->order[i - 1], b = vi->order[i];
            uint32_t m = vi->len[a] < vi->len[b] ? vi->len[a] : vi->len[b];
            while (l < m && vi->text[a][l] == vi->text[b][l]) l++;
        }
        vi->lcp[i] = l;
    }
    return PT_OK;
}

void pt_vocab_index_free(pt_vocab_index *vi) {
    if (vi->text)
        for (int i = 0; i < vi->n_vocab; i++) free(vi->text[i]);
    free(vi->text);
    free(vi->len);
    free(vi->order);
    free(vi->lcp);
    free(vi->is_eos);
    free(vi->plain);
    memset(vi, 0, sizeof *vi);
}

/* 1 when every thread is inside a string where any plain token (see
 * pt_vocab_index.plain) is valid and leaves it inside the string: a string
 * value, or a free-form key (additionalProperties allowed), between
 * characters. Most of a large vocabulary is plain, so this skips feeding it. */
static int in_plain_string(const pt_jsm *m) {
    for (int i = 0; i < m->n; i++) {
        const pt_jsm_thread *t = &m->t[i];
        if (t->done || t->depth == 0) return 0;
        const pt_jsm_frame *f = &t->f[t->depth - 1];
        if (f->sub != S_NORMAL || f->ws != 0) return 0;
        if (f->kind == K_STR) continue;
        if (f->kind == K_KEY && ((const js_node *)f->node)->additional) continue;
        return 0;
    }
    return m->n > 0;
}

size_t pt_jsm_mask(const pt_jsm *m, const pt_vocab_index *vi, uint8_t *allowed) {
    memset(allowed, 0, (size_t)vi->n_vocab);
    size_t n_allowed = 0;
    int accepts = pt_jsm_accepts(m);
    int fast_plain = in_plain_string(m);
    /* states[d] = the state after the first d bytes of the current token */
    size_t depth = (size_t)vi->max_len + 1;
    pt_jsm *states = malloc((depth + 1) * sizeof *states);
    if (!states) return 0;
    pt_jsm *scratch = &states[depth];
    pt_jsm_copy(&states[0], m);
    /* Walking the sorted order: `run` is the common prefix of this token with
     * the last token actually fed (the minimum of the adjacent lcps since);
     * that token left states valid up to `valid`, and when it died at byte
     * dead-1 every token sharing its first `dead` bytes dies too. */
    uint32_t run = 0, valid = 0, dead = UINT32_MAX;
    for (int k = 0; k < vi->n_vocab; k++) {
        int32_t id = vi->order[k];
        uint32_t len = vi->len[id];
        if (vi->lcp[k] < run) run = vi->lcp[k];
        if (vi->is_eos[id]) {
            if (accepts) {
                allowed[id] = 1;
                n_allowed++;
            }
            continue;
        }
        if (len == 0) continue; /* control tokens never extend a value */
        if (fast_plain && vi->plain[id]) {
            allowed[id] = 1;
            n_allowed++;
            continue;
        }
        if (dead != UINT32_MAX && run >= dead) continue;
        uint32_t d = run < valid ? run : valid;
        int ok = 1;
        for (; d < len; d++) {
            pt_jsm_copy(&states[d + 1], &states[d]);
            if (!feed_byte(&states[d + 1], (unsigned char)vi->text[id][d], scratch)) {
                ok = 0;
                break;
            }
        }
        if (ok) {
            allowed[id] = 1;
            n_allowed++;
            valid = len;
            dead = UINT32_MAX;
        } else {
            valid = d;
            dead = d + 1;
        }
        run = UINT32_MAX;
    }
    free(states);
    return n_allowed;
}
