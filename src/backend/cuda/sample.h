/* GPU sampling: the C side's view of src/backend/cuda/sample.cu.
 *
 * One launch samples B rows of logits that stay in device memory, each with
 * its own parameters; the host uploads a small row table and reads back one
 * id (and the chosen token's log-probability) per row instead of the whole
 * [vocab] row. The decisions are those of the CPU sampler
 * (src/runtime/sampler.c) for the same logits, token history and uniform
 * draw: same pipeline order (penalties, greedy, temperature, top-k, top-p,
 * min-p, draw), same orders and tie-breaking, the same f32 exponentials and
 * double-precision sums (src/runtime/sample_math.h). The draw itself comes
 * from the session's host RNG (pt_sampler_uniform), taken before the launch.
 *
 * What the GPU does not do, answered with status 1 (the caller then samples
 * that row on the host with the same draw): top-k above PT_GSAMPLE_CAP
 * candidates, a top-p nucleus that needs more than PT_GSAMPLE_CAP sorted
 * candidates, rows without any finite logit (the host reports the
 * error), and on the multi-block path (sample.cu) a top-k that keeps every
 * finite logit followed by a top-p. Masks (constrained decoding) and top-n log-probabilities are not
 * passed here at all: the runtime keeps those on the host.
 *
 * Every declaration exists in every build; without CUDA the entry point is
 * PT_ERR_UNSUPPORTED. */
#ifndef PT_BACKEND_CUDA_SAMPLE_H
#define PT_BACKEND_CUDA_SAMPLE_H

#include "backend/backend.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sorted candidates the GPU holds (shared memory): top-k up to this many,
 * and nuclei whose candidates above the chosen probability bin fit. */
#define PT_GSAMPLE_CAP 4096

typedef struct pt_gsample_row {
    const float *logits;   /* device [V]: the raw logits (never modified) */
    float *work;           /* device [V] scratch for the penalised logits; used when window > 0 */
    uint32_t *counts;      /* device [V], all zero (and left zero); used when window > 0 */
    const int32_t *hist;   /* device: the context's ids; the window is hist[n_hist - window, n_hist) */
    int64_t n_hist;
    int64_t window;        /* 0: no penalties */
    double u;              /* the uniform draw in [0, 1) (ignored when greedy) */
    float temperature, top_p, min_p;
    float rep, presence, frequency;
    int32_t top_k;
    int32_t greedy;        /* temperature 0 or top_k 1 */
    int32_t want_logprob;  /* 1: out.logprob = log-softmax of the raw logits at the chosen id */
    int32_t pad;
    int32_t *id_slot;      /* NULL, or device int32 that receives the id (status 0 only) */
} pt_gsample_row;

typedef struct pt_gsample_out {
    int32_t id;
    int32_t status;        /* 0: id chosen; 1: sample this row on the host */
    float logprob;
    int32_t pad;
} pt_gsample_out;

/* Device bytes of the control block for B rows (row table, results, the
 * multi-block path's per-row scratch of ~24 KB). */
size_t pt_gsample_ctl_bytes(int B);

/* Samples rows[0..B) of vocabulary V in one launch on the CUDA backend be:
 * uploads the row table to ctl_dev (pt_gsample_ctl_bytes(B) device bytes)
 * unless rows_current says ctl_dev already holds exactly these rows (a
 * greedy decode loop repeats one row), launches, and downloads the B
 * results into out (synchronizes once: the backend's error words come back
 * in the same download). */
pt_status pt_cuda_sample_rows(pt_backend *be, const pt_gsample_row *rows, int B, int64_t V, void *ctl_dev,
                              int rows_current, pt_gsample_out *out);

/* ---- The pipelined decode's one-row sample (runtime/session.c) ----------
 * pt_cuda_sample_rows waits for its result. The pipelined decode instead
 * enqueues the sample, then the next decode step (which reads the id the
 * sampler writes into row->id_slot), and only then waits for the sample's
 * result: the host reads token n while the GPU runs step n + 1. A pipe holds
 * the pinned host memory and the event of one sample in flight. */
