/* A persistent thread pool with a barrier (the CPU backend's workers).
 *
 * pt_pool_run(pool, fn, ctx) runs fn(ctx, ith, nth) on all nth threads (the
 * caller is thread 0) and returns when every thread has finished. Inside fn,
 * pt_pool_barrier() synchronizes all nth threads. Workers spin briefly then
 * sleep on a futex-like condition, so an idle pool costs nothing.
 *
 * Determinism: the pool never decides how work is split; callers partition by
 * (ith, nth) with a fixed order per output element, so results do not depend
 * on the thread count. */
#ifndef PT_BASE_THREADPOOL_H
#define PT_BASE_THREADPOOL_H

#include "petrel.h"

typedef struct pt_pool pt_pool;
typedef void (*pt_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1 = run everything on the caller). */
pt_status pt_pool_create(pt_pool **out, int n_threads);
void pt_pool_free(pt_pool **pool);
int pt_pool_size(const pt_pool *pool);
void pt_pool_run(pt_pool *pool, pt_pool_fn fn, void *ctx);
/* Only valid inside fn during pt_pool_run. */
void pt_pool_barrier(pt_pool *pool);

/* Splits [0, n) into nth contiguous chunks; chunk ith is [*begin, *end). */
static inline void pt_split_range(long n, int ith, int nth, long *begin, long *end) {
    long per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

/* Number of online CPUs (>= 1). */
int pt_cpu_count(void);

#endif
