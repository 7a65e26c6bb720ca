/* A deterministic byte-level model behind the server's engine table, for the
 * server tests (no weights needed). Included by tests/test_server*.c only.
 *
 * Vocabulary: ids 0..255 are bytes; 256 <|im_end|> (end of turn, eos),
 * 257 <|im_start|>, 258 <s> (BOS, added by add_special).
 * Chat template: ChatML ("<|im_start|>role\ncontent<|im_end|>\n"), tools
 * listed in a system block, assistant tool calls as <tool_call> JSON.
 *
 * What it "generates" follows the last user turn:
 *   SAY:text     replies text, then ends its turn
 *   LOOP:text    repeats text forever (max_tokens or a stop string ends it)
 *   FAIL:n       fails with an error after n tokens
 *   SLOW         anywhere in the prompt: 5 ms per generated token
 * Outside a chat (plain completion) it cycles "abcdefghij ".
 * With a token mask, a scripted byte that is not allowed is replaced by eos
 * if allowed, else by a closing byte (" } ]) if allowed, else the first
 * allowed printable byte, so constrained output always terminates.
 */
#ifndef TEST_SERVER_ENGINE_H
#define TEST_SERVER_ENGINE_H

#include "base/error.h"
#include "server/engine.h"
#include "server/sbuf.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TM_EOS = 256, TM_START = 257, TM_BOS = 258, TM_VOCAB = 259 };

typedef struct tm_model {
    int max_ctx;
    atomic_long prompt_tokens_run; /* tokens through session_prompt, all sessions */
    atomic_int sessions_created;
} tm_model;

typedef struct tm_session {
    tm_model *m;
    int n_ctx;
    int32_t *tok;
    size_t n;
} tm_session;

typedef struct tm_detok {
    int skip;
    char buf[8];
    int have, need;
    char out[16];
} tm_detok;

static const char *tm_special(int32_t id) {
    return id == TM_EOS ? "<|im_end|>" : id == TM_START ? "<|im_start|>" : id == TM_BOS ? "<s>" : NULL;
}

static const char *tm_model_id(void *m) {
    (void)m;
    return "test-model";
}
static int tm_vocab(void *m) {
    (void)m;
    return TM_VOCAB;
}
static int tm_max_ctx(void *m) { return ((tm_model *)m)->max_ctx; }
static int tm_is_eos(void *m, int32_t id) {
    (void)m;
    return id == TM_EOS;
}
static int tm_has_tok(void *m) {
    (void)m;
    return 1;
}
static pt_sampling_params tm_default_sampling(void *m) {
    (void)m;
    pt_sampling_params p = {0};
    p.temperature = 1;
    p.top_p = 1;
    p.repetition_penalty = 1;
    p.repeat_last_n = 64;
    return p;
}

static pt_status tm_tokenize(void *m, const char *text, size_t len, int add_special, int32_t **ids,
                             size_t *n) {
    (void)m;
    int32_t *v = malloc((len + 2) * sizeof *v);
    if (!v) return pt_error(PT_ERR_NOMEM, "oom");
    size_t k = 0;
    if (add_special) v[k++] = TM_BOS;
    for (size_t i = 0; i < len;) {
        if (len - i >= 10 && !memcmp(text + i, "<|im_end|>", 10)) {
            v[k++] = TM_EOS;
            i += 10;
        } else if (len - i >= 12 && !memcmp(text + i, "<|im_start|>", 12)) {
            v[k++] = TM_START;
            i += 12;
        } else v[k++] = (unsigned char)text[i++];
    }
    *ids = v;
    *n = k;
    return PT_OK;
}

