/* GPU sampling (sample.h): the CPU sampler's pipeline
 * (src/runtime/sampler.c) with its arithmetic shared through
 * src/runtime/sample_math.h, in two forms:
 *   - rows without penalties that are greedy, draw over every candidate
 *     (temperature, min-p) or take a top-k whose slices fit (then top-p and
 *     min-p over it) run on the whole GPU: three or four multi-block
 *     kernels (see "the multi-block path" below) with the same arithmetic
 *     in the same order;
 *   - every other row (penalties, top-p without top-k, top-k too large for
 *     the slices) runs gs_kernel, one block of 1024 threads per row
 *     (sample_oneblock.cu, which lists its steps).
 * PETREL_CUDA_SAMPLE_MB=0 sends every row to gs_kernel (A/B).
 *
 * This file: the multi-block kernels, the launches of a call (gs_enqueue),
 * pt_cuda_sample_rows and the pipelined decode's one-row sample (the pipe).
 * Not here: gs_kernel (sample_oneblock.cu), the device pieces both forms
 * share (sample.cuh), masks, top-n log-probabilities (host), the RNG (the
 * draw comes in the row table). */
#include "backend/cuda/sample.cuh"

#include <stddef.h>
#include <string.h>

/* ---- the multi-block path ----
 *
 * gs_kernel runs a row on one SM; a greedy row of a 128k vocabulary took
 * ~80 us there, most of it the log-probability's 1002 blocks of 128
 * exponentials on 1024 threads. For the rows gs_mb_row takes, three
 * kernels (four with top-k) spread the same arithmetic over the GPU:
 *   pass 1 (grid [n1, B] x 256): slice s of the row (gs_mb_slice entries)
 *     -> its max of the raw logits (fmaxf: NaN ignored), its first maximum
 *     (value, id: "v > best" from -inf, so NaN and -inf never win), the max
 *     of its scaled candidates and their count;
 *   top-k (grid [slices, B] x 256, top-k rows only): each slice's k
 *     largest keys (gs_topk_slice: their union holds the row's top k);
 *   pass 2 (grid [GS_LSE_BLOCKS + draw blocks, B] x 128): the chunk sums of
 *     sample_math.h's structured sums, chunk k -> S[k] in double, each
 *     summed left to right exactly as one thread of gs_kernel's gs_scan
 *     does: the log-sum-exp's 128-logit parts (4 threads per part, each the
 *     CPU's lane j: terms j, j + 4, ...; the part = ((a0 + a1) + a2) + a3)
 *     and, for a draw, p of every id in id order (one thread per chunk);
 *     the log-sum-exp only for rows that want a log-probability
 *     (want_logprob: pt_sampling_params.no_logprob 0), and no pass 2 at
 *     all when every row is greedy without one;
 *   pass 3 (grid B x 1024): gs_kernel's per-row logic on the reduced data:
 *     the maxima and the first maximum over the slices (the smallest id
 *     among the slices holding the maximum: slices are in id order), the
 *     Hillis-Steele scans of the loaded chunk sums, the draw's walk
 *     (gs_walk, unchanged) or, for top-k, gs_kernel's sorted tail over the
 *     sorted union (top-p, min-p, the draw), the log-probability.
 * The values that reach a decision are bit-identical to gs_kernel's and
 * the CPU sampler's. The passes chain by programmatic dependent launch
 * (each starts with pt_release_dependents; pt_wait_primary). */
#define GS_P1_NT 256
#define GS_P2_NT 128
#define GS_P1_MAX 256                        /* slices per row at most */
#define GS_LSE_CPB 32                        /* log-sum-exp chunks per pass-2 block */
#define GS_LSE_BLOCKS (PT_SS_CHUNKS / GS_LSE_CPB)
#define GS_DRAW_BLOCKS (PT_SS_CHUNKS / GS_P2_NT)

struct gs_p1 {                               /* one slice's pass-1 result */
    float rawmax, best, smax;
    int32_t besti;                           /* -1: no maximum in the slice */
    uint32_t cnt;
    uint32_t pad[3];
};
/* A row's scratch: [GS_P1_MAX] gs_p1, the log-sum-exp chunk sums, the
 * draw's, the top-k slices' keys (slice b's k largest at [b k, b k + k)). */
#define GS_SCR_S ((size_t)GS_P1_MAX * sizeof(gs_p1))
#define GS_SCR_TK (GS_SCR_S + 2 * PT_SS_CHUNKS * sizeof(double))
#define GS_ROW_SCR (GS_SCR_TK + (size_t)PT_GSAMPLE_CAP * sizeof(unsigned long long))

/* Entries per pass-1 slice: at least 2048 (8 per thread), a multiple of 256,
 * and at most GS_P1_MAX slices. */
static inline int64_t gs_mb_slice(int64_t V) {
    int64_t s = (V + GS_P1_MAX - 1) / GS_P1_MAX;
    s = (s + 255) / 256 * 256;
    return s < 2048 ? 2048 : s;
}

