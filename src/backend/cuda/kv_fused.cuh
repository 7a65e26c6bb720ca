/* The block kernel of --fused-decode-attn on CUDA (kv_fused.cu has the
 * entry point, the split count and the merge; kv_fused4.cu / kv_fused8.cu
 * instantiate this template for every configuration a model spec can
 * produce). Flash-decoding over a QUANTIZED KV cache, one query row: a block
 * takes one (KV head, split) pair, i.e. a range of keys for the G query
 * heads that share the KV head; each of its 4 warps walks tiles of 16 or 32
 * keys (fd_smem's TK) of the range with an online softmax, a step per tile,
 * the warps are merged in a fixed order
 * and the block leaves its (max, sum of exp) and unnormalized output per
 * head for the merge kernel. No atomics: the result does not depend on
 * scheduling.
 *
 * Memory: each warp streams its tiles through a ring of FD_NS tiles in
 * shared memory filled by cp.async (codes as 16-byte copies into rows
 * padded or swizzled so the fragment reads hit distinct banks, scale/bias
 * rows as the 32-bit words covering them), so the next tile's loads are in flight while
 * a tile computes; a tile's scales and biases are converted to f32 once per
 * tile (each is read by 8 lanes). Nothing in the key loop divides: a key's cache row is its ring
 * offset plus the key index, wrapped by one compare.
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
/* Tiles per warp in the cp.async ring: one in flight while one is computed (3 and 4 measured no
 * faster, bench/RESULTS.md). A compile-time depth: the ring's addresses, its slot counter and the
 * wait for a tile are then constants in the key loop. */
#ifndef FD_NS /* -DFD_NS=N builds another depth for measurement */
#define FD_NS 2
#endif
/* Blocks per SM the compiler keeps registers for (head_dim <= 128). 4 (a 128-register cap)
 * measured 4-7% slower than 3 on the llama-3.1-8b shape: the cap costs more than the extra warps
 * gain (bench/RESULTS.md). */
#define FD_MINB 3
/* The same for the transposed kernel (G <= 4: fdt_block_kernel), which holds half the output
 * accumulators and query fragments. */
#define FD_MINB_T 4

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
/* The bytes at bits 0..7 and 16..23 of x as an f16 pair. */
__device__ __forceinline__ uint32_t fd_byte2(uint32_t x) { return fd_unbias((x & 0x00ff00ffu) | 0x64006400u); }

/* The dim that slot s (0..3 <-> MMA k = 2t, 2t+1, 2t+8, 2t+9) of thread t
 * stands for in k-step ks of a K row. Thread t reads word 4w + t of the row
 * (w = ks/2 for 4 bits, ks for 8 bits), so a k-step stays inside one
 * 32-dim chunk (4 bits) or one 16-dim chunk (8 bits), inside one group.
 * 4 bits: word 4c + t holds dims 32c + 8t + 0..7 as nibbles 0..7; k-step 2c
 * takes nibbles (0, 4 | 1, 5) and 2c + 1 takes (2, 6 | 3, 7), the pairs
 * the kernels take with fd_deq_c from the word shifted by 0 (k-step 2c) or
 * 8 (2c + 1): mask 0x000f000f for nibbles (0, 4), 0x00f000f0 scaled by 1/16
 * for (1, 5).
 * 8 bits: word 4ks + t holds dims 16ks + 4t + 0..3. */
template <int BITS>
__device__ __forceinline__ int fd_kdim(int ks, int t, int s) {
    if (BITS == 4) return 32 * (ks >> 1) + 8 * t + 2 * (ks & 1) + (s >> 1) + 4 * (s & 1);
    return 16 * ks + 4 * t + s;
}

/* cp.async helpers: 16- and 4-byte copies global -> shared, completed per
 * commit group (the ring of each warp below). */
