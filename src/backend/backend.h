/* The backend op table: every operation a model family's forward pass needs,
 * behind one interface that the CPU backend (src/backend/cpu/) and the CUDA
 * backend (src/backend/cuda/) both implement. The model code calls ops, never
 * kernels; nothing in a family file knows which backend runs it.
 *
 * What this is not: it holds no model state (weights are described here but
 * owned by the loader; KV caches are described here but owned by the session)
 * and no sampling logic beyond argmax (the sampler runs on the host over
 * downloaded logits).
 *
 * ---- Memory --------------------------------------------------------------
 * Every pointer passed to an op is *backend memory*: obtained from
 * be->ops->alloc (or, for weights, made resident by prepare_weight). On the
 * CPU that is plain host memory; on CUDA it is device memory. Host data moves
 * in and out only through upload/download. The CPU backend executes each op
 * synchronously in place with its thread pool; CUDA enqueues on its stream and
 * download() synchronizes.
 *
 * ---- Activations and numerics (DESIGN.md "Numerics and parity tiers") ----
 * Activation buffers are always f32 arrays, row-major [T, dim] (T tokens).
 * The backend has an activation dtype (be->act): with PT_ACT_BF16 every op
 * rounds its outputs to the nearest bf16 value (kept in the f32 buffer), which
 * reproduces the rounding points of a bf16 model in the reference; inside an
 * op everything accumulates in f32. With PT_ACT_F32 nothing is rounded.
 * Where the reference rounds inside an op (RMSNorm casts the normalized row
 * before multiplying by the weight; RoPE's cos/sin tables are in the model
 * dtype; attention rounds scores and probabilities), the op does the same in
 * bf16 mode; each op's comment says where.
 *
 * ---- Positions -----------------------------------------------------------
 * Positions live in backend memory (int32 [T]) so a captured CUDA graph can be
 * replayed with new values. kv_append and attention require consecutive
 * positions: pos[t] == pos[0] + t.
 *
 * ---- Determinism ---------------------------------------------------------
 * Every output element is computed in a fixed order that does not depend on
 * the thread count: results are bit-identical for any number of threads.
 *
 * ---- Errors --------------------------------------------------------------
 * Ops return PT_OK or an error with a message (pt_last_error()): an
 * unsupported combination (e.g. a quantized KV cache where not implemented
 * yet), or scratch not reserved large enough. Shapes that violate the
 * documented contract are internal errors (PT_ASSERT). */
#ifndef PT_BACKEND_BACKEND_H
#define PT_BACKEND_BACKEND_H

#include "petrel.h"

#include <stddef.h>
#include <stdint.h>

/* Element type of a floating-point array in a weight or a cache. */
typedef enum pt_ftype { PT_FT_F32 = 0, PT_FT_BF16 = 1, PT_FT_F16 = 2 } pt_ftype;

/* Activation dtype: how op outputs are rounded (see the header comment). */
typedef enum pt_act_dtype { PT_ACT_F32 = 0, PT_ACT_BF16 = 1 } pt_act_dtype;

const char *pt_ftype_name(pt_ftype t);
size_t pt_ftype_size(pt_ftype t);

/* ---- Weights ------------------------------------------------------------
 * A matrix W[rows, cols] as a Linear stores it ([out_features, in_features];
 * y = x·Wᵀ), an embedding table [vocab, hidden], or a stack of n_experts such
 * matrices [n_experts, rows, cols] (MoE experts).
 *
 * Dense (bits == 0): data is [n_experts?, rows, cols] of dtype.
 * MLX affine quantized (bits in {2,3,4,5,6,8}, group_size in {32,64,128},
 * cols % group_size == 0): data is uint32 [.., rows, cols·bits/32], each
 * row's values packed LSB-first across its words; scales and biases are
 * [.., rows, cols/group_size] of dtype (bf16/f16/f32); the weight value is
 * w = scale·q + bias with q the unsigned code.
 *
 * bias (optional, may be NULL) is the Linear's additive bias [.., rows] of
 * bias_dtype. backend_data is private to the backend that prepared the weight
 * (a repacked layout, a device copy); zero-initialize it.
 *
 * Lifetime: fill the public fields with host pointers (e.g. into an mmap),
 * call prepare_weight() once; after that the weight may be used in ops until
 * release_weight(). For the CPU backend the host pointers must stay valid.
 *
 * role (PT_ROLE_*, 0 by default) says what the model uses the weight for,
 * set before prepare_weight: a backend may lay out its work by it, fixed
 * per weight so that every call with that weight adds in the same order
 * (the CUDA GEMV splits the attention input projections, which run
 * grouped, over fewer warps per row tile than an output projection of the
 * same shape: gemv_tc.cu tc_split). */
