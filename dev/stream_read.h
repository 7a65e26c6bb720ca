/* The dev benchmarks' streaming-read reference (dev/bench_decode_step.c,
 * dev/bench_decode_ab.c, dev/bench_hugepage.c): a pool job in which each thread reads its
 * contiguous share of a 64-byte-aligned buffer once with 512-bit loads (the
 * roofline a decode step's weight reads are compared with). Header-only,
 * AVX-512 (the including file is built with -mavx512f). */
#ifndef PT_DEV_STREAM_READ_H
#define PT_DEV_STREAM_READ_H

#include "base/threadpool.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* p: the buffer, n: its bytes (a multiple of 256); out: one sum per thread
 * (kept so the loads are not optimized away). */
typedef struct {
    const uint8_t *p;
    size_t n;
    long long out[64];
} rd_ctx;
static void rd_run(void *arg, int ith, int nth) {
    rd_ctx *r = arg;
    long b, e;
    pt_split_range((long)(r->n / 256), ith, nth, &b, &e);
    __m512i a = _mm512_setzero_si512();
    for (long i = b; i < e; i++) {
        const __m512i *q = (const __m512i *)(r->p + (size_t)i * 256);
        a = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_add_epi32(_mm512_load_si512(q), _mm512_load_si512(q + 1)),
                                                 _mm512_add_epi32(_mm512_load_si512(q + 2), _mm512_load_si512(q + 3))));
    }
    r->out[ith] = _mm512_reduce_add_epi32(a);
}

/* The buffer to read: at least n + 256 bytes (filled), 2 MiB aligned on huge
 * pages (madvise), as the backend's weights: the best streaming read. */
static uint8_t *rd_buffer(size_t n) {
    size_t rbytes = (n + 256 + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1);
    uint8_t *rbuf = aligned_alloc(2 << 20, rbytes);
    madvise(rbuf, rbytes, MADV_HUGEPAGE);
    memset(rbuf, 1, n + 256);
    return rbuf;
}

#endif
