/* The folded norm and residual add on CUDA (backend.h matmul_norm,
 * matmul_glu_norm, matmul_add; src/backend/cuda/matmul.cu, gemv_tc.cu): a
 * decode row's RMSNorm computed by the tensor-core GEMV that reads it, and
 * the residual add done by the GEMV whose output it adds, must give the
 * bits of the separate calls:
 *   - matmul_norm (1 and 3 weights, the grouped launch) = rms_norm into a
 *     buffer, then matmul_multi of it; x left as it was;
 *   - matmul_glu_norm = rms_norm, then matmul_glu (or matmul_multi + glu
 *     where the GLU epilogue does not apply: then it must decline too);
 *   - matmul_add = matmul, then rms_norm's fused residual add (x = x + y);
 * over 4- and 8-bit codes, groups 32/64/128, with and without a bias, K of
 * 768, 2048, 2560, 3072 and 4096 (the register norm kernel's shapes: 192 to
 * 512 threads, 1 and 2 chunks a thread), the four norm styles, bf16 and
 * f32 norm weights; the llama-3.2-3b gate/up shape, whose GLU launch runs
 * 16-warp blocks (and the same bits with 8-warp ones); what they do not
 * fold (2 rows with the rows switch off, 65 rows, a residual addend at one
 * row, the switch off, an unaligned x or norm weight, a row past 4096
 * values) answered
 * PT_ERR_UNSUPPORTED with nothing launched; and the whole forward pass
 * (prefill of 20 tokens, then compiled greedy decode steps) bit-identical
 * with the folds on and off, on the 4-bit demo model and the llama-3.2-1b
 * shape with random 4- and 8-bit weights. Batched rows (2, 9, 33, 64, and
 * 80 and 128 in pieces of 64: the XP launches, whose x prepare does the
 * norm): matmul_norm of q, k, v
 * and matmul_glu_norm, without and with the residual addend, = rms_norm
 * (its fused add writing x) then matmul_multi / matmul_glu, bit for bit,
 * x as rms_norm leaves it; again with those launches on the wgmma kernels
 * (all of them, and by default the unsplit 8b gate/up GLU). A launch
 * counter proves the folded launches ran where they should.
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

/* matmul.cu / gemv_tc.cu: the folds on or off (as PETREL_CUDA_FOLD_NORM;
 * -1: back to the environment), folded launches made so far */
void pt_cuda_fold_norm(int on);
void pt_cuda_tc_wg(int on); /* gemv_tc.cu: every 17..64-row launch of 4-bit g64 weights on the wgmma kernels */
unsigned long long pt_cuda_tc_wg_count(void); /* their launches so far */
void pt_cuda_tc_wg_plain(int on); /* gemv_tc.cu: a plain launch of 33..64 rows on them (1, default) or not (0) */
unsigned long long pt_cuda_tc_fold_count(void);
/* matmul.cu: the norm's fold at 2..64 rows on or off (as PETREL_CUDA_FOLD_NORM_ROWS; -1: the environment) */
void pt_cuda_fold_norm_rows(int on);
/* gemv_tc.cu: the one-row GLU launch of the folded norm on 16-warp blocks
 * (as PETREL_CUDA_TC_GLU16), launches of it so far */
void pt_cuda_tc_glu16(int on);
unsigned long long pt_cuda_tc_glu16_count(void);
/* the decode row's optional folds (pt_norm_in.optional): q/k/v on or off,
 * gate/up 0 never, 1 always, 2 on 16-warp blocks only (-1: the environment) */
void pt_cuda_fold_qkv(int on);
void pt_cuda_fold_glu(int mode);

static int same(const char *what, const float *a, const float *b, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (memcmp(&a[j], &b[j], 4)) {
            CHECK(0, "%s: element %lld: folded %.9g, separate %.9g", what, (long long)j, a[j], b[j]);
            return 0;
        }
    return 1;
}

/* Device buffers of one case. */
typedef struct {
    float *x, *xn, *y[3], *yf[3], *g, *u, *h, *hf, *res, *res2, *a;
} bufs;

static float *dup_dev(pt_backend *be, const float *h, int64_t n) {
    float *d = be->ops->alloc(be, (size_t)n * 4);
    if (d && be->ops->upload(be, d, h, (size_t)n * 4) != PT_OK) {
        be->ops->dealloc(be, d);
        return NULL;
    }
    return d;
}

static int down(pt_backend *be, float *h, const float *d, int64_t n) {
    return be->ops->download(be, h, d, (size_t)n * 4) == PT_OK;
}

/* One (bits, group, K, F) case: weights q [N, K], k and v [N/4, K], gate
 * and up [F, K], down [K, F]; for each norm style, matmul_norm of q alone
 * and of q, k, v, matmul_glu_norm, and matmul_add of down, each against
 * the separate calls. */
