/* The CUDA MoE decode path (PETREL_CUDA_MOE_V2, on unless "0"): routing one
 * warp per token, the experts' gate|up + activation and down + combine as
 * one-warp-per-row GEMVs over the (token, k) items or over the experts
 * that the items picked. Not here: the block routing kernel, the combine
 * kernel and the grouped prefill (moe.cu), the shared GEMV (matmul.cu).
 *
 * ---- the decode path ---------------------------------------------------
 * The same arithmetic as the kernels it replaces, in fewer and wider
 * launches (the per-item GEMV ran 6144 blocks of one warp per projection and
 * the routing and combine were one-block kernels):
 *  - routing: one warp per token (moe_route_warp_kernel) instead of a block
 *    of ROUTE_THREADS; the softmax sum is formed in the block kernel's order
 *    (the ROUTE_THREADS virtual threads' serial sums, each warp of them
 *    reduced by the butterfly, the four warp sums as (s0 + s2) + (s1 + s3)),
 *    the top-k is an exact argmax (order-free), so the picks and weights are
 *    the same bits;
 *  - gate|up + activation: one launch (moe_gu_kernel) over (row pair, item);
 *    the block stages x in shared memory once, a warp holds its lanes'
 *    slices of it in registers and computes two gate rows and the matching
 *    two up rows (every code and scale load issued before the arithmetic),
 *    then the GLU, so the gate/up scratch and the GLU launch go away;
 *  - down + combine: one launch (moe_down_kernel) over (8 output rows,
 *    token); warp j computes the 8 rows of the token's j-th expert into
 *    shared memory, then 8 threads form the weighted sum in ascending
 *    (expert, slot) order, rounding after each add as moe_combine_kernel.
 * Each row's dot product is formed exactly as the fast GEMV (matmul.cu,
 * gemv_fast_kernel) forms it with one warp per row: lane l takes the
 * 16-byte code chunks l, l + 32, ... in order, per chunk
 * scale·Σq·x + bias·Σx, then the warp's butterfly sum; so a token's result
 * depends on nothing but its own row (batch-invariant), and equals the
 * per-item path wherever that path chose one warp per row (the MoE shapes'
 * decode). Applies to 4/8-bit experts in the MLX layout with K <= 2048 (x
 * fits the registers: 64 values per lane); other weights take the per-item
 * path. From MOE_EXPERT_MIN_B items (T·top_k) on, the same per-row
 * arithmetic runs over an expert grid instead (moe_tiles_kernel,
 * moe_gu_tile_kernel, moe_down_tile_kernel + moe_combine_kernel, below):
 * the items grouped by expert into tiles of up to four, one block per
 * (rows, tile) that keeps its rows in registers and converts each code once
 * for all the tile's items (two shapes: lean below MOE_TILE_LEAN_B items,
 * wide from there); each (row, item) value and the combine are the same
 * bits as in the per-item grid. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe_decode.cuh"

static int g_moe_v2 = -1;
int pt_cuda_moe_v2_on(void) {
    if (g_moe_v2 < 0) g_moe_v2 = pt_env_on("PETREL_CUDA_MOE_V2");
    return g_moe_v2;
}
/* For tests and benchmarks that compare both paths in one process: 1 the
 * decode path above, 0 the per-item kernels, -1 re-reads the environment. */
extern "C" void pt_cuda_moe_select(int v2) {
    g_moe_v2 = v2 < 0 ? -1 : v2 != 0;
    (void)pt_cuda_moe_v2_on();
}

#define ROUTE_THREADS 128 /* the block routing kernel's threads (moe.cu), whose sums this repeats */
#define ROUTE_WARPS 4 /* tokens (warps) per block of the warp routing kernel */

/* One warp per token; prob[] is this warp's slice of the shared memory
 * (E floats). Same results as moe_route_kernel (moe.cu; see above). */
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_warp_kernel(int32_t *idx, float *weights, const float *logits, int64_t T, int E, int k, int renorm,
                          const float *per_expert_scale, int bf) {
    extern __shared__ float route_sm[]; /* [warps per block][E] */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= T) return;
    float *prob = route_sm + (size_t)warp * E;
    const float *l = logits + t * E;
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = pt_warp_max(m); /* a max: the same whatever the order */
    /* virtual thread v = 32·w + lane of the ROUTE_THREADS-thread block sums
     * e = v, v + ROUTE_THREADS, ... in that order */
    float s[ROUTE_THREADS / 32];
#pragma unroll
    for (int w = 0; w < ROUTE_THREADS / 32; w++) {
        float a = 0.f;
        for (int e = 32 * w + lane; e < E; e += ROUTE_THREADS) {
            const float p = expf(l[e] - m);
            prob[e] = p;
            a += p;
        }
        s[w] = pt_warp_sum(a);
    }
    static_assert(ROUTE_THREADS == 128, "pt_block_sum's second stage below is written for four warps");
    const float sum = (s[0] + s[2]) + (s[1] + s[3]);
    __syncwarp();
    for (int e = lane; e < E; e += 32) prob[e] = prob[e] / sum;
    __syncwarp();
    /* lane 0 keeps the picks (k <= 64) and writes them once at the end:
     * reading them back from global memory cost a round trip per pick */
    int32_t pick[64];
    float pw[64];
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int bi = -1;
        for (int e = lane; e < E; e += 32)
            if (prob[e] != -INFINITY && (bi < 0 || prob[e] > best)) {
                best = prob[e];
                bi = e;
            }
        /* (value, index) argmax, ties to the lower index: one total order,
         * so every lane ends with the same pick */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            pick[j] = bi;
            pw[j] = bi >= 0 ? prob[bi] : 0.f;
            if (bi >= 0) prob[bi] = -INFINITY; /* taken */
        }
        __syncwarp();
    }
    if (lane == 0) {
        int32_t *it = idx + t * k;
        float *wt = weights + t * k;
        float tsum = 0.f;
        for (int j = 0; j < k; j++) tsum += pw[j];
        for (int j = 0; j < k; j++) {
            float w = renorm ? pw[j] / tsum : pw[j];
            if (per_expert_scale) w *= per_expert_scale[pick[j]];
            it[j] = pick[j];
            wt[j] = pt_rnd(bf, w);
        }
    }
}

/* The routing of moe.cu's pt_cuda_moe_route with the decode path on. */
pt_status pt_cuda_moe_route_warp(pt_cuda *c, int32_t *idx, float *weights, const float *logits, int64_t T,
                                 const pt_moe_route *p) {
    const int E = p->n_experts, k = p->top_k;
    /* four tokens per block while their slices fit the default 48 KiB */
    const int wpb = (size_t)E * sizeof(float) * ROUTE_WARPS <= 48 * 1024 ? ROUTE_WARPS : 1;
    pt_launch(moe_route_warp_kernel, dim3((unsigned)((T + wpb - 1) / wpb)), dim3(32 * wpb),
              (size_t)wpb * E * sizeof(float), c->stream, pt_pdl_chain(), idx, weights, logits, T, E, k, p->renorm,
              p->per_expert_scale, pt_cuda_bf(&c->base));
    CUDA_CHECK_LAUNCH("moe_route");
    return PT_OK;
}

