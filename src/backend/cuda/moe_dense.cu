/* The CUDA MoE decode path for dense bf16 expert stacks (a bf16
 * checkpoint's experts): gate|up + GLU in one launch over (rows, item),
 * down + combine in one launch over (8 output rows, token), as
 * moe_decode.cu's kernels do for 4/8-bit codes. They replace the per-item
 * path's five launches (gate and up GEMVs, GLU, down GEMV, combine) and its
 * round trips of the [items, 2I] and [items, H] scratch.
 *
 * Each row's dot product is formed exactly as the per-item dense GEMV
 * (matmul.cu, gemv_dense_kernel, 16-byte rows) forms it: lane l takes the
 * 16-byte chunks l, l + 32, ... in order, one fma chain over their 8 values,
 * then the warp's butterfly sum, the bias, the rounding; the GLU is
 * pt_glu_val and the combine moe_combine_kernel's walk (moe_rows_combine).
 * So the outputs are the per-item path's bits, at any batch, and a token's
 * result depends on nothing but its own row; above MD_MAX_B items the
 * per-item path runs (it was faster there). A warp issues the loads of
 * MD_GU_U (gate|up) or MD_DN_U (down) chunks of every one of its rows before
 * the multiply-adds that use them, which then run chunk by chunk in the
 * order above. PETREL_CUDA_MOE_DENSE=0 leaves these stacks to the per-item
 * path (A/B). Not here: the 4/8-bit kernels (moe_decode.cu, moe_grid.cu). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_rows.cuh"

#define MD_GU_WARPS 4 /* warps per gate|up block */
#define MD_GU_RPW 2   /* gate rows per warp, and as many up rows */
#define MD_GU_U 4     /* chunks per row whose loads are in flight (gate|up) */
#define MD_DN_ROWS 8  /* output rows per down block */
#define MD_DN_WARPS 8 /* most warps per down block (one expert each) */
#define MD_DN_U 2     /* chunks per row whose loads are in flight (down) */

/* A row's stored value as gemv_dense_kernel stores it: the warp sum, the
 * bias, the rounding; zeros for a bad expert. */
__device__ __forceinline__ float md_row_out(float v, const moe_qm &m, int64_t grow, bool eok, int bf) {
    if (m.bias) v += pt_ld(m.bt, m.bias, grow);
    return eok ? pt_rnd(bf, v) : 0.f;
}

/* h[b, r] = glu(gate row r · x, up row r · x) for item b (x row b / k);
 * grid (I / (WARPS·RPW), B); a warp's RPW gate rows and the matching up rows
 * (rows past I read row I − 1 and store nothing). */
__global__ void __launch_bounds__(MD_GU_WARPS * 32)
    moe_gu_dense_kernel(float *h, const float *x, const int32_t *idx, int k, int64_t K, int64_t I, moe_qm g,
                        moe_qm u, int64_t n_experts, int *err, int bf, int act) {
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.y;
    const int64_t r0 = ((int64_t)blockIdx.x * MD_GU_WARPS + warp) * MD_GU_RPW;
    if (r0 >= I) return; /* warp 0 of block 0 always stays: the item's expert is checked */
    bool eok;
    const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
    const __nv_bfloat16 *rp[2 * MD_GU_RPW];
    int64_t grow[2 * MD_GU_RPW];
#pragma unroll
    for (int d = 0; d < 2 * MD_GU_RPW; d++) {
        const moe_qm &m = d < MD_GU_RPW ? g : u;
        const int64_t r = r0 + d % MD_GU_RPW < I ? r0 + d % MD_GU_RPW : I - 1;
        grow[d] = e * m.rows + m.row_off + r;
        rp[d] = reinterpret_cast<const __nv_bfloat16 *>(m.codes) + grow[d] * K;
    }
    float acc[2 * MD_GU_RPW][1] = {};
    pt_dense_rows_dot<__nv_bfloat16, 8, 2 * MD_GU_RPW, 1, MD_GU_U, true>(acc, rp, x + (b / k) * K, K, K / 8, lane);
#pragma unroll
    for (int d = 0; d < 2 * MD_GU_RPW; d++) acc[d][0] = pt_warp_sum(acc[d][0]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MD_GU_RPW; r++) {
            if (r0 + r >= I) break;
            const float gv = md_row_out(acc[r][0], g, grow[r], eok, bf);
            const float uv = md_row_out(acc[MD_GU_RPW + r][0], u, grow[MD_GU_RPW + r], eok, bf);
            h[b * I + r0 + r] = pt_glu_val(act, gv, uv, bf);
        }
    }
}

/* y[t, d0 .. d0 + DN_ROWS) = the weighted sum over token t's k experts of
 * (down row d · h[t·k + j]), combined as moe_combine_kernel. Grid
 * (H / DN_ROWS, T); block min(k, DN_WARPS) warps, warp w takes experts
 * j = w, w + warps, ... */
