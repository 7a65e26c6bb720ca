/* MLX affine quantization, bit-exact with MLX's stored format.
 *
 * A weight row of `cols` values (the last axis; cols % group_size == 0) is
 * split into groups of group_size (32, 64 or 128); each group has a scale and
 * a bias (stored in the weight's float dtype: bf16, f16 or f32) and every
 * value a `bits`-bit unsigned code q (bits 2, 3, 4, 5, 6 or 8):
 *
 *     w = q * scale + bias
 *
 * Packing: the codes of a row form one little-endian bit stream: code i
 * occupies bits [i*bits, (i+1)*bits) of the row, where the row is its uint32
 * words in order and each word is read LSB first. 2/4/8-bit codes never span
 * words (16/8/4 per word); 3- and 6-bit codes come in packs of 8 codes / 3
 * bytes and 4 codes / 3 bytes, 5-bit in packs of 8 codes / 5 bytes, so they
 * span byte and word boundaries. A packed row is cols*bits/32 uint32 words.
 * Shapes: weight [rows, cols] -> packed uint32 [rows, cols*bits/32], scales
 * and biases [rows, cols/group_size].
 *
 * Quantization rule (pt_mlx_quantize_row): per group, in fp32,
 *     w_max = max(0, max(w))  (Metal/CUDA kernels start the running max at 0)
 *     w_min = min(w)
 *     scale = max((w_max - w_min) / (2^bits - 1), 1e-7)
 *     if |w_min| > |w_max|: edge = w_min           else: edge = w_max, scale = -scale
 *     q0 = round(edge / scale)      (round half away from zero)
 *     if q0 != 0: scale = edge / q0, bias = edge   else: bias = 0
 *     q = min(round((w - bias) / scale), 2^bits - 1)   (never negative here)
 * using the fp32 scale and bias for the codes; the stored scale and bias are
 * then rounded to the weight dtype (nearest even). This is MLX's Metal kernel
 * (mlx/backend/metal/kernels/quantized.h, affine_quantize; its CUDA kernel is
 * the same), which is what mlx-community checkpoints were made with.
 * MLX's CPU path (mlx/backend/cpu/quantized.cpp, quantize) differs in two
 * ways: the running max starts at -inf (so w_max can be negative), and it
 * rounds half to even (rint) for q0 and the codes (and clamps codes at 0).
 * PT_MLX_RULE_CPU reproduces that path, for vectors made by MLX on a CPU.
 *
 * Dequantization here computes q * scale + bias in fp32 (scale and bias
 * widened from their dtype). */
#ifndef PT_FORMAT_MLX_QUANT_H
#define PT_FORMAT_MLX_QUANT_H

#include "format/safetensors.h"
#include "petrel.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum pt_mlx_rule {
    PT_MLX_RULE_METAL = 0, /* MLX's GPU kernels (default; mlx-community checkpoints) */
    PT_MLX_RULE_CPU = 1,   /* MLX's CPU kernel */
} pt_mlx_rule;

/* 1 when MLX supports this bits / group size. */
int pt_mlx_bits_ok(int bits);
int pt_mlx_group_ok(int group_size);

/* uint32 words of a packed row of `cols` values (cols*bits/32; requires
 * cols*bits % 32 == 0, which cols % 32 == 0 guarantees). */
static inline int64_t pt_mlx_packed_words(int64_t cols, int bits) { return cols * bits / 32; }

/* Code of element i of a packed row (row = the row's first word). Works for
 * every bit width; the 3/5/6-bit cases read across byte/word boundaries. */
static inline uint32_t pt_mlx_load_u32(const uint32_t *p) {
    uint32_t v; /* memcpy: tensors in a safetensors file need not be 4-byte aligned */
    memcpy(&v, p, 4);
    return v;
}
static inline uint32_t pt_mlx_code(const uint32_t *row, int64_t i, int bits) {
    uint64_t bit = (uint64_t)i * (uint64_t)bits;
    uint64_t w = bit >> 5;
    unsigned sh = (unsigned)(bit & 31);
    uint64_t v = pt_mlx_load_u32(row + w) >> sh;
    if (sh + (unsigned)bits > 32) v |= (uint64_t)pt_mlx_load_u32(row + w + 1) << (32 - sh);
    return (uint32_t)v & ((1u << bits) - 1u);
}

/* Reads a scale/bias element of dtype dt (F32, F16 or BF16) as f32. */
float pt_mlx_load_param(const void *p, pt_dtype dt, int64_t i);

/* Dequantizes one row: out[cols] = code * scale + bias (fp32).
 * packed: [cols*bits/32] words; scales/biases: [cols/group_size] of sdtype. */
void pt_mlx_dequantize_row(const uint32_t *packed, const void *scales, const void *biases, pt_dtype sdtype,
                           int bits, int group_size, int64_t cols, float *out);

/* Dequantizes element (r, c) of a [rows, cols] quantized matrix. */
float pt_mlx_dequantize_at(const uint32_t *packed, const void *scales, const void *biases, pt_dtype sdtype,
                           int bits, int group_size, int64_t cols, int64_t r, int64_t c);

/* Quantizes one row of `cols` fp32 values (cols % group_size == 0).
 * packed: [cols*bits/32] words (overwritten); scales/biases: [cols/group_size]
 * written in sdtype (F32, F16 or BF16). */
pt_status pt_mlx_quantize_row(const float *w, int64_t cols, int bits, int group_size, pt_mlx_rule rule,
                              uint32_t *packed, void *scales, void *biases, pt_dtype sdtype);

/* The fp32 scale and bias the rule computes for one group (before rounding
 * to the storage dtype), and the codes. Exposed for tests. */
void pt_mlx_quantize_group(const float *w, int group_size, int bits, pt_mlx_rule rule, float *scale,
                           float *bias, uint8_t *codes);

#endif
