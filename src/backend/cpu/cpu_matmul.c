/* CPU matmul (dense and MLX-quantized), the MoE expert gather, and the
 * embedding lookup: everything that reads weight rows.
 *
 * Work split: output rows (features) are divided into contiguous ranges, one
 * per thread; each output element y[t, n] is computed by one kernel call over
 * the whole input row, so the result does not depend on the thread count.
 *
 * Two paths, chosen by T only (never by the thread count):
 *   T < PT_CPU_DIRECT_T (decode): each weight row is read once per token by a
 *     fused kernel — dense dots convert bf16/f16 on the fly; quantized rows
 *     use the factored form y = Σ_g scale_g·Σ q·x + Σ_g bias_g·Σ x (the group
 *     sums of x computed once per call), so the codes are never dequantized.
 *   T >= PT_CPU_DIRECT_T (prefill): a packed GEMM (mm_gemm below) whose
 *     weights are dequantized once per call into k-major panels, so the
 *     dequantization cost is paid once per weight, not per token; 4-bit
 *     and 8-bit weights with bf16 activations on AVX-512 take the bf16 GEMM
 *     (pt_cpu_gemm_bf16, PETREL_CPU_BGEMM) or the integer GEMM with x as
 *     exact integer pieces (pt_cpu_gemm_xint, PETREL_CPU_XGEMM /
 *     PETREL_CPU_XGEMM8) instead, and the decode path's 4- and 8-bit bf16
 *     tokens the bf16 / f32 kernels or the integer-piece kernels
 *     (qdot_xint_avx512.c, PETREL_CPU_XINT); which of the two families is
 *     the default depends on the CPU (bf16_full_rate).
 * The two paths round differently, so a row's result depends on which one
 * ran; matmul_rows (continuous batching) always takes the decode path so a
 * batched row is bit-identical to the same row decoded alone. matmul_multi
 * (several weights over one x: q/k/v, gate/up) runs the decode path of all
 * its weights as one pool job (see pt_cpu_matmul_multi). */
#include "backend/cpu/cpu_internal.h"

#include "base/env.h"
#include "base/error.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PT_CPU_DIRECT_T 4

/* Selectable levers, for paired A/B measurements: read from the environment
 * once, each on unless its variable is "0" (PETREL_CPU_MULTI=0: matmul_multi
 * makes the separate calls; PETREL_CPU_SCALE16=0: the 4-bit bf16 decode
 * kernel takes scales/biases converted to f32 by the caller — both the same
 * bits either way; PETREL_CPU_XINT=0 / PETREL_CPU_XGEMM=0 / PETREL_CPU_XGEMM8=0:
 * the 4- and 8-bit decode kernels / the 4-bit / the 8-bit prefill GEMM without
 * x as integer pieces, which round differently; PETREL_CPU_SPLIT=0: the decode
 * matvecs' guided claims instead of one contiguous share per thread
 * (owned_run), the same bits); a field a dev benchmark has already set is
 * kept. PETREL_CPU_BGEMM (4/8-bit prefill on the bf16 GEMM, which rounds
 * differently from the integer-piece GEMMs) and PETREL_CPU_XINT default by
 * the CPU (bf16_full_rate); "1" forces either on, "0" off. PETREL_CPU_PF_NTA
 * (the decode kernels' code prefetch as prefetchnta, the same bits) defaults
 * on for AMD. */
pt_cpu_levers pt_cpu_lever = {.multi = -1,
                              .scale16 = -1,
                              .xint = -1,
                              .xgemm = -1,
                              .xgemm8 = -1,
                              .bgemm = -1,
                              .amx = -1,
                              .split = -1,
                              .pfnta = -1,
                              .attn_dp = -1,
                              .attn_amx = -1};

static void lever_read(int *field, const char *name, int def) {
    if (*field < 0) *field = pt_env_flag(name, def);
}

/* vdpbf16ps (AVX512-BF16) is not implied by the AVX-512 kernel table's
 * F/BW/VL/DQ: checked once. */
static int cpu_has_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
}

/* Whether vdpbf16ps issues at about the FMA rate, which decides between the
 * integer-piece kernels (qdot_xint_avx512.c, gemm_i8_avx512.c) and the bf16
 * ones for 4- and 8-bit weights with bf16 x. On Intel's AVX-512 BF16 cores
 * (Sapphire / Emerald Rapids) it issues at a quarter of the FMA rate (1.3 vs
 * 5.0-5.3 G/s per core), so the 4-bit bf16 decode kernel, four vdpbf16ps per
 * 128 weights and row, loses to six vpdpbusd; on AMD's (Zen 4 / Zen 5) at
 * about the FMA rate (6.4 vs 6.9 G/s on an EPYC Zen 5 core), and the bf16
 * kernels are the faster ones (bench/RESULTS.md, "CPU, eighth round"). Fixed
 * per machine (the vendor), never measured at run time, so a machine's
 * results never depend on timing. */
static int bf16_full_rate(void) { return cpu_has_bf16() && __builtin_cpu_is("amd"); }

static void levers_read(void) {
    lever_read(&pt_cpu_lever.multi, "PETREL_CPU_MULTI", 1);
    lever_read(&pt_cpu_lever.scale16, "PETREL_CPU_SCALE16", 1);
    lever_read(&pt_cpu_lever.xint, "PETREL_CPU_XINT", !bf16_full_rate());
    lever_read(&pt_cpu_lever.xgemm, "PETREL_CPU_XGEMM", 1);
    lever_read(&pt_cpu_lever.xgemm8, "PETREL_CPU_XGEMM8", 1);
    lever_read(&pt_cpu_lever.bgemm, "PETREL_CPU_BGEMM", bf16_full_rate());
    lever_read(&pt_cpu_lever.amx, "PETREL_CPU_AMX", 1);
    lever_read(&pt_cpu_lever.split, "PETREL_CPU_SPLIT", 1);
    __builtin_cpu_init();
    lever_read(&pt_cpu_lever.pfnta, "PETREL_CPU_PF_NTA", __builtin_cpu_is("amd"));
    lever_read(&pt_cpu_lever.attn_dp, "PETREL_CPU_ATTN_DP", bf16_full_rate());
    if (!cpu_has_bf16()) pt_cpu_lever.attn_dp = 0;
    lever_read(&pt_cpu_lever.attn_amx, "PETREL_CPU_ATTN_AMX", 1);
}

_Atomic long pt_cpu_path_count[PT_CPU_PATH_N];

static inline void path_count(int path, long n) {
    atomic_fetch_add_explicit(&pt_cpu_path_count[path], n, memory_order_relaxed);
}

static pthread_once_t levers_once = PTHREAD_ONCE_INIT;
static void levers_init(void) { pthread_once(&levers_once, levers_read); }

int pt_cpu_multi_on(void) {
    levers_init();
    return pt_cpu_lever.multi;
}

int pt_cpu_attn_dp_on(void) {
    levers_init();
    return pt_cpu_lever.attn_dp > 0;
}

int pt_cpu_attn_amx_on(void) {
    levers_init();
    return pt_cpu_lever.attn_amx > 0 && pt_cpu_amx_available();
}

/* ---- weight row access ---- */

static inline int64_t row_index(const pt_matrix *w, int64_t expert, int64_t row) { return expert * w->rows + row; }

const void *pt_cpu_dense_row(const pt_matrix *w, int64_t expert, int64_t row) {
    return (const char *)w->data + (size_t)row_index(w, expert, row) * (size_t)w->cols * pt_ftype_size(w->dtype);
}

const uint8_t *pt_cpu_qrow_codes(const pt_matrix *w, int64_t expert, int64_t row) {
    size_t bytes_per_row = (size_t)w->cols * (size_t)w->bits / 8;
    return (const uint8_t *)w->data + (size_t)row_index(w, expert, row) * bytes_per_row;
}

void pt_cpu_qrow_params(const pt_matrix *w, int64_t expert, int64_t row, float *sc, float *bi) {
    int64_t ng = w->cols / w->group_size;
    size_t off = (size_t)row_index(w, expert, row) * (size_t)ng * pt_ftype_size(w->dtype);
    pt_ft_load_row(w->dtype, (const char *)w->scales + off, sc, ng);
    pt_ft_load_row(w->dtype, (const char *)w->biases + off, bi, ng);
}

