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

static void test_prefill_attention(void) {
    NEED_GPU();
    static const acase cs[] = {
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
            if (!attn_check(a, &cs[i], "prefill attention", 1.5f, ATTN_TWICE)) return;
    REPORT();
}

int main(void) {
    TEST_RUN(test_prefill_attention);
    teardown();
    return test_summary();
}
