/* CPU attention over a KV cache (prefill chunks and decode) and kv_append.
 *
 * Work items are (group of up to 8 query tokens, KV head) pairs split across
 * the pool. One item handles all the query heads that share the KV head
 * (GQA) for all its tokens, so each K row is read once per item for all of
 * them and each V row once per token: decode reads the cache exactly once.
 * Scores for the group live in per-thread scratch [tokens·group, n_keys];
 * the softmax is exact (two passes: scores, then p·V).
 *
 * Quantized caches (MLX affine codes per token and head, DESIGN.md
 * "Quantized KV, exactly") are written with the MLX quantizer of
 * src/format/mlx_quant.h; attention over them takes the query scaled first
 * and every key and value row dequantized in f32 (scale·code + bias, two
 * roundings: the oracle's fp32 dequantization, tests/test_kv_quant.c),
 * then the full-precision machinery: the kernel table's attn_scores_tq and
 * attn_pv_q dequantize in registers as they go; without them (other bits,
 * ISAs, shapes) rows are dequantized 32 at a time into scratch for the
 * full-precision kernels. */
#include "backend/cpu/cpu_internal.h"

#include <stdatomic.h>

#include "base/error.h"
#include "format/mlx_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static pt_dtype sdtype_of(pt_ftype t) { return t == PT_FT_F32 ? PT_DTYPE_F32 : t == PT_FT_F16 ? PT_DTYPE_F16 : PT_DTYPE_BF16; }

static pt_status check_qkv(const pt_kv_layer *kv, const char *op) {
    if (!pt_mlx_bits_ok(kv->bits) || !pt_mlx_group_ok(kv->group_size) || kv->head_dim % kv->group_size)
        return pt_error(PT_ERR_UNSUPPORTED, "%s: quantized KV with %d bits, group size %d, head_dim %d not supported", op,
                        kv->bits, kv->group_size, kv->head_dim);
    return PT_OK;
}

/* Row (head h, slot) of a quantized cache: codes, scales, biases. */
static inline uint32_t *qkv_codes(void *base, const pt_kv_layer *kv, int h, int64_t slot) {
    return (uint32_t *)base + ((size_t)h * (size_t)kv->capacity + (size_t)slot) * (size_t)(kv->head_dim * kv->bits / 32);
}
static inline void *qkv_param(void *base, const pt_kv_layer *kv, int h, int64_t slot) {
    return (char *)base + ((size_t)h * (size_t)kv->capacity + (size_t)slot) * (size_t)(kv->head_dim / kv->group_size) *
                              pt_ftype_size(kv->dtype);
}

static pt_status quantize_row(pt_kv_layer *kv, int h, int64_t slot, const float *krow, const float *vrow) {
    pt_dtype sd = sdtype_of(kv->dtype);
    PT_TRY(pt_mlx_quantize_row(krow, kv->head_dim, kv->bits, kv->group_size, PT_MLX_RULE_METAL,
                               qkv_codes(kv->k, kv, h, slot), qkv_param(kv->k_scales, kv, h, slot),
                               qkv_param(kv->k_biases, kv, h, slot), sd));
    return pt_mlx_quantize_row(vrow, kv->head_dim, kv->bits, kv->group_size, PT_MLX_RULE_METAL,
                               qkv_codes(kv->v, kv, h, slot), qkv_param(kv->v_scales, kv, h, slot),
                               qkv_param(kv->v_biases, kv, h, slot), sd);
}

