/* The multi-sequence decode ops of backend.h (continuous batching):
 * kv_append_rows and attention_rows over B single-token rows (and
 * rope_k_append_rows, the keys' RoPE plus kv_append_rows in one launch, for
 * rope_kv_attention's batched form, attention.cu), row b with its
 * own position pos[b] and its own cache, whose K/V storage pointers come
 * from a device table kvp[2b], kvp[2b + 1]. One launch (attention: one per
 * phase) covers every row, and everything that changes between steps
 * (positions, which sessions) is read from device memory, so a batched
 * decode step captured once into a CUDA graph replays for any sessions
 * (runtime/batch.c).
 *
 * Batch invariance: row b must be bit-identical to the T = 1 attention of
 * attention.cu on that row's cache. attention_rows does not have kernels of
 * its own: it launches attention.cu's split decode kernels
 * (pt_cuda_decode_split, decode_split.cuh) with B rows, each row using the
 * same split count, the same thread-to-key assignment and the same
 * reduction order as the single-sequence launch (which splits a row uses
 * depends on that row's key count only; a block may take several of a
 * row's splits, which changes when they run, not what they compute). When the single-sequence
 * path would not take the split kernels (GQA group > 8, head_dim > 256,
 * scratch too small) these ops answer PT_ERR_UNSUPPORTED and the caller runs
 * the T = 1 ops row by row. tests/cuda/test_cuda_batch.c holds both paths to
 * each other bit for bit.
 *
 * Padding rows (pos < 0) write nothing and produce zeros.
 *
 * Not here: quantized KV (the caller keeps those caches on the per-sequence
 * path, as attention.cu does not take them yet), prefill. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/decode_split.cuh"
#include "backend/cuda/rope_math.cuh"

#include <cuda_fp16.h>

#include <string.h>
#include <type_traits>

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
        pt_kv_put(kc, vc, off, k[i], v[i]);
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

/* ---- rope_k_append_rows (decode_split.cuh) ------------------------------
 * kv_append_rows_kernel's items with each key element rotated first as
 * rope.cu's rope_kernel rotates it (element d < half: the pair's first
 * value, half <= d < 2·half: its second, past 2·half: unrotated; the same
 * table values and rounded products), so the cache gets the bytes rope_qk
 * followed by kv_append_rows would write. */
template <typename KT>
__global__ void rope_k_append_rows_kernel(void *const *kvp, const float *k, const float *v, int64_t B, int nkv, int hd,
                                          int64_t cap, const int32_t *pos, int half, const float *inv_freq,
                                          float attn_scale, int bf) {
    pt_release_dependents(); /* launched by pt_launch */
    pt_wait_primary();
    const int64_t n = B * nkv * hd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % hd);
        const int64_t th_ = i / hd, b = th_ / nkv;
        const int h = (int)(th_ % nkv);
        const int32_t p = pos[b];
        if (p < 0) continue; /* padding row */
        const float *kr = k + th_ * hd;
        float kv = kr[d];
        if (d < 2 * half) {
            const int e = d < half ? d : d - half;
            const float th = (float)p * inv_freq[e];
            const float cs = pt_rope_cos(th, attn_scale, bf), sn = pt_rope_sin(th, attn_scale, bf);
            const float a = kr[e], bb = kr[e + half];
            kv = d < half ? pt_rope_lo(a, bb, cs, sn, bf) : pt_rope_hi(a, bb, cs, sn, bf);
        }
        KT *kc = (KT *)kvp[2 * b], *vc = (KT *)kvp[2 * b + 1];
        const int64_t off = ((int64_t)h * cap + p % cap) * hd + d;
        pt_kv_put(kc, vc, off, kv, v[i]);
    }
}

pt_status pt_cuda_rope_k_append_rows(pt_cuda *c, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                     const float *v, int64_t B, const int32_t *pos, const pt_rope *rope, int bf) {
    const int64_t n = B * shape->n_kv * shape->head_dim;
    if (n == 0) return PT_OK;
    const unsigned blocks = pt_cuda_blocks(n, 256);
    const int nkv = shape->n_kv, hd = shape->head_dim, half = rope->rot_dim / 2;
    const int64_t cap = shape->capacity;
    const float *inv = (const float *)rope->inv_freq;
    switch (shape->dtype) {
    case PT_FT_F32:
        pt_launch(rope_k_append_rows_kernel<float>, dim3(blocks), dim3(256), 0, c->stream, pt_pdl_chain(), kvp, k, v,
                  B, nkv, hd, cap, pos, half, inv, rope->attn_scale, bf);
        break;
    case PT_FT_BF16:
        pt_launch(rope_k_append_rows_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), 0, c->stream, pt_pdl_chain(),
                  kvp, k, v, B, nkv, hd, cap, pos, half, inv, rope->attn_scale, bf);
        break;
    case PT_FT_F16:
        pt_launch(rope_k_append_rows_kernel<__half>, dim3(blocks), dim3(256), 0, c->stream, pt_pdl_chain(), kvp, k,
                  v, B, nkv, hd, cap, pos, half, inv, rope->attn_scale, bf);
        break;
    }
    CUDA_CHECK_LAUNCH("rope_k_append_rows");
    return PT_OK;
}

/* ---- attention_rows: attention.cu's split decode kernels over B rows ---- */

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
    pt_dec_rows a;
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
    return pt_cuda_decode_split(c, a, B, shape->dtype, 1);
}
