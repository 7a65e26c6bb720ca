/* GPU sampling (sample.h): one block of 1024 threads per row, the CPU
 * sampler's pipeline (src/runtime/sampler.c) with its arithmetic shared
 * through src/runtime/sample_math.h.
 *
 * Per row, in order:
 *   1. penalties: the logits are copied to the row's work buffer, the window
 *      of the token history counted into the row's counts array (atomics),
 *      and each distinct token penalised once by the thread that takes its
 *      count back to zero (atomicExch), so the array is zero again after;
 *   2. greedy: first maximum (NaN and -inf never win; none: id 0);
 *   3. temperature: candidates are the finite logits, scaled by 1/T, their
 *      max mx, p = pt_sexp(v - mx);
 *   4. top-k (k <= PT_GSAMPLE_CAP): the k-th largest 64-bit key (value key
 *      << 32 | ~id, so (value descending, id ascending) is key descending)
 *      by a radix select, 8 bits per pass (the 4 id passes only when the
 *      k-th value's ties are not all taken), exactly k candidates gathered
 *      and bitonic-sorted in shared memory;
 *      top-p without top-k: an exponent histogram of p picks the smallest
 *      probability bin whose candidates above carry the target mass (with a
 *      margin), those are gathered and sorted the same way; the exact walk
 *      then decides, and a walk that would need more candidates than were
 *      gathered answers status 1;
 *   5. the structured sums and walks of sample_math.h: thread k owns chunk
 *      k, the chunk sums are scanned in shared memory (Hillis-Steele), the
 *      first hit is the block minimum over the threads' first hits.
 * Not here: masks, top-n log-probabilities (host), the RNG (the draw comes
 * in the row table). */
#include "backend/cuda/cuda_internal.cuh"

extern "C" {
#include "backend/cuda/sample.h"
}
#include "runtime/sample_math.h"

#include <string.h>

#define GS_NT 1024
#define GS_NO_HIT 0x7fffffffffffffffLL

/* ---- block helpers (every thread of the block calls them) ---- */

