/* Tests for src/format/mlx_quant: hand-built packed vectors for every bit
 * width, the exact scale/bias rule (incl. the negative-scale "max side" case
 * and where MLX's Metal and CPU rules differ), and the dequantization error
 * bound (|w - dequant| <= |scale|/2 per element). */
#include "test.h"

#include "base/half.h"
#include "golden.h"
#include "format/mlx_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static const int BITS[6] = {2, 3, 4, 5, 6, 8};

/* Codes c_i = (7i + 3) mod 2^bits with c_0 = 0, c_1 = 2^bits - 1, packed into a
 * little-endian bit stream (words computed independently of petrel's code). */
static const uint32_t WORDS[6][8] = {
    {0x1b1b1b1cu, 0x1b1b1b1bu},
    {0x53977078u, 0x70539770u, 0x97705397u},
    {0x4d6f81f0u, 0xc5e7092bu, 0x4d6f81a3u, 0xc5e7092bu},
    {0x4dfc47e0u, 0x78245ba3u, 0x0753617du, 0x4b276cf4u, 0xe55c7066u},
    {0x9f611fc0u, 0x90bbd2d9u, 0xb2579740u, 0x8f201eb3u, 0x9cab91d5u, 0x71538703u},
    {0x1811ff00u, 0x342d261fu, 0x5049423bu, 0x6c655e57u, 0x88817a73u, 0xa49d968fu, 0xc0b9b2abu, 0xdcd5cec7u},
};

static void codes_for(int bits, uint8_t *c) {
    int n = (1 << bits) - 1;
    for (int i = 0; i < 32; i++) c[i] = (uint8_t)((i * 7 + 3) % (n + 1));
    c[0] = 0;
    c[1] = (uint8_t)n;
}

static void test_unpack_hand_vectors(void) {
    for (int b = 0; b < 6; b++) {
        uint8_t c[32];
        codes_for(BITS[b], c);
        for (int i = 0; i < 32; i++)
            CHECK(pt_mlx_code(WORDS[b], i, BITS[b]) == c[i], "bits %d code %d: %u vs %u", BITS[b], i,
                  pt_mlx_code(WORDS[b], i, BITS[b]), c[i]);
        CHECK(pt_mlx_packed_words(32, BITS[b]) == BITS[b], "words per 32 values");
    }
}

/* w = (c - n) * 0.25: the min side wins, scale +0.25, bias -n/4, codes = c. */
static void test_quantize_min_side(void) {
    for (int b = 0; b < 6; b++) {
        int bits = BITS[b], n = (1 << bits) - 1;
        uint8_t c[32];
        codes_for(bits, c);
        float w[32];
        for (int i = 0; i < 32; i++) w[i] = (float)(c[i] - n) * 0.25f;
        for (int rule = 0; rule < 2; rule++) {
            uint32_t packed[8] = {0};
            uint16_t s, bi;
            REQUIRE(pt_mlx_quantize_row(w, 32, bits, 32, (pt_mlx_rule)rule, packed, &s, &bi, PT_DTYPE_BF16) ==
                        PT_OK, "quantize");
            CHECK(!memcmp(packed, WORDS[b], (size_t)bits * 4), "bits %d rule %d: packed words differ", bits, rule);
            CHECK(pt_bf16_to_f32(s) == 0.25f, "bits %d scale %g", bits, pt_bf16_to_f32(s));
            CHECK(pt_bf16_to_f32(bi) == -0.25f * (float)n, "bits %d bias %g", bits, pt_bf16_to_f32(bi));
            float out[32];
            pt_mlx_dequantize_row(packed, &s, &bi, PT_DTYPE_BF16, bits, 32, 32, out);
            for (int i = 0; i < 32; i++) CHECK(out[i] == w[i], "bits %d dequant %d", bits, i);
        }
    }
}

/* w = c * 0.25 (all >= 0): the max side wins, so MLX stores a NEGATIVE scale
 * -0.25, bias n/4 and the reversed codes n - c. */
