/* CPU attention over a KV cache (prefill chunks and decode) and kv_append.
 *
 * Work items are (query token, KV head) pairs split across the pool. One item
 * handles all the query heads that share the KV head (GQA), so each K and V
 * row is read once per token for the whole group: decode reads the cache
 * exactly once. Scores for the group live in per-thread scratch
 * [group, n_keys]; the softmax is exact (two passes: scores, then p·V).
 *
 * Quantized caches (MLX affine codes per token and head, DESIGN.md
 * "Quantized KV, exactly") are written with the MLX quantizer of
 * src/format/mlx_quant.h; attention over them scores 4 keys at a time with
 * the quantized matvec kernels (the factored form scale·Σq·x + bias·Σx, the
 * pre-scaled query playing x) and dequantizes each value row once for the
 * whole GQA group. With the AVX-512 kernels an item runs
 * pt_cpu_qattn_item_avx512 instead (attn_qkv_fused_avx512.c): the same
 * scores, rounding and two-pass softmax, with each key/value row's codes
 * widened once for the whole group and p·V computed as
 * Σ_j (p_j·scale_jb)·q_j + Σ_j p_j·bias_jb — the same sums in another
 * order. */
#include "backend/cpu/attn_qkv_fused.h"
#include "backend/cpu/cpu_internal.h"

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

typedef struct {
    pt_cpu *c;
    float *out;
    const float *q;
    int64_t T;
    const int32_t *pos;
    const pt_kv_layer *kv;
    const pt_attn *p;
    int avx512; /* quantized items through pt_cpu_qattn_item_avx512 */
    int tq;      /* full-precision cache: tokens per item (attn_group) */
    int64_t maxn; /* the most keys one token attends to */
} attn_ctx;

/* The slots of keys [lo, lo + n) of a ring of cap rows: at most two
 * contiguous runs (the ring wraps once), {index in the range, first slot,
 * length}. */
static inline void key_runs(int64_t runs[2][3], int64_t lo, int64_t n, int64_t cap) {
    int64_t s0 = lo % cap, n1 = cap - s0 < n ? cap - s0 : n;
    runs[0][0] = 0, runs[0][1] = s0, runs[0][2] = n1;
    runs[1][0] = n1, runs[1][1] = 0, runs[1][2] = n - n1;
}

/* Tokens [t0, t1) and KV head kh over a full-precision cache: the scores of
 * every query head of the tokens against the keys any of them attends to,
 * [lo_u, hi_u], in one pass over those keys (each key row read once for
 * all the tokens' heads), then per token its own keys' softmax and P·V.
 * Scratch: S [nt·G, n_u], acc [G, hd]. */
