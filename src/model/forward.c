/* The forward driver for the Llama-style decoder families (llama, qwen2,
 * qwen3, qwen3_moe, minicpm, Gemma 2/3's sandwich-norm variant of the same
 * block, and Qwen3.5, whose gated attention / Gated DeltaNet mixers live in
 * qwen3_5.c): per-session buffers and the pass itself, read
 * entirely from pt_net (every per-layer constant resolved at load by
 * llama.c). Differences between the families are data in pt_layer/pt_net
 * (biases, QK-norm, MoE, residual and embedding scales), never a branch on
 * an architecture name.
 *
 * Every step calls the backend op table; nothing here knows which backend
 * runs it. Buffers are sized once in pt_fwd_init, so a decode step
 * allocates nothing.
 *
 * The same pass serves continuous batching (pt_fwd_run_rows, driven by
 * runtime/batch.c): T rows that are each the next token of a different
 * sequence. Then the per-token ops run over the T rows as usual, matmuls go
 * through the batch-invariant matmul_rows, and the per-sequence ops (RoPE
 * table choice, KV append, attention) run row by row on each row's own
 * session state — so every row computes exactly what a single-token
 * pt_fwd_run of its session computes. */
#include "model/model.h"

#include "backend/cuda/cuda.h"
#include "backend/cuda/sample.h"
#include "base/error.h"
#include "runtime/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->be->ops)

static void *balloc(pt_model *m, size_t bytes, pt_status *st) {
    if (*st != PT_OK) return NULL;
    void *p = OPS(m)->alloc(m->be, bytes ? bytes : 64);
    if (!p) *st = pt_error_prefix(PT_ERR_NOMEM, "allocating %zu bytes of session buffers", bytes);
    return p;
}

/* y[T, N] = x[T, K]·Wᵀ. With batched rows (r != NULL) through matmul_rows,
 * whose row t equals the T = 1 matmul bit for bit (or T = 1 matmuls when the
 * backend has no matmul_rows): a row's result never depends on its batch. */
static pt_status mmul(pt_model *m, const pt_fwd_rows *r, float *y, const float *x, int T, const pt_matrix *w) {
    return pt_backend_matmul_as(m->be, y, x, T, w, r != NULL);
}

/* ys[i][T, ws[i]->rows] = x[T, K]·ws[i]ᵀ for n (1..4) weights over the same
 * x (q/k/v, gate/up): one matmul_multi when the backend has it (one launch
 * on CUDA), else mmul per weight; bit-identical to the mmul calls either
 * way (backend.h), batched rows included. */
static pt_status mmul_multi(pt_model *m, const pt_fwd_rows *r, int n, float *const *ys, const float *x, int T,
                            const pt_matrix *const *ws) {
    return pt_backend_matmul_multi(m->be, n, ys, x, T, ws, r != NULL);
}

pt_status pt_fwd_init(pt_model *m, pt_fwd_state *st, int n_ctx) {
    memset(st, 0, sizeof *st);
    const pt_net *n = &m->net;
    st->n_ctx = n_ctx;
    st->chunk = m->params.prefill_chunk < n_ctx ? m->params.prefill_chunk : n_ctx;
    st->logit_rows = st->chunk < 8 ? st->chunk : 8;
    size_t C = (size_t)st->chunk, H = (size_t)n->hidden;
    size_t QD = (size_t)n->max_heads * n->max_head_dim, KD = (size_t)n->max_kv * n->max_head_dim;
    size_t F = (size_t)n->max_ffn;
    pt_status s = PT_OK;
    st->kv = calloc((size_t)n->n_layers, sizeof *st->kv);
    if (!st->kv) return pt_error(PT_ERR_NOMEM, "out of memory for the KV cache descriptors");
    st->cache = calloc(1, sizeof *st->cache);
    if (!st->cache) {
        pt_fwd_free(m, st);
        return pt_error(PT_ERR_NOMEM, "out of memory for the KV cache");
    }
    /* full or rotating, full-precision or quantized: runtime/kv_cache.c */
    s = pt_kv_cache_init(m, st->cache, st->kv, n_ctx, st->chunk);
    st->x = balloc(m, C * H * 4, &s);
    st->xn = balloc(m, C * H * 4, &s);
    st->y = balloc(m, C * H * 4, &s);
    st->q = balloc(m, C * QD * 4, &s);
    st->k = balloc(m, C * KD * 4, &s);
    st->v = balloc(m, C * KD * 4, &s);
    st->att = balloc(m, C * QD * 4, &s);
    st->gate = balloc(m, C * F * 4, &s);
    st->up = balloc(m, C * F * 4, &s);
    st->act = balloc(m, C * F * 4, &s);
    if (n->max_experts > 0) {
        st->rlogits = balloc(m, C * (size_t)n->max_experts * 4, &s);
        st->rweights = balloc(m, C * (size_t)n->max_top_k * 4, &s);
        st->ridx = balloc(m, C * (size_t)n->max_top_k * 4, &s);
    }
    st->ids_dev = balloc(m, C * 4, &s);
    st->pos_dev = balloc(m, C * 4, &s);
    st->logits = balloc(m, (size_t)st->logit_rows * (size_t)n->vocab * 4, &s);
    for (int l = 0; l < n->n_layers; l++)
        if ((n->layers[l].moe_dense || n->layers[l].sh_ffn) && !st->y2) {
            st->y2 = balloc(m, C * H * 4, &s);
            st->xr = balloc(m, C * H * 4, &s);
        }
    const size_t LP = (size_t)n->n_layers * (size_t)n->ple_dim;
    if (n->ple_dim > 0) {
        st->ple = balloc(m, C * LP * 4, &s);
        st->ple2 = balloc(m, C * LP * 4, &s);
        st->pg = balloc(m, C * (size_t)n->ple_dim * 4, &s);
        st->pa = balloc(m, C * (size_t)n->ple_dim * 4, &s);
    }
    st->pos_host = malloc(C * sizeof *st->pos_host);
    if (s == PT_OK && !st->pos_host) s = pt_error(PT_ERR_NOMEM, "out of memory for positions");
    if (s == PT_OK) {
        pt_backend_limits lim = {0};
        lim.max_tokens = st->chunk;
        lim.max_ctx = n_ctx;
        lim.max_heads = n->max_heads;
        lim.max_head_dim = n->max_head_dim;
        int64_t mc = n->hidden;
        if ((int64_t)QD > mc) mc = (int64_t)QD;
        if ((int64_t)F > mc) mc = (int64_t)F;
        if ((int64_t)LP > mc) mc = (int64_t)LP;
        if (n->max_lin_value > mc) mc = n->max_lin_value; /* DeltaNet out_proj */
        lim.max_cols = mc;
        lim.max_ffn = n->max_ffn;
        lim.max_top_k = n->max_top_k;
        s = OPS(m)->reserve(m->be, &lim);
    }
    if (s == PT_OK) s = pt_qwen35_fwd_init(m, st); /* Qwen3.5 states and scratch; nothing for other families */
    if (s != PT_OK) {
        pt_fwd_free(m, st);
        return s;
    }
    return PT_OK;
}

