/* Decode GEMV A/B on the GPU: the tensor-core kernel (gemv_mma.cuh) against
 * the FMA kernel (matmul.cu), through the CUDA op table, on llama-3.2-1b and
 * llama-3.1-8b projection shapes. Weights are random MLX affine codes with
 * random scales/biases, replicated so one timed pass reads more than the
 * 60 MB L2 (rotating copies); every timing is a CUDA graph of matmuls
 * replayed back to back (what compiled decode runs), median of 5 replays.
 * Also checks, per shape: mma vs FMA relative difference (both against the
 * same bf16 inputs), and batch invariance (T = 8 rows in one launch give
 * bit-identical outputs to each row alone).
 * Not a test; built by dev/build_cuda.sh against build-cuda/libpetrel.a.
 * Variants: fma (the previous kernel), mma (gemv_mma_kernel), mma+pdl (launched with programmatic dependent
 * launch: in the timed chain every GEMV overlaps the previous one's tail).
 * GEMV_QUICK=1 in the environment: 4-bit g64 only (8-bit on one shape). Usage: cuda_gemv_bench [tiles wps ...] (extra launch
 * shapes of the default variant to time) */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void pt_cuda_gemv_select(int mode, int tiles, int wps, int pdl); /* matmul.cu, for benchmarks */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static uint64_t rs = 88172645463325252ull;
static uint32_t ru(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}
static float rf(void) { return (float)(ru() % 20001) / 10000.f - 1.f; }
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
#define DIE(...)                                    \
    do {                                            \
        fprintf(stderr, __VA_ARGS__);               \
        fprintf(stderr, ": %s\n", pt_last_error()); \
        exit(1);                                    \
    } while (0)

#define MAXC 64
typedef struct {
    pt_backend *be;
    pt_matrix w[MAXC];
    int nc;
    float *x, *y;
} setup;

/* µs per matmul: graph of reps passes over the nc copies, median of 5 replays. */
static double time_graph(setup *st, int T, int reps) {
    pt_backend *be = st->be;
    for (int c = 0; c < st->nc; c++) /* eager first: module load, smem attributes */
        if (be->ops->matmul(be, st->y, st->x, T, &st->w[c], 0) != PT_OK) DIE("matmul");
    if (be->ops->sync(be) != PT_OK) DIE("sync");
    pt_cuda_graph *g = NULL;
    if (pt_cuda_graph_begin(be) != PT_OK) DIE("begin");
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < st->nc; c++)
            if (be->ops->matmul(be, st->y, st->x, T, &st->w[c], 0) != PT_OK) DIE("matmul (capture)");
    if (pt_cuda_graph_end(be, &g) != PT_OK) DIE("end");
    pt_cuda_graph_launch(be, g);
    be->ops->sync(be);
    double t[5];
    for (int i = 0; i < 5; i++) {
        double t0 = now();
        pt_cuda_graph_launch(be, g);
        if (be->ops->sync(be) != PT_OK) DIE("sync");
        t[i] = (now() - t0) / (reps * st->nc);
    }
    pt_cuda_graph_free(&g);
    qsort(t, 5, sizeof t[0], cmpd);
    return t[2] * 1e6;
}

