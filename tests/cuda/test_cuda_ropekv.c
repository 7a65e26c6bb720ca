/* rope_qk_kv_append (src/backend/cuda/rope.cu): RoPE on q and k plus the
 * cache write of k and v in one launch, bit for bit against CUDA's own
 * rope_qk followed by kv_append — q, k and the whole cache (every byte,
 * rows written and rows left alone) — for f32, bf16 and f16 caches, both
 * activation modes, full and partial rotary dims, GQA, T = 1 (decode) and
 * T = 7, positions wrapping a ring of 16 rows; and the cache rows against
 * the CPU's rope + kv_append within tolerance. rope_kv_attention (RoPE and
 * the cache write folded into the split decode's scores kernel,
 * attention.cu) bit for bit against rope_qk_kv_append + attention (one
 * sequence) and rope_qk + kv_append_rows + attention_rows (batched rows,
 * two of them sharing a cache as a joining prompt's rows do): the outputs
 * and every byte of the caches; each batched row's output against the same
 * row decoded alone (a block per query head alone, per KV head batched).
 * The one-launch short decode (attention_short.cu) against the split
 * kernels in each of its forms, for one sequence and for batched rows. Not the attention against the CPU
 * (test_cuda_ops.c, test_cuda_batch.c). */
#include "cuda/op_check.h"

#include <stdlib.h>
#include <string.h>

void pt_cuda_dec_short_rows_minb(int v); /* attention_short.cu: rows' blocks plain (2) or dense (4); 0: by size */
unsigned long long pt_cuda_dec_short_split_count(void); /* attention_short.cu: batched launches staged by split */
void pt_cuda_dec_rows1(int v);                /* attention_short.cu: 0 the generic kernel for one-task splits, -1 the rule */
unsigned long long pt_cuda_dec_rows1_count(void); /* attention_short.cu: launches of the one-task-split kernel */
unsigned long long pt_cuda_dec_short_rows_count(void); /* attention_short.cu: batched calls in the one-block form */
void pt_cuda_dec_short_warps(int v);     /* one sequence: at least 8 or 16 warps a block; 0: the fewest */
unsigned long long pt_cuda_dec_short_fold_count(int nw); /* one-sequence launches with nw warps a block */

static void test_rope_kv_bits(void) {
    NEED_GPU();
    static const struct { int nh, nkv, hd, rot, T, p0; } cs[] = {
        {32, 8, 64, 64, 1, 5}, {8, 2, 128, 128, 7, 12}, {4, 4, 80, 40, 1, 30}, {6, 2, 256, 64, 7, 3}, {3, 1, 64, 64, 1, 0}};
    const int64_t cap = 16;
    int n_cases = 0;
    for (int a = 0; a < 2; a++)
        for (int dt = 0; dt < 3; dt++)
            for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
                pt_backend *G = G_[a], *C = C_[a];
                const int nh = cs[ci].nh, nkv = cs[ci].nkv, hd = cs[ci].hd, T = cs[ci].T;
                const int64_t nq = (int64_t)T * nh * hd, nk = (int64_t)T * nkv * hd, ncache = nkv * cap * hd;
                const pt_ftype ft = (pt_ftype)dt;
                const size_t esz = pt_ftype_size(ft), cbytes = (size_t)ncache * esz;
                float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), inv[128];
                float *qa = malloc(nq * 4), *ka = malloc(nk * 4), *qb = malloc(nq * 4), *kb = malloc(nk * 4);
                uint8_t *ca = malloc(cbytes * 2), *cb = malloc(cbytes * 2), *init = malloc(cbytes);
                int32_t pos[8];
                float *invd;
                int32_t *pd; /* p0 12, T 7: the positions wrap the ring of 16 */
                pt_rope rg = rope_case(G, a, cs[ci].rot, cs[ci].p0, T, inv, pos, q, nq, k, v, nk, &invd, &pd);
                for (size_t i = 0; i < cbytes; i++) init[i] = (uint8_t)(ru32() & 0x3f); /* finite garbage */
                /* A: the fused op; B: rope_qk then kv_append */
                float *qd[2], *kd[2], *vd[2];
                pt_kv_layer kv[2];
                for (int w = 0; w < 2; w++) {
                    qd[w] = put(G, q, nq * 4), kd[w] = put(G, k, nk * 4), vd[w] = put(G, v, nk * 4);
                    memset(&kv[w], 0, sizeof kv[w]);
                    kv[w].n_kv = nkv, kv[w].head_dim = hd, kv[w].capacity = cap, kv[w].dtype = ft;
                    kv[w].k = put(G, init, cbytes), kv[w].v = put(G, init, cbytes);
                }
                pt_status s = G->ops->rope_qk_kv_append(G, qd[0], kd[0], vd[0], T, nh, nkv, hd, pd, &rg, &kv[0]);
                if (s == PT_OK) s = G->ops->rope_qk(G, qd[1], kd[1], T, nh, nkv, hd, pd, &rg);
                if (s == PT_OK) s = G->ops->kv_append(G, &kv[1], kd[1], vd[1], T, pd);
                if (s == PT_OK) s = G->ops->download(G, qa, qd[0], nq * 4);
                if (s == PT_OK) s = G->ops->download(G, ka, kd[0], nk * 4);
                if (s == PT_OK) s = G->ops->download(G, qb, qd[1], nq * 4);
                if (s == PT_OK) s = G->ops->download(G, kb, kd[1], nk * 4);
                if (s == PT_OK) s = G->ops->download(G, ca, kv[0].k, cbytes);
                if (s == PT_OK) s = G->ops->download(G, ca + cbytes, kv[0].v, cbytes);
                if (s == PT_OK) s = G->ops->download(G, cb, kv[1].k, cbytes);
                if (s == PT_OK) s = G->ops->download(G, cb + cbytes, kv[1].v, cbytes);
                REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
                CHECK(!memcmp(qa, qb, nq * 4), "act %d dtype %d case %zu: q differs", a, dt, ci);
                CHECK(!memcmp(ka, kb, nk * 4), "act %d dtype %d case %zu: k differs", a, dt, ci);
                CHECK(!memcmp(ca, cb, cbytes * 2), "act %d dtype %d case %zu: cache bytes differ", a, dt, ci);
                /* against the CPU (f32 caches: the rows as floats) */
                if (dt == 0) {
                    float *kc = malloc(cbytes), *vc = malloc(cbytes);
                    memcpy(kc, init, cbytes), memcpy(vc, init, cbytes);
                    pt_kv_layer kvc = kv[0];
                    kvc.k = kc, kvc.v = vc;
                    pt_rope rc = {cs[ci].rot, inv, 1.0f};
                    C->ops->rope(C, q, T, nh, hd, pos, &rc);
                    C->ops->rope(C, k, T, nkv, hd, pos, &rc);
                    C->ops->kv_append(C, &kvc, k, v, T, pos);
                    char what[64];
                    snprintf(what, sizeof what, "act %d case %zu k cache", a, ci);
                    compare(what, (const float *)ca, kc, ncache, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-5);
                    snprintf(what, sizeof what, "act %d case %zu v cache", a, ci);
                    compare(what, (const float *)(ca + cbytes), vc, ncache, 0, 0);
                    free(kc), free(vc);
                }
                for (int w = 0; w < 2; w++) {
                    G->ops->dealloc(G, qd[w]), G->ops->dealloc(G, kd[w]), G->ops->dealloc(G, vd[w]);
                    G->ops->dealloc(G, kv[w].k), G->ops->dealloc(G, kv[w].v);
                }
                G->ops->dealloc(G, invd), G->ops->dealloc(G, pd);
                free(q), free(k), free(v), free(qa), free(ka), free(qb), free(kb), free(ca), free(cb), free(init);
                n_cases++;
            }
    printf("INFO rope_qk_kv_append: %d cases bit-identical to rope_qk + kv_append\n", n_cases);
    REPORT();
}

