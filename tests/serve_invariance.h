/* Long prompts through the serving scheduler (src/server/sched.c) give the
 * same reply bit for bit alone, in company and from a reused prefix (prompt
 * cache): the scheduler's prompt schedule depends on the prompt alone
 * (docs/batching.md "Long prompts"). Shared by tests/test_serve_invariance.c
 * (CPU, prompt rows switched on as on CUDA) and
 * tests/cuda/test_cuda_serve_invariance.c (the CUDA engine); header-only,
 * each test binary includes it once.
 *
 * The scheduler runs in-process with the petrel engine (engine_petrel.c); no
 * HTTP. Every request is greedy with top logprobs, which samples on the
 * host from the step's logits: the compared replies are the token ids and
 * the logprobs of the chosen and the top tokens, bit for bit, so a
 * difference in the last prompt position's logits shows even when it does
 * not flip a token.
 *
 * Scenarios, for prompts A (300 tokens: one 256-token block and a 44-token
 * tail), B (280), C (20: rows only), D (up to 600: blocks and a tail
 * longer than the rows limit):
 *   1. each alone, cold (the reference);
 *   2. A and D again on the same scheduler: their sessions are reused (the
 *      prompt cache must report reused tokens);
 *   3. all four submitted together to a fresh scheduler;
 *   4. A's conversation continued (A + its reply + 10 or 40 new tokens):
 *      from the prompt cache, and cold on a fresh scheduler.
 * Not here: the batched step's own invariance (test_batch.c,
 * tests/cuda/test_cuda_batch*.c). */
#ifndef PT_TESTS_SERVE_INVARIANCE_H
#define PT_TESTS_SERVE_INVARIANCE_H

#include "server/engine.h"
#include "server/sched.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SI_GEN = 6, SI_MAXP = 700, SI_TOP = 5 };

/* CHECK, then leave the function (REQUIRE also leaves after any earlier
 * failure; these scenarios go on past a failed comparison). */
#define SI_NEED(cond, ...)         \
    do {                           \
        if (!(cond)) {             \
            CHECK(0, __VA_ARGS__); \
            return;                \
        }                          \
    } while (0)

/* A detokenizer that yields no text, for a model without a tokenizer (the
 * synthetic shapes): the scheduler makes one per request, and the replies
 * are compared by token ids and logprobs only. */
static int si_detok_dummy;
static inline pt_status si_detok_create(void *model, int skip_special, void **out) {
    (void)model, (void)skip_special;
    *out = &si_detok_dummy;
    return PT_OK;
}
static inline pt_status si_detok_push(void *d, int32_t id, const char **text, size_t *len) {
    (void)d, (void)id;
    *text = "";
    *len = 0;
    return PT_OK;
}
static inline pt_status si_detok_flush(void *d, const char **text, size_t *len) {
    (void)d;
    *text = "";
    *len = 0;
    return PT_OK;
}
static inline void si_detok_free(void *d) { (void)d; }
static inline void si_no_text(pt_srv_engine *e) {
    e->detok_create = si_detok_create;
    e->detok_push = si_detok_push;
    e->detok_flush = si_detok_flush;
    e->detok_free = si_detok_free;
}

typedef struct si_reply {
    int n;                     /* tokens generated (eos excluded) */
    int32_t id[SI_GEN];
    float logprob[SI_GEN][SI_TOP]; /* the chosen token's, then the top SI_TOP - 1 others' */
    size_t cached;             /* prompt tokens reused from the prompt cache */
    pt_srv_finish finish;
    char error[512];
} si_reply;

static pt_srv_job *si_submit(pt_srv_engine *e, pt_srv_sched *s, const int32_t *prompt, size_t n) {
    pt_srv_job *j = pt_srv_job_new();
    if (!j) return NULL;
    j->prompt = malloc(n * sizeof *prompt);
    if (!j->prompt) {
        pt_srv_job_release(j);
        return NULL;
    }
    memcpy(j->prompt, prompt, n * sizeof *prompt);
    j->n_prompt = n;
    j->sp = e->default_sampling(e->model);
    j->sp.temperature = 0;
    j->sp.n_logprobs = SI_TOP - 1; /* host sampling from the downloaded logits */
    j->sp.seed = 7;
    j->max_tokens = SI_GEN;
    j->want_logprobs = 1;
    if (pt_srv_sched_submit(s, j) != 0) {
        pt_srv_job_release(j);
        return NULL;
    }
    return j;
}