/* Reductions over a block of any multiple of 32 threads (every thread calls). */
__device__ __forceinline__ float gs_red_max_f(float v, float *sc) {
    v = pt_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? sc[threadIdx.x & 31] : -INFINITY;
    v = pt_warp_max(v);
    return v;
}
__device__ __forceinline__ long long gs_red_min_ll(long long v, long long *sc) {
    v = gs_warp_min_ll(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? sc[threadIdx.x & 31] : GS_NO_HIT;
    v = gs_warp_min_ll(v);
    return v;
}

__device__ __forceinline__ char *gs_row_scr(char *scr, int row) { return scr + (size_t)row * GS_ROW_SCR; }

__global__ void __launch_bounds__(GS_P1_NT) gs_mb_pass1(const pt_gsample_row *rows, char *scr, int64_t V, int64_t slice) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ float scf[32];
    __shared__ long long sc[32];
    const pt_gsample_row &R = rows[blockIdx.y];
    if (!gs_mb_row(R, V)) return;
    const float *x = R.logits;
    const bool draw = !R.greedy;
    const float inv_t = draw ? 1.0f / R.temperature : 1.0f;
    const int64_t a = (int64_t)blockIdx.x * slice, b = a + slice < V ? a + slice : V;
    float rmx = -INFINITY, best = -INFINITY, smx = -INFINITY;
    long long bi = GS_NO_HIT;
    unsigned cnt = 0;
    for (int64_t i0 = a + threadIdx.x; i0 < b; i0 += GS_BATCH * GS_P1_NT) {
        float xv[GS_BATCH]; /* the loads in flight together */
#pragma unroll
        for (int u = 0; u < GS_BATCH; u++) xv[u] = i0 + u * GS_P1_NT < b ? x[i0 + u * GS_P1_NT] : -INFINITY;
#pragma unroll
        for (int u = 0; u < GS_BATCH; u++) {
            const int64_t i = i0 + u * GS_P1_NT;
            if (i >= b) break;
            const float v = xv[u];
            rmx = fmaxf(rmx, v);
            if (v > best) { /* ids ascend per thread: the thread's first maximum */
                best = v;
                bi = i;
            }
            if (draw && gs_cand(v)) {
                const float sv = __fmul_rn(v, inv_t);
                smx = sv > smx ? sv : smx;
                cnt++;
            }
        }
    }
    rmx = gs_red_max_f(rmx, scf);
    const float bmx = gs_red_max_f(best, scf);
    bi = gs_red_min_ll(best == bmx && bi != GS_NO_HIT ? bi : GS_NO_HIT, sc);
    smx = gs_red_max_f(smx, scf);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = cnt;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned total = 0;
        for (int w = 0; w < GS_P1_NT / 32; w++) total += (unsigned)sc[w];
        gs_p1 o;
        memset(&o, 0, sizeof o);
        o.rawmax = rmx;
        o.best = bmx;
        o.besti = bi == GS_NO_HIT ? -1 : (int32_t)bi;
        o.smax = smx;
        o.cnt = total;
        ((gs_p1 *)gs_row_scr(scr, blockIdx.y))[blockIdx.x] = o;
    }
}

__global__ void __launch_bounds__(GS_P2_NT) gs_mb_pass2(const pt_gsample_row *rows, char *scr, int64_t V, int n1) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ float scf[32];
    __shared__ float pbuf[GS_P2_NT / 4];
    const pt_gsample_row &R = rows[blockIdx.y];
    if (!gs_mb_row(R, V)) return;
    const bool lse = blockIdx.x < GS_LSE_BLOCKS;
    if (lse ? !R.want_logprob : R.greedy) return; /* no log-probability asked for / no draw */
    char *rs = gs_row_scr(scr, blockIdx.y);
    const gs_p1 *p1 = (const gs_p1 *)rs;
    double *S = (double *)(rs + GS_SCR_S) + (lse ? 0 : PT_SS_CHUNKS);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n1; j += GS_P2_NT) m = fmaxf(m, lse ? p1[j].rawmax : p1[j].smax);
    const float mx = gs_red_max_f(m, scf);
    const int tid = threadIdx.x;
    if (lse) {
        /* chunks [k0, k0 + GS_LSE_CPB) of the 128-logit parts (gs_lse_part) */
        const int64_t nparts = (V + 127) / 128, cp = pt_ss_chunk(nparts);
        const int64_t k0 = (int64_t)blockIdx.x * GS_LSE_CPB, pb = k0 * cp;
        int64_t np = GS_LSE_CPB * cp;
        if (np > nparts - pb) np = nparts - pb; /* may be <= 0: the chunks are empty */
        double acc_s = 0;                        /* thread t < GS_LSE_CPB: chunk k0 + t */
        const int q4 = tid >> 2, j = tid & 3;
        for (int64_t r0 = 0; r0 < np; r0 += GS_P2_NT / 4) {
            const int64_t q = r0 + q4;
            float acc = 0.f;
            if (q < np) {
                const int64_t b = (pb + q) * 128;
                const int e = V - b < 128 ? (int)(V - b) : 128;
                const float *x = R.logits + b;
                float xv[32]; /* lane j's terms j, j + 4, ..., all loads in flight together */
#pragma unroll
                for (int t = 0; t < 32; t++) xv[t] = 4 * t + j < e ? x[4 * t + j] : -INFINITY;
#pragma unroll
                for (int t = 0; t < 32; t++)
                    if (4 * t < e) acc = __fadd_rn(acc, pt_sexp(__fsub_rn(xv[t], mx)));
            }
            /* the part: ((0 + a0) + a1) + a2) + a3, in lane 4 q4 */
            const float a1 = __shfl_down_sync(0xffffffffu, acc, 1), a2 = __shfl_down_sync(0xffffffffu, acc, 2),
                        a3 = __shfl_down_sync(0xffffffffu, acc, 3);
            __syncthreads();
            if (j == 0) pbuf[q4] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(0.f, acc), a1), a2), a3);
            __syncthreads();
            if (tid < GS_LSE_CPB) {
                /* chunk t's parts within this round, in order */
                int64_t lo = (int64_t)tid * cp, hi = lo + cp;
                if (lo < r0) lo = r0;
                if (hi > r0 + GS_P2_NT / 4) hi = r0 + GS_P2_NT / 4;
                if (hi > np) hi = np;
                for (int64_t qq = lo; qq < hi; qq++) acc_s = __dadd_rn(acc_s, (double)pbuf[qq - r0]);
            }
        }
        if (tid < GS_LSE_CPB && k0 + tid < PT_SS_CHUNKS) S[k0 + tid] = acc_s;
    } else {
        /* the draw: chunk k of p over ids (gs_id_p with min-p) */
        const int64_t k = (int64_t)(blockIdx.x - GS_LSE_BLOCKS) * GS_P2_NT + tid;
        if (k >= PT_SS_CHUNKS) return;
        const gs_id_p fp = {R.logits, 1.0f / R.temperature, mx, R.min_p};
        const int64_t c = pt_ss_chunk(V), a = k * c, b = a + c < V ? a + c : V;
        double acc_s = 0;
        for (int64_t i0 = a; i0 < b; i0 += GS_BATCH) {
            float v[GS_BATCH];
#pragma unroll
            for (int u = 0; u < GS_BATCH; u++) v[u] = i0 + u < b ? fp(i0 + u) : 0.f;
#pragma unroll
            for (int u = 0; u < GS_BATCH; u++)
                if (i0 + u < b) acc_s = __dadd_rn(acc_s, (double)v[u]);
        }
        S[k] = acc_s;
    }
}

