/* CUDA device discovery and backend selection (src/backend/cuda/cuda.h).
 * Runs anywhere: with a GPU it checks the device query and the self-test
 * kernel and that auto picks CUDA; without one it checks the clean CPU
 * fallback and that --device cuda is an error naming the CUDA call. Built only
 * with CUDA=1 (into the GPU bundle). */
#include "test.h"

#include "backend/cuda/cuda.h"
#include "base/error.h"

static void test_built_with_cuda(void) { CHECK(pt_cuda_built() == 1, "binary not built with CUDA"); }

static void test_device_query(void) {
    char why[512] = "";
    int n = pt_cuda_device_count(why, sizeof why);
    if (n == 0) TEST_SKIP("no CUDA device here (%s)", why);
    for (int i = 0; i < n; i++) {
        pt_cuda_device_info info;
        pt_status st = pt_cuda_device_query(i, &info);
        REQUIRE(st == PT_OK, "device %d: %s", i, pt_last_error());
        char d[400];
        pt_cuda_device_describe(&info, d, sizeof d);
        printf("INFO device %d: %s; L2 %zu MiB; smem opt-in %zu KiB; free %.1f GiB; driver %d runtime %d\n",
               i, d, info.l2_bytes >> 20, info.smem_optin_per_block >> 10,
               (double)info.free_mem / (1 << 30), info.driver_version, info.runtime_version);
        CHECK(info.kernel_ok == 1, "self-test kernel did not run");
        CHECK(info.sm_count > 0, "sm_count %d", info.sm_count);
        CHECK(info.total_mem > 0 && info.free_mem <= info.total_mem, "memory %zu of %zu", info.free_mem,
              info.total_mem);
        CHECK(info.cc_major == 9 && info.cc_minor == 0, "compute capability %d.%d, built for 9.0a",
              info.cc_major, info.cc_minor);
    }
}

static void test_select(void) {
    char why[512] = "", desc[600];
    int n = pt_cuda_device_count(why, sizeof why);
    pt_device r = PT_DEVICE_AUTO;
    REQUIRE(pt_device_resolve(PT_DEVICE_CPU, &r, desc, sizeof desc) == PT_OK, "%s", pt_last_error());
    CHECK(r == PT_DEVICE_CPU, "cpu resolved to %s", pt_device_name(r));
    REQUIRE(pt_device_resolve(PT_DEVICE_AUTO, &r, desc, sizeof desc) == PT_OK, "%s", pt_last_error());
    printf("INFO auto -> %s\n", desc);
    if (n > 0) {
        CHECK(r == PT_DEVICE_CUDA, "auto with %d devices resolved to %s (%s)", n, pt_device_name(r), desc);
        REQUIRE(pt_device_resolve(PT_DEVICE_CUDA, &r, desc, sizeof desc) == PT_OK, "%s", pt_last_error());
        CHECK(r == PT_DEVICE_CUDA, "cuda resolved to %s", pt_device_name(r));
    } else {
        /* The fallback: auto gives the CPU, and asking for CUDA names the call. */
        CHECK(r == PT_DEVICE_CPU, "auto without a device resolved to %s", pt_device_name(r));
        CHECK(strstr(desc, "cudaGetDeviceCount") != NULL, "fallback description: %s", desc);
        pt_status st = pt_device_resolve(PT_DEVICE_CUDA, &r, desc, sizeof desc);
        CHECK(st == PT_ERR_DEVICE, "--device cuda without a device gave %s", pt_status_name(st));
        CHECK(strstr(pt_last_error(), "cudaGetDeviceCount") != NULL, "message: %s", pt_last_error());
        printf("INFO --device cuda here: %s\n", pt_last_error());
    }
}

static void test_parse(void) {
    pt_device d;
    CHECK(pt_device_parse("cuda", &d) == PT_OK && d == PT_DEVICE_CUDA, "cuda");
    CHECK(pt_device_parse("cpu", &d) == PT_OK && d == PT_DEVICE_CPU, "cpu");
    CHECK(pt_device_parse("auto", &d) == PT_OK && d == PT_DEVICE_AUTO, "auto");
    CHECK(pt_device_parse("gpu", &d) == PT_ERR_INVALID_ARG, "gpu accepted");
    CHECK(strstr(pt_last_error(), "'gpu'") != NULL, "message: %s", pt_last_error());
}

int main(void) {
    TEST_RUN(test_built_with_cuda);
    TEST_RUN(test_device_query);
    TEST_RUN(test_select);
    TEST_RUN(test_parse);
    return test_summary();
}
