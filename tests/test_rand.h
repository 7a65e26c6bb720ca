/* Inputs of the op tests (CPU tests/test_*.c and CUDA tests/cuda/): a seeded
 * xorshift source (OP_CHECK_SEED, defined before the include, picks another
 * seed so a test's inputs stay what they were), uniform floats, activations
 * rounded as the forward pass holds them, random MLX affine weights, and
 * backend buffers with host contents. Header-only (one file-local source per
 * including test), included by tests/cuda/op_check.h and by the tests that
 * need only these. Not a harness. */
#ifndef PT_TESTS_TEST_RAND_H
#define PT_TESTS_TEST_RAND_H

#include "backend/backend.h"
#include "base/half.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef OP_CHECK_SEED
#define OP_CHECK_SEED 0x9e3779b97f4a7c15ull
#endif
static uint64_t rng = OP_CHECK_SEED;
static inline uint32_t ru32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static inline float rf(float lo, float hi) { return lo + (hi - lo) * (float)(ru32() & 0xffffff) / 16777216.0f; }
/* Activations as the forward pass holds them: bf16 values in bf16 mode. */
static inline void fill_act(float *x, int64_t n, float lo, float hi, int bf) {
    for (int64_t i = 0; i < n; i++) x[i] = bf ? pt_round_bf16(rf(lo, hi)) : rf(lo, hi);
}

/* A random MLX affine weight [N, K] of `bits`, group gs: codes [N, K*bits/8]
 * bytes, bf16 scales and biases [N, K/gs], an optional bf16 bias [N]; host
 * buffers (malloc), not yet prepared by a backend. Drawn in this order:
 * the codes (words: as 32-bit words ru32() ^ (ru32() << 21); else byte by
 * byte), then scale and bias of each group in turn, then the bias. */
typedef struct {
    pt_matrix w;
    void *codes;
    uint16_t *sc, *bi, *bias;
} rand_qweight;

static inline void rand_qweight_make(rand_qweight *q, int64_t N, int64_t K, int bits, int gs, int with_bias,
                                     int words) {
    const int64_t ng = K / gs;
    q->codes = malloc((size_t)(N * K * bits / 8));
    q->sc = malloc((size_t)(N * ng) * 2);
    q->bi = malloc((size_t)(N * ng) * 2);
    q->bias = with_bias ? malloc((size_t)N * 2) : NULL;
    if (words) {
        uint32_t *c = q->codes;
        for (int64_t i = 0; i < N * K * bits / 32; i++) c[i] = ru32() ^ (ru32() << 21);
    } else {
        uint8_t *c = q->codes;
        for (int64_t i = 0; i < N * K * bits / 8; i++) c[i] = (uint8_t)ru32();
    }
    for (int64_t i = 0; i < N * ng; i++) {
        q->sc[i] = pt_f32_to_bf16(rf(-0.05f, 0.05f));
        q->bi[i] = pt_f32_to_bf16(rf(-0.5f, 0.5f));
    }
    for (int64_t i = 0; with_bias && i < N; i++) q->bias[i] = pt_f32_to_bf16(rf(-1, 1));
    q->w = (pt_matrix){.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = gs, .data = q->codes,
                       .scales = q->sc, .biases = q->bi, .bias = q->bias, .bias_dtype = PT_FT_BF16};
}

/* Frees the host buffers (a backend's prepared copy is released by the caller). */
static inline void rand_qweight_free(rand_qweight *q) { free(q->codes), free(q->sc), free(q->bi), free(q->bias); }

/* Backend buffer with host contents (host may be NULL: zeroed). */
static inline void *put(pt_backend *be, const void *host, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    if (d && host && be->ops->upload(be, d, host, bytes) != PT_OK) {
        be->ops->dealloc(be, d);
        return NULL;
    }
    return d;
}

#endif
