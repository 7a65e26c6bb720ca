/* Paired A/B of the CPU backend's bit-neutral decode levers on a whole
 * decode step of a synthetic llama-3.2-1b or llama-3.1-8b (not part of the
 * build or the tests). The step is the one src/model/forward.c runs for a
 * llama layer at T = 1: rms_norm (residual add fused), q/k/v through
 * matmul_multi, rope q and k, kv_append, attention, o, rms_norm, gate/up
 * through matmul_multi, SwiGLU, down; then the final norm, the logits and
 * argmax. MLX 4- or 8-bit weights (group 64, bf16 scales), bf16 activations
 * and KV cache at depth D.
 *
 * Variants are lever masks (pt_cpu_lever, cpu_internal.h): bit 0 = multi
 * (q/k/v and gate/up as one pool dispatch each), bit 1 = scale16 (decode
 * kernels read bf16 scales/biases directly), bit 2 = xint (4- and 8-bit decode
 * with x as integer pieces, qdot_xint_avx512.c), bit 3 = split (decode
 * matvec rows as one contiguous share per thread with stealing, instead of
 * the guided claims from one counter). Each round runs one step of
 * every variant in turn (A B A B ...), plus a streaming read of as many
 * bytes as the weights on the same threads; the medians over rounds are
 * printed with the bandwidth fraction (weight bytes / median step time over
 * the median streaming read). Two threads: wall time (they share the bus
 * and the machine; only the interleaving makes the comparison fair); one
 * thread: its CPU time.
 *   dev/build.sh && dev/bench_decode_ab [1b|8b] [bits] [threads] [depth] [rounds] [mask...] */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/half.h"
#include "base/threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "step_common.h"
#include "stream_read.h"

