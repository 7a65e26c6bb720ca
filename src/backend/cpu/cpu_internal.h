/* CPU backend internals: the per-ISA kernel table and the backend state.
 * Kernels (kernels_scalar.c, kernels_avx2.c, kernels_avx512.c) are leaf
 * functions over one row; the op files (cpu_*.c) split work across the
 * thread pool and call them. Not part of the op table's public interface.
 *
 * Determinism: every output element is produced by one kernel call whose
 * arithmetic does not depend on how rows were split between threads. */
#ifndef PT_BACKEND_CPU_INTERNAL_H
#define PT_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"
#include "base/threadpool.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* 4-bit codes are consumed with x permuted per 32-value block: byte i of a
 * block holds values 2i (low nibble) and 2i+1 (high nibble), so the block's x
 * is stored as [x0 x2 .. x30 | x1 x3 .. x31]. Then the low nibbles of 16
 * consecutive bytes multiply 16 consecutive floats, and so do the high ones:
 * no interleaving shuffle in the inner loop. */
void pt_cpu_permute_x4(float *xp, const float *x, int64_t K);

/* bf16 activations for the 4-bit bf16 kernel (qdot4_x4_bf16): per
 * 128-value block, four vectors of 32 bf16, vector k holding
 * [x(8i+k), x(8i+4+k)] for i = 0..15 — the order in which the nibbles of
 * 16-bit words of the codes come out (word i of a 64-byte block holds values
 * 4i..4i+3; vdpbf16ps pairs words 2i and 2i+1, i.e. values 8i+k and 8i+4+k).
 * Returns 0 (and the caller keeps the f32 kernel) unless K % 128 == 0 and
 * every x is exactly a normal bf16 value or zero (a NaN or a subnormal is
 * refused: vdpbf16ps reads subnormals as zero). */
int pt_cpu_arrange_x4_bf16(uint16_t *xa, const float *x, int64_t K);

/* x as exact integer pieces for the 4-bit VNNI decode kernel
 * (qdot_xint_avx512.c, which describes the layout and the accuracy bound):
 * xq [3·K] bytes, step [K/gs]. Returns 0 (use the other kernels) unless
 * K % 128 == 0, gs is 32/64/128 and every x is finite and exactly bf16.
 * AVX-512 code: call only on the AVX-512 table with VNNI present
 * (pt_cpu_gemm_i8_available). */
int pt_cpu_arrange_xint(int8_t *xq, float *step, const float *x, int64_t K, int gs);
/* The same pieces for the prefill GEMM (pt_cpu_gemm_xint): per token
 * [A: K bytes][B: K][C: K] in natural order, step [K/gs]; K % gs == 0. */
int pt_cpu_arrange_xint_rows(int8_t *xq, float *step, const float *x, int64_t K, int gs);
/* qdot4_x4's sum (bias term included) from the integer pieces; the f32 or
 * the bf16 (as stored in the weight) scales and biases. */
void pt_cpu_qdot4_x4_xint(float *out, const int8_t *xq, const float *xstep, const float *xs,
                          const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                          int gs);
void pt_cpu_qdot4_x4_xints(float *out, const int8_t *xq, const float *xstep, const float *xs,
                           const uint8_t *const *codes, const uint16_t *const *sc, const uint16_t *const *bi,
                           int64_t K, int gs);

/* The 8-bit decode kernel on the same pieces (qdot_xint_avx512.c): x in
 * natural order per 64-value chunk [A | B | C] (xq [3·K] bytes, step
 * [K/gs]); 0 unless K % 128 == 0, gs is 32/64/128 and every x is finite and
 * exactly bf16. The kernels compute qdot8_x4's sum (bias term included) from
 * the f32 or the bf16 (as stored) scales and biases. */
int pt_cpu_arrange_xint8(int8_t *xq, float *step, const float *x, int64_t K, int gs);
void pt_cpu_qdot8_x4_xint(float *out, const int8_t *xq, const float *xstep, const float *xs,
                          const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                          int gs);
void pt_cpu_qdot8_x4_xints(float *out, const int8_t *xq, const float *xstep, const float *xs,
                           const uint8_t *const *codes, const uint16_t *const *sc, const uint16_t *const *bi,
                           int64_t K, int gs);

void pt_cpu_panel_t16_ref(float *wp, int r0, const float *rows, int64_t K);
void pt_cpu_dequant_q_ref(float *dst, const uint8_t *row, int64_t k0, int64_t n, const float *sc, const float *bi,
                          int gs, int bits);
/* int8 activations for 4-bit codes: per 64-value chunk [x0 x2 .. x62 | x1 x3
 * .. x63]; a final 32-value chunk (K % 64 == 32) as [x0 .. x30 | x1 .. x31]. */
void pt_cpu_arrange_x4_i8(int8_t *dst, const int8_t *xq, int64_t K);
/* int8 activations for qdot4_x4_i8_128: per 128-value chunk [x0 x2 .. x126 |
 * x1 x3 .. x127] (K % 128 == 0): the low nibbles of a 64-byte block of codes
 * against the first half, the high nibbles against the second. */
void pt_cpu_arrange_x4_i8_128(int8_t *dst, const int8_t *xq, int64_t K);
/* Plain C versions of the int8 kernels (the scalar/AVX2 table and shapes the
 * AVX-512 kernel does not take). */
void pt_cpu_qdot4_x4_i8_ref(float *out, const int8_t *xq, const float *xd, const float *xs,
                            const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                            int gs);
void pt_cpu_qdot8_x4_i8_ref(float *out, const int8_t *xq, const float *xd, const float *xs,
                            const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                            int gs);

/* How far ahead (bytes) the AVX-512 decode kernels prefetch the weight codes
 * they stream (kernels_avx512.c PF_LINE); mm_direct_q48 prefetches the first
 * PT_CPU_PF_AHEAD bytes of a chunk itself, which the kernels' own prefetch
 * (always that far ahead of the rows being read) never covers. */
#define PT_CPU_PF_AHEAD 8192
/* The decode kernels' prefetch offset for rows of K values of `bits` bits:
 * PT_CPU_PF_AHEAD rounded up to whole blocks of four rows. */
static inline int64_t pt_cpu_pf_offset(int64_t K, int bits) {
    int64_t blk = 4 * K * bits / 8;
    return (PT_CPU_PF_AHEAD + blk - 1) / blk * blk;
}

/* Consecutive rows of a quantized KV cache (MLX affine codes, low bits first
 * in each 32-bit word): row j's codes at codes + j·rb (rb = hd·bits/8
 * bytes), its ng = hd/gs scales and biases at element j·ng of sc and bi,
 * of type dt. */
typedef struct pt_cpu_qrows {
    const uint8_t *codes;
    const void *sc, *bi;
    pt_ftype dt;
    int bits, gs, hd;
} pt_cpu_qrows;
/* The rows [j, j + n) of r as their own pt_cpu_qrows */
static inline pt_cpu_qrows pt_cpu_qrows_at(const pt_cpu_qrows *r, int64_t j) {
    const size_t ng = (size_t)(r->hd / r->gs), es = pt_ftype_size(r->dt);
    pt_cpu_qrows o = *r;
    o.codes += (size_t)j * (size_t)r->hd * (size_t)r->bits / 8;
    o.sc = (const char *)r->sc + (size_t)j * ng * es;
    o.bi = (const char *)r->bi + (size_t)j * ng * es;
    return o;
}
/* The rows [j, j + n) of r (codes, scales, biases) on their way into the
 * caches (prefetcht0), ahead of a kernel that will read them */
