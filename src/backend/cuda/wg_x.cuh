/* The wgmma GEMV's prepared-x layout, for the kernels that write it: the x
 * prepare (tc_xprep_kernel, tc_xprep_norm_kernel) and the producers that
 * hand their output on as the next GEMV's x (the GLU launch's epilogue,
 * gemv_wg_kernel.cuh; the batched rows' attention, attention_short.cu;
 * gemv_tc.cu XO). Each 64-value unit of a row of K is [4 k16 steps][2 k
 * halves][ncol rows][16 bytes] of bf16, then Σx [ncol] f32 of the unit's
 * values (tc_xprep_kernel's order: each step of 8 values as
 * ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the 8 steps as
 * the same tree). */
#ifndef PT_BACKEND_CUDA_WG_X_CUH
#define PT_BACKEND_CUDA_WG_X_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t tc_bf2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The wg layout (xl 2): the byte offset in a stage of row n's 4-byte word
 * holding values kk, kk + 1 (kk ≡ 0 mod 4) — k half 0 of k16 step
 * (kk mod 64) / 16, lane (kk mod 16) / 4; values kk + 2, kk + 3 are in k
 * half 1, ncol·16 bytes on. */
__device__ __forceinline__ int64_t tc_wg_xoff(int kk, int n, int ncol) {
    return (int64_t)((kk & 63) >> 4) * ncol * 32 + (int64_t)n * 16 + ((kk & 15) >> 2) * 4;
}

/* A producer's value v of unit value k (0..63) of row n, on the lane of
 * k within a warp's run of consecutive k (lane bits 0..2 = k's bits 0..2):
 * the even lane stores the bf16 pair (k, k + 1) into the unit at u; returns
 * the sum of the 8 values of k's step in tc_xprep_kernel's tree, on every
 * lane of the step alike (an xor butterfly over lanes 1, 2, 4; IEEE
 * addition commutes, so the lanes agree bit for bit). Every lane of the
 * warp takes part (the shuffles); store: whether this lane's pair is
 * written. */
__device__ __forceinline__ float wg_x_put(char *u, int k, int n, int ncol, float v, bool store) {
    const float v1 = __shfl_xor_sync(0xffffffffu, v, 1);
    if (store && !(k & 1))
        *reinterpret_cast<uint32_t *>(u + tc_wg_xoff(k & ~3, n, ncol) + ((k & 2) ? ncol * 16 : 0)) = tc_bf2(v, v1);
    float s = __fadd_rn(v, v1);
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
    return __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4));
}

/* Σx of row n in unit u (after its ncol·128 bytes of values) */
__device__ __forceinline__ float *wg_x_sum(char *u, int n, int ncol) { return reinterpret_cast<float *>(u + ncol * 128) + n; }

#endif
