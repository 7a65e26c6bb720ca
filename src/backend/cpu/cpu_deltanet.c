/* CPU ops of the Gated DeltaNet (Qwen3.5 linear attention) and the gated
 * attention output: the causal depthwise conv1d with its rolling state and
 * SiLU, the gated delta rule (token by token for decode, chunked WY form for
 * prefill), the gated RMSNorm, a strided row copy and x·σ(g). Contracts and
 * rounding points: backend.h (conv1d_silu, delta_rule, pt_delta, ...).
 *
 * Threads split channels (conv1d), value heads (delta rule) or rows; every
 * output element is computed by the same sequential code whatever the split,
 * so results are bit-identical for any thread count.
 *
 * What this is not: the layer itself (src/model/qwen3_5.c strings these ops
 * together with the projections). */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

#define PAR_MIN 32768

/* Eight floats at a time with GCC vector extensions (any alignment; plain
 * SSE on the baseline ISA). Each lane does exactly the scalar operations
 * (no contraction into FMA: this file is built without -mfma and in ISO C
 * mode), so the vector loops below give the bit-identical results of the
 * scalar ones they replace; the tails run scalar. */
typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));
#define V8(p) (*(v8f *)(p))

/* y[e] += a·x[e] */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
    int e = 0;
    for (; e + 8 <= n; e += 8) V8(y + e) += a * V8(x + e);
    for (; e < n; e++) y[e] += a * x[e];
}

/* ---- conv1d + SiLU ---- */

typedef struct {
    pt_cpu *c;
    float *y;
    const float *x;
    int64_t T, C;
    int K;
    const void *w;
    pt_ftype wt;
    float *state; /* [K-1, C] */
} conv_ctx;

static void conv_run(void *arg, int ith, int nth) {
    conv_ctx *v = arg;
    pt_act_dtype act = v->c->base.act;
    long c0, c1;
    pt_split_range(v->C, ith, nth, &c0, &c1);
    const int K = v->K;
    const int64_t C = v->C;
    for (long c = c0; c < c1; c++) {
        float w[PT_CONV_MAX_K], hist[PT_CONV_MAX_K]; /* hist: the K-1 rows before t, oldest first */
        for (int j = 0; j < K; j++) w[j] = pt_ft_load(v->wt, v->w, (int64_t)c * K + j);
        for (int j = 0; j < K - 1; j++) hist[j] = v->state[(int64_t)j * C + c];
        for (int64_t t = 0; t < v->T; t++) {
            float xt = v->x[t * C + c];
            float s = 0.0f;
            for (int j = 0; j < K - 1; j++) s += w[j] * hist[j];
            s += w[K - 1] * xt;
            s = pt_act_round(act, s);
            v->y[t * C + c] = pt_act_round(act, pt_cpu_silu(s));
            for (int j = 0; j + 1 < K - 1; j++) hist[j] = hist[j + 1];
            if (K > 1) hist[K - 2] = xt;
        }
        for (int j = 0; j < K - 1; j++) v->state[(int64_t)j * C + c] = hist[j];
    }
}

pt_status pt_cpu_conv1d_silu(pt_backend *be, float *y, const float *x, int64_t T, int64_t C, int K,
                                 const void *w, pt_ftype wtype, float *state) {
    PT_ASSERT(T >= 0 && C > 0 && K >= 1 && K <= PT_CONV_MAX_K && y != x);
    conv_ctx v = {pt_cpu_of(be), y, x, T, C, K, w, wtype, state};
    if (T * C * K < PAR_MIN) conv_run(&v, 0, 1);
    else pt_pool_run(pt_cpu_of(be)->pool, conv_run, &v);
    return PT_OK;
}

/* ---- the gated delta rule ---- */

typedef struct {
    pt_cpu *c;
    float *out;
    const float *qkv, *b, *a;
    int64_t T;
    float *state;
    const pt_delta *p;
} delta_ctx;

/* l2norm(src[D]) · scale into dst, in f32 whatever the activation dtype:
 * the reference (transformers 5.17 torch_chunk_gated_delta_rule) casts q and
 * k to f32 first and normalizes them there, x · rsqrt(Σx² + 1e-6), then
 * multiplies by the scale (two f32 roundings, in that order). */
