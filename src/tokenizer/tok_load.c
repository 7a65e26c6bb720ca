/* tokenizer.json -> pt_tokenizer: the BPE model (vocabulary into a hash map,
 * merges in "a b" or ["a","b"] form into a pair map), normalizers,
 * pre-tokenizers, post-processor, decoders and added tokens. Every field is
 * checked; errors name the JSON path and what was expected. Not the encoding
 * itself (tok_encode.c) nor the model-directory config files (tok_config.c). */
#include "tokenizer/tok_internal.h"

#include "base/error.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pre-tokenization regex (ByteLevel with use_regex). */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static char *xstrdup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* bool member with a default; a present non-bool is an error. */
static pt_status get_bool(const cJSON *o, const char *key, bool dflt, bool *out, const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return PT_OK; }
    if (!cJSON_IsBool(v)) return pt_error(PT_ERR_FORMAT, "%s.%s: expected true or false", what, key);
    *out = cJSON_IsTrue(v);
    return PT_OK;
}

static pt_status get_string(const cJSON *o, const char *key, const char **out, const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v))
        return pt_error(PT_ERR_FORMAT, "%s.%s: expected a string%s", what, key, v ? "" : " (missing)");
    /* Strings inserted into text must be valid UTF-8: regexes later match
     * that text without re-checking it. */
    if (pt_utf8_invalid_offset(v->valuestring, strlen(v->valuestring)) >= 0)
        return pt_error(PT_ERR_FORMAT, "%s.%s: not valid UTF-8", what, key);
    *out = v->valuestring;
    return PT_OK;
}

/* A single code point string (Metaspace replacement, Strip content). */
static pt_status get_char(const cJSON *o, const char *key, uint32_t *cp, const char *what) {
    const char *s = "";
    PT_TRY(get_string(o, key, &s, what));
    size_t n = strlen(s);
    if (n == 0 || pt_utf8_invalid_offset(s, n) >= 0)
        return pt_error(PT_ERR_FORMAT, "%s.%s: expected one character, found \"%s\"", what, key, s);
    int adv;
    *cp = tok_utf8_next((const unsigned char *)s, n, &adv);
    if ((size_t)adv != n)
        return pt_error(PT_ERR_FORMAT, "%s.%s: expected one character, found \"%s\"", what, key, s);
    return PT_OK;
}

static pt_status load_pattern(const cJSON *o, tok_pattern *p, const char *what) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    if (!cJSON_IsObject(pat))
        return pt_error(PT_ERR_FORMAT, "%s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", what);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if ((cJSON_IsString(s) && pt_utf8_invalid_offset(s->valuestring, strlen(s->valuestring)) >= 0) ||
        (cJSON_IsString(r) && pt_utf8_invalid_offset(r->valuestring, strlen(r->valuestring)) >= 0))
        return pt_error(PT_ERR_FORMAT, "%s.pattern: not valid UTF-8", what);
    if (cJSON_IsString(s)) {
        p->literal_len = strlen(s->valuestring);
        p->literal = xstrdup_n(s->valuestring, p->literal_len);
        if (!p->literal) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        return PT_OK;
    }
    if (cJSON_IsString(r)) {
        char w[96];
        snprintf(w, sizeof w, "%s.pattern", what);
        return tok_pattern_compile_regex(p, r->valuestring, w);
    }
    return pt_error(PT_ERR_FORMAT, "%s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", what);
}

static pt_status unknown_type(const char *what, const char *kind, const char *type,
                              const char *const *known_unsupported) {
    if (!type) return pt_error(PT_ERR_FORMAT, "%s: %s has no \"type\"", what, kind);
    for (const char *const *k = known_unsupported; *k; k++)
        if (strcmp(*k, type) == 0)
            return pt_error(PT_ERR_UNSUPPORTED, "%s: %s type \"%s\" is not supported by petrel", what,
                            kind, type);
    return pt_error(PT_ERR_FORMAT, "%s: unknown %s type \"%s\"", what, kind, type);
}

/* ---- normalizers ------------------------------------------------------------ */
static void norm_free(tok_norm *n) {
    for (size_t i = 0; i < n->n_items; i++) norm_free(&n->items[i]);
    free(n->items);
    free(n->str);
    tok_pattern_free(&n->pat);
    memset(n, 0, sizeof *n);
}

