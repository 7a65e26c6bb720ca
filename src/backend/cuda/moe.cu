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
 * after each add like the reference. Prefill reads each selected expert once
 * per token: correct, not yet fast (grouping tokens by expert is the lever). */
#include "backend/cuda/cuda_internal.cuh"

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
    moe_route_kernel<<<(unsigned)T, ROUTE_THREADS, (size_t)E * sizeof(float), c->stream>>>(
        idx, weights, logits, E, k, p->renorm, p->per_expert_scale, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("moe_route");
    return PT_OK;
}

/* y[t, i] = Σ over the token's experts in ascending index order of
 * round(o[t·k + j, i] · w[t, j]), rounded after each add. */
__global__ void moe_combine_kernel(float *y, const float *o, const int32_t *idx, const float *weights, int64_t T,
                                   int k, int64_t H, int bf) {
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
            acc = pt_rnd(bf, acc + pt_rnd(bf, o[(t * k + bj) * H + d] * weights[t * k + bj]));
        }
        y[i] = acc;
    }
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
    /* gate|up rows of each item: moe_g[b, 0..2I) */
    if (up) {
        PT_TRY(pt_cuda_gemv_items(c, c->moe_g, x, B, top_k, gate, idx, 0, 0, I, 2 * I));
        PT_TRY(pt_cuda_gemv_items(c, c->moe_g + I, x, B, top_k, up, idx, 0, 0, I, 2 * I));
    } else {
        PT_TRY(pt_cuda_gemv_items(c, c->moe_g, x, B, top_k, gate, idx, 0, 0, 2 * I, 2 * I));
    }
    PT_TRY(pt_cuda_glu(be, c->moe_h, c->moe_g, c->moe_g + I, B, I, 2 * I, act));
    PT_TRY(pt_cuda_gemv_items(c, c->moe_o, c->moe_h, B, 1, down, idx, 0, 0, H, H));
    moe_combine_kernel<<<pt_cuda_blocks(T * H, 256), 256, 0, c->stream>>>(y, c->moe_o, idx, weights, T, top_k, H,
                                                                         pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("moe_combine");
    return PT_OK;
}
