/* The --fused-decode-attn CPU kernel (an L3 lever, output-changing): decode
 * attention (one query row) over a QUANTIZED KV cache as flash-decoding with
 * an online softmax, the algorithm of the fused Metal decode kernel petrel's
 * design follows:
 *   phase 1: the keys are cut into blocks of PT_FUSED_BLOCK rows; one work
 *            item per (KV head, block) scores its rows for every query head
 *            of the GQA group (dequantization factored out of the dot
 *            product, as in the exact path), and keeps only the block's
 *            running max m_b, its sum l_b = Σ exp(s - m_b) and its partial
 *            output a_b = Σ exp(s - m_b)·dequant(v) — the score row and the
 *            dequantized cache are never materialized whole;
 *   phase 2: per (KV head, query head) the blocks are merged in block order:
 *            M = max m_b, out = Σ a_b·e^(m_b - M) / Σ l_b·e^(m_b - M).
 * Splitting over key blocks (not only over KV heads) keeps every thread busy
 * at long contexts even when a model has one or two KV heads. The block
 * partition depends only on the context, never on the thread count, and the
 * merge order is fixed, so results stay bit-identical for any -t.
 *
 * What it is not: exact. The exact path (cpu_attention.c) normalizes the
 * probabilities before p·V and rounds them in bf16 mode; this one divides
 * once at the end. The difference is gated by tests/test_l3_gate.c against
 * the frozen L1 snapshot. Prefill chunks (T > 1) and full-precision caches
 * always take the exact path. */
#include "backend/cpu/attn_qkv_fused.h"
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

typedef struct {
    pt_cpu *c;
    float *out;
    const float *q;
    int64_t lo, n, nblk;      /* first key position, key count, blocks */
    const pt_kv_layer *kv;
    const pt_attn *p;
    float *part;              /* [nkv, nblk, G, 2 + hd]: m_b, l_b, a_b */
    int avx512;               /* the block kernel of attn_qkv_fused_avx512.c */
} fused_ctx;

static inline const uint8_t *codes_at(const void *base, const pt_kv_layer *kv, int h, int64_t slot) {
    return (const uint8_t *)((const uint32_t *)base +
                             ((size_t)h * (size_t)kv->capacity + (size_t)slot) * (size_t)(kv->head_dim * kv->bits / 32));
}
static inline const void *param_at(const void *base, const pt_kv_layer *kv, int h, int64_t slot) {
    return (const char *)base + ((size_t)h * (size_t)kv->capacity + (size_t)slot) *
                                    (size_t)(kv->head_dim / kv->group_size) * pt_ftype_size(kv->dtype);
}

/* Per-thread scratch: qx [G, hd] | qs [G, ng] | S [G, BLOCK] | prm [8·ng] | vrow [hd] | the AVX-512
 * block kernel's own. */
static size_t scratch_floats(int G, int hd, int ng) {
    return (size_t)G * hd + (size_t)G * ng + (size_t)G * PT_FUSED_BLOCK + 8 * (size_t)ng + (size_t)hd +
           pt_cpu_fused_block_scratch(G, hd, ng);
}