static void test_quantize_max_side(void) {
    for (int b = 0; b < 6; b++) {
        int bits = BITS[b], n = (1 << bits) - 1;
        uint8_t c[32];
        codes_for(bits, c);
        float w[32];
        for (int i = 0; i < 32; i++) w[i] = (float)c[i] * 0.25f;
        uint32_t packed[8];
        float s, bi;
        REQUIRE(pt_mlx_quantize_row(w, 32, bits, 32, PT_MLX_RULE_METAL, packed, &s, &bi, PT_DTYPE_F32) == PT_OK,
                "quantize");
        CHECK(s == -0.25f && bi == 0.25f * (float)n, "bits %d: scale %g bias %g", bits, s, bi);
        for (int i = 0; i < 32; i++)
            CHECK(pt_mlx_code(packed, i, bits) == (uint32_t)(n - c[i]), "bits %d code %d", bits, i);
        CHECK(pt_mlx_dequantize_at(packed, &s, &bi, PT_DTYPE_F32, bits, 32, 32, 0, 5) == w[5], "dequant_at");
    }
}

/* Where MLX's GPU (Metal/CUDA) and CPU rules differ. */
static void test_rule_differences(void) {
    /* all-negative group: the GPU's running max starts at 0 */
    float w[32];
    for (int i = 0; i < 32; i++) w[i] = -1.0f - (float)(i % 3); /* -1, -2, -3 */
    float s_gpu, b_gpu, s_cpu, b_cpu;
    uint8_t c_gpu[32], c_cpu[32];
    pt_mlx_quantize_group(w, 32, 2, PT_MLX_RULE_METAL, &s_gpu, &b_gpu, c_gpu);
    pt_mlx_quantize_group(w, 32, 2, PT_MLX_RULE_CPU, &s_cpu, &b_cpu, c_cpu);
    CHECK(s_gpu == 1.0f && b_gpu == -3.0f, "gpu: range [-3, 0] -> scale 1: %g %g", s_gpu, b_gpu);
    /* cpu: range [-3, -1], scale 2/3, q0 = rint(-4.5) = -4 (half to even), scale = -3/-4 */
    CHECK(s_cpu == 0.75f && b_cpu == -3.0f, "cpu: %g %g", s_cpu, b_cpu);
    /* ties: (w - bias)/scale = 0.5 rounds away from zero on the GPU, to even on the CPU */
    for (int i = 0; i < 32; i++) w[i] = -1.5f;
    w[0] = -3.0f; /* edge: scale 1, bias -3 on both (w_max = 0 on the GPU; -1.5 on the CPU) */
    w[1] = -2.5f; /* 0.5 */
    w[2] = 0.0f;
    pt_mlx_quantize_group(w, 32, 2, PT_MLX_RULE_METAL, &s_gpu, &b_gpu, c_gpu);
    pt_mlx_quantize_group(w, 32, 2, PT_MLX_RULE_CPU, &s_cpu, &b_cpu, c_cpu);
    CHECK(s_gpu == 1.0f && s_cpu == 1.0f && b_gpu == -3.0f && b_cpu == -3.0f, "tie setup %g %g", s_gpu, s_cpu);
    CHECK(c_gpu[1] == 1 && c_cpu[1] == 0, "0.5: gpu %u cpu %u", c_gpu[1], c_cpu[1]);
    CHECK(c_gpu[3] == 2 && c_cpu[3] == 2, "1.5: gpu %u cpu %u", c_gpu[3], c_cpu[3]);
    CHECK(c_gpu[2] == 3 && c_cpu[2] == 3, "3.0 clamps to n");
    /* q0 == 0: the edge rounds to zero, bias 0 */
    for (int i = 0; i < 32; i++) w[i] = (float)i; /* [0, 31], 4-bit: scale -31/15, edge 31 */
    pt_mlx_quantize_group(w, 32, 4, PT_MLX_RULE_METAL, &s_gpu, &b_gpu, c_gpu);
    CHECK(b_gpu == 31.0f && s_gpu == 31.0f / -15.0f, "max edge: %g %g", s_gpu, b_gpu);
    for (int i = 0; i < 32; i++) w[i] = 1e-9f * (float)(i - 16); /* scale hits eps; q0 = 0 */
    pt_mlx_quantize_group(w, 32, 4, PT_MLX_RULE_METAL, &s_gpu, &b_gpu, c_gpu);
    CHECK(b_gpu == 0.0f, "at_zero bias %g", b_gpu);
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* |w - dequant(quant(w))| <= |scale|/2 for every element inside the group's
 * representable range [bias, bias + n*scale] (F32 storage, so scale/bias are
 * not rounded). MLX's rule moves the scale so that zero is exact
 * (scale = edge/round(edge/scale)), which can pull the far end of the range
 * in: values beyond it clamp to the last code. With |q0| >= n/2 (the edge is
 * the larger side) that error is at most n*0.5/(n/2) = one scale step. Both bounds are checked, for every bits x group size. */
static void test_error_bound(void) {
    enum { COLS = 256 };
    float w[COLS], out[COLS];
    uint32_t packed[COLS];
    float sc[COLS / 32], bi[COLS / 32];
    const int groups[3] = {32, 64, 128};
    long n_inside = 0;
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++)
            for (int trial = 0; trial < 4; trial++) {
                float amp = trial == 0 ? 1.0f : trial == 1 ? 0.01f : trial == 2 ? 300.0f : 1.0f;
                for (int i = 0; i < COLS; i++) w[i] = frand() * amp + (trial == 3 ? 5.0f : 0.0f);
                REQUIRE(pt_mlx_quantize_row(w, COLS, BITS[b], groups[g], PT_MLX_RULE_METAL, packed, sc, bi,
                                            PT_DTYPE_F32) == PT_OK, "quantize");
                pt_mlx_dequantize_row(packed, sc, bi, PT_DTYPE_F32, BITS[b], groups[g], COLS, out);
                for (int i = 0; i < COLS; i++) {
                    float s = fabsf(sc[i / groups[g]]), bias = bi[i / groups[g]];
                    float top = bias + (float)((1 << BITS[b]) - 1) * sc[i / groups[g]];
                    float lo = fminf(bias, top), hi = fmaxf(bias, top);
                    int inside = w[i] >= lo && w[i] <= hi;
                    float bound = (inside ? 0.5f : 1.0f) * s * (1 + 1e-5f) + 1e-6f * fabsf(w[i]);
                    float err = fabsf(out[i] - w[i]);
                    if (inside) n_inside++;
                    if (!(err <= bound)) {
                        CHECK(0, "bits %d gs %d trial %d i %d: |err| %g > %s %g", BITS[b], groups[g], trial, i, err,
                              inside ? "scale/2" : "scale", bound);
                        return;
                    }
                }
            }
    /* nearly every element is inside its group's range */
    CHECK(n_inside > 6 * 3 * 4 * COLS * 9 / 10, "only %ld elements inside the range", n_inside);
}

