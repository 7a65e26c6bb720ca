/* Continuous-batching benchmark (docs/batching.md): aggregate decode tokens/s
 * of N concurrent greedy streams on one model, A/B in one run:
 *   interleaved: each stream's token through pt_session_prompt(s, &id, 1),
 *                one after the other (the server's loop before batching);
 *   batched:     all N tokens through one pt_session_decode_batch call.
 * Both decode the same tokens (checked: the batched streams must produce the
 * interleaved streams' greedy tokens), so only the time differs. The two
 * modes alternate per round to share the machine's noise.
 *
 * Build and run (from the repository root, after `make`):
 *   cc -O2 -Iinclude -Isrc -o build/batch_bench bench/batch_bench.c build/libpetrel.a \
 *      $(pkg-config --libs libcjson libpcre2-8 libutf8proc libmicrohttpd) -lm -ldl -pthread
 *   build/batch_bench MODEL THREADS TOKENS [N ...]
 * MODEL: a model directory, or synthetic:NAME for a published shape with
 * random 4-bit weights (pt_model_synthetic). ROUNDS=k (environment) sets the
 * rounds per mode (default 3, best kept); DEVICE=cuda runs on the GPU (link
 * against the CUDA build's libpetrel.a: see bench/RESULTS.md for the command).
 * PROFILE=k (environment; DEVICE=cuda, built with -DPT_BENCH_CUDA_PROFILE
 * and linked with cudart): after the A/B of each N, k more batched steps of
 * N streams inside cudaProfilerStart/Stop, for `ncu --profile-from-start off`
 * (per-kernel time of a batched step; bench/RESULTS.md), with their wall time.
 * Not a test: prints one line per N. */
#include "petrel.h"

#include "model/model.h" /* pt_model_synthetic */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#ifdef PT_BENCH_CUDA_PROFILE
int cudaProfilerStart(void); /* cuda_profiler_api.h (cudaError_t is an int-sized enum) */
int cudaProfilerStop(void);
int cudaDeviceSynchronize(void);
#endif

static int argmax(const float *x, int V) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, ": %s\n", pt_last_error());                                                \
        exit(1);                                                                                   \
    } while (0)

/* Decodes `tokens` tokens on each of n fresh sessions (prompted with 8
 * tokens each); returns seconds spent decoding; toks[i*tokens + t] gets the
 * tokens. */
static double run(pt_model *m, int n, int tokens, int batched, int32_t *toks, int profile) {
    int V = pt_model_vocab_size(m);
    pt_session *ss[64];
    for (int i = 0; i < n; i++) {
        if (pt_session_create(m, NULL, &ss[i]) != PT_OK) DIE("session");
        int32_t p[8];
        for (int j = 0; j < 8; j++) p[j] = (int32_t)((i * 131 + j * 37 + 5) % V);
        if (pt_session_prompt(ss[i], p, 8) != PT_OK) DIE("prompt");
    }
    double t0 = now();
#ifdef PT_BENCH_CUDA_PROFILE
    if (profile) cudaDeviceSynchronize(), cudaProfilerStart(), t0 = now();
#else
    (void)profile;
#endif
    for (int t = 0; t < tokens; t++) {
        int32_t ids[64];
        for (int i = 0; i < n; i++) ids[i] = toks[i * tokens + t] = argmax(pt_session_logits(ss[i]), V);
        if (batched) {
            if (pt_session_decode_batch(ss, ids, n) != PT_OK) DIE("decode_batch");
        } else {
            for (int i = 0; i < n; i++)
                if (pt_session_prompt(ss[i], &ids[i], 1) != PT_OK) DIE("decode");
        }
    }
    double dt = now() - t0;
#ifdef PT_BENCH_CUDA_PROFILE
    if (profile) cudaDeviceSynchronize(), dt = now() - t0, cudaProfilerStop();
#endif
    for (int i = 0; i < n; i++) pt_session_free(&ss[i]);
    return dt;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL THREADS TOKENS N [N ...]\n", argv[0]);
        return 2;
    }
    pt_model_params mp = pt_model_default_params();
    mp.n_threads = atoi(argv[2]);
    /* DEVICE=cuda (environment) runs on the GPU (the CUDA build) */
    mp.device = getenv("DEVICE") && !strcmp(getenv("DEVICE"), "cuda") ? PT_DEVICE_CUDA : PT_DEVICE_CPU;
    int tokens = atoi(argv[3]);
    pt_model *m = NULL;
    if (!strncmp(argv[1], "synthetic:", 10)) {
        if (pt_model_synthetic(argv[1] + 10, "q4", &mp, &m) != PT_OK) DIE("synthetic %s", argv[1] + 10);
    } else if (pt_model_load(argv[1], &mp, &m) != PT_OK)
        DIE("load %s", argv[1]);
    int rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 3;
    if (rounds < 1) rounds = 1;
    printf("model %s, backend %s, %d tokens per stream, best of %d rounds\n", argv[1], pt_model_backend_name(m),
           tokens, rounds);
    for (int a = 4; a < argc; a++) {
        int n = atoi(argv[a]);
        if (n < 1 || n > 64) continue;
        int32_t *ta = malloc((size_t)n * tokens * 4), *tb = malloc((size_t)n * tokens * 4);
        double best[2] = {1e30, 1e30};
        for (int round = 0; round < rounds; round++)
            for (int mode = 0; mode < 2; mode++) {
                double dt = run(m, n, tokens, mode, mode ? tb : ta, 0);
                if (dt < best[mode]) best[mode] = dt;
            }
        int same = !memcmp(ta, tb, (size_t)n * tokens * 4);
        double agg_i = n * tokens / best[0], agg_b = n * tokens / best[1];
        printf("streams %2d: interleaved %8.1f tok/s  batched %8.1f tok/s  (x%.2f)  per stream batched %7.1f tok/s  "
               "tokens %s\n",
               n, agg_i, agg_b, agg_b / agg_i, agg_b / n, same ? "identical" : "DIFFER");
        int prof = getenv("PROFILE") ? atoi(getenv("PROFILE")) : 0;
        if (prof > 0) {
            int32_t *tp = malloc((size_t)n * prof * 4);
            double dt = run(m, n, prof, 1, tp, 1);
            printf("streams %2d: %d profiled batched steps, %.2f ms per step (wall, under the profiler)\n", n, prof,
                   dt / prof * 1e3);
            free(tp);
        }
        free(ta);
        free(tb);
    }
    pt_model_free(&m);
    return 0;
}
