/* The model spec: what the forward pass reads. At load time a pt_config and
 * a tensor set become one record per layer with every constant resolved
 * (attention kind and window, head counts and dims, norm styles, attention
 * scale, softcaps, the RoPE inverse-frequency table, the KV donor layer, MLP
 * kind and widths, per-layer scalars) and every weight bound to its tensor
 * (pt_weight: data pointer, dtype, logical shape, and for MLX-quantized
 * weights the packed codes, scales and biases).
 *
 * Both checkpoint layouts map to one internal naming here: Hugging Face names
 * (`model.*`, `model.language_model.*` for multimodal wrappers; per-expert
 * tensors; Gemma 4 / Qwen3.5-MoE fused `experts.gate_up_proj`) and the MLX
 * layout (`language_model.model.*`, stacked `switch_mlp.*` / `switch_glu.*`
 * experts, Qwen3.5 norms with +1 folded in, conv1d as [C, K, 1]). Vision and
 * audio towers and multi-token-prediction heads are skipped (counted in
 * n_skipped). Every tensor the architecture needs must be present with the
 * right dtype and shape, and every tensor present must be explained; errors
 * name the tensor and the expected vs found shape/dtype.
 *
 * What it is not: no arithmetic on weights (nothing is copied or converted;
 * weights stay in the mapping), no backend state, no forward pass. The
 * forward pass never branches on pt_arch per token; it reads these fields. */
#ifndef PT_MODEL_SPEC_H
#define PT_MODEL_SPEC_H

#include "format/safetensors.h"
#include "model/config.h"
#include "petrel.h"

#include <stdint.h>

/* How an RMSNorm applies its weight: y = rms(x) * w, * (1 + w), or no weight. */
typedef enum pt_norm_style {
    PT_NORM_NONE = 0,    /* the norm does not exist */
    PT_NORM_W,           /* rms(x) * w */
    PT_NORM_1PW,         /* rms(x) * (1 + w)  (Gemma 2/3; Qwen3.5 HF files) */
    PT_NORM_NOSCALE,     /* rms(x)  (Gemma 4 v_norm, router pre-norm) */
} pt_norm_style;

typedef enum pt_mlp_kind {
    PT_MLP_DENSE = 0, /* act(gate(x)) * up(x) -> down */
    PT_MLP_MOE,       /* routed experts (+ shared expert / Gemma 4 parallel dense path) */
} pt_mlp_kind;

typedef enum pt_act {
    PT_ACT_SILU = 0,  /* SwiGLU */
    PT_ACT_GELU_TANH, /* GeGLU (gelu_pytorch_tanh) */
} pt_act;

typedef enum pt_router_kind {
    PT_ROUTER_SOFTMAX_TOPK = 0, /* softmax over all experts, top-k, renormalise iff norm_topk */
    PT_ROUTER_GEMMA4,           /* rms_noscale(x)*scale*H^-0.5 -> proj -> softmax -> top-k -> renorm -> *per_expert_scale */
} pt_router_kind;

/* One bound weight. data == NULL means "absent" (an optional weight the
 * checkpoint does not have). Rows are contiguous; a view (an expert of a
 * stacked tensor, the gate half of a fused gate_up) points into its parent.
 *
 * Dense: data holds shape[0] x shape[1] (x ...) elements of `dtype`.
 * MLX-quantized (bits > 0): `shape` is the LOGICAL (unpacked) shape
 * [rows, cols]; data holds uint32 [rows, cols*bits/32] (dtype PT_DTYPE_U32);
 * scales/biases hold [rows, cols/group_size] of `qdtype` (the float dtype). */
typedef struct pt_weight {
    const char *name; /* source tensor name (messages, debug dumps) */
    pt_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    int bits;         /* 0 = not quantized */
    int group_size;
    const void *scales, *biases;
    pt_dtype qdtype;  /* dtype of scales and biases */
} pt_weight;

static inline int pt_weight_present(const pt_weight *w) { return w->data != 0; }
/* Elements of the logical weight. */
int64_t pt_weight_numel(const pt_weight *w);
/* Bytes the weight occupies in the checkpoint (codes + scales + biases). */
int64_t pt_weight_bytes(const pt_weight *w);

