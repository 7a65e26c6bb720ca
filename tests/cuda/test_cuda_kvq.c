/* The quantized KV cache on CUDA (src/backend/cuda/kv_quant.cu) against the
 * CPU backend: kv_append into a quantized cache and kv_quantize (the
 * conversion of a full-precision cache) must write the same bytes (codes,
 * scales, biases) for every MLX width 2..8, group size 32/64/128 and scale
 * dtype, rings included (and rope_qk_kv_append's one launch over a
 * quantized cache as rope_qk + kv_append); attention over a quantized cache (prefill chunks,
 * split decode, GQA 1–16, sliding windows, soft-cap, rotating caches) must
 * match the CPU within atol + rtol·|cpu| (any NaN fails). Prefill chunks in
 * bf16 mode run flash attention over the dequantized rows (kv_quant.cu); the
 * cases include a chunk of a full 64-row block over a ring.
 *
 * --fused-decode-attn (kv_fused.cu, an L3 lever): on every KV configuration
 * a model spec can produce (4 and 8 bits; head_dim 32/64/96/128/256 with
 * each group size dividing it; GQA 1..8; bf16, f16 and f32 scales; windows,
 * rings, soft-cap, long contexts over many splits) the fused decode step
 * stays within its bound of the CPU's EXACT quantized attention: f32
 * activations 1e-4·max|out| + 1e-3·|out|, bf16 activations 2e-2 (the exact
 * path's own CUDA-vs-CPU bound). It is deterministic, replays from a CUDA
 * graph bit for bit, and configurations without a kernel are refused with an
 * error naming them.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU every test reports SKIP. */
#include "op_check.h"

void pt_cuda_fd_tk(int v);                      /* the fused block kernels' keys a tile: 16, 32; 0: the default */
unsigned long long pt_cuda_fd_tk_count(int tk); /* their launches so far with tk-key tiles */

/* One KV layer on both backends: .c in host memory (CPU), .g on the GPU. */
typedef struct {
    pt_kv_layer c, g;
    size_t cb, pb; /* bytes of k/v and of each scale/bias array */
} layer2;

static void l2_make(layer2 *L, pt_backend *G, int nkv, int hd, int64_t cap, pt_ftype dt, int bits, int gs) {
    memset(L, 0, sizeof *L);
    pt_kv_layer k = {.n_kv = nkv, .head_dim = hd, .capacity = cap, .dtype = dt, .bits = bits, .group_size = gs};
    size_t rows = (size_t)nkv * (size_t)cap;
    L->cb = bits ? rows * (size_t)hd * (size_t)bits / 8 : rows * (size_t)hd * pt_ftype_size(dt);
    L->pb = bits ? rows * (size_t)(hd / gs) * pt_ftype_size(dt) : 0;
    L->c = L->g = k;
    void **hc[6] = {&L->c.k, &L->c.v, &L->c.k_scales, &L->c.k_biases, &L->c.v_scales, &L->c.v_biases};
    void **hg[6] = {&L->g.k, &L->g.v, &L->g.k_scales, &L->g.k_biases, &L->g.v_scales, &L->g.v_biases};
    for (int i = 0; i < (bits ? 6 : 2); i++) {
        size_t n = i < 2 ? L->cb : L->pb;
        *hc[i] = calloc(n, 1);
        *hg[i] = put(G, NULL, n);
    }
}
static void l2_free(layer2 *L, pt_backend *G) {
    void *hc[6] = {L->c.k, L->c.v, L->c.k_scales, L->c.k_biases, L->c.v_scales, L->c.v_biases};
    void *hg[6] = {L->g.k, L->g.v, L->g.k_scales, L->g.k_biases, L->g.v_scales, L->g.v_biases};
    for (int i = 0; i < 6; i++) {
        free(hc[i]);
        if (hg[i]) G->ops->dealloc(G, hg[i]);
    }
}
/* Every byte of the GPU cache equals the CPU's. */
static int l2_same(layer2 *L, pt_backend *G, const char *what) {
    const void *hc[6] = {L->c.k, L->c.v, L->c.k_scales, L->c.k_biases, L->c.v_scales, L->c.v_biases};
    const void *hg[6] = {L->g.k, L->g.v, L->g.k_scales, L->g.k_biases, L->g.v_scales, L->g.v_biases};
    static const char *nm[6] = {"k codes", "v codes", "k scales", "k biases", "v scales", "v biases"};
    for (int i = 0; i < (L->c.bits ? 6 : 2); i++) {
        size_t n = i < 2 ? L->cb : L->pb;
        unsigned char *h = malloc(n);
        pt_status s = G->ops->download(G, h, hg[i], n);
        CHECK(s == PT_OK, "%s: download: %s", what, pt_last_error());
        size_t at = 0;
        while (at < n && h[at] == ((const unsigned char *)hc[i])[at]) at++;
        CHECK(at == n, "%s: %s differ first at byte %zu of %zu (cuda %02x, cpu %02x)", what, nm[i], at, n,
              at < n ? h[at] : 0, at < n ? ((const unsigned char *)hc[i])[at] : 0);
        free(h);
        if (at != n || s != PT_OK) return 0;
    }
    return 1;
}

