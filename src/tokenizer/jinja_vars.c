/* Variables for the Jinja engine: JSON -> values. From JSON text, exactly as
 * Python's json.loads (1 is an int, 1.0 a float, key order kept, a repeated
 * key keeps its last value); from cJSON, with integral numbers below 2^53 as
 * ints (cJSON keeps no distinction). Not the evaluator (jinja_eval.c). */
#include "tokenizer/jinja_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- JSON -> values */

typedef struct jp {
    pj_ctx *c;
    const char *s;
    size_t n, i;
    int depth;
} jp;

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int jp_fail(jp *p, const char *what) {
    return pj_fail(p->c, "ValueError", "variables JSON: %s at byte %zu", what, p->i);
}

static int jp_hex4(jp *p, uint32_t *out) {
    if (p->i + 4 > p->n) return jp_fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char h = p->s[p->i++];
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0) return jp_fail(p, "bad \\u escape");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

static int jp_string(jp *p, pj_value *out) {
    p->i++; /* opening quote */
    pj_buf b = {.c = p->c};
    size_t run = p->i;
    while (p->i < p->n && p->s[p->i] != '"') {
        unsigned char ch = (unsigned char)p->s[p->i];
        if (ch < 0x20) return jp_fail(p, "control character in string");
        if (ch != '\\') {
            p->i++;
            continue;
        }
        pj_buf_put(&b, p->s + run, p->i - run);
        p->i++;
        if (p->i >= p->n) break;
        char e = p->s[p->i++];
        char tmp[4];
        uint32_t cp;
        switch (e) {
        case '"': pj_buf_put(&b, "\"", 1); break;
        case '\\': pj_buf_put(&b, "\\", 1); break;
        case '/': pj_buf_put(&b, "/", 1); break;
        case 'b': pj_buf_put(&b, "\b", 1); break;
        case 'f': pj_buf_put(&b, "\f", 1); break;
        case 'n': pj_buf_put(&b, "\n", 1); break;
        case 'r': pj_buf_put(&b, "\r", 1); break;
        case 't': pj_buf_put(&b, "\t", 1); break;
        case 'u':
            if (jp_hex4(p, &cp)) return -1;
            if (cp >= 0xd800 && cp < 0xdc00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                uint32_t lo;
                size_t save = p->i;
                p->i += 2;
                if (jp_hex4(p, &lo)) return -1;
                if (lo >= 0xdc00 && lo < 0xe000) cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                else p->i = save;
            }
            if (cp >= 0xd800 && cp < 0xe000) return jp_fail(p, "lone surrogate escape (not representable in UTF-8)");
            pj_buf_put(&b, tmp, (size_t)pj_utf8_encode(cp, tmp));
            break;
        default: return jp_fail(p, "bad escape");
        }
        run = p->i;
    }
    if (p->i >= p->n) return jp_fail(p, "unterminated string");
    pj_buf_put(&b, p->s + run, p->i - run);
    p->i++;
    *out = pj_buf_value(&b);
    return p->c->failed ? -1 : 0;
}