/* ---- rope_kv_attention: the fold vs the separate calls, bit for bit ---- */

typedef struct {
    int nh, nkv, hd, rot, window;
    int64_t cap;
    float softcap;
    int r1; /* batched rows under the 256-key bound (test_rope_kv_attention_short_rows_bits): 1 every split is one
             * task, so the one-task-split kernel must run where a form allows it; -1 it must not; 0 unchecked */
} ra_case;

/* Row b's position: keys 1..2000 (split thresholds at 16, 528, ...), a ring
 * wrapping under a window, a padding row (-1) among the batched rows. */
static const int32_t ra_pos[] = {0, 5, 15, 16, 100, 527, 600, 1999, -1, 64};
enum { RA_ROWS = (int)(sizeof ra_pos / sizeof ra_pos[0]), RA_CTX = 2048 };

/* A case's cache rows (values in [-1, 1] in the cache's type, celems of
 * them at init), its RoPE table on the device, attention parameters, cache
 * shape and the description that names it in messages. */
static void ra_prepare(pt_backend *G, int a, pt_ftype ft, const ra_case *rc, uint8_t *init, size_t celems,
                       pt_rope *rope, pt_attn *p, pt_kv_layer *shape, char *what, size_t wn) {
    float inv[128];
    const int half = rc->rot / 2;
    for (int i = 0; i < half; i++) inv[i] = powf(10000.0f, -2.0f * i / rc->rot);
    for (size_t i = 0; i < celems; i++) {
        const float x = rf(-1, 1);
        if (ft == PT_FT_F32) ((float *)init)[i] = x;
        else if (ft == PT_FT_BF16) ((uint16_t *)init)[i] = pt_f32_to_bf16(x);
        else ((uint16_t *)init)[i] = pt_f32_to_f16(x);
    }
    *rope = (pt_rope){rc->rot, put(G, inv, half * 4), 1.0f};
    *p = (pt_attn){.n_heads = rc->nh, .head_dim = rc->hd, .scale = 1.0f / sqrtf((float)rc->hd),
                   .softcap = rc->softcap, .window = rc->window};
    *shape = (pt_kv_layer){.n_kv = rc->nkv, .head_dim = rc->hd, .capacity = rc->cap, .dtype = ft};
    snprintf(what, wn, "act %d dtype %d nh %d nkv %d hd %d rot %d window %d cap %lld", a, (int)ft, rc->nh, rc->nkv,
             rc->hd, rc->rot, rc->window, (long long)rc->cap);
}

/* Two sets (w = 0, 1) of B batched rows on the device: each set's query,
 * key and value rows, output, and K/V caches through a pointer table
 * ([B][2]), every cache starting as init and row b writing into row
 * share[b]'s caches (a joining prompt's rows share one). */
enum { KVR_MAX = 24 };
typedef struct {
    int B;
    void *hk[2][KVR_MAX], *hv[2][KVR_MAX], **td[2];
    float *qd[2], *kd[2], *vd[2], *od[2];
} kv_rows;

static void kvr_make(pt_backend *G, kv_rows *r, int B, const int *share, const uint8_t *init, size_t cbytes,
                     const float *q, const float *k, const float *v, int64_t nq, int64_t nk) {
    void *tab[2 * KVR_MAX];
    r->B = B;
    for (int w = 0; w < 2; w++) {
        for (int b = 0; b < B; b++) r->hk[w][b] = put(G, init, cbytes), r->hv[w][b] = put(G, init, cbytes);
        for (int b = 0; b < B; b++) tab[2 * b] = r->hk[w][share[b]], tab[2 * b + 1] = r->hv[w][share[b]];
        r->td[w] = put(G, tab, (size_t)B * 2 * sizeof(void *));
        r->qd[w] = put(G, q, nq * 4), r->kd[w] = put(G, k, nk * 4), r->vd[w] = put(G, v, nk * 4);
        r->od[w] = put(G, NULL, nq * 4);
    }
}

