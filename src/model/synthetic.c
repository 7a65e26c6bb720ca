/* Synthetic models for `petrel bench --synthetic NAME --quant q4|q8|bf16`:
 * the real shapes of published models (../shared/reference/performance.md,
 * gemma-3-4b with its 5:1 sliding (1024) / full pattern and Gemma block,
 * gemma-4-e4b with the Gemma 4 block: per-layer inputs, KV sharing, 512-wide
 * full-attention heads; confirmed against the families' published
 * config.json files, numbers in bench/RESULTS.md) with random
 * weights, built straight into pt_net. Speed does not depend on the weight
 * values, so these measure what a real checkpoint of that shape would run at
 * without downloading one. Not a model: the text it would generate is noise.
 *
 * Quantized variants use MLX affine layout, group size 64, for every matrix
 * including the embedding (as mlx-community checkpoints do); bf16 variants
 * store bf16 matrices and run bf16 activations. */
#include "model/model.h"

#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"
#include "base/threadpool.h"
#include "runtime/levers.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct synth_shape {
    const char *name;
    int hidden, layers, heads, kv, head_dim, ffn, vocab, tied, qk_norm;
    double theta;
    int experts, top_k, moe_ffn; /* 0 = dense */
    int cpu;                     /* runs on the CPU (memory) */
    int gemma;                   /* Gemma 3 block: (1+w) sandwich norms, GeGLU, sqrt(H) embedding scale */
    int window, full_every;      /* sliding window and full-attention period (layer i full iff (i+1) % n == 0) */
    /* Gemma 4 block (plain-weight f32 norms, v_norm, attention scale 1, layer scalars, final soft-cap): the
     * full-attention head size, per-layer input width, KV-shared layers (the last n), final soft-cap */
    int gemma4, global_head_dim, ple_dim, kv_shared;
    float softcap;
    /* Qwen3.5 hybrid (qwen3_5.c): Gated DeltaNet layers with lin_kh key / lin_vh value heads of lin_kd / lin_vd,
     * conv kernel 4, and every full_every-th layer gated full attention with partial RoPE (head_dim / 4) */
    int qwen35, lin_kh, lin_vh, lin_kd, lin_vd;
} synth_shape;

static const synth_shape shapes[] = {
    {"llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, 1, 0, 500000.0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"llama-3.2-3b", 3072, 28, 24, 8, 128, 8192, 128256, 1, 0, 500000.0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, 0, 0, 500000.0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-4b", 2560, 36, 32, 8, 128, 9728, 151936, 1, 1, 1000000.0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-30b-a3b", 2048, 48, 32, 4, 128, 0, 151936, 0, 1, 1000000.0, 128, 8, 768, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"gemma-3-4b", 2560, 34, 8, 4, 256, 10240, 262208, 1, 1, 1000000.0, 0, 0, 0, 1, 1, 1024, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* google/gemma-4-E4B text_config: 42 layers (5 sliding (512) : 1 full), 8 heads / 2 KV heads, head_dim 256,
     * global_head_dim 512, intermediate 10240 (no double-wide MLP), vocab 262144 (per-layer vocab too), per-layer
     * inputs 256 wide, the last 18 layers KV-shared, final soft-cap 30, tied, no K=V */
    {"gemma-4-e4b", 2560, 42, 8, 2, 256, 10240, 262144, 1, 1, 10000.0, 0, 0, 0, 1, 0, 512, 6, 1, 512, 256, 18, 30.0f, 0,
     0, 0, 0, 0},
    /* Qwen/Qwen3.5-4B text_config: 32 layers (3 Gated DeltaNet : 1 gated full attention), 16 heads / 4 KV heads,
     * head_dim 256 (partial RoPE 0.25, theta 1e7), intermediate 9216, linear heads 16 key / 32 value of 128,
     * conv kernel 4, vocab 248320, tied */
    {"qwen3.5-4b", 2560, 32, 16, 4, 256, 9216, 248320, 1, 1, 10000000.0, 0, 0, 0, 1, 0, 0, 4, 0, 0, 0, 0, 0, 1, 16,
     32, 128, 128},
};

const char *pt_synthetic_names(void) {
    return "llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen3-4b, qwen3.5-4b, gemma-3-4b, gemma-4-e4b, qwen3-30b-a3b "
           "(GPU only)";
}

static uint64_t xs(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

typedef struct {
    pt_model *m;
    int bits; /* 0 = bf16 */
    uint64_t seed;
} synth_ctx;

static void *own_alloc(pt_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 256;
        void **nl = realloc(m->owned_list, (size_t)cap * sizeof *nl);
        if (!nl) return NULL;
        m->owned_list = nl;
        m->cap_owned = cap;
    }
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p) m->owned_list[m->n_owned++] = p;
    return p;
}

