/* Prefill attention on CUDA against the CPU backend: bf16 activations over a
 * bf16 cache run the tensor-core flash kernel (src/backend/cuda/flash_attn.cu),
 * f32 activations or f32 caches its CUDA-core (FMA) form; long chunks over
 * several 64-row blocks and partial blocks, chunks after earlier positions, GQA 1–4, sliding
 * windows over a rotating cache, soft-cap, head_dim 32–256 (112 has no
 * flash instantiation and takes the other kernel). Per element |gpu − cpu|
 * <= atol + rtol·|cpu|, any NaN fails; a second run gives the same bytes.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU every test reports SKIP. */
#include "op_check.h"

typedef struct {
    int nh, nkv, hd;
    int64_t cap;
    int p0, T, window;
    float softcap;
    pt_ftype dt;
} fcase;

static int run_flash(int a, const fcase *c) {
    pt_backend *G = G_[a], *C = C_[a];
    const size_t cb = (size_t)c->nkv * (size_t)c->cap * (size_t)c->hd * pt_ftype_size(c->dt);
    pt_kv_layer kc = {.n_kv = c->nkv, .head_dim = c->hd, .capacity = c->cap, .dtype = c->dt}, kg = kc;
    kc.k = calloc(cb, 1), kc.v = calloc(cb, 1);
    kg.k = put(G, NULL, cb), kg.v = put(G, NULL, cb);
    const int maxc = c->T > 64 ? c->T : 64;
    const int64_t qn = (int64_t)maxc * c->nh * c->hd, kvn = (int64_t)maxc * c->nkv * c->hd;
    float *q = malloc(qn * 4), *k = malloc(kvn * 4), *v = malloc(kvn * 4), *oc = malloc(qn * 4), *og = malloc(qn * 4),
          *og2 = malloc(qn * 4);
    float *qd = put(G, NULL, qn * 4), *kd = put(G, NULL, kvn * 4), *vd = put(G, NULL, kvn * 4), *od = put(G, NULL, qn * 4);
    int32_t *pos = malloc(maxc * 4), *pd = put(G, NULL, maxc * 4);
    pt_attn p = {.n_heads = c->nh, .head_dim = c->hd, .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                 .window = c->window};
    int ok = 1;
    const int total = c->p0 + c->T;
    for (int s0 = 0; s0 < total && ok;) {
        int n = s0 < c->p0 ? (c->p0 - s0 < 64 ? c->p0 - s0 : 64) : c->T;
        if (n > c->cap) n = (int)c->cap;
        for (int t = 0; t < n; t++) pos[t] = s0 + t;
        fill_act(k, (int64_t)n * c->nkv * c->hd, -1.5f, 1.5f, a);
        fill_act(v, (int64_t)n * c->nkv * c->hd, -1, 1, a);
        fill_act(q, (int64_t)n * c->nh * c->hd, -2, 2, a);
        G->ops->upload(G, pd, pos, n * 4);
        G->ops->upload(G, kd, k, (size_t)n * c->nkv * c->hd * 4);
        G->ops->upload(G, vd, v, (size_t)n * c->nkv * c->hd * 4);
        G->ops->upload(G, qd, q, (size_t)n * c->nh * c->hd * 4);
        CHECK(C->ops->kv_append(C, &kc, k, v, n, pos) == PT_OK, "cpu kv_append: %s", pt_last_error());
        CHECK(G->ops->kv_append(G, &kg, kd, vd, n, pd) == PT_OK, "cuda kv_append: %s", pt_last_error());
        s0 += n;
        if (s0 < total) continue;
        pt_status s = C->ops->attention(C, oc, q, n, pos, &kc, &p);
        CHECK(s == PT_OK, "cpu attention: %s", pt_last_error());
        const size_t ob = (size_t)n * c->nh * c->hd * 4;
        s = G->ops->attention(G, od, qd, n, pd, &kg, &p);
        if (s == PT_OK) s = G->ops->download(G, og, od, ob);
        if (s == PT_OK) s = G->ops->attention(G, od, qd, n, pd, &kg, &p);
        if (s == PT_OK) s = G->ops->download(G, og2, od, ob);
        CHECK(s == PT_OK, "cuda attention: %s", pt_last_error());
        char what[160];
        snprintf(what, sizeof what, "prefill attention act=%d nh=%d nkv=%d hd=%d cap=%lld p0=%d T=%d window=%d softcap=%g %s",
                 a, c->nh, c->nkv, c->hd, (long long)c->cap, c->p0, c->T, c->window, c->softcap, pt_ftype_name(c->dt));
        ok = s == PT_OK && compare(what, og, oc, (int64_t)n * c->nh * c->hd, a ? 2e-2 : 1e-5, a ? 2e-2 : 1e-4);
        CHECK(!memcmp(og, og2, ob), "%s: a second run differs", what);
    }
    G->ops->dealloc(G, kg.k), G->ops->dealloc(G, kg.v), G->ops->dealloc(G, qd), G->ops->dealloc(G, kd);
    G->ops->dealloc(G, vd), G->ops->dealloc(G, od), G->ops->dealloc(G, pd);
    free(kc.k), free(kc.v), free(q), free(k), free(v), free(oc), free(og), free(og2), free(pos);
    return ok && !test_failed_current;
}

static void test_prefill_attention(void) {
    NEED_GPU();
    static const fcase cs[] = {
        {8, 2, 128, 512, 0, 200, 0, 0, PT_FT_BF16},      /* from position 0: four row blocks, the last partial */
        {8, 8, 64, 600, 300, 150, 0, 0, PT_FT_BF16},     /* a chunk after 300 positions, MHA */
        {4, 1, 256, 200, 150, 64, 32, 50.f, PT_FT_BF16}, /* ring (wraps), window 32, soft-cap, GQA 4, head_dim 256 */
        {6, 3, 80, 300, 37, 100, 16, 0, PT_FT_BF16},     /* window 16, head_dim 80 */
        {4, 2, 96, 128, 0, 65, 0, 30.f, PT_FT_BF16},     /* one row in the second block, soft-cap, head_dim 96 */
        {2, 1, 32, 64, 10, 2, 0, 0, PT_FT_BF16},         /* two rows, head_dim 32 */
        {4, 2, 112, 128, 5, 20, 0, 0, PT_FT_BF16},       /* head_dim 112: no flash instantiation */
        {16, 4, 128, 1024, 0, 512, 0, 0, PT_FT_BF16},    /* a long chunk */
        {8, 2, 128, 400, 100, 130, 0, 0, PT_FT_F32},     /* f32 cache: the FMA form in both modes */
        {4, 1, 256, 200, 150, 64, 32, 50.f, PT_FT_F32},  /* f32 cache, ring, window, soft-cap, head_dim 256 */
    };
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            if (!run_flash(a, &cs[i])) return;
    REPORT();
}

int main(void) {
    TEST_RUN(test_prefill_attention);
    teardown();
    return test_summary();
}
