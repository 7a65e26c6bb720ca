/* Levers and tiers: aliases expand to fixed values, a later lever overrides
 * an alias, bad values are errors naming the lever, unimplemented levers
 * answer PT_ERR_UNSUPPORTED; and the bandwidth meter returns a sane number. */
#include "test.h"

#include "runtime/bandwidth.h"
#include "runtime/levers.h"

static pt_model_params defaults(void) {
    pt_model_params p;
    memset(&p, 0, sizeof p);
    p.kv_quant = p.kv_group_size = p.quantized_kv_start = p.prefill_chunk = PT_LEVER_DEFAULT;
    p.compiled_decode = p.fused_decode_attn = p.int8_act = PT_LEVER_DEFAULT;
    return p;
}

static void test_tiers(void) {
    pt_model_params p = defaults();
    REQUIRE(pt_levers_apply_tier(&p, 3) == PT_OK, "l3");
    CHECK(p.kv_quant == 4 && p.fused_decode_attn == PT_LEVER_ON && p.int8_act == PT_LEVER_TIER, "l3 values");
    /* --l3's int8 activations: on for the CPU, not applicable on CUDA (the
     * tier runs there), while an explicit --int8-act on is refused on CUDA */
    pt_model_params c = p, g = p;
    pt_levers_resolve(&c);
    pt_levers_resolve(&g);
    pt_levers_for_device(&c, PT_DEVICE_CPU);
    pt_levers_for_device(&g, PT_DEVICE_CUDA);
    CHECK(c.int8_act == PT_LEVER_ON && pt_levers_check(&c, PT_DEVICE_CPU) == PT_OK, "l3 on the cpu: int8-act on");
    CHECK(g.int8_act == PT_LEVER_OFF && g.fused_decode_attn == PT_LEVER_ON && pt_levers_check(&g, PT_DEVICE_CUDA) == PT_OK,
          "l3 on cuda: runnable, int8-act n/a: %s", pt_last_error());
    REQUIRE(pt_lever_set(&g, "int8-act", "on") == PT_OK, "%s", pt_last_error());
    pt_levers_for_device(&g, PT_DEVICE_CUDA);
    CHECK(pt_levers_check(&g, PT_DEVICE_CUDA) == PT_ERR_UNSUPPORTED, "explicit int8-act on cuda refused");
    REQUIRE(pt_levers_apply_tier(&p, 1) == PT_OK, "l1");
    CHECK(p.kv_quant == 0 && p.fused_decode_attn == PT_LEVER_OFF && p.int8_act == PT_LEVER_OFF &&
              p.compiled_decode == PT_LEVER_ON,
          "l1 values");
    REQUIRE(pt_levers_apply_tier(&p, 2) == PT_OK, "l2");
    CHECK(p.kv_quant == PT_KV_QUANT_CONFIG, "l2 kv-quant config");
    /* a lever after an alias overrides it */
    REQUIRE(pt_lever_set(&p, "kv-quant", "8") == PT_OK, "%s", pt_last_error());
    CHECK(p.kv_quant == 8, "override");
    CHECK(pt_levers_apply_tier(&p, 4) == PT_ERR_INVALID_ARG, "tier 4 rejected");
}

