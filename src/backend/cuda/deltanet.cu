/* The Gated DeltaNet ops of Qwen3.5 on the GPU (backend.h: conv1d_silu,
 * delta_rule, rms_norm_gated, copy_rows, sigmoid_mul), following the CPU
 * reference src/backend/cpu/cpu_deltanet.c step by step: each output
 * element is computed by one thread with the CPU's loop order and its
 * separate (unfused) multiplies and adds (mul/add below), so the results
 * differ from the CPU's only where expf/log1pf differ by an ulp.
 *
 *   conv1d_silu   one thread per channel, sequential over the tokens, the
 *                 K-1 rows of rolling state in registers.
 *   delta_rule    chunk == 0: the recurrence, one block per (value head,
 *                 column tile); a thread owns one column of the state S
 *                 [Dk, Dv] (coalesced across the warp) and walks the tokens.
 *                 chunk > 0: the chunked (WY) form, one block per value
 *                 head, chunk after chunk, with the chunk's Q, K, W, U and
 *                 the [C, C] triangular system in shared memory; when they
 *                 do not fit (large head dims) the recurrence runs instead
 *                 (the same recurrence; equal up to f32 rounding).
 *   rms_norm_gated one block per row (the sum of squares by one thread, in
 *                 the CPU's order).
 *   copy_rows     cudaMemcpy2DAsync.
 *   copy_rows_to  one kernel for up to 64 rows, each through its own pointers.
 *   sigmoid_mul   one thread per element.
 *
 * Not here: the projections around them (matmul.cu) and the layer itself
 * (src/model/qwen3_5.c). */
#include "backend/cuda/cuda_internal.cuh"

/* Separate IEEE multiply and add (never contracted into an FMA), as the
 * CPU reference computes them. */
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float mad(float acc, float a, float b) { return __fadd_rn(acc, __fmul_rn(a, b)); }
__device__ __forceinline__ float silu_f(float g) { return __fdiv_rn(g, add(1.0f, expf(-g))); }
__device__ __forceinline__ float sigm(float g) { return __fdiv_rn(1.0f, add(1.0f, expf(-g))); }

/* ---- conv1d + SiLU ---- */

__global__ void conv1d_silu_kernel(float *y, const float *x, int64_t T, int64_t C, int K, const void *w, pt_ftype wt,
                                   float *state, int bf) {
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C) return;
    /* fully unrolled with guards so both arrays stay in registers */
    float wr[PT_CONV_MAX_K], hist[PT_CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < PT_CONV_MAX_K; j++) {
        wr[j] = j < K ? pt_ld(wt, w, c * K + j) : 0.f;
        hist[j] = j < K - 1 ? state[(int64_t)j * C + c] : 0.f;
    }
    for (int64_t t = 0; t < T; t++) {
        const float xt = x[t * C + c];
        float s = 0.0f, wl = 0.f;
#pragma unroll
        for (int j = 0; j < PT_CONV_MAX_K; j++) {
            if (j < K - 1) s = mad(s, wr[j], hist[j]);
            if (j == K - 1) wl = wr[j];
        }
        s = pt_rnd(bf, mad(s, wl, xt));
        y[t * C + c] = pt_rnd(bf, silu_f(s));
#pragma unroll
        for (int j = 0; j < PT_CONV_MAX_K - 1; j++) {
            if (j + 1 < K - 1) hist[j] = hist[j + 1];
            else if (j == K - 2) hist[j] = xt;
        }
    }
#pragma unroll
    for (int j = 0; j < PT_CONV_MAX_K; j++)
        if (j < K - 1) state[(int64_t)j * C + c] = hist[j];
}

