/* Model directory files, typed: config.json (every family petrel knows),
 * generation_config.json, tokenizer_config.json, kv_config.json, and the MLX
 * quantization block of config.json.
 *
 * What it is: parsing and validation of those JSON files into plain structs,
 * with both the older (`rope_theta`, `rope_scaling`) and newer
 * (`rope_parameters`, per layer type) spellings, multimodal wrappers (a
 * nested `text_config`) and family defaults as the reference implementations
 * define them. A required field that is missing, of the wrong type or out of
 * range is an error naming the file and the field, never a silent default.
 *
 * What it is not: it does not look at tensors (spec.h binds weights and
 * resolves per-layer constants), and it does not parse tokenizer.json or chat
 * templates (src/tokenizer/ does; this only reports what tokenizer_config.json
 * says and whether a template exists). */
#ifndef PT_MODEL_CONFIG_H
#define PT_MODEL_CONFIG_H

#include "petrel.h"

#include <cjson/cJSON.h>
#include <stdint.h>

typedef enum pt_arch {
    PT_ARCH_UNKNOWN = 0,
    PT_ARCH_LLAMA,     /* llama (also MiniCPM5, which is a plain Llama) */
    PT_ARCH_QWEN2,     /* qwen2 */
    PT_ARCH_QWEN3,     /* qwen3 */
    PT_ARCH_QWEN3_MOE, /* qwen3_moe */
    PT_ARCH_GEMMA2,    /* gemma2 */
    PT_ARCH_GEMMA3,    /* gemma3 (multimodal wrapper) / gemma3_text */
    PT_ARCH_GEMMA4,    /* gemma4 (multimodal wrapper) / gemma4_text */
    PT_ARCH_QWEN3_5,   /* qwen3_5 / qwen3_5_text / qwen3_5_moe (n_experts > 0) */
    PT_ARCH_MINICPM,   /* minicpm (MiniCPM 1/2/4: Llama + mup scalars) */
    PT_ARCH_COUNT
} pt_arch;

/* "llama", "qwen3_moe", ... */
const char *pt_arch_name(pt_arch a);

/* Per-layer attention kind. */
typedef enum pt_layer_kind {
    PT_LAYER_FULL = 0,    /* full causal attention */
    PT_LAYER_SLIDING = 1, /* sliding-window causal attention */
    PT_LAYER_LINEAR = 2,  /* Gated DeltaNet linear attention (Qwen3.5) */
} pt_layer_kind;

const char *pt_layer_kind_name(pt_layer_kind k); /* "full_attention", ... */

typedef enum pt_rope_type {
    PT_ROPE_DEFAULT = 0,
    PT_ROPE_LINEAR,
    PT_ROPE_DYNAMIC,
    PT_ROPE_LLAMA3,
    PT_ROPE_YARN,
    PT_ROPE_LONGROPE,
    PT_ROPE_PROPORTIONAL, /* Gemma 4 full-attention layers */
    PT_ROPE_COUNT
} pt_rope_type;

const char *pt_rope_type_name(pt_rope_type t);

/* RoPE parameters for one layer type, as the config states them. Fields that
 * do not apply to `type` keep their neutral values (factor 1, ...). */
typedef struct pt_rope_config {
    pt_rope_type type;
    double theta;                 /* base */
    double factor;                /* linear/dynamic/llama3/yarn/proportional; 1 if absent */
    double partial_rotary_factor; /* fraction of head_dim rotated (1 = all) */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int64_t original_max_position_embeddings; /* llama3/yarn/longrope/dynamic; 0 = absent */
    double attention_factor;      /* yarn/longrope explicit value; 0 = derive */
    double beta_fast, beta_slow;  /* yarn (32, 1) */
    double mscale, mscale_all_dim; /* yarn (0 = absent) */
    int truncate;                 /* yarn (1) */
    int n_short_factor, n_long_factor; /* longrope: lists of rotary_dim/2 */
    double *short_factor, *long_factor;
    int mrope;                    /* Qwen3.5 mrope_section present (text-only: plain RoPE) */
} pt_rope_config;

/* MLX quantization (config.json "quantization", mirrored in
 * "quantization_config"): global bits/group size plus per-module overrides
 * keyed by module path (no ".weight"), where `false` = not quantized. */
typedef struct pt_quant_override {
    char *path;     /* e.g. "model.layers.0.mlp.gate" */
    int quantized;  /* 0 for `false` */
    int bits, group_size;
} pt_quant_override;

typedef struct pt_quant_config {
    int present;    /* the config declares MLX affine quantization */
    int bits;       /* global; 0 when not present */
    int group_size;
    char mode[16];  /* "affine" */
    int n_overrides;
    pt_quant_override *overrides;
} pt_quant_config;

/* Quantization of one module path under the config: *bits = 0 when the config
 * says the module is not quantized (a `false` override), otherwise the
 * override's or the global bits/group size. Returns 1 when an explicit
 * override exists, else 0. */
int pt_quant_lookup(const pt_quant_config *q, const char *module_path, int *bits, int *group_size);

/* Bits and group sizes MLX affine quantization supports. */
int pt_quant_bits_valid(int bits);
int pt_quant_group_valid(int group_size);

#define PT_MAX_EOS 16

