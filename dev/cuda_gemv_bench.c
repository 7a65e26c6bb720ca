/* Decode GEMV A/B on the GPU: the tensor-core GEMV on the repacked layout
 * (gemv_tc.cu, "new") against the previous tensor-core GEMV on the MLX
 * layout (gemv_mma.cuh, "old": weights prepared with the repack off),
 * through the CUDA op table, on llama-3.2-1b and llama-3.1-8b projection
 * shapes, for 1, 8 and 64 activation rows (64 rows: matmul_rows, which the
 * old kernel runs as 8 launches of 8). Weights are random MLX affine codes with
 * random scales/biases, replicated so one timed pass reads more than the
 * 60 MB L2 (rotating copies); every timing is a CUDA graph of matmuls
 * replayed back to back (what compiled decode runs), median of 5 replays.
 * Also checks, per shape: new vs old relative difference (same bf16
 * inputs), and batch invariance of the new kernel (64 rows in one launch
 * give bit-identical outputs to each row alone).
 * Not a test; built by dev/build_cuda.sh against build-cuda/libpetrel.a.
 * Then the new kernel's launch shapes above 8 rows: "w T16" is 16 rows with
 * the default 16-warp blocks, "n T16" and "n T64" are 16 and 64 rows with
 * 8-warp blocks (PETREL_CUDA_TC_WIDE=0, the previous shape; compare with
 * "w T16" and "new T64"). Same bits either way (inv64 checks the default).
 * GEMV_QUICK=1 in the environment: 4-bit g64 only (8-bit on one shape).
 * GEMV_SHAPES="8b gate/up,1b down" in the environment: only the named shapes.
 * GEMV_LOOPS="0 1 2" in the environment: instead of old vs new, the new
 * kernel's inner loops (PETREL_CUDA_TC_LOOP values) at T = 1, 8, 64,
 * round-robin, best of 3, each variant's bits compared with the first's.
 * Usage: cuda_gemv_bench */
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../tests/cuda/bench_util.h"

void pt_cuda_tc_select(int on); /* gemv_tc_repack.cu: repack weights prepared from now on */
void pt_cuda_tc_wide(int on);   /* gemv_tc.cu: 16-warp blocks above 8 rows (1) or 8 (0) */
void pt_cuda_tc_loop(int lv);  /* gemv_tc.cu: the GEMV's inner loop (PETREL_CUDA_TC_LOOP 0, 1, 2) */

static float rf(void) { return (float)(ru() % 20001) / 10000.f - 1.f; }

#define MAXC 64
typedef struct {
    pt_backend *be;
    pt_matrix w[MAXC];
    int nc;
    float *x, *y;
} setup;

/* µs per matmul: graph of reps passes over the nc copies, median of 5 replays. */
static pt_status mm(pt_backend *be, float *y, const float *x, int T, const pt_matrix *w) {
    return T > 8 ? be->ops->matmul_rows(be, y, x, T, w, 0) : be->ops->matmul(be, y, x, T, w, 0);
}
static double time_graph(setup *st, int T, int reps) {
    pt_backend *be = st->be;
    for (int c = 0; c < st->nc; c++) /* eager first: module load, smem attributes */
        if (mm(be, st->y, st->x, T, &st->w[c]) != PT_OK) DIE("matmul");
    if (be->ops->sync(be) != PT_OK) DIE("sync");
    pt_cuda_graph *g = NULL;
    if (pt_cuda_graph_begin(be) != PT_OK) DIE("begin");
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < st->nc; c++)
            if (mm(be, st->y, st->x, T, &st->w[c]) != PT_OK) DIE("matmul (capture)");
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

