/* Shared scaffolding of the CUDA batching tests (test_cuda_batch.c,
 * test_cuda_batch_rows.c): loading a model on the GPU with the next loads'
 * quantized-KV setting and compiled decode on or off, and the check that a
 * usable GPU is there. Header-only: each test binary includes it once. Not a
 * harness (tests/batch_check.h runs the schedules, tests/test.h the tests). */
#ifndef PT_TESTS_CUDA_BATCH_GPU_H
#define PT_TESTS_CUDA_BATCH_GPU_H

#include "backend/cuda/cuda.h" /* pt_device_resolve */
#include "model/model.h"        /* pt_model_synthetic */
#include "petrel.h"

#include <stdio.h>
#include <string.h>

static int g_kv_quant; /* --kv-quant for the next loads (0 = off) */

/* dir: a model directory, or "synthetic:<shape>" (random 4-bit weights).
 * NULL when it does not load (said in an INFO line). */
static pt_model *load(const char *dir, pt_compute_dtype dt, int compiled) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    if (g_kv_quant) {
        mp.kv_quant = g_kv_quant;
        mp.quantized_kv_start = 8; /* each session's cache converts at its own step */
    }
    mp.dtype = dt;
    mp.compiled_decode = compiled ? PT_LEVER_ON : PT_LEVER_OFF;
    pt_model *m = NULL;
    if (strncmp(dir, "synthetic:", 10) == 0) {
        if (pt_model_synthetic(dir + 10, "q4", &mp, &m) != PT_OK) printf("INFO %s: %s\n", dir, pt_last_error());
    } else if (pt_model_load(dir, &mp, &m) != PT_OK) {
        printf("INFO %s on CUDA: %s\n", dir, pt_last_error());
    }
    return m;
}

static int gpu_ok(void) {
    pt_device d;
    char desc[256];
    if (pt_device_resolve(PT_DEVICE_AUTO, &d, desc, sizeof desc) != PT_OK || d != PT_DEVICE_CUDA) {
        printf("INFO no usable GPU (%s): skipped\n", desc);
        return 0;
    }
    return 1;
}

#endif