/* Every captured decode step (st->graph). */
static void fwd_graphs_free(pt_fwd_state *st) {
    for (size_t g = 0; g < sizeof st->graph / sizeof st->graph[0]; g++) pt_cuda_graph_free(&st->graph[g]);
}

void pt_fwd_free(pt_model *m, pt_fwd_state *st) {
    pt_qwen35_fwd_free(m, st);
    if (st->cache) {
        pt_kv_cache_free(m, st->cache);
        free(st->cache);
    }
    free(st->kv);
    void *bufs[] = {st->x,       st->xn,       st->y,    st->q,       st->k,      st->v,      st->att,
                    st->gate,    st->up,       st->act,  st->rlogits, st->rweights, st->ridx, st->ids_dev,
                    st->pos_dev, st->logits,   st->ple,  st->ple2,    st->pg,     st->pa,
                    st->y2,      st->xr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) OPS(m)->dealloc(m->be, bufs[i]);
    free(st->pos_host);
    if (st->logits_ahead) OPS(m)->dealloc(m->be, st->logits_ahead);
    if (st->gs_ctl) OPS(m)->dealloc(m->be, st->gs_ctl);
    fwd_graphs_free(st);
    memset(st, 0, sizeof *st);
}

/* Gemma 4's MoE block (model.h): st->xn = ffn_norm(x) on entry, st->x the
 * residual stream r; the whole branch, post_ffn_norm included, -> st->y. */
static pt_status ffn_gemma4(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const pt_layer *L, int l, int T,
                             int pos0) {
    pt_backend *be = m->be;
    const pt_net *n = &m->net;
    const int64_t H = n->hidden;
    /* dense path */
    PT_TRY(mmul_multi(m, r, 2, (float *const[]){st->gate, st->up}, st->xn, T,
                      (const pt_matrix *const[]){&L->w_gate, &L->w_up}));
    PT_TRY(OPS(m)->glu(be, st->act, st->gate, st->up, T, L->ffn, L->ffn, L->glu));
    PT_TRY(mmul(m, r, st->y2, st->act, T, &L->w_down));
    PT_TRY(OPS(m)->rms_norm(be, st->y2, st->y2, NULL, T, H, L->post_ffn_norm_1, n->norm_type, L->norm_style, n->eps));
    /* router on the un-normed residual stream */
    PT_TRY(OPS(m)->rms_norm(be, st->xr, st->x, NULL, T, H, L->router_in_scale, PT_FT_F32, PT_RMS_W_F32, n->eps));
    PT_TRY(mmul(m, r, st->rlogits, st->xr, T, &L->router));
    if (m->route_cb && !r) m->route_cb(m->route_user, l, st->rlogits, T, pos0, L->route.n_experts, L->route.top_k);
    PT_TRY(OPS(m)->moe_route(be, st->ridx, st->rweights, st->rlogits, T, &L->route));
    /* experts on their own pre-norm */
    PT_TRY(OPS(m)->rms_norm(be, st->xr, st->x, NULL, T, H, L->pre_ffn_norm_2, n->norm_type, L->norm_style, n->eps));
    PT_TRY(OPS(m)->moe_ffn(be, st->y, st->xr, T, st->ridx, st->rweights, L->route.top_k, &L->ex_gate, &L->ex_up,
                           &L->ex_down, L->glu));
    PT_TRY(OPS(m)->rms_norm(be, st->y, st->y, NULL, T, H, L->post_ffn_norm_2, n->norm_type, L->norm_style, n->eps));
    return OPS(m)->add(be, st->y, st->y2, st->y, (int64_t)T * H);
}

/* Qwen3.5-MoE's shared expert, added to the routed experts' st->y:
 * y += σ(x·w_g)·down(act(gate(x))·up(x)), x = st->xn. The gate logit [T, 1]
 * is broadcast over each row of st->xr by doubling copies, so sigmoid_mul
 * rounds σ and the product as the reference does (bf16: σ(g) rounded, the
 * product rounded, the sum with the routed output rounded). */
static pt_status shared_expert(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const pt_layer *L, int T) {
    pt_backend *be = m->be;
    const int64_t H = m->net.hidden, S = L->sh_ffn;
    PT_TRY(mmul_multi(m, r, 2, (float *const[]){st->gate, st->up}, st->xn, T,
                      (const pt_matrix *const[]){&L->sh_gate, &L->sh_up}));
    PT_TRY(OPS(m)->glu(be, st->act, st->gate, st->up, T, S, S, L->glu));
    PT_TRY(mmul(m, r, st->y2, st->act, T, &L->sh_down));
    PT_TRY(mmul(m, r, st->rlogits, st->xn, T, &L->sh_router)); /* [T, 1] (the routing is done with it) */
    PT_TRY(OPS(m)->copy_rows(be, st->xr, H, st->rlogits, 1, T, 1));
    for (int64_t w = 1; w < H; w *= 2) /* columns [0, w) -> [w, 2w) */
        PT_TRY(OPS(m)->copy_rows(be, st->xr + w, H, st->xr, H, T, w < H - w ? w : H - w));
    PT_TRY(OPS(m)->sigmoid_mul(be, st->y2, st->y2, st->xr, (int64_t)T * H));
    return OPS(m)->add(be, st->y, st->y, st->y2, (int64_t)T * H);
}

