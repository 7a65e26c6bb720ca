/* Persistent thread pool (see threadpool.h): static jobs (pt_pool_run, every
 * thread runs fn once, with a barrier) and dynamic range jobs (pt_pool_for,
 * threads claim fixed chunks from one atomic word).
 *
 * The job word `state` (64 bits) is
 *   [63..33] generation (bumped per job) | [32] static flag |
 *   [31..16] next chunk to claim          | [15..0] number of chunks.
 * A thread claims chunk c of the current job by a compare-and-swap of the
 * whole word from (gen, c, n) to (gen, c + 1, n). Because the generation and
 * the chunk count travel in the same word, a thread that slept through a job
 * can never claim a chunk of a job it did not read: its CAS fails and it
 * reloads. After a successful claim the job's fields (fn, ctx, n, chunk size)
 * are stable, since the caller publishes the next job only after every chunk
 * of this one is done.
 *
 * Why this shape: on an oversubscribed machine a worker can be descheduled for
 * milliseconds. With a static split the caller then waits for that worker's
 * whole share; here the running threads take the remaining chunks, and the
 * caller waits only for chunks already started.
 *
 * Waits spin briefly (about the gap between two ops of a decode step), then
 * sleep on a futex: idle workers on `seq` (bumped per job), the caller on
 * `done`. Spinning longer is a loss on a shared machine: Linux's autogroup
 * scheduling gives all threads of a session one share of the CPUs, so a
 * spinning worker takes its time from the thread doing the work. Each sleep
 * follows the same pattern, which cannot lose a wake-up: the sleeper raises a
 * waiter count and then re-checks the word inside FUTEX_WAIT (which returns at
 * once if the word changed); the waker changes the word and then reads the
 * count (all sequentially consistent), so one of the two sees the other. */
#include "base/threadpool.h"

#include "base/env.h"
#include "base/error.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ST_STATIC ((uint64_t)1 << 32)
#define ST_GEN_SHIFT 33
#define ST_MAX_CHUNKS 0xffff
/* How long an idle worker / a waiting caller spins before it sleeps:
 * PETREL_POOL_SPIN_US microseconds (read once; default 50, 0..10000).
 * Measured as time, not as a count of pause instructions: a pause takes
 * ~140 cycles on recent Intel cores and ~19 ns on AMD Zen 5, so 1000 of
 * them were ~45 µs on one and ~19 µs on the other (docs/cpu.md). */
#define SPIN_US_DEFAULT 50

struct pt_pool {
    int n;
    pthread_t *threads;
    _Atomic uint64_t state; /* the job word (see the header comment) */
    atomic_uint seq;        /* bumped after each new job word or stop: idle workers' futex */
    atomic_int sleepers;    /* workers asleep (or going to sleep) on seq */
    atomic_int stop;
    atomic_uint done;          /* static job: workers finished; range job: chunks finished (futex) */
    atomic_int caller_waiting; /* the caller sleeps (or is going to) on done */
    /* the current job; written only while no thread can be running it */
    pt_pool_fn sfn;
    pt_pool_range_fn rfn;
    void *ctx;
    long items, chunk;
    /* barrier (static jobs) */
    atomic_int bar_count;
    atomic_uint bar_sense;
};

typedef struct {
    pt_pool *pool;
    int ith;
} worker_arg;

static void futex_wait(atomic_uint *addr, unsigned expected) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* A chunk or a static share is finished: count it, wake the caller if it sleeps. */
static void mark_done(pt_pool *p) {
    atomic_fetch_add(&p->done, 1);
    if (atomic_load(&p->caller_waiting)) futex_wake(&p->done);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t spin_ns(void) {
    static _Atomic int64_t v = -1;
    int64_t ns = atomic_load_explicit(&v, memory_order_relaxed);
    if (ns < 0) {
        ns = (int64_t)pt_env_int("PETREL_POOL_SPIN_US", 0, 10000, SPIN_US_DEFAULT) * 1000;
        atomic_store_explicit(&v, ns, memory_order_relaxed);
    }
    return (uint64_t)ns;
}

/* Spins until ready(p, arg) or the spin time has passed; returns whether ready. */
static int spin_until(pt_pool *p, int (*ready)(pt_pool *, uint64_t), uint64_t arg) {
    const uint64_t lim = spin_ns();
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (ready(p, arg)) return 1;
        if ((i & 31) == 0) { /* the clock every 32 pauses (~1 µs) */
            const uint64_t t = now_ns();
            if (i == 0) t0 = t;
            else if (t - t0 >= lim) return 0;
        }
        cpu_relax();
    }
}

/* Claims and runs chunks of the range job whose word was `s`, as thread ith,
 * until none is left. Returns when the job's chunks are all claimed (or the
 * job changed). */
