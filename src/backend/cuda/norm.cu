/* rms_norm (backend.h): y = rms_norm(x) per row in one of four weight styles,
 * optionally fused with the residual add (residual += x, rounded; then
 * y = rms_norm(residual)), so the residual stream is read and written once
 * and the add costs no kernel of its own. The rounding points are the CPU
 * reference's (cpu_ops.c); the sum of squares is accumulated in f32 in
 * another order (a tree), within the op tests' tolerance. Not the per-layer
 * scalar ops (elementwise.cu), not the gated norm (deltanet.cu).
 *
 * Rows of up to 16384 values (every hidden size and head size a model spec
 * has) take the register kernel: one block per row, each thread owning V
 * chunks of 4 consecutive values (chunk j = k·threads + thread, so a warp's
 * loads are coalesced). A thread issues all its loads — x, the residual and
 * the weights — before the first use, keeps its values in registers, and
 * writes its outputs after one block reduction: a single pass over x with
 * one memory round trip, where a strided loop pays one per element. With
 * D % 4 == 0 and 16-byte aligned rows the chunks move as float4; otherwise
 * the same chunks move as scalars. Both variants assign the same values to
 * the same threads and sum them in the same order (explicit fma), and the
 * block shape depends only on D: the bits of a row depend on D and the row's
 * values alone — not on T, the alignment, or which decode path (single,
 * batched, graph) runs it. Longer rows take the strided kernel.
 *
 * The weights are read before the kernel waits for the one before it
 * (programmatic dependent launch): w must be constant over the step (the
 * model's norm weights always are; never an output of an earlier kernel
 * in the stream). */
#include "backend/cuda/norm.cuh"

#include <stdint.h>

#define NORM_THREADS 256 /* strided kernel (long rows) */

/* One row of the register kernel: yr = rms_norm(xr) (hr: the fused
 * residual row, or NULL), the block's threads over it; the body of both
 * register kernels below. V: chunks of 4 values per thread. VEC: float4
 * accesses (requires D % 4 == 0 and the rows 16-byte aligned). */
template <int V, bool VEC>
__device__ __forceinline__ void norm_reg_row(float *yr, const float *xr, float *hr, int D, const void *w, pt_ftype wt,
                                             int style, float eps, int bf, int early_w) {
    __shared__ float red[32];
    const int nt = blockDim.x;
    float v[V][4], wv[V][4];
    /* the weights first, before waiting for the kernel before (programmatic
     * dependent launch): they are the model's constants, never written by
     * the step, so their load latency hides under the previous kernel's
     * tail; PETREL_CUDA_NORM_EARLY_W=0 loads them after the wait (A/B) */
    if (early_w) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int i0 = 4 * (k * nt + (int)threadIdx.x);
#pragma unroll
            for (int e = 0; e < 4; e++)
                wv[k][e] = (style != PT_RMS_NOSCALE && i0 + e < D) ? pt_ld(wt, w, i0 + e) : 0.f;
        }
    }
    pt_wait_primary();
    /* all loads first: x (and the residual), then the weights */
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i0 = 4 * (k * nt + (int)threadIdx.x);
        if (VEC) {
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
            if (i0 < D) {
                a = *(const float4 *)(xr + i0);
                if (hr) {
                    const float4 h = *(const float4 *)(hr + i0);
                    a.x = pt_rnd(bf, __fadd_rn(h.x, a.x));
                    a.y = pt_rnd(bf, __fadd_rn(h.y, a.y));
                    a.z = pt_rnd(bf, __fadd_rn(h.z, a.z));
                    a.w = pt_rnd(bf, __fadd_rn(h.w, a.w));
                }
            }
            v[k][0] = a.x, v[k][1] = a.y, v[k][2] = a.z, v[k][3] = a.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = i0 + e;
                float a = 0.f;
                if (i < D) {
                    a = xr[i];
                    if (hr) a = pt_rnd(bf, __fadd_rn(hr[i], a));
                }
                v[k][e] = a;
            }
        }
        if (!early_w) {
#pragma unroll
            for (int e = 0; e < 4; e++)
                wv[k][e] = (style != PT_RMS_NOSCALE && i0 + e < D) ? pt_ld(wt, w, i0 + e) : 0.f;
        }
    }
    /* the residual row: written by the thread that read it (y may alias x, never res) */
    if (hr) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int i0 = 4 * (k * nt + (int)threadIdx.x);
            if (VEC) {
                if (i0 < D) *(float4 *)(hr + i0) = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (i0 + e < D) hr[i0 + e] = v[k][e];
            }
        }
    }
    /* zero padding adds exact zeros: fma(0, 0, s) == s */
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++)
#pragma unroll
        for (int e = 0; e < 4; e++) ss = __fmaf_rn(v[k][e], v[k][e], ss);
    ss = pt_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i0 = 4 * (k * nt + (int)threadIdx.x);
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = norm_out(style, v[k][e], inv, wv[k][e], bf);
        if (VEC) {
            if (i0 < D) *(float4 *)(yr + i0) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (i0 + e < D) yr[i0 + e] = o[e];
        }
    }
}

