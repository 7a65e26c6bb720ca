/* The block kernel of --fused-decode-attn on CUDA (kv_fused.cu has the
 * entry point, the split count and the merge; kv_fused4.cu / kv_fused8.cu
 * instantiate this template for every configuration a model spec can
 * produce). Flash-decoding over a QUANTIZED KV cache, one query row: a block
 * takes one (KV head, split) pair, i.e. a range of keys for the G query
 * heads that share the KV head; each of its 4 warps walks 16-key tiles of
 * the range with an online softmax, the warps are merged in a fixed order
 * and the block leaves its (max, sum of exp) and unnormalized output per
 * head for the merge kernel. No atomics: the result does not depend on
 * scheduling.
 *
 * Both products run on tensor cores (mma.sync m16n8k16, f16 inputs, f32
 * accumulation) with the dequantization factored out of the inner loop:
 *   scores  S[h, j] = Σ_groups sc[j, g]·(Σ_{e∈g} q[h, e]·code[j, e]) + bi[j, g]·Σ_{e∈g} q[h, e]
 *           the MMA computes the inner sums: A = the queries (rows = heads),
 *           B = the raw codes, which are small integers and therefore exact
 *           in f16; scale and bias are applied per group to the partial sums.
 *   output  O[h, e] = Σ_j (p[h, j]·sc[j, g])·code[j, e] + Σ_j p[h, j]·bi[j, g]
 *           A = p·scale per group (rows = heads), B = the raw V codes; the
 *           bias term is one scalar per (head, group), accumulated on the side.
 * The 16 rows of an MMA's A fragment are 8 heads (G <= 8) and, in rows
 * 8..15, the low parts of the same values: x = hi + lo with hi = f16(x),
 * lo = f16(x − hi), so the f16 inputs carry ~22 bits of the f32 operand and
 * C rows g and g + 8 add up to the product. The GQA heads of a KV head share
 * every code load and every conversion.
 *
 * Codes become f16 without a conversion instruction: a nibble or byte OR-ed
 * into the mantissa of 1024.0 (0x6400) is the f16 value 1024 + code, and one
 * packed subtraction leaves the exact code (two codes per instruction).
 *
 * Which dims an MMA's k index stands for is a free choice as long as A and B
 * agree: for K the 16 dims of a k-step are taken inside one quantization
 * group (so the scale can be applied per group) and arranged so that each
 * thread's codes come from one 32-bit word (kdim below); for V the 8 output
 * dims of an n-tile are one word's worth and lie inside one group.
 *
 * Output-changing (an L3 lever): the online softmax divides once at the end
 * instead of rounding normalized probabilities, and the sums run in another
 * order than the exact path's. Scores keep the exact path's rounding points
 * (q·scale rounded, the dot rounded, soft-cap) in bf16 mode. */
#ifndef PT_BACKEND_CUDA_KV_FUSED_CUH
#define PT_BACKEND_CUDA_KV_FUSED_CUH

#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>

#define FD_WARPS 4
#define FD_THREADS (FD_WARPS * 32)
#define FD_MAX_G 8

struct pt_fd_args {
    const float *q;               /* [nh, hd] */
    const uint32_t *k, *v;        /* codes [nkv, cap, hd·bits/32] */
    const void *ks, *kb, *vs, *vb; /* [nkv, cap, hd/gs] of dt */
    pt_ftype dt;
    const int32_t *pos;           /* [1] device: the query's position */
    int nh, nkv;
    int64_t cap;
    float scale, softcap;
    int window, bf;
    int nsplit;
    float2 *ML;                   /* [nh, nsplit] (max, sum of exp) per split */
    float *P;                     /* [nh, nsplit, hd] unnormalized partial outputs */
};

