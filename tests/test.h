/* Minimal test harness. A test binary is a main() that calls TEST_RUN(fn)
 * for each test and returns test_summary(). Each test prints one line,
 * "PASS name" or "FAIL name: why"; tests/run.sh counts them. */
#ifndef PT_TEST_H
#define PT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int test_failed_current, test_skipped_current;
extern int test_n_pass, test_n_fail;
extern const char *test_current;

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            if (!test_failed_current) printf("FAIL %s: ", test_current);              \
            else printf("    also: ");                                                \
            printf("%s:%d: check failed: %s", __FILE__, __LINE__, #cond);              \
            printf(" — " __VA_ARGS__);                                                \
            printf("\n");                                                             \
            test_failed_current = 1;                                                  \
        }                                                                             \
    } while (0)

/* CHECK, then leave the test function on failure. */
#define REQUIRE(cond, ...)                 \
    do {                                   \
        CHECK(cond, __VA_ARGS__);          \
        if (test_failed_current) return;   \
    } while (0)

/* REQUIRE for a function returning int: the failure is reported and 0 returned. */
#define NEED(cond, ...)            \
    do {                           \
        if (!(cond)) {             \
            CHECK(0, __VA_ARGS__); \
            return 0;              \
        }                          \
    } while (0)

#define TEST_RUN(fn)                                              \
    do {                                                          \
        test_current = #fn;                                       \
        test_failed_current = 0;                                  \
        test_skipped_current = 0;                                 \
        fn();                                                     \
        if (test_failed_current) test_n_fail++;                   \
        else if (!test_skipped_current) {                         \
            test_n_pass++;                                        \
            printf("PASS %s\n", #fn);                             \
        }                                                         \
        fflush(stdout);                                           \
    } while (0)

/* Skips the current test with a notice (counted as neither pass nor fail). */
#define TEST_SKIP(...)                                            \
    do {                                                          \
        printf("SKIP %s: ", test_current);                        \
        printf(__VA_ARGS__);                                      \
        printf("\n");                                             \
        test_skipped_current = 1;                                 \
        return;                                                   \
    } while (0)

int test_summary(void);

/* Path helpers: the repository root (tests run from it) and ../shared. */
const char *test_shared_dir(void); /* NULL when ../shared is absent */
/* Whether this CPU runs the AVX-512 kernels with BF16 (F, BW, VL, DQ and
 * AVX512-BF16: the vdpbf16ps kernels of kernels_avx512.c) */
int test_cpu_avx512_bf16(void);
/* Fills buf with a fresh temporary directory path (created). */
void test_tmpdir(char *buf, size_t n);

#endif