/* tests/fixtures/quant/vectors.bin: 24 cases computed by an independent
 * (Python) implementation of the Metal rule; petrel must reproduce every
 * packed word, scale and bias bit for bit. */
static void test_oracle_vectors(void) {
    char err[256];
    golden *g = golden_open("tests/fixtures/quant/vectors.bin", err, sizeof err);
    REQUIRE(g, "%s", err);
    int n = golden_int(g, "meta.n_cases", 0);
    CHECK(n >= 24, "only %d cases", n);
    int n_words = 0;
    for (int k = 0; k < n && !test_failed_current; k++) {
        char nm[64];
        snprintf(nm, sizeof nm, "case.%d.params", k);
        const golden_array *pa = golden_get(g, nm, 0, GOLDEN_I32, 1);
        snprintf(nm, sizeof nm, "case.%d.input", k);
        const golden_array *in = golden_get(g, nm, 1, GOLDEN_F32, 2);
        snprintf(nm, sizeof nm, "case.%d.words", k);
        const golden_array *wd = golden_get(g, nm, 0, GOLDEN_U32, 2);
        snprintf(nm, sizeof nm, "case.%d.scales", k);
        const golden_array *sc = golden_get(g, nm, 1, GOLDEN_F32, 2);
        snprintf(nm, sizeof nm, "case.%d.biases", k);
        const golden_array *bi = golden_get(g, nm, 1, GOLDEN_F32, 2);
        REQUIRE(pa && in && wd && sc && bi && pa->count == 3, "case %d incomplete", k);
        const int32_t *prm = pa->data;
        int bits = prm[0], gs = prm[1];
        pt_dtype dt = prm[2] ? PT_DTYPE_F32 : PT_DTYPE_BF16;
        int64_t rows = in->dims[0], cols = in->dims[1], pw = cols * bits / 32, ng = cols / gs;
        REQUIRE(wd->dims[0] == rows && wd->dims[1] == pw && sc->dims[1] == ng, "case %d shapes", k);
        size_t es = pt_dtype_size(dt);
        uint32_t packed[256];
        unsigned char s_out[64], b_out[64];
        for (int64_t r = 0; r < rows; r++) {
            REQUIRE(pt_mlx_quantize_row(in->f32 + r * cols, cols, bits, gs, PT_MLX_RULE_METAL, packed, s_out, b_out,
                                        dt) == PT_OK, "quantize");
            const uint32_t *want = (const uint32_t *)wd->data + r * pw;
            for (int64_t w = 0; w < pw; w++)
                if (packed[w] != want[w]) {
                    CHECK(0, "case %d (bits %d gs %d %s) row %lld word %lld: 0x%08x, expected 0x%08x", k, bits, gs,
                          pt_dtype_name(dt), (long long)r, (long long)w, packed[w], want[w]);
                    break;
                }
            CHECK(!memcmp(s_out, (const char *)sc->data + r * ng * es, (size_t)ng * es), "case %d row %lld scales",
                  k, (long long)r);
            CHECK(!memcmp(b_out, (const char *)bi->data + r * ng * es, (size_t)ng * es), "case %d row %lld biases",
                  k, (long long)r);
            if (test_failed_current) break;
            n_words += (int)pw;
        }
    }
    printf("INFO quant vectors: %d cases, %d packed words reproduced bit for bit\n", n, n_words);
    golden_close(g);
}

