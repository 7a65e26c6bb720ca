/* The pipelined flash prefill kernel (src/backend/cuda/flash_attn.cu,
 * flash2_prefill_kernel) against the kernel it replaces: the same tiling and
 * the same arithmetic in the same order, so the outputs must be equal bit
 * for bit (test_cuda_flash checks both against the CPU backend within L1).
 * Cases: the llama-3.1-8b shape (32 heads over 8 KV heads of 128) for a
 * 2048-token chunk from position 0 and a 512-token chunk after 1536
 * positions; head dims 32, 64, 80, 96; chunks of 2, 65 and 200 rows (partial
 * row blocks); sliding windows over a rotating cache (slot = position %
 * capacity) whose window starts inside a key tile; soft-cap. Every output
 * must be finite, and a second run of the new kernel gives the same bytes.
 *
 * Built only with CUDA=1 and run on the GPU machine by `make check-cuda`;
 * without a GPU it reports SKIP. */
#include "test.h"
#include "test_rand.h"

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void pt_cuda_flash_select(int v); /* flash_attn.cu: 1 the old kernel, 2 the pipelined one, -1 the environment */

typedef struct {
    int nh, nkv, hd;
    int64_t cap;
    int p0, T, window;
    float softcap;
} fcase;

/* One case: random bf16 K/V over the whole cache, random q; the old and
 * the new kernel's outputs compared bit for bit. */
static int run_case(pt_backend *G, const fcase *c) {
    const int64_t cn = (int64_t)c->nkv * c->cap * c->hd, qn = (int64_t)c->T * c->nh * c->hd;
    uint16_t *kh = malloc((size_t)cn * 2), *vh = malloc((size_t)cn * 2);
    float *q = malloc((size_t)qn * 4), *o1 = malloc((size_t)qn * 4), *o2 = malloc((size_t)qn * 4),
          *o3 = malloc((size_t)qn * 4);
    int32_t *pos = malloc((size_t)c->T * 4);
    for (int64_t i = 0; i < cn; i++) kh[i] = pt_f32_to_bf16(rf(-1.5f, 1.5f)), vh[i] = pt_f32_to_bf16(rf(-1, 1));
    fill_act(q, qn, -2, 2, 1);
    for (int t = 0; t < c->T; t++) pos[t] = c->p0 + t;
    pt_kv_layer kv = {.n_kv = c->nkv, .head_dim = c->hd, .capacity = c->cap, .dtype = PT_FT_BF16};
    kv.k = put(G, kh, (size_t)cn * 2), kv.v = put(G, vh, (size_t)cn * 2);
    float *qd = put(G, q, (size_t)qn * 4), *od = G->ops->alloc(G, (size_t)qn * 4);
    int32_t *pd = put(G, pos, (size_t)c->T * 4);
    pt_attn p = {.n_heads = c->nh, .head_dim = c->hd, .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                 .window = c->window};
    char what[160];
    snprintf(what, sizeof what, "nh=%d nkv=%d hd=%d cap=%lld p0=%d T=%d window=%d softcap=%g", c->nh, c->nkv, c->hd,
             (long long)c->cap, c->p0, c->T, c->window, c->softcap);
    int ok = kv.k && kv.v && qd && od && pd;
    CHECK(ok, "%s: device buffers", what);
    float *outs[3] = {o1, o2, o3};
    const int sel[3] = {1, 2, 2};
    for (int r = 0; r < 3 && ok; r++) {
        pt_cuda_flash_select(sel[r]);
        pt_status s = G->ops->attention(G, od, qd, c->T, pd, &kv, &p);
        if (s == PT_OK) s = G->ops->download(G, outs[r], od, (size_t)qn * 4);
        CHECK(s == PT_OK, "%s: attention (kernel %d): %s", what, sel[r], pt_last_error());
        ok = s == PT_OK;
    }
    pt_cuda_flash_select(-1);
    for (int64_t i = 0; i < qn && ok; i++) {
        if (!isfinite(o2[i])) {
            CHECK(0, "%s: element %lld not finite (%g)", what, (long long)i, o2[i]);
            ok = 0;
        } else if (memcmp(&o1[i], &o2[i], 4)) {
            const int64_t t = i / ((int64_t)c->nh * c->hd), h = i / c->hd % c->nh, d = i % c->hd;
            CHECK(0, "%s: token %lld head %lld dim %lld: old %.9g, pipelined %.9g", what, (long long)t, (long long)h,
                  (long long)d, o1[i], o2[i]);
            ok = 0;
        }
    }
    if (ok) CHECK(!memcmp(o2, o3, (size_t)qn * 4), "%s: a second run of the pipelined kernel differs", what);
    G->ops->dealloc(G, kv.k), G->ops->dealloc(G, kv.v), G->ops->dealloc(G, qd), G->ops->dealloc(G, od);
    G->ops->dealloc(G, pd);
    free(kh), free(vh), free(q), free(o1), free(o2), free(o3), free(pos);
    return ok && !test_failed_current;
}

static void test_flash2_bit_identical(void) {
    char why[512];
    if (pt_cuda_device_count(why, sizeof why) == 0) TEST_SKIP("no usable CUDA device here");
    pt_backend *G = NULL;
    pt_cuda_params gp = {0, PT_ACT_BF16};
    REQUIRE(pt_backend_cuda_create(&G, &gp) == PT_OK, "cuda backend: %s", pt_last_error());
    pt_backend_limits lim = {.max_tokens = 2048, .max_ctx = 4096, .max_heads = 32, .max_head_dim = 128,
                             .max_cols = 4096};
    REQUIRE(G->ops->reserve(G, &lim) == PT_OK, "reserve: %s", pt_last_error());
    static const fcase cs[] = {
        {32, 8, 128, 2049, 0, 2048, 0, 0},    /* llama-3.1-8b, pp2048 */
        {32, 8, 128, 2049, 1536, 512, 0, 0},  /* a chunk after 1536 positions */
        {8, 2, 128, 512, 0, 200, 0, 0},       /* four row blocks, the last partial */
        {8, 8, 64, 600, 300, 150, 0, 0},      /* MHA after 300 positions */
        {6, 3, 80, 300, 37, 100, 16, 0},      /* window 16, head_dim 80 */
        {4, 2, 96, 128, 0, 65, 0, 30.f},      /* one row in the second block, soft-cap */
        {2, 1, 32, 64, 10, 2, 0, 0},          /* two rows, head_dim 32 */
        {4, 1, 128, 200, 150, 64, 40, 50.f},  /* ring (wraps), window 40 starting mid-tile, soft-cap, GQA 4 */
        {8, 2, 64, 700, 100, 600, 333, 0},    /* window 333 over a long chunk: masked tiles at both ends */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        if (!run_case(G, &cs[i])) break;
    pt_backend_free(&G);
}

int main(void) {
    TEST_RUN(test_flash2_bit_identical);
    return test_summary();
}
