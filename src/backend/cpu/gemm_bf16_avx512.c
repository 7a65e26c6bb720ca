/* Prefill GEMM for MLX 4- and 8-bit weights with bf16 activations on AVX-512
 * BF16 (PETREL_CPU_BGEMM): the L1 formula of the decode kernels,
 *   y[t, n] = Σ_g sc[n,g]·Σ_{j∈g} q[n,j]·x[t,j] + Σ_g bi[n,g]·xs[t,g] (+ bias)
 * with x exactly bf16 and xs its exact-input f32 group sums.
 *
 * Dense bf16 weights take the same GEMM as one group of K values
 * (pt_cpu_bgemm_gs) with scale 1 and bias 0 (xs all zeros):
 * y[t, n] = Σ_j w[n,j]·x[t,j], the
 * panel holding the weights themselves. Products of two bf16 values are
 * exact in f32, as in the f32 GEMM, whose order of the sums differs.
 * vdpbf16ps and TDPBF16PS read subnormal inputs as zero, so the panel holds
 * subnormal weights as (signed) zero in both forms.
 *
 * Why: on cores where vdpbf16ps issues at about the FMA rate (AMD Zen 4 /
 * Zen 5) one instruction does 32 multiply-adds of bf16 pairs, against the
 * integer-piece GEMM's (gemm_i8_avx512.c) three vpdpbusd of 64 per value
 * (21 per instruction): 1.5x fewer multiply instructions for the same exact
 * products. On Intel's AVX-512 BF16 cores vdpbf16ps issues at a quarter of
 * that rate and this GEMM is not the default (cpu_matmul.c bf16_full_rate).
 *
 * Work: output rows in panels of 32, one thread per panel (chunks claimed
 * from the pool). A panel's codes are converted once per call to bf16 (the
 * integers 0..15 or 0..255, exact in bf16) in pairs, [K/2][32 rows][2]: 64
 * bytes hold 16 rows × the 2 values of one k pair, one vdpbf16ps operand; the
 * scales and biases transposed to [ng][32] f32. Tokens go in tiles of MR; per
 * group a tile keeps MR × 32 f32 sums in registers (vdpbf16ps: 16 rows × one
 * token's broadcast x pair per instruction), then folds them:
 * F = fma(sum, sc, F); F = fma(bi, xs, F). Every product q·x is exact in f32
 * (8-bit by 8-bit significands); the f32 sums of a group run in k order for
 * each (token, row), so a row's result does not depend on the tile, the
 * panel or the thread split, nor on the other tokens of the call. The
 * arithmetic differs from the decode kernels' (their order, the bf16
 * decode kernel's 128 offset), so prefill and decode round differently, as
 * every prefill GEMM here does. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <string.h>

#define MR 8 /* tokens per tile: 2·MR f32 accumulators in registers */

size_t pt_cpu_gemm_bf16_scratch(int64_t K, int64_t ng) {
    /* floats per thread: the bf16 panel (32·K bf16), scales + biases (2·32·ng), 16 rows' bf16 (16·K bf16) */
    return (size_t)(16 * K + 64 * ng + 8 * K + 16);
}

/* One row's codes as bf16 in natural order (value j at element j), K a
 * multiple of the group size (32, 64 or 128: cpu_matmul.c's prefill_prep
 * sends no other quantized shape here). 8-bit: the integer q widened to f32
 * (exact) and its high half kept (exact: q < 256 has at most 8 significant
 * bits). 4-bit: byte i holds values 2i (low nibble) and 2i + 1 (high), so
 * the 32-bit word at dst + 2i is bf16(lo) | bf16(hi) << 16, each looked up
 * in a table of the integers 0..15 as bf16 (the same values; 32 values from
 * 16 bytes in six instructions). */
static void row_bf16(uint16_t *dst, const uint8_t *codes, int64_t K, int bits) {
    if (bits == 4) {
        const __m512i tab = _mm512_srli_epi32(
                          _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                 11, 12, 13, 14, 15))),
                          16),
                      m15 = _mm512_set1_epi32(15);
        for (int64_t j = 0; j < K; j += 32) {
            __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + j / 2)));
            __m512i lo = _mm512_permutexvar_epi32(_mm512_and_si512(w, m15), tab);
            __m512i hi = _mm512_permutexvar_epi32(_mm512_srli_epi32(w, 4), tab);
            _mm512_storeu_si512((void *)(dst + j), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        return;
    }
    for (int64_t j = 0; j < K; j += 16) {
        __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + j))));
        _mm256_storeu_si256((__m256i *)(dst + j), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16)));
    }
}

/* A dense bf16 row with its subnormal values as zero of the same sign
 * (what vdpbf16ps and TDPBF16PS make of them). K % 16 == 0. */
