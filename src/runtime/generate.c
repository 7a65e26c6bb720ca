/* The generation loop (pt_generate): prompt, then sample → append → decode
 * until eos, a stop string, max_tokens or the callback's cancel.
 *
 * Stop strings are matched on the decoded text. Text that could still be the
 * start of a stop string is held back until it is decided, so the callback
 * never receives any part of a stop string; the stop string itself is not
 * emitted. An eos token is not emitted either (its callback is not called).
 * The token that ends generation (eos, the token completing a stop string,
 * or the max_tokens-th token) is not run through the model: the context holds
 * the prompt and every generated token before it.
 *
 * On CUDA the loop is pipelined (pt_session_sample_ahead): the decode step
 * on a sampled token is enqueued before the host reads the token, and
 * pt_session_prompt of that token takes it; PETREL_CUDA_PIPELINE=0 turns it
 * off (same tokens either way). */
#include "runtime/session.h"

#include "base/error.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

pt_generate_params pt_generate_default_params(const pt_model *model) {
    pt_generate_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 256;
    p.sampling = pt_sampling_default_params(model);
    return p;
}

/* Pending text held back for stop-string matching. */
typedef struct {
    char *buf;
    size_t len, cap;
} textbuf;

static int tb_append(textbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) return 0;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
    return 1;
}

/* Length of the longest suffix of text that is a proper prefix of a stop string. */
static size_t stop_holdback(const char *text, size_t len, const char *const *stop, int n_stop) {
    size_t best = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > best; k--)
            if (k <= len && !memcmp(text + len - k, stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Earliest occurrence of any stop string in text, or -1. */
static long find_stop(const char *text, size_t len, const char *const *stop, int n_stop) {
    long best = -1;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        if (!sl || sl > len) continue;
        for (size_t p = 0; p + sl <= len; p++)
            if (!memcmp(text + p, stop[i], sl)) {
                if (best < 0 || (long)p < best) best = (long)p;
                break;
            }
    }
    return best;
}

pt_status pt_generate(pt_session *s, const int32_t *prompt, size_t n_prompt, const pt_generate_params *params,
                      pt_token_callback cb, void *user, pt_finish_reason *finish, pt_generate_stats *stats) {
    if (!s || !params) return pt_error(PT_ERR_INVALID_ARG, "pt_generate: NULL argument");
    if (params->max_tokens < 0) return pt_error(PT_ERR_INVALID_ARG, "max_tokens must be >= 0");
    if (params->n_stop < 0 || (params->n_stop > 0 && !params->stop))
        return pt_error(PT_ERR_INVALID_ARG, "pt_generate: bad stop list");
    for (int i = 0; i < params->n_stop; i++)
        if (!params->stop[i] || !params->stop[i][0])
            return pt_error(PT_ERR_INVALID_ARG, "stop string %d is empty", i);
    PT_TRY(pt_sampling_validate(&params->sampling));
    pt_model *m = s->m;
    if (params->n_stop > 0 && !m->tok)
        return pt_error(PT_ERR_NOT_FOUND, "stop strings need a tokenizer (no tokenizer.json in %s)", m->dir);
    pt_generate_stats st = {0};
    pt_finish_reason fin = PT_FINISH_LENGTH;
    double t0 = now_s();
    if (n_prompt > 0) PT_TRY(pt_session_prompt(s, prompt, n_prompt));
    else if (!s->has_logits)
        return pt_error(PT_ERR_INVALID_ARG, "the prompt is empty (and the session holds no logits to continue from)");
    double t1 = now_s();
    st.n_prompt = n_prompt;
    st.prompt_seconds = t1 - t0;
    pt_sampler_seed(&s->sampler, params->sampling.seed);

    pt_detokenizer *ds = NULL;
    if (m->tok) PT_TRY(pt_detokenizer_create(m, 1, &ds));
    textbuf pend = {0};
    pt_status status = PT_OK;
    for (int i = 0; i < params->max_tokens; i++) {
        pt_token_info ti;
        /* pipelined (CUDA): the step on this token runs while the host hands
         * it out below; pt_session_prompt takes it. Not for the last token,
         * which is never run through the model. */
        status = i + 1 < params->max_tokens ? pt_session_sample_ahead(s, &params->sampling, &ti)
                                            : pt_session_sample(s, &params->sampling, NULL, &ti);
        if (status != PT_OK) break;
        if (i == 0) st.first_token_seconds = now_s() - t0;
        st.n_generated++;
        if (pt_model_is_eos(m, ti.id)) {
            fin = PT_FINISH_EOS;
            break;
        }
        const char *txt = "";
        size_t tl = 0;
        if (ds && (status = pt_detokenizer_push(ds, ti.id, &txt, &tl)) != PT_OK) break;
        int stop_hit = 0;
        const char *emit = txt;
        size_t emit_len = tl;
        if (params->n_stop > 0) {
            if (!tb_append(&pend, txt, tl)) {
                status = pt_error(PT_ERR_NOMEM, "out of memory for generated text");
                break;
            }
            long at = find_stop(pend.buf, pend.len, params->stop, params->n_stop);
            if (at >= 0) {
                stop_hit = 1;
                emit = pend.buf;
                emit_len = (size_t)at;
            } else {
                size_t hold = stop_holdback(pend.buf, pend.len, params->stop, params->n_stop);
                emit = pend.buf;
                emit_len = pend.len - hold;
            }
        }
        int cancel = cb ? cb(user, &ti, emit, emit_len) : 0;
        if (params->n_stop > 0 && !stop_hit) {
            memmove(pend.buf, pend.buf + emit_len, pend.len - emit_len);
            pend.len -= emit_len;
        }
        if (stop_hit) {
            fin = PT_FINISH_STOP;
            pend.len = 0;
            break;
        }
        if (cancel) {
            fin = PT_FINISH_CANCELLED;
            break;
        }
        if (i + 1 == params->max_tokens) break;
        if ((size_t)s->n_ctx <= s->n_tokens) break; /* context full: finish LENGTH */
        if ((status = pt_session_prompt(s, &ti.id, 1)) != PT_OK) break;
    }
    if (status == PT_OK && fin != PT_FINISH_STOP && fin != PT_FINISH_CANCELLED && cb) {
        /* flush what the detokenizer and the stop matcher still hold */
        const char *txt = NULL;
        size_t tl = 0;
        if (ds && pt_detokenizer_flush(ds, &txt, &tl) == PT_OK && tl > 0) {
            if (params->n_stop > 0) tb_append(&pend, txt, tl);
            else {
                pt_token_info none = {.id = -1};
                cb(user, &none, txt, tl);
            }
        }
        if (pend.len > 0) {
            pt_token_info none = {.id = -1};
            long at = find_stop(pend.buf, pend.len, params->stop, params->n_stop);
            cb(user, &none, pend.buf, at >= 0 ? (size_t)at : pend.len);
            if (at >= 0) fin = PT_FINISH_STOP;
        }
    }
    /* a token that ended generation was not taken into the context: its
     * step ahead, if one ran, is dropped (the session holds the prompt and
     * the tokens before it, as without the pipeline) */
    s->ahead = 0;
    s->rows_ahead = 0;
    st.generate_seconds = now_s() - t1;
    free(pend.buf);
    pt_detokenizer_free(&ds);
    if (finish) *finish = fin;
    if (stats) *stats = st;
    return status;
}
