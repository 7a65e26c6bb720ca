/* Parser of the Jinja engine: tokens (jinja_lex.c) -> syntax tree, with
 * jinja2's grammar, operator precedence and compile-time checks (unknown
 * tags; unknown filters and tests outside if-statements). Not the evaluator
 * (jinja_eval.c). */
#include "tokenizer/jinja_parse.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pj_perr(parser *p, int line, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    p->err_line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    return -1;
}

void *pj_palloc(parser *p, size_t n) {
    void *m = pt_arena_alloc(&p->t->arena, n ? n : 1);
    if (!m) pj_perr(p, 0, "out of memory");
    return m;
}

/* ----------------------------------------------------------------- parser */

static tok *cur(parser *p) { return &p->toks[p->pos]; }
static tok *peek(parser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->n ? i : p->n - 1];
}
static void next(parser *p) {
    if (p->pos + 1 < p->n) p->pos++;
}
static int is_op(const tok *t, const char *op) {
    return t->type == T_OP && t->len == strlen(op) && !memcmp(t->s, op, t->len);
}
static int is_name(const tok *t, const char *name) {
    return t->type == T_NAME && t->len == strlen(name) && !memcmp(t->s, name, t->len);
}
static const char *tok_desc(const tok *t, char *buf, size_t n) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_END: return "end of statement block";
    case T_TEXT: return "template data";
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default: snprintf(buf, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s); return buf;
    }
}
static int expect_op(parser *p, const char *op) {
    if (is_op(cur(p), op)) {
        next(p);
        return 0;
    }
    char b[64];
    return pj_perr(p, cur(p)->line, "expected token '%s', got %s", op, tok_desc(cur(p), b, sizeof b));
}
static const char *tok_name(parser *p, const tok *t) {
    char *s = pj_palloc(p, t->len + 1);
    if (s) memcpy(s, t->s, t->len);
    return s;
}

static pj_node *mk(parser *p, int kind, int line) {
    pj_node *n = pj_palloc(p, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = line;
    }
    return n;
}

/* A growable list of child nodes (and keyword names). */
typedef struct kids {
    pj_node **k;
    const char **names;
    int n, cap;
} kids;
static int kids_push(parser *p, kids *ks, pj_node *n, const char *name) {
    if (ks->n == ks->cap) {
        int cap = ks->cap ? ks->cap * 2 : 4;
        pj_node **k = pj_palloc(p, (size_t)cap * sizeof *k);
        const char **nm = pj_palloc(p, (size_t)cap * sizeof *nm);
        if (!k || !nm) return -1;
        if (ks->n) {
            memcpy(k, ks->k, (size_t)ks->n * sizeof *k);
            memcpy(nm, ks->names, (size_t)ks->n * sizeof *nm);
        }
        ks->k = k;
        ks->names = nm;
        ks->cap = cap;
    }
    ks->k[ks->n] = n;
    ks->names[ks->n] = name;
    ks->n++;
    return 0;
}
static void kids_set(pj_node *n, kids *ks) {
    n->kids = ks->k;
    n->n_kids = ks->n;
    n->names = ks->names;
    n->n_names = ks->n;
}

static pj_node *parse_expr(parser *p, int with_condexpr);
static pj_node *parse_unary(parser *p, int with_filter);
static pj_node *parse_primary(parser *p);
static pj_node *parse_postfix(parser *p, pj_node *n);

static int enter(parser *p) {
    if (++p->depth > MAX_DEPTH) return pj_perr(p, cur(p)->line, "template nested too deeply");
    return 0;
}

/* Comma-separated expressions; a tuple when a comma appears. end_names: extra
 * names that end the tuple ("in", "recursive"). */
