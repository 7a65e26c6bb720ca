/* CPU ops that are not matmuls or attention: RMSNorm (optionally fused with
 * the residual add), RoPE, gated activations, elementwise ops, soft-cap, MoE
 * routing and argmax. Each splits rows (or elements) across the pool; every
 * element is computed by the same sequential code whatever the split.
 * Rounding points in bf16 mode follow backend.h. */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements an elementwise op runs on the caller alone: the
 * pool's wake-up would cost more than the work. */
#define PT_CPU_PAR_MIN 32768

/* ---- RMSNorm ---- */

typedef struct {
    pt_cpu *c;
    float *y;
    const float *x;
    float *res;
    int64_t T, D;
    const void *w;
    pt_ftype wt;
    pt_rms_style style;
    float eps;
    const float *wf; /* the weights as f32 for the kernel table's rms_norm16, else NULL */
} norm_ctx;

static void norm_run(void *arg, long r0, long r1, int ith) {
    (void)ith;
    norm_ctx *n = arg;
    pt_act_dtype act = n->c->base.act;
    int64_t D = n->D;
    for (long r = r0; r < r1; r++) {
        if (n->wf && r + 16 <= r1) { /* 16 rows at once, the same bits */
            n->c->k->rms_norm16(n->y + r * D, n->x + r * D, n->res ? n->res + r * D : NULL, D,
                                n->style == PT_RMS_NOSCALE ? NULL : n->wf, (int)n->style, n->eps,
                                act == PT_ACT_BF16);
            r += 15;
            continue;
        }
        const float *x = n->x + r * D;
        float *y = n->y + r * D;
        if (n->res) {
            float *h = n->res + r * D;
            for (int64_t i = 0; i < D; i++) h[i] = pt_act_round(act, h[i] + x[i]);
            x = h;
        }
        float ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
        float inv = 1.0f / sqrtf(ss / (float)D + n->eps);
        switch (n->style) {
        case PT_RMS_W:
            for (int64_t i = 0; i < D; i++)
                y[i] = pt_act_round(act, pt_ft_load(n->wt, n->w, i) * pt_act_round(act, x[i] * inv));
            break;
        case PT_RMS_W_F32:
            for (int64_t i = 0; i < D; i++) y[i] = pt_act_round(act, x[i] * inv * pt_ft_load(n->wt, n->w, i));
            break;
        case PT_RMS_1PW:
            for (int64_t i = 0; i < D; i++) y[i] = pt_act_round(act, x[i] * inv * (1.0f + pt_ft_load(n->wt, n->w, i)));
            break;
        case PT_RMS_NOSCALE:
            for (int64_t i = 0; i < D; i++) y[i] = pt_act_round(act, x[i] * inv);
            break;
        }
    }
}

pt_status pt_cpu_rms_norm(pt_backend *be, float *y, const float *x, float *residual, int64_t T, int64_t D,
                          const void *w, pt_ftype wtype, pt_rms_style style, float eps) {
    PT_ASSERT(T >= 0 && D > 0);
    PT_ASSERT(style == PT_RMS_NOSCALE || w != NULL);
    pt_cpu *c = pt_cpu_of(be);
    norm_ctx n = {c, y, x, residual, T, D, w, wtype, style, eps, NULL};
    /* prefill: 16 rows at a time by the kernel table's rms_norm16 (the weights converted once) */
    float *wf = NULL;
    if (T >= 16 && c->k->rms_norm16 && (wf = malloc(sizeof(float) * (size_t)D))) {
        if (style != PT_RMS_NOSCALE) pt_ft_load_row(wtype, w, wf, D);
        n.wf = wf;
    }
    if (T * D < PT_CPU_PAR_MIN) norm_run(&n, 0, (long)T, 0);
    else pt_pool_for(c->pool, (long)T, wf ? 16 : 1, norm_run, &n);
    free(wf);
    return PT_OK;
}

/* ---- RoPE ---- */

typedef struct {
    pt_cpu *c;
    float *x;
    int64_t T;
    int nh, hd;
    const int32_t *pos;
    const pt_rope *rope;
} rope_ctx;

