/* config.json -> pt_config (see config.h). Defaults for absent optional
 * fields follow the transformers configuration classes of each family; the
 * structural sizes (vocab, hidden, layers, heads, MLP width) are required. */
#include "model/config.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const char *arch_names[PT_ARCH_COUNT] = {
    [PT_ARCH_UNKNOWN] = "unknown", [PT_ARCH_LLAMA] = "llama",     [PT_ARCH_QWEN2] = "qwen2",
    [PT_ARCH_QWEN3] = "qwen3",     [PT_ARCH_QWEN3_MOE] = "qwen3_moe", [PT_ARCH_GEMMA2] = "gemma2",
    [PT_ARCH_GEMMA3] = "gemma3",   [PT_ARCH_GEMMA4] = "gemma4",   [PT_ARCH_QWEN3_5] = "qwen3_5",
    [PT_ARCH_MINICPM] = "minicpm",
};

const char *pt_arch_name(pt_arch a) { return (unsigned)a < PT_ARCH_COUNT ? arch_names[a] : "?"; }

const char *pt_layer_kind_name(pt_layer_kind k) {
    switch (k) {
    case PT_LAYER_FULL: return "full_attention";
    case PT_LAYER_SLIDING: return "sliding_attention";
    case PT_LAYER_LINEAR: return "linear_attention";
    }
    return "?";
}

static const char *rope_names[PT_ROPE_COUNT] = {"default", "linear", "dynamic", "llama3",
                                                "yarn",    "longrope", "proportional"};
const char *pt_rope_type_name(pt_rope_type t) { return (unsigned)t < PT_ROPE_COUNT ? rope_names[t] : "?"; }

static const struct {
    const char *name;
    pt_arch arch;
} model_types[] = {
    {"llama", PT_ARCH_LLAMA},          {"qwen2", PT_ARCH_QWEN2},           {"qwen3", PT_ARCH_QWEN3},
    {"qwen3_moe", PT_ARCH_QWEN3_MOE},  {"gemma2", PT_ARCH_GEMMA2},         {"gemma3", PT_ARCH_GEMMA3},
    {"gemma3_text", PT_ARCH_GEMMA3},   {"gemma4", PT_ARCH_GEMMA4},         {"gemma4_text", PT_ARCH_GEMMA4},
    {"qwen3_5", PT_ARCH_QWEN3_5},      {"qwen3_5_text", PT_ARCH_QWEN3_5},  {"qwen3_5_moe", PT_ARCH_QWEN3_5},
    {"qwen3_5_moe_text", PT_ARCH_QWEN3_5}, {"minicpm", PT_ARCH_MINICPM},
};

int pt_quant_bits_valid(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
int pt_quant_group_valid(int g) { return g == 32 || g == 64 || g == 128; }

/* ------------------------------------------------------------------ */
/* Field readers. `what` is the file path; `obj` the object searched. A
 * present field of the wrong type or range is always an error. */

typedef struct {
    const char *what;    /* file */
    const cJSON *text;   /* text parameters */
    const cJSON *top;    /* top-level object (fallback for wrappers) */
    const char *family;  /* for "required for X" messages */
} rd;

static const cJSON *find(const rd *r, const char *key) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(r->text, key);
    if ((!n || cJSON_IsNull(n)) && r->top != r->text) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(r->top, key);
        if (m && !cJSON_IsNull(m)) n = m;
    }
    return n && !cJSON_IsNull(n) ? n : NULL;
}

static pt_status int_node(const rd *r, const char *key, const cJSON *n, int64_t lo, int64_t hi, int64_t *out) {
    char name[256];
    snprintf(name, sizeof name, "%s: field \"%s\"", r->what, key);
    return pt_json_to_i64(n, lo, hi, out, name);
}

static pt_status req_int(const rd *r, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *n = find(r, key);
    if (!n)
        return pt_error(PT_ERR_NOT_FOUND, "%s: missing field \"%s\" (required for model_type %s)", r->what, key,
                        r->family);
    return int_node(r, key, n, lo, hi, out);
}

static pt_status opt_int(const rd *r, const char *key, int64_t lo, int64_t hi, int64_t def, int64_t *out) {
    const cJSON *n = find(r, key);
    if (!n) {
        *out = def;
        return PT_OK;
    }
    return int_node(r, key, n, lo, hi, out);
}

static pt_status num_node(const char *what, const char *key, const cJSON *n, double *out) {
    if (!cJSON_IsNumber(n) || !isfinite(n->valuedouble))
        return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected a finite number", what, key);
    *out = n->valuedouble;
    return PT_OK;
}

static pt_status opt_f64(const rd *r, const char *key, double def, double *out) {
    const cJSON *n = find(r, key);
    if (!n) {
        *out = def;
        return PT_OK;
    }
    return num_node(r->what, key, n, out);
}

static pt_status opt_bool(const rd *r, const char *key, int def, int *out) {
    const cJSON *n = find(r, key);
    if (!n) {
        *out = def;
        return PT_OK;
    }
    if (!cJSON_IsBool(n)) return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected true or false", r->what, key);
    *out = cJSON_IsTrue(n);
    return PT_OK;
}

