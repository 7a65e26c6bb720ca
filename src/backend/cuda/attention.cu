/* kv_append and attention (backend.h) over full-precision KV caches (f32,
 * bf16, f16 storage), head-major [n_kv, capacity, head_dim], slot = pos %
 * capacity: one kernel serves prefill chunks (T > 1) and decode (T == 1),
 * causal, sliding window, soft-cap, GQA.
 *
 * One block per (query token, query head); its 4 warps take keys in turn,
 * the lanes split head_dim. The softmax is the reference's, not an online
 * approximation of it: pass 1 finds the row max and the sum of exp (scores
 * rounded like the CPU: dot, ·scale, soft-cap, each rounded in bf16 mode);
 * pass 2 recomputes each score, forms p = round(exp(s - max) / sum) and
 * accumulates p·v in f32. The warps' partial results are merged in a fixed
 * order, so the output is deterministic.
 *
 * Decode (T == 1) runs the split kernels (two generations: the first
 * below; the second, dec2_*, by default, in attention_dec2.cu;
 * PETREL_CUDA_ATTN_V2=0 for the first).
 *
 * Quantized KV caches (L2) are kv_quant.cu's: kv_append and attention
 * hand them over. Prefill chunks run the flash kernels of flash_attn.cu;
 * this file's one-block-per-(token, head) kernel takes head dims without a
 * flash instantiation (and PETREL_CUDA_FLASH=0). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/decode_split.cuh"
#include "backend/cuda/gemv_tc.cuh" /* XO: pt_cuda_tc_xo_begin */

#include <cuda_fp16.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#define DEC_THREADS 128

#define ATTN_WARPS 4
#define ATTN_MAX_HD 256

template <typename KT>
__global__ void kv_append_kernel(KT *kc, KT *vc, const float *k, const float *v, int64_t T, int nkv, int hd,
                                 int64_t cap, const int32_t *pos) {
    const int64_t n = T * nkv * hd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % hd);
        const int64_t th = i / hd, t = th / nkv;
        const int h = (int)(th % nkv);
        const int32_t p = pos[t];
        if (p < 0) continue; /* contract violation: positions are >= 0 */
        const int64_t off = ((int64_t)h * cap + p % cap) * hd + d;
        pt_kv_put(kc, vc, off, k[i], v[i]);
    }
}

pt_status pt_cuda_kv_append(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                            const int32_t *pos) {
    pt_cuda *c = pt_cuda_of(be);
    if (kv->bits) return pt_cuda_kv_append_q(be, kv, k, v, T, pos); /* kv_quant.cu */
    const int64_t n = T * kv->n_kv * kv->head_dim;
    if (n == 0) return PT_OK;
    const unsigned blocks = pt_cuda_blocks(n, 256);
    switch (kv->dtype) {
    case PT_FT_F32:
        kv_append_kernel<float><<<blocks, 256, 0, c->stream>>>((float *)kv->k, (float *)kv->v, k, v, T, kv->n_kv,
                                                              kv->head_dim, kv->capacity, pos);
        break;
    case PT_FT_BF16:
        kv_append_kernel<__nv_bfloat16><<<blocks, 256, 0, c->stream>>>(
            (__nv_bfloat16 *)kv->k, (__nv_bfloat16 *)kv->v, k, v, T, kv->n_kv, kv->head_dim, kv->capacity, pos);
        break;
    case PT_FT_F16:
        kv_append_kernel<__half><<<blocks, 256, 0, c->stream>>>((__half *)kv->k, (__half *)kv->v, k, v, T, kv->n_kv,
                                                               kv->head_dim, kv->capacity, pos);
        break;
    }
    CUDA_CHECK_LAUNCH("kv_append");
    return PT_OK;
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

struct attn_args {
    float *out;
    const float *q;
    const void *k, *v;
    const int32_t *pos;
    int nh, nkv, hd;
    int64_t cap;
    float scale, softcap;
    int window, bf;
};

/* The score of query q (lane's slice in qr) against key row kr, as the CPU
 * reference computes it. Every lane returns the same value. */
template <typename KT, int NPL>
__device__ __forceinline__ float score(const float (&qr)[NPL], const KT *kr, int lane, int hd, const attn_args &a) {
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        if (e < hd) d = fmaf(qr[i], to_f(kr[e]), d);
    }
    d = pt_warp_sum(d);
    float s = pt_rnd(a.bf, pt_rnd(a.bf, d) * a.scale);
    if (a.softcap > 0.f) s = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, s / a.softcap))) * a.softcap);
    return s;
}

