/* The builtins of the Jinja engine: jinja2's filters (with transformers'
 * tojson), its tests, and the globals apply_chat_template provides
 * (raise_exception, strftime_now) plus jinja2's range, namespace and dict.
 * Filters that return generators in jinja2 (map, select, items, ...) return
 * lists flagged PJ_F_GEN, so that tojson and length refuse them as jinja2
 * does. Not attribute access or methods (jinja_methods.c). */
#include "tokenizer/jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

pj_value pj_strip(pj_value s, int which, const pj_value *chars);
pj_value pj_case(pj_ctx *c, pj_value s, int mode);
pj_value pj_split(pj_ctx *c, pj_value s, const pj_value *sep, int64_t maxsplit, int from_right);
pj_value pj_splitlines(pj_ctx *c, pj_value s, int keepends);
pj_value pj_replace(pj_ctx *c, pj_value s, pj_value old, pj_value new_, int64_t count);

static int need(pj_ctx *c, int ok, const char *filter) {
    return ok ? 0 : pj_fail(c, "TypeError", "%s filter: missing required argument", filter);
}

static pj_value str_or_soft(pj_ctx *c, pj_value v) {
    pj_value s;
    if (pj_to_str(c, v, &s)) return pj_str("", 0);
    return s;
}

/* jinja2's make_attrgetter: "a.b.0" looked up item by item; undefined when missing. */
static int attr_get(pj_ctx *c, pj_value item, pj_value attr, const pj_value *def, pj_value *out) {
    if (attr.type != PJ_STR) return pj_getitem(c, item, attr, out);
    const char *s = attr.s;
    size_t n = attr.len, st = 0;
    *out = item;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') continue;
        pj_value key = pj_str(s + st, i - st);
        int digits = i > st;
        for (size_t k = st; k < i; k++) digits &= s[k] >= '0' && s[k] <= '9';
        if (digits) key = pj_int(atoll(key.s));
        if (pj_getitem(c, *out, key, out)) return -1;
        st = i + 1;
    }
    if (def && out->type == PJ_UNDEF) *out = *def;
    return 0;
}

static pj_value lower_key(pj_ctx *c, pj_value v, int case_sensitive) {
    if (!case_sensitive && v.type == PJ_STR) return pj_case(c, v, 1);
    return v;
}

/* Stable merge sort of values by key (Python's sorted). */
static int sort_values(pj_ctx *c, pj_value *vals, pj_value *keys, size_t n, int reverse) {
    if (n < 2) return 0;
    if (pj_charge(c, n * 20)) return -1;
    pj_value *tv = pj_alloc(c, n * sizeof *tv), *tk = pj_alloc(c, n * sizeof *tk);
    if (!tv || !tk) return -1;
    for (size_t w = 1; w < n; w *= 2)
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int cmp;
                /* Python's reverse sort keeps equal items in order: compare reversed operands */
                if (pj_compare(c, reverse ? keys[i] : keys[j], reverse ? keys[j] : keys[i], PJ_OP_LT, &cmp)) return -1;
                if (cmp < 0) tv[k] = vals[j], tk[k++] = keys[j++];
                else tv[k] = vals[i], tk[k++] = keys[i++];
            }
            while (i < mid) tv[k] = vals[i], tk[k++] = keys[i++];
            while (j < hi) tv[k] = vals[j], tk[k++] = keys[j++];
            memcpy(vals + lo, tv + lo, (hi - lo) * sizeof *tv);
            memcpy(keys + lo, tk + lo, (hi - lo) * sizeof *tk);
        }
    return 0;
}

static pj_value gen_of(pj_ctx *c, size_t cap) { return pj_list_new(c, cap, PJ_F_GEN); }

static int copy_list(pj_ctx *c, pj_value items, pj_value *out) {
    *out = pj_list_new(c, items.l->n, 0);
    for (size_t i = 0; i < items.l->n; i++) pj_list_push(c, out, items.l->items[i]);
    return c->failed ? -1 : 0;
}

static int apply_test_args(pj_ctx *c, const char *name, pj_value v, pj_args *rest, int *r) {
    return pj_apply_test(c, name, v, rest, r);
}

/* select/reject/selectattr/rejectattr */
static int select_filter(pj_ctx *c, pj_value v, pj_args *a, int by_attr, int want, pj_value *out) {
    pj_value items;
    if (!pj_truthy(v)) { /* jinja2 iterates only a truthy value */
        *out = gen_of(c, 0);
        return c->failed ? -1 : 0;
    }
    if (pj_iterate(c, v, &items)) return -1;
    int off = by_attr ? 1 : 0;
    pj_value attr = pj_none(), tname = pj_none();
    if (by_attr && !pj_arg(a, 0, NULL, &attr)) return pj_fail(c, "TypeError", "selectattr needs an attribute");
    int has_test = pj_arg(a, off, NULL, &tname);
    if (has_test && tname.type != PJ_STR) return pj_fail(c, "TypeError", "test name must be a string");
    char tn[64] = "";
    if (has_test) snprintf(tn, sizeof tn, "%.*s", (int)(tname.len < 63 ? tname.len : 63), tname.s);
    pj_args rest = {.n_pos = a->n_pos > off + 1 ? a->n_pos - off - 1 : 0, .pos = a->pos + off + 1,
                    .n_kw = a->n_kw, .kw = a->kw, .kw_names = a->kw_names};
    *out = gen_of(c, items.l->n);
    for (size_t i = 0; i < items.l->n; i++) {
        pj_value it = items.l->items[i], x = it;
        if (by_attr && attr_get(c, it, attr, NULL, &x)) return -1;
        int r;
        if (has_test) {
            if (apply_test_args(c, tn, x, &rest, &r)) return -1;
        } else r = pj_truthy(x);
        if ((r != 0) == want) pj_list_push(c, out, it);
    }
    return c->failed ? -1 : 0;
}

