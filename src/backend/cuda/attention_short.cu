/* The split decode attention of one sequence at short contexts in one
 * launch (rope_kv_attention, attention.cu, takes it when the step's bound
 * on the keys allows): the second-generation kernels' work (attention_dec2.cu:
 * the folded RoPE and cache write, scores with per-split (max, sum), p·V
 * with the exact row max and sum, the ordered merge) done by one block per
 * query head (or per KV head), with every value formed by the same
 * expressions in the same order. So the output is the three kernels' bits,
 * and a row decoded this way is bit-identical to the row in a batch
 * (tests/cuda/test_cuda_ropekv.c checks it against the three kernels at
 * every split count it takes).
 *
 * Why: at a few hundred keys the three launches are a latency chain (the
 * scores kernel alone ~9.6 µs at 16 keys on the H200, bench/RESULTS.md)
 * over a few KB of cache per head; one launch does the same work without
 * two kernel boundaries, the scratch round trips and the merge launch.
 *
 * Batched rows (continuous batching: attention_rows' rows through the K/V
 * pointer table, a captured step's key bound or an eager step's largest
 * position + 1): the same form with blockIdx.y the row, the keys rotated
 * and appended before by rope_k_append_rows (rows may share a cache), so
 * every key comes from the cache and only the queries are rotated here
 * (FOLD false); a block per (row, query head) while those fit in one
 * wave, else per (row, KV head), of 8 warps where no row of the bound has
 * more than 8 scores tasks (2 blocks an SM), else 16 (1); per KV head twice
 * those blocks an SM, at 64 registers, where the launch has more blocks than
 * the plain build's blocks an SM hold (ds_rows_dense). At 64
 * served streams of the 8B shape it replaced the scores, p·V and merge
 * launches: +19% aggregate (bench/RESULTS.md, "fourth session").
 *
 * Blocks: by default one per query head (nh blocks; c->dec_short_heads,
 * PETREL_CUDA_DEC_SHORT_HEADS=0: one per KV head holding its G query
 * heads). A head's scores, (max, sum), p·V and merge never mix with another
 * head's (the per-head loops of the split kernels run the same
 * expressions in the same order for one head as for G; the one lane of a
 * key slot that pushes a head's score sits in a group of LS lanes whose
 * other members add exact zeros to the same butterfly), so the bits do not
 * depend on how the heads are grouped; the G blocks of a KV head each
 * rotate the new key and read the cache, and the group's first one writes
 * the new rows. One block per KV head leaves all but nkv SMs idle (8 of 132
 * at Llama shapes) and runs G heads' dots and butterflies on one block's
 * warps; one per query head measured +25-36% tg128 (bench/RESULTS.md).
 *
 * Memory order: the step's own q, k, v rows are loaded into registers
 * first; then the cached key rows and the value rows are issued as two
 * cp.async groups into shared memory (where they fit, c->dec_short_stage),
 * so they travel while the RoPE runs; the scores wait for the first group,
 * the p·V for the second. The step's own row is never copied from the
 * cache (block 0 may be writing it): its slot is filled from the block's
 * rotated copy.
 *
 * The kernel is a latency chain, one block per head and a few warps with
 * keys: at 64 keys ~10,000 cycles from the wait to the end on the H200, a
 * few hundred of them per barrier phase (dev/ds_phases.cu times each). So
 * one sequence (FOLD) runs with four barriers: each thread rotates its own
 * query elements (and the step's key element, stored element by element)
 * in registers, from its element's pair loaded from global memory; and
 * every warp with p·V tasks forms the splits' sums and the row statistics
 * itself with the same butterflies, where a warp per split and then a
 * warp per head did, a barrier apart. Batched rows keep the barrier form
 * (the register form measured slower there, bench/RESULTS.md).
 *
 * The three kernels give each split of `per` keys (dec_range) a block of
 * D2_WARPS warps, warp w taking the batches of keys from j0 + w·KB on (KB
 * keys a batch, D2_WARPS·KB apart). Here a task is such a (split, warp)
 * pair that holds keys, and the block's DS_WARPS warps take the tasks:
 *   scores: warp t runs task t's batches (at most DS_WARPS tasks), keeping
 *       its lanes' running (max, sum). pt_softmax_block's pair for the split
 *       is then formed across the split's tasks: the max over them (exact
 *       in any order); each task's lanes' rescaled sums added by the same
 *       xor butterfly (pt_warp_sum); the tasks' sums put in lanes 0..7 of a
 *       second butterfly in warp order, as pt_block_sum puts the block's
 *       warps' sums (the warps without keys add exact zeros there).
 *   p·V: the row max and sum per head as the p·V kernel forms them (a warp
 *       per head over the splits' pairs); then each task's batches
 *       (d2_pv_batch) and key-slot sum (d2_pv_keys_sum) into its own partial
 *       output in shared memory.
 *   merge: per output element the split's tasks' partials added from 0 in
 *       warp order (the p·V kernel's partial output of the split; its warps
 *       without keys add exact zeros), the splits' sums added from 0 in
 *       split order and rounded (dec_rows_merge_kernel).
 * Scores, partial outputs and, where they fit, the key and value rows stay
 * in shared memory. Measured in bench/RESULTS.md, "2026-12-02 (fifth
 * session)" and "(sixth session)". */
#include "backend/cuda/attention_dec2.cuh"
#include "backend/cuda/gemv_tc.cuh" /* XO: pt_cuda_tc_xo_made */
#include "backend/cuda/wg_x.cuh"    /* XO: the o projection's x layout */

/* Warps a block: for one sequence the fewest of 4, 8 and 16 that hold
 * every scores task of a row under the launch's bound (ds_fold_warps: 16
 * hold a row of up to 256 keys), 8 for batched rows under a bound of at
 * most 8 scores tasks, else 16 (several blocks an SM; DS_WARPS is the
 * most). */
#define DS_WARPS 16
#define DS_MAXK PT_DEC_SHORT_KEYS /* the most keys a row may hold: the scores' row in shared memory */
/* The most dynamic shared memory a launch takes (the kernel's static arrays
 * take up to ~20 KB more of the SM's 227 KB). */
#define DS_SMEM_MAX (200 * 1024)

/* dev/ds_phases.cu builds this file with PT_DS_TRACE set: thread 0 of the
 * first PT_DS_TRACE_BLOCKS blocks of row pt_ds_trace_row (0 unless set;
 * dev/ds_rows_phases.cu) records the SM clock at each phase boundary
 * (DS_MARK) and the global timer after the wait and at the end (DS_GTIME);
 * the library's build records nothing. */
#ifdef PT_DS_TRACE
__device__ long long pt_ds_trace[PT_DS_TRACE_BLOCKS][16];
__device__ int pt_ds_trace_row; /* the row whose blocks record (dev/ds_rows_phases.cu sets it) */
#define DS_MARK(i)                                                                                                 \
    do {                                                                                                           \
        if (threadIdx.x == 0 && blockIdx.y == pt_ds_trace_row && blockIdx.x < PT_DS_TRACE_BLOCKS)                  \
            pt_ds_trace[blockIdx.x][i] = clock64();                                                                \
    } while (0)
#define DS_GTIME(i)                                                                                                \
    do {                                                                                                           \
        if (threadIdx.x == 0 && blockIdx.y == pt_ds_trace_row && blockIdx.x < PT_DS_TRACE_BLOCKS) {                \
            long long t_;                                                                                          \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                                 \
            pt_ds_trace[blockIdx.x][i] = t_;                                                                       \
        }                                                                                                          \
    } while (0)
#else
#define DS_MARK(i) ((void)0)
#define DS_GTIME(i) ((void)0)
#endif

/* The tasks of one split holding cnt keys, in batches of kb keys: the
 * split kernels' warps that get keys (each takes batches D2_WARPS·kb
 * apart). */
__host__ __device__ __forceinline__ int ds_split_tasks(int64_t cnt, int kb) {
    return cnt < (int64_t)D2_WARPS * kb ? (int)((cnt + kb - 1) / kb) : D2_WARPS;
}

/* The tasks of a row of n keys in splits of per (used of them): (split,
 * warp) pairs holding keys for batches of kb keys. */
__host__ __device__ __forceinline__ int ds_tasks(int64_t n, int64_t per, int64_t used, int kb) {
    if (used <= 0) return 0;
    return (int)((used - 1) * ds_split_tasks(per, kb) + ds_split_tasks(n - (used - 1) * per, kb));
}

/* Task t's split and warp: the splits' tasks in split order, each split's
 * in warp order (every split but the last has `full` of them). */
__device__ __forceinline__ void ds_task(int t, int full, int64_t &s, int &w) {
    s = t / full;
    w = t % full;
}

/* Split s's tasks: t0 .. t0 + nt of the row's total tasks. */
__device__ __forceinline__ void ds_split_range(int64_t s, int full, int total, int &t0, int &nt) {
    t0 = (int)s * full;
    nt = total - t0 < full ? total - t0 : full;
}

/* Dynamic shared memory of a launch for H query heads a block: the queries
 * [H, hd], the scores [H, DS_MAXK] (floats; the batched rows' raw queries
 * in their front before the scores write them), the tasks' partial outputs
 * [tp, H, hd]; with nst = 1 also the value rows of up to DS_MAXK keys,
 * [DS_MAXK, R] 16-byte chunks, read ahead of the p·V phase, with nst = 2
 * the key rows as well (read ahead of the scores). */
