/* RoPE inverse-frequency tables from a pt_rope_config, resolved once at load
 * (default, linear, llama3, yarn, longrope, proportional, partial rotary).
 * Computed in fp32 in the same order as transformers' _compute_*_parameters
 * (arange(0, d, 2)/d as float, pow, reciprocal) so the angles match the
 * reference. Not the rotation itself: the backends apply it. */
#ifndef PT_MODEL_ROPE_H
#define PT_MODEL_ROPE_H

#include "model/config.h"
#include "petrel.h"

#include <stdint.h>

typedef struct pt_rope_table {
    int rope_dims;          /* rotate-half width: pairs (i, i + rope_dims/2) */
    float *inv_freq;        /* [rope_dims/2] (malloc'd) */
    float *inv_freq_long;   /* longrope only: [rope_dims/2], else NULL */
    int64_t original_max;   /* longrope switch point (0 = none) */
    float attn_scaling;     /* multiplies cos and sin */
} pt_rope_table;

/* head_dim: the layer's head dim; max_pos: max_position_embeddings (0 = unknown).
 * `what` names the config in messages. */
pt_status pt_rope_table_build(const pt_rope_config *r, int head_dim, int64_t max_pos, const char *what,
                              pt_rope_table *out);
void pt_rope_table_free(pt_rope_table *t);

#endif