__device__ __forceinline__ void fd_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* x0 (low half) and x1 as f16 pairs hi and lo with hi + lo ≈ x to ~22 bits. */
__device__ __forceinline__ void fd_split(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* r holds 1024 + c0 (low half) and 1024 + c1 as f16: returns (c0, c1). */
__device__ __forceinline__ uint32_t fd_unbias(uint32_t r) {
    const uint32_t k1024 = 0x64006400u;
    __half2 h = *reinterpret_cast<const __half2 *>(&r);
    h = __hsub2(h, *reinterpret_cast<const __half2 *>(&k1024));
    return *reinterpret_cast<const uint32_t *>(&h);
}
/* The nibbles at bits 0..3 and 16..19 of x as an f16 pair. */
__device__ __forceinline__ uint32_t fd_nib2(uint32_t x) { return fd_unbias((x & 0x000f000fu) | 0x64006400u); }
/* The bytes at bits 0..7 and 16..23 of x as an f16 pair. */
__device__ __forceinline__ uint32_t fd_byte2(uint32_t x) { return fd_unbias((x & 0x00ff00ffu) | 0x64006400u); }

/* The dim that slot s (0..3 <-> MMA k = 2t, 2t+1, 2t+8, 2t+9) of thread t
 * stands for in k-step ks of a K row. Thread t reads word 4w + t of the row
 * (w = ks/2 for 4 bits, ks for 8 bits), so a k-step stays inside one
 * 32-dim chunk (4 bits) or one 16-dim chunk (8 bits), inside one group.
 * 4 bits: word 4c + t holds dims 32c + 8t + 0..7 as nibbles 0..7; k-step 2c
 * takes nibbles (0, 4 | 1, 5) and 2c + 1 takes (2, 6 | 3, 7), the pairs
 * fd_nib2 extracts from the word shifted by 0, 4, 8, 12.
 * 8 bits: word 4ks + t holds dims 16ks + 4t + 0..3. */
template <int BITS>
__device__ __forceinline__ int fd_kdim(int ks, int t, int s) {
    if (BITS == 4) return 32 * (ks >> 1) + 8 * t + 2 * (ks & 1) + (s >> 1) + 4 * (s & 1);
    return 16 * ks + 4 * t + s;
}

template <int BITS, int GS, int D, int G>
__global__ void __launch_bounds__(FD_THREADS, D <= 128 ? 3 : 1) fd_block_kernel(pt_fd_args a) {
    static_assert(BITS == 4 || BITS == 8, "4- or 8-bit codes");
    static_assert(D % 32 == 0 && D % GS == 0 && GS % 32 == 0 && G >= 1 && G <= FD_MAX_G, "shape");
    constexpr int NG = D / GS, KS = D / 16, NT = D / 8, WPR = D * BITS / 32;
    constexpr int NKW = BITS == 4 ? D / 32 : D / 16; /* K words a thread reads per row */
    constexpr int KSG = GS / 16;                     /* k-steps per group */
    __shared__ float qs[G][D];
    __shared__ float qsum[G][NG];
    __shared__ float wm[FD_WARPS][G], wl[FD_WARPS][G];
    __shared__ float wo[FD_WARPS][G][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;

    /* the key range: positions lo + [0, n), this split's share [j0, j1) */
    const int64_t hi = a.pos[0];
    int64_t lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    int64_t n = hi - lo + 1;
    if (n > a.cap) n = a.cap, lo = hi - n + 1;
    if (n < 0) n = 0;
    const int64_t per = (n + nsplit - 1) / nsplit;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    const int64_t rbase = (int64_t)kh * a.cap;

    /* the pre-scaled queries (rounded like the exact path) and their group sums */
    for (int i = threadIdx.x; i < G * D; i += FD_THREADS)
        qs[i / D][i % D] = pt_rnd(a.bf, a.q[(int64_t)kh * G * D + i] * a.scale);
    __syncthreads();
    for (int i = warp; i < G * NG; i += FD_WARPS) { /* a warp per (head, group), lanes in fixed order */
        float s = 0.f;
        for (int e = lane; e < GS; e += 32) s += qs[i / NG][(i % NG) * GS + e];
        s = pt_warp_sum(s);
        if (lane == 0) qsum[i / NG][i % NG] = s;
    }
    __syncthreads();
    /* A fragments of the scores: row g = head g (hi), row g + 8 = its lo part */
    uint32_t qh[KS][2], ql[KS][2];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float x0 = g < G ? qs[g][fd_kdim<BITS>(ks, t, 2 * r)] : 0.f;
            const float x1 = g < G ? qs[g][fd_kdim<BITS>(ks, t, 2 * r + 1)] : 0.f;
            fd_split(x0, x1, qh[ks][r], ql[ks][r]);
        }
    float qg[NG];
#pragma unroll
    for (int gr = 0; gr < NG; gr++) qg[gr] = g < G ? qsum[g][gr] : 0.f;

    float m = -INFINITY, l = 0.f; /* head g: running max, this thread's share of the sum */
    float o[NT][4];               /* head g, dims 8i + 2t, +1: [0..1] hi, [2..3] lo parts */
    float bsum[NG];               /* head g: Σ p·bias per group (this thread's keys) */
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
#pragma unroll
    for (int gr = 0; gr < NG; gr++) bsum[gr] = 0.f;
    const uint32_t vsel = g < 4 ? 0x5410u : 0x7632u; /* V: the half-words holding nibble g (4 bits) */
    const int vsh = 4 * (g & 3);
    const uint32_t bsel = (uint32_t)(g & 3) | ((uint32_t)(4 + (g & 3)) << 8); /* V: byte g & 3 (8 bits) */

    const int esz = a.dt == PT_FT_F32 ? 4 : 2;
    for (int64_t jt = j0 + 16 * warp; jt < j1; jt += 16 * FD_WARPS) {
        { /* the warp's next tile into L2 while this one computes: lanes 0-15 its K rows (codes, scales,
           * biases), lanes 16-31 its V rows — no registers held, the loads of the next iteration then
           * wait on L2 instead of HBM */
            const int64_t jn = jt + 16 * FD_WARPS + (lane & 15);
            if (jn < j1) {
                const int64_t rn = rbase + (lo + jn) % a.cap;
                const char *pc = (const char *)((lane < 16 ? a.k : a.v) + rn * WPR);
                const char *ps = (const char *)(lane < 16 ? a.ks : a.vs) + rn * NG * esz;
                const char *pb = (const char *)(lane < 16 ? a.kb : a.vb) + rn * NG * esz;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pc));
                if (WPR * 4 > 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(pc + 128));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(ps));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pb));
            }
        }
        /* the rows of the keys this thread's C fragments hold: jt + 8h + 2t + i */
        int64_t crow[2][2];
        bool cin[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int64_t jj = jt + 8 * h + 2 * t + i;
                cin[h][i] = jj < j1;
                crow[h][i] = rbase + (lo + (cin[h][i] ? jj : j0)) % a.cap;
            }
        float s[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* B fragments: key jt + 8h + g, this thread's words */
            const int64_t jj = jt + 8 * h + g;
            const uint32_t *kr = a.k + (rbase + (lo + (jj < j1 ? jj : j0)) % a.cap) * WPR;
            uint32_t kw[NKW];
#pragma unroll
            for (int w = 0; w < NKW; w++) kw[w] = kr[4 * w + t];
            float acc[2] = {0.f, 0.f};
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int kk = 0; kk < KSG; kk++) {
                    const int ks = gr * KSG + kk;
                    uint32_t b0, b1;
                    if (BITS == 4) {
                        const uint32_t w = kw[ks >> 1] >> (8 * (ks & 1));
                        b0 = fd_nib2(w);
                        b1 = fd_nib2(w >> 4);
                    } else {
                        b0 = fd_unbias(__byte_perm(kw[ks], 0x64646464u, 0x4140));
                        b1 = fd_unbias(__byte_perm(kw[ks], 0x64646464u, 0x4342));
                    }
                    fd_mma(c, qh[ks][0], ql[ks][0], qh[ks][1], ql[ks][1], b0, b1);
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int64_t pi = crow[h][i] * NG + gr;
                    acc[i] = fmaf(pt_ld(a.dt, a.kb, pi), qg[gr], fmaf(pt_ld(a.dt, a.ks, pi), c[i] + c[2 + i], acc[i]));
                }
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float v = pt_rnd(a.bf, acc[i]);
                if (a.softcap > 0.f) v = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, v / a.softcap))) * a.softcap);
                s[h][i] = cin[h][i] ? v : -INFINITY;
            }
        }
        /* online softmax for head g over the tile's 16 keys (lanes 4g..4g+3) */
        float mt = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(m, mt);
        if (mn == -INFINITY) continue; /* no key yet: the same for every lane (key validity is per key) */
        const float f = m == -INFINITY ? 0.f : expf(m - mn);
        float p[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 2; i++) p[h][i] = s[h][i] == -INFINITY ? 0.f : expf(s[h][i] - mn);
        l = l * f + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
        m = mn;
        if (f != 1.f) {
#pragma unroll
            for (int i = 0; i < NT; i++) o[i][0] *= f, o[i][1] *= f, o[i][2] *= f, o[i][3] *= f;
#pragma unroll
            for (int gr = 0; gr < NG; gr++) bsum[gr] *= f;
        }
        /* A fragments of p·V per group: row g = p·scale (hi), row g + 8 = lo */
        uint32_t pa[NG][4];
