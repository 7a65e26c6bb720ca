/* Device helpers for MLX affine-quantized weights: loading one 32-value chunk
 * of a packed row (BITS uint32 words, LSB-first, values may span words for
 * 3/5/6 bits) and extracting code j of it. Shared by matmul.cu (GEMV and the
 * dequantize-to-tile path) and elementwise.cu (quantized embedding rows). */
#ifndef PT_BACKEND_CUDA_MATMUL_CUH
#define PT_BACKEND_CUDA_MATMUL_CUH

#include "backend/cuda/cuda_internal.cuh"

/* Loads the BITS words of 32-value chunk `c` of a row (row 16-byte aligned
 * for BITS 4/8, 8-byte for 2/6, 4-byte for 3/5: guaranteed since rows are
 * cols·BITS/8 bytes with cols a multiple of 32). 16-byte loads for 4/8 bits. */
template <int BITS>
__device__ __forceinline__ void pt_q_load(uint32_t (&w)[BITS], const uint32_t *row, int64_t c) {
    const uint32_t *p = row + c * BITS;
    if constexpr (BITS % 4 == 0) {
#pragma unroll
        for (int i = 0; i < BITS / 4; i++) {
            uint4 v = __ldg(reinterpret_cast<const uint4 *>(p) + i);
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
    } else if constexpr (BITS % 2 == 0) {
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) {
            uint2 v = __ldg(reinterpret_cast<const uint2 *>(p) + i);
            w[2 * i] = v.x; w[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < BITS; i++) w[i] = __ldg(p + i);
    }
}

/* Code j (0..31) of a loaded chunk; j is a compile-time constant after
 * unrolling, so the shifts and the word-spanning case fold away. */
template <int BITS>
__device__ __forceinline__ uint32_t pt_q_code(const uint32_t (&w)[BITS], int j) {
    const int bit = j * BITS, wi = bit >> 5, sh = bit & 31;
    uint32_t q = w[wi] >> sh;
    if (sh + BITS > 32) q |= w[wi + 1] << (32 - sh);
    return q & ((1u << BITS) - 1u);
}

/* Rows [row_begin, row_begin + nrows) of a quantized weight (2-8 bit; rows
 * of an expert stack counted across experts) dequantized to bf16 [nrows,
 * cols] at out, enqueued on the backend's stream (matmul.cu; moe.cu's
 * grouped prefill uses it). */
pt_status pt_cuda_dequant_bf16(pt_cuda *c, bf16 *out, const pt_matrix *w, int64_t row_begin, int64_t nrows);

/* gemm_tc.cu: y[T, N] = x[T, K] · W[expert]ᵀ (+ bias, bf16 rounding) on the
 * tensor cores with the dequantization in shared memory, x bf16 [T, K]
 * (16-byte aligned). 4/8-bit, bf16 scales, K % 64 == 0, bf16 activation
 * mode; PT_ERR_UNSUPPORTED (no message) otherwise. */
pt_status pt_cuda_gemm_tc(pt_cuda *c, float *y, const bf16 *x, int64_t T, const pt_matrix *w, int64_t expert);
/* Whether the tensor-core kernel takes w (4/8-bit, bf16 scales, K % 64 == 0,
 * no bias, bf16 mode). */
int pt_cuda_gemm_tc_ok(const pt_cuda *c, const pt_matrix *w);
/* Grouped mode for the MoE prefill: x [rows, K] bf16 sorted by expert; block
 * i computes y rows [tiles[i].x, tiles[i].y) (at most 128) against expert
 * tiles[i].z of the stack w; y rows ldy apart (no bias; bf16 rounding). */
pt_status pt_cuda_gemm_tc_grouped(pt_cuda *c, float *y, int64_t ldy, const bf16 *x, int64_t rows, const pt_matrix *w,
                                  const int4 *tiles, int64_t ntiles);

#endif