/* grid: one block per row; block: NORM_REG_THREADS at most (a multiple of
 * 32). VEC requires x, y, res 16-byte aligned. */
template <int V, bool VEC>
__global__ void __launch_bounds__(NORM_REG_THREADS)
    rms_norm_reg_kernel(float *y, const float *x, float *res, int D, const void *w, pt_ftype wt, int style,
                        float eps, int bf, int early_w) {
    pt_release_dependents();
    const int64_t r = blockIdx.x;
    norm_reg_row<V, VEC>(y + r * D, x + r * D, res ? res + r * D : NULL, D, w, wt, style, eps, bf, early_w);
}

/* Two row sets in one launch, in place: rows [0, T1) of x1 with w1, then
 * the rows of x2 with w2 (the per-head q and k norms), each row as
 * rms_norm_reg_kernel forms it with the same block: the same bits as two
 * launches, one launch fewer. */
template <int V, bool VEC>
__global__ void __launch_bounds__(NORM_REG_THREADS)
    rms_norm_reg2_kernel(float *x1, int64_t T1, const void *w1, float *x2, const void *w2, int D, pt_ftype wt,
                         int style, float eps, int bf, int early_w) {
    pt_release_dependents();
    const int64_t r = blockIdx.x;
    float *xr = r < T1 ? x1 + r * D : x2 + (r - T1) * D;
    norm_reg_row<V, VEC>(xr, xr, NULL, D, r < T1 ? w1 : w2, wt, style, eps, bf, early_w);
}

/* Long rows (D > 16384): one block per row, strided over the row twice;
 * the same explicit fma sum whether the residual add is fused or not. */
__global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(float *y, const float *x, float *res, int64_t D, const void *w, pt_ftype wt, int style, float eps,
                    int bf) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * D;
    float *yr = y + r * D;
    float ss = 0.f;
    if (res) {
        float *h = res + r * D;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float v = pt_rnd(bf, __fadd_rn(h[i], xr[i]));
            h[i] = v;
            ss = __fmaf_rn(v, v, ss);
        }
        xr = h; /* y may alias x, never residual: read the normalized input from h */
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss = __fmaf_rn(xr[i], xr[i], ss);
    }
    ss = pt_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        yr[i] = norm_out(style, xr[i], inv, style == PT_RMS_NOSCALE ? 0.f : pt_ld(wt, w, i), bf);
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* PETREL_CUDA_NORM_EARLY_W=0: the weights loaded after the wait (A/B; read once). */
static int norm_early_w(void) {
    static int v = -1;
    if (v < 0) v = pt_env_on("PETREL_CUDA_NORM_EARLY_W");
    return v;
}

template <int V>
static void launch_reg(cudaStream_t s, int threads, bool vec, unsigned T, float *y, const float *x, float *res,
                       int D, const void *w, pt_ftype wt, int style, float eps, int bf) {
    const int ew = norm_early_w();
    if (vec)
        pt_launch(rms_norm_reg_kernel<V, true>, dim3((unsigned)T), dim3(threads), 0, s, pt_pdl_chain(), y, x, res, D, w, wt, style, eps, bf, ew);
    else
        pt_launch(rms_norm_reg_kernel<V, false>, dim3((unsigned)T), dim3(threads), 0, s, pt_pdl_chain(), y, x, res, D, w, wt, style, eps, bf, ew);
}

