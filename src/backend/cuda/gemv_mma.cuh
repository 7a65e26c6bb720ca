/* Tensor-core decode GEMV for MLX affine 4- and 8-bit weights, bf16
 * activations: y[n, N] = x[n, K] · Wᵀ for NB = 1..8 activation rows in one
 * launch. Included by matmul.cu only; not a general GEMM (prefill stays on
 * dequantize + cuBLAS).
 *
 * Why tensor cores for a matrix-vector product: on the H200 a 4-bit GEMV
 * done with FMAs needs ~3 instructions per weight (unpack, convert, fma),
 * which is as many issue slots as the memory system delivers weights, so the
 * loop is issue-bound well below the read roofline. Here a code costs ~1
 * integer instruction: codes are OR-ed into the mantissa of bf16 128.0
 * (0x4300 | q is exactly 128 + q), two per 32-bit register, and fed as the A
 * operand of mma.m16n8k16 (16 weight rows × 16 k); the B operand's 8 columns
 * are the NB activation rows (unused columns are zero). The offset is
 * removed per quantization group in f32:
 *     Σ (s·q + b)·x = s·(D − 128·c·Σx) + b·Σx,   D = Σ (128 + q)·x'
 * where D is the tensor-core dot product of one group (exact products, f32
 * accumulation).
 *
 * 8-bit codes do not fit bf16's 7 mantissa bits: each byte is fed as two
 * nibbles, lo against x and hi against 16·x (exact: a power of two), so
 * Σ x' = 17·Σx (c = 17; c = 1 for 4-bit).
 *
 * Layout. A warp owns TILES tiles of 16 rows; lane (g = lane/4, t = lane%4)
 * loads 16 bytes of row g and of row g+8 of each tile per iteration (the 4
 * lanes of a row read 64 contiguous bytes). One mma's 16 k values come from
 * the 4 lanes t, so they must share a quantization group: for groups
 * narrower than 64 bytes of a row the lanes exchange words with shuffles
 * (a 2×2 or 4×4 transpose of 32-bit words) so that each slot j of every
 * lane holds the same group. Within a 32-bit word the pairs are (v_j,
 * v_{j+4}) (one shift and one LOP3 each); x is staged in shared memory in
 * that same pair order as bf16x2, so one 16-byte shared load gives the B
 * registers of a word's two mmas.
 *
 * Batch invariance (matmul_rows): the launch shape (tiles per warp, warps
 * per tile S, the K stage) depends only on N, K, bits and group size, never
 * on NB; each (row, column) dot product is one tensor-core result per group
 * (a column's result does not depend on the other columns), accumulated
 * over groups in a fixed order, and the S split partials are added in warp
 * order. So activation row n gives bit-identical outputs alone or batched.
 *
 * K is processed in stages of PT_MMA_KS values (x of the stage for all NB
 * rows in shared memory: ≤ 64 KiB), the S warps of a tile splitting each
 * stage. */
#ifndef PT_BACKEND_CUDA_GEMV_MMA_CUH
#define PT_BACKEND_CUDA_GEMV_MMA_CUH

#include "backend/cuda/cuda_internal.cuh"

#define PT_MMA_KS 2048          /* K values per shared-memory stage */
#define PT_MMA_WARPS 8          /* warps per block */

struct mma_args {
    const uint32_t *w;          /* codes [N, K·BITS/32] (of the expert) */
    const bf16 *sc, *bi;        /* [N, K/GS] */
    const void *bias;           /* [N] of bias type, or NULL */
    pt_ftype bt;
    const float *x;             /* [NB, K] f32 holding bf16 values */
    float *y;                   /* [NB, ldy] */
    int64_t ldy;
    int N, K;
    int nb;                     /* activation rows (<= the kernel's NB; the rest are zero columns) */
    int S;                      /* warps per tile group (split of each stage): 1, 2, 4 or 8 */
};

__device__ __forceinline__ void pt_mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Programmatic dependent launch (sm_90): wait for the previous kernel's
 * results (a no-op when the launch did not ask for overlap), and let the next
 * kernel start launching. */
__device__ __forceinline__ void pt_pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pt_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;\n" :::); }

/* Pair j (0..3) of a word as bf16x2 (128 + code): nibbles j and j+4. */
__device__ __forceinline__ uint32_t pt_mma_pair(uint32_t w, int j) {
    return ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
}

__device__ __forceinline__ uint32_t pt_pack_bf2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Word slots after the exchange. CPG = 16-byte chunks per group (1, 2, 4, 8).
 * In: v = the 4 words of this lane's chunk t. Out: slot j of every lane of a
 * row belongs to the same group (CPG >= 4: no exchange needed). */
