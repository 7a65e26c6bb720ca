/* The optional files of a model directory: generation_config.json,
 * tokenizer_config.json (+ chat_template.jinja), kv_config.json, and
 * pt_model_dir_load which reads them all next to config.json (see config.h).
 * Unrelated files in the directory are ignored. */
#include "model/config.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* generation_config.json */

static pt_status ids_field(const char *what, const cJSON *o, const char *key, int32_t *ids, int *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *n = 0;
    if (!v || cJSON_IsNull(v)) return PT_OK;
    char name[256];
    snprintf(name, sizeof name, "%s: field \"%s\"", what, key);
    if (cJSON_IsArray(v)) {
        for (const cJSON *e = v->child; e; e = e->next) {
            int64_t x;
            if (cJSON_IsNull(e)) continue;
            PT_TRY(pt_json_to_i64(e, 0, INT32_MAX, &x, name));
            if (*n >= PT_MAX_EOS) return pt_error(PT_ERR_FORMAT, "%s: more than %d token ids", name, PT_MAX_EOS);
            ids[(*n)++] = (int32_t)x;
        }
        return PT_OK;
    }
    int64_t x;
    PT_TRY(pt_json_to_i64(v, 0, INT32_MAX, &x, name));
    ids[(*n)++] = (int32_t)x;
    return PT_OK;
}

static pt_status num_field(const char *what, const cJSON *o, const char *key, int *has, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *has = 0;
    if (!v || cJSON_IsNull(v)) return PT_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected a number", what, key);
    *out = v->valuedouble;
    *has = 1;
    return PT_OK;
}

pt_status pt_generation_config_parse(const char *text, size_t len, const char *what, pt_generation_config *g) {
    memset(g, 0, sizeof *g);
    g->bos_token_id = g->pad_token_id = -1;
    g->do_sample = -1;
    cJSON *root;
    PT_TRY(pt_json_parse(text, len, what, 1, &root));
    pt_status s = PT_OK;
    int32_t one[PT_MAX_EOS];
    int n;
    if (!cJSON_IsObject(root)) {
        s = pt_error(PT_ERR_FORMAT, "%s: expected a JSON object", what);
        goto done;
    }
    if ((s = ids_field(what, root, "eos_token_id", g->eos_token_id, &g->n_eos))) goto done;
    if ((s = ids_field(what, root, "bos_token_id", one, &n))) goto done;
    if (n) g->bos_token_id = one[0];
    if ((s = ids_field(what, root, "pad_token_id", one, &n))) goto done;
    if (n) g->pad_token_id = one[0];
    if ((s = num_field(what, root, "temperature", &g->has_temperature, &g->temperature))) goto done;
    if ((s = num_field(what, root, "top_p", &g->has_top_p, &g->top_p))) goto done;
    if ((s = num_field(what, root, "min_p", &g->has_min_p, &g->min_p))) goto done;
    if ((s = num_field(what, root, "repetition_penalty", &g->has_repetition_penalty, &g->repetition_penalty)))
        goto done;
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (tk && !cJSON_IsNull(tk)) {
        char name[256];
        snprintf(name, sizeof name, "%s: field \"top_k\"", what);
        if ((s = pt_json_to_i64(tk, 0, INT32_MAX, &g->top_k, name))) goto done;
        g->has_top_k = 1;
    }
    char name[256];
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_new_tokens")) && !cJSON_IsNull(v)) {
        snprintf(name, sizeof name, "%s: field \"max_new_tokens\"", what);
        if ((s = pt_json_to_i64(v, 0, INT64_C(1) << 40, &g->max_new_tokens, name))) goto done;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_length")) && !cJSON_IsNull(v)) {
        snprintf(name, sizeof name, "%s: field \"max_length\"", what);
        if ((s = pt_json_to_i64(v, 0, INT64_C(1) << 40, &g->max_length, name))) goto done;
    }
    g->do_sample = pt_json_get_bool(root, "do_sample");
    g->present = 1;
done:
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------------------ */
/* tokenizer_config.json */

/* A special token: a string, an AddedToken dict {"content": ...}, or null. */
static pt_status token_str(const char *what, const cJSON *o, const char *key, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return PT_OK;
    const char *s = NULL;
    if (cJSON_IsString(v)) s = v->valuestring;
    else if (cJSON_IsObject(v)) s = pt_json_get_str(v, "content");
    if (!s)
        return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected a string or an object with \"content\"", what, key);
    if (!(*out = strdup(s))) return pt_error(PT_ERR_NOMEM, "out of memory");
    return PT_OK;
}