static pj_node *parse_tuple(parser *p, int with_condexpr, int explicit_parens, const char *const *end_names,
                            int simplified) {
    int line = cur(p)->line;
    kids ks = {0};
    int is_tuple = 0;
    for (;;) {
        if (ks.n) {
            if (!is_op(cur(p), ",")) break;
            next(p);
        }
        tok *t = cur(p);
        int end = t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF || is_op(t, ")");
        for (int k = 0; end_names && end_names[k]; k++) end |= is_name(t, end_names[k]);
        if (end) break;
        pj_node *e = simplified ? parse_primary(p) : parse_expr(p, with_condexpr);
        if (!e) return NULL;
        kids_push(p, &ks, e, NULL);
        if (is_op(cur(p), ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (ks.n) return ks.k[0];
        if (!explicit_parens) {
            char b[64];
            pj_perr(p, cur(p)->line, "Expected an expression, got %s", tok_desc(cur(p), b, sizeof b));
            return NULL;
        }
    }
    pj_node *n = mk(p, PJ_N_TUPLE, line);
    if (n) kids_set(n, &ks);
    return n;
}

static int parse_call_args(parser *p, kids *ks) {
    if (expect_op(p, "(")) return -1;
    int seen_kw = 0;
    while (!is_op(cur(p), ")")) {
        if (ks->n) {
            if (expect_op(p, ",")) return -1;
            if (is_op(cur(p), ")")) break;
        }
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            return pj_perr(p, cur(p)->line, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), "=")) {
            const char *name = tok_name(p, cur(p));
            next(p);
            next(p);
            pj_node *e = parse_expr(p, 1);
            if (!e) return -1;
            kids_push(p, ks, e, name);
            seen_kw = 1;
        } else {
            if (seen_kw) return pj_perr(p, cur(p)->line, "invalid syntax for function call expression");
            pj_node *e = parse_expr(p, 1);
            if (!e) return -1;
            kids_push(p, ks, e, NULL);
        }
    }
    next(p);
    return p->failed ? -1 : 0;
}

static const char *parse_dotted_name(parser *p) {
    if (cur(p)->type != T_NAME) {
        char b[64];
        pj_perr(p, cur(p)->line, "expected token 'name', got %s", tok_desc(cur(p), b, sizeof b));
        return NULL;
    }
    size_t len = cur(p)->len;
    const char *start = cur(p)->s;
    next(p);
    while (is_op(cur(p), ".") && peek(p, 1)->type == T_NAME) {
        next(p);
        len = (size_t)(cur(p)->s + cur(p)->len - start);
        next(p);
    }
    char *s = pj_palloc(p, len + 1);
    if (s) memcpy(s, start, len);
    return s;
}

/* |name(args) applied to `arg` (NULL inside a filter block). */
static pj_node *parse_filter(parser *p, pj_node *arg, int start_inline) {
    while (is_op(cur(p), "|") || start_inline) {
        if (!start_inline) next(p);
        start_inline = 0;
        int line = cur(p)->line;
        const char *name = parse_dotted_name(p);
        if (!name) return NULL;
        pj_node *f = mk(p, PJ_N_FILTER, line);
        if (!f) return NULL;
        f->op = !pj_has_filter(name); /* unknown: checked after parsing (soft frames) */
        f->name = name;
        f->a = arg;
        kids ks = {0};
        if (is_op(cur(p), "(") && parse_call_args(p, &ks)) return NULL;
        kids_set(f, &ks);
        arg = f;
    }
    return arg;
}

static pj_node *parse_test(parser *p, pj_node *arg) {
    int line = cur(p)->line;
    next(p); /* is */
    int neg = 0;
    if (is_name(cur(p), "not")) {
        neg = 1;
        next(p);
    }
    const char *name = parse_dotted_name(p);
    if (!name) return NULL;
    pj_node *n = mk(p, PJ_N_TEST, line);
    if (!n) return NULL;
    n->op = !pj_has_test(name); /* unknown: checked after parsing (soft frames) */
    n->name = name;
    n->a = arg;
    n->neg = neg;
    kids ks = {0};
    tok *t = cur(p);
    if (is_op(t, "(")) {
        if (parse_call_args(p, &ks)) return NULL;
    } else if ((t->type == T_NAME || t->type == T_STRING || t->type == T_INT || t->type == T_FLOAT ||
                is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) {
            pj_perr(p, t->line, "You cannot chain multiple tests with is");
            return NULL;
        }
        pj_node *a = parse_primary(p);
        if (a) a = parse_postfix(p, a);
        if (!a) return NULL;
        kids_push(p, &ks, a, NULL);
    }
    kids_set(n, &ks);
    return n;
}

static pj_node *parse_filter_expr(parser *p, pj_node *n) {
    for (;;) {
        if (!n) return NULL;
        if (is_op(cur(p), "|")) n = parse_filter(p, n, 0);
        else if (is_name(cur(p), "is")) n = parse_test(p, n);
        else if (is_op(cur(p), "(")) {
            pj_node *c = mk(p, PJ_N_CALL, cur(p)->line);
            kids ks = {0};
            if (!c || parse_call_args(p, &ks)) return NULL;
            c->a = n;
            kids_set(c, &ks);
            n = c;
        } else return n;
    }
}

