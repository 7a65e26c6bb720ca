/* Lexer and parser of the Jinja engine: template text -> syntax tree, with
 * jinja2's whitespace rules for apply_chat_template's environment
 * (trim_blocks, lstrip_blocks, `-`/`+` markers, one trailing newline of the
 * template dropped, newlines normalized to \n) and jinja2's expression
 * grammar and operator precedence. Not the evaluator (jinja_eval.c). */
#include "tokenizer/jinja_internal.h"

#include "base/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP, /* punctuation; op holds its text (1-2 chars) */
};

typedef struct tok {
    int type;
    int line;
    const char *s; /* TEXT/NAME/STRING(unescaped)/OP text */
    size_t len;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    pt_jinja_template *t;
    tok *toks;
    size_t n, cap, pos;
    char err[512];
    int err_line;
    int failed;
    int depth; /* nesting, bounded so hostile input cannot exhaust the stack */
    /* the open blocks, for "innermost block" messages */
    const char *open[64];
    int n_open;
} parser;

#define MAX_DEPTH 200

static int perr(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *p, int line, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    p->err_line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    return -1;
}

static void *palloc(parser *p, size_t n) {
    void *m = pt_arena_alloc(&p->t->arena, n ? n : 1);
    if (!m) perr(p, 0, "out of memory");
    return m;
}

static int push_tok(parser *p, tok t) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        tok *nt = realloc(p->toks, cap * sizeof(tok));
        if (!nt) return perr(p, t.line, "out of memory");
        p->toks = nt;
        p->cap = cap;
    }
    p->toks[p->n++] = t;
    return 0;
}

/* ------------------------------------------------------------------ lexer */

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* Python's str.rstrip() length / "is all whitespace" over UTF-8 text. */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        /* step back one code point */
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80 && n - k < 4) k--;
        size_t adv;
        uint32_t cp = pj_utf8_decode(s + k, n - k, &adv);
        if (k + adv != n || !pj_is_space(cp)) break;
        n = k;
    }
    return n;
}
static int all_space(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n;) {
        size_t adv;
        if (!pj_is_space(pj_utf8_decode(s + i, n - i, &adv))) return 0;
        i += adv;
    }
    return 1;
}
static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Applies the strip rules to the text before a tag (sign: '-', '+' or 0). */
static size_t strip_before(const char *text, size_t n, char sign, int lstrip_ok, int line_starting) {
    if (sign == '-') return rstrip_len(text, n);
    if (sign != '+' && lstrip_ok) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--)
            if (text[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > 0 || line_starting) && all_space(text + l_pos, n - l_pos)) return l_pos;
    }
    return n;
}