static void l2n(float *dst, const float *src, int D, float scale) {
    float ss = 0.0f;
    for (int i = 0; i < D; i++) ss += src[i] * src[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < D; i++) dst[i] = (src[i] * inv) * scale;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* β and g of token t, value head h */
static void beta_g(const delta_ctx *d, int64_t t, int h, float *beta, float *g) {
    const pt_delta *p = d->p;
    pt_act_dtype act = d->c->base.act;
    float bv = d->b[t * p->n_v_heads + h], av = d->a[t * p->n_v_heads + h];
    *beta = pt_act_round(act, 1.0f / (1.0f + expf(-bv)));
    *g = -expf(p->A_log[h]) * softplus(av + p->dt_bias[h]);
}

/* Token by token, value head h. tmp: 2·Dk + 2·Dv floats.
 * Two passes over S per token, row by row (contiguous, the column sums
 * accumulated side by side): every sum runs over i = 0..Dk−1 in order, so
 * the results are those of the column-by-column formulas. */
static void delta_recurrent(const delta_ctx *d, int h, float *tmp) {
    const pt_delta *p = d->p;
    pt_act_dtype act = d->c->base.act;
    const int Dk = p->k_dim, Dv = p->v_dim, kh = h / (p->n_v_heads / p->n_k_heads);
    const int64_t ld = 2 * (int64_t)p->n_k_heads * Dk + (int64_t)p->n_v_heads * Dv;
    float *S = d->state + (size_t)h * Dk * Dv, *q = tmp, *k = tmp + Dk, *m = tmp + 2 * Dk, *acc = m + Dv;
    for (int64_t t = 0; t < d->T; t++) {
        const float *row = d->qkv + t * ld;
        l2n(q, row + (int64_t)kh * Dk, Dk, p->q_scale);
        l2n(k, row + (int64_t)p->n_k_heads * Dk + (int64_t)kh * Dk, Dk, 1.0f);
        const float *v = row + 2 * (int64_t)p->n_k_heads * Dk + (int64_t)h * Dv;
        float beta, g;
        beta_g(d, t, h, &beta, &g);
        const float alpha = expf(g);
        float *o = d->out + t * (int64_t)p->n_v_heads * Dv + (int64_t)h * Dv;
        /* S ← α·S and m_j = Σ_i S_ij k_i */
        for (int j = 0; j < Dv; j++) m[j] = 0.0f;
        for (int i = 0; i < Dk; i++) {
            float *restrict Si = S + (size_t)i * Dv;
            const float ki = k[i];
            int j = 0;
            for (; j + 8 <= Dv; j += 8) {
                const v8f sij = V8(Si + j) * alpha;
                V8(Si + j) = sij;
                V8(m + j) += sij * ki;
            }
            for (; j < Dv; j++) {
                const float sij = Si[j] * alpha;
                Si[j] = sij;
                m[j] += sij * ki;
            }
        }
        for (int j = 0; j < Dv; j++) m[j] = (v[j] - m[j]) * beta; /* δ */
        /* S += k⊗δ and o_j = Σ_i S_ij q_i */
        for (int j = 0; j < Dv; j++) acc[j] = 0.0f;
        for (int i = 0; i < Dk; i++) {
            float *restrict Si = S + (size_t)i * Dv;
            const float ki = k[i], qi = q[i];
            int j = 0;
            for (; j + 8 <= Dv; j += 8) {
                const v8f sij = V8(Si + j) + ki * V8(m + j);
                V8(Si + j) = sij;
                V8(acc + j) += sij * qi;
            }
            for (; j < Dv; j++) {
                const float sij = Si[j] + ki * m[j];
                Si[j] = sij;
                acc[j] += sij * qi;
            }
        }
        for (int j = 0; j < Dv; j++) o[j] = pt_act_round(act, acc[j]);
    }
}

/* out[r] = Σ_e x[e]·Y[r·D + e] for r < ny: four rows at a time (independent
 * accumulators, so the additions overlap), each sum still running over
 * e = 0..D−1 in order — the same value as a plain loop per row. */
static void dot_rows(float *out, const float *x, const float *Y, int ny, int D) {
    int r = 0;
    for (; r + 4 <= ny; r += 4) {
        const float *y0 = Y + (size_t)r * D, *y1 = y0 + D, *y2 = y1 + D, *y3 = y2 + D;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int e = 0; e < D; e++) {
            const float xe = x[e];
            s0 += xe * y0[e];
            s1 += xe * y1[e];
            s2 += xe * y2[e];
            s3 += xe * y3[e];
        }
        out[r] = s0;
        out[r + 1] = s1;
        out[r + 2] = s2;
        out[r + 3] = s3;
    }
    for (; r < ny; r++) {
        const float *y = Y + (size_t)r * D;
        float s0 = 0.0f;
        for (int e = 0; e < D; e++) s0 += x[e] * y[e];
        out[r] = s0;
    }
}

