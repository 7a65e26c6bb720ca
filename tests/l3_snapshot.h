/* The frozen L1 snapshot of the L3 gate (tests/test_l3_gate.c on the CPU,
 * tests/cuda/test_cuda_l3.c on the GPU): per fixture, one prompt, the L1
 * greedy trajectory and its logits, in tests/fixtures/l3_snapshot/<fixture>.bin:
 *   "PTL3SNP1", i32 n_prompt, i32 n_steps, i32 vocab,
 *   i32 ids[n_prompt], i32 greedy[n_steps], f32 logits[n_steps][vocab]
 * (little-endian). Also the delta of a lever's rows against reference rows
 * (mean/max KL per step, top-1 agreement).
 *
 * What it is: test support linked into every test binary. What it is not:
 * the gate itself (bounds and configurations live in the tests). */
#ifndef PT_TESTS_L3_SNAPSHOT_H
#define PT_TESTS_L3_SNAPSHOT_H

#include <stdint.h>

typedef struct {
    int n_prompt, n_steps, vocab;
    int32_t *ids, *greedy;
    float *logits; /* [n_steps, vocab] */
} l3_snap;

/* Reads the fixture's snapshot (header and size validated). Returns 1, or 0
 * after printing why (s is then empty). */
int l3_snap_read(const char *fixture, l3_snap *s);
/* Writes it (regeneration, PETREL_L3_SNAPSHOT_WRITE=1). Returns 1 on success. */
int l3_snap_write(const char *fixture, const l3_snap *s);
void l3_snap_free(l3_snap *s);

/* KL(ref || rows) per step (parity_kl_row) averaged over the s->n_steps rows
 * of s->vocab logits, its maximum (max_kl may be NULL), and the fraction of
 * steps whose argmax (top) equals ref_top. */
void l3_delta(const l3_snap *s, const float *ref, const int32_t *ref_top, const float *rows, const int32_t *top,
              double *mean_kl, double *max_kl, double *agree);

#endif
