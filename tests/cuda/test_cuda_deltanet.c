/* The Gated DeltaNet ops on CUDA (src/backend/cuda/deltanet.cu) against the
 * CPU backend on the same random inputs, in f32 and bf16 activation modes:
 * conv1d_silu (kernel sizes 1..7, its rolling state carried across calls),
 * delta_rule (the recurrence and the chunked prefill form, odd head dims,
 * GQA-like head ratios, a prefill followed by decode steps on one state),
 * rms_norm_gated, copy_rows and sigmoid_mul. Outputs and updated states
 * must agree within atol + rtol·|cpu|; any NaN fails.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU every test reports SKIP. */
#include "op_check.h"

static void test_conv1d_silu(void) {
    NEED_GPU();
    static const struct { int64_t C; int K; int T1, T2; pt_ftype wt; } cs[] = {
        {77, 4, 9, 1, PT_FT_BF16}, {1000, 4, 64, 1, PT_FT_BF16}, {33, 1, 5, 2, PT_FT_F32},
        {130, 3, 1, 1, PT_FT_F32}, {96, 7, 33, 3, PT_FT_BF16},
    };
    for (int a = 0; a < 2; a++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            pt_backend *G = G_[a], *C = C_[a];
            const int64_t Cc = cs[ci].C, T = cs[ci].T1 + cs[ci].T2;
            const int K = cs[ci].K;
            float *x = malloc(T * Cc * 4), *yc = malloc(T * Cc * 4), *yg = malloc(T * Cc * 4);
            float *st = malloc((K + 1) * Cc * 4), *stg = malloc((K + 1) * Cc * 4), *w = malloc(Cc * K * 4);
            uint16_t *wb = malloc(Cc * K * 2);
            fill_act(x, T * Cc, -3, 3, a);
            fill_act(st, (K - 1) * Cc + 1, -3, 3, a);
            for (int64_t i = 0; i < Cc * K; i++) {
                w[i] = pt_round_bf16(rf(-1, 1));
                wb[i] = pt_f32_to_bf16(w[i]);
            }
            const void *wh = cs[ci].wt == PT_FT_BF16 ? (const void *)wb : (const void *)w;
            const size_t wbytes = (size_t)(Cc * K) * (cs[ci].wt == PT_FT_BF16 ? 2 : 4);
            float *xd = put(G, x, T * Cc * 4), *yd = put(G, NULL, T * Cc * 4), *sd = put(G, st, ((K - 1) * Cc + 1) * 4);
            void *wd = put(G, wh, wbytes);
            pt_status s = PT_OK;
            /* two calls: a prefill chunk, then decode steps continuing from the state */
            for (int part = 0; part < 2; part++) {
                const int64_t t0 = part ? cs[ci].T1 : 0, n = part ? cs[ci].T2 : cs[ci].T1;
                C->ops->conv1d_silu(C, yc + t0 * Cc, x + t0 * Cc, n, Cc, K, wh, cs[ci].wt, st);
                if (s == PT_OK) s = G->ops->conv1d_silu(G, yd + t0 * Cc, xd + t0 * Cc, n, Cc, K, wd, cs[ci].wt, sd);
            }
            if (s == PT_OK) s = G->ops->download(G, yg, yd, T * Cc * 4);
            if (s == PT_OK) s = G->ops->download(G, stg, sd, ((K - 1) * Cc + 1) * 4);
            CHECK(s == PT_OK, "cuda conv1d_silu: %s", pt_last_error());
            char what[96];
            snprintf(what, sizeof what, "conv1d_silu act=%d C=%lld K=%d T=%d+%d", a, (long long)Cc, K, cs[ci].T1,
                     cs[ci].T2);
            int ok = s == PT_OK && compare(what, yg, yc, T * Cc, a ? 1e-2 : 1e-6, a ? 1e-2 : 1e-5) &&
                     compare("conv1d_silu state", stg, st, (K - 1) * Cc + 1, 0, 0);
            G->ops->dealloc(G, xd), G->ops->dealloc(G, yd), G->ops->dealloc(G, sd), G->ops->dealloc(G, wd);
            free(x), free(yc), free(yg), free(st), free(stg), free(w), free(wb);
            if (!ok) return;
        }
    REPORT();
}

