/* The --fused-decode-attn CPU kernel (an L3 lever, output-changing): decode
 * attention (one query row) over a QUANTIZED KV cache as flash-decoding with
 * an online softmax, the algorithm of the fused Metal decode kernel petrel's
 * design follows:
 *   phase 1: the keys are cut into blocks of FUSED_BLOCK rows; one work item
 *            per (KV head, block) scores its rows for every query head of
 *            the GQA group (the exact path's kernels: pt_cpu_qscores, keys
 *            dequantized as they are read), and keeps only the block's
 *            running max m_b, its sum l_b = Σ exp(s - m_b) and its partial
 *            output a_b = Σ exp(s - m_b)·dequant(v) (pt_cpu_qpv) — the score
 *            row and the dequantized cache are never materialized whole;
 *   phase 2: per (KV head, query head) the blocks are merged in block order:
 *            M = max m_b, out = Σ a_b·e^(m_b - M) / Σ l_b·e^(m_b - M).
 * Splitting over key blocks (not only over KV heads) keeps every thread busy
 * at long contexts even when a model has one or two KV heads. The block
 * partition depends only on the context, never on the thread count, and the
 * merge order is fixed, so results stay bit-identical for any -t.
 *
 * In bf16 mode over a cache of bf16 scales and biases, where the CPU's
 * vdpbf16ps issues at the FMA rate (pt_cpu_attn_dp_on), the products are
 * the kernel table's fused_scores_dp / fused_pv_dp: the dequantization
 * factored out of them (scale·Σ q·code + bias·Σ q; Σ (p·scale)·code +
 * Σ p·bias), two codes a product pair, read as stored — the arithmetic of
 * the CUDA fused kernel, with p·scale rounded to bf16. Elsewhere each block
 * runs the exact path's kernels (keys and values dequantized as read).
 *
 * What it is not: exact. The exact path (cpu_attention.c) normalizes the
 * probabilities before p·V and rounds them in bf16 mode; this one divides
 * once at the end. The difference is gated by tests/test_l3_gate.c against
 * the frozen L1 snapshot. Prefill chunks (T > 1) and full-precision caches
 * always take the exact path. */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"
#include "base/half.h"

#include <stdatomic.h>

#include <math.h>
#include <string.h>

#define FUSED_BLOCK PT_CPU_FUSED_BLOCK

typedef struct {
    pt_cpu *c;
    float *out;
    const float *q;
    int64_t lo, n, nblk;      /* first key position, key count, blocks */
    const pt_kv_layer *kv;
    const pt_attn *p;
    float *part;              /* [nkv, nblk]: a_b [G, hd], then m_b, l_b [G, 2] */
} fused_ctx;

/* Per-thread scratch: qx [G, hd] | S [G, BLOCK] | rows [PT_CPU_QROWS, hd] |
 * the factored kernels' query pairs [G, hd·bits/8 <= hd] and group sums
 * [G, 16] */
static size_t scratch_floats(int G, int hd) {
    return (size_t)G * hd + (size_t)G * FUSED_BLOCK + (size_t)PT_CPU_QROWS * hd + (size_t)G * hd + (size_t)G * 16;
}

void pt_cpu_fq_prep(uint32_t *qp, float *qs, const float *q, int G, int hd, int bits, int gs) {
    const int np = hd * bits / 8, nw = hd * bits / 32, ng = hd / gs;
    for (int g = 0; g < G; g++) {
        const float *x = q + (size_t)g * hd;
        for (int w = 0; w < nw; w++)
            for (int i = 0; i < 4; i++) {
                float a, b;
                if (bits == 4) a = x[8 * w + i], b = x[8 * w + i + 4];
                else {
                    const float f = i & 1 ? 16.0f : 1.0f;
                    a = f * x[4 * w + i / 2], b = f * x[4 * w + 2 + i / 2];
                }
                qp[(size_t)g * np + 4 * w + i] = (uint32_t)pt_f32_to_bf16(a) | (uint32_t)pt_f32_to_bf16(b) << 16;
            }
        pt_cpu_group_sums_ref(qs + (size_t)g * ng, x, hd, gs);
    }
}

