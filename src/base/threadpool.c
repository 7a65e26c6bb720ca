/* Persistent thread pool with a sense-reversing barrier (see threadpool.h). */
#include "base/threadpool.h"

#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct pt_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* job dispatch */
    pt_pool_fn fn;
    void *ctx;
    atomic_uint generation; /* bumped per job */
    atomic_int pending;     /* workers still running the current job */
    atomic_int stop;
    /* barrier */
    atomic_int bar_count;
    atomic_uint bar_sense;
};

typedef struct {
    pt_pool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg *wa = p;
    pt_pool *pool = wa->pool;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        /* spin a little, then sleep */
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < 20000) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->ctx, ith, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
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

void pt_pool_run(pt_pool *pool, pt_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n - 1);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    fn(ctx, 0, pool->n);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
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
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            if (++spins > 100000) {
                sched_yield();
                spins = 0;
            }
        }
    }
}