static inline void pt_cpu_qrows_prefetch(const pt_cpu_qrows *r, int64_t j, int64_t n) {
    const pt_cpu_qrows b = pt_cpu_qrows_at(r, j);
    const size_t cb = (size_t)n * (size_t)r->hd * (size_t)r->bits / 8,
                 pb = (size_t)n * (size_t)(r->hd / r->gs) * pt_ftype_size(r->dt);
    for (size_t o = 0; o < cb; o += 64) __builtin_prefetch(b.codes + o, 0, 3);
    for (size_t o = 0; o < pb; o += 64) {
        __builtin_prefetch((const char *)b.sc + o, 0, 3);
        __builtin_prefetch((const char *)b.bi + o, 0, 3);
    }
}
/* n rows dequantized, dst[j·hd + d] = s·c + b for value d's code c and its
 * group's scale s and bias b (any bits), the product rounded before the sum
 * (no FMA: with f32 scales an FMA's single rounding moves values by an ulp,
 * and a 4-bit cache re-quantizes the next layer's rows from them, so one ulp
 * can flip a code downstream: the fixtures' fp32 oracle rounds twice). The
 * values the kernel table's quantized attention kernels use. */
void pt_cpu_qrows_ref(float *dst, const pt_cpu_qrows *r, int64_t n);

typedef struct pt_cpu_kernels {
    const char *name;
    /* Σ x[i]·w[i] over n, f32 accumulation */
    float (*dot_f32)(const float *x, const float *w, int64_t n);
    float (*dot_bf16)(const float *x, const uint16_t *w, int64_t n);
    float (*dot_f16)(const float *x, const uint16_t *w, int64_t n);
    /* y[i] += a·x[i] (x as f32 or bf16) */
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_bf16)(float *y, float a, const uint16_t *x, int64_t n);
    /* Quantized row dot without the bias term: Σ_g sc[g] · Σ_{j∈g} q_j·x_j.
     * q4: x permuted (pt_cpu_permute_x4); q8: x in natural order. NULL =
     * not specialized (the generic path unpacks and uses dot_f32). */
    float (*qdot4)(const float *xp, const uint8_t *codes, const float *sc, int64_t K, int gs);
    float (*qdot8)(const float *x, const uint8_t *codes, const float *sc, int64_t K, int gs);
    /* Four rows at once, bias term included (decode):
     *   out[r] = Σ_g sc[r][g]·Σ_{j∈g} q_rj·x_j + Σ_g bi[r][g]·xs[g]
     * xs = group sums of x. Each row's arithmetic is independent of the
     * other three, so a row gives the same bits in any block (blocks at the
     * end of a thread's range repeat their last row). */
    void (*qdot4_x4)(float *out, const float *xp, const float *xs, const uint8_t *const *codes,
                     const float *const *sc, const float *const *bi, int64_t K, int gs);
    void (*qdot8_x4)(float *out, const float *x, const float *xs, const uint8_t *const *codes,
                     const float *const *sc, const float *const *bi, int64_t K, int gs);
    /* qdot4_x4 for x exactly in bf16 (xa = pt_cpu_arrange_x4_bf16), K % 128
     * == 0: same sum, computed with bf16 dot products (products of a code
     * and a bf16 x are exact in f32; only the summation order differs).
     * NULL = not available (the caller uses qdot4_x4). */
    void (*qdot4_x4_bf16)(float *out, const uint16_t *xa, const float *xs, const uint8_t *const *codes,
                          const float *const *sc, const float *const *bi, int64_t K, int gs);
    /* qdot4_x4_bf16 with the scales and biases read as bf16 from the weight
     * (no conversion pass by the caller): the same f32 operands, the same
     * bits. NULL = not available. */
    void (*qdot4_x4_bf16s)(float *out, const uint16_t *xa, const float *xs, const uint8_t *const *codes,
                           const uint16_t *const *sc, const uint16_t *const *bi, int64_t K, int gs);
    /* int8-activation lever (L3, changes outputs): x quantized per weight
     * group to int8 with xd[g] = max|x|/127, integer dot products:
     *   out[r] = Σ_g sc[r][g]·xd[g]·Σ_{j∈g} q_rj·xq_j + Σ_g bi[r][g]·xs[g]
     * xq layout: 4-bit: pt_cpu_arrange_x4_i8; 8-bit: natural order. */
    void (*qdot4_x4_i8)(float *out, const int8_t *xq, const float *xd, const float *xs, const uint8_t *const *codes,
                        const float *const *sc, const float *const *bi, int64_t K, int gs);
    void (*qdot8_x4_i8)(float *out, const int8_t *xq, const float *xd, const float *xs, const uint8_t *const *codes,
                        const float *const *sc, const float *const *bi, int64_t K, int gs);
    /* qdot4_x4_i8 on 512-bit vectors for K % 128 == 0, xq arranged by
     * pt_cpu_arrange_x4_i8_128. NULL = not available. */
    void (*qdot4_x4_i8_128)(float *out, const int8_t *xq, const float *xd, const float *xs,
                            const uint8_t *const *codes, const float *const *sc, const float *const *bi, int64_t K,
                            int gs);
    /* Prefill panel packing, 4- and 8-bit rows: dst[0..n) = scale·q + bias for
     * values [k0, k0 + n) of a row (k0, n multiples of 32), in natural order
     * for 8 bits and, for 4 bits, per 32-value block the 16 even values then
     * the 16 odd ones (the codes' byte order). */
    void (*dequant_q)(float *dst, const uint8_t *row, int64_t k0, int64_t n, const float *sc, const float *bi, int gs,
                      int bits);
    /* Prefill panel transpose: wp[k·32 + r0 + r] = rows[r·K + k] for r < 16,
     * k < K (K % 16 == 0): 16 dequantized rows into the k-major panel. */
    void (*panel_t16)(float *wp, int r0, const float *rows, int64_t K);
    /* dst[i] = f32 of bf16 src[i] */
    void (*cvt_bf16)(float *dst, const uint16_t *src, int64_t n);
    /* Prefill tile (mm_gemm): for t < mr (1..12), j < 32:
     *   c[t·ldc + j] = (first ? 0 : c[t·ldc + j]) + Σ_{k<kc} xpk[k·12 + t] · wp[k·32 + j]
     * as one sequential multiply-add chain per element, so an element's bits
     * do not depend on mr or on the tile it is computed in. */
    void (*gemm_32)(float *c, int64_t ldc, const float *xpk, const float *wp, int mr, int64_t kc, int first);
    /* Attention over n contiguous cache rows (bf: bf16 rows, else f32), for
     * the G query heads of one GQA group (q/out rows of hd floats):
     *   scores:   S[g·lds + j] = q_g · k_j   (one token: a decode step's
     *             when G < 4)
     *   scores_t: S[(u·G + g)·lds + j] = q_{u,g} · k_j for nt tokens u (a
     *             prefill call's, or a decode step's when G >= 4; q_{u,g} at
     *             q + u·qs + g·hd), each score one f32 chain in d order
     *             whatever nt, n or the key's place
     *   pv:       out[g·hd + d] += Σ_j P[g·ldp + j] · v_j[d]   (sequential over j)
     * They return 0 when they do not handle the shape (the caller then uses
     * the generic loops over dot/axpy). NULL = never handled. */
    int (*attn_scores)(float *S, int64_t lds, const float *q, int G, int hd, const void *k, int64_t n, int bf);
    int (*attn_scores_t)(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, int hd, const void *k,
                         int64_t n, int bf);
    int (*attn_pv)(float *out, const float *P, int64_t ldp, int G, int hd, const void *v, int64_t n, int bf);
    /* attn_scores_t and attn_pv over bf16 rows whose other operand (the
     * queries, the probabilities) holds bf16 values, on vdpbf16ps: each f32
     * chain runs over pairs (dims or keys 2i + 1 then 2i), subnormal f32
     * inputs and results as zero (kernels_avx512.c). 0 = shape not handled;
     * NULL where the CPU has no AVX512-BF16. */
    int (*attn_scores_dp)(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, int hd, const void *k,
                          int64_t n);
    int (*attn_pv_dp)(float *out, const float *P, int64_t ldp, int G, int hd, const void *v, int64_t n);
    /* attn_scores_t over bf16 rows and bf16-valued queries on AMX tiles
     * (TDPBF16PS, kernels_avx512.c): each score the tile unit's f32 sum of
     * the exact products over the dims in steps of 32 (AMX's own rounding of
     * that sum), whatever nt, n or the key's place; subnormal inputs as zero.
     * The caller has checked pt_cpu_amx_available(). 0 = shape not handled
     * (hd not a multiple of 32 or above 256). */
    int (*attn_scores_amx)(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, int hd, const void *k,
                           int64_t n);
    /* acc[r·hd + d] += Σ_{j<n} P[r·ldp + j]·v_j[d] for R rows of
     * bf16-valued probabilities over n bf16 rows on AMX tiles: the keys
     * placed from slot `lead` (0..31) of the first 32-key step, so that
     * `lead` = the first key's position mod 32 puts every key into the same
     * step and pair whatever the call's first key; each element the tile
     * unit's f32 sum of its row's exact products. 0 = shape not handled
     * (hd not a multiple of 64 or above 256). */
    int (*attn_pv_amx)(float *acc, const float *P, int64_t ldp, int R, int hd, const void *v, int64_t n, int lead);
    /* A quantized cache's rows (4 or 8 bits), each dequantized as
     * pt_cpu_qrows_ref does: attn_scores_tq is attn_scores_t over n such
     * keys, attn_pv_q attn_pv over n such values, with the bits of
     * pt_cpu_qrows_ref followed by those kernels on the f32 rows. 0 = shape
     * not handled (the caller dequantizes with pt_cpu_qrows_ref). */
    int (*attn_scores_tq)(float *S, int64_t lds, const float *q, int64_t qs, int nt, int G, const pt_cpu_qrows *k,
                          int64_t n);
    int (*attn_pv_q)(float *out, const float *P, int64_t ldp, int G, const pt_cpu_qrows *v, int64_t n);
    /* --fused-decode-attn's products over a quantized cache (4 or 8 bits,
     * bf16 scales and biases) with the dequantization factored out, on
     * vdpbf16ps (kernels_avx512.c; an L3 lever's arithmetic, not the exact
     * path's):
     *   fused_scores_dp: S[g·lds + j] = Σ_b sc_jb·(Σ_{e∈b} q_ge·c_je) + bi_jb·qs[g·ng + b]
     *       for the G heads' query pairs qp and group sums qs of
     *       pt_cpu_fq_prep (queries holding bf16 values);
     *   fused_pv_dp: out[g·hd + e] += Σ_j w_gj·c_je + Σ_j P[g·ldp + j]·bi_jb,
     *       w = bf16(P·sc).
     * 0 = shape not handled; NULL where the CPU has no AVX512-BF16. */
    int (*fused_scores_dp)(float *S, int64_t lds, const uint32_t *qp, const float *qs, int G, const pt_cpu_qrows *k,
                           int64_t n);
    int (*fused_pv_dp)(float *out, const float *P, int64_t ldp, int G, const pt_cpu_qrows *v, int64_t n);
    /* One attention row without soft-cap: s = round(round(s)·scale), then
     * s = round(softmax(s)) (round = to bf16 when bf16 != 0, else identity).
     * NULL = the caller's scalar loop (expf). */
    void (*softmax_row)(float *s, int64_t n, float scale, int bf16);
    /* One block of an online softmax (--fused-decode-attn): s = round(s)
     * (round as above), *m = max s, s = e^(s − *m) with softmax_row's exp,
     * *l = Σ s (the sum's order fixed by n). NULL = the caller's loop (expf). */
    void (*softmax_part)(float *s, int64_t n, int bf16, float *m, float *l);
    /* SwiGLU over n elements: y[i] = round(round(silu(g[i]))·u[i]) (round as
     * in softmax_row), silu(g) = g / (1 + exp(−g)) with a vector exp (a few
     * ulp from libm's expf). NULL = the caller's scalar loop. */
    void (*silu_mul)(float *y, const float *g, const float *u, int64_t n, int bf16);
    /* One token's group sums, xs[g] = Σ_{j∈g} x[j] added in order j = g·gs,
     * g·gs + 1, … from 0.0f (every path's b·Σx term): the additions of
     * pt_cpu_group_sums_ref, so the same bits. NULL = that reference. */
    void (*group_sums)(float *xs, const float *x, int64_t K, int gs);
    /* One token's int8-lever activations (L3): per group xd[g] = max|x| / 127
     * and xi[j] = x[j]·(127 / max|x|) rounded to nearest even (0 for an
     * all-zero group); the operations of pt_cpu_quant_i8_ref, so the same
     * bits. NULL = that reference. */
    void (*quant_i8)(int8_t *xi, float *xd, const float *x, int64_t K, int gs);
    /* RMSNorm of 16 rows (D values each, rows D apart in y, x and res; the
     * residual add into res first when res is set; wf: the weights as f32,
     * NULL for PT_RMS_NOSCALE; style a pt_rms_style): the operations of the
     * scalar row loop (cpu_ops.c), each row's sum of squares added in order,
     * so the same bits. NULL = that loop. */
    void (*rms_norm16)(float *y, const float *x, float *res, int64_t D, const float *wf, int style, float eps,
                       int bf16);
    /* RoPE of one head in place (its first 2·half values; cs, sn: the
     * token's cos and sin, already scaled and rounded): the scalar loop's
     * operations (cpu_ops.c), so the same bits. NULL = that loop. */
    void (*rope_rot)(float *v, const float *cs, const float *sn, int half, int bf16);
} pt_cpu_kernels;