/* Every row's K and V cache bytes the same in both sets. */
static void kvr_caches_same(pt_backend *G, const kv_rows *r, uint8_t *ca, uint8_t *cb, size_t cbytes,
                            const char *what) {
    for (int b = 0; b < r->B; b++)
        for (int c = 0; c < 2; c++) {
            pt_status s = G->ops->download(G, ca, c ? r->hv[0][b] : r->hk[0][b], cbytes);
            if (s == PT_OK) s = G->ops->download(G, cb, c ? r->hv[1][b] : r->hk[1][b], cbytes);
            REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
            CHECK(!memcmp(ca, cb, cbytes), "%s row %d: %s cache bytes differ", what, b, c ? "v" : "k");
        }
}

static void kvr_free(pt_backend *G, kv_rows *r) {
    for (int w = 0; w < 2; w++) {
        G->ops->dealloc(G, r->qd[w]), G->ops->dealloc(G, r->kd[w]), G->ops->dealloc(G, r->vd[w]);
        G->ops->dealloc(G, r->od[w]), G->ops->dealloc(G, r->td[w]);
        for (int b = 0; b < r->B; b++) G->ops->dealloc(G, r->hk[w][b]), G->ops->dealloc(G, r->hv[w][b]);
    }
}

static void ra_check(pt_backend *G, int a, pt_ftype ft, const ra_case *rc, int *n_single, int *n_rows) {
    const int nh = rc->nh, nkv = rc->nkv, hd = rc->hd;
    const size_t esz = pt_ftype_size(ft), celems = (size_t)nkv * rc->cap * hd, cbytes = celems * esz;
    const int64_t nq = (int64_t)RA_ROWS * nh * hd, nk = (int64_t)RA_ROWS * nkv * hd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *oa = malloc(nq * 4), *ob = malloc(nq * 4);
    float *o1 = malloc(nq * 4); /* each row's output alone */
    int alone[RA_ROWS] = {0};
    uint8_t *init = malloc(cbytes), *ca = malloc(cbytes), *cb = malloc(cbytes);
    fill_act(q, nq, -2, 2, a);
    fill_act(k, nk, -2, 2, a);
    fill_act(v, nk, -2, 2, a);
    pt_rope rope;
    pt_attn p;
    pt_kv_layer shape;
    char what[160];
    ra_prepare(G, a, ft, rc, init, celems, &rope, &p, &shape, what, sizeof what);
    /* one sequence: each position alone (the padding row skipped) */
    for (int b = 0; b < RA_ROWS; b++) {
        if (ra_pos[b] < 0 || ra_pos[b] >= rc->cap + (rc->window ? 100000 : 0)) continue;
        const size_t qo = (size_t)b * nh * hd, ko = (size_t)b * nkv * hd;
        float *qd[2], *kd[2], *vd[2], *od[2];
        pt_kv_layer kv[2];
        int32_t *pd = put(G, &ra_pos[b], 4);
        for (int w = 0; w < 2; w++) {
            qd[w] = put(G, q + qo, nh * hd * 4), kd[w] = put(G, k + ko, nkv * hd * 4);
            vd[w] = put(G, v + ko, nkv * hd * 4), od[w] = put(G, NULL, nh * hd * 4);
            kv[w] = shape;
            kv[w].k = put(G, init, cbytes), kv[w].v = put(G, init, cbytes);
        }
        pt_status s = G->ops->rope_kv_attention(G, od[0], qd[0], kd[0], vd[0], 1, pd, &rope, &kv[0], NULL, &p);
        CHECK(s == PT_OK, "%s pos %d: rope_kv_attention answered %d (%s)", what, ra_pos[b], (int)s, pt_last_error());
        if (s == PT_OK) s = G->ops->rope_qk_kv_append(G, qd[1], kd[1], vd[1], 1, nh, nkv, hd, pd, &rope, &kv[1]);
        if (s == PT_OK) s = G->ops->attention(G, od[1], qd[1], 1, pd, &kv[1], &p);
        if (s == PT_OK) s = G->ops->download(G, oa, od[0], nh * hd * 4);
        if (s == PT_OK) s = G->ops->download(G, ob, od[1], nh * hd * 4);
        REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
        CHECK(!memcmp(oa, ob, nh * hd * 4), "%s pos %d: attention output differs", what, ra_pos[b]);
        memcpy(o1 + qo, oa, nh * hd * 4);
        alone[b] = 1;
        for (int c = 0; c < 2; c++) {
            s = G->ops->download(G, ca, c ? kv[0].v : kv[0].k, cbytes);
            if (s == PT_OK) s = G->ops->download(G, cb, c ? kv[1].v : kv[1].k, cbytes);
            REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
            CHECK(!memcmp(ca, cb, cbytes), "%s pos %d: %s cache bytes differ", what, ra_pos[b], c ? "v" : "k");
        }
        for (int w = 0; w < 2; w++) {
            G->ops->dealloc(G, qd[w]), G->ops->dealloc(G, kd[w]), G->ops->dealloc(G, vd[w]), G->ops->dealloc(G, od[w]);
            G->ops->dealloc(G, kv[w].k), G->ops->dealloc(G, kv[w].v);
        }
        G->ops->dealloc(G, pd);
        (*n_single)++;
    }
    /* batched rows through the table kvp, one launch sequence; rows 2 and 3 (positions 15 and 16) share row
     * 2's cache, as a joining prompt's rows do: row 3 must see row 2's new key */
    {
        int share[RA_ROWS];
        for (int b = 0; b < RA_ROWS; b++) share[b] = b == 3 ? 2 : b;
        kv_rows r;
        kvr_make(G, &r, RA_ROWS, share, init, cbytes, q, k, v, nq, nk);
        int32_t *pd = put(G, ra_pos, sizeof ra_pos);
        pt_status s = G->ops->rope_kv_attention(G, r.od[0], r.qd[0], r.kd[0], r.vd[0], RA_ROWS, pd, &rope, &shape,
                                                (void *const *)r.td[0], &p);
        CHECK(s == PT_OK, "%s rows: rope_kv_attention answered %d (%s)", what, (int)s, pt_last_error());
        if (s == PT_OK) s = G->ops->rope_qk(G, r.qd[1], r.kd[1], RA_ROWS, nh, nkv, hd, pd, &rope);
        if (s == PT_OK)
            s = G->ops->kv_append_rows(G, &shape, (void *const *)r.td[1], r.kd[1], r.vd[1], RA_ROWS, pd);
        if (s == PT_OK)
            s = G->ops->attention_rows(G, r.od[1], r.qd[1], RA_ROWS, pd, &shape, (void *const *)r.td[1], &p);
        if (s == PT_OK) s = G->ops->download(G, oa, r.od[0], nq * 4);
        if (s == PT_OK) s = G->ops->download(G, ob, r.od[1], nq * 4);
        REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
        CHECK(!memcmp(oa, ob, nq * 4), "%s rows: attention outputs differ", what);
        /* each row as it came alone (a block per query head there, per KV head here): the same bits; row 3
         * sees row 2's new key only in the batch */
        for (int b = 0; b < RA_ROWS; b++)
            if (alone[b] && b != 3)
                CHECK(!memcmp(oa + (size_t)b * nh * hd, o1 + (size_t)b * nh * hd, nh * hd * 4),
                      "%s row %d (pos %d): the batched output differs from the row's alone", what, b, ra_pos[b]);
        kvr_caches_same(G, &r, ca, cb, cbytes, what);
        kvr_free(G, &r);
        G->ops->dealloc(G, pd);
        (*n_rows)++;
    }
    G->ops->dealloc(G, (void *)rope.inv_freq);
    free(q), free(k), free(v), free(oa), free(ob), free(o1), free(init), free(ca), free(cb);
}