pt_status pt_cuda_conv1d_silu(pt_backend *be, float *y, const float *x, int64_t T, int64_t C, int K,
                                           const void *w, pt_ftype wtype, float *state) {
    if (T < 0 || C <= 0 || K < 1 || K > PT_CONV_MAX_K || y == x)
        return pt_error(PT_ERR_INVALID_ARG, "conv1d_silu: T %lld, C %lld, K %d (K must be 1..%d, y must not alias x)",
                        (long long)T, (long long)C, K, PT_CONV_MAX_K);
    if (T == 0) return PT_OK;
    conv1d_silu_kernel<<<(unsigned)((C + 127) / 128), 128, 0, pt_cuda_of(be)->stream>>>(y, x, T, C, K, w, wtype, state,
                                                                                     pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("conv1d_silu");
    return PT_OK;
}

/* ---- the gated delta rule ---- */

struct delta_args {
    float *out;
    const float *qkv, *b, *a;
    int64_t T;
    float *state;
    int Hk, Hv, Dk, Dv, chunk, bf;
    float q_scale;
    const float *A_log, *dt_bias;
};

__device__ __forceinline__ int64_t d_ld(const delta_args &d) { return 2 * (int64_t)d.Hk * d.Dk + (int64_t)d.Hv * d.Dv; }

/* The CPU's l2norm factor (cpu_deltanet.c l2n): 1 / sqrt(Σx² + 1e-6) with
 * Σx² in order, all in f32 whatever the activation dtype (the reference
 * normalizes q and k after casting them to f32). The caller multiplies
 * x · inv, then · scale for q: two f32 roundings, in that order. */
__device__ float l2n_inv(const float *src, int D) {
    float ss = 0.0f;
    for (int i = 0; i < D; i++) ss = add(ss, mul(src[i], src[i]));
    return __fdiv_rn(1.0f, sqrtf(add(ss, 1e-6f)));
}

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* β and g of token t, value head h */
__device__ __forceinline__ void beta_g(const delta_args &d, int64_t t, int h, float *beta, float *g) {
    const float bv = d.b[t * d.Hv + h], av = d.a[t * d.Hv + h];
    *beta = pt_rnd(d.bf, sigm(bv));
    *g = mul(-expf(d.A_log[h]), softplus_f(add(av, d.dt_bias[h])));
}

#define DR_THREADS 128

/* Recurrence: block (h, column tile); thread = column j of S. */
__global__ void __launch_bounds__(DR_THREADS) delta_recurrent_kernel(delta_args d) {
    extern __shared__ float sh[]; /* q [Dk] | k [Dk] | inv q, inv k, β, α */
    const int h = blockIdx.x, Dk = d.Dk, Dv = d.Dv, kh = h / (d.Hv / d.Hk);
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    float *q = sh, *k = sh + Dk, *sc = sh + 2 * Dk;
    float *S = d.state + (size_t)h * Dk * Dv;
    const int64_t ld = d_ld(d);
    for (int64_t t = 0; t < d.T; t++) {
        const float *row = d.qkv + t * ld;
        const float *qs = row + (int64_t)kh * Dk, *ks = row + (int64_t)d.Hk * Dk + (int64_t)kh * Dk;
        if (threadIdx.x == 0) sc[0] = l2n_inv(qs, Dk);
        if (threadIdx.x == 32) sc[1] = l2n_inv(ks, Dk);
        if (threadIdx.x == 64) {
            float beta, g;
            beta_g(d, t, h, &beta, &g);
            sc[2] = beta;
            sc[3] = expf(g);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
            q[i] = mul(mul(qs[i], sc[0]), d.q_scale);
            k[i] = mul(ks[i], sc[1]);
        }
        __syncthreads();
        if (j < Dv) {
            const float beta = sc[2], alpha = sc[3];
            const float v = row[2 * (int64_t)d.Hk * Dk + (int64_t)h * Dv + j];
            float m = 0.0f;
            for (int i = 0; i < Dk; i++) {
                const float s = mul(S[(size_t)i * Dv + j], alpha);
                S[(size_t)i * Dv + j] = s;
                m = mad(m, s, k[i]);
            }
            const float delta = mul(v - m, beta);
            float o = 0.0f;
            for (int i = 0; i < Dk; i++) {
                const float s = mad(S[(size_t)i * Dv + j], k[i], delta);
                S[(size_t)i * Dv + j] = s;
                o = mad(o, s, q[i]);
            }
            d.out[t * (int64_t)d.Hv * Dv + (int64_t)h * Dv + j] = pt_rnd(d.bf, o);
        }
        __syncthreads(); /* q, k and sc are rewritten for the next token */
    }
}

#define DC_THREADS 256

/* Shared floats of the chunked kernel: A [C, C] | Q, K, W [C, Dk] | U [C, Dv] | γ, β [C]. */
static size_t chunk_smem(int C, int Dk, int Dv) {
    return ((size_t)C * C + 3 * (size_t)C * Dk + (size_t)C * Dv + 2 * (size_t)C) * sizeof(float);
}

/* Chunked (WY) form, one block per value head; the CPU's delta_chunked
 * with each loop nest spread over the threads (one element per thread, the
 * inner sums in the CPU's order). The output buffer holds O's first part
 * between two phases (only this block touches those elements). */
__global__ void __launch_bounds__(DC_THREADS) delta_chunked_kernel(delta_args d) {
    extern __shared__ float sh[];
    const int h = blockIdx.x, Dk = d.Dk, Dv = d.Dv, kh = h / (d.Hv / d.Hk), C = d.chunk;
    const int tid = threadIdx.x, nt = blockDim.x;
    float *A = sh, *Q = A + (size_t)C * C, *K = Q + (size_t)C * Dk, *W = K + (size_t)C * Dk, *U = W + (size_t)C * Dk;
    float *gam = U + (size_t)C * Dv, *bet = gam + C;
    float *S = d.state + (size_t)h * Dk * Dv;
    const int64_t ld = d_ld(d), oh = (int64_t)d.Hv * Dv;
    for (int64_t t0 = 0; t0 < d.T; t0 += C) {
        const int n = d.T - t0 < C ? (int)(d.T - t0) : C;
        /* Q, K normalized (a thread per row and matrix); β and g per row */
        for (int r = tid; r < 2 * n; r += nt) {
            const int i = r >> 1, isk = r & 1;
            const float *row = d.qkv + (t0 + i) * ld + (isk ? (int64_t)d.Hk * Dk : 0) + (int64_t)kh * Dk;
            const float inv = l2n_inv(row, Dk);
            float *dst = (isk ? K : Q) + (size_t)i * Dk;
            for (int e = 0; e < Dk; e++) {
                const float v = mul(row[e], inv);
                dst[e] = isk ? v : mul(v, d.q_scale);
            }
        }
        for (int i = tid; i < n; i += nt) beta_g(d, t0 + i, h, &bet[i], &gam[i]);
        __syncthreads();
        if (tid == 0) { /* γ: the cumulative sum of g, in order */
            float acc = 0.0f;
            for (int i = 0; i < n; i++) gam[i] = acc = add(acc, gam[i]);
        }
        __syncthreads();
        /* N = -strict_lower((β⊙K)Kᵀ ⊙ Γ) */
        for (int p = tid; p < n * n; p += nt) {
            const int i = p / n, j = p % n;
            if (j >= i) continue;
            float s = 0.0f;
            for (int e = 0; e < Dk; e++) s = mad(s, K[(size_t)i * Dk + e], K[(size_t)j * Dk + e]);
            A[(size_t)i * C + j] = mul(-mul(bet[i], s), expf(gam[i] - gam[j]));
        }
        __syncthreads();
        /* forward substitution, row by row: row i reads its own entries as
         * they were before this row's update (the CPU updates j upward and
         * reads only m > j) and the final rows m < i */
        for (int i = 2; i < n; i++) {
            float *Ai = A + (size_t)i * C;
            float s = 0.0f;
            const int j = tid;
            if (j < i - 1) {
                s = Ai[j];
                for (int m = j + 1; m < i; m++) s = mad(s, Ai[m], A[(size_t)m * C + j]);
            }
            __syncthreads();
            if (j < i - 1) Ai[j] = s;
            __syncthreads();
        }
        /* U = Tm(β⊙V), W = Tm(β⊙exp(γ)⊙K), Tm = N + I */
        for (int p = tid; p < n * (Dv + Dk); p += nt) {
            const int i = p / (Dv + Dk), e0 = p % (Dv + Dk);
            const float *Ai = A + (size_t)i * C;
            float acc = 0.0f;
            if (e0 < Dv) {
                for (int j = 0; j <= i; j++) {
                    const float c = j == i ? 1.0f : Ai[j];
                    const float *vj = d.qkv + (t0 + j) * ld + 2 * (int64_t)d.Hk * Dk + (int64_t)h * Dv;
                    acc = mad(acc, mul(c, bet[j]), vj[e0]);
                }
                U[(size_t)i * Dv + e0] = acc;
            } else {
                const int e = e0 - Dv;
                for (int j = 0; j <= i; j++) {
                    const float c = j == i ? 1.0f : Ai[j];
                    acc = mad(acc, mul(mul(c, bet[j]), expf(gam[j])), K[(size_t)j * Dk + e]);
                }
                W[(size_t)i * Dk + e] = acc;
            }
        }
        __syncthreads();
        /* V' = U − W·S (in U); O = (exp(γ)⊙Q)·S (into out, unrounded);
         * A ← (QKᵀ ⊙ Γ), lower incl. the diagonal */
        for (int p = tid; p < n * Dv; p += nt) {
            const int i = p / Dv, e = p % Dv;
            const float eg = expf(gam[i]);
            float u = U[(size_t)i * Dv + e], o = 0.0f;
            for (int r = 0; r < Dk; r++) {
                const float sre = S[(size_t)r * Dv + e];
                u = __fsub_rn(u, mul(W[(size_t)i * Dk + r], sre));
                o = mad(o, mul(Q[(size_t)i * Dk + r], eg), sre);
            }
            U[(size_t)i * Dv + e] = u;
            d.out[(t0 + i) * oh + (int64_t)h * Dv + e] = o;
        }
        for (int p = tid; p < n * n; p += nt) {
            const int i = p / n, j = p % n;
            if (j > i) continue;
            float s = 0.0f;
            for (int e = 0; e < Dk; e++) s = mad(s, Q[(size_t)i * Dk + e], K[(size_t)j * Dk + e]);
            A[(size_t)i * C + j] = mul(s, expf(gam[i] - gam[j]));
        }
        __syncthreads();
        /* O += (QKᵀ ⊙ Γ)·V', written rounded; S ← exp(γ_last)·S + Σ_i exp(γ_last − γ_i) k_i ⊗ V'_i */
        for (int p = tid; p < n * Dv; p += nt) {
            const int i = p / Dv, e = p % Dv;
            float *op = d.out + (t0 + i) * oh + (int64_t)h * Dv + e;
            float o = *op;
            for (int j = 0; j <= i; j++) o = mad(o, A[(size_t)i * C + j], U[(size_t)j * Dv + e]);
            *op = pt_rnd(d.bf, o);
        }
        const float gl = gam[n - 1], el = expf(gl);
        for (int p = tid; p < Dk * Dv; p += nt) {
            const int r = p / Dv, e = p % Dv;
            float s = mul(S[p], el);
            for (int i = 0; i < n; i++) s = mad(s, mul(K[(size_t)i * Dk + r], expf(gl - gam[i])), U[(size_t)i * Dv + e]);
            S[p] = s;
        }
        __syncthreads();
    }
}

pt_status pt_cuda_delta_rule(pt_backend *be, float *out, const float *qkv, const float *b, const float *a,
                                          int64_t T, float *state, const pt_delta *p) {
    pt_cuda *c = pt_cuda_of(be);
    if (T < 0 || p->n_k_heads <= 0 || p->n_v_heads % p->n_k_heads || p->k_dim <= 0 || p->v_dim <= 0 || p->chunk < 0)
        return pt_error(PT_ERR_INVALID_ARG, "delta_rule: heads %d key / %d value, dims %d / %d, chunk %d", p->n_k_heads,
                        p->n_v_heads, p->k_dim, p->v_dim, p->chunk);
    if (T == 0) return PT_OK;
    delta_args d = {out, qkv, b, a, T, state, p->n_k_heads, p->n_v_heads, p->k_dim, p->v_dim, p->chunk,
                    pt_cuda_bf(be), p->q_scale, p->A_log, p->dt_bias};
    static int smem_optin = -1; /* the device's opt-in shared memory per block, and the kernel raised to it */
    if (smem_optin < 0) {
        int v = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
        CUDA_CHECK(cudaFuncSetAttribute(delta_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v));
        smem_optin = v;
    }
    const size_t shm = p->chunk > 0 ? chunk_smem(p->chunk, p->k_dim, p->v_dim) : 0;
    if (p->chunk > 0 && T > 1 && p->chunk <= DC_THREADS && shm <= (size_t)smem_optin) {
        delta_chunked_kernel<<<(unsigned)p->n_v_heads, DC_THREADS, shm, c->stream>>>(d);
        CUDA_CHECK_LAUNCH("delta_rule (chunked)");
        return PT_OK;
    }
    if ((size_t)(2 * p->k_dim + 4) * sizeof(float) > 48 * 1024)
        return pt_error(PT_ERR_UNSUPPORTED, "delta_rule: key head dim %d (CUDA takes up to %d)", p->k_dim,
                        (48 * 1024 / 4 - 4) / 2);
    dim3 grid((unsigned)p->n_v_heads, (unsigned)((p->v_dim + DR_THREADS - 1) / DR_THREADS));
    delta_recurrent_kernel<<<grid, DR_THREADS, (size_t)(2 * p->k_dim + 4) * sizeof(float), c->stream>>>(d);
    CUDA_CHECK_LAUNCH("delta_rule");
    return PT_OK;
}

/* ---- gated RMSNorm, copy_rows, x·σ(g) ---- */

__global__ void rms_norm_gated_kernel(float *y, const float *x, const float *z, int64_t D, const void *w, pt_ftype wt,
                                      float eps, int bf) {
    __shared__ float ssh;
    const int64_t r = blockIdx.x;
    const float *xr = x + r * D, *zr = z + r * D;
    /* Σx² in the CPU's order (one thread; rows are head_dim long): in bf16
     * mode a last-bit difference in the norm would flip roundings of the
     * output, which the ill-conditioned DeltaNet stack then amplifies */
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int64_t i = 0; i < D; i++) acc = mad(acc, xr[i], xr[i]);
        ssh = acc;
    }
    __syncthreads();
    const float ss = ssh;
    const float inv = __fdiv_rn(1.0f, sqrtf(add(__fdiv_rn(ss, (float)D), eps)));
    float *yr = y + r * D;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = pt_rnd(bf, mul(pt_ld(wt, w, i), pt_rnd(bf, mul(xr[i], inv))));
        yr[i] = pt_rnd(bf, mul(v, silu_f(zr[i])));
    }
}

