/* MoE routing and expert gather (backend.h moe_route, moe_ffn).
 *
 * moe_route: one block per token: softmax over the router logits in f32,
 * top-k by k passes of a block argmax (ties to the lower index), optional
 * renormalization and per-expert scale, weights rounded to the activation
 * dtype — the CPU reference's order of operations (cpu_ops.c).
 *
 * moe_ffn: for every (token, k) pair the expert's gate/up projections run as
 * one batched GEMV launch whose expert index is read from device memory (no
 * host round trip: the decode step stays capturable), then the gated
 * activation, then the down projection the same way; a final kernel weights
 * each expert output and accumulates them in ascending expert order, rounding
 * after each add like the reference. The decode path (below; on unless
 * PETREL_CUDA_MOE_V2=0) does the same arithmetic in three launches: routing
 * one warp per token, gate|up + activation, down + combine.
 *
 * Prefill (T >= PT_MOE_GROUP_MIN_T rows, bf16 activations, outside a graph
 * capture): the (token, k) items are grouped by expert instead — a stable
 * counting sort on the device (counts per expert, offsets on the host, one
 * block per expert writing its items in token order), the token rows
 * gathered into bf16 in that order, then each projection of all experts
 * as one launch of the grouped tensor-core kernel (gemm_tc.cu: each block
 * takes up to 128 rows of one expert and dequantizes that expert's weights
 * in shared memory) for 4/8-bit weights with bf16 scales, else per expert
 * one cuBLAS GEMM over all of its rows (weights dequantized a batch of
 * experts at a time into the matmul tile); either way each expert's weights
 * are read once per chunk (per 128 rows) instead of once per token. The outputs are rounded as the GEMV
 * path rounds them (after each projection, after the activation) and the
 * combine reads each item's row through the inverse permutation, so the
 * order of the weighted sum is unchanged. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"

#include <stdlib.h>
#include <string.h>

#define ROUTE_THREADS 128

/* Block argmax of v[0..E) (ties: lower index). Returns the index, -1 if none. */
__device__ int block_argmax(const float *v, int E, float *sv, int *si) {
    float best = -INFINITY;
    int bi = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (v[e] != -INFINITY && (bi < 0 || v[e] > best)) {
            best = v[e];
            bi = e;
        }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int oi = si[threadIdx.x + s], mi = si[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    const int r = si[0];
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(ROUTE_THREADS)
    moe_route_kernel(int32_t *idx, float *weights, const float *logits, int E, int k, int renorm,
                     const float *per_expert_scale, int bf) {
    extern __shared__ float prob[]; /* [E] */
    __shared__ float sv[ROUTE_THREADS], red[32];
    __shared__ int si[ROUTE_THREADS];
    const int64_t t = blockIdx.x;
    const float *l = logits + t * E;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
    m = pt_block_max(m, red);
    float s = 0.f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float p = expf(l[e] - m);
        prob[e] = p;
        s += p;
    }
    const float sum = pt_block_sum(s, red); /* also a barrier for prob[] */
    for (int e = threadIdx.x; e < E; e += blockDim.x) prob[e] = prob[e] / sum;
    __syncthreads();
    int32_t *it = idx + t * k;
    float *wt = weights + t * k;
    for (int j = 0; j < k; j++) {
        const int best = block_argmax(prob, E, sv, si);
        if (threadIdx.x == 0) {
            it[j] = best;
            wt[j] = prob[best];
            prob[best] = -INFINITY; /* taken */
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float tsum = 0.f;
        for (int j = 0; j < k; j++) tsum += wt[j];
        for (int j = 0; j < k; j++) {
            float w = renorm ? wt[j] / tsum : wt[j];
            if (per_expert_scale) w *= per_expert_scale[it[j]];
            wt[j] = pt_rnd(bf, w);
        }
    }
}

/* ---- the decode path (PETREL_CUDA_MOE_V2, on unless "0") ------------------
 * The same arithmetic as the kernels it replaces, in fewer and wider
 * launches (the per-item GEMV ran 6144 blocks of one warp per projection and
 * the routing and combine were one-block kernels):
 *  - routing: one warp per token (moe_route_warp_kernel) instead of a block
 *    of ROUTE_THREADS; the softmax sum is formed in the block kernel's order
 *    (the ROUTE_THREADS virtual threads' serial sums, each warp of them
 *    reduced by the butterfly, the four warp sums as (s0 + s2) + (s1 + s3)),
 *    the top-k is an exact argmax (order-free), so the picks and weights are
 *    the same bits;
 *  - gate|up + activation: one launch (moe_gu_kernel) over (row pair, item);
 *    the block stages x in shared memory once, a warp holds its lanes'
 *    slices of it in registers and computes two gate rows and the matching
 *    two up rows (every code and scale load issued before the arithmetic),
 *    then the GLU, so the gate/up scratch and the GLU launch go away;
 *  - down + combine: one launch (moe_down_kernel) over (8 output rows,
 *    token); warp j computes the 8 rows of the token's j-th expert into
 *    shared memory, then 8 threads form the weighted sum in ascending
 *    (expert, slot) order, rounding after each add as moe_combine_kernel.
 * Each row's dot product is formed exactly as the fast GEMV (matmul.cu,
 * gemv_fast_kernel) forms it with one warp per row: lane l takes the
 * 16-byte code chunks l, l + 32, ... in order, per chunk
 * scale·Σq·x + bias·Σx, then the warp's butterfly sum; so a token's result
 * depends on nothing but its own row (batch-invariant), and equals the
 * per-item path wherever that path chose one warp per row (the MoE shapes'
 * decode). Applies to 4/8-bit experts in the MLX layout with K <= 2048 (x
 * fits the registers: 64 values per lane); other weights take the per-item
 * path. From MOE_EXPERT_MIN_B items (T·top_k) on, the same per-row code runs
 * over an expert grid instead (moe_gu_expert_kernel, moe_down_expert_kernel
 * + moe_combine_kernel, below): one block per (rows, expert) that keeps its
 * rows in registers for all the items that picked the expert; each (row,
 * item) value and the combine are the same bits as in the per-item grid. */
static int g_moe_v2 = -1;
static int moe_v2_on(void) {
    if (g_moe_v2 < 0) g_moe_v2 = pt_env_on("PETREL_CUDA_MOE_V2");
    return g_moe_v2;
}
/* For tests and benchmarks that compare both paths in one process: 1 the
 * decode path above, 0 the per-item kernels, -1 re-reads the environment. */
extern "C" void pt_cuda_moe_select(int v2) {
    g_moe_v2 = v2 < 0 ? -1 : v2 != 0;
    (void)moe_v2_on();
}

#define ROUTE_WARPS 4 /* tokens (warps) per block of the warp routing kernel */

/* One warp per token; prob[] is this warp's slice of the shared memory
 * (E floats). Same results as moe_route_kernel (see above). */
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_warp_kernel(int32_t *idx, float *weights, const float *logits, int64_t T, int E, int k, int renorm,
                          const float *per_expert_scale, int bf) {
    extern __shared__ float route_sm[]; /* [warps per block][E] */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= T) return;
    float *prob = route_sm + (size_t)warp * E;
    const float *l = logits + t * E;
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = pt_warp_max(m); /* a max: the same whatever the order */
    /* virtual thread v = 32·w + lane of the ROUTE_THREADS-thread block sums
     * e = v, v + ROUTE_THREADS, ... in that order */
    float s[ROUTE_THREADS / 32];
#pragma unroll
    for (int w = 0; w < ROUTE_THREADS / 32; w++) {
        float a = 0.f;
        for (int e = 32 * w + lane; e < E; e += ROUTE_THREADS) {
            const float p = expf(l[e] - m);
            prob[e] = p;
            a += p;
        }
        s[w] = pt_warp_sum(a);
    }
    static_assert(ROUTE_THREADS == 128, "pt_block_sum's second stage below is written for four warps");
    const float sum = (s[0] + s[2]) + (s[1] + s[3]);
    __syncwarp();
    for (int e = lane; e < E; e += 32) prob[e] = prob[e] / sum;
    __syncwarp();
    /* lane 0 keeps the picks (k <= 64) and writes them once at the end:
     * reading them back from global memory cost a round trip per pick */
    int32_t pick[64];
    float pw[64];
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int bi = -1;
        for (int e = lane; e < E; e += 32)
            if (prob[e] != -INFINITY && (bi < 0 || prob[e] > best)) {
                best = prob[e];
                bi = e;
            }
        /* (value, index) argmax, ties to the lower index: one total order,
         * so every lane ends with the same pick */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            pick[j] = bi;
            pw[j] = bi >= 0 ? prob[bi] : 0.f;
            if (bi >= 0) prob[bi] = -INFINITY; /* taken */
        }
        __syncwarp();
    }
    if (lane == 0) {
        int32_t *it = idx + t * k;
        float *wt = weights + t * k;
        float tsum = 0.f;
        for (int j = 0; j < k; j++) tsum += pw[j];
        for (int j = 0; j < k; j++) {
            float w = renorm ? pw[j] / tsum : pw[j];
            if (per_expert_scale) w *= per_expert_scale[pick[j]];
            it[j] = pick[j];
            wt[j] = pt_rnd(bf, w);
        }
    }
}

