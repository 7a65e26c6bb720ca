/* Tests for src/model/spec (per-layer constants and weight binding over both
 * checkpoint layouts, using the tiny models in tests/fixtures/format) and
 * src/model/quantize (quantize -> load -> dequantize: every packed code,
 * scale and bias is what MLX's rule gives for the source weights, and the
 * dequantized weights stay within scale/2 of them). */
#include "test.h"

#include "base/error.h"
#include "base/half.h"
#include "base/mmap.h"
#include "format/mlx_quant.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/quantize.h"
#include "model/spec.h"

#include <math.h>
#include <string.h>

#define FIX "tests/fixtures/format/"

typedef struct {
    pt_model_dir m;
    pt_tensor_set ts;
    pt_model_spec s;
    int ok;
} loaded;

static int load(const char *dir, loaded *l) {
    memset(l, 0, sizeof *l);
    if (pt_model_dir_load(dir, &l->m)) return 0;
    if (pt_st_open_dir(dir, &l->ts)) {
        pt_model_dir_free(&l->m);
        return 0;
    }
    if (pt_spec_build(&l->m.config, &l->ts, &l->m.kv, &l->s)) {
        pt_st_close(&l->ts);
        pt_model_dir_free(&l->m);
        return 0;
    }
    return l->ok = 1;
}

static void unload(loaded *l) {
    if (!l->ok) return;
    pt_spec_free(&l->s);
    pt_st_close(&l->ts);
    pt_model_dir_free(&l->m);
    l->ok = 0;
}

static int64_t sum_elements(const pt_tensor_set *ts) {
    int64_t n = 0;
    for (int i = 0; i < ts->n_tensors; i++) n += ts->tensors[i].n_elements;
    return n;
}

static void test_llama(void) {
    loaded l;
    REQUIRE(load(FIX "llama", &l), "%s", pt_last_error());
    const pt_model_spec *s = &l.s;
    CHECK(s->arch == PT_ARCH_LLAMA && s->n_layers == 2 && s->tied && !s->mlx_layout && !s->quantized, "basics");
    CHECK(s->dtype == PT_DTYPE_BF16 && s->lm_head.data == s->embed.data, "dtype/tied");
    CHECK(s->n_params == sum_elements(&l.ts), "params %lld vs %lld", (long long)s->n_params,
          (long long)sum_elements(&l.ts));
    const pt_layer_spec *L0 = &s->layers[0];
    CHECK(L0->kind == PT_LAYER_FULL && L0->n_heads == 2 && L0->n_kv_heads == 1 && L0->head_dim == 16, "attn");
    CHECK(fabsf(L0->attn_scale - 0.25f) < 1e-7f && L0->norm_style == PT_NORM_W && !L0->q_norm, "scale/norm");
    CHECK(L0->mlp == PT_MLP_DENSE && L0->intermediate == 64 && L0->act == PT_ACT_SILU, "mlp");
    CHECK(L0->w.q_proj.shape[0] == 32 && L0->w.q_proj.shape[1] == 32 && L0->w.k_proj.shape[0] == 16, "shapes");
    /* llama3 rope: factor 8, low 1, high 4, original 128, head_dim 16, theta 1e4 */
    REQUIRE(L0->rope_dims == 16 && L0->inv_freq, "rope dims");
    for (int i = 0; i < 8; i++) {
        double inv = 1.0 / pow(10000.0, 2.0 * i / 16), wl = 2 * M_PI / inv, low = 128.0, high = 32.0;
        double want = wl > low ? inv / 8 : wl < high ? inv : 0;
        if (wl <= low && wl >= high) {
            double sm = (128.0 / wl - 1) / 3;
            want = (1 - sm) * inv / 8 + sm * inv;
        }
        CHECK(fabs(L0->inv_freq[i] - want) <= 1e-6 * want, "inv_freq[%d] %g vs %g", i, L0->inv_freq[i], want);
    }
    CHECK(pt_spec_kv_bytes_per_token(s, 0, 64) == 2 * 2 * 16 * 2, "kv bytes");
    CHECK(pt_arch_runnable(s->arch), "llama runnable");
    unload(&l);
}