template <typename KT, int NPL>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attention_kernel(attn_args a) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][ATTN_MAX_HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = blockIdx.x / a.nh;
    const int h = (int)(blockIdx.x % a.nh);
    const int kh = h / (a.nh / a.nkv);
    const int hd = a.hd;
    const int64_t hi = a.pos[t];
    const int64_t lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    const KT *kb = (const KT *)a.k + (int64_t)kh * a.cap * hd;
    const KT *vb = (const KT *)a.v + (int64_t)kh * a.cap * hd;
    const float *qp = a.q + (t * a.nh + h) * hd;
    float qr[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        qr[i] = e < hd ? qp[e] : 0.f;
    }
    /* pass 1: max and sum of exp (online within a warp, merged across warps) */
    float m = -INFINITY, l = 0.f;
    for (int64_t j = lo + warp; j <= hi; j += ATTN_WARPS) {
        pt_softmax_push(score<KT, NPL>(qr, kb + (j % a.cap) * hd, lane, hd, a), m, l);
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    __syncthreads();
    float M;
    const float inv = pt_softmax_warps<ATTN_WARPS>(sm_m, sm_l, M);
    /* pass 2: p·v */
    float acc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) acc[i] = 0.f;
    for (int64_t j = lo + warp; j <= hi; j += ATTN_WARPS) {
        const int64_t slot = j % a.cap;
        const float s = score<KT, NPL>(qr, kb + slot * hd, lane, hd, a);
        const float p = pt_rnd(a.bf, expf(s - M) * inv);
        const KT *vr = vb + slot * hd;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int e = lane + 32 * i;
            if (e < hd) acc[i] = fmaf(p, to_f(vr[e]), acc[i]);
        }
    }
    pt_warps_out(acc, sm_acc, a.out + (t * a.nh + h) * hd, hd, a.bf);
}

/* ---- decode (T == 1): split over the sequence ------------------------------
 * A single query row has too little parallelism for one block per head
 * (32 blocks on 132 SMs). Three kernels, each over (KV head, split, row)
 * blocks so the G query heads sharing a KV head share its loads:
 *   1. scores: one thread per key computes the G scores (16-byte K loads,
 *      q in shared memory), stores them to scratch, and each split leaves
 *      its partial (max, sum of exp) per head;
 *   2. p·V: every block merges the used splits' (max, sum) into the exact
 *      row max M and sum L (pt_softmax_merge), forms p = round(exp(s − M) /
 *      L) as the reference does and accumulates p·v for its keys (lanes
 *      split head_dim);
 *   3. merge: the used splits' partial outputs are added in split order.
 * No atomics: the result does not depend on scheduling.
 *
 * Work follows the keys present, not the cache. The split count nsplit
 * (dec_shape) is fixed per cache, so a captured graph stays valid as the
 * context grows, but a split holds at least `minper` keys (DEC_MINPER): a
 * row of n keys takes per = max(ceil(n / nsplit), minper) keys per split and
 * uses the first used = ceil(n / per) splits (dec_range). Blocks of splits
 * past `used` return before loading anything, the p·V blocks merge only the
 * used splits' statistics, the merge adds only their partial outputs. From
 * n = nsplit·minper on, every split is used (per = ceil(n / nsplit)).
 * Skipped entries would have been (max −inf, sum 0) and exact zeros, which
 * pt_softmax_merge and the sum pass over unchanged, so nothing but the
 * time depends on the skipping.
 *
 * Grid: (KV head, y, row), y in [0, Y): block y takes the splits y, y + Y,
 * y + 2Y, ... below `used`. One row runs Y = nsplit (a block per split);
 * many rows run fewer (dec_blocks_y), so a batch at short contexts does not
 * launch thousands of blocks with no key. A split's keys, its thread-to-key
 * assignment and its reduction order do not depend on Y or on which block
 * takes it.
 *
 * The same kernels serve the single-sequence decode (one row, the cache of
 * pt_kv_layer) and the multi-sequence decode of continuous batching
 * (batch_decode.cu: B rows, row b with its own position pos[b] and cache
 * pointers from the device table kvp[2b], kvp[2b + 1]). A row's splits do
 * exactly the same work in either launch, so a batched row is bit-identical
 * to that row decoded alone (tests/cuda/test_cuda_batch.c). */