/* Random fill of a weight: chunks of SYNTH_CHUNK values, each from its own
 * xorshift state (a mix of the weight's seed and the chunk's index), spread
 * over up to SYNTH_THREADS threads. The values depend on the seed alone, not
 * on the thread count (a 30B-parameter bf16 shape was minutes on one core). */
#define SYNTH_CHUNK ((size_t)1 << 20)
#define SYNTH_THREADS 16

typedef struct {
    void *p;
    size_t n;          /* values: 64-bit words (bf16 == 0) or bf16 values */
    int bf16;
    float center, amp; /* bf16: around center with spread amp */
    uint64_t seed;
    int nth, ith;
} synth_fill;

static uint64_t chunk_state(uint64_t seed, size_t chunk) {
    uint64_t z = seed + (chunk + 1) * 0x9e3779b97f4a7c15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 0x2545f4914f6cdd1dull; /* xorshift needs a nonzero state */
}

static void *synth_fill_run(void *arg) {
    const synth_fill *f = arg;
    const size_t nchunks = (f->n + SYNTH_CHUNK - 1) / SYNTH_CHUNK;
    for (size_t c = (size_t)f->ith; c < nchunks; c += (size_t)f->nth) {
        uint64_t s = chunk_state(f->seed, c);
        const size_t b = c * SYNTH_CHUNK, e = b + SYNTH_CHUNK < f->n ? b + SYNTH_CHUNK : f->n;
        if (!f->bf16) {
            uint64_t *d = f->p;
            for (size_t i = b; i < e; i++) d[i] = xs(&s);
            continue;
        }
        uint16_t *d = f->p;
        for (size_t i = b; i < e; i++) {
            float u = (float)((xs(&s) >> 40) & 0xffffff) / 16777216.0f;
            d[i] = pt_f32_to_bf16(f->center + f->amp * (2 * u - 1));
        }
    }
    return NULL;
}

static void fill_par(void *p, size_t n, int bf16, float center, float amp, uint64_t seed) {
    const size_t nchunks = (n + SYNTH_CHUNK - 1) / SYNTH_CHUNK;
    int nth = pt_cpu_count();
    if (nth > SYNTH_THREADS) nth = SYNTH_THREADS;
    if ((size_t)nth > nchunks) nth = (int)nchunks;
    if (nth < 1) nth = 1;
    synth_fill f[SYNTH_THREADS];
    pthread_t th[SYNTH_THREADS];
    int started[SYNTH_THREADS] = {0};
    for (int t = 0; t < nth; t++) {
        f[t] = (synth_fill){p, n, bf16, center, amp, seed, nth, t};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, synth_fill_run, &f[t]) == 0;
    }
    synth_fill_run(&f[0]);
    for (int t = 1; t < nth; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else synth_fill_run(&f[t]); /* no thread: the same chunks here */
    }
}

/* Random 16-bit floats around `center` with spread `amp`. */
static void fill_bf16(uint16_t *p, size_t n, float center, float amp, uint64_t *s) {
    fill_par(p, n, 1, center, amp, xs(s));
}