static int minmax(pj_ctx *c, pj_value v, pj_args *a, int want_max, pj_value *out) {
    pj_value items, cs = pj_bool(0), attr = pj_none();
    pj_arg(a, 0, "case_sensitive", &cs);
    int has_attr = pj_arg(a, 1, "attribute", &attr) && attr.type != PJ_NONE;
    if (pj_iterate(c, v, &items)) return -1;
    if (items.l->n == 0) {
        *out = pj_undef_v(c, "No aggregated item, sequence was empty.", 0);
        return c->failed ? -1 : 0;
    }
    size_t best = 0;
    pj_value bk = items.l->items[0];
    if (has_attr && attr_get(c, bk, attr, NULL, &bk)) return -1;
    bk = lower_key(c, bk, pj_truthy(cs));
    for (size_t i = 1; i < items.l->n; i++) {
        pj_value k = items.l->items[i];
        if (has_attr && attr_get(c, k, attr, NULL, &k)) return -1;
        k = lower_key(c, k, pj_truthy(cs));
        int cmp;
        if (pj_compare(c, k, bk, PJ_OP_LT, &cmp)) return -1;
        if (want_max ? cmp > 0 && cmp != 2 : cmp < 0) best = i, bk = k;
    }
    *out = items.l->items[best];
    return 0;
}

static int do_indent(pj_ctx *c, pj_value v, pj_args *a, pj_value *out) {
    pj_value w = pj_int(4), first = pj_bool(0), blank = pj_bool(0), s = str_or_soft(c, v);
    static const char *const kws[] = {"width", "first", "blank", NULL};
    if (pj_args_check(c, "indent", a, 3, kws)) return -1;
    pj_arg(a, 0, "width", &w);
    pj_arg(a, 1, "first", &first);
    pj_arg(a, 2, "blank", &blank);
    pj_value ind;
    if (w.type == PJ_STR) ind = w;
    else if (w.type == PJ_INT || w.type == PJ_BOOL) {
        pj_buf ib = {.c = c};
        for (int64_t i = 0; i < w.i && i < 4096; i++) pj_buf_put(&ib, " ", 1);
        ind = pj_buf_value(&ib);
    } else return pj_fail(c, "TypeError", "can't multiply sequence by non-int of type '%s'", pj_type_name(w));
    /* jinja2 appends a newline before splitlines() */
    pj_buf sb = {.c = c};
    pj_buf_put(&sb, s.s, s.len);
    pj_buf_put(&sb, "\n", 1);
    pj_value lines = pj_splitlines(c, pj_buf_value(&sb), 0);
    pj_buf b = {.c = c};
    if (pj_truthy(first)) pj_buf_put(&b, ind.s, ind.len);
    for (size_t i = 0; i < lines.l->n; i++) {
        pj_value ln = lines.l->items[i];
        if (i) {
            pj_buf_put(&b, "\n", 1);
            if (pj_truthy(blank) || ln.len) pj_buf_put(&b, ind.s, ind.len);
        }
        pj_buf_put(&b, ln.s, ln.len);
    }
    *out = pj_buf_value(&b);
    return c->failed ? -1 : 0;
}

static int parse_int_text(pj_value s, int64_t base, int64_t *out) {
    if (base != 0 && (base < 2 || base > 36)) return -1; /* Python: ValueError, so |int gives its default */
    pj_value t = pj_strip(s, 3, NULL);
    char buf[80];
    size_t k = 0;
    for (size_t i = 0; i < t.len && k < sizeof buf - 1; i++) {
        if (t.s[i] == '_' && i > 0 && i + 1 < t.len) continue;
        buf[k++] = t.s[i];
    }
    buf[k] = 0;
    if (k == 0 || k >= sizeof buf - 1) return -1;
    char *end = buf;
    errno = 0;
    long long v = strtoll(buf, &end, (int)base);
    if (*end || end == buf || errno) return -1;
    *out = v;
    return 0;
}
/* Digits only (after an optional sign), too long for strtoll: Python would
 * make a big int, which petrel's values cannot hold. */
static int looks_like_big_int(pj_value s) {
    pj_value t = pj_strip(s, 3, NULL);
    size_t i = t.len && (t.s[0] == '-' || t.s[0] == '+') ? 1 : 0, digits = 0;
    for (; i < t.len; i++) {
        if (t.s[i] >= '0' && t.s[i] <= '9') digits++;
        else if (t.s[i] != '_') return 0;
    }
    return digits >= 19;
}

