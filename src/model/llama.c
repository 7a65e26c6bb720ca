/* The Llama-style decoder families — llama (Llama 3.x, MiniCPM5), qwen2,
 * qwen3, qwen3_moe, minicpm, gemma2 / gemma3 (the same block with (1+w)
 * sandwich norms, GeGLU, soft-caps and sliding windows) and gemma4 (plus
 * per-layer inputs, KV sharing, v_norm, K=V, layer scalars and the MoE block
 * beside the dense MLP; docs/gemma.md) — built once from the model spec into pt_net
 * (model.h), the structure the forward driver (forward.c) reads.
 *
 * What differs between these families is all in the spec and becomes data
 * here: q/k/v biases (qwen2), per-head QK-norm (qwen3, qwen3_moe), routed
 * experts (qwen3_moe), the embedding / residual / logit scales (minicpm), the
 * RoPE table of each rope type (default, linear, llama3, yarn, longrope with
 * its short and long tables). A spec feature these families never use
 * (a shared expert, ...) is refused with PT_ERR_UNSUPPORTED naming it, never
 * ignored. Qwen3.5 uses this builder too: its Gated DeltaNet layers are bound
 * by qwen3_5.c (pt_qwen35_bind_linear) and its gated attention reads a
 * q_proj twice as tall ([q | gate] per head).
 *
 * Weights stay in the mapping; only three cases copy: under an explicit
 * --dtype bf16 (PT_COMPUTE_BF16), float weights of another dtype are cast to
 * bf16 and MLX-quantized weights are dequantized to bf16 — both like
 * model.to(torch.bfloat16), the reference's definition; per-expert tensors
 * that are not laid out back to back are stacked into one [E, rows, cols]
 * block. A bf16 MLX checkpoint run in its own dtype keeps its quantized
 * weights (MLX's math: scale·Σq·x + bias·Σx, no per-weight rounding). */

#include "model/spec.h"
#include "model/model.h"
#include "model/config.h"
#include "format/mlx_quant.h"

#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->be->ops)

/* Remembers a host allocation owned by the model. */
static void *own(pt_model *m, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return NULL;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **nl = realloc(m->owned_list, (size_t)cap * sizeof *nl);
        if (!nl) {
            free(p);
            return NULL;
        }
        m->owned_list = nl;
        m->cap_owned = cap;
    }
    m->owned_list[m->n_owned++] = p;
    return p;
}

static int ftype_of(pt_dtype d, pt_ftype *out) {
    switch (d) {
    case PT_DTYPE_F32: *out = PT_FT_F32; return 1;
    case PT_DTYPE_BF16: *out = PT_FT_BF16; return 1;
    case PT_DTYPE_F16: *out = PT_FT_F16; return 1;
    default: return 0;
    }
}

/* A host copy of n floats of type `from` as bf16. */
static const void *to_bf16(pt_model *m, const void *src, pt_ftype from, int64_t n) {
    uint16_t *dst = own(m, (size_t)n * 2);
    if (!dst) return NULL;
    for (int64_t i = 0; i < n; i++) {
        float f = from == PT_FT_F32 ? ((const float *)src)[i] : pt_f16_to_f32(((const uint16_t *)src)[i]);
        dst[i] = pt_f32_to_bf16(f);
    }
    return dst;
}

pt_status pt_model_upload(pt_model *m, const void *src, size_t bytes, const void **out) {
    if (m->n_dev == m->cap_dev) {
        int cap = m->cap_dev ? m->cap_dev * 2 : 64;
        void **nl = realloc(m->dev_list, (size_t)cap * sizeof *nl);
        if (!nl) return pt_error(PT_ERR_NOMEM, "out of memory");
        m->dev_list = nl;
        m->cap_dev = cap;
    }
    void *dev = OPS(m)->alloc(m->be, bytes);
    if (!dev) return pt_error_prefix(PT_ERR_NOMEM, "allocating %zu bytes", bytes);
    pt_status st = OPS(m)->upload(m->be, dev, src, bytes);
    if (st != PT_OK) {
        OPS(m)->dealloc(m->be, dev);
        return st;
    }
    m->dev_list[m->n_dev++] = dev;
    *out = dev;
    return PT_OK;
}

/* Uploads n floats (host, type t) into backend memory, cast to the activation
 * dtype's storage when running bf16 (norm weights). */