typedef struct pt_layer_weights {
    /* norms (shape [hidden], or [head_dim] for q/k norms) */
    pt_weight input_norm, post_attn_norm, pre_ffn_norm, post_ffn_norm;
    /* attention; shapes [out, in] */
    pt_weight q_proj, k_proj, v_proj, o_proj; /* q_proj [n_heads*hd*(gate?2:1), H] */
    pt_weight q_bias, k_bias, v_bias, o_bias;
    pt_weight q_norm, k_norm;                 /* [hd] */
    /* dense MLP (Gemma 4 MoE layers: the parallel dense path) */
    pt_weight gate_proj, up_proj, down_proj;
    /* MoE: router [E, H]; experts: arrays of n_experts views [I, H] / [H, I] */
    pt_weight router;
    pt_weight *expert_gate, *expert_up, *expert_down;
    pt_weight shared_gate_proj, shared_up_proj, shared_down_proj; /* shared expert */
    pt_weight shared_expert_gate;                                  /* [1, H] */
    /* Gemma 4 MoE extras */
    pt_weight router_scale;            /* [H] */
    pt_weight router_per_expert_scale; /* [E] */
    pt_weight pre_ffn_norm_2, post_ffn_norm_1, post_ffn_norm_2;
    /* Gemma 4 per-layer input (PLE) gate */
    pt_weight ple_gate;      /* [ple_dim, H] */
    pt_weight ple_proj;      /* [H, ple_dim] */
    pt_weight ple_post_norm; /* [H] */
    pt_weight layer_scalar;  /* [1] */
    /* Qwen3.5 Gated DeltaNet */
    pt_weight lin_in_qkv;  /* [2*key_dim + value_dim, H] */
    pt_weight lin_in_z;    /* [value_dim, H] */
    pt_weight lin_in_b, lin_in_a; /* [Hv, H] */
    pt_weight lin_conv1d;  /* [conv_dim, K] (HF [C,1,K] and MLX [C,K,1] share this memory layout) */
    pt_weight lin_A_log, lin_dt_bias; /* [Hv] */
    pt_weight lin_norm;    /* [Dv], plain W */
    pt_weight lin_out_proj; /* [H, value_dim] */
} pt_layer_weights;

typedef struct pt_layer_spec {
    int index;
    pt_layer_kind kind;

    /* attention (full / sliding layers) */
    int n_heads, n_kv_heads, head_dim;
    int sliding_window;   /* keys visible = window (incl. self); 0 = unbounded */
    int has_kv;           /* computes its own K/V (0: KV-shared layer) */
    int kv_donor;         /* layer whose cache this layer reads (== index when has_kv) */
    int k_eq_v;           /* V = v_norm(raw k_proj output) (Gemma 4 full layers) */
    int attn_output_gate; /* q_proj yields [q | gate] per head; o *= sigmoid(gate) (Qwen3.5) */
    pt_norm_style q_norm, k_norm, v_norm;
    float attn_scale;     /* multiplies q·k */
    float attn_softcap;   /* 0 = none */

    /* RoPE: rotate-half over the first rope_dims dims of each head, pairs
     * (i, i + rope_dims/2); dims >= rope_dims pass through. inv_freq has
     * rope_dims/2 entries (zeros = identity pairs for proportional RoPE).
     * inv_freq_long (longrope only, else NULL): used when the sequence is
     * longer than rope_original_max. cos/sin are multiplied by rope_attn_scaling. */
    pt_rope_type rope_type;
    int rope_dims;
    const float *inv_freq;
    const float *inv_freq_long;
    int64_t rope_original_max;
    float rope_attn_scaling;

    /* norms of the block (all the same style in every family) */
    pt_norm_style norm_style;
    int sandwich_norms;   /* post_attn_norm/post_ffn_norm apply to the branch output (Gemma) */

    /* MLP */
    pt_mlp_kind mlp;
    pt_act act;
    int intermediate;          /* dense width (double-wide already applied) */
    int n_experts, top_k, moe_intermediate, norm_topk;
    pt_router_kind router;
    int shared_expert_intermediate; /* 0 = none */
    int moe_parallel_dense;    /* Gemma 4: dense MLP + experts in parallel */

    /* per-layer scalars */
    float residual_scale;  /* MiniCPM scale_depth/sqrt(L); 1 otherwise */
    int has_layer_scalar;  /* h *= layer_scalar (Gemma 4) */
    int has_ple;           /* per-layer input gate (Gemma 4) */

    /* Qwen3.5 linear attention */
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv_kernel;

    /* kv_config.json (0 = not listed) */
    int kv_config_bits, kv_config_group_size;

    pt_layer_weights w;
} pt_layer_spec;

