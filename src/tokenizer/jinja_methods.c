/* Attribute and item access with jinja2's sandbox rules, and the methods of
 * Python's str, list, dict and of jinja2's loop object: getattr() returns a
 * bound method; the mutating methods of list and dict (append, pop, update,
 * ...) and dunder attributes are refused as ImmutableSandboxedEnvironment
 * refuses them (an undefined value that raises SecurityError when used).
 * Also str % args and str.format(). Not the filters (jinja_filters.c). */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int pj_arg(pj_args *a, int pos, const char *kw, pj_value *out) {
    if (pos >= 0 && pos < a->n_pos) {
        *out = a->pos[pos];
        return 1;
    }
    for (int i = 0; kw && i < a->n_kw; i++)
        if (!strcmp(a->kw_names[i], kw)) {
            *out = a->kw[i];
            return 1;
        }
    return 0;
}

int pj_args_check(pj_ctx *c, const char *fname, pj_args *a, int max_pos, const char *const *kws) {
    if (a->n_pos > max_pos)
        return pj_fail(c, "TypeError", "%s() takes at most %d positional argument%s (%d given)", fname, max_pos,
                       max_pos == 1 ? "" : "s", a->n_pos);
    for (int i = 0; i < a->n_kw; i++) {
        int ok = 0;
        for (int k = 0; kws && kws[k]; k++) ok |= !strcmp(kws[k], a->kw_names[i]);
        if (!ok) return pj_fail(c, "TypeError", "%s() got an unexpected keyword argument '%s'", fname, a->kw_names[i]);
    }
    return 0;
}

/* jinja2's object_type_repr: "'dict object'", "'None'"... (quoted) */
static const char *obj_repr(pj_value v) {
    switch (v.type) {
    case PJ_NONE: return "None";
    case PJ_NS: return "jinja2.utils.Namespace object";
    case PJ_LOOP: return "jinja2.runtime.LoopContext object";
    case PJ_STR: return (v.flags & PJ_F_SAFE) ? "markupsafe.Markup object" : "str object";
    case PJ_BOOL: return "bool object";
    case PJ_INT: return "int object";
    case PJ_FLOAT: return "float object";
    case PJ_DICT: return "dict object";
    case PJ_LIST:
        if (v.flags & PJ_F_RANGE) return "range object";
        if (v.flags & PJ_F_GEN) return "generator object";
        return (v.flags & PJ_F_TUPLE) ? "tuple object" : "list object";
    default: return "object";
    }
}

static pj_value no_attr(pj_ctx *c, pj_value obj, const char *name) {
    pj_buf mb = {.c = c};
    pj_buf_printf(&mb, "'%s' has no attribute ", obj_repr(obj));
    pj_repr_of(c, pj_cstr(name), &mb);
    return pj_undef_v(c, mb.p, 0);
}

static pj_value unsafe(pj_ctx *c, pj_value obj, const char *name) {
    pj_buf mb = {.c = c};
    pj_buf_puts(&mb, "access to attribute ");
    pj_repr_of(c, pj_cstr(name), &mb);
    pj_buf_printf(&mb, " of '%s' object is unsafe.", pj_type_name(obj));
    return pj_undef_v(c, mb.p, 1);
}

static int str_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out);
static int list_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out);
static int dict_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out);
static int loop_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out);

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper", "lower",
    "title", "capitalize", "swapcase", "casefold", "find", "rfind", "index", "rindex", "count", "join",
    "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "isnumeric", "isdecimal",
    "center", "ljust", "rjust", "zfill", "partition", "rpartition", "removeprefix", "removesuffix", "format",
    "istitle", NULL};
static const char *const LIST_SAFE[] = {"count", "index", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse",
                                          "sort", NULL};
static const char *const DICT_SAFE[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};

static int in_list(const char *const *l, const char *name) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], name)) return 1;
    return 0;
}

static pj_value bound(pj_ctx *c, pj_value self, const char *name, pj_builtin_fn fn) {
    pj_func *f = pj_alloc(c, sizeof *f);
    if (!f) return pj_none();
    f->kind = PJ_FN_METHOD;
    f->name = name;
    f->builtin = fn;
    f->self = self;
    return (pj_value){.type = PJ_FUNC, .fn = f};
}