static void test_rope_kv_attention_bits(void) {
    if (!gpu_usable("rope_kv_attention")) TEST_SKIP("no GPU");
    static const ra_case cs[] = {
        {32, 8, 64, 64, 0, RA_CTX, 0.f, 0},   /* llama-3.2-1b */
        {32, 8, 128, 128, 0, RA_CTX, 0.f, 0}, /* llama-3.1-8b */
        {8, 1, 256, 128, 0, RA_CTX, 30.f, 0}, /* GQA 8, head 256, partial rotary, soft-cap */
        {6, 2, 80, 40, 50, 64, 0.f, 0},       /* a ring of 64 under a window of 50 */
        {4, 4, 128, 64, 0, RA_CTX, 0.f, 0},   /* no GQA */
    };
    int n_single = 0, n_rows = 0;
    for (int a = 0; a < 2; a++) {
        pt_backend *G = NULL;
        REQUIRE(gpu_backend_create(&G, a ? PT_ACT_BF16 : PT_ACT_F32), "cuda backend");
        pt_backend_limits lim = {.max_tokens = 8, .max_ctx = RA_CTX, .max_heads = 32, .max_head_dim = 256,
                                 .max_rows = RA_ROWS};
        REQUIRE(G->ops->reserve(G, &lim) == PT_OK, "reserve: %s", pt_last_error());
        for (int dt = 0; dt < 3; dt++)
            for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) ra_check(G, a, (pt_ftype)dt, &cs[ci], &n_single, &n_rows);
        pt_backend_free(&G);
    }
    printf("INFO rope_kv_attention: %d one-sequence and %d batched cases bit-identical to the separate calls\n",
           n_single, n_rows);
}

/* ---- the one-block short decode (attention_short.cu) vs the three kernels ----
 * rope_kv_attention of one sequence with pt_attn.max_keys set (the step's
 * bound: the one-block form where the shape allows it) against max_keys 0
 * (the split kernels): the outputs and every byte of both caches identical,
 * at split counts 1 to 16, splits of 16 to 64 keys (caches of 64 to 2048
 * rows) and the positions around each split boundary. A bound the row exceeds is reported (PT_ERR_INTERNAL, the
 * caches untouched) and the backend goes on. */
static const int32_t rs_pos[] = {0, 1, 2, 7, 14, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 127, 128, 129,
                                 150, 191, 192, 200, 239, 240, 254, 255};

