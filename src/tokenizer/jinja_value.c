/* Values of the Jinja engine and their Python semantics: constructors,
 * str()/repr() formatting (Python's exact float repr, quoting rules), JSON
 * serialization as json.dumps, equality and ordering, truthiness, iteration,
 * and UTF-8 helpers for code-point string operations. Not the evaluator
 * (jinja_eval.c) nor the filters and methods (jinja_filters.c, jinja_methods.c). */
#include "tokenizer/jinja_internal.h"

#include "base/error.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>


int pj_fail(pj_ctx *c, const char *type, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    int n = snprintf(c->err, sizeof c->err, "%s: ", type);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof c->err) n = (int)sizeof c->err - 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

void *pj_alloc(pj_ctx *c, size_t n) {
    /* a template that builds gigabytes of strings fails instead of exhausting memory */
    if (c->arena->used + n > c->max_bytes) {
        pj_fail(c, "MemoryError", "the template used more than %zu MiB", c->max_bytes >> 20);
        return NULL;
    }
    void *p = pt_arena_alloc(c->arena, n ? n : 1);
    if (!p) pj_fail(c, "MemoryError", "out of memory");
    return p;
}

int pj_charge(pj_ctx *c, size_t work) {
    c->steps += (long)(work > (size_t)1 << 40 ? (size_t)1 << 40 : work);
    if (c->steps > c->max_steps) return pj_fail(c, "RuntimeError", "the template ran too long");
    return c->failed ? -1 : 0;
}

int pj_float_to_int(pj_ctx *c, double f, int64_t *out) {
    if (!isfinite(f)) return pj_fail(c, "OverflowError", "cannot convert float infinity or NaN to integer");
    /* [-2^63, 2^63): beyond, Python makes a big int, which petrel's values cannot hold */
    if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0))
        return pj_fail(c, "OverflowError", "integer %.17g does not fit in 64 bits (petrel's templates have no big ints)", f);
    *out = (int64_t)f;
    return 0;
}

/* ---------------------------------------------------------- constructors */

pj_value pj_undef_v(pj_ctx *c, const char *msg, int security) {
    pj_value v = {.type = PJ_UNDEF};
    pj_undef *u = pj_alloc(c, sizeof *u);
    if (u) {
        u->msg = msg;
        u->security = security;
    }
    v.u = u;
    return v;
}
pj_value pj_none(void) { return (pj_value){.type = PJ_NONE}; }
pj_value pj_bool(int b) { return (pj_value){.type = PJ_BOOL, .i = b ? 1 : 0}; }
pj_value pj_int(int64_t i) { return (pj_value){.type = PJ_INT, .i = i}; }
pj_value pj_float(double f) { return (pj_value){.type = PJ_FLOAT, .f = f}; }
pj_value pj_str(const char *s, size_t len) { return (pj_value){.type = PJ_STR, .len = len, .s = s}; }
pj_value pj_cstr(const char *s) { return pj_str(s, strlen(s)); }
pj_value pj_str_copy(pj_ctx *c, const char *s, size_t len) {
    char *p = pj_alloc(c, len + 1);
    if (!p) return pj_str("", 0);
    if (len) memcpy(p, s, len);
    return pj_str(p, len);
}

pj_value pj_list_new(pj_ctx *c, size_t cap, unsigned flags) {
    pj_value v = {.type = PJ_LIST, .flags = (uint8_t)flags};
    v.l = pj_alloc(c, sizeof *v.l);
    if (v.l && cap) {
        v.l->items = pj_alloc(c, cap * sizeof(pj_value));
        if (v.l->items) v.l->cap = cap;
    }
    return v;
}

int pj_list_push(pj_ctx *c, pj_value *list, pj_value v) {
    pj_list *l = list->l;
    if (!l) return -1;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        pj_value *items = pj_alloc(c, cap * sizeof(pj_value));
        if (!items) return -1;
        if (l->n) memcpy(items, l->items, l->n * sizeof(pj_value));
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = v;
    return 0;
}

pj_value pj_dict_new(pj_ctx *c, size_t cap) {
    pj_value v = {.type = PJ_DICT};
    v.d = pj_alloc(c, sizeof *v.d);
    if (v.d && cap) {
        v.d->keys = pj_alloc(c, cap * sizeof(pj_value));
        v.d->vals = pj_alloc(c, cap * sizeof(pj_value));
        if (v.d->keys && v.d->vals) v.d->cap = cap;
    }
    return v;
}