static int loop_attr(pj_ctx *c, pj_value obj, const char *name, pj_value *out) {
    const pj_loop *l = obj.loop;
    int64_t i = (int64_t)l->index0, n = (int64_t)l->items->n;
    if (!strcmp(name, "index")) *out = pj_int(i + 1);
    else if (!strcmp(name, "index0")) *out = pj_int(i);
    else if (!strcmp(name, "revindex")) *out = pj_int(n - i);
    else if (!strcmp(name, "revindex0")) *out = pj_int(n - i - 1);
    else if (!strcmp(name, "first")) *out = pj_bool(i == 0);
    else if (!strcmp(name, "last")) *out = pj_bool(i == n - 1);
    else if (!strcmp(name, "length")) *out = pj_int(n);
    else if (!strcmp(name, "depth")) *out = pj_int(l->depth);
    else if (!strcmp(name, "depth0")) *out = pj_int(l->depth - 1);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? l->items->items[i - 1] : pj_undef_v(c, "there is no previous item", 0);
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? l->items->items[i + 1] : pj_undef_v(c, "there is no next item", 0);
    else if (!strcmp(name, "cycle") || !strcmp(name, "changed")) *out = bound(c, obj, name, loop_method);
    else *out = no_attr(c, obj, name);
    return c->failed ? -1 : 0;
}

int pj_getattr(pj_ctx *c, pj_value obj, const char *name, pj_value *out) {
    if (pj_check_defined(c, obj)) return -1;
    if (name[0] == '_' && name[1] == '_') {
        *out = unsafe(c, obj, name);
        return c->failed ? -1 : 0;
    }
    switch (obj.type) {
    case PJ_STR:
        if (in_list(STR_METHODS, name)) *out = bound(c, obj, name, str_method);
        else *out = no_attr(c, obj, name);
        break;
    case PJ_LIST:
        if (obj.flags & (PJ_F_GEN | PJ_F_RANGE)) *out = no_attr(c, obj, name);
        else if (in_list(LIST_SAFE, name) && !((obj.flags & PJ_F_TUPLE) && !strcmp(name, "copy")))
            *out = bound(c, obj, name, list_method);
        else if (!(obj.flags & PJ_F_TUPLE) && in_list(LIST_UNSAFE, name)) *out = unsafe(c, obj, name);
        else *out = no_attr(c, obj, name);
        break;
    case PJ_DICT: {
        if (in_list(DICT_SAFE, name)) *out = bound(c, obj, name, dict_method);
        else if (in_list(DICT_UNSAFE, name)) *out = unsafe(c, obj, name);
        else {
            if (pj_charge(c, obj.d->n / 8)) return -1;
            pj_value *v = pj_dict_get_str(obj.d, name);
            *out = v ? *v : no_attr(c, obj, name);
        }
        break;
    }
    case PJ_NS: {
        pj_value *v = pj_dict_get_str(obj.d, name);
        *out = v ? *v : no_attr(c, obj, name);
        break;
    }
    case PJ_LOOP: return loop_attr(c, obj, name, out);
    default: *out = no_attr(c, obj, name); break;
    }
    return c->failed ? -1 : 0;
}

int pj_getitem(pj_ctx *c, pj_value obj, pj_value key, pj_value *out) {
    if (pj_check_defined(c, obj)) return -1;
    if (obj.type == PJ_DICT) {
        if (pj_charge(c, obj.d->n / 8)) return -1;
        pj_value *v = pj_dict_get(obj.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    } else if ((obj.type == PJ_LIST && !(obj.flags & PJ_F_GEN)) || obj.type == PJ_STR) {
        if (key.type == PJ_INT || key.type == PJ_BOOL) {
            int64_t n, i = key.i;
            if (pj_length(c, obj, &n)) return -1;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                if (obj.type == PJ_STR) {
                    size_t off = pj_utf8_offset(obj.s, obj.len, i), adv;
                    pj_utf8_decode(obj.s + off, obj.len - off, &adv);
                    *out = pj_str(obj.s + off, adv);
                } else if (obj.flags & PJ_F_RANGE) *out = obj.l->items[i];
                else *out = obj.l->items[i];
                return 0;
            }
            pj_buf mb = {.c = c};
            pj_buf_printf(&mb, "%s has no element ", obj_repr(obj));
            pj_repr_of(c, key, &mb);
            *out = pj_undef_v(c, mb.p, 0);
            return c->failed ? -1 : 0;
        }
    }
    if (key.type == PJ_STR) {
        char *name = pj_alloc(c, key.len + 1);
        if (!name) return -1;
        memcpy(name, key.s, key.len);
        if (obj.type == PJ_DICT && strlen(name) == key.len && !in_list(DICT_SAFE, name) &&
            !in_list(DICT_UNSAFE, name)) {
            *out = no_attr(c, obj, name);
            return c->failed ? -1 : 0;
        }
        return pj_getattr(c, obj, name, out);
    }
    pj_buf mb = {.c = c};
    pj_buf_printf(&mb, "%s has no element ", obj_repr(obj));
    pj_repr_of(c, key, &mb);
    *out = pj_undef_v(c, mb.p, 0);
    return c->failed ? -1 : 0;
}

