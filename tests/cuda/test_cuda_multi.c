/* matmul_multi on CUDA (backend.h; src/backend/cuda/matmul.cu, gemv_tc.cu):
 * the grouped tensor-core GEMV launch — up to 4 weights over one x, their
 * blocks back to back in one grid — must give every output bit-identical to
 * that weight's own matmul (rows == 0) and matmul_rows (rows == 1):
 *   - 4- and 8-bit codes, groups 32/64/128, 2 and 3 weights of different row
 *     counts (one not a multiple of the 16-row tile), K with several
 *     shared-memory stages and a partial one, with and without a bias;
 *   - the llama-3.1-8b shapes (q/k/v 4096/1024/1024 and gate/up 14336 × 4096,
 *     whose weights get different warp splits S in the same launch), q/k/v
 *     also with the attention input role (q split 4 ways, k and v 8: at
 *     33..64 rows one wgmma launch of mixed splits, PETREL_CUDA_TC_WG_MIXED,
 *     counted, and with it off; again at 4160/1088/1088 rows, q's last
 *     cluster holding a quad past the weight);
 *   - T = 1..64 (the 8-warp and 16-warp blocks, every n-tile count), 8-warp
 *     blocks above 8 rows too (PETREL_CUDA_TC_WIDE=0), an unaligned x, and
 *     the 8b shapes on the wgmma kernels (PETREL_CUDA_TC_WG: 4-bit g64 at
 *     17..64 rows; 8-bit keeps the mma.sync kernels);
 *   - T = 65 and 100 in rows mode: one grouped launch per 64 rows, equal to
 *     matmul_rows's 64-row pieces;
 *   - what must not take the grouped launch (T > 64 outside rows mode, mixed
 *     bits) still equal to the separate calls, and PETREL_CUDA_MULTI=0
 *     switching it off;
 * and the whole forward pass (prefill and compiled decode steps) must give
 * bit-identical logits with the grouped launch on and off, on the 4-bit
 * demo model and the llama-3.2-1b shape with random 4-bit weights.
 * A launch counter proves the grouped path ran where it should.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU it reports SKIP. */
#include "test.h"
#include "test_rand.h"
#include "gpu_util.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"
#include "base/mmap.h"
#include "model/model.h" /* pt_model_synthetic */
#include "petrel.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* matmul.cu / gemv_tc.cu: the grouped launch on or off (as PETREL_CUDA_MULTI),
 * the 16-warp blocks above 8 rows on or off, grouped launches made so far */
void pt_cuda_tc_multi(int on);
void pt_cuda_tc_wide(int on);
void pt_cuda_tc_wg(int on); /* gemv_tc.cu: 17..64 rows, 4-bit g64: the wgmma kernels (1) or not (0) */
unsigned long long pt_cuda_tc_multi_count(void);
/* gemv_tc.cu: a grouped wgmma launch of weights of different splits (1) or not (0, default; -1: the
 * environment), and such launches made so far */
void pt_cuda_tc_wg_mixed(int on);
unsigned long long pt_cuda_tc_wg_mixed_count(void);

enum { TMAX = 100 };

/* n weights over one x for every T of Ts and both rows modes: multi vs the
 * separate calls, bit for bit; grouped: whether T <= 64 must take the
 * grouped launch (0: it must not). */