/* Decodes a Python string literal body (unicode-escape) into the arena. */
static int unescape(parser *p, const char *s, size_t n, int line, const char **out, size_t *out_len) {
    char *o = palloc(p, n + 1);
    if (!o) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        uint32_t cp;
        int digits = 0;
        switch (e) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = 0;
                int m = 0;
                while (m < 3 && i < n && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), m++;
                i--;
                k += (size_t)pj_utf8_encode(cp, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (digits) {
            cp = 0;
            for (int m = 0; m < digits; m++) {
                char h = (i + 1 + (size_t)m < n) ? s[i + 1 + (size_t)m] : 0;
                int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (v < 0) return perr(p, line, "(unicode error) truncated \\%c escape", e);
                cp = cp * 16 + (uint32_t)v;
            }
            if (cp > 0x10ffff) return perr(p, line, "(unicode error) illegal Unicode character");
            i += (size_t)digits;
            k += (size_t)pj_utf8_encode(cp, o + k);
        }
    }
    o[k] = 0;
    *out = o;
    *out_len = k;
    return 0;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-/*%~[](){}<>=.:|,;";

/* Lexes the inside of a {{ }} / {% %} tag starting at *pos; stops after the
 * end marker. Returns 0, or -1 on error. *line_starting set for the next text. */
static int lex_tag(parser *p, const char *src, size_t n, size_t *pos, int *line, int is_block,
                   int *line_starting) {
    size_t i = *pos;
    int balance = 0;
    for (;;) {
        while (i < n && is_ws(src[i])) {
            if (src[i] == '\n') (*line)++;
            i++;
        }
        if (i >= n) return perr(p, *line, "unexpected end of template, expected end of %s tag",
                                is_block ? "block" : "print");
        /* end markers first (only with balanced brackets) */
        if (balance == 0) {
            char c0 = src[i];
            const char *end = is_block ? "%}" : "}}";
            size_t off = (c0 == '-' || (c0 == '+' && is_block)) ? 1 : 0;
            if (i + off + 2 <= n && !memcmp(src + i + off, end, 2)) {
                i += off + 2;
                *line_starting = 0;
                if (off && c0 == '-') {
                    while (i < n && is_ws(src[i])) {
                        if (src[i] == '\n') (*line)++;
                        i++;
                    }
                    *line_starting = i > 0 && src[i - 1] == '\n';
                } else if (is_block && !off && i < n && src[i] == '\n') {
                    i++; /* trim_blocks */
                    (*line)++;
                    *line_starting = 1;
                }
                *pos = i;
                return push_tok(p, (tok){.type = is_block ? T_BLOCK_END : T_VAR_END, .line = *line});
            }
        }
        char ch = src[i];
        tok t = {.line = *line, .s = src + i};
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t j = i;
            while (j < n && ((src[j] >= 'a' && src[j] <= 'z') || (src[j] >= 'A' && src[j] <= 'Z') ||
                             (src[j] >= '0' && src[j] <= '9') || src[j] == '_'))
                j++;
            t.type = T_NAME;
            t.len = j - i;
            i = j;
        } else if (ch >= '0' && ch <= '9') {
            size_t j = i;
            int is_float = 0;
            while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) j++;
            if (j + 1 < n && src[j] == '.' && src[j + 1] >= '0' && src[j + 1] <= '9') {
                is_float = 1;
                j++;
                while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) j++;
            }
            if (j < n && (src[j] == 'e' || src[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (src[k] == '+' || src[k] == '-')) k++;
                if (k < n && src[k] >= '0' && src[k] <= '9') {
                    is_float = 1;
                    j = k;
                    while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) j++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t k = i; k < j && m < sizeof num - 1; k++)
                if (src[k] != '_') num[m++] = src[k];
            num[m] = 0;
            if (is_float) {
                t.type = T_FLOAT;
                t.f = strtod(num, NULL);
            } else {
                t.type = T_INT;
                errno = 0;
                long long v = strtoll(num, NULL, 10);
                if (errno) return perr(p, *line, "integer literal %s is out of range", num);
                t.i = v;
            }
            i = j;
        } else if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            int l0 = *line;
            while (j < n && src[j] != ch) {
                if (src[j] == '\\' && j + 1 < n) j++;
                if (src[j] == '\n') (*line)++;
                j++;
            }
            if (j >= n) return perr(p, l0, "unexpected end of string");
            t.type = T_STRING;
            if (unescape(p, src + i + 1, j - i - 1, l0, &t.s, &t.len)) return -1;
            i = j + 1;
        } else {
            t.type = T_OP;
            t.len = 0;
            for (int k = 0; OPS2[k]; k++)
                if (i + 1 < n && src[i] == OPS2[k][0] && src[i + 1] == OPS2[k][1]) t.len = 2;
            if (!t.len && strchr(OPS1, ch) && ch) t.len = 1;
            if (!t.len) return perr(p, *line, "unexpected char '%c' at %zu", ch, i);
            if (t.len == 1 && (ch == '(' || ch == '[' || ch == '{')) balance++;
            if (t.len == 1 && (ch == ')' || ch == ']' || ch == '}')) {
                if (balance == 0) return perr(p, *line, "unexpected '%c'", ch);
                balance--;
            }
            i += t.len;
        }
        if (push_tok(p, t)) return -1;
    }
}

