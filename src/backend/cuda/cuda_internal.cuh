/* CUDA backend internals shared by its .cu files: the backend state, the
 * device copy of a weight, and the op entry points each op-family file
 * implements (C++ linkage: only backend.cu's table and the functions in
 * cuda.h face the C side). Not a kernel library; kernels stay in their
 * family's .cu.
 *
 * Activations follow backend.h: f32 buffers [T, D] in device memory whose
 * values are rounded to bf16 after every op when be->act == PT_ACT_BF16. */
#ifndef PT_BACKEND_CUDA_INTERNAL_CUH
#define PT_BACKEND_CUDA_INTERNAL_CUH

#include "backend/cuda/common.cuh"

#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <utility>

extern "C" {
#include "backend/backend.h"
#include "base/env.h"
#include "backend/cuda/cuda.h"
}

#define CUBLAS_CHECK(call)                                                                   \
    do {                                                                                     \
        cublasStatus_t pt_blas_s_ = (call);                                                  \
        if (pt_blas_s_ != CUBLAS_STATUS_SUCCESS)                                             \
            return pt_error(PT_ERR_DEVICE, "%s failed: %s (code %d) [%s:%d]", #call,          \
                            cublasGetStatusName(pt_blas_s_), (int)pt_blas_s_, __FILE__, __LINE__); \
    } while (0)

/* The device copy of a pt_matrix (pt_matrix.backend_data). One cudaMalloc
 * holds data, scales, biases and bias back to back (each 256-byte aligned). */
typedef struct pt_cuda_weight {
    void *mem;            /* the allocation */
    const void *data;     /* dense [E, rows, cols] of dtype, or uint32 codes [E, rows, cols·bits/32] */
    const void *scales;   /* [E, rows, cols/gs] of dtype (quantized); tc: the sb words (matmul.cuh) */
    const void *biases;   /* tc: NULL */
    const void *bias;     /* [E, rows] of bias_dtype, or NULL */
    size_t bytes;
    int tc;               /* codes and scales in the tensor-core layout (matmul.cuh, gemv_tc.cu) */
    int role;             /* pt_matrix.role at prepare (the GEMV's split: gemv_tc.cu tc_split) */
} pt_cuda_weight;

/* A GEMV's prepared x handed on by the launch that wrote its source
 * (gemv_tc.cu XO): that source y (NULL: none), its rows, K and column
 * layout. */
typedef struct pt_cuda_xo {
    const float *y;
    int nb, K, ncol;
} pt_cuda_xo;