/* Feed-forward of one layer: st->xn (normed) -> st->y [T, H]. */
static pt_status ffn(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const pt_layer *L, int l, int T, int pos0) {
    pt_backend *be = m->be;
    if (!L->is_moe) {
        /* gate/up and the GLU in one op where the backend fuses them (CUDA
         * decode: the GEMV's epilogue; bit-identical), else the two calls */
        if (OPS(m)->matmul_glu) {
            const pt_status s = OPS(m)->matmul_glu(be, st->act, st->xn, T, &L->w_gate, &L->w_up, L->glu, r != NULL);
            if (s != PT_ERR_UNSUPPORTED) {
                PT_TRY(s);
                return mmul(m, r, st->y, st->act, T, &L->w_down);
            }
        }
        PT_TRY(mmul_multi(m, r, 2, (float *const[]){st->gate, st->up}, st->xn, T,
                          (const pt_matrix *const[]){&L->w_gate, &L->w_up}));
        PT_TRY(OPS(m)->glu(be, st->act, st->gate, st->up, T, L->ffn, L->ffn, L->glu));
        return mmul(m, r, st->y, st->act, T, &L->w_down);
    }
    if (L->moe_dense) return ffn_gemma4(m, st, r, L, l, T, pos0);
    PT_TRY(mmul(m, r, st->rlogits, st->xn, T, &L->router));
    if (m->route_cb && !r) m->route_cb(m->route_user, l, st->rlogits, T, pos0, L->route.n_experts, L->route.top_k);
    PT_TRY(OPS(m)->moe_route(be, st->ridx, st->rweights, st->rlogits, T, &L->route));
    PT_TRY(OPS(m)->moe_ffn(be, st->y, st->xn, T, st->ridx, st->rweights, L->route.top_k, &L->ex_gate, &L->ex_up,
                           &L->ex_down, L->glu));
    return L->sh_ffn ? shared_expert(m, st, r, L, T) : PT_OK;
}

/* gate/up and the GLU into st->act with the layer's FFN norm of x folded
 * in (backend.h matmul_glu_norm), x += add first where add is set; *done:
 * whether the backend took it (else nothing was enqueued: the caller makes
 * the rms_norm and ffn calls). optional: the backend may decline where the
 * fold does not pay (pt_norm_in.optional). */
static pt_status glu_norm(pt_model *m, pt_fwd_state *st, const pt_layer *L, int T, const float *add, int optional,
                         int *done) {
    const pt_net *n = &m->net;
    const pt_norm_in nrm = {L->ffn_norm, n->norm_type, L->norm_style, n->eps, add, optional};
    const pt_status s = OPS(m)->matmul_glu_norm(m->be, st->act, st->x, T, &L->w_gate, &L->w_up, L->glu, &nrm);
    *done = s == PT_OK;
    return s == PT_ERR_UNSUPPORTED ? PT_OK : s;
}

/* Gemma 4 per-layer inputs for the chunk, from the embedding output st->x:
 * ple[T, L, pd] = (norm(proj(x)·H^-0.5) + table[ids]·sqrt(pd)) · 2^-0.5. */
static pt_status ple_inputs(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, int T) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const int64_t LP = (int64_t)n->n_layers * n->ple_dim;
    PT_TRY(OPS(m)->embed(be, st->ple, st->ids_dev, T, &n->ple_embed, n->ple_embed_scale));
    PT_TRY(mmul(m, r, st->ple2, st->x, T, &n->ple_model_proj));
    PT_TRY(OPS(m)->scale(be, st->ple2, st->ple2, n->ple_proj_scale, (int64_t)T * LP));
    PT_TRY(OPS(m)->rms_norm(be, st->ple2, st->ple2, NULL, (int64_t)T * n->n_layers, n->ple_dim, n->ple_proj_norm,
                            n->norm_type, n->layers[0].norm_style, n->eps));
    PT_TRY(OPS(m)->add(be, st->ple, st->ple2, st->ple, (int64_t)T * LP));
    return OPS(m)->scale(be, st->ple, st->ple, n->ple_input_scale, (int64_t)T * LP);
}

/* The per-layer input gate of layer l, added to the residual stream:
 * x += norm(proj(gelu(gate(x)) ⊙ ple[:, l, :])). The layer's slice of ple
 * has row stride L·pd while the gate's rows are pd apart, so the gated
 * product runs one token at a time (pd is small: 256 in E2B/E4B). */
static pt_status ple_gate(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const pt_layer *L, int l, int T) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const int64_t pd = n->ple_dim, LP = (int64_t)n->n_layers * pd, H = n->hidden;
    PT_TRY(mmul(m, r, st->pg, st->x, T, &L->ple_gate));
    for (int t = 0; t < T; t++)
        PT_TRY(OPS(m)->glu(be, st->pa + (size_t)t * pd, st->pg + (size_t)t * pd, st->ple + (size_t)t * LP + (size_t)l * pd,
                           1, pd, pd, PT_GLU_GELU_TANH));
    PT_TRY(mmul(m, r, st->y, st->pa, T, &L->ple_proj));
    PT_TRY(OPS(m)->rms_norm(be, st->y, st->y, NULL, T, H, L->ple_post_norm, n->norm_type, L->norm_style, n->eps));
    return OPS(m)->add(be, st->x, st->x, st->y, (int64_t)T * H);
}

static pt_status residual(pt_model *m, pt_fwd_state *st, const pt_layer *L, int64_t n) {
    if (L->residual_scale != 1.0f) return OPS(m)->add_scaled(m->be, st->x, st->x, st->y, L->residual_scale, n);
    return OPS(m)->add(m->be, st->x, st->x, st->y, n);
}

/* The per-head q and k norms (either weight NULL: that norm is absent; k
 * NULL: no keys of the layer's own), in one backend call where the backend
 * has it (the same bits as the two). */
pt_status pt_fwd_qk_norm(pt_model *m, float *q, int64_t Tq, const void *wq, float *k, int64_t Tk, const void *wk,
                         int hd, pt_rms_style style) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    if (!k) wk = NULL;
    if (wq && wk && OPS(m)->rms_norm2) {
        const pt_status st = OPS(m)->rms_norm2(be, q, Tq, wq, k, Tk, wk, hd, n->norm_type, style, n->eps);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    if (wq) PT_TRY(OPS(m)->rms_norm(be, q, q, NULL, Tq, hd, wq, n->norm_type, style, n->eps));
    if (wk) PT_TRY(OPS(m)->rms_norm(be, k, k, NULL, Tk, hd, wk, n->norm_type, style, n->eps));
    return PT_OK;
}

/* RoPE on q [T, nh, hd] and, if k != NULL, on k [T, nkv, hd]: one call
 * where the backend has the fused op (bit-identical to the two calls). */
