/* The repack of 4- and 8-bit MLX affine weights into the tensor-core layout
 * (matmul.cuh) that the decode GEMV reads, once per weight at upload:
 * which weights take it (pt_cuda_tc_eligible; PETREL_CUDA_REPACK=0 or
 * pt_cuda_tc_select(0) keeps the MLX layout, A/B), its sizes, and the
 * repack itself (tc_pack_codes_kernel, tc_pack_sb_kernel, pt_cuda_tc_pack);
 * and the dequantize of that layout to bf16 for the prefill path's cuBLAS GEMM
 * (tc_dequant_kernel, pt_cuda_tc_dequant). Not the GEMV that reads the layout
 * (gemv_tc_kernel.cuh, gemv_tc.cu). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_tc.cuh"
#include "backend/cuda/matmul.cuh"

/* ---- repack ---------------------------------------------------------------- */

__global__ void tc_pack_codes_kernel(uint32_t *out, const uint32_t *src, int bits, int64_t E, int64_t N, int64_t K) {
    const int64_t tpe = (N + 15) / 16, nbk = K * bits / 256, total = E * tpe * nbk * 128, wpr = K * bits / 32;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int m = (int)(i & 3), lane = (int)((i >> 2) & 31), g = lane >> 2, t = lane & 3;
        const int64_t rest = i >> 7, b = rest % nbk, tile = rest / nbk, e = tile / tpe, tt = tile % tpe;
        uint32_t o = 0;
        for (int pos = 0; pos < 8; pos++) {
            const int h = pos & 1, sub = ((pos >> 1) & 1) * 2 + (pos >> 2);
            const int64_t r = tt * 16 + g + 8 * h;
            if (r >= N) continue;
            const uint32_t *row = src + (e * N + r) * wpr;
            const int64_t k2 = b * 64 + m * 16 + t * 4 + sub;
            uint32_t nib;
            if (bits == 4) nib = (row[k2 >> 3] >> (4 * (k2 & 7))) & 15u;
            else {
                const int64_t k = k2 >> 1;
                const uint32_t byte = (row[k >> 2] >> (8 * (k & 3))) & 255u;
                nib = (k2 & 1) ? byte >> 4 : byte & 15u;
            }
            o |= nib << (4 * pos);
        }
        out[i] = o;
    }
}

__global__ void tc_pack_sb_kernel(uint32_t *out, const uint16_t *sc, const uint16_t *bi, int64_t E, int64_t N,
                                  int64_t G) {
    const int64_t tpe = (N + 15) / 16, total = E * tpe * G * 16;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int h = (int)(i & 1), g = (int)((i >> 1) & 7);
        const int64_t rest = i >> 4, gi = rest % G, tile = rest / G, e = tile / tpe, r = (tile % tpe) * 16 + g + 8 * h;
        out[i] = r < N ? (uint32_t)sc[(e * N + r) * G + gi] | ((uint32_t)bi[(e * N + r) * G + gi] << 16) : 0u;
    }
}

static int g_tc_off = -1; /* PETREL_CUDA_REPACK=0: keep the MLX layout (A/B) */

extern "C" void pt_cuda_tc_select(int on) { g_tc_off = on ? 0 : 1; }

int pt_cuda_tc_eligible(const pt_cuda *c, const pt_matrix *w) {
    if (g_tc_off < 0) g_tc_off = !pt_env_on("PETREL_CUDA_REPACK");
    /* expert stacks stay in the MLX layout: the MoE prefill's grouped
     * tensor-core GEMM (gemm_tc.cu) reads it */
    return !g_tc_off && w->n_experts <= 1 && c->base.act == PT_ACT_BF16 && (w->bits == 4 || w->bits == 8) &&
           w->dtype == PT_FT_BF16 &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) && w->cols % w->group_size == 0 &&
           (w->cols * w->bits / 4) % 64 == 0 && w->rows <= INT32_MAX && w->cols <= INT32_MAX;
}

size_t pt_cuda_tc_codes_bytes(const pt_matrix *w) {
    const int64_t E = w->n_experts > 1 ? w->n_experts : 1;
    return (size_t)E * (size_t)((w->rows + 15) / 16) * 16 * (size_t)(w->cols * w->bits / 8);
}

size_t pt_cuda_tc_sb_bytes(const pt_matrix *w) {
    const int64_t E = w->n_experts > 1 ? w->n_experts : 1;
    return (size_t)E * (size_t)((w->rows + 15) / 16) * 16 * (size_t)(w->cols / w->group_size) * 4;
}

