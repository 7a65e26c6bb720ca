/* The decode GEMVs of one llama-3.1-8b layer (4-bit, group 64) on the
 * tensor-core GEMV, A/B of its two launch-level levers in one process:
 *   grouped launch (matmul_multi: q/k/v in one launch, gate/up in one;
 *                   PETREL_CUDA_MULTI) on or off,
 *   x prepared once per launch (above 8 rows; PETREL_CUDA_TC_XPRE) on or off,
 * for T = 1, 8, 16, 32, 64 rows. Each number is µs per layer (median of 5
 * replays of a CUDA graph of REPS passes over NC copies of the layer's
 * weights, so nothing stays in L2): the q/k/v projections alone, gate/up
 * alone, and the layer's seven GEMVs (q/k/v, o, gate/up, down). Every
 * configuration's outputs are compared bit for bit with the first one.
 * GEMV_LOOPS="0 1 2" in the environment: instead, the GEMV inner
 * loops (PETREL_CUDA_TC_LOOP values; GEMV_ALL_T=1: every T, else T = 1, 8),
 * round-robin, best of 3, outputs compared with the first variant's.
 * GEMV_XP="0 1 2 3" likewise round-robins the two levers of the launches
 * above 8 rows at every T (bit 0: warps drift across the x stages,
 * PETREL_CUDA_TC_DRIFT; bit 1: the XL kernels, x laid out per K block by the x prepare,
 * PETREL_CUDA_TC_XL; bit 2: 17..64 rows of 4-bit g64 weights on the wgmma kernels,
 * PETREL_CUDA_TC_WG; bit 3: their stage refills by one elected lane in every launch,
 * PETREL_CUDA_TC_WG_REFILL=2, else in none, =0: "3 11" compares the two; bit 4: their
 * loop unrolled over the rings' stages in every launch, PETREL_CUDA_TC_WG_UNROLL=2, else in
 * none, =0: "3 19" compares the two).
 * GEMV_FUSE=1: the layer as the forward pass runs it, with the GLU between
 * gate/up and down (down reads its output), A/B of the GLU folded into the
 * gate/up GEMV's epilogue (matmul_glu; PETREL_CUDA_GEMV_FUSE) against
 * matmul_multi + glu, round-robin, best of 3, at T = 1, 2, 8, 9, 16, 32, 64;
 * the GLU output, q/k/v, o and down compared with the unfused run's.
 * Not a test; built with the CUDA test binaries (make gpu-bundle) and run
 * on the GPU machine: bench_gemv_multi. Numbers in bench/RESULTS.md. */
#include "bench_util.h"

#include "base/half.h"

#include <string.h>

void pt_cuda_tc_multi(int on); /* matmul.cu: the grouped launch (1) or the separate ones (0) */
void pt_cuda_tc_xpre(int on);  /* gemv_tc.cu: x prepared once per launch above 8 rows (1) or per block (0) */
void pt_cuda_tc_loop(int lv);  /* gemv_tc.cu: the GEMV's inner loop (PETREL_CUDA_TC_LOOP 0, 1, 2) */
void pt_cuda_tc_drift(int on); /* gemv_tc.cu: above 8 rows, warps drift across x stages (1) or meet per stage (0) */
void pt_cuda_tc_xl(int on);   /* gemv_tc.cu: above 8 rows, 4-bit: the XL kernels (1) or not (0) */
void pt_cuda_tc_wg(int on);   /* gemv_tc.cu: 17..64 rows, 4-bit g64: the wgmma kernels (1) or not (0) */
void pt_cuda_tc_wg_refill(int v); /* gemv_tc.cu: wgmma refills by one elected lane: 0 none, 1 GLU, 2 all; -1 */
void pt_cuda_tc_wg_unroll(int v); /* gemv_tc.cu: wgmma loop unrolled over the stages: 0 none, 1 GLU, 2 all; -1 */
void pt_cuda_gemv_fuse(int on); /* matmul.cu: matmul_glu fused (1) or PT_ERR_UNSUPPORTED (0); -1: the environment */