static pt_status rope_qk(pt_model *m, float *q, float *k, int64_t T, int nh, int nkv, int hd, const int32_t *pos,
                         const pt_rope *rope) {
    if (OPS(m)->rope_qk) return OPS(m)->rope_qk(m->be, q, k, T, nh, nkv, hd, pos, rope);
    PT_TRY(OPS(m)->rope(m->be, q, T, nh, hd, pos, rope));
    return k ? OPS(m)->rope(m->be, k, T, nkv, hd, pos, rope) : PT_OK;
}

/* Batched rows: RoPE, KV append and attention of layer l, row t being the
 * next token of sequence r->seq[t] at position r->pos[t] — each row the
 * T = 1 calls its own pt_fwd_run would make, on its own caches. */
static pt_status rows_attention(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const pt_layer *L, int l,
                                int T) {
    pt_backend *be = m->be;
    const int nh = L->n_heads, nkv = L->n_kv, hd = L->head_dim, own_kv = !L->kv_shared;
    const size_t qd = (size_t)nh * hd, kd = (size_t)nkv * hd; /* this layer's row strides */
    pt_attn attn = L->attn;
    attn.fused_decode = m->params.fused_decode_attn == PT_LEVER_ON;
    /* the key bound: a captured step's (runtime/batch.c), else the rows' own */
    attn.max_keys = st->keys_bound < 0 ? 0 : st->keys_bound;
    for (int t = 0; t < T && st->keys_bound == 0; t++)
        if ((int64_t)r->pos[t] + 1 > attn.max_keys) attn.max_keys = (int64_t)r->pos[t] + 1;
    if (r->kvp && own_kv && !L->inv_freq_long && OPS(m)->rope_kv_attention) {
        /* RoPE, the cache writes and the attention in one call (bit-identical) */
        const pt_status fold = OPS(m)->rope_kv_attention(be, st->att, st->q, st->k, st->v, T, st->pos_dev, &L->rope,
                                                         &r->seq[0]->kv[l], r->kvp + (size_t)l * T * 2, &attn);
        if (fold != PT_ERR_UNSUPPORTED) return fold;
    }
    if (!L->inv_freq_long) { /* one table: every row at its own position in one call */
        PT_TRY(rope_qk(m, st->q, own_kv ? st->k : NULL, T, nh, nkv, hd, st->pos_dev, &L->rope));
    }
    if (r->kvp) { /* one multi-sequence op per layer over the rows' cache table */
        if (L->inv_freq_long) /* longrope: per-row table choice from the host positions */
            for (int t = 0; t < T; t++) {
                pt_rope rope = L->rope;
                if ((int64_t)r->pos[t] + 1 > L->rope_switch_len) {
                    rope.inv_freq = L->inv_freq_long;
                    rope.attn_scale = L->attn_long_scale;
                }
                PT_TRY(rope_qk(m, st->q + t * qd, own_kv ? st->k + t * kd : NULL, 1, nh, nkv, hd, st->pos_dev + t,
                               &rope));
            }
        const int src = L->kv_shared ? L->kv_src : l;
        if (own_kv)
            PT_TRY(OPS(m)->kv_append_rows(be, &r->seq[0]->kv[l], r->kvp + (size_t)l * T * 2, st->k, st->v, T,
                                          st->pos_dev));
        return OPS(m)->attention_rows(be, st->att, st->q, T, st->pos_dev, &r->seq[0]->kv[src],
                                      r->kvp + (size_t)src * T * 2, &attn);
    }
    for (int t = 0; t < T; t++) {
        pt_fwd_state *sq = r->seq[t];
        const int32_t *pos = st->pos_dev + t;
        if (L->inv_freq_long) { /* longrope: the table depends on the row's position */
            pt_rope rope = L->rope;
            if ((int64_t)r->pos[t] + 1 > L->rope_switch_len) {
                rope.inv_freq = L->inv_freq_long;
                rope.attn_scale = L->attn_long_scale;
            }
            PT_TRY(rope_qk(m, st->q + t * qd, own_kv ? st->k + t * kd : NULL, 1, nh, nkv, hd, pos, &rope));
        }
        if (own_kv) PT_TRY(OPS(m)->kv_append(be, &sq->kv[l], st->k + t * kd, st->v + t * kd, 1, pos));
        PT_TRY(OPS(m)->attention(be, st->att + t * qd, st->q + t * qd, 1, pos, &sq->kv[L->kv_shared ? L->kv_src : l],
                                 &attn));
    }
    return PT_OK;
}

/* The pass itself, enqueue only (capturable into a CUDA graph): embedding,
 * layers, and with n_logits > 0 the final norm of the last n_logits rows,
 * whose start is returned in *hn_out. The ids and positions are already in
 * st->ids_dev / st->pos_dev. */
