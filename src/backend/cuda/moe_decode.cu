/* The CUDA MoE decode path (PETREL_CUDA_MOE_V2, on unless "0"): routing one
 * warp per token, the experts' gate|up + activation and down + combine as
 * one-warp-per-row GEMVs over the (token, k) items or over the experts
 * that the items picked. This file: the switch, the routing, the per-item
 * grid's kernels and launchers, and pt_cuda_moe_ffn_decode, which picks a
 * grid. Not here: the expert grid (moe_grid.cu), the per-row pieces both
 * grids use (moe_rows.cuh), the block routing kernel, the combine kernel
 * and the grouped prefill (moe.cu), the shared GEMV (matmul.cu).
 *
 * ---- the decode path ---------------------------------------------------
 * The same arithmetic as the kernels it replaces, in fewer and wider
 * launches (the per-item GEMV ran 6144 blocks of one warp per projection and
 * the routing and combine were one-block kernels):
 *  - routing: one warp per token (moe_route_warp_kernel, up to 512 experts,
 *    each lane's logits in registers) instead of a block of
 *    ROUTE_THREADS; the softmax sum is formed in the block kernel's order
 *    (the ROUTE_THREADS virtual threads' serial sums, each warp of them
 *    reduced by the butterfly, the four warp sums as (s0 + s2) + (s1 + s3)),
 *    the top-k is an exact argmax (order-free), so the picks and weights are
 *    the same bits;
 *  - gate|up + activation: one launch (moe_gu_kernel) over (rows, item);
 *    the block stages x in shared memory once (pre-multiplied, with its
 *    Σx per chunk), a warp computes two gate rows and the matching two up
 *    rows (every code and scale load issued before the arithmetic, the four
 *    rows' chains interleaved), then the GLU, so the gate/up scratch and
 *    the GLU launch go away;
 *  - down + combine: one launch (moe_down_kernel) over (8 output rows,
 *    token); warp j computes the 8 rows of the token's j-th expert into
 *    shared memory, then 8 threads form the weighted sum in ascending
 *    (expert, slot) order, rounding after each add as moe_combine_kernel.
 * Each row's dot product is formed exactly as the fast GEMV (gemv_fast.cu,
 * gemv_fast_kernel) forms it with one warp per row: lane l takes the
 * 16-byte code chunks l, l + 32, ... in order, per chunk
 * scale·Σq·x + bias·Σx, then the warp's butterfly sum; so a token's result
 * depends on nothing but its own row (batch-invariant), and equals the
 * per-item path wherever that path chose one warp per row (the MoE shapes'
 * decode). Applies to 4/8-bit experts in the MLX layout with K <= 2048 (x
 * fits the registers: 64 values per lane); other weights take the per-item
 * path. From MOE_EXPERT_MIN_B items (T·top_k) on, the same per-row
 * arithmetic runs over an expert grid instead (moe_tiles_kernel,
 * moe_gu_tile_kernel, moe_down_tile_kernel + moe_combine_kernel, in
 * moe_grid.cu): the items grouped by expert into tiles of up to four, one
 * block per (rows, tile) that keeps its rows in registers and converts each
 * code once for all the tile's items (two shapes: lean below
 * MOE_TILE_LEAN_B items, wide from there); each (row, item) value and the
 * combine are the same bits as in the per-item grid. Dense bf16 experts
 * take moe_dense.cu's two kernels (the per-item path's bits). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_rows.cuh"

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
#define ROUTE_WARPS 4     /* tokens (warps) per block of the warp routing kernel */
#define ROUTE_MAX_NPL 16  /* the warp kernel's most logits per lane: E <= 512 */
#define ROUTE_MAX_K 64    /* ... and most picks (two per lane) */

/* One warp per token, its logits in registers: lane l holds experts
 * l + 32·i, i < NPL (E <= 32·NPL). Same results as moe_route_kernel (moe.cu;
 * see above): the max is order-free; the softmax sum is the block kernel's
 * (virtual thread v = 32·w + lane sums e = v, v + ROUTE_THREADS, ..., i.e.
 * its i ≡ w (mod 4) in ascending i, then the butterfly per w and
 * (s0 + s2) + (s1 + s3)); each pick is an exact (value, lower index) argmax
 * over the lanes' best, its value prob[pick] itself, and the picks' sum is
 * formed in pick order by every lane. Pick j is kept by lane j % 32 and
 * written by it (a coalesced store) with its weight. */
