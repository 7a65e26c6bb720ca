/* The AMX GEMMs (gemm_bf16_avx512.c amx_panels, gemm_i8_avx512.c
 * amx8_panels) with their tile operations emulated in C (PT_AMX_EMULATE,
 * cpu_internal.h), so their addressing, block and group loops, folds and
 * stores run on any AVX-512 CPU, not only where the CPU has AMX: this file
 * compiles both GEMM sources itself (they replace the library's copies at
 * link time) with AMX reported available. The int8 GEMM: every case of
 * tests/amx_i8_cases.h, bit-identical to the VNNI GEMM (the emulated
 * TDPBSUD forms the same exact integers). The bf16 GEMM: tests/test_cpu_bgemm.c's
 * AMX case (against double and the f32 GEMM, a call's first tokens alone, 1
 * vs 2 threads, the non-bf16 fallback) and its dense bf16 case (test_dense:
 * one group of K, scale 1, bias 0); the emulated TDPBF16PS adds its
 * products in f32 in k order, AMX its own way, so only the tolerances
 * hold across the two). Skipped without AVX-512 BF16 / VNNI. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")
#define PT_AMX_EMULATE 1
#include "backend/cpu/gemm_bf16_avx512.c"
#include "backend/cpu/gemm_i8_avx512.c"
#pragma GCC pop_options

__thread pt_amx_emu_cfg pt_amx_emu;

#define main test_cpu_bgemm_main
#include "test_cpu_bgemm.c"
#undef main
#include "amx_i8_cases.h"

int main(void) {
    TEST_RUN(test_amx);
    TEST_RUN(test_dense);
    TEST_RUN(test_amx_i8_gemm);
    TEST_RUN(test_amx_i8_multi);
    TEST_RUN(test_amx_i8_paths_name);
    return test_summary();
}