static pt_status tm_detokenize(void *m, const int32_t *ids, size_t n, int skip, char **text) {
    (void)m;
    char *s = malloc(n * 12 + 1);
    if (!s) return pt_error(PT_ERR_NOMEM, "oom");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= TM_VOCAB) {
            free(s);
            return pt_error(PT_ERR_RANGE, "token %d outside the vocabulary", ids[i]);
        }
        const char *sp = tm_special(ids[i]);
        if (sp) {
            if (!skip) {
                memcpy(s + k, sp, strlen(sp));
                k += strlen(sp);
            }
        } else s[k++] = (char)ids[i];
    }
    s[k] = 0;
    *text = s;
    return PT_OK;
}

static pt_status tm_token_text(void *m, int32_t id, int skip, char **text) {
    return tm_detokenize(m, &id, 1, skip, text);
}

static void tm_add_str(pt_sbuf *b, const char *s) { pt_sbuf_adds(b, s ? s : ""); }

static pt_status tm_chat_render(void *m, const char *messages_json, int add_gen, const char *extra_json,
                                char **out) {
    (void)m;
    cJSON *msgs = cJSON_Parse(messages_json), *extra = extra_json ? cJSON_Parse(extra_json) : NULL;
    if (!cJSON_IsArray(msgs)) {
        cJSON_Delete(msgs);
        cJSON_Delete(extra);
        return pt_error(PT_ERR_FORMAT, "messages: expected an array");
    }
    pt_sbuf b = {0};
    const cJSON *tools = extra ? cJSON_GetObjectItem(extra, "tools") : NULL;
    if (tools) {
        char *t = cJSON_PrintUnformatted(tools);
        tm_add_str(&b, "<|im_start|>system\n# Tools\n");
        tm_add_str(&b, t);
        tm_add_str(&b, "<|im_end|>\n");
        free(t);
    }
    for (const cJSON *msg = msgs->child; msg; msg = msg->next) {
        const cJSON *role = cJSON_GetObjectItem(msg, "role"), *content = cJSON_GetObjectItem(msg, "content");
        tm_add_str(&b, "<|im_start|>");
        tm_add_str(&b, cJSON_IsString(role) ? role->valuestring : "?");
        tm_add_str(&b, "\n");
        tm_add_str(&b, cJSON_IsString(content) ? content->valuestring : "");
        const cJSON *calls = cJSON_GetObjectItem(msg, "tool_calls");
        for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
            char *t = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "function"));
            tm_add_str(&b, "<tool_call>\n");
            tm_add_str(&b, t);
            tm_add_str(&b, "\n</tool_call>");
            free(t);
        }
        tm_add_str(&b, "<|im_end|>\n");
    }
    if (add_gen) tm_add_str(&b, "<|im_start|>assistant\n");
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    *out = b.data ? b.data : strdup("");
    return PT_OK;
}

static pt_status tm_detok_create(void *m, int skip, void **out) {
    (void)m;
    tm_detok *d = calloc(1, sizeof *d);
    if (!d) return pt_error(PT_ERR_NOMEM, "oom");
    d->skip = skip;
    *out = d;
    return PT_OK;
}

/* Holds bytes of an incomplete UTF-8 sequence, like a real detokenizer. */
static pt_status tm_detok_push(void *dp, int32_t id, const char **text, size_t *len) {
    tm_detok *d = dp;
    *text = d->out;
    *len = 0;
    const char *sp = tm_special(id);
    if (sp) {
        if (!d->skip) {
            strcpy(d->out, sp);
            *len = strlen(sp);
        }
        return PT_OK;
    }
    unsigned char c = (unsigned char)id;
    if (d->have == 0) {
        d->need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    }
    d->buf[d->have++] = (char)c;
    if (d->have >= d->need) {
        memcpy(d->out, d->buf, (size_t)d->have);
        *len = (size_t)d->have;
        d->have = 0;
    }
    return PT_OK;
}

static pt_status tm_detok_flush(void *dp, const char **text, size_t *len) {
    tm_detok *d = dp;
    memcpy(d->out, d->buf, (size_t)d->have);
    *text = d->out;
    *len = (size_t)d->have;
    d->have = 0;
    return PT_OK;
}

static void tm_detok_free(void *d) { free(d); }