static void test_gemma3_wrapper(void) {
    loaded l;
    REQUIRE(load(FIX "gemma3", &l), "%s", pt_last_error());
    const pt_model_spec *s = &l.s;
    CHECK(s->n_skipped == 2, "vision tensors skipped: %d", s->n_skipped);
    CHECK(s->embed_scale_round_to_dtype && fabsf(s->embed_scale - sqrtf(32.0f)) < 1e-6f, "embed scale");
    CHECK(s->final_norm_style == PT_NORM_1PW && s->layers[0].norm_style == PT_NORM_1PW, "1+w norms");
    CHECK(s->layers[0].q_norm == PT_NORM_1PW && s->layers[0].sandwich_norms, "qk norm, sandwich");
    CHECK(s->layers[0].kind == PT_LAYER_SLIDING && s->layers[0].sliding_window == 8, "sliding");
    CHECK(s->layers[1].kind == PT_LAYER_FULL && s->layers[1].sliding_window == 0, "full");
    CHECK(fabsf(s->layers[0].attn_scale - 0.25f) < 1e-7f, "query_pre_attn_scalar 16");
    CHECK(fabsf(s->layers[0].inv_freq[1] - 1.0f / powf(10000.0f, 2.0f / 16)) < 1e-9f, "local theta");
    CHECK(fabsf(s->layers[1].inv_freq[1] - 1.0f / powf(1e6f, 2.0f / 16) / 8) < 1e-9f, "global linear/8");
    CHECK(s->layers[0].act == PT_ACT_GELU_TANH && pt_arch_runnable(s->arch), "gelu, runnable");
    unload(&l);
}

static void test_gemma4_mlx(void) {
    loaded l;
    REQUIRE(load(FIX "gemma4_mlx", &l), "%s", pt_last_error());
    const pt_model_spec *s = &l.s;
    CHECK(s->mlx_layout && s->ple_dim == 8 && s->ple_embed.data && s->final_softcap == 30.0f, "ple/layout");
    const pt_layer_spec *L = s->layers;
    CHECK(L[0].has_kv && L[1].has_kv && !L[2].has_kv && !L[3].has_kv, "has_kv");
    CHECK(L[2].kv_donor == 0 && L[3].kv_donor == 1, "donors %d %d", L[2].kv_donor, L[3].kv_donor);
    CHECK(L[1].head_dim == 32 && L[0].head_dim == 16, "global head dim");
    CHECK(L[2].intermediate == 128 && L[0].intermediate == 64, "double-wide");
    CHECK(L[0].attn_scale == 1.0f && L[0].v_norm == PT_NORM_NOSCALE && L[0].norm_style == PT_NORM_W, "gemma4 norms");
    CHECK(L[1].rope_type == PT_ROPE_PROPORTIONAL && L[1].rope_dims == 32, "proportional dims");
    int nz = 0;
    for (int i = 0; i < 16; i++) nz += L[1].inv_freq[i] != 0;
    CHECK(nz == 4 && L[1].inv_freq[3] > 0 && fabsf(L[1].inv_freq[1] - 1.0f / powf(1e6f, 2.0f / 32)) < 1e-9f,
          "proportional: 4 rotated pairs, exponent over the full head (%d)", nz);
    CHECK(L[0].has_layer_scalar && L[0].w.layer_scalar.data && L[0].w.ple_gate.data, "layer scalar/ple");
    CHECK(pt_spec_kv_bytes_per_token(s, 0, 64) == (16 + 32) * 2 * 2, "kv bytes (2 cache layers)");
    CHECK(s->n_cache_layers == 2, "cache layers");
    unload(&l);
}

