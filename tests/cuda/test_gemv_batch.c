/* Batch invariance of the CUDA decode GEMV: in bf16 activation mode a matmul
 * (and matmul_rows) of T = 2..64 rows (one tensor-core launch,
 * src/backend/cuda/gemv_tc.cu) must give every row bit-identical outputs to
 * the same row alone (T = 1), for 4- and 8-bit codes, groups 32/64/128, a
 * row count that is not a multiple of the 16-row tile, K with several
 * shared-memory stages and a partial one, a bias, and an expert of a
 * stacked weight (kept in the MLX layout: the previous tensor-core GEMV up
 * to 8 rows per launch). Continuous batching relies on
 * this: a request's tokens must not depend on what else is in the batch.
 * Above 8 rows the blocks of a cluster share each stage's x load (gemv_tc.cu,
 * PETREL_CUDA_TC_CLUSTER, off by default): two 4-bit g64 shapes are checked
 * again with clusters of 2 and 4 blocks, one of them with a block count that
 * is not a whole number of clusters.
 * The levers of those launches (PETREL_CUDA_TC_DRIFT: no barrier per x
 * stage; PETREL_CUDA_TC_XL: 4-bit x laid out per K block by the x
 * prepare; both on by default) are checked again each alone, and
 * 17..64 rows of 4-bit g64 weights on the warpgroup-MMA kernels
 * (PETREL_CUDA_TC_WG, gemv_wg_kernel.cuh), on and off: splits of 8
 * (clusters of 8 blocks, a partial quad of tiles) and of 4, their stage
 * refills by one elected lane (PETREL_CUDA_TC_WG_REFILL=2, the default:
 * every such launch counted); and those launches again with their refills
 * spread over the warps (=0), and the 33..64-row ones with their loop
 * unrolled over the rings' stages (PETREL_CUDA_TC_WG_UNROLL=2).
 * A weight of many tiles (12800 rows), not split (PETREL_CUDA_TC_S1) and
 * split, is checked as well.
 * The one-column kernels' unrolled ring loop (PETREL_CUDA_TC_LOOP=2; at one
 * row in both its builds, PETREL_CUDA_TC_LV4) is checked against loop 1 at
 * 1 and 8 rows, one to four x stages.
 * Tolerance against the CPU is test_cuda_ops's job; this test is exact.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU it reports SKIP. */
#include "test.h"
#include "test_rand.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void pt_cuda_tc_cluster(int n); /* gemv_tc.cu: blocks per cluster of the launches above 8 rows (1, 2, 4) */
void pt_cuda_tc_drift(int on);  /* gemv_tc.cu: above 8 rows, warps drift across x stages (1) or meet per stage (0) */
void pt_cuda_tc_xl(int on);    /* gemv_tc.cu: above 8 rows, 4-bit: the XL kernels (1) or not (0) */
void pt_cuda_tc_wg(int on);    /* gemv_tc.cu: 17..64 rows, 4-bit g64: the wgmma kernels (1) or not (0) */
void pt_cuda_tc_wg_plain(int on); /* gemv_tc.cu: a plain launch of 33..64 rows on them (1, default) or not (0) */
unsigned long long pt_cuda_tc_wg_count(void); /* and their launches so far */
void pt_cuda_tc_wg_refill(int v); /* gemv_tc.cu: wgmma refills by one elected lane: 0 none, 1 GLU, 2 all; -1 */
unsigned long long pt_cuda_tc_wg_refill_count(void); /* launches of that form so far */
void pt_cuda_tc_wg_unroll(int v); /* gemv_tc.cu: wgmma loop unrolled over the stages: 0 none, 1 GLU, 2 all; -1 */
unsigned long long pt_cuda_tc_wg_unroll_count(void); /* launches of that form so far */
void pt_cuda_tc_xp8(int on);   /* gemv_tc.cu: 2..8 rows on the XP kernels (1) or the 8-warp ones (0); -1: default */
void pt_cuda_tc_loop(int lv);  /* gemv_tc.cu: the inner loop (PETREL_CUDA_TC_LOOP 0..3; -1: the default) */
void pt_cuda_tc_lv4(int v);    /* gemv_tc.cu: loop 2 at one row in its 2-blocks-per-SM build: 2 always, 0 never */
unsigned long long pt_cuda_tc_lv2_count(void); /* launches of loop 2 so far */
void pt_cuda_tc_s1(int on);    /* gemv_tc.cu: weights of many tiles not split (1) or split as the others (0); -1 */