pt_status pt_cuda_moe_route(pt_backend *be, int32_t *idx, float *weights, const float *logits, int64_t T,
                            const pt_moe_route *p) {
    pt_cuda *c = pt_cuda_of(be);
    const int E = p->n_experts, k = p->top_k;
    if (E <= 0 || k <= 0 || k > E || E > 4096)
        return pt_error(PT_ERR_INVALID_ARG, "moe_route: top_k %d of %d experts is invalid", k, E);
    if (T <= 0) return PT_OK;
    if (moe_v2_on()) {
        /* four tokens per block while their slices fit the default 48 KiB */
        const int wpb = (size_t)E * sizeof(float) * ROUTE_WARPS <= 48 * 1024 ? ROUTE_WARPS : 1;
        pt_launch(moe_route_warp_kernel, dim3((unsigned)((T + wpb - 1) / wpb)), dim3(32 * wpb),
                  (size_t)wpb * E * sizeof(float), c->stream, pt_pdl_chain(), idx, weights, logits, T, E, k,
                  p->renorm, p->per_expert_scale, pt_cuda_bf(be));
        CUDA_CHECK_LAUNCH("moe_route");
        return PT_OK;
    }
    moe_route_kernel<<<(unsigned)T, ROUTE_THREADS, (size_t)E * sizeof(float), c->stream>>>(
        idx, weights, logits, E, k, p->renorm, p->per_expert_scale, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("moe_route");
    return PT_OK;
}

/* y[t, i] = Σ over the token's experts in ascending index order of
 * round(o[r(t·k + j), i] · w[t, j]), rounded after each add; r = inv (the
 * grouped prefill's row of each item) or the identity when inv is NULL. */
__global__ void moe_combine_kernel(float *y, const float *o, const int32_t *idx, const float *weights, int64_t T,
                                   int k, int64_t H, int bf, const int32_t *inv) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, d = i % H;
        const int32_t *it = idx + t * k;
        float acc = 0.f;
        int prev = -1, prev_j = -1;
        /* Visit the k picks in ascending (expert, slot) order without sorting:
         * k is small (<= 64) and each step finds the next larger pair. */
        for (int n = 0; n < k; n++) {
            int bj = -1;
            for (int j = 0; j < k; j++) {
                const int e = it[j];
                const bool after = e > prev || (e == prev && j > prev_j);
                if (after && (bj < 0 || e < it[bj])) bj = j;
            }
            prev = it[bj];
            prev_j = bj;
            const int64_t row = inv ? (int64_t)inv[t * k + bj] : t * k + bj;
            /* _rn: no contraction into an FMA, which the compiler may or may
             * not form per kernel in f32 mode; moe_down_kernel's combine
             * gives these bits too */
            acc = pt_rnd(bf, __fadd_rn(acc, pt_rnd(bf, __fmul_rn(o[row * H + d], weights[t * k + bj]))));
        }
        y[i] = acc;
    }
}

/* ---- grouped prefill ------------------------------------------------------ */

/* Below this many rows moe_ffn keeps the per-item GEMV: batched decode
 * (matmul_rows, up to --parallel 256 rows) needs every row's result to equal
 * the single-row result bit for bit, which the GEMV gives and a GEMM over a
 * group does not; a prefill chunk of at least this many rows is never such a
 * batch. */
#define PT_MOE_GROUP_MIN_T 257

/* cnt[e] = number of items b < B with idx[b] == e; one block per expert. */
__global__ void __launch_bounds__(256) moe_count_kernel(int32_t *cnt, const int32_t *idx, int64_t B) {
    __shared__ float red[32];
    const int e = blockIdx.x;
    float n = 0.f; /* exact: B < 2^24 */
    for (int64_t b = threadIdx.x; b < B; b += blockDim.x) n += idx[b] == e ? 1.f : 0.f;
    n = pt_block_sum(n, red);
    if (threadIdx.x == 0) cnt[e] = (int32_t)n;
}

/* Stable placement: expert e's items, in item order, go to rows
 * off[e], off[e] + 1, ...: perm[row] = item, inv[item] = row. One block of
 * 256 threads per expert walks the items 256 at a time; a warp ballot and
 * the warps' counts in shared memory give each match its rank. */
__global__ void __launch_bounds__(256) moe_place_kernel(int32_t *perm, int32_t *inv, const int32_t *idx,
                                                        const int32_t *off, int64_t B) {
    __shared__ int wc[8];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t base = off[e];
    for (int64_t b0 = 0; b0 < B; b0 += 256) {
        const int64_t b = b0 + threadIdx.x;
        const bool hit = b < B && idx[b] == e;
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) wc[warp] = __popc(m);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < 8; w++) {
            before += w < warp ? wc[w] : 0;
            total += wc[w];
        }
        if (hit) {
            const int64_t row = base + before + __popc(m & ((1u << lane) - 1u));
            perm[row] = (int32_t)b;
            inv[b] = (int32_t)row;
        }
        base += total;
        __syncthreads(); /* wc is rewritten next round */
    }
}

/* xg[row, :] = x[perm[row] / k, :] as bf16 (the values are bf16 already in
 * bf16 mode: exact). H % 4 == 0; rows from blockIdx.y. */
__global__ void moe_gather_kernel(bf16 *xg, const float *x, const int32_t *perm, int64_t B, int k, int64_t H) {
    const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* float4 index in the row */
    if (q * 4 >= H) return;
    for (int64_t row = blockIdx.y; row < B; row += gridDim.y) {
        const int64_t t = perm[row] / k;
        const float4 v = *reinterpret_cast<const float4 *>(x + t * H + q * 4);
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<uint32_t *>(&a);
        u.y = *reinterpret_cast<uint32_t *>(&b);
        *reinterpret_cast<uint2 *>(xg + row * H + q * 4) = u;
    }
}

/* In place: v = round_bf16(v) over n floats; then (out != NULL) a bf16 copy. */
__global__ void moe_round_kernel(float *v, int64_t n, bf16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const bf16 h = __float2bfloat16_rn(v[i]);
        if (out) out[i] = h;
        else v[i] = __bfloat162float(h);
    }
}

