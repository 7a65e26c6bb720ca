/* matmul_glu on CUDA (backend.h; src/backend/cuda/matmul.cu, gemv_tc.cu):
 * a feed-forward's gate and up projections with the gated activation folded
 * into the tensor-core GEMV's epilogue must give y = glu(gate, up) bit for
 * bit as matmul_multi followed by glu:
 *   - 4- and 8-bit codes, groups 32/64/128, with and without a bias, a row
 *     count that is not a multiple of the 16-row tile, SiLU and GeGLU;
 *   - the llama-3.2-1b and llama-3.1-8b gate/up shapes (8192 × 2048 and
 *     14336 × 4096), 4- and 8-bit;
 *   - T = 1, 2, 8, 9, 16, 17, 32, 33, 64 (the 8- and 16-warp blocks, every
 *     n-tile count, the in-block and the prepared-x staging), both rows
 *     modes, and each row of a 64-row call equal to that row alone;
 *   - what it does not fuse (PETREL_CUDA_GEMV_FUSE=0, T > 64 outside rows mode, an unaligned
 *     x, different row counts, an odd number of tiles per block) answered
 *     PT_ERR_UNSUPPORTED with nothing launched;
 *   - the 4-bit 1b and 8b gate/up shapes again on the wgmma kernels
 *     (PETREL_CUDA_TC_WG: a split of 2 or 4, clusters of gate and up blocks);
 *     the 8b one (not split) takes them at 64 rows by default
 *     (PETREL_CUDA_TC_WG_GLU, a launch counter), its stage refills issued by
 *     one elected lane (PETREL_CUDA_TC_WG_REFILL, the default) and by a branch
 *     per tile in every warp, and again with that rule off;
 * and the whole forward pass (prefill of 20 tokens, then compiled greedy
 * decode steps) bit-identical with the fold on and off, on the 4-bit demo
 * model and the llama-3.2-1b shape with random 4- and 8-bit weights. A
 * launch counter proves the fused path ran where it should.
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

/* matmul.cu / gemv_tc.cu: the fold on or off (as PETREL_CUDA_GEMV_FUSE;
 * -1: back to the environment), GLU-epilogue launches made so far */
void pt_cuda_gemv_fuse(int on);
unsigned long long pt_cuda_tc_glu_count(void);
void pt_cuda_tc_xp8(int on); /* gemv_tc.cu: 2..8 rows in 16-warp blocks (1, default) or 8-warp (0) */
void pt_cuda_tc_wg(int on);  /* gemv_tc.cu: 17..64 rows, 4-bit g64: the wgmma kernels (1) or not (0) */
void pt_cuda_tc_wg_glu(int on); /* gemv_tc.cu: the unsplit GLU at 33..64 rows on them (1, default) or not (0) */
void pt_cuda_tc_wg_plain(int on); /* gemv_tc.cu: a plain launch of 33..64 rows on them (1, default) or not (0) */
unsigned long long pt_cuda_tc_wg_count(void); /* their launches so far */
void pt_cuda_tc_wg_refill(int v); /* gemv_tc.cu: wgmma refills by one elected lane: 0 none, 1 GLU, 2 all; -1 */
unsigned long long pt_cuda_tc_wg_refill_count(void); /* launches of that form so far */
void pt_cuda_tc_wg_unroll(int v); /* gemv_tc.cu: wgmma loop unrolled over the stages: 0 none, 1 GLU, 2 all; -1 */
unsigned long long pt_cuda_tc_wg_unroll_count(void); /* launches of that form so far */
void pt_cuda_tc_wg_xo(int v); /* gemv_tc.cu: x hand-offs: 2 GLU and attention (default), 1 GLU, 0 none; -1 */
unsigned long long pt_cuda_tc_wg_xo_count(void); /* hand-offs taken so far */

/* check_pair's fused = 2: the fewest rows that fuse (a warp split of 8:
 * tiles per block even only with 16-warp blocks, above 8 rows, or from 2
 * rows with pt_cuda_tc_xp8) */
static int g_fuse_from = 9;

enum { TMAX = 80 };

