/* --fused-decode-attn on CUDA (an L3 lever, output-changing): the entry point
 * of the fused quantized-KV decode attention, its split count and its merge.
 * The block kernel (flash-decoding over the quantized cache on tensor cores,
 * dequantization factored out of both products, GQA heads sharing every
 * load) is kv_fused.cuh's, instantiated by kv_fused4.cu and kv_fused8.cu.
 *
 * Two launches per call: the block kernel over (KV head, split) blocks
 * leaves per (head, split) the running max, the sum of exp and the
 * unnormalized output; the merge kernel combines the splits in a fixed
 * order, out = Σ o_s·e^(m_s − M) / Σ l_s·e^(m_s − M) (pt_softmax_merge),
 * rounded in bf16 mode. The split count is fixed for a cache (capacity and device, not
 * the context length), so a captured decode graph stays valid as the context
 * grows; each split's key range is computed on the device from the position.
 *
 * Not here: prefill chunks (T > 1) and full-precision caches, which keep the
 * exact kernels (kv_quant.cu, attention.cu, flash_attn.cu); widths other
 * than 4 and 8 bits (an error names them). */
#include "backend/cuda/kv_fused.cuh"

#include <stdlib.h>

/* One block per (query head, 32 dims of it): the splits' (max, sum) merged,
 * out[e] = Σ_s o_s[e]·w_s / L with w_s = e^(m_s − M), L = Σ_s l_s·w_s (the
 * arithmetic of pt_softmax_merge). M (a max: any order gives the same
 * value) by a block reduction; then warp w takes the splits s ≡ w (mod
 * FD_MW) in ascending order, lane e one dim, each split's weight computed
 * by every lane of the warp (its (max, sum) a broadcast load); the FD_MW
 * warps' partial outputs and sums are added in warp order. A fixed order
 * whatever the scheduling. The whole merge is a few hundred KB of reads, so
 * what costs is latency: a warp's first FD_MU splits are loaded before the
 * block's max (one round trip for both, up to FD_MW·FD_MU = 96 splits).
 * The previous form (a block per head, one thread adding the sum L over all
 * splits while the others waited) ran on 32 SMs of 132 for 7–9 µs a layer
 * at 49 splits (ncu, bench/RESULTS.md). */
#define FD_MW 8  /* warps of a merge block */
#define FD_MU 12 /* splits a warp loads at once */
__global__ void __launch_bounds__(FD_MW * 32) fd_merge_kernel(float *out, const float2 *ML, const float *P, int hd,
                                                               int nsplit, int bf) {
    pt_release_dependents();
    pt_wait_primary();
    __shared__ float red[32], po[FD_MW][32], pl[FD_MW];
    const int64_t h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, e = blockIdx.y * 32 + lane;
    const float2 *ml = ML + h * nsplit;
    const float *pe = P + h * nsplit * hd + (e < hd ? e : 0);
    /* the warp's first FD_MU splits' (max, sum) and partials loaded before the block's max is
     * known (one round trip for both), the rest (more than FD_MW·FD_MU splits) after */
    float2 m4[FD_MU];
    float v4[FD_MU];
    auto load = [&](int s0) { /* splits s0 + u·FD_MW, u < FD_MU */
#pragma unroll
        for (int u = 0; u < FD_MU; u++) {
            const int s = s0 + u * FD_MW;
            m4[u] = s < nsplit ? ml[s] : make_float2(-INFINITY, 0.f);
            v4[u] = s < nsplit ? pe[(int64_t)s * hd] : 0.f;
        }
    };
    load(warp);
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < nsplit; s += FD_MW * 32) mx = fmaxf(mx, ml[s].x);
    const float M = pt_block_max(mx, red);
    float o = 0.f, L = 0.f;
    for (int s0 = warp;;) { /* split order within the warp */
#pragma unroll
        for (int u = 0; u < FD_MU; u++)
            if (m4[u].x != -INFINITY) {
                const float w = expf(m4[u].x - M);
                L = fmaf(m4[u].y, w, L);
                o = fmaf(v4[u], w, o);
            }
        s0 += FD_MU * FD_MW;
        if (s0 >= nsplit) break;
        load(s0);
    }
    po[warp][lane] = o;
    if (lane == 0) pl[warp] = L;
    __syncthreads();
    if (warp == 0 && e < hd) {
        float O = 0.f, Ls = 0.f;
#pragma unroll
        for (int w = 0; w < FD_MW; w++) O += po[w][lane], Ls += pl[w];
        out[h * hd + e] = pt_rnd(bf, O * (1.0f / Ls));
    }
}

int pt_fd_env_t(void) {
    static int s = -1;
    if (s < 0) s = pt_env_flag("PETREL_CUDA_FD_T", 1);
    return s;
}