static pt_status load_norm(const cJSON *o, tok_norm *n, const char *what) {
    static const char *const unsupported[] = {"BertNormalizer", "Precompiled", "Nmt", "ByteLevel", NULL};
    if (!cJSON_IsObject(o)) return pt_error(PT_ERR_FORMAT, "%s: expected an object", what);
    const char *t = type_of(o);
    char w[128];
    if (!t) return unknown_type(what, "normalizer", t, unsupported);
    if (!strcmp(t, "NFC")) n->kind = NORM_NFC;
    else if (!strcmp(t, "NFD")) n->kind = NORM_NFD;
    else if (!strcmp(t, "NFKC")) n->kind = NORM_NFKC;
    else if (!strcmp(t, "NFKD")) n->kind = NORM_NFKD;
    else if (!strcmp(t, "Lowercase")) n->kind = NORM_LOWERCASE;
    else if (!strcmp(t, "StripAccents")) n->kind = NORM_STRIP_ACCENTS;
    else if (!strcmp(t, "Strip")) {
        n->kind = NORM_STRIP;
        PT_TRY(get_bool(o, "strip_left", true, &n->strip_left, what));
        PT_TRY(get_bool(o, "strip_right", true, &n->strip_right, what));
    } else if (!strcmp(t, "Prepend") || !strcmp(t, "Replace")) {
        const char *s = "";
        n->kind = t[1] == 'r' ? NORM_PREPEND : NORM_REPLACE;
        PT_TRY(get_string(o, n->kind == NORM_PREPEND ? "prepend" : "content", &s, what));
        n->str_len = strlen(s);
        n->str = xstrdup_n(s, n->str_len);
        if (!n->str) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        if (n->kind == NORM_REPLACE) PT_TRY(load_pattern(o, &n->pat, what));
    } else if (!strcmp(t, "Sequence")) {
        n->kind = NORM_SEQUENCE;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        if (!cJSON_IsArray(a)) return pt_error(PT_ERR_FORMAT, "%s.normalizers: expected an array", what);
        size_t k = (size_t)cJSON_GetArraySize(a);
        n->items = calloc(k ? k : 1, sizeof *n->items);
        if (!n->items) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        for (const cJSON *c = a->child; c; c = c->next) {
            snprintf(w, sizeof w, "%s.normalizers[%zu]", what, n->n_items);
            PT_TRY(load_norm(c, &n->items[n->n_items++], w));
        }
    } else return unknown_type(what, "normalizer", t, unsupported);
    return PT_OK;
}

/* ---- pre-tokenizers ---------------------------------------------------------- */
static void pre_free(tok_pre *p) {
    for (size_t i = 0; i < p->n_items; i++) pre_free(&p->items[i]);
    free(p->items);
    tok_pattern_free(&p->pat);
    memset(p, 0, sizeof *p);
}

static pt_status get_behavior(const cJSON *o, tok_split_behavior dflt, tok_split_behavior *out,
                              const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "behavior");
    if (!v || cJSON_IsNull(v)) { *out = dflt; return PT_OK; }
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    if (!strcmp(s, "Removed")) *out = SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *out = SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *out = SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = SPLIT_CONTIGUOUS;
    else
        return pt_error(PT_ERR_FORMAT,
                        "%s.behavior: expected Removed, Isolated, MergedWithPrevious, "
                        "MergedWithNext or Contiguous, found \"%s\"", what, s);
    return PT_OK;
}

static pt_status get_prepend_scheme(const cJSON *o, tok_prepend_scheme *out, const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prepend_scheme");
    if (!v || cJSON_IsNull(v)) {
        bool aps; /* legacy files: add_prefix_space */
        PT_TRY(get_bool(o, "add_prefix_space", true, &aps, what));
        *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
        return PT_OK;
    }
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
    else return pt_error(PT_ERR_FORMAT, "%s.prepend_scheme: expected always, first or never, found \"%s\"", what, s);
    return PT_OK;
}

