/* Device helpers for MLX affine-quantized weights: loading one 32-value chunk
 * of a packed row (BITS uint32 words, LSB-first, values may span words for
 * 3/5/6 bits) and extracting code j of it, from either device layout of a
 * weight: the MLX layout as uploaded, or the tensor-core layout that the
 * decode GEMV reads (gemv_tc.cu; layout below). Shared by matmul.cu (GEMV
 * and the dequantize-to-tile path) and elementwise.cu (quantized embedding
 * rows), which read any row through pt_qw_chunk / pt_qw_sb. */
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

/* A dense 16-byte row chunk's multiply-adds: acc[r][n] += the VEC values
 * of w[r] · x row n's values c·VEC + i (x + n·xs), i in order, each value
 * converted where it is used; x read by 16-byte loads first (XV: the
 * fewest registers for many rows) or value by value where it is used (the
 * fewest for few rows). Either reads the same values, so the same bits. */
template <typename WT, int VEC, int NR, int NT, bool XV>
__device__ __forceinline__ void pt_dense_chunk_fma(float (&acc)[NR][NT], const uint4 (&w)[NR], const float *x,
                                                   int64_t xs, int64_t c) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const float *xp = x + n * xs + c * VEC;
        float xv[VEC];
        if constexpr (XV) {
#pragma unroll
            for (int i = 0; i < VEC / 4; i++) {
                const float4 v = __ldg(reinterpret_cast<const float4 *>(xp) + i);
                xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const WT *h = reinterpret_cast<const WT *>(&w[r]);
#pragma unroll
            for (int i = 0; i < VEC; i++) acc[r][n] = fmaf((float)h[i], XV ? xv[i] : __ldg(xp + i), acc[r][n]);
        }
    }
}

/* acc[r][n] += the lane's part of dense row rp[r] · x row n (x + n·xs):
 * the VEC-element chunks lane, lane + 32, ... of nv in order, one fma
 * chain per (row, x row); the caller adds the warp's lanes. VEC == 1 reads
 * scalars (any K); otherwise 16-byte chunks (rows and x 16-byte aligned),
 * and with U > 1 the loads of U chunks of every row are issued before
 * their multiply-adds, which then run chunk by chunk in the same order: U
 * changes no bit, only the loads in flight; XV as pt_dense_chunk_fma's
 * (VEC > 1). The one dot of a dense weight row on the decode path:
 * gemv_dense_kernel (matmul.cu) and the dense MoE expert kernels
 * (moe_dense.cu), so those give the same bits. */
template <typename WT, int VEC, int NR, int NT, int U, bool XV = false>
__device__ __forceinline__ void pt_dense_rows_dot(float (&acc)[NR][NT], const WT *const (&rp)[NR], const float *x,
                                                  int64_t xs, int64_t nv, int lane) {
    static_assert(VEC * sizeof(WT) == 16 || (VEC == 1 && U == 1), "16-byte chunks, or scalars one at a time");
    int64_t c = lane;
    if constexpr (VEC == 1) {
        for (; c < nv; c += 32) {
            float wv[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) wv[r] = (float)rp[r][c];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float xv = __ldg(x + n * xs + c);
#pragma unroll
                for (int r = 0; r < NR; r++) acc[r][n] = fmaf(wv[r], xv, acc[r][n]);
            }
        }
    } else {
        if constexpr (U > 1) {
            for (; c + 32 * (U - 1) < nv; c += 32 * U) {
                uint4 raw[U][NR];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int r = 0; r < NR; r++) raw[u][r] = __ldg(reinterpret_cast<const uint4 *>(rp[r]) + c + 32 * u);
#pragma unroll
                for (int u = 0; u < U; u++) pt_dense_chunk_fma<WT, VEC, NR, NT, XV>(acc, raw[u], x, xs, c + 32 * u);
            }
        }
        for (; c < nv; c += 32) {
            uint4 raw[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) raw[r] = __ldg(reinterpret_cast<const uint4 *>(rp[r]) + c);
            pt_dense_chunk_fma<WT, VEC, NR, NT, XV>(acc, raw, x, xs, c);
        }
    }
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
/* Whether the grouped tensor-core kernel takes w (4/8-bit with bf16 scales,
 * or dense bf16; K % 64 == 0, no bias, bf16 mode). */
