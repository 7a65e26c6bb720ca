/* The int8 lever's prefill GEMM on AMX int8 tiles (gemm_i8_avx512.c
 * amx8_panels, PETREL_CPU_AMX under --int8-act), on the CPU's own tiles: the
 * cases of tests/amx_i8_cases.h. Skipped where the CPU has no AMX-INT8 (or
 * the OS refused the tile state) or no AVX-512 VNNI; the same cases run on
 * emulated tiles in tests/test_cpu_amx_emul.c. */
#include "amx_i8_cases.h"

int main(void) {
    TEST_RUN(test_amx_i8_gemm);
    TEST_RUN(test_amx_i8_multi);
    TEST_RUN(test_amx_i8_paths_name);
    return test_summary();
}
