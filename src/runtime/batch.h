/* Continuous batching, internal side (docs/batching.md): the batched decode
 * step behind petrel.h's pt_session_decode_batch.
 *
 * One step appends one token to each of B sessions of one model and runs the
 * B rows through the network together: embedding, norms, projections,
 * activations and the lm_head over [B, ...] (matmuls through the backend's
 * batch-invariant matmul_rows), RoPE at each row's own position, and KV
 * append + attention per session over its own cache. Every row's arithmetic
 * is the arithmetic of a single-token pt_fwd_run, so results are
 * bit-identical to decoding each session alone (tests/test_batch.c).
 *
 * What this is not: no scheduling (the server's scheduler decides which
 * sessions step together), no prefill (a joining request's prompt goes
 * through pt_session_prompt, chunked by the caller), no sampling.
 *
 * The step's activation buffers belong to the model (m->batch), sized for the
 * largest B seen so far and reused; a step allocates nothing once warm. */
#ifndef PT_RUNTIME_BATCH_H
#define PT_RUNTIME_BATCH_H

#include "model/model.h"

/* Runs one batched decode step: row b is token ids[b] of the forward state
 * sts[b] at position pos[b] (its cache holds positions < pos[b]); writes row
 * b's logits to outs[b] (host memory [V]), or, where outs[b] is NULL, into
 * sts[b]->logits (backend memory: GPU sampling reads them there). Ids must already be checked
 * against the vocabulary and positions against each state's context; the
 * states must be distinct. Callers hold m->lock. */
pt_status pt_batch_forward(pt_model *m, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos, int B,
                           float *const *outs);

/* Tests: with on != 0, table-mode steps (runtime/batch.c) pad their rows to
 * the graph buckets (1, 2, 4, ...) even where no CUDA graph is used, so the
 * padding path runs on every backend. Takes m->lock's place: call it before
 * any concurrent use. */
pt_status pt_batch_set_padding(pt_model *m, int on);

/* Steps run so far (tests, benchmarks): counts[0] from a CUDA graph,
 * counts[1] in table mode eagerly, counts[2] in row mode (a step larger than
 * the buffers counts once per part). */
void pt_batch_counts(const pt_model *m, int64_t counts[3]);

/* GPU sampling of a server turn (pt_session_sample_gpu_rows): a backend
 * buffer for B rows' sampling table, kept in the batch state (NULL when the
 * model has run no batched step yet, or out of memory). Callers hold m->lock. */
void *pt_batch_sample_ctl(pt_model *m, int B);

/* Frees the model's batch state (installed as m->batch_free). */
void pt_batch_free(pt_model *m);

#endif