/* Top-k, per slice: the slice's keys (value key << 32 | ~id; 0 for
 * non-candidates and past the row's end, below every candidate's key)
 * sorted in shared memory, its k largest to the row's scratch. */
__global__ void __launch_bounds__(GS_P1_NT) gs_mb_topk(const pt_gsample_row *rows, char *scr, int64_t V) {
    pt_release_dependents();
    pt_wait_primary();
    extern __shared__ unsigned long long tk[];
    const pt_gsample_row &R = rows[blockIdx.y];
    if (!gs_mb_row(R, V) || R.greedy || R.top_k == 0) return;
    const int64_t S = gs_topk_slice(V, R.top_k), k = R.top_k;
    if ((int64_t)blockIdx.x * S >= V) return;
    const float inv_t = 1.0f / R.temperature;
    const int64_t a = (int64_t)blockIdx.x * S;
    for (int64_t i = threadIdx.x; i < S; i += GS_P1_NT) {
        const int64_t g = a + i;
        unsigned long long key = 0ull;
        if (g < V && gs_cand(R.logits[g]))
            key = ((unsigned long long)pt_sorder(__fmul_rn(R.logits[g], inv_t)) << 32) | (0xffffffffu - (uint32_t)g);
        tk[i] = key;
    }
    __syncthreads();
    gs_sort_desc(tk, (int)S);
    unsigned long long *out = (unsigned long long *)(gs_row_scr(scr, blockIdx.y) + GS_SCR_TK) + blockIdx.x * k;
    for (int64_t j = threadIdx.x; j < k; j += GS_P1_NT) out[j] = tk[j];
}

/* gs_scan's scan over chunk sums already computed (S: global). */
__device__ double gs_scan_loaded(const double *S, double *sT) {
    const int k = threadIdx.x;
    __syncthreads();
    return gs_scan_chunks(sT, k, S[k]);
}

/* The row's first maximum over its n1 pass-1 slices (the smallest id among
 * the slices holding the maximum: slices are in id order), as pass 3 takes
 * it; 0 when no slice has one. Every thread of the block calls (blockDim
 * >= n1). */
__device__ __forceinline__ int32_t gs_first_max(const gs_p1 *p1, int n1, float *scf, long long *sc) {
    float best = -INFINITY;
    int32_t bi = -1;
    if ((int)threadIdx.x < n1) best = p1[threadIdx.x].best, bi = p1[threadIdx.x].besti;
    const float bmx = gs_red_max_f(best, scf);
    const long long first = gs_red_min_ll(best == bmx && bi >= 0 ? bi : GS_NO_HIT, sc);
    return first == GS_NO_HIT ? 0 : (int32_t)first;
}

/* The pipelined decode's greedy id ahead of the log-probability
 * (PETREL_CUDA_SAMPLE_EARLY_ID): pass 3's greedy choice — the first maximum
 * over the slices of pass 1 — into each row's id_slot, so the next step
 * does not wait for pass 2 and pass 3, which then run on the pipe's side
 * stream and leave the slots alone. Max and min are exact in any order, so
 * the id is pass 3's. Grid B x GS_P1_MAX (a block per row, a thread per
 * slice): the one-row pipelined decode and the server's pipelined turn
 * when every row is greedy. outs (else NULL): no row wants a
 * log-probability, so this is the last pass — each row's result as pass 3
 * stores it (status 0, logprob 0), and block 0 copies the backend's error
 * words next to the results. */
__global__ void __launch_bounds__(GS_P1_MAX) gs_mb_greedy_id(const pt_gsample_row *rows, char *scr, int n1,
                                                             pt_gsample_out *outs, const int *err_src, int *err_dst) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ float scf[32];
    __shared__ long long sc[32];
    const pt_gsample_row &R = rows[blockIdx.x];
    if (outs && err_src && blockIdx.x == 0 && threadIdx.x < 2) err_dst[threadIdx.x] = err_src[threadIdx.x];
    if (!R.id_slot && !outs) return;
    const int32_t id = gs_first_max((const gs_p1 *)gs_row_scr(scr, blockIdx.x), n1, scf, sc);
    if (threadIdx.x == 0 && R.id_slot) *R.id_slot = id;
    if (outs) gs_store_out(outs, R, 0, id, 0.f, false);
}