static pt_status load_pre(pt_tokenizer *t, const cJSON *o, tok_pre *p, const char *what) {
    static const char *const unsupported[] = {"UnicodeScripts", "FixedLength", NULL};
    if (!cJSON_IsObject(o)) return pt_error(PT_ERR_FORMAT, "%s: expected an object", what);
    const char *ty = type_of(o);
    char w[128];
    if (!ty) return unknown_type(what, "pre_tokenizer", ty, unsupported);
    if (!strcmp(ty, "Split")) {
        p->kind = PRE_SPLIT;
        PT_TRY(load_pattern(o, &p->pat, what));
        PT_TRY(get_behavior(o, SPLIT_REMOVED, &p->behavior, what));
        if (!cJSON_GetObjectItemCaseSensitive(o, "behavior"))
            return pt_error(PT_ERR_FORMAT, "%s.behavior: missing", what);
        PT_TRY(get_bool(o, "invert", false, &p->invert, what));
    } else if (!strcmp(ty, "ByteLevel")) {
        p->kind = PRE_BYTELEVEL;
        PT_TRY(get_bool(o, "add_prefix_space", true, &p->add_prefix_space, what));
        PT_TRY(get_bool(o, "use_regex", true, &p->use_regex, what));
        if (p->use_regex && !t->gpt2_re) {
            tok_pattern g = {0};
            PT_TRY(tok_pattern_compile_regex(&g, GPT2_REGEX, what));
            t->gpt2_re = g.re;
        }
    } else if (!strcmp(ty, "Metaspace")) {
        p->kind = PRE_METASPACE;
        PT_TRY(get_char(o, "replacement", &p->replacement_cp, what));
        int l = tok_utf8_encode(p->replacement_cp, p->replacement);
        p->replacement[l] = 0;
        PT_TRY(get_prepend_scheme(o, &p->prepend, what));
        PT_TRY(get_bool(o, "split", true, &p->split, what));
    } else if (!strcmp(ty, "Digits")) {
        p->kind = PRE_DIGITS;
        PT_TRY(get_bool(o, "individual_digits", false, &p->individual_digits, what));
    } else if (!strcmp(ty, "Whitespace")) {
        p->kind = PRE_WHITESPACE;
        PT_TRY(tok_pattern_compile_regex(&p->pat, "\\w+|[^\\w\\s]+", what));
    } else if (!strcmp(ty, "WhitespaceSplit")) p->kind = PRE_WHITESPACE_SPLIT;
    else if (!strcmp(ty, "Punctuation")) {
        p->kind = PRE_PUNCTUATION;
        PT_TRY(get_behavior(o, SPLIT_ISOLATED, &p->behavior, what));
    } else if (!strcmp(ty, "CharDelimiterSplit")) {
        p->kind = PRE_CHAR_DELIMITER;
        PT_TRY(get_char(o, "delimiter", &p->delimiter, what));
    } else if (!strcmp(ty, "BertPreTokenizer")) {
        /* whitespace split, then punctuation isolated */
        p->kind = PRE_SEQUENCE;
        p->items = calloc(2, sizeof *p->items);
        if (!p->items) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        p->n_items = 2;
        p->items[0].kind = PRE_WHITESPACE_SPLIT;
        p->items[1].kind = PRE_PUNCTUATION;
        p->items[1].behavior = SPLIT_ISOLATED;
    } else if (!strcmp(ty, "Sequence")) {
        p->kind = PRE_SEQUENCE;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        if (!cJSON_IsArray(a)) return pt_error(PT_ERR_FORMAT, "%s.pretokenizers: expected an array", what);
        size_t k = (size_t)cJSON_GetArraySize(a);
        p->items = calloc(k ? k : 1, sizeof *p->items);
        if (!p->items) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        for (const cJSON *c = a->child; c; c = c->next) {
            snprintf(w, sizeof w, "%s.pretokenizers[%zu]", what, p->n_items);
            PT_TRY(load_pre(t, c, &p->items[p->n_items++], w));
        }
    } else return unknown_type(what, "pre_tokenizer", ty, unsupported);
    return PT_OK;
}

/* ---- decoders ------------------------------------------------------------------ */
static void dec_free(tok_dec *d) {
    for (size_t i = 0; i < d->n_items; i++) dec_free(&d->items[i]);
    free(d->items);
    free(d->content);
    tok_pattern_free(&d->pat);
    memset(d, 0, sizeof *d);
}