__host__ __device__ __forceinline__ size_t ds_smem(int H, int hd, int tp, int R, int nst) {
    return ((size_t)H * hd + (size_t)H * DS_MAXK + (size_t)tp * H * hd) * sizeof(float) +
           (size_t)nst * DS_MAXK * R * 16;
}

/* The batched rows staged by split (ds_task_fits): the queries and scores
 * as ds_smem, then a buffer of kb keys' rows ([kb, R] 16-byte chunks) for
 * each of the NW warps: warp t's split's key rows, then its value rows,
 * then its partial output [H, hd] (floats). */
__host__ __device__ __forceinline__ size_t ds_smem_task(int H, int hd, int NW, int kb, int R) {
    return ((size_t)H * hd + (size_t)H * DS_MAXK) * sizeof(float) + (size_t)NW * kb * R * 16;
}

/* Whether a batched launch can stage by split (PETREL_CUDA_DEC_SHORT_ROWS_STAGE=4): every split of a row
 * under the bound (per keys, at most kb: one scores task and one p·V task, a single batch each, so split t
 * is warp t's in both phases) fits a warp's buffer, as does the split's partial output. */
__host__ __device__ __forceinline__ bool ds_task_fits(int64_t per_max, int kb, int H, int hd, int R) {
    return per_max <= kb && (size_t)H * hd * sizeof(float) <= (size_t)kb * R * 16;
}


/* U load steps of 32/LPR keys from key jb on as d2_load gives them, from
 * the rows staged in shared memory (vs: key j's chunk c at (j − jo)·R + c;
 * jo the first key staged there). */
template <int LPR, int C, int U>
__device__ __forceinline__ void ds_load_staged(uint4 (&r)[U][C], const uint4 *vs, int R, int64_t jb, int64_t j1,
                                               int sub, int ks, int64_t jo = 0) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t j = jb + u * (32 / LPR) + ks;
#pragma unroll
        for (int ci = 0; ci < C; ci++) {
            const int c = ci * LPR + sub;
            r[u][ci] = j < j1 && c < R ? vs[(j - jo) * R + c] : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* U load steps of keys from jb on, from the staged rows (sbuf, key j at
 * (j − jo)·R: ds_load_staged) or from the cache (d2_load, with the block's
 * own copy nrow of cache row prow): the one choice every phase makes. */
template <typename KT, int LPR, int C, int U>
__device__ __forceinline__ void ds_load_rows(uint4 (&r)[U][C], bool staged, const uint4 *sbuf, int64_t jo,
                                             const KT *base, int64_t rlo, int64_t cap, int hd, int R, int64_t jb,
                                             int64_t j1, int sub, int ks, const uint4 *nrow = nullptr,
                                             int64_t prow = -1) {
    if (staged) ds_load_staged<LPR, C, U>(r, sbuf, R, jb, j1, sub, ks, jo);
    else d2_load<KT, LPR, C, U>(r, base, rlo, cap, hd, R, jb, j1, sub, ks, nrow, prow);
}

/* The cached rows of keys j0 .. j0 + n − 1 (cache row rlo + j, wrapping
 * once at cap) copied into dst ([n, R] 16-byte chunks) by cp.async, threads
 * i0, i0 + ST, ... over the chunks; all but key j0 + jp, the step's own row,
 * which the block fills from its own copy (block 0 may be writing it to the
 * cache). */
template <int ST, typename KT>
__device__ __forceinline__ void ds_copy_rows(uint4 *dst, const KT *base, int64_t rlo, int64_t cap, int hd, int R,
                                             int64_t j0, int n, int64_t jp, int i0) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(dst);
    for (int i = i0; i < n * R; i += ST) {
        const int j = i / R;
        int64_t row = rlo + j0 + j;
        if (row >= cap) row -= cap;
        const uint4 *src = reinterpret_cast<const uint4 *>(base + row * hd) + (i - j * R);
        if (j != jp) pt_cp16(sa + (uint32_t)i * 16u, src, true);
    }
}

/* Keys 0 .. n − 1 (ds_copy_rows), the block's NT threads over the chunks. */
template <int NT, typename KT>
__device__ __forceinline__ void ds_stage_rows(uint4 *dst, const KT *base, int64_t rlo, int64_t cap, int hd, int R,
                                              int n, int64_t jp) {
    ds_copy_rows<NT>(dst, base, rlo, cap, hd, R, 0, n, jp, (int)threadIdx.x);
}

/* Warp-wide, the batched rows' split staging: the rows of keys j0 .. j1 − 1
 * (ds_copy_rows, the warp's lanes over the chunks) as one cp.async group. */
template <typename KT>
__device__ __forceinline__ void ds_stage_split(uint4 *dst, const KT *base, int64_t rlo, int64_t cap, int hd, int R,
                                               int64_t j0, int64_t j1, int lane) {
    ds_copy_rows<32>(dst, base, rlo, cap, hd, R, j0, (int)(j1 - j0), -1, lane);
    pt_cp_commit();
}

/* The cached key rows, then the value rows, as two cp.async groups (each
 * where the launch made room to stage it; the scores wait for the first
 * group, the p·V for the second). */
template <int NT, typename KT>
__device__ __forceinline__ void ds_stage_kv(uint4 *kS, uint4 *vS, const KT *kb, const KT *vb, bool kst, bool vst,
                                            int64_t rlo, int64_t cap, int hd, int R, int n, int64_t jp) {
    if (kst) ds_stage_rows<NT>(kS, kb, rlo, cap, hd, R, n, jp);
    pt_cp_commit();
    if (vst) ds_stage_rows<NT>(vS, vb, rlo, cap, hd, R, n, jp);
    pt_cp_commit();
}

/* dec_range in 32-bit arithmetic, the same values (the launch takes caches
 * of fewer than 2^31 slots): the divisions by run-time values in 64 bits
 * are long instruction chains, and a block's prologue runs exposed when
 * it can start only as the q/k/v GEMV's blocks leave its SM. Also the
 * cache rows of the step (prow) and of key 0 (rlo). */
__device__ __forceinline__ void ds_range(const pt_dec_rows &a, int32_t hi, int64_t &lo, int64_t &n, int64_t &per,
                                         int64_t &used, int64_t &prow, int64_t &rlo) {
    const uint32_t cap = (uint32_t)a.cap, ns = (uint32_t)a.nsplit;
    const int32_t l0 = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    int32_t nn = hi - l0 + 1;
    if (nn > (int32_t)a.stride) nn = (int32_t)a.stride;
    if (nn < 0) nn = 0;
    uint32_t pp = ((uint32_t)nn + ns - 1u) / ns;
    if (pp < (uint32_t)a.minper) pp = (uint32_t)a.minper;
    lo = l0, n = nn, per = pp, used = ((uint32_t)nn + pp - 1u) / pp;
    prow = hi >= 0 ? (uint32_t)hi % cap : 0;
    rlo = (uint32_t)l0 % cap;
}

/* The merge of one output value where every split is one task: the nu splits' partials at p, ps floats
 * apart, in split order, each as the general merge adds a split's tasks (u = 0 + x, then v += u): the
 * same sums, the index in 32 bits. */
__device__ __forceinline__ float ds_merge1(const float *p, int ps, int nu) {
    float v = 0.f;
#pragma unroll 4
    for (int sp = 0; sp < nu; sp++) v += 0.f + p[sp * ps];
    return v;
}

/* A padding row (no keys): its n output values zeros, as the merge writes them, once the primary is done. */
template <int NT>
__device__ __forceinline__ void ds_zero_row(float *out, int n) {
    pt_wait_primary();
    for (int i = threadIdx.x; i < n; i += NT) out[i] = 0.f;
}

/* A row of n keys past what the launch holds (its bound on the keys was wrong): reported to the backend's
 * error flag (code 3, the row's keys), once the primary is done; the caller computes and stores nothing. */
__device__ __forceinline__ void ds_bound_error(const pt_dec_rows &a, int64_t n) {
    pt_wait_primary();
    if (threadIdx.x == 0 && atomicCAS(a.err, 0, 3) == 0) a.err[1] = (int)n;
}

/* The launch's dynamic shared memory in bytes. */
__device__ __forceinline__ uint32_t ds_dyn_smem(void) {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    return dyn;
}

/* The batched rows' queries, first half: a thread's QR of the block's n query elements (0 past them) and the
 * RoPE frequency of its dim (threads below half), loaded before the block's cache copies are issued. */
template <int NT, int QR>
__device__ __forceinline__ float ds_rows_q_load(float (&rq)[QR], const float *q, int n, const pt_dec_rows &a) {
#pragma unroll
    for (int u = 0; u < QR; u++) {
        const int i = (int)threadIdx.x + u * NT;
        rq[u] = i < n ? q[i] : 0.f;
    }
    return (int)threadIdx.x < a.half ? a.inv_freq[threadIdx.x] : 0.f;
}

/* The second half: the raw queries into raw (shared memory), the RoPE table of position p (rcs, rsn) by the
 * first half threads, then every element rotated into qs (d2_rope_elem), a barrier before and after. */