static pj_node *parse_subscript(parser *p, pj_node *obj) {
    int line = cur(p)->line;
    next(p); /* [ */
    pj_node *parts[3] = {NULL, NULL, NULL};
    int is_slice = 0;
    if (!is_op(cur(p), ":")) {
        parts[0] = parse_expr(p, 1);
        if (!parts[0]) return NULL;
    }
    if (is_op(cur(p), ":")) {
        is_slice = 1;
        next(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ":")) {
            parts[1] = parse_expr(p, 1);
            if (!parts[1]) return NULL;
        }
        if (is_op(cur(p), ":")) {
            next(p);
            if (!is_op(cur(p), "]")) {
                parts[2] = parse_expr(p, 1);
                if (!parts[2]) return NULL;
            }
        }
    }
    if (expect_op(p, "]")) return NULL;
    pj_node *n = mk(p, is_slice ? PJ_N_SLICE : PJ_N_GETITEM, line);
    if (!n) return NULL;
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static pj_node *parse_postfix(parser *p, pj_node *n) {
    for (;;) {
        if (!n) return NULL;
        tok *t = cur(p);
        if (is_op(t, ".")) {
            next(p);
            tok *a = cur(p);
            if (a->type == T_NAME) {
                pj_node *g = mk(p, PJ_N_GETATTR, a->line);
                if (!g) return NULL;
                g->a = n;
                g->name = tok_name(p, a);
                next(p);
                n = g;
            } else if (a->type == T_INT) {
                pj_node *g = mk(p, PJ_N_GETITEM, a->line);
                pj_node *k = mk(p, PJ_N_CONST, a->line);
                if (!g || !k) return NULL;
                k->value = pj_int(a->i);
                g->a = n;
                g->b = k;
                next(p);
                n = g;
            } else {
                pj_perr(p, a->line, "expected name or number");
                return NULL;
            }
        } else if (is_op(t, "[")) {
            n = parse_subscript(p, n);
        } else if (is_op(t, "(")) {
            pj_node *c = mk(p, PJ_N_CALL, t->line);
            kids ks = {0};
            if (!c || parse_call_args(p, &ks)) return NULL;
            c->a = n;
            kids_set(c, &ks);
            n = c;
        } else return n;
    }
}

static pj_node *parse_primary(parser *p) {
    if (enter(p)) return NULL;
    tok *t = cur(p);
    pj_node *n = NULL;
    if (t->type == T_NAME) {
        n = mk(p, PJ_N_CONST, t->line);
        if (!n) return NULL;
        if (is_name(t, "true") || is_name(t, "True")) n->value = pj_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) n->value = pj_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) n->value = pj_none();
        else {
            n->kind = PJ_N_NAME;
            n->name = tok_name(p, t);
        }
        next(p);
    } else if (t->type == T_STRING) {
        n = mk(p, PJ_N_CONST, t->line);
        if (!n) return NULL;
        /* adjacent literals concatenate */
        size_t len = 0, k = p->pos;
        while (p->toks[k].type == T_STRING) len += p->toks[k++].len;
        char *s = pj_palloc(p, len + 1);
        if (!s) return NULL;
        size_t o = 0;
        while (cur(p)->type == T_STRING) {
            memcpy(s + o, cur(p)->s, cur(p)->len);
            o += cur(p)->len;
            next(p);
        }
        n->value = pj_str(s, len);
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = mk(p, PJ_N_CONST, t->line);
        if (!n) return NULL;
        n->value = t->type == T_INT ? pj_int(t->i) : pj_float(t->f);
        next(p);
    } else if (is_op(t, "(")) {
        next(p);
        n = parse_tuple(p, 1, 1, NULL, 0);
        if (n && expect_op(p, ")")) n = NULL;
    } else if (is_op(t, "[") || is_op(t, "{")) {
        int is_dict = is_op(t, "{");
        const char *close = is_dict ? "}" : "]";
        n = mk(p, is_dict ? PJ_N_DICT : PJ_N_LIST, t->line);
        if (!n) return NULL;
        next(p);
        kids ks = {0};
        while (!is_op(cur(p), close)) {
            if (ks.n) {
                if (expect_op(p, ",")) return NULL;
                if (is_op(cur(p), close)) break;
            }
            pj_node *e = parse_expr(p, 1);
            if (!e) return NULL;
            kids_push(p, &ks, e, NULL);
            if (is_dict) {
                if (expect_op(p, ":")) return NULL;
                e = parse_expr(p, 1);
                if (!e) return NULL;
                kids_push(p, &ks, e, NULL);
            }
        }
        next(p);
        kids_set(n, &ks);
    } else {
        char b[64];
        pj_perr(p, t->line, "unexpected %s", tok_desc(t, b, sizeof b));
    }
    p->depth--;
    return p->failed ? NULL : n;
}

