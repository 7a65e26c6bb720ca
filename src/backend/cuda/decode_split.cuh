/* The split-sequence decode attention over full-precision KV caches
 * (attention.cu) as one launch over B query rows: the single-sequence decode
 * step (B = 1, the cache of a pt_kv_layer) and the multi-sequence step of
 * continuous batching (batch_decode.cu: row b's cache from a device table)
 * run the same kernels, so a row decoded in a batch is bit-identical to the
 * row decoded alone. A row's work follows its own key count (splits of at
 * least minper keys, only the splits holding keys run and merge: attention.cu),
 * never the other rows'. Holds the row arguments, the key range of a row
 * (dec_range) and its cache (dec_cache) that both kernel generations use;
 * not the kernels themselves (attention.cu, attention_dec2.cu), not the
 * quantized caches (kv_quant.cu, kv_fused.cu). */
#ifndef PT_BACKEND_CUDA_DECODE_SPLIT_CUH
#define PT_BACKEND_CUDA_DECODE_SPLIT_CUH

#include "backend/cuda/cuda_internal.cuh"

/* The rows of one split decode launch. */
typedef struct pt_dec_rows {
    float *out;            /* [B, nh, hd] */
    const float *q;        /* [B, nh, hd] */
    const void *k, *v;     /* the cache [nkv, cap, hd] when kvp == NULL (B = 1) */
    void *const *kvp;      /* device table [B][2]: row b's K and V storage, or NULL */
    const int32_t *pos;    /* [B] device positions; pos[b] < 0: a padding row (zeros) */
    int nh, nkv, hd;
    int64_t cap;
    float scale, softcap;
    int window, bf;
    int minper;            /* set by the launch: the fewest keys of a split (attention.cu) */
    /* set by the launch: score row stride, split count (the most a row
     * uses; a row of n keys uses ceil(n / max(ceil(n / nsplit), minper))), scratch */
    int64_t stride, nsplit;
    float *S;              /* [B, nh, stride] */
    float2 *ML;            /* [B, nh, nsplit] */
    float *P;              /* [B, nh, nsplit, hd] */
    /* RoPE and the cache write folded into the scores kernel
     * (pt_cuda_rope_kv_attention; inv_freq == NULL: not folded; kn == NULL
     * with inv_freq set: the queries' RoPE alone, the keys already rotated
     * and appended): q holds the
     * unrotated queries, kn / vn [B, nkv, hd] the unrotated new keys and the
     * values of position pos[b]. Every scores block of row b rotates its
     * queries and the new key of its KV head as rope_kv_kernel does
     * (rope.cu), scores that key from its own copy, and the block of split 0
     * writes the key and the value into slot pos[b] % cap of row b's cache
     * as kv_append does; the p·V kernel after it reads them from there. */
    const float *kn, *vn;
    const float *inv_freq; /* [half] */
    float rscale;          /* the rope's attn_scale */
    int half;              /* rot_dim / 2 */
    /* set by the caller: no row of the launch holds more keys (0: unknown).
     * One sequence with RoPE folded, or batched rows with the queries' RoPE
     * folded, under a bound that fits runs the one-block form
     * (attention_short.cu); a row past what that launch holds (its
     * scores tasks, its shared memory, PT_DEC_SHORT_KEYS keys) sets err
     * (code 3) and is not computed. */
    int64_t max_keys;
    int *err;              /* the backend's device error flag */
    /* set by pt_cuda_dec2_launch: query heads per block of its scores and
     * p·V kernels (G, or 1: a block per query head; the bits do not depend
     * on it) */
    int hpb;
    /* set by pt_cuda_rope_kv_attention where the o projection after it may
     * take its x from here (gemv_tc.cu XO): the batched rows' one-task
     * kernel (dec_rows1_kernel) writes its output also in the wgmma GEMV's
     * x layout at 64 columns, xo_unit bytes a 64-value unit (wg_x.cuh);
     * the other kernels ignore it. NULL: not. */
    char *xo;
    int xo_unit;
} pt_dec_rows;

/* The most outputs a (row, KV head) block writes as o's x (pt_dec_rows.xo:
 * G·head_dim, a multiple of 64). */
#define PT_DS_XO_MAX 512

/* The most query heads per KV head the split decode kernels take. */
#define DEC_MAX_G 8

/* The splits of a row of n keys: per = max(ceil(n / nsplit), minper) keys
 * each, the first `used` holding keys (<= nsplit: per >= n / nsplit). */
__host__ __device__ __forceinline__ void dec_splits(int64_t n, int64_t nsplit, int64_t minper, int64_t &per,
                                                    int64_t &used) {
    per = (n + nsplit - 1) / nsplit;
    if (per < minper) per = minper;
    used = (n + per - 1) / per;
}

