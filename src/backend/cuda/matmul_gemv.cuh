/* The FMA GEMV's argument block (gemv_args) and its expert lookup
 * (item_expert), shared by the GEMV kernels of matmul.cu and the decode
 * GEMV of gemv_fast.cu, and the entry point of the latter. Inlined where
 * used: each kernel compiles to the code it had when both were one file
 * (dev/sass_same.sh compares them).
 * Not here: the kernels; the tensor-core GEMVs (gemv_mma.cuh, gemv_tc.cuh). */
#ifndef PT_BACKEND_CUDA_MATMUL_GEMV_CUH
#define PT_BACKEND_CUDA_MATMUL_GEMV_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"

/* Per item b: expert e_b, x rows x[(b/x_div)·NT + n], y rows y[(b·NT + n)·ldy]. */
struct gemv_args {
    float *y;
    const float *x;
    int64_t K, rows;            /* K = cols; rows of one expert matrix */
    const void *data, *scales, *biases, *bias;
    pt_ftype st, bt;
    int gs;
    const int32_t *experts;     /* device [B] or NULL */
    int64_t expert;
    int x_div;
    int64_t row0, nrows, ldy;
    int64_t n_experts;          /* experts[b] outside [0, n_experts): zeros + the error word */
    int *err;
    int bf;
    pt_qw q;                    /* the codes and scales in either layout (matmul.cuh) */
};

/* Resolves item b's expert; an index from device memory outside the stack
 * raises the error word and the item writes zeros instead of reading out of
 * bounds. */
__device__ __forceinline__ int64_t item_expert(const gemv_args &a, int64_t b, bool &ok) {
    int64_t e = a.experts ? a.experts[b] : a.expert;
    ok = e >= 0 && e < a.n_experts;
    if (!ok) {
        if (threadIdx.x == 0 && blockIdx.x == 0 && atomicCAS(a.err, 0, 2) == 0) a.err[1] = (int)e;
        e = 0;
    }
    return e;
}

/* gemv_fast.cu: the decode GEMV for one token per item of 4/8-bit codes in
 * the MLX layout (x 16-byte aligned), B items, its launch shape chosen as
 * for shape_B items; PT_ERR_UNSUPPORTED (no message) when it does not apply. */
pt_status pt_cuda_gemv_fast(const pt_cuda *c, const gemv_args &a, int bits, int64_t B, int64_t shape_B);

#endif