typedef struct pt_model_spec {
    pt_arch arch;
    int n_layers, hidden, vocab;
    int64_t max_ctx;
    float rms_eps;
    pt_dtype dtype;        /* the checkpoint's float dtype (BF16, F16 or F32) */
    int mlx_layout;        /* names were in MLX's layout */
    int quantized;         /* any weight MLX-quantized */

    /* embedding: h = embed[ids] * embed_scale; when embed_scale_round_to_dtype,
     * the multiplier is first rounded to the activation dtype (Gemma) */
    float embed_scale;
    int embed_scale_round_to_dtype;
    pt_norm_style final_norm_style;
    float logit_scale;     /* logits = lm_head(norm(h) * logit_scale) (MiniCPM 1/(H/dim_model_base)) */
    float final_softcap;   /* 0 = none */
    int tied;              /* lm_head is the embedding */

    pt_weight embed;       /* [V, H] */
    pt_weight final_norm;  /* [H] */
    pt_weight lm_head;     /* [V, H]; equals `embed` when tied */

    /* Gemma 4 per-layer embeddings (ple_dim 0 = none) */
    int ple_dim, ple_vocab;
    pt_weight ple_embed;      /* [ple_vocab, L*ple_dim] */
    pt_weight ple_model_proj; /* [L*ple_dim, H] */
    pt_weight ple_proj_norm;  /* [ple_dim] */
    float ple_embed_scale;    /* sqrt(ple_dim) */
    float ple_proj_scale;     /* H^-0.5 */
    float ple_input_scale;    /* 2^-0.5 */

    pt_layer_spec *layers;    /* [n_layers] */
    int n_cache_layers;       /* layers that own a KV cache (has_kv && kind != LINEAR) */

    /* accounting */
    int64_t n_params;         /* logical parameters (unpacked) of bound weights */
    int64_t weight_bytes;     /* bytes of bound weights as stored */
    int n_bound, n_skipped;   /* tensors bound / skipped (vision, audio, mtp, rotary buffers) */
    int n_unaligned;          /* bound weights whose data, scales or biases are not aligned to
                               * their element size (safetensors does not promise alignment;
                               * petrel's writer aligns): kernels that need alignment must copy */

    void *internal;           /* owned allocations */
} pt_model_spec;

/* Builds and validates the spec. `kv` may be NULL. The spec points into `ts`
 * (keep it open) and `cfg` (keep it alive). */
pt_status pt_spec_build(const pt_config *cfg, const pt_tensor_set *ts, const pt_kv_config *kv,
                        pt_model_spec *out);
void pt_spec_free(pt_model_spec *s);

/* KV-cache bytes per token over all cache-owning layers, for K and V stored
 * at kv_bits (0 = the model's 16-bit dtype; 4 or 8 = MLX affine codes with a
 * 16-bit scale and bias per group of group_size). Linear-attention layers
 * hold a fixed-size state instead and do not count. */
int64_t pt_spec_kv_bytes_per_token(const pt_model_spec *s, int kv_bits, int group_size);

/* Row r of a 2-D weight as f32 (dense F32/F16/BF16 widened; MLX-quantized
 * dequantized as code*scale + bias), out has shape[1] floats. For embedding
 * lookups and reference paths, not for hot loops. */
void pt_weight_row_f32(const pt_weight *w, int64_t r, float *out);

/* Calls fn for every bound weight: model-level ones with layer -1, then each
 * layer's (expert views once per expert), in a fixed order. A tied lm_head is
 * not visited separately. */
typedef void (*pt_weight_visit_fn)(void *ctx, const pt_weight *w, int layer);
void pt_spec_for_each_weight(const pt_model_spec *s, pt_weight_visit_fn fn, void *ctx);

/* Families petrel's engine can run now (one table, spec.c). */
int pt_arch_runnable(pt_arch a);
/* Whether this spec's model can run: its family is runnable and it uses no
 * variant of it the engine lacks (Qwen3.5 MoE). */
int pt_spec_runnable(const pt_model_spec *s);

#endif