typedef struct pt_gsample_pipe pt_gsample_pipe;
pt_status pt_gsample_pipe_create(pt_backend *be, pt_gsample_pipe **out);
void pt_gsample_pipe_free(pt_backend *be, pt_gsample_pipe **p);

/* Enqueues, without waiting: *pos_dev = pos (when pos_dev is not NULL: the
 * next step's position), the row table unless row_current (ctl_dev already
 * holds exactly *row), the same launches as pt_cuda_sample_rows for this one
 * row, and the copy of its result back to pinned memory. The two small
 * copies run on the pipe's own stream, ordered by events, so that work
 * enqueued next on the backend's stream waits only for the sampler and the
 * position (PETREL_CUDA_PIPE_SIDE=0: both on the backend's stream, the A/B).
 * Nothing may be enqueued on p again before pt_cuda_sample_wait. */
pt_status pt_cuda_sample_enqueue(pt_backend *be, pt_gsample_pipe *p, const pt_gsample_row *row, int64_t V,
                                 void *ctl_dev, int row_current, int32_t *pos_dev, int32_t pos);

/* The sample inside the decode step (model/forward.c, the pipelined decode's
 * step ahead of a greedy row without penalties or a log-probability). Its
 * control block (pt_gsample_step_bytes device bytes) is a one-row
 * pt_gsample_ctl_bytes(1) block (the row: its logits, its id_slot, greedy,
 * window 0, want_logprob 0) followed by two result slots: */
typedef struct pt_gsample_step_out {
    pt_gsample_out out;
    int err[2];            /* the backend's error words when the step ended */
    int32_t pad[2];
} pt_gsample_step_out;
size_t pt_gsample_step_bytes(void);

/* Enqueues on the backend's stream (where a graph being captured takes them
 * in) the row's sample by the kernels pt_cuda_sample_enqueue runs for it,
 * pass 1 then the greedy id, so the same id: the id into row->id_slot, the
 * result (status 0, logprob 0) and the error words into slot pos & 1 for
 * the step at position pos = *pos_next (device), and *pos_next advanced by
 * one for the step after it. */
pt_status pt_cuda_sample_greedy_launch(pt_backend *be, void *ctl_dev, int64_t V, int32_t *pos_next);

/* pt_cuda_sample_enqueue for a step whose graph has already sampled its row
 * (pt_cuda_sample_greedy_launch into ctl_dev, the next position advanced
 * there too) at position pos: only slot pos & 1's copy back, on the pipe's
 * stream as there; pt_cuda_sample_wait waits for it. */
pt_status pt_cuda_sample_sampled_enqueue(pt_backend *be, pt_gsample_pipe *p, void *ctl_dev, int32_t pos);

/* Waits for the enqueued sample's result (not for the work enqueued after
 * it) into *out; an error word set by the forward pass is reported as
 * pt_cuda_sample_rows reports it. */
pt_status pt_cuda_sample_wait(pt_backend *be, pt_gsample_pipe *p, pt_gsample_out *out);

/* ---- The server's pipelined turn (runtime/batch.c pt_session_rows_ahead) --
 * The batched sample the same way: enqueues the row table (from pinned
 * memory), the launches of pt_cuda_sample_rows for rows[0..B) (B <= 64;
 * each row's id_slot, where set, receives its id: the next step's id table)
 * and the copy of the B results back, all on the backend's stream; the
 * caller enqueues the next step, then waits for the results only. One such
 * sample (or one pt_cuda_sample_enqueue) in flight per pipe. */
pt_status pt_cuda_sample_rows_enqueue(pt_backend *be, pt_gsample_pipe *p, const pt_gsample_row *rows, int B,
                                      int64_t V, void *ctl_dev);
/* Waits for those B results (out[0..B)); an error word set by the forward
 * pass is reported as pt_cuda_sample_rows reports it. */
pt_status pt_cuda_sample_rows_wait(pt_backend *be, pt_gsample_pipe *p, pt_gsample_out *out);

#ifdef __cplusplus
}
#endif

#endif
