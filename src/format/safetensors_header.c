/* The safetensors header parser: the 8-byte length, then the JSON object
 * read by a small strict JSON reader of our own. It reads integers exactly as
 * uint64 with overflow checks, decodes string escapes, rejects duplicate
 * keys, and skips (but fully validates) values it does not interpret; it never
 * reads past the header bytes. Each tensor entry is checked (dtype, shape,
 * data_offsets inside the data section, no overlaps within the file) as it is
 * added to the builder. Not the set built from it (name lookup, duplicate
 * names across files, shards) nor the writer: safetensors.c. */
#include "format/safetensors_internal.h"

#include "base/error.h"
#include "base/json.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Strict JSON reader over [p, end). */

typedef struct {
    const char *p, *end, *start;
    const char *what; /* file path, for messages */
    pt_arena *arena;
} jr;

static pt_status jr_err(jr *r, const char *fmt, const char *detail) {
    return pt_error(PT_ERR_FORMAT, "%s: safetensors header, byte %ld: %s%s", r->what,
                    (long)(r->p - r->start), fmt, detail ? detail : "");
}

static void jr_ws(jr *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int jr_hex4(jr *r, unsigned *out) {
    if (r->end - r->p < 4) return 0;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(r->p[i]);
        if (h < 0) return 0;
        v = v * 16 + (unsigned)h;
    }
    r->p += 4;
    *out = v;
    return 1;
}

/* Parses a string; *out (arena, NUL-terminated, may be NULL to skip) and *len.
 * Strings containing NUL (\u0000) are rejected: names are C strings. */
