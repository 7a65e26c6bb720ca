/* Long-context decode attention benchmark (not part of the build or the
 * tests): one query token at position D-1 over a bf16 cache of D keys
 * (32 query heads, 8 KV heads, head_dim 64: llama-3.2-1b), through the op
 * table, for several layers' worth of distinct caches (so the cache streams
 * from memory when D is large). Reports ms per layer and the cache read rate.
 * BITS 4 or 8: an MLX-quantized cache (group 64, bf16 scales and biases,
 * made-up codes) instead; FUSED 1: --fused-decode-attn's kernel; HD 128:
 * llama-3.1-8b's heads (32 query heads, 8 KV heads of 128); NKV 1 with HD
 * 256: gemma-3-1b's (4 query heads, one KV head of 256); G: query heads per
 * KV head (default 4).
 *   dev/build.sh && dev/bench_decode_attn [D] [threads] [layers] [reps] [BITS] [FUSED] [HD] [NKV] [G] */
#include "backend/backend.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int D = argc > 1 ? atoi(argv[1]) : 8192, nth = argc > 2 ? atoi(argv[2]) : 2;
    int L = argc > 3 ? atoi(argv[3]) : 16, reps = argc > 4 ? atoi(argv[4]) : 5;
    int bits = argc > 5 ? atoi(argv[5]) : 0, fused = argc > 6 ? atoi(argv[6]) : 0;
    int nkv = argc > 8 ? atoi(argv[8]) : 8, nh = (argc > 9 ? atoi(argv[9]) : 4) * nkv, hd = argc > 7 ? atoi(argv[7]) : 64, gs = 64;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    pt_kv_layer *kv = calloc(L, sizeof *kv);
    size_t bytes = bits ? (size_t)D * nkv * (hd * bits / 8 + 2 * 2 * hd / gs) : (size_t)D * nkv * hd * 2;
    for (int l = 0; l < L; l++) {
        if (bits) {
            size_t cb = (size_t)D * nkv * hd * bits / 8, pb = (size_t)D * nkv * (hd / gs) * 2;
            kv[l] = (pt_kv_layer){.n_kv = nkv, .head_dim = hd, .capacity = D, .dtype = PT_FT_BF16, .bits = bits,
                                  .group_size = gs};
            void **bufs[6] = {&kv[l].k, &kv[l].v, &kv[l].k_scales, &kv[l].k_biases, &kv[l].v_scales, &kv[l].v_biases};
            for (int b = 0; b < 6; b++) {
                size_t nbytes = b < 2 ? cb : pb;
                *bufs[b] = be->ops->alloc(be, nbytes);
                if (b < 2)
                    for (size_t i = 0; i < nbytes; i++) ((uint8_t *)*bufs[b])[i] = (uint8_t)((i * 37 + l + b) * 11);
                else
                    for (size_t i = 0; i < nbytes / 2; i++)
                        ((uint16_t *)*bufs[b])[i] =
                            pt_f32_to_bf16(b % 2 ? 0.01f * (float)((i * 3 + l) % 7) - 0.5f : 0.01f + 0.001f * (i % 5));
            }
            continue;
        }
        kv[l] = (pt_kv_layer){.n_kv = nkv, .head_dim = hd, .capacity = D, .dtype = PT_FT_BF16};
        kv[l].k = be->ops->alloc(be, bytes);
        kv[l].v = be->ops->alloc(be, bytes);
        uint16_t *k = kv[l].k, *v = kv[l].v;
        for (size_t i = 0; i < bytes / 2; i++) {
            k[i] = pt_f32_to_bf16((float)((i * 7 + l) % 19) / 19.0f - 0.5f);
            v[i] = pt_f32_to_bf16((float)((i * 5 + l) % 23) / 23.0f - 0.5f);
        }
    }
    float *q = aligned_alloc(64, nh * hd * 4), *o = aligned_alloc(64, nh * hd * 4);
    for (int i = 0; i < nh * hd; i++) q[i] = pt_round_bf16((float)(i % 17) / 17.0f - 0.5f);
    int32_t pos = D - 1;
    pt_attn ap = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .fused_decode = fused};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int l = 0; l < L; l++) be->ops->attention(be, o, q, 1, &pos, &kv[l], &ap);
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("decode attention D=%d heads=%d/%d hd=%d bits=%d fused=%d threads=%d: %.3f ms per layer, cache read %.1f GB/s\n", D, nh, nkv, hd, bits, fused, nth, best / L * 1e3,
           2.0 * bytes * L / best / 1e9);
    pt_backend_free(&be);
    return 0;
}
