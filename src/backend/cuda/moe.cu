/* MoE routing, the combine and the grouped prefill (backend.h moe_route,
 * moe_ffn); the decode path's kernels are in moe_decode.cu.
 *
 * moe_route: one block per token: softmax over the router logits in f32,
 * top-k by k passes of a block argmax (ties to the lower index), optional
 * renormalization and per-expert scale, weights rounded to the activation
 * dtype — the CPU reference's order of operations (cpu_ops.c). With the
 * decode path on (PETREL_CUDA_MOE_V2, moe_decode.cu) the same picks and
 * weights come from one warp per token instead.
 *
 * moe_ffn: for every (token, k) pair the expert's gate/up projections run as
 * one batched GEMV launch whose expert index is read from device memory (no
 * host round trip: the decode step stays capturable), then the gated
 * activation, then the down projection the same way; a final kernel weights
 * each expert output and accumulates them in ascending expert order, rounding
 * after each add like the reference. The decode path (moe_decode.cu; on
 * unless PETREL_CUDA_MOE_V2=0) does the same arithmetic in fewer launches:
 * routing one warp per token, gate|up + activation, down + combine.
 *
 * Prefill (T >= PT_MOE_GROUP_MIN_T rows, bf16 activations, outside a graph
 * capture): the (token, k) items are grouped by expert instead — a stable
 * counting sort on the device (counts per expert, offsets on the host, one
 * block per expert writing its items in token order), the token rows
 * gathered into bf16 in that order, then each projection of all experts
 * as one launch of the grouped tensor-core kernel (gemm_tc.cu: each block
 * takes up to 128 rows of one expert and dequantizes that expert's weights
 * in shared memory; dense bf16 experts are read in place) for 4/8-bit
 * weights with bf16 scales and for bf16 weights, else (PETREL_CUDA_MOE_TC=0,
 * K not a multiple of 64, other dtypes) per expert one cuBLAS GEMM over all
 * of its rows (weights dequantized a batch of experts at a time into the
 * matmul tile); either way each expert's weights
 * are read once per chunk (per 128 rows) instead of once per token. The outputs are rounded as the GEMV
 * path rounds them (after each projection, after the activation) and the
 * combine reads each item's row through the inverse permutation, so the
 * order of the weighted sum is unchanged. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe_decode.cuh"

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

pt_status pt_cuda_moe_route(pt_backend *be, int32_t *idx, float *weights, const float *logits, int64_t T,
                            const pt_moe_route *p) {
    pt_cuda *c = pt_cuda_of(be);
    const int E = p->n_experts, k = p->top_k;
    if (E <= 0 || k <= 0 || k > E || E > 4096)
        return pt_error(PT_ERR_INVALID_ARG, "moe_route: top_k %d of %d experts is invalid", k, E);
    if (T <= 0) return PT_OK;
    if (pt_cuda_moe_v2_on()) {
        const pt_status st = pt_cuda_moe_route_warp(c, idx, weights, logits, T, p);
        if (st != PT_ERR_UNSUPPORTED) return st; /* past its limits: the block kernel (the same bits) */
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
            const int bj = pt_moe_next_slot(it, k, prev, prev_j);
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

/* moe_combine_kernel over T tokens (see above); launched on the backend's
 * stream. */
pt_status pt_cuda_moe_combine(pt_cuda *c, float *y, const float *o, const int32_t *idx, const float *weights,
                              int64_t T, int k, int64_t H, int bf, const int32_t *inv) {
    moe_combine_kernel<<<pt_cuda_blocks(T * H, 256), 256, 0, c->stream>>>(y, o, idx, weights, T, k, H, bf, inv);
    CUDA_CHECK_LAUNCH("moe_combine");
    return PT_OK;
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
    return pt_cuda_moe_ffn_decode(c, y, x, T, idx, weights, top_k, gate, up, down, act);
}