template <int CPG>
__device__ __forceinline__ void pt_mma_exchange(uint4 &v, int t) {
    if constexpr (CPG <= 2) { /* 2×2 blocks of words between lanes t and t^2 */
        const bool lo = t < 2;
        uint32_t s0 = lo ? v.z : v.x, s1 = lo ? v.w : v.y;
        uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 2), r1 = __shfl_xor_sync(0xffffffffu, s1, 2);
        if (lo) { v.z = r0; v.w = r1; }
        else { v.x = r0; v.y = r1; }
    }
    if constexpr (CPG == 1) { /* then single words between t and t^1: a full 4×4 transpose */
        const bool odd = t & 1;
        uint32_t s0 = odd ? v.x : v.y, s1 = odd ? v.z : v.w;
        uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
        if (odd) { v.x = r0; v.z = r1; }
        else { v.y = r0; v.w = r1; }
    }
}

/* Stage-local word index of slot j for lane t in iteration it (16 words of a
 * row per iteration). */
template <int CPG>
__device__ __forceinline__ int pt_mma_word(int it, int t, int j) {
    if constexpr (CPG >= 4) return it * 16 + t * 4 + j;
    else if constexpr (CPG == 2) {
        const int chunk = t < 2 ? (j < 2 ? t : t + 2) : (j < 2 ? t - 2 : t);
        const int word = t < 2 ? (j & 1) : (j & 1) + 2;
        /* lo lanes hold words 0,1 of chunks t and t+2; hi lanes words 2,3 of chunks t-2 and t */
        return it * 16 + chunk * 4 + word;
    } else return it * 16 + j * 4 + t;
}

/* Stage-local group of slot j in iteration it. */
template <int BITS, int CPG>
__device__ __forceinline__ int pt_mma_group(int it, int j) {
    if constexpr (CPG >= 4) return it / (CPG / 4);
    else if constexpr (CPG == 2) return it * 2 + (j >> 1);
    else return it * 4 + j;
}

/* The split partials through shared memory, added in warp order, + bias,
 * bf16 rounding, store. */
template <int NB, int TILES>
__device__ __forceinline__ void pt_mma_reduce(const mma_args &a, float *red, const float (&tot)[TILES][4], int TPB,
                                              int S, int warp, int g, int t) {
    const int N = a.N;
    __syncthreads();
#pragma unroll
    for (int tt = 0; tt < TILES; tt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            if (col < NB) red[((warp * TILES + tt) * 16 + r) * NB + col] = tot[tt][i];
        }
    __syncthreads();
    const int outs = TPB * TILES * 16 * NB;
    for (int i = threadIdx.x; i < outs; i += blockDim.x) {
        const int col = i % NB, r16 = (i / NB) % 16, tt = (i / (NB * 16)) % TILES, tgl = i / (NB * 16 * TILES);
        const int row = ((blockIdx.x * TPB + tgl) * TILES + tt) * 16 + r16;
        if (row >= N || col >= a.nb) continue;
        float v = 0.f;
        for (int ss = 0; ss < S; ss++) v += red[(((tgl * S + ss) * TILES + tt) * 16 + r16) * NB + col];
        if (a.bias) v += pt_ld(a.bt, a.bias, row);
        a.y[(int64_t)col * a.ldy + row] = pt_round_bf(v);
    }
}

/* Stages x[:, k0 : k0+ks] into shared memory for all NB columns (columns
 * past a.nb are zero): xp rows (stride xs u32) of bf16 pairs in the order
 * the A registers are built, and Σx per group (rows of stride gss floats),
 * summed by 8 lanes per group in a fixed order. The whole block calls it. */
