/* Long-context decode attention benchmark (not part of the build or the
 * tests): one query token at position D-1 over a bf16 cache of D keys
 * (32 query heads, 8 KV heads, head_dim 64: llama-3.2-1b), through the op
 * table, for several layers' worth of distinct caches (so the cache streams
 * from memory when D is large). Reports ms per layer and the cache read rate.
 *   dev/build.sh && dev/bench_decode_attn [D] [threads] [layers] [reps] */
#include "backend/backend.h"
#include "base/half.h"

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
    int nh = 32, nkv = 8, hd = 64;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    pt_kv_layer *kv = calloc(L, sizeof *kv);
    size_t bytes = (size_t)D * nkv * hd * 2;
    for (int l = 0; l < L; l++) {
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
    pt_attn ap = {.n_heads = nh, .head_dim = hd, .scale = 0.125f};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int l = 0; l < L; l++) be->ops->attention(be, o, q, 1, &pos, &kv[l], &ap);
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("decode attention D=%d threads=%d: %.3f ms per layer, cache read %.1f GB/s\n", D, nth, best / L * 1e3,
           2.0 * bytes * L / best / 1e9);
    pt_backend_free(&be);
    return 0;
}