/* Whether a matrix can feed the grouped path: quantized 2-8 bit (dequantized
 * to bf16 into the tile) or dense bf16 (read in place); no bias. */
static bool grouped_ok(const pt_matrix *w) {
    if (!w) return true;
    if (w->bias) return false;
    return w->bits > 0 || w->dtype == PT_FT_BF16;
}

/* Experts [e0, e1) of w as bf16 [e1 - e0, rows, cols]: the weight itself
 * when it is dense bf16, else dequantized into dst. */
static pt_status expert_rows(pt_cuda *c, const bf16 **out, bf16 *dst, const pt_matrix *w, int64_t e0, int64_t e1) {
    if (w->bits == 0) {
        *out = (const bf16 *)pt_cuda_w(w)->data + (size_t)e0 * (size_t)w->rows * (size_t)w->cols;
        return PT_OK;
    }
    PT_TRY(pt_cuda_dequant_bf16(c, dst, w, e0 * w->rows, (e1 - e0) * w->rows));
    *out = dst;
    return PT_OK;
}

/* One GEMM: C[n, m] (row-major, ldc) = X[n, k] · A[m, k]ᵀ, bf16 inputs, f32
 * output and accumulation (the column-major view C[m, n] = Aᵀ·X). */
static pt_status gemm_bf16(pt_cuda *c, float *C, int64_t ldc, const bf16 *A, const bf16 *X, int64_t m, int64_t n,
                           int64_t k) {
    const float one = 1.f, zero = 0.f;
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, A, CUDA_R_16BF, (int)k,
                              X, CUDA_R_16BF, (int)k, &zero, C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return PT_OK;
}

/* For every expert with rows: C[off[e] .. off[e] + cnt[e], col0 ..] =
 * X[off[e] ..] · W[e]ᵀ, the experts' weights made bf16 a batch at a time
 * (as many as fit the tile). */
static pt_status grouped_proj(pt_cuda *c, float *C, int64_t ldc, int64_t col0, const bf16 *X, const pt_matrix *w,
                              const int32_t *cnt, const int64_t *off, int64_t E) {
    const int64_t per = w->rows * w->cols; /* bf16 values of one expert */
    int64_t batch = w->bits ? (int64_t)(c->tile_bytes / 2) / per : E;
    if (batch < 1) return pt_error(PT_ERR_UNSUPPORTED, "moe_ffn: an expert of %lld values exceeds the tile", (long long)per);
    for (int64_t e0 = 0; e0 < E; e0 += batch) {
        int64_t e1 = e0 + batch < E ? e0 + batch : E;
        while (e0 < e1 && cnt[e0] == 0) e0++; /* skip unused experts at the ends */
        while (e1 > e0 && cnt[e1 - 1] == 0) e1--;
        if (e0 == e1) continue;
        const bf16 *A;
        PT_TRY(expert_rows(c, &A, (bf16 *)c->tile, w, e0, e1));
        for (int64_t e = e0; e < e1; e++)
            if (cnt[e] > 0)
                PT_TRY(gemm_bf16(c, C + off[e] * ldc + col0, ldc, A + (e - e0) * per, X + off[e] * w->cols, w->rows,
                                 cnt[e], w->cols));
        if (!w->bits) break; /* dense: every expert in one pass */
    }
    return PT_OK;
}

/* PETREL_CUDA_MOE_TC=0 keeps the grouped prefill on cuBLAS (one GEMM per
 * expert) instead of the grouped tensor-core kernel (A/B). */
static int moe_tc_on(void) {
    static int v = -1;
    if (v < 0) v = pt_env_on("PETREL_CUDA_MOE_TC");
    return v;
}

static pt_status moe_ffn_grouped(pt_cuda *c, float *y, const float *x, int64_t T, const int32_t *idx,
                                 const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                                 const pt_matrix *down, pt_glu_kind act) {
    const int64_t H = down->rows, I = down->cols, B = T * top_k;
    const int64_t E = gate->n_experts > 1 ? gate->n_experts : 1;
    if (T < PT_MOE_GROUP_MIN_T || c->base.act != PT_ACT_BF16 || H % 8 || I % 8 || !grouped_ok(gate) ||
        !grouped_ok(up) || !grouped_ok(down) || E > 65535 || B >= (1 << 24) || !c->tile)
        return PT_ERR_UNSUPPORTED;
    cudaStreamCaptureStatus cap;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) return PT_ERR_UNSUPPORTED; /* the host reads the counts */
    /* device scratch (int32 units): tiles [ntmax] int4, off [E], cnt [E], perm [B], inv [B]; the tiles
     * (tensor-core GEMM, one per 128 rows of an expert) and the offsets travel in one upload */
    const int64_t ntmax = B / 128 + E + 1;
    const size_t need = (size_t)(4 * ntmax + 2 * E + 2 * B);
    if (need > c->moe_idx_n) {
        if (c->moe_idx) CUDA_CHECK(cudaFree(c->moe_idx));
        c->moe_idx = NULL;
        c->moe_idx_n = 0;
        CUDA_CHECK(cudaMalloc((void **)&c->moe_idx, need * 4));
        c->moe_idx_n = need;
    }
    const int4 *tiles_d = (const int4 *)c->moe_idx;
    int32_t *off_d = c->moe_idx + 4 * ntmax, *cnt_d = off_d + E, *perm = cnt_d + E, *inv = perm + B;
    /* host: tiles [ntmax] int4 + off32 [E] (the upload), cnt [E], off [E] int64 */
    int32_t *hbuf = (int32_t *)calloc((size_t)(4 * ntmax + 2 * E + 2 * E), sizeof(int32_t));
    if (!hbuf) return pt_error(PT_ERR_NOMEM, "moe_ffn: out of host memory");
    int4 *tiles = (int4 *)hbuf;
    int32_t *off32 = hbuf + 4 * ntmax, *cnt = off32 + E;
    int64_t *off = (int64_t *)(cnt + E);
    pt_status st = PT_OK;
    moe_count_kernel<<<(unsigned)E, 256, 0, c->stream>>>(cnt_d, idx, B);
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaMemcpyAsync(cnt, cnt_d, (size_t)E * 4, cudaMemcpyDeviceToHost, c->stream);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(c->stream);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        free(hbuf);
        return pt_error(PT_ERR_DEVICE, "moe_ffn: counting the items per expert: %s", cudaGetErrorString(ce));
    }
    int64_t total = 0;
    for (int64_t e = 0; e < E; e++) {
        off[e] = total;
        off32[e] = (int32_t)total;
        total += cnt[e];
    }
    if (total != B) { /* an index outside the stack: the GEMV path finds and reports it */
        free(hbuf);
        return PT_ERR_UNSUPPORTED;
    }
    int64_t ntiles = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = off[e]; r < off[e] + cnt[e]; r += 128)
            tiles[ntiles++] = make_int4((int)r, (int)(off[e] + cnt[e]), (int)e, 0);
    /* one synchronous copy (the host buffer is freed below) */
    ce = cudaMemcpyAsync(c->moe_idx, hbuf, (size_t)(4 * ntmax + E) * 4, cudaMemcpyHostToDevice, c->stream);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(c->stream);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        free(hbuf);
        return pt_error(PT_ERR_DEVICE, "moe_ffn: uploading the expert offsets: %s", cudaGetErrorString(ce));
    }
    /* one projection of every expert: the grouped tensor-core kernel (one launch) where it takes the
     * weight, else one cuBLAS GEMM per expert */
    auto proj = [&](float *C, int64_t ldc, int64_t col0, const bf16 *X, const pt_matrix *w) -> pt_status {
        if (moe_tc_on() && pt_cuda_gemm_tc_ok(c, w))
            return pt_cuda_gemm_tc_grouped(c, C + col0, ldc, X, B, w, tiles_d, ntiles);
        return grouped_proj(c, C, ldc, col0, X, w, cnt, off, E);
    };
    bf16 *xg = (bf16 *)c->moe_o;                 /* [B, H] gathered rows (moe_o is free until the down GEMMs) */
    bf16 *hb = (bf16 *)c->moe_g;                 /* [B, I] activation as bf16 (moe_g is free after the glu) */
    const unsigned ry = (unsigned)(B < 65535 ? B : 65535);
    do {
        moe_place_kernel<<<(unsigned)E, 256, 0, c->stream>>>(perm, inv, idx, off_d, B);
        moe_gather_kernel<<<dim3((unsigned)((H / 4 + 127) / 128), ry), 128, 0, c->stream>>>(xg, x, perm, B, top_k, H);
        ce = cudaGetLastError();
        if (ce != cudaSuccess) {
            st = pt_error(PT_ERR_DEVICE, "moe_ffn: grouping kernels: %s", cudaGetErrorString(ce));
            break;
        }
        /* gate|up: moe_g[row, 0..2I) */
        if (up) {
            if ((st = proj(c->moe_g, 2 * I, 0, xg, gate)) != PT_OK) break;
            if ((st = proj(c->moe_g, 2 * I, I, xg, up)) != PT_OK) break;
        } else if ((st = proj(c->moe_g, 2 * I, 0, xg, gate)) != PT_OK) {
            break;
        }
        const bool tc_gu = moe_tc_on() && pt_cuda_gemm_tc_ok(c, gate) && (!up || pt_cuda_gemm_tc_ok(c, up));
        if (!tc_gu) /* the tensor-core kernel stores rounded values already */
            moe_round_kernel<<<pt_cuda_blocks(B * 2 * I, 256), 256, 0, c->stream>>>(c->moe_g, B * 2 * I, NULL);
        if ((st = pt_cuda_glu(&c->base, c->moe_h, c->moe_g, c->moe_g + I, B, I, 2 * I, act)) != PT_OK) break;
        moe_round_kernel<<<pt_cuda_blocks(B * I, 256), 256, 0, c->stream>>>(c->moe_h, B * I, hb);
        if ((st = proj(c->moe_o, H, 0, hb, down)) != PT_OK) break;
        if (!(moe_tc_on() && pt_cuda_gemm_tc_ok(c, down)))
            moe_round_kernel<<<pt_cuda_blocks(B * H, 256), 256, 0, c->stream>>>(c->moe_o, B * H, NULL);
        moe_combine_kernel<<<pt_cuda_blocks(T * H, 256), 256, 0, c->stream>>>(y, c->moe_o, idx, weights, T, top_k, H,
                                                                             1, inv);
        ce = cudaGetLastError();
        if (ce != cudaSuccess) st = pt_error(PT_ERR_DEVICE, "moe_ffn: grouped kernels: %s", cudaGetErrorString(ce));
    } while (0);
    free(hbuf);
    return st;
}

