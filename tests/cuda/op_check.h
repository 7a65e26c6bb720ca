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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- kv_append + attention, CUDA against the CPU ---- */

/* An attention case: heads, KV heads, head dim, cache capacity, the
 * positions before the chunk (p0) and its rows (T), window, soft-cap, cache
 * dtype (test_cuda_kvq's qcase: these fields, then bits and group size). */
#define ACASE_FIELDS   \
    int nh, nkv, hd;   \
    int64_t cap;       \
    int p0, T, window; \
    float softcap;     \
    pt_ftype dt;
typedef struct {
    ACASE_FIELDS
} acase;

enum { ATTN_TWICE = 1, ATTN_CACHE = 2 };

/* A RoPE case's inputs (tests of rope_qk_kv_append): inverse frequencies of
 * rot dims (inv[rot / 2]), positions p0 … p0 + T − 1 (pos[T]), q, k and v
 * filled in activation mode a; the frequencies and positions uploaded
 * (*invd, *pd, freed by the caller) and the RoPE over them returned. */
static inline pt_rope rope_case(pt_backend *G, int a, int rot, int p0, int T, float *inv, int32_t *pos, float *q,
                                int64_t nq, float *k, float *v, int64_t nk, float **invd, int32_t **pd) {
    for (int i = 0; i < rot / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / rot);
    for (int t = 0; t < T; t++) pos[t] = p0 + t;
    fill_act(q, nq, -2, 2, a);
    fill_act(k, nk, -2, 2, a);
    fill_act(v, nk, -2, 2, a);
    *invd = put(G, inv, (size_t)(rot / 2) * 4);
    *pd = put(G, pos, (size_t)T * 4);
    pt_rope r = {rot, *invd, 1.0f};
    return r;
}

/* Fills both backends' caches with positions [0, p0) in chunks of up to 64
 * rows, as the forward pass does, then appends the chunk [p0, p0 + T) and
 * attends with it (act a, keys in [-kr, kr], values in [-1, 1], queries in
 * [-2, 2]), comparing CUDA with the CPU; ATTN_TWICE: the CUDA attention runs
 * again and must give the same bytes; ATTN_CACHE: the caches' key bytes
 * must be equal. label names the check. */
static inline int attn_check(int a, const acase *c, const char *label, float kr, int flags) {
    pt_backend *G = G_[a], *C = C_[a];
    const size_t cb = (size_t)c->nkv * (size_t)c->cap * (size_t)c->hd * pt_ftype_size(c->dt);
    pt_kv_layer kc = {.n_kv = c->nkv, .head_dim = c->hd, .capacity = c->cap, .dtype = c->dt}, kg = kc;
    kc.k = calloc(cb, 1), kc.v = calloc(cb, 1);
    kg.k = put(G, NULL, cb), kg.v = put(G, NULL, cb);
    const int maxc = c->T > 64 ? c->T : 64;
    const int64_t qn = (int64_t)maxc * c->nh * c->hd, kvn = (int64_t)maxc * c->nkv * c->hd;
    float *q = malloc(qn * 4), *k = malloc(kvn * 4), *v = malloc(kvn * 4), *oc = malloc(qn * 4), *og = malloc(qn * 4),
          *og2 = malloc(qn * 4);
    float *qd = put(G, NULL, qn * 4), *kd = put(G, NULL, kvn * 4), *vd = put(G, NULL, kvn * 4), *od = put(G, NULL, qn * 4);
    int32_t *pos = malloc(maxc * 4), *pd = put(G, NULL, maxc * 4);
    pt_attn p = {.n_heads = c->nh, .head_dim = c->hd, .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                 .window = c->window};
    int ok = 1;
    const int total = c->p0 + c->T;
    for (int s0 = 0; s0 < total && ok;) {
        int n = s0 < c->p0 ? (c->p0 - s0 < 64 ? c->p0 - s0 : 64) : c->T;
        if (n > c->cap) n = (int)c->cap;
        for (int t = 0; t < n; t++) pos[t] = s0 + t;
        fill_act(k, (int64_t)n * c->nkv * c->hd, -kr, kr, a);
        fill_act(v, (int64_t)n * c->nkv * c->hd, -1, 1, a);
        fill_act(q, (int64_t)n * c->nh * c->hd, -2, 2, a);
        G->ops->upload(G, pd, pos, n * 4);
        G->ops->upload(G, kd, k, (size_t)n * c->nkv * c->hd * 4);
        G->ops->upload(G, vd, v, (size_t)n * c->nkv * c->hd * 4);
        G->ops->upload(G, qd, q, (size_t)n * c->nh * c->hd * 4);
        CHECK(C->ops->kv_append(C, &kc, k, v, n, pos) == PT_OK, "cpu kv_append: %s", pt_last_error());
        CHECK(G->ops->kv_append(G, &kg, kd, vd, n, pd) == PT_OK, "cuda kv_append: %s", pt_last_error());
        s0 += n;
        if (s0 < total) continue;
        pt_status s = C->ops->attention(C, oc, q, n, pos, &kc, &p);
        CHECK(s == PT_OK, "cpu attention: %s", pt_last_error());
        const size_t ob = (size_t)n * c->nh * c->hd * 4;
        s = G->ops->attention(G, od, qd, n, pd, &kg, &p);
        if (s == PT_OK) s = G->ops->download(G, og, od, ob);
        if (s == PT_OK && (flags & ATTN_TWICE)) s = G->ops->attention(G, od, qd, n, pd, &kg, &p);
        if (s == PT_OK && (flags & ATTN_TWICE)) s = G->ops->download(G, og2, od, ob);
        CHECK(s == PT_OK, "cuda attention: %s", pt_last_error());
        char what[200];
        snprintf(what, sizeof what, "%s act=%d nh=%d nkv=%d hd=%d cap=%lld p0=%d T=%d window=%d softcap=%g %s", label, a,
                 c->nh, c->nkv, c->hd, (long long)c->cap, c->p0, c->T, c->window, c->softcap, pt_ftype_name(c->dt));
        ok = s == PT_OK && compare(what, og, oc, (int64_t)n * c->nh * c->hd, a ? 2e-2 : 1e-5, a ? 2e-2 : 1e-4);
        if (flags & ATTN_TWICE) CHECK(!memcmp(og, og2, ob), "%s: a second run differs", what);
        if (flags & ATTN_CACHE) { /* the cache itself: same rows, same conversion */
            void *kh = malloc(cb);
            G->ops->download(G, kh, kg.k, cb);
            CHECK(memcmp(kh, kc.k, cb) == 0, "%s: cache contents differ", what);
            free(kh);
        }
    }
    G->ops->dealloc(G, kg.k), G->ops->dealloc(G, kg.v), G->ops->dealloc(G, qd), G->ops->dealloc(G, kd);
    G->ops->dealloc(G, vd), G->ops->dealloc(G, od), G->ops->dealloc(G, pd);
    free(kc.k), free(kc.v), free(q), free(k), free(v), free(oc), free(og), free(og2), free(pos);
    return ok && !test_failed_current;
}

#endif