pt_status pt_cuda_rms_norm_gated(pt_backend *be, float *y, const float *x, const float *z, int64_t R,
                                              int64_t D, const void *w, pt_ftype wtype, float eps) {
    if (R < 0 || D <= 0 || !w) return pt_error(PT_ERR_INVALID_ARG, "rms_norm_gated: R %lld, D %lld", (long long)R, (long long)D);
    if (R == 0) return PT_OK;
    if (R > INT32_MAX) return pt_error(PT_ERR_UNSUPPORTED, "rms_norm_gated: %lld rows", (long long)R);
    rms_norm_gated_kernel<<<(unsigned)R, 128, 0, pt_cuda_of(be)->stream>>>(y, x, z, D, w, wtype, eps, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("rms_norm_gated");
    return PT_OK;
}

pt_status pt_cuda_copy_rows(pt_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                                         int64_t rows, int64_t n) {
    if (rows < 0 || n < 0 || ldd < n || lds < n)
        return pt_error(PT_ERR_INVALID_ARG, "copy_rows: %lld rows of %lld, strides %lld / %lld", (long long)rows,
                        (long long)n, (long long)ldd, (long long)lds);
    if (rows == 0 || n == 0) return PT_OK;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd * 4, src, (size_t)lds * 4, (size_t)n * 4, (size_t)rows,
                                 cudaMemcpyDeviceToDevice, pt_cuda_of(be)->stream));
    return PT_OK;
}

