/* Device pieces of the GPU sampler (sample.h) shared by its two forms:
 * gs_kernel, one block of GS_NT threads per row (sample_oneblock.cu), and
 * the multi-block passes (sample.cu). Here: the block reductions, the
 * structured sums and walks of runtime/sample_math.h (gs_scan, gs_walk),
 * the bitonic sort, the kernels' shared-memory layout (gs_shared), the p of
 * a sorted key or of an id (gs_key_p, gs_id_p), the top-k slice choice and
 * the predicate that sends a row to the multi-block path (gs_topk_slice,
 * gs_mb_row: host and device), and the tail that gs_kernel and gs_mb_pass3
 * share (the min-p prefix, the draws, the log-probability, the result
 * store). Each is inlined or instantiated in the file that uses it, so the
 * kernels compile to the code they had when all of this was one file
 * (dev/sass_same.sh compares them).
 * Not here: the kernels, and host code other than the two predicates and
 * the one-block launcher's declaration. */
#ifndef PT_BACKEND_CUDA_SAMPLE_CUH
#define PT_BACKEND_CUDA_SAMPLE_CUH

#include "backend/cuda/cuda_internal.cuh"

extern "C" {
#include "backend/cuda/sample.h"
}
#include "runtime/sample_math.h"

#define GS_NT 1024
#define GS_BATCH 8 /* terms per batch of a chunk's sum or walk */
#define GS_NO_HIT 0x7fffffffffffffffLL

/* ---- block helpers (every thread of the block calls them) ---- */

