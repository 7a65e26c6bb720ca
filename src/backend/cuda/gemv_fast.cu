/* matmul's decode GEMV for one token of 4- or 8-bit codes in the MLX layout
 * (matmul_gemv.cuh: pt_cuda_gemv_fast), which matmul.cu's FMA path
 * (launch_gemv) tries first for T = 1 items: gemv_fast_kernel with its
 * launch shape (warps per row group, rows per block) and the
 * PETREL_CUDA_GEMV_TUNE override. Same products and accumulation order as
 * matmul.cu's gemv_q_kernel.
 * Not here: the other GEMV kernels, the tensor-core GEMVs and the matmul
 * entry points (matmul.cu, gemv_mma.cuh, gemv_tc.cu), the GEMM path. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_gemv.cuh"

#include <stdio.h>
#include <stdlib.h>

/* ---- the decode GEMV for 4- and 8-bit codes (one token) ---------------------
 * The code → float conversion is the cost that keeps a plain GEMV from the
 * bandwidth limit (an int→float convert runs at a quarter of the FMA rate).
 * Instead each code is OR-ed into the mantissa of 2^23 and 2^23 subtracted,
 * which is exact: 4-bit codes stay in place inside each 16-bit half of the
 * word (code i of a half is worth q·16^i), so the matching x is multiplied by
 * 16^-i as it is loaded — a power of two, so every product q·x is the same
 * float as in gemv_q_kernel; 8-bit codes are moved into place with one byte
 * permute. About three instructions per value (mask-or, subtract, fma)
 * instead of ~7. x is read through L1 (shared by the warp's ROWS rows), the
 * next chunk's weights are loaded before the current one is consumed, and
 * the accumulation order matches gemv_q_kernel: per 32-value chunk, then
 * scale·Σqx + bias·Σx. */
#define FAST_MAX_WARPS 8

/* Block = W warps (blockDim.x = 32·W) sharing ROWS rows: the row's chunks are
 * dealt to all 32·W lanes (split-K inside the block), so a narrow matrix
 * still puts enough loads in flight on every SM; the W partial sums of a
 * row are added in warp order through shared memory (deterministic). */
