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
    float *logits;              /* [n][steps + 1][V]: step 0 = after the prompt */
    int32_t *tok;               /* [n][steps]: the greedy tokens */
} batch_ref;

/* Prompt token j of session i (deterministic, < V). */
int32_t batch_prompt_id(int i, int j, int V);

/* Decodes every session alone on m. Returns 1, or 0 on failure (pt_last_error
 * says why); batch_ref_free releases it either way. */
int batch_ref_make(pt_model *m, batch_ref *r, int n, int steps, int (*prompt_len)(int i));
void batch_ref_free(batch_ref *r);

/* One batched run of the first n sessions: session i joins at step join[i]
 * (prefilled then, while the others are mid-decode) and decodes until it has
 * done last[i] steps (< r->steps: it left early, e.g. cancelled). Returns the
 * number of mismatches against the reference (1000 when a call failed);
 * *max_b the largest batch run. */
int batch_run(pt_model *m, const batch_ref *r, int n, const int *join, const int *last, int *max_b);

#endif