static pt_status opt_str(const rd *r, const char *key, char *buf, size_t n) {
    const cJSON *v = find(r, key);
    if (!v) return PT_OK;
    if (!cJSON_IsString(v)) return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected a string", r->what, key);
    snprintf(buf, n, "%s", v->valuestring);
    return PT_OK;
}

/* Token ids: an int, a list of ints, or null. */
static pt_status token_ids(const char *what, const char *key, const cJSON *n, int32_t *ids, int *count, int max) {
    *count = 0;
    if (!n || cJSON_IsNull(n)) return PT_OK;
    char name[256];
    snprintf(name, sizeof name, "%s: field \"%s\"", what, key);
    if (cJSON_IsArray(n)) {
        for (const cJSON *e = n->child; e; e = e->next) {
            int64_t v;
            if (cJSON_IsNull(e)) continue;
            PT_TRY(pt_json_to_i64(e, 0, INT32_MAX, &v, name));
            if (*count >= max) return pt_error(PT_ERR_FORMAT, "%s: more than %d token ids", name, max);
            ids[(*count)++] = (int32_t)v;
        }
        return PT_OK;
    }
    int64_t v;
    PT_TRY(pt_json_to_i64(n, 0, INT32_MAX, &v, name));
    ids[0] = (int32_t)v;
    *count = 1;
    return PT_OK;
}

static pt_status one_token_id(const char *what, const char *key, const cJSON *n, int32_t *out) {
    int32_t ids[PT_MAX_EOS];
    int c;
    *out = -1;
    PT_TRY(token_ids(what, key, n, ids, &c, PT_MAX_EOS));
    if (c) *out = ids[0];
    return PT_OK;
}

/* ------------------------------------------------------------------ */
/* RoPE. */

static void rope_init(pt_rope_config *r, double theta) {
    memset(r, 0, sizeof *r);
    r->type = PT_ROPE_DEFAULT;
    r->theta = theta;
    r->factor = 1.0;
    r->partial_rotary_factor = 1.0;
    r->low_freq_factor = 1.0;
    r->high_freq_factor = 4.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = 1;
}

static void rope_free(pt_rope_config *r) {
    free(r->short_factor);
    free(r->long_factor);
    r->short_factor = r->long_factor = NULL;
}

static pt_status rope_list(const char *what, const char *ctx, const char *key, const cJSON *o, double **out, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!a || cJSON_IsNull(a)) return PT_OK;
    if (!cJSON_IsArray(a)) return pt_error(PT_ERR_FORMAT, "%s: %s.%s: expected a list of numbers", what, ctx, key);
    int c = cJSON_GetArraySize(a);
    free(*out);
    *out = calloc((size_t)(c ? c : 1), sizeof **out);
    if (!*out) return pt_error(PT_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        char k[64];
        snprintf(k, sizeof k, "%s.%s[%d]", ctx, key, i);
        PT_TRY(num_node(what, k, e, &(*out)[i]));
    }
    *n = c;
    return PT_OK;
}

