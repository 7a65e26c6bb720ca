/* The loaded model (struct pt_model behind include/petrel.h) and the forward
 * driver's interface.
 *
 * A model is: the backend that runs it, its network (pt_net: every per-layer
 * constant resolved and every weight bound, built once at load from the
 * model spec), its tokenizer and chat template when present, and the
 * generation defaults. The forward pass (llama.c) reads pt_net only; it never
 * looks at config strings or architecture names.
 *
 * Per-session state (KV cache, activation buffers) is pt_fwd_state: sized
 * once at session creation for the context and the prefill chunk, so a
 * decode step allocates nothing.
 *
 * Not here: sampling (runtime/sampler.h), the generate loop
 * (runtime/generate.c), the public API glue (runtime/api.c). */
#ifndef PT_MODEL_MODEL_H
#define PT_MODEL_MODEL_H

#include "petrel.h"

#include "backend/backend.h"

#include <pthread.h>
#include <stdint.h>

struct pt_tokenizer;
struct pt_chat_template;
struct pt_model_dir;
struct pt_tensor_set;
struct pt_model_spec;

/* One decoder layer, every constant resolved. */
typedef struct pt_layer {
    /* attention */
    int n_heads, n_kv, head_dim;
    pt_matrix wq, wk, wv, wo;     /* [n_heads*hd, H], [n_kv*hd, H] x2, [H, n_heads*hd]; q/k/v may carry a bias */
    const void *attn_norm;        /* [H] */
    const void *q_norm, *k_norm;  /* [hd] per-head QK-norm (Qwen3, Gemma 3), NULL if none */
    pt_rms_style norm_style;      /* every block norm: w·x̂ (Llama/Qwen) or (1+w)·x̂ (Gemma) */
    pt_rms_style qk_style;
    int sandwich;                 /* Gemma: post_attn_norm / post_ffn_norm on the branch outputs */
    const void *post_attn_norm, *post_ffn_norm; /* [H], sandwich only */
    pt_rope rope;                 /* inv_freq in backend memory */
    const float *inv_freq_long;   /* longrope: the table used past the original context, else NULL */
    int64_t rope_switch_len;      /* longrope: use inv_freq_long when pos0+T exceeds this */
    float attn_long_scale;        /* attention factor with the long table */
    pt_attn attn;
    /* feed-forward */
    const void *ffn_norm;         /* [H] the FFN's input norm */
    pt_glu_kind glu;              /* SwiGLU or GeGLU (tanh) */
    int is_moe;
    int64_t ffn;                  /* dense intermediate size */
    pt_matrix w_gate, w_up, w_down;
    pt_matrix router;             /* MoE: [E, H] */
    pt_matrix ex_gate, ex_up, ex_down; /* MoE: stacked [E, I, H], [E, I, H], [E, H, I] */
    pt_moe_route route;
    int64_t moe_ffn;
    /* Qwen3.5-MoE shared expert beside the routed ones (sh_ffn 0 = none):
     * y += σ(x·sh_router)·down(act(gate(x))·up(x)) */
    int64_t sh_ffn;
    pt_matrix sh_gate, sh_up, sh_down; /* [S, H], [S, H], [H, S] */
    pt_matrix sh_router;               /* shared_expert_gate [1, H] */
    /* MiniCPM: residual branch scale (scale_depth / sqrt(L)); 1 = plain add */
    float residual_scale;
    /* Gemma 4 */
    int k_eq_v;                   /* no v_proj: V is the raw k_proj output (full layers of 31B / 26B-A4B) */
    int v_norm;                   /* V rows RMS-normalised without a weight */
    int has_layer_scalar;         /* the residual stream is multiplied by layer_scalar after the layer */
    float layer_scalar;
    /* Gemma 4 MoE block: the dense MLP (w_gate/w_up/w_down, ffn) runs beside the experts:
     * y = post_ffn_norm(post_ffn_norm_1(dense(ffn_norm(x))) + post_ffn_norm_2(experts(pre_ffn_norm_2(x)))),
     * routed on rms(x)·router_in_scale (router.scale · H^-0.5, f32) */
    int moe_dense;
    const void *post_ffn_norm_1, *pre_ffn_norm_2, *post_ffn_norm_2; /* [H] */
    const float *router_in_scale; /* [H] f32; NULL = route on ffn_norm(x) */
    int kv_shared;                /* KV-shared: computes only Q, owns no cache, attends over layer kv_src's */
    int kv_src;
    pt_matrix ple_gate, ple_proj; /* per-layer input gate [pd, H] and projection [H, pd]; rows 0 = none */
    const void *ple_post_norm;    /* [H] */
    /* Qwen3.5 (qwen3_5.c): gated attention — wq yields [q | gate] per head
     * ([n_heads·2·hd, H]) and the attention output is multiplied by σ(gate) */
    int attn_gate;
    /* Qwen3.5 Gated DeltaNet mixer in place of attention (qwen3_5.c) */
    int is_linear;
    pt_matrix lin_qkv;            /* [conv_dim, H], conv_dim = 2·Hk·Dk + Hv·Dv */
    pt_matrix lin_z;              /* [Hv·Dv, H] */
    pt_matrix lin_b, lin_a;       /* [Hv, H] */
    pt_matrix lin_out;            /* [H, Hv·Dv] */
    const void *lin_conv;         /* [conv_dim, K] norm_type */
    const void *lin_norm;         /* [Dv] norm_type, plain w */
    int lin_K;
    int64_t lin_conv_dim;
    pt_delta delta;               /* heads, dims, A_log / dt_bias (f32 backend memory) */
} pt_layer;

