/* matmul (backend.h): y[T, N] = x[T, K] · Wᵀ (+ bias) for dense (bf16, f16,
 * f32) and MLX affine-quantized (2/3/4/5/6/8-bit, group 32/64/128) weights
 * kept on the device in their packed layout.
 *
 * Paths:
 *  - tensor-core GEMV (gemv_tc.cu; T <= 64, bf16 activations, 4/8-bit
 *    weights repacked at upload into its layout, matmul.cuh): all T rows in
 *    one launch, batch-invariant; matmul_rows runs it 64 rows at a time.
 *  - the previous tensor-core GEMV (gemv_mma.cuh; T <= 8) for 4/8-bit
 *    weights kept in the MLX layout (PETREL_CUDA_REPACK=0, for A/B).
 *  - GEMV (T <= 8, other weights and f32 mode): one warp computes PT_GEMV_ROWS rows;
 *    each lane streams 32-value chunks of the packed row (16-byte loads for
 *    4/8-bit) and reuses the loaded codes for every token of the batch;
 *    f32 accumulation in the factored form per chunk: scale·Σq·x + bias·Σx.
 *    The grid is rows/(4 warps · PT_GEMV_ROWS) blocks per item, enough to
 *    fill 132 SMs for every projection of a 1B+ model. One token of 4/8-bit
 *    codes takes the decode GEMV of gemv_fast.cu instead (pt_cuda_gemv_fast).
 *  - GEMM (T > 8, or > 64 on the tensor-core layout; prefill): the weight is dequantized (or converted) in row
 *    tiles into scratch and multiplied with cuBLAS: bf16 × bf16 → f32 with
 *    f32 accumulation in bf16 activation mode (the input, already bf16
 *    values, converts exactly); f32 × f32 (no TF32) in f32 mode. cuBLAS
 *    runs these at ~750 TFLOP/s on the H200, so the costs around it are the
 *    dequantize (one 32-bit code word per thread, 16-byte stores) and the
 *    f32 → bf16 and rounding passes (16 bytes per thread). The fused
 *    tensor-core kernel (gemm_tc.cu, dequantization in shared memory) is
 *    selectable for A/B (PETREL_CUDA_TC_MAX_T) but measured slower than
 *    cuBLAS at every shape (bench/RESULTS.md), so it is off by default.
 * Either way the output is rounded once, after the bias, in bf16 mode.
 *
 * matmul_multi (several weights over one x: q/k/v, gate/up) runs the
 * weights as one grouped tensor-core GEMV launch when they all take that
 * path with one bits, group size and K and T <= 64 (bit-identical to the
 * separate launches); above 64 rows, when every weight takes the bf16 GEMM
 * path, it converts x to bf16 once for all of them; otherwise it makes the
 * separate calls.
 *
 * Not here: the one-token 4/8-bit decode GEMV (gemv_fast.cu; its argument
 * block, gemv_args, in matmul_gemv.cuh), the tensor-core GEMV on the
 * repacked layout (gemv_tc.cu), attention, MoE routing (moe.cu uses
 * pt_cuda_gemv_items). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_tc.cuh"

#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PT_GEMV_MAX_T 8   /* the FMA and MLX-layout kernels: tokens per launch */
#define PT_TC_MAX_T 64    /* the tensor-core GEMV (gemv_tc.cu): rows per launch */
#define PT_GEMV_ROWS 2    /* rows per warp: the x loads are shared between them */
#define PT_GEMV_WARPS 4   /* warps per block */

__device__ __forceinline__ float ld_st(pt_ftype t, const void *p, int64_t i) { return pt_ld(t, p, i); }

/* The GEMV kernels' epilogue: each (row, x row) sum of the warp's lanes
 * (butterfly), plus the row's bias, rounded and stored by lane 0 for the
 * rows that exist (0 for an item whose expert is not in the stack). */
template <int NT>
__device__ __forceinline__ void gemv_store_rows(const gemv_args &a, float (&acc)[PT_GEMV_ROWS][NT], int64_t b,
                                                int64_t rl0, const int64_t (&grow)[PT_GEMV_ROWS],
                                                const bool (&valid)[PT_GEMV_ROWS], bool eok, int lane) {
#pragma unroll
    for (int r = 0; r < PT_GEMV_ROWS; r++) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            float v = pt_warp_sum(acc[r][n]);
            if (lane == 0 && valid[r]) {
                if (a.bias) v += ld_st(a.bt, a.bias, grow[r]);
                a.y[(b * NT + n) * a.ldy + rl0 + r] = eok ? pt_rnd(a.bf, v) : 0.f;
            }
        }
    }
}

template <int BITS, int NT>
__global__ void __launch_bounds__(PT_GEMV_WARPS * 32) gemv_q_kernel(gemv_args a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y;
    bool eok;
    const int64_t e = item_expert(a, b, eok);
    const int64_t rl0 = ((int64_t)blockIdx.x * PT_GEMV_WARPS + warp) * PT_GEMV_ROWS; /* local row */
    if (rl0 >= a.nrows) return;
    const int64_t nchunks = a.K / 32;
    const float *xb = a.x + (b / a.x_div) * NT * a.K;
    int64_t grow[PT_GEMV_ROWS];
    bool valid[PT_GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < PT_GEMV_ROWS; r++) {
        valid[r] = rl0 + r < a.nrows;
        grow[r] = e * a.rows + a.row0 + (valid[r] ? rl0 + r : rl0);
    }
    float acc[PT_GEMV_ROWS][NT];
#pragma unroll
    for (int r = 0; r < PT_GEMV_ROWS; r++)
#pragma unroll
        for (int n = 0; n < NT; n++) acc[r][n] = 0.f;

    for (int64_t c = lane; c < nchunks; c += 32) {
        uint32_t w[PT_GEMV_ROWS][BITS];
        float sc[PT_GEMV_ROWS], bi[PT_GEMV_ROWS];
        const int64_t g = c * 32 / a.gs;
#pragma unroll
        for (int r = 0; r < PT_GEMV_ROWS; r++) {
            pt_qw_chunk<BITS>(w[r], a.q, grow[r], c);
            pt_qw_sb(a.q, grow[r], g, sc[r], bi[r]);
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float4 *xp = reinterpret_cast<const float4 *>(xb + n * a.K + c * 32);
            float xs[32];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(xp + i);
                xs[4 * i] = v.x; xs[4 * i + 1] = v.y; xs[4 * i + 2] = v.z; xs[4 * i + 3] = v.w;
            }
            float sx = 0.f;
#pragma unroll
            for (int j = 0; j < 32; j++) sx += xs[j];
#pragma unroll
            for (int r = 0; r < PT_GEMV_ROWS; r++) {
                float d = 0.f;
#pragma unroll
                for (int j = 0; j < 32; j++) d = fmaf((float)pt_q_code<BITS>(w[r], j), xs[j], d);
                acc[r][n] += sc[r] * d + bi[r] * sx;
            }
        }
    }
    gemv_store_rows<NT>(a, acc, b, rl0, grow, valid, eok, lane);
}