__device__ __forceinline__ long long gs_block_min_ll(long long v, long long *sc) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sc[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}
__device__ __forceinline__ long long gs_block_max_ll(long long v, long long *sc) {
    return -gs_block_min_ll(-v, sc);
}
__device__ __forceinline__ long long gs_block_sum_ll(long long v, long long *sc) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sc[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* max over non-NaN values (fmaxf ignores NaN); -inf when none */
__device__ __forceinline__ float gs_block_max_f(float v, float *sc) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sc[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The structured sum of sample_math.h over terms f(j), j < m of a sequence
 * of n: sT[k] = the scanned chunk sums; returns sT[last]. */
template <class F>
__device__ double gs_scan(const F &f, int64_t n, int64_t m, double *sT) {
    const int64_t c = pt_ss_chunk(n);
    const int k = threadIdx.x;
    double S = 0;
    const int64_t a = (int64_t)k * c, b = a + c < m ? a + c : m;
    for (int64_t j = a; j < b; j++) S = __dadd_rn(S, (double)f(j));
    __syncthreads();
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
    for (int64_t j = a; j < b; j++) {
        if (j >= m) {
            hit = m;
            break;
        }
        const float v = f(j);
        cum = __dadd_rn(cum, (double)v);
        if (v > 0 && (mode == 0 ? cum >= target : target < cum)) {
            hit = j;
            break;
        }
    }
    return gs_block_min_ll(hit, sc);
}

/* Descending bitonic sort of key[0..P) (P a power of two <= PT_GSAMPLE_CAP). */
__device__ void gs_sort_desc(unsigned long long *key, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += GS_NT) {
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

struct gs_shared {
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
/* one 128-logit block's sum of exp(x - mx) in the CPU's 4-lane order */
struct gs_lse_part {
    const float *x;
    int64_t V;
    float mx;
    __device__ float operator()(int64_t q) const {
        const int64_t b = q * 128;
        const int e = V - b < 128 ? (int)(V - b) : 128;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int i = 0; i < e; i += 4)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float v = i + j < e ? x[b + i + j] : -INFINITY;
                acc[j] = __fadd_rn(acc[j], pt_sexp(__fsub_rn(v, mx)));
            }
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) part = __fadd_rn(part, acc[j]);
        return part;
    }
};

__global__ void __launch_bounds__(GS_NT) gs_kernel(const pt_gsample_row *rows, pt_gsample_out *outs, int64_t V) {
    __shared__ gs_shared sh;
    const pt_gsample_row R = rows[blockIdx.x];
    const int tid = threadIdx.x;
    const float *w = R.logits;

    /* 1. penalties */
    if (R.window > 0) {
        for (int64_t i = tid; i < V; i += GS_NT) R.work[i] = R.logits[i];
        const int32_t *h = R.hist + (R.n_hist - R.window);
        for (int64_t i = tid; i < R.window; i += GS_NT)
            if (h[i] >= 0 && h[i] < V) atomicAdd(&R.counts[h[i]], 1u);
        __syncthreads();
        for (int64_t i = tid; i < R.window; i += GS_NT) {
            const int32_t t = h[i];
            if (t < 0 || t >= V) continue;
            const uint32_t c = atomicExch(&R.counts[t], 0u);
            if (c) R.work[t] = pt_spenalty(R.work[t], R.rep, R.presence, R.frequency, c);
        }
        __syncthreads();
        w = R.work;
    }

    int32_t chosen = -1;
    int status = 0;
    if (R.greedy) {
        /* 2. first maximum */
        float best = -INFINITY;
        long long bi = GS_NO_HIT;
        for (int64_t i = tid; i < V; i += GS_NT)
            if (w[i] > best) {
                best = w[i];
                bi = i;
            }
        const float mxv = gs_block_max_f(best, sh.scf);
        const long long first = gs_block_min_ll(best == mxv && bi != GS_NO_HIT ? bi : GS_NO_HIT, sh.sc);
        chosen = first == GS_NO_HIT ? 0 : (int32_t)first;
    } else {
        /* 3. temperature */
        const float inv_t = 1.0f / R.temperature;
        float lmx = -INFINITY;
        long long lcnt = 0;
        for (int64_t i = tid; i < V; i += GS_NT) {
            const float v = w[i];
            if (!gs_cand(v)) continue;
            const float s = __fmul_rn(v, inv_t);
            lmx = s > lmx ? s : lmx;
            lcnt++;
        }
        const float mx = gs_block_max_f(lmx, sh.scf);
        const long long n_cand = gs_block_sum_ll(lcnt, sh.sc);
        if (n_cand == 0) {
            status = 1;
        } else {
            const gs_id_p idp = {w, inv_t, mx, 0.f};
            const gs_key_p kp = {sh.key, mx};
            const bool use_topk = R.top_k > 0 && R.top_k < n_cand;
            int64_t n = 0, m = 0; /* sorted sequence length, and how much of it is gathered */
            bool sorted = false;
            if (use_topk && R.top_k > PT_GSAMPLE_CAP) {
                status = 1;
            } else if (use_topk) {
                /* 4a. radix select of the k-th largest 64-bit key (value key
                 * << 32 | ~id: the sort order itself), 8 bits per pass; the id
                 * passes run only when the k-th value's ties are not all in */
                unsigned long long prefix = 0, pmask = 0;
                unsigned int krem = (unsigned int)R.top_k;
                for (int shift = 56; shift >= 0; shift -= 8) {
                    for (int i = tid; i < 256; i += GS_NT) sh.hist[i] = 0;
                    __syncthreads();
                    for (int64_t base = 0; base < V; base += GS_NT) {
                        const int64_t i = base + tid;
                        int bin = -1;
                        if (i < V && gs_cand(w[i])) {
                            const unsigned long long key =
                                ((unsigned long long)pt_sorder(__fmul_rn(w[i], inv_t)) << 32) |
                                (0xffffffffu - (uint32_t)i);
                            if ((key & pmask) == prefix) bin = (int)((key >> shift) & 255u);
                        }
                        const unsigned peers = __match_any_sync(0xffffffffu, bin);
                        if (bin >= 0 && (tid & 31) == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], __popc(peers));
                    }
                    __syncthreads();
                    if (tid == 0) {
                        unsigned int cum = 0;
                        for (int bin = 255; bin >= 0; bin--) {
                            if (cum + sh.hist[bin] >= krem) {
                                sh.selk = prefix | ((unsigned long long)bin << shift);
                                sh.sel[1] = krem - cum;
                                sh.sel[0] = sh.hist[bin];
                                break;
                            }
                            cum += sh.hist[bin];
                        }
                    }
                    __syncthreads();
                    prefix = sh.selk;
                    krem = sh.sel[1];
                    pmask |= 255ull << shift;
                    const bool all_ties = shift == 32 && sh.sel[0] == krem;
                    __syncthreads();
                    if (all_ties) break; /* every candidate of the k-th value is in */
                }
                /* gather the top k: every key at or above the selected one */
                if (tid == 0) sh.cnt = 0;
                __syncthreads();
                for (int64_t i = tid; i < V; i += GS_NT) {
                    if (!gs_cand(w[i])) continue;
                    const unsigned long long key = ((unsigned long long)pt_sorder(__fmul_rn(w[i], inv_t)) << 32) |
                                                   (0xffffffffu - (uint32_t)i);
                    if (key < prefix) continue;
                    const unsigned int at = atomicAdd(&sh.cnt, 1u);
                    if (at < PT_GSAMPLE_CAP) sh.key[at] = key;
                }
                __syncthreads();
                if (sh.cnt > PT_GSAMPLE_CAP) status = 1;
                n = m = R.top_k;
            } else if (R.top_p < 1.0f) {
                /* 4b. the nucleus: bins of p by binary exponent, from the top */
                for (int i = tid; i < 128; i += GS_NT) {
                    sh.hist[i] = 0;
                    sh.mass[i] = 0.f;
                }
                __syncthreads();
                for (int64_t base = 0; base < V; base += GS_NT) {
                    const int64_t i = base + tid;
                    int bin = -1;
                    float p = 0.f;
                    if (i < V) {
                        p = idp(i);
                        if (p > 0) bin = 127 - (int)((__float_as_uint(p) >> 23) & 255u);
                        if (bin > 127) bin = 127;
                    }
                    const unsigned peers = __match_any_sync(0xffffffffu, bin);
                    if (bin >= 0) {
                        atomicAdd(&sh.mass[bin], p);
                        if ((tid & 31) == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], __popc(peers));
                    }
                }
                __syncthreads();
                const double total = gs_scan(idp, V, V, sh.T);
                if (tid == 0) {
                    /* a margin over the float bin masses' rounding */
                    const double want = (double)R.top_p * total * (1.0 + 1e-5);
                    double cm = 0;
                    unsigned int cc = 0;
                    int sel = 127;
                    for (int bin = 0; bin < 128; bin++) {
                        cc += sh.hist[bin];
                        cm += sh.mass[bin];
                        if (cm >= want) {
                            sel = bin;
                            break;
                        }
                    }
                    sh.sel[0] = (unsigned int)sel;
                    sh.cnt = 0;
                    (void)cc;
                }
                __syncthreads();
                /* The bins' candidates need not be a prefix of the value
                 * order (p rounds), so gather every candidate at or above
                 * the smallest value among them: a true prefix. */
                const int sel = (int)sh.sel[0];
                long long lk = GS_NO_HIT;
                for (int64_t i = tid; i < V; i += GS_NT) {
                    const float p = idp(i);
                    if (!(p > 0) || 127 - (int)((__float_as_uint(p) >> 23) & 255u) > sel) continue;
                    const long long key = (long long)pt_sorder(__fmul_rn(w[i], inv_t));
                    lk = key < lk ? key : lk;
                }
                const long long kmin = gs_block_min_ll(lk, sh.sc);
                for (int64_t i = tid; i < V; i += GS_NT) {
                    if (!gs_cand(w[i])) continue;
                    const uint32_t key = pt_sorder(__fmul_rn(w[i], inv_t));
                    if ((long long)key < kmin) continue;
                    const unsigned int at = atomicAdd(&sh.cnt, 1u);
                    if (at < PT_GSAMPLE_CAP)
                        sh.key[at] = ((unsigned long long)key << 32) | (0xffffffffu - (uint32_t)i);
                }
                __syncthreads();
                if (sh.cnt > PT_GSAMPLE_CAP) status = 1;
                n = n_cand;
                m = sh.cnt;
            }
            if (status == 0 && (use_topk || R.top_p < 1.0f)) {
                sorted = true;
                const int M = (int)sh.cnt;
                int P = 1;
                while (P < M) P <<= 1;
                for (int i = M + tid; i < P; i += GS_NT) sh.key[i] = 0ull;
                __syncthreads();
                gs_sort_desc(sh.key, P);
            }
            if (status == 0 && R.top_p < 1.0f) {
                /* top-p over the sorted sequence */
                double total;
                if (use_topk) total = gs_scan(kp, n, n, sh.T);
                else total = sh.T[PT_SS_CHUNKS - 1]; /* the id-order total from 4b */
                __syncthreads();
                const double target = (double)R.top_p * total;
                gs_scan(kp, n, m, sh.T);
                const long long at = gs_walk(kp, n, m, sh.T, target, 0, sh.sc);
                if (at < m) n = at + 1;
                else if (m < n) status = 1; /* undecided within the gathered candidates */
                m = n;
            }
            if (status == 0 && sorted && R.min_p > 0) {
                /* the prefix before the first p below min_p */
                long long first = n;
                for (int64_t j = tid; j < n; j += GS_NT)
                    if (!(kp(j) >= R.min_p)) {
                        first = j;
                        break;
                    }
                n = m = gs_block_min_ll(first, sh.sc);
            }
            if (status == 0) {
                /* 5. the draw */
                if (sorted) {
                    const double sum = gs_scan(kp, n, n, sh.T);
                    const long long at = gs_walk(kp, n, n, sh.T, R.u * sum, 1, sh.sc);
                    const int64_t j = at < n ? at : n - 1;
                    chosen = (int32_t)(0xffffffffu - (uint32_t)(sh.key[j] & 0xffffffffu));
                } else {
                    const gs_id_p fp = {w, inv_t, mx, R.min_p};
                    const double sum = gs_scan(fp, V, V, sh.T);
                    const long long at = gs_walk(fp, V, V, sh.T, R.u * sum, 1, sh.sc);
                    if (at < V) {
                        chosen = (int32_t)at;
                    } else {
                        long long last = -1;
                        for (int64_t i = tid; i < V; i += GS_NT)
                            if (fp(i) > 0) last = i;
                        chosen = (int32_t)gs_block_max_ll(last, sh.sc);
                    }
                }
            }
        }
    }
    /* the chosen token's log-probability over the raw logits */
    float logprob = 0.f;
    if (status == 0 && R.want_logprob) {
        float lmx = -INFINITY;
        for (int64_t i = tid; i < V; i += GS_NT) lmx = fmaxf(lmx, R.logits[i]);
        const float mx = gs_block_max_f(lmx, sh.scf);
        const gs_lse_part part = {R.logits, V, mx};
        const double sum = gs_scan(part, (V + 127) / 128, (V + 127) / 128, sh.T);
        const double lse = (double)mx + log(sum);
        logprob = (float)((double)R.logits[chosen] - lse);
    }
    if (tid == 0) {
        pt_gsample_out o;
        o.id = status == 0 ? chosen : -1;
        o.status = status;
        o.logprob = logprob;
        o.pad = 0;
        outs[blockIdx.x] = o;
        if (status == 0 && R.id_slot) *R.id_slot = chosen;
    }
}

