/* The Jinja interpreter: walks the syntax tree with jinja2's semantics —
 * scopes (a for-loop iteration and a macro call each get their own; `set`
 * inside them does not leak out; namespace() attributes do), undefined values
 * that raise only when used, operators with Python's types and errors, loop
 * controls, macros and call blocks, filter blocks. Also the render entry
 * point (pt_jinja_parse/pt_jinja_render). Not the builtins (filters, tests,
 * methods: jinja_filters.c, jinja_methods.c). */
#include "tokenizer/jinja_internal.h"

#include "base/error.h"
#include "base/json.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Default bounds per render: evaluated nodes and bytes of values. */
#define PJ_MAX_STEPS 50000000L
#define PJ_MAX_BYTES ((size_t)512 << 20)
#define PJ_MAX_CALL_DEPTH 150

struct pj_scope {
    pj_scope *parent;
    const char **names;
    pj_value *vals;
    int n, cap;
};

static pj_scope *scope_new(pj_ctx *c, pj_scope *parent) {
    pj_scope *s = pj_alloc(c, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

int pj_scope_set(pj_ctx *c, pj_scope *s, const char *name, pj_value v) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return 0;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **names = pj_alloc(c, (size_t)cap * sizeof *names);
        pj_value *vals = pj_alloc(c, (size_t)cap * sizeof *vals);
        if (!names || !vals) return -1;
        if (s->n) {
            memcpy(names, s->names, (size_t)s->n * sizeof *names);
            memcpy(vals, s->vals, (size_t)s->n * sizeof *vals);
        }
        s->names = names;
        s->vals = vals;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return 0;
}

static pj_value *scope_get(pj_scope *s, const char *name) {
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (!strcmp(s->names[i], name)) return &s->vals[i];
    return NULL;
}

static int eval(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value *out);
static int exec_body(pj_ctx *c, pj_scope *s, const pj_node *body);
static int call_loop(pj_ctx *c, const pj_loop *l, pj_args *a, pj_value *out);

/* --------------------------------------------------------------- operators */

static int is_num(pj_value v) { return v.type == PJ_BOOL || v.type == PJ_INT || v.type == PJ_FLOAT; }
static double fval(pj_value v) { return v.type == PJ_FLOAT ? v.f : (double)v.i; }

static const char *op_text(int op) {
    static const char *const t[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return op >= 1 && op <= 7 ? t[op] : "?";
}

static int type_err(pj_ctx *c, int op, pj_value a, pj_value b) {
    return pj_fail(c, "TypeError", "unsupported operand type(s) for %s: '%s' and '%s'",
                   op == PJ_OP_POW ? "** or pow()" : op_text(op), pj_type_name(a), pj_type_name(b));
}

/* Markup + str: the str operand is HTML-escaped. */
static pj_value html_escape(pj_ctx *c, pj_value v) {
    pj_buf b = {.c = c};
    for (size_t i = 0; i < v.len; i++) {
        switch (v.s[i]) {
        case '&': pj_buf_puts(&b, "&amp;"); break;
        case '<': pj_buf_puts(&b, "&lt;"); break;
        case '>': pj_buf_puts(&b, "&gt;"); break;
        case '"': pj_buf_puts(&b, "&#34;"); break;
        case '\'': pj_buf_puts(&b, "&#39;"); break;
        default: pj_buf_put(&b, v.s + i, 1);
        }
    }
    return pj_buf_value(&b);
}

static int seq_repeat(pj_ctx *c, pj_value seq, int64_t k, pj_value *out) {
    if (k < 0) k = 0;
    if (seq.type == PJ_STR) {
        if (seq.len && (uint64_t)k > ((uint64_t)64 << 20) / seq.len)
            return pj_fail(c, "MemoryError", "string repetition too large");
        pj_buf b = {.c = c};
        for (int64_t i = 0; i < k; i++) pj_buf_put(&b, seq.s, seq.len);
        *out = pj_buf_value(&b);
        return c->failed ? -1 : 0;
    }
    if (seq.l->n && (uint64_t)k > ((uint64_t)1 << 22) / seq.l->n)
        return pj_fail(c, "MemoryError", "list repetition too large");
    *out = pj_list_new(c, seq.l->n * (size_t)k, seq.flags & PJ_F_TUPLE);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.l->n; j++) pj_list_push(c, out, seq.l->items[j]);
    return c->failed ? -1 : 0;
}

static int is_seq(pj_value v) { return v.type == PJ_LIST && !(v.flags & (PJ_F_GEN | PJ_F_RANGE)); }

static int binop(pj_ctx *c, int op, pj_value a, pj_value b, pj_value *out) {
    if (pj_check_defined(c, a) || pj_check_defined(c, b)) return -1;
    if (is_num(a) && is_num(b)) {
        int ints = a.type != PJ_FLOAT && b.type != PJ_FLOAT;
        double x = fval(a), y = fval(b);
        int64_t r;
        switch (op) {
        case PJ_OP_ADD:
            if (ints) {
                if (__builtin_add_overflow(a.i, b.i, &r)) return pj_fail(c, "OverflowError", "integer overflow");
                *out = pj_int(r);
            } else *out = pj_float(x + y);
            return 0;
        case PJ_OP_SUB:
            if (ints) {
                if (__builtin_sub_overflow(a.i, b.i, &r)) return pj_fail(c, "OverflowError", "integer overflow");
                *out = pj_int(r);
            } else *out = pj_float(x - y);
            return 0;
        case PJ_OP_MUL:
            if (ints) {
                if (__builtin_mul_overflow(a.i, b.i, &r)) return pj_fail(c, "OverflowError", "integer overflow");
                *out = pj_int(r);
            } else *out = pj_float(x * y);
            return 0;
        case PJ_OP_DIV:
            if (y == 0) return pj_fail(c, "ZeroDivisionError", "division by zero");
            *out = pj_float(x / y);
            return 0;
        case PJ_OP_FLOORDIV:
        case PJ_OP_MOD:
            if (ints) {
                if (b.i == 0)
                    return pj_fail(c, "ZeroDivisionError", op == PJ_OP_MOD ? "integer modulo by zero"
                                                                           : "integer division or modulo by zero");
                if (a.i == INT64_MIN && b.i == -1) return pj_fail(c, "OverflowError", "integer overflow");
                int64_t q = a.i / b.i, m = a.i % b.i;
                if (m != 0 && ((m < 0) != (b.i < 0))) {
                    q--;
                    m += b.i;
                }
                *out = pj_int(op == PJ_OP_MOD ? m : q);
            } else {
                if (y == 0)
                    return pj_fail(c, "ZeroDivisionError", op == PJ_OP_MOD ? "float modulo" : "float floor division by zero");
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                *out = pj_float(op == PJ_OP_MOD ? m : floor(x / y));
            }
            return 0;
        case PJ_OP_POW:
            if (ints && b.i >= 0) {
                /* exponentiation by squaring; 0, 1 and -1 never overflow */
                int64_t acc = 1, base = a.i, e = b.i;
                if (base == 0 || base == 1) acc = e == 0 ? 1 : base;
                else if (base == -1) acc = (e & 1) ? -1 : 1;
                else
                    while (e > 0) {
                        if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
                            return pj_fail(c, "OverflowError", "integer overflow (petrel's templates have no big ints)");
                        e >>= 1;
                        if (e && __builtin_mul_overflow(base, base, &base))
                            return pj_fail(c, "OverflowError", "integer overflow (petrel's templates have no big ints)");
                    }
                *out = pj_int(acc);
            } else {
                if (x == 0 && y < 0) return pj_fail(c, "ZeroDivisionError", "0.0 cannot be raised to a negative power");
                *out = pj_float(pow(x, y));
            }
            return 0;
        }
    }
    if (op == PJ_OP_ADD) {
        if (a.type == PJ_STR && b.type == PJ_STR) {
            if ((a.flags & PJ_F_SAFE) && !(b.flags & PJ_F_SAFE)) b = html_escape(c, b);
            else if ((b.flags & PJ_F_SAFE) && !(a.flags & PJ_F_SAFE)) a = html_escape(c, a);
            pj_buf bb = {.c = c};
            pj_buf_put(&bb, a.s, a.len);
            pj_buf_put(&bb, b.s, b.len);
            *out = pj_buf_value(&bb);
            out->flags = (a.flags | b.flags) & PJ_F_SAFE;
            return c->failed ? -1 : 0;
        }
        if (is_seq(a) && is_seq(b) && (a.flags & PJ_F_TUPLE) == (b.flags & PJ_F_TUPLE)) {
            if (pj_charge(c, (a.l->n + b.l->n) / 8)) return -1;
            *out = pj_list_new(c, a.l->n + b.l->n, a.flags & PJ_F_TUPLE);
            for (size_t i = 0; i < a.l->n; i++) pj_list_push(c, out, a.l->items[i]);
            for (size_t i = 0; i < b.l->n; i++) pj_list_push(c, out, b.l->items[i]);
            return c->failed ? -1 : 0;
        }
        if (a.type == PJ_STR)
            return pj_fail(c, "TypeError", "can only concatenate str (not \"%s\") to str", pj_type_name(b));
        if (is_seq(a))
            return pj_fail(c, "TypeError", "can only concatenate %s (not \"%s\") to %s", pj_type_name(a),
                           pj_type_name(b), pj_type_name(a));
    }
    if (op == PJ_OP_MUL) {
        if ((a.type == PJ_STR || is_seq(a)) && (b.type == PJ_INT || b.type == PJ_BOOL)) return seq_repeat(c, a, b.i, out);
        if ((b.type == PJ_STR || is_seq(b)) && (a.type == PJ_INT || a.type == PJ_BOOL)) return seq_repeat(c, b, a.i, out);
        if (a.type == PJ_STR || b.type == PJ_STR)
            return pj_fail(c, "TypeError", "can't multiply sequence by non-int of type '%s'",
                           pj_type_name(a.type == PJ_STR ? b : a));
    }
    if (op == PJ_OP_MOD && a.type == PJ_STR) return pj_percent_format(c, a, b, out);
    return type_err(c, op, a, b);
}

static int contains(pj_ctx *c, pj_value item, pj_value seq, int *out) {
    switch (seq.type) {
    case PJ_UNDEF: *out = 0; return 0;
    case PJ_STR:
        if (item.type != PJ_STR) {
            if (item.type == PJ_UNDEF) return pj_check_defined(c, item);
            return pj_fail(c, "TypeError", "'in <string>' requires string as left operand, not %s", pj_type_name(item));
        }
        *out = item.len == 0 || (item.len <= seq.len && memmem(seq.s, seq.len, item.s, item.len) != NULL);
        return 0;
    case PJ_LIST:
        *out = 0;
        if (pj_charge(c, seq.l->n)) return -1;
        for (size_t i = 0; i < seq.l->n && !*out; i++) *out = pj_equal(item, seq.l->items[i]);
        return 0;
    case PJ_DICT:
        if (pj_charge(c, seq.d->n)) return -1;
        *out = pj_dict_get(seq.d, item) != NULL;
        return 0;
    default:
        return pj_fail(c, "TypeError", "argument of type '%s' is not iterable", pj_type_name(seq));
    }
}

static int compare(pj_ctx *c, int op, pj_value a, pj_value b, pj_value *out) {
    int r, cmp;
    switch (op) {
    case PJ_OP_EQ: *out = pj_bool(pj_equal(a, b)); return 0;
    case PJ_OP_NE: *out = pj_bool(!pj_equal(a, b)); return 0;
    case PJ_OP_IN:
    case PJ_OP_NOTIN:
        if (contains(c, a, b, &r)) return -1;
        *out = pj_bool(op == PJ_OP_IN ? r : !r);
        return 0;
    }
    if (pj_compare(c, a, b, op, &cmp)) return -1;
    if (cmp == 2) r = 0; /* NaN */
    else if (op == PJ_OP_LT) r = cmp < 0;
    else if (op == PJ_OP_LE) r = cmp <= 0;
    else if (op == PJ_OP_GT) r = cmp > 0;
    else r = cmp >= 0;
    *out = pj_bool(r);
    return 0;
}

/* Python slice semantics (slice.indices) over a str (code points) or a list. */
static int do_slice(pj_ctx *c, pj_value obj, pj_value *parts, pj_value *out) {
    int64_t idx[3];
    int given[3];
    for (int i = 0; i < 3; i++) {
        given[i] = parts[i].type != PJ_NONE && parts[i].type != PJ_UNDEF;
        if (given[i] && parts[i].type != PJ_INT && parts[i].type != PJ_BOOL)
            return pj_fail(c, "TypeError", "slice indices must be integers or None or have an __index__ method");
        idx[i] = given[i] ? parts[i].i : 0;
    }
    int64_t step = given[2] ? idx[2] : 1;
    if (step == 0) return pj_fail(c, "ValueError", "slice step cannot be zero");
    if (pj_check_defined(c, obj)) return -1;
    int64_t n;
    int is_str = obj.type == PJ_STR;
    if (!is_str && !is_seq(obj)) return pj_fail(c, "TypeError", "'%s' object is not subscriptable", pj_type_name(obj));
    if (pj_length(c, obj, &n)) return -1;
    int64_t start, stop;
    if (step > 0) {
        start = given[0] ? idx[0] : 0;
        stop = given[1] ? idx[1] : n;
        if (start < 0) start = start + n < 0 ? 0 : start + n;
        if (start > n) start = n;
        if (stop < 0) stop = stop + n < 0 ? 0 : stop + n;
        if (stop > n) stop = n;
    } else {
        start = given[0] ? idx[0] : n - 1;
        stop = given[1] ? idx[1] : -1 - n; /* sentinel: before the first element */
        if (start < 0) start = start + n < 0 ? -1 : start + n;
        if (start >= n) start = n - 1;
        if (given[1]) {
            if (stop < 0) stop = stop + n < 0 ? -1 : stop + n;
            if (stop >= n) stop = n - 1;
        } else stop = -1;
    }
    if (is_str) {
        /* code point offsets, computed once */
        size_t *off = pj_alloc(c, (size_t)(n + 1) * sizeof(size_t));
        if (!off) return -1;
        size_t bpos = 0;
        for (int64_t i = 0; i < n; i++) {
            off[i] = bpos;
            size_t adv;
            pj_utf8_decode(obj.s + bpos, obj.len - bpos, &adv);
            bpos += adv;
        }
        off[n] = obj.len;
        pj_buf b = {.c = c};
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            pj_buf_put(&b, obj.s + off[i], off[i + 1] - off[i]);
        *out = pj_buf_value(&b);
        return c->failed ? -1 : 0;
    }
    *out = pj_list_new(c, 0, obj.flags & PJ_F_TUPLE);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) pj_list_push(c, out, obj.l->items[i]);
    return c->failed ? -1 : 0;
}