/* Value i of a row occupies bits [i·bits, (i+1)·bits) of the row's
 * little-endian bit stream; with bits <= 8 it spans at most two bytes, and
 * the second byte is read only when the value reaches into it (so the last
 * value of the last row never reads past the buffer). */
void pt_cpu_unpack_codes(const uint8_t *row, int bits, int64_t i0, int64_t n, float *dst) {
    if (bits == 8) { /* byte per value */
        for (int64_t i = 0; i < n; i++) dst[i] = (float)row[i0 + i];
        return;
    }
    if (bits == 4 && i0 % 2 == 0 && n % 2 == 0) { /* two values per byte, low nibble first */
        const uint8_t *c = row + i0 / 2;
        for (int64_t i = 0; i < n / 2; i++) {
            dst[2 * i] = (float)(c[i] & 15);
            dst[2 * i + 1] = (float)(c[i] >> 4);
        }
        return;
    }
    unsigned mask = (1u << bits) - 1u;
    for (int64_t i = 0; i < n; i++) {
        uint64_t bit = (uint64_t)(i0 + i) * (uint64_t)bits;
        uint64_t byte = bit >> 3;
        unsigned sh = (unsigned)(bit & 7);
        unsigned v = row[byte];
        if (sh + (unsigned)bits > 8) v |= (unsigned)row[byte + 1] << 8;
        dst[i] = (float)((v >> sh) & mask);
    }
}

void pt_cpu_dequant_row(const pt_matrix *w, int64_t expert, int64_t row, float *dst, float *sc, float *bi) {
    int gs = w->group_size;
    int64_t ng = w->cols / gs;
    pt_cpu_qrow_params(w, expert, row, sc, bi);
    pt_cpu_unpack_codes(pt_cpu_qrow_codes(w, expert, row), w->bits, 0, w->cols, dst);
    for (int64_t g = 0; g < ng; g++) {
        float s = sc[g], b = bi[g];
        for (int64_t j = g * gs; j < (g + 1) * gs; j++) dst[j] = s * dst[j] + b;
    }
}

static inline float bias_of(const pt_matrix *w, int64_t expert, int64_t row) {
    return w->bias ? pt_ft_load(w->bias_dtype, w->bias, row_index(w, expert, row)) : 0.0f;
}

/* ---- matmul ---- */

typedef struct {
    pt_cpu *c;
    float *y;
    const float *x;  /* [T, K] */
    const float *xq; /* quantized direct path: [T, K] x as the kernel wants it (permuted for 4-bit) */
    const float *xs; /* quantized direct path: [T, ng] group sums of x */
    const int8_t *xi8; /* int8 lever: [T, K] quantized x (arranged for 4-bit), else NULL */
    const float *xd;   /* int8 lever: [T, ng] quantization steps */
    int i8_128;        /* int8 lever, 4-bit: xi8 arranged for qdot4_x4_i8_128 */
    const uint16_t *xa; /* bf16 4-bit kernel: [T, K] x arranged (pt_cpu_arrange_x4_bf16), else NULL */
    const uint8_t *xok; /* [T]: token t's x is exactly bf16 (xa row t valid) */
    int all_bf16;       /* every xok[t] is set (and no int8 lever): the bf16 kernel for every token */
    const int8_t *xint; /* 4-bit integer-piece kernel: [T, 3·K] pieces (pt_cpu_arrange_xint), else NULL */
    const float *xstep; /* [T, ng] their steps */
    const uint8_t *xiok; /* [T]: token t takes the integer-piece kernel */
    const float *xpk;   /* prefill GEMM: x packed [tiles][K][12] */
    int64_t T;
    const pt_matrix *w;
    int64_t expert;
} mm_ctx;

static void mm_direct(void *arg, long n0, long n1, int ith) {
    mm_ctx *m = arg;
    const pt_matrix *w = m->w;
    const pt_cpu_kernels *k = m->c->k;
    pt_act_dtype act = m->c->base.act;
    int64_t N = w->rows, K = w->cols, T = m->T;
    float *tmp = pt_cpu_thread_scratch(m->c, ith);
    for (int64_t n = n0; n < n1; n++) {
        float bias = bias_of(w, m->expert, n);
        if (w->bits == 0) {
            const void *row = pt_cpu_dense_row(w, m->expert, n);
            for (int64_t t = 0; t < T; t++) {
                const float *xt = m->x + t * K;
                float v = w->dtype == PT_FT_F32    ? k->dot_f32(xt, row, K)
                          : w->dtype == PT_FT_BF16 ? k->dot_bf16(xt, row, K)
                                                   : k->dot_f16(xt, row, K);
                m->y[t * N + n] = pt_act_round(act, v + bias);
            }
            continue;
        }
        int64_t ng = K / w->group_size;
        float *sc = tmp, *bi = tmp + ng, *deq = tmp + 2 * ng;
        {
            /* 2/3/5/6 bits (4 and 8 go through mm_direct_q48): unpack the
             * codes, then the same factored form */
            pt_cpu_qrow_params(w, m->expert, n, sc, bi);
            pt_cpu_unpack_codes(pt_cpu_qrow_codes(w, m->expert, n), w->bits, 0, K, deq);
            for (int64_t t = 0; t < T; t++) {
                const float *xt = m->x + t * K;
                float v = 0.0f;
                for (int64_t g = 0; g < ng; g++)
                    v += sc[g] * k->dot_f32(xt + g * w->group_size, deq + g * w->group_size, w->group_size);
                v += k->dot_f32(bi, m->xs + t * ng, ng);
                m->y[t * N + n] = pt_act_round(act, v + bias);
            }
        }
    }
}

/* Prefill path: a packed GEMM. The tokens' x is packed once per call (by
 * the caller, shared by the threads) k-major in tiles of 12 tokens
 * ([tiles][K][12]). A thread's output rows are taken 32 at a time (a
 * panel): the panel's weights are dequantized/converted k-major for the
 * whole K ([K][32], per-thread scratch, L2-resident), then for each tile of
 * tokens the kernel keeps a 12 × 32 tile of sums in registers over all of K
 * (outer products: one weight vector load, 12 broadcasts per k) and writes
 * it to a small contiguous buffer, from which the bias and the rounding go
 * to y. Each output element is one sequential chain of multiply-adds over k,
 * whatever the tile, panel or thread split. (An earlier version walked K in
 * blocks of 256 with the partial sums resting in y: same bits, but y's rows,
 * N floats apart, alias in L1 and every block reloaded them; measured in
 * dev/README.md.) */
#define PT_GEMM_MR 12
/* K block of a panel: [512][32] floats (64 KiB) + 16 dequantized rows stay in L2
 * (a whole-K panel of the 8b shape's down projection, K = 14336, did not), and
 * so does the block of packed x the tiles stream once per panel (T·512 floats:
 * 1 MiB at T = 512; with 1024 it was 2 MiB, the whole L2). Measured
 * (bench_prefill_step 4 1 512 1, CPU time, five alternating pairs): pp512
 * 52.1–57.1 tok/s with 1024, 55.7–59.1 with 512, 51.6 with 256 (dev/README.md). */
#define PT_GEMM_KB 512

static size_t gemm_scratch(int64_t T, int64_t K) {
    /* per thread: panel [KB][32], the panel's sums [tiles·12][32], scales|biases [2·ng], 16 rows [16][KB] */
    int64_t KB = K < PT_GEMM_KB ? K : PT_GEMM_KB, tiles = (T + PT_GEMM_MR - 1) / PT_GEMM_MR;
    return (size_t)(KB * 32 + tiles * PT_GEMM_MR * 32 + 64 * (K / 32 + 1) + 16 * KB + 16);
}

/* Packs x [T, K] into [tiles][K][12] (tokens past T as zeros); 4-bit weights
 * take k in the codes' byte order (per 32-block, evens then odds), which
 * leaves every dot product intact. A pool job over tiles (it is a transpose:
 * serial, it was ~9% of a 2-thread prefill). */
typedef struct {
    float *xpk;
    const float *x;
    int64_t T, K;
    int perm4;
} packx_ctx;