static int check_case(pt_backend *be, int bits, int gs, int64_t K, int bias, int64_t F) {
    const int64_t N = 640, Nk = 160;
    char what[200];
    rand_qweight wq, wk, wv, wg, wu, wd;
    int ok = gpu_qw_make(be, &wq, bits, gs, N, K, bias);
    ok = ok && gpu_qw_make(be, &wk, bits, gs, Nk, K, 0);
    ok = ok && gpu_qw_make(be, &wv, bits, gs, Nk, K, bias);
    ok = ok && gpu_qw_make(be, &wg, bits, gs, F, K, 0);
    ok = ok && gpu_qw_make(be, &wu, bits, gs, F, K, bias);
    ok = ok && gpu_qw_make(be, &wd, bits, gs, K, F, bias);
    if (!ok) return 0;
    float *xh = malloc((size_t)K * 4), *wf = malloc((size_t)K * 4), *ah = malloc((size_t)F * 4);
    uint16_t *wb = malloc((size_t)K * 2);
    const int64_t NR = N > K ? (N > F ? N : F) : (K > F ? K : F); /* the longest output read back */
    float *r1 = malloc((size_t)NR * 4), *r2 = malloc((size_t)NR * 4);
    for (int64_t i = 0; i < K; i++) {
        xh[i] = pt_round_bf16(rf(-3, 3));
        wf[i] = rf(-0.5f, 1.5f);
        wb[i] = pt_f32_to_bf16(wf[i]);
    }
    for (int64_t i = 0; i < F; i++) ah[i] = pt_round_bf16(rf(-1, 1));
    bufs b;
    memset(&b, 0, sizeof b);
    b.x = dup_dev(be, xh, K), b.a = dup_dev(be, ah, F);
    b.xn = be->ops->alloc(be, (size_t)K * 4);
    const int64_t NY = N > K ? N : K; /* y[0] also takes the down projection's K outputs */
    for (int i = 0; i < 3; i++) {
        b.y[i] = be->ops->alloc(be, (size_t)NY * 4);
        b.yf[i] = be->ops->alloc(be, (size_t)NY * 4);
    }
    b.g = be->ops->alloc(be, (size_t)F * 4), b.u = be->ops->alloc(be, (size_t)F * 4);
    b.h = be->ops->alloc(be, (size_t)F * 4), b.hf = be->ops->alloc(be, (size_t)F * 4);
    b.res = dup_dev(be, xh, K), b.res2 = dup_dev(be, xh, K);
    uint16_t *nwb = be->ops->alloc(be, (size_t)K * 2);
    float *nwf = dup_dev(be, wf, K);
    ok = b.x && b.a && b.xn && b.g && b.u && b.h && b.hf && b.res && b.res2 && nwb && nwf &&
         be->ops->upload(be, nwb, wb, (size_t)K * 2) == PT_OK;
    for (int i = 0; i < 3; i++) ok = ok && b.y[i] && b.yf[i];
    CHECK(ok, "buffers: %s", pt_last_error());
    const pt_matrix *qkv[3] = {&wq.w, &wk.w, &wv.w};
    static const pt_rms_style styles[] = {PT_RMS_W, PT_RMS_W_F32, PT_RMS_1PW, PT_RMS_NOSCALE};
    for (int si = 0; si < 5 && ok; si++) {
        /* the four styles over bf16 weights, then PT_RMS_W over f32 weights */
        const pt_rms_style style = styles[si < 4 ? si : 0];
        const pt_norm_in nrm = {style == PT_RMS_NOSCALE ? NULL : si < 4 ? (const void *)nwb : (const void *)nwf,
                                si < 4 ? PT_FT_BF16 : PT_FT_F32, style, 1e-5f, NULL, 0};
        snprintf(what, sizeof what, "%d-bit g%d K %lld%s, style %d%s", bits, gs, (long long)K, bias ? " bias" : "",
                 (int)style, si == 4 ? " (f32 weights)" : "");
        /* the separate calls */
        ok = be->ops->rms_norm(be, b.xn, b.x, NULL, 1, K, nrm.w, nrm.wtype, style, nrm.eps) == PT_OK;
        for (int n = 1; n <= 3 && ok; n += 2) {
            ok = be->ops->matmul_multi(be, n, b.y, b.xn, 1, qkv, 0) == PT_OK;
            const unsigned long long c0 = pt_cuda_tc_fold_count();
            const pt_status st = ok ? be->ops->matmul_norm(be, n, b.yf, b.x, 1, qkv, &nrm) : PT_ERR_INTERNAL;
            CHECK(st == PT_OK && pt_cuda_tc_fold_count() == c0 + 1, "%s: matmul_norm of %d weights: status %d, %s",
                  what, n, (int)st, pt_last_error());
            ok = ok && st == PT_OK;
            for (int i = 0; i < n && ok; i++) {
                const int64_t rows = qkv[i]->rows;
                char w2[260];
                snprintf(w2, sizeof w2, "%s: matmul_norm of %d weights, weight %d", what, n, i);
                ok = down(be, r1, b.yf[i], rows) && down(be, r2, b.y[i], rows) && same(w2, r1, r2, rows);
            }
        }
        ok = ok && down(be, r1, b.x, K) && same("x after matmul_norm (unchanged)", r1, xh, K);
        /* the GLU: the epilogue where it applies, else the two calls, and the fold declines with it */
        if (ok) {
            pt_status sg = be->ops->matmul_glu(be, b.h, b.xn, 1, &wg.w, &wu.w, PT_GLU_SILU, 0);
            const int glu_fused = sg == PT_OK;
            if (sg == PT_ERR_UNSUPPORTED) {
                const pt_matrix *gu[2] = {&wg.w, &wu.w};
                float *ys[2] = {b.g, b.u};
                sg = be->ops->matmul_multi(be, 2, ys, b.xn, 1, gu, 0);
                if (sg == PT_OK) sg = be->ops->glu(be, b.h, b.g, b.u, 1, F, F, PT_GLU_SILU);
            }
            ok = sg == PT_OK;
            const unsigned long long c0 = pt_cuda_tc_fold_count();
            const pt_status st = ok ? be->ops->matmul_glu_norm(be, b.hf, b.x, 1, &wg.w, &wu.w, PT_GLU_SILU, &nrm)
                                    : PT_ERR_INTERNAL;
            const int took = pt_cuda_tc_fold_count() != c0;
            if (glu_fused) {
                CHECK(st == PT_OK && took, "%s: matmul_glu_norm not folded (status %d): %s", what, (int)st,
                      pt_last_error());
                ok = ok && st == PT_OK && down(be, r1, b.hf, F) && down(be, r2, b.h, F) &&
                     same("matmul_glu_norm", r1, r2, F);
            } else {
                CHECK(st == PT_ERR_UNSUPPORTED && !took, "%s: matmul_glu_norm where matmul_glu declines: status %d",
                      what, (int)st);
                ok = ok && st == PT_ERR_UNSUPPORTED;
            }
        }
        /* the residual add: matmul then rms_norm's fused add into res, against matmul_add into res2 */
        if (ok) {
            ok = be->ops->upload(be, b.res, xh, (size_t)K * 4) == PT_OK &&
                 be->ops->upload(be, b.res2, xh, (size_t)K * 4) == PT_OK &&
                 be->ops->matmul(be, b.y[0], b.a, 1, &wd.w, 0) == PT_OK &&
                 be->ops->rms_norm(be, b.xn, b.y[0], b.res, 1, K, nrm.w, nrm.wtype, style, nrm.eps) == PT_OK;
            const unsigned long long c0 = pt_cuda_tc_fold_count();
            const pt_status st = ok ? be->ops->matmul_add(be, b.res2, b.a, 1, &wd.w) : PT_ERR_INTERNAL;
            CHECK(st == PT_OK && pt_cuda_tc_fold_count() == c0 + 1, "%s: matmul_add: status %d, %s", what, (int)st,
                  pt_last_error());
            ok = ok && st == PT_OK && down(be, r1, b.res2, K) && down(be, r2, b.res, K) &&
                 same("matmul_add (the residual)", r1, r2, K);
        }
        CHECK(ok, "%s failed", what);
    }
    be->ops->dealloc(be, b.x), be->ops->dealloc(be, b.a), be->ops->dealloc(be, b.xn);
    for (int i = 0; i < 3; i++) be->ops->dealloc(be, b.y[i]), be->ops->dealloc(be, b.yf[i]);
    be->ops->dealloc(be, b.g), be->ops->dealloc(be, b.u), be->ops->dealloc(be, b.h), be->ops->dealloc(be, b.hf);
    be->ops->dealloc(be, b.res), be->ops->dealloc(be, b.res2), be->ops->dealloc(be, nwb), be->ops->dealloc(be, nwf);
    gpu_qw_free(be, &wq), gpu_qw_free(be, &wk), gpu_qw_free(be, &wv);
    gpu_qw_free(be, &wg), gpu_qw_free(be, &wu), gpu_qw_free(be, &wd);
    free(xh), free(wf), free(ah), free(wb), free(r1), free(r2);
    return ok;
}