typedef struct pt_cuda {
    pt_backend base;
    int device;
    int sm_count;
    int sm_smem;          /* shared memory an SM holds, bytes (the wgmma launches' blocks an SM: gemv_tc.cu) */
    int blk_rsv;          /* shared memory the system reserves per block, bytes */
    cudaStream_t stream;
    cublasHandle_t blas;
    pt_backend_limits lim;
    int no_fast_gemv;     /* PETREL_CUDA_FAST_GEMV=0: the generic GEMV only (A/B and tests) */
    /* The one-launch short decode attention (attention_short.cu), read at
     * creation (A/B and tests; the same bits either way):
     * PETREL_CUDA_DEC_SHORT_HEADS=0 gives a block every KV head (all its
     * query heads), else a block every query head; PETREL_CUDA_DEC_SHORT_STAGE
     * = 0 / 1 / 2 (default) stages no rows, the value rows, the key and value
     * rows in shared memory by cp.async (where they fit). Batched rows
     * (attention_rows under a key bound): PETREL_CUDA_DEC_SHORT_ROWS=0 runs
     * the three kernels instead; PETREL_CUDA_DEC_SHORT_ROWS_STAGE = 0
     * (default) / 1 / 2 as above for their blocks, 3 the value rows in room
     * for the launch's key bound;
     * PETREL_CUDA_DEC_SHORT_ROWS_HEADS = 1 / 0 a block every (row, query
     * head) / (row, KV head), unset (-1) the first while they fit in one
     * wave. */
    int dec_short_heads, dec_short_stage, dec_short_rows, dec_short_rows_stage, dec_short_rows_heads;
    /* Query heads per block of the split decode kernels of one sequence
     * (attention_dec2.cu): -1 (default) as the grid needs them (dec2_hpb),
     * 0 all of a KV head's, N > 0 N of them where N divides the group
     * (PETREL_CUDA_DEC_HEADS, read at creation; A/B and tests, the same
     * bits either way) */
    int dec_heads;
    /* Matmul scratch (reserve): a weight tile dequantized/converted for
     * cuBLAS, and the input converted to the tile's type. */
    void *tile;           /* [tile_elems] bf16 or f32 */
    size_t tile_bytes;
    void *xconv;          /* [max_tokens, max_cols] bf16 or f32 */
    size_t xconv_bytes;
    /* MoE scratch: per (token, k) expert intermediate and output rows. */
    float *moe_h;         /* [max_tokens·max_top_k, max_ffn]   f32 */
    float *moe_g;         /* [max_tokens·max_top_k, 2·max_ffn] f32 */
    float *moe_o;         /* [max_tokens·max_top_k, max_cols]  f32 */
    size_t moe_rows, moe_ffn, moe_cols;
    int32_t *moe_idx;     /* grouped MoE prefill (moe.cu): perm, inv [rows], counts, offsets [E] */
    size_t moe_idx_n;     /* int32 entries allocated */
    /* Split decode attention scratch (attention.cu). */
    float *dec_s;         /* [max_heads, max_ctx] scores                     */
    float2 *dec_ml;       /* [max_heads, splits] partial (max, sum of exp)   */
    float *dec_p;         /* [max_heads, splits, max_head_dim] partial p·v   */
    size_t dec_s_floats, dec_ml_count, dec_p_floats;
    /* Multi-sequence decode attention scratch (batch_decode.cu): the same
     * three arrays for max_rows rows. */
    float *bdec_s;        /* [max_rows, max_heads, max_ctx]                  */
    float2 *bdec_ml;      /* [max_rows, max_heads, splits]                   */
    float *bdec_p;        /* [max_rows, max_heads, splits, max_head_dim]     */
    size_t bdec_s_floats, bdec_ml_count, bdec_p_floats;
    /* Bumped whenever reserve changes a scratch buffer or a limit
     * (pt_cuda_scratch_gen): graphs captured before must be captured again. */
    uint64_t scratch_gen;
    /* Errors found by kernels: a device word set by the kernel (1: an
     * embedding id out of range, 2: an expert index out of range) and the
     * offending value, checked at the next synchronization. */
    int *err_dev;         /* [2]: flag, offending value */
    /* Small uploads go through pinned staging, ordered on the stream
     * without waiting for it (backend.cu, cuda_upload). */
    struct pt_cuda_stage *stage;
    /* backend.h prefetch_hint: the weights the next one-row matmul_add's
     * blocks fetch into the L2 (gemv_tc.cu pt_cuda_prefetch_hint) */
    const pt_matrix *pf_w[4];
    int pf_n;
    /* backend.h handoff_hint: the next GLU launch or batched rows'
     * attention may write the matmul after it its prepared x (gemv_tc.cu
     * XO); the hand-off made */
    int xo_armed;
    pt_cuda_xo xo;
} pt_cuda;

static inline pt_cuda *pt_cuda_of(pt_backend *be) { return (pt_cuda *)be; }
static inline const pt_cuda_weight *pt_cuda_w(const pt_matrix *w) { return (const pt_cuda_weight *)w->backend_data; }
static inline int pt_cuda_bf(const pt_backend *be) { return be->act == PT_ACT_BF16; }

