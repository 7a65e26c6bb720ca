/* The server's engine table over the public API (include/petrel.h): each
 * entry forwards to the pt_* call of the same meaning.
 *
 * Adaptations: memory the API returns passes through (pt_free is free());
 * session_bytes, which the API does not report, is measured once, as the
 * address space the first session added (see e_session_create), and never
 * taken below config.json's KV cache at f32; and a reused session is made to
 * re-derive its RNG from each new request's seed (see e_sample).
 */
#include "server/engine.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"
#include "runtime/batch.h" /* pt_session_decode_rows */
#include "runtime/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct pm {
    pt_model *m;
    size_t kv_bytes_per_token; /* estimate; 0 if config.json could not be read */
    size_t session_bytes;      /* measured when the first session is made; 0 = not yet */
} pm;

typedef struct ps {
    pt_session *s;
    size_t bytes;
    int new_job;        /* set by truncate (every job starts with one) */
    int seeded;
    uint64_t last_seed; /* the seed of the previous sample call */
} ps;

#define M(x) (((pm *)(x))->m)
#define S(x) (((ps *)(x))->s)

static const char *e_model_id(void *m) { return pt_model_id(M(m)); }
static int e_vocab(void *m) { return pt_model_vocab_size(M(m)); }
static int e_max_ctx(void *m) { return pt_model_max_ctx(M(m)); }
static int e_is_eos(void *m, int32_t id) { return pt_model_is_eos(M(m), id); }
static int e_has_tok(void *m) { return pt_model_has_tokenizer(M(m)); }
static pt_sampling_params e_sampling(void *m) { return pt_sampling_default_params(M(m)); }

static pt_status e_tokenize(void *m, const char *t, size_t n, int sp, int32_t **ids, size_t *k) {
    return pt_tokenize(M(m), t, n, sp, ids, k);
}
static pt_status e_detokenize(void *m, const int32_t *ids, size_t n, int skip, char **t) {
    return pt_detokenize(M(m), ids, n, skip, t);
}
static pt_status e_token_text(void *m, int32_t id, int skip, char **t) {
    /* a control token (one that decodes to nothing without specials) has no
     * text for the constrained-decoding mask */
    if (skip) {
        char *d = NULL;
        pt_status st = pt_detokenize(M(m), &id, 1, 1, &d);
        if (st != PT_OK) return st;
        int empty = d[0] == 0;
        pt_free(d);
        if (empty) {
            *t = strdup("");
            return *t ? PT_OK : pt_error(PT_ERR_NOMEM, "out of memory");
        }
    }
    return pt_token_text(M(m), id, t);
}
static pt_status e_render(void *m, const char *msgs, int gen, const char *extra, char **out) {
    return pt_chat_render(M(m), msgs, gen, extra, out);
}
static pt_status e_detok_create(void *m, int skip, void **out) {
    return pt_detokenizer_create(M(m), skip, (pt_detokenizer **)out);
}
static pt_status e_detok_push(void *d, int32_t id, const char **t, size_t *n) {
    return pt_detokenizer_push(d, id, t, n);
}
static pt_status e_detok_flush(void *d, const char **t, size_t *n) { return pt_detokenizer_flush(d, t, n); }
static void e_detok_free(void *d) {
    pt_detokenizer *p = d;
    pt_detokenizer_free(&p);
}

