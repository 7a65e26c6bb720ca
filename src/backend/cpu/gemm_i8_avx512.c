/* Prefill GEMM of the int8-activation lever (L3, pt_cpu_params.int8_act) on
 * AVX-512 VNNI, for MLX 4- and 8-bit weights. It computes the lever's
 * formula, the same one the decode kernels (qdot4_x4_i8 / qdot8_x4_i8)
 * compute:
 *   y[t, n] = Σ_g sc[n,g]·xd[t,g]·Σ_{j∈g} q[n,j]·xq[t,j] + Σ_g bi[n,g]·xs[t,g] (+ bias)
 * with x quantized per weight group to int8 (xq, step xd) and xs the exact f32
 * group sums of x; only the f32 summation order differs from decode. Not an
 * L1 path: int8 x changes outputs (held by the L3 gate, tests/test_l3_gate.c).
 *
 * Work: output rows in panels of 32, one thread per panel (chunks claimed from
 * the pool). A panel's codes are unpacked once per call into u8
 * [K/4][32 rows][4 codes] (64 bytes = 16 rows × 4 codes: one vpdpbusd
 * operand; 16 rows unpacked to bytes, then their 4-byte quads moved by the
 * f32 panel transpose), its scales and biases transposed to [ng][32] f32. Tokens go in
 * tiles of MR; per group, a tile keeps MR × 32 int32 sums in registers
 * (vpdpbusd: 16 rows × 4 codes × one token's 4 int8 x per instruction, 64
 * multiply-adds), then converts them once: F += I·(sc·xd) + bi·xs. Integer
 * sums are exact (4-bit: |Σ| <= 15·127·gs; 8-bit: 255·127·gs, far below 2^31),
 * so a row's result does not depend on the tile, panel or thread split. A
 * tile past the last token repeats the last token and drops the copies.
 *
 * The same panels and tiles also serve the L1 prefill of 4-bit weights with
 * bf16 activations (pt_cpu_gemm_xint, PETREL_CPU_XGEMM): x as the three exact
 * integer pieces of qdot_xint_avx512.c instead of int8, three passes of
 * vpdpbusd per group chunk (tile8x3). On this VM it replaces the f32 GEMM,
 * whose FMAs do 16 multiply-adds per instruction against vpdpbusd's 64.
 * 8-bit weights take the same pieces (pt_cpu_gemm_xint, PETREL_CPU_XGEMM8,
 * tile8x3q8): their sums per piece stay exact in int32 and are combined in
 * int64.
 *
 * Where the CPU has AMX-INT8 the lever's GEMM runs on AMX tiles instead
 * (amx8_panels at the end of this file), with the same bits. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <string.h>

#define MR 8 /* tokens per tile: 2·MR int32 accumulators in registers */

int pt_cpu_gemm_i8_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
}

size_t pt_cpu_gemm_i8_scratch(int64_t K, int64_t ng) {
    /* floats per thread: packed codes (32·K bytes), scales + biases (2·32·ng), 16 rows' bytes (16·K) */
    return (size_t)(8 * K + 64 * ng + 4 * K + 16);
}

void pt_cpu_unpack_row_bytes(uint8_t *dst, const uint8_t *codes, int64_t K, int bits) {
    if (bits == 8) {
        memcpy(dst, codes, (size_t)K);
        return;
    }
    /* 4-bit: byte b = lo | hi << 4 -> bytes lo, hi: widened to 16 bits, (w & 0x0f) | ((w << 4) & 0x0f00) */
    const __m512i lo = _mm512_set1_epi16(0x000f), hi = _mm512_set1_epi16(0x0f00);
    int64_t j = 0;
    for (; j + 64 <= K; j += 64) {
        __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(codes + j / 2)));
        __m512i v = _mm512_or_si512(_mm512_and_si512(w, lo), _mm512_and_si512(_mm512_slli_epi16(w, 4), hi));
        _mm512_storeu_si512((void *)(dst + j), v);
    }
    for (; j < K; j += 2) {
        dst[j] = codes[j / 2] & 15;
        dst[j + 1] = codes[j / 2] >> 4;
    }
}