/* Blocks for a grid-stride elementwise kernel over n items. */
static inline unsigned pt_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Reads element i of a float array of type t. */
__device__ __forceinline__ float pt_ld(pt_ftype t, const void *p, int64_t i) {
    if (t == PT_FT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (t == PT_FT_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
/* Elements i … i+3 of a float array of type t as pt_ld reads each (i a
 * multiple of 4, the array 16-byte aligned). */
__device__ __forceinline__ float4 pt_ld4(pt_ftype t, const void *p, int64_t i) {
    if (t == PT_FT_F32) return *(const float4 *)((const float *)p + i);
    const uint2 u = *(const uint2 *)((const uint16_t *)p + i);
    if (t == PT_FT_BF16)
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u), __uint_as_float(u.y << 16),
                           __uint_as_float(u.y & 0xFFFF0000u));
    const __half2 a = *reinterpret_cast<const __half2 *>(&u.x), b = *reinterpret_cast<const __half2 *>(&u.y);
    return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
}
__device__ __forceinline__ float pt_rnd(int bf, float v) { return bf ? pt_round_bf(v) : v; }

/* A cache slot's key and value (f32) stored as KT: float, __half or
 * __nv_bfloat16 (rounded to nearest even). */
template <typename KT>
__device__ __forceinline__ void pt_kv_put(KT *kc, KT *vc, int64_t off, float k, float v) {
    if constexpr (sizeof(KT) == 4) {
        kc[off] = k;
        vc[off] = v;
    } else if constexpr (std::is_same<KT, __half>::value) {
        kc[off] = __float2half_rn(k);
        vc[off] = __float2half_rn(v);
    } else {
        kc[off] = __float2bfloat16_rn(k);
        vc[off] = __float2bfloat16_rn(v);
    }
}

/* A block's output row o[0, hd) from each warp's accumulators acc[i] (dims
 * lane + 32·i): staged in sm_acc, then the W warps' values added in warp
 * order and rounded in bf16 mode (bf). Synchronizes the block. */
template <int W, int MAXHD, int NPL>
__device__ __forceinline__ void pt_warps_out(const float (&acc)[NPL], float (&sm_acc)[W][MAXHD], float *o, int hd,
                                             int bf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        if (e < hd) sm_acc[warp][e] = acc[i];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < W; w++) v += sm_acc[w][e];
        o[e] = pt_rnd(bf, v);
    }
}

/* Programmatic dependent launch, the primary's half: lets the next kernel in
 * the stream, when it is launched with programmatic stream serialization
 * (the decode GEMVs, gemv_tc.cu), be scheduled now instead of at this
 * kernel's exit. Safe whatever this kernel still writes: such a dependent
 * touches nothing but its constant weights before griddepcontrol.wait, which
 * returns only once this grid has completed and its writes are visible. So
 * the GEMV's first weight loads overlap the tail of the kernel before it
 * (the norm before q/k/v and gate/up, the GLU before down, the attention
 * merge before o). A no-op when the next kernel is launched normally. Called
 * first thing by every thread. */
__device__ __forceinline__ void pt_release_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;\n" :::);
}
/* The dependent's half: returns once the previous kernel in the stream has
 * completed and its writes are visible (at once when this kernel was
 * launched normally). A kernel launched by pt_launch calls it before its
 * first read or write of global memory — except reads of what no kernel of
 * the step writes (the host's uploads before it, model constants):
 * dec2_short_kernel forms its row's key range from the positions before
 * the wait. */