static pj_node *parse_unary(parser *p, int with_filter) {
    if (enter(p)) return NULL;
    tok *t = cur(p);
    pj_node *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        n = mk(p, PJ_N_UNARY, t->line);
        if (!n) return NULL;
        n->op = is_op(t, "-") ? PJ_OP_SUB : PJ_OP_ADD;
        next(p);
        n->a = parse_unary(p, 0);
        if (!n->a) return NULL;
    } else n = parse_primary(p);
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static pj_node *binary(parser *p, int kind, int op, int line, pj_node *a, pj_node *b) {
    if (!a || !b) return NULL;
    pj_node *n = mk(p, kind, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static pj_node *parse_pow(parser *p) {
    pj_node *n = parse_unary(p, 1);
    while (n && is_op(cur(p), "**")) {
        int line = cur(p)->line;
        next(p);
        n = binary(p, PJ_N_BINARY, PJ_OP_POW, line, n, parse_unary(p, 1));
    }
    return n;
}

static pj_node *parse_math2(parser *p) {
    pj_node *n = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*") ? PJ_OP_MUL : is_op(t, "/") ? PJ_OP_DIV : is_op(t, "//") ? PJ_OP_FLOORDIV
                 : is_op(t, "%") ? PJ_OP_MOD : 0;
        if (!n || !op) return n;
        next(p);
        n = binary(p, PJ_N_BINARY, op, t->line, n, parse_pow(p));
    }
}

static pj_node *parse_concat(parser *p) {
    pj_node *n = parse_math2(p);
    while (n && is_op(cur(p), "~")) {
        int line = cur(p)->line;
        next(p);
        n = binary(p, PJ_N_CONCAT, 0, line, n, parse_math2(p));
    }
    return n;
}

static pj_node *parse_math1(parser *p) {
    pj_node *n = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? PJ_OP_ADD : is_op(t, "-") ? PJ_OP_SUB : 0;
        if (!n || !op) return n;
        next(p);
        n = binary(p, PJ_N_BINARY, op, t->line, n, parse_concat(p));
    }
}

static pj_node *parse_compare(parser *p) {
    pj_node *n = parse_math1(p);
    pj_node *prev_rhs = NULL;
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "==") ? PJ_OP_EQ : is_op(t, "!=") ? PJ_OP_NE : is_op(t, "<") ? PJ_OP_LT
                 : is_op(t, "<=") ? PJ_OP_LE : is_op(t, ">") ? PJ_OP_GT : is_op(t, ">=") ? PJ_OP_GE
                 : is_name(t, "in") ? PJ_OP_IN : 0;
        if (!op && is_name(t, "not") && is_name(peek(p, 1), "in")) {
            op = PJ_OP_NOTIN;
            next(p);
        }
        if (!n || !op) return n;
        next(p);
        pj_node *rhs = parse_math1(p);
        /* a < b < c is (a < b) and (b < c), b evaluated twice */
        pj_node *cmp = binary(p, PJ_N_COMPARE, op, t->line, prev_rhs ? prev_rhs : n, rhs);
        n = prev_rhs ? binary(p, PJ_N_AND, 0, t->line, n, cmp) : cmp;
        prev_rhs = rhs;
    }
}

static pj_node *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        if (enter(p)) return NULL;
        pj_node *n = mk(p, PJ_N_NOT, cur(p)->line);
        next(p);
        if (n) n->a = parse_not(p);
        p->depth--;
        return n && n->a ? n : NULL;
    }
    return parse_compare(p);
}

static pj_node *parse_and(parser *p) {
    pj_node *n = parse_not(p);
    while (n && is_name(cur(p), "and")) {
        int line = cur(p)->line;
        next(p);
        n = binary(p, PJ_N_AND, 0, line, n, parse_not(p));
    }
    return n;
}

static pj_node *parse_or(parser *p) {
    pj_node *n = parse_and(p);
    while (n && is_name(cur(p), "or")) {
        int line = cur(p)->line;
        next(p);
        n = binary(p, PJ_N_OR, 0, line, n, parse_and(p));
    }
    return n;
}