template <int NPL>
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_warp_kernel(int32_t *idx, float *weights, const float *logits, int64_t T, int E, int k, int renorm,
                          const float *per_expert_scale, int bf) {
    static_assert(ROUTE_THREADS == 128, "the sum's second stage below is written for four warps");
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T) return;
    const float *l = logits + t * E;
    float p[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) p[i] = lane + 32 * i < E ? l[lane + 32 * i] : -INFINITY;
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i < E) m = fmaxf(m, p[i]);
    m = pt_warp_max(m); /* a max: the same whatever the order */
    float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        if (lane + 32 * i < E) {
            p[i] = expf(p[i] - m);
            a[i % 4] += p[i];
        }
    }
    float s[4];
#pragma unroll
    for (int w = 0; w < 4; w++) s[w] = pt_warp_sum(a[w]);
    const float sum = (s[0] + s[2]) + (s[1] + s[3]);
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i < E) p[i] = p[i] / sum; /* past E: −inf, never picked */
    int32_t pick[2] = {-1, -1};
    float pw[2] = {0.f, 0.f}, tsum = 0.f;
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if (p[i] != -INFINITY && (bi < 0 || p[i] > best)) {
                best = p[i];
                bi = lane + 32 * i;
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
        const float v = bi >= 0 ? best : 0.f; /* best is prob[bi] */
        tsum += v;
        if ((j & 31) == lane) pick[j >> 5] = bi, pw[j >> 5] = v;
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if (lane + 32 * i == bi) p[i] = -INFINITY; /* taken */
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = lane + 32 * h;
        if (j >= k) break;
        float w = renorm ? pw[h] / tsum : pw[h];
        if (per_expert_scale && pick[h] >= 0) w *= per_expert_scale[pick[h]];
        idx[t * k + j] = pick[h];
        weights[t * k + j] = pt_rnd(bf, w);
    }
}

static unsigned long long g_route_warp_launches; /* tests: the warp kernel ran */
extern "C" unsigned long long pt_cuda_moe_route_warp_count(void) {
    return __atomic_load_n(&g_route_warp_launches, __ATOMIC_RELAXED);
}

/* The routing of moe.cu's pt_cuda_moe_route with the decode path on: the
 * warp kernel up to ROUTE_MAX_NPL·32 experts and ROUTE_MAX_K picks;
 * PT_ERR_UNSUPPORTED (no message) past those, for the block kernel. */
pt_status pt_cuda_moe_route_warp(pt_cuda *c, int32_t *idx, float *weights, const float *logits, int64_t T,
                                 const pt_moe_route *p) {
    const int E = p->n_experts, k = p->top_k, npl = (E + 31) / 32;
    if (E > 32 * ROUTE_MAX_NPL || k > ROUTE_MAX_K) return PT_ERR_UNSUPPORTED;
    const dim3 grid((unsigned)((T + ROUTE_WARPS - 1) / ROUTE_WARPS)), block(32 * ROUTE_WARPS);
    const int bf = pt_cuda_bf(&c->base);
#define ROUTE_LAUNCH(N)                                                                                              \
    pt_launch(moe_route_warp_kernel<N>, grid, block, 0, c->stream, pt_pdl_chain(), idx, weights, logits, T, E, k,  \
              p->renorm, p->per_expert_scale, bf)
    if (npl <= 4) ROUTE_LAUNCH(4);
    else if (npl <= 8) ROUTE_LAUNCH(8);
    else ROUTE_LAUNCH(16);
#undef ROUTE_LAUNCH
    CUDA_CHECK_LAUNCH("moe_route");
    __atomic_fetch_add(&g_route_warp_launches, 1ull, __ATOMIC_RELAXED);
    return PT_OK;
}

/* ---- decode path: the expert GEMVs ---------------------------------------- */

#define MOE_GU_WARPS 8 /* warps per block of moe_gu_kernel (4: slower, bench/RESULTS.md) */
#define MOE_GU_RPW 2   /* gate rows (and as many up rows) per warp */
#define MOE_DN_ROWS 8  /* output rows per block of moe_down_kernel (4: slower) */
#define MOE_DN_WARPS 8 /* most warps per block of moe_down_kernel (one expert each) */
/* moe_qm, moe_item_expert, moe_load_row, moe_row_out, moe_cpl and
 * MOE_MAX_X, which the expert grid uses too: moe_rows.cuh */

