/* The second-generation split decode attention over full-precision KV
 * caches (dec2_*: scores, p·V, ordered merge, laid out for 16-byte loads
 * with many in flight) and its launch pt_cuda_dec2_launch. attention.cu
 * picks it (PETREL_CUDA_ATTN_V2, the split count, the scratch, the grid) and
 * holds the first-generation kernels, the prefill kernel, kv_append and the
 * entry points; the shared row pieces (pt_dec_rows, dec_range, dec_cache)
 * are decode_split.cuh's. Not the quantized caches (kv_quant.cu,
 * kv_fused.cu), not the flash prefill (flash_attn.cu). */
#include "backend/cuda/attention_dec2.cuh"

/* ---- decode (T == 1), second generation: the same three phases ------------
 * (scores with per-split (max, sum), p·V with the exact row max and sum,
 * ordered merge), the same splits (dec_range) and the same rounding points
 * as attention.cu's first-generation kernels, laid out for the memory
 * system. PETREL_CUDA_ATTN_V2=0 (read once) runs those instead (A/B).
 *
 * Both phases read the cache in 16-byte chunks, a key row being R = hd ·
 * sizeof(KT) / 16 chunks, with consecutive lanes on consecutive chunks of
 * one row (whole 32-byte sectors per load instruction), and a lane issues
 * all its loads of a batch of keys before it uses any of them, so 8 loads
 * per lane (4 KB per warp at hd 128 in bf16; 4 in the p·V kernel for more
 * than 4 heads per KV head, whose accumulators take the registers) are in
 * flight at once; 8 warps
 * per block, two blocks per SM. The old kernels kept one key per thread
 * (scores: 256-byte rows as 16 scattered loads, 4 in flight) or 2-byte loads
 * per lane (p·V) and read the per-split statistics one after another.
 *
 *   scores (dec2_scores_kernel<KT, LPR>): LPR lanes per key, 4 chunks per
 *       lane (chunk ci·LPR + sub), 32/LPR keys per warp and load step. A
 *       lane's partial dots for the G heads (q from shared memory) are added
 *       over the key's LPR lanes by an xor butterfly (IEEE addition commutes,
 *       so every lane holds the same sum); lane sub then rounds, stores and
 *       pushes the scores of heads g ≡ sub (mod LPR) into its running (max,
 *       sum). A split's (max, sum) per head: pt_softmax_block.
 *   p·V (dec2_pv_kernel<KT, LPR, C, MG>): warp h < G merges head h's used
 *       splits' statistics (lanes over splits, then a warp max and an xor sum:
 *       the exact M and L, in parallel, not one load after another). Then per
 *       batch of keys each warp loads its V rows (LPR lanes per row, C chunks
 *       per lane: every lane keeps hd / LPR dims of G heads), computes the
 *       batch's p = round(exp(s − M) / L) lane-parallel into its own shared
 *       buffer and accumulates p·v in f32. The split's output: the key slots
 *       of a warp added by an xor butterfly, the warps added in warp order.
 *   merge (dec_rows_merge_kernel, attention.cu): the used splits' partial outputs in split
 *       order, 8 loads in flight per thread.
 * Which lane takes which key and every reduction order are fixed by the
 * shape (never by the rows of the launch or the grid height), so a row
 * alone and in a batch still get the same bits; they differ from the
 * first-generation kernels in the last bits (other summation orders). */

/* ROPE: 0 none; 1 the folded RoPE and cache write (pt_dec_rows.kn); 2 the
 * queries' RoPE alone (kn == NULL, inv_freq set: the keys were rotated and
 * appended by a kernel before, batch_decode.cu's rope_k_append_rows). */