/* Reads one rope dict ({rope_type|type, rope_theta, factor, ...}) over *r. */
static pt_status rope_parse_obj(const char *what, const char *ctx, const cJSON *o, pt_rope_config *r) {
    if (!cJSON_IsObject(o)) return pt_error(PT_ERR_FORMAT, "%s: %s: expected an object", what, ctx);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!t || cJSON_IsNull(t)) t = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (t && !cJSON_IsNull(t)) {
        if (!cJSON_IsString(t)) return pt_error(PT_ERR_FORMAT, "%s: %s.rope_type: expected a string", what, ctx);
        const char *s = t->valuestring;
        int found = -1;
        for (int i = 0; i < PT_ROPE_COUNT; i++)
            if (!strcmp(s, rope_names[i])) found = i;
        if (!strcmp(s, "su")) found = PT_ROPE_LONGROPE;
        if (!strcmp(s, "mrope")) found = PT_ROPE_DEFAULT, r->mrope = 1;
        if (found < 0)
            return pt_error(PT_ERR_UNSUPPORTED,
                            "%s: %s.rope_type: unknown RoPE type '%s' (expected default, linear, dynamic, llama3, "
                            "yarn, longrope or proportional)",
                            what, ctx, s);
        r->type = (pt_rope_type)found;
    }
    static const struct {
        const char *key;
        size_t off;
    } dbl[] = {
        {"rope_theta", offsetof(pt_rope_config, theta)},
        {"factor", offsetof(pt_rope_config, factor)},
        {"partial_rotary_factor", offsetof(pt_rope_config, partial_rotary_factor)},
        {"low_freq_factor", offsetof(pt_rope_config, low_freq_factor)},
        {"high_freq_factor", offsetof(pt_rope_config, high_freq_factor)},
        {"attention_factor", offsetof(pt_rope_config, attention_factor)},
        {"beta_fast", offsetof(pt_rope_config, beta_fast)},
        {"beta_slow", offsetof(pt_rope_config, beta_slow)},
        {"mscale", offsetof(pt_rope_config, mscale)},
        {"mscale_all_dim", offsetof(pt_rope_config, mscale_all_dim)},
    };
    for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, dbl[i].key);
        if (!n || cJSON_IsNull(n)) continue;
        char k[96];
        snprintf(k, sizeof k, "%s.%s", ctx, dbl[i].key);
        PT_TRY(num_node(what, k, n, (double *)((char *)r + dbl[i].off)));
    }
    const cJSON *om = cJSON_GetObjectItemCaseSensitive(o, "original_max_position_embeddings");
    if (om && !cJSON_IsNull(om)) {
        char k[96];
        snprintf(k, sizeof k, "%s: %s.original_max_position_embeddings", what, ctx);
        PT_TRY(pt_json_to_i64(om, 1, INT32_MAX, &r->original_max_position_embeddings, k));
    }
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "truncate");
    if (cJSON_IsBool(tr)) r->truncate = cJSON_IsTrue(tr);
    if (cJSON_GetObjectItemCaseSensitive(o, "mrope_section")) r->mrope = 1;
    PT_TRY(rope_list(what, ctx, "short_factor", o, &r->short_factor, &r->n_short_factor));
    PT_TRY(rope_list(what, ctx, "long_factor", o, &r->long_factor, &r->n_long_factor));
    if (!(r->theta > 0)) return pt_error(PT_ERR_FORMAT, "%s: %s.rope_theta: expected > 0, found %g", what, ctx, r->theta);
    if (!(r->factor > 0)) return pt_error(PT_ERR_FORMAT, "%s: %s.factor: expected > 0, found %g", what, ctx, r->factor);
    if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
        return pt_error(PT_ERR_FORMAT, "%s: %s.partial_rotary_factor: expected in (0, 1], found %g", what, ctx,
                        r->partial_rotary_factor);
    if (r->type == PT_ROPE_LONGROPE && (!r->n_short_factor || !r->n_long_factor))
        return pt_error(PT_ERR_FORMAT, "%s: %s: longrope needs short_factor and long_factor lists", what, ctx);
    if (r->type == PT_ROPE_LLAMA3 && !r->original_max_position_embeddings)
        return pt_error(PT_ERR_NOT_FOUND, "%s: %s: llama3 RoPE needs original_max_position_embeddings", what, ctx);
    return PT_OK;
}

static pt_rope_config rope_copy(const pt_rope_config *r) {
    pt_rope_config c = *r;
    c.short_factor = c.long_factor = NULL;
    if (r->n_short_factor && (c.short_factor = malloc((size_t)r->n_short_factor * sizeof(double))))
        memcpy(c.short_factor, r->short_factor, (size_t)r->n_short_factor * sizeof(double));
    if (r->n_long_factor && (c.long_factor = malloc((size_t)r->n_long_factor * sizeof(double))))
        memcpy(c.long_factor, r->long_factor, (size_t)r->n_long_factor * sizeof(double));
    if ((r->n_short_factor && !c.short_factor) || (r->n_long_factor && !c.long_factor)) c.n_short_factor = c.n_long_factor = 0;
    return c;
}

static pt_status parse_rope(const rd *r, pt_config *c) {
    /* family defaults */
    double theta_full = 10000.0, theta_slide = 10000.0;
    if (c->arch == PT_ARCH_GEMMA3) theta_full = 1000000.0;
    if (c->arch == PT_ARCH_QWEN3_5) theta_full = theta_slide = 100000.0;
    PT_TRY(opt_f64(r, "rope_theta", theta_full, &theta_full));
    if (c->arch == PT_ARCH_GEMMA3) PT_TRY(opt_f64(r, "rope_local_base_freq", 10000.0, &theta_slide));
    else theta_slide = theta_full;
    rope_init(&c->rope[PT_LAYER_FULL], theta_full);
    rope_init(&c->rope[PT_LAYER_SLIDING], theta_slide);
    double prf = 1.0;
    if (c->arch == PT_ARCH_QWEN3_5) prf = 0.25;
    PT_TRY(opt_f64(r, "partial_rotary_factor", prf, &prf));
    c->rope[0].partial_rotary_factor = c->rope[1].partial_rotary_factor = prf;
    if (c->arch == PT_ARCH_GEMMA4) { /* HF defaults when rope_parameters is absent */
        c->rope[PT_LAYER_FULL].type = PT_ROPE_PROPORTIONAL;
        c->rope[PT_LAYER_FULL].partial_rotary_factor = 0.25;
        c->rope[PT_LAYER_FULL].theta = 1000000.0;
        c->rope[PT_LAYER_SLIDING].theta = 10000.0;
    }

    const cJSON *rp = find(r, "rope_parameters");
    const cJSON *rs = find(r, "rope_scaling");
    if (rp) {
        if (!cJSON_IsObject(rp)) return pt_error(PT_ERR_FORMAT, "%s: field \"rope_parameters\": expected an object", r->what);
        const cJSON *fa = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *sa = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (cJSON_IsObject(fa) || cJSON_IsObject(sa)) { /* per layer type */
            if (fa) PT_TRY(rope_parse_obj(r->what, "rope_parameters.full_attention", fa, &c->rope[PT_LAYER_FULL]));
            if (sa) PT_TRY(rope_parse_obj(r->what, "rope_parameters.sliding_attention", sa, &c->rope[PT_LAYER_SLIDING]));
        } else {
            PT_TRY(rope_parse_obj(r->what, "rope_parameters", rp, &c->rope[PT_LAYER_FULL]));
            rope_free(&c->rope[PT_LAYER_SLIDING]);
            if (c->arch == PT_ARCH_GEMMA3 || c->arch == PT_ARCH_GEMMA2) {
                /* one dict: sliding layers keep their local base, unscaled */
                double local = c->rope[PT_LAYER_SLIDING].theta;
                c->rope[PT_LAYER_SLIDING] = rope_copy(&c->rope[PT_LAYER_FULL]);
                if (c->arch == PT_ARCH_GEMMA3) {
                    rope_free(&c->rope[PT_LAYER_SLIDING]);
                    rope_init(&c->rope[PT_LAYER_SLIDING], local);
                }
            } else {
                c->rope[PT_LAYER_SLIDING] = rope_copy(&c->rope[PT_LAYER_FULL]);
            }
        }
    } else if (rs) {
        if (!cJSON_IsObject(rs)) return pt_error(PT_ERR_FORMAT, "%s: field \"rope_scaling\": expected an object", r->what);
        PT_TRY(rope_parse_obj(r->what, "rope_scaling", rs, &c->rope[PT_LAYER_FULL]));
        /* Gemma 3 applies rope_scaling to global layers only; other families to all */
        if (c->arch != PT_ARCH_GEMMA3) {
            double t = c->rope[PT_LAYER_SLIDING].theta;
            rope_free(&c->rope[PT_LAYER_SLIDING]);
            c->rope[PT_LAYER_SLIDING] = rope_copy(&c->rope[PT_LAYER_FULL]);
            c->rope[PT_LAYER_SLIDING].theta = t;
        }
    }
    return PT_OK;
}

