/* Flash attention for prefill chunks (T > 1): causal, sliding window,
 * soft-cap, GQA, rotating caches (slot = position % capacity), head_dim 32,
 * 64, 80, 96, 128 or 256 (others take attention.cu's kernel).
 *
 * A block takes 64 query rows (consecutive tokens) of one query head; each
 * of its 4 warps owns 16 rows. K and V tiles of 32 keys are staged in
 * shared memory and shared by the 64 rows. Two forms of the same tiling:
 *   - bf16 activations over a bf16 cache (the production case): scores and
 *     p·V are mma.sync m16n8k16 bf16 products with f32 accumulation (V
 *     staged transposed). The query, the cache and (after rounding) the
 *     probabilities are bf16 values already, so the products are exact and
 *     only the order of the f32 sums differs from the CPU reference.
 *   - f32 activations, or f32/f16 caches: the same tiles as f32 FMAs on CUDA
 *     cores (f32 numerics: DESIGN.md's strict bound in f32 mode).
 * The tensor-core form has a pipelined version (flash2_prefill_kernel, head
 * dims up to 128: K/V through a cp.async ring, fragments by ldmatrix) that
 * computes the same bits; the first version serves head_dim 256, the
 * quantized caches and PETREL_CUDA_FLASH2=0.
 *
 * The softmax keeps the reference's rounding points (backend.h: scores
 * rounded after the dot and after ·scale, soft-cap steps rounded,
 * probabilities rounded before p·V), so it cannot be the one-pass online
 * form: pass 1 runs over the key tiles for the exact row max and sum of exp
 * (online within the pass), pass 2 recomputes the same scores, forms
 * p = round(exp(s − max)/sum) and accumulates p·V. Twice the QKᵀ work of a
 * one-pass kernel, no score matrix in memory, deterministic.
 *
 * Quantized caches in bf16 mode (pt_cuda_flash_prefill_q, called by
 * kv_quant.cu) run the tensor-core form with a second K and V tile: the
 * cache is dequantized once per chunk into hi + lo bf16 caches (x = hi + lo
 * to ~16 bits), each product is an MMA against hi plus one against lo, so
 * the dequantized f32 values enter the dot nearly unrounded.
 *
 * Not here: decode (T == 1, attention.cu's split kernels), the quantized
 * cache itself (kv_quant.cu). */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#define FA_ROWS 64 /* query rows per block (4 warps × 16) */
#define FA_BK 32   /* keys per tile */
#define FA_THREADS 128

__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x = lo: the lower k index in the low half */
    return *reinterpret_cast<uint32_t *>(&v);
}

struct fa_args {
    float *out;
    const float *q;
    const __nv_bfloat16 *k, *v;
    const int32_t *pos;
    int64_t T, cap;
    int nh, nkv;
    float scale, softcap;
    int window;
    /* quantized caches (LO kernels): K and V are hi + lo, each a bf16 cache
     * of the same layout (the dequantized f32 value x = hi + lo to ~16
     * bits), and q is staged as round(q·qmul) (the quantized path scales q
     * before the dot, scale = 1 then); qmul = 1 otherwise */
    const __nv_bfloat16 *klo, *vlo;
    float qmul;
};

/* Pass 1's update of this thread's two rows (running max m, this lane's
 * partial sum of exp l) by the 8 scores it holds of a 32-key tile; the row
 * max is shared by the row's 4 lanes (shuffles), the sums stay per lane. */
__device__ __forceinline__ void fa_online(const float (&s)[4][4], float (&m)[2], float (&l)[2]) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        float tm = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) tm = fmaxf(tm, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
        tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
        tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
        const float mn = fmaxf(m[rr], tm);
        if (mn == -INFINITY) continue;
        float acc = m[rr] == -INFINITY ? 0.f : l[rr] * expf(m[rr] - mn);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float v = s[nt][2 * rr + i];
                if (v != -INFINITY) acc += expf(v - mn);
            }
        l[rr] = acc;
        m[rr] = mn;
    }
}

/* After pass 1: the row sums (the 4 lanes' partials, lane order fixed by
 * the shuffles) inverted; 0 for a row with every key masked. */
__device__ __forceinline__ void fa_inverse(const float (&m)[2], const float (&l)[2], float (&inv)[2]) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        float L = l[rr];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        inv[rr] = m[rr] == -INFINITY ? 0.f : 1.0f / L;
    }
}

/* Pass 2: p = round(exp(s − max)/sum) of the 16 keys 16·kk.. of the tile,
 * as the A fragment of the p·V product: the C fragments of two adjacent
 * 8-key tiles are the A fragment of one 16-key step (rows lane/4 and +8,
 * keys (lane%4)·2 and +8). */
