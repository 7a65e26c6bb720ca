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
 * caller waits only for chunks already started. Waits spin briefly, then
 * yield (the caller) or sleep on a condition variable (idle workers), so a
 * descheduled thread gets the CPU back instead of competing with spinners. */
#include "base/threadpool.h"

#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define ST_STATIC ((uint64_t)1 << 32)
#define ST_GEN_SHIFT 33
#define ST_MAX_CHUNKS 0xffff
/* pause iterations before an idle worker sleeps / a waiting caller yields */
#define SPIN_IDLE 20000
#define SPIN_WAIT 2000

struct pt_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t state; /* the job word (see the header comment) */
    atomic_int sleepers;    /* workers waiting on cv */
    atomic_int stop;
    atomic_long done; /* static job: workers finished; range job: chunks finished */
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

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
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
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

/* Blocks a worker until the job word differs from s (or stop). */
static void wait_change(pt_pool *p, uint64_t s) {
    for (int spins = 0; spins < SPIN_IDLE; spins++) {
        if (atomic_load_explicit(&p->state, memory_order_acquire) != s || atomic_load(&p->stop)) return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the publisher's store then load */
    while (atomic_load(&p->state) == s && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    pt_pool *p = wa->pool;
    int ith = wa->ith;
    free(wa);
    uint64_t last_static = 0; /* generation of the last static job this worker ran */
    for (;;) {
        uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        if (atomic_load(&p->stop)) return NULL;
        if (s & ST_STATIC) {
            uint64_t gen = s >> ST_GEN_SHIFT;
            if (gen != last_static) { /* the caller waits for every worker: fields are stable */
                last_static = gen;
                p->sfn(p->ctx, ith, p->n);
                atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
                continue;
            }
        } else if (((s >> 16) & 0xffff) < (s & 0xffff)) {
            run_chunks(p, s, ith);
            continue;
        }
        wait_change(p, s);
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
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
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
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
    *pool = NULL;
}

int pt_pool_size(const pt_pool *pool) { return pool ? pool->n : 1; }

/* Publishes a job word (the job's fields are already written) and wakes any
 * sleeping worker. Store-then-load, both seq_cst, against the worker's
 * increment-then-load of `sleepers`: either we see the sleeper or it sees
 * the new word, and the broadcast under the mutex cannot be lost. */
static void publish(pt_pool *p, uint64_t word) {
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store(&p->state, word);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static uint64_t next_gen(const pt_pool *p) {
    return ((atomic_load_explicit(&p->state, memory_order_relaxed) >> ST_GEN_SHIFT) + 1) << ST_GEN_SHIFT;
}

/* The caller's wait: spin, then yield so a descheduled worker can finish. */
static void wait_done(pt_pool *p, long target) {
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < target) {
        if (++spins < SPIN_WAIT) cpu_relax();
        else sched_yield();
    }
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
    wait_done(pool, pool->n - 1);
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
    wait_done(pool, nch);
}

void pt_pool_barrier(pt_pool *pool) {
    if (!pool || pool->n == 1) return;
    unsigned sense = atomic_load_explicit(&pool->bar_sense, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) == pool->n - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&pool->bar_sense, sense + 1, memory_order_release);
    } else {
        int spins = 0;
        while (atomic_load_explicit(&pool->bar_sense, memory_order_acquire) == sense) {
            if (++spins < SPIN_WAIT) cpu_relax();
            else sched_yield();
        }
    }
}