pt_status pt_cuda_tc_pack(pt_cuda *c, const pt_matrix *w, void *codes, void *sb, const char *name) {
    const int64_t E = w->n_experts > 1 ? w->n_experts : 1, N = w->rows, K = w->cols, G = K / w->group_size;
    const size_t cb = (size_t)E * N * (K * w->bits / 8), sbb = (size_t)E * N * G * 2;
    void *tmp = NULL; /* the MLX layout, for the repack only */
    cudaError_t e = cudaMalloc(&tmp, cb + 2 * sbb);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pt_error(PT_ERR_NOMEM, "%s: cudaMalloc of %zu bytes for the repack failed: %s", name, cb + 2 * sbb,
                        cudaGetErrorName(e));
    }
    char *t = (char *)tmp;
    e = cudaMemcpyAsync(t, w->data, cb, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(t + cb, w->scales, sbb, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(t + cb + sbb, w->biases, sbb, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) {
        tc_pack_codes_kernel<<<pt_cuda_blocks((int64_t)(pt_cuda_tc_codes_bytes(w) / 4), 256), 256, 0, c->stream>>>(
            (uint32_t *)codes, (const uint32_t *)t, w->bits, E, N, K);
        tc_pack_sb_kernel<<<pt_cuda_blocks((int64_t)(pt_cuda_tc_sb_bytes(w) / 4), 256), 256, 0, c->stream>>>(
            (uint32_t *)sb, (const uint16_t *)(t + cb), (const uint16_t *)(t + cb + sbb), E, N, G);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    cudaFree(tmp);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pt_error(PT_ERR_DEVICE, "%s: repack failed: %s (code %d)", name, cudaGetErrorName(e), (int)e);
    }
    return PT_OK;
}

/* ---- dequantize (the prefill path's cuBLAS GEMM) ------------------------------
 * One thread per 16-byte lane piece of a block: a warp reads a whole block
 * (512 contiguous bytes) and each thread writes its two rows' values (4-bit:
 * 4 runs of 4 bf16 per row, 8-bit: 4 runs of 2), the same values as the MLX
 * layout's dequantize (s·q, then + b, each rounded, then bf16). Rows
 * [row_begin, row_begin + nrows) are counted across experts. */
template <int BITS>
__global__ void __launch_bounds__(256) tc_dequant_kernel(bf16 *out, const uint4 *codes, const uint32_t *sb, int gs,
                                                         int64_t N, int64_t K, int64_t row_begin, int64_t nrows,
                                                         int64_t tile0, int64_t ntiles) {
    constexpr int VPM = BITS == 4 ? 4 : 2; /* values of a row per mma word */
    const int64_t tpe = (N + 15) / 16, nbk = K * BITS / 256, G = K / gs;
    const int64_t total = ntiles * nbk * 32;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
        const int64_t b = (i >> 5) % nbk, tile = tile0 + (i >> 5) / nbk, e = tile / tpe, tt = tile % tpe;
        const uint4 wv = __ldg(codes + tile * nbk * 32 + b * 32 + lane);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = tt * 16 + g + 8 * h, gr = e * N + r;
            if (r >= N || gr < row_begin || gr >= row_begin + nrows) continue;
            bf16 *o = out + (gr - row_begin) * K;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const uint32_t wd = m == 0 ? wv.x : m == 1 ? wv.y : m == 2 ? wv.z : wv.w;
                const int64_t k = (b * 64 + m * 16 + t * 4) * 4 / BITS; /* first value */
                const uint32_t v = __ldg(sb + ((tile * G + k / gs) * 8 + g) * 2 + h);
                const float s = __uint_as_float(v << 16), bb = __uint_as_float(v & 0xFFFF0000u);
                float q[VPM];
                if constexpr (BITS == 4) {
#pragma unroll
                    for (int j = 0; j < 4; j++) q[j] = (float)pt_tc_nib(wd, j, h);
                } else {
#pragma unroll
                    for (int j = 0; j < 2; j++)
                        q[j] = (float)(pt_tc_nib(wd, 2 * j, h) | pt_tc_nib(wd, 2 * j + 1, h) << 4);
                }
                uint32_t pk[VPM / 2];
#pragma unroll
                for (int j = 0; j < VPM; j += 2) {
                    __nv_bfloat162 hv = __floats2bfloat162_rn(__fadd_rn(__fmul_rn(s, q[j]), bb),
                                                              __fadd_rn(__fmul_rn(s, q[j + 1]), bb));
                    pk[j / 2] = *reinterpret_cast<uint32_t *>(&hv);
                }
                if constexpr (VPM == 4) *reinterpret_cast<uint2 *>(o + k) = make_uint2(pk[0], pk[1]);
                else *reinterpret_cast<uint32_t *>(o + k) = pk[0];
            }
        }
    }
}

pt_status pt_cuda_tc_dequant(pt_cuda *c, bf16 *out, const pt_matrix *w, int64_t row_begin, int64_t nrows) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    if (!cw || !cw->tc) return pt_error(PT_ERR_INTERNAL, "dequant: weight not in the tensor-core layout");
    if (nrows <= 0) return PT_OK;
    const int64_t N = w->rows, tpe = (N + 15) / 16, last = row_begin + nrows - 1;
    const int64_t t0 = (row_begin / N) * tpe + (row_begin % N) / 16, t1 = (last / N) * tpe + (last % N) / 16;
    const int64_t threads = (t1 - t0 + 1) * (w->cols * w->bits / 256) * 32;
    const unsigned blocks = pt_cuda_blocks(threads, 256);
    if (w->bits == 4)
        tc_dequant_kernel<4><<<blocks, 256, 0, c->stream>>>(out, (const uint4 *)cw->data, (const uint32_t *)cw->scales,
                                                            w->group_size, N, w->cols, row_begin, nrows, t0,
                                                            t1 - t0 + 1);
    else
        tc_dequant_kernel<8><<<blocks, 256, 0, c->stream>>>(out, (const uint4 *)cw->data, (const uint32_t *)cw->scales,
                                                            w->group_size, N, w->cols, row_begin, nrows, t0,
                                                            t1 - t0 + 1);
    CUDA_CHECK_LAUNCH("dequant (tensor-core layout)");
    return PT_OK;
}
