/* The inference thread, its slots and the prompt cache (see sched.h). */
#include "server/sched.h"

#include "base/error.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "server/stop.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A prompt's schedule is a function of the prompt alone (prompt_plan), never
 * of what else runs or of the prompt cache, because the prefill path rounds
 * differently per chunk (a GEMM's rows depend on its row count; the prompt's
 * attention differs from a decode row's): a request's reply must be the same
 * alone, in company and from a reused prefix (docs/batching.md "Long
 * prompts"). So a long prompt runs in whole PREFILL_BLOCK-token blocks at
 * fixed positions (0, 256, 512, ...), each one session_prompt call, then its
 * tail (fewer than PREFILL_BLOCK tokens) as rows (below) or as one chunk.
 * While other slots are generating one block runs per turn, so a long prompt
 * delays their next token by one block at most; alone up to
 * PREFILL_TURN_ALONE tokens of blocks per turn (the same blocks, fewer
 * turns), still bounded so that a disconnect or a new request is noticed
 * between them. */
#define PREFILL_BLOCK 256
#define PREFILL_TURN_ALONE 1024
/* A prompt of at most rows_max tokens (the engine's prompt_rows_max, or
 * PETREL_PROMPT_ROWS, at most PROMPT_ROWS_MAX), and a long prompt's tail of
 * at most rows_max tokens, run as rows of the batched steps (engine
 * session_decode_rows): every row computed as a decode row, so the result
 * does not depend on the others in the step nor on how the rows are cut into
 * steps, and the prompts of requests that join together share the weight
 * reads with each other and with the running streams. Longer prompts take
 * the prefill path above for their blocks (a GEMM over a block is cheaper
 * per token). Per step: prompt_budget. */
#define PROMPT_ROWS_MAX 1024
#define PROMPT_STEP_ROWS 128
#define PROMPT_ROWS_MIN 32
/* step_ids: one step's ids, at most 64 sessions of which 64 decode rows and
 * the prompt budget (PROMPT_STEP_ROWS or PROMPT_ROWS_MIN, plus the rounding
 * to 32) */
#define STEP_IDS_CAP (64 + PROMPT_STEP_ROWS + PROMPT_ROWS_MIN + 32)

double pt_srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ jobs */

pt_srv_job *pt_srv_job_new(void) {
    pt_srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancelled, 0);
    j->stop_index = -1;
    return j;
}

void pt_srv_job_release(pt_srv_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->stop);
    pt_jschema_free(&j->schema);
    pt_sbuf_free(&j->text);
    free(j->toks);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void pt_srv_job_cancel(pt_srv_job *j) { atomic_store(&j->cancelled, 1); }

/* -------------------------------------------------------------- scheduler */

typedef struct slot {
    pt_srv_job *job; /* NULL = free */
    void *session;
    size_t n_prompted; /* prompt tokens already in the session */
    void *detok;
    pt_stop stop;
    pt_jsm *jsm;      /* constrained decoding state, or NULL */
    uint8_t *mask;    /* [vocab] */
    int max_tokens;
    size_t blocks_end;  /* prompt_plan: the prompt's positions below it run as prefill blocks, */
    size_t rows_from;   /* from it as rows (n_prompt: its tail runs as one chunk) */
    uint64_t order;     /* admission order: older requests' prompt rows go first */
    int pending;        /* a sampled token waits for this turn's batched decode step */
    int32_t pending_id;
    /* this turn's sampling (run for all slots at once, in parallel) */
    const uint8_t *allowed; /* the constrained-decoding mask, or NULL */
    pt_token_info tok;
    pt_status sample_st;
    char sample_err[512];
    int sampled;         /* this turn's token came from sample_many */
    /* a pipelined turn (turn_ahead): */
    int held;            /* this turn's token (or ahead_rows prompt rows) already ran in the step ahead */
    int ahead_rows;      /* prompt rows of this slot in the step ahead */
} slot;

typedef struct idle_session {
    void *session;
    uint64_t stamp;
    /* how the session's positions were computed: prefill blocks below
     * blocks_end, decode rows from rows_from (generated tokens included),
     * a prompt's tail chunk between them (slot.blocks_end/rows_from) */
    size_t blocks_end, rows_from;
} idle_session;

struct pt_srv_sched {
    pt_srv_engine *e;
    int n_parallel, max_queue, n_ctx;
    size_t cache_bytes;

    pthread_t thread;
    pthread_mutex_t mu; /* guards queue, stop, stats counters below */
    pthread_cond_t cv;
    int stopping;
    pt_srv_job **queue; /* FIFO [q_cap] ring */
    int q_head, q_len, q_cap;

    /* inference-thread state */
    slot *slots;
    slot **to_sample;   /* [n_parallel] the slots sampling this turn */
    slot **to_sample_tmp; /* [n_parallel] sample_many's reordering */
    slot **to_prompt;   /* [n_parallel] slots with prompt rows to run, oldest first */
    int32_t step_ids[STEP_IDS_CAP];
    uint64_t n_admitted;
    int rows_max;       /* prompts (and long prompts' tails) of at most this many tokens run as rows (0: none) */
    pt_pool *pool;      /* samples the slots of a turn in parallel */
    idle_session *idle; /* [cap_idle] */
    int n_idle, cap_idle;
    uint64_t clock;
    pt_vocab_index vocab;
    int vocab_ready;
    int spare_failed;

    /* stats (under mu) */
    int n_active;
    size_t idle_bytes;
    uint64_t cache_hits, cache_tokens_reused, prompt_tokens, generated_tokens;
    uint64_t batch_hist[PT_SRV_BATCH_BUCKETS + 1], batch_steps, batch_rows; /* decode steps by batch size */
    uint64_t prompt_row_steps, prompt_rows; /* steps that carried prompt rows, and those rows */
    uint64_t turns;     /* turns with slots to run, and their seconds by phase (PT_SRV_PHASE_*) */
    double phase_s[3];
    uint64_t piped_turns; /* turns whose step ran ahead (turn_ahead) */
    int pipeline;       /* turns are pipelined (engine session_rows_ahead; PETREL_SERVE_PIPELINE) */
};

static void job_finish(pt_srv_job *j, pt_srv_finish f, const char *err) {
    pthread_mutex_lock(&j->mu);
    if (j->finish == PT_SRV_RUNNING) {
        j->finish = f;
        if (err) snprintf(j->error, sizeof j->error, "%s", err);
        j->t_done = pt_srv_now();
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static void evict_idle(pt_srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int active = s->n_active;
    pthread_mutex_unlock(&s->mu);
    while (s->n_idle > 0 && s->n_idle + active > s->n_parallel) {
        size_t bytes = 0;
        for (int i = 0; i < s->n_idle; i++) bytes += s->e->session_bytes(s->idle[i].session);
        if (bytes <= s->cache_bytes) break;
        int lru = 0;
        for (int i = 1; i < s->n_idle; i++)
            if (s->idle[i].stamp < s->idle[lru].stamp) lru = i;
        s->e->session_free(s->idle[lru].session);
        s->idle[lru] = s->idle[--s->n_idle];
    }
    size_t bytes = 0;
    for (int i = 0; i < s->n_idle; i++) bytes += s->e->session_bytes(s->idle[i].session);
    pthread_mutex_lock(&s->mu);
    s->idle_bytes = bytes;
    pthread_mutex_unlock(&s->mu);
}

static pt_status build_vocab(pt_srv_sched *s) {
    if (s->vocab_ready) return PT_OK;
    int n = s->e->vocab_size(s->e->model);
    char **text = calloc((size_t)n, sizeof(char *));
    uint8_t *eos = calloc((size_t)n, 1);
    if (!text || !eos) {
        free(text);
        free(eos);
        return pt_error(PT_ERR_NOMEM, "out of memory indexing the vocabulary");
    }
    for (int i = 0; i < n; i++) {
        eos[i] = (uint8_t)(s->e->is_eos(s->e->model, i) != 0);
        if (s->e->token_text(s->e->model, i, 1, &text[i]) != PT_OK || !text[i]) {
            for (int k = 0; k < i; k++) free(text[k]);
            free(text);
            free(eos);
            return pt_error_prefix(PT_ERR_INTERNAL, "token %d", i);
        }
    }
    pt_status st = pt_vocab_index_build(&s->vocab, n, text, eos);
    free(eos);
    if (st == PT_OK) s->vocab_ready = 1;
    return st;
}

static void slot_release(pt_srv_sched *s, slot *sl, pt_srv_finish f, const char *err) {
    pt_srv_job *j = sl->job;
    /* release held-back text at a natural end */
    if (f == PT_SRV_EOS || f == PT_SRV_LENGTH) {
        pt_sbuf tail = {0};
        const char *t;
        size_t n;
        if (sl->detok && s->e->detok_flush(sl->detok, &t, &n) == PT_OK && n)
            pt_stop_feed(&sl->stop, t, n, &tail);
        pt_stop_flush(&sl->stop, &tail);
        if (tail.len) {
            pthread_mutex_lock(&j->mu);
            pt_sbuf_add(&j->text, tail.data, tail.len);
            pthread_mutex_unlock(&j->mu);
        }
        pt_sbuf_free(&tail);
    }
    job_finish(j, f, err);
    if (sl->detok) s->e->detok_free(sl->detok);
    pt_stop_free(&sl->stop);
    free(sl->jsm);
    free(sl->mask);
    if (sl->session) {
        if (f == PT_SRV_ERROR) s->e->session_truncate(sl->session, 0);
        if (s->n_idle == s->cap_idle) {
            int cap = s->cap_idle * 2;
            idle_session *p = realloc(s->idle, (size_t)cap * sizeof *p);
            if (p) {
                s->idle = p;
                s->cap_idle = cap;
            }
        }
        if (s->n_idle < s->cap_idle) {
            const int emptied = f == PT_SRV_ERROR; /* truncated to nothing above */
            s->idle[s->n_idle++] = (idle_session){sl->session, ++s->clock, emptied ? 0 : sl->blocks_end,
                                                  emptied ? 0 : sl->rows_from};
        }
        else s->e->session_free(sl->session);
    }
    memset(sl, 0, sizeof *sl);
    pthread_mutex_lock(&s->mu);
    s->n_active--;
    pthread_mutex_unlock(&s->mu);
    pt_srv_job_release(j);
    evict_idle(s);
}

/* The schedule of a prompt of n tokens (the whole prompt, a cached prefix
 * included): whole PREFILL_BLOCK blocks through the prefill path up to
 * *blocks_end, then rows from *rows_from (n when the tail runs as one
 * chunk). A prompt of at most rows_max tokens runs as rows entirely. */
static void prompt_plan(const pt_srv_sched *s, size_t n, size_t *blocks_end, size_t *rows_from) {
    const size_t rmax = (size_t)s->rows_max;
    if (rmax > 0 && n <= rmax) {
        *blocks_end = *rows_from = 0;
        return;
    }
    *blocks_end = n / PREFILL_BLOCK * PREFILL_BLOCK;
    *rows_from = rmax > 0 && n - *blocks_end <= rmax ? *blocks_end : n;
}

/* How many leading tokens of idle session `is` (sharing lcp tokens with a
 * prompt of n tokens planned as fn/rn, prompt_plan) a new request can keep:
 * with prompt rows (rows_max > 0) only those the request would compute the
 * same way from scratch — the prefill blocks both have, whole, and past
 * them the rows both run as rows — so a reused prefix gives a cold start's
 * bits. Without prompt rows (the CPU: recomputing is expensive there) the
 * whole shared prefix, whose rest then runs in other chunks than a cold
 * start would (rounding differences; docs/server.md). At least one prompt
 * token is always left to run, so logits exist. */
static size_t reusable(const pt_srv_sched *s, const idle_session *is, size_t lcp, size_t n, size_t fn, size_t rn) {
    size_t keep = lcp < n ? lcp : n - 1;
    if (s->rows_max <= 0) return keep;
    const size_t f = is->blocks_end < fn ? is->blocks_end : fn;
    if (keep >= f && is->blocks_end == fn && is->rows_from <= is->blocks_end && rn <= fn)
        return keep; /* past the common blocks both sides run rows: any cut is exact */
    if (keep > f) keep = f;
    return keep / PREFILL_BLOCK * PREFILL_BLOCK; /* a block is reused whole or recomputed whole */
}

/* Binds a queued job to a free slot: picks a session (prompt cache), sets up
 * detokenizer, stop strings and the constrained-decoding state. */
static void slot_start(pt_srv_sched *s, slot *sl, pt_srv_job *j) {
    memset(sl, 0, sizeof *sl);
    sl->job = j;
    pt_stop_init(&sl->stop, (const char *const *)j->stop, j->n_stop);
    prompt_plan(s, j->n_prompt, &sl->blocks_end, &sl->rows_from);
    int best = -1;
    size_t best_keep = 0;
    for (int i = 0; i < s->n_idle; i++) {
        void *ss = s->idle[i].session;
        size_t l = lcp(s->e->session_tokens(ss), s->e->session_n_tokens(ss), j->prompt, j->n_prompt);
        size_t k = reusable(s, &s->idle[i], l, j->n_prompt, sl->blocks_end, sl->rows_from);
        if (best < 0 || k > best_keep || (k == best_keep && s->idle[i].stamp > s->idle[best].stamp)) {
            best = i;
            best_keep = k;
        }
    }
    char err[512];
    pt_status st = PT_OK;
    size_t idle_bytes = 0, one = 0;
    for (int i = 0; i < s->n_idle; i++) {
        size_t b = s->e->session_bytes(s->idle[i].session);
        idle_bytes += b;
        if (b > one) one = b;
    }
    int spare = -1;
    for (int i = 0; i < s->n_idle; i++)
        if (s->e->session_n_tokens(s->idle[i].session) == 0) spare = i;
    if (best >= 0 && best_keep > 0) {
        sl->session = s->idle[best].session;
        s->idle[best] = s->idle[--s->n_idle];
    } else if (spare >= 0) {
        /* an empty session made ahead of time (make_spare) */
        best_keep = 0;
        sl->session = s->idle[spare].session;
        s->idle[spare] = s->idle[--s->n_idle];
    } else if (s->n_idle > 0 && idle_bytes + one > s->cache_bytes) {
        /* nothing shared and no room to keep every idle prefix: reuse the
         * least recently used session */
        int lru = 0;
        for (int i = 1; i < s->n_idle; i++)
            if (s->idle[i].stamp < s->idle[lru].stamp) lru = i;
        best_keep = 0;
        sl->session = s->idle[lru].session;
        s->idle[lru] = s->idle[--s->n_idle];
    } else {
        /* a fresh session keeps the idle ones' prefixes for later requests */
        st = s->e->session_create(s->e->model, s->n_ctx, &sl->session);
        best_keep = 0;
    }
    pthread_mutex_lock(&s->mu);
    s->n_active++;
    pthread_mutex_unlock(&s->mu);
    if (st != PT_OK) {
        snprintf(err, sizeof err, "cannot create a session: %s", pt_last_error());
        sl->session = NULL;
        slot_release(s, sl, PT_SRV_ERROR, err);
        return;
    }
    size_t keep = best_keep; /* reusable: below n_prompt */
    if (s->e->session_truncate(sl->session, keep) != PT_OK) {
        keep = 0;
        s->e->session_truncate(sl->session, 0);
    }
    sl->n_prompted = keep;
    sl->order = ++s->n_admitted;
    pthread_mutex_lock(&j->mu);
    j->n_cached = keep;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->mu);
    if (keep) {
        s->cache_hits++;
        s->cache_tokens_reused += keep;
    }
    s->prompt_tokens += j->n_prompt;
    pthread_mutex_unlock(&s->mu);

    int room = s->e->session_n_ctx(sl->session) - (int)j->n_prompt;
    sl->max_tokens = j->max_tokens < room ? j->max_tokens : room;
    if (s->e->detok_create(s->e->model, 1, &sl->detok) != PT_OK) {
        snprintf(err, sizeof err, "detokenizer: %s", pt_last_error());
        sl->detok = NULL;
        slot_release(s, sl, PT_SRV_ERROR, err);
        return;
    }
    if (j->schema) {
        if (build_vocab(s) != PT_OK) {
            snprintf(err, sizeof err, "constrained decoding: %s", pt_last_error());
            slot_release(s, sl, PT_SRV_ERROR, err);
            return;
        }
        sl->jsm = malloc(sizeof *sl->jsm);
        sl->mask = malloc((size_t)s->vocab.n_vocab);
        if (!sl->jsm || !sl->mask) {
            slot_release(s, sl, PT_SRV_ERROR, "out of memory");
            return;
        }
        pt_jsm_init(sl->jsm, j->schema);
    }
}

/* One unit of work for a slot: a prompt chunk, or one generated token. A
 * token is made in three parts: slot_prepare (here: checks, the constraint
 * mask; returns 1 when the slot is to sample), the sampling itself (all
 * sampling slots of a turn at once, in parallel: sample_all), and
 * slot_take_token (the token's text, stop strings, bookkeeping). */
/* Runs the next k prompt tokens of sl through the prefill path (the engine's
 * session_prompt); on failure releases the slot with the error and returns 0. */
static int prompt_run(pt_srv_sched *s, slot *sl, size_t k) {
    if (s->e->session_prompt(sl->session, sl->job->prompt + sl->n_prompted, k) != PT_OK) {
        char err[600];
        snprintf(err, sizeof err, "prompt: %s", pt_last_error());
        slot_release(s, sl, PT_SRV_ERROR, err);
        return 0;
    }
    sl->n_prompted += k;
    return 1;
}

static int slot_prepare(pt_srv_sched *s, slot *sl, int others_active) {
    pt_srv_job *j = sl->job;
    if (atomic_load(&j->cancelled)) {
        slot_release(s, sl, PT_SRV_CANCELLED, NULL);
        return 0;
    }
    if (sl->n_prompted < j->n_prompt) {
        if (sl->n_prompted >= sl->rows_from) return 0; /* in this turn's step (step_pending) */
        if (sl->n_prompted < sl->blocks_end) {
            /* whole blocks at their fixed positions (prompt_plan). With
             * prompt rows a reused prefix ends at a block boundary
             * (reusable); without, it may end inside a block, which then
             * runs only up to the block's end. */
            size_t nb = others_active ? 1 : PREFILL_TURN_ALONE / PREFILL_BLOCK;
            for (; nb > 0 && sl->n_prompted < sl->blocks_end; nb--)
                if (!prompt_run(s, sl, PREFILL_BLOCK - sl->n_prompted % PREFILL_BLOCK)) return 0;
            return 0;
        }
        /* the tail (under PREFILL_BLOCK tokens) as one chunk, or a short one
         * in pieces, all this turn (engine.h short_prompt_piece) */
        size_t n = j->n_prompt - sl->n_prompted;
        const size_t piece = (size_t)s->e->short_prompt_piece;
        const size_t k0 = piece > 0 && n <= 4 * piece ? piece : n;
        while (sl->n_prompted < j->n_prompt)
            if (!prompt_run(s, sl, j->n_prompt - sl->n_prompted < k0 ? j->n_prompt - sl->n_prompted : k0)) return 0;
        return 0;
    }
    if ((int)j->n_generated >= sl->max_tokens) {
        slot_release(s, sl, PT_SRV_LENGTH, NULL);
        return 0;
    }
    sl->allowed = NULL;
    if (sl->jsm) {
        size_t na = pt_jsm_mask(sl->jsm, &s->vocab, sl->mask);
        if (na == 0) {
            slot_release(s, sl, PT_SRV_ERROR,
                         "constrained decoding: no token of the vocabulary can continue the value");
            return 0;
        }
        sl->allowed = sl->mask;
    }
    return 1;
}

/* Samples slots [begin, end) of s->to_sample (a pool job: each slot touches
 * only its own session, so the slots of a turn sample concurrently; over a
 * large vocabulary sampling costs milliseconds per token on the CPU, which
 * one thread would pay once per slot per step). Errors are kept per slot
 * (the message lives in this thread). */
static void sample_range(void *ctx, long begin, long end, int ith) {
    pt_srv_sched *s = ctx;
    (void)ith;
    for (long i = begin; i < end; i++) {
        slot *sl = s->to_sample[i];
        sl->sample_st = s->e->session_sample(sl->session, &sl->job->sp, sl->allowed, &sl->tok);
        if (sl->sample_st != PT_OK) snprintf(sl->sample_err, sizeof sl->sample_err, "%s", pt_last_error());
    }
}

/* Samples the mask-free slots of s->to_sample[0..n) through the engine's
 * session_sample_many (GPU sampling over the batch) and moves the slots it
 * did not take to the front of s->to_sample; returns how many those are
 * (sample_range then samples them). The other slots' order changes, which
 * nothing depends on: every slot's result is its own. */
static int sample_many(pt_srv_sched *s, int n) {
    if (!s->e->session_sample_many || n < 2) return n;
    enum { MAXR = 64 };
    void *sess[MAXR];
    const pt_sampling_params *sps[MAXR];
    slot *who[MAXR];
    int m = 0;
    for (int i = 0; i < n && m < MAXR; i++) {
        slot *sl = s->to_sample[i];
        if (sl->allowed) continue;
        sess[m] = sl->session;
        sps[m] = &sl->job->sp;
        who[m++] = sl;
    }
    if (m < 2) return n;
    pt_token_info toks[MAXR];
    pt_status sts[MAXR];
    static _Thread_local char errs[MAXR][512];
    uint8_t done[MAXR];
    s->e->session_sample_many(sess, sps, toks, sts, errs, done, m);
    for (int k = 0; k < m; k++)
        if (done[k]) {
            who[k]->tok = toks[k];
            who[k]->sample_st = sts[k];
            if (sts[k] != PT_OK) snprintf(who[k]->sample_err, sizeof who[k]->sample_err, "%s", errs[k]);
            who[k]->sampled = 1;
        }
    /* the slots left (not taken) first, then the sampled ones */
    int front = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            slot *sl = s->to_sample[i];
            if ((pass == 0) == !sl->sampled) s->to_sample_tmp[front++] = sl;
        }
    int n_host = 0;
    for (int i = 0; i < n; i++) {
        s->to_sample[i] = s->to_sample_tmp[i];
        if (!s->to_sample[i]->sampled) n_host++;
        s->to_sample[i]->sampled = 0;
    }
    return n_host;
}

static void slot_take_token(pt_srv_sched *s, slot *sl) {
    pt_srv_job *j = sl->job;
    char err[600];
    if (sl->sample_st != PT_OK) {
        snprintf(err, sizeof err, "sampling: %s", sl->sample_err);
        slot_release(s, sl, PT_SRV_ERROR, err);
        return;
    }
    const pt_token_info tok = sl->tok;
    double now = pt_srv_now();
    if (s->e->is_eos(s->e->model, tok.id)) {
        pthread_mutex_lock(&j->mu);
        if (!j->t_first_token) j->t_first_token = now;
        pthread_mutex_unlock(&j->mu);
        slot_release(s, sl, PT_SRV_EOS, NULL);
        return;
    }
    if (sl->jsm && !pt_jsm_feed(sl->jsm, s->vocab.text[tok.id], s->vocab.len[tok.id])) {
        slot_release(s, sl, PT_SRV_ERROR, "constrained decoding: sampled a token outside the mask");
        return;
    }
    const char *piece = NULL;
    size_t plen = 0;
    if (s->e->detok_push(sl->detok, tok.id, &piece, &plen) != PT_OK) {
        snprintf(err, sizeof err, "detokenizer: %s", pt_last_error());
        slot_release(s, sl, PT_SRV_ERROR, err);
        return;
    }
    pt_sbuf out = {0};
    int stopped = plen ? pt_stop_feed(&sl->stop, piece, plen, &out) : 0;
    pthread_mutex_lock(&j->mu);
    if (!j->t_first_token) j->t_first_token = now;
    j->n_generated++;
    if (out.len) pt_sbuf_add(&j->text, out.data, out.len);
    if (j->want_logprobs) {
        if (j->n_toks == j->cap_toks) {
            size_t cap = j->cap_toks ? j->cap_toks * 2 : 64;
            pt_token_info *t = realloc(j->toks, cap * sizeof *t);
            if (t) {
                j->toks = t;
                j->cap_toks = cap;
            }
        }
        if (j->n_toks < j->cap_toks) j->toks[j->n_toks++] = tok;
    }
    if (stopped) j->stop_index = sl->stop.matched;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pt_sbuf_free(&out);
    pthread_mutex_lock(&s->mu);
    s->generated_tokens++;
    pthread_mutex_unlock(&s->mu);
    if (stopped) {
        slot_release(s, sl, PT_SRV_STOP_STRING, NULL);
        return;
    }
    if ((int)j->n_generated >= sl->max_tokens) {
        slot_release(s, sl, PT_SRV_LENGTH, NULL);
        return;
    }
    /* the token runs through the model with the other slots' tokens in this
     * turn's batched step (decode_pending) */
    sl->pending = 1;
    sl->pending_id = tok.id;
}

/* One batched step over sl[0..n): slot k runs cnt[k] tokens from ids
 * (concatenated slot by slot): its pending sampled token (cnt 1), or a
 * piece of its prompt (prompt[k]). Through session_decode_rows when the
 * engine has it, else one session_decode_batch of the decode rows (prompt
 * pieces then never come here). A failed step fails the slots in it. */
static void record_step(pt_srv_sched *s, int n_dec, int n_prompt) {
    pthread_mutex_lock(&s->mu);
    if (n_dec) { /* the batch size of a decode step: sizes 1, 2, 3-4, 5-8, ... (upper bounds 2^b) */
        int b = 0;
        while (b < PT_SRV_BATCH_BUCKETS && (1 << b) < n_dec) b++;
        s->batch_hist[b]++;
        s->batch_steps++;
        s->batch_rows += (uint64_t)n_dec;
    }
    if (n_prompt) {
        s->prompt_row_steps++;
        s->prompt_rows += (uint64_t)n_prompt;
    }
    pthread_mutex_unlock(&s->mu);
}

static void run_step(pt_srv_sched *s, slot **sl, const int32_t *ids, const int *cnt, const uint8_t *prompt, int n) {
    void *sess[64];
    char err[600];
    for (int k = 0; k < n; k++) sess[k] = sl[k]->session;
    pt_status st;
    if (s->e->session_decode_rows) {
        st = s->e->session_decode_rows(sess, ids, cnt, n);
    } else if (s->e->session_decode_batch) {
        st = s->e->session_decode_batch(sess, ids, n);
    } else {
        st = PT_OK;
        for (int k = 0; k < n; k++)
            if (s->e->session_prompt(sess[k], &ids[k], 1) != PT_OK) {
                snprintf(err, sizeof err, "decode: %s", pt_last_error());
                slot_release(s, sl[k], PT_SRV_ERROR, err);
                sl[k] = NULL;
            }
    }
    if (st != PT_OK) snprintf(err, sizeof err, "%s: %s", s->e->session_decode_rows ? "step" : "decode", pt_last_error());
    /* rows that ran in the turn's step ahead were counted there */
    int n_dec = 0, n_prompt = 0;
    for (int k = 0; k < n; k++) {
        const int held = sl[k] && sl[k]->held;
        if (!held) {
            if (prompt[k]) n_prompt += cnt[k];
            else n_dec++;
        }
        if (!sl[k]) continue;
        sl[k]->held = 0;
        if (st != PT_OK) slot_release(s, sl[k], PT_SRV_ERROR, err);
        else if (prompt[k]) sl[k]->n_prompted += (size_t)cnt[k];
    }
    record_step(s, n_dec, n_prompt);
}

/* Prompt rows a step carries beside D decode rows: at least
 * PROMPT_ROWS_MIN (a joining request is never starved), up to
 * PROMPT_STEP_ROWS rows in all while few slots decode, then rounded up to
 * the GPU's graph bucket (runtime/batch.c: powers of two up to 32 rows, then
 * multiples of 32), whose padding rows would otherwise cost the same
 * compute for nothing. So a running request's next token waits for at most
 * one such chunk of prompt rows. */
static int prompt_budget(int D) {
    int total = D + (PROMPT_STEP_ROWS - D > PROMPT_ROWS_MIN ? PROMPT_STEP_ROWS - D : PROMPT_ROWS_MIN);
    if (total > 32) total = (total + 31) / 32 * 32;
    return total - D;
}

/* Runs this turn's step: the sampled tokens of the generating slots, plus
 * prompt rows of slots whose prompt runs as rows (slot.rows_from), oldest request
 * first (each joining request reaches its first token as early as the
 * budget allows, rather than all of them late), within prompt_budget. A
 * prompt row is computed exactly as a decode row is, so these requests'
 * results do not depend on what else shares the step (batch invariance,
 * docs/batching.md). Steps carry at most 64 sessions (--parallel allows
 * more: several steps then). */
/* The slots with prompt rows to run (slot.rows_from), oldest request first,
 * into s->to_prompt; returns how many. */
static int prompt_slots(pt_srv_sched *s) {
    int np = 0;
    for (int i = 0; i < s->n_parallel; i++) {
        slot *sl = &s->slots[i];
        if (sl->job && sl->n_prompted >= sl->rows_from && sl->n_prompted < sl->job->n_prompt) s->to_prompt[np++] = sl;
    }
    for (int a = 1; a < np; a++) /* insertion sort by admission order (np is at most --parallel) */
        for (int b = a; b > 0 && s->to_prompt[b - 1]->order > s->to_prompt[b]->order; b--) {
            slot *t = s->to_prompt[b];
            s->to_prompt[b] = s->to_prompt[b - 1];
            s->to_prompt[b - 1] = t;
        }
    return np;
}

/* piped: this turn's step ran ahead (turn_ahead); the step then carries
 * exactly the prompt rows that ran in it (which it takes without running
 * them again), besides the pending tokens (those the step ahead ran are
 * taken too; a token the GPU handed back runs now). */
static void step_pending(pt_srv_sched *s, int piped) {
    int D = 0;
    for (int i = 0; i < s->n_parallel; i++) D += s->slots[i].job && s->slots[i].pending;
    int np = prompt_slots(s);
    int budget = np ? piped ? STEP_IDS_CAP : prompt_budget(D) : 0;
    slot *sl[64];
    int cnt[64];
    uint8_t prompt[64];
    int n = 0, R = 0;
    int pi = 0, di = 0;
    for (;;) {
        slot *next = NULL;
        int k = 1, is_prompt = 0;
        while (di < s->n_parallel && !next) { /* decode rows first */
            slot *c = &s->slots[di++];
            if (c->job && c->pending) next = c;
        }
        while (!next && pi < np && budget > 0) {
            slot *c = s->to_prompt[pi++];
            size_t rest = c->job->n_prompt - c->n_prompted;
            if (piped) { /* only what ran ahead */
                if (c->ahead_rows < 1) continue;
                if ((size_t)c->ahead_rows < rest) rest = (size_t)c->ahead_rows;
                c->ahead_rows = 0;
            }
            next = c;
            k = rest < (size_t)budget ? (int)rest : budget;
            budget -= k;
            is_prompt = 1;
        }
        if (!next || n == 64) {
            if (n) run_step(s, sl, s->step_ids, cnt, prompt, n);
            n = R = 0;
            if (!next) break;
        }
        if (is_prompt) {
            memcpy(s->step_ids + R, next->job->prompt + next->n_prompted, (size_t)k * sizeof(int32_t));
        } else {
            next->pending = 0;
            s->step_ids[R] = next->pending_id;
        }
        sl[n] = next;
        cnt[n] = k;
        prompt[n++] = (uint8_t)is_prompt;
        R += k;
    }
}

/* A pipelined turn (docs/batching.md "Pipelined turns"): when every slot
 * sampling this turn is mask-free (at most 64 of them), the engine samples
 * them and runs the next step ahead — their tokens as decode rows (except
 * a slot whose token is its last by max_tokens), then prompt rows within
 * prompt_budget as step_pending would pick them — before the host hands
 * the tokens out; step_pending then takes those rows. A token that ends its
 * request (EOS, a stop string) leaves its row unused. Returns 1 when the
 * turn's samples were taken (sl->tok, sl->sample_st set for every slot of
 * s->to_sample), 0 to sample and step as usual. */
static int turn_ahead(pt_srv_sched *s, int n) {
    enum { MAXS = 64 };
    if (!s->pipeline || n < 1 || n > MAXS) return 0;
    void *dec[MAXS], *prs[MAXS];
    const pt_sampling_params *sps[MAXS];
    uint8_t norow[MAXS], held[2 * MAXS];
    int cnt[MAXS];
    int D = 0;
    for (int k = 0; k < n; k++) {
        slot *sl = s->to_sample[k];
        if (sl->allowed) return 0; /* a mask: sampled on the host, then one step for all */
        dec[k] = sl->session;
        sps[k] = &sl->job->sp;
        norow[k] = (int)sl->job->n_generated + 1 >= sl->max_tokens;
        D += !norow[k];
    }
    int np = prompt_slots(s), budget = np ? prompt_budget(D) : 0, P = 0, R = 0;
    for (int i = 0; i < np && budget > 0 && n + P < MAXS; i++) {
        slot *sl = s->to_prompt[i];
        size_t rest = sl->job->n_prompt - sl->n_prompted;
        const int k = rest < (size_t)budget ? (int)rest : budget;
        if (R + k > STEP_IDS_CAP) break;
        memcpy(s->step_ids + R, sl->job->prompt + sl->n_prompted, (size_t)k * sizeof(int32_t));
        prs[P] = sl->session;
        cnt[P++] = k;
        R += k;
        budget -= k;
    }
    pt_token_info toks[MAXS];
    pt_status sts[MAXS];
    static _Thread_local char errs[MAXS][512];
    if (s->e->session_rows_ahead(dec, sps, norow, n, prs, s->step_ids, cnt, P, toks, sts, errs, held) != PT_OK) {
        pt_clear_error();
        return 0;
    }
    int n_dec = 0;
    for (int k = 0; k < n; k++) {
        slot *sl = s->to_sample[k];
        sl->tok = toks[k];
        sl->sample_st = sts[k];
        if (sts[k] != PT_OK) snprintf(sl->sample_err, sizeof sl->sample_err, "%s", errs[k]);
        sl->held = held[k];
        n_dec += held[k];
    }
    for (int i = 0; i < P; i++) {
        slot *sl = s->to_prompt[i];
        sl->held = held[n + i];
        sl->ahead_rows = held[n + i] ? cnt[i] : 0;
    }
    record_step(s, n_dec, P && held[n] ? R : 0);
    pthread_mutex_lock(&s->mu);
    s->piped_turns++;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

/* Creating a session costs tens of milliseconds (its buffers are allocated
 * and touched), which a request would otherwise pay in its time to first
 * token whenever the prompt cache grows. So while nothing runs, one empty
 * session is made ahead of time if the cache has room for it (or the pool
 * is still below --parallel sessions). Called with s->mu held; returns 1 if
 * it made one (the lock was released meanwhile). */
static int make_spare(pt_srv_sched *s) {
    if (s->spare_failed) return 0;
    size_t bytes = 0, one = 0;
    for (int i = 0; i < s->n_idle; i++) {
        void *ss = s->idle[i].session;
        if (s->e->session_n_tokens(ss) == 0) return 0; /* a spare is waiting */
        size_t b = s->e->session_bytes(ss);
        bytes += b;
        if (b > one) one = b;
    }
    if (s->n_idle >= s->n_parallel && bytes + one > s->cache_bytes) return 0;
    if (s->n_idle == s->cap_idle) return 0;
    pthread_mutex_unlock(&s->mu);
    void *ss = NULL;
    pt_status st = s->e->session_create(s->e->model, s->n_ctx, &ss);
    pthread_mutex_lock(&s->mu);
    if (st != PT_OK) {
        s->spare_failed = 1; /* out of memory: requests will say so themselves */
        return 0;
    }
    s->idle[s->n_idle++] = (idle_session){ss, ++s->clock, 0, 0};
    s->idle_bytes = bytes + s->e->session_bytes(ss);
    return 1;
}

static void *inference_main(void *arg) {
    pt_srv_sched *s = arg;
    int rr = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        for (;;) {
            if (s->stopping) break;
            int free_slot = s->n_active < s->n_parallel;
            if (s->n_active > 0 || (free_slot && s->q_len > 0)) break;
            if (make_spare(s)) continue;
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* admit queued jobs into free slots */
        pt_srv_job *admit[64];
        int n_admit = 0;
        int free_slots = s->n_parallel - s->n_active;
        while (s->q_len > 0 && n_admit < free_slots && n_admit < 64) {
            admit[n_admit++] = s->queue[s->q_head];
            s->q_head = (s->q_head + 1) % s->q_cap;
            s->q_len--;
        }
        pthread_mutex_unlock(&s->mu);
        for (int a = 0; a < n_admit; a++) {
            for (int i = 0; i < s->n_parallel; i++)
                if (!s->slots[i].job) {
                    slot_start(s, &s->slots[i], admit[a]);
                    break;
                }
        }
        int active = 0;
        for (int i = 0; i < s->n_parallel; i++) active += s->slots[i].job != NULL;
        const double t0 = active ? pt_srv_now() : 0.0;
        int n_sample = 0;
        for (int k = 0; k < s->n_parallel; k++) {
            slot *sl = &s->slots[(rr + k) % s->n_parallel];
            if (sl->job && slot_prepare(s, sl, active > 1)) s->to_sample[n_sample++] = sl;
        }
        /* the next step ahead of the host's part of the turn where it can;
         * else rows without a mask: one GPU launch over them where the
         * engine can (the rest, and rows it leaves, sample on the pool) */
        const int piped = turn_ahead(s, n_sample);
        if (!piped) {
            int n_host = sample_many(s, n_sample);
            pt_pool_for(s->pool, n_host, 1, sample_range, s);
        }
        const double t1 = active ? pt_srv_now() : 0.0;
        for (int k = 0; k < n_sample; k++) slot_take_token(s, s->to_sample[k]);
        const double t2 = active ? pt_srv_now() : 0.0;
        step_pending(s, piped);
        if (active) {
            const double t3 = pt_srv_now();
            pthread_mutex_lock(&s->mu);
            s->turns++;
            s->phase_s[PT_SRV_PHASE_SAMPLE] += t1 - t0;
            s->phase_s[PT_SRV_PHASE_TOKENS] += t2 - t1;
            s->phase_s[PT_SRV_PHASE_STEP] += t3 - t2;
            pthread_mutex_unlock(&s->mu);
        }
        rr = (rr + 1) % s->n_parallel;
    }
    /* shutting down: fail what is left */
    for (int i = 0; i < s->n_parallel; i++)
        if (s->slots[i].job) slot_release(s, &s->slots[i], PT_SRV_ERROR, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    while (s->q_len > 0) {
        pt_srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        job_finish(j, PT_SRV_ERROR, "the server is shutting down");
        pt_srv_job_release(j);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

pt_status pt_srv_sched_create(pt_srv_engine *e, int n_parallel, int max_queue, size_t cache_bytes,
                              int n_ctx, pt_srv_sched **out) {
    *out = NULL;
    if (n_parallel < 1 || n_parallel > 256)
        return pt_error(PT_ERR_INVALID_ARG, "--parallel %d: expected 1..256", n_parallel);
    if (max_queue < 0 || max_queue > 100000)
        return pt_error(PT_ERR_INVALID_ARG, "--queue %d: expected 0..100000", max_queue);
    int rows_max = e->session_decode_rows ? e->prompt_rows_max : 0;
    const char *env = getenv("PETREL_PROMPT_ROWS"); /* docs/server.md: overrides the engine's choice */
    if (env && *env && e->session_decode_rows) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > PROMPT_ROWS_MAX)
            return pt_error(PT_ERR_INVALID_ARG, "PETREL_PROMPT_ROWS=%s: expected 0..%d", env, PROMPT_ROWS_MAX);
        rows_max = (int)v;
    }
    if (rows_max > PROMPT_ROWS_MAX) rows_max = PROMPT_ROWS_MAX;
    int pipeline = e->session_rows_ahead && e->session_decode_rows ? e->pipeline != 0 : 0;
    const char *penv = getenv("PETREL_SERVE_PIPELINE"); /* docs/server.md: overrides the engine's choice */
    if (penv && *penv) {
        if (strcmp(penv, "0") && strcmp(penv, "1"))
            return pt_error(PT_ERR_INVALID_ARG, "PETREL_SERVE_PIPELINE=%s: expected 0 or 1", penv);
        pipeline = *penv == '1' && e->session_rows_ahead && e->session_decode_rows;
    }
    pt_srv_sched *s = calloc(1, sizeof *s);
    if (!s) return pt_error(PT_ERR_NOMEM, "out of memory");
    s->e = e;
    s->rows_max = rows_max;
    s->pipeline = pipeline;
    s->n_parallel = n_parallel;
    s->max_queue = max_queue;
    s->cache_bytes = cache_bytes;
    /* jobs pass through the queue even when a slot is free */
    s->q_cap = max_queue + n_parallel + 1;
    s->queue = calloc((size_t)s->q_cap, sizeof *s->queue);
    s->slots = calloc((size_t)n_parallel, sizeof *s->slots);
    s->to_sample = calloc((size_t)n_parallel, sizeof *s->to_sample);
    s->to_sample_tmp = calloc((size_t)n_parallel, sizeof *s->to_sample_tmp);
    s->to_prompt = calloc((size_t)n_parallel, sizeof *s->to_prompt);
    s->cap_idle = n_parallel + 8;
    s->idle = calloc((size_t)s->cap_idle, sizeof *s->idle);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->queue || !s->slots || !s->to_sample || !s->to_sample_tmp || !s->to_prompt || !s->idle) {
        pt_srv_sched_free(&s);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    /* sampling threads: one per slot up to the CPUs (16 at most) */
    int nt = pt_cpu_count();
    if (nt > 16) nt = 16;
    if (nt > n_parallel) nt = n_parallel;
    if (nt < 1) nt = 1;
    pt_status pst = pt_pool_create(&s->pool, nt);
    if (pst != PT_OK) {
        pt_srv_sched_free(&s);
        return pt_error_prefix(pst, "sampling threads");
    }
    void *first;
    pt_status st = e->session_create(e->model, n_ctx, &first);
    if (st != PT_OK) {
        pt_srv_sched_free(&s);
        return pt_error_prefix(st, "creating a session");
    }
    s->n_ctx = e->session_n_ctx(first);
    s->idle[s->n_idle++] = (idle_session){first, 0, 0, 0};
    if (pthread_create(&s->thread, NULL, inference_main, s) != 0) {
        e->session_free(first);
        s->n_idle = 0;
        pt_srv_sched_free(&s);
        return pt_error(PT_ERR_INTERNAL, "cannot start the inference thread");
    }
    *out = s;
    return PT_OK;
}

void pt_srv_sched_free(pt_srv_sched **ps) {
    pt_srv_sched *s = *ps;
    if (!s) return;
    if (s->thread) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; i < s->n_idle; i++) s->e->session_free(s->idle[i].session);
    if (s->vocab_ready) pt_vocab_index_free(&s->vocab);
    free(s->queue);
    free(s->slots);
    free(s->to_sample);
    free(s->to_sample_tmp);
    free(s->to_prompt);
    pt_pool_free(&s->pool);
    free(s->idle);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    *ps = NULL;
}

int pt_srv_sched_n_ctx(const pt_srv_sched *s) { return s->n_ctx; }

int pt_srv_sched_submit(pt_srv_sched *s, pt_srv_job *j) {
    pthread_mutex_lock(&s->mu);
    /* a job waits only when every slot is busy; those count against --queue */
    int waiting_after = s->q_len + 1 - (s->n_parallel - s->n_active);
    if (s->stopping || (waiting_after > s->max_queue) || s->q_len + 1 > s->q_cap) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    atomic_fetch_add(&j->refs, 1);
    j->t_submit = pt_srv_now();
    s->queue[(s->q_head + s->q_len) % s->q_cap] = j;
    s->q_len++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void pt_srv_sched_get_stats(pt_srv_sched *s, pt_srv_sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    st->n_active = s->n_active;
    st->n_queued = s->q_len;
    st->n_idle_sessions = -1; /* owned by the inference thread; idle_bytes is published */
    st->idle_bytes = s->idle_bytes;
    st->cache_hits = s->cache_hits;
    st->cache_tokens_reused = s->cache_tokens_reused;
    st->prompt_tokens = s->prompt_tokens;
    st->generated_tokens = s->generated_tokens;
    memcpy(st->batch_hist, s->batch_hist, sizeof st->batch_hist);
    st->batch_steps = s->batch_steps;
    st->batch_rows = s->batch_rows;
    st->prompt_row_steps = s->prompt_row_steps;
    st->prompt_rows = s->prompt_rows;
    st->turns = s->turns;
    st->piped_turns = s->piped_turns;
    memcpy(st->phase_s, s->phase_s, sizeof st->phase_s);
    pthread_mutex_unlock(&s->mu);
}