static void gemm_pack_x(void *arg, long ti0, long ti1, int ith) {
    packx_ctx *p = arg;
    int64_t T = p->T, K = p->K;
    (void)ith;
    for (int64_t ti = ti0; ti < ti1; ti++) {
        float *dst = p->xpk + ti * PT_GEMM_MR * K;
        for (int64_t t = 0; t < PT_GEMM_MR; t++) {
            int64_t tt = ti * PT_GEMM_MR + t;
            const float *src = p->x + tt * K;
            if (tt < T && p->perm4)
                for (int64_t k0 = 0; k0 < K; k0 += 32)
                    for (int i = 0; i < 16; i++) {
                        dst[(k0 + i) * PT_GEMM_MR + t] = src[k0 + 2 * i];
                        dst[(k0 + 16 + i) * PT_GEMM_MR + t] = src[k0 + 2 * i + 1];
                    }
            else if (tt < T)
                for (int64_t kk = 0; kk < K; kk++) dst[kk * PT_GEMM_MR + t] = src[kk];
            else
                for (int64_t kk = 0; kk < K; kk++) dst[kk * PT_GEMM_MR + t] = 0.0f;
        }
    }
}

static void mm_gemm(void *arg, long n0, long n1, int ith) {
    mm_ctx *m = arg;
    const pt_matrix *w = m->w;
    const pt_cpu_kernels *k = m->c->k;
    pt_act_dtype act = m->c->base.act;
    int64_t N = w->rows, K = w->cols, T = m->T;
    if (n0 >= n1) return;
    int64_t tiles = (T + PT_GEMM_MR - 1) / PT_GEMM_MR;
    int64_t KB = K < PT_GEMM_KB ? K : PT_GEMM_KB;
    float *wp = pt_cpu_thread_scratch(m->c, ith); /* [KB][32] */
    float *cbuf = wp + KB * 32;                   /* [tiles·12][32] the panel's sums */
    float *prm = cbuf + tiles * PT_GEMM_MR * 32;  /* [32][2·ng]: the panel's scales | biases */
    float *tmp = prm + 64 * (K / 32 + 1);         /* [16][KB] rows, dequantized */
    int64_t ng = w->bits ? K / w->group_size : 0;
    size_t esz = pt_ftype_size(w->dtype);
    for (int64_t p0 = n0; p0 < n1; p0 += 32) {
        int nr = (int)(n1 - p0 < 32 ? n1 - p0 : 32);
        /* the panel's scales and biases, converted once (not once per K block) */
        for (int r = 0; w->bits && r < nr; r++)
            pt_cpu_qrow_params(w, m->expert, p0 + r, prm + (size_t)r * 2 * ng, prm + (size_t)r * 2 * ng + ng);
        for (int64_t kc0 = 0; kc0 < K; kc0 += KB) {
            int64_t kc = K - kc0 < KB ? K - kc0 : KB;
            /* 16 rows at a time: dequantized/converted row by row into tmp [16][kc], then
             * transposed into the panel (panel_t16) */
            for (int r0 = 0; r0 < 32; r0 += 16) {
                for (int r = 0; r < 16; r++) {
                    float *dst = tmp + (size_t)r * kc;
                    int64_t n = p0 + r0 + r;
                    if (r0 + r >= nr) {
                        memset(dst, 0, (size_t)kc * sizeof(float));
                    } else if (w->bits) {
                        const float *sc = prm + (size_t)(r0 + r) * 2 * ng, *bi = sc + ng;
                        const uint8_t *codes = pt_cpu_qrow_codes(w, m->expert, n);
                        if (w->bits == 4 || w->bits == 8) { /* SIMD dequantization */
                            k->dequant_q(dst, codes, kc0, kc, sc, bi, w->group_size, w->bits);
                        } else { /* blocks start on group boundaries (PT_GEMM_KB % 128 == 0) */
                            pt_cpu_unpack_codes(codes, w->bits, kc0, kc, dst);
                            for (int64_t g = kc0 / w->group_size; g < (kc0 + kc) / w->group_size; g++) {
                                float sg = sc[g], bg = bi[g];
                                for (int64_t kk = g * w->group_size; kk < (g + 1) * w->group_size; kk++)
                                    dst[kk - kc0] = sg * dst[kk - kc0] + bg;
                            }
                        }
                    } else {
                        pt_ft_load_row(w->dtype, (const char *)pt_cpu_dense_row(w, m->expert, n) + kc0 * esz, dst, kc);
                    }
                }
                if (kc % 16 == 0) k->panel_t16(wp, r0, tmp, kc);
                else pt_cpu_panel_t16_ref(wp, r0, tmp, kc);
            }
            for (int64_t ti = 0; ti < tiles; ti++) {
                int mr = (int)(T - ti * PT_GEMM_MR < PT_GEMM_MR ? T - ti * PT_GEMM_MR : PT_GEMM_MR);
                k->gemm_32(cbuf + ti * PT_GEMM_MR * 32, 32, m->xpk + ti * PT_GEMM_MR * K + kc0 * PT_GEMM_MR, wp, mr,
                           kc, kc0 == 0);
            }
        }
        for (int64_t t = 0; t < T; t++)
            for (int r = 0; r < nr; r++)
                m->y[t * N + p0 + r] = pt_act_round(act, cbuf[t * 32 + r] + bias_of(w, m->expert, p0 + r));
    }
}

/* Decode path for 4- and 8-bit weights: four rows per kernel call (x and its
 * group sums loaded once for the four), scales/biases converted to f32 per
 * block. A thread's last block repeats its last row to fill four; the
 * duplicate's result is dropped. */