static void test_fold_ops_bit_identical(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(2);
    REQUIRE(be, "backend");
    REQUIRE(be->ops->matmul_norm && be->ops->matmul_glu_norm && be->ops->matmul_add,
            "the CUDA backend lacks the folded ops");
    pt_cuda_fold_norm(1);
    static const int bitss[] = {4, 8}, gss[] = {32, 64, 128};
    int ok = 1, cases = 0;
    for (int b = 0; b < 2 && ok; b++)
        for (int gi = 0; gi < 3 && ok; gi++) {
            ok = check_case(be, bitss[b], gss[gi], 768, (b + gi) & 1, 512);
            cases++;
        }
    static const int64_t Ks[] = {2048, 2560, 3072, 4096};
    for (int ki = 0; ki < 4 && ok; ki++)
        for (int b = 0; b < 2 && ok; b++) {
            ok = check_case(be, bitss[b], 64, Ks[ki], ki & 1, 512);
            cases++;
        }
    printf("INFO %d weight cases × 5 norm forms: matmul_norm, matmul_glu_norm, matmul_add bit-identical\n", cases);
    pt_cuda_fold_norm(-1);
    pt_backend_free(&be);
}

/* Batched rows: the norm (and the residual add before it) in the x
 * prepare of the XP launches, against rms_norm then the matmuls, over T
 * rows of K values (q [640, K], k and v [160, K], gate and up [F, K]). */