/* ---------------------------------------------------------- str helpers */

static int need_str(pj_ctx *c, const char *fname, pj_value v, int arg_no) {
    if (v.type == PJ_STR) return 0;
    if (v.type == PJ_UNDEF) return pj_check_defined(c, v);
    (void)arg_no;
    return pj_fail(c, "TypeError", "%s arg must be None or str, not %s", fname, pj_type_name(v));
}

static int in_chars(uint32_t cp, pj_value chars) {
    for (size_t i = 0; i < chars.len;) {
        size_t adv;
        if (pj_utf8_decode(chars.s + i, chars.len - i, &adv) == cp) return 1;
        i += adv;
    }
    return 0;
}

/* strip: which = 1 left, 2 right, 3 both; chars: NULL = whitespace */
static pj_value do_strip(pj_value s, int which, const pj_value *chars) {
    size_t b = 0, e = s.len;
    if (which & 1)
        while (b < e) {
            size_t adv;
            uint32_t cp = pj_utf8_decode(s.s + b, e - b, &adv);
            if (chars ? !in_chars(cp, *chars) : !pj_is_space(cp)) break;
            b += adv;
        }
    if (which & 2)
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s.s[k] & 0xc0) == 0x80 && e - k < 4) k--;
            size_t adv;
            uint32_t cp = pj_utf8_decode(s.s + k, e - k, &adv);
            if (k + adv != e) adv = 1, k = e - 1, cp = (unsigned char)s.s[k];
            if (chars ? !in_chars(cp, *chars) : !pj_is_space(cp)) break;
            e = k;
        }
    pj_value r = pj_str(s.s + b, e - b);
    r.flags = s.flags & PJ_F_SAFE;
    return r;
}

pj_value pj_strip(pj_value s, int which, const pj_value *chars);
pj_value pj_strip(pj_value s, int which, const pj_value *chars) { return do_strip(s, which, chars); }

typedef uint32_t (*cp_map)(uint32_t);
static uint32_t up(uint32_t cp) { return (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); }
static uint32_t lo(uint32_t cp) { return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); }
static uint32_t ti(uint32_t cp) { return (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp); }
static int is_cased(uint32_t cp) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* Unicode's unconditional special casings that Python applies and simple
 * per-code-point mappings miss (ß -> SS, ligatures, İ -> i̇). want: 0 upper,
 * 1 lower, 2 title. NULL when the simple mapping is right. */
static const char *full_case(uint32_t cp, int want) {
    switch (cp) {
    case 0xdf: return want == 0 ? "SS" : want == 2 ? "Ss" : NULL;
    case 0xfb00: return want == 0 ? "FF" : want == 2 ? "Ff" : NULL;
    case 0xfb01: return want == 0 ? "FI" : want == 2 ? "Fi" : NULL;
    case 0xfb02: return want == 0 ? "FL" : want == 2 ? "Fl" : NULL;
    case 0xfb03: return want == 0 ? "FFI" : want == 2 ? "Ffi" : NULL;
    case 0xfb04: return want == 0 ? "FFL" : want == 2 ? "Ffl" : NULL;
    case 0xfb05:
    case 0xfb06: return want == 0 ? "ST" : want == 2 ? "St" : NULL;
    case 0x130: return want == 1 ? "i\xcc\x87" : NULL;
    case 0x149: return want == 0 ? "\xca\xbcN" : want == 2 ? "\xca\xbcN" : NULL;
    }
    return NULL;
}