/* A random weight of the given role (pt_matrix.role), prepared on the model's backend. */
static pt_status synth_weight_as(synth_ctx *c, pt_matrix *w, int64_t E, int64_t rows, int64_t cols, const char *what,
                                 int role) {
    memset(w, 0, sizeof *w);
    w->role = role;
    w->rows = rows;
    w->cols = cols;
    w->n_experts = E;
    int64_t ne = E > 0 ? E : 1;
    w->dtype = PT_FT_BF16;
    uint64_t s = c->seed += 0x9e3779b97f4a7c15ull;
    if (c->bits) {
        w->bits = c->bits;
        w->group_size = 64;
        size_t words = (size_t)(ne * rows * (cols * c->bits / 32));
        size_t groups = (size_t)(ne * rows * (cols / 64));
        uint64_t *d = own_alloc(c->m, words * 4 + 8);
        uint16_t *sc = own_alloc(c->m, groups * 2), *bi = own_alloc(c->m, groups * 2);
        if (!d || !sc || !bi) return pt_error(PT_ERR_NOMEM, "synthetic %s: out of memory", what);
        fill_par(d, (words + 1) / 2, 0, 0, 0, xs(&s));
        /* codes q in [0, 2^bits): w = scale*q + bias spans about [-0.05, 0.05] */
        float amp = 0.1f / (float)((1 << c->bits) - 1);
        fill_bf16(sc, groups, amp, amp * 0.1f, &s);
        fill_bf16(bi, groups, -0.05f, 0.005f, &s);
        w->data = d;
        w->scales = sc;
        w->biases = bi;
    } else {
        size_t n = (size_t)(ne * rows * cols);
        uint16_t *d = own_alloc(c->m, n * 2);
        if (!d) return pt_error(PT_ERR_NOMEM, "synthetic %s: out of memory (%zu bytes)", what, n * 2);
        fill_bf16(d, n, 0, 0.05f, &s);
        w->data = d;
    }
    return c->m->be->ops->prepare_weight(c->m->be, w, what);
}

static pt_status synth_weight(synth_ctx *c, pt_matrix *w, int64_t E, int64_t rows, int64_t cols, const char *what) {
    return synth_weight_as(c, w, E, rows, cols, what, PT_ROLE_NONE);
}

static pt_status synth_vec(synth_ctx *c, int64_t n, float value, const void **out) {
    uint16_t *h = malloc((size_t)n * 2);
    if (!h) return pt_error(PT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) h[i] = pt_f32_to_bf16(value);
    pt_status st = pt_model_upload(c->m, h, (size_t)n * 2, out);
    free(h);
    return st;
}

/* A RoPE inverse-frequency table of hd/2 entries in backend memory: the
 * first `rot` pairs 1/theta^(2i/hd), the others 0 (identity pairs). */
static pt_status rope_table(pt_model *m, int hd, double theta, int rot, const void **out) {
    int half = hd / 2;
    float *inv = malloc((size_t)half * sizeof *inv);
    if (!inv) return pt_error(PT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < half; i++) inv[i] = i < rot ? 1.0f / powf((float)theta, (float)(2 * i) / (float)hd) : 0.0f;
    pt_status st = pt_model_upload(m, inv, (size_t)half * 4, out);
    free(inv);
    return st;
}

/* Layer l of a Gemma 4 shape (E2B/E4B style): full attention iff (l+1) %
 * full_every == 0, with global_head_dim and proportional RoPE; sliding
 * layers window `window`; q/k norms and plain-weight f32 block norms at
 * weight 1; v_norm; scale 1; the last kv_shared layers own no K/V and read
 * the last non-shared layer of their type; per-layer input gate; layer
 * scalar 1. */