int pt_cuda_gemm_tc_ok(const pt_cuda *c, const pt_matrix *w);
/* Grouped mode for the MoE prefill: x [rows, K] bf16 sorted by expert; block
 * i computes y rows [tiles[i].x, tiles[i].y) (at most 128) against expert
 * tiles[i].z of the stack w (quantized, or dense bf16 read in place); y rows
 * ldy apart (no bias; bf16 rounding). */
pt_status pt_cuda_gemm_tc_grouped(pt_cuda *c, float *y, int64_t ldy, const bf16 *x, int64_t rows, const pt_matrix *w,
                                  const int4 *tiles, int64_t ntiles);

/* ---- The tensor-core ("tc") layout --------------------------------------
 * Applied at upload (gemv_tc_repack.cu, pt_cuda_tc_pack) to 4- and 8-bit weights
 * with bf16 scales in bf16 activation mode when K·bits/4 is a multiple of 64.
 * A row is a sequence of K2 = K·bits/4 nibbles: the 4-bit codes, or each
 * 8-bit code as its low then its high nibble. Rows are cut into tiles of 16
 * (each expert's rows padded to a multiple of 16 with zero codes), a tile's
 * nibbles into blocks of 64 (16 rows × 64 nibbles = 512 bytes):
 *   codes u32 [E·tiles][K2/64 blocks][32 lanes][4 words]
 * Word m of lane (g = lane/4, t = lane%4) holds the 8 nibbles of the m-th
 * mma.m16n8k16 of the block: nibble position P[sub] + h (P = {0, 4, 2, 6})
 * is element 16m + 4t + sub of row 16·tile + g + 8h. So one 16-byte load per
 * lane yields the A fragments of 4 mmas (pair j = nibbles j and j+4), and a
 * warp's load of a block is 512 contiguous bytes.
 *   sb u32 [E·tiles][K/gs groups][8 g][2 h]: bf16 scale | bf16 bias << 16
 * of row 16·tile + g + 8h (pt_cuda_weight.scales; .biases is NULL). */
struct pt_qw {
    const uint32_t *codes;
    const void *scales, *biases; /* tc: scales = the sb words */
    pt_ftype st;                 /* scale dtype (MLX layout) */
    int64_t K, N;                /* columns; rows of one expert */
    int gs, tc;
};

__device__ __forceinline__ int64_t pt_qw_tile(const pt_qw &q, int64_t row, int &g, int &h) {
    const int64_t e = row / q.N, r = row % q.N;
    g = (int)(r & 7);
    h = (int)((r >> 3) & 1);
    return e * ((q.N + 15) / 16) + r / 16;
}

/* The view of a prepared quantized weight (host side). */
static inline pt_qw pt_qw_of(const pt_matrix *w) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    pt_qw q;
    q.codes = (const uint32_t *)cw->data;
    q.scales = cw->scales;
    q.biases = cw->biases;
    q.st = w->dtype;
    q.K = w->cols;
    q.N = w->rows;
    q.gs = w->group_size;
    q.tc = cw->tc;
    return q;
}

/* Nibble of element sub (0..3) of row half h in a tc word. */
__device__ __forceinline__ uint32_t pt_tc_nib(uint32_t w, int sub, int h) {
    const int pos = (sub == 0 ? 0 : sub == 1 ? 4 : sub == 2 ? 2 : 6) + h;
    return (w >> (4 * pos)) & 15u;
}

/* Chunk c (32 values) of global row `row` (expert · N + r) in the MLX word
 * format, from either layout. */