typedef struct pt_net {
    int n_layers;
    pt_layer *layers;
    int64_t hidden, vocab;
    int max_ctx;                  /* max_position_embeddings */
    float eps;
    pt_ftype norm_type;           /* element type of every norm weight */
    pt_matrix embed;              /* [V, H] */
    float embed_scale;            /* MiniCPM scale_emb; 1 otherwise */
    const void *final_norm;       /* [H] */
    pt_rms_style final_style;
    float final_softcap;          /* Gemma 2: cap·tanh(logits/cap); 0 = none */
    pt_matrix lm_head;            /* [V, H]; the embedding table when tied */
    int tied;
    float logit_scale;            /* MiniCPM 1/(H/dim_model_base); 1 otherwise */
    pt_ftype kv_dtype;            /* KV storage: the activation dtype */
    /* Gemma 4 per-layer inputs (ple_dim 0 = none) */
    int ple_dim;
    pt_matrix ple_embed;          /* [V, L*pd] */
    pt_matrix ple_model_proj;     /* [L*pd, H] */
    const void *ple_proj_norm;    /* [pd] */
    float ple_embed_scale, ple_proj_scale, ple_input_scale;
    /* sizes of the largest buffers */
    int max_heads, max_kv, max_head_dim;
    int64_t max_ffn;              /* largest dense or MoE intermediate size */
    int max_top_k, max_experts;
    /* Gated DeltaNet layers: how many, the largest conv_dim / value dim / Hv */
    int n_linear;
    int64_t max_lin_conv, max_lin_value;
    int max_lin_heads;
} pt_net;

struct pt_model {
    char *dir;
    char *id;                       /* directory basename */
    pt_model_params params;         /* resolved levers */
    pt_device device;               /* the device actually running it */
    pt_backend *be;
    pt_net net;
    struct pt_model_dir *mdir;      /* config.json & co. (owned) */
    struct pt_tensor_set *weights;  /* the mapped tensor set (owned) */
    struct pt_model_spec *spec;     /* the model spec the net was built from (owned) */
    void **owned_list;              /* host copies of converted weights (malloc) */
    int n_owned, cap_owned;
    void **dev_list;                /* backend buffers: norm weights, rope tables */
    int n_dev, cap_dev;
    struct pt_tokenizer *tok;       /* NULL without tokenizer.json */
    struct pt_chat_template *tmpl;  /* NULL without a chat template */
    int32_t *eos;                   /* the eos set */
    size_t n_eos;
    pt_sampling_params gen_defaults;
    char backend_name[128];
    pthread_mutex_t lock;           /* serializes forward passes: the backend's scratch is shared */
    /* Debugging / parity: when set, called with the residual stream after the
     * embedding (layer -1), after each layer, and the final-norm output
     * (layer n_layers, only rows that get logits): x [T, H] at positions
     * pos0.. . Reads backend memory directly, so CPU backend only. */
    void (*hidden_cb)(void *user, int layer, const float *x, int T, int pos0, int64_t H);
    void *hidden_user;
    /* Likewise for MoE layers: the router logits [T, n_experts] of layer `layer`. */
    void (*route_cb)(void *user, int layer, const float *logits, int T, int pos0, int n_experts, int top_k);
    void *route_user;
    /* Continuous batching (runtime/batch.c): the batched decode step's
     * activation buffers, created on first use; batch_free releases them. */
    void *batch;
    void (*batch_free)(struct pt_model *m);
};