static pt_status upload_vec(pt_model *m, const pt_weight *w, int64_t n, const void **out, pt_ftype want,
                            const char *what) {
    pt_ftype t;
    if (!w->data || w->bits || !ftype_of(w->dtype, &t))
        return pt_error(PT_ERR_FORMAT, "%s: expected a float vector of %lld elements", what, (long long)n);
    int64_t numel = 1;
    for (int i = 0; i < w->ndim; i++) numel *= w->shape[i];
    if (numel != n)
        return pt_error(PT_ERR_FORMAT, "%s (%s): expected %lld elements, found %lld", what, w->name, (long long)n,
                        (long long)numel);
    const void *src = w->data;
    if (want == PT_FT_BF16 && t != PT_FT_BF16) {
        src = to_bf16(m, src, t, n);
        if (!src) return pt_error(PT_ERR_NOMEM, "out of memory converting %s", what);
        t = PT_FT_BF16;
    }
    if (t != want && !(want == PT_FT_F32)) return pt_error(PT_ERR_INTERNAL, "%s: unexpected dtype", what);
    size_t bytes = (size_t)n * pt_ftype_size(t);
    /* f32 activations with a 16-bit vector: widen to f32 (every norm shares one type) */
    float *wide = NULL;
    if (want == PT_FT_F32 && t != PT_FT_F32) {
        wide = own(m, (size_t)n * 4);
        if (!wide) return pt_error(PT_ERR_NOMEM, "out of memory converting %s", what);
        for (int64_t i = 0; i < n; i++)
            wide[i] = t == PT_FT_BF16 ? pt_bf16_to_f32(((const uint16_t *)src)[i])
                                      : pt_f16_to_f32(((const uint16_t *)src)[i]);
        src = wide;
        bytes = (size_t)n * 4;
    }
    return pt_model_upload(m, src, bytes, out);
}

static pt_status upload_floats(pt_model *m, const float *src, int64_t n, const float **out) {
    const void *dev;
    PT_TRY(pt_model_upload(m, src, (size_t)n * 4, &dev));
    *out = dev;
    return PT_OK;
}

/* rows x cols of an MLX-quantized matrix as dense bf16: round(scale*q + bias)
 * computed in fp32 — what model.to(torch.bfloat16) makes of dequantized
 * weights. Used only when the caller asks for bf16 compute explicitly. */
static const void *dequant_bf16(pt_model *m, const void *data, const void *scales, const void *biases,
                                pt_dtype qdtype, int bits, int gs, int64_t rows, int64_t cols) {
    uint16_t *dst = own(m, (size_t)(rows * cols) * 2);
    float *row = malloc((size_t)cols * sizeof *row);
    if (!dst || !row) {
        free(row);
        return NULL;
    }
    const int64_t words = pt_mlx_packed_words(cols, bits), groups = cols / gs;
    size_t ssz = pt_dtype_size(qdtype);
    for (int64_t r = 0; r < rows; r++) {
        pt_mlx_dequantize_row((const uint32_t *)data + r * words, (const char *)scales + (size_t)(r * groups) * ssz,
                              (const char *)biases + (size_t)(r * groups) * ssz, qdtype, bits, gs, cols, row);
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = pt_f32_to_bf16(row[c]);
    }
    free(row);
    return dst;
}

/* Fills a backend weight from a spec weight (+ optional bias) and prepares it,
 * with its role (pt_matrix.role) set; bind: role none. */
static pt_status bind_as(pt_model *m, pt_matrix *dst, const pt_weight *src, const pt_weight *bias, int64_t rows,
                         int64_t cols, const char *what, int role) {
    memset(dst, 0, sizeof *dst);
    dst->role = role;
    if (!src->data) return pt_error(PT_ERR_NOT_FOUND, "missing weight %s", what);
    if (src->shape[0] != rows || src->shape[1] != cols)
        return pt_error(PT_ERR_FORMAT, "%s (%s): expected shape [%lld, %lld], found [%lld, %lld]", what, src->name,
                        (long long)rows, (long long)cols, (long long)src->shape[0], (long long)src->shape[1]);
    dst->rows = rows;
    dst->cols = cols;
    const int act_bf16 = m->be->act == PT_ACT_BF16;
    if (src->bits && m->params.dtype == PT_COMPUTE_BF16) {
        /* --dtype bf16 casts the weights themselves to bf16, like the reference */
        dst->data = dequant_bf16(m, src->data, src->scales, src->biases, src->qdtype, src->bits, src->group_size,
                                 rows, cols);
        if (!dst->data) return pt_error(PT_ERR_NOMEM, "out of memory dequantizing %s to bf16", what);
        dst->dtype = PT_FT_BF16;
    } else if (src->bits) {
        if (!ftype_of(src->qdtype, &dst->dtype))
            return pt_error(PT_ERR_FORMAT, "%s: scales of dtype %s", what, pt_dtype_name(src->qdtype));
        dst->bits = src->bits;
        dst->group_size = src->group_size;
        dst->data = src->data;
        dst->scales = src->scales;
        dst->biases = src->biases;
    } else {
        if (!ftype_of(src->dtype, &dst->dtype))
            return pt_error(PT_ERR_FORMAT, "%s (%s): dtype %s is not a float type", what, src->name,
                            pt_dtype_name(src->dtype));
        dst->data = src->data;
        if (act_bf16 && dst->dtype != PT_FT_BF16) {
            dst->data = to_bf16(m, src->data, dst->dtype, rows * cols);
            if (!dst->data) return pt_error(PT_ERR_NOMEM, "out of memory casting %s to bf16", what);
            dst->dtype = PT_FT_BF16;
        }
    }
    if (bias && bias->data) {
        pt_ftype bt;
        int64_t bn = 1;
        for (int i = 0; i < bias->ndim; i++) bn *= bias->shape[i];
        if (bias->bits || !ftype_of(bias->dtype, &bt) || bn != rows)
            return pt_error(PT_ERR_FORMAT, "%s bias (%s): expected %lld float elements", what, bias->name,
                            (long long)rows);
        dst->bias = bias->data;
        dst->bias_dtype = bt;
        if (act_bf16 && bt != PT_FT_BF16) {
            dst->bias = to_bf16(m, bias->data, bt, rows);
            if (!dst->bias) return pt_error(PT_ERR_NOMEM, "out of memory");
            dst->bias_dtype = PT_FT_BF16;
        }
    }
    PT_TRY(OPS(m)->prepare_weight(m->be, dst, what));
    return PT_OK;
}