static void rope_run(void *arg, long i0, long i1, int ith) {
    rope_ctx *r = arg;
    pt_act_dtype act = r->c->base.act;
    int half = r->rope->rot_dim / 2;
    float *cs = pt_cpu_thread_scratch(r->c, ith), *sn = cs + half;
    int64_t cur_t = -1;
    for (long it = i0; it < i1; it++) {
        int64_t t = it / r->nh;
        if (t != cur_t) { /* cos/sin of this token, shared by its heads */
            cur_t = t;
            float p = (float)r->pos[t];
            for (int i = 0; i < half; i++) {
                float th = p * r->rope->inv_freq[i];
                cs[i] = pt_act_round(act, cosf(th) * r->rope->attn_scale);
                sn[i] = pt_act_round(act, sinf(th) * r->rope->attn_scale);
            }
        }
        float *v = r->x + it * r->hd;
        if (r->c->k->rope_rot) {
            r->c->k->rope_rot(v, cs, sn, half, act == PT_ACT_BF16);
            continue;
        }
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = pt_act_round(act, pt_act_round(act, a * cs[i]) + pt_act_round(act, -b * sn[i]));
            v[i + half] = pt_act_round(act, pt_act_round(act, b * cs[i]) + pt_act_round(act, a * sn[i]));
        }
    }
}

pt_status pt_cpu_rope(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                      const pt_rope *rope) {
    PT_ASSERT(rope->rot_dim > 0 && rope->rot_dim % 2 == 0 && rope->rot_dim <= head_dim);
    pt_cpu *c = pt_cpu_of(be);
    PT_TRY(pt_cpu_need_scratch(c, (size_t)rope->rot_dim, 0));
    rope_ctx r = {c, x, T, n_heads, head_dim, pos, rope};
    /* chunks of whole tokens: a token's cos/sin are computed once */
    if (T * n_heads * head_dim < PT_CPU_PAR_MIN / 4) rope_run(&r, 0, (long)(T * n_heads), 0);
    else pt_pool_for(c->pool, (long)(T * n_heads), n_heads, rope_run, &r);
    return PT_OK;
}

/* ---- gated activations ---- */

float pt_cpu_silu(float g) { return g / (1.0f + expf(-g)); }
float pt_cpu_gelu_tanh(float g) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}

typedef struct {
    pt_cpu *c;
    float *y;
    const float *g, *u;
    int64_t T, F, ld;
    pt_glu_kind fn;
} glu_ctx;

static void glu_run(void *arg, long i0, long i1, int ith) {
    (void)ith;
    glu_ctx *q = arg;
    pt_act_dtype act = q->c->base.act;
    /* row by row: one division per row, not per element (it was ~half of the op) */
    for (long i = i0; i < i1;) {
        int64_t t = i / q->F, f0 = i % q->F, f1 = q->F - f0 < i1 - i ? q->F : f0 + (i1 - i);
        const float *g = q->g + t * q->ld, *u = q->u + t * q->ld;
        float *y = q->y + t * q->F;
        if (q->fn == PT_GLU_SILU && q->c->k->silu_mul)
            q->c->k->silu_mul(y + f0, g + f0, u + f0, f1 - f0, act == PT_ACT_BF16);
        else if (q->fn == PT_GLU_SILU)
            for (int64_t f = f0; f < f1; f++) y[f] = pt_act_round(act, pt_act_round(act, pt_cpu_silu(g[f])) * u[f]);
        else
            for (int64_t f = f0; f < f1; f++)
                y[f] = pt_act_round(act, pt_act_round(act, pt_cpu_gelu_tanh(g[f])) * u[f]);
        i += (long)(f1 - f0);
    }
}

pt_status pt_cpu_glu(pt_backend *be, float *y, const float *gate, const float *up, int64_t T, int64_t F, int64_t ld,
                     pt_glu_kind act) {
    PT_ASSERT(ld >= F);
    glu_ctx q = {pt_cpu_of(be), y, gate, up, T, F, ld, act};
    if (T * F < PT_CPU_PAR_MIN / 4) glu_run(&q, 0, (long)(T * F), 0);
    else pt_pool_for(pt_cpu_of(be)->pool, (long)(T * F), 64, glu_run, &q);
    return PT_OK;
}

/* ---- elementwise ---- */

typedef enum { EW_ADD, EW_MUL, EW_ADD_SCALED, EW_SCALE, EW_SOFTCAP } ew_kind;

typedef struct {
    pt_cpu *c;
    ew_kind kind;
    float *y;
    const float *a, *b;
    float s;
    int64_t n;
} ew_ctx;

