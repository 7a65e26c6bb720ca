/* Checks shared by the tests of the CPU decode kernels with x as integer
 * pieces (tests/test_cpu_xint.c: 4-bit, tests/test_cpu_xint8.c: 8-bit;
 * qdot_xint_avx512.c): whether the machine has them, the group sums, both
 * parameter variants run and compared bitwise, the preparation's refusals,
 * and an avx512 CPU backend.
 *
 * What it is: test support linked into every test binary. What it is not: the
 * cases and their double-precision references (tests/xint_cases.h). */
#ifndef PT_TESTS_XINT_CHECK_H
#define PT_TESTS_XINT_CHECK_H

#include "backend/backend.h"

#include <stdint.h>

/* One kernel family: the preparation of x, and the 4-row kernel with f32
 * (dot) or bf16-as-stored (dots) scales and biases. */
typedef struct {
    int (*arrange)(int8_t *xq, float *step, const float *x, int64_t K, int gs);
    void (*dot)(float *out, const int8_t *xq, const float *xstep, const float *xs, const uint8_t *const *codes,
                const float *const *sc, const float *const *bi, int64_t K, int gs);
    void (*dots)(float *out, const int8_t *xq, const float *xstep, const float *xs, const uint8_t *const *codes,
                 const uint16_t *const *sc, const uint16_t *const *bi, int64_t K, int gs);
} xint_kernel;

extern const xint_kernel xint_kernel4, xint_kernel8;

/* AVX-512 (F, BW, VL, DQ) and VNNI present: the kernels may be called. */
int xint_available(void);

/* xs[g] = the f32 sum of x over group g (K/gs groups). */
void xint_group_sums(float *xs, const float *x, int64_t K, int gs);

/* Runs both parameter variants of k on 4 rows (codes, sc16, bi16 [4] row
 * pointers); CHECKs they agree bitwise; out[4] = the result. Returns 0 when
 * the preparation refuses x. */
int xint_run(const xint_kernel *k, float *out, const float *x, const uint8_t *const *codes, const uint16_t *const *sc16,
             const uint16_t *const *bi16, int64_t K, int gs);

/* CHECKs that arrange takes x [256] (plain bf16 values, drawn by the caller
 * so its random stream stays its own) and refuses K % 128 != 0, group 16,
 * a value that is not bf16, NaN and infinity; x[77] is overwritten. Call
 * only when xint_available(). */
void xint_check_refusals(int (*arrange)(int8_t *xq, float *step, const float *x, int64_t K, int gs), float *x);

/* A CPU backend of `threads` threads with bf16 activations in *be, or *be
 * NULL when its ISA is not avx512 (the caller skips). Returns 0 if creating
 * it failed. */
int xint_avx512_backend(pt_backend **be, int threads);

/* CHECKs a prefill GEMM on integer pieces, y1 [T, N], against double
 * precision within the pieces' bound (2^-8 relative, 2^-21·max|x_g| per
 * code, f32 rounding) and against the f32 GEMM's y0 [T, N] within 2^-7:
 * weight codes [N, K] of `bits` (4: two per byte, low nibble first; 8: one
 * per byte), bf16 scales and biases sc/bi [N, K/gs], bf16 bias [N]; x [T, K]. */
void xint_check_gemm(const void *codes, int bits, const uint16_t *sc, const uint16_t *bi, const uint16_t *bias,
                     const float *x, const float *y1, const float *y0, int T, int64_t N, int64_t K, int gs);

#endif
