/* bf16 / f16 <-> f32 conversion. f32 -> bf16/f16 rounds to nearest even and
 * preserves NaN (a NaN never rounds to infinity). Inline: these sit in
 * inner loops. */
#ifndef PT_BASE_HALF_H
#define PT_BASE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t pt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float pt_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float pt_bf16_to_f32(uint16_t h) { return pt_bits_f32((uint32_t)h << 16); }

static inline uint16_t pt_f32_to_bf16(float f) {
    uint32_t u = pt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Rounds an f32 to the nearest bf16 value, returned as f32. */
static inline float pt_round_bf16(float f) { return pt_bf16_to_f32(pt_f32_to_bf16(f)); }

static inline float pt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return pt_bits_f32(u);
}

static inline uint16_t pt_f32_to_f16(float f) {
    uint32_t u = pt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                      /* overflow -> inf */
    if (a < 0x38800000u) {                                                         /* subnormal or zero */
        if (a <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25 rounds (to even) to zero */
        uint32_t exp = a >> 23;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t sh = 126 - exp; /* value / 2^-24 = man >> sh */
        uint32_t r = man >> sh;
        uint32_t rem = man & ((1u << sh) - 1u), halfway = 1u << (sh - 1);
        if (rem > halfway || (rem == halfway && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return (uint16_t)(sign | (r >> 13));
}

void pt_bf16_to_f32_row(const uint16_t *src, float *dst, size_t n);
void pt_f32_to_bf16_row(const float *src, uint16_t *dst, size_t n);
void pt_f16_to_f32_row(const uint16_t *src, float *dst, size_t n);
void pt_f32_to_f16_row(const float *src, uint16_t *dst, size_t n);

#endif