/* Smallest split (keys) once the context is short enough that nsplit
 * splits would be smaller. Larger: fewer splits for many rows at short
 * contexts (less per-split work: block reductions, partial outputs,
 * merges); smaller: more blocks, shorter chains for one row. 16, 32 and 64
 * measured (bench/RESULTS.md): the attention of one row costs the same at
 * 16 and 32 and more at 64, token generation of one sequence from an
 * empty context is fastest at 16. PETREL_CUDA_DEC_MINPER=N (1..256, read
 * once) overrides it for A/B runs (it changes the splits, so results
 * differ in the last bits between values, never between a row alone and
 * in a batch). */
#define DEC_MINPER 16

/* Scores of keys [lo + split·per, +per) of row b for the G heads of KV head
 * kh, for the splits of this block. */
template <typename KT>
__global__ void __launch_bounds__(DEC_THREADS) dec_scores_kernel(pt_dec_rows a) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    extern __shared__ float qs[]; /* [G, hd] */
    __shared__ float red[32];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.x;
    const int64_t b = blockIdx.z, nsplit = a.nsplit, stride = a.stride;
    int64_t lo, n, per, used;
    dec_range(a, b, lo, n, per, used);
    if ((int64_t)blockIdx.y >= used) return; /* no split of this block holds a key */
    const float *q = a.q + b * a.nh * hd;
    float *S = a.S + b * a.nh * stride;
    float2 *ML = a.ML + b * a.nh * nsplit;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[(int64_t)kh * G * hd + i];
    __syncthreads();
    const KT *kb = (const KT *)dec_cache(a, b, 0) + (int64_t)kh * a.cap * hd;
    for (int64_t split = blockIdx.y; split < used; split += gridDim.y) {
        float m[DEC_MAX_G], l[DEC_MAX_G];
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++) m[g] = -INFINITY, l[g] = 0.f;
        const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
        for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
            const KT *kr = kb + ((lo + j) % a.cap) * hd;
            float d[DEC_MAX_G];
#pragma unroll
            for (int g = 0; g < DEC_MAX_G; g++) d[g] = 0.f;
            constexpr int V = 16 / sizeof(KT);
#pragma unroll 4
            for (int e0 = 0; e0 < hd; e0 += V) {
                uint4 u = *reinterpret_cast<const uint4 *>(kr + e0);
                const KT *kv = reinterpret_cast<const KT *>(&u);
                float kf[V];
#pragma unroll
                for (int i = 0; i < V; i++) kf[i] = to_f(kv[i]);
#pragma unroll
                for (int g = 0; g < DEC_MAX_G; g++) {
                    if (g >= G) break;
#pragma unroll
                    for (int i = 0; i < V; i++) d[g] = fmaf(qs[g * hd + e0 + i], kf[i], d[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < DEC_MAX_G; g++) {
                if (g >= G) break;
                float s = pt_rnd(a.bf, pt_rnd(a.bf, d[g]) * a.scale);
                if (a.softcap > 0.f) s = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, s / a.softcap))) * a.softcap);
                S[((int64_t)kh * G + g) * stride + j] = s;
                pt_softmax_push(s, m[g], l[g]);
            }
        }
        /* pt_softmax_block synchronizes before reusing red, also across splits */
        for (int g = 0; g < G; g++) {
            const float2 ml = pt_softmax_block(m[g], l[g], red);
            if (threadIdx.x == 0) ML[((int64_t)kh * G + g) * nsplit + split] = ml;
        }
    }
}

