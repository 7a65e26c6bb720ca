/* The tensor-core decode GEMV (gemv_tc.cu, its kernel gemv_tc_kernel.cuh) and
 * the repack into its layout (gemv_tc_repack.cu; layout in matmul.cuh): the
 * entry points used by the weight upload (backend.cu), matmul.cu and moe.cu.
 * Declarations only. */
#ifndef PT_BACKEND_CUDA_GEMV_TC_CUH
#define PT_BACKEND_CUDA_GEMV_TC_CUH

#include "backend/cuda/cuda_internal.cuh"

/* Whether a weight is put into the tensor-core layout at upload: 4/8-bit,
 * group 32/64/128, bf16 scales, bf16 activation mode, K·bits/4 a multiple of
 * 64, not an expert stack; PETREL_CUDA_REPACK=0 (or pt_cuda_tc_select(0) before the upload)
 * keeps the MLX layout (A/B). */
int pt_cuda_tc_eligible(const pt_cuda *c, const pt_matrix *w);
/* Device bytes of the repacked codes and of the scale|bias words. */
size_t pt_cuda_tc_codes_bytes(const pt_matrix *w);
size_t pt_cuda_tc_sb_bytes(const pt_matrix *w);
/* Uploads w's host codes, scales and biases and writes them in the
 * tensor-core layout to codes and sb (device; the MLX copy is temporary). */
pt_status pt_cuda_tc_pack(pt_cuda *c, const pt_matrix *w, void *codes, void *sb, const char *name);
/* Rows [row_begin, row_begin + nrows) (counted across experts) of a weight
 * in the tensor-core layout dequantized to bf16 [nrows, K] at out: the same
 * values as matmul.cu's dequantize of the MLX layout (s·q, then + b, each
 * rounded, then bf16). */
pt_status pt_cuda_tc_dequant(pt_cuda *c, bf16 *out, const pt_matrix *w, int64_t row_begin, int64_t nrows);
/* y = x · W[expert]ᵀ (+ bias) for nb = 1..64 rows of x ([nb, K], y [nb, ldy]);
 * items > 1: grid of items, item b using expert experts[b] (or `expert`
 * when experts is NULL), x rows at (b / x_div)·nb·K and y at b·nb·ldy. */
pt_status pt_cuda_tc_gemv(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *w, int64_t expert,
                          const int32_t *experts, int64_t items, int x_div, int64_t ldy);
/* Whether up to 4 weights can share one grouped launch: all in the
 * tensor-core layout, no expert stacks, one bits, group size and K. */
int pt_cuda_tc_multi_ok(const pt_cuda *c, int n, const pt_matrix *const *w);
/* y[i] = x · W[i]ᵀ (+ bias), y[i] [nb, w[i]->rows], for i < n (1..4) weights
 * that pt_cuda_tc_multi_ok accepts, nb = 1..64 rows of x [nb, K]: ONE
 * launch whose blocks are each weight's blocks back to back; every y[i]
 * bit-identical to pt_cuda_tc_gemv of w[i] alone (same per-weight split). */
pt_status pt_cuda_tc_gemv_multi(pt_cuda *c, int n, float *const *y, const float *x, int64_t nb,
                                const pt_matrix *const *w);
/* y[nb, F] = glu(x · Wgᵀ, x · Wuᵀ) with act (backend.h glu), nb = 1..64
 * rows of x [nb, K], F = wg->rows = wu->rows: ONE launch whose blocks each
 * compute the same tiles of both projections and write the GLU of the two
 * (the GEMV's epilogue), bit-identical to pt_cuda_tc_gemv_multi of {wg, wu}
 * followed by pt_cuda_glu. PT_ERR_UNSUPPORTED (nothing launched, no
 * message) where it does not apply: weights not groupable (see
 * pt_cuda_tc_multi_ok) or of different row counts, an unaligned x, an odd
 * number of tiles per block (a warp split S of 8 at up to 8 rows), the
 * inner loop of PETREL_CUDA_TC_LOOP=0. */
