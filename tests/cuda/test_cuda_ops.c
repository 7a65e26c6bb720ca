/* Every CUDA op (src/backend/cuda/) against the CPU backend as the
 * reference: the same random inputs go through both op tables, in f32 and
 * bf16 activation modes, over several shapes including odd sizes, every
 * quantization width and group size, both matmul paths (GEMV for T <= 8,
 * dequantize + cuBLAS above). Per element: |gpu - cpu| <= atol + rtol·|cpu|
 * with atol a fraction of the reference's largest magnitude; any NaN fails.
 * The widest gap each op showed is printed as a MEASURE line.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU every test reports SKIP. */
#define OP_CHECK_SEED 0x2545f4914f6cdd1dull
#include "op_check.h"

#include "mini_decode.h"

static void ft_set(pt_ftype t, void *p, int64_t i, float v) {
    if (t == PT_FT_F32) ((float *)p)[i] = v;
    else if (t == PT_FT_BF16) ((uint16_t *)p)[i] = pt_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = pt_f32_to_f16(v);
}

/* ---- a random weight: host arrays, one pt_matrix per backend ---- */

typedef struct {
    pt_matrix w[2]; /* [0]: CPU, [1]: CUDA (backend_data differs) */
    void *data, *scales, *biases, *bias;
} tw;

static void tw_make(tw *t, int64_t E, int64_t N, int64_t K, pt_ftype dt, int bits, int gs, int with_bias) {
    memset(t, 0, sizeof *t);
    int64_t EE = E > 0 ? E : 1;
    pt_matrix m = {.rows = N, .cols = K, .n_experts = E, .dtype = dt, .bits = bits, .group_size = gs};
    if (!bits) {
        t->data = calloc((size_t)(EE * N * K), 4);
        for (int64_t i = 0; i < EE * N * K; i++) ft_set(dt, t->data, i, rf(-1, 1));
    } else {
        int64_t ng = K / gs;
        t->data = calloc((size_t)(EE * N * K * bits / 8) + 16, 1);
        for (int64_t i = 0; i < EE * N * K * bits / 32; i++) ((uint32_t *)t->data)[i] = ru32() ^ (ru32() << 21);
        t->scales = calloc((size_t)(EE * N * ng), 4);
        t->biases = calloc((size_t)(EE * N * ng), 4);
        for (int64_t i = 0; i < EE * N * ng; i++) {
            ft_set(dt, t->scales, i, rf(-0.1f, 0.1f));
            ft_set(dt, t->biases, i, rf(-0.5f, 0.5f));
        }
        m.scales = t->scales;
        m.biases = t->biases;
    }
    m.data = t->data;
    if (with_bias) {
        t->bias = calloc((size_t)(EE * N), 2);
        for (int64_t i = 0; i < EE * N; i++) ft_set(PT_FT_BF16, t->bias, i, rf(-1, 1));
        m.bias = t->bias;
        m.bias_dtype = PT_FT_BF16;
    }
    t->w[0] = t->w[1] = m;
}
static int tw_prepare(tw *t, int a) {
    pt_status s = C_[a]->ops->prepare_weight(C_[a], &t->w[0], "w");
    if (s == PT_OK) s = G_[a]->ops->prepare_weight(G_[a], &t->w[1], "w");
    CHECK(s == PT_OK, "prepare_weight: %s", pt_last_error());
    return s == PT_OK;
}
static void tw_release(tw *t, int a) {
    C_[a]->ops->release_weight(C_[a], &t->w[0]);
    G_[a]->ops->release_weight(G_[a], &t->w[1]);
}
static void tw_free(tw *t) {
    free(t->data);
    free(t->scales);
    free(t->biases);
    free(t->bias);
}

/* ---- matmul ---- */

static int run_matmul(int a, int64_t E, int64_t N, int64_t K, int64_t T, pt_ftype dt, int bits, int gs, int bias) {
    pt_backend *G = G_[a], *C = C_[a];
    tw t;
    tw_make(&t, E, N, K, dt, bits, gs, bias);
    int ok = tw_prepare(&t, a);
    float *x = malloc((size_t)(T * K) * 4), *yc = malloc((size_t)(T * N) * 4), *yg = malloc((size_t)(T * N) * 4);
    fill_act(x, T * K, -1, 1, a);
    int64_t ex = E > 1 ? E - 1 : 0;
    float *xd = put(G, x, (size_t)(T * K) * 4), *yd = put(G, NULL, (size_t)(T * N) * 4);
    if (ok) {
        pt_status s = C->ops->matmul(C, yc, x, T, &t.w[0], ex);
        CHECK(s == PT_OK, "cpu matmul: %s", pt_last_error());
        s = G->ops->matmul(G, yd, xd, T, &t.w[1], ex);
        if (s == PT_OK) s = G->ops->download(G, yg, yd, (size_t)(T * N) * 4);
        CHECK(s == PT_OK, "cuda matmul: %s", pt_last_error());
        char what[160];
        snprintf(what, sizeof what, "matmul act=%s E=%lld N=%lld K=%lld T=%lld %s bits=%d gs=%d bias=%d",
                 a ? "bf16" : "f32", (long long)E, (long long)N, (long long)K, (long long)T, pt_ftype_name(dt), bits,
                 gs, bias);
        /* bf16: outputs are rounded (one bf16 step is 2^-8 relative) and the
         * cuBLAS path multiplies bf16-rounded dequantized weights. */
        ok = s == PT_OK && compare(what, yg, yc, T * N, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-4);
    }
    G->ops->dealloc(G, xd);
    G->ops->dealloc(G, yd);
    tw_release(&t, a);
    tw_free(&t);
    free(x);
    free(yc);
    free(yg);
    return ok;
}