static pt_status bind(pt_model *m, pt_matrix *dst, const pt_weight *src, const pt_weight *bias,
                      int64_t rows, int64_t cols, const char *what) {
    return bind_as(m, dst, src, bias, rows, cols, what, PT_ROLE_NONE);
}

/* Stacks n_experts spec views [rows, cols] into one backend weight [E, rows, cols]. */
static pt_status bind_experts(pt_model *m, pt_matrix *dst, const pt_weight *ex, int E, int64_t rows,
                              int64_t cols, const char *what) {
    /* bind expert 0 for the checks and the layout, then widen to the stack */
    for (int e = 0; e < E; e++) {
        if (!ex[e].data) return pt_error(PT_ERR_NOT_FOUND, "%s: expert %d is missing", what, e);
        if (ex[e].shape[0] != rows || ex[e].shape[1] != cols || ex[e].bits != ex[0].bits ||
            ex[e].dtype != ex[0].dtype)
            return pt_error(PT_ERR_FORMAT, "%s expert %d (%s): expected [%lld, %lld] like expert 0, found [%lld, %lld]",
                            what, e, ex[e].name, (long long)rows, (long long)cols, (long long)ex[e].shape[0],
                            (long long)ex[e].shape[1]);
    }
    memset(dst, 0, sizeof *dst);
    dst->rows = rows;
    dst->cols = cols;
    dst->n_experts = E;
    const pt_weight *w0 = &ex[0];
    size_t data_bytes, sb_bytes = 0;
    if (w0->bits && m->params.dtype == PT_COMPUTE_BF16) {
        /* --dtype bf16: every expert dequantized to bf16 (see dequant_bf16) */
        size_t one = (size_t)rows * (size_t)cols * 2;
        char *d = own(m, one * (size_t)E);
        if (!d) return pt_error(PT_ERR_NOMEM, "out of memory dequantizing %s", what);
        for (int e = 0; e < E; e++) {
            const void *c = dequant_bf16(m, ex[e].data, ex[e].scales, ex[e].biases, ex[e].qdtype, ex[e].bits,
                                         ex[e].group_size, rows, cols);
            if (!c) return pt_error(PT_ERR_NOMEM, "out of memory dequantizing %s", what);
            memcpy(d + (size_t)e * one, c, one);
        }
        dst->dtype = PT_FT_BF16;
        dst->data = d;
        return OPS(m)->prepare_weight(m->be, dst, what);
    }
    if (w0->bits) {
        if (!ftype_of(w0->qdtype, &dst->dtype)) return pt_error(PT_ERR_FORMAT, "%s: bad scale dtype", what);
        dst->bits = w0->bits;
        dst->group_size = w0->group_size;
        data_bytes = (size_t)rows * (size_t)(cols * w0->bits / 32) * 4;
        sb_bytes = (size_t)rows * (size_t)(cols / w0->group_size) * pt_ftype_size(dst->dtype);
    } else {
        if (!ftype_of(w0->dtype, &dst->dtype)) return pt_error(PT_ERR_FORMAT, "%s: not a float dtype", what);
        data_bytes = (size_t)rows * (size_t)cols * pt_ftype_size(dst->dtype);
    }
    /* zero-copy when the experts already lie back to back (MLX stacked tensors) */
    int contiguous = 1;
    for (int e = 1; e < E && contiguous; e++) {
        if ((const char *)ex[e].data != (const char *)w0->data + (size_t)e * data_bytes) contiguous = 0;
        if (w0->bits && ((const char *)ex[e].scales != (const char *)w0->scales + (size_t)e * sb_bytes ||
                         (const char *)ex[e].biases != (const char *)w0->biases + (size_t)e * sb_bytes))
            contiguous = 0;
    }
    const int cast = !w0->bits && m->be->act == PT_ACT_BF16 && dst->dtype != PT_FT_BF16;
    if (contiguous && !cast) {
        dst->data = w0->data;
        dst->scales = w0->scales;
        dst->biases = w0->biases;
    } else {
        size_t out_bytes = cast ? (size_t)rows * (size_t)cols * 2 : data_bytes;
        char *d = own(m, out_bytes * (size_t)E);
        if (!d) return pt_error(PT_ERR_NOMEM, "out of memory stacking %s", what);
        for (int e = 0; e < E; e++) {
            if (cast) {
                const uint16_t *c = to_bf16(m, ex[e].data, dst->dtype, rows * cols);
                if (!c) return pt_error(PT_ERR_NOMEM, "out of memory");
                memcpy(d + (size_t)e * out_bytes, c, out_bytes);
            } else {
                memcpy(d + (size_t)e * out_bytes, ex[e].data, out_bytes);
            }
        }
        dst->data = d;
        if (cast) dst->dtype = PT_FT_BF16;
        if (w0->bits) {
            char *s = own(m, sb_bytes * (size_t)E), *b = own(m, sb_bytes * (size_t)E);
            if (!s || !b) return pt_error(PT_ERR_NOMEM, "out of memory stacking %s", what);
            for (int e = 0; e < E; e++) {
                memcpy(s + (size_t)e * sb_bytes, ex[e].scales, sb_bytes);
                memcpy(b + (size_t)e * sb_bytes, ex[e].biases, sb_bytes);
            }
            dst->scales = s;
            dst->biases = b;
        }
    }
    PT_TRY(OPS(m)->prepare_weight(m->be, dst, what));
    return PT_OK;
}