static void test_invalid_args(void) {
    float w[64] = {0};
    uint32_t p[64];
    uint16_t s[4], b[4];
    CHECK(pt_mlx_quantize_row(w, 64, 7, 32, PT_MLX_RULE_METAL, p, s, b, PT_DTYPE_BF16) != PT_OK, "bits 7");
    CHECK(pt_mlx_quantize_row(w, 64, 4, 16, PT_MLX_RULE_METAL, p, s, b, PT_DTYPE_BF16) != PT_OK, "gs 16");
    CHECK(pt_mlx_quantize_row(w, 48, 4, 32, PT_MLX_RULE_METAL, p, s, b, PT_DTYPE_BF16) != PT_OK, "cols 48");
    CHECK(pt_mlx_quantize_row(w, 64, 4, 32, PT_MLX_RULE_METAL, p, s, b, PT_DTYPE_I32) != PT_OK, "scale dtype");
}

int main(void) {
    TEST_RUN(test_unpack_hand_vectors);
    TEST_RUN(test_quantize_min_side);
    TEST_RUN(test_quantize_max_side);
    TEST_RUN(test_rule_differences);
    TEST_RUN(test_error_bound);
    TEST_RUN(test_oracle_vectors);
    TEST_RUN(test_invalid_args);
    return test_summary();
}
