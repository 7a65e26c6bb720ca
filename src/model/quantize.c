/* Float checkpoint -> MLX affine-quantized checkpoint (see quantize.h).
 *
 * Plan, then stream: the output is first planned as a list of tensors (name,
 * dtype, shape, where its rows come from, how it is quantized), so every
 * shard header can be written before any data; then each tensor is produced
 * in order, one module at a time (a quantized module's packed weight, scales
 * and biases are computed together and written back to back). */
#include "model/quantize.h"

#include "base/error.h"
#include "base/half.h"
#include "base/json.h"
#include "base/mmap.h"
#include "base/threadpool.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/spec.h"

#include <errno.h>
#include <dirent.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#pragma GCC diagnostic ignored "-Wformat-truncation" /* names are far shorter than the buffers */

enum { ROLE_DENSE = 0, ROLE_PACKED, ROLE_SCALES, ROLE_BIASES };

typedef struct {
    char name[256];
    char module[256];      /* module path (name without ".weight") */
    int role;
    pt_dtype dtype;        /* as written */
    int ndim;
    int64_t shape[3];      /* as written */
    int n_parts;           /* sources concatenated by rows */
    const pt_weight **parts;
    int64_t rows, cols;    /* logical matrix: rows of all parts, cols */
    int bits, group_size;  /* quantized modules */
    int fold_one;          /* add 1 (Qwen3.5 zero-centred norms) */
    uint64_t nbytes;
    int shard;
} out_t;

typedef struct {
    const pt_config *cfg;
    const pt_model_spec *spec;
    const pt_quantize_params *p;
    out_t *v;
    int n, cap;
    pt_dtype dtype;        /* float dtype of the output */
    const char *mprefix, *hprefix;
    int mixed_lo, mixed_hi, mixed_loc;
    cJSON *qcfg;           /* the "quantization" object being built */
    int n_quantized;
} plan;

int pt_quantize_recipe_valid(const char *r) {
    return r && (!strcmp(r, "mixed_2_6") || !strcmp(r, "mixed_3_4") || !strcmp(r, "mixed_3_6") ||
                 !strcmp(r, "mixed_4_6"));
}

static out_t *add(plan *pl) {
    if (pl->n == pl->cap) {
        int nc = pl->cap ? pl->cap * 2 : 256;
        out_t *v = realloc(pl->v, (size_t)nc * sizeof *v);
        if (!v) return NULL;
        pl->v = v;
        pl->cap = nc;
    }
    out_t *o = &pl->v[pl->n++];
    memset(o, 0, sizeof *o);
    return o;
}

static int ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* mlx-lm's mixed recipes (convert.py, mixed_quant_predicate_builder): v_proj
 * and down_proj of the first and last eighth of the layers and of every
 * third layer in between, and lm_head, get the high bit width. */
static int mixed_bits(const plan *pl, const char *path) {
    int L = pl->spec->n_layers, idx = 0, k = 0;
    const char *s = path;
    while (k < pl->mixed_loc && (s = strchr(s, '.'))) s++, k++;
    if (s && k == pl->mixed_loc) {
        idx = atoi(s); /* a non-numeric component reads as 0 */
    }
    int more = idx < L / 8 || idx >= 7 * L / 8 || ((idx - L / 8) % 3 + 3) % 3 == 2;
    /* Python's % is non-negative for a positive divisor: ((x % 3) + 3) % 3 */
    if ((strstr(path, "v_proj") || strstr(path, "v_a_proj") || strstr(path, "v_b_proj")) && more) return pl->mixed_hi;
    if (strstr(path, "down_proj") && more) return pl->mixed_hi;
    if (strstr(path, "lm_head")) return pl->mixed_hi;
    return pl->mixed_lo;
}

/* mlx-lm per-model quant_predicate overrides (router layers at 8 bits). */
static int model_override(const plan *pl, const char *path) {
    switch (pl->cfg->arch) {
    case PT_ARCH_QWEN3_MOE: return ends(path, "mlp.gate");
    case PT_ARCH_QWEN3_5: return pl->cfg->n_experts > 0 && (ends(path, "mlp.gate") || ends(path, "shared_expert_gate"));
    case PT_ARCH_GEMMA4: return ends(path, "router.proj");
    default: return 0;
    }
}

static void add_entry(plan *pl, const char *path, int bits, int gs, int with_mode) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "group_size", gs);
    cJSON_AddNumberToObject(e, "bits", bits);
    if (with_mode) cJSON_AddStringToObject(e, "mode", "affine");
    cJSON_AddItemToObject(pl->qcfg, path, e);
}