pt_status pt_cpu_kv_quantize(pt_backend *be, pt_kv_layer *dst, const pt_kv_layer *src, int64_t p0, int64_t p1) {
    pt_cpu *c = pt_cpu_of(be);
    if (src->bits || !dst->bits || src->n_kv != dst->n_kv || src->head_dim != dst->head_dim)
        return pt_error(PT_ERR_INVALID_ARG,
                        "kv_quantize: needs a full-precision source and a quantized destination of the same shape "
                        "(source %d bits, %d heads of %d; destination %d bits, %d heads of %d)",
                        src->bits, src->n_kv, src->head_dim, dst->bits, dst->n_kv, dst->head_dim);
    PT_TRY(check_qkv(dst, "kv_quantize"));
    if (p0 < 0 || p1 < p0 || p1 - p0 > src->capacity || p1 - p0 > dst->capacity)
        return pt_error(PT_ERR_RANGE, "kv_quantize: positions [%lld, %lld) do not fit the caches", (long long)p0,
                        (long long)p1);
    int hd = src->head_dim;
    PT_TRY(pt_cpu_need_scratch(c, (size_t)(2 * hd), 0));
    float *kr = pt_cpu_thread_scratch(c, 0), *vr = kr + hd;
    size_t es = pt_ftype_size(src->dtype);
    for (int64_t p = p0; p < p1; p++)
        for (int h = 0; h < src->n_kv; h++) {
            size_t off = ((size_t)h * (size_t)src->capacity + (size_t)(p % src->capacity)) * (size_t)hd * es;
            pt_ft_load_row(src->dtype, (const char *)src->k + off, kr, hd);
            pt_ft_load_row(src->dtype, (const char *)src->v + off, vr, hd);
            PT_TRY(quantize_row(dst, h, p % dst->capacity, kr, vr));
        }
    return PT_OK;
}

pt_status pt_cpu_kv_append(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                           const int32_t *pos) {
    (void)be;
    int hd = kv->head_dim;
    if (kv->bits) {
        PT_TRY(check_qkv(kv, "kv_append"));
        for (int64_t t = 0; t < T; t++) {
            if (pos[t] < 0) return pt_error(PT_ERR_RANGE, "kv_append: negative position %d", pos[t]);
            for (int h = 0; h < kv->n_kv; h++)
                PT_TRY(quantize_row(kv, h, pos[t] % kv->capacity, k + (t * kv->n_kv + h) * hd,
                                    v + (t * kv->n_kv + h) * hd));
        }
        return PT_OK;
    }
    for (int64_t t = 0; t < T; t++) {
        if (pos[t] < 0) return pt_error(PT_ERR_RANGE, "kv_append: negative position %d", pos[t]);
        int64_t slot = pos[t] % kv->capacity;
        for (int h = 0; h < kv->n_kv; h++) {
            const float *ks = k + (t * kv->n_kv + h) * hd, *vs = v + (t * kv->n_kv + h) * hd;
            size_t off = ((size_t)h * (size_t)kv->capacity + (size_t)slot) * (size_t)hd;
            if (kv->dtype == PT_FT_F32) {
                memcpy((float *)kv->k + off, ks, (size_t)hd * sizeof(float));
                memcpy((float *)kv->v + off, vs, (size_t)hd * sizeof(float));
            } else if (kv->dtype == PT_FT_BF16) {
                pt_f32_to_bf16_row(ks, (uint16_t *)kv->k + off, (size_t)hd);
                pt_f32_to_bf16_row(vs, (uint16_t *)kv->v + off, (size_t)hd);
            } else {
                pt_f32_to_f16_row(ks, (uint16_t *)kv->k + off, (size_t)hd);
                pt_f32_to_f16_row(vs, (uint16_t *)kv->v + off, (size_t)hd);
            }
        }
    }
    return PT_OK;
}

void pt_cpu_qrows_ref(float *dst, const pt_cpu_qrows *r, int64_t n) {
    const int hd = r->hd, gs = r->gs, ng = hd / gs;
    for (int64_t j = 0; j < n; j++) {
        const pt_cpu_qrows row = pt_cpu_qrows_at(r, j);
        float *o = dst + j * hd;
        pt_cpu_unpack_codes(row.codes, r->bits, 0, hd, o);
        for (int b = 0; b < ng; b++) {
            const float s = pt_ft_load(r->dt, row.sc, b), z = pt_ft_load(r->dt, row.bi, b);
            for (int i = b * gs; i < (b + 1) * gs; i++) o[i] = s * o[i] + z;
        }
    }
}

pt_cpu_qrows pt_cpu_kv_qrows(const pt_kv_layer *kv, int v, int h, int64_t slot) {
    return (pt_cpu_qrows){(const uint8_t *)qkv_codes(v ? kv->v : kv->k, kv, h, slot),
                          qkv_param(v ? kv->v_scales : kv->k_scales, kv, h, slot),
                          qkv_param(v ? kv->v_biases : kv->k_biases, kv, h, slot),
                          kv->dtype,
                          kv->bits,
                          kv->group_size,
                          kv->head_dim};
}