/* The features of a layer spec these families never use: refuse them. */
static pt_status check_layer(const pt_model_spec *sp, const pt_layer_spec *L) {
    const char *what = NULL;
    const int qwen35 = sp->arch == PT_ARCH_QWEN3_5; /* DeltaNet layers and the output gate: qwen3_5.c */
    if (L->kind == PT_LAYER_LINEAR && !qwen35) what = "linear-attention (Gated DeltaNet) layers";
    else if (L->kind == PT_LAYER_LINEAR) {
        if (L->mlp == PT_MLP_MOE && L->router != PT_ROUTER_SOFTMAX_TOPK) what = "this MoE router";
        else if (L->shared_expert_intermediate > 0 && L->mlp != PT_MLP_MOE) what = "a shared expert without experts";
        else if (L->act != PT_ACT_SILU) what = "this activation";
    } else if (!L->has_kv && (L->kv_donor < 0 || L->kv_donor >= L->index)) what = "this KV donor";
    else if (L->attn_output_gate && !qwen35) what = "the attention output gate";
    else if (L->v_norm != PT_NORM_NONE && L->v_norm != PT_NORM_NOSCALE) what = "this value norm";
    else if (L->norm_style != PT_NORM_W && L->norm_style != PT_NORM_1PW) what = "this block norm style";
    else if ((L->q_norm != PT_NORM_NONE && L->q_norm != PT_NORM_W && L->q_norm != PT_NORM_1PW) ||
             (L->k_norm != PT_NORM_NONE && L->k_norm != PT_NORM_W && L->k_norm != PT_NORM_1PW))
        what = "this QK-norm style";
    else if (L->act != PT_ACT_SILU && L->act != PT_ACT_GELU_TANH) what = "this activation";
    else if (L->mlp == PT_MLP_MOE && L->router != PT_ROUTER_SOFTMAX_TOPK && L->router != PT_ROUTER_GEMMA4)
        what = "this MoE router";
    else if (L->shared_expert_intermediate > 0 && !(qwen35 && L->mlp == PT_MLP_MOE)) what = "a shared expert";
    else if (L->moe_parallel_dense != (L->router == PT_ROUTER_GEMMA4)) what = "this parallel dense + MoE block";
    else if (L->rope_dims > L->head_dim || L->rope_dims % 2) what = "this rotary dimension";
    if (what)
        return pt_error(PT_ERR_UNSUPPORTED, "%s layer %d: %s are not implemented in petrel's engine yet",
                        pt_arch_name(sp->arch), L->index, what);
    return PT_OK;
}