template <int NT, int QR>
__device__ __forceinline__ void ds_rows_q_rotate(const float (&rq)[QR], float fr, float *raw, float *qs, float *rcs,
                                                 float *rsn, int n, int hd, int32_t p, const pt_dec_rows &a) {
#pragma unroll
    for (int u = 0; u < QR; u++) {
        const int i = (int)threadIdx.x + u * NT;
        if (i < n) raw[i] = rq[u];
    }
    if ((int)threadIdx.x < a.half) {
        const float th = (float)p * fr;
        rcs[threadIdx.x] = pt_rope_cos(th, a.rscale, a.bf);
        rsn[threadIdx.x] = pt_rope_sin(th, a.rscale, a.bf);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += NT) qs[i] = d2_rope_elem(raw + (i / hd) * hd, i % hd, a.half, rcs, rsn, a.bf);
    __syncthreads();
}

/* Rows rlo .. rlo + n - 1 (mod cap) of rb bytes each from base, fetched
 * into the L2 by one bulk prefetch per contiguous piece (at most two). */
__device__ __forceinline__ void ds_l2_prefetch(const char *base, int64_t rlo, int64_t n, int64_t cap, int64_t rb) {
    const int64_t n1 = n < cap - rlo ? n : cap - rlo, n2 = n - n1;
    if (n1 > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + rlo * rb), "r"((unsigned)(n1 * rb))
                     : "memory");
    if (n2 > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base), "r"((unsigned)(n2 * rb)) : "memory");
}

