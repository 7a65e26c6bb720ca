/* Qwen3.5 (qwen3_5, qwen3_5_text; the multimodal wrapper's text weights):
 * the two mixers of its hybrid decoder, called by the forward driver
 * (forward.c) in place of plain attention, and the per-session state they
 * need. Everything else of the block (the (1+w) or folded norms, the SwiGLU
 * MLP, the residuals, the final norm and lm_head) is the shared Llama-style
 * path, bound in llama.c from the model spec.
 *
 * Gated full attention (layers with attn_gate): q_proj yields [q | gate] per
 * head (rows [n_heads·2·hd]); q/k per-head norms, partial rotary, causal
 * attention, then out *= σ(gate) before o_proj.
 *
 * Gated DeltaNet (layers with is_linear), per token (architectures.md §9.2):
 *   [q|k|v] = conv1d_silu(in_proj_qkv(x)) with a rolling state of the last
 *   K-1 inputs; z = in_proj_z(x); b = in_proj_b(x); a = in_proj_a(x);
 *   o = delta_rule(q, k, v, b, a) with the recurrent state S [Hv, Dk, Dv];
 *   out_proj(rms_norm_gated(o, z)).
 * Prefill (T > 1) runs the delta rule in its chunked form (chunk 64, as the
 * reference does); decode runs the recurrence. Both update the same state.
 *
 * The states hold every position before st->lin_pos: a call must continue at
 * lin_pos or restart at 0 (which zeroes them). Unlike a KV cache they cannot
 * be cut back; the session recomputes a kept prefix (session.c).
 *
 * Not here: the MoE variant's shared expert (refused at load by llama.c). */
#include "model/model.h"
#include "model/spec.h"

#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->be->ops)

/* The chunk length of the reference's chunked prefill. */
#define PT_DELTA_CHUNK 64

pt_status pt_qwen35_bind_linear(pt_model *m, const pt_layer_spec *S, pt_layer *L, int l) {
    const pt_backend_ops *o = OPS(m);
    if (!o->conv1d_silu || !o->delta_rule || !o->rms_norm_gated || !o->copy_rows || !o->sigmoid_mul)
        return pt_error(PT_ERR_UNSUPPORTED, "the %s backend does not implement the Gated DeltaNet ops (Qwen3.5 runs "
                                            "on the CPU backend)",
                        o->name);
    pt_net *n = &m->net;
    const pt_layer_weights *w = &S->w;
    const int Hk = S->lin_k_heads, Hv = S->lin_v_heads, Dk = S->lin_k_dim, Dv = S->lin_v_dim, K = S->lin_conv_kernel;
    if (Hk <= 0 || Hv <= 0 || Dk <= 0 || Dv <= 0 || Hv % Hk)
        return pt_error(PT_ERR_FORMAT, "qwen3_5 layer %d: linear heads %d key / %d value (dims %d / %d): the value "
                                       "heads must be a positive multiple of the key heads",
                        l, Hk, Hv, Dk, Dv);
    if (K < 1 || K > PT_CONV_MAX_K)
        return pt_error(PT_ERR_UNSUPPORTED, "qwen3_5 layer %d: linear_conv_kernel_dim %d (petrel takes 1..%d)", l, K,
                        PT_CONV_MAX_K);
    const int64_t H = n->hidden, kd = (int64_t)Hk * Dk, vd = (int64_t)Hv * Dv, cd = 2 * kd + vd;
    char what[160];
#define NAME(s) (snprintf(what, sizeof what, "model.layers.%d.linear_attn.%s", l, s), what)
    L->is_linear = 1;
    L->lin_K = K;
    L->lin_conv_dim = cd;
    PT_TRY(pt_net_bind(m, &L->lin_qkv, &w->lin_in_qkv, cd, H, NAME("in_proj_qkv")));
    PT_TRY(pt_net_bind(m, &L->lin_z, &w->lin_in_z, vd, H, NAME("in_proj_z")));
    PT_TRY(pt_net_bind(m, &L->lin_b, &w->lin_in_b, Hv, H, NAME("in_proj_b")));
    PT_TRY(pt_net_bind(m, &L->lin_a, &w->lin_in_a, Hv, H, NAME("in_proj_a")));
    PT_TRY(pt_net_bind(m, &L->lin_out, &w->lin_out_proj, H, vd, NAME("out_proj")));
    /* HF conv1d [C, 1, K] and MLX [C, K, 1] both lie in memory as [C, K] */
    PT_TRY(pt_net_upload_vec(m, &w->lin_conv1d, cd * K, &L->lin_conv, n->norm_type, NAME("conv1d.weight")));
    PT_TRY(pt_net_upload_vec(m, &w->lin_norm, Dv, &L->lin_norm, n->norm_type, NAME("norm.weight")));
    const void *A_log, *dt_bias;
    PT_TRY(pt_net_upload_vec(m, &w->lin_A_log, Hv, &A_log, PT_FT_F32, NAME("A_log")));
    PT_TRY(pt_net_upload_vec(m, &w->lin_dt_bias, Hv, &dt_bias, PT_FT_F32, NAME("dt_bias")));
#undef NAME
    L->delta.n_k_heads = Hk;
    L->delta.n_v_heads = Hv;
    L->delta.k_dim = Dk;
    L->delta.v_dim = Dv;
    L->delta.q_scale = (float)(1.0 / sqrt((double)Dk));
    L->delta.A_log = A_log;
    L->delta.dt_bias = dt_bias;
    L->delta.chunk = 0;
    n->n_linear++;
    if (cd > n->max_lin_conv) n->max_lin_conv = cd;
    if (vd > n->max_lin_value) n->max_lin_value = vd;
    if (Hv > n->max_lin_heads) n->max_lin_heads = Hv;
    return PT_OK;
}

