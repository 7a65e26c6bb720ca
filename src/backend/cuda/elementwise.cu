/* Small ops of backend.h: embedding lookup (dense and quantized rows), gated
 * activations (SwiGLU, GeGLU), the elementwise family (add, mul, add_scaled,
 * scale, soft-cap) and argmax. Each output element is computed by one
 * thread with the CPU reference's rounding points (cpu_ops.c, cpu_matmul.c);
 * products that the reference rounds separately use __fmul_rn/__fadd_rn so
 * that the compiler does not fuse them into an fma. Not here: matmul, norms,
 * attention. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"

/* ---- embedding ---- */

/* One thread per 32-value chunk of an output row (quantized), or per value
 * (dense). Out-of-range ids write zeros and raise the error word. */
template <int BITS>
__global__ void embed_q_kernel(float *y, const int32_t *ids, int T, pt_qw q, int gs, int64_t rows, int64_t H,
                               float scale, int bf, int *err) {
    const int64_t nch = H / 32, n = (int64_t)T * nch;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / nch, c = i % nch;
        const int32_t id = ids[t];
        float *o = y + t * H + c * 32;
        if (id < 0 || id >= rows) {
#pragma unroll
            for (int j = 0; j < 32; j++) o[j] = 0.f;
            if (c == 0 && atomicCAS(err, 0, 1) == 0) err[1] = id;
            continue;
        }
        uint32_t w[BITS];
        pt_qw_chunk<BITS>(w, q, id, c); /* either device layout (matmul.cuh) */
        float s, b;
        pt_qw_sb(q, id, c * 32 / gs, s, b);
#pragma unroll
        for (int j = 0; j < 32; j++) {
            float v = pt_rnd(bf, __fadd_rn(__fmul_rn(s, (float)pt_q_code<BITS>(w, j)), b));
            if (scale != 1.0f) v = pt_rnd(bf, v * scale);
            o[j] = v;
        }
    }
}

__global__ void embed_dense_kernel(float *y, const int32_t *ids, int T, const void *table, pt_ftype dt, int64_t rows,
                                   int64_t H, float scale, int bf, int *err) {
    const int64_t n = (int64_t)T * H;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, d = i % H;
        const int32_t id = ids[t];
        if (id < 0 || id >= rows) {
            y[i] = 0.f;
            if (d == 0 && atomicCAS(err, 0, 1) == 0) err[1] = id;
            continue;
        }
        float v = pt_rnd(bf, pt_ld(dt, table, (int64_t)id * H + d));
        if (scale != 1.0f) v = pt_rnd(bf, v * scale);
        y[i] = v;
    }
}

pt_status pt_cuda_embed(pt_backend *be, float *y, const int32_t *ids, int T, const pt_matrix *table, float scale) {
    pt_cuda *c = pt_cuda_of(be);
    const pt_cuda_weight *cw = pt_cuda_w(table);
    if (!cw) return pt_error(PT_ERR_INVALID_ARG, "embed: table not prepared on the CUDA backend");
    if (T <= 0) return PT_OK;
    const int bf = pt_cuda_bf(be);
    const int64_t H = table->cols;
    if (table->bits) {
        const unsigned blocks = pt_cuda_blocks((int64_t)T * (H / 32), 128);
#define PT_EQ(B)                                                                                                    \
    case B:                                                                                                         \
        embed_q_kernel<B><<<blocks, 128, 0, c->stream>>>(y, ids, T, pt_qw_of(table), table->group_size, table->rows, \
                                                         H, scale, bf, c->err_dev);                                  \
        break;
        switch (table->bits) {
            PT_EQ(2) PT_EQ(3) PT_EQ(4) PT_EQ(5) PT_EQ(6) PT_EQ(8)
        default: return pt_error(PT_ERR_UNSUPPORTED, "embed: no CUDA kernel for %d-bit tables", table->bits);
        }
#undef PT_EQ
    } else {
        embed_dense_kernel<<<pt_cuda_blocks((int64_t)T * H, 256), 256, 0, c->stream>>>(
            y, ids, T, cw->data, table->dtype, table->rows, H, scale, bf, c->err_dev);
    }
    CUDA_CHECK_LAUNCH("embed");
    /* Eager execution reports a bad id here, as the CPU does; inside a graph
     * capture nothing may synchronize, and the next download reports it. */
    cudaStreamCaptureStatus cap;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cap));
    if (cap == cudaStreamCaptureStatusNone) return pt_cuda_check_errors(c);
    return PT_OK;
}

/* ---- gated activations ---- */