/* Row b's key range (positions come from device memory, so a captured graph
 * replays with new ones): keys lo + [0, n), in splits of `per` keys of
 * which the first `used` hold keys; n is clamped to the scores' row stride;
 * pos < 0 (a padding row) gives n = 0, used = 0. */
__device__ __forceinline__ void dec_range(const pt_dec_rows &a, int64_t b, int64_t &lo, int64_t &n, int64_t &per,
                                          int64_t &used) {
    const int64_t hi = a.pos[b];
    lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
    n = hi - lo + 1;
    if (n > a.stride) n = a.stride;
    if (n < 0) n = 0;
    dec_splits(n, a.nsplit, a.minper, per, used);
}

__device__ __forceinline__ const void *dec_cache(const pt_dec_rows &a, int64_t b, int which) {
    return a.kvp ? a.kvp[2 * b + which] : which ? a.v : a.k;
}

/* The merge of out entry i = [b, h, e] (per_row = nh * hd, read once by the
 * caller): row b's used splits (used) and the first of its partials,
 * P[b, h, 0, e] (the next split's is hd floats on). */
__device__ __forceinline__ const float *dec_merge_src(const pt_dec_rows &a, int64_t i, int nh, int hd,
                                                      int64_t per_row, int64_t nsplit, int64_t &used) {
    const int64_t b = i / per_row, r = i % per_row, h = r / hd, e = r % hd;
    int64_t lo, n, per;
    dec_range(a, b, lo, n, per, used);
    return a.P + (b * nh + h) * nsplit * hd + e;
}

/* out[b, h, e] = row b's used splits' partial outputs added in split
 * order (8 of a thread's loads in flight at once), rounded in bf16 mode; a
 * padding row (no split used) gets zeros. The merge of both generations of
 * the split decode (defined in attention.cu, launched by attention_dec2.cu
 * too). */
__global__ void dec_rows_merge_kernel(pt_dec_rows a, int64_t B);

/* The second generation's scores, p·V and merge launches over grid for
 * cache dtype KT (attention_dec2.cu; KT float, __nv_bfloat16, __half), R =
 * hd·sizeof(KT)/16 in [4, 64], the scratch and splits set (attention.cu's
 * dec_launch checks and sets them). */
template <typename KT>
pt_status pt_cuda_dec2_launch(pt_cuda *c, pt_dec_rows &a, int64_t B, dim3 grid);

/* Runs the split decode over B rows of cache dtype dt. batched = 0: the
 * single-sequence scratch (dec_*) and PT_ERR_UNSUPPORTED without a message
 * when the shape or the scratch does not allow it (the caller falls back to
 * the one-block-per-head kernel); batched = 1: the multi-sequence scratch
 * (bdec_*), padding rows, and PT_ERR_UNSUPPORTED with a message saying why
 * (the caller then runs the rows one by one). */
pt_status pt_cuda_decode_split(pt_cuda *c, pt_dec_rows &a, int64_t B, pt_ftype dt, int batched);

/* The one-launch form of the second generation's split decode
 * (attention_short.cu) for one sequence with RoPE and the cache write
 * folded (B = 1, kn set), or for B batched rows whose keys were appended
 * before (kvp set, kn NULL, inv_freq set: the queries' RoPE folded): the
 * same bits as pt_cuda_dec2_launch. PT_ERR_UNSUPPORTED (nothing launched)
 * when max_keys is 0 or above what the shape allows; the scratch and splits
 * set as for pt_cuda_dec2_launch. */
template <typename KT>
pt_status pt_cuda_dec2_short(pt_cuda *c, const pt_dec_rows &a, int64_t B, int64_t max_keys);

/* Batched rows' keys rotated as rope_qk rotates them and appended as
 * kv_append_rows appends them (same bytes), in one launch over every row
 * (batch_decode.cu); rope_kv_attention's batched form runs it before the
 * split decode. */
pt_status pt_cuda_rope_k_append_rows(pt_cuda *c, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                     const float *v, int64_t B, const int32_t *pos, const pt_rope *rope, int bf);

/* backend.h rope_kv_attention (attention.cu): the split decode with the
 * layer's RoPE and cache write folded into its scores kernel.
 * PETREL_CUDA_ROPE_ATTN=0 answers PT_ERR_UNSUPPORTED (A/B: the separate
 * launches). */
pt_status pt_cuda_rope_kv_attention(pt_backend *be, float *out, const float *q, const float *k, const float *v,
                                    int64_t B, const int32_t *pos, const pt_rope *rope, pt_kv_layer *kv,
                                    void *const *kvp, const pt_attn *p);

#endif