static int g_fd_tk = -1;
/* Tests: the block kernels' keys a tile, 16 or 32 (anything else: back to the environment's). */
extern "C" void pt_cuda_fd_tk(int v) { g_fd_tk = v == 16 || v == 32 ? v : -1; }
/* The block kernels' launches so far with 16- and 32-key tiles (tests check which ran). */
static unsigned long long g_fd_tk_launches[2];
extern "C" unsigned long long pt_cuda_fd_tk_count(int tk) {
    return tk == 16 || tk == 32 ? __atomic_load_n(&g_fd_tk_launches[tk / 32], __ATOMIC_RELAXED) : 0;
}
void pt_fd_count_tk(int tk) { __atomic_fetch_add(&g_fd_tk_launches[tk / 32], 1ull, __ATOMIC_RELAXED); }
int pt_fd_env_tk(void) {
    if (g_fd_tk < 0) {
        static const int tks[] = {16, 32};
        g_fd_tk = pt_env_pick("PETREL_CUDA_FD_TK", tks, 2, 0);
    }
    return g_fd_tk;
}

bool pt_fd_pdl(void) {
    static int s = -1;
    if (s < 0) s = pt_env_on("PETREL_CUDA_FD_PDL") && pt_pdl_chain();
    return s != 0;
}

pt_status pt_cuda_attention_fused(pt_cuda *c, float *out, const float *q, const int32_t *pos, const pt_kv_layer *kv,
                                  const pt_attn *p) {
    const int G = p->n_heads / kv->n_kv, hd = p->head_dim, gs = kv->group_size;
    if (kv->bits != 4 && kv->bits != 8)
        return pt_error(PT_ERR_UNSUPPORTED,
                        "fused decode attention: %d-bit KV has no kernel (4 and 8 bits; use --fused-decode-attn off)",
                        kv->bits);
    if (kv->capacity >= ((int64_t)1 << 30))
        return pt_error(PT_ERR_UNSUPPORTED,
                        "fused decode attention: a cache of %lld slots (the kernel indexes keys in 32 bits: fewer than "
                        "2^30; use --fused-decode-attn off)",
                        (long long)kv->capacity);
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
    a.ML = c->dec_ml, a.P = c->dec_p;
    /* splits: whole waves of (KV head, split) blocks — as many blocks as fit
     * on the SMs at once, times 1..4 as the capacity grows (>= 512 keys per
     * split per wave) — at least 64 keys each, within the decode scratch */
    int occ = 0;
    pt_status st = kv->bits == 4 ? pt_cuda_fused_block4(a, dim3(1), c->stream, gs, hd, G, &occ)
                                 : pt_cuda_fused_block8(a, dim3(1), c->stream, gs, hd, G, &occ);
    if (st == PT_ERR_UNSUPPORTED)
        return pt_error(PT_ERR_UNSUPPORTED,
                        "fused decode attention: no kernel for %d-bit KV with group size %d, head_dim %d, GQA ratio %d "
                        "(kernels: head_dim 32/64/96/128/256 with a group size dividing it, GQA 1..8; use "
                        "--fused-decode-attn off)",
                        kv->bits, gs, hd, G);
    PT_TRY(st);
    int64_t per_wave = (int64_t)(occ > 0 ? occ : 1) * c->sm_count / kv->n_kv;
    if (per_wave < 1) per_wave = 1;
    static int env_waves = -1; /* PETREL_CUDA_FD_WAVES=1..16: that many waves whatever the capacity */
    if (env_waves < 0) env_waves = pt_env_int("PETREL_CUDA_FD_WAVES", 1, 16, 0);
    int64_t waves = kv->capacity / (512 * per_wave);
    waves = waves < 1 ? 1 : waves > 4 ? 4 : waves;
    if (env_waves) waves = env_waves;
    int64_t nsplit = per_wave * waves;
    if (nsplit > (kv->capacity + 63) / 64) nsplit = (kv->capacity + 63) / 64;
    if (nsplit > (int64_t)(c->dec_ml_count / (size_t)p->n_heads))
        nsplit = (int64_t)(c->dec_ml_count / (size_t)p->n_heads);
    if (nsplit > (int64_t)(c->dec_p_floats / ((size_t)p->n_heads * hd)))
        nsplit = (int64_t)(c->dec_p_floats / ((size_t)p->n_heads * hd));
    if (nsplit < 1)
        return pt_error(PT_ERR_UNSUPPORTED, "fused decode attention: no decode scratch reserved for %d heads of dim %d",
                        p->n_heads, hd);
    a.nsplit = (int)nsplit;
    const dim3 grid((unsigned)kv->n_kv, (unsigned)nsplit);
    st = kv->bits == 4 ? pt_cuda_fused_block4(a, grid, c->stream, gs, hd, G, NULL)
                       : pt_cuda_fused_block8(a, grid, c->stream, gs, hd, G, NULL);
    PT_TRY(st);
    CUDA_CHECK_LAUNCH("fused decode attention");
    pt_launch(fd_merge_kernel, dim3((unsigned)p->n_heads, (unsigned)((hd + 31) / 32)), dim3(FD_MW * 32), 0, c->stream,
              pt_fd_pdl(), out, (const float2 *)c->dec_ml, (const float *)c->dec_p, hd, (int)nsplit, a.bf);
    CUDA_CHECK_LAUNCH("fused decode attention merge");
    return PT_OK;
}
