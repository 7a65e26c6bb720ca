/* Tests for src/base: errors, half floats, arena, thread pool, JSON helpers, UTF-8. */
#include "test.h"

#include "base/arena.h"
#include "base/env.h"
#include "base/error.h"
#include "base/half.h"
#include "base/json.h"
#include "base/log.h"
#include "base/threadpool.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <stdint.h>

static void test_error_message(void) {
    pt_status s = pt_error(PT_ERR_FORMAT, "file %s: bad %d", "x.json", 3);
    CHECK(s == PT_ERR_FORMAT, "status returned");
    CHECK(strcmp(pt_last_error(), "file x.json: bad 3") == 0, "message: %s", pt_last_error());
    pt_error_prefix(PT_ERR_FORMAT, "loading %s", "m");
    CHECK(strcmp(pt_last_error(), "loading m: file x.json: bad 3") == 0, "prefix: %s", pt_last_error());
    CHECK(strcmp(pt_status_name(PT_ERR_IO), "PT_ERR_IO") == 0, "name");
}

static void test_bf16_round_nearest_even(void) {
    /* 1.0 + 2^-8 is exactly halfway between bf16 1.0 and 1.0+2^-7: ties to even (1.0) */
    CHECK(pt_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "tie to even down: %04x", pt_f32_to_bf16(1.0f + 0x1p-8f));
    CHECK(pt_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82, "tie to even up");
    CHECK(pt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81, "above tie rounds up");
    uint16_t n = pt_f32_to_bf16(pt_bits_f32(0x7f800001u)); /* signalling NaN with low payload */
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0, "NaN preserved: %04x", n);
    CHECK(pt_f32_to_bf16(pt_bits_f32(0x7f7fffffu)) == 0x7f80, "max float rounds to inf (correct RNE)");
    CHECK(pt_bf16_to_f32(0xc0a0) == -5.0f, "decode");
}