static pt_status gemma4_layer(synth_ctx *c, const synth_shape *sh, int l, const void *inv_sl, const void *inv_full) {
    pt_net *n = &c->m->net;
    pt_layer *L = &n->layers[l];
    const int64_t H = sh->hidden;
    const int full = (l + 1) % sh->full_every == 0, first_shared = sh->layers - sh->kv_shared;
    L->n_heads = sh->heads;
    L->n_kv = sh->kv;
    L->head_dim = full ? sh->global_head_dim : sh->head_dim;
    const int64_t qd = (int64_t)L->n_heads * L->head_dim, kd = (int64_t)L->n_kv * L->head_dim;
    L->residual_scale = 1.0f;
    L->norm_style = L->qk_style = PT_RMS_W_F32;
    L->sandwich = 1;
    L->glu = PT_GLU_GELU_TANH;
    L->v_norm = 1;
    L->has_layer_scalar = 1;
    L->layer_scalar = 1.0f;
    PT_TRY(synth_vec(c, H, 1.0f, &L->attn_norm));
    PT_TRY(synth_vec(c, H, 1.0f, &L->post_attn_norm));
    PT_TRY(synth_vec(c, H, 1.0f, &L->ffn_norm));
    PT_TRY(synth_vec(c, H, 1.0f, &L->post_ffn_norm));
    PT_TRY(synth_vec(c, L->head_dim, 1.0f, &L->q_norm));
    PT_TRY(synth_weight_as(c, &L->wq, 0, qd, H, "q_proj", PT_ROLE_ATTN_IN));
    if (l >= first_shared) {
        L->kv_shared = 1;
        L->kv_src = -1;
        for (int d = first_shared - 1; d >= 0 && L->kv_src < 0; d--)
            if (((d + 1) % sh->full_every == 0) == full) L->kv_src = d;
        if (L->kv_src < 0) return pt_error(PT_ERR_INVALID_ARG, "synthetic %s: layer %d has no KV donor", sh->name, l);
    } else {
        L->kv_src = l;
        PT_TRY(synth_vec(c, L->head_dim, 1.0f, &L->k_norm));
        PT_TRY(synth_weight_as(c, &L->wk, 0, kd, H, "k_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight_as(c, &L->wv, 0, kd, H, "v_proj", PT_ROLE_ATTN_IN));
    }
    PT_TRY(synth_weight(c, &L->wo, 0, H, qd, "o_proj"));
    L->rope.rot_dim = L->head_dim;
    L->rope.inv_freq = full ? inv_full : inv_sl;
    L->rope.attn_scale = 1.0f;
    L->attn.n_heads = sh->heads;
    L->attn.head_dim = L->head_dim;
    L->attn.scale = 1.0f;
    L->attn.window = full ? 0 : sh->window;
    L->ffn = sh->ffn;
    PT_TRY(synth_weight(c, &L->w_gate, 0, sh->ffn, H, "gate_proj"));
    PT_TRY(synth_weight(c, &L->w_up, 0, sh->ffn, H, "up_proj"));
    PT_TRY(synth_weight(c, &L->w_down, 0, H, sh->ffn, "down_proj"));
    if (sh->ple_dim) {
        PT_TRY(synth_weight(c, &L->ple_gate, 0, sh->ple_dim, H, "per_layer_input_gate"));
        PT_TRY(synth_weight(c, &L->ple_proj, 0, H, sh->ple_dim, "per_layer_projection"));
        PT_TRY(synth_vec(c, H, 1.0f, &L->ple_post_norm));
    }
    return PT_OK;
}

/* f32 values in backend memory (owned through the model's dev_list). */
static pt_status synth_f32(pt_model *m, int64_t n, float value, const float **out) {
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return pt_error(PT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) h[i] = value;
    const void *dev = NULL;
    pt_status st = pt_model_upload(m, h, (size_t)n * 4, &dev);
    free(h);
    *out = dev;
    return st;
}

/* Layer l of a Qwen3.5 shape: a Gated DeltaNet layer (qwen3_5.c), or, when
 * (l+1) % full_every == 0, gated full attention (q_proj rows [q | gate] per
 * head) with q/k norms and RoPE on the first head_dim/4 dims; SwiGLU MLP.
 * Folded (MLX-style) norms at weight 1: round(x̂·w) in f32. */
static pt_status qwen35_layer(synth_ctx *c, const synth_shape *sh, int l, const void *inv) {
    pt_model *m = c->m;
    pt_net *n = &m->net;
    pt_layer *L = &n->layers[l];
    const int64_t H = sh->hidden;
    const pt_backend_ops *o = m->be->ops;
    L->residual_scale = 1.0f;
    L->norm_style = L->qk_style = PT_RMS_W_F32;
    L->glu = PT_GLU_SILU;
    PT_TRY(synth_vec(c, H, 1.0f, &L->attn_norm));
    PT_TRY(synth_vec(c, H, 1.0f, &L->ffn_norm));
    if ((l + 1) % sh->full_every != 0) {
        if (!o->conv1d_silu || !o->delta_rule || !o->rms_norm_gated || !o->copy_rows || !o->sigmoid_mul)
            return pt_error(PT_ERR_UNSUPPORTED, "--synthetic %s: the %s backend does not implement the Gated "
                                                "DeltaNet ops (Qwen3.5 runs on the CPU backend)",
                            sh->name, o->name);
        const int K = 4;
        const int64_t kd = (int64_t)sh->lin_kh * sh->lin_kd, vd = (int64_t)sh->lin_vh * sh->lin_vd, cd = 2 * kd + vd;
        L->is_linear = 1;
        L->lin_K = K;
        L->lin_conv_dim = cd;
        PT_TRY(synth_weight(c, &L->lin_qkv, 0, cd, H, "in_proj_qkv"));
        PT_TRY(synth_weight(c, &L->lin_z, 0, vd, H, "in_proj_z"));
        PT_TRY(synth_weight(c, &L->lin_b, 0, sh->lin_vh, H, "in_proj_b"));
        PT_TRY(synth_weight(c, &L->lin_a, 0, sh->lin_vh, H, "in_proj_a"));
        PT_TRY(synth_weight(c, &L->lin_out, 0, H, vd, "out_proj"));
        PT_TRY(synth_vec(c, cd * K, 0.25f, &L->lin_conv));
        PT_TRY(synth_vec(c, sh->lin_vd, 1.0f, &L->lin_norm));
        L->delta = (pt_delta){.n_k_heads = sh->lin_kh, .n_v_heads = sh->lin_vh, .k_dim = sh->lin_kd,
                              .v_dim = sh->lin_vd, .q_scale = 1.0f / sqrtf((float)sh->lin_kd)};
        PT_TRY(synth_f32(m, sh->lin_vh, 0.0f, &L->delta.A_log));
        PT_TRY(synth_f32(m, sh->lin_vh, 1.0f, &L->delta.dt_bias));
        n->n_linear++;
        if (cd > n->max_lin_conv) n->max_lin_conv = cd;
        if (vd > n->max_lin_value) n->max_lin_value = vd;
        if (sh->lin_vh > n->max_lin_heads) n->max_lin_heads = sh->lin_vh;
    } else {
        const int64_t qd = (int64_t)sh->heads * sh->head_dim, kvd = (int64_t)sh->kv * sh->head_dim;
        L->n_heads = sh->heads;
        L->n_kv = sh->kv;
        L->head_dim = sh->head_dim;
        L->kv_src = l;
        L->attn_gate = 1;
        PT_TRY(synth_vec(c, sh->head_dim, 1.0f, &L->q_norm));
        PT_TRY(synth_vec(c, sh->head_dim, 1.0f, &L->k_norm));
        PT_TRY(synth_weight_as(c, &L->wq, 0, 2 * qd, H, "q_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight_as(c, &L->wk, 0, kvd, H, "k_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight_as(c, &L->wv, 0, kvd, H, "v_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight(c, &L->wo, 0, H, qd, "o_proj"));
        L->rope.rot_dim = sh->head_dim / 4;
        L->rope.inv_freq = inv;
        L->rope.attn_scale = 1.0f;
        L->attn.n_heads = sh->heads;
        L->attn.head_dim = sh->head_dim;
        L->attn.scale = 1.0f / sqrtf((float)sh->head_dim);
    }
    L->ffn = sh->ffn;
    PT_TRY(synth_weight(c, &L->w_gate, 0, sh->ffn, H, "gate_proj"));
    PT_TRY(synth_weight(c, &L->w_up, 0, sh->ffn, H, "up_proj"));
    return synth_weight(c, &L->w_down, 0, H, sh->ffn, "down_proj");
}

static pt_status build(pt_model *m, const synth_shape *sh, int bits) {
    synth_ctx c = {m, bits, 0x1234567887654321ull};
    pt_net *n = &m->net;
    n->n_layers = sh->layers;
    n->hidden = sh->hidden;
    n->vocab = sh->vocab;
    n->max_ctx = 131072;
    n->eps = 1e-5f;
    n->norm_type = PT_FT_BF16;
    n->kv_dtype = PT_FT_BF16;
    n->embed_scale = 1.0f;
    n->logit_scale = 1.0f;
    n->layers = calloc((size_t)sh->layers, sizeof *n->layers);
    if (!n->layers) return pt_error(PT_ERR_NOMEM, "out of memory");
    const int64_t H = sh->hidden, qd = (int64_t)sh->heads * sh->head_dim, kd = (int64_t)sh->kv * sh->head_dim;
    PT_TRY(synth_weight(&c, &n->embed, 0, sh->vocab, H, "embed"));
    if (sh->tied) {
        n->lm_head = n->embed;
        n->tied = 1;
    } else {
        PT_TRY(synth_weight(&c, &n->lm_head, 0, sh->vocab, H, "lm_head"));
    }
    PT_TRY(synth_vec(&c, H, sh->gemma ? 0.0f : 1.0f, &n->final_norm));
    if (sh->gemma) {
        n->final_style = PT_RMS_1PW;
        n->embed_scale = pt_round_bf16(sqrtf((float)sh->hidden));
    }
    /* default RoPE table (the scaling kind does not change the cost); Gemma 4's full layers: proportional RoPE
     * over global_head_dim, the first 25% of the pairs rotating (theta 1e6), the rest identity (frequency 0) */
    const void *inv_dev = NULL, *inv_full = NULL;
    if (sh->qwen35) /* partial RoPE: the first head_dim/4 dims rotate, frequencies over that width */
        PT_TRY(rope_table(m, sh->head_dim / 4, sh->theta, sh->head_dim / 8, &inv_dev));
    else
        PT_TRY(rope_table(m, sh->head_dim, sh->theta, sh->head_dim / 2, &inv_dev));
    if (sh->gemma4) PT_TRY(rope_table(m, sh->global_head_dim, 1000000.0, sh->global_head_dim / 8, &inv_full));
    if (sh->gemma4) {
        n->eps = 1e-6f;
        n->final_style = PT_RMS_W_F32;
        n->final_softcap = sh->softcap;
        n->embed_scale = pt_round_bf16(sqrtf((float)sh->hidden));
    }
    if (sh->ple_dim) { /* per-layer inputs: table [V, L·pd], projection [L·pd, H], norm [pd] */
        const int64_t LP = (int64_t)sh->layers * sh->ple_dim;
        n->ple_dim = sh->ple_dim;
        PT_TRY(synth_weight(&c, &n->ple_embed, 0, sh->vocab, LP, "embed_tokens_per_layer"));
        PT_TRY(synth_weight(&c, &n->ple_model_proj, 0, LP, H, "per_layer_model_projection"));
        PT_TRY(synth_vec(&c, sh->ple_dim, 1.0f, &n->ple_proj_norm));
        n->ple_embed_scale = pt_round_bf16(sqrtf((float)sh->ple_dim));
        n->ple_proj_scale = 1.0f / sqrtf((float)sh->hidden);
        n->ple_input_scale = 1.0f / sqrtf(2.0f);
    }
    int max_hd = sh->head_dim;
    if (sh->qwen35) {
        n->eps = 1e-6f;
        n->final_style = PT_RMS_W_F32;
    }
    for (int l = 0; l < sh->layers; l++) {
        pt_layer *L = &n->layers[l];
        if (sh->qwen35) {
            PT_TRY(qwen35_layer(&c, sh, l, inv_dev));
            continue;
        }
        if (sh->gemma4) {
            PT_TRY(gemma4_layer(&c, sh, l, inv_dev, inv_full));
            if (L->head_dim > max_hd) max_hd = L->head_dim;
            continue;
        }
        L->n_heads = sh->heads;
        L->n_kv = sh->kv;
        L->head_dim = sh->head_dim;
        L->residual_scale = 1.0f;
        const float one = sh->gemma ? 0.0f : 1.0f; /* neutral weight: w, or (1+w) with w = 0 */
        PT_TRY(synth_vec(&c, H, one, &L->attn_norm));
        PT_TRY(synth_vec(&c, H, one, &L->ffn_norm));
        if (sh->qk_norm) {
            PT_TRY(synth_vec(&c, sh->head_dim, one, &L->q_norm));
            PT_TRY(synth_vec(&c, sh->head_dim, one, &L->k_norm));
        }
        PT_TRY(synth_weight_as(&c, &L->wq, 0, qd, H, "q_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight_as(&c, &L->wk, 0, kd, H, "k_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight_as(&c, &L->wv, 0, kd, H, "v_proj", PT_ROLE_ATTN_IN));
        PT_TRY(synth_weight(&c, &L->wo, 0, H, qd, "o_proj"));
        L->rope.rot_dim = sh->head_dim;
        L->rope.inv_freq = inv_dev;
        L->rope.attn_scale = 1.0f;
        L->attn.n_heads = sh->heads;
        L->attn.head_dim = sh->head_dim;
        L->attn.scale = 1.0f / sqrtf((float)sh->head_dim);
        if (sh->gemma) {
            L->norm_style = L->qk_style = PT_RMS_1PW;
            L->glu = PT_GLU_GELU_TANH;
            L->sandwich = 1;
            PT_TRY(synth_vec(&c, H, 0.0f, &L->post_attn_norm));
            PT_TRY(synth_vec(&c, H, 0.0f, &L->post_ffn_norm));
            if (sh->full_every && (l + 1) % sh->full_every != 0) L->attn.window = sh->window;
        }
        if (sh->experts) {
            L->is_moe = 1;
            L->moe_ffn = sh->moe_ffn;
            L->route = (pt_moe_route){.n_experts = sh->experts, .top_k = sh->top_k, .renorm = 1};
            PT_TRY(synth_weight(&c, &L->router, 0, sh->experts, H, "router"));
            PT_TRY(synth_weight(&c, &L->ex_gate, sh->experts, sh->moe_ffn, H, "experts.gate"));
            PT_TRY(synth_weight(&c, &L->ex_up, sh->experts, sh->moe_ffn, H, "experts.up"));
            PT_TRY(synth_weight(&c, &L->ex_down, sh->experts, H, sh->moe_ffn, "experts.down"));
            n->max_experts = sh->experts;
            n->max_top_k = sh->top_k;
            n->max_ffn = sh->moe_ffn;
        } else {
            L->ffn = sh->ffn;
            PT_TRY(synth_weight(&c, &L->w_gate, 0, sh->ffn, H, "gate_proj"));
            PT_TRY(synth_weight(&c, &L->w_up, 0, sh->ffn, H, "up_proj"));
            PT_TRY(synth_weight(&c, &L->w_down, 0, H, sh->ffn, "down_proj"));
            n->max_ffn = sh->ffn;
        }
    }
    n->max_heads = sh->heads;
    n->max_kv = sh->kv;
    n->max_head_dim = max_hd;
    if (sh->gemma4 || sh->qwen35) n->max_ffn = sh->ffn;
    return PT_OK;
}

pt_status pt_model_synthetic(const char *name, const char *quant, const pt_model_params *params, pt_model **out) {
    *out = NULL;
    const synth_shape *sh = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, name)) sh = &shapes[i];
    if (!sh)
        return pt_error(PT_ERR_INVALID_ARG, "--synthetic %s: unknown shape (known: %s; gemma shapes come with the "
                                            "gemma families)",
                        name, pt_synthetic_names());
    int bits = !strcmp(quant, "q4") ? 4 : !strcmp(quant, "q8") ? 8 : !strcmp(quant, "bf16") ? 0 : -1;
    if (bits < 0) return pt_error(PT_ERR_INVALID_ARG, "--quant %s: expected q4, q8 or bf16", quant);
    pt_model_params p = params ? *params : pt_model_default_params();
    pt_levers_resolve(&p);
    pt_device dev;
    char devdesc[400];
    PT_TRY(pt_device_resolve(p.device, &dev, devdesc, sizeof devdesc));
    if (!sh->cpu && dev != PT_DEVICE_CUDA)
        return pt_error(PT_ERR_UNSUPPORTED, "--synthetic %s is a GPU-only shape (too large for a CPU run)", name);
    pt_levers_for_device(&p, dev);
    PT_TRY(pt_levers_check(&p, dev));
    pt_model *m = calloc(1, sizeof *m);
    if (!m) return pt_error(PT_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->lock, NULL);
    m->params = p;
    m->device = dev;
    pt_status st;
    if (dev == PT_DEVICE_CUDA) {
        pt_cuda_params gp = {0, PT_ACT_BF16};
        st = pt_backend_cuda_create(&m->be, &gp);
    } else {
        pt_cpu_params cp = {.n_threads = p.n_threads, .act = PT_ACT_BF16, .isa = PT_ISA_AUTO,
                            .int8_act = p.int8_act == PT_LEVER_ON};
        st = pt_backend_cpu_create(&m->be, &cp);
    }
    if (st == PT_OK) st = build(m, sh, bits);
    char id[96];
    snprintf(id, sizeof id, "%s-%s (synthetic)", name, quant);
    m->id = strdup(id);
    m->dir = strdup(id);
    m->eos = malloc(sizeof *m->eos);
    if (st == PT_OK && (!m->id || !m->dir || !m->eos)) st = pt_error(PT_ERR_NOMEM, "out of memory");
    if (st != PT_OK) {
        pt_model_free(&m);
        return st;
    }
    int nth = p.n_threads > 0 ? p.n_threads : pt_cpu_count();
    if (dev == PT_DEVICE_CUDA)
        snprintf(m->backend_name, sizeof m->backend_name, "%.60s, bf16 act., synthetic", devdesc);
    else pt_model_cpu_backend_name(m, nth, PT_ACT_BF16, "synthetic");
    m->gen_defaults.temperature = 0;
    m->gen_defaults.top_p = 1;
    m->gen_defaults.repetition_penalty = 1;
    *out = m;
    return PT_OK;
}