static void test_matmul_quantized(void) {
    NEED_GPU();
    static const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    static const int64_t Ts[] = {1, 3, 8, 13};
    for (int a = 0; a < 2; a++)
        for (int bi = 0; bi < 6; bi++)
            for (int gi = 0; gi < 3; gi++)
                for (int ti = 0; ti < 4; ti++)
                    if (!run_matmul(a, 0, 37 + 8 * ti, 256 + gss[gi] * (ti + 1), Ts[ti], PT_FT_BF16, bits[bi], gss[gi],
                                    ti == 2))
                        return;
    /* f16 and f32 scales, an expert stack, a wide row */
    for (int a = 0; a < 2; a++) {
        if (!run_matmul(a, 0, 64, 512, 2, PT_FT_F16, 4, 64, 1)) return;
        if (!run_matmul(a, 0, 33, 256, 20, PT_FT_F32, 8, 32, 0)) return;
        if (!run_matmul(a, 3, 96, 1024, 1, PT_FT_BF16, 4, 64, 1)) return;
        if (!run_matmul(a, 3, 96, 1024, 17, PT_FT_BF16, 4, 64, 1)) return;
        if (!run_matmul(a, 0, 300, 4096, 1, PT_FT_BF16, 4, 128, 0)) return;
        if (!run_matmul(a, 0, 300, 4096, 64, PT_FT_BF16, 8, 64, 0)) return;
        /* past the GEMV's 64 rows: dequantize from the tensor-core layout + cuBLAS */
        if (!run_matmul(a, 0, 300, 1024, 80, PT_FT_BF16, 4, 64, 1)) return;
        if (!run_matmul(a, 3, 40, 512, 96, PT_FT_BF16, 8, 32, 0)) return;
    }
    REPORT();
}

static void test_matmul_dense(void) {
    NEED_GPU();
    static const pt_ftype dts[] = {PT_FT_BF16, PT_FT_F16, PT_FT_F32};
    for (int a = 0; a < 2; a++)
        for (int di = 0; di < 3; di++) {
            if (!run_matmul(a, 0, 37, 67, 1, dts[di], 0, 0, 0)) return;   /* odd K: scalar loads */
            if (!run_matmul(a, 0, 64, 256, 4, dts[di], 0, 0, 1)) return;  /* 16-byte loads */
            if (!run_matmul(a, 0, 45, 200, 7, dts[di], 0, 0, 0)) return;
            if (!run_matmul(a, 0, 45, 200, 31, dts[di], 0, 0, 1)) return; /* cuBLAS */
            if (!run_matmul(a, 2, 19, 96, 9, dts[di], 0, 0, 0)) return;
        }
    REPORT();
}

static void test_prepare_rejects(void) {
    NEED_GPU();
    tw t;
    tw_make(&t, 0, 8, 96, PT_FT_BF16, 4, 32, 0);
    t.w[1].group_size = 48;
    CHECK(G_[0]->ops->prepare_weight(G_[0], &t.w[1], "odd") == PT_ERR_UNSUPPORTED, "group size 48 accepted");
    CHECK(strstr(pt_last_error(), "odd") && strstr(pt_last_error(), "48"), "message: %s", pt_last_error());
    t.w[1].group_size = 32;
    t.w[1].bits = 7;
    CHECK(G_[0]->ops->prepare_weight(G_[0], &t.w[1], "seven") == PT_ERR_UNSUPPORTED, "7 bits accepted");
    tw_free(&t);
    /* A CUDA failure is a petrel error naming the call and the code. */
    void *p = G_[0]->ops->alloc(G_[0], (size_t)1 << 50);
    CHECK(p == NULL, "a petabyte allocation succeeded");
    CHECK(strstr(pt_last_error(), "cudaMalloc") && strstr(pt_last_error(), "code"), "message: %s", pt_last_error());
}

/* ---- embed ---- */