static pt_status fwd_body(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, int T, int pos0, int n_logits,
                          float **hn_out) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const int64_t H = n->hidden;
    PT_TRY(OPS(m)->embed(be, st->x, st->ids_dev, T, &n->embed, n->embed_scale));
    if (m->hidden_cb && !r) m->hidden_cb(m->hidden_user, -1, st->x, T, pos0, H);
    if (n->ple_dim > 0) PT_TRY(ple_inputs(m, st, r, T));
    if (st->conv_state) PT_TRY(pt_qwen35_begin(m, st, pos0));
    /* The residual adds with scale 1 ride in the next rms_norm's fused form
     * (x += y, then xn = rms_norm(x)): bit-identical to the add followed by
     * the norm on every backend (backend.h), one kernel fewer each. pend: the
     * add x += y of the previous layer's FFN is still to do. */
    int pend = 0;
    /* The backend may fold a decode row's norms into the matmuls that read
     * them and the residual adds into the matmuls whose outputs they add
     * (backend.h matmul_norm, matmul_glu_norm, matmul_add; bit-identical):
     * tried op by op, each falling back to the calls it replaces. */
    const int fold = !r && OPS(m)->matmul_norm && OPS(m)->matmul_glu_norm && OPS(m)->matmul_add &&
                     !(m->hidden_cb && !r);
    /* Batched rows: the norms alone, each with the pending residual add
     * (pt_norm_in.add; the backend applies it first and writes x back, as
     * rms_norm's fused form does) */
    const int rfold = r && OPS(m)->matmul_norm && OPS(m)->matmul_glu_norm;
    for (int l = 0; l < n->n_layers; l++) {
        const pt_layer *L = &n->layers[l];
        const int std_attn = !L->is_linear && !L->attn_gate;
        const int own_kv = !L->kv_shared;
        /* q, k, v (q, k with K=V; q alone sharing another layer's cache) over the same xn */
        const int nproj = own_kv ? (L->k_eq_v ? 2 : 3) : 1;
        float *const qkv_out[] = {st->q, st->k, st->v};
        const pt_matrix *const qkv_w[] = {&L->wq, &L->wk, &L->wv};
        int qkv_done = 0; /* q, k, v projected from x with the norm folded in */
        if (std_attn && ((fold && !pend) || rfold)) {
            /* a decode row's fold is the backend's choice (optional); the batched rows' is not */
            const pt_norm_in nrm = {L->attn_norm, n->norm_type, L->norm_style, n->eps, pend ? st->y : NULL, !r};
            const pt_status s = OPS(m)->matmul_norm(be, nproj, qkv_out, st->x, T, qkv_w, &nrm);
            if (s != PT_OK && s != PT_ERR_UNSUPPORTED) return s;
            qkv_done = s == PT_OK;
        }
        if (!qkv_done)
            PT_TRY(OPS(m)->rms_norm(be, st->xn, pend ? st->y : st->x, pend ? st->x : NULL, T, H, L->attn_norm,
                                    n->norm_type, L->norm_style, n->eps));
        pend = 0;
        int o_added = 0; /* the output projection already added into x */
        if (!std_attn) {
            PT_TRY(pt_qwen35_mixer(m, st, L, l, T)); /* Qwen3.5: qwen3_5.c (never with batched rows) */
        } else {
            const int nh = L->n_heads, nkv = L->n_kv, hd = L->head_dim;
            pt_kv_layer *kvl = &st->kv[L->kv_shared ? L->kv_src : l];
            if (!qkv_done) PT_TRY(mmul_multi(m, r, nproj, qkv_out, st->xn, T, qkv_w));
            if (own_kv && L->k_eq_v) /* Gemma 4 K=V: V starts as the raw K projection (a copy: scaling by 1 is exact) */
                PT_TRY(OPS(m)->scale(be, st->v, st->k, 1.0f, (int64_t)T * nkv * hd));
            if (own_kv && L->v_norm) /* Gemma 4: values RMS-normalised per head, no weight */
                PT_TRY(OPS(m)->rms_norm(be, st->v, st->v, NULL, (int64_t)T * nkv, hd, NULL, n->norm_type, PT_RMS_NOSCALE,
                                        n->eps));
            PT_TRY(pt_fwd_qk_norm(m, st->q, (int64_t)T * nh, L->q_norm, own_kv ? st->k : NULL, (int64_t)T * nkv,
                                  L->k_norm, hd, L->qk_style));
            pt_attn attn = L->attn;
            attn.fused_decode = m->params.fused_decode_attn == PT_LEVER_ON;
            attn.max_keys = st->keys_bound > 0 ? st->keys_bound : st->keys_bound < 0 ? 0 : (int64_t)pos0 + T;
            if (r) {
                /* the output projection right after reads the attention's output (backend.h handoff_hint) */
                if (OPS(m)->handoff_hint) OPS(m)->handoff_hint(be);
                PT_TRY(rows_attention(m, st, r, L, l, T));
            } else {
                pt_rope rope = L->rope;
                if (L->inv_freq_long && (int64_t)pos0 + T > L->rope_switch_len) {
                    /* longrope past the original context: the long-factor table */
                    rope.inv_freq = L->inv_freq_long;
                    rope.attn_scale = L->attn_long_scale;
                }
                pt_status fold = PT_ERR_UNSUPPORTED;
                if (own_kv && T == 1 && OPS(m)->rope_kv_attention && !st->kv[l].bits) {
                    /* RoPE, the cache write and the attention in one call (bit-identical) */
                    fold = OPS(m)->rope_kv_attention(be, st->att, st->q, st->k, st->v, 1, st->pos_dev, &rope,
                                                     &st->kv[l], NULL, &attn);
                    if (fold != PT_OK && fold != PT_ERR_UNSUPPORTED) return fold;
                }
                if (fold == PT_OK) {
                } else if (own_kv && OPS(m)->rope_qk_kv_append) {
                    /* RoPE and the cache write in one call (bit-identical) */
                    PT_TRY(OPS(m)->rope_qk_kv_append(be, st->q, st->k, st->v, T, nh, nkv, hd, st->pos_dev, &rope,
                                                     &st->kv[l]));
                } else {
                    PT_TRY(rope_qk(m, st->q, own_kv ? st->k : NULL, T, nh, nkv, hd, st->pos_dev, &rope));
                    if (own_kv) PT_TRY(OPS(m)->kv_append(be, &st->kv[l], st->k, st->v, T, st->pos_dev));
                }
                /* a KV-shared layer attends over its donor's cache, which already holds this chunk */
                if (fold != PT_OK) PT_TRY(OPS(m)->attention(be, st->att, st->q, T, st->pos_dev, kvl, &attn));
            }
            if (fold && !L->sandwich && L->residual_scale == 1.0f) {
                if (T == 1 && !L->is_moe && OPS(m)->prefetch_hint) {
                    /* the FFN's weights, wanted after this projection and the norm */
                    const pt_matrix *const ffw[] = {&L->w_gate, &L->w_up, &L->w_down};
                    OPS(m)->prefetch_hint(be, ffw, 3);
                }
                const pt_status s = OPS(m)->matmul_add(be, st->x, st->att, T, &L->wo);
                if (s != PT_OK && s != PT_ERR_UNSUPPORTED) return s;
                o_added = s == PT_OK;
            }
            if (!o_added) PT_TRY(mmul(m, r, st->y, st->att, T, &L->wo));
        }
        int ffn_folded = 0; /* gate/up read x with the norm folded in (st->act holds the GLU) */
        if (o_added) {
            if (!L->is_moe) PT_TRY(glu_norm(m, st, L, T, NULL, 1, &ffn_folded));
            if (!ffn_folded)
                PT_TRY(OPS(m)->rms_norm(be, st->xn, st->x, NULL, T, H, L->ffn_norm, n->norm_type, L->norm_style,
                                        n->eps));
        } else {
            if (L->sandwich)
                PT_TRY(OPS(m)->rms_norm(be, st->y, st->y, NULL, T, H, L->post_attn_norm, n->norm_type,
                                        L->norm_style, n->eps));
            if (L->residual_scale == 1.0f) {
                if (rfold && !L->is_moe) {
                    /* the down projection right after reads the GLU's output (backend.h handoff_hint) */
                    if (OPS(m)->handoff_hint) OPS(m)->handoff_hint(be);
                    PT_TRY(glu_norm(m, st, L, T, st->y, 0, &ffn_folded));
                }
                if (!ffn_folded)
                    PT_TRY(OPS(m)->rms_norm(be, st->xn, st->y, st->x, T, H, L->ffn_norm, n->norm_type,
                                            L->norm_style, n->eps));
            } else {
                PT_TRY(residual(m, st, L, (int64_t)T * H));
                PT_TRY(OPS(m)->rms_norm(be, st->xn, st->x, NULL, T, H, L->ffn_norm, n->norm_type, L->norm_style,
                                        n->eps));
            }
        }
        int down_added = 0; /* the down projection already added into x */
        if (ffn_folded) { /* o_added (no sandwich norms, residual scale 1), or batched rows: down into y */
            const pt_status s = r ? PT_ERR_UNSUPPORTED : OPS(m)->matmul_add(be, st->x, st->act, T, &L->w_down);
            if (s != PT_OK && s != PT_ERR_UNSUPPORTED) return s;
            down_added = s == PT_OK;
            if (!down_added) PT_TRY(mmul(m, r, st->y, st->act, T, &L->w_down));
        } else {
            PT_TRY(ffn(m, st, r, L, l, T, pos0));
        }
        if (L->sandwich)
            PT_TRY(OPS(m)->rms_norm(be, st->y, st->y, NULL, T, H, L->post_ffn_norm, n->norm_type, L->norm_style,
                                    n->eps));
        /* deferred into the next norm unless something reads x before it */
        if (down_added) {
        } else if (L->residual_scale == 1.0f && !L->ple_gate.rows && !L->has_layer_scalar && !(m->hidden_cb && !r))
            pend = 1;
        else
            PT_TRY(residual(m, st, L, (int64_t)T * H));
        if (L->ple_gate.rows) PT_TRY(ple_gate(m, st, r, L, l, T));
        if (L->has_layer_scalar) PT_TRY(OPS(m)->scale(be, st->x, st->x, L->layer_scalar, (int64_t)T * H));
        if (m->hidden_cb && !r) m->hidden_cb(m->hidden_user, l, st->x, T, pos0, H);
    }
    if (st->conv_state) st->lin_pos = (int64_t)pos0 + T; /* the DeltaNet states now hold positions < pos0 + T */
    /* the last add: into the final norm when that norm covers every row */
    if (pend && n_logits != T) {
        PT_TRY(OPS(m)->add(be, st->x, st->x, st->y, (int64_t)T * H));
        pend = 0;
    }
    *hn_out = NULL;
    if (n_logits == 0) return PT_OK;
    /* only the rows that need logits: the final norm and the lm_head */
    const int r0 = T - n_logits;
    float *hn = st->xn + (size_t)r0 * H;
    PT_TRY(OPS(m)->rms_norm(be, hn, pend ? st->y : st->x + (size_t)r0 * H, pend ? st->x : NULL, n_logits, H,
                            n->final_norm, n->norm_type, n->final_style, n->eps));
    if (m->hidden_cb && !r) m->hidden_cb(m->hidden_user, n->n_layers, hn, n_logits, pos0 + r0, H);
    if (n->logit_scale != 1.0f) PT_TRY(OPS(m)->scale(be, hn, hn, n->logit_scale, (int64_t)n_logits * H));
    *hn_out = hn;
    return PT_OK;
}

