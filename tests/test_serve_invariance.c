/* Long prompts through the serving scheduler on the CPU: the same reply bit
 * for bit alone, in company and from a reused prefix (tests/serve_invariance.h
 * has the scenarios). The CPU engine runs prompts through the prefill path by
 * default (engine prompt_rows_max 0); here prompt rows are switched on as on
 * CUDA (64), which is the configuration whose replies the scheduler keeps
 * exact (the CPU's decode kernels are batch-invariant like the GPU's). The
 * bundled demo model, bf16 activations. Not here: the CUDA run
 * (tests/cuda/test_cuda_serve_invariance.c). */
#include "base/mmap.h"
#include "petrel.h"
#include "serve_invariance.h"
#include "test.h"

static void test_serve_invariance_demo(void) {
    const char *dir = "models/kjv-llama-4bit";
    if (!pt_is_dir(dir)) TEST_SKIP("demo model absent");
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = 2;
    pt_model *m = NULL;
    SI_NEED(pt_model_load(dir, &mp, &m) == PT_OK, "load: %s", pt_last_error());
    pt_srv_engine e;
    SI_NEED(pt_srv_engine_from_model(&e, m, dir) == PT_OK, "engine: %s", pt_last_error());
    SI_NEED(e.session_decode_rows, "the CPU engine runs batched rows");
    e.prompt_rows_max = 64;
    serve_invariance_check(&e, "demo (CPU)", 0);
    pt_srv_engine_release(&e);
    pt_model_free(&m);
}

int main(void) {
    TEST_RUN(test_serve_invariance_demo);
    return test_summary();
}