/* Appends rows of positions [p, p + n) (same random K/V on both sides). */
static int append(int a, layer2 *L, int p, int n, float *k, float *v, float *kd, float *vd, int32_t *pos,
                  int32_t *pd) {
    pt_backend *G = G_[a], *C = C_[a];
    const int64_t m = (int64_t)n * L->c.n_kv * L->c.head_dim;
    for (int t = 0; t < n; t++) pos[t] = p + t;
    fill_act(k, m, -1.5f, 1.5f, a);
    fill_act(v, m, -1.5f, 1.5f, a);
    if (p == 0 && m >= 64) { /* special groups: all zero, all equal, all negative */
        for (int i = 0; i < 32; i++) k[i] = 0, v[i] = 0.75f, k[32 + i % 32] = -rf(0.1f, 2);
    }
    G->ops->upload(G, pd, pos, (size_t)n * 4);
    G->ops->upload(G, kd, k, (size_t)m * 4);
    G->ops->upload(G, vd, v, (size_t)m * 4);
    pt_status s = C->ops->kv_append(C, &L->c, k, v, n, pos);
    CHECK(s == PT_OK, "cpu kv_append: %s", pt_last_error());
    pt_status t = G->ops->kv_append(G, &L->g, kd, vd, n, pd);
    CHECK(t == PT_OK, "cuda kv_append: %s", pt_last_error());
    return s == PT_OK && t == PT_OK;
}

enum { MAXC = 64, MAXE = MAXC * 16 * 256 };
static float *hk, *hv, *hq, *ho, *dk, *dv, *dq, *dout;
static int32_t *hpos, *dpos;
static void bufs(int a) {
    pt_backend *G = G_[a];
    if (!hk) hk = malloc(MAXE * 4), hv = malloc(MAXE * 4), hq = malloc(MAXE * 4), ho = malloc(MAXE * 4),
             hpos = malloc(MAXC * 4);
    dk = put(G, NULL, MAXE * 4), dv = put(G, NULL, MAXE * 4), dq = put(G, NULL, MAXE * 4), dout = put(G, NULL, MAXE * 4);
    dpos = put(G, NULL, MAXC * 4);
}
static void unbufs(int a) {
    pt_backend *G = G_[a];
    G->ops->dealloc(G, dk), G->ops->dealloc(G, dv), G->ops->dealloc(G, dq), G->ops->dealloc(G, dout);
    G->ops->dealloc(G, dpos);
}

