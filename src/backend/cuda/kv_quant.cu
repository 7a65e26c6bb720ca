/* Quantized KV caches on the GPU (DESIGN.md "Quantized KV, exactly", the L2
 * semantics): kv_append into a quantized cache, kv_quantize (the one-time
 * conversion of a full-precision cache), and attention over a quantized
 * cache for prefill chunks and decode.
 *
 * Layout (identical to the CPU's, backend.h pt_kv_layer): codes uint32
 * [n_kv, capacity, head_dim·bits/32], each row an LSB-first bit stream of
 * MLX affine codes; scales/biases [n_kv, capacity, head_dim/group_size] in
 * the cache dtype. A group of group_size (32/64/128) codes is always a whole
 * number of words (group_size·bits is a multiple of 32), so a group can be
 * read and written on its own.
 *
 * Quantization is MLX's Metal rule exactly as src/format/mlx_quant.c
 * computes it (running max from 0, separate correctly rounded divisions,
 * round half away from zero, fp32 scale/bias for the codes, then stored
 * rounded to the dtype): the GPU writes the same bytes as the CPU.
 *
 * Attention (mlx-lm's quantized attention): q is multiplied by the scale
 * first (rounded in bf16 mode); score = q·dequant(K) in f32 in the factored
 * form Σ_groups scale·Σ(q·code) + bias·Σq (rounded); soft-cap; softmax in
 * f32, exact (max and sum first, then p = round(exp(s − max)/sum)); output =
 * Σ p·dequant(V) in f32 (rounded). Prefill in bf16 mode: the rows the chunk
 * attends to are dequantized once per chunk into hi + lo bf16 copies
 * (code·scale + bias in f32, then split so hi + lo carries it to ~16 bits)
 * and flash_attn.cu's tensor-core kernel runs over them, with q scaled and
 * rounded before the dot as here (PETREL_CUDA_QFLASH=0 turns it off);
 * otherwise (f32 mode, head dims flash has no kernel for) one block per
 * (token, head), as the full-precision kernel of attention.cu. Decode (T == 1): split over the
 * sequence like attention.cu's decode path (scores per (KV head, split)
 * shared by the GQA group, p·V per split, ordered merge): no atomics, the
 * result does not depend on scheduling.
 *
 * The fused (online-softmax) decode kernel of the L3 lever is kv_fused.cu's;
 * attention hands T == 1 to it when pt_attn.fused_decode is set. */
#include "backend/cuda/cuda_internal.cuh"

#include "backend/cuda/kv_fused.cuh"
#include "backend/cuda/rope_math.cuh"

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

/* flash_attn.cu: prefill over the hi + lo bf16 copies of a quantized cache */
pt_status pt_cuda_flash_prefill_q(pt_cuda *c, float *out, const float *q, int64_t T, const int32_t *pos,
                                  const __nv_bfloat16 *khi, const __nv_bfloat16 *klo, const __nv_bfloat16 *vhi,
                                  const __nv_bfloat16 *vlo, int nkv, int64_t cap, const pt_attn *p);

#define QA_WARPS 4
#define QA_MAX_HD 256
#define QD_THREADS 128
#define QD_MAX_G 8