extern "C" size_t pt_gsample_ctl_bytes(int B) {
    size_t rows = ((size_t)B * sizeof(pt_gsample_row) + 255) & ~(size_t)255;
    return rows + (size_t)B * sizeof(pt_gsample_out);
}

extern "C" pt_status pt_cuda_sample_rows(pt_backend *be, const pt_gsample_row *rows, int B, int64_t V,
                                         void *ctl_dev, int rows_current, pt_gsample_out *out) {
    if (!be || strcmp(be->ops->name, "cuda"))
        return pt_error(PT_ERR_UNSUPPORTED, "GPU sampling: the model does not run on the CUDA backend");
    if (B < 1 || V < 1 || !ctl_dev) return pt_error(PT_ERR_INTERNAL, "GPU sampling: bad call (%d rows)", B);
    pt_cuda *c = pt_cuda_of(be);
    size_t rows_bytes = ((size_t)B * sizeof(pt_gsample_row) + 255) & ~(size_t)255;
    pt_gsample_row *rows_dev = (pt_gsample_row *)ctl_dev;
    pt_gsample_out *outs_dev = (pt_gsample_out *)((char *)ctl_dev + rows_bytes);
    if (!rows_current)
        CUDA_CHECK(cudaMemcpyAsync(rows_dev, rows, (size_t)B * sizeof *rows, cudaMemcpyHostToDevice, c->stream));
    gs_kernel<<<B, GS_NT, 0, c->stream>>>(rows_dev, outs_dev, V);
    CUDA_CHECK_LAUNCH("sample");
    CUDA_CHECK(cudaMemcpyAsync(out, outs_dev, (size_t)B * sizeof *out, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return pt_cuda_check_errors(c);
}
