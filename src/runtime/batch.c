/* The batched decode step (runtime/batch.h) and pt_session_decode_batch.
 *
 * The layer loop mirrors pt_fwd_run (src/model/forward.c) op for op, with T
 * = 1 per session replaced by B rows: what is per token (embedding, norms,
 * projections, GLU, residual adds, MoE routing, the lm_head) runs once over
 * the [B, ...] rows; what is per sequence (KV append, attention) runs per
 * row on that session's cache at its position. The two must stay in step:
 * tests/test_batch.c compares them bit for bit.
 *
 * Batch invariance rests on three facts:
 *   - matmuls go through the backend's matmul_rows, whose row t equals the
 *     T = 1 matmul bit for bit (falling back to T = 1 matmul calls when a
 *     backend has no matmul_rows);
 *   - every other per-token op computes each row (element) with code that
 *     does not depend on the number of rows (backend.h "Determinism");
 *   - per-sequence ops run exactly the single-session call (T = 1).
 *
 * Not supported here: the debugging callbacks (hidden_cb/route_cb) are not
 * invoked by a batched step. */
#include "runtime/batch.h"

#include "base/error.h"
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->be->ops)

/* The step's activations (backend memory, f32 unless noted), rows = cap. */
typedef struct pt_batch_bufs {
    int cap;                   /* rows the buffers hold */
    float *x, *xn, *y;         /* [cap, H] */
    float *q, *att;            /* [cap, max_heads·hd] */
    float *k, *v;              /* [cap, max_kv·hd] */
    float *gate, *up, *act;    /* [cap, max_ffn] */
    float *rlogits, *rweights; /* MoE: [cap, E], [cap, top_k] */
    int32_t *ridx;             /* MoE: [cap, top_k] */
    int32_t *ids_dev, *pos_dev;/* [cap] */
    float *logits;             /* [cap, V] */
} pt_batch_bufs;

static void bufs_free(pt_model *m, pt_batch_bufs *b) {
    void *all[] = {b->x,       b->xn,   b->y,    b->q,    b->att,  b->k,       b->v,       b->gate,
                   b->up,      b->act,  b->rlogits, b->rweights, b->ridx, b->ids_dev, b->pos_dev, b->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) OPS(m)->dealloc(m->be, all[i]);
    memset(b, 0, sizeof *b);
}

void pt_batch_free(pt_model *m) {
    pt_batch_bufs *b = m->batch;
    if (!b) return;
    bufs_free(m, b);
    free(b);
    m->batch = NULL;
}

static void *balloc(pt_model *m, size_t bytes, pt_status *st) {
    if (*st != PT_OK) return NULL;
    void *p = OPS(m)->alloc(m->be, bytes ? bytes : 64);
    if (!p) *st = pt_error_prefix(PT_ERR_NOMEM, "allocating %zu bytes of batch buffers", bytes);
    return p;
}

/* Makes m->batch hold at least B rows (grown to a power of two, at least 8,
 * so a server's slowly growing batch reallocates rarely). */
