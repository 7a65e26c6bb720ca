/* The per-block AVX-512 kernel of --fused-decode-attn (attn_qkv_fused.c
 * splits the keys into blocks and merges them; this computes one block).
 * Internal to the CPU backend's fused decode attention; not an op. */
#ifndef PT_BACKEND_CPU_ATTN_QKV_FUSED_H
#define PT_BACKEND_CPU_ATTN_QKV_FUSED_H

#include "backend/backend.h"

#include <stdint.h>

#define PT_FUSED_BLOCK 128

/* Floats of per-thread scratch pt_cpu_fused_block_avx512 needs. */
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

#endif
