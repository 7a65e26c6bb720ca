/* Loading a model directory into a pt_model: config files → tensor set →
 * model spec → backend → network (llama.c), plus the tokenizer, the chat
 * template, the eos set and the generation defaults. Freed in reverse. */
#include "model/model.h"

#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/mmap.h"
#include "base/threadpool.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "runtime/levers.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* spec.h clashes with backend.h (see llama.c); only these are needed here. */
struct pt_model_spec;
pt_status pt_model_spec_open(const struct pt_model_dir *md, const struct pt_tensor_set *ts,
                             struct pt_model_spec **out, int *checkpoint_bf16, const char **arch_name);
void pt_model_spec_close(struct pt_model_spec **s);

pt_model_params pt_model_default_params(void) {
    pt_model_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    p.device = PT_DEVICE_AUTO;
    p.dtype = PT_COMPUTE_MODEL;
    p.kv_quant = PT_LEVER_DEFAULT;
    p.kv_group_size = PT_LEVER_DEFAULT;
    p.quantized_kv_start = PT_LEVER_DEFAULT;
    p.prefill_chunk = PT_LEVER_DEFAULT;
    p.compiled_decode = PT_LEVER_DEFAULT;
    p.fused_decode_attn = PT_LEVER_DEFAULT;
    p.int8_act = PT_LEVER_DEFAULT;
    p.gpu_sampling = PT_LEVER_DEFAULT;
    return p;
}

static void gen_defaults(pt_model *m) {
    pt_sampling_params *g = &m->gen_defaults;
    memset(g, 0, sizeof *g);
    g->temperature = 1.0f;
    g->top_p = 1.0f;
    g->repetition_penalty = 1.0f;
    g->repeat_last_n = 64;
    const pt_generation_config *gc = &m->mdir->generation;
    if (!gc->present) return;
    if (gc->has_temperature && gc->temperature >= 0) g->temperature = (float)gc->temperature;
    if (gc->has_top_p && gc->top_p > 0 && gc->top_p <= 1) g->top_p = (float)gc->top_p;
    if (gc->has_top_k && gc->top_k >= 0 && gc->top_k < (1 << 30)) g->top_k = (int)gc->top_k;
    if (gc->has_min_p && gc->min_p >= 0 && gc->min_p <= 1) g->min_p = (float)gc->min_p;
    if (gc->has_repetition_penalty && gc->repetition_penalty > 0)
        g->repetition_penalty = (float)gc->repetition_penalty;
    if (gc->do_sample == 0) g->temperature = 0; /* do_sample: false = greedy */
}

static pt_status eos_set(pt_model *m) {
    const int32_t *src = NULL;
    size_t n = 0;
    const pt_generation_config *gc = &m->mdir->generation;
    if (gc->present && gc->n_eos > 0) {
        src = gc->eos_token_id;
        n = (size_t)gc->n_eos;
    } else if (m->tok) {
        n = pt_tokenizer_eos_ids(m->tok, &src);
    }
    if (n == 0 && m->mdir->config.n_eos > 0) {
        src = m->mdir->config.eos_token_id;
        n = (size_t)m->mdir->config.n_eos;
    }
    m->eos = malloc((n ? n : 1) * sizeof *m->eos);
    if (!m->eos) return pt_error(PT_ERR_NOMEM, "out of memory");
    if (n) memcpy(m->eos, src, n * sizeof *src);
    m->n_eos = n;
    return PT_OK;
}

void pt_model_cpu_backend_name(pt_model *m, int nth, pt_act_dtype act, const char *arch) {
    const char *qp = pt_backend_cpu_quant_paths(m->be);
    snprintf(m->backend_name, sizeof m->backend_name, "cpu (%s, %d thread%s, %s activations, %s%s%s)",
             pt_backend_cpu_isa_name(m->be), nth, nth == 1 ? "" : "s", act == PT_ACT_BF16 ? "bf16" : "f32", arch,
             qp ? "; " : "", qp ? qp : "");
}