static int check_set(pt_backend *be, const char *what, int n, rand_qweight *q, const int *Ts, int nT, int grouped,
                     int x_off) {
    const int64_t K = q[0].w.cols;
    float *xh = malloc((size_t)(TMAX * K + 4) * 4);
    for (int64_t i = 0; i < TMAX * K + 4; i++) xh[i] = pt_round_bf16(rf(-2, 2));
    float *xd = put(be, xh, (size_t)(TMAX * K + 4) * 4), *x = xd + x_off;
    float *ym[4], *ys[4], *hm = NULL, *hs = NULL;
    int64_t maxn = 0;
    for (int i = 0; i < n; i++) {
        ym[i] = be->ops->alloc(be, (size_t)(TMAX * q[i].w.rows) * 4);
        ys[i] = be->ops->alloc(be, (size_t)(TMAX * q[i].w.rows) * 4);
        NEED(ym[i] && ys[i], "alloc");
        if (q[i].w.rows > maxn) maxn = q[i].w.rows;
    }
    NEED(xd, "alloc x");
    hm = malloc((size_t)(TMAX * maxn) * 4), hs = malloc((size_t)(TMAX * maxn) * 4);
    const pt_matrix *ws[4];
    for (int i = 0; i < n; i++) ws[i] = &q[i].w;
    int ok = 1;
    for (int ti = 0; ti < nT && ok; ti++)
        for (int rows = 0; rows < 2 && ok; rows++) {
            const int64_t T = Ts[ti];
            for (int i = 0; i < n; i++) {
                pt_status st = rows ? be->ops->matmul_rows(be, ys[i], x, T, ws[i], 0)
                                    : be->ops->matmul(be, ys[i], x, T, ws[i], 0);
                NEED(st == PT_OK, "%s: separate T=%lld: %s", what, (long long)T, pt_last_error());
            }
            const unsigned long long c0 = pt_cuda_tc_multi_count();
            NEED(be->ops->matmul_multi(be, n, ym, x, T, ws, rows) == PT_OK, "%s: matmul_multi T=%lld: %s", what,
                 (long long)T, pt_last_error());
            /* above 64 rows: one grouped launch per 64 rows in rows mode, the separate calls else */
            const int took = pt_cuda_tc_multi_count() != c0, want = grouped && (T <= 64 || rows);
            CHECK(took == want, "%s T=%lld rows %d: grouped launch %s", what, (long long)T, rows,
                  took ? "taken where it must not be" : "not taken");
            for (int i = 0; i < n && ok; i++) {
                const int64_t N = q[i].w.rows;
                NEED(be->ops->download(be, hm, ym[i], (size_t)(T * N) * 4) == PT_OK, "download");
                NEED(be->ops->download(be, hs, ys[i], (size_t)(T * N) * 4) == PT_OK, "download");
                for (int64_t j = 0; j < T * N && ok; j++)
                    if (memcmp(&hm[j], &hs[j], 4)) {
                        CHECK(0, "%s T=%lld %s: weight %d (N %lld) row %lld col %lld: grouped %.9g, alone %.9g", what,
                              (long long)T, rows ? "matmul_rows" : "matmul", i, (long long)N, (long long)(j / N),
                              (long long)(j % N), hm[j], hs[j]);
                        ok = 0;
                    }
            }
        }
    for (int i = 0; i < n; i++) be->ops->dealloc(be, ym[i]), be->ops->dealloc(be, ys[i]);
    be->ops->dealloc(be, xd);
    free(xh), free(hm), free(hs);
    return ok;
}

