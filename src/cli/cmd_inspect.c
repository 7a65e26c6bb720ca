/* petrel inspect DIR [--json]: loads a model directory, validates it fully
 * (config files, every tensor's presence, dtype and shape, nothing
 * unexplained) and describes it. Exit 0 valid; 1 invalid (stderr says why);
 * 2 valid but a family petrel cannot run yet. Nothing here runs the model. */
#include "cli/cli.h"

#include "base/error.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/spec.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: petrel inspect DIR [--json]\n"
            "\n"
            "Validates a model directory (config.json, weights, and the optional\n"
            "generation_config.json, tokenizer_config.json, kv_config.json) and describes it:\n"
            "architecture, parameter count, per-layer kinds, quantization per module,\n"
            "weight bytes, and KV-cache bytes per token for bf16 / 8-bit / 4-bit KV.\n"
            "\n"
            "  --json    print one JSON object instead of text\n"
            "\n"
            "exit status: 0 valid; 1 invalid (the message on stderr names the file,\n"
            "tensor or field); 2 valid, but petrel cannot run this family yet.\n");
}

/* Quantization per module: weights grouped by their name with layer and
 * expert indices replaced by '*', then by (bits, group size). */
typedef struct {
    char module[160];
    int bits, group_size;
    long count;
    char dtype[8];
} qrow;

typedef struct {
    qrow *rows;
    int n, cap;
    int oom;
} qtab;

static void module_key(const char *name, char *out, size_t n) {
    /* drop the layout prefix and the ".weight" suffix; digits runs between dots -> '*' */
    const char *p = name;
    const char *pre[] = {"model.language_model.", "language_model.model.", "language_model.", "model."};
    for (size_t i = 0; i < 4; i++)
        if (!strncmp(p, pre[i], strlen(pre[i]))) {
            p += strlen(pre[i]);
            break;
        }
    size_t o = 0;
    while (*p && o + 2 < n) {
        if ((p == name || p[-1] == '.') && *p >= '0' && *p <= '9') {
            while (*p >= '0' && *p <= '9') p++;
            out[o++] = '*';
            continue;
        }
        out[o++] = *p++;
    }
    out[o] = 0;
    size_t L = strlen(out);
    if (L > 7 && !strcmp(out + L - 7, ".weight")) out[L - 7] = 0;
}

static void q_visit(void *ctx, const pt_weight *w, int layer) {
    qtab *t = ctx;
    (void)layer;
    if (w->ndim < 2) return; /* norms and scalars are never quantized */
    char key[160];
    module_key(w->name, key, sizeof key);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->rows[i].module, key) && t->rows[i].bits == w->bits && t->rows[i].group_size == w->group_size) {
            t->rows[i].count++;
            return;
        }
    if (t->n == t->cap) {
        int nc = t->cap ? t->cap * 2 : 32;
        qrow *r = realloc(t->rows, (size_t)nc * sizeof *r);
        if (!r) {
            t->oom = 1;
            return;
        }
        t->rows = r;
        t->cap = nc;
    }
    qrow *r = &t->rows[t->n++];
    snprintf(r->module, sizeof r->module, "%s", key);
    r->bits = w->bits;
    r->group_size = w->group_size;
    r->count = 1;
    snprintf(r->dtype, sizeof r->dtype, "%s", pt_dtype_name(w->bits ? w->qdtype : w->dtype));
}

static const char *norm_name(pt_norm_style s) {
    switch (s) {
    case PT_NORM_NONE: return "none";
    case PT_NORM_W: return "w";
    case PT_NORM_1PW: return "1+w";
    case PT_NORM_NOSCALE: return "no-scale";
    }
    return "?";
}