static int check_rows(pt_backend *be, int bits, int gs, int64_t K, int64_t F, pt_rms_style style) {
    const int64_t N = 640, Nk = 160, TM = 128;
    rand_qweight wq, wk, wv, wg, wu;
    int ok = gpu_qw_make(be, &wq, bits, gs, N, K, 1) && gpu_qw_make(be, &wk, bits, gs, Nk, K, 0) &&
             gpu_qw_make(be, &wv, bits, gs, Nk, K, 1) && gpu_qw_make(be, &wg, bits, gs, F, K, 0) &&
             gpu_qw_make(be, &wu, bits, gs, F, K, 1);
    if (!ok) return 0;
    float *xh = malloc((size_t)(TM * K) * 4), *ah = malloc((size_t)(TM * K) * 4), *wf = malloc((size_t)K * 4);
    const int64_t NW = N > F ? N : F, NR = TM * (NW > K ? NW : K); /* the longest read back: outputs or x */
    float *r1 = malloc((size_t)NR * 4), *r2 = malloc((size_t)NR * 4);
    for (int64_t i = 0; i < TM * K; i++) xh[i] = pt_round_bf16(rf(-3, 3)), ah[i] = pt_round_bf16(rf(-2, 2));
    for (int64_t i = 0; i < K; i++) wf[i] = rf(-0.5f, 1.5f);
    float *add = dup_dev(be, ah, TM * K), *nw = dup_dev(be, wf, K), *xr = be->ops->alloc(be, (size_t)(TM * K) * 4);
    float *xf = be->ops->alloc(be, (size_t)(TM * K) * 4), *xn = be->ops->alloc(be, (size_t)(TM * K) * 4);
    float *y[3], *yf[3];
    for (int i = 0; i < 3; i++) {
        y[i] = be->ops->alloc(be, (size_t)(TM * N) * 4);
        yf[i] = be->ops->alloc(be, (size_t)(TM * N) * 4);
        ok = ok && y[i] && yf[i];
    }
    float *h = be->ops->alloc(be, (size_t)(TM * F) * 4), *hf = be->ops->alloc(be, (size_t)(TM * F) * 4);
    ok = ok && add && nw && xr && xf && xn && h && hf;
    CHECK(ok, "buffers: %s", pt_last_error());
    const pt_matrix *qkv[3] = {&wq.w, &wk.w, &wv.w};
    const int64_t rows_of[3] = {N, Nk, Nk};
    static const int Ts[] = {2, 9, 33, 64, 80, 128}; /* above 64: pieces of 64, the last one of 16 or 64 */
    char what[200];
    for (int ti = 0; ti < 6 && ok; ti++)
        for (int wa = 0; wa < 2 && ok; wa++) {
            const int T = Ts[ti];
            const pt_norm_in nrm = {style == PT_RMS_NOSCALE ? NULL : nw, PT_FT_F32, style, 1e-5f, wa ? add : NULL, 0};
            snprintf(what, sizeof what, "%d-bit g%d K %lld, style %d, %d rows%s", bits, gs, (long long)K,
                     (int)style, T, wa ? ", residual add" : "");
            for (int op = 0; op < 2 && ok; op++) { /* matmul_norm of q, k, v; matmul_glu_norm */
                /* the separate calls: rms_norm (x += add first, written back), then the matmuls */
                ok = be->ops->upload(be, xr, xh, (size_t)(T * K) * 4) == PT_OK &&
                     be->ops->upload(be, xf, xh, (size_t)(T * K) * 4) == PT_OK &&
                     be->ops->rms_norm(be, xn, wa ? add : xr, wa ? xr : NULL, T, K, nrm.w, nrm.wtype, style,
                                       nrm.eps) == PT_OK &&
                     (op ? be->ops->matmul_glu(be, h, xn, T, &wg.w, &wu.w, PT_GLU_SILU, 1)
                         : be->ops->matmul_multi(be, 3, y, xn, T, qkv, 1)) == PT_OK;
                CHECK(ok, "%s: separate calls: %s", what, pt_last_error());
                const unsigned long long c0 = pt_cuda_tc_fold_count();
                const pt_status st = op ? be->ops->matmul_glu_norm(be, hf, xf, T, &wg.w, &wu.w, PT_GLU_SILU, &nrm)
                                        : be->ops->matmul_norm(be, 3, yf, xf, T, qkv, &nrm);
                CHECK(st == PT_OK, "%s, %s: %s", what, op ? "matmul_glu_norm" : "matmul_norm",
                      st == PT_ERR_UNSUPPORTED ? "declined" : pt_last_error());
                CHECK(pt_cuda_tc_fold_count() == c0 + (T + 63) / 64, "%s: %llu folded launches", what,
                      pt_cuda_tc_fold_count() - c0);
                ok = ok && st == PT_OK;
                for (int i = 0; i < (op ? 1 : 3) && ok; i++) {
                    const int64_t n = T * (op ? F : rows_of[i]);
                    ok = down(be, r1, op ? hf : yf[i], n) && down(be, r2, op ? h : y[i], n) && same(what, r1, r2, n);
                }
                /* x: as rms_norm leaves it (x + add with the addend, else unchanged) */
                ok = ok && down(be, r1, xf, T * K) && down(be, r2, xr, T * K) && same(what, r1, r2, T * K);
            }
        }
    for (int i = 0; i < 3; i++) be->ops->dealloc(be, y[i]), be->ops->dealloc(be, yf[i]);
    be->ops->dealloc(be, add), be->ops->dealloc(be, nw), be->ops->dealloc(be, xr), be->ops->dealloc(be, xf);
    be->ops->dealloc(be, xn), be->ops->dealloc(be, h), be->ops->dealloc(be, hf);
    gpu_qw_free(be, &wq), gpu_qw_free(be, &wk), gpu_qw_free(be, &wv), gpu_qw_free(be, &wg), gpu_qw_free(be, &wu);
    free(xh), free(ah), free(wf), free(r1), free(r2);
    return ok;
}