template <typename KT, int LS, int LP, int CP, int PG, int MG, int NW, bool FOLD, int MB = DS_WARPS / NW>
__global__ void __launch_bounds__(NW * 32, MB) dec2_short_kernel(pt_dec_rows a, int fl) {
    /* launched by pt_launch. One sequence (FOLD): its dependent launch (the
     * o projection's GEMV) is released once every block has passed its wait
     * below, so the GEMV's blocks start when the q/k/v GEMV has finished,
     * not beside its last blocks as when released at the start: tg128 +2%
     * 1b, +0.5% 8b, +3.3% 3b, +4.1% qwen3-4b (bench/RESULTS.md). Batched
     * rows: released at the start, as measured for serving. */
    if constexpr (!FOLD) pt_release_dependents();
    DS_MARK(10);
    /* Before griddepcontrol.wait (pt_wait_primary below): the row's key
     * range, splits, tasks and addresses — a few hundred integer
     * instructions a warp (divisions by run-time values), which would
     * otherwise delay the first loads of the step's rows once the q/k/v
     * GEMV has finished (ds_range: in 32 bits), and the loads of the RoPE's
     * frequencies this thread needs. They read only what the host uploaded
     * before the step ran (the positions, the K/V pointer table) and the
     * model's constant frequencies, never what a kernel of the step
     * writes, and nothing is written before the wait. Measured: this
     * prologue runs exposed when the block starts only as the q/k/v GEMV's
     * blocks leave (the RoPE's cos and sin formed here as well made the
     * 8B step slower, bench/RESULTS.md); they are formed after the wait,
     * while the step's rows are loaded. */
    constexpr int NT = NW * 32, V = 16 / sizeof(KT);
    constexpr int SC = 4, SKB = 2 * (32 / LS);                       /* scores: chunks a lane, keys a batch */
    constexpr int PU = (PG > 4 ? 4 : 8) / CP, PKB = PU * (32 / LP); /* p·V: load steps, keys a batch */
    /* the batched rows' dense builds (twice the plain build's blocks an SM, 64 registers) load a p·V batch
     * in two halves: their registers hold half the loaded rows (the plain builds, 123 registers, load whole
     * batches) */
    constexpr bool PVH = !FOLD && MB > DS_WARPS / NW && PU % 2 == 0;
    /* the block's H query heads: the whole group (MG > 1) or one head (MG = 1), h0 its first in the group */
    const int G = a.nh / a.nkv, H = MG == 1 ? 1 : G, nhb = G / H, hd = a.hd, R = hd * (int)sizeof(KT) / 16;
    const int kh = blockIdx.x / nhb, h0 = (blockIdx.x % nhb) * H;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y, cap = a.cap;
    /* FOLD: the step's key rotated and both rows stored here (one sequence,
     * kn set); else batched rows whose keys rope_k_append_rows rotated and
     * appended before, every key read from the cache and only the queries
     * rotated */
    constexpr bool fold = FOLD;
    const int32_t p = a.pos[b];
    int64_t lo, n, per, used, prow, rlo; /* prow: the step's cache row, rlo: the cache row of key 0 */
    ds_range(a, p, lo, n, per, used, prow, rlo);
    extern __shared__ float4 ds_smem_f4[];
    float *qs = reinterpret_cast<float *>(ds_smem_f4); /* [H, hd] the rotated queries */
    float *sS = qs + H * hd;                            /* [H, DS_MAXK] scores */
    float *sP = sS + H * DS_MAXK;                       /* [tp, H, hd] the tasks' partial outputs */
    float *out = a.out + (b * a.nh + (int64_t)kh * G + h0) * hd;
    if (used == 0) { /* a padding row */
        ds_zero_row<NT>(out, H * hd);
        return;
    }
    const uint32_t dyn = ds_dyn_smem();
    const int ts = ds_tasks(n, per, used, SKB), tp = ds_tasks(n, per, used, PKB);
    const int fs = ds_split_tasks(per, SKB), fp = ds_split_tasks(per, PKB); /* tasks of a full split */
    /* the batched rows staged by split (fl & 4, PETREL_CUDA_DEC_SHORT_ROWS_STAGE=4): warp t's buffer of TKB
     * keys holds split t's key rows, then its value rows, then its partial output (ds_smem_task) */
    constexpr int TKB = SKB < PKB ? SKB : PKB;
    const bool tst = !FOLD && (fl & 4);
    const size_t base = tst ? ds_smem_task(H, hd, NW, TKB, R) : ds_smem(H, hd, tp, R, 0);
    if (n > DS_MAXK || ts > NW || base > dyn || (tst && !ds_task_fits(per, TKB, H, hd, R))) {
        ds_bound_error(a, n); /* the launch's bound on the keys was wrong */
        return;
    }
    /* the rows staged in shared memory when the launch made room for them (ds_smem): the value rows, then
     * the key rows */
    uint4 *vS = reinterpret_cast<uint4 *>(sP + (size_t)tp * H * hd), *kS = vS + DS_MAXK * R;
    const bool al = (((uintptr_t)vS) & 15) == 0;
    /* the value rows staged where the launch made room for them (DS_MAXK keys, or with fl & 2 this row's n:
     * the batched rows' room for their bound, PETREL_CUDA_DEC_SHORT_ROWS_STAGE=3), the key rows where it made
     * room for both */
    const bool vst = !tst && al && dyn >= ((fl & 2) ? base + (size_t)n * R * 16 : ds_smem(H, hd, tp, R, 1)),
               kst = !tst && al && dyn >= ds_smem(H, hd, tp, R, 2);
    /* where the scores and p·V read their rows: staged (the block's rows from key 0 on, or the warp's split
     * from its first key jo on) or from the cache */
    uint4 *tb = reinterpret_cast<uint4 *>(sP) + (size_t)warp * TKB * R; /* tst: this warp's buffer */
    const bool kfs = kst || tst, vfs = vst || tst;
    __shared__ uint4 knew[64], vnew[64];                /* the new key and value rows as stored */
    __shared__ float smax[NW][DEC_MAX_G], ssum[NW][DEC_MAX_G];
    __shared__ float wM[NW][DEC_MAX_G], wInv[NW][DEC_MAX_G]; /* each warp's copy of the row max and 1/sum */
    __shared__ float sM[DEC_MAX_G], sInv[DEC_MAX_G];          /* the rows': the row max and 1/sum per head */
    __shared__ float2 sML[NW][DEC_MAX_G]; /* each split's (max, sum) per head (used <= ts <= NW splits) */
    __shared__ float ps[NW][MG][PKB];
    /* the step's key (< n: a row holds it); batched: none of the keys is the block's own copy */
    const int64_t jp = !fold ? -1 : prow >= rlo ? prow - rlo : prow - rlo + cap;
    const KT *kb = (const KT *)dec_cache(a, b, 0) + (int64_t)kh * cap * hd;
    const KT *vb = (const KT *)dec_cache(a, b, 1) + (int64_t)kh * cap * hd;
    /* the step's own rows into registers first (the cache rows' copies below would otherwise queue ahead of
     * them): H·hd <= QR·NT query values, hd <= NT where fold (ds_fold_warps). Each thread
     * rotates its elements itself, as d2_rope_elem does from rows in shared memory: element i (dim d) with
     * its pair qpair and the cos and sin of the pair's dim (the pair and the dim's frequency found here,
     * before the wait; the cos and sin formed after it); a thread of dim d < hd also rotates the step's
     * key's element d and stores it (fold). */
    constexpr int QR = !FOLD || NW < DS_WARPS ? (MG * 256 + NT - 1) / NT : DEC_MAX_G * 256 / NT;
    const float *q = a.q + (b * a.nh + (int64_t)kh * G + h0) * hd;
    const float *kr = fold ? a.kn + (b * a.nkv + kh) * (int64_t)hd : nullptr;
    const float *vr = fold ? a.vn + (b * a.nkv + kh) * (int64_t)hd : nullptr;
    int qpair[QR];
    float qfr[QR];
    if constexpr (FOLD)
#pragma unroll
        for (int u = 0; u < QR; u++) {
            const int i = (int)threadIdx.x + u * NT, d = i % hd;
            qpair[u] = i, qfr[u] = 0.f;
            if (i < H * hd && d < 2 * a.half) {
                const int e = d < a.half ? d : d - a.half;
                qfr[u] = a.inv_freq[e];
                qpair[u] = i - d + (d < a.half ? d + a.half : e);
            }
        }
    if constexpr (!FOLD)
        if ((fl & 1) && threadIdx.x < 2) {
            /* batched rows: the row's cached keys (thread 0) and values (thread 1) fetched into the L2 before
             * the wait (ds_l2_prefetch); the step's own row, which the append before this launch writes, is
             * fetched again by the loads below (the L2 is coherent; nothing here enters the L1) */
            const char *base = (const char *)(threadIdx.x ? vb : kb);
            ds_l2_prefetch(base, rlo, n, cap, (int64_t)hd * (int64_t)sizeof(KT));
        }
    pt_wait_primary(); /* q (and k, v) are the previous kernel's output */
    if constexpr (FOLD) pt_release_dependents();
    DS_GTIME(14);
    DS_MARK(0);
    if constexpr (!FOLD) {
        /* batched rows: the queries through shared memory (sP, not yet used, holds them) and the RoPE table
         * formed by the first half threads; measured: the form of the branch below slowed the served
         * rows (bench/RESULTS.md) */
        __shared__ float rcs[128], rsn[128];
        float rq[QR];
        const float fr = ds_rows_q_load<NT>(rq, q, H * hd, a);
        if (tst) {
            if (warp < ts) /* split `warp`'s key rows (one cp.async group) */
                ds_stage_split(tb, kb, rlo, cap, hd, R, warp * per, warp * per + per < n ? warp * per + per : n, lane);
        } else
            ds_stage_kv<NT>(kS, vS, kb, vb, kst, vst, rlo, cap, hd, R, (int)n, jp);
        ds_rows_q_rotate<NT>(rq, fr, sS, qs, rcs, rsn, H * hd, hd, p, a); /* the raw queries in front of sS */
        if (kst) { /* this thread's staged key rows; the barrier below publishes them */
            pt_cp_wait<1>();
            __syncthreads();
        }
    } else {
        float rq[QR], rp[QR], rk = 0.f, rkp = 0.f, rv = 0.f;
#pragma unroll
        for (int u = 0; u < QR; u++) {
            const int i = (int)threadIdx.x + u * NT;
            rq[u] = i < H * hd ? q[i] : 0.f;
            rp[u] = i < H * hd ? q[qpair[u]] : 0.f;
        }
        if ((int)threadIdx.x < hd) rk = kr[threadIdx.x], rkp = kr[qpair[0]], rv = vr[threadIdx.x];
        /* the table's cos and sin while those loads travel (as the RoPE table is formed) */
        float qcs[QR], qsn[QR];
#pragma unroll
        for (int u = 0; u < QR; u++) {
            qcs[u] = qsn[u] = 0.f;
            if ((int)threadIdx.x + u * NT < H * hd) {
                const float th = (float)p * qfr[u];
                qcs[u] = pt_rope_cos(th, a.rscale, a.bf);
                qsn[u] = pt_rope_sin(th, a.rscale, a.bf);
            }
        }
        /* the cached key rows, then the value rows, on their way while the step's own rows are rotated and the
         * scores formed (two cp.async groups); the step's row comes from the block's own copy below */
        ds_stage_kv<NT>(kS, vS, kb, vb, kst, vst, rlo, cap, hd, R, (int)n, jp);
#pragma unroll
        for (int u = 0; u < QR; u++) {
            const int i = (int)threadIdx.x + u * NT;
            if (i < H * hd) qs[i] = d2_rope_pair(i % hd, a.half, rq[u], rp[u], qcs[u], qsn[u], a.bf);
        }
        if ((int)threadIdx.x < hd) {
            /* the folded RoPE and cache write, as dec2_scores_kernel<KT, LS, 1> does them, element by element:
             * the block of the group's first head stores the rows in the cache, every block keeps its own copy
             * (and its staged row, the step's slot) */
            const int d = threadIdx.x;
            KT kx, vx;
            d2_kv_store(&kx, d2_rope_pair(d, a.half, rk, rkp, qcs[0], qsn[0], a.bf));
            d2_kv_store(&vx, rv);
            reinterpret_cast<KT *>(knew)[d] = kx;
            reinterpret_cast<KT *>(vnew)[d] = vx;
            if (h0 == 0) {
                ((KT *)dec_cache(a, b, 0))[((int64_t)kh * cap + prow) * hd + d] = kx;
                ((KT *)dec_cache(a, b, 1))[((int64_t)kh * cap + prow) * hd + d] = vx;
            }
            if (kst && jp < n) reinterpret_cast<KT *>(kS)[jp * hd + d] = kx;
            if (vst && jp < n) reinterpret_cast<KT *>(vS)[jp * hd + d] = vx;
        }
        if (kst) pt_cp_wait<1>(); /* this thread's staged key rows */
        __syncthreads();          /* publishes them, the rotated queries and the step's rows */
    }
    DS_MARK(1);
    DS_MARK(2);
    DS_MARK(3);
    /* scores: warp `warp` runs task `warp` (split s, the scores kernel's warp w) */
    /* a lane's running (max, sum) per head: the batched rows' blocks hold at most MG heads (H <= MG), so
     * their arrays are MG long (registers the dense builds would otherwise spill); one sequence keeps
     * DEC_MAX_G */
    constexpr int NGR = FOLD ? DEC_MAX_G : MG;
    float m[NGR], l[NGR];
#pragma unroll
    for (int g = 0; g < NGR; g++) m[g] = -INFINITY, l[g] = 0.f;
    int64_t s = 0;
    int w = 0;
    if (warp < ts) {
        ds_task(warp, fs, s, w);
        const int sub = lane % LS, ks = lane / LS;
        const int64_t j0 = s * per, j1 = j0 + per < n ? j0 + per : n;
        const uint4 *kbuf = tst ? tb : kS; /* staged: key j's row at (j − kjo)·R */
        const int64_t kjo = tst ? j0 : 0;
        if (tst) { /* the split's key rows, staged by this warp */
            pt_cp_wait<0>();
            __syncwarp();
        }
        for (int64_t jb = j0 + (int64_t)w * SKB; jb < j1; jb += (int64_t)D2_WARPS * SKB) {
            if constexpr (PVH) {
                /* the dense builds: the batch's two load steps one after the other (as p·V's halves) */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t jh = jb + h * (32 / LS);
                    uint4 kr[1][SC];
                    ds_load_rows<KT, LS, SC, 1>(kr, kfs, kbuf, kjo, kb, rlo, cap, hd, R, jh, j1, sub, ks);
                    d2_scores_batch<KT, LS, SC, 1>(kr, qs, a, H, hd, R, jh, j1, sub, ks, sS, DS_MAXK, m, l);
                }
            } else {
                uint4 kr[2][SC];
                ds_load_rows<KT, LS, SC, 2>(kr, kfs, kbuf, kjo, kb, rlo, cap, hd, R, jb, j1, sub, ks,
                                            fold ? knew : nullptr, prow);
                d2_scores_batch<KT, LS, SC, 2>(kr, qs, a, H, hd, R, jb, j1, sub, ks, sS, DS_MAXK, m, l);
            }
        }
        if (tst) { /* the split's value rows into the buffer its keys leave, on their way during the statistics */
            __syncwarp();
            ds_stage_split(tb, vb, rlo, cap, hd, R, j0, j1, lane);
        }
#pragma unroll
        for (int g = 0; g < NGR; g++) {
            if (g >= H) break;
            const float mx = pt_warp_max(m[g]);
            if (lane == 0) smax[warp][g] = mx;
        }
    }
    __syncthreads();
    DS_MARK(4);
    /* pt_softmax_block's pair: the split's max over its tasks, each task's lanes' rescaled sums */
    if (warp < ts) {
        int t0, nt; /* the split's tasks */
        ds_split_range(s, fs, ts, t0, nt);
#pragma unroll
        for (int g = 0; g < NGR; g++) {
            if (g >= H) break;
            float bm = -INFINITY;
            for (int t = 0; t < nt; t++) bm = fmaxf(bm, smax[t0 + t][g]);
            const float sw = pt_warp_sum(m[g] == -INFINITY ? 0.f : l[g] * expf(m[g] - bm));
            if (lane == 0) ssum[warp][g] = sw;
            if (w == 0 && lane == 0) sML[s][g].x = bm;
        }
    }
    if constexpr (!FOLD) {
        /* batched rows: as the split kernels, a warp per split, then a warp per head (the form of the branch
         * below, every warp forming every head's statistics, slowed the served rows) */
        __syncthreads();
        DS_MARK(5);
        if (warp < used) { /* split `warp`: its tasks' sums in lanes 0..7, pt_block_sum's second butterfly */
            int t0, nt;
            ds_split_range(warp, fs, ts, t0, nt);
            for (int g = 0; g < H; g++) {
                const float bl = pt_warp_sum(lane < nt ? ssum[t0 + lane][g] : 0.f);
                if (lane == 0) sML[warp][g].y = bl;
            }
        }
        if (vfs) pt_cp_wait<0>(); /* this thread's staged value rows; the barrier below publishes them */
        __syncthreads();
        DS_MARK(6);
        if (warp < H) { /* head `warp`: the exact row max and sum over the used splits (dec2_pv_kernel's) */
            float mx, L;
            d2_row_stats(&sML[0][warp], DEC_MAX_G, used, lane, mx, L);
            if (lane == 0) sM[warp] = mx, sInv[warp] = 1.0f / L;
        }
        __syncthreads();
        DS_MARK(7);
    } else {
        if (vst) pt_cp_wait<0>(); /* this thread's staged value rows; the barrier below publishes them */
        __syncthreads();
        DS_MARK(5);
        DS_MARK(6);
        /* every warp with p·V tasks forms the row max and sum of each head itself (no barrier): split s's sum
         * from its tasks' sums in lanes 0..7 (pt_block_sum's second butterfly), put in lane s with the split's
         * max; then dec2_pv_kernel's merge of the used splits' pairs from those registers (d2_row_stats_of:
         * lanes over the splits, used <= NW <= 32, one split a lane) */
        for (int g = 0; g < H && warp < tp; g++) {
            float x = -INFINITY, y = 0.f;
            for (int sp = 0; sp < (int)used; sp++) {
                int t0, nt;
                ds_split_range(sp, fs, ts, t0, nt);
                const float bl = pt_warp_sum(lane < nt ? ssum[t0 + lane][g] : 0.f);
                if (lane == sp) x = sML[sp][g].x, y = bl;
            }
            float mx, L;
            d2_row_stats_of<true>([&](int64_t) { return make_float2(x, y); }, used, lane, mx, L);
            if (lane == 0) wM[warp][g] = mx, wInv[warp][g] = 1.0f / L;
        }
        __syncwarp();
        DS_MARK(7);
    }
    /* p·V: task t (split s, the p·V kernel's warp w) into its partial output */
    for (int t = warp; t < tp; t += NW) {
        ds_task(t, fp, s, w);
        const int sub = lane % LP, ks = lane / LP;
        const int64_t j0 = s * per, j1 = j0 + per < n ? j0 + per : n;
        const uint4 *vbuf = tst ? tb : vS; /* staged: value j's row at (j − vjo)·R */
        const int64_t vjo = tst ? j0 : 0;
        float acc[MG][CP][V];
        d2_acc_zero(acc);
        for (int64_t jb = j0 + (int64_t)w * PKB; jb < j1; jb += (int64_t)D2_WARPS * PKB) {
            if constexpr (PVH) {
                /* the batch's value rows in two halves of its load steps, the second loaded once the first
                 * is added: the same products in the same order, half the registers */
                constexpr int PH = PU / 2;
                uint4 vr[PH][CP];
                ds_load_rows<KT, LP, CP, PH>(vr, vfs, vbuf, vjo, vb, rlo, cap, hd, R, jb, j1, sub, ks);
                d2_pv_probs(ps[warp], sS, DS_MAXK, sM, sInv, a.bf, H, jb, j1, lane);
                d2_pv_accum<KT, LP, CP, PH>(vr, ps[warp], 0, H, ks, acc);
                const int64_t jh = jb + PH * (32 / LP);
                ds_load_rows<KT, LP, CP, PH>(vr, vfs, vbuf, vjo, vb, rlo, cap, hd, R, jh, j1, sub, ks);
                d2_pv_accum<KT, LP, CP, PH>(vr, ps[warp], PH, H, ks, acc);
                __syncwarp(); /* ps is written again by the next batch */
            } else {
                uint4 vr[PU][CP];
                ds_load_rows<KT, LP, CP, PU>(vr, vfs, vbuf, vjo, vb, rlo, cap, hd, R, jb, j1, sub, ks,
                                             fold ? vnew : nullptr, prow);
                d2_pv_batch<KT, LP, CP, PU, MG>(vr, ps[warp], sS, DS_MAXK, FOLD ? wM[warp] : sM,
                                                    FOLD ? wInv[warp] : sInv, a.bf, H, jb, j1, lane, ks, acc);
            }
        }
        d2_pv_keys_sum<LP>(acc, H);
        if (tst) __syncwarp(); /* the warp's value rows read: its partial output goes over them */
        d2_pv_store<LP>(acc, tst ? reinterpret_cast<float *>(tb) : sP + (int64_t)t * H * hd, H, hd, R, sub, ks);
    }
    __syncthreads();
    DS_MARK(8);
    /* the merge: each split's tasks in warp order, the splits in split order (task t's partial output at
     * sP + t·pst: tst, in warp t's buffer). Where a split is one task (fp = 1: the served 16-key splits), a
     * loop over the splits alone with its index in 32 bits: the 64-bit task arithmetic of the general loop
     * was 11% of the batched launch's instructions (ncu), and the loop −3% / −5% of its time at 80 / 200 keys
     * (bench/RESULTS.md); u = 0 + x then v += u as there, so the same bits */
    const int64_t pst = tst ? (int64_t)TKB * R * 4 : (int64_t)H * hd;
    for (int i = threadIdx.x; i < H * hd; i += NT) {
        float v = 0.f;
        if (fp == 1) { /* a split is one task (task sp): the same sums, the index in 32 bits */
            v = ds_merge1(sP + i, (int)pst, (int)used);
        } else {
            for (int64_t sp = 0; sp < used; sp++) {
                int t0, nt;
                ds_split_range(sp, fp, tp, t0, nt);
                float u = 0.f;
                for (int t = 0; t < nt; t++) u += sP[(int64_t)(t0 + t) * pst + i];
                v += u;
            }
        }
        out[i] = pt_rnd(a.bf, v);
    }
    DS_MARK(9);
    DS_GTIME(15);
}