typedef struct {
    pt_cpu *c;
    float *out;
    const float *q;
    int64_t T;
    const int32_t *pos;
    const pt_kv_layer *kv;
    const pt_attn *p;
    int tq;       /* tokens per item (attn_group) */
    int64_t maxn; /* the most keys one token attends to */
    int dp;       /* a bf16 cache in bf16 mode with the vdpbf16ps kernels on (pt_cpu_attn_dp_on) and bf16-valued
                   * queries: the products on attn_scores_dp / attn_pv_dp, whose operands are then all bf16
                   * values (the probabilities are rounded to bf16 in this mode) */
    int amx;      /* a prefill call (T > 1) over a bf16 cache in bf16 mode with bf16-valued queries and the AMX
                   * kernels on (pt_cpu_attn_amx_on): the scores on attn_scores_amx, ahead of dp's, and the
                   * P·V of the call's tokens together on attn_pv_amx (the probabilities are bf16 values in
                   * this mode) */
} attn_ctx;

/* Whether every x[i] is a bf16 value (its low 16 bits zero): the queries in
 * bf16 mode are (rounded activations), which the vdpbf16ps kernels rely on;
 * anything else keeps the f32 kernels. One OR over the rows. */
static int bf16_valued(const float *x, int64_t n) {
    uint32_t low = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        low |= u & 0xffffu;
    }
    return low == 0;
}

/* S[(u·G + g)·lds + j] = q_{u,g} · k_j for len contiguous full-precision rows
 * k (bf16 or f32): the kernel table's kernels, else dot products. many: the
 * kernel of many rows (a prefill call's, or a decode step's with at least 4
 * query heads per KV head; kernels_avx512.c: below that a step's rows are
 * too few to pay for the key block's transposition). */
static void scores_rows(const pt_cpu_kernels *k, int many, int dp, int amx, float *S, int64_t lds, const float *q,
                        int64_t qs, int nt, int G, int hd, const void *k0, int64_t len, int bf) {
    if (many && amx && k->attn_scores_amx && k->attn_scores_amx(S, lds, q, qs, nt, G, hd, k0, len)) {
        atomic_fetch_add_explicit(&pt_cpu_path_count[PT_CPU_PATH_ATTN_AMX], 1, memory_order_relaxed);
        return;
    }
    if (many && dp && k->attn_scores_dp && k->attn_scores_dp(S, lds, q, qs, nt, G, hd, k0, len)) {
        atomic_fetch_add_explicit(&pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_S], 1, memory_order_relaxed);
        return;
    }
    if (many ? k->attn_scores_t && k->attn_scores_t(S, lds, q, qs, nt, G, hd, k0, len, bf)
             : k->attn_scores && k->attn_scores(S, lds, q, G, hd, k0, len, bf))
        return;
    for (int u = 0; u < nt; u++)
        for (int64_t j = 0; j < len; j++)
            for (int g = 0; g < G; g++) {
                const float *qg = q + u * qs + g * hd;
                S[(size_t)(u * G + g) * lds + j] = bf ? k->dot_bf16(qg, (const uint16_t *)k0 + j * hd, hd)
                                                      : k->dot_f32(qg, (const float *)k0 + j * hd, hd);
            }
}

/* acc[g·hd + d] += Σ_j P[g·ldp + j] · v_j[d] over len rows v (bf16 or f32) */
static void pv_rows(const pt_cpu_kernels *k, int dp, float *acc, const float *P, int64_t ldp, int G, int hd,
                    const void *v0, int64_t len, int bf) {
    if (dp && k->attn_pv_dp && k->attn_pv_dp(acc, P, ldp, G, hd, v0, len)) {
        atomic_fetch_add_explicit(&pt_cpu_path_count[PT_CPU_PATH_ATTN_DP_PV], 1, memory_order_relaxed);
        return;
    }
    if (k->attn_pv && k->attn_pv(acc, P, ldp, G, hd, v0, len, bf)) return;
    for (int64_t j = 0; j < len; j++)
        for (int g = 0; g < G; g++) {
            float pj = P[(size_t)g * ldp + j];
            if (bf) k->axpy_bf16(acc + g * hd, pj, (const uint16_t *)v0 + j * hd, hd);
            else k->axpy_f32(acc + g * hd, pj, (const float *)v0 + j * hd, hd);
        }
}

