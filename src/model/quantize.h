/* Converting a float checkpoint into an MLX-format affine-quantized one, as
 * mlx-lm's `convert -q` writes it: mlx-lm tensor names (language_model.*
 * for multimodal wrappers and Qwen3.5, stacked switch_mlp / switch_glu
 * experts, Qwen3.5 norms with +1 folded and conv1d as [C, K, 1]), packed
 * uint32 weights with scales and biases in the model dtype, every
 * Linear/Embedding whose input width is a multiple of the group size
 * quantized (embeddings and lm_head included), mlx-lm's per-model overrides
 * (MoE routers at 8 bits) or a mixed recipe, `quantization` and
 * `quantization_config` in config.json, shards of at most 5 GiB with
 * model.safetensors.index.json, and the tokenizer and generation files
 * copied. The result is re-validated by building its model spec.
 *
 * Not a general converter: the input must be an unquantized checkpoint of a
 * family pt_spec_build accepts. */
#ifndef PT_MODEL_QUANTIZE_H
#define PT_MODEL_QUANTIZE_H

#include "format/mlx_quant.h"
#include "petrel.h"

#include <stdint.h>

typedef struct pt_quantize_params {
    int bits;            /* 2, 3, 4, 5, 6, 8 */
    int group_size;      /* 32, 64, 128 */
    const char *mixed;   /* NULL, "mixed_2_6", "mixed_3_4", "mixed_3_6" or "mixed_4_6" */
    pt_mlx_rule rule;    /* PT_MLX_RULE_METAL (default: what mlx-community checkpoints use) */
    uint64_t max_shard_bytes; /* 0 = 5 GiB, as mlx-lm */
    int n_threads;       /* 0 = all online CPUs; the output does not depend on it */
    /* called after each output tensor (may be NULL) */
    void (*progress)(void *ctx, int64_t done_bytes, int64_t total_bytes);
    void *progress_ctx;
} pt_quantize_params;

typedef struct pt_quantize_report {
    int n_tensors;             /* tensors written */
    int n_quantized;           /* modules quantized */
    int n_shards;
    int64_t bytes;             /* tensor bytes written */
    int64_t n_params;          /* logical parameters */
    double bits_per_weight;    /* as mlx-lm reports it: stored bits / parameters */
} pt_quantize_report;

/* `out_dir` must not exist or be empty. */
pt_status pt_quantize_model(const char *in_dir, const char *out_dir, const pt_quantize_params *p,
                            pt_quantize_report *report);

/* 1 if `name` is one of mlx-lm's mixed recipes. */
int pt_quantize_recipe_valid(const char *name);

#endif
