/* String formatting of the Jinja engine with Python's semantics: `str % args`
 * (printf-style conversions, mapping keys) and str.format() (positional,
 * keyword and attribute/item fields, conversions, the format-spec
 * mini-language). Not the other str methods (jinja_methods.c). */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ str % args */

static int to_int_for_format(pj_ctx *c, pj_value v, char conv, int64_t *out) {
    if (v.type == PJ_INT || v.type == PJ_BOOL) *out = v.i;
    else if (v.type == PJ_FLOAT && conv != 'x' && conv != 'X' && conv != 'o' && conv != 'c') {
        if (pj_float_to_int(c, v.f, out)) return -1;
    } else if (conv == 'x' || conv == 'X' || conv == 'o')
        return pj_fail(c, "TypeError", "%%%c format: an integer is required, not %s", conv, pj_type_name(v));
    else return pj_fail(c, "TypeError", "%%%c format: a real number is required, not %s", conv, pj_type_name(v));
    return 0;
}

int pj_percent_format(pj_ctx *c, pj_value fmt, pj_value args, pj_value *out) {
    const pj_value *items = &args;
    size_t n_items = 1, next_item = 0;
    int is_map = args.type == PJ_DICT;
    if (args.type == PJ_LIST && (args.flags & PJ_F_TUPLE)) {
        items = args.l->items;
        n_items = args.l->n;
    }
    pj_buf b = {.c = c};
    const char *s = fmt.s;
    size_t n = fmt.len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            pj_buf_put(&b, s + i, 1);
            continue;
        }
        i++;
        if (i >= n) return pj_fail(c, "ValueError", "incomplete format");
        if (s[i] == '%') {
            pj_buf_put(&b, "%", 1);
            continue;
        }
        pj_value v;
        int have_v = 0;
        if (s[i] == '(') {
            size_t j = i + 1;
            while (j < n && s[j] != ')') j++;
            if (j >= n) return pj_fail(c, "ValueError", "incomplete format key");
            if (!is_map) return pj_fail(c, "TypeError", "format requires a mapping");
            pj_value *mv = pj_dict_get(args.d, pj_str(s + i + 1, j - i - 1));
            if (!mv) {
                pj_buf kb = {.c = c};
                pj_repr_of(c, pj_str(s + i + 1, j - i - 1), &kb);
                return pj_fail(c, "KeyError", "%s", kb.p ? kb.p : "");
            }
            v = *mv;
            have_v = 1;
            i = j + 1;
        }
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        while (i < n && strchr("-+ #0", s[i]) && k < 8) spec[k++] = s[i++];
        int width = -1, prec = -1;
        if (i < n && s[i] == '*') return pj_fail(c, "ValueError", "'*' width is not supported");
        if (i < n && s[i] >= '0' && s[i] <= '9') {
            width = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9' && width < 10000) width = width * 10 + (s[i++] - '0');
        }
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9' && prec < 1000) prec = prec * 10 + (s[i++] - '0');
        }
        while (i < n && (s[i] == 'l' || s[i] == 'h' || s[i] == 'L')) i++;
        if (i >= n) return pj_fail(c, "ValueError", "incomplete format");
        char conv = s[i];
        if (!have_v) {
            if (is_map) v = args;
            else {
                if (next_item >= n_items) return pj_fail(c, "TypeError", "not enough arguments for format string");
                v = items[next_item++];
            }
        }
        char tmp[512];
        if (conv == 's' || conv == 'r' || conv == 'a') {
            pj_buf vb = {.c = c};
            if (conv == 's') pj_str_of(c, v, &vb);
            else pj_repr_of(c, v, &vb);
            pj_value sv = pj_buf_value(&vb);
            if (prec >= 0) sv.len = pj_utf8_offset(sv.s, sv.len, prec);
            int64_t cl = (int64_t)pj_utf8_count(sv.s, sv.len);
            int left = memchr(spec, '-', k) != NULL;
            if (!left)
                for (int64_t p = cl; p < width; p++) pj_buf_put(&b, " ", 1);
            pj_buf_put(&b, sv.s, sv.len);
            if (left)
                for (int64_t p = cl; p < width; p++) pj_buf_put(&b, " ", 1);
            continue;
        }
        if (width >= 0) k += (size_t)snprintf(spec + k, sizeof spec - k, "%d", width);
        if (prec >= 0) k += (size_t)snprintf(spec + k, sizeof spec - k, ".%d", prec);
        if (strchr("diuxXo", conv)) {
            int64_t iv;
            if (to_int_for_format(c, v, conv, &iv)) return -1;
            snprintf(spec + k, sizeof spec - k, "ll%c", conv == 'i' || conv == 'u' ? 'd' : conv);
            snprintf(tmp, sizeof tmp, spec, (long long)iv);
        } else if (strchr("eEfFgG", conv)) {
            double dv;
            if (v.type == PJ_FLOAT) dv = v.f;
            else if (v.type == PJ_INT || v.type == PJ_BOOL) dv = (double)v.i;
            else return pj_fail(c, "TypeError", "must be real number, not %s", pj_type_name(v));
            snprintf(spec + k, sizeof spec - k, "%c", conv);
            snprintf(tmp, sizeof tmp, spec, dv);
        } else if (conv == 'c') {
            int64_t iv;
            if (v.type == PJ_STR && pj_utf8_count(v.s, v.len) == 1) {
                pj_buf_put(&b, v.s, v.len);
                continue;
            }
            if (to_int_for_format(c, v, conv, &iv)) return -1;
            if (iv < 0 || iv > 0x10ffff) return pj_fail(c, "OverflowError", "%%c arg not in range(0x110000)");
            int m = pj_utf8_encode((uint32_t)iv, tmp);
            tmp[m] = 0;
        } else {
            return pj_fail(c, "ValueError", "unsupported format character '%c' (0x%x) at index %zu", conv,
                           (unsigned char)conv, i);
        }
        pj_buf_puts(&b, tmp);
    }
    if (!is_map && next_item < n_items)
        return pj_fail(c, "TypeError", "not all arguments converted during string formatting");
    *out = pj_buf_value(&b);
    return c->failed ? -1 : 0;
}