pj_value *pj_dict_get(const pj_dict *d, pj_value k) {
    if (!d) return NULL;
    for (size_t i = 0; i < d->n; i++)
        if (pj_equal(d->keys[i], k)) return &d->vals[i];
    return NULL;
}

pj_value *pj_dict_get_str(const pj_dict *d, const char *k) {
    if (!d) return NULL;
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].type == PJ_STR && d->keys[i].len == n && !memcmp(d->keys[i].s, k, n))
            return &d->vals[i];
    return NULL;
}

int pj_dict_set(pj_ctx *c, pj_dict *d, pj_value k, pj_value v) {
    if (!d) return -1;
    pj_value *old = pj_dict_get(d, k);
    if (old) {
        *old = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        pj_value *keys = pj_alloc(c, cap * sizeof(pj_value));
        pj_value *vals = pj_alloc(c, cap * sizeof(pj_value));
        if (!keys || !vals) return -1;
        if (d->n) {
            memcpy(keys, d->keys, d->n * sizeof(pj_value));
            memcpy(vals, d->vals, d->n * sizeof(pj_value));
        }
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n] = v;
    d->n++;
    return 0;
}

/* --------------------------------------------------------------- buffers */

int pj_buf_put(pj_buf *b, const char *s, size_t n) {
    if (b->c->failed) return -1;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = pj_alloc(b->c, cap);
        if (!p) return -1;
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
int pj_buf_puts(pj_buf *b, const char *s) { return pj_buf_put(b, s, strlen(s)); }
int pj_buf_printf(pj_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1;
    return pj_buf_put(b, tmp, (size_t)n);
}
pj_value pj_buf_value(pj_buf *b) { return b->p ? pj_str(b->p, b->n) : pj_str("", 0); }

/* ------------------------------------------------------------------ UTF-8 */

uint32_t pj_utf8_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate(u, (utf8proc_ssize_t)(n > 4 ? 4 : n), &cp);
    if (k <= 0 || cp < 0) {
        *adv = 1;
        return u[0];
    }
    *adv = (size_t)k;
    return (uint32_t)cp;
}

int pj_utf8_encode(uint32_t cp, char *out) {
    return (int)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}

size_t pj_utf8_count(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n;) {
        size_t adv;
        if ((unsigned char)s[i] < 0x80) adv = 1;
        else pj_utf8_decode(s + i, n - i, &adv);
        i += adv;
        count++;
    }
    return count;
}

size_t pj_utf8_offset(const char *s, size_t n, int64_t idx) {
    size_t i = 0;
    for (int64_t k = 0; k < idx && i < n; k++) {
        size_t adv;
        if ((unsigned char)s[i] < 0x80) adv = 1;
        else pj_utf8_decode(s + i, n - i, &adv);
        i += adv;
    }
    return i;
}

int pj_is_space(uint32_t cp) {
    /* Python's str.isspace(): bidirectional class WS/B/S or category Zs. */
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return 1;
    if (cp < 0x80) return 0;
    if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
        cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return 1;
    return 0;
}

/* Python's str.isprintable() for one code point: not in Cc, Cf, Cs, Co, Cn,
 * Zl, Zp, or Zs other than the ASCII space. */
static int is_printable(uint32_t cp) {
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7f) return 0;
    if (cp < 0x7f) return 1;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

/* ------------------------------------------------------------- str/repr */

