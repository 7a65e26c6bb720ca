/* Helpers shared by the CPU op tests (tests/test_ops.c: matmul and embed;
 * tests/test_ops_layer.c: the other ops): random fills, the per-element
 * tolerance check, the ISAs to sweep and a CPU backend for each, and a random
 * weight (dense or MLX quantized, optionally per expert, with a bias) kept
 * beside its dequantized values in double for the references.
 *
 * Header-only, like test_rand.h: the random source is file-local, so each
 * including test draws from its own stream. Not the references of the ops
 * (each test file holds those of its ops). */
#ifndef PT_TESTS_CPU_OP_CHECK_H
#define PT_TESTS_CPU_OP_CHECK_H

#include "test.h"
#include "test_rand.h" /* ru32, rf (the default seed; rng reseeded by some tests) */

#include "backend/backend.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static inline void fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = rf(lo, hi);
}
static inline void fill_bf16vals(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = pt_round_bf16(rf(lo, hi));
}

/* Compares got[n] with ref[n]; prints the first mismatch. Returns 1 if all close. */
static inline int close_enough(const char *what, const float *got, const double *ref, int64_t n, double atol,
                               double rtol) {
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(got[i]) || isnan(ref[i]) || d > atol + rtol * fabs(ref[i])) {
            CHECK(0, "%s: element %lld: got %.9g, expected %.9g (|diff| %.3g > %.3g)", what, (long long)i, got[i],
                  ref[i], d, atol + rtol * fabs(ref[i]));
            return 0;
        }
    }
    return 1;
}

static inline double rnd_act(pt_act_dtype act, double v) { return act == PT_ACT_BF16 ? pt_round_bf16((float)v) : v; }

static const pt_cpu_isa all_isas[] = {PT_ISA_SCALAR, PT_ISA_AVX2, PT_ISA_AVX512};

/* Creates a CPU backend or returns NULL when the ISA is not available here. */
static inline pt_backend *mk(int nth, pt_act_dtype act, pt_cpu_isa isa) {
    pt_backend *be = NULL;
    pt_cpu_params p = {.n_threads = nth, .act = act, .isa = isa};
    if (pt_backend_cpu_create(&be, &p) != PT_OK) return NULL;
    return be;
}

static inline float ft_get(pt_ftype t, const void *p, int64_t i) {
    if (t == PT_FT_F32) return ((const float *)p)[i];
    if (t == PT_FT_BF16) return pt_bf16_to_f32(((const uint16_t *)p)[i]);
    return pt_f16_to_f32(((const uint16_t *)p)[i]);
}
/* Stores v (assumed representable or rounded) as type t. */
static inline void ft_set(pt_ftype t, void *p, int64_t i, float v) {
    if (t == PT_FT_F32) ((float *)p)[i] = v;
    else if (t == PT_FT_BF16) ((uint16_t *)p)[i] = pt_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = pt_f32_to_f16(v);
}

/* ---- a random weight, dense or quantized, with its dequantized values ---- */

typedef struct {
    pt_matrix w;
    double *deq; /* [E, rows, cols] */
    double *bias;
    void *data, *scales, *biases, *bvec;
} tweight;

/* Packs code q (bits wide) as value i of a little-endian bit stream. */
static inline void pack_code(uint8_t *row, int bits, int64_t i, unsigned q) {
    for (int b = 0; b < bits; b++) {
        int64_t bit = i * bits + b;
        if (q >> b & 1) row[bit / 8] |= (uint8_t)(1u << (bit % 8));
    }
}

static inline void tw_make(tweight *t, int64_t E, int64_t N, int64_t K, pt_ftype dt, int bits, int gs,
                           int with_bias) {
    memset(t, 0, sizeof *t);
    int64_t EE = E > 0 ? E : 1;
    t->deq = calloc((size_t)(EE * N * K), sizeof(double));
    t->w = (pt_matrix){.rows = N, .cols = K, .n_experts = E, .dtype = dt, .bits = bits, .group_size = gs};
    if (!bits) {
        t->data = calloc((size_t)(EE * N * K), 4);
        for (int64_t i = 0; i < EE * N * K; i++) {
            float v = rf(-1, 1);
            ft_set(dt, t->data, i, v);
            t->deq[i] = ft_get(dt, t->data, i);
        }
    } else {
        int64_t ng = K / gs;
        size_t row_bytes = (size_t)K * bits / 8;
        t->data = calloc((size_t)(EE * N) * row_bytes + 16, 1);
        t->scales = calloc((size_t)(EE * N * ng), 4);
        t->biases = calloc((size_t)(EE * N * ng), 4);
        for (int64_t r = 0; r < EE * N; r++) {
            uint8_t *row = (uint8_t *)t->data + r * row_bytes;
            for (int64_t g = 0; g < ng; g++) {
                ft_set(dt, t->scales, r * ng + g, rf(-0.1f, 0.1f));
                ft_set(dt, t->biases, r * ng + g, rf(-0.5f, 0.5f));
                double s = ft_get(dt, t->scales, r * ng + g), b = ft_get(dt, t->biases, r * ng + g);
                for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
                    unsigned q = ru32() & ((1u << bits) - 1u);
                    pack_code(row, bits, j, q);
                    t->deq[r * K + j] = s * q + b;
                }
            }
        }
        t->w.scales = t->scales;
        t->w.biases = t->biases;
    }
    t->w.data = t->data;
    if (with_bias) {
        t->bvec = calloc((size_t)(EE * N), 2);
        t->bias = calloc((size_t)(EE * N), sizeof(double));
        for (int64_t i = 0; i < EE * N; i++) {
            ft_set(PT_FT_BF16, t->bvec, i, rf(-1, 1));
            t->bias[i] = ft_get(PT_FT_BF16, t->bvec, i);
        }
        t->w.bias = t->bvec;
        t->w.bias_dtype = PT_FT_BF16;
    }
}

static inline void tw_free(tweight *t) {
    free(t->deq);
    free(t->bias);
    free(t->data);
    free(t->scales);
    free(t->biases);
    free(t->bvec);
}

#endif