/* One weight (E experts of N × K), T random bf16 rows; returns 0 on a failed check. */
/* A random weight (E experts of N × K, bits/gs MLX affine, a bf16 bias if with_bias) in the
 * host buffers of b (rand_weight_free releases them). */
typedef struct {
    uint32_t *data;
    uint16_t *sc, *bi, *bias;
} rand_weight_bufs;
static pt_matrix rand_weight(int bits, int gs, int64_t E, int64_t N, int64_t K, int with_bias, rand_weight_bufs *b) {
    const int64_t ng = K / gs;
    b->data = malloc((size_t)(E * N * K * bits / 8));
    b->sc = malloc((size_t)(E * N * ng) * 2), b->bi = malloc((size_t)(E * N * ng) * 2);
    b->bias = malloc((size_t)(E * N) * 2);
    for (int64_t i = 0; i < E * N * K * bits / 32; i++) b->data[i] = ru32() ^ (ru32() << 21);
    for (int64_t i = 0; i < E * N * ng; i++) {
        b->sc[i] = pt_f32_to_bf16(rf(-0.05f, 0.05f));
        b->bi[i] = pt_f32_to_bf16(rf(-0.5f, 0.5f));
    }
    for (int64_t i = 0; i < E * N; i++) b->bias[i] = pt_f32_to_bf16(rf(-1, 1));
    return (pt_matrix){.rows = N, .cols = K, .n_experts = E > 1 ? E : 0, .dtype = PT_FT_BF16, .bits = bits,
                       .group_size = gs, .data = b->data, .scales = b->sc, .biases = b->bi,
                       .bias = with_bias ? b->bias : NULL, .bias_dtype = PT_FT_BF16};
}
static void rand_weight_free(rand_weight_bufs *b) { free(b->data), free(b->sc), free(b->bi), free(b->bias); }

/* check_one with the weight's role (pt_matrix.role); alone_out (or NULL):
 * the T = 1 outputs of the 64 rows, [64, N] */
static int check_role(pt_backend *be, int bits, int gs, int64_t E, int64_t N, int64_t K, int with_bias, int role,
                      float *alone_out) {
    rand_weight_bufs wb;
    pt_matrix w = rand_weight(bits, gs, E, N, K, with_bias, &wb);
    w.role = role;
    NEED(be->ops->prepare_weight(be, &w, "w") == PT_OK, "prepare: %s", pt_last_error());
    enum { TMAX = 64 };
    float *xh = malloc((size_t)(TMAX * K) * 4), *yb = malloc((size_t)(TMAX * N) * 4);
    float *y1 = malloc((size_t)(TMAX * N) * 4);
    for (int64_t i = 0; i < TMAX * K; i++) xh[i] = pt_round_bf16(rf(-2, 2));
    float *x = be->ops->alloc(be, (size_t)(TMAX * K) * 4), *y = be->ops->alloc(be, (size_t)(TMAX * N) * 4);
    NEED(x && y, "alloc");
    NEED(be->ops->upload(be, x, xh, (size_t)(TMAX * K) * 4) == PT_OK, "upload");
    int ok = 1;
    const int64_t e = E - 1;
    /* every row alone first */
    for (int r = 0; r < TMAX; r++) {
        NEED(be->ops->matmul(be, y + r * N, x + r * K, 1, &w, e) == PT_OK, "matmul T=1: %s", pt_last_error());
    }
    NEED(be->ops->download(be, y1, y, (size_t)(TMAX * N) * 4) == PT_OK, "download");
    static const int Ts[] = {2, 3, 8, 9, 16, 17, 31, 33, 48, 64};
    for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]) && ok; ti++)
        for (int rows_op = 0; rows_op < 2 && ok; rows_op++) {
            const int T = Ts[ti];
            /* expert stacks stay in the MLX layout (gemv_tc_repack.cu): there matmul
             * of more than 8 rows is the prefill GEMM; matmul_rows stays exact */
            if (E > 1 && T > 8 && !rows_op) continue;
            pt_status st = rows_op ? be->ops->matmul_rows(be, y, x, T, &w, e) : be->ops->matmul(be, y, x, T, &w, e);
            NEED(st == PT_OK, "matmul%s T=%d: %s", rows_op ? "_rows" : "", T, pt_last_error());
            NEED(be->ops->download(be, yb, y, (size_t)(T * N) * 4) == PT_OK, "download");
            for (int64_t i = 0; i < T * N && ok; i++)
                if (memcmp(&y1[i], &yb[i], 4)) {
                    CHECK(0, "%d-bit g%d N %lld K %lld: row %lld of T=%d (%s), output %lld: batched %.9g, alone %.9g",
                          bits, gs, (long long)N, (long long)K, (long long)(i / N), T, rows_op ? "rows" : "matmul",
                          (long long)(i % N), yb[i], y1[i]);
                    ok = 0;
                }
        }
    CHECK(ok, "%d-bit g%d: batch-invariant", bits, gs);
    if (alone_out) memcpy(alone_out, y1, (size_t)(TMAX * N) * 4);
    be->ops->dealloc(be, x);
    be->ops->dealloc(be, y);
    be->ops->release_weight(be, &w);
    rand_weight_free(&wb);
    free(xh), free(yb), free(y1);
    return ok;
}

