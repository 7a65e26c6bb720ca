/* Prefill GEMM on the tensor cores with the dequantization in shared memory:
 * y[T, N] = x[T, K] · Wᵀ (+ bias), W MLX affine 4- or 8-bit with bf16 scales
 * and biases (group 32/64/128), x already bf16 [T, K] (matmul.cu converts
 * the f32-held activations once per call), bf16 activation mode. It replaces
 * dequantize-to-scratch + cuBLAS (matmul.cu) where measured faster: no bf16
 * copy of the weight goes through device memory and the bias and bf16
 * rounding are applied as the accumulators are stored. Not here: the decode
 * GEMV (T <= 64), dense weights (cuBLAS reads them in place). MoE prefill
 * (moe.cu) uses the grouped mode: rows sorted by expert, one launch per
 * projection for all experts, each block reading its tile's expert; there
 * the kernel also takes dense bf16 expert stacks (BITS = 16: the weight
 * tile is copied into shared memory as it is, nothing to dequantize), which
 * otherwise cost one cuBLAS GEMM per expert and projection.
 *
 * Numerics (L1): each weight is dequantized exactly as the scratch kernel
 * does it (s·q, then + b, each rounded, then one bf16 rounding), products
 * of bf16 values accumulate in f32 in the tensor cores (mma.sync m16n8k16),
 * K in order in steps of 16 per output; only the summation order differs
 * from cuBLAS.
 *
 * Tiling. A block of 8 warps computes a 128 (tokens) × 128 (weight rows)
 * tile over K in steps of 64. Per step, cp.async brings the x tile (128 ×
 * 64 bf16, 16 KiB) and the raw codes of the 128 rows (4 or 8 KiB) into a
 * 3-deep ring; the block then dequantizes the step's codes into one bf16
 * weight tile (each thread: 32 values of one row, one scale and bias, which
 * it loaded into registers a step ahead), and the warps (2 along tokens × 4
 * along rows, 64 × 32 each) run 4 k16 slices of 4 × 4 mma each, fragments
 * from ldmatrix. Both bf16 tiles are stored with 128-byte rows whose 16-byte
 * chunks are XOR-swizzled by (row & 7), so the 8 rows an ldmatrix phase
 * reads sit in 8 different bank groups. Two blocks fit one SM (77 / 90 KiB
 * of shared memory), so one block's dequantization overlaps the other's
 * mma. Rows past T or N are loaded as zeros and not stored.
 *
 * Also here: pt_cuda_matmul_rate (cuda.h), the bf16 tensor-core rate of a
 * cuBLAS GEMM that `petrel bench` reports prefill's fraction of. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"

#define TC_BM 128
#define TC_BN 128
#define TC_BK 64
#define TC_STAGES 3
#define TC_THREADS 256

/* BITS 4 / 8: MLX affine codes; 16: dense bf16 weights (grouped mode only),
 * whose stage holds the weight tile itself, swizzled like the x tile. */
template <int BITS>
struct tc_layout {
    static constexpr int X_BYTES = TC_BM * TC_BK * 2;    /* bf16 x tile, swizzled */
    static constexpr int RAW_ROW = TC_BK * BITS / 8;     /* code bytes of one row per step: 32, 64 (or 128: bf16) */
    static constexpr int RAW_BYTES = TC_BN * RAW_ROW;
    static constexpr int STAGE = X_BYTES + RAW_BYTES;
    static constexpr int W_BYTES = BITS == 16 ? 0 : TC_BN * TC_BK * 2; /* bf16 weight tile, swizzled */
    static constexpr int TOTAL = TC_STAGES * STAGE + W_BYTES;
};

struct tc_args {
    float *y;            /* [T, ldy] f32 */
    const bf16 *x;       /* [T, K] */
    const uint8_t *codes;/* the expert's codes [N, K·BITS/8] (BITS 16: its bf16 weights [N, K]) */
    const bf16 *sc, *bi; /* the expert's [N, K/gs] */
    const void *bias;    /* the expert's [N] of bt, or NULL */
    pt_ftype bt;
    int64_t ldy;
    int T, N, K, gs;
    /* Grouped mode (MoE prefill, moe.cu): block x takes tiles[x] = {first row,
     * end row, expert, 0} of x and y (rows sorted by expert) and that
     * expert's weight, codes/scales advanced by expert · e_codes / e_sb.
     * NULL: block x takes rows [128·x, min(128·x + 128, T)), expert 0. */
    const int4 *tiles;
    int64_t e_codes, e_sb;
};

