/* Shared scaffolding of the CUDA op tests that check an op against the CPU
 * backend (test_cuda_ops.c, test_cuda_kvq.c, test_cuda_deltanet.c, ...): one CUDA and one CPU
 * backend per activation mode, a seeded random source, backend buffers with
 * host contents, and the per-element comparison |gpu − cpu| <= atol +
 * rtol·|cpu| (atol a fraction of the reference's largest magnitude; any NaN
 * fails; the widest gap is kept for a MEASURE line). Header-only: each test
 * binary includes it once. Not a harness of its own: tests/test.h runs the
 * tests. */
#ifndef PT_TESTS_CUDA_OP_CHECK_H
#define PT_TESTS_CUDA_OP_CHECK_H

#include "test.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"
#include "test_rand.h"
#include "gpu_util.h"

#include <math.h>
#include <stdint.h>

static pt_backend *G_[2], *C_[2]; /* [act]: CUDA and CPU backends (0: f32, 1: bf16) */
static int have_gpu;

static double worst_seen;
static int compare(const char *what, const float *got, const float *ref, int64_t n, double afrac, double rtol) {
    double mx = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
    double atol = afrac * mx + 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        double tol = atol + rtol * fabs(ref[i]);
        if (isnan(got[i]) || isnan(ref[i]) || d > tol) {
            CHECK(0, "%s: element %lld of %lld: cuda %.9g, cpu %.9g (|diff| %.3g > %.3g)", what, (long long)i,
                  (long long)n, got[i], ref[i], d, tol);
            return 0;
        }
        if (d / tol > worst) worst = d / tol;
    }
    if (worst > worst_seen) worst_seen = worst;
    return 1;
}

static int setup(void) {
    if (have_gpu) return 1;
    if (!gpu_usable(NULL)) return 0;
    for (int a = 0; a < 2; a++) {
        pt_cpu_params cp = {.n_threads = 2, .act = a ? PT_ACT_BF16 : PT_ACT_F32, .isa = PT_ISA_AUTO};
        if (!gpu_backend_create(&G_[a], a ? PT_ACT_BF16 : PT_ACT_F32)) return 0;
        if (pt_backend_cpu_create(&C_[a], &cp) != PT_OK) return 0;
        pt_backend_limits lim = {.max_tokens = 512, .max_ctx = 4096, .max_heads = 16, .max_head_dim = 256,
                                 .max_cols = 4096, .max_ffn = 512, .max_top_k = 8};
        if (G_[a]->ops->reserve(G_[a], &lim) != PT_OK || C_[a]->ops->reserve(C_[a], &lim) != PT_OK) return 0;
    }
    have_gpu = 1;
    return 1;
}
static void teardown(void) {
    for (int a = 0; a < 2; a++) {
        pt_backend_free(&G_[a]);
        pt_backend_free(&C_[a]);
    }
}
#define NEED_GPU()                                               \
    do {                                                         \
        if (!setup()) TEST_SKIP("no usable CUDA device here");   \
        worst_seen = 0;                                          \
    } while (0)
#define REPORT() printf("MEASURE %s: worst |diff|/tolerance %.3f\n", test_current, worst_seen)

#endif