template <typename KT, int LPR, int ROPE>
__global__ void __launch_bounds__(D2_THREADS, 2) dec2_scores_kernel(pt_dec_rows a) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    constexpr int C = 4, KPW = 32 / LPR, U = 2, KB = U * KPW; /* keys per warp batch */
    extern __shared__ float4 d2_q[]; /* [H, hd] the block's queries */
    __shared__ float red[32];
    /* the block's H query heads of KV head kh (a.hpb: all G, or one), h0 the first in the group */
    const int G = a.nh / a.nkv, H = a.hpb, hd = a.hd, R = hd * (int)sizeof(KT) / 16, kh = blockIdx.x / (G / H);
    const int h0 = (int)(blockIdx.x % (G / H)) * H;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane % LPR, ks = lane / LPR;
    const int64_t b = blockIdx.y, nsplit = a.nsplit, stride = a.stride, cap = a.cap;
    int64_t lo, n, per, used;
    dec_range(a, b, lo, n, per, used);
    if ((int64_t)blockIdx.z >= used) return; /* no split of this block holds a key */
    float *qs = reinterpret_cast<float *>(d2_q);
    const float *q = a.q + (b * a.nh + (int64_t)kh * G + h0) * hd;
    /* ROPE: the new key's row as the cache stores it ([R] chunks, hd <= 256),
     * the rope table at pos[b] ([half] each) */
    __shared__ uint4 knew[ROPE == 1 ? 64 : 1];
    __shared__ float rcs[ROPE ? 128 : 1], rsn[ROPE ? 128 : 1];
    int64_t prow = -1;
    if constexpr (ROPE != 0) {
        const int32_t p = a.pos[b]; /* >= 0: the row has keys */
        prow = p % cap;
        for (int d = threadIdx.x; d < a.half; d += D2_THREADS) {
            /* rope_kv_kernel's table values */
            const float th = (float)p * a.inv_freq[d];
            rcs[d] = pt_rope_cos(th, a.rscale, a.bf);
            rsn[d] = pt_rope_sin(th, a.rscale, a.bf);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < H * hd; i += D2_THREADS)
            qs[i] = d2_rope_elem(q + (i / hd) * hd, i % hd, a.half, rcs, rsn, a.bf);
        if constexpr (ROPE == 1) {
            const float *kr = a.kn + (b * a.nkv + kh) * (int64_t)hd;
            KT *kn = reinterpret_cast<KT *>(knew);
            for (int d = threadIdx.x; d < hd; d += D2_THREADS)
                d2_kv_store(kn + d, d2_rope_elem(kr, d, a.half, rcs, rsn, a.bf));
        }
        __syncthreads();
        if (ROPE == 1 && blockIdx.z == 0 && h0 == 0) { /* the cache write of (row b, KV head kh): kv_append's bytes */
            KT *kc = (KT *)dec_cache(a, b, 0) + ((int64_t)kh * cap + prow) * hd;
            KT *vc = (KT *)dec_cache(a, b, 1) + ((int64_t)kh * cap + prow) * hd;
            const float *vr = a.vn + (b * a.nkv + kh) * (int64_t)hd;
            for (int c = threadIdx.x; c < R; c += D2_THREADS) reinterpret_cast<uint4 *>(kc)[c] = knew[c];
            for (int d = threadIdx.x; d < hd; d += D2_THREADS) d2_kv_store(vc + d, vr[d]);
        }
    } else {
        for (int i = threadIdx.x; i < H * hd; i += D2_THREADS) qs[i] = q[i];
        __syncthreads();
    }
    float *S = a.S + (b * a.nh + (int64_t)kh * G + h0) * stride;  /* [H, stride] */
    float2 *ML = a.ML + (b * a.nh + (int64_t)kh * G + h0) * nsplit; /* [H, nsplit] */
    const KT *kb = (const KT *)dec_cache(a, b, 0) + (int64_t)kh * cap * hd;
    const int64_t rlo = lo % cap;
    for (int64_t split = blockIdx.z; split < used; split += gridDim.z) {
        float m[DEC_MAX_G], l[DEC_MAX_G];
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++) m[g] = -INFINITY, l[g] = 0.f;
        const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
        for (int64_t jb = j0 + (int64_t)warp * KB; jb < j1; jb += (int64_t)D2_WARPS * KB) {
            uint4 kr[U][C];
            d2_load<KT, LPR, C, U>(kr, kb, rlo, cap, hd, R, jb, j1, sub, ks, ROPE == 1 ? knew : nullptr, prow);
            d2_scores_batch<KT, LPR, C, U>(kr, qs, a, H, hd, R, jb, j1, sub, ks, S, stride, m, l);
        }
        /* pt_softmax_block synchronizes before reusing red, also across splits */
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++) {
            if (g >= H) break;
            const float2 ml = pt_softmax_block(m[g], l[g], red);
            if (threadIdx.x == 0) ML[(int64_t)g * nsplit + split] = ml;
        }
    }
}