typedef struct {
    int Hk, Hv, Dk, Dv;
    int T, chunk; /* a first call of T tokens with this chunk setting */
    int dec;      /* then this many decode steps (chunk 0) */
} dcase;

static int run_delta(int a, const dcase *c) {
    pt_backend *G = G_[a], *C = C_[a];
    const int Tt = c->T + c->dec;
    const int64_t ld = 2 * (int64_t)c->Hk * c->Dk + (int64_t)c->Hv * c->Dv, on = (int64_t)c->Hv * c->Dv;
    const int64_t sn = (int64_t)c->Hv * c->Dk * c->Dv;
    float *qkv = malloc(Tt * ld * 4), *b = malloc(Tt * c->Hv * 4), *av = malloc(Tt * c->Hv * 4);
    float *oc = malloc(Tt * on * 4), *og = malloc(Tt * on * 4), *st = malloc(sn * 4), *stg = malloc(sn * 4);
    float Al[64], dtb[64];
    fill_act(qkv, Tt * ld, -1, 1, a);
    fill_act(b, Tt * c->Hv, -3, 3, a);
    fill_act(av, Tt * c->Hv, -3, 3, a);
    for (int64_t i = 0; i < sn; i++) st[i] = rf(-0.3f, 0.3f);
    for (int h = 0; h < c->Hv; h++) Al[h] = rf(-1, 1.5f), dtb[h] = rf(-1, 1);
    float *qd = put(G, qkv, Tt * ld * 4), *bd = put(G, b, Tt * c->Hv * 4), *ad = put(G, av, Tt * c->Hv * 4);
    float *od = put(G, NULL, Tt * on * 4), *sd = put(G, st, sn * 4);
    float *Ald = put(G, Al, c->Hv * 4), *dtd = put(G, dtb, c->Hv * 4);
    pt_delta pc = {c->Hk, c->Hv, c->Dk, c->Dv, 1.0f / sqrtf((float)c->Dk), Al, dtb, c->chunk};
    pt_delta pg = pc;
    pg.A_log = Ald, pg.dt_bias = dtd;
    pt_status s = C->ops->delta_rule(C, oc, qkv, b, av, c->T, st, &pc);
    CHECK(s == PT_OK, "cpu delta_rule: %s", pt_last_error());
    pt_status t = G->ops->delta_rule(G, od, qd, bd, ad, c->T, sd, &pg);
    pc.chunk = pg.chunk = 0;
    for (int i = 0; i < c->dec; i++) {
        const int64_t r = c->T + i;
        C->ops->delta_rule(C, oc + r * on, qkv + r * ld, b + r * c->Hv, av + r * c->Hv, 1, st, &pc);
        if (t == PT_OK) t = G->ops->delta_rule(G, od + r * on, qd + r * ld, bd + r * c->Hv, ad + r * c->Hv, 1, sd, &pg);
    }
    if (t == PT_OK) t = G->ops->download(G, og, od, Tt * on * 4);
    if (t == PT_OK) t = G->ops->download(G, stg, sd, sn * 4);
    CHECK(t == PT_OK, "cuda delta_rule: %s", pt_last_error());
    char what[128];
    snprintf(what, sizeof what, "delta_rule act=%d Hk=%d Hv=%d Dk=%d Dv=%d T=%d chunk=%d dec=%d", a, c->Hk, c->Hv,
             c->Dk, c->Dv, c->T, c->chunk, c->dec);
    int ok = s == PT_OK && t == PT_OK && compare(what, og, oc, Tt * on, a ? 2e-2 : 1e-5, a ? 2e-2 : 1e-4);
    if (ok) {
        char w2[160];
        snprintf(w2, sizeof w2, "%s (state)", what);
        ok = compare(w2, stg, st, sn, a ? 2e-2 : 1e-5, a ? 2e-2 : 1e-4);
    }
    G->ops->dealloc(G, qd), G->ops->dealloc(G, bd), G->ops->dealloc(G, ad), G->ops->dealloc(G, od);
    G->ops->dealloc(G, sd), G->ops->dealloc(G, Ald), G->ops->dealloc(G, dtd);
    free(qkv), free(b), free(av), free(oc), free(og), free(st), free(stg);
    return ok;
}