/* butterfly reductions over a warp: every lane gets the result */
__device__ __forceinline__ long long gs_warp_min_ll(long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}
__device__ __forceinline__ long long gs_warp_sum_ll(long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* (the float max is common.cuh's pt_warp_max: fmaxf, NaN ignored) */


__device__ __forceinline__ long long gs_block_min_ll(long long v, long long *sc) {
    v = gs_warp_min_ll(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sc[threadIdx.x & 31];
    v = gs_warp_min_ll(v);
    return v;
}
__device__ __forceinline__ long long gs_block_max_ll(long long v, long long *sc) {
    return -gs_block_min_ll(-v, sc);
}
__device__ __forceinline__ long long gs_block_sum_ll(long long v, long long *sc) {
    v = gs_warp_sum_ll(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sc[threadIdx.x & 31];
    v = gs_warp_sum_ll(v);
    return v;
}
/* max over non-NaN values (fmaxf ignores NaN); -inf when none */
__device__ __forceinline__ float gs_block_max_f(float v, float *sc) {
    v = pt_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sc[threadIdx.x & 31];
    v = pt_warp_max(v);
    return v;
}

/* The inclusive scan of the chunk sums, thread k holding chunk k's S:
 * sT[k] = S_0 + ... + S_k (Hillis-Steele, doubles rounded per add);
 * returns the total. The caller has passed a barrier since sT was last read. */
__device__ __forceinline__ double gs_scan_chunks(double *sT, int k, double S) {
    sT[k] = S;
    __syncthreads();
    for (int d = 1; d < PT_SS_CHUNKS; d <<= 1) {
        double v = k >= d ? __dadd_rn(sT[k - d], sT[k]) : sT[k];
        __syncthreads();
        sT[k] = v;
        __syncthreads();
    }
    return sT[PT_SS_CHUNKS - 1];
}

/* The structured sum of sample_math.h over terms f(j), j < m of a sequence
 * of n: sT[k] = the scanned chunk sums; returns sT[last]. */
template <class F>
__device__ double gs_scan(const F &f, int64_t n, int64_t m, double *sT) {
    const int64_t c = pt_ss_chunk(n);
    const int k = threadIdx.x;
    double S = 0;
    const int64_t a = (int64_t)k * c, b = a + c < m ? a + c : m;
    /* GS_BATCH terms evaluated (their loads in flight together), then
     * added in order: the same sum as one term at a time */
    for (int64_t j0 = a; j0 < b; j0 += GS_BATCH) {
        float v[GS_BATCH];
#pragma unroll
        for (int u = 0; u < GS_BATCH; u++) v[u] = j0 + u < b ? f(j0 + u) : 0.f;
#pragma unroll
        for (int u = 0; u < GS_BATCH; u++)
            if (j0 + u < b) S = __dadd_rn(S, (double)v[u]);
    }
    __syncthreads();
    return gs_scan_chunks(sT, k, S);
}

/* The walk of sample_math.h (mode 0: cum >= target, mode 1: target < cum)
 * after gs_scan over the same (n, m). Returns the hit's position (< m), m
 * when undecided (m < n and no hit before m), GS_NO_HIT when nothing hits. */
template <class F>
__device__ long long gs_walk(const F &f, int64_t n, int64_t m, const double *sT, double target, int mode,
                             long long *sc) {
    const int64_t c = pt_ss_chunk(n);
    const int k = threadIdx.x;
    const int64_t a = (int64_t)k * c, b = a + c < n ? a + c : n;
    long long hit = GS_NO_HIT;
    double cum = k ? sT[k - 1] : 0.0;
    /* batched as in gs_scan: terms past a hit are evaluated and ignored */
    for (int64_t j0 = a; j0 < b && hit == GS_NO_HIT; j0 += GS_BATCH) {
        float v[GS_BATCH];
#pragma unroll
        for (int u = 0; u < GS_BATCH; u++) v[u] = j0 + u < b && j0 + u < m ? f(j0 + u) : 0.f;
#pragma unroll
        for (int u = 0; u < GS_BATCH; u++) {
            const int64_t j = j0 + u;
            if (hit != GS_NO_HIT || j >= b) break;
            if (j >= m) {
                hit = m;
                break;
            }
            cum = __dadd_rn(cum, (double)v[u]);
            if (v[u] > 0 && (mode == 0 ? cum >= target : target < cum)) hit = j;
        }
    }
    return gs_block_min_ll(hit, sc);
}

/* Descending bitonic sort of key[0..P) (P a power of two) by the whole block.
 * static: each file that includes this header has its own copy (nvcc emits a
 * host stub for a __device__ function). */
static __device__ void gs_sort_desc(unsigned long long *key, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const unsigned long long a = key[i], b = key[ixj];
                    const bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) {
                        key[i] = b;
                        key[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
}

__device__ __forceinline__ bool gs_cand(float v) { return v > -INFINITY && !isnan(v); }

/* The shared memory of gs_kernel and gs_mb_pass3. 16-byte aligned: nvcc
 * aligns the static shared memory of every kernel of a file that has a
 * kernel with dynamic shared memory (gs_mb_topk, sample.cu) to 16 bytes,
 * which rounds this struct's allocation up by 8 bytes; the alignment keeps
 * gs_kernel's (sample_oneblock.cu) at the 43936 bytes it had there, and
 * both kernels compile to the same code as before (dev/sass_same.sh). */
struct __align__(16) gs_shared {
    unsigned long long key[PT_GSAMPLE_CAP]; /* gathered candidates: value key << 32 | ~id */
    double T[PT_SS_CHUNKS];                 /* the scan */
    long long sc[32];
    float scf[32];
    unsigned int hist[256];
    float mass[128];
    unsigned long long selk;
    unsigned int cnt;
    unsigned int sel[2];
};

/* p of a gathered key */
struct gs_key_p {
    const unsigned long long *key;
    float mx;
    __device__ float operator()(int64_t j) const {
        return pt_sexp(__fsub_rn(pt_sorder_inv((uint32_t)(key[j] >> 32)), mx));
    }
};
/* p of id i in id order (0 for non-candidates and below min_p) */
struct gs_id_p {
    const float *w;
    float inv_t, mx, min_p;
    __device__ float operator()(int64_t i) const {
        const float v = w[i];
        if (!gs_cand(v)) return 0.f;
        const float p = pt_sexp(__fsub_rn(__fmul_rn(v, inv_t), mx));
        return p < min_p ? 0.f : p;
    }
};

/* Top-k on the multi-block path: each block keeps the k largest keys of a
 * slice of GS_TK_MIN..GS_TK_MAX entries (a power of two, sorted in shared
 * memory), and the union of the slices' top k, at most PT_GSAMPLE_CAP keys,
 * holds the row's top k. The slice for (V, k), or 0 when no slice size
 * keeps the union within PT_GSAMPLE_CAP. */
#define GS_TK_MIN 2048
#define GS_TK_MAX 8192
__host__ __device__ __forceinline__ int64_t gs_topk_slice(int64_t V, int64_t k) {
    if (k <= 0) return 0;
    for (int64_t S = GS_TK_MIN; S <= GS_TK_MAX; S <<= 1)
        if (k <= S && (V + S - 1) / S * k <= PT_GSAMPLE_CAP) return S;
    return 0;
}

/* The rows the multi-block path (sample.cu) samples: no penalties;
 * greedy, or a draw over every candidate (no top-k: min-p is a per-token
 * test there, top-p needs the whole sorted order and stays in gs_kernel),
 * or top-k whose slices' union fits (gs_topk_slice; top-p and min-p then
 * run over the sorted top k). The rest runs in gs_kernel. Host and device
 * use this one predicate. */
__host__ __device__ __forceinline__ bool gs_mb_row(const pt_gsample_row &R, int64_t V) {
    if (R.window > 0) return false;
    if (R.greedy) return true;
    return R.top_k == 0 ? R.top_p >= 1.0f : gs_topk_slice(V, R.top_k) > 0;
}

/* Pieces gs_kernel and gs_mb_pass3 share (inlined: each kernel's code is
 * what it was when the pieces were written out in both). */

/* min-p over a sorted sequence of n: the prefix before the first p below
 * min_p (the block's smallest such j, n when none) */
__device__ __forceinline__ long long gs_minp_prefix(const gs_key_p &kp, int64_t n, float min_p, long long *sc) {
    long long first = n;
    for (int64_t j = (int)threadIdx.x; j < n; j += GS_NT)
        if (!(kp(j) >= min_p)) {
            first = j;
            break;
        }
    return gs_block_min_ll(first, sc);
}

/* the draw over the first n sorted keys: the id of the key where the
 * running sum passes u * (their sum) (the last one when rounding runs past) */
__device__ __forceinline__ int32_t gs_draw_sorted(const gs_key_p &kp, int64_t n, double u, double *sT, long long *sc) {
    const double sum = gs_scan(kp, n, n, sT);
    const long long at = gs_walk(kp, n, n, sT, u * sum, 1, sc);
    const int64_t j = at < n ? at : n - 1;
    return (int32_t)(0xffffffffu - (uint32_t)(kp.key[j] & 0xffffffffu));
}

/* the draw in id order once sT holds the scan: the id where the running
 * sum passes target, or, when rounding runs past the end, the last id with
 * a positive p; when there is none either (-1), *status (if given) gets 1 */
__device__ __forceinline__ void gs_draw_ids(const gs_id_p &fp, int64_t V, const double *sT, double target,
                                            long long *sc, int32_t &chosen, int *status) {
    const long long at = gs_walk(fp, V, V, sT, target, 1, sc);
    if (at < V) {
        chosen = (int32_t)at;
    } else {
        long long last = -1;
        for (int64_t i = (int)threadIdx.x; i < V; i += GS_NT)
            if (fp(i) > 0) last = i;
        chosen = (int32_t)gs_block_max_ll(last, sc);
        if (status && chosen < 0) *status = 1;
    }
}

/* log p(chosen) = logit - (mx + log(sum of exp(logit - mx))) */
__device__ __forceinline__ float gs_logprob(const float *logits, int32_t chosen, float mx, double sum) {
    const double lse = (double)mx + log(sum);
    return (float)((double)logits[chosen] - lse);
}

/* thread 0 stores a row's result (id -1 unless status 0) and, on success,
 * the id in the row's id slot */
__device__ __forceinline__ void gs_store_out(pt_gsample_out *outs, const pt_gsample_row &R, int status,
                                             int32_t chosen, float logprob, bool slot = true) {
    if (threadIdx.x == 0) {
        pt_gsample_out o;
        o.id = status == 0 ? chosen : -1;
        o.status = status;
        o.logprob = logprob;
        o.pad = 0;
        outs[blockIdx.x] = o;
        if (slot && status == 0 && R.id_slot) *R.id_slot = chosen;
    }
}

/* sample_oneblock.cu: enqueues gs_kernel over the B rows at rows (device)
 * on stream, results to outs; with mb_on the rows gs_mb_row takes are left
 * to the multi-block kernels; err_src (or NULL): the backend's 2 error
 * words, which block 0 copies to err_dst. */
pt_status pt_gsample_oneblock_launch(const pt_gsample_row *rows, pt_gsample_out *outs, int B, int64_t V, int mb_on,
                                     const int *err_src, int *err_dst, cudaStream_t stream);

#endif