void pt_cpu_group_sums_ref(float *xs, const float *x, int64_t K, int gs);
void pt_cpu_quant_i8_ref(int8_t *xi, float *xd, const float *x, int64_t K, int gs);

extern const pt_cpu_kernels pt_cpu_kernels_scalar;
extern const pt_cpu_kernels pt_cpu_kernels_avx2;
extern const pt_cpu_kernels pt_cpu_kernels_avx512;

typedef struct pt_cpu {
    pt_backend base;
    pt_pool *pool;
    int nth;
    pt_cpu_isa isa;
    const pt_cpu_kernels *k;
    int int8_act; /* the L3 lever (pt_cpu_params.int8_act) */
    pt_backend_limits lim;
    /* scratch, sized by reserve(); per-thread blocks of per_thread floats */
    float *scratch;
    size_t per_thread;
    /* shared (not per-thread) scratch for matmul inputs: permuted x and group sums */
    float *xbuf;
    size_t xbuf_floats;
    /* moe_ffn's own buffers (gate|up, h, o), grown on first use */
    float *moe;
    size_t moe_floats;
} pt_cpu;

static inline pt_cpu *pt_cpu_of(pt_backend *be) { return (pt_cpu *)be; }
static inline float *pt_cpu_thread_scratch(pt_cpu *c, int ith) { return c->scratch + (size_t)ith * c->per_thread; }

/* Rounds to bf16 when the activation dtype asks for it. */
#include "base/half.h"
static inline float pt_act_round(pt_act_dtype act, float v) { return act == PT_ACT_BF16 ? pt_round_bf16(v) : v; }