__device__ __forceinline__ void fd_cp16(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void fd_cp4(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
/* The same copies to a shared-memory address already computed. */
__device__ __forceinline__ void fd_cp16s(uint32_t d, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void fd_cp4s(uint32_t d, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void fd_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most n groups are pending (n is a run-time value: the ring
 * depth is chosen at launch, wait_group takes an immediate). */
__device__ __forceinline__ void fd_wait(int n) {
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
    }
}
/* (x & mask) | 1024.0 in both f16 halves, then x·mul + add per half: the
 * nibble or byte under mask as an exact small f16 integer. Low nibbles
 * (mask 0x000f000f): 1024 + c, mul 1, add −1024. High nibbles (0x00f000f0):
 * 1024 + 16c, mul 1/16, add −64 — exact, so no shift is needed for them. */
__device__ __forceinline__ uint32_t fd_deq(uint32_t x, uint32_t mask, uint32_t mul, uint32_t add) {
    const uint32_t r = (x & mask) | 0x64006400u;
    __half2 h = __hfma2(*reinterpret_cast<const __half2 *>(&r), *reinterpret_cast<const __half2 *>(&mul),
                        *reinterpret_cast<const __half2 *>(&add));
    return *reinterpret_cast<const uint32_t *>(&h);
}
/* fd_deq with an immediate mask in ONE LOP3: (x & MASK) | c with c = 0x64006400 held in a
 * register (LOP3 takes one immediate; with both as immediates the compiler emits two). */
template <uint32_t MASK>
__device__ __forceinline__ uint32_t fd_deq_c(uint32_t x, uint32_t c, uint32_t mul, uint32_t add) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(x), "n"(MASK), "r"(c));
    __half2 h = __hfma2(*reinterpret_cast<const __half2 *>(&r), *reinterpret_cast<const __half2 *>(&mul),
                        *reinterpret_cast<const __half2 *>(&add));
    return *reinterpret_cast<const uint32_t *>(&h);
}
#define FD_H2_1 0x3c003c00u     /* f16 pair (1, 1) */
#define FD_H2_16TH 0x2c002c00u  /* (1/16, 1/16) */
#define FD_H2_M1024 0xe400e400u /* (−1024, −1024) */
#define FD_H2_M64 0xd400d400u   /* (−64, −64) */

/* exp(x − mn) of the online softmax, 0 for x = −inf (a masked key, or no key yet) without a
 * branch: −inf − mn is −inf, and with mn = −inf too the NaN is taken to −inf by fmaxf. */
__device__ __forceinline__ float fd_exp_below(float x, float mn) { return expf(fmaxf(x - mn, -INFINITY)); }

/* Shared memory of the block kernels, in 32-bit words: per warp a ring of
 * FD_NS tiles of TK keys (16, or 32 for the transposed kernel), then the
 * current tile's (scale, bias) rows in f32. A tile stage holds
 *   K codes [TK keys][CST]
 *   V codes [TK keys][CST]
 *   raw scale/bias words [4 arrays: ks kb vs vb][TK keys][SWR]  (a row's
 *                            NG values of 2 or 4 bytes, copied as the
 *                            aligned 32-bit words that cover them)
 * and the f32 rows are [K, V][TK keys][NG] float2 (scale, bias). The
 * fragment reads take 8 rows at one word offset (K) or 4 rows' 16-byte
 * chunks (V), so the rows must not map to the same banks: 16-key tiles pad
 * each row by 4 words (CST = WPR + 4); 32-key tiles (SWZ, with a
 * power-of-two count of 16-byte chunks a row) store rows unpadded with
 * chunk c of row r at chunk position c ^ sw(r), which spreads any 8
 * consecutive rows (and 4 rows of one parity) over distinct banks. After
 * the key loop a warp's region holds its partial output wo [G][D] instead. */
template <int BITS, int D, int NG, int TK_ = 16> struct fd_smem {
    static constexpr int TK = TK_, WPR = D * BITS / 32, CPR = WPR / 4;
    static constexpr bool SWZ = TK == 32 && (CPR & (CPR - 1)) == 0;
    static constexpr int CST = SWZ ? WPR : WPR + 4, SWR = NG + 1;
    /* rows a 32-bank line holds, and the chunk-position mask of the swizzle */
    static constexpr int RPL = CPR >= 8 ? 1 : 8 / CPR, SWM = SWZ ? (CPR < 8 ? CPR : 8) - 1 : 0;
    static_assert(SWM == 0 || (8 / RPL) % (SWM + 1) == 0, "rows 8 apart share a swizzle");
    static constexpr int STAGE = 2 * TK * CST + 4 * TK * SWR;
    static constexpr int FROWS = 2 * TK * NG * 2;
    __host__ __device__ static int warp_words(int stages) { return stages * STAGE + FROWS; }
    /* the chunk swizzle of code row r (K rows 0..TK-1, V rows TK..2TK-1: the same pattern) */
    __host__ __device__ static constexpr int sw(int r) { return (r / RPL) & SWM; }
    /* the stage word of word w of code row r whose swizzle is s (= sw(r)) */
    __host__ __device__ static constexpr int word(int r, int w, int s) {
        return r * CST + 4 * ((w >> 2) ^ s) + (w & 3);
    }
};

/* A lane's 16-byte chunk i of a tile's code rows (layout L: CPR chunks a row): chunk c = lane +
 * 32i is row c / CPR (TK: none, past the tile), column c % CPR; its stage offset in bytes. */
template <class L>
__device__ __forceinline__ void fd_chunk(int lane, int i, int &crow, uint32_t &cdst) {
    const int c = lane + 32 * i, r = c / L::CPR;
    crow = c < L::TK * L::CPR ? r : L::TK;
    cdst = (uint32_t)L::word(r, 4 * (c % L::CPR), L::sw(r)) * 4u;
}

/* A tile's code copies (fd_tile_io::issue) with fewer than TK keys or rows past the ring's end
 * (rows r >= rem read one capacity back): out of line, with the lane's chunk rows and stage
 * offsets formed again (fd_chunk, as init() forms them), so the common tile's loop keeps its
 * registers. */
template <class L, int CH>
__device__ __noinline__ void fd_issue_edge(const uint32_t *pk, const uint32_t *pv, uint32_t sa, int valid,
                                           int64_t rem, int64_t capw, int lane) {
#pragma unroll
    for (int i = 0; i < CH; i++) {
        int crow;
        uint32_t cdst;
        fd_chunk<L>(lane, i, crow, cdst);
        if (crow < valid) {
            const int64_t o = 128 * i - (crow >= rem ? capw : 0);
            fd_cp16s(sa + cdst, pk + o);
            fd_cp16s(sa + cdst + L::TK * L::CST * 4, pv + o);
        }
    }
}

/* The byte permute and nibble extraction (fd_deq) that give lane row / column g of a V code pair:
 * byte g/2 of two keys' words, its low (g even) or high nibble. */
struct fd_vsel {
    uint32_t sel, mask, mul, add;
};
__device__ __forceinline__ fd_vsel fd_vsel_of(int g) {
    fd_vsel v;
    v.sel = (uint32_t)(g >> 1) | ((uint32_t)(4 + (g >> 1)) << 8);
    v.mask = g & 1 ? 0x00f000f0u : 0x000f000fu, v.mul = g & 1 ? FD_H2_16TH : FD_H2_1;
    v.add = g & 1 ? FD_H2_M64 : FD_H2_M1024;
    return v;
}

/* The V code words w..w+3 (w a multiple of 4) of keys 2t, 2t + 1, 2t + 8, 2t + 9 of the
 * 16-key sub-tile whose first V row is r0 (TK, or TK + 16) in a landed stage st, as
 * w[key][word]; s[e] is the swizzle of the rows of parity e (L::sw(2t + e)). */
template <class L>
__device__ __forceinline__ void fd_vwords(const uint32_t *st, int r0, int t, int word, const int (&s)[2],
                                          uint32_t (&w)[4][4]) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int row = r0 + 8 * (r >> 1) + 2 * t + (r & 1);
        const uint4 u = *reinterpret_cast<const uint4 *>(st + L::word(row, word, s[r & 1]));
        w[r][0] = u.x, w[r][1] = u.y, w[r][2] = u.z, w[r][3] = u.w;
    }
}

/* The pre-scaled queries of KV head kh's G heads (rounded like the exact path) into qs (the
 * block's barrier after them) and the group sums of head `head` (0 for head >= G) into qg. Each
 * sum runs over its group's elements lane by lane, then an xor butterfly (every lane holds the
 * same bits). With G·NG <= 8 sums every warp forms them all itself and a lane keeps its head's
 * (no second barrier); with more, a warp per (head, group) through qsum and a second barrier. */
template <int G, int D, int GS>
__device__ __forceinline__ void fd_queries(const pt_fd_args &a, int kh, float (&qs)[G][D], float (&qsum)[G][D / GS],
                                           int warp, int lane, int head, float (&qg)[D / GS]) {
    constexpr int NG = D / GS;
    for (int i = threadIdx.x; i < G * D; i += FD_THREADS)
        qs[i / D][i % D] = pt_rnd(a.bf, a.q[(int64_t)kh * G * D + i] * a.scale);
    __syncthreads();
#pragma unroll
    for (int gr = 0; gr < NG; gr++) qg[gr] = 0.f;
    auto group_sum = [&](int i) { /* sum i = (head i / NG, group i % NG), on every lane */
        float s = 0.f;
        for (int e = lane; e < GS; e += 32) s += qs[i / NG][(i % NG) * GS + e];
        return pt_warp_sum(s);
    };
    if (G * NG <= 8) {
#pragma unroll
        for (int i = 0; i < G * NG; i++) {
            const float s = group_sum(i);
            if (i / NG == head) qg[i % NG] = s;
        }
    } else {
        for (int i = warp; i < G * NG; i += FD_WARPS) {
            const float s = group_sum(i);
            if (lane == 0) qsum[i / NG][i % NG] = s;
        }
        __syncthreads();
#pragma unroll
        for (int gr = 0; gr < NG; gr++)
            if (head < G) qg[gr] = qsum[head][gr];
    }
}

/* Head gh's running max over the block's warps (−inf where no warp saw a key). */
template <int G>
__device__ __forceinline__ float fd_head_max(const float (&wm)[FD_WARPS][G], int gh) {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < FD_WARPS; w++) M = fmaxf(M, wm[w][gh]);
    return M;
}

/* The block's partial per head: the warps' (max, sum) and partial outputs (warp w's [G][D] at
 * dyn + w·words) merged in warp order, written for the merge kernel. Each warp first forms the
 * G·FD_WARPS (<= 32) rescale factors exp(m_w − M) of the block, one a lane, so four elements
 * cost a broadcast shuffle and four multiply-adds per warp instead of an exponential each (the
 * same values in the same order: the same bits). A lane takes 4 consecutive dims (16-byte
 * loads and store; words is a multiple of 4, dyn 16-byte aligned); the warps' trip counts are
 * uniform so every lane reaches the shuffles. */
