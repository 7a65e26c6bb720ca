/* The multi-sequence decode ops of backend.h (continuous batching):
 * kv_append_rows and attention_rows over B single-token rows, row b with its
 * own position pos[b] and its own cache, whose K/V storage pointers come
 * from a device table kvp[2b], kvp[2b + 1]. One launch (attention: one per
 * phase) covers every row, and everything that changes between steps
 * (positions, which sessions) is read from device memory, so a batched
 * decode step captured once into a CUDA graph replays for any sessions
 * (runtime/batch.c).
 *
 * Batch invariance: row b must be bit-identical to the T = 1 attention of
 * attention.cu on that row's cache. The kernels below are the split decode
 * kernels of attention.cu (scores per (KV head, split) with the G query
 * heads of a KV head sharing its K loads, p·V with the exact max/sum merged
 * across splits, ordered merge) with a third grid dimension over rows: each
 * row uses the same split count, the same thread-to-key assignment and the
 * same reduction order as the single-sequence launch. When the single-
 * sequence path would not take the split kernels (GQA group > 8, head_dim >
 * 256, unaligned rows, scratch too small) these ops answer
 * PT_ERR_UNSUPPORTED and the caller runs the T = 1 ops row by row.
 * tests/cuda/test_cuda_batch.c holds both paths to each other bit for bit,
 * so a change to one that is not made to the other fails there.
 *
 * Padding rows (pos < 0) write nothing and produce zeros.
 *
 * Not here: quantized KV (the caller keeps those caches on the per-sequence
 * path, as attention.cu does not take them yet), prefill. */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>

#include <string.h>
#include <type_traits>

#define BD_THREADS 128 /* attention.cu DEC_THREADS */
#define BD_MAX_G 8     /* attention.cu DEC_MAX_G */

/* ---- kv_append_rows ------------------------------------------------------ */

template <typename KT>
__global__ void kv_append_rows_kernel(void *const *kvp, const float *k, const float *v, int64_t B, int nkv, int hd,
                                      int64_t cap, const int32_t *pos) {
    const int64_t n = B * nkv * hd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % hd);
        const int64_t th = i / hd, b = th / nkv;
        const int h = (int)(th % nkv);
        const int32_t p = pos[b];
        if (p < 0) continue; /* padding row */
        KT *kc = (KT *)kvp[2 * b], *vc = (KT *)kvp[2 * b + 1];
        const int64_t off = ((int64_t)h * cap + p % cap) * hd + d;
        if constexpr (sizeof(KT) == 4) {
            kc[off] = k[i];
            vc[off] = v[i];
        } else if constexpr (std::is_same<KT, __half>::value) {
            kc[off] = __float2half_rn(k[i]);
            vc[off] = __float2half_rn(v[i]);
        } else {
            kc[off] = __float2bfloat16_rn(k[i]);
            vc[off] = __float2bfloat16_rn(v[i]);
        }
    }
}

pt_status pt_cuda_kv_append_rows(pt_backend *be, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                 const float *v, int64_t B, const int32_t *pos) {
    pt_cuda *c = pt_cuda_of(be);
    if (shape->bits) return pt_error(PT_ERR_UNSUPPORTED, "kv_append_rows: quantized KV caches take the per-sequence ops");
    const int64_t n = B * shape->n_kv * shape->head_dim;
    if (n == 0) return PT_OK;
    const unsigned blocks = pt_cuda_blocks(n, 256);
    const int nkv = shape->n_kv, hd = shape->head_dim;
    const int64_t cap = shape->capacity;
    switch (shape->dtype) {
    case PT_FT_F32: kv_append_rows_kernel<float><<<blocks, 256, 0, c->stream>>>(kvp, k, v, B, nkv, hd, cap, pos); break;
    case PT_FT_BF16:
        kv_append_rows_kernel<__nv_bfloat16><<<blocks, 256, 0, c->stream>>>(kvp, k, v, B, nkv, hd, cap, pos);
        break;
    case PT_FT_F16: kv_append_rows_kernel<__half><<<blocks, 256, 0, c->stream>>>(kvp, k, v, B, nkv, hd, cap, pos); break;
    }
    CUDA_CHECK_LAUNCH("kv_append_rows");
    return PT_OK;
}