/* ---- decode path: the expert GEMVs ---------------------------------------- */

#define MOE_GU_WARPS 4 /* warps per block of moe_gu_kernel */
#define MOE_GU_RPW 2   /* gate rows (and as many up rows) per warp */
#define MOE_DN_ROWS 8  /* output rows per block of moe_down_kernel */
#define MOE_DN_WARPS 8 /* most warps per block of moe_down_kernel (one expert each) */
#define MOE_MAX_X 64   /* x values per lane held in registers: K <= 32·64 = 2048 */

/* One expert stack in the MLX layout, the part a kernel reads. */
struct moe_qm {
    const uint32_t *codes;        /* [E·rows, K·BITS/32] */
    const void *scales, *biases;  /* [E·rows, K/gs] of st */
    const void *bias;             /* [E·rows] of bt, or NULL */
    pt_ftype st, bt;
    int gs, gshift;               /* group size, its log2 (gs is 32, 64 or 128) */
    int64_t rows;                 /* rows per expert */
    int64_t row_off;              /* first row used (the up half of a fused gate|up) */
};

static moe_qm moe_qm_of(const pt_matrix *w, int64_t row_off) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    moe_qm m;
    m.codes = (const uint32_t *)cw->data;
    m.scales = cw->scales;
    m.biases = cw->biases;
    m.bias = cw->bias;
    m.st = w->dtype;
    m.bt = w->bias_dtype;
    m.gs = w->group_size;
    m.gshift = w->group_size == 32 ? 5 : w->group_size == 64 ? 6 : 7;
    m.rows = w->rows;
    m.row_off = row_off;
    return m;
}

/* Item b's expert; outside [0, E) it raises the error word (matmul.cu's
 * protocol: flag 2, the value) and the item computes zeros from expert 0. */
__device__ __forceinline__ int64_t moe_item_expert(const int32_t *idx, int64_t b, int64_t E, int *err, bool &ok) {
    int64_t e = idx[b];
    ok = e >= 0 && e < E;
    if (!ok) {
        if ((threadIdx.x & 31) == 0 && atomicCAS(err, 0, 2) == 0) err[1] = (int)e;
        e = 0;
    }
    return e;
}

/* The lane's x chunks c = lane + 32·j (VPC values each, chunk c at
 * x + c·stride), as the fast GEMV uses them: 4-bit values pre-multiplied by
 * 16^-i (i = the value's place in its 16-bit half: exact, a power of two),
 * and Σx per chunk in its order. SMEM: x is the shared-memory copy of
 * moe_stage_x (plain loads), else global memory (read-only loads). */
template <int BITS, int CPL, bool SMEM>
__device__ __forceinline__ void moe_load_x(float (&xr)[CPL][128 / BITS], float (&sx)[CPL], const float *x,
                                           int64_t stride, int64_t nchunks, int lane) {
    constexpr int VPC = 128 / BITS;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int64_t c = lane + 32 * j;
        sx[j] = 0.f;
#pragma unroll
        for (int q = 0; q < VPC / 4; q++) {
            float4 xv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (c < nchunks) {
                const float4 *p = reinterpret_cast<const float4 *>(x + c * stride) + q;
                xv = SMEM ? *p : __ldg(p);
            }
            sx[j] += xv.x + xv.y + xv.z + xv.w;
            if constexpr (BITS == 4) {
                xr[j][4 * q] = xv.x, xr[j][4 * q + 1] = xv.y * 0.0625f, xr[j][4 * q + 2] = xv.z * 0.00390625f,
                          xr[j][4 * q + 3] = xv.w * 0.000244140625f;
            } else {
                xr[j][4 * q] = xv.x, xr[j][4 * q + 1] = xv.y, xr[j][4 * q + 2] = xv.z, xr[j][4 * q + 3] = xv.w;
            }
        }
    }
}

/* x [K] into shared memory by the whole block (coalesced 16-byte loads),
 * chunk c at xs + c·(VPC + 4). Read straight from global memory, each
 * lane's chunk is 128 bytes (4-bit) from its neighbour's, so one 16-byte
 * load of the warp touches 32 lines (32 L1 wavefronts; at one warp per row
 * this was the GEMV's bottleneck); the 4-float pad here puts the lanes'
 * reads four to a bank group: 4 wavefronts per 512 bytes, the minimum. */
template <int BITS>
__device__ __forceinline__ void moe_stage_x(float *xs, const float *x, int64_t K) {
    constexpr int VPC = 128 / BITS;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (int64_t i = threadIdx.x; i < K / 4; i += blockDim.x) {
        const int64_t c = i / (VPC / 4), q = i % (VPC / 4);
        *reinterpret_cast<float4 *>(xs + c * (VPC + 4) + 4 * q) = __ldg(x4 + i);
    }
}

/* Σ q·x' over one 16-byte chunk of codes, in gemv_fast_kernel's order (the
 * magic-number conversion: a code OR-ed into the mantissa of 2^23). */
template <int BITS>
__device__ __forceinline__ float moe_chunk_dot(const uint4 &w, const float *xr) {
    const float MAGIC = 8388608.0f;
    constexpr int VPC = 128 / BITS;
    float d = 0.f;
#pragma unroll
    for (int q = 0; q < VPC / 4; q++) {
        const int wi = BITS == 4 ? q >> 1 : q;
        const uint32_t word = wi == 0 ? w.x : wi == 1 ? w.y : wi == 2 ? w.z : w.w;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t bits;
            if constexpr (BITS == 4) {
                const uint32_t half = (q & 1) ? word >> 16 : word;
                bits = (half & (0xFu << (4 * i))) | 0x4B000000u;
            } else {
                bits = __byte_perm(word, 0x4B000000u, (unsigned)(i | (4 << 4) | (5 << 8) | (7 << 12)));
            }
            d = fmaf(__uint_as_float(bits) - MAGIC, xr[4 * q + i], d);
        }
    }
    return d;
}

/* The lane's codes of global row grow (chunks lane + 32·j; zeros past the
 * row) and the chunks' scales and biases: every load of a row issued before
 * any is used, so a warp's rows are in flight together (loaded inside the
 * dot product, each row's scales cost a memory round trip in turn). */
template <int BITS, int CPL>
__device__ __forceinline__ void moe_load_row(uint4 (&w)[CPL], float (&sc)[CPL], float (&bi)[CPL], const moe_qm &m,
                                             int64_t grow, int64_t K, int64_t nchunks, int lane) {
    constexpr int VPC = 128 / BITS;
    const uint4 *rp = reinterpret_cast<const uint4 *>(m.codes + grow * (K * BITS / 32));
    const int64_t ngroups = K >> m.gshift; /* shifts: a 64-bit division is a subroutine */
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int c = lane + 32 * j;
        w[j] = make_uint4(0u, 0u, 0u, 0u);
        sc[j] = bi[j] = 0.f;
        if (c < nchunks) {
            w[j] = __ldg(rp + c);
            const int64_t gi = grow * ngroups + ((c * VPC) >> m.gshift);
            if (m.st == PT_FT_BF16) {
                sc[j] = __bfloat162float(__ldg((const __nv_bfloat16 *)m.scales + gi));
                bi[j] = __bfloat162float(__ldg((const __nv_bfloat16 *)m.biases + gi));
            } else {
                sc[j] = pt_ld(m.st, m.scales, gi);
                bi[j] = pt_ld(m.st, m.biases, gi);
            }
        }
    }
}