/* mode: 0 upper, 1 lower, 2 title (str.title), 3 capitalize, 4 swapcase */
pj_value pj_case(pj_ctx *c, pj_value s, int mode);
pj_value pj_case(pj_ctx *c, pj_value s, int mode) {
    pj_buf b = {.c = c};
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s.len;) {
        size_t adv;
        uint32_t cp = pj_utf8_decode(s.s + i, s.len - i, &adv), r = cp;
        int want = 0; /* 0 upper, 1 lower, 2 title, -1 keep */
        switch (mode) {
        case 0: want = 0; break;
        case 1: want = 1; break;
        case 2: want = prev_cased ? 1 : 2; break;
        case 3: want = first ? 2 : 1; break;
        case 4:
            want = utf8proc_islower((utf8proc_int32_t)cp) ? 0 : utf8proc_isupper((utf8proc_int32_t)cp) ? 1 : -1;
            break;
        }
        if (want == 0) r = up(cp);
        else if (want == 1) r = lo(cp);
        else if (want == 2) r = ti(cp);
        prev_cased = is_cased(cp);
        first = 0;
        const char *full = want >= 0 ? full_case(cp, want) : NULL;
        char tmp[4];
        if (full) pj_buf_puts(&b, full);
        else if (r == cp) pj_buf_put(&b, s.s + i, adv);
        else pj_buf_put(&b, tmp, (size_t)pj_utf8_encode(r, tmp));
        i += adv;
    }
    pj_value v = pj_buf_value(&b);
    v.flags = s.flags & PJ_F_SAFE;
    return v;
}

/* Python's str.split(sep, maxsplit) / rsplit. */
pj_value pj_split(pj_ctx *c, pj_value s, const pj_value *sep, int64_t maxsplit, int from_right);
pj_value pj_split(pj_ctx *c, pj_value s, const pj_value *sep, int64_t maxsplit, int from_right) {
    pj_value out = pj_list_new(c, 4, 0);
    if (!sep) {
        /* whitespace runs; collect all words, then honour maxsplit */
        size_t *bs = pj_alloc(c, (s.len + 1) * sizeof(size_t) * 2);
        if (!bs) return out;
        size_t nw = 0, i = 0;
        while (i < s.len) {
            size_t adv;
            while (i < s.len && pj_is_space(pj_utf8_decode(s.s + i, s.len - i, &adv))) i += adv;
            if (i >= s.len) break;
            size_t st = i;
            while (i < s.len && !pj_is_space(pj_utf8_decode(s.s + i, s.len - i, &adv))) i += adv;
            bs[2 * nw] = st;
            bs[2 * nw + 1] = i;
            nw++;
        }
        if (maxsplit < 0 || (size_t)maxsplit + 1 >= nw) {
            for (size_t w = 0; w < nw; w++) pj_list_push(c, &out, pj_str(s.s + bs[2 * w], bs[2 * w + 1] - bs[2 * w]));
        } else if (!from_right) {
            for (int64_t w = 0; w < maxsplit; w++) pj_list_push(c, &out, pj_str(s.s + bs[2 * w], bs[2 * w + 1] - bs[2 * w]));
            pj_value rest = pj_str(s.s + bs[2 * maxsplit], s.len - bs[2 * maxsplit]);
            pj_list_push(c, &out, do_strip(rest, 2, NULL));
        } else {
            size_t keep = nw - (size_t)maxsplit;
            pj_list_push(c, &out, do_strip(pj_str(s.s, bs[2 * keep - 1]), 1, NULL));
            for (size_t w = keep; w < nw; w++) pj_list_push(c, &out, pj_str(s.s + bs[2 * w], bs[2 * w + 1] - bs[2 * w]));
        }
        return out;
    }
    if (sep->len == 0) {
        pj_fail(c, "ValueError", "empty separator");
        return out;
    }
    if (!from_right) {
        size_t st = 0;
        int64_t k = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || k < maxsplit) && st <= s.len
                                  ? memmem(s.s + st, s.len - st, sep->s, sep->len) : NULL;
            if (!hit) break;
            pj_list_push(c, &out, pj_str(s.s + st, (size_t)(hit - (s.s + st))));
            st = (size_t)(hit - s.s) + sep->len;
            k++;
        }
        pj_list_push(c, &out, pj_str(s.s + st, s.len - st));
        return out;
    }
    /* rsplit: collect from the right, then reverse */
    pj_value rev = pj_list_new(c, 4, 0);
    size_t end = s.len;
    int64_t k = 0;
    while (maxsplit < 0 || k < maxsplit) {
        size_t pos = (size_t)-1;
        for (size_t i = end >= sep->len ? end - sep->len + 1 : 0; i-- > 0;)
            if (!memcmp(s.s + i, sep->s, sep->len)) {
                pos = i;
                break;
            }
        if (pos == (size_t)-1) break;
        pj_list_push(c, &rev, pj_str(s.s + pos + sep->len, end - pos - sep->len));
        end = pos;
        k++;
    }
    pj_list_push(c, &rev, pj_str(s.s, end));
    for (size_t i = rev.l->n; i-- > 0;) pj_list_push(c, &out, rev.l->items[i]);
    return out;
}

