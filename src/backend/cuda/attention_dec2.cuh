/* The second-generation split decode attention's row pieces (attention_dec2.cu
 * describes the kernels): the block shape, the 16-byte chunk conversion
 * (d2_cvt), the batched loads of key or value rows (d2_load), the cache
 * element store (d2_kv_store) and the folded RoPE's element (d2_rope_elem).
 * attention_dec2.cu's three-kernel split decode and attention_short.cu's
 * one-block form of it share them, so both compute the same bits. */
#ifndef PT_BACKEND_CUDA_ATTENTION_DEC2_CUH
#define PT_BACKEND_CUDA_ATTENTION_DEC2_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/decode_split.cuh"
#include "backend/cuda/rope_math.cuh"

#include <cuda_fp16.h>

#include <stdint.h>
#include <type_traits>

#define D2_WARPS 8
#define D2_THREADS (D2_WARPS * 32)

/* The 16 / sizeof(KT) values of a 16-byte chunk as f32 (bf16: the bits
 * moved to the high half, exact). */
template <typename KT>
__device__ __forceinline__ void d2_cvt(const uint4 &u, float (&f)[16 / sizeof(KT)]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (sizeof(KT) == 4) {
            f[i] = __uint_as_float(w[i]);
        } else if constexpr (std::is_same<KT, __half>::value) {
            const float2 t = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
            f[2 * i] = t.x, f[2 * i + 1] = t.y;
        } else {
            f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
}

/* The launch geometry of the split decode for a cache row of R 16-byte
 * chunks and G heads per KV head: the scores kernel's lanes per key LS (the
 * power of two >= R/4: 4 chunks a lane) and keys per warp batch SKB (2 load
 * steps); the p·V kernel's lanes per key LP (the power of two >= R, at
 * least 4), chunks per lane CP (two from R = 33 on) and keys per warp batch
 * PKB (8 load steps of 16-byte chunks for up to 4 heads, else 4). */
struct d2_geom {
    int LS, SKB, LP, CP, PKB;
};
static inline d2_geom d2_geometry(int R, int G) {
    d2_geom g;
    g.LS = R <= 4 ? 1 : R <= 8 ? 2 : R <= 16 ? 4 : R <= 32 ? 8 : 16;
    g.SKB = 2 * (32 / g.LS);
    g.LP = R <= 4 ? 4 : R <= 8 ? 8 : R <= 16 ? 16 : 32;
    g.CP = R <= 32 ? 1 : 2;
    g.PKB = ((G > 4 ? 4 : 8) / g.CP) * (32 / g.LP);
    return g;
}

/* U load steps of 32/LPR keys from key jb on: chunk ci·LPR + sub of key
 * jb + u·(32/LPR) + ks into r[u][ci]; zeros past j1 or past the row. rlo:
 * the cache row of key 0 (keys wrap once: j < n <= cap). */
template <typename KT, int LPR, int C, int U>
__device__ __forceinline__ void d2_load(uint4 (&r)[U][C], const KT *base, int64_t rlo, int64_t cap, int hd, int R,
                                        int64_t jb, int64_t j1, int sub, int ks, const uint4 *nrow = nullptr,
                                        int64_t prow = -1) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t j = jb + u * (32 / LPR) + ks;
        int64_t row = rlo + j;
        if (row >= cap) row -= cap;
        const uint4 *src = reinterpret_cast<const uint4 *>(base + row * hd);
        /* the folded cache write (pt_dec_rows.kn): the new key's row comes
         * from the block's own copy (nrow, shared memory, the bytes the
         * cache gets), not from the cache block 0 is writing */
        if (nrow && row == prow) src = nrow;
#pragma unroll
        for (int ci = 0; ci < C; ci++) {
            const int c = ci * LPR + sub;
            r[u][ci] = j < j1 && c < R ? (nrow && row == prow ? src[c] : __ldg(src + c)) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* A cache element from f32, as kv_append stores it. */
__device__ __forceinline__ void d2_kv_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void d2_kv_store(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void d2_kv_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* Element d of a row rotated as rope_kv_kernel (rope.cu) rotates it, from
 * the element itself (x), its pair (y: element d + half below half, d − half
 * above) and the table values cs, sn of the pair's dim d' < half: each
 * product rounded, then their sum; dims past 2·half as they are. The same
 * expressions as rope.cu, so the same bits. dec2_short_kernel rotates from
 * registers with it; d2_rope_elem from a row in memory. */
__device__ __forceinline__ float d2_rope_pair(int d, int half, float x, float y, float cs, float sn, int bf) {
    if (d < half) return pt_rope_lo(x, y, cs, sn, bf);
    if (d < 2 * half) return pt_rope_hi(y, x, cs, sn, bf);
    return x;
}

/* Element d of a row x rotated (d2_rope_pair), the table cs, sn by dim. */
__device__ __forceinline__ float d2_rope_elem(const float *x, int d, int half, const float *cs, const float *sn,
                                              int bf) {
    if (d < half) {
        const float a = x[d], b = x[d + half];
        return d2_rope_pair(d, half, a, b, cs[d], sn[d], bf);
    }
    if (d < 2 * half) {
        const int e = d - half;
        const float a = x[e], b = x[d];
        return d2_rope_pair(d, half, b, a, cs[e], sn[e], bf);
    }
    return x[d];
}


/* The scores of one batch of keys, kr as d2_load<KT, LPR, C, U> loaded it
 * from key jb on (U steps of 32/LPR keys): a lane's partial dots for the G
 * heads (q from qs, [G, hd] in shared memory) added over the key's LPR
 * lanes; lane sub then rounds the scores of heads g ≡ sub (mod LPR) as the
 * reference does, stores them at S[g·stride + j] and pushes them into its
 * running (m[g], l[g]) (pt_softmax_push). Keys past j1 are skipped. */
template <typename KT, int LPR, int C, int U, int NG>
__device__ __forceinline__ void d2_scores_batch(const uint4 (&kr)[U][C], const float *qs, const pt_dec_rows &a,
                                                int G, int hd, int R, int64_t jb, int64_t j1, int sub, int ks,
                                                float *S, int64_t stride, float (&m)[NG], float (&l)[NG]) {
    constexpr int V = 16 / sizeof(KT), KPW = 32 / LPR;
#pragma unroll
    for (int u = 0; u < U; u++) {
        float d[NG];
#pragma unroll
        for (int g = 0; g < NG; g++) d[g] = 0.f;
#pragma unroll
        for (int ci = 0; ci < C; ci++) {
            const int c = ci * LPR + sub;
            if (c >= R) continue;
            float kf[V];
            d2_cvt<KT>(kr[u][ci], kf);
#pragma unroll
            for (int g = 0; g < NG; g++) {
                if (g >= G) break;
                const float4 *qp = reinterpret_cast<const float4 *>(qs + g * hd + c * V);
#pragma unroll
                for (int i4 = 0; i4 < V / 4; i4++) {
                    const float4 qv = qp[i4];
                    d[g] = fmaf(qv.x, kf[4 * i4], d[g]);
                    d[g] = fmaf(qv.y, kf[4 * i4 + 1], d[g]);
                    d[g] = fmaf(qv.z, kf[4 * i4 + 2], d[g]);
                    d[g] = fmaf(qv.w, kf[4 * i4 + 3], d[g]);
                }
            }
        }
        pt_lanes_sum<LPR>(d, G); /* the key's LPR lanes */
        const int64_t j = jb + u * KPW + ks;
        if (j < j1) {
#pragma unroll
            for (int g = 0; g < NG; g++) {
                if (g >= G) break;
                if (g % LPR != sub) continue;
                float s = pt_rnd(a.bf, pt_rnd(a.bf, d[g]) * a.scale);
                if (a.softcap > 0.f) s = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, s / a.softcap))) * a.softcap);
                S[(int64_t)g * stride + j] = s;
                pt_softmax_push(s, m[g], l[g]);
            }
        }
    }
}

