/* KV cache management for a session: full and rotating caches, and the
 * quantized-KV conversion of DESIGN.md "Quantized KV, exactly". See
 * kv_cache.h for the life cycle; the arithmetic (kv_append, kv_quantize,
 * attention) is the backend's. */
#include "runtime/kv_cache.h"

#include "base/error.h"
#include "base/log.h"
#include "model/spec.h"

#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->be->ops)

void pt_kv_layer_quant(const pt_model *m, int l, int *bits, int *group_size) {
    const pt_model_params *p = &m->params;
    *bits = 0;
    *group_size = p->kv_group_size > 0 ? p->kv_group_size : 64;
    if (p->kv_quant == 4 || p->kv_quant == 8) {
        *bits = p->kv_quant;
    } else if (p->kv_quant == PT_KV_QUANT_CONFIG && m->spec && l < m->spec->n_layers) {
        const pt_layer_spec *S = &m->spec->layers[l];
        *bits = S->kv_config_bits;
        if (S->kv_config_bits) *group_size = S->kv_config_group_size;
    }
}

int64_t pt_kv_layer_capacity(const pt_net *n, int l, int n_ctx, int chunk) {
    const pt_layer *L = &n->layers[l];
    int64_t cap = n_ctx;
    /* a ring: every query of a chunk of `chunk` rows still finds its whole
     * window after the chunk's newest row was written */
    if (L->attn.window > 0 && (int64_t)L->attn.window + chunk - 1 < cap) cap = (int64_t)L->attn.window + chunk - 1;
    return cap;
}

static void *balloc(pt_model *m, size_t bytes, pt_status *st) {
    if (*st != PT_OK) return NULL;
    void *p = OPS(m)->alloc(m->be, bytes ? bytes : 64);
    if (!p) *st = pt_error_prefix(PT_ERR_NOMEM, "allocating %zu bytes of KV cache", bytes);
    return p;
}

static void free_layer(pt_model *m, pt_kv_layer *kv) {
    void *bufs[] = {kv->k, kv->v, kv->k_scales, kv->k_biases, kv->v_scales, kv->v_biases};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) OPS(m)->dealloc(m->be, bufs[i]);
    memset(kv, 0, sizeof *kv);
}

pt_status pt_kv_cache_init(pt_model *m, pt_kv_cache *c, pt_kv_layer *live, int n_ctx, int chunk) {
    const pt_net *n = &m->net;
    memset(c, 0, sizeof *c);
    c->n_layers = n->n_layers;
    c->start = m->params.quantized_kv_start > 0 ? m->params.quantized_kv_start : 0;
    c->fp = calloc((size_t)n->n_layers, sizeof *c->fp);
    c->qz = calloc((size_t)n->n_layers, sizeof *c->qz);
    if (!c->fp || !c->qz) {
        pt_kv_cache_free(m, c);
        return pt_error(PT_ERR_NOMEM, "out of memory for the KV cache descriptors");
    }
    const size_t esz = pt_ftype_size(n->kv_dtype);
    pt_status s = PT_OK;
    for (int l = 0; l < n->n_layers && s == PT_OK; l++) {
        const pt_layer *L = &n->layers[l];
        if (L->kv_shared) continue; /* KV-shared: reads its donor's cache, owns none */
        int64_t cap = pt_kv_layer_capacity(n, l, n_ctx, chunk);
        int bits, gs;
        pt_kv_layer_quant(m, l, &bits, &gs);
        if (bits) {
            if (gs <= 0 || L->head_dim % gs) {
                s = pt_error(PT_ERR_INVALID_ARG,
                             "--kv-group-size %d does not divide layer %d's head_dim %d (quantized KV groups run "
                             "over head_dim)",
                             gs, l, L->head_dim);
                break;
            }
            pt_kv_layer *q = &c->qz[l];
            q->n_kv = L->n_kv;
            q->head_dim = L->head_dim;
            q->capacity = cap;
            q->dtype = n->kv_dtype;
            q->bits = bits;
            q->group_size = gs;
            size_t rows = (size_t)L->n_kv * (size_t)cap;
            size_t codes = rows * (size_t)L->head_dim * (size_t)bits / 8, par = rows * (size_t)(L->head_dim / gs) * esz;
            q->k = balloc(m, codes, &s);
            q->v = balloc(m, codes, &s);
            q->k_scales = balloc(m, par, &s);
            q->k_biases = balloc(m, par, &s);
            q->v_scales = balloc(m, par, &s);
            q->v_biases = balloc(m, par, &s);
            c->any_quant = 1;
            /* the full-precision cache only holds the rows before the
             * conversion: it happens after the step that reaches `start`,
             * so every such row is below start + chunk */
            if ((int64_t)c->start + chunk < cap) cap = (int64_t)c->start + chunk;
        }
        pt_kv_layer *f = &c->fp[l];
        f->n_kv = L->n_kv;
        f->head_dim = L->head_dim;
        f->capacity = cap;
        f->dtype = n->kv_dtype;
        size_t bytes = (size_t)L->n_kv * (size_t)cap * (size_t)L->head_dim * esz;
        f->k = balloc(m, bytes, &s);
        f->v = balloc(m, bytes, &s);
        live[l] = *f;
    }
    if (s != PT_OK) {
        pt_kv_cache_free(m, c);
        return s;
    }
    if (m->params.kv_quant == PT_KV_QUANT_CONFIG && !c->any_quant)
        PT_LOGW("--kv-quant config: no kv_config.json entry selects a layer of this model; the KV cache stays "
                "full precision");
    return PT_OK;
}