static void test_fold_rows_bit_identical(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(64);
    REQUIRE(be, "backend");
    pt_cuda_fold_norm(1);
    pt_cuda_fold_norm_rows(1);
    int ok = check_rows(be, 4, 64, 4096, 1024, PT_RMS_W) && check_rows(be, 8, 32, 2048, 512, PT_RMS_1PW) &&
             check_rows(be, 4, 128, 768, 512, PT_RMS_NOSCALE) && check_rows(be, 8, 64, 3072, 512, PT_RMS_W_F32);
    if (ok) printf("INFO 4 weight cases × 6 row counts × 2 forms: folded rows bit-identical\n");
    /* the wgmma kernels (their x layout from the norm's prepare): every 17..64-row launch on them
     * (PETREL_CUDA_TC_WG), then by default the 8b gate/up shape (not split: its 33..64-row GLU
     * takes them, PETREL_CUDA_TC_WG_GLU) */
    if (ok) {
        pt_cuda_tc_wg(1);
        unsigned long long w0 = pt_cuda_tc_wg_count();
        ok = check_rows(be, 4, 64, 4096, 1024, PT_RMS_W);
        CHECK(!ok || pt_cuda_tc_wg_count() > w0, "PETREL_CUDA_TC_WG=1: no wgmma launch");
        pt_cuda_tc_wg(-1);
        pt_cuda_tc_wg_plain(0); /* the GLU rule alone */
        w0 = pt_cuda_tc_wg_count();
        ok = ok && check_rows(be, 4, 64, 4096, 14336, PT_RMS_W);
        /* matmul_glu_norm and matmul_glu, without and with the addend, at 33, 64, 80 (64 + 16) and
         * 128 (64 + 64) rows: 2 · 2 · (1 + 1 + 1 + 2) */
        CHECK(!ok || pt_cuda_tc_wg_count() - w0 == 20, "8b gate/up: %llu wgmma launches, want 20",
              pt_cuda_tc_wg_count() - w0);
        /* the default rules: this case's three q/k/v weights share one split, so matmul_norm and
         * matmul_multi take them too (PETREL_CUDA_TC_WG_PLAIN): 20 more */
        pt_cuda_tc_wg_plain(-1);
        w0 = pt_cuda_tc_wg_count();
        ok = ok && check_rows(be, 4, 64, 4096, 14336, PT_RMS_W);
        CHECK(!ok || pt_cuda_tc_wg_count() - w0 == 40, "8b gate/up, default rules: %llu wgmma launches, want 40",
              pt_cuda_tc_wg_count() - w0);
        if (ok) printf("INFO the wgmma kernels: folded rows bit-identical\n");
    }
    pt_cuda_fold_norm_rows(-1);
    pt_cuda_fold_norm(-1);
    pt_backend_free(&be);
}

