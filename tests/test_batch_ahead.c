/* The server's pipelined turn on the CPU (tests/batch_ahead.h has the
 * turns): pt_session_rows_ahead then pt_session_decode_rows leaves every
 * session as sampling and stepping plainly does, bit for bit. On the CPU the
 * draws are taken on the host before the step runs (the server pipelines
 * there only with PETREL_SERVE_PIPELINE=1: the host thread computes the
 * step itself). The bundled demo model, f32 and bf16 activations, padded to
 * the CUDA graph buckets as on the GPU. Not here: the GPU sampler's form
 * (tests/cuda/test_cuda_batch_ahead.c), the scheduler's pipelined turns
 * (tests/test_serve_pipeline.c). */
#include "base/mmap.h"
#include "batch_ahead.h"
#include "petrel.h"
#include "test.h"

static void run(pt_compute_dtype dt, int pad, const char *label) {
    const char *dir = "models/kjv-llama-4bit";
    if (!pt_is_dir(dir)) TEST_SKIP("demo model absent");
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = 2;
    mp.dtype = dt;
    pt_model *m = NULL;
    REQUIRE(pt_model_load(dir, &mp, &m) == PT_OK, "load: %s", pt_last_error());
    if (pad) REQUIRE(pt_batch_set_padding(m, 1) == PT_OK, "padding: %s", pt_last_error());
    batch_ahead_check(m, label, 0);
    char l2[128];
    snprintf(l2, sizeof l2, "%s, greedy without log-probabilities", label);
    batch_ahead_check(m, l2, 1);
    pt_model_free(&m);
}

static void test_batch_ahead_f32(void) { run(PT_COMPUTE_F32, 0, "demo, f32"); }
static void test_batch_ahead_bf16_padded(void) { run(PT_COMPUTE_BF16, 1, "demo, bf16, padded rows"); }

int main(void) {
    TEST_RUN(test_batch_ahead_f32);
    TEST_RUN(test_batch_ahead_bf16_padded);
    return test_summary();
}