template <typename KT, int NPL>
__global__ void __launch_bounds__(DEC_THREADS) dec_pv_kernel(pt_dec_rows a) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    __shared__ float sM[DEC_MAX_G], sInv[DEC_MAX_G];
    __shared__ float acc_s[DEC_THREADS / 32][DEC_MAX_G * NPL * 32];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.x;
    const int64_t b = blockIdx.z, nsplit = a.nsplit, stride = a.stride;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t lo, n, per, used;
    dec_range(a, b, lo, n, per, used);
    if ((int64_t)blockIdx.y >= used) return;
    const float *S = a.S + b * a.nh * stride;
    const float2 *ML = a.ML + b * a.nh * nsplit;
    float *P = a.P + b * a.nh * nsplit * hd;
    if (threadIdx.x < G) { /* the exact row max and sum, merged over the used splits in split order */
        float M, L;
        pt_softmax_merge(ML + ((int64_t)kh * G + threadIdx.x) * nsplit, (int)used, M, L);
        sM[threadIdx.x] = M;
        sInv[threadIdx.x] = 1.0f / L;
    }
    __syncthreads();
    const KT *vb = (const KT *)dec_cache(a, b, 1) + (int64_t)kh * a.cap * hd;
    for (int64_t split = blockIdx.y; split < used; split += gridDim.y) {
        float acc[DEC_MAX_G][NPL];
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++)
#pragma unroll
            for (int i = 0; i < NPL; i++) acc[g][i] = 0.f;
        const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
        /* unrolled so several keys' V loads are in flight at once; each
         * warp still accumulates its keys in key order */
#pragma unroll 4
        for (int64_t j = j0 + warp; j < j1; j += DEC_THREADS / 32) {
            const KT *vr = vb + ((lo + j) % a.cap) * hd;
            float vv[NPL];
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                const int e = lane + 32 * i;
                vv[i] = e < hd ? to_f(vr[e]) : 0.f;
            }
#pragma unroll
            for (int g = 0; g < DEC_MAX_G; g++) {
                if (g >= G) break;
                const float p = pt_rnd(a.bf, expf(S[((int64_t)kh * G + g) * stride + j] - sM[g]) * sInv[g]);
#pragma unroll
                for (int i = 0; i < NPL; i++) acc[g][i] = fmaf(p, vv[i], acc[g][i]);
            }
        }
        /* partial output of this split: P[head, split, hd], warps added in order */
        pt_pv_partial<DEC_MAX_G, NPL, DEC_THREADS / 32>(acc, acc_s, G, hd, P, (int64_t)kh * G, nsplit, split);
        __syncthreads(); /* acc_s is written again by the next split */
    }
}

/* The split decode's merge (both generations; declared and described in
 * decode_split.cuh). */
__global__ void dec_rows_merge_kernel(pt_dec_rows a, int64_t B) {
    pt_release_dependents();
    pt_wait_primary();
    const int nh = a.nh, hd = a.hd;
    const int64_t per_row = (int64_t)nh * hd, total = B * per_row, nsplit = a.nsplit;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t used;
        const float *Pb = dec_merge_src(a, i, nh, hd, per_row, nsplit, used);
        float v = 0.f;
        int64_t s = 0;
        for (; s + 8 <= used; s += 8) {
            float x[8];
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = Pb[(s + k) * hd];
#pragma unroll
            for (int k = 0; k < 8; k++) v += x[k];
        }
        for (; s < used; s++) v += Pb[s * hd];
        a.out[i] = pt_rnd(a.bf, v);
    }
}

/* out[h, e] = all nsplit partial outputs of dec_p added in split order
 * (kv_quant.cu's split decode, whose empty splits write zeros). */
__global__ void dec_merge_kernel(float *out, const float *P, int nh, int hd, int64_t nsplit, int bf) {
    pt_release_dependents();
    pt_wait_primary();
    const int64_t n = (int64_t)nh * hd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = i / hd, e = i % hd;
        float v = 0.f;
        for (int64_t s = 0; s < nsplit; s++) v += P[(h * nsplit + s) * hd + e];
        out[i] = pt_rnd(bf, v);
    }
}