static void test_embed(void) {
    NEED_GPU();
    for (int a = 0; a < 2; a++)
        for (int kind = 0; kind < 4; kind++) {
            static const int kb[] = {0, 4, 8, 3};
            int64_t V = 50, H = 128, T = 6;
            tw t;
            tw_make(&t, 0, V, H, PT_FT_BF16, kb[kind], kb[kind] ? 32 << (kind % 3) : 0, 0);
            if (!tw_prepare(&t, a)) return;
            int32_t ids[6] = {0, 49, 7, 7, 23, 1};
            float yc[6 * 128], yg[6 * 128];
            float scale = kind == 2 ? pt_round_bf16(11.3137f) : 1.0f;
            pt_backend *G = G_[a], *C = C_[a];
            CHECK(C->ops->embed(C, yc, ids, (int)T, &t.w[0], scale) == PT_OK, "cpu embed");
            int32_t *idd = put(G, ids, sizeof ids);
            float *yd = put(G, NULL, sizeof yg);
            pt_status s = G->ops->embed(G, yd, idd, (int)T, &t.w[1], scale);
            if (s == PT_OK) s = G->ops->download(G, yg, yd, sizeof yg);
            CHECK(s == PT_OK, "cuda embed: %s", pt_last_error());
            char what[64];
            snprintf(what, sizeof what, "embed act=%d bits=%d", a, kb[kind]);
            compare(what, yg, yc, T * H, 0, 0); /* exact: same arithmetic */
            ids[3] = 50;
            G->ops->upload(G, idd, ids, sizeof ids);
            s = G->ops->embed(G, yd, idd, (int)T, &t.w[1], scale);
            CHECK(s == PT_ERR_RANGE, "id 50 of 50 gave %s", pt_status_name(s));
            CHECK(strstr(pt_last_error(), "50") != NULL, "message: %s", pt_last_error());
            CHECK(G->ops->sync(G) == PT_OK, "error word cleared: %s", pt_last_error());
            G->ops->dealloc(G, idd);
            G->ops->dealloc(G, yd);
            tw_release(&t, a);
            tw_free(&t);
        }
    REPORT();
}

/* ---- rms_norm ---- */

static void test_rms_norm(void) {
    NEED_GPU();
    static const int64_t Ds[] = {67, 128, 2051, 4096};
    for (int a = 0; a < 2; a++)
        for (int st = 0; st < 4; st++)
            for (int di = 0; di < 4; di++)
                for (int res = 0; res < 2; res++) {
                    pt_backend *G = G_[a], *C = C_[a];
                    int64_t T = 5, D = Ds[di], n = T * D;
                    float *x = malloc(n * 4), *r = malloc(n * 4), *rc = malloc(n * 4), *yc = malloc(n * 4),
                          *yg = malloc(n * 4), *rg = malloc(n * 4);
                    uint16_t *w = malloc(D * 2);
                    fill_act(x, n, -3, 3, a);
                    fill_act(r, n, -3, 3, a);
                    memcpy(rc, r, n * 4);
                    for (int64_t i = 0; i < D; i++) w[i] = pt_f32_to_bf16(rf(-1.5f, 1.5f));
                    float *xd = put(G, x, n * 4), *rd = put(G, r, n * 4), *wd = put(G, w, D * 2);
                    /* y aliases x on the GPU side: allowed by the contract */
                    C->ops->rms_norm(C, yc, x, res ? rc : NULL, T, D, w, PT_FT_BF16, (pt_rms_style)st, 1e-6f);
                    pt_status s = G->ops->rms_norm(G, xd, xd, res ? rd : NULL, T, D, wd, PT_FT_BF16,
                                                   (pt_rms_style)st, 1e-6f);
                    if (s == PT_OK) s = G->ops->download(G, yg, xd, n * 4);
                    if (s == PT_OK) s = G->ops->download(G, rg, rd, n * 4);
                    CHECK(s == PT_OK, "cuda rms_norm: %s", pt_last_error());
                    char what[64];
                    snprintf(what, sizeof what, "rms_norm act=%d style=%d D=%lld res=%d", a, st, (long long)D, res);
                    int ok = compare(what, yg, yc, n, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-5);
                    if (res) ok = ok && compare("residual", rg, rc, n, 0, 0);
                    G->ops->dealloc(G, xd);
                    G->ops->dealloc(G, rd);
                    G->ops->dealloc(G, wd);
                    free(x), free(r), free(rc), free(yc), free(yg), free(rg), free(w);
                    if (!ok) return;
                }
    REPORT();
}

/* rms_norm2 (the per-head q and k norms in one launch): the bits of two
 * rms_norm calls, each set with its own weight (so a set normalized with
 * the other's weight fails); the strided kernel's row lengths are left to
 * the two calls (PT_ERR_UNSUPPORTED). */