static int parse_float_text(pj_value s, double *out) {
    pj_value t = pj_strip(s, 3, NULL);
    char buf[80];
    if (t.len == 0 || t.len >= sizeof buf) return -1;
    memcpy(buf, t.s, t.len);
    buf[t.len] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end || (buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X'))) return -1;
    *out = d;
    return 0;
}

static int do_tojson(pj_ctx *c, pj_value v, pj_args *a, pj_value *out) {
    static const char *const kws[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    if (pj_args_check(c, "tojson", a, 4, kws)) return -1;
    pj_value ea = pj_bool(0), ind = pj_none(), seps = pj_none(), sk = pj_bool(0);
    pj_arg(a, 0, "ensure_ascii", &ea);
    pj_arg(a, 1, "indent", &ind);
    pj_arg(a, 2, "separators", &seps);
    pj_arg(a, 3, "sort_keys", &sk);
    int indent = -1;
    if (ind.type == PJ_INT || ind.type == PJ_BOOL) indent = ind.i < 0 ? 0 : ind.i > 1000 ? 1000 : (int)ind.i;
    else if (ind.type != PJ_NONE) return pj_fail(c, "TypeError", "tojson: indent must be an integer or None");
    char *isep = NULL, *ksep = NULL;
    if (seps.type == PJ_LIST && seps.l->n == 2 && seps.l->items[0].type == PJ_STR && seps.l->items[1].type == PJ_STR) {
        pj_value x = pj_str_copy(c, seps.l->items[0].s, seps.l->items[0].len);
        pj_value y = pj_str_copy(c, seps.l->items[1].s, seps.l->items[1].len);
        isep = (char *)x.s;
        ksep = (char *)y.s;
    } else if (seps.type != PJ_NONE) return pj_fail(c, "TypeError", "tojson: separators must be a pair of strings");
    pj_buf b = {.c = c};
    if (pj_tojson(c, v, indent, isep, ksep, pj_truthy(sk), &b)) return -1;
    pj_value r = pj_buf_value(&b);
    if (pj_truthy(ea)) { /* ensure_ascii: non-ASCII as \uXXXX (surrogate pairs above the BMP) */
        pj_buf e = {.c = c};
        for (size_t i = 0; i < r.len;) {
            size_t adv;
            uint32_t cp = pj_utf8_decode(r.s + i, r.len - i, &adv);
            if (cp < 0x80) pj_buf_put(&e, r.s + i, 1);
            else if (cp < 0x10000) pj_buf_printf(&e, "\\u%04x", cp);
            else {
                cp -= 0x10000;
                pj_buf_printf(&e, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            }
            i += adv;
        }
        r = pj_buf_value(&e);
    }
    *out = r;
    return c->failed ? -1 : 0;
}

static int word_chars(uint32_t cp) {
    if (cp == '_') return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME);
}

static const char *const FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "wordcount", NULL};

int pj_has_filter(const char *name) {
    for (int i = 0; FILTERS[i]; i++)
        if (!strcmp(FILTERS[i], name)) return 1;
    return 0;
}

int pj_apply_filter(pj_ctx *c, const char *name, pj_value v, pj_args *a, pj_value *out) {
    pj_value x, y, items;
    int r;
    /* filters that accept an undefined input */
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        pj_value def = pj_str("", 0), boolean = pj_bool(0);
        pj_arg(a, 0, "default_value", &def);
        pj_arg(a, 1, "boolean", &boolean);
        *out = (v.type == PJ_UNDEF || (pj_truthy(boolean) && !pj_truthy(v))) ? def : v;
        return 0;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        int64_t n;
        if (pj_length(c, v, &n)) return -1;
        *out = pj_int(n);
        return 0;
    }
    if (!strcmp(name, "string")) return pj_to_str(c, v, out);
    if (!strcmp(name, "tojson")) return do_tojson(c, v, a, out);
    if (!strcmp(name, "items")) {
        if (v.type == PJ_UNDEF) {
            *out = gen_of(c, 0);
            return 0;
        }
        if (v.type != PJ_DICT) return pj_fail(c, "TypeError", "Can only get item pairs from a mapping.");
        *out = gen_of(c, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) {
            pj_value t = pj_list_new(c, 2, PJ_F_TUPLE);
            pj_list_push(c, &t, v.d->keys[i]);
            pj_list_push(c, &t, v.d->vals[i]);
            pj_list_push(c, out, t);
        }
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "list")) {
        if (pj_iterate(c, v, &items)) return -1;
        return copy_list(c, items, out);
    }
    if (!strcmp(name, "safe")) {
        if (pj_to_str(c, v, out)) return -1;
        out->flags |= PJ_F_SAFE;
        return 0;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) {
        if (v.type == PJ_STR && (v.flags & PJ_F_SAFE) && name[0] != 'f') {
            *out = v;
            return 0;
        }
        pj_value s = str_or_soft(c, v);
        pj_buf b = {.c = c};
        for (size_t i = 0; i < s.len; i++) {
            const char *e = s.s[i] == '&' ? "&amp;" : s.s[i] == '<' ? "&lt;" : s.s[i] == '>' ? "&gt;"
                            : s.s[i] == '"' ? "&#34;" : s.s[i] == '\'' ? "&#39;" : NULL;
            if (e) pj_buf_puts(&b, e);
            else pj_buf_put(&b, s.s + i, 1);
        }
        *out = pj_buf_value(&b);
        out->flags |= PJ_F_SAFE;
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        if (v.type == PJ_LIST && (v.flags & PJ_F_GEN) && name[0] == 'l')
            return pj_fail(c, "TypeError", "'generator' object is not reversible");
        if (pj_iterate(c, v, &items)) return -1;
        if (items.l->n == 0) {
            *out = pj_undef_v(c, name[0] == 'f' ? "No first item, sequence was empty." : "No last item, sequence was empty.", 0);
            return c->failed ? -1 : 0;
        }
        *out = items.l->items[name[0] == 'f' ? 0 : items.l->n - 1];
        return 0;
    }
    if (!strcmp(name, "join")) {
        pj_value sep = pj_str("", 0), attr = pj_none();
        pj_arg(a, 0, "d", &sep);
        int has_attr = pj_arg(a, 1, "attribute", &attr) && attr.type != PJ_NONE;
        if (pj_iterate(c, v, &items)) return -1;
        sep = str_or_soft(c, sep);
        pj_buf b = {.c = c};
        for (size_t i = 0; i < items.l->n; i++) {
            pj_value it = items.l->items[i];
            if (has_attr && attr_get(c, it, attr, NULL, &it)) return -1;
            if (i) pj_buf_put(&b, sep.s, sep.len);
            if (pj_str_of(c, it, &b)) return -1;
        }
        *out = pj_buf_value(&b);
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "map")) {
        if (!pj_truthy(v)) { /* jinja2 iterates only a truthy value */
            *out = gen_of(c, 0);
            return c->failed ? -1 : 0;
        }
        if (pj_iterate(c, v, &items)) return -1;
        *out = gen_of(c, items.l->n);
        pj_value attr, def;
        if (pj_arg(a, -1, "attribute", &attr)) {
            int has_def = pj_arg(a, -1, "default", &def);
            for (size_t i = 0; i < items.l->n; i++) {
                pj_value it;
                if (attr_get(c, items.l->items[i], attr, has_def ? &def : NULL, &it)) return -1;
                pj_list_push(c, out, it);
            }
            return c->failed ? -1 : 0;
        }
        if (!pj_arg(a, 0, NULL, &x) || x.type != PJ_STR) return pj_fail(c, "FilterArgumentError", "map requires a filter argument");
        char fname[64];
        snprintf(fname, sizeof fname, "%.*s", (int)(x.len < 63 ? x.len : 63), x.s);
        if (!pj_has_filter(fname)) return pj_fail(c, "TemplateRuntimeError", "No filter named '%s' found.", fname);
        pj_args rest = {.n_pos = a->n_pos - 1, .pos = a->pos + 1, .n_kw = a->n_kw, .kw = a->kw, .kw_names = a->kw_names};
        for (size_t i = 0; i < items.l->n; i++) {
            pj_value it;
            if (pj_apply_filter(c, fname, items.l->items[i], &rest, &it)) return -1;
            pj_list_push(c, out, it);
        }
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "select")) return select_filter(c, v, a, 0, 1, out);
    if (!strcmp(name, "reject")) return select_filter(c, v, a, 0, 0, out);
    if (!strcmp(name, "selectattr")) return select_filter(c, v, a, 1, 1, out);
    if (!strcmp(name, "rejectattr")) return select_filter(c, v, a, 1, 0, out);
    if (!strcmp(name, "min")) return minmax(c, v, a, 0, out);
    if (!strcmp(name, "max")) return minmax(c, v, a, 1, out);
    if (!strcmp(name, "sort") || !strcmp(name, "unique") || !strcmp(name, "dictsort")) {
        pj_value rev = pj_bool(0), cs = pj_bool(0), attr = pj_none(), by = pj_cstr("key");
        int is_dict = name[0] == 'd';
        if (is_dict) {
            pj_arg(a, 0, "case_sensitive", &cs);
            pj_arg(a, 1, "by", &by);
            pj_arg(a, 2, "reverse", &rev);
            if (v.type != PJ_DICT) return pj_fail(c, "TypeError", "dictsort: expected a mapping, got %s", pj_type_name(v));
            if (pj_apply_filter(c, "items", v, &(pj_args){0}, &items)) return -1;
        } else {
            if (name[0] == 's') {
                pj_arg(a, 0, "reverse", &rev);
                pj_arg(a, 1, "case_sensitive", &cs);
                pj_arg(a, 2, "attribute", &attr);
            } else {
                pj_arg(a, 0, "case_sensitive", &cs);
                pj_arg(a, 1, "attribute", &attr);
            }
            if (pj_iterate(c, v, &items)) return -1;
        }
        size_t n = items.l->n;
        pj_value *vals = pj_alloc(c, (n + 1) * sizeof *vals), *keys = pj_alloc(c, (n + 1) * sizeof *keys);
        if (!vals || !keys) return -1;
        for (size_t i = 0; i < n; i++) {
            vals[i] = keys[i] = items.l->items[i];
            if (is_dict) {
                int by_value = by.type == PJ_STR && by.len == 5 && !memcmp(by.s, "value", 5);
                if (!by_value && !(by.type == PJ_STR && by.len == 3 && !memcmp(by.s, "key", 3)))
                    return pj_fail(c, "FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
                keys[i] = vals[i].l->items[by_value ? 1 : 0];
            } else if (attr.type != PJ_NONE && attr_get(c, vals[i], attr, NULL, &keys[i])) return -1;
            keys[i] = lower_key(c, keys[i], pj_truthy(cs));
        }
        if (name[0] == 'u') {
            *out = gen_of(c, n);
            for (size_t i = 0; i < n; i++) {
                if (pj_charge(c, i)) return -1;
                int seen = 0;
                for (size_t j = 0; j < i && !seen; j++) seen = pj_equal(keys[i], keys[j]);
                if (!seen) pj_list_push(c, out, vals[i]);
            }
            return c->failed ? -1 : 0;
        }
        if (sort_values(c, vals, keys, n, pj_truthy(rev))) return -1;
        *out = pj_list_new(c, n, 0);
        for (size_t i = 0; i < n; i++) pj_list_push(c, out, vals[i]);
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "reverse")) {
        if (v.type == PJ_STR) {
            pj_buf b = {.c = c};
            for (size_t e = v.len; e > 0;) {
                size_t k = e - 1;
                while (k > 0 && ((unsigned char)v.s[k] & 0xc0) == 0x80 && e - k < 4) k--;
                pj_buf_put(&b, v.s + k, e - k);
                e = k;
            }
            *out = pj_buf_value(&b);
            return c->failed ? -1 : 0;
        }
        if (pj_iterate(c, v, &items)) return -1;
        *out = gen_of(c, items.l->n);
        for (size_t i = items.l->n; i-- > 0;) pj_list_push(c, out, items.l->items[i]);
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "batch")) {
        if (!pj_arg(a, 0, "linecount", &x) || x.type != PJ_INT || x.i <= 0)
            return pj_fail(c, "TypeError", "batch needs a positive integer line count");
        int has_fill = pj_arg(a, 1, "fill_with", &y) && y.type != PJ_NONE;
        if (pj_iterate(c, v, &items)) return -1;
        *out = gen_of(c, items.l->n / (size_t)x.i + 1);
        pj_value cur = pj_list_new(c, (size_t)x.i, 0);
        for (size_t i = 0; i < items.l->n; i++) {
            pj_list_push(c, &cur, items.l->items[i]);
            if ((int64_t)cur.l->n == x.i) {
                pj_list_push(c, out, cur);
                cur = pj_list_new(c, (size_t)x.i, 0);
            }
        }
        if (cur.l->n) {
            while (has_fill && (int64_t)cur.l->n < x.i) pj_list_push(c, &cur, y);
            pj_list_push(c, out, cur);
        }
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "sum")) {
        pj_value attr = pj_none(), acc = pj_int(0);
        int has_attr = pj_arg(a, 0, "attribute", &attr) && attr.type != PJ_NONE;
        pj_arg(a, 1, "start", &acc);
        if (pj_iterate(c, v, &items)) return -1;
        for (size_t i = 0; i < items.l->n; i++) {
            pj_value it = items.l->items[i];
            if (has_attr && attr_get(c, it, attr, NULL, &it)) return -1;
            pj_value tmp;
            if (pj_check_defined(c, it)) return -1;
            if (!((it.type == PJ_INT || it.type == PJ_FLOAT || it.type == PJ_BOOL) &&
                  (acc.type == PJ_INT || acc.type == PJ_FLOAT || acc.type == PJ_BOOL)))
                return pj_fail(c, "TypeError", "unsupported operand type(s) for +: '%s' and '%s'", pj_type_name(acc), pj_type_name(it));
            if (acc.type == PJ_FLOAT || it.type == PJ_FLOAT) tmp = pj_float((acc.type == PJ_FLOAT ? acc.f : (double)acc.i) + (it.type == PJ_FLOAT ? it.f : (double)it.i));
            else tmp = pj_int(acc.i + it.i);
            acc = tmp;
        }
        *out = acc;
        return 0;
    }
    if (!strcmp(name, "attr")) {
        if (!pj_arg(a, 0, "name", &x) || x.type != PJ_STR) return pj_fail(c, "TypeError", "attr needs a name");
        char *nm = pj_alloc(c, x.len + 1);
        if (!nm) return -1;
        memcpy(nm, x.s, x.len);
        if (v.type == PJ_DICT && !strchr(nm, 0)[0]) {
            /* getattr, not item lookup: a dict's keys are not attributes */
            static const char *const dm[] = {"get", "items", "keys", "values", "copy", "clear", "pop", "popitem", "setdefault", "update", NULL};
            int is_m = 0;
            for (int i = 0; dm[i]; i++) is_m |= !strcmp(dm[i], nm);
            if (!is_m) {
                pj_buf mb = {.c = c};
                pj_buf_printf(&mb, "'dict object' has no attribute '%s'", nm);
                *out = pj_undef_v(c, mb.p, 0);
                return c->failed ? -1 : 0;
            }
        }
        return pj_getattr(c, v, nm, out);
    }
    if (!strcmp(name, "int")) {
        pj_value def = pj_int(0), base = pj_int(10);
        pj_arg(a, 0, "default", &def);
        pj_arg(a, 1, "base", &base);
        int64_t iv;
        double dv;
        if (v.type == PJ_INT) *out = v;
        else if (v.type == PJ_BOOL) *out = pj_int(v.i);
        else if (v.type == PJ_FLOAT) {
            if (pj_float_to_int(c, v.f, &iv)) return -1;
            *out = pj_int(iv);
        } else if (v.type == PJ_STR && parse_int_text(v, base.type == PJ_INT ? base.i : 10, &iv) == 0) *out = pj_int(iv);
        else if (v.type == PJ_STR && parse_float_text(v, &dv) == 0) {
            if (pj_float_to_int(c, dv, &iv)) return -1;
            *out = pj_int(iv);
        } else if (v.type == PJ_STR && looks_like_big_int(v))
            return pj_fail(c, "OverflowError", "integer %.*s does not fit in 64 bits (petrel's templates have no big ints)",
                           (int)(v.len > 40 ? 40 : v.len), v.s);
        else *out = def;
        return 0;
    }
    if (!strcmp(name, "float")) {
        pj_value def = pj_float(0.0);
        pj_arg(a, 0, "default", &def);
        double dv;
        if (v.type == PJ_FLOAT) *out = v;
        else if (v.type == PJ_INT || v.type == PJ_BOOL) *out = pj_float((double)v.i);
        else if (v.type == PJ_STR && parse_float_text(v, &dv) == 0) *out = pj_float(dv);
        else *out = def;
        return 0;
    }
    if (!strcmp(name, "abs")) {
        if (pj_check_defined(c, v)) return -1;
        if (v.type == PJ_FLOAT) *out = pj_float(fabs(v.f));
        else if (v.type == PJ_INT || v.type == PJ_BOOL) {
            if (v.i == INT64_MIN) return pj_fail(c, "OverflowError", "integer overflow");
            *out = pj_int(v.i < 0 ? -v.i : v.i);
        }
        else return pj_fail(c, "TypeError", "bad operand type for abs(): '%s'", pj_type_name(v));
        return 0;
    }
    if (!strcmp(name, "round")) {
        pj_value prec = pj_int(0), method = pj_cstr("common");
        pj_arg(a, 0, "precision", &prec);
        pj_arg(a, 1, "method", &method);
        if (pj_check_defined(c, v)) return -1;
        if (v.type != PJ_FLOAT && v.type != PJ_INT && v.type != PJ_BOOL)
            return pj_fail(c, "TypeError", "type %s doesn't define __round__ method", pj_type_name(v));
        int64_t p = prec.type == PJ_INT ? prec.i : 0;
        double scale = pow(10.0, (double)p), x0 = v.type == PJ_FLOAT ? v.f : (double)v.i;
        int is_common = method.type == PJ_STR && method.len == 6 && !memcmp(method.s, "common", 6);
        if (is_common && v.type != PJ_FLOAT) {
            *out = pj_int(v.i);
            return 0;
        }
        double rr;
        if (is_common) rr = nearbyint(x0 * scale) / scale; /* round half to even, as Python */
        else if (method.type == PJ_STR && method.len == 4 && !memcmp(method.s, "ceil", 4)) rr = ceil(x0 * scale) / scale;
        else if (method.type == PJ_STR && method.len == 5 && !memcmp(method.s, "floor", 5)) rr = floor(x0 * scale) / scale;
        else return pj_fail(c, "FilterArgumentError", "method must be common, ceil or floor");
        *out = pj_float(rr);
        return 0;
    }
    /* string filters: the input is converted with str() */
    pj_value s = str_or_soft(c, v);
    if (c->failed) return -1;
    if (!strcmp(name, "upper")) *out = pj_case(c, s, 0);
    else if (!strcmp(name, "lower")) *out = pj_case(c, s, 1);
    else if (!strcmp(name, "capitalize")) *out = pj_case(c, s, 3);
    else if (!strcmp(name, "title")) {
        /* jinja2's title: capitalize each run after whitespace, '-', or an opening bracket */
        pj_buf b = {.c = c};
        int start = 1;
        for (size_t i = 0; i < s.len;) {
            size_t adv;
            uint32_t cp = pj_utf8_decode(s.s + i, s.len - i, &adv);
            int sep = pj_is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            uint32_t r = sep ? cp : start ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            char tmp[4];
            if (r == cp) pj_buf_put(&b, s.s + i, adv);
            else pj_buf_put(&b, tmp, (size_t)pj_utf8_encode(r, tmp));
            start = sep;
            i += adv;
        }
        *out = pj_buf_value(&b);
    } else if (!strcmp(name, "trim")) {
        if (pj_arg(a, 0, "chars", &x) && x.type != PJ_NONE) {
            if (x.type != PJ_STR) return pj_fail(c, "TypeError", "strip arg must be None or str");
            *out = pj_strip(s, 3, &x);
        } else *out = pj_strip(s, 3, NULL);
    } else if (!strcmp(name, "replace")) {
        pj_value cnt = pj_none();
        if (need(c, pj_arg(a, 0, "old", &x) && pj_arg(a, 1, "new", &y), "replace")) return -1;
        pj_arg(a, 2, "count", &cnt);
        x = str_or_soft(c, x);
        y = str_or_soft(c, y);
        *out = pj_replace(c, s, x, y, cnt.type == PJ_INT ? cnt.i : -1);
    } else if (!strcmp(name, "indent")) return do_indent(c, s, a, out);
    else if (!strcmp(name, "center")) {
        pj_value w = pj_int(80);
        pj_arg(a, 0, "width", &w);
        if (w.type != PJ_INT) return pj_fail(c, "TypeError", "center width must be an integer");
        int64_t n = (int64_t)pj_utf8_count(s.s, s.len);
        if (w.i <= n) *out = s;
        else {
            if (w.i > (1 << 24)) return pj_fail(c, "MemoryError", "width too large");
            int64_t total = w.i - n, left = total / 2 + (total & w.i & 1);
            pj_buf b = {.c = c};
            for (int64_t i = 0; i < left; i++) pj_buf_put(&b, " ", 1);
            pj_buf_put(&b, s.s, s.len);
            for (int64_t i = left; i < total; i++) pj_buf_put(&b, " ", 1);
            *out = pj_buf_value(&b);
        }
    } else if (!strcmp(name, "wordcount")) {
        int64_t n = 0;
        int in_word = 0;
        for (size_t i = 0; i < s.len;) {
            size_t adv;
            int w = word_chars(pj_utf8_decode(s.s + i, s.len - i, &adv));
            if (w && !in_word) n++;
            in_word = w;
            i += adv;
        }
        *out = pj_int(n);
    } else if (!strcmp(name, "truncate")) {
        pj_value len = pj_int(255), kill = pj_bool(0), end = pj_cstr("..."), lee = pj_int(5);
        pj_arg(a, 0, "length", &len);
        pj_arg(a, 1, "killwords", &kill);
        pj_arg(a, 2, "end", &end);
        pj_arg(a, 3, "leeway", &lee);
        if (len.type != PJ_INT || end.type != PJ_STR) return pj_fail(c, "TypeError", "truncate: bad arguments");
        int64_t n = (int64_t)pj_utf8_count(s.s, s.len), el = (int64_t)pj_utf8_count(end.s, end.len);
        int64_t leeway = lee.type == PJ_INT ? lee.i : 5;
        if (len.i < el) return pj_fail(c, "AssertionError", "expected length >= %lld, got %lld", (long long)el, (long long)len.i);
        if (n <= len.i + leeway) *out = s;
        else {
            pj_value head = pj_str(s.s, pj_utf8_offset(s.s, s.len, len.i - el));
            if (!pj_truthy(kill)) {
                pj_value sp = pj_cstr(" ");
                pj_value parts = pj_split(c, head, &sp, 1, 1);
                head = parts.l->items[0];
            }
            pj_buf b = {.c = c};
            pj_buf_put(&b, head.s, head.len);
            pj_buf_put(&b, end.s, end.len);
            *out = pj_buf_value(&b);
        }
    } else if (!strcmp(name, "format")) {
        if (a->n_kw) {
            pj_value d = pj_dict_new(c, (size_t)a->n_kw);
            for (int i = 0; i < a->n_kw; i++) pj_dict_set(c, d.d, pj_cstr(a->kw_names[i]), a->kw[i]);
            return pj_percent_format(c, s, d, out);
        }
        pj_value t = pj_list_new(c, (size_t)a->n_pos, PJ_F_TUPLE);
        for (int i = 0; i < a->n_pos; i++) pj_list_push(c, &t, a->pos[i]);
        return pj_percent_format(c, s, t, out);
    } else return pj_fail(c, "TemplateRuntimeError", "No filter named '%s'.", name);
    (void)r;
    return c->failed ? -1 : 0;
}