/* ---- decode path: the expert GEMVs ---------------------------------------- */

#define MOE_GU_WARPS 4 /* warps per block of moe_gu_kernel */
#define MOE_GU_RPW 2   /* gate rows (and as many up rows) per warp */
#define MOE_DN_ROWS 8  /* output rows per block of moe_down_kernel */
#define MOE_DN_WARPS 8 /* most warps per block of moe_down_kernel (one expert each) */
#define MOE_MAX_X 64   /* x values per lane held in registers: K <= 32·64 = 2048 */

/* One expert stack in the MLX layout, the part a kernel reads. */
struct moe_qm {
    const uint32_t *codes;        /* [E·rows, K·BITS/32] */
    const void *scales, *biases;  /* [E·rows, K/gs] of st */
    const void *bias;             /* [E·rows] of bt, or NULL */
    pt_ftype st, bt;
    int gs, gshift;               /* group size, its log2 (gs is 32, 64 or 128) */
    int64_t rows;                 /* rows per expert */
    int64_t row_off;              /* first row used (the up half of a fused gate|up) */
};

static moe_qm moe_qm_of(const pt_matrix *w, int64_t row_off) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    moe_qm m;
    m.codes = (const uint32_t *)cw->data;
    m.scales = cw->scales;
    m.biases = cw->biases;
    m.bias = cw->bias;
    m.st = w->dtype;
    m.bt = w->bias_dtype;
    m.gs = w->group_size;
    m.gshift = w->group_size == 32 ? 5 : w->group_size == 64 ? 6 : 7;
    m.rows = w->rows;
    m.row_off = row_off;
    return m;
}

/* Item b's expert; outside [0, E) it raises the error word (matmul.cu's
 * protocol: flag 2, the value) and the item computes zeros from expert 0. */
__device__ __forceinline__ int64_t moe_item_expert(const int32_t *idx, int64_t b, int64_t E, int *err, bool &ok) {
    int64_t e = idx[b];
    ok = e >= 0 && e < E;
    if (!ok) {
        if ((threadIdx.x & 31) == 0 && atomicCAS(err, 0, 2) == 0) err[1] = (int)e;
        e = 0;
    }
    return e;
}

/* The lane's x chunks c = lane + 32·j (VPC values each, chunk c at
 * x + c·stride), as the fast GEMV uses them: 4-bit values pre-multiplied by
 * 16^-i (i = the value's place in its 16-bit half: exact, a power of two),
 * and Σx per chunk in its order. SMEM: x is the shared-memory copy of
 * moe_stage_x (plain loads), else global memory (read-only loads). */
template <int BITS, int CPL, bool SMEM>
__device__ __forceinline__ void moe_load_x(float (&xr)[CPL][128 / BITS], float (&sx)[CPL], const float *x,
                                           int64_t stride, int64_t nchunks, int lane) {
    constexpr int VPC = 128 / BITS;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int64_t c = lane + 32 * j;
        sx[j] = 0.f;
#pragma unroll
        for (int q = 0; q < VPC / 4; q++) {
            float4 xv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (c < nchunks) {
                const float4 *p = reinterpret_cast<const float4 *>(x + c * stride) + q;
                xv = SMEM ? *p : __ldg(p);
            }
            sx[j] += xv.x + xv.y + xv.z + xv.w;
            if constexpr (BITS == 4) {
                xr[j][4 * q] = xv.x, xr[j][4 * q + 1] = xv.y * 0.0625f, xr[j][4 * q + 2] = xv.z * 0.00390625f,
                          xr[j][4 * q + 3] = xv.w * 0.000244140625f;
            } else {
                xr[j][4 * q] = xv.x, xr[j][4 * q + 1] = xv.y, xr[j][4 * q + 2] = xv.z, xr[j][4 * q + 3] = xv.w;
            }
        }
    }
}

/* x [K] into shared memory by the whole block (coalesced 16-byte loads),
 * chunk c at xs + c·(VPC + 4). Read straight from global memory, each
 * lane's chunk is 128 bytes (4-bit) from its neighbour's, so one 16-byte
 * load of the warp touches 32 lines (32 L1 wavefronts; at one warp per row
 * this was the GEMV's bottleneck); the 4-float pad here puts the lanes'
 * reads four to a bank group: 4 wavefronts per 512 bytes, the minimum. */
template <int BITS>
__device__ __forceinline__ void moe_stage_x(float *xs, const float *x, int64_t K) {
    constexpr int VPC = 128 / BITS;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (int64_t i = threadIdx.x; i < K / 4; i += blockDim.x) {
        const int64_t c = i / (VPC / 4), q = i % (VPC / 4);
        *reinterpret_cast<float4 *>(xs + c * (VPC + 4) + 4 * q) = __ldg(x4 + i);
    }
}