/* Python's str.splitlines() boundaries. */
pj_value pj_splitlines(pj_ctx *c, pj_value s, int keepends);
pj_value pj_splitlines(pj_ctx *c, pj_value s, int keepends) {
    pj_value out = pj_list_new(c, 4, 0);
    size_t st = 0, i = 0;
    while (i < s.len) {
        size_t adv;
        uint32_t cp = pj_utf8_decode(s.s + i, s.len - i, &adv);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            i += adv;
            continue;
        }
        size_t eol = i;
        i += adv;
        if (cp == '\r' && i < s.len && s.s[i] == '\n') i++;
        pj_list_push(c, &out, pj_str(s.s + st, (keepends ? i : eol) - st));
        st = i;
    }
    if (st < s.len) pj_list_push(c, &out, pj_str(s.s + st, s.len - st));
    return out;
}

static int64_t cp_index(pj_value s, const char *at) { return (int64_t)pj_utf8_count(s.s, (size_t)(at - s.s)); }

static int pad(pj_ctx *c, pj_value s, int64_t width, pj_value fill, int align, pj_value *out) {
    int64_t n = (int64_t)pj_utf8_count(s.s, s.len);
    if (fill.type != PJ_STR || pj_utf8_count(fill.s, fill.len) != 1)
        return pj_fail(c, "TypeError", "The fill character must be exactly one character long");
    if (width <= n) {
        *out = s;
        return 0;
    }
    int64_t total = width - n, left = align == 0 ? 0 : align == 2 ? total : total / 2 + (total & width & 1);
    if (width > (1 << 24)) return pj_fail(c, "MemoryError", "padding too large");
    pj_buf b = {.c = c};
    for (int64_t i = 0; i < left; i++) pj_buf_put(&b, fill.s, fill.len);
    pj_buf_put(&b, s.s, s.len);
    for (int64_t i = left; i < total; i++) pj_buf_put(&b, fill.s, fill.len);
    *out = pj_buf_value(&b);
    return c->failed ? -1 : 0;
}

