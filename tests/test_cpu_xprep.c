/* The x preparations of the quantized matmuls as vector kernels
 * (kernels_avx512.c group_sums, quant_i8): bit-identical to the references
 * they replace (pt_cpu_group_sums_ref, pt_cpu_quant_i8_ref) for groups of
 * 32/64/128 (and 16, 48: the gather and tail paths), group counts that are
 * and are not multiples of 16 and 32, wide dynamic ranges, all-zero groups,
 * −0, subnormals, NaN and infinities. Sums compared as bits (the order of
 * the additions is the contract), steps as bits, int8 values exactly.
 * And the AVX-512 GEMMs' panel store (pt_cpu_panel_store_avx512: bias add,
 * bf16 rounding, masked stores) against pt_cpu_panel_store: the same bits in
 * y, nothing written outside the panel's rows and columns. Skipped without
 * AVX-512. */
#include "test.h"
#include "test_rand.h"

#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int avx512_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* x of K values in groups of gs: case 0 uniform, 1 spread over many octaves
 * with signs, 2 with zero groups, −0 and subnormals, 3 with NaN / ±inf in
 * some groups. */
static void fill_case(float *x, int64_t K, int gs, int kind) {
    for (int64_t j = 0; j < K; j++) {
        float v = rf(-1.0f, 1.0f);
        if (kind >= 1) v = ldexpf(v, (int)(ru32() % 60) - 30);
        x[j] = v;
    }
    if (kind == 2)
        for (int64_t g = 0; g < K / gs; g += 3) {
            for (int j = 0; j < gs; j++) x[g * gs + j] = (j & 1) ? -0.0f : 0.0f;
            if (g + 1 < K / gs) x[(g + 1) * gs + 1] = 1e-40f, x[(g + 1) * gs + 2] = -3e-39f;
        }
    if (kind == 3) {
        x[5] = NAN;
        if (K > gs + 7) x[gs + 7] = INFINITY;
        if (K > 3 * gs) x[3 * gs - 1] = -INFINITY, x[3 * gs - 2] = NAN;
    }
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* Every (group size, group count, fill kind) case: x filled (fill_case)
 * with K = gs·ng values, then fn(ctx, x, K, gs, ng, kind); returns the
 * number of cases run. */
typedef void (*case_fn)(void *ctx, float *x, int64_t K, int gs, int ng, int kind);
static int for_each_case(const int *gss, int n_gs, const int *ngs, int n_ng, float *x, case_fn fn, void *ctx) {
    int cases = 0;
    for (int gi = 0; gi < n_gs; gi++)
        for (int ni = 0; ni < n_ng; ni++)
            for (int kind = 0; kind < 4; kind++) {
                const int gs = gss[gi], ng = ngs[ni];
                fill_case(x, (int64_t)gs * ng, gs, kind);
                fn(ctx, x, (int64_t)gs * ng, gs, ng, kind);
                cases++;
            }
    return cases;
}

typedef struct {
    float *a, *b;
} sums_ctx;

static void sums_case(void *vc, float *x, int64_t K, int gs, int ng, int kind) {
    sums_ctx *c = vc;
    pt_cpu_group_sums_ref(c->a, x, K, gs);
    memset(c->b, 0x5a, sizeof(float) * (size_t)ng);
    pt_cpu_kernels_avx512.group_sums(c->b, x, K, gs);
    CHECK(same_bits(c->a, c->b, ng), "gs %d, %d groups, case %d: sums differ from the reference", gs, ng, kind);
}

static void test_group_sums(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->group_sums != NULL, "the avx512 table has no group_sums");
    static const int gss[] = {16, 32, 48, 64, 128};
    static const int ngs[] = {1, 7, 16, 17, 32, 33, 48, 64, 112};
    float *x = malloc(sizeof(float) * 128 * 112), *a = malloc(sizeof(float) * 112), *b = malloc(sizeof(float) * 112);
    REQUIRE(x && a && b, "out of memory");
    sums_ctx c = {a, b};
    const int cases = for_each_case(gss, 5, ngs, 9, x, sums_case, &c);
    /* a sum whose order shows: 1, then 2^-24 many times (in order each add is
     * lost; added first among themselves they would count) */
    for (int j = 0; j < 64 * 32; j++) x[j] = (j % 64 == 0) ? 1.0f : ldexpf(1.0f, -24);
    pt_cpu_group_sums_ref(a, x, 64 * 32, 64);
    k->group_sums(b, x, 64 * 32, 64);
    CHECK(a[0] == 1.0f && same_bits(a, b, 32), "order-sensitive sums: ref %g, kernel %g", a[0], b[0]);
    free(x), free(a), free(b);
    CHECK(cases == 5 * 9 * 4, "ran %d cases", cases);
}

typedef struct {
    float *da, *db;
    int8_t *qa, *qb;
    int nonzero;
} quant_ctx;

static void quant_case(void *vc, float *x, int64_t K, int gs, int ng, int kind) {
    quant_ctx *c = vc;
    if (kind == 0) x[0] = 1.0f, x[1] = -1.0f, x[2] = 0.5f / 127.0f; /* the extremes and a tie */
    pt_cpu_quant_i8_ref(c->qa, c->da, x, K, gs);
    memset(c->qb, 0x55, (size_t)K), memset(c->db, 0x5a, sizeof(float) * (size_t)ng);
    pt_cpu_kernels_avx512.quant_i8(c->qb, c->db, x, K, gs);
    CHECK(same_bits(c->da, c->db, ng), "gs %d, %d groups, case %d: steps differ", gs, ng, kind);
    CHECK(memcmp(c->qa, c->qb, (size_t)K) == 0, "gs %d, %d groups, case %d: int8 values differ", gs, ng, kind);
    for (int64_t j = 0; j < K; j++) c->nonzero += c->qa[j] != 0;
}