/* Dense weights: VEC elements per 16-byte load when rows are 16-byte aligned
 * (VEC == 1: any K, scalar loads). A lane takes the chunks lane, lane + 32,
 * ... of its rows in order, one fma chain per (row, x row), then the warp's
 * butterfly sum. With U > 1 (16-byte loads only) the weight loads of U
 * chunks are issued before the first of their multiply-adds, which then run
 * chunk by chunk as in the U = 1 loop: the same operations in the same
 * order, so the same bits, with U times the loads in flight per warp (one
 * chunk of two rows, 1 KiB a warp, left the 8B shape's bf16 decode at half
 * the read bandwidth). PETREL_CUDA_DENSE_U=1: the one-chunk loop (A/B). */
template <typename WT, int VEC, int NT, int U = 1>
__global__ void __launch_bounds__(PT_GEMV_WARPS * 32) gemv_dense_kernel(gemv_args a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y;
    bool eok;
    const int64_t e = item_expert(a, b, eok);
    const int64_t rl0 = ((int64_t)blockIdx.x * PT_GEMV_WARPS + warp) * PT_GEMV_ROWS;
    if (rl0 >= a.nrows) return;
    const float *xb = a.x + (b / a.x_div) * NT * a.K;
    const WT *rowp[PT_GEMV_ROWS];
    int64_t grow[PT_GEMV_ROWS];
    bool valid[PT_GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < PT_GEMV_ROWS; r++) {
        valid[r] = rl0 + r < a.nrows;
        grow[r] = e * a.rows + a.row0 + (valid[r] ? rl0 + r : rl0);
        rowp[r] = (const WT *)a.data + grow[r] * a.K;
    }
    float acc[PT_GEMV_ROWS][NT];
#pragma unroll
    for (int r = 0; r < PT_GEMV_ROWS; r++)
#pragma unroll
        for (int n = 0; n < NT; n++) acc[r][n] = 0.f;
    pt_dense_rows_dot<WT, VEC, PT_GEMV_ROWS, NT, U>(acc, rowp, xb, a.K, a.K / VEC, lane);
    gemv_store_rows<NT>(a, acc, b, rl0, grow, valid, eok, lane);
}

/* PETREL_CUDA_DENSE_U: chunks per lane whose loads gemv_dense_kernel issues
 * together (4 by default; 1: one at a time, the loop before). */
static int dense_u(void) {
    static int u = -1;
    if (u < 0) {
        static const int us[] = {1, 4};
        u = pt_env_pick("PETREL_CUDA_DENSE_U", us, 2, 4);
    }
    return u;
}

template <int NT>
static pt_status launch_gemv_nt(const pt_cuda *c, const gemv_args &a, int bits, pt_ftype dt, int64_t B) {
    const int64_t rows_per_block = PT_GEMV_WARPS * PT_GEMV_ROWS;
    dim3 grid((unsigned)((a.nrows + rows_per_block - 1) / rows_per_block), (unsigned)B);
    dim3 block(PT_GEMV_WARPS * 32);
    cudaStream_t s = c->stream;
    switch (bits) {
    case 2: gemv_q_kernel<2, NT><<<grid, block, 0, s>>>(a); break;
    case 3: gemv_q_kernel<3, NT><<<grid, block, 0, s>>>(a); break;
    case 4: gemv_q_kernel<4, NT><<<grid, block, 0, s>>>(a); break;
    case 5: gemv_q_kernel<5, NT><<<grid, block, 0, s>>>(a); break;
    case 6: gemv_q_kernel<6, NT><<<grid, block, 0, s>>>(a); break;
    case 8: gemv_q_kernel<8, NT><<<grid, block, 0, s>>>(a); break;
    case 0: {
        /* 16-byte loads need every weight row and x row 16-byte aligned. */
        size_t es = pt_ftype_size(dt);
        bool vec = ((a.K * (int64_t)es) % 16 == 0) && ((uintptr_t)a.data % 16 == 0) && ((uintptr_t)a.x % 16 == 0);
        const bool u4 = dense_u() == 4;
        if (dt == PT_FT_BF16) {
            if (vec && u4) gemv_dense_kernel<__nv_bfloat16, 8, NT, 4><<<grid, block, 0, s>>>(a);
            else if (vec) gemv_dense_kernel<__nv_bfloat16, 8, NT><<<grid, block, 0, s>>>(a);
            else gemv_dense_kernel<__nv_bfloat16, 1, NT><<<grid, block, 0, s>>>(a);
        } else if (dt == PT_FT_F16) {
            if (vec && u4) gemv_dense_kernel<__half, 8, NT, 4><<<grid, block, 0, s>>>(a);
            else if (vec) gemv_dense_kernel<__half, 8, NT><<<grid, block, 0, s>>>(a);
            else gemv_dense_kernel<__half, 1, NT><<<grid, block, 0, s>>>(a);
        } else {
            if (vec && u4) gemv_dense_kernel<float, 4, NT, 4><<<grid, block, 0, s>>>(a);
            else if (vec) gemv_dense_kernel<float, 4, NT><<<grid, block, 0, s>>>(a);
            else gemv_dense_kernel<float, 1, NT><<<grid, block, 0, s>>>(a);
        }
        break;
    }
    default: return pt_error(PT_ERR_UNSUPPORTED, "matmul: no CUDA kernel for %d-bit weights", bits);
    }
    CUDA_CHECK_LAUNCH("gemv");
    return PT_OK;
}