/* Byte offset of (row, k) in a swizzled 128-byte-row tile (k multiple of 8). */
__device__ __forceinline__ uint32_t tc_swz(int row, int k) {
    return (uint32_t)(row * 128 + ((((k >> 3) ^ (row & 7))) << 4));
}

/* Two codes → bf16x2 of s·q + b (low half: the first). The code → float is
 * exact through the mantissa of 2^23. */
__device__ __forceinline__ uint32_t tc_dq2(uint32_t q0, uint32_t q1, float s, float b) {
    const float f0 = __uint_as_float(0x4B000000u | q0) - 8388608.0f;
    const float f1 = __uint_as_float(0x4B000000u | q1) - 8388608.0f;
    __nv_bfloat162 h = __floats2bfloat162_rn(__fadd_rn(__fmul_rn(s, f0), b), __fadd_rn(__fmul_rn(s, f1), b));
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int BITS>
__global__ void __launch_bounds__(TC_THREADS, 2) gemm_tc_kernel(tc_args a) {
    using L = tc_layout<BITS>;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t ws = sbase + TC_STAGES * L::STAGE; /* the bf16 weight tile */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n0 = blockIdx.y * TC_BN;
    int m0 = blockIdx.x * TC_BM, mend = a.T;
    const uint8_t *codes = a.codes;
    const bf16 *scp = a.sc, *bip = a.bi;
    if (a.tiles) {
        const int4 tl = a.tiles[blockIdx.x];
        m0 = tl.x, mend = tl.y;
        codes += (int64_t)tl.z * a.e_codes;
        scp += (int64_t)tl.z * a.e_sb;
        bip += (int64_t)tl.z * a.e_sb;
    }
    const int K = a.K, KT = K / TC_BK, ngroups = BITS == 16 ? 0 : K / a.gs;
    const int64_t row_bytes = (int64_t)K * BITS / 8;

    /* cp.async of step kt into ring slot sl: x (4 chunks per thread) and codes (1 or 2) */
    auto load_stage = [&](int sl, int kt) {
        const uint32_t xs = sbase + sl * L::STAGE, rs = xs + L::X_BYTES;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int q = tid + i * TC_THREADS, row = q >> 3, c = q & 7, gm = m0 + row;
            const bool ok = gm < mend;
            const bf16 *src = a.x + (int64_t)(ok ? gm : 0) * K + kt * TC_BK + c * 8;
            pt_cp16(xs + tc_swz(row, c * 8), src, ok);
        }
        constexpr int R = L::RAW_ROW / 16; /* 16-byte chunks per row */
#pragma unroll
        for (int i = 0; i < TC_BN * R / TC_THREADS; i++) {
            const int q = tid + i * TC_THREADS, row = q / R, c = q % R, gn = n0 + row;
            const bool ok = gn < a.N;
            const uint8_t *src = codes + (int64_t)(ok ? gn : 0) * row_bytes + kt * L::RAW_ROW + c * 16;
            pt_cp16(rs + (BITS == 16 ? tc_swz(row, c * 8) : row * L::RAW_ROW + c * 16), src, ok);
        }
    };

    /* the dequantizing thread's row and half of the step: 32 values, one group */
    const int drow = tid >> 1, dhalf = tid & 1, dn = n0 + drow;
    auto load_sb = [&](int kt, float &s, float &b) {
        if (BITS != 16 && dn < a.N) {
            const int64_t gi = (int64_t)dn * ngroups + (kt * TC_BK + dhalf * 32) / a.gs;
            s = __bfloat162float(scp[gi]);
            b = __bfloat162float(bip[gi]);
        } else {
            s = 0.f, b = 0.f;
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;

#pragma unroll
    for (int st = 0; st < TC_STAGES - 1; st++) {
        if (st < KT) load_stage(st, st);
        pt_cp_commit();
    }
    float s_cur, b_cur;
    load_sb(0, s_cur, b_cur);
    const int wm = warp & 1, wn = warp >> 1;

    for (int kt = 0; kt < KT; kt++) {
        const int sl = kt % TC_STAGES;
        pt_cp_wait<TC_STAGES - 2>();
        __syncthreads(); /* step kt landed; every warp is done with the weight tile of step kt-1 */
        float s_nxt = 0.f, b_nxt = 0.f;
        if (kt + 1 < KT) load_sb(kt + 1, s_nxt, b_nxt); /* (BITS 16: zeros, no load) */
        /* dequantize: codes of (drow, dhalf) → 4 swizzled 16-byte chunks of the weight tile */
        if constexpr (BITS != 16) {
            const uint8_t *raw = smem + sl * L::STAGE + L::X_BYTES + drow * L::RAW_ROW + dhalf * (L::RAW_ROW / 2);
            if constexpr (BITS == 4) {
                const uint4 w = *reinterpret_cast<const uint4 *>(raw);
                const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int cc = 0; cc < 4; cc++) {
                    uint32_t o[4];
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        o[j] = tc_dq2((wv[cc] >> (8 * j)) & 0xFu, (wv[cc] >> (8 * j + 4)) & 0xFu, s_cur, b_cur);
                    const uint32_t dst = ws + tc_swz(drow, (dhalf * 4 + cc) * 8);
                    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst), "r"(o[0]), "r"(o[1]),
                                 "r"(o[2]), "r"(o[3]));
                }
            } else if constexpr (BITS == 8) {
                const uint4 w0 = *reinterpret_cast<const uint4 *>(raw);
                const uint4 w1 = *reinterpret_cast<const uint4 *>(raw + 16);
                const uint32_t wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
                for (int cc = 0; cc < 4; cc++) {
                    uint32_t o[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint32_t word = wv[2 * cc + (j >> 1)];
                        const int sh = (j & 1) * 16;
                        o[j] = tc_dq2((word >> sh) & 0xFFu, (word >> (sh + 8)) & 0xFFu, s_cur, b_cur);
                    }
                    const uint32_t dst = ws + tc_swz(drow, (dhalf * 4 + cc) * 8);
                    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst), "r"(o[0]), "r"(o[1]),
                                 "r"(o[2]), "r"(o[3]));
                }
            }
        }
        {
            const int nk = kt + TC_STAGES - 1; /* refills the slot of step kt-1, free since the barrier */
            if (nk < KT) load_stage(nk % TC_STAGES, nk);
            pt_cp_commit();
        }
        if constexpr (BITS != 16) __syncthreads(); /* the weight tile of step kt is complete */
        const uint32_t xs = sbase + sl * L::STAGE;
        /* the weight tile: dequantized above, or (bf16) the stage's copy */
        const uint32_t wt = BITS == 16 ? xs + L::X_BYTES : ws;