static int lex(parser *p, const char *src, size_t n) {
    size_t pos = 0;
    int line = 1, line_starting = 1;
    while (pos < n) {
        /* find the next tag start */
        size_t k = pos;
        char kind = 0;
        while (k + 1 < n) {
            if (src[k] == '{' && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
                kind = src[k + 1];
                break;
            }
            k++;
        }
        if (!kind) {
            push_tok(p, (tok){.type = T_TEXT, .line = line, .s = src + pos, .len = n - pos});
            break;
        }
        char sign = (k + 2 < n && (src[k + 2] == '-' || src[k + 2] == '+')) ? src[k + 2] : 0;
        size_t after = k + 2 + (sign ? 1 : 0);
        /* {% raw %} ? */
        int is_raw = 0;
        size_t raw_end = 0;
        if (kind == '%') {
            size_t j = after;
            while (j < n && is_ws(src[j])) j++;
            if (j + 3 <= n && !memcmp(src + j, "raw", 3)) {
                j += 3;
                while (j < n && is_ws(src[j])) j++;
                if (j + 3 <= n && src[j] == '-' && !memcmp(src + j + 1, "%}", 2)) {
                    is_raw = 1;
                    j += 3;
                    while (j < n && is_ws(src[j])) j++;
                    raw_end = j;
                } else if (j + 2 <= n && !memcmp(src + j, "%}", 2)) {
                    is_raw = 1;
                    raw_end = j + 2;
                }
            }
        }
        size_t tlen = strip_before(src + pos, k - pos, sign, kind != '{', line_starting);
        if (tlen) push_tok(p, (tok){.type = T_TEXT, .line = line, .s = src + pos, .len = tlen});
        line += count_nl(src + pos, k - pos);
        if (p->failed) return -1;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t j = after; j + 1 < n; j++)
                if (src[j] == '#' && src[j + 1] == '}') {
                    e = src + j;
                    break;
                }
            if (!e) return perr(p, line, "Missing end of comment tag");
            size_t j = (size_t)(e - src);
            line += count_nl(src + after, j - after);
            char esign = j > after ? src[j - 1] : 0;
            j += 2;
            if (esign == '-') {
                while (j < n && is_ws(src[j])) line += src[j++] == '\n';
            } else if (esign != '+' && j < n && src[j] == '\n') {
                j++;
                line++;
            }
            line_starting = j > 0 && src[j - 1] == '\n';
            pos = j;
            continue;
        }
        if (is_raw) {
            line += count_nl(src + k, raw_end - k);
            /* find {%[-+]? endraw [-+]?%} */
            size_t j = raw_end, body_end = 0, end_after = 0;
            char esign = 0;
            for (; j + 1 < n; j++) {
                if (src[j] != '{' || src[j + 1] != '%') continue;
                size_t m = j + 2;
                char s1 = (m < n && (src[m] == '-' || src[m] == '+')) ? src[m] : 0;
                if (s1) m++;
                while (m < n && is_ws(src[m])) m++;
                if (m + 6 > n || memcmp(src + m, "endraw", 6)) continue;
                m += 6;
                while (m < n && is_ws(src[m])) m++;
                char s2 = (m < n && (src[m] == '-' || src[m] == '+')) ? src[m] : 0;
                if (m + (s2 ? 1 : 0) + 2 > n || memcmp(src + m + (s2 ? 1 : 0), "%}", 2)) continue;
                m += (s2 ? 1 : 0) + 2;
                if (s2 == '-')
                    while (m < n && is_ws(src[m])) m++;
                else if (!s2 && m < n && src[m] == '\n') m++;
                body_end = j;
                end_after = m;
                esign = s1;
                break;
            }
            if (!end_after) return perr(p, line, "Missing end of raw directive");
            int ls = raw_end > 0 && src[raw_end - 1] == '\n';
            size_t blen = strip_before(src + raw_end, body_end - raw_end, esign, 1, ls);
            if (blen) push_tok(p, (tok){.type = T_TEXT, .line = line, .s = src + raw_end, .len = blen});
            line += count_nl(src + raw_end, end_after - raw_end);
            line_starting = src[end_after - 1] == '\n';
            pos = end_after;
            continue;
        }
        push_tok(p, (tok){.type = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .line = line});
        pos = after;
        if (lex_tag(p, src, n, &pos, &line, kind == '%', &line_starting)) return -1;
    }
    return push_tok(p, (tok){.type = T_EOF, .line = line});
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
    return perr(p, cur(p)->line, "expected token '%s', got %s", op, tok_desc(cur(p), b, sizeof b));
}
static const char *tok_name(parser *p, const tok *t) {
    char *s = palloc(p, t->len + 1);
    if (s) memcpy(s, t->s, t->len);
    return s;
}