void pt_cpu_qscores(const pt_cpu_kernels *k, float *S, int64_t lds, const float *q, int64_t qs, int nt, int G,
                    const pt_cpu_qrows *kr, int64_t n, float *rows) {
    if (k->attn_scores_tq && k->attn_scores_tq(S, lds, q, qs, nt, G, kr, n)) return;
    for (int64_t jb = 0; jb < n; jb += PT_CPU_QROWS) {
        const int64_t nb = n - jb < PT_CPU_QROWS ? n - jb : PT_CPU_QROWS;
        const pt_cpu_qrows blk = pt_cpu_qrows_at(kr, jb);
        pt_cpu_qrows_ref(rows, &blk, nb);
        scores_rows(k, 1, 0, 0, S + jb, lds, q, qs, nt, G, kr->hd, rows, nb, 0);
    }
}

void pt_cpu_qpv(const pt_cpu_kernels *k, float *acc, const float *P, int64_t ldp, int G, const pt_cpu_qrows *vr,
                int64_t n, float *rows) {
    if (k->attn_pv_q && k->attn_pv_q(acc, P, ldp, G, vr, n)) return;
    for (int64_t jb = 0; jb < n; jb += PT_CPU_QROWS) {
        const int64_t nb = n - jb < PT_CPU_QROWS ? n - jb : PT_CPU_QROWS;
        const pt_cpu_qrows blk = pt_cpu_qrows_at(vr, jb);
        pt_cpu_qrows_ref(rows, &blk, nb);
        pv_rows(k, 0, acc, P + jb, ldp, G, vr->hd, rows, nb, 0);
    }
}

/* One row of scores into probabilities: s = round(round(s)·scale), the
 * soft-cap, then the two-pass softmax (rounded in bf16 mode) */
static void softmax_one(const pt_cpu *c, const pt_attn *p, float *sg, int64_t nu, float sscale) {
    const pt_cpu_kernels *k = c->k;
    pt_act_dtype act = c->base.act;
    if (p->softcap <= 0 && k->softmax_row) {
        k->softmax_row(sg, nu, sscale, act == PT_ACT_BF16);
        return;
    }
    for (int64_t j = 0; j < nu; j++) {
        float s = pt_act_round(act, pt_act_round(act, sg[j]) * sscale);
        if (p->softcap > 0)
            s = pt_act_round(act, pt_act_round(act, tanhf(pt_act_round(act, s / p->softcap))) * p->softcap);
        sg[j] = s;
    }
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < nu; j++)
        if (sg[j] > m) m = sg[j];
    for (int64_t j = 0; j < nu; j++) sum += (sg[j] = expf(sg[j] - m));
    float inv = 1.0f / sum;
    for (int64_t j = 0; j < nu; j++) sg[j] = pt_act_round(act, sg[j] * inv);
}

/* Scores of KV head kh's len cache rows from slot on (one ring run) for
 * the G heads of nt tokens, S[(u·G + g)·lds + j], full-precision or
 * quantized (q then already scaled); rows: PT_CPU_QROWS·hd scratch */
