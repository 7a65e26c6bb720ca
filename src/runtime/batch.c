/* The batched decode step (runtime/batch.h) and pt_session_decode_batch.
 *
 * The pass itself is the model's forward pass (src/model/forward.c,
 * pt_fwd_run_rows) over rows that are each the next token of a different
 * session; this file owns the step's activation buffers (one forward state
 * per model, m->batch) and the public entry point's checks and session
 * bookkeeping.
 *
 * Batch invariance rests on three facts (tests/test_batch.c checks the
 * result bit for bit):
 *   - matmuls go through the backend's matmul_rows, whose row t equals the
 *     T = 1 matmul bit for bit (falling back to T = 1 matmul calls when a
 *     backend has no matmul_rows);
 *   - every other per-token op computes each row (element) with code that
 *     does not depend on the number of rows (backend.h "Determinism");
 *   - per-sequence ops (RoPE table choice, KV append, attention) run the
 *     single-session T = 1 calls on each row's own caches. */
#include "runtime/batch.h"

#include "base/error.h"
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

/* Makes m->batch a forward state whose buffers hold at least B rows (a
 * power of two, at least 8, so a server's growing batch reallocates
 * rarely). Its own KV cache (sized for `cap` tokens) is never used. */
static pt_status state_reserve(pt_model *m, int B) {
    pt_fwd_state *st = m->batch;
    if (st && st->chunk >= B) return PT_OK;
    int cap = 8;
    while (cap < B) cap *= 2;
    if (st) pt_batch_free(m);
    st = calloc(1, sizeof *st);
    if (!st) return pt_error(PT_ERR_NOMEM, "out of memory for the batch state");
    pt_status s = pt_fwd_init(m, st, cap);
    if (s != PT_OK) {
        free(st);
        return pt_error_prefix(s, "batch buffers for %d rows", cap);
    }
    m->batch = st;
    m->batch_free = pt_batch_free;
    return PT_OK;
}

void pt_batch_free(pt_model *m) {
    pt_fwd_state *st = m->batch;
    if (!st) return;
    pt_fwd_free(m, st);
    free(st);
    m->batch = NULL;
}

pt_status pt_batch_forward(pt_model *m, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos, int B,
                           float *const *outs) {
    if (B < 1) return pt_error(PT_ERR_INTERNAL, "batched forward: %d rows", B);
    if (!pt_fwd_rows_supported(m)) { /* Qwen3.5: one session at a time (same results, no weight sharing) */
        for (int i = 0; i < B; i++) PT_TRY(pt_fwd_run(m, sts[i], &ids[i], 1, pos[i], 1, outs[i]));
        return PT_OK;
    }
    PT_TRY(state_reserve(m, B));
    pt_fwd_state *st = m->batch;
    /* the buffers hold st->chunk rows (fewer than B only when the prefill
     * chunk is set below B): larger batches run in parts */
    for (int i = 0; i < B; i += st->chunk) {
        int nb = B - i < st->chunk ? B - i : st->chunk;
        pt_fwd_rows r = {.n = nb, .seq = sts + i, .pos = pos + i};
        PT_TRY(pt_fwd_run_rows(m, st, &r, ids + i, outs + i));
    }
    return PT_OK;
}

pt_status pt_session_decode_batch(pt_session *const *sessions, const int32_t *ids, int n) {
    if (!sessions || !ids) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: NULL argument");
    if (n < 1) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: %d sessions (need at least 1)", n);
    pt_model *m = sessions[0] ? sessions[0]->m : NULL;
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        if (!s) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: session %d is NULL", i);
        if (s->m != m)
            return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: session %d belongs to another model", i);
        for (int j = 0; j < i; j++)
            if (sessions[j] == s)
                return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: sessions %d and %d are the same session",
                                j, i);
        if (pt_session_check_ids(s, &ids[i], 1) != PT_OK)
            return pt_error_prefix(PT_ERR_RANGE, "pt_session_decode_batch: session %d", i);
    }
    /* small batches use the stack; larger ones one allocation per call */
    enum { SMALL = 16 };
    pt_fwd_state *sts_s[SMALL];
    float *outs_s[SMALL];
    int32_t pos_s[SMALL];
    pt_fwd_state **sts = sts_s;
    float **outs = outs_s;
    int32_t *pos = pos_s;
    void *heap = NULL;
    if (n > SMALL) {
        heap = malloc((size_t)n * (sizeof *sts + sizeof *outs + sizeof *pos));
        if (!heap) return pt_error(PT_ERR_NOMEM, "out of memory for a batch of %d sessions", n);
        sts = heap;
        outs = (float **)(sts + n);
        pos = (int32_t *)(outs + n);
    }
    for (int i = 0; i < n; i++) {
        sts[i] = &sessions[i]->fwd;
        outs[i] = sessions[i]->logits;
        pos[i] = (int32_t)sessions[i]->n_tokens;
    }
    pthread_mutex_lock(&m->lock);
    pt_status st = pt_batch_forward(m, sts, ids, pos, n, outs);
    pthread_mutex_unlock(&m->lock);
    free(heap);
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        if (st != PT_OK) {
            s->has_logits = 0;
            continue;
        }
        s->tokens[s->n_tokens++] = ids[i];
        s->has_logits = 1;
    }
    return st;
}
