/* Small pieces shared by the CUDA tests (tests/cuda/test_*.c, op_check.h):
 * whether a CUDA device is usable, a CUDA backend of one activation mode,
 * a bf16 backend reserved for GEMV-sized op tests, random weights
 * prepared on a backend, and a short greedy run of a whole model. Header-only (static inline), included once per
 * test binary. Not a harness of its own: tests/test.h runs the tests. */
#ifndef PT_TESTS_CUDA_GPU_UTIL_H
#define PT_TESTS_CUDA_GPU_UTIL_H

#include "test.h"
#include "test_rand.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/mmap.h" /* pt_is_dir */
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when a CUDA device is usable; else 0, after "INFO <info>: <why>" when
 * info is not NULL. */
static inline int gpu_usable(const char *info) {
    char why[512];
    if (pt_cuda_device_count(why, sizeof why) == 0) {
        if (info) printf("INFO %s: %s\n", info, why);
        return 0;
    }
    return 1;
}

/* A CUDA backend on device 0 with activations act in *g; 0 after an
 * "INFO cuda backend: ..." line if creating it failed. */
static inline int gpu_backend_create(pt_backend **g, pt_act_dtype act) {
    pt_cuda_params gp = {0, act};
    if (pt_backend_cuda_create(g, &gp) != PT_OK) {
        printf("INFO cuda backend: %s\n", pt_last_error());
        return 0;
    }
    return 1;
}

/* A bf16 CUDA backend reserved for GEMV tests: max_tokens tokens, 4096
 * columns, a context of 16 and one head of 64. NULL (the test CHECK
 * failed) if creating or reserving it failed. */
static inline pt_backend *gpu_open_gemv(int max_tokens) {
    pt_backend *be = NULL;
    if (pt_backend_cuda_create(&be, &(pt_cuda_params){0, PT_ACT_BF16}) != PT_OK) {
        CHECK(0, "cuda: %s", pt_last_error());
        return NULL;
    }
    pt_backend_limits lim = {
        .max_tokens = max_tokens, .max_ctx = 16, .max_heads = 1, .max_head_dim = 64, .max_cols = 4096};
    if (be->ops->reserve(be, &lim) != PT_OK) {
        CHECK(0, "reserve: %s", pt_last_error());
        pt_backend_free(&be);
    }
    return be;
}

/* A random weight (32-bit code words, tests/test_rand.h) with the role
 * role (pt_matrix.role, as the model loader sets it: it decides the
 * weight's split) prepared on be; 0 (the test CHECK failed) if preparing it
 * failed. gpu_qw_make: no role. */
static inline int gpu_qw_make_role(pt_backend *be, rand_qweight *q, int bits, int gs, int64_t N, int64_t K,
                                   int with_bias, int role) {
    rand_qweight_make(q, N, K, bits, gs, with_bias, 1);
    q->w.role = role;
    NEED(be->ops->prepare_weight(be, &q->w, "w") == PT_OK, "prepare: %s", pt_last_error());
    return 1;
}
static inline int gpu_qw_make(pt_backend *be, rand_qweight *q, int bits, int gs, int64_t N, int64_t K, int with_bias) {
    return gpu_qw_make_role(be, q, bits, gs, N, K, with_bias, PT_ROLE_NONE);
}

static inline void gpu_qw_free(pt_backend *be, rand_qweight *q) {
    be->ops->release_weight(be, &q->w);
    rand_qweight_free(q);
}

/* Loads dir (a model folder, or "synthetic:<shape>" of quantization quant)
 * on CUDA with compiled decode, prefills 20 tokens, then takes 5 greedy
 * steps: the logits after the prompt and after each step into *logits
 * ([6, *V], malloc'd), the greedy tokens into ids_out[6] (when not NULL),
 * and count()'s growth over the run into *launches. Returns 1, or 0 (the
 * test CHECK failed). */