static void run_scores(const attn_ctx *a, int kh, float *S, int64_t lds, const float *q, int64_t qs, int nt,
                       int64_t slot, int64_t len, float *rows) {
    const pt_kv_layer *kv = a->kv;
    const int hd = a->p->head_dim, G = a->p->n_heads / kv->n_kv, bf = kv->dtype == PT_FT_BF16;
    if (kv->bits) {
        const pt_cpu_qrows kr = pt_cpu_kv_qrows(kv, 0, kh, slot);
        pt_cpu_qscores(a->c->k, S, lds, q, qs, nt, G, &kr, len, rows);
        return;
    }
    const char *k0 = (const char *)kv->k + ((size_t)kh * kv->capacity + (size_t)slot) * hd * (bf ? 2 : 4);
    /* a decode step's rows are many enough for the transposed block from 4 query heads a KV head, from 3
     * on bf16 pairs (their transpose moves twice the dims; one query over 8192 keys, head 64, G = 3:
     * 0.52-0.56 -> 0.43 ms a layer; G = 1, 2 and head 128 unchanged, bench/RESULTS.md) */
    scores_rows(a->c->k, a->T > 1 || G >= (a->dp ? 3 : 4), a->dp, a->amx, S, lds, q, qs, nt, G, hd, k0, len, bf);
}

/* acc[g·hd + d] += Σ_j P[g·ldp + j] · v_j[d] for nh heads over KV head kh's
 * len cache rows from slot on (one ring run) */
static void run_pv(const attn_ctx *a, int kh, float *acc, const float *P, int64_t ldp, int nh, int64_t slot,
                   int64_t len, float *rows) {
    const pt_kv_layer *kv = a->kv;
    const int hd = a->p->head_dim, bf = kv->dtype == PT_FT_BF16;
    if (kv->bits) {
        const pt_cpu_qrows vr = pt_cpu_kv_qrows(kv, 1, kh, slot);
        pt_cpu_qpv(a->c->k, acc, P, ldp, nh, &vr, len, rows);
        return;
    }
    const char *v0 = (const char *)kv->v + ((size_t)kh * kv->capacity + (size_t)slot) * hd * (bf ? 2 : 4);
    pv_rows(a->c->k, a->dp, acc, P, ldp, nh, hd, v0, len, bf);
}

/* Tokens [t0, t1) and KV head kh: the scores of every query head of the
 * tokens against the keys any of them attends to, [lo_u, hi_u], in one pass
 * over those keys (each key row read once for all the tokens' heads), then
 * per token its own keys' softmax and P·V. A quantized cache (DESIGN.md
 * "Quantized KV, exactly"): the query scaled first (q·scale rounded to the
 * activation dtype, as mlx-lm does), each key and value row dequantized in
 * f32 (pt_cpu_qrows_ref's values) and used as a full-precision row is, the
 * scores rounded by the softmax's own first step (scale 1). Scratch:
 * S [nt·G, n_u], acc [G, hd]; quantized also qx [nt·G, hd], rows
 * [PT_CPU_QROWS, hd]. */