/* One variant of a round-robin: a PETREL_CUDA_TC_LOOP value, or a GEMV_XP mask. */
static void set_variant(int xp, int v) {
    if (xp) {
        pt_cuda_tc_drift(v & 1);
        pt_cuda_tc_xl((v >> 1) & 1);
        pt_cuda_tc_wg((v >> 2) & 1);
        pt_cuda_tc_wg_refill((v >> 3) & 1 ? 2 : 0);
        pt_cuda_tc_wg_unroll((v >> 4) & 1 ? 2 : 0);
    } else pt_cuda_tc_loop(v);
}

enum { NC = 4, NW = 7, REPS = 2, H = 4096, F = 14336, KVD = 1024, TMAX = 64 };
static const int64_t rows_of[NW] = {H, KVD, KVD, H, F, F, H}, cols_of[NW] = {H, H, H, H, H, H, F};
enum { WQ, WK, WV, WO, WG, WU, WD };

typedef struct {
    pt_backend *be;
    pt_matrix w[NC][NW];
    float *x, *xf, *y[NW]; /* x [TMAX, H], xf [TMAX, F] (down's input), y[i] [TMAX, rows_of[i]] */
    int glu;               /* GEMV_FUSE: gate/up, then the GLU into act, which down reads */
    float *act;            /* [TMAX, F] */
} layer_set;

static void make_weight(pt_backend *be, pt_matrix *w, int64_t N, int64_t K, int role) {
    const int gs = 64;
    uint32_t *d = malloc((size_t)(N * K / 2));
    uint16_t *sc = malloc((size_t)(N * K / gs) * 2), *bi = malloc((size_t)(N * K / gs) * 2);
    for (int64_t i = 0; i < N * K / 8; i++) d[i] = ru();
    for (int64_t i = 0; i < N * K / gs; i++) {
        sc[i] = pt_f32_to_bf16(((ru() & 0xffff) / 65536.0f - 0.5f) * 0.02f);
        bi[i] = pt_f32_to_bf16(((ru() & 0xffff) / 65536.0f - 0.5f) * 0.2f);
    }
    *w = (pt_matrix){.rows = N, .cols = K, .dtype = PT_FT_BF16, .bits = 4, .group_size = gs, .data = d,
                     .scales = sc, .biases = bi, .role = role};
    if (be->ops->prepare_weight(be, w, "w") != PT_OK) DIE("prepare");
}

/* what: 0 = q/k/v, 1 = gate/up, 2 = the whole layer */
static void run_layer(layer_set *s, int c, int T, int what) {
    pt_backend *be = s->be;
    pt_matrix *w = s->w[c];
    if (what != 1) {
        const pt_matrix *ws[3] = {&w[WQ], &w[WK], &w[WV]};
        float *ys[3] = {s->y[WQ], s->y[WK], s->y[WV]};
        if (pt_backend_matmul_multi(be, 3, ys, s->x, T, ws, 0) != PT_OK) DIE("q/k/v");
    }
    if (what == 2 && be->ops->matmul(be, s->y[WO], s->x, T, &w[WO], 0) != PT_OK) DIE("o");
    if (what != 0) {
        /* GEMV_FUSE: as forward.c's ffn: matmul_glu where it fuses, else matmul_multi + glu */
        pt_status st = s->glu ? be->ops->matmul_glu(be, s->act, s->x, T, &w[WG], &w[WU], PT_GLU_SILU, 0)
                              : PT_ERR_UNSUPPORTED;
        if (st == PT_ERR_UNSUPPORTED) {
            const pt_matrix *ws[2] = {&w[WG], &w[WU]};
            float *ys[2] = {s->y[WG], s->y[WU]};
            st = pt_backend_matmul_multi(be, 2, ys, s->x, T, ws, 0);
            if (st == PT_OK && s->glu) st = be->ops->glu(be, s->act, s->y[WG], s->y[WU], T, F, F, PT_GLU_SILU);
        }
        if (st != PT_OK) DIE("gate/up");
    }
    if (what == 2 && be->ops->matmul(be, s->y[WD], s->glu ? s->act : s->xf, T, &w[WD], 0) != PT_OK) DIE("down");
}