int main(int argc, char **argv) {
    int big = argc > 1 && !strcmp(argv[1], "8b");
    int bits = argc > 2 ? atoi(argv[2]) : 4, nth = argc > 3 ? atoi(argv[3]) : 2;
    int D = argc > 4 ? atoi(argv[4]) : 128, rounds = argc > 5 ? atoi(argv[5]) : 9;
    int masks[8] = {0, 1}, nv = 2;
    if (argc > 6) {
        nv = 0;
        for (int i = 6; i < argc && nv < 8; i++) masks[nv++] = atoi(argv[i]);
    }
    if (nth == 1) bench_clock = CLOCK_THREAD_CPUTIME_ID;
    const int L = big ? 32 : 16, H = big ? 4096 : 2048, nh = 32, nkv = 8, hd = big ? 128 : 64,
              F = big ? 14336 : 8192, V = 128256;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    pt_matrix emb = qmat(be, V, H, bits), lm = emb;
    if (big) lm = qmat(be, V, H, bits); /* 8b: untied output head */
    pt_matrix *wq = calloc(L, sizeof *wq), *wk = calloc(L, sizeof *wk), *wv = calloc(L, sizeof *wv),
              *wo = calloc(L, sizeof *wo), *wg = calloc(L, sizeof *wg), *wu = calloc(L, sizeof *wu),
              *wd = calloc(L, sizeof *wd);
    bench_llama_weights(be, L, H, nh, nkv, hd, F, bits, wq, wk, wv, wo, wg, wu, wd);
    if (!big) total_bytes -= (size_t)V * H * bits / 8 + (size_t)V * (H / 64) * 4; /* the embedding row is not streamed */
    total_bytes += (size_t)V * H * bits / 8 + (size_t)V * (H / 64) * 4;          /* the logits matmul is */
    uint16_t *norm = aligned_alloc(64, 2 * H);
    for (int i = 0; i < H; i++) norm[i] = pt_f32_to_bf16(1.0f);
    float inv[64];
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(500000.0f, -2.0f * i / hd);
    pt_rope rope = {.rot_dim = hd, .inv_freq = inv, .attn_scale = 1};
    pt_attn ap = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    int cap = D + rounds * nv + 2;
    pt_kv_layer *kv = calloc(L, sizeof *kv);
    bench_kv_fill(be, kv, L, nkv, hd, cap);
    bench_acts a = bench_acts_alloc(be, 1, cap, H, nh, nkv, hd, F, V);
    float *x = a.x, *xn = a.xn, *q = a.q, *k = a.k, *v = a.v, *att = a.att, *g = a.g, *u = a.u, *y = a.y,
          *logits = a.logits;
    int32_t tok = 1, pos = D, am;
    uint8_t *rbuf = rd_buffer(total_bytes);
    pt_pool *pool;
    pt_pool_create(&pool, nth);
    rd_ctx rc = {.p = rbuf, .n = total_bytes & ~(size_t)255};
    double *ts = calloc((size_t)(rounds * nv), sizeof *ts), *rd = calloc((size_t)rounds, sizeof *rd);
    for (int r = -1; r < rounds; r++) { /* round -1: warm-up, not counted */
        double t0 = now();
        pt_pool_run(pool, rd_run, &rc);
        if (r >= 0) rd[r] = now() - t0;
        for (int vi = 0; vi < nv; vi++) {
            pt_cpu_lever.multi = masks[vi] & 1;
            pt_cpu_lever.scale16 = (masks[vi] >> 1) & 1;
            pt_cpu_lever.xint = (masks[vi] >> 2) & 1;
            pt_cpu_lever.split = (masks[vi] >> 3) & 1;
            double t1 = now();
            be->ops->embed(be, x, &tok, 1, &emb, 1.0f);
            for (int l = 0; l < L; l++) {
                be->ops->rms_norm(be, xn, l ? y : x, l ? x : NULL, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f);
                float *qkv[3] = {q, k, v};
                const pt_matrix *wqkv[3] = {&wq[l], &wk[l], &wv[l]};
                pt_cpu_matmul_multi(be, 3, qkv, xn, 1, wqkv, 0);
                be->ops->rope(be, q, 1, nh, hd, &pos, &rope);
                be->ops->rope(be, k, 1, nkv, hd, &pos, &rope);
                be->ops->kv_append(be, &kv[l], k, v, 1, &pos);
                be->ops->attention(be, att, q, 1, &pos, &kv[l], &ap);
                be->ops->matmul(be, y, att, 1, &wo[l], 0);
                be->ops->rms_norm(be, xn, y, x, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f);
                float *gu[2] = {g, u};
                const pt_matrix *wgu[2] = {&wg[l], &wu[l]};
                pt_cpu_matmul_multi(be, 2, gu, xn, 1, wgu, 0);
                be->ops->glu(be, g, g, u, 1, F, F, PT_GLU_SILU);
                be->ops->matmul(be, y, g, 1, &wd[l], 0);
            }
            be->ops->rms_norm(be, xn, y, x, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f);
            be->ops->matmul(be, logits, xn, 1, &lm, 0);
            be->ops->argmax(be, &am, logits, 1, V);
            if (r >= 0) ts[vi * rounds + r] = now() - t1;
            pos++;
            tok = am;
        }
    }
    double rdm = median(rd, rounds), gb = total_bytes / 1e9;
    printf("llama-3.%s q%d threads=%d depth=%d rounds=%d: weights read per token %.3f GB, streaming read (median) "
           "%.1f GB/s\n",
           big ? "1-8b" : "2-1b", bits, nth, D, rounds, gb, gb / rdm);
    for (int vi = 0; vi < nv; vi++) {
        double *t = ts + vi * rounds, best = 1e30;
        for (int r = 0; r < rounds; r++) best = t[r] < best ? t[r] : best;
        double med = median(t, rounds);
        printf("  mask %d (multi %d scale16 %d xint %d split %d): median %.2f tok/s (best %.2f), %.1f GB/s = %.1f%% of the "
               "read\n",
               masks[vi], masks[vi] & 1, (masks[vi] >> 1) & 1, (masks[vi] >> 2) & 1, (masks[vi] >> 3) & 1, 1 / med,
               1 / best, gb / med, 100 * rdm / med);
    }
    pt_pool_free(&pool);
    pt_backend_free(&be);
    return 0;
}