/* The cache rows of a block of keys [j0, j0 + nb) of KV head kh (codes,
 * scales and biases of the K or V side, each ring run) on their way into
 * the caches: the value rows while the block scores, the next block's key
 * rows while it runs P·V, so the block's two short streams do not each
 * wait for the hardware prefetcher to find them. */
static void prefetch_block(const fused_ctx *a, int v, int kh, int64_t j0, int64_t nb) {
    int64_t runs[2][3];
    pt_cpu_key_runs(runs, a->lo + j0, nb, a->kv->capacity);
    for (int r = 0; r < 2; r++)
        if (runs[r][2] > 0) {
            const pt_cpu_qrows rows = pt_cpu_kv_qrows(a->kv, v, kh, runs[r][1]);
            pt_cpu_qrows_prefetch(&rows, 0, runs[r][2]);
        }
}

static void fused_blocks(void *arg, long i0, long i1, int ith) {
    fused_ctx *a = arg;
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const pt_cpu_kernels *k = a->c->k;
    pt_act_dtype act = a->c->base.act;
    const int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    float *qx = pt_cpu_thread_scratch(a->c, ith), *S = qx + (size_t)G * hd, *rows = S + (size_t)G * FUSED_BLOCK;
    uint32_t *qp = (uint32_t *)(rows + (size_t)PT_CPU_QROWS * hd);
    float *qs = (float *)(qp + (size_t)G * hd);
    /* the factored vdpbf16ps products (their query operands: bf16 values, as qx holds in bf16 mode) for
     * the shapes they take (at most 16 groups a row: the scratch's group sums) */
    const int fq = act == PT_ACT_BF16 && kv->dtype == PT_FT_BF16 && pt_cpu_attn_dp_on() && k->fused_scores_dp &&
                   k->fused_pv_dp && (kv->bits == 4 || kv->bits == 8) && hd % 32 == 0 && hd <= 512 &&
                   kv->group_size % 32 == 0;
    int prepared = -1; /* the KV head whose scaled query is in qx */
    for (long it = i0; it < i1; it++) {
        const int kh = (int)(it / a->nblk);
        const int64_t b = it % a->nblk, j0 = b * FUSED_BLOCK;
        int64_t nb = a->n - j0 < FUSED_BLOCK ? a->n - j0 : FUSED_BLOCK;
        if (prepared != kh) {
            pt_cpu_scale_queries(qx, a->q + (size_t)kh * G * hd, (int64_t)G * hd, p->scale, act);
            if (fq) pt_cpu_fq_prep(qp, qs, qx, G, hd, kv->bits, kv->group_size);
            prepared = kh;
        }
        int dp = fq;
        float *part = a->part + ((size_t)kh * a->nblk + (size_t)b) * G * (2 + hd), *st = part + (size_t)G * hd;
        /* the block's keys and values as at most two runs of the ring */
        int64_t runs[2][3];
        pt_cpu_key_runs(runs, a->lo + j0, nb, kv->capacity);
        if (dp) prefetch_block(a, 1, kh, j0, nb);
        for (int r = 0; r < 2; r++)
            if (runs[r][2] > 0) {
                const pt_cpu_qrows kr = pt_cpu_kv_qrows(kv, 0, kh, runs[r][1]);
                if (!(dp = dp && k->fused_scores_dp(S + runs[r][0], FUSED_BLOCK, qp, qs, G, &kr, runs[r][2])))
                    pt_cpu_qscores(k, S + runs[r][0], FUSED_BLOCK, qx, hd, 1, G, &kr, runs[r][2], rows);
            }
        for (int g = 0; g < G; g++) {
            float *sg = S + (size_t)g * FUSED_BLOCK;
            if (p->softcap > 0)
                for (int64_t j = 0; j < nb; j++)
                    sg[j] = pt_act_round(
                        act, pt_act_round(act, tanhf(pt_act_round(act, pt_act_round(act, sg[j]) / p->softcap))) *
                                 p->softcap);
            if (k->softmax_part) {
                k->softmax_part(sg, nb, act == PT_ACT_BF16, st + 2 * g, st + 2 * g + 1);
                continue;
            }
            float m = -INFINITY, l = 0.0f;
            for (int64_t j = 0; j < nb; j++)
                if ((sg[j] = pt_act_round(act, sg[j])) > m) m = sg[j];
            for (int64_t j = 0; j < nb; j++) l += (sg[j] = expf(sg[j] - m));
            st[2 * g] = m, st[2 * g + 1] = l;
        }
        memset(part, 0, (size_t)G * hd * sizeof(float));
        if (dp && it + 1 < i1) { /* the next item's keys */
            const int64_t j1 = (it + 1) % a->nblk * FUSED_BLOCK;
            prefetch_block(a, 0, (int)((it + 1) / a->nblk), j1, a->n - j1 < FUSED_BLOCK ? a->n - j1 : FUSED_BLOCK);
        }
        for (int r = 0; r < 2; r++)
            if (runs[r][2] > 0) {
                const pt_cpu_qrows vr = pt_cpu_kv_qrows(kv, 1, kh, runs[r][1]);
                if (!(dp && k->fused_pv_dp(part, S + runs[r][0], FUSED_BLOCK, G, &vr, runs[r][2])))
                    pt_cpu_qpv(k, part, S + runs[r][0], FUSED_BLOCK, G, &vr, runs[r][2], rows);
            }
        if (dp) atomic_fetch_add_explicit(&pt_cpu_path_count[PT_CPU_PATH_FUSED_DP], 1, memory_order_relaxed);
    }
}