/* Σ q·x' over one 16-byte chunk of codes, in gemv_fast_kernel's order (the
 * magic-number conversion: a code OR-ed into the mantissa of 2^23). */
template <int BITS>
__device__ __forceinline__ float moe_chunk_dot(const uint4 &w, const float *xr) {
    const float MAGIC = 8388608.0f;
    constexpr int VPC = 128 / BITS;
    float d = 0.f;
#pragma unroll
    for (int q = 0; q < VPC / 4; q++) {
        const int wi = BITS == 4 ? q >> 1 : q;
        const uint32_t word = wi == 0 ? w.x : wi == 1 ? w.y : wi == 2 ? w.z : w.w;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t bits;
            if constexpr (BITS == 4) {
                const uint32_t half = (q & 1) ? word >> 16 : word;
                bits = (half & (0xFu << (4 * i))) | 0x4B000000u;
            } else {
                bits = __byte_perm(word, 0x4B000000u, (unsigned)(i | (4 << 4) | (5 << 8) | (7 << 12)));
            }
            d = fmaf(__uint_as_float(bits) - MAGIC, xr[4 * q + i], d);
        }
    }
    return d;
}

/* The lane's codes of global row grow (chunks lane + 32·j; zeros past the
 * row) and the chunks' scales and biases: every load of a row issued before
 * any is used, so a warp's rows are in flight together (loaded inside the
 * dot product, each row's scales cost a memory round trip in turn). */
template <int BITS, int CPL>
__device__ __forceinline__ void moe_load_row(uint4 (&w)[CPL], float (&sc)[CPL], float (&bi)[CPL], const moe_qm &m,
                                             int64_t grow, int64_t K, int64_t nchunks, int lane) {
    constexpr int VPC = 128 / BITS;
    const uint4 *rp = reinterpret_cast<const uint4 *>(m.codes + grow * (K * BITS / 32));
    const int64_t ngroups = K >> m.gshift; /* shifts: a 64-bit division is a subroutine */
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int c = lane + 32 * j;
        w[j] = make_uint4(0u, 0u, 0u, 0u);
        sc[j] = bi[j] = 0.f;
        if (c < nchunks) {
            w[j] = __ldg(rp + c);
            const int64_t gi = grow * ngroups + ((c * VPC) >> m.gshift);
            if (m.st == PT_FT_BF16) {
                sc[j] = __bfloat162float(__ldg((const __nv_bfloat16 *)m.scales + gi));
                bi[j] = __bfloat162float(__ldg((const __nv_bfloat16 *)m.biases + gi));
            } else {
                sc[j] = pt_ld(m.st, m.scales, gi);
                bi[j] = pt_ld(m.st, m.biases, gi);
            }
        }
    }
}

/* The lane's partial of a row: Σ over its chunks of scale·d + bias·Σx. */
template <int BITS, int CPL>
__device__ __forceinline__ float moe_row_partial(const uint4 (&w)[CPL], const float (&sc)[CPL], const float (&bi)[CPL],
                                                 const float (&xr)[CPL][128 / BITS], const float (&sx)[CPL],
                                                 int64_t nchunks, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
        const int64_t c = lane + 32 * j;
        if (c < nchunks) {
            const float d = moe_chunk_dot<BITS>(w[j], xr[j]);
            acc += sc[j] * d + bi[j] * sx[j];
        }
    }
    return acc;
}

/* The row's value as the fast GEMV stores it: the warp sum (added to 0, the
 * one-warp block's fold), the bias, the rounding; zeros for a bad expert. */
__device__ __forceinline__ float moe_row_out(float v, const moe_qm &m, int64_t grow, bool eok, int bf) {
    v = 0.f + v;
    if (m.bias) v += pt_ld(m.bt, m.bias, grow);
    return eok ? pt_rnd(bf, v) : 0.f;
}

/* A warp's 2·RPW rows of expert e: gate rows r0 .. r0 + RPW, then the
 * same up rows (rows past I read row I − 1 and store nothing). */
template <int BITS, int CPL>
__device__ __forceinline__ void moe_gu_rows(uint4 (&w)[2 * MOE_GU_RPW][CPL], float (&sc)[2 * MOE_GU_RPW][CPL],
                                            float (&bi)[2 * MOE_GU_RPW][CPL], int64_t (&grow)[2 * MOE_GU_RPW],
                                            const moe_qm &g, const moe_qm &u, int64_t e, int64_t r0, int64_t I,
                                            int64_t K, int64_t nchunks, int lane) {
#pragma unroll
    for (int d = 0; d < 2 * MOE_GU_RPW; d++) {
        const moe_qm &m = d < MOE_GU_RPW ? g : u;
        const int64_t r = r0 + d % MOE_GU_RPW < I ? r0 + d % MOE_GU_RPW : I - 1;
        grow[d] = e * m.rows + m.row_off + r;
        moe_load_row<BITS, CPL>(w[d], sc[d], bi[d], m, grow[d], K, nchunks, lane);
    }
}

/* h[b, r0 .. r0 + RPW) = glu(gate row · x, up row · x) from the rows of
 * moe_gu_rows and item b's x staged in xs (moe_stage_x), rounded as
 * pt_cuda_glu rounds (pt_glu_val, the GLU kernel's own code). */
template <int BITS, int CPL>
__device__ __forceinline__ void moe_gu_out(float *h, int64_t b, const float *xs,
                                           const uint4 (&w)[2 * MOE_GU_RPW][CPL],
                                           const float (&sc)[2 * MOE_GU_RPW][CPL],
                                           const float (&bi)[2 * MOE_GU_RPW][CPL],
                                           const int64_t (&grow)[2 * MOE_GU_RPW], const moe_qm &g, const moe_qm &u,
                                           int64_t r0, int64_t I, int64_t nchunks, int lane, bool eok, int bf,
                                           int act) {
    constexpr int VPC = 128 / BITS;
    float xr[CPL][VPC], sx[CPL];
    moe_load_x<BITS, CPL, true>(xr, sx, xs, VPC + 4, nchunks, lane);
    float v[2 * MOE_GU_RPW];
#pragma unroll
    for (int d = 0; d < 2 * MOE_GU_RPW; d++)
        v[d] = pt_warp_sum(moe_row_partial<BITS, CPL>(w[d], sc[d], bi[d], xr, sx, nchunks, lane));
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MOE_GU_RPW; r++) {
            if (r0 + r >= I) break;
            const float gv = moe_row_out(v[r], g, grow[r], eok, bf);
            const float uv = moe_row_out(v[MOE_GU_RPW + r], u, grow[MOE_GU_RPW + r], eok, bf);
            h[b * I + r0 + r] = pt_glu_val(act, gv, uv, bf);
        }
    }
}