static void test_kv_append_quantized(void) {
    NEED_GPU();
    static const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    static const pt_ftype dts[] = {PT_FT_BF16, PT_FT_F32, PT_FT_F16};
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int di = 0; di < 3; di++) {
                const int a = dts[di] == PT_FT_BF16, hd = gi == 0 && bi % 2 ? 96 : 128;
                bufs(a);
                layer2 L;
                l2_make(&L, G_[a], 3, hd, 20, dts[di], bits[bi], gss[gi]);
                int ok = 1;
                for (int p = 0; p < 28 && ok; p += 7) /* the ring wraps */
                    ok = append(a, &L, p, 7, hk, hv, dk, dv, hpos, dpos);
                for (int p = 28; p < 31 && ok; p++) /* decode rows, one a call (wrapping too) */
                    ok = append(a, &L, p, 1, hk, hv, dk, dv, hpos, dpos);
                char what[96];
                snprintf(what, sizeof what, "kv_append bits=%d gs=%d hd=%d %s", bits[bi], gss[gi], hd,
                         pt_ftype_name(dts[di]));
                ok = ok && l2_same(&L, G_[a], what);
                l2_free(&L, G_[a]);
                unbufs(a);
                if (!ok) return;
            }
}

/* rope_qk_kv_append over a quantized cache (kv_quant.cu's rope_kvq_kernel,
 * one launch) bit for bit against rope_qk + kv_append: q and every byte of
 * the cache (k is left unrotated there) (codes, scales, biases), for several widths, group sizes and
 * scale dtypes, full and partial rotary dims, T = 1 and 7, positions
 * wrapping the ring. */
static void test_rope_kv_append_quantized(void) {
    NEED_GPU();
    static const struct { int nh, nkv, hd, rot, T, p0, bits, gs; pt_ftype dt; } cs[] = {
        {32, 8, 64, 64, 1, 5, 4, 64, PT_FT_BF16},  {8, 2, 128, 128, 7, 12, 4, 64, PT_FT_BF16},
        {8, 2, 128, 64, 1, 30, 8, 32, PT_FT_F32},   {6, 2, 256, 64, 7, 3, 3, 128, PT_FT_F16},
        {4, 4, 128, 128, 7, 9, 6, 32, PT_FT_BF16},  {3, 1, 64, 64, 1, 0, 2, 64, PT_FT_F32},
        {4, 2, 96, 96, 7, 14, 5, 32, PT_FT_BF16}};
    const int64_t cap = 16;
    int n_cases = 0;
    for (int a = 0; a < 2; a++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            pt_backend *G = G_[a];
            const int nh = cs[ci].nh, nkv = cs[ci].nkv, hd = cs[ci].hd, T = cs[ci].T;
            const int64_t nq = (int64_t)T * nh * hd, nk = (int64_t)T * nkv * hd;
            float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), inv[128];
            float *qa = malloc(nq * 4), *qb = malloc(nq * 4);
            int32_t pos[8];
            float *invd;
            int32_t *pd; /* p0 12, T 7: the positions wrap the ring of 16 */
            pt_rope rg = rope_case(G, a, cs[ci].rot, cs[ci].p0, T, inv, pos, q, nq, k, v, nk, &invd, &pd);
            /* A: the one launch; B: rope_qk then kv_append */
            float *qd[2], *kd[2], *vd[2];
            layer2 L[2];
            for (int w = 0; w < 2; w++) {
                qd[w] = put(G, q, nq * 4), kd[w] = put(G, k, nk * 4), vd[w] = put(G, v, nk * 4);
                l2_make(&L[w], G, nkv, hd, cap, cs[ci].dt, cs[ci].bits, cs[ci].gs);
            }
            pt_status s = G->ops->rope_qk_kv_append(G, qd[0], kd[0], vd[0], T, nh, nkv, hd, pd, &rg, &L[0].g);
            if (s == PT_OK) s = G->ops->rope_qk(G, qd[1], kd[1], T, nh, nkv, hd, pd, &rg);
            if (s == PT_OK) s = G->ops->kv_append(G, &L[1].g, kd[1], vd[1], T, pd);
            if (s == PT_OK) s = G->ops->download(G, qa, qd[0], nq * 4);
            if (s == PT_OK) s = G->ops->download(G, qb, qd[1], nq * 4);
            REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
            CHECK(!memcmp(qa, qb, nq * 4), "act %d case %zu: q differs", a, ci);
            /* the reference's cache into the .c side, then every byte compared */
            void *hc[6] = {L[0].c.k, L[0].c.v, L[0].c.k_scales, L[0].c.k_biases, L[0].c.v_scales, L[0].c.v_biases};
            void *hb[6] = {L[1].g.k, L[1].g.v, L[1].g.k_scales, L[1].g.k_biases, L[1].g.v_scales, L[1].g.v_biases};
            for (int i = 0; i < 6 && s == PT_OK; i++) s = G->ops->download(G, hc[i], hb[i], i < 2 ? L[0].cb : L[0].pb);
            REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
            char what[96];
            snprintf(what, sizeof what, "rope_qk_kv_append act %d case %zu (%d-bit, group %d)", a, ci, cs[ci].bits,
                     cs[ci].gs);
            l2_same(&L[0], G, what);
            for (int w = 0; w < 2; w++) {
                G->ops->dealloc(G, qd[w]), G->ops->dealloc(G, kd[w]), G->ops->dealloc(G, vd[w]);
                l2_free(&L[w], G);
            }
            G->ops->dealloc(G, invd), G->ops->dealloc(G, pd);
            free(q), free(k), free(v), free(qa), free(qb);
            n_cases++;
        }
    printf("INFO rope_qk_kv_append (quantized): %d cases bit-identical to rope_qk + kv_append\n", n_cases);
}