/* ------------------------------------------------------------------ */
/* Quantization block. */

static pt_status parse_quant(const char *what, const cJSON *root, pt_quant_config *q) {
    memset(q, 0, sizeof *q);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    const char *key = "quantization";
    if (!o || cJSON_IsNull(o)) {
        o = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
        key = "quantization_config";
    }
    if (!o || cJSON_IsNull(o)) return PT_OK;
    if (!cJSON_IsObject(o)) return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected an object", what, key);
    const char *method = pt_json_get_str(o, "quant_method");
    if (method && strcmp(method, "mlx") && strcmp(method, "affine"))
        return pt_error(PT_ERR_UNSUPPORTED,
                        "%s: %s.quant_method '%s' is not supported (petrel reads MLX affine quantization)", what, key,
                        method);
    const char *mode = pt_json_get_str(o, "mode");
    if (mode && strcmp(mode, "affine"))
        return pt_error(PT_ERR_UNSUPPORTED, "%s: %s.mode '%s' is not supported (expected \"affine\")", what, key, mode);
    snprintf(q->mode, sizeof q->mode, "affine");
    char name[256];
    int64_t v;
    snprintf(name, sizeof name, "%s: %s.bits", what, key);
    PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(o, "bits"), 1, 64, &v, name));
    if (!pt_quant_bits_valid((int)v))
        return pt_error(PT_ERR_FORMAT, "%s: %s.bits: expected 2, 3, 4, 5, 6 or 8, found %lld", what, key, (long long)v);
    q->bits = (int)v;
    snprintf(name, sizeof name, "%s: %s.group_size", what, key);
    PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(o, "group_size"), 1, 4096, &v, name));
    if (!pt_quant_group_valid((int)v))
        return pt_error(PT_ERR_FORMAT, "%s: %s.group_size: expected 32, 64 or 128, found %lld", what, key,
                        (long long)v);
    q->group_size = (int)v;
    q->present = 1;
    int n = 0;
    for (const cJSON *e = o->child; e; e = e->next) n += cJSON_IsObject(e) || cJSON_IsBool(e);
    q->overrides = calloc((size_t)(n ? n : 1), sizeof *q->overrides);
    if (!q->overrides) return pt_error(PT_ERR_NOMEM, "out of memory");
    for (const cJSON *e = o->child; e; e = e->next) {
        if (!cJSON_IsObject(e) && !cJSON_IsBool(e)) continue; /* bits, group_size, mode, quant_method, ... */
        pt_quant_override *ov = &q->overrides[q->n_overrides];
        if (!(ov->path = strdup(e->string))) return pt_error(PT_ERR_NOMEM, "out of memory");
        q->n_overrides++;
        if (cJSON_IsBool(e)) {
            ov->quantized = cJSON_IsTrue(e);
            ov->bits = ov->quantized ? q->bits : 0;
            ov->group_size = ov->quantized ? q->group_size : 0;
            continue;
        }
        const char *m = pt_json_get_str(e, "mode");
        if (m && strcmp(m, "affine"))
            return pt_error(PT_ERR_UNSUPPORTED, "%s: %s[\"%s\"].mode '%s' is not supported (expected \"affine\")",
                            what, key, e->string, m);
        ov->quantized = 1;
        snprintf(name, sizeof name, "%s: %s[\"%s\"].bits", what, key, e->string);
        PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(e, "bits"), 1, 64, &v, name));
        if (!pt_quant_bits_valid((int)v))
            return pt_error(PT_ERR_FORMAT, "%s: expected 2, 3, 4, 5, 6 or 8, found %lld", name, (long long)v);
        ov->bits = (int)v;
        snprintf(name, sizeof name, "%s: %s[\"%s\"].group_size", what, key, e->string);
        PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(e, "group_size"), 1, 4096, &v, name));
        if (!pt_quant_group_valid((int)v))
            return pt_error(PT_ERR_FORMAT, "%s: expected 32, 64 or 128, found %lld", name, (long long)v);
        ov->group_size = (int)v;
    }
    return PT_OK;
}