template <int BITS>
__device__ __forceinline__ void pt_qw_chunk(uint32_t (&w)[BITS], const pt_qw &q, int64_t row, int64_t c) {
    if constexpr (BITS == 4 || BITS == 8) {
        if (q.tc) {
            int g, h;
            const int64_t tile = pt_qw_tile(q, row, g, h), nbk = q.K * BITS / 256;
            if constexpr (BITS == 4) { /* chunk = half of block c/2: mmas 2·half, 2·half + 1 */
                const uint32_t *base = q.codes + (tile * nbk + (c >> 1)) * 128 + g * 16 + 2 * (c & 1);
                uint2 v[4];
#pragma unroll
                for (int t = 0; t < 4; t++) v[t] = __ldg(reinterpret_cast<const uint2 *>(base + 4 * t));
#pragma unroll
                for (int i = 0; i < 4; i++) { /* values 8i .. 8i+7: mma i/2, lanes t = 2(i%2), +1 */
                    uint32_t o = 0;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const uint2 vt = v[2 * (i & 1) + (j >> 2)];
                        o |= pt_tc_nib((i >> 1) ? vt.y : vt.x, j & 3, h) << (4 * j);
                    }
                    w[i] = o;
                }
            } else { /* chunk = block c: value k is nibbles 2k, 2k+1 */
                const uint32_t *base = q.codes + (tile * nbk + c) * 128 + g * 16;
                uint4 v[4];
#pragma unroll
                for (int t = 0; t < 4; t++) v[t] = __ldg(reinterpret_cast<const uint4 *>(base + 4 * t));
#pragma unroll
                for (int i = 0; i < 8; i++) { /* values 4i .. 4i+3: mma i/2, lanes t = 2(i%2) + j/2 */
                    uint32_t o = 0;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint4 vt = v[2 * (i & 1) + (j >> 1)];
                        const int m = i >> 1;
                        const uint32_t wd = m == 0 ? vt.x : m == 1 ? vt.y : m == 2 ? vt.z : vt.w;
                        const int p = j & 1;
                        o |= (pt_tc_nib(wd, 2 * p, h) | pt_tc_nib(wd, 2 * p + 1, h) << 4) << (8 * j);
                    }
                    w[i] = o;
                }
            }
            return;
        }
    }
    pt_q_load<BITS>(w, q.codes + row * (q.K * BITS / 32), c);
}

/* Scale and bias of group gi of global row `row`, from either layout. */
__device__ __forceinline__ void pt_qw_sb(const pt_qw &q, int64_t row, int64_t gi, float &s, float &b) {
    const int64_t G = q.K / q.gs;
    if (q.tc) {
        int g, h;
        const int64_t tile = pt_qw_tile(q, row, g, h);
        const uint32_t v = __ldg(reinterpret_cast<const uint32_t *>(q.scales) + ((tile * G + gi) * 8 + g) * 2 + h);
        s = __uint_as_float(v << 16);
        b = __uint_as_float(v & 0xFFFF0000u);
    } else {
        s = pt_ld(q.st, q.scales, row * G + gi);
        b = pt_ld(q.st, q.biases, row * G + gi);
    }
}

/* x for codes read in place (the magic-number conversion of the 4-bit
 * GEMVs: code i of a 16-bit half, OR-ed into 2^23 where it sits, is worth
 * q·16^i): value i of a float4 times 16^-i, exact (a power of two); 8-bit
 * codes are moved to the low byte, so x as it is. */
template <int BITS>
__device__ __forceinline__ float4 pt_x_inplace(float4 v) {
    if constexpr (BITS == 4) v.y *= 0.0625f, v.z *= 0.00390625f, v.w *= 0.000244140625f;
    return v;
}

/* One element of the gated activation (backend.h glu): act(g)·u, with
 * act(g) rounded, then the product (bf: bf16 mode). The one definition
 * behind glu_kernel (elementwise.cu) and the GLU epilogue of the gate/up
 * GEMV (gemv_tc.cu, pt_cuda_tc_gemv_glu): the same inlined code in both, so
 * the compiler emits the same operations and the fused path's bits equal
 * the separate GLU's. silu and gelu_tanh keep the expressions glu_kernel
 * has always had (expf / tanhf, IEEE division). */
__device__ __forceinline__ float pt_silu(float g) { return g / (1.0f + expf(-g)); }
__device__ __forceinline__ float pt_gelu_tanh(float g) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}
__device__ __forceinline__ float pt_glu_val(int fn, float g, float u, int bf) {
    const float a = fn == PT_GLU_SILU ? pt_silu(g) : pt_gelu_tanh(g);
    return pt_rnd(bf, pt_rnd(bf, a) * u);
}

#endif