static void si_collect(pt_srv_job *j, si_reply *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_lock(&j->mu);
    while (j->finish == PT_SRV_RUNNING) pthread_cond_wait(&j->cv, &j->mu);
    r->finish = j->finish;
    snprintf(r->error, sizeof r->error, "%s", j->error);
    r->cached = j->n_cached;
    for (size_t i = 0; i < j->n_toks && i < SI_GEN; i++) {
        const pt_token_info *t = &j->toks[i];
        r->id[r->n] = t->id;
        r->logprob[r->n][0] = t->logprob;
        for (int k = 1; k < SI_TOP; k++) r->logprob[r->n][k] = k <= t->n_top ? t->top_logprobs[k - 1] : 0.0f;
        r->n++;
    }
    pthread_mutex_unlock(&j->mu);
    pt_srv_job_release(j);
}

/* Runs n prompts submitted together (n = 1: alone) and waits for them all. */
static int si_run(pt_srv_engine *e, pt_srv_sched *s, int n, const int32_t *const *prompts, const size_t *lens,
                  si_reply *out) {
    pt_srv_job *jobs[8];
    for (int i = 0; i < n; i++) {
        jobs[i] = si_submit(e, s, prompts[i], lens[i]);
        NEED(jobs[i], "submitting prompt %d", i);
    }
    for (int i = 0; i < n; i++) si_collect(jobs[i], &out[i]);
    return 1;
}

/* 0 when b equals the reference a bit for bit; prints the first difference. */
static int si_differs(const char *what, const si_reply *a, const si_reply *b) {
    if (a->finish != b->finish || a->n != b->n) {
        printf("INFO %s: %d tokens (finish %d) vs %d (finish %d) %s\n", what, a->n, (int)a->finish, b->n,
               (int)b->finish, b->error);
        return 1;
    }
    for (int i = 0; i < a->n; i++)
        if (a->id[i] != b->id[i] || memcmp(a->logprob[i], b->logprob[i], sizeof a->logprob[i])) {
            printf("INFO %s: token %d: id %d logprob %.9g (top %.9g) vs id %d logprob %.9g (top %.9g)\n", what, i,
                   a->id[i], (double)a->logprob[i][0], (double)a->logprob[i][1], b->id[i], (double)b->logprob[i][0],
                   (double)b->logprob[i][1]);
            return 1;
        }
    return 0;
}

static pt_srv_sched *si_sched(pt_srv_engine *e, int n_ctx) {
    pt_srv_sched *s = NULL;
    if (pt_srv_sched_create(e, 8, 64, (size_t)4 << 30, n_ctx, &s) != PT_OK) { /* room to keep every session */
        printf("INFO scheduler: %s\n", pt_last_error());
        return NULL;
    }
    return s;
}

/* The four scenarios above over engine e (label names the model in the
 * messages); n_ctx 0 = the engine's default context. */