/* The sample inside a decode step (pt_cuda_sample_greedy_launch): the
 * greedy id of row 0 exactly as gs_mb_greedy_id forms it, into the row's
 * id_slot and, with the backend's error words, into result slot pos & 1 of
 * the step at position pos = *pos_next, which then advances by one (every
 * reader of it in the step has finished). Two slots: the host's copy of
 * step pos's result may still be in flight while step pos + 1 runs. */
__global__ void __launch_bounds__(GS_P1_MAX) gs_step_greedy(const pt_gsample_row *rows, char *scr, int n1,
                                                            pt_gsample_step_out *slots, const int *err_src,
                                                            int32_t *pos_next) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ float scf[32];
    __shared__ long long sc[32];
    const int32_t pos = *pos_next; /* read by every thread before thread 0 advances it */
    const pt_gsample_row &R = rows[0];
    const int32_t id = gs_first_max((const gs_p1 *)gs_row_scr(scr, 0), n1, scf, sc);
    pt_gsample_step_out *o = &slots[pos & 1];
    if (threadIdx.x < 2) o->err[threadIdx.x] = err_src[threadIdx.x];
    if (threadIdx.x == 0) {
        if (R.id_slot) *R.id_slot = id;
        o->out.id = id;
        o->out.status = 0;
        o->out.logprob = 0.f;
        o->out.pad = 0;
        *pos_next = pos + 1;
    }
}

/* slot 0: the id_slot was written by gs_mb_greedy_id */
__global__ void __launch_bounds__(GS_NT) gs_mb_pass3(const pt_gsample_row *rows, pt_gsample_out *outs, char *scr,
                                                     int64_t V, int n1, const int *err_src, int *err_dst, int slot) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ gs_shared sh;
    double *sT = sh.T;
    long long *sc = sh.sc;
    float *scf = sh.scf;
    const int tid = threadIdx.x;
    if (err_src && blockIdx.x == 0 && tid < 2) err_dst[tid] = err_src[tid];
    const pt_gsample_row R = rows[blockIdx.x];
    if (!gs_mb_row(R, V)) return;
    const char *rs = gs_row_scr(scr, blockIdx.x);
    const double *S_lse = (const double *)(rs + GS_SCR_S), *S_draw = S_lse + PT_SS_CHUNKS;
    gs_p1 p;
    if (tid < n1) {
        p = ((const gs_p1 *)rs)[tid];
    } else {
        p.rawmax = p.best = p.smax = -INFINITY;
        p.besti = -1;
        p.cnt = 0;
    }
    const float rmx = gs_block_max_f(p.rawmax, scf);
    int32_t chosen = -1;
    int status = 0;
    if (R.greedy) {
        const float bmx = gs_block_max_f(p.best, scf);
        const long long first = gs_block_min_ll(p.best == bmx && p.besti >= 0 ? p.besti : GS_NO_HIT, sc);
        chosen = first == GS_NO_HIT ? 0 : (int32_t)first;
    } else {
        const float mx = gs_block_max_f(p.smax, scf);
        const long long n_cand = gs_block_sum_ll(p.cnt, sc);
        if (n_cand == 0) {
            status = 1;
        } else if (R.top_k > 0 && R.top_k < n_cand) {
            /* gs_kernel's 4a on the slices' union: sorted, its first k are
             * the row's top k (keys are distinct) */
            const int64_t S = gs_topk_slice(V, R.top_k);
            const int M = (int)((V + S - 1) / S * R.top_k);
            int P = 1;
            while (P < M) P <<= 1;
            const unsigned long long *u = (const unsigned long long *)(rs + GS_SCR_TK);
            for (int i = tid; i < P; i += GS_NT) sh.key[i] = i < M ? u[i] : 0ull;
            __syncthreads();
            gs_sort_desc(sh.key, P);
            const gs_key_p kp = {sh.key, mx};
            int64_t n = R.top_k;
            if (R.top_p < 1.0f) {
                const double total = gs_scan(kp, n, n, sT);
                __syncthreads();
                const double target = (double)R.top_p * total;
                gs_scan(kp, n, n, sT);
                const long long at = gs_walk(kp, n, n, sT, target, 0, sc);
                if (at < n) n = at + 1;
            }
            if (R.min_p > 0) n = gs_minp_prefix(kp, n, R.min_p, sc);
            chosen = gs_draw_sorted(kp, n, R.u, sT, sc);
        } else if (R.top_k > 0 && R.top_p < 1.0f) {
            status = 1; /* top-k keeps every candidate: a nucleus over all of them (gs_kernel's 4b; rare) */
        } else {
            const gs_id_p fp = {R.logits, 1.0f / R.temperature, mx, R.min_p};
            const double sum = gs_scan_loaded(S_draw, sT);
            gs_draw_ids(fp, V, sT, R.u * sum, sc, chosen, &status); /* none (an infinite logit): the host decides */
        }
    }
    float logprob = 0.f;
    if (status == 0 && R.want_logprob) {
        const double sum = gs_scan_loaded(S_lse, sT);
        logprob = gs_logprob(R.logits, chosen, rmx, sum);
    }
    gs_store_out(outs, R, status, chosen, logprob, slot != 0);
}

/* The control block: [B] rows (padded to 256 bytes), [B] results and the
 * backend's 2 error words (one download brings both back), then [B] rows'
 * multi-block scratch (GS_ROW_SCR each). */
