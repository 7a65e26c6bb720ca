/* --fused-decode-attn on CUDA (an L3 lever, output-changing): the entry point
 * of the fused quantized-KV decode attention, its split count and its merge.
 * The block kernel (flash-decoding over the quantized cache on tensor cores,
 * dequantization factored out of both products, GQA heads sharing every
 * load) is kv_fused.cuh's, instantiated by kv_fused4.cu and kv_fused8.cu.
 *
 * Two launches per call: the block kernel over (KV head, split) blocks
 * leaves per (head, split) the running max, the sum of exp and the
 * unnormalized output; the merge kernel combines the splits in split order,
 * out = Σ o_s·e^(m_s − M) / Σ l_s·e^(m_s − M) (pt_softmax_merge), rounded in
 * bf16 mode. The split count is fixed for a cache (capacity and device, not
 * the context length), so a captured decode graph stays valid as the context
 * grows; each split's key range is computed on the device from the position.
 *
 * Not here: prefill chunks (T > 1) and full-precision caches, which keep the
 * exact kernels (kv_quant.cu, attention.cu, flash_attn.cu); widths other
 * than 4 and 8 bits (an error names them). */
#include "backend/cuda/kv_fused.cuh"

__global__ void fd_merge_kernel(float *out, const float2 *ML, const float *P, int nh, int hd, int nsplit, int bf) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nh * hd; i += gridDim.x * blockDim.x) {
        const int h = i / hd, e = i % hd;
        const float2 *ml = ML + (int64_t)h * nsplit;
        float M, L;
        pt_softmax_merge(ml, nsplit, M, L);
        float o = 0.f;
        for (int s = 0; s < nsplit; s++)
            if (ml[s].x != -INFINITY) o += P[((int64_t)h * nsplit + s) * hd + e] * expf(ml[s].x - M);
        out[i] = pt_rnd(bf, o / L);
    }
}

pt_status pt_cuda_attention_fused(pt_cuda *c, float *out, const float *q, const int32_t *pos, const pt_kv_layer *kv,
                                  const pt_attn *p) {
    const int G = p->n_heads / kv->n_kv, hd = p->head_dim, gs = kv->group_size;
    if (kv->bits != 4 && kv->bits != 8)
        return pt_error(PT_ERR_UNSUPPORTED,
                        "fused decode attention: %d-bit KV has no kernel (4 and 8 bits; use --fused-decode-attn off)",
                        kv->bits);
    /* splits: about four waves of (KV head, split) blocks over the SMs, at
     * least 64 keys each, within the decode scratch (reserve) */
    int64_t nsplit = (4 * (int64_t)c->sm_count + kv->n_kv - 1) / kv->n_kv;
    if (nsplit > (kv->capacity + 63) / 64) nsplit = (kv->capacity + 63) / 64;
    if (nsplit > (int64_t)(c->dec_ml_count / (size_t)p->n_heads))
        nsplit = (int64_t)(c->dec_ml_count / (size_t)p->n_heads);
    if (nsplit > (int64_t)(c->dec_p_floats / ((size_t)p->n_heads * hd)))
        nsplit = (int64_t)(c->dec_p_floats / ((size_t)p->n_heads * hd));
    if (nsplit < 1)
        return pt_error(PT_ERR_UNSUPPORTED, "fused decode attention: no decode scratch reserved for %d heads of dim %d",
                        p->n_heads, hd);
    pt_fd_args a;
    a.q = q;
    a.k = (const uint32_t *)kv->k, a.v = (const uint32_t *)kv->v;
    a.ks = kv->k_scales, a.kb = kv->k_biases, a.vs = kv->v_scales, a.vb = kv->v_biases;
    a.dt = kv->dtype;
    a.pos = pos;
    a.nh = p->n_heads, a.nkv = kv->n_kv;
    a.cap = kv->capacity;
    a.scale = p->scale, a.softcap = p->softcap;
    a.window = p->window, a.bf = pt_cuda_bf(&c->base);
    a.nsplit = (int)nsplit;
    a.ML = c->dec_ml, a.P = c->dec_p;
    const dim3 grid((unsigned)kv->n_kv, (unsigned)nsplit);
    const pt_status st = kv->bits == 4 ? pt_cuda_fused_block4(a, grid, c->stream, gs, hd, G)
                                       : pt_cuda_fused_block8(a, grid, c->stream, gs, hd, G);
    if (st == PT_ERR_UNSUPPORTED)
        return pt_error(PT_ERR_UNSUPPORTED,
                        "fused decode attention: no kernel for %d-bit KV with group size %d, head_dim %d, GQA ratio %d "
                        "(kernels: head_dim 32/64/96/128/256 with a group size dividing it, GQA 1..8; use "
                        "--fused-decode-attn off)",
                        kv->bits, gs, hd, G);
    CUDA_CHECK_LAUNCH("fused decode attention");
    fd_merge_kernel<<<pt_cuda_blocks((int64_t)p->n_heads * hd, 128), 128, 0, c->stream>>>(
        out, c->dec_ml, c->dec_p, p->n_heads, hd, (int)nsplit, a.bf);
    CUDA_CHECK_LAUNCH("fused decode attention merge");
    return PT_OK;
}