static void human(double b, char *out, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(out, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

static void layer_line(const pt_model_spec *s, const pt_config *c, const pt_layer_spec *l, FILE *f) {
    fprintf(f, "  %3d  %-17s ", l->index, pt_layer_kind_name(l->kind));
    if (l->kind == PT_LAYER_LINEAR) {
        fprintf(f, "delta-net k %dx%d v %dx%d conv %d", l->lin_k_heads, l->lin_k_dim, l->lin_v_heads, l->lin_v_dim,
                l->lin_conv_kernel);
    } else {
        fprintf(f, "heads %d/%d x %d", l->n_heads, l->n_kv_heads, l->head_dim);
        if (l->sliding_window) fprintf(f, " window %d", l->sliding_window);
        fprintf(f, " rope %s θ=%g dims %d", pt_rope_type_name(l->rope_type), c->rope[l->kind == PT_LAYER_SLIDING].theta,
                l->rope_dims);
        if (!l->has_kv) fprintf(f, " kv<-%d", l->kv_donor);
        if (l->k_eq_v) fprintf(f, " k=v");
        if (l->attn_output_gate) fprintf(f, " gated");
    }
    if (l->mlp == PT_MLP_MOE) {
        fprintf(f, " | moe %d experts top-%d x %d", l->n_experts, l->top_k, l->moe_intermediate);
        if (l->shared_expert_intermediate) fprintf(f, " +shared %d", l->shared_expert_intermediate);
        if (l->moe_parallel_dense) fprintf(f, " +dense %d", l->intermediate);
    } else {
        fprintf(f, " | mlp %d", l->intermediate);
    }
    fprintf(f, " %s", l->act == PT_ACT_SILU ? "silu" : "gelu_tanh");
    if (l->kv_config_bits) fprintf(f, " | kv %d-bit g%d", l->kv_config_bits, l->kv_config_group_size);
    (void)s;
    fprintf(f, "\n");
}

static void print_text(const char *dir, const pt_model_dir *m, const pt_tensor_set *ts, const pt_model_spec *s,
                       const qtab *q, int runnable) {
    const pt_config *c = &m->config;
    char b1[32], b2[32], b3[32], b4[32];
    printf("model:          %s\n", dir);
    printf("architecture:   %s (model_type %s%s%s)%s\n", pt_arch_name(s->arch), c->model_type,
           c->multimodal_wrapper ? ", text " : "", c->multimodal_wrapper ? c->text_model_type : "",
           runnable ? "" : " — not runnable by petrel yet");
    printf("layout:         %s, %s, %d file%s\n", s->mlx_layout ? "MLX" : "Hugging Face", pt_dtype_name(s->dtype),
           ts->n_files, ts->n_files == 1 ? "" : "s");
    printf("dimensions:     %d layers, hidden %d, vocab %d, heads %lld/%lld x %lld, context %lld\n", s->n_layers,
           s->hidden, s->vocab, (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->head_dim,
           (long long)s->max_ctx);
    if (s->n_params >= 1000000000)
        printf("parameters:     %lld (%.2f B)\n", (long long)s->n_params, (double)s->n_params / 1e9);
    else printf("parameters:     %lld (%.2f M)\n", (long long)s->n_params, (double)s->n_params / 1e6);
    human((double)s->weight_bytes, b1, sizeof b1);
    printf("weights:        %lld bytes (%s), %d weights bound, %d tensors skipped\n", (long long)s->weight_bytes, b1,
           s->n_bound, s->n_skipped);
    printf("embedding:      scale %g%s, %s lm_head, final norm %s", s->embed_scale,
           s->embed_scale_round_to_dtype ? " (rounded to dtype)" : "", s->tied ? "tied" : "separate",
           norm_name(s->final_norm_style));
    if (s->logit_scale != 1.0f) printf(", logit scale %g", s->logit_scale);
    if (s->final_softcap) printf(", final softcap %g", s->final_softcap);
    printf("\n");
    if (s->ple_dim) printf("per-layer emb:  %d x %d per layer\n", s->ple_vocab, s->ple_dim);
    if (c->quant.present)
        printf("quantization:   MLX affine, %d-bit, group size %d (%d per-module entries)\n", c->quant.bits,
               c->quant.group_size, c->quant.n_overrides);
    else printf("quantization:   none%s\n", s->quantized ? " declared (tensors carry scales)" : "");
    printf("modules:\n");
    for (int i = 0; i < q->n; i++) {
        const qrow *r = &q->rows[i];
        if (r->bits) printf("  %-48s %d-bit g%-3d %s scales  x%ld\n", r->module, r->bits, r->group_size, r->dtype, r->count);
        else printf("  %-48s %-14s x%ld\n", r->module, r->dtype, r->count);
    }
    printf("layers:         norms %s%s\n", norm_name(s->layers[0].norm_style),
           s->layers[0].sandwich_norms ? " (sandwich)" : "");
    for (int i = 0; i < s->n_layers; i++) layer_line(s, c, &s->layers[i], stdout);
    human((double)pt_spec_kv_bytes_per_token(s, 0, 64), b2, sizeof b2);
    human((double)pt_spec_kv_bytes_per_token(s, 8, 64), b3, sizeof b3);
    human((double)pt_spec_kv_bytes_per_token(s, 4, 64), b4, sizeof b4);
    printf("KV cache/token: bf16 %s, 8-bit %s, 4-bit %s (group 64; %d layers own a cache)\n", b2, b3, b4,
           s->n_cache_layers);
    printf("files:          generation_config.json %s, tokenizer_config.json %s, tokenizer.json %s, chat template %s, "
           "kv_config.json %s\n",
           m->generation.present ? "yes" : "no", m->tokenizer.present ? "yes" : "no",
           m->has_tokenizer_json ? "yes" : "no", m->tokenizer.chat_template ? "yes" : "no",
           m->kv.present ? "yes" : "no");
}

static int print_json(const char *dir, const pt_model_dir *m, const pt_tensor_set *ts, const pt_model_spec *s,
                      const qtab *q, int runnable) {
    const pt_config *c = &m->config;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", dir);
    cJSON_AddBoolToObject(o, "valid", 1);
    cJSON_AddBoolToObject(o, "runnable", runnable);
    cJSON_AddStringToObject(o, "architecture", pt_arch_name(s->arch));
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddStringToObject(o, "text_model_type", c->text_model_type);
    cJSON_AddStringToObject(o, "layout", s->mlx_layout ? "mlx" : "hf");
    cJSON_AddStringToObject(o, "dtype", pt_dtype_name(s->dtype));
    cJSON_AddNumberToObject(o, "n_files", ts->n_files);
    cJSON_AddNumberToObject(o, "n_layers", s->n_layers);
    cJSON_AddNumberToObject(o, "hidden_size", s->hidden);
    cJSON_AddNumberToObject(o, "vocab_size", s->vocab);
    cJSON_AddNumberToObject(o, "max_position_embeddings", (double)s->max_ctx);
    cJSON_AddNumberToObject(o, "n_params", (double)s->n_params);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)s->weight_bytes);
    cJSON_AddNumberToObject(o, "n_tensors_bound", s->n_bound);
    cJSON_AddNumberToObject(o, "n_tensors_skipped", s->n_skipped);
    cJSON_AddBoolToObject(o, "tied_embeddings", s->tied);
    cJSON *qo = cJSON_AddObjectToObject(o, "quantization");
    cJSON_AddBoolToObject(qo, "declared", c->quant.present);
    cJSON_AddNumberToObject(qo, "bits", c->quant.bits);
    cJSON_AddNumberToObject(qo, "group_size", c->quant.group_size);
    cJSON *mods = cJSON_AddArrayToObject(qo, "modules");
    for (int i = 0; i < q->n; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "module", q->rows[i].module);
        cJSON_AddNumberToObject(r, "bits", q->rows[i].bits);
        cJSON_AddNumberToObject(r, "group_size", q->rows[i].group_size);
        cJSON_AddStringToObject(r, "dtype", q->rows[i].dtype);
        cJSON_AddNumberToObject(r, "count", (double)q->rows[i].count);
        cJSON_AddItemToArray(mods, r);
    }
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; i < s->n_layers; i++) {
        const pt_layer_spec *l = &s->layers[i];
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "index", i);
        cJSON_AddStringToObject(r, "kind", pt_layer_kind_name(l->kind));
        cJSON_AddNumberToObject(r, "n_heads", l->n_heads);
        cJSON_AddNumberToObject(r, "n_kv_heads", l->n_kv_heads);
        cJSON_AddNumberToObject(r, "head_dim", l->head_dim);
        cJSON_AddNumberToObject(r, "sliding_window", l->sliding_window);
        cJSON_AddNumberToObject(r, "kv_donor", l->kv_donor);
        if (l->kind != PT_LAYER_LINEAR) {
            cJSON_AddStringToObject(r, "rope_type", pt_rope_type_name(l->rope_type));
            cJSON_AddNumberToObject(r, "rope_dims", l->rope_dims);
        }
        cJSON_AddStringToObject(r, "mlp", l->mlp == PT_MLP_MOE ? "moe" : "dense");
        cJSON_AddNumberToObject(r, "intermediate_size", l->intermediate);
        if (l->mlp == PT_MLP_MOE) {
            cJSON_AddNumberToObject(r, "n_experts", l->n_experts);
            cJSON_AddNumberToObject(r, "top_k", l->top_k);
            cJSON_AddNumberToObject(r, "moe_intermediate_size", l->moe_intermediate);
        }
        cJSON_AddItemToArray(layers, r);
    }
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache_bytes_per_token");
    cJSON_AddNumberToObject(kv, "bf16", (double)pt_spec_kv_bytes_per_token(s, 0, 64));
    cJSON_AddNumberToObject(kv, "q8", (double)pt_spec_kv_bytes_per_token(s, 8, 64));
    cJSON_AddNumberToObject(kv, "q4", (double)pt_spec_kv_bytes_per_token(s, 4, 64));
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!txt) {
        fprintf(stderr, "petrel inspect: out of memory\n");
        return 1;
    }
    printf("%s\n", txt);
    free(txt);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("inspect", "unknown option '%s'", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return cli_usage_error("inspect", "unexpected argument '%s' (one model directory expected)", argv[i]);
        }
    }
    if (!dir) return cli_usage_error("inspect", "missing model directory");
    pt_model_dir m;
    pt_tensor_set ts;
    pt_model_spec s;
    if (pt_model_dir_load(dir, &m)) return cli_fail("inspect");
    if (pt_st_open_dir(dir, &ts)) {
        pt_model_dir_free(&m);
        return cli_fail("inspect");
    }
    if (pt_spec_build(&m.config, &ts, &m.kv, &s)) {
        pt_error_prefix(PT_ERR_FORMAT, "%s", dir);
        pt_st_close(&ts);
        pt_model_dir_free(&m);
        return cli_fail("inspect");
    }
    qtab q = {0};
    pt_spec_for_each_weight(&s, q_visit, &q);
    int runnable = pt_spec_runnable(&s);
    int rc = 0;
    if (q.oom) {
        fprintf(stderr, "petrel inspect: out of memory\n");
        rc = 1;
    } else if (json) {
        rc = print_json(dir, &m, &ts, &s, &q, runnable);
    } else {
        print_text(dir, &m, &ts, &s, &q, runnable);
    }
    if (!rc && !runnable) {
        fprintf(stderr, "petrel inspect: %s: valid %s model, but petrel cannot run the %s family yet\n", dir,
                m.config.model_type, pt_arch_name(s.arch));
        rc = 2;
    }
    free(q.rows);
    pt_spec_free(&s);
    pt_st_close(&ts);
    pt_model_dir_free(&m);
    return rc;
}