static void test_rms_norm2(void) {
    NEED_GPU();
    static const int64_t Ds[] = {64, 67, 128, 256, 2051, 70000};
    for (int a = 0; a < 2; a++)
        for (int st = 0; st < 4; st++)
            for (int di = 0; di < 6; di++) {
                pt_backend *G = G_[a];
                const int64_t T1 = 7, T2 = 3, D = Ds[di], n1 = T1 * D, n2 = T2 * D;
                float *x1 = malloc(n1 * 4), *x2 = malloc(n2 * 4), *y[4];
                for (int i = 0; i < 4; i++) y[i] = malloc((i % 2 ? n2 : n1) * 4);
                uint16_t *w1 = malloc(D * 2), *w2 = malloc(D * 2);
                fill_act(x1, n1, -3, 3, a);
                fill_act(x2, n2, -2, 2, a);
                for (int64_t i = 0; i < D; i++) /* two different weights: each set must take its own */
                    w1[i] = pt_f32_to_bf16(rf(-1.5f, 1.5f)), w2[i] = pt_f32_to_bf16(rf(0.5f, 2.f));
                float *d1 = put(G, x1, n1 * 4), *d2 = put(G, x2, n2 * 4);
                uint16_t *wd1 = put(G, w1, D * 2), *wd2 = put(G, w2, D * 2);
                const pt_rms_style sty = (pt_rms_style)st;
                pt_status s = G->ops->rms_norm(G, d1, d1, NULL, T1, D, wd1, PT_FT_BF16, sty, 1e-6f);
                if (s == PT_OK) s = G->ops->rms_norm(G, d2, d2, NULL, T2, D, wd2, PT_FT_BF16, sty, 1e-6f);
                if (s == PT_OK) s = G->ops->download(G, y[0], d1, n1 * 4);
                if (s == PT_OK) s = G->ops->download(G, y[1], d2, n2 * 4);
                if (s == PT_OK) s = G->ops->upload(G, d1, x1, n1 * 4);
                if (s == PT_OK) s = G->ops->upload(G, d2, x2, n2 * 4);
                CHECK(s == PT_OK, "cuda rms_norm: %s", pt_last_error());
                pt_status s2 = G->ops->rms_norm2(G, d1, T1, wd1, d2, T2, wd2, D, PT_FT_BF16, sty, 1e-6f);
                const int strided = D > 16384;
                CHECK(s2 == (strided ? PT_ERR_UNSUPPORTED : PT_OK), "rms_norm2 D=%lld: status %d", (long long)D, s2);
                if (s2 == PT_OK) {
                    s = G->ops->download(G, y[2], d1, n1 * 4);
                    if (s == PT_OK) s = G->ops->download(G, y[3], d2, n2 * 4);
                    CHECK(s == PT_OK, "download: %s", pt_last_error());
                    CHECK(memcmp(y[0], y[2], n1 * 4) == 0 && memcmp(y[1], y[3], n2 * 4) == 0,
                          "rms_norm2 act=%d style=%d D=%lld: not the bits of two rms_norm calls", a, st, (long long)D);
                }
                G->ops->dealloc(G, d1), G->ops->dealloc(G, d2), G->ops->dealloc(G, wd1), G->ops->dealloc(G, wd2);
                free(x1), free(x2), free(w1), free(w2);
                for (int i = 0; i < 4; i++) free(y[i]);
            }
    REPORT();
}

/* ---- rope ---- */

static void test_rope(void) {
    NEED_GPU();
    static const struct { int nh, hd, rot; float base, scale; int p0; } cs[] = {
        {4, 64, 64, 10000, 1, 0}, {3, 128, 128, 500000, 1, 9000}, {2, 256, 64, 10000, 1.2f, 130000}, {5, 80, 40, 1e6f, 1, 7}};
    for (int a = 0; a < 2; a++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            pt_backend *G = G_[a], *C = C_[a];
            int64_t T = 6, n = T * cs[ci].nh * cs[ci].hd;
            int half = cs[ci].rot / 2;
            float *x = malloc(n * 4), *yg = malloc(n * 4), inv[128];
            int32_t pos[6];
            for (int i = 0; i < half; i++) inv[i] = powf(cs[ci].base, -2.0f * i / cs[ci].rot);
            for (int t = 0; t < T; t++) pos[t] = cs[ci].p0 + t;
            fill_act(x, n, -2, 2, a);
            float *xd = put(G, x, n * 4), *invd = put(G, inv, half * 4);
            int32_t *pd = put(G, pos, sizeof pos);
            pt_rope rc = {cs[ci].rot, inv, cs[ci].scale}, rg = {cs[ci].rot, invd, cs[ci].scale};
            C->ops->rope(C, x, T, cs[ci].nh, cs[ci].hd, pos, &rc);
            pt_status s = G->ops->rope(G, xd, T, cs[ci].nh, cs[ci].hd, pd, &rg);
            if (s == PT_OK) s = G->ops->download(G, yg, xd, n * 4);
            CHECK(s == PT_OK, "cuda rope: %s", pt_last_error());
            char what[64];
            snprintf(what, sizeof what, "rope act=%d case=%zu", a, ci);
            int ok = compare(what, yg, x, n, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-5);
            G->ops->dealloc(G, xd), G->ops->dealloc(G, invd), G->ops->dealloc(G, pd);
            free(x), free(yg);
            if (!ok) return;
        }
    REPORT();
}

