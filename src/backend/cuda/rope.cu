/* rope and rope_qk (backend.h): rotate-half (NeoX) RoPE in place over the
 * first rot_dim dims of each head, at positions read from device memory (so
 * a captured decode graph replays with new positions). cos/sin are computed
 * from the model spec's inv_freq table in f32, scaled by attn_scale and, in
 * bf16 mode, rounded like the reference's tables; the two products are each
 * rounded, then their sum (cpu_ops.c is the reference). One thread per pair.
 * rope_qk rotates a layer's query heads and key heads in one launch: the
 * heads of a token are numbered q heads first, then k heads, and every pair
 * is computed by the same code as in rope, so the bits are the same as two
 * rope calls. rope_qk_kv_append adds the layer's cache write to the same
 * launch: the thread that rotates a key pair also stores it into the
 * cache, and further threads store v and the unrotated key dims, each value
 * converted as attention.cu's kv_append converts it (the same bytes); over a
 * quantized cache kv_quant.cu's rope_kvq_kernel does the same (a warp per
 * key or value group, k left unrotated). PETREL_CUDA_ROPE_KV=0 makes it the
 * two launches instead (A/B). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/rope_math.cuh"

#include <cuda_fp16.h>

#include <stdlib.h>
#include <string.h>

/* Pairs: T · (nh + nkv) · half; pair i is dim d = i % half of head h of
 * token t, (t, h) = divmod(i / half, nh + nkv); heads h >= nh are k's. */
/* A cache element from f32, as kv_append stores it. */
__device__ __forceinline__ void kv_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void kv_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* rope_kernel's pairs, then T · nkv · hd cache items: item j stores v[j]
 * and, for dims d >= 2·half (not rotated), k[j]; a rotated key pair is
 * stored by the thread that rotates it. Cache layout and slot as kv_append:
 * [nkv, cap, hd], slot pos % cap, nothing for pos < 0. */
template <typename KT>
__global__ void rope_kv_kernel(float *q, float *k, const float *v, int64_t T, int nh, int nkv, int hd,
                               const int32_t *pos, int half, const float *inv_freq, float attn_scale, int bf, KT *kc,
                               KT *vc, int64_t cap) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    const int nht = nh + nkv;
    const int64_t n_rot = T * nht * half, n = n_rot + T * nkv * hd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (i < n_rot) {
            const int d = (int)(i % half);
            const int64_t th_ = i / half;
            const int64_t t = th_ / nht;
            const int h = (int)(th_ % nht);
            const float th = (float)pos[t] * inv_freq[d];
            const float cs = pt_rope_cos(th, attn_scale, bf), sn = pt_rope_sin(th, attn_scale, bf);
            float *x = h < nh ? q + (t * nh + h) * hd : k + (t * nkv + (h - nh)) * hd;
            const float a = x[d], b = x[d + half];
            const float ra = pt_rope_lo(a, b, cs, sn, bf), rb = pt_rope_hi(a, b, cs, sn, bf);
            x[d] = ra;
            x[d + half] = rb;
            const int32_t p = pos[t];
            if (h >= nh && p >= 0) {
                KT *row = kc + ((int64_t)(h - nh) * cap + p % cap) * hd;
                kv_store(row + d, ra);
                kv_store(row + d + half, rb);
            }
        } else {
            const int64_t j = i - n_rot;
            const int d = (int)(j % hd);
            const int64_t th = j / hd, t = th / nkv;
            const int h = (int)(th % nkv);
            const int32_t p = pos[t];
            if (p < 0) continue;
            const int64_t off = ((int64_t)h * cap + p % cap) * hd + d;
            kv_store(vc + off, v[j]);
            if (d >= 2 * half) kv_store(kc + off, k[j]);
        }
    }
}

__global__ void rope_kernel(float *q, float *k, int64_t T, int nh, int nkv, int hd, const int32_t *pos, int half,
                            const float *inv_freq, float attn_scale, int bf) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    const int nht = nh + nkv;
    const int64_t n = T * nht * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % half);
        const int64_t th_ = i / half; /* token·head */
        const int64_t t = th_ / nht;
        const int h = (int)(th_ % nht);
        const float th = (float)pos[t] * inv_freq[d];
        const float cs = pt_rope_cos(th, attn_scale, bf), sn = pt_rope_sin(th, attn_scale, bf);
        float *v = h < nh ? q + (t * nh + h) * hd : k + (t * nkv + (h - nh)) * hd;
        const float a = v[d], b = v[d + half];
        v[d] = pt_rope_lo(a, b, cs, sn, bf);
        v[d + half] = pt_rope_hi(a, b, cs, sn, bf);
    }
}