static int check_one(pt_backend *be, int bits, int gs, int64_t E, int64_t N, int64_t K, int with_bias) {
    return check_role(be, bits, gs, E, N, K, with_bias, PT_ROLE_NONE, NULL);
}

/* The unrolled ring loop (loop 2) against loop 1 at T = 1 and 8 rows, bit
 * for bit, on one weight of N × K: K 2560 gives a warp fewer blocks than a
 * step (the tested tail only), K 14336 whole steps and a partial one, and
 * at 8 rows four x stages. Returns 0 on a failed check. */
static int check_loops(pt_backend *be, int bits, int gs, int64_t N, int64_t K) {
    enum { T8 = 8 };
    rand_weight_bufs wb;
    pt_matrix w = rand_weight(bits, gs, 1, N, K, 1, &wb);
    NEED(be->ops->prepare_weight(be, &w, "w") == PT_OK, "prepare: %s", pt_last_error());
    float *xh = malloc((size_t)(T8 * K) * 4), *ref = malloc((size_t)(T8 * N) * 4), *out = malloc((size_t)(T8 * N) * 4);
    for (int64_t i = 0; i < T8 * K; i++) xh[i] = pt_round_bf16(rf(-2, 2));
    float *x = be->ops->alloc(be, (size_t)(T8 * K) * 4), *y = be->ops->alloc(be, (size_t)(T8 * N) * 4);
    NEED(x && y, "alloc");
    NEED(be->ops->upload(be, x, xh, (size_t)(T8 * K) * 4) == PT_OK, "upload");
    int ok = 1;
    const unsigned long long c0 = pt_cuda_tc_lv2_count();
    pt_cuda_tc_xp8(0); /* 8 rows on the 8-warp kernels, where loop 2 runs */
    for (int T = 1; T <= T8 && ok; T += T8 - 1) {
        pt_cuda_tc_loop(1);
        NEED(be->ops->matmul(be, y, x, T, &w, 0) == PT_OK, "matmul loop 1: %s", pt_last_error());
        NEED(be->ops->download(be, ref, y, (size_t)(T * N) * 4) == PT_OK, "download");
        for (int v = 2; v >= 0 && ok; v -= 2) { /* one row: the 2- and the 4-blocks-per-SM builds */
            pt_cuda_tc_loop(2);
            pt_cuda_tc_lv4(v);
            NEED(be->ops->matmul(be, y, x, T, &w, 0) == PT_OK, "matmul loop 2: %s", pt_last_error());
            NEED(be->ops->download(be, out, y, (size_t)(T * N) * 4) == PT_OK, "download");
            for (int64_t i = 0; i < T * N && ok; i++)
                if (memcmp(&ref[i], &out[i], 4)) {
                    CHECK(0, "%d-bit g%d N %lld K %lld T %d, build %d: output %lld: loop 2 %.9g, loop 1 %.9g", bits, gs,
                          (long long)N, (long long)K, T, v, (long long)i, out[i], ref[i]);
                    ok = 0;
                }
        }
    }
    pt_cuda_tc_loop(-1);
    pt_cuda_tc_lv4(-1);
    pt_cuda_tc_xp8(-1);
    CHECK(pt_cuda_tc_lv2_count() - c0 == 4, "%d-bit g%d K %lld: %llu launches of loop 2, 4 expected", bits, gs,
          (long long)K, pt_cuda_tc_lv2_count() - c0);
    be->ops->dealloc(be, x);
    be->ops->dealloc(be, y);
    be->ops->release_weight(be, &w);
    rand_weight_free(&wb);
    free(xh), free(ref), free(out);
    return ok;
}