static void rs_check(pt_backend *G, int a, pt_ftype ft, const ra_case *rc, int heads, int *n_cases, int *n_lies) {
    const int nh = rc->nh, nkv = rc->nkv, hd = rc->hd;
    const size_t esz = pt_ftype_size(ft), celems = (size_t)nkv * rc->cap * hd, cbytes = celems * esz;
    const int nq = nh * hd, nk = nkv * hd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *oa = malloc(nq * 4), *ob = malloc(nq * 4);
    uint8_t *init = malloc(cbytes), *ca = malloc(cbytes), *cb = malloc(cbytes);
    pt_rope rope;
    pt_attn p;
    pt_kv_layer shape;
    char what[160];
    ra_prepare(G, a, ft, rc, init, celems, &rope, &p, &shape, what, sizeof what);
    for (size_t pi = 0; pi < sizeof rs_pos / sizeof rs_pos[0]; pi++) {
        const int32_t pos = rs_pos[pi];
        if (!rc->window && pos >= rc->cap) continue; /* a full cache: the forward pass never gets here */
        fill_act(q, nq, -2, 2, a);
        fill_act(k, nk, -2, 2, a);
        fill_act(v, nk, -2, 2, a);
        float *qd[2], *kd[2], *vd[2], *od[2];
        pt_kv_layer kv[2];
        int32_t *pd = put(G, &pos, 4);
        for (int w = 0; w < 2; w++) {
            qd[w] = put(G, q, nq * 4), kd[w] = put(G, k, nk * 4), vd[w] = put(G, v, nk * 4);
            od[w] = put(G, NULL, nq * 4);
            kv[w] = shape;
            kv[w].k = put(G, init, cbytes), kv[w].v = put(G, init, cbytes);
        }
        pt_attn ps = p;
        ps.max_keys = pi % 2 ? PT_DEC_SHORT_KEYS : pos + 1; /* a captured step's bound, an eager step's */
        pt_status s = G->ops->rope_kv_attention(G, od[0], qd[0], kd[0], vd[0], 1, pd, &rope, &kv[0], NULL, &ps);
        if (s == PT_OK) s = G->ops->rope_kv_attention(G, od[1], qd[1], kd[1], vd[1], 1, pd, &rope, &kv[1], NULL, &p);
        if (s == PT_OK) s = G->ops->download(G, oa, od[0], nq * 4);
        if (s == PT_OK) s = G->ops->download(G, ob, od[1], nq * 4);
        REQUIRE(s == PT_OK, "%s pos %d: %s", what, pos, pt_last_error());
        CHECK(!memcmp(oa, ob, nq * 4), "%s pos %d: the one-block output differs from the split kernels'", what, pos);
        for (int c = 0; c < 2; c++) {
            s = G->ops->download(G, ca, c ? kv[0].v : kv[0].k, cbytes);
            if (s == PT_OK) s = G->ops->download(G, cb, c ? kv[1].v : kv[1].k, cbytes);
            REQUIRE(s == PT_OK, "cuda: %s", pt_last_error());
            CHECK(!memcmp(ca, cb, cbytes), "%s pos %d: %s cache bytes differ", what, pos, c ? "v" : "k");
        }
        for (int w = 0; w < 2; w++) {
            G->ops->dealloc(G, qd[w]), G->ops->dealloc(G, kd[w]), G->ops->dealloc(G, vd[w]), G->ops->dealloc(G, od[w]);
            G->ops->dealloc(G, kv[w].k), G->ops->dealloc(G, kv[w].v);
        }
        G->ops->dealloc(G, pd);
        (*n_cases)++;
    }
    /* a bound the row exceeds: an error naming the row's keys, the caches as they were. The bound is the most
     * the one-block form takes with 16 splits or more: 256 keys where a key row is at most 16 chunks of 16
     * bytes (one warp a split), 128 at 32 chunks. Head 256 at GQA 8 in a block per KV head (32 p·V tasks
     * of 8 heads' partial outputs) needs more shared memory than a block has: not taken there, nothing to
     * report; a block per query head holds one head's. */
    const int chunks = hd * (int)esz / 16;
    if (rc->cap >= 1024 && !rc->window && chunks <= 32 && (heads ? 1 : nh / nkv) * hd <= 1024) {
        const int bound = chunks <= 16 ? PT_DEC_SHORT_KEYS : 128;
        const int32_t pos = bound + 43;
        float *qd = put(G, q, nq * 4), *kd = put(G, k, nk * 4), *vd = put(G, v, nk * 4), *od = put(G, NULL, nq * 4);
        int32_t *pd = put(G, &pos, 4);
        pt_kv_layer kv = shape;
        kv.k = put(G, init, cbytes), kv.v = put(G, init, cbytes);
        pt_attn ps = p;
        ps.max_keys = bound;
        char keys[32];
        snprintf(keys, sizeof keys, "%d keys", pos + 1);
        pt_status s = G->ops->rope_kv_attention(G, od, qd, kd, vd, 1, pd, &rope, &kv, NULL, &ps);
        if (s == PT_OK) s = G->ops->download(G, oa, od, nq * 4);
        CHECK(s == PT_ERR_INTERNAL && strstr(pt_last_error(), keys),
              "%s: a row of %d keys under a bound of %d answered %d (%s)", what, pos + 1, bound, (int)s,
              pt_last_error());
        s = G->ops->download(G, ca, kv.k, cbytes);
        if (s == PT_OK) s = G->ops->download(G, cb, kv.v, cbytes);
        REQUIRE(s == PT_OK, "%s: the backend after the reported bound: %s", what, pt_last_error());
        CHECK(!memcmp(ca, init, cbytes) && !memcmp(cb, init, cbytes), "%s: the caches changed under a wrong bound",
              what);
        G->ops->dealloc(G, qd), G->ops->dealloc(G, kd), G->ops->dealloc(G, vd), G->ops->dealloc(G, od);
        G->ops->dealloc(G, pd), G->ops->dealloc(G, kv.k), G->ops->dealloc(G, kv.v);
        (*n_lies)++;
    }
    G->ops->dealloc(G, (void *)rope.inv_freq);
    free(q), free(k), free(v), free(oa), free(ob), free(init), free(ca), free(cb);
}

