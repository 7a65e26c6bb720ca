/* A synthetic Llama-shaped decode step built from the backend's op table,
 * for the CUDA tests (graph replay bit-identical to eager execution) and the
 * benchmark (eager vs compiled decode on real model shapes). Random MLX
 * quantized weights; one fused qkv and one fused gate|up projection per
 * layer; the token id and position live in backend memory so a captured
 * step replays with new ones. Not a model: no tokenizer, no real weights.
 * Header-only, shared by test_cuda_ops.c and bench_cuda_ops.c. */
#ifndef PT_TESTS_CUDA_MINI_DECODE_H
#define PT_TESTS_CUDA_MINI_DECODE_H

#include "backend/backend.h"
#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, ffn, vocab, bits, group;
    int64_t ctx;
} mini_shape;

typedef struct {
    mini_shape s;
    pt_backend *be;
    pt_matrix embed, lm_head;
    pt_matrix *qkv, *o, *gu, *down; /* [layers] */
    void *norm_w;                   /* [hidden] bf16 (shared by every norm) */
    float *inv_freq;                /* [head_dim/2] */
    pt_kv_layer *kv;                /* [layers] */
    int32_t *id, *pos, *out_id;     /* backend memory, 1 each */
    float *x, *res, *h, *qkvb, *att, *gub, *ffb, *logits;
} mini_model;

static uint64_t mini_rng = 0x9e3779b97f4a7c15ull;
static inline uint32_t mini_u32(void) {
    mini_rng ^= mini_rng << 13;
    mini_rng ^= mini_rng >> 7;
    mini_rng ^= mini_rng << 17;
    return (uint32_t)(mini_rng >> 11);
}

/* A quantized [rows, cols] matrix with random codes; scales small enough that
 * activations stay O(1) through many layers. */
static inline pt_status mini_weight(pt_backend *be, pt_matrix *w, int64_t rows, int64_t cols, int bits, int gs) {
    memset(w, 0, sizeof *w);
    w->rows = rows, w->cols = cols, w->dtype = PT_FT_BF16, w->bits = bits, w->group_size = gs;
    size_t words = (size_t)rows * cols * bits / 32, ng = (size_t)rows * cols / gs;
    uint32_t *d = malloc(words * 4);
    uint16_t *sc = malloc(ng * 2), *bi = malloc(ng * 2);
    if (!d || !sc || !bi) return pt_error(PT_ERR_NOMEM, "mini model: host memory");
    for (size_t i = 0; i < words; i++) d[i] = mini_u32() ^ (mini_u32() << 16);
    float amp = 1.0f / sqrtf((float)cols) / (float)((1 << bits) - 1) * 3.0f;
    for (size_t i = 0; i < ng; i++) {
        sc[i] = pt_f32_to_bf16(amp * (0.5f + (float)(mini_u32() % 1000) / 1000.0f));
        bi[i] = pt_f32_to_bf16(-pt_bf16_to_f32(sc[i]) * (float)((1 << bits) - 1) / 2);
    }
    w->data = d, w->scales = sc, w->biases = bi;
    pt_status st = be->ops->prepare_weight(be, w, "mini");
    free(d), free(sc), free(bi);
    w->data = w->scales = w->biases = NULL;
    return st;
}

static inline void *mini_buf(pt_backend *be, size_t bytes) { return be->ops->alloc(be, bytes); }

static inline pt_status mini_init(mini_model *m, pt_backend *be, const mini_shape *s) {
    memset(m, 0, sizeof *m);
    m->s = *s;
    m->be = be;
    int L = s->layers, H = s->hidden, D = s->head_dim;
    int qkv_rows = (s->heads + 2 * s->kv_heads) * D;
    m->qkv = calloc(L, sizeof(pt_matrix)), m->o = calloc(L, sizeof(pt_matrix));
    m->gu = calloc(L, sizeof(pt_matrix)), m->down = calloc(L, sizeof(pt_matrix));
    m->kv = calloc(L, sizeof(pt_kv_layer));
    PT_TRY(mini_weight(be, &m->embed, s->vocab, H, s->bits, s->group));
    PT_TRY(mini_weight(be, &m->lm_head, s->vocab, H, s->bits, s->group));
    for (int l = 0; l < L; l++) {
        PT_TRY(mini_weight(be, &m->qkv[l], qkv_rows, H, s->bits, s->group));
        PT_TRY(mini_weight(be, &m->o[l], H, s->heads * D, s->bits, s->group));
        PT_TRY(mini_weight(be, &m->gu[l], 2 * (int64_t)s->ffn, H, s->bits, s->group));
        PT_TRY(mini_weight(be, &m->down[l], H, s->ffn, s->bits, s->group));
        pt_kv_layer *kv = &m->kv[l];
        kv->n_kv = s->kv_heads, kv->head_dim = D, kv->capacity = s->ctx, kv->dtype = PT_FT_BF16;
        size_t kb = (size_t)s->kv_heads * s->ctx * D * 2;
        kv->k = mini_buf(be, kb), kv->v = mini_buf(be, kb);
        if (!kv->k || !kv->v) return PT_ERR_NOMEM;
    }
    uint16_t *nw = malloc((size_t)H * 2);
    for (int i = 0; i < H; i++) nw[i] = pt_f32_to_bf16(0.8f + (float)(mini_u32() % 400) / 1000.0f);
    m->norm_w = mini_buf(be, (size_t)H * 2);
    PT_TRY(be->ops->upload(be, m->norm_w, nw, (size_t)H * 2));
    free(nw);
    float *inv = malloc((size_t)D / 2 * 4);
    for (int i = 0; i < D / 2; i++) inv[i] = powf(500000.0f, -2.0f * i / D);
    m->inv_freq = mini_buf(be, (size_t)D / 2 * 4);
    PT_TRY(be->ops->upload(be, m->inv_freq, inv, (size_t)D / 2 * 4));
    free(inv);
    m->id = mini_buf(be, 4), m->pos = mini_buf(be, 4), m->out_id = mini_buf(be, 4);
    m->x = mini_buf(be, (size_t)H * 4), m->res = mini_buf(be, (size_t)H * 4), m->h = mini_buf(be, (size_t)H * 4);
    m->qkvb = mini_buf(be, (size_t)qkv_rows * 4), m->att = mini_buf(be, (size_t)s->heads * D * 4);
    m->gub = mini_buf(be, (size_t)s->ffn * 8), m->ffb = mini_buf(be, (size_t)s->ffn * 4);
    m->logits = mini_buf(be, (size_t)s->vocab * 4);
    if (!m->logits) return PT_ERR_NOMEM;
    pt_backend_limits lim = {.max_tokens = 1, .max_ctx = s->ctx, .max_heads = s->heads, .max_head_dim = D,
                             .max_cols = s->ffn > H ? s->ffn : H};
    return be->ops->reserve(be, &lim);
}

