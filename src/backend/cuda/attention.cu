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
 * Quantized KV caches (L2) are kv_quant.cu's: kv_append and attention
 * hand them over. Prefill chunks run the flash kernels of flash_attn.cu;
 * this file's one-block-per-(token, head) kernel takes head dims without a
 * flash instantiation (and PETREL_CUDA_FLASH=0). */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>

#include <type_traits>

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
        if constexpr (sizeof(KT) == 4) {
            kc[off] = k[i];
            vc[off] = v[i];
        } else if constexpr (std::is_same<KT, __half>::value) {
            kc[off] = __float2half_rn(k[i]);
            vc[off] = __float2half_rn(v[i]);
        } else {
            kc[off] = __float2bfloat16_rn(k[i]);
            vc[off] = __float2bfloat16_rn(v[i]);
        }
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
        const float s = score<KT, NPL>(qr, kb + (j % a.cap) * hd, lane, hd, a);
        if (s > m) {
            l = l * expf(m - s) + 1.f;
            m = s;
        } else {
            l += expf(s - m);
        }
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++)
        if (sm_m[w] != -INFINITY) L += sm_l[w] * expf(sm_m[w] - M);
    const float inv = 1.0f / L;
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
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        if (e < hd) sm_acc[warp][e] = acc[i];
    }
    __syncthreads();
    float *o = a.out + (t * a.nh + h) * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) v += sm_acc[w][e];
        o[e] = pt_rnd(a.bf, v);
    }
}

/* ---- decode (T == 1): split over the sequence ------------------------------
 * A single query row has too little parallelism for one block per head
 * (32 blocks on 132 SMs). Three kernels, each over (KV head, split) blocks so
 * the G query heads sharing a KV head share its loads:
 *   1. scores: one thread per key computes the G scores (16-byte K loads,
 *      q in shared memory), stores them to scratch, and each block leaves
 *      its partial (max, sum of exp) per head;
 *   2. p·V: every block merges all splits' (max, sum) into the exact row
 *      max M and sum L, forms p = round(exp(s - M) / L) as the reference
 *      does and accumulates p·v for its keys (lanes split head_dim);
 *   3. merge: the splits' partial outputs are added in split order.
 * No atomics: the result does not depend on scheduling. */

#define DEC_THREADS 128
#define DEC_MAX_G 8

/* The key range of the single query (positions come from device memory, so
 * a captured graph replays with new ones): keys lo + [0, n), split into
 * `nsplit` ranges of `per` keys. n is clamped to the scores' row stride. */
__device__ __forceinline__ void dec_range(const attn_args &a, int nsplit, int64_t stride, int64_t &lo, int64_t &n,
                                          int64_t &per) {
    const int64_t hi = a.pos[0];
    lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    n = hi - lo + 1;
    if (n > stride) n = stride;
    if (n < 0) n = 0;
    per = (n + nsplit - 1) / nsplit;
}

/* Scores of keys [lo + split·per, +per) for the G heads of KV head kh. */
template <typename KT>
__global__ void __launch_bounds__(DEC_THREADS)
    dec_scores_kernel(attn_args a, int64_t stride, float *S, float2 *ML) {
    extern __shared__ float qs[]; /* [G, hd] */
    __shared__ float red[32];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    int64_t lo, n, per;
    dec_range(a, nsplit, stride, lo, n, per);
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = a.q[(int64_t)kh * G * hd + i];
    __syncthreads();
    const KT *kb = (const KT *)a.k + (int64_t)kh * a.cap * hd;
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
            if (s > m[g]) {
                l[g] = l[g] * expf(m[g] - s) + 1.f;
                m[g] = s;
            } else {
                l[g] += expf(s - m[g]);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        const float bm = pt_block_max(m[g], red);
        const float bl = pt_block_sum(m[g] == -INFINITY ? 0.f : l[g] * expf(m[g] - bm), red);
        if (threadIdx.x == 0) ML[((int64_t)kh * G + g) * nsplit + split] = make_float2(bm, bl);
    }
}

