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
 * What it is not: exact. The exact path (cpu_attention.c) normalizes the
 * probabilities before p·V and rounds them in bf16 mode; this one divides
 * once at the end. The difference is gated by tests/test_l3_gate.c against
 * the frozen L1 snapshot. Prefill chunks (T > 1) and full-precision caches
 * always take the exact path. */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

#define FUSED_BLOCK 128

typedef struct {
    pt_cpu *c;
    float *out;
    const float *q;
    int64_t lo, n, nblk;      /* first key position, key count, blocks */
    const pt_kv_layer *kv;
    const pt_attn *p;
    float *part;              /* [nkv, nblk]: a_b [G, hd], then m_b, l_b [G, 2] */
} fused_ctx;

/* Per-thread scratch: qx [G, hd] | S [G, BLOCK] | rows [PT_CPU_QROWS, hd] */
static size_t scratch_floats(int G, int hd) {
    return (size_t)G * hd + (size_t)G * FUSED_BLOCK + (size_t)PT_CPU_QROWS * hd;
}

static void fused_blocks(void *arg, long i0, long i1, int ith) {
    fused_ctx *a = arg;
    const pt_kv_layer *kv = a->kv;
    const pt_attn *p = a->p;
    const pt_cpu_kernels *k = a->c->k;
    pt_act_dtype act = a->c->base.act;
    const int nkv = kv->n_kv, hd = p->head_dim, G = p->n_heads / nkv;
    float *qx = pt_cpu_thread_scratch(a->c, ith), *S = qx + (size_t)G * hd, *rows = S + (size_t)G * FUSED_BLOCK;
    int prepared = -1; /* the KV head whose scaled query is in qx */
    for (long it = i0; it < i1; it++) {
        const int kh = (int)(it / a->nblk);
        const int64_t b = it % a->nblk, j0 = b * FUSED_BLOCK;
        int64_t nb = a->n - j0 < FUSED_BLOCK ? a->n - j0 : FUSED_BLOCK;
        if (prepared != kh) {
            pt_cpu_scale_queries(qx, a->q + (size_t)kh * G * hd, (int64_t)G * hd, p->scale, act);
            prepared = kh;
        }
        float *part = a->part + ((size_t)kh * a->nblk + (size_t)b) * G * (2 + hd), *st = part + (size_t)G * hd;
        /* the block's keys and values as at most two runs of the ring */
        int64_t runs[2][3];
        pt_cpu_key_runs(runs, a->lo + j0, nb, kv->capacity);
        for (int r = 0; r < 2; r++)
            if (runs[r][2] > 0) {
                const pt_cpu_qrows kr = pt_cpu_kv_qrows(kv, 0, kh, runs[r][1]);
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
        for (int r = 0; r < 2; r++)
            if (runs[r][2] > 0) {
                const pt_cpu_qrows vr = pt_cpu_kv_qrows(kv, 1, kh, runs[r][1]);
                pt_cpu_qpv(k, part, S + runs[r][0], FUSED_BLOCK, G, &vr, runs[r][2], rows);
            }
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