enum {
    PT_ROLE_NONE = 0,
    PT_ROLE_ATTN_IN = 1, /* an attention layer's q, k or v projection */
};
typedef struct pt_matrix {
    int64_t rows;         /* N: output features (vocab for an embedding) */
    int64_t cols;         /* K: input features (hidden for an embedding) */
    int64_t n_experts;    /* 0 or 1: a plain matrix; E: a stack [E, rows, cols] */
    pt_ftype dtype;       /* dense: element type of data; quantized: of scales/biases */
    int bits;             /* 0 = dense; else MLX affine bits */
    int group_size;       /* quantized only */
    const void *data;     /* see above */
    const void *scales;   /* quantized only */
    const void *biases;   /* quantized only */
    const void *bias;     /* optional Linear bias [.., rows] */
    pt_ftype bias_dtype;
    int role;             /* PT_ROLE_*: what the weight is for (above) */
    void *backend_data;   /* backend-private */
} pt_matrix;

/* ---- KV cache (one layer) -----------------------------------------------
 * Keys and values of one attention layer, head-major: k/v [n_kv, capacity,
 * head_dim] (decode reads each KV head's rows contiguously, once for all the
 * query heads that share it). The row for absolute position p lives in slot
 * p % capacity, so one layout serves both kinds of cache:
 *   - a full cache: capacity >= the context length (slot == position);
 *   - a rotating (sliding-window) cache: capacity >= window + the largest
 *     chunk of tokens appended at once - 1, so that every query of a chunk
 *     still finds its whole window.
 * dtype: f32 or bf16 storage (full precision).
 *
 * Quantized KV (bits 2..8 as MLX allows, 4 or 8 from the flags; DESIGN.md
 * "Quantized KV, exactly"): k/v hold uint32 codes [n_kv, capacity,
 * head_dim·bits/32] and k_scales/k_biases/v_scales/v_biases [n_kv, capacity,
 * head_dim/group_size] of dtype (the activation dtype), each row quantized
 * over head_dim in groups with MLX's affine rule (src/format/mlx_quant.h).
 * Attention over it computes mlx-lm's quantized attention: q is multiplied by
 * the scale first (rounded in bf16 mode), scores = q·dequant(K) in f32
 * (rounded), softmax in f32 (rounded), output = p·dequant(V). */
typedef struct pt_kv_layer {
    int n_kv;
    int head_dim;
    int64_t capacity;   /* rows per head */
    pt_ftype dtype;     /* full precision: element type of k/v; quantized: of scales/biases */
    int bits;           /* 0 = full precision; 4/8 = MLX affine codes */
    int group_size;     /* quantized only */
    void *k, *v;
    void *k_scales, *k_biases, *v_scales, *v_biases; /* quantized only */
} pt_kv_layer;

/* ---- Op parameters ------------------------------------------------------ */

typedef enum pt_rms_style {
    PT_RMS_W = 0,       /* Llama/Qwen: y = w · round(x̂)  (x̂ cast to the activation dtype first) */
    PT_RMS_W_F32 = 1,   /* Gemma 3n/4: y = round(x̂ · w) in f32 */
    PT_RMS_1PW = 2,     /* Gemma 1/2/3, Qwen3.5 (HF): y = round(x̂ · (1 + w)) in f32 */
    PT_RMS_NOSCALE = 3  /* y = round(x̂); w unused (may be NULL) */
} pt_rms_style;

/* An RMSNorm folded into the matmuls that read its output (matmul_norm,
 * matmul_glu_norm): the rms_norm arguments but the rows and the input. */
typedef struct pt_norm_in {
    const void *w; /* [K] of wtype (NULL with PT_RMS_NOSCALE) */
    pt_ftype wtype;
    pt_rms_style style;
    float eps;
    /* [T, K] or NULL: rms_norm's fused residual add first (x = round(x +
     * add), written back to x, as rms_norm(.., add, x, ..) does) */
    const float *add;
    /* 1: the backend may decline (PT_ERR_UNSUPPORTED, nothing enqueued)
     * where it measured the fold slower than the separate calls for the
     * shape; the caller then makes them (the same bits either way) */
    int optional;
} pt_norm_in;

typedef enum pt_glu_kind {
    PT_GLU_SILU = 0,     /* SwiGLU: silu(gate) · up */
    PT_GLU_GELU_TANH = 1 /* GeGLU: gelu_tanh(gate) · up */
} pt_glu_kind;