static void test_rope_kv_attention_short_bits(void) {
    if (!gpu_usable("rope_kv_attention short")) TEST_SKIP("no GPU");
    static const ra_case cs[] = {
        {32, 8, 64, 64, 0, RA_CTX, 0.f, 0},   /* llama-3.2-1b */
        {32, 8, 128, 128, 0, RA_CTX, 0.f, 0}, /* llama-3.1-8b */
        {32, 4, 128, 128, 0, RA_CTX, 0.f, 0}, /* qwen3-30b-a3b: GQA 8 */
        {8, 1, 256, 128, 0, RA_CTX, 30.f, 0}, /* GQA 8, head 256, partial rotary, soft-cap */
        {6, 2, 80, 40, 50, 64, 0.f, 0},       /* a ring of 64 under a window of 50 */
        {4, 4, 128, 64, 0, RA_CTX, 0.f, 0},   /* no GQA */
        {16, 8, 32, 32, 0, 512, 0.f, 0},      /* head 32: 4 chunks a row in bf16; 8 splits */
        {32, 8, 128, 128, 0, 128, 0.f, 0},    /* a 128-token context (petrel bench tg128): 2 splits of up to 64 */
        {32, 4, 128, 128, 0, 256, 0.f, 0},    /* 4 splits, GQA 8 */
    };
    /* the block per KV head and per query head (PETREL_CUDA_DEC_SHORT_HEADS), the key and value rows staged
     * in shared memory or read from the cache (PETREL_CUDA_DEC_SHORT_STAGE), read when a backend is made; a
     * block per query head of the fewest warps that hold the bound's tasks (4, 8 or 16: every size runs, the
     * eager bounds pos + 1 small, 256 large), of at least 8 or always 16 (pt_cuda_dec_short_warps) */
    static const char *forms[][3] = {{"0", "2", "0"}, {"1", "2", "0"}, {"1", "1", "0"},
                                     {"0", "0", "0"}, {"1", "2", "16"}, {"1", "0", "8"}};
    int n_cases = 0, n_lies = 0;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        const int warps = atoi(forms[f][2]), per_q = forms[f][0][0] == '1';
        pt_cuda_dec_short_warps(warps);
        unsigned long long nw0[3], nw[3];
        for (int i = 0; i < 3; i++) nw0[i] = pt_cuda_dec_short_fold_count(4 << i);
        for (int a = 0; a < 2; a++) {
            setenv("PETREL_CUDA_DEC_SHORT_HEADS", forms[f][0], 1);
            setenv("PETREL_CUDA_DEC_SHORT_STAGE", forms[f][1], 1);
            pt_backend *G = NULL;
            REQUIRE(gpu_backend_create(&G, a ? PT_ACT_BF16 : PT_ACT_F32), "cuda backend");
            pt_backend_limits lim = {.max_tokens = 8, .max_ctx = RA_CTX, .max_heads = 32, .max_head_dim = 256,
                                     .max_rows = 1};
            REQUIRE(G->ops->reserve(G, &lim) == PT_OK, "reserve: %s", pt_last_error());
            for (int dt = 0; dt < 3; dt++)
                for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
                    rs_check(G, a, (pt_ftype)dt, &cs[ci], per_q, &n_cases, &n_lies);
            pt_backend_free(&G);
        }
        /* which block sizes ran (a block per KV head of G > 1 heads is always 16 warps) */
        for (int i = 0; i < 3; i++) nw[i] = pt_cuda_dec_short_fold_count(4 << i) - nw0[i];
        CHECK(nw[2] > 0, "form %zu: no launch of 16 warps", f);
        if (warps)
            CHECK(nw[0] == 0 && (warps == 16 ? nw[1] == 0 : nw[1] > 0), "form %zu: at least %d warps: launches of 4 "
                  "/ 8 warps %llu / %llu", f, warps, nw[0], nw[1]);
        else if (per_q)
            CHECK(nw[0] > 0 && nw[1] > 0, "form %zu: launches of 4 / 8 warps %llu / %llu", f, nw[0], nw[1]);
    }
    pt_cuda_dec_short_warps(0);
    unsetenv("PETREL_CUDA_DEC_SHORT_HEADS");
    unsetenv("PETREL_CUDA_DEC_SHORT_STAGE");
    printf("INFO rope_kv_attention short: %d steps (6 forms) bit-identical to the split kernels, %d wrong bounds "
           "reported\n",
           n_cases, n_lies);
}

/* ---- the one-block short decode over batched rows vs the three kernels ----
 * rope_kv_attention over rows through the K/V pointer table with
 * pt_attn.max_keys set (a captured batched step's bound, 256 or 128: the
 * one-block form with 16 or 8 warps a block, a block per (row, KV head))
 * against max_keys 0 (the split kernels): every row's output and every
 * byte of every cache identical. The rows: positions around the split
 * boundaries up to the bound, a padding row, and two rows sharing a cache
 * as a joining prompt's rows do (the second must see the first's new key).
 * A row past the bound is reported (PT_ERR_INTERNAL naming its keys) and
 * the backend goes on, where the bound took the one-block form; where it
 * did not (some row under it would have more scores tasks than a block has
 * warps), the split kernels compute that row as without the bound. */
static const int32_t rr_pos[] = {0, 1, 15, 16, 17, 33, 63, 64, 100, 126, -1, 127, 128, 129, 200, 254};
enum { RR_MAX = (int)(sizeof rr_pos / sizeof rr_pos[0]) + 1 };
_Static_assert((int)RR_MAX <= (int)KVR_MAX && (int)RA_ROWS <= (int)KVR_MAX, "kv_rows holds the batches");