/* Per-session forward state. */
typedef struct pt_fwd_state {
    int n_ctx;
    int chunk;                      /* largest T per forward call */
    pt_kv_layer *kv;                /* [n_layers] the caches attention reads now */
    struct pt_kv_cache *cache;      /* their storage and quantized-KV state (runtime/kv_cache.h) */
    /* activations, backend memory, f32: */
    float *x;                       /* [chunk, H] residual stream */
    float *xn;                      /* [chunk, H] normed input of a block */
    float *y;                       /* [chunk, H] output of a block (before the residual add) */
    float *q;                       /* [chunk, max_heads*hd] */
    float *k, *v;                   /* [chunk, max_kv*hd] */
    float *att;                     /* [chunk, max_heads*hd] attention output */
    float *gate, *up, *act;         /* [chunk, max_ffn] projections and act(gate)*up */
    float *rlogits, *rweights;      /* MoE router [chunk, E], weights [chunk, top_k] */
    int32_t *ridx;                  /* [chunk, top_k] */
    int32_t *ids_dev, *pos_dev;     /* [chunk] */
    int32_t *pos_host;              /* [chunk] */
    float *logits;                  /* [logit_rows, V] */
    float *y2, *xr;                 /* [chunk, H] Gemma 4 MoE: second branch output, router input */
    float *ple, *ple2;              /* Gemma 4 per-layer inputs [chunk, L*pd] and scratch */
    float *pg, *pa;                 /* [chunk, pd] per-layer gate and act(gate)·input */
    int logit_rows;
    /* CUDA compiled decode: the captured single-token step, one per RoPE
     * table in use (longrope switches tables past its original context):
     * [use_long] writes st->logits, [2 + use_long] (the pipelined decode's
     * step ahead, pt_fwd_ahead_enqueue) writes logits_ahead; [4 + ...] the
     * same for short steps (at most PT_DEC_SHORT_KEYS keys, captured with
     * that bound in pt_attn.max_keys); [8 + ...] the steps ahead that
     * also sample their greedy id (pt_fwd_ahead_enqueue's sample). */
    struct pt_cuda_graph *graph[16];
    /* the key bound the step being captured passes to attention (0: not
     * capturing, the step's own position + 1; -1: unknown) */
    int64_t keys_bound;
    float *logits_ahead;            /* [V] backend, allocated by the first step ahead */
    /* The greedy sample inside a step ahead (pt_fwd_ahead_enqueue's
     * sample): gs_ctl, backend memory, is its control block (sample.h; its
     * one row: logits_ahead, greedy, the id into ids_dev[0]); ahead_sampled:
     * the step ahead last enqueued samples so; sampled: st->logits are an
     * accepted such step's, its id already in ids_dev[0] and its result in
     * gs_ctl (cleared by every other call that writes st->logits or ids_dev) */
    void *gs_ctl;
    int ahead_sampled, sampled;
    int graph_fused; /* the --fused-decode-attn setting the graphs were captured with */
    /* Gated DeltaNet layers (qwen3_5.c), NULL without any: per layer (NULL
     * for attention layers) the conv state [K-1, conv_dim] and the recurrent
     * state [Hv, Dk, Dv], f32 backend memory; they hold positions < lin_pos
     * (-1: unknown, after a failed call — only a restart at 0 is valid). */
    float **conv_state, **rec_state;
    int64_t lin_pos;
    float *lq;                      /* [chunk, max(conv_dim, 2·n_heads·hd)] */
    float *lo;                      /* [chunk, max(conv_dim, n_heads·hd)] */
    float *lz;                      /* [chunk, value_dim] */
    float *lb, *la;                 /* [chunk, Hv] */
} pt_fwd_state;

