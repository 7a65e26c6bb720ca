/* Device-side helpers shared by every CUDA op family: CUDA_CHECK (every CUDA
 * call's error becomes a petrel error naming the call, the code and where),
 * bf16 load/convert helpers, and small warp/block reductions. Included only
 * by .cu files; the C side never sees this header. */
#ifndef PT_BACKEND_CUDA_COMMON_CUH
#define PT_BACKEND_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" {
#include "base/error.h"
}

/* Evaluates a CUDA runtime call; on failure returns PT_ERR_DEVICE from the
 * enclosing function with "<call> failed: <name> (code N): <text> [file:line]".
 * The runtime's last-error state is cleared, so a later launch check does not
 * report this failure again. */
#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t pt_cuda_e_ = (call);                                                   \
        if (pt_cuda_e_ != cudaSuccess) {                                                   \
            (void)cudaGetLastError();                                                      \
            return pt_error(PT_ERR_DEVICE, "%s failed: %s (code %d): %s [%s:%d]", #call,    \
                            cudaGetErrorName(pt_cuda_e_), (int)pt_cuda_e_,                 \
                            cudaGetErrorString(pt_cuda_e_), __FILE__, __LINE__);           \
        }                                                                                  \
    } while (0)

/* CUDA_CHECK for functions that free what they hold on the way out: on
 * failure stores PT_ERR_DEVICE "<call> failed: <name> (code N)" in st and
 * jumps to label (the cleanup). The last-error state is cleared. */
#define CUDA_CHECK_GOTO(call, st, label)                                                   \
    do {                                                                                   \
        cudaError_t pt_cuda_e_ = (call);                                                   \
        if (pt_cuda_e_ != cudaSuccess) {                                                   \
            (void)cudaGetLastError();                                                      \
            st = pt_error(PT_ERR_DEVICE, "%s failed: %s (code %d)", #call,                 \
                          cudaGetErrorName(pt_cuda_e_), (int)pt_cuda_e_);                  \
            goto label;                                                                    \
        }                                                                                  \
    } while (0)

/* After a kernel launch: a bad configuration shows up here, not at the
 * launch. The message names the kernel. */
#define CUDA_CHECK_LAUNCH(name)                                                            \
    do {                                                                                   \
        cudaError_t pt_cuda_e_ = cudaGetLastError();                                       \
        if (pt_cuda_e_ != cudaSuccess)                                                     \
            return pt_error(PT_ERR_DEVICE, "launch of the %s kernel failed: %s (code %d): %s [%s:%d]", \
                            name, cudaGetErrorName(pt_cuda_e_), (int)pt_cuda_e_,           \
                            cudaGetErrorString(pt_cuda_e_), __FILE__, __LINE__);           \
    } while (0)

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float pt_bf2f(bf16 x) { return __bfloat162float(x); }
/* Round to nearest even, NaN preserved: the same rule as pt_f32_to_bf16. */
__device__ __forceinline__ bf16 pt_f2bf(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float pt_round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ float pt_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* The first G of d[] each summed over the L consecutive lanes of a group
 * (L a power of two <= 32) by an xor butterfly: every lane of the group
 * holds the same sums (IEEE addition commutes). The split decode scores
 * kernels add a key's partial dots over the lanes that share the key. */
template <int L, int MAXG>
__device__ __forceinline__ void pt_lanes_sum(float (&d)[MAXG], int G) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g >= G) break;
            d[g] += __shfl_xor_sync(0xffffffffu, d[g], o);
        }
}
/* One step of an xor butterfly over a row: v[i] += v[i] of the lane at
 * (this lane xor o), for every i < N. The split p·V kernels add their key
 * slots' rows with it, o = slots..16 (kv_quant.cu, attention_dec2.cu). */
template <int N>
__device__ __forceinline__ void pt_xor_add(float (&v)[N], int o) {
#pragma unroll
    for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}
__device__ __forceinline__ float pt_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum; every thread gets the result. `scratch` holds >= 32 floats.
 * blockDim.x must be a multiple of 32. */