static pt_status bufs_reserve(pt_model *m, int B) {
    if (!m->batch) {
        m->batch = calloc(1, sizeof(pt_batch_bufs));
        if (!m->batch) return pt_error(PT_ERR_NOMEM, "out of memory for the batch buffers");
        m->batch_free = pt_batch_free;
    }
    pt_batch_bufs *b = m->batch;
    if (b->cap >= B) return PT_OK;
    int cap = 8;
    while (cap < B) cap *= 2;
    bufs_free(m, b);
    const pt_net *n = &m->net;
    size_t C = (size_t)cap, H = (size_t)n->hidden;
    size_t QD = (size_t)n->max_heads * n->max_head_dim, KD = (size_t)n->max_kv * n->max_head_dim;
    size_t F = (size_t)n->max_ffn;
    pt_status s = PT_OK;
    b->x = balloc(m, C * H * 4, &s);
    b->xn = balloc(m, C * H * 4, &s);
    b->y = balloc(m, C * H * 4, &s);
    b->q = balloc(m, C * QD * 4, &s);
    b->att = balloc(m, C * QD * 4, &s);
    b->k = balloc(m, C * KD * 4, &s);
    b->v = balloc(m, C * KD * 4, &s);
    b->gate = balloc(m, C * F * 4, &s);
    b->up = balloc(m, C * F * 4, &s);
    b->act = balloc(m, C * F * 4, &s);
    if (n->max_experts > 0) {
        b->rlogits = balloc(m, C * (size_t)n->max_experts * 4, &s);
        b->rweights = balloc(m, C * (size_t)n->max_top_k * 4, &s);
        b->ridx = balloc(m, C * (size_t)n->max_top_k * 4, &s);
    }
    b->ids_dev = balloc(m, C * 4, &s);
    b->pos_dev = balloc(m, C * 4, &s);
    b->logits = balloc(m, C * (size_t)n->vocab * 4, &s);
    if (s == PT_OK) {
        /* the per-op scratch for `cap` rows (attention runs at T = 1, so its
         * context limit is left to the sessions' own reservations) */
        pt_backend_limits lim = {0};
        lim.max_tokens = cap;
        lim.max_heads = n->max_heads;
        lim.max_head_dim = n->max_head_dim;
        int64_t mc = n->hidden;
        if ((int64_t)QD > mc) mc = (int64_t)QD;
        if ((int64_t)F > mc) mc = (int64_t)F;
        lim.max_cols = mc;
        lim.max_ffn = n->max_ffn;
        lim.max_top_k = n->max_top_k;
        s = OPS(m)->reserve(m->be, &lim);
    }
    if (s != PT_OK) {
        bufs_free(m, b);
        return s;
    }
    b->cap = cap;
    return PT_OK;
}

/* y[B, rows] = x[B, cols] · Wᵀ with row b bit-identical to a T = 1 matmul. */
static pt_status mm(pt_model *m, float *y, const float *x, int B, const pt_matrix *w) {
    if (OPS(m)->matmul_rows) return OPS(m)->matmul_rows(m->be, y, x, B, w, 0);
    for (int b = 0; b < B; b++)
        PT_TRY(OPS(m)->matmul(m->be, y + (size_t)b * w->rows, x + (size_t)b * w->cols, 1, w, 0));
    return PT_OK;
}

static pt_status ffn(pt_model *m, pt_batch_bufs *b, const pt_layer *L, int B) {
    pt_backend *be = m->be;
    if (!L->is_moe) {
        PT_TRY(mm(m, b->gate, b->xn, B, &L->w_gate));
        PT_TRY(mm(m, b->up, b->xn, B, &L->w_up));
        PT_TRY(OPS(m)->glu(be, b->act, b->gate, b->up, B, L->ffn, L->ffn, L->glu));
        return mm(m, b->y, b->act, B, &L->w_down);
    }
    PT_TRY(mm(m, b->rlogits, b->xn, B, &L->router));
    PT_TRY(OPS(m)->moe_route(be, b->ridx, b->rweights, b->rlogits, B, &L->route));
    /* moe_ffn's rows are independent (each token's experts in its own loop) */
    return OPS(m)->moe_ffn(be, b->y, b->xn, B, b->ridx, b->rweights, L->route.top_k, &L->ex_gate, &L->ex_up,
                           &L->ex_down, L->glu);
}

static pt_status residual(pt_model *m, pt_batch_bufs *b, const pt_layer *L, int64_t n) {
    if (L->residual_scale != 1.0f) return OPS(m)->add_scaled(m->be, b->x, b->x, b->y, L->residual_scale, n);
    return OPS(m)->add(m->be, b->x, b->x, b->y, n);
}

