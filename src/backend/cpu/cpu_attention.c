/* CPU attention over a KV cache (prefill chunks and decode) and kv_append.
 *
 * Work items are (query token, KV head) pairs split across the pool. One item
 * handles all the query heads that share the KV head (GQA), so each K and V
 * row is read once per token for the whole group: decode reads the cache
 * exactly once. Scores for the group live in per-thread scratch
 * [group, n_keys]; the softmax is exact (two passes: scores, then p·V).
 *
 * Full-precision caches (f32, bf16) only; a quantized cache returns
 * PT_ERR_UNSUPPORTED until its kernels exist. */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

pt_status pt_cpu_kv_append(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                           const int32_t *pos) {
    (void)be;
    if (kv->bits) return pt_error(PT_ERR_UNSUPPORTED, "kv_append: quantized KV cache not implemented on the CPU yet");
    int hd = kv->head_dim;
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
} attn_ctx;

static void attn_run(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const pt_cpu_kernels *k = a->c->k;
    pt_act_dtype act = a->c->base.act;
    int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    int64_t cap = kv->capacity;
    int bf = kv->dtype == PT_FT_BF16;
    long i0, i1;
    pt_split_range(a->T * nkv, ith, nth, &i0, &i1);
    float *scr = pt_cpu_thread_scratch(a->c, ith);
    for (long it = i0; it < i1; it++) {
        int64_t t = it / nkv;
        int kh = (int)(it % nkv);
        int64_t hi = a->pos[t];
        int64_t lo = p->window > 0 && hi - p->window + 1 > 0 ? hi - p->window + 1 : 0;
        int64_t n = hi - lo + 1;
        float *S = scr;                 /* [G, n] */
        float *acc = scr + (size_t)G * n; /* [G, hd] */
        const float *q = a->q + (t * p->n_heads + (int64_t)kh * G) * hd;
        const char *kb = (const char *)kv->k + (size_t)kh * cap * hd * (bf ? 2 : 4);
        const char *vb = (const char *)kv->v + (size_t)kh * cap * hd * (bf ? 2 : 4);
        /* the keys [lo, hi] occupy at most two contiguous runs of slots (the ring wraps once) */
        int64_t s0 = lo % cap, n1 = cap - s0 < n ? cap - s0 : n;
        int64_t runs[2][3] = {{0, s0, n1}, {n1, 0, n - n1}}; /* {index in S, first slot, length} */
        size_t es = bf ? 2 : 4;
        for (int r = 0; r < 2; r++) {
            int64_t j0 = runs[r][0], len = runs[r][2];
            if (len <= 0) continue;
            const char *k0 = kb + (size_t)runs[r][1] * hd * es;
            if (k->attn_scores && k->attn_scores(S + j0, n, q, G, hd, k0, len, bf)) continue;
            for (int64_t j = 0; j < len; j++)
                for (int g = 0; g < G; g++)
                    S[(size_t)g * n + j0 + j] = bf ? k->dot_bf16(q + g * hd, (const uint16_t *)k0 + j * hd, hd)
                                                   : k->dot_f32(q + g * hd, (const float *)k0 + j * hd, hd);
        }
        for (int g = 0; g < G; g++) {
            float *sg = S + (size_t)g * n;
            if (p->softcap <= 0 && k->softmax_row) {
                k->softmax_row(sg, n, p->scale, act == PT_ACT_BF16);
                continue;
            }
            for (int64_t j = 0; j < n; j++) {
                float s = pt_act_round(act, pt_act_round(act, sg[j]) * p->scale);
                if (p->softcap > 0)
                    s = pt_act_round(act, pt_act_round(act, tanhf(pt_act_round(act, s / p->softcap))) * p->softcap);
                sg[j] = s;
            }
            float m = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < n; j++)
                if (sg[j] > m) m = sg[j];
            for (int64_t j = 0; j < n; j++) sum += (sg[j] = expf(sg[j] - m));
            float inv = 1.0f / sum;
            for (int64_t j = 0; j < n; j++) sg[j] = pt_act_round(act, sg[j] * inv);
        }
        memset(acc, 0, (size_t)G * hd * sizeof(float));
        for (int r = 0; r < 2; r++) {
            int64_t j0 = runs[r][0], len = runs[r][2];
            if (len <= 0) continue;
            const char *v0 = vb + (size_t)runs[r][1] * hd * es;
            if (k->attn_pv && k->attn_pv(acc, S + j0, n, G, hd, v0, len, bf)) continue;
            for (int64_t j = 0; j < len; j++)
                for (int g = 0; g < G; g++) {
                    float pj = S[(size_t)g * n + j0 + j];
                    if (bf) k->axpy_bf16(acc + g * hd, pj, (const uint16_t *)v0 + j * hd, hd);
                    else k->axpy_f32(acc + g * hd, pj, (const float *)v0 + j * hd, hd);
                }
        }
        float *o = a->out + (t * p->n_heads + (int64_t)kh * G) * hd;
        for (int64_t i = 0; i < (int64_t)G * hd; i++) o[i] = pt_act_round(act, acc[i]);
    }
}

pt_status pt_cpu_attention(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                           const pt_kv_layer *kv, const pt_attn *p) {
    pt_cpu *c = pt_cpu_of(be);
    if (kv->bits) return pt_error(PT_ERR_UNSUPPORTED, "attention: quantized KV cache not implemented on the CPU yet");
    if (kv->dtype == PT_FT_F16) return pt_error(PT_ERR_UNSUPPORTED, "attention: f16 KV cache not supported on the CPU");
    if (p->head_dim != kv->head_dim || kv->n_kv <= 0 || p->n_heads % kv->n_kv)
        return pt_error(PT_ERR_INVALID_ARG, "attention: %d heads of dim %d do not fit a cache of %d KV heads of dim %d",
                        p->n_heads, p->head_dim, kv->n_kv, kv->head_dim);
    int64_t maxn = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t hi = pos[t];
        int64_t lo = p->window > 0 && hi - p->window + 1 > 0 ? hi - p->window + 1 : 0;
        if (hi < 0) return pt_error(PT_ERR_RANGE, "attention: negative position %lld", (long long)hi);
        if (hi - lo + 1 > kv->capacity)
            return pt_error(PT_ERR_RANGE, "attention: position %lld needs %lld keys but the cache holds %lld",
                            (long long)hi, (long long)(hi - lo + 1), (long long)kv->capacity);
        if (hi - lo + 1 > maxn) maxn = hi - lo + 1;
    }
    int G = p->n_heads / kv->n_kv;
    PT_TRY(pt_cpu_need_scratch(c, (size_t)G * (size_t)(maxn + p->head_dim), 0));
    attn_ctx a = {c, out, q, T, pos, kv, p};
    pt_pool_run(c->pool, attn_run, &a);
    return PT_OK;
}