pt_status pt_cuda_rope_qk(pt_backend *be, float *q, float *k, int64_t T, int n_heads, int n_kv, int head_dim,
                          const int32_t *pos, const pt_rope *rope) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(rope->rot_dim > 0 && rope->rot_dim % 2 == 0 && rope->rot_dim <= head_dim);
    PT_ASSERT(n_heads >= 0 && n_kv >= 0);
    if (!k) n_kv = 0;
    const int half = rope->rot_dim / 2;
    const int64_t n = T * (n_heads + n_kv) * half;
    if (n <= 0) return PT_OK;
    pt_launch(rope_kernel, dim3(pt_cuda_blocks(n, 256)), dim3(256), 0, c->stream, pt_pdl_chain(), q, k, T, n_heads,
              n_kv, head_dim, pos, half, (const float *)rope->inv_freq, rope->attn_scale, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("rope");
    return PT_OK;
}

pt_status pt_cuda_rope(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                       const pt_rope *rope) {
    return pt_cuda_rope_qk(be, x, NULL, T, n_heads, 0, head_dim, pos, rope);
}

/* kv_quant.cu: rope_qk_kv_append over a quantized cache in one launch (q and
 * the cache bytes of rope_qk + kv_append; k left unrotated). */
pt_status pt_cuda_rope_qk_kv_append_q(pt_backend *be, float *q, float *k, const float *v, int64_t T, int n_heads,
                                      const int32_t *pos, const pt_rope *rope, pt_kv_layer *kv);

/* PETREL_CUDA_ROPE_KV=0: the two launches (A/B); read once per process. */
static int rope_kv_fused(void) {
    static int v = -1;
    if (v < 0) v = pt_env_on("PETREL_CUDA_ROPE_KV");
    return v;
}

pt_status pt_cuda_rope_qk_kv_append(pt_backend *be, float *q, float *k, const float *v, int64_t T, int n_heads,
                                    int n_kv, int head_dim, const int32_t *pos, const pt_rope *rope,
                                    pt_kv_layer *kv) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(rope->rot_dim > 0 && rope->rot_dim % 2 == 0 && rope->rot_dim <= head_dim);
    PT_ASSERT(k && v && kv->n_kv == n_kv && kv->head_dim == head_dim);
    if (kv->bits && rope_kv_fused()) /* quantized caches: kv_quant.cu's kernel */
        return pt_cuda_rope_qk_kv_append_q(be, q, k, v, T, n_heads, pos, rope, kv);
    if (kv->bits || !rope_kv_fused()) {
        PT_TRY(pt_cuda_rope_qk(be, q, k, T, n_heads, n_kv, head_dim, pos, rope));
        return pt_cuda_kv_append(be, kv, k, v, T, pos);
    }
    const int half = rope->rot_dim / 2;
    const int64_t n = T * (n_heads + n_kv) * half + T * n_kv * head_dim;
    if (n <= 0) return PT_OK;
    const unsigned blocks = pt_cuda_blocks(n, 256);
    const int bf = pt_cuda_bf(be);
    switch (kv->dtype) {
    case PT_FT_F32:
        pt_launch(rope_kv_kernel<float>, dim3(blocks), dim3(256), 0, c->stream, pt_pdl_chain(), q, k, v, T, n_heads,
                  n_kv, head_dim, pos, half, (const float *)rope->inv_freq, rope->attn_scale, bf, (float *)kv->k,
                  (float *)kv->v, kv->capacity);
        break;
    case PT_FT_BF16:
        pt_launch(rope_kv_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), 0, c->stream, pt_pdl_chain(), q, k, v, T,
                  n_heads, n_kv, head_dim, pos, half, (const float *)rope->inv_freq, rope->attn_scale, bf,
                  (__nv_bfloat16 *)kv->k, (__nv_bfloat16 *)kv->v, kv->capacity);
        break;
    case PT_FT_F16:
        pt_launch(rope_kv_kernel<__half>, dim3(blocks), dim3(256), 0, c->stream, pt_pdl_chain(), q, k, v, T, n_heads,
                  n_kv, head_dim, pos, half, (const float *)rope->inv_freq, rope->attn_scale, bf, (__half *)kv->k,
                  (__half *)kv->v, kv->capacity);
        break;
    }
    CUDA_CHECK_LAUNCH("rope_kv_append");
    return PT_OK;
}