static pt_status load(pt_model *m, const char *dir, const pt_model_params *params) {
    m->params = params ? *params : pt_model_default_params();
    pt_levers_resolve(&m->params);
    char devdesc[400];
    PT_TRY(pt_device_resolve(m->params.device, &m->device, devdesc, sizeof devdesc));
    pt_levers_for_device(&m->params, m->device);
    PT_TRY(pt_levers_check(&m->params, m->device));
    if (m->params.dtype != PT_COMPUTE_MODEL && m->params.dtype != PT_COMPUTE_F32 &&
        m->params.dtype != PT_COMPUTE_BF16)
        return pt_error(PT_ERR_INVALID_ARG, "unknown compute dtype %d", (int)m->params.dtype);

    m->mdir = calloc(1, sizeof *m->mdir);
    m->weights = calloc(1, sizeof *m->weights);
    if (!m->mdir || !m->weights) return pt_error(PT_ERR_NOMEM, "out of memory");
    PT_TRY(pt_model_dir_load(dir, m->mdir));
    PT_TRY(pt_st_open_dir(dir, m->weights));
    int ckpt_bf16 = 0;
    const char *arch = NULL;
    PT_TRY(pt_model_spec_open(m->mdir, m->weights, &m->spec, &ckpt_bf16, &arch));

    pt_act_dtype act = m->params.dtype == PT_COMPUTE_BF16 ? PT_ACT_BF16
                       : m->params.dtype == PT_COMPUTE_F32 ? PT_ACT_F32
                       : ckpt_bf16                          ? PT_ACT_BF16
                                                            : PT_ACT_F32;
    if (m->device == PT_DEVICE_CUDA) {
        pt_cuda_params gp = {0, act};
        PT_TRY(pt_backend_cuda_create(&m->be, &gp));
        PT_TRY(pt_net_build(m));
        snprintf(m->backend_name, sizeof m->backend_name, "%.48s, %s act., %.16s", devdesc,
                 act == PT_ACT_BF16 ? "bf16" : "f32", arch);
    } else {
        pt_cpu_params cp = {.n_threads = m->params.n_threads, .act = act, .isa = PT_ISA_AUTO,
                            .int8_act = m->params.int8_act == PT_LEVER_ON};
        PT_TRY(pt_backend_cpu_create(&m->be, &cp));
        PT_TRY(pt_net_build(m));
        pt_model_cpu_backend_name(m, m->params.n_threads > 0 ? m->params.n_threads : pt_cpu_count(), act, arch);
    }

    if (m->mdir->has_tokenizer_json) PT_TRY(pt_tokenizer_load_dir(dir, &m->tok));
    pt_status st = pt_chat_template_load(dir, m->params.chat_template_path, &m->tmpl);
    if (st == PT_ERR_NOT_FOUND && !m->params.chat_template_path) m->tmpl = NULL;
    else if (st != PT_OK) return st;
    PT_TRY(eos_set(m));
    gen_defaults(m);
    /* the id is the directory's basename ("models/demo/" -> "demo") */
    m->id = strdup(dir);
    if (m->id) {
        size_t l = strlen(m->id);
        while (l > 1 && m->id[l - 1] == '/') m->id[--l] = 0;
        char *b = strrchr(m->id, '/');
        if (b && b[1]) memmove(m->id, b + 1, strlen(b + 1) + 1);
    }
    m->dir = strdup(dir);
    if (!m->id || !m->dir) return pt_error(PT_ERR_NOMEM, "out of memory");
    return PT_OK;
}

pt_status pt_model_load(const char *dir, const pt_model_params *params, pt_model **out) {
    if (!out) return pt_error(PT_ERR_INVALID_ARG, "pt_model_load: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return pt_error(PT_ERR_INVALID_ARG, "pt_model_load: no model directory given");
    if (!pt_is_dir(dir)) return pt_error(PT_ERR_NOT_FOUND, "model directory %s does not exist", dir);
    pt_model *m = calloc(1, sizeof *m);
    if (!m) return pt_error(PT_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->lock, NULL);
    pt_status st = load(m, dir, params);
    if (st != PT_OK) {
        pt_error_prefix(st, "%s", dir);
        pt_model_free(&m);
        return st;
    }
    *out = m;
    return PT_OK;
}

void pt_model_free(pt_model **model) {
    if (!model || !*model) return;
    pt_model *m = *model;
    if (m->batch_free) m->batch_free(m);
    pt_net_free(m);
    pt_backend_free(&m->be);
    pt_model_spec_close(&m->spec);
    if (m->weights) {
        pt_st_close(m->weights);
        free(m->weights);
    }
    if (m->mdir) {
        pt_model_dir_free(m->mdir);
        free(m->mdir);
    }
    pt_tokenizer_free(&m->tok);
    pt_chat_template_free(&m->tmpl);
    free(m->eos);
    free(m->id);
    free(m->dir);
    pthread_mutex_destroy(&m->lock);
    free(m);
    *model = NULL;
}
