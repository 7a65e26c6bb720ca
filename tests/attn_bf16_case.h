/* Inputs of the bf16 attention-score kernel tests (tests/test_cpu_attn_dp.c,
 * tests/test_cpu_attn_amx.c): bf16 values of a spread of magnitudes, n key
 * rows of hd, and one case's queries (nt tokens of G heads of hd, qs =
 * G·hd + 32 apart) with its scores buffer ([nt·G][n + 5], every entry the
 * guard so a test sees what the kernel wrote). Drawn from test_rand.h's
 * source in the order the tests always drew them. Header-only. */
#ifndef PT_TESTS_ATTN_BF16_CASE_H
#define PT_TESTS_ATTN_BF16_CASE_H

#include "test_rand.h"

#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define GUARD 1e30f

/* a bf16 value in [lo, hi) times 2^e */
static inline float bfv(float lo, float hi, int e) { return pt_bf16_to_f32(pt_f32_to_bf16(ldexpf(rf(lo, hi), e))); }

/* n key rows of hd bf16 values, magnitudes 2^-3 .. 2^3 (malloc) */
static inline uint16_t *attn_case_keys(int n, int hd) {
    uint16_t *kc = malloc(sizeof(uint16_t) * (size_t)n * hd);
    for (int64_t i = 0; i < (int64_t)n * hd; i++) kc[i] = pt_f32_to_bf16(bfv(-1.0f, 1.0f, (int)(i % 7) - 3));
    return kc;
}

typedef struct {
    float *q, *S;    /* queries [nt][qs], scores [nt·G][lds] (malloc) */
    int64_t qs, lds; /* G·hd + 32, n + 5 */
} attn_case;

/* One case's bf16-valued queries (magnitudes 2^-2 .. 2^2 of [-0.5, 0.5)) and its guarded scores buffer */
static inline attn_case attn_case_make(int n, int hd, int G, int nt) {
    attn_case c = {.qs = (int64_t)G * hd + 32, .lds = n + 5};
    c.q = malloc(sizeof(float) * (size_t)c.qs * nt), c.S = malloc(sizeof(float) * (size_t)nt * G * c.lds);
    for (int64_t i = 0; i < c.qs * nt; i++) c.q[i] = bfv(-0.5f, 0.5f, (int)(i % 5) - 2);
    for (int64_t i = 0; i < (int64_t)nt * G * c.lds; i++) c.S[i] = GUARD;
    return c;
}

static inline void attn_case_free(attn_case *c) { free(c->q), free(c->S); }

/* Every case of the scores tests: head dims hds[0 .. nhd), 1-77 keys (one key, partial, whole and more than one
 * 32-key block), 1-8 heads a group, 1-8 tokens a call; fn checks one (the kernel not yet run on c->S). Returns
 * how many cases ran. */
typedef void (*attn_case_fn)(const uint16_t *kc, attn_case *c, int hd, int n, int G, int nt);
static inline int attn_case_each(const int *hds, int nhd, attn_case_fn fn) {
    static const int Gs[] = {1, 2, 4, 8}, ntv[] = {1, 3, 8}, ns[] = {1, 15, 32, 33, 77};
    int cases = 0;
    for (int hi = 0; hi < nhd; hi++)
        for (int ni = 0; ni < 5; ni++) {
            const int hd = hds[hi], n = ns[ni];
            uint16_t *kc = attn_case_keys(n, hd);
            for (int gi = 0; gi < 4; gi++)
                for (int ti = 0; ti < 3; ti++) {
                    attn_case c = attn_case_make(n, hd, Gs[gi], ntv[ti]);
                    fn(kc, &c, hd, n, Gs[gi], ntv[ti]);
                    attn_case_free(&c);
                    cases++;
                }
            free(kc);
        }
    return cases;
}

#endif
