/* The MoE decode path's per-row pieces that both of its grids use
 * (moe_decode.cu: the per-item grid; moe_grid.cu: the expert grid): the
 * expert stack a kernel reads (moe_qm), an item's expert, a row's codes,
 * scales and biases into registers, a row's stored value, the chunks per
 * lane of a width; and the expert grid's entry points. Inlined where used,
 * as when both grids were one file. Not here: the kernels, the x staging
 * and the dot products (in the file of the grid that uses them); the MoE
 * declarations moe.cu shares (moe_decode.cuh). */
#ifndef PT_CUDA_MOE_ROWS_CUH
#define PT_CUDA_MOE_ROWS_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe_decode.cuh"

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

static inline moe_qm moe_qm_of(const pt_matrix *w, int64_t row_off) {
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

/* The row's value as the fast GEMV stores it: the warp sum (added to 0, the
 * one-warp block's fold), the bias, the rounding; zeros for a bad expert. */
__device__ __forceinline__ float moe_row_out(float v, const moe_qm &m, int64_t grow, bool eok, int bf) {
    v = 0.f + v;
    if (m.bias) v += pt_ld(m.bt, m.bias, grow);
    return eok ? pt_rnd(bf, v) : 0.f;
}

/* h[b, r0 + r] = glu(gate row r0 + r · x, up row r0 + r · x) for r < RPW
 * and r0 + r < I, from the warp sums v (RPW gate rows, then the same up
 * rows), each projection stored as moe_row_out stores it and the product
 * rounded as pt_cuda_glu rounds (pt_glu_val, the GLU kernel's own code).
 * Lane 0 stores. */
template <int RPW>
__device__ __forceinline__ void moe_glu_out(float *h, int64_t b, int64_t I, int64_t r0, const float (&v)[2 * RPW],
                                            const moe_qm &g, const moe_qm &u, const int64_t (&grow)[2 * RPW],
                                            bool eok, int bf, int act, int lane) {
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        if (r0 + r >= I) break;
        const float gv = moe_row_out(v[r], g, grow[r], eok, bf);
        const float uv = moe_row_out(v[RPW + r], u, grow[RPW + r], eok, bf);
        h[b * I + r0 + r] = pt_glu_val(act, gv, uv, bf);
    }
}

/* The combine's order and weights, formed before the experts' rows (so
 * their loads overlap the rows' work): ord[n] = the slot of rank n among
 * token t's (expert, slot) pairs in ascending order — the order of
 * moe_combine_kernel's walk (moe.cu), the next larger pair each step —
 * and wsh[n] = that slot's weight. k ints and floats of shared memory. */
__device__ __forceinline__ void moe_rows_order(int *ord, float *wsh, const int32_t *idx, const float *weights,
                                               int64_t t, int k) {
    const int32_t *it = idx + t * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int e = it[j];
        int rank = 0;
        for (int i = 0; i < k; i++) rank += it[i] < e || (it[i] == e && i < j);
        ord[rank] = j;
        wsh[rank] = weights[t * k + j];
    }
}

/* y[t, d0 .. d0 + ROWS) = the weighted sum of o[j][r] (token t's k experts'
 * rounded outputs of rows d0 + r) over the slots in moe_rows_order's order
 * (ord, wsh), rounding after each product and add as moe_combine_kernel
 * (moe.cu) does. Every thread of the block calls it (a barrier inside)
 * after o is written. */
template <int ROWS>
__device__ __forceinline__ void moe_rows_combine(float *y, const float (*o)[ROWS], const int *ord, const float *wsh,
                                                 int64_t t, int64_t H, int k, int64_t d0, int bf) {
    __syncthreads();
    if (threadIdx.x < ROWS && d0 + threadIdx.x < H) {
        float acc = 0.f;
        for (int n = 0; n < k; n++) /* as moe_combine_kernel */
            acc = pt_rnd(bf, __fadd_rn(acc, pt_rnd(bf, __fmul_rn(o[ord[n]][threadIdx.x], wsh[n]))));
        y[t * H + d0 + threadIdx.x] = acc;
    }
}

#define MOE_TILE_ITEMS 4 /* most items per tile of the expert grid (moe_grid.cu) */

/* Nibble T of a 16-bit half in place, OR-ed into the mantissa of 2^23:
 * (h & 0xF << 4T) | magic in one LOP3 (it takes one immediate: with both
 * constants as immediates the compiler emits an AND and an OR). */
template <int T>
__device__ __forceinline__ uint32_t moe_nib(uint32_t h, uint32_t magic) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(h), "n"(0xFu << (4 * T)), "r"(magic));
    return d;
}