static void test_multi_op_bit_identical(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(TMAX);
    REQUIRE(be, "backend");
    REQUIRE(be->ops->matmul_multi, "the CUDA backend has no matmul_multi");
    static const int Ts[] = {1, 2, 8, 9, 16, 17, 33, 48, 64, 65, 100};
    static const int bitss[] = {4, 8}, gss[] = {32, 64, 128};
    char what[160];
    int ok = 1;
    /* every bits × group size: 3 weights, rows 640 / 256 / 300 (a partial tile), K 2560 */
    for (int b = 0; b < 2 && ok; b++)
        for (int g = 0; g < 3 && ok; g++) {
            rand_qweight q[3];
            static const int64_t Ns[3] = {640, 256, 300};
            int made = 0;
            for (; made < 3 && ok; made++) ok = gpu_qw_make(be, &q[made], bitss[b], gss[g], Ns[made], 2560, (made + g) & 1);
            if (ok) {
                snprintf(what, sizeof what, "%d-bit g%d 640/256/300×2560 n=3", bitss[b], gss[g]);
                ok = check_set(be, what, 3, q, Ts, 11, 1, 0);
                snprintf(what, sizeof what, "%d-bit g%d 256/300×2560 n=2", bitss[b], gss[g]);
                if (ok) ok = check_set(be, what, 2, q + 1, Ts, 11, 1, 0);
            }
            for (int i = 0; i < made; i++) gpu_qw_free(be, &q[i]);
        }
    /* the llama-3.1-8b shapes, 4- and 8-bit, group 64 */
    for (int b = 0; b < 2 && ok; b++) {
        static const int T8[] = {1, 8, 9, 33, 64, 100};
        rand_qweight q[3];
        int made = 0;
        static const int64_t Nq[3] = {4096, 1024, 1024};
        for (; made < 3 && ok; made++) ok = gpu_qw_make(be, &q[made], bitss[b], 64, Nq[made], 4096, 0);
        snprintf(what, sizeof what, "%d-bit g64 q/k/v 4096/1024/1024×4096", bitss[b]);
        if (ok) ok = check_set(be, what, 3, q, T8, 6, 1, 0);
        /* 8-warp blocks above 8 rows, and an unaligned x (copied, as matmul does) */
        pt_cuda_tc_wide(0);
        snprintf(what, sizeof what, "%d-bit g64 q/k/v, 8-warp blocks", bitss[b]);
        if (ok) ok = check_set(be, what, 3, q, T8, 6, 1, 0);
        pt_cuda_tc_wide(1);
        snprintf(what, sizeof what, "%d-bit g64 q/k/v, unaligned x", bitss[b]);
        if (ok) ok = check_set(be, what, 3, q, T8 + 2, 2, 1, 1);
        /* the wgmma kernels (4-bit g64, 17..64 rows; splits of 8) */
        pt_cuda_tc_wg(1);
        snprintf(what, sizeof what, "%d-bit g64 q/k/v, wgmma", bitss[b]);
        if (ok) ok = check_set(be, what, 3, q, T8, 6, 1, 0);
        pt_cuda_tc_wg(-1);
        /* PETREL_CUDA_MULTI=0: the separate calls */
        pt_cuda_tc_multi(0);
        snprintf(what, sizeof what, "%d-bit g64 q/k/v, grouped launch off", bitss[b]);
        if (ok) ok = check_set(be, what, 3, q, T8, 6, 0, 0);
        pt_cuda_tc_multi(1);
        for (int i = 0; i < made; i++) gpu_qw_free(be, &q[i]);
        /* the same shapes with the attention input role, as the model loader sets it: q splits 4 ways, k and v
         * 8 (tc_split), so at 33..64 rows (4-bit g64) the grouped launch runs on the wgmma kernels in clusters
         * of 8 blocks holding two of q's quads or one of k's or v's (PETREL_CUDA_TC_WG_MIXED=1, the default) —
         * counted there — and stays on mma.sync with it off; the same bits either way. Then q/k/v of
         * 4160/1088/1088 rows (q: 65 quads, so its last cluster holds one quad past the weight, which loads
         * and stores nothing of its own) */
        static const int64_t Na[2][3] = {{4096, 1024, 1024}, {4160, 1088, 1088}};
        for (int sh = 0; sh < 2 && ok; sh++) {
            made = 0;
            for (; made < 3 && ok; made++) ok = gpu_qw_make_role(be, &q[made], bitss[b], 64, Na[sh][made], 4096, 0, PT_ROLE_ATTN_IN);
            for (int mx = 1; mx >= 0 && ok; mx--) {
                pt_cuda_tc_wg_mixed(mx);
                const unsigned long long c0 = pt_cuda_tc_wg_mixed_count();
                snprintf(what, sizeof what, "%d-bit g64 q/k/v %lld/%lld/%lld with the attention role%s", bitss[b],
                         (long long)Na[sh][0], (long long)Na[sh][1], (long long)Na[sh][2],
                         mx ? "" : ", mixed splits off");
                ok = check_set(be, what, 3, q, T8, 6, 1, 0);
                /* 4-bit: T8's 33 and 64 rows in both rows modes, and 100 rows in rows mode (pieces of 64 and
                 * 36): 6 grouped launches of more than 32 rows */
                const unsigned long long took = pt_cuda_tc_wg_mixed_count() - c0,
                                         want = mx && bitss[b] == 4 ? 6 : 0;
                CHECK(took == want, "%s: %llu grouped wgmma launches of mixed splits, expected %llu", what, took,
                      want);
            }
            pt_cuda_tc_wg_mixed(-1);
            for (int i = 0; i < made; i++) gpu_qw_free(be, &q[i]);
        }
        made = 0;
        for (; made < 2 && ok; made++) ok = gpu_qw_make(be, &q[made], bitss[b], 64, 14336, 4096, 0);
        snprintf(what, sizeof what, "%d-bit g64 gate/up 14336×4096", bitss[b]);
        if (ok) ok = check_set(be, what, 2, q, T8, 6, 1, 0);
        /* the wgmma kernels (4-bit g64, 17..64 rows; a split of 2) */
        pt_cuda_tc_wg(1);
        snprintf(what, sizeof what, "%d-bit g64 gate/up 14336×4096, wgmma", bitss[b]);
        if (ok) ok = check_set(be, what, 2, q, T8, 6, 1, 0);
        pt_cuda_tc_wg(-1);
        for (int i = 0; i < made; i++) gpu_qw_free(be, &q[i]);
    }
    /* mixed bits: not groupable, the separate calls */
    if (ok) {
        rand_qweight q[2];
        ok = gpu_qw_make(be, &q[0], 4, 64, 256, 1024, 1) && gpu_qw_make(be, &q[1], 8, 64, 128, 1024, 0);
        static const int Tm[] = {1, 9};
        if (ok) ok = check_set(be, "4-bit + 8-bit", 2, q, Tm, 2, 0, 0);
        gpu_qw_free(be, &q[0]), gpu_qw_free(be, &q[1]);
    }
    pt_backend_free(&be);
}

