/* The arithmetic of one rotate-half RoPE pair, shared by every CUDA kernel
 * that rotates: rope.cu (rope, rope_qk, rope_qk_kv_append), batch_decode.cu
 * (the batched rows' key append) and the decode attention that folds the
 * rotation in (attention_dec2.cuh, attention_short.cu). Their outputs are
 * compared bit for bit (test_cuda_ropekv, test_cuda_batch), so the table
 * value and the rotation are written once, here; cpu_ops.c is the
 * reference. */
#ifndef PT_BACKEND_CUDA_ROPE_MATH_CUH
#define PT_BACKEND_CUDA_ROPE_MATH_CUH

#include "backend/cuda/cuda_internal.cuh"

/* The table's cos and sin at angle th = position · inv_freq[d], scaled by
 * the attention scale folded into the rotation and, in bf16 mode (bf),
 * rounded as the reference's tables. cosf/sinf, not the fast intrinsics:
 * exact argument reduction for large positions, as the C library does. */
__device__ __forceinline__ float pt_rope_cos(float th, float scale, int bf) { return pt_rnd(bf, cosf(th) * scale); }
__device__ __forceinline__ float pt_rope_sin(float th, float scale, int bf) { return pt_rnd(bf, sinf(th) * scale); }

/* The pair (a, b) = (x[d], x[d + half]) rotated: a·cos − b·sin into d and
 * b·cos + a·sin into d + half, each product rounded, then their sum. */
__device__ __forceinline__ float pt_rope_lo(float a, float b, float cs, float sn, int bf) {
    return pt_rnd(bf, pt_rnd(bf, a * cs) + pt_rnd(bf, -b * sn));
}
__device__ __forceinline__ float pt_rope_hi(float a, float b, float cs, float sn, int bf) {
    return pt_rnd(bf, pt_rnd(bf, b * cs) + pt_rnd(bf, a * sn));
}

#endif
