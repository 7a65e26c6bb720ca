/* Helpers shared by the parity tests (test_parity*.c, test_kv_gemma4.c,
 * test_l3_gate.c): logits of a whole prompt from a fresh session, and the
 * KL divergence of two logits rows.
 *
 * What it is: test support linked into every test binary. What it is not:
 * a reference implementation (the references are the golden files). */
#ifndef PT_TESTS_PARITY_UTIL_H
#define PT_TESTS_PARITY_UTIL_H

#include "petrel.h"

#include <stdint.h>

/* Logits of every position of ids[0..n) ([n, V] into out) from a fresh
 * session of min(n + 40, the model's maximum) tokens. Returns 1, or 0 after
 * printing the engine's error. */
int parity_eval(pt_model *m, const int32_t *ids, int n, float *out);

/* KL(softmax(p) || softmax(q)) of one row of V logits, in nats (double
 * accumulation, each row's max subtracted first). */
double parity_kl_row(const float *p, const float *q, int V);

#endif
