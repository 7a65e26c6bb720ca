/* The machine's memory read bandwidth, measured the way a decode step reads
 * weights: every thread of a pool streams its contiguous share of one large
 * buffer (>= 2 GiB, far beyond the last-level cache) once per pass. The best
 * of several passes is reported. Used by `petrel bench` for bw_fraction.
 * Not a benchmark of anything petrel computes. */
#ifndef PT_RUNTIME_BANDWIDTH_H
#define PT_RUNTIME_BANDWIDTH_H

#include "petrel.h"

#include <stddef.h>

/* n_threads >= 1; bytes >= 64 MiB (rounded down to 4 KiB). *gbps in 1e9 bytes/s. */
pt_status pt_measure_read_bandwidth(int n_threads, size_t bytes, int passes, double *gbps);

/* The same meter held open (`petrel bench --bw-interleave`): the buffer,
 * touched once, and the pool stay allocated, so single passes can be taken
 * between other work and show the bandwidth of that moment (on a shared
 * host it moves from minute to minute). open: same parameters as above
 * (*out NULL on an error); pass: one timed pass, *gbps; free: NULL-safe. */
typedef struct pt_bw_meter pt_bw_meter;
pt_status pt_bw_meter_open(pt_bw_meter **out, int n_threads, size_t bytes);
pt_status pt_bw_meter_pass(pt_bw_meter *m, double *gbps);
/* The best of `passes` (>= 1) passes: what pt_measure_read_bandwidth reports. */
pt_status pt_bw_meter_best(pt_bw_meter *m, int passes, double *gbps);
void pt_bw_meter_free(pt_bw_meter **m);

/* The streaming kernels: sum of 64-bit words over [p, p + n_words). The
 * AVX2 one is used when the CPU has AVX2. */
uint64_t pt_bw_sum_scalar(const uint64_t *p, size_t n_words);
uint64_t pt_bw_sum_avx2(const uint64_t *p, size_t n_words);

#endif