#pragma unroll
        for (int ks = 0; ks < TC_BK / 16; ks++) {
            uint32_t af[4][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int row = wm * 64 + mi * 16 + (lane & 15), k = ks * 16 + (lane >> 4) * 8;
                pt_ldm4(af[mi], xs + tc_swz(row, k));
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                const int mi_l = lane >> 3;
                const int row = wn * 32 + nj * 16 + ((mi_l >> 1) << 3) + (lane & 7), k = ks * 16 + (mi_l & 1) * 8;
                uint32_t r[4];
                pt_ldm4(r, wt + tc_swz(row, k));
                bfr[2 * nj][0] = r[0], bfr[2 * nj][1] = r[1];
                bfr[2 * nj + 1][0] = r[2], bfr[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) pt_mma16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        }
        s_cur = s_nxt, b_cur = b_nxt;
    }
    pt_cp_wait<0>();

    /* epilogue: + bias, bf16 rounding, f32 stores */
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int ni = 0; ni < 4; ni++) {
        const int n = n0 + wn * 32 + ni * 8 + 2 * t4;
        float bv0 = 0.f, bv1 = 0.f;
        if (a.bias) {
            if (n < a.N) bv0 = pt_ld(a.bt, a.bias, n);
            if (n + 1 < a.N) bv1 = pt_ld(a.bt, a.bias, n + 1);
        }
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = m0 + wm * 64 + mi * 16 + g + 8 * h;
                if (m >= mend) continue;
                float *yr = a.y + (int64_t)m * a.ldy;
                if (n < a.N) yr[n] = pt_round_bf(acc[mi][ni][2 * h] + bv0);
                if (n + 1 < a.N) yr[n + 1] = pt_round_bf(acc[mi][ni][2 * h + 1] + bv1);
            }
    }
}