pt_status pt_net_build(pt_model *m) {
    const pt_model_spec *sp = m->spec;
    pt_net *n = &m->net;
    memset(n, 0, sizeof *n);
    const char *unsup = NULL;
    if (sp->ple_dim > 0 && sp->ple_vocab < sp->vocab) unsup = "a per-layer embedding smaller than the vocabulary";
    else if (sp->final_norm_style != PT_NORM_W && sp->final_norm_style != PT_NORM_1PW) unsup = "this final norm";
    /* Gemma 4's plain-weight norms multiply in f32 before rounding (Gemma4RMSNorm) */
    /* plain-w norms: Llama/Qwen round x̂ before the weight; Gemma 4 and Qwen3.5's
     * folded (MLX) norms are round(x̂·w) in f32 — for Qwen3.5 the reference
     * computes x̂·(1 + w) in f32 and the folded weight is that 1 + w */
    const pt_rms_style w_style =
        sp->arch == PT_ARCH_GEMMA4 || sp->arch == PT_ARCH_QWEN3_5 ? PT_RMS_W_F32 : PT_RMS_W;
    if (unsup)
        return pt_error(PT_ERR_UNSUPPORTED, "%s: %s is not implemented in petrel's engine yet", pt_arch_name(sp->arch),
                        unsup);
    n->n_layers = sp->n_layers;
    n->hidden = sp->hidden;
    n->vocab = sp->vocab;
    n->max_ctx = sp->max_ctx > 0 && sp->max_ctx < (1 << 30) ? (int)sp->max_ctx : (1 << 30);
    n->eps = sp->rms_eps;
    n->embed_scale = sp->embed_scale;
    /* Gemma multiplies by sqrt(H) held in the activation dtype */
    if (sp->embed_scale_round_to_dtype && m->be->act == PT_ACT_BF16) n->embed_scale = pt_round_bf16(sp->embed_scale);
    n->final_style = sp->final_norm_style == PT_NORM_1PW ? PT_RMS_1PW : w_style;
    n->final_softcap = sp->final_softcap;
    n->logit_scale = sp->logit_scale;
    n->kv_dtype = m->be->act == PT_ACT_BF16 ? PT_FT_BF16 : PT_FT_F32;
    n->norm_type = n->kv_dtype;
    n->layers = calloc((size_t)sp->n_layers, sizeof *n->layers);
    if (!n->layers) return pt_error(PT_ERR_NOMEM, "out of memory for %d layers", sp->n_layers);
    const int64_t H = sp->hidden;
    char what[160];
    PT_TRY(bind(m, &n->embed, &sp->embed, NULL, sp->vocab, H, "model.embed_tokens"));
    if (sp->tied) {
        n->lm_head = n->embed;
        n->tied = 1;
    } else {
        PT_TRY(bind(m, &n->lm_head, &sp->lm_head, NULL, sp->vocab, H, "lm_head"));
    }
    PT_TRY(upload_vec(m, &sp->final_norm, H, &n->final_norm, n->norm_type, "model.norm"));
    if (sp->ple_dim > 0) { /* Gemma 4 per-layer inputs */
        const int64_t LP = (int64_t)sp->n_layers * sp->ple_dim;
        n->ple_dim = sp->ple_dim;
        PT_TRY(bind(m, &n->ple_embed, &sp->ple_embed, NULL, sp->ple_vocab, LP, "model.embed_tokens_per_layer"));
        PT_TRY(bind(m, &n->ple_model_proj, &sp->ple_model_proj, NULL, LP, H, "model.per_layer_model_projection"));
        PT_TRY(upload_vec(m, &sp->ple_proj_norm, sp->ple_dim, &n->ple_proj_norm, n->norm_type,
                          "model.per_layer_projection_norm"));
        /* like the main embedding, the table's multiplier is held in the activation dtype */
        n->ple_embed_scale = m->be->act == PT_ACT_BF16 ? pt_round_bf16(sp->ple_embed_scale) : sp->ple_embed_scale;
        n->ple_proj_scale = sp->ple_proj_scale;
        n->ple_input_scale = sp->ple_input_scale;
    }
    for (int l = 0; l < sp->n_layers; l++) {
        const pt_layer_spec *S = &sp->layers[l];
        pt_layer *L = &n->layers[l];
        PT_TRY(check_layer(sp, S));
        const pt_layer_weights *w = &S->w;
        L->n_heads = S->n_heads;
        L->n_kv = S->n_kv_heads;
        L->head_dim = S->head_dim;
        const int64_t qd = (int64_t)S->n_heads * S->head_dim, kd = (int64_t)S->n_kv_heads * S->head_dim;
#define NAME(s) (snprintf(what, sizeof what, "model.layers.%d.%s", l, s), what)
        PT_TRY(upload_vec(m, &w->input_norm, H, &L->attn_norm, n->norm_type, NAME("input_layernorm")));
        L->norm_style = S->norm_style == PT_NORM_1PW ? PT_RMS_1PW : w_style;
        L->qk_style = S->q_norm == PT_NORM_1PW ? PT_RMS_1PW : w_style;
        L->k_eq_v = S->k_eq_v;
        L->v_norm = S->v_norm == PT_NORM_NOSCALE;
        L->has_layer_scalar = S->has_layer_scalar;
        if (S->has_layer_scalar) {
            const pt_weight *ls = &w->layer_scalar;
            if (!ls->data || ls->bits)
                return pt_error(PT_ERR_FORMAT, "%s: layer_scalar is missing or quantized", NAME("layer_scalar"));
            L->layer_scalar = ls->dtype == PT_DTYPE_F32    ? *(const float *)ls->data
                              : ls->dtype == PT_DTYPE_BF16 ? pt_bf16_to_f32(*(const uint16_t *)ls->data)
                                                           : pt_f16_to_f32(*(const uint16_t *)ls->data);
        }
        L->glu = S->act == PT_ACT_GELU_TANH ? PT_GLU_GELU_TANH : PT_GLU_SILU;
        L->sandwich = S->sandwich_norms;
        if (S->sandwich_norms) {
            /* Gemma: post-attention and post-FFN norms on the branch outputs, its own pre-FFN norm */
            PT_TRY(upload_vec(m, &w->post_attn_norm, H, &L->post_attn_norm, n->norm_type,
                              NAME("post_attention_layernorm")));
            PT_TRY(upload_vec(m, &w->pre_ffn_norm, H, &L->ffn_norm, n->norm_type, NAME("pre_feedforward_layernorm")));
            PT_TRY(upload_vec(m, &w->post_ffn_norm, H, &L->post_ffn_norm, n->norm_type,
                              NAME("post_feedforward_layernorm")));
        } else {
            PT_TRY(upload_vec(m, &w->post_attn_norm, H, &L->ffn_norm, n->norm_type, NAME("post_attention_layernorm")));
        }
        if (S->kind == PT_LAYER_LINEAR) {
            PT_TRY(pt_qwen35_bind_linear(m, S, L, l)); /* Qwen3.5 Gated DeltaNet: qwen3_5.c */
        } else {
            L->attn_gate = S->attn_output_gate; /* Qwen3.5: q_proj rows [q | gate] per head */
            PT_TRY(bind_as(m, &L->wq, &w->q_proj, &w->q_bias, S->attn_output_gate ? 2 * qd : qd, H,
                           NAME("self_attn.q_proj"), PT_ROLE_ATTN_IN));
            L->kv_shared = !S->has_kv;
            L->kv_src = S->has_kv ? l : S->kv_donor;
            if (S->has_kv) { /* a KV-shared layer reads its donor's cache and has no K/V projections */
                PT_TRY(bind_as(m, &L->wk, &w->k_proj, &w->k_bias, kd, H, NAME("self_attn.k_proj"), PT_ROLE_ATTN_IN));
                if (!S->k_eq_v)
                    PT_TRY(bind_as(m, &L->wv, &w->v_proj, &w->v_bias, kd, H, NAME("self_attn.v_proj"),
                                   PT_ROLE_ATTN_IN));
            }
            if (S->has_ple) {
                PT_TRY(bind(m, &L->ple_gate, &w->ple_gate, NULL, sp->ple_dim, H, NAME("per_layer_input_gate")));
                PT_TRY(bind(m, &L->ple_proj, &w->ple_proj, NULL, H, sp->ple_dim, NAME("per_layer_projection")));
                PT_TRY(upload_vec(m, &w->ple_post_norm, H, &L->ple_post_norm, n->norm_type,
                                  NAME("post_per_layer_input_norm")));
            }
            PT_TRY(bind(m, &L->wo, &w->o_proj, &w->o_bias, H, qd, NAME("self_attn.o_proj")));
            if (S->q_norm != PT_NORM_NONE)
                PT_TRY(upload_vec(m, &w->q_norm, S->head_dim, &L->q_norm, n->norm_type, NAME("self_attn.q_norm")));
            if (S->k_norm != PT_NORM_NONE)
                PT_TRY(upload_vec(m, &w->k_norm, S->head_dim, &L->k_norm, n->norm_type, NAME("self_attn.k_norm")));
            /* RoPE tables */
            L->rope.rot_dim = S->rope_dims;
            L->rope.attn_scale = S->rope_attn_scaling;
            PT_TRY(upload_floats(m, S->inv_freq, S->rope_dims / 2, &L->rope.inv_freq));
            if (S->inv_freq_long) {
                PT_TRY(upload_floats(m, S->inv_freq_long, S->rope_dims / 2, &L->inv_freq_long));
                L->rope_switch_len = S->rope_original_max;
                L->attn_long_scale = S->rope_attn_scaling;
            }
            L->attn.n_heads = S->n_heads;
            L->attn.head_dim = S->head_dim;
            L->attn.scale = S->attn_scale;
            L->attn.softcap = S->attn_softcap;
            L->attn.window = S->kind == PT_LAYER_SLIDING ? S->sliding_window : 0;
        }
        L->residual_scale = S->residual_scale;
        if (S->mlp == PT_MLP_MOE) {
            L->is_moe = 1;
            L->moe_ffn = S->moe_intermediate;
            L->route.n_experts = S->n_experts;
            L->route.top_k = S->top_k;
            L->route.renorm = S->norm_topk;
            PT_TRY(bind(m, &L->router, &w->router, NULL, S->n_experts, H, NAME("mlp.gate")));
            PT_TRY(bind_experts(m, &L->ex_gate, w->expert_gate, S->n_experts, S->moe_intermediate, H,
                                NAME("mlp.experts.gate_proj")));
            PT_TRY(bind_experts(m, &L->ex_up, w->expert_up, S->n_experts, S->moe_intermediate, H,
                                NAME("mlp.experts.up_proj")));
            PT_TRY(bind_experts(m, &L->ex_down, w->expert_down, S->n_experts, H, S->moe_intermediate,
                                NAME("mlp.experts.down_proj")));
            if (S->n_experts > n->max_experts) n->max_experts = S->n_experts;
            if (S->top_k > n->max_top_k) n->max_top_k = S->top_k;
            if (S->moe_intermediate > n->max_ffn) n->max_ffn = S->moe_intermediate;
            if (S->shared_expert_intermediate > 0) { /* Qwen3.5-MoE (forward.c shared_expert) */
                const int64_t SH = S->shared_expert_intermediate;
                if (!OPS(m)->sigmoid_mul || !OPS(m)->copy_rows)
                    return pt_error(PT_ERR_UNSUPPORTED, "the %s backend does not implement the shared expert's "
                                                        "sigmoid gate (sigmoid_mul, copy_rows)",
                                    OPS(m)->name);
                L->sh_ffn = SH;
                PT_TRY(bind(m, &L->sh_gate, &w->shared_gate_proj, NULL, SH, H, NAME("mlp.shared_expert.gate_proj")));
                PT_TRY(bind(m, &L->sh_up, &w->shared_up_proj, NULL, SH, H, NAME("mlp.shared_expert.up_proj")));
                PT_TRY(bind(m, &L->sh_down, &w->shared_down_proj, NULL, H, SH, NAME("mlp.shared_expert.down_proj")));
                PT_TRY(bind(m, &L->sh_router, &w->shared_expert_gate, NULL, 1, H, NAME("mlp.shared_expert_gate")));
                if (SH > n->max_ffn) n->max_ffn = SH;
            }
            if (S->router == PT_ROUTER_GEMMA4) {
                /* router input rms(x)·scale·H^-0.5 as one weighted norm; per-expert output scale */
                float *v = own(m, sizeof(float) * (size_t)(H > S->n_experts ? H : S->n_experts));
                if (!v) return pt_error(PT_ERR_NOMEM, "out of memory");
                pt_weight_row_f32(&w->router_scale, 0, v);
                for (int64_t i = 0; i < H; i++) v[i] *= (float)(1.0 / sqrt((double)H));
                PT_TRY(upload_floats(m, v, H, &L->router_in_scale));
                pt_weight_row_f32(&w->router_per_expert_scale, 0, v);
                PT_TRY(upload_floats(m, v, S->n_experts, &L->route.per_expert_scale));
                L->route.renorm = 1;
                L->moe_dense = 1;
                PT_TRY(upload_vec(m, &w->post_ffn_norm_1, H, &L->post_ffn_norm_1, n->norm_type,
                                  NAME("post_feedforward_layernorm_1")));
                PT_TRY(upload_vec(m, &w->pre_ffn_norm_2, H, &L->pre_ffn_norm_2, n->norm_type,
                                  NAME("pre_feedforward_layernorm_2")));
                PT_TRY(upload_vec(m, &w->post_ffn_norm_2, H, &L->post_ffn_norm_2, n->norm_type,
                                  NAME("post_feedforward_layernorm_2")));
            }
        }
        if (S->mlp != PT_MLP_MOE || S->moe_parallel_dense) {
            L->ffn = S->intermediate;
            PT_TRY(bind(m, &L->w_gate, &w->gate_proj, NULL, S->intermediate, H, NAME("mlp.gate_proj")));
            PT_TRY(bind(m, &L->w_up, &w->up_proj, NULL, S->intermediate, H, NAME("mlp.up_proj")));
            PT_TRY(bind(m, &L->w_down, &w->down_proj, NULL, H, S->intermediate, NAME("mlp.down_proj")));
            if (S->intermediate > n->max_ffn) n->max_ffn = S->intermediate;
        }
#undef NAME
        if (S->n_heads > n->max_heads) n->max_heads = S->n_heads;
        if (S->n_kv_heads > n->max_kv) n->max_kv = S->n_kv_heads;
        if (S->head_dim > n->max_head_dim) n->max_head_dim = S->head_dim;
    }
    return PT_OK;
}