template <typename KT, int LPR, int C, int MG>
__global__ void __launch_bounds__(D2_THREADS, 2) dec2_pv_kernel(pt_dec_rows a) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    constexpr int V = 16 / sizeof(KT), KPW = 32 / LPR, U = (MG > 4 ? 4 : 8) / C, KB = U * KPW;
    __shared__ float sM[MG], sInv[MG];
    __shared__ float ps[D2_WARPS][MG][KB]; /* each warp's p of its current batch: [head][key] */
    extern __shared__ float4 d2_po[];      /* [D2_WARPS][H][hd] the warps' partial outputs */
    /* the block's H query heads (dec2_scores_kernel's) */
    const int G = a.nh / a.nkv, H = a.hpb, hd = a.hd, R = hd * (int)sizeof(KT) / 16, kh = blockIdx.x / (G / H);
    const int h0 = (int)(blockIdx.x % (G / H)) * H;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane % LPR, ks = lane / LPR;
    const int64_t b = blockIdx.y, nsplit = a.nsplit, stride = a.stride, cap = a.cap;
    int64_t lo, n, per, used;
    dec_range(a, b, lo, n, per, used);
    if ((int64_t)blockIdx.z >= used) return;
    const float *S = a.S + (b * a.nh + (int64_t)kh * G + h0) * stride;
    const float2 *ML = a.ML + (b * a.nh + (int64_t)kh * G + h0) * nsplit;
    float *P = a.P + (b * a.nh + (int64_t)kh * G + h0) * nsplit * hd; /* [H, nsplit, hd] */
    if (warp < H) { /* head `warp`: the exact row max and sum over the used splits */
        float mx, L;
        d2_row_stats(ML + (int64_t)warp * nsplit, 1, used, lane, mx, L);
        if (lane == 0) sM[warp] = mx, sInv[warp] = 1.0f / L;
    }
    __syncthreads();
    float *po = reinterpret_cast<float *>(d2_po);
    const KT *vb = (const KT *)dec_cache(a, b, 1) + (int64_t)kh * cap * hd;
    const int64_t rlo = lo % cap;
    for (int64_t split = blockIdx.z; split < used; split += gridDim.z) {
        float acc[MG][C][V];
        d2_acc_zero(acc);
        const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
        for (int64_t jb = j0 + (int64_t)warp * KB; jb < j1; jb += (int64_t)D2_WARPS * KB) {
            uint4 vr[U][C];
            d2_load<KT, LPR, C, U>(vr, vb, rlo, cap, hd, R, jb, j1, sub, ks);
            d2_pv_batch<KT, LPR, C, U, MG>(vr, ps[warp], S, stride, sM, sInv, a.bf, H, jb, j1, lane, ks, acc);
        }
        d2_pv_keys_sum<LPR>(acc, H);
        d2_pv_store<LPR>(acc, po + warp * H * hd, H, hd, R, sub, ks);
        __syncthreads();
        /* this split's partial output: the warps added in warp order */
        for (int idx = threadIdx.x; idx < H * hd; idx += D2_THREADS) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < D2_WARPS; w++) v += po[w * H * hd + idx];
            P[((int64_t)(idx / hd) * nsplit + split) * hd + idx % hd] = v;
        }
        __syncthreads(); /* po is written again by the next split */
    }
}

/* Query heads per block of the scores and p·V kernels: one sequence's
 * launch gives a KV head's G heads to G/H blocks so that the grid reaches
 * two blocks per SM (the kernels' bound) — H = G / f for the largest power
 * of two f <= G with nkv·nsplit·f <= 2·SMs; the many-row launches keep a
 * block per KV head (their grids fill the SMs already, and each of the G/H
 * blocks reads the KV head's rows). Splitting past the fill measured slower
 * (a block per query head at llama-3.2-1b, depth 512: 1176 → 895 t/s, each
 * KV row read by 4 blocks); below it faster (qwen3-30b-a3b, 4 KV heads:
 * 287 → 316 t/s, bench/RESULTS.md). c->dec_heads overrides it. */
static int dec2_hpb(const pt_cuda *c, const pt_dec_rows &a, int G) {
    if (a.kvp || c->dec_heads == 0) return G;
    if (c->dec_heads > 0) return G % c->dec_heads == 0 ? c->dec_heads : G;
    int f = 1;
    while (2 * f <= G && G % (2 * f) == 0 && (int64_t)a.nkv * a.nsplit * 2 * f <= 2LL * c->sm_count) f *= 2;
    return G / f;
}