/* What is not folded: PT_ERR_UNSUPPORTED with nothing launched. */
static void test_fold_declines(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(2);
    REQUIRE(be, "backend");
    rand_qweight w, wl;
    REQUIRE(gpu_qw_make(be, &w, 4, 64, 640, 768, 0), "weight");
    /* a row of 4160 values: past the fold's 4096 */
    REQUIRE(gpu_qw_make(be, &wl, 4, 64, 64, 4160, 0), "long weight");
    float *x = be->ops->alloc(be, (size_t)2 * 4160 * 4 + 16), *y = be->ops->alloc(be, (size_t)2 * 640 * 4);
    uint16_t *nw = be->ops->alloc(be, 2 * 768 + 16);
    REQUIRE(x && y && nw, "buffers");
    const pt_norm_in nrm = {NULL, PT_FT_BF16, PT_RMS_NOSCALE, 1e-6f, NULL, 0},
                     nrm_odd = {nw + 1, PT_FT_BF16, PT_RMS_W, 1e-6f, NULL, 0};
    const pt_matrix *ws[1] = {&w.w}, *wls[1] = {&wl.w};
    float *ys[1] = {y};
    const pt_norm_in nrm_add = {NULL, PT_FT_BF16, PT_RMS_NOSCALE, 1e-6f, x, 0};
    pt_cuda_fold_norm(1);
    const unsigned long long c0 = pt_cuda_tc_fold_count();
    pt_cuda_fold_norm_rows(0);
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 2, ws, &nrm) == PT_ERR_UNSUPPORTED,
          "2 rows, rows switch off: not PT_ERR_UNSUPPORTED");
    pt_cuda_fold_norm_rows(1);
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 65, ws, &nrm) == PT_ERR_UNSUPPORTED,
          "65 rows (a last piece of one row): not PT_ERR_UNSUPPORTED");
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 1, ws, &nrm_add) == PT_ERR_UNSUPPORTED,
          "one row with a residual addend: not PT_ERR_UNSUPPORTED");
    pt_cuda_fold_norm_rows(-1);
    CHECK(be->ops->matmul_add(be, y, x, 2, &w.w) == PT_ERR_UNSUPPORTED, "matmul_add of 2 rows: not unsupported");
    CHECK(be->ops->matmul_norm(be, 1, ys, x + 1, 1, ws, &nrm) == PT_ERR_UNSUPPORTED, "unaligned x: not unsupported");
    CHECK(be->ops->matmul_add(be, y, x + 1, 1, &w.w) == PT_ERR_UNSUPPORTED, "matmul_add, unaligned a: not unsupported");
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 1, wls, &nrm) == PT_ERR_UNSUPPORTED, "K 4160: not unsupported");
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 1, ws, &nrm_odd) == PT_ERR_UNSUPPORTED,
          "a norm weight not 16-byte aligned: not unsupported");
    CHECK(pt_cuda_tc_fold_count() == c0, "a folded launch where none may be");
    const unsigned long long c1 = pt_cuda_tc_fold_count();
    pt_cuda_fold_norm(0);
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 1, ws, &nrm) == PT_ERR_UNSUPPORTED, "switch off: matmul_norm folded");
    CHECK(be->ops->matmul_glu_norm(be, y, x, 1, &w.w, &w.w, PT_GLU_SILU, &nrm) == PT_ERR_UNSUPPORTED,
          "switch off: matmul_glu_norm folded");
    CHECK(be->ops->matmul_add(be, y, x, 1, &w.w) == PT_ERR_UNSUPPORTED, "switch off: matmul_add folded");
    CHECK(pt_cuda_tc_fold_count() == c1, "a folded launch where none may be");
    CHECK(be->ops->sync(be) == PT_OK, "sync: %s", pt_last_error());
    pt_cuda_fold_norm(-1);
    be->ops->dealloc(be, x), be->ops->dealloc(be, y), be->ops->dealloc(be, nw);
    gpu_qw_free(be, &w), gpu_qw_free(be, &wl);
    pt_backend_free(&be);
}

/* The llama-3.2-3b gate/up shape (8192 × 3072): its one-row GLU launch with
 * the norm folded runs 16-warp blocks (gemv_tc.cu tc_launch), and must give
 * the separate calls' bits there as with 8-warp blocks; the 1B shape's
 * (8192 × 2048, a warp's blocks all in its ring) keeps 8-warp blocks. */
static void test_fold_glu_16warp_blocks(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(2);
    REQUIRE(be, "backend");
    pt_cuda_fold_norm(1);
    int ok = 1;
    for (int on = 1; on >= 0 && ok; on--) {
        pt_cuda_tc_glu16(on);
        for (int b = 4; b <= 8 && ok; b += 4) {
            const unsigned long long c0 = pt_cuda_tc_glu16_count();
            ok = check_case(be, b, 64, 3072, b == 8, 8192);
            /* five norm forms, one matmul_glu_norm each */
            CHECK(pt_cuda_tc_glu16_count() == c0 + (on ? 5 : 0), "%d-bit 8192 × 3072, switch %d: %llu launches on "
                  "16-warp blocks", b, on, pt_cuda_tc_glu16_count() - c0);
        }
    }
    pt_cuda_tc_glu16(1);
    const unsigned long long c1 = pt_cuda_tc_glu16_count();
    ok = ok && check_case(be, 4, 64, 2048, 0, 8192);
    CHECK(pt_cuda_tc_glu16_count() == c1, "the 1B gate/up shape took 16-warp blocks");
    pt_cuda_tc_glu16(-1);
    pt_cuda_fold_norm(-1);
    pt_backend_free(&be);
}