/* One decode step: reads m->id and m->pos, writes m->logits and m->out_id.
 * Enqueues only (capturable): no synchronization inside. */
static inline pt_status mini_step(mini_model *m) {
    pt_backend *be = m->be;
    const pt_backend_ops *op = be->ops;
    const mini_shape *s = &m->s;
    int H = s->hidden, D = s->head_dim, nq = s->heads * D, nk = s->kv_heads * D;
    pt_rope rope = {D, m->inv_freq, 1.0f};
    pt_attn at = {.n_heads = s->heads, .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
    PT_TRY(op->embed(be, m->res, m->id, 1, &m->embed, 1.0f));
    /* zero residual add for layer 0: res holds the embedding, x = 0 */
    PT_TRY(op->scale(be, m->x, m->res, 0.0f, H));
    for (int l = 0; l < s->layers; l++) {
        PT_TRY(op->rms_norm(be, m->h, m->x, m->res, 1, H, m->norm_w, PT_FT_BF16, PT_RMS_W, 1e-5f));
        PT_TRY(op->matmul(be, m->qkvb, m->h, 1, &m->qkv[l], 0));
        PT_TRY(op->rope(be, m->qkvb, 1, s->heads, D, m->pos, &rope));
        PT_TRY(op->rope(be, m->qkvb + nq, 1, s->kv_heads, D, m->pos, &rope));
        PT_TRY(op->kv_append(be, &m->kv[l], m->qkvb + nq, m->qkvb + nq + nk, 1, m->pos));
        PT_TRY(op->attention(be, m->att, m->qkvb, 1, m->pos, &m->kv[l], &at));
        PT_TRY(op->matmul(be, m->x, m->att, 1, &m->o[l], 0));
        PT_TRY(op->rms_norm(be, m->h, m->x, m->res, 1, H, m->norm_w, PT_FT_BF16, PT_RMS_W, 1e-5f));
        PT_TRY(op->matmul(be, m->gub, m->h, 1, &m->gu[l], 0));
        PT_TRY(op->glu(be, m->ffb, m->gub, m->gub + s->ffn, 1, s->ffn, 2 * (int64_t)s->ffn, PT_GLU_SILU));
        PT_TRY(op->matmul(be, m->x, m->ffb, 1, &m->down[l], 0));
    }
    PT_TRY(op->rms_norm(be, m->h, m->x, m->res, 1, H, m->norm_w, PT_FT_BF16, PT_RMS_W, 1e-5f));
    PT_TRY(op->matmul(be, m->logits, m->h, 1, &m->lm_head, 0));
    return op->argmax(be, m->out_id, m->logits, 1, s->vocab);
}

/* Weight + KV bytes one step reads at context length n (the roofline). */
static inline double mini_bytes(const mini_shape *s, int64_t n) {
    double per_val = s->bits / 8.0 + 4.0 / s->group; /* codes + bf16 scale and bias */
    double H = s->hidden, D = s->head_dim;
    double layer = ((s->heads + 2.0 * s->kv_heads) * D * H + H * s->heads * D + 2.0 * s->ffn * H + H * s->ffn) * per_val;
    return s->layers * (layer + 2.0 * s->kv_heads * D * 2 * (double)n) + s->vocab * H * per_val + H * per_val;
}

static inline void mini_free(mini_model *m) {
    pt_backend *be = m->be;
    if (!be) return;
    be->ops->release_weight(be, &m->embed);
    be->ops->release_weight(be, &m->lm_head);
    for (int l = 0; l < m->s.layers; l++) {
        if (m->qkv) be->ops->release_weight(be, &m->qkv[l]);
        if (m->o) be->ops->release_weight(be, &m->o[l]);
        if (m->gu) be->ops->release_weight(be, &m->gu[l]);
        if (m->down) be->ops->release_weight(be, &m->down[l]);
        if (m->kv) be->ops->dealloc(be, m->kv[l].k), be->ops->dealloc(be, m->kv[l].v);
    }
    void *bufs[] = {m->norm_w, m->inv_freq, m->id, m->pos, m->out_id, m->x, m->res, m->h,
                    m->qkvb, m->att, m->gub, m->ffb, m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->dealloc(be, bufs[i]);
    free(m->qkv), free(m->o), free(m->gu), free(m->down), free(m->kv);
    memset(m, 0, sizeof *m);
}

#endif
