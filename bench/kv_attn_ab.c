/* KV-cache modes at long context, paired in one run (not part of the build or
 * the tests): one decode query at position D-1 over D keys for the
 * gemma-3-4b attention shape (8 query heads, 4 KV heads, head_dim 256), bf16
 * activations, several layers' worth of distinct caches so they stream from
 * memory. Modes, interleaved A B C D E per round and repeated:
 *   bf16 KV (exact) | 8-bit KV exact | 8-bit KV fused | 4-bit KV exact | 4-bit KV fused
 * Prints the median ms per layer of each mode and its cache bytes.
 *   cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc -pthread -o build/kv_attn_ab bench/kv_attn_ab.c \
 *      build/libpetrel.a -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -ldl
 *   build/kv_attn_ab [D=8192] [threads=2] [layers=8] [rounds=7] [kv_heads=4]
 * kv_heads 1 with 4 query heads is the gemma-3-1b shape. */
#include "backend/backend.h"
#include "base/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int D = argc > 1 ? atoi(argv[1]) : 8192, nth = argc > 2 ? atoi(argv[2]) : 2;
    int L = argc > 3 ? atoi(argv[3]) : 8, rounds = argc > 4 ? atoi(argv[4]) : 7;
    const int nkv = argc > 5 ? atoi(argv[5]) : 4, nh = 2 * nkv > 4 ? 2 * nkv : 4, hd = 256, gs = 64;
    if (D < 1 || L < 1 || rounds < 1 || rounds > 64 || nkv < 1 || nkv > 16) return 2;
    pt_backend *be;
    pt_cpu_params cp = {.n_threads = nth, .act = PT_ACT_BF16};
    if (pt_backend_cpu_create(&be, &cp) != PT_OK) return 1;
    /* [mode 0..2: bf16, q8, q4][layer] */
    pt_kv_layer *kv = calloc((size_t)3 * L, sizeof *kv);
    float *k = malloc(sizeof(float) * nkv * hd), *v = malloc(sizeof(float) * nkv * hd);
    size_t bytes[3] = {0};
    for (int md = 0; md < 3; md++)
        for (int l = 0; l < L; l++) {
            pt_kv_layer *c = &kv[md * L + l];
            int bits = md == 0 ? 0 : md == 1 ? 8 : 4;
            *c = (pt_kv_layer){.n_kv = nkv, .head_dim = hd, .capacity = D, .dtype = PT_FT_BF16, .bits = bits,
                               .group_size = bits ? gs : 0};
            size_t rows = (size_t)nkv * D;
            size_t kb = bits ? rows * hd * bits / 8 : rows * hd * 2, pb = rows * (hd / gs) * 2;
            c->k = be->ops->alloc(be, kb);
            c->v = be->ops->alloc(be, kb);
            if (bits) {
                c->k_scales = be->ops->alloc(be, pb);
                c->k_biases = be->ops->alloc(be, pb);
                c->v_scales = be->ops->alloc(be, pb);
                c->v_biases = be->ops->alloc(be, pb);
            }
            bytes[md] = 2 * (kb + (bits ? 2 * pb : 0));
            for (int32_t p = 0; p < D; p++) {
                for (int i = 0; i < nkv * hd; i++) {
                    k[i] = pt_round_bf16((float)((i * 7 + p * 3 + l) % 19) / 19.0f - 0.5f);
                    v[i] = pt_round_bf16((float)((i * 5 + p + l) % 23) / 23.0f - 0.5f);
                }
                if (be->ops->kv_append(be, c, k, v, 1, &p) != PT_OK) return 1;
            }
        }
    float *q = aligned_alloc(64, (size_t)nh * hd * 4), *o = aligned_alloc(64, (size_t)nh * hd * 4);
    for (int i = 0; i < nh * hd; i++) q[i] = pt_round_bf16((float)(i % 17) / 17.0f - 0.5f);
    int32_t pos = D - 1;
    const char *names[5] = {"bf16 KV", "8-bit KV exact", "8-bit KV fused", "4-bit KV exact", "4-bit KV fused"};
    const int cache_of[5] = {0, 1, 1, 2, 2}, fused_of[5] = {0, 0, 1, 0, 1};
    double t[5][64];
    for (int r = -1; r < rounds; r++) /* round -1 warms up */
        for (int md = 0; md < 5; md++) {
            pt_attn a = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / 16, .fused_decode = fused_of[md]};
            double t0 = now();
            for (int l = 0; l < L; l++)
                if (be->ops->attention(be, o, q, 1, &pos, &kv[cache_of[md] * L + l], &a) != PT_OK) return 1;
            if (r >= 0) t[md][r] = (now() - t0) * 1e3 / L;
        }
    printf("decode attention, %d heads / %d KV heads x %d, D=%d, %d threads, %d layers x %d rounds (median ms "
           "per layer)\n", nh, nkv, hd, D, nth, L, rounds);
    double base = 0;
    for (int md = 0; md < 5; md++) {
        qsort(t[md], (size_t)rounds, sizeof(double), cmp);
        double med = t[md][rounds / 2];
        if (md == 0) base = med;
        printf("  %-16s %8.3f ms  cache %7.2f MiB/layer  %5.2fx vs bf16\n", names[md], med,
               bytes[cache_of[md]] / 1048576.0, base / med);
    }
    return 0;
}