static pt_status jr_string(jr *r, char **out, size_t *len) {
    jr_ws(r);
    if (r->p >= r->end || *r->p != '"') return jr_err(r, "expected a string", NULL);
    r->p++;
    /* first pass: find the end and validate; second pass: decode. The decoded
     * form is never longer than the raw form. */
    const char *s = r->p;
    size_t cap = 0;
    while (1) {
        if (r->p >= r->end) return jr_err(r, "unterminated string", NULL);
        unsigned char c = (unsigned char)*r->p;
        if (c == '"') break;
        if (c < 0x20) return jr_err(r, "control character in string", NULL);
        if (c == '\\') {
            r->p++;
            if (r->p >= r->end) return jr_err(r, "unterminated escape", NULL);
            if (*r->p == 'u') {
                r->p++;
                unsigned u;
                if (!jr_hex4(r, &u)) return jr_err(r, "bad \\u escape", NULL);
                continue;
            }
            if (!strchr("\"\\/bfnrt", *r->p)) return jr_err(r, "bad escape", NULL);
        }
        r->p++;
    }
    const char *e = r->p;
    r->p++; /* closing quote */
    cap = (size_t)(e - s);
    if (pt_utf8_invalid_offset(s, cap) >= 0) {
        r->p = s;
        return jr_err(r, "invalid UTF-8 in string", NULL);
    }
    char *buf = out ? pt_arena_alloc(r->arena, cap + 1) : NULL;
    if (out && !buf) return PT_ERR_NOMEM;
    size_t o = 0;
    for (const char *q = s; q < e;) {
        if (*q != '\\') {
            if (buf) buf[o] = *q;
            o++, q++;
            continue;
        }
        q++;
        char c = *q++;
        unsigned cp = 0;
        switch (c) {
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'u': {
            jr t = *r;
            t.p = q;
            t.end = e;
            jr_hex4(&t, &cp);
            q = t.p;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo = 0;
                t.p = q;
                if (e - q >= 6 && q[0] == '\\' && q[1] == 'u' && (t.p = q + 2, jr_hex4(&t, &lo)) &&
                    lo >= 0xDC00 && lo <= 0xDFFF) {
                    q = t.p;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else {
                    r->p = s;
                    return jr_err(r, "unpaired surrogate in string", NULL);
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                r->p = s;
                return jr_err(r, "unpaired surrogate in string", NULL);
            }
            break;
        }
        default: cp = (unsigned char)c; break; /* " \ / */
        }
        if (cp == 0) {
            r->p = s;
            return jr_err(r, "NUL character in string", NULL);
        }
        char enc[4];
        int n;
        if (cp < 0x80) enc[0] = (char)cp, n = 1;
        else if (cp < 0x800) enc[0] = (char)(0xC0 | (cp >> 6)), enc[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
        else if (cp < 0x10000)
            enc[0] = (char)(0xE0 | (cp >> 12)), enc[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
            enc[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
        else
            enc[0] = (char)(0xF0 | (cp >> 18)), enc[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
            enc[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), enc[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
        /* an escape is >= 2 raw bytes for 1-2 output bytes, 6 raw for 3, 12 raw for 4: fits */
        if (buf) memcpy(buf + o, enc, (size_t)n);
        o += (size_t)n;
    }
    if (buf) buf[o] = 0;
    if (out) *out = buf;
    if (len) *len = o;
    return PT_OK;
}

/* Parses a JSON integer exactly: optional '-', digits, no fraction/exponent.
 * A number with a fraction or exponent is reported as not an integer. */
static pt_status jr_int(jr *r, int *negative, uint64_t *out) {
    jr_ws(r);
    const char *s = r->p;
    *negative = 0;
    if (r->p < r->end && *r->p == '-') *negative = 1, r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') {
        r->p = s;
        return jr_err(r, "expected an integer", NULL);
    }
    if (*r->p == '0' && r->p + 1 < r->end && r->p[1] >= '0' && r->p[1] <= '9') {
        r->p = s;
        return jr_err(r, "leading zero in a number", NULL);
    }
    uint64_t v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        unsigned d = (unsigned)(*r->p - '0');
        if (v > (UINT64_MAX - d) / 10) {
            r->p = s;
            return jr_err(r, "integer does not fit in 64 bits", NULL);
        }
        v = v * 10 + d;
        r->p++;
    }
    if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E')) {
        r->p = s;
        return jr_err(r, "expected an integer, found a number with a fraction or exponent", NULL);
    }
    *out = v;
    return PT_OK;
}

static pt_status jr_skip_value(jr *r, int depth);

static pt_status jr_expect(jr *r, char c) {
    jr_ws(r);
    if (r->p >= r->end || *r->p != c) {
        char d[4] = {'\'', c, '\'', 0};
        return jr_err(r, "expected ", d);
    }
    r->p++;
    return PT_OK;
}

/* After a member/element: returns 1 when the container continues (','), 0 when it closes. */
static pt_status jr_next(jr *r, char close, int *more) {
    jr_ws(r);
    if (r->p < r->end && *r->p == ',') {
        r->p++;
        *more = 1;
        return PT_OK;
    }
    if (r->p < r->end && *r->p == close) {
        r->p++;
        *more = 0;
        return PT_OK;
    }
    return jr_err(r, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'", NULL);
}

static pt_status jr_skip_value(jr *r, int depth) {
    if (depth > 64) return jr_err(r, "nesting too deep", NULL);
    jr_ws(r);
    if (r->p >= r->end) return jr_err(r, "unexpected end of header", NULL);
    char c = *r->p;
    if (c == '"') return jr_string(r, NULL, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->p++;
        jr_ws(r);
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return PT_OK;
        }
        for (int more = 1; more;) {
            if (c == '{') {
                PT_TRY(jr_string(r, NULL, NULL));
                PT_TRY(jr_expect(r, ':'));
            }
            PT_TRY(jr_skip_value(r, depth + 1));
            PT_TRY(jr_next(r, close, &more));
        }
        return PT_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (c == '-') r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jr_err(r, "bad number", NULL);
        if (*r->p == '0') r->p++;
        else
            while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
        if (r->p < r->end && *r->p == '.') {
            r->p++;
            if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jr_err(r, "bad number", NULL);
            while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
        }
        if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
            r->p++;
            if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
            if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jr_err(r, "bad number", NULL);
            while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
        }
        return PT_OK;
    }
    static const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, lits[i], n)) {
            r->p += n;
            return PT_OK;
        }
    }
    return jr_err(r, "unexpected character", NULL);
}

/* ------------------------------------------------------------------ */
/* Tensor entries and the whole header. */