static void test_kv_quantize(void) {
    NEED_GPU();
    static const struct { int bits, gs, hd; int64_t cap; int n, p0; pt_ftype dt; } cs[] = {
        {4, 64, 128, 40, 33, 0, PT_FT_BF16},  /* the whole prefix of a full cache */
        {8, 32, 64, 24, 50, 26, PT_FT_BF16},  /* a ring: its last 24 positions */
        {3, 128, 256, 16, 16, 0, PT_FT_F32},
        {6, 32, 96, 30, 45, 15, PT_FT_F32},
        {2, 64, 128, 10, 12, 5, PT_FT_F16},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int a = cs[i].dt == PT_FT_BF16;
        bufs(a);
        layer2 F, Q;
        l2_make(&F, G_[a], 2, cs[i].hd, cs[i].cap, cs[i].dt, 0, 0);
        l2_make(&Q, G_[a], 2, cs[i].hd, cs[i].cap, cs[i].dt, cs[i].bits, cs[i].gs);
        int ok = 1;
        for (int p = 0; p < cs[i].n && ok;) {
            int n = cs[i].n - p < 8 ? cs[i].n - p : 8;
            ok = append(a, &F, p, n, hk, hv, dk, dv, hpos, dpos);
            p += n;
        }
        pt_status s = C_[a]->ops->kv_quantize(C_[a], &Q.c, &F.c, cs[i].p0, cs[i].n);
        CHECK(s == PT_OK, "cpu kv_quantize: %s", pt_last_error());
        pt_status t = G_[a]->ops->kv_quantize(G_[a], &Q.g, &F.g, cs[i].p0, cs[i].n);
        CHECK(t == PT_OK, "cuda kv_quantize: %s", pt_last_error());
        char what[96];
        snprintf(what, sizeof what, "kv_quantize bits=%d gs=%d hd=%d [%d, %d) cap %lld", cs[i].bits, cs[i].gs,
                 cs[i].hd, cs[i].p0, cs[i].n, (long long)cs[i].cap);
        ok = ok && s == PT_OK && t == PT_OK && l2_same(&Q, G_[a], what);
        /* a range longer than the caches is refused, as on the CPU */
        t = G_[a]->ops->kv_quantize(G_[a], &Q.g, &F.g, 0, cs[i].cap + 1);
        CHECK(t == PT_ERR_RANGE, "range longer than the cache: %s", pt_status_name(t));
        l2_free(&F, G_[a]), l2_free(&Q, G_[a]);
        unbufs(a);
        if (!ok) return;
    }
}

