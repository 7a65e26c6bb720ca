/* rope (backend.h): rotate-half (NeoX) RoPE in place over the first rot_dim
 * dims of each head, at positions read from device memory (so a captured
 * decode graph replays with new positions). cos/sin are computed from the
 * model spec's inv_freq table in f32, scaled by attn_scale and, in bf16 mode,
 * rounded like the reference's tables; the two products are each rounded,
 * then their sum (cpu_ops.c is the reference). One thread per pair. */
#include "backend/cuda/cuda_internal.cuh"

__global__ void rope_kernel(float *x, int64_t T, int nh, int hd, const int32_t *pos, int half, const float *inv_freq,
                            float attn_scale, int bf) {
    const int64_t n = T * nh * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % half);
        const int64_t th_ = i / half; /* token·head */
        const int64_t t = th_ / nh;
        const float th = (float)pos[t] * inv_freq[d];
        /* cosf/sinf (not the fast intrinsics): exact argument reduction for
         * large positions, as the C library does. */
        const float cs = pt_rnd(bf, cosf(th) * attn_scale), sn = pt_rnd(bf, sinf(th) * attn_scale);
        float *v = x + th_ * hd;
        const float a = v[d], b = v[d + half];
        v[d] = pt_rnd(bf, pt_rnd(bf, a * cs) + pt_rnd(bf, -b * sn));
        v[d + half] = pt_rnd(bf, pt_rnd(bf, b * cs) + pt_rnd(bf, a * sn));
    }
}

pt_status pt_cuda_rope(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                       const pt_rope *rope) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(rope->rot_dim > 0 && rope->rot_dim % 2 == 0 && rope->rot_dim <= head_dim);
    const int half = rope->rot_dim / 2;
    const int64_t n = T * n_heads * half;
    if (n == 0) return PT_OK;
    rope_kernel<<<pt_cuda_blocks(n, 256), 256, 0, c->stream>>>(x, T, n_heads, head_dim, pos, half, rope->inv_freq,
                                                              rope->attn_scale, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("rope");
    return PT_OK;
}