static pj_node *mk(parser *p, int kind, int line) {
    pj_node *n = palloc(p, sizeof *n);
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
        pj_node **k = palloc(p, (size_t)cap * sizeof *k);
        const char **nm = palloc(p, (size_t)cap * sizeof *nm);
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
    if (++p->depth > MAX_DEPTH) return perr(p, cur(p)->line, "template nested too deeply");
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
            perr(p, cur(p)->line, "Expected an expression, got %s", tok_desc(cur(p), b, sizeof b));
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
            return perr(p, cur(p)->line, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), "=")) {
            const char *name = tok_name(p, cur(p));
            next(p);
            next(p);
            pj_node *e = parse_expr(p, 1);
            if (!e) return -1;
            kids_push(p, ks, e, name);
            seen_kw = 1;
        } else {
            if (seen_kw) return perr(p, cur(p)->line, "invalid syntax for function call expression");
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
        perr(p, cur(p)->line, "expected token 'name', got %s", tok_desc(cur(p), b, sizeof b));
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
    char *s = palloc(p, len + 1);
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
            perr(p, t->line, "You cannot chain multiple tests with is");
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
                perr(p, a->line, "expected name or number");
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
        char *s = palloc(p, len + 1);
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
        perr(p, t->line, "unexpected %s", tok_desc(t, b, sizeof b));
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
    return perr(p, cur(p)->line, "expected token 'end of statement block', got %s",
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
    perr(p, t->line, "can't assign to '%s'", n->kind == PJ_N_CONST ? "const" : "expression");
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
        if (cur(p)->type != T_NAME) return perr(p, cur(p)->line, "expected a parameter name");
        const char *name = tok_name(p, cur(p));
        next(p);
        pj_node *def = NULL;
        if (is_op(cur(p), "=")) {
            next(p);
            def = parse_expr(p, 1);
            if (!def) return -1;
        } else if (ks.n && ks.k[ks.n - 1])
            return perr(p, cur(p)->line, "non-default argument follows default argument");
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
        perr(p, line, "tag name expected");
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
            perr(p, cur(p)->line, "expected 'in' in for loop");
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
            perr(p, line, "expected token '=' after a tuple target");
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
            perr(p, line, "expected a macro name");
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
            perr(p, line, "expected call");
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
                perr(p, cur(p)->line, "expected an assignment in with");
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
            perr(p, line, "'%.*s' outside of a loop", (int)t->len, t->s);
            return NULL;
        }
        n = mk(p, is_name(t, "break") ? PJ_N_BREAK : PJ_N_CONTINUE, line);
        next(p);
    } else {
        static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", NULL};
        for (int i = 0; unsupported[i]; i++)
            if (is_name(t, unsupported[i])) {
                perr(p, line, "the '%s' tag is not supported by petrel's template engine", unsupported[i]);
                return NULL;
            }
        /* jinja2's message for an unknown tag */
        char msg[256];
        int k = snprintf(msg, sizeof msg, "Encountered unknown tag '%.*s'.", (int)(t->len > 40 ? 40 : t->len), t->s);
        if (p->n_open > 0 && k > 0 && (size_t)k < sizeof msg)
            snprintf(msg + k, sizeof msg - (size_t)k, " The innermost block that needs to be closed is '%s'.",
                     p->open[p->n_open - 1]);
        perr(p, line, "%s", msg);
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
            perr(p, cur(p)->line, "blocks nested too deeply");
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
                perr(p, t->line, "Unexpected end of template. Jinja was looking for the following tags: '%s'. "
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
                perr(p, cur(p)->line, "expected token 'end of print statement', got %s", tok_desc(cur(p), b, sizeof b));
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
                perr(p, name->line, "Encountered unknown tag '%.*s'.%s%s%s", (int)(name->len > 40 ? 40 : name->len),
                     name->s, block ? " The innermost block that needs to be closed is '" : "",
                     block ? block : "", block ? "'." : "");
                return NULL;
            }
            if (name->type == T_NAME && end_tags &&
                (is_name(name, "elif") || is_name(name, "else"))) {
                perr(p, name->line, "Encountered unknown tag '%.*s'. Jinja was looking for the following tags: '%s'. "
                     "The innermost block that needs to be closed is '%s'.", (int)name->len, name->s, end_tags[0], block);
                return NULL;
            }
            pj_node *n = parse_statement(p);
            if (!n) return NULL;
            kids_push(p, &ks, n, NULL);
        } else {
            perr(p, t->line, "unexpected token");
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
    if (depth > 4 * MAX_DEPTH) return perr(p, n->line, "template nested too deeply");
    if ((n->kind == PJ_N_FILTER || n->kind == PJ_N_TEST) && n->op && !soft)
        return perr(p, n->line, "No %s named '%s'.", n->kind == PJ_N_FILTER ? "filter" : "test", n->name);
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
    if (lex(&p, norm, n) == 0) {
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