static pt_status load_dec(const cJSON *o, tok_dec *d, const char *what) {
    static const char *const unsupported[] = {"BPEDecoder", "WordPiece", "CTC", NULL};
    if (!cJSON_IsObject(o)) return pt_error(PT_ERR_FORMAT, "%s: expected an object", what);
    const char *ty = type_of(o);
    char w[128];
    if (!ty) return unknown_type(what, "decoder", ty, unsupported);
    if (!strcmp(ty, "ByteLevel")) d->kind = DEC_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) d->kind = DEC_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) d->kind = DEC_FUSE;
    else if (!strcmp(ty, "Metaspace")) {
        d->kind = DEC_METASPACE;
        PT_TRY(get_char(o, "replacement", &d->replacement_cp, what));
        PT_TRY(get_prepend_scheme(o, &d->prepend, what));
    } else if (!strcmp(ty, "Replace")) {
        d->kind = DEC_REPLACE;
        const char *s = "";
        PT_TRY(get_string(o, "content", &s, what));
        d->content_len = strlen(s);
        d->content = xstrdup_n(s, d->content_len);
        if (!d->content) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        PT_TRY(load_pattern(o, &d->pat, what));
    } else if (!strcmp(ty, "Strip")) {
        d->kind = DEC_STRIP;
        int64_t a, b;
        PT_TRY(get_char(o, "content", &d->strip_cp, what));
        char w2[160];
        snprintf(w2, sizeof w2, "%s.start", what);
        PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(o, "start"), 0, 1 << 20, &a, w2));
        snprintf(w2, sizeof w2, "%s.stop", what);
        PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(o, "stop"), 0, 1 << 20, &b, w2));
        d->strip_start = (int)a;
        d->strip_stop = (int)b;
    } else if (!strcmp(ty, "Sequence")) {
        d->kind = DEC_SEQUENCE;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        if (!cJSON_IsArray(a)) return pt_error(PT_ERR_FORMAT, "%s.decoders: expected an array", what);
        size_t k = (size_t)cJSON_GetArraySize(a);
        d->items = calloc(k ? k : 1, sizeof *d->items);
        if (!d->items) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        for (const cJSON *c = a->child; c; c = c->next) {
            snprintf(w, sizeof w, "%s.decoders[%zu]", what, d->n_items);
            PT_TRY(load_dec(c, &d->items[d->n_items++], w));
        }
    } else return unknown_type(what, "decoder", ty, unsupported);
    return PT_OK;
}

/* ---- post-processors ------------------------------------------------------------- */
static pt_status ids_append(int32_t **v, size_t *n, int32_t id) {
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    p[(*n)++] = id;
    *v = p;
    return PT_OK;
}

/* A ["token", id] pair of Bert/RobertaProcessing. */
static pt_status get_pair_id(const cJSON *o, const char *key, int32_t *id, const char *what) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    int64_t v;
    char w[160];
    snprintf(w, sizeof w, "%s.%s[1]", what, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 2)
        return pt_error(PT_ERR_FORMAT, "%s.%s: expected [token, id]", what, key);
    PT_TRY(pt_json_to_i64(cJSON_GetArrayItem(a, 1), 0, INT32_MAX - 1, &v, w));
    *id = (int32_t)v;
    return PT_OK;
}