#pragma unroll
        for (int gr = 0; gr < NG; gr++) {
            float x[2][2];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int64_t pi = crow[h][i] * NG + gr;
                    x[h][i] = p[h][i] * pt_ld(a.dt, a.vs, pi);
                    bsum[gr] = fmaf(p[h][i], pt_ld(a.dt, a.vb, pi), bsum[gr]);
                }
            fd_split(x[0][0], x[0][1], pa[gr][0], pa[gr][1]);
            fd_split(x[1][0], x[1][1], pa[gr][2], pa[gr][3]);
        }
        /* B fragments: V codes of keys jt + 2t, +1 (b0) and jt + 8 + 2t, +1
         * (b1) for output dim 8i + g; one 16-byte load per row covers 4
         * n-tiles (4 bits) or 2 (8 bits) */
        const uint4 *vr[4];
#pragma unroll
        for (int r = 0; r < 4; r++) vr[r] = reinterpret_cast<const uint4 *>(a.v + crow[r >> 1][r & 1] * WPR);
#pragma unroll
        for (int c4 = 0; c4 < WPR / 4; c4++) {
            uint32_t w[4][4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const uint4 u = vr[r][c4];
                w[r][0] = u.x, w[r][1] = u.y, w[r][2] = u.z, w[r][3] = u.w;
            }
            if (BITS == 4) {
#pragma unroll
                for (int qq = 0; qq < 4; qq++) {
                    const int i = 4 * c4 + qq, gr = 8 * i / GS;
                    const uint32_t b0 = fd_nib2(__byte_perm(w[0][qq], w[1][qq], vsel) >> vsh);
                    const uint32_t b1 = fd_nib2(__byte_perm(w[2][qq], w[3][qq], vsel) >> vsh);
                    fd_mma(o[i], pa[gr][0], pa[gr][1], pa[gr][2], pa[gr][3], b0, b1);
                }
            } else {
#pragma unroll
                for (int q2 = 0; q2 < 2; q2++) {
                    const int i = 2 * c4 + q2, gr = 8 * i / GS;
                    const uint32_t x0 = g < 4 ? w[0][2 * q2] : w[0][2 * q2 + 1];
                    const uint32_t x1 = g < 4 ? w[1][2 * q2] : w[1][2 * q2 + 1];
                    const uint32_t x2 = g < 4 ? w[2][2 * q2] : w[2][2 * q2 + 1];
                    const uint32_t x3 = g < 4 ? w[3][2 * q2] : w[3][2 * q2 + 1];
                    const uint32_t b0 = fd_byte2(__byte_perm(x0, x1, bsel));
                    const uint32_t b1 = fd_byte2(__byte_perm(x2, x3, bsel));
                    fd_mma(o[i], pa[gr][0], pa[gr][1], pa[gr][2], pa[gr][3], b0, b1);
                }
            }
        }
    }
    /* the warp's state per head: the sum and bias sums over the 4 lanes of a head */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
    for (int gr = 0; gr < NG; gr++) {
        bsum[gr] += __shfl_xor_sync(0xffffffffu, bsum[gr], 1);
        bsum[gr] += __shfl_xor_sync(0xffffffffu, bsum[gr], 2);
    }
    if (g < G) {
        if (t == 0) wm[warp][g] = m, wl[warp][g] = l;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const int e = 8 * i + 2 * t;
            wo[warp][g][e] = (o[i][0] + o[i][2]) + bsum[8 * i / GS];
            wo[warp][g][e + 1] = (o[i][1] + o[i][3]) + bsum[8 * i / GS];
        }
    }
    __syncthreads();
    /* the block's partial per head: warps merged in order */
    for (int idx = threadIdx.x; idx < G * D; idx += FD_THREADS) {
        const int gh = idx / D, e = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < FD_WARPS; w++) M = fmaxf(M, wm[w][gh]);
        float L = 0.f, O = 0.f;