static int cmp_offset(const void *a, const void *b) {
    const pt_tensor *x = a, *y = b;
    if (x->file_index != y->file_index) return x->file_index < y->file_index ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* Parses one tensor entry's object. */
static pt_status parse_entry(jr *r, const char *name, pt_tensor *t) {
    int have_dtype = 0, have_shape = 0, have_off = 0;
    uint64_t off[2] = {0, 0};
    PT_TRY(jr_expect(r, '{'));
    jr_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
    } else {
        for (int more = 1; more;) {
            char *key;
            size_t klen;
            PT_TRY(jr_string(r, &key, &klen));
            PT_TRY(jr_expect(r, ':'));
            if (!strcmp(key, "dtype")) {
                if (have_dtype) return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': duplicate key 'dtype'", r->what, name);
                char *dn;
                size_t dl;
                PT_TRY(jr_string(r, &dn, &dl));
                int dt = pt_dtype_from_name(dn, dl);
                if (dt < 0)
                    return pt_error(PT_ERR_FORMAT,
                                    "%s: tensor '%s': unknown dtype '%s' (expected one of F32 F16 BF16 "
                                    "F8_E4M3 F8_E5M2 I8 U8 I16 U16 I32 U32 I64 U64 F64 BOOL)",
                                    r->what, name, dn);
                t->dtype = (pt_dtype)dt;
                have_dtype = 1;
            } else if (!strcmp(key, "shape")) {
                if (have_shape) return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': duplicate key 'shape'", r->what, name);
                PT_TRY(jr_expect(r, '['));
                jr_ws(r);
                t->ndim = 0;
                if (r->p < r->end && *r->p == ']') {
                    r->p++;
                } else {
                    for (int m = 1; m;) {
                        int neg;
                        uint64_t v;
                        pt_status s = jr_int(r, &neg, &v);
                        if (s) return pt_error_prefix(s, "%s: tensor '%s': shape", r->what, name);
                        if (neg && v)
                            return pt_error(PT_ERR_FORMAT,
                                            "%s: tensor '%s': negative dimension -%llu in shape "
                                            "(expected >= 0)", r->what, name, (unsigned long long)v);
                        if (v > (uint64_t)INT64_MAX)
                            return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': dimension %llu too large",
                                            r->what, name, (unsigned long long)v);
                        if (t->ndim >= PT_ST_MAX_DIMS)
                            return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': more than %d dimensions",
                                            r->what, name, PT_ST_MAX_DIMS);
                        t->shape[t->ndim++] = (int64_t)v;
                        PT_TRY(jr_next(r, ']', &m));
                    }
                }
                have_shape = 1;
            } else if (!strcmp(key, "data_offsets")) {
                if (have_off)
                    return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': duplicate key 'data_offsets'", r->what, name);
                PT_TRY(jr_expect(r, '['));
                for (int i = 0; i < 2; i++) {
                    int neg;
                    pt_status s = jr_int(r, &neg, &off[i]);
                    if (s) return pt_error_prefix(s, "%s: tensor '%s': data_offsets", r->what, name);
                    if (neg && off[i])
                        return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': negative data offset", r->what, name);
                    if (i == 0) PT_TRY(jr_expect(r, ','));
                }
                jr_ws(r);
                if (r->p < r->end && *r->p == ',')
                    return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': data_offsets has more than 2 values",
                                    r->what, name);
                PT_TRY(jr_expect(r, ']'));
                have_off = 1;
            } else {
                PT_TRY(jr_skip_value(r, 1)); /* unknown keys are ignored, as the reference does */
            }
            PT_TRY(jr_next(r, '}', &more));
        }
    }
    const char *missing = !have_dtype ? "dtype" : !have_shape ? "shape" : !have_off ? "data_offsets" : NULL;
    if (missing) return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': missing field '%s'", r->what, name, missing);
    if (off[0] > off[1])
        return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] have begin > end", r->what,
                        name, (unsigned long long)off[0], (unsigned long long)off[1]);
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (d && n > UINT64_MAX / d) {
            char sb[256];
            return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': shape %s overflows 64 bits", r->what, name,
                            pt_shape_str(t->shape, t->ndim, sb, sizeof sb));
        }
        n *= d;
    }
    uint64_t es = pt_dtype_size(t->dtype);
    if (n > UINT64_MAX / es || n > (uint64_t)INT64_MAX)
        return pt_error(PT_ERR_FORMAT, "%s: tensor '%s': byte size overflows 64 bits", r->what, name);
    t->n_elements = (int64_t)n;
    t->nbytes = n * es;
    if (off[1] - off[0] != t->nbytes) {
        char sb[256];
        return pt_error(PT_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, expected %llu "
                        "(%s × shape %s)",
                        r->what, name, (unsigned long long)off[0], (unsigned long long)off[1],
                        (unsigned long long)(off[1] - off[0]), (unsigned long long)t->nbytes,
                        pt_dtype_name(t->dtype), pt_shape_str(t->shape, t->ndim, sb, sizeof sb));
    }
    t->offset = off[0];
    return PT_OK;
}

