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
 * Not yet: quantized KV caches (PT_ERR_UNSUPPORTED, as on the CPU), the
 * sequence split for long decode contexts and the tensor-core prefill. */
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
    if (kv->bits) return pt_error(PT_ERR_UNSUPPORTED, "kv_append: quantized KV cache not implemented on CUDA yet");
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

template <typename KT>
static pt_status launch_attn(pt_cuda *c, const attn_args &a, int64_t T) {
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
    if (kv->bits) return pt_error(PT_ERR_UNSUPPORTED, "attention: quantized KV cache not implemented on CUDA yet");
    if (p->head_dim != kv->head_dim || kv->n_kv <= 0 || p->n_heads % kv->n_kv)
        return pt_error(PT_ERR_INVALID_ARG,
                        "attention: %d heads of dim %d do not fit a cache of %d KV heads of dim %d", p->n_heads,
                        p->head_dim, kv->n_kv, kv->head_dim);
    if (p->head_dim > ATTN_MAX_HD)
        return pt_error(PT_ERR_UNSUPPORTED, "attention: head_dim %d (CUDA kernels exist up to %d)", p->head_dim,
                        ATTN_MAX_HD);
    if (T <= 0) return PT_OK;
    if (T * p->n_heads > INT32_MAX) return pt_error(PT_ERR_UNSUPPORTED, "attention: grid too large");
    attn_args a = {out, q, kv->k, kv->v, pos, p->n_heads, kv->n_kv, p->head_dim, kv->capacity,
                   p->scale, p->softcap, p->window, pt_cuda_bf(be)};
    switch (kv->dtype) {
    case PT_FT_F32: return launch_attn<float>(c, a, T);
    case PT_FT_BF16: return launch_attn<__nv_bfloat16>(c, a, T);
    case PT_FT_F16: return launch_attn<__half>(c, a, T);
    }
    return pt_error(PT_ERR_INVALID_ARG, "attention: cache dtype %d", (int)kv->dtype);
}
