/* MLX affine quantize / dequantize (see mlx_quant.h for the format and the
 * exact rule). Plain scalar C: this is the reference the CPU/CUDA kernels are
 * checked against, and what `petrel quantize` writes with. */
#include "format/mlx_quant.h"

#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <string.h>

int pt_mlx_bits_ok(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }
int pt_mlx_group_ok(int g) { return g == 32 || g == 64 || g == 128; }

float pt_mlx_load_param(const void *p, pt_dtype dt, int64_t i) {
    switch (dt) {
    case PT_DTYPE_F32: {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    case PT_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return pt_f16_to_f32(h);
    }
    case PT_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return pt_bf16_to_f32(h);
    }
    default: return NAN;
    }
}

static void store_param(void *p, pt_dtype dt, int64_t i, float v) {
    if (dt == PT_DTYPE_F32) {
        memcpy((char *)p + 4 * i, &v, 4);
    } else {
        uint16_t h = dt == PT_DTYPE_F16 ? pt_f32_to_f16(v) : pt_f32_to_bf16(v);
        memcpy((char *)p + 2 * i, &h, 2);
    }
}

void pt_mlx_dequantize_row(const uint32_t *packed, const void *scales, const void *biases, pt_dtype sdtype,
                           int bits, int group_size, int64_t cols, float *out) {
    for (int64_t g = 0; g < cols / group_size; g++) {
        float s = pt_mlx_load_param(scales, sdtype, g), b = pt_mlx_load_param(biases, sdtype, g);
        for (int64_t j = g * group_size; j < (g + 1) * group_size; j++)
            out[j] = (float)pt_mlx_code(packed, j, bits) * s + b;
    }
}

float pt_mlx_dequantize_at(const uint32_t *packed, const void *scales, const void *biases, pt_dtype sdtype,
                           int bits, int group_size, int64_t cols, int64_t r, int64_t c) {
    const uint32_t *row = packed + r * pt_mlx_packed_words(cols, bits);
    int64_t gi = r * (cols / group_size) + c / group_size;
    return (float)pt_mlx_code(row, c, bits) * pt_mlx_load_param(scales, sdtype, gi) +
           pt_mlx_load_param(biases, sdtype, gi);
}

void pt_mlx_quantize_group(const float *w, int group_size, int bits, pt_mlx_rule rule, float *out_scale,
                           float *out_bias, uint8_t *codes) {
    const float n_bins = (float)((1 << bits) - 1);
    const float eps = 1e-7f;
    /* Metal/CUDA: the running max starts at 0; the CPU kernel's at -inf */
    float w_max = rule == PT_MLX_RULE_METAL ? 0.0f : -INFINITY;
    float w_min = INFINITY;
    for (int i = 0; i < group_size; i++) {
        w_max = fmaxf(w_max, w[i]);
        w_min = fminf(w_min, w[i]);
    }
    /* the divisions are separate fp32 operations (no fused or reciprocal forms),
     * matching the kernels */
    float scale = fmaxf((w_max - w_min) / n_bins, eps);
    int side = fabsf(w_min) > fabsf(w_max);
    scale = side ? scale : -scale;
    float edge = side ? w_min : w_max;
    float q0 = rule == PT_MLX_RULE_METAL ? roundf(edge / scale) : rintf(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }
    for (int i = 0; i < group_size; i++) {
        float x = (w[i] - bias) / scale;
        float q = rule == PT_MLX_RULE_METAL ? roundf(x) : rintf(x);
        /* Metal only clamps above (q >= -0 by construction); clamping at 0 too
         * changes nothing for it and keeps the conversion defined. */
        q = fminf(fmaxf(q, 0.0f), n_bins);
        codes[i] = (uint8_t)q;
    }
    *out_scale = scale;
    *out_bias = bias;
}

pt_status pt_mlx_quantize_row(const float *w, int64_t cols, int bits, int group_size, pt_mlx_rule rule,
                              uint32_t *packed, void *scales, void *biases, pt_dtype sdtype) {
    if (!pt_mlx_bits_ok(bits) || !pt_mlx_group_ok(group_size))
        return pt_error(PT_ERR_INVALID_ARG, "MLX quantization: unsupported bits %d / group size %d", bits,
                        group_size);
    if (cols % group_size)
        return pt_error(PT_ERR_INVALID_ARG, "MLX quantization: row length %lld is not a multiple of group size %d",
                        (long long)cols, group_size);
    if (sdtype != PT_DTYPE_F32 && sdtype != PT_DTYPE_F16 && sdtype != PT_DTYPE_BF16)
        return pt_error(PT_ERR_INVALID_ARG, "MLX quantization: scales must be F32, F16 or BF16, not %s",
                        pt_dtype_name(sdtype));
    memset(packed, 0, (size_t)pt_mlx_packed_words(cols, bits) * 4);
    uint8_t codes[128];
    for (int64_t g = 0; g < cols / group_size; g++) {
        float s, b;
        pt_mlx_quantize_group(w + g * group_size, group_size, bits, rule, &s, &b, codes);
        store_param(scales, sdtype, g, s);
        store_param(biases, sdtype, g, b);
        for (int i = 0; i < group_size; i++) {
            uint64_t bit = (uint64_t)(g * group_size + i) * (uint64_t)bits;
            uint64_t wi = bit >> 5;
            unsigned sh = (unsigned)(bit & 31);
            packed[wi] |= (uint32_t)codes[i] << sh;
            if (sh + (unsigned)bits > 32) packed[wi + 1] |= (uint32_t)codes[i] >> (32 - sh);
        }
    }
    return PT_OK;
}