typedef struct {
    pt_cpu *c;
    float *y;
    const int8_t *xq; /* [T, K] */
    const float *xd;  /* [T, ng] */
    const float *xs;  /* [T, ng] */
    const float *xstep; /* integer pieces: [T, ng] steps (xq is then [T, 3K]), else NULL */
    int64_t T;
    const pt_matrix *w;
    int64_t expert;
} gi8_ctx;

/* One tile: MR (= 8) tokens × 32 rows of a packed panel, all groups.
 * F[t·32 + r] = Σ_g (I[t][r]·S[g][r]·xd[t][g] + B[g][r]·xs[t][g]), I = the
 * group's exact integer dot. The eight tokens are spelled out (macros), so
 * the 16 integer sums stay in registers; F lives in L1. */
#define X8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
/* acc += u8 w · s8 b in groups of four. Inline asm: gcc 12 copies the
 * accumulator to another register around every _mm512_dpbusd_epi32 in this
 * loop (two extra moves per instruction, measured 2x slower). */
#define DPBUSD(acc, w, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(b))
static void tile8(float *F, const uint8_t *P, const float *S, const float *B, const int8_t *xq, const float *xd,
                  const float *xs, const int64_t *tt, int64_t K, int64_t gs) {
    int64_t ng = K / gs;
#define XPTR(t) const int8_t *x##t = xq + tt[t] * K;
    X8(XPTR)
#undef XPTR
    for (int i = 0; i < MR * 32; i += 16) _mm512_storeu_ps(F + i, _mm512_setzero_ps());
    for (int64_t g = 0; g < ng; g++) {
#define ZERO(t) __m512i i##t##a = _mm512_setzero_si512(), i##t##b = _mm512_setzero_si512();
        X8(ZERO)
#undef ZERO
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 4) {
            __m512i w0 = _mm512_loadu_si512((const void *)(P + k * 32)), w1 = _mm512_loadu_si512((const void *)(P + k * 32 + 64));
#define DOT(t)                                                                                                 \
    {                                                                                                          \
        int32_t v_;                                                                                            \
        memcpy(&v_, x##t + k, 4);                                                                              \
        __m512i b_ = _mm512_set1_epi32(v_);                                                                    \
        DPBUSD(i##t##a, w0, b_);                                                                               \
        DPBUSD(i##t##b, w1, b_);                                                                               \
    }
            X8(DOT)
#undef DOT
        }
        __m512 s0 = _mm512_loadu_ps(S + g * 32), s1 = _mm512_loadu_ps(S + g * 32 + 16);
        __m512 b0 = _mm512_loadu_ps(B + g * 32), b1 = _mm512_loadu_ps(B + g * 32 + 16);
#define POST(t)                                                                                                \
    {                                                                                                          \
        __m512 d_ = _mm512_set1_ps(xd[tt[t] * ng + g]), e_ = _mm512_set1_ps(xs[tt[t] * ng + g]);               \
        float *f_ = F + t * 32;                                                                                \
        __m512 fa_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##t##a), _mm512_mul_ps(s0, d_), _mm512_loadu_ps(f_));  \
        __m512 fb_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##t##b), _mm512_mul_ps(s1, d_), _mm512_loadu_ps(f_ + 16)); \
        _mm512_storeu_ps(f_, _mm512_fmadd_ps(b0, e_, fa_));                                                    \
        _mm512_storeu_ps(f_ + 16, _mm512_fmadd_ps(b1, e_, fb_));                                               \
    }
        X8(POST)
#undef POST
    }
}

/* tile8 for x as three integer pieces (pt_cpu_arrange_xint_rows: token t's
 * pieces A, B, C at xq + t·3K, K apart): per chunk of a group (64 values at
 * most, so |Σ q·X| <= 64·15·2^21 < 2^31 stays exact in int32; a 128-group
 * is two chunks with the same scale) the sums of the A pieces, shifted left
 * by 7, then the B pieces, shifted by 7, then the C pieces: Σ q·X exactly,
 * converted once and scaled by sc·step; the bias term once per group. The
 * panel's codes are read three times per chunk, from L1. */
static void tile8x3(float *F, const uint8_t *P, const float *S, const float *B, const int8_t *xq, const float *xst,
                    const float *xs, const int64_t *tt, int64_t K, int64_t gs) {
    int64_t ng = K / gs, ch = gs > 64 ? 64 : gs;
#define XPTR(t) const int8_t *x##t = xq + tt[t] * 3 * K;
    X8(XPTR)
#undef XPTR
    for (int i = 0; i < MR * 32; i += 16) _mm512_storeu_ps(F + i, _mm512_setzero_ps());
    for (int64_t g = 0; g < ng; g++) {
        __m512 s0 = _mm512_loadu_ps(S + g * 32), s1 = _mm512_loadu_ps(S + g * 32 + 16);
        for (int64_t h = g * gs; h < (g + 1) * gs; h += ch) {
#define ZERO(t) __m512i i##t##a = _mm512_setzero_si512(), i##t##b = _mm512_setzero_si512();
            X8(ZERO)
#undef ZERO
            for (int64_t pc = 0; pc < 3; pc++) {
                if (pc) {
#define SHL(t) i##t##a = _mm512_slli_epi32(i##t##a, 7), i##t##b = _mm512_slli_epi32(i##t##b, 7);
                    X8(SHL)
#undef SHL
                }
                for (int64_t k = h; k < h + ch; k += 4) {
                    __m512i w0 = _mm512_loadu_si512((const void *)(P + k * 32)),
                            w1 = _mm512_loadu_si512((const void *)(P + k * 32 + 64));
#define DOT(t)                                                                                                 \
    {                                                                                                          \
        int32_t v_;                                                                                            \
        memcpy(&v_, x##t + pc * K + k, 4);                                                                     \
        __m512i b_ = _mm512_set1_epi32(v_);                                                                    \
        DPBUSD(i##t##a, w0, b_);                                                                               \
        DPBUSD(i##t##b, w1, b_);                                                                               \
    }
                    X8(DOT)
#undef DOT
                }
            }
#define POST(t)                                                                                                \
    {                                                                                                          \
        __m512 d_ = _mm512_set1_ps(xst[tt[t] * ng + g]);                                                       \
        float *f_ = F + t * 32;                                                                                \
        _mm512_storeu_ps(f_, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##t##a), _mm512_mul_ps(s0, d_), _mm512_loadu_ps(f_))); \
        _mm512_storeu_ps(f_ + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##t##b), _mm512_mul_ps(s1, d_),              \
                                                  _mm512_loadu_ps(f_ + 16)));                                     \
    }
            X8(POST)
#undef POST
        }
        __m512 b0 = _mm512_loadu_ps(B + g * 32), b1 = _mm512_loadu_ps(B + g * 32 + 16);
#define BIAS(t)                                                                                                \
    {                                                                                                          \
        __m512 e_ = _mm512_set1_ps(xs[tt[t] * ng + g]);                                                        \
        float *f_ = F + t * 32;                                                                                \
        _mm512_storeu_ps(f_, _mm512_fmadd_ps(b0, e_, _mm512_loadu_ps(f_)));                                    \
        _mm512_storeu_ps(f_ + 16, _mm512_fmadd_ps(b1, e_, _mm512_loadu_ps(f_ + 16)));                          \
    }
        X8(BIAS)
#undef BIAS
    }
}

/* f32(J·2^7 + IC) for 16 lanes: the sum formed exactly in int64 (|J·2^7 + IC|
 * < 2^37), then one conversion (round to nearest even). */
static inline __m512 q8_sum(const int32_t *J, __m512i ic) {
    __m512i j = _mm512_loadu_si512((const void *)J);
    __m512i lo = _mm512_add_epi64(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(j)), 7),
                                  _mm512_cvtepi32_epi64(_mm512_castsi512_si256(ic)));
    __m512i hi = _mm512_add_epi64(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(j, 1)), 7),
                                  _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(ic, 1)));
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtepi64_ps(lo)), _mm512_cvtepi64_ps(hi), 1);
}