void pt_kv_cache_free(pt_model *m, pt_kv_cache *c) {
    for (int l = 0; l < c->n_layers; l++) {
        if (c->fp) free_layer(m, &c->fp[l]);
        if (c->qz) free_layer(m, &c->qz[l]);
    }
    free(c->fp);
    free(c->qz);
    memset(c, 0, sizeof *c);
}

pt_status pt_kv_cache_step_done(pt_model *m, pt_kv_cache *c, pt_kv_layer *live, int64_t n_tokens) {
    if (n_tokens > c->high) c->high = n_tokens;
    if (!c->any_quant || c->converted || n_tokens < c->start) return PT_OK;
    for (int l = 0; l < c->n_layers; l++) {
        pt_kv_layer *q = &c->qz[l];
        if (!q->bits) continue;
        /* the rows still in both caches: all of them for a full cache, the
         * ring's last `capacity` positions for a rotating one */
        int64_t keep = q->capacity < c->fp[l].capacity ? q->capacity : c->fp[l].capacity;
        int64_t p0 = n_tokens > keep ? n_tokens - keep : 0;
        PT_TRY(OPS(m)->kv_quantize(m->be, q, &c->fp[l], p0, n_tokens));
        live[l] = *q;
    }
    c->converted = 1;
    return PT_OK;
}

pt_status pt_kv_cache_truncate(const pt_model *m, pt_kv_cache *c, pt_kv_layer *live, int64_t n_keep) {
    if (n_keep > 0) {
        for (int l = 0; l < c->n_layers; l++) {
            const pt_kv_layer *kv = &live[l];
            int W = m->net.layers[l].attn.window;
            if (!kv->k || kv->capacity >= c->high) continue; /* nothing was overwritten */
            /* the next query (position n_keep) needs positions from
             * n_keep - W + 1 on (all of them without a window); position p's
             * slot was reused by p + capacity if that was written */
            int64_t oldest = W > 0 && n_keep - W + 1 > 0 ? n_keep - W + 1 : 0;
            if (oldest + kv->capacity < c->high)
                return pt_error(PT_ERR_RANGE,
                                "cannot keep %lld tokens: layer %d's rotating KV cache (%lld rows) has already "
                                "overwritten position %lld with position %lld",
                                (long long)n_keep, l, (long long)kv->capacity, (long long)oldest,
                                (long long)(oldest + kv->capacity));
        }
        c->high = n_keep;
        return PT_OK;
    }
    c->high = 0;
    if (c->converted)
        for (int l = 0; l < c->n_layers; l++) live[l] = c->fp[l];
    c->converted = 0;
    return PT_OK;
}