static void fused_merge(void *arg, long i0, long i1, int ith) {
    (void)ith;
    fused_ctx *a = arg;
    const pt_attn *p = a->p;
    pt_act_dtype act = a->c->base.act;
    const int nkv = a->kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    const size_t stride = (size_t)G * (2 + hd);
    for (long it = i0; it < i1; it++) {
        int kh = (int)(it / G), g = (int)(it % G);
        const float *p0 = a->part + (size_t)kh * a->nblk * stride;
        const float *a0 = p0 + (size_t)g * hd, *s0 = p0 + (size_t)G * hd + 2 * g;
        float M = -INFINITY;
        for (int64_t b = 0; b < a->nblk; b++)
            if (s0[b * stride] > M) M = s0[b * stride];
        float *o = a->out + ((size_t)kh * G + g) * hd;
        float denom = 0.0f;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int64_t b = 0; b < a->nblk; b++) { /* fixed order: deterministic */
            const float w = expf(s0[b * stride] - M);
            denom += s0[b * stride + 1] * w;
            for (int i = 0; i < hd; i++) o[i] += w * a0[b * stride + i];
        }
        float inv = 1.0f / denom;
        for (int i = 0; i < hd; i++) o[i] = pt_act_round(act, o[i] * inv);
    }
}

pt_status pt_cpu_attention_fused(pt_cpu *c, float *out, const float *q, int64_t pos, const pt_kv_layer *kv,
                                 const pt_attn *p) {
    const int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    int64_t lo = pt_cpu_keys_lo(p, pos);
    int64_t n = pos - lo + 1, nblk = (n + FUSED_BLOCK - 1) / FUSED_BLOCK;
    PT_TRY(pt_cpu_need_scratch(c, scratch_floats(G, hd), (size_t)nkv * (size_t)nblk * G * (2 + (size_t)hd)));
    fused_ctx a = {c, out, q, lo, n, nblk, kv, p, c->xbuf};
    pt_pool_for(c->pool, (long)nkv * nblk, 1, fused_blocks, &a);
    pt_pool_for(c->pool, (long)nkv * G, 1, fused_merge, &a);
    return PT_OK;
}
