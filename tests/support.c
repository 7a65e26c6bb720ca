/* Test harness support (see test.h). */
#include "test.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int test_failed_current = 0, test_skipped_current = 0;
int test_n_pass = 0, test_n_fail = 0;
const char *test_current = "";

int test_summary(void) {
    printf("# %d passed, %d failed\n", test_n_pass, test_n_fail);
    return test_n_fail ? 1 : 0;
}

int test_cpu_avx512_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
}

const char *test_shared_dir(void) {
    static char path[4096];
    const char *env = getenv("PETREL_SHARED");
    const char *cand = env && *env ? env : "../shared";
    struct stat st;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/DESIGN.md", cand);
    if (stat(probe, &st) != 0) return NULL;
    snprintf(path, sizeof path, "%s", cand);
    return path;
}

void test_tmpdir(char *buf, size_t n) {
    const char *base = getenv("TMPDIR");
    snprintf(buf, n, "%s/petrel-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        abort();
    }
}
