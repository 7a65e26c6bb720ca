/* Chat templates: finding a model's template (explicit file,
 * chat_template.jinja, tokenizer_config.json's chat_template string or named
 * list, chat_template.json) and rendering conversations with the Jinja engine.
 * Not the engine itself (jinja*.c) and not tokenization. */
#include "tokenizer/chat_template.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"
#include "tokenizer/jinja.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct named {
    char *name;
    pt_jinja_template *tmpl;
} named;

struct pt_chat_template {
    named *list; /* [n]: one unnamed entry, or tokenizer_config.json's named templates */
    int n;
    char *bos, *eos;
};

void pt_chat_template_free(pt_chat_template **t) {
    if (!t || !*t) return;
    for (int i = 0; i < (*t)->n; i++) {
        free((*t)->list[i].name);
        pt_jinja_free(&(*t)->list[i].tmpl);
    }
    free((*t)->list);
    free((*t)->bos);
    free((*t)->eos);
    free(*t);
    *t = NULL;
}

static pt_status add(pt_chat_template *t, const char *name, const char *src, size_t len, const char *what) {
    named *l = realloc(t->list, (size_t)(t->n + 1) * sizeof *l);
    if (!l) return pt_error(PT_ERR_NOMEM, "out of memory");
    t->list = l;
    named *e = &t->list[t->n];
    e->name = name ? strdup(name) : NULL;
    e->tmpl = NULL;
    PT_TRY(pt_jinja_parse(src, len, what, &e->tmpl));
    t->n++;
    return PT_OK;
}

pt_status pt_chat_template_from_string(const char *src, size_t len, const char *name, pt_chat_template **out) {
    *out = NULL;
    pt_chat_template *t = calloc(1, sizeof *t);
    if (!t) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_status st = add(t, NULL, src, len, name ? name : "<template>");
    if (st != PT_OK) {
        pt_chat_template_free(&t);
        return st;
    }
    *out = t;
    return PT_OK;
}

pt_status pt_chat_template_from_file(const char *path, pt_chat_template **out) {
    *out = NULL;
    char *src;
    size_t len;
    PT_TRY(pt_read_file(path, &src, &len));
    pt_status st = pt_chat_template_from_string(src, len, path, out);
    free(src);
    return st;
}

/* A special token given as "text" or {"content": "text", ...}. */
static char *token_text(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

/* additional_chat_templates/NAME.jinja next to chat_template.jinja: more
 * named templates (transformers keeps chat_template.jinja as "default"). */
static pt_status add_extra_templates(pt_chat_template *t, const char *model_dir) {
    char *dir = pt_path_join(model_dir, "additional_chat_templates");
    if (!dir) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_status st = PT_OK;
    DIR *d = pt_is_dir(dir) ? opendir(dir) : NULL;
    if (d) {
        /* name the single template "default" first */
        if (t->n == 1 && !t->list[0].name) {
            t->list[0].name = strdup("default");
            if (!t->list[0].name) st = pt_error(PT_ERR_NOMEM, "out of memory");
        }
        struct dirent *e;
        while (st == PT_OK && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n <= 6 || strcmp(e->d_name + n - 6, ".jinja")) continue;
            char *path = pt_path_join(dir, e->d_name);
            char *src = NULL;
            size_t len = 0;
            if (!path) st = pt_error(PT_ERR_NOMEM, "out of memory");
            else if ((st = pt_read_file(path, &src, &len)) == PT_OK) {
                char name[256];
                snprintf(name, sizeof name, "%.*s", (int)(n - 6 < 255 ? n - 6 : 255), e->d_name);
                st = add(t, name, src, len, path);
            }
            free(src);
            free(path);
        }
        closedir(d);
    }
    free(dir);
    return st;
}