void pj_format_float(double f, char *buf, size_t n) {
    if (isnan(f)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, n, f < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest digits that round-trip (Python's repr), then Python's layout:
     * positional for exponents in [-4, 16), otherwise d.ddde+XX. */
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d.ddde[+-]XX */
    char digits[32];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = buf;
    size_t left = n;
#define PUT(ch)                  \
    do {                         \
        if (left > 1) {          \
            *o++ = (ch);         \
            left--;              \
        }                        \
    } while (0)
    if (neg) PUT('-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            PUT('0');
            PUT('.');
            for (int i = 0; i < -exp10 - 1; i++) PUT('0');
            for (int i = 0; i < nd; i++) PUT(digits[i]);
        } else {
            for (int i = 0; i <= exp10; i++) PUT(i < nd ? digits[i] : '0');
            PUT('.');
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) PUT(digits[i]);
            else PUT('0');
        }
        *o = 0;
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (int i = 1; i < nd; i++) PUT(digits[i]);
        }
        *o = 0;
        snprintf(o, left, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef PUT
}

static int repr_str(pj_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (pj_buf_put(b, &q, 1)) return -1;
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t cp = pj_utf8_decode(s + i, n - i, &adv);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            pj_buf_put(b, esc, 2);
        } else if (cp == '\n') pj_buf_put(b, "\\n", 2);
        else if (cp == '\r') pj_buf_put(b, "\\r", 2);
        else if (cp == '\t') pj_buf_put(b, "\\t", 2);
        else if (!is_printable(cp)) {
            if (cp < 0x100) snprintf(esc, sizeof esc, "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", cp);
            else snprintf(esc, sizeof esc, "\\U%08x", cp);
            pj_buf_puts(b, esc);
        } else pj_buf_put(b, s + i, adv);
        i += adv;
    }
    return pj_buf_put(b, &q, 1);
}

static int str_or_repr(pj_ctx *c, pj_value v, pj_buf *b, int repr) {
    char tmp[64];
    if (++c->rdepth > 500) {
        c->rdepth--;
        return pj_fail(c, "RecursionError", "maximum recursion depth exceeded while getting the repr of an object");
    }
    int rc = 0;
    switch (v.type) {
    case PJ_UNDEF: rc = pj_buf_puts(b, repr ? "Undefined" : ""); break;
    case PJ_NONE: rc = pj_buf_puts(b, "None"); break;
    case PJ_BOOL: rc = pj_buf_puts(b, v.i ? "True" : "False"); break;
    case PJ_INT: rc = pj_buf_printf(b, "%lld", (long long)v.i); break;
    case PJ_FLOAT:
        pj_format_float(v.f, tmp, sizeof tmp);
        rc = pj_buf_puts(b, tmp);
        break;
    case PJ_STR:
        if (!repr) rc = pj_buf_put(b, v.s, v.len);
        else if (v.flags & PJ_F_SAFE) {
            pj_buf_puts(b, "Markup(");
            repr_str(b, v.s, v.len);
            rc = pj_buf_puts(b, ")");
        } else rc = repr_str(b, v.s, v.len);
        break;
    case PJ_LIST:
        if (v.flags & PJ_F_RANGE) {
            if (v.l->range[2] == 1)
                rc = pj_buf_printf(b, "range(%lld, %lld)", (long long)v.l->range[0],
                                   (long long)v.l->range[1]);
            else
                rc = pj_buf_printf(b, "range(%lld, %lld, %lld)", (long long)v.l->range[0],
                                   (long long)v.l->range[1], (long long)v.l->range[2]);
            break;
        }
        if (v.flags & PJ_F_GEN) {
            rc = pj_buf_printf(b, "<generator object at %p>", (void *)v.l);
            break;
        }
        pj_buf_puts(b, (v.flags & PJ_F_TUPLE) ? "(" : "[");
        for (size_t i = 0; i < v.l->n && !c->failed; i++) {
            if (i) pj_buf_puts(b, ", ");
            str_or_repr(c, v.l->items[i], b, 1);
        }
        if ((v.flags & PJ_F_TUPLE) && v.l->n == 1) pj_buf_puts(b, ",");
        rc = pj_buf_puts(b, (v.flags & PJ_F_TUPLE) ? ")" : "]");
        break;
    case PJ_DICT:
    case PJ_NS:
        if (v.type == PJ_NS) pj_buf_puts(b, "<Namespace ");
        pj_buf_puts(b, "{");
        for (size_t i = 0; i < v.d->n && !c->failed; i++) {
            if (i) pj_buf_puts(b, ", ");
            str_or_repr(c, v.d->keys[i], b, 1);
            pj_buf_puts(b, ": ");
            str_or_repr(c, v.d->vals[i], b, 1);
        }
        rc = pj_buf_puts(b, v.type == PJ_NS ? "}>" : "}");
        break;
    case PJ_FUNC:
        if (v.fn->kind == PJ_FN_MACRO) rc = pj_buf_printf(b, "<Macro '%s'>", v.fn->name);
        else rc = pj_buf_printf(b, "<function %s>", v.fn->name);
        break;
    case PJ_LOOP: rc = pj_buf_printf(b, "<LoopContext %zu/%zu>", v.loop->index0 + 1, v.loop->items->n); break;
    }
    c->rdepth--;
    return c->failed ? -1 : rc;
}

