/* rope_qk_kv_append (src/backend/cuda/rope.cu): RoPE on q and k plus the
 * cache write of k and v in one launch, bit for bit against CUDA's own
 * rope_qk followed by kv_append — q, k and the whole cache (every byte,
 * rows written and rows left alone) — for f32, bf16 and f16 caches, both
 * activation modes, full and partial rotary dims, GQA, T = 1 (decode) and
 * T = 7, positions wrapping a ring of 16 rows; and the cache rows against
 * the CPU's rope + kv_append within tolerance. Not the attention over the
 * cache (test_cuda_ops.c). */
#include "cuda/op_check.h"

#include <stdlib.h>
#include <string.h>

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
                const int nh = cs[ci].nh, nkv = cs[ci].nkv, hd = cs[ci].hd, T = cs[ci].T, half = cs[ci].rot / 2;
                const int64_t nq = (int64_t)T * nh * hd, nk = (int64_t)T * nkv * hd, ncache = nkv * cap * hd;
                const pt_ftype ft = (pt_ftype)dt;
                const size_t esz = pt_ftype_size(ft), cbytes = (size_t)ncache * esz;
                float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), inv[128];
                float *qa = malloc(nq * 4), *ka = malloc(nk * 4), *qb = malloc(nq * 4), *kb = malloc(nk * 4);
                uint8_t *ca = malloc(cbytes * 2), *cb = malloc(cbytes * 2), *init = malloc(cbytes);
                int32_t pos[8];
                for (int i = 0; i < half; i++) inv[i] = powf(10000.0f, -2.0f * i / cs[ci].rot);
                for (int t = 0; t < T; t++) pos[t] = cs[ci].p0 + t; /* p0 12, T 7: wraps the ring of 16 */
                fill_act(q, nq, -2, 2, a);
                fill_act(k, nk, -2, 2, a);
                fill_act(v, nk, -2, 2, a);
                for (size_t i = 0; i < cbytes; i++) init[i] = (uint8_t)(ru32() & 0x3f); /* finite garbage */
                float *invd = put(G, inv, half * 4);
                int32_t *pd = put(G, pos, sizeof pos);
                pt_rope rg = {cs[ci].rot, invd, 1.0f};
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

int main(void) {
    TEST_RUN(test_rope_kv_bits);
    teardown();
    return test_summary();
}