static void test_qwen3_5_mlx(void) {
    loaded l;
    REQUIRE(load(FIX "qwen3_5_moe_mlx", &l), "%s", pt_last_error());
    const pt_model_spec *s = &l.s;
    const pt_layer_spec *L = s->layers;
    CHECK(s->mlx_layout && L[0].norm_style == PT_NORM_W && s->final_norm_style == PT_NORM_W,
          "MLX conv [C,K,1] => +1 already folded");
    CHECK(L[0].kind == PT_LAYER_LINEAR && L[1].kind == PT_LAYER_FULL, "kinds");
    CHECK(L[0].lin_k_heads == 1 && L[0].lin_v_heads == 2 && L[0].lin_conv_kernel == 4, "linear dims");
    CHECK(L[0].w.lin_conv1d.ndim == 2 && L[0].w.lin_conv1d.shape[0] == 32 && L[0].w.lin_conv1d.shape[1] == 4,
          "conv1d bound as [C, K]");
    CHECK(L[1].attn_output_gate && L[1].w.q_proj.shape[0] == 64 && L[1].rope_dims == 4, "gated attention, partial rope");
    CHECK(L[0].mlp == PT_MLP_MOE && L[0].n_experts == 4 && L[0].shared_expert_intermediate == 16, "moe");
    const pt_tensor *st = pt_st_find(&l.ts, "language_model.model.layers.0.mlp.switch_mlp.up_proj.weight");
    REQUIRE(st, "stacked tensor");
    CHECK(L[0].w.expert_up[2].data == (const char *)st->data + 2 * 16 * 32 * 2, "expert view into the stack");
    CHECK(L[0].w.expert_up[2].shape[0] == 16 && L[0].w.expert_up[2].shape[1] == 32, "expert view shape");
    CHECK(s->n_cache_layers == 1, "only full layers cache");
    unload(&l);
}

static void test_qwen3_moe_hf_and_minicpm(void) {
    loaded l;
    REQUIRE(load(FIX "qwen3_moe", &l), "%s", pt_last_error());
    const pt_tensor *t = pt_st_find(&l.ts, "model.layers.1.mlp.experts.3.down_proj.weight");
    CHECK(t && l.s.layers[1].w.expert_down[3].data == t->data, "per-expert binding");
    CHECK(l.s.layers[0].norm_topk && l.s.layers[0].top_k == 2 && l.s.layers[0].q_norm == PT_NORM_W, "routing");
    CHECK(!l.s.tied && l.s.lm_head.data != l.s.embed.data, "untied");
    unload(&l);
    REQUIRE(load(FIX "minicpm", &l), "%s", pt_last_error());
    CHECK(l.s.embed_scale == 12.0f && fabsf(l.s.logit_scale - 0.5f) < 1e-7f, "mup embed/logit");
    CHECK(fabsf(l.s.layers[0].residual_scale - (float)(1.4 / sqrt(2.0))) < 1e-6f, "residual scale");
    unload(&l);
    REQUIRE(load(FIX "qwen2", &l), "%s", pt_last_error());
    CHECK(l.s.layers[0].w.q_bias.data && l.s.layers[0].w.v_bias.data && !l.s.layers[0].w.o_bias.data, "qkv bias");
    unload(&l);
}