static int jp_value(jp *p, pj_value *out) {
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end");
    if (++p->depth > 500) return jp_fail(p, "nested too deeply");
    char ch = p->s[p->i];
    int rc = 0;
    if (ch == '{') {
        p->i++;
        *out = pj_dict_new(p->c, 4);
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') p->i++;
        else
            for (;;) {
                jp_ws(p);
                pj_value k, v;
                if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a string key");
                if (jp_string(p, &k)) return -1;
                jp_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') return jp_fail(p, "expected ':'");
                p->i++;
                if (jp_value(p, &v)) return -1;
                pj_dict_set(p->c, out->d, k, v); /* a repeated key keeps the last value, like json.loads */
                jp_ws(p);
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    continue;
                }
                if (p->i < p->n && p->s[p->i] == '}') {
                    p->i++;
                    break;
                }
                return jp_fail(p, "expected ',' or '}'");
            }
    } else if (ch == '[') {
        p->i++;
        *out = pj_list_new(p->c, 4, 0);
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') p->i++;
        else
            for (;;) {
                pj_value v;
                if (jp_value(p, &v)) return -1;
                pj_list_push(p->c, out, v);
                jp_ws(p);
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    continue;
                }
                if (p->i < p->n && p->s[p->i] == ']') {
                    p->i++;
                    break;
                }
                return jp_fail(p, "expected ',' or ']'");
            }
    } else if (ch == '"') {
        rc = jp_string(p, out);
    } else if (p->n - p->i >= 4 && !memcmp(p->s + p->i, "true", 4)) {
        *out = pj_bool(1);
        p->i += 4;
    } else if (p->n - p->i >= 5 && !memcmp(p->s + p->i, "false", 5)) {
        *out = pj_bool(0);
        p->i += 5;
    } else if (p->n - p->i >= 4 && !memcmp(p->s + p->i, "null", 4)) {
        *out = pj_none();
        p->i += 4;
    } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
        size_t st = p->i;
        int is_float = 0;
        if (p->s[p->i] == '-') p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
        if (p->i < p->n && p->s[p->i] == '.') {
            is_float = 1;
            p->i++;
            while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
        }
        if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
            is_float = 1;
            p->i++;
            if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
            while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
        }
        char num[64];
        size_t len = p->i - st;
        if (len == 0 || len >= sizeof num || (len == 1 && ch == '-')) return jp_fail(p, "bad number");
        memcpy(num, p->s + st, len);
        num[len] = 0;
        if (is_float) *out = pj_float(strtod(num, NULL));
        else {
            char *end;
            long long v = strtoll(num, &end, 10);
            if ((v == LLONG_MAX || v == LLONG_MIN) && len > 18) *out = pj_float(strtod(num, NULL));
            else *out = pj_int(v);
        }
    } else return jp_fail(p, "unexpected character");
    p->depth--;
    return rc;
}

static int from_cjson(pj_ctx *c, const cJSON *j, pj_value *out, int depth) {
    if (depth > 500) return pj_fail(c, "ValueError", "variables nested too deeply");
    if (cJSON_IsNull(j)) *out = pj_none();
    else if (cJSON_IsTrue(j)) *out = pj_bool(1);
    else if (cJSON_IsFalse(j)) *out = pj_bool(0);
    else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) *out = pj_int((int64_t)d);
        else *out = pj_float(d);
    } else if (cJSON_IsString(j)) *out = pj_str_copy(c, j->valuestring, strlen(j->valuestring));
    else if (cJSON_IsArray(j)) {
        *out = pj_list_new(c, (size_t)cJSON_GetArraySize(j), 0);
        for (const cJSON *e = j->child; e; e = e->next) {
            pj_value v;
            if (from_cjson(c, e, &v, depth + 1)) return -1;
            pj_list_push(c, out, v);
        }
    } else if (cJSON_IsObject(j)) {
        *out = pj_dict_new(c, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *e = j->child; e; e = e->next) {
            pj_value v;
            if (from_cjson(c, e, &v, depth + 1)) return -1;
            pj_dict_set(c, out->d, pj_str_copy(c, e->string, strlen(e->string)), v);
        }
    } else return pj_fail(c, "ValueError", "unsupported JSON value");
    return c->failed ? -1 : 0;
}

int pj_value_from_json(pj_ctx *c, const char *text, size_t len, pj_value *out) {
    jp p = {.c = c, .s = text, .n = len};
    if (jp_value(&p, out)) return -1;
    jp_ws(&p);
    if (p.i != p.n) return jp_fail(&p, "trailing characters");
    return 0;
}

int pj_value_from_cjson(pj_ctx *c, const cJSON *j, pj_value *out) { return from_cjson(c, j, out, 0); }