/* XO (gemv_tc.cu): a block's n values of row b (value i = f(i), f called once per i by the thread of i) written as
 * n/64 units of the wgmma GEMV's x at 64 columns from xo, unit bytes apart (wg_x.cuh): each value's bf16 pair by
 * its even lane, and each unit's Σx in tc_xprep_kernel's order — the steps of 8 by wg_x_put, then the 8 steps'
 * tree: lanes 8 and 16 apart (a warp's 32 values: the tree's first two levels), then the two warps' halves of
 * the unit added from shared memory. n is a multiple of 64; NT threads, a multiple of 32, take values i, i + NT,
 * ... (whole warps on whole 32-value halves); n <= PT_DS_XO_MAX. */
template <int NT, typename F>
__device__ __forceinline__ void ds_xo_row(char *xo, int unit, int b, int n, F f) {
    __shared__ float half[PT_DS_XO_MAX / 32];
    for (int i = threadIdx.x; i < n; i += NT) {
        const float v = f(i);
        float s = wg_x_put(xo + (int64_t)(i / 64) * unit, i & 63, b, 64, v, true);
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 8));
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 16));
        if ((i & 31) == 0) half[i / 32] = s;
    }
    __syncthreads();
    for (int u = threadIdx.x; u < n / 64; u += NT) *wg_x_sum(xo + (int64_t)u * unit, b, 64) = __fadd_rn(half[2 * u], half[2 * u + 1]);
}

/* Batched rows whose splits under the launch's bound are each one scores task and one p·V task (a split of at most SKB
 * and PKB keys: the served 16-key splits of the Llama and Qwen shapes; built for GQA 2 to 4): dec2_short_kernel's
 * batched form with the task loops taken out. Warp t holds split t in both phases, so the split's (max, sum) is the
 * warp's own — the generic kernel's max over the split's one task (fmaxf(−inf, x) = x) and its second butterfly over
 * one task's sum and zeros (x + 0 = x) — and needs no barrier of its own; every warp with a split forms the row max
 * and sum of each head itself from the splits' pairs (the p·V kernel's merge of them, d2_row_stats, the same lanes and
 * butterflies). The scores, probabilities, p·V products, key-slot sums and the merge are the same helpers with the
 * same arguments in the same order as there: the same bits (checked by test_cuda_ropekv, _batch_rows and
 * _serve_invariance against the single-sequence kernels). What changes is the schedule: three barriers instead of
 * seven; a warp's first key rows requested right after griddepcontrol.wait (they travel while the queries are rotated)
 * and its first value rows before the barrier ahead of the row statistics; the split's key range in 32 bits. Dense
 * builds (MB above DS_WARPS / NW: twice the plain build's blocks an SM, 64 registers) load key and value rows in
 * halves, as dec2_short_kernel's do. */