/* Builds a model dir from the llama fixture's config with a custom tensor file. */
static void test_binding_errors(void) {
    char dir[512], p[700];
    test_tmpdir(dir, sizeof dir);
    char *cfg;
    size_t n;
    REQUIRE(pt_read_file(FIX "llama/config.json", &cfg, &n) == PT_OK, "read");
    snprintf(p, sizeof p, "%s/config.json", dir);
    pt_write_file(p, cfg, n);
    free(cfg);
    pt_tensor_set src;
    REQUIRE(pt_st_open_file(FIX "llama/model.safetensors", &src) == PT_OK, "open");
    /* copy every tensor, changing one to I32 */
    pt_st_entry *e = calloc((size_t)src.n_tensors + 3, sizeof *e);
    for (int i = 0; i < src.n_tensors; i++) {
        const pt_tensor *t = &src.tensors[i];
        e[i] = (pt_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
        if (!strcmp(t->name, "model.norm.weight")) e[i].dtype = PT_DTYPE_I16;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    REQUIRE(pt_st_write_file(p, e, src.n_tensors, NULL, 0) == PT_OK, "%s", pt_last_error());
    loaded l;
    CHECK(!load(dir, &l), "int norm accepted");
    CHECK(strstr(pt_last_error(), "model.norm.weight") && strstr(pt_last_error(), "I16"), "%s", pt_last_error());
    /* a U32 weight without scales */
    for (int i = 0; i < src.n_tensors; i++) e[i].dtype = src.tensors[i].dtype;
    for (int i = 0; i < src.n_tensors; i++)
        if (!strcmp(src.tensors[i].name, "model.layers.0.mlp.up_proj.weight")) {
            e[i].dtype = PT_DTYPE_U32;
            e[i].shape[1] /= 2;
        }
    REQUIRE(pt_st_write_file(p, e, src.n_tensors, NULL, 0) == PT_OK, "%s", pt_last_error());
    CHECK(!load(dir, &l), "u32 accepted");
    CHECK(strstr(pt_last_error(), "up_proj.weight") && strstr(pt_last_error(), ".scales"), "%s", pt_last_error());
    /* ... with scales but no biases */
    static uint16_t zeros[64 * 2];
    e[src.n_tensors] = (pt_st_entry){.name = "model.layers.0.mlp.up_proj.scales", .dtype = PT_DTYPE_BF16, .ndim = 2,
                                     .shape = {64, 1}, .data = zeros};
    REQUIRE(pt_st_write_file(p, e, src.n_tensors + 1, NULL, 0) == PT_OK, "%s", pt_last_error());
    CHECK(!load(dir, &l), "missing biases accepted");
    CHECK(strstr(pt_last_error(), "up_proj.biases' missing"), "%s", pt_last_error());
    /* ... with biases: 16 packed words for 32 columns = 4 bits, one group of 32 */
    e[src.n_tensors + 1] = (pt_st_entry){.name = "model.layers.0.mlp.up_proj.biases", .dtype = PT_DTYPE_BF16,
                                         .ndim = 2, .shape = {64, 1}, .data = zeros};
    for (int i = 0; i < src.n_tensors; i++)
        if (e[i].dtype == PT_DTYPE_U32) e[i].shape[1] = 4;
    REQUIRE(pt_st_write_file(p, e, src.n_tensors + 2, NULL, 0) == PT_OK, "%s", pt_last_error());
    CHECK(load(dir, &l), "%s", pt_last_error());
    if (l.ok) {
        CHECK(l.s.quantized && l.s.layers[0].w.up_proj.bits == 4 && l.s.layers[0].w.up_proj.group_size == 32, "q");
        unload(&l);
    }
    free(e);
    pt_st_close(&src);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

/* ------------------------------------------------------------------ */
/* quantize -> load -> compare with the source, weight by weight. */

typedef struct {
    const pt_weight **v;
    int n, cap;
} wlist;

static void collect(void *ctx, const pt_weight *w, int layer) {
    wlist *l = ctx;
    (void)layer;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = w;
}

static float elem(const pt_weight *w, int64_t i) { return pt_mlx_load_param(w->data, w->dtype, i); }

typedef struct {
    long n_quant, n_dense, n_elems, n_outside, n_folded;
    double max_err_over_scale;
} qstats;

/* Checks one quantized output weight against its float source. */
static int check_quantized(const pt_weight *src, const pt_weight *q, pt_mlx_rule rule, qstats *st) {
    int64_t rows = 1, cols = src->shape[src->ndim - 1];
    for (int k = 0; k + 1 < src->ndim; k++) rows *= src->shape[k];
    int gs = q->group_size, bits = q->bits, n = (1 << bits) - 1;
    float w[128];
    uint8_t codes[128];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < cols / gs; g++) {
            for (int j = 0; j < gs; j++) w[j] = elem(src, r * cols + g * gs + j);
            float s32, b32;
            pt_mlx_quantize_group(w, gs, bits, rule, &s32, &b32, codes);
            int64_t gi = r * (cols / gs) + g;
            float ss = pt_mlx_load_param(q->scales, q->qdtype, gi), sb = pt_mlx_load_param(q->biases, q->qdtype, gi);
            if (ss != pt_round_bf16(s32) || sb != pt_round_bf16(b32)) {
                printf("    %s row %lld group %lld: stored scale/bias %g/%g, rule gives %g/%g\n", q->name,
                       (long long)r, (long long)g, ss, sb, s32, b32);
                return 0;
            }
            const uint32_t *row = (const uint32_t *)q->data + r * (cols * bits / 32);
            for (int j = 0; j < gs; j++) {
                uint32_t c = pt_mlx_code(row, g * gs + j, bits);
                if (c != codes[j]) {
                    printf("    %s row %lld col %lld: code %u, rule gives %u\n", q->name, (long long)r,
                           (long long)(g * gs + j), c, codes[j]);
                    return 0;
                }
                float lo = fminf(b32, b32 + n * s32), hi = fmaxf(b32, b32 + n * s32);
                int inside = w[j] >= lo && w[j] <= hi;
                float err = fabsf((float)c * s32 + b32 - w[j]);
                float bound = (inside ? 0.5f : 1.0f) * fabsf(s32) * (1 + 1e-5f) + 1e-6f * fabsf(w[j]);
                if (!(err <= bound)) {
                    printf("    %s row %lld col %lld: |dequant - w| = %g > %s\n", q->name, (long long)r,
                           (long long)(g * gs + j), err, inside ? "scale/2" : "scale (clipped)");
                    return 0;
                }
                if (fabsf(s32) > 0) st->max_err_over_scale = fmax(st->max_err_over_scale, err / fabsf(s32));
                st->n_outside += !inside;
                st->n_elems++;
            }
        }
    st->n_quant++;
    return 1;
}

static void roundtrip(const char *name, int bits, int gs, const char *mixed, uint64_t shard, int want_shards) {
    char dir[512], out[600], in[300];
    test_tmpdir(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/out", dir);
    if (strchr(name, '/')) snprintf(in, sizeof in, "%s", name);
    else snprintf(in, sizeof in, FIX "%s", name);
    pt_quantize_params p = {.bits = bits, .group_size = gs, .mixed = mixed, .max_shard_bytes = shard};
    pt_quantize_report rep;
    pt_status s = pt_quantize_model(in, out, &p, &rep);
    CHECK(s == PT_OK, "%s: %s", name, pt_last_error());
    loaded a, b;
    if (!s && load(in, &a)) {
        if (load(out, &b)) {
            CHECK(b.s.quantized && b.s.mlx_layout && b.m.config.quant.present, "%s: quantized MLX output", name);
            CHECK(b.s.n_unaligned == 0, "%s: %d unaligned weights written", name, b.s.n_unaligned);
            CHECK(want_shards > 0 ? rep.n_shards == want_shards : rep.n_shards > 1, "%s: %d shards", name,
                  rep.n_shards);
            CHECK(b.ts.n_files == rep.n_shards, "%s: %d files loaded", name, b.ts.n_files);
            CHECK(b.s.n_params == a.s.n_params, "%s: params %lld vs %lld", name, (long long)b.s.n_params,
                  (long long)a.s.n_params);
            wlist wa = {0}, wb = {0};
            pt_spec_for_each_weight(&a.s, collect, &wa);
            pt_spec_for_each_weight(&b.s, collect, &wb);
            CHECK(wa.n == wb.n, "%s: %d vs %d weights", name, wa.n, wb.n);
            qstats st = {0};
            for (int i = 0; i < wa.n && i < wb.n && !test_failed_current; i++) {
                const pt_weight *x = wa.v[i], *y = wb.v[i];
                CHECK(pt_weight_numel(x) == pt_weight_numel(y), "%s: %s vs %s size", name, x->name, y->name);
                if (test_failed_current) break;
                if (y->bits) {
                    CHECK(check_quantized(x, y, PT_MLX_RULE_METAL, &st), "%s: %s", name, y->name);
                    if (y->ndim == 2 && !test_failed_current) { /* pt_weight_row_f32 = code*scale + bias */
                        int64_t cols = y->shape[1];
                        float *row = malloc((size_t)cols * sizeof *row);
                        pt_weight_row_f32(y, y->shape[0] - 1, row);
                        int64_t r = y->shape[0] - 1, g = (cols - 1) / y->group_size;
                        const uint32_t *pr = (const uint32_t *)y->data + r * (cols * y->bits / 32);
                        float want = (float)pt_mlx_code(pr, cols - 1, y->bits) *
                                         pt_mlx_load_param(y->scales, y->qdtype, r * (cols / y->group_size) + g) +
                                     pt_mlx_load_param(y->biases, y->qdtype, r * (cols / y->group_size) + g);
                        CHECK(row[cols - 1] == want, "%s: row_f32 %g vs %g", y->name, row[cols - 1], want);
                        free(row);
                    }
                    if (!mixed) CHECK(y->bits == bits || y->bits == 8, "%s: %s bits %d", name, y->name, y->bits);
                } else {
                    /* Qwen3.5 from a Hugging Face file: zero-centred norms get +1 folded in */
                    int fold = a.s.arch == PT_ARCH_QWEN3_5 && a.s.final_norm_style == PT_NORM_1PW &&
                               b.s.final_norm_style == PT_NORM_W &&
                               (strstr(y->name, "input_layernorm.weight") ||
                                strstr(y->name, "post_attention_layernorm.weight") || strstr(y->name, "q_norm.weight") ||
                                strstr(y->name, "k_norm.weight") || strstr(y->name, "model.norm.weight"));
                    if (fold) st.n_folded++;
                    for (int64_t k = 0; k < pt_weight_numel(x); k++)
                        if ((fold ? pt_round_bf16(elem(x, k) + 1.0f) : elem(x, k)) != elem(y, k)) {
                            CHECK(0, "%s: dense %s element %lld differs", name, y->name, (long long)k);
                            break;
                        }
                    st.n_dense++;
                }
            }
            CHECK(st.n_quant > 0 && st.n_elems > 0, "%s: nothing quantized", name);
            if (a.s.arch == PT_ARCH_QWEN3_5 && a.s.final_norm_style == PT_NORM_1PW)
                CHECK(st.n_folded > 0 && b.s.final_norm_style == PT_NORM_W, "%s: norms not folded", name);
            printf("INFO %s %d-bit g%d%s%s: %ld quantized / %ld dense weights (%ld norms +1 folded), %ld elements, "
                   "%ld clipped, max |dequant-w|/scale %.3f\n",
                   name, bits, gs, mixed ? " " : "", mixed ? mixed : "", st.n_quant, st.n_dense, st.n_folded,
                   st.n_elems, st.n_outside, st.max_err_over_scale);
            free(wa.v);
            free(wb.v);
            unload(&b);
        } else {
            CHECK(0, "%s: output does not load: %s", name, pt_last_error());
        }
        unload(&a);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

static void test_quantize_roundtrip(void) {
    roundtrip("llama", 4, 32, NULL, 0, 1);
    roundtrip("qwen2", 8, 32, NULL, 0, 1);
    roundtrip("qwen3_moe", 3, 32, NULL, 0, 1);
    roundtrip("gemma3", 5, 32, NULL, 0, 1);
    roundtrip("gemma4_mlx", 6, 32, NULL, 0, 1);
    roundtrip("qwen3_5_moe_mlx", 2, 32, NULL, 0, 1);
    roundtrip("minicpm", 4, 32, "mixed_3_6", 0, 1);
    roundtrip("llama", 4, 32, "mixed_2_6", 4096, -1); /* shards of at most 4 KiB */
}

/* Hugging Face fixtures of every family (tests/fixtures/<arch>, made by
 * transformers): fused Gemma 4 experts, KV-shared layers, PLE, Qwen3.5's
 * zero-centred norms and conv1d, the multimodal wrapper. */
static void test_quantize_oracle_fixtures(void) {
    static const char *fx[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "minicpm", "gemma2", "gemma3_text",
                               "gemma4_e", "gemma4_moe", "gemma4_dense", "gemma4_mm", "qwen3_5_text"};
    int n = 0;
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        char d[256];
        snprintf(d, sizeof d, "tests/fixtures/%s", fx[i]);
        if (!pt_is_dir(d)) continue;
        roundtrip(d, (int)(2 + i % 5), 64, NULL, 0, 1);
        n++;
        if (test_failed_current) return;
    }
    if (!n) TEST_SKIP("no transformers fixtures under tests/fixtures");
}

/* petrel quantize on a transformers fixture reproduces the oracle's MLX
 * checkpoint of the same weights (tests/fixtures/<x>_mlx_*, written by an
 * independent quantizer in mlx-lm's layout) tensor for tensor, byte for byte,
 * with the same quantization block in config.json. `prefix`: the oracle
 * wrote a multimodal-wrapper layout (language_model.*) for a text-only input,
 * which mlx-lm names without the wrapper. */
static void reproduce(const char *src, const char *ref, int bits, const char *mixed, const char *prefix) {
    char dir[512], out[600], rdir[300];
    snprintf(rdir, sizeof rdir, "tests/fixtures/%s", ref);
    if (!pt_is_dir(rdir)) return;
    test_tmpdir(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/out", dir);
    char in[300];
    snprintf(in, sizeof in, "tests/fixtures/%s", src);
    pt_quantize_params p = {.bits = bits, .group_size = 64, .mixed = mixed};
    pt_quantize_report rep;
    REQUIRE(pt_quantize_model(in, out, &p, &rep) == PT_OK, "%s: %s", src, pt_last_error());
    pt_tensor_set a, b;
    REQUIRE(pt_st_open_dir(out, &a) == PT_OK, "%s", pt_last_error());
    if (pt_st_open_dir(rdir, &b) != PT_OK) {
        pt_st_close(&a);
        REQUIRE(0, "%s", pt_last_error());
    }
    CHECK(a.n_tensors == b.n_tensors, "%s: %d tensors, oracle %d", ref, a.n_tensors, b.n_tensors);
    int same = 0;
    for (int i = 0; i < a.n_tensors; i++) {
        const pt_tensor *x = &a.tensors[i];
        char nm[512];
        snprintf(nm, sizeof nm, "%s%s", prefix, x->name);
        const pt_tensor *y = pt_st_find(&b, nm);
        if (!y) {
            CHECK(0, "%s: oracle has no '%s'", ref, nm);
            break;
        }
        if (x->dtype != y->dtype || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof x->shape) ||
            x->nbytes != y->nbytes || (x->nbytes && memcmp(x->data, y->data, x->nbytes))) {
            CHECK(0, "%s: '%s' differs from the oracle's", ref, x->name);
            break;
        }
        same++;
    }
    /* the quantization blocks, keys compared after the prefix */
    char ca[700], cb[400];
    snprintf(ca, sizeof ca, "%s/config.json", out);
    snprintf(cb, sizeof cb, "%s/config.json", rdir);
    pt_config A, B;
    if (pt_config_load(ca, &A) == PT_OK) {
        if (pt_config_load(cb, &B) == PT_OK) {
            CHECK(A.quant.bits == B.quant.bits && A.quant.group_size == B.quant.group_size &&
                      A.quant.n_overrides == B.quant.n_overrides,
                  "%s: quantization %d/%d/%d vs oracle %d/%d/%d", ref, A.quant.bits, A.quant.group_size,
                  A.quant.n_overrides, B.quant.bits, B.quant.group_size, B.quant.n_overrides);
            for (int i = 0; i < A.quant.n_overrides; i++) {
                char nm[512];
                int bb, bg;
                snprintf(nm, sizeof nm, "%s%s", prefix, A.quant.overrides[i].path);
                CHECK(pt_quant_lookup(&B.quant, nm, &bb, &bg) && bb == A.quant.overrides[i].bits &&
                          bg == A.quant.overrides[i].group_size,
                      "%s: entry %s", ref, nm);
            }
            pt_config_free(&B);
        }
        pt_config_free(&A);
    }
    printf("INFO petrel quantize %s -> %s: %d of %d tensors byte-identical to the oracle's\n", src, ref, same,
           b.n_tensors);
    pt_st_close(&a);
    pt_st_close(&b);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

static void test_quantize_reproduces_oracle(void) {
    if (!pt_is_dir("tests/fixtures/llama_mlx_q4")) TEST_SKIP("no MLX oracle fixtures");
    reproduce("llama", "llama_mlx_q4", 4, NULL, "");
    reproduce("llama", "llama_mlx_q8", 8, NULL, "");
    reproduce("llama", "llama_mlx_mixed_3_6", 3, "mixed_3_6", "");
    reproduce("qwen3_moe", "qwen3_moe_mlx_q4", 4, NULL, "");
    reproduce("gemma4_moe", "gemma4_moe_mlx_q4", 4, NULL, "language_model.");
}

/* The written bytes do not depend on the thread count. */
static void test_quantize_threads(void) {
    char dir[512], o1[600], o3[600];
    test_tmpdir(dir, sizeof dir);
    snprintf(o1, sizeof o1, "%s/t1", dir);
    snprintf(o3, sizeof o3, "%s/t3", dir);
    pt_quantize_params p = {.bits = 3, .group_size = 32, .n_threads = 1};
    pt_quantize_report rep;
    REQUIRE(pt_quantize_model(FIX "gemma4_mlx", o1, &p, &rep) == PT_OK, "%s", pt_last_error());
    p.n_threads = 3;
    REQUIRE(pt_quantize_model(FIX "gemma4_mlx", o3, &p, &rep) == PT_OK, "%s", pt_last_error());
    char a[700], b[700], *x, *y;
    size_t nx, ny;
    snprintf(a, sizeof a, "%s/model.safetensors", o1);
    snprintf(b, sizeof b, "%s/model.safetensors", o3);
    REQUIRE(pt_read_file(a, &x, &nx) == PT_OK && pt_read_file(b, &y, &ny) == PT_OK, "read");
    CHECK(nx == ny && !memcmp(x, y, nx), "1 and 3 threads wrote different bytes");
    free(x);
    free(y);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

static void test_quantize_refuses(void) {
    char dir[512], out[600], out2[600];
    test_tmpdir(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/q", dir);
    snprintf(out2, sizeof out2, "%s/q2", dir);
    pt_quantize_params p = {.bits = 4, .group_size = 32};
    pt_quantize_report rep;
    REQUIRE(pt_quantize_model(FIX "llama", out, &p, &rep) == PT_OK, "%s", pt_last_error());
    CHECK(pt_quantize_model(FIX "llama", out, &p, &rep) != PT_OK && strstr(pt_last_error(), "not empty"),
          "non-empty output accepted");
    CHECK(pt_quantize_model(out, out2, &p, &rep) != PT_OK && strstr(pt_last_error(), "already quantized"),
          "quantized input accepted");
    p.bits = 7;
    CHECK(pt_quantize_model(FIX "llama", out2, &p, &rep) != PT_OK && strstr(pt_last_error(), "--bits 7"), "bits");
    p.bits = 4;
    p.mixed = "mixed_9_9";
    CHECK(pt_quantize_model(FIX "llama", out2, &p, &rep) != PT_OK && strstr(pt_last_error(), "mixed_9_9"), "mixed");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

int main(void) {
    TEST_RUN(test_llama);
    TEST_RUN(test_gemma3_wrapper);
    TEST_RUN(test_gemma4_mlx);
    TEST_RUN(test_qwen3_5_mlx);
    TEST_RUN(test_qwen3_moe_hf_and_minicpm);
    TEST_RUN(test_binding_errors);
    TEST_RUN(test_quantize_roundtrip);
    TEST_RUN(test_quantize_oracle_fixtures);
    TEST_RUN(test_quantize_reproduces_oracle);
    TEST_RUN(test_quantize_threads);
    TEST_RUN(test_quantize_refuses);
    return test_summary();
}