static void row_dense16(uint16_t *dst, const void *row, int64_t K) {
    const __m256i ex = _mm256_set1_epi16(0x7f80), sign = _mm256_set1_epi16((short)0x8000);
    for (int64_t j = 0; j < K; j += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j));
        __mmask16 sub = _mm256_cmpeq_epi16_mask(_mm256_and_si256(v, ex), _mm256_setzero_si256());
        _mm256_storeu_si256((__m256i *)(dst + j), _mm256_mask_blend_epi16(sub, v, _mm256_and_si256(v, sign)));
    }
}

int pt_cpu_x_bf16_exact(uint16_t *dst, const float *x, int64_t K) {
    const __m512i lo = _mm512_set1_epi32(0xffff), ex = _mm512_set1_epi32(0x7f800000),
                  mag = _mm512_set1_epi32(0x7fffffff);
    int64_t j = 0;
    for (; j + 16 <= K; j += 16) {
        __m512i b = _mm512_castps_si512(_mm512_loadu_ps(x + j)), e = _mm512_and_si512(b, ex);
        /* refused: low half set (not bf16), exponent all ones (not finite), exponent zero but not zero (subnormal) */
        if (_mm512_test_epi32_mask(b, lo) | _mm512_cmpeq_epi32_mask(e, ex) |
            (_mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()) & _mm512_test_epi32_mask(b, mag)))
            return 0;
        _mm256_storeu_si256((__m256i *)(dst + j), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16)));
    }
    for (; j < K; j++) {
        uint32_t b;
        memcpy(&b, x + j, 4);
        uint32_t e = b & 0x7f800000u;
        if ((b & 0xffffu) || e == 0x7f800000u || (e == 0 && (b & 0x7fffffffu))) return 0;
        dst[j] = (uint16_t)(b >> 16);
    }
    return 1;
}

typedef struct {
    pt_cpu *c;
    float *y;
    const uint16_t *xb; /* [T, K] bf16 */
    const float *xs;    /* [T, ng] */
    int64_t T;
    const pt_matrix *w;
    int64_t expert;
} gbf_ctx;

#define X8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
/* acc += pairs of w · the pair broadcast in b. Inline asm: gcc 12 would copy
 * the accumulator around the intrinsic in this loop (as for vpdpbusd,
 * gemm_i8_avx512.c). A token's pair is broadcast into a register once and
 * read by both of its instructions: with the broadcast in each instruction's
 * memory operand instead (two loads a token) the tile ran at 77-79% of
 * vdpbf16ps's issue rate on the development VM's Zen 5 cores, against 92%
 * this way (bench/RESULTS.md, CPU twelfth round). */
#define DPBF(acc, w, b) __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(w), "v"(b))