/* h[b, r] = act(gate row r · x) · (up row r · x) for item b (x row b / k),
 * rounded as pt_cuda_glu rounds; r in [0, I). Grid (I / (WARPS·RPW), B). */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_GU_WARPS * 32)
    moe_gu_kernel(float *h, const float *x, const int32_t *idx, int k, int64_t K, int64_t I, moe_qm g, moe_qm u,
                  int64_t n_experts, int *err, int bf, int act) {
    constexpr int VPC = 128 / BITS;
    __shared__ __align__(16) float xs[32 * CPL * (VPC + 4)]; /* x of the block's item, chunks padded */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y;
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_GU_WARPS + warp) * MOE_GU_RPW;
    bool eok;
    const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
    const int64_t nchunks = K / VPC;
    /* every code and scale load of the warp's 2·RPW rows first (rows past
     * I read row I − 1 and store nothing), then x through shared memory */
    uint4 w[2 * MOE_GU_RPW][CPL];
    float sc[2 * MOE_GU_RPW][CPL], bi[2 * MOE_GU_RPW][CPL];
    int64_t grow[2 * MOE_GU_RPW];
    moe_gu_rows<BITS, CPL>(w, sc, bi, grow, g, u, e, r0, I, K, nchunks, lane);
    moe_stage_x<BITS>(xs, x + (b / k) * K, K);
    __syncthreads();
    if (r0 >= I) return;
    moe_gu_out<BITS, CPL>(h, b, xs, w, sc, bi, grow, g, u, r0, I, nchunks, lane, eok, bf, act);
}

/* y[t, d0 .. d0 + DN_ROWS) = the weighted sum over token t's k experts of
 * (down row d · h[t·k + j]), combined as moe_combine_kernel. Grid
 * (H / DN_ROWS, T); block min(k, DN_WARPS) warps, warp w takes experts
 * j = w, w + warps, ... */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_DN_WARPS * 32)
    moe_down_kernel(float *y, const float *h, const int32_t *idx, const float *weights, int k, int64_t H,
                    int64_t I, moe_qm m, int64_t n_experts, int *err, int bf) {
    __shared__ float o[64][MOE_DN_ROWS]; /* [k][row]: each expert's rounded output */
    __shared__ int ord[64];              /* the slots in ascending (expert, slot) order */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t t = blockIdx.y, d0 = (int64_t)blockIdx.x * MOE_DN_ROWS;
    constexpr int VPC = 128 / BITS;
    const int64_t nchunks = I / VPC;
#pragma unroll 1 /* the body is 8 rows unrolled already */
    for (int j = warp; j < k; j += nw) {
        const int64_t b = t * k + j;
        bool eok;
        const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
        uint4 w[MOE_DN_ROWS][CPL];
        float sc[MOE_DN_ROWS][CPL], bi[MOE_DN_ROWS][CPL];
        int64_t grow[MOE_DN_ROWS];
#pragma unroll
        for (int r = 0; r < MOE_DN_ROWS; r++) {
            grow[r] = e * m.rows + (d0 + r < H ? d0 + r : d0);
            moe_load_row<BITS, CPL>(w[r], sc[r], bi[r], m, grow[r], I, nchunks, lane);
        }
        float xr[CPL][VPC], sx[CPL];
        moe_load_x<BITS, CPL, false>(xr, sx, h + b * I, VPC, nchunks, lane);
#pragma unroll
        for (int r = 0; r < MOE_DN_ROWS; r++) {
            const float v = pt_warp_sum(moe_row_partial<BITS, CPL>(w[r], sc[r], bi[r], xr, sx, nchunks, lane));
            if (lane == 0) o[j][r] = moe_row_out(v, m, grow[r], eok, bf);
        }
    }
    if (threadIdx.x == 0) {
        /* moe_combine_kernel's walk: the next larger (expert, slot) pair each step */
        const int32_t *it = idx + t * k;
        int prev = -1, prev_j = -1;
        for (int n = 0; n < k; n++) {
            int bj = -1;
            for (int j = 0; j < k; j++) {
                const int e = it[j];
                const bool after = e > prev || (e == prev && j > prev_j);
                if (after && (bj < 0 || e < it[bj])) bj = j;
            }
            prev = it[bj];
            prev_j = bj;
            ord[n] = bj;
        }
    }
    __syncthreads();
    if (threadIdx.x < MOE_DN_ROWS && d0 + threadIdx.x < H) {
        const float *wt = weights + t * k;
        float acc = 0.f;
        for (int n = 0; n < k; n++) {
            const int j = ord[n];
            acc = pt_rnd(bf, __fadd_rn(acc, pt_rnd(bf, __fmul_rn(o[j][threadIdx.x], wt[j])))); /* as moe_combine_kernel */
        }
        y[t * H + d0 + threadIdx.x] = acc;
    }
}

/* ---- the decode path's expert grid (batches of more than MOE_EXPERT_MIN_B
 * items) ----------------------------------------------------------------------
 * The kernels above run one block per (rows, item): every item re-reads its
 * expert's rows, so at a few tokens the weights are read top_k·T times. These
 * run one block per (rows, expert): the block loads its rows of the expert
 * into registers once, finds the items that picked the expert (a scan of
 * idx[0 .. B) in ascending order) and forms each item's rows with the same
 * per-row code as the kernels above (moe_load_row, moe_load_x,
 * moe_row_partial, the butterfly, moe_row_out): each (row, item) value is
 * the same bits whichever grid computed it, so a token's result still
 * depends on nothing but its own row. Items whose index is outside [0, E)
 * belong to expert 0's blocks (they compute zeros from expert 0 and raise
 * the error word, as moe_item_expert does). A block whose expert nobody
 * picked exits after the scan. */

/* The items b in [base, base + blockDim.x) ∩ [0, B) routed to expert e, in
 * ascending order, into items[]; returns their count. Every thread calls it. */
__device__ __forceinline__ int moe_expert_items(int *items, int *wcount, const int32_t *idx, int64_t base, int64_t B,
                                                int64_t e, int64_t n_experts) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t b = base + threadIdx.x;
    bool hit = false;
    if (b < B) {
        const int64_t v = idx[b];
        hit = v == e || (e == 0 && (v < 0 || v >= n_experts));
    }
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    __syncthreads(); /* the previous tile's readers of items[] and wcount[] are done */
    if (lane == 0) wcount[warp] = __popc(m);
    __syncthreads();
    int off = 0, n = 0;
    for (int w = 0; w < nw; w++) {
        if (w < warp) off += wcount[w];
        n += wcount[w];
    }
    if (hit) items[off + __popc(m & ((1u << lane) - 1u))] = (int)b;
    __syncthreads();
    return n;
}

/* Whether any item of idx[0 .. B) is routed to expert e (block-wide). */
__device__ __forceinline__ bool moe_expert_used(const int32_t *idx, int64_t B, int64_t e, int64_t n_experts) {
    bool hit = false;
    for (int64_t b = threadIdx.x; b < B && !hit; b += blockDim.x) {
        const int64_t v = idx[b];
        hit = v == e || (e == 0 && (v < 0 || v >= n_experts));
    }
    return __syncthreads_or(hit) != 0;
}

/* moe_gu_kernel over grid (I / (WARPS·RPW), E): the same h[b, r] for every
 * item b that picked expert blockIdx.y. */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_GU_WARPS * 32)
    moe_gu_expert_kernel(float *h, const float *x, const int32_t *idx, int64_t B, int k, int64_t K, int64_t I,
                         moe_qm g, moe_qm u, int64_t n_experts, int *err, int bf, int act) {
    constexpr int VPC = 128 / BITS;
    __shared__ __align__(16) float xs[32 * CPL * (VPC + 4)]; /* x of the current item, chunks padded */
    __shared__ int items[MOE_GU_WARPS * 32];                  /* this tile's items of the expert */
    __shared__ int wcount[MOE_GU_WARPS];
    pt_release_dependents();
    pt_wait_primary();
    const int64_t e = blockIdx.y;
    if (!moe_expert_used(idx, B, e, n_experts)) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_GU_WARPS + warp) * MOE_GU_RPW;
    const int64_t nchunks = K / VPC;
    /* the warp's 2·RPW rows of the expert, once for all its items */
    uint4 w[2 * MOE_GU_RPW][CPL];
    float sc[2 * MOE_GU_RPW][CPL], bi[2 * MOE_GU_RPW][CPL];
    int64_t grow[2 * MOE_GU_RPW];
    moe_gu_rows<BITS, CPL>(w, sc, bi, grow, g, u, e, r0, I, K, nchunks, lane);
    for (int64_t base = 0; base < B; base += blockDim.x) {
        const int n = moe_expert_items(items, wcount, idx, base, B, e, n_experts);
#pragma unroll 1
        for (int i = 0; i < n; i++) {
            const int64_t b = items[i];
            bool eok;
            (void)moe_item_expert(idx, b, n_experts, err, eok);
            moe_stage_x<BITS>(xs, x + (b / k) * K, K);
            __syncthreads();
            if (r0 < I) moe_gu_out<BITS, CPL>(h, b, xs, w, sc, bi, grow, g, u, r0, I, nchunks, lane, eok, bf, act);
            __syncthreads(); /* xs is rewritten for the next item */
        }
    }
}

