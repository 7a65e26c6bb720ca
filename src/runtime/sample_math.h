/* The sampler's arithmetic, defined once for the CPU sampler (sampler.c) and
 * the GPU sampler (src/backend/cuda/sample.cu), so that both take the same
 * decision for the same logits and the same uniform draw: every value that
 * feeds a comparison is computed by the same sequence of correctly rounded
 * IEEE operations on both sides.
 *
 *   - pt_sexp(x): exp(x) for x <= 0 in f32 (Cody-Waite reduction, degree-6
 *     Taylor polynomial, 2^n built in the exponent bits; x below -87, -inf
 *     and NaN clamp to exp(-87)). Relative error < 2e-7. Neither libm's expf
 *     nor CUDA's expf is used: the two differ in the last bit.
 *   - structured sums: a sequence v[0..n) of non-negative terms is cut into
 *     PT_SS_CHUNKS chunks of c = ceil(n / PT_SS_CHUNKS) consecutive terms;
 *     each chunk is summed left to right in double (S[k]); the chunk sums
 *     are scanned in place by the Hillis-Steele pattern (for d = 1, 2, 4,
 *     ..., 512: T[i] = T[i - d] + T[i] for every i >= d, all i at once), so
 *     T[k] is the sum of chunks 0..k and T[PT_SS_CHUNKS - 1] the total. A
 *     cumulative walk (top-p's "cum >= target", the draw's "u < cum") runs
 *     through chunk k from T[k - 1] (0 for k = 0) adding its terms left to
 *     right; the first chunk holding a hit decides, and only a positive term
 *     can hit. This is one thread per chunk and a shared-memory scan on the
 *     GPU, and the same loops on the CPU.
 *
 * Only the decisions and the arithmetic live here; the pipeline (the order
 * of penalties and filters) is sampler.h's. C and CUDA both include this
 * file; in CUDA every f32 operation is an explicit round-to-nearest
 * intrinsic so that nvcc cannot contract a multiply and an add into an fma
 * (the C build uses -std=c11, whose default is -ffp-contract=off). */
#ifndef PT_RUNTIME_SAMPLE_MATH_H
#define PT_RUNTIME_SAMPLE_MATH_H

#include <stdint.h>
#include <string.h>

#define PT_SS_CHUNKS 1024

#ifdef __CUDACC__
#define PT_SM_FN static __device__ __forceinline__
#define PT_SM_MUL(a, b) __fmul_rn((a), (b))
#define PT_SM_ADD(a, b) __fadd_rn((a), (b))
#define PT_SM_SUB(a, b) __fsub_rn((a), (b))
#define PT_SM_AS_FLOAT(i) __int_as_float(i)
#else
#define PT_SM_FN static inline
#define PT_SM_MUL(a, b) ((a) * (b))
#define PT_SM_ADD(a, b) ((a) + (b))
#define PT_SM_SUB(a, b) ((a) - (b))
static inline float pt_sm_as_float(int32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
#define PT_SM_AS_FLOAT(i) pt_sm_as_float(i)
#endif

/* exp(x) for x <= 0 (see the file comment). Bit-identical to sampler.c's
 * 4-lane exp_nonpos4 (the same operations in the same order). */
PT_SM_FN float pt_sexp(float x) {
    if (!(x > -87.0f)) x = -87.0f;
    const float magic = 12582912.0f; /* 1.5*2^23: adding it rounds to an integer */
    float n = PT_SM_SUB(PT_SM_ADD(PT_SM_MUL(x, 1.44269504088896341f), magic), magic);
    float r = PT_SM_SUB(x, PT_SM_MUL(n, 0.693145751953125f)); /* ln2_hi: 12 significant bits */
    r = PT_SM_SUB(r, PT_SM_MUL(n, 1.428606765330187045e-06f)); /* ln2_lo */
    float p = 1.0f / 720.0f;
    p = PT_SM_ADD(PT_SM_MUL(p, r), 1.0f / 120.0f);
    p = PT_SM_ADD(PT_SM_MUL(p, r), 1.0f / 24.0f);
    p = PT_SM_ADD(PT_SM_MUL(p, r), 1.0f / 6.0f);
    p = PT_SM_ADD(PT_SM_MUL(p, r), 0.5f);
    p = PT_SM_ADD(PT_SM_MUL(p, r), 1.0f);
    p = PT_SM_ADD(PT_SM_MUL(p, r), 1.0f);
    int32_t k = (int32_t)n + 127; /* n in [-126, 0] */
    return PT_SM_MUL(p, PT_SM_AS_FLOAT(k << 23));
}

/* The chunk size of a structured sum over n terms (>= 1). */
PT_SM_FN int64_t pt_ss_chunk(int64_t n) {
    int64_t c = (n + PT_SS_CHUNKS - 1) / PT_SS_CHUNKS;
    return c < 1 ? 1 : c;
}

/* The repetition / presence / frequency penalty of one token that occurs
 * `count` > 0 times in the window. */
PT_SM_FN float pt_spenalty(float v, float rep, float presence, float frequency, uint32_t count) {
    if (rep != 1.0f) v = v > 0 ? v / rep : PT_SM_MUL(v, rep);
    return PT_SM_SUB(v, PT_SM_ADD(presence, PT_SM_MUL(frequency, (float)count)));
}

/* Order-preserving 32-bit key of a float that is not NaN (larger value,
 * larger key). -0 and +0 get one key: they compare equal, so the id decides
 * between them, as in the CPU sampler's comparison sort. */
PT_SM_FN uint32_t pt_sorder(float v) {
    if (v == 0.0f) v = 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
PT_SM_FN float pt_sorder_inv(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

#endif
