/* rms_norm (backend.h): y = rms_norm(x) per row in one of four weight styles,
 * optionally fused with the residual add (residual += x, rounded; then
 * y = rms_norm(residual)), so the residual stream is read and written once.
 * One block per row; the sum of squares is a block reduction in f32 and the
 * rounding points are the CPU reference's (cpu_ops.c). Not the per-layer
 * scalar ops (elementwise.cu). */
#include "backend/cuda/cuda_internal.cuh"

#define NORM_THREADS 256

__global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(float *y, const float *x, float *res, int64_t D, const void *w, pt_ftype wt, int style, float eps,
                    int bf) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * D;
    float *yr = y + r * D;
    float ss = 0.f;
    if (res) {
        float *h = res + r * D;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float v = pt_rnd(bf, h[i] + xr[i]);
            h[i] = v;
            ss += v * v;
        }
        xr = h; /* y may alias x, never residual: read the normalized input from h */
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    }
    ss = pt_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float v = xr[i], o;
        switch (style) {
        case PT_RMS_W: o = pt_ld(wt, w, i) * pt_rnd(bf, v * inv); break;
        case PT_RMS_W_F32: o = v * inv * pt_ld(wt, w, i); break;
        case PT_RMS_1PW: o = v * inv * (1.0f + pt_ld(wt, w, i)); break;
        default: o = v * inv; break;
        }
        yr[i] = pt_rnd(bf, o);
    }
}

pt_status pt_cuda_rms_norm(pt_backend *be, float *y, const float *x, float *residual, int64_t T, int64_t D,
                           const void *w, pt_ftype wtype, pt_rms_style style, float eps) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(T >= 0 && D > 0);
    PT_ASSERT(style == PT_RMS_NOSCALE || w != NULL);
    if (T == 0) return PT_OK;
    if (T > INT32_MAX) return pt_error(PT_ERR_UNSUPPORTED, "rms_norm: %lld rows", (long long)T);
    /* Short rows (per-head norms): fewer threads idle. */
    int threads = D >= NORM_THREADS ? NORM_THREADS : (int)((D + 31) / 32 * 32);
    rms_norm_kernel<<<(unsigned)T, threads, 0, c->stream>>>(y, x, residual, D, w, wtype, (int)style, eps,
                                                           pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("rms_norm");
    return PT_OK;
}