/* Rotate-half (NeoX) RoPE over the first rot_dim dims of each head:
 * element i pairs with i + rot_dim/2 (i < rot_dim/2); dims >= rot_dim pass
 * through. θ_i = pos · inv_freq[i]; cos/sin are multiplied by attn_scale
 * (yarn/longrope attention factor; 1 otherwise) and, in bf16 mode, rounded to
 * bf16 like the reference's tables. Every scaling kind (linear, llama3, yarn,
 * longrope, proportional = zeros in inv_freq) is encoded in the table, which
 * the model spec computes once. */
typedef struct pt_rope {
    int rot_dim;            /* even, <= head_dim */
    const float *inv_freq;  /* backend memory, [rot_dim/2] */
    float attn_scale;
} pt_rope;

/* Attention over a KV cache, causal. Query row t of the chunk has absolute
 * position pos[t] and sees keys at positions j with
 *   j <= pos[t]  and (window == 0 or j > pos[t] - window).
 * scores = (q·k)·scale (rounded in bf16 mode); if softcap > 0:
 * softcap·tanh(scores/softcap); softmax in f32 (probabilities rounded in bf16
 * mode); output = p·v accumulated in f32. GQA: query head h reads KV head
 * h / (n_heads / n_kv). */
typedef struct pt_attn {
    int n_heads;
    int head_dim;       /* must equal the cache's head_dim */
    float scale;        /* hd^-0.5, query_pre_attn_scalar^-0.5, or 1 */
    float softcap;      /* 0 = none */
    int window;         /* 0 = full causal; W = sliding window of W keys incl. self */
    int fused_decode;   /* L3 lever --fused-decode-attn: a decode step (T == 1) over a quantized cache may
                         * use an online-softmax kernel (same math, not bit-identical) */
    int64_t max_keys;   /* > 0: no query row of the call attends to more keys (a captured decode step's
                         * bound, PT_DEC_SHORT_KEYS); backends may pick a kernel by it, never the bits.
                         * 0 = unknown */
} pt_attn;

/* The key bound of a short decode step (pt_attn.max_keys): single-sequence
 * decode steps at most this many keys long are run, and captured, apart. */
#define PT_DEC_SHORT_KEYS 256

/* MoE routing. scores = softmax(logits) over n_experts in f32; the top k
 * (ties: lower index first); if renorm, divided by their sum; then multiplied
 * by per_expert_scale[e] if given (Gemma 4, backend memory [n_experts]).
 * The weights are rounded to the activation dtype on output. */
typedef struct pt_moe_route {
    int n_experts;
    int top_k;
    int renorm;
    const float *per_expert_scale; /* NULL = none */
} pt_moe_route;

/* The gated delta rule of a Gated DeltaNet layer (Qwen3.5). Per token t and
 * value head h (key head kh = h / (Hv/Hk)), all in f32:
 *   q = l2norm(q_kh)·q_scale, k = l2norm(k_kh), l2norm(x) = x·rsqrt(Σx² + 1e-6)
 *   β = σ(b[h]),  g = −exp(A_log[h])·softplus(a[h] + dt_bias[h]),  α = exp(g)
 *   S ← α·S;  δ = β·(v − Sᵀk);  S ← S + k⊗δ;  o = Sᵀq      (S: [Dk, Dv])
 * chunk == 0 runs exactly that, token by token. chunk > 0 (64 in the
 * reference) runs the same recurrence in chunked (WY) form for prefill:
 * equal up to f32 rounding (tests/test_deltanet.c). bf16 mode rounds β
 * (the reference computes σ(b) in bf16) and the output; the l2 norms, the
 * q scale, g and the state stay f32 (the reference casts q, k, v, β, g to
 * f32 before normalizing). */
typedef struct pt_delta {
    int n_k_heads, n_v_heads; /* Hk, Hv (Hv a multiple of Hk) */
    int k_dim, v_dim;         /* Dk, Dv */
    float q_scale;            /* Dk^-0.5 */
    const float *A_log;       /* backend memory f32 [Hv] */
    const float *dt_bias;     /* backend memory f32 [Hv] */
    int chunk;                /* 0 = token by token; else the chunk length */
} pt_delta;

/* Largest conv1d kernel conv1d_silu takes. */
#define PT_CONV_MAX_K 16

/* Scratch limits, reserved once before the forward pass (ops allocate
 * nothing per call). Zero fields mean "not used". */