/* d2_pv_batch's first part: the batch's KB probabilities p = round(exp(s −
 * M) / L) for the G heads (S as d2_scores_batch stored it, sM / sInv the
 * exact row max and 1/sum per head), lanes over (head, key), into the
 * warp's own buffer ps (0 past j1); the warp's lanes see them after it. */
template <int KB, int MG>
__device__ __forceinline__ void d2_pv_probs(float (&ps)[MG][KB], const float *S, int64_t stride, const float *sM,
                                            const float *sInv, int bf, int G, int64_t jb, int64_t j1, int lane) {
#pragma unroll 4
    for (int idx = lane; idx < KB * G; idx += 32) {
        const int g = idx / KB, kk = idx % KB;
        const int64_t j = jb + kk;
        ps[g][kk] = j < j1 ? pt_rnd(bf, expf(S[(int64_t)g * stride + j] - sM[g]) * sInv[g]) : 0.f;
    }
    __syncwarp();
}

/* d2_pv_batch's second part over load steps u0 .. u0 + UN − 1 of the batch
 * (vr[u] holding step u0 + u): acc[g][ci][·] += p · v for the lane's
 * chunks, the steps in order. */
template <typename KT, int LPR, int C, int UN, int MG, int KB>
__device__ __forceinline__ void d2_pv_accum(const uint4 (&vr)[UN][C], const float (&ps)[MG][KB], int u0, int G,
                                            int ks, float (&acc)[MG][C][16 / sizeof(KT)]) {
    constexpr int V = 16 / sizeof(KT), KPW = 32 / LPR;
#pragma unroll
    for (int u = 0; u < UN; u++)
#pragma unroll
        for (int ci = 0; ci < C; ci++) {
            float vf[V];
            d2_cvt<KT>(vr[u][ci], vf);
#pragma unroll
            for (int g = 0; g < MG; g++) {
                if (g >= G) break;
                const float p = ps[g][(u0 + u) * KPW + ks];
#pragma unroll
                for (int i = 0; i < V; i++) acc[g][ci][i] = fmaf(p, vf[i], acc[g][ci][i]);
            }
        }
}