__device__ __forceinline__ void fa_probs(const float (&s)[4][4], int kk, const float (&m)[2], const float (&inv)[2],
                                         uint32_t (&af)[4]) {
    float p[2][4];
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float v = s[2 * kk + u][i];
            p[u][i] = v == -INFINITY ? 0.f : pt_round_bf(expf(v - m[i >> 1]) * inv[i >> 1]);
        }
    af[0] = pack_bf2(p[0][0], p[0][1]);
    af[1] = pack_bf2(p[0][2], p[0][3]);
    af[2] = pack_bf2(p[1][0], p[1][1]);
    af[3] = pack_bf2(p[1][2], p[1][3]);
}

/* The score of a raw dot product: rounded after the dot and after ·scale,
 * the soft-cap steps rounded (backend.h's rounding points). */
__device__ __forceinline__ float fa_score(float dot, const fa_args &a) {
    float v = pt_round_bf(pt_round_bf(dot) * a.scale);
    if (a.softcap > 0.f) v = pt_round_bf(pt_round_bf(tanhf(pt_round_bf(v / a.softcap))) * a.softcap);
    return v;
}

/* The scores of this thread's 2 rows × 8 keys of the tile (rounded,
 * soft-capped, masked to -inf), from Q rows in shared memory and the K tile. */
/* A tile's raw dots s[nt][i] (key j0 + nt * 8 + c0 + (i & 1), row i >> 1 at
 * position prow[i >> 1]) to scores, -inf outside the row's causal window. */
__device__ __forceinline__ void fa_mask_scores(float (&s)[4][4], const fa_args &a, int64_t j0, int c0,
                                               const int64_t (&prow)[2]) {
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t j = j0 + nt * 8 + c0 + (i & 1), p = prow[i >> 1];
            const bool ok = j <= p && (a.window <= 0 || j > p - a.window);
            const float v = fa_score(s[nt][i], a);
            s[nt][i] = ok ? v : -INFINITY;
        }
}

template <int D, bool LO>
__device__ __forceinline__ void tile_scores(float (&s)[4][4], const __nv_bfloat16 *Qs, const __nv_bfloat16 *Ks,
                                            const __nv_bfloat16 *Ks2, int warp, int lane, int64_t j0,
                                            const int64_t (&prow)[2], const fa_args &a) {
    constexpr int QS = D + 8, KS = D + 8;
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) s[nt][i] = 0.f;
    const int r0 = warp * 16 + (lane >> 2), c0 = (lane & 3) * 2;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        uint32_t af[4];
        const __nv_bfloat16 *qa = Qs + r0 * QS + ks * 16 + c0;
        af[0] = *reinterpret_cast<const uint32_t *>(qa);
        af[1] = *reinterpret_cast<const uint32_t *>(qa + 8 * QS);
        af[2] = *reinterpret_cast<const uint32_t *>(qa + 8);
        af[3] = *reinterpret_cast<const uint32_t *>(qa + 8 * QS + 8);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const __nv_bfloat16 *kb = Ks + (nt * 8 + (lane >> 2)) * KS + ks * 16 + c0;
            pt_mma16816(s[nt], af, *reinterpret_cast<const uint32_t *>(kb), *reinterpret_cast<const uint32_t *>(kb + 8));
            if (LO) {
                const __nv_bfloat16 *kl = Ks2 + (nt * 8 + (lane >> 2)) * KS + ks * 16 + c0;
                pt_mma16816(s[nt], af, *reinterpret_cast<const uint32_t *>(kl),
                         *reinterpret_cast<const uint32_t *>(kl + 8));
            }
        }
    }
    fa_mask_scores(s, a, j0, c0, prow);
}

/* Stages keys [j0, j0 + FA_BK) (rows beyond hi or below 0 zero-filled): K
 * as [key][d], V transposed as [d][key]. */
template <int D, bool LO>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *Ks, __nv_bfloat16 *Vt, __nv_bfloat16 *Ks2,
                                          __nv_bfloat16 *Vt2, const fa_args &a, int kh, int64_t j0, int64_t hi,
                                          bool with_v) {
    constexpr int KS = D + 8, VS = FA_BK + 8, C8 = D / 8;
    for (int idx = threadIdx.x; idx < FA_BK * C8; idx += blockDim.x) {
        const int r = idx / C8, c = (idx % C8) * 8;
        const int64_t j = j0 + r;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        uint4 kl = make_uint4(0, 0, 0, 0), vl = make_uint4(0, 0, 0, 0);
        if (j >= 0 && j <= hi) {
            const int64_t off = ((int64_t)kh * a.cap + j % a.cap) * D + c;
            kv = *reinterpret_cast<const uint4 *>(a.k + off);
            if (with_v) vv = *reinterpret_cast<const uint4 *>(a.v + off);
            if (LO) {
                kl = *reinterpret_cast<const uint4 *>(a.klo + off);
                if (with_v) vl = *reinterpret_cast<const uint4 *>(a.vlo + off);
            }
        }
        *reinterpret_cast<uint4 *>(Ks + r * KS + c) = kv;
        if (LO) *reinterpret_cast<uint4 *>(Ks2 + r * KS + c) = kl;
        if (with_v) {
            const __nv_bfloat16 *ve = reinterpret_cast<const __nv_bfloat16 *>(&vv);
#pragma unroll
            for (int i = 0; i < 8; i++) Vt[(c + i) * VS + r] = ve[i];
            if (LO) {
                const __nv_bfloat16 *vle = reinterpret_cast<const __nv_bfloat16 *>(&vl);
#pragma unroll
                for (int i = 0; i < 8; i++) Vt2[(c + i) * VS + r] = vle[i];
            }
        }
    }
}

