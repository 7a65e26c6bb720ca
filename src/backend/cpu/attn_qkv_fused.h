/* The per-block AVX-512 kernel of --fused-decode-attn (attn_qkv_fused.c
 * splits the keys into blocks and merges them; this computes one block).
 * Internal to the CPU backend's fused decode attention; not an op. */
#ifndef PT_BACKEND_CPU_ATTN_QKV_FUSED_H
#define PT_BACKEND_CPU_ATTN_QKV_FUSED_H

#include "backend/backend.h"

#include <stdint.h>

#define PT_FUSED_BLOCK 128

/* Floats of per-thread scratch pt_cpu_fused_block_avx512 (and, besides its
 * score rows, pt_cpu_qattn_item_avx512) needs. */
size_t pt_cpu_fused_block_scratch(int G, int hd, int ng);

/* One (KV head kh, key block) of the fused decode attention over a 4- or
 * 8-bit cache, for the G query heads of the group:
 *   qx   [G, hd]  the pre-scaled query (4-bit: permuted per 32 values,
 *                 pt_cpu_permute_x4); qs [G, ng] its group sums;
 *   keys positions p0 .. p0 + nb - 1 (nb <= PT_FUSED_BLOCK), slot p % capacity;
 *   part [G, 2 + hd] <- per head: m = max score, l = Σ e^(s - m),
 *                 a = Σ e^(s - m)·dequant(v) in natural order.
 * Scores are rounded to bf16 when bf16 != 0 and soft-capped when softcap > 0,
 * as the exact path does. Returns 0 (and writes nothing) for a shape it does
 * not take (bits other than 4/8, scales neither f32 nor bf16, G > 8); the
 * caller then runs the generic loops. Built with AVX-512 flags: call it only
 * when the backend picked the AVX-512 kernels. */
int pt_cpu_fused_block_avx512(float *part, const float *qx, const float *qs, int G, const pt_kv_layer *kv, int kh,
                              int64_t p0, int nb, float softcap, int bf16, float *scr);

/* The exact quantized attention (cpu_attention.c) of one (token, KV head)
 * item with the same machinery: scores of nkeys keys from position lo into
 * S [G, nkeys] (rounded and soft-capped as above), softmax_row (the
 * backend's two-pass softmax, probabilities normalized and, with bf16,
 * rounded) on each head's row, then p·V in blocks of PT_FUSED_BLOCK rows with
 * dequantization factored out (Σ_j (p_j·scale_jb)·q_j + Σ_j p_j·bias_jb).
 * out [G, hd] receives the unrounded sums. Same shape limits and return
 * value as pt_cpu_fused_block_avx512. */
int pt_cpu_qattn_item_avx512(float *out, const float *qx, const float *qs, int G, const pt_kv_layer *kv, int kh,
                             int64_t lo, int64_t nkeys, float softcap, int bf16,
                             void (*softmax_row)(float *, int64_t, float, int), float *S, float *scr);

#endif
