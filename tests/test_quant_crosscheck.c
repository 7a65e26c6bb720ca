/* Cross-check: petrel's MLX quantizer (src/format/mlx_quant) reproduces the
 * packed words, scales and biases of the independent Python implementation
 * (tools/oracle/mlxq.py) bit for bit, on the vectors in
 * tests/fixtures/quant/vectors.bin (24 cases: bits 2-8, group sizes 32-128,
 * bf16 and f32 weights, rows that hit every corner of the Metal rule).
 * Not a test of dequantization accuracy: test_quant.c covers the format. */
#include <stdint.h>
#include <string.h>

#include "format/mlx_quant.h"
#include "golden.h"
#include "test.h"

static uint16_t bits16(const void *p, int64_t i) {
    uint16_t v;
    memcpy(&v, (const unsigned char *)p + 2 * i, 2);
    return v;
}
static uint32_t bits32(const void *p, int64_t i) {
    uint32_t v;
    memcpy(&v, (const unsigned char *)p + 4 * i, 4);
    return v;
}

static void test_quantizer_matches_python_vectors(void) {
    char err[512];
    golden *g = golden_open("tests/fixtures/quant/vectors.bin", err, sizeof err);
    REQUIRE(g, "%s", err);
    int nc = golden_int(g, "meta.n_cases", 0);
    REQUIRE(nc > 0, "no cases");
    int n_words = 0, n_params = 0, bad_cases = 0;
    for (int k = 0; k < nc; k++) {
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
        REQUIRE(pa && pa->count == 3 && in && wd && sc && bi, "case %d incomplete", k);
        const int32_t *prm = pa->data;
        int bits = prm[0], gs = prm[1], is_bf16 = prm[2] == 0;
        pt_dtype dt = is_bf16 ? PT_DTYPE_BF16 : PT_DTYPE_F32;
        size_t es = is_bf16 ? 2 : 4;
        int64_t R = in->dims[0], C = in->dims[1], W = pt_mlx_packed_words(C, bits), G = C / gs;
        REQUIRE(wd->dims[1] == W && sc->dims[1] == G, "case %d: shapes", k);
        uint32_t *packed = calloc((size_t)W, 4);
        unsigned char *s = calloc((size_t)G, es), *b = calloc((size_t)G, es);
        REQUIRE(packed && s && b, "oom");
        int case_bad = 0;
        for (int64_t r = 0; r < R; r++) {
            /* input rows: bf16 values widened by the reader, f32 as stored */
            pt_status st = pt_mlx_quantize_row(in->f32 + r * C, C, bits, gs, PT_MLX_RULE_METAL, packed, s, b, dt);
            CHECK(st == 0, "case %d row %lld: status %d", k, (long long)r, (int)st);
            for (int64_t j = 0; j < W; j++) {
                uint32_t want = bits32(wd->data, r * W + j);
                if (packed[j] != want && case_bad++ < 3)
                    CHECK(0, "case %d (bits %d gs %d) row %lld word %lld: 0x%08x, python 0x%08x", k, bits, gs,
                          (long long)r, (long long)j, packed[j], want);
                n_words++;
            }
            for (int64_t j = 0; j < G; j++) {
                int same_s, same_b;
                if (is_bf16) {
                    same_s = bits16(s, j) == bits16(sc->data, r * G + j);
                    same_b = bits16(b, j) == bits16(bi->data, r * G + j);
                } else {
                    same_s = bits32(s, j) == bits32(sc->data, r * G + j);
                    same_b = bits32(b, j) == bits32(bi->data, r * G + j);
                }
                if ((!same_s || !same_b) && case_bad++ < 3)
                    CHECK(0, "case %d (bits %d gs %d %s) row %lld group %lld: scale/bias differ", k, bits, gs,
                          is_bf16 ? "bf16" : "f32", (long long)r, (long long)j);
                n_params += 2;
            }
        }
        if (case_bad) bad_cases++;
        free(packed);
        free(s);
        free(b);
    }
    CHECK(bad_cases == 0, "%d of %d cases differ", bad_cases, nc);
    printf("INFO quant crosscheck: %d cases, %d words and %d scales/biases compared\n", nc, n_words, n_params);
    golden_close(g);
}

int main(void) {
    TEST_RUN(test_quantizer_matches_python_vectors);
    return test_summary();
}