/* ------------------------------------------------------------------ tests */

static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string", "mapping",
    "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "<",
    "lessthan", "le", "<=", "gt", ">", "greaterthan", "ge", ">=", "in", "sameas", "lower", "upper", "escaped",
    "filter", "test", NULL};

int pj_has_test(const char *name) {
    for (int i = 0; TESTS[i]; i++)
        if (!strcmp(TESTS[i], name)) return 1;
    return 0;
}

int pj_apply_test(pj_ctx *c, const char *name, pj_value v, pj_args *a, int *out) {
    pj_value x;
    int t = v.type;
    if (!strcmp(name, "defined")) *out = t != PJ_UNDEF;
    else if (!strcmp(name, "undefined")) *out = t == PJ_UNDEF;
    else if (!strcmp(name, "none")) *out = t == PJ_NONE;
    else if (!strcmp(name, "boolean")) *out = t == PJ_BOOL;
    else if (!strcmp(name, "false")) *out = t == PJ_BOOL && !v.i;
    else if (!strcmp(name, "true")) *out = t == PJ_BOOL && v.i;
    else if (!strcmp(name, "integer")) *out = t == PJ_INT;
    else if (!strcmp(name, "float")) *out = t == PJ_FLOAT;
    else if (!strcmp(name, "number")) *out = t == PJ_INT || t == PJ_FLOAT || t == PJ_BOOL;
    else if (!strcmp(name, "string")) *out = t == PJ_STR;
    else if (!strcmp(name, "mapping")) *out = t == PJ_DICT;
    else if (!strcmp(name, "iterable")) *out = t == PJ_STR || t == PJ_LIST || t == PJ_DICT || t == PJ_UNDEF;
    else if (!strcmp(name, "sequence"))
        *out = t == PJ_STR || t == PJ_DICT || t == PJ_UNDEF || (t == PJ_LIST && !(v.flags & PJ_F_GEN));
    else if (!strcmp(name, "callable")) *out = t == PJ_FUNC;
    else if (!strcmp(name, "escaped")) *out = t == PJ_STR && (v.flags & PJ_F_SAFE);
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        pj_value s, r;
        if (pj_to_str(c, v, &s)) return -1;
        pj_args none = {0};
        if (pj_getattr(c, s, name[0] == 'l' ? "islower" : "isupper", &r) || pj_call(c, r, &none, &r)) return -1;
        *out = pj_truthy(r);
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        pj_value m = pj_int(2), rem;
        if (name[0] == 'd' && !pj_arg(a, 0, "num", &m)) return pj_fail(c, "TypeError", "divisibleby needs a number");
        extern int pj_binop_public(pj_ctx *, int, pj_value, pj_value, pj_value *);
        if (pj_binop_public(c, PJ_OP_MOD, v, m, &rem)) return -1;
        int zero = rem.type == PJ_FLOAT ? rem.f == 0 : rem.i == 0;
        *out = name[0] == 'o' ? !zero : zero;
    } else if (!strcmp(name, "in")) {
        if (!pj_arg(a, 0, "seq", &x)) return pj_fail(c, "TypeError", "in test needs a sequence");
        extern int pj_contains_public(pj_ctx *, pj_value, pj_value, int *);
        return pj_contains_public(c, v, x, out);
    } else if (!strcmp(name, "sameas")) {
        if (!pj_arg(a, 0, "other", &x)) return pj_fail(c, "TypeError", "sameas needs a value");
        if (v.type != x.type) *out = 0;
        else if (t == PJ_NONE || t == PJ_UNDEF) *out = 1;
        else if (t == PJ_BOOL || t == PJ_INT) *out = v.i == x.i;
        else if (t == PJ_STR) *out = v.s == x.s && v.len == x.len;
        else *out = v.l == x.l;
    } else if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.type != PJ_STR) *out = 0;
        else {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(v.len < 63 ? v.len : 63), v.s);
            *out = name[0] == 'f' ? pj_has_filter(nm) : pj_has_test(nm);
        }
    } else {
        int op = !strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==") ? PJ_OP_EQ
                 : !strcmp(name, "ne") || !strcmp(name, "!=") ? PJ_OP_NE
                 : !strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan") ? PJ_OP_LT
                 : !strcmp(name, "le") || !strcmp(name, "<=") ? PJ_OP_LE
                 : !strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan") ? PJ_OP_GT
                 : !strcmp(name, "ge") || !strcmp(name, ">=") ? PJ_OP_GE : 0;
        if (!op) return pj_fail(c, "TemplateRuntimeError", "No test named '%s'.", name);
        if (!pj_arg(a, 0, "other", &x)) return pj_fail(c, "TypeError", "test '%s' needs a value to compare with", name);
        if (op == PJ_OP_EQ) *out = pj_equal(v, x);
        else if (op == PJ_OP_NE) *out = !pj_equal(v, x);
        else {
            int cmp;
            if (pj_compare(c, v, x, op, &cmp)) return -1;
            *out = cmp == 2 ? 0 : op == PJ_OP_LT ? cmp < 0 : op == PJ_OP_LE ? cmp <= 0 : op == PJ_OP_GT ? cmp > 0 : cmp >= 0;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- globals */

static int g_raise(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    (void)self;
    (void)name;
    (void)out;
    pj_value m = pj_str("", 0), s;
    pj_arg(a, 0, "message", &m);
    if (pj_to_str(c, m, &s)) return -1;
    return pj_fail(c, "TemplateError", "%.*s", (int)(s.len > 900 ? 900 : s.len), s.s);
}

static int g_strftime(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    (void)self;
    (void)name;
    pj_value f;
    if (!pj_arg(a, 0, "format", &f) || f.type != PJ_STR)
        return pj_fail(c, "TypeError", "strftime_now() needs a format string");
    char fmt[512], buf[1024];
    if (f.len >= sizeof fmt) return pj_fail(c, "ValueError", "strftime_now format too long");
    memcpy(fmt, f.s, f.len);
    fmt[f.len] = 0;
    size_t n = fmt[0] ? strftime(buf, sizeof buf, fmt, &c->now) : 0;
    *out = pj_str_copy(c, buf, n);
    return c->failed ? -1 : 0;
}

static int g_range(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    (void)self;
    (void)name;
    int64_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw)
        return pj_fail(c, "TypeError", "range expected 1 to 3 integer arguments, got %d", a->n_pos);
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i].type != PJ_INT && a->pos[i].type != PJ_BOOL)
            return pj_fail(c, "TypeError", "'%s' object cannot be interpreted as an integer", pj_type_name(a->pos[i]));
    }
    if (a->n_pos == 1) v[1] = a->pos[0].i;
    else {
        v[0] = a->pos[0].i;
        v[1] = a->pos[1].i;
        if (a->n_pos == 3) v[2] = a->pos[2].i;
    }
    if (v[2] == 0) return pj_fail(c, "ValueError", "range() arg 3 must not be zero");
    __int128 n = 0; /* 128-bit: the span of two int64 bounds overflows int64 */
    if (v[2] > 0 && v[1] > v[0]) n = ((__int128)v[1] - v[0] + v[2] - 1) / v[2];
    if (v[2] < 0 && v[1] < v[0]) n = ((__int128)v[0] - v[1] - v[2] - 1) / -(__int128)v[2];
    if (n > 100000) return pj_fail(c, "OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    *out = pj_list_new(c, (size_t)n, PJ_F_RANGE);
    if (c->failed) return -1;
    memcpy(out->l->range, v, sizeof v);
    for (int64_t i = 0; i < (int64_t)n; i++) pj_list_push(c, out, pj_int((int64_t)(v[0] + (__int128)i * v[2])));
    return c->failed ? -1 : 0;
}