static pt_status launch_gemv(const pt_cuda *c, const gemv_args &a, int bits, pt_ftype dt, int64_t B, int nt,
                             int64_t shape_B = 0) {
    if (B > 65535) return pt_error(PT_ERR_INTERNAL, "gemv: %lld items exceed the grid", (long long)B);
    if (nt == 1 && !c->no_fast_gemv) {
        pt_status st = pt_cuda_gemv_fast(c, a, bits, B, shape_B > 0 ? shape_B : B);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    switch (nt) {
    case 1: return launch_gemv_nt<1>(c, a, bits, dt, B);
    case 2: return launch_gemv_nt<2>(c, a, bits, dt, B);
    case 4: return launch_gemv_nt<4>(c, a, bits, dt, B);
    case 8: return launch_gemv_nt<8>(c, a, bits, dt, B);
    }
    return pt_error(PT_ERR_INTERNAL, "gemv: batch %d not instantiated (1, 2, 4, 8)", nt);
}

/* ---- the tensor-core decode GEMV (gemv_mma.cuh) ----------------------------
 * Used for T <= 8 tokens in bf16 activation mode with 4/8-bit codes, group
 * 32/64/128, bf16 scales and K a multiple of 128: all T rows in one launch.
 * PETREL_CUDA_GEMV=fast selects the FMA kernels above instead (A/B);
 * PETREL_CUDA_MMA_TUNE="tiles,warps_per_sm" overrides the launch shape
 * (tiles of 16 rows per warp: 1 or 2; default 1, 8; tiles 2 applies to
 * one-row launches only, so it gives up batch invariance: A/B use only);
 * PETREL_CUDA_PDL=1 launches it with programmatic dependent launch (its
 * first weight loads overlap the previous kernel's tail). */
struct mma_tune {
    int mode; /* 1: mma on; 0: off; -1: not read yet */
    int tiles, wps;
    int pdl;  /* launch with programmatic dependent launch (overlap with the previous kernel) */
};
static mma_tune g_mma = {-1, 0, 0, 0};
static mma_tune get_mma_tune(void) {
    if (g_mma.mode < 0) {
        mma_tune d = {1, 1, 8, 0};
        const char *m = getenv("PETREL_CUDA_GEMV");
        if (m && !strcmp(m, "fast")) d.mode = 0;
        const char *e = getenv("PETREL_CUDA_MMA_TUNE");
        int a, b;
        if (e && sscanf(e, "%d,%d", &a, &b) == 2 && (a == 1 || a == 2) && b >= 1 && b <= 64) d.tiles = a, d.wps = b;
        d.pdl = pt_env_flag("PETREL_CUDA_PDL", 0); /* this path's default: off (the tensor-core GEMV's: on) */
        g_mma = d;
    }
    return g_mma;
}

/* For benchmarks that compare the GEMVs in one process (dev/cuda_gemv_bench):
 * mma on/off, launch shape and programmatic dependent launch, overriding
 * the environment. */
extern "C" void pt_cuda_gemv_select(int mode, int tiles, int wps, int pdl) {
    g_mma.mode = mode ? 1 : 0;
    g_mma.tiles = tiles == 2 ? 2 : 1;
    g_mma.wps = wps >= 1 && wps <= 64 ? wps : 8;
    g_mma.pdl = pdl != 0;
}

template <int BITS, int GS, int NB, int TILES>
static pt_status launch_mma_t(const pt_cuda *c, const mma_args &a) {
    const mma_tune tu = get_mma_tune();
    const int tiles = (a.N + 15) / 16, groups = (tiles + TILES - 1) / TILES, tpb = PT_MMA_WARPS / a.S;
    const unsigned blocks = (unsigned)((groups + tpb - 1) / tpb);
    static int attr_st = 0; /* the dynamic shared memory opted in, per instantiation */
    const size_t smem = pt_mma_smem(BITS, GS, NB, TILES);
    if (!attr_st && smem > 48 * 1024) {
        CUDA_CHECK(cudaFuncSetAttribute(gemv_mma_kernel<BITS, GS, NB, TILES>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_st = 1;
    }
    pt_launch(gemv_mma_kernel<BITS, GS, NB, TILES>, dim3(blocks), dim3(PT_MMA_WARPS * 32), smem, c->stream, tu.pdl != 0,
              a);
    CUDA_CHECK_LAUNCH("gemv_mma");
    return PT_OK;
}

template <int BITS, int GS, int TILES>
static pt_status launch_mma_nb(const pt_cuda *c, const mma_args &a) {
    if (a.nb == 1) return launch_mma_t<BITS, GS, 1, TILES>(c, a);
    if constexpr (TILES == 1) {
        if (a.nb == 2) return launch_mma_t<BITS, GS, 2, 1>(c, a);
        if (a.nb <= 4) return launch_mma_t<BITS, GS, 4, 1>(c, a);
        return launch_mma_t<BITS, GS, 8, 1>(c, a);
    }
    return pt_error(PT_ERR_INTERNAL, "gemv: tensor-core kernel with %d tiles is for one row", TILES);
}

template <int BITS, int GS>
static pt_status launch_mma_tiles(const pt_cuda *c, const mma_args &a, int tiles) {
    if (tiles == 2 && a.nb == 1) return launch_mma_nb<BITS, GS, 2>(c, a);
    return launch_mma_nb<BITS, GS, 1>(c, a);
}

/* y[T, N] = x[T, K] · W[expert]ᵀ (+ bias) with the tensor-core GEMV when the
 * weight and mode allow it; PT_ERR_UNSUPPORTED (no message) otherwise. The
 * launch shape depends on N and K only (batch invariance, gemv_mma.cuh). */
static pt_status try_mma(const pt_cuda *c, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert) {
    const mma_tune tu = get_mma_tune();
    const int bits = w->bits, gs = w->group_size;
    const int64_t N = w->rows, K = w->cols;
    if (!tu.mode || c->no_fast_gemv || pt_cuda_w(w)->tc || c->base.act != PT_ACT_BF16 || (bits != 4 && bits != 8) ||
        (gs != 32 && gs != 64 && gs != 128) || w->dtype != PT_FT_BF16 || K % 128 || T < 1 || T > 8 ||
        N < 1 || N > INT32_MAX || K > INT32_MAX || (uintptr_t)x % 16)
        return PT_ERR_UNSUPPORTED;
    const pt_cuda_weight *cw = pt_cuda_w(w);
    const int64_t wpr = K * bits / 32, gpr = K / gs, e0 = expert * N;
    mma_args a;
    a.w = (const uint32_t *)cw->data + e0 * wpr;
    a.sc = (const bf16 *)cw->scales + e0 * gpr;
    a.bi = (const bf16 *)cw->biases + e0 * gpr;
    a.bias = cw->bias ? (const char *)cw->bias + (size_t)e0 * pt_ftype_size(w->bias_dtype) : NULL;
    a.bt = w->bias_dtype;
    a.x = x;
    a.y = y;
    a.ldy = N;
    a.N = (int)N;
    a.K = (int)K;
    a.nb = (int)T;
    /* warps per tile group: enough warps for ~wps per SM, at most 8 */
    const int64_t groups = ((N + 15) / 16 + tu.tiles - 1) / tu.tiles, target = (int64_t)tu.wps * c->sm_count;
    int S = 1;
    while (S < PT_MMA_WARPS && groups * S < target) S *= 2;
    a.S = S;
    switch (bits * 1000 + gs) {
    case 4032: return launch_mma_tiles<4, 32>(c, a, tu.tiles);
    case 4064: return launch_mma_tiles<4, 64>(c, a, tu.tiles);
    case 4128: return launch_mma_tiles<4, 128>(c, a, tu.tiles);
    case 8032: return launch_mma_tiles<8, 32>(c, a, tu.tiles);
    case 8064: return launch_mma_tiles<8, 64>(c, a, tu.tiles);
    default: return launch_mma_tiles<8, 128>(c, a, tu.tiles);
    }
}

/* Up to how many rows the prefill GEMM of 4/8-bit weights runs on the fused
 * tensor-core kernel (gemm_tc.cu) instead of dequantize + cuBLAS:
 * PETREL_CUDA_TC_MAX_T=N overrides the default (0: never) for A/B runs. */
#define PT_TC_MAX_T_DEFAULT 0
static int64_t g_tc_max_t = -1;
static int64_t tc_max_t(void) {
    if (g_tc_max_t < 0) {
        g_tc_max_t = pt_env_int("PETREL_CUDA_TC_MAX_T", 0, 0x7fffffff, PT_TC_MAX_T_DEFAULT);
    }
    return g_tc_max_t;
}

static int g_dequant_fast = -1; /* 1: the fast dequantize; -1: not read yet */
static int dequant_fast_on(void);
/* For benchmarks that compare the prefill paths in one process
 * (tests/cuda/bench_prefill_gemm.c): the fused kernel's row limit and the
 * old dequantize kernel, overriding the environment; -1 re-reads it. */
extern "C" void pt_cuda_prefill_select(long long tc_max, int dequant_old) {
    g_tc_max_t = tc_max < 0 ? -1 : (int64_t)tc_max;
    (void)tc_max_t();
    g_dequant_fast = dequant_old < 0 ? -1 : !dequant_old;
    (void)dequant_fast_on();
}

static gemv_args make_args(const pt_cuda *c, const pt_matrix *w, float *y, const float *x) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    gemv_args a;
    a.y = y;
    a.x = x;
    a.K = w->cols;
    a.rows = w->rows;
    a.data = cw->data;
    a.scales = cw->scales;
    a.biases = cw->biases;
    a.bias = cw->bias;
    a.st = w->dtype;
    a.bt = w->bias_dtype;
    a.gs = w->group_size;
    a.experts = NULL;
    a.expert = 0;
    a.x_div = 1;
    a.row0 = 0;
    a.nrows = w->rows;
    a.ldy = w->rows;
    a.n_experts = w->n_experts > 1 ? w->n_experts : 1;
    a.err = c->err_dev;
    a.bf = c->base.act == PT_ACT_BF16;
    if (w->bits) a.q = pt_qw_of(w);
    else memset(&a.q, 0, sizeof a.q);
    return a;
}

pt_status pt_cuda_gemv_items(pt_cuda *c, float *y, const float *x, int64_t B, int x_div, const pt_matrix *w,
                             const int32_t *experts, int64_t expert, int64_t row0, int64_t nrows, int64_t y_stride) {
    if (!pt_cuda_w(w)) return pt_error(PT_ERR_INVALID_ARG, "matmul: weight not prepared on the CUDA backend");
    if ((uintptr_t)x % 16) return pt_error(PT_ERR_INTERNAL, "gemv: input not 16-byte aligned");
    if (pt_cuda_w(w)->tc && !c->no_fast_gemv && row0 == 0 && nrows == w->rows)
        return pt_cuda_tc_gemv(c, y, x, 1, w, expert, experts, B, x_div, y_stride);
    gemv_args a = make_args(c, w, y, x);
    a.experts = experts;
    a.expert = expert;
    a.x_div = x_div;
    a.row0 = row0;
    a.nrows = nrows;
    a.ldy = y_stride;
    return launch_gemv(c, a, w->bits, w->dtype, B, 1);
}

/* ---- GEMM path ------------------------------------------------------------ */

template <int BITS, typename OT>
__global__ void dequant_kernel(OT *out, pt_qw q, int gs, int64_t K, int64_t row_begin, int64_t nrows) {
    const int64_t nchunks = K / 32;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nrows * nchunks;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nchunks, c = i % nchunks, gr = row_begin + r;
        uint32_t w[BITS];
        pt_qw_chunk<BITS>(w, q, gr, c); /* either device layout (matmul.cuh) */
        float s, bb;
        pt_qw_sb(q, gr, c * 32 / gs, s, bb);
        OT *o = out + r * K + c * 32;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            float v = __fadd_rn(__fmul_rn(s, (float)pt_q_code<BITS>(w, j)), bb); /* as the CPU: no fma */
            if constexpr (sizeof(OT) == 2) o[j] = __float2bfloat16_rn(v);
            else o[j] = v;
        }
    }
}