/* ---- kv_append + attention (op_check.h attn_check) ---- */

static void test_attention(void) {
    NEED_GPU();
    static const acase cs[] = {
        {4, 4, 64, 64, 0, 7, 0, 0, PT_FT_F32},          /* prefill from 0, MHA */
        {8, 2, 128, 300, 250, 1, 0, 0, PT_FT_BF16},     /* decode, GQA 4 */
        {8, 2, 128, 300, 37, 13, 0, 0, PT_FT_BF16},     /* second prefill chunk */
        {6, 3, 80, 100, 60, 5, 16, 0, PT_FT_BF16},      /* sliding window, head_dim 80 */
        {4, 1, 256, 64, 150, 4, 32, 50.0f, PT_FT_BF16}, /* rotating cache, soft-cap, head_dim 256 */
        {2, 2, 96, 40, 5, 9, 0, 30.0f, PT_FT_F32},
        {16, 8, 64, 3000, 2900, 1, 0, 0, PT_FT_BF16},   /* long decode: split over the sequence */
        {6, 3, 80, 100, 60, 1, 16, 0, PT_FT_BF16},      /* split decode: window, head_dim 80 */
        {4, 1, 256, 64, 150, 1, 32, 50.0f, PT_FT_BF16}, /* split decode: ring, soft-cap, GQA 4, hd 256 */
        {16, 2, 128, 4000, 3999, 1, 0, 0, PT_FT_F32},   /* split decode: GQA 8, f32 cache */
        {16, 1, 64, 500, 10, 1, 0, 0, PT_FT_BF16},      /* GQA 16: the one-block-per-head kernel */
    };
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            if (!attn_check(a, &cs[i], "attention", 1.f, ATTN_CACHE)) return;
    REPORT();
}

/* ---- glu and elementwise ---- */

static void test_glu_elementwise(void) {
    NEED_GPU();
    for (int a = 0; a < 2; a++) {
        pt_backend *G = G_[a], *C = C_[a];
        int64_t T = 3, F = 1001, ld = 2 * F, n = T * ld;
        float *gu = malloc(n * 4), *yc = malloc(n * 4), *yg = malloc(n * 4), *b = malloc(n * 4);
        fill_act(gu, n, -6, 6, a);
        fill_act(b, n, -3, 3, a);
        float *gd = put(G, gu, n * 4), *yd = put(G, NULL, n * 4), *bd = put(G, b, n * 4);
        for (int fn = 0; fn < 2; fn++) {
            C->ops->glu(C, yc, gu, gu + F, T, F, ld, (pt_glu_kind)fn);
            pt_status s = G->ops->glu(G, yd, gd, gd + F, T, F, ld, (pt_glu_kind)fn);
            if (s == PT_OK) s = G->ops->download(G, yg, yd, T * F * 4);
            CHECK(s == PT_OK, "glu: %s", pt_last_error());
            char what[32];
            snprintf(what, sizeof what, "glu act=%d fn=%d", a, fn);
            if (!compare(what, yg, yc, T * F, 1e-6, a ? 1e-2 : 1e-5)) return;
        }
        for (int op = 0; op < 5; op++) {
            const pt_backend_ops *c = C->ops, *g = G->ops;
            pt_status s = PT_OK;
            switch (op) {
            case 0: c->add(C, yc, gu, b, n); s = g->add(G, yd, gd, bd, n); break;
            case 1: c->mul(C, yc, gu, b, n); s = g->mul(G, yd, gd, bd, n); break;
            case 2: c->add_scaled(C, yc, gu, b, 0.37f, n); s = g->add_scaled(G, yd, gd, bd, 0.37f, n); break;
            case 3: c->scale(C, yc, gu, 1.7f, n); s = g->scale(G, yd, gd, 1.7f, n); break;
            case 4: c->softcap(C, yc, gu, 5.0f, n); s = g->softcap(G, yd, gd, 5.0f, n); break;
            }
            if (s == PT_OK) s = g->download(G, yg, yd, n * 4);
            CHECK(s == PT_OK, "elementwise %d: %s", op, pt_last_error());
            char what[32];
            snprintf(what, sizeof what, "elementwise act=%d op=%d", a, op);
            /* add/mul/scale are exact; tanh may differ by an ulp before rounding */
            if (!compare(what, yg, yc, n, 0, op == 4 ? (a ? 1e-2 : 1e-6) : 0)) return;
        }
        G->ops->dealloc(G, gd), G->ops->dealloc(G, yd), G->ops->dealloc(G, bd);
        free(gu), free(yc), free(yg), free(b);
    }
    REPORT();
}

/* ---- MoE ---- */