/* Converts one element of a float array of type t. */
static inline float pt_ft_load(pt_ftype t, const void *p, int64_t i) {
    switch (t) {
    case PT_FT_F32: return ((const float *)p)[i];
    case PT_FT_BF16: return pt_bf16_to_f32(((const uint16_t *)p)[i]);
    case PT_FT_F16: return pt_f16_to_f32(((const uint16_t *)p)[i]);
    }
    return 0.0f;
}
void pt_ft_load_row(pt_ftype t, const void *p, float *dst, int64_t n);

/* The prefill GEMMs' 32-row panels (gemm_i8_avx512.c, gemm_bf16_avx512.c):
 * row n's scales and biases into column col of S and B [ng][32] (zeros for
 * n < 0, a row past the panel's end). */
static inline void pt_cpu_panel_params(const pt_matrix *w, int64_t expert, int64_t n, int col, float *S, float *B) {
    int64_t ng = w->cols / w->group_size;
    if (n < 0) {
        for (int64_t g = 0; g < ng; g++) S[g * 32 + col] = B[g * 32 + col] = 0.0f;
        return;
    }
    size_t off = (size_t)(expert * w->rows + n) * (size_t)ng * pt_ftype_size(w->dtype);
    for (int64_t g = 0; g < ng; g++) {
        S[g * 32 + col] = pt_ft_load(w->dtype, (const char *)w->scales + off, g);
        B[g * 32 + col] = pt_ft_load(w->dtype, (const char *)w->biases + off, g);
    }
}
/* y[(t0 + t)·N + p0 + r] = act-rounded F[t·32 + r] + the weight's bias, for
 * the nt tokens and nr rows of a panel's results F [.][32]. */
static inline void pt_cpu_panel_store(float *y, const float *F, int64_t t0, int nt, int64_t p0, int nr,
                                      const pt_matrix *w, int64_t expert, pt_act_dtype act) {
    int64_t N = w->rows;
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            int64_t n = p0 + r;
            float bias = w->bias ? pt_ft_load(w->bias_dtype, w->bias, expert * N + n) : 0.0f;
            y[(t0 + t) * N + n] = pt_act_round(act, F[t * 32 + r] + bias);
        }
}

/* The weight's bias over a panel's rows p0 … p0 + nr − 1 as 32 floats:
 * what pt_cpu_panel_store adds to each output (0.0f without a bias, and
 * past nr). Once per panel for the AVX-512 store below. */
static inline void pt_cpu_panel_bias(float bias[32], const pt_matrix *w, int64_t expert, int64_t p0, int nr) {
    for (int r = 0; r < 32; r++)
        bias[r] = w->bias && r < nr ? pt_ft_load(w->bias_dtype, w->bias, expert * w->rows + p0 + r) : 0.0f;
}
/* pt_cpu_panel_store16 below as a function (gemm_i8_avx512.c; AVX-512 CPUs
 * only), for tests/test_cpu_xprep.c to hold it to pt_cpu_panel_store. */
void pt_cpu_panel_store_avx512(float *y, const float *F, int64_t t0, int nt, int64_t p0, int nr, const pt_matrix *w,
                               int64_t expert, pt_act_dtype act);
#ifdef __AVX512F__
#include <immintrin.h>
/* pt_round_bf16 on 16 lanes: pt_f32_to_bf16's integer rounding (to nearest
 * even, a NaN quieted) and back, the same bits (vcvtneps2bf16 is not used:
 * it does not keep subnormals). */
static inline __m512 pt_cpu_round_bf16_x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i q = _mm512_or_si512(_mm512_and_si512(u, hi), _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_and_si512(r, hi), nan, q));
}
/* pt_cpu_panel_store on 16 lanes (the AVX-512 GEMMs): the same sum F + bias
 * (bias: the panel's pt_cpu_panel_bias, taken once per panel) and the same
 * rounding, stored under masks; N = the weight's rows (y's row stride). */
static inline void pt_cpu_panel_store16(float *y, const float *F, int64_t t0, int nt, int64_t p0, int nr, int64_t N,
                                        const float bias[32], pt_act_dtype act) {
    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
    const __mmask16 m1 = nr <= 16 ? 0 : nr >= 32 ? (__mmask16)0xffff : (__mmask16)((1u << (nr - 16)) - 1u);
    const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
    for (int t = 0; t < nt; t++) {
        float *yr = y + (t0 + t) * N + p0;
        __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(F + t * 32), b0), v1 = _mm512_add_ps(_mm512_loadu_ps(F + t * 32 + 16), b1);
        if (act == PT_ACT_BF16) v0 = pt_cpu_round_bf16_x16(v0), v1 = pt_cpu_round_bf16_x16(v1);
        _mm512_mask_storeu_ps(yr, m0, v0);
        if (m1) _mm512_mask_storeu_ps(yr + 16, m1, v1);
    }
}
/* The AMX GEMMs' fold (gemm_bf16_avx512.c, gemm_i8_avx512.c): groups
 * [g0, g1) of a 32-token block's stored sums Cb [g − g0][4][16][16] (f32, or
 * int32 when xd is set) into F [32 tokens][32 rows] for the block's tokens
 * o … o + 7 (tx: their rows of xs and xd; a padding token repeats the last
 * and its results are dropped), group by group in order with F in
 * registers: F = fma(sum, sc, F) — i8 (int32 sums): F = fma(f32(sum), sc·xd,
 * F) — then F = fma(bias, Σx_g, F); S, B: the panel's scales and biases
 * [ng][32]. i8 is a constant at each call, so each GEMM gets its own loop. */
static inline void pt_cpu_amx_fold8(float *F, const void *Cb, const float *S, const float *B, const float *xs,
                                    const int i8, const float *xd, const int64_t tx[8], int64_t ng, int64_t g0,
                                    int64_t g1, int o) {
#define PT_X8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define PT_AL(t) __m512 f##t##a = _mm512_loadu_ps(F + (o + t) * 32), f##t##b = _mm512_loadu_ps(F + (o + t) * 32 + 16);
    PT_X8(PT_AL)
    for (int64_t g = g0; g < g1; g++) {
        const size_t at = (size_t)(g - g0) * 1024 + (size_t)(o / 16) * 512 + (size_t)(o % 16) * 16;
        const float *cf = (const float *)Cb + at;
        const int32_t *ci = (const int32_t *)Cb + at;
        const __m512 s0 = _mm512_loadu_ps(S + g * 32), s1 = _mm512_loadu_ps(S + g * 32 + 16);
        const __m512 c0 = _mm512_loadu_ps(B + g * 32), c1 = _mm512_loadu_ps(B + g * 32 + 16);
#define PT_AF(t)                                                                                               \
    {                                                                                                          \
        const __m512 e_ = _mm512_set1_ps(xs[tx[t] * ng + g]);                                                  \
        __m512 ia_, ib_, sa_ = s0, sb_ = s1;                                                                   \
        if (i8) {                                                                                              \
            const __m512 d_ = _mm512_set1_ps(xd[tx[t] * ng + g]);                                              \
            ia_ = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(ci + t * 16)));                         \
            ib_ = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(ci + 256 + t * 16)));                   \
            sa_ = _mm512_mul_ps(s0, d_), sb_ = _mm512_mul_ps(s1, d_);                                          \
        } else {                                                                                               \
            ia_ = _mm512_loadu_ps(cf + t * 16), ib_ = _mm512_loadu_ps(cf + 256 + t * 16);                      \
        }                                                                                                      \
        f##t##a = _mm512_fmadd_ps(c0, e_, _mm512_fmadd_ps(ia_, sa_, f##t##a));                                 \
        f##t##b = _mm512_fmadd_ps(c1, e_, _mm512_fmadd_ps(ib_, sb_, f##t##b));                                 \
    }
        PT_X8(PT_AF)
    }
#define PT_AS(t) _mm512_storeu_ps(F + (o + t) * 32, f##t##a), _mm512_storeu_ps(F + (o + t) * 32 + 16, f##t##b);
    PT_X8(PT_AS)