__global__ void convert_kernel(float *out, const void *src, pt_ftype t, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = pt_ld(t, src, i);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *out, const float *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(x[i]);
}

/* The same two passes 16 bytes per thread (n4 = n / 4 float4s; the caller
 * checks 16-byte alignment and n % 4 == 0): the scalar versions moved only
 * ~1.9 / 2.6 TB/s, and at pp2048 of the 8b shape they cost ~0.5 ms a layer. */
__global__ void f32_to_bf16_v4_kernel(uint2 *out, const float4 *x, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        out[i] = make_uint2(*reinterpret_cast<uint32_t *>(&a), *reinterpret_cast<uint32_t *>(&b));
    }
}
__global__ void round_bf16_v4_kernel(float4 *y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = y[i];
        v.x = pt_round_bf(v.x), v.y = pt_round_bf(v.y), v.z = pt_round_bf(v.z), v.w = pt_round_bf(v.w);
        y[i] = v;
    }
}

/* y[T, N] += bias, then the bf16 rounding. */
__global__ void epilogue_kernel(float *y, int64_t T, int64_t N, const void *bias, pt_ftype bt, int bf) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * N; i += (int64_t)gridDim.x * blockDim.x) {
        float v = y[i];
        if (bias) v += pt_ld(bt, bias, i % N);
        y[i] = pt_rnd(bf, v);
    }
}

/* The fast dequantize for 2/4/8-bit codes into bf16 (the prefill path's
 * cost per forward: every weight once per chunk). One thread per 32-bit code
 * word: VPW = 32/BITS values, written as one or two 16-byte (8-bit: 8-byte)
 * stores, so a warp reads 128 contiguous bytes of codes and writes 256-1024
 * contiguous bytes of bf16 — the old kernel's one-thread-per-32-values
 * scalar 2-byte stores 64 bytes apart ran at ~70 G values/s, ~15x under the
 * memory limit. Rows come from blockIdx.y (a loop past 65535), words of a row
 * from blockIdx.x, so no 64-bit division. The values are the old kernel's
 * bit for bit: s·q then + b, each rounded (no fma), then one bf16 rounding. */
template <int BITS, bool BF_SCALES>
__global__ void __launch_bounds__(256) dequant_fast_kernel(bf16 *out, const uint32_t *codes, const void *scales,
                                                           const void *biases, pt_ftype st, int gs, int64_t K,
                                                           int64_t row_begin, int64_t nrows) {
    constexpr int VPW = 32 / BITS;
    const int64_t wpr = K * BITS / 32, ngroups = K / gs;
    const int64_t wi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (wi >= wpr) return;
    const int g = (int)(wi * VPW / gs);
    for (int64_t r = blockIdx.y; r < nrows; r += gridDim.y) {
        const int64_t gr = row_begin + r;
        const uint32_t word = __ldg(codes + gr * wpr + wi);
        float s, b;
        if constexpr (BF_SCALES) {
            s = __bfloat162float(((const bf16 *)scales)[gr * ngroups + g]);
            b = __bfloat162float(((const bf16 *)biases)[gr * ngroups + g]);
        } else {
            s = pt_ld(st, scales, gr * ngroups + g);
            b = pt_ld(st, biases, gr * ngroups + g);
        }
        uint32_t packed[VPW / 2];
#pragma unroll
        for (int j = 0; j < VPW; j += 2) {
            const float v0 = __fadd_rn(__fmul_rn(s, (float)((word >> (j * BITS)) & ((1u << BITS) - 1u))), b);
            const float v1 = __fadd_rn(__fmul_rn(s, (float)((word >> ((j + 1) * BITS)) & ((1u << BITS) - 1u))), b);
            __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1); /* .x = v0 (lower address) */
            packed[j / 2] = *reinterpret_cast<uint32_t *>(&h);
        }
        bf16 *o = out + r * K + wi * VPW;
        if constexpr (VPW == 4) {
            *reinterpret_cast<uint2 *>(o) = make_uint2(packed[0], packed[1]);
        } else {
#pragma unroll
            for (int q = 0; q < VPW / 8; q++)
                reinterpret_cast<uint4 *>(o)[q] =
                    make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
        }
    }
}