static pt_status load_post(const cJSON *o, tok_post *p, const char *what) {
    if (!cJSON_IsObject(o)) return pt_error(PT_ERR_FORMAT, "%s: expected an object", what);
    const char *ty = type_of(o);
    char w[160];
    static const char *const unsupported[] = {NULL};
    if (!ty) return unknown_type(what, "post_processor", ty, unsupported);
    if (!strcmp(ty, "ByteLevel")) return PT_OK; /* offsets only; ids unchanged */
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        int32_t cls, sep;
        PT_TRY(get_pair_id(o, "cls", &cls, what));
        PT_TRY(get_pair_id(o, "sep", &sep, what));
        PT_TRY(ids_append(&p->before, &p->n_before, cls));
        return ids_append(&p->after, &p->n_after, sep);
    }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "processors");
        if (!cJSON_IsArray(a)) return pt_error(PT_ERR_FORMAT, "%s.processors: expected an array", what);
        size_t i = 0;
        for (const cJSON *c = a->child; c; c = c->next, i++) {
            /* each processor wraps what the previous one produced */
            tok_post q = {0};
            snprintf(w, sizeof w, "%s.processors[%zu]", what, i);
            pt_status st = load_post(c, &q, w);
            for (size_t k = 0; !st && k < q.n_after; k++) st = ids_append(&p->after, &p->n_after, q.after[k]);
            if (!st && q.n_before) {
                int32_t *nb = malloc((q.n_before + p->n_before) * sizeof *nb);
                if (!nb) st = pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
                else {
                    memcpy(nb, q.before, q.n_before * sizeof *nb);
                    if (p->n_before) memcpy(nb + q.n_before, p->before, p->n_before * sizeof *nb);
                    free(p->before);
                    p->before = nb;
                    p->n_before += q.n_before;
                }
            }
            free(q.before);
            free(q.after);
            if (st) return st;
        }
        return PT_OK;
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
        if (!cJSON_IsArray(single)) return pt_error(PT_ERR_FORMAT, "%s.single: expected an array", what);
        int seen_a = 0;
        size_t i = 0;
        for (const cJSON *it = single->child; it; it = it->next, i++) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
            if (sq) {
                const char *id = pt_json_get_str(sq, "id");
                if (!id || strcmp(id, "A"))
                    return pt_error(PT_ERR_FORMAT, "%s.single[%zu]: a single-sequence template may only hold $A", what, i);
                if (seen_a++) return pt_error(PT_ERR_FORMAT, "%s.single: $A appears twice", what);
                continue;
            }
            const char *name = sp ? pt_json_get_str(sp, "id") : NULL;
            if (!name)
                return pt_error(PT_ERR_FORMAT, "%s.single[%zu]: expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}", what, i);
            const cJSON *st = cJSON_IsObject(specials) ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
            const cJSON *ids = st ? cJSON_GetObjectItemCaseSensitive(st, "ids") : NULL;
            if (!cJSON_IsArray(ids))
                return pt_error(PT_ERR_FORMAT, "%s.special_tokens: no entry with ids for \"%s\"", what, name);
            size_t k = 0;
            for (const cJSON *x = ids->child; x; x = x->next, k++) {
                int64_t v;
                snprintf(w, sizeof w, "%s.special_tokens[\"%.40s\"].ids[%zu]", what, name, k);
                PT_TRY(pt_json_to_i64(x, 0, INT32_MAX - 1, &v, w));
                PT_TRY(seen_a ? ids_append(&p->after, &p->n_after, (int32_t)v)
                              : ids_append(&p->before, &p->n_before, (int32_t)v));
            }
        }
        if (!seen_a) return pt_error(PT_ERR_FORMAT, "%s.single: no $A sequence", what);
        return PT_OK;
    }
    return unknown_type(what, "post_processor", ty, unsupported);
}