/* p·V of one batch of keys, vr as d2_load<KT, LPR, C, U> loaded it from key
 * jb on: the batch's probabilities into ps (d2_pv_probs), then acc[g][ci][·]
 * += p · v for the lane's chunks (d2_pv_accum). The caller's warp calls it
 * whole (warp-synchronous). */
template <typename KT, int LPR, int C, int U, int MG>
__device__ __forceinline__ void d2_pv_batch(const uint4 (&vr)[U][C], float (&ps)[MG][U * (32 / LPR)],
                                            const float *S, int64_t stride, const float *sM, const float *sInv,
                                            int bf, int G, int64_t jb, int64_t j1, int lane, int ks,
                                            float (&acc)[MG][C][16 / sizeof(KT)]) {
    d2_pv_probs(ps, S, stride, sM, sInv, bf, G, jb, j1, lane);
    d2_pv_accum<KT, LPR, C, U>(vr, ps, 0, G, ks, acc);
    __syncwarp(); /* ps is written again by the next batch */
}

/* A p·V warp's accumulators set to zero. */
template <int MG, int C, int V>
__device__ __forceinline__ void d2_acc_zero(float (&acc)[MG][C][V]) {
#pragma unroll
    for (int g = 0; g < MG; g++)
#pragma unroll
        for (int ci = 0; ci < C; ci++)
#pragma unroll
            for (int i = 0; i < V; i++) acc[g][ci][i] = 0.f;
}

/* The warp's key slots (lanes sub, sub + LPR, ...) of acc added by an xor
 * butterfly: every lane then holds the warp's sums for its chunks. */
template <int LPR, int MG, int C, int V>
__device__ __forceinline__ void d2_pv_keys_sum(float (&acc)[MG][C][V], int G) {
#pragma unroll
    for (int o = LPR; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < MG; g++) {
            if (g >= G) break;
#pragma unroll
            for (int ci = 0; ci < C; ci++) pt_xor_add(acc[g][ci], o);
        }
}


/* A warp's p·V sums (acc after d2_pv_keys_sum) stored as [G, hd] at dst by
 * the lanes of key slot 0 (lane sub holds chunks ci·LPR + sub). */
template <int LPR, int MG, int C, int V>
__device__ __forceinline__ void d2_pv_store(const float (&acc)[MG][C][V], float *dst, int G, int hd, int R, int sub,
                                            int ks) {
    if (ks != 0) return;
#pragma unroll
    for (int g = 0; g < MG; g++) {
        if (g >= G) break;
#pragma unroll
        for (int ci = 0; ci < C; ci++) {
            const int c = ci * LPR + sub;
            if (c >= R) continue;
#pragma unroll
            for (int i = 0; i < V; i++) dst[g * hd + c * V + i] = acc[g][ci][i];
        }
    }
}

/* The exact row max and sum of one head from its used splits' (max, sum)
 * pairs (pair(s): split s's), lanes over the splits, then a warp max and
 * an xor sum; every lane gets them. The p·V kernels' merge of the splits'
 * statistics. ONE: used <= 32, so a lane reads only its own split's pair
 * (dec2_short_kernel passes the pair it holds in registers). */
template <bool ONE, typename P>
__device__ __forceinline__ void d2_row_stats_of(P pair, int64_t used, int lane, float &mx, float &L) {
    mx = -INFINITY;
    if (ONE) {
        if (lane < used) mx = fmaxf(mx, pair(lane).x);
    } else
        for (int64_t s = lane; s < used; s += 32) mx = fmaxf(mx, pair(s).x);
    mx = pt_warp_max(mx);
    L = 0.f;
    if (ONE) {
        const float2 v = pair(lane);
        if (lane < used && v.x != -INFINITY) L += v.y * expf(v.x - mx);
    } else
        for (int64_t s = lane; s < used; s += 32) {
            const float2 v = pair(s);
            if (v.x != -INFINITY) L += v.y * expf(v.x - mx);
        }
    L = pt_warp_sum(L);
}

/* d2_row_stats_of with split s's pair at ml[s·step]. */
__device__ __forceinline__ void d2_row_stats(const float2 *ml, int64_t step, int64_t used, int lane, float &mx,
                                             float &L) {
    d2_row_stats_of<false>([&](int64_t s) { return ml[s * step]; }, used, lane, mx, L);
}

#endif