/* PETREL_CUDA_DEQUANT=old selects the one-thread-per-32-values kernel (A/B). */
static int dequant_fast_on(void) {
    if (g_dequant_fast < 0) {
        const char *e = getenv("PETREL_CUDA_DEQUANT");
        g_dequant_fast = !(e && !strcmp(e, "old"));
    }
    return g_dequant_fast;
}

template <int BITS>
static pt_status launch_dequant_fast(pt_cuda *c, bf16 *out, const pt_matrix *w, int64_t row_begin, int64_t nrows) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    const int64_t wpr = w->cols * BITS / 32;
    dim3 grid((unsigned)((wpr + 255) / 256), (unsigned)(nrows < 65535 ? nrows : 65535));
    if (w->dtype == PT_FT_BF16)
        dequant_fast_kernel<BITS, true><<<grid, 256, 0, c->stream>>>(out, (const uint32_t *)cw->data, cw->scales,
                                                                     cw->biases, w->dtype, w->group_size, w->cols,
                                                                     row_begin, nrows);
    else
        dequant_fast_kernel<BITS, false><<<grid, 256, 0, c->stream>>>(out, (const uint32_t *)cw->data, cw->scales,
                                                                      cw->biases, w->dtype, w->group_size, w->cols,
                                                                      row_begin, nrows);
    CUDA_CHECK_LAUNCH("dequant (fast)");
    return PT_OK;
}

template <typename OT>
static pt_status launch_dequant(pt_cuda *c, OT *out, const pt_matrix *w, int64_t row_begin, int64_t nrows) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    if constexpr (sizeof(OT) == 2) {
        /* the tensor-core layout (gemv_tc_repack.cu): its own one-word-per-thread kernel */
        if (cw->tc) return pt_cuda_tc_dequant(c, out, w, row_begin, nrows);
        /* rows of K·BITS/32 words, K a multiple of the group (>= 32): 16-byte
         * aligned stores for 2/4-bit (16 values per 32 bytes), 8-byte for 8-bit */
        if (dequant_fast_on() && nrows > 0 && !cw->tc) {
            if (w->bits == 4) return launch_dequant_fast<4>(c, out, w, row_begin, nrows);
            if (w->bits == 8) return launch_dequant_fast<8>(c, out, w, row_begin, nrows);
            if (w->bits == 2) return launch_dequant_fast<2>(c, out, w, row_begin, nrows);
        }
    }
    unsigned blocks = pt_cuda_blocks(nrows * (w->cols / 32), 256);
    const pt_qw q = pt_qw_of(w);
#define PT_DQ(B)                                                                                               \
    case B:                                                                                                    \
        dequant_kernel<B, OT><<<blocks, 256, 0, c->stream>>>(out, q, w->group_size, w->cols, row_begin, nrows); \
        break;
    switch (w->bits) {
        PT_DQ(2) PT_DQ(3) PT_DQ(4) PT_DQ(5) PT_DQ(6) PT_DQ(8)
    default: return pt_error(PT_ERR_UNSUPPORTED, "matmul: no CUDA dequantize kernel for %d-bit weights", w->bits);
    }
#undef PT_DQ
    CUDA_CHECK_LAUNCH("dequant");
    return PT_OK;
}

pt_status pt_cuda_dequant_bf16(pt_cuda *c, bf16 *out, const pt_matrix *w, int64_t row_begin, int64_t nrows) {
    if (!pt_cuda_w(w) || w->bits <= 0) return pt_error(PT_ERR_INTERNAL, "dequant: not a prepared quantized weight");
    return launch_dequant(c, out, w, row_begin, nrows);
}

/* Whether the GEMM path runs w on bf16 inputs (x converted to bf16 first). */
static bool gemm_bf16(const pt_cuda *c, const pt_matrix *w) {
    return c->base.act == PT_ACT_BF16 && (w->bits > 0 || w->dtype == PT_FT_BF16);
}

/* The GEMM path's scratch (the weight tile, x converted) holds T × K. */
static pt_status gemm_scratch(const pt_cuda *c, int64_t T, int64_t K) {
    if (!c->tile || (size_t)(T * K) * 4 > c->xconv_bytes)
        return pt_error(PT_ERR_INVALID_ARG,
                        "matmul: scratch not reserved for %lld tokens × %lld columns (call reserve first)",
                        (long long)T, (long long)K);
    return PT_OK;
}

/* The GEMM path's x[T, K] (f32) as bf16 in c->xconv, 16 bytes per thread
 * where aligned (the caller checked gemm_scratch). */
static pt_status gemm_convert_x(pt_cuda *c, const float *x, int64_t T, int64_t K) {
    if ((T * K) % 4 == 0 && (uintptr_t)x % 16 == 0)
        f32_to_bf16_v4_kernel<<<pt_cuda_blocks(T * K / 4, 256), 256, 0, c->stream>>>((uint2 *)c->xconv,
                                                                                    (const float4 *)x, T * K / 4);
    else
        f32_to_bf16_kernel<<<pt_cuda_blocks(T * K, 256), 256, 0, c->stream>>>((__nv_bfloat16 *)c->xconv, x, T * K);
    CUDA_CHECK_LAUNCH("f32_to_bf16");
    return PT_OK;
}

static pt_status gemm_run(pt_cuda *c, float *y, const void *xin, int64_t T, const pt_matrix *w, int64_t expert);

static pt_status gemm(pt_cuda *c, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert) {
    PT_TRY(gemm_scratch(c, T, w->cols));
    if (!gemm_bf16(c, w)) return gemm_run(c, y, x, T, w, expert);
    PT_TRY(gemm_convert_x(c, x, T, w->cols));
    return gemm_run(c, y, c->xconv, T, w, expert);
}

/* y = x·Wᵀ on the GEMM path; xin: bf16 [T, K] (c->xconv) when gemm_bf16,
 * else the f32 input. */