/* The lane's partial of a row: Σ over its chunks of scale·d + bias·Σx. */
template <int BITS, int CPL>
__device__ __forceinline__ float moe_row_partial(const uint4 (&w)[CPL], const float (&sc)[CPL], const float (&bi)[CPL],
                                                 const float (&xr)[CPL][128 / BITS], const float (&sx)[CPL],
                                                 int64_t nchunks, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int64_t c = lane + 32 * j;
        if (c < nchunks) {
            const float d = moe_chunk_dot<BITS>(w[j], xr[j]);
            acc += sc[j] * d + bi[j] * sx[j];
        }
    }
    return acc;
}

/* The row's value as the fast GEMV stores it: the warp sum (added to 0, the
 * one-warp block's fold), the bias, the rounding; zeros for a bad expert. */
__device__ __forceinline__ float moe_row_out(float v, const moe_qm &m, int64_t grow, bool eok, int bf) {
    v = 0.f + v;
    if (m.bias) v += pt_ld(m.bt, m.bias, grow);
    return eok ? pt_rnd(bf, v) : 0.f;
}

/* A warp's 2·RPW rows of expert e: gate rows r0 .. r0 + RPW, then the
 * same up rows (rows past I read row I − 1 and store nothing). */
template <int BITS, int CPL>
__device__ __forceinline__ void moe_gu_rows(uint4 (&w)[2 * MOE_GU_RPW][CPL], float (&sc)[2 * MOE_GU_RPW][CPL],
                                            float (&bi)[2 * MOE_GU_RPW][CPL], int64_t (&grow)[2 * MOE_GU_RPW],
                                            const moe_qm &g, const moe_qm &u, int64_t e, int64_t r0, int64_t I,
                                            int64_t K, int64_t nchunks, int lane) {
#pragma unroll
    for (int d = 0; d < 2 * MOE_GU_RPW; d++) {
        const moe_qm &m = d < MOE_GU_RPW ? g : u;
        const int64_t r = r0 + d % MOE_GU_RPW < I ? r0 + d % MOE_GU_RPW : I - 1;
        grow[d] = e * m.rows + m.row_off + r;
        moe_load_row<BITS, CPL>(w[d], sc[d], bi[d], m, grow[d], K, nchunks, lane);
    }
}

/* h[b, r0 .. r0 + RPW) = glu(gate row · x, up row · x) from the rows of
 * moe_gu_rows and item b's x staged in xs (moe_stage_x), rounded as
 * pt_cuda_glu rounds (pt_glu_val, the GLU kernel's own code). */
template <int BITS, int CPL>
__device__ __forceinline__ void moe_gu_out(float *h, int64_t b, const float *xs,
                                           const uint4 (&w)[2 * MOE_GU_RPW][CPL],
                                           const float (&sc)[2 * MOE_GU_RPW][CPL],
                                           const float (&bi)[2 * MOE_GU_RPW][CPL],
                                           const int64_t (&grow)[2 * MOE_GU_RPW], const moe_qm &g, const moe_qm &u,
                                           int64_t r0, int64_t I, int64_t nchunks, int lane, bool eok, int bf,
                                           int act) {
    constexpr int VPC = 128 / BITS;
    float xr[CPL][VPC], sx[CPL];
    moe_load_x<BITS, CPL, true>(xr, sx, xs, VPC + 4, nchunks, lane);
    float v[2 * MOE_GU_RPW];
#pragma unroll
    for (int d = 0; d < 2 * MOE_GU_RPW; d++)
        v[d] = pt_warp_sum(moe_row_partial<BITS, CPL>(w[d], sc[d], bi[d], xr, sx, nchunks, lane));
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MOE_GU_RPW; r++) {
            if (r0 + r >= I) break;
            const float gv = moe_row_out(v[r], g, grow[r], eok, bf);
            const float uv = moe_row_out(v[MOE_GU_RPW + r], u, grow[MOE_GU_RPW + r], eok, bf);
            h[b * I + r0 + r] = pt_glu_val(act, gv, uv, bf);
        }
    }
}

/* h[b, r] = act(gate row r · x) · (up row r · x) for item b (x row b / k),
 * rounded as pt_cuda_glu rounds; r in [0, I). Grid (I / (WARPS·RPW), B). */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_GU_WARPS * 32)
    moe_gu_kernel(float *h, const float *x, const int32_t *idx, int k, int64_t K, int64_t I, moe_qm g, moe_qm u,
                  int64_t n_experts, int *err, int bf, int act) {
    constexpr int VPC = 128 / BITS;
    __shared__ __align__(16) float xs[32 * CPL * (VPC + 4)]; /* x of the block's item, chunks padded */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y;
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_GU_WARPS + warp) * MOE_GU_RPW;
    bool eok;
    const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
    const int64_t nchunks = K / VPC;
    /* every code and scale load of the warp's 2·RPW rows first (rows past
     * I read row I − 1 and store nothing), then x through shared memory */
    uint4 w[2 * MOE_GU_RPW][CPL];
    float sc[2 * MOE_GU_RPW][CPL], bi[2 * MOE_GU_RPW][CPL];
    int64_t grow[2 * MOE_GU_RPW];
    moe_gu_rows<BITS, CPL>(w, sc, bi, grow, g, u, e, r0, I, K, nchunks, lane);
    moe_stage_x<BITS>(xs, x + (b / k) * K, K);
    __syncthreads();
    if (r0 >= I) return;
    moe_gu_out<BITS, CPL>(h, b, xs, w, sc, bi, grow, g, u, r0, I, nchunks, lane, eok, bf, act);
}

