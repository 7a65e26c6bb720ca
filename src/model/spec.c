/* Config + tensor set -> pt_model_spec (see spec.h): resolves every
 * per-layer constant and binds every weight, for both checkpoint layouts.
 *
 * Names: every tensor name is first mapped to one internal spelling —
 * `model.language_model.X` (transformers multimodal) and
 * `language_model.model.X` (MLX multimodal / Qwen3.5) become `model.X`, and
 * `language_model.lm_head.X` becomes `lm_head.X`. Messages print names with
 * the prefix the checkpoint itself uses. */
#include "model/spec.h"

#include "base/arena.h"
#include "base/error.h"
#include "base/half.h"
#include "format/mlx_quant.h"
#include "model/rope.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensor names are built with snprintf into fixed buffers far longer than any
 * real name; a truncated name simply fails its lookup (and is reported), so
 * GCC's truncation warnings are not useful here. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

typedef struct {
    pt_arena arena;
    pt_rope_table rope[2]; /* per layer type: full, sliding (tables shared by layers) */
    pt_rope_table rope_g;  /* Gemma 4 full layers use global_head_dim */
} spec_internal;

typedef struct {
    const pt_config *cfg;
    const pt_tensor_set *ts;
    pt_model_spec *s;
    spec_internal *in;
    int n;
    char **canon;        /* [n] internal name of tensor i (NULL = skipped) */
    unsigned char *used; /* [n] */
    int *hash;
    size_t cap;
    const char *model_prefix; /* how the checkpoint spells "model." */
    const char *head_prefix;  /* ... and "lm_head." */
} ctx;

