/* Inputs of the CUDA tests: a seeded xorshift source (OP_CHECK_SEED, defined
 * before the include, picks another seed so a test's inputs stay what they
 * were), uniform floats, activations rounded as the forward pass holds them,
 * and backend buffers with host contents. Header-only, included by
 * op_check.h and by the tests that need only these. Not a harness. */
#ifndef PT_TESTS_CUDA_TEST_RAND_H
#define PT_TESTS_CUDA_TEST_RAND_H

#include "backend/backend.h"
#include "base/half.h"

#include <stddef.h>
#include <stdint.h>

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
