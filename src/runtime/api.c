/* The public API's model accessors, tokenization, detokenization, chat
 * rendering and sampling defaults (include/petrel.h), over the internal
 * tokenizer and chat-template modules. Sessions: session.c; generation:
 * generate.c; loading: src/model/model.c. */
#include "petrel.h"

#include "base/error.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

int pt_model_vocab_size(const pt_model *m) { return m ? (int)m->net.vocab : 0; }
int pt_model_max_ctx(const pt_model *m) { return m ? m->net.max_ctx : 0; }
const char *pt_model_backend_name(const pt_model *m) { return m ? m->backend_name : ""; }
const char *pt_model_id(const pt_model *m) { return m ? m->id : ""; }
int pt_model_has_tokenizer(const pt_model *m) { return m && m->tok; }

int pt_model_is_eos(const pt_model *m, int32_t id) {
    if (!m) return 0;
    for (size_t i = 0; i < m->n_eos; i++)
        if (m->eos[i] == id) return 1;
    return 0;
}

void pt_free(void *p) { free(p); }

static pt_status need_tok(const pt_model *m) {
    if (!m) return pt_error(PT_ERR_INVALID_ARG, "model is NULL");
    if (!m->tok)
        return pt_error(PT_ERR_NOT_FOUND, "%s has no tokenizer (tokenizer.json); give token ids instead",
                        m->dir ? m->dir : "the model");
    return PT_OK;
}

pt_status pt_tokenize(const pt_model *m, const char *text, size_t len, int add_special, int32_t **ids,
                      size_t *n_ids) {
    PT_TRY(need_tok(m));
    if (!text && len) return pt_error(PT_ERR_INVALID_ARG, "pt_tokenize: text is NULL");
    return pt_tokenizer_encode(m->tok, text ? text : "", len, add_special, ids, n_ids);
}

/* An id the model can produce but the tokenizer does not know: the rows of
 * an embedding padded past the tokenizer's vocabulary (Qwen2's 151936 rows
 * for ~151665 tokens). They decode to nothing, as the reference tokenizer's
 * decode skips ids it has no token for; ids outside the model's vocabulary
 * stay an error. */
static int padded_id(const pt_model *m, int32_t id) {
    return id >= pt_tokenizer_vocab_size(m->tok) && id < (int32_t)m->net.vocab;
}

pt_status pt_detokenize(const pt_model *m, const int32_t *ids, size_t n_ids, int skip_special, char **text) {
    PT_TRY(need_tok(m));
    size_t n_pad = 0;
    for (size_t i = 0; i < n_ids; i++) n_pad += padded_id(m, ids[i]);
    if (!n_pad) return pt_tokenizer_decode(m->tok, ids, n_ids, skip_special, text, NULL);
    int32_t *kept = malloc((n_ids - n_pad + 1) * sizeof *kept);
    if (!kept) return pt_error(PT_ERR_NOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < n_ids; i++)
        if (!padded_id(m, ids[i])) kept[n++] = ids[i];
    pt_status st = pt_tokenizer_decode(m->tok, kept, n, skip_special, text, NULL);
    free(kept);
    return st;
}

pt_status pt_token_text(const pt_model *m, int32_t id, char **text) {
    PT_TRY(need_tok(m));
    return pt_tokenizer_token_text(m->tok, id, text, NULL);
}

struct pt_detokenizer {
    pt_tok_stream *s;
    const pt_model *m;
};

pt_status pt_detokenizer_create(const pt_model *m, int skip_special, pt_detokenizer **out) {
    if (!out) return pt_error(PT_ERR_INVALID_ARG, "pt_detokenizer_create: out is NULL");
    *out = NULL;
    PT_TRY(need_tok(m));
    pt_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return pt_error(PT_ERR_NOMEM, "out of memory");
    d->m = m;
    pt_status st = pt_tok_stream_create(m->tok, skip_special, &d->s);
    if (st != PT_OK) {
        free(d);
        return st;
    }
    *out = d;
    return PT_OK;
}

pt_status pt_detokenizer_push(pt_detokenizer *d, int32_t id, const char **text, size_t *len) {
    if (!d) return pt_error(PT_ERR_INVALID_ARG, "detokenizer is NULL");
    if (padded_id(d->m, id)) {
        *text = "";
        *len = 0;
        return PT_OK;
    }
    return pt_tok_stream_push(d->s, id, text, len);
}

pt_status pt_detokenizer_flush(pt_detokenizer *d, const char **text, size_t *len) {
    if (!d) return pt_error(PT_ERR_INVALID_ARG, "detokenizer is NULL");
    return pt_tok_stream_flush(d->s, text, len);
}

void pt_detokenizer_free(pt_detokenizer **d) {
    if (!d || !*d) return;
    pt_tok_stream_free(&(*d)->s);
    free(*d);
    *d = NULL;
}

pt_status pt_chat_render(const pt_model *m, const char *messages_json, int add_generation_prompt,
                         const char *extra_json, char **out) {
    if (!m || !messages_json || !out) return pt_error(PT_ERR_INVALID_ARG, "pt_chat_render: NULL argument");
    *out = NULL;
    if (!m->tmpl)
        return pt_error(PT_ERR_NOT_FOUND, "%s has no chat template (give one with --chat-template FILE)", m->dir);
    /* The text-level render keeps JSON numbers exact (a tool schema's 1.0
     * stays a float), as transformers renders them. */
    const char *bos = pt_chat_template_bos(m->tmpl), *eos = pt_chat_template_eos(m->tmpl);
    if (!bos && m->tok) bos = pt_tokenizer_bos_token(m->tok);
    if (!eos && m->tok) eos = pt_tokenizer_eos_token(m->tok);
    return pt_chat_template_render_chat(m->tmpl, messages_json, add_generation_prompt, extra_json, bos, eos,
                                        NULL, out, NULL);
}

pt_sampling_params pt_sampling_default_params(const pt_model *m) {
    if (m) return m->gen_defaults;
    pt_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.repeat_last_n = 64;
    return p;
}
