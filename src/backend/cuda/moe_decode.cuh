/* The MoE files' shared declarations (moe.cu, moe_decode.cu): the decode
 * path's switch, its routing and expert kernels' host side, and the combine
 * both use. Not a public header: backend code inside src/backend/cuda only. */
#ifndef PT_CUDA_MOE_DECODE_CUH
#define PT_CUDA_MOE_DECODE_CUH

#include "backend/cuda/cuda_internal.cuh"

/* The slot after (prev, prev_j) in ascending (expert, slot) order among a
 * token's k picks it[] ((-1, -1): the first): the walk of every MoE combine
 * (moe.cu's combine kernel, moe_rows_combine), k <= 64 steps without a sort. */
__device__ __forceinline__ int pt_moe_next_slot(const int32_t *it, int k, int prev, int prev_j) {
    int bj = -1;
    for (int j = 0; j < k; j++) {
        const int e = it[j];
        const bool after = e > prev || (e == prev && j > prev_j);
        if (after && (bj < 0 || e < it[bj])) bj = j;
    }
    return bj;
}

/* Whether the decode path is on (PETREL_CUDA_MOE_V2, unless
 * pt_cuda_moe_select overrides it). */
int pt_cuda_moe_v2_on(void);

/* pt_cuda_moe_route with the decode path on: one warp per token, the
 * logits in its registers, the same picks and weights as moe.cu's block
 * kernel; PT_ERR_UNSUPPORTED (no message) above 512 experts or 64 picks,
 * which the block kernel takes. The caller checked E and k. */
pt_status pt_cuda_moe_route_warp(pt_cuda *c, int32_t *idx, float *weights, const float *logits, int64_t T,
                                 const pt_moe_route *p);

/* y[t, :] = the weighted sum of the token's k expert rows of o (moe.cu,
 * moe_combine_kernel): rows through inv when not NULL, bf the rounding. */
pt_status pt_cuda_moe_combine(pt_cuda *c, float *y, const float *o, const int32_t *idx, const float *weights,
                              int64_t T, int k, int64_t H, int bf, const int32_t *inv);

/* moe_ffn when the grouped prefill does not take the batch (moe_decode.cu);
 * the caller checked the shapes and the scratch. */
pt_status pt_cuda_moe_ffn_decode(pt_cuda *c, float *y, const float *x, int64_t T, const int32_t *idx,
                                 const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                                 const pt_matrix *down, pt_glu_kind act);

/* The decode path for dense bf16 expert stacks (moe_dense.cu): whether a
 * stack can feed it (PETREL_CUDA_MOE_DENSE, on unless "0"), gate|up + GLU
 * into h [B, I], down + combine into y [T, H]; the per-item path's bits. */
bool pt_cuda_moe_dense_ok(const pt_matrix *w);
bool pt_cuda_moe_dense_fits(int64_t B); /* B items: at most the kernels' limit */
pt_status pt_cuda_moe_gu_dense(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k,
                               const pt_matrix *gate, const pt_matrix *up, int64_t I, int act);
pt_status pt_cuda_moe_down_dense(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights,
                                 int64_t T, int k, const pt_matrix *down);

#endif