template <int G, int D>
__device__ __forceinline__ void fd_block_out(float *P, float2 *ML, int nsplit, const float (&wm)[FD_WARPS][G],
                                             const float (&wl)[FD_WARPS][G], const uint32_t *dyn, int words, int kh,
                                             int split) {
    static_assert(G * FD_WARPS <= 32 && D % 4 == 0, "a lane per (head, warp); 4 dims a lane");
    constexpr int N4 = G * D / 4;
    const int lane = threadIdx.x & 31;
    float fl = 0.f; /* lane gh·FD_WARPS + w: warp w's factor for head gh */
    {
        const int gh = lane / FD_WARPS, w = lane % FD_WARPS;
        if (gh < G && wm[w][gh] != -INFINITY) fl = expf(wm[w][gh] - fd_head_max<G>(wm, gh));
    }
    for (int b = threadIdx.x - lane; b < N4; b += FD_THREADS) {
        const int i4 = b + lane;
        const bool on = i4 < N4;
        const int gh = on ? 4 * i4 / D : 0, e = 4 * i4 % D;
        float f[FD_WARPS];
#pragma unroll
        for (int w = 0; w < FD_WARPS; w++) f[w] = __shfl_sync(0xffffffffu, fl, gh * FD_WARPS + w);
        if (on) {
            float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int w = 0; w < FD_WARPS; w++)
                if (wm[w][gh] != -INFINITY) {
                    const float4 x = *reinterpret_cast<const float4 *>(dyn + w * words + gh * D + e);
                    O.x = fmaf(x.x, f[w], O.x), O.y = fmaf(x.y, f[w], O.y);
                    O.z = fmaf(x.z, f[w], O.z), O.w = fmaf(x.w, f[w], O.w);
                }
            const int64_t h = (int64_t)kh * G + gh;
            *reinterpret_cast<float4 *>(P + (h * nsplit + split) * D + e) = O;
            if (e == 0) { /* the head's (max, sum of exp), once */
                float Lsum = 0.f;
#pragma unroll
                for (int w = 0; w < FD_WARPS; w++)
                    if (wm[w][gh] != -INFINITY) Lsum = fmaf(wl[w][gh], f[w], Lsum);
                ML[h * nsplit + split] = make_float2(fd_head_max<G>(wm, gh), Lsum);
            }
        }
    }
    /* the merge, a dependent launch, may be scheduled once every block is here (released at the
     * end: merge blocks resident earlier would take the SMs' room from this kernel's one wave) */
    pt_release_dependents();
}

/* fd_block_out out of line: the transposed kernel's key loop is then compiled without the
 * merge's registers (its loop's SASS 756 instructions against 771 with the merge inline); the
 * first kernel, with up to 8 heads' accumulators, spills less with it inline. */
template <int G, int D>
__device__ __noinline__ void fd_block_out_call(float *P, float2 *ML, int nsplit, const float (&wm)[FD_WARPS][G],
                                               const float (&wl)[FD_WARPS][G], const uint32_t *dyn, int words,
                                               int kh, int split) {
    fd_block_out<G, D>(P, ML, nsplit, wm, wl, dyn, words, kh, split);
}

/* A warp's tile copies and the tile's scale/bias conversion, shared by both block kernels, for
 * tiles of TK keys (layout fd_smem<BITS, D, NG, TK>). Per lane, fixed for every tile: chunk c =
 * lane + 32i of a tile's code rows is row c / CPR, column c % CPR, i.e. words 4c.. of the tile's
 * contiguous rows in the cache and L::word(row, 4·col) in the stage. Scales: with 16-key tiles
 * lane & 15 is the key whose scale (lanes 0-15) or bias (16-31) words the lane copies and
 * converts; with 32-key tiles lane r copies and converts both of key r. */