/* A tensor from `n` row-concatenated sources. `quantizable`: an nn.Linear /
 * nn.Embedding / SwitchLinear weight. `wshape` is the written shape for dense
 * output (NULL = the logical [rows, cols] or [E, rows/E, cols] for stacks). */
static pt_status add_tensor(plan *pl, const char *name, const pt_weight **parts, int n, int quantizable, int stack,
                            int fold_one, int keep_dtype, const int64_t *wshape, int wndim) {
    const pt_weight *w0 = parts[0];
    int64_t cols = w0->ndim ? w0->shape[w0->ndim - 1] : 1, rows = 0;
    for (int i = 0; i < n; i++) {
        int64_t r = 1;
        for (int k = 0; k + 1 < parts[i]->ndim; k++) r *= parts[i]->shape[k];
        rows += r;
    }
    const pt_weight **cp = malloc((size_t)n * sizeof *cp);
    if (!cp) return pt_error(PT_ERR_NOMEM, "out of memory");
    memcpy(cp, parts, (size_t)n * sizeof *cp);
    char module[256];
    snprintf(module, sizeof module, "%s", name);
    if (ends(module, ".weight")) module[strlen(module) - 7] = 0;
    int bits = 0, gs = pl->p->group_size;
    if (quantizable && cols % pl->p->group_size == 0) {
        /* mlx-lm's quantize_model: shape[-1] % group_size, then the predicate */
        if (pl->p->mixed) {
            bits = mixed_bits(pl, module);
            add_entry(pl, module, bits, gs, 1);
        } else if (model_override(pl, module) && cols % 64 == 0) {
            bits = 8, gs = 64;
            add_entry(pl, module, bits, gs, 0);
        } else {
            bits = pl->p->bits;
        }
    }
    pt_dtype dt = keep_dtype ? w0->dtype : pl->dtype;
    int64_t E = stack ? n : 0;
    if (bits) {
        pl->n_quantized++;
        for (int role = ROLE_PACKED; role <= ROLE_BIASES; role++) {
            out_t *o = add(pl);
            if (!o) return pt_error(PT_ERR_NOMEM, "out of memory");
            snprintf(o->module, sizeof o->module, "%s", module);
            snprintf(o->name, sizeof o->name, "%s%s", module,
                     role == ROLE_PACKED ? ".weight" : role == ROLE_SCALES ? ".scales" : ".biases");
            o->role = role;
            o->dtype = role == ROLE_PACKED ? PT_DTYPE_U32 : pl->dtype;
            int64_t last = role == ROLE_PACKED ? cols * bits / 32 : cols / gs;
            if (E) o->ndim = 3, o->shape[0] = E, o->shape[1] = rows / E, o->shape[2] = last;
            else o->ndim = 2, o->shape[0] = rows, o->shape[1] = last;
            o->parts = role == ROLE_PACKED ? cp : NULL;
            o->n_parts = n;
            o->rows = rows;
            o->cols = cols;
            o->bits = bits;
            o->group_size = gs;
            o->nbytes = (uint64_t)rows * (uint64_t)last * pt_dtype_size(o->dtype);
        }
        /* scales/biases rows come from the packed entry's sources */
        pl->v[pl->n - 1].parts = pl->v[pl->n - 2].parts = cp;
        return PT_OK;
    }
    out_t *o = add(pl);
    if (!o) {
        free(cp);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    snprintf(o->name, sizeof o->name, "%s", name);
    snprintf(o->module, sizeof o->module, "%s", module);
    o->role = ROLE_DENSE;
    o->dtype = dt;
    if (wshape) {
        o->ndim = wndim;
        memcpy(o->shape, wshape, (size_t)wndim * sizeof *wshape);
    } else if (E) {
        o->ndim = 3, o->shape[0] = E, o->shape[1] = rows / E, o->shape[2] = cols;
    } else {
        o->ndim = w0->ndim;
        memcpy(o->shape, w0->shape, (size_t)w0->ndim * sizeof(int64_t));
    }
    o->parts = cp;
    o->n_parts = n;
    o->rows = rows;
    o->cols = cols;
    o->fold_one = fold_one;
    o->nbytes = (uint64_t)rows * (uint64_t)cols * pt_dtype_size(dt);
    return PT_OK;
}

static pt_status add1(plan *pl, const char *prefix, const char *rel, const pt_weight *w, int quantizable, int fold) {
    if (!w->data) return PT_OK;
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, rel);
    return add_tensor(pl, name, &w, 1, quantizable, 0, fold, 0, NULL, 0);
}

