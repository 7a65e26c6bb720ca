/* struct pt_session (behind include/petrel.h): the tokens in the context,
 * the forward state (KV cache + activation buffers), the last logits and the
 * sampler. Internal to the runtime; applications use petrel.h. */
#ifndef PT_RUNTIME_SESSION_H
#define PT_RUNTIME_SESSION_H

#include "petrel.h"

#include "backend/cuda/sample.h"
#include "model/model.h"
#include "runtime/sampler.h"

struct pt_session {
    pt_model *m;
    int n_ctx;
    int32_t *tokens;   /* [n_ctx] the context */
    size_t n_tokens;
    pt_fwd_state fwd;
    float *logits;     /* [V] host copy of the last position's logits */
    int has_logits;
    pt_sampler sampler;
    /* GPU sampling (--gpu-sampling, backend/cuda/sample.h): on a CUDA model
     * the last position's logits stay in backend memory (fwd.logits row 0)
     * and pt_session_sample picks the token there; s->logits is filled only
     * when something asks for the host copy (pt_session_logits, a mask, top-n
     * logprobs, a row the GPU hands back). */
    int gpu;             /* 1: this session can sample on the GPU (buffers below allocated) */
    int logits_dev;      /* 1: s->logits is stale, the current logits are in fwd.logits row 0 */
    int32_t *hist_dev;   /* backend [n_ctx]: a copy of tokens (the penalties' window) */
    size_t hist_dev_n;   /* hist_dev holds tokens[0, hist_dev_n); the rest is uploaded when a
                          * penalised sample needs it (a decode step uploads nothing) */
    float *work_dev;     /* backend [V]: penalised logits */
    uint32_t *counts_dev;/* backend [V]: zero between samples */
    void *ctl_dev;       /* backend: the sampler's row table and result */
    pt_gsample_row last_row; /* what ctl_dev holds (valid when last_row_ok) */
    int last_row_ok;
    /* The pipelined decode (pt_session_sample_ahead): */
    pt_gsample_pipe *pipe; /* pinned memory and event of the sample in flight; NULL until first used */
    int ahead;             /* 1: the step on ahead_id at position n_tokens is enqueued, not yet taken */
    int32_t ahead_id;
    uint64_t ahead_taken;  /* steps ahead that a prompt took (tests, diagnostics) */
    uint64_t step_sampled; /* samples a step's own graph made (greedy rows; tests, diagnostics) */
    /* The server's pipelined turn (pt_session_rows_ahead, runtime/batch.h): */
    int rows_ahead;        /* rows run ahead: tokens[n_tokens, n_tokens + rows_ahead) at their positions,
                            * not yet part of the context */
    int ahead_row;         /* the batch step's logits row of the last of them */
    uint64_t ahead_gen;    /* the batch step they ran in (valid while no later batch step has run) */
    uint64_t rows_taken;   /* rows ahead that a later step took (tests, diagnostics) */
};

/* The GPU sampler's row for session s under sp (validated), with the draw
 * taken from the session's stream (*u; -1 when greedy). 0: s cannot sample
 * this on the GPU (logits on the host, top-n logprobs). */
int pt_session_gpu_row(pt_session *s, const pt_sampling_params *sp, pt_gsample_row *row, double *u);
/* A GPU result into out, or the host sampler with the same draw u for a row
 * the GPU handed back (o->status 1: reads the session's current logits). */
pt_status pt_session_gpu_result(pt_session *s, const pt_sampling_params *sp, const pt_gsample_out *o, double u,
                                pt_token_info *out);

/* pt_session_sample without a mask, pipelined (CUDA): when the session
 * samples on the GPU with a compiled decode step (pt_fwd_ahead_ok) and
 * PETREL_CUDA_PIPELINE is not 0, the sampler writes the chosen id into the
 * device buffer the next step reads, and that step (position n_tokens) is
 * enqueued before the host waits for the id: the host hands out token n
 * while the GPU runs step n + 1. A following pt_session_prompt of exactly
 * that one id takes the step as it is (no new launch); any other call on the
 * session drops it (nothing to undo: its cache row lies past the context and
 * the current logits were not touched). The result is bit-identical to
 * pt_session_sample(s, sp, NULL, out) and so is the session after the
 * prompt; otherwise (no GPU row, PETREL_CUDA_PIPELINE=0, a row the GPU hands
 * back) it is that call. */
pt_status pt_session_sample_ahead(pt_session *s, const pt_sampling_params *sp, pt_token_info *out);

/* 1 unless the environment sets PETREL_CUDA_PIPELINE=0 (read per call). */
int pt_pipeline_on(void);
/* 1 when the environment sets PETREL_CUDA_STEP_SAMPLE=1 (read per call):
 * the pipelined decode's step ahead of a greedy row without penalties or a
 * log-probability samples its own logits inside its graph
 * (model.h pt_fwd_ahead_enqueue). Off by default: measured no faster in
 * tg128 (bench/RESULTS.md, 2026-12-04 third session). */
int pt_step_sample_on(void);

/* The server's turn: samples, in one GPU launch over the rows, every row i <
 * n whose session holds its logits on the device and whose request the GPU
 * takes (valid parameters, sps[i]->n_logprobs == 0; masks are never passed
 * here). Row i's result is what pt_session_sample(ss[i], sps[i], NULL,
 * &outs[i]) gives — the same draws from each session's stream, the host
 * with that draw for a row the GPU hands back — with sts[i] its status and
 * errs[i] the message when not PT_OK. done[i] = 0: the row was not taken
 * (the caller samples it with pt_session_sample); with fewer than two such
 * rows none is taken. At most 64 rows go to the GPU per call. */
void pt_session_sample_gpu_rows(pt_session *const *ss, const pt_sampling_params *const *sps, pt_token_info *outs,
                                pt_status *sts, char (*errs)[512], uint8_t *done, int n);

/* Notes that n tokens of s->tokens change from position at on (already
 * there or about to be): the device copy used by GPU sampling's penalties
 * is brought up to date when a penalised sample needs it, not here. */
void pt_session_hist_changed(pt_session *s, size_t at, size_t n);

/* Checks ids against the vocabulary and the context (PT_ERR_RANGE naming the
 * offending id / the lengths). */
pt_status pt_session_check_ids(const pt_session *s, const int32_t *ids, size_t n);

#endif
