/* CUDA rms_norm (register and strided kernels, fused residual add) and
 * rope_qk against the CPU reference, plus the bit-exactness the decode paths
 * rely on: a norm row's bits do not depend on T (batched vs single rows), on
 * the buffers' alignment (float4 vs scalar accesses), or on whether the
 * residual add ran fused or as its own add; rope_qk equals rope on q then k,
 * bit for bit. Not the other ops (test_cuda_ops.c). */
#include "cuda/op_check.h"

#include <stdlib.h>
#include <string.h>

static int same_bits(const char *what, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) {
            CHECK(0, "%s: element %lld of %lld differs: %.9g vs %.9g", what, (long long)i, (long long)n, a[i], b[i]);
            return 0;
        }
    return 1;
}

static void *make_w(pt_ftype t, int64_t D) {
    void *w = malloc(D * 4);
    for (int64_t i = 0; i < D; i++) {
        float v = rf(-1.5f, 1.5f);
        if (t == PT_FT_F32) ((float *)w)[i] = v;
        else if (t == PT_FT_BF16) ((uint16_t *)w)[i] = pt_f32_to_bf16(v);
        else ((uint16_t *)w)[i] = pt_f32_to_f16(v);
    }
    return w;
}

/* Every row length class: one warp (33, 64), odd (67, 2051), float4 rows of
 * 1, 2, 4 and 8 chunks per thread (2048 .. 16384), and the strided kernel
 * beyond (16388, 20001). */
static void test_rms_norm_vs_cpu(void) {
    NEED_GPU();
    static const int64_t Ds[] = {33, 64, 67, 128, 2048, 2051, 4096, 5376, 8192, 16384, 16388, 20001};
    const int nD = sizeof Ds / sizeof Ds[0];
    for (int a = 0; a < 2; a++)
        for (int di = 0; di < nD; di++)
            for (int st = 0; st < 4; st++)
                for (int res = 0; res < 2; res++) {
                    pt_backend *G = G_[a], *C = C_[a];
                    const pt_ftype wt = (pt_ftype)((di + st) % 3);
                    const int64_t T = 3, D = Ds[di], n = T * D;
                    float *x = malloc(n * 4), *rc = malloc(n * 4), *yc = malloc(n * 4), *yg = malloc(n * 4),
                          *rg = malloc(n * 4);
                    void *w = make_w(wt, D);
                    fill_act(x, n, -3, 3, a);
                    fill_act(rc, n, -3, 3, a);
                    float *xd = put(G, x, n * 4), *rd = put(G, rc, n * 4), *yd = put(G, NULL, n * 4);
                    void *wd = put(G, w, D * pt_ftype_size(wt));
                    C->ops->rms_norm(C, yc, x, res ? rc : NULL, T, D, w, wt, (pt_rms_style)st, 1e-5f);
                    pt_status s = G->ops->rms_norm(G, yd, xd, res ? rd : NULL, T, D, wd, wt, (pt_rms_style)st, 1e-5f);
                    if (s == PT_OK) s = G->ops->download(G, yg, yd, n * 4);
                    if (s == PT_OK) s = G->ops->download(G, rg, rd, n * 4);
                    CHECK(s == PT_OK, "cuda rms_norm: %s", pt_last_error());
                    char what[96];
                    snprintf(what, sizeof what, "rms_norm act=%d D=%lld style=%d wt=%d res=%d", a, (long long)D, st,
                             (int)wt, res);
                    int ok = compare(what, yg, yc, n, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-5);
                    if (res) ok = ok && compare("residual", rg, rc, n, 0, 0);
                    G->ops->dealloc(G, xd), G->ops->dealloc(G, rd), G->ops->dealloc(G, yd), G->ops->dealloc(G, wd);
                    free(x), free(rc), free(yc), free(yg), free(rg), free(w);
                    if (!ok) return;
                }
    REPORT();
}

/* Same values through different paths, compared bit for bit on the GPU:
 * T rows at once vs one row at a time, aligned (float4) vs shifted by one
 * float (scalar), fused residual vs add + norm. */