static void attn_group(const attn_ctx *a, int64_t t0, int64_t t1, int kh, int64_t lo_u, int64_t hi_u, float *scr) {
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const pt_cpu_kernels *k = a->c->k;
    pt_act_dtype act = a->c->base.act;
    const int hd = p->head_dim, G = p->n_heads / kv->n_kv, nt = (int)(t1 - t0);
    const int64_t cap = kv->capacity, n = hi_u - lo_u + 1, qs = (int64_t)p->n_heads * hd;
    const int bf = kv->dtype == PT_FT_BF16;
    const size_t es = bf ? 2 : 4;
    float *S = scr;                          /* [nt·G, n] */
    float *acc = scr + (size_t)nt * G * n; /* [G, hd] */
    const float *q = a->q + (t0 * p->n_heads + (int64_t)kh * G) * hd;
    const char *kb = (const char *)kv->k + (size_t)kh * cap * hd * es;
    const char *vb = (const char *)kv->v + (size_t)kh * cap * hd * es;
    /* the kernel of many rows: a prefill call's, or a decode step's with at least 4 query heads per KV head
     * (kernels_avx512.c: below that a step's rows are too few to pay for the key block's transposition) */
    const int many = a->T > 1 || G >= 4;
    int64_t runs[2][3];
    key_runs(runs, lo_u, n, cap);
    for (int r = 0; r < 2; r++) {
        int64_t j0 = runs[r][0], len = runs[r][2];
        if (len <= 0) continue;
        const char *k0 = kb + (size_t)runs[r][1] * hd * es;
        if (many ? k->attn_scores_t && k->attn_scores_t(S + j0, n, q, qs, nt, G, hd, k0, len, bf)
                 : k->attn_scores && k->attn_scores(S + j0, n, q, G, hd, k0, len, bf))
            continue;
        for (int u = 0; u < nt; u++)
            for (int64_t j = 0; j < len; j++)
                for (int g = 0; g < G; g++) {
                    const float *qg = q + u * qs + g * hd;
                    S[(size_t)(u * G + g) * n + j0 + j] = bf ? k->dot_bf16(qg, (const uint16_t *)k0 + j * hd, hd)
                                                             : k->dot_f32(qg, (const float *)k0 + j * hd, hd);
                }
    }
    for (int u = 0; u < nt; u++) {
        const int64_t hi = a->pos[t0 + u], lo = pt_cpu_keys_lo(p, hi), nu = hi - lo + 1, off = lo - lo_u;
        float *Su = S + (size_t)u * G * n + off; /* the token's rows: [G] × its nu keys, n apart */
        for (int g = 0; g < G; g++) {
            float *sg = Su + (size_t)g * n;
            if (p->softcap <= 0 && k->softmax_row) {
                k->softmax_row(sg, nu, p->scale, act == PT_ACT_BF16);
                continue;
            }
            for (int64_t j = 0; j < nu; j++) {
                float s = pt_act_round(act, pt_act_round(act, sg[j]) * p->scale);
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
        memset(acc, 0, (size_t)G * hd * sizeof(float));
        int64_t ru[2][3];
        key_runs(ru, lo, nu, cap);
        for (int r = 0; r < 2; r++) {
            int64_t j0 = ru[r][0], len = ru[r][2];
            if (len <= 0) continue;
            const char *v0 = vb + (size_t)ru[r][1] * hd * es;
            if (k->attn_pv && k->attn_pv(acc, Su + j0, n, G, hd, v0, len, bf)) continue;
            for (int64_t j = 0; j < len; j++)
                for (int g = 0; g < G; g++) {
                    float pj = Su[(size_t)g * n + j0 + j];
                    if (bf) k->axpy_bf16(acc + g * hd, pj, (const uint16_t *)v0 + j * hd, hd);
                    else k->axpy_f32(acc + g * hd, pj, (const float *)v0 + j * hd, hd);
                }
        }
        float *o = a->out + ((t0 + u) * p->n_heads + (int64_t)kh * G) * hd;
        for (int64_t i = 0; i < (int64_t)G * hd; i++) o[i] = pt_act_round(act, acc[i]);
    }
}

/* Items: (group of tq consecutive tokens, KV head). A group whose tokens'
 * key ranges are far apart (their union more than tq keys past the longest:
 * positions that jump) runs token by token; a score's bits do not depend
 * on the grouping (the kernel table's attn_scores_t). */
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

/* Quantized cache: per (token, KV head) item. Scratch per thread:
 * S [G, n] | qx [G, hd] (pre-scaled query, permuted for 4-bit) | qs [G, ng]
 * (its group sums) | acc [G, hd] | sc/bi [4 rows × 2 × ng] | vrow [hd] |
 * the AVX-512 item kernel's (pt_cpu_fused_block_scratch). */
static void attn_run_q(void *arg, long i0, long i1, int ith) {
    attn_ctx *a = arg;
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const pt_cpu_kernels *k = a->c->k;
    pt_act_dtype act = a->c->base.act;
    int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv, gs = kv->group_size, bits = kv->bits;
    int64_t ng = hd / gs, cap = kv->capacity;
    int fast = bits == 4 || bits == 8;
    float *scr = pt_cpu_thread_scratch(a->c, ith);
    for (long it = i0; it < i1; it++) {
        int64_t t = it / nkv;
        int kh = (int)(it % nkv);
        int64_t hi = a->pos[t], lo = pt_cpu_keys_lo(p, hi);
        int64_t n = hi - lo + 1;
        float *S = scr, *qx = S + (size_t)G * n, *qs = qx + (size_t)G * hd, *acc = qs + (size_t)G * ng;
        float *prm = acc + (size_t)G * hd, *vrow = prm + 8 * ng;
        const float *q = a->q + (t * p->n_heads + (int64_t)kh * G) * hd;
        for (int g = 0; g < G; g++) { /* mlx-lm: q *= scale first, in the activation dtype */
            float *xg = qx + (size_t)g * hd;
            for (int i = 0; i < hd; i++) vrow[i] = pt_act_round(act, q[g * hd + i] * p->scale);
            for (int64_t b = 0; b < ng; b++) {
                float sum = 0.0f;
                for (int i = (int)b * gs; i < (int)(b + 1) * gs; i++) sum += vrow[i];
                qs[(size_t)g * ng + b] = sum;
            }
            if (bits == 4) pt_cpu_permute_x4(xg, vrow, hd);
            else memcpy(xg, vrow, (size_t)hd * sizeof(float));
        }
        float *o = a->out + (t * p->n_heads + (int64_t)kh * G) * hd;
        if (a->avx512 && pt_cpu_qattn_item_avx512(acc, qx, qs, G, kv, kh, lo, n, p->softcap, act == PT_ACT_BF16,
                                                  k->softmax_row, S, vrow + hd)) {
            for (int64_t i = 0; i < (int64_t)G * hd; i++) o[i] = pt_act_round(act, acc[i]);
            continue;
        }
        for (int64_t j0 = 0; j0 < n; j0 += 4) {
            int nr = (int)(n - j0 < 4 ? n - j0 : 4);
            const uint8_t *codes[4];
            const float *sc[4], *bi[4];
            for (int r = 0; r < 4; r++) {
                int64_t slot = (lo + j0 + (r < nr ? r : nr - 1)) % cap;
                codes[r] = (const uint8_t *)qkv_codes(kv->k, kv, kh, slot);
                float *s_ = prm + (size_t)r * 2 * ng, *b_ = s_ + ng;
                pt_ft_load_row(kv->dtype, qkv_param(kv->k_scales, kv, kh, slot), s_, ng);
                pt_ft_load_row(kv->dtype, qkv_param(kv->k_biases, kv, kh, slot), b_, ng);
                sc[r] = s_;
                bi[r] = b_;
            }
            for (int g = 0; g < G; g++) {
                float o4[4];
                const float *xg = qx + (size_t)g * hd, *xsg = qs + (size_t)g * ng;
                if (fast && bits == 4) k->qdot4_x4(o4, xg, xsg, codes, sc, bi, hd, gs);
                else if (fast) k->qdot8_x4(o4, xg, xsg, codes, sc, bi, hd, gs);
                else
                    for (int r = 0; r < nr; r++) { /* other widths: unpack, then the same factored form */
                        pt_cpu_unpack_codes(codes[r], bits, 0, hd, vrow);
                        float v = 0.0f;
                        for (int64_t b = 0; b < ng; b++)
                            v += sc[r][b] * k->dot_f32(xg + b * gs, vrow + b * gs, gs) + bi[r][b] * xsg[b];
                        o4[r] = v;
                    }
                for (int r = 0; r < nr; r++) S[(size_t)g * n + j0 + r] = pt_act_round(act, o4[r]);
            }
        }
        for (int g = 0; g < G; g++) {
            float *sg = S + (size_t)g * n;
            if (p->softcap > 0)
                for (int64_t j = 0; j < n; j++)
                    sg[j] = pt_act_round(act, pt_act_round(act, tanhf(pt_act_round(act, sg[j] / p->softcap))) * p->softcap);
            if (k->softmax_row) {
                k->softmax_row(sg, n, 1.0f, act == PT_ACT_BF16);
                continue;
            }
            float m = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < n; j++)
                if (sg[j] > m) m = sg[j];
            for (int64_t j = 0; j < n; j++) sum += (sg[j] = expf(sg[j] - m));
            for (int64_t j = 0; j < n; j++) sg[j] = pt_act_round(act, sg[j] / sum);
        }
        memset(acc, 0, (size_t)G * hd * sizeof(float));
        for (int64_t j = 0; j < n; j++) { /* each value row dequantized once for the group */
            int64_t slot = (lo + j) % cap;
            pt_cpu_unpack_codes((const uint8_t *)qkv_codes(kv->v, kv, kh, slot), bits, 0, hd, vrow);
            pt_ft_load_row(kv->dtype, qkv_param(kv->v_scales, kv, kh, slot), prm, ng);
            pt_ft_load_row(kv->dtype, qkv_param(kv->v_biases, kv, kh, slot), prm + ng, ng);
            for (int64_t b = 0; b < ng; b++)
                for (int i = (int)b * gs; i < (int)(b + 1) * gs; i++) vrow[i] = prm[b] * vrow[i] + prm[ng + b];
            for (int g = 0; g < G; g++) k->axpy_f32(acc + (size_t)g * hd, S[(size_t)g * n + j], vrow, hd);
        }
        for (int64_t i = 0; i < (int64_t)G * hd; i++) o[i] = pt_act_round(act, acc[i]);
    }
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
    attn_ctx a = {c, out, q, T, pos, kv, p, c->k == &pt_cpu_kernels_avx512, 1, maxn};
    if (kv->bits) {
        size_t ng = (size_t)(p->head_dim / kv->group_size);
        PT_TRY(pt_cpu_need_scratch(c, (size_t)G * (size_t)(maxn + 2 * p->head_dim) + (size_t)G * ng + 8 * ng +
                                          (size_t)p->head_dim + pt_cpu_fused_block_scratch(G, p->head_dim, (int)ng),
                                   0));
        pt_pool_for(c->pool, (long)(T * kv->n_kv), 1, attn_run_q, &a);
        return PT_OK;
    }
    /* a prefill chunk's tokens in groups of up to 8 sharing each key row's pass (fewer when their scores would
     * pass 4 MiB a thread) */
    a.tq = 8;
    while (a.tq > 1 && (int64_t)a.tq * G * (maxn + a.tq) > ((int64_t)1 << 20)) a.tq /= 2;
    if (a.tq > T && T > 0) a.tq = (int)T;
    PT_TRY(pt_cpu_need_scratch(c, (size_t)a.tq * G * (size_t)(maxn + a.tq) + (size_t)G * p->head_dim, 0));
    pt_pool_for(c->pool, (long)((T + a.tq - 1) / a.tq * kv->n_kv), 1, attn_run, &a);
    return PT_OK;
}