template <int BITS>
static pt_status launch_tc(pt_cuda *c, const tc_args &a, int64_t mtiles) {
    static int attr_set = 0;
    const int smem = tc_layout<BITS>::TOTAL;
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(gemm_tc_kernel<BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = 1;
    }
    dim3 grid((unsigned)mtiles, (unsigned)((a.N + TC_BN - 1) / TC_BN));
    gemm_tc_kernel<BITS><<<grid, TC_THREADS, smem, c->stream>>>(a);
    CUDA_CHECK_LAUNCH("prefill GEMM (tensor cores)");
    return PT_OK;
}

pt_status pt_cuda_gemm_tc(pt_cuda *c, float *y, const bf16 *x, int64_t T, const pt_matrix *w, int64_t expert) {
    const int bits = w->bits, gs = w->group_size;
    const int64_t N = w->rows, K = w->cols;
    if ((bits != 4 && bits != 8) || (gs != 32 && gs != 64 && gs != 128) || w->dtype != PT_FT_BF16 || K % TC_BK ||
        c->base.act != PT_ACT_BF16 || T < 1 || T > INT32_MAX || N > INT32_MAX || K > INT32_MAX ||
        (T + TC_BM - 1) / TC_BM > 2147483647LL || (N + TC_BN - 1) / TC_BN > 65535 || (uintptr_t)x % 16)
        return PT_ERR_UNSUPPORTED;
    const pt_cuda_weight *cw = pt_cuda_w(w);
    /* the decode GEMV's repacked layout (gemv_tc.cu) has no MLX codes or
     * scale arrays to read: dequantize + cuBLAS serves it */
    if (cw->tc) return PT_ERR_UNSUPPORTED;
    const int64_t e0 = expert * N, gpr = K / gs;
    tc_args a;
    a.y = y;
    a.x = x;
    a.codes = (const uint8_t *)cw->data + e0 * (K * bits / 8);
    a.sc = (const bf16 *)cw->scales + e0 * gpr;
    a.bi = (const bf16 *)cw->biases + e0 * gpr;
    a.bias = cw->bias ? (const char *)cw->bias + (size_t)e0 * pt_ftype_size(w->bias_dtype) : NULL;
    a.bt = w->bias_dtype;
    a.ldy = N;
    a.T = (int)T;
    a.N = (int)N;
    a.K = (int)K;
    a.gs = gs;
    a.tiles = NULL;
    a.e_codes = a.e_sb = 0;
    const int64_t mt = (T + TC_BM - 1) / TC_BM;
    return bits == 4 ? launch_tc<4>(c, a, mt) : launch_tc<8>(c, a, mt);
}

int pt_cuda_gemm_tc_ok(const pt_cuda *c, const pt_matrix *w) {
    const int bits = w->bits, gs = w->group_size;
    /* weights in the decode GEMV's tensor-core layout (gemv_tc.cu) are not read here; dense: bf16 only */
    return !pt_cuda_w(w)->tc && ((bits == 4 || bits == 8) && (gs == 32 || gs == 64 || gs == 128) || bits == 0) &&
           w->dtype == PT_FT_BF16 && w->cols % TC_BK == 0 && c->base.act == PT_ACT_BF16 && !w->bias &&
           w->rows <= INT32_MAX && w->cols <= INT32_MAX && (w->rows + TC_BN - 1) / TC_BN <= 65535;
}

