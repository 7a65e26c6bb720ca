/* rope and rope_qk (backend.h): rotate-half (NeoX) RoPE in place over the
 * first rot_dim dims of each head, at positions read from device memory (so
 * a captured decode graph replays with new positions). cos/sin are computed
 * from the model spec's inv_freq table in f32, scaled by attn_scale and, in
 * bf16 mode, rounded like the reference's tables; the two products are each
 * rounded, then their sum (cpu_ops.c is the reference). One thread per pair.
 * rope_qk rotates a layer's query heads and key heads in one launch: the
 * heads of a token are numbered q heads first, then k heads, and every pair
 * is computed by the same code as in rope, so the bits are the same as two
 * rope calls. */
#include "backend/cuda/cuda_internal.cuh"

/* Pairs: T · (nh + nkv) · half; pair i is dim d = i % half of head h of
 * token t, (t, h) = divmod(i / half, nh + nkv); heads h >= nh are k's. */
__global__ void rope_kernel(float *q, float *k, int64_t T, int nh, int nkv, int hd, const int32_t *pos, int half,
                            const float *inv_freq, float attn_scale, int bf) {
    const int nht = nh + nkv;
    const int64_t n = T * nht * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % half);
        const int64_t th_ = i / half; /* token·head */
        const int64_t t = th_ / nht;
        const int h = (int)(th_ % nht);
        const float th = (float)pos[t] * inv_freq[d];
        /* cosf/sinf (not the fast intrinsics): exact argument reduction for
         * large positions, as the C library does. */
        const float cs = pt_rnd(bf, cosf(th) * attn_scale), sn = pt_rnd(bf, sinf(th) * attn_scale);
        float *v = h < nh ? q + (t * nh + h) * hd : k + (t * nkv + (h - nh)) * hd;
        const float a = v[d], b = v[d + half];
        v[d] = pt_rnd(bf, pt_rnd(bf, a * cs) + pt_rnd(bf, -b * sn));
        v[d + half] = pt_rnd(bf, pt_rnd(bf, b * cs) + pt_rnd(bf, a * sn));
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
    rope_kernel<<<pt_cuda_blocks(n, 256), 256, 0, c->stream>>>(q, k, T, n_heads, n_kv, head_dim, pos, half,
                                                              rope->inv_freq, rope->attn_scale, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("rope");
    return PT_OK;
}

pt_status pt_cuda_rope(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                       const pt_rope *rope) {
    return pt_cuda_rope_qk(be, x, NULL, T, n_heads, 0, head_dim, pos, rope);
}