static pt_status plan_layer(plan *pl, const pt_layer_spec *l) {
    const pt_layer_weights *w = &l->w;
    char p[128];
    snprintf(p, sizeof p, "%slayers.%d.", pl->mprefix, l->index);
    int fold = l->norm_style == PT_NORM_1PW && pl->cfg->arch == PT_ARCH_QWEN3_5;
    int g4 = pl->cfg->arch == PT_ARCH_GEMMA4;
    static const struct {
        size_t off;
        const char *rel;
        int q, fold;
    } t[] = {
        {offsetof(pt_layer_weights, input_norm), "input_layernorm.weight", 0, 1},
        {offsetof(pt_layer_weights, post_attn_norm), "post_attention_layernorm.weight", 0, 1},
        {offsetof(pt_layer_weights, pre_ffn_norm), "pre_feedforward_layernorm.weight", 0, 0},
        {offsetof(pt_layer_weights, post_ffn_norm), "post_feedforward_layernorm.weight", 0, 0},
        {offsetof(pt_layer_weights, q_proj), "self_attn.q_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, k_proj), "self_attn.k_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, v_proj), "self_attn.v_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, o_proj), "self_attn.o_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, q_bias), "self_attn.q_proj.bias", 0, 0},
        {offsetof(pt_layer_weights, k_bias), "self_attn.k_proj.bias", 0, 0},
        {offsetof(pt_layer_weights, v_bias), "self_attn.v_proj.bias", 0, 0},
        {offsetof(pt_layer_weights, o_bias), "self_attn.o_proj.bias", 0, 0},
        {offsetof(pt_layer_weights, q_norm), "self_attn.q_norm.weight", 0, 1},
        {offsetof(pt_layer_weights, k_norm), "self_attn.k_norm.weight", 0, 1},
        {offsetof(pt_layer_weights, lin_in_qkv), "linear_attn.in_proj_qkv.weight", 1, 0},
        {offsetof(pt_layer_weights, lin_in_z), "linear_attn.in_proj_z.weight", 1, 0},
        {offsetof(pt_layer_weights, lin_in_b), "linear_attn.in_proj_b.weight", 1, 0},
        {offsetof(pt_layer_weights, lin_in_a), "linear_attn.in_proj_a.weight", 1, 0},
        {offsetof(pt_layer_weights, lin_dt_bias), "linear_attn.dt_bias", 0, 0},
        {offsetof(pt_layer_weights, lin_norm), "linear_attn.norm.weight", 0, 0},
        {offsetof(pt_layer_weights, lin_out_proj), "linear_attn.out_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, gate_proj), "mlp.gate_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, up_proj), "mlp.up_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, down_proj), "mlp.down_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, shared_gate_proj), "mlp.shared_expert.gate_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, shared_up_proj), "mlp.shared_expert.up_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, shared_down_proj), "mlp.shared_expert.down_proj.weight", 1, 0},
        {offsetof(pt_layer_weights, shared_expert_gate), "mlp.shared_expert_gate.weight", 1, 0},
        {offsetof(pt_layer_weights, router_scale), "router.scale", 0, 0},
        {offsetof(pt_layer_weights, router_per_expert_scale), "router.per_expert_scale", 0, 0},
        {offsetof(pt_layer_weights, pre_ffn_norm_2), "pre_feedforward_layernorm_2.weight", 0, 0},
        {offsetof(pt_layer_weights, post_ffn_norm_1), "post_feedforward_layernorm_1.weight", 0, 0},
        {offsetof(pt_layer_weights, post_ffn_norm_2), "post_feedforward_layernorm_2.weight", 0, 0},
        {offsetof(pt_layer_weights, ple_gate), "per_layer_input_gate.weight", 1, 0},
        {offsetof(pt_layer_weights, ple_proj), "per_layer_projection.weight", 1, 0},
        {offsetof(pt_layer_weights, ple_post_norm), "post_per_layer_input_norm.weight", 0, 0},
        {offsetof(pt_layer_weights, layer_scalar), "layer_scalar", 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        PT_TRY(add1(pl, p, t[i].rel, (const pt_weight *)((const char *)w + t[i].off), t[i].q, t[i].fold && fold));
    if (w->router.data) PT_TRY(add1(pl, p, g4 ? "router.proj.weight" : "mlp.gate.weight", &w->router, 1, 0));
    if (w->lin_A_log.data) { /* mlx-lm keeps A_log in its stored dtype (cast_predicate) */
        char name[256];
        const pt_weight *a = &w->lin_A_log;
        snprintf(name, sizeof name, "%slinear_attn.A_log", p);
        PT_TRY(add_tensor(pl, name, &a, 1, 0, 0, 0, 1, NULL, 0));
    }
    if (w->lin_conv1d.data) { /* mlx-lm layout [C, K, 1] */
        char name[256];
        const pt_weight *cw = &w->lin_conv1d;
        int64_t sh[3] = {cw->shape[0], cw->shape[1], 1};
        snprintf(name, sizeof name, "%slinear_attn.conv1d.weight", p);
        PT_TRY(add_tensor(pl, name, &cw, 1, 0, 0, 0, 0, sh, 3));
    }
    if (l->n_experts && w->expert_gate) {
        int E = l->n_experts;
        const pt_weight **parts = malloc((size_t)E * sizeof *parts);
        if (!parts) return pt_error(PT_ERR_NOMEM, "out of memory");
        const char *stack = g4 ? "experts.switch_glu" : "mlp.switch_mlp";
        const pt_weight *arr[3] = {w->expert_gate, w->expert_up, w->expert_down};
        const char *which[3] = {"gate_proj", "up_proj", "down_proj"};
        pt_status s = PT_OK;
        for (int k = 0; k < 3 && !s; k++) {
            for (int e = 0; e < E; e++) parts[e] = &arr[k][e];
            char name[256];
            snprintf(name, sizeof name, "%s%s.%s.weight", p, stack, which[k]);
            s = add_tensor(pl, name, parts, E, 1, 1, 0, 0, NULL, 0);
        }
        free(parts);
        PT_TRY(s);
    }
    return PT_OK;
}