static int g_fused; /* run_qattn: the CUDA side runs the fused decode kernel */

typedef struct {
    ACASE_FIELDS /* op_check.h */
    int bits, gs;
} qcase;

/* Positions [0, p0) go into a full-precision cache in chunks of up to 64
 * rows, the cache is converted (its last `cap` positions), then the chunk
 * [p0, p0 + T) is appended quantized and attended with, as the forward pass
 * does with --kv-quant. */
static int run_qattn(int a, const qcase *c) {
    pt_backend *G = G_[a], *C = C_[a];
    bufs(a);
    layer2 F, Q;
    l2_make(&F, G, c->nkv, c->hd, c->cap, c->dt, 0, 0);
    l2_make(&Q, G, c->nkv, c->hd, c->cap, c->dt, c->bits, c->gs);
    int ok = 1;
    for (int p = 0; p < c->p0 && ok;) {
        int n = c->p0 - p < MAXC ? c->p0 - p : MAXC;
        if (n > c->cap) n = (int)c->cap;
        ok = append(a, &F, p, n, hk, hv, dk, dv, hpos, dpos);
        p += n;
    }
    const int q0 = c->p0 > c->cap ? c->p0 - (int)c->cap : 0;
    pt_status s = C->ops->kv_quantize(C, &Q.c, &F.c, q0, c->p0);
    CHECK(s == PT_OK, "cpu kv_quantize: %s", pt_last_error());
    s = G->ops->kv_quantize(G, &Q.g, &F.g, q0, c->p0);
    CHECK(s == PT_OK, "cuda kv_quantize: %s", pt_last_error());
    ok = ok && s == PT_OK && append(a, &Q, c->p0, c->T, hk, hv, dk, dv, hpos, dpos);
    const int64_t qn = (int64_t)c->T * c->nh * c->hd;
    fill_act(hq, qn, -2, 2, a);
    G->ops->upload(G, dq, hq, (size_t)qn * 4);
    pt_attn p = {.n_heads = c->nh, .head_dim = c->hd, .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                 .window = c->window};
    pt_attn pg = p; /* the CPU reference always runs the exact path */
    pg.fused_decode = g_fused;
    char what[192];
    snprintf(what, sizeof what,
             "%squantized attention act=%d nh=%d nkv=%d hd=%d cap=%lld p0=%d T=%d window=%d softcap=%g %s bits=%d "
             "gs=%d",
             g_fused ? "fused " : "", a, c->nh, c->nkv, c->hd, (long long)c->cap, c->p0, c->T, c->window, c->softcap, pt_ftype_name(c->dt),
             c->bits, c->gs);
    if (ok) {
        float *og = malloc((size_t)qn * 4);
        s = C->ops->attention(C, ho, hq, c->T, hpos, &Q.c, &p);
        CHECK(s == PT_OK, "cpu attention: %s", pt_last_error());
        pt_status t = G->ops->attention(G, dout, dq, c->T, dpos, &Q.g, &pg);
        if (t == PT_OK) t = G->ops->download(G, og, dout, (size_t)qn * 4);
        CHECK(t == PT_OK, "cuda attention (%s): %s", what, pt_last_error());
        ok = s == PT_OK && t == PT_OK && l2_same(&Q, G, what) &&
             compare(what, og, ho, qn, a ? 2e-2 : g_fused ? 1e-4 : 1e-5, a ? 2e-2 : g_fused ? 1e-3 : 1e-4);
        if (ok && g_fused) { /* deterministic: a second run gives the same bytes */
            float *o2 = malloc((size_t)qn * 4);
            t = G->ops->attention(G, dout, dq, c->T, dpos, &Q.g, &pg);
            if (t == PT_OK) t = G->ops->download(G, o2, dout, (size_t)qn * 4);
            CHECK(t == PT_OK && !memcmp(o2, og, (size_t)qn * 4), "%s: a second run differs", what);
            free(o2);
        }
        free(og);
    }
    l2_free(&F, G), l2_free(&Q, G);
    unbufs(a);
    return ok && !test_failed_current;
}