pt_status pt_net_bind(pt_model *m, pt_matrix *dst, const pt_weight *src, int64_t rows, int64_t cols,
                      const char *what) {
    return bind(m, dst, src, NULL, rows, cols, what);
}

pt_status pt_net_upload_vec(pt_model *m, const pt_weight *w, int64_t n, const void **out, pt_ftype want,
                            const char *what) {
    return upload_vec(m, w, n, out, want, what);
}

static void release(pt_model *m, pt_matrix *w) {
    if (w->rows) OPS(m)->release_weight(m->be, w);
    memset(w, 0, sizeof *w);
}

void pt_net_free(pt_model *m) {
    pt_net *n = &m->net;
    if (!m->be) return;
    if (n->layers) {
        for (int l = 0; l < n->n_layers; l++) {
            pt_layer *L = &n->layers[l];
            pt_matrix *ws[] = {&L->wq,     &L->wk,     &L->wv,      &L->wo,    &L->w_gate,   &L->w_up,
                               &L->w_down, &L->router, &L->ex_gate, &L->ex_up, &L->ex_down, &L->ple_gate,
                               &L->ple_proj, &L->lin_qkv, &L->lin_z, &L->lin_b, &L->lin_a, &L->lin_out,
                               &L->sh_gate,  &L->sh_up,  &L->sh_down, &L->sh_router};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) release(m, ws[i]);
        }
        free(n->layers);
    }
    if (!n->tied) release(m, &n->lm_head);
    release(m, &n->ple_embed);
    release(m, &n->ple_model_proj);
    release(m, &n->embed);
    for (int i = 0; i < m->n_dev; i++) OPS(m)->dealloc(m->be, m->dev_list[i]);
    free(m->dev_list);
    m->dev_list = NULL;
    m->n_dev = m->cap_dev = 0;
    for (int i = 0; i < m->n_owned; i++) free(m->owned_list[i]);
    free(m->owned_list);
    m->owned_list = NULL;
    m->n_owned = m->cap_owned = 0;
    memset(n, 0, sizeof *n);
}