static void rr_check(pt_backend *G, int a, pt_ftype ft, const ra_case *rc, int bound, int *n_cases, int *n_lies) {
    const int nh = rc->nh, nkv = rc->nkv, hd = rc->hd;
    const size_t esz = pt_ftype_size(ft), celems = (size_t)nkv * rc->cap * hd, cbytes = celems * esz;
    int32_t pos[RR_MAX];
    int share[RR_MAX], B = 0;
    for (size_t i = 0; i < sizeof rr_pos / sizeof rr_pos[0]; i++) {
        const int32_t p = rr_pos[i];
        if (p + 1 > bound || (!rc->window && p >= rc->cap)) continue;
        share[B] = B, pos[B++] = p;
        if (p == 15 && p + 2 <= bound) share[B] = B - 1, pos[B] = p + 1, B++; /* the next row on the same cache */
    }
    const int64_t nq = (int64_t)B * nh * hd, nk = (int64_t)B * nkv * hd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *oa = malloc(nq * 4), *ob = malloc(nq * 4);
    uint8_t *init = malloc(cbytes), *ca = malloc(cbytes), *cb = malloc(cbytes);
    fill_act(q, nq, -2, 2, a);
    fill_act(k, nk, -2, 2, a);
    fill_act(v, nk, -2, 2, a);
    pt_rope rope;
    pt_attn p;
    pt_kv_layer shape;
    char what[200];
    ra_prepare(G, a, ft, rc, init, celems, &rope, &p, &shape, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what), " bound %d", bound);
    kv_rows r;
    kvr_make(G, &r, B, share, init, cbytes, q, k, v, nq, nk);
    int32_t *pd = put(G, pos, B * 4);
    pt_attn pb = p;
    pb.max_keys = bound;
    pt_status s = G->ops->rope_kv_attention(G, r.od[0], r.qd[0], r.kd[0], r.vd[0], B, pd, &rope, &shape,
                                            (void *const *)r.td[0], &pb);
    if (s == PT_OK)
        s = G->ops->rope_kv_attention(G, r.od[1], r.qd[1], r.kd[1], r.vd[1], B, pd, &rope, &shape,
                                      (void *const *)r.td[1], &p);
    if (s == PT_OK) s = G->ops->download(G, oa, r.od[0], nq * 4);
    if (s == PT_OK) s = G->ops->download(G, ob, r.od[1], nq * 4);
    REQUIRE(s == PT_OK, "%s: %s", what, pt_last_error());
    for (int b = 0; b < B; b++)
        CHECK(!memcmp(oa + (size_t)b * nh * hd, ob + (size_t)b * nh * hd, nh * hd * 4),
              "%s row %d (pos %d): the one-block output differs from the split kernels'", what, b, pos[b]);
    kvr_caches_same(G, &r, ca, cb, cbytes, what);
    (*n_cases)++;
    /* a row past what the launch takes (the rows' bound set too low; one past PT_DEC_SHORT_KEYS, which no
     * one-block launch holds): reported, naming the row's keys, where the launch took the one-block form;
     * where it did not (the launch decides from the shape, the bound and the row count), the split kernels
     * compute the row as they do without the bound. */
    const int big = PT_DEC_SHORT_KEYS + 8;
    if (!rc->window && big < rc->cap && B > 1) {
        int32_t lie[2] = {pos[0], big - 1};
        int32_t *ld = put(G, lie, sizeof lie);
        char keys[32];
        snprintf(keys, sizeof keys, "%d keys", big);
        const unsigned long long ob0 = pt_cuda_dec_short_rows_count();
        s = G->ops->rope_kv_attention(G, r.od[0], r.qd[0], r.kd[0], r.vd[0], 2, ld, &rope, &shape,
                                      (void *const *)r.td[0], &pb);
        const int one_block = pt_cuda_dec_short_rows_count() > ob0; /* the launch took the one-block form */
        if (s == PT_OK) s = G->ops->download(G, oa, r.od[0], 2 * nh * hd * 4);
        if (one_block) {
            CHECK(s == PT_ERR_INTERNAL && strstr(pt_last_error(), keys),
                  "%s: a row of %d keys under a bound of %d answered %d (%s)", what, big, bound, (int)s,
                  pt_last_error());
            (*n_lies)++;
        } else {
            CHECK(s == PT_OK, "%s: a row of %d keys under a bound of %d the split kernels take: %s", what, big,
                  bound, pt_last_error());
            s = G->ops->rope_kv_attention(G, r.od[1], r.qd[0], r.kd[0], r.vd[0], 2, ld, &rope, &shape,
                                          (void *const *)r.td[0], &p);
            if (s == PT_OK) s = G->ops->download(G, ob, r.od[1], 2 * nh * hd * 4);
            CHECK(s == PT_OK && !memcmp(oa, ob, 2 * (size_t)nh * hd * 4),
                  "%s: a row of %d keys under a bound of %d the split kernels take differs from the unbounded call "
                  "(%s)", what, big, bound, pt_last_error());
        }
        REQUIRE(G->ops->download(G, ca, r.hk[0][0], cbytes) == PT_OK, "%s: the backend after the row past the "
                "bound: %s", what, pt_last_error());
        G->ops->dealloc(G, ld);
    }
    kvr_free(G, &r);
    G->ops->dealloc(G, pd);
    G->ops->dealloc(G, (void *)rope.inv_freq);
    free(q), free(k), free(v), free(oa), free(ob), free(init), free(ca), free(cb);
}