template <int BITS, int GS, int NB>
__device__ __forceinline__ void pt_mma_stage_x(const mma_args &a, uint32_t *xp, int xs, float *sxs, int gss, int k0,
                                               int ks) {
    const int K = a.K;
    if constexpr (BITS == 4) {
        for (int i = threadIdx.x; i < NB * (ks / 8); i += blockDim.x) {
            const int n = i / (ks / 8), wi = i % (ks / 8);
            const float4 *src = reinterpret_cast<const float4 *>(a.x + (int64_t)n * K + k0 + wi * 8);
            float4 u = make_float4(0.f, 0.f, 0.f, 0.f), v = u;
            if (n < a.nb) u = __ldg(src), v = __ldg(src + 1);
            uint4 o;
            o.x = pt_pack_bf2(u.x, v.x); o.y = pt_pack_bf2(u.y, v.y);
            o.z = pt_pack_bf2(u.z, v.z); o.w = pt_pack_bf2(u.w, v.w);
            *reinterpret_cast<uint4 *>(xp + n * xs + wi * 4) = o;
        }
    } else {
        for (int i = threadIdx.x; i < NB * (ks / 4); i += blockDim.x) {
            const int n = i / (ks / 4), wi = i % (ks / 4);
            float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
            if (n < a.nb) u = __ldg(reinterpret_cast<const float4 *>(a.x + (int64_t)n * K + k0 + wi * 4));
            uint4 o;
            o.x = pt_pack_bf2(u.x, u.z); o.y = pt_pack_bf2(16.f * u.x, 16.f * u.z);
            o.z = pt_pack_bf2(u.y, u.w); o.w = pt_pack_bf2(16.f * u.y, 16.f * u.w);
            *reinterpret_cast<uint4 *>(xp + n * xs + wi * 4) = o;
        }
    }
    const int ng = ks / GS, total = NB * ng * 8, padded = (total + 31) & ~31;
    for (int i = threadIdx.x; i < padded; i += blockDim.x) { /* whole warps: the shuffles below */
        const int q = i & 7, ni = i >> 3, n = ni / ng, gi = ni % ng;
        float v = 0.f;
        if (i < total && n < a.nb) {
            const float *src = a.x + (int64_t)n * K + k0 + gi * GS + q * (GS / 8);
#pragma unroll
            for (int e = 0; e < GS / 8; e++) v = __fadd_rn(v, src[e]);
        }
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
        if (q == 0 && i < total) sxs[n * gss + gi] = v;
    }
}

/* Compile-time shape of one group unit: CPG 16-byte chunks per group, UIT
 * iterations (64 bytes of a row) per unit, NGU groups per unit. */
template <int BITS, int GS>
struct pt_mma_shape {
    static constexpr int CPG = GS * BITS / 128;
    static constexpr int UIT = CPG >= 4 ? CPG / 4 : 1;
    static constexpr int NGU = CPG >= 4 ? 1 : 4 / CPG;
};

/* One group unit u (stage-local) of a warp: the exchange, the mmas and the
 * per-group fold into tot. wv: the unit's codes as loaded (lane t's chunk);
 * sb: bf16 scale (low half) | bias (high half) per group, tile and row half;
 * xrow: this lane's activation row (column g) of the stage, pairs;
 * sx0/sx1: Σx per stage group of columns 2t and 2t+1 (NULL: column unused).
 * Every floating-point step is an explicit intrinsic, so no kernel that
 * calls this can contract the fold differently (batch invariance). */