static int same(const char *what, const float *a, const float *b, int64_t n, int64_t F) {
    for (int64_t j = 0; j < n; j++)
        if (memcmp(&a[j], &b[j], 4)) {
            CHECK(0, "%s: row %lld col %lld: fused %.9g, separate %.9g", what, (long long)(j / F),
                  (long long)(j % F), a[j], b[j]);
            return 0;
        }
    return 1;
}

/* Gate g and up u over x for each T of Ts, both rows modes and both
 * activations: matmul_glu vs matmul_multi + glu, bit for bit. fused: 1 =
 * every call must take the fused launch, 0 = every call must answer
 * PT_ERR_UNSUPPORTED, 2 = only the calls of g_fuse_from rows or more fuse
 * (a warp split of 8: below that, 8-warp blocks), 3 = only the rows-mode
 * calls fuse (above 64 rows: one launch per 64 rows). */
static int check_pair(pt_backend *be, const char *what, rand_qweight *g, rand_qweight *u, const int *Ts, int nT,
                      int fused) {
    const int64_t K = g->w.cols, F = g->w.rows;
    float *xh = malloc((size_t)(TMAX * K) * 4);
    for (int64_t i = 0; i < TMAX * K; i++) xh[i] = pt_round_bf16(rf(-2, 2));
    float *x = NULL, *yg = NULL, *yu = NULL, *yr = NULL, *yf = NULL, *y1 = NULL;
    float *hr = malloc((size_t)(TMAX * F) * 4), *hf = malloc((size_t)(TMAX * F) * 4);
    x = be->ops->alloc(be, (size_t)(TMAX * K) * 4);
    yg = be->ops->alloc(be, (size_t)(TMAX * F) * 4), yu = be->ops->alloc(be, (size_t)(TMAX * F) * 4);
    yr = be->ops->alloc(be, (size_t)(TMAX * F) * 4), yf = be->ops->alloc(be, (size_t)(TMAX * F) * 4);
    y1 = be->ops->alloc(be, (size_t)F * 4);
    int ok = x && yg && yu && yr && yf && y1 && be->ops->upload(be, x, xh, (size_t)(TMAX * K) * 4) == PT_OK;
    CHECK(ok, "%s: buffers: %s", what, pt_last_error());
    const pt_matrix *ws[2] = {&g->w, &u->w};
    float *ys[2] = {yg, yu};
    char w2[224];
    for (int ti = 0; ti < nT && ok; ti++)
        for (int rows = 0; rows < 2 && ok; rows++)
            for (int act = 0; act < 2 && ok; act++) {
                const int64_t T = Ts[ti];
                const int want = fused == 1 || (fused == 2 && T >= g_fuse_from) || (fused == 3 && rows);
                ok = be->ops->matmul_multi(be, 2, ys, x, T, ws, rows) == PT_OK &&
                     be->ops->glu(be, yr, yg, yu, T, F, F, (pt_glu_kind)act) == PT_OK;
                CHECK(ok, "%s: separate calls T=%lld: %s", what, (long long)T, pt_last_error());
                const unsigned long long c0 = pt_cuda_tc_glu_count();
                const pt_status st = ok ? be->ops->matmul_glu(be, yf, x, T, &g->w, &u->w, (pt_glu_kind)act, rows)
                                        : PT_ERR_INTERNAL;
                const int took = pt_cuda_tc_glu_count() != c0;
                snprintf(w2, sizeof w2, "%s T=%lld rows %d %s", what, (long long)T, rows, act ? "gelu" : "silu");
                if (!want) {
                    CHECK(st == PT_ERR_UNSUPPORTED && !took, "%s: expected PT_ERR_UNSUPPORTED and no launch, got %d",
                          w2, (int)st);
                    ok = st == PT_ERR_UNSUPPORTED && !took;
                    continue;
                }
                CHECK(st == PT_OK && took, "%s: fused launch not taken (status %d): %s", w2, (int)st,
                      pt_last_error());
                ok = ok && st == PT_OK && took;
                ok = ok && be->ops->download(be, hr, yr, (size_t)(T * F) * 4) == PT_OK &&
                     be->ops->download(be, hf, yf, (size_t)(T * F) * 4) == PT_OK;
                ok = ok && same(w2, hf, hr, T * F, F);
                /* batch invariance: rows 0, T/2 and T-1 of a T-row call equal that row alone (fused, or
                 * where one row does not fuse, the separate calls, as the forward pass makes them) */
                for (int k = 0; k < 3 && ok && T > 1; k++) {
                    const int64_t t = k == 0 ? 0 : k == 1 ? T / 2 : T - 1;
                    pt_status s1 = be->ops->matmul_glu(be, y1, x + t * K, 1, &g->w, &u->w, (pt_glu_kind)act, rows);
                    if (s1 == PT_ERR_UNSUPPORTED && fused == 2) {
                        s1 = be->ops->matmul_multi(be, 2, ys, x + t * K, 1, ws, rows);
                        if (s1 == PT_OK) s1 = be->ops->glu(be, y1, yg, yu, 1, F, F, (pt_glu_kind)act);
                    }
                    ok = s1 == PT_OK && be->ops->download(be, hr, y1, (size_t)F * 4) == PT_OK;
                    CHECK(ok, "%s: row %lld alone: %s", w2, (long long)t, pt_last_error());
                    char w3[320];
                    snprintf(w3, sizeof w3, "%s: row %lld in the batch vs alone", w2, (long long)t);
                    ok = ok && same(w3, hf + t * F, hr, F, F);
                }
            }
    be->ops->dealloc(be, x), be->ops->dealloc(be, yg), be->ops->dealloc(be, yu), be->ops->dealloc(be, yr);
    be->ops->dealloc(be, yf), be->ops->dealloc(be, y1);
    free(xh), free(hr), free(hf);
    return ok;
}