/* y[t, d0 .. d0 + DN_ROWS) = the weighted sum over token t's k experts of
 * (down row d · h[t·k + j]), combined as moe_combine_kernel. Grid
 * (H / DN_ROWS, T); block min(k, DN_WARPS) warps, warp w takes experts
 * j = w, w + warps, ... */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_DN_WARPS * 32)
    moe_down_kernel(float *y, const float *h, const int32_t *idx, const float *weights, int k, int64_t H,
                    int64_t I, moe_qm m, int64_t n_experts, int *err, int bf) {
    __shared__ float o[64][MOE_DN_ROWS]; /* [k][row]: each expert's rounded output */
    __shared__ int ord[64];              /* the slots in ascending (expert, slot) order */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t t = blockIdx.y, d0 = (int64_t)blockIdx.x * MOE_DN_ROWS;
    constexpr int VPC = 128 / BITS;
    const int64_t nchunks = I / VPC;
#pragma unroll 1 /* the body is 8 rows unrolled already */
    for (int j = warp; j < k; j += nw) {
        const int64_t b = t * k + j;
        bool eok;
        const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
        uint4 w[MOE_DN_ROWS][CPL];
        float sc[MOE_DN_ROWS][CPL], bi[MOE_DN_ROWS][CPL];
        int64_t grow[MOE_DN_ROWS];
#pragma unroll
        for (int r = 0; r < MOE_DN_ROWS; r++) {
            grow[r] = e * m.rows + (d0 + r < H ? d0 + r : d0);
            moe_load_row<BITS, CPL>(w[r], sc[r], bi[r], m, grow[r], I, nchunks, lane);
        }
        float xr[CPL][VPC], sx[CPL];
        moe_load_x<BITS, CPL, false>(xr, sx, h + b * I, VPC, nchunks, lane);
#pragma unroll
        for (int r = 0; r < MOE_DN_ROWS; r++) {
            const float v = pt_warp_sum(moe_row_partial<BITS, CPL>(w[r], sc[r], bi[r], xr, sx, nchunks, lane));
            if (lane == 0) o[j][r] = moe_row_out(v, m, grow[r], eok, bf);
        }
    }
    if (threadIdx.x == 0) {
        /* moe_combine_kernel's walk: the next larger (expert, slot) pair each step */
        const int32_t *it = idx + t * k;
        int prev = -1, prev_j = -1;
        for (int n = 0; n < k; n++) {
            int bj = -1;
            for (int j = 0; j < k; j++) {
                const int e = it[j];
                const bool after = e > prev || (e == prev && j > prev_j);
                if (after && (bj < 0 || e < it[bj])) bj = j;
            }
            prev = it[bj];
            prev_j = bj;
            ord[n] = bj;
        }
    }
    __syncthreads();
    if (threadIdx.x < MOE_DN_ROWS && d0 + threadIdx.x < H) {
        const float *wt = weights + t * k;
        float acc = 0.f;
        for (int n = 0; n < k; n++) {
            const int j = ord[n];
            acc = pt_rnd(bf, __fadd_rn(acc, pt_rnd(bf, __fmul_rn(o[j][threadIdx.x], wt[j])))); /* as moe_combine_kernel */
        }
        y[t * H + d0 + threadIdx.x] = acc;
    }
}

/* ---- the decode path's expert grid (batches of MOE_EXPERT_MIN_B items up) -
 * The kernels above run one block per (rows, item): every item re-reads its
 * expert's rows, and each (row, item) converts the row's codes again. Here
 * a small kernel (moe_tiles_kernel) first groups the items by expert into
 * tiles of at most MOE_TILE_ITEMS items of one expert; then one block per
 * (rows, tile) loads its rows of the tile's expert into registers once,
 * stages the tile's x rows in shared memory once (one barrier per tile, not
 * two per item) and forms all the tile's items together: each code is
 * converted once and multiplied into every item's running sum. Each (row,
 * item) value is still formed exactly as above — the same chunks per lane,
 * the same fma chain per chunk over the same values, the per-chunk fold
 * acc + (scale·d + bias·Σx) as moe_row_partial compiles it (a product
 * bias·Σx, an fma, an add; written out with _rn intrinsics here so no
 * contraction can differ), the butterfly, moe_row_out — so it is the same
 * bits whichever grid computed it, and a token's result depends on nothing
 * but its own row. Items whose index is outside [0, E) join expert 0's
 * tiles (they compute zeros and raise the error word, as moe_item_expert
 * does). The grid is sized for the most tiles B items can make
 * (min(B, E) + B / items per tile); blocks past the real count exit at once,
 * so nothing waits for the host. */

#define MOE_TILE_ITEMS 4   /* most items per tile */
#define MOE_TILE_WARPS 8   /* warps per block of the tile kernels */
#define MOE_TILE_SMEM (48 * 1024 - 256) /* staging bytes per tile block: the default limit less the static arrays */

/* Floats of shared memory per staged item: x [nchunks][VPC + 4] (4-bit:
 * pre-multiplied by 16^-i as moe_load_x does), the per-float4 sums
 * [nchunks][VPC / 4], Σx per chunk [nchunks]; rounded up to 4 floats. */
static int64_t moe_tile_item_floats(int64_t K, int bits) {
    const int64_t vpc = 128 / bits, nchunks = K / vpc;
    return (nchunks * (vpc + 4 + vpc / 4 + 1) + 3) & ~(int64_t)3;
}

/* Exclusive prefix sums of (a, b) over the block's threads (block of 1024 at most). */
__device__ __forceinline__ void moe_block_exscan2(int &a, int &b, int *wa, int *wb, int &ta, int &tb) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    int ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int va = __shfl_up_sync(0xffffffffu, ia, o), vb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) ia += va, ib += vb;
    }
    if (lane == 31) wa[warp] = ia, wb[warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int sa = lane < nw ? wa[lane] : 0, sb = lane < nw ? wb[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int va = __shfl_up_sync(0xffffffffu, sa, o), vb = __shfl_up_sync(0xffffffffu, sb, o);
            if (lane >= o) sa += va, sb += vb;
        }
        wa[lane] = sa, wb[lane] = sb; /* inclusive over warps */
    }
    __syncthreads();
    const int pa = warp ? wa[warp - 1] : 0, pb = warp ? wb[warp - 1] : 0;
    ta = wa[nw - 1], tb = wb[nw - 1];
    a = pa + ia - a, b = pb + ib - b;
}

/* The tile list of B items over E experts, one block: ntiles[0] = the
 * number of tiles, tiles[i] = (expert, first, count, 0) — items[first ..
 * first + count) are item ids of that expert (count <= ni); the items of
 * an expert are contiguous in items[] (their order there does not matter:
 * every (row, item) value is formed alone). Shared memory: 2·E ints. */
__global__ void __launch_bounds__(1024)
    moe_tiles_kernel(int *ntiles, int4 *tiles, int *items, const int32_t *idx, int B, int E, int ni) {
    extern __shared__ int tile_cnt[]; /* cnt [E], then the placing cursor [E] */
    __shared__ int wa[32], wb[32];
    pt_release_dependents();
    pt_wait_primary();
    int *cnt = tile_cnt, *cur = tile_cnt + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int b = threadIdx.x; b < B; b += blockDim.x) {
        const int e = idx[b];
        atomicAdd(&cnt[e >= 0 && e < E ? e : 0], 1);
    }
    __syncthreads();
    /* thread t owns experts [t·per, t·per + per) */
    const int per = (E + blockDim.x - 1) / blockDim.x, e0 = threadIdx.x * per;
    int ni_sum = 0, nt_sum = 0;
    for (int e = e0; e < e0 + per && e < E; e++) ni_sum += cnt[e], nt_sum += (cnt[e] + ni - 1) / ni;
    int ta, tb;
    moe_block_exscan2(ni_sum, nt_sum, wa, wb, ta, tb);
    for (int e = e0; e < e0 + per && e < E; e++) {
        const int n = cnt[e];
        cur[e] = ni_sum;
        for (int f = 0; f < n; f += ni) tiles[nt_sum++] = make_int4(e, ni_sum + f, n - f < ni ? n - f : ni, 0);
        ni_sum += n;
    }
    if (threadIdx.x == 0) ntiles[0] = tb;
    __syncthreads();
    for (int b = threadIdx.x; b < B; b += blockDim.x) {
        const int e = idx[b];
        items[atomicAdd(&cur[e >= 0 && e < E ? e : 0], 1)] = b;
    }
}