static void mm_direct_q48(void *arg, long n0, long n1, int ith) {
    mm_ctx *m = arg;
    const pt_matrix *w = m->w;
    const pt_cpu_kernels *k = m->c->k;
    pt_act_dtype act = m->c->base.act;
    int64_t N = w->rows, K = w->cols, T = m->T, ng = K / w->group_size;
    float *tmp = pt_cpu_thread_scratch(m->c, ith);
    size_t pbytes = pt_ftype_size(w->dtype);
    /* every token on the bf16 kernel and bf16 parameters: the kernel variant that reads them as they
     * are stored (same bits; no conversion into scratch) */
    int p16 = m->all_bf16 && w->dtype == PT_FT_BF16 && k->qdot4_x4_bf16s && pt_cpu_lever.scale16 > 0;
    const float *sc[4] = {0}, *bi[4] = {0};
    if (m->c->isa == PT_ISA_AVX512) {
        /* the chunk's first pt_cpu_pf_offset bytes of codes: the kernels prefetch that far ahead of
         * the rows they read, so without this the start of every chunk (a thread's chunks are not
         * adjacent) waits on memory line by line */
        const uint8_t *c0 = pt_cpu_qrow_codes(w, m->expert, n0);
        size_t span = (size_t)(n1 - n0) * (size_t)K * (size_t)w->bits / 8;
        if (span > (size_t)pt_cpu_pf_offset(K, w->bits)) span = (size_t)pt_cpu_pf_offset(K, w->bits);
        if (pt_cpu_lever.pfnta > 0)
            for (size_t o = 0; o < span; o += 64) __builtin_prefetch(c0 + o, 0, 0);
        else
            for (size_t o = 0; o < span; o += 64) __builtin_prefetch(c0 + o, 0, 3);
    }
    /* scales and biases: two more streams, read 4 rows at a time before the kernel runs. The kernels
     * prefetch only the codes; without this every block waited on its scale and bias lines (two
     * demand misses to memory per 4 rows: ~30% of a 1-thread decode step, dev/README.md). They are
     * prefetched as far ahead (in rows) as the codes are. */
    size_t prow = (size_t)ng * pbytes; /* bytes of scales (and of biases) per row */
    int64_t pf_rows = pt_cpu_pf_offset(K, w->bits) / (K * w->bits / 8) + 4;
    const char *ps = (const char *)w->scales + (size_t)m->expert * (size_t)N * prow;
    const char *pb = (const char *)w->biases + (size_t)m->expert * (size_t)N * prow;
    for (int64_t nb = n0; nb < n1; nb += 4) {
        const uint8_t *codes[4];
        int nr = (int)(n1 - nb < 4 ? n1 - nb : 4);
        if (nb + pf_rows < N) { /* the 4 rows pf_rows ahead (never past the matrix) */
            size_t o = (size_t)(nb + pf_rows) * prow, e = o + 4 * prow, lim = (size_t)N * prow;
            if (e > lim) e = lim;
            for (size_t q = o & ~(size_t)63; q < e; q += 64) {
                __builtin_prefetch(ps + q, 0, 3);
                __builtin_prefetch(pb + q, 0, 3);
            }
        }
        const uint16_t *sc16[4], *bi16[4];
        for (int r = 0; r < 4; r++) {
            int64_t n = nb + (r < nr ? r : nr - 1);
            codes[r] = pt_cpu_qrow_codes(w, m->expert, n);
            size_t off = (size_t)(m->expert * N + n) * (size_t)ng * pbytes;
            if (p16) { /* the kernel reads the bf16 parameters itself */
                sc16[r] = (const uint16_t *)((const char *)w->scales + off);
                bi16[r] = (const uint16_t *)((const char *)w->biases + off);
                continue;
            }
            float *s = tmp + (size_t)r * 2 * ng, *b = s + ng;
            if (w->dtype == PT_FT_BF16) {
                k->cvt_bf16(s, (const uint16_t *)((const char *)w->scales + off), ng);
                k->cvt_bf16(b, (const uint16_t *)((const char *)w->biases + off), ng);
            } else pt_cpu_qrow_params(w, m->expert, n, s, b);
            sc[r] = s;
            bi[r] = b;
        }
        for (int64_t t = 0; t < T; t++) {
            float out[4];
            if (m->xint && m->xiok[t] && w->bits == 8) {
                if (p16)
                    pt_cpu_qdot8_x4_xints(out, m->xint + t * 3 * K, m->xstep + t * ng, m->xs + t * ng, codes, sc16,
                                          bi16, K, w->group_size);
                else
                    pt_cpu_qdot8_x4_xint(out, m->xint + t * 3 * K, m->xstep + t * ng, m->xs + t * ng, codes, sc, bi,
                                         K, w->group_size);
            } else if (m->xint && m->xiok[t] && p16)
                pt_cpu_qdot4_x4_xints(out, m->xint + t * 3 * K, m->xstep + t * ng, m->xs + t * ng, codes, sc16, bi16,
                                      K, w->group_size);
            else if (m->xint && m->xiok[t])
                pt_cpu_qdot4_x4_xint(out, m->xint + t * 3 * K, m->xstep + t * ng, m->xs + t * ng, codes, sc, bi, K,
                                     w->group_size);
            else if (p16)
                k->qdot4_x4_bf16s(out, m->xa + t * K, m->xs + t * ng, codes, sc16, bi16, K, w->group_size);
            else if (m->xi8 && m->i8_128)
                k->qdot4_x4_i8_128(out, m->xi8 + t * K, m->xd + t * ng, m->xs + t * ng, codes, sc, bi, K,
                                   w->group_size);
            else if (m->xi8 && w->bits == 4)
                k->qdot4_x4_i8(out, m->xi8 + t * K, m->xd + t * ng, m->xs + t * ng, codes, sc, bi, K, w->group_size);
            else if (m->xi8)
                k->qdot8_x4_i8(out, m->xi8 + t * K, m->xd + t * ng, m->xs + t * ng, codes, sc, bi, K, w->group_size);
            else if (m->xa && m->xok[t])
                k->qdot4_x4_bf16(out, m->xa + t * K, m->xs + t * ng, codes, sc, bi, K, w->group_size);
            else if (w->bits == 4) k->qdot4_x4(out, m->xq + t * K, m->xs + t * ng, codes, sc, bi, K, w->group_size);
            else k->qdot8_x4(out, m->xq + t * K, m->xs + t * ng, codes, sc, bi, K, w->group_size);
            for (int r = 0; r < nr; r++) m->y[t * N + nb + r] = pt_act_round(act, out[r] + bias_of(w, m->expert, nb + r));
        }
    }
}

/* Guided split of the decode matvec's rows (PETREL_CPU_SPLIT=0; the
 * default is the contiguous split below). pt_pool_for cuts a job into ~4
 * equal chunks per thread; at the end of a matvec one thread then idles for
 * up to a whole chunk (1/8 of the op with 2 threads) while the other
 * finishes, and a memory-bound op run by one thread reads slower. Here each
 * pool chunk instead claims rows from one shared counter, each claim a
 * fraction of what is left (remaining / (4·nth), at least PT_GUIDED_MIN_BYTES
 * of weights, a multiple of the grain), so the last claims are small and the
 * threads finish together; a thread descheduled mid-op still delays the job
 * by one claim at most (the others keep claiming), and the first claims are
 * no larger than pt_pool_for's equal chunks were. Claims advance through
 * the rows in order, so a claim's rows follow the previous claim's, which the
 * kernels' prefetch (running pt_cpu_pf_offset bytes ahead) has already
 * started to fetch. Which thread computes a row never changes its bits. */
#define PT_GUIDED_MIN_BYTES (24 << 10)

typedef struct {
    _Atomic long next;
    long n, grain, min_take;
    int nth;
    pt_pool_range_fn fn;
    void *ctx;
} guided_ctx;

static void guided_run(void *arg, long u0, long u1, int ith) {
    guided_ctx *g = arg;
    (void)u0;
    (void)u1;
    for (;;) {
        long cur = atomic_load_explicit(&g->next, memory_order_relaxed);
        long rem = g->n - cur;
        if (rem <= 0) return;
        long take = (rem + 4L * g->nth - 1) / (4L * g->nth);
        if (take < g->min_take) take = g->min_take;
        take = (take + g->grain - 1) / g->grain * g->grain;
        if (take > rem) take = rem;
        if (atomic_compare_exchange_weak_explicit(&g->next, &cur, cur + take, memory_order_relaxed,
                                                  memory_order_relaxed))
            g->fn(g->ctx, cur, cur + take, ith);
    }
}

/* The default split (PETREL_CPU_SPLIT=0 selects the guided claims above,
 * whose claims interleave between the threads so each claim starts a new
 * stream): each thread owns one contiguous
 * share of the rows ([lo, hi) in one atomic word, lo in the low 32 bits)
 * and claims it from the front, so its rows stream in order and its
 * prefetch runs into rows it will read itself; a thread whose share is done
 * steals the back half of the first share that has rows left (in ith
 * order), so a descheduled thread still delays the op by at most what it
 * has claimed. The owner's claims are a quarter of what is left of its
 * share (at least min_take rows), so the rows a thief can take shrink
 * towards the end. Which thread computes a row never changes its bits. */
#define PT_SPLIT_MAX 64

typedef struct {
    _Atomic uint64_t r[PT_SPLIT_MAX];
    long grain, min_take;
    int nth;
    pt_pool_range_fn fn;
    void *ctx;
} owned_ctx;

static void owned_run(void *arg, long u0, long u1, int ith) {
    owned_ctx *o = arg;
    (void)u0;
    (void)u1;
    for (;;) { /* the own share, from the front */
        uint64_t v = atomic_load_explicit(&o->r[ith], memory_order_relaxed);
        long lo = (long)(v & 0xffffffffu), hi = (long)(v >> 32);
        if (lo >= hi) break;
        long take = (hi - lo) / 4;
        if (take < o->min_take) take = o->min_take;
        take = (take + o->grain - 1) / o->grain * o->grain;
        if (take > hi - lo) take = hi - lo;
        if (atomic_compare_exchange_weak_explicit(&o->r[ith], &v, v + (uint64_t)take, memory_order_relaxed,
                                                  memory_order_relaxed))
            o->fn(o->ctx, lo, lo + take, ith);
    }
    for (int k = 1; k < o->nth; k++) { /* then the back halves of the others' shares */
        int vi = (ith + k) % o->nth;
        for (;;) {
            uint64_t v = atomic_load_explicit(&o->r[vi], memory_order_relaxed);
            long lo = (long)(v & 0xffffffffu), hi = (long)(v >> 32);
            if (lo >= hi) break;
            long take = (hi - lo) / 2;
            take = (take + o->grain - 1) / o->grain * o->grain;
            if (take < o->grain) take = o->grain;
            if (take > hi - lo) take = hi - lo;
            uint64_t nv = ((uint64_t)(hi - take) << 32) | (uint64_t)lo;
            if (atomic_compare_exchange_weak_explicit(&o->r[vi], &v, nv, memory_order_relaxed, memory_order_relaxed))
                o->fn(o->ctx, hi - take, hi, ith);
        }
    }
}

