/* The RMSNorm pieces shared by norm.cu's register kernel and the GEMVs that
 * fold a decode row's norm into their staging of x (gemv_tc_kernel.cuh):
 * the block shape of a row (from D alone) and the output value of one
 * element. With the same shape, summing order and expressions, the fold
 * has the kernel's bits. */
#ifndef PT_BACKEND_CUDA_NORM_CUH
#define PT_BACKEND_CUDA_NORM_CUH

#include "backend/cuda/cuda_internal.cuh"

#define NORM_REG_THREADS 512 /* register kernel: at most this many threads per row */
#define NORM_REG_MAX_V 8     /* ... and this many 4-value chunks per thread: D <= 16384 */

/* The register kernel's launch: V chunks of 4 values per thread, threads
 * per row (a multiple of 32), both from D alone (so the bits of a row
 * depend on D and its values); V = 0: the row is too long for it (the
 * strided kernel's). Thread t's chunk k holds values 4·(k·threads + t) … +3. */
typedef struct {
    int V, threads;
} norm_shape;

__host__ __device__ static inline norm_shape norm_reg_shape(int64_t D) {
    const int64_t nvec = (D + 3) / 4; /* 4-value chunks of a row */
    if (nvec > (int64_t)NORM_REG_THREADS * NORM_REG_MAX_V) return norm_shape{0, 0};
    int V = 1;
    while (nvec > (int64_t)V * NORM_REG_THREADS) V *= 2;
    return norm_shape{V, (int)((nvec + V - 1) / V + 31) / 32 * 32};
}

/* The output value of one element (rounding points of cpu_ops.c). */
__device__ __forceinline__ float norm_out(int style, float v, float inv, float w, int bf) {
    float o;
    switch (style) {
    case PT_RMS_W: o = w * pt_rnd(bf, v * inv); break;
    case PT_RMS_W_F32: o = v * inv * w; break;
    case PT_RMS_1PW: o = v * inv * (1.0f + w); break;
    default: o = v * inv; break;
    }
    return pt_rnd(bf, o);
}

#endif