/* The process's address-space size in bytes (/proc/self/statm), 0 if unknown. */
static size_t vm_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f) return 0;
    if (fscanf(f, "%lu", &pages) != 1) pages = 0;
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static pt_status e_session_create(void *m, int n_ctx, void **out) {
    pm *h = m;
    ps *w = calloc(1, sizeof *w);
    if (!w) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_session_params sp = pt_session_default_params();
    sp.n_ctx = n_ctx;
    /* The first session is made before the HTTP threads exist, so the growth
     * of the address space across its creation is its memory (KV cache plus
     * activation and logit buffers); every session of the server has the same
     * context, hence the same size. */
    size_t before = h->session_bytes ? 0 : vm_bytes();
    pt_status st = pt_session_create(h->m, &sp, &w->s);
    if (st != PT_OK) {
        free(w);
        return st;
    }
    if (!h->session_bytes) {
        size_t after = vm_bytes();
        size_t kv = h->kv_bytes_per_token * (size_t)pt_session_n_ctx(w->s);
        h->session_bytes = after > before && after - before > kv ? after - before : kv;
        if (!h->session_bytes) h->session_bytes = 1;
    }
    w->bytes = h->session_bytes;
    *out = w;
    return PT_OK;
}
static void e_session_free(void *s) {
    ps *w = s;
    if (!w) return;
    pt_session_free(&w->s);
    free(w);
}
static int e_n_ctx(void *s) { return pt_session_n_ctx(S(s)); }
static size_t e_n_tokens(void *s) { return pt_session_n_tokens(S(s)); }
static const int32_t *e_tokens(void *s) { return pt_session_tokens(S(s)); }
static pt_status e_truncate(void *s, size_t n) {
    ((ps *)s)->new_job = 1;
    return pt_session_truncate(S(s), n);
}
static pt_status e_prompt(void *s, const int32_t *ids, size_t n) { return pt_session_prompt(S(s), ids, n); }
static pt_status e_decode_batch(void *const *s, const int32_t *ids, int n) {
    pt_session *ss[64];
    if (n > 64) return pt_error(PT_ERR_INVALID_ARG, "decode batch of %d sessions (at most 64)", n);
    for (int i = 0; i < n; i++) ss[i] = S(s[i]);
    return pt_session_decode_batch(ss, ids, n);
}
static pt_status e_decode_rows(void *const *s, const int32_t *ids, const int *counts, int n) {
    pt_session *ss[64];
    if (n > 64) return pt_error(PT_ERR_INVALID_ARG, "batched step of %d sessions (at most 64)", n);
    for (int i = 0; i < n; i++) ss[i] = S(s[i]);
    return pt_session_decode_rows(ss, ids, counts, n);
}
/* The session re-derives its RNG only when the seed changes, so a reused
 * session given the same seed as its previous job would continue that job's
 * stream: two identical seeded requests would differ. One throwaway draw
 * under another seed (sampling does not append a token) makes the real call
 * re-derive the RNG from the request's seed (and only that: a second
 * throwaway before it changes nothing the real call sees). */
static pt_status reseed(ps *w, const pt_sampling_params *sp, const uint8_t *allowed) {
    if (!(w->new_job && w->seeded && w->last_seed == sp->seed)) return PT_OK;
    pt_sampling_params other = *sp;
    other.seed = sp->seed ^ 0x5bd1e995u;
    pt_token_info scratch;
    return pt_session_sample(w->s, &other, allowed, &scratch);
}
/* After the job's first real draw. */
static void seeded(ps *w, const pt_sampling_params *sp) {
    w->new_job = 0;
    w->seeded = 1;
    w->last_seed = sp->seed;
}
static pt_status e_sample(void *s, const pt_sampling_params *sp, const uint8_t *allowed, pt_token_info *o) {
    ps *w = s;
    PT_TRY(reseed(w, sp, allowed));
    seeded(w, sp);
    return pt_session_sample(w->s, sp, allowed, o);
}
/* The rows of a turn at once (GPU sampling): the same per-session seeding
 * as e_sample, then runtime/session.c's batched GPU sampling. */
static void e_sample_many(void *const *s, const pt_sampling_params *const *sp, pt_token_info *o, pt_status *st,
                          char (*err)[512], uint8_t *done, int n) {
    pt_session *ss[64] = {0};
    for (int i = 0; i < n; i++) done[i] = 0;
    if (n > 64) return;
    int any = 0;
    for (int i = 0; i < n; i++) any |= ((ps *)s[i])->s->gpu;
    if (!any) return; /* no session samples on the GPU: session_sample per row */
    for (int i = 0; i < n; i++) {
        ss[i] = ((ps *)s[i])->s;
        if (reseed(s[i], sp[i], NULL) != PT_OK) return; /* session_sample reports it */
    }
    pt_session_sample_gpu_rows(ss, sp, o, st, err, done, n);
    for (int i = 0; i < n; i++)
        if (done[i]) seeded(s[i], sp[i]);
}
/* The pipelined turn: the same per-session seeding (so a turn that then
 * runs unpipelined draws the same), then runtime/batch.c's
 * pt_session_rows_ahead. */
