/* The server's pipelined turn on CUDA (tests/batch_ahead.h has the turns):
 * the GPU sampler writes each sampled id into the next step's table, the
 * step (a CUDA graph) is enqueued before the host waits for the ids, and the
 * step after takes its rows; every session ends each turn as sampling and
 * stepping plainly leaves it, bit for bit (tokens, log-probabilities,
 * logits). Models: the bundled demo model and the llama-3.2-1b shape with
 * random 4-bit weights. Not here: the CPU form (tests/test_batch_ahead.c). */
#include "backend/cuda/cuda.h" /* pt_device_resolve */
#include "base/mmap.h"
#include "batch_ahead.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"
#include "test.h"

static void check_model(const char *dir) {
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    pt_model *m = NULL;
    pt_status st = strncmp(dir, "synthetic:", 10) == 0 ? pt_model_synthetic(dir + 10, "q4", &mp, &m)
                                                      : pt_model_load(dir, &mp, &m);
    REQUIRE(st == PT_OK, "load %s on CUDA: %s", dir, pt_last_error());
    const int on_device = batch_ahead_check(m, dir, 0);
    CHECK(on_device > 0, "%s: the pipelined draws ran on the GPU sampler (%d of them)", dir, on_device);
    /* every row greedy without a log-probability: the greedy ids' kernel writes the results */
    char label[256];
    snprintf(label, sizeof label, "%s, greedy without log-probabilities", dir);
    const int on_device2 = batch_ahead_check(m, label, 1);
    CHECK(on_device2 > 0, "%s: the pipelined draws ran on the GPU sampler (%d of them)", label, on_device2);
    int64_t counts[3];
    pt_batch_counts(m, counts);
    CHECK(counts[0] > 0, "%s: the steps ran from CUDA graphs (%lld graph, %lld eager, %lld row mode)", dir,
          (long long)counts[0], (long long)counts[1], (long long)counts[2]);
    pt_model_free(&m);
}

static void test_cuda_batch_ahead(void) {
    pt_device d;
    char desc[256];
    if (pt_device_resolve(PT_DEVICE_AUTO, &d, desc, sizeof desc) != PT_OK || d != PT_DEVICE_CUDA)
        TEST_SKIP("no usable GPU (%s)", desc);
    if (pt_is_dir("models/kjv-llama-4bit")) check_model("models/kjv-llama-4bit");
    else printf("INFO demo model absent: skipped\n");
    check_model("synthetic:llama-3.2-1b");
}

int main(void) {
    TEST_RUN(test_cuda_batch_ahead);
    return test_summary();
}