/* The decode row's folds the forward pass leaves to the backend
 * (pt_norm_in.optional): by default the q/k/v norm is not folded and the
 * gate/up norm only where the launch takes the 16-warp blocks (the 3B shape,
 * not the 1B one); declining launches nothing. Forced on, each gives the
 * bits of the same call without the flag. */
static void test_fold_optional(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    pt_backend *be = gpu_open_gemv(2);
    REQUIRE(be, "backend");
    rand_qweight q, g1, u1, g3, u3;
    REQUIRE(gpu_qw_make(be, &q, 4, 64, 2048, 2048, 0) && gpu_qw_make(be, &g1, 4, 64, 8192, 2048, 0) &&
                gpu_qw_make(be, &u1, 4, 64, 8192, 2048, 0) && gpu_qw_make(be, &g3, 4, 64, 8192, 3072, 0) &&
                gpu_qw_make(be, &u3, 4, 64, 8192, 3072, 0),
            "weights");
    float *x = be->ops->alloc(be, 3072 * 4), *y = be->ops->alloc(be, 8192 * 4), *y2 = be->ops->alloc(be, 8192 * 4);
    REQUIRE(x && y && y2, "buffers");
    float *xh = malloc(3072 * 4), *h1 = malloc(8192 * 4), *h2 = malloc(8192 * 4);
    for (int i = 0; i < 3072; i++) xh[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    REQUIRE(be->ops->upload(be, x, xh, 3072 * 4) == PT_OK, "upload");
    const pt_norm_in opt = {NULL, PT_FT_BF16, PT_RMS_NOSCALE, 1e-6f, NULL, 1},
                     req = {NULL, PT_FT_BF16, PT_RMS_NOSCALE, 1e-6f, NULL, 0};
    const pt_matrix *qs[1] = {&q.w};
    float *ys[1] = {y}, *ys2[1] = {y2};
    pt_cuda_fold_norm(1);
    pt_cuda_fold_qkv(-1);
    pt_cuda_fold_glu(-1);
    unsetenv("PETREL_CUDA_FOLD_QKV");
    unsetenv("PETREL_CUDA_FOLD_GLU");
    unsigned long long c0 = pt_cuda_tc_fold_count();
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 1, qs, &opt) == PT_ERR_UNSUPPORTED, "q/k/v: folded by default");
    CHECK(be->ops->matmul_glu_norm(be, y, x, 1, &g1.w, &u1.w, PT_GLU_SILU, &opt) == PT_ERR_UNSUPPORTED,
          "the 1B gate/up (8-warp blocks): folded by default");
    CHECK(pt_cuda_tc_fold_count() == c0, "a declined fold launched something");
    const unsigned long long w0 = pt_cuda_tc_glu16_count();
    CHECK(be->ops->matmul_glu_norm(be, y, x, 1, &g3.w, &u3.w, PT_GLU_SILU, &opt) == PT_OK &&
              pt_cuda_tc_glu16_count() == w0 + 1,
          "the 3B gate/up: not folded on 16-warp blocks by default: %s", pt_last_error());
    CHECK(be->ops->matmul_glu_norm(be, y2, x, 1, &g3.w, &u3.w, PT_GLU_SILU, &req) == PT_OK, "3B, required: %s",
          pt_last_error());
    int ok = be->ops->download(be, h1, y, 8192 * 4) == PT_OK && be->ops->download(be, h2, y2, 8192 * 4) == PT_OK;
    CHECK(ok && !memcmp(h1, h2, 8192 * 4), "3B gate/up: optional and required folds differ");
    pt_cuda_fold_glu(0);
    CHECK(be->ops->matmul_glu_norm(be, y, x, 1, &g3.w, &u3.w, PT_GLU_SILU, &opt) == PT_ERR_UNSUPPORTED,
          "fold_glu 0: the 3B gate/up folded");
    pt_cuda_fold_glu(1);
    pt_cuda_fold_qkv(1);
    c0 = pt_cuda_tc_fold_count();
    CHECK(be->ops->matmul_glu_norm(be, y, x, 1, &g1.w, &u1.w, PT_GLU_SILU, &opt) == PT_OK &&
              be->ops->matmul_glu_norm(be, y2, x, 1, &g1.w, &u1.w, PT_GLU_SILU, &req) == PT_OK,
          "fold_glu 1: the 1B gate/up: %s", pt_last_error());
    ok = be->ops->download(be, h1, y, 8192 * 4) == PT_OK && be->ops->download(be, h2, y2, 8192 * 4) == PT_OK;
    CHECK(ok && !memcmp(h1, h2, 8192 * 4), "1B gate/up: optional and required folds differ");
    CHECK(be->ops->matmul_norm(be, 1, ys, x, 1, qs, &opt) == PT_OK &&
              be->ops->matmul_norm(be, 1, ys2, x, 1, qs, &req) == PT_OK,
          "fold_qkv 1: q not folded: %s", pt_last_error());
    ok = be->ops->download(be, h1, y, 2048 * 4) == PT_OK && be->ops->download(be, h2, y2, 2048 * 4) == PT_OK;
    CHECK(ok && !memcmp(h1, h2, 2048 * 4), "q: optional and required folds differ");
    CHECK(pt_cuda_tc_fold_count() == c0 + 4, "forced: %llu folds, want 4", pt_cuda_tc_fold_count() - c0);
    pt_cuda_fold_qkv(-1);
    pt_cuda_fold_glu(-1);
    pt_cuda_fold_norm(-1);
    free(xh), free(h1), free(h2);
    be->ops->dealloc(be, x), be->ops->dealloc(be, y), be->ops->dealloc(be, y2);
    gpu_qw_free(be, &q), gpu_qw_free(be, &g1), gpu_qw_free(be, &u1), gpu_qw_free(be, &g3), gpu_qw_free(be, &u3);
    pt_backend_free(&be);
}

