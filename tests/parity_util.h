/* Helpers shared by the parity tests (test_parity*.c, test_kv_gemma4.c,
 * test_l3_gate.c, test_cpu_parity_quant.c): logits of a whole prompt from a
 * fresh session, the KL divergence of two logits rows, a greedy
 * continuation with its top-1/top-2 margins, and one bf16 ulp.
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

/* Greedy continuation of steps tokens into out[steps] (ids[0..n) prefilled,
 * then one token per decode step) in a fresh session of min(n + steps + 1,
 * the model's maximum) tokens; margin[2i] = our top-1 minus top-2 logit at
 * step i, margin[2i + 1] = our top-1. Returns 1, or 0 (after printing the
 * engine's error once the session exists). */
int parity_greedy(pt_model *m, const int32_t *ids, int n, int steps, int32_t *out, float *margin);

/* One bf16 ulp at the magnitude of x. */
float parity_ulp_bf16(float x);

#endif