static int bits_ok(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

static pt_status check_q(const pt_kv_layer *kv, const char *op) {
    if (!bits_ok(kv->bits) || (kv->group_size != 32 && kv->group_size != 64 && kv->group_size != 128) ||
        kv->head_dim < 0 || kv->head_dim % kv->group_size) /* head_dim 0: a layer without a cache (DeltaNet) */
        return pt_error(PT_ERR_UNSUPPORTED, "%s: quantized KV with %d bits, group size %d, head_dim %d not supported",
                        op, kv->bits, kv->group_size, kv->head_dim);
    if (kv->dtype != PT_FT_F32 && kv->dtype != PT_FT_BF16 && kv->dtype != PT_FT_F16)
        return pt_error(PT_ERR_INVALID_ARG, "%s: quantized KV scale dtype %d", op, (int)kv->dtype);
    return PT_OK;
}

__device__ __forceinline__ void st_param(pt_ftype t, void *p, int64_t i, float v) {
    if (t == PT_FT_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (t == PT_FT_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

/* The MLX Metal rule's scale and bias of a group from its max (taken from 0)
 * and min (from +inf), and a value's code: correctly rounded divisions,
 * round half away from zero (mlx_quant.h). */
__device__ __forceinline__ void quant_params(float w_max, float w_min, float n_bins, float &scale, float &bias) {
    scale = fmaxf(__fdiv_rn(__fsub_rn(w_max, w_min), n_bins), 1e-7f);
    const bool side = fabsf(w_min) > fabsf(w_max);
    scale = side ? scale : -scale;
    const float edge = side ? w_min : w_max;
    const float q0 = roundf(__fdiv_rn(edge, scale));
    bias = 0.0f;
    if (q0 != 0.0f) {
        scale = __fdiv_rn(edge, q0);
        bias = edge;
    }
}
__device__ __forceinline__ uint32_t quant_code(float x, float bias, float scale, float n_bins) {
    const float q = roundf(__fdiv_rn(__fsub_rn(x, bias), scale));
    return (uint32_t)fminf(fmaxf(q, 0.0f), n_bins);
}

/* Quantizes one group w[gs] (MLX Metal rule, see mlx_quant.h) into `words`
 * (gs·bits/32 uint32, overwritten) and stores its scale and bias. */
__device__ void quantize_group(const float *w, int gs, int bits, uint32_t *words, pt_ftype dt, void *sc, void *bi,
                               int64_t pi) {
    const float n_bins = (float)((1 << bits) - 1);
    float w_max = 0.0f, w_min = INFINITY;
    for (int i = 0; i < gs; i++) {
        w_max = fmaxf(w_max, w[i]);
        w_min = fminf(w_min, w[i]);
    }
    float scale, bias;
    quant_params(w_max, w_min, n_bins, scale, bias);
    /* codes into the LSB-first bit stream, a word at a time */
    uint64_t buf = 0;
    int nb = 0, wi = 0;
    for (int i = 0; i < gs; i++) {
        buf |= (uint64_t)quant_code(w[i], bias, scale, n_bins) << nb;
        nb += bits;
        if (nb >= 32) {
            words[wi++] = (uint32_t)buf;
            buf >>= 32;
            nb -= 32;
        }
    }
    st_param(dt, sc, pi, scale);
    st_param(dt, bi, pi, bias);
}

__device__ __forceinline__ float ld_any(pt_ftype t, const void *p, int64_t i) { return pt_ld(t, p, i); }

struct qcache {
    uint32_t *k, *v;
    void *ks, *kb, *vs, *vb;
    int nkv, hd, bits, gs;
    int64_t cap;
    pt_ftype dt;
};

static qcache qcache_of(const pt_kv_layer *kv) {
    qcache q = {(uint32_t *)kv->k, (uint32_t *)kv->v, kv->k_scales, kv->k_biases, kv->v_scales, kv->v_biases,
                kv->n_kv, kv->head_dim, kv->bits, kv->group_size, kv->capacity, kv->dtype};
    return q;
}

/* One thread per (row, group, K or V): row r = t·n_kv + h of x (f32 [T,
 * n_kv, hd]) goes to slot pos[t] % cap of head h. */
__global__ void kv_append_q_kernel(qcache c, const float *k, const float *v, int64_t T, const int32_t *pos) {
    const int ng = c.hd / c.gs, wpg = c.gs * c.bits / 32;
    const int64_t n = T * c.nkv * ng * 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int which = (int)(i & 1);
        const int64_t rg = i >> 1, r = rg / ng;
        const int g = (int)(rg % ng);
        const int64_t t = r / c.nkv;
        const int h = (int)(r % c.nkv);
        const int32_t p = pos[t];
        if (p < 0) continue; /* contract violation: positions are >= 0 */
        const int64_t row = (int64_t)h * c.cap + p % c.cap;
        const float *src = (which ? v : k) + r * c.hd + (int64_t)g * c.gs;
        uint32_t *words = (which ? c.v : c.k) + row * (c.hd * c.bits / 32) + (int64_t)g * wpg;
        quantize_group(src, c.gs, c.bits, words, c.dt, which ? c.vs : c.ks, which ? c.vb : c.kb, row * ng + g);
    }
}

/* The same items a warp each (kv_append_q_kernel's thread is a chain of gs
 * loads and gs divisions: ~5 µs for a decode row's 32 items of the 8B
 * shape, a launch per layer of every quantized-cache decode step). Lane l
 * takes the group's values l, l + 32, ...; the min and max by xor
 * butterflies (exact in any order; w_max starts at 0 and w_min at +inf as
 * in quantize_group, and a signed zero there changes neither scale nor
 * bias), scale and bias by every lane from them with quantize_group's
 * expressions, each value's code by the lane holding it, the codes OR-ed
 * into the group's words in shared memory (bits are set once each: the
 * same words in any order) and stored by the lanes of the words. So the
 * bytes are quantize_group's (tests/cuda/test_cuda_kvq). Dependent launches
 * in the decode chain: released first, everything read after the wait. */
#define KVA_WARPS 4

/* Group g of cache row `row` from the lane's values x[j] = value lane + 32j
 * (j < gs / 32), quantized as quantize_group; w: the warp's 32 words of
 * shared memory. Every lane of the warp calls it. */
__device__ __forceinline__ void kvq_group_warp(const qcache &c, int which, int64_t row, int g, const float (&x)[4],
                                               uint32_t *w) {
    const int lane = threadIdx.x & 31, bits = c.bits, ng = c.hd / c.gs, wpg = c.gs * bits / 32;
    const float n_bins = (float)((1 << bits) - 1);
    float w_max = 0.0f, w_min = INFINITY;
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (32 * j < c.gs) w_max = fmaxf(w_max, x[j]), w_min = fminf(w_min, x[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        w_max = fmaxf(w_max, __shfl_xor_sync(0xffffffffu, w_max, o));
        w_min = fminf(w_min, __shfl_xor_sync(0xffffffffu, w_min, o));
    }
    float scale, bias;
    quant_params(w_max, w_min, n_bins, scale, bias);
    w[lane] = 0u;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (32 * j < c.gs) {
            const uint32_t code = quant_code(x[j], bias, scale, n_bins);
            const int b0 = (lane + 32 * j) * bits, wd = b0 >> 5, sh = b0 & 31;
            atomicOr(&w[wd], code << sh);
            if (sh + bits > 32) atomicOr(&w[wd + 1], code >> (32 - sh));
        }
    __syncwarp();
    uint32_t *words = (which ? c.v : c.k) + row * (c.hd * bits / 32) + (int64_t)g * wpg;
    if (lane < wpg) words[lane] = w[lane];
    if (lane == 0) {
        st_param(c.dt, which ? c.vs : c.ks, row * ng + g, scale);
        st_param(c.dt, which ? c.vb : c.kb, row * ng + g, bias);
    }
    __syncwarp(); /* the words are read before the next group clears them */
}

/* rope_qk then the quantized kv_append in one launch (rope_qk_kv_append over
 * a quantized cache). Blocks below qblocks rotate the query pairs, a thread
 * per pair as rope.cu's rope_kernel; the others take the append's items, a
 * warp per (row, group, K or V), a key group's lanes forming the rotated
 * values of their dims from the raw row as rope_kernel forms them
 * (rope_math.cuh: the pair's table value, the rounded products and sum).
 * With no query blocks and half = 0 nothing is rotated and inv_freq is not
 * read: the plain quantized append (pt_cuda_kv_append_q), each group's values
 * src[g·gs + lane + 32j] quantized by kvq_group_warp.
 * So q and the cache bytes are those of rope_qk + kv_append
 * (tests/cuda/test_cuda_kvq); k is read only (its groups' warps share the
 * pairs), so it is left unrotated. */
__global__ void __launch_bounds__(KVA_WARPS * 32)
    rope_kvq_kernel(qcache c, float *q, const float *k, const float *v, int64_t T, int nh, const int32_t *pos,
                    int half, const float *inv_freq, float attn_scale, int bf, unsigned qblocks) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ uint32_t wsm[KVA_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ng = c.hd / c.gs, hd = c.hd;
    if (blockIdx.x < qblocks) {
        const int64_t n = T * nh * half;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)qblocks * blockDim.x) {
            const int d = (int)(i % half);
            const int64_t th_ = i / half; /* token·head */
            const float th = (float)pos[th_ / nh] * inv_freq[d];
            const float cs = pt_rope_cos(th, attn_scale, bf), sn = pt_rope_sin(th, attn_scale, bf);
            float *x = q + th_ * hd;
            const float a = x[d], b = x[d + half];
            x[d] = pt_rope_lo(a, b, cs, sn, bf);
            x[d + half] = pt_rope_hi(a, b, cs, sn, bf);
        }
        return;
    }
    const int64_t n = T * c.nkv * ng * 2;
    const int64_t wstride = (int64_t)(gridDim.x - qblocks) * KVA_WARPS;
    for (int64_t i = (int64_t)(blockIdx.x - qblocks) * KVA_WARPS + warp; i < n; i += wstride) {
        const int which = (int)(i & 1);
        const int64_t rg = i >> 1, r = rg / ng;
        const int g = (int)(rg % ng);
        const int32_t p = pos[r / c.nkv];
        if (p < 0) continue; /* nothing stored for a negative position (uniform in the warp) */
        const float *src = (which ? v : k) + r * hd;
        float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (32 * j < c.gs) {
                const int d = g * c.gs + lane + 32 * j;
                if (which || d >= 2 * half) {
                    x[j] = src[d];
                } else {
                    const int e = d < half ? d : d - half; /* the pair (e, e + half) */
                    const float th = (float)p * inv_freq[e];
                    const float cs = pt_rope_cos(th, attn_scale, bf), sn = pt_rope_sin(th, attn_scale, bf);
                    const float a = src[e], b = src[e + half];
                    x[j] = d < half ? pt_rope_lo(a, b, cs, sn, bf) : pt_rope_hi(a, b, cs, sn, bf);
                }
            }
        kvq_group_warp(c, which, (int64_t)(r % c.nkv) * c.cap + p % c.cap, g, x, wsm[warp]);
    }
}

pt_status pt_cuda_rope_qk_kv_append_q(pt_backend *be, float *q, float *k, const float *v, int64_t T, int n_heads,
                                      const int32_t *pos, const pt_rope *rope, pt_kv_layer *kv) {
    PT_TRY(check_q(kv, "rope_qk_kv_append"));
    const int half = rope->rot_dim / 2, ng = kv->head_dim / kv->group_size;
    const int64_t nq = T * n_heads * half, nw = T * kv->n_kv * ng * 2;
    if (nq + nw <= 0) return PT_OK;
    pt_cuda *c = pt_cuda_of(be);
    const unsigned qblocks = nq > 0 ? pt_cuda_blocks(nq, KVA_WARPS * 32) : 0;
    const unsigned blocks = qblocks + (nw > 0 ? pt_cuda_blocks(nw, KVA_WARPS) : 0);
    pt_launch(rope_kvq_kernel, dim3(blocks), dim3(KVA_WARPS * 32), 0, c->stream, pt_pdl_chain(), qcache_of(kv), q, k,
              v, T, n_heads, pos, half, (const float *)rope->inv_freq, rope->attn_scale, pt_cuda_bf(be), qblocks);
    CUDA_CHECK_LAUNCH("rope_qk_kv_append (quantized)");
    return PT_OK;
}

pt_status pt_cuda_kv_append_q(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                              const int32_t *pos) {
    PT_TRY(check_q(kv, "kv_append"));
    const int64_t n = T * kv->n_kv * (kv->head_dim / kv->group_size) * 2;
    if (n <= 0) return PT_OK;
    pt_cuda *c = pt_cuda_of(be);
    static int warp_form = -1; /* PETREL_CUDA_KVQ_WARP=0: a thread per item (A/B) */
    if (warp_form < 0) warp_form = pt_env_on("PETREL_CUDA_KVQ_WARP");
    if (warp_form)
        pt_launch(rope_kvq_kernel, dim3(pt_cuda_blocks(n, KVA_WARPS)), dim3(KVA_WARPS * 32), 0, c->stream,
                  pt_pdl_chain(), qcache_of(kv), (float *)nullptr, k, v, T, 0, pos, 0, (const float *)nullptr, 1.0f, 0,
                  0u);
    else
        kv_append_q_kernel<<<pt_cuda_blocks(n, 128), 128, 0, c->stream>>>(qcache_of(kv), k, v, T, pos);
    CUDA_CHECK_LAUNCH("kv_append (quantized)");
    return PT_OK;
}

/* One thread per (position, head, group, K or V): the row of position
 * p0 + i of the full-precision source, quantized into the destination. */
__global__ void kv_quantize_kernel(qcache c, const void *sk, const void *sv, pt_ftype sdt, int64_t scap, int64_t p0,
                                   int64_t np) {
    const int ng = c.hd / c.gs, wpg = c.gs * c.bits / 32;
    const int64_t n = np * c.nkv * ng * 2;
    float w[128];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int which = (int)(i & 1);
        const int64_t rg = i >> 1, r = rg / ng;
        const int g = (int)(rg % ng);
        const int64_t p = p0 + r / c.nkv;
        const int h = (int)(r % c.nkv);
        const int64_t so = ((int64_t)h * scap + p % scap) * c.hd + (int64_t)g * c.gs;
        for (int e = 0; e < c.gs; e++) w[e] = ld_any(sdt, which ? sv : sk, so + e);
        const int64_t row = (int64_t)h * c.cap + p % c.cap;
        uint32_t *words = (which ? c.v : c.k) + row * (c.hd * c.bits / 32) + (int64_t)g * wpg;
        quantize_group(w, c.gs, c.bits, words, c.dt, which ? c.vs : c.ks, which ? c.vb : c.kb, row * ng + g);
    }
}

pt_status pt_cuda_kv_quantize(pt_backend *be, pt_kv_layer *dst, const pt_kv_layer *src, int64_t p0, int64_t p1) {
    if (src->bits || !dst->bits || src->n_kv != dst->n_kv || src->head_dim != dst->head_dim)
        return pt_error(PT_ERR_INVALID_ARG,
                        "kv_quantize: needs a full-precision source and a quantized destination of the same shape "
                        "(source %d bits, %d heads of %d; destination %d bits, %d heads of %d)",
                        src->bits, src->n_kv, src->head_dim, dst->bits, dst->n_kv, dst->head_dim);
    PT_TRY(check_q(dst, "kv_quantize"));
    if (p0 < 0 || p1 < p0 || p1 - p0 > src->capacity || p1 - p0 > dst->capacity)
        return pt_error(PT_ERR_RANGE, "kv_quantize: positions [%lld, %lld) do not fit the caches", (long long)p0,
                        (long long)p1);
    const int64_t n = (p1 - p0) * dst->n_kv * (dst->head_dim / dst->group_size) * 2;
    if (n == 0) return PT_OK;
    kv_quantize_kernel<<<pt_cuda_blocks(n, 128), 128, 0, pt_cuda_of(be)->stream>>>(
        qcache_of(dst), src->k, src->v, src->dtype, src->capacity, p0, p1 - p0);
    CUDA_CHECK_LAUNCH("kv_quantize");
    return PT_OK;
}

/* ---- attention over a quantized cache ---- */

struct qattn_args {
    float *out;
    const float *q;
    qcache c;
    const int32_t *pos;
    int nh;
    float scale, softcap;
    int window, bf;
};

/* Code of element e of a packed row (any width: may span two words). */
__device__ __forceinline__ uint32_t code_at(const uint32_t *row, int e, int bits) {
    const int bit = e * bits, w = bit >> 5, sh = bit & 31;
    uint32_t v = row[w] >> sh;
    if (sh + bits > 32) v |= row[w + 1] << (32 - sh);
    return v & ((1u << bits) - 1u);
}

/* Dequantized element e of cache row `row` (= h·cap + slot) of K or V. */
__device__ __forceinline__ float deq(const uint32_t *codes, const void *sc, const void *bi, const qcache &c,
                                     int64_t row, int e) {
    const int64_t pi = row * (c.hd / c.gs) + e / c.gs;
    const float s = pt_ld(c.dt, sc, pi), b = pt_ld(c.dt, bi, pi);
    return fmaf((float)code_at(codes + row * (c.hd * c.bits / 32), e, c.bits), s, b);
}

__device__ __forceinline__ float qcap(float s, const qattn_args &a) {
    if (a.softcap > 0.f) s = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, s / a.softcap))) * a.softcap);
    return s;
}