/* The lane's x chunks c = lane + 32·j (VPC values each, chunk c at
 * x + c·stride), as the fast GEMV uses them: 4-bit values pre-multiplied by
 * 16^-i (i = the value's place in its 16-bit half: exact, a power of two),
 * and Σx per chunk in its order. */
template <int BITS, int CPL>
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
                xv = __ldg(p);
            }
            sx[j] += xv.x + xv.y + xv.z + xv.w;
            const float4 xp = pt_x_inplace<BITS>(xv);
            xr[j][4 * q] = xp.x, xr[j][4 * q + 1] = xp.y, xr[j][4 * q + 2] = xp.z, xr[j][4 * q + 3] = xp.w;
        }
    }
}

/* Item x [K] into shared memory for moe_tile_partials: chunk c (VPC
 * values; 4-bit: pre-multiplied by 16^-i) at xs + c·(VPC + 4), its Σx at
 * xs[nchunks·(VPC + 4) + c], both formed as moe_load_x forms them. One
 * thread per chunk, its loads issued together; the 4-float pad puts the
 * 16-byte reads of chunks c .. c + 7 (a quarter warp) in distinct banks. */
template <int BITS>
__device__ __forceinline__ void moe_stage_chunks(float *xs, const float *x, int nchunks) {
    constexpr int VPC = 128 / BITS, Q = VPC / 4;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
        const float4 *src = reinterpret_cast<const float4 *>(x) + (int64_t)c * Q;
        float4 v[Q];
#pragma unroll
        for (int q = 0; q < Q; q++) v[q] = __ldg(src + q);
        float sx = 0.f;
#pragma unroll
        for (int q = 0; q < Q; q++) {
            const float4 xv = v[q];
            sx += xv.x + xv.y + xv.z + xv.w;
            *reinterpret_cast<float4 *>(xs + c * (VPC + 4) + 4 * q) = pt_x_inplace<BITS>(xv);
        }
        xs[nchunks * (VPC + 4) + c] = sx;
    }
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

/* h[b, r] = act(gate row r · x) · (up row r · x) for item b (x row b / k),
 * rounded as pt_cuda_glu rounds (pt_glu_val, the GLU kernel's own code);
 * r in [0, I). Grid (I / (WARPS·RPW), B): a warp's 2·RPW rows, every code
 * and scale load issued first, x staged once per block, the rows' chains
 * interleaved (moe_tile_partials). */
template <int BITS, int CPL, int MINB>
__global__ void __launch_bounds__(MOE_GU_WARPS * 32, MINB)
    moe_gu_kernel(float *h, const float *x, const int32_t *idx, int k, int64_t K, int64_t I, moe_qm g, moe_qm u,
                  int64_t n_experts, int *err, int bf, int act) {
    constexpr int VPC = 128 / BITS, NR = 2 * MOE_GU_RPW;
    __shared__ __align__(16) float xs[32 * CPL * (VPC + 5)]; /* moe_stage_chunks */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y;
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_GU_WARPS + warp) * MOE_GU_RPW;
    bool eok;
    const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
    const int nchunks = (int)(K / VPC);
    uint4 w[NR][CPL];
    float sc[NR][CPL], bi[NR][CPL];
    int64_t grow[NR];
    moe_gu_rows<BITS, CPL>(w, sc, bi, grow, g, u, e, r0, I, K, nchunks, lane);
    moe_stage_chunks<BITS>(xs, x + (b / k) * K, nchunks);
    __syncthreads();
    if (r0 >= I) return;
    float acc[NR][MOE_TILE_ITEMS];
    moe_tile_partials<BITS, CPL, NR, 1>(acc, w, sc, bi, xs, xs + nchunks * (VPC + 4), 0, nchunks, lane);
    float v[NR];
#pragma unroll
    for (int d = 0; d < NR; d++) v[d] = pt_warp_sum(acc[d][0]);
    moe_glu_out<MOE_GU_RPW>(h, b, I, r0, v, g, u, grow, eok, bf, act, lane);
}

