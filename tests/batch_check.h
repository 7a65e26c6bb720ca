/* Batch-invariance harness shared by tests/test_batch.c (CPU) and
 * tests/cuda/test_cuda_batch.c (GPU): decode each of n sessions alone to get
 * a reference (logits after the prompt and after each greedy step, and the
 * greedy tokens), then replay a batched schedule through
 * pt_session_decode_batch and count every logits row and token that is not
 * bit-identical to the reference.
 *
 * What it is: test support linked into every test binary. What it is not: a
 * benchmark, or anything the library uses. */
#ifndef PT_TESTS_BATCH_CHECK_H
#define PT_TESTS_BATCH_CHECK_H

#include "petrel.h"

#include <stdint.h>

enum { BATCH_CHECK_MAX_PROMPT = 64 };

typedef struct {
    int V;                      /* vocabulary size */
    int n;                      /* sessions */
    int steps;                  /* greedy steps per session */
    int (*prompt_len)(int i);   /* prompt length of session i (<= BATCH_CHECK_MAX_PROMPT) */
    int tokenwise;              /* the prompts were run one token at a time (batch_ref_make_tokenwise) */
    float *logits;              /* [n][steps + 1][V]: step 0 = after the prompt */
    int32_t *tok;               /* [n][steps]: the greedy tokens */
} batch_ref;

/* Prompt token j of session i (deterministic, < V). */
int32_t batch_prompt_id(int i, int j, int V);

/* Decodes every session alone on m. Returns 1, or 0 on failure (pt_last_error
 * says why); batch_ref_free releases it either way. */
int batch_ref_make(pt_model *m, batch_ref *r, int n, int steps, int (*prompt_len)(int i));
void batch_ref_free(batch_ref *r);
/* The same with every prompt run one token at a time (pt_session_prompt of
 * one token per call): the reference of pt_session_decode_rows, whose rows
 * are each computed as a single token is. */
int batch_ref_make_tokenwise(pt_model *m, batch_ref *r, int n, int steps, int (*prompt_len)(int i));

/* One batched run of the first n sessions: session i joins at step join[i]
 * (prefilled then, while the others are mid-decode) and decodes until it has
 * done last[i] steps (< r->steps: it left early, e.g. cancelled). Returns the
 * number of mismatches against the reference (1000 when a call failed);
 * *max_b the largest batch run. */
int batch_run(pt_model *m, const batch_ref *r, int n, const int *join, const int *last, int *max_b);

/* The server's way (runtime/batch.h pt_session_decode_rows): session i joins
 * at step join[i] and its prompt runs as rows of the steps, piece[i] tokens
 * per step, beside the other sessions' prompt and decode rows; once its
 * prompt is in it decodes greedily until it has done last[i] steps. Every
 * step is one pt_session_decode_rows call over all sessions that have work.
 * r must come from batch_ref_make_tokenwise. Returns the mismatches (1000
 * when a call failed); *max_rows the most rows of one step. */
int batch_run_rows(pt_model *m, const batch_ref *r, int n, const int *join, const int *last, const int *piece,
                   int *max_rows);

#endif