template <int BITS, int D, int NG, int TK = 16> struct fd_tile_io {
    typedef fd_smem<BITS, D, NG, TK> L;
    static constexpr int WPR = L::WPR, CPR = L::CPR, CST = L::CST, SWR = L::SWR, STAGE = L::STAGE;
    static constexpr int CH = (TK * CPR + 31) / 32; /* 16-byte chunks a lane copies per tile, K and V each */
    static constexpr bool BOTH = TK == 32;           /* a lane copies a key's scale and bias words */
    static_assert(TK == 16 || TK == 32, "16- or 32-key tiles");
    int crow[CH];
    uint32_t cdst[CH];
    uint32_t ring_sa, sdst;
    int sr, ssb, rb, nt;
    /* key indices and cache rows in 32 bits (the launch refuses capacities of 2^30 slots or more) */
    int cap, irow, rlo, jw, j1;
    int jnew;             /* the newest key (n − 1): its row is the one this step's append writes */
    uint32_t rb_base;     /* the byte offset of this KV head's first scale row, mod 2^32 */
    const char *sk_row0, *sv_row0; /* this lane's scale (or bias) array at this KV head's row 0 */
    const char *bk_row0, *bv_row0; /* BOTH: the bias arrays likewise */
    const uint32_t *kh_k, *kh_v;   /* this KV head's rows, this lane's first chunk */

    /* The block's key range (positions lo + [0, n), this split's share [j0, j1), from the
     * query's position on the device), this warp's tiles (keys jw + TK·FD_WARPS·k, k < nt) and
     * the lane's fixed copy offsets. */
    __device__ __forceinline__ void init(const pt_fd_args &a, uint32_t *ring, int warp, int lane) {
        cap = (int)a.cap;
        const int hi = a.pos[0];
        int lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
        int n = hi - lo + 1;
        if (n > cap) n = cap, lo = hi - n + 1;
        if (n < 0) n = 0;
        jnew = n - 1;
        const int per = (int)(((unsigned)n + gridDim.y - 1) / gridDim.y), j0 = (int)blockIdx.y * per;
        j1 = j0 + per < n ? j0 + per : n;
        const int64_t rbase = (int64_t)blockIdx.x * a.cap;
        rlo = (int)((unsigned)lo % (unsigned)cap);
        rb = NG * (a.dt == PT_FT_F32 ? 4 : 2); /* bytes of a row of scales */
        jw = j0 + TK * warp;
        nt = jw < j1 ? (j1 - jw + TK * FD_WARPS - 1) / (TK * FD_WARPS) : 0;
#pragma unroll
        for (int i = 0; i < CH; i++) fd_chunk<L>(lane, i, crow[i], cdst[i]); /* crow TK: never copied */
        ring_sa = (uint32_t)__cvta_generic_to_shared(ring);
        sr = BOTH ? lane : lane & 15, ssb = BOTH ? 0 : lane >> 4;
        rb_base = (uint32_t)(rbase * rb);
        sk_row0 = reinterpret_cast<const char *>(ssb ? a.kb : a.ks) + rbase * rb;
        sv_row0 = reinterpret_cast<const char *>(ssb ? a.vb : a.vs) + rbase * rb;
        bk_row0 = reinterpret_cast<const char *>(a.kb) + rbase * rb;
        bv_row0 = reinterpret_cast<const char *>(a.vb) + rbase * rb;
        sdst = (uint32_t)(2 * TK * CST + (ssb * TK + sr) * SWR) * 4u;
        kh_k = a.k + rbase * WPR + 4 * lane, kh_v = a.v + rbase * WPR + 4 * lane;
        /* the cache row (within the head) of the next tile issue() copies: tiles are issued in
         * order k = 0, 1, 2, ..., each TK·FD_WARPS keys after the last, so the row is kept as a
         * counter wrapped by compares (no division per tile) */
        irow = rlo + jw;
        while (irow >= cap) irow -= cap;
    }

    /* cp.async of tile k into ring slot `slot` (= k mod NS, kept as a counter by the caller:
     * no division per tile); nothing past the warp's tiles, but a group is committed either way
     * so the wait counts stay uniform. Rows past j1 are not copied: their codes are never used
     * unmasked and their f32 scales are written as 0 by scales(). Rows past the ring's end (a
     * tile that wraps, rem < TK) are read one capacity back. */
    __device__ __forceinline__ void issue(int k, int slot) {
        if (k < nt) {
            const int jt = jw + TK * FD_WARPS * k;
            const int valid = j1 - jt < TK ? j1 - jt : TK;
            const int r0 = irow, rem = cap - r0; /* rows r >= rem wrap to the ring's start */
            irow += TK * FD_WARPS;
            while (irow >= cap) irow -= cap;
            const uint32_t *pk = kh_k + (size_t)(unsigned)r0 * WPR, *pv = kh_v + (size_t)(unsigned)r0 * WPR;
            const uint32_t sa = ring_sa + (uint32_t)(slot * STAGE) * 4u;
            const bool full = valid == TK && rem >= TK;
            if (full) {
                /* the common tile: TK keys, none past the ring's end: each chunk a constant offset
                 * from the tile's row (no compare or select per chunk; the same copies) */
#pragma unroll
                for (int i = 0; i < CH; i++)
                    if (crow[i] < TK) {
                        fd_cp16s(sa + cdst[i], pk + 128 * i);
                        fd_cp16s(sa + cdst[i] + TK * CST * 4, pv + 128 * i);
                    }
            } else {
                fd_issue_edge<L, CH>(pk, pv, sa, valid, rem, (int64_t)cap * WPR, threadIdx.x & 31);
            }
            if (sr < valid) {
                /* the words covering the row's bytes (at most NG: rb <= 4·NG, and a 2-byte
                 * row starts 2-byte aligned); with 2-byte values and an odd group count
                 * the last word of the array's last row reaches 2 bytes past it, inside the
                 * allocation's granule (cudaMalloc allocations are 256-byte granular) */
                int row = r0 + sr;
                if (!full && row >= cap) row -= cap; /* a full tile has no row past the ring's end */
                const uint32_t off = (uint32_t)row * (uint32_t)rb;
                const int lo = (int)((rb_base + off) & 3u), cnt = ((lo + rb - 1) >> 2) + 1;
                const size_t so = (size_t)off - lo;
                const uint32_t dk = sa + sdst, dv = dk + 2 * TK * SWR * 4, db = TK * SWR * 4;
#pragma unroll
                for (int w = 0; w < NG; w++)
                    if (w < cnt) {
                        fd_cp4s(dk + 4 * w, sk_row0 + so + 4 * w), fd_cp4s(dv + 4 * w, sv_row0 + so + 4 * w);
                        if (BOTH)
                            fd_cp4s(dk + db + 4 * w, bk_row0 + so + 4 * w),
                                fd_cp4s(dv + db + 4 * w, bv_row0 + so + 4 * w);
                    }
            }
        }
        fd_commit();
    }

    /* The ring's first NS − 1 tiles, the kernel being a dependent launch (pt_fd_launch): the
     * tiles whose keys all precede the newest are in the cache before this step (no kernel of
     * the step writes their rows), so they are issued before griddepcontrol.wait and travel
     * under the kernel before; the rest, and everything else the kernel reads, after it. The
     * position is read before the wait as dec2_short_kernel reads it (no kernel of the step
     * writes it). A plain launch passes the wait at once. */
    __device__ __forceinline__ void start(int NS) {
        int k = 0;
        for (; k < NS - 1 && k < nt && jw + TK * FD_WARPS * k + TK <= jnew; k++) issue(k, k);
        pt_wait_primary();
        for (; k < NS - 1; k++) issue(k, k);
    }

    /* The landed tile's scales and biases (stage st, keys jt..) to f32 rows kf, vf [TK][NG]
     * (scale, bias); 0 past the valid keys. */
    __device__ __forceinline__ void scales(const pt_fd_args &a, const uint32_t *st, float2 *kf, float2 *vf, int valid,
                                           int jt) const {
        const int r = sr, sb = ssb;
        int off = 0;
        if (r < valid && (rb & 3)) {
            int rr = rlo + jt + r; /* < 2·cap */
            if (rr >= cap) rr -= cap;
            off = (int)((rb_base + (uint32_t)rr * (uint32_t)rb) & 3u);
        }
        const char *pk = reinterpret_cast<const char *>(st + 2 * TK * CST + (sb * TK + r) * SWR) + off;
        const char *pv = pk + 2 * TK * SWR * 4;
        auto val = [&](const char *p, int gr) {
            if (a.dt == PT_FT_F32) return reinterpret_cast<const float *>(p)[gr];
            if (a.dt == PT_FT_BF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(p)[gr]);
            return __half2float(reinterpret_cast<const __half *>(p)[gr]);
        };
        if (BOTH) {
            const char *qk = pk + TK * SWR * 4, *qv = pv + TK * SWR * 4; /* the bias rows */
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                float2 xk = make_float2(0.f, 0.f), xv = xk;
                if (r < valid) xk = make_float2(val(pk, gr), val(qk, gr)), xv = make_float2(val(pv, gr), val(qv, gr));
                kf[r * NG + gr] = xk, vf[r * NG + gr] = xv;
            }
            return;
        }
        float *fk = reinterpret_cast<float *>(kf) + r * NG * 2 + sb;
        float *fv = reinterpret_cast<float *>(vf) + r * NG * 2 + sb;
#pragma unroll
        for (int gr = 0; gr < NG; gr++) {
            float xk = 0.f, xv = 0.f;
            if (r < valid) xk = val(pk, gr), xv = val(pv, gr);
            fk[2 * gr] = xk, fv[2 * gr] = xv;
        }
    }
};

