/* Reader of petrel's golden files (see golden.h and tests/fixtures/README.md).
 * Validates everything it reads: magic, counts, names, dtypes, shapes, and
 * that every array lies inside the file with the byte size its shape implies
 * (64-bit arithmetic, overflow-checked).  Not a writer: the files come from
 * tools/oracle/goldfile.py. */
#include "golden.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_MAX_ARRAYS 100000

struct golden {
    unsigned char *buf; /* the whole file */
    size_t size;
    int n;
    golden_array *arr;
    char *names;   /* NUL-terminated names, back to back */
    float *floats; /* widened bf16 arrays, back to back */
};

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static size_t esize(int dtype) {
    switch (dtype) {
    case GOLDEN_F32: case GOLDEN_I32: case GOLDEN_U32: return 4;
    case GOLDEN_BF16: return 2;
    case GOLDEN_U8: return 1;
    default: return 0;
    }
}

void golden_close(golden *g) {
    if (!g) return;
    free(g->buf);
    free(g->arr);
    free(g->names);
    free(g->floats);
    free(g);
}

golden *golden_open(const char *path, char *err, size_t errlen) {
    golden *g = calloc(1, sizeof *g);
    FILE *f = NULL;
    if (!g) { set_err(err, errlen, "%s: out of memory", path); return NULL; }
    f = fopen(path, "rb");
    if (!f) { set_err(err, errlen, "%s: cannot open", path); goto fail; }
    if (fseek(f, 0, SEEK_END) != 0) { set_err(err, errlen, "%s: cannot seek", path); goto fail; }
    long sz = ftell(f);
    if (sz < 16) { set_err(err, errlen, "%s: %ld bytes, shorter than the 16-byte header", path, sz); goto fail; }
    rewind(f);
    g->size = (size_t)sz;
    g->buf = malloc(g->size);
    if (!g->buf) { set_err(err, errlen, "%s: out of memory (%zu bytes)", path, g->size); goto fail; }
    if (fread(g->buf, 1, g->size, f) != g->size) { set_err(err, errlen, "%s: short read", path); goto fail; }
    fclose(f);
    f = NULL;
    if (memcmp(g->buf, "PTGOLD1\0", 8) != 0) {
        set_err(err, errlen, "%s: bad magic (expected \"PTGOLD1\\0\")", path);
        goto fail;
    }
    uint32_t n = rd32(g->buf + 8);
    if (n > GOLDEN_MAX_ARRAYS) {
        set_err(err, errlen, "%s: %u arrays, more than the limit %d", path, n, GOLDEN_MAX_ARRAYS);
        goto fail;
    }
    g->n = (int)n;
    g->arr = calloc(n ? n : 1, sizeof *g->arr);
    g->names = malloc((size_t)n * 256 + 1);
    if (!g->arr || !g->names) { set_err(err, errlen, "%s: out of memory", path); goto fail; }
    size_t pos = 16, names_used = 0, n_floats = 0;
    for (uint32_t i = 0; i < n; i++) {
        golden_array *a = &g->arr[i];
        if (pos + 2 > g->size) { set_err(err, errlen, "%s: index record %u truncated", path, i); goto fail; }
        uint16_t ln = rd16(g->buf + pos);
        pos += 2;
        if (ln == 0 || ln > 255 || pos + ln + 2 > g->size) {
            set_err(err, errlen, "%s: index record %u: bad name length %u", path, i, ln);
            goto fail;
        }
        char *name = g->names + names_used;
        memcpy(name, g->buf + pos, ln);
        name[ln] = 0;
        if (strlen(name) != ln) { set_err(err, errlen, "%s: index record %u: NUL in name", path, i); goto fail; }
        names_used += (size_t)ln + 1;
        pos += ln;
        int dtype = g->buf[pos], ndim = g->buf[pos + 1];
        pos += 2;
        if (!esize(dtype)) { set_err(err, errlen, "%s: %s: unknown dtype code %d", path, name, dtype); goto fail; }
        if (ndim < 1 || ndim > 4) { set_err(err, errlen, "%s: %s: ndim %d, expected 1..4", path, name, ndim); goto fail; }
        if (pos + 4 * (size_t)ndim + 16 > g->size) {
            set_err(err, errlen, "%s: %s: index record truncated", path, name);
            goto fail;
        }
        uint64_t count = 1;
        for (int d = 0; d < ndim; d++) {
            uint32_t dim = rd32(g->buf + pos + 4 * (size_t)d);
            a->dims[d] = dim;
            if (dim && count > UINT64_MAX / dim) { set_err(err, errlen, "%s: %s: shape overflows", path, name); goto fail; }
            count *= dim;
        }
        pos += 4 * (size_t)ndim;
        uint64_t off = rd64(g->buf + pos), nbytes = rd64(g->buf + pos + 8);
        pos += 16;
        if (count > UINT64_MAX / esize(dtype) || nbytes != count * esize(dtype)) {
            set_err(err, errlen, "%s: %s: %llu bytes, expected %llu elements x %zu", path, name,
                    (unsigned long long)nbytes, (unsigned long long)count, esize(dtype));
            goto fail;
        }
        if (off > g->size || nbytes > g->size - off) {
            set_err(err, errlen, "%s: %s: data [%llu, +%llu) outside the file (%zu bytes)", path, name,
                    (unsigned long long)off, (unsigned long long)nbytes, g->size);
            goto fail;
        }
        if (off % 16) { set_err(err, errlen, "%s: %s: data offset %llu not 16-byte aligned", path, name,
                                (unsigned long long)off); goto fail; }
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(g->arr[j].name, name) == 0) {
                set_err(err, errlen, "%s: duplicate array name %s", path, name);
                goto fail;
            }
        a->name = name;
        a->dtype = (golden_dtype)dtype;
        a->ndim = ndim;
        a->count = (int64_t)count;
        a->data = g->buf + off;
        if (dtype == GOLDEN_BF16) n_floats += (size_t)count;
    }
    if (pos > g->size) { set_err(err, errlen, "%s: index runs past the end", path); goto fail; }
    g->floats = malloc((n_floats ? n_floats : 1) * sizeof(float));
    if (!g->floats) { set_err(err, errlen, "%s: out of memory", path); goto fail; }
    size_t fpos = 0;
    for (int i = 0; i < g->n; i++) {
        golden_array *a = &g->arr[i];
        if (a->dtype == GOLDEN_F32) {
            a->f32 = (const float *)a->data; /* offsets are 16-aligned in a malloc'd buffer */
        } else if (a->dtype == GOLDEN_BF16) {
            const unsigned char *p = a->data;
            for (int64_t k = 0; k < a->count; k++) g->floats[fpos + (size_t)k] = bf16_to_f32(rd16(p + 2 * k));
            a->f32 = g->floats + fpos;
            fpos += (size_t)a->count;
        }
    }
    return g;