static pt_status e_rows_ahead(void *const *dec, const pt_sampling_params *const *sp, const uint8_t *norow, int nd,
                              void *const *prs, const int32_t *pids, const int *pcnt, int np, pt_token_info *o,
                              pt_status *st, char (*err)[512], uint8_t *held) {
    pt_session *d[64], *p[64];
    if (nd < 1 || nd > 64 || np < 0 || np > 64)
        return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: %d + %d sessions", nd, np);
    for (int i = 0; i < np; i++) p[i] = S(prs[i]);
    for (int i = 0; i < nd; i++) {
        d[i] = ((ps *)dec[i])->s;
        PT_TRY(reseed(dec[i], sp[i], NULL));
    }
    PT_TRY(pt_session_rows_ahead(d, sp, norow, nd, p, pids, pcnt, np, o, st, err, held));
    for (int i = 0; i < nd; i++) seeded(dec[i], sp[i]);
    return PT_OK;
}
static size_t e_bytes(void *s) { return ((ps *)s)->bytes; }

/* KV bytes per token at f32: sum over layers of 2 * kv_heads * head_dim * 4. */
static size_t estimate_kv_per_token(const char *dir) {
    cJSON *cfg = NULL;
    char *path = dir ? pt_path_join(dir, "config.json") : NULL;
    if (!path) return 0;
    pt_status st = pt_json_load_file(path, 0, &cfg);
    free(path);
    if (st != PT_OK) return 0;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    const cJSON *c = cJSON_IsObject(tc) ? tc : cfg;
    int64_t layers = 0, heads = 0, kv = 0, hd = 0, hidden = 0;
    pt_json_get_i64(c, "num_hidden_layers", 1, 1 << 20, &layers, "config");
    pt_json_get_i64(c, "num_attention_heads", 1, 1 << 20, &heads, "config");
    if (pt_json_get_i64(c, "num_key_value_heads", 1, 1 << 20, &kv, "config") != PT_OK) kv = heads;
    if (pt_json_get_i64(c, "head_dim", 1, 1 << 20, &hd, "config") != PT_OK &&
        pt_json_get_i64(c, "hidden_size", 1, 1 << 30, &hidden, "config") == PT_OK && heads > 0)
        hd = hidden / heads;
    cJSON_Delete(cfg);
    pt_clear_error();
    return (size_t)(layers * 2 * kv * hd * 4);
}

void pt_srv_engine_release(pt_srv_engine *e) {
    free(e->model);
    e->model = NULL;
}

pt_status pt_srv_engine_from_model(pt_srv_engine *e, pt_model *model, const char *dir) {
    memset(e, 0, sizeof *e);
    pm *holder = calloc(1, sizeof *holder);
    if (!holder) return pt_error(PT_ERR_NOMEM, "out of memory");
    holder->m = model;
    holder->kv_bytes_per_token = estimate_kv_per_token(dir);
    e->model = holder;
    e->model_id = e_model_id;
    e->vocab_size = e_vocab;
    e->max_ctx = e_max_ctx;
    e->is_eos = e_is_eos;
    e->has_tokenizer = e_has_tok;
    e->default_sampling = e_sampling;
    e->tokenize = e_tokenize;
    e->detokenize = e_detokenize;
    e->token_text = e_token_text;
    e->chat_render = e_render;
    e->detok_create = e_detok_create;
    e->detok_push = e_detok_push;
    e->detok_flush = e_detok_flush;
    e->detok_free = e_detok_free;
    e->session_create = e_session_create;
    e->session_free = e_session_free;
    e->session_n_ctx = e_n_ctx;
    e->session_n_tokens = e_n_tokens;
    e->session_tokens = e_tokens;
    e->session_truncate = e_truncate;
    e->session_prompt = e_prompt;
    e->session_decode_batch = e_decode_batch;
    e->session_decode_rows = e_decode_rows;
    e->session_sample = e_sample;
    e->session_sample_many = e_sample_many;
    e->session_rows_ahead = e_rows_ahead;
    e->session_bytes = e_bytes;
    /* the CUDA backend names itself "cuda: <device>" (pt_model_backend_name) */
    const int cuda = strncmp(pt_model_backend_name(model), "cuda", 4) == 0;
    e->short_prompt_piece = cuda ? 8 : 0;
    e->prompt_rows_max = cuda ? 64 : 0;
    e->pipeline = cuda;
    return PT_OK;
}