__device__ __forceinline__ void pt_wait_primary(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/* The backend's A/B switches: a PETREL_CUDA_* variable is on unless it is
 * 0 (or off, false, no); another value is named in a warning and leaves the
 * switch on (pt_env_flag). Callers read it once and cache the answer. */
static inline int pt_env_on(const char *name) { return pt_env_flag(name, 1); }

/* An on/off switch of a launch form: its environment variable (default
 * def, pt_env_flag) read once, set() with a negative value going back to
 * it; the launches made with the form counted where the form counts them
 * (tests check it ran). Initialized as {"PETREL_CUDA_...", def, -1, 0}. */
struct pt_switch {
    const char *env;
    int def, v;
    unsigned long long launches;
    void set(int on) { v = on < 0 ? -1 : on != 0; }
    bool on() {
        if (v < 0) v = pt_env_flag(env, def);
        return v != 0;
    }
    void counted() { __atomic_fetch_add(&launches, 1ull, __ATOMIC_RELAXED); }
    unsigned long long count() const { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }
};

/* PETREL_CUDA_PDL_CHAIN=0: pt_launch launches normally (A/B). */
static inline bool pt_pdl_chain(void) {
    static int on = -1;
    if (on < 0) on = pt_env_on("PETREL_CUDA_PDL_CHAIN");
    return on != 0;
}

/* k<<<grid, block, smem, st>>>(args...), launched with programmatic stream
 * serialization when pdl: the kernel may be scheduled while the previous one
 * still runs (from that kernel's pt_release_dependents on) and must begin
 * with pt_release_dependents(); pt_wait_primary(); — the decode step's small
 * kernels (norms, RoPE + KV append, decode attention, GLU, elementwise), so
 * their launch latency hides under the kernel before them. Errors surface
 * through cudaGetLastError (CUDA_CHECK_LAUNCH) like a <<<>>> launch's. */
template <typename... P, typename... A>
static inline void pt_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                             A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}

/* Op entry points (one family per file). */
/* matmul.cu */
pt_status pt_cuda_matmul(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert);
/* Batched quantized/dense GEMV over B items: y[b] = W[e_b] · x[b / x_div] (+bias),
 * e_b = experts[b] (device int32) or `expert` when experts == NULL. Rows of
 * x are K apart, rows of y N apart. Used by moe_ffn. */
pt_status pt_cuda_gemv_items(pt_cuda *c, float *y, const float *x, int64_t B, int x_div, const pt_matrix *w,
                             const int32_t *experts, int64_t expert, int64_t row0, int64_t nrows,
                             int64_t y_stride);
/* Batch-invariant matmul (backend.h matmul_rows): row t through the T = 1 GEMV. */
pt_status pt_cuda_matmul_rows(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w,
                              int64_t expert);
/* backend.h matmul_multi: up to 4 weights over one x, one tensor-core GEMV
 * launch when they allow it (gemv_tc.cu), else the separate calls. */
pt_status pt_cuda_matmul_multi(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                               const pt_matrix *const *w, int rows);
/* batch_decode.cu: the multi-sequence decode ops (continuous batching) */
pt_status pt_cuda_kv_append_rows(pt_backend *be, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                 const float *v, int64_t B, const int32_t *pos);
pt_status pt_cuda_attention_rows(pt_backend *be, float *out, const float *q, int64_t B, const int32_t *pos,
                                 const pt_kv_layer *shape, void *const *kvp, const pt_attn *p);
/* norm.cu */
pt_status pt_cuda_rms_norm(pt_backend *be, float *y, const float *x, float *residual, int64_t T, int64_t D,
                           const void *w, pt_ftype wtype, pt_rms_style style, float eps);
pt_status pt_cuda_rms_norm2(pt_backend *be, float *x1, int64_t T1, const void *w1, float *x2, int64_t T2,
                            const void *w2, int64_t D, pt_ftype wtype, pt_rms_style style, float eps);
/* rope.cu */
pt_status pt_cuda_rope(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                       const pt_rope *rope);
pt_status pt_cuda_rope_qk(pt_backend *be, float *q, float *k, int64_t T, int n_heads, int n_kv, int head_dim,
                          const int32_t *pos, const pt_rope *rope);
pt_status pt_cuda_rope_qk_kv_append(pt_backend *be, float *q, float *k, const float *v, int64_t T, int n_heads,
                                    int n_kv, int head_dim, const int32_t *pos, const pt_rope *rope,
                                    pt_kv_layer *kv);