/* Logits of nb rows starting at hn into dst [nb, V] (enqueue only). */
static pt_status fwd_logits_to(pt_model *m, const pt_fwd_rows *r, const float *hn, int nb, float *dst) {
    const pt_net *n = &m->net;
    PT_TRY(mmul(m, r, dst, hn, nb, &n->lm_head));
    if (n->final_softcap > 0) PT_TRY(OPS(m)->softcap(m->be, dst, dst, n->final_softcap, (int64_t)nb * n->vocab));
    return PT_OK;
}

/* Logits of nb rows starting at hn into st->logits (enqueue only). */
static pt_status fwd_logits(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const float *hn, int nb) {
    return fwd_logits_to(m, r, hn, nb, st->logits);
}

/* CUDA compiled decode (DESIGN.md "Compiled decode"): a single-token step is
 * captured once into a CUDA graph and replayed for every later token; the
 * kernels read the token id and position from device memory, so only the
 * uploads before and the logits download after run outside the graph.
 * Replay is bit-identical to eager execution (tests/cuda test_graph_replay).
 * Not used with the debug callbacks, which read activations on the host.
 * ahead: the pipelined decode's step (pt_fwd_ahead_enqueue), the same step
 * captured with its logits into st->logits_ahead (2: and the greedy sample
 * of them, st->gs_ctl's row, at its end); it neither advances the
 * DeltaNet bookkeeping (never with those layers) nor calls
 * pt_kv_cache_step_done (pt_fwd_ahead_accept does). */