#undef PT_AS
#undef PT_AF
#undef PT_AL
#undef PT_X8
}
/* The two cache lines of each output row the next tile (tokens t1 … t1 +
 * mr − 1, clipped at T) will store (y[t·N + p0 …], 128 bytes), fetched for
 * writing while the current tile computes: the rows are N floats apart, so
 * every tile's stores otherwise wait on a line (and a page) from memory. */
static inline void pt_cpu_panel_prefetch(const float *y, int64_t t1, int64_t T, int mr, int64_t p0, int64_t N) {
    for (int64_t t = t1; t < T && t < t1 + mr; t++) {
        const char *r = (const char *)(y + t * N + p0);
        _mm_prefetch(r, _MM_HINT_ET0);
        _mm_prefetch(r + 64, _MM_HINT_ET0);
    }
}
#endif

pt_status pt_cpu_need_scratch(pt_cpu *c, size_t per_thread, size_t shared);

/* The first key the query at position hi attends to (its keys are
 * [lo, hi]; a sliding window keeps the last p->window). */
static inline int64_t pt_cpu_keys_lo(const pt_attn *p, int64_t hi) {
    return p->window > 0 && hi - p->window + 1 > 0 ? hi - p->window + 1 : 0;
}

/* The slots of keys [lo, lo + n) of a ring of cap rows: at most two
 * contiguous runs (the ring wraps once), {index in the range, first slot,
 * length}. */
static inline void pt_cpu_key_runs(int64_t runs[2][3], int64_t lo, int64_t n, int64_t cap) {
    const int64_t s0 = lo % cap, n1 = cap - s0 < n ? cap - s0 : n;
    runs[0][0] = 0, runs[0][1] = s0, runs[0][2] = n1;
    runs[1][0] = n1, runs[1][1] = 0, runs[1][2] = n - n1;
}

/* n query values scaled for attention over a quantized cache, as mlx-lm
 * does: q·scale first, rounded to the activation dtype (the scores are then
 * taken with scale 1). */
static inline void pt_cpu_scale_queries(float *dst, const float *q, int64_t n, float scale, pt_act_dtype act) {
    for (int64_t i = 0; i < n; i++) dst[i] = pt_act_round(act, q[i] * scale);
}

/* The rows of a quantized cache's head h from slot on (v: the values, else
 * the keys); the caller keeps runs within the ring. */
pt_cpu_qrows pt_cpu_kv_qrows(const pt_kv_layer *kv, int v, int h, int64_t slot);
/* The query operands of fused_scores_dp for G heads of hd bf16-valued
 * values q[g·hd + e] against codes of `bits` (4 or 8) in groups of gs:
 * qp[g·np + 4w + i] (np = hd·bits/8 pairs a head), the bf16 pair for the
 * nibbles i and i + 4 (low half first) of the row's 32-bit code word w —
 * 4 bits: dims 8w + i and 8w + i + 4; 8 bits: dims 4w + i/2 and 4w + 2 + i/2,
 * times 16 for odd i (the byte's high nibble); qs[g·ng + b] = Σ q over group
 * b, added in dim order from 0. */
void pt_cpu_fq_prep(uint32_t *qp, float *qs, const float *q, int G, int hd, int bits, int gs);
/* Rows dequantized at a time into the rows scratch of the two below */
#define PT_CPU_QROWS 32
/* Attention over n quantized cache rows (cpu_attention.c): attn_scores_t's
 * scores (each key dequantized as pt_cpu_qrows_ref does) and attn_pv's sums
 * over dequantized values, through the kernel table's attn_scores_tq /
 * attn_pv_q, else rows dequantized PT_CPU_QROWS at a time into rows
 * [PT_CPU_QROWS·hd] for the full-precision kernels. */
void pt_cpu_qscores(const pt_cpu_kernels *k, float *S, int64_t lds, const float *q, int64_t qs, int nt, int G,
                    const pt_cpu_qrows *kr, int64_t n, float *rows);
void pt_cpu_qpv(const pt_cpu_kernels *k, float *acc, const float *P, int64_t ldp, int G, const pt_cpu_qrows *vr,
                int64_t n, float *rows);

/* --fused-decode-attn: one decode query at position pos over a quantized
 * cache (attn_qkv_fused.c); the caller has validated kv and p. Its work
 * items are (KV head, block of PT_CPU_FUSED_BLOCK keys): 512 measured
 * 1.1-1.9x faster than 128 at 8192 keys (longer streams of rows, fewer
 * partials; 1024 and 2048 the same as 512, bench/RESULTS.md). */
#define PT_CPU_FUSED_BLOCK 512
pt_status pt_cpu_attention_fused(pt_cpu *c, float *out, const float *q, int64_t pos, const pt_kv_layer *kv,
                                 const pt_attn *p);

/* The int8 lever's prefill GEMM (gemm_i8_avx512.c; AVX-512 VNNI, 4/8-bit
 * weights): y = the lever's formula over xq [T, K] int8 (natural order),
 * steps xd and exact group sums xs [T, ng]. Needs pt_cpu_gemm_i8_scratch
 * floats of per-thread scratch. */
int pt_cpu_gemm_i8_available(void);
/* The same GEMM with x as the integer pieces of pt_cpu_arrange_xint_rows
 * (xq [T, 3K] bytes, steps [T, ng]) instead of int8: 4- and 8-bit weights
 * (8-bit: the pieces' sums combined in int64), the L1 path's accuracy
 * (qdot_xint_avx512.c); same scratch. */
void pt_cpu_gemm_xint(pt_cpu *c, float *y, const int8_t *xq, const float *xstep, const float *xs, int64_t T,
                      const pt_matrix *w, int64_t expert);
size_t pt_cpu_gemm_i8_scratch(int64_t K, int64_t ng);
/* One row's 4- or 8-bit codes as bytes, natural order (value j at byte j;
 * gemm_i8_avx512.c, for the prefill GEMMs' panels). */
void pt_cpu_unpack_row_bytes(uint8_t *dst, const uint8_t *codes, int64_t K, int bits);
/* The bf16 prefill GEMM (gemm_bf16_avx512.c; AVX-512 BF16, 4/8-bit weights,
 * groups of a multiple of 32): the decode kernels' L1 formula over x exactly
 * bf16 (xb [T, K]) and its group sums xs [T, ng]. Needs
 * pt_cpu_gemm_bf16_scratch floats of per-thread scratch. */
void pt_cpu_gemm_bf16(pt_cpu *c, float *y, const uint16_t *xb, const float *xs, int64_t T, const pt_matrix *w,
                      int64_t expert);
size_t pt_cpu_gemm_bf16_scratch(int64_t K, int64_t ng);
/* The group size the bf16 GEMM and its AMX form run w with: its own, or all
 * of K for dense bf16 weights (one group of scale 1 and bias 0). */
static inline int64_t pt_cpu_bgemm_gs(const pt_matrix *w) { return w->bits ? w->group_size : w->cols; }
/* The same GEMM on AMX tiles (TDPBF16PS), when pt_cpu_amx_available() (the
 * CPU has AMX-BF16 and the OS granted the tile state): xb must hold whole
 * blocks of 32 tokens, [ceil(T/32)·32, K], the rows past T zero. Needs
 * pt_cpu_gemm_amx_scratch floats of per-thread scratch. */
int pt_cpu_amx_available(void);
void pt_cpu_gemm_amx(pt_cpu *c, float *y, const uint16_t *xb, const float *xs, int64_t T, const pt_matrix *w,
                     int64_t expert);