pt_status pt_cuda_dec_merge(pt_cuda *c, float *out, int nh, int hd, int nsplit, int bf) {
    pt_launch(dec_merge_kernel, dim3(pt_cuda_blocks((int64_t)nh * hd, 256)), dim3(256), 0, c->stream, pt_pdl_chain(), out,
              (const float *)c->dec_p, nh, hd, (int64_t)nsplit, bf);
    CUDA_CHECK_LAUNCH("decode attention merge");
    return PT_OK;
}

/* PETREL_CUDA_ATTN_V2 (read once): 0 runs the first-generation kernels. */
static int g_attn_v2 = -1;


/* The split count and score stride of a decode over a cache of `cap` slots:
 * enough (KV head, split) blocks for two waves over the SMs, fixed for a
 * cache so a captured graph stays valid as the context grows. */
static void dec_shape(const pt_cuda *c, int nkv, int64_t cap, int64_t &stride, int64_t &nsplit) {
    stride = cap;
    if (c->lim.max_ctx > 0 && c->lim.max_ctx < stride) stride = c->lim.max_ctx;
    nsplit = (2 * (int64_t)c->sm_count + nkv - 1) / nkv;
    if (nsplit > (stride + 63) / 64) nsplit = (stride + 63) / 64;
    if (nsplit < 1) nsplit = 1;
}

/* Blocks per SM the grid of a many-row launch aims at:
 * PETREL_CUDA_DEC_GRID (read once; A/B runs), default 4 (64 streams of the
 * 8B shape served +3% against 16, bench/RESULTS.md); 0 = one block per split
 * whatever the rows. Bits do not depend on it. */
static int g_dec_grid = -1, g_dec_minper = -1;

/* PETREL_CUDA_DEC_SHORT (read once): 0 never runs the one-launch form of
 * attention_short.cu, 2 runs it for every GQA group size it takes; the
 * default, 1, runs it at every group size with a block per query head and
 * up to 4 query heads per KV head with a block per KV head
 * (PETREL_CUDA_DEC_SHORT_HEADS=0: at 8 that form measured slower than the
 * three kernels). A/B and tests, the same bits either way. */
static int g_dec_short = -1;

/* Grid height Y (blocks per row and KV head): nsplit, or fewer when B rows
 * of nsplit blocks would exceed the target — each block then loops over
 * nsplit / Y splits. One row always gets nsplit. */
static int64_t dec_blocks_y(const pt_cuda *c, int nkv, int64_t nsplit, int64_t B) {
    if (g_dec_grid < 0) {
        g_dec_grid = pt_env_int("PETREL_CUDA_DEC_GRID", 0, 64, 4);
    }
    if (g_dec_grid == 0 || B <= 1) return nsplit;
    const int64_t target = (int64_t)g_dec_grid * c->sm_count, per_y = (int64_t)nkv * B;
    const int64_t y = (target + per_y - 1) / per_y;
    return y < nsplit ? y : nsplit;
}