static void test_f16_roundtrip(void) {
    /* every f16 bit pattern (non-NaN) round-trips exactly */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            uint16_t r = pt_f32_to_f16(pt_f16_to_f32((uint16_t)h));
            if ((r & 0x7c00) != 0x7c00 || !(r & 0x3ff)) bad++;
            continue;
        }
        if (pt_f32_to_f16(pt_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK(bad == 0, "%d f16 patterns did not round-trip", bad);
    CHECK(pt_f32_to_f16(65520.0f) == 0x7c00, "overflow to inf");
    CHECK(pt_f32_to_f16(0x1p-25f) == 0, "2^-25 ties to zero");
    CHECK(pt_f32_to_f16(0x1.8p-25f) == 1, "above 2^-25 rounds to min subnormal");
    CHECK(pt_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie to even");
    CHECK(pt_f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f) == 0x3c02, "tie to even up");
}

static void test_arena(void) {
    pt_arena a;
    pt_arena_init(&a, 128);
    char *p = pt_arena_alloc(&a, 10);
    char *q = pt_arena_alloc(&a, 1000);
    CHECK(p && q && ((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0, "aligned");
    CHECK(q[999] == 0, "zeroed");
    char *s = pt_arena_strdup(&a, "hello");
    CHECK(s && strcmp(s, "hello") == 0, "strdup");
    pt_arena_free(&a);
    CHECK(a.head == NULL, "freed");
}

typedef struct {
    long n;
    double *out;
    pt_pool *pool;
    int phases;
} pool_ctx;

static void pool_fn(void *vctx, int ith, int nth) {
    pool_ctx *c = vctx;
    for (int ph = 0; ph < c->phases; ph++) {
        long b, e;
        pt_split_range(c->n, ith, nth, &b, &e);
        for (long i = b; i < e; i++) c->out[i] += (double)i * (ph + 1);
        pt_pool_barrier(c->pool);
    }
}

static void test_threadpool(void) {
    for (int nt = 1; nt <= 4; nt++) {
        pt_pool *pool;
        REQUIRE(pt_pool_create(&pool, nt) == PT_OK, "create %d", nt);
        double out[1001] = {0};
        pool_ctx c = {1001, out, pool, 5};
        for (int rep = 0; rep < 50; rep++) pt_pool_run(pool, pool_fn, &c);
        int bad = 0;
        for (long i = 0; i < 1001; i++)
            if (out[i] != (double)i * 15 * 50) bad++;
        CHECK(bad == 0, "nt=%d: %d wrong", nt, bad);
        pt_pool_free(&pool);
        CHECK(pool == NULL, "free sets NULL");
    }
    pt_pool *p;
    CHECK(pt_pool_create(&p, 0) == PT_ERR_INVALID_ARG, "0 threads rejected");
}

/* pool_fn, with the last thread arriving 1 ms late (longer than the pool's
 * spin: the others wait past it at the first barrier) */
static void late_fn(void *vctx, int ith, int nth) {
    if (ith == nth - 1) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    pool_fn(vctx, ith, nth);
}

/* Jobs published after the workers have gone to sleep (an idle gap longer
 * than the spin before each) and barriers a thread reaches late: every job
 * still runs completely (no lost wake-up, no thread left behind). */
static void test_threadpool_sleep(void) {
    for (int nt = 2; nt <= 3; nt++) {
        pt_pool *pool;
        REQUIRE(pt_pool_create(&pool, nt) == PT_OK, "create %d", nt);
        double out[301] = {0};
        pool_ctx c = {301, out, pool, 2};
        for (int rep = 0; rep < 20; rep++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            pt_pool_run(pool, rep % 2 ? late_fn : pool_fn, &c);
        }
        int bad = 0;
        for (long i = 0; i < 301; i++)
            if (out[i] != (double)i * 3 * 20) bad++;
        CHECK(bad == 0, "nt=%d: %d wrong after idle gaps", nt, bad);
        pt_pool_free(&pool);
    }
}

typedef struct {
    atomic_int *hits; /* [n] how often each index was visited */
    long grain;
    int nth;
    atomic_int bad_bounds, bad_ith;
    int slow; /* sleep in chunk 0 to mimic a descheduled thread */
} for_ctx;

static void for_fn(void *vctx, long b, long e, int ith) {
    for_ctx *c = vctx;
    if (b % c->grain != 0 || e <= b) atomic_fetch_add(&c->bad_bounds, 1);
    if (ith < 0 || ith >= c->nth) atomic_fetch_add(&c->bad_ith, 1);
    if (c->slow && b == 0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    for (long i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

/* pt_pool_for: every index exactly once per job, chunks aligned to the grain,
 * thread ids in range; mixed with static jobs on the same pool; more threads
 * than CPUs (the oversubscribed case) with one slow chunk. */
static void test_threadpool_for(void) {
    static atomic_int hits[5000];
    const long sizes[] = {1, 3, 7, 64, 1000, 4999};
    const long grains[] = {1, 4, 32};
    for (int nt = 1; nt <= 6; nt++) {
        pt_pool *pool;
        REQUIRE(pt_pool_create(&pool, nt) == PT_OK, "create %d", nt);
        int wrong = 0, bounds = 0, iths = 0;
        for (int rep = 0; rep < 20; rep++)
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
                for (size_t gi = 0; gi < sizeof grains / sizeof *grains; gi++) {
                    long n = sizes[si];
                    for (long i = 0; i < n; i++) atomic_store(&hits[i], 0);
                    for_ctx c = {hits, grains[gi], nt, 0, 0, nt >= 5 && rep == 0};
                    pt_pool_for(pool, n, grains[gi], for_fn, &c);
                    for (long i = 0; i < n; i++) wrong += atomic_load(&hits[i]) != 1;
                    bounds += atomic_load(&c.bad_bounds);
                    iths += atomic_load(&c.bad_ith);
                    if (gi == 0 && si == 4) { /* a static job between range jobs */
                        double out[1001] = {0};
                        pool_ctx pc = {1001, out, pool, 2};
                        pt_pool_run(pool, pool_fn, &pc);
                        for (long i = 0; i < 1001; i++) wrong += out[i] != (double)i * 3;
                    }
                }
        CHECK(wrong == 0, "nt=%d: %d indices visited wrongly", nt, wrong);
        CHECK(bounds == 0, "nt=%d: %d chunks not aligned to the grain", nt, bounds);
        CHECK(iths == 0, "nt=%d: %d thread ids out of range", nt, iths);
        pt_pool_for(pool, 0, 1, for_fn, NULL); /* empty: fn never called */
        pt_pool_free(&pool);
    }
    atomic_store(&hits[0], 0);
    for_ctx c = {hits, 1, 1, 0, 0, 0};
    pt_pool_for(NULL, 1, 1, for_fn, &c); /* no pool: runs on the caller */
    CHECK(atomic_load(&hits[0]) == 1, "NULL pool runs inline");
}

static void test_json(void) {
    cJSON *j;
    const char *dup = "{\"a\":1,\"b\":{\"x\":1,\"x\":2}}";
    CHECK(pt_json_parse(dup, strlen(dup), "t.json", 1, &j) == PT_ERR_FORMAT, "duplicate rejected");
    CHECK(strstr(pt_last_error(), "duplicate key \"x\"") != NULL, "message names key: %s", pt_last_error());
    CHECK(pt_json_parse(dup, strlen(dup), "t.json", 0, &j) == PT_OK, "duplicates allowed when asked");
    cJSON_Delete(j);
    const char *bad = "{\"a\":";
    CHECK(pt_json_parse(bad, strlen(bad), "t.json", 1, &j) == PT_ERR_FORMAT, "truncated");
    const char *trail = "{} x";
    CHECK(pt_json_parse(trail, strlen(trail), "t.json", 1, &j) == PT_ERR_FORMAT, "trailing garbage");
    const char *nums = "{\"big\":9007199254740993,\"neg\":-3,\"frac\":1.5,\"s\":\"q\"}";
    REQUIRE(pt_json_parse(nums, strlen(nums), "n.json", 1, &j) == PT_OK, "parse");
    int64_t v;
    CHECK(pt_json_get_i64(j, "neg", -10, 10, &v, "n.json") == PT_OK && v == -3, "neg");
    CHECK(pt_json_get_i64(j, "neg", 0, 10, &v, "n.json") == PT_ERR_FORMAT, "range");
    CHECK(pt_json_get_i64(j, "frac", 0, 10, &v, "n.json") == PT_ERR_FORMAT, "fraction rejected");
    CHECK(pt_json_get_i64(j, "s", 0, 10, &v, "n.json") == PT_ERR_FORMAT, "string rejected");
    CHECK(pt_json_get_i64(j, "nope", 0, 10, &v, "n.json") == PT_ERR_NOT_FOUND, "missing");
    CHECK(pt_json_get_i64(j, "big", 0, INT64_MAX, &v, "n.json") == PT_ERR_FORMAT, "above 2^53 rejected");
    cJSON_Delete(j);
}

/* PETREL_LOG's values: the four level names, anything else refused (the
 * caller then keeps warn and says so); the level set is the level read. */
static void test_log_level_parse(void) {
    CHECK(pt_log_level_parse("error") == PT_LOG_ERROR, "error");
    CHECK(pt_log_level_parse("warn") == PT_LOG_WARN, "warn");
    CHECK(pt_log_level_parse("info") == PT_LOG_INFO, "info");
    CHECK(pt_log_level_parse("debug") == PT_LOG_DEBUG, "debug");
    CHECK(pt_log_level_parse("verbose") == -1, "an unknown name");
    CHECK(pt_log_level_parse("DEBUG") == -1, "names are lower case");
    CHECK(pt_log_level_parse("") == -1 && pt_log_level_parse(NULL) == -1, "empty and NULL");
    const pt_log_level was = pt_log_get_level();
    pt_log_set_level(PT_LOG_DEBUG);
    CHECK(pt_log_get_level() == PT_LOG_DEBUG, "set then read");
    pt_log_set_level(was);
}

/* Runs f with stderr sent to a temporary file; returns what it wrote (static buffer). */
static const char *stderr_of(int (*f)(void), int *ret) {
    static char buf[1024];
    fflush(stderr);
    FILE *tmp = tmpfile();
    const int saved = dup(2);
    dup2(fileno(tmp), 2);
    *ret = f();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    const size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
    return buf;
}
/* Each check sets a variable of its own (a bad value is warned about once per variable and process). */
static char g_var[64];
static void set_var(const char *value) {
    static int n;
    unsetenv(g_var);
    snprintf(g_var, sizeof g_var, "PETREL_TEST_SWITCH_%d", ++n);
    setenv(g_var, value, 1);
}
static int flag_default_on(void) { return pt_env_flag(g_var, 1); }
static int flag_default_off(void) { return pt_env_flag(g_var, 0); }
static int int_1_16(void) { return pt_env_int(g_var, 1, 16, 7); }
static int pick_16_32(void) {
    static const int tk[] = {16, 32};
    return pt_env_pick(g_var, tk, 2, 0);
}
static int pick_16_32_default_32(void) {
    static const int tk[] = {16, 32};
    return pt_env_pick(g_var, tk, 2, 32);
}

/* The environment switches: the values they take, and a value they do not
 * take named in a warning with the default kept (a typo never flips one). */
static void test_env_switches(void) {
    const pt_log_level was = pt_log_get_level();
    pt_log_set_level(PT_LOG_WARN);
    int r;
    const char *out;
    snprintf(g_var, sizeof g_var, "PETREL_TEST_SWITCH_UNSET");
    unsetenv(g_var);
    CHECK(flag_default_on() == 1 && flag_default_off() == 0, "unset: the default");
    set_var("");
    CHECK(flag_default_on() == 1 && flag_default_off() == 0, "empty: the default");
    static const char *on[] = {"1", "on", "ON", "true", "Yes"}, *off[] = {"0", "off", "False", "no", "NO"};
    for (int i = 0; i < 5; i++) {
        set_var(on[i]);
        out = stderr_of(flag_default_off, &r);
        CHECK(r == 1 && !*out, "%s turns a switch on, silently (got %d, said '%s')", on[i], r, out);
        set_var(off[i]);
        out = stderr_of(flag_default_on, &r);
        CHECK(r == 0 && !*out, "%s turns a switch off, silently (got %d, said '%s')", off[i], r, out);
    }
    static const char *bad[] = {"2", "of", "enable", "1x", " 0"};
    for (int i = 0; i < 5; i++) {
        set_var(bad[i]);
        out = stderr_of(flag_default_on, &r);
        CHECK(r == 1 && strstr(out, g_var) && strstr(out, bad[i]) && strstr(out, "default (on)"),
              "'%s': the default kept and named (got %d, said '%s')", bad[i], r, out);
        out = stderr_of(flag_default_on, &r);
        CHECK(r == 1 && !*out, "'%s' read again: the default, no second warning (said '%s')", bad[i], out);
        set_var(bad[i]);
        out = stderr_of(flag_default_off, &r);
        CHECK(r == 0 && strstr(out, "default (off)"), "'%s' with the default off (got %d)", bad[i], r);
    }
    static const struct {
        const char *v;
        int want, warns;
    } ints[] = {{"1", 1, 0}, {"16", 16, 0}, {" 8 ", 8, 0}, {"+3", 3, 0}, {"0", 7, 1},   {"17", 7, 1},
                {"-4", 7, 1}, {"4k", 7, 1}, {"x", 7, 1},  {"99999999999999999999", 7, 1}, {"  ", 7, 1}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        set_var(ints[i].v);
        out = stderr_of(int_1_16, &r);
        CHECK(r == ints[i].want && (*out != 0) == ints[i].warns && (!ints[i].warns || strstr(out, "from 1 to 16")),
              "int '%s': got %d (want %d), said '%s'", ints[i].v, r, ints[i].want, out);
    }
    static const struct {
        const char *v;
        int want;
    } picks[] = {{"16", 16}, {"32", 32}, {"24", 0}, {"0", 0}, {"sixteen", 0}};
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
        set_var(picks[i].v);
        out = stderr_of(pick_16_32, &r);
        const int warns = picks[i].want == 0;
        CHECK(r == picks[i].want && (*out != 0) == warns &&
                  (!warns || (strstr(out, "not one of 16, 32") && strstr(out, "the built-in choice"))),
              "pick '%s': got %d, said '%s'", picks[i].v, r, out);
    }
    set_var("24");
    out = stderr_of(pick_16_32_default_32, &r);
    CHECK(r == 32 && strstr(out, "not one of 16, 32") && strstr(out, "default (32)"),
          "pick '24' with the default 32: got %d, said '%s'", r, out);
    unsetenv(g_var);
    pt_log_set_level(was);
}

static void test_utf8(void) {
    CHECK(pt_utf8_invalid_offset("h\xc3\xa9llo", 6) == -1, "valid 2-byte");
    CHECK(pt_utf8_invalid_offset("\xf0\x9f\x98\x80", 4) == -1, "valid 4-byte");
    CHECK(pt_utf8_invalid_offset("ab\xc0\xaf", 4) == 2, "overlong");
    CHECK(pt_utf8_invalid_offset("\xed\xa0\x80", 3) == 0, "surrogate");
    CHECK(pt_utf8_invalid_offset("a\xe2\x82", 3) == 1, "truncated");
    CHECK(pt_utf8_invalid_offset("\xf4\x90\x80\x80", 4) == 0, "above U+10FFFF");
}

int main(void) {
    TEST_RUN(test_error_message);
    TEST_RUN(test_bf16_round_nearest_even);
    TEST_RUN(test_f16_roundtrip);
    TEST_RUN(test_arena);
    TEST_RUN(test_threadpool);
    TEST_RUN(test_threadpool_for);
    TEST_RUN(test_threadpool_sleep);
    TEST_RUN(test_json);
    TEST_RUN(test_log_level_parse);
    TEST_RUN(test_env_switches);
    TEST_RUN(test_utf8);
    return test_summary();
}