typedef struct pt_config {
    pt_arch arch;
    char model_type[64];      /* top-level model_type as written */
    char text_model_type[64]; /* text_config.model_type (or model_type) */
    int multimodal_wrapper;   /* parameters came from a nested text_config */

    /* common */
    int64_t vocab_size, hidden_size, intermediate_size, n_layers;
    int64_t n_heads, n_kv_heads, head_dim; /* head_dim defaults to hidden/n_heads */
    int64_t max_position_embeddings;       /* 0 when absent */
    double rms_norm_eps;
    int tie_word_embeddings;
    int attention_bias; /* q/k/v(/o) biases (qwen2: q/k/v always) */
    int mlp_bias;
    char hidden_act[32]; /* "silu", "gelu_pytorch_tanh", ... */
    char torch_dtype[16]; /* "bfloat16", "float16", "float32" or "" */

    /* per-layer kinds; [n_layers], owned */
    pt_layer_kind *layer_types;
    int64_t sliding_window; /* 0 = none */

    /* RoPE per layer type: rope[PT_LAYER_FULL], rope[PT_LAYER_SLIDING]
     * (identical when the family has one rope) */
    pt_rope_config rope[2];

    /* Gemma 2/3 */
    double query_pre_attn_scalar; /* 0 = absent (scale = head_dim^-0.5) */
    double attn_logit_softcapping;  /* 0 = none */
    double final_logit_softcapping; /* 0 = none */

    /* Gemma 4 */
    int64_t global_head_dim;          /* head dim of full-attention layers (0 = head_dim) */
    int64_t n_global_kv_heads;        /* K=V full layers (0 = n_kv_heads) */
    int64_t vocab_size_per_layer_input, hidden_size_per_layer_input; /* PLE (0 = none) */
    int64_t num_kv_shared_layers;
    int use_double_wide_mlp;
    int attention_k_eq_v;
    int enable_moe_block;
    int64_t top_k_experts;

    /* MoE (qwen3_moe, qwen3_5_moe, gemma4 26B) */
    int64_t n_experts, n_experts_per_tok, moe_intermediate_size;
    int norm_topk_prob;
    int64_t decoder_sparse_step;
    int n_mlp_only_layers;
    int64_t *mlp_only_layers; /* owned */
    int64_t shared_expert_intermediate_size; /* 0 = no shared expert */

    /* Qwen3.5 linear attention */
    int64_t linear_num_key_heads, linear_num_value_heads;
    int64_t linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim;
    int64_t full_attention_interval;
    int attn_output_gate; /* Qwen3.5 full attention: q_proj also yields a gate */

    /* MiniCPM mup scalars (0 when absent: defaults in spec.h) */
    double scale_emb, scale_depth, dim_model_base;

    /* token ids named in config.json (-1 = absent or null) */
    int32_t bos_token_id, pad_token_id;
    int n_eos;
    int32_t eos_token_id[PT_MAX_EOS];

    pt_quant_config quant;

    cJSON *json;       /* the whole config.json (owned) */
    const cJSON *text; /* the object the text parameters came from */
    char *path;        /* config.json path, for messages */
} pt_config;

/* Parses config.json text. `what` names the file in messages. */
pt_status pt_config_parse(const char *text, size_t len, const char *what, pt_config *out);
pt_status pt_config_load(const char *path, pt_config *out);
void pt_config_free(pt_config *c);

/* generation_config.json. Fields absent in the file keep has_* = 0. */
typedef struct pt_generation_config {
    int present;
    int n_eos;
    int32_t eos_token_id[PT_MAX_EOS];
    int32_t bos_token_id, pad_token_id; /* -1 = absent/null */
    int has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty;
    double temperature, top_p, min_p, repetition_penalty;
    int64_t top_k;
    int do_sample; /* -1 absent */
    int64_t max_new_tokens, max_length; /* 0 = absent */
} pt_generation_config;

pt_status pt_generation_config_parse(const char *text, size_t len, const char *what, pt_generation_config *out);

/* tokenizer_config.json basics (strings owned; NULL = absent/null). */
typedef struct pt_tokenizer_config {
    int present;
    char *bos_token, *eos_token, *pad_token, *unk_token;
    int add_bos_token, add_eos_token; /* -1 absent */
    char *chat_template;   /* from tokenizer_config.json ("default" when a list), or chat_template.jinja */
    char *chat_template_source; /* the file it came from */
    int64_t model_max_length;   /* 0 = absent */
} pt_tokenizer_config;

pt_status pt_tokenizer_config_parse(const char *text, size_t len, const char *what, pt_tokenizer_config *out);
void pt_tokenizer_config_free(pt_tokenizer_config *t);

/* kv_config.json: [{"layer_idx": i, "bits": b, "group_size": g}, ...]. */
typedef struct pt_kv_entry {
    int layer_idx, bits, group_size;
} pt_kv_entry;
typedef struct pt_kv_config {
    int present;
    int n;
    pt_kv_entry *entries; /* owned, in file order; layer indices unique */
} pt_kv_config;

pt_status pt_kv_config_parse(const char *text, size_t len, const char *what, pt_kv_config *out);
void pt_kv_config_free(pt_kv_config *k);

/* Everything a model directory says besides the weights. Only config.json is
 * required; the others are loaded when present. n_layers (from the config)
 * validates kv_config layer indices. */
typedef struct pt_model_dir {
    char *dir;
    pt_config config;
    pt_generation_config generation;
    pt_tokenizer_config tokenizer;
    pt_kv_config kv;
    int has_tokenizer_json;
} pt_model_dir;

pt_status pt_model_dir_load(const char *dir, pt_model_dir *out);
void pt_model_dir_free(pt_model_dir *m);

#endif