static void test_rms_norm_bits(void) {
    NEED_GPU();
    static const int64_t Ds[] = {64, 128, 2048, 4096, 8192, 16384, 20000};
    for (int a = 0; a < 2; a++)
        for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
            pt_backend *G = G_[a];
            const int64_t T = 4, D = Ds[di], n = T * D;
            float *x = malloc(n * 4), *r = malloc(n * 4), *y0 = malloc(n * 4), *y1 = malloc(n * 4),
                  *r0 = malloc(n * 4), *r1 = malloc(n * 4);
            void *w = make_w(PT_FT_BF16, D);
            fill_act(x, n, -4, 4, a);
            fill_act(r, n, -4, 4, a);
            void *wd = put(G, w, D * 2);
            /* shifted copies: base + 1 float, so no row is 16-byte aligned */
            float *xd = put(G, x, n * 4), *rd = put(G, r, n * 4), *yd = put(G, NULL, n * 4);
            float *xs = put(G, NULL, (n + 1) * 4), *rs = put(G, NULL, (n + 1) * 4), *ys = put(G, NULL, (n + 1) * 4);
            pt_status s = G->ops->upload(G, xs + 1, x, n * 4);
            if (s == PT_OK) s = G->ops->upload(G, rs + 1, r, n * 4);
            /* reference: all T rows, aligned, fused */
            if (s == PT_OK) s = G->ops->rms_norm(G, yd, xd, rd, T, D, wd, PT_FT_BF16, PT_RMS_W, 1e-6f);
            if (s == PT_OK) s = G->ops->download(G, y0, yd, n * 4);
            if (s == PT_OK) s = G->ops->download(G, r0, rd, n * 4);
            /* shifted, one row at a time, fused */
            for (int64_t t = 0; t < T && s == PT_OK; t++)
                s = G->ops->rms_norm(G, ys + 1 + t * D, xs + 1 + t * D, rs + 1 + t * D, 1, D, wd, PT_FT_BF16,
                                     PT_RMS_W, 1e-6f);
            if (s == PT_OK) s = G->ops->download(G, y1, ys + 1, n * 4);
            if (s == PT_OK) s = G->ops->download(G, r1, rs + 1, n * 4);
            CHECK(s == PT_OK, "cuda rms_norm: %s", pt_last_error());
            char what[96];
            snprintf(what, sizeof what, "act=%d D=%lld rows one by one, unaligned", a, (long long)D);
            int ok = same_bits(what, y1, y0, n) && same_bits("residual", r1, r0, n);
            /* the add as its own op, then the plain norm */
            if (ok) {
                s = G->ops->upload(G, rd, r, n * 4);
                if (s == PT_OK) s = G->ops->add(G, rd, rd, xd, n);
                if (s == PT_OK) s = G->ops->rms_norm(G, yd, rd, NULL, T, D, wd, PT_FT_BF16, PT_RMS_W, 1e-6f);
                if (s == PT_OK) s = G->ops->download(G, y1, yd, n * 4);
                if (s == PT_OK) s = G->ops->download(G, r1, rd, n * 4);
                CHECK(s == PT_OK, "cuda add + rms_norm: %s", pt_last_error());
                snprintf(what, sizeof what, "act=%d D=%lld add + norm vs fused", a, (long long)D);
                ok = same_bits(what, y1, y0, n) && same_bits("residual", r1, r0, n);
            }
            G->ops->dealloc(G, xd), G->ops->dealloc(G, rd), G->ops->dealloc(G, yd), G->ops->dealloc(G, wd);
            G->ops->dealloc(G, xs), G->ops->dealloc(G, rs), G->ops->dealloc(G, ys);
            free(x), free(r), free(y0), free(y1), free(r0), free(r1), free(w);
            if (!ok) return;
        }
    REPORT();
}

/* rope_qk vs the CPU's rope on q then k (tolerance), and vs CUDA's own rope
 * on q then k (bits); k == NULL rotates q alone. */