static void test_moe(void) {
    NEED_GPU();
    for (int a = 0; a < 2; a++)
        for (int fused = 0; fused < 2; fused++) {
            pt_backend *G = G_[a], *C = C_[a];
            const int E = 7, k = 3;
            const int64_t H = 256, I = 96, T = 5;
            /* routing */
            float logits[5 * 7], wc[15], wg[15];
            int32_t ic[15], ig[15];
            fill_act(logits, T * E, -2, 2, a);
            logits[3] = logits[4]; /* a tie: the lower index wins */
            float pes[7];
            for (int e = 0; e < E; e++) pes[e] = rf(0.5f, 1.5f);
            float *ld = put(G, logits, sizeof logits), *pesd = put(G, pes, sizeof pes), *wd = put(G, NULL, sizeof wg);
            int32_t *idd = put(G, NULL, sizeof ig);
            pt_moe_route rc = {E, k, fused, fused ? pes : NULL}, rg = {E, k, fused, fused ? pesd : NULL};
            CHECK(C->ops->moe_route(C, ic, wc, logits, T, &rc) == PT_OK, "cpu route");
            pt_status s = G->ops->moe_route(G, idd, wd, ld, T, &rg);
            if (s == PT_OK) s = G->ops->download(G, ig, idd, sizeof ig);
            if (s == PT_OK) s = G->ops->download(G, wg, wd, sizeof wg);
            CHECK(s == PT_OK, "cuda moe_route: %s", pt_last_error());
            CHECK(memcmp(ic, ig, sizeof ic) == 0, "expert choice differs");
            if (!compare("moe_route weights", wg, wc, T * k, 1e-6, a ? 1e-2 : 1e-5)) return;
            /* experts */
            tw g, u, d;
            tw_make(&g, E, fused ? 2 * I : I, H, PT_FT_BF16, 4, 64, 0);
            if (!fused) tw_make(&u, E, I, H, PT_FT_BF16, 8, 32, 0);
            tw_make(&d, E, H, I, PT_FT_BF16, 4, 32, 0);
            if (!tw_prepare(&g, a) || (!fused && !tw_prepare(&u, a)) || !tw_prepare(&d, a)) return;
            float x[5 * 256], yc[5 * 256], yg[5 * 256];
            fill_act(x, T * H, -1, 1, a);
            float *xd = put(G, x, sizeof x), *yd = put(G, NULL, sizeof yg);
            s = C->ops->moe_ffn(C, yc, x, T, ic, wc, k, &g.w[0], fused ? NULL : &u.w[0], &d.w[0], PT_GLU_SILU);
            CHECK(s == PT_OK, "cpu moe_ffn: %s", pt_last_error());
            s = G->ops->moe_ffn(G, yd, xd, T, idd, wd, k, &g.w[1], fused ? NULL : &u.w[1], &d.w[1], PT_GLU_SILU);
            if (s == PT_OK) s = G->ops->download(G, yg, yd, sizeof yg);
            CHECK(s == PT_OK, "cuda moe_ffn: %s", pt_last_error());
            char what[48];
            snprintf(what, sizeof what, "moe_ffn act=%d fused=%d", a, fused);
            int ok = compare(what, yg, yc, T * H, a ? 2e-2 : 1e-5, a ? 2e-2 : 1e-4);
            /* an expert index outside the stack is an error, not a wild read */
            int32_t bad[15];
            memcpy(bad, ic, sizeof bad);
            bad[4] = 99;
            G->ops->upload(G, idd, bad, sizeof bad);
            s = G->ops->moe_ffn(G, yd, xd, T, idd, wd, k, &g.w[1], fused ? NULL : &u.w[1], &d.w[1], PT_GLU_SILU);
            if (s == PT_OK) s = G->ops->sync(G);
            CHECK(s == PT_ERR_RANGE && strstr(pt_last_error(), "99"), "bad expert: %s %s", pt_status_name(s),
                  pt_last_error());
            tw_release(&g, a), tw_release(&d, a), tw_free(&g), tw_free(&d);
            if (!fused) tw_release(&u, a), tw_free(&u);
            G->ops->dealloc(G, ld), G->ops->dealloc(G, pesd), G->ops->dealloc(G, wd), G->ops->dealloc(G, idd);
            G->ops->dealloc(G, xd), G->ops->dealloc(G, yd);
            if (!ok) return;
        }
    REPORT();
}

/* ---- argmax ---- */

static void test_argmax(void) {
    NEED_GPU();
    pt_backend *G = G_[0], *C = C_[0];
    const int64_t T = 4, V = 151937;
    float *x = malloc(T * V * 4);
    fill_act(x, T * V, -5, 5, 0);
    x[V + 77] = x[V + 90000] = 9.5f; /* tie: the first wins */
    for (int64_t i = 0; i < V; i++) x[2 * V + i] = NAN;
    x[3 * V + 5] = NAN;
    x[3 * V + 6] = 100.f;
    int32_t oc[4], og[4];
    C->ops->argmax(C, oc, x, T, V);
    float *xd = put(G, x, T * V * 4);
    int32_t *od = put(G, NULL, sizeof og);
    pt_status s = G->ops->argmax(G, od, xd, T, V);
    if (s == PT_OK) s = G->ops->download(G, og, od, sizeof og);
    CHECK(s == PT_OK, "argmax: %s", pt_last_error());
    for (int t = 0; t < T; t++) CHECK(oc[t] == og[t], "row %d: cpu %d cuda %d", t, oc[t], og[t]);
    CHECK(og[1] == 77 && og[2] == 0 && og[3] == 6, "rows: %d %d %d", og[1], og[2], og[3]);
    G->ops->dealloc(G, xd), G->ops->dealloc(G, od);
    free(x);
}