int pj_str_of(pj_ctx *c, pj_value v, pj_buf *b) { return str_or_repr(c, v, b, 0); }
int pj_repr_of(pj_ctx *c, pj_value v, pj_buf *b) { return str_or_repr(c, v, b, 1); }

int pj_to_str(pj_ctx *c, pj_value v, pj_value *out) {
    if (v.type == PJ_STR) {
        *out = v;
        out->flags &= PJ_F_SAFE;
        return 0;
    }
    pj_buf b = {.c = c};
    if (pj_str_of(c, v, &b)) return -1;
    *out = pj_buf_value(&b);
    return 0;
}

const char *pj_type_name(pj_value v) {
    switch (v.type) {
    case PJ_UNDEF: return "Undefined";
    case PJ_NONE: return "NoneType";
    case PJ_BOOL: return "bool";
    case PJ_INT: return "int";
    case PJ_FLOAT: return "float";
    case PJ_STR: return (v.flags & PJ_F_SAFE) ? "Markup" : "str";
    case PJ_LIST:
        if (v.flags & PJ_F_RANGE) return "range";
        if (v.flags & PJ_F_GEN) return "generator";
        return (v.flags & PJ_F_TUPLE) ? "tuple" : "list";
    case PJ_DICT: return "dict";
    case PJ_NS: return "Namespace";
    case PJ_FUNC: return v.fn->kind == PJ_FN_MACRO ? "Macro" : "function";
    case PJ_LOOP: return "LoopContext";
    }
    return "object";
}

/* ------------------------------------------------------------------ JSON */

static int json_str(pj_buf *b, const char *s, size_t n) {
    pj_buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        if (ch == '"') esc = "\\\"";
        else if (ch == '\\') esc = "\\\\";
        else if (ch == '\n') esc = "\\n";
        else if (ch == '\r') esc = "\\r";
        else if (ch == '\t') esc = "\\t";
        else if (ch == '\b') esc = "\\b";
        else if (ch == '\f') esc = "\\f";
        else if (ch < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            esc = tmp;
        }
        if (esc) {
            pj_buf_put(b, s + i - run, run);
            run = 0;
            pj_buf_puts(b, esc);
        } else run++;
    }
    pj_buf_put(b, s + n - run, run);
    return pj_buf_put(b, "\"", 1);
}

static int json_indent(pj_buf *b, int indent, int level) {
    pj_buf_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++) pj_buf_put(b, " ", 1);
    return 0;
}

/* json.dumps's key conversion: str as is; int/float/bool/None to text. */
static int json_key(pj_ctx *c, pj_value k, pj_value *out) {
    char tmp[64];
    switch (k.type) {
    case PJ_STR: *out = k; return 0;
    case PJ_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)k.i); break;
    case PJ_FLOAT: pj_format_float(k.f, tmp, sizeof tmp); break;
    case PJ_BOOL: snprintf(tmp, sizeof tmp, "%s", k.i ? "true" : "false"); break;
    case PJ_NONE: snprintf(tmp, sizeof tmp, "null"); break;
    default:
        return pj_fail(c, "TypeError", "keys must be str, int, float, bool or None, not %s",
                       pj_type_name(k));
    }
    *out = pj_str_copy(c, tmp, strlen(tmp));
    return 0;
}