static size_t gs_al(size_t n) { return (n + 255) & ~(size_t)255; }

extern "C" size_t pt_gsample_ctl_bytes(int B) {
    return gs_al((size_t)B * sizeof(pt_gsample_row)) + gs_al((size_t)B * sizeof(pt_gsample_out) + 2 * sizeof(int)) +
           (size_t)B * GS_ROW_SCR;
}

/* The control block of B rows (pt_gsample_ctl_bytes): the row table, the
 * results with the 2 error words after them, the rows' scratch. */
struct gs_ctl {
    pt_gsample_row *rows;
    pt_gsample_out *outs;
    int *err;
    char *scr;
};
static gs_ctl gs_ctl_of(void *ctl_dev, int B) {
    const size_t rows_bytes = gs_al((size_t)B * sizeof(pt_gsample_row));
    const size_t outs_bytes = (size_t)B * sizeof(pt_gsample_out);
    gs_ctl g;
    g.rows = (pt_gsample_row *)ctl_dev;
    g.outs = (pt_gsample_out *)((char *)ctl_dev + rows_bytes);
    g.err = (int *)((char *)g.outs + outs_bytes);
    g.scr = (char *)ctl_dev + rows_bytes + gs_al(outs_bytes + 2 * sizeof(int));
    return g;
}

/* The launches of one call, enqueue only: the row table (from rows_src, host
 * memory; skipped when rows_current), then gs_kernel and/or the multi-block
 * kernels; the last kernel copies the backend's error words next to the
 * results. *outs_dev: where the B results land (then the 2 error words). */
/* side, ev_id (the pipelined decode; else 0): a single greedy multi-block
 * row with an id_slot gets its id from gs_mb_greedy_id on the decode
 * stream (ev_id recorded after it) and its pass 2 and pass 3 on side,
 * after ev_id, unless PETREL_CUDA_SAMPLE_EARLY_ID=0 (read per call). */