/* One tile: MR tokens × 32 rows of a panel, all groups. */
static void tile8bf(float *F, const uint16_t *P, const float *S, const float *B, const uint16_t *xb, const float *xs,
                    const int64_t *tt, int64_t K, int64_t gs) {
    int64_t ng = K / gs;
#define XPTR(t) const uint16_t *x##t = xb + tt[t] * K;
    X8(XPTR)
#undef XPTR
    for (int i = 0; i < MR * 32; i += 16) _mm512_storeu_ps(F + i, _mm512_setzero_ps());
    for (int64_t g = 0; g < ng; g++) {
#define ZERO(t) __m512 a##t = _mm512_setzero_ps(), b##t = _mm512_setzero_ps();
        X8(ZERO)
#undef ZERO
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 2) {
            __m512 w0 = _mm512_castsi512_ps(_mm512_loadu_si512((const void *)(P + k * 32)));
            __m512 w1 = _mm512_castsi512_ps(_mm512_loadu_si512((const void *)(P + k * 32 + 32)));
#define DOT(t)                                                                                                 \
    {                                                                                                          \
        int32_t v_;                                                                                            \
        memcpy(&v_, x##t + k, 4);                                                                              \
        __m512 b_ = _mm512_castsi512_ps(_mm512_set1_epi32(v_));                                                \
        DPBF(a##t, w0, b_);                                                                                    \
        DPBF(b##t, w1, b_);                                                                                    \
    }
            X8(DOT)
#undef DOT
        }
        __m512 s0 = _mm512_loadu_ps(S + g * 32), s1 = _mm512_loadu_ps(S + g * 32 + 16);
        __m512 c0 = _mm512_loadu_ps(B + g * 32), c1 = _mm512_loadu_ps(B + g * 32 + 16);
#define POST(t)                                                                                                \
    {                                                                                                          \
        __m512 e_ = _mm512_set1_ps(xs[tt[t] * ng + g]);                                                        \
        float *f_ = F + t * 32;                                                                                \
        _mm512_storeu_ps(f_, _mm512_fmadd_ps(c0, e_, _mm512_fmadd_ps(a##t, s0, _mm512_loadu_ps(f_))));         \
        _mm512_storeu_ps(f_ + 16, _mm512_fmadd_ps(c1, e_, _mm512_fmadd_ps(b##t, s1, _mm512_loadu_ps(f_ + 16)))); \
    }
        X8(POST)
#undef POST
    }
}

/* Packs the panel of rows [p0, p0 + nr) (nr <= 32; rows past nr zero):
 * the codes as bf16 k pairs P [K/2][32][2], scales and biases S, B [ng][32]
 * f32. rows [16][K] bf16 is work space. */
static void pack_panel(const gbf_ctx *m, int64_t p0, int nr, uint16_t *P, float *S, float *B, uint16_t *rows) {
    const pt_matrix *w = m->w;
    int64_t K = w->cols;
    /* 16 rows at a time as bf16 [16][K], then their pairs (32-bit words) transposed into [K/2][32] by the f32
     * panel transpose */
    for (int r0 = 0; r0 < 32; r0 += 16) {
        for (int r = 0; r < 16; r++) {
            uint16_t *dst = rows + (size_t)r * K;
            if (r0 + r >= nr) {
                memset(dst, 0, (size_t)K * 2);
                if (w->bits) pt_cpu_panel_params(w, m->expert, -1, r0 + r, S, B);
                else S[r0 + r] = 0.f, B[r0 + r] = 0.f;
                continue;
            }
            int64_t n = p0 + r0 + r;
            if (!w->bits) { /* dense bf16: the row itself (subnormals as zero), one group of scale 1, bias 0 */
                row_dense16(dst, pt_cpu_dense_row(w, m->expert, n), K);
                S[r0 + r] = 1.f, B[r0 + r] = 0.f;
                continue;
            }
            row_bf16(dst, pt_cpu_qrow_codes(w, m->expert, n), K, w->bits);
            pt_cpu_panel_params(w, m->expert, n, r0 + r, S, B);
        }
        if ((K / 2) % 16 == 0) m->c->k->panel_t16((float *)P, r0, (const float *)rows, K / 2);
        else pt_cpu_panel_t16_ref((float *)P, r0, (const float *)rows, K / 2);
    }
}

static void store_rows(const gbf_ctx *m, const float *F, int64_t t0, int nt, int64_t p0, int nr, const float *bias) {
    pt_cpu_panel_store16(m->y, F, t0, nt, p0, nr, m->w->rows, bias, m->c->base.act);
}

/* A thread's scratch for one panel: P [K/2][32][2] bf16, S and B [ng][32] f32, rows [16][K] bf16; returns
 * the float just past them (pt_cpu_gemm_bf16_scratch floats in all). */
static float *panel_scratch(const gbf_ctx *m, int ith, uint16_t **P, float **S, float **B, uint16_t **rows) {
    int64_t K = m->w->cols, ng = K / pt_cpu_bgemm_gs(m->w);
    float *scr = pt_cpu_thread_scratch(m->c, ith);
    *P = (uint16_t *)scr;
    *S = scr + 16 * K;
    *B = *S + 32 * ng;
    *rows = (uint16_t *)(*B + 32 * ng);
    return scr + pt_cpu_gemm_bf16_scratch(K, ng);
}

static void gbf_panels(void *arg, long n0, long n1, int ith) {
    gbf_ctx *m = arg;
    const pt_matrix *w = m->w;
    int64_t K = w->cols, T = m->T, gs = pt_cpu_bgemm_gs(w);
    uint16_t *P, *rows;
    float *S, *B;
    panel_scratch(m, ith, &P, &S, &B, &rows);
    for (int64_t p0 = n0; p0 < n1; p0 += 32) {
        int nr = (int)(n1 - p0 < 32 ? n1 - p0 : 32);
        pack_panel(m, p0, nr, P, S, B, rows);
        float bias[32];
        pt_cpu_panel_bias(bias, m->w, m->expert, p0, nr);
        for (int64_t t0 = 0; t0 < T; t0 += MR) {
            int64_t tt[MR];
            for (int t = 0; t < MR; t++) tt[t] = t0 + t < T ? t0 + t : T - 1; /* past the end: repeat the last */
            float F[MR * 32];
            pt_cpu_panel_prefetch(m->y, t0 + MR, T, MR, p0, w->rows);
            tile8bf(F, P, S, B, m->xb, m->xs, tt, K, gs);
            store_rows(m, F, t0, (int)(T - t0 < MR ? T - t0 : MR), p0, nr, bias);
        }
    }
}

void pt_cpu_gemm_bf16(pt_cpu *c, float *y, const uint16_t *xb, const float *xs, int64_t T, const pt_matrix *w,
                      int64_t expert) {
    gbf_ctx m = {.c = c, .y = y, .xb = xb, .xs = xs, .T = T, .w = w, .expert = expert};
    /* chunks of 32-row panels: only the last chunk has a narrow panel */
    pt_pool_for(c->pool, (long)w->rows, 32, gbf_panels, &m);
}

/* ---- the same GEMM on AMX tiles (PETREL_CPU_AMX) ----
 * Intel's AMX (Sapphire Rapids and later): TDPBF16PS multiplies a tile of 16
 * tokens × 32 bf16 values of x (A, rows of 64 bytes) by a tile of 16 k pairs
 * × 16 weight rows (B: the bf16 panel's layout above, rows 128 bytes apart)
 * into 16 × 16 f32 sums (C), 8192 multiply-adds per instruction. A block is
 * 32 tokens × the panel's 32 rows: four C tiles, two A and two B tiles (all
 * eight tile registers). Per group the C tiles start from zero, take the
 * group's k steps of 32 and are stored; every AMX_CHUNK groups the stored
 * sums are folded like tile8bf's, group by group in order, eight tokens at a
 * time with F in registers across the chunk: F = fma(sum, scale, F),
 * F = fma(bias, Σx_g, F). Each sum is one (token,
 * row) dot in k order whatever the other tokens, so a row's bits depend
 * on neither the block, the panel nor the thread split; AMX rounds its
 * accumulation differently from vdpbf16ps, so the two GEMMs differ in the
 * last bits. The tile configuration is loaded per thread by inline
 * `ldtilecfg` (gcc 12's _tile_loadconfig intrinsic miscompiles), after the
 * process asked the kernel for the tile state (arch_prctl
 * ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). */
#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an extended state component */
#define AMX_XTILEDATA 18          /* the tile data state component */

#if defined(PT_AMX_EMULATE)
/* tests/test_cpu_amx_emul.c: the tile operations are C code (cpu_internal.h) */
int pt_cpu_amx_available(void) { return 1; }
int pt_cpu_amx_i8_available(void) { return 1; }
#else
static int amx_state = -1; /* bit 0: AMX-BF16 usable, bit 1: AMX-INT8 usable */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    unsigned a, b, c, d;
    amx_state = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE: xgetbv works */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!(d & (1u << 24))) return;                                      /* AMX-TILE */
    int kinds = (d & (1u << 22) ? 1 : 0) | (d & (1u << 25) ? 2 : 0); /* AMX-BF16, AMX-INT8 */
    if (!kinds) return;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return; /* the OS saves XTILECFG and XTILEDATA */
    if (syscall(SYS_arch_prctl, AMX_REQ_XCOMP_PERM, AMX_XTILEDATA) != 0) return;
    amx_state = kinds;
}

int pt_cpu_amx_available(void) {
    pthread_once(&amx_once, amx_probe);
    return (amx_state & 1) != 0;
}

int pt_cpu_amx_i8_available(void) {
    pthread_once(&amx_once, amx_probe);
    return (amx_state & 2) != 0;
}
#endif

size_t pt_cpu_gemm_amx_scratch(int64_t K, int64_t ng) { return pt_cpu_gemm_bf16_scratch(K, ng) + PT_CPU_AMX_SCRATCH; }

static void amx_panels(void *arg, long n0, long n1, int ith) {
    gbf_ctx *m = arg;
    const pt_matrix *w = m->w;
    uint16_t *P, *rows;
    float *S, *B;
    float *end = panel_scratch(m, ith, &P, &S, &B, &rows);
    pt_cpu_amx_config(64, 16);
    for (int64_t p0 = n0; p0 < n1; p0 += 32) {
        int nr = (int)(n1 - p0 < 32 ? n1 - p0 : 32);
        pack_panel(m, p0, nr, P, S, B, rows);
        float bias[32];
        pt_cpu_panel_bias(bias, w, m->expert, p0, nr);
        pt_cpu_amx_panel(0, m->xb, P, S, B, m->xs, NULL, m->T, w->cols, pt_cpu_bgemm_gs(w), end, m->y, w->rows, p0,
                         nr, bias, m->c->base.act);
    }
    PT_CPU_AMX_RELEASE();
}

void pt_cpu_gemm_amx(pt_cpu *c, float *y, const uint16_t *xb, const float *xs, int64_t T, const pt_matrix *w,
                     int64_t expert) {
    gbf_ctx m = {.c = c, .y = y, .xb = xb, .xs = xs, .T = T, .w = w, .expert = expert};
    pt_pool_for(c->pool, (long)w->rows, 32, amx_panels, &m);
}