int pt_quant_lookup(const pt_quant_config *q, const char *path, int *bits, int *group_size) {
    for (int i = 0; i < q->n_overrides; i++)
        if (!strcmp(q->overrides[i].path, path)) {
            *bits = q->overrides[i].quantized ? q->overrides[i].bits : 0;
            *group_size = q->overrides[i].quantized ? q->overrides[i].group_size : 0;
            return 1;
        }
    *bits = q->present ? q->bits : 0;
    *group_size = q->present ? q->group_size : 0;
    return 0;
}

/* ------------------------------------------------------------------ */

static pt_status parse_layer_types(const rd *r, pt_config *c) {
    int64_t L = c->n_layers;
    c->layer_types = calloc((size_t)L, sizeof *c->layer_types);
    if (!c->layer_types) return pt_error(PT_ERR_NOMEM, "out of memory");
    const cJSON *lt = find(r, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt))
            return pt_error(PT_ERR_FORMAT, "%s: field \"layer_types\": expected a list of strings", r->what);
        if (cJSON_GetArraySize(lt) != L)
            return pt_error(PT_ERR_FORMAT, "%s: field \"layer_types\": expected %lld entries (num_hidden_layers), found %d",
                            r->what, (long long)L, cJSON_GetArraySize(lt));
        int i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            const char *s = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(s, "full_attention")) c->layer_types[i] = PT_LAYER_FULL;
            else if (!strcmp(s, "sliding_attention")) c->layer_types[i] = PT_LAYER_SLIDING;
            else if (!strcmp(s, "linear_attention") && c->arch == PT_ARCH_QWEN3_5) c->layer_types[i] = PT_LAYER_LINEAR;
            else
                return pt_error(PT_ERR_FORMAT,
                                "%s: layer_types[%d]: expected \"full_attention\", \"sliding_attention\"%s, found %s%s%s",
                                r->what, i, c->arch == PT_ARCH_QWEN3_5 ? " or \"linear_attention\"" : "",
                                cJSON_IsString(e) ? "\"" : "a non-string", cJSON_IsString(e) ? s : "",
                                cJSON_IsString(e) ? "\"" : "");
        }
    } else {
        int64_t pattern = 0, mwl = 0;
        int use_sw = 0;
        for (int64_t i = 0; i < L; i++) c->layer_types[i] = PT_LAYER_FULL;
        switch (c->arch) {
        case PT_ARCH_GEMMA2:
            for (int64_t i = 0; i < L; i++) c->layer_types[i] = (i + 1) % 2 ? PT_LAYER_SLIDING : PT_LAYER_FULL;
            break;
        case PT_ARCH_GEMMA3:
        case PT_ARCH_GEMMA4:
            PT_TRY(opt_int(r, "sliding_window_pattern", 1, 1 << 20, 6, &pattern));
            for (int64_t i = 0; i < L; i++) c->layer_types[i] = (i + 1) % pattern ? PT_LAYER_SLIDING : PT_LAYER_FULL;
            if (c->arch == PT_ARCH_GEMMA4) c->layer_types[L - 1] = PT_LAYER_FULL;
            break;
        case PT_ARCH_QWEN3_5:
            for (int64_t i = 0; i < L; i++)
                c->layer_types[i] = (i + 1) % c->full_attention_interval ? PT_LAYER_LINEAR : PT_LAYER_FULL;
            break;
        case PT_ARCH_QWEN2:
            PT_TRY(opt_bool(r, "use_sliding_window", 0, &use_sw));
            PT_TRY(opt_int(r, "max_window_layers", 0, 1 << 20, L, &mwl));
            if (use_sw)
                for (int64_t i = mwl; i < L; i++) c->layer_types[i] = PT_LAYER_SLIDING;
            break;
        default: break;
        }
    }
    int any_sliding = 0;
    for (int64_t i = 0; i < L; i++) any_sliding |= c->layer_types[i] == PT_LAYER_SLIDING;
    if (any_sliding && c->sliding_window <= 0)
        return pt_error(PT_ERR_NOT_FOUND, "%s: layers use sliding attention but field \"sliding_window\" is missing",
                        r->what);
    return PT_OK;
}

