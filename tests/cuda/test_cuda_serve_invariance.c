/* Long prompts through the serving scheduler on CUDA: the same reply bit for
 * bit alone, in company and from a reused prefix (tests/serve_invariance.h
 * has the scenarios). The CUDA engine as `petrel serve --device cuda` builds
 * it (prompts and tails of up to 64 tokens as rows, GPU sampling on; the
 * compared requests ask for top logprobs, so they sample on the host from
 * the step's logits). Models: the bundled demo model and the llama-3.2-1b
 * shape with random 4-bit weights (no tokenizer: the scheduler gets a
 * detokenizer that yields no text), whose long-prompt prefill runs the GEMM
 * path (chunks over 64 tokens). Not here: the CPU run
 * (tests/test_serve_invariance.c). */
#include "backend/cuda/cuda.h" /* pt_device_resolve */
#include "base/mmap.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"
#include "serve_invariance.h"
#include "test.h"

static void check_model(const char *dir, int n_ctx) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    pt_model *m = NULL;
    pt_status st = strncmp(dir, "synthetic:", 10) == 0 ? pt_model_synthetic(dir + 10, "q4", &mp, &m)
                                                      : pt_model_load(dir, &mp, &m);
    SI_NEED(st == PT_OK, "load %s on CUDA: %s", dir, pt_last_error());
    pt_srv_engine e;
    SI_NEED(pt_srv_engine_from_model(&e, m, strncmp(dir, "synthetic:", 10) ? dir : NULL) == PT_OK, "engine: %s",
            pt_last_error());
    if (!e.has_tokenizer(e.model)) si_no_text(&e); /* the synthetic shape: ids only */
    CHECK(e.prompt_rows_max > 0 && e.session_decode_rows, "%s: the CUDA engine runs prompt rows", dir);
    serve_invariance_check(&e, dir, n_ctx);
    pt_srv_engine_release(&e);
    pt_model_free(&m);
}

static void test_cuda_serve_invariance(void) {
    pt_device d;
    char desc[256];
    if (pt_device_resolve(PT_DEVICE_AUTO, &d, desc, sizeof desc) != PT_OK || d != PT_DEVICE_CUDA)
        TEST_SKIP("no usable GPU (%s)", desc);
    if (pt_is_dir("models/kjv-llama-4bit")) check_model("models/kjv-llama-4bit", 0); /* its 512 tokens */
    else printf("INFO demo model absent: skipped\n");
    check_model("synthetic:llama-3.2-1b", 1024);
}

int main(void) {
    TEST_RUN(test_cuda_serve_invariance);
    return test_summary();
}