pt_status pt_cuda_tc_gemv_glu(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *wg,
                              const pt_matrix *wu, pt_glu_kind act);
/* nb (1..64) activation rows x [nb, K] with a decode layer's RMSNorm
 * folded in (backend.h matmul_norm): y[i] = rms_norm(x) · W[i]ᵀ for n
 * (1..4) weights pt_cuda_tc_multi_ok accepts (one launch, grouped for n >
 * 1), bit-identical to pt_cuda_rms_norm into a buffer and
 * pt_cuda_tc_gemv_multi of it. One row: the norm in the GEMV's staging of
 * x, x not written (nrm->add unsupported); more rows: in the x prepare of
 * the XP launches (tc_xprep_norm_kernel), which applies the residual add
 * first where nrm->add is set (x = round(x + add), written back).
 * PT_ERR_UNSUPPORTED (nothing launched, no message): weights not groupable,
 * an unaligned x or norm weight, K above 4096, f32 activations, the inner
 * loop of PETREL_CUDA_TC_LOOP=0, rows that do not take the XP launches. */
pt_status pt_cuda_tc_gemv_norm(pt_cuda *c, int n, float *const *y, const float *x, int64_t nb,
                               const pt_matrix *const *w, const pt_norm_in *nrm);
/* The same fold into the GLU launch (backend.h matmul_glu_norm): y[F] =
 * glu(rms_norm(x) · Wgᵀ, rms_norm(x) · Wuᵀ); unsupported where either the
 * norm's fold or pt_cuda_tc_gemv_glu is. */
pt_status pt_cuda_tc_gemv_glu_norm(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *wg,
                                   const pt_matrix *wu, pt_glu_kind act, const pt_norm_in *nrm);
/* x[N] = round(x + round(a · Wᵀ (+ bias))) for one activation row a [K]
 * (backend.h matmul_add): the residual add of pt_cuda_rms_norm's fused
 * form in the GEMV's epilogue. PT_ERR_UNSUPPORTED (nothing launched): a
 * weight not in the tensor-core layout or an expert stack, an unaligned a,
 * f32 activations. */
pt_status pt_cuda_tc_gemv_add(pt_cuda *c, float *x, const float *a, const pt_matrix *w);
/* Launches made so far by the three above (tests check the folds ran). */
extern "C" unsigned long long pt_cuda_tc_fold_count(void);
/* pt_cuda_matmul_glu (matmul.cu): the backend.h matmul_glu op. */
pt_status pt_cuda_matmul_glu(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *wg,
                             const pt_matrix *wu, pt_glu_kind act, int rows);
/* matmul.cu: the backend.h matmul_norm, matmul_glu_norm and matmul_add ops */
pt_status pt_cuda_matmul_norm(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                              const pt_matrix *const *w, const pt_norm_in *nrm);
pt_status pt_cuda_matmul_glu_norm(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *wg,
                                  const pt_matrix *wu, pt_glu_kind act, const pt_norm_in *nrm);
pt_status pt_cuda_matmul_add(pt_backend *be, float *x, const float *a, int64_t T, const pt_matrix *w);
/* gemv_tc.cu: backend.h prefetch_hint (PETREL_CUDA_L2_PF) */
void pt_cuda_prefetch_hint(pt_backend *be, const pt_matrix *const *w, int n);
/* gemv_tc.cu: backend.h handoff_hint (PETREL_CUDA_TC_WG_XO) */
void pt_cuda_handoff_hint(pt_backend *be);
/* gemv_tc.cu XO, for an op other than a GEMV that writes x [nb, K] read
 * next by a GEMV: where a hint asks for it (consumed here) and that GEMV
 * takes the wgmma kernels at 64 columns, the place to write x in their
 * layout (*unit bytes a 64-value unit, wg_x.cuh), else NULL; once written
 * (its launch made), pt_cuda_tc_xo_made records the hand-off for the next
 * GEMV launch. */
char *pt_cuda_tc_xo_begin(pt_cuda *c, int nb, int K, int *unit);
void pt_cuda_tc_xo_made(pt_cuda *c, const float *x, int nb, int K);

#endif