static int str_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    pj_value s = *self, x, y;
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        int which = name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3;
        if (pj_args_check(c, name, a, 1, NULL)) return -1;
        if (pj_arg(a, 0, NULL, &x) && x.type != PJ_NONE) {
            if (need_str(c, name, x, 1)) return -1;
            *out = do_strip(s, which, &x);
        } else *out = do_strip(s, which, NULL);
        return 0;
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        static const char *const kws[] = {"sep", "maxsplit", NULL};
        if (pj_args_check(c, name, a, 2, kws)) return -1;
        int64_t maxsplit = -1;
        if (pj_arg(a, 1, "maxsplit", &y)) {
            if (y.type != PJ_INT) return pj_fail(c, "TypeError", "'%s' object cannot be interpreted as an integer", pj_type_name(y));
            maxsplit = y.i;
        }
        int has = pj_arg(a, 0, "sep", &x) && x.type != PJ_NONE;
        if (has && need_str(c, name, x, 1)) return -1;
        *out = pj_split(c, s, has ? &x : NULL, maxsplit, name[0] == 'r');
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (pj_args_check(c, name, a, 1, NULL) || !pj_arg(a, 0, NULL, &x))
            return c->failed ? -1 : pj_fail(c, "TypeError", "%s() takes at least 1 argument (0 given)", name);
        pj_value one = x;
        size_t n = 1;
        const pj_value *cands = &one;
        if (x.type == PJ_LIST && (x.flags & PJ_F_TUPLE)) {
            cands = x.l->items;
            n = x.l->n;
        }
        int r = 0;
        for (size_t i = 0; i < n; i++) {
            pj_value p = cands[i];
            if (p.type != PJ_STR)
                return pj_fail(c, "TypeError", "%s first arg must be str or a tuple of str, not %s", name, pj_type_name(p));
            if (p.len <= s.len &&
                !memcmp(name[0] == 's' ? s.s : s.s + s.len - p.len, p.s, p.len))
                r = 1;
        }
        *out = pj_bool(r);
        return 0;
    }
    if (!strcmp(name, "replace")) {
        if (pj_args_check(c, name, a, 3, NULL)) return -1;
        pj_value cnt = pj_int(-1);
        if (!pj_arg(a, 0, NULL, &x) || !pj_arg(a, 1, NULL, &y))
            return pj_fail(c, "TypeError", "replace expected at least 2 arguments, got %d", a->n_pos);
        pj_arg(a, 2, NULL, &cnt);
        if (need_str(c, name, x, 1) || need_str(c, name, y, 2)) return -1;
        pj_value pj_replace(pj_ctx * c, pj_value s, pj_value old, pj_value new_, int64_t count);
        *out = pj_replace(c, s, x, y, cnt.type == PJ_INT ? cnt.i : -1);
        return c->failed ? -1 : 0;
    }
    int mode = !strcmp(name, "upper") ? 0 : !strcmp(name, "lower") || !strcmp(name, "casefold") ? 1
               : !strcmp(name, "title") ? 2 : !strcmp(name, "capitalize") ? 3 : !strcmp(name, "swapcase") ? 4 : -1;
    if (mode >= 0) {
        if (pj_args_check(c, name, a, 0, NULL)) return -1;
        *out = pj_case(c, s, mode);
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
        !strcmp(name, "count")) {
        if (pj_args_check(c, name, a, 3, NULL)) return -1;
        if (!pj_arg(a, 0, NULL, &x)) return pj_fail(c, "TypeError", "%s() takes at least 1 argument (0 given)", name);
        if (x.type != PJ_STR) return pj_fail(c, "TypeError", "must be str, not %s", pj_type_name(x));
        /* optional start/end in code points */
        int64_t n = (int64_t)pj_utf8_count(s.s, s.len), st = 0, en = n;
        if (pj_arg(a, 1, NULL, &y) && y.type == PJ_INT) st = y.i < 0 ? (y.i + n < 0 ? 0 : y.i + n) : y.i;
        if (pj_arg(a, 2, NULL, &y) && y.type == PJ_INT) en = y.i < 0 ? (y.i + n < 0 ? 0 : y.i + n) : (y.i > n ? n : y.i);
        size_t bst = pj_utf8_offset(s.s, s.len, st), ben = pj_utf8_offset(s.s, s.len, en);
        if (st > n || ben < bst) {
            if (!strcmp(name, "count")) *out = pj_int(0);
            else if (name[strlen(name) - 1] == 'x') return pj_fail(c, "ValueError", "substring not found");
            else *out = pj_int(-1);
            return 0;
        }
        pj_value hay = pj_str(s.s + bst, ben - bst);
        if (!strcmp(name, "count")) {
            int64_t k = 0;
            if (x.len == 0) k = (int64_t)pj_utf8_count(hay.s, hay.len) + 1;
            else
                for (size_t i = 0; i + x.len <= hay.len;) {
                    const char *h = memmem(hay.s + i, hay.len - i, x.s, x.len);
                    if (!h) break;
                    k++;
                    i = (size_t)(h - hay.s) + x.len;
                }
            *out = pj_int(k);
            return 0;
        }
        const char *hit = NULL;
        if (name[0] != 'r') hit = x.len == 0 ? hay.s : memmem(hay.s, hay.len, x.s, x.len);
        else
            for (size_t i = hay.len >= x.len ? hay.len - x.len + 1 : 0; i-- > 0;)
                if (!memcmp(hay.s + i, x.s, x.len)) {
                    hit = hay.s + i;
                    break;
                }
        if (!hit) {
            if (name[strlen(name) - 1] == 'x') return pj_fail(c, "ValueError", "substring not found");
            *out = pj_int(-1);
        } else *out = pj_int(cp_index(s, hit));
        return 0;
    }
    if (!strcmp(name, "join")) {
        pj_value items;
        if (pj_args_check(c, name, a, 1, NULL)) return -1;
        if (!pj_arg(a, 0, NULL, &x)) return pj_fail(c, "TypeError", "str.join() takes exactly one argument (0 given)");
        if (pj_iterate(c, x, &items)) return -1;
        pj_buf b = {.c = c};
        for (size_t i = 0; i < items.l->n; i++) {
            pj_value it = items.l->items[i];
            if (it.type != PJ_STR)
                return pj_fail(c, "TypeError", "sequence item %zu: expected str instance, %s found", i, pj_type_name(it));
            if (i) pj_buf_put(&b, s.s, s.len);
            pj_buf_put(&b, it.s, it.len);
        }
        *out = pj_buf_value(&b);
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "splitlines")) {
        pj_value k = pj_bool(0);
        pj_arg(a, 0, "keepends", &k);
        *out = pj_splitlines(c, s, pj_truthy(k));
        return c->failed ? -1 : 0;
    }
    if (!strncmp(name, "is", 2)) {
        int r = s.len > 0, any_cased = 0, any_upper = 0, any_lower = 0;
        for (size_t i = 0; i < s.len;) {
            size_t adv;
            uint32_t cp = pj_utf8_decode(s.s + i, s.len - i, &adv);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
            int digit = k == UTF8PROC_CATEGORY_ND, alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
            int numeric = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
            if (!strcmp(name, "isdigit") || !strcmp(name, "isdecimal")) r &= digit;
            else if (!strcmp(name, "isnumeric")) r &= numeric;
            else if (!strcmp(name, "isalpha")) r &= alpha;
            else if (!strcmp(name, "isalnum")) r &= alpha || numeric;
            else if (!strcmp(name, "isspace")) r &= pj_is_space(cp);
            any_cased |= is_cased(cp);
            any_upper |= k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT;
            any_lower |= k == UTF8PROC_CATEGORY_LL;
            i += adv;
        }
        if (!strcmp(name, "isupper")) r = any_cased && !any_lower;
        else if (!strcmp(name, "islower")) r = any_cased && !any_upper;
        else if (!strcmp(name, "istitle")) {
            pj_value t = pj_case(c, s, 2);
            r = any_cased && t.len == s.len && !memcmp(t.s, s.s, s.len);
        }
        *out = pj_bool(r);
        return 0;
    }
    if (!strcmp(name, "center") || !strcmp(name, "ljust") || !strcmp(name, "rjust")) {
        pj_value fill = pj_cstr(" ");
        if (!pj_arg(a, 0, NULL, &x) || x.type != PJ_INT)
            return pj_fail(c, "TypeError", "%s() needs an integer width", name);
        pj_arg(a, 1, NULL, &fill);
        return pad(c, s, x.i, fill, name[0] == 'l' ? 0 : name[0] == 'r' ? 2 : 1, out);
    }
    if (!strcmp(name, "zfill")) {
        if (!pj_arg(a, 0, NULL, &x) || x.type != PJ_INT) return pj_fail(c, "TypeError", "zfill() needs an integer width");
        int64_t n = (int64_t)pj_utf8_count(s.s, s.len);
        if (x.i <= n) {
            *out = s;
            return 0;
        }
        if (x.i > (1 << 24)) return pj_fail(c, "MemoryError", "padding too large");
        pj_buf b = {.c = c};
        size_t sign = s.len && (s.s[0] == '-' || s.s[0] == '+');
        pj_buf_put(&b, s.s, sign);
        for (int64_t i = 0; i < x.i - n; i++) pj_buf_put(&b, "0", 1);
        pj_buf_put(&b, s.s + sign, s.len - sign);
        *out = pj_buf_value(&b);
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "partition") || !strcmp(name, "rpartition")) {
        if (!pj_arg(a, 0, NULL, &x) || x.type != PJ_STR) return pj_fail(c, "TypeError", "must be str");
        if (x.len == 0) return pj_fail(c, "ValueError", "empty separator");
        const char *hit = NULL;
        if (name[0] == 'p') hit = memmem(s.s, s.len, x.s, x.len);
        else
            for (size_t i = s.len >= x.len ? s.len - x.len + 1 : 0; i-- > 0;)
                if (!memcmp(s.s + i, x.s, x.len)) {
                    hit = s.s + i;
                    break;
                }
        *out = pj_list_new(c, 3, PJ_F_TUPLE);
        if (!hit) {
            pj_list_push(c, out, name[0] == 'p' ? s : pj_str("", 0));
            pj_list_push(c, out, pj_str("", 0));
            pj_list_push(c, out, name[0] == 'p' ? pj_str("", 0) : s);
        } else {
            pj_list_push(c, out, pj_str(s.s, (size_t)(hit - s.s)));
            pj_list_push(c, out, x);
            pj_list_push(c, out, pj_str(hit + x.len, s.len - (size_t)(hit - s.s) - x.len));
        }
        return c->failed ? -1 : 0;
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        if (!pj_arg(a, 0, NULL, &x) || x.type != PJ_STR) return pj_fail(c, "TypeError", "%s() argument must be str", name);
        *out = s;
        if (x.len <= s.len) {
            if (name[6] == 'p' && !memcmp(s.s, x.s, x.len)) *out = pj_str(s.s + x.len, s.len - x.len);
            if (name[6] == 's' && !memcmp(s.s + s.len - x.len, x.s, x.len)) *out = pj_str(s.s, s.len - x.len);
        }
        return 0;
    }
    if (!strcmp(name, "format")) return pj_str_format(c, s, a, out);
    return pj_fail(c, "AttributeError", "'str' object has no attribute '%s'", name);
}