static pt_status gs_enqueue(pt_cuda *c, const pt_gsample_row *rows, const pt_gsample_row *rows_src, int B, int64_t V,
                            void *ctl_dev, int rows_current, pt_gsample_out **outs_dev_out, cudaStream_t side = 0,
                            cudaEvent_t ev_id = 0) {
    const gs_ctl g = gs_ctl_of(ctl_dev, B);
    pt_gsample_row *rows_dev = g.rows;
    pt_gsample_out *outs_dev = g.outs;
    int *err_dev = g.err;
    char *scr = g.scr;
    *outs_dev_out = outs_dev;
    /* PETREL_CUDA_SAMPLE_MB=0: every row through gs_kernel (A/B); read per
     * call so that one process can compare both paths */
    const int mb_on = pt_env_on("PETREL_CUDA_SAMPLE_MB");
    int n_mb = 0, n_draw = 0, n_lp = 0;
    int64_t tk_blocks = 0, tk_slice = 0; /* top-k: blocks per row, the largest slice */
    for (int b = 0; b < B; b++)
        if (mb_on && gs_mb_row(rows[b], V)) {
            n_mb++;
            n_draw += !rows[b].greedy;
            n_lp += rows[b].want_logprob != 0;
            const int64_t S = rows[b].greedy ? 0 : gs_topk_slice(V, rows[b].top_k);
            if (S) {
                if ((V + S - 1) / S > tk_blocks) tk_blocks = (V + S - 1) / S;
                if (S > tk_slice) tk_slice = S;
            }
        }
    if (!rows_current)
        CUDA_CHECK(cudaMemcpyAsync(rows_dev, rows_src, (size_t)B * sizeof *rows, cudaMemcpyHostToDevice, c->stream));
    /* the last kernel also copies the error words next to the results */
    if (n_mb < B)
        PT_TRY(pt_gsample_oneblock_launch(rows_dev, outs_dev, B, V, mb_on, n_mb ? NULL : c->err_dev, err_dev,
                                          c->stream));
    if (n_mb) {
        const bool pdl = pt_pdl_chain();
        const int64_t slice = gs_mb_slice(V);
        const int n1 = (int)((V + slice - 1) / slice);
        pt_launch(gs_mb_pass1, dim3((unsigned)n1, (unsigned)B), dim3(GS_P1_NT), 0, c->stream, pdl, rows_dev, scr, V,
                  slice);
        CUDA_CHECK_LAUNCH("sample pass 1");
        /* the greedy id first, the log-probability beside the next step; without a log-probability to
         * form, the greedy id's kernel is the last pass */
        const bool early = side && ev_id && n_mb == B && n_draw == 0 && pt_env_on("PETREL_CUDA_SAMPLE_EARLY_ID");
        cudaStream_t s23 = c->stream;
        if (early) {
            const bool last = n_lp == 0; /* the results and error words too; no pass 2 or 3 */
            pt_launch(gs_mb_greedy_id, dim3((unsigned)B), dim3(GS_P1_MAX), 0, c->stream, pdl, rows_dev, scr, n1,
                      last ? outs_dev : (pt_gsample_out *)nullptr, last ? (const int *)c->err_dev : (const int *)nullptr,
                      last ? err_dev : (int *)nullptr);
            CUDA_CHECK_LAUNCH("sample greedy id");
            if (last) return PT_OK;
            CUDA_CHECK(cudaEventRecord(ev_id, c->stream));
            CUDA_CHECK(cudaStreamWaitEvent(side, ev_id, 0));
            s23 = side;
        }
        if (tk_blocks) {
            const size_t smem = (size_t)tk_slice * sizeof(unsigned long long);
            if (smem > 48 * 1024)
                CUDA_CHECK(cudaFuncSetAttribute(gs_mb_topk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            pt_launch(gs_mb_topk, dim3((unsigned)tk_blocks, (unsigned)B), dim3(GS_P1_NT), smem, c->stream, pdl,
                      rows_dev, scr, V);
            CUDA_CHECK_LAUNCH("sample top-k");
        }
        /* pass 2: the log-sum-exp of the rows that want a log-probability, the draw's sums of the rows that
         * draw; nothing to do for greedy rows without a log-probability */
        const bool pass2 = n_lp || n_draw;
        if (pass2) {
            pt_launch(gs_mb_pass2, dim3(GS_LSE_BLOCKS + (n_draw ? GS_DRAW_BLOCKS : 0), (unsigned)B),
                      dim3(GS_P2_NT), 0, s23, pdl && !early, rows_dev, scr, V, n1);
            CUDA_CHECK_LAUNCH("sample pass 2");
        }
        pt_launch(gs_mb_pass3, dim3((unsigned)B), dim3(GS_NT), 0, s23, pdl && (pass2 || !early), rows_dev,
                  outs_dev, scr, V, n1, (const int *)c->err_dev, err_dev, early ? 0 : 1);
        CUDA_CHECK_LAUNCH("sample pass 3");
    }
    return PT_OK;
}

static pt_status gs_check(pt_backend *be, int B, int64_t V, const void *ctl_dev) {
    if (!be || strcmp(be->ops->name, "cuda"))
        return pt_error(PT_ERR_UNSUPPORTED, "GPU sampling: the model does not run on the CUDA backend");
    if (B < 1 || V < 1 || !ctl_dev) return pt_error(PT_ERR_INTERNAL, "GPU sampling: bad call (%d rows)", B);
    return PT_OK;
}

extern "C" size_t pt_gsample_step_bytes(void) { return pt_gsample_ctl_bytes(1) + 2 * sizeof(pt_gsample_step_out); }

static pt_gsample_step_out *gs_step_slots(void *ctl_dev) {
    return (pt_gsample_step_out *)((char *)ctl_dev + pt_gsample_ctl_bytes(1));
}

extern "C" pt_status pt_cuda_sample_greedy_launch(pt_backend *be, void *ctl_dev, int64_t V, int32_t *pos_next) {
    PT_TRY(gs_check(be, 1, V, ctl_dev));
    if (!pos_next) return pt_error(PT_ERR_INTERNAL, "the step's sampler: no position");
    pt_cuda *c = pt_cuda_of(be);
    const gs_ctl g = gs_ctl_of(ctl_dev, 1);
    const bool pdl = pt_pdl_chain();
    const int64_t slice = gs_mb_slice(V);
    const int n1 = (int)((V + slice - 1) / slice);
    /* gs_enqueue's pass 1 for one greedy multi-block row, then its greedy id */
    pt_launch(gs_mb_pass1, dim3((unsigned)n1, 1u), dim3(GS_P1_NT), 0, c->stream, pdl, (const pt_gsample_row *)g.rows,
              g.scr, V, slice);
    CUDA_CHECK_LAUNCH("sample pass 1 (in the step)");
    pt_launch(gs_step_greedy, dim3(1u), dim3(GS_P1_MAX), 0, c->stream, pdl, (const pt_gsample_row *)g.rows, g.scr, n1,
              gs_step_slots(ctl_dev), (const int *)c->err_dev, pos_next);
    CUDA_CHECK_LAUNCH("sample greedy id (in the step)");
    return PT_OK;
}

extern "C" pt_status pt_cuda_sample_rows(pt_backend *be, const pt_gsample_row *rows, int B, int64_t V,
                                         void *ctl_dev, int rows_current, pt_gsample_out *out) {
    PT_TRY(gs_check(be, B, V, ctl_dev));
    pt_cuda *c = pt_cuda_of(be);
    const size_t outs_bytes = (size_t)B * sizeof(pt_gsample_out);
    pt_gsample_out *outs_dev = NULL;
    PT_TRY(gs_enqueue(c, rows, rows, B, V, ctl_dev, rows_current, &outs_dev));
    /* results and error words in one download (B <= 64 rows here at most
     * on the runtime's paths; larger B from a caller through the heap) */
    enum { STACK_ROWS = 64 };
    struct {
        pt_gsample_out o[STACK_ROWS];
        int err[2];
    } hb;
    const size_t nbytes = outs_bytes + 2 * sizeof(int);
    void *h = B <= STACK_ROWS ? (void *)&hb : malloc(nbytes);
    if (!h) return pt_error(PT_ERR_NOMEM, "GPU sampling: out of memory for %d results", B);
    cudaError_t e = cudaMemcpyAsync(h, outs_dev, nbytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    int err0 = 0;
    if (e == cudaSuccess) {
        memcpy(out, h, outs_bytes);
        memcpy(&err0, (char *)h + outs_bytes, sizeof err0);
    }
    if (h != (void *)&hb) free(h);
    CUDA_CHECK(e);
    /* an error word set by the forward pass: the backend reports (and clears) it */
    return err0 ? pt_cuda_check_errors(c) : PT_OK;
}

/* ---- the pipelined decode's one-row sample (sample.h) ---- */

/* Pinned host memory (cudaHostAlloc), so that the copies below neither wait
 * for the stream nor stage through the driver: what the host hands the
 * device (the row table, the position) and what comes back (the result and
 * the error words). One enqueue in flight at a time: its event covers every
 * copy from and into this block. */
typedef struct {
    pt_gsample_row row;
    pt_gsample_out out;
    int err[2];
    int32_t pos;
} gs_pinned;

/* the result and the error words arrive in one copy, as they lie on the device */
static_assert(offsetof(gs_pinned, err) == offsetof(gs_pinned, out) + sizeof(pt_gsample_out),
              "gs_pinned: the error words must follow the result");
static_assert(offsetof(pt_gsample_step_out, err) == sizeof(pt_gsample_out),
              "pt_gsample_step_out: the error words must follow the result");

/* The batched form's pinned block (pt_cuda_sample_rows_enqueue): the row
 * table going out, and the results with the error words coming back (laid
 * out as on the device: [B] results, then the 2 words). */
#define GS_PIPE_ROWS 64
typedef struct {
    pt_gsample_row rows[GS_PIPE_ROWS];
    char back[GS_PIPE_ROWS * sizeof(pt_gsample_out) + 2 * sizeof(int)];
} gs_pinned_rows;

struct pt_gsample_pipe {
    gs_pinned *h;
    gs_pinned_rows *hr; /* the batched form's block; NULL until first used */
    int rows_b;         /* rows of the batched sample in flight */
    /* The copies of the position and of the result need not hold up the
     * decode stream: they run on a second stream, ordered by events —
     * step: recorded on the decode stream at the enqueue (the step before
     * has been enqueued: its readers of the position come first); pos: after
     * the position's copy, waited for by the decode stream before the next
     * step; sampled: after the sampler; done: after the result's copy, the
     * event the host waits for. */
    cudaStream_t side;
    cudaEvent_t step, pos, sampled, done;
    cudaEvent_t id; /* gs_enqueue's ev_id: after the greedy id, before the side stream's pass 2 */
    int pending; /* 1: enqueued, not yet waited for */
};

extern "C" pt_status pt_gsample_pipe_create(pt_backend *be, pt_gsample_pipe **out) {
    *out = NULL;
    if (!be || strcmp(be->ops->name, "cuda"))
        return pt_error(PT_ERR_UNSUPPORTED, "pipelined decode: the model does not run on the CUDA backend");
    pt_gsample_pipe *p = (pt_gsample_pipe *)calloc(1, sizeof *p);
    if (!p) return pt_error(PT_ERR_NOMEM, "pipelined decode: out of host memory");
    pt_status st = PT_OK;
    CUDA_CHECK_GOTO(cudaHostAlloc((void **)&p->h, sizeof *p->h, cudaHostAllocDefault), st, fail);
    memset(p->h, 0, sizeof *p->h);
    CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&p->side, cudaStreamNonBlocking), st, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&p->step, cudaEventDisableTiming), st, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&p->pos, cudaEventDisableTiming), st, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&p->sampled, cudaEventDisableTiming), st, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), st, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&p->id, cudaEventDisableTiming), st, fail);
    *out = p;
    return PT_OK;