static pt_status make_plan(plan *pl) {
    const pt_model_spec *s = pl->spec;
    const char *m = pl->mprefix;
    char n[256];
    snprintf(n, sizeof n, "%sembed_tokens.weight", m);
    const pt_weight *w = &s->embed;
    PT_TRY(add_tensor(pl, n, &w, 1, 1, 0, 0, 0, NULL, 0));
    if (s->ple_embed.data) {
        PT_TRY(add1(pl, m, "embed_tokens_per_layer.weight", &s->ple_embed, 1, 0));
        PT_TRY(add1(pl, m, "per_layer_model_projection.weight", &s->ple_model_proj, 1, 0));
        PT_TRY(add1(pl, m, "per_layer_projection_norm.weight", &s->ple_proj_norm, 0, 0));
    }
    for (int i = 0; i < s->n_layers; i++) PT_TRY(plan_layer(pl, &s->layers[i]));
    int fold = s->final_norm_style == PT_NORM_1PW && pl->cfg->arch == PT_ARCH_QWEN3_5;
    PT_TRY(add1(pl, m, "norm.weight", &s->final_norm, 0, fold));
    if (!s->tied) PT_TRY(add1(pl, pl->hprefix, "weight", &s->lm_head, 1, 0));
    return PT_OK;
}

/* ------------------------------------------------------------------ */
/* Producing data. */

static float load_elem(const pt_weight *w, int64_t i) {
    const char *d = w->data;
    switch (w->dtype) {
    case PT_DTYPE_F32: {
        float f;
        memcpy(&f, d + 4 * i, 4);
        return f;
    }
    case PT_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, d + 2 * i, 2);
        return pt_f16_to_f32(h);
    }
    default: {
        uint16_t h;
        memcpy(&h, d + 2 * i, 2);
        return pt_bf16_to_f32(h);
    }
    }
}

/* Row r of the concatenation of o->parts, as f32 rounded through the output
 * dtype (mlx-lm casts to the model dtype before quantizing). */
static void get_row(const out_t *o, pt_dtype dt, int64_t r, float *row) {
    int k = 0;
    for (;; k++) {
        int64_t pr = 1;
        for (int d = 0; d + 1 < o->parts[k]->ndim; d++) pr *= o->parts[k]->shape[d];
        if (r < pr) break;
        r -= pr;
    }
    const pt_weight *w = o->parts[k];
    for (int64_t c = 0; c < o->cols; c++) {
        float v = load_elem(w, r * o->cols + c);
        if (o->fold_one) v += 1.0f;
        if (dt == PT_DTYPE_BF16) v = pt_round_bf16(v);
        else if (dt == PT_DTYPE_F16) v = pt_f16_to_f32(pt_f32_to_f16(v));
        row[c] = v;
    }
}