pt_status pt_cuda_rms_norm(pt_backend *be, float *y, const float *x, float *residual, int64_t T, int64_t D,
                           const void *w, pt_ftype wtype, pt_rms_style style, float eps) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(T >= 0 && D > 0);
    PT_ASSERT(style == PT_RMS_NOSCALE || w != NULL);
    if (T == 0) return PT_OK;
    if (T > INT32_MAX) return pt_error(PT_ERR_UNSUPPORTED, "rms_norm: %lld rows", (long long)T);
    const int bf = pt_cuda_bf(be);
    const norm_shape sh = norm_reg_shape(D);
    if (sh.V) {
        const int threads = sh.threads;
        const bool vec = D % 4 == 0 && aligned16(x) && aligned16(y) && (!residual || aligned16(residual));
        const int di = (int)D;
        switch (sh.V) {
        case 1: launch_reg<1>(c->stream, threads, vec, (unsigned)T, y, x, residual, di, w, wtype, (int)style, eps, bf); break;
        case 2: launch_reg<2>(c->stream, threads, vec, (unsigned)T, y, x, residual, di, w, wtype, (int)style, eps, bf); break;
        case 4: launch_reg<4>(c->stream, threads, vec, (unsigned)T, y, x, residual, di, w, wtype, (int)style, eps, bf); break;
        default: launch_reg<8>(c->stream, threads, vec, (unsigned)T, y, x, residual, di, w, wtype, (int)style, eps, bf); break;
        }
    } else {
        rms_norm_kernel<<<(unsigned)T, NORM_THREADS, 0, c->stream>>>(y, x, residual, D, w, wtype, (int)style, eps,
                                                                   bf);
    }
    CUDA_CHECK_LAUNCH("rms_norm");
    return PT_OK;
}

/* PETREL_CUDA_NORM2=0: rms_norm2 declines, so the q and k norms take two
 * launches (A/B; read once). */
static int norm2_on(void) {
    static int v = -1;
    if (v < 0) v = pt_env_on("PETREL_CUDA_NORM2");
    return v;
}

/* backend.h rms_norm2: x1 [T1, D] and x2 [T2, D] normalized in place in one
 * launch of the register kernel's rows; PT_ERR_UNSUPPORTED (no message)
 * where rms_norm would take the strided kernel, for the two calls. */
pt_status pt_cuda_rms_norm2(pt_backend *be, float *x1, int64_t T1, const void *w1, float *x2, int64_t T2,
                            const void *w2, int64_t D, pt_ftype wtype, pt_rms_style style, float eps) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(T1 >= 0 && T2 >= 0 && D > 0);
    PT_ASSERT(style == PT_RMS_NOSCALE || (w1 != NULL && w2 != NULL));
    if (T1 + T2 == 0) return PT_OK;
    const norm_shape sh = norm_reg_shape(D);
    if (!norm2_on() || T1 + T2 > INT32_MAX || !sh.V) return PT_ERR_UNSUPPORTED;
    const bool vec = D % 4 == 0 && aligned16(x1) && aligned16(x2);
    const int bf = pt_cuda_bf(be), ew = norm_early_w(), di = (int)D;
    const dim3 grid((unsigned)(T1 + T2)), block(sh.threads);
#define NORM2_LAUNCH(V)                                                                                               \
    if (vec)                                                                                                          \
        pt_launch(rms_norm_reg2_kernel<V, true>, grid, block, 0, c->stream, pt_pdl_chain(), x1, T1, w1, x2, w2, di,   \
                  wtype, (int)style, eps, bf, ew);                                                                    \
    else                                                                                                              \
        pt_launch(rms_norm_reg2_kernel<V, false>, grid, block, 0, c->stream, pt_pdl_chain(), x1, T1, w1, x2, w2, di,  \
                  wtype, (int)style, eps, bf, ew)
    switch (sh.V) {
    case 1: NORM2_LAUNCH(1); break;
    case 2: NORM2_LAUNCH(2); break;
    case 4: NORM2_LAUNCH(4); break;
    default: NORM2_LAUNCH(8); break;
    }
#undef NORM2_LAUNCH
    CUDA_CHECK_LAUNCH("rms_norm2");
    return PT_OK;
}