int main(void) {
    pt_backend *be = NULL;
    if (pt_backend_cuda_create(&be, &(pt_cuda_params){.device = 0, .act = PT_ACT_BF16}) != PT_OK) DIE("backend");
    pt_backend_limits lim = {.max_tokens = 64, .max_cols = 14336, .max_ctx = 16, .max_heads = 1, .max_head_dim = 64};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");
    double read_gbs = 0;
    if (pt_cuda_read_bandwidth((size_t)2 << 30, &read_gbs) != PT_OK) DIE("read bandwidth");
    printf("read roofline: %.0f GB/s (2 GiB, 16-byte loads)\n", read_gbs);

    static const struct { const char *name; int64_t N, K; } shapes[] = {
        {"1b q/o", 2048, 2048},    {"1b k/v", 512, 2048},      {"1b gate/up", 8192, 2048},
        {"1b down", 2048, 8192},   {"8b q/o", 4096, 4096},     {"8b k/v", 1024, 4096},
        {"8b gate/up", 14336, 4096}, {"8b down", 4096, 14336}, {"lm_head 1b", 128256, 2048},
        {"lm_head 8b", 128256, 4096},
    };
    static const int kinds[][2] = {{4, 64}, {8, 64}, {4, 32}, {4, 128}, {8, 32}, {8, 128}};
    printf("%-11s %4s %3s %6s | %7s %7s %5s %5s | %7s %7s | %7s %7s %5s | %8s %5s | %6s %6s %6s\n", "shape", "bits", "gs",
           "MB", "old T1", "new T1", "GB/s", "GB/s", "old T8", "new T8", "old T64", "new T64", "GB/s", "rel diff",
           "inv64", "w T16", "n T16", "n T64");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 6; k++) {
            const int bits = kinds[k][0], gs = kinds[k][1];
            if (k >= 2 && strcmp(shapes[s].name, "8b gate/up") && strcmp(shapes[s].name, "1b q/o")) continue;
            if (getenv("GEMV_QUICK") && (k >= 2 || (k == 1 && strcmp(shapes[s].name, "8b gate/up")) ||
                                         !strcmp(shapes[s].name, "lm_head 1b")))
                continue;
            const char *only = getenv("GEMV_SHAPES");
            if (only && !strstr(only, shapes[s].name)) continue;
            const int64_t N = shapes[s].N, K = shapes[s].K;
            size_t db = (size_t)N * K * bits / 8, sb = (size_t)N * (K / gs) * 2;
            double bytes = (double)db + 2.0 * sb;
            setup st[2] = {{.be = be}, {.be = be}}; /* old (MLX layout), new (repacked) */
            const int nc = (int)(300e6 / bytes) + 1 > MAXC ? MAXC : (int)(300e6 / bytes) + 1;
            uint32_t *data = malloc(db);
            uint16_t *sc = malloc(sb), *bi = malloc(sb);
            for (int c = 0; c < nc; c++) {
                for (size_t i = 0; i < db / 4; i++) data[i] = ru() ^ (ru() << 16);
                for (size_t i = 0; i < sb / 2; i++) {
                    sc[i] = pt_f32_to_bf16(0.002f + 0.02f * (rf() + 1.f));
                    bi[i] = pt_f32_to_bf16(0.1f * rf());
                }
                for (int v = 0; v < 2; v++) {
                    pt_cuda_tc_select(v);
                    st[v].w[c] = (pt_matrix){.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = bits,
                                             .group_size = gs, .data = data, .scales = sc, .biases = bi};
                    if (be->ops->prepare_weight(be, &st[v].w[c], shapes[s].name) != PT_OK) DIE("prepare");
                    st[v].nc = c + 1;
                }
            }
            free(data), free(sc), free(bi);
            float *xh = malloc((size_t)64 * K * 4);
            for (int64_t i = 0; i < 64 * K; i++) xh[i] = pt_bf16_to_f32(pt_f32_to_bf16(rf()));
            float *x = be->ops->alloc(be, (size_t)64 * K * 4), *y = be->ops->alloc(be, (size_t)64 * N * 4);
            be->ops->upload(be, x, xh, (size_t)64 * K * 4);
            for (int v = 0; v < 2; v++) st[v].x = x, st[v].y = y;
            /* correctness: new vs old (T = 1); batch invariance of new (64 rows vs each alone) */
            float *y1 = malloc((size_t)N * 4), *y2 = malloc((size_t)N * 4), *y64 = malloc((size_t)64 * N * 4);
            if (mm(be, y, x, 1, &st[0].w[0]) != PT_OK) DIE("old");
            be->ops->download(be, y1, y, (size_t)N * 4);
            if (mm(be, y, x, 1, &st[1].w[0]) != PT_OK) DIE("new");
            be->ops->download(be, y2, y, (size_t)N * 4);
            double num = 0, den = 0;
            for (int64_t i = 0; i < N; i++) {
                num += (double)(y1[i] - y2[i]) * (y1[i] - y2[i]);
                den += (double)y1[i] * y1[i];
            }
            int inv = 1;
            if (mm(be, y, x, 64, &st[1].w[0]) != PT_OK) DIE("new T=64");
            be->ops->download(be, y64, y, (size_t)64 * N * 4);
            for (int r = 0; r < 64 && inv; r++) {
                if (mm(be, y, x + (size_t)r * K, 1, &st[1].w[0]) != PT_OK) DIE("new row");
                be->ops->download(be, y1, y, (size_t)N * 4);
                if (memcmp(y1, y64 + (size_t)r * N, (size_t)N * 4)) inv = 0;
            }
            const char *vars = getenv("GEMV_LOOPS");
            if (vars) { /* inner loops of the new kernel (PETREL_CUDA_TC_LOOP values), round-robin */
                int vl[8];
                const int nv = bench_ints(vars, vl, 8);
                static const int Tv[3] = {1, 8, 64};
                double tv[8][3];
                int same[8];
                for (int v = 0; v < nv; v++) {
                    same[v] = 1;
                    for (int ti = 0; ti < 3; ti++) tv[v][ti] = 1e9;
                }
                float *r = malloc((size_t)64 * N * 4);
                for (int v = 1; v < nv; v++) /* bits: each variant against the first, T = 1, 8 and 64 */
                    for (int ti = 0; ti < 3; ti++) {
                        pt_cuda_tc_loop(vl[0]);
                        if (mm(be, y, x, Tv[ti], &st[1].w[0]) != PT_OK) DIE("variant");
                        be->ops->download(be, r, y, (size_t)Tv[ti] * N * 4);
                        pt_cuda_tc_loop(vl[v]);
                        if (mm(be, y, x, Tv[ti], &st[1].w[0]) != PT_OK) DIE("variant");
                        be->ops->download(be, y64, y, (size_t)Tv[ti] * N * 4);
                        if (memcmp(r, y64, (size_t)Tv[ti] * N * 4)) same[v] = 0;
                    }
                free(r);
                for (int round = 0; round < 3; round++)
                    for (int ti = 0; ti < 3; ti++)
                        for (int v = 0; v < nv; v++) {
                            pt_cuda_tc_loop(vl[v]);
                            const double tt = time_graph(&st[1], Tv[ti], ti == 0 ? 4 : 1);
                            if (tt < tv[v][ti]) tv[v][ti] = tt;
                        }
                pt_cuda_tc_loop(vl[0]);
                for (int v = 0; v < nv; v++)
                    printf("%-11s %4d %3d %6.1f | loop %d | T1 %7.2f (%5.0f GB/s) T8 %7.2f T64 %7.2f | inv64 %s | %s\n",
                           shapes[s].name, bits, gs, bytes / 1e6, vl[v], tv[v][0], bytes / tv[v][0] / 1e3, tv[v][1],
                           tv[v][2], inv ? "ok" : "DIFF", v ? (same[v] ? "bits = first" : "bits DIFFER") : "reference");
                goto next_shape;
            }
            /* timing: old and new interleaved, two rounds, best of each */
            static const int Tv[3] = {1, 8, 64};
            double tv[2][3] = {{1e9, 1e9, 1e9}, {1e9, 1e9, 1e9}};
            for (int round = 0; round < 2; round++)
                for (int ti = 0; ti < 3; ti++)
                    for (int v = 0; v < 2; v++) {
                        double tt = time_graph(&st[v], Tv[ti], ti == 0 ? 4 : 1);
                        if (tt < tv[v][ti]) tv[v][ti] = tt;
                    }
            double tw[3] = {1e9, 1e9, 1e9};
            for (int round = 0; round < 2; round++)
                for (int v = 0; v < 3; v++) {
                    pt_cuda_tc_wide(v == 0);
                    const double tt = time_graph(&st[1], v == 2 ? 64 : 16, 1);
                    if (tt < tw[v]) tw[v] = tt;
                }
            pt_cuda_tc_wide(1);
            printf("%-11s %4d %3d %6.1f | %7.2f %7.2f %5.0f %5.0f | %7.2f %7.2f | %7.2f %7.2f %5.0f | %8.2e %5s | %6.2f "
                   "%6.2f %6.2f\n",
                   shapes[s].name, bits, gs, bytes / 1e6, tv[0][0], tv[1][0], bytes / tv[0][0] / 1e3,
                   bytes / tv[1][0] / 1e3, tv[0][1], tv[1][1], tv[0][2], tv[1][2], bytes / tv[1][2] / 1e3,
                   sqrt(num / (den + 1e-30)), inv ? "ok" : "DIFF", tw[0], tw[1], tw[2]);
        next_shape:
            free(y1), free(y2), free(y64), free(xh);
            be->ops->dealloc(be, x);
            be->ops->dealloc(be, y);
            for (int v = 0; v < 2; v++)
                for (int c = 0; c < st[v].nc; c++) be->ops->release_weight(be, &st[v].w[c]);
            fflush(stdout);
        }
    be->ops->free(be);
    return 0;
}