fail:
    if (f) fclose(f);
    golden_close(g);
    return NULL;
}

golden *golden_open_fixture(const char *fixture, char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof path, "tests/fixtures/%s/golden.bin", fixture);
    return golden_open(path, err, errlen);
}

int golden_count(const golden *g) { return g ? g->n : 0; }

const golden_array *golden_at(const golden *g, int i) {
    return (g && i >= 0 && i < g->n) ? &g->arr[i] : NULL;
}

const golden_array *golden_find(const golden *g, const char *name) {
    if (!g || !name) return NULL;
    for (int i = 0; i < g->n; i++)
        if (strcmp(g->arr[i].name, name) == 0) return &g->arr[i];
    return NULL;
}

const golden_array *golden_get(const golden *g, const char *name, int want_float, golden_dtype dtype, int ndim) {
    const golden_array *a = golden_find(g, name);
    if (!a || a->ndim != ndim) return NULL;
    if (want_float) return a->f32 ? a : NULL;
    return a->dtype == dtype ? a : NULL;
}

int golden_int(const golden *g, const char *name, int fallback) {
    const golden_array *a = golden_get(g, name, 0, GOLDEN_I32, 1);
    if (!a || a->count != 1) return fallback;
    int32_t v;
    memcpy(&v, a->data, 4);
    return v;
}

int golden_n_prompts(const golden *g) { return golden_int(g, "meta.n_prompts", 0); }
int golden_hidden_prompt(const golden *g) { return golden_int(g, "meta.hidden_prompt", -1); }
int golden_n_qkv(const golden *g) { return golden_int(g, "meta.n_qkv", 0); }

