/* Shared pieces of the whole-step dev benchmarks (dev/bench_decode_step.c,
 * dev/bench_decode_ab.c, dev/bench_prefill_step.c): the clock, synthetic
 * MLX-quantized weights (group 64, bf16 scales/biases, pseudo-random codes),
 * a llama layer stack of them, a filled bf16 KV cache, the activations of a
 * step and a median. Not part
 * of the build or the tests; header-only (static functions, one includer per
 * binary). */
#ifndef PT_DEV_STEP_COMMON_H
#define PT_DEV_STEP_COMMON_H

#include "backend/backend.h"
#include "base/half.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* The clock now() reads: wall time by default; a one-thread run sets a CPU
 * clock in main (other processes on a shared machine disturb it far less). */
static clockid_t bench_clock = CLOCK_MONOTONIC;
static double now(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* bytes of every weight qmat made (codes + scales + biases) */
static size_t total_bytes;

/* An N x K MLX weight of `bits` (4 or 8), group 64: codes [N, K*bits/8]
 * bytes, scales [N, K/64] then biases [N, K/64] bf16 in one buffer; prepared
 * by the backend as a model's weight would be. */
static pt_matrix qmat(pt_backend *be, int64_t N, int64_t K, int bits) {
    int gs = 64;
    size_t cb = (size_t)N * K * bits / 8, pb = (size_t)N * (K / gs) * 2;
    uint8_t *c = aligned_alloc(64, cb);
    uint16_t *p = aligned_alloc(64, 2 * pb);
    for (size_t i = 0; i < cb; i++) c[i] = (uint8_t)((i * 2654435761u) >> 13);
    for (size_t i = 0; i < pb; i++) p[i] = pt_f32_to_bf16(0.002f * (float)((int)(i % 11) - 5));
    total_bytes += cb + 2 * pb;
    pt_matrix m = {.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = gs, .data = c, .scales = p,
                   .biases = p + N * (K / gs)};
    be->ops->prepare_weight(be, &m, "w");
    return m;
}

/* The L layers' weights of a llama of hidden H, nh/nkv heads of hd, FFN F:
 * each array holds L matrices (q, k, v, o, gate, up, down). */
static void bench_llama_weights(pt_backend *be, int L, int H, int nh, int nkv, int hd, int F, int bits, pt_matrix *wq,
                                pt_matrix *wk, pt_matrix *wv, pt_matrix *wo, pt_matrix *wg, pt_matrix *wu,
                                pt_matrix *wd) {
    for (int l = 0; l < L; l++) {
        wq[l] = qmat(be, nh * hd, H, bits), wk[l] = qmat(be, nkv * hd, H, bits), wv[l] = qmat(be, nkv * hd, H, bits);
        wo[l] = qmat(be, H, nh * hd, bits), wg[l] = qmat(be, F, H, bits), wu[l] = qmat(be, F, H, bits);
        wd[l] = qmat(be, H, F, bits);
    }
}

/* kv[0..L): bf16 caches of cap positions x nkv heads x hd, every position
 * filled (a cache at depth up to cap) with a fixed pattern. */
static void bench_kv_fill(pt_backend *be, pt_kv_layer *kv, int L, int nkv, int hd, int cap) {
    for (int l = 0; l < L; l++) {
        kv[l] = (pt_kv_layer){.n_kv = nkv, .head_dim = hd, .capacity = cap, .dtype = PT_FT_BF16};
        kv[l].k = be->ops->alloc(be, (size_t)cap * nkv * hd * 2);
        kv[l].v = be->ops->alloc(be, (size_t)cap * nkv * hd * 2);
        uint16_t *k = kv[l].k, *v = kv[l].v;
        for (size_t i = 0; i < (size_t)cap * nkv * hd; i++) k[i] = v[i] = pt_f32_to_bf16(0.01f * (float)(i % 37) - 0.18f);
    }
}

/* The activations of a step of T tokens (row-major [T, width] f32, 64-byte
 * aligned): x, xn [T, H]; q, att [T, nh*hd]; k, v [T, nkv*hd]; g, u [T, F];
 * y [T, H]; logits [V] (the last token's). */
typedef struct {
    float *x, *xn, *q, *k, *v, *att, *g, *u, *y, *logits;
} bench_acts;

/* Reserves the backend's scratch for T tokens at a context of cap and
 * allocates the activations. */
static bench_acts bench_acts_alloc(pt_backend *be, int T, int cap, int H, int nh, int nkv, int hd, int F, int V) {
    pt_backend_limits lim = {.max_tokens = T, .max_ctx = cap, .max_heads = nh, .max_head_dim = hd, .max_cols = F};
    be->ops->reserve(be, &lim);
    size_t Tz = (size_t)T;
    bench_acts a;
    a.x = aligned_alloc(64, 4 * H * Tz), a.xn = aligned_alloc(64, 4 * H * Tz), a.q = aligned_alloc(64, 4 * nh * hd * Tz);
    a.k = aligned_alloc(64, 4 * nkv * hd * Tz), a.v = aligned_alloc(64, 4 * nkv * hd * Tz);
    a.att = aligned_alloc(64, 4 * nh * hd * Tz);
    a.g = aligned_alloc(64, 4 * F * Tz), a.u = aligned_alloc(64, 4 * F * Tz), a.y = aligned_alloc(64, 4 * H * Tz);
    a.logits = aligned_alloc(64, 4 * (size_t)V);
    return a;
}

static inline int bench_cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* the median of v[0..n) (sorts v) */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