pj_value pj_replace(pj_ctx *c, pj_value s, pj_value old, pj_value new_, int64_t count) {
    pj_buf b = {.c = c};
    if (old.len == 0) { /* insert between every code point */
        int64_t k = 0;
        for (size_t i = 0; i <= s.len;) {
            if (count < 0 || k < count) {
                pj_buf_put(&b, new_.s, new_.len);
                k++;
            }
            if (i == s.len) break;
            size_t adv;
            pj_utf8_decode(s.s + i, s.len - i, &adv);
            pj_buf_put(&b, s.s + i, adv);
            i += adv;
        }
        return pj_buf_value(&b);
    }
    size_t st = 0;
    int64_t k = 0;
    while (count < 0 || k < count) {
        const char *hit = st <= s.len ? memmem(s.s + st, s.len - st, old.s, old.len) : NULL;
        if (!hit) break;
        pj_buf_put(&b, s.s + st, (size_t)(hit - (s.s + st)));
        pj_buf_put(&b, new_.s, new_.len);
        st = (size_t)(hit - s.s) + old.len;
        k++;
    }
    pj_buf_put(&b, s.s + st, s.len - st);
    return pj_buf_value(&b);
}

static int list_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    pj_value x;
    if (!strcmp(name, "copy")) {
        *out = *self;
        return 0;
    }
    if (!pj_arg(a, 0, NULL, &x)) return pj_fail(c, "TypeError", "%s() takes exactly one argument (0 given)", name);
    if (!strcmp(name, "count")) {
        int64_t k = 0;
        for (size_t i = 0; i < self->l->n; i++) k += pj_equal(self->l->items[i], x);
        *out = pj_int(k);
        return 0;
    }
    for (size_t i = 0; i < self->l->n; i++)
        if (pj_equal(self->l->items[i], x)) {
            *out = pj_int((int64_t)i);
            return 0;
        }
    pj_buf mb = {.c = c};
    pj_repr_of(c, x, &mb);
    return pj_fail(c, "ValueError", "%s is not in %s", mb.p ? mb.p : "", pj_type_name(*self));
}

