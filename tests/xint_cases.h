/* The kernel cases shared by tests/test_cpu_xint.c (4-bit) and
 * tests/test_cpu_xint8.c (8-bit): exact integer sums, and the documented
 * error bound against a double-precision reference. They draw their random
 * inputs from the including test's source (tests/test_rand.h, included
 * first), so each test's stream of inputs is its own; hence header-only
 * (static inline), where the non-random support is in xint_check.c.
 * Not a harness: the tests' TEST_RUN functions call these. */
#ifndef PT_TESTS_XINT_CASES_H
#define PT_TESTS_XINT_CASES_H

#include "test.h"
#include "test_rand.h"
#include "xint_check.h"

#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Code j of a row of `bits` (4: two per byte, low nibble first; 8: a byte). */
static inline int xint_code(const uint8_t *c, int64_t j, int bits) {
    return bits == 8 ? c[j] : j % 2 ? c[j / 2] >> 4 : c[j / 2] & 15;
}

/* Integer x in [-xmax, xmax] (-xmax, xmax and 0 present), random codes (8
 * bits: 255 and 0 present), scales 1 or 2, integer biases, groups
 * 32/64/128, K 128..512: the caller picks xmax so that every sum is an
 * exact integer below 2^24; k's result must equal the exact sum. */
static inline void xint_check_exact(const xint_kernel *k, int bits, int xmax) {
    static const int gss[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++)
        for (int64_t K = 128; K <= 512; K *= 2) {
            int gs = gss[gi];
            int64_t ng = K / gs, nc = K * bits / 8; /* groups, code bytes per row */
            float *x = malloc(sizeof(float) * (size_t)K);
            uint8_t *codes[4];
            uint16_t *sc[4], *bi[4];
            for (int64_t j = 0; j < K; j++) x[j] = (float)((int)(ru32() % (uint32_t)(2 * xmax + 1)) - xmax);
            x[0] = (float)-xmax, x[(gs + 1) % K] = (float)xmax, x[K - 1] = 0.0f; /* K = gs: x[1] */
            for (int r = 0; r < 4; r++) {
                codes[r] = malloc((size_t)nc);
                sc[r] = malloc(2 * (size_t)ng), bi[r] = malloc(2 * (size_t)ng);
                for (int64_t j = 0; j < nc; j++) codes[r][j] = (uint8_t)ru32();
                if (bits == 8) codes[r][1] = 255, codes[r][2] = 0;
                for (int64_t g = 0; g < ng; g++) {
                    sc[r][g] = pt_f32_to_bf16((float)(1 + ru32() % 2));
                    bi[r][g] = pt_f32_to_bf16((float)((int)(ru32() % 9) - 4));
                }
            }
            float out[4];
            REQUIRE(xint_run(k, out, x, (const uint8_t *const *)codes, (const uint16_t *const *)sc,
                             (const uint16_t *const *)bi, K, gs),
                    "refused integer x");
            for (int r = 0; r < 4; r++) {
                double ref = 0;
                for (int64_t j = 0; j < K; j++)
                    ref += ((double)pt_bf16_to_f32(sc[r][j / gs]) * xint_code(codes[r], j, bits) +
                            pt_bf16_to_f32(bi[r][j / gs])) *
                           x[j];
                CHECK(out[r] == (float)ref, "gs %d K %lld row %d: %.9g vs exact %.9g", gs, (long long)K, r, out[r], ref);
            }
            for (int r = 0; r < 4; r++) free(codes[r]), free(sc[r]), free(bi[r]);
            free(x);
        }
}

/* Random weights of `bits`, K values per row (<= 4096), groups 32/64/128,
 * x of several kinds: ordinary activations, 50 octaves in every group with
 * some zeros, a group of zeros, subnormals, and (8 bits) all near -max with
 * every code 255 (the int32 sums at their largest); against double within
 * the bound: x rounded by at most 2^-21·max|x_g| per value (8 bits: and
 * 2^-121 where the step is held at 2^-120) plus f32 rounding. */
static inline void xint_check_bound(const xint_kernel *k, int bits, int64_t K) {
    static const int gss[3] = {32, 64, 128};
    for (int kind = 0; kind < (bits == 8 ? 5 : 4); kind++)
        for (int gi = 0; gi < 3; gi++) {
            int gs = gss[gi];
            int64_t ng = K / gs;
            float *x = malloc(sizeof(float) * (size_t)K);
            for (int64_t j = 0; j < K; j++) {
                float v;
                if (kind == 0) v = rf(-2, 2); /* ordinary activations */
                else if (kind == 1) /* 50 octaves in every group, some zeros */
                    v = (ru32() % 8 == 0) ? 0.0f : ldexpf(rf(1, 2), (int)(ru32() % 50) - 40) * (ru32() % 2 ? 1 : -1);
                else if (kind == 2) v = j / gs == 3 ? 0.0f : rf(-100, 100); /* a group of zeros */
                else if (kind == 3) v = ldexpf(rf(-1, 1), -130);          /* subnormals (bf16 keeps some bits) */
                else v = (j % 4 == 0) ? -1.0f : -0.9921875f; /* all near -max: |Σ q·X| at its bound with q = 255 */
                x[j] = pt_round_bf16(v);
            }
            rand_qweight q;
            rand_qweight_make(&q, 4, K, bits, gs, 0, 0);
            if (kind == 4) memset(q.codes, 255, (size_t)(4 * K));
            const uint8_t *codes[4];
            const uint16_t *sc[4], *bi[4];
            for (int r = 0; r < 4; r++) {
                codes[r] = (const uint8_t *)q.codes + r * K * bits / 8;
                sc[r] = q.sc + r * ng;
                bi[r] = q.bi + r * ng;
            }
            float out[4], xs[128];
            REQUIRE(xint_run(k, out, x, codes, sc, bi, K, gs), "kind %d gs %d refused", kind, gs);
            xint_group_sums(xs, x, K, gs);
            for (int r = 0; r < 4; r++) {
                double ref = 0, mag = 0, xr = 0;
                for (int64_t g = 0; g < ng; g++) {
                    double s = pt_bf16_to_f32(sc[r][g]), b = pt_bf16_to_f32(bi[r][g]), mx = 0, sq = 0;
                    for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
                        int qv = xint_code(codes[r], j, bits);
                        ref += s * qv * x[j];
                        mag += fabs(s * qv * x[j]);
                        mx = fmax(mx, fabs(x[j]));
                        sq += fabs(s) * qv;
                    }
                    ref += b * xs[g];
                    mag += fabs(b * xs[g]);
                    /* x's rounding: at most 2^-21·max|x_g| per value; for 8 bits also 2^-121 where the step
                     * is held at 2^-120 (a group whose max is under 2^-100; arrange() in qdot_xint_avx512.c) */
                    xr += (bits == 8 ? fmax(ldexp(mx, -21), ldexp(1.0, -121)) : ldexp(mx, -21)) * sq;
                }
                double err = fabs(out[r] - ref), tol = xr + 8e-6 * mag + 1e-37;
                CHECK(err <= tol, "kind %d gs %d row %d: %.9g vs %.9g (err %.3g, bound %.3g)", kind, gs, r, out[r], ref,
                      err, tol);
            }
            rand_qweight_free(&q);
            free(x);
        }
}

#endif