/* Pieces both tensor-core kernels (flash_prefill_kernel, flash2_prefill_kernel)
 * share, inlined into each. */

/* Q rows t0.. of head h, scaled by qmul, as bf16 in Qs[FA_ROWS][stride]
 * (zeros past T) */
template <int D>
__device__ __forceinline__ void fa_stage_q(__nv_bfloat16 *Qs, int stride, const fa_args &a, int64_t t0, int h) {
    for (int idx = threadIdx.x; idx < FA_ROWS * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        const int64_t t = t0 + r;
        Qs[r * stride + d] = __float2bfloat16_rn(t < a.T ? a.q[(t * a.nh + h) * D + d] * a.qmul : 0.f);
    }
}

/* this thread's two rows of the mma layout: positions (-1: a padding row,
 * every key masked) */
__device__ __forceinline__ void fa_row_pos(int64_t (&prow)[2], const fa_args &a, int64_t t0, int64_t p0, int warp,
                                           int lane) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int64_t t = t0 + warp * 16 + (lane >> 2) + 8 * rr;
        prow[rr] = t < a.T ? p0 + t : -1;
    }
}

/* this thread's accumulators o[D / 8][4] (its two rows' columns) to
 * out[t, h, :], rounded to bf16; padding rows are skipped */
template <int D>
__device__ __forceinline__ void fa_store_out(const fa_args &a, const float (&o)[D / 8][4], int64_t t0, int h, int warp,
                                             int lane) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int64_t t = t0 + warp * 16 + (lane >> 2) + 8 * rr;
        if (t >= a.T) continue;
        float *orow = a.out + (t * a.nh + h) * D;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            const int c = nt * 8 + (lane & 3) * 2;
            orow[c] = pt_round_bf(o[nt][2 * rr]);
            orow[c + 1] = pt_round_bf(o[nt][2 * rr + 1]);
        }
    }
}

template <int D, bool LO>
__global__ void __launch_bounds__(FA_THREADS, 1) flash_prefill_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int QS = D + 8, KS = D + 8, VS = FA_BK + 8, NT = D / 8;
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fa_smem);
    __nv_bfloat16 *Ks = Qs + FA_ROWS * QS;
    __nv_bfloat16 *Vt = Ks + FA_BK * KS;
    __nv_bfloat16 *Ks2 = Vt + D * VS; /* LO only */
    __nv_bfloat16 *Vt2 = Ks2 + FA_BK * KS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, kh = h / (a.nh / a.nkv);
    const int64_t t0 = (int64_t)blockIdx.x * FA_ROWS;
    const int64_t tend = t0 + FA_ROWS < a.T ? t0 + FA_ROWS : a.T;
    /* positions are consecutive (backend.h): row t sits at pos[0] + t */
    const int64_t p0 = a.pos[0];
    const int64_t hi = p0 + tend - 1;
    const int64_t lo = a.window > 0 && p0 + t0 - a.window + 1 > 0 ? p0 + t0 - a.window + 1 : 0;
    fa_stage_q<D>(Qs, QS, a, t0, h);
    /* this thread's two rows: positions (-1: a padding row, every key masked) */
    int64_t prow[2];
    fa_row_pos(prow, a, t0, p0, warp, lane);
    /* pass 1: row max and sum of exp */
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float s[4][4];
    for (int64_t j0 = lo; j0 <= hi; j0 += FA_BK) {
        __syncthreads();
        load_tile<D, LO>(Ks, Vt, Ks2, Vt2, a, kh, j0, hi, false);
        __syncthreads();
        tile_scores<D, LO>(s, Qs, Ks, Ks2, warp, lane, j0, prow, a);
        fa_online(s, m, l);
    }
    float inv[2];
    fa_inverse(m, l, inv);
    /* pass 2: p = round(exp(s − max)/sum), O += p·V */
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[nt][i] = 0.f;
    for (int64_t j0 = lo; j0 <= hi; j0 += FA_BK) {
        __syncthreads();
        load_tile<D, LO>(Ks, Vt, Ks2, Vt2, a, kh, j0, hi, true);
        __syncthreads();
        tile_scores<D, LO>(s, Qs, Ks, Ks2, warp, lane, j0, prow, a);
        /* the C fragments of two adjacent 8-key tiles are the A fragment of
         * one 16-key step (rows lane/4 and +8, keys (lane%4)·2 and +8) */
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t af[4];
            fa_probs(s, kk, m, inv, af);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const __nv_bfloat16 *vb = Vt + (nt * 8 + (lane >> 2)) * VS + kk * 16 + (lane & 3) * 2;
                pt_mma16816(o[nt], af, *reinterpret_cast<const uint32_t *>(vb),
                         *reinterpret_cast<const uint32_t *>(vb + 8));
                if (LO) {
                    const __nv_bfloat16 *vl = Vt2 + (nt * 8 + (lane >> 2)) * VS + kk * 16 + (lane & 3) * 2;
                    pt_mma16816(o[nt], af, *reinterpret_cast<const uint32_t *>(vl),
                             *reinterpret_cast<const uint32_t *>(vl + 8));
                }
            }
        }
    }
    fa_store_out<D>(a, o, t0, h, warp, lane);
}