/* tile8x3 for 8-bit codes (PETREL_CPU_XGEMM8). A chunk's Σ q·X no longer
 * fits int32 (64·255·2^21 > 2^31), so the pieces' sums are kept apart long
 * enough to stay exact: per group, IA = Σ q·A (|IA| <= 128·255·128 < 2^22
 * for groups up to 128), shifted left by 7 and continued with the B pieces
 * into J = IA·2^7 + IB (|J| < 2^30: exact in int32), stashed in L1; then
 * IC = Σ q·C in the same registers; Σ q·X = J·2^7 + IC (< 2^37) is formed
 * exactly in int64 and converted to f32 once (one rounding, as the 4-bit
 * tile's int32 → f32 conversion), scaled by sc·step; the bias term once per
 * group. Per group and tile: 3·gs/4·16 vpdpbusd against 16 stores, 16
 * loads and ~12 widening / shift / add / conversion ops per 16 sums. */
static void tile8x3q8(float *F, const uint8_t *P, const float *S, const float *B, const int8_t *xq, const float *xst,
                      const float *xs, const int64_t *tt, int64_t K, int64_t gs) {
    int64_t ng = K / gs;
    int32_t J[MR * 32]; /* [t][32 rows]: IA·2^7 + IB of the current group */
#define XPTR(t) const int8_t *x##t = xq + tt[t] * 3 * K;
    X8(XPTR)
#undef XPTR
    for (int i = 0; i < MR * 32; i += 16) _mm512_storeu_ps(F + i, _mm512_setzero_ps());
    for (int64_t g = 0; g < ng; g++) {
        __m512 s0 = _mm512_loadu_ps(S + g * 32), s1 = _mm512_loadu_ps(S + g * 32 + 16);
#define ZERO(t) __m512i i##t##a = _mm512_setzero_si512(), i##t##b = _mm512_setzero_si512();
        X8(ZERO)
#undef ZERO
        for (int64_t pc = 0; pc < 3; pc++) {
            if (pc == 1) {
#define SHL(t) i##t##a = _mm512_slli_epi32(i##t##a, 7), i##t##b = _mm512_slli_epi32(i##t##b, 7);
                X8(SHL)
#undef SHL
            } else if (pc == 2) {
#define STASH(t)                                                                                               \
    _mm512_storeu_si512((void *)(J + t * 32), i##t##a), _mm512_storeu_si512((void *)(J + t * 32 + 16), i##t##b); \
    i##t##a = _mm512_setzero_si512(), i##t##b = _mm512_setzero_si512();
                X8(STASH)
#undef STASH
            }
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 4) {
                __m512i w0 = _mm512_loadu_si512((const void *)(P + k * 32)),
                        w1 = _mm512_loadu_si512((const void *)(P + k * 32 + 64));
#define DOT(t)                                                                                                 \
    {                                                                                                          \
        int32_t v_;                                                                                            \
        memcpy(&v_, x##t + pc * K + k, 4);                                                                     \
        __m512i b_ = _mm512_set1_epi32(v_);                                                                    \
        DPBUSD(i##t##a, w0, b_);                                                                               \
        DPBUSD(i##t##b, w1, b_);                                                                               \
    }
                X8(DOT)
#undef DOT
            }
        }
#define POST(t)                                                                                                \
    {                                                                                                          \
        __m512 d_ = _mm512_set1_ps(xst[tt[t] * ng + g]);                                                       \
        float *f_ = F + t * 32;                                                                                \
        _mm512_storeu_ps(f_, _mm512_fmadd_ps(q8_sum(J + t * 32, i##t##a), _mm512_mul_ps(s0, d_),                  \
                                             _mm512_loadu_ps(f_)));                                            \
        _mm512_storeu_ps(f_ + 16, _mm512_fmadd_ps(q8_sum(J + t * 32 + 16, i##t##b), _mm512_mul_ps(s1, d_),        \
                                                  _mm512_loadu_ps(f_ + 16)));                                  \
    }
        X8(POST)
#undef POST
        __m512 b0 = _mm512_loadu_ps(B + g * 32), b1 = _mm512_loadu_ps(B + g * 32 + 16);
#define BIAS(t)                                                                                                \
    {                                                                                                          \
        __m512 e_ = _mm512_set1_ps(xs[tt[t] * ng + g]);                                                        \
        float *f_ = F + t * 32;                                                                                \
        _mm512_storeu_ps(f_, _mm512_fmadd_ps(b0, e_, _mm512_loadu_ps(f_)));                                    \
        _mm512_storeu_ps(f_ + 16, _mm512_fmadd_ps(b1, e_, _mm512_loadu_ps(f_ + 16)));                          \
    }
        X8(BIAS)
#undef BIAS
    }
}

/* A thread's panel scratch: P [K/4][32][4] codes, S and B [ng][32] f32,
 * rows [16][K] bytes; returns the float just past them
 * (pt_cpu_gemm_i8_scratch floats in all). */
static float *panel_scratch_i8(const gi8_ctx *m, int ith, uint8_t **P, float **S, float **B, uint8_t **rows) {
    int64_t K = m->w->cols, ng = K / m->w->group_size;
    float *scr = pt_cpu_thread_scratch(m->c, ith);
    *P = (uint8_t *)scr;
    *S = scr + 8 * K;
    *B = *S + 32 * ng;
    *rows = (uint8_t *)(*B + 32 * ng);
    return scr + pt_cpu_gemm_i8_scratch(K, ng);
}

/* Packs the panel of rows [p0, p0 + nr) (nr <= 32; rows past nr zero): 16
 * rows at a time unpacked to bytes [16][K], then their 4-byte quads
 * transposed into P [K/4][32] (the f32 panel transpose moves 32-bit words
 * unchanged); scales and biases into S, B [ng][32]. */
static void pack_panel_i8(const gi8_ctx *m, int64_t p0, int nr, uint8_t *P, float *S, float *B, uint8_t *rows) {
    const pt_matrix *w = m->w;
    int64_t K = w->cols;
    for (int r0 = 0; r0 < 32; r0 += 16) {
        for (int r = 0; r < 16; r++) {
            uint8_t *dst = rows + (size_t)r * K;
            if (r0 + r >= nr) {
                memset(dst, 0, (size_t)K);
                pt_cpu_panel_params(w, m->expert, -1, r0 + r, S, B);
                continue;
            }
            int64_t n = p0 + r0 + r;
            pt_cpu_unpack_row_bytes(dst, pt_cpu_qrow_codes(w, m->expert, n), K, w->bits);
            pt_cpu_panel_params(w, m->expert, n, r0 + r, S, B);
        }
        if ((K / 4) % 16 == 0) m->c->k->panel_t16((float *)P, r0, (const float *)rows, K / 4);
        else pt_cpu_panel_t16_ref((float *)P, r0, (const float *)rows, K / 4);
    }
}

static void gi8_panels(void *arg, long n0, long n1, int ith) {
    gi8_ctx *m = arg;
    const pt_matrix *w = m->w;
    pt_act_dtype act = m->c->base.act;
    int64_t K = w->cols, T = m->T, gs = w->group_size;
    uint8_t *P, *rows;
    float *S, *B;
    panel_scratch_i8(m, ith, &P, &S, &B, &rows);
    for (int64_t p0 = n0; p0 < n1; p0 += 32) {
        int nr = (int)(n1 - p0 < 32 ? n1 - p0 : 32);
        pack_panel_i8(m, p0, nr, P, S, B, rows);
        /* token tiles */
        float bias[32];
        pt_cpu_panel_bias(bias, w, m->expert, p0, nr);
        for (int64_t t0 = 0; t0 < T; t0 += MR) {
            int64_t tt[MR];
            for (int t = 0; t < MR; t++) tt[t] = t0 + t < T ? t0 + t : T - 1; /* past the end: repeat the last */
            float F[MR * 32];
            pt_cpu_panel_prefetch(m->y, t0 + MR, T, MR, p0, w->rows);
            if (m->xstep && w->bits == 8) tile8x3q8(F, P, S, B, m->xq, m->xstep, m->xs, tt, K, gs);
            else if (m->xstep) tile8x3(F, P, S, B, m->xq, m->xstep, m->xs, tt, K, gs);
            else tile8(F, P, S, B, m->xq, m->xd, m->xs, tt, K, gs);
            pt_cpu_panel_store16(m->y, F, t0, (int)(T - t0 < MR ? T - t0 : MR), p0, nr, w->rows, bias, act);
        }
    }
}

void pt_cpu_panel_store_avx512(float *y, const float *F, int64_t t0, int nt, int64_t p0, int nr, const pt_matrix *w,
                               int64_t expert, pt_act_dtype act) {
    float bias[32];
    pt_cpu_panel_bias(bias, w, expert, p0, nr);
    pt_cpu_panel_store16(y, F, t0, nt, p0, nr, w->rows, bias, act);
}

void pt_cpu_gemm_i8(pt_cpu *c, float *y, const int8_t *xq, const float *xd, const float *xs, int64_t T,
                    const pt_matrix *w, int64_t expert) {
    gi8_ctx m = {.c = c, .y = y, .xq = xq, .xd = xd, .xs = xs, .T = T, .w = w, .expert = expert};
    /* chunks of 32-row panels: only the last chunk has a narrow panel */
    pt_pool_for(c->pool, (long)w->rows, 32, gi8_panels, &m);
}

void pt_cpu_gemm_xint(pt_cpu *c, float *y, const int8_t *xq, const float *xstep, const float *xs, int64_t T,
                      const pt_matrix *w, int64_t expert) {
    gi8_ctx m = {.c = c, .y = y, .xq = xq, .xstep = xstep, .xs = xs, .T = T, .w = w, .expert = expert};
    pt_pool_for(c->pool, (long)w->rows, 32, gi8_panels, &m);
}

/* ---- the int8 lever's GEMM on AMX int8 tiles (PETREL_CPU_AMX) ----
 * TDPBSUD multiplies a tile of 16 tokens × ks signed bytes of x (A: x's own
 * rows, K bytes apart) by a tile of ks/4 code quads × 16 weight rows (B: the
 * packed panel P above read as it is, rows 128 bytes apart: unsigned codes)
 * into 16 × 16 int32 sums, ks = min(group, 64). A block is 32 tokens × the
 * panel's 32 rows: four C tiles, two A and two B tiles. Per group the C tiles
 * start from zero, take the group's k steps and are stored; every
 * PT_CPU_AMX_CHUNK groups the stored sums are folded eight tokens at a time,
 * group by group in order (pt_cpu_amx_panel, cpu_internal.h, shared with the
 * bf16 AMX GEMM), with tile8's operations: F = fma(I, sc·xd, F),
 * F = fma(bi, xs, F). The integer sums are exact, the same integers tile8's
 * vpdpbusd form, so the results are tile8's bits: a row's output depends on
 * neither the GEMM, the block, the panel nor the thread split. */
size_t pt_cpu_gemm_amx_i8_scratch(int64_t K, int64_t ng) { return pt_cpu_gemm_i8_scratch(K, ng) + PT_CPU_AMX_SCRATCH; }

static void amx8_panels(void *arg, long n0, long n1, int ith) {
    gi8_ctx *m = arg;
    const pt_matrix *w = m->w;
    const int64_t gs = w->group_size, ks = gs < 64 ? gs : 64;
    uint8_t *P, *rows;
    float *S, *B;
    float *end = panel_scratch_i8(m, ith, &P, &S, &B, &rows);
    pt_cpu_amx_config((int)ks, (int)(ks / 4));
    for (int64_t p0 = n0; p0 < n1; p0 += 32) {
        int nr = (int)(n1 - p0 < 32 ? n1 - p0 : 32);
        pack_panel_i8(m, p0, nr, P, S, B, rows);
        float bias[32];
        pt_cpu_panel_bias(bias, w, m->expert, p0, nr);
        pt_cpu_amx_panel(1, m->xq, P, S, B, m->xs, m->xd, m->T, w->cols, gs, end, m->y, w->rows, p0, nr, bias,
                         m->c->base.act);
    }
    PT_CPU_AMX_RELEASE();
}

void pt_cpu_gemm_amx_i8(pt_cpu *c, float *y, const int8_t *xq, const float *xd, const float *xs, int64_t T,
                        const pt_matrix *w, int64_t expert) {
    gi8_ctx m = {.c = c, .y = y, .xq = xq, .xd = xd, .xs = xs, .T = T, .w = w, .expert = expert};
    pt_pool_for(c->pool, (long)w->rows, 32, amx8_panels, &m);
}
