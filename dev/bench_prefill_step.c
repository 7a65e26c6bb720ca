/* Whole prefill chunk of a synthetic llama-3.2-1b through the op table (not
 * part of the build or the tests): T tokens at depth D through 16 layers
 * (hidden 2048, 32/8 heads of 64, FFN 8192), the final norm and the logits
 * of the last token (vocab 128256, tied), MLX 4- or 8-bit weights (group
 * 64), bf16 activations and KV cache. Prints tokens/s and the time per op
 * kind. With one thread the clock is the process's CPU time (robust to the
 * other processes of a shared machine), else wall time. ab = 1: the steps
 * alternate the prefill GEMM with x as integer pieces off / on
 * (pt_cpu_lever.xgemm for 4-bit weights, .xgemm8 for 8-bit) and each
 * variant's median and best are printed (a paired A/B in one process).
 *   dev/build.sh && dev/bench_prefill_step [bits] [threads] [T] [steps] [int8_act] [ab] */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/half.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "step_common.h"

/* time per op kind (the CPU ops are synchronous) */
static double prof_v[2][8], *prof = prof_v[0];
#define P(cat, call) do { double t_ = now(); call; prof[cat] += now() - t_; } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
int main(int argc, char **argv) {
    int bits = argc > 1 ? atoi(argv[1]) : 4, nth = argc > 2 ? atoi(argv[2]) : 2;
    int T = argc > 3 ? atoi(argv[3]) : 512, steps = argc > 4 ? atoi(argv[4]) : 2, i8 = argc > 5 ? atoi(argv[5]) : 0;
    int ab = argc > 6 ? atoi(argv[6]) : 0;
    const int D = 0;
    if (nth == 1) bench_clock = CLOCK_PROCESS_CPUTIME_ID;
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
    int cap = D + T;
    pt_kv_layer kv[16];
    bench_kv_fill(be, kv, L, nkv, hd, cap);
    bench_acts a = bench_acts_alloc(be, T, cap, H, nh, nkv, hd, F, V);
    float *x = a.x, *xn = a.xn, *q = a.q, *k = a.k, *v = a.v, *att = a.att, *g = a.g, *u = a.u, *y = a.y,
          *logits = a.logits;
    size_t Tz = (size_t)T;
    int32_t *toks = malloc(sizeof(int32_t) * Tz), *posv = malloc(sizeof(int32_t) * Tz);
    for (int i = 0; i < T; i++) toks[i] = (i * 7919) % V, posv[i] = D + i;
    int32_t am;
    double best_step = 1e30, *ts = calloc((size_t)steps + 2, sizeof *ts);
    int nts[2] = {0, 0};
    for (int s = 0; s < steps; s++) {
        int vi = ab ? s % 2 : 0;
        if (ab) *(bits == 8 ? &pt_cpu_lever.xgemm8 : &pt_cpu_lever.xgemm) = vi;
        prof = prof_v[vi];
        double t1 = now();
        P(5, be->ops->embed(be, x, toks, T, &emb, 1.0f));
        for (int l = 0; l < L; l++) {
            P(3, be->ops->rms_norm(be, xn, x, NULL, T, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f));
            P(0, be->ops->matmul(be, q, xn, T, &wq[l], 0));
            P(0, be->ops->matmul(be, k, xn, T, &wk[l], 0));
            P(0, be->ops->matmul(be, v, xn, T, &wv[l], 0));
            P(4, be->ops->rope(be, q, T, nh, hd, posv, &rope));
            P(4, be->ops->rope(be, k, T, nkv, hd, posv, &rope));
            P(2, be->ops->kv_append(be, &kv[l], k, v, T, posv));
            P(2, be->ops->attention(be, att, q, T, posv, &kv[l], &ap));
            P(0, be->ops->matmul(be, y, att, T, &wo[l], 0));
            P(5, be->ops->add(be, x, x, y, (int64_t)H * T));
            P(3, be->ops->rms_norm(be, xn, x, NULL, T, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f));
            P(0, be->ops->matmul(be, g, xn, T, &wg[l], 0));
            P(0, be->ops->matmul(be, u, xn, T, &wu[l], 0));
            P(5, be->ops->glu(be, g, g, u, T, F, F, PT_GLU_SILU));
            P(0, be->ops->matmul(be, y, g, T, &wd[l], 0));
            P(5, be->ops->add(be, x, x, y, (int64_t)H * T));
        }
        P(3, be->ops->rms_norm(be, xn, x + (size_t)(T - 1) * H, NULL, 1, H, norm, PT_FT_BF16, PT_RMS_W, 1e-5f));
        P(1, be->ops->matmul(be, logits, xn, 1, &emb, 0));
        P(5, be->ops->argmax(be, &am, logits, 1, V));
        double t2 = now();
        if (t2 - t1 < best_step) best_step = t2 - t1;
        ts[vi * ((steps + 1) / 2) + nts[vi]++] = t2 - t1;
    }
    for (int vi = 0; ab && vi < 2; vi++) {
        double *t = ts + vi * ((steps + 1) / 2);
        qsort(t, (size_t)nts[vi], sizeof *t, cmp_d);
        printf("  %s %d: pp%d median %.2f tok/s, best %.2f (%d steps), matmul %.1f ms/step\n",
               bits == 8 ? "xgemm8" : "xgemm", vi, T, T / t[nts[vi] / 2], T / t[0], nts[vi],
               1e3 * prof_v[vi][0] / nts[vi]);
    }
    printf("llama-3.2-1b q%d%s threads=%d: pp%d %.2f tok/s (%s, best of %d)\n", bits, i8 ? " int8-act" : "", nth, T,
           T / best_step, nth == 1 ? "CPU time" : "wall time", steps);
    const char *nm[6] = {"matmul", "logits", "attn+kv", "rmsnorm", "rope", "other"};
    double tot = 0;
    for (int i = 0; i < 6; i++) tot += prof_v[0][i] + prof_v[1][i];
    for (int i = 0; i < 6; i++)
        printf("  %-8s %7.1f ms/step %5.1f%%\n", nm[i], 1e3 * (prof_v[0][i] + prof_v[1][i]) / steps,
               100 * (prof_v[0][i] + prof_v[1][i]) / tot);
    pt_backend_free(&be);
    return 0;
}