pt_status pt_batch_forward(pt_model *m, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos, int B,
                           float *const *outs) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const int64_t H = n->hidden;
    if (B < 1) return pt_error(PT_ERR_INTERNAL, "batched forward: %d rows", B);
    for (int i = 0; i < B; i++)
        if (pos[i] < 0 || pos[i] >= sts[i]->n_ctx)
            return pt_error(PT_ERR_INTERNAL, "batched forward: row %d at position %d of a %d-token context", i, pos[i],
                            sts[i]->n_ctx);
    PT_TRY(bufs_reserve(m, B));
    pt_batch_bufs *b = m->batch;
    PT_TRY(OPS(m)->upload(be, b->ids_dev, ids, (size_t)B * 4));
    PT_TRY(OPS(m)->upload(be, b->pos_dev, pos, (size_t)B * 4));
    PT_TRY(OPS(m)->embed(be, b->x, b->ids_dev, B, &n->embed, n->embed_scale));
    for (int l = 0; l < n->n_layers; l++) {
        const pt_layer *L = &n->layers[l];
        const int nh = L->n_heads, nkv = L->n_kv, hd = L->head_dim;
        const size_t qd = (size_t)nh * hd, kd = (size_t)nkv * hd; /* this layer's row strides */
        PT_TRY(OPS(m)->rms_norm(be, b->xn, b->x, NULL, B, H, L->attn_norm, n->norm_type, L->norm_style, n->eps));
        PT_TRY(mm(m, b->q, b->xn, B, &L->wq));
        PT_TRY(mm(m, b->k, b->xn, B, &L->wk));
        PT_TRY(mm(m, b->v, b->xn, B, &L->wv));
        if (L->q_norm)
            PT_TRY(OPS(m)->rms_norm(be, b->q, b->q, NULL, (int64_t)B * nh, hd, L->q_norm, n->norm_type, L->qk_style,
                                    n->eps));
        if (L->k_norm)
            PT_TRY(OPS(m)->rms_norm(be, b->k, b->k, NULL, (int64_t)B * nkv, hd, L->k_norm, n->norm_type,
                                    L->qk_style, n->eps));
        if (!L->inv_freq_long) { /* one table: every row at its own position in one call */
            PT_TRY(OPS(m)->rope(be, b->q, B, nh, hd, b->pos_dev, &L->rope));
            PT_TRY(OPS(m)->rope(be, b->k, B, nkv, hd, b->pos_dev, &L->rope));
        } else {
            /* longrope: the table depends on the row's position (pt_fwd_run
             * switches when pos0 + T exceeds rope_switch_len, T = 1 here) */
            for (int i = 0; i < B; i++) {
                pt_rope rope = L->rope;
                if ((int64_t)pos[i] + 1 > L->rope_switch_len) {
                    rope.inv_freq = L->inv_freq_long;
                    rope.attn_scale = L->attn_long_scale;
                }
                PT_TRY(OPS(m)->rope(be, b->q + i * qd, 1, nh, hd, b->pos_dev + i, &rope));
                PT_TRY(OPS(m)->rope(be, b->k + i * kd, 1, nkv, hd, b->pos_dev + i, &rope));
            }
        }
        for (int i = 0; i < B; i++) { /* per sequence: its own cache at its own position */
            pt_kv_layer *kv = &sts[i]->kv[l];
            PT_TRY(OPS(m)->kv_append(be, kv, b->k + i * kd, b->v + i * kd, 1, b->pos_dev + i));
            PT_TRY(OPS(m)->attention(be, b->att + i * qd, b->q + i * qd, 1, b->pos_dev + i, kv, &L->attn));
        }
        PT_TRY(mm(m, b->y, b->att, B, &L->wo));
        if (L->sandwich)
            PT_TRY(OPS(m)->rms_norm(be, b->y, b->y, NULL, B, H, L->post_attn_norm, n->norm_type, L->norm_style,
                                    n->eps));
        PT_TRY(residual(m, b, L, (int64_t)B * H));
        PT_TRY(OPS(m)->rms_norm(be, b->xn, b->x, NULL, B, H, L->ffn_norm, n->norm_type, L->norm_style, n->eps));
        PT_TRY(ffn(m, b, L, B));
        if (L->sandwich)
            PT_TRY(OPS(m)->rms_norm(be, b->y, b->y, NULL, B, H, L->post_ffn_norm, n->norm_type, L->norm_style,
                                    n->eps));
        PT_TRY(residual(m, b, L, (int64_t)B * H));
    }
    PT_TRY(OPS(m)->rms_norm(be, b->xn, b->x, NULL, B, H, n->final_norm, n->norm_type, n->final_style, n->eps));
    if (n->logit_scale != 1.0f) PT_TRY(OPS(m)->scale(be, b->xn, b->xn, n->logit_scale, (int64_t)B * H));
    /* the lm_head over all B rows (its weights read once), then each row's
     * logits to its session */
    PT_TRY(mm(m, b->logits, b->xn, B, &n->lm_head));
    if (n->final_softcap > 0) PT_TRY(OPS(m)->softcap(be, b->logits, b->logits, n->final_softcap, (int64_t)B * n->vocab));
    for (int i = 0; i < B; i++)
        PT_TRY(OPS(m)->download(be, outs[i], b->logits + (size_t)i * n->vocab, (size_t)n->vocab * 4));
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