static pt_status fwd_decode_graph(pt_model *m, pt_fwd_state *st, int pos0, float *out, int ahead) {
    const pt_net *n = &m->net;
    int use_long = 0;
    for (int l = 0; l < n->n_layers; l++)
        if (n->layers[l].inv_freq_long && (int64_t)pos0 + 1 > n->layers[l].rope_switch_len) use_long = 1;
    const int dshort = (int64_t)pos0 + 1 <= PT_DEC_SHORT_KEYS;
    const int gi = use_long + 2 * (ahead != 0) + 4 * dshort + 8 * (ahead == 2);
    /* Qwen3.5: the DeltaNet states' bookkeeping is host-side; a replay
     * checks and advances it as the captured fwd_body would (the reset at
     * position 0 never runs here, see pt_fwd_run) */
    /* the fused-attention lever is baked into a capture: a change of it
     * (petrel bench --kv-ab switches it within a session) drops the graphs */
    const int fused = m->params.fused_decode_attn == PT_LEVER_ON;
    if (st->graph_fused != fused) {
        fwd_graphs_free(st);
        st->graph_fused = fused;
    }
    if (st->conv_state && st->graph[gi]) PT_TRY(pt_qwen35_begin(m, st, pos0));
    if (!st->graph[gi]) {
        PT_TRY(pt_cuda_graph_begin(m->be));
        float *hn = NULL;
        st->keys_bound = dshort ? PT_DEC_SHORT_KEYS : -1; /* the bound of every position the graph replays */
        pt_status s = fwd_body(m, st, NULL, 1, pos0, 1, &hn);
        st->keys_bound = 0;
        if (s == PT_OK) s = fwd_logits_to(m, NULL, hn, 1, ahead ? st->logits_ahead : st->logits);
        if (s == PT_OK && ahead == 2) s = pt_cuda_sample_greedy_launch(m->be, st->gs_ctl, n->vocab, st->pos_dev);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", s == PT_OK ? "" : pt_last_error());
        pt_status e = pt_cuda_graph_end(m->be, &st->graph[gi]);
        if (s != PT_OK) return pt_error(s, "compiled decode: capturing the step: %s", msg);
        PT_TRY(e);
    }
    PT_TRY(pt_cuda_graph_launch(m->be, st->graph[gi]));
    if (ahead) return PT_OK;
    if (st->conv_state) st->lin_pos = (int64_t)pos0 + 1;
    PT_TRY(pt_kv_cache_step_done(m, st->cache, st->kv, (int64_t)pos0 + 1));
    if (!out) return PT_OK; /* GPU sampling: the logits stay in st->logits */
    return OPS(m)->download(m->be, out, st->logits, (size_t)n->vocab * 4);
}

/* pt_fwd_run takes the captured step for (T, n_logits, pos0) */
static int decode_graph_ok(const pt_model *m, const pt_fwd_state *st, int T, int n_logits, int pos0) {
    /* A graph bakes the cache descriptors in: with quantized KV only once
     * the caches are converted (the conversion swaps them; after it the
     * descriptors are the quantized ones until a reset, which swaps back and
     * runs eagerly until the next conversion restores the same quantized
     * descriptors). Not for a Qwen3.5 step at position 0 either: it resets
     * the DeltaNet states with uploads, which cannot be captured. */
    return T == 1 && n_logits == 1 && m->device == PT_DEVICE_CUDA && m->params.compiled_decode == PT_LEVER_ON &&
           !m->hidden_cb && !m->route_cb && (!st->cache->any_quant || st->cache->converted) &&
           !(st->conv_state && pos0 == 0);
}

int pt_fwd_ahead_ok(const pt_model *m, const pt_fwd_state *st, int pos0) {
    if (pos0 < 0 || pos0 >= st->n_ctx || st->conv_state || !decode_graph_ok(m, st, 1, 1, pos0)) return 0;
    /* a rotating cache's row at pos0 replaces position pos0 - capacity,
     * which a later truncation could still need: no step ahead once the
     * ring has wrapped (before, the slot holds nothing of the context) */
    for (int l = 0; l < m->net.n_layers; l++)
        if (st->kv[l].k && st->kv[l].capacity < st->n_ctx && pos0 >= st->kv[l].capacity) return 0;
    return 1;
}

/* st->gs_ctl with its one row (uploaded once; the graphs bake its address) */
static pt_status fwd_gs_ctl(pt_model *m, pt_fwd_state *st) {
    if (st->gs_ctl) return PT_OK;
    pt_gsample_row row;
    memset(&row, 0, sizeof row);
    row.logits = st->logits_ahead;
    row.id_slot = st->ids_dev;
    row.greedy = 1;
    void *ctl = OPS(m)->alloc(m->be, pt_gsample_step_bytes());
    if (!ctl) return pt_error_prefix(PT_ERR_NOMEM, "pipelined decode: the step's sampler");
    pt_status s = OPS(m)->upload(m->be, ctl, &row, sizeof row);
    if (s != PT_OK) {
        OPS(m)->dealloc(m->be, ctl);
        return s;
    }
    st->gs_ctl = ctl;
    return PT_OK;
}

pt_status pt_fwd_ahead_enqueue(pt_model *m, pt_fwd_state *st, int pos0, int sample) {
    st->sampled = 0; /* ids_dev[0] is this step's id until its own sample writes the next */
    st->ahead_sampled = 0;
    if (!pt_fwd_ahead_ok(m, st, pos0))
        return pt_error(PT_ERR_INTERNAL, "pipelined decode: no step ahead at position %d", pos0);
    if (!st->logits_ahead) {
        st->logits_ahead = OPS(m)->alloc(m->be, (size_t)m->net.vocab * 4);
        if (!st->logits_ahead) return pt_error_prefix(PT_ERR_NOMEM, "pipelined decode: the step's logits");
    }
    if (sample) PT_TRY(fwd_gs_ctl(m, st));
    PT_TRY(fwd_decode_graph(m, st, pos0, NULL, sample ? 2 : 1));
    st->ahead_sampled = sample != 0;
    return PT_OK;
}

pt_status pt_fwd_ahead_accept(pt_model *m, pt_fwd_state *st, int pos0) {
    const int64_t V = m->net.vocab;
    st->sampled = 0;
    /* a plain copy of the f32 row: the logits are bit-identical to the
     * ones pt_fwd_run would have left in st->logits */
    PT_TRY(OPS(m)->copy_rows(m->be, st->logits, V, st->logits_ahead, V, 1, V));
    PT_TRY(pt_kv_cache_step_done(m, st->cache, st->kv, (int64_t)pos0 + 1));
    st->sampled = st->ahead_sampled;
    st->ahead_sampled = 0;
    return PT_OK;
}

pt_status pt_fwd_run(pt_model *m, pt_fwd_state *st, const int32_t *ids, int T, int pos0, int n_logits, float *out) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const int64_t H = n->hidden;
    if (T < 1 || T > st->chunk || n_logits < 0 || n_logits > T || pos0 < 0 || pos0 + T > st->n_ctx)
        return pt_error(PT_ERR_INTERNAL, "forward: bad call (T %d, chunk %d, pos0 %d, n_ctx %d, logits %d)", T,
                        st->chunk, pos0, st->n_ctx, n_logits);
    st->sampled = st->ahead_sampled = 0; /* ids_dev and st->logits change */
    for (int t = 0; t < T; t++) st->pos_host[t] = pos0 + t;
    PT_TRY(OPS(m)->upload(be, st->ids_dev, ids, (size_t)T * 4));
    PT_TRY(OPS(m)->upload(be, st->pos_dev, st->pos_host, (size_t)T * 4));
    if (decode_graph_ok(m, st, T, n_logits, pos0)) return fwd_decode_graph(m, st, pos0, out, 0);
    float *hn = NULL;
    PT_TRY(fwd_body(m, st, NULL, T, pos0, n_logits, &hn));
    /* quantized KV: convert the caches once they hold quantized_kv_start
     * tokens (the logits below do not read the caches) */
    PT_TRY(pt_kv_cache_step_done(m, st->cache, st->kv, (int64_t)pos0 + T));
    for (int r = 0; r < n_logits; r += st->logit_rows) {
        int nb = n_logits - r < st->logit_rows ? n_logits - r : st->logit_rows;
        PT_TRY(fwd_logits(m, st, NULL, hn + (size_t)r * H, nb));
        if (out) /* NULL: GPU sampling reads them from st->logits (n_logits 1) */
            PT_TRY(OPS(m)->download(be, out + (size_t)r * n->vocab, st->logits, (size_t)nb * n->vocab * 4));
    }
    return PT_OK;
}