/* Sizes the state for n_ctx tokens and reserves the backend's scratch. */
pt_status pt_fwd_init(pt_model *m, pt_fwd_state *st, int n_ctx);
void pt_fwd_free(pt_model *m, pt_fwd_state *st);

/* Runs T (1..st->chunk) tokens at positions pos0..pos0+T-1 (the cache holds
 * positions < pos0). Writes the logits of the last n_logits rows (0..T) to
 * host memory out [n_logits, V]. Ids must already be checked against the
 * vocabulary. Callers hold m->lock. */
pt_status pt_fwd_run(pt_model *m, pt_fwd_state *st, const int32_t *ids, int T, int pos0, int n_logits,
                     float *out);

/* The pipelined decode (CUDA compiled decode, runtime/session.c): a step
 * enqueued before the host knows its token. The GPU sampler writes the id
 * into st->ids_dev[0] and the position into st->pos_dev[0] (on the stream,
 * no host wait); the step runs the captured graph at position pos0 and
 * writes its logits to st->logits_ahead, so st->logits (the logits the id
 * was sampled from) stay intact until the step is accepted:
 *   pt_fwd_ahead_ok       1 when such a step may run at pos0: a CUDA
 *                         compiled decode step (as pt_fwd_run would replay a
 *                         graph), no Qwen3.5 recurrent state (it cannot
 *                         take back a token), no rotating cache that has
 *                         wrapped (the row would replace a stored one),
 *                         pos0 < n_ctx;
 *   pt_fwd_ahead_enqueue  launches it (nothing waits); with sample, the
 *                         step's graph ends with the GPU sampler's greedy
 *                         id of its own logits (no penalties, no
 *                         log-probability: pt_cuda_sample_greedy_launch),
 *                         written into ids_dev[0] for the step after it and
 *                         into st->gs_ctl's result;
 *   pt_fwd_ahead_accept   the host's token was the one the step ran on: the
 *                         logits become st->logits (a device copy, enqueued)
 *                         and the cache's bookkeeping counts pos0 + 1 tokens;
 *                         st->sampled says whether the step sampled its id.
 * A step not accepted needs no undo: its cache row lies at pos0, past the
 * context, where the next token written overwrites it before anything
 * reads it; st->logits were not touched. Callers hold m->lock. */
int pt_fwd_ahead_ok(const pt_model *m, const pt_fwd_state *st, int pos0);
pt_status pt_fwd_ahead_enqueue(pt_model *m, pt_fwd_state *st, int pos0, int sample);
pt_status pt_fwd_ahead_accept(pt_model *m, pt_fwd_state *st, int pos0);

/* Qwen3.5 (qwen3_5.c): binds a Gated DeltaNet layer's mixer weights;
 * sizes / frees the linear states and scratch (called by pt_fwd_init /
 * pt_fwd_free); checks and resets the states at the start of a forward call
 * (begin) and records the positions they hold (end); runs a layer's mixer
 * (gated attention or DeltaNet) from st->xn into st->y. */
struct pt_layer_spec;
struct pt_weight;
pt_status pt_qwen35_bind_linear(pt_model *m, const struct pt_layer_spec *S, pt_layer *L, int l);
pt_status pt_qwen35_fwd_init(pt_model *m, pt_fwd_state *st);
void pt_qwen35_fwd_free(pt_model *m, pt_fwd_state *st);
pt_status pt_qwen35_begin(pt_model *m, pt_fwd_state *st, int pos0);
pt_status pt_qwen35_mixer(pt_model *m, pt_fwd_state *st, const pt_layer *L, int l, int T);
/* forward.c: the per-head q and k norms in place (a NULL weight: that norm
 * is absent; k NULL: no keys of the layer's own), in one backend call where
 * the backend has one (rms_norm2), else two. */
pt_status pt_fwd_qk_norm(pt_model *m, float *q, int64_t Tq, const void *wq, float *k, int64_t Tk, const void *wk,
                         int hd, pt_rms_style style);