static int json_rec(pj_ctx *c, pj_value v, int indent, const char *isep, const char *ksep,
                    int sort_keys, pj_buf *b, int level) {
    char tmp[64];
    if (level > 200)
        return pj_fail(c, "RecursionError", "maximum recursion depth exceeded while encoding a JSON object");
    switch (v.type) {
    case PJ_NONE: return pj_buf_puts(b, "null");
    case PJ_BOOL: return pj_buf_puts(b, v.i ? "true" : "false");
    case PJ_INT: return pj_buf_printf(b, "%lld", (long long)v.i);
    case PJ_FLOAT:
        if (isnan(v.f)) return pj_buf_puts(b, "NaN");
        if (isinf(v.f)) return pj_buf_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        pj_format_float(v.f, tmp, sizeof tmp);
        return pj_buf_puts(b, tmp);
    case PJ_STR: return json_str(b, v.s, v.len);
    case PJ_LIST:
        if (v.flags & (PJ_F_GEN | PJ_F_RANGE)) break;
        if (v.l->n == 0) return pj_buf_puts(b, "[]");
        pj_buf_puts(b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) pj_buf_puts(b, isep);
            if (indent >= 0) json_indent(b, indent, level + 1);
            if (json_rec(c, v.l->items[i], indent, isep, ksep, sort_keys, b, level + 1)) return -1;
        }
        if (indent >= 0) json_indent(b, indent, level);
        return pj_buf_puts(b, "]");
    case PJ_DICT: {
        if (v.d->n == 0) return pj_buf_puts(b, "{}");
        size_t n = v.d->n;
        size_t *order = pj_alloc(c, n * sizeof(size_t));
        pj_value *keys = pj_alloc(c, n * sizeof(pj_value));
        if (!order || !keys) return -1;
        for (size_t i = 0; i < n; i++) {
            order[i] = i;
            if (json_key(c, v.d->keys[i], &keys[i])) return -1;
        }
        if (sort_keys) { /* insertion sort: stable, and dicts here are small */
            for (size_t i = 1; i < n; i++) {
                size_t cur = order[i], j = i;
                while (j > 0) {
                    int cmp;
                    if (pj_compare(c, v.d->keys[order[j - 1]], v.d->keys[cur], PJ_OP_LT, &cmp))
                        return -1;
                    if (cmp <= 0) break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = cur;
            }
        }
        pj_buf_puts(b, "{");
        for (size_t k = 0; k < n; k++) {
            size_t i = order[k];
            if (k) pj_buf_puts(b, isep);
            if (indent >= 0) json_indent(b, indent, level + 1);
            json_str(b, keys[i].s, keys[i].len);
            pj_buf_puts(b, ksep);
            if (json_rec(c, v.d->vals[i], indent, isep, ksep, sort_keys, b, level + 1)) return -1;
        }
        if (indent >= 0) json_indent(b, indent, level);
        return pj_buf_puts(b, "}");
    }
    default: break;
    }
    return pj_fail(c, "TypeError", "Object of type %s is not JSON serializable", pj_type_name(v));
}

int pj_tojson(pj_ctx *c, pj_value v, int indent, const char *item_sep, const char *key_sep,
              int sort_keys, pj_buf *b) {
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    return json_rec(c, v, indent, item_sep, key_sep, sort_keys, b, 0);
}

/* ------------------------------------------------- truth, equality, order */

int pj_truthy(pj_value v) {
    switch (v.type) {
    case PJ_UNDEF:
    case PJ_NONE: return 0;
    case PJ_BOOL:
    case PJ_INT: return v.i != 0;
    case PJ_FLOAT: return v.f != 0.0;
    case PJ_STR: return v.len != 0;
    case PJ_LIST: return (v.flags & PJ_F_GEN) ? 1 : v.l->n != 0;
    case PJ_DICT: return v.d->n != 0;
    default: return 1;
    }
}

static int is_num(pj_value v) { return v.type == PJ_BOOL || v.type == PJ_INT || v.type == PJ_FLOAT; }
static double num_f(pj_value v) { return v.type == PJ_FLOAT ? v.f : (double)v.i; }

int pj_equal(pj_value a, pj_value b) {
    if (is_num(a) && is_num(b)) {
        if (a.type != PJ_FLOAT && b.type != PJ_FLOAT) return a.i == b.i;
        return num_f(a) == num_f(b);
    }
    if (a.type != b.type) return 0;
    switch (a.type) {
    case PJ_UNDEF:
    case PJ_NONE: return 1;
    case PJ_STR: return a.len == b.len && (a.len == 0 || !memcmp(a.s, b.s, a.len));
    case PJ_LIST:
        if ((a.flags & (PJ_F_TUPLE | PJ_F_GEN)) != (b.flags & (PJ_F_TUPLE | PJ_F_GEN))) return 0;
        if (a.flags & PJ_F_GEN) return a.l == b.l;
        if (a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!pj_equal(a.l->items[i], b.l->items[i])) return 0;
        return 1;
    case PJ_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            pj_value *o = pj_dict_get(b.d, a.d->keys[i]);
            if (!o || !pj_equal(a.d->vals[i], *o)) return 0;
        }
        return 1;
    case PJ_NS: return a.d == b.d;
    case PJ_FUNC: return a.fn == b.fn;
    case PJ_LOOP: return a.loop == b.loop;
    }
    return 0;
}