#pragma unroll
        for (int w = 0; w < FD_WARPS; w++)
            if (wm[w][gh] != -INFINITY) {
                const float f = expf(wm[w][gh] - M);
                L += wl[w][gh] * f;
                O += wo[w][gh][e] * f;
            }
        const int64_t h = (int64_t)kh * G + gh;
        a.P[(h * a.nsplit + split) * D + e] = O;
        if (e == 0) a.ML[h * a.nsplit + split] = make_float2(M, L);
    }
}

/* The fused decode attention (kv_fused.cu): one query row (T == 1) over a
 * 4- or 8-bit cache. PT_ERR_UNSUPPORTED naming the configuration when no
 * kernel exists for it. */
pt_status pt_cuda_attention_fused(pt_cuda *c, float *out, const float *q, const int32_t *pos, const pt_kv_layer *kv,
                                  const pt_attn *p);

/* Launches the block kernel for one bits value, or with occ != NULL only
 * writes how many of its blocks fit on one SM (the split count is sized to
 * whole waves). PT_ERR_UNSUPPORTED (no message) when (group size, head_dim,
 * G) has no instantiation. */
pt_status pt_cuda_fused_block4(const pt_fd_args &a, dim3 grid, cudaStream_t st, int gs, int hd, int G, int *occ);
pt_status pt_cuda_fused_block8(const pt_fd_args &a, dim3 grid, cudaStream_t st, int gs, int hd, int G, int *occ);