template <int D, bool LO = false>
static pt_status launch(pt_cuda *c, const fa_args &a) {
    const size_t shm =
        ((size_t)FA_ROWS * (D + 8) + (LO ? 2 : 1) * ((size_t)FA_BK * (D + 8) + (size_t)D * (FA_BK + 8))) * 2;
    static bool raised = false; /* the opt-in above 48 KiB, once per instantiation */
    if (!raised) {
        CUDA_CHECK(
            cudaFuncSetAttribute(flash_prefill_kernel<D, LO>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        raised = true;
    }
    dim3 grid((unsigned)((a.T + FA_ROWS - 1) / FA_ROWS), (unsigned)a.nh);
    flash_prefill_kernel<D, LO><<<grid, FA_THREADS, shm, c->stream>>>(a);
    CUDA_CHECK_LAUNCH("flash attention (prefill)");
    return PT_OK;
}

/* ---- the tensor-core kernel, pipelined (bf16 cache, bf16 activations) ----
 * The same tiling and the same arithmetic as flash_prefill_kernel — every
 * score, max, sum and p·V product is formed by the same instructions on
 * the same values in the same order, so the output is bit-identical (the
 * test test_cuda_prefill_flash compares the two) — arranged to keep the
 * tensor cores fed:
 *   - K and V tiles (32 keys) arrive by cp.async in a 3-deep ring: the
 *     next tiles load while this one is computed, one barrier per tile
 *     (the old kernel loaded each tile synchronously between two barriers);
 *   - V stays row-major [key][d] and its B fragments come from
 *     ldmatrix.trans (no transposing scalar stores); Q and K fragments come
 *     from ldmatrix; rows are padded by 16 bytes, so the 8 rows one
 *     ldmatrix phase reads sit in 8 different bank groups;
 *   - tiles wholly inside every row's causal window skip the mask;
 *   - the row tiles with the most keys (the last ones) start first.
 * Head dims 32..128 (256 would not fit its accumulators in the register
 * budget of 3 blocks per SM: it keeps the old kernel, as do the quantized
 * caches). PETREL_CUDA_FLASH2=0 selects the old kernel (A/B). */
#define FB_STAGES 3

__device__ __forceinline__ void fa_ldm4t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* cp.async of keys [j0, j0 + 32) into a stage: K (and V when PV) rows of D
 * values at a (D + 8)-element stride; keys past hi are zero-filled. ring:
 * the cache wraps (hi >= cap), so a key's slot is j % cap. */
template <int D, bool PV>
__device__ __forceinline__ void fa2_issue(uint32_t ks, uint32_t vs, const fa_args &a, int kh, int64_t j0, int64_t hi,
                                          bool ring) {
    constexpr int C8 = D / 8, ST = D + 8;
    for (int idx = threadIdx.x; idx < FA_BK * C8; idx += FA_THREADS) {
        const int r = idx / C8, c = (idx % C8) * 8;
        const int64_t j = j0 + r;
        const bool ok = j <= hi;
        const int64_t slot = ring ? j % a.cap : j;
        const int64_t off = ok ? ((int64_t)kh * a.cap + slot) * D + c : 0;
        const uint32_t so = (uint32_t)(r * ST + c) * 2;
        pt_cp16(ks + so, a.k + off, ok);
        if (PV) pt_cp16(vs + so, a.v + off, ok);
    }
}

/* Raw dot products of the warp's 16 query rows (Q at qs) with the tile's 32
 * keys (K at ks): s[nt] = keys 8·nt.., each accumulated over d in steps of
 * 16 in order (as tile_scores). */
template <int D>
__device__ __forceinline__ void fa2_dots(float (&s)[4][4], uint32_t qs, uint32_t ks, int warp, int lane) {
    constexpr int ST = D + 8;
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) s[nt][i] = 0.f;
    const int mi = lane >> 3;
#pragma unroll
    for (int kq = 0; kq < D / 16; kq++) {
        uint32_t af[4];
        pt_ldm4(af, qs + (uint32_t)((warp * 16 + (lane & 15)) * ST + kq * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t b[4];
            pt_ldm4(b, ks + (uint32_t)((np * 16 + (mi >> 1) * 8 + (lane & 7)) * ST + kq * 16 + (mi & 1) * 8) * 2);
            pt_mma16816(s[2 * np], af, b[0], b[1]);
            pt_mma16816(s[2 * np + 1], af, b[2], b[3]);
        }
    }
}

/* One pass over the key tiles [lo, hi]: pass 1 (PV false) the row max and
 * sum of exp, pass 2 p·V into o. pfirst: the position of the block's first
 * row (tiles at or below it, and inside the window of its last row hi,
 * need no mask). */
template <int D, bool PV>
__device__ __forceinline__ void fa2_pass(const fa_args &a, uint32_t qs, uint32_t ring_s, int kh, int64_t lo, int64_t hi,
                                         int64_t pfirst, bool ring, const int64_t (&prow)[2], float (&m)[2],
                                         float (&l)[2], const float (&inv)[2], float (&o)[D / 8][4], int warp,
                                         int lane) {
    constexpr int ST = D + 8, TILE = FA_BK * ST * 2, STAGE = 2 * TILE;
    const int64_t n = (hi - lo) / FA_BK + 1;
#pragma unroll
    for (int st = 0; st < FB_STAGES - 1; st++) {
        if (st < n) fa2_issue<D, PV>(ring_s + st * STAGE, ring_s + st * STAGE + TILE, a, kh, lo + st * FA_BK, hi, ring);
        pt_cp_commit();
    }
    const int c0 = (lane & 3) * 2, mi = lane >> 3;
    for (int64_t it = 0; it < n; it++) {
        pt_cp_wait<FB_STAGES - 2>();
        __syncthreads(); /* tile it landed for every thread; every warp is done with tile it-1's slot */
        {
            const int64_t nx = it + FB_STAGES - 1;
            const uint32_t sl = ring_s + (uint32_t)(nx % FB_STAGES) * STAGE;
            if (nx < n) fa2_issue<D, PV>(sl, sl + TILE, a, kh, lo + nx * FA_BK, hi, ring);
            pt_cp_commit();
        }
        const uint32_t ks = ring_s + (uint32_t)(it % FB_STAGES) * STAGE, vs = ks + TILE;
        const int64_t j0 = lo + it * FA_BK;
        float s[4][4];
        fa2_dots<D>(s, qs, ks, warp, lane);
        if (j0 + FA_BK - 1 > pfirst || (a.window > 0 && j0 < hi - a.window + 1)) {
            fa_mask_scores(s, a, j0, c0, prow);
        } else { /* every key of the tile in every row's window (padding rows: finite, never stored) */
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) s[nt][i] = fa_score(s[nt][i], a);
        }
        if (!PV) {
            fa_online(s, m, l);
        } else {
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                uint32_t af[4];
                fa_probs(s, kk, m, inv, af);
#pragma unroll
                for (int np = 0; np < D / 16; np++) {
                    uint32_t b[4];
                    fa_ldm4t(b, vs + (uint32_t)((kk * 16 + (mi & 1) * 8 + (lane & 7)) * ST + np * 16 + (mi >> 1) * 8) * 2);
                    pt_mma16816(o[2 * np], af, b[0], b[1]);
                    pt_mma16816(o[2 * np + 1], af, b[2], b[3]);
                }
            }
        }
    }
    pt_cp_wait<0>();
    __syncthreads(); /* the ring is free for the next pass */
}

