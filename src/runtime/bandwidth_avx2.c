/* AVX2 streaming read for the bandwidth meter (bandwidth.h): four
 * independent 256-bit accumulators so loads stay in flight. */
#include "runtime/bandwidth.h"

#include <immintrin.h>
#include <stdint.h>

uint64_t pt_bw_sum_avx2(const uint64_t *p, size_t n_words) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n_words; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, s);
    uint64_t r = out[0] + out[1] + out[2] + out[3];
    for (; i < n_words; i++) r += p[i];
    return r;
}