static void test_rope_qk(void) {
    NEED_GPU();
    static const struct { int nh, nkv, hd, rot; float base, scale; int p0, with_k; } cs[] = {
        {32, 8, 64, 64, 500000, 1, 0, 1},  {3, 1, 128, 128, 10000, 1, 9000, 1}, {4, 2, 256, 64, 10000, 1.2f, 130000, 1},
        {5, 5, 80, 40, 1e6f, 1, 7, 1},     {6, 2, 64, 64, 10000, 1, 3, 0}};
    for (int a = 0; a < 2; a++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            pt_backend *G = G_[a], *C = C_[a];
            const int64_t T = 5, nq = T * cs[ci].nh * cs[ci].hd, nk = T * cs[ci].nkv * cs[ci].hd;
            const int half = cs[ci].rot / 2;
            float *q = malloc(nq * 4), *k = malloc(nk * 4), *qg = malloc(nq * 4), *kg = malloc(nk * 4),
                  *q2 = malloc(nq * 4), *k2 = malloc(nk * 4), inv[128];
            int32_t pos[5];
            for (int i = 0; i < half; i++) inv[i] = powf(cs[ci].base, -2.0f * i / cs[ci].rot);
            for (int t = 0; t < T; t++) pos[t] = cs[ci].p0 + t;
            fill_act(q, nq, -2, 2, a);
            fill_act(k, nk, -2, 2, a);
            float *qd = put(G, q, nq * 4), *kd = put(G, k, nk * 4), *qd2 = put(G, q, nq * 4), *kd2 = put(G, k, nk * 4);
            float *invd = put(G, inv, half * 4);
            int32_t *pd = put(G, pos, sizeof pos);
            pt_rope rc = {cs[ci].rot, inv, cs[ci].scale}, rg = {cs[ci].rot, invd, cs[ci].scale};
            C->ops->rope(C, q, T, cs[ci].nh, cs[ci].hd, pos, &rc);
            if (cs[ci].with_k) C->ops->rope(C, k, T, cs[ci].nkv, cs[ci].hd, pos, &rc);
            pt_status s = G->ops->rope_qk(G, qd, cs[ci].with_k ? kd : NULL, T, cs[ci].nh, cs[ci].nkv, cs[ci].hd, pd, &rg);
            if (s == PT_OK) s = G->ops->rope(G, qd2, T, cs[ci].nh, cs[ci].hd, pd, &rg);
            if (s == PT_OK && cs[ci].with_k) s = G->ops->rope(G, kd2, T, cs[ci].nkv, cs[ci].hd, pd, &rg);
            if (s == PT_OK) s = G->ops->download(G, qg, qd, nq * 4);
            if (s == PT_OK) s = G->ops->download(G, kg, kd, nk * 4);
            if (s == PT_OK) s = G->ops->download(G, q2, qd2, nq * 4);
            if (s == PT_OK) s = G->ops->download(G, k2, kd2, nk * 4);
            CHECK(s == PT_OK, "cuda rope_qk: %s", pt_last_error());
            char what[64];
            snprintf(what, sizeof what, "rope_qk act=%d case=%zu q", a, ci);
            int ok = compare(what, qg, q, nq, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-5);
            snprintf(what, sizeof what, "rope_qk act=%d case=%zu k", a, ci);
            ok = ok && compare(what, kg, k, nk, a ? 1e-2 : 1e-5, a ? 1e-2 : 1e-5); /* with_k 0: k untouched */
            ok = ok && same_bits("rope_qk vs rope q", qg, q2, nq) && same_bits("rope_qk vs rope k", kg, k2, nk);
            G->ops->dealloc(G, qd), G->ops->dealloc(G, kd), G->ops->dealloc(G, qd2), G->ops->dealloc(G, kd2);
            G->ops->dealloc(G, invd), G->ops->dealloc(G, pd);
            free(q), free(k), free(qg), free(kg), free(q2), free(k2);
            if (!ok) return;
        }
    REPORT();
}

int main(void) {
    TEST_RUN(test_rms_norm_vs_cpu);
    TEST_RUN(test_rms_norm_bits);
    TEST_RUN(test_rope_qk);
    teardown();
    return test_summary();
}