/* Chunked (WY) form, value head h, chunks of C tokens (architectures.md §9.3):
 * per chunk with cumulative log-decay γ,
 *   A = strict_lower((β⊙K)Kᵀ ⊙ Γ), Γ_ij = exp(γ_i − γ_j);  Tm = (I + A)⁻¹
 *   U = Tm(β⊙V);  W = Tm(β⊙exp(γ)⊙K);  V' = U − W·S
 *   O = (exp(γ)⊙Q)·S + (QKᵀ ⊙ Γ, lower incl. diagonal)·V'
 *   S ← exp(γ_last)·S + Σ_i exp(γ_last − γ_i) k_i ⊗ V'_i
 * A last partial chunk simply has fewer rows (zero padding adds nothing).
 * tmp: C·C + 3·C·Dk + 2·C·Dv + 2·C floats. */
static void delta_chunked(const delta_ctx *d, int h, float *tmp) {
    const pt_delta *p = d->p;
    pt_act_dtype act = d->c->base.act;
    const int Dk = p->k_dim, Dv = p->v_dim, kh = h / (p->n_v_heads / p->n_k_heads), C = p->chunk;
    const int64_t ld = 2 * (int64_t)p->n_k_heads * Dk + (int64_t)p->n_v_heads * Dv;
    float *S = d->state + (size_t)h * Dk * Dv;
    float *A = tmp;                          /* [C, C]: -A, then Tm */
    float *Q = A + (size_t)C * C;            /* [C, Dk] */
    float *K = Q + (size_t)C * Dk;           /* [C, Dk] */
    float *W = K + (size_t)C * Dk;           /* [C, Dk] */
    float *U = W + (size_t)C * Dk;           /* [C, Dv]: U, then V' */
    float *O = U + (size_t)C * Dv;           /* [C, Dv] */
    float *gam = O + (size_t)C * Dv;         /* [C] */
    float *bet = gam + C;                    /* [C] */
    for (int64_t t0 = 0; t0 < d->T; t0 += C) {
        const int n = d->T - t0 < C ? (int)(d->T - t0) : C;
        float acc = 0.0f;
        for (int i = 0; i < n; i++) {
            const float *row = d->qkv + (t0 + i) * ld;
            l2n(Q + (size_t)i * Dk, row + (int64_t)kh * Dk, Dk, p->q_scale);
            l2n(K + (size_t)i * Dk, row + (int64_t)p->n_k_heads * Dk + (int64_t)kh * Dk, Dk, 1.0f);
            float g;
            beta_g(d, t0 + i, h, &bet[i], &g);
            acc += g;
            gam[i] = acc;
        }
        /* N = -strict_lower((β⊙K)Kᵀ ⊙ Γ), then forward substitution row by row:
         * N[i][j] += Σ_{j<m<i} N[i][m]·N[m][j] (rows m < i already final) gives
         * (I + A)⁻¹ − I below the diagonal. */
        for (int i = 0; i < n; i++) {
            float *Ai = A + (size_t)i * C;
            dot_rows(Ai, K + (size_t)i * Dk, K, i, Dk); /* k_i·k_j, j < i */
            for (int j = 0; j < i; j++) Ai[j] = -(bet[i] * Ai[j]) * expf(gam[i] - gam[j]);
        }
        for (int i = 1; i < n; i++) {
            float *Ai = A + (size_t)i * C;
            for (int j = 0; j < i - 1; j++) {
                float s = Ai[j];
                for (int m = j + 1; m < i; m++) s += Ai[m] * A[(size_t)m * C + j];
                Ai[j] = s;
            }
        }
        /* U = Tm(β⊙V), W = Tm(β⊙exp(γ)⊙K), Tm = N + I */
        for (int i = 0; i < n; i++) {
            const float *Ai = A + (size_t)i * C;
            float *Ui = U + (size_t)i * Dv, *Wi = W + (size_t)i * Dk;
            for (int e = 0; e < Dv; e++) Ui[e] = 0.0f;
            for (int e = 0; e < Dk; e++) Wi[e] = 0.0f;
            for (int j = 0; j <= i; j++) {
                const float c = j == i ? 1.0f : Ai[j];
                const float *vj = d->qkv + (t0 + j) * ld + 2 * (int64_t)p->n_k_heads * Dk + (int64_t)h * Dv;
                const float cb = c * bet[j], cbg = c * bet[j] * expf(gam[j]);
                axpy(Ui, cb, vj, Dv);
                axpy(Wi, cbg, K + (size_t)j * Dk, Dk);
            }
        }
        /* V' = U − W·S (in U); O = (exp(γ)⊙Q)·S */
        for (int i = 0; i < n; i++) {
            float *Ui = U + (size_t)i * Dv, *Oi = O + (size_t)i * Dv;
            const float eg = expf(gam[i]);
            for (int e = 0; e < Dv; e++) Oi[e] = 0.0f;
            for (int r = 0; r < Dk; r++) {
                const float w = W[(size_t)i * Dk + r], q = Q[(size_t)i * Dk + r] * eg;
                const float *Sr = S + (size_t)r * Dv;
                int e = 0;
                for (; e + 8 <= Dv; e += 8) {
                    V8(Ui + e) -= w * V8(Sr + e);
                    V8(Oi + e) += q * V8(Sr + e);
                }
                for (; e < Dv; e++) {
                    Ui[e] -= w * Sr[e];
                    Oi[e] += q * Sr[e];
                }
            }
        }
        /* O += (QKᵀ ⊙ Γ)·V' (lower incl. diagonal); write out. Row i of A (done
         * with: U and W hold what it gave) takes the q_i·k_j. */
        for (int i = 0; i < n; i++) {
            float *Oi = O + (size_t)i * Dv, *qk = A + (size_t)i * C;
            dot_rows(qk, Q + (size_t)i * Dk, K, i + 1, Dk);
            for (int j = 0; j <= i; j++) {
                const float s = qk[j] * expf(gam[i] - gam[j]);
                const float *Uj = U + (size_t)j * Dv;
                axpy(Oi, s, Uj, Dv);
            }
            float *o = d->out + (t0 + i) * (int64_t)p->n_v_heads * Dv + (int64_t)h * Dv;
            for (int e = 0; e < Dv; e++) o[e] = pt_act_round(act, Oi[e]);
        }
        /* S ← exp(γ_last)·S + Σ_i exp(γ_last − γ_i) k_i ⊗ V'_i */
        const float gl = gam[n - 1], el = expf(gl);
        for (int i = 0; i < Dk * Dv; i++) S[i] *= el;
        for (int i = 0; i < n; i++) {
            const float f = expf(gl - gam[i]);
            const float *Ui = U + (size_t)i * Dv;
            for (int r = 0; r < Dk; r++) {
                const float kr = K[(size_t)i * Dk + r] * f;
                float *Sr = S + (size_t)r * Dv;
                axpy(Sr, kr, Ui, Dv);
            }
        }
    }
}