/* attention.cu */
pt_status pt_cuda_kv_append(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                            const int32_t *pos);
pt_status pt_cuda_kv_quantize(pt_backend *be, pt_kv_layer *dst, const pt_kv_layer *src, int64_t p0, int64_t p1);
pt_status pt_cuda_attention(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                            const pt_kv_layer *kv, const pt_attn *p);
/* Adds the split decode partials (scratch dec_p [nh, nsplit, hd]) in split
 * order into out[nh·hd] (rounded in bf16 mode). */
pt_status pt_cuda_dec_merge(pt_cuda *c, float *out, int nh, int hd, int nsplit, int bf);
/* flash_attn.cu: prefill (T > 1) flash attention over full-precision
 * caches (tensor cores for bf16 over bf16, FMAs otherwise);
 * PT_ERR_UNSUPPORTED (no message) for head dims it has no kernel for, which
 * attention.cu's kernel then takes. PETREL_CUDA_FLASH=0 turns it off (A/B). */
pt_status pt_cuda_flash_prefill(pt_cuda *c, float *out, const float *q, int64_t T, const int32_t *pos,
                                const pt_kv_layer *kv, const pt_attn *p);
/* kv_quant.cu: quantized KV caches (L2) */
pt_status pt_cuda_kv_append_q(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                              const int32_t *pos);
pt_status pt_cuda_attention_q(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                              const pt_kv_layer *kv, const pt_attn *p);
/* elementwise.cu */
pt_status pt_cuda_embed(pt_backend *be, float *y, const int32_t *ids, int T, const pt_matrix *table, float scale);
pt_status pt_cuda_glu(pt_backend *be, float *y, const float *gate, const float *up, int64_t T, int64_t F,
                      int64_t ld, pt_glu_kind act);
pt_status pt_cuda_add(pt_backend *be, float *y, const float *a, const float *b, int64_t n);
pt_status pt_cuda_mul(pt_backend *be, float *y, const float *a, const float *b, int64_t n);
pt_status pt_cuda_add_scaled(pt_backend *be, float *y, const float *a, const float *b, float s, int64_t n);
pt_status pt_cuda_scale(pt_backend *be, float *y, const float *x, float s, int64_t n);
pt_status pt_cuda_softcap(pt_backend *be, float *y, const float *x, float cap, int64_t n);
pt_status pt_cuda_argmax(pt_backend *be, int32_t *out, const float *x, int64_t T, int64_t V);
/* moe.cu */
pt_status pt_cuda_moe_route(pt_backend *be, int32_t *idx, float *weights, const float *logits, int64_t T,
                            const pt_moe_route *p);
pt_status pt_cuda_moe_ffn(pt_backend *be, float *y, const float *x, int64_t T, const int32_t *idx,
                          const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                          const pt_matrix *down, pt_glu_kind act);
/* deltanet.cu: the Gated DeltaNet ops (Qwen3.5) */
pt_status pt_cuda_conv1d_silu(pt_backend *be, float *y, const float *x, int64_t T, int64_t C, int K, const void *w,
                              pt_ftype wtype, float *state);
pt_status pt_cuda_delta_rule(pt_backend *be, float *out, const float *qkv, const float *b, const float *a, int64_t T,
                             float *state, const pt_delta *p);
pt_status pt_cuda_rms_norm_gated(pt_backend *be, float *y, const float *x, const float *z, int64_t R, int64_t D,
                                 const void *w, pt_ftype wtype, float eps);
pt_status pt_cuda_copy_rows(pt_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                            int64_t n);
pt_status pt_cuda_copy_rows_to(pt_backend *be, float *const *dst, const float *const *src, int n, int64_t len);
pt_status pt_cuda_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g, int64_t n);
/* Checks the kernel error word (synchronizes the stream). */
pt_status pt_cuda_check_errors(pt_cuda *c);

#endif