/* Stages the tile's n x rows (item it[i]'s row it[i] / x_div of x [., K])
 * into sm (moe_tile_item_floats(K) floats per item): first every float4 of
 * the rows (coalesced), pre-multiplied for 4-bit codes as moe_load_x does,
 * with its sum ((x0 + x1) + x2) + x3; then Σx per chunk as moe_load_x
 * forms it (0, then + each float4's sum in order). Every thread calls it;
 * ends with a barrier. */
template <int BITS>
__device__ __forceinline__ void moe_stage_tile(float *sm, int64_t stride, const float *x, const int *it, int n,
                                               int x_div, int64_t K) {
    constexpr int VPC = 128 / BITS, Q = VPC / 4;
    const int nchunks = (int)(K / VPC), k4 = (int)(K / 4);
    float *ps0 = sm + (int64_t)nchunks * (VPC + 4);
    for (int f = threadIdx.x; f < n * k4; f += blockDim.x) {
        const int i = f / k4, g = f - i * k4, c = g / Q, q = g - c * Q;
        const float4 v = __ldg(reinterpret_cast<const float4 *>(x + (int64_t)(it[i] / x_div) * K) + g);
        float *xi = sm + i * stride;
        float4 p = v;
        if constexpr (BITS == 4) p.y = v.y * 0.0625f, p.z = v.z * 0.00390625f, p.w = v.w * 0.000244140625f;
        *reinterpret_cast<float4 *>(xi + c * (VPC + 4) + 4 * q) = p;
        (ps0 + i * stride)[g] = __fadd_rn(__fadd_rn(__fadd_rn(v.x, v.y), v.z), v.w);
    }
    __syncthreads();
    for (int f = threadIdx.x; f < n * nchunks; f += blockDim.x) {
        const int i = f / nchunks, c = f - i * nchunks;
        const float *ps = ps0 + i * stride + c * Q;
        float sx = 0.f;
#pragma unroll
        for (int q = 0; q < Q; q++) sx = __fadd_rn(sx, ps[q]);
        (ps0 + i * stride + nchunks * Q)[c] = sx;
    }
    __syncthreads();
}

/* The lane's partials of NR rows for N items of the tile (chunks lane +
 * 32·j of each row, as moe_row_partial): acc[r][i] for row r, item i. */
template <int BITS, int CPL, int NR, int N>
__device__ __forceinline__ void moe_tile_partials(float (&acc)[NR][MOE_TILE_ITEMS], const uint4 (&w)[NR][CPL],
                                                  const float (&sc)[NR][CPL], const float (&bi)[NR][CPL],
                                                  const float *sm, int64_t stride, int nchunks, int lane) {
    constexpr int VPC = 128 / BITS;
    const float MAGIC = 8388608.0f;
    const float *sxs = sm + nchunks * (VPC + 4 + VPC / 4);
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < N; i++) acc[r][i] = 0.f;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int c = lane + 32 * j;
        if (c >= nchunks) break;
        float d[NR][N];
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < N; i++) d[r][i] = 0.f;
#pragma unroll
        for (int q = 0; q < VPC / 4; q++) {
            float4 xv[N];
#pragma unroll
            for (int i = 0; i < N; i++) xv[i] = *reinterpret_cast<const float4 *>(sm + i * stride + c * (VPC + 4) + 4 * q);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const int wi = BITS == 4 ? q >> 1 : q;
                const uint32_t word = wi == 0 ? w[r][j].x : wi == 1 ? w[r][j].y : wi == 2 ? w[r][j].z : w[r][j].w;
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    uint32_t bits;
                    if constexpr (BITS == 4) {
                        const uint32_t half = (q & 1) ? word >> 16 : word;
                        bits = (half & (0xFu << (4 * t))) | 0x4B000000u;
                    } else {
                        bits = __byte_perm(word, 0x4B000000u, (unsigned)(t | (4 << 4) | (5 << 8) | (7 << 12)));
                    }
                    const float qv = __uint_as_float(bits) - MAGIC;
#pragma unroll
                    for (int i = 0; i < N; i++) {
                        const float xt = t == 0 ? xv[i].x : t == 1 ? xv[i].y : t == 2 ? xv[i].z : xv[i].w;
                        d[r][i] = fmaf(qv, xt, d[r][i]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < N; i++)
                acc[r][i] = __fadd_rn(acc[r][i], __fmaf_rn(sc[r][j], d[r][i], __fmul_rn(bi[r][j], sxs[i * stride + c])));
    }
}

/* acc for n (1 .. MOE_TILE_ITEMS) items: one unrolled body per count. */
template <int BITS, int CPL, int NR>
__device__ __forceinline__ void moe_tile_partials_n(float (&acc)[NR][MOE_TILE_ITEMS], const uint4 (&w)[NR][CPL],
                                                    const float (&sc)[NR][CPL], const float (&bi)[NR][CPL],
                                                    const float *sm, int64_t stride, int nchunks, int lane, int n) {
    static_assert(MOE_TILE_ITEMS == 4, "one case per count below");
    if (n == 4) moe_tile_partials<BITS, CPL, NR, 4>(acc, w, sc, bi, sm, stride, nchunks, lane);
    else if (n == 3) moe_tile_partials<BITS, CPL, NR, 3>(acc, w, sc, bi, sm, stride, nchunks, lane);
    else if (n == 2) moe_tile_partials<BITS, CPL, NR, 2>(acc, w, sc, bi, sm, stride, nchunks, lane);
    else moe_tile_partials<BITS, CPL, NR, 1>(acc, w, sc, bi, sm, stride, nchunks, lane);
}

/* The tile's expert, first item and count; false for a block past the
 * tiles. Item ids into it[] (shared). */
__device__ __forceinline__ bool moe_tile_of(const int *ntiles, const int4 *tiles, const int *items, int *it,
                                            int64_t &e, int &n) {
    if ((int)blockIdx.y >= ntiles[0]) return false;
    const int4 tl = tiles[blockIdx.y];
    e = tl.x;
    n = tl.z;
    if (threadIdx.x < n) it[threadIdx.x] = items[tl.y + threadIdx.x];
    return true;
}

/* h[b, r] for the items b of tile blockIdx.y and the rows r of block
 * blockIdx.x (WARPS·RPW of them: warp w's gate rows and the same up rows),
 * as moe_gu_kernel forms them. Dynamic shared memory: n items' staging. */
template <int BITS, int CPL, int RPW, int MINB>
__global__ void __launch_bounds__(MOE_TILE_WARPS * 32, MINB)
    moe_gu_tile_kernel(float *h, const float *x, const int *ntiles, const int4 *tiles, const int *items,
                       const int32_t *idx, int k, int64_t K, int64_t I, moe_qm g, moe_qm u, int64_t n_experts,
                       int *err, int bf, int act, int64_t stride) {
    extern __shared__ __align__(16) float tile_sm[];
    __shared__ int it[MOE_TILE_ITEMS];
    pt_release_dependents();
    pt_wait_primary();
    int64_t e;
    int n;
    if (!moe_tile_of(ntiles, tiles, items, it, e, n)) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int VPC = 128 / BITS, NR = 2 * RPW;
    const int nchunks = (int)(K / VPC);
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_TILE_WARPS + warp) * RPW;
    /* the warp's gate rows r0 .. r0 + RPW, then the same up rows (rows past
     * I read row I − 1 and store nothing) */
    uint4 w[NR][CPL];
    float sc[NR][CPL], bi[NR][CPL];
    int64_t grow[NR];