static size_t delta_scratch(const pt_delta *p) {
    size_t C = (size_t)(p->chunk > 0 ? p->chunk : 1), Dk = (size_t)p->k_dim, Dv = (size_t)p->v_dim;
    if (p->chunk <= 0) return 2 * Dk + 2 * Dv;
    return C * C + 3 * C * Dk + 2 * C * Dv + 2 * C;
}

/* Subnormal floats: strong decays (exp of cumulative log-decays near −87
 * and below, the state of a long-decayed head) produce them, and x86 cores
 * take microcode assists on every subnormal operand or result (measured:
 * the chunked prefill of the qwen3.5-4b shape ran ~10× slower than its
 * operation count). While a thread runs this op it flushes them to zero
 * (MXCSR FTZ + DAZ), restoring the caller's mode afterwards. Values below
 * 1.2e-38 change by less than that; the parity tests show no difference. */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define PT_FTZ_BEGIN const unsigned pt_csr = _mm_getcsr(); _mm_setcsr(pt_csr | 0x8040u)
#define PT_FTZ_END _mm_setcsr(pt_csr)
#else
#define PT_FTZ_BEGIN (void)0
#define PT_FTZ_END (void)0
#endif

static void delta_run(void *arg, int ith, int nth) {
    delta_ctx *d = arg;
    long h0, h1;
    pt_split_range(d->p->n_v_heads, ith, nth, &h0, &h1);
    float *tmp = pt_cpu_thread_scratch(d->c, ith);
    PT_FTZ_BEGIN;
    for (long h = h0; h < h1; h++) {
        if (d->p->chunk > 0) delta_chunked(d, (int)h, tmp);
        else delta_recurrent(d, (int)h, tmp);
    }
    PT_FTZ_END;
}