static void test_delta_rule(void) {
    NEED_GPU();
    static const dcase cs[] = {
        {2, 4, 16, 16, 1, 0, 3},      /* decode only (the fixture's dims) */
        {2, 4, 16, 16, 12, 64, 2},    /* a short prefill (one partial chunk), then decode */
        {1, 3, 32, 48, 150, 64, 1},   /* three chunks, the last partial; Dv != Dk */
        {2, 2, 100, 72, 40, 16, 0},   /* odd dims, a chunk of 16 */
        {2, 4, 128, 128, 130, 64, 2}, /* the real head dims (128/128) */
        {1, 2, 24, 200, 9, 0, 0},     /* the recurrence over several tokens; Dv over two column tiles */
    };
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            if (!run_delta(a, &cs[i])) return;
    REPORT();
}

static void test_norm_gated_copy_sigmoid(void) {
    NEED_GPU();
    for (int a = 0; a < 2; a++) {
        pt_backend *G = G_[a], *C = C_[a];
        static const int64_t Ds[] = {16, 128, 1000};
        for (int di = 0; di < 3; di++) {
            const int64_t R = 7, D = Ds[di], n = R * D;
            float *x = malloc(n * 4), *z = malloc(n * 4), *yc = malloc(n * 4), *yg = malloc(n * 4);
            uint16_t *w = malloc(D * 2);
            fill_act(x, n, -3, 3, a);
            fill_act(z, n, -4, 4, a);
            for (int64_t i = 0; i < D; i++) w[i] = pt_f32_to_bf16(rf(-1.5f, 1.5f));
            float *xd = put(G, x, n * 4), *zd = put(G, z, n * 4);
            void *wd = put(G, w, D * 2);
            C->ops->rms_norm_gated(C, yc, x, z, R, D, w, PT_FT_BF16, 1e-6f);
            pt_status s = G->ops->rms_norm_gated(G, xd, xd, zd, R, D, wd, PT_FT_BF16, 1e-6f); /* y aliases x */
            if (s == PT_OK) s = G->ops->download(G, yg, xd, n * 4);
            CHECK(s == PT_OK, "cuda rms_norm_gated: %s", pt_last_error());
            char what[64];
            snprintf(what, sizeof what, "rms_norm_gated act=%d D=%lld", a, (long long)D);
            int ok = s == PT_OK && compare(what, yg, yc, n, a ? 1e-2 : 1e-6, a ? 1e-2 : 1e-5);
            /* sigmoid_mul over the same arrays, in place on the GPU */
            G->ops->upload(G, xd, x, n * 4);
            C->ops->sigmoid_mul(C, yc, x, z, n);
            s = G->ops->sigmoid_mul(G, xd, xd, zd, n);
            if (s == PT_OK) s = G->ops->download(G, yg, xd, n * 4);
            CHECK(s == PT_OK, "cuda sigmoid_mul: %s", pt_last_error());
            snprintf(what, sizeof what, "sigmoid_mul act=%d n=%lld", a, (long long)n);
            ok = ok && s == PT_OK && compare(what, yg, yc, n, 0, a ? 1e-2 : 1e-6);
            /* copy_rows: rows of 33 out of rows of 70 into rows of 40 (exact) */
            const int64_t rows = n / 70 < 9 ? n / 70 : 9;
            if (rows > 0) {
                float *dd = put(G, NULL, rows * 40 * 4), *dh = malloc(rows * 40 * 4), *dc = calloc(rows * 40, 4);
                C->ops->copy_rows(C, dc, 40, x + 3, 70, rows, 33);
                G->ops->upload(G, xd, x, n * 4);
                s = G->ops->copy_rows(G, dd, 40, xd + 3, 70, rows, 33);
                if (s == PT_OK) s = G->ops->download(G, dh, dd, rows * 40 * 4);
                CHECK(s == PT_OK && !memcmp(dh, dc, rows * 40 * 4), "copy_rows: %s", s ? pt_last_error() : "differs");
                G->ops->dealloc(G, dd);
                free(dh), free(dc);
            }
            G->ops->dealloc(G, xd), G->ops->dealloc(G, zd), G->ops->dealloc(G, wd);
            free(x), free(z), free(yc), free(yg), free(w);
            if (!ok) return;
        }
    }
    REPORT();
}

int main(void) {
    TEST_RUN(test_conv1d_silu);
    TEST_RUN(test_delta_rule);
    TEST_RUN(test_norm_gated_copy_sigmoid);
    teardown();
    return test_summary();
}