static void test_gemv_ring_loops(void) {
    char why[512];
    if (pt_cuda_device_count(why, sizeof why) == 0) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = NULL;
    REQUIRE(pt_backend_cuda_create(&be, &(pt_cuda_params){0, PT_ACT_BF16}) == PT_OK, "cuda: %s", pt_last_error());
    pt_backend_limits lim = {.max_tokens = 8, .max_ctx = 16, .max_heads = 1, .max_head_dim = 64, .max_cols = 14336};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "reserve: %s", pt_last_error());
    static const int bits[] = {4, 8}, gss[] = {32, 64, 128};
    static const int64_t Ks[] = {2560, 14336};
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int k = 0; k < 2; k++)
                if (!check_loops(be, bits[b], gss[g], 200, Ks[k])) goto done;
done:
    pt_backend_free(&be);
}

static void test_gemv_batch_invariant(void) {
    char why[512];
    if (pt_cuda_device_count(why, sizeof why) == 0) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = NULL;
    REQUIRE(pt_backend_cuda_create(&be, &(pt_cuda_params){0, PT_ACT_BF16}) == PT_OK, "cuda: %s", pt_last_error());
    pt_backend_limits lim = {.max_tokens = 64, .max_ctx = 16, .max_heads = 1, .max_head_dim = 64, .max_cols = 4096};
    REQUIRE(be->ops->reserve(be, &lim) == PT_OK, "reserve: %s", pt_last_error());
    static const int bits[] = {4, 8}, gss[] = {32, 64, 128};
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++) {
            if (!check_one(be, bits[b], gss[g], 1, 300, 2560, g == 1)) goto done;
            if (!check_one(be, bits[b], gss[g], 3, 40, 1024, 1)) goto done;
        }
    /* 12800 rows: 800 tiles, not split (one warp per tile) on a GPU of up
     * to 133 SMs (gemv_tc.cu tc_split: from 6 tiles per SM on), then split
     * as before (pt_cuda_tc_s1(0)) */
    for (int v = 1; v >= 0; v--) {
        pt_cuda_tc_s1(v);
        if (!check_one(be, 4, 64, 1, 12800, 1024, v) || !check_one(be, 8, 32, 1, 12800, 1024, !v)) break;
    }
    pt_cuda_tc_s1(-1);
    /* an attention input projection (pt_matrix.role) of the 8B shape's q:
     * split over fewer warps than the same weight without the role, so
     * other bits, and batch-invariant in its own right (the same random
     * weight and rows both times) */
    {
        enum { NQ = 4096 };
        float *plain = malloc((size_t)64 * NQ * 4), *attn = malloc((size_t)64 * NQ * 4);
        const uint64_t seed = rng;
        int ok = check_role(be, 4, 64, 1, NQ, 4096, 0, PT_ROLE_NONE, plain);
        rng = seed;
        ok = ok && check_role(be, 4, 64, 1, NQ, 4096, 0, PT_ROLE_ATTN_IN, attn);
        CHECK(!ok || memcmp(plain, attn, (size_t)64 * NQ * 4) != 0,
              "the q/k/v role did not change the split (the same outputs with and without it)");
        free(plain), free(attn);
        if (!ok) goto done;
    }
    /* 272 rows: 17 tiles, 9 blocks of two tiles (a cluster of 2 or 4 gets padding blocks) */
    static const int clusters[] = {2, 4};
    for (int c = 0; c < 2; c++) {
        pt_cuda_tc_cluster(clusters[c]);
        if (!check_one(be, 4, 64, 1, 272, 2560, 1) || !check_one(be, 4, 64, 1, 300, 4096, 0)) break;
    }
    pt_cuda_tc_cluster(0);
    /* each lever alone: drift without XL, XL without drift (several
     * stages: K 2560 at 64 rows is five, with a partial last one at g128) */
    for (int v = 0; v < 2; v++) {
        pt_cuda_tc_drift(v == 0);
        pt_cuda_tc_xl(v == 1);
        if (!check_one(be, 4, 64, 1, 300, 2560, 1) || !check_one(be, 8, 32, 1, 272, 2560, 0) ||
            !check_one(be, 4, 128, 1, 300, 4096, 0))
            break;
    }
    pt_cuda_tc_drift(-1);
    pt_cuda_tc_xl(-1);
    /* the wgmma kernels: every 17..64-row launch (2), the default rule (1: a plain launch of 33..64
     * rows), then none (0) */
    for (int v = 2; v >= 0; v--) {
        pt_cuda_tc_wg(v == 2);
        pt_cuda_tc_wg_plain(v >= 1);
        const unsigned long long c0 = pt_cuda_tc_wg_count(), r0 = pt_cuda_tc_wg_refill_count();
        if (!check_one(be, 4, 64, 1, 300, 2560, 1) || !check_one(be, 4, 64, 1, 4096, 1024, 0) ||
            !check_one(be, 4, 64, 1, 40, 4096, 1))
            break;
        /* 2 row modes × 3 weights × T 17, 31, 33, 48, 64 (all) or T 33, 48, 64 (the rule) */
        const unsigned long long want = v == 2 ? 30ull : v == 1 ? 18ull : 0ull;
        CHECK(pt_cuda_tc_wg_count() - c0 == want, "wgmma launches: %llu in setting %d, want %llu",
              pt_cuda_tc_wg_count() - c0, v, want);
        CHECK(pt_cuda_tc_wg_refill_count() - r0 == want,
              "wgmma launches with the elected-lane refills (the default): %llu in setting %d, want %llu",
              pt_cuda_tc_wg_refill_count() - r0, v, want);
    }
    pt_cuda_tc_wg(-1);
    pt_cuda_tc_wg_plain(-1);
    /* the plain 33..64-row launches (the rule) and, with every 17..64-row launch on them, the 32-column
     * kernels, their stage refills spread over the warps (PETREL_CUDA_TC_WG_REFILL=0) */
    pt_cuda_tc_wg_refill(0);
    for (int v = 1; v <= 2; v++) {
        pt_cuda_tc_wg(v == 2);
        const unsigned long long c0 = pt_cuda_tc_wg_count(), r0 = pt_cuda_tc_wg_refill_count();
        if (!check_one(be, 4, 64, 1, 300, 2560, 1) || !check_one(be, 4, 64, 1, 4096, 1024, 0) ||
            !check_one(be, 4, 64, 1, 40, 4096, 1))
            break;
        const unsigned long long want = v == 2 ? 30ull : 18ull;
        CHECK(pt_cuda_tc_wg_count() - c0 == want && pt_cuda_tc_wg_refill_count() == r0,
              "PETREL_CUDA_TC_WG_REFILL=0: %llu launches in setting %d (want %llu), %llu with the elected lane "
              "(want 0)", pt_cuda_tc_wg_count() - c0, v, want, pt_cuda_tc_wg_refill_count() - r0);
    }
    /* the plain 33..64-row launches with their loop unrolled over the rings' stages
     * (PETREL_CUDA_TC_WG_UNROLL=2), the refills by one elected lane and by a branch per tile */
    pt_cuda_tc_wg(-1);
    pt_cuda_tc_wg_unroll(2);
    for (int rf = 2; rf >= 0; rf -= 2) {
        pt_cuda_tc_wg_refill(rf);
        const unsigned long long c0 = pt_cuda_tc_wg_unroll_count();
        if (!check_one(be, 4, 64, 1, 300, 2560, 1) || !check_one(be, 4, 64, 1, 4096, 1024, 0) ||
            !check_one(be, 4, 64, 1, 40, 4096, 1))
            break;
        CHECK(pt_cuda_tc_wg_unroll_count() - c0 == 18ull,
              "PETREL_CUDA_TC_WG_UNROLL=2, REFILL=%d: %llu unrolled launches, want 18", rf,
              pt_cuda_tc_wg_unroll_count() - c0);
    }
    pt_cuda_tc_wg_unroll(-1);
    pt_cuda_tc_wg_refill(-1);
    pt_cuda_tc_wg(-1);
done:
    pt_backend_free(&be);
}

int main(void) {
    TEST_RUN(test_gemv_batch_invariant);
    TEST_RUN(test_gemv_ring_loops);
    return test_summary();
}
