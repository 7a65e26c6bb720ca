/* A model directory's tokenizer: tokenizer.json plus the optional
 * tokenizer_config.json (bos/eos/pad/unk token strings or AddedToken dicts,
 * add_bos_token, add_eos_token) and generation_config.json (eos_token_id as
 * an int or a list — the authoritative stop set —, bos/pad ids), and the
 * accessors for the resolved special ids. Not chat templates. */
#include "tokenizer/tok_internal.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* A token given as "text" or {"content": "text", ...}; NULL if absent/null. */
static const char *token_string(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return pt_json_get_str(v, "content");
    return NULL;
}

static pt_status read_id(const pt_tokenizer *t, const cJSON *node, int32_t *out, const char *what) {
    int64_t v;
    PT_TRY(pt_json_to_i64(node, 0, (int64_t)t->vocab_size - 1, &v, what));
    *out = (int32_t)v;
    return PT_OK;
}

static pt_status load_tokenizer_config(pt_tokenizer *t, const char *path) {
    cJSON *cfg;
    PT_TRY(pt_json_load_file(path, 0, &cfg));
    pt_status st = PT_OK;
    if (!cJSON_IsObject(cfg)) st = pt_error(PT_ERR_FORMAT, "%s: expected a JSON object", path);
    const char *bos = st ? NULL : token_string(cfg, "bos_token");
    const char *eos = st ? NULL : token_string(cfg, "eos_token");
    const char *pad = st ? NULL : token_string(cfg, "pad_token");
    const char *unk = st ? NULL : token_string(cfg, "unk_token");
    if (bos) {
        t->bos_token = strdup(bos);
        t->bos_id = pt_tokenizer_piece_to_id(t, bos, strlen(bos));
    }
    if (eos) {
        t->eos_token = strdup(eos);
        t->eos_id = pt_tokenizer_piece_to_id(t, eos, strlen(eos));
    }
    if (pad) t->pad_id = pt_tokenizer_piece_to_id(t, pad, strlen(pad));
    if (unk) t->unk_id_cfg = pt_tokenizer_piece_to_id(t, unk, strlen(unk));
    if ((bos && !t->bos_token) || (eos && !t->eos_token)) st = pt_error(PT_ERR_NOMEM, "out of memory");
    if (!st) {
        t->add_bos = pt_json_get_bool(cfg, "add_bos_token");
        t->add_eos = pt_json_get_bool(cfg, "add_eos_token");
    }
    cJSON_Delete(cfg);
    return st;
}

static pt_status load_generation_config(pt_tokenizer *t, const char *path) {
    cJSON *cfg;
    PT_TRY(pt_json_load_file(path, 0, &cfg));
    pt_status st = PT_OK;
    char w[512];
    if (!cJSON_IsObject(cfg)) st = pt_error(PT_ERR_FORMAT, "%s: expected a JSON object", path);
    const cJSON *e = st ? NULL : cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
    if (e && cJSON_IsArray(e)) {
        size_t n = (size_t)cJSON_GetArraySize(e), i = 0;
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        if (!ids) st = pt_error(PT_ERR_NOMEM, "out of memory");
        for (const cJSON *x = e->child; !st && x; x = x->next, i++) {
            snprintf(w, sizeof w, "%s: eos_token_id[%zu]", path, i);
            st = read_id(t, x, &ids[i], w);
        }
        if (st) free(ids);
        else if (n) {
            free(t->eos_ids);
            t->eos_ids = ids;
            t->n_eos = n;
        } else free(ids);
    } else if (e && !cJSON_IsNull(e)) {
        int32_t id;
        snprintf(w, sizeof w, "%s: eos_token_id", path);
        st = read_id(t, e, &id, w);
        if (!st) {
            free(t->eos_ids);
            t->eos_ids = malloc(sizeof *t->eos_ids);
            if (!t->eos_ids) st = pt_error(PT_ERR_NOMEM, "out of memory");
            else {
                t->eos_ids[0] = id;
                t->n_eos = 1;
            }
        }
    }
    const char *keys[2] = {"bos_token_id", "pad_token_id"};
    int32_t *dst[2] = {&t->bos_id, &t->pad_id};
    for (int k = 0; !st && k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[k]);
        if (!v || cJSON_IsNull(v) || *dst[k] >= 0) continue; /* tokenizer_config wins */
        snprintf(w, sizeof w, "%s: %s", path, keys[k]);
        st = read_id(t, v, dst[k], w);
    }
    cJSON_Delete(cfg);
    return st;
}

pt_status pt_tokenizer_load_dir(const char *dir, pt_tokenizer **out) {
    *out = NULL;
    char *tj = pt_path_join(dir, "tokenizer.json");
    char *tc = pt_path_join(dir, "tokenizer_config.json");
    char *gc = pt_path_join(dir, "generation_config.json");
    pt_status st = PT_OK;
    pt_tokenizer *t = NULL;
    if (!tj || !tc || !gc) st = pt_error(PT_ERR_NOMEM, "out of memory");
    else if (!pt_is_file(tj)) st = pt_error(PT_ERR_NOT_FOUND, "%s: no tokenizer.json in the model directory", dir);
    if (!st) st = pt_tokenizer_load(tj, &t);
    if (!st && pt_is_file(tc)) st = load_tokenizer_config(t, tc);
    if (!st && t->eos_id >= 0) {
        t->eos_ids = malloc(sizeof *t->eos_ids);
        if (!t->eos_ids) st = pt_error(PT_ERR_NOMEM, "out of memory");
        else {
            t->eos_ids[0] = t->eos_id;
            t->n_eos = 1;
        }
    }
    if (!st && pt_is_file(gc)) st = load_generation_config(t, gc);
    if (!st && t->n_eos && t->eos_id < 0) t->eos_id = t->eos_ids[0];
    free(tj);
    free(tc);
    free(gc);
    if (st) {
        pt_tokenizer_free(&t);
        return st;
    }
    *out = t;
    return PT_OK;
}

int32_t pt_tokenizer_bos_id(const pt_tokenizer *t) { return t->bos_id; }
int32_t pt_tokenizer_eos_id(const pt_tokenizer *t) { return t->n_eos ? t->eos_ids[0] : t->eos_id; }
int32_t pt_tokenizer_pad_id(const pt_tokenizer *t) { return t->pad_id; }
int32_t pt_tokenizer_unk_id(const pt_tokenizer *t) { return t->unk_id_cfg; }
const char *pt_tokenizer_bos_token(const pt_tokenizer *t) { return t->bos_token; }
const char *pt_tokenizer_eos_token(const pt_tokenizer *t) { return t->eos_token; }
int pt_tokenizer_add_bos(const pt_tokenizer *t) { return t->add_bos; }
int pt_tokenizer_add_eos(const pt_tokenizer *t) { return t->add_eos; }
size_t pt_tokenizer_eos_ids(const pt_tokenizer *t, const int32_t **ids) {
    *ids = t->eos_ids;
    return t->n_eos;
}
int pt_tokenizer_is_eos(const pt_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return 1;
    return 0;
}