#define MOE_DNE_WARPS 4 /* warps (DN_ROWS rows each) per block of moe_down_expert_kernel */

/* o[b, d] = down row d of expert blockIdx.y · h[b] for every item b that
 * picked it, rounded as moe_down_kernel rounds its per-expert outputs; grid
 * (H / (DNE_WARPS·DN_ROWS), E). moe_combine_kernel then sums them in
 * moe_down_kernel's order and rounding. */
template <int BITS, int CPL>
__global__ void __launch_bounds__(MOE_DNE_WARPS * 32)
    moe_down_expert_kernel(float *o, const float *h, const int32_t *idx, int64_t B, int64_t H, int64_t I, moe_qm m,
                           int64_t n_experts, int *err, int bf) {
    __shared__ int items[MOE_DNE_WARPS * 32];
    __shared__ int wcount[MOE_DNE_WARPS];
    pt_release_dependents();
    pt_wait_primary();
    const int64_t e = blockIdx.y;
    if (!moe_expert_used(idx, B, e, n_experts)) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t d0 = ((int64_t)blockIdx.x * MOE_DNE_WARPS + warp) * MOE_DN_ROWS;
    constexpr int VPC = 128 / BITS;
    const int64_t nchunks = I / VPC;
    uint4 w[MOE_DN_ROWS][CPL];
    float sc[MOE_DN_ROWS][CPL], bi[MOE_DN_ROWS][CPL];
    int64_t grow[MOE_DN_ROWS];
#pragma unroll
    for (int r = 0; r < MOE_DN_ROWS; r++) {
        grow[r] = e * m.rows + (d0 + r < H ? d0 + r : d0 < H ? d0 : H - 1);
        moe_load_row<BITS, CPL>(w[r], sc[r], bi[r], m, grow[r], I, nchunks, lane);
    }
    for (int64_t base = 0; base < B; base += blockDim.x) {
        const int n = moe_expert_items(items, wcount, idx, base, B, e, n_experts);
        if (d0 >= H) continue;
#pragma unroll 1
        for (int i = 0; i < n; i++) {
            const int64_t b = items[i];
            bool eok;
            (void)moe_item_expert(idx, b, n_experts, err, eok);
            float xr[CPL][VPC], sx[CPL];
            moe_load_x<BITS, CPL, false>(xr, sx, h + b * I, VPC, nchunks, lane);
#pragma unroll
            for (int r = 0; r < MOE_DN_ROWS; r++) {
                const float v = pt_warp_sum(moe_row_partial<BITS, CPL>(w[r], sc[r], bi[r], xr, sx, nchunks, lane));
                if (lane == 0 && d0 + r < H) o[b * H + d0 + r] = moe_row_out(v, m, grow[r], eok, bf);
            }
        }
    }
}

/* Chunks per lane for K columns of BITS-bit codes when the decode kernels
 * take them (1, 2 or 4 with at most MOE_MAX_X values of x per lane), else 0. */
static int moe_cpl(int64_t K, int bits) {
    const int vpc = 128 / bits;
    if (K % vpc) return 0;
    const int64_t nchunks = K / vpc, cpl = (nchunks + 31) / 32;
    if (cpl * vpc > MOE_MAX_X) return 0;
    return cpl <= 1 ? 1 : cpl <= 2 ? 2 : 4;
}

/* Whether an expert stack can feed the decode kernels: 4/8-bit MLX layout
 * with 16-byte aligned rows. */
static bool moe_v2_weight(const pt_matrix *w) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    return cw && !cw->tc && (w->bits == 4 || w->bits == 8) && moe_cpl(w->cols, w->bits) > 0 &&
           (uintptr_t)cw->data % 16 == 0;
}

template <int BITS, int CPL>
static pt_status launch_gu(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k, int64_t K,
                           int64_t I, const moe_qm &g, const moe_qm &u, int64_t E, int act) {
    const int64_t per_block = MOE_GU_WARPS * MOE_GU_RPW;
    pt_launch(moe_gu_kernel<BITS, CPL>, dim3((unsigned)((I + per_block - 1) / per_block), (unsigned)B),
              dim3(MOE_GU_WARPS * 32), 0, c->stream, pt_pdl_chain(), h, x, idx, k, K, I, g, u, E, c->err_dev,
              (int)(c->base.act == PT_ACT_BF16), act);
    CUDA_CHECK_LAUNCH("moe gate|up");
    return PT_OK;
}

template <int BITS, int CPL>
static pt_status launch_down(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights,
                             int64_t T, int k, int64_t H, int64_t I, const moe_qm &m, int64_t E) {
    const int warps = k < MOE_DN_WARPS ? k : MOE_DN_WARPS;
    pt_launch(moe_down_kernel<BITS, CPL>, dim3((unsigned)((H + MOE_DN_ROWS - 1) / MOE_DN_ROWS), (unsigned)T),
              dim3(32 * warps), 0, c->stream, pt_pdl_chain(), y, h, idx, weights, k, H, I, m, E, c->err_dev,
              (int)(c->base.act == PT_ACT_BF16));
    CUDA_CHECK_LAUNCH("moe down");
    return PT_OK;
}

template <int BITS, int CPL>
static pt_status launch_gu_expert(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k,
                                  int64_t K, int64_t I, const moe_qm &g, const moe_qm &u, int64_t E, int act) {
    const int64_t per_block = MOE_GU_WARPS * MOE_GU_RPW;
    pt_launch(moe_gu_expert_kernel<BITS, CPL>, dim3((unsigned)((I + per_block - 1) / per_block), (unsigned)E),
              dim3(MOE_GU_WARPS * 32), 0, c->stream, pt_pdl_chain(), h, x, idx, B, k, K, I, g, u, E, c->err_dev,
              (int)(c->base.act == PT_ACT_BF16), act);
    CUDA_CHECK_LAUNCH("moe gate|up (expert grid)");
    return PT_OK;
}

template <int BITS, int CPL>
static pt_status launch_down_expert(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights,
                                    int64_t T, int k, int64_t H, int64_t I, const moe_qm &m, int64_t E) {
    const int64_t per_block = MOE_DNE_WARPS * MOE_DN_ROWS;
    const int bf = (int)(c->base.act == PT_ACT_BF16);
    pt_launch(moe_down_expert_kernel<BITS, CPL>, dim3((unsigned)((H + per_block - 1) / per_block), (unsigned)E),
              dim3(MOE_DNE_WARPS * 32), 0, c->stream, pt_pdl_chain(), c->moe_o, h, idx, T * k, H, I, m, E,
              c->err_dev, bf);
    CUDA_CHECK_LAUNCH("moe down (expert grid)");
    moe_combine_kernel<<<pt_cuda_blocks(T * H, 256), 256, 0, c->stream>>>(y, c->moe_o, idx, weights, T, k, H, bf,
                                                                         (const int32_t *)NULL);
    CUDA_CHECK_LAUNCH("moe_combine");
    return PT_OK;
}