static void *balloc(pt_model *m, size_t bytes, pt_status *st) {
    if (*st != PT_OK) return NULL;
    void *p = OPS(m)->alloc(m->be, bytes ? bytes : 64);
    if (!p) *st = pt_error_prefix(PT_ERR_NOMEM, "allocating %zu bytes of Qwen3.5 session state", bytes);
    return p;
}

pt_status pt_qwen35_fwd_init(pt_model *m, pt_fwd_state *st) {
    const pt_net *n = &m->net;
    int64_t gated = 0; /* largest n_heads·hd of a gated attention layer */
    for (int l = 0; l < n->n_layers; l++)
        if (n->layers[l].attn_gate && (int64_t)n->layers[l].n_heads * n->layers[l].head_dim > gated)
            gated = (int64_t)n->layers[l].n_heads * n->layers[l].head_dim;
    if (n->n_linear == 0 && gated == 0) return PT_OK;
    pt_status s = PT_OK;
    const size_t C = (size_t)st->chunk;
    size_t wq = (size_t)(n->max_lin_conv > 2 * gated ? n->max_lin_conv : 2 * gated);
    size_t wo = (size_t)(n->max_lin_conv > gated ? n->max_lin_conv : gated);
    st->lq = balloc(m, C * wq * 4, &s);
    st->lo = balloc(m, C * wo * 4, &s);
    if (n->n_linear > 0) {
        st->lz = balloc(m, C * (size_t)n->max_lin_value * 4, &s);
        st->lb = balloc(m, C * (size_t)n->max_lin_heads * 4, &s);
        st->la = balloc(m, C * (size_t)n->max_lin_heads * 4, &s);
        st->conv_state = calloc((size_t)n->n_layers, sizeof *st->conv_state);
        st->rec_state = calloc((size_t)n->n_layers, sizeof *st->rec_state);
        if (s == PT_OK && (!st->conv_state || !st->rec_state))
            s = pt_error(PT_ERR_NOMEM, "out of memory for the DeltaNet state table");
        for (int l = 0; s == PT_OK && l < n->n_layers; l++) {
            const pt_layer *L = &n->layers[l];
            if (!L->is_linear) continue;
            const pt_delta *d = &L->delta;
            st->conv_state[l] = balloc(m, (size_t)(L->lin_K - 1) * (size_t)L->lin_conv_dim * 4, &s);
            st->rec_state[l] = balloc(m, (size_t)d->n_v_heads * d->k_dim * d->v_dim * 4, &s);
        }
    }
    st->lin_pos = 0; /* alloc zeroes: empty states */
    return s; /* on failure pt_fwd_init frees through pt_fwd_free */
}

void pt_qwen35_fwd_free(pt_model *m, pt_fwd_state *st) {
    if (st->conv_state || st->rec_state) {
        for (int l = 0; l < m->net.n_layers; l++) {
            if (st->conv_state && st->conv_state[l]) OPS(m)->dealloc(m->be, st->conv_state[l]);
            if (st->rec_state && st->rec_state[l]) OPS(m)->dealloc(m->be, st->rec_state[l]);
        }
    }
    free(st->conv_state);
    free(st->rec_state);
    st->conv_state = st->rec_state = NULL;
    float *bufs[] = {st->lq, st->lo, st->lz, st->lb, st->la};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) OPS(m)->dealloc(m->be, bufs[i]);
    st->lq = st->lo = st->lz = st->lb = st->la = NULL;
}

