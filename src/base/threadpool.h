/* A persistent thread pool (the CPU backend's workers).
 *
 * pt_pool_for(pool, n, grain, fn, ctx) splits [0, n) into chunks (multiples of
 * grain, about 4 per thread) and calls fn(ctx, begin, end, ith) for each; the
 * threads claim chunks from an atomic counter, so a thread the OS has
 * descheduled delays the job by at most the chunk it already started (the
 * others take the rest). ith (0 = the caller) identifies the running thread,
 * for per-thread scratch. A job with one chunk runs on the caller alone.
 *
 * pt_pool_run(pool, fn, ctx) runs fn(ctx, ith, nth) once on each of the nth
 * threads (static split) and returns when all have finished; only there may
 * fn call pt_pool_barrier().
 *
 * Waits spin briefly, then yield or sleep, so an idle pool costs nothing and
 * an oversubscribed machine does not burn the CPU a descheduled worker needs.
 *
 * Determinism: the pool decides which thread runs which chunk, never what a
 * chunk computes; callers compute each output element in a fixed order inside
 * one chunk, so results do not depend on the thread count or the schedule. */
#ifndef PT_BASE_THREADPOOL_H
#define PT_BASE_THREADPOOL_H

#include "petrel.h"

typedef struct pt_pool pt_pool;
typedef void (*pt_pool_fn)(void *ctx, int ith, int nth);
/* One chunk [begin, end) of a pt_pool_for job, run by thread ith. */
typedef void (*pt_pool_range_fn)(void *ctx, long begin, long end, int ith);

/* n_threads >= 1 (1 = run everything on the caller). */
pt_status pt_pool_create(pt_pool **out, int n_threads);
void pt_pool_free(pt_pool **pool);
int pt_pool_size(const pt_pool *pool);
void pt_pool_run(pt_pool *pool, pt_pool_fn fn, void *ctx);
/* n <= 0 does nothing; grain < 1 counts as 1. Not reentrant: fn must not
 * start another job on the same pool. */
void pt_pool_for(pt_pool *pool, long n, long grain, pt_pool_range_fn fn, void *ctx);
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