/* ------------------------------------------------------------------- calls */

static int eval_args(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value *first, pj_args *a) {
    int extra = first ? 1 : 0;
    a->pos = pj_alloc(c, (size_t)(n->n_kids + 1) * sizeof(pj_value));
    a->kw = pj_alloc(c, (size_t)(n->n_kids + 1) * sizeof(pj_value));
    a->kw_names = pj_alloc(c, (size_t)(n->n_kids + 1) * sizeof(char *));
    if (!a->pos || !a->kw || !a->kw_names) return -1;
    a->n_pos = a->n_kw = 0;
    if (first) a->pos[a->n_pos++] = *first;
    (void)extra;
    for (int i = 0; i < n->n_kids; i++) {
        pj_value v;
        if (eval(c, s, n->kids[i], &v)) return -1;
        if (n->names && n->names[i]) {
            a->kw_names[a->n_kw] = n->names[i];
            a->kw[a->n_kw++] = v;
        } else a->pos[a->n_pos++] = v;
    }
    return 0;
}

/* Calls a macro (or a call block's caller): binds arguments jinja2's way and
 * renders the body into a string. */
static int call_macro(pj_ctx *c, const pj_func *fn, pj_args *a, pj_value *out) {
    const pj_node *m = fn->macro;
    if (++c->depth > PJ_MAX_CALL_DEPTH) {
        c->depth--;
        return pj_fail(c, "RecursionError", "maximum recursion depth exceeded in macro '%s'", fn->name);
    }
    pj_scope *s = scope_new(c, fn->closure);
    if (!s) return -1;
    int n_params = m->n_kids;
    pj_value varargs = pj_list_new(c, 0, PJ_F_TUPLE);
    pj_value kwargs = pj_dict_new(c, 0);
    int *bound = pj_alloc(c, (size_t)(n_params + 1) * sizeof(int));
    if (!bound) return -1;
    int catch_va = m->op & PJ_CATCH_VARARGS, catch_kw = m->op & PJ_CATCH_KWARGS;
    if (a->n_pos > n_params && !catch_va) {
        c->depth--;
        return pj_fail(c, "TypeError", "macro '%s' takes not more than %d argument(s)", fn->name, n_params);
    }
    for (int i = 0; i < a->n_pos; i++) {
        if (i < n_params) {
            pj_scope_set(c, s, m->names[i], a->pos[i]);
            bound[i] = 1;
        } else pj_list_push(c, &varargs, a->pos[i]);
    }
    for (int k = 0; k < a->n_kw; k++) {
        int found = 0;
        for (int i = a->n_pos; i < n_params; i++)
            if (!strcmp(m->names[i], a->kw_names[k])) {
                pj_scope_set(c, s, m->names[i], a->kw[k]);
                bound[i] = 1;
                found = 1;
            }
        if (found) continue;
        if (!catch_kw) {
            c->depth--;
            return pj_fail(c, "TypeError", "macro '%s' takes no keyword argument '%s'", fn->name, a->kw_names[k]);
        }
        pj_dict_set(c, kwargs.d, pj_cstr(a->kw_names[k]), a->kw[k]);
    }
    for (int i = 0; i < n_params; i++) {
        if (bound[i]) continue;
        pj_value v;
        if (m->kids[i]) {
            if (eval(c, s, m->kids[i], &v)) {
                c->depth--;
                return -1;
            }
        } else {
            char *msg = pj_alloc(c, strlen(m->names[i]) + 64);
            if (msg) sprintf(msg, "parameter '%s' was not provided", m->names[i]);
            v = pj_undef_v(c, msg, 0);
        }
        pj_scope_set(c, s, m->names[i], v);
    }
    pj_scope_set(c, s, "varargs", varargs);
    pj_scope_set(c, s, "kwargs", kwargs);
    if (fn->caller) {
        pj_value cv = {.type = PJ_FUNC, .fn = (pj_func *)fn->caller};
        pj_scope_set(c, s, "caller", cv);
    }
    pj_buf buf = {.c = c};
    pj_buf *saved = c->out;
    c->out = &buf;
    int rc = exec_body(c, s, m->b);
    c->out = saved;
    c->depth--;
    if (rc < 0) return -1;
    *out = pj_buf_value(&buf);
    return 0;
}

