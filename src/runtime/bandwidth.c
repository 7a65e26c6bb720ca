/* Memory read bandwidth meter (see bandwidth.h). */
#include "runtime/bandwidth.h"

#include "base/error.h"
#include "base/threadpool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

uint64_t pt_bw_sum_scalar(const uint64_t *p, size_t n_words) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 4 <= n_words; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    for (; i < n_words; i++) a0 += p[i];
    return a0 + a1 + a2 + a3;
}

typedef struct {
    const uint64_t *buf;
    size_t n_words;
    int avx2;
    uint64_t sums[256];
} bw_ctx;

static void bw_run(void *vctx, int ith, int nth) {
    bw_ctx *c = vctx;
    long b, e;
    /* split in 4 KiB pages so every thread starts aligned */
    long pages = (long)(c->n_words / 512);
    pt_split_range(pages, ith, nth, &b, &e);
    const uint64_t *p = c->buf + (size_t)b * 512;
    size_t n = (size_t)(e - b) * 512;
    c->sums[ith & 255] += c->avx2 ? pt_bw_sum_avx2(p, n) : pt_bw_sum_scalar(p, n);
}

static void bw_touch(void *vctx, int ith, int nth) {
    bw_ctx *c = vctx;
    long b, e;
    long pages = (long)(c->n_words / 512);
    pt_split_range(pages, ith, nth, &b, &e);
    /* first touch from the thread that will read it (NUMA locality) */
    memset((void *)(c->buf + (size_t)b * 512), ith + 1, (size_t)(e - b) * 4096);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct pt_bw_meter {
    uint64_t *buf;
    size_t bytes;
    pt_pool *pool;
    bw_ctx c;
};

pt_status pt_bw_meter_open(pt_bw_meter **out, int n_threads, size_t bytes) {
    *out = NULL;
    if (n_threads < 1 || bytes < ((size_t)64 << 20))
        return pt_error(PT_ERR_INVALID_ARG, "bandwidth: bad parameters (%d threads, %zu bytes)", n_threads, bytes);
    bytes &= ~(((size_t)2 << 20) - 1);
    pt_bw_meter *m = calloc(1, sizeof *m);
    if (!m) return pt_error(PT_ERR_NOMEM, "bandwidth: out of memory");
    m->buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!m->buf) {
        free(m);
        return pt_error(PT_ERR_NOMEM, "bandwidth: cannot allocate %zu bytes", bytes);
    }
#ifdef MADV_HUGEPAGE
    /* huge pages, as the CPU backend asks for its weights (cpu_backend.c
     * advise_huge): the roofline is the best streaming read, and with 4 KiB
     * pages this VM reads ~20% slower (advice: errors ignored) */
    (void)madvise(m->buf, bytes, MADV_HUGEPAGE);
#endif
    pt_status st = pt_pool_create(&m->pool, n_threads);
    if (st != PT_OK) {
        free(m->buf);
        free(m);
        return st;
    }
    m->bytes = bytes;
    m->c.buf = m->buf;
    m->c.n_words = bytes / 8;
    __builtin_cpu_init();
    m->c.avx2 = __builtin_cpu_supports("avx2");
    pt_pool_run(m->pool, bw_touch, &m->c);
    *out = m;
    return PT_OK;
}

pt_status pt_bw_meter_pass(pt_bw_meter *m, double *gbps) {
    if (!m || !gbps) return pt_error(PT_ERR_INVALID_ARG, "bandwidth: no meter");
    double t0 = now_s();
    pt_pool_run(m->pool, bw_run, &m->c);
    double dt = now_s() - t0;
    *gbps = (double)m->bytes / dt / 1e9;
    return PT_OK;
}

void pt_bw_meter_free(pt_bw_meter **pm) {
    if (!pm || !*pm) return;
    pt_pool_free(&(*pm)->pool);
    free((*pm)->buf);
    free(*pm);
    *pm = NULL;
}

pt_status pt_bw_meter_best(pt_bw_meter *m, int passes, double *gbps) {
    if (passes < 1) return pt_error(PT_ERR_INVALID_ARG, "bandwidth: %d passes", passes);
    double best = 0;
    for (int i = 0; i < passes; i++) {
        double g;
        PT_TRY(pt_bw_meter_pass(m, &g));
        if (g > best) best = g;
    }
    *gbps = best;
    return PT_OK;
}

pt_status pt_measure_read_bandwidth(int n_threads, size_t bytes, int passes, double *gbps) {
    if (n_threads < 1 || bytes < ((size_t)64 << 20) || passes < 1)
        return pt_error(PT_ERR_INVALID_ARG, "bandwidth: bad parameters");
    pt_bw_meter *m;
    PT_TRY(pt_bw_meter_open(&m, n_threads, bytes));
    pt_status st = pt_bw_meter_best(m, passes, gbps);
    pt_bw_meter_free(&m);
    return st;
}