pt_status pt_cuda_gemm_tc_grouped(pt_cuda *c, float *y, int64_t ldy, const bf16 *x, int64_t rows, const pt_matrix *w,
                                  const int4 *tiles, int64_t ntiles) {
    if (!pt_cuda_gemm_tc_ok(c, w) || rows > INT32_MAX || ntiles < 1 || ntiles > INT32_MAX || (uintptr_t)x % 16)
        return pt_error(PT_ERR_INTERNAL, "grouped tensor-core GEMM: unsupported weight or shape");
    const pt_cuda_weight *cw = pt_cuda_w(w);
    const int64_t N = w->rows, K = w->cols;
    tc_args a;
    a.y = y;
    a.x = x;
    a.codes = (const uint8_t *)cw->data;
    a.sc = (const bf16 *)cw->scales;
    a.bi = (const bf16 *)cw->biases;
    a.bias = NULL;
    a.bt = w->bias_dtype;
    a.ldy = ldy;
    a.T = (int)rows;
    a.N = (int)N;
    a.K = (int)K;
    a.tiles = tiles;
    if (w->bits == 0) { /* dense bf16: the weights themselves, no scales */
        a.gs = TC_BK;
        a.e_codes = N * K * 2;
        a.e_sb = 0;
        return launch_tc<16>(c, a, ntiles);
    }
    a.gs = w->group_size;
    a.e_codes = N * (K * w->bits / 8);
    a.e_sb = N * (K / w->group_size);
    return w->bits == 4 ? launch_tc<4>(c, a, ntiles) : launch_tc<8>(c, a, ntiles);
}

/* ---- the matrix-rate roofline (cuda.h) ----------------------------------
 * pt_cuda_matmul_rate: a cuBLAS bf16 GEMM C[n, n] = A[n, n]·B[n, n] (f32
 * accumulation, bf16 output, the prefill GEMM's compute type) on
 * pseudo-random values (zeros run faster than real data), median of 5 timed
 * runs after a warm-up: the tensor-core rate `petrel bench` reports
 * prefill's fraction of. Not the engine's path: a benchmark of the device. */
__global__ void rate_fill_kernel(__nv_bfloat16 *p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2bfloat16_rn((float)(h & 0xffff) / 32768.0f - 1.0f);
    }
}

extern "C" pt_status pt_cuda_matmul_rate(int n, double *tflops) {
    *tflops = 0;
    if (n < 256 || n > 32768) return pt_error(PT_ERR_INVALID_ARG, "matrix rate: size %d (256..32768)", n);
    __nv_bfloat16 *a = NULL, *b = NULL, *cm = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    pt_status st = PT_OK;
    const size_t nn = (size_t)n * (size_t)n;
    float ms[5];
    const float one = 1.f, zero = 0.f;
#define PT_MR(call) CUDA_CHECK_GOTO(call, st, done)
#define PT_MRB(call)                                                                  \
    do {                                                                              \
        cublasStatus_t s_ = (call);                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                            \
            st = pt_error(PT_ERR_DEVICE, "%s failed: cuBLAS status %d", #call, (int)s_); \
            goto done;                                                                \
        }                                                                             \
    } while (0)
    PT_MR(cudaMalloc((void **)&a, nn * 2));
    PT_MR(cudaMalloc((void **)&b, nn * 2));
    PT_MR(cudaMalloc((void **)&cm, nn * 2));
    rate_fill_kernel<<<1024, 256>>>(a, (int64_t)nn, 0x1234567u);
    rate_fill_kernel<<<1024, 256>>>(b, (int64_t)nn, 0x89abcdefu);
    PT_MR(cudaGetLastError());
    PT_MRB(cublasCreate(&h));
    PT_MR(cudaEventCreate(&e0));
    PT_MR(cudaEventCreate(&e1));
    for (int r = -1; r < 5; r++) {
        PT_MR(cudaEventRecord(e0));
        PT_MRB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero,
                            cm, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        PT_MR(cudaEventRecord(e1));
        PT_MR(cudaEventSynchronize(e1));
        if (r >= 0) PT_MR(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    for (int i = 1; i < 5; i++) /* insertion sort: the median of 5 */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            const float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    *tflops = 2.0 * (double)n * (double)n * (double)n / (ms[2] * 1e-3) / 1e12;
done:
#undef PT_MR
#undef PT_MRB
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (h) cublasDestroy(h);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (cm) cudaFree(cm);
    return st;
}