/* every fold forced on (the forward pass's optional ones too) against none */
static void folds_all(int on) {
    pt_cuda_fold_norm(on);
    pt_cuda_fold_qkv(on < 0 ? -1 : on);
    pt_cuda_fold_glu(on < 0 ? -1 : on);
}

static void test_fold_forward_on_off(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    /* the default choice of folds, then every fold */
    gpu_forward_on_off_models(pt_cuda_fold_norm, pt_cuda_tc_fold_count, "folds");
    gpu_forward_on_off_models(folds_all, pt_cuda_tc_fold_count, "folds, all forced");
}

/* the FFN's weights fetched into the L2 by the output projection's launch
 * (backend.h prefetch_hint, PETREL_CUDA_L2_PF): whole weights (32 MiB: the
 * 1B shape's gate, up and down) or a prefix of every tile (4 MiB) — the
 * same bits as without, and no prefetch launch with it off; where the GLU
 * launch folds the FFN's norm (16-warp blocks: the 1B shape at 8 bits,
 * whose warps stream past their rings) the hint is declined */
void pt_cuda_l2_pf(int mb);
unsigned long long pt_cuda_l2_pf_count(void);
static void l2_pf_whole(int on) { pt_cuda_l2_pf(on > 0 ? 32 : on); }
static void l2_pf_prefix(int on) { pt_cuda_l2_pf(on > 0 ? 4 : on); }

static void test_l2_prefetch_forward_on_off(void) {
    if (!gpu_usable("no usable CUDA device here")) TEST_SKIP("no usable CUDA device here");
    static const char *const where[][2] = {{"models/kjv-llama-4bit", "q4"}, {"synthetic:llama-3.2-1b", "q4"}};
    for (int i = 0; i < 2; i++) {
        gpu_forward_on_off(where[i][0], where[i][1], l2_pf_whole, pt_cuda_l2_pf_count, "L2 prefetch of whole weights");
        gpu_forward_on_off(where[i][0], where[i][1], l2_pf_prefix, pt_cuda_l2_pf_count, "L2 prefetch of tile prefixes");
    }
    /* declined: the 1B shape at 8 bits folds the norm into its 16-warp GLU launch */
    float *lg = NULL;
    int32_t ids[6];
    int V = 0;
    unsigned long long n = 0, g0 = pt_cuda_tc_glu16_count();
    pt_cuda_l2_pf(32);
    const int ok = gpu_model_greedy("synthetic:llama-3.2-1b", "q8", &lg, ids, &V, pt_cuda_l2_pf_count, &n);
    pt_cuda_l2_pf(-1);
    if (ok) {
        CHECK(pt_cuda_tc_glu16_count() > g0, "the 1B shape at 8 bits ran no 16-warp GLU launch");
        CHECK(n == 0, "%llu prefetch launches beside a GLU launch that folds the norm", n);
    }
    free(lg);
}

int main(void) {
    TEST_RUN(test_fold_ops_bit_identical);
    TEST_RUN(test_fold_rows_bit_identical);
    TEST_RUN(test_fold_declines);
    TEST_RUN(test_fold_glu_16warp_blocks);
    TEST_RUN(test_fold_optional);
    TEST_RUN(test_fold_forward_on_off);
    TEST_RUN(test_l2_prefetch_forward_on_off);
    return test_summary();
}
