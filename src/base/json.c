/* JSON helpers (see json.h). */
#include "base/json.h"

#include "base/error.h"
#include "base/mmap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *pt_json_find_duplicate(const cJSON *node) {
    if (!node) return NULL;
    if (cJSON_IsObject(node)) {
        for (const cJSON *a = node->child; a; a = a->next) {
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && strcmp(a->string, b->string) == 0) return a->string;
        }
    }
    for (const cJSON *c = node->child; c; c = c->next) {
        const char *d = pt_json_find_duplicate(c);
        if (d) return d;
    }
    return NULL;
}

pt_status pt_json_parse(const char *text, size_t len, const char *what, int reject_duplicates,
                        cJSON **out) {
    *out = NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        return pt_error(PT_ERR_FORMAT, "%s: not valid JSON (parse error near byte %zu)", what, off);
    }
    /* trailing garbage other than whitespace/NUL */
    if (end) {
        for (const char *p = end; p < text + len; p++) {
            if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != 0) {
                cJSON_Delete(j);
                return pt_error(PT_ERR_FORMAT, "%s: trailing data after JSON value at byte %zu",
                                what, (size_t)(p - text));
            }
        }
    }
    if (reject_duplicates) {
        const char *d = pt_json_find_duplicate(j);
        if (d) {
            pt_status s = pt_error(PT_ERR_FORMAT, "%s: duplicate key \"%s\"", what, d);
            cJSON_Delete(j);
            return s;
        }
    }
    *out = j;
    return PT_OK;
}

pt_status pt_json_load_file(const char *path, int reject_duplicates, cJSON **out) {
    char *buf;
    size_t len;
    *out = NULL;
    PT_TRY(pt_read_file(path, &buf, &len));
    pt_status s = pt_json_parse(buf, len, path, reject_duplicates, out);
    free(buf);
    return s;
}

pt_status pt_json_to_i64(const cJSON *node, int64_t lo, int64_t hi, int64_t *out, const char *what) {
    if (!node || cJSON_IsNull(node)) return pt_error(PT_ERR_NOT_FOUND, "%s: missing", what);
    if (!cJSON_IsNumber(node))
        return pt_error(PT_ERR_FORMAT, "%s: expected an integer, found a non-number", what);
    double d = node->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < -9007199254740991.0 || d > 9007199254740991.0)
        return pt_error(PT_ERR_FORMAT, "%s: expected an integer, found %.17g", what, d);
    int64_t v = (int64_t)d;
    if (v < lo || v > hi)
        return pt_error(PT_ERR_FORMAT, "%s: value %lld out of range [%lld, %lld]", what,
                        (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return PT_OK;
}

pt_status pt_json_get_i64(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          const char *what) {
    char name[512];
    snprintf(name, sizeof name, "%s: field \"%s\"", what, key);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(obj, key);
    return pt_json_to_i64(n, lo, hi, out, name);
}

pt_status pt_json_get_f64(const cJSON *obj, const char *key, double *out, const char *what) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!n || cJSON_IsNull(n)) return pt_error(PT_ERR_NOT_FOUND, "%s: field \"%s\" missing", what, key);
    if (!cJSON_IsNumber(n))
        return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected a number", what, key);
    *out = n->valuedouble;
    return PT_OK;
}

const char *pt_json_get_str(const cJSON *obj, const char *key) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(n) ? n->valuestring : NULL;
}

int pt_json_get_bool(const cJSON *obj, const char *key) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsTrue(n)) return 1;
    if (cJSON_IsFalse(n)) return 0;
    return -1;
}

long pt_utf8_invalid_offset(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return (long)i;
        }
        if (i + len > n) return (long)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return (long)i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return (long)i;
        i += len;
    }
    return -1;
}