static void pool_for_guided(pt_cpu *c, long n, long grain, size_t row_bytes, pt_pool_range_fn fn, void *ctx) {
    int nth = pt_pool_size(c->pool);
    if (nth == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    if (pt_cpu_lever.split > 0 && nth <= PT_SPLIT_MAX && n < (1L << 31)) {
        owned_ctx o = {.grain = grain, .nth = nth, .fn = fn, .ctx = ctx};
        o.min_take = (long)(PT_GUIDED_MIN_BYTES / (row_bytes ? row_bytes : 1));
        if (o.min_take < grain) o.min_take = grain;
        long share = ((n + nth - 1) / nth + grain - 1) / grain * grain;
        for (int i = 0; i < nth; i++) {
            long lo = i * share < n ? i * share : n, hi = lo + share < n ? lo + share : n;
            atomic_init(&o.r[i], ((uint64_t)hi << 32) | (uint64_t)lo);
        }
        /* 4 units per thread, as below: any thread that wakes up runs its share */
        pt_pool_for(c->pool, 4L * nth, 1, owned_run, &o);
        return;
    }
    guided_ctx g = {.n = n, .grain = grain, .nth = nth, .fn = fn, .ctx = ctx};
    atomic_init(&g.next, 0);
    g.min_take = (long)(PT_GUIDED_MIN_BYTES / (row_bytes ? row_bytes : 1));
    if (g.min_take < grain) g.min_take = grain;
    /* 4 units per thread (pt_pool_for makes each unit its own chunk): any thread that wakes up joins */
    pt_pool_for(c->pool, 4L * nth, 1, guided_run, &g);
}

const char *pt_backend_cpu_quant_paths(const pt_backend *be) {
    if (!be || strcmp(be->ops->name, "cpu")) return NULL;
    const pt_cpu *c = (const pt_cpu *)be;
    if (c->isa != PT_ISA_AVX512 || !pt_cpu_gemm_i8_available()) return NULL;
    levers_init();
    if (c->int8_act)
        return pt_cpu_lever.amx > 0 && pt_cpu_amx_i8_available() ? "int8 x: decode vnni, prefill amx int8"
                                                                  : "int8 x: decode vnni, prefill vnni";
    if (c->base.act != PT_ACT_BF16) return NULL;
    static const char *const table[2][4] = {
        {"decode bf16, prefill amx", "decode bf16, prefill bf16", "decode bf16, prefill int pieces",
         "decode bf16, prefill f32"},
        {"decode int pieces, prefill amx", "decode int pieces, prefill bf16", "decode int pieces, prefill int pieces",
         "decode int pieces, prefill f32"}};
    int bf = cpu_has_bf16();
    int pre = bf && pt_cpu_lever.amx > 0 && pt_cpu_amx_available() ? 0
              : bf && pt_cpu_lever.bgemm > 0                         ? 1
              : pt_cpu_lever.xgemm > 0                               ? 2
                                                                     : 3;
    return table[pt_cpu_lever.xint > 0][pre];
}

/* xs[t·ng + g] = Σ_{j∈g} x[t·K + j], sequential (the same sums for every
 * path): the kernel table's group_sums where it has one (the same additions
 * in the same order, vectorized across groups), else pt_cpu_group_sums_ref. */
static void group_sums(const pt_cpu *c, float *xs, const float *x, int64_t T, int64_t K, int gs) {
    int64_t ng = K / gs;
    for (int64_t t = 0; t < T; t++) {
        if (c->k->group_sums) c->k->group_sums(xs + t * ng, x + t * K, K, gs);
        else pt_cpu_group_sums_ref(xs + t * ng, x + t * K, K, gs);
    }
}

/* The int8 lever's activations (pt_cpu_quant_i8_ref: per token and weight
 * group, symmetric steps xd = max|x| / 127 and xi = x / xd rounded to nearest
 * even), by the kernel table's quant_i8 where it has one (the same bits). */
static void quantize_i8(const pt_cpu *c, int8_t *xi, float *xd, const float *x, int64_t T, int64_t K, int gs) {
    int64_t ng = K / gs;
    for (int64_t t = 0; t < T; t++) {
        if (c->k->quant_i8) c->k->quant_i8(xi + t * K, xd + t * ng, x + t * K, K, gs);
        else pt_cpu_quant_i8_ref(xi + t * K, xd + t * ng, x + t * K, K, gs);
    }
}

/* x for a prefill GEMM that takes exact bf16 values, and its group sums, for
 * tokens [t0, t1) as a pool job: as bf16 (xb [T, K]: the bf16 and AMX GEMMs)
 * when xb is set, else as the integer pieces of pt_cpu_arrange_xint_rows (xq
 * [T, 3K] bytes, steps st [T, ng]: the integer-piece GEMM). A token whose x
 * the layout refuses (not finite, not exactly bf16; a subnormal for bf16,
 * which vdpbf16ps reads as zero) sets bad, and the call then takes another
 * GEMM — decided from the call's own tokens. */
typedef struct {
    const pt_cpu *c;
    float *xs;
    uint16_t *xb;
    int8_t *xq;
    float *st;
    const float *x;
    int64_t K;
    int gs;
    int dense; /* dense weights: the sums are zeros (below) */
    atomic_int bad;
} gx_ctx;

static void gemm_x_job(void *arg, long t0, long t1, int ith) {
    gx_ctx *q = arg;
    int64_t K = q->K, ng = K / q->gs;
    (void)ith;
    for (long t = t0; t < t1; t++) {
        int ok = q->xb ? pt_cpu_x_bf16_exact(q->xb + t * K, q->x + t * K, K)
                       : pt_cpu_arrange_xint_rows(q->xq + t * 3 * K, q->st + t * ng, q->x + t * K, K, q->gs);
        if (!ok) {
            atomic_store_explicit(&q->bad, 1, memory_order_relaxed);
            return;
        }
    }
    /* dense weights: the bias term (bias 0) gets zeros, not Σx, so 0·Σx cannot make a NaN of an overflowed sum */
    if (q->dense) memset(q->xs + t0 * ng, 0, sizeof(float) * (size_t)((t1 - t0) * ng));
    else group_sums(q->c, q->xs + t0 * ng, q->x + t0 * K, t1 - t0, K, q->gs);
}

/* The 512-bit int8 kernel: AVX-512 VNNI and K % 128 == 0. */
static int k128_ok(const pt_cpu *c, int64_t K) {
    return c->k->qdot4_x4_i8_128 && K % 128 == 0 && pt_cpu_gemm_i8_available();
}

/* group_sums + quantize_i8 for tokens [t0, t1) as a pool job (prefill). */
typedef struct {
    const pt_cpu *c;
    float *xs, *xd;
    int8_t *xi;
    const float *x;
    int64_t K;
    int gs;
} qx_ctx;

static void quantize_job(void *arg, long t0, long t1, int ith) {
    qx_ctx *q = arg;
    int64_t ng = q->K / q->gs;
    (void)ith;
    group_sums(q->c, q->xs + t0 * ng, q->x + t0 * q->K, t1 - t0, q->K, q->gs);
    quantize_i8(q->c, q->xi + t0 * q->K, q->xd + t0 * ng, q->x + t0 * q->K, t1 - t0, q->K, q->gs);
}

/* The decode path's inputs, computed once per call from m->x (T tokens of
 * K values) for weights of m->w's bits and group size: the group sums, and
 * x in the layout the kernel takes (permuted for 4-bit f32, arranged for the
 * bf16 kernel, quantized for the int8 lever), in the shared scratch. Only
 * bits and the group size matter, so weights sharing them (matmul_multi)
 * share one preparation. */
static pt_status direct_prep(pt_cpu *c, mm_ctx *m) {
    const pt_matrix *w = m->w;
    const float *x = m->x;
    int64_t T = m->T, K = w->cols;
    int64_t ng = w->bits ? K / w->group_size : 0;
    /* shared: x permuted [T·K], group sums [T·ng], int8 lever: steps [T·ng], int8 x + its arrangement
     * [2·T·K bytes]; bf16 kernel: arranged x
     * [T·K bf16] + per-token flags [T bytes]; integer pieces: [3·T·K bytes] + steps [T·ng] + flags [T bytes] */
    PT_TRY(pt_cpu_need_scratch(c, (size_t)(8 * ng + K),
                               (size_t)(T * (K + 2 * ng + K / 2 + K / 2 + 2) + T * ((3 * K + 3) / 4 + ng + 1))));
    int all_bf16 = 0; /* every token takes the bf16 kernel: the permuted f32 x is never read */
    if ((w->bits == 4 || w->bits == 8) && !c->int8_act && c->base.act == PT_ACT_BF16 && c->isa == PT_ISA_AVX512 &&
        K % 128 == 0 && pt_cpu_lever.xint > 0 && pt_cpu_gemm_i8_available()) {
        /* the integer-piece kernel (4- or 8-bit) for each token whose x is finite and exactly bf16,
         * decided from its own values (so batching never changes a row); the others below */
        int8_t *xq = (int8_t *)(c->xbuf + T * (2 * K + 2 * ng + 2));
        float *st = (float *)(xq + T * 3 * K);
        uint8_t *ok = (uint8_t *)(st + T * ng);
        int all = 1, any = 0;
        for (int64_t t = 0; t < T; t++) {
            ok[t] = (uint8_t)(w->bits == 4 ? pt_cpu_arrange_xint(xq + t * 3 * K, st + t * ng, x + t * K, K, w->group_size)
                                           : pt_cpu_arrange_xint8(xq + t * 3 * K, st + t * ng, x + t * K, K, w->group_size));
            all &= ok[t];
            any |= ok[t];
        }
        if (any) {
            m->xint = xq;
            m->xstep = st;
            m->xiok = ok;
        }
        if (all) { /* nothing else to prepare but the group sums */
            float *xs = c->xbuf + T * K;
            group_sums(c, xs, x, T, K, w->group_size);
            m->xs = xs;
            m->all_bf16 = 1;
            return PT_OK;
        }
    }
    if (w->bits == 4 && !c->int8_act && c->base.act == PT_ACT_BF16 && c->k->qdot4_x4_bf16 && K % 128 == 0 &&
        cpu_has_bf16()) {
        /* bf16 mode: x is normally exactly bf16 (every op rounds its outputs); a token whose x is
         * not keeps the f32 kernel, decided from its own values, so batching never changes a row */
        uint16_t *xa = (uint16_t *)(c->xbuf + T * (K + 2 * ng + K / 2));
        uint8_t *xok = (uint8_t *)(xa + T * K);
        int any = 0;
        all_bf16 = 1;
        for (int64_t t = 0; t < T; t++) {
            xok[t] = (uint8_t)pt_cpu_arrange_x4_bf16(xa + t * K, x + t * K, K);
            any |= xok[t];
            all_bf16 &= xok[t];
        }
        if (any) {
            m->xa = xa;
            m->xok = xok;
        }
        m->all_bf16 = all_bf16;
    }
    if (w->bits) {
        float *xp = c->xbuf, *xs = c->xbuf + T * K;
        if (w->bits == 4 && !c->int8_act && !all_bf16)
            for (int64_t t = 0; t < T; t++) pt_cpu_permute_x4(xp + t * K, x + t * K, K);
        group_sums(c, xs, x, T, K, w->group_size);
        if (w->bits == 4) m->xq = xp;
        m->xs = xs;
        if (c->int8_act && (w->bits == 4 || w->bits == 8)) {
            float *xd = xs + T * ng;
            int8_t *xi = (int8_t *)(xd + T * ng), *xa = xi + T * K;
            quantize_i8(c, xi, xd, x, T, K, w->group_size);
            m->i8_128 = w->bits == 4 && k128_ok(c, K);
            if (w->bits == 4)
                for (int64_t t = 0; t < T; t++) {
                    if (m->i8_128) pt_cpu_arrange_x4_i8_128(xa + t * K, xi + t * K, K);
                    else pt_cpu_arrange_x4_i8(xa + t * K, xi + t * K, K);
                }
            m->xi8 = w->bits == 4 ? xa : xi;
            m->xd = xd;
        }
    }
    return PT_OK;
}

/* Counts the 4- and 8-bit decode tokens of a prepared call by the kernel
 * mm_direct_q48 gives them (pt_cpu_path_count). */
static void count_decode(const mm_ctx *m) {
    if (m->w->bits == 8 && !m->xi8) {
        long xi = 0;
        for (int64_t t = 0; t < m->T; t++) xi += m->xint && m->xiok[t];
        if (xi) path_count(PT_CPU_PATH_XINT8, xi);
        if (m->T - xi) path_count(PT_CPU_PATH_Q8F32, (long)(m->T - xi));
        return;
    }
    if (m->w->bits != 4 || m->xi8) return;
    long xi = 0, bf = 0;
    for (int64_t t = 0; t < m->T; t++) {
        if (m->xint && m->xiok[t]) xi++;
        else if (m->xa && m->xok[t]) bf++;
    }
    if (xi) path_count(PT_CPU_PATH_XINT, xi);
    if (bf) path_count(PT_CPU_PATH_BF16, bf);
    if (m->T - xi - bf) path_count(PT_CPU_PATH_F32, (long)(m->T - xi - bf));
}

/* A prefill GEMM's x, prepared once in the shared scratch (c->xbuf) for
 * weights of one bits, group size and K: by mm_run for its weight, and by
 * matmul_multi once for all its weights (each GEMM then reads the very x
 * its own call would have prepared, so the outputs are the same bits). */
enum { PF_NONE, PF_I8, PF_BF16, PF_XINT };
typedef struct {
    int kind, amx, dense; /* dense: dense bf16 weights on PF_BF16 (one group of K, xs zeros) */
    float *xs, *xd, *st;
    int8_t *xi;
    uint16_t *xb;
} pf_x;

/* Chooses the prefill GEMM for w (T >= PT_CPU_DIRECT_T, not matmul_rows) and
 * prepares x for it: the int8 lever's VNNI GEMM (its AMX form where the CPU
 * has AMX-INT8: the same bits); else with bf16 activations
 * on AVX-512 the AMX or bf16 GEMM, or the integer-piece GEMM when x is not
 * exactly bf16 or those are off; dense bf16 weights with bf16 activations
 * on the AMX or bf16 GEMM as one group of K values (gemm_bf16_avx512.c);
 * PF_NONE: none of them (the caller takes the decode kernels or the f32
 * GEMM). */
static pt_status prefill_prep(pt_cpu *c, const float *x, int64_t T, const pt_matrix *w, pf_x *p) {
    memset(p, 0, sizeof *p);
    const int64_t K = w->cols;
    const int gs = w->group_size;
    const int q48 = w->bits == 4 || w->bits == 8, dense = w->bits == 0 && w->dtype == PT_FT_BF16;
    if ((!q48 && !dense) || c->isa != PT_ISA_AVX512 || !pt_cpu_gemm_i8_available()) return PT_OK;
    if (c->int8_act && q48) {
        int64_t ng = K / gs;
        levers_init();
        /* the AMX int8 form where the CPU has it (the same bits): x in whole blocks of 32 tokens */
        int amx = pt_cpu_lever.amx > 0 && (gs == 32 || gs == 64 || gs == 128) && K % gs == 0 &&
                  pt_cpu_amx_i8_available();
        int64_t Tx = amx ? (T + 31) / 32 * 32 : T;
        /* shared: group sums [T·ng], steps [T·ng], int8 x [Tx·K bytes] */
        PT_TRY(pt_cpu_need_scratch(c, amx ? pt_cpu_gemm_amx_i8_scratch(K, ng) : pt_cpu_gemm_i8_scratch(K, ng),
                                   (size_t)(T * 2 * ng + Tx * K / 4 + 1)));
        p->xs = c->xbuf, p->xd = p->xs + T * ng;
        p->xi = (int8_t *)(p->xd + T * ng);
        qx_ctx q = {.c = c, .xs = p->xs, .xd = p->xd, .xi = p->xi, .x = x, .K = K, .gs = gs};
        pt_pool_for(c->pool, (long)T, 8, quantize_job, &q);
        memset(p->xi + T * K, 0, (size_t)((Tx - T) * K));
        p->kind = PF_I8, p->amx = amx;
        return PT_OK;
    }
    /* dense bf16: one group of all K (whole AMX k steps of 32) */
    if (c->base.act != PT_ACT_BF16 || (dense ? K % 32 : (!(gs == 32 || gs == 64 || gs == 128) || K % gs)))
        return PT_OK;
    levers_init();
    const int64_t bgs = pt_cpu_bgemm_gs(w), ng = K / bgs;
    int amx = pt_cpu_lever.amx > 0 && pt_cpu_amx_available();
    if ((amx || pt_cpu_lever.bgemm > 0) && cpu_has_bf16()) {
        /* prefill on the AMX or the AVX-512 bf16 GEMM; shared: group sums [T·ng], x as bf16 [T32·K]
         * (T32: T rounded up to whole 32-token blocks for the AMX tiles, the rows past T zero) */
        int64_t T32 = (T + 31) / 32 * 32;
        PT_TRY(pt_cpu_need_scratch(c, amx ? pt_cpu_gemm_amx_scratch(K, ng) : pt_cpu_gemm_bf16_scratch(K, ng),
                                   (size_t)(T * ng + T32 * K / 2 + 16)));
        gx_ctx q = {.c = c, .xs = c->xbuf, .xb = (uint16_t *)(c->xbuf + T * ng), .x = x, .K = K, .gs = (int)bgs,
                    .dense = dense};
        atomic_init(&q.bad, 0);
        pt_pool_for(c->pool, (long)T, 8, gemm_x_job, &q);
        if (!atomic_load(&q.bad)) {
            memset(q.xb + T * K, 0, sizeof(uint16_t) * (size_t)((T32 - T) * K));
            p->kind = PF_BF16, p->amx = amx, p->dense = dense, p->xs = q.xs, p->xb = q.xb;
            return PT_OK;
        }
    }
    if (dense) return PT_OK; /* the integer-piece GEMM reads codes */
    if (w->bits == 4 ? pt_cpu_lever.xgemm > 0 : pt_cpu_lever.xgemm8 > 0) {
        /* prefill with x as exact integer pieces (the VNNI GEMM); shared: group sums [T·ng],
         * steps [T·ng], pieces [3·T·K bytes] */
        PT_TRY(pt_cpu_need_scratch(c, pt_cpu_gemm_i8_scratch(K, ng), (size_t)(T * (2 * ng + 3 * K / 4 + 1))));
        gx_ctx q = {.c = c, .xs = c->xbuf, .st = c->xbuf + T * ng, .xq = (int8_t *)(c->xbuf + 2 * T * ng), .x = x,
                    .K = K, .gs = gs};
        atomic_init(&q.bad, 0);
        pt_pool_for(c->pool, (long)T, 8, gemm_x_job, &q);
        if (!atomic_load(&q.bad)) p->kind = PF_XINT, p->xs = q.xs, p->st = q.st, p->xi = q.xq;
    }
    return PT_OK;
}

/* The GEMM prefill_prep chose, for weight w (same bits, group size and K as
 * the one x was prepared for). */
static void prefill_gemm(pt_cpu *c, float *y, int64_t T, const pt_matrix *w, int64_t expert, const pf_x *p) {
    switch (p->kind) {
    case PF_I8:
        if (p->amx) pt_cpu_gemm_amx_i8(c, y, p->xi, p->xd, p->xs, T, w, expert);
        else pt_cpu_gemm_i8(c, y, p->xi, p->xd, p->xs, T, w, expert);
        path_count(p->amx ? PT_CPU_PATH_AMX8 : PT_CPU_PATH_I8GEMM, 1);
        break;
    case PF_BF16:
        if (p->amx) pt_cpu_gemm_amx(c, y, p->xb, p->xs, T, w, expert);
        else pt_cpu_gemm_bf16(c, y, p->xb, p->xs, T, w, expert);
        path_count(p->dense ? PT_CPU_PATH_DENSE16 : p->amx ? PT_CPU_PATH_AMX : PT_CPU_PATH_BGEMM, 1);
        break;
    case PF_XINT:
        pt_cpu_gemm_xint(c, y, p->xi, p->st, p->xs, T, w, expert);
        path_count(w->bits == 4 ? PT_CPU_PATH_XGEMM : PT_CPU_PATH_XGEMM8, 1);
        break;
    }
}

/* direct: the decode kernels for every row (any T); else chosen by T. Under
 * the int8 lever, 4/8-bit prefill takes the VNNI GEMM (gemm_i8_avx512.c) on
 * AVX-512, else the decode kernels, so the lever's formula holds for every T
 * and ISA. */
static pt_status mm_run(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert,
                        int direct) {
    pt_cpu *c = pt_cpu_of(be);
    PT_ASSERT(T >= 0 && expert >= 0 && (expert == 0 || expert < w->n_experts));
    if (T == 0) return PT_OK;
    int64_t K = w->cols;
    mm_ctx m = {.c = c, .y = y, .x = x, .xq = x, .T = T, .w = w, .expert = expert};
    int i8 = c->int8_act && (w->bits == 4 || w->bits == 8);
    if (!direct && T >= PT_CPU_DIRECT_T) {
        pf_x p;
        PT_TRY(prefill_prep(c, x, T, w, &p));
        if (p.kind != PF_NONE) {
            prefill_gemm(c, y, T, w, expert, &p);
            return PT_OK;
        }
    }
    if (direct || T < PT_CPU_DIRECT_T || i8) {
        levers_init();
        PT_TRY(direct_prep(c, &m));
        count_decode(&m);
        /* chunks of 4 rows: the 4-row kernels never pad a chunk but the last */
        if (w->bits == 4 || w->bits == 8)
            pool_for_guided(c, (long)w->rows, 4, (size_t)K * (size_t)w->bits / 8, mm_direct_q48, &m);
        else pt_pool_for(c->pool, (long)w->rows, 4, mm_direct, &m);
    } else {
        int64_t tiles = (T + PT_GEMM_MR - 1) / PT_GEMM_MR;
        /* shared: x packed [tiles][K][12] */
        PT_TRY(pt_cpu_need_scratch(c, gemm_scratch(T, K), (size_t)(tiles * PT_GEMM_MR * K)));
        packx_ctx px = {.xpk = c->xbuf, .x = x, .T = T, .K = K, .perm4 = w->bits == 4};
        pt_pool_for(c->pool, (long)tiles, 1, gemm_pack_x, &px);
        m.xpk = c->xbuf;
        /* chunks of 32-row panels: only the last chunk has a narrow panel */
        pt_pool_for(c->pool, (long)w->rows, 32, mm_gemm, &m);
        if (w->bits) path_count(PT_CPU_PATH_GEMM, 1);
    }
    return PT_OK;
}

pt_status pt_cpu_matmul(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int64_t expert) {
    return mm_run(be, y, x, T, w, expert, 0);
}

/* Batch-invariant matmul (backend.h matmul_rows): every T goes through the
 * decode kernels above, whose per-row arithmetic is the T == 1 arithmetic
 * (the token loop is inside the weight-row loop, so a block of weight rows is
 * read from memory once and reused from cache by all T tokens). */
pt_status pt_cpu_matmul_rows(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w,
                             int64_t expert) {
    return mm_run(be, y, x, T, w, expert, 1);
}

/* matmul_multi (backend.h): several weights over one x. On the decode path
 * (T < PT_CPU_DIRECT_T, or rows == 1: matmul_rows) with 4/8-bit weights of
 * one bits/group size, x is prepared once and the rows of all the weights
 * go through ONE guided pool job: the global row space is the weights' rows
 * one after another, each padded to a multiple of 4 so no 4-row block
 * straddles two weights; a claim is cut at the weight boundaries and each
 * piece runs mm_direct_q48 on its own weight. Every row is computed by the
 * same kernel call as in a separate matmul (its 4-row block, same x
 * layouts), so each y[i] is bit-identical to matmul / matmul_rows of w[i].
 * What it saves per layer of a decode step: 3 → 1 (q/k/v) and 2 → 1
 * (gate/up) pool dispatches and x preparations, and the idle tail at the
 * end of every separate matvec. Other shapes (prefill GEMM, other bits,
 * mixed bits or group sizes): the separate calls. */
typedef struct {
    mm_ctx m[4];
    long start[5]; /* global index of weight i's first row; start[n] = the end */
    int n;
} mm_multi_ctx;

static void mm_multi_run(void *arg, long r0, long r1, int ith) {
    mm_multi_ctx *mc = arg;
    for (int i = 0; i < mc->n; i++) {
        long lo = r0 > mc->start[i] ? r0 : mc->start[i], hi = r1 < mc->start[i + 1] ? r1 : mc->start[i + 1];
        if (lo >= hi) continue;
        long n0 = lo - mc->start[i], n1 = hi - mc->start[i], N = (long)mc->m[i].w->rows;
        if (n1 > N) n1 = N; /* the padding rows */
        if (n0 < n1) mm_direct_q48(&mc->m[i], n0, n1, ith);
    }
}

pt_status pt_cpu_matmul_multi(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                              const pt_matrix *const *w, int rows) {
    pt_cpu *c = pt_cpu_of(be);
    if (n < 1 || n > 4) return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: %d weights (expected 1..4)", n);
    for (int i = 0; i < n; i++) {
        if (w[i]->cols != w[0]->cols)
            return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: weight %d has K = %lld, weight 0 has %lld", i,
                            (long long)w[i]->cols, (long long)w[0]->cols);
        if (w[i]->n_experts > 1)
            return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: weight %d is a stack of %lld experts", i,
                            (long long)w[i]->n_experts);
    }
    PT_ASSERT(T >= 0);
    if (T == 0) return PT_OK;
    int bits = w[0]->bits, alike = 1; /* every weight of one bits and group size */
    for (int i = 1; alike && i < n; i++)
        alike = w[i]->bits == bits && w[i]->group_size == w[0]->group_size && (bits || w[i]->dtype == w[0]->dtype);
    const int one = n > 1 && alike && (bits == 4 || bits == 8) && (rows || T < PT_CPU_DIRECT_T) && pt_cpu_multi_on();
    if (!one) {
        if (alike && !rows && T >= PT_CPU_DIRECT_T) { /* a prefill GEMM for every weight: x prepared once */
            pf_x p;
            PT_TRY(prefill_prep(c, x, T, w[0], &p));
            if (p.kind != PF_NONE) {
                for (int i = 0; i < n; i++) prefill_gemm(c, y[i], T, w[i], 0, &p);
                return PT_OK;
            }
        }
        for (int i = 0; i < n; i++) PT_TRY(mm_run(be, y[i], x, T, w[i], 0, rows != 0));
        return PT_OK;
    }
    mm_multi_ctx mc = {.n = n};
    mc.m[0] = (mm_ctx){.c = c, .y = y[0], .x = x, .xq = x, .T = T, .w = w[0], .expert = 0};
    PT_TRY(direct_prep(c, &mc.m[0]));
    count_decode(&mc.m[0]);
    mc.start[0] = 0;
    for (int i = 0; i < n; i++) {
        if (i) {
            mc.m[i] = mc.m[0];
            mc.m[i].w = w[i];
            mc.m[i].y = y[i];
        }
        mc.start[i + 1] = mc.start[i] + (long)((w[i]->rows + 3) / 4 * 4);
    }
    pool_for_guided(c, mc.start[n], 4, (size_t)w[0]->cols * (size_t)bits / 8, mm_multi_run, &mc);
    return PT_OK;
}