static void run_chunks(pt_pool *p, uint64_t s, int ith) {
    for (;;) {
        uint64_t nxt = (s >> 16) & 0xffff, nch = s & 0xffff;
        if ((s & ST_STATIC) || nxt >= nch) return;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s + ((uint64_t)1 << 16), memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* s now holds the fresh word */
        long b = (long)nxt * p->chunk, e = b + p->chunk;
        if (e > p->items) e = p->items;
        p->rfn(p->ctx, b, e, ith);
        mark_done(p);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

static int state_changed(pt_pool *p, uint64_t s) {
    return atomic_load_explicit(&p->state, memory_order_acquire) != s || atomic_load(&p->stop);
}

/* Blocks a worker until the job word differs from s (or stop). q is the
 * value of seq read before s was loaded: a job published after that load has
 * bumped seq, so the futex wait returns at once. */
static void wait_change(pt_pool *p, uint64_t s, unsigned q) {
    if (spin_until(p, state_changed, s)) return;
    atomic_fetch_add(&p->sleepers, 1);
    futex_wait(&p->seq, q);
    atomic_fetch_sub(&p->sleepers, 1);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    pt_pool *p = wa->pool;
    int ith = wa->ith;
    free(wa);
    uint64_t last_static = 0; /* generation of the last static job this worker ran */
    for (;;) {
        unsigned q = atomic_load(&p->seq);
        uint64_t s = atomic_load(&p->state);
        if (atomic_load(&p->stop)) return NULL;
        if (s & ST_STATIC) {
            uint64_t gen = s >> ST_GEN_SHIFT;
            if (gen != last_static) { /* the caller waits for every worker: fields are stable */
                last_static = gen;
                p->sfn(p->ctx, ith, p->n);
                mark_done(p);
                continue;
            }
        } else if (((s >> 16) & 0xffff) < (s & 0xffff)) {
            run_chunks(p, s, ith);
            continue;
        }
        wait_change(p, s, q);
    }
}

int pt_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

pt_status pt_pool_create(pt_pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return pt_error(PT_ERR_INVALID_ARG, "thread count %d out of range [1, 1024]", n_threads);
    pt_pool *p = calloc(1, sizeof *p);
    if (!p) return pt_error(PT_ERR_NOMEM, "out of memory");
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->n = i;
            pt_pool_free(&p);
            return pt_error(PT_ERR_NOMEM, "out of memory");
        }
        wa->pool = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i;
            pt_pool_free(&p);
            return pt_error(PT_ERR_INTERNAL, "cannot create worker thread %d", i);
        }
    }
    *out = p;
    return PT_OK;
}

void pt_pool_free(pt_pool **pool) {
    pt_pool *p = *pool;
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->seq, 1);
    futex_wake(&p->seq);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
    *pool = NULL;
}

int pt_pool_size(const pt_pool *pool) { return pool ? pool->n : 1; }

/* Publishes a job word (the job's fields are already written) and wakes any
 * sleeping worker (see the header comment for why no wake-up is lost). */
static void publish(pt_pool *p, uint64_t word) {
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store(&p->state, word);
    atomic_fetch_add(&p->seq, 1);
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->seq);
}

static uint64_t next_gen(const pt_pool *p) {
    return ((atomic_load_explicit(&p->state, memory_order_relaxed) >> ST_GEN_SHIFT) + 1) << ST_GEN_SHIFT;
}

/* The caller's wait for `target` finished units: spin, then sleep on done
 * (a descheduled worker gets the CPU instead of a spinning caller). */
static int all_done(pt_pool *p, uint64_t target) {
    return atomic_load_explicit(&p->done, memory_order_acquire) >= target;
}

static void wait_done(pt_pool *p, unsigned target) {
    if (spin_until(p, all_done, target)) return;
    atomic_store(&p->caller_waiting, 1);
    for (unsigned d; (d = atomic_load(&p->done)) < target;) futex_wait(&p->done, d);
    atomic_store(&p->caller_waiting, 0);
}

void pt_pool_run(pt_pool *pool, pt_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->sfn = fn;
    pool->ctx = ctx;
    publish(pool, next_gen(pool) | ST_STATIC);
    fn(ctx, 0, pool->n);
    wait_done(pool, (unsigned)(pool->n - 1));
}

void pt_pool_for(pt_pool *pool, long n, long grain, pt_pool_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nth = pt_pool_size(pool);
    /* about 4 chunks per thread (a descheduled thread's share is small),
     * rounded up to the grain, and at most ST_MAX_CHUNKS chunks */
    long chunk = (n + 4L * nth - 1) / (4L * nth);
    chunk = (chunk + grain - 1) / grain * grain;
    if ((n + chunk - 1) / chunk > ST_MAX_CHUNKS)
        chunk = ((n + ST_MAX_CHUNKS - 1) / ST_MAX_CHUNKS + grain - 1) / grain * grain;
    long nch = (n + chunk - 1) / chunk;
    if (nth == 1 || nch == 1) { /* nothing to share: no wake-up, no wait */
        fn(ctx, 0, n, 0);
        return;
    }
    pool->rfn = fn;
    pool->ctx = ctx;
    pool->items = n;
    pool->chunk = chunk;
    uint64_t word = next_gen(pool) | (uint64_t)nch;
    publish(pool, word);
    run_chunks(pool, word, 0);
    wait_done(pool, (unsigned)nch);
}

static int sense_changed(pt_pool *p, uint64_t sense) {
    return atomic_load_explicit(&p->bar_sense, memory_order_acquire) != (unsigned)sense;
}

void pt_pool_barrier(pt_pool *pool) {
    if (!pool || pool->n == 1) return;
    unsigned sense = atomic_load_explicit(&pool->bar_sense, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) == pool->n - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&pool->bar_sense, sense + 1, memory_order_release);
    } else if (!spin_until(pool, sense_changed, sense)) {
        while (!sense_changed(pool, sense)) sched_yield();
    }
}