static pt_status parse_body(pt_config *c, const char *what) {
    cJSON *root = c->json;
    const char *mt = pt_json_get_str(root, "model_type");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && !cJSON_IsNull(tc) && !cJSON_IsObject(tc))
        return pt_error(PT_ERR_FORMAT, "%s: field \"text_config\": expected an object", what);
    const char *tmt = cJSON_IsObject(tc) ? pt_json_get_str(tc, "model_type") : NULL;
    if (!mt && !tmt) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "model_type");
        if (n && !cJSON_IsNull(n)) return pt_error(PT_ERR_FORMAT, "%s: field \"model_type\": expected a string", what);
        return pt_error(PT_ERR_NOT_FOUND, "%s: missing field \"model_type\"", what);
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", mt ? mt : tmt);
    snprintf(c->text_model_type, sizeof c->text_model_type, "%s", tmt ? tmt : c->model_type);
    c->arch = PT_ARCH_UNKNOWN;
    for (size_t i = 0; i < sizeof model_types / sizeof model_types[0]; i++)
        if (!strcmp(c->model_type, model_types[i].name)) c->arch = model_types[i].arch;
    if (c->arch == PT_ARCH_UNKNOWN && tmt)
        for (size_t i = 0; i < sizeof model_types / sizeof model_types[0]; i++)
            if (!strcmp(tmt, model_types[i].name)) c->arch = model_types[i].arch;
    if (c->arch == PT_ARCH_UNKNOWN)
        return pt_error(PT_ERR_UNSUPPORTED,
                        "%s: unknown model_type '%s' (expected one of llama, qwen2, qwen3, qwen3_moe, gemma2, gemma3, "
                        "gemma3_text, gemma4, gemma4_text, qwen3_5, qwen3_5_text, qwen3_5_moe, minicpm)",
                        what, c->model_type);
    c->multimodal_wrapper = cJSON_IsObject(tc);
    c->text = cJSON_IsObject(tc) ? tc : root;
    rd r = {.what = what, .text = c->text, .top = root, .family = c->model_type};

    PT_TRY(req_int(&r, "vocab_size", 1, INT32_MAX, &c->vocab_size));
    PT_TRY(req_int(&r, "hidden_size", 1, 1 << 20, &c->hidden_size));
    PT_TRY(req_int(&r, "num_hidden_layers", 1, 4096, &c->n_layers));
    PT_TRY(req_int(&r, "num_attention_heads", 1, 4096, &c->n_heads));
    PT_TRY(opt_int(&r, "num_key_value_heads", 1, 4096, c->n_heads, &c->n_kv_heads));
    if (c->n_heads % c->n_kv_heads)
        return pt_error(PT_ERR_FORMAT, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", what,
                        (long long)c->n_heads, (long long)c->n_kv_heads);
    int64_t hd_default = c->hidden_size / c->n_heads;
    PT_TRY(opt_int(&r, "head_dim", 1, 1 << 16, hd_default, &c->head_dim));
    int need_ffn = !(c->arch == PT_ARCH_QWEN3_MOE || c->arch == PT_ARCH_QWEN3_5);
    if (need_ffn) PT_TRY(req_int(&r, "intermediate_size", 1, 1 << 24, &c->intermediate_size));
    else PT_TRY(opt_int(&r, "intermediate_size", 0, 1 << 24, 0, &c->intermediate_size));
    PT_TRY(opt_int(&r, "max_position_embeddings", 1, INT32_MAX, 0, &c->max_position_embeddings));
    PT_TRY(opt_f64(&r, "rms_norm_eps", 1e-6, &c->rms_norm_eps));
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
        return pt_error(PT_ERR_FORMAT, "%s: field \"rms_norm_eps\": expected in (0, 1), found %g", what, c->rms_norm_eps);
    int tie_default = c->arch == PT_ARCH_GEMMA2 || c->arch == PT_ARCH_GEMMA3 || c->arch == PT_ARCH_GEMMA4 ||
                      c->arch == PT_ARCH_MINICPM;
    PT_TRY(opt_bool(&r, "tie_word_embeddings", tie_default, &c->tie_word_embeddings));
    PT_TRY(opt_bool(&r, "attention_bias", c->arch == PT_ARCH_QWEN2, &c->attention_bias));
    PT_TRY(opt_bool(&r, "mlp_bias", 0, &c->mlp_bias));
    int gemma = c->arch == PT_ARCH_GEMMA2 || c->arch == PT_ARCH_GEMMA3 || c->arch == PT_ARCH_GEMMA4;
    snprintf(c->hidden_act, sizeof c->hidden_act, "%s", gemma ? "gelu_pytorch_tanh" : "silu");
    PT_TRY(opt_str(&r, "hidden_act", c->hidden_act, sizeof c->hidden_act));
    PT_TRY(opt_str(&r, "hidden_activation", c->hidden_act, sizeof c->hidden_act));
    PT_TRY(opt_str(&r, "torch_dtype", c->torch_dtype, sizeof c->torch_dtype));
    PT_TRY(opt_str(&r, "dtype", c->torch_dtype, sizeof c->torch_dtype));
    if (strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "gelu_pytorch_tanh") && strcmp(c->hidden_act, "gelu_tanh"))
        return pt_error(PT_ERR_UNSUPPORTED, "%s: hidden activation '%s' is not supported (expected silu or gelu_pytorch_tanh)",
                        what, c->hidden_act);
    PT_TRY(opt_int(&r, "sliding_window", 0, INT32_MAX, 0, &c->sliding_window));

    /* Gemma */
    double qpas_default = gemma && c->arch != PT_ARCH_GEMMA4 ? (double)c->head_dim : 0;
    PT_TRY(opt_f64(&r, "query_pre_attn_scalar", qpas_default, &c->query_pre_attn_scalar));
    PT_TRY(opt_f64(&r, "attn_logit_softcapping", 0, &c->attn_logit_softcapping));
    PT_TRY(opt_f64(&r, "final_logit_softcapping", 0, &c->final_logit_softcapping));
    if (c->arch == PT_ARCH_GEMMA4) {
        PT_TRY(opt_int(&r, "global_head_dim", 0, 1 << 16, 0, &c->global_head_dim));
        PT_TRY(opt_int(&r, "num_global_key_value_heads", 0, 4096, 0, &c->n_global_kv_heads));
        /* transformers 5 may save the full-attention sizes as
         * per_layer_config: {"full_attention": {"head_dim", "num_key_value_heads"}} */
        const cJSON *plc = find(&r, "per_layer_config");
        if (plc) {
            if (!cJSON_IsObject(plc))
                return pt_error(PT_ERR_FORMAT, "%s: field \"per_layer_config\": expected an object", what);
            const cJSON *fa = cJSON_GetObjectItemCaseSensitive(plc, "full_attention");
            if (!fa && cJSON_GetArraySize(plc) == 1) fa = plc->child;
            if (fa) {
                rd sub = {.what = what, .text = fa, .top = fa, .family = c->model_type};
                if (!cJSON_IsObject(fa))
                    return pt_error(PT_ERR_FORMAT, "%s: per_layer_config.%s: expected an object", what, fa->string);
                if (!c->global_head_dim) PT_TRY(opt_int(&sub, "head_dim", 0, 1 << 16, 0, &c->global_head_dim));
                if (!c->n_global_kv_heads)
                    PT_TRY(opt_int(&sub, "num_key_value_heads", 0, 4096, 0, &c->n_global_kv_heads));
            }
        }
        PT_TRY(opt_int(&r, "hidden_size_per_layer_input", 0, 1 << 16, 0, &c->hidden_size_per_layer_input));
        PT_TRY(opt_int(&r, "vocab_size_per_layer_input", 0, INT32_MAX, c->vocab_size, &c->vocab_size_per_layer_input));
        PT_TRY(opt_int(&r, "num_kv_shared_layers", 0, c->n_layers - 1, 0, &c->num_kv_shared_layers));
        PT_TRY(opt_bool(&r, "use_double_wide_mlp", 0, &c->use_double_wide_mlp));
        PT_TRY(opt_bool(&r, "attention_k_eq_v", 0, &c->attention_k_eq_v));
        PT_TRY(opt_bool(&r, "enable_moe_block", 0, &c->enable_moe_block));
        if (c->enable_moe_block) {
            PT_TRY(req_int(&r, "num_experts", 1, 1 << 16, &c->n_experts));
            PT_TRY(req_int(&r, "top_k_experts", 1, c->n_experts, &c->top_k_experts));
            PT_TRY(req_int(&r, "moe_intermediate_size", 1, 1 << 24, &c->moe_intermediate_size));
            c->n_experts_per_tok = c->top_k_experts;
            c->norm_topk_prob = 1;
        }
    }
    /* MoE */
    if (c->arch == PT_ARCH_QWEN3_MOE || c->arch == PT_ARCH_QWEN3_5) {
        int64_t ne = 0;
        PT_TRY(opt_int(&r, "num_experts", 0, 1 << 16, 0, &ne));
        if (!ne) PT_TRY(opt_int(&r, "num_local_experts", 0, 1 << 16, 0, &ne)); /* transformers 5 spelling */
        c->n_experts = ne;
        if (c->arch == PT_ARCH_QWEN3_MOE && ne == 0)
            return pt_error(PT_ERR_NOT_FOUND, "%s: missing field \"num_experts\" (required for model_type qwen3_moe)", what);
        if (ne > 0) {
            PT_TRY(req_int(&r, "num_experts_per_tok", 1, ne, &c->n_experts_per_tok));
            PT_TRY(req_int(&r, "moe_intermediate_size", 1, 1 << 24, &c->moe_intermediate_size));
            PT_TRY(opt_bool(&r, "norm_topk_prob", c->arch == PT_ARCH_QWEN3_5, &c->norm_topk_prob));
            PT_TRY(opt_int(&r, "decoder_sparse_step", 1, 4096, 1, &c->decoder_sparse_step));
            PT_TRY(opt_int(&r, "shared_expert_intermediate_size", 0, 1 << 24, 0, &c->shared_expert_intermediate_size));
            const cJSON *mol = find(&r, "mlp_only_layers");
            if (mol) {
                if (!cJSON_IsArray(mol))
                    return pt_error(PT_ERR_FORMAT, "%s: field \"mlp_only_layers\": expected a list of layer indices", what);
                int n = cJSON_GetArraySize(mol), i = 0;
                c->mlp_only_layers = calloc((size_t)(n ? n : 1), sizeof *c->mlp_only_layers);
                if (!c->mlp_only_layers) return pt_error(PT_ERR_NOMEM, "out of memory");
                for (const cJSON *e = mol->child; e; e = e->next, i++)
                    PT_TRY(int_node(&r, "mlp_only_layers[]", e, 0, c->n_layers - 1, &c->mlp_only_layers[i]));
                c->n_mlp_only_layers = n;
            }
        } else if (c->intermediate_size <= 0) {
            PT_TRY(req_int(&r, "intermediate_size", 1, 1 << 24, &c->intermediate_size));
        }
        if (c->arch == PT_ARCH_QWEN3_MOE) {
            int any_dense = c->n_mlp_only_layers > 0 || c->decoder_sparse_step > 1;
            if (any_dense && c->intermediate_size <= 0)
                PT_TRY(req_int(&r, "intermediate_size", 1, 1 << 24, &c->intermediate_size));
        }
    }
    /* Qwen3.5 */
    if (c->arch == PT_ARCH_QWEN3_5) {
        PT_TRY(req_int(&r, "linear_num_key_heads", 1, 4096, &c->linear_num_key_heads));
        PT_TRY(req_int(&r, "linear_num_value_heads", 1, 4096, &c->linear_num_value_heads));
        PT_TRY(req_int(&r, "linear_key_head_dim", 1, 1 << 16, &c->linear_key_head_dim));
        PT_TRY(req_int(&r, "linear_value_head_dim", 1, 1 << 16, &c->linear_value_head_dim));
        PT_TRY(opt_int(&r, "linear_conv_kernel_dim", 1, 64, 4, &c->linear_conv_kernel_dim));
        PT_TRY(opt_int(&r, "full_attention_interval", 1, 4096, 4, &c->full_attention_interval));
        PT_TRY(opt_bool(&r, "attn_output_gate", 1, &c->attn_output_gate));
        if (c->linear_num_value_heads % c->linear_num_key_heads)
            return pt_error(PT_ERR_FORMAT, "%s: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld",
                            what, (long long)c->linear_num_value_heads, (long long)c->linear_num_key_heads);
    }
    /* MiniCPM */
    if (c->arch == PT_ARCH_MINICPM) {
        PT_TRY(opt_f64(&r, "scale_emb", 1.0, &c->scale_emb));
        PT_TRY(opt_f64(&r, "scale_depth", sqrt((double)c->n_layers), &c->scale_depth));
        PT_TRY(opt_f64(&r, "dim_model_base", (double)c->hidden_size, &c->dim_model_base));
        if (!(c->dim_model_base > 0))
            return pt_error(PT_ERR_FORMAT, "%s: field \"dim_model_base\": expected > 0", what);
    }

    PT_TRY(parse_rope(&r, c));
    PT_TRY(parse_layer_types(&r, c));

    PT_TRY(one_token_id(what, "bos_token_id", find(&r, "bos_token_id"), &c->bos_token_id));
    PT_TRY(one_token_id(what, "pad_token_id", find(&r, "pad_token_id"), &c->pad_token_id));
    PT_TRY(token_ids(what, "eos_token_id", find(&r, "eos_token_id"), c->eos_token_id, &c->n_eos, PT_MAX_EOS));

    PT_TRY(parse_quant(what, root, &c->quant));
    return PT_OK;
}