static void test_glu_op_bit_identical(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(TMAX);
    REQUIRE(be, "backend");
    REQUIRE(be->ops->matmul_glu, "the CUDA backend has no matmul_glu");
    pt_cuda_gemv_fuse(1);
    static const int Ts[] = {1, 2, 8, 9, 16, 17, 32, 33, 64};
    static const int bitss[] = {4, 8}, gss[] = {32, 64, 128};
    char what[160];
    int ok = 1;
    /* every bits × group size: F 640 and 300 (a partial tile), K 768 (384 at 8-bit g32): a warp split
     * of 1 to 4 on 132 SMs, so every row count fuses */
    for (int b = 0; b < 2 && ok; b++)
        for (int gi = 0; gi < 3 && ok; gi++)
            for (int fi = 0; fi < 2 && ok; fi++) {
                const int64_t F = fi ? 300 : 640, K = bitss[b] == 8 && gss[gi] == 32 ? 384 : 768;
                rand_qweight g, u;
                ok = gpu_qw_make(be, &g, bitss[b], gss[gi], F, K, (gi + fi) & 1);
                if (ok && !(ok = gpu_qw_make(be, &u, bitss[b], gss[gi], F, K, gi & 1))) gpu_qw_free(be, &g);
                if (!ok) break;
                snprintf(what, sizeof what, "%d-bit g%d %lld×%lld%s", bitss[b], gss[gi], (long long)F, (long long)K,
                         (gi + fi) & 1 ? " (bias)" : "");
                ok = check_pair(be, what, &g, &u, Ts, 9, 1);
                gpu_qw_free(be, &g), gpu_qw_free(be, &u);
            }
    /* the 1b and 8b gate/up shapes, group 64 */
    for (int b = 0; b < 2 && ok; b++)
        for (int s = 0; s < 2 && ok; s++) {
            static const int Tl[] = {1, 2, 8, 9, 32, 64};
            const int64_t F = s ? 14336 : 8192, K = s ? 4096 : 2048;
            rand_qweight g, u;
            ok = gpu_qw_make(be, &g, bitss[b], 64, F, K, 0);
            if (ok && !(ok = gpu_qw_make(be, &u, bitss[b], 64, F, K, 0))) gpu_qw_free(be, &g);
            if (!ok) break;
            snprintf(what, sizeof what, "%d-bit g64 gate/up %lld×%lld", bitss[b], (long long)F, (long long)K);
            ok = check_pair(be, what, &g, &u, Tl, 6, 1);
            /* the 8b shape at 4 bits is not split: its 64-row GLU takes the wgmma kernels by default
             * (PETREL_CUDA_TC_WG_GLU), checked above against matmul_multi + glu (which takes them too
             * by default, PETREL_CUDA_TC_WG_PLAIN); counted with the plain rule off, so against
             * matmul_multi on mma.sync; then with both rules off */
            if (ok && bitss[b] == 4 && s == 1) {
                pt_cuda_tc_wg_plain(0);
                snprintf(what, sizeof what, "4-bit g64 gate/up %lldx%lld, PETREL_CUDA_TC_WG_PLAIN=0", (long long)F,
                         (long long)K);
                const unsigned long long w0 = pt_cuda_tc_wg_count();
                ok = check_pair(be, what, &g, &u, Tl, 6, 1);
                CHECK(!ok || pt_cuda_tc_wg_count() - w0 == 4,
                      "%s: %llu wgmma launches, want 4 (T = 64: two row modes, two activations)", what,
                      pt_cuda_tc_wg_count() - w0);
                /* its stage refills issued by one elected lane (PETREL_CUDA_TC_WG_REFILL: by default),
                 * then by a branch per tile in every warp; each with its loop rolled and
                 * unrolled over the rings' stages (PETREL_CUDA_TC_WG_UNROLL) */
                for (int f = 0; f < 4 && ok; f++) {
                    const int rf = f & 1 ? 0 : 1, un = f >> 1;
                    pt_cuda_tc_wg_refill(rf);
                    pt_cuda_tc_wg_unroll(un);
                    snprintf(what, sizeof what,
                             "4-bit g64 gate/up %lldx%lld, PETREL_CUDA_TC_WG_REFILL=%d PETREL_CUDA_TC_WG_UNROLL=%d",
                             (long long)F, (long long)K, rf, un);
                    const unsigned long long r0 = pt_cuda_tc_wg_refill_count(), u0 = pt_cuda_tc_wg_unroll_count();
                    ok = check_pair(be, what, &g, &u, Tl, 6, 1);
                    const unsigned long long want = rf ? 4ull : 0ull, wantu = un ? 4ull : 0ull;
                    CHECK(!ok || pt_cuda_tc_wg_refill_count() - r0 == want, "%s: %llu launches of that form, want %llu",
                          what, pt_cuda_tc_wg_refill_count() - r0, want);
                    CHECK(!ok || pt_cuda_tc_wg_unroll_count() - u0 == wantu,
                          "%s: %llu unrolled launches, want %llu", what, pt_cuda_tc_wg_unroll_count() - u0, wantu);
                }
                pt_cuda_tc_wg_refill(-1);
                pt_cuda_tc_wg_unroll(-1);
                pt_cuda_tc_wg_glu(0);
                const unsigned long long w1 = pt_cuda_tc_wg_count();
                snprintf(what, sizeof what, "4-bit g64 gate/up %lldx%lld, PETREL_CUDA_TC_WG_GLU=0", (long long)F,
                         (long long)K);
                ok = check_pair(be, what, &g, &u, Tl, 6, 1);
                CHECK(pt_cuda_tc_wg_count() == w1, "%s: wgmma launches with the rules off", what);
                pt_cuda_tc_wg_glu(-1);
                pt_cuda_tc_wg_plain(-1);
            }
            /* 4-bit: again on the wgmma kernels (a split of 2 or 4: clusters of gate and up blocks) */
            if (ok && bitss[b] == 4) {
                pt_cuda_tc_wg(1);
                snprintf(what, sizeof what, "4-bit g64 gate/up %lld×%lld, wgmma", (long long)F, (long long)K);
                ok = check_pair(be, what, &g, &u, Tl, 6, 1);
                pt_cuda_tc_wg(-1);
            }
            gpu_qw_free(be, &g), gpu_qw_free(be, &u);
        }
    /* a warp split of 8 (F 640, K 2560, 4-bit g64): one tile per 8-warp block, so not fused where
     * the rows take 8-warp blocks (one row; up to 8 rows with pt_cuda_tc_xp8(0)) */
    if (ok) {
        static const int Ts8[] = {1, 2, 8, 9, 64};
        rand_qweight g, u;
        ok = gpu_qw_make(be, &g, 4, 64, 640, 2560, 0);
        if (ok && !(ok = gpu_qw_make(be, &u, 4, 64, 640, 2560, 0))) gpu_qw_free(be, &g);
        if (ok) {
            /* 2..8 rows in 16-warp blocks (the default), then in 8-warp ones */
            pt_cuda_tc_xp8(1);
            g_fuse_from = 2;
            ok = check_pair(be, "4-bit g64 640×2560 (split 8), 16-warp blocks from 2 rows", &g, &u, Ts8, 5, 2);
            pt_cuda_tc_xp8(0);
            g_fuse_from = 9;
            ok = ok && check_pair(be, "4-bit g64 640×2560 (split 8), 8-warp blocks up to 8 rows", &g, &u, Ts8, 5, 2);
            pt_cuda_tc_xp8(1);
            gpu_qw_free(be, &g), gpu_qw_free(be, &u);
        }
    }
    /* not fused: the switch off, T > 64 (but in rows mode: 64-row pieces), an unaligned x, different row
     * counts */
    if (ok) {
        static const int Ts1[] = {1, 9}, T65[] = {65, 80};
        rand_qweight g, u, u2;
        ok = gpu_qw_make(be, &g, 4, 64, 640, 768, 0) && gpu_qw_make(be, &u, 4, 64, 640, 768, 0) &&
             gpu_qw_make(be, &u2, 4, 64, 320, 768, 0);
        if (ok) {
            pt_cuda_gemv_fuse(0);
            ok = check_pair(be, "PETREL_CUDA_GEMV_FUSE=0", &g, &u, Ts1, 2, 0);
            pt_cuda_gemv_fuse(1);
            ok = ok && check_pair(be, "T = 65, 80", &g, &u, T65, 2, 3);
            float *x = be->ops->alloc(be, 4 * 768 * 4 + 16), *y = be->ops->alloc(be, 4 * 640 * 4);
            const unsigned long long c0 = pt_cuda_tc_glu_count();
            CHECK(be->ops->matmul_glu(be, y, x + 1, 2, &g.w, &u.w, PT_GLU_SILU, 0) == PT_ERR_UNSUPPORTED,
                  "unaligned x: not PT_ERR_UNSUPPORTED");
            CHECK(be->ops->matmul_glu(be, y, x, 2, &g.w, &u2.w, PT_GLU_SILU, 0) == PT_ERR_UNSUPPORTED,
                  "640 vs 320 rows: not PT_ERR_UNSUPPORTED");
            CHECK(pt_cuda_tc_glu_count() == c0, "a fused launch where none may be");
            be->ops->dealloc(be, x), be->ops->dealloc(be, y);
        }
        gpu_qw_free(be, &g), gpu_qw_free(be, &u), gpu_qw_free(be, &u2);
    }
    pt_cuda_gemv_fuse(-1);
    pt_backend_free(&be);
}