__global__ void glu_kernel(float *y, const float *gate, const float *up, int64_t T, int64_t F, int64_t ld, int fn,
                           int bf) {
    pt_release_dependents();
    pt_wait_primary();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * F; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / F, f = i % F;
        y[i] = pt_glu_val(fn, gate[t * ld + f], up[t * ld + f], bf); /* matmul.cuh */
    }
}

pt_status pt_cuda_glu(pt_backend *be, float *y, const float *gate, const float *up, int64_t T, int64_t F, int64_t ld,
                      pt_glu_kind act) {
    pt_cuda *c = pt_cuda_of(be);
    PT_ASSERT(ld >= F);
    if (T * F == 0) return PT_OK;
    pt_launch(glu_kernel, dim3(pt_cuda_blocks(T * F, 256)), dim3(256), 0, c->stream, pt_pdl_chain(), y, gate, up, T, F, ld,
              (int)act, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("glu");
    return PT_OK;
}

/* ---- elementwise ---- */

enum { EW_ADD, EW_MUL, EW_ADD_SCALED, EW_SCALE, EW_SOFTCAP };

__global__ void ew_kernel(int kind, float *y, const float *a, const float *b, float s, int64_t n, int bf) {
    pt_release_dependents();
    pt_wait_primary();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v;
        switch (kind) {
        case EW_ADD: v = __fadd_rn(a[i], b[i]); break;
        case EW_MUL: v = __fmul_rn(a[i], b[i]); break;
        case EW_ADD_SCALED: v = __fadd_rn(a[i], pt_rnd(bf, __fmul_rn(b[i], s))); break;
        case EW_SCALE: v = __fmul_rn(a[i], s); break;
        default: v = __fmul_rn(pt_rnd(bf, tanhf(pt_rnd(bf, __fdiv_rn(a[i], s)))), s); break;
        }
        y[i] = pt_rnd(bf, v);
    }
}

static pt_status ew(pt_backend *be, int kind, float *y, const float *a, const float *b, float s, int64_t n) {
    pt_cuda *c = pt_cuda_of(be);
    if (n <= 0) return PT_OK;
    pt_launch(ew_kernel, dim3(pt_cuda_blocks(n, 256)), dim3(256), 0, c->stream, pt_pdl_chain(), kind, y, a, b, s, n,
              pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("elementwise");
    return PT_OK;
}

pt_status pt_cuda_add(pt_backend *be, float *y, const float *a, const float *b, int64_t n) {
    return ew(be, EW_ADD, y, a, b, 0.f, n);
}
pt_status pt_cuda_mul(pt_backend *be, float *y, const float *a, const float *b, int64_t n) {
    return ew(be, EW_MUL, y, a, b, 0.f, n);
}
pt_status pt_cuda_add_scaled(pt_backend *be, float *y, const float *a, const float *b, float s, int64_t n) {
    return ew(be, EW_ADD_SCALED, y, a, b, s, n);
}
pt_status pt_cuda_scale(pt_backend *be, float *y, const float *x, float s, int64_t n) {
    return ew(be, EW_SCALE, y, x, NULL, s, n);
}
pt_status pt_cuda_softcap(pt_backend *be, float *y, const float *x, float cap, int64_t n) {
    PT_ASSERT(cap > 0);
    return ew(be, EW_SOFTCAP, y, x, NULL, cap, n);
}

/* ---- argmax ---- */

/* One block per row: each thread scans a strided slice keeping the first
 * maximum, then a tree merge that prefers the lower index on ties. NaN is
 * never chosen; an all-NaN row gives 0. */
__global__ void __launch_bounds__(1024) argmax_kernel(int32_t *out, const float *x, int64_t V) {
    __shared__ float sv[1024];
    __shared__ int64_t si[1024];
    const float *r = x + blockIdx.x * V;
    float best = 0.f;
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = r[i];
        if (!isnan(v) && (bi < 0 || v > best)) {
            best = v;
            bi = i;
        }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int64_t oi = si[threadIdx.x + s];
            const int64_t mi = si[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)(si[0] < 0 ? 0 : si[0]);
}

pt_status pt_cuda_argmax(pt_backend *be, int32_t *out, const float *x, int64_t T, int64_t V) {
    pt_cuda *c = pt_cuda_of(be);
    if (T <= 0) return PT_OK;
    if (T > INT32_MAX) return pt_error(PT_ERR_UNSUPPORTED, "argmax: %lld rows", (long long)T);
    argmax_kernel<<<(unsigned)T, 1024, 0, c->stream>>>(out, x, V);
    CUDA_CHECK_LAUNCH("argmax");
    return PT_OK;
}