/* ---- model ------------------------------------------------------------------------ */
static pt_status load_bpe(pt_tokenizer *t, const cJSON *m) {
    tok_bpe *b = &t->bpe;
    const char *ty = type_of(m);
    static const char *const unsupported[] = {"WordPiece", "WordLevel", "Unigram", NULL};
    if (ty && strcmp(ty, "BPE")) return unknown_type("tokenizer.json model", "model", ty, unsupported);
    if (!ty && !cJSON_GetObjectItemCaseSensitive(m, "merges"))
        return pt_error(PT_ERR_FORMAT, "tokenizer.json model: no \"type\" and no merges");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (d && !cJSON_IsNull(d) && (!cJSON_IsNumber(d) || d->valuedouble != 0.0))
        return pt_error(PT_ERR_UNSUPPORTED, "model.dropout: BPE dropout is not supported (found a non-zero value)");
    PT_TRY(get_bool(m, "fuse_unk", false, &b->fuse_unk, "model"));
    PT_TRY(get_bool(m, "byte_fallback", false, &b->byte_fallback, "model"));
    PT_TRY(get_bool(m, "ignore_merges", false, &b->ignore_merges, "model"));
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(m, "continuing_subword_prefix");
    const cJSON *suf = cJSON_GetObjectItemCaseSensitive(m, "end_of_word_suffix");
    if ((cJSON_IsString(pre) && pt_utf8_invalid_offset(pre->valuestring, strlen(pre->valuestring)) >= 0) ||
        (cJSON_IsString(suf) && pt_utf8_invalid_offset(suf->valuestring, strlen(suf->valuestring)) >= 0))
        return pt_error(PT_ERR_FORMAT, "model: continuing_subword_prefix / end_of_word_suffix is not valid UTF-8");
    if (cJSON_IsString(pre) && pre->valuestring[0]) {
        b->prefix_len = strlen(pre->valuestring);
        b->prefix = xstrdup_n(pre->valuestring, b->prefix_len);
    }
    if (cJSON_IsString(suf) && suf->valuestring[0]) {
        b->suffix_len = strlen(suf->valuestring);
        b->suffix = xstrdup_n(suf->valuestring, b->suffix_len);
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!cJSON_IsObject(vocab)) return pt_error(PT_ERR_FORMAT, "model.vocab: expected an object of token -> id");
    size_t n_vocab = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) n_vocab++;
    PT_TRY(tok_strmap_reserve(&b->vocab, n_vocab));
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777215.0 ||
            e->valuedouble != (double)(int32_t)e->valuedouble)
            return pt_error(PT_ERR_FORMAT, "model.vocab[\"%.60s\"]: expected an id in [0, 16777215]", e->string);
        if (pt_utf8_invalid_offset(e->string, strlen(e->string)) >= 0)
            return pt_error(PT_ERR_FORMAT, "model.vocab: a token is not valid UTF-8");
        bool dup;
        PT_TRY(tok_strmap_put(&b->vocab, e->string, strlen(e->string), (int32_t)e->valuedouble, &dup));
        if (dup) return pt_error(PT_ERR_FORMAT, "model.vocab: duplicate token \"%.60s\"", e->string);
        if ((int32_t)e->valuedouble >= t->vocab_size) t->vocab_size = (int32_t)e->valuedouble + 1;
    }
    b->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    if (cJSON_IsString(unk)) {
        b->unk_id = tok_strmap_get(&b->vocab, unk->valuestring, strlen(unk->valuestring));
        if (b->unk_id < 0)
            return pt_error(PT_ERR_FORMAT, "model.unk_token \"%.60s\" is not in the vocabulary", unk->valuestring);
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (merges && !cJSON_IsArray(merges)) return pt_error(PT_ERR_FORMAT, "model.merges: expected an array");
    if (merges) PT_TRY(tok_pairmap_reserve(&b->merges, (size_t)cJSON_GetArraySize(merges)));
    int32_t rank = 0;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    pt_status st = PT_OK;
    for (const cJSON *e = merges ? merges->child : NULL; e && !st; e = e->next, rank++) {
        const char *a, *bb;
        size_t al, bl;
        if (cJSON_IsString(e)) {
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = pt_error(PT_ERR_FORMAT, "model.merges[%d]: expected \"a b\" (two tokens and one space), found \"%.60s\"", rank, s);
                break;
            }
            a = s; al = (size_t)(sp - s); bb = sp + 1; bl = strlen(bb);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring; al = strlen(a);
            bb = e->child->next->valuestring; bl = strlen(bb);
        } else {
            st = pt_error(PT_ERR_FORMAT, "model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", rank);
            break;
        }
        int32_t ia = tok_strmap_get(&b->vocab, a, al), ib = tok_strmap_get(&b->vocab, bb, bl);
        if (ia < 0 || ib < 0) {
            st = pt_error(PT_ERR_FORMAT, "model.merges[%d]: token \"%.*s\" is not in the vocabulary", rank,
                          (int)(ia < 0 ? (al > 60 ? 60 : al) : (bl > 60 ? 60 : bl)), ia < 0 ? a : bb);
            break;
        }
        if (bl < b->prefix_len) {
            st = pt_error(PT_ERR_FORMAT, "model.merges[%d]: \"%.60s\" is shorter than continuing_subword_prefix", rank, bb);
            break;
        }
        size_t ml = al + bl - b->prefix_len;
        if (ml > tmp_cap) {
            tmp_cap = ml * 2 + 64;
            char *nt = realloc(tmp, tmp_cap);
            if (!nt) { st = pt_error(PT_ERR_NOMEM, "tokenizer: out of memory"); break; }
            tmp = nt;
        }
        memcpy(tmp, a, al);
        memcpy(tmp + al, bb + b->prefix_len, bl - b->prefix_len);
        int32_t im = tok_strmap_get(&b->vocab, tmp, ml);
        if (im < 0) {
            st = pt_error(PT_ERR_FORMAT, "model.merges[%d]: merged token \"%.*s\" is not in the vocabulary",
                          rank, (int)(ml > 60 ? 60 : ml), tmp);
            break;
        }
        st = tok_pairmap_put(&b->merges, ia, ib, rank, im);
    }
    free(tmp);
    if (st) return st;
    return tok_bpe_init_tables(b);
}

