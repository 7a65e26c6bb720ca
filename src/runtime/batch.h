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
 * A step may also carry prompt tokens (pt_session_decode_rows): several
 * consecutive tokens of one session are rows at consecutive positions,
 * each computed exactly as that token alone would be (pt_session_prompt
 * with one token), so a joining request's prompt runs alongside the others'
 * decode rows without changing anyone's bits.
 *
 * What this is not: no scheduling (the server's scheduler decides which
 * sessions step together and how many prompt rows a step carries), no
 * sampling.
 *
 * The step's activation buffers belong to the model (m->batch), sized for the
 * largest B seen so far and reused; a step allocates nothing once warm. */
#ifndef PT_RUNTIME_BATCH_H
#define PT_RUNTIME_BATCH_H

#include "model/model.h"

/* Runs one batched decode step: row b is token ids[b] of the forward state
 * sts[b] at position pos[b] (its cache holds positions < pos[b]); writes row
 * b's logits to outs[b] (host memory [V]), or, where outs[b] is NULL, into
 * sts[b]->logits (backend memory: GPU sampling reads them there). need:
 * NULL, or [B] with need[b] = 0 for rows whose logits nobody reads (a table
 * step skips their copy; a row step may still write them). Ids must already
 * be checked against the vocabulary and positions against each state's
 * context. A state may own several rows: they must be at consecutive
 * positions in row order, at most the prefill chunk of them (a rotating
 * cache holds window + chunk - 1 positions), and not cross a quantized-KV
 * conversion (only the last may reach --quantized-kv-start); the rows of
 * one state then see each other as token-by-token decoding would (KV
 * append of all rows precedes attention in every layer; row mode runs them
 * in order). Callers hold m->lock. */
pt_status pt_batch_forward(pt_model *m, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos, int B,
                           float *const *outs, const uint8_t *need);

/* Continuous batching with prompt rows (the server's step, docs/batching.md):
 * appends counts[i] >= 1 tokens to sessions[i] for every i < n — ids holds
 * them session by session, counts[0] for session 0 first — and runs all of
 * them as rows of one batched step (steps, where a quantized-KV conversion
 * falls inside a session's rows). Afterwards each session's logits are
 * those of its last token, bit-identical to what appending the tokens one
 * at a time with pt_session_prompt(s, &id, 1) gives: so a prompt fed this
 * way in pieces of any size, alone or beside other sessions' prompt and
 * decode rows, leaves the same cache and logits. With every count 1 this is
 * pt_session_decode_batch. Checks and failure semantics as there (sessions
 * distinct, of one model; a count < 1 is PT_ERR_INVALID_ARG naming the
 * index). */
pt_status pt_session_decode_rows(pt_session *const *sessions, const int32_t *ids, const int *counts, int n);

/* The server's pipelined turn (docs/batching.md "Pipelined turns"): samples
 * the decode sessions dec[0..nd) — row i's result is what
 * pt_session_sample(dec[i], sps[i], NULL, &outs[i]) gives (the same draws),
 * with sts[i] its status and errs[i] the message when not PT_OK — and runs
 * one batched step ahead whose rows are each decode session's sampled
 * token (except where norow[i]: sampled only) and then pcnt[i] prompt
 * tokens of each prs[i] (pids, session by session). On CUDA the sampler
 * writes the ids into the step's table and the step is enqueued before the
 * host waits for the ids, so the host hands out this turn's tokens while
 * the GPU runs the next step. The step commits nothing: each session holds
 * its rows ahead, and a following pt_session_decode_rows (or _batch) whose
 * ids for the session begin with exactly those tokens, with no batch step
 * in between, takes them as they are (no new launch; the logits, where the
 * rows are all of the session's ids, copied from the step's buffer). Any
 * other call that writes the session's positions drops them (nothing to
 * undo: those rows lie past its context). Rows the GPU hands back (sampled
 * on the host) hold nothing ahead: their row ran on a stale id. Taken or
 * not, every session's results equal the unpipelined ones bit for bit.
 * held[0..nd + np) (decode sessions, then prompt sessions): 1 where the
 * session now holds rows ahead.
 * Returns PT_OK when the turn's samples were taken (the step may still have
 * failed: then no session holds rows ahead); any other status means nothing
 * was drawn or run (the caller samples and steps as usual): a step that
 * would not run as one table-mode step of full-precision caches, a session
 * without logits, more than 64 sessions. Callers do not hold m->lock. */
pt_status pt_session_rows_ahead(pt_session *const *dec, const pt_sampling_params *const *sps, const uint8_t *norow,
                                int nd, pt_session *const *prs, const int32_t *pids, const int *pcnt, int np,
                                pt_token_info *outs, pt_status *sts, char (*errs)[512], uint8_t *held);

/* Tests: with on != 0, table-mode steps (runtime/batch.c) pad their rows to
 * the graph buckets (1, 2, 4, ..., 32, then multiples of 32) even where no
 * CUDA graph is used, so the padding path runs on every backend. Takes m->lock's place: call it before
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
