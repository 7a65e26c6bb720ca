/* Integer-piece kernel test support (see xint_check.h). */
#include "xint_check.h"

#include "test.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"
#include "petrel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const xint_kernel xint_kernel4 = {pt_cpu_arrange_xint, pt_cpu_qdot4_x4_xint, pt_cpu_qdot4_x4_xints};
const xint_kernel xint_kernel8 = {pt_cpu_arrange_xint8, pt_cpu_qdot8_x4_xint, pt_cpu_qdot8_x4_xints};

int xint_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && pt_cpu_gemm_i8_available();
}

void xint_group_sums(float *xs, const float *x, int64_t K, int gs) {
    for (int64_t g = 0; g < K / gs; g++) {
        float s = 0.0f;
        for (int64_t j = g * gs; j < (g + 1) * gs; j++)
            s += x[j];
        xs[g] = s;
    }
}

int xint_run(const xint_kernel *k, float *out, const float *x, const uint8_t *const *codes, const uint16_t *const *sc16,
             const uint16_t *const *bi16, int64_t K, int gs) {
    int64_t ng = K / gs;
    int8_t *xq = aligned_alloc(64, (size_t)(3 * K)); /* [3·K] pieces */
    float *st = malloc(sizeof(float) * (size_t)ng), *xs = malloc(sizeof(float) * (size_t)ng);
    float *sc = malloc(sizeof(float) * (size_t)(8 * ng)); /* per row [ng scales][ng biases] as f32 */
    const float *scp[4], *bip[4];
    for (int r = 0; r < 4; r++) {
        for (int64_t g = 0; g < ng; g++) {
            sc[r * 2 * ng + g] = pt_bf16_to_f32(sc16[r][g]);
            sc[r * 2 * ng + ng + g] = pt_bf16_to_f32(bi16[r][g]);
        }
        scp[r] = sc + r * 2 * ng;
        bip[r] = sc + r * 2 * ng + ng;
    }
    int ok = k->arrange(xq, st, x, K, gs);
    if (ok) {
        float o2[4];
        xint_group_sums(xs, x, K, gs);
        k->dot(out, xq, st, xs, codes, scp, bip, K, gs);
        k->dots(o2, xq, st, xs, codes, sc16, bi16, K, gs);
        CHECK(memcmp(out, o2, sizeof o2) == 0, "f32 and bf16 parameters differ: %g vs %g", out[0], o2[0]);
    }
    free(xq), free(st), free(xs), free(sc);
    return ok;
}

void xint_check_refusals(int (*arrange)(int8_t *xq, float *step, const float *x, int64_t K, int gs), float *x) {
    int8_t xq[3 * 256] __attribute__((aligned(64)));
    float st[8];
    CHECK(arrange(xq, st, x, 256, 64) == 1, "plain bf16 x");
    CHECK(arrange(xq, st, x, 192, 64) == 0, "K %% 128 != 0");
    CHECK(arrange(xq, st, x, 256, 16) == 0, "group 16");
    x[77] = 0.1234567f;
    CHECK(arrange(xq, st, x, 256, 64) == 0, "a value that is not bf16");
    x[77] = NAN;
    CHECK(arrange(xq, st, x, 256, 64) == 0, "NaN");
    x[77] = -INFINITY;
    CHECK(arrange(xq, st, x, 256, 64) == 0, "infinity");
}

int xint_avx512_backend(pt_backend **be, int threads) {
    pt_cpu_params cp = {.n_threads = threads, .act = PT_ACT_BF16};
    *be = NULL;
    if (pt_backend_cpu_create(be, &cp) != PT_OK) return 0;
    if (strcmp(pt_backend_cpu_isa_name(*be), "avx512")) pt_backend_free(be);
    return 1;
}

void xint_check_gemm(const void *codes, int bits, const uint16_t *sc, const uint16_t *bi, const uint16_t *bias,
                     const float *x, const float *y1, const float *y0, int T, int64_t N, int64_t K, int gs) {
    int64_t ng = K / gs;
    for (int t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double ref = pt_bf16_to_f32(bias[n]), mag = fabs(ref), xr = 0;
            for (int64_t g = 0; g < ng; g++) {
                double s = pt_bf16_to_f32(sc[n * ng + g]), b = pt_bf16_to_f32(bi[n * ng + g]), mx = 0, sq = 0;
                for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
                    const uint8_t *c = (const uint8_t *)codes + n * K * bits / 8;
                    int qv = bits == 8 ? c[j] : j % 2 ? c[j / 2] >> 4 : c[j / 2] & 15;
                    double term = (s * qv + b) * x[t * K + j];
                    ref += term;
                    mag += fabs(term);
                    mx = fmax(mx, fabs(x[t * K + j]));
                    sq += fabs(s) * qv;
                }
                xr += ldexp(mx, -21) * sq;
            }
            double v = y1[t * N + n], tol = ldexp(fabs(ref), -8) + xr + 8e-6 * mag + 1e-30;
            CHECK(fabs(v - ref) <= tol, "gs %d t %d n %lld: %.9g vs %.9g (bound %.3g)", gs, t, (long long)n, v, ref,
                  tol);
            CHECK(fabsf(y1[t * N + n] - y0[t * N + n]) <= ldexpf(fabsf(y0[t * N + n]), -7) + 1e-30f,
                  "gs %d t %d n %lld: %g (pieces) vs %g (f32 GEMM)", gs, t, (long long)n, y1[t * N + n],
                  y0[t * N + n]);
        }
}