/* Prefill (and decode shapes the split path does not take): one block per
 * (query token, query head); 4 warps take keys in turn, lanes split
 * head_dim; qr holds the lane's slice of the pre-scaled query. */
template <int NPL>
__device__ __forceinline__ float qscore(const float (&qr)[NPL], const qattn_args &a, int64_t row, int lane) {
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        if (e < a.c.hd) d = fmaf(qr[i], deq(a.c.k, a.c.ks, a.c.kb, a.c, row, e), d);
    }
    return qcap(pt_rnd(a.bf, pt_warp_sum(d)), a);
}

template <int NPL>
__global__ void __launch_bounds__(QA_WARPS * 32) qattn_kernel(qattn_args a) {
    __shared__ float sm_m[QA_WARPS], sm_l[QA_WARPS];
    __shared__ float sm_acc[QA_WARPS][QA_MAX_HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = blockIdx.x / a.nh;
    const int h = (int)(blockIdx.x % a.nh);
    const int kh = h / (a.nh / a.c.nkv);
    const int hd = a.c.hd;
    const int64_t hi = a.pos[t];
    const int64_t lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    const int64_t rbase = (int64_t)kh * a.c.cap;
    const float *qp = a.q + (t * a.nh + h) * hd;
    float qr[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        qr[i] = e < hd ? pt_rnd(a.bf, qp[e] * a.scale) : 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int64_t j = lo + warp; j <= hi; j += QA_WARPS) {
        pt_softmax_push(qscore<NPL>(qr, a, rbase + j % a.c.cap, lane), m, l);
    }
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
    __syncthreads();
    float M;
    const float inv = pt_softmax_warps<QA_WARPS>(sm_m, sm_l, M);
    float acc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) acc[i] = 0.f;
    for (int64_t j = lo + warp; j <= hi; j += QA_WARPS) {
        const int64_t row = rbase + j % a.c.cap;
        const float p = pt_rnd(a.bf, expf(qscore<NPL>(qr, a, row, lane) - M) * inv);
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int e = lane + 32 * i;
            if (e < hd) acc[i] = fmaf(p, deq(a.c.v, a.c.vs, a.c.vb, a.c, row, e), acc[i]);
        }
    }
    pt_warps_out(acc, sm_acc, a.out + (t * a.nh + h) * hd, hd, a.bf);
}