/* ---------------------------------------------------------- str.format() */

/* Applies a format spec ([[fill]align][sign][#][0][width][,][.precision][type]) to v. */
static int format_spec(pj_ctx *c, pj_value v, const char *sp, size_t n, pj_buf *b) {
    if (n == 0) return pj_str_of(c, v, b);
    char fill[8] = " ";
    size_t fill_len = 1, i = 0;
    char align = 0, sign = 0;
    int zero = 0, width = -1, prec = -1, comma = 0, alt = 0;
    size_t adv;
    pj_utf8_decode(sp, n, &adv);
    if (adv < n && strchr("<>^=", sp[adv])) {
        memcpy(fill, sp, adv);
        fill_len = adv;
        align = sp[adv];
        i = adv + 1;
    } else if (strchr("<>^=", sp[0])) {
        align = sp[0];
        i = 1;
    }
    if (i < n && strchr("+- ", sp[i])) sign = sp[i++];
    if (i < n && sp[i] == '#') alt = 1, i++;
    if (i < n && sp[i] == '0') zero = 1, i++;
    if (i < n && sp[i] >= '0' && sp[i] <= '9') {
        width = 0;
        while (i < n && sp[i] >= '0' && sp[i] <= '9' && width < 100000) width = width * 10 + (sp[i++] - '0');
    }
    if (i < n && (sp[i] == ',' || sp[i] == '_')) comma = sp[i++];
    if (i < n && sp[i] == '.') {
        i++;
        prec = 0;
        while (i < n && sp[i] >= '0' && sp[i] <= '9' && prec < 1000) prec = prec * 10 + (sp[i++] - '0');
    }
    char type = i < n ? sp[i++] : 0;
    if (i != n) return pj_fail(c, "ValueError", "Invalid format specifier");
    pj_buf body = {.c = c};
    int numeric = v.type == PJ_INT || v.type == PJ_FLOAT || v.type == PJ_BOOL;
    if (v.type == PJ_STR || (!numeric && (type == 0 || type == 's'))) {
        if (type && type != 's') return pj_fail(c, "ValueError", "Unknown format code '%c' for object of type '%s'", type, pj_type_name(v));
        pj_str_of(c, v, &body);
        if (prec >= 0) body.n = pj_utf8_offset(body.p ? body.p : "", body.n, prec);
        if (!align) align = '<';
    } else if (numeric) {
        char tmp[512], f[32];
        int is_int = v.type != PJ_FLOAT;
        if (!type) type = is_int ? 'd' : 0;
        if (strchr("dxXobn", type) && type) {
            if (!is_int) return pj_fail(c, "ValueError", "Unknown format code '%c' for object of type 'float'", type);
            int64_t x = v.i;
            if (type == 'b') {
                char bits[80];
                int m = 0;
                uint64_t u = x < 0 ? (uint64_t)(-x) : (uint64_t)x;
                do bits[m++] = (char)('0' + (u & 1)); while (u >>= 1);
                size_t t = 0;
                if (x < 0) tmp[t++] = '-';
                while (m) tmp[t++] = bits[--m];
                tmp[t] = 0;
            } else if (alt && (type == 'x' || type == 'X' || type == 'o')) {
                /* Python's '#': 0x / 0X / 0o prefixes after the sign */
                unsigned long long u = x < 0 ? (unsigned long long)(-(x + 1)) + 1 : (unsigned long long)x;
                snprintf(tmp, sizeof tmp, type == 'o' ? "%s0o%llo" : type == 'x' ? "%s0x%llx" : "%s0X%llX",
                         x < 0 ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "", u);
            } else {
                snprintf(f, sizeof f, "%%%sll%c", sign == '+' ? "+" : sign == ' ' ? " " : "", type == 'n' ? 'd' : type);
                snprintf(tmp, sizeof tmp, f, (long long)x);
            }
        } else {
            double x = v.type == PJ_FLOAT ? v.f : (double)v.i;
            if (type == '%') {
                x *= 100;
                snprintf(f, sizeof f, "%%%s.%df%%%%", sign == '+' ? "+" : "", prec < 0 ? 6 : prec);
            } else if (!type) {
                if (prec < 0) {
                    pj_format_float(x, tmp, sizeof tmp);
                    if (sign == '+' && x >= 0) memmove(tmp + 1, tmp, strlen(tmp) + 1), tmp[0] = '+';
                    f[0] = 0;
                } else snprintf(f, sizeof f, "%%%s.%dg", sign == '+' ? "+" : "", prec);
            } else if (strchr("eEfFgG", type)) {
                snprintf(f, sizeof f, "%%%s.%d%c", sign == '+' ? "+" : sign == ' ' ? " " : "", prec < 0 ? 6 : prec, type);
            } else return pj_fail(c, "ValueError", "Unknown format code '%c' for object of type '%s'", type, pj_type_name(v));
            if (f[0]) snprintf(tmp, sizeof tmp, f, x);
        }
        if (comma) { /* group integer digits by 3 */
            char g[600];
            size_t len = strlen(tmp), st = (tmp[0] == '-' || tmp[0] == '+' || tmp[0] == ' ') ? 1 : 0, e = st;
            while (e < len && tmp[e] >= '0' && tmp[e] <= '9') e++;
            size_t o = 0;
            memcpy(g, tmp, st);
            o = st;
            for (size_t k = st; k < e; k++) {
                g[o++] = tmp[k];
                if ((e - k - 1) % 3 == 0 && k + 1 < e) g[o++] = (char)comma;
            }
            memcpy(g + o, tmp + e, len - e + 1);
            size_t gl = strlen(g);
            if (gl >= sizeof tmp) gl = sizeof tmp - 1;
            memcpy(tmp, g, gl);
            tmp[gl] = 0;
        }
        pj_buf_puts(&body, tmp);
        if (!align) align = zero ? '=' : '>';
        if (zero && fill_len == 1 && fill[0] == ' ') fill[0] = '0';
    } else return pj_fail(c, "TypeError", "unsupported format string passed to %s.__format__", pj_type_name(v));
    pj_value bv = pj_buf_value(&body);
    int64_t cl = (int64_t)pj_utf8_count(bv.s, bv.len), total = width > cl ? width - cl : 0, left;
    if (align == '<') left = 0;
    else if (align == '>') left = total;
    else if (align == '^') left = total / 2;
    else { /* '=': padding after the sign */
        size_t sg = bv.len && strchr("+- ", bv.s[0]) ? 1 : 0;
        pj_buf_put(b, bv.s, sg);
        bv.s += sg;
        bv.len -= sg;
        left = total;
    }
    for (int64_t k = 0; k < left; k++) pj_buf_put(b, fill, fill_len);
    pj_buf_put(b, bv.s, bv.len);
    for (int64_t k = left; k < total; k++) pj_buf_put(b, fill, fill_len);
    return c->failed ? -1 : 0;
}