template <int BITS, int GS, int D, int G, int TK = 16>
__global__ void __launch_bounds__(FD_THREADS, D <= 128 ? FD_MINB : 1) fd_block_kernel(pt_fd_args a) {
    static_assert(BITS == 4 || BITS == 8, "4- or 8-bit codes");
    static_assert(D % 32 == 0 && D % GS == 0 && GS % 32 == 0 && G >= 1 && G <= FD_MAX_G, "shape");
    constexpr int NG = D / GS, KS = D / 16, NT = D / 8, WPR = D * BITS / 32;
    constexpr int NKW = BITS == 4 ? D / 32 : D / 16; /* K words a thread reads per row */
    constexpr int KSG = GS / 16;                     /* k-steps per group */
    constexpr int H2 = TK / 8;                       /* the tile's 8-key halves of 16-key sub-tiles */
    typedef fd_smem<BITS, D, NG, TK> L;
    constexpr int STAGE = L::STAGE;
    static_assert(BITS == 4 || WPR % 8 == 0, "8-bit rows come in blocks of 8 words");
    __shared__ float qs[G][D];
    __shared__ float qsum[G][NG];
    __shared__ float wm[FD_WARPS][G], wl[FD_WARPS][G];
    extern __shared__ __align__(16) uint32_t fd_dyn[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int kh = blockIdx.x, split = blockIdx.y;
    constexpr int NS = FD_NS;
    uint32_t *ring = fd_dyn + warp * L::warp_words(NS);
    float2 *kf = reinterpret_cast<float2 *>(ring + NS * STAGE); /* [TK][NG] K (scale, bias), current tile */
    float2 *vf = kf + TK * NG;                                  /* [TK][NG] V */

    fd_tile_io<BITS, D, NG, TK> io;
    io.init(a, ring, warp, lane);
    const int nt = io.nt;
    auto issue = [&](int k, int slot) { io.issue(k, slot); };
    io.start(NS); /* the ring fills while the queries are prepared */

    float qg[NG]; /* head g's group sums */
    fd_queries<G, D, GS>(a, kh, qs, qsum, warp, lane, g, qg);
    /* A fragments of the scores: row g = head g (hi), row g + 8 = its lo part (in registers;
     * reading them from shared memory per tile measured no faster, also at 4 blocks per SM) */
    uint32_t qh[KS][2], ql[KS][2];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float x0 = g < G ? qs[g][fd_kdim<BITS>(ks, t, 2 * r)] : 0.f;
            const float x1 = g < G ? qs[g][fd_kdim<BITS>(ks, t, 2 * r + 1)] : 0.f;
            fd_split(x0, x1, qh[ks][r], ql[ks][r]);
        }

    float m = -INFINITY, l = 0.f; /* head g: running max, this thread's share of the sum */
    float o[NT][4];               /* head g, n-tile i, columns 2t, 2t + 1: [0..1] hi, [2..3] lo parts */
    float bsum[NG];               /* head g: Σ p·bias per group (this thread's keys) */
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
#pragma unroll
    for (int gr = 0; gr < NG; gr++) bsum[gr] = 0.f;
    /* V, 4 bits: n-tile i = dims 8i..8i+7, column g = nibble g of word i: byte g/2 of each key's word
     * moved by one byte permute (two keys per register), the nibble taken by fd_deq */
    const fd_vsel vs4 = fd_vsel_of(g);
    const uint32_t vsel = vs4.sel, vmask = vs4.mask, vmul = vs4.mul, vadd = vs4.add;
    /* V, 8 bits: n-tile 4c + u, column g = byte g & 3 of word 8c + 4(g >> 2) + u (a thread reads 4
     * consecutive words of a key with one 16-byte load) */
    const uint32_t bsel = (uint32_t)(g & 3) | ((uint32_t)(4 + (g & 3)) << 8);
    const uint32_t c64 = 0x64006400u; /* fd_deq_c's OR constant, in a register */
    /* the swizzles of the code rows this lane reads: K rows g + 8h (one for all), V rows 2t + e */
    const int swk = L::sw(g), swv[2] = {L::sw(2 * t), L::sw(2 * t + 1)};

    for (int k = 0, slot = 0; k < nt; k++, slot = slot == NS - 1 ? 0 : slot + 1) {
        issue(k + NS - 1, slot == 0 ? NS - 1 : slot - 1); /* (k + NS − 1) mod NS */
        fd_wait(NS - 1); /* tile k has landed (this thread's copies) */
        __syncwarp();    /* ... and every lane's */
        const int jt = io.jw + TK * FD_WARPS * k;
        const int valid = io.j1 - jt < TK ? io.j1 - jt : TK;
        const uint32_t *st = ring + slot * STAGE;
        /* the tile's scales and biases to f32 once (each is read by 8 lanes below); 0 past j1 */
        io.scales(a, st, kf, vf, valid, jt);
        __syncwarp();
        float s[H2][2];
#pragma unroll
        for (int h = 0; h < H2; h++) {
            /* B fragments: key 8h + g of the tile, this thread's words */
            uint32_t kw[NKW];
#pragma unroll
            for (int w = 0; w < NKW; w++) kw[w] = st[L::word(8 * h + g, 4 * w + t, swk)];
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
                        b0 = fd_deq_c<0x000f000fu>(w, c64, FD_H2_1, FD_H2_M1024); /* nibbles 0, 4 */
                        b1 = fd_deq_c<0x00f000f0u>(w, c64, FD_H2_16TH, FD_H2_M64); /* nibbles 1, 5 */
                    } else {
                        b0 = fd_unbias(__byte_perm(kw[ks], 0x64646464u, 0x4140));
                        b1 = fd_unbias(__byte_perm(kw[ks], 0x64646464u, 0x4342));
                    }
                    fd_mma(c, qh[ks][0], ql[ks][0], qh[ks][1], ql[ks][1], b0, b1);
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const float2 sb = kf[(8 * h + 2 * t + i) * NG + gr];
                    acc[i] = fmaf(sb.y, qg[gr], fmaf(sb.x, c[i] + c[2 + i], acc[i]));
                }
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float v = pt_rnd(a.bf, acc[i]);
                if (a.softcap > 0.f) v = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, v / a.softcap))) * a.softcap);
                s[h][i] = 8 * h + 2 * t + i < valid ? v : -INFINITY;
            }
        }
        /* online softmax for head g over the tile's 16 keys (lanes 4g..4g+3); with no key yet
         * (mn = −inf) nothing changes: p = 0, and o, l are still 0 */
        float mt = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
#pragma unroll
        for (int h = 2; h < H2; h++) mt = fmaxf(mt, fmaxf(s[h][0], s[h][1]));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(m, mt);
        const float f = fd_exp_below(m, mn);
        float p[H2][2];
#pragma unroll
        for (int h = 0; h < H2; h++)
#pragma unroll
            for (int i = 0; i < 2; i++) p[h][i] = fd_exp_below(s[h][i], mn);
        float psum = (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
#pragma unroll
        for (int h = 2; h < H2; h += 2) psum += (p[h][0] + p[h][1]) + (p[h + 1][0] + p[h + 1][1]);
        l = l * f + psum;
        m = mn;
        if (f != 1.f) {
#pragma unroll
            for (int i = 0; i < NT; i++) o[i][0] *= f, o[i][1] *= f, o[i][2] *= f, o[i][3] *= f;
#pragma unroll
            for (int gr = 0; gr < NG; gr++) bsum[gr] *= f;
        }
#pragma unroll
        for (int u = 0; u < TK / 16; u++) {
            /* A fragments of p·V per group (sub-tile u, keys 16u..): row g = p·scale (hi), row g + 8 = lo */
            uint32_t pa[NG][4];
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                float x[2][2];
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const float2 sb = vf[(16 * u + 8 * h + 2 * t + i) * NG + gr];
                        x[h][i] = p[2 * u + h][i] * sb.x;
                        bsum[gr] = fmaf(p[2 * u + h][i], sb.y, bsum[gr]);
                    }
                fd_split(x[0][0], x[0][1], pa[gr][0], pa[gr][1]);
                fd_split(x[1][0], x[1][1], pa[gr][2], pa[gr][3]);
            }
            /* B fragments: V codes of keys 2t, 2t + 1 (b0) and 8 + 2t, 9 + 2t (b1) of the tile */
            if (BITS == 4) {
#pragma unroll
                for (int c4 = 0; c4 < WPR / 4; c4++) {
                    uint32_t w[4][4];
                    fd_vwords<L>(st, TK + 16 * u, t, 4 * c4, swv, w);
#pragma unroll
                    for (int qq = 0; qq < 4; qq++) {
                        const int i = 4 * c4 + qq, gr = 8 * i / GS;
                        const uint32_t b0 = fd_deq(__byte_perm(w[0][qq], w[1][qq], vsel), vmask, vmul, vadd);
                        const uint32_t b1 = fd_deq(__byte_perm(w[2][qq], w[3][qq], vsel), vmask, vmul, vadd);
                        fd_mma(o[i], pa[gr][0], pa[gr][1], pa[gr][2], pa[gr][3], b0, b1);
                    }
                }
            } else {
#pragma unroll
                for (int c8 = 0; c8 < WPR / 8; c8++) {
                    uint32_t w[4][4];
                    fd_vwords<L>(st, TK + 16 * u, t, 8 * c8 + 4 * (g >> 2), swv, w);
#pragma unroll
                    for (int u2 = 0; u2 < 4; u2++) {
                        const int i = 4 * c8 + u2, gr = 32 * c8 / GS;
                        const uint32_t b0 = fd_byte2(__byte_perm(w[0][u2], w[1][u2], bsel));
                        const uint32_t b1 = fd_byte2(__byte_perm(w[2][u2], w[3][u2], bsel));
                        fd_mma(o[i], pa[gr][0], pa[gr][1], pa[gr][2], pa[gr][3], b0, b1);
                    }
                }
            }
        }
        __syncwarp(); /* every lane is done with stage k % NS before the next issue refills it */
    }
    fd_wait(0);
    /* the warp's state per head: the sum and bias sums over the 4 lanes of a head */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
    for (int gr = 0; gr < NG; gr++) {
        bsum[gr] += __shfl_xor_sync(0xffffffffu, bsum[gr], 1);
        bsum[gr] += __shfl_xor_sync(0xffffffffu, bsum[gr], 2);
    }
    __syncwarp();
    /* the warp's partial output [G][D] in its own (now idle) ring region */
    float *wo = reinterpret_cast<float *>(ring);
    if (g < G) {
        if (t == 0) wm[warp][g] = m, wl[warp][g] = l;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            /* the dim of column 2t of n-tile i (column 2t + 1 is the next one) */
            const int e = BITS == 4 ? 8 * i + 2 * t : 32 * (i >> 2) + 16 * (t >> 1) + 4 * (i & 3) + 2 * (t & 1);
            const int gr = BITS == 4 ? 8 * i / GS : 32 * (i >> 2) / GS;
            wo[g * D + e] = (o[i][0] + o[i][2]) + bsum[gr];
            wo[g * D + e + 1] = (o[i][1] + o[i][3]) + bsum[gr];
        }
    }
    __syncthreads();
    /* the block's partial per head: warps merged in order */
    fd_block_out<G, D>(a.P, a.ML, a.nsplit, wm, wl, fd_dyn, L::warp_words(NS), kh, split);
}