fail:
    pt_gsample_pipe_free(be, &p);
    return st;
}

extern "C" void pt_gsample_pipe_free(pt_backend *be, pt_gsample_pipe **pp) {
    if (!pp || !*pp) return;
    pt_gsample_pipe *p = *pp;
    (void)be;
    if (p->pending) cudaEventSynchronize(p->done); /* the copies still use the pinned block */
    cudaEvent_t ev[] = {p->step, p->pos, p->sampled, p->done, p->id};
    for (int i = 0; i < 5; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    if (p->side) cudaStreamDestroy(p->side);
    if (p->h) cudaFreeHost(p->h);
    if (p->hr) cudaFreeHost(p->hr);
    free(p);
    *pp = NULL;
}

/* The pipe's position copy (before the sampler): on the side stream after
 * the step enqueued before (its readers of the position come first) */
static pt_status gs_pipe_pos(pt_cuda *c, pt_gsample_pipe *p, bool side, int32_t *pos_dev, int32_t pos) {
    p->h->pos = pos;
    if (!pos_dev) return PT_OK;
    /* the position: the step after the sample reads it (the sampler does
     * not); the event the host waits for covers this copy too */
    if (side) {
        CUDA_CHECK(cudaEventRecord(p->step, c->stream));
        CUDA_CHECK(cudaStreamWaitEvent(p->side, p->step, 0));
    }
    CUDA_CHECK(cudaMemcpyAsync(pos_dev, &p->h->pos, sizeof pos, cudaMemcpyHostToDevice, side ? p->side : c->stream));
    if (side) CUDA_CHECK(cudaEventRecord(p->pos, p->side));
    return PT_OK;
}

/* ... and after the sampler: the next step waits for the position, the
 * result and the error words come back, the event the host waits for */
static pt_status gs_pipe_back(pt_cuda *c, pt_gsample_pipe *p, bool side, const int32_t *pos_dev,
                              const pt_gsample_out *outs_dev) {
    if (side) {
        CUDA_CHECK(cudaEventRecord(p->sampled, c->stream));
        if (pos_dev) CUDA_CHECK(cudaStreamWaitEvent(c->stream, p->pos, 0)); /* before the next step */
        CUDA_CHECK(cudaStreamWaitEvent(p->side, p->sampled, 0));
    }
    cudaStream_t cs = side ? p->side : c->stream;
    CUDA_CHECK(cudaMemcpyAsync(&p->h->out, outs_dev, sizeof p->h->out + sizeof p->h->err, cudaMemcpyDeviceToHost,
                               cs));
    CUDA_CHECK(cudaEventRecord(p->done, cs));
    p->pending = 1;
    return PT_OK;
}

extern "C" pt_status pt_cuda_sample_enqueue(pt_backend *be, pt_gsample_pipe *p, const pt_gsample_row *row, int64_t V,
                                            void *ctl_dev, int row_current, int32_t *pos_dev, int32_t pos) {
    PT_TRY(gs_check(be, 1, V, ctl_dev));
    if (!p || p->pending) return pt_error(PT_ERR_INTERNAL, "pipelined decode: a sample is already in flight");
    pt_cuda *c = pt_cuda_of(be);
    p->h->row = *row;
    /* PETREL_CUDA_PIPE_SIDE=0: both copies on the decode stream, in order
     * (the A/B of the second stream; read per call) */
    const bool side = pt_env_on("PETREL_CUDA_PIPE_SIDE");
    PT_TRY(gs_pipe_pos(c, p, side, pos_dev, pos));
    pt_gsample_out *outs_dev = NULL;
    PT_TRY(gs_enqueue(c, row, &p->h->row, 1, V, ctl_dev, row_current, &outs_dev, side ? p->side : 0, p->id));
    return gs_pipe_back(c, p, side, pos_dev, outs_dev);
}

extern "C" pt_status pt_cuda_sample_sampled_enqueue(pt_backend *be, pt_gsample_pipe *p, void *ctl_dev, int32_t pos) {
    if (!be || strcmp(be->ops->name, "cuda") || !ctl_dev || pos < 0)
        return pt_error(PT_ERR_INTERNAL, "pipelined decode: bad call of the sampled step's result");
    if (!p || p->pending) return pt_error(PT_ERR_INTERNAL, "pipelined decode: a sample is already in flight");
    pt_cuda *c = pt_cuda_of(be);
    /* the position is the step's own, advanced by its sampler */
    return gs_pipe_back(c, p, pt_env_on("PETREL_CUDA_PIPE_SIDE"), NULL, &gs_step_slots(ctl_dev)[pos & 1].out);
}

extern "C" pt_status pt_cuda_sample_wait(pt_backend *be, pt_gsample_pipe *p, pt_gsample_out *out) {
    if (!p || !p->pending) return pt_error(PT_ERR_INTERNAL, "pipelined decode: no sample in flight");
    pt_cuda *c = pt_cuda_of(be);
    p->pending = 0;
    CUDA_CHECK(cudaEventSynchronize(p->done));
    *out = p->h->out;
    /* an error word set by the forward pass: the backend reports (and clears) it */
    return p->h->err[0] ? pt_cuda_check_errors(c) : PT_OK;
}

/* ---- the server's pipelined turn: B rows (sample.h) ---- */

extern "C" pt_status pt_cuda_sample_rows_enqueue(pt_backend *be, pt_gsample_pipe *p, const pt_gsample_row *rows, int B,
                                                 int64_t V, void *ctl_dev) {
    PT_TRY(gs_check(be, B, V, ctl_dev));
    if (!p || p->pending) return pt_error(PT_ERR_INTERNAL, "pipelined step: a sample is already in flight");
    if (B > GS_PIPE_ROWS)
        return pt_error(PT_ERR_INTERNAL, "pipelined step: %d rows to sample (at most %d)", B, GS_PIPE_ROWS);
    pt_cuda *c = pt_cuda_of(be);
    if (!p->hr) {
        CUDA_CHECK(cudaHostAlloc((void **)&p->hr, sizeof *p->hr, cudaHostAllocDefault));
        memset(p->hr, 0, sizeof *p->hr);
    }
    memcpy(p->hr->rows, rows, (size_t)B * sizeof *rows);
    pt_gsample_out *outs_dev = NULL;
    /* as the one-row form: with the side stream (PETREL_CUDA_PIPE_SIDE) the
     * results' copy runs there, and when every row is greedy the ids go
     * into the table first and the log-probabilities' passes run there too
     * (gs_mb_greedy_id), beside the step */
    const int side = pt_env_on("PETREL_CUDA_PIPE_SIDE");
    PT_TRY(gs_enqueue(c, rows, p->hr->rows, B, V, ctl_dev, 0, &outs_dev, side ? p->side : 0, p->id));
    cudaStream_t cs = c->stream;
    if (side) {
        CUDA_CHECK(cudaEventRecord(p->sampled, c->stream));
        CUDA_CHECK(cudaStreamWaitEvent(p->side, p->sampled, 0));
        cs = p->side;
    }
    CUDA_CHECK(cudaMemcpyAsync(p->hr->back, outs_dev, (size_t)B * sizeof(pt_gsample_out) + 2 * sizeof(int),
                               cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaEventRecord(p->done, cs));
    p->rows_b = B;
    p->pending = 1;
    return PT_OK;
}

extern "C" pt_status pt_cuda_sample_rows_wait(pt_backend *be, pt_gsample_pipe *p, pt_gsample_out *out) {
    if (!p || !p->pending || !p->hr) return pt_error(PT_ERR_INTERNAL, "pipelined step: no sample in flight");
    pt_cuda *c = pt_cuda_of(be);
    p->pending = 0;
    CUDA_CHECK(cudaEventSynchronize(p->done));
    const size_t ob = (size_t)p->rows_b * sizeof(pt_gsample_out);
    memcpy(out, p->hr->back, ob);
    int err0;
    memcpy(&err0, p->hr->back + ob, sizeof err0);
    /* an error word set by the forward pass: the backend reports (and clears) it */
    return err0 ? pt_cuda_check_errors(c) : PT_OK;
}