template <int BITS, int GS, int NB, int TILES>
__device__ __forceinline__ void pt_mma_unit(uint4 (&wv)[pt_mma_shape<BITS, GS>::UIT][TILES][2],
                                            const uint32_t (&sb)[pt_mma_shape<BITS, GS>::NGU][TILES][2], int u,
                                            const uint32_t *xrow, const float *sx0, const float *sx1,
                                            float (&tot)[TILES][4], int g, int t) {
    constexpr int CPG = pt_mma_shape<BITS, GS>::CPG, UIT = pt_mma_shape<BITS, GS>::UIT;
    float acc[TILES][4];
#pragma unroll
    for (int tt = 0; tt < TILES; tt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[tt][i] = 0.f;
#pragma unroll
    for (int ui = 0; ui < UIT; ui++) {
        const int it = u * UIT + ui;
#pragma unroll
        for (int tt = 0; tt < TILES; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++) pt_mma_exchange<CPG>(wv[ui][tt][h], t);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int wi = pt_mma_word<CPG>(it, t, j);
            uint4 b = make_uint4(0, 0, 0, 0);
            if (g < NB) b = *reinterpret_cast<const uint4 *>(xrow + wi * 4);
#pragma unroll
            for (int tt = 0; tt < TILES; tt++) {
                const uint4 &vg = wv[ui][tt][0], &vh = wv[ui][tt][1];
                const uint32_t wg = j == 0 ? vg.x : j == 1 ? vg.y : j == 2 ? vg.z : vg.w;
                const uint32_t wh = j == 0 ? vh.x : j == 1 ? vh.y : j == 2 ? vh.z : vh.w;
                pt_mma_bf16(acc[tt], pt_mma_pair(wg, 0), pt_mma_pair(wh, 0), pt_mma_pair(wg, 1), pt_mma_pair(wh, 1),
                            b.x, b.y);
                pt_mma_bf16(acc[tt], pt_mma_pair(wg, 2), pt_mma_pair(wh, 2), pt_mma_pair(wg, 3), pt_mma_pair(wh, 3),
                            b.z, b.w);
            }
            /* a group ends after this slot: fold it into the totals */
            const bool group_end = CPG >= 4 ? (j == 3 && ui == UIT - 1) : CPG == 2 ? (j & 1) == 1 : true;
            if (group_end) {
                const int q = CPG >= 4 ? 0 : CPG == 2 ? (j >> 1) : j;
                const int gl = pt_mma_group<BITS, CPG>(it, j); /* stage-local group */
                constexpr float C128 = BITS == 4 ? 128.f : 128.f * 17.f;
                const float s0v = sx0 ? sx0[gl] : 0.f, s1v = NB > 1 && sx1 ? sx1[gl] : 0.f;
                const float o0 = __fmul_rn(C128, s0v), o1 = __fmul_rn(C128, s1v);
#pragma unroll
                for (int tt = 0; tt < TILES; tt++) {
                    const uint32_t p0 = sb[q][tt][0], p1 = sb[q][tt][1];
                    const float sc0 = __uint_as_float(p0 << 16), bi0 = __uint_as_float(p0 & 0xFFFF0000u);
                    const float sc1 = __uint_as_float(p1 << 16), bi1 = __uint_as_float(p1 & 0xFFFF0000u);
                    tot[tt][0] = __fadd_rn(tot[tt][0], __fmaf_rn(sc0, __fsub_rn(acc[tt][0], o0), __fmul_rn(bi0, s0v)));
                    tot[tt][2] = __fadd_rn(tot[tt][2], __fmaf_rn(sc1, __fsub_rn(acc[tt][2], o0), __fmul_rn(bi1, s0v)));
                    if constexpr (NB > 1) { /* odd columns exist */
                        tot[tt][1] = __fadd_rn(tot[tt][1], __fmaf_rn(sc0, __fsub_rn(acc[tt][1], o1), __fmul_rn(bi0, s1v)));
                        tot[tt][3] = __fadd_rn(tot[tt][3], __fmaf_rn(sc1, __fsub_rn(acc[tt][3], o1), __fmul_rn(bi1, s1v)));
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[tt][i] = 0.f;
                }
            }
        }
    }
}

/* Loads the codes and scale|bias words of unit u (stage-local; wbase/gbase:
 * the stage's first word and group of a row). */
template <int BITS, int GS, int TILES>
__device__ __forceinline__ void pt_mma_load(uint4 (&wv)[pt_mma_shape<BITS, GS>::UIT][TILES][2],
                                            uint32_t (&sb)[pt_mma_shape<BITS, GS>::NGU][TILES][2],
                                            const uint32_t *const (&rp)[TILES][2], const int (&rows)[TILES][2],
                                            const unsigned short *sc, const unsigned short *bi, int64_t gpr,
                                            int64_t wbase, int64_t gbase, int u, int t) {
    constexpr int UIT = pt_mma_shape<BITS, GS>::UIT, NGU = pt_mma_shape<BITS, GS>::NGU;
#pragma unroll
    for (int ui = 0; ui < UIT; ui++)
#pragma unroll
        for (int tt = 0; tt < TILES; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                wv[ui][tt][h] = __ldg(reinterpret_cast<const uint4 *>(rp[tt][h] + wbase + (u * UIT + ui) * 16 + t * 4));
#pragma unroll
    for (int q = 0; q < NGU; q++)
#pragma unroll
        for (int tt = 0; tt < TILES; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t gi = (int64_t)rows[tt][h] * gpr + gbase + u * NGU + q;
                sb[q][tt][h] = (uint32_t)__ldg(sc + gi) | ((uint32_t)__ldg(bi + gi) << 16);
            }
}

template <int BITS, int GS, int NB, int TILES>
__global__ void __launch_bounds__(PT_MMA_WARPS * 32) gemv_mma_kernel(mma_args a) {
    constexpr int CPG = GS * BITS / 128;               /* 16-byte chunks per group */
    constexpr int UIT = CPG >= 4 ? CPG / 4 : 1;        /* iterations per group unit */
    constexpr int XW = BITS == 4 ? PT_MMA_KS / 2 : PT_MMA_KS; /* u32 pairs of x per stage row */
    constexpr int XS = XW + 4;                         /* padded row stride (u32) */
    constexpr int GPS = PT_MMA_KS / GS;                /* groups per full stage */
    extern __shared__ __align__(16) uint32_t smem[];
    uint32_t *xp = smem;                               /* [NB][XS] bf16 pairs */
    float *sxs = reinterpret_cast<float *>(smem + NB * XS); /* [NB][GPS] Σx per group */
    float *red = sxs + NB * GPS;                       /* [WARPS][TILES][16][NB] split partials */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int S = a.S, TPB = PT_MMA_WARPS / S;
    const int tg = blockIdx.x * TPB + warp / S, s = warp % S;
    const int K = a.K, N = a.N;
    const int64_t wpr = (int64_t)K * BITS / 32, gpr = K / GS;
    const unsigned short *sc16 = reinterpret_cast<const unsigned short *>(a.sc);
    const unsigned short *bi16 = reinterpret_cast<const unsigned short *>(a.bi);

    /* rows of this lane: tile tt, halves 0 (row g) and 1 (row g+8); rows past
     * N read the last row (their results are not stored) */
    const uint32_t *rp[TILES][2];
    int rows[TILES][2];
#pragma unroll
    for (int tt = 0; tt < TILES; tt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = (tg * TILES + tt) * 16 + g + 8 * h;
            rows[tt][h] = r < N ? r : N - 1;
            rp[tt][h] = a.w + (int64_t)rows[tt][h] * wpr;
        }

    float tot[TILES][4];
#pragma unroll
    for (int tt = 0; tt < TILES; tt++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[tt][i] = 0.f;

    /* A ring of P units of loads per warp (P·UIT·TILES·2 loads of 16 bytes
     * in flight per lane); a stage's first P units are issued before the
     * stage's x is staged, so the weight reads overlap the staging and its
     * barriers (and, for the first stage, the previous kernel's tail under
     * programmatic dependent launch). */
    constexpr int NGU = pt_mma_shape<BITS, GS>::NGU;
    constexpr int P0 = (CPG == 1 ? 2 : 4) / (TILES * UIT);
    constexpr int P = P0 < 1 ? 1 : P0;
    const bool has_rows = tg * TILES * 16 < N;
    uint4 wv[P][UIT][TILES][2];
    uint32_t sb[P][NGU][TILES][2];
    for (int k0 = 0; k0 < K; k0 += PT_MMA_KS) {
        const int ks = K - k0 < PT_MMA_KS ? K - k0 : PT_MMA_KS; /* values in this stage */
        /* this warp's group units of the stage */
        const int nit = ks * BITS / 512;               /* iterations (64 bytes of a row) */
        const int nu = nit / UIT, u0 = s * nu / S, u1 = has_rows ? (s + 1) * nu / S : u0;
        const int64_t wbase = (int64_t)k0 * BITS / 32;
        const int64_t gbase = k0 / GS;
#pragma unroll
        for (int p = 0; p < P; p++)
            if (u0 + p < u1)
                pt_mma_load<BITS, GS, TILES>(wv[p], sb[p], rp, rows, sc16, bi16, gpr, wbase, gbase, u0 + p, t);
        if (k0 == 0) pt_pdl_wait(); /* x is written by the previous kernel */
        __syncthreads(); /* the previous stage's x is no longer read */
        pt_mma_stage_x<BITS, GS, NB>(a, xp, XS, sxs, GPS, k0, ks);
        __syncthreads();
        for (int u = u0; u < u1; u += P) {
#pragma unroll
            for (int p = 0; p < P; p++)
                if (u + p < u1) {
                    pt_mma_unit<BITS, GS, NB, TILES>(wv[p], sb[p], u + p, xp + g * XS,
                                                     2 * t < NB ? sxs + (2 * t) * GPS : NULL,
                                                     2 * t + 1 < NB ? sxs + (2 * t + 1) * GPS : NULL, tot, g, t);
                    /* the slot just consumed takes unit u+p+P at once (a
                     * ring), so P-1 units stay in flight during every
                     * unit's mmas */
                    if (u + p + P < u1)
                        pt_mma_load<BITS, GS, TILES>(wv[p], sb[p], rp, rows, sc16, bi16, gpr, wbase, gbase, u + p + P,
                                                     t);
                }
        }
    }
    pt_pdl_trigger();
    pt_mma_reduce<NB, TILES>(a, red, tot, TPB, S, warp, g, t);
}


/* Dynamic shared memory of one block (bytes). */
static inline size_t pt_mma_smem(int bits, int gs, int nb, int tiles) {
    const int xw = bits == 4 ? PT_MMA_KS / 2 : PT_MMA_KS;
    return ((size_t)nb * (xw + 4) + (size_t)nb * (PT_MMA_KS / gs) + (size_t)PT_MMA_WARPS * tiles * 16 * nb) * 4;
}

#endif