/* y[t, d0 .. d0 + DN_ROWS) = the weighted sum over token t's k experts of
 * (down row d · h[t·k + j]), combined as moe_combine_kernel. Grid
 * (H / DN_ROWS, T); block min(k, DN_WARPS) warps, warp w takes experts
 * j = w, w + warps, ...: its rows NR at a time (codes in registers: NR·CPL
 * uint4 a lane), their loads issued before x's, the rows' chains
 * interleaved (moe_rows_partials with x in registers). */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_DN_WARPS * 32, 2)
    moe_down_kernel(float *y, const float *h, const int32_t *idx, const float *weights, int k, int64_t H,
                    int64_t I, moe_qm m, int64_t n_experts, int *err, int bf) {
    constexpr int VPC = 128 / BITS, NR = CPL >= 4 ? 2 : CPL == 2 ? 4 : MOE_DN_ROWS;
    static_assert(MOE_DN_ROWS % NR == 0, "whole passes");
    __shared__ float o[64][MOE_DN_ROWS]; /* [k][row]: each expert's rounded output */
    __shared__ int ord[64];              /* the slots in ascending (expert, slot) order */
    __shared__ float wsh[64];            /* and their weights */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t t = blockIdx.y, d0 = (int64_t)blockIdx.x * MOE_DN_ROWS;
    moe_rows_order(ord, wsh, idx, weights, t, k);
    const int nchunks = (int)(I / VPC);
#pragma unroll 1
    for (int j = warp; j < k; j += nw) {
        const int64_t b = t * k + j;
        bool eok;
        const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
        float xr[CPL][VPC], sx[CPL];
#pragma unroll
        for (int p = 0; p < MOE_DN_ROWS; p += NR) {
            uint4 w[NR][CPL];
            float sc[NR][CPL], bi[NR][CPL];
            int64_t grow[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                grow[r] = e * m.rows + (d0 + p + r < H ? d0 + p + r : d0);
                moe_load_row<BITS, CPL>(w[r], sc[r], bi[r], m, grow[r], I, nchunks, lane);
            }
            if (p == 0) moe_load_x<BITS, CPL>(xr, sx, h + b * I, VPC, nchunks, lane);
            float acc[NR][MOE_TILE_ITEMS];
            moe_rows_partials<BITS, CPL, NR, 1>(
                acc, w, sc, bi, nchunks, lane,
                [&](int, int jj, int q) {
                    return make_float4(xr[jj][4 * q], xr[jj][4 * q + 1], xr[jj][4 * q + 2], xr[jj][4 * q + 3]);
                },
                [&](int, int jj) { return sx[jj]; });
            float v[NR]; /* every row's sum before any store: the butterflies interleave */
#pragma unroll
            for (int r = 0; r < NR; r++) v[r] = pt_warp_sum(acc[r][0]);
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < NR; r++) o[j][p + r] = moe_row_out(v[r], m, grow[r], eok, bf);
            }
        }
    }
    moe_rows_combine<MOE_DN_ROWS>(y, o, ord, wsh, t, H, k, d0, bf);
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
    /* three blocks an SM (80 registers) where the codes allow: one wave at
     * the Qwen3-30B-A3B shape, faster than two blocks without spills */
    pt_launch(moe_gu_kernel<BITS, CPL, CPL >= 4 ? 2 : 3>,
              dim3((unsigned)((I + per_block - 1) / per_block), (unsigned)B), dim3(MOE_GU_WARPS * 32), 0, c->stream,
              pt_pdl_chain(), h, x, idx, k, K, I, g, u, E, c->err_dev, (int)(c->base.act == PT_ACT_BF16), act);
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
    if (v2_gu && v2_down && pt_cuda_moe_expert_grid_on(B, E) && (down->n_experts > 1 ? down->n_experts : 1) == E)
        return pt_cuda_moe_tiled(c, y, x, idx, weights, T, top_k, gate, up, down, (int)act);
    if (v2_gu) {
        PT_TRY(moe_gu(c, c->moe_h, x, idx, B, top_k, gate, up, I, (int)act));
    } else if (v2 && pt_cuda_moe_dense_fits(B) && pt_cuda_moe_dense_ok(gate) && (!up || pt_cuda_moe_dense_ok(up))) {
        PT_TRY(pt_cuda_moe_gu_dense(c, c->moe_h, x, idx, B, top_k, gate, up, I, (int)act));
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
    if (v2 && pt_cuda_moe_dense_fits(B) && pt_cuda_moe_dense_ok(down))
        return pt_cuda_moe_down_dense(c, y, c->moe_h, idx, weights, T, top_k, down);
    PT_TRY(pt_cuda_gemv_items(c, c->moe_o, c->moe_h, B, 1, down, idx, 0, 0, H, H));
    return pt_cuda_moe_combine(c, y, c->moe_o, idx, weights, T, top_k, H, pt_cuda_bf(be), (const int32_t *)NULL);
}