/* The expert grid from this many items (T·top_k) up. Measured on the H200
 * at the Qwen3-30B-A3B expert shape (bench/RESULTS.md): slower than the
 * per-item grid at 32 and 128 items (its items run one after another in a
 * block, and the blocks of idle experts still scan the item list), level at
 * 512, faster from there (prefill chunks of 128 tokens). */
#define MOE_EXPERT_MIN_B 512
static int g_moe_expert_grid = -1;
static int64_t g_moe_expert_min_b = MOE_EXPERT_MIN_B;
/* For tests: the expert grid from b items up (b <= 0: the default). */
extern "C" void pt_cuda_moe_expert_min(int b) { g_moe_expert_min_b = b > 0 ? b : MOE_EXPERT_MIN_B; }
static bool moe_expert_grid(int64_t B, int64_t E) {
    if (g_moe_expert_grid < 0) g_moe_expert_grid = pt_env_on("PETREL_CUDA_MOE_EXPERT_GRID");
    return g_moe_expert_grid && B >= g_moe_expert_min_b && E <= 65535;
}

static pt_status moe_gu(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k,
                        const pt_matrix *gate, const pt_matrix *up, int64_t I, int act) {
    const int64_t K = gate->cols, E = gate->n_experts > 1 ? gate->n_experts : 1;
    const moe_qm g = moe_qm_of(gate, 0), u = up ? moe_qm_of(up, 0) : moe_qm_of(gate, I);
    const int cpl = moe_cpl(K, gate->bits);
    if (moe_expert_grid(B, E)) {
        if (gate->bits == 4)
            return cpl == 1 ? launch_gu_expert<4, 1>(c, h, x, idx, B, k, K, I, g, u, E, act)
                            : launch_gu_expert<4, 2>(c, h, x, idx, B, k, K, I, g, u, E, act);
        return cpl == 1   ? launch_gu_expert<8, 1>(c, h, x, idx, B, k, K, I, g, u, E, act)
               : cpl == 2 ? launch_gu_expert<8, 2>(c, h, x, idx, B, k, K, I, g, u, E, act)
                          : launch_gu_expert<8, 4>(c, h, x, idx, B, k, K, I, g, u, E, act);
    }
    if (gate->bits == 4)
        return cpl == 1 ? launch_gu<4, 1>(c, h, x, idx, B, k, K, I, g, u, E, act)
                        : launch_gu<4, 2>(c, h, x, idx, B, k, K, I, g, u, E, act);
    return cpl == 1   ? launch_gu<8, 1>(c, h, x, idx, B, k, K, I, g, u, E, act)
           : cpl == 2 ? launch_gu<8, 2>(c, h, x, idx, B, k, K, I, g, u, E, act)
                      : launch_gu<8, 4>(c, h, x, idx, B, k, K, I, g, u, E, act);
}

static pt_status moe_down(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights, int64_t T,
                          int k, const pt_matrix *down) {
    const int64_t H = down->rows, I = down->cols, E = down->n_experts > 1 ? down->n_experts : 1;
    const moe_qm m = moe_qm_of(down, 0);
    const int cpl = moe_cpl(I, down->bits);
    if (moe_expert_grid(T * k, E)) {
        if (down->bits == 4)
            return cpl == 1 ? launch_down_expert<4, 1>(c, y, h, idx, weights, T, k, H, I, m, E)
                            : launch_down_expert<4, 2>(c, y, h, idx, weights, T, k, H, I, m, E);
        return cpl == 1   ? launch_down_expert<8, 1>(c, y, h, idx, weights, T, k, H, I, m, E)
               : cpl == 2 ? launch_down_expert<8, 2>(c, y, h, idx, weights, T, k, H, I, m, E)
                          : launch_down_expert<8, 4>(c, y, h, idx, weights, T, k, H, I, m, E);
    }
    if (down->bits == 4)
        return cpl == 1 ? launch_down<4, 1>(c, y, h, idx, weights, T, k, H, I, m, E)
                        : launch_down<4, 2>(c, y, h, idx, weights, T, k, H, I, m, E);
    return cpl == 1   ? launch_down<8, 1>(c, y, h, idx, weights, T, k, H, I, m, E)
           : cpl == 2 ? launch_down<8, 2>(c, y, h, idx, weights, T, k, H, I, m, E)
                      : launch_down<8, 4>(c, y, h, idx, weights, T, k, H, I, m, E);
}

pt_status pt_cuda_moe_ffn(pt_backend *be, float *y, const float *x, int64_t T, const int32_t *idx,
                          const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                          const pt_matrix *down, pt_glu_kind act) {
    pt_cuda *c = pt_cuda_of(be);
    const int64_t H = down->rows, I = down->cols;
    PT_ASSERT(top_k > 0 && top_k <= 64);
    PT_ASSERT(gate->cols == H && (up ? gate->rows == I && up->rows == I : gate->rows == 2 * I));
    if (T <= 0) return PT_OK;
    const int64_t B = T * top_k;
    if ((size_t)B > c->moe_rows || (size_t)I > c->moe_ffn || (size_t)H > c->moe_cols)
        return pt_error(PT_ERR_INVALID_ARG,
                        "moe_ffn: scratch not reserved for %lld tokens × top-%d, ffn %lld, hidden %lld (call reserve)",
                        (long long)T, top_k, (long long)I, (long long)H);
    {
        pt_status gs = moe_ffn_grouped(c, y, x, T, idx, weights, top_k, gate, up, down, act);
        if (gs != PT_ERR_UNSUPPORTED) return gs;
    }
    /* the decode path: gate|up + GLU in one launch (gate and up of one
     * width), down + combine in one launch */
    const bool v2 = moe_v2_on() && !c->no_fast_gemv && (uintptr_t)x % 16 == 0 && T <= 65535 && B <= 65535;
    const bool v2_gu = v2 && moe_v2_weight(gate) && (!up || (moe_v2_weight(up) && up->bits == gate->bits));
    const bool v2_down = v2 && moe_v2_weight(down);
    if (v2_gu) {
        PT_TRY(moe_gu(c, c->moe_h, x, idx, B, top_k, gate, up, I, (int)act));
    } else {
        /* gate|up rows of each item: moe_g[b, 0..2I) */
        if (up) {
            PT_TRY(pt_cuda_gemv_items(c, c->moe_g, x, B, top_k, gate, idx, 0, 0, I, 2 * I));
            PT_TRY(pt_cuda_gemv_items(c, c->moe_g + I, x, B, top_k, up, idx, 0, 0, I, 2 * I));
        } else {
            PT_TRY(pt_cuda_gemv_items(c, c->moe_g, x, B, top_k, gate, idx, 0, 0, 2 * I, 2 * I));
        }
        PT_TRY(pt_cuda_glu(be, c->moe_h, c->moe_g, c->moe_g + I, B, I, 2 * I, act));
    }
    if (v2_down) return moe_down(c, y, c->moe_h, idx, weights, T, top_k, down);
    PT_TRY(pt_cuda_gemv_items(c, c->moe_o, c->moe_h, B, 1, down, idx, 0, 0, H, H));
    moe_combine_kernel<<<pt_cuda_blocks(T * H, 256), 256, 0, c->stream>>>(y, c->moe_o, idx, weights, T, top_k, H,
                                                                         pt_cuda_bf(be), (const int32_t *)NULL);
    CUDA_CHECK_LAUNCH("moe_combine");
    return PT_OK;
}