static void attn_group(const attn_ctx *a, int64_t t0, int64_t t1, int kh, int64_t lo_u, int64_t hi_u, float *scr) {
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    pt_act_dtype act = a->c->base.act;
    const int hd = p->head_dim, G = p->n_heads / kv->n_kv, nt = (int)(t1 - t0);
    const int64_t cap = kv->capacity, n = hi_u - lo_u + 1;
    float *S = scr;                        /* [nt·G, n] */
    float *acc = scr + (size_t)nt * G * n; /* [G, hd] */
    float *qx = acc + (size_t)G * hd, *rows = qx + (size_t)nt * G * hd;
    const float *q = a->q + (t0 * p->n_heads + (int64_t)kh * G) * hd;
    int64_t qs = (int64_t)p->n_heads * hd;
    float sscale = p->scale;
    if (kv->bits) {
        for (int u = 0; u < nt; u++)
            pt_cpu_scale_queries(qx + (size_t)u * G * hd, q + u * qs, (int64_t)G * hd, p->scale, act);
        q = qx, qs = (int64_t)G * hd, sscale = 1.0f;
    }
    int64_t runs[2][3];
    pt_cpu_key_runs(runs, lo_u, n, cap);
    for (int r = 0; r < 2; r++)
        if (runs[r][2] > 0) run_scores(a, kh, S + runs[r][0], n, q, qs, nt, runs[r][1], runs[r][2], rows);
    if (a->amx && a->c->k->attn_pv_amx && hd % 64 == 0 && hd <= 256) {
        /* every token's probabilities over the group's keys (zero outside its own), then P·V of all the
         * group's rows on tiles, each key at its position's place in the 32-key steps (lead) */
        float *accr = acc + (size_t)G * hd; /* [nt·G, hd] */
        for (int u = 0; u < nt; u++) {
            const int64_t hi = a->pos[t0 + u], lo = pt_cpu_keys_lo(p, hi), nu = hi - lo + 1, off = lo - lo_u;
            for (int g = 0; g < G; g++) {
                float *Sg = S + (size_t)(u * G + g) * n;
                softmax_one(a->c, p, Sg + off, nu, sscale);
                memset(Sg, 0, sizeof(float) * (size_t)off);
                memset(Sg + off + nu, 0, sizeof(float) * (size_t)(n - off - nu));
            }
        }
        memset(accr, 0, sizeof(float) * (size_t)nt * G * hd);
        const char *v0 = (const char *)kv->v + (size_t)kh * cap * hd * 2;
        for (int r = 0; r < 2; r++)
            if (runs[r][2] > 0)
                a->c->k->attn_pv_amx(accr, S + runs[r][0], n, nt * G, hd, v0 + (size_t)runs[r][1] * hd * 2,
                                     runs[r][2], (int)((lo_u + runs[r][0]) % 32));
        atomic_fetch_add_explicit(&pt_cpu_path_count[PT_CPU_PATH_ATTN_AMX_PV], 1, memory_order_relaxed);
        for (int u = 0; u < nt; u++) {
            float *o = a->out + ((t0 + u) * p->n_heads + (int64_t)kh * G) * hd;
            const float *ar = accr + (size_t)u * G * hd;
            for (int64_t i = 0; i < (int64_t)G * hd; i++) o[i] = pt_act_round(act, ar[i]);
        }
        return;
    }
    for (int u = 0; u < nt; u++) {
        const int64_t hi = a->pos[t0 + u], lo = pt_cpu_keys_lo(p, hi), nu = hi - lo + 1, off = lo - lo_u;
        float *Su = S + (size_t)u * G * n + off; /* the token's rows: [G] × its nu keys, n apart */
        for (int g = 0; g < G; g++) softmax_one(a->c, p, Su + (size_t)g * n, nu, sscale);
        memset(acc, 0, (size_t)G * hd * sizeof(float));
        int64_t ru[2][3];
        pt_cpu_key_runs(ru, lo, nu, cap);
        for (int r = 0; r < 2; r++)
            if (ru[r][2] > 0) run_pv(a, kh, acc, Su + ru[r][0], n, G, ru[r][1], ru[r][2], rows);
        float *o = a->out + ((t0 + u) * p->n_heads + (int64_t)kh * G) * hd;
        for (int64_t i = 0; i < (int64_t)G * hd; i++) o[i] = pt_act_round(act, acc[i]);
    }
}

/* Items: (group of tq consecutive tokens, KV head). A group whose tokens'
 * key ranges are far apart (their union more than tq keys past the longest:
 * positions that jump) runs token by token; a score's bits do not depend
 * on the grouping (the kernel table's attn_scores_t / attn_scores_tq). */
static void attn_run(void *arg, long i0, long i1, int ith) {
    attn_ctx *a = arg;
    const int nkv = a->kv->n_kv;
    float *scr = pt_cpu_thread_scratch(a->c, ith);
    for (long it = i0; it < i1; it++) {
        const int64_t t0 = (it / nkv) * a->tq, t1 = t0 + a->tq < a->T ? t0 + a->tq : a->T;
        const int kh = (int)(it % nkv);
        int64_t lo_u = INT64_MAX, hi_u = -1;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t hi = a->pos[t], lo = pt_cpu_keys_lo(a->p, hi);
            if (lo < lo_u) lo_u = lo;
            if (hi > hi_u) hi_u = hi;
        }
        if (hi_u - lo_u + 1 <= a->maxn + a->tq) {
            attn_group(a, t0, t1, kh, lo_u, hi_u, scr);
            continue;
        }
        for (int64_t t = t0; t < t1; t++) attn_group(a, t, t + 1, kh, pt_cpu_keys_lo(a->p, a->pos[t]), a->pos[t], scr);
    }
}

