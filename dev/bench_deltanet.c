/* Gated delta rule benchmark for the CPU backend (not part of the build or
 * the tests): the delta_rule op on the qwen3.5-4b shape (16 key / 32 value
 * heads of 128), bf16 activations, token by token (T = 1, decode) or
 * chunked (T > 1, prefill), with strongly decaying gates (the chunked form's
 * exp(γ) factors reach the subnormal range, as in real checkpoints). Prints
 * the time per call and per layer-token.
 *
 *   dev/build.sh && dev/bench_deltanet [threads] [T] [iterations] */
#include "backend/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { HK = 16, HV = 32, DK = 128, DV = 128 };

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, T = argc > 2 ? atoi(argv[2]) : 1,
              iters = argc > 3 ? atoi(argv[3]) : 200;
    pt_cpu_params cp = {.n_threads = threads, .act = PT_ACT_BF16, .isa = PT_ISA_AUTO};
    pt_backend *be = NULL;
    if (T < 1 || iters < 1 || pt_backend_cpu_create(&be, &cp) != PT_OK) {
        fprintf(stderr, "usage: bench_deltanet [threads] [T >= 1] [iterations >= 1]\n");
        return 2;
    }
    const int ld = 2 * HK * DK + HV * DV;
    float *qkv = malloc(sizeof(float) * (size_t)T * ld), *b = malloc(sizeof(float) * (size_t)T * HV),
          *a = malloc(sizeof(float) * (size_t)T * HV), *out = malloc(sizeof(float) * (size_t)T * HV * DV),
          *S = calloc((size_t)HV * DK * DV, sizeof(float)), A_log[HV], dt_bias[HV];
    unsigned s = 1;
    for (long i = 0; i < (long)T * ld; i++) {
        s = s * 1664525u + 1013904223u;
        qkv[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    }
    for (long i = 0; i < (long)T * HV; i++) {
        b[i] = 0.3f;
        a[i] = 0.5f * (float)(i % 7) - 1.0f; /* decays exp(-softplus(a + 1)): 0.13 .. 0.6 per token */
    }
    for (int h = 0; h < HV; h++) {
        A_log[h] = 0.0f;
        dt_bias[h] = 1.0f;
    }
    pt_delta d = {.n_k_heads = HK, .n_v_heads = HV, .k_dim = DK, .v_dim = DV, .q_scale = 1.0f / sqrtf((float)DK),
                  .A_log = A_log, .dt_bias = dt_bias, .chunk = T > 1 ? 64 : 0};
    be->ops->delta_rule(be, out, qkv, b, a, T, S, &d); /* warm-up */
    const double t0 = now();
    for (int it = 0; it < iters; it++) be->ops->delta_rule(be, out, qkv, b, a, T, S, &d);
    const double el = now() - t0;
    printf("delta_rule %s, %d thread%s, T %d: %.3f ms per call, %.1f us per layer-token\n", T > 1 ? "chunked" : "recurrent",
           threads, threads == 1 ? "" : "s", T, el / iters * 1e3, el / iters / T * 1e6);
    free(qkv);
    free(b);
    free(a);
    free(out);
    free(S);
    pt_backend_free(&be);
    return 0;
}