template <typename KT, int NPL>
__global__ void __launch_bounds__(DEC_THREADS)
    dec_pv_kernel(attn_args a, int64_t stride, const float *S, const float2 *ML, float *P) {
    __shared__ float sM[DEC_MAX_G], sInv[DEC_MAX_G];
    __shared__ float acc_s[DEC_THREADS / 32][DEC_MAX_G * NPL * 32];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t lo, n, per;
    dec_range(a, nsplit, stride, lo, n, per);
    if (threadIdx.x < G) { /* the exact row max and sum, merged in split order */
        const float2 *ml = ML + ((int64_t)kh * G + threadIdx.x) * nsplit;
        float M = -INFINITY;
        for (int s = 0; s < nsplit; s++) M = fmaxf(M, ml[s].x);
        float L = 0.f;
        for (int s = 0; s < nsplit; s++)
            if (ml[s].x != -INFINITY) L += ml[s].y * expf(ml[s].x - M);
        sM[threadIdx.x] = M;
        sInv[threadIdx.x] = 1.0f / L;
    }
    __syncthreads();
    const KT *vb = (const KT *)a.v + (int64_t)kh * a.cap * hd;
    float acc[DEC_MAX_G][NPL];
#pragma unroll
    for (int g = 0; g < DEC_MAX_G; g++)
#pragma unroll
        for (int i = 0; i < NPL; i++) acc[g][i] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
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
#pragma unroll
    for (int g = 0; g < DEC_MAX_G; g++) {
        if (g >= G) break;
#pragma unroll
        for (int i = 0; i < NPL; i++) acc_s[warp][(g * NPL + i) * 32 + lane] = acc[g][i];
    }
    __syncthreads();
    /* partial output of this split: P[head, split, hd], warps added in order */
    for (int idx = threadIdx.x; idx < G * NPL * 32; idx += blockDim.x) {
        const int g = idx / (NPL * 32), r = idx % (NPL * 32), i = r / 32, ln = r % 32, e = ln + 32 * i;
        if (e >= hd) continue;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_THREADS / 32; w++) v += acc_s[w][idx];
        P[(((int64_t)kh * G + g) * nsplit + split) * hd + e] = v;
    }
}

__global__ void dec_merge_kernel(float *out, const float *P, int nh, int hd, int nsplit, int bf) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nh * hd; i += gridDim.x * blockDim.x) {
        const int h = i / hd, e = i % hd;
        float v = 0.f;
        for (int s = 0; s < nsplit; s++) v += P[((int64_t)h * nsplit + s) * hd + e];
        out[i] = pt_rnd(bf, v);
    }
}

/* Decode through the split kernels; PT_ERR_UNSUPPORTED (no message) when the
 * shape or the reserved scratch does not allow it: the caller falls back to
 * the one-block-per-head kernel. */
template <typename KT>
static pt_status launch_decode_split(pt_cuda *c, const attn_args &a) {
    const int G = a.nh / a.nkv;
    if (G > DEC_MAX_G || a.hd > 256 || (a.hd * (int)sizeof(KT)) % 16 || (uintptr_t)a.k % 16) return PT_ERR_UNSUPPORTED;
    /* Scores are stored with a row stride that bounds the key count: the
     * cache capacity, or the reserved context if that is smaller. */
    int64_t stride = a.cap;
    if (c->lim.max_ctx > 0 && c->lim.max_ctx < stride) stride = c->lim.max_ctx;
    /* enough (KV head, split) blocks for two waves over the SMs; fixed for a
     * cache, so a captured graph stays valid as the context grows */
    int64_t nsplit = (2 * (int64_t)c->sm_count + a.nkv - 1) / a.nkv;
    if (nsplit > (stride + 63) / 64) nsplit = (stride + 63) / 64;
    if (nsplit < 1) nsplit = 1;
    if ((size_t)a.nh * (size_t)stride > c->dec_s_floats || (size_t)a.nh * nsplit > c->dec_ml_count ||
        (size_t)a.nh * nsplit * a.hd > c->dec_p_floats)
        return PT_ERR_UNSUPPORTED;
    dim3 grid((unsigned)a.nkv, (unsigned)nsplit);
    dec_scores_kernel<KT><<<grid, DEC_THREADS, (size_t)G * a.hd * sizeof(float), c->stream>>>(a, stride, c->dec_s,
                                                                                            c->dec_ml);
    CUDA_CHECK_LAUNCH("decode attention scores");
    switch ((a.hd + 31) / 32) {
#define PT_NPL(N)                                                                                         \
    case N:                                                                                               \
        dec_pv_kernel<KT, N><<<grid, DEC_THREADS, 0, c->stream>>>(a, stride, c->dec_s, c->dec_ml, c->dec_p); \
        break;
        PT_NPL(1) PT_NPL(2) PT_NPL(3) PT_NPL(4) PT_NPL(5) PT_NPL(6) PT_NPL(7) PT_NPL(8)
#undef PT_NPL
    }
    CUDA_CHECK_LAUNCH("decode attention p·v");
    return pt_cuda_dec_merge(c, a.out, a.nh, a.hd, (int)nsplit, a.bf);
}

pt_status pt_cuda_dec_merge(pt_cuda *c, float *out, int nh, int hd, int nsplit, int bf) {
    dec_merge_kernel<<<(nh * hd + 255) / 256, 256, 0, c->stream>>>(out, c->dec_p, nh, hd, nsplit, bf);
    CUDA_CHECK_LAUNCH("decode attention merge");
    return PT_OK;
}

template <typename KT>
static pt_status launch_attn(pt_cuda *c, const attn_args &a, int64_t T) {
    if (T == 1) {
        pt_status st = launch_decode_split<KT>(c, a);
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