template <typename KT>
static pt_status dec_launch(pt_cuda *c, pt_dec_rows &a, int64_t B, int batched) {
    const int G = a.nh / a.nkv;
    if (G > DEC_MAX_G || a.hd > 256 || (a.hd * (int)sizeof(KT)) % 16 || (!batched && (uintptr_t)a.k % 16))
        return batched ? pt_error(PT_ERR_UNSUPPORTED,
                                  "attention_rows: GQA group %d / head_dim %d outside the split decode kernels", G, a.hd)
                       : PT_ERR_UNSUPPORTED;
    dec_shape(c, a.nkv, a.cap, a.stride, a.nsplit);
    if (g_dec_minper < 0) {
        g_dec_minper = pt_env_int("PETREL_CUDA_DEC_MINPER", 1, 256, DEC_MINPER);
    }
    a.minper = g_dec_minper;
    /* the single-sequence scratch must take the cache too: a row the batch
     * cannot run alone would not be batch-invariant */
    if ((size_t)a.nh * (size_t)a.stride > c->dec_s_floats || (size_t)a.nh * a.nsplit > c->dec_ml_count ||
        (size_t)a.nh * a.nsplit * a.hd > c->dec_p_floats)
        return batched ? pt_error(PT_ERR_UNSUPPORTED,
                                  "attention_rows: the single-sequence decode scratch does not take a %lld-key cache",
                                  (long long)a.stride)
                       : PT_ERR_UNSUPPORTED;
    if (batched) {
        if ((size_t)B * a.nh * (size_t)a.stride > c->bdec_s_floats || (size_t)B * a.nh * a.nsplit > c->bdec_ml_count ||
            (size_t)B * a.nh * a.nsplit * a.hd > c->bdec_p_floats)
            return pt_error(PT_ERR_UNSUPPORTED,
                            "attention_rows: scratch not reserved for %lld rows of a %lld-key cache (reserve max_rows)",
                            (long long)B, (long long)a.stride);
        if (B > 65535) return pt_error(PT_ERR_UNSUPPORTED, "attention_rows: %lld rows exceed the grid", (long long)B);
        a.S = c->bdec_s, a.ML = c->bdec_ml, a.P = c->bdec_p;
    } else {
        a.S = c->dec_s, a.ML = c->dec_ml, a.P = c->dec_p;
    }
    dim3 grid((unsigned)a.nkv, (unsigned)dec_blocks_y(c, a.nkv, a.nsplit, B), (unsigned)B);
    if (g_attn_v2 < 0) g_attn_v2 = pt_env_on("PETREL_CUDA_ATTN_V2");
    if (g_dec_short < 0) {
        g_dec_short = pt_env_int("PETREL_CUDA_DEC_SHORT", 0, 2, 1);
    }
    const int R = a.hd * (int)sizeof(KT) / 16;
    a.err = c->err_dev;
    /* one launch at short contexts, same bits (attention_short.cu; batched rows under a key bound too);
     * a block per KV head only up to 4 query heads per KV head (with 8, qwen3-30b-a3b's, it measured slower
     * than the three kernels for one sequence), and batched rows at 8 only with PETREL_CUDA_DEC_SHORT=2 */
    if (g_attn_v2 && g_dec_short && a.max_keys > 0 && (!batched || c->dec_short_rows) &&
        (g_dec_short == 2 || (!batched && c->dec_short_heads) || a.nh / a.nkv <= 4)) {
        const pt_status st = pt_cuda_dec2_short<KT>(c, a, B, a.max_keys);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    if (g_attn_v2 && R >= 4 && R <= 64) return pt_cuda_dec2_launch<KT>(c, a, B, grid);
    if (a.inv_freq) return PT_ERR_UNSUPPORTED; /* the folded RoPE: second-generation kernels only (checked before) */
    pt_launch(dec_scores_kernel<KT>, grid, dim3(DEC_THREADS), (size_t)G * a.hd * sizeof(float), c->stream, pt_pdl_chain(), a);
    CUDA_CHECK_LAUNCH("decode attention scores");
    switch ((a.hd + 31) / 32) {
#define PT_NPL(N) \
    case N: pt_launch(dec_pv_kernel<KT, N>, grid, dim3(DEC_THREADS), 0, c->stream, pt_pdl_chain(), a); break;
        PT_NPL(1) PT_NPL(2) PT_NPL(3) PT_NPL(4) PT_NPL(5) PT_NPL(6) PT_NPL(7) PT_NPL(8)
#undef PT_NPL
    }
    CUDA_CHECK_LAUNCH("decode attention p·v");
    pt_launch(dec_rows_merge_kernel, dim3(pt_cuda_blocks(B * a.nh * a.hd, 256)), dim3(256), 0, c->stream, pt_pdl_chain(), a,
              B);
    CUDA_CHECK_LAUNCH("decode attention merge");
    return PT_OK;
}

pt_status pt_cuda_decode_split(pt_cuda *c, pt_dec_rows &a, int64_t B, pt_ftype dt, int batched) {
    switch (dt) {
    case PT_FT_F32: return dec_launch<float>(c, a, B, batched);
    case PT_FT_BF16: return dec_launch<__nv_bfloat16>(c, a, B, batched);
    case PT_FT_F16: return dec_launch<__half>(c, a, B, batched);
    }
    return pt_error(PT_ERR_INVALID_ARG, "decode attention: cache dtype %d", (int)dt);
}

template <typename KT>
static pt_status launch_attn(pt_cuda *c, const attn_args &a, int64_t T) {
    if (T == 1) {
        pt_dec_rows r = {};
        r.out = a.out, r.q = a.q, r.k = a.k, r.v = a.v, r.pos = a.pos;
        r.nh = a.nh, r.nkv = a.nkv, r.hd = a.hd, r.cap = a.cap;
        r.scale = a.scale, r.softcap = a.softcap, r.window = a.window, r.bf = a.bf;
        pt_status st = dec_launch<KT>(c, r, 1, 0);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    const int npl = (a.hd + 31) / 32;
    dim3 grid((unsigned)(T * a.nh)), block(ATTN_WARPS * 32);
    switch (npl) {
#define PT_NPL(N) \
    case N: attention_kernel<KT, N><<<grid, block, 0, c->stream>>>(a); break;
        PT_NPL(1) PT_NPL(2) PT_NPL(3) PT_NPL(4) PT_NPL(5) PT_NPL(6) PT_NPL(7) PT_NPL(8)
#undef PT_NPL
    default: return pt_error(PT_ERR_UNSUPPORTED, "attention: head_dim %d (CUDA kernels exist up to 256)", a.hd);
    }
    CUDA_CHECK_LAUNCH("attention");
    return PT_OK;
}

pt_status pt_cuda_attention(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                            const pt_kv_layer *kv, const pt_attn *p) {
    pt_cuda *c = pt_cuda_of(be);
    if (p->head_dim != kv->head_dim || kv->n_kv <= 0 || p->n_heads % kv->n_kv)
        return pt_error(PT_ERR_INVALID_ARG,
                        "attention: %d heads of dim %d do not fit a cache of %d KV heads of dim %d", p->n_heads,
                        p->head_dim, kv->n_kv, kv->head_dim);
    if (p->head_dim > ATTN_MAX_HD)
        return pt_error(PT_ERR_UNSUPPORTED, "attention: head_dim %d (CUDA kernels exist up to %d)", p->head_dim,
                        ATTN_MAX_HD);
    if (T * p->n_heads > INT32_MAX) return pt_error(PT_ERR_UNSUPPORTED, "attention: grid too large");
    if (kv->bits) return pt_cuda_attention_q(be, out, q, T, pos, kv, p); /* kv_quant.cu */
    if (T <= 0) return PT_OK;
    if (T > 1) { /* prefill: flash_attn.cu */
        pt_status st = pt_cuda_flash_prefill(c, out, q, T, pos, kv, p);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    attn_args a = {out, q, kv->k, kv->v, pos, p->n_heads, kv->n_kv, p->head_dim, kv->capacity,
                   p->scale, p->softcap, p->window, pt_cuda_bf(be)};
    switch (kv->dtype) {
    case PT_FT_F32: return launch_attn<float>(c, a, T);
    case PT_FT_BF16: return launch_attn<__nv_bfloat16>(c, a, T);
    case PT_FT_F16: return launch_attn<__half>(c, a, T);
    }
    return pt_error(PT_ERR_INVALID_ARG, "attention: cache dtype %d", (int)kv->dtype);
}

/* ---- rope_kv_attention (backend.h): RoPE and the cache write folded into
 * the split decode's scores kernel (pt_dec_rows.kn). The separate path is
 * rope_kv_kernel (one launch over every q/k pair and cache item) before the
 * three attention kernels; here each scores block rotates its G query heads
 * and its KV head's new key itself (the same table values and expressions,
 * so the same bits), scores the new key from shared memory, and the block
 * of split 0 of each (row, KV head) stores the key and the value into the
 * cache, which the p·V kernel reads after the scores grid has completed
 * (programmatic dependent launch waits for it; without it, stream order).
 * One launch fewer per layer of a one-sequence decode. Batched rows (kvp)
 * may share a cache (a joining prompt's rows in one step: a row must see
 * the keys the rows before it append), so their keys are rotated and
 * appended first by one kernel over every row (rope_k_append_rows,
 * batch_decode.cu: rope_qk's key arithmetic, kv_append_rows's bytes), and
 * only the queries' RoPE is folded into the scores kernel (ROPE == 2): one
 * launch fewer per layer than rope_qk + kv_append_rows. Only where the
 * second-generation kernels run (what else would be taken answers
 * PT_ERR_UNSUPPORTED before any launch). PETREL_CUDA_ROPE_ATTN=0 (read
 * once): never folded. */
static int g_rope_attn = -1;

pt_status pt_cuda_rope_kv_attention(pt_backend *be, float *out, const float *q, const float *k, const float *v,
                                    int64_t B, const int32_t *pos, const pt_rope *rope, pt_kv_layer *kv,
                                    void *const *kvp, const pt_attn *p) {
    pt_cuda *c = pt_cuda_of(be);
    if (g_rope_attn < 0) g_rope_attn = pt_env_on("PETREL_CUDA_ROPE_ATTN");
    if (g_attn_v2 < 0) g_attn_v2 = pt_env_on("PETREL_CUDA_ATTN_V2");
    if (!g_rope_attn || !g_attn_v2 || kv->bits || B < 1 || (!kvp && B != 1) || B > 65535) return PT_ERR_UNSUPPORTED;
    const int nh = p->n_heads, nkv = kv->n_kv, hd = p->head_dim;
    if (hd != kv->head_dim || nkv <= 0 || nh % nkv || nh / nkv > DEC_MAX_G || hd > ATTN_MAX_HD) return PT_ERR_UNSUPPORTED;
    if (rope->rot_dim <= 0 || rope->rot_dim % 2 || rope->rot_dim > hd) return PT_ERR_UNSUPPORTED;
    const int esz = kv->dtype == PT_FT_F32 ? 4 : 2, R = hd * esz / 16;
    if ((hd * esz) % 16 || R < 4 || R > 64 || (!kvp && (uintptr_t)kv->k % 16)) return PT_ERR_UNSUPPORTED;
    /* the scratch checks of dec_launch, made here so that nothing is refused there */
    int64_t stride, nsplit;
    dec_shape(c, nkv, kv->capacity, stride, nsplit);
    const int64_t rows = kvp ? B : 1;
    if ((size_t)nh * (size_t)stride > c->dec_s_floats || (size_t)nh * nsplit > c->dec_ml_count ||
        (size_t)nh * nsplit * hd > c->dec_p_floats)
        return PT_ERR_UNSUPPORTED;
    if (kvp && ((size_t)rows * nh * (size_t)stride > c->bdec_s_floats || (size_t)rows * nh * nsplit > c->bdec_ml_count ||
                (size_t)rows * nh * nsplit * hd > c->bdec_p_floats))
        return PT_ERR_UNSUPPORTED;
    pt_dec_rows r;
    memset(&r, 0, sizeof r);
    r.out = out, r.q = q, r.k = kv->k, r.v = kv->v, r.kvp = kvp, r.pos = pos;
    r.nh = nh, r.nkv = nkv, r.hd = hd, r.cap = kv->capacity;
    r.scale = p->scale, r.softcap = p->softcap, r.window = p->window, r.bf = pt_cuda_bf(be);
    r.kn = k, r.vn = v, r.inv_freq = (const float *)rope->inv_freq, r.rscale = rope->attn_scale;
    r.half = rope->rot_dim / 2;
    r.max_keys = p->max_keys;
    if (kvp) { /* the keys of every row first, then the queries' RoPE in the scores kernel */
        PT_TRY(pt_cuda_rope_k_append_rows(c, kv, kvp, k, v, rows, pos, rope, r.bf));
        r.kn = NULL, r.vn = NULL;
        /* the output projection's x written by the batched rows' one-task kernel where asked (gemv_tc.cu XO):
         * a block's G·hd outputs whole 64-value units */
        const int ghd = nh / nkv * hd;
        r.xo = pt_cuda_tc_xo_begin(c, (int)B, nh * hd, &r.xo_unit);
        if (ghd % 64 || ghd > PT_DS_XO_MAX) r.xo = NULL;
    }
    return pt_cuda_decode_split(c, r, rows, kv->dtype, kvp != NULL);
}