static pj_node *parse_condexpr(parser *p) {
    pj_node *n = parse_or(p);
    while (n && is_name(cur(p), "if")) {
        if (enter(p)) return NULL;
        pj_node *c = mk(p, PJ_N_COND, cur(p)->line);
        next(p);
        if (!c) return NULL;
        c->b = n;
        c->a = parse_or(p);
        if (!c->a) return NULL;
        if (is_name(cur(p), "else")) {
            next(p);
            c->c = parse_condexpr(p);
            if (!c->c) return NULL;
        }
        p->depth--;
        n = c;
    }
    return n;
}

static pj_node *parse_expr(parser *p, int with_condexpr) {
    if (enter(p)) return NULL;
    pj_node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    p->depth--;
    return n;
}

/* -------------------------------------------------------------- statements */

static pj_node *parse_body(parser *p, const char *const *end_tags, const char *block);

static int expect_block_end(parser *p) {
    if (cur(p)->type == T_BLOCK_END) {
        next(p);
        return 0;
    }
    char b[64];
    return pj_perr(p, cur(p)->line, "expected token 'end of statement block', got %s",
                tok_desc(cur(p), b, sizeof b));
}

/* An assignment target: a name, a tuple of names, or (with_ns) name.attr. */
static pj_node *parse_target(parser *p, int with_ns, const char *const *end_names) {
    tok *t = cur(p);
    if (with_ns && t->type == T_NAME && is_op(peek(p, 1), ".") && peek(p, 2)->type == T_NAME) {
        pj_node *n = mk(p, PJ_N_GETATTR, t->line);
        pj_node *o = mk(p, PJ_N_NAME, t->line);
        if (!n || !o) return NULL;
        o->name = tok_name(p, t);
        n->a = o;
        n->name = tok_name(p, peek(p, 2));
        next(p);
        next(p);
        next(p);
        return n;
    }
    pj_node *n = parse_tuple(p, 1, 0, end_names, 1);
    if (!n) return NULL;
    if (n->kind == PJ_N_NAME) return n;
    if (n->kind == PJ_N_TUPLE) {
        for (int i = 0; i < n->n_kids; i++)
            if (n->kids[i]->kind != PJ_N_NAME) goto bad;
        return n;
    }
bad:
    pj_perr(p, t->line, "can't assign to '%s'", n->kind == PJ_N_CONST ? "const" : "expression");
    return NULL;
}

/* 1 if the subtree loads `name` (jinja2's find_undeclared for varargs/kwargs). */
static int refs_name(const pj_node *n, const char *name, int depth) {
    if (!n || depth > 4 * MAX_DEPTH) return 0;
    if (n->kind == PJ_N_NAME && !strcmp(n->name, name)) return 1;
    if (refs_name(n->a, name, depth + 1) || refs_name(n->b, name, depth + 1) || refs_name(n->c, name, depth + 1) ||
        refs_name(n->d, name, depth + 1) || refs_name(n->t, name, depth + 1))
        return 1;
    for (int i = 0; i < n->n_kids; i++)
        if (refs_name(n->kids[i], name, depth + 1)) return 1;
    return 0;
}

static void set_catch(pj_node *n) {
    n->op = (refs_name(n->b, "varargs", 0) ? PJ_CATCH_VARARGS : 0) | (refs_name(n->b, "kwargs", 0) ? PJ_CATCH_KWARGS : 0);
}

static int parse_params(parser *p, pj_node *n) {
    kids ks = {0}; /* names: parameter names; kids: defaults (NULL for none) */
    if (expect_op(p, "(")) return -1;
    while (!is_op(cur(p), ")")) {
        if (ks.n && expect_op(p, ",")) return -1;
        if (cur(p)->type != T_NAME) return pj_perr(p, cur(p)->line, "expected a parameter name");
        const char *name = tok_name(p, cur(p));
        next(p);
        pj_node *def = NULL;
        if (is_op(cur(p), "=")) {
            next(p);
            def = parse_expr(p, 1);
            if (!def) return -1;
        } else if (ks.n && ks.k[ks.n - 1])
            return pj_perr(p, cur(p)->line, "non-default argument follows default argument");
        kids_push(p, &ks, def, name);
    }
    next(p);
    kids_set(n, &ks);
    return p->failed ? -1 : 0;
}