/* ---- embedding ---- */

typedef struct {
    pt_cpu *c;
    float *y;
    const int32_t *ids;
    int T;
    const pt_matrix *w;
    float scale;
} emb_ctx;

static void emb_run(void *arg, long t0, long t1, int ith) {
    emb_ctx *e = arg;
    const pt_matrix *w = e->w;
    pt_act_dtype act = e->c->base.act;
    int64_t H = w->cols;
    float *tmp = pt_cpu_thread_scratch(e->c, ith);
    for (long t = t0; t < t1; t++) {
        float *yt = e->y + (int64_t)t * H;
        int32_t id = e->ids[t];
        if (id < 0 || id >= w->rows) {
            memset(yt, 0, (size_t)H * sizeof(float));
            continue;
        }
        if (w->bits) {
            int64_t ng = H / w->group_size;
            pt_cpu_dequant_row(w, 0, id, yt, tmp, tmp + ng);
        } else pt_ft_load_row(w->dtype, pt_cpu_dense_row(w, 0, id), yt, H);
        for (int64_t i = 0; i < H; i++) {
            float v = pt_act_round(act, yt[i]);
            if (e->scale != 1.0f) v = pt_act_round(act, v * e->scale);
            yt[i] = v;
        }
    }
}

pt_status pt_cpu_embed(pt_backend *be, float *y, const int32_t *ids, int T, const pt_matrix *table, float scale) {
    pt_cpu *c = pt_cpu_of(be);
    if (T <= 0) return PT_OK;
    PT_TRY(pt_cpu_need_scratch(c, (size_t)(2 * (table->cols / 32 + 1)), 0));
    emb_ctx e = {.c = c, .y = y, .ids = ids, .T = T, .w = table, .scale = scale};
    pt_pool_for(c->pool, (long)T, 1, emb_run, &e);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= table->rows)
            return pt_error(PT_ERR_RANGE, "embed: token id %d at position %d outside the vocabulary [0, %lld)", ids[t],
                            t, (long long)table->rows);
    return PT_OK;
}

