/* Plain C kernels: the portable fallback (PETREL_CPU_ISA=scalar) and the
 * definition of what the SIMD kernels compute. 4 accumulators in the dots
 * so the compiler can pipeline them; no intrinsics. */
#include "backend/cpu/cpu_internal.h"

void pt_cpu_permute_x4(float *xp, const float *x, int64_t K) {
    for (int64_t b = 0; b < K; b += 32)
        for (int i = 0; i < 16; i++) {
            xp[b + i] = x[b + 2 * i];
            xp[b + 16 + i] = x[b + 2 * i + 1];
        }
}

int pt_cpu_arrange_x4_bf16(uint16_t *xa, const float *x, int64_t K) {
    if (K % 128) return 0;
    for (int64_t b = 0; b < K; b += 128)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 16; i++) {
                uint16_t h0 = pt_f32_to_bf16(x[b + 8 * i + k]), h1 = pt_f32_to_bf16(x[b + 8 * i + 4 + k]);
                /* exact only: a value that bf16 rounds is refused (the caller keeps the f32
                 * kernel), and so is a subnormal, which vdpbf16ps would read as zero */
                if (pt_bf16_to_f32(h0) != x[b + 8 * i + k] || pt_bf16_to_f32(h1) != x[b + 8 * i + 4 + k]) return 0;
                if (((h0 & 0x7f80) == 0 && (h0 & 0x7f)) || ((h1 & 0x7f80) == 0 && (h1 & 0x7f))) return 0;
                xa[b + 32 * k + 2 * i] = h0;
                xa[b + 32 * k + 2 * i + 1] = h1;
            }
    return 1;
}

void pt_cpu_panel_t16_ref(float *wp, int r0, const float *rows, int64_t K) {
    for (int r = 0; r < 16; r++)
        for (int64_t k = 0; k < K; k++) wp[k * 32 + r0 + r] = rows[r * K + k];
}

void pt_cpu_arrange_x4_i8_128(int8_t *dst, const int8_t *xq, int64_t K) {
    for (int64_t c = 0; c < K; c += 128)
        for (int i = 0; i < 64; i++) {
            dst[c + i] = xq[c + 2 * i];
            dst[c + 64 + i] = xq[c + 2 * i + 1];
        }
}

void pt_cpu_arrange_x4_i8(int8_t *dst, const int8_t *xq, int64_t K) {
    for (int64_t c = 0; c < K; c += 64) {
        int half = K - c >= 64 ? 32 : 16;
        for (int i = 0; i < half; i++) {
            dst[c + i] = xq[c + 2 * i];
            dst[c + half + i] = xq[c + 2 * i + 1];
        }
    }
}

void pt_cpu_qdot4_x4_i8_ref(float *out, const int8_t *xq, const float *xd, const float *xs,
                            const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                            int gs) {
    for (int r = 0; r < 4; r++) {
        float acc = 0.0f;
        for (int64_t g = 0; g < K / gs; g++) {
            int32_t s = 0;
            for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
                int64_t cb = j - j % 64, half = K - cb >= 64 ? 32 : 16;
                int q = j % 2 ? codes[r][j / 2] >> 4 : codes[r][j / 2] & 15;
                s += q * xq[cb + (j % 64) / 2 + (j % 2) * half];
            }
            acc += sc[r][g] * xd[g] * (float)s + bi[r][g] * xs[g];
        }
        out[r] = acc;
    }
}

void pt_cpu_qdot8_x4_i8_ref(float *out, const int8_t *xq, const float *xd, const float *xs,
                            const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                            int gs) {
    for (int r = 0; r < 4; r++) {
        float acc = 0.0f;
        for (int64_t g = 0; g < K / gs; g++) {
            int32_t s = 0;
            for (int64_t j = g * gs; j < (g + 1) * gs; j++) s += codes[r][j] * xq[j];
            acc += sc[r][g] * xd[g] * (float)s + bi[r][g] * xs[g];
        }
        out[r] = acc;
    }
}

void pt_cpu_dequant_q_ref(float *dst, const uint8_t *row, int64_t k0, int64_t n, const float *sc, const float *bi,
                          int gs, int bits) {
    for (int64_t b = 0; b < n; b += 32) {
        int64_t g = (k0 + b) / gs;
        float s = sc[g], o = bi[g];
        for (int i = 0; i < 32; i++) {
            float q;
            if (bits == 8) q = (float)row[k0 + b + i];
            else {
                uint8_t c = row[(k0 + b) / 2 + (i & 15)];
                q = (float)(i < 16 ? c & 15 : c >> 4);
            }
            dst[b + i] = s * q + o;
        }
    }
}