/* A decode step over a long context with fewer KV heads than threads (one
 * attn_group item per KV head would leave threads idle): its three stages
 * as three splits, each item's arithmetic that of attn_group's single item,
 * so the same bits — the scores of pieces of each ring run, SPLIT_KEYS keys
 * from the run's start (whole 16- and 32-key blocks of the kernels, the
 * run's last keys in its last piece, as one call over the run has them);
 * the softmax a row at a time; P·V by blocks of heads (each head's sums are
 * their own chain over the keys, whatever heads share the block). */
#define SPLIT_KEYS 1024
#define SPLIT_MIN_KEYS 2048

typedef struct {
    const attn_ctx *a;
    float *S;  /* [n_kv, G, n] */
    float *qx; /* quantized: [n_kv, G, hd], the query scaled */
    int64_t lo, n, runs[2][3], pieces[2];
    int G, hparts;
} split_ctx;

static void split_scores(void *arg, long i0, long i1, int ith) {
    const split_ctx *x = arg;
    const attn_ctx *a = x->a;
    const int hd = a->p->head_dim, G = x->G;
    const int64_t np = x->pieces[0] + x->pieces[1];
    const float *q = a->kv->bits ? x->qx : a->q;
    float *rows = pt_cpu_thread_scratch(a->c, ith);
    for (long it = i0; it < i1; it++) {
        const int kh = (int)(it / np), r = it % np < x->pieces[0] ? 0 : 1;
        const int64_t j = (it % np - (r ? x->pieces[0] : 0)) * SPLIT_KEYS,
                      len = x->runs[r][2] - j < SPLIT_KEYS ? x->runs[r][2] - j : SPLIT_KEYS;
        run_scores(a, kh, x->S + (size_t)kh * G * x->n + x->runs[r][0] + j, x->n, q + (size_t)kh * G * hd,
                   (int64_t)G * hd, 1, x->runs[r][1] + j, len, rows);
    }
}

static void split_softmax(void *arg, long i0, long i1, int ith) {
    (void)ith;
    const split_ctx *x = arg;
    for (long it = i0; it < i1; it++)
        softmax_one(x->a->c, x->a->p, x->S + (size_t)it * x->n, x->n, x->a->kv->bits ? 1.0f : x->a->p->scale);
}

static void split_pv(void *arg, long i0, long i1, int ith) {
    const split_ctx *x = arg;
    const attn_ctx *a = x->a;
    const int hd = a->p->head_dim, G = x->G;
    const int hb = (G + x->hparts - 1) / x->hparts;
    float *acc = pt_cpu_thread_scratch(a->c, ith), *rows = acc + (size_t)G * hd;
    for (long it = i0; it < i1; it++) {
        const int kh = (int)(it / x->hparts), g0 = (int)(it % x->hparts) * hb, g1 = g0 + hb < G ? g0 + hb : G;
        if (g0 >= G) continue;
        const float *P = x->S + ((size_t)kh * G + g0) * x->n;
        memset(acc, 0, (size_t)(g1 - g0) * hd * sizeof(float));
        for (int r = 0; r < 2; r++)
            if (x->runs[r][2] > 0)
                run_pv(a, kh, acc, P + x->runs[r][0], x->n, g1 - g0, x->runs[r][1], x->runs[r][2], rows);
        float *o = a->out + ((size_t)kh * G + g0) * hd;
        for (int64_t i = 0; i < (int64_t)(g1 - g0) * hd; i++) o[i] = pt_act_round(a->c->base.act, acc[i]);
    }
}