static double time_graph(layer_set *s, int T, int what) {
    pt_backend *be = s->be;
    for (int c = 0; c < NC; c++) run_layer(s, c, T, what); /* eager first: shared-memory attributes */
    if (be->ops->sync(be) != PT_OK) DIE("sync");
    if (pt_cuda_graph_begin(be) != PT_OK) DIE("begin");
    for (int r = 0; r < REPS; r++)
        for (int c = 0; c < NC; c++) run_layer(s, c, T, what);
    return bench_graph_median_us(be, REPS * NC);
}

int main(void) {
    layer_set s;
    memset(&s, 0, sizeof s);
    s.be = bench_cuda_open();
    pt_backend *be = s.be;
    pt_backend_limits lim = {.max_tokens = TMAX, .max_cols = F, .max_ctx = 16, .max_heads = 1, .max_head_dim = 64};
    if (be->ops->reserve(be, &lim) != PT_OK) DIE("reserve");
    for (int c = 0; c < NC; c++)
        for (int i = 0; i < NW; i++) /* q, k, v as the model binds them */
            make_weight(be, &s.w[c][i], rows_of[i], cols_of[i], i <= WV ? PT_ROLE_ATTN_IN : PT_ROLE_NONE);
    float *xh = malloc((size_t)TMAX * F * 4);
    for (int64_t i = 0; i < (int64_t)TMAX * F; i++) xh[i] = pt_round_bf16(((ru() & 0xffff) / 65536.0f - 0.5f) * 4);
    s.x = be->ops->alloc(be, (size_t)TMAX * H * 4);
    s.xf = be->ops->alloc(be, (size_t)TMAX * F * 4);
    if (!s.x || !s.xf) DIE("alloc");
    if (be->ops->upload(be, s.x, xh, (size_t)TMAX * H * 4) != PT_OK) DIE("upload");
    if (be->ops->upload(be, s.xf, xh, (size_t)TMAX * F * 4) != PT_OK) DIE("upload");
    for (int i = 0; i < NW; i++)
        if (!(s.y[i] = be->ops->alloc(be, (size_t)(TMAX * rows_of[i]) * 4))) DIE("alloc");
    float *ref[NW], *out = malloc((size_t)TMAX * F * 4);
    for (int i = 0; i < NW; i++) ref[i] = malloc((size_t)(TMAX * rows_of[i]) * 4);
    printf("llama-3.1-8b layer GEMVs, 4-bit g64, µs per layer (%d weight copies, graphs of %d passes)\n", NC,
           NC * REPS);
    printf("%3s %5s %4s | %8s %8s %8s | %s\n", "T", "multi", "xpre", "q/k/v", "gate/up", "layer", "outputs");
    static const int Ts[] = {1, 8, 16, 32, 64};
    if (getenv("GEMV_FUSE")) { /* the GLU folded into gate/up (1) or its own kernel (0), round-robin */
        s.glu = 1;
        if (!(s.act = be->ops->alloc(be, (size_t)TMAX * F * 4))) DIE("alloc");
        static const int Tf[] = {1, 2, 8, 9, 16, 32, 64};
        float *aref = malloc((size_t)TMAX * F * 4);
        printf("%3s %4s | %8s %8s | %s\n", "T", "fuse", "gate/up", "layer", "outputs (best of 3)");
        for (int ti = 0; ti < 7; ti++) {
            const int T = Tf[ti];
            double t[2][2] = {{1e9, 1e9}, {1e9, 1e9}};
            int same = 1;
            for (int round = 0; round < 3; round++)
                for (int k = 0; k < 2; k++) {
                    pt_cuda_gemv_fuse(k);
                    for (int what = 1; what < 3; what++) {
                        const double tt = time_graph(&s, T, what);
                        if (tt < t[k][what - 1]) t[k][what - 1] = tt;
                    }
                    /* the GLU output and every GEMV output but gate/up (not written when fused) */
                    for (int i = -1; i < NW; i++) {
                        if (i == WG || i == WU) continue;
                        const size_t n = (size_t)T * (i < 0 ? F : rows_of[i]) * 4;
                        float *dst = k ? out : i < 0 ? aref : ref[i];
                        if (be->ops->download(be, dst, i < 0 ? s.act : s.y[i], n) != PT_OK) DIE("download");
                        if (k && memcmp(out, i < 0 ? aref : ref[i], n)) same = 0;
                    }
                }
            for (int k = 0; k < 2; k++)
                printf("%3d %4d | %8.1f %8.1f | %s\n", T, k, t[k][0], t[k][1],
                       k ? (same ? "identical" : "DIFFER") : "reference");
            fflush(stdout);
        }
        pt_cuda_gemv_fuse(-1);
        return 0;
    }
    const char *xpv = getenv("GEMV_XP"), *vars = xpv ? xpv : getenv("GEMV_LOOPS");
    if (vars) { /* inner loops (PETREL_CUDA_TC_LOOP values) or XP levers, both launch levers on, round-robin */
        int vl[8];
        const int nv = bench_ints(vars, vl, 8);
        printf("%3s %5s | %8s %8s %8s | %s\n", "T", xpv ? "xp" : "loop", "q/k/v", "gate/up", "layer",
               "outputs (best of 3)");
        for (int ti = 0; ti < 5; ti++) {
            const int T = Ts[ti];
            if (T > 8 && !xpv && !getenv("GEMV_ALL_T")) continue; /* GEMV_ALL_T: also above 8 rows */
            double t[8][3];
            int same[8];
            for (int k = 0; k < nv; k++) {
                same[k] = 1;
                for (int w = 0; w < 3; w++) t[k][w] = 1e9;
            }
            for (int round = 0; round < 3; round++)
                for (int k = 0; k < nv; k++) {
                    set_variant(xpv != NULL, vl[k]);
                    for (int what = 0; what < 3; what++) {
                        const double tt = time_graph(&s, T, what);
                        if (tt < t[k][what]) t[k][what] = tt;
                    }
                    for (int i = 0; i < NW; i++) {
                        if (be->ops->download(be, k ? out : ref[i], s.y[i], (size_t)(T * rows_of[i]) * 4) != PT_OK)
                            DIE("download");
                        if (k && memcmp(out, ref[i], (size_t)(T * rows_of[i]) * 4)) same[k] = 0;
                    }
                }
            for (int k = 0; k < nv; k++)
                printf("%3d %5d | %8.1f %8.1f %8.1f | %s\n", T, vl[k], t[k][0], t[k][1], t[k][2],
                       k ? (same[k] ? "identical" : "DIFFER") : "reference");
            fflush(stdout);
        }
        if (xpv) {
            pt_cuda_tc_drift(-1);
            pt_cuda_tc_xl(-1);
            pt_cuda_tc_wg(-1);
            pt_cuda_tc_wg_refill(-1);
            pt_cuda_tc_wg_unroll(-1);
        } else pt_cuda_tc_loop(vl[0]);
        return 0;
    }
    static const int cfg[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
    for (int ti = 0; ti < 5; ti++) {
        const int T = Ts[ti];
        for (int k = 0; k < 4; k++) {
            pt_cuda_tc_multi(cfg[k][0]);
            pt_cuda_tc_xpre(cfg[k][1]);
            double t[3];
            for (int what = 0; what < 3; what++) t[what] = time_graph(&s, T, what);
            /* outputs of the last copy's pass, against the first configuration */
            int same = 1;
            for (int i = 0; i < NW; i++) {
                if (be->ops->download(be, k ? out : ref[i], s.y[i], (size_t)(T * rows_of[i]) * 4) != PT_OK)
                    DIE("download");
                if (k && memcmp(out, ref[i], (size_t)(T * rows_of[i]) * 4)) same = 0;
            }
            printf("%3d %5d %4d | %8.1f %8.1f %8.1f | %s\n", T, cfg[k][0], cfg[k][1], t[0], t[1], t[2],
                   k ? (same ? "identical" : "DIFFER") : "reference");
            fflush(stdout);
        }
    }
    pt_cuda_tc_multi(1);
    pt_cuda_tc_xpre(1);
    return 0;
}
