/* Per-session KV cache management: which layers get a cache, how large it is
 * (full or rotating), and the quantized-KV life cycle of DESIGN.md
 * "Quantized KV, exactly".
 *
 * For every layer that owns a cache this allocates:
 *   - a full-precision cache (the activation dtype). Its capacity is the
 *     context length for full-attention layers and window + prefill chunk - 1
 *     for sliding-window layers (a ring: position p lives in slot p % capacity,
 *     the backend's KV layout), whichever is smaller;
 *   - for a layer that --kv-quant selects, a quantized cache of the same
 *     capacity (MLX affine codes over head_dim in groups, scales and biases in
 *     the activation dtype). Its full-precision cache then only has to hold
 *     the rows written before the conversion: min(capacity,
 *     quantized_kv_start + chunk) rows.
 * st->kv[l] is the cache attention reads. It starts as the full-precision
 * one; pt_kv_cache_step_done (called after every forward step) converts every
 * selected layer whole once the cache holds at least quantized_kv_start
 * tokens, and from then on st->kv[l] is the quantized cache, whose new rows
 * the backend quantizes as kv_append writes them.
 *
 * What it is not: no attention arithmetic (the backend's attention and
 * kv_append/kv_quantize ops), no token bookkeeping (session.c). */
#ifndef PT_RUNTIME_KV_CACHE_H
#define PT_RUNTIME_KV_CACHE_H

#include "model/model.h"

typedef struct pt_kv_cache {
    int n_layers;
    int start;          /* --quantized-kv-start */
    int any_quant;      /* some layer is selected for quantization */
    int converted;      /* the selected layers read their quantized caches */
    int64_t high;       /* the most positions written since the last truncation */
    pt_kv_layer *fp;    /* [n_layers] full-precision caches (k == NULL: no cache) */
    pt_kv_layer *qz;    /* [n_layers] quantized caches (bits == 0: layer not selected) */
} pt_kv_cache;

/* Bits --kv-quant gives layer l of the model (0 = full precision) and the
 * group size it uses. */
void pt_kv_layer_quant(const pt_model *m, int l, int *bits, int *group_size);

/* Capacity (rows per KV head) of layer l's cache for a context of n_ctx
 * tokens prefilled in chunks of `chunk`. */
int64_t pt_kv_layer_capacity(const pt_net *n, int l, int n_ctx, int chunk);

/* Allocates the caches of every layer and points st->kv at the live ones
 * (st->kv must be a zeroed [n_layers] array). */
pt_status pt_kv_cache_init(pt_model *m, pt_kv_cache *c, pt_kv_layer *live, int n_ctx, int chunk);
void pt_kv_cache_free(pt_model *m, pt_kv_cache *c);

/* After a forward step that left n_tokens positions in the cache: converts
 * the selected layers once n_tokens >= start (DESIGN.md). */
pt_status pt_kv_cache_step_done(pt_model *m, pt_kv_cache *c, pt_kv_layer *live, int64_t n_tokens);

/* The session drops to n_keep tokens. n_keep == 0 returns every layer to
 * its full-precision cache (a fresh start quantizes again at `start`);
 * otherwise the converted layers stay quantized (their rows are what the
 * kept positions were attended with). A rotating cache has overwritten the
 * rows of old positions with newer ones: when the window of position n_keep
 * is no longer all there, this fails with PT_ERR_RANGE and changes nothing
 * (the caller starts over from 0). */
pt_status pt_kv_cache_truncate(const pt_model *m, pt_kv_cache *c, pt_kv_layer *live, int64_t n_keep);

#endif
