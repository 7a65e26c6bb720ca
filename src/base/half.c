/* Row conversions between half formats and f32 (see half.h). */
#include <stddef.h>
#include "base/half.h"

void pt_bf16_to_f32_row(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = pt_bf16_to_f32(src[i]);
}
void pt_f32_to_bf16_row(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = pt_f32_to_bf16(src[i]);
}
void pt_f16_to_f32_row(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = pt_f16_to_f32(src[i]);
}
void pt_f32_to_f16_row(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = pt_f32_to_f16(src[i]);
}