pt_status pt_model_spec_open(const pt_model_dir *md, const pt_tensor_set *ts, pt_model_spec **out,
                             int *checkpoint_bf16, const char **arch_name) {
    *out = NULL;
    pt_model_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_status st = pt_spec_build(&md->config, ts, md->kv.present ? &md->kv : NULL, sp);
    if (st != PT_OK) {
        free(sp);
        return st;
    }
    *out = sp;
    *arch_name = pt_arch_name(sp->arch);
    *checkpoint_bf16 = sp->dtype == PT_DTYPE_BF16;
    switch (sp->arch) {
    case PT_ARCH_LLAMA:
    case PT_ARCH_QWEN2:
    case PT_ARCH_QWEN3:
    case PT_ARCH_QWEN3_MOE:
    case PT_ARCH_MINICPM:
    case PT_ARCH_GEMMA2:
    case PT_ARCH_GEMMA3:
    case PT_ARCH_QWEN3_5:
    case PT_ARCH_GEMMA4: return PT_OK; /* Gemma 4 variants with features not implemented are refused by pt_net_build */
    default:
        return pt_error(PT_ERR_UNSUPPORTED, "model family %s is not supported by petrel's engine yet (llama, qwen2, "
                                            "qwen3, qwen3_moe, minicpm, gemma2, gemma3 and qwen3_5 are)",
                        pt_arch_name(sp->arch));
    }
}

void pt_model_spec_close(pt_model_spec **s) {
    if (!s || !*s) return;
    pt_spec_free(*s);
    free(*s);
    *s = NULL;
}