pt_status pt_cpu_delta_rule(pt_backend *be, float *out, const float *qkv, const float *b, const float *a,
                                int64_t T, float *state, const pt_delta *p) {
    PT_ASSERT(T >= 0 && p->n_k_heads > 0 && p->n_v_heads % p->n_k_heads == 0 && p->k_dim > 0 && p->v_dim > 0);
    pt_cpu *c = pt_cpu_of(be);
    PT_TRY(pt_cpu_need_scratch(c, delta_scratch(p), 0));
    delta_ctx d = {c, out, qkv, b, a, T, state, p};
    if (T * p->n_v_heads * p->k_dim * p->v_dim < PAR_MIN / 4) delta_run(&d, 0, 1);
    else pt_pool_run(c->pool, delta_run, &d);
    return PT_OK;
}

/* ---- gated RMSNorm ---- */

typedef struct {
    pt_cpu *c;
    float *y;
    const float *x, *z;
    int64_t R, D;
    const void *w;
    pt_ftype wt;
    float eps;
} gnorm_ctx;

static void gnorm_run(void *arg, int ith, int nth) {
    gnorm_ctx *n = arg;
    pt_act_dtype act = n->c->base.act;
    long r0, r1;
    pt_split_range(n->R, ith, nth, &r0, &r1);
    const int64_t D = n->D;
    for (long r = r0; r < r1; r++) {
        const float *x = n->x + r * D, *z = n->z + r * D;
        float *y = n->y + r * D;
        float ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
        const float inv = 1.0f / sqrtf(ss / (float)D + n->eps);
        for (int64_t i = 0; i < D; i++) {
            float v = pt_act_round(act, pt_ft_load(n->wt, n->w, i) * pt_act_round(act, x[i] * inv));
            y[i] = pt_act_round(act, v * pt_cpu_silu(z[i]));
        }
    }
}

pt_status pt_cpu_rms_norm_gated(pt_backend *be, float *y, const float *x, const float *z, int64_t R, int64_t D,
                                    const void *w, pt_ftype wtype, float eps) {
    PT_ASSERT(R >= 0 && D > 0 && w != NULL);
    gnorm_ctx n = {pt_cpu_of(be), y, x, z, R, D, w, wtype, eps};
    if (R * D < PAR_MIN) gnorm_run(&n, 0, 1);
    else pt_pool_run(pt_cpu_of(be)->pool, gnorm_run, &n);
    return PT_OK;
}

/* ---- strided copy, x·σ(g) ---- */

pt_status pt_cpu_copy_rows(pt_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                               int64_t n) {
    (void)be;
    PT_ASSERT(rows >= 0 && n >= 0 && ldd >= n && lds >= n);
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ldd, src + r * lds, (size_t)n * sizeof(float));
    return PT_OK;
}

pt_status pt_cpu_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g, int64_t n) {
    pt_act_dtype act = be->act;
    for (int64_t i = 0; i < n; i++) y[i] = pt_act_round(act, x[i] * pt_act_round(act, 1.0f / (1.0f + expf(-g[i]))));
    return PT_OK;
}