/* The block kernel for G <= 4 query heads per KV head, with the operands of both products
 * transposed (PETREL_CUDA_FD_T=0: fd_block_kernel above for every G). The codes are the A
 * operand and the queries or probabilities the B operand, whose 8 columns are the G heads'
 * hi and lo parts (column 2h: head h's hi, 2h + 1: its lo), so an MMA covers 16 keys (scores)
 * or 16 dims (p·V) instead of 8 and the 8 columns are all used at G = 4:
 *   scores  S^T[j, 2h + x] = Σ_e code[j, e]·q_x[h, e]   (16 keys × 16 dims of one group a k-step)
 *   output  O^T[e, 2h + x] = Σ_j code[j, e]·(p·sc)_x[h, j]
 * Half the MMAs and half the accumulators of fd_block_kernel (which puts the heads in A's rows,
 * using 2G of its 16): 8 + 8 per 16-key tile at head_dim 128, 32 registers of output. Each code
 * is still converted once, by the same LOP3 / HFMA2 pairs. A thread's scores are keys g and
 * g + 8 of head t (its accumulator columns 2t, 2t + 1 added: hi + lo), so the tile's
 * probabilities reach the p·V operand's layout (keys 2t, 2t + 1, 2t + 8, 2t + 9 of column g)
 * through a 64-float array of the warp in shared memory. The same quantities as the kernel
 * above (scores with its rounding points, online softmax per 16-key tile, bias term on the
 * side), other summation orders within a tile. */
template <int BITS, int D, int NG, int TK = 16> struct fdt_smem {
    typedef fd_smem<BITS, D, NG, TK> L;
    static constexpr int PS = 4 * TK; /* the tile's probabilities [head][key] */
    __host__ __device__ static int warp_words(int stages) { return L::warp_words(stages) + PS; }
};

/* TK keys a tile: 16, or 32 (two 16-key sub-tiles under one online-softmax step, one wait and
 * one copy issue: the per-tile work — the ring's bookkeeping, the max's butterfly, the
 * rescale — is paid once per 32 keys, and the sub-tiles' products are independent chains;
 * PETREL_CUDA_FD_TK). */
template <int BITS, int GS, int D, int G, int TK = 16>
__global__ void __launch_bounds__(FD_THREADS, D <= 128 ? FD_MINB_T : 1) fdt_block_kernel(pt_fd_args a) {
    static_assert(BITS == 4 || BITS == 8, "4- or 8-bit codes");
    static_assert(D % 32 == 0 && D % GS == 0 && GS % 32 == 0 && G >= 1 && G <= 4, "shape");
    constexpr int NG = D / GS, KS = D / 16, WPR = D * BITS / 32;
    constexpr int KSG = GS / 16; /* k-steps per group */
    constexpr int U = TK / 16;   /* 16-key sub-tiles a tile */
    typedef fd_smem<BITS, D, NG, TK> L;
    typedef fdt_smem<BITS, D, NG, TK> LT;
    constexpr int STAGE = L::STAGE;
    static_assert(BITS == 4 || WPR % 8 == 0, "8-bit rows come in blocks of 8 words");
    __shared__ float qs[G][D];
    __shared__ float qsum[G][NG];
    __shared__ float wm[FD_WARPS][G], wl[FD_WARPS][G];
    extern __shared__ __align__(16) uint32_t fd_dyn[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int kh = blockIdx.x, split = blockIdx.y;
    constexpr int NS = FD_NS;
    uint32_t *ring = fd_dyn + warp * LT::warp_words(NS);
    float2 *kf = reinterpret_cast<float2 *>(ring + NS * STAGE); /* [TK][NG] K (scale, bias), current tile */
    float2 *vf = kf + TK * NG;                                  /* [TK][NG] V */
    float *ps = reinterpret_cast<float *>(ring + L::warp_words(NS)); /* [4][TK] */

    fd_tile_io<BITS, D, NG, TK> io;
    io.init(a, ring, warp, lane);
    const int nt = io.nt;
    auto issue = [&](int k, int slot) { io.issue(k, slot); };
    io.start(NS);

    float qg[NG]; /* head t's group sums (lanes with t >= G carry nothing) */
    fd_queries<G, D, GS>(a, kh, qs, qsum, warp, lane, t, qg);
    /* B fragments of the scores: column g = head g / 2, its hi (g even) or lo part */
    const int hq = g >> 1;
    uint32_t qb[KS][2];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float x0 = hq < G ? qs[hq][fd_kdim<BITS>(ks, t, 2 * r)] : 0.f;
            const float x1 = hq < G ? qs[hq][fd_kdim<BITS>(ks, t, 2 * r + 1)] : 0.f;
            uint32_t h2, l2;
            fd_split(x0, x1, h2, l2);
            qb[ks][r] = g & 1 ? l2 : h2;
        }

    float m = -INFINITY, l = 0.f; /* head t: running max, this thread's share of the sum */
    float o[KS][4];               /* m-tile i: dims (rows) g, g + 8; columns 2t, 2t + 1 = head t hi, lo */
    float bsum[NG];               /* head t: Σ p·bias per group (this thread's keys) */
#pragma unroll
    for (int i = 0; i < KS; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
#pragma unroll
    for (int gr = 0; gr < NG; gr++) bsum[gr] = 0.f;
    /* V, 4 bits: m-tile i = dims 16i..16i+15, row g = nibble g of word 2i, row g + 8 = nibble g of
     * word 2i + 1: byte g/2 of two keys' words moved by one byte permute, the nibble taken by fd_deq */
    const fd_vsel vs4 = fd_vsel_of(g);
    const uint32_t vsel = vs4.sel, vmask = vs4.mask, vmul = vs4.mul, vadd = vs4.add;
    /* V, 8 bits: m-tile 2c + u, row g = byte g & 3 of word 8c + 4(g >> 2) + u, row g + 8 the same
     * of word + 2 (a thread reads 4 consecutive words of a key with one 16-byte load) */
    const uint32_t bsel = (uint32_t)(g & 3) | ((uint32_t)(4 + (g & 3)) << 8);
    const uint32_t c64 = 0x64006400u;
    /* the swizzles of the code rows this lane reads: K rows g + 8i (one for all), V rows 2t + e */
    const int swk = L::sw(g), swv[2] = {L::sw(2 * t), L::sw(2 * t + 1)};

    for (int k = 0, slot = 0; k < nt; k++, slot = slot == NS - 1 ? 0 : slot + 1) {
        issue(k + NS - 1, slot == 0 ? NS - 1 : slot - 1);
        fd_wait(NS - 1);
        __syncwarp();
        const int jt = io.jw + TK * FD_WARPS * k;
        const int valid = io.j1 - jt < TK ? io.j1 - jt : TK;
        const uint32_t *st = ring + slot * STAGE;
        io.scales(a, st, kf, vf, valid, jt);
        __syncwarp();
        /* scores: rows = keys 16u + g, 16u + 8 + g of the tile (acc[u][0], acc[u][1]) */
        float acc[U][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            acc[u][0] = acc[u][1] = 0.f;
            const int r0 = 16 * u + g, r1 = r0 + 8;
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int kk = 0; kk < KSG; kk++) {
                    const int ks = gr * KSG + kk;
                    uint32_t a0, a1, a2, a3;
                    if (BITS == 4) {
                        const uint32_t w0 = st[L::word(r0, 4 * (ks >> 1) + t, swk)] >> (8 * (ks & 1));
                        const uint32_t w1 = st[L::word(r1, 4 * (ks >> 1) + t, swk)] >> (8 * (ks & 1));
                        a0 = fd_deq_c<0x000f000fu>(w0, c64, FD_H2_1, FD_H2_M1024);
                        a1 = fd_deq_c<0x000f000fu>(w1, c64, FD_H2_1, FD_H2_M1024);
                        a2 = fd_deq_c<0x00f000f0u>(w0, c64, FD_H2_16TH, FD_H2_M64);
                        a3 = fd_deq_c<0x00f000f0u>(w1, c64, FD_H2_16TH, FD_H2_M64);
                    } else {
                        const uint32_t w0 = st[L::word(r0, 4 * ks + t, swk)], w1 = st[L::word(r1, 4 * ks + t, swk)];
                        a0 = fd_unbias(__byte_perm(w0, 0x64646464u, 0x4140));
                        a1 = fd_unbias(__byte_perm(w1, 0x64646464u, 0x4140));
                        a2 = fd_unbias(__byte_perm(w0, 0x64646464u, 0x4342));
                        a3 = fd_unbias(__byte_perm(w1, 0x64646464u, 0x4342));
                    }
                    fd_mma(c, a0, a1, a2, a3, qb[ks][0], qb[ks][1]);
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const float2 sb = kf[(16 * u + 8 * i + g) * NG + gr];
                    acc[u][i] = fmaf(sb.y, qg[gr], fmaf(sb.x, c[2 * i] + c[2 * i + 1], acc[u][i]));
                }
            }
        }
        float s[U][2];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float v = pt_rnd(a.bf, acc[u][i]);
                if (a.softcap > 0.f) v = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, v / a.softcap))) * a.softcap);
                s[u][i] = 16 * u + 8 * i + g < valid ? v : -INFINITY;
            }
        /* online softmax for head t over the tile's TK keys (lanes t, t + 4, ..., t + 28) */
        float mt = fmaxf(s[0][0], s[0][1]);