static int g_namespace(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    (void)self;
    pj_value d = pj_dict_new(c, (size_t)a->n_kw + 4);
    if (c->failed) return -1;
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i].type != PJ_DICT) return pj_fail(c, "TypeError", "%s() positional argument must be a mapping", name);
        for (size_t k = 0; k < a->pos[i].d->n; k++) pj_dict_set(c, d.d, a->pos[i].d->keys[k], a->pos[i].d->vals[k]);
    }
    for (int i = 0; i < a->n_kw; i++) pj_dict_set(c, d.d, pj_cstr(a->kw_names[i]), a->kw[i]);
    if (!strcmp(name, "namespace")) d.type = PJ_NS;
    *out = d;
    return c->failed ? -1 : 0;
}

int pj_install_globals(pj_ctx *c, pj_scope *g) {
    static const struct {
        const char *name;
        pj_builtin_fn fn;
    } globals[] = {{"raise_exception", g_raise}, {"strftime_now", g_strftime}, {"range", g_range},
                   {"namespace", g_namespace}, {"dict", g_namespace}};
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++) {
        pj_func *f = pj_alloc(c, sizeof *f);
        if (!f) return -1;
        f->kind = PJ_FN_BUILTIN;
        f->name = globals[i].name;
        f->builtin = globals[i].fn;
        if (pj_scope_set(c, g, globals[i].name, (pj_value){.type = PJ_FUNC, .fn = f})) return -1;
    }
    return 0;
}