/* Parses the header of one file image into the builder. */
pt_status st_parse_file(const unsigned char *buf, size_t size, const char *what, int file_index,
                        pt_arena *arena, builder *b) {
    if (size < 8)
        return pt_error(PT_ERR_FORMAT, "%s: file is %zu bytes, too short for a safetensors header "
                                       "(expected at least 8)", what, size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    if (hl > size - 8)
        return pt_error(PT_ERR_FORMAT,
                        "%s: header length %llu exceeds the file (%zu bytes after the 8-byte length): "
                        "truncated file or corrupt header length",
                        what, (unsigned long long)hl, size - 8);
    if (hl > PT_ST_MAX_HEADER)
        return pt_error(PT_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes", what,
                        (unsigned long long)hl, PT_ST_MAX_HEADER);
    if (hl < 2) return pt_error(PT_ERR_FORMAT, "%s: header length %llu is too short for a JSON object", what,
                                (unsigned long long)hl);
    uint64_t data_size = size - 8 - hl;
    const unsigned char *data = buf + 8 + hl;
    jr r = {.p = (const char *)buf + 8, .end = (const char *)buf + 8 + hl, .start = (const char *)buf + 8,
            .what = what, .arena = arena};
    if (*r.p != '{')
        return pt_error(PT_ERR_FORMAT, "%s: header does not start with '{' (found byte 0x%02x): not a "
                                       "safetensors file", what, (unsigned char)*r.p);
    r.p++;
    int first = b->n, seen_meta = 0;
    jr_ws(&r);
    if (r.p < r.end && *r.p == '}') {
        r.p++;
    } else {
        for (int more = 1; more;) {
            char *name;
            size_t nlen;
            PT_TRY(jr_string(&r, &name, &nlen));
            PT_TRY(jr_expect(&r, ':'));
            if (!strcmp(name, "__metadata__")) {
                if (seen_meta) return pt_error(PT_ERR_FORMAT, "%s: duplicate '__metadata__'", what);
                seen_meta = 1;
                PT_TRY(jr_expect(&r, '{'));
                jr_ws(&r);
                if (r.p < r.end && *r.p == '}') {
                    r.p++;
                } else {
                    for (int m = 1; m;) {
                        char *k, *v;
                        PT_TRY(jr_string(&r, &k, NULL));
                        PT_TRY(jr_expect(&r, ':'));
                        pt_status s = jr_string(&r, &v, NULL);
                        if (s) return pt_error_prefix(s, "%s: __metadata__ '%s' (values must be strings)", what, k);
                        PT_TRY(st_grow((void **)&b->meta, &b->cap_meta, b->n_meta + 1, sizeof *b->meta));
                        b->meta[b->n_meta++] = (pt_st_meta){k, v};
                        PT_TRY(jr_next(&r, '}', &m));
                    }
                }
            } else {
                PT_TRY(st_grow((void **)&b->v, &b->cap, b->n + 1, sizeof *b->v));
                pt_tensor *t = &b->v[b->n];
                memset(t, 0, sizeof *t);
                t->name = name;
                t->file_index = file_index;
                PT_TRY(parse_entry(&r, name, t));
                if (t->offset > data_size || t->nbytes > data_size - t->offset)
                    return pt_error(PT_ERR_FORMAT,
                                    "%s: tensor '%s': data_offsets [%llu, %llu] lie outside the data "
                                    "section (%llu bytes): truncated file or lying offsets",
                                    what, name, (unsigned long long)t->offset,
                                    (unsigned long long)(t->offset + t->nbytes), (unsigned long long)data_size);
                t->data = t->nbytes ? data + t->offset : NULL;
                b->n++;
            }
            PT_TRY(jr_next(&r, '}', &more));
        }
    }
    /* only padding may follow the object */
    jr_ws(&r);
    if (r.p != r.end)
        return pt_error(PT_ERR_FORMAT,
                        "%s: %ld unexpected bytes after the header's JSON object (header length %llu; "
                        "expected only space padding)",
                        what, (long)(r.end - r.p), (unsigned long long)hl);
    /* overlaps: sort this file's tensors by offset */
    qsort(b->v + first, (size_t)(b->n - first), sizeof *b->v, cmp_offset);
    for (int i = first + 1; i < b->n; i++) {
        const pt_tensor *a = &b->v[i - 1], *c = &b->v[i];
        if (c->nbytes && a->nbytes && c->offset < a->offset + a->nbytes)
            return pt_error(PT_ERR_FORMAT,
                            "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", what, a->name,
                            (unsigned long long)a->offset, (unsigned long long)(a->offset + a->nbytes), c->name,
                            (unsigned long long)c->offset, (unsigned long long)(c->offset + c->nbytes));
    }
    return PT_OK;
}