static pt_status attn_split(const attn_ctx *a) {
    pt_cpu *c = a->c;
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    split_ctx x = {.a = a, .lo = pt_cpu_keys_lo(p, a->pos[0]), .G = G};
    x.n = a->pos[0] - x.lo + 1;
    pt_cpu_key_runs(x.runs, x.lo, x.n, kv->capacity);
    for (int r = 0; r < 2; r++) x.pieces[r] = (x.runs[r][2] + SPLIT_KEYS - 1) / SPLIT_KEYS;
    x.hparts = (c->nth + nkv - 1) / nkv < G ? (c->nth + nkv - 1) / nkv : G;
    const size_t shared = (size_t)nkv * G * (size_t)x.n + (kv->bits ? (size_t)nkv * G * hd : 0);
    PT_TRY(pt_cpu_need_scratch(c, (size_t)G * hd + (size_t)PT_CPU_QROWS * hd, shared));
    x.S = c->xbuf;
    if (kv->bits) {
        x.qx = c->xbuf + (size_t)nkv * G * x.n;
        pt_cpu_scale_queries(x.qx, a->q, (int64_t)nkv * G * hd, p->scale, c->base.act);
    }
    pt_pool_for(c->pool, (long)(nkv * (x.pieces[0] + x.pieces[1])), 1, split_scores, &x);
    pt_pool_for(c->pool, (long)nkv * G, 1, split_softmax, &x);
    pt_pool_for(c->pool, (long)nkv * x.hparts, 1, split_pv, &x);
    return PT_OK;
}

pt_status pt_cpu_attention(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                           const pt_kv_layer *kv, const pt_attn *p) {
    pt_cpu *c = pt_cpu_of(be);
    if (kv->bits) PT_TRY(check_qkv(kv, "attention"));
    else if (kv->dtype == PT_FT_F16) return pt_error(PT_ERR_UNSUPPORTED, "attention: f16 KV cache not supported on the CPU");
    if (p->head_dim != kv->head_dim || kv->n_kv <= 0 || p->n_heads % kv->n_kv)
        return pt_error(PT_ERR_INVALID_ARG, "attention: %d heads of dim %d do not fit a cache of %d KV heads of dim %d",
                        p->n_heads, p->head_dim, kv->n_kv, kv->head_dim);
    int64_t maxn = 0, newest = T > 0 ? pos[T - 1] : 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t hi = pos[t], lo = pt_cpu_keys_lo(p, hi);
        if (hi < 0) return pt_error(PT_ERR_RANGE, "attention: negative position %lld", (long long)hi);
        /* the chunk's newest row must not have overwritten the oldest row this query needs */
        if (newest - lo + 1 > kv->capacity)
            return pt_error(PT_ERR_RANGE,
                            "attention: position %lld needs keys from %lld while the cache (capacity %lld) already "
                            "holds position %lld",
                            (long long)hi, (long long)lo, (long long)kv->capacity, (long long)newest);
        if (hi - lo + 1 > maxn) maxn = hi - lo + 1;
    }
    int G = p->n_heads / kv->n_kv;
    if (p->fused_decode && T == 1 && kv->bits) return pt_cpu_attention_fused(c, out, q, pos[0], kv, p);
    const int bfc = !kv->bits && kv->dtype == PT_FT_BF16 && c->base.act == PT_ACT_BF16;
    const int want_dp = bfc && pt_cpu_attn_dp_on(), want_amx = bfc && T > 1 && pt_cpu_attn_amx_on();
    const int bq = (want_dp || want_amx) && bf16_valued(q, T * p->n_heads * p->head_dim);
    attn_ctx a = {c, out, q, T, pos, kv, p, 1, maxn, want_dp && bq, want_amx && bq};
    if (T == 1 && kv->n_kv < c->nth && maxn >= SPLIT_MIN_KEYS) return attn_split(&a);
    /* a prefill chunk's tokens in groups of up to 8 sharing each key row's pass (fewer when their scores would
     * pass 4 MiB a thread) */
    a.tq = 8;
    while (a.tq > 1 && (int64_t)a.tq * G * (maxn + a.tq) > ((int64_t)1 << 20)) a.tq /= 2;
    if (a.tq > T && T > 0) a.tq = (int)T;
    size_t per = (size_t)a.tq * G * (size_t)(maxn + a.tq) + (size_t)G * p->head_dim;
    if (kv->bits) per += (size_t)a.tq * G * p->head_dim + (size_t)PT_CPU_QROWS * p->head_dim;
    if (a.amx) per += (size_t)a.tq * G * p->head_dim; /* attn_group's P·V rows on tiles */
    PT_TRY(pt_cpu_need_scratch(c, per, 0));
    pt_pool_for(c->pool, (long)((T + a.tq - 1) / a.tq * kv->n_kv), 1, attn_run, &a);
    return PT_OK;
}