typedef struct pt_backend_limits {
    int max_tokens;     /* largest T passed to any op (the prefill chunk) */
    int64_t max_ctx;    /* largest number of keys one query attends to */
    int max_heads;      /* largest n_heads */
    int max_head_dim;
    int64_t max_cols;   /* largest K of a matmul (input features) */
    int64_t max_ffn;    /* largest expert intermediate size (moe_ffn) */
    int max_top_k;      /* largest top_k (moe_ffn) */
    int max_rows;       /* largest B of the multi-sequence decode ops (kv_append_rows, attention_rows) */
} pt_backend_limits;

typedef struct pt_backend pt_backend;

/* The op table. Shapes are given in elements; [T, D] is row-major with rows
 * of D contiguous floats unless a stride argument says otherwise. */
typedef struct pt_backend_ops {
    const char *name; /* "cpu", "cuda" */
    void (*free)(pt_backend *be);

    /* -- memory -- */
    void *(*alloc)(pt_backend *be, size_t bytes);   /* 64-byte aligned, zeroed; NULL + pt_error on failure */
    void (*dealloc)(pt_backend *be, void *p);
    pt_status (*upload)(pt_backend *be, void *dst, const void *src_host, size_t bytes);
    pt_status (*download)(pt_backend *be, void *dst_host, const void *src, size_t bytes); /* synchronizes */
    pt_status (*sync)(pt_backend *be);
    /* Sizes the per-op scratch for the given limits (may be called again to grow). */
    pt_status (*reserve)(pt_backend *be, const pt_backend_limits *lim);
    /* Validates a weight (bits, group size, shapes) and makes it usable in ops
     * (CPU: may repack; CUDA: copies to the device). The error names what is
     * wrong; `name` (may be NULL) is used in messages. */
    pt_status (*prepare_weight)(pt_backend *be, pt_matrix *w, const char *name);
    void (*release_weight)(pt_backend *be, pt_matrix *w);

    /* -- ops -- */

    /* y[T, cols] = table[ids[t]] · scale  (dense or quantized rows; ids int32 [T]).
     * In bf16 mode the row is rounded, then multiplied by scale and rounded
     * again (the reference multiplies by a scale tensor of the model dtype:
     * pass the scale already rounded to bf16 for Gemma's sqrt(H)). scale 1 skips the multiply.
     * ids outside [0, rows) produce zeros and return PT_ERR_RANGE. */
    pt_status (*embed)(pt_backend *be, float *y, const int32_t *ids, int T, const pt_matrix *table, float scale);

    /* y[T, D] = rms_norm(x[T, D]) with weight w[D] (wtype) in the given style;
     * x̂ = x / sqrt(mean(x²) + eps) in f32. If residual != NULL it is fused:
     * residual[T, D] += x (rounded), then y = rms_norm(residual). y may alias x
     * (not residual). Per-head norms: T = tokens·heads, D = head_dim. */
    pt_status (*rms_norm)(pt_backend *be, float *y, const float *x, float *residual, int64_t T, int64_t D,
                          const void *w, pt_ftype wtype, pt_rms_style style, float eps);

    /* Optional (NULL: two rms_norm calls): x1[T1, D] with weight w1 and
     * x2[T2, D] with w2 normalized in place (same D, wtype, style, eps) in
     * one call, the bits of the two rms_norm calls — the per-head q and k
     * norms. PT_ERR_UNSUPPORTED (no message): make the two calls. */
    pt_status (*rms_norm2)(pt_backend *be, float *x1, int64_t T1, const void *w1, float *x2, int64_t T2,
                           const void *w2, int64_t D, pt_ftype wtype, pt_rms_style style, float eps);

    /* y[T, N] = x[T, K] · Wᵀ (+ bias), N = w->rows, K = w->cols, f32
     * accumulation, one rounding at the end (after the bias) in bf16 mode.
     * Quantized W is used directly (factored form per group:
     * scale·Σq·x + bias·Σx). T == 1 is the decode matvec. Also the logits:
     * the lm_head (or the tied embedding table, same layout) over the rows
     * that need logits. For a stacked weight, `expert` selects the matrix
     * (0 otherwise). */
    pt_status (*matmul)(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert);

    /* In place on x[T, n_heads, head_dim]: RoPE at positions pos[T]. In bf16
     * mode: x·cos and rotate_half(x)·sin are each rounded, then their sum. */
    pt_status (*rope)(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                      const pt_rope *rope);

    /* Writes k[T, n_kv, head_dim] and v[T, n_kv, head_dim] (f32 activations)
     * into the cache rows of positions pos[0..T) (slots pos % capacity),
     * converting to the cache's storage. */
    pt_status (*kv_append)(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                           const int32_t *pos);

    /* Copies the rows of positions [p0, p1) from a full-precision cache into
     * a quantized cache of the same shape (DESIGN.md: a cache is converted
     * whole once it holds --quantized-kv-start tokens; new rows are then
     * quantized by kv_append). Positions go to slots pos % capacity in both. */
    pt_status (*kv_quantize)(pt_backend *be, pt_kv_layer *dst, const pt_kv_layer *src, int64_t p0, int64_t p1);

    /* out[T, n_heads·head_dim] = attention of q[T, n_heads, head_dim] over the
     * cache (which already holds this chunk's K/V, via kv_append). One op for
     * prefill (T > 1, chunked with the cache offset pos[0]) and decode (T == 1). */
    pt_status (*attention)(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                           const pt_kv_layer *kv, const pt_attn *p);

    /* y[T, F] = act(gate) · up, with gate/up rows at stride ld (elements), so
     * a fused [T, 2F] projection works with gate = buf, up = buf + F, ld = 2F.
     * bf16 mode rounds act(gate), then the product. */
    pt_status (*glu)(pt_backend *be, float *y, const float *gate, const float *up, int64_t T, int64_t F,
                     int64_t ld, pt_glu_kind act);

    /* Elementwise over n floats (y may alias an input):
     *   add:        y = a + b
     *   mul:        y = a · b
     *   add_scaled: y = a + round(b · s)        (MiniCPM's scaled residual)
     *   scale:      y = x · s
     *   softcap:    y = cap · tanh(x / cap)      (bf16 mode rounds each step) */
    pt_status (*add)(pt_backend *be, float *y, const float *a, const float *b, int64_t n);
    pt_status (*mul)(pt_backend *be, float *y, const float *a, const float *b, int64_t n);
    pt_status (*add_scaled)(pt_backend *be, float *y, const float *a, const float *b, float s, int64_t n);
    pt_status (*scale)(pt_backend *be, float *y, const float *x, float s, int64_t n);
    pt_status (*softcap)(pt_backend *be, float *y, const float *x, float cap, int64_t n);

    /* MoE routing: logits[T, n_experts] (the router matmul's output) →
     * idx[T, top_k] (int32) and weights[T, top_k] (see pt_moe_route). */
    pt_status (*moe_route)(pt_backend *be, int32_t *idx, float *weights, const float *logits, int64_t T,
                           const pt_moe_route *p);

    /* Expert gather: y[T, H] = Σ_k weights[t,k] · down_e(act(gate_e(x)) · up_e(x))
     * with e = idx[t,k], x[T, H]. gate/up/down are stacked expert weights
     * [E, I, H] / [E, I, H] / [E, H, I]; if up == NULL, gate is a fused
     * [E, 2I, H] stack (first I rows gate, next I up). Each expert output is
     * multiplied by its weight (rounded) and accumulated in ascending expert
     * order (rounded after each add), as the reference does. */
    pt_status (*moe_ffn)(pt_backend *be, float *y, const float *x, int64_t T, const int32_t *idx,
                         const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                         const pt_matrix *down, pt_glu_kind act);

    /* out[t] = index of the largest x[t, 0..V) (first one on ties; NaN is
     * never selected unless the row is all NaN, then 0). */
    pt_status (*argmax)(pt_backend *be, int32_t *out, const float *x, int64_t T, int64_t V);

    /* -- Gated DeltaNet and gated attention (Qwen3.5; NULL where a backend
     *    does not implement them: the model then fails to load) -- */

    /* Causal depthwise conv1d + SiLU over x[T, C], kernel w[C, K] (wtype),
     * no bias: y[t, c] = silu(Σ_{j<K} w[c, j] · X[t + j][c]) with
     * X = [state; x] (state: the K-1 rows before x, oldest first, f32
     * [K-1, C] backend memory). Afterwards state holds the last K-1 rows of X.
     * The sum runs j = 0..K-1 in f32; bf16 mode rounds the conv output, then
     * the SiLU. y must not alias x. K <= PT_CONV_MAX_K. */
    pt_status (*conv1d_silu)(pt_backend *be, float *y, const float *x, int64_t T, int64_t C, int K, const void *w,
                             pt_ftype wtype, float *state);

    /* The gated delta rule (see pt_delta) over T tokens:
     * qkv[T, 2·Hk·Dk + Hv·Dv] (the conv output: [q | k | v]), b, a [T, Hv] (the
     * in_proj_b / in_proj_a outputs), state [Hv, Dk, Dv] f32 (updated in
     * place), out[T, Hv·Dv]. */
    pt_status (*delta_rule)(pt_backend *be, float *out, const float *qkv, const float *b, const float *a, int64_t T,
                            float *state, const struct pt_delta *p);

    /* Gated RMSNorm over rows x[R, D] with gate z[R, D] and weight w[D]:
     * y = round(round(w · round(x̂)) · silu(z)), x̂ = x / sqrt(mean(x²) + eps),
     * silu(z) in f32 (rounding only in bf16 mode). y may alias x. */
    pt_status (*rms_norm_gated)(pt_backend *be, float *y, const float *x, const float *z, int64_t R, int64_t D,
                                const void *w, pt_ftype wtype, float eps);

    /* Strided row copy: dst[r·ldd + i] = src[r·lds + i] for r < rows, i < n
     * (splits per-head [q | gate] rows). Must not overlap. */
    pt_status (*copy_rows)(pt_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                           int64_t n);

    /* Row copies through pointers: dst[r][i] = src[r][i] for r < n, i <
     * len, each row anywhere (the logits rows of a batched step into their
     * sessions' buffers), in one launch on a GPU. Must not overlap. NULL:
     * the caller copies row by row (copy_rows). */
    pt_status (*copy_rows_to)(pt_backend *be, float *const *dst, const float *const *src, int n, int64_t len);

    /* y = x · σ(g) over n floats; bf16 mode rounds σ(g), then the product.
     * y may alias x. */
    pt_status (*sigmoid_mul)(pt_backend *be, float *y, const float *x, const float *g, int64_t n);

    /* Batch-invariant matmul (continuous batching, docs/batching.md): the
     * same y[T, N] = x[T, K] · Wᵀ as matmul, with one more guarantee: row t
     * of y is bit-identical to matmul(x_t, T = 1), for every T. A batched
     * decode step runs the B slots' rows through this, so a request's tokens
     * do not depend on which other requests share its steps, while the
     * weights are still read once for all B rows. matmul itself may pick a
     * different kernel (another reduction order) for larger T, which is why
     * this is a separate entry. NULL = not implemented by the backend:
     * callers then run matmul one row at a time (invariant, no weight reuse).
     * Kept last in the table so positional initializers stay valid. */
    pt_status (*matmul_rows)(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert);

    /* Multi-sequence decode (continuous batching, docs/batching.md): row b
     * of a batch of B single-token rows belongs to its own sequence, with
     * its own position pos[b] (backend memory) and its own cache of one
     * layer, whose storage is kvp[2b] (K) and kvp[2b + 1] (V): kvp is an
     * array of B·2 pointers in backend memory, so a captured CUDA graph
     * replays with any set of sequences. Every row's cache has the shape of
     * `shape` (n_kv, head_dim, capacity, dtype; full precision only: bits
     * 0; its k/v pointers are not used). Row b's results are bit-identical
     * to kv_append / attention with T = 1 at pos[b] on that row's cache. A
     * row with pos[b] < 0 is padding: nothing is written to any cache and
     * its attention output is zeros. NULL = not implemented (callers run the
     * T = 1 ops row by row); PT_ERR_UNSUPPORTED for a shape the op does not
     * take (callers fall back the same way). Scratch: reserve max_rows.
     * Kept after matmul_rows so positional initializers stay valid. */
    pt_status (*kv_append_rows)(pt_backend *be, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                const float *v, int64_t B, const int32_t *pos);
    pt_status (*attention_rows)(pt_backend *be, float *out, const float *q, int64_t B, const int32_t *pos,
                                const pt_kv_layer *shape, void *const *kvp, const pt_attn *p);

    /* rope on the queries and the keys of one layer in one call: exactly
     * rope(q[T, n_heads, head_dim]) then, if k != NULL, rope(k[T, n_kv,
     * head_dim]), same positions and table (bit-identical results). NULL =
     * not implemented: callers make the two rope calls. Kept after
     * attention_rows so positional initializers stay valid. */
    pt_status (*rope_qk)(pt_backend *be, float *q, float *k, int64_t T, int n_heads, int n_kv, int head_dim,
                         const int32_t *pos, const pt_rope *rope);

    /* rope_qk(q, k) then kv_append(kv, k, v) in one call (a decode layer's
     * RoPE and cache write in one launch): bit-identical results — q and k
     * as rope_qk leaves them, the cache rows (full precision or quantized)
     * as kv_append writes them; over a quantized cache k may be left as it
     * was (its rotated values are in the cache). NULL = not implemented:
     * callers make the two calls. Kept last so positional initializers stay
     * valid. */
    pt_status (*rope_qk_kv_append)(pt_backend *be, float *q, float *k, const float *v, int64_t T, int n_heads,
                                   int n_kv, int head_dim, const int32_t *pos, const pt_rope *rope,
                                   pt_kv_layer *kv);

    /* Several matmuls over the same input in one call (a layer's q, k, v
     * projections; gate and up): y[i][T, w[i]->rows] = x[T, K] · w[i]ᵀ
     * (+ bias) for i < n, 1 <= n <= 4, every w[i]->cols == K, no expert
     * stacks (n_experts <= 1; expert 0). Each y[i] is bit-identical to
     * matmul(be, y[i], x, T, w[i], 0) when rows == 0, and to
     * matmul_rows(be, y[i], x, T, w[i], 0) when rows == 1 (batched rows: a
     * backend with matmul_multi also has matmul_rows). The y[i] must not
     * overlap each other or x. A backend may run them in one launch / one
     * dispatch (read and prepare x once, fill more of the machine with the
     * small ones); the weights may differ in rows, bits and group size.
     * NULL = not implemented: callers make the n calls. Kept last so
     * positional initializers stay valid. */
    pt_status (*matmul_multi)(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                              const pt_matrix *const *w, int rows);

    /* A feed-forward's gate and up projections and the gated activation in
     * one call: y[T, F] = glu(x·Wgᵀ, x·Wuᵀ) with act, F = wg->rows ==
     * wu->rows, bit-identical to matmul_multi(2, {g, u}, x, T, {wg, wu},
     * rows) followed by glu(y, g, u, T, F, F, act). The backend may fold the
     * activation into the projections' epilogue (CUDA: one launch instead
     * of two, for decode-sized T). Returns PT_ERR_UNSUPPORTED, having
     * enqueued nothing and set no message, for what it does not fuse (shapes,
     * weight layouts, row counts, a switch): callers then make the two
     * calls. NULL = not implemented (the CPU backend): the same. Kept last
     * so positional initializers stay valid. */
    pt_status (*matmul_glu)(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *wg,
                            const pt_matrix *wu, pt_glu_kind act, int rows);

    /* A decode layer's RoPE, cache write and attention in one call, over B
     * single-token rows: kvp == NULL: one sequence (B == 1) and kv's cache,
     * out as rope_qk_kv_append(q, k, v, 1, ..., kv) followed by attention(out,
     * q, 1, pos, kv, p) produce it; kvp != NULL: the multi-sequence table of
     * attention_rows (kv gives the shape), out as rope_qk(q, k, B) +
     * kv_append_rows + attention_rows produce it (rows may share a cache:
     * a joining prompt's rows see the keys the rows before them append).
     * Bit-identical outputs and
     * cache rows; q and k are left unrotated (their contents afterwards are
     * not the rotated values). Returns PT_ERR_UNSUPPORTED, having enqueued
     * nothing and set no message, for what it does not fold (quantized
     * caches, shapes outside its kernels, a switch): callers then make the
     * separate calls. NULL = not implemented (the CPU backend): the same.
     * Kept last so positional initializers stay valid. */
    pt_status (*rope_kv_attention)(pt_backend *be, float *out, const float *q, const float *k, const float *v,
                                   int64_t B, const int32_t *pos, const pt_rope *rope, pt_kv_layer *kv,
                                   void *const *kvp, const pt_attn *p);

    /* A decode row's RMSNorm folded into the matmuls that read it, and the
     * residual add into the matmul whose output it adds: the three ops of a
     * layer without the two rms_norm launches (CUDA decode: in the GEMV's
     * staging of x and in its epilogue). Each is bit-identical to the calls
     * it replaces:
     *   matmul_norm(n, y, x, T, w, nrm) = rms_norm(xn, x, NULL, T, K, nrm)
     *     then matmul_multi(n, y, xn, T, w, 0) (x is left as it was, xn is
     *     never written); with nrm->add set, rms_norm(xn, nrm->add, x, T,
     *     K, nrm) instead (x += add first, written back);
     *   matmul_glu_norm(y, x, T, wg, wu, act, nrm) = the same norm then
     *     matmul_glu (or matmul_multi + glu);
     *   matmul_add(x, a, T, w) = matmul(y, a, T, w) then the residual add
     *     of rms_norm(.., y, x, ..): x = round(x + y), y never written.
     * Each returns PT_ERR_UNSUPPORTED, having enqueued nothing and set no
     * message, for what it does not fuse (row counts, weight layouts, norm
     * shapes, a switch): callers then make those calls. NULL = not
     * implemented (the CPU backend): the same. Kept last so positional
     * initializers stay valid. */
    pt_status (*matmul_norm)(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                             const pt_matrix *const *w, const pt_norm_in *nrm);
    pt_status (*matmul_glu_norm)(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *wg,
                                 const pt_matrix *wu, pt_glu_kind act, const pt_norm_in *nrm);
    pt_status (*matmul_add)(pt_backend *be, float *x, const float *a, int64_t T, const pt_matrix *w);

    /* A hint, optional (NULL: ignored): the FFN weights w[0..n-1] (gate,
     * up, down) are read by the matmuls that follow the next matmul_add of
     * one decode row (the forward pass names them before a layer's output
     * projection). The backend may start fetching them from memory during
     * the latency-bound ops before they are read (CUDA: into the L2, by the
     * next matmul_add's blocks, where a norm launch runs before the GLU
     * launch; PETREL_CUDA_L2_PF, docs/cuda.md). Changes no result; a hint
     * the next matmul_add does not take is dropped. */
    void (*prefetch_hint)(pt_backend *be, const pt_matrix *const *w, int n);

    /* A hint, optional (NULL: ignored): the caller's next matmul_glu,
     * matmul_glu_norm or rope_kv_attention writes its output y, and the
     * caller's next call after it is a matmul (matmul_rows, matmul_add)
     * reading that y, unchanged, as its x (a feed-forward's down
     * projection; the output projection). The backend may then have that
     * op write the matmul's prepared input as well and the matmul skip its
     * own preparation (CUDA, 33..64 rows on the wgmma kernels: one launch a
     * layer fewer each; PETREL_CUDA_TC_WG_XO, docs/cuda.md). Changes no
     * result; the hint lapses at the backend's next matmul of any kind.
     * Kept last so positional initializers stay valid. */
    void (*handoff_hint)(pt_backend *be);
} pt_backend_ops;