/* copy_rows_to: 70 rows (two launches) of an odd length through their own
 * pointers, every other source one float off 16-byte alignment (the
 * element path), each row landing exactly, nothing written past a row. */
static void test_copy_rows_to(void) {
    NEED_GPU();
    pt_backend *G = G_[0];
    REQUIRE(G->ops->copy_rows_to, "the CUDA backend has copy_rows_to");
    enum { R = 70 };
    const int64_t len = 1001, ld = 1024; /* rows ld apart in both buffers; the gap past len stays */
    float *src = malloc(sizeof(float) * R * ld), *back = malloc(sizeof(float) * R * ld);
    for (int64_t i = 0; i < R * ld; i++) src[i] = rf(-3, 3);
    float *sd = put(G, src, sizeof(float) * R * ld);
    float *dd = put(G, NULL, sizeof(float) * R * ld);
    float *zeros = calloc((size_t)(R * ld), sizeof(float));
    pt_status s = G->ops->upload(G, dd, zeros, sizeof(float) * R * ld);
    float *dst[R];
    const float *srcp[R];
    for (int r = 0; r < R; r++) /* row r of the source into slot R - 1 - r of the destination */
        dst[r] = dd + (int64_t)(R - 1 - r) * ld, srcp[r] = sd + (int64_t)r * ld + (r & 1);
    if (s == PT_OK) s = G->ops->copy_rows_to(G, dst, srcp, R, len);
    if (s == PT_OK) s = G->ops->download(G, back, dd, sizeof(float) * R * ld);
    CHECK(s == PT_OK, "copy_rows_to: %s", pt_last_error());
    int bad = 0;
    for (int r = 0; s == PT_OK && r < R; r++)
        for (int64_t i = 0; i < ld; i++) {
            const float want = i < len ? src[(int64_t)r * ld + (r & 1) + i] : 0.f;
            if (back[(int64_t)(R - 1 - r) * ld + i] != want) bad++;
        }
    CHECK(bad == 0, "%d elements wrong", bad);
    CHECK(G->ops->copy_rows_to(G, dst, srcp, -1, len) != PT_OK, "a negative row count is refused");
    G->ops->dealloc(G, sd), G->ops->dealloc(G, dd);
    free(src), free(back), free(zeros);
}

/* ---- uploads staged through pinned memory (backend.cu cuda_upload) ---- */

/* Small uploads return before the stream runs them, from a ring of pinned
 * memory that comes round many times here (~40 MB through a 1 MiB ring,
 * more uploads than the ring has fences) while long copies keep the stream
 * busy; the source is overwritten right after each call, some uploads go
 * to the same place (the later must win) and some are too large to stage
 * (synchronous). Every byte must arrive as it was when its call returned. */
static void test_upload_staged(void) {
    NEED_GPU();
    pt_backend *G = G_[1];
    enum { NU = 2500, NSLOT = 1000, SLOT = 72 * 1024, BIG = 300 * 1024, NS = 64 };
    const size_t total = (size_t)NSLOT * SLOT + BIG + 8;
    uint8_t *dev = put(G, NULL, total), *want = calloc(total, 1), *src = malloc(BIG), *back = malloc(total);
    const int64_t blen = 1 << 20; /* the busy work: NS rows of 4 MiB copied, now and then */
    float *bs = put(G, NULL, sizeof(float) * NS * blen), *bd = put(G, NULL, sizeof(float) * NS * blen);
    REQUIRE(dev && want && src && back && bs && bd, "buffers");
    float *dst[NS];
    const float *srcp[NS];
    for (int r = 0; r < NS; r++) dst[r] = bd + r * blen, srcp[r] = bs + r * blen;
    uint64_t z = 0x9e3779b97f4a7c15ull;
    pt_status st = PT_OK;
    for (int i = 0; i < NU && st == PT_OK; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        const int kind = (int)(z >> 60);                /* 0..15 */
        size_t n = kind < 6 ? 1 + (z >> 33) % 64 : 1 + (z >> 33) % SLOT;
        size_t off = (size_t)(i % NSLOT) * SLOT;         /* slots reused: later uploads win */
        if (kind == 15) n = BIG, off = (size_t)NSLOT * SLOT; /* past the staging limit: synchronous */
        off += (z >> 20) % 8;                            /* odd offsets */
        if (off + n > total) n = total - off;
        for (size_t k = 0; k < n; k++) src[k] = (uint8_t)(i * 131 + k * 7 + (k >> 8));
        st = G->ops->upload(G, dev + off, src, n);
        memcpy(want + off, src, n);
        memset(src, 0xA5, n); /* the call has returned: the source may change */
        if (st == PT_OK && i % 97 == 0) st = G->ops->copy_rows_to(G, dst, srcp, NS, blen);
    }
    CHECK(st == PT_OK, "upload: %s", pt_last_error());
    if (st == PT_OK) st = G->ops->download(G, back, dev, total);
    CHECK(st == PT_OK, "download: %s", pt_last_error());
    size_t bad = 0, first = 0;
    for (size_t k = 0; st == PT_OK && k < total; k++)
        if (back[k] != want[k] && !bad++) first = k;
    CHECK(bad == 0, "%zu bytes wrong, the first at %zu", bad, first);
    G->ops->dealloc(G, dev), G->ops->dealloc(G, bs), G->ops->dealloc(G, bd);
    free(want), free(src), free(back);
}

