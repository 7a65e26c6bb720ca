/* Small pieces shared by the CUDA tests (tests/cuda/test_*.c, op_check.h):
 * whether a CUDA device is usable, a CUDA backend of one activation mode,
 * a bf16 backend reserved for GEMV-sized op tests, and random weights
 * prepared on a backend. Header-only (static inline), included once per
 * test binary. Not a harness of its own: tests/test.h runs the tests. */
#ifndef PT_TESTS_CUDA_GPU_UTIL_H
#define PT_TESTS_CUDA_GPU_UTIL_H

#include "test.h"
#include "test_rand.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"

#include <stdint.h>
#include <stdio.h>

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

/* A random weight (32-bit code words, tests/test_rand.h) prepared on be;
 * 0 (the test CHECK failed) if preparing it failed. */
static inline int gpu_qw_make(pt_backend *be, rand_qweight *q, int bits, int gs, int64_t N, int64_t K, int with_bias) {
    rand_qweight_make(q, N, K, bits, gs, with_bias, 1);
    NEED(be->ops->prepare_weight(be, &q->w, "w") == PT_OK, "prepare: %s", pt_last_error());
    return 1;
}

static inline void gpu_qw_free(pt_backend *be, rand_qweight *q) {
    be->ops->release_weight(be, &q->w);
    rand_qweight_free(q);
}

#endif