static pt_status tm_session_create(void *mp, int n_ctx, void **out) {
    tm_model *m = mp;
    tm_session *s = calloc(1, sizeof *s);
    if (!s) return pt_error(PT_ERR_NOMEM, "oom");
    s->m = m;
    s->n_ctx = n_ctx > 0 ? n_ctx : m->max_ctx;
    s->tok = malloc((size_t)s->n_ctx * sizeof *s->tok);
    atomic_fetch_add(&m->sessions_created, 1);
    *out = s;
    return PT_OK;
}
static void tm_session_free(void *sp) {
    tm_session *s = sp;
    if (!s) return;
    free(s->tok);
    free(s);
}
static int tm_session_n_ctx(void *s) { return ((tm_session *)s)->n_ctx; }
static size_t tm_session_n_tokens(void *s) { return ((tm_session *)s)->n; }
static const int32_t *tm_session_tokens(void *s) { return ((tm_session *)s)->tok; }
static size_t tm_session_bytes(void *s) { return (size_t)((tm_session *)s)->n_ctx * 1024; }
static pt_status tm_session_truncate(void *sp, size_t n) {
    tm_session *s = sp;
    if (n < s->n) s->n = n;
    return PT_OK;
}
static pt_status tm_session_prompt(void *sp, const int32_t *ids, size_t n) {
    tm_session *s = sp;
    if (s->n + n > (size_t)s->n_ctx) return pt_error(PT_ERR_RANGE, "context full");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= TM_VOCAB) return pt_error(PT_ERR_RANGE, "token %d", ids[i]);
    }
    memcpy(s->tok + s->n, ids, n * sizeof *ids);
    s->n += n;
    atomic_fetch_add(&s->m->prompt_tokens_run, (long)n);
    return PT_OK;
}

/* Finds `pat` (bytes) in the token history, last occurrence at or after `from`. */
static long tm_find_last(const tm_session *s, size_t from, const char *pat) {
    size_t pl = strlen(pat);
    for (size_t i = s->n >= pl ? s->n - pl + 1 : 0; i-- > from;) {
        size_t k = 0;
        while (k < pl && s->tok[i + k] == (unsigned char)pat[k]) k++;
        if (k == pl) return (long)i;
    }
    return -1;
}

/* Samples taken with and without the chosen token's log-probability asked for (the server sets
 * pt_sampling_params.no_logprob for replies without logprobs). */
static int tm_samples_lp, tm_samples_nolp;