/* ---- attention_rows ------------------------------------------------------ */

__device__ __forceinline__ float bd_to_f(float v) { return v; }
__device__ __forceinline__ float bd_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float bd_to_f(__half v) { return __half2float(v); }

struct rows_args {
    float *out;            /* [B, nh, hd] */
    const float *q;        /* [B, nh, hd] */
    void *const *kvp;      /* [B][2] */
    const int32_t *pos;    /* [B] */
    int nh, nkv, hd;
    int64_t cap;
    float scale, softcap;
    int window, bf;
    int64_t stride, nsplit;
    float *S;              /* [B, nh, stride] */
    float2 *ML;            /* [B, nh, nsplit] */
    float *P;              /* [B, nh, nsplit, hd] */
};

/* Row b's key range: keys lo + [0, n) split into nsplit ranges of `per`
 * (attention.cu dec_range at the row's position; pos < 0 gives n = 0). */
__device__ __forceinline__ void bd_range(const rows_args &a, int64_t b, int64_t &lo, int64_t &n, int64_t &per) {
    const int64_t hi = a.pos[b];
    lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    n = hi - lo + 1;
    if (n > a.stride) n = a.stride;
    if (n < 0) n = 0;
    per = (n + a.nsplit - 1) / a.nsplit;
}

template <typename KT>
__global__ void __launch_bounds__(BD_THREADS) bd_scores_kernel(rows_args a) {
    extern __shared__ float qs[]; /* [G, hd] */
    __shared__ float red[32];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.x, split = blockIdx.y;
    const int64_t b = blockIdx.z, nsplit = a.nsplit, stride = a.stride;
    int64_t lo, n, per;
    bd_range(a, b, lo, n, per);
    const float *q = a.q + b * a.nh * hd;
    float *S = a.S + b * a.nh * stride;
    float2 *ML = a.ML + b * a.nh * nsplit;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[(int64_t)kh * G * hd + i];
    __syncthreads();
    const KT *kb = (const KT *)a.kvp[2 * b] + (int64_t)kh * a.cap * hd;
    float m[BD_MAX_G], l[BD_MAX_G];
#pragma unroll
    for (int g = 0; g < BD_MAX_G; g++) m[g] = -INFINITY, l[g] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const KT *kr = kb + ((lo + j) % a.cap) * hd;
        float d[BD_MAX_G];
#pragma unroll
        for (int g = 0; g < BD_MAX_G; g++) d[g] = 0.f;
        constexpr int V = 16 / sizeof(KT);
        for (int e0 = 0; e0 < hd; e0 += V) {
            uint4 u = *reinterpret_cast<const uint4 *>(kr + e0);
            const KT *kv = reinterpret_cast<const KT *>(&u);
            float kf[V];
#pragma unroll
            for (int i = 0; i < V; i++) kf[i] = bd_to_f(kv[i]);
#pragma unroll
            for (int g = 0; g < BD_MAX_G; g++) {
                if (g >= G) break;
#pragma unroll
                for (int i = 0; i < V; i++) d[g] = fmaf(qs[g * hd + e0 + i], kf[i], d[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < BD_MAX_G; g++) {
            if (g >= G) break;
            float s = pt_rnd(a.bf, pt_rnd(a.bf, d[g]) * a.scale);
            if (a.softcap > 0.f) s = pt_rnd(a.bf, pt_rnd(a.bf, tanhf(pt_rnd(a.bf, s / a.softcap))) * a.softcap);
            S[((int64_t)kh * G + g) * stride + j] = s;
            if (s > m[g]) {
                l[g] = l[g] * expf(m[g] - s) + 1.f;
                m[g] = s;
            } else {
                l[g] += expf(s - m[g]);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        const float bm = pt_block_max(m[g], red);
        const float bl = pt_block_sum(m[g] == -INFINITY ? 0.f : l[g] * expf(m[g] - bm), red);
        if (threadIdx.x == 0) ML[((int64_t)kh * G + g) * nsplit + split] = make_float2(bm, bl);
    }
}

template <typename KT, int NPL>
__global__ void __launch_bounds__(BD_THREADS) bd_pv_kernel(rows_args a) {
    __shared__ float sM[BD_MAX_G], sInv[BD_MAX_G];
    __shared__ float acc_s[BD_THREADS / 32][BD_MAX_G * NPL * 32];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.x, split = blockIdx.y;
    const int64_t b = blockIdx.z, nsplit = a.nsplit, stride = a.stride;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t lo, n, per;
    bd_range(a, b, lo, n, per);
    const float *S = a.S + b * a.nh * stride;
    const float2 *ML = a.ML + b * a.nh * nsplit;
    float *P = a.P + b * a.nh * nsplit * hd;
    if (threadIdx.x < G) { /* the exact row max and sum, merged in split order */
        const float2 *ml = ML + ((int64_t)kh * G + threadIdx.x) * nsplit;
        float M = -INFINITY;
        for (int s = 0; s < nsplit; s++) M = fmaxf(M, ml[s].x);
        float L = 0.f;
        for (int s = 0; s < nsplit; s++)
            if (ml[s].x != -INFINITY) L += ml[s].y * expf(ml[s].x - M);
        sM[threadIdx.x] = M;
        sInv[threadIdx.x] = 1.0f / L;
    }
    __syncthreads();
    const KT *vb = (const KT *)a.kvp[2 * b + 1] + (int64_t)kh * a.cap * hd;
    float acc[BD_MAX_G][NPL];
#pragma unroll
    for (int g = 0; g < BD_MAX_G; g++)
#pragma unroll
        for (int i = 0; i < NPL; i++) acc[g][i] = 0.f;
    const int64_t j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
    for (int64_t j = j0 + warp; j < j1; j += BD_THREADS / 32) {
        const KT *vr = vb + ((lo + j) % a.cap) * hd;
        float vv[NPL];
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int e = lane + 32 * i;
            vv[i] = e < hd ? bd_to_f(vr[e]) : 0.f;
        }
#pragma unroll
        for (int g = 0; g < BD_MAX_G; g++) {
            if (g >= G) break;
            const float p = pt_rnd(a.bf, expf(S[((int64_t)kh * G + g) * stride + j] - sM[g]) * sInv[g]);
#pragma unroll
            for (int i = 0; i < NPL; i++) acc[g][i] = fmaf(p, vv[i], acc[g][i]);
        }
    }
#pragma unroll
    for (int g = 0; g < BD_MAX_G; g++) {
        if (g >= G) break;
#pragma unroll
        for (int i = 0; i < NPL; i++) acc_s[warp][(g * NPL + i) * 32 + lane] = acc[g][i];
    }
    __syncthreads();
    /* partial output of this split: P[head, split, hd], warps added in order */
    for (int idx = threadIdx.x; idx < G * NPL * 32; idx += blockDim.x) {
        const int g = idx / (NPL * 32), r = idx % (NPL * 32), i = r / 32, ln = r % 32, e = ln + 32 * i;
        if (e >= hd) continue;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < BD_THREADS / 32; w++) v += acc_s[w][idx];
        P[(((int64_t)kh * G + g) * nsplit + split) * hd + e] = v;
    }
}

/* out[b, h, e] = Σ over splits in order (a padding row has no keys: zeros). */
__global__ void bd_merge_kernel(rows_args a, int64_t B) {
    const int64_t per_row = (int64_t)a.nh * a.hd, n = B * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / per_row, r = i % per_row, h = r / a.hd, e = r % a.hd;
        const float *P = a.P + b * a.nh * a.nsplit * a.hd;
        float v = 0.f;
        for (int64_t s = 0; s < a.nsplit; s++) v += P[(h * a.nsplit + s) * a.hd + e];
        a.out[i] = a.pos[b] < 0 ? 0.f : pt_rnd(a.bf, v);
    }
}

template <typename KT>
static pt_status launch_rows(pt_cuda *c, rows_args &a, int64_t B) {
    const int G = a.nh / a.nkv;
    /* exactly the conditions under which attention.cu's T = 1 call takes
     * its split kernels (launch_decode_split) */
    if (G > BD_MAX_G || a.hd > 256 || (a.hd * (int)sizeof(KT)) % 16)
        return pt_error(PT_ERR_UNSUPPORTED, "attention_rows: GQA group %d / head_dim %d outside the split decode kernels",
                        G, a.hd);
    int64_t stride = a.cap;
    if (c->lim.max_ctx > 0 && c->lim.max_ctx < stride) stride = c->lim.max_ctx;
    int64_t nsplit = (2 * (int64_t)c->sm_count + a.nkv - 1) / a.nkv;
    if (nsplit > (stride + 63) / 64) nsplit = (stride + 63) / 64;
    if (nsplit < 1) nsplit = 1;
    if ((size_t)a.nh * (size_t)stride > c->dec_s_floats || (size_t)a.nh * nsplit > c->dec_ml_count ||
        (size_t)a.nh * nsplit * a.hd > c->dec_p_floats)
        return pt_error(PT_ERR_UNSUPPORTED, "attention_rows: the single-sequence decode scratch does not take a "
                                            "%lld-key cache", (long long)stride);
    if ((size_t)B * a.nh * (size_t)stride > c->bdec_s_floats || (size_t)B * a.nh * nsplit > c->bdec_ml_count ||
        (size_t)B * a.nh * nsplit * a.hd > c->bdec_p_floats)
        return pt_error(PT_ERR_UNSUPPORTED, "attention_rows: scratch not reserved for %lld rows of a %lld-key cache "
                                            "(reserve max_rows)", (long long)B, (long long)stride);
    if (B > 65535) return pt_error(PT_ERR_UNSUPPORTED, "attention_rows: %lld rows exceed the grid", (long long)B);
    a.stride = stride;
    a.nsplit = nsplit;
    a.S = c->bdec_s;
    a.ML = c->bdec_ml;
    a.P = c->bdec_p;
    dim3 grid((unsigned)a.nkv, (unsigned)nsplit, (unsigned)B);
    bd_scores_kernel<KT><<<grid, BD_THREADS, (size_t)G * a.hd * sizeof(float), c->stream>>>(a);
    CUDA_CHECK_LAUNCH("multi-sequence decode attention scores");
    switch ((a.hd + 31) / 32) {
#define PT_NPL(N) \
    case N: bd_pv_kernel<KT, N><<<grid, BD_THREADS, 0, c->stream>>>(a); break;
        PT_NPL(1) PT_NPL(2) PT_NPL(3) PT_NPL(4) PT_NPL(5) PT_NPL(6) PT_NPL(7) PT_NPL(8)
#undef PT_NPL
    }
    CUDA_CHECK_LAUNCH("multi-sequence decode attention p·v");
    bd_merge_kernel<<<pt_cuda_blocks(B * a.nh * a.hd, 256), 256, 0, c->stream>>>(a, B);
    CUDA_CHECK_LAUNCH("multi-sequence decode attention merge");
    return PT_OK;
}

pt_status pt_cuda_attention_rows(pt_backend *be, float *out, const float *q, int64_t B, const int32_t *pos,
                                 const pt_kv_layer *shape, void *const *kvp, const pt_attn *p) {
    pt_cuda *c = pt_cuda_of(be);
    if (shape->bits)
        return pt_error(PT_ERR_UNSUPPORTED, "attention_rows: quantized KV caches take the per-sequence ops");
    if (p->head_dim != shape->head_dim || shape->n_kv <= 0 || p->n_heads % shape->n_kv)
        return pt_error(PT_ERR_INVALID_ARG,
                        "attention_rows: %d heads of dim %d do not fit a cache of %d KV heads of dim %d", p->n_heads,
                        p->head_dim, shape->n_kv, shape->head_dim);
    if (B <= 0) return PT_OK;
    rows_args a;
    memset(&a, 0, sizeof a);
    a.out = out;
    a.q = q;
    a.kvp = kvp;
    a.pos = pos;
    a.nh = p->n_heads;
    a.nkv = shape->n_kv;
    a.hd = p->head_dim;
    a.cap = shape->capacity;
    a.scale = p->scale;
    a.softcap = p->softcap;
    a.window = p->window;
    a.bf = pt_cuda_bf(be);
    switch (shape->dtype) {
    case PT_FT_F32: return launch_rows<float>(c, a, B);
    case PT_FT_BF16: return launch_rows<__nv_bfloat16>(c, a, B);
    case PT_FT_F16: return launch_rows<__half>(c, a, B);
    }
    return pt_error(PT_ERR_INVALID_ARG, "attention_rows: cache dtype %d", (int)shape->dtype);
}