static pt_status gemm_run(pt_cuda *c, float *y, const void *xin, int64_t T, const pt_matrix *w, int64_t expert) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    const int64_t N = w->rows, K = w->cols;
    const int bf = c->base.act == PT_ACT_BF16;
    const bool use_bf16 = gemm_bf16(c, w);
    const size_t esz = use_bf16 ? 2 : 4;
    int64_t chunk = (int64_t)(c->tile_bytes / esz) / K;
    if (chunk < 1) return pt_error(PT_ERR_UNSUPPORTED, "matmul: %lld columns exceed the tile", (long long)K);
    if (chunk < N) { /* equal chunks (multiples of 128 rows where that fits): no small last GEMM */
        const int64_t n = (N + chunk - 1) / chunk, even = ((N + n - 1) / n + 127) / 128 * 128;
        if (even <= chunk) chunk = even;
    }
    if (use_bf16 && w->bits > 0 && T <= tc_max_t()) {
        pt_status st = pt_cuda_gemm_tc(c, y, (const bf16 *)xin, T, w, expert);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    const float one = 1.f, zero = 0.f;
    const int64_t ebase = expert * N; /* first row of this expert */
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t nr = N - r0 < chunk ? N - r0 : chunk;
        const void *A;
        if (w->bits > 0) {
            if (use_bf16) PT_TRY(launch_dequant(c, (__nv_bfloat16 *)c->tile, w, ebase + r0, nr));
            else PT_TRY(launch_dequant(c, (float *)c->tile, w, ebase + r0, nr));
            A = c->tile;
        } else if (use_bf16 || w->dtype == PT_FT_F32) {
            A = (const char *)cw->data + (size_t)(ebase + r0) * (size_t)K * pt_ftype_size(w->dtype);
        } else {
            const void *src = (const char *)cw->data + (size_t)(ebase + r0) * (size_t)K * pt_ftype_size(w->dtype);
            convert_kernel<<<pt_cuda_blocks(nr * K, 256), 256, 0, c->stream>>>((float *)c->tile, src, w->dtype, nr * K);
            CUDA_CHECK_LAUNCH("convert");
            A = c->tile;
        }
        cudaDataType tt = use_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        /* Column-major view: C[nr, T] (ld N) = A[K, nr]ᵀ · X[K, T]. */
        CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)T, (int)K, &one, A, tt, (int)K,
                                  xin, tt, (int)K, &zero, y + r0, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    }
    const void *bias = cw->bias ? (const char *)cw->bias + (size_t)ebase * pt_ftype_size(w->bias_dtype) : NULL;
    if (!bias && !bf) return PT_OK; /* f32 mode without a bias: cuBLAS wrote the result */
    if (!bias && (T * N) % 4 == 0 && (uintptr_t)y % 16 == 0)
        round_bf16_v4_kernel<<<pt_cuda_blocks(T * N / 4, 256), 256, 0, c->stream>>>((float4 *)y, T * N / 4);
    else
        epilogue_kernel<<<pt_cuda_blocks(T * N, 256), 256, 0, c->stream>>>(y, T, N, bias, w->bias_dtype, bf);
    CUDA_CHECK_LAUNCH("epilogue");
    return PT_OK;
}