template <int D>
__global__ void __launch_bounds__(FA_THREADS, 3) flash2_prefill_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int ST = D + 8, NT = D / 8;
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fa_smem); /* [64][D + 8] */
    const uint32_t qs = (uint32_t)__cvta_generic_to_shared(fa_smem);
    const uint32_t ring_s = qs + FA_ROWS * ST * 2; /* FB_STAGES × (K [32][D + 8], V [32][D + 8]) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x, kh = h / (a.nh / a.nkv);
    const int64_t t0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * FA_ROWS; /* the longest rows first */
    const int64_t tend = t0 + FA_ROWS < a.T ? t0 + FA_ROWS : a.T;
    const int64_t p0 = a.pos[0];
    const int64_t hi = p0 + tend - 1;
    const int64_t lo = a.window > 0 && p0 + t0 - a.window + 1 > 0 ? p0 + t0 - a.window + 1 : 0;
    fa_stage_q<D>(Qs, ST, a, t0, h); /* made visible by the first barrier of pass 1 */
    int64_t prow[2];
    fa_row_pos(prow, a, t0, p0, warp, lane);
    const bool ring = hi >= a.cap;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, inv[2] = {0.f, 0.f};
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[nt][i] = 0.f;
    fa2_pass<D, false>(a, qs, ring_s, kh, lo, hi, p0 + t0, ring, prow, m, l, inv, o, warp, lane);
    fa_inverse(m, l, inv);
    fa2_pass<D, true>(a, qs, ring_s, kh, lo, hi, p0 + t0, ring, prow, m, l, inv, o, warp, lane);
    fa_store_out<D>(a, o, t0, h, warp, lane);
}