template <typename KT, int LS, int LP, int CP, int G, int NW, int MB, bool XO>
__global__ void __launch_bounds__(NW * 32, MB) dec_rows1_kernel(pt_dec_rows a) {
    pt_release_dependents(); /* batched rows: released at the start, as dec2_short_kernel's */
    DS_MARK(10);
    constexpr int NT = NW * 32, V = 16 / sizeof(KT);
    constexpr int SC = 4, SKB = 2 * (32 / LS);                     /* scores: chunks a lane, keys a batch */
    constexpr int PU = (G > 4 ? 4 : 8) / CP, PKB = PU * (32 / LP); /* p·V: load steps, keys a batch */
    constexpr bool HALF = MB > DS_WARPS / NW && PU % 2 == 0;      /* the dense builds: loads in halves */
    constexpr int KU = HALF ? 1 : 2, VU = HALF ? PU / 2 : PU;      /* load steps a load */
    const int hd = a.hd, R = hd * (int)sizeof(KT) / 16;
    const int kh = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y, cap = a.cap;
    const int32_t p = a.pos[b];
    int64_t lo, n, per, used, prow, rlo;
    ds_range(a, p, lo, n, per, used, prow, rlo);
    extern __shared__ float4 ds_smem_f4[];
    float *qs = reinterpret_cast<float *>(ds_smem_f4); /* [G, hd] the rotated queries */
    float *sS = qs + G * hd;                            /* [G, DS_MAXK] scores */
    float *sP = sS + G * DS_MAXK;                       /* [used, G, hd] the splits' partial outputs */
    float *out = a.out + (b * a.nh + (int64_t)kh * G) * hd;
    /* XO (its own build, so the kernel without it compiles as before): the block's G·hd outputs are units
     * kh·G·hd/64 .. of row b in the o projection's x (a.xo) */
    char *xo = XO ? a.xo + (int64_t)kh * (G * hd / 64) * a.xo_unit : nullptr;
    if (used == 0) { /* a padding row */
        ds_zero_row<NT>(out, G * hd);
        if constexpr (XO) ds_xo_row<NT>(xo, a.xo_unit, (int)b, G * hd, [](int) { return 0.f; });
        return;
    }
    const uint32_t dyn = ds_dyn_smem();
    if (n > DS_MAXK || used > NW || per > SKB || per > PKB || ds_smem(G, hd, (int)used, R, 0) > dyn) {
        ds_bound_error(a, n); /* the launch's bound on the keys was wrong */
        return;
    }
    __shared__ float rcs[128], rsn[128];
    __shared__ float2 sML[NW][G]; /* each split's (max, sum) per head */
    __shared__ float ps[NW][G][PKB];
    __shared__ float wM[NW][G], wInv[NW][G]; /* each warp's copy of the row max and 1/sum */
    const KT *kb = (const KT *)dec_cache(a, b, 0) + (int64_t)kh * cap * hd;
    const KT *vb = (const KT *)dec_cache(a, b, 1) + (int64_t)kh * cap * hd;
    const bool task = warp < used; /* this warp's split: keys j0 .. j1 − 1 */
    const int j0 = warp * (int)per, j1 = j0 + (int)per < (int)n ? j0 + (int)per : (int)n;
    const int ssub = lane % LS, sks = lane / LS, psub = lane % LP, pks = lane / LP;
    constexpr int QR = (G * 256 + NT - 1) / NT;
    const float *q = a.q + (b * a.nh + (int64_t)kh * G) * hd;
    pt_wait_primary(); /* q and the step's key and value rows are the previous kernels' output */
    DS_GTIME(14);
    DS_MARK(0);
    /* the split's first key rows, on their way while the queries are rotated */
    uint4 k0[KU][SC];
    if (task) d2_load<KT, LS, SC, KU>(k0, kb, rlo, cap, hd, R, j0, j1, ssub, sks);
    {
        /* the raw queries in front of the scores (written only after the second barrier in it) */
        float rq[QR];
        const float fr = ds_rows_q_load<NT>(rq, q, G * hd, a);
        ds_rows_q_rotate<NT>(rq, fr, sS, qs, rcs, rsn, G * hd, hd, p, a);
    }
    DS_MARK(3);
    float m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) m[g] = -INFINITY, l[g] = 0.f;
    uint4 v0[VU][CP];
    if (task) {
        if constexpr (HALF) {
            d2_scores_batch<KT, LS, SC, 1>(k0, qs, a, G, hd, R, j0, j1, ssub, sks, sS, DS_MAXK, m, l);
            d2_load<KT, LS, SC, 1>(k0, kb, rlo, cap, hd, R, j0 + 32 / LS, j1, ssub, sks);
            d2_scores_batch<KT, LS, SC, 1>(k0, qs, a, G, hd, R, j0 + 32 / LS, j1, ssub, sks, sS, DS_MAXK, m, l);
        } else
            d2_scores_batch<KT, LS, SC, 2>(k0, qs, a, G, hd, R, j0, j1, ssub, sks, sS, DS_MAXK, m, l);
        /* the split's first value rows, on their way during the statistics */
        d2_load<KT, LP, CP, VU>(v0, vb, rlo, cap, hd, R, j0, j1, psub, pks);
        /* the split's (max, sum) per head: pt_softmax_block's pair of a split of one task */
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float bm = pt_warp_max(m[g]);
            const float sw = pt_warp_sum(m[g] == -INFINITY ? 0.f : l[g] * expf(m[g] - bm));
            if (lane == 0) sML[warp][g] = make_float2(bm, sw);
        }
    }
    DS_MARK(4);
    __syncthreads(); /* the splits' pairs and scores */
    DS_MARK(6);
    if (task) {
        /* the row max and 1/sum of each head (dec2_pv_kernel's merge of the splits' pairs), in this warp */
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx, L;
            d2_row_stats(&sML[0][g], G, used, lane, mx, L);
            if (lane == 0) wM[warp][g] = mx, wInv[warp][g] = 1.0f / L;
        }
        __syncwarp();
        float acc[G][CP][V];
        d2_acc_zero(acc);
        d2_pv_probs(ps[warp], sS, DS_MAXK, wM[warp], wInv[warp], a.bf, G, j0, j1, lane);
        d2_pv_accum<KT, LP, CP, VU>(v0, ps[warp], 0, G, pks, acc);
        if constexpr (HALF) {
            d2_load<KT, LP, CP, VU>(v0, vb, rlo, cap, hd, R, j0 + VU * (32 / LP), j1, psub, pks);
            d2_pv_accum<KT, LP, CP, VU>(v0, ps[warp], VU, G, pks, acc);
        }
        d2_pv_keys_sum<LP>(acc, G);
        d2_pv_store<LP>(acc, sP + warp * G * hd, G, hd, R, psub, pks);
    }
    DS_MARK(7);
    __syncthreads();
    DS_MARK(8);
    /* the merge (dec2_short_kernel's loop where a split is one task): u = 0 + x, then v += u */
    const int nu = (int)used, ps_ = G * hd;
    if constexpr (XO) { /* the outputs written as the o projection's x as well (the values stored first) */
        ds_xo_row<NT>(xo, a.xo_unit, (int)b, G * hd, [&](int i) {
            const float v = pt_rnd(a.bf, ds_merge1(sP + i, ps_, nu));
            out[i] = v;
            return v;
        });
    } else
        for (int i = threadIdx.x; i < G * hd; i += NT) out[i] = pt_rnd(a.bf, ds_merge1(sP + i, ps_, nu));
    DS_MARK(9);
    DS_GTIME(15);
}

/* The most p·V tasks of any row of at most max_keys keys, and in *tsm the
 * most scores tasks (both 0: some row of the shape would have more than
 * DS_WARPS scores tasks, so the shape cannot run the one-block form). The
 * last answer is kept: an eager decode asks it for every layer of every
 * step with the same arguments. */
static int ds_max_tasks(const pt_dec_rows &a, int64_t max_keys, const d2_geom &gm, int *tsm) {
    static int64_t k_nsplit = -1, k_stride, k_minper, k_max, k_skb, k_pkb;
    static int k_tpm, k_tsm;
    if (k_nsplit == a.nsplit && k_stride == a.stride && k_minper == a.minper && k_max == max_keys && k_skb == gm.SKB &&
        k_pkb == gm.PKB) {
        *tsm = k_tsm;
        return k_tpm;
    }
    int tpm = 0, ts_max = 0;
    for (int64_t n = 1; n <= max_keys && n <= a.stride; n++) {
        int64_t per, used;
        dec_splits(n, a.nsplit, a.minper, per, used);
        const int ts = ds_tasks(n, per, used, gm.SKB);
        if (ts > DS_WARPS) {
            tpm = ts_max = 0;
            break;
        }
        const int tp = ds_tasks(n, per, used, gm.PKB);
        if (tp > tpm) tpm = tp;
        if (ts > ts_max) ts_max = ts;
    }
    k_nsplit = a.nsplit, k_stride = a.stride, k_minper = a.minper, k_max = max_keys, k_skb = gm.SKB, k_pkb = gm.PKB;
    k_tpm = tpm, k_tsm = ts_max;
    *tsm = ts_max;
    return tpm;
}

/* PETREL_CUDA_DEC_SHORT_ROWS_L2=1: each block of the batched rows' launch
 * fetches its row's cached key and value rows into the L2 before its
 * griddepcontrol.wait (two bulk prefetches), so its loads after the wait
 * find them there; default 0 (A/B, read once; the same bits either way).
 * pt_cuda_dec_short_rows_l2(0|1) sets it (a negative argument: back to the
 * environment). */