#pragma unroll
    for (int d = 0; d < NR; d++) {
        const moe_qm &m = d < RPW ? g : u;
        const int64_t r = r0 + d % RPW < I ? r0 + d % RPW : I - 1;
        grow[d] = e * m.rows + m.row_off + r;
        moe_load_row<BITS, CPL>(w[d], sc[d], bi[d], m, grow[d], K, nchunks, lane);
    }
    __syncthreads(); /* it[] */
    moe_stage_tile<BITS>(tile_sm, stride, x, it, n, k, K);
    if (r0 >= I) return;
    float acc[NR][MOE_TILE_ITEMS];
    moe_tile_partials_n<BITS, CPL, NR>(acc, w, sc, bi, tile_sm, stride, nchunks, lane, n);
#pragma unroll
    for (int i = 0; i < MOE_TILE_ITEMS; i++) {
        if (i >= n) break;
        float v[NR];
#pragma unroll
        for (int d = 0; d < NR; d++) v[d] = pt_warp_sum(acc[d][i]);
        const int64_t b = it[i];
        bool eok;
        (void)moe_item_expert(idx, b, n_experts, err, eok);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                if (r0 + r >= I) break;
                const float gv = moe_row_out(v[r], g, grow[r], eok, bf);
                const float uv = moe_row_out(v[RPW + r], u, grow[RPW + r], eok, bf);
                h[b * I + r0 + r] = pt_glu_val(act, gv, uv, bf);
            }
        }
    }
}

/* o[b, d] = down row d of the tile's expert · h[b] for the items b of tile
 * blockIdx.y, rows d of block blockIdx.x (WARPS·ROWS of them), rounded as
 * moe_down_kernel rounds its per-expert outputs; moe_combine_kernel then
 * sums them in moe_down_kernel's order and rounding. */
template <int BITS, int CPL, int ROWS, int MINB>
__global__ void __launch_bounds__(MOE_TILE_WARPS * 32, MINB)
    moe_down_tile_kernel(float *o, const float *h, const int *ntiles, const int4 *tiles, const int *items,
                         const int32_t *idx, int64_t H, int64_t I, moe_qm m, int64_t n_experts, int *err, int bf,
                         int64_t stride) {
    extern __shared__ __align__(16) float tile_sm[];
    __shared__ int it[MOE_TILE_ITEMS];
    pt_release_dependents();
    pt_wait_primary();
    int64_t e;
    int n;
    if (!moe_tile_of(ntiles, tiles, items, it, e, n)) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int VPC = 128 / BITS;
    const int nchunks = (int)(I / VPC);
    const int64_t d0 = ((int64_t)blockIdx.x * MOE_TILE_WARPS + warp) * ROWS;
    uint4 w[ROWS][CPL];
    float sc[ROWS][CPL], bi[ROWS][CPL];
    int64_t grow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        grow[r] = e * m.rows + (d0 + r < H ? d0 + r : H - 1);
        moe_load_row<BITS, CPL>(w[r], sc[r], bi[r], m, grow[r], I, nchunks, lane);
    }
    __syncthreads(); /* it[] */
    moe_stage_tile<BITS>(tile_sm, stride, h, it, n, 1, I);
    if (d0 >= H) return;
    float acc[ROWS][MOE_TILE_ITEMS];
    moe_tile_partials_n<BITS, CPL, ROWS>(acc, w, sc, bi, tile_sm, stride, nchunks, lane, n);
#pragma unroll
    for (int i = 0; i < MOE_TILE_ITEMS; i++) {
        if (i >= n) break;
        const int64_t b = it[i];
        bool eok;
        (void)moe_item_expert(idx, b, n_experts, err, eok);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float v = pt_warp_sum(acc[r][i]);
            if (lane == 0 && d0 + r < H) o[b * H + d0 + r] = moe_row_out(v, m, grow[r], eok, bf);
        }
    }
}

/* Chunks per lane for K columns of BITS-bit codes when the decode kernels
 * take them (1, 2 or 4 with at most MOE_MAX_X values of x per lane), else 0. */
static int moe_cpl(int64_t K, int bits) {
    const int vpc = 128 / bits;
    if (K % vpc) return 0;
    const int64_t nchunks = K / vpc, cpl = (nchunks + 31) / 32;
    if (cpl * vpc > MOE_MAX_X) return 0;
    return cpl <= 1 ? 1 : cpl <= 2 ? 2 : 4;
}

/* Whether an expert stack can feed the decode kernels: 4/8-bit MLX layout
 * with 16-byte aligned rows. */
static bool moe_v2_weight(const pt_matrix *w) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    return cw && !cw->tc && (w->bits == 4 || w->bits == 8) && moe_cpl(w->cols, w->bits) > 0 &&
           (uintptr_t)cw->data % 16 == 0;
}

template <int BITS, int CPL>
static pt_status launch_gu(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k, int64_t K,
                           int64_t I, const moe_qm &g, const moe_qm &u, int64_t E, int act) {
    const int64_t per_block = MOE_GU_WARPS * MOE_GU_RPW;
    pt_launch(moe_gu_kernel<BITS, CPL>, dim3((unsigned)((I + per_block - 1) / per_block), (unsigned)B),
              dim3(MOE_GU_WARPS * 32), 0, c->stream, pt_pdl_chain(), h, x, idx, k, K, I, g, u, E, c->err_dev,
              (int)(c->base.act == PT_ACT_BF16), act);
    CUDA_CHECK_LAUNCH("moe gate|up");
    return PT_OK;
}

template <int BITS, int CPL>
static pt_status launch_down(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights,
                             int64_t T, int k, int64_t H, int64_t I, const moe_qm &m, int64_t E) {
    const int warps = k < MOE_DN_WARPS ? k : MOE_DN_WARPS;
    pt_launch(moe_down_kernel<BITS, CPL>, dim3((unsigned)((H + MOE_DN_ROWS - 1) / MOE_DN_ROWS), (unsigned)T),
              dim3(32 * warps), 0, c->stream, pt_pdl_chain(), y, h, idx, weights, k, H, I, m, E, c->err_dev,
              (int)(c->base.act == PT_ACT_BF16));
    CUDA_CHECK_LAUNCH("moe down");
    return PT_OK;
}

/* The tile list in moe_g (free while the decode kernels run: they write the
 * activation straight to moe_h) as int32: [0] the number of tiles, items
 * [B] from 4, tiles [ntmax] int4 after them. Returns the pointers and the
 * grid height (ntmax). */