template <int D>
static pt_status launch2(pt_cuda *c, const fa_args &a) {
    const size_t shm = ((size_t)FA_ROWS + 2 * FB_STAGES * (size_t)FA_BK) * (D + 8) * 2;
    static bool raised = false;
    if (!raised) {
        CUDA_CHECK(cudaFuncSetAttribute(flash2_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        /* all of the unified L1 as shared memory: 3 blocks of ~68 KiB per SM at head_dim 128 */
        CUDA_CHECK(cudaFuncSetAttribute(flash2_prefill_kernel<D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
        raised = true;
    }
    dim3 grid((unsigned)a.nh, (unsigned)((a.T + FA_ROWS - 1) / FA_ROWS));
    flash2_prefill_kernel<D><<<grid, FA_THREADS, shm, c->stream>>>(a);
    CUDA_CHECK_LAUNCH("flash attention (prefill, pipelined)");
    return PT_OK;
}

/* Which tensor-core kernel serves the bf16 cache: 2 the pipelined one, 1 the
 * old one; -1 reads PETREL_CUDA_FLASH2 (0: the old one). For tests and
 * benchmarks comparing the two in one process. */
static int g_flash2 = -1;
extern "C" void pt_cuda_flash_select(int v) { g_flash2 = v < 0 ? -1 : v == 2; }
static bool flash2_on(void) {
    if (g_flash2 < 0) g_flash2 = pt_env_on("PETREL_CUDA_FLASH2");
    return g_flash2 != 0;
}

/* ---- the same tiling on CUDA cores: f32 activations and f32/f16 caches ----
 * For f32 numerics (the strict bound of f32 mode) the products run as f32
 * FMAs: a block takes 64 query rows of one head, 4 warps × 16 rows; per
 * 32-key tile (staged as f32) lane k computes the 16 scores of key k, the
 * rows' max/sum use warp reductions, and p·V broadcasts each key's p from
 * its lane while every lane owns head_dim/32 output columns of the 16 rows.
 * Same two passes and rounding points as the tensor-core kernel. */

__device__ __forceinline__ float fa_to_f(float v) { return v; }
__device__ __forceinline__ float fa_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float fa_to_f(__half v) { return __half2float(v); }

struct fa2_args {
    float *out;
    const float *q;
    const void *k, *v;
    const int32_t *pos;
    int64_t T, cap;
    int nh, nkv;
    float scale, softcap;
    int window, bf;
};

template <typename KT, int D>
__device__ __forceinline__ void fma_load_tile(float *Ks, float *Vs, const fa2_args &a, int kh, int64_t j0, int64_t hi,
                                              bool with_v) {
    const KT *kc = (const KT *)a.k, *vc = (const KT *)a.v;
    for (int idx = threadIdx.x; idx < FA_BK * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        const int64_t j = j0 + r;
        const bool in = j >= 0 && j <= hi;
        const int64_t off = ((int64_t)kh * a.cap + (in ? j % a.cap : 0)) * D + d;
        Ks[r * (D + 1) + d] = in ? fa_to_f(kc[off]) : 0.f;
        if (with_v) Vs[r * D + d] = in ? fa_to_f(vc[off]) : 0.f;
    }
}

/* sc[r] = the score of row warp·16 + r against key j0 + lane (masked: -inf) */
template <int D>
__device__ __forceinline__ void fma_scores(float (&sc)[16], const float *Qs, const float *Ks, int warp, int lane,
                                           int64_t j0, int64_t pbase, int nvalid, const fa2_args &a) {
#pragma unroll
    for (int r = 0; r < 16; r++) sc[r] = 0.f;
    const float *kr = Ks + lane * (D + 1), *qb = Qs + warp * 16 * D;
    for (int d = 0; d < D; d++) {
        const float kd = kr[d];
#pragma unroll
        for (int r = 0; r < 16; r++) sc[r] = fmaf(qb[r * D + d], kd, sc[r]);
    }
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < 16; r++) {
        const int64_t p = pbase + r; /* the row's position (rows >= nvalid are padding: every key masked) */
        float v = pt_rnd(a.bf, pt_rnd(a.bf, sc[r]) * a.scale);
        if (a.softcap > 0.f) v = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, v / a.softcap))) * a.softcap);
        sc[r] = r < nvalid && j <= p && (a.window <= 0 || j > p - a.window) ? v : -INFINITY;
    }
}