/* ---- decode: split over the sequence (see attention.cu) ---- */

__device__ __forceinline__ void qdec_range(const qattn_args &a, int nsplit, int64_t stride, int64_t &lo, int64_t &n,
                                           int64_t &per) {
    const int64_t hi = a.pos[0];
    lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    n = hi - lo + 1;
    if (n > stride) n = stride;
    if (n < 0) n = 0;
    per = (n + nsplit - 1) / nsplit;
}

/* A key's score from its dot d (rounded, soft-capped) into the scores row
 * S[srow + j] and the thread's running statistics of its head. */
__device__ __forceinline__ void qdec_push(const qattn_args &a, float *S, int64_t srow, int64_t j, float d, float &m,
                                          float &l) {
    const float s = qcap(pt_rnd(a.bf, d), a);
    S[srow + j] = s;
    pt_softmax_push(s, m, l);
}

/* A split's (max, sum) per head of KV head kh from the threads' running
 * statistics, into ML [heads, nsplit] (every thread of the block calls it). */
__device__ __forceinline__ void qdec_split_stats(const float (&m)[QD_MAX_G], const float (&l)[QD_MAX_G], int G, int kh,
                                                 float *red, float2 *ML, int64_t nsplit, int64_t split) {
    for (int g = 0; g < G; g++) {
        const float2 ml = pt_softmax_block(m[g], l[g], red);
        if (threadIdx.x == 0) ML[((int64_t)kh * G + g) * nsplit + split] = ml;
    }
}

/* The exact row max M and 1/L of each head of KV head kh from the splits'
 * (max, sum) pairs, merged in split order, into sM / sInv (threads g < G;
 * the block synchronizes after). */
__device__ __forceinline__ void qdec_row_stats(const float2 *ML, int G, int kh, int64_t nsplit, float *sM,
                                               float *sInv) {
    if (threadIdx.x < G) {
        float M, L;
        pt_softmax_merge(ML + ((int64_t)kh * G + threadIdx.x) * nsplit, (int)nsplit, M, L);
        sM[threadIdx.x] = M;
        sInv[threadIdx.x] = 1.0f / L;
    }
    __syncthreads();
}

/* Scores: one thread per key, the G heads of KV head kh at once; the
 * pre-scaled queries and their group sums in shared memory. The codes of a
 * group are read as a bit stream (BITS known at compile time). */