static void ew_run(void *arg, long i0, long i1, int ith) {
    (void)ith;
    ew_ctx *e = arg;
    pt_act_dtype act = e->c->base.act;
    float *y = e->y;
    const float *a = e->a, *b = e->b;
    float s = e->s;
    switch (e->kind) {
    case EW_ADD:
        for (long i = i0; i < i1; i++) y[i] = pt_act_round(act, a[i] + b[i]);
        break;
    case EW_MUL:
        for (long i = i0; i < i1; i++) y[i] = pt_act_round(act, a[i] * b[i]);
        break;
    case EW_ADD_SCALED:
        for (long i = i0; i < i1; i++) y[i] = pt_act_round(act, a[i] + pt_act_round(act, b[i] * s));
        break;
    case EW_SCALE:
        for (long i = i0; i < i1; i++) y[i] = pt_act_round(act, a[i] * s);
        break;
    case EW_SOFTCAP: /* reference: (x / cap).tanh() * cap, each step in the model dtype */
        for (long i = i0; i < i1; i++)
            y[i] = pt_act_round(act, pt_act_round(act, tanhf(pt_act_round(act, a[i] / s))) * s);
        break;
    }
}

static pt_status ew(pt_backend *be, ew_kind kind, float *y, const float *a, const float *b, float s, int64_t n) {
    ew_ctx e = {pt_cpu_of(be), kind, y, a, b, s, n};
    if (n < PT_CPU_PAR_MIN) ew_run(&e, 0, (long)n, 0);
    else pt_pool_for(pt_cpu_of(be)->pool, (long)n, 64, ew_run, &e);
    return PT_OK;
}

pt_status pt_cpu_add(pt_backend *be, float *y, const float *a, const float *b, int64_t n) {
    return ew(be, EW_ADD, y, a, b, 0, n);
}
pt_status pt_cpu_mul(pt_backend *be, float *y, const float *a, const float *b, int64_t n) {
    return ew(be, EW_MUL, y, a, b, 0, n);
}
pt_status pt_cpu_add_scaled(pt_backend *be, float *y, const float *a, const float *b, float s, int64_t n) {
    return ew(be, EW_ADD_SCALED, y, a, b, s, n);
}
pt_status pt_cpu_scale(pt_backend *be, float *y, const float *x, float s, int64_t n) {
    return ew(be, EW_SCALE, y, x, NULL, s, n);
}
pt_status pt_cpu_softcap(pt_backend *be, float *y, const float *x, float cap, int64_t n) {
    PT_ASSERT(cap > 0);
    return ew(be, EW_SOFTCAP, y, x, NULL, cap, n);
}

/* ---- MoE routing ---- */

pt_status pt_cpu_moe_route(pt_backend *be, int32_t *idx, float *weights, const float *logits, int64_t T,
                           const pt_moe_route *p) {
    pt_act_dtype act = be->act;
    int E = p->n_experts, k = p->top_k;
    if (E <= 0 || k <= 0 || k > E || E > 4096)
        return pt_error(PT_ERR_INVALID_ARG, "moe_route: top_k %d of %d experts is invalid", k, E);
    float prob[4096];
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        float m = -INFINITY;
        for (int e = 0; e < E; e++)
            if (l[e] > m) m = l[e];
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += (prob[e] = expf(l[e] - m));
        for (int e = 0; e < E; e++) prob[e] /= sum;
        int32_t *it = idx + t * k;
        float *wt = weights + t * k;
        float tsum = 0.0f;
        for (int j = 0; j < k; j++) { /* selection: k passes, ties to the lower index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < j; q++) taken |= it[q] == e;
                if (!taken && (best < 0 || prob[e] > prob[best])) best = e;
            }
            it[j] = best;
            wt[j] = prob[best];
            tsum += prob[best];
        }
        for (int j = 0; j < k; j++) {
            float w = p->renorm ? wt[j] / tsum : wt[j];
            if (p->per_expert_scale) w *= p->per_expert_scale[it[j]];
            wt[j] = pt_act_round(act, w);
        }
    }
    return PT_OK;
}

/* ---- argmax ---- */

pt_status pt_cpu_argmax(pt_backend *be, int32_t *out, const float *x, int64_t T, int64_t V) {
    (void)be;
    for (int64_t t = 0; t < T; t++) {
        const float *r = x + t * V;
        int64_t best = -1;
        for (int64_t i = 0; i < V; i++)
            if (!isnan(r[i]) && (best < 0 || r[i] > r[best])) best = i;
        out[t] = (int32_t)(best < 0 ? 0 : best);
    }
    return PT_OK;
}