static pt_status moe_tiles(pt_cuda *c, const int32_t *idx, int64_t B, int64_t E, int ni, int **ntiles, int4 **tiles,
                           int **items, int64_t *ntmax) {
    *ntmax = (B < E ? B : E) + B / ni;
    const int64_t b4 = (B + 3) & ~(int64_t)3;
    if ((size_t)(4 + b4 + 4 * *ntmax) > c->moe_rows * c->moe_ffn * 2)
        return pt_error(PT_ERR_INTERNAL, "moe_ffn: the tile list of %lld items exceeds the scratch", (long long)B);
    int *s = (int *)c->moe_g;
    *ntiles = s;
    *items = s + 4;
    *tiles = (int4 *)(s + 4 + b4);
    pt_launch(moe_tiles_kernel, dim3(1), dim3(1024), (size_t)(2 * E) * sizeof(int), c->stream, pt_pdl_chain(),
              *ntiles, *tiles, *items, idx, (int)B, (int)E, ni);
    CUDA_CHECK_LAUNCH("moe tiles");
    return PT_OK;
}

/* Two shapes of the tile kernels (the same arithmetic, so the same bits):
 * wide — 2·2 gate|up rows or 4 down rows per warp (2 / 1 for 8-bit K =
 * 2048), each x value read from shared memory serves more rows —, and lean
 * — half the rows per warp and at most 85 registers a thread, so three
 * blocks share an SM instead of two: more loads in flight where tiles hold
 * one or two items. */
template <int BITS, int CPL, bool LEAN>
static pt_status launch_gu_tiles(pt_cuda *c, float *h, const float *x, const int *ntiles, const int4 *tiles,
                                 const int *items, int64_t ntmax, int ni, const int32_t *idx, int k, int64_t K,
                                 int64_t I, const moe_qm &g, const moe_qm &u, int64_t E, int act) {
    constexpr int RPW = CPL >= 4 || LEAN ? 1 : 2; /* codes in registers: 2·RPW·CPL uint4 per lane */
    constexpr int MINB = LEAN && CPL <= 2 ? 3 : 2;
    const int64_t per_block = MOE_TILE_WARPS * RPW, stride = moe_tile_item_floats(K, BITS);
    pt_launch(moe_gu_tile_kernel<BITS, CPL, RPW, MINB>, dim3((unsigned)((I + per_block - 1) / per_block), (unsigned)ntmax),
              dim3(MOE_TILE_WARPS * 32), (size_t)(ni * stride) * sizeof(float), c->stream, pt_pdl_chain(), h, x,
              ntiles, tiles, items, idx, k, K, I, g, u, E, c->err_dev, (int)(c->base.act == PT_ACT_BF16), act,
              stride);
    CUDA_CHECK_LAUNCH("moe gate|up (expert tiles)");
    return PT_OK;
}

template <int BITS, int CPL, bool LEAN>
static pt_status launch_down_tiles(pt_cuda *c, float *y, const float *h, const int *ntiles, const int4 *tiles,
                                   const int *items, int64_t ntmax, int ni, const int32_t *idx, const float *weights,
                                   int64_t T, int k, int64_t H, int64_t I, const moe_qm &m, int64_t E) {
    /* codes in registers: ROWS·CPL uint4 per lane */
    constexpr int ROWS = CPL >= 4 ? 1 : CPL == 2 ? (LEAN ? 1 : 2) : (LEAN ? 2 : 4);
    constexpr int MINB = LEAN && CPL <= 2 ? 3 : 2;
    const int64_t per_block = MOE_TILE_WARPS * ROWS, stride = moe_tile_item_floats(I, BITS);
    const int bf = (int)(c->base.act == PT_ACT_BF16);
    pt_launch(moe_down_tile_kernel<BITS, CPL, ROWS, MINB>,
              dim3((unsigned)((H + per_block - 1) / per_block), (unsigned)ntmax), dim3(MOE_TILE_WARPS * 32),
              (size_t)(ni * stride) * sizeof(float), c->stream, pt_pdl_chain(), c->moe_o, h, ntiles, tiles, items,
              idx, H, I, m, E, c->err_dev, bf, stride);
    CUDA_CHECK_LAUNCH("moe down (expert tiles)");
    return pt_cuda_moe_combine(c, y, c->moe_o, idx, weights, T, k, H, bf, (const int32_t *)NULL);
}

/* The expert grid from this many items (T·top_k) up: from two tokens at
 * top-8. One token keeps the per-item grid (the tile list and the separate
 * combine are two more launches, and eight items rarely share an expert).
 * The qwen3-30b-a3b MoE block on the H200 (bench_moe, bench/RESULTS.md),
 * µs per-item grid / expert grid lean / wide: T = 1 38.2 / 41.6 / 44.9,
 * T = 2 64.7 / 61.0 / 66.0, T = 4 116.3 / 97.9 / 109.4, T = 16 405.8 /
 * 283.1 / 297.9, T = 64 1552 / 742 / 751, T = 128 3079 / 1353 / 1336. */
#define MOE_EXPERT_MIN_B 9
static int g_moe_expert_grid = -1;
static int64_t g_moe_expert_min_b = MOE_EXPERT_MIN_B;
/* For tests and benchmarks: the expert grid from b items up (b <= 0: the default). */
extern "C" void pt_cuda_moe_expert_min(int b) { g_moe_expert_min_b = b > 0 ? b : MOE_EXPERT_MIN_B; }
static bool moe_expert_grid(int64_t B, int64_t E) {
    if (g_moe_expert_grid < 0) g_moe_expert_grid = pt_env_on("PETREL_CUDA_MOE_EXPERT_GRID");
    return g_moe_expert_grid && B >= g_moe_expert_min_b && E <= 4096;
}

/* Items per tile: MOE_TILE_ITEMS while their staging fits MOE_TILE_SMEM. */
static int moe_tile_ni(int64_t K, int64_t I, int bits_gu, int bits_down) {
    int64_t f = moe_tile_item_floats(K, bits_gu), fd = moe_tile_item_floats(I, bits_down);
    if (fd > f) f = fd;
    int64_t ni = MOE_TILE_SMEM / (f * (int64_t)sizeof(float));
    return (int)(ni > MOE_TILE_ITEMS ? MOE_TILE_ITEMS : ni);
}

static pt_status moe_gu(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k,
                        const pt_matrix *gate, const pt_matrix *up, int64_t I, int act) {
    const int64_t K = gate->cols, E = gate->n_experts > 1 ? gate->n_experts : 1;
    const moe_qm g = moe_qm_of(gate, 0), u = up ? moe_qm_of(up, 0) : moe_qm_of(gate, I);
    const int cpl = moe_cpl(K, gate->bits);
    if (gate->bits == 4)
        return cpl == 1 ? launch_gu<4, 1>(c, h, x, idx, B, k, K, I, g, u, E, act)
                        : launch_gu<4, 2>(c, h, x, idx, B, k, K, I, g, u, E, act);
    return cpl == 1   ? launch_gu<8, 1>(c, h, x, idx, B, k, K, I, g, u, E, act)
           : cpl == 2 ? launch_gu<8, 2>(c, h, x, idx, B, k, K, I, g, u, E, act)
                      : launch_gu<8, 4>(c, h, x, idx, B, k, K, I, g, u, E, act);
}