int pt_fwd_rows_supported(const pt_model *m) {
    for (int l = 0; l < m->net.n_layers; l++)
        if (m->net.layers[l].is_linear || m->net.layers[l].attn_gate) return 0;
    return 1;
}

pt_status pt_fwd_run_rows(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const int32_t *ids,
                          float *const *outs) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const int T = r->n;
    if (!pt_fwd_rows_supported(m))
        return pt_error(PT_ERR_UNSUPPORTED, "batched forward: not implemented for Qwen3.5's recurrent layers");
    if (T < 1 || T > st->chunk)
        return pt_error(PT_ERR_INTERNAL, "batched forward: %d rows (buffers for %d)", T, st->chunk);
    for (int t = 0; t < T; t++)
        if (r->pos[t] < 0 || r->pos[t] >= r->seq[t]->n_ctx)
            return pt_error(PT_ERR_INTERNAL, "batched forward: row %d at position %d of a %d-token context", t,
                            r->pos[t], r->seq[t]->n_ctx);
    for (int t = 0; t < T; t++) r->seq[t]->sampled = r->seq[t]->ahead_sampled = 0; /* their logits change */
    PT_TRY(OPS(m)->upload(be, st->ids_dev, ids, (size_t)T * 4));
    PT_TRY(OPS(m)->upload(be, st->pos_dev, r->pos, (size_t)T * 4));
    float *hn = NULL;
    PT_TRY(fwd_body(m, st, r, T, 0, T, &hn));
    for (int t = 0; t < T; t++) PT_TRY(pt_kv_cache_step_done(m, r->seq[t]->cache, r->seq[t]->kv, (int64_t)r->pos[t] + 1));
    for (int r0 = 0; r0 < T; r0 += st->logit_rows) {
        int nb = T - r0 < st->logit_rows ? T - r0 : st->logit_rows;
        PT_TRY(fwd_logits(m, st, r, hn + (size_t)r0 * n->hidden, nb));
        for (int j = 0; j < nb; j++) {
            const float *src = st->logits + (size_t)j * n->vocab;
            if (outs[r0 + j])
                PT_TRY(OPS(m)->download(be, outs[r0 + j], src, (size_t)n->vocab * 4));
            else /* GPU sampling: into the row's own session buffer, on the device */
                PT_TRY(OPS(m)->copy_rows(be, r->seq[r0 + j]->logits, n->vocab, src, n->vocab, 1, n->vocab));
        }
    }
    return PT_OK;
}

pt_status pt_fwd_rows_enqueue(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, float *logits) {
    if (!r->kvp || !OPS(m)->kv_append_rows || !OPS(m)->attention_rows || r->n < 1 || r->n > st->chunk ||
        !r->seq[0] || !pt_fwd_rows_supported(m))
        return pt_error(PT_ERR_INTERNAL, "batched forward (kvp mode): bad call (%d rows, buffers for %d)", r->n,
                        st->chunk);
    float *hn = NULL;
    PT_TRY(fwd_body(m, st, r, r->n, 0, r->n, &hn));
    return fwd_logits_to(m, r, hn, r->n, logits);
}

static int64_t weight_bytes(const pt_matrix *w) {
    if (!w->rows) return 0;
    int64_t ne = w->n_experts > 0 ? w->n_experts : 1;
    if (w->bits)
        return ne * w->rows * (w->cols * w->bits / 8 + 2 * (w->cols / w->group_size) * (int64_t)pt_ftype_size(w->dtype));
    return ne * w->rows * w->cols * (int64_t)pt_ftype_size(w->dtype);
}

int64_t pt_net_decode_bytes(const pt_net *n) {
    int64_t b = weight_bytes(&n->lm_head);
    for (int l = 0; l < n->n_layers; l++) {
        const pt_layer *L = &n->layers[l];
        b += weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv) + weight_bytes(&L->wo);
        b += weight_bytes(&L->lin_qkv) + weight_bytes(&L->lin_z) + weight_bytes(&L->lin_b) + weight_bytes(&L->lin_a) +
             weight_bytes(&L->lin_out);
        if (L->is_moe) {
            int64_t ex = weight_bytes(&L->ex_gate) + weight_bytes(&L->ex_up) + weight_bytes(&L->ex_down);
            b += weight_bytes(&L->router) + ex / L->route.n_experts * L->route.top_k;
            b += weight_bytes(&L->sh_gate) + weight_bytes(&L->sh_up) + weight_bytes(&L->sh_down) +
                 weight_bytes(&L->sh_router);
        }
        if (!L->is_moe || L->moe_dense) /* Gemma 4 runs the dense MLP beside the experts */
            b += weight_bytes(&L->w_gate) + weight_bytes(&L->w_up) + weight_bytes(&L->w_down);
        b += weight_bytes(&L->ple_gate) + weight_bytes(&L->ple_proj);
    }
    /* per-layer inputs: the projection, and one row of the table per token */
    b += weight_bytes(&n->ple_model_proj);
    if (n->ple_embed.rows) b += weight_bytes(&n->ple_embed) / n->ple_embed.rows;
    return b;
}

int64_t pt_net_kv_bytes_per_token(const pt_net *n) {
    int64_t b = 0;
    for (int l = 0; l < n->n_layers; l++)
        if (!n->layers[l].kv_shared) /* KV-shared layers own no cache */
            b += 2 * (int64_t)n->layers[l].n_kv * n->layers[l].head_dim * (int64_t)pt_ftype_size(n->kv_dtype);
    return b;
}