/* The v2 launches over grid for cache dtype KT, R = hd·sizeof(KT)/16 in
 * [4, 64] (the caller checks): scores with LPR = the power of two >= R/4
 * (4 chunks per lane); p·V with LPR = the power of two >= R, one chunk per
 * lane (two from R = 33 on); MG = 4 for G <= 4 (fewer accumulators), else 8. */
template <typename KT>
pt_status pt_cuda_dec2_launch(pt_cuda *c, pt_dec_rows &a, int64_t B, dim3 grid_in) {
    /* (KV head, row, split): the caller's (KV head, split, row) with the
     * split slowest, so the blocks of every row's first split are handed
     * out before any block of a split that may hold no key */
    const int G = a.nh / a.nkv, R = a.hd * (int)sizeof(KT) / 16;
    a.hpb = dec2_hpb(c, a, G);
    const dim3 grid(grid_in.x * (unsigned)(G / a.hpb), grid_in.z, grid_in.y);
    const d2_geom gm = d2_geometry(R, G);
    const int ls = gm.LS;
    const size_t qb = (size_t)a.hpb * a.hd * sizeof(float);
    switch (ls) {
#define PT_LS(L)                                                                                                   \
    case L:                                                                                                        \
        if (a.kn)                                                                                                  \
            pt_launch(dec2_scores_kernel<KT, L, 1>, grid, dim3(D2_THREADS), qb, c->stream, pt_pdl_chain(), a);     \
        else if (a.inv_freq)                                                                                       \
            pt_launch(dec2_scores_kernel<KT, L, 2>, grid, dim3(D2_THREADS), qb, c->stream, pt_pdl_chain(), a);     \
        else                                                                                                       \
            pt_launch(dec2_scores_kernel<KT, L, 0>, grid, dim3(D2_THREADS), qb, c->stream, pt_pdl_chain(), a);     \
        break;
        PT_LS(1) PT_LS(2) PT_LS(4) PT_LS(8) PT_LS(16)
#undef PT_LS
    }
    CUDA_CHECK_LAUNCH("decode attention scores");
    const int lp = gm.LP, cp = gm.CP;
    const size_t pb = (size_t)D2_WARPS * a.hpb * a.hd * sizeof(float);
    /* more than the default 48 KB of dynamic shared memory (G·hd > 1536): raised once per kernel */
    static bool raised[2][5];
#define PT_PV(L, CC, MG)                                                                                            \
    do {                                                                                                          \
        bool &r_ = raised[MG > 4][(L == 4 ? 0 : L == 8 ? 1 : L == 16 ? 2 : 3) + (CC > 1)];                      \
        if (pb > 48 * 1024 && !r_) {                                                                              \
            CUDA_CHECK(cudaFuncSetAttribute(dec2_pv_kernel<KT, L, CC, MG>,                                        \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));             \
            r_ = true;                                                                                            \
        }                                                                                                         \
        pt_launch(dec2_pv_kernel<KT, L, CC, MG>, grid, dim3(D2_THREADS), pb, c->stream, pt_pdl_chain(), a);       \
    } while (0)
#define PT_PV_G(L, CC) \
    if (G <= 4) PT_PV(L, CC, 4); else PT_PV(L, CC, 8);
    if (cp == 2) {
        if constexpr (sizeof(KT) == 4) { PT_PV_G(32, 2) } /* R > 32 takes 4-byte values: hd <= 256 */
    } else {
        switch (lp) {
        case 4: PT_PV_G(4, 1) break;
        case 8: PT_PV_G(8, 1) break;
        case 16: PT_PV_G(16, 1) break;
        default: PT_PV_G(32, 1) break;
        }
    }
#undef PT_PV_G
#undef PT_PV
    CUDA_CHECK_LAUNCH("decode attention p·v");
    pt_launch(dec_rows_merge_kernel, dim3(pt_cuda_blocks(B * a.nh * a.hd, 256)), dim3(256), 0, c->stream, pt_pdl_chain(),
              a, B);
    CUDA_CHECK_LAUNCH("decode attention merge");
    return PT_OK;
}

template pt_status pt_cuda_dec2_launch<float>(pt_cuda *c, pt_dec_rows &a, int64_t B, dim3 grid);
template pt_status pt_cuda_dec2_launch<__nv_bfloat16>(pt_cuda *c, pt_dec_rows &a, int64_t B, dim3 grid);
template pt_status pt_cuda_dec2_launch<__half>(pt_cuda *c, pt_dec_rows &a, int64_t B, dim3 grid);