/* Prefill of 20 tokens, then 5 greedy steps (compiled decode): every
 * logits row of a run with the grouped launch on equals the run with it off. */
static int run_model(const char *dir, int multi, float **logits, int *V, unsigned long long *launches) {
    pt_cuda_tc_multi(multi);
    int ok = gpu_model_greedy(dir, "q4", logits, NULL, V, pt_cuda_tc_multi_count, launches);
    pt_cuda_tc_multi(1);
    return ok;
}

static void check_forward(const char *dir) {
    if (strncmp(dir, "synthetic:", 10) && !pt_is_dir(dir)) {
        printf("INFO %s absent, skipped\n", dir);
        return;
    }
    float *on = NULL, *off = NULL;
    int V = 0, V2 = 0;
    unsigned long long l_on = 0, l_off = 0;
    if (run_model(dir, 1, &on, &V, &l_on) && run_model(dir, 0, &off, &V2, &l_off)) {
        CHECK(l_on > 0, "%s: no grouped launch with it on", dir);
        CHECK(l_off == 0, "%s: %llu grouped launches with it off", dir, l_off);
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)6 * V; i++) bad += memcmp(&on[i], &off[i], 4) != 0;
        CHECK(bad == 0, "%s: %d of %lld logits differ between the grouped launch on and off", dir, bad,
              (long long)6 * V);
        printf("INFO %s: logits of the prompt and 5 steps bit-identical with the grouped launch on (%llu grouped "
               "launches) and off\n",
               dir, l_on);
    }
    free(on), free(off);
}

static void test_multi_forward_on_off(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    check_forward("models/kjv-llama-4bit");
    check_forward("synthetic:llama-3.2-1b");
}

int main(void) {
    TEST_RUN(test_multi_op_bit_identical);
    TEST_RUN(test_multi_forward_on_off);
    return test_summary();
}
