/* GPU sampling, one block per row (sample.h, sample.cuh): gs_kernel, one
 * block of GS_NT = 1024 threads per row, for the rows the multi-block path
 * (sample.cu) does not take (penalties, top-p without top-k, top-k too
 * large for the slices) or every row with PETREL_CUDA_SAMPLE_MB=0; the
 * arithmetic of the CPU sampler (src/runtime/sampler.c) through
 * src/runtime/sample_math.h, in the same order.
 *
 * gs_kernel, per row, in order:
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
 * Not here: the multi-block passes and every host entry point (sample.cu),
 * the pieces shared with them (sample.cuh). */
#include "backend/cuda/sample.cuh"

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

__global__ void __launch_bounds__(GS_NT)
    gs_kernel(const pt_gsample_row *rows, pt_gsample_out *outs, int64_t V, int mb_on, const int *err_src, int *err_dst) {
    __shared__ gs_shared sh;
    const pt_gsample_row R = rows[blockIdx.x];
    const int tid = threadIdx.x;
    if (err_src && blockIdx.x == 0 && tid < 2) err_dst[tid] = err_src[tid];
    if (mb_on && gs_mb_row(R, V)) return; /* the multi-block kernels take this row */
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
                n = m = gs_minp_prefix(kp, n, R.min_p, sh.sc);
            }
            if (status == 0) {
                /* 5. the draw */
                if (sorted) {
                    chosen = gs_draw_sorted(kp, n, R.u, sh.T, sh.sc);
                } else {
                    const gs_id_p fp = {w, inv_t, mx, R.min_p};
                    const double sum = gs_scan(fp, V, V, sh.T);
                    gs_draw_ids(fp, V, sh.T, R.u * sum, sh.sc, chosen, NULL);
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
        logprob = gs_logprob(R.logits, chosen, mx, sum);
    }
    gs_store_out(outs, R, status, chosen, logprob);
}

pt_status pt_gsample_oneblock_launch(const pt_gsample_row *rows, pt_gsample_out *outs, int B, int64_t V, int mb_on,
                                     const int *err_src, int *err_dst, cudaStream_t stream) {
    gs_kernel<<<B, GS_NT, 0, stream>>>(rows, outs, V, mb_on, err_src, err_dst);
    CUDA_CHECK_LAUNCH("sample");
    return PT_OK;
}