static void test_attention_quantized(void) {
    NEED_GPU();
    static const qcase cs[] = {
        {4, 4, 64, 64, 0, 7, 0, 0, PT_FT_F32, 4, 32},            /* prefill from 0, MHA */
        {8, 2, 128, 300, 250, 1, 0, 0, PT_FT_BF16, 4, 64},       /* decode, GQA 4 */
        {8, 2, 128, 300, 37, 13, 0, 0, PT_FT_BF16, 8, 64},       /* second prefill chunk */
        {6, 3, 96, 100, 60, 5, 16, 0, PT_FT_BF16, 4, 32},        /* sliding window, head_dim 96 */
        {4, 1, 256, 64, 150, 4, 32, 50.0f, PT_FT_BF16, 8, 128},  /* rotating cache, soft-cap, head_dim 256 */
        {16, 8, 64, 3000, 2900, 1, 0, 0, PT_FT_BF16, 4, 64},     /* long decode: split over the sequence */
        {6, 3, 96, 100, 60, 1, 16, 0, PT_FT_BF16, 3, 32},        /* split decode: window, 3-bit */
        {4, 1, 256, 64, 150, 1, 32, 50.0f, PT_FT_BF16, 6, 64},   /* split decode: ring, soft-cap, 6-bit */
        {16, 2, 128, 4000, 3999, 1, 0, 0, PT_FT_F32, 8, 32},     /* split decode: GQA 8, f32 scales */
        {16, 1, 64, 500, 10, 1, 0, 0, PT_FT_BF16, 4, 64},        /* GQA 16: the one-block-per-head kernel */
        {8, 2, 128, 300, 37, 13, 0, 0, PT_FT_F16, 5, 32},        /* f16 scales, 5-bit */
        {2, 2, 128, 200, 100, 1, 0, 0, PT_FT_BF16, 2, 128},      /* 2-bit decode */
        {8, 2, 128, 512, 200, 64, 0, 0, PT_FT_BF16, 4, 64},      /* a 64-row chunk after 200 rows */
        {8, 4, 64, 100, 150, 50, 40, 30.0f, PT_FT_BF16, 8, 32},  /* chunk over a ring, window, soft-cap */
        /* decode on the second-generation kernels (4 and 8 bits): every lane layout */
        {4, 1, 256, 64, 150, 1, 32, 50.0f, PT_FT_BF16, 8, 128},  /* 8-bit head_dim 256: two words per lane */
        {6, 3, 96, 100, 60, 1, 16, 0, PT_FT_BF16, 4, 32},        /* 4-bit head_dim 96: idle lanes */
        {8, 8, 32, 200, 120, 1, 0, 0, PT_FT_F16, 4, 32},         /* 4-bit head_dim 32: one chunk a key, MHA */
        {8, 2, 256, 1000, 999, 1, 0, 0, PT_FT_BF16, 4, 64},      /* 4-bit head_dim 256, many splits */
        {8, 1, 64, 700, 650, 1, 0, 0, PT_FT_BF16, 8, 64},        /* 8-bit GQA 8 */
        {4, 1, 128, 96, 333, 1, 64, 30.0f, PT_FT_F32, 8, 128},   /* 8-bit over a ring, window, soft-cap */
        {8, 2, 128, 4000, 3900, 1, 0, 0, PT_FT_BF16, 4, 32},     /* 4-bit gs 32, long */
    };
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            if (!run_qattn(a, &cs[i])) return;
    REPORT();
}