static pj_node *parse_statement(parser *p) {
    tok *t = cur(p); /* the tag name, after {% */
    int line = t->line;
    if (t->type != T_NAME) {
        pj_perr(p, line, "tag name expected");
        return NULL;
    }
    pj_node *n = NULL;
    if (is_name(t, "if")) {
        next(p);
        n = mk(p, PJ_N_IF, line);
        if (!n || !(n->a = parse_tuple(p, 0, 0, NULL, 0)) || expect_block_end(p)) return NULL;
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        pj_node *node = n;
        for (;;) {
            node->b = parse_body(p, ends, "if");
            if (!node->b) return NULL;
            tok *e = cur(p);
            next(p);
            if (is_name(e, "elif")) {
                pj_node *m = mk(p, PJ_N_IF, e->line);
                if (!m || !(m->a = parse_tuple(p, 0, 0, NULL, 0)) || expect_block_end(p)) return NULL;
                pj_node *body = mk(p, PJ_N_BODY, e->line);
                if (!body) return NULL;
                kids ks = {0};
                kids_push(p, &ks, m, NULL);
                kids_set(body, &ks);
                node->c = body;
                node = m;
                continue;
            }
            if (is_name(e, "else")) {
                static const char *const ends2[] = {"endif", NULL};
                if (expect_block_end(p) || !(node->c = parse_body(p, ends2, "if"))) return NULL;
                next(p);
            }
            break;
        }
    } else if (is_name(t, "for")) {
        next(p);
        n = mk(p, PJ_N_FOR, line);
        static const char *const in_end[] = {"in", NULL};
        static const char *const iter_end[] = {"recursive", NULL};
        if (!n || !(n->t = parse_target(p, 0, in_end))) return NULL;
        if (!is_name(cur(p), "in")) {
            pj_perr(p, cur(p)->line, "expected 'in' in for loop");
            return NULL;
        }
        next(p);
        if (!(n->a = parse_tuple(p, 0, 0, iter_end, 0))) return NULL;
        if (is_name(cur(p), "if")) {
            next(p);
            if (!(n->d = parse_expr(p, 1))) return NULL;
        }
        if (is_name(cur(p), "recursive")) {
            next(p);
            n->neg = 1;
        }
        if (expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endfor", "else", NULL};
        if (!(n->b = parse_body(p, ends, "for"))) return NULL;
        if (is_name(cur(p), "else")) {
            next(p);
            static const char *const ends2[] = {"endfor", NULL};
            if (expect_block_end(p) || !(n->c = parse_body(p, ends2, "for"))) return NULL;
        }
        next(p);
    } else if (is_name(t, "set")) {
        next(p);
        n = mk(p, PJ_N_SET, line);
        if (!n || !(n->t = parse_target(p, 1, NULL))) return NULL;
        if (is_op(cur(p), "=")) {
            next(p);
            if (!(n->a = parse_tuple(p, 1, 0, NULL, 0))) return NULL;
            return expect_block_end(p) ? NULL : n;
        }
        if (n->t->kind != PJ_N_NAME && n->t->kind != PJ_N_GETATTR) {
            pj_perr(p, line, "expected token '=' after a tuple target");
            return NULL;
        }
        if (is_op(cur(p), "|") && !(n->d = parse_filter(p, NULL, 0))) return NULL;
        static const char *const ends[] = {"endset", NULL};
        if (expect_block_end(p) || !(n->b = parse_body(p, ends, "set"))) return NULL;
        next(p);
    } else if (is_name(t, "macro")) {
        next(p);
        n = mk(p, PJ_N_MACRO, line);
        if (!n) return NULL;
        if (cur(p)->type != T_NAME) {
            pj_perr(p, line, "expected a macro name");
            return NULL;
        }
        n->name = tok_name(p, cur(p));
        next(p);
        if (parse_params(p, n) || expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        if (!(n->b = parse_body(p, ends, "macro"))) return NULL;
        set_catch(n);
        next(p);
    } else if (is_name(t, "call")) {
        next(p);
        n = mk(p, PJ_N_CALLBLOCK, line);
        if (!n) return NULL;
        if (is_op(cur(p), "(")) {
            if (parse_params(p, n)) return NULL;
        }
        n->name = "caller";
        if (!(n->a = parse_expr(p, 1))) return NULL;
        if (n->a->kind != PJ_N_CALL) {
            pj_perr(p, line, "expected call");
            return NULL;
        }
        static const char *const ends[] = {"endcall", NULL};
        if (expect_block_end(p) || !(n->b = parse_body(p, ends, "call"))) return NULL;
        set_catch(n);
        next(p);
    } else if (is_name(t, "filter")) {
        next(p);
        n = mk(p, PJ_N_FILTERBLOCK, line);
        if (!n || !(n->d = parse_filter(p, NULL, 1))) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        if (expect_block_end(p) || !(n->b = parse_body(p, ends, "filter"))) return NULL;
        next(p);
    } else if (is_name(t, "with")) {
        next(p);
        n = mk(p, PJ_N_WITH, line);
        kids ks = {0};
        while (n && cur(p)->type != T_BLOCK_END) {
            if (ks.n && expect_op(p, ",")) return NULL;
            if (cur(p)->type != T_NAME || !is_op(peek(p, 1), "=")) {
                pj_perr(p, cur(p)->line, "expected an assignment in with");
                return NULL;
            }
            const char *name = tok_name(p, cur(p));
            next(p);
            next(p);
            pj_node *e = parse_expr(p, 1);
            if (!e) return NULL;
            kids_push(p, &ks, e, name);
        }
        if (!n) return NULL;
        kids_set(n, &ks);
        static const char *const ends[] = {"endwith", NULL};
        if (expect_block_end(p) || !(n->b = parse_body(p, ends, "with"))) return NULL;
        next(p);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        int in_loop = 0;
        for (int i = 0; i < p->n_open; i++) {
            if (!strcmp(p->open[i], "for")) in_loop = 1;
            if (!strcmp(p->open[i], "macro") || !strcmp(p->open[i], "call")) in_loop = 0;
        }
        if (!in_loop) {
            pj_perr(p, line, "'%.*s' outside of a loop", (int)t->len, t->s);
            return NULL;
        }
        n = mk(p, is_name(t, "break") ? PJ_N_BREAK : PJ_N_CONTINUE, line);
        next(p);
    } else {
        static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", NULL};
        for (int i = 0; unsupported[i]; i++)
            if (is_name(t, unsupported[i])) {
                pj_perr(p, line, "the '%s' tag is not supported by petrel's template engine", unsupported[i]);
                return NULL;
            }
        /* jinja2's message for an unknown tag */
        char msg[256];
        int k = snprintf(msg, sizeof msg, "Encountered unknown tag '%.*s'.", (int)(t->len > 40 ? 40 : t->len), t->s);
        if (p->n_open > 0 && k > 0 && (size_t)k < sizeof msg)
            snprintf(msg + k, sizeof msg - (size_t)k, " The innermost block that needs to be closed is '%s'.",
                     p->open[p->n_open - 1]);
        pj_perr(p, line, "%s", msg);
        return NULL;
    }
    if (n && (n->kind == PJ_N_BREAK || n->kind == PJ_N_CONTINUE)) return expect_block_end(p) ? NULL : n;
    if (n && expect_block_end(p)) return NULL;
    return n;
}

/* Parses statements until a block tag named in end_tags (left as the current
 * token, after its {%) or the end of the template (end_tags NULL). */
static pj_node *parse_body(parser *p, const char *const *end_tags, const char *block) {
    if (enter(p)) return NULL;
    if (block) {
        if (p->n_open >= (int)(sizeof p->open / sizeof p->open[0])) {
            pj_perr(p, cur(p)->line, "blocks nested too deeply");
            return NULL;
        }
        p->open[p->n_open++] = block;
    }
    pj_node *body = mk(p, PJ_N_BODY, cur(p)->line);
    kids ks = {0};
    while (body && !p->failed) {
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (end_tags) {
                pj_perr(p, t->line, "Unexpected end of template. Jinja was looking for the following tags: '%s'. "
                     "The innermost block that needs to be closed is '%s'.", end_tags[0], block);
                return NULL;
            }
            break;
        }
        if (t->type == T_TEXT) {
            pj_node *n = mk(p, PJ_N_TEXT, t->line);
            if (!n) return NULL;
            n->name = t->s;
            n->len = t->len;
            kids_push(p, &ks, n, NULL);
            next(p);
        } else if (t->type == T_VAR_BEGIN) {
            next(p);
            pj_node *n = mk(p, PJ_N_OUTPUT, t->line);
            if (!n || !(n->a = parse_tuple(p, 1, 0, NULL, 0))) return NULL;
            if (cur(p)->type != T_VAR_END) {
                char b[64];
                pj_perr(p, cur(p)->line, "expected token 'end of print statement', got %s", tok_desc(cur(p), b, sizeof b));
                return NULL;
            }
            next(p);
            kids_push(p, &ks, n, NULL);
        } else if (t->type == T_BLOCK_BEGIN) {
            next(p);
            tok *name = cur(p);
            int is_end = 0;
            for (int k = 0; end_tags && end_tags[k]; k++) is_end |= is_name(name, end_tags[k]);
            if (is_end) break;
            if (name->type == T_NAME && name->len > 3 && !memcmp(name->s, "end", 3)) {
                pj_perr(p, name->line, "Encountered unknown tag '%.*s'.%s%s%s", (int)(name->len > 40 ? 40 : name->len),
                     name->s, block ? " The innermost block that needs to be closed is '" : "",
                     block ? block : "", block ? "'." : "");
                return NULL;
            }
            if (name->type == T_NAME && end_tags &&
                (is_name(name, "elif") || is_name(name, "else"))) {
                pj_perr(p, name->line, "Encountered unknown tag '%.*s'. Jinja was looking for the following tags: '%s'. "
                     "The innermost block that needs to be closed is '%s'.", (int)name->len, name->s, end_tags[0], block);
                return NULL;
            }
            pj_node *n = parse_statement(p);
            if (!n) return NULL;
            kids_push(p, &ks, n, NULL);
        } else {
            pj_perr(p, t->line, "unexpected token");
            return NULL;
        }
    }
    if (p->failed || !body) return NULL;
    kids_set(body, &ks);
    if (block) p->n_open--;
    p->depth--;
    return body;
}

/* jinja2 rejects an unknown filter or test when compiling, except inside an
 * if statement (its test and bodies) or a conditional expression — a "soft
 * frame" — where it raises only when reached. Loop, macro, call, filter, with
 * and block-set bodies start a new, hard frame. */
static int check_unknown(parser *p, const pj_node *n, int soft, int depth) {
    if (!n || p->failed) return p->failed ? -1 : 0;
    if (depth > 4 * MAX_DEPTH) return pj_perr(p, n->line, "template nested too deeply");
    if ((n->kind == PJ_N_FILTER || n->kind == PJ_N_TEST) && n->op && !soft)
        return pj_perr(p, n->line, "No %s named '%s'.", n->kind == PJ_N_FILTER ? "filter" : "test", n->name);
    int inner_soft = soft;
    if (n->kind == PJ_N_IF || n->kind == PJ_N_COND) inner_soft = 1;
    const pj_node *kids4[4] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++) {
        int s = inner_soft;
        if (i == 1 && (n->kind == PJ_N_FOR || n->kind == PJ_N_MACRO || n->kind == PJ_N_CALLBLOCK ||
                       n->kind == PJ_N_FILTERBLOCK || n->kind == PJ_N_WITH || n->kind == PJ_N_SET))
            s = 0;
        if (i == 2 && n->kind == PJ_N_FOR) s = 0;
        if (i == 3 && n->kind == PJ_N_FOR) s = 0; /* the loop filter lives in the loop frame */
        if (check_unknown(p, kids4[i], s, depth + 1)) return -1;
    }
    if (check_unknown(p, n->t, soft, depth + 1)) return -1;
    for (int i = 0; i < n->n_kids; i++)
        if (check_unknown(p, n->kids[i], n->kind == PJ_N_MACRO ? 0 : inner_soft, depth + 1)) return -1;
    return 0;
}

pt_status pj_parse(pt_jinja_template *t, const char *src, size_t len) {
    parser p = {.t = t};
    /* jinja2 splits on \r\n, \r and \n, joins with \n, and drops one trailing newline */
    char *norm = pt_arena_alloc(&t->arena, len + 1);
    if (!norm) return pt_error(PT_ERR_NOMEM, "%s: out of memory", t->name);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else norm[n++] = src[i];
    }
    if (n > 0 && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    pt_status st = PT_OK;
    if (pj_lex(&p, norm, n) == 0) {
        t->root = parse_body(&p, NULL, NULL);
        if (t->root) check_unknown(&p, t->root, 0, 0);
    }
    if (p.failed || !t->root) {
        st = pt_error(PT_ERR_FORMAT, "%s:%d: TemplateSyntaxError: %s", t->name, p.err_line, p.err);
        t->root = NULL;
    }
    free(p.toks);
    return st;
}