static const char *op_sym(int op) {
    switch (op) {
    case PJ_OP_LT: return "<";
    case PJ_OP_LE: return "<=";
    case PJ_OP_GT: return ">";
    case PJ_OP_GE: return ">=";
    }
    return "?";
}

int pj_compare(pj_ctx *c, pj_value a, pj_value b, int op, int *cmp) {
    if (is_num(a) && is_num(b)) {
        if (a.type != PJ_FLOAT && b.type != PJ_FLOAT) *cmp = a.i < b.i ? -1 : a.i > b.i;
        else {
            double x = num_f(a), y = num_f(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
            if (isnan(x) || isnan(y)) *cmp = 2; /* every ordering is false */
        }
        return 0;
    }
    if (a.type == PJ_STR && b.type == PJ_STR) {
        size_t n = a.len < b.len ? a.len : b.len;
        int r = n ? memcmp(a.s, b.s, n) : 0; /* UTF-8 byte order = code point order */
        *cmp = r ? (r < 0 ? -1 : 1) : (a.len < b.len ? -1 : a.len > b.len);
        return 0;
    }
    if (a.type == PJ_LIST && b.type == PJ_LIST && !((a.flags | b.flags) & (PJ_F_GEN | PJ_F_RANGE)) &&
        (a.flags & PJ_F_TUPLE) == (b.flags & PJ_F_TUPLE)) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            if (pj_equal(a.l->items[i], b.l->items[i])) continue;
            return pj_compare(c, a.l->items[i], b.l->items[i], op, cmp);
        }
        *cmp = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    if (a.type == PJ_UNDEF) return pj_check_defined(c, a);
    if (b.type == PJ_UNDEF) return pj_check_defined(c, b);
    return pj_fail(c, "TypeError", "'%s' not supported between instances of '%s' and '%s'",
                   op_sym(op), pj_type_name(a), pj_type_name(b));
}

int pj_check_defined(pj_ctx *c, pj_value v) {
    if (v.type != PJ_UNDEF) return 0;
    const char *msg = v.u && v.u->msg ? v.u->msg : "undefined value";
    return pj_fail(c, v.u && v.u->security ? "SecurityError" : "UndefinedError", "%s", msg);
}

int pj_iterate(pj_ctx *c, pj_value v, pj_value *out) {
    if (pj_charge(c, v.type == PJ_LIST ? v.l->n / 8 : v.type == PJ_DICT ? v.d->n : v.type == PJ_STR ? v.len : 0))
        return -1;
    switch (v.type) {
    case PJ_UNDEF: *out = pj_list_new(c, 0, 0); return c->failed ? -1 : 0;
    case PJ_LIST: *out = v; return 0;
    case PJ_DICT: {
        *out = pj_list_new(c, v.d->n, 0);
        for (size_t i = 0; i < v.d->n; i++) pj_list_push(c, out, v.d->keys[i]);
        return c->failed ? -1 : 0;
    }
    case PJ_STR: {
        *out = pj_list_new(c, v.len, 0);
        for (size_t i = 0; i < v.len;) {
            size_t adv;
            pj_utf8_decode(v.s + i, v.len - i, &adv);
            pj_list_push(c, out, pj_str(v.s + i, adv));
            i += adv;
        }
        return c->failed ? -1 : 0;
    }
    default:
        return pj_fail(c, "TypeError", "'%s' object is not iterable", pj_type_name(v));
    }
}

int pj_length(pj_ctx *c, pj_value v, int64_t *n) {
    switch (v.type) {
    case PJ_UNDEF: *n = 0; return 0;
    case PJ_STR: *n = (int64_t)pj_utf8_count(v.s, v.len); return 0;
    case PJ_LIST:
        if (v.flags & PJ_F_GEN) break;
        *n = (int64_t)v.l->n;
        return 0;
    case PJ_DICT: *n = (int64_t)v.d->n; return 0;
    default: break;
    }
    return pj_fail(c, "TypeError", "object of type '%s' has no len()", pj_type_name(v));
}