struct pt_backend {
    const pt_backend_ops *ops;
    pt_act_dtype act;
    void *impl; /* backend-private state */
};

/* ---- CPU backend --------------------------------------------------------- */

typedef enum pt_cpu_isa { PT_ISA_AUTO = 0, PT_ISA_SCALAR = 1, PT_ISA_AVX2 = 2, PT_ISA_AVX512 = 3 } pt_cpu_isa;

typedef struct pt_cpu_params {
    int n_threads;      /* >= 1; 0 = every online CPU */
    pt_act_dtype act;
    pt_cpu_isa isa;     /* PT_ISA_AUTO: the best the CPU supports, unless the
                           environment variable PETREL_CPU_ISA=scalar|avx2|avx512
                           asks for another (an unsupported request is an error) */
    int int8_act;       /* the --int8-act lever (L3, changes outputs): decode
                           matmuls (T < 4) over 4- and 8-bit weights quantize x
                           per weight group to int8 (symmetric, step max|x|/127)
                           and use integer dot products (AVX-512 VNNI; plain C
                           on other ISAs). Prefill and other weights unchanged. */
} pt_cpu_params;

pt_status pt_backend_cpu_create(pt_backend **out, const pt_cpu_params *params);
/* The ISA the CPU backend picked ("scalar", "avx2", "avx512"). */
const char *pt_backend_cpu_isa_name(const pt_backend *be);
/* Which kernels take 4- and 8-bit weights on this CPU backend: with bf16
 * activations "decode D, prefill P" (D: "int pieces" or "bf16"; P: "amx",
 * "bf16", "int pieces" or "f32"); under the int8 lever "int8 x: decode vnni,
 * prefill P" (P: "amx int8" or "vnni"); following the CPU and the
 * PETREL_CPU_* switches; NULL where none of those apply (not AVX-512 with
 * VNNI, f32 activations without the int8 lever, not a CPU backend). A static
 * string. */
const char *pt_backend_cpu_quant_paths(const pt_backend *be);

/* matmul_multi through the op when the backend has it (and, for rows, also
 * matmul_rows), else the n separate calls: matmul (rows == 0), matmul_rows
 * (rows == 1), or T = 1 matmuls row by row when the backend has no
 * matmul_rows. Same results either way (backend.h contract). */
pt_status pt_backend_matmul_multi(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                                  const pt_matrix *const *w, int rows);

/* One matmul of a forward pass: matmul (rows == 0), or for batched rows
 * (rows == 1) matmul_rows, or T = 1 matmuls row by row when the backend has
 * no matmul_rows (row t then equals the T = 1 matmul by construction). */
pt_status pt_backend_matmul_as(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int rows);

/* Frees any backend (NULL-safe) and sets *be to NULL. */
void pt_backend_free(pt_backend **be);

#endif