template <int BITS>
__global__ void __launch_bounds__(QD_THREADS) qdec_scores_kernel(qattn_args a, int64_t stride, float *S, float2 *ML) {
    extern __shared__ float sh[]; /* qs [G, hd] | xs [G, ng] */
    __shared__ float red[32];
    const int G = a.nh / a.c.nkv, hd = a.c.hd, gs = a.c.gs, ng = hd / gs;
    const int kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    float *qs = sh, *xs = sh + G * hd;
    int64_t lo, n, per;
    qdec_range(a, nsplit, stride, lo, n, per);
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = pt_rnd(a.bf, a.q[(int64_t)kh * G * hd + i] * a.scale);
    __syncthreads();
    for (int i = threadIdx.x; i < G * ng; i += blockDim.x) {
        const float *x = qs + (i / ng) * hd + (i % ng) * gs;
        float s = 0.f;
        for (int e = 0; e < gs; e++) s += x[e];
        xs[i] = s;
    }
    __syncthreads();
    constexpr uint32_t MASK = (1u << BITS) - 1u;
    const int wpr = hd * BITS / 32, wpg = gs * BITS / 32;
    float m[QD_MAX_G], l[QD_MAX_G];
#pragma unroll
    for (int g = 0; g < QD_MAX_G; g++) m[g] = -INFINITY, l[g] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const int64_t row = (int64_t)kh * a.c.cap + (lo + j) % a.c.cap;
        const uint32_t *cr = a.c.k + row * wpr;
        float d[QD_MAX_G];
#pragma unroll
        for (int g = 0; g < QD_MAX_G; g++) d[g] = 0.f;
        for (int b = 0; b < ng; b++) {
            const float sc = pt_ld(a.c.dt, a.c.ks, row * ng + b), bi = pt_ld(a.c.dt, a.c.kb, row * ng + b);
            float dg[QD_MAX_G];
#pragma unroll
            for (int g = 0; g < QD_MAX_G; g++) dg[g] = 0.f;
            const uint32_t *wp = cr + b * wpg;
            uint64_t buf = 0;
            int nb = 0;
            for (int i = 0; i < gs; i++) {
                if (nb < BITS) {
                    buf |= (uint64_t)(*wp++) << nb;
                    nb += 32;
                }
                const float code = (float)((uint32_t)buf & MASK);
                buf >>= BITS;
                nb -= BITS;
                const float *qx = qs + b * gs + i;
#pragma unroll
                for (int g = 0; g < QD_MAX_G; g++) {
                    if (g >= G) break;
                    dg[g] = fmaf(qx[g * hd], code, dg[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < QD_MAX_G; g++) {
                if (g >= G) break;
                d[g] = fmaf(bi, xs[g * ng + b], fmaf(sc, dg[g], d[g]));
            }
        }
#pragma unroll
        for (int g = 0; g < QD_MAX_G; g++) {
            if (g >= G) break;
            qdec_push(a, S, ((int64_t)kh * G + g) * stride, j, d[g], m[g], l[g]);
        }
    }
    qdec_split_stats(m, l, G, kh, red, ML, nsplit, split);
}

/* p·V: a warp per key, lanes split head_dim; each value row dequantized
 * once for the G heads. */
template <int NPL>
__global__ void __launch_bounds__(QD_THREADS)
    qdec_pv_kernel(qattn_args a, int64_t stride, const float *S, const float2 *ML, float *P) {
    __shared__ float sM[QD_MAX_G], sInv[QD_MAX_G];
    __shared__ float acc_s[QD_THREADS / 32][QD_MAX_G * NPL * 32];
    const int G = a.nh / a.c.nkv, hd = a.c.hd, kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t lo, n, per;
    qdec_range(a, nsplit, stride, lo, n, per);
    qdec_row_stats(ML, G, kh, nsplit, sM, sInv);
    float acc[QD_MAX_G][NPL];
#pragma unroll
    for (int g = 0; g < QD_MAX_G; g++)
#pragma unroll
        for (int i = 0; i < NPL; i++) acc[g][i] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    for (int64_t j = j0 + warp; j < j1; j += QD_THREADS / 32) {
        const int64_t row = (int64_t)kh * a.c.cap + (lo + j) % a.c.cap;
        float vv[NPL];
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int e = lane + 32 * i;
            vv[i] = e < hd ? deq(a.c.v, a.c.vs, a.c.vb, a.c, row, e) : 0.f;
        }
#pragma unroll
        for (int g = 0; g < QD_MAX_G; g++) {
            if (g >= G) break;
            const float p = pt_rnd(a.bf, expf(S[((int64_t)kh * G + g) * stride + j] - sM[g]) * sInv[g]);
#pragma unroll
            for (int i = 0; i < NPL; i++) acc[g][i] = fmaf(p, vv[i], acc[g][i]);
        }
    }
    pt_pv_partial<QD_MAX_G, NPL, QD_THREADS / 32>(acc, acc_s, G, hd, P, (int64_t)kh * G, nsplit, split);
}

/* ---- decode, second generation (4- and 8-bit caches): the same splits,
 * the same merge, laid out for the memory system ----
 * The kernels above give a key to a thread (scores: 16-64 dependent 4-byte
 * loads per key, one after another; p·V: a warp per key, each lane's code,
 * scale and bias loads waiting on each other): at 32k keys a layer of the
 * llama-3.1-8b shape took ~0.55 ms, latency, not bytes. These read a key
 * row as 16-byte chunks (scores: LPR lanes per key, chunk `sub` each, the
 * queries in shared memory padded so those lanes' reads meet no bank
 * conflict) or 8 dims per lane (p·V: one word of 4-bit codes, two of 8-bit,
 * consecutive lanes on consecutive dims), and every lane issues its loads
 * for 4 (scores) or 8 (p·V) keys before it uses any of them.
 *
 * Arithmetic: the quantities and rounding points of the kernels above (q·
 * scale rounded; a key's score the sum over groups of sc·Σ(q·code) plus
 * bi·Σq, rounded, soft-capped; p = round(exp(s − M)/L) with the exact M, L;
 * value = code·sc + bi in f32); the sums run in another order (a chunk's
 * partial dot scaled on its own lane, the lanes of a key added by an xor
 * butterfly; p·V over key slots, then warps in warp order), so results
 * differ from them in the last bits. Which lane takes which key depends only
 * on the shape. PETREL_CUDA_QDEC2=0 (read once): the kernels above. */
#define Q2_WARPS 8
#define Q2_THREADS (Q2_WARPS * 32)
#define Q2_U 4 /* key steps whose loads a lane has in flight at once */

template <int BITS, int LPR>
__global__ void __launch_bounds__(Q2_THREADS, 2) qdec2_scores_kernel(qattn_args a, int64_t stride, float *S, float2 *ML) {
    pt_wait_primary(); /* a dependent launch (qdec_pdl): everything read after the wait */
    extern __shared__ float4 q2_sh[]; /* qs [G, R·QC] (padded, below) | xs [G, ng] */
    __shared__ float red[32];
    constexpr int CPC = 128 / BITS, KPW = 32 / LPR; /* dims per 16-byte chunk, keys per warp step */
    constexpr uint32_t MASK = (1u << BITS) - 1u;
    const int G = a.nh / a.c.nkv, hd = a.c.hd, gs = a.c.gs, ng = hd / gs, R = hd * BITS / 128;
    const int kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane % LPR, ks = lane / LPR;
    /* q of head g, dim e at qs[g·QR + (e / CPC)·QC + e % CPC]: each chunk's
     * CPC values padded by 4, so the float4 reads of the LPR lanes of a key
     * (one chunk each, at the same offset in it) fall on distinct banks
     * (unpadded, chunks 64 or 128 bytes apart met 2-4 to a bank) */
    constexpr int QC = CPC + 4;
    const int QR = R * QC;
    float *qs = reinterpret_cast<float *>(q2_sh), *xs = qs + G * QR;
    int64_t lo, n, per;
    qdec_range(a, nsplit, stride, lo, n, per);
    for (int i = threadIdx.x; i < G * hd; i += Q2_THREADS) {
        const int g = i / hd, e = i % hd;
        qs[g * QR + (e / CPC) * QC + e % CPC] = pt_rnd(a.bf, a.q[(int64_t)kh * G * hd + i] * a.scale);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * ng; i += Q2_THREADS) {
        const int g = i / ng, e0 = (i % ng) * gs;
        float s = 0.f;
        for (int e = e0; e < e0 + gs; e++) s += qs[g * QR + (e / CPC) * QC + e % CPC];
        xs[i] = s;
    }
    __syncthreads();
    const bool live = sub < R;
    const int grp = live ? sub * CPC / gs : 0;
    const bool first = live && (sub * CPC) % gs == 0; /* the group's first chunk adds its bias term */
    float m[QD_MAX_G], l[QD_MAX_G];
#pragma unroll
    for (int g = 0; g < QD_MAX_G; g++) m[g] = -INFINITY, l[g] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    const uint4 *kc = reinterpret_cast<const uint4 *>(a.c.k) + (int64_t)kh * a.c.cap * R;
    const int64_t prow0 = (int64_t)kh * a.c.cap, rlo = lo % a.c.cap;
    for (int64_t jb = j0 + (int64_t)warp * (Q2_U * KPW); jb < j1; jb += (int64_t)Q2_WARPS * Q2_U * KPW) {
        uint4 cw[Q2_U];
        float sc[Q2_U], bi[Q2_U];
#pragma unroll
        for (int u = 0; u < Q2_U; u++) {
            const int64_t j = jb + u * KPW + ks;
            int64_t slot = rlo + j; /* keys wrap at most once: j < n <= cap */
            if (slot >= a.c.cap) slot -= a.c.cap;
            const bool ok = live && j < j1;
            cw[u] = ok ? __ldg(kc + slot * R + sub) : make_uint4(0u, 0u, 0u, 0u);
            sc[u] = ok ? pt_ld(a.c.dt, a.c.ks, (prow0 + slot) * ng + grp) : 0.f;
            bi[u] = ok ? pt_ld(a.c.dt, a.c.kb, (prow0 + slot) * ng + grp) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < Q2_U; u++) {
            float d[QD_MAX_G];
#pragma unroll
            for (int g = 0; g < QD_MAX_G; g++) d[g] = 0.f;
            if (live) {
                const uint32_t w4[4] = {cw[u].x, cw[u].y, cw[u].z, cw[u].w};
#pragma unroll
                for (int wi = 0; wi < 4; wi++) {
#pragma unroll
                    for (int c4 = 0; c4 < 8 / BITS; c4++) { /* 4 codes against a float4 of each query */
                        const uint32_t w = w4[wi] >> (c4 * 4 * BITS);
                        const float k0 = (float)(w & MASK), k1 = (float)((w >> BITS) & MASK),
                                    k2 = (float)((w >> (2 * BITS)) & MASK), k3 = (float)((w >> (3 * BITS)) & MASK);
                        const int e = sub * QC + wi * (32 / BITS) + c4 * 4; /* padded offset */
#pragma unroll
                        for (int g = 0; g < QD_MAX_G; g++) {
                            if (g >= G) break;
                            const float4 qv = *reinterpret_cast<const float4 *>(qs + g * QR + e);
                            d[g] = fmaf(qv.x, k0, d[g]);
                            d[g] = fmaf(qv.y, k1, d[g]);
                            d[g] = fmaf(qv.z, k2, d[g]);
                            d[g] = fmaf(qv.w, k3, d[g]);
                        }
                    }
                }
#pragma unroll
                for (int g = 0; g < QD_MAX_G; g++) {
                    if (g >= G) break;
                    d[g] = fmaf(sc[u], d[g], first ? bi[u] * xs[g * ng + grp] : 0.f);
                }
            }
            pt_lanes_sum<LPR>(d, G); /* the key's LPR lanes */
            const int64_t j = jb + u * KPW + ks;
            if (j < j1) {
#pragma unroll
                for (int g = 0; g < QD_MAX_G; g++) {
                    if (g >= G) break;
                    if (g % LPR != sub) continue;
                    qdec_push(a, S, ((int64_t)kh * G + g) * stride, j, d[g], m[g], l[g]);
                }
            }
        }
    }
    qdec_split_stats(m, l, G, kh, red, ML, nsplit, split);
    /* the p·V launch may be scheduled once every block is here (released at the end: its blocks,
     * resident earlier, would take the room of this kernel's wave; bench/RESULTS.md) */
    pt_release_dependents();
}

/* p·V: a lane takes 8 dims of a value row (one word of 4-bit codes, two
 * of 8-bit), LP lanes a row (the power of two >= hd / 8), KPW = 32/LP keys
 * per warp step, the loads of 8 steps in flight. */
template <int BITS, int LP, int MG>
__global__ void __launch_bounds__(Q2_THREADS, 2)
    qdec2_pv_kernel(qattn_args a, int64_t stride, const float *S, const float2 *ML, float *P) {
    pt_wait_primary(); /* a dependent launch (qdec_pdl): everything read after the wait */
    constexpr int WL = BITS == 8 ? 2 : 1, KPW = 32 / LP, U = 8, KB = U * KPW; /* words per lane, 8 dims */
    constexpr uint32_t MASK = (1u << BITS) - 1u;
    __shared__ float sM[QD_MAX_G], sInv[QD_MAX_G];
    __shared__ float ps[Q2_WARPS][MG][KB];
    extern __shared__ float4 q2_po[]; /* [Q2_WARPS][G][hd] the warps' partial outputs */
    const int G = a.nh / a.c.nkv, hd = a.c.hd, gs = a.c.gs, ng = hd / gs, wpr = hd * BITS / 32;
    const int kh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane % LP, ks = lane / LP;
    const bool live = sub * WL < wpr; /* dims 8·sub … 8·sub + 7 */
    const int grp = live ? sub * 8 / gs : 0;
    int64_t lo, n, per;
    qdec_range(a, nsplit, stride, lo, n, per);
    qdec_row_stats(ML, G, kh, nsplit, sM, sInv);
    float acc[MG][8];
#pragma unroll
    for (int g = 0; g < MG; g++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[g][i] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    const int64_t prow0 = (int64_t)kh * a.c.cap, rlo = lo % a.c.cap;
    const float *Sk = S + (int64_t)kh * G * stride;
    for (int64_t jb = j0 + (int64_t)warp * KB; jb < j1; jb += (int64_t)Q2_WARPS * KB) {
        uint32_t vw[U][WL];
        float sc[U], bi[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t j = jb + u * KPW + ks;
            int64_t slot = rlo + j;
            if (slot >= a.c.cap) slot -= a.c.cap;
            const int64_t row = prow0 + slot;
            const bool ok = live && j < j1;
            if constexpr (WL == 2) {
                const uint2 t = ok ? __ldg(reinterpret_cast<const uint2 *>(a.c.v + row * wpr) + sub) : make_uint2(0u, 0u);
                vw[u][0] = t.x, vw[u][1] = t.y;
            } else vw[u][0] = ok ? __ldg(a.c.v + row * wpr + sub) : 0u;
            sc[u] = ok ? pt_ld(a.c.dt, a.c.vs, row * ng + grp) : 0.f;
            bi[u] = ok ? pt_ld(a.c.dt, a.c.vb, row * ng + grp) : 0.f;
        }
        /* the batch's probabilities, lanes over (head, key); 0 past j1 */
        for (int idx = lane; idx < KB * G; idx += 32) {
            const int g = idx / KB, kk = idx % KB;
            const int64_t j = jb + kk;
            ps[warp][g][kk] = j < j1 ? pt_rnd(a.bf, expf(Sk[(int64_t)g * stride + j] - sM[g]) * sInv[g]) : 0.f;
        }
        __syncwarp();
#pragma unroll
        for (int u = 0; u < U; u++) {
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] = fmaf((float)((vw[u][i / (32 / BITS)] >> ((i % (32 / BITS)) * BITS)) & MASK), sc[u], bi[u]);
#pragma unroll
            for (int g = 0; g < MG; g++) {
                if (g >= G) break;
                const float p = ps[warp][g][u * KPW + ks];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[g][i] = fmaf(p, v[i], acc[g][i]);
            }
        }
        __syncwarp(); /* ps is written again by the next batch */
    }
    /* the warp's key slots added: lanes sub, sub + LP, ... */
#pragma unroll
    for (int o = LP; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < MG; g++) {
            if (g >= G) break;
            pt_xor_add(acc[g], o);
        }
    float *po = reinterpret_cast<float *>(q2_po);
    if (ks == 0 && live) {
#pragma unroll
        for (int g = 0; g < MG; g++) {
            if (g >= G) break;
#pragma unroll
            for (int i = 0; i < 8; i++) po[(warp * G + g) * hd + sub * 8 + i] = acc[g][i];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * hd; idx += Q2_THREADS) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < Q2_WARPS; w++) v += po[w * G * hd + idx];
        P[(((int64_t)kh * G + idx / hd) * nsplit + split) * hd + idx % hd] = v;
    }
    pt_release_dependents(); /* the merge (after the partials are stored, as above) */
}