static pt_status bool_field(const char *what, const cJSON *o, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = -1;
    if (!v || cJSON_IsNull(v)) return PT_OK;
    if (!cJSON_IsBool(v)) return pt_error(PT_ERR_FORMAT, "%s: field \"%s\": expected true or false", what, key);
    *out = cJSON_IsTrue(v);
    return PT_OK;
}

pt_status pt_tokenizer_config_parse(const char *text, size_t len, const char *what, pt_tokenizer_config *t) {
    memset(t, 0, sizeof *t);
    t->add_bos_token = t->add_eos_token = -1;
    cJSON *root;
    PT_TRY(pt_json_parse(text, len, what, 0, &root));
    pt_status s = PT_OK;
    if (!cJSON_IsObject(root)) {
        s = pt_error(PT_ERR_FORMAT, "%s: expected a JSON object", what);
        goto done;
    }
    if ((s = token_str(what, root, "bos_token", &t->bos_token))) goto done;
    if ((s = token_str(what, root, "eos_token", &t->eos_token))) goto done;
    if ((s = token_str(what, root, "pad_token", &t->pad_token))) goto done;
    if ((s = token_str(what, root, "unk_token", &t->unk_token))) goto done;
    if ((s = bool_field(what, root, "add_bos_token", &t->add_bos_token))) goto done;
    if ((s = bool_field(what, root, "add_eos_token", &t->add_eos_token))) goto done;
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(root, "model_max_length");
    /* transformers writes 1e30 for "unbounded"; keep only sane integers */
    if (cJSON_IsNumber(ml) && ml->valuedouble >= 1 && ml->valuedouble < 1e15 && ml->valuedouble == floor(ml->valuedouble))
        t->model_max_length = (int64_t)ml->valuedouble;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (ct && !cJSON_IsNull(ct)) {
        const char *tpl = NULL;
        if (cJSON_IsString(ct)) {
            tpl = ct->valuestring;
        } else if (cJSON_IsArray(ct)) { /* [{"name": ..., "template": ...}]: take "default" */
            for (const cJSON *e = ct->child; e; e = e->next) {
                const char *nm = pt_json_get_str(e, "name"), *tp = pt_json_get_str(e, "template");
                if (!nm || !tp) {
                    s = pt_error(PT_ERR_FORMAT, "%s: chat_template list entries need \"name\" and \"template\" strings",
                                 what);
                    goto done;
                }
                if (!strcmp(nm, "default")) tpl = tp;
            }
        } else {
            s = pt_error(PT_ERR_FORMAT, "%s: field \"chat_template\": expected a string or a list of named templates",
                         what);
            goto done;
        }
        if (tpl) {
            t->chat_template = strdup(tpl);
            t->chat_template_source = strdup(what);
            if (!t->chat_template || !t->chat_template_source) s = pt_error(PT_ERR_NOMEM, "out of memory");
        }
    }
    t->present = 1;
done:
    cJSON_Delete(root);
    if (s) pt_tokenizer_config_free(t);
    return s;
}

void pt_tokenizer_config_free(pt_tokenizer_config *t) {
    if (!t) return;
    free(t->bos_token);
    free(t->eos_token);
    free(t->pad_token);
    free(t->unk_token);
    free(t->chat_template);
    free(t->chat_template_source);
    memset(t, 0, sizeof *t);
    t->add_bos_token = t->add_eos_token = -1;
}

/* ------------------------------------------------------------------ */
/* kv_config.json */