static void test_values(void) {
    pt_model_params p = defaults();
    CHECK(pt_lever_set(&p, "kv-quant", "5") == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "--kv-quant"),
          "bad kv-quant named: %s", pt_last_error());
    CHECK(pt_lever_set(&p, "int8-act", "maybe") == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "--int8-act"),
          "bad on/off named");
    CHECK(pt_lever_set(&p, "prefill-chunk", "0") == PT_ERR_INVALID_ARG, "prefill-chunk 0");
    CHECK(pt_lever_set(&p, "prefill-chunk", "128") == PT_OK && p.prefill_chunk == 128, "prefill-chunk 128");
    CHECK(pt_lever_set(&p, "kv-group-size", "48") == PT_ERR_INVALID_ARG, "group 48");
    CHECK(pt_lever_set(&p, "no-such-lever", "1") == PT_ERR_NOT_FOUND, "unknown lever");
    CHECK(!strcmp(pt_lever_env_name("fused-decode-attn"), "PETREL_FUSED_DECODE_ATTN"), "env name");
    pt_levers_resolve(&p);
    CHECK(p.kv_quant == 0 && p.kv_group_size == 64 && p.quantized_kv_start == 0 && p.prefill_chunk == 128 &&
              p.fused_decode_attn == PT_LEVER_OFF,
          "resolved defaults");
    CHECK(pt_levers_check(&p, PT_DEVICE_CPU) == PT_OK, "defaults are runnable: %s", pt_last_error());
    p.int8_act = PT_LEVER_ON;
    CHECK(pt_levers_check(&p, PT_DEVICE_CPU) == PT_OK, "int8-act runs on the CPU: %s", pt_last_error());
    CHECK(pt_levers_check(&p, PT_DEVICE_CUDA) == PT_ERR_UNSUPPORTED && strstr(pt_last_error(), "int8"),
          "int8 not on CUDA: %s", pt_last_error());
    p.int8_act = PT_LEVER_OFF;
    p.kv_quant = 4;
    CHECK(pt_levers_check(&p, PT_DEVICE_CPU) == PT_OK, "kv-quant runs on the CPU: %s", pt_last_error());
    CHECK(pt_levers_check(&p, PT_DEVICE_CUDA) == PT_OK, "kv-quant runs on CUDA: %s", pt_last_error());
    char buf[512];
    p.kv_quant = 0;
    pt_levers_format(&p, PT_DEVICE_CPU, buf, sizeof buf);
    CHECK(strstr(buf, "kv-quant: off") && strstr(buf, "not applicable") && strstr(buf, "prefill-chunk: 128"),
          "format: %s", buf);
}

static void test_bandwidth(void) {
    double g = 0;
    REQUIRE(pt_measure_read_bandwidth(1, (size_t)64 << 20, 1, &g) == PT_OK, "%s", pt_last_error());
    CHECK(g > 0.1 && g < 10000, "%.2f GB/s", g);
    /* the meter held open: passes between other work; bad parameters named, nothing held */
    pt_bw_meter *bm = (pt_bw_meter *)1;
    CHECK(pt_bw_meter_open(&bm, 0, (size_t)64 << 20) == PT_ERR_INVALID_ARG && bm == NULL &&
              strstr(pt_last_error(), "0 threads"),
          "0 threads: %s", pt_last_error());
    CHECK(pt_bw_meter_open(&bm, 1, (size_t)1 << 20) == PT_ERR_INVALID_ARG && bm == NULL, "1 MiB accepted");
    REQUIRE(pt_bw_meter_open(&bm, 2, (size_t)64 << 20) == PT_OK && bm, "%s", pt_last_error());
    for (int i = 0; i < 3; i++) {
        double p = 0;
        CHECK(pt_bw_meter_pass(bm, &p) == PT_OK && p > 0.1 && p < 10000, "pass %d: %.2f GB/s", i, p);
    }
    CHECK(pt_bw_meter_pass(NULL, &g) == PT_ERR_INVALID_ARG, "a pass without a meter");
    pt_bw_meter_free(&bm);
    CHECK(bm == NULL, "free clears the handle");
    pt_bw_meter_free(&bm); /* NULL-safe */
    uint64_t w[37];
    for (int i = 0; i < 37; i++) w[i] = (uint64_t)i * 1000003u;
    uint64_t a = pt_bw_sum_scalar(w, 37);
    uint64_t want = 0;
    for (int i = 0; i < 37; i++) want += w[i];
    CHECK(a == want, "scalar sum");
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        static _Alignas(32) uint64_t v[37];
        memcpy(v, w, sizeof w);
        CHECK(pt_bw_sum_avx2(v, 37) == want, "avx2 sum");
    }
}

int main(void) {
    TEST_RUN(test_tiers);
    TEST_RUN(test_values);
    TEST_RUN(test_bandwidth);
    return test_summary();
}