static void test_rope_kv_attention_short_rows_bits(void) {
    if (!gpu_usable("rope_kv_attention short rows")) TEST_SKIP("no GPU");
    static const ra_case cs[] = {
        {32, 8, 64, 64, 0, 1024, 0.f, 1},      /* llama-3.2-1b, a server's 1024-token context */
        {32, 8, 128, 128, 0, 1024, 0.f, 1},    /* llama-3.1-8b */
        {24, 8, 128, 128, 0, 1024, 0.f, 1},    /* llama-3.2-3b: GQA 3 */
        {16, 8, 128, 128, 0, 1024, 0.f, 1},    /* qwen3-1.7b: GQA 2 */
        {32, 32, 96, 96, 0, 1024, 0.f, -1},    /* phi-3-mini: GQA 1, rows of 12 chunks, 9 splits */
        {32, 8, 128, 128, 0, RA_CTX, 0.f, 1},  /* 16 splits of up to 128 keys */
        {32, 4, 128, 128, 0, RA_CTX, 0.f, -1}, /* qwen3-30b-a3b: GQA 8 */
        {8, 1, 256, 128, 0, RA_CTX, 30.f, -1}, /* GQA 8, head 256, partial rotary, soft-cap */
        {6, 2, 80, 40, 50, 64, 0.f, -1},       /* a ring of 64 under a window of 50 */
        {16, 8, 32, 32, 0, 512, 0.f, -1},      /* head 32: 4 chunks a row in bf16; 8 splits */
        {32, 8, 128, 128, 0, 128, 0.f, -1},    /* 2 splits of up to 64 */
    };
    /* a block per (row, KV head) or per (row, query head) (PETREL_CUDA_DEC_SHORT_ROWS_HEADS), the key and
     * value rows read from the cache or staged (PETREL_CUDA_DEC_SHORT_ROWS_STAGE: 2 the block's rows, 4 each
     * warp its split's, where the splits fit), the blocks per (row, KV head) in the build for their plain or
     * twice their blocks an SM as the launch's size decides, or the dense one always
     * (pt_cuda_dec_short_rows_minb); where every split of the bound is one task, the blocks per (row, KV
     * head) unstaged run dec_rows1_kernel unless it is switched off (pt_cuda_dec_rows1(0): the generic kernel):
     * checked case by case under the 256-key bound (16-warp blocks, so a block per KV head unless the form
     * asks for one per query head) */
    static const char *forms[][4] = {{"0", "0", "0", "1"}, {"1", "0", "0", "1"}, {"0", "2", "0", "1"},
                                     {"0", "0", "4", "1"}, {"0", "4", "0", "1"}, {"0", "4", "4", "1"},
                                     {"1", "4", "0", "1"}, {"0", "0", "0", "0"}, {"0", "0", "4", "0"}};
    const int n_forms = (int)(sizeof forms / sizeof forms[0]);
    int n_cases = 0, n_lies = 0;
    for (int f = 0; f < n_forms; f++) {
        const unsigned long long sp0 = pt_cuda_dec_short_split_count(), r10 = pt_cuda_dec_rows1_count();
        for (int a = 0; a < 2; a++) {
            setenv("PETREL_CUDA_DEC_SHORT_ROWS_HEADS", forms[f][0], 1);
            setenv("PETREL_CUDA_DEC_SHORT_ROWS_STAGE", forms[f][1], 1);
            pt_cuda_dec_short_rows_minb(atoi(forms[f][2]));
            pt_cuda_dec_rows1(forms[f][3][0] != '0' ? -1 : 0);
            pt_backend *G = NULL;
            REQUIRE(gpu_backend_create(&G, a ? PT_ACT_BF16 : PT_ACT_F32), "cuda backend");
            pt_backend_limits lim = {.max_tokens = 8, .max_ctx = RA_CTX, .max_heads = 32, .max_head_dim = 256,
                                     .max_rows = RR_MAX};
            REQUIRE(G->ops->reserve(G, &lim) == PT_OK, "reserve: %s", pt_last_error());
            for (int dt = 0; dt < 3; dt++)
                for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
                    for (int bound = PT_DEC_SHORT_KEYS; bound >= PT_DEC_SHORT_KEYS / 2; bound /= 2) {
                        const ra_case *rc = &cs[ci];
                        const unsigned long long c0 = pt_cuda_dec_rows1_count();
                        rr_check(G, a, (pt_ftype)dt, rc, bound, &n_cases, &n_lies);
                        if (bound != PT_DEC_SHORT_KEYS || !rc->r1) continue;
                        /* the one-task-split kernel ran for this case exactly where the rule takes it: the
                         * 16-bit caches, GQA 2 to 4, heads of 5 to 16 chunks, every split one task, a block
                         * per (row, KV head), unstaged, switched on */
                        const unsigned long long c1 = pt_cuda_dec_rows1_count() - c0;
                        const int want = rc->r1 > 0 && dt != PT_FT_F32 && forms[f][0][0] == '0' &&
                                         forms[f][1][0] == '0' && forms[f][3][0] != '0';
                        CHECK(want ? c1 > 0 : c1 == 0,
                              "form %d act %d dtype %d nh %d nkv %d hd %d: %llu launches of the one-task-split kernel",
                              f, a, dt, rc->nh, rc->nkv, rc->hd, c1);
                    }
            pt_backend_free(&G);
        }
        /* the split staging ran where asked (the 16-bit caches of heads up to 128 fit it), and only there */
        const unsigned long long sp = pt_cuda_dec_short_split_count() - sp0;
        CHECK(forms[f][1][0] == '4' ? sp > 0 : sp == 0, "form %d: %llu launches staged by split", f, sp);
        /* a block per query head, staged or switched off, the one-task-split kernel never ran */
        const unsigned long long r1 = pt_cuda_dec_rows1_count() - r10;
        if (forms[f][0][0] != '0' || forms[f][1][0] != '0' || forms[f][3][0] == '0')
            CHECK(r1 == 0, "form %d: %llu launches of the one-task-split kernel", f, r1);
    }
    pt_cuda_dec_rows1(-1);
    unsetenv("PETREL_CUDA_DEC_SHORT_ROWS_HEADS");
    unsetenv("PETREL_CUDA_DEC_SHORT_ROWS_STAGE");
    pt_cuda_dec_short_rows_minb(0);
    printf("INFO rope_kv_attention short rows: %d batches (%d forms) bit-identical to the split kernels, %d wrong "
           "bounds reported\n",
           n_cases, n_forms, n_lies);
}

int main(void) {
    /* the one-launch short decode for every GQA group size it takes in both head groupings (with a block
     * per KV head the default takes it only up to 4 query heads per KV head) */
    setenv("PETREL_CUDA_DEC_SHORT", "2", 0);
    /* a block per query head in the split kernels of one sequence (by default only where the grid needs
     * them): ra_check's rows alone against the same rows batched (a block per KV head) */
    setenv("PETREL_CUDA_DEC_HEADS", "1", 0);
    TEST_RUN(test_rope_kv_bits);
    TEST_RUN(test_rope_kv_attention_bits);
    TEST_RUN(test_rope_kv_attention_short_bits);
    TEST_RUN(test_rope_kv_attention_short_rows_bits);
    teardown();
    return test_summary();
}
