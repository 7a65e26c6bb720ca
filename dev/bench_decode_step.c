/* Whole decode step of a synthetic llama-3.2-1b through the op table (not
 * part of the build or the tests): 16 layers, hidden 2048, 32/8 heads of 64,
 * FFN 8192, vocab 128256 tied, MLX 4- or 8-bit weights (group 64, bf16
 * scales, random codes), bf16 activations and KV cache at depth D. Measures
 * tokens/s and the weight bytes read per second against a streaming read of
 * the same size on the same threads, interleaved (A B A B), and the time
 * spent per op kind (matmuls, logits, attention + KV append, norms, RoPE,
 * the rest), summed over the steps and printed per step.
 * With one thread every time is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
 *   dev/build.sh && dev/bench_decode_step [bits] [threads] [depth] [steps] [int8_act] */
#include "backend/backend.h"
#include "base/half.h"
#include "base/threadpool.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "step_common.h"
#include "stream_read.h"

/* time per op kind (the CPU ops are synchronous) */
static double prof[8];
#define P(cat, call) do { double t_ = now(); call; prof[cat] += now() - t_; } while (0)
int main(int argc, char **argv) {
    int bits = argc > 1 ? atoi(argv[1]) : 4, nth = argc > 2 ? atoi(argv[2]) : 2;
    int D = argc > 3 ? atoi(argv[3]) : 128, steps = argc > 4 ? atoi(argv[4]) : 8, i8 = argc > 5 ? atoi(argv[5]) : 0;
    if (nth == 1) bench_clock = CLOCK_THREAD_CPUTIME_ID;
    const int L = 16, H = 2048, nh = 32, nkv = 8, hd = 64, F = 8192, V = 128256;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16, .int8_act = i8};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    pt_matrix emb = qmat(be, V, H, bits);
    pt_matrix wq[16], wk[16], wv[16], wo[16], wg[16], wu[16], wd[16];
    bench_llama_weights(be, L, H, nh, nkv, hd, F, bits, wq, wk, wv, wo, wg, wu, wd);
    uint16_t *norm = aligned_alloc(64, 2 * H);
    for (int i = 0; i < H; i++) norm[i] = pt_f32_to_bf16(1.0f);
    float inv[32];
    for (int i = 0; i < 32; i++) inv[i] = powf(500000.0f, -2.0f * i / 64);
    pt_rope rope = {.rot_dim = 64, .inv_freq = inv, .attn_scale = 1};
    pt_attn ap = {.n_heads = nh, .head_dim = hd, .scale = 0.125f};
    int cap = D + steps + 1;
    pt_kv_layer kv[16];
    bench_kv_fill(be, kv, L, nkv, hd, cap);
    bench_acts a = bench_acts_alloc(be, 1, cap, H, nh, nkv, hd, F, V);
    float *x = a.x, *xn = a.xn, *q = a.q, *k = a.k, *v = a.v, *att = a.att, *g = a.g, *u = a.u, *y = a.y,
          *logits = a.logits;
    int32_t tok = 1, pos = D, am;
    /* the streaming-read reference over a buffer as large as the weights */
    uint8_t *rbuf = rd_buffer(total_bytes);
    pt_pool *pool;
    pt_pool_create(&pool, nth);
    rd_ctx rc = {.p = rbuf, .n = total_bytes};
    double best_step = 1e30, best_rd = 1e30;
    for (int s = 0; s < steps; s++) {
        double t0 = now();
        pt_pool_run(pool, rd_run, &rc);
        double t1 = now();
        P(5, be->ops->embed(be, x, &tok, 1, &emb, 1.0f));
        for (int l = 0; l < L; l++) {
            P(3, be->ops->rms_norm(be, xn, x, NULL, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f));
            P(0, be->ops->matmul(be, q, xn, 1, &wq[l], 0));
            P(0, be->ops->matmul(be, k, xn, 1, &wk[l], 0));
            P(0, be->ops->matmul(be, v, xn, 1, &wv[l], 0));
            P(4, be->ops->rope(be, q, 1, nh, hd, &pos, &rope));
            P(4, be->ops->rope(be, k, 1, nkv, hd, &pos, &rope));
            P(2, be->ops->kv_append(be, &kv[l], k, v, 1, &pos));
            P(2, be->ops->attention(be, att, q, 1, &pos, &kv[l], &ap));
            P(0, be->ops->matmul(be, y, att, 1, &wo[l], 0));
            P(5, be->ops->add(be, x, x, y, H));
            P(3, be->ops->rms_norm(be, xn, x, NULL, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f));
            P(0, be->ops->matmul(be, g, xn, 1, &wg[l], 0));
            P(0, be->ops->matmul(be, u, xn, 1, &wu[l], 0));
            P(5, be->ops->glu(be, g, g, u, 1, F, F, PT_GLU_SILU));
            P(0, be->ops->matmul(be, y, g, 1, &wd[l], 0));
            P(5, be->ops->add(be, x, x, y, H));
        }
        P(3, be->ops->rms_norm(be, xn, x, NULL, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f));
        P(1, be->ops->matmul(be, logits, xn, 1, &emb, 0));
        P(5, be->ops->argmax(be, &am, logits, 1, V));
        double t2 = now();
        tok = am;
        if (t1 - t0 < best_rd) best_rd = t1 - t0;
        if (t2 - t1 < best_step) best_step = t2 - t1;
    }
    double gb = total_bytes / 1e9;
    printf("llama-3.2-1b q%d%s threads=%d depth=%d: %.2f tok/s, weights %.2f GB -> %.1f GB/s; streaming read %.1f GB/s; "
           "bw_fraction %.2f\n",
           bits, i8 ? " int8-act" : "", nth, D, 1.0 / best_step, gb, gb / best_step, gb / best_rd,
           (gb / best_step) / (gb / best_rd));
    const char *nm[6] = {"matmul", "logits", "attn+kv", "rmsnorm", "rope", "other"};
    double tot = 0;
    for (int i = 0; i < 6; i++) tot += prof[i];
    for (int i = 0; i < 6; i++) printf("  %-8s %6.2f ms/step %5.1f%%\n", nm[i], 1e3 * prof[i] / steps, 100 * prof[i] / tot);
    pt_pool_free(&pool);
    pt_backend_free(&be);
    return 0;
}