/* ---- compiled decode: a captured step replays bit-identically ---- */

static void test_graph_replay(void) {
    NEED_GPU();
    mini_shape sh = {2, 256, 4, 2, 64, 512, 1000, 4, 64, 64};
    for (int a = 0; a < 2; a++) {
        pt_backend *G = G_[a];
        mini_model m;
        pt_status st = mini_init(&m, G, &sh);
        REQUIRE(st == PT_OK, "mini model: %s", pt_last_error());
        enum { STEPS = 6 };
        float *eager = malloc((size_t)STEPS * sh.vocab * 4), *rep = malloc((size_t)sh.vocab * 4);
        int32_t eid[STEPS], gid;
        size_t kb = (size_t)sh.kv_heads * sh.ctx * sh.head_dim * 2;
        void *zeros = calloc(kb, 1);
        for (int pass = 0; pass < 2 && !test_failed_current; pass++) {
            for (int l = 0; l < sh.layers; l++) {
                G->ops->upload(G, m.kv[l].k, zeros, kb);
                G->ops->upload(G, m.kv[l].v, zeros, kb);
            }
            pt_cuda_graph *g = NULL;
            if (pass == 1) {
                REQUIRE(pt_cuda_graph_begin(G) == PT_OK, "begin: %s", pt_last_error());
                st = mini_step(&m);
                pt_status st2 = pt_cuda_graph_end(G, &g);
                REQUIRE(st == PT_OK && st2 == PT_OK, "capture: %s", pt_last_error());
            }
            for (int t = 0; t < STEPS; t++) {
                int32_t id = (t * 37 + 5) % sh.vocab, pos = t;
                G->ops->upload(G, m.id, &id, 4);
                G->ops->upload(G, m.pos, &pos, 4);
                st = pass ? pt_cuda_graph_launch(G, g) : mini_step(&m);
                if (st == PT_OK) st = G->ops->download(G, pass ? rep : eager + (size_t)t * sh.vocab, m.logits, (size_t)sh.vocab * 4);
                if (st == PT_OK) st = G->ops->download(G, pass ? &gid : &eid[t], m.out_id, 4);
                CHECK(st == PT_OK, "step %d pass %d: %s", t, pass, pt_last_error());
                if (pass) {
                    CHECK(memcmp(rep, eager + (size_t)t * sh.vocab, (size_t)sh.vocab * 4) == 0,
                          "act=%d step %d: replayed logits differ from eager", a, t);
                    CHECK(gid == eid[t], "step %d: token %d vs %d", t, gid, eid[t]);
                }
            }
            pt_cuda_graph_free(&g);
        }
        /* a synchronizing call inside a capture is an error, not a broken graph */
        REQUIRE(pt_cuda_graph_begin(G) == PT_OK, "begin: %s", pt_last_error());
        int32_t v = 1;
        pt_status up = G->ops->upload(G, m.pos, &v, 4);
        pt_cuda_graph *g = NULL;
        pt_status en = pt_cuda_graph_end(G, &g);
        CHECK(up != PT_OK || en != PT_OK, "upload inside a capture went unnoticed");
        pt_cuda_graph_free(&g);
        free(zeros), free(eager), free(rep);
        mini_free(&m);
    }
}

int main(void) {
    TEST_RUN(test_matmul_quantized);
    TEST_RUN(test_matmul_dense);
    TEST_RUN(test_prepare_rejects);
    TEST_RUN(test_embed);
    TEST_RUN(test_rms_norm);
    TEST_RUN(test_rms_norm2);
    TEST_RUN(test_rope);
    TEST_RUN(test_attention);
    TEST_RUN(test_glu_elementwise);
    TEST_RUN(test_moe);
    TEST_RUN(test_argmax);
    TEST_RUN(test_copy_rows_to);
    TEST_RUN(test_upload_staged);
    TEST_RUN(test_graph_replay);
    teardown();
    return test_summary();
}