static void store_row(const float *row, int64_t n, pt_dtype dt, void *dst) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == PT_DTYPE_F32) memcpy((char *)dst + 4 * i, &row[i], 4);
        else {
            uint16_t h = dt == PT_DTYPE_F16 ? pt_f32_to_f16(row[i]) : pt_f32_to_bf16(row[i]);
            memcpy((char *)dst + 2 * i, &h, 2);
        }
    }
}

typedef struct {
    pt_st_writer **w; /* per shard */
    int n_shards;
    int64_t done, total;
} sink;

/* Rows are produced in blocks, split across the thread pool (each thread
 * converts/quantizes its contiguous rows into the block buffer; the output
 * bytes do not depend on the split), then the block is written in order. */
typedef struct {
    const plan *pl;
    const out_t *o;
    int64_t r0, nrows;
    unsigned char *buf; /* [nrows, row_bytes] */
    size_t row_bytes;
    float *rows;        /* [nth, cols] scratch */
    unsigned char *q;   /* [nth, q_bytes] packed | scales | biases scratch */
    size_t q_bytes;
    pt_status *st;      /* [nth] */
} block_job;

static void block_fn(void *ctx, int ith, int nth) {
    block_job *j = ctx;
    const out_t *o = j->o;
    long b, e;
    pt_split_range((long)j->nrows, ith, nth, &b, &e);
    float *row = j->rows + (size_t)ith * (size_t)o->cols;
    for (long r = b; r < e; r++) {
        unsigned char *dst = j->buf + (size_t)r * j->row_bytes;
        if (o->role == ROLE_DENSE) {
            get_row(o, o->dtype, j->r0 + r, row);
            store_row(row, o->cols, o->dtype, dst);
            continue;
        }
        /* A module's packed weight, scales and biases are three tensors that a
         * shard boundary may separate, so each role re-quantizes its rows and
         * keeps its own part: three passes of cheap arithmetic, no module-sized
         * buffer. */
        int64_t pw = o->cols * o->bits / 32, ng = o->cols / o->group_size;
        size_t es = pt_dtype_size(j->pl->dtype);
        unsigned char *q = j->q + (size_t)ith * j->q_bytes;
        uint32_t *packed = (uint32_t *)q;
        unsigned char *sc = q + pw * 4, *bi = sc + ng * es;
        get_row(o, j->pl->dtype, j->r0 + r, row);
        pt_status st = pt_mlx_quantize_row(row, o->cols, o->bits, o->group_size, j->pl->p->rule, packed, sc, bi,
                                           j->pl->dtype);
        if (st) {
            j->st[ith] = st;
            return;
        }
        memcpy(dst, o->role == ROLE_PACKED ? (void *)packed : o->role == ROLE_SCALES ? (void *)sc : (void *)bi,
               j->row_bytes);
    }
}

static pt_status produce(const plan *pl, int idx, sink *k, pt_pool *pool) {
    const out_t *o = &pl->v[idx];
    pt_st_writer *w = k->w[o->shard];
    int nth = pt_pool_size(pool);
    block_job j = {.pl = pl, .o = o};
    j.row_bytes = (size_t)(o->nbytes / (uint64_t)(o->rows ? o->rows : 1));
    int64_t pw = o->bits ? o->cols * o->bits / 32 : 0, ng = o->bits ? o->cols / o->group_size : 0;
    j.q_bytes = (size_t)(pw * 4 + 2 * ng * (int64_t)pt_dtype_size(pl->dtype) + 64) & ~(size_t)63; /* keeps packed aligned */
    int64_t block = j.row_bytes ? (int64_t)((8u << 20) / j.row_bytes) : 1; /* ~8 MiB per block */
    if (block < 1) block = 1;
    if (block > o->rows) block = o->rows ? o->rows : 1;
    j.buf = malloc((size_t)block * j.row_bytes + 1);
    j.rows = malloc((size_t)nth * (size_t)o->cols * sizeof(float) + 1);
    j.q = malloc((size_t)nth * j.q_bytes);
    j.st = calloc((size_t)nth, sizeof *j.st);
    pt_status s = j.buf && j.rows && j.q && j.st ? PT_OK : pt_error(PT_ERR_NOMEM, "out of memory");
    for (int64_t r0 = 0; r0 < o->rows && !s; r0 += block) {
        j.r0 = r0;
        j.nrows = o->rows - r0 < block ? o->rows - r0 : block;
        pt_pool_run(pool, block_fn, &j);
        for (int t = 0; t < nth && !s; t++) s = j.st[t];
        if (!s) s = pt_st_writer_write(w, j.buf, (size_t)j.nrows * j.row_bytes);
    }
    free(j.buf);
    free(j.rows);
    free(j.q);
    free(j.st);
    if (s) return pt_error_prefix(s, "writing '%s'", o->name);
    k->done += (int64_t)o->nbytes;
    if (pl->p->progress) pl->p->progress(pl->p->progress_ctx, k->done, k->total);
    return PT_OK;
}