__global__ void __launch_bounds__(MD_DN_WARPS * 32)
    moe_down_dense_kernel(float *y, const float *h, const int32_t *idx, const float *weights, int k, int64_t H,
                          int64_t I, moe_qm m, int64_t n_experts, int *err, int bf) {
    __shared__ float o[64][MD_DN_ROWS]; /* [k][row]: each expert's rounded output */
    __shared__ int ord[64];             /* the slots in ascending (expert, slot) order */
    __shared__ float wsh[64];           /* and their weights */
    pt_release_dependents();
    pt_wait_primary();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t t = blockIdx.y, d0 = (int64_t)blockIdx.x * MD_DN_ROWS;
    moe_rows_order(ord, wsh, idx, weights, t, k);
#pragma unroll 1
    for (int j = warp; j < k; j += nw) {
        const int64_t b = t * k + j;
        bool eok;
        const int64_t e = moe_item_expert(idx, b, n_experts, err, eok);
        const __nv_bfloat16 *rp[MD_DN_ROWS];
        int64_t grow[MD_DN_ROWS];
#pragma unroll
        for (int r = 0; r < MD_DN_ROWS; r++) {
            grow[r] = e * m.rows + (d0 + r < H ? d0 + r : d0);
            rp[r] = reinterpret_cast<const __nv_bfloat16 *>(m.codes) + grow[r] * I;
        }
        float acc[MD_DN_ROWS][1] = {};
        pt_dense_rows_dot<__nv_bfloat16, 8, MD_DN_ROWS, 1, MD_DN_U, true>(acc, rp, h + b * I, I, I / 8, lane);
        /* each row's sum stored before the next is formed: all eight sums
         * first (as moe_down_kernel) take this kernel from 122 to 172
         * registers, one block an SM, and bench_moe bf16 31.4 → 35.0 µs */
#pragma unroll
        for (int r = 0; r < MD_DN_ROWS; r++) {
            const float v = pt_warp_sum(acc[r][0]);
            if (lane == 0) o[j][r] = md_row_out(v, m, grow[r], eok, bf);
        }
    }
    moe_rows_combine<MD_DN_ROWS>(y, o, ord, wsh, t, H, k, d0, bf);
}

/* Most items the two kernels take; from there the per-item GEMVs (the same
 * bits). bench_moe bf16 (qwen3-30b-a3b layer, µs): 8 items 53.5 → 40.7,
 * 16 items 86.1 → 65.4, 32 items 126.8 → 117.2, 128 items 389.5 → 412.4. */
#define MD_MAX_B 32
static int g_moe_dense_max_b = MD_MAX_B;
extern "C" void pt_cuda_moe_dense_max(int b) { g_moe_dense_max_b = b > 0 ? b : MD_MAX_B; } /* tests, benchmarks */
bool pt_cuda_moe_dense_fits(int64_t B) { return B <= g_moe_dense_max_b; }

static int g_moe_dense = -1;
static long g_moe_dense_launches; /* host side: launches of the two kernels (tests) */
extern "C" long pt_cuda_moe_dense_launches(void) { return __atomic_load_n(&g_moe_dense_launches, __ATOMIC_RELAXED); }

bool pt_cuda_moe_dense_ok(const pt_matrix *w) {
    if (g_moe_dense < 0) g_moe_dense = pt_env_on("PETREL_CUDA_MOE_DENSE");
    const pt_cuda_weight *cw = pt_cuda_w(w);
    return g_moe_dense && cw && !cw->tc && w->bits == 0 && w->dtype == PT_FT_BF16 && w->cols % 8 == 0 &&
           (uintptr_t)cw->data % 16 == 0;
}

pt_status pt_cuda_moe_gu_dense(pt_cuda *c, float *h, const float *x, const int32_t *idx, int64_t B, int k,
                               const pt_matrix *gate, const pt_matrix *up, int64_t I, int act) {
    const int64_t K = gate->cols, E = gate->n_experts > 1 ? gate->n_experts : 1;
    const moe_qm g = moe_qm_of(gate, 0), u = up ? moe_qm_of(up, 0) : moe_qm_of(gate, I);
    const int64_t per_block = MD_GU_WARPS * MD_GU_RPW;
    pt_launch(moe_gu_dense_kernel, dim3((unsigned)((I + per_block - 1) / per_block), (unsigned)B),
              dim3(MD_GU_WARPS * 32), 0, c->stream, pt_pdl_chain(), h, x, idx, k, K, I, g, u, E, c->err_dev,
              (int)(c->base.act == PT_ACT_BF16), act);
    CUDA_CHECK_LAUNCH("moe gate|up (bf16)");
    __atomic_fetch_add(&g_moe_dense_launches, 1L, __ATOMIC_RELAXED);
    return PT_OK;
}

pt_status pt_cuda_moe_down_dense(pt_cuda *c, float *y, const float *h, const int32_t *idx, const float *weights,
                                 int64_t T, int k, const pt_matrix *down) {
    const int64_t H = down->rows, I = down->cols, E = down->n_experts > 1 ? down->n_experts : 1;
    const int warps = k < MD_DN_WARPS ? k : MD_DN_WARPS;
    pt_launch(moe_down_dense_kernel, dim3((unsigned)((H + MD_DN_ROWS - 1) / MD_DN_ROWS), (unsigned)T),
              dim3(32 * warps), 0, c->stream, pt_pdl_chain(), y, h, idx, weights, k, H, I, moe_qm_of(down, 0), E,
              c->err_dev, (int)(c->base.act == PT_ACT_BF16));
    CUDA_CHECK_LAUNCH("moe down (bf16)");
    __atomic_fetch_add(&g_moe_dense_launches, 1L, __ATOMIC_RELAXED);
    return PT_OK;
}