int pj_call(pj_ctx *c, pj_value fn, pj_args *a, pj_value *out) {
    if (fn.type == PJ_UNDEF) return pj_check_defined(c, fn);
    if (fn.type != PJ_FUNC) {
        if (fn.type == PJ_LOOP) return call_loop(c, fn.loop, a, out);
        return pj_fail(c, "TypeError", "'%s' object is not callable", pj_type_name(fn));
    }
    switch (fn.fn->kind) {
    case PJ_FN_MACRO:
    case PJ_FN_CALLER: return call_macro(c, fn.fn, a, out);
    case PJ_FN_BUILTIN: return fn.fn->builtin(c, NULL, fn.fn->name, a, out);
    case PJ_FN_METHOD: return fn.fn->builtin(c, &fn.fn->self, fn.fn->name, a, out);
    }
    return pj_fail(c, "TypeError", "object is not callable");
}

/* ------------------------------------------------------------- expressions */

static int eval_filter(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value *input, pj_value *out) {
    pj_value v;
    if (n->a) {
        if (n->a->kind == PJ_N_FILTER) {
            if (eval_filter(c, s, n->a, input, &v)) return -1;
        } else if (eval(c, s, n->a, &v)) return -1;
    } else if (input) v = *input;
    else return pj_fail(c, "TemplateRuntimeError", "filter without input");
    pj_args a;
    if (eval_args(c, s, n, NULL, &a)) return -1;
    c->line = n->line;
    if (n->op) return pj_fail(c, "TemplateRuntimeError", "No filter named '%s' found.", n->name);
    return pj_apply_filter(c, n->name, v, &a, out);
}