static uint64_t hstr(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int lookup(const ctx *c, const char *name) {
    size_t h = hstr(name) & (c->cap - 1);
    while (c->hash[h] >= 0) {
        if (!strcmp(c->canon[c->hash[h]], name)) return c->hash[h];
        h = (h + 1) & (c->cap - 1);
    }
    return -1;
}

/* The name as the checkpoint spells it (for messages). */
static const char *disp(const ctx *c, const char *canon, char *buf, size_t n) {
    if (!strncmp(canon, "model.", 6)) snprintf(buf, n, "%s%s", c->model_prefix, canon + 6);
    else if (!strncmp(canon, "lm_head.", 8)) snprintf(buf, n, "%s%s", c->head_prefix, canon + 8);
    else snprintf(buf, n, "%s", canon);
    return buf;
}

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Tensors petrel does not use, by design. */
static int skipped_name(const char *n) {
    static const char *parts[] = {"vision_tower", "multi_modal_projector", "audio_tower", "embed_vision",
                                  "embed_audio",  "vision_embedder",       "rotary_emb.inv_freq",
                                  /* activation-clipping buffers of Gemma 3n/4 towers (mlx-lm drops them too) */
                                  ".input_max", ".input_min", ".output_max", ".output_min"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (strstr(n, parts[i])) return 1;
    return starts(n, "model.visual.") || starts(n, "visual.") || starts(n, "mtp.") || starts(n, "model.mtp.") ||
           starts(n, "language_model.mtp.") || starts(n, "model.language_model.mtp.");
}

void pt_weight_row_f32(const pt_weight *w, int64_t r, float *out) {
    int64_t cols = w->shape[w->ndim - 1];
    if (w->bits) {
        int64_t ng = cols / w->group_size;
        size_t es = pt_dtype_size(w->qdtype);
        pt_mlx_dequantize_row((const uint32_t *)w->data + r * (cols * w->bits / 32),
                              (const char *)w->scales + r * ng * es, (const char *)w->biases + r * ng * es, w->qdtype,
                              w->bits, w->group_size, cols, out);
        return;
    }
    for (int64_t c = 0; c < cols; c++) out[c] = pt_mlx_load_param(w->data, w->dtype, r * cols + c);
}

static pt_status canon_names(ctx *c) {
    c->n = c->ts->n_tensors;
    c->canon = pt_arena_alloc(&c->in->arena, (size_t)(c->n ? c->n : 1) * sizeof *c->canon);
    c->used = pt_arena_alloc(&c->in->arena, (size_t)(c->n ? c->n : 1));
    c->cap = 16;
    while (c->cap < (size_t)c->n * 2) c->cap *= 2;
    c->hash = pt_arena_alloc(&c->in->arena, c->cap * sizeof *c->hash);
    if (!c->canon || !c->used || !c->hash) return pt_error(PT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < c->cap; i++) c->hash[i] = -1;
    c->model_prefix = "model.";
    c->head_prefix = "lm_head.";
    for (int i = 0; i < c->n; i++) {
        const char *nm = c->ts->tensors[i].name;
        if (skipped_name(nm)) {
            c->s->n_skipped++;
            c->canon[i] = NULL;
            c->used[i] = 1;
            continue;
        }
        char buf[1024];
        if (starts(nm, "model.language_model.")) {
            snprintf(buf, sizeof buf, "model.%s", nm + 21);
            c->model_prefix = "model.language_model.";
        } else if (starts(nm, "language_model.model.")) {
            snprintf(buf, sizeof buf, "model.%s", nm + 21);
            c->model_prefix = "language_model.model.";
            c->s->mlx_layout = 1;
        } else if (starts(nm, "language_model.lm_head.")) {
            snprintf(buf, sizeof buf, "lm_head.%s", nm + 23);
            c->head_prefix = "language_model.lm_head.";
            c->s->mlx_layout = 1;
        } else {
            snprintf(buf, sizeof buf, "%s", nm);
        }
        if (strstr(nm, ".scales") || strstr(nm, "switch_mlp.") || strstr(nm, "switch_glu.")) c->s->mlx_layout = 1;
        if (lookup(c, buf) >= 0)
            return pt_error(PT_ERR_FORMAT, "tensors '%s' and '%s' name the same weight",
                            c->ts->tensors[lookup(c, buf)].name, nm);
        c->canon[i] = pt_arena_strdup(&c->in->arena, buf);
        if (!c->canon[i]) return pt_error(PT_ERR_NOMEM, "out of memory");
        size_t h = hstr(buf) & (c->cap - 1);
        while (c->hash[h] >= 0) h = (h + 1) & (c->cap - 1);
        c->hash[h] = i;
    }
    return PT_OK;
}

static int is_float(pt_dtype d) { return d == PT_DTYPE_F32 || d == PT_DTYPE_F16 || d == PT_DTYPE_BF16; }

static pt_status shape_err(const ctx *c, const char *canon, const char *what, const int64_t *exp, int en,
                           const pt_tensor *t) {
    char a[128], b[128], d[1024];
    return pt_error(PT_ERR_FORMAT, "tensor '%s'%s: expected shape %s, found %s (%s)", disp(c, canon, d, sizeof d), what,
                    pt_shape_str(exp, en, a, sizeof a), pt_shape_str(t->shape, t->ndim, b, sizeof b),
                    pt_dtype_name(t->dtype));
}

static int same_shape(const pt_tensor *t, const int64_t *exp, int n) {
    if (t->ndim != n) return 0;
    for (int i = 0; i < n; i++)
        if (t->shape[i] != exp[i]) return 0;
    return 1;
}

/* Binds tensor `canon` (dense float or MLX-quantized via `<base>.scales`)
 * with logical shape exp[0..en). `base` is the module path (canon without
 * ".weight") used for the quantization lookup, NULL for plain parameters. */
static pt_status bind(ctx *c, const char *canon, const char *base, const int64_t *exp, int en, int required,
                      pt_weight *w) {
    memset(w, 0, sizeof *w);
    int i = lookup(c, canon);
    char d[1024], a[128];
    if (i < 0) {
        if (!required) return PT_OK;
        return pt_error(PT_ERR_NOT_FOUND, "missing tensor '%s' (expected shape %s) required by %s",
                        disp(c, canon, d, sizeof d), pt_shape_str(exp, en, a, sizeof a), pt_arch_name(c->cfg->arch));
    }
    const pt_tensor *t = &c->ts->tensors[i];
    int si = -1, bi = -1;
    char qn[1100];
    if (base) {
        snprintf(qn, sizeof qn, "%s.scales", base);
        si = lookup(c, qn);
        snprintf(qn, sizeof qn, "%s.biases", base);
        bi = lookup(c, qn);
    }
    w->name = t->name;
    w->ndim = en;
    memcpy(w->shape, exp, (size_t)en * sizeof *exp);
    w->data = t->data;
    w->dtype = t->dtype;
    c->used[i] = 1;
    if (si < 0) {
        if (!is_float(t->dtype))
            return pt_error(PT_ERR_FORMAT, "tensor '%s': expected a float dtype (F32, F16 or BF16), found %s%s",
                            disp(c, canon, d, sizeof d), pt_dtype_name(t->dtype),
                            t->dtype == PT_DTYPE_U32 ? " without the '.scales' of an MLX-quantized weight" : "");
        if (!same_shape(t, exp, en)) return shape_err(c, canon, "", exp, en, t);
        if (!t->data && t->n_elements)
            return pt_error(PT_ERR_FORMAT, "tensor '%s' has no data", disp(c, canon, d, sizeof d));
        return PT_OK;
    }
    /* MLX-quantized: packed uint32 [..., cols*bits/32], scales/biases [..., cols/gs] */
    const pt_tensor *st = &c->ts->tensors[si];
    if (bi < 0)
        return pt_error(PT_ERR_NOT_FOUND, "tensor '%s.biases' missing (MLX affine quantization needs scales and biases)",
                        disp(c, base, d, sizeof d));
    const pt_tensor *bt = &c->ts->tensors[bi];
    c->used[si] = c->used[bi] = 1;
    if (t->dtype != PT_DTYPE_U32)
        return pt_error(PT_ERR_FORMAT, "tensor '%s': quantized weight (has .scales) must be U32, found %s",
                        disp(c, canon, d, sizeof d), pt_dtype_name(t->dtype));
    if (!is_float(st->dtype) || st->dtype != bt->dtype)
        return pt_error(PT_ERR_FORMAT, "tensors '%s.scales'/'.biases': expected one float dtype, found %s and %s",
                        disp(c, base, d, sizeof d), pt_dtype_name(st->dtype), pt_dtype_name(bt->dtype));
    int64_t cols = exp[en - 1];
    if (t->ndim != en || st->ndim != en || cols <= 0) return shape_err(c, canon, " (packed)", exp, en, t);
    for (int k = 0; k < en - 1; k++)
        if (t->shape[k] != exp[k]) return shape_err(c, canon, " (packed)", exp, en, t);
    int64_t pc = t->shape[en - 1], sc = st->shape[en - 1];
    int bits = (pc * 32) % cols == 0 ? (int)(pc * 32 / cols) : 0;
    int gs = sc > 0 && cols % sc == 0 ? (int)(cols / sc) : 0;
    if (!pt_quant_bits_valid(bits) || !pt_quant_group_valid(gs)) {
        char b2[128], b3[128];
        return pt_error(PT_ERR_FORMAT,
                        "tensor '%s': packed shape %s and scales %s do not fit logical shape %s with MLX bits "
                        "2/3/4/5/6/8 and group size 32/64/128",
                        disp(c, canon, d, sizeof d), pt_shape_str(t->shape, t->ndim, a, sizeof a),
                        pt_shape_str(st->shape, st->ndim, b2, sizeof b2), pt_shape_str(exp, en, b3, sizeof b3));
    }
    for (int k = 0; k < en; k++)
        if (st->shape[k] != (k == en - 1 ? cols / gs : exp[k]) || bt->shape[k] != st->shape[k])
            return pt_error(PT_ERR_FORMAT, "tensor '%s.scales'/'.biases': shapes do not match the weight",
                            disp(c, base, d, sizeof d));
    const pt_quant_config *q = &c->cfg->quant;
    if (q->present) {
        /* the config keys modules by the checkpoint's own path */
        char path[1100];
        const char *full = t->name;
        size_t L = strlen(full);
        snprintf(path, sizeof path, "%.*s", (int)(L > 7 && !strcmp(full + L - 7, ".weight") ? L - 7 : L), full);
        int cb, cg;
        pt_quant_lookup(q, path, &cb, &cg);
        if (cb != bits || cg != gs)
            return pt_error(PT_ERR_FORMAT,
                            "tensor '%s': stored as %d-bit, group size %d, but config.json quantization says %s%d-bit, "
                            "group size %d",
                            t->name, bits, gs, cb ? "" : "not quantized / ", cb, cg);
    }
    w->bits = bits;
    w->group_size = gs;
    w->scales = st->data;
    w->biases = bt->data;
    w->qdtype = st->dtype;
    c->s->quantized = 1;
    return PT_OK;
}

static pt_status bind_linear(ctx *c, const char *base, int64_t rows, int64_t cols, int required, pt_weight *w) {
    char nm[1100];
    snprintf(nm, sizeof nm, "%s.weight", base);
    int64_t e[2] = {rows, cols};
    return bind(c, nm, base, e, 2, required, w);
}

static pt_status bind_vec(ctx *c, const char *canon, int64_t n, int required, pt_weight *w) {
    int64_t e[1] = {n};
    return bind(c, canon, NULL, e, 1, required, w);
}

static pt_status bind_norm(ctx *c, const char *base, int64_t n, int required, pt_weight *w) {
    char nm[1100];
    snprintf(nm, sizeof nm, "%s.weight", base);
    return bind_vec(c, nm, n, required, w);
}

/* A view of rows [r0, r0+rows) of matrix `e` of a stacked [E, R, C] weight. */
static pt_weight view(const pt_weight *p, int64_t e, int64_t r0, int64_t rows) {
    pt_weight v = *p;
    int64_t R = p->shape[1], C = p->shape[2];
    int64_t row = e * R + r0;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = C;
    v.shape[2] = 0;
    if (p->bits) {
        v.data = (const char *)p->data + row * (C * p->bits / 32) * 4;
        size_t es = pt_dtype_size(p->qdtype);
        v.scales = (const char *)p->scales + row * (C / p->group_size) * es;
        v.biases = (const char *)p->biases + row * (C / p->group_size) * es;
    } else {
        v.data = (const char *)p->data + row * C * pt_dtype_size(p->dtype);
    }
    return v;
}

static pt_status alloc_experts(ctx *c, pt_layer_weights *lw, int E) {
    lw->expert_gate = pt_arena_alloc(&c->in->arena, (size_t)E * sizeof(pt_weight));
    lw->expert_up = pt_arena_alloc(&c->in->arena, (size_t)E * sizeof(pt_weight));
    lw->expert_down = pt_arena_alloc(&c->in->arena, (size_t)E * sizeof(pt_weight));
    return lw->expert_gate && lw->expert_up && lw->expert_down ? PT_OK : pt_error(PT_ERR_NOMEM, "out of memory");
}

/* Experts of one layer, in any of the three layouts:
 *   per expert  P.experts.{e}.{gate,up,down}_proj.weight          (HF Qwen3-MoE)
 *   fused       P.experts.gate_up_proj [E,2I,H], P.experts.down_proj [E,H,I]  (HF Gemma 4, Qwen3.5-MoE)
 *   stacked     P.<stack>.{gate,up,down}_proj.weight [E,I,H]...   (MLX switch_mlp / switch_glu) */
static pt_status bind_experts(ctx *c, const char *p, const char *stack, int E, int64_t I, int64_t H,
                              pt_layer_weights *lw) {
    PT_TRY(alloc_experts(c, lw, E));
    char nm[1100], base[1100];
    snprintf(nm, sizeof nm, "%s.%s.gate_proj.weight", p, stack);
    if (lookup(c, nm) >= 0) {
        static const char *which[3] = {"gate_proj", "up_proj", "down_proj"};
        pt_weight st[3];
        for (int k = 0; k < 3; k++) {
            snprintf(base, sizeof base, "%s.%s.%s", p, stack, which[k]);
            snprintf(nm, sizeof nm, "%s.weight", base);
            int64_t e[3] = {E, k == 2 ? H : I, k == 2 ? I : H};
            PT_TRY(bind(c, nm, base, e, 3, 1, &st[k]));
        }
        for (int e = 0; e < E; e++) {
            lw->expert_gate[e] = view(&st[0], e, 0, I);
            lw->expert_up[e] = view(&st[1], e, 0, I);
            lw->expert_down[e] = view(&st[2], e, 0, H);
        }
        return PT_OK;
    }
    snprintf(nm, sizeof nm, "%s.experts.gate_up_proj", p);
    if (lookup(c, nm) >= 0) {
        pt_weight gu, dn;
        int64_t e1[3] = {E, 2 * I, H}, e2[3] = {E, H, I};
        PT_TRY(bind(c, nm, NULL, e1, 3, 1, &gu));
        snprintf(nm, sizeof nm, "%s.experts.down_proj", p);
        PT_TRY(bind(c, nm, NULL, e2, 3, 1, &dn));
        for (int e = 0; e < E; e++) {
            lw->expert_gate[e] = view(&gu, e, 0, I);
            lw->expert_up[e] = view(&gu, e, I, I);
            lw->expert_down[e] = view(&dn, e, 0, H);
        }
        return PT_OK;
    }
    for (int e = 0; e < E; e++) {
        snprintf(base, sizeof base, "%s.experts.%d.gate_proj", p, e);
        PT_TRY(bind_linear(c, base, I, H, 1, &lw->expert_gate[e]));
        snprintf(base, sizeof base, "%s.experts.%d.up_proj", p, e);
        PT_TRY(bind_linear(c, base, I, H, 1, &lw->expert_up[e]));
        snprintf(base, sizeof base, "%s.experts.%d.down_proj", p, e);
        PT_TRY(bind_linear(c, base, H, I, 1, &lw->expert_down[e]));
    }
    return PT_OK;
}

/* Marks a tensor that is present but intentionally unused (HF KV-shared
 * layers' k/v projections, a tied model's duplicate lm_head). */
static void mark_unused(ctx *c, const char *canon_prefix) {
    size_t n = strlen(canon_prefix);
    for (int i = 0; i < c->n; i++)
        if (c->canon[i] && !strncmp(c->canon[i], canon_prefix, n) &&
            (c->canon[i][n] == '.' || c->canon[i][n] == 0)) {
            c->used[i] = 2;
            c->s->n_skipped++;
        }
}

static pt_norm_style norm_style_for(const ctx *c) {
    switch (c->cfg->arch) {
    case PT_ARCH_GEMMA2:
    case PT_ARCH_GEMMA3: return PT_NORM_1PW;
    case PT_ARCH_QWEN3_5: {
        /* HF files store zero-centred norms (1+w); mlx-lm's conversion folds
         * the +1 in and reshapes conv1d [C,1,K] -> [C,K,1]: the conv shape
         * tells which (mlx-lm's own test, qwen3_5.py sanitize). */
        for (int i = 0; i < c->n; i++)
            if (c->canon[i] && strstr(c->canon[i], "linear_attn.conv1d.weight")) {
                const pt_tensor *t = &c->ts->tensors[i];
                if (t->ndim == 3 && t->shape[2] == 1 && t->shape[1] != 1) return PT_NORM_W;
                return PT_NORM_1PW;
            }
        return c->s->mlx_layout ? PT_NORM_W : PT_NORM_1PW;
    }
    default: return PT_NORM_W;
    }
}

static pt_status layer_consts(ctx *c, int i, pt_layer_spec *l) {
    const pt_config *g = c->cfg;
    pt_arch a = g->arch;
    int gemma = a == PT_ARCH_GEMMA2 || a == PT_ARCH_GEMMA3 || a == PT_ARCH_GEMMA4;
    l->index = i;
    l->kind = g->layer_types[i];
    l->n_heads = (int)g->n_heads;
    l->n_kv_heads = (int)g->n_kv_heads;
    l->head_dim = (int)g->head_dim;
    l->sliding_window = l->kind == PT_LAYER_SLIDING ? (int)g->sliding_window : 0;
    l->has_kv = 1;
    l->kv_donor = i;
    l->norm_style = norm_style_for(c);
    l->sandwich_norms = gemma;
    l->act = gemma ? PT_ACT_GELU_TANH : PT_ACT_SILU;
    l->mlp = PT_MLP_DENSE;
    l->intermediate = (int)g->intermediate_size;
    l->residual_scale = 1.0f;
    l->attn_scale = (float)(1.0 / sqrt((double)l->head_dim));
    if (a == PT_ARCH_GEMMA2 || a == PT_ARCH_GEMMA3)
        l->attn_scale = (float)(1.0 / sqrt(g->query_pre_attn_scalar));
    if (a == PT_ARCH_GEMMA2) l->attn_softcap = (float)g->attn_logit_softcapping;
    if (a == PT_ARCH_QWEN3 || a == PT_ARCH_QWEN3_MOE || a == PT_ARCH_GEMMA3 || a == PT_ARCH_GEMMA4 ||
        a == PT_ARCH_QWEN3_5)
        l->q_norm = l->k_norm = l->norm_style;
    if (a == PT_ARCH_GEMMA4) {
        int first_shared = (int)(g->n_layers - g->num_kv_shared_layers);
        if (l->kind == PT_LAYER_FULL && g->global_head_dim) l->head_dim = (int)g->global_head_dim;
        l->attn_scale = 1.0f;
        l->k_eq_v = g->attention_k_eq_v && l->kind == PT_LAYER_FULL;
        if (l->k_eq_v && g->n_global_kv_heads) l->n_kv_heads = (int)g->n_global_kv_heads;
        l->v_norm = PT_NORM_NOSCALE;
        if (g->num_kv_shared_layers > 0 && i >= first_shared) {
            l->has_kv = 0;
            l->kv_donor = -1;
            for (int j = first_shared - 1; j >= 0; j--)
                if (g->layer_types[j] == l->kind) {
                    l->kv_donor = j;
                    break;
                }
            if (l->kv_donor < 0)
                return pt_error(PT_ERR_FORMAT, "%s: layer %d shares KV but no earlier layer has type %s", g->path, i,
                                pt_layer_kind_name(l->kind));
            l->k_norm = l->v_norm = PT_NORM_NONE;
            if (g->use_double_wide_mlp) l->intermediate *= 2;
        }
        l->has_ple = g->hidden_size_per_layer_input > 0;
        l->has_layer_scalar = 1;
        if (g->enable_moe_block) {
            l->mlp = PT_MLP_MOE;
            l->moe_parallel_dense = 1;
            l->router = PT_ROUTER_GEMMA4;
            l->norm_topk = 1;
        }
    }
    if (a == PT_ARCH_QWEN3_5 && l->kind == PT_LAYER_FULL) l->attn_output_gate = g->attn_output_gate;
    if (a == PT_ARCH_QWEN3_5 && l->kind == PT_LAYER_LINEAR) {
        l->lin_k_heads = (int)g->linear_num_key_heads;
        l->lin_v_heads = (int)g->linear_num_value_heads;
        l->lin_k_dim = (int)g->linear_key_head_dim;
        l->lin_v_dim = (int)g->linear_value_head_dim;
        l->lin_conv_kernel = (int)g->linear_conv_kernel_dim;
        l->n_heads = l->n_kv_heads = l->head_dim = 0;
        l->q_norm = l->k_norm = PT_NORM_NONE;
        l->has_kv = 0;
        l->kv_donor = -1;
    }
    if (g->n_experts > 0 && (a == PT_ARCH_QWEN3_MOE || a == PT_ARCH_QWEN3_5)) {
        int moe = 1;
        if (a == PT_ARCH_QWEN3_MOE) {
            for (int k = 0; k < g->n_mlp_only_layers; k++) moe &= g->mlp_only_layers[k] != i;
            moe &= (i + 1) % g->decoder_sparse_step == 0;
        }
        if (moe) {
            l->mlp = PT_MLP_MOE;
            l->router = PT_ROUTER_SOFTMAX_TOPK;
            l->norm_topk = g->norm_topk_prob;
            l->shared_expert_intermediate = (int)g->shared_expert_intermediate_size;
        }
    }
    if (l->mlp == PT_MLP_MOE) {
        l->n_experts = (int)g->n_experts;
        l->top_k = (int)g->n_experts_per_tok;
        l->moe_intermediate = (int)g->moe_intermediate_size;
    } else if (l->intermediate <= 0) {
        return pt_error(PT_ERR_NOT_FOUND, "%s: layer %d is dense but \"intermediate_size\" is missing", g->path, i);
    }
    if (a == PT_ARCH_MINICPM) l->residual_scale = (float)(g->scale_depth / sqrt((double)g->n_layers));

    if (l->kind != PT_LAYER_LINEAR) {
        pt_rope_table *rt = &c->in->rope[l->kind == PT_LAYER_SLIDING];
        if (a == PT_ARCH_GEMMA4 && l->kind == PT_LAYER_FULL && l->head_dim != g->head_dim) rt = &c->in->rope_g;
        if (!rt->inv_freq)
            PT_TRY(pt_rope_table_build(&g->rope[l->kind == PT_LAYER_SLIDING], l->head_dim, g->max_position_embeddings,
                                       g->path, rt));
        l->rope_type = g->rope[l->kind == PT_LAYER_SLIDING].type;
        l->rope_dims = rt->rope_dims;
        l->inv_freq = rt->inv_freq;
        l->inv_freq_long = rt->inv_freq_long;
        l->rope_original_max = rt->original_max;
        l->rope_attn_scaling = rt->attn_scaling;
    }
    return PT_OK;
}

static pt_status layer_weights(ctx *c, pt_layer_spec *l) {
    const pt_config *g = c->cfg;
    pt_layer_weights *w = &l->w;
    int64_t H = g->hidden_size;
    char p[256], b[512];
    snprintf(p, sizeof p, "model.layers.%d", l->index);
#define B(suffix) (snprintf(b, sizeof b, "%s.%s", p, suffix), b)
    PT_TRY(bind_norm(c, B("input_layernorm"), H, 1, &w->input_norm));
    PT_TRY(bind_norm(c, B("post_attention_layernorm"), H, 1, &w->post_attn_norm));
    if (l->sandwich_norms) {
        PT_TRY(bind_norm(c, B("pre_feedforward_layernorm"), H, 1, &w->pre_ffn_norm));
        PT_TRY(bind_norm(c, B("post_feedforward_layernorm"), H, 1, &w->post_ffn_norm));
    }
    if (l->kind == PT_LAYER_LINEAR) {
        int64_t kd = (int64_t)l->lin_k_heads * l->lin_k_dim, vd = (int64_t)l->lin_v_heads * l->lin_v_dim;
        int64_t C = 2 * kd + vd, K = l->lin_conv_kernel;
        PT_TRY(bind_linear(c, B("linear_attn.in_proj_qkv"), C, H, 1, &w->lin_in_qkv));
        PT_TRY(bind_linear(c, B("linear_attn.in_proj_z"), vd, H, 1, &w->lin_in_z));
        PT_TRY(bind_linear(c, B("linear_attn.in_proj_b"), l->lin_v_heads, H, 1, &w->lin_in_b));
        PT_TRY(bind_linear(c, B("linear_attn.in_proj_a"), l->lin_v_heads, H, 1, &w->lin_in_a));
        PT_TRY(bind_linear(c, B("linear_attn.out_proj"), H, vd, 1, &w->lin_out_proj));
        PT_TRY(bind_vec(c, B("linear_attn.A_log"), l->lin_v_heads, 1, &w->lin_A_log));
        PT_TRY(bind_vec(c, B("linear_attn.dt_bias"), l->lin_v_heads, 1, &w->lin_dt_bias));
        PT_TRY(bind_norm(c, B("linear_attn.norm"), l->lin_v_dim, 1, &w->lin_norm));
        /* conv1d: HF [C, 1, K], MLX [C, K, 1]: the same bytes; bound as [C, K] */
        int ci = lookup(c, B("linear_attn.conv1d.weight"));
        int64_t hf[3] = {C, 1, K}, mlx[3] = {C, K, 1};
        if (ci >= 0 && same_shape(&c->ts->tensors[ci], mlx, 3)) PT_TRY(bind(c, b, NULL, mlx, 3, 1, &w->lin_conv1d));
        else PT_TRY(bind(c, b, NULL, hf, 3, 1, &w->lin_conv1d));
        w->lin_conv1d.ndim = 2;
        w->lin_conv1d.shape[0] = C;
        w->lin_conv1d.shape[1] = K;
        w->lin_conv1d.shape[2] = 0;
    } else {
        int64_t hd = l->head_dim, q_out = (int64_t)l->n_heads * hd * (l->attn_output_gate ? 2 : 1);
        int64_t kv_out = (int64_t)l->n_kv_heads * hd;
        PT_TRY(bind_linear(c, B("self_attn.q_proj"), q_out, H, 1, &w->q_proj));
        PT_TRY(bind_linear(c, B("self_attn.o_proj"), H, (int64_t)l->n_heads * hd, 1, &w->o_proj));
        if (l->has_kv) {
            PT_TRY(bind_linear(c, B("self_attn.k_proj"), kv_out, H, 1, &w->k_proj));
            if (!l->k_eq_v) PT_TRY(bind_linear(c, B("self_attn.v_proj"), kv_out, H, 1, &w->v_proj));
        } else { /* KV-shared: transformers checkpoints may still carry these */
            mark_unused(c, B("self_attn.k_proj"));
            mark_unused(c, B("self_attn.v_proj"));
            mark_unused(c, B("self_attn.k_norm"));
        }
        if (g->attention_bias) {
            PT_TRY(bind_vec(c, B("self_attn.q_proj.bias"), q_out, 1, &w->q_bias));
            if (l->has_kv) {
                PT_TRY(bind_vec(c, B("self_attn.k_proj.bias"), kv_out, 1, &w->k_bias));
                if (!l->k_eq_v) PT_TRY(bind_vec(c, B("self_attn.v_proj.bias"), kv_out, 1, &w->v_bias));
            }
            PT_TRY(bind_vec(c, B("self_attn.o_proj.bias"), H, g->arch == PT_ARCH_LLAMA, &w->o_bias));
        }
        if (l->q_norm) PT_TRY(bind_norm(c, B("self_attn.q_norm"), hd, 1, &w->q_norm));
        if (l->k_norm) PT_TRY(bind_norm(c, B("self_attn.k_norm"), hd, 1, &w->k_norm));
    }
    if (l->mlp == PT_MLP_DENSE || l->moe_parallel_dense) {
        int64_t I = l->intermediate;
        PT_TRY(bind_linear(c, B("mlp.gate_proj"), I, H, 1, &w->gate_proj));
        PT_TRY(bind_linear(c, B("mlp.up_proj"), I, H, 1, &w->up_proj));
        PT_TRY(bind_linear(c, B("mlp.down_proj"), H, I, 1, &w->down_proj));
        if (g->mlp_bias) return pt_error(PT_ERR_UNSUPPORTED, "%s: mlp_bias is not supported", g->path);
    }
    if (l->mlp == PT_MLP_MOE) {
        int E = l->n_experts;
        int64_t I = l->moe_intermediate;
        if (l->router == PT_ROUTER_GEMMA4) {
            PT_TRY(bind_linear(c, B("router.proj"), E, H, 1, &w->router));
            PT_TRY(bind_vec(c, B("router.scale"), H, 1, &w->router_scale));
            PT_TRY(bind_vec(c, B("router.per_expert_scale"), E, 1, &w->router_per_expert_scale));
            PT_TRY(bind_norm(c, B("pre_feedforward_layernorm_2"), H, 1, &w->pre_ffn_norm_2));
            PT_TRY(bind_norm(c, B("post_feedforward_layernorm_1"), H, 1, &w->post_ffn_norm_1));
            PT_TRY(bind_norm(c, B("post_feedforward_layernorm_2"), H, 1, &w->post_ffn_norm_2));
            char pe[300];
            snprintf(pe, sizeof pe, "%s.experts", p);
            /* MLX: P.experts.switch_glu.*; HF: P.experts.{gate_up,down}_proj */
            char nm[400];
            snprintf(nm, sizeof nm, "%s.switch_glu.gate_proj.weight", pe);
            if (lookup(c, nm) >= 0) PT_TRY(bind_experts(c, pe, "switch_glu", E, I, H, w));
            else PT_TRY(bind_experts(c, p, "switch_glu", E, I, H, w));
        } else {
            char pm[300];
            snprintf(pm, sizeof pm, "%s.mlp", p);
            PT_TRY(bind_linear(c, B("mlp.gate"), E, H, 1, &w->router));
            PT_TRY(bind_experts(c, pm, "switch_mlp", E, I, H, w));
            if (l->shared_expert_intermediate) {
                int64_t S = l->shared_expert_intermediate;
                PT_TRY(bind_linear(c, B("mlp.shared_expert.gate_proj"), S, H, 1, &w->shared_gate_proj));
                PT_TRY(bind_linear(c, B("mlp.shared_expert.up_proj"), S, H, 1, &w->shared_up_proj));
                PT_TRY(bind_linear(c, B("mlp.shared_expert.down_proj"), H, S, 1, &w->shared_down_proj));
                PT_TRY(bind_linear(c, B("mlp.shared_expert_gate"), 1, H, 1, &w->shared_expert_gate));
            }
        }
    }
    if (l->has_ple) {
        int64_t P = g->hidden_size_per_layer_input;
        PT_TRY(bind_linear(c, B("per_layer_input_gate"), P, H, 1, &w->ple_gate));
        PT_TRY(bind_linear(c, B("per_layer_projection"), H, P, 1, &w->ple_proj));
        PT_TRY(bind_norm(c, B("post_per_layer_input_norm"), H, 1, &w->ple_post_norm));
    }
    if (l->has_layer_scalar) PT_TRY(bind_vec(c, B("layer_scalar"), 1, 1, &w->layer_scalar));
#undef B
    return PT_OK;
}

int64_t pt_weight_numel(const pt_weight *w) {
    if (!w->data) return 0;
    int64_t n = 1;
    for (int i = 0; i < w->ndim; i++) n *= w->shape[i];
    return n;
}

int64_t pt_weight_bytes(const pt_weight *w) {
    int64_t n = pt_weight_numel(w);
    if (!n) return 0;
    if (!w->bits) return n * (int64_t)pt_dtype_size(w->dtype);
    return n * w->bits / 8 + 2 * (n / w->group_size) * (int64_t)pt_dtype_size(w->qdtype);
}

/* Walks every pt_weight member of pt_layer_weights: the members before
 * expert_gate and from shared_gate_proj to the end are all pt_weight (spec.h
 * keeps them so); the three expert arrays between them are walked separately. */
static void visit_layer(const pt_layer_spec *l, pt_weight_visit_fn fn, void *ctx) {
    const pt_layer_weights *lw = &l->w;
    for (const pt_weight *p = &lw->input_norm; (const char *)p < (const char *)&lw->expert_gate; p++)
        if (p->data) fn(ctx, p, l->index);
    for (int e = 0; lw->expert_gate && e < l->n_experts; e++) {
        fn(ctx, &lw->expert_gate[e], l->index);
        fn(ctx, &lw->expert_up[e], l->index);
        fn(ctx, &lw->expert_down[e], l->index);
    }
    for (const pt_weight *p = &lw->shared_gate_proj; (const char *)p < (const char *)(lw + 1); p++)
        if (p->data) fn(ctx, p, l->index);
}

void pt_spec_for_each_weight(const pt_model_spec *s, pt_weight_visit_fn fn, void *ctx) {
    const pt_weight *top[] = {&s->embed, &s->final_norm, &s->lm_head, &s->ple_embed, &s->ple_model_proj,
                              &s->ple_proj_norm};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (top[i]->data && !(top[i] == &s->lm_head && s->tied)) fn(ctx, top[i], -1);
    for (int i = 0; i < s->n_layers; i++) visit_layer(&s->layers[i], fn, ctx);
}

static void account(void *ctx, const pt_weight *w, int layer) {
    pt_model_spec *s = ctx;
    (void)layer;
    size_t es = pt_dtype_size(w->dtype), qs = w->bits ? pt_dtype_size(w->qdtype) : 1;
    if ((uintptr_t)w->data % es || (w->bits && ((uintptr_t)w->scales % qs || (uintptr_t)w->biases % qs)))
        s->n_unaligned++;
    s->n_params += pt_weight_numel(w);
    s->weight_bytes += pt_weight_bytes(w);
    s->n_bound++;
}

static pt_status build(ctx *c, const pt_kv_config *kv) {
    const pt_config *g = c->cfg;
    pt_model_spec *s = c->s;
    PT_TRY(canon_names(c));
    s->arch = g->arch;
    s->n_layers = (int)g->n_layers;
    s->hidden = (int)g->hidden_size;
    s->vocab = (int)g->vocab_size;
    s->max_ctx = g->max_position_embeddings;
    s->rms_eps = (float)g->rms_norm_eps;
    int64_t H = g->hidden_size, V = g->vocab_size;
    s->final_norm_style = norm_style_for(c);
    if (g->arch == PT_ARCH_GEMMA4) s->final_norm_style = PT_NORM_W;
    s->embed_scale = 1.0f;
    s->logit_scale = 1.0f;
    if (g->arch == PT_ARCH_GEMMA2 || g->arch == PT_ARCH_GEMMA3 || g->arch == PT_ARCH_GEMMA4) {
        s->embed_scale = (float)sqrt((double)H);
        s->embed_scale_round_to_dtype = 1;
        s->final_softcap = (float)g->final_logit_softcapping;
    }
    if (g->arch == PT_ARCH_MINICPM) {
        s->embed_scale = (float)g->scale_emb;
        s->logit_scale = (float)(g->dim_model_base / (double)H);
    }
    PT_TRY(bind_linear(c, "model.embed_tokens", V, H, 1, &s->embed));
    PT_TRY(bind_norm(c, "model.norm", H, 1, &s->final_norm));
    s->tied = g->tie_word_embeddings;
    if (s->tied) {
        s->lm_head = s->embed;
        mark_unused(c, "lm_head"); /* a tied checkpoint may still store a copy (mlx-lm MiniCPM does) */
    } else {
        PT_TRY(bind_linear(c, "lm_head", V, H, 1, &s->lm_head));
    }
    if (g->arch == PT_ARCH_GEMMA4 && g->hidden_size_per_layer_input > 0) {
        int64_t P = g->hidden_size_per_layer_input, L = g->n_layers;
        s->ple_dim = (int)P;
        s->ple_vocab = (int)g->vocab_size_per_layer_input;
        PT_TRY(bind_linear(c, "model.embed_tokens_per_layer", g->vocab_size_per_layer_input, L * P, 1, &s->ple_embed));
        PT_TRY(bind_linear(c, "model.per_layer_model_projection", L * P, H, 1, &s->ple_model_proj));
        PT_TRY(bind_norm(c, "model.per_layer_projection_norm", P, 1, &s->ple_proj_norm));
        s->ple_embed_scale = (float)sqrt((double)P);
        s->ple_proj_scale = (float)(1.0 / sqrt((double)H));
        s->ple_input_scale = (float)(1.0 / sqrt(2.0));
    }
    s->layers = pt_arena_alloc(&c->in->arena, (size_t)s->n_layers * sizeof *s->layers);
    if (!s->layers) return pt_error(PT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->n_layers; i++) {
        pt_layer_spec *l = &s->layers[i];
        PT_TRY(layer_consts(c, i, l));
        PT_TRY(layer_weights(c, l));
        if (l->has_kv && l->kind != PT_LAYER_LINEAR) s->n_cache_layers++;
        for (int k = 0; kv && k < kv->n; k++)
            if (kv->entries[k].layer_idx == i) {
                l->kv_config_bits = kv->entries[k].bits;
                l->kv_config_group_size = kv->entries[k].group_size;
                if (l->head_dim % l->kv_config_group_size)
                    return pt_error(PT_ERR_FORMAT, "kv_config.json: layer %d group_size %d does not divide head_dim %d",
                                    i, l->kv_config_group_size, l->head_dim);
            }
    }
    /* every tensor must be explained */
    for (int i = 0; i < c->n; i++)
        if (!c->used[i])
            return pt_error(PT_ERR_FORMAT, "unexpected tensor '%s' (%s %s): %s does not use it",
                            c->ts->tensors[i].name, pt_dtype_name(c->ts->tensors[i].dtype),
                            pt_shape_str(c->ts->tensors[i].shape, c->ts->tensors[i].ndim, (char[128]){0}, 128),
                            pt_arch_name(g->arch));
    /* the model's float dtype: the embedding's (or its scales') */
    s->dtype = s->embed.bits ? s->embed.qdtype : s->embed.dtype;
    pt_spec_for_each_weight(s, account, s);
    return PT_OK;
}

pt_status pt_spec_build(const pt_config *cfg, const pt_tensor_set *ts, const pt_kv_config *kv, pt_model_spec *out) {
    memset(out, 0, sizeof *out);
    spec_internal *in = calloc(1, sizeof *in);
    if (!in) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_arena_init(&in->arena, 1 << 16);
    out->internal = in;
    ctx c = {.cfg = cfg, .ts = ts, .s = out, .in = in};
    pt_status st = build(&c, kv);
    if (st) pt_spec_free(out);
    return st;
}

void pt_spec_free(pt_model_spec *s) {
    if (!s) return;
    spec_internal *in = s->internal;
    if (in) {
        pt_rope_table_free(&in->rope[0]);
        pt_rope_table_free(&in->rope[1]);
        pt_rope_table_free(&in->rope_g);
        pt_arena_free(&in->arena);
        free(in);
    }
    memset(s, 0, sizeof *s);
}

int64_t pt_spec_kv_bytes_per_token(const pt_model_spec *s, int kv_bits, int group_size) {
    int64_t total = 0;
    for (int i = 0; i < s->n_layers; i++) {
        const pt_layer_spec *l = &s->layers[i];
        if (!l->has_kv || l->kind == PT_LAYER_LINEAR) continue;
        int64_t n = (int64_t)l->n_kv_heads * l->head_dim; /* per K or V row */
        if (kv_bits == 0) total += 2 * n * 2;
        else total += 2 * (n * kv_bits / 8 + 2 * (n / group_size) * 2);
    }
    return total;
}