static int dict_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    const pj_dict *d = self->d;
    if (!strcmp(name, "get")) {
        pj_value k, def = pj_none();
        if (pj_args_check(c, "get", a, 2, NULL)) return -1;
        if (!pj_arg(a, 0, NULL, &k)) return pj_fail(c, "TypeError", "get expected at least 1 argument, got 0");
        pj_arg(a, 1, NULL, &def);
        pj_value *v = pj_dict_get(d, k);
        *out = v ? *v : def;
        return 0;
    }
    if (pj_args_check(c, name, a, 0, NULL)) return -1;
    if (!strcmp(name, "copy")) {
        *out = *self;
        return 0;
    }
    *out = pj_list_new(c, d->n, 0);
    for (size_t i = 0; i < d->n; i++) {
        if (!strcmp(name, "keys")) pj_list_push(c, out, d->keys[i]);
        else if (!strcmp(name, "values")) pj_list_push(c, out, d->vals[i]);
        else {
            pj_value t = pj_list_new(c, 2, PJ_F_TUPLE);
            pj_list_push(c, &t, d->keys[i]);
            pj_list_push(c, &t, d->vals[i]);
            pj_list_push(c, out, t);
        }
    }
    return c->failed ? -1 : 0;
}

static int loop_method(pj_ctx *c, const pj_value *self, const char *name, pj_args *a, pj_value *out) {
    pj_loop *l = self->loop;
    if (!strcmp(name, "cycle")) {
        if (a->n_pos == 0) return pj_fail(c, "TypeError", "no items for cycling given");
        *out = a->pos[l->index0 % (size_t)a->n_pos];
        return 0;
    }
    /* changed(*values): true when the values differ from the previous call's */
    pj_value cur = pj_list_new(c, (size_t)a->n_pos, 0);
    for (int i = 0; i < a->n_pos; i++) pj_list_push(c, &cur, a->pos[i]);
    int changed = !l->has_changed || !pj_equal(l->last_changed, cur);
    l->last_changed = cur;
    l->has_changed = 1;
    *out = pj_bool(changed);
    return c->failed ? -1 : 0;
}