static void test_quant_i8(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    const pt_cpu_kernels *k = &pt_cpu_kernels_avx512;
    REQUIRE(k->quant_i8 != NULL, "the avx512 table has no quant_i8");
    static const int gss[] = {16, 32, 48, 64, 128, 40};
    static const int ngs[] = {1, 3, 16, 33};
    const int64_t KM = 128 * 33;
    float *x = malloc(sizeof(float) * KM), *da = malloc(sizeof(float) * 33), *db = malloc(sizeof(float) * 33);
    int8_t *qa = malloc((size_t)KM), *qb = malloc((size_t)KM);
    REQUIRE(x && da && db && qa && qb, "out of memory");
    quant_ctx c = {da, db, qa, qb, 0};
    const int cases = for_each_case(gss, 6, ngs, 4, x, quant_case, &c);
    /* the reference itself: ±127 at the group's max, round to nearest even */
    for (int j = 0; j < 32; j++) x[j] = 0.0f;
    x[0] = 127.0f, x[1] = -127.0f, x[2] = 2.5f, x[3] = 3.5f, x[4] = -2.5f;
    pt_cpu_quant_i8_ref(qa, da, x, 32, 32);
    k->quant_i8(qb, db, x, 32, 32);
    CHECK(qa[0] == 127 && qa[1] == -127 && qa[2] == 2 && qa[3] == 4 && qa[4] == -2 && da[0] == 1.0f,
          "reference: %d %d %d %d %d step %g", qa[0], qa[1], qa[2], qa[3], qa[4], da[0]);
    CHECK(memcmp(qa, qb, 32) == 0 && same_bits(da, db, 1), "kernel differs on the rounding cases");
    CHECK(c.nonzero > 1000, "only %d nonzero values: the cases are degenerate", c.nonzero);
    CHECK(cases == 6 * 4 * 4, "ran %d cases", cases);
    free(x), free(da), free(db), free(qa), free(qb);
}

/* F values that exercise the rounding: ties to even both ways, values that
 * carry into the exponent, subnormals, ±0, ±inf, NaNs (one whose payload
 * would round to infinity), the largest finite value. */
static float store_case(int i) {
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00000001u,
                                       0x807fffffu, 0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00000u, 0x7f80ffffu, 0xffffffffu, 0x477fff80u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    uint32_t u;
    if (i % 3 == 0) u = special[(i / 3) % ns];
    else {
        float v = ldexpf(rf(-1.0f, 1.0f), (int)(ru32() % 40) - 20);
        memcpy(&u, &v, 4);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_panel_store(void) {
    if (!avx512_ok()) TEST_SKIP("no AVX-512");
    enum { N = 80, T = 11 };
    float F[8 * 32], ya[T * N], yb[T * N];
    uint16_t bias16[N];
    float bias32[N];
    for (int n = 0; n < N; n++) bias32[n] = store_case(n + 1), bias16[n] = pt_f32_to_bf16(rf(-2.0f, 2.0f));
    static const int nrs[] = {32, 17, 16, 5, 1};
    int cases = 0, differ_from_f = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int act = 0; act < 2; act++)
            for (size_t ri = 0; ri < sizeof nrs / sizeof nrs[0]; ri++)
                for (int nt = 1; nt <= 8; nt += 7) {
                    pt_matrix w = {.rows = N, .cols = 64};
                    if (bi == 1) w.bias = bias32, w.bias_dtype = PT_FT_F32;
                    if (bi == 2) w.bias = bias16, w.bias_dtype = PT_FT_BF16;
                    const int nr = nrs[ri];
                    const int64_t p0 = nr == 32 ? 32 : N - nr, t0 = 2;
                    for (int i = 0; i < 8 * 32; i++) F[i] = store_case(i);
                    for (int i = 0; i < T * N; i++) ya[i] = yb[i] = (float)i;
                    const pt_act_dtype a = act ? PT_ACT_BF16 : PT_ACT_F32;
                    pt_cpu_panel_store(ya, F, t0, nt, p0, nr, &w, 0, a);
                    pt_cpu_panel_store_avx512(yb, F, t0, nt, p0, nr, &w, 0, a);
                    CHECK(memcmp(ya, yb, sizeof ya) == 0, "bias %d, act %d, nr %d, nt %d: y differs", bi, act, nr, nt);
                    for (int i = 0; i < nt * nr; i++) differ_from_f += ya[(t0 + i / nr) * N + p0 + i % nr] != F[(i / nr) * 32 + i % nr];
                    cases++;
                }
    CHECK(cases == 3 * 2 * 5 * 2, "ran %d cases", cases);
    CHECK(differ_from_f > 100, "only %d stored values differ from F: rounding and bias not exercised", differ_from_f);
}

int main(void) {
    TEST_RUN(test_group_sums);
    TEST_RUN(test_quant_i8);
    TEST_RUN(test_panel_store);
    return test_summary();
}