static pt_status moe_down(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights, int64_t T,
                          int k, const pt_matrix *down) {
    const int64_t H = down->rows, I = down->cols, E = down->n_experts > 1 ? down->n_experts : 1;
    const moe_qm m = moe_qm_of(down, 0);
    const int cpl = moe_cpl(I, down->bits);
    if (down->bits == 4)
        return cpl == 1 ? launch_down<4, 1>(c, y, h, idx, weights, T, k, H, I, m, E)
                        : launch_down<4, 2>(c, y, h, idx, weights, T, k, H, I, m, E);
    return cpl == 1   ? launch_down<8, 1>(c, y, h, idx, weights, T, k, H, I, m, E)
           : cpl == 2 ? launch_down<8, 2>(c, y, h, idx, weights, T, k, H, I, m, E)
                      : launch_down<8, 4>(c, y, h, idx, weights, T, k, H, I, m, E);
}

/* The expert grid in one of its shapes (launch_gu_tiles): the tile list,
 * gate|up + GLU, down, the combine. */
template <bool L>
static pt_status moe_tiled_shape(pt_cuda *c, float *y, const float *x, const int32_t *idx, const float *weights,
                                 int64_t T, int k, const pt_matrix *gate, const pt_matrix *up, const pt_matrix *down,
                                 int act) {
    const int64_t K = gate->cols, H = down->rows, I = down->cols, B = T * k;
    const int64_t E = gate->n_experts > 1 ? gate->n_experts : 1;
    const moe_qm g = moe_qm_of(gate, 0), u = up ? moe_qm_of(up, 0) : moe_qm_of(gate, I), m = moe_qm_of(down, 0);
    const int ni = moe_tile_ni(K, I, gate->bits, down->bits);
    int *ntiles, *items;
    int4 *tiles;
    int64_t ntmax;
    PT_TRY(moe_tiles(c, idx, B, E, ni, &ntiles, &tiles, &items, &ntmax));
    float *h = c->moe_h;
    const int cg = moe_cpl(K, gate->bits), cd = moe_cpl(I, down->bits);
    pt_status st;
    if (gate->bits == 4)
        st = cg == 1 ? launch_gu_tiles<4, 1, L>(c, h, x, ntiles, tiles, items, ntmax, ni, idx, k, K, I, g, u, E, act)
                     : launch_gu_tiles<4, 2, L>(c, h, x, ntiles, tiles, items, ntmax, ni, idx, k, K, I, g, u, E, act);
    else
        st = cg == 1   ? launch_gu_tiles<8, 1, L>(c, h, x, ntiles, tiles, items, ntmax, ni, idx, k, K, I, g, u, E, act)
             : cg == 2 ? launch_gu_tiles<8, 2, L>(c, h, x, ntiles, tiles, items, ntmax, ni, idx, k, K, I, g, u, E, act)
                       : launch_gu_tiles<8, 4, L>(c, h, x, ntiles, tiles, items, ntmax, ni, idx, k, K, I, g, u, E, act);
    if (st != PT_OK) return st;
    if (down->bits == 4)
        return cd == 1 ? launch_down_tiles<4, 1, L>(c, y, h, ntiles, tiles, items, ntmax, ni, idx, weights, T, k, H, I, m, E)
                       : launch_down_tiles<4, 2, L>(c, y, h, ntiles, tiles, items, ntmax, ni, idx, weights, T, k, H, I, m, E);
    return cd == 1   ? launch_down_tiles<8, 1, L>(c, y, h, ntiles, tiles, items, ntmax, ni, idx, weights, T, k, H, I, m, E)
           : cd == 2 ? launch_down_tiles<8, 2, L>(c, y, h, ntiles, tiles, items, ntmax, ni, idx, weights, T, k, H, I, m, E)
                     : launch_down_tiles<8, 4, L>(c, y, h, ntiles, tiles, items, ntmax, ni, idx, weights, T, k, H, I, m, E);
}

/* The lean shape below this many items, the wide one from there (the
 * numbers above MOE_EXPERT_MIN_B: lean is faster to 64 tokens at top-8,
 * where tiles hold few items, wide from 128, where they are mostly full). */
#define MOE_TILE_LEAN_B 1024
static int g_moe_tile_shape = -1;
/* For tests and benchmarks: 0 the wide tile shape, 1 the lean one, -1 by size. */
extern "C" void pt_cuda_moe_tile_shape(int s) { g_moe_tile_shape = s < 0 ? -1 : s != 0; }
static pt_status moe_tiled(pt_cuda *c, float *y, const float *x, const int32_t *idx, const float *weights, int64_t T,
                           int k, const pt_matrix *gate, const pt_matrix *up, const pt_matrix *down, int act) {
    const bool lean = g_moe_tile_shape >= 0 ? g_moe_tile_shape == 1 : T * k < MOE_TILE_LEAN_B;
    return lean ? moe_tiled_shape<true>(c, y, x, idx, weights, T, k, gate, up, down, act)
                : moe_tiled_shape<false>(c, y, x, idx, weights, T, k, gate, up, down, act);
}

/* moe_ffn after the grouped prefill declined: the decode kernels where the
 * weights allow, else the per-item GEMV (matmul.cu) + GLU + combine. */
pt_status pt_cuda_moe_ffn_decode(pt_cuda *c, float *y, const float *x, int64_t T, const int32_t *idx,
                                 const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                                 const pt_matrix *down, pt_glu_kind act) {
    pt_backend *be = &c->base;
    const int64_t H = down->rows, I = down->cols, B = T * top_k;
    const bool v2 = pt_cuda_moe_v2_on() && !c->no_fast_gemv && (uintptr_t)x % 16 == 0 && T <= 65535 && B <= 65535;
    const bool v2_gu = v2 && moe_v2_weight(gate) && (!up || (moe_v2_weight(up) && up->bits == gate->bits));
    const bool v2_down = v2 && moe_v2_weight(down);
    const int64_t E = gate->n_experts > 1 ? gate->n_experts : 1;
    if (v2_gu && v2_down && moe_expert_grid(B, E) && (down->n_experts > 1 ? down->n_experts : 1) == E)
        return moe_tiled(c, y, x, idx, weights, T, top_k, gate, up, down, (int)act);
    if (v2_gu) {
        PT_TRY(moe_gu(c, c->moe_h, x, idx, B, top_k, gate, up, I, (int)act));
    } else {
        /* gate|up rows of each item: moe_g[b, 0..2I) */
        if (up) {
            PT_TRY(pt_cuda_gemv_items(c, c->moe_g, x, B, top_k, gate, idx, 0, 0, I, 2 * I));
            PT_TRY(pt_cuda_gemv_items(c, c->moe_g + I, x, B, top_k, up, idx, 0, 0, I, 2 * I));
        } else {
            PT_TRY(pt_cuda_gemv_items(c, c->moe_g, x, B, top_k, gate, idx, 0, 0, 2 * I, 2 * I));
        }
        PT_TRY(pt_cuda_glu(be, c->moe_h, c->moe_g, c->moe_g + I, B, I, 2 * I, act));
    }
    if (v2_down) return moe_down(c, y, c->moe_h, idx, weights, T, top_k, down);
    PT_TRY(pt_cuda_gemv_items(c, c->moe_o, c->moe_h, B, 1, down, idx, 0, 0, H, H));
    return pt_cuda_moe_combine(c, y, c->moe_o, idx, weights, T, top_k, H, pt_cuda_bf(be), (const int32_t *)NULL);
}