size_t pt_cpu_gemm_amx_scratch(int64_t K, int64_t ng);
/* The int8 lever's GEMM (pt_cpu_gemm_i8's formula and bits) on AMX int8
 * tiles (TDPBSUD), when pt_cpu_amx_i8_available() (AMX-INT8, AMX-TILE and the
 * tile state granted): xq must hold whole blocks of 32 tokens,
 * [ceil(T/32)·32, K], the rows past T zero. Needs pt_cpu_gemm_amx_i8_scratch
 * floats of per-thread scratch (gemm_i8_avx512.c). */
int pt_cpu_amx_i8_available(void);
void pt_cpu_gemm_amx_i8(pt_cpu *c, float *y, const int8_t *xq, const float *xd, const float *xs, int64_t T,
                        const pt_matrix *w, int64_t expert);
size_t pt_cpu_gemm_amx_i8_scratch(int64_t K, int64_t ng);
/* Groups whose four C tiles an AMX GEMM stores before it folds them (32 KiB
 * of f32 or int32 sums per thread). */
#define PT_CPU_AMX_CHUNK 8
/* Floats of per-thread scratch an AMX GEMM needs beyond its AVX-512 twin's:
 * a chunk's stored C tiles (64-byte aligned: up to 15 floats of padding) and
 * F [32 tokens][32 rows] (pt_cpu_amx_panel). */
#define PT_CPU_AMX_SCRATCH (16 + PT_CPU_AMX_CHUNK * 4 * 256 + 32 * 32)
/* The AMX GEMMs' tile operations (gemm_bf16_avx512.c, gemm_i8_avx512.c).
 *
 * pt_cpu_amx_config(a_bytes, b_rows) loads the tile configuration on the
 * calling thread with an inline ldtilecfg (gcc 12's _tile_loadconfig
 * intrinsic is miscompiled): palette 1; tiles 0-3 (C) 16 rows of 64 bytes;
 * 4-5 (A: 16 tokens of x) 16 rows of a_bytes; 6-7 (B: the weight panel)
 * b_rows rows of 64 bytes. PT_CPU_AMX_RELEASE() ends a job's tile use.
 *
 * PT_CPU_AMX_GROUP(KIND, a0, a_next, a_step, sa, b0, b_step, steps, cg): one
 * group of a 32-token × 32-row block into its stored C tiles: tmm0-3 zeroed,
 * then for each of `steps` k steps the A tiles (tmm4 tokens 0-15 at a0, tmm5
 * tokens 16-31 at a0 + a_next bytes; rows sa bytes apart) and the B tiles
 * (tmm6 rows 0-15 at b0, tmm7 rows 16-31 at b0 + 64 bytes; rows 128 bytes
 * apart) multiplied by KIND (bf16: TDPBF16PS, f32 sums of bf16 pairs;
 * bsud: TDPBSUD, int32 sums of signed x bytes by unsigned code bytes) into
 * tmm0 (tokens 0-15 × rows 0-15), tmm1 (× rows 16-31), tmm2, tmm3 (tokens
 * 16-31); a0 and b0 advance by a_step and b_step bytes per step; then the
 * four stored at cg, 1 KiB apart, rows 64 bytes apart.
 *
 * With PT_AMX_EMULATE defined (tests/test_cpu_amx_emul.c only) the same
 * operations are C code on a per-thread copy of the tile registers'
 * configuration, so the GEMMs' addressing, loops and folds run on any
 * AVX-512 CPU: TDPBSUD exactly (integers), TDPBF16PS as f32 multiply-adds
 * of the bf16 pairs (AMX rounds its sums its own way). */
#if defined(PT_AMX_EMULATE)
typedef struct {
    int a_bytes, b_rows;
} pt_amx_emu_cfg;
extern __thread pt_amx_emu_cfg pt_amx_emu;
static inline void pt_cpu_amx_config(int a_bytes, int b_rows) {
    pt_amx_emu.a_bytes = a_bytes;
    pt_amx_emu.b_rows = b_rows;
}
#define PT_CPU_AMX_RELEASE() ((void)0)
/* one k step of KIND into C [4][16][16] (4-byte sums) from the A tiles at a, a + a_next and B at b, b + 64 */
static inline void pt_amx_emu_step(int bf16, void *C, const char *a, long a_next, long sa, const char *b) {
    for (int c = 0; c < 4; c++) {
        const char *ab = a + (c >> 1) * a_next, *bb = b + (c & 1) * 64;
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++)
                for (int k = 0; k < pt_amx_emu.b_rows; k++) {
                    const char *ar = ab + m * sa + 4 * k, *br = bb + k * 128 + 4 * n;
                    if (bf16) {
                        float *cf = (float *)C + c * 256 + m * 16 + n;
                        for (int i = 0; i < 2; i++) {
                            uint16_t x, w;
                            memcpy(&x, ar + 2 * i, 2);
                            memcpy(&w, br + 2 * i, 2);
                            *cf += pt_bf16_to_f32(x) * pt_bf16_to_f32(w);
                        }
                    } else {
                        int32_t *ci = (int32_t *)C + c * 256 + m * 16 + n;
                        for (int i = 0; i < 4; i++) *ci += (int32_t)(int8_t)ar[i] * (int32_t)(uint8_t)br[i];
                    }
                }
    }
}
#define PT_CPU_AMX_GROUP(KIND, a0_, a_next, a_step, sa_, b0_, b_step, steps, cg_)                                    \
    do {                                                                                                              \
        const char *a_ = (const char *)(a0_), *b_ = (const char *)(b0_);                                              \
        char *c_ = (char *)(cg_);                                                                                     \
        memset(c_, 0, 4096);                                                                                          \
        for (int64_t s_ = 0; s_ < (steps); s_++, a_ += (a_step), b_ += (b_step))                                       \
            pt_amx_emu_step(PT_AMX_EMU_##KIND, c_, a_, (long)(a_next), (long)(sa_), b_);                              \
    } while (0)
#define PT_AMX_EMU_bf16 1
#define PT_AMX_EMU_bsud 0
#elif defined(__x86_64__)
static inline void pt_cpu_amx_config(int a_bytes, int b_rows) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = (uint16_t)(i == 4 || i == 5 ? a_bytes : 64);
        cfg.rows[i] = (uint8_t)(i >= 6 ? b_rows : 16);
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}
#define PT_CPU_AMX_RELEASE() __asm__ volatile("tilerelease" ::)
#define PT_AMX_INSN_bf16 "tdpbf16ps"
#define PT_AMX_INSN_bsud "tdpbsud"
#define PT_CPU_AMX_GROUP(KIND, a0_, a_next, a_step, sa_, b0_, b_step, steps, cg_)                                    \
    do {                                                                                                              \
        const char *a_ = (const char *)(a0_), *b_ = (const char *)(b0_);                                              \
        const long sa__ = (long)(sa_), sb__ = 128, sc__ = 64;                                                         \
        char *c_ = (char *)(cg_);                                                                                     \
        __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::);              \
        for (int64_t s_ = 0; s_ < (steps); s_++, a_ += (a_step), b_ += (b_step))                                       \
            __asm__ volatile("tileloadd (%0,%4,1), %%tmm4\n\t"                                                         \
                             "tileloadd (%1,%4,1), %%tmm5\n\t"                                                         \
                             "tileloadd (%2,%5,1), %%tmm6\n\t"                                                         \
                             "tileloadd (%3,%5,1), %%tmm7\n\t" PT_AMX_INSN_##KIND " %%tmm6, %%tmm4, %%tmm0\n\t"         \
                             PT_AMX_INSN_##KIND " %%tmm7, %%tmm4, %%tmm1\n\t" PT_AMX_INSN_##KIND                        \
                             " %%tmm6, %%tmm5, %%tmm2\n\t" PT_AMX_INSN_##KIND " %%tmm7, %%tmm5, %%tmm3"                  \
                             :                                                                                        \
                             : "r"(a_), "r"(a_ + (a_next)), "r"(b_), "r"(b_ + 64), "r"(sa__), "r"(sb__)               \
                             : "memory");                                                                             \
        __asm__ volatile("tilestored %%tmm0, (%0,%4,1)\n\t"                                                           \
                         "tilestored %%tmm1, (%1,%4,1)\n\t"                                                           \
                         "tilestored %%tmm2, (%2,%4,1)\n\t"                                                           \
                         "tilestored %%tmm3, (%3,%4,1)"                                                                \
                         :                                                                                            \
                         : "r"(c_), "r"(c_ + 1024), "r"(c_ + 2048), "r"(c_ + 3072), "r"(sc__)                         \
                         : "memory");                                                                                 \
    } while (0)