pt_status pt_config_parse(const char *text, size_t len, const char *what, pt_config *out) {
    memset(out, 0, sizeof *out);
    out->bos_token_id = out->pad_token_id = -1;
    if (!(out->path = strdup(what ? what : "config.json"))) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_status s = pt_json_parse(text, len, out->path, 1, &out->json);
    if (!s && !cJSON_IsObject(out->json)) s = pt_error(PT_ERR_FORMAT, "%s: expected a JSON object", out->path);
    if (!s) s = parse_body(out, out->path);
    if (s) pt_config_free(out);
    return s;
}

pt_status pt_config_load(const char *path, pt_config *out) {
    char *buf;
    size_t len;
    memset(out, 0, sizeof *out);
    pt_status s = pt_read_file(path, &buf, &len);
    if (s) return s;
    s = pt_config_parse(buf, len, path, out);
    free(buf);
    return s;
}

void pt_config_free(pt_config *c) {
    if (!c) return;
    cJSON_Delete(c->json);
    free(c->layer_types);
    free(c->mlp_only_layers);
    rope_free(&c->rope[0]);
    rope_free(&c->rope[1]);
    for (int i = 0; i < c->quant.n_overrides; i++) free(c->quant.overrides[i].path);
    free(c->quant.overrides);
    free(c->path);
    memset(c, 0, sizeof *c);
}