pt_status pt_cuda_matmul(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert) {
    pt_cuda *c = pt_cuda_of(be);
    if (!pt_cuda_w(w)) return pt_error(PT_ERR_INVALID_ARG, "matmul: weight not prepared on the CUDA backend");
    const int64_t E = w->n_experts > 1 ? w->n_experts : 1;
    if (expert < 0 || expert >= E)
        return pt_error(PT_ERR_INVALID_ARG, "matmul: expert %lld of %lld", (long long)expert, (long long)E);
    if (T <= 0) return PT_OK;
    /* a weight in the tensor-core layout: up to 64 tokens in one GEMV launch */
    const bool tc = pt_cuda_w(w)->tc && !c->no_fast_gemv;
    const int64_t max_t = tc ? PT_TC_MAX_T : PT_GEMV_MAX_T;
    if ((w->rows > INT32_MAX || w->cols > INT32_MAX) && T > max_t)
        return pt_error(PT_ERR_UNSUPPORTED, "matmul: dimensions beyond cuBLAS's int range");
    if (T > max_t) return gemm(c, y, x, T, w, expert);
    /* Quantized rows need 16-byte aligned input for the vector loads. */
    const float *xin = x;
    if ((uintptr_t)x % 16) {
        if ((size_t)(T * w->cols) * 4 > c->xconv_bytes)
            return pt_error(PT_ERR_INVALID_ARG, "matmul: unaligned input and no scratch reserved");
        CUDA_CHECK(cudaMemcpyAsync(c->xconv, x, (size_t)(T * w->cols) * 4, cudaMemcpyDeviceToDevice, c->stream));
        xin = (const float *)c->xconv;
    }
    if (tc) return pt_cuda_tc_gemv(c, y, xin, T, w, expert, NULL, 1, 1, w->rows);
    {
        pt_status st = try_mma(c, y, xin, T, w, expert);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    gemv_args a = make_args(c, w, y, xin);
    a.expert = expert;
    /* T as a sum of batches of 8, 4, 2, 1: each batch shares the weight loads. */
    int64_t t = 0;
    for (int nt = 8; nt >= 1; nt >>= 1) {
        while (T - t >= nt) {
            gemv_args b = a;
            b.x = xin + t * w->cols;
            b.y = y + t * w->rows;
            PT_TRY(launch_gemv(c, b, w->bits, w->dtype, 1, nt));
            t += nt;
        }
    }
    return PT_OK;
}

/* ---- matmul_rows (backend.h): the batch-invariant matmul --------------------
 * Row t of y must be bit-identical to matmul(x_t, T = 1) for every T. This
 * version runs every row through exactly the T = 1 GEMV code path: one launch
 * whose items (grid.y) are the T rows, with the launch shape chosen as for a
 * single row (the fast kernel's warps per row depend on the item count
 * otherwise, and with them the reduction order). In bf16 activation mode
 * with 4/8-bit weights the tensor-core GEMV serves it instead, 8 rows per
 * launch sharing every weight load (its T = 1 and T = 8 launches reduce each
 * row identically). */
pt_status pt_cuda_matmul_rows(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w,
                              int64_t expert) {
    pt_cuda *c = pt_cuda_of(be);
    if (!pt_cuda_w(w)) return pt_error(PT_ERR_INVALID_ARG, "matmul_rows: weight not prepared on the CUDA backend");
    const int64_t E = w->n_experts > 1 ? w->n_experts : 1;
    if (expert < 0 || expert >= E)
        return pt_error(PT_ERR_INVALID_ARG, "matmul_rows: expert %lld of %lld", (long long)expert, (long long)E);
    if (T <= 0) return PT_OK;
    /* the T = 1 call copies an unaligned row to aligned scratch; here every
     * row must be aligned, so an unaligned batch is copied whole */
    const float *xin = x;
    if ((uintptr_t)x % 16 || (w->cols * 4) % 16) {
        if ((size_t)(T * w->cols) * 4 > c->xconv_bytes)
            return pt_error(PT_ERR_INVALID_ARG, "matmul_rows: unaligned input and no scratch reserved");
        if ((w->cols * 4) % 16) { /* rows K floats apart cannot all be aligned: one row at a time */
            for (int64_t t = 0; t < T; t++)
                PT_TRY(pt_cuda_matmul(be, y + t * w->rows, x + t * w->cols, 1, w, expert));
            return PT_OK;
        }
        CUDA_CHECK(cudaMemcpyAsync(c->xconv, x, (size_t)(T * w->cols) * 4, cudaMemcpyDeviceToDevice, c->stream));
        xin = (const float *)c->xconv;
    }
    /* The tensor-core GEMV on the repacked layout: up to 64 rows per launch,
     * each row bit-identical to the T = 1 call (gemv_tc.cu). */
    if (pt_cuda_w(w)->tc && !c->no_fast_gemv) {
        for (int64_t t = 0; t < T; t += PT_TC_MAX_T) {
            const int64_t nb = T - t < PT_TC_MAX_T ? T - t : PT_TC_MAX_T;
            PT_TRY(pt_cuda_tc_gemv(c, y + t * w->rows, xin + t * w->cols, nb, w, expert, NULL, 1, 1, w->rows));
        }
        return PT_OK;
    }
    /* The tensor-core GEMV on the MLX layout (bf16 activations, 4/8-bit):
     * up to 8 rows per launch, each row bit-identical to the T = 1 call
     * (gemv_mma.cuh). */
    for (int64_t t = 0; t < T; t += 8) {
        const int64_t nb = T - t < 8 ? T - t : 8;
        pt_status st = try_mma(c, y + t * w->rows, xin + t * w->cols, nb, w, expert);
        if (st == PT_ERR_UNSUPPORTED && t == 0) break; /* not this weight or mode: the FMA kernels */
        PT_TRY(st);
        if (t + nb == T) return PT_OK;
    }
    gemv_args a = make_args(c, w, y, xin);
    a.expert = expert;
    for (int64_t t = 0; t < T; t += 65535) { /* the grid's y dimension */
        const int64_t nb = T - t < 65535 ? T - t : 65535;
        gemv_args b = a;
        b.x = xin + t * w->cols;
        b.y = y + t * w->rows;
        PT_TRY(launch_gemv(c, b, w->bits, w->dtype, nb, 1, 1));
    }
    return PT_OK;
}

/* ---- matmul_multi (backend.h): several weights over one x ---------------------
 * One grouped tensor-core GEMV launch (gemv_tc.cu) when T <= 64, every weight
 * is in the tensor-core layout with one bits, group size and K, and no
 * expert stack: for T <= 64 matmul and matmul_rows both run exactly one
 * pt_cuda_tc_gemv launch per weight, which the grouped launch reproduces bit
 * for bit. Above 64 rows in rows mode (a server step carrying prompt rows),
 * one grouped launch per 64 rows, as matmul_rows runs each weight in 64-row
 * pieces (the same bits; a launch of every weight's blocks instead of one
 * launch per weight, whose k and v launches fill a quarter of the SMs).
 * Anything else (and PETREL_CUDA_MULTI=0 / pt_cuda_tc_multi(0), for A/B): the
 * n separate matmul / matmul_rows calls. */
/* PETREL_CUDA_PREFILL_MULTI=0 / pt_cuda_prefill_multi(0): matmul_multi
 * converts x once per weight on the GEMM path, as separate matmuls do (A/B). */
static pt_switch g_prefill_multi = {"PETREL_CUDA_PREFILL_MULTI", 1, -1, 0};
extern "C" void pt_cuda_prefill_multi(int on) { g_prefill_multi.set(on); }

static pt_switch g_tc_multi = {"PETREL_CUDA_MULTI", 1, -1, 0};
extern "C" void pt_cuda_tc_multi(int on) { g_tc_multi.set(on); }

pt_status pt_cuda_matmul_multi(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                               const pt_matrix *const *w, int rows) {
    pt_cuda *c = pt_cuda_of(be);
    if (n < 1 || n > 4) return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: %d weights (1..4)", n);
    for (int i = 0; i < n; i++) {
        if (!pt_cuda_w(w[i]))
            return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: weight %d not prepared on the CUDA backend", i);
        if (w[i]->cols != w[0]->cols || w[i]->n_experts > 1)
            return pt_error(PT_ERR_INVALID_ARG,
                            "matmul_multi: weight %d has K %lld and %lld experts (expected K %lld, no stack)", i,
                            (long long)w[i]->cols, (long long)w[i]->n_experts, (long long)w[0]->cols);
    }
    if (T <= 0) return PT_OK;
    if (n > 1 && (T <= PT_TC_MAX_T || (rows && (w[0]->cols * 4) % 16 == 0)) && !c->no_fast_gemv && g_tc_multi.on() &&
        pt_cuda_tc_multi_ok(c, n, w)) {
        /* the copy matmul and matmul_rows make of an unaligned x (the same values) */
        const float *xin = x;
        if ((uintptr_t)x % 16) {
            if ((size_t)(T * w[0]->cols) * 4 > c->xconv_bytes)
                return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: unaligned input and no scratch reserved");
            CUDA_CHECK(
                cudaMemcpyAsync(c->xconv, x, (size_t)(T * w[0]->cols) * 4, cudaMemcpyDeviceToDevice, c->stream));
            xin = (const float *)c->xconv;
        }
        /* above 64 rows (rows mode: a server step with prompt rows) one grouped launch per 64 rows, as
         * matmul_rows runs each weight */
        for (int64_t t = 0; t < T; t += PT_TC_MAX_T) {
            const int64_t nb = T - t < PT_TC_MAX_T ? T - t : PT_TC_MAX_T;
            float *yp[4];
            for (int i = 0; i < n; i++) yp[i] = y[i] + t * w[i]->rows;
            PT_TRY(pt_cuda_tc_gemv_multi(c, n, yp, xin + t * w[0]->cols, nb, w));
        }
        return PT_OK;
    }
    /* Prefill (T > 64, the GEMM path for every weight): x converted to bf16
     * once for all n weights instead of once per weight; the same values and
     * the same GEMM calls as the separate matmuls. */
    if (!rows && n > 1 && T > PT_TC_MAX_T && g_prefill_multi.on()) {
        bool all = true;
        for (int i = 0; i < n; i++)
            all = all && gemm_bf16(c, w[i]) && w[i]->rows <= INT32_MAX && w[i]->cols <= INT32_MAX;
        if (all) {
            PT_TRY(gemm_scratch(c, T, w[0]->cols));
            PT_TRY(gemm_convert_x(c, x, T, w[0]->cols));
            for (int i = 0; i < n; i++) PT_TRY(gemm_run(c, y[i], c->xconv, T, w[i], 0));
            return PT_OK;
        }
    }
    for (int i = 0; i < n; i++)
        PT_TRY(rows ? pt_cuda_matmul_rows(be, y[i], x, T, w[i], 0) : pt_cuda_matmul(be, y[i], x, T, w[i], 0));
    return PT_OK;
}

/* ---- matmul_glu (backend.h): gate/up and the GLU in one launch ----------------
 * For T <= 64 rows with both weights groupable (the grouped launch's
 * conditions, same row count): pt_cuda_tc_gemv_glu, the GEMV whose epilogue
 * writes glu(gate, up). For T <= 64 matmul and matmul_rows run the same
 * tensor-core launch, so rows changes nothing here. Above 64 rows with rows
 * set (a server step with prompt rows), one such launch per 64 rows, as
 * matmul_rows runs each weight (the same bits; one launch per 64 rows
 * instead of one per weight and a GLU pass). Anything else, and
 * PETREL_CUDA_GEMV_FUSE=0 / pt_cuda_gemv_fuse(0) (A/B): PT_ERR_UNSUPPORTED,
 * and the caller makes the matmul_multi and glu calls (same bits). */
static pt_switch g_gemv_fuse = {"PETREL_CUDA_GEMV_FUSE", 1, -1, 0};
extern "C" void pt_cuda_gemv_fuse(int on) { g_gemv_fuse.set(on); }

pt_status pt_cuda_matmul_glu(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *wg,
                             const pt_matrix *wu, pt_glu_kind act, int rows) {
    pt_cuda *c = pt_cuda_of(be);
    if (!g_gemv_fuse.on() || T < 1 || (T > PT_TC_MAX_T && !rows) || c->no_fast_gemv) return PT_ERR_UNSUPPORTED;
    /* 64-row pieces: the first answers for all (the same weights, and each
     * piece's x is 64·K floats on, as aligned as x) */
    for (int64_t t = 0; t < T; t += PT_TC_MAX_T) {
        const int64_t nb = T - t < PT_TC_MAX_T ? T - t : PT_TC_MAX_T;
        PT_TRY(pt_cuda_tc_gemv_glu(c, y + t * wg->rows, x + t * wg->cols, nb, wg, wu, act));
    }
    return PT_OK;
}

/* ---- the folded norm and residual add (backend.h matmul_norm,
 * matmul_glu_norm, matmul_add) --------------------------------------------
 * A decode row (T = 1) on the tensor-core GEMV (gemv_tc.cu): the layer's
 * RMSNorm folded into the staging of x of the q/k/v and gate/up launches,
 * the residual add into the epilogue of the o and down launches, so a
 * dense layer makes 5 launches instead of 7, with the same bits. More
 * rows (batched decode rows, in pieces of 64 as the rows mode's matmuls):
 * the norm, and the residual add before it (pt_norm_in.add), in the x
 * prepare of the q/k/v and gate/up launches where they take the XP
 * kernels, so a layer makes two launches fewer
 * (PETREL_CUDA_FOLD_NORM_ROWS=0 / pt_cuda_fold_norm_rows(0): not, A/B).
 * Anything else, and PETREL_CUDA_FOLD_NORM=0 / pt_cuda_fold_norm(0) (A/B):
 * PT_ERR_UNSUPPORTED, and the forward pass makes the rms_norm and matmul
 * calls. */
static pt_switch g_fold_norm = {"PETREL_CUDA_FOLD_NORM", 1, -1, 0};
extern "C" void pt_cuda_fold_norm(int on) { g_fold_norm.set(on); }

static bool fold_ok(const pt_cuda *c, int64_t T) { return T == 1 && g_fold_norm.on() && !c->no_fast_gemv; }
/* A decode row's q/k/v norm fold where the caller leaves it to the backend
 * (pt_norm_in.optional): off by default, PETREL_CUDA_FOLD_QKV=1 or
 * pt_cuda_fold_qkv(1) on (read once; -1: back to the environment). On the
 * H200 it lost 1.7% on the 3B and 4B shapes beside the gate/up fold, and on
 * the 1B and 8B shapes the gate/up fold and down add it depends on (x must
 * be added before it) lose more than it wins (bench/RESULTS.md, "the
 * one-row folds re-measured"). */
static pt_switch g_fold_qkv = {"PETREL_CUDA_FOLD_QKV", 0, -1, 0};
extern "C" void pt_cuda_fold_qkv(int on) { g_fold_qkv.set(on); }
static pt_switch g_fold_rows = {"PETREL_CUDA_FOLD_NORM_ROWS", 1, -1, 0};
extern "C" void pt_cuda_fold_norm_rows(int on) { g_fold_rows.set(on); }
/* the norm's fold at T rows (matmul_norm, matmul_glu_norm) */
static bool fold_norm_ok(const pt_cuda *c, int64_t T) {
    if (!fold_ok(c, 1) || T < 1 || (T > 1 && !g_fold_rows.on())) return false;
    /* above 64 rows, pieces of 64 (as matmul_multi and matmul_glu in rows
     * mode): a last piece of 9 or more rows takes the XP launches wherever
     * the first one does, so the pieces fold alike */
    return T <= PT_TC_MAX_T || T % PT_TC_MAX_T == 0 || T % PT_TC_MAX_T > 8;
}

/* The folded norm over T rows in pieces of at most PT_TC_MAX_T (the same
 * rows as the separate calls' pieces): the first piece answers for all
 * (PT_ERR_UNSUPPORTED: nothing launched); a later piece that declines
 * would leave the step half done, an internal error. */
template <typename F>
static pt_status fold_pieces(int64_t T, const pt_norm_in *nrm, int64_t K, F piece) {
    for (int64_t t = 0; t < T; t += PT_TC_MAX_T) {
        const int64_t nb = T - t < PT_TC_MAX_T ? T - t : PT_TC_MAX_T;
        pt_norm_in np = *nrm;
        if (np.add) np.add += t * K;
        const pt_status st = piece(t, nb, &np);
        if (st == PT_ERR_UNSUPPORTED && t > 0)
            return pt_error(PT_ERR_INTERNAL, "folded norm: the piece of rows %lld..%lld declined", (long long)t,
                            (long long)(t + nb - 1));
        if (st != PT_OK) return st;
    }
    return PT_OK;
}

pt_status pt_cuda_matmul_norm(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                              const pt_matrix *const *w, const pt_norm_in *nrm) {
    pt_cuda *c = pt_cuda_of(be);
    if (n < 1 || n > 4 || !fold_norm_ok(c, T) || (n > 1 && !g_tc_multi.on())) return PT_ERR_UNSUPPORTED;
    if (T == 1 && nrm->optional && !g_fold_qkv.on()) return PT_ERR_UNSUPPORTED;
    const int64_t K = w[0]->cols;
    return fold_pieces(T, nrm, K, [&](int64_t t, int64_t nb, const pt_norm_in *np) {
        float *yp[4];
        for (int i = 0; i < n; i++) yp[i] = y[i] + t * w[i]->rows;
        return pt_cuda_tc_gemv_norm(c, n, yp, x + t * K, nb, w, np);
    });
}

pt_status pt_cuda_matmul_glu_norm(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *wg,
                                  const pt_matrix *wu, pt_glu_kind act, const pt_norm_in *nrm) {
    pt_cuda *c = pt_cuda_of(be);
    if (!fold_norm_ok(c, T) || !g_gemv_fuse.on()) return PT_ERR_UNSUPPORTED;
    return fold_pieces(T, nrm, wg->cols, [&](int64_t t, int64_t nb, const pt_norm_in *np) {
        return pt_cuda_tc_gemv_glu_norm(c, y + t * wg->rows, x + t * wg->cols, nb, wg, wu, act, np);
    });
}

pt_status pt_cuda_matmul_add(pt_backend *be, float *x, const float *a, int64_t T, const pt_matrix *w) {
    pt_cuda *c = pt_cuda_of(be);
    if (!fold_ok(c, T)) {
        c->pf_n = 0; /* a prefetch hint goes with this call or not at all */
        return PT_ERR_UNSUPPORTED;
    }
    return pt_cuda_tc_gemv_add(c, x, a, w);
}