#pragma unroll
        for (int u = 1; u < U; u++) mt = fmaxf(mt, fmaxf(s[u][0], s[u][1]));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 4));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 8));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 16));
        const float mn = fmaxf(m, mt);
        const float f = fd_exp_below(m, mn);
        float p[U][2];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < 2; i++) p[u][i] = fd_exp_below(s[u][i], mn);
        float psum = p[0][0] + p[0][1];
#pragma unroll
        for (int u = 1; u < U; u++) psum += p[u][0] + p[u][1];
        l = l * f + psum;
        m = mn;
        if (f != 1.f) {
#pragma unroll
            for (int i = 0; i < KS; i++) o[i][0] *= f, o[i][1] *= f, o[i][2] *= f, o[i][3] *= f;
#pragma unroll
            for (int gr = 0; gr < NG; gr++) bsum[gr] *= f;
        }
#pragma unroll
        for (int gr = 0; gr < NG; gr++)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int i = 0; i < 2; i++)
                    bsum[gr] = fmaf(p[u][i], vf[(16 * u + 8 * i + g) * NG + gr].y, bsum[gr]);
        if (t < G)
#pragma unroll
            for (int u = 0; u < U; u++) ps[t * TK + 16 * u + g] = p[u][0], ps[t * TK + 16 * u + 8 + g] = p[u][1];
        __syncwarp();
#pragma unroll
        for (int u = 0; u < U; u++) {
            /* B fragments of p·V per group: keys 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of sub-tile
             * u, column g: p·scale's hi (g even) or lo part */
            uint32_t pb[NG][2];
            {
                float pk[4] = {0.f, 0.f, 0.f, 0.f};
                if (hq < G) {
                    const float2 u0 = *reinterpret_cast<const float2 *>(ps + hq * TK + 16 * u + 2 * t);
                    const float2 u1 = *reinterpret_cast<const float2 *>(ps + hq * TK + 16 * u + 8 + 2 * t);
                    pk[0] = u0.x, pk[1] = u0.y, pk[2] = u1.x, pk[3] = u1.y;
                }
#pragma unroll
                for (int gr = 0; gr < NG; gr++) {
                    float x[4];
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        x[j] = pk[j] * vf[(16 * u + 2 * t + (j & 1) + 8 * (j >> 1)) * NG + gr].x;
                    uint32_t h0, l0, h1, l1;
                    fd_split(x[0], x[1], h0, l0);
                    fd_split(x[2], x[3], h1, l1);
                    pb[gr][0] = g & 1 ? l0 : h0;
                    pb[gr][1] = g & 1 ? l1 : h1;
                }
            }
            /* A fragments: V codes of keys 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3) */
            if (BITS == 4) {
#pragma unroll
                for (int c4 = 0; c4 < WPR / 4; c4++) {
                    uint32_t w[4][4];
                    fd_vwords<L>(st, TK + 16 * u, t, 4 * c4, swv, w);
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++) {
                        const int i = 2 * c4 + h2, gr = 16 * i / GS;
                        const uint32_t a0 = fd_deq(__byte_perm(w[0][2 * h2], w[1][2 * h2], vsel), vmask, vmul, vadd);
                        const uint32_t a1 =
                            fd_deq(__byte_perm(w[0][2 * h2 + 1], w[1][2 * h2 + 1], vsel), vmask, vmul, vadd);
                        const uint32_t a2 = fd_deq(__byte_perm(w[2][2 * h2], w[3][2 * h2], vsel), vmask, vmul, vadd);
                        const uint32_t a3 =
                            fd_deq(__byte_perm(w[2][2 * h2 + 1], w[3][2 * h2 + 1], vsel), vmask, vmul, vadd);
                        fd_mma(o[i], a0, a1, a2, a3, pb[gr][0], pb[gr][1]);
                    }
                }
            } else {
#pragma unroll
                for (int c8 = 0; c8 < WPR / 8; c8++) {
                    uint32_t w[4][4];
                    fd_vwords<L>(st, TK + 16 * u, t, 8 * c8 + 4 * (g >> 2), swv, w);
#pragma unroll
                    for (int u2 = 0; u2 < 2; u2++) {
                        const int i = 2 * c8 + u2, gr = 32 * c8 / GS;
                        const uint32_t a0 = fd_byte2(__byte_perm(w[0][u2], w[1][u2], bsel));
                        const uint32_t a1 = fd_byte2(__byte_perm(w[0][u2 + 2], w[1][u2 + 2], bsel));
                        const uint32_t a2 = fd_byte2(__byte_perm(w[2][u2], w[3][u2], bsel));
                        const uint32_t a3 = fd_byte2(__byte_perm(w[2][u2 + 2], w[3][u2 + 2], bsel));
                        fd_mma(o[i], a0, a1, a2, a3, pb[gr][0], pb[gr][1]);
                    }
                }
            }
        }
        __syncwarp(); /* every lane is done with stage k % NS and ps before the next tile */
    }
    fd_wait(0);
    /* head t's sum and bias sums over the 8 lanes that hold it */
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) {
        l += __shfl_xor_sync(0xffffffffu, l, o2);
#pragma unroll
        for (int gr = 0; gr < NG; gr++) bsum[gr] += __shfl_xor_sync(0xffffffffu, bsum[gr], o2);
    }
    __syncwarp();
    float *wo = reinterpret_cast<float *>(ring);
    if (t < G) {
        if (g == 0) wm[warp][t] = m, wl[warp][t] = l;
#pragma unroll
        for (int i = 0; i < KS; i++) {
            int e0, e1, gr;
            if (BITS == 4) e0 = 16 * i + g, e1 = e0 + 8, gr = 16 * i / GS;
            else {
                const int c8 = i >> 1, u = i & 1;
                e0 = 32 * c8 + 16 * (g >> 2) + 4 * u + (g & 3), e1 = e0 + 8, gr = 32 * c8 / GS;
            }
            wo[t * D + e0] = (o[i][0] + o[i][1]) + bsum[gr];
            wo[t * D + e1] = (o[i][2] + o[i][3]) + bsum[gr];
        }
    }
    __syncthreads();
    fd_block_out_call<G, D>(a.P, a.ML, a.nsplit, wm, wl, fd_dyn, LT::warp_words(NS), kh, split);
}