static inline int gpu_model_greedy(const char *dir, const char *quant, float **logits, int32_t *ids_out, int *V,
                                   unsigned long long (*count)(void), unsigned long long *launches) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    mp.compiled_decode = PT_LEVER_ON;
    pt_model *m = NULL;
    pt_status st = strncmp(dir, "synthetic:", 10) == 0 ? pt_model_synthetic(dir + 10, quant, &mp, &m)
                                                       : pt_model_load(dir, &mp, &m);
    NEED(st == PT_OK, "load %s: %s", dir, pt_last_error());
    *V = pt_model_vocab_size(m);
    pt_session_params sp = pt_session_default_params();
    sp.n_ctx = 64;
    pt_session *s = NULL;
    NEED(pt_session_create(m, &sp, &s) == PT_OK, "session: %s", pt_last_error());
    enum { P = 20, STEPS = 5 };
    int32_t ids[P];
    for (int i = 0; i < P; i++) ids[i] = (int32_t)(1 + (i * 37) % (*V - 1));
    *logits = malloc((size_t)(STEPS + 1) * (size_t)*V * 4);
    const unsigned long long c0 = count();
    int ok = pt_session_prompt(s, ids, P) == PT_OK;
    for (int k = 0; ok && k <= STEPS; k++) {
        const float *lg = pt_session_logits(s);
        ok = lg != NULL;
        if (!ok) break;
        memcpy(*logits + (size_t)k * *V, lg, (size_t)*V * 4);
        int32_t best = 0;
        for (int v = 1; v < *V; v++)
            if (lg[v] > lg[best]) best = v;
        if (ids_out) ids_out[k] = best;
        if (k < STEPS) ok = pt_session_prompt(s, &best, 1) == PT_OK;
    }
    *launches = count() - c0;
    CHECK(ok, "%s: run: %s", dir, pt_last_error());
    pt_session_free(&s);
    pt_model_free(&m);
    return ok;
}

/* Runs gpu_model_greedy on dir with a switch on (set(1)), then off
 * (set(0)), then set(-1): every logits row and greedy id must be
 * bit-identical, count() must grow with the switch on and not with it off.
 * what names the switch in the messages. A folder that is absent is
 * skipped with an INFO line. */
static inline void gpu_forward_on_off(const char *dir, const char *quant, void (*set)(int),
                                      unsigned long long (*count)(void), const char *what) {
    if (strncmp(dir, "synthetic:", 10) && !pt_is_dir(dir)) {
        printf("INFO %s absent, skipped\n", dir);
        return;
    }
    float *on = NULL, *off = NULL;
    int32_t ids_on[6], ids_off[6];
    int V = 0, V2 = 0;
    unsigned long long l_on = 0, l_off = 0;
    set(1);
    int ok = gpu_model_greedy(dir, quant, &on, ids_on, &V, count, &l_on);
    set(0);
    ok = ok && gpu_model_greedy(dir, quant, &off, ids_off, &V2, count, &l_off);
    set(-1);
    if (ok) {
        CHECK(l_on > 0, "%s %s: no launch counted with the %s on", dir, quant, what);
        CHECK(l_off == 0, "%s %s: %llu launches counted with the %s off", dir, quant, l_off, what);
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)6 * V; i++) bad += memcmp(&on[i], &off[i], 4) != 0;
        CHECK(bad == 0, "%s %s: %d of %lld logits differ between the %s on and off", dir, quant, bad,
              (long long)6 * V, what);
        CHECK(!memcmp(ids_on, ids_off, sizeof ids_on), "%s %s: greedy ids differ", dir, quant);
        printf("INFO %s %s: logits of the prompt and 5 greedy steps bit-identical with the %s on (%llu launches) "
               "and off\n",
               dir, quant, what, l_on);
    }
    free(on), free(off);
}


/* gpu_forward_on_off over the models a decode switch is checked on: the
 * demo model (4-bit) and the llama-3.2-1b shape at 4 and 8 bits. */
static inline void gpu_forward_on_off_models(void (*set)(int), unsigned long long (*count)(void), const char *what) {
    gpu_forward_on_off("models/kjv-llama-4bit", "q4", set, count, what);
    gpu_forward_on_off("synthetic:llama-3.2-1b", "q4", set, count, what);
    gpu_forward_on_off("synthetic:llama-3.2-1b", "q8", set, count, what);
}

#endif