static pt_status tm_session_sample(void *sp, const pt_sampling_params *p, const uint8_t *allowed,
                                   pt_token_info *out) {
    tm_session *s = sp;
    const int nolp = p->no_logprob && p->n_logprobs == 0;
    __atomic_fetch_add(nolp ? &tm_samples_nolp : &tm_samples_lp, 1, __ATOMIC_RELAXED);
    int32_t want = -1;
    /* the assistant turn starts after the last <|im_start|>assistant\n */
    long turn = -1;
    for (size_t i = s->n; i-- > 0;)
        if (s->tok[i] == TM_START) {
            turn = (long)i;
            break;
        }
    int chat = turn >= 0 && tm_find_last(s, (size_t)turn, "assistant\n") == turn + 1;
    if (tm_find_last(s, 0, "SLOW") >= 0) nanosleep(&(struct timespec){0, 5000000}, NULL);
    if (chat) {
        size_t start = (size_t)turn + 11, pos = s->n - start;
        long cmd = -1, loop = -1, fail = -1;
        cmd = tm_find_last(s, 0, "SAY:");
        loop = tm_find_last(s, 0, "LOOP:");
        fail = tm_find_last(s, 0, "FAIL:");
        if (fail >= 0 && fail < (long)start) {
            int n = 0;
            for (size_t i = (size_t)fail + 5; i < s->n && s->tok[i] >= '0' && s->tok[i] <= '9'; i++)
                n = n * 10 + (s->tok[i] - '0');
            if ((int)pos >= n) return pt_error(PT_ERR_INTERNAL, "scripted failure after %d tokens", n);
            want = 'x';
        } else if (loop >= 0 && loop < (long)start && loop > cmd) {
            size_t a = (size_t)loop + 5, e = a;
            while (e < start && s->tok[e] != TM_EOS) e++;
            want = e > a ? s->tok[a + pos % (e - a)] : 'x';
        } else if (cmd >= 0 && cmd < (long)start) {
            size_t a = (size_t)cmd + 4, e = a;
            while (e < start && s->tok[e] != TM_EOS) e++;
            want = a + pos < e ? s->tok[a + pos] : TM_EOS;
        } else {
            const char *hello = "Hello from petrel.";
            want = pos < strlen(hello) ? (unsigned char)hello[pos] : TM_EOS;
        }
    } else {
        want = (unsigned char)"abcdefghij "[s->n % 11];
    }
    if (allowed && !allowed[want]) {
        int32_t pick = -1;
        if (allowed[TM_EOS]) pick = TM_EOS;
        const char *closers = "\"}]";
        for (int i = 0; pick < 0 && closers[i]; i++)
            if (allowed[(unsigned char)closers[i]]) pick = (unsigned char)closers[i];
        for (int c = 33; pick < 0 && c < 127; c++)
            if (allowed[c]) pick = c;
        for (int c = 0; pick < 0 && c < TM_VOCAB; c++)
            if (allowed[c]) pick = c;
        if (pick < 0) return pt_error(PT_ERR_INVALID_ARG, "mask allows nothing");
        want = pick;
    }
    memset(out, 0, sizeof *out);
    out->id = want;
    out->logprob = nolp ? 0.0f : -0.25f; /* as the engine: not computed when not asked for */
    out->n_top = p->n_logprobs > 0 ? 2 : 0;
    out->top_ids[0] = want;
    out->top_logprobs[0] = -0.25f;
    out->top_ids[1] = want == 'z' ? 'y' : 'z';
    out->top_logprobs[1] = -1.5f;
    return PT_OK;
}


/* The engine's batched sampling hook (a GPU sampling turn): takes every
 * other row (i even), so the scheduler's split between this call and the
 * per-slot sampling pool is exercised; rows taken report their errors in
 * err[i] as the pool would. */
static void tm_session_sample_many(void *const *s, const pt_sampling_params *const *sp, pt_token_info *o,
                                   pt_status *st, char (*err)[512], uint8_t *done, int n) {
    for (int i = 0; i < n; i++) {
        done[i] = i % 2 == 0;
        if (!done[i]) continue;
        st[i] = tm_session_sample(s[i], sp[i], NULL, &o[i]);
        if (st[i] != PT_OK) snprintf(err[i], sizeof err[i], "%s", pt_last_error());
    }
}

static void tm_engine(pt_srv_engine *e, tm_model *m) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->model_id = tm_model_id;
    e->vocab_size = tm_vocab;
    e->max_ctx = tm_max_ctx;
    e->is_eos = tm_is_eos;
    e->has_tokenizer = tm_has_tok;
    e->default_sampling = tm_default_sampling;
    e->tokenize = tm_tokenize;
    e->detokenize = tm_detokenize;
    e->token_text = tm_token_text;
    e->chat_render = tm_chat_render;
    e->detok_create = tm_detok_create;
    e->detok_push = tm_detok_push;
    e->detok_flush = tm_detok_flush;
    e->detok_free = tm_detok_free;
    e->session_create = tm_session_create;
    e->session_free = tm_session_free;
    e->session_n_ctx = tm_session_n_ctx;
    e->session_n_tokens = tm_session_n_tokens;
    e->session_tokens = tm_session_tokens;
    e->session_truncate = tm_session_truncate;
    e->session_prompt = tm_session_prompt;
    e->session_sample = tm_session_sample;
    e->session_sample_many = tm_session_sample_many;
    e->session_bytes = tm_session_bytes;
}

#endif