pt_status pt_kv_config_parse(const char *text, size_t len, const char *what, pt_kv_config *k) {
    memset(k, 0, sizeof *k);
    cJSON *root;
    PT_TRY(pt_json_parse(text, len, what, 1, &root));
    pt_status s = PT_OK;
    if (!cJSON_IsArray(root)) {
        s = pt_error(PT_ERR_FORMAT, "%s: expected a JSON array of {\"layer_idx\", \"bits\", \"group_size\"} objects",
                     what);
        goto done;
    }
    int n = cJSON_GetArraySize(root), i = 0;
    k->entries = calloc((size_t)(n ? n : 1), sizeof *k->entries);
    if (!k->entries) {
        s = pt_error(PT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (const cJSON *e = root->child; e; e = e->next, i++) {
        char ctx[256];
        snprintf(ctx, sizeof ctx, "%s: entry %d", what, i);
        if (!cJSON_IsObject(e)) {
            s = pt_error(PT_ERR_FORMAT, "%s: expected an object", ctx);
            goto done;
        }
        int64_t li, b, g;
        if ((s = pt_json_get_i64(e, "layer_idx", 0, 1 << 20, &li, ctx))) goto done;
        if ((s = pt_json_get_i64(e, "bits", 1, 64, &b, ctx))) goto done;
        if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8) {
            s = pt_error(PT_ERR_FORMAT, "%s: field \"bits\": expected 2, 3, 4, 5, 6 or 8, found %lld", ctx, (long long)b);
            goto done;
        }
        if ((s = pt_json_get_i64(e, "group_size", 1, 4096, &g, ctx))) goto done;
        if (g != 32 && g != 64 && g != 128) {
            s = pt_error(PT_ERR_FORMAT, "%s: field \"group_size\": expected 32, 64 or 128, found %lld", ctx,
                         (long long)g);
            goto done;
        }
        for (int j = 0; j < i; j++)
            if (k->entries[j].layer_idx == li) {
                s = pt_error(PT_ERR_FORMAT, "%s: layer_idx %lld listed twice", ctx, (long long)li);
                goto done;
            }
        k->entries[i] = (pt_kv_entry){(int)li, (int)b, (int)g};
        k->n = i + 1;
    }
    k->present = 1;
done:
    cJSON_Delete(root);
    if (s) pt_kv_config_free(k);
    return s;
}

void pt_kv_config_free(pt_kv_config *k) {
    if (!k) return;
    free(k->entries);
    memset(k, 0, sizeof *k);
}

/* ------------------------------------------------------------------ */

typedef pt_status (*parse_fn)(const char *, size_t, const char *, void *);

static pt_status load_optional(const char *dir, const char *name, parse_fn fn, void *out) {
    char *p = pt_path_join(dir, name);
    if (!p) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_status s = PT_OK;
    if (pt_is_file(p)) {
        char *buf;
        size_t len;
        s = pt_read_file(p, &buf, &len);
        if (!s) {
            s = fn(buf, len, p, out);
            free(buf);
        }
    }
    free(p);
    return s;
}

static pt_status gen_fn(const char *t, size_t l, const char *w, void *o) { return pt_generation_config_parse(t, l, w, o); }
static pt_status tok_fn(const char *t, size_t l, const char *w, void *o) { return pt_tokenizer_config_parse(t, l, w, o); }
static pt_status kv_fn(const char *t, size_t l, const char *w, void *o) { return pt_kv_config_parse(t, l, w, o); }

pt_status pt_model_dir_load(const char *dir, pt_model_dir *m) {
    memset(m, 0, sizeof *m);
    m->generation.bos_token_id = m->generation.pad_token_id = -1;
    m->generation.do_sample = -1;
    m->tokenizer.add_bos_token = m->tokenizer.add_eos_token = -1;
    if (!pt_is_dir(dir)) return pt_error(PT_ERR_NOT_FOUND, "%s: not a directory", dir);
    if (!(m->dir = strdup(dir))) return pt_error(PT_ERR_NOMEM, "out of memory");
    char *cfg = pt_path_join(dir, "config.json");
    pt_status s = PT_OK;
    if (!cfg) s = pt_error(PT_ERR_NOMEM, "out of memory");
    else if (!pt_is_file(cfg)) s = pt_error(PT_ERR_NOT_FOUND, "%s: missing config.json", dir);
    else s = pt_config_load(cfg, &m->config);
    free(cfg);
    if (!s) s = load_optional(dir, "generation_config.json", gen_fn, &m->generation);
    if (!s) s = load_optional(dir, "tokenizer_config.json", tok_fn, &m->tokenizer);
    if (!s) s = load_optional(dir, "kv_config.json", kv_fn, &m->kv);
    if (!s && !m->tokenizer.chat_template) { /* newer repos keep the template in its own file */
        char *p = pt_path_join(dir, "chat_template.jinja");
        if (p && pt_is_file(p)) {
            size_t len;
            s = pt_read_file(p, &m->tokenizer.chat_template, &len);
            if (!s && !(m->tokenizer.chat_template_source = strdup(p))) s = pt_error(PT_ERR_NOMEM, "out of memory");
        }
        free(p);
    }
    for (int i = 0; !s && i < m->kv.n; i++)
        if (m->kv.entries[i].layer_idx >= m->config.n_layers)
            s = pt_error(PT_ERR_FORMAT, "%s/kv_config.json: entry %d: layer_idx %d out of range (the model has %lld layers)",
                         dir, i, m->kv.entries[i].layer_idx, (long long)m->config.n_layers);
    if (!s) {
        char *p = pt_path_join(dir, "tokenizer.json");
        m->has_tokenizer_json = p && pt_is_file(p);
        free(p);
    }
    if (s) pt_model_dir_free(m);
    return s;
}

void pt_model_dir_free(pt_model_dir *m) {
    if (!m) return;
    free(m->dir);
    pt_config_free(&m->config);
    pt_tokenizer_config_free(&m->tokenizer);
    pt_kv_config_free(&m->kv);
    memset(m, 0, sizeof *m);
}