static pt_switch g_ds_l2 = {"PETREL_CUDA_DEC_SHORT_ROWS_L2", 0, -1, 0};
extern "C" void pt_cuda_dec_short_rows_l2(int on) { g_ds_l2.set(on); }

/* The batched rows' staging (c->dec_short_rows_stage, PETREL_CUDA_DEC_SHORT_ROWS_STAGE: 0 none, 1 and 2 the
 * value rows and both of up to DS_MAXK keys, 3 the value rows in room for the launch's bound, 4 by split);
 * pt_cuda_dec_short_rows_stage(0..4) overrides it (tests and benchmarks; a negative argument: back to the
 * backend's). */
static int g_ds_rows_stage = -1;
extern "C" void pt_cuda_dec_short_rows_stage(int v) { g_ds_rows_stage = v >= 0 && v <= 4 ? v : -1; }
static int ds_rows_stage(const pt_cuda *c) { return g_ds_rows_stage >= 0 ? g_ds_rows_stage : c->dec_short_rows_stage; }
/* Batched launches staged by split so far (tests check that the form ran). */
static unsigned long long g_ds_split_launches;
extern "C" unsigned long long pt_cuda_dec_short_split_count(void) {
    return __atomic_load_n(&g_ds_split_launches, __ATOMIC_RELAXED);
}

template <typename KT, int LS, int LP, int CP, int PG, int MG, int NW, bool FOLD, int MB = DS_WARPS / NW>
static pt_status ds_launch_one(pt_cuda *c, const pt_dec_rows &a, int nblk, int64_t B, size_t smem, int sfl) {
    /* the batched rows' switches (kernel argument fl): 1 the L2 prefetch; the staging pt_cuda_dec2_short
     * chose (sfl): 2 the value rows in room for the launch's bound, 4 the rows by split */
    const int fl = FOLD ? 0 : (g_ds_l2.on() ? 1 : 0) | sfl;
    if (fl & 4) __atomic_fetch_add(&g_ds_split_launches, 1ull, __ATOMIC_RELAXED);
    static bool raised; /* the static and dynamic shared memory together may pass 48 KB: raised once */
    if (!raised) {
        CUDA_CHECK(cudaFuncSetAttribute(dec2_short_kernel<KT, LS, LP, CP, PG, MG, NW, FOLD, MB>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, DS_SMEM_MAX));
        raised = true;
    }
    pt_launch(dec2_short_kernel<KT, LS, LP, CP, PG, MG, NW, FOLD, MB>, dim3((unsigned)nblk, (unsigned)B), dim3(NW * 32),
              smem, c->stream, pt_pdl_chain(), a, fl);
    CUDA_CHECK_LAUNCH("decode attention (one block per KV head or query head)");
    return PT_OK;
}

/* The batched rows' blocks per (row, KV head) compiled for twice their blocks an SM — 8-warp blocks for
 * four (64 registers, a few spilled) instead of two (128), 16-warp blocks for two instead of one — where
 * the launch has more blocks than the plain build's blocks an SM hold: the 8B shape's 64 rows under the
 * 128-key bound are 512 8-warp blocks, one wave at four an SM instead of two waves (serving, 64 streams:
 * +2.8%; at 32 rows, 256 blocks, one wave either way, the four-an-SM build lost 2%: bench/RESULTS.md). The
 * same operations in the same order. PETREL_CUDA_DEC_SHORT_ROWS_MINB=2 (the plain builds) or 4 (the dense
 * ones; the numbers name the 8-warp blocks an SM) forces either (read once), as does
 * pt_cuda_dec_short_rows_minb(2 or 4) (tests; 0: back to the rule). */
static int g_ds_minb = -1;
extern "C" void pt_cuda_dec_short_rows_minb(int v) { g_ds_minb = v == 2 || v == 4 ? v : 0; }
static bool ds_rows_dense(const pt_cuda *c, int64_t blocks, int per_sm) {
    if (g_ds_minb < 0) {
        static const int mb[] = {2, 4};
        pt_cuda_dec_short_rows_minb(pt_env_pick("PETREL_CUDA_DEC_SHORT_ROWS_MINB", mb, 2, 0));
    }
    return g_ds_minb == 4 || (g_ds_minb == 0 && blocks > per_sm * (int64_t)c->sm_count);
}
/* The batched rows' launch per (row, KV head) of NW-warp blocks in the build ds_rows_dense picks. */
template <typename KT, int LS, int LP, int CP, int PG, int NW>
static pt_status ds_launch_rows_kv(pt_cuda *c, const pt_dec_rows &a, int nblk, int64_t B, size_t smem, int sfl) {
    constexpr int MB = DS_WARPS / NW;
    if (ds_rows_dense(c, nblk * B, MB))
        return ds_launch_one<KT, LS, LP, CP, PG, PG, NW, false, 2 * MB>(c, a, nblk, B, smem, sfl);
    return ds_launch_one<KT, LS, LP, CP, PG, PG, NW, false>(c, a, nblk, B, smem, sfl);
}

/* The batched rows' one-task splits (dec_rows1_kernel): PETREL_CUDA_DEC_ROWS1 (default 1; 0: the generic
 * kernel, A/B; read once); pt_cuda_dec_rows1(0|1) overrides it (tests and benchmarks; a negative argument:
 * back to the environment). Launches so far are counted (tests check which kernel ran). */
static pt_switch g_ds_rows1 = {"PETREL_CUDA_DEC_ROWS1", 1, -1, 0};
extern "C" void pt_cuda_dec_rows1(int v) { g_ds_rows1.set(v); }
extern "C" unsigned long long pt_cuda_dec_rows1_count(void) { return g_ds_rows1.count(); }
/* Batched-rows calls that took the one-block form (either kernel) so far: tests check where a bound takes it. */
static unsigned long long g_ds_rows_launches;
extern "C" unsigned long long pt_cuda_dec_short_rows_count(void) {
    return __atomic_load_n(&g_ds_rows_launches, __ATOMIC_RELAXED);
}
template <typename KT, int LS, int LP, int CP, int G, int NW, int MB, bool XO>
static pt_status ds_launch_rows1_k(pt_cuda *c, const pt_dec_rows &a, int64_t B, size_t smem) {
    static bool raised;
    if (!raised) {
        CUDA_CHECK(cudaFuncSetAttribute(dec_rows1_kernel<KT, LS, LP, CP, G, NW, MB, XO>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, DS_SMEM_MAX));
        raised = true;
    }
    pt_launch(dec_rows1_kernel<KT, LS, LP, CP, G, NW, MB, XO>, dim3((unsigned)a.nkv, (unsigned)B), dim3(NW * 32), smem,
              c->stream, pt_pdl_chain(), a);
    CUDA_CHECK_LAUNCH("decode attention (batched rows, one task a split)");
    return PT_OK;
}
/* ... its build writing the o projection's x too where a.xo is set (gemv_tc.cu XO) */
template <typename KT, int LS, int LP, int CP, int G, int NW, int MB>
static pt_status ds_launch_rows1_one(pt_cuda *c, const pt_dec_rows &a, int64_t B, size_t smem) {
    g_ds_rows1.counted();
    return a.xo ? ds_launch_rows1_k<KT, LS, LP, CP, G, NW, MB, true>(c, a, B, smem)
                : ds_launch_rows1_k<KT, LS, LP, CP, G, NW, MB, false>(c, a, B, smem);
}
/* dec_rows1_kernel of NW-warp blocks (8 under a bound of at most 8 splits, else 16) in the build
 * ds_rows_dense picks, as dec2_short_kernel's batched launches. */
template <typename KT, int LS, int LP, int CP, int G>
static pt_status ds_launch_rows1(pt_cuda *c, const pt_dec_rows &a, int64_t B, size_t smem, bool w8) {
    if (w8)
        return ds_rows_dense(c, a.nkv * B, 2) ? ds_launch_rows1_one<KT, LS, LP, CP, G, 8, 4>(c, a, B, smem)
                                               : ds_launch_rows1_one<KT, LS, LP, CP, G, 8, 2>(c, a, B, smem);
    return ds_rows_dense(c, a.nkv * B, 1) ? ds_launch_rows1_one<KT, LS, LP, CP, G, 16, 2>(c, a, B, smem)
                                           : ds_launch_rows1_one<KT, LS, LP, CP, G, 16, 1>(c, a, B, smem);
}
/* ... for the shape's GQA group G, 2 to 4 (the kernel's head arrays are G long: the generic kernel's loops
 * over the block's G heads of its arrays of 4, the same operations per head). */
template <typename KT, int LS, int LP, int CP>
static pt_status ds_launch_rows1_g(pt_cuda *c, const pt_dec_rows &a, int G, int64_t B, size_t smem, bool w8) {
    switch (G) {
    case 2: return ds_launch_rows1<KT, LS, LP, CP, 2>(c, a, B, smem, w8);
    case 3: return ds_launch_rows1<KT, LS, LP, CP, 3>(c, a, B, smem, w8);
    default: return ds_launch_rows1<KT, LS, LP, CP, 4>(c, a, B, smem, w8);
    }
}