int pj_str_format(pj_ctx *c, pj_value fmt, pj_args *a, pj_value *out) {
    pj_buf b = {.c = c};
    int auto_idx = 0;
    const char *s = fmt.s;
    size_t n = fmt.len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                pj_buf_put(&b, "}", 1);
                i++;
                continue;
            }
            return pj_fail(c, "ValueError", "Single '}' encountered in format string");
        }
        if (s[i] != '{') {
            pj_buf_put(&b, s + i, 1);
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            pj_buf_put(&b, "{", 1);
            i++;
            continue;
        }
        size_t j = i + 1, depth = 1;
        while (j < n && depth) {
            if (s[j] == '{') depth++;
            else if (s[j] == '}') depth--;
            if (depth) j++;
        }
        if (j >= n) return pj_fail(c, "ValueError", "Single '{' encountered in format string");
        const char *f = s + i + 1;
        size_t fl = j - i - 1;
        /* field name up to '.', '[', '!' or ':' */
        size_t k = 0;
        while (k < fl && !strchr(".[!:", f[k])) k++;
        pj_value v;
        /* a field name of digits only is a positional index (as Python's
         * str.format: "0f" is a keyword name); parsed without overflow */
        size_t nd = 0;
        while (nd < k && f[nd] >= '0' && f[nd] <= '9') nd++;
        if (k == 0 || nd == k) {
            int64_t idx = 0;
            if (k == 0) idx = auto_idx++;
            for (size_t d = 0; d < nd && idx <= a->n_pos; d++) idx = idx * 10 + (f[d] - '0');
            if (idx < 0 || idx >= a->n_pos) return pj_fail(c, "IndexError", "tuple index out of range");
            v = a->pos[idx];
        } else {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(k < 127 ? k : 127), f);
            if (!pj_arg(a, -1, name, &v)) return pj_fail(c, "KeyError", "'%s'", name);
        }
        while (k < fl && (f[k] == '.' || f[k] == '[')) {
            char name[128];
            size_t st = ++k;
            if (f[st - 1] == '.') {
                while (k < fl && !strchr(".[!:", f[k])) k++;
                snprintf(name, sizeof name, "%.*s", (int)(k - st < 127 ? k - st : 127), f + st);
                if (pj_getattr(c, v, name, &v)) return -1;
            } else {
                while (k < fl && f[k] != ']') k++;
                snprintf(name, sizeof name, "%.*s", (int)(k - st < 127 ? k - st : 127), f + st);
                k++;
                pj_value key = (name[0] >= '0' && name[0] <= '9') ? pj_int(atoll(name)) : pj_str_copy(c, name, strlen(name));
                if (pj_getitem(c, v, key, &v)) return -1;
            }
            if (pj_check_defined(c, v)) return -1;
        }
        if (k < fl && f[k] == '!') {
            if (k + 1 >= fl) return pj_fail(c, "ValueError", "end of string while looking for conversion specifier");
            char conv = f[k + 1];
            pj_buf cb = {.c = c};
            if (conv == 'r' || conv == 'a') pj_repr_of(c, v, &cb);
            else if (conv == 's') pj_str_of(c, v, &cb);
            else return pj_fail(c, "ValueError", "Unknown conversion specifier %c", conv);
            v = pj_buf_value(&cb);
            k += 2;
        }
        const char *spec = "";
        size_t spl = 0;
        if (k < fl && f[k] == ':') {
            spec = f + k + 1;
            spl = fl - k - 1;
        }
        if (format_spec(c, v, spec, spl, &b)) return -1;
        i = j;
    }
    *out = pj_buf_value(&b);
    return c->failed ? -1 : 0;
}