/* The lane's partials of NR rows for N items (chunks lane + 32·j of each
 * row, as the fast GEMV's one-warp rows: gemv_fast.cu, gemv_fast_kernel):
 * acc[r][i] for row r, item i. xf(i, j, q) is item i's float4 q of the
 * lane's chunk j (pt_x_inplace), sf(i, j) its Σx of that chunk (moe_load_x's
 * sum). Each code is converted once for all N items and the NR rows' chains
 * are interleaved; every (row, item) chain is formed in that kernel's order
 * and folded as it compiles acc += s·d + b·Σx (a product b·Σx, an fma, an
 * add), so its bits whatever N, NR and x's home. */
template <int BITS, int CPL, int NR, int N, class XF, class SF>
__device__ __forceinline__ void moe_rows_partials(float (&acc)[NR][MOE_TILE_ITEMS], const uint4 (&w)[NR][CPL],
                                                  const float (&sc)[NR][CPL], const float (&bi)[NR][CPL], int nchunks,
                                                  int lane, XF xf, SF sf) {
    constexpr int VPC = 128 / BITS;
    const float MAGIC = 8388608.0f;
    const uint32_t magic = 0x4B000000u; /* its bits, for moe_nib */
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
            for (int i = 0; i < N; i++) xv[i] = xf(i, j, q);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const int wi = BITS == 4 ? q >> 1 : q;
                const uint32_t word = wi == 0 ? w[r][j].x : wi == 1 ? w[r][j].y : wi == 2 ? w[r][j].z : w[r][j].w;
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    uint32_t bits;
                    if constexpr (BITS == 4) {
                        const uint32_t half = (q & 1) ? word >> 16 : word;
                        bits = t == 0 ? moe_nib<0>(half, magic)
                               : t == 1 ? moe_nib<1>(half, magic)
                               : t == 2 ? moe_nib<2>(half, magic)
                                        : moe_nib<3>(half, magic);
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
        for (int i = 0; i < N; i++) {
            const float s = sf(i, j);
#pragma unroll
            for (int r = 0; r < NR; r++)
                acc[r][i] = __fadd_rn(acc[r][i], __fmaf_rn(sc[r][j], d[r][i], __fmul_rn(bi[r][j], s)));
        }
    }
}

/* moe_rows_partials with x staged in shared memory: item i at sm +
 * i·stride, chunk c at c·(VPC + 4); its Σx of chunk c at sxs[i·stride + c]. */
template <int BITS, int CPL, int NR, int N>
__device__ __forceinline__ void moe_tile_partials(float (&acc)[NR][MOE_TILE_ITEMS], const uint4 (&w)[NR][CPL],
                                                  const float (&sc)[NR][CPL], const float (&bi)[NR][CPL],
                                                  const float *sm, const float *sxs, int64_t stride, int nchunks,
                                                  int lane) {
    constexpr int VPC = 128 / BITS;
    moe_rows_partials<BITS, CPL, NR, N>(
        acc, w, sc, bi, nchunks, lane,
        [&](int i, int j, int q) {
            return *reinterpret_cast<const float4 *>(sm + i * stride + (lane + 32 * j) * (VPC + 4) + 4 * q);
        },
        [&](int i, int j) { return sxs[i * stride + lane + 32 * j]; });
}

/* Chunks per lane for K columns of BITS-bit codes when the decode kernels
 * take them (1, 2 or 4 with at most MOE_MAX_X values of x per lane), else 0. */
static inline int moe_cpl(int64_t K, int bits) {
    const int vpc = 128 / bits;
    if (K % vpc) return 0;
    const int64_t nchunks = K / vpc, cpl = (nchunks + 31) / 32;
    if (cpl * vpc > MOE_MAX_X) return 0;
    return cpl <= 1 ? 1 : cpl <= 2 ? 2 : 4;
}

/* The expert grid (moe_grid.cu): whether it takes B items over E experts
 * (PETREL_CUDA_MOE_EXPERT_GRID, from MOE_EXPERT_MIN_B items up) and, when
 * it does, moe_ffn over it (the caller checked the weights as for the
 * per-item grid's kernels; act a pt_glu_kind). */
bool pt_cuda_moe_expert_grid_on(int64_t B, int64_t E);
pt_status pt_cuda_moe_tiled(pt_cuda *c, float *y, const float *x, const int32_t *idx, const float *weights,
                            int64_t T, int k, const pt_matrix *gate, const pt_matrix *up, const pt_matrix *down,
                            int act);

#endif