pt_status pt_chat_template_load(const char *model_dir, const char *override_path, pt_chat_template **out) {
    *out = NULL;
    char *cfg_path = pt_path_join(model_dir, "tokenizer_config.json");
    char *jinja_path = pt_path_join(model_dir, "chat_template.jinja");
    char *json_path = pt_path_join(model_dir, "chat_template.json");
    pt_status st = PT_OK;
    cJSON *cfg = NULL, *ctj = NULL;
    pt_chat_template *t = NULL;
    if (!cfg_path || !jinja_path || !json_path) {
        st = pt_error(PT_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (pt_is_file(cfg_path)) {
        st = pt_json_load_file(cfg_path, 0, &cfg);
        if (st != PT_OK) goto done;
    }
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    char what[4096];
    if (override_path) {
        st = pt_chat_template_from_file(override_path, &t);
    } else if (pt_is_file(jinja_path)) {
        /* transformers: chat_template.jinja overrides tokenizer_config.json's */
        st = pt_chat_template_from_file(jinja_path, &t);
        if (st == PT_OK) st = add_extra_templates(t, model_dir);
    } else if (cJSON_IsString(ct)) {
        snprintf(what, sizeof what, "%s:chat_template", cfg_path);
        st = pt_chat_template_from_string(ct->valuestring, strlen(ct->valuestring), what, &t);
    } else if (cJSON_IsArray(ct)) {
        t = calloc(1, sizeof *t);
        if (!t) {
            st = pt_error(PT_ERR_NOMEM, "out of memory");
            goto done;
        }
        int i = 0;
        for (const cJSON *e = ct->child; e; e = e->next, i++) {
            const char *name = pt_json_get_str(e, "name");
            const char *src = pt_json_get_str(e, "template");
            if (!name || !src) {
                st = pt_error(PT_ERR_FORMAT, "%s: chat_template[%d]: expected {\"name\": string, \"template\": string}",
                              cfg_path, i);
                goto done;
            }
            snprintf(what, sizeof what, "%s:chat_template[%s]", cfg_path, name);
            st = add(t, name, src, strlen(src), what);
            if (st != PT_OK) goto done;
        }
        if (t->n == 0) st = pt_error(PT_ERR_FORMAT, "%s: chat_template is an empty list", cfg_path);
    } else if (ct && !cJSON_IsNull(ct)) {
        st = pt_error(PT_ERR_FORMAT, "%s: chat_template: expected a string or a list of named templates", cfg_path);
    } else if (pt_is_file(json_path)) {
        /* a processor's chat_template.json: {"chat_template": "..."} */
        st = pt_json_load_file(json_path, 0, &ctj);
        const char *src = st == PT_OK ? pt_json_get_str(ctj, "chat_template") : NULL;
        if (st == PT_OK && !src)
            st = pt_error(PT_ERR_FORMAT, "%s: expected a \"chat_template\" string", json_path);
        if (st == PT_OK) {
            snprintf(what, sizeof what, "%s:chat_template", json_path);
            st = pt_chat_template_from_string(src, strlen(src), what, &t);
        }
    } else {
        st = pt_error(PT_ERR_NOT_FOUND,
                      "%s has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json, "
                      "no chat_template.json)",
                      model_dir);
    }
    if (st == PT_OK && cfg) {
        t->bos = token_text(cfg, "bos_token");
        t->eos = token_text(cfg, "eos_token");
    }
done:
    if (st != PT_OK) pt_chat_template_free(&t);
    *out = t;
    cJSON_Delete(cfg);
    cJSON_Delete(ctj);
    free(cfg_path);
    free(jinja_path);
    free(json_path);
    return st;
}

const char *pt_chat_template_bos(const pt_chat_template *t) { return t ? t->bos : NULL; }
const char *pt_chat_template_eos(const pt_chat_template *t) { return t ? t->eos : NULL; }

/* transformers' choice among named templates: "tool_use" when tools are
 * given and it exists, else "default". */
static pt_status pick(const pt_chat_template *t, int has_tools, const pt_jinja_template **out) {
    if (t->n == 1 && !t->list[0].name) {
        *out = t->list[0].tmpl;
        return PT_OK;
    }
    const pt_jinja_template *def = NULL, *tool = NULL;
    for (int i = 0; i < t->n; i++) {
        if (!strcmp(t->list[i].name, "default")) def = t->list[i].tmpl;
        if (!strcmp(t->list[i].name, "tool_use")) tool = t->list[i].tmpl;
    }
    if (has_tools && tool) *out = tool;
    else if (def) *out = def;
    else return pt_error(PT_ERR_FORMAT, "this model has multiple chat templates with no \"default\" template");
    return PT_OK;
}

pt_status pt_chat_template_render(const pt_chat_template *t, const cJSON *vars, const struct tm *now, char **out,
                                  size_t *out_len) {
    *out = NULL;
    if (!cJSON_IsObject(vars)) return pt_error(PT_ERR_INVALID_ARG, "chat template variables must be a JSON object");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(vars, "tools");
    const pt_jinja_template *tmpl;
    PT_TRY(pick(t, tools && !cJSON_IsNull(tools), &tmpl));
    pt_jinja_vars v = {.vars = vars, .now = now};
    return pt_jinja_render(tmpl, &v, out, out_len);
}

pt_status pt_chat_template_render_json(const pt_chat_template *t, const char *vars_json, size_t len,
                                       const struct tm *now, char **out, size_t *out_len) {
    *out = NULL;
    const pt_jinja_template *tmpl;
    if (t->n == 1 && !t->list[0].name) tmpl = t->list[0].tmpl;
    else {
        /* only the presence of non-null "tools" matters for the choice */
        cJSON *j = cJSON_ParseWithLength(vars_json, len);
        if (!j) return pt_error(PT_ERR_INVALID_ARG, "chat template variables: invalid JSON");
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
        pt_status st = pick(t, tools && !cJSON_IsNull(tools), &tmpl);
        cJSON_Delete(j);
        PT_TRY(st);
    }
    pt_jinja_vars v = {.vars_json = vars_json, .vars_json_len = len, .now = now};
    return pt_jinja_render(tmpl, &v, out, out_len);
}

/* Appends s as a JSON string literal. */
static int put_json_str(char **buf, size_t *n, size_t *cap, const char *s) {
    size_t need = *n + strlen(s) * 6 + 3;
    if (need > *cap) {
        size_t c = *cap * 2 > need ? *cap * 2 : need;
        char *nb = realloc(*buf, c);
        if (!nb) return -1;
        *buf = nb;
        *cap = c;
    }
    char *o = *buf + *n;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p < 0x20) o += sprintf(o, "\\u%04x", *p);
        else *o++ = (char)*p;
    }
    *o++ = '"';
    *n = (size_t)(o - *buf);
    return 0;
}