#endif
#if defined(__AVX512F__) && (defined(PT_AMX_EMULATE) || defined(__x86_64__))
/* One panel of an AMX GEMM (gemm_bf16_avx512.c with i8 = 0: TDPBF16PS over
 * bf16 x in k steps of 32 values; gemm_i8_avx512.c with i8 = 1: TDPBSUD over
 * int8 x in k steps of min(group, 64) bytes), its codes packed in P (rows
 * 128 bytes apart), its scales and biases in S, B [ng][32]: for every block
 * of 32 tokens (x holds whole blocks, [ceil(T/32)·32][K], zeros past T) the
 * groups in chunks of PT_CPU_AMX_CHUNK into stored C tiles, each chunk folded
 * into F by pt_cpu_amx_fold8, then the block's outputs stored by
 * pt_cpu_panel_store16 (the next block's output lines fetched first). end:
 * the thread's scratch past the AVX-512 twin's (PT_CPU_AMX_SCRATCH floats
 * more). i8 is a constant at each call, so each GEMM gets its own loop. */
static inline void pt_cpu_amx_panel(const int i8, const void *x, const void *P, const float *S, const float *B,
                                    const float *xs, const float *xd, int64_t T, int64_t K, int64_t gs, float *end,
                                    float *y, int64_t N, int64_t p0, int nr, const float bias[32], pt_act_dtype act) {
    const int64_t ng = K / gs, esz = i8 ? 1 : 2, ks = i8 ? (gs < 64 ? gs : 64) : 32; /* values per k step */
    /* [PT_CPU_AMX_CHUNK][4][16][16]: a chunk of groups' C tiles (token half, row half) */
    char *Cb = (char *)(((uintptr_t)end + 63) & ~(uintptr_t)63);
    float *F = (float *)(Cb + PT_CPU_AMX_CHUNK * 4096); /* [32 tokens][32 rows] */
    for (int64_t t0 = 0; t0 < T; t0 += 32) {
        for (int i = 0; i < 32 * 32; i += 16) _mm512_storeu_ps(F + i, _mm512_setzero_ps());
        for (int64_t g0 = 0; g0 < ng; g0 += PT_CPU_AMX_CHUNK) {
            int64_t g1 = g0 + PT_CPU_AMX_CHUNK < ng ? g0 + PT_CPU_AMX_CHUNK : ng;
            /* the chunk's sums, group by group into its stored tiles ... */
            for (int64_t g = g0; g < g1; g++) {
                const char *a = (const char *)x + (t0 * K + g * gs) * esz, *b = (const char *)P + g * gs * 32 * esz;
                if (i8) PT_CPU_AMX_GROUP(bsud, a, 16 * K, ks, K, b, ks * 32, gs / ks, Cb + (g - g0) * 4096);
                else PT_CPU_AMX_GROUP(bf16, a, 32 * K, 64, 2 * K, b, 2048, gs / 32, Cb + (g - g0) * 4096);
            }
            /* ... then folded eight tokens at a time (a padding token's sums are dropped) */
            for (int o = 0; o < 32; o += 8) {
                int64_t tx[8];
                for (int t = 0; t < 8; t++) tx[t] = t0 + o + t < T ? t0 + o + t : T - 1;
                pt_cpu_amx_fold8(F, Cb, S, B, xs, i8, xd, tx, ng, g0, g1, o);
            }
        }
        pt_cpu_panel_prefetch(y, t0 + 32, T, 32, p0, N);
        pt_cpu_panel_store16(y, F, t0, (int)(T - t0 < 32 ? T - t0 : 32), p0, nr, N, bias, act);
    }
}
#endif
/* dst[j] = x[j] as bf16 for j < K; 0 (dst partly written) when a value is not
 * exactly a finite bf16 or is subnormal (vdpbf16ps reads those as zero). */
int pt_cpu_x_bf16_exact(uint16_t *dst, const float *x, int64_t K);
void pt_cpu_gemm_i8(pt_cpu *c, float *y, const int8_t *xq, const float *xd, const float *xs, int64_t T,
                    const pt_matrix *w, int64_t expert);

/* Weight row access: dense rows, or quantized codes + f32 scales/biases. */
const void *pt_cpu_dense_row(const pt_matrix *w, int64_t expert, int64_t row);
const uint8_t *pt_cpu_qrow_codes(const pt_matrix *w, int64_t expert, int64_t row);
void pt_cpu_qrow_params(const pt_matrix *w, int64_t expert, int64_t row, float *sc, float *bi);
/* Dequantizes one quantized row to f32 (any bits). */
void pt_cpu_dequant_row(const pt_matrix *w, int64_t expert, int64_t row, float *dst, float *tmp_sc, float *tmp_bi);
/* Unpacks n codes of `bits` starting at value index i0 of a row. */
void pt_cpu_unpack_codes(const uint8_t *row, int bits, int64_t i0, int64_t n, float *dst);

/* Ops implemented in the cpu_*.c files. */
pt_status pt_cpu_matmul(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert);
pt_status pt_cpu_matmul_rows(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w,
                             int64_t expert);
/* backend.h matmul_multi: one pool dispatch for all n weights on the decode
 * path (cpu_matmul.c); pt_cpu_multi_on() = 0 under PETREL_CPU_MULTI=0. */
pt_status pt_cpu_matmul_multi(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                              const pt_matrix *const *w, int rows);
int pt_cpu_multi_on(void);
/* Whether bf16-mode attention over bf16 caches takes the kernel table's
 * vdpbf16ps kernels (pt_cpu_lever.attn_dp, read once; 0 without AVX512-BF16). */
int pt_cpu_attn_dp_on(void);
/* Whether a prefill call's scores and P·V over bf16 caches in bf16 mode
 * take the kernel table's AMX kernels (pt_cpu_lever.attn_amx, read once; 0
 * without AMX-BF16 or the tile state). */
int pt_cpu_attn_amx_on(void);
/* Levers, settable for A/B measurements (cpu_matmul.c): a field < 0 is read
 * from the environment on first use. The kernel choices (xint, xgemm,
 * xgemm8, bgemm, attn_dp, attn_amx) change the order of f32 sums, so the last bits;
 * the others are bit-neutral. */