template <typename K>
static pt_status pt_fd_launch(K kern, const pt_fd_args &a, dim3 grid, cudaStream_t st, int *occ) {
    if (occ) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, kern, FD_THREADS, 0));
        return PT_OK;
    }
    kern<<<grid, FD_THREADS, 0, st>>>(a);
    return PT_OK;
}

/* Instantiations: every head_dim a quantized cache takes (a multiple of the
 * group size, <= 256) and GQA ratios 1..8. */
#define PT_FD_G(B, GS, D)                                                      \
    switch (G) {                                                               \
    case 1: return pt_fd_launch(fd_block_kernel<B, GS, D, 1>, a, grid, st, occ); \
    case 2: return pt_fd_launch(fd_block_kernel<B, GS, D, 2>, a, grid, st, occ); \
    case 3: return pt_fd_launch(fd_block_kernel<B, GS, D, 3>, a, grid, st, occ); \
    case 4: return pt_fd_launch(fd_block_kernel<B, GS, D, 4>, a, grid, st, occ); \
    case 5: return pt_fd_launch(fd_block_kernel<B, GS, D, 5>, a, grid, st, occ); \
    case 6: return pt_fd_launch(fd_block_kernel<B, GS, D, 6>, a, grid, st, occ); \
    case 7: return pt_fd_launch(fd_block_kernel<B, GS, D, 7>, a, grid, st, occ); \
    case 8: return pt_fd_launch(fd_block_kernel<B, GS, D, 8>, a, grid, st, occ); \
    default: return PT_ERR_UNSUPPORTED;                                        \
    }

#define PT_FD_DISPATCH(B)                                             \
    switch (hd * 1000 + gs) {                                         \
    case 32032: { PT_FD_G(B, 32, 32) }                                \
    case 64032: { PT_FD_G(B, 32, 64) }                                \
    case 64064: { PT_FD_G(B, 64, 64) }                                \
    case 96032: { PT_FD_G(B, 32, 96) }                                \
    case 128032: { PT_FD_G(B, 32, 128) }                              \
    case 128064: { PT_FD_G(B, 64, 128) }                              \
    case 128128: { PT_FD_G(B, 128, 128) }                             \
    case 256032: { PT_FD_G(B, 32, 256) }                              \
    case 256064: { PT_FD_G(B, 64, 256) }                              \
    case 256128: { PT_FD_G(B, 128, 256) }                             \
    default: return PT_ERR_UNSUPPORTED;                               \
    }

#endif