/* handoff_hint (backend.h; gemv_tc.cu XO): the unsplit GLU launch on the wgmma kernels (33..64 rows) writes
 * its output as the down projection's prepared x as well, and the down launch right after reads it there instead
 * of preparing it: the GLU output and the down output bit for bit as with the hand-off off, for 33, 48 and 64
 * rows (a hand-off counted each time); no hand-off taken without the hint, nor after a matmul in between (the
 * hand-off lapses there; the outputs still right), nor by a down launch over other rows. */
static void test_glu_down_handoff(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(TMAX);
    REQUIRE(be, "backend");
    REQUIRE(be->ops->matmul_glu && be->ops->handoff_hint, "the CUDA backend has no matmul_glu or hand-off hint");
    pt_cuda_gemv_fuse(1);
    /* F rows of gate/up: enough tiles an SM not to be split (the 8b gate/up's rule), so its 33..64-row GLU takes
     * the wgmma kernels by default; down F -> H */
    const int64_t F = 14336, K = 1024, H = 1024;
    rand_qweight g, u, d, o;
    int ok = gpu_qw_make(be, &g, 4, 64, F, K, 0) && gpu_qw_make(be, &u, 4, 64, F, K, 0) &&
             gpu_qw_make(be, &d, 4, 64, H, F, 0) && gpu_qw_make(be, &o, 4, 64, H, K, 0);
    REQUIRE(ok, "weights: %s", pt_last_error());
    float *xh = malloc((size_t)(64 * K) * 4), *ha = malloc((size_t)(64 * F) * 4), *hb = malloc((size_t)(64 * F) * 4);
    for (int64_t i = 0; i < 64 * K; i++) xh[i] = pt_round_bf16(rf(-2, 2));
    float *x = be->ops->alloc(be, (size_t)(64 * K) * 4), *act = be->ops->alloc(be, (size_t)(64 * F) * 4);
    float *y0 = be->ops->alloc(be, (size_t)(64 * H) * 4), *y1 = be->ops->alloc(be, (size_t)(64 * H) * 4);
    float *a0 = be->ops->alloc(be, (size_t)(64 * F) * 4), *yo = be->ops->alloc(be, (size_t)(64 * H) * 4);
    ok = x && act && y0 && y1 && a0 && yo && be->ops->upload(be, x, xh, (size_t)(64 * K) * 4) == PT_OK;
    CHECK(ok, "buffers: %s", pt_last_error());
    static const int Ts[] = {33, 48, 64};
    char what[160];
    for (int ti = 0; ti < 3 && ok; ti++) {
        const int64_t T = Ts[ti];
        /* the reference: no hand-off */
        pt_cuda_tc_wg_xo(0);
        be->ops->handoff_hint(be);
        ok = be->ops->matmul_glu(be, a0, x, T, &g.w, &u.w, PT_GLU_SILU, 1) == PT_OK &&
             be->ops->matmul_rows(be, y0, a0, T, &d.w, 0) == PT_OK;
        pt_cuda_tc_wg_xo(1);
        CHECK(ok, "T=%lld reference: %s", (long long)T, pt_last_error());
        /* case 0: hint, GLU, down: taken; 1: no hint; 2: a matmul in between; 3: down over fewer rows */
        for (int cs = 0; cs < 4 && ok; cs++) {
            const unsigned long long c0 = pt_cuda_tc_wg_xo_count();
            if (cs != 1) be->ops->handoff_hint(be);
            ok = be->ops->matmul_glu(be, act, x, T, &g.w, &u.w, PT_GLU_SILU, 1) == PT_OK;
            if (ok && cs == 2) ok = be->ops->matmul_rows(be, yo, x, T, &o.w, 0) == PT_OK;
            const int64_t Td = cs == 3 ? T - 1 : T;
            ok = ok && be->ops->matmul_rows(be, y1, act, Td, &d.w, 0) == PT_OK;
            snprintf(what, sizeof what, "T=%lld, %s", (long long)T,
                     cs == 0 ? "hand-off" : cs == 1 ? "no hint" : cs == 2 ? "a matmul between" : "down over T-1 rows");
            CHECK(ok, "%s: %s", what, pt_last_error());
            const unsigned long long took = pt_cuda_tc_wg_xo_count() - c0;
            CHECK(!ok || took == (cs == 0 ? 1ull : 0ull), "%s: %llu hand-offs taken, want %d", what, took, cs == 0);
            ok = ok && took == (cs == 0 ? 1ull : 0ull);
            ok = ok && be->ops->download(be, ha, a0, (size_t)(T * F) * 4) == PT_OK &&
                 be->ops->download(be, hb, act, (size_t)(T * F) * 4) == PT_OK && same(what, hb, ha, T * F, F);
            ok = ok && be->ops->download(be, ha, y0, (size_t)(Td * H) * 4) == PT_OK &&
                 be->ops->download(be, hb, y1, (size_t)(Td * H) * 4) == PT_OK && same(what, hb, ha, Td * H, H);
        }
    }
    be->ops->dealloc(be, x), be->ops->dealloc(be, act), be->ops->dealloc(be, y0), be->ops->dealloc(be, y1);
    be->ops->dealloc(be, a0), be->ops->dealloc(be, yo);
    free(xh), free(ha), free(hb);
    gpu_qw_free(be, &g), gpu_qw_free(be, &u), gpu_qw_free(be, &d), gpu_qw_free(be, &o);
    pt_cuda_tc_wg_xo(-1);
    pt_cuda_gemv_fuse(-1);
    pt_backend_free(&be);
}

static void test_glu_forward_on_off(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    gpu_forward_on_off_models(pt_cuda_gemv_fuse, pt_cuda_tc_glu_count, "GLU fold");
}

int main(void) {
    TEST_RUN(test_glu_op_bit_identical);
    TEST_RUN(test_glu_down_handoff);
    TEST_RUN(test_glu_forward_on_off);
    return test_summary();
}