/* Weight binding helpers shared by the family builders (llama.c): a matrix
 * of the given shape (prepared for the backend), and a float vector of n
 * elements uploaded as `want` (norm weights: the net's norm_type; f32 tables). */
pt_status pt_net_bind(pt_model *m, pt_matrix *dst, const struct pt_weight *src, int64_t rows, int64_t cols,
                      const char *what);
pt_status pt_net_upload_vec(pt_model *m, const struct pt_weight *w, int64_t n, const void **out, pt_ftype want,
                            const char *what);

/* Continuous batching (runtime/batch.c): n rows, row t the next token of
 * the sequence whose state is seq[t] (its caches), at position pos[t] (host
 * memory; seq[t]'s cache holds the positions before it). */
typedef struct pt_fwd_rows {
    int n;
    pt_fwd_state *const *seq; /* [n], distinct; with kvp, NULL for padding rows */
    const int32_t *pos;       /* [n] host; with kvp, -1 for padding rows */
    /* NULL, or backend memory [n_layers][n][2]: row t's K and V storage of
     * layer l, for the multi-sequence ops (kv_append_rows, attention_rows):
     * then KV append and attention read every row's cache through this
     * table (one op per layer), so a captured step serves any sessions. */
    void *const *kvp;
} pt_fwd_rows;

/* Runs the n rows of r (1..st->chunk) through the network in one pass using
 * st's activation buffers (st's own caches are not touched) and writes row
 * t's logits to host memory outs[t] [V]. Row t's results are bit-identical
 * to pt_fwd_run(seq[t], &ids[t], 1, pos[t], 1): matmuls through the backend's
 * matmul_rows, RoPE / KV append / attention per row on seq[t]. Ids must be
 * checked against the vocabulary. The debugging callbacks are not called.
 * Callers hold m->lock. */
pt_status pt_fwd_run_rows(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, const int32_t *ids,
                          float *const *outs);
/* The batched pass in kvp mode (r->kvp set, uploaded), enqueue only and so
 * capturable into a CUDA graph: ids and positions already in st->ids_dev /
 * st->pos_dev (padding rows: any valid id, position -1); writes the logits
 * of all r->n rows to backend memory logits [n, V]. Does not call
 * pt_kv_cache_step_done (the caller does, per live row). Row t's logits are
 * bit-identical to pt_fwd_run's for its sequence. */
pt_status pt_fwd_rows_enqueue(pt_model *m, pt_fwd_state *st, const pt_fwd_rows *r, float *logits);
/* 1 if pt_fwd_run_rows handles the model: not yet for Qwen3.5's Gated
 * DeltaNet / gated-attention layers (their per-sequence recurrent state is
 * not split by row), which callers then step one session at a time. */
int pt_fwd_rows_supported(const pt_model *m);

/* Copies host bytes into a new backend buffer owned by the model (in its
 * dev_list, freed with it; llama.c). */
pt_status pt_model_upload(pt_model *m, const void *src, size_t bytes, const void **out);

/* Builds m->net from the spec and weights (llama.c); frees it. */
pt_status pt_net_build(pt_model *m);
void pt_net_free(pt_model *m);

/* Bytes of weights one decode step reads (MoE: the router plus top_k of
 * E experts' share), and bytes of KV cache per token of context. */
int64_t pt_net_decode_bytes(const pt_net *n);
int64_t pt_net_kv_bytes_per_token(const pt_net *n);

/* A model of a published shape with random weights (synthetic.c):
 * name "llama-3.2-1b", quant "q4" | "q8" | "bf16". */
pt_status pt_model_synthetic(const char *name, const char *quant, const pt_model_params *params, pt_model **out);
/* The known synthetic names, for messages. */
const char *pt_synthetic_names(void);

/* Loads everything (model.c). */
pt_status pt_model_load_impl(const char *dir, const pt_model_params *params, pt_model **out);
/* m->backend_name for a model on the CPU backend m->be with nth threads:
 * ISA, threads, activations, arch and the 4/8-bit kernels in use. */
void pt_model_cpu_backend_name(pt_model *m, int nth, pt_act_dtype act, const char *arch);

#endif