/* copy_rows_to: up to CRT_MAX rows per launch, their pointers in the launch
 * arguments (1 KiB); blockIdx.y the row, the blocks along x striding over
 * it, 16-byte copies where both rows are 16-byte aligned. */
#define CRT_MAX 64
struct crt_rows {
    float *dst[CRT_MAX];
    const float *src[CRT_MAX];
};
__global__ void copy_rows_to_kernel(crt_rows a, int64_t len) {
    float *d = a.dst[blockIdx.y];
    const float *s = a.src[blockIdx.y];
    const int64_t step = (int64_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t done = 0;
    if ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) % 16 == 0) {
        const int64_t n4 = len / 4;
        for (int64_t i = i0; i < n4; i += step) reinterpret_cast<float4 *>(d)[i] = reinterpret_cast<const float4 *>(s)[i];
        done = n4 * 4;
    }
    for (int64_t i = done + i0; i < len; i += step) d[i] = s[i];
}

pt_status pt_cuda_copy_rows_to(pt_backend *be, float *const *dst, const float *const *src, int n, int64_t len) {
    if (n < 0 || len < 0 || (n > 0 && (!dst || !src)))
        return pt_error(PT_ERR_INVALID_ARG, "copy_rows_to: %d rows of %lld", n, (long long)len);
    if (n == 0 || len == 0) return PT_OK;
    const int64_t per = (len / 4 + 255) / 256; /* blocks a row takes at one 16-byte copy per thread */
    const unsigned bx = (unsigned)(per < 1 ? 1 : per > 32 ? 32 : per);
    for (int r0 = 0; r0 < n; r0 += CRT_MAX) {
        const int k = n - r0 < CRT_MAX ? n - r0 : CRT_MAX;
        crt_rows a;
        for (int r = 0; r < k; r++) {
            if (!dst[r0 + r] || !src[r0 + r]) return pt_error(PT_ERR_INVALID_ARG, "copy_rows_to: row %d is NULL", r0 + r);
            a.dst[r] = dst[r0 + r], a.src[r] = src[r0 + r];
        }
        copy_rows_to_kernel<<<dim3(bx, (unsigned)k), 256, 0, pt_cuda_of(be)->stream>>>(a, len);
        CUDA_CHECK_LAUNCH("copy_rows_to");
    }
    return PT_OK;
}

__global__ void sigmoid_mul_kernel(float *y, const float *x, const float *g, int64_t n, int bf) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = pt_rnd(bf, mul(x[i], pt_rnd(bf, sigm(g[i]))));
}

pt_status pt_cuda_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g, int64_t n) {
    if (n <= 0) return PT_OK;
    sigmoid_mul_kernel<<<pt_cuda_blocks(n, 256), 256, 0, pt_cuda_of(be)->stream>>>(y, x, g, n, pt_cuda_bf(be));
    CUDA_CHECK_LAUNCH("sigmoid_mul");
    return PT_OK;
}