/* Recursion bound of the evaluator: deep enough for any real template (macro
 * recursion included), small enough for the C stack. */
#define PJ_MAX_EVAL_DEPTH 3000

static int eval_node(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value *out);
static int eval(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value *out) {
    if (++c->edepth > PJ_MAX_EVAL_DEPTH) {
        c->edepth--;
        return pj_fail(c, "RecursionError", "maximum recursion depth exceeded");
    }
    int rc = eval_node(c, s, n, out);
    c->edepth--;
    return rc;
}

static int eval_node(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value *out) {
    if (c->failed) return -1;
    if (++c->steps > c->max_steps) return pj_fail(c, "RuntimeError", "the template ran too long");
    c->line = n->line;
    pj_value a, b;
    switch (n->kind) {
    case PJ_N_CONST: *out = n->value; return 0;
    case PJ_N_NAME: {
        pj_value *v = scope_get(s, n->name);
        if (v) {
            *out = *v;
            return 0;
        }
        char *msg = pj_alloc(c, strlen(n->name) + 32);
        if (!msg) return -1;
        pj_buf mb = {.c = c};
        pj_repr_of(c, pj_cstr(n->name), &mb);
        pj_buf_puts(&mb, " is undefined");
        *out = pj_undef_v(c, mb.p, 0);
        return c->failed ? -1 : 0;
    }
    case PJ_N_LIST:
    case PJ_N_TUPLE:
        *out = pj_list_new(c, (size_t)n->n_kids, n->kind == PJ_N_TUPLE ? PJ_F_TUPLE : 0);
        for (int i = 0; i < n->n_kids; i++) {
            if (eval(c, s, n->kids[i], &a)) return -1;
            pj_list_push(c, out, a);
        }
        return c->failed ? -1 : 0;
    case PJ_N_DICT:
        *out = pj_dict_new(c, (size_t)n->n_kids / 2);
        for (int i = 0; i + 1 < n->n_kids; i += 2) {
            if (eval(c, s, n->kids[i], &a) || eval(c, s, n->kids[i + 1], &b)) return -1;
            if (a.type == PJ_LIST && !(a.flags & PJ_F_TUPLE))
                return pj_fail(c, "TypeError", "unhashable type: 'list'");
            if (a.type == PJ_DICT) return pj_fail(c, "TypeError", "unhashable type: 'dict'");
            pj_dict_set(c, out->d, a, b);
        }
        return c->failed ? -1 : 0;
    case PJ_N_GETATTR:
        if (eval(c, s, n->a, &a)) return -1;
        c->line = n->line;
        return pj_getattr(c, a, n->name, out);
    case PJ_N_GETITEM:
        if (eval(c, s, n->a, &a) || eval(c, s, n->b, &b)) return -1;
        c->line = n->line;
        return pj_getitem(c, a, b, out);
    case PJ_N_SLICE: {
        pj_value parts[3] = {pj_none(), pj_none(), pj_none()};
        if (eval(c, s, n->a, &a)) return -1;
        if (n->b && eval(c, s, n->b, &parts[0])) return -1;
        if (n->c && eval(c, s, n->c, &parts[1])) return -1;
        if (n->d && eval(c, s, n->d, &parts[2])) return -1;
        return do_slice(c, a, parts, out);
    }
    case PJ_N_CALL: {
        pj_value fn;
        if (eval(c, s, n->a, &fn)) return -1;
        pj_args args;
        if (eval_args(c, s, n, NULL, &args)) return -1;
        c->line = n->line;
        return pj_call(c, fn, &args, out);
    }
    case PJ_N_FILTER: return eval_filter(c, s, n, NULL, out);
    case PJ_N_TEST: {
        if (eval(c, s, n->a, &a)) return -1;
        pj_args args;
        if (eval_args(c, s, n, NULL, &args)) return -1;
        int r;
        c->line = n->line;
        if (n->op) return pj_fail(c, "TemplateRuntimeError", "No test named '%s' found.", n->name);
        if (pj_apply_test(c, n->name, a, &args, &r)) return -1;
        *out = pj_bool(n->neg ? !r : r);
        return 0;
    }
    case PJ_N_UNARY:
        if (eval(c, s, n->a, &a) || pj_check_defined(c, a)) return -1;
        if (!is_num(a))
            return pj_fail(c, "TypeError", "bad operand type for unary %s: '%s'", n->op == PJ_OP_SUB ? "-" : "+",
                           pj_type_name(a));
        if (n->op == PJ_OP_ADD) *out = a.type == PJ_BOOL ? pj_int(a.i) : a;
        else if (a.type == PJ_FLOAT) *out = pj_float(-a.f);
        else if (a.i == INT64_MIN) return pj_fail(c, "OverflowError", "integer overflow");
        else *out = pj_int(-a.i);
        return 0;
    case PJ_N_BINARY:
        if (eval(c, s, n->a, &a) || eval(c, s, n->b, &b)) return -1;
        c->line = n->line;
        return binop(c, n->op, a, b, out);
    case PJ_N_COMPARE:
        if (eval(c, s, n->a, &a) || eval(c, s, n->b, &b)) return -1;
        c->line = n->line;
        return compare(c, n->op, a, b, out);
    case PJ_N_AND:
        if (eval(c, s, n->a, &a)) return -1;
        if (!pj_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(c, s, n->b, out);
    case PJ_N_OR:
        if (eval(c, s, n->a, &a)) return -1;
        if (pj_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(c, s, n->b, out);
    case PJ_N_NOT:
        if (eval(c, s, n->a, &a)) return -1;
        *out = pj_bool(!pj_truthy(a));
        return 0;
    case PJ_N_COND:
        if (eval(c, s, n->a, &a)) return -1;
        if (pj_truthy(a)) return eval(c, s, n->b, out);
        if (n->c) return eval(c, s, n->c, out);
        *out = pj_undef_v(c, "the inline if-expression evaluated to false and no else section was defined.", 0);
        return c->failed ? -1 : 0;
    case PJ_N_CONCAT: {
        if (eval(c, s, n->a, &a) || eval(c, s, n->b, &b)) return -1;
        pj_buf bb = {.c = c};
        pj_str_of(c, a, &bb);
        pj_str_of(c, b, &bb);
        *out = pj_buf_value(&bb);
        return c->failed ? -1 : 0;
    }
    }
    return pj_fail(c, "TemplateRuntimeError", "unexpected node %d", n->kind);
}

/* -------------------------------------------------------------- statements */

static int assign(pj_ctx *c, pj_scope *s, const pj_node *target, pj_value v) {
    if (target->kind == PJ_N_NAME) return pj_scope_set(c, s, target->name, v);
    if (target->kind == PJ_N_GETATTR) {
        pj_value *ns = scope_get(s, target->a->name);
        if (!ns || ns->type != PJ_NS)
            return pj_fail(c, "TemplateRuntimeError", "cannot assign attribute on non-namespace object");
        return pj_dict_set(c, ns->d, pj_cstr(target->name), v);
    }
    /* tuple unpacking */
    pj_value items;
    if (pj_iterate(c, v, &items)) return -1;
    if (items.l->n < (size_t)target->n_kids)
        return pj_fail(c, "ValueError", "not enough values to unpack (expected %d, got %zu)", target->n_kids,
                       items.l->n);
    if (items.l->n > (size_t)target->n_kids)
        return pj_fail(c, "ValueError", "too many values to unpack (expected %d)", target->n_kids);
    for (int i = 0; i < target->n_kids; i++)
        if (pj_scope_set(c, s, target->kids[i]->name, items.l->items[i])) return -1;
    return 0;
}

static int exec_for_items(pj_ctx *c, pj_scope *s, const pj_node *n, pj_value it, int depth) {
    pj_value items;
    if (depth > PJ_MAX_CALL_DEPTH) return pj_fail(c, "RecursionError", "maximum recursion depth exceeded in a recursive loop");
    if (pj_iterate(c, it, &items)) return -1;
    if (n->d) { /* {% for x in xs if cond %}: filter first (loop.length counts the kept items) */
        pj_value kept = pj_list_new(c, items.l->n, 0);
        for (size_t i = 0; i < items.l->n; i++) {
            pj_scope *fs = scope_new(c, s);
            pj_value cond;
            if (!fs || assign(c, fs, n->t, items.l->items[i]) || eval(c, fs, n->d, &cond)) return -1;
            if (pj_truthy(cond)) pj_list_push(c, &kept, items.l->items[i]);
        }
        items = kept;
    }
    if (items.l->n == 0) return n->c ? exec_body(c, s, n->c) : 0;
    pj_loop *loop = pj_alloc(c, sizeof *loop);
    if (!loop) return -1;
    loop->items = items.l;
    loop->depth = depth;
    loop->node = n;
    loop->scope = s;
    pj_value lv = {.type = PJ_LOOP, .loop = loop};
    for (size_t i = 0; i < items.l->n; i++) {
        loop->index0 = i;
        pj_scope *is = scope_new(c, s);
        if (!is || assign(c, is, n->t, items.l->items[i]) || pj_scope_set(c, is, "loop", lv)) return -1;
        int rc = exec_body(c, is, n->b);
        if (rc < 0) return -1;
        if (rc == 1) break;
    }
    return 0;
}

static int exec_for(pj_ctx *c, pj_scope *s, const pj_node *n) {
    pj_value it;
    if (eval(c, s, n->a, &it)) return -1;
    return exec_for_items(c, s, n, it, 1);
}

/* loop(children) inside a `for ... recursive`: renders the loop body over
 * the children one level deeper and returns the text. */
static int call_loop(pj_ctx *c, const pj_loop *l, pj_args *a, pj_value *out) {
    if (!l->node->neg)
        return pj_fail(c, "TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    if (a->n_pos != 1 || a->n_kw) return pj_fail(c, "TypeError", "loop() takes exactly one argument");
    pj_buf buf = {.c = c};
    pj_buf *saved = c->out;
    c->out = &buf;
    int rc = exec_for_items(c, l->scope, l->node, a->pos[0], l->depth + 1);
    c->out = saved;
    if (rc < 0) return -1;
    *out = pj_buf_value(&buf);
    return 0;
}

static int exec_stmt_node(pj_ctx *c, pj_scope *s, const pj_node *n);
static int exec_stmt(pj_ctx *c, pj_scope *s, const pj_node *n) {
    if (++c->edepth > PJ_MAX_EVAL_DEPTH) {
        c->edepth--;
        return pj_fail(c, "RecursionError", "maximum recursion depth exceeded");
    }
    int rc = exec_stmt_node(c, s, n);
    c->edepth--;
    return rc;
}

static int exec_stmt_node(pj_ctx *c, pj_scope *s, const pj_node *n) {
    if (c->failed) return -1;
    if (++c->steps > c->max_steps) return pj_fail(c, "RuntimeError", "the template ran too long");
    c->line = n->line;
    pj_value v;
    switch (n->kind) {
    case PJ_N_TEXT: return pj_buf_put(c->out, n->name, n->len);
    case PJ_N_OUTPUT:
        if (eval(c, s, n->a, &v)) return -1;
        return pj_str_of(c, v, c->out);
    case PJ_N_IF:
        if (eval(c, s, n->a, &v)) return -1;
        if (pj_truthy(v)) return exec_body(c, s, n->b);
        return n->c ? exec_body(c, s, n->c) : 0;
    case PJ_N_FOR: return exec_for(c, s, n);
    case PJ_N_SET:
        if (n->a) {
            if (eval(c, s, n->a, &v)) return -1;
        } else {
            pj_buf buf = {.c = c};
            pj_buf *saved = c->out;
            c->out = &buf;
            int rc = exec_body(c, s, n->b);
            c->out = saved;
            if (rc < 0) return -1;
            v = pj_buf_value(&buf);
            if (n->d) {
                pj_value in = v;
                if (eval_filter(c, s, n->d, &in, &v)) return -1;
            }
        }
        return assign(c, s, n->t, v);
    case PJ_N_MACRO: {
        pj_func *fn = pj_alloc(c, sizeof *fn);
        if (!fn) return -1;
        fn->kind = PJ_FN_MACRO;
        fn->name = n->name;
        fn->macro = n;
        fn->closure = s;
        return pj_scope_set(c, s, n->name, (pj_value){.type = PJ_FUNC, .fn = fn});
    }
    case PJ_N_CALLBLOCK: {
        pj_func *caller = pj_alloc(c, sizeof *caller);
        if (!caller) return -1;
        caller->kind = PJ_FN_CALLER;
        caller->name = "caller";
        caller->macro = n;
        caller->closure = s;
        pj_value fn;
        if (eval(c, s, n->a->a, &fn)) return -1;
        if (fn.type != PJ_FUNC || fn.fn->kind != PJ_FN_MACRO)
            return pj_fail(c, "TypeError", "{%% call %%} needs a macro, got '%s'", pj_type_name(fn));
        pj_func *bound = pj_alloc(c, sizeof *bound);
        if (!bound) return -1;
        *bound = *fn.fn;
        bound->caller = caller;
        pj_args args;
        if (eval_args(c, s, n->a, NULL, &args)) return -1;
        if (call_macro(c, bound, &args, &v)) return -1;
        return pj_buf_put(c->out, v.s, v.len);
    }
    case PJ_N_FILTERBLOCK: {
        pj_buf buf = {.c = c};
        pj_buf *saved = c->out;
        c->out = &buf;
        int rc = exec_body(c, s, n->b);
        c->out = saved;
        if (rc < 0) return -1;
        pj_value in = pj_buf_value(&buf);
        if (eval_filter(c, s, n->d, &in, &v)) return -1;
        return pj_str_of(c, v, c->out);
    }
    case PJ_N_WITH: {
        pj_scope *ws = scope_new(c, s);
        if (!ws) return -1;
        for (int i = 0; i < n->n_kids; i++) {
            if (eval(c, ws, n->kids[i], &v) || pj_scope_set(c, ws, n->names[i], v)) return -1;
        }
        return exec_body(c, ws, n->b);
    }
    case PJ_N_BREAK: return 1;
    case PJ_N_CONTINUE: return 2;
    case PJ_N_BODY: return exec_body(c, s, n);
    }
    return pj_fail(c, "TemplateRuntimeError", "unexpected statement %d", n->kind);
}

static int exec_body(pj_ctx *c, pj_scope *s, const pj_node *body) {
    for (int i = 0; i < body->n_kids; i++) {
        int rc = exec_stmt(c, s, body->kids[i]);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------- entry points */

pt_status pt_jinja_parse(const char *src, size_t len, const char *name, pt_jinja_template **out) {
    *out = NULL;
    if (!name) name = "<template>";
    long bad = pt_utf8_invalid_offset(src, len);
    if (bad >= 0) return pt_error(PT_ERR_FORMAT, "%s: template is not valid UTF-8 (byte %ld)", name, bad);
    pt_jinja_template *t = calloc(1, sizeof *t);
    if (!t) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_arena_init(&t->arena, 1 << 16);
    t->name = strdup(name);
    if (!t->name) {
        pt_jinja_free(&t);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    pt_status st = pj_parse(t, src, len);
    if (st != PT_OK) {
        pt_jinja_free(&t);
        return st;
    }
    *out = t;
    return PT_OK;
}

void pt_jinja_free(pt_jinja_template **t) {
    if (!t || !*t) return;
    pt_arena_free(&(*t)->arena);
    free((*t)->name);
    free(*t);
    *t = NULL;
}

pt_status pt_jinja_render(const pt_jinja_template *t, const pt_jinja_vars *vars, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    pt_arena arena;
    pt_arena_init(&arena, 1 << 16);
    pj_ctx c = {.arena = &arena, .tname = t->name};
    c.max_steps = vars && vars->max_steps > 0 ? vars->max_steps : PJ_MAX_STEPS;
    c.max_bytes = vars && vars->max_bytes > 0 ? vars->max_bytes : PJ_MAX_BYTES;
    if (vars && vars->now) c.now = *vars->now;
    else {
        time_t now = time(NULL);
        localtime_r(&now, &c.now);
    }
    pt_status st = PT_OK;
    pj_value v = pj_dict_new(&c, 0);
    if (vars && vars->vars_json) {
        if (pj_value_from_json(&c, vars->vars_json, vars->vars_json_len, &v) == 0 && v.type != PJ_DICT)
            pj_fail(&c, "ValueError", "variables must be a JSON object");
        if (c.failed) st = pt_error(PT_ERR_INVALID_ARG, "%s", c.err);
    } else if (vars && vars->vars) {
        if (!cJSON_IsObject(vars->vars)) pj_fail(&c, "ValueError", "variables must be a JSON object");
        else pj_value_from_cjson(&c, vars->vars, &v);
        if (c.failed) st = pt_error(PT_ERR_INVALID_ARG, "%s", c.err);
    }
    if (st == PT_OK) {
        pj_scope *globals = scope_new(&c, NULL);
        pj_scope *varscope = scope_new(&c, globals);
        pj_scope *root = scope_new(&c, varscope);
        pj_buf buf = {.c = &c};
        c.out = &buf;
        if (globals && varscope && root && pj_install_globals(&c, globals) == 0) {
            for (size_t i = 0; i < v.d->n; i++) {
                const pj_value *k = &v.d->keys[i];
                char *name = pj_alloc(&c, k->len + 1);
                if (!name) break;
                memcpy(name, k->s, k->len);
                pj_scope_set(&c, varscope, name, v.d->vals[i]);
            }
            if (!c.failed) exec_body(&c, root, t->root);
        }
        if (c.failed) st = pt_error(PT_ERR_FORMAT, "%s:%d: %s", t->name, c.line, c.err);
        else {
            *out = malloc(buf.n + 1);
            if (!*out) st = pt_error(PT_ERR_NOMEM, "out of memory");
            else {
                if (buf.n) memcpy(*out, buf.p, buf.n);
                (*out)[buf.n] = 0;
                if (out_len) *out_len = buf.n;
            }
        }
    }
    pt_arena_free(&arena);
    return st;
}

/* Operators for the builtins (tests odd/even/divisibleby/in). */
int pj_binop_public(pj_ctx *c, int op, pj_value a, pj_value b, pj_value *out);
int pj_binop_public(pj_ctx *c, int op, pj_value a, pj_value b, pj_value *out) { return binop(c, op, a, b, out); }
int pj_contains_public(pj_ctx *c, pj_value item, pj_value seq, int *out);
int pj_contains_public(pj_ctx *c, pj_value item, pj_value seq, int *out) { return contains(c, item, seq, out); }