typedef struct {
    int multi;   /* matmul_multi as one dispatch (PETREL_CPU_MULTI, default 1) */
    int scale16; /* 4-bit bf16 decode kernel reads bf16 scales/biases itself (PETREL_CPU_SCALE16, default 1) */
    int xint;    /* 4/8-bit decode with x as integer pieces (PETREL_CPU_XINT, default: by CPU vendor, cpu_matmul.c;
                  * 0: the bf16 / f32 kernels) */
    int xgemm;   /* 4-bit prefill GEMM with x as integer pieces (PETREL_CPU_XGEMM, default 1; 0: the f32 GEMM) */
    int xgemm8;  /* 8-bit prefill GEMM with x as integer pieces (PETREL_CPU_XGEMM8, default 1; 0: the f32 GEMM) */
    int bgemm;   /* 4/8-bit prefill on the bf16 GEMM, ahead of the integer-piece GEMMs (PETREL_CPU_BGEMM, default: by
                  * CPU vendor, cpu_matmul.c) */
    int amx;     /* 4/8-bit prefill on the AMX bf16 GEMM where the CPU has AMX, ahead of the others, and the int8
                  * lever's prefill on AMX int8 tiles where it has AMX-INT8 (PETREL_CPU_AMX, default 1) */
    int split;   /* decode matvec rows: one contiguous share per thread with stealing (PETREL_CPU_SPLIT, default 1) or
                  * the guided claims from one counter (0); the same bits either way */
    int pfnta;   /* the AVX-512 decode kernels' software prefetch of the weight codes as prefetchnta instead of
                  * prefetcht0 (PETREL_CPU_PF_NTA, default: on for AMD, cpu_matmul.c); the same bits either way */
    int attn_amx; /* a prefill call's scores and P·V over a bf16 cache in bf16 mode on AMX tiles where the CPU
                   * has AMX-BF16 (attn_scores_amx, attn_pv_amx; PETREL_CPU_ATTN_AMX, default 1). NOT
                   * bit-neutral: the tile unit's sums of the same exact products (the rounding points are the
                   * same) */
    int attn_dp; /* bf16-mode attention over a bf16 cache on vdpbf16ps (attn_scores_dp, attn_pv_dp;
                  * PETREL_CPU_ATTN_DP, default: where vdpbf16ps issues at the FMA rate, cpu_matmul.c). NOT
                  * bit-neutral: another order of the f32 sums (the rounding points are the same) */
} pt_cpu_levers;
extern pt_cpu_levers pt_cpu_lever;
/* How often each quantized matmul path ran (cpu_matmul.c), so a test can
 * prove that a model-level parity run reached the kernel it means to check:
 * 4-bit decode tokens through the integer-piece kernel (XINT), the bf16
 * kernel (BF16) or the f32-x kernel (F32); 8-bit decode tokens through the
 * integer-piece kernel (XINT8) or the f32-x kernel (Q8F32); prefill calls
 * through the integer-piece GEMM (XGEMM: 4-bit, XGEMM8: 8-bit), the bf16
 * GEMM (BGEMM: 4- and 8-bit), its AMX form (AMX) or the f32 GEMM (GEMM); the
 * int8 lever's prefill calls through its VNNI GEMM (I8GEMM) or its AMX form
 * (AMX8); dense bf16 weights' prefill calls through the bf16 GEMM or its AMX
 * form (DENSE16; the f32 GEMM otherwise, not counted); attention's
 * score blocks and P·V runs on bf16 pairs (ATTN_DP_S, ATTN_DP_PV: per kernel
 * call, cpu_attention.c) and a prefill call's scores and P·V on AMX tiles
 * (ATTN_AMX: per scores call, ATTN_AMX_PV: per group of tokens); --fused-decode-attn's blocks on the factored
 * vdpbf16ps kernels (FUSED_DP: per block, attn_qkv_fused.c). Relaxed
 * atomics, counted once per call or token, never per row. */
enum {
    PT_CPU_PATH_XINT,
    PT_CPU_PATH_BF16,
    PT_CPU_PATH_F32,
    PT_CPU_PATH_XINT8,
    PT_CPU_PATH_Q8F32,
    PT_CPU_PATH_XGEMM,
    PT_CPU_PATH_XGEMM8,
    PT_CPU_PATH_BGEMM,
    PT_CPU_PATH_AMX,
    PT_CPU_PATH_GEMM,
    PT_CPU_PATH_I8GEMM,
    PT_CPU_PATH_AMX8,
    PT_CPU_PATH_DENSE16,
    PT_CPU_PATH_ATTN_DP_S,
    PT_CPU_PATH_ATTN_DP_PV,
    PT_CPU_PATH_ATTN_AMX,
    PT_CPU_PATH_ATTN_AMX_PV,
    PT_CPU_PATH_FUSED_DP,
    PT_CPU_PATH_N
};
extern _Atomic long pt_cpu_path_count[PT_CPU_PATH_N];
pt_status pt_cpu_moe_ffn(pt_backend *be, float *y, const float *x, int64_t T, const int32_t *idx,
                         const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                         const pt_matrix *down, pt_glu_kind act);
pt_status pt_cpu_embed(pt_backend *be, float *y, const int32_t *ids, int T, const pt_matrix *table, float scale);
pt_status pt_cpu_kv_quantize(pt_backend *be, pt_kv_layer *dst, const pt_kv_layer *src, int64_t p0, int64_t p1);
pt_status pt_cpu_attention(pt_backend *be, float *out, const float *q, int64_t T, const int32_t *pos,
                           const pt_kv_layer *kv, const pt_attn *p);
pt_status pt_cpu_kv_append(pt_backend *be, pt_kv_layer *kv, const float *k, const float *v, int64_t T,
                           const int32_t *pos);
/* cpu_rows.c: the multi-sequence decode ops (continuous batching) */
pt_status pt_cpu_kv_append_rows(pt_backend *be, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                const float *v, int64_t B, const int32_t *pos);
pt_status pt_cpu_attention_rows(pt_backend *be, float *out, const float *q, int64_t B, const int32_t *pos,
                                const pt_kv_layer *shape, void *const *kvp, const pt_attn *p);
pt_status pt_cpu_rms_norm(pt_backend *be, float *y, const float *x, float *residual, int64_t T, int64_t D,
                          const void *w, pt_ftype wtype, pt_rms_style style, float eps);
pt_status pt_cpu_rope(pt_backend *be, float *x, int64_t T, int n_heads, int head_dim, const int32_t *pos,
                      const pt_rope *rope);
pt_status pt_cpu_glu(pt_backend *be, float *y, const float *gate, const float *up, int64_t T, int64_t F, int64_t ld,
                     pt_glu_kind act);
pt_status pt_cpu_add(pt_backend *be, float *y, const float *a, const float *b, int64_t n);
pt_status pt_cpu_mul(pt_backend *be, float *y, const float *a, const float *b, int64_t n);
pt_status pt_cpu_add_scaled(pt_backend *be, float *y, const float *a, const float *b, float s, int64_t n);
pt_status pt_cpu_scale(pt_backend *be, float *y, const float *x, float s, int64_t n);
pt_status pt_cpu_softcap(pt_backend *be, float *y, const float *x, float cap, int64_t n);
pt_status pt_cpu_moe_route(pt_backend *be, int32_t *idx, float *weights, const float *logits, int64_t T,
                           const pt_moe_route *p);
pt_status pt_cpu_argmax(pt_backend *be, int32_t *out, const float *x, int64_t T, int64_t V);
/* Gated DeltaNet / gated attention ops (cpu_deltanet.c). */
pt_status pt_cpu_conv1d_silu(pt_backend *be, float *y, const float *x, int64_t T, int64_t C, int K, const void *w,
                             pt_ftype wtype, float *state);
pt_status pt_cpu_delta_rule(pt_backend *be, float *out, const float *qkv, const float *b, const float *a, int64_t T,
                            float *state, const pt_delta *p);
pt_status pt_cpu_rms_norm_gated(pt_backend *be, float *y, const float *x, const float *z, int64_t R, int64_t D,
                                const void *w, pt_ftype wtype, float eps);
pt_status pt_cpu_copy_rows(pt_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                           int64_t n);
pt_status pt_cpu_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g, int64_t n);

/* Activation functions in f32 (shared by glu and moe_ffn). */
float pt_cpu_silu(float g);
float pt_cpu_gelu_tanh(float g);

#endif