/* ---- MoE expert gather ---- */

typedef struct {
    int32_t e;
    float w;
} expert_pick;

static int pick_cmp(const void *a, const void *b) {
    const expert_pick *x = a, *y = b;
    return (x->e > y->e) - (x->e < y->e);
}

pt_status pt_cpu_moe_ffn(pt_backend *be, float *y, const float *x, int64_t T, const int32_t *idx,
                         const float *weights, int top_k, const pt_matrix *gate, const pt_matrix *up,
                         const pt_matrix *down, pt_glu_kind act_fn) {
    pt_cpu *c = pt_cpu_of(be);
    pt_act_dtype act = be->act;
    int64_t H = down->rows, I = down->cols, E = down->n_experts > 0 ? down->n_experts : 1;
    PT_ASSERT(top_k > 0 && top_k <= 64);
    PT_ASSERT(gate->cols == H && (up ? gate->rows == I && up->rows == I : gate->rows == 2 * I));
    /* [2I] gate|up, [I] h, [H] o: own buffer, because matmul uses the shared scratch */
    size_t need = (size_t)(3 * I + H);
    float *gu = NULL;
    if (c->moe_floats < need) {
        float *p = aligned_alloc(64, ((need * sizeof(float)) + 63) & ~(size_t)63);
        if (!p) return pt_error(PT_ERR_NOMEM, "out of memory for MoE scratch");
        free(c->moe);
        c->moe = p;
        c->moe_floats = need;
    }
    gu = c->moe;
    float *h = gu + 2 * I, *o = h + I;
    for (int64_t t = 0; t < T; t++) {
        expert_pick picks[64];
        for (int k = 0; k < top_k; k++) {
            picks[k].e = idx[t * top_k + k];
            picks[k].w = weights[t * top_k + k];
            if (picks[k].e < 0 || picks[k].e >= E)
                return pt_error(PT_ERR_RANGE, "moe_ffn: expert index %d outside [0, %lld)", picks[k].e, (long long)E);
        }
        qsort(picks, (size_t)top_k, sizeof picks[0], pick_cmp);
        float *yt = y + t * H;
        memset(yt, 0, (size_t)H * sizeof(float));
        for (int k = 0; k < top_k; k++) {
            int64_t e = picks[k].e;
            const float *xt = x + t * H;
            PT_TRY(pt_cpu_matmul(be, gu, xt, 1, gate, e));
            if (up) PT_TRY(pt_cpu_matmul(be, gu + I, xt, 1, up, e));
            PT_TRY(pt_cpu_glu(be, h, gu, gu + I, 1, I, 2 * I, act_fn));
            PT_TRY(pt_cpu_matmul(be, o, h, 1, down, e));
            float wk = picks[k].w;
            for (int64_t i = 0; i < H; i++) yt[i] = pt_act_round(act, yt[i] + pt_act_round(act, o[i] * wk));
        }
    }
    return PT_OK;
}
