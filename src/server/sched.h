/* The serving scheduler (DESIGN.md "Serving"): one inference thread owns the
 * model's sessions and runs every generation; HTTP threads hand it jobs
 * through a bounded queue and read each job's output as it grows.
 *
 * - Up to n_parallel jobs run at once, interleaved one unit at a time: a
 *   prompt chunk or one generated token per job per turn. The generated
 *   tokens of a turn run through the model together, in one batched decode
 *   step (continuous batching, docs/batching.md); jobs join and leave
 *   between turns.
 * - Beyond max_queue waiting jobs, submission is refused (the HTTP side
 *   answers 429).
 * - A job cancelled by its client (disconnect) stops at the next unit and
 *   frees its slot.
 * - A prompt's schedule (prefill blocks at fixed positions, its tail as
 *   rows or one chunk) depends on the prompt alone, so a reply does not
 *   depend on the other jobs (docs/batching.md "Long prompts").
 * - Prompt cache: finished sessions stay idle with their tokens; a new job
 *   takes the idle session sharing the longest reusable token prefix with
 *   its prompt (with prompt rows: only what a cold start computes the same
 *   way) and re-runs only the rest. Up to n_parallel sessions are always kept;
 *   more idle sessions are kept while their memory stays under
 *   cache_bytes (least recently used evicted first).
 *
 * Not here: HTTP, JSON, templates, tokenization (the HTTP threads do those).
 */
#ifndef PT_SERVER_SCHED_H
#define PT_SERVER_SCHED_H

#include "server/engine.h"
#include "server/json_schema.h"
#include "server/sbuf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef enum pt_srv_finish {
    PT_SRV_RUNNING = 0,
    PT_SRV_EOS,         /* the model ended its turn */
    PT_SRV_STOP_STRING, /* a stop string matched (job->stop_index) */
    PT_SRV_LENGTH,      /* max_tokens or the context filled */
    PT_SRV_CANCELLED,   /* the client went away */
    PT_SRV_ERROR,       /* job->error says why */
} pt_srv_finish;

typedef struct pt_srv_job {
    /* Inputs: set before submission, read-only afterwards. */
    int32_t *prompt; /* [n_prompt], owned */
    size_t n_prompt;
    pt_sampling_params sp;
    int max_tokens;
    char **stop; /* [n_stop], owned */
    int n_stop;
    pt_jschema *schema; /* owned; NULL = unconstrained */
    int want_logprobs;  /* record each token's pt_token_info */

    /* Outputs, guarded by mu; cv is signalled whenever they grow. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pt_sbuf text;          /* released text so far (stop strings held back) */
    pt_token_info *toks;   /* [n_toks] when want_logprobs */
    size_t n_toks, cap_toks;
    size_t n_generated;    /* tokens generated (eos excluded) */
    size_t n_cached;       /* prompt tokens reused from the prompt cache */
    pt_srv_finish finish;  /* PT_SRV_RUNNING until done */
    int stop_index;
    char error[512];
    double t_submit, t_first_token, t_done; /* seconds (monotonic) */

    atomic_int cancelled;
    atomic_int refs;
} pt_srv_job;

typedef struct pt_srv_sched pt_srv_sched;

/* Decode steps by batch size: bucket b counts steps of size <= 2^b (and
 * > 2^(b-1)); the last one everything larger than 2^(BUCKETS-1). */
#define PT_SRV_BATCH_BUCKETS 7

typedef struct pt_srv_sched_stats {
    int n_active, n_queued, n_idle_sessions;
    size_t idle_bytes;
    uint64_t cache_hits, cache_tokens_reused, prompt_tokens, generated_tokens;
    uint64_t batch_hist[PT_SRV_BATCH_BUCKETS + 1], batch_steps, batch_rows;
    uint64_t prompt_row_steps, prompt_rows; /* steps that carried prompt rows, and those rows (prompt tokens) */
    uint64_t piped_turns; /* turns whose step ran ahead of handing out their tokens (pipelined turns) */
    /* the inference thread's turns that had slots to run, and the seconds
     * of those turns by phase (PT_SRV_PHASE_*) */
    uint64_t turns;
    double phase_s[3];
} pt_srv_sched_stats;

/* Phases of a scheduler turn (pt_srv_sched_stats.phase_s): sampling (the
 * slots' masks and the sampling itself; on a GPU it also waits for the
 * step before it), tokens (each slot takes its token: detokenize, stop
 * checks, the stream write), step (the batched forward step is built and
 * run; on a GPU the launch, which returns before the step ends). */
enum { PT_SRV_PHASE_SAMPLE, PT_SRV_PHASE_TOKENS, PT_SRV_PHASE_STEP };

/* A new job (refs = 1, owned by the caller). */
pt_srv_job *pt_srv_job_new(void);
/* Drops a reference; the last one frees the job. NULL-safe. */
void pt_srv_job_release(pt_srv_job *job);
/* Asks the scheduler to stop the job at its next unit. */
void pt_srv_job_cancel(pt_srv_job *job);

/* n_ctx: context per session (0 = the engine's default). Creates one session
 * up front (so a broken model fails here, and the context is known). */
pt_status pt_srv_sched_create(pt_srv_engine *e, int n_parallel, int max_queue, size_t cache_bytes,
                              int n_ctx, pt_srv_sched **out);
/* Stops the inference thread; queued and running jobs finish with an error. */
void pt_srv_sched_free(pt_srv_sched **s);
int pt_srv_sched_n_ctx(const pt_srv_sched *s);
/* Queues a job (the scheduler takes its own reference). Returns 0, or -1 when
 * the queue is full (the job is untouched). */
int pt_srv_sched_submit(pt_srv_sched *s, pt_srv_job *job);
void pt_srv_sched_get_stats(pt_srv_sched *s, pt_srv_sched_stats *st);

double pt_srv_now(void);

#endif