static float dot_f32(const float *x, const float *w, int64_t n) {
    float a[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) a[j] += x[i + j] * w[i + j];
    for (; i < n; i++) a[0] += x[i] * w[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static float dot_bf16(const float *x, const uint16_t *w, int64_t n) {
    float a[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) a[j] += x[i + j] * pt_bf16_to_f32(w[i + j]);
    for (; i < n; i++) a[0] += x[i] * pt_bf16_to_f32(w[i]);
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static float dot_f16(const float *x, const uint16_t *w, int64_t n) {
    float a[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) a[j] += x[i + j] * pt_f16_to_f32(w[i + j]);
    for (; i < n; i++) a[0] += x[i] * pt_f16_to_f32(w[i]);
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_bf16(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * pt_bf16_to_f32(x[i]);
}

static float qdot4(const float *xp, const uint8_t *codes, const float *sc, int64_t K, int gs) {
    float acc = 0.0f;
    for (int64_t g = 0; g < K / gs; g++) {
        float s = 0.0f;
        for (int64_t b = g * gs; b < (g + 1) * gs; b += 32) {
            const uint8_t *c = codes + b / 2;
            for (int i = 0; i < 16; i++) s += (float)(c[i] & 15) * xp[b + i] + (float)(c[i] >> 4) * xp[b + 16 + i];
        }
        acc += sc[g] * s;
    }
    return acc;
}

static float qdot8(const float *x, const uint8_t *codes, const float *sc, int64_t K, int gs) {
    float acc = 0.0f;
    for (int64_t g = 0; g < K / gs; g++) {
        float s = 0.0f;
        for (int64_t j = g * gs; j < (g + 1) * gs; j++) s += (float)codes[j] * x[j];
        acc += sc[g] * s;
    }
    return acc;
}

static void qdot4_x4(float *out, const float *xp, const float *xs, const uint8_t *const *codes, const float *const *sc,
                     const float *const *bi, int64_t K, int gs) {
    for (int r = 0; r < 4; r++) out[r] = qdot4(xp, codes[r], sc[r], K, gs) + dot_f32(bi[r], xs, K / gs);
}

static void qdot8_x4(float *out, const float *x, const float *xs, const uint8_t *const *codes, const float *const *sc,
                     const float *const *bi, int64_t K, int gs) {
    for (int r = 0; r < 4; r++) out[r] = qdot8(x, codes[r], sc[r], K, gs) + dot_f32(bi[r], xs, K / gs);
}

static void cvt_bf16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = pt_bf16_to_f32(src[i]);
}

static void gemm_32(float *c, int64_t ldc, const float *xpk, const float *wp, int mr, int64_t kc, int first) {
    for (int t = 0; t < mr; t++)
        for (int j = 0; j < 32; j++) {
            float a = first ? 0.0f : c[t * ldc + j];
            for (int64_t k = 0; k < kc; k++) a += xpk[k * 12 + t] * wp[k * 32 + j];
            c[t * ldc + j] = a;
        }
}

void pt_cpu_group_sums_ref(float *xs, const float *x, int64_t K, int gs) {
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        float s = 0.0f;
        for (int64_t j = g * gs; j < (g + 1) * gs; j++) s += x[j];
        xs[g] = s;
    }
}

void pt_cpu_quant_i8_ref(int8_t *xi, float *xd, const float *x, int64_t K, int gs) {
    int64_t ng = K / gs;
    for (int64_t g = 0; g < ng; g++) {
        float amax = 0.0f;
        for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
            float a = x[j] < 0 ? -x[j] : x[j];
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        xd[g] = d;
        /* |x·id| <= 127: adding and subtracting 1.5·2^23 rounds to nearest even
         * (what lrintf does) without a libm call; the product and the two sums
         * each rounded (this file is built without FMA, and the vector kernel
         * repeats the three operations) */
        for (int64_t j = g * gs; j < (g + 1) * gs; j++)
            xi[j] = (int8_t)(int)((x[j] * id + 12582912.0f) - 12582912.0f);
    }
}

const pt_cpu_kernels pt_cpu_kernels_scalar = {
    .name = "scalar",
    .dot_f32 = dot_f32,
    .dot_bf16 = dot_bf16,
    .dot_f16 = dot_f16,
    .axpy_f32 = axpy_f32,
    .axpy_bf16 = axpy_bf16,
    .qdot4 = qdot4,
    .qdot8 = qdot8,
    .qdot4_x4 = qdot4_x4,
    .panel_t16 = pt_cpu_panel_t16_ref,
    .qdot8_x4 = qdot8_x4,
    .cvt_bf16 = cvt_bf16,
    .dequant_q = pt_cpu_dequant_q_ref,
    .qdot4_x4_i8 = pt_cpu_qdot4_x4_i8_ref,
    .qdot8_x4_i8 = pt_cpu_qdot8_x4_i8_ref,
    .gemm_32 = gemm_32,
};