/* The fused decode kernel against the CPU's exact quantized attention on
 * every configuration it has a kernel for, and the refusals. */
static void test_fused_decode(void) {
    NEED_GPU();
    static const int hds[] = {32, 64, 64, 96, 128, 128, 128, 256, 256, 256};
    static const int gss[] = {32, 32, 64, 32, 32, 64, 128, 32, 64, 128};
    static const pt_ftype dts[] = {PT_FT_BF16, PT_FT_F32, PT_FT_F16};
    static const qcase cs[] = {
        {16, 2, 128, 4000, 3999, 1, 0, 0, PT_FT_BF16, 4, 64},   /* the llama-3.1-8b group, many splits */
        {16, 8, 64, 3000, 2500, 1, 0, 0, PT_FT_BF16, 8, 32},    /* 8-bit, 8 KV heads */
        {6, 3, 96, 100, 60, 1, 16, 0, PT_FT_BF16, 4, 32},       /* sliding window */
        {4, 1, 256, 64, 150, 1, 32, 50.0f, PT_FT_BF16, 8, 128}, /* ring, soft-cap, head_dim 256 */
        {8, 1, 128, 300, 0, 1, 0, 0, PT_FT_F32, 4, 128},        /* a single key */
        {14, 2, 128, 700, 650, 1, 0, 0, PT_FT_BF16, 4, 32},     /* GQA 7 (qwen2.5-7b) */
        {8, 2, 128, 333, 332, 1, 0, 0, PT_FT_BF16, 4, 64},      /* a partial last tile in every split */
        {12, 4, 64, 100, 250, 1, 90, 0, PT_FT_F16, 4, 32},      /* a ring wrapped mid-tile (window 90), GQA 3 */
    };
    g_fused = 1;
    int ok = 1;
    /* both block kernels with 16- and 32-key tiles (pt_cuda_fd_tk), each counted */
    for (int tk = 16; tk <= 32 && ok; tk += 16) {
        pt_cuda_fd_tk(tk);
        const unsigned long long t0 = pt_cuda_fd_tk_count(tk);
        int n = 0;
        for (int bi = 0; bi < 2 && ok; bi++)
            for (int ci = 0; ci < 10 && ok; ci++)
                for (int a = 0; a < 2 && ok; a++) {
                    const int G = 1 + (n * 3 + bi) % 8, nkv = G > 4 ? 1 : 2; /* every GQA ratio 1..8 comes up */
                    const qcase c = {G * nkv, nkv, hds[ci], 400, 150 + 37 * (n % 5), 1, 0, 0, dts[n % 3],
                                     bi ? 8 : 4, gss[ci]};
                    ok = run_qattn(a, &c);
                    n++;
                }
        for (int a = 0; a < 2 && ok; a++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0] && ok; i++) ok = run_qattn(a, &cs[i]);
        CHECK(!ok || pt_cuda_fd_tk_count(tk) > t0, "no fused launch with %d-key tiles", tk);
    }
    pt_cuda_fd_tk(0);
    g_fused = 0;
    /* refusals name the configuration */
    const int a = 1;
    pt_backend *G = G_[a];
    bufs(a);
    static const struct {
        int nh, nkv, hd, bits, gs;
        int64_t cap; /* 0: the layer's own 64 slots */
        const char *want;
    } bad[] = {
        {4, 2, 128, 3, 32, 0, "3-bit"},
        {16, 1, 64, 4, 64, 0, "GQA ratio 16"},
        /* keys are indexed in 32 bits: refused before any cache memory is read (the arrays hold 64 slots) */
        {8, 2, 128, 4, 64, (int64_t)1 << 30, "2^30"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        layer2 Q;
        l2_make(&Q, G, bad[i].nkv, bad[i].hd, 64, PT_FT_BF16, bad[i].bits, bad[i].gs);
        if (bad[i].cap) Q.g.capacity = bad[i].cap;
        int32_t p0 = 0;
        G->ops->upload(G, dpos, &p0, 4);
        pt_attn p = {.n_heads = bad[i].nh, .head_dim = bad[i].hd, .scale = 0.125f, .fused_decode = 1};
        pt_status s = G->ops->attention(G, dout, dq, 1, dpos, &Q.g, &p);
        CHECK(s == PT_ERR_UNSUPPORTED && strstr(pt_last_error(), bad[i].want), "fused %d-bit nh=%d nkv=%d: %s (%s)",
              bad[i].bits, bad[i].nh, bad[i].nkv, pt_status_name(s), pt_last_error());
        Q.g.capacity = 64;
        l2_free(&Q, G);
    }
    unbufs(a);
    REPORT();
}

