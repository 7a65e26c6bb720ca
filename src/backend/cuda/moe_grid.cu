/* The CUDA MoE decode path's expert grid (batches of MOE_EXPERT_MIN_B
 * items up, PETREL_CUDA_MOE_EXPERT_GRID): the items grouped by expert into
 * tiles of up to four (moe_tiles_kernel), gate|up + GLU and down over
 * (rows, tile) blocks in two shapes, lean and wide (moe_gu_tile_kernel,
 * moe_down_tile_kernel), then moe.cu's combine; entered through
 * pt_cuda_moe_tiled from pt_cuda_moe_ffn_decode. Each (row, item) value is
 * the same bits as the per-item grid's. Not here: the routing, the per-item
 * grid and the choice between the grids (moe_decode.cu), the per-row pieces
 * both grids use (moe_rows.cuh), the combine kernel and the grouped prefill
 * (moe.cu).
 * Note for dev/sass_same.sh: nvcc 13.0 does not compile most of the tile
 * kernels deterministically (cicc gives differently scheduled PTX from the
 * same input from run to run), so two builds of this same file can differ
 * in those kernels' register numbering and instruction order; compare
 * against several builds of the old source, not one. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_rows.cuh"

/* ---- the decode path's expert grid (batches of MOE_EXPERT_MIN_B items up) -
 * The per-item grid (moe_decode.cu) runs one block per (rows, item): every
 * item re-reads its expert's rows, and each (row, item) converts the row's
 * codes again. Here a small kernel (moe_tiles_kernel) first groups the
 * items by expert into tiles of at most MOE_TILE_ITEMS items of one
 * expert; then one block per (rows, tile) loads its rows of the tile's
 * expert into registers once, stages the tile's x rows in shared memory
 * once (one barrier per tile, not two per item) and forms all the tile's
 * items together: each code is converted once and multiplied into every
 * item's running sum. Each (row, item) value is still formed exactly as
 * there — the same chunks per lane, the same fma chain per chunk over the
 * same values, the per-chunk fold acc + (scale·d + bias·Σx) as the fast
 * GEMV compiles it (moe_rows_partials: a product bias·Σx, an fma, an add,
 * written out with _rn intrinsics so no contraction can differ), the
 * butterfly, moe_row_out — so it is the same bits whichever
 * grid computed it, and a token's result depends on nothing but its own
 * row. Items whose index is outside [0, E) join expert 0's tiles (they
 * compute zeros and raise the error word, as moe_item_expert does). The
 * grid is sized for the most tiles B items can make (min(B, E) + B / items
 * per tile); blocks past the real count exit at once, so nothing waits for
 * the host. */

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
        *reinterpret_cast<float4 *>(xi + c * (VPC + 4) + 4 * q) = pt_x_inplace<BITS>(v);
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

/* acc for n (1 .. MOE_TILE_ITEMS) items: one unrolled body per count. */
template <int BITS, int CPL, int NR>
__device__ __forceinline__ void moe_tile_partials_n(float (&acc)[NR][MOE_TILE_ITEMS], const uint4 (&w)[NR][CPL],
                                                    const float (&sc)[NR][CPL], const float (&bi)[NR][CPL],
                                                    const float *sm, int64_t stride, int nchunks, int lane, int n) {
    static_assert(MOE_TILE_ITEMS == 4, "one case per count below");
    constexpr int VPC = 128 / BITS;
    const float *sxs = sm + nchunks * (VPC + 4 + VPC / 4); /* moe_stage_tile's Σx per chunk */
    if (n == 4) moe_tile_partials<BITS, CPL, NR, 4>(acc, w, sc, bi, sm, sxs, stride, nchunks, lane);
    else if (n == 3) moe_tile_partials<BITS, CPL, NR, 3>(acc, w, sc, bi, sm, sxs, stride, nchunks, lane);
    else if (n == 2) moe_tile_partials<BITS, CPL, NR, 2>(acc, w, sc, bi, sm, sxs, stride, nchunks, lane);
    else moe_tile_partials<BITS, CPL, NR, 1>(acc, w, sc, bi, sm, sxs, stride, nchunks, lane);
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
        moe_glu_out<RPW>(h, b, I, r0, v, g, u, grow, eok, bf, act, lane);
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

/* The expert grid from this many items (T·top_k) up: from nine tokens at
 * top-8. Below, the per-item grid (no tile list, no separate combine
 * launch) is faster even though each item re-reads its expert's rows. The
 * qwen3-30b-a3b MoE block on the H200 (bench_moe, bench/RESULTS.md, with
 * the interleaved per-item kernels), µs per-item grid / expert grid lean /
 * wide: T = 1 26.3 / 36.8 / 40.7, T = 2 44.4 / 55.5 / 59.6, T = 4 79.9 /
 * 89.3 / 99.4, T = 8 147.5 / 151.6 / 164.5, T = 16 272.1 / 264.5 / 273.1,
 * T = 64 1019 / 706 / 703, T = 128 2012 / 1291 / 1261. */
#define MOE_EXPERT_MIN_B 65
static int g_moe_expert_grid = -1;
static int64_t g_moe_expert_min_b = MOE_EXPERT_MIN_B;
/* For tests and benchmarks: the expert grid from b items up (b <= 0: the default). */
extern "C" void pt_cuda_moe_expert_min(int b) { g_moe_expert_min_b = b > 0 ? b : MOE_EXPERT_MIN_B; }
bool pt_cuda_moe_expert_grid_on(int64_t B, int64_t E) {
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
pt_status pt_cuda_moe_tiled(pt_cuda *c, float *y, const float *x, const int32_t *idx, const float *weights, int64_t T,
                            int k, const pt_matrix *gate, const pt_matrix *up, const pt_matrix *down, int act) {
    const bool lean = g_moe_tile_shape >= 0 ? g_moe_tile_shape == 1 : T * k < MOE_TILE_LEAN_B;
    return lean ? moe_tiled_shape<true>(c, y, x, idx, weights, T, k, gate, up, down, act)
                : moe_tiled_shape<false>(c, y, x, idx, weights, T, k, gate, up, down, act);
}