/* ------------------------------------------------------------------ */

static pt_status copy_file(const char *src, const char *dst) {
    char *buf;
    size_t len;
    PT_TRY(pt_read_file(src, &buf, &len));
    pt_status s = pt_write_file(dst, buf, len);
    free(buf);
    return s;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

/* config.json as mlx-lm's save_config writes it: _name_or_path and
 * vision_config dropped, quantization + quantization_config, keys sorted. */
static pt_status write_config(const plan *pl, const char *out_dir) {
    cJSON *c = cJSON_Duplicate(pl->cfg->json, 1);
    if (!c) return pt_error(PT_ERR_NOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "_name_or_path");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "vision_config");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "quantization_config");
    cJSON_AddItemToObject(c, "quantization", cJSON_Duplicate(pl->qcfg, 1));
    cJSON_AddItemToObject(c, "quantization_config", cJSON_Duplicate(pl->qcfg, 1));
    int n = cJSON_GetArraySize(c);
    cJSON **items = malloc((size_t)n * sizeof *items);
    pt_status s = PT_OK;
    if (!items) {
        cJSON_Delete(c);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    int i = 0;
    while (c->child) items[i++] = cJSON_DetachItemViaPointer(c, c->child);
    qsort(items, (size_t)n, sizeof *items, cmp_key);
    for (i = 0; i < n; i++) cJSON_AddItemToObject(c, items[i]->string, items[i]);
    /* AddItemToObject re-set the key from itself; keys are unchanged */
    free(items);
    char *txt = cJSON_Print(c);
    cJSON_Delete(c);
    if (!txt) return pt_error(PT_ERR_NOMEM, "out of memory");
    char *path = pt_path_join(out_dir, "config.json");
    if (!path) s = pt_error(PT_ERR_NOMEM, "out of memory");
    else {
        size_t L = strlen(txt);
        txt[L] = '\n'; /* replaces the NUL: the file ends with a newline */
        s = pt_write_file(path, txt, L + 1);
    }
    free(path);
    free(txt);
    return s;
}

static pt_status prepare_out_dir(const char *out) {
    if (pt_is_dir(out)) {
        DIR *d = opendir(out);
        if (!d) return pt_error(PT_ERR_IO, "%s: cannot open: %s", out, strerror(errno));
        struct dirent *e;
        int nonempty = 0;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) nonempty = 1;
        closedir(d);
        if (nonempty) return pt_error(PT_ERR_INVALID_ARG, "%s: output directory exists and is not empty", out);
        return PT_OK;
    }
    if (pt_is_file(out)) return pt_error(PT_ERR_INVALID_ARG, "%s: exists and is a file", out);
    /* create missing parents too, as mlx-lm does (mkdir -p) */
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", out);
    for (char *q = buf + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            if (!pt_is_dir(buf) && mkdir(buf, 0755) && errno != EEXIST)
                return pt_error(PT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            *q = '/';
        }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return pt_error(PT_ERR_IO, "%s: cannot create directory: %s", out, strerror(errno));
    return PT_OK;
}