/* One sequence, a block per query head: the fewest warps a block, 4, 8 or
 * 16, that hold every scores task of a row under the launch's bound (a warp
 * a task) and a thread per element of the head (the folded RoPE and cache
 * write), each build compiled for DS_WARPS / NW blocks an SM. A block of
 * 16 warps takes a whole SM's registers (119 a thread), so it starts only
 * once the q/k/v GEMV's blocks have left that SM; one of 4 or 8 warps
 * starts beside them. The tasks and their order are the same whatever the
 * block's size (the spare warps of a larger block hold no keys): the same
 * bits. Under the compiled decode's bound (PT_DEC_SHORT_KEYS) the 1B
 * shape's blocks are 8 warps, the 8B shape's 16; an eager step's bound is
 * its own keys. Measured in bench/RESULTS.md, "2026-12-04 (sixth
 * session)". PETREL_CUDA_DEC_SHORT_WARPS=8 takes 8 or 16, =16 always
 * 16 (read once); pt_cuda_dec_short_warps(8 or 16) likewise (tests; 0:
 * back to the rule). */
static int g_ds_warps = -1;
extern "C" void pt_cuda_dec_short_warps(int v) { g_ds_warps = v == 8 || v == 16 ? v : 0; }
/* One-sequence launches made so far with 4, 8 and 16 warps a block (tests check which ran). */
static unsigned long long g_ds_fold_launches[3];
extern "C" unsigned long long pt_cuda_dec_short_fold_count(int nw) {
    return nw == 4 || nw == 8 || nw == 16 ? __atomic_load_n(&g_ds_fold_launches[nw / 8], __ATOMIC_RELAXED) : 0;
}
static int ds_fold_warps(int ts, int hd) {
    if (g_ds_warps < 0) {
        static const int nw[] = {8, 16};
        pt_cuda_dec_short_warps(pt_env_pick("PETREL_CUDA_DEC_SHORT_WARPS", nw, 2, 0));
    }
    for (int nw = g_ds_warps ? g_ds_warps : 4; nw < DS_WARPS; nw *= 2)
        if (ts <= nw && hd <= 32 * nw) return nw;
    return DS_WARPS;
}

template <typename KT>
pt_status pt_cuda_dec2_short(pt_cuda *c, const pt_dec_rows &a, int64_t B, int64_t max_keys) {
    const int G = a.nh / a.nkv, R = a.hd * (int)sizeof(KT) / 16;
    /* one sequence with the fold, or batched rows whose keys are appended (the queries' RoPE alone) */
    const bool rows = a.kvp != nullptr;
    if (!a.inv_freq || (rows ? a.kn != nullptr : !a.kn || B != 1) || max_keys <= 0 || max_keys > DS_MAXK ||
        G > DEC_MAX_G || R < 4 || R > 64 || (R > 32 && sizeof(KT) != 4) || B < 1 || B > 65535 ||
        a.cap > INT32_MAX) /* ds_range's 32-bit arithmetic */
        return PT_ERR_UNSUPPORTED;
    const d2_geom gm = d2_geometry(R, G);
    int ts;
    const int tp = ds_max_tasks(a, max_keys, gm, &ts);
    /* query heads a block: one sequence, a block per query head (c->dec_short_heads); batched rows, a block
     * per (row, query head) while those fit in one wave of two 8-warp blocks an SM, else per (row, KV head),
     * which reads the KV head's rows once for its G heads (c->dec_short_rows_heads forces either); 8 warps
     * a block where no row has more than 8 scores tasks */
    const bool w8 = rows && ts <= 8;
    const int rh = c->dec_short_rows_heads;
    const int H = !rows ? (c->dec_short_heads ? 1 : G)
                        : rh == 1 || (rh < 0 && w8 && B * a.nh <= 2LL * c->sm_count) ? 1 : G;
    int nst = rows ? ds_rows_stage(c) : c->dec_short_stage; /* the key and value rows staged where they fit */
    /* 3 (batched rows): the value rows staged in room for the launch's bound, not DS_MAXK keys */
    const size_t vbound = nst == 3 ? (size_t)max_keys * R * 16 : 0;
    /* 4 (batched rows): staged by split, where every split of the bound fits a warp's buffer (ds_task_fits) */
    const int tkb = gm.SKB < gm.PKB ? gm.SKB : gm.PKB;
    int64_t per_max = 0, used_max = 0;
    dec_splits(max_keys < a.stride ? max_keys : a.stride, a.nsplit, a.minper, per_max, used_max);
    const bool tst = nst == 4 && ds_task_fits(per_max, tkb, H, a.hd, R);
    if (nst >= 3) nst = 0;
    while (nst > 0 && ds_smem(H, a.hd, tp, R, nst) > DS_SMEM_MAX) nst--;
    const size_t smem = tst ? ds_smem_task(H, a.hd, w8 ? 8 : 16, tkb, R) : ds_smem(H, a.hd, tp, R, nst) + vbound;
    const int sfl = (vbound ? 2 : 0) | (tst ? 4 : 0); /* the kernel's staging flags (rows only) */
    if (tp == 0 || smem > DS_SMEM_MAX) return PT_ERR_UNSUPPORTED;
    if (rows) __atomic_fetch_add(&g_ds_rows_launches, 1ull, __ATOMIC_RELAXED);
    const int nblk = a.nkv * (G / H);
    /* batched rows whose splits are each one task (dec_rows1_kernel: 16-bit caches, GQA 2 to 4, rows of 5 to
     * 16 chunks: heads of 40 to 128), a block per (row, KV head), unstaged, without the L2 prefetch */
    if constexpr (sizeof(KT) == 2)
        if (rows && H == G && G >= 2 && G <= 4 && R > 4 && R <= 16 && nst == 0 && !tst && !vbound && !g_ds_l2.on() &&
            g_ds_rows1.on() && per_max <= gm.SKB && per_max <= gm.PKB) {
            /* every split one task of each kind: tp = ts <= the block's warps (8 where w8, else at most 16); the
             * lanes a key row as the generic kernel's PT_DS below takes them for R */
            const pt_status st = R > 8 ? ds_launch_rows1_g<KT, 4, 16, 1>(c, a, G, B, smem, w8)
                                       : ds_launch_rows1_g<KT, 2, 8, 1>(c, a, G, B, smem, w8);
            /* it wrote the output projection's x too where asked (a.xo, gemv_tc.cu XO) */
            if (st == PT_OK && a.xo) pt_cuda_tc_xo_made(c, a.out, (int)B, a.nh * a.hd);
            return st;
        }
    const int fw = rows || H != 1 ? 16 : ds_fold_warps(ts, a.hd);
    if (!rows) __atomic_fetch_add(&g_ds_fold_launches[fw / 8], 1ull, __ATOMIC_RELAXED);
#define PT_DS_G(LS, LP, CP, PG)                                                                                    \
    return rows ? (w8 ? (H == 1 ? ds_launch_one<KT, LS, LP, CP, PG, 1, 8, false>(c, a, nblk, B, smem, sfl)            \
                                : ds_launch_rows_kv<KT, LS, LP, CP, PG, 8>(c, a, nblk, B, smem, sfl))                 \
                      : (H == 1 ? ds_launch_one<KT, LS, LP, CP, PG, 1, 16, false>(c, a, nblk, B, smem, sfl)           \
                                : ds_launch_rows_kv<KT, LS, LP, CP, PG, 16>(c, a, nblk, B, smem, sfl)))               \
           : H == 1 ? (fw == 4   ? ds_launch_one<KT, LS, LP, CP, PG, 1, 4, true>(c, a, nblk, B, smem, 0)              \
                       : fw == 8 ? ds_launch_one<KT, LS, LP, CP, PG, 1, 8, true>(c, a, nblk, B, smem, 0)              \
                                 : ds_launch_one<KT, LS, LP, CP, PG, 1, 16, true>(c, a, nblk, B, smem, 0))            \
                    : ds_launch_one<KT, LS, LP, CP, PG, PG, 16, true>(c, a, nblk, B, smem, 0)
#define PT_DS(LS, LP, CP)                                                                                          \
    do {                                                                                                           \
        if (G <= 4) PT_DS_G(LS, LP, CP, 4);                                                                        \
        PT_DS_G(LS, LP, CP, 8);                                                                                    \
    } while (0)
    if (R <= 4) PT_DS(1, 4, 1);
    if (R <= 8) PT_DS(2, 8, 1);
    if (R <= 16) PT_DS(4, 16, 1);
    if (R <= 32) PT_DS(8, 32, 1);
    if constexpr (sizeof(KT) == 4) PT_DS(16, 32, 2);
#undef PT_DS
#undef PT_DS_G
    return PT_ERR_UNSUPPORTED;
}

template pt_status pt_cuda_dec2_short<float>(pt_cuda *c, const pt_dec_rows &a, int64_t B, int64_t max_keys);
template pt_status pt_cuda_dec2_short<__nv_bfloat16>(pt_cuda *c, const pt_dec_rows &a, int64_t B, int64_t max_keys);
template pt_status pt_cuda_dec2_short<__half>(pt_cuda *c, const pt_dec_rows &a, int64_t B, int64_t max_keys);