template <int BITS, int ROWS>
__global__ void __launch_bounds__(FAST_MAX_WARPS * 32) gemv_fast_kernel(gemv_args a) {
    __shared__ float red[FAST_MAX_WARPS][ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int64_t b = blockIdx.y;
    bool eok;
    const int64_t e = item_expert(a, b, eok);
    const int64_t rl0 = (int64_t)blockIdx.x * ROWS;
    const int64_t K = a.K;
    const float4 *xg = reinterpret_cast<const float4 *>(a.x + (b / a.x_div) * K);
    constexpr int VPC = 128 / BITS; /* values per 16-byte chunk: 32 or 16 */
    const int64_t wpr = K * BITS / 32, ngroups = K / a.gs, nchunks = K / VPC;
    const uint4 *rowp[ROWS];
    int64_t grow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int64_t rl = rl0 + r < a.nrows ? rl0 + r : rl0;
        grow[r] = e * a.rows + a.row0 + rl;
        rowp[r] = reinterpret_cast<const uint4 *>((const uint32_t *)a.data + grow[r] * wpr);
    }
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.f;
    const float MAGIC = 8388608.0f;
    const bool bf_scales = a.st == PT_FT_BF16;
    const int64_t step = 32 * (int64_t)W;
    const int64_t c0 = warp * 32 + lane;
    uint4 wn[ROWS];
    if (c0 < nchunks)
#pragma unroll
        for (int r = 0; r < ROWS; r++) wn[r] = __ldg(rowp[r] + c0);
    for (int64_t c = c0; c < nchunks; c += step) {
        uint4 w[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) w[r] = wn[r];
        if (c + step < nchunks) /* prefetch: the next chunk's loads overlap this chunk's arithmetic */
#pragma unroll
            for (int r = 0; r < ROWS; r++) wn[r] = __ldg(rowp[r] + c + step);
        float sc[ROWS], bi[ROWS];
        const int64_t g = c * VPC / a.gs;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int64_t gi = grow[r] * ngroups + g;
            if (bf_scales) {
                sc[r] = __bfloat162float(((const __nv_bfloat16 *)a.scales)[gi]);
                bi[r] = __bfloat162float(((const __nv_bfloat16 *)a.biases)[gi]);
            } else {
                sc[r] = pt_ld(a.st, a.scales, gi);
                bi[r] = pt_ld(a.st, a.biases, gi);
            }
        }
        float d[ROWS], sx = 0.f;
#pragma unroll
        for (int r = 0; r < ROWS; r++) d[r] = 0.f;
#pragma unroll
        for (int q = 0; q < VPC / 4; q++) {
            const float4 xv = __ldg(xg + c * (VPC / 4) + q);
            sx += xv.x + xv.y + xv.z + xv.w;
            const float4 xp = pt_x_inplace<BITS>(xv);
            const float xr[4] = {xp.x, xp.y, xp.z, xp.w};
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int wi = BITS == 4 ? q >> 1 : q;
                const uint32_t word = wi == 0 ? w[r].x : wi == 1 ? w[r].y : wi == 2 ? w[r].z : w[r].w;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    uint32_t bits;
                    if constexpr (BITS == 4) {
                        const uint32_t half = (q & 1) ? word >> 16 : word;
                        bits = (half & (0xFu << (4 * i))) | 0x4B000000u;
                    } else {
                        bits = __byte_perm(word, 0x4B000000u, (unsigned)(i | (4 << 4) | (5 << 8) | (7 << 12)));
                    }
                    d[r] = fmaf(__uint_as_float(bits) - MAGIC, xr[i], d[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] += sc[r] * d[r] + bi[r] * sx;
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const float v = pt_warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < ROWS && rl0 + threadIdx.x < a.nrows) {
        const int r = threadIdx.x;
        float v = 0.f;
        for (int w = 0; w < W; w++) v += red[w][r];
        /* the row index recomputed: grow[] indexed by a thread-dependent r
         * would move to local memory */
        if (a.bias) v += pt_ld(a.bt, a.bias, e * a.rows + a.row0 + rl0 + r);
        a.y[b * a.ldy + rl0 + r] = eok ? pt_rnd(a.bf, v) : 0.f;
    }
}

template <int BITS, int ROWS>
static pt_status launch_fast(const pt_cuda *c, const gemv_args &a, int64_t B, int W) {
    dim3 grid((unsigned)((a.nrows + ROWS - 1) / ROWS), (unsigned)B);
    gemv_fast_kernel<BITS, ROWS><<<grid, W * 32, 0, c->stream>>>(a);
    CUDA_CHECK_LAUNCH("gemv (4/8-bit)");
    return PT_OK;
}

/* Shape knobs of the fast kernel: chunks per lane before W grows (cpl),
 * resident warps per SM aimed at (occ), most rows per block (max_rows: 1, 2,
 * 4 or 8). Defaults 2, 24, 4; PETREL_CUDA_GEMV_TUNE="cpl,occ,max_rows"
 * overrides them for the A/B runs of the op benchmark (read once, at the
 * first matmul; an unparsable value keeps the defaults). */
struct gemv_tune {
    int cpl, occ, max_rows;
};
static gemv_tune fast_tune(void) {
    static gemv_tune t = {0, 0, 0};
    if (t.cpl == 0) {
        gemv_tune d = {2, 24, 4};
        const char *e = getenv("PETREL_CUDA_GEMV_TUNE");
        int a, b, r;
        if (e && sscanf(e, "%d,%d,%d", &a, &b, &r) == 3 && a >= 1 && a <= 64 && b >= 1 && b <= 64 &&
            (r == 1 || r == 2 || r == 4 || r == 8))
            d = gemv_tune{a, b, r};
        t = d;
    }
    return t;
}

/* The fast kernel applies to one token per item, 4/8-bit codes and a 16-byte
 * aligned x. Returns PT_ERR_UNSUPPORTED (no message) otherwise.
 * Shape choice: W warps per row group so every lane gets >= cpl chunks (up
 * to 8 warps), then the most rows per block (max_rows, ..., 2, 1) that still
 * gives ~occ warps per SM; if even one row per block falls short, W grows to
 * one chunk per lane. */
pt_status pt_cuda_gemv_fast(const pt_cuda *c, const gemv_args &a, int bits, int64_t B, int64_t shape_B) {
    if ((bits != 4 && bits != 8) || (uintptr_t)a.x % 16 || a.q.tc) return PT_ERR_UNSUPPORTED;
    const gemv_tune tu = fast_tune();
    const int64_t nchunks = a.K * bits / 128, target = tu.occ * (int64_t)c->sm_count;
    /* the launch shape is chosen for shape_B items (B itself for a plain
     * call; 1 for matmul_rows, so its rows reduce as a T = 1 call does) */
    const int64_t B_launch = B;
    B = shape_B;
    int W = 1;
    while (W < FAST_MAX_WARPS && nchunks >= 32LL * tu.cpl * W * 2) W *= 2;
    int rows = 1;
    for (int r = tu.max_rows; r >= 2; r /= 2)
        if (B * (a.nrows / r) * W >= target) {
            rows = r;
            break;
        }
    if (rows == 1)
        while (W < FAST_MAX_WARPS && nchunks >= 32LL * W * 2 && B * a.nrows * W < target) W *= 2;
    B = B_launch;
    if (bits == 4) {
        if (rows == 8) return launch_fast<4, 8>(c, a, B, W);
        if (rows == 4) return launch_fast<4, 4>(c, a, B, W);
        if (rows == 2) return launch_fast<4, 2>(c, a, B, W);
        return launch_fast<4, 1>(c, a, B, W);
    }
    if (rows == 8) return launch_fast<8, 8>(c, a, B, W);
    if (rows == 4) return launch_fast<8, 4>(c, a, B, W);
    if (rows == 2) return launch_fast<8, 2>(c, a, B, W);
    return launch_fast<8, 1>(c, a, B, W);
}