/* Decode steps over a quantized cache replayed from one CUDA graph give the
 * same bytes as eager execution (positions come from device memory), for
 * the exact split kernels and the fused kernel. */
static void test_quantized_decode_graph(void) {
    NEED_GPU();
    for (int fused = 0; fused < 2; fused++) {
        const int a = 1, nh = 8, nkv = 2, hd = 128;
        pt_backend *G = G_[a];
        bufs(a);
        layer2 Q;
        l2_make(&Q, G, nkv, hd, 256, PT_FT_BF16, 4, 64);
        int ok = append(a, &Q, 0, 40, hk, hv, dk, dv, hpos, dpos);
        pt_attn p = {.n_heads = nh, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .fused_decode = fused};
        const int64_t qn = (int64_t)nh * hd;
        fill_act(hq, qn, -2, 2, a);
        G->ops->upload(G, dq, hq, (size_t)qn * 4);
        float *eager = malloc((size_t)qn * 4 * 4), *rep = malloc((size_t)qn * 4);
        int32_t p1 = 40;
        for (int pass = 0; pass < 2 && ok; pass++) {
            pt_cuda_graph *g = NULL;
            if (pass) {
                REQUIRE(pt_cuda_graph_begin(G) == PT_OK, "begin: %s", pt_last_error());
                pt_status s1 = G->ops->kv_append(G, &Q.g, dk, dv, 1, dpos);
                pt_status s2 = G->ops->attention(G, dout, dq, 1, dpos, &Q.g, &p);
                pt_status s3 = pt_cuda_graph_end(G, &g);
                REQUIRE(s1 == PT_OK && s2 == PT_OK && s3 == PT_OK, "capture: %s", pt_last_error());
            }
            for (int step = 0; step < 4; step++) {
                int32_t pp = p1 + step;
                G->ops->upload(G, dpos, &pp, 4);
                pt_status s = PT_OK;
                if (pass) s = pt_cuda_graph_launch(G, g);
                else {
                    s = G->ops->kv_append(G, &Q.g, dk, dv, 1, dpos);
                    if (s == PT_OK) s = G->ops->attention(G, dout, dq, 1, dpos, &Q.g, &p);
                }
                if (s == PT_OK) s = G->ops->download(G, pass ? rep : eager + step * qn, dout, (size_t)qn * 4);
                CHECK(s == PT_OK, "step %d: %s", step, pt_last_error());
                if (pass)
                    CHECK(!memcmp(rep, eager + step * qn, (size_t)qn * 4), "step %d: replay differs (fused %d)", step,
                          fused);
            }
            pt_cuda_graph_free(&g);
        }
        free(eager), free(rep);
        l2_free(&Q, G);
        unbufs(a);
    }
}

int main(void) {
    TEST_RUN(test_kv_append_quantized);
    TEST_RUN(test_rope_kv_append_quantized);
    TEST_RUN(test_kv_quantize);
    TEST_RUN(test_attention_quantized);
    TEST_RUN(test_fused_decode);
    TEST_RUN(test_quantized_decode_graph);
    teardown();
    free(hk), free(hv), free(hq), free(ho), free(hpos);
    return test_summary();
}