template <typename KT, int D>
__global__ void __launch_bounds__(FA_THREADS, 1) flash_fma_kernel(fa2_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int NPL = (D + 31) / 32;
    float *Qs = reinterpret_cast<float *>(fa_smem); /* [64][D] */
    float *Ks = Qs + FA_ROWS * D;                   /* [32][D + 1] */
    float *Vs = Ks + FA_BK * (D + 1);               /* [32][D] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, kh = h / (a.nh / a.nkv);
    const int64_t t0 = (int64_t)blockIdx.x * FA_ROWS;
    const int64_t tend = t0 + FA_ROWS < a.T ? t0 + FA_ROWS : a.T;
    const int64_t p0 = a.pos[0];
    const int64_t hi = p0 + tend - 1;
    const int64_t lo = a.window > 0 && p0 + t0 - a.window + 1 > 0 ? p0 + t0 - a.window + 1 : 0;
    for (int idx = threadIdx.x; idx < FA_ROWS * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        const int64_t t = t0 + r;
        Qs[idx] = t < a.T ? a.q[(t * a.nh + h) * D + d] : 0.f;
    }
    const int64_t pbase = p0 + t0 + warp * 16; /* the position of the warp's first row */
    const int nvalid = (int)(a.T - (t0 + warp * 16) < 16 ? a.T - (t0 + warp * 16) : 16);
    float m[16], l[16], sc[16];
#pragma unroll
    for (int r = 0; r < 16; r++) m[r] = -INFINITY, l[r] = 0.f;
    /* pass 1: per lane partial sums against a row max shared by the warp */
    for (int64_t j0 = lo; j0 <= hi; j0 += FA_BK) {
        __syncthreads();
        fma_load_tile<KT, D>(Ks, Vs, a, kh, j0, hi, false);
        __syncthreads();
        fma_scores<D>(sc, Qs, Ks, warp, lane, j0, pbase, nvalid, a);
#pragma unroll
        for (int r = 0; r < 16; r++) {
            const float mn = fmaxf(m[r], pt_warp_max(sc[r]));
            if (mn == -INFINITY) continue;
            l[r] = (m[r] == -INFINITY ? 0.f : l[r] * expf(m[r] - mn)) + (sc[r] == -INFINITY ? 0.f : expf(sc[r] - mn));
            m[r] = mn;
        }
    }
    float inv[16];
#pragma unroll
    for (int r = 0; r < 16; r++) inv[r] = m[r] == -INFINITY ? 0.f : 1.0f / pt_warp_sum(l[r]);
    /* pass 2 */
    float o[16][NPL];
#pragma unroll
    for (int r = 0; r < 16; r++)
#pragma unroll
        for (int i = 0; i < NPL; i++) o[r][i] = 0.f;
    for (int64_t j0 = lo; j0 <= hi; j0 += FA_BK) {
        __syncthreads();
        fma_load_tile<KT, D>(Ks, Vs, a, kh, j0, hi, true);
        __syncthreads();
        fma_scores<D>(sc, Qs, Ks, warp, lane, j0, pbase, nvalid, a);
#pragma unroll
        for (int r = 0; r < 16; r++) sc[r] = sc[r] == -INFINITY ? 0.f : pt_rnd(a.bf, expf(sc[r] - m[r]) * inv[r]);
        for (int kk = 0; kk < FA_BK; kk++) {
            float vv[NPL];
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                const int e = lane + 32 * i;
                vv[i] = e < D ? Vs[kk * D + e] : 0.f;
            }
#pragma unroll
            for (int r = 0; r < 16; r++) {
                const float pr = __shfl_sync(0xffffffffu, sc[r], kk);
#pragma unroll
                for (int i = 0; i < NPL; i++) o[r][i] = fmaf(pr, vv[i], o[r][i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 16; r++) {
        const int64_t t = t0 + warp * 16 + r;
        if (t >= a.T) continue;
        float *orow = a.out + (t * a.nh + h) * D;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int e = lane + 32 * i;
            if (e < D) orow[e] = pt_rnd(a.bf, o[r][i]);
        }
    }
}

template <typename KT, int D>
static pt_status launch_fma(pt_cuda *c, const fa2_args &a) {
    const size_t shm = ((size_t)FA_ROWS * D + (size_t)FA_BK * (D + 1) + (size_t)FA_BK * D) * sizeof(float);
    static bool raised = false;
    if (!raised) {
        CUDA_CHECK(cudaFuncSetAttribute(flash_fma_kernel<KT, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        raised = true;
    }
    dim3 grid((unsigned)((a.T + FA_ROWS - 1) / FA_ROWS), (unsigned)a.nh);
    flash_fma_kernel<KT, D><<<grid, FA_THREADS, shm, c->stream>>>(a);
    CUDA_CHECK_LAUNCH("flash attention (prefill, f32)");
    return PT_OK;
}

template <typename KT>
static pt_status launch_fma_dt(pt_cuda *c, const fa2_args &a, int hd) {
    switch (hd) {
    case 32: return launch_fma<KT, 32>(c, a);
    case 64: return launch_fma<KT, 64>(c, a);
    case 80: return launch_fma<KT, 80>(c, a);
    case 96: return launch_fma<KT, 96>(c, a);
    case 128: return launch_fma<KT, 128>(c, a);
    case 256: return launch_fma<KT, 256>(c, a);
    default: return PT_ERR_UNSUPPORTED;
    }
}

pt_status pt_cuda_flash_prefill(pt_cuda *c, float *out, const float *q, int64_t T, const int32_t *pos,
                                const pt_kv_layer *kv, const pt_attn *p) {
    static int off = -1; /* PETREL_CUDA_FLASH=0: attention.cu's kernel instead (A/B measurements) */
    if (off < 0) off = !pt_env_on("PETREL_CUDA_FLASH");
    if (off || T < 2 || kv->bits || T > 65535LL * FA_ROWS || p->n_heads > 65535) return PT_ERR_UNSUPPORTED;
    if (kv->dtype != PT_FT_BF16 || c->base.act != PT_ACT_BF16 || (uintptr_t)kv->k % 16 || (uintptr_t)kv->v % 16) {
        fa2_args a = {out, q, kv->k, kv->v, pos, T, kv->capacity, p->n_heads, kv->n_kv, p->scale, p->softcap,
                      p->window, c->base.act == PT_ACT_BF16};
        switch (kv->dtype) {
        case PT_FT_F32: return launch_fma_dt<float>(c, a, p->head_dim);
        case PT_FT_BF16: return launch_fma_dt<__nv_bfloat16>(c, a, p->head_dim);
        case PT_FT_F16: return launch_fma_dt<__half>(c, a, p->head_dim);
        }
        return PT_ERR_UNSUPPORTED;
    }
    fa_args a = {out,       q,        (const __nv_bfloat16 *)kv->k,
                 (const __nv_bfloat16 *)kv->v, pos, T, kv->capacity, p->n_heads, kv->n_kv, p->scale, p->softcap,
                 p->window, NULL, NULL, 1.0f};
    if (flash2_on()) switch (p->head_dim) {
        case 32: return launch2<32>(c, a);
        case 64: return launch2<64>(c, a);
        case 80: return launch2<80>(c, a);
        case 96: return launch2<96>(c, a);
        case 128: return launch2<128>(c, a);
        default: break; /* 256: the old kernel */
        }
    switch (p->head_dim) {
    case 32: return launch<32>(c, a);
    case 64: return launch<64>(c, a);
    case 80: return launch<80>(c, a);
    case 96: return launch<96>(c, a);
    case 128: return launch<128>(c, a);
    case 256: return launch<256>(c, a);
    default: return PT_ERR_UNSUPPORTED;
    }
}

/* Prefill over a quantized cache in bf16 mode (kv_quant.cu): the cache rows
 * dequantized into hi + lo bf16 caches [nkv, cap, hd] (khi, klo, vhi, vlo),
 * q scaled and rounded before the dot as the quantized path does. The
 * tensor-core kernel with a second MMA for the lo halves: products exact,
 * the dequantized values carried to ~16 bits, f32 sums. PT_ERR_UNSUPPORTED
 * (no message) for head dims without a kernel. */
pt_status pt_cuda_flash_prefill_q(pt_cuda *c, float *out, const float *q, int64_t T, const int32_t *pos,
                                  const __nv_bfloat16 *khi, const __nv_bfloat16 *klo, const __nv_bfloat16 *vhi,
                                  const __nv_bfloat16 *vlo, int nkv, int64_t cap, const pt_attn *p) {
    if (T < 2 || T > 65535LL * FA_ROWS || p->n_heads > 65535 || c->base.act != PT_ACT_BF16) return PT_ERR_UNSUPPORTED;
    /* scores = round(round(q·scale)·k), then the soft-cap: scale 1 after the staged q·qmul */
    fa_args a = {out, q, khi, vhi, pos, T, cap, p->n_heads, nkv, 1.0f, p->softcap, p->window, klo, vlo, p->scale};
    switch (p->head_dim) {
    case 32: return launch<32, true>(c, a);
    case 64: return launch<64, true>(c, a);
    case 80: return launch<80, true>(c, a);
    case 96: return launch<96, true>(c, a);
    case 128: return launch<128, true>(c, a);
    case 256: return launch<256, true>(c, a);
    default: return PT_ERR_UNSUPPORTED;
    }
}