static pt_status write_all(plan *pl, const char *out_dir, const pt_quantize_params *p, pt_quantize_report *rep) {
    /* Widest elements first (stable), so that with the data section 8-byte
     * aligned every tensor is aligned to its element size: U32 codes and F32
     * tensors, then 16-bit ones. */
    out_t *sorted = malloc((size_t)(pl->n ? pl->n : 1) * sizeof *sorted);
    if (!sorted) return pt_error(PT_ERR_NOMEM, "out of memory");
    int m = 0;
    for (size_t es = 8; es >= 1; es /= 2)
        for (int i = 0; i < pl->n; i++)
            if (pt_dtype_size(pl->v[i].dtype) == es) sorted[m++] = pl->v[i];
    PT_ASSERT(m == pl->n);
    free(pl->v);
    pl->v = sorted;
    pl->cap = pl->n;
    uint64_t limit = p->max_shard_bytes ? p->max_shard_bytes : (uint64_t)5 << 30;
    /* shards as mlx-lm's make_shards: start a new one when the next tensor would pass the limit */
    int n_shards = 1;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < pl->n; i++) {
        if (cur + pl->v[i].nbytes > limit && cur > 0) n_shards++, cur = 0;
        pl->v[i].shard = n_shards - 1;
        cur += pl->v[i].nbytes;
        total += pl->v[i].nbytes;
    }
    sink k = {.n_shards = n_shards, .total = (int64_t)total};
    k.w = calloc((size_t)n_shards, sizeof *k.w);
    char **fname = calloc((size_t)n_shards, sizeof *fname);
    pt_status s = k.w && fname ? PT_OK : pt_error(PT_ERR_NOMEM, "out of memory");
    for (int sh = 0; sh < n_shards && !s; sh++) {
        char nm[64];
        if (n_shards > 1) snprintf(nm, sizeof nm, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        else snprintf(nm, sizeof nm, "model.safetensors");
        fname[sh] = strdup(nm);
        s = pt_st_writer_create(&k.w[sh]);
        if (!s) s = pt_st_writer_set_meta(k.w[sh], "format", "mlx");
        for (int i = 0; i < pl->n && !s; i++)
            if (pl->v[i].shard == sh)
                s = pt_st_writer_add(k.w[sh], pl->v[i].name, pl->v[i].dtype, pl->v[i].ndim, pl->v[i].shape);
        char *path = pt_path_join(out_dir, nm);
        if (!s) s = path ? pt_st_writer_begin(k.w[sh], path) : pt_error(PT_ERR_NOMEM, "out of memory");
        free(path);
    }
    pt_pool *pool = NULL;
    if (!s) s = pt_pool_create(&pool, p->n_threads > 0 ? p->n_threads : pt_cpu_count());
    for (int i = 0; i < pl->n && !s; i++) s = produce(pl, i, &k, pool);
    pt_pool_free(&pool);
    for (int sh = 0; sh < n_shards && !s; sh++) s = pt_st_writer_finish(k.w[sh]);
    if (!s) { /* the index, as mlx-lm writes it (always, sorted weight_map) */
        cJSON *idx = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(idx, "metadata");
        cJSON_AddNumberToObject(md, "total_size", (double)total);
        cJSON_AddNumberToObject(md, "total_parameters", (double)pl->spec->n_params);
        cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
        int *order = malloc((size_t)pl->n * sizeof *order);
        if (!order) s = pt_error(PT_ERR_NOMEM, "out of memory");
        for (int i = 0; order && i < pl->n; i++) order[i] = i;
        for (int i = 1; order && i < pl->n; i++) /* insertion sort by name; n is small enough */
            for (int j = i; j > 0 && strcmp(pl->v[order[j - 1]].name, pl->v[order[j]].name) > 0; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        for (int i = 0; order && i < pl->n; i++)
            cJSON_AddStringToObject(wm, pl->v[order[i]].name, fname[pl->v[order[i]].shard]);
        free(order);
        char *txt = s ? NULL : cJSON_Print(idx);
        cJSON_Delete(idx);
        char *path = pt_path_join(out_dir, "model.safetensors.index.json");
        if (!s) s = txt && path ? pt_write_file(path, txt, strlen(txt)) : pt_error(PT_ERR_NOMEM, "out of memory");
        free(txt);
        free(path);
    }
    for (int sh = 0; sh < n_shards; sh++) {
        if (k.w) pt_st_writer_free(&k.w[sh]);
        if (fname) free(fname[sh]);
    }
    free(k.w);
    free(fname);
    if (!s) {
        rep->n_shards = n_shards;
        rep->bytes = (int64_t)total;
    }
    return s;
}

static pt_dtype target_dtype(const pt_config *c, pt_dtype fallback) {
    /* mlx-lm convert: config torch_dtype (or text_config dtype) when a float type */
    if (!strcmp(c->torch_dtype, "bfloat16")) return PT_DTYPE_BF16;
    if (!strcmp(c->torch_dtype, "float16")) return PT_DTYPE_F16;
    if (!strcmp(c->torch_dtype, "float32")) return PT_DTYPE_F32;
    return fallback == PT_DTYPE_F16 || fallback == PT_DTYPE_F32 ? fallback : PT_DTYPE_BF16;
}

pt_status pt_quantize_model(const char *in_dir, const char *out_dir, const pt_quantize_params *p,
                            pt_quantize_report *rep) {
    memset(rep, 0, sizeof *rep);
    if (!pt_mlx_bits_ok(p->bits)) return pt_error(PT_ERR_INVALID_ARG, "--bits %d: expected 2, 3, 4, 5, 6 or 8", p->bits);
    if (!pt_mlx_group_ok(p->group_size))
        return pt_error(PT_ERR_INVALID_ARG, "--group-size %d: expected 32, 64 or 128", p->group_size);
    if (p->mixed && !pt_quantize_recipe_valid(p->mixed))
        return pt_error(PT_ERR_INVALID_ARG, "--mixed %s: expected mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6", p->mixed);
    pt_model_dir m;
    pt_tensor_set ts;
    pt_model_spec spec;
    PT_TRY(pt_model_dir_load(in_dir, &m));
    pt_status s = pt_st_open_dir(in_dir, &ts);
    if (s) {
        pt_model_dir_free(&m);
        return s;
    }
    plan pl = {0};
    s = pt_spec_build(&m.config, &ts, NULL, &spec);
    int spec_ok = !s;
    if (s) s = pt_error_prefix(s, "%s", in_dir);
    else if (spec.quantized || m.config.quant.present)
        s = pt_error(PT_ERR_INVALID_ARG, "%s: the model is already quantized", in_dir);
    if (!s) s = prepare_out_dir(out_dir);
    if (!s) {
        pl.cfg = &m.config;
        pl.spec = &spec;
        pl.p = p;
        pl.dtype = target_dtype(&m.config, spec.dtype);
        int wrap = m.config.arch == PT_ARCH_QWEN3_5 ||
                   ((m.config.arch == PT_ARCH_GEMMA3 || m.config.arch == PT_ARCH_GEMMA4) && m.config.multimodal_wrapper);
        pl.mprefix = wrap ? "language_model.model." : "model.";
        pl.hprefix = wrap ? "language_model.lm_head." : "lm_head.";
        pl.mixed_loc = wrap ? 3 : 2; /* index of the layer number in "<prefix>layers.N..." */
        if (p->mixed) {
            pl.mixed_lo = p->mixed[6] - '0';
            pl.mixed_hi = p->mixed[8] - '0';
        }
        pl.qcfg = cJSON_CreateObject();
        cJSON_AddNumberToObject(pl.qcfg, "group_size", p->group_size);
        cJSON_AddNumberToObject(pl.qcfg, "bits", p->bits);
        cJSON_AddStringToObject(pl.qcfg, "mode", "affine");
        s = make_plan(&pl);
    }
    if (!s) s = write_all(&pl, out_dir, p, rep);
    if (!s) s = write_config(&pl, out_dir);
    static const char *copy[] = {"tokenizer.json",         "tokenizer_config.json", "special_tokens_map.json",
                                 "added_tokens.json",      "tokenizer.model",       "vocab.json",
                                 "merges.txt",             "chat_template.jinja",   "chat_template.json",
                                 "generation_config.json"};
    for (size_t i = 0; i < sizeof copy / sizeof copy[0] && !s; i++) {
        char *a = pt_path_join(in_dir, copy[i]), *b = pt_path_join(out_dir, copy[i]);
        if (a && b && pt_is_file(a)) s = copy_file(a, b);
        free(a);
        free(b);
    }
    if (!s) {
        rep->n_tensors = pl.n;
        rep->n_quantized = pl.n_quantized;
        rep->n_params = spec.n_params;
        rep->bits_per_weight = spec.n_params ? (double)rep->bytes * 8.0 / (double)spec.n_params : 0;
    }
    for (int i = 0; i < pl.n; i++)
        if (pl.v[i].role == ROLE_DENSE || pl.v[i].role == ROLE_PACKED) free((void *)pl.v[i].parts);
    free(pl.v);
    cJSON_Delete(pl.qcfg);
    if (spec_ok) pt_spec_free(&spec);
    pt_st_close(&ts);
    pt_model_dir_free(&m);
    if (s) return s;
    /* re-validate what was written */
    pt_model_dir m2;
    PT_TRY(pt_model_dir_load(out_dir, &m2));
    s = pt_st_open_dir(out_dir, &ts);
    if (!s) {
        s = pt_spec_build(&m2.config, &ts, NULL, &spec);
        if (!s) pt_spec_free(&spec);
        pt_st_close(&ts);
    }
    pt_model_dir_free(&m2);
    if (s) return pt_error_prefix(s, "%s: written checkpoint does not validate", out_dir);
    return PT_OK;
}