/* The fused decode attention (kv_fused.cu): one query row (T == 1) over a
 * 4- or 8-bit cache. PT_ERR_UNSUPPORTED naming the configuration when no
 * kernel exists for it. */
pt_status pt_cuda_attention_fused(pt_cuda *c, float *out, const float *q, const int32_t *pos, const pt_kv_layer *kv,
                                  const pt_attn *p);

/* Launches the block kernel for one bits value, or with occ != NULL only
 * writes how many of its blocks fit on one SM (the split count is sized to
 * whole waves).
 * PT_ERR_UNSUPPORTED (no message) when (group size, head_dim, G) has no
 * instantiation. */
pt_status pt_cuda_fused_block4(pt_fd_args &a, dim3 grid, cudaStream_t st, int gs, int hd, int G, int *occ);
pt_status pt_cuda_fused_block8(pt_fd_args &a, dim3 grid, cudaStream_t st, int gs, int hd, int G, int *occ);
/* PETREL_CUDA_FD_T: 1 (default) the transposed block kernel for G <= 4, 0 the other; read once. */
int pt_fd_env_t(void);
/* PETREL_CUDA_FD_TK: the block kernels' keys a tile, 16 or 32 (0: unset, the launch's rule); read once. */
int pt_fd_env_tk(void);
/* Counts a block-kernel launch with tk-key tiles (pt_cuda_fd_tk_count). */
void pt_fd_count_tk(int tk);
/* Whether the block and merge kernels are dependent launches (programmatic
 * stream serialization): unless PETREL_CUDA_FD_PDL=0 or PETREL_CUDA_PDL_CHAIN=0;
 * read once. */
bool pt_fd_pdl(void);

/* The blocks that fit on an SM, decided once per instantiation; the
 * kernel's dynamic shared memory limit is raised to its ring's size. */
template <int B, int GS, int D, int G>
static pt_status pt_fd_launch(pt_fd_args &a, dim3 grid, cudaStream_t st, int *occ) {
    typedef fd_smem<B, D, D / GS> L;
    typedef fd_smem<B, D, D / GS, 32> L32;
    typedef fdt_smem<B, D, D / GS> LT;
    typedef fdt_smem<B, D, D / GS, 32> LT32;
    /* G <= 4: the transposed kernel unless PETREL_CUDA_FD_T=0, with 32-key tiles wherever such a
     * block fits (PETREL_CUDA_FD_TK=16 forces 16-key tiles, =32 32-key tiles for either kernel
     * wherever a block fits). Kinds: 0 fd_block_kernel, 1 fdt_block_kernel, 2 and 3 the same
     * with 32-key tiles. */
    constexpr bool TK = G <= 4;
    constexpr int GT = TK ? G : 1;
    static int s_occ[4]; /* blocks an SM per kind (0: not found yet); the same values on every call */
    auto kernel = [](int kind) {
        return kind == 3   ? fdt_block_kernel<B, GS, D, GT, 32>
               : kind == 2 ? fd_block_kernel<B, GS, D, G, 32>
               : kind == 1 ? fdt_block_kernel<B, GS, D, GT>
                           : fd_block_kernel<B, GS, D, G>;
    };
    auto bytes = [](int kind) {
        const int w = kind == 3   ? LT32::warp_words(FD_NS)
                      : kind == 2 ? L32::warp_words(FD_NS)
                      : kind == 1 ? LT::warp_words(FD_NS)
                                  : L::warp_words(FD_NS);
        return w * 4 * FD_WARPS;
    };
    /* blocks of a kind an SM (-1: none fits), found once, the kernel's shared-memory limit raised to its ring */
    auto blocks = [&](int kind) -> pt_status {
        if (s_occ[kind] == 0) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel(kind), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes(kind)));
            int o = 0;
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel(kind), FD_THREADS, bytes(kind)));
            s_occ[kind] = o > 0 ? o : -1;
        }
        return PT_OK;
    };
    if (L::warp_words(FD_NS) < G * D) return PT_ERR_UNSUPPORTED; /* never at 2+ stages: the partial output must fit
                                                                  * a warp's region */
    const int fam = TK && pt_fd_env_t(), want = pt_fd_env_tk(); /* fam: the kernel, 16-key kind */
    /* the default takes 32-key tiles for the transposed kernel wherever a block fits, even at fewer
     * blocks an SM than its 16-key tiles (the 8-bit ring: faster at 2k-32k keys on the H100,
     * bench/RESULTS.md); the first kernel's 32-key build spills more: only by PETREL_CUDA_FD_TK=32 */
    bool t32 = false;
    if (want == 32 || (want == 0 && fam == 1)) {
        PT_TRY(blocks(fam + 2));
        t32 = s_occ[fam + 2] > 0;
    }
    const int kind = fam + (t32 ? 2 : 0);
    if (occ) {
        PT_TRY(blocks(kind));
        if (s_occ[kind] < 1) return PT_ERR_UNSUPPORTED;
        *occ = s_occ[kind];
        return PT_OK;
    }
    pt_fd_count_tk(t32 ? 32 : 16);
    pt_launch(kernel(kind), grid, dim3(FD_THREADS), (size_t)bytes(kind), st, pt_fd_pdl(), a);
    return PT_OK;
}

/* Instantiations: every head_dim a quantized cache takes (a multiple of the
 * group size, <= 256) and GQA ratios 1..8. */
#define PT_FD_G(B, GS, D)                                                      \
    switch (G) {                                                               \
    case 1: return pt_fd_launch<B, GS, D, 1>(a, grid, st, occ); \
    case 2: return pt_fd_launch<B, GS, D, 2>(a, grid, st, occ); \
    case 3: return pt_fd_launch<B, GS, D, 3>(a, grid, st, occ); \
    case 4: return pt_fd_launch<B, GS, D, 4>(a, grid, st, occ); \
    case 5: return pt_fd_launch<B, GS, D, 5>(a, grid, st, occ); \
    case 6: return pt_fd_launch<B, GS, D, 6>(a, grid, st, occ); \
    case 7: return pt_fd_launch<B, GS, D, 7>(a, grid, st, occ); \
    case 8: return pt_fd_launch<B, GS, D, 8>(a, grid, st, occ); \
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