pt_status pt_qwen35_begin(pt_model *m, pt_fwd_state *st, int pos0) {
    const pt_net *n = &m->net;
    if (pos0 == 0) {
        /* a fresh sequence: empty conv and recurrent states */
        static const float zeros[256];
        for (int l = 0; l < n->n_layers; l++) {
            const pt_layer *L = &n->layers[l];
            if (!L->is_linear) continue;
            size_t cb = (size_t)(L->lin_K - 1) * (size_t)L->lin_conv_dim * 4;
            size_t rb = (size_t)L->delta.n_v_heads * L->delta.k_dim * L->delta.v_dim * 4;
            for (size_t o = 0; o < cb; o += sizeof zeros)
                PT_TRY(OPS(m)->upload(m->be, (char *)st->conv_state[l] + o, zeros,
                                      cb - o < sizeof zeros ? cb - o : sizeof zeros));
            for (size_t o = 0; o < rb; o += sizeof zeros)
                PT_TRY(OPS(m)->upload(m->be, (char *)st->rec_state[l] + o, zeros,
                                      rb - o < sizeof zeros ? rb - o : sizeof zeros));
        }
    } else if ((int64_t)pos0 != st->lin_pos) {
        return pt_error(PT_ERR_INTERNAL,
                        "Qwen3.5: the DeltaNet states hold %lld positions but the call continues at %d (a recurrent "
                        "state cannot be cut back; the prefix must be recomputed from position 0)",
                        (long long)st->lin_pos, pos0);
    }
    st->lin_pos = -1; /* until this call completes */
    return PT_OK;
}

/* Gated full attention: st->xn -> st->y. */
static pt_status gated_attention(pt_model *m, pt_fwd_state *st, const pt_layer *L, int l, int T) {
    pt_backend *be = m->be;
    const int nh = L->n_heads, nkv = L->n_kv, hd = L->head_dim;
    const int64_t rows = (int64_t)T * nh;
    PT_TRY(OPS(m)->matmul(be, st->lq, st->xn, T, &L->wq, 0)); /* [T, nh, 2·hd]: [q | gate] per head */
    PT_TRY(OPS(m)->copy_rows(be, st->q, hd, st->lq, 2 * hd, rows, hd));
    PT_TRY(OPS(m)->copy_rows(be, st->lo, hd, st->lq + hd, 2 * hd, rows, hd)); /* gate [T, nh·hd] */
    PT_TRY(OPS(m)->matmul(be, st->k, st->xn, T, &L->wk, 0));
    PT_TRY(OPS(m)->matmul(be, st->v, st->xn, T, &L->wv, 0));
    PT_TRY(pt_fwd_qk_norm(m, st->q, rows, L->q_norm, st->k, (int64_t)T * nkv, L->k_norm, hd, L->qk_style));
    PT_TRY(OPS(m)->rope(be, st->q, T, nh, hd, st->pos_dev, &L->rope));
    PT_TRY(OPS(m)->rope(be, st->k, T, nkv, hd, st->pos_dev, &L->rope));
    PT_TRY(OPS(m)->kv_append(be, &st->kv[l], st->k, st->v, T, st->pos_dev));
    PT_TRY(OPS(m)->attention(be, st->att, st->q, T, st->pos_dev, &st->kv[l], &L->attn));
    PT_TRY(OPS(m)->sigmoid_mul(be, st->att, st->att, st->lo, rows * hd));
    return OPS(m)->matmul(be, st->y, st->att, T, &L->wo, 0);
}

/* Gated DeltaNet: st->xn -> st->y. */
static pt_status deltanet(pt_model *m, pt_fwd_state *st, const pt_layer *L, int l, int T) {
    const pt_net *n = &m->net;
    pt_backend *be = m->be;
    const pt_delta *d0 = &L->delta;
    PT_TRY(OPS(m)->matmul(be, st->lq, st->xn, T, &L->lin_qkv, 0)); /* [T, conv_dim] */
    PT_TRY(OPS(m)->matmul(be, st->lz, st->xn, T, &L->lin_z, 0));   /* [T, Hv·Dv] */
    PT_TRY(OPS(m)->matmul(be, st->lb, st->xn, T, &L->lin_b, 0));   /* [T, Hv] */
    PT_TRY(OPS(m)->matmul(be, st->la, st->xn, T, &L->lin_a, 0));   /* [T, Hv] */
    PT_TRY(OPS(m)->conv1d_silu(be, st->lo, st->lq, T, L->lin_conv_dim, L->lin_K, L->lin_conv, n->norm_type,
                               st->conv_state[l]));
    pt_delta d = *d0;
    d.chunk = T > 1 ? PT_DELTA_CHUNK : 0; /* prefill: chunked form; decode: the recurrence */
    PT_TRY(OPS(m)->delta_rule(be, st->lq, st->lo, st->lb, st->la, T, st->rec_state[l], &d)); /* [T, Hv·Dv] */
    PT_TRY(OPS(m)->rms_norm_gated(be, st->lq, st->lq, st->lz, (int64_t)T * d.n_v_heads, d.v_dim, L->lin_norm,
                                  n->norm_type, n->eps));
    return OPS(m)->matmul(be, st->y, st->lq, T, &L->lin_out, 0);
}

pt_status pt_qwen35_mixer(pt_model *m, pt_fwd_state *st, const pt_layer *L, int l, int T) {
    if (L->is_linear) return deltanet(m, st, L, l, T);
    return gated_attention(m, st, L, l, T);
}