/* The second-generation launches, or PT_ERR_UNSUPPORTED (bits other than 4
 * and 8, a head_dim whose row is not whole 16-byte chunks, more than 64
 * words per row). */
/* The second-generation kernels as dependent launches, each waiting before
 * its first load and releasing the next launch only at its end: unless
 * PETREL_CUDA_QDEC_PDL=0 or PETREL_CUDA_PDL_CHAIN=0 (A/B); read once. */
static bool qdec_pdl(void) {
    static int on = -1;
    if (on < 0) on = pt_env_on("PETREL_CUDA_QDEC_PDL") && pt_pdl_chain();
    return on != 0;
}

static pt_status launch_qdecode2(pt_cuda *c, const qattn_args &a, dim3 grid, int64_t stride) {
    static int on = -1;
    if (on < 0) on = pt_env_on("PETREL_CUDA_QDEC2");
    const int bits = a.c.bits, hd = a.c.hd, G = a.nh / a.c.nkv;
    if (!on || (bits != 4 && bits != 8) || (hd * bits) % 128 || hd * bits / 32 > 64 || G > QD_MAX_G)
        return PT_ERR_UNSUPPORTED;
    const int R = hd * bits / 128, lpr = R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : R <= 8 ? 8 : 16;
    const size_t shm = ((size_t)G * R * (128 / bits + 4) + (size_t)G * (hd / a.c.gs)) * sizeof(float);
#define PT_Q2S(B, L)                                                                                          \
    case L:                                                                                                   \
        pt_launch(qdec2_scores_kernel<B, L>, grid, dim3(Q2_THREADS), shm, c->stream, qdec_pdl(), a, stride, c->dec_s, \
                  c->dec_ml);                                                                                 \
        break;
    if (bits == 4) {
        switch (lpr) { PT_Q2S(4, 1) PT_Q2S(4, 2) PT_Q2S(4, 4) PT_Q2S(4, 8) PT_Q2S(4, 16) }
    } else {
        switch (lpr) { PT_Q2S(8, 1) PT_Q2S(8, 2) PT_Q2S(8, 4) PT_Q2S(8, 8) PT_Q2S(8, 16) }
    }
#undef PT_Q2S
    CUDA_CHECK_LAUNCH("quantized decode attention scores");
    const int lp = hd / 8 <= 4 ? 4 : hd / 8 <= 8 ? 8 : hd / 8 <= 16 ? 16 : 32;
    const size_t pb = (size_t)Q2_WARPS * G * hd * sizeof(float);
    static bool raised[2][2][4];
#define PT_Q2P(B, L, MG)                                                                                          \
    do {                                                                                                          \
        bool &r_ = raised[B == 8][MG > 4][L == 4 ? 0 : L == 8 ? 1 : L == 16 ? 2 : 3];                             \
        if (pb > 48 * 1024 && !r_) {                                                                              \
            CUDA_CHECK(cudaFuncSetAttribute(qdec2_pv_kernel<B, L, MG>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                            64 * 1024));                                                          \
            r_ = true;                                                                                            \
        }                                                                                                         \
        pt_launch(qdec2_pv_kernel<B, L, MG>, grid, dim3(Q2_THREADS), pb, c->stream, qdec_pdl(), a, stride,       \
                  (const float *)c->dec_s, (const float2 *)c->dec_ml, c->dec_p);                                  \
    } while (0)
#define PT_Q2P_G(B, L) \
    if (G <= 4) PT_Q2P(B, L, 4); else PT_Q2P(B, L, 8);
#define PT_Q2P_L(B)                 \
    switch (lp) {                   \
    case 4: PT_Q2P_G(B, 4) break;   \
    case 8: PT_Q2P_G(B, 8) break;   \
    case 16: PT_Q2P_G(B, 16) break; \
    default: PT_Q2P_G(B, 32) break; \
    }
    if (bits == 4) {
        PT_Q2P_L(4)
    } else {
        PT_Q2P_L(8)
    }
#undef PT_Q2P_L
#undef PT_Q2P_G
#undef PT_Q2P
    CUDA_CHECK_LAUNCH("quantized decode attention p·v");
    return pt_cuda_dec_merge(c, a.out, a.nh, hd, (int)grid.y, a.bf);
}