static void fused_blocks(void *arg, long i0, long i1, int ith) {
    fused_ctx *a = arg;
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const pt_cpu_kernels *k = a->c->k;
    pt_act_dtype act = a->c->base.act;
    const int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv, gs = kv->group_size, bits = kv->bits;
    const int64_t ng = hd / gs, cap = kv->capacity;
    float *qx = pt_cpu_thread_scratch(a->c, ith), *qs = qx + (size_t)G * hd, *S = qs + (size_t)G * ng;
    float *prm = S + (size_t)G * PT_FUSED_BLOCK, *vrow = prm + 8 * ng;
    int prepared = -1; /* the KV head whose scaled query is in qx/qs */
    for (long it = i0; it < i1; it++) {
        int kh = (int)(it / a->nblk);
        int64_t b = it % a->nblk, j0 = b * PT_FUSED_BLOCK;
        int64_t nb = a->n - j0 < PT_FUSED_BLOCK ? a->n - j0 : PT_FUSED_BLOCK;
        const float *q = a->q + (size_t)kh * G * hd;
        if (prepared != kh) { /* mlx-lm: q *= scale first, in the activation dtype */
            for (int g = 0; g < G; g++) {
                for (int i = 0; i < hd; i++) vrow[i] = pt_act_round(act, q[g * hd + i] * p->scale);
                for (int64_t gb = 0; gb < ng; gb++) {
                    float sum = 0.0f;
                    for (int i = (int)gb * gs; i < (int)(gb + 1) * gs; i++) sum += vrow[i];
                    qs[(size_t)g * ng + gb] = sum;
                }
                if (bits == 4) pt_cpu_permute_x4(qx + (size_t)g * hd, vrow, hd);
                else memcpy(qx + (size_t)g * hd, vrow, (size_t)hd * sizeof(float));
            }
            prepared = kh;
        }
        float *part = a->part + ((size_t)kh * a->nblk + (size_t)b) * G * (2 + hd);
        if (a->avx512 && pt_cpu_fused_block_avx512(part, qx, qs, G, kv, kh, a->lo + j0, (int)nb, p->softcap,
                                                   act == PT_ACT_BF16, vrow + hd))
            continue;
        /* scores of the block, 4 keys at a time */
        for (int64_t r0 = 0; r0 < nb; r0 += 4) {
            int nr = (int)(nb - r0 < 4 ? nb - r0 : 4);
            const uint8_t *codes[4];
            const float *sc[4], *bi[4];
            for (int r = 0; r < 4; r++) {
                int64_t slot = (a->lo + j0 + r0 + (r < nr ? r : nr - 1)) % cap;
                codes[r] = codes_at(kv->k, kv, kh, slot);
                float *s_ = prm + (size_t)r * 2 * ng, *b_ = s_ + ng;
                pt_ft_load_row(kv->dtype, param_at(kv->k_scales, kv, kh, slot), s_, ng);
                pt_ft_load_row(kv->dtype, param_at(kv->k_biases, kv, kh, slot), b_, ng);
                sc[r] = s_;
                bi[r] = b_;
            }
            for (int g = 0; g < G; g++) {
                float o4[4];
                const float *xg = qx + (size_t)g * hd, *xsg = qs + (size_t)g * ng;
                if (bits == 4) k->qdot4_x4(o4, xg, xsg, codes, sc, bi, hd, gs);
                else if (bits == 8) k->qdot8_x4(o4, xg, xsg, codes, sc, bi, hd, gs);
                else
                    for (int r = 0; r < nr; r++) { /* other widths: unpack, then the same factored form */
                        pt_cpu_unpack_codes(codes[r], bits, 0, hd, vrow);
                        float v = 0.0f;
                        for (int64_t gb = 0; gb < ng; gb++)
                            v += sc[r][gb] * k->dot_f32(xg + gb * gs, vrow + gb * gs, gs) + bi[r][gb] * xsg[gb];
                        o4[r] = v;
                    }
                for (int r = 0; r < nr; r++) {
                    float s = pt_act_round(act, o4[r]);
                    if (p->softcap > 0)
                        s = pt_act_round(act, pt_act_round(act, tanhf(pt_act_round(act, s / p->softcap))) * p->softcap);
                    S[(size_t)g * PT_FUSED_BLOCK + r0 + r] = s;
                }
            }
        }
        /* block max, exp and sum per query head */
        for (int g = 0; g < G; g++) {
            float *sg = S + (size_t)g * PT_FUSED_BLOCK, m = -INFINITY, l = 0.0f;
            for (int64_t j = 0; j < nb; j++)
                if (sg[j] > m) m = sg[j];
            for (int64_t j = 0; j < nb; j++) l += (sg[j] = expf(sg[j] - m));
            float *pg = part + (size_t)g * (2 + hd);
            pg[0] = m;
            pg[1] = l;
            memset(pg + 2, 0, (size_t)hd * sizeof(float));
        }
        /* partial outputs: each value row dequantized once for the group */
        for (int64_t j = 0; j < nb; j++) {
            int64_t slot = (a->lo + j0 + j) % cap;
            pt_cpu_unpack_codes(codes_at(kv->v, kv, kh, slot), bits, 0, hd, vrow);
            pt_ft_load_row(kv->dtype, param_at(kv->v_scales, kv, kh, slot), prm, ng);
            pt_ft_load_row(kv->dtype, param_at(kv->v_biases, kv, kh, slot), prm + ng, ng);
            for (int64_t gb = 0; gb < ng; gb++)
                for (int i = (int)gb * gs; i < (int)(gb + 1) * gs; i++) vrow[i] = prm[gb] * vrow[i] + prm[ng + gb];
            for (int g = 0; g < G; g++)
                k->axpy_f32(part + (size_t)g * (2 + hd) + 2, S[(size_t)g * PT_FUSED_BLOCK + j], vrow, hd);
        }
    }
}

static void fused_merge(void *arg, long i0, long i1, int ith) {
    (void)ith;
    fused_ctx *a = arg;
    const pt_attn *p = a->p;
    pt_act_dtype act = a->c->base.act;
    const int nkv = a->kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    for (long it = i0; it < i1; it++) {
        int kh = (int)(it / G), g = (int)(it % G);
        const size_t stride = (size_t)G * (2 + hd);
        const float *p0 = a->part + (size_t)kh * a->nblk * stride + (size_t)g * (2 + hd);
        float M = -INFINITY;
        for (int64_t b = 0; b < a->nblk; b++)
            if (p0[b * stride] > M) M = p0[b * stride];
        float *o = a->out + ((size_t)kh * G + g) * hd;
        float denom = 0.0f;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int64_t b = 0; b < a->nblk; b++) { /* fixed order: deterministic */
            const float *pb = p0 + b * stride;
            float w = expf(pb[0] - M);
            denom += pb[1] * w;
            for (int i = 0; i < hd; i++) o[i] += w * pb[2 + i];
        }
        float inv = 1.0f / denom;
        for (int i = 0; i < hd; i++) o[i] = pt_act_round(act, o[i] * inv);
    }
}

pt_status pt_cpu_attention_fused(pt_cpu *c, float *out, const float *q, int64_t pos, const pt_kv_layer *kv,
                                 const pt_attn *p) {
    const int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv, ng = hd / kv->group_size;
    int64_t lo = pt_cpu_keys_lo(p, pos);
    int64_t n = pos - lo + 1, nblk = (n + PT_FUSED_BLOCK - 1) / PT_FUSED_BLOCK;
    PT_TRY(pt_cpu_need_scratch(c, scratch_floats(G, hd, ng), (size_t)nkv * (size_t)nblk * G * (2 + (size_t)hd)));
    fused_ctx a = {c, out, q, lo, n, nblk, kv, p, c->xbuf, c->k == &pt_cpu_kernels_avx512};
    pt_pool_for(c->pool, (long)nkv * nblk, 1, fused_blocks, &a);
    pt_pool_for(c->pool, (long)nkv * G, 1, fused_merge, &a);
    return PT_OK;
}