static const char *refname(golden_ref ref) { return ref == GOLDEN_REF_BF16 ? "bf16" : "f32"; }

const int32_t *golden_prompt_ids(const golden *g, int p, int *n) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.ids", p);
    const golden_array *a = golden_get(g, name, 0, GOLDEN_I32, 1);
    if (n) *n = a ? (int)a->dims[0] : 0;
    return a ? (const int32_t *)a->data : NULL;
}

const float *golden_logits(const golden *g, int p, golden_ref ref, int *n_pos, int *vocab) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.logits.%s", p, refname(ref));
    const golden_array *a = golden_get(g, name, 1, GOLDEN_F32, 2);
    if (n_pos) *n_pos = a ? (int)a->dims[0] : 0;
    if (vocab) *vocab = a ? (int)a->dims[1] : 0;
    return a ? a->f32 : NULL;
}

static const float *vec_f(const golden *g, const char *name, int *n) {
    const golden_array *a = golden_get(g, name, 1, GOLDEN_F32, 1);
    if (n) *n = a ? (int)a->dims[0] : 0;
    return a ? a->f32 : NULL;
}

const float *golden_margins(const golden *g, int p, golden_ref ref, int *n_pos) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.margin.%s", p, refname(ref));
    return vec_f(g, name, n_pos);
}

const int32_t *golden_greedy(const golden *g, int p, golden_ref ref, int *n) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.greedy.%s", p, refname(ref));
    const golden_array *a = golden_get(g, name, 0, GOLDEN_I32, 1);
    if (n) *n = a ? (int)a->dims[0] : 0;
    return a ? (const int32_t *)a->data : NULL;
}

const float *golden_greedy_margins(const golden *g, int p, golden_ref ref, int *n) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.greedy_margin.%s", p, refname(ref));
    return vec_f(g, name, n);
}

const float *golden_hidden(const golden *g, int p, int layer, int *n_pos, int *hidden, int *n_entries) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.hidden.f32", p);
    const golden_array *a = golden_get(g, name, 1, GOLDEN_F32, 3);
    if (n_pos) *n_pos = 0;
    if (hidden) *hidden = 0;
    if (n_entries) *n_entries = a ? (int)a->dims[0] : 0;
    if (!a || layer < 0 || layer >= a->dims[0]) return NULL;
    if (n_pos) *n_pos = (int)a->dims[1];
    if (hidden) *hidden = (int)a->dims[2];
    return a->f32 + (size_t)layer * (size_t)(a->dims[1] * a->dims[2]);
}

int golden_qkv_get(const golden *g, int s, golden_qkv *out) {
    char name[64];
    memset(out, 0, sizeof *out);
    snprintf(name, sizeof name, "qkv.%d.params", s);
    const golden_array *pa = golden_get(g, name, 0, GOLDEN_I32, 1);
    snprintf(name, sizeof name, "qkv.%d.layer_bits", s);
    const golden_array *lb = golden_get(g, name, 0, GOLDEN_I32, 1);
    snprintf(name, sizeof name, "qkv.%d.prompt_logits", s);
    const golden_array *pl = golden_get(g, name, 1, GOLDEN_F32, 2);
    snprintf(name, sizeof name, "qkv.%d.greedy", s);
    const golden_array *gr = golden_get(g, name, 0, GOLDEN_I32, 1);
    snprintf(name, sizeof name, "qkv.%d.step_logits", s);
    const golden_array *st = golden_get(g, name, 1, GOLDEN_F32, 2);
    if (!pa || pa->count != 4 || !lb || !pl || !gr || !st) return -1;
    if (st->dims[1] != pl->dims[1] || st->dims[0] + 1 != gr->dims[0]) return -1;
    const int32_t *p = pa->data;
    out->kv_bits = p[0];
    out->group_size = p[1];
    out->prefill_chunk = p[2];
    out->quantized_kv_start = p[3];
    out->layer_bits = lb->data;
    out->n_layers = (int)lb->dims[0];
    out->prompt_logits = pl->f32;
    out->n_prompt = (int)pl->dims[0];
    out->vocab = (int)pl->dims[1];
    out->greedy = gr->data;
    out->n_greedy = (int)gr->dims[0];
    out->step_logits = st->f32;
    return 0;
}

int golden_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}