/* ---- added tokens ------------------------------------------------------------------- */
static pt_status trie_add(tok_trie *tr, const char *s, size_t n, int32_t token) {
    if (!tr->n) {
        tr->cap = 64;
        tr->nodes = malloc(tr->cap * sizeof *tr->nodes);
        if (!tr->nodes) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        tr->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
        tr->n = 1;
    }
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int32_t ch = tr->nodes[cur].first_child;
        while (ch >= 0 && tr->nodes[ch].byte != c) ch = tr->nodes[ch].next_sibling;
        if (ch < 0) {
            if (tr->n == tr->cap) {
                tok_trie_node *nn = realloc(tr->nodes, tr->cap * 2 * sizeof *nn);
                if (!nn) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
                tr->nodes = nn;
                tr->cap *= 2;
            }
            ch = (int32_t)tr->n++;
            tr->nodes[ch] = (tok_trie_node){-1, tr->nodes[cur].first_child, -1, c};
            tr->nodes[cur].first_child = ch;
        }
        cur = ch;
    }
    if (tr->nodes[cur].token < 0) tr->nodes[cur].token = token; /* the first of equal contents wins */
    tr->first_byte[(unsigned char)s[0]] = true;
    return PT_OK;
}

static pt_status load_added(pt_tokenizer *t, const cJSON *arr) {
    if (!arr || cJSON_IsNull(arr)) return PT_OK;
    if (!cJSON_IsArray(arr)) return pt_error(PT_ERR_FORMAT, "added_tokens: expected an array");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    size_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        char w[64];
        snprintf(w, sizeof w, "added_tokens[%zu]", i);
        tok_added *a = &t->added[t->n_added];
        int64_t id;
        const char *content = "";
        char w2[80];
        snprintf(w2, sizeof w2, "%s.id", w);
        PT_TRY(pt_json_to_i64(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, 16777215, &id, w2));
        PT_TRY(get_string(e, "content", &content, w));
        a->id = (int32_t)id;
        a->len = strlen(content);
        if (pt_utf8_invalid_offset(content, a->len) >= 0)
            return pt_error(PT_ERR_FORMAT, "%s.content: invalid UTF-8", w);
        a->content = pt_arena_strndup(&t->arena, content, a->len);
        if (!a->content) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        PT_TRY(get_bool(e, "special", false, &a->special, w));
        PT_TRY(get_bool(e, "single_word", false, &a->single_word, w));
        PT_TRY(get_bool(e, "lstrip", false, &a->lstrip, w));
        PT_TRY(get_bool(e, "rstrip", false, &a->rstrip, w));
        PT_TRY(get_bool(e, "normalized", !a->special, &a->normalized, w));
        t->n_added++;
        if (a->id >= t->vocab_size) t->vocab_size = a->id + 1;
        if (tok_strmap_get(&t->added_map, a->content, a->len) < 0)
            PT_TRY(tok_strmap_put(&t->added_map, a->content, a->len, a->id, NULL));
    }
    /* Tries: non-normalized tokens match the raw text; normalized ones match
     * the normalized text, so their content is normalized first. */
    for (size_t k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        if (!a->len) continue;
        if (a->normalized && t->has_norm) {
            tok_buf nb = {0};
            pt_status st = tok_normalize(t, &t->norm, a->content, a->len, &nb);
            if (!st && nb.n) {
                a->norm = pt_arena_strndup(&t->arena, nb.p, nb.n);
                a->norm_len = nb.n;
                if (!a->norm) st = pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
            }
            tok_buf_free(&nb);
            PT_TRY(st);
            if (a->norm_len) PT_TRY(trie_add(&t->trie_norm, a->norm, a->norm_len, (int32_t)k));
        } else if (a->normalized) {
            a->norm = a->content;
            a->norm_len = a->len;
            PT_TRY(trie_add(&t->trie_norm, a->content, a->len, (int32_t)k));
        } else {
            PT_TRY(trie_add(&t->trie_raw, a->content, a->len, (int32_t)k));
        }
    }
    return PT_OK;
}