static pt_status launch_qdecode(pt_cuda *c, const qattn_args &a) {
    const int G = a.nh / a.c.nkv, hd = a.c.hd;
    if (G > QD_MAX_G) return PT_ERR_UNSUPPORTED;
    int64_t stride = a.c.cap;
    if (c->lim.max_ctx > 0 && c->lim.max_ctx < stride) stride = c->lim.max_ctx;
    int64_t nsplit = (2 * (int64_t)c->sm_count + a.c.nkv - 1) / a.c.nkv;
    if (nsplit > (stride + 63) / 64) nsplit = (stride + 63) / 64;
    if (nsplit < 1) nsplit = 1;
    if ((size_t)a.nh * (size_t)stride > c->dec_s_floats || (size_t)a.nh * nsplit > c->dec_ml_count ||
        (size_t)a.nh * nsplit * hd > c->dec_p_floats)
        return PT_ERR_UNSUPPORTED;
    dim3 grid((unsigned)a.c.nkv, (unsigned)nsplit);
    const pt_status st = launch_qdecode2(c, a, grid, stride);
    if (st != PT_ERR_UNSUPPORTED) return st;
    const size_t shm = ((size_t)G * hd + (size_t)G * (hd / a.c.gs)) * sizeof(float);
    switch (a.c.bits) {
#define PT_B(B)                                                                                           \
    case B: qdec_scores_kernel<B><<<grid, QD_THREADS, shm, c->stream>>>(a, stride, c->dec_s, c->dec_ml); break;
        PT_B(2) PT_B(3) PT_B(4) PT_B(5) PT_B(6) PT_B(8)
#undef PT_B
    default: return pt_error(PT_ERR_UNSUPPORTED, "attention: quantized KV with %d bits", a.c.bits);
    }
    CUDA_CHECK_LAUNCH("quantized decode attention scores");
    switch ((hd + 31) / 32) {
#define PT_NPL(N)                                                                                           \
    case N: qdec_pv_kernel<N><<<grid, QD_THREADS, 0, c->stream>>>(a, stride, c->dec_s, c->dec_ml, c->dec_p); break;
        PT_NPL(1) PT_NPL(2) PT_NPL(3) PT_NPL(4) PT_NPL(5) PT_NPL(6) PT_NPL(7) PT_NPL(8)
#undef PT_NPL
    }
    CUDA_CHECK_LAUNCH("quantized decode attention p·v");
    return pt_cuda_dec_merge(c, a.out, a.nh, hd, (int)nsplit, a.bf);
}