__device__ __forceinline__ float pt_block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = pt_warp_sum(v);
    __syncthreads(); /* scratch may still be read from a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.f;
    return pt_warp_sum(v);
}
__device__ __forceinline__ float pt_block_max(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = pt_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    return pt_warp_max(v);
}

/* One score s into a thread's running softmax statistics: the max m of its
 * scores so far and the sum l of their exp relative to m (m = −inf, l = 0
 * before the first). */
__device__ __forceinline__ void pt_softmax_push(float s, float &m, float &l) {
    if (s > m) {
        l = l * expf(m - s) + 1.f;
        m = s;
    } else {
        l += expf(s - m);
    }
}

/* The block's max M over W warps' running statistics (sm_m, sm_l: each
 * warp's m and l, pt_softmax_push), and 1/L for the sum L of the warps'
 * sums rescaled to M, added in warp order (warps without keys add
 * nothing). */
template <int W>
__device__ __forceinline__ float pt_softmax_warps(const float *sm_m, const float *sm_l, float &M) {
    M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < W; w++)
        if (sm_m[w] != -INFINITY) L += sm_l[w] * expf(sm_m[w] - M);
    return 1.0f / L;
}

/* A block's (max, sum) pair for one key range from its threads' running
 * statistics (pt_softmax_push): the block max and the threads' sums rescaled
 * to it, threads without keys adding nothing. Every thread gets it; the
 * block reductions synchronize before reusing scratch (>= 32 floats). */
__device__ __forceinline__ float2 pt_softmax_block(float m, float l, float *scratch) {
    const float bm = pt_block_max(m, scratch);
    const float bl = pt_block_sum(m == -INFINITY ? 0.f : l * expf(m - bm), scratch);
    return make_float2(bm, bl);
}

/* A split's partial p·V output from each warp's accumulators acc[g][i] (the
 * row's query head g of the KV head's group, dims lane + 32·i): the warps'
 * values added in warp order into P[(row0 + g, split), e] ([heads, nsplit,
 * hd]) for e < hd. acc_s is the block's [NW][MAXG·NPL·32] shared staging;
 * the caller synchronizes before writing it again. */
template <int MAXG, int NPL, int NW>
__device__ __forceinline__ void pt_pv_partial(const float (&acc)[MAXG][NPL], float (*acc_s)[MAXG * NPL * 32], int G,
                                              int hd, float *P, int64_t row0, int64_t nsplit, int64_t split) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g >= G) break;
#pragma unroll
        for (int i = 0; i < NPL; i++) acc_s[warp][(g * NPL + i) * 32 + lane] = acc[g][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * NPL * 32; idx += blockDim.x) {
        const int g = idx / (NPL * 32), r = idx % (NPL * 32), i = r / 32, ln = r % 32, e = ln + 32 * i;
        if (e >= hd) continue;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) v += acc_s[w][idx];
        P[((row0 + g) * nsplit + split) * hd + e] = v;
    }
}

/* Merges the partial softmax statistics of n key ranges (splits), each a
 * (max, sum of exp relative to that max) pair, in range order: the exact row
 * max M and the row sum L = Σ sum_s·exp(max_s − M). Ranges without keys
 * (max −inf) add nothing. Every split-decode kernel merges through this one
 * helper, so their results agree bit for bit. */
__device__ __forceinline__ void pt_softmax_merge(const float2 *ml, int n, float &M, float &L) {
    M = -INFINITY;
    for (int s = 0; s < n; s++) M = fmaxf(M, ml[s].x);
    L = 0.f;
    for (int s = 0; s < n; s++)
        if (ml[s].x != -INFINITY) L += ml[s].y * expf(ml[s].x - M);
}

/* sm_80+ instruction wrappers the tensor-core kernels (gemm_tc.cu,
 * flash_attn.cu) share. */

/* cp.async of 16 bytes global -> shared (dst: a shared-space address);
 * pred false: src-size 0, the 16 bytes are zero-filled */
__device__ __forceinline__ void pt_cp16(uint32_t dst, const void *src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void pt_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* waits until at most N committed groups are still in flight */
template <int N>
__device__ __forceinline__ void pt_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* ldmatrix x4: four 8x8 b16 tiles from shared memory */
__device__ __forceinline__ void pt_ldm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* c[16x8 f32] += a[16x16 bf16] · b[16x8 bf16] (mma.sync m16n8k16) */
__device__ __forceinline__ void pt_mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