static int put_raw(char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n + len + 1 > *cap) {
        size_t c = *cap * 2 > *n + len + 1 ? *cap * 2 : *n + len + 1;
        char *nb = realloc(*buf, c);
        if (!nb) return -1;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *n, s, len);
    *n += len;
    return 0;
}

pt_status pt_chat_template_render_chat(const pt_chat_template *t, const char *messages_json,
                                       int add_generation_prompt, const char *extra_json,
                                       const char *bos_token, const char *eos_token,
                                       const struct tm *now, char **out, size_t *out_len) {
    *out = NULL;
    /* validate the pieces (cJSON), then splice their text into one object so
     * that the exact parser sees the caller's numbers as written:
     * {bos, eos, <extra members>, "messages": ..., "add_generation_prompt": ...}
     * — a later key wins, so extra overrides the tokens and the arguments win. */
    cJSON *m = messages_json ? cJSON_Parse(messages_json) : NULL;
    int ok = cJSON_IsArray(m);
    cJSON_Delete(m);
    if (!ok) return pt_error(PT_ERR_INVALID_ARG, "chat messages: expected a JSON array of {\"role\", \"content\"}");
    const char *inner = NULL;
    size_t inner_len = 0;
    if (extra_json) {
        cJSON *e = cJSON_Parse(extra_json);
        ok = cJSON_IsObject(e);
        cJSON_Delete(e);
        if (!ok) return pt_error(PT_ERR_INVALID_ARG, "chat variables: expected a JSON object");
        const char *b = strchr(extra_json, '{'), *end = strrchr(extra_json, '}');
        if (b && end && end > b) {
            inner = b + 1;
            inner_len = (size_t)(end - inner);
            while (inner_len && (inner[0] == ' ' || inner[0] == '\n' || inner[0] == '\t' || inner[0] == '\r'))
                inner++, inner_len--;
        }
    }
    if (!bos_token) bos_token = pt_chat_template_bos(t);
    if (!eos_token) eos_token = pt_chat_template_eos(t);
    size_t n = 0, cap = 256 + strlen(messages_json) + (extra_json ? strlen(extra_json) : 0);
    char *buf = malloc(cap);
    int rc = buf ? 0 : -1;
    const char *sep = "";
    if (!rc) rc = put_raw(&buf, &n, &cap, "{", 1);
    if (!rc && bos_token) {
        rc = put_raw(&buf, &n, &cap, "\"bos_token\": ", 13) || put_json_str(&buf, &n, &cap, bos_token);
        sep = ", ";
    }
    if (!rc && eos_token) {
        rc = put_raw(&buf, &n, &cap, sep, strlen(sep)) || put_raw(&buf, &n, &cap, "\"eos_token\": ", 13) ||
             put_json_str(&buf, &n, &cap, eos_token);
        sep = ", ";
    }
    if (!rc && inner_len) {
        rc = put_raw(&buf, &n, &cap, sep, strlen(sep)) || put_raw(&buf, &n, &cap, inner, inner_len);
        sep = ", ";
    }
    if (!rc) rc = put_raw(&buf, &n, &cap, sep, strlen(sep)) || put_raw(&buf, &n, &cap, "\"messages\": ", 12) ||
                  put_raw(&buf, &n, &cap, messages_json, strlen(messages_json));
    const char *agp = add_generation_prompt ? ", \"add_generation_prompt\": true}" : ", \"add_generation_prompt\": false}";
    if (!rc) rc = put_raw(&buf, &n, &cap, agp, strlen(agp));
    if (rc) {
        free(buf);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    pt_status st = pt_chat_template_render_json(t, buf, n, now, out, out_len);
    free(buf);
    return st;
}

pt_status pt_chat_template_parse_time(const char *text, struct tm *tm) {
    memset(tm, 0, sizeof *tm);
    int y, mo, d, h, mi, s;
    char tail;
    if (!text || sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &s, &tail) != 6 || mo < 1 ||
        mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60 || y < 1)
        return pt_error(PT_ERR_INVALID_ARG, "time '%s': expected YYYY-MM-DDTHH:MM:SS", text ? text : "(null)");
    tm->tm_year = y - 1900;
    tm->tm_mon = mo - 1;
    tm->tm_mday = d;
    tm->tm_hour = h;
    tm->tm_min = mi;
    tm->tm_sec = s;
    tm->tm_isdst = -1;
    /* fill tm_wday/tm_yday (for %a, %A, %j ...) without shifting the fields */
    struct tm copy = *tm;
    copy.tm_isdst = 0;
    time_t tt = timegm(&copy);
    struct tm norm;
    gmtime_r(&tt, &norm);
    if (norm.tm_mday != d || norm.tm_mon != mo - 1)
        return pt_error(PT_ERR_INVALID_ARG, "time '%s': no such date", text);
    tm->tm_wday = norm.tm_wday;
    tm->tm_yday = norm.tm_yday;
    tm->tm_isdst = 0;
    return PT_OK;
}