/* ---- prefill chunks in bf16 mode: dequantize once, flash attention ----
 * One thread per (KV head, slot, element) of K and V: slots [0, min(pos[0]
 * + T, cap)) — every row the chunk can attend to — dequantized exactly as
 * deq() does (code·scale + bias in f32) and stored as hi = bf16(x), lo =
 * bf16(x − hi), caches of the layout flash_attn.cu reads. */
__global__ void deq_hilo_kernel(qcache c, const int32_t *pos, int64_t T, __nv_bfloat16 *khi, __nv_bfloat16 *klo,
                                __nv_bfloat16 *vhi, __nv_bfloat16 *vlo) {
    int64_t nslot = (int64_t)pos[0] + T;
    if (nslot > c.cap) nslot = c.cap;
    const int64_t per_h = c.cap * c.hd, n = (int64_t)c.nkv * per_h;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = i / per_h, r = i % per_h, slot = r / c.hd;
        if (slot >= nslot) continue;
        const int e = (int)(r % c.hd);
        const int64_t row = h * c.cap + slot;
        const float k = deq(c.k, c.ks, c.kb, c, row, e), v = deq(c.v, c.vs, c.vb, c, row, e);
        const __nv_bfloat16 kh = __float2bfloat16_rn(k), vh = __float2bfloat16_rn(v);
        khi[i] = kh, vhi[i] = vh;
        klo[i] = __float2bfloat16_rn(k - __bfloat162float(kh));
        vlo[i] = __float2bfloat16_rn(v - __bfloat162float(vh));
    }
}

/* The chunk through flash attention over the dequantized rows; the scratch
 * (4 bf16 copies of the cache) comes from the stream-ordered allocator,
 * whose pool keeps it for the next chunk. PT_ERR_UNSUPPORTED (no message)
 * when flash attention has no kernel for the shape. */
static pt_status prefill_flash_q(pt_cuda *c, float *out, const float *q, int64_t T, const int32_t *pos,
                                 const pt_kv_layer *kv, const pt_attn *p) {
    const int hd = p->head_dim;
    if (c->base.act != PT_ACT_BF16 || (hd != 32 && hd != 64 && hd != 80 && hd != 96 && hd != 128 && hd != 256))
        return PT_ERR_UNSUPPORTED; /* the shapes flash_attn.cu has kernels for */
    static int pool_kept = 0;
    if (!pool_kept) { /* keep freed blocks in the pool instead of returning them at every sync */
        cudaMemPool_t pool;
        uint64_t keep = UINT64_MAX;
        CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, c->device));
        CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
        pool_kept = 1;
    }
    const size_t one = (size_t)kv->n_kv * (size_t)kv->capacity * (size_t)kv->head_dim;
    __nv_bfloat16 *buf = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&buf, 4 * one * sizeof(__nv_bfloat16), c->stream));
    const int64_t n = (int64_t)one;
    deq_hilo_kernel<<<pt_cuda_blocks(n, 256), 256, 0, c->stream>>>(qcache_of(kv), pos, T, buf, buf + one,
                                                                    buf + 2 * one, buf + 3 * one);
    cudaError_t le = cudaGetLastError();
    pt_status st = le != cudaSuccess ? pt_error(PT_ERR_DEVICE, "launch of the quantized KV dequantization kernel "
                                                               "failed: %s", cudaGetErrorString(le))
                                     : pt_cuda_flash_prefill_q(c, out, q, T, pos, buf, buf + one, buf + 2 * one,
                                                               buf + 3 * one, kv->n_kv, kv->capacity, p);
    CUDA_CHECK(cudaFreeAsync(buf, c->stream));
    return st;
}

pt_status pt_cuda_attention_q(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                              const pt_kv_layer *kv, const pt_attn *p) {
    pt_cuda *c = pt_cuda_of(be);
    PT_TRY(check_q(kv, "attention"));
    if (p->head_dim > QA_MAX_HD)
        return pt_error(PT_ERR_UNSUPPORTED, "attention: head_dim %d (CUDA kernels exist up to %d)", p->head_dim,
                        QA_MAX_HD);
    if (T <= 0) return PT_OK;
    qattn_args a = {out, q, qcache_of(kv), pos, p->n_heads, p->scale, p->softcap, p->window, pt_cuda_bf(be)};
    static int prefill_fast = -1; /* PETREL_CUDA_QFLASH=0: the one-block-per-(token, head) kernel (A/B, tests) */
    if (prefill_fast < 0) prefill_fast = pt_env_on("PETREL_CUDA_QFLASH");
    if (T == 1 && p->fused_decode) return pt_cuda_attention_fused(c, out, q, pos, kv, p); /* kv_fused.cu (L3) */
    if (T == 1) {
        pt_status st = launch_qdecode(c, a);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    if (T > 1 && prefill_fast) {
        pt_status st = prefill_flash_q(c, out, q, T, pos, kv, p);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    dim3 grid((unsigned)(T * p->n_heads)), block(QA_WARPS * 32);
    switch ((p->head_dim + 31) / 32) {
#define PT_NPL(N) \
    case N: qattn_kernel<N><<<grid, block, 0, c->stream>>>(a); break;
        PT_NPL(1) PT_NPL(2) PT_NPL(3) PT_NPL(4) PT_NPL(5) PT_NPL(6) PT_NPL(7) PT_NPL(8)
#undef PT_NPL
    }
    CUDA_CHECK_LAUNCH("quantized attention");
    return PT_OK;
}