int main(int argc, char **argv) {
    pt_backend *be = NULL;
    if (pt_backend_cuda_create(&be, &(pt_cuda_params){.device = 0, .act = PT_ACT_BF16}) != PT_OK) DIE("backend");
    pt_backend_limits lim = {.max_tokens = 8, .max_cols = 14336, .max_ctx = 16, .max_heads = 1, .max_head_dim = 64};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");
    double read_gbs = 0;
    if (pt_cuda_read_bandwidth((size_t)2 << 30, &read_gbs) != PT_OK) DIE("read bandwidth");
    printf("read roofline: %.0f GB/s (2 GiB, 16-byte loads)\n", read_gbs);
    int extra = (argc - 1) / 2;

    static const struct { const char *name; int64_t N, K; } shapes[] = {
        {"1b q/o", 2048, 2048},    {"1b k/v", 512, 2048},      {"1b gate/up", 8192, 2048},
        {"1b down", 2048, 8192},   {"8b q/o", 4096, 4096},     {"8b k/v", 1024, 4096},
        {"8b gate/up", 14336, 4096}, {"8b down", 4096, 14336}, {"lm_head 1b", 128256, 2048},
        {"lm_head 8b", 128256, 4096},
    };
    static const int kinds[][2] = {{4, 64}, {8, 64}, {4, 32}, {4, 128}, {8, 32}, {8, 128}};
    printf("%-11s %4s %4s %7s | %7s %7s %7s | %5s %5s %5s | %7s %7s | %8s %s\n", "shape", "bits", "gs", "MB", "fma",
           "mma", "mma+pdl", "GB/s", "GB/s", "GB/s", "mma T8", "fma T8", "rel diff", "invariance");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 6; k++) {
            const int bits = kinds[k][0], gs = kinds[k][1];
            if (k >= 2 && strcmp(shapes[s].name, "8b gate/up") && strcmp(shapes[s].name, "1b q/o")) continue;
            if (getenv("GEMV_QUICK") && (k >= 2 || (k == 1 && strcmp(shapes[s].name, "8b gate/up")) ||
                                         !strcmp(shapes[s].name, "lm_head 1b")))
                continue;
            const int64_t N = shapes[s].N, K = shapes[s].K;
            size_t db = (size_t)N * K * bits / 8, sb = (size_t)N * (K / gs) * 2;
            double bytes = (double)db + 2.0 * sb;
            setup st = {.be = be};
            st.nc = (int)(300e6 / bytes) + 1;
            if (st.nc > MAXC) st.nc = MAXC;
            uint32_t *data = malloc(db);
            uint16_t *sc = malloc(sb), *bi = malloc(sb);
            for (int c = 0; c < st.nc; c++) {
                for (size_t i = 0; i < db / 4; i++) data[i] = ru() ^ (ru() << 16);
                for (size_t i = 0; i < sb / 2; i++) {
                    sc[i] = pt_f32_to_bf16(0.002f + 0.02f * (rf() + 1.f));
                    bi[i] = pt_f32_to_bf16(0.1f * rf());
                }
                st.w[c] = (pt_matrix){.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits, .group_size = gs,
                                      .data = data, .scales = sc, .biases = bi};
                if (be->ops->prepare_weight(be, &st.w[c], shapes[s].name) != PT_OK) DIE("prepare");
            }
            free(data), free(sc), free(bi);
            float *xh = malloc((size_t)8 * K * 4);
            for (int64_t i = 0; i < 8 * K; i++) xh[i] = pt_bf16_to_f32(pt_f32_to_bf16(rf()));
            st.x = be->ops->alloc(be, (size_t)8 * K * 4);
            st.y = be->ops->alloc(be, (size_t)8 * N * 4);
            float *yb = be->ops->alloc(be, (size_t)8 * N * 4);
            be->ops->upload(be, st.x, xh, (size_t)8 * K * 4);
            /* correctness: fma vs mma (T = 1); staged vs resident (T = 1, bits);
             * batch invariance (T = 8 in one launch vs each row alone) */
            float *y1 = malloc((size_t)N * 4), *y2 = malloc((size_t)N * 4), *y8 = malloc((size_t)8 * N * 4);
            pt_cuda_gemv_select(0, 1, 8, 0);
            if (be->ops->matmul(be, st.y, st.x, 1, &st.w[0], 0) != PT_OK) DIE("fma");
            be->ops->download(be, y1, st.y, (size_t)N * 4);
            pt_cuda_gemv_select(1, 1, 8, 0);
            if (be->ops->matmul(be, st.y, st.x, 1, &st.w[0], 0) != PT_OK) DIE("mma");
            be->ops->download(be, y2, st.y, (size_t)N * 4);
            double num = 0, den = 0;
            for (int64_t i = 0; i < N; i++) {
                num += (double)(y1[i] - y2[i]) * (y1[i] - y2[i]);
                den += (double)y1[i] * y1[i];
            }
            int inv = 1;
            pt_cuda_gemv_select(1, 1, 8, 0);
            if (be->ops->matmul(be, yb, st.x, 8, &st.w[0], 0) != PT_OK) DIE("mma T=8");
            be->ops->download(be, y8, yb, (size_t)8 * N * 4);
            for (int r = 0; r < 8 && inv; r++) {
                if (be->ops->matmul(be, st.y, st.x + (size_t)r * K, 1, &st.w[0], 0) != PT_OK) DIE("mma row");
                be->ops->download(be, y1, st.y, (size_t)N * 4);
                if (memcmp(y1, y8 + (size_t)r * N, (size_t)N * 4)) inv = 0;
            }
            /* timing: variants interleaved, two rounds, best of each */
            double tv[3] = {1e9, 1e9, 1e9};
            static const int vm[3][2] = {{0, 0}, {1, 0}, {1, 1}};
            for (int round = 0; round < 2; round++)
                for (int v = 0; v < 3; v++) {
                    pt_cuda_gemv_select(vm[v][0], 1, 8, vm[v][1]);
                    double tt = time_graph(&st, 1, 4);
                    if (tt < tv[v]) tv[v] = tt;
                }
            pt_cuda_gemv_select(1, 1, 8, 0);
            double tm8 = time_graph(&st, 8, 2);
            pt_cuda_gemv_select(0, 1, 8, 0);
            double tf8 = time_graph(&st, 8, 1);
            printf("%-11s %4d %4d %7.1f | %7.2f %7.2f %7.2f | %5.0f %5.0f %5.0f | %7.2f %7.2f | %8.2e %s\n",
                   shapes[s].name, bits, gs, bytes / 1e6, tv[0], tv[1], tv[2], bytes / tv[0] / 1e3,
                   bytes / tv[1] / 1e3, bytes / tv[2] / 1e3, tm8, tf8, sqrt(num / (den + 1e-30)), inv ? "ok" : "DIFF");
            for (int e = 0; e < extra; e++) {
                int tl = atoi(argv[1 + 2 * e]), wps = atoi(argv[2 + 2 * e]);
                pt_cuda_gemv_select(1, tl, wps, 0);
                double b = time_graph(&st, 1, 4);
                printf("    mma tiles %d wps %2d: %8.2f us %6.0f GB/s\n", tl, wps, b, bytes / b / 1e3);
            }
            pt_cuda_gemv_select(1, 1, 8, 0);
            free(y1), free(y2), free(y8), free(xh);
            be->ops->dealloc(be, st.x);
            be->ops->dealloc(be, st.y);
            be->ops->dealloc(be, yb);
            for (int c = 0; c < st.nc; c++) be->ops->release_weight(be, &st.w[c]);
            fflush(stdout);
        }
    be->ops->free(be);
    return 0;
}