pt_status tok_load_root(pt_tokenizer *t, const void *root_json, const char *what) {
    const cJSON *root = root_json;
    if (!cJSON_IsObject(root)) return pt_error(PT_ERR_FORMAT, "%s: expected a JSON object", what);
    for (int c = 0, n = 0; c < 256; c++) {
        bool same = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        t->byte_to_cp[c] = same ? (uint32_t)c : (uint32_t)(256 + n++);
    }
    for (int i = 0; i < 324; i++) t->cp_to_byte[i] = -1;
    for (int c = 0; c < 256; c++) t->cp_to_byte[t->byte_to_cp[c]] = (int16_t)c;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return pt_error(PT_ERR_FORMAT, "%s: missing \"model\" object", what);
    pt_status st = load_bpe(t, model);
    if (st) return pt_error_prefix(st, "%s", what);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (o && !cJSON_IsNull(o)) {
        t->has_norm = true;
        if ((st = load_norm(o, &t->norm, "normalizer"))) return pt_error_prefix(st, "%s", what);
    }
    o = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (o && !cJSON_IsNull(o)) {
        t->has_pre = true;
        if ((st = load_pre(t, o, &t->pre, "pre_tokenizer"))) return pt_error_prefix(st, "%s", what);
    }
    o = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (o && !cJSON_IsNull(o) && (st = load_post(o, &t->post, "post_processor")))
        return pt_error_prefix(st, "%s", what);
    o = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (o && !cJSON_IsNull(o)) {
        t->has_dec = true;
        if ((st = load_dec(o, &t->dec, "decoder"))) return pt_error_prefix(st, "%s", what);
    }
    if ((st = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))))
        return pt_error_prefix(st, "%s", what);

    /* id -> piece table (the strmap blob is final now, so pointers are stable). */
    if (t->vocab_size <= 0) return pt_error(PT_ERR_FORMAT, "%s: empty vocabulary", what);
    t->pieces = calloc((size_t)t->vocab_size, sizeof *t->pieces);
    t->piece_len = calloc((size_t)t->vocab_size, sizeof *t->piece_len);
    t->flags = calloc((size_t)t->vocab_size, 1);
    if (!t->pieces || !t->piece_len || !t->flags) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    const tok_strmap *v = &t->bpe.vocab;
    for (size_t e = 0; e < v->n; e++) {
        int32_t id = v->val[e];
        t->pieces[id] = v->blob + v->off[e];
        t->piece_len[id] = v->len[e];
    }
    for (size_t k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        /* The reference maps the id of a normalized added token back to its
         * normalized content (what decode prints); the raw content still
         * looks the id up. */
        bool use_norm = a->normalized && a->norm && a->norm_len;
        t->pieces[a->id] = use_norm ? a->norm : a->content;
        t->piece_len[a->id] = (uint32_t)(use_norm ? a->norm_len : a->len);
        t->flags[a->id] = (uint8_t)(1 | (a->special ? 2 : 0));
    }
    for (size_t i = 0; i < t->post.n_before; i++)
        if (t->post.before[i] >= t->vocab_size)
            return pt_error(PT_ERR_FORMAT, "%s: post_processor id %d is outside the vocabulary", what, t->post.before[i]);
    for (size_t i = 0; i < t->post.n_after; i++)
        if (t->post.after[i] >= t->vocab_size)
            return pt_error(PT_ERR_FORMAT, "%s: post_processor id %d is outside the vocabulary", what, t->post.after[i]);
    return PT_OK;
}

void tok_free_components(pt_tokenizer *t) {
    norm_free(&t->norm);
    pre_free(&t->pre);
    dec_free(&t->dec);
    free(t->post.before);
    free(t->post.after);
    tok_strmap_free(&t->bpe.vocab);
    tok_pairmap_free(&t->bpe.merges);
    free(t->bpe.prefix);
    free(t->bpe.suffix);
    free(t->added);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    tok_strmap_free(&t->added_map);
    free(t->pieces);
    free(t->piece_len);
    free(t->flags);
    if (t->gpt2_re) pcre2_code_free(t->gpt2_re);
}