static void serve_invariance_check(pt_srv_engine *e, const char *label, int n_ctx) {
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    const int V = e->vocab_size(e->model);
    pt_srv_sched *s = si_sched(e, n_ctx);
    SI_NEED(s, "%s: scheduler", label);
    const int ctx = pt_srv_sched_n_ctx(s);
    size_t len[4] = {300, 280, 20, 600};
    if ((int)len[3] + 2 * SI_GEN + 60 > ctx) len[3] = (size_t)(ctx - 2 * SI_GEN - 60);
    SI_NEED(ctx >= 300 + 2 * SI_GEN + 60 && len[3] > 256, "%s: context %d too small for the prompts", label, ctx);
    static int32_t P[4][SI_MAXP];
    for (int p = 0; p < 4; p++)
        for (size_t i = 0; i < len[p]; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            P[p][i] = 16 + (int32_t)((rng >> 33) % (uint64_t)(V - 32));
        }
    for (int p = 0; p < 4; p++) P[p][0] = 16 + p; /* distinct first tokens: no prefix shared across prompts */
    const int32_t *pp[4] = {P[0], P[1], P[2], P[3]};

    /* 1. alone, cold */
    si_reply ref[4], rc[4], r[4];
    for (int p = 0; p < 4; p++) {
        SI_NEED(si_run(e, s, 1, &pp[p], &len[p], &ref[p]), "%s", label);
        CHECK(ref[p].finish != PT_SRV_ERROR && ref[p].cached == 0, "%s: prompt %d alone: finish %d, %zu cached: %s",
              label, p, (int)ref[p].finish, ref[p].cached, ref[p].error);
    }
    CHECK(ref[0].n >= 2, "%s: A's reply has %d tokens (the comparisons need some)", label, ref[0].n);

    /* 2. A and D again: from the prompt cache */
    for (int p = 0; p < 4; p += 3) {
        SI_NEED(si_run(e, s, 1, &pp[p], &len[p], &rc[p]), "%s", label);
        CHECK(rc[p].cached > 0, "%s: prompt %d rerun reused no cached prefix", label, p);
        char what[128];
        snprintf(what, sizeof what, "%s: prompt %d from the cache (%zu of %zu tokens reused) vs cold", label, p,
                 rc[p].cached, len[p]);
        CHECK(!si_differs(what, &ref[p], &rc[p]), "%s", what);
    }

    /* 4a. A's conversation continued, from the cache (the session holding A and its reply) */
    static int32_t A2[2][SI_MAXP];
    size_t len2[2];
    si_reply c2[2], cold2[2];
    for (int v = 0; v < 2; v++) {
        const size_t extra = v ? 40 : 10;
        memcpy(A2[v], P[0], len[0] * sizeof(int32_t));
        for (int i = 0; i < ref[0].n; i++) A2[v][len[0] + (size_t)i] = ref[0].id[i];
        len2[v] = len[0] + (size_t)ref[0].n;
        for (size_t i = 0; i < extra; i++) A2[v][len2[v]++] = P[1][100 + i];
    }
    for (int v = 0; v < 2; v++) {
        const int32_t *q = A2[v];
        SI_NEED(si_run(e, s, 1, &q, &len2[v], &c2[v]), "%s", label);
        CHECK(c2[v].cached > 0, "%s: continued conversation %d reused no cached prefix", label, v);
    }
    pt_srv_sched_free(&s);

    /* 3. all four together, cold */
    s = si_sched(e, n_ctx);
    SI_NEED(s, "%s: scheduler", label);
    SI_NEED(si_run(e, s, 4, pp, len, r), "%s", label);
    for (int p = 0; p < 4; p++) {
        char what[128];
        snprintf(what, sizeof what, "%s: prompt %d (%zu tokens) in company vs alone", label, p, len[p]);
        CHECK(!si_differs(what, &ref[p], &r[p]), "%s", what);
    }
    pt_srv_sched_free(&s);

    /* 4b. the continued conversations cold, each on a fresh scheduler */
    for (int v = 0; v < 2; v++) {
        s = si_sched(e, n_ctx);
        SI_NEED(s, "%s: scheduler", label);
        const int32_t *q = A2[v];
        SI_NEED(si_run(e, s, 1, &q, &len2[v], &cold2[v]), "%s", label);
        pt_srv_sched_free(&s);
        char what[160];
        snprintf(what, sizeof what, "%s: continued conversation %d (%zu tokens, %zu reused) from the cache vs cold",
                 label, v, len2[v], c2[v].cached);
        CHECK(cold2[v].cached == 0 && !si_differs(what, &cold2[v], &c2[v]), "%s", what);
    }
    printf("INFO %s: replies of %d/%d/%d/%d tokens; A rerun reused %zu, D rerun %zu, conversations %zu and %zu\n",
           label, ref[0].n, ref[1].n, ref[2].n, ref[3].n, rc[0].cached, rc[3].cached, c2[0].cached, c2[1].cached);
}

#endif
