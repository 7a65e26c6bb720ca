/* The tensor-core decode GEMV's host side: the launches of the kernels of
 * gemv_tc_kernel.cuh (design, arithmetic, work split and batch invariance are
 * described there) and their sizing (dynamic shared memory, units per stage,
 * the warp split S, clusters), the env switches that pick among bit-identical
 * variants (PETREL_CUDA_PDL, PETREL_CUDA_TC_LOOP, _LV4, _GLU16, _XPRE, _XSTAGE,
 * _XL, _DRIFT, _CLUSTER, _WIDE, _WARPS, _XP8, _WG; PETREL_CUDA_CARVE) and the entry points pt_cuda_tc_gemv,
 * pt_cuda_tc_gemv_multi and pt_cuda_tc_gemv_glu (gemv_tc.cuh). This file is the
 * one object the kernels are compiled in. Not here: the kernel code
 * (gemv_tc_kernel.cuh; the wgmma kernels of 17..64 rows, off by default,
 * gemv_wg_kernel.cuh), the repack at upload and the dequantize of the
 * tensor-core layout (gemv_tc_repack.cu). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_tc.cuh"
#include "backend/cuda/gemv_tc_kernel.cuh"
#include "backend/cuda/gemv_wg_kernel.cuh"
#include "backend/cuda/matmul.cuh"

#include <stdlib.h>
#include <string.h>

/* ---- launch ------------------------------------------------------------------ */

static int g_tc_pdl = -1;
extern "C" void pt_cuda_tc_pdl(int on) { g_tc_pdl = on != 0; }
static int tc_pdl_on(void) {
    if (g_tc_pdl < 0) g_tc_pdl = pt_env_on("PETREL_CUDA_PDL");
    return g_tc_pdl;
}

/* Dynamic shared memory of a block: the weight ring, then x (XP: two
 * buffers, then the two mbarriers and the two drift counters) or the final
 * reduction, whichever is larger. xl: the XL kernels' stage layout. */
template <int BITS, int GS>
static size_t tc_smem(int nb, int NT, int SU, int W, bool xp, bool xl = false) {
    using SH = tc_shape<BITS, GS>;
    const size_t KS = (size_t)SU * SH::UK;
    size_t xb = (size_t)nb * (KS + SH::XPAD) * 2 + (KS / GS) * NT * 8 * 4;
    if (xp && xl) xb = (KS / 64) * NT * 8 * 128 + (KS / GS) * NT * 8 * 4; /* tc_xprep_kernel's xl layout */
    if (xp) xb = 2 * ((xb + 15) & ~(size_t)15);
    const size_t rb = (size_t)W * 16 * (NT * 8 + (xp ? 4 : 0)) * 4; /* red, its rows padded for XP */
    return (size_t)W * PT_TC_RING * SH::SLOT + (xb > rb ? xb : rb) + (xp ? 32 : 0);
}

/* The inner loop of the GEMV (A/B; the same bits: the same floating-point
 * operations in the same order): 3 (default) = 2 at one activation row
 * where each warp streams at least 16 blocks (K·bits/256 / S), else 1
 * (tc_lv: the unrolled ring wins where a warp streams many blocks — the
 * 8B shape's gate/up and down, the 1B shape's down, both lm_heads — and
 * loses where it streams 4–8 — q/k/v/o of both shapes, the 1B gate/up —
 * and at 8 rows, bench/RESULTS.md); 2 = the unrolled ring loop up to 8 rows; 1 = the integer work cut
 * (per-lane pointers and shared addresses computed once, unsigned index
 * arithmetic, a code pair in one LOP3, the scale|bias copy predicated
 * instead of branched, the mma as a plain asm the compiler may schedule)
 * and, for one activation row, only the stored column folded; 0 = the loop
 * as first written. PETREL_CUDA_TC_LOOP or pt_cuda_tc_loop(). */
#define PT_TC_LOOP_DEFAULT 3
static int g_tc_loop = -1;
extern "C" void pt_cuda_tc_loop(int lv) { g_tc_loop = lv >= 0 && lv <= 3 ? lv : PT_TC_LOOP_DEFAULT; }
static int tc_loop(void) {
    if (g_tc_loop < 0) {
        pt_cuda_tc_loop(pt_env_int("PETREL_CUDA_TC_LOOP", 0, 3, PT_TC_LOOP_DEFAULT));
    }
    return g_tc_loop;
}
/* The loop a launch runs (3 resolved), from its first weight: one loop per
 * launch (a grouped launch's weights share K and the row count; tc_launch
 * sizes the stages from the same answer). */
template <int BITS>
static int tc_lv(const tc_multi_args &m) {
    const int lv = tc_loop();
    const tc_args &a = m.a[0];
    return lv == 3 ? (a.nb == 1 && (int64_t)a.K * BITS / 256 >= 16 * (int64_t)a.S ? 2 : 1) : lv;
}

/* Launches of the unrolled ring loop (LV 2, and its LV 4 build) so far
 * (tests check it ran). */
static unsigned long long g_tc_lv2_launches;
extern "C" unsigned long long pt_cuda_tc_lv2_count(void) {
    return __atomic_load_n(&g_tc_lv2_launches, __ATOMIC_RELAXED);
}

/* The shared-memory carveout of the one-row launches: the most shared memory
 * (least L1) an SM offers (cudaLaunchAttributePreferredSharedMemoryCarveout),
 * instead of the driver's choice per kernel. With the driver's choice the 1B
 * shape's one-row step ran its down GEMV 27 µs a step longer (141.6 against
 * 114.1 µs exposed, dev/trace_cupti.c): tg128 +5% with it, qwen3-30b-a3b
 * +4%; the 3B and 4B shapes within noise, the 8B −0.1%. Asked for by every
 * launch of the step as well (norms, attention; many rows too) it bought the
 * 1B no more and cost the 8B shape's served 8 and 64 streams 1–2%
 * (bench/RESULTS.md), so the launches of more than one row keep the driver's
 * choice. A preference, not a size: each kernel's shared memory, occupancy
 * and bits are as before. PETREL_CUDA_CARVE=0 or pt_cuda_carve(0): the
 * driver's choice everywhere (A/B; read once; -1: back to the variable). The
 * launches that asked for it so far (tests check it ran). */
static pt_switch g_tc_carve = {"PETREL_CUDA_CARVE", 1, -1, 0};
extern "C" void pt_cuda_carve(int on) { g_tc_carve.set(on); }
extern "C" unsigned long long pt_cuda_carve_count(void) { return g_tc_carve.count(); }

/* One launch of m's weights: the single-weight kernel when m holds one
 * weight and grouped is 0, else the grouped kernel (m.first already set for
 * W). Shared memory: the largest any of the weights needs (the ring comes
 * first, so each block's carve-up fits in it). */
template <int BITS, int GS, int NT, int W, bool XP, int LV, bool ONE, bool XL = false, bool NRM = false>
static pt_status tc_launch_k(const pt_cuda *c, const tc_multi_args &m, unsigned items, int grouped, int cluster,
                             const tc_glu *gl = NULL) {
    /* dynamic shared memory opted in so far, per kernel: [grouped], then the GLU kernel */
    static size_t attr[3] = {48 * 1024, 48 * 1024, 48 * 1024};
    size_t smem = 0;
    for (int i = 0; i < m.n; i++) {
        const size_t b = tc_smem<BITS, GS>(m.a[i].nb, NT, m.a[i].SU, W, XP, XL);
        if (b > smem) smem = b;
    }
    if constexpr (LV >= 1) {
        if (gl) { /* the GLU epilogue: one weight pair, one item, its own kernel */
            if (smem > attr[2]) {
                CUDA_CHECK(cudaFuncSetAttribute(gemv_tc_glu_kernel<BITS, GS, NT, W, XP, ONE, XL, LV, NRM>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                attr[2] = smem;
            }
        }
    } else if (gl)
        return pt_error(PT_ERR_INTERNAL, "gemv: the GLU epilogue runs the default inner loop only");
    if (!gl && smem > attr[grouped]) {
        if (grouped)
            CUDA_CHECK(cudaFuncSetAttribute(gemv_tc_multi_kernel<BITS, GS, NT, W, XP, LV, ONE, XL, NRM>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        else
            CUDA_CHECK(cudaFuncSetAttribute(gemv_tc_kernel<BITS, GS, NT, W, XP, LV, ONE, XL, NRM>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr[grouped] = smem;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)m.first[m.n], items);
    cfg.blockDim = dim3(W * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[3];
    cfg.attrs = at;
    cfg.numAttrs = 0;
    if (tc_pdl_on()) {
        at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (m.a[0].nb == 1 && g_tc_carve.on()) {
        at[cfg.numAttrs].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        at[cfg.numAttrs++].val.sharedMemCarveout = (unsigned)cudaSharedmemCarveoutMaxShared;
        g_tc_carve.counted();
    }
    if (cluster > 1) { /* XP only: grid.x is a multiple of cluster (tc_launch_xp) */
        at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        at[cfg.numAttrs].val.clusterDim.x = (unsigned)cluster;
        at[cfg.numAttrs].val.clusterDim.y = 1;
        at[cfg.numAttrs++].val.clusterDim.z = 1;
    }
    if constexpr (LV >= 2) __atomic_fetch_add(&g_tc_lv2_launches, 1ull, __ATOMIC_RELAXED);
    if constexpr (LV >= 1)
        if (gl) {
            CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_tc_glu_kernel<BITS, GS, NT, W, XP, ONE, XL, LV, NRM>, m.a[0], *gl));
            return PT_OK;
        }
    if (grouped) CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_tc_multi_kernel<BITS, GS, NT, W, XP, LV, ONE, XL, NRM>, m));
    else CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_tc_kernel<BITS, GS, NT, W, XP, LV, ONE, XL, NRM>, m.a[0]));
    return PT_OK;
}

/* Whether the LV 2 kernels may run m's weights: each weight's stages hold
 * a multiple of PT_TC_RING blocks per warp (SU a multiple of S·PT_TC_RING
 * units, tc_launch sizes them so), or the whole K is one stage. */
template <int BITS, int GS>
static bool tc_rg_ok(const tc_multi_args &m) {
    using SH = tc_shape<BITS, GS>;
    for (int i = 0; i < m.n; i++) {
        const tc_args &a = m.a[i];
        const int NU = a.K / SH::UK;
        if (a.SU < NU && (a.SU / a.S * SH::BPU) % PT_TC_RING) return false;
    }
    return true;
}

/* One activation row on the unrolled loop: its two-blocks-per-SM build (LV
 * 4) where the launch has more blocks than SMs but no more than two per SM,
 * else the four-per-SM one (LV 2; the same bits). On the H200, LV 4 took
 * the 8B shape's down GEMV (256 blocks) and tg128 +6%, but lost 5% on the
 * 1B shape's (128 blocks) and on the 448-block gate/up (bench/RESULTS.md).
 * PETREL_CUDA_TC_LV4=0 or pt_cuda_tc_lv4(0): LV 2 always (A/B; read once);
 * pt_cuda_tc_lv4(2): LV 4 always (tests); -1: back to the environment. */
static int g_tc_lv4 = -1;
extern "C" void pt_cuda_tc_lv4(int v) { g_tc_lv4 = v < 0 ? -1 : v > 2 ? 2 : v; }
static bool tc_lv4(const pt_cuda *c, const tc_multi_args &m, unsigned items) {
    if (g_tc_lv4 < 0) g_tc_lv4 = pt_env_on("PETREL_CUDA_TC_LV4");
    const int64_t blocks = (int64_t)m.first[m.n] * items;
    return g_tc_lv4 == 2 || (g_tc_lv4 == 1 && blocks > c->sm_count && blocks <= 2 * (int64_t)c->sm_count);
}

/* One activation row on the unrolled loop: the launch of its build tc_lv4
 * picks (NRM: the folded norm's kernels). */
template <int BITS, int GS, int NT, int W, bool XP, bool NRM>
static pt_status tc_launch_rg1(const pt_cuda *c, const tc_multi_args &m, unsigned items, int grouped, int cluster,
                               const tc_glu *gl) {
    if constexpr (W > PT_TC_WARPS) /* 16-warp blocks: the four-per-SM build's code at two blocks an SM */
        return tc_launch_k<BITS, GS, NT, W, XP, 2, true, false, NRM>(c, m, items, grouped, cluster, gl);
    return tc_lv4(c, m, items) ? tc_launch_k<BITS, GS, NT, W, XP, 4, true, false, NRM>(c, m, items, grouped, cluster, gl)
                               : tc_launch_k<BITS, GS, NT, W, XP, 2, true, false, NRM>(c, m, items, grouped, cluster, gl);
}

/* The launch with the inner loop tc_loop() selects (one activation row:
 * the kernel that folds only the stored column; 2: the unrolled ring loop,
 * up to 8 rows, where the stages allow it). */
template <int BITS, int GS, int NT, int W, bool XP = false>
static pt_status tc_launch_nt(const pt_cuda *c, const tc_multi_args &m, unsigned items, int grouped,
                              int cluster = 1, const tc_glu *gl = NULL) {
    const int lv = tc_lv<BITS>(m);
    /* the folded norm (tc_args::nw): the one-row kernels of loops 1 and 2 only */
    if (m.a[0].nsh.V) {
        if constexpr (NT == 1 && !XP && (W == PT_TC_WARPS || W == PT_TC_WIDE_WARPS)) {
            if (m.a[0].nb != 1 || lv == 0) return PT_ERR_UNSUPPORTED;
            for (int i = 0; i < m.n; i++) /* the row is one stage (tc_stage_norm) */
                if ((int64_t)m.a[i].SU * tc_shape<BITS, GS>::UK < m.a[i].K) return PT_ERR_UNSUPPORTED;
            if (lv == 2 && tc_rg_ok<BITS, GS>(m))
                return tc_launch_rg1<BITS, GS, NT, W, XP, true>(c, m, items, grouped, cluster, gl);
            return tc_launch_k<BITS, GS, NT, W, XP, 1, true, false, true>(c, m, items, grouped, cluster, gl);
        }
        return PT_ERR_UNSUPPORTED;
    }
    if constexpr (NT == 1 && !XP)
        if (lv == 2 && tc_rg_ok<BITS, GS>(m)) {
            if (m.a[0].nb == 1) return tc_launch_rg1<BITS, GS, NT, W, XP, false>(c, m, items, grouped, cluster, gl);
            return tc_launch_k<BITS, GS, NT, W, XP, 2, false>(c, m, items, grouped, cluster, gl);
        }
    if constexpr (NT == 1 && !XP)
        if (lv && m.a[0].nb == 1) return tc_launch_k<BITS, GS, NT, W, XP, 1, true>(c, m, items, grouped, cluster, gl);
    return lv ? tc_launch_k<BITS, GS, NT, W, XP, 1, false>(c, m, items, grouped, cluster, gl)
              : tc_launch_k<BITS, GS, NT, W, XP, 0, false>(c, m, items, grouped, cluster, gl);
}

/* Above 8 rows (16-warp blocks, one item) x is prepared once per launch by
 * tc_xprep_kernel into the matmul scratch (c->tile, free during a GEMV) and
 * each block bulk-copies it stage by stage, double-buffered, instead of
 * every block reading nb·K f32 from L2 and converting it between barriers;
 * a grouped launch prepares it once for all its weights.
 * PETREL_CUDA_TC_XPRE=0 / pt_cuda_tc_xpre(0): the in-block staging (A/B).
 * Same bits either way (tc_xprep_kernel). */
static int g_tc_xpre = -1;
extern "C" void pt_cuda_tc_xpre(int on) { g_tc_xpre = on != 0; }
static int tc_xpre(void) {
    if (g_tc_xpre < 0) g_tc_xpre = pt_env_on("PETREL_CUDA_TC_XPRE");
    return g_tc_xpre;
}

#define PT_TC_XP_BUDGET (64 * 1024) /* bytes of bf16 x per stage buffer (two buffers) */
#define PT_TC_SMEM_MAX (227 * 1024) /* dynamic shared memory a block may opt into (sm_90) */

/* Units per stage of an XP launch of a (whole rounds of S, two buffers of
 * about PT_TC_XP_BUDGET bytes), or 0 when even one round per stage does not
 * fit the shared memory (then the in-block staging serves the launch). */
template <int BITS, int GS, int NT>
static int tc_xp_su(const tc_args &a, bool xl) {
    using SH = tc_shape<BITS, GS>;
    const int NU = a.K / SH::UK, nu_r = (NU + a.S - 1) / a.S * a.S;
    int su = (int)(PT_TC_XP_BUDGET / ((int64_t)a.nb * 2 * SH::UK));
    su = su / a.S * a.S;
    if (su < a.S) su = a.S;
    if (su > nu_r) su = nu_r;
    while (su > a.S && tc_smem<BITS, GS>(a.nb, NT, su, PT_TC_WIDE_WARPS, true, xl) > PT_TC_SMEM_MAX) su -= a.S;
    return tc_smem<BITS, GS>(a.nb, NT, su, PT_TC_WIDE_WARPS, true, xl) <= PT_TC_SMEM_MAX ? su : 0;
}

/* Stage-major prepared x (tc_args::xst): PETREL_CUDA_TC_XSTAGE=0 or
 * pt_cuda_tc_xstage(0) keeps the row layout, one bulk copy per row and
 * stage (A/B; same bits). */
static int g_tc_xstage = -1;
extern "C" void pt_cuda_tc_xstage(int on) { g_tc_xstage = on != 0; }
static bool tc_xstage(void) {
    if (g_tc_xstage < 0) g_tc_xstage = pt_env_on("PETREL_CUDA_TC_XSTAGE");
    return g_tc_xstage;
}

/* Two levers of the XP launches, each bit-identical: the XL kernels (4-bit,
 * stage-major x: tc_xprep_kernel's xl layout, two 16-byte B loads per
 * n-tile; PETREL_CUDA_TC_XL, pt_cuda_tc_xl),
 * and warps that drift across the x stages instead of meeting at a barrier
 * per stage (tc_args::drift; no cluster; PETREL_CUDA_TC_DRIFT,
 * pt_cuda_tc_drift). A negative argument: back to the environment. */
#define PT_TC_XL_DEFAULT 1
#define PT_TC_DRIFT_DEFAULT 1
static pt_switch g_tc_xl = {"PETREL_CUDA_TC_XL", PT_TC_XL_DEFAULT, -1, 0},
                 g_tc_drift = {"PETREL_CUDA_TC_DRIFT", PT_TC_DRIFT_DEFAULT, -1, 0};
extern "C" void pt_cuda_tc_xl(int on) { g_tc_xl.set(on); }
extern "C" void pt_cuda_tc_drift(int on) { g_tc_drift.set(on); }

/* Blocks per cluster of the XP launches (they share each stage's x load,
 * tc_bulk_mc): PT_TC_CLUSTER, or PETREL_CUDA_TC_CLUSTER=1|2|4 (read once),
 * or pt_cuda_tc_cluster(). The bits are the same for any value: a block
 * receives the same bytes. 1 (every block loads its own x) is the default:
 * on the H200 the 8b layer's 64-row GEMVs took 270.9 µs with 1, 292.7 with
 * 2 (the cluster barrier per stage costs more than the halved L2 reads of
 * x save) and clusters of 4 leave SMs idle (bench/RESULTS.md). */
#define PT_TC_CLUSTER 1
static int g_tc_cluster = 0;
extern "C" void pt_cuda_tc_cluster(int n) { g_tc_cluster = n == 1 || n == 2 || n == 4 ? n : PT_TC_CLUSTER; }
static int tc_cluster(void) {
    if (!g_tc_cluster) {
        static const int cl[] = {1, 2, 4};
        pt_cuda_tc_cluster(pt_env_pick("PETREL_CUDA_TC_CLUSTER", cl, 3, 0));
    }
    return g_tc_cluster;
}

/* Whether clusters of n blocks of this XP kernel with smem bytes of shared
 * memory can run at all on this device (checked once per kernel and n). */
template <int BITS, int GS, int NT>
static bool tc_cluster_fits(bool grouped, int n, size_t smem) {
    static int ok[2][2] = {{-1, -1}, {-1, -1}}; /* [grouped][n = 2, 4 → 0, 1], -1: not asked yet */
    int &r = ok[grouped ? 1 : 0][n == 4 ? 1 : 0];
    if (r < 0) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)n * 8);
        cfg.blockDim = dim3(PT_TC_WIDE_WARPS * 32);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = (unsigned)n;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int clusters = 0;
        cudaError_t e;
        if (grouped) {
            e = cudaFuncSetAttribute(gemv_tc_multi_kernel<BITS, GS, NT, PT_TC_WIDE_WARPS, true, 1, false>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PT_TC_SMEM_MAX);
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveClusters(&clusters, gemv_tc_multi_kernel<BITS, GS, NT, PT_TC_WIDE_WARPS, true, 1, false>,
                                                   &cfg);
        } else {
            e = cudaFuncSetAttribute(gemv_tc_kernel<BITS, GS, NT, PT_TC_WIDE_WARPS, true, 1, false>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PT_TC_SMEM_MAX);
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveClusters(&clusters, gemv_tc_kernel<BITS, GS, NT, PT_TC_WIDE_WARPS, true, 1, false>, &cfg);
        }
        if (e != cudaSuccess) (void)cudaGetLastError();
        r = e == cudaSuccess && clusters > 0;
    }
    return r == 1;
}

/* The x prepare of a's rows (x [nb, K]) into xb with programmatic
 * dependent launch where it is on, the layout arguments as the kernels
 * take them: tc_xprep_kernel, or with a's norm set tc_xprep_norm_kernel
 * (a block per row; a's norm and addend, x the norm's input). */
template <int GS>
static pt_status tc_xprep(const pt_cuda *c, const tc_args &a, bf16 *xb, int ncol, int KS, int XS, int64_t XB,
                          int64_t sxoff, int xl) {
    const int steps = a.nb * (a.K / 8), padded = (steps + 31) & ~31;
    const bool nrm = a.nsh.V != 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nrm ? (unsigned)a.nb : (unsigned)((padded + 255) / 256));
    cfg.blockDim = dim3(nrm ? (unsigned)a.nsh.threads : 256u);
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = tc_pdl_on() ? 1 : 0;
    if (nrm)
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, tc_xprep_norm_kernel<GS>, const_cast<float *>(a.x), a.nadd, xb, a.K,
                                      ncol, KS, XS, XB, sxoff, xl, a.nw, a.nwt, a.nstyle, a.neps, a.nsh.V));
    else CUDA_CHECK(cudaLaunchKernelEx(&cfg, tc_xprep_kernel<GS>, a.x, xb, a.nb, a.K, ncol, KS, XS, XB, sxoff, xl));
    return PT_OK;
}

/* The XP launch of m's weights if every one fits (else PT_ERR_UNSUPPORTED,
 * nothing launched, m unchanged): the x prepare kernel, then the GEMV.
 * With the rows' norm set (m.a[0].nsh.V: matmul_norm, matmul_glu_norm) the
 * prepare is the norm's (tc_xprep_norm_kernel), and the GEMV reads its
 * output. */
template <int BITS, int GS, int NT>
static pt_status tc_launch_xp(const pt_cuda *c, tc_multi_args &m, int grouped, const tc_glu *gl) {
    int su[PT_TC_MULTI];
    const int nb = m.a[0].nb, K = m.a[0].K, ncol = NT * 8;
    /* scratch, stage-major when every weight has the same stages and they
     * fit (each stage one bulk copy: PETREL_CUDA_TC_XSTAGE=0 keeps the row
     * layout), else the row layout: xb [nb][K] bf16, then sx [G][ncol] f32
     * (256-byte aligned). 4-bit stage-major launches take the XL kernels
     * (tc_xprep_kernel's xl layout; PETREL_CUDA_TC_XL=0: not), sized for
     * it; if its stages do not fit the scratch, sized again without. */
    const size_t xbb = ((size_t)nb * K * 2 + 255) & ~(size_t)255;
    bf16 *xb = (bf16 *)c->tile;
    float *sx = (float *)((char *)c->tile + xbb);
    using SH = tc_shape<BITS, GS>;
    bool xst = false, xl = false;
    int KS = 0, XS = 0;
    int64_t XB = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* XL kernels: the default loop only, up to 32 rows (at 64 rows,
         * NT = 8, they spill 32 bytes and were 2% slower: 250.8 against 246.0
         * µs per 8b layer) */
        xl = pass == 0 && BITS == 4 && NT <= 4 && g_tc_xl.on() && tc_xstage() && tc_loop();
        for (int i = 0; i < m.n; i++)
            if (!(su[i] = tc_xp_su<BITS, GS, NT>(m.a[i], xl))) return PT_ERR_UNSUPPORTED;
        xst = tc_xstage();
        for (int i = 1; i < m.n && xst; i++)
            if (su[i] != su[0]) xst = false;
        KS = su[0] * SH::UK, XS = KS + SH::XPAD;
        XB = xl ? (int64_t)(KS / 64) * ncol * 128 + (KS / GS) * ncol * 4
                : ((int64_t)nb * XS * 2 + (KS / GS) * ncol * 4 + 15) & ~(int64_t)15;
        if (xst && (size_t)((K + KS - 1) / KS) * (size_t)XB > c->tile_bytes) xst = false;
        if (!xl || xst) break;
    }
    if (!xst) xl = false; /* only after a pass without it (the loop above) */
    for (int i = 0; i < m.n; i++) m.a[i].SU = su[i], m.a[i].xb = xb, m.a[i].sxg = sx, m.a[i].xst = xst;
    const int64_t sxoff = xst ? (xl ? (int64_t)(KS / 64) * ncol * 128 : (int64_t)nb * XS * 2) : (int64_t)xbb;
    if (!xst) KS = K, XS = K, XB = 0;
    PT_TRY(tc_xprep<GS>(c, m.a[0], xb, ncol, KS, XS, XB, sxoff, (int)xl));
    for (int i = 0; i < m.n; i++) m.a[i].nsh = norm_shape{0, 0}, m.a[i].nw = NULL; /* the norm is done */
    /* clusters need one stage schedule in all their blocks: every weight's
     * units per stage equal (K and nb are); the grid is padded to a whole
     * number of clusters with blocks past the last weight's tiles (they
     * load x and write nothing) */
    int cl = tc_cluster();
    for (int i = 1; i < m.n && cl > 1; i++)
        if (su[i] != su[0]) cl = 1;
    if (cl > 1) {
        size_t smem = 0;
        for (int i = 0; i < m.n; i++) {
            const size_t b = tc_smem<BITS, GS>(nb, NT, su[i], PT_TC_WIDE_WARPS, true, xl);
            if (b > smem) smem = b;
        }
        if (!tc_cluster_fits<BITS, GS, NT>(grouped != 0, cl, smem)) cl = 1;
    }
    if (cl > 1) m.first[m.n] = (m.first[m.n] + cl - 1) / cl * cl;
    for (int i = 0; i < m.n; i++) m.a[i].drift = cl == 1 && g_tc_drift.on();
    if constexpr (BITS == 4 && NT <= 4)
        if (xl) return tc_launch_k<BITS, GS, NT, PT_TC_WIDE_WARPS, true, 1, false, true>(c, m, 1, grouped, cl, gl);
    return tc_launch_nt<BITS, GS, NT, PT_TC_WIDE_WARPS, true>(c, m, 1, grouped, cl, gl);
}

/* 17..64 rows of 4-bit weights with group size 64 on the warpgroup-MMA
 * kernels (gemv_wg_kernel.cuh: the same bits as the mma.sync kernels):
 * PETREL_CUDA_TC_WG=1, pt_cuda_tc_wg(1); off by default: on the H200 they
 * are not faster yet (bench/RESULTS.md). A negative argument: back to the
 * environment. */
#define PT_TC_WG_DEFAULT 0
static pt_switch g_tc_wg = {"PETREL_CUDA_TC_WG", PT_TC_WG_DEFAULT, -1, 0}; /* counts every wgmma launch */
extern "C" void pt_cuda_tc_wg(int on) { g_tc_wg.set(on); }
extern "C" unsigned long long pt_cuda_tc_wg_count(void) { return g_tc_wg.count(); }

/* PETREL_CUDA_TC_WG_GLU=0: the GLU launch of 33..64 rows (gate and up,
 * 4-bit g64, not split: S = 1, one warp a tile, as the 8B shape's) stays on
 * the mma.sync kernels (A/B; read once); default: the wgmma kernels, the
 * same bits (gemv_wg_kernel.cuh): the 8B gate/up with the GLU at 64 rows
 * 71.6 against 78.3 µs on an H100; serving 64 streams +2.6% on the H200
 * (bench/RESULTS.md); at 32 rows, for the other weights of that layer and
 * for split gate/up weights (the 1B and 3B shapes: +15%) they are slower.
 * pt_cuda_tc_wg_glu(0|1) sets it (a negative argument: back to the
 * environment). Launched for four blocks an SM (PETREL_CUDA_TC_WG_BPS_GLU,
 * below: its dynamic shared memory padded); at five, as the plain launches
 * run, this launch is 17% slower in the step, at three 40% slower. */
static pt_switch g_tc_wg_glu = {"PETREL_CUDA_TC_WG_GLU", 1, -1, 0};
extern "C" void pt_cuda_tc_wg_glu(int on) { g_tc_wg_glu.set(on); }
/* PETREL_CUDA_TC_WG_PLAIN=0: a plain or grouped launch (no GLU) of 33..64
 * rows stays on the mma.sync kernels (A/B; read once); default: the wgmma
 * kernels where its weights have one split (the 8B shape's o and down, not
 * its q/k/v: q is split unlike k and v), the same bits. With the receive
 * buffer over the x ring a block takes 32 KB and five blocks fit an SM:
 * the 8B o + down at 64 rows 56 against 61 µs on mma.sync on an H100
 * (padded for four blocks an SM ~80 µs); serving 64 streams +1.0 to 2.0%
 * (bench/RESULTS.md).
 * pt_cuda_tc_wg_plain(0|1) sets it (a negative argument: back to the
 * environment). */
static pt_switch g_tc_wg_plain = {"PETREL_CUDA_TC_WG_PLAIN", 1, -1, 0};
extern "C" void pt_cuda_tc_wg_plain(int on) { g_tc_wg_plain.set(on); }
/* PETREL_CUDA_TC_WG_MIXED (default 1): a plain grouped launch of 33..64 rows whose
 * weights split differently (the 8B shape's q/k/v: q 4 ways, k and v 8)
 * runs on the wgmma kernels too, in clusters of the largest split, each
 * holding as many blocks of quads of the smaller splits (gemv_wg_kernel:
 * every weight's own split and unit order, so the same bits); the default
 * (served 64 streams of the 8B shape +3.1%, bench/RESULTS.md); 0: such a
 * launch stays on the mma.sync kernels, as before the form existed. Read once;
 * pt_cuda_tc_wg_mixed(0|1) sets it (a negative argument: back to the
 * environment); such launches are counted. */
static pt_switch g_tc_wg_mixed = {"PETREL_CUDA_TC_WG_MIXED", 1, -1, 0};
extern "C" void pt_cuda_tc_wg_mixed(int on) { g_tc_wg_mixed.set(on); }
extern "C" unsigned long long pt_cuda_tc_wg_mixed_count(void) { return g_tc_wg_mixed.count(); }
/* Whether a launch of nb rows (a GLU one: split S) takes the wgmma kernels
 * by the switches above (tc_launch adds its shape conditions). */
static bool tc_wg_takes(bool glu, int nb, int S) {
    return g_tc_wg.on() || (nb > 32 && (glu ? S == 1 && g_tc_wg_glu.on() : g_tc_wg_plain.on()));
}

/* A switch of a wgmma kernel form: 1 in the GLU launch, 2 in the plain
 * launches too, 0 in neither (def when unset); its environment variable
 * read once, set() with a negative value going back to it; the launches
 * made with the form counted. */
struct tc_wg_form {
    const char *env;
    int def, v;
    unsigned long long launches;
    void set(int x) { v = x < 0 ? -1 : x > 2 ? 2 : x; }
    bool on(bool glu) {
        if (v < 0) v = pt_env_int(env, 0, 2, def);
        return glu ? v >= 1 : v == 2;
    }
    void counted() { __atomic_fetch_add(&launches, 1ull, __ATOMIC_RELAXED); }
    unsigned long long count() const { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }
};

/* The wgmma kernels' stage refills issued by one elected lane of the last
 * warp, every copy of the unit (gemv_wg_kernel.cuh RF), instead of a
 * branch per tile in every warp, each with its reconvergence: the same
 * copies and operations, so the same bits. PETREL_CUDA_TC_WG_REFILL: 2
 * (default) every launch (on an H100 the 8B layer's GEMVs at 64 rows
 * 140.4 -> 137.1 us, serving 64 streams +3.1%), 1 the GLU launch only, 0
 * neither (A/B; bench/RESULTS.md). pt_cuda_tc_wg_refill(0..2) sets it (a
 * negative argument: back to the environment). */
static tc_wg_form g_tc_wg_rf = {"PETREL_CUDA_TC_WG_REFILL", 2, -1, 0};
extern "C" void pt_cuda_tc_wg_refill(int v) { g_tc_wg_rf.set(v); }
extern "C" unsigned long long pt_cuda_tc_wg_refill_count(void) { return g_tc_wg_rf.count(); }

/* The wgmma kernels' main loop unrolled over the rings' three stages at
 * 64 columns (gemv_wg_kernel.cuh UN): every slot's addresses, descriptor and
 * mbarrier constants, no slot counters; the same units, copies and
 * operations, so the same bits.
 * PETREL_CUDA_TC_WG_UNROLL: 1 (default) the GLU launch (the 8B gate/up + GLU
 * at 64 rows 70.3 -> 67.5 us on an H100, serving 64 streams +1.2%), 2 the
 * plain launches too (their build for five blocks an SM then spills 84
 * bytes: served 64 streams 1.2% slower), 0 neither (A/B; bench/RESULTS.md).
 * pt_cuda_tc_wg_unroll(0..2) sets it (a negative argument: back to the
 * environment). */
static tc_wg_form g_tc_wg_un = {"PETREL_CUDA_TC_WG_UNROLL", 1, -1, 0};
extern "C" void pt_cuda_tc_wg_unroll(int v) { g_tc_wg_un.set(v); }
extern "C" unsigned long long pt_cuda_tc_wg_unroll_count(void) { return g_tc_wg_un.count(); }

/* The GLU launch's hand-off of the next GEMV's prepared x (gemv_wg_kernel.cuh
 * XO): asked for by backend.h handoff_hint (the forward pass, before a
 * batched step's gate/up: the down projection reads the GLU's output next),
 * the wgmma GLU launch (S = 1, rows a multiple of 64) also writes its output
 * in the x layout of the wgmma launches into the second half of the matmul
 * scratch (the first holds its own x), and the GEMV launch right after it,
 * over that output with the same rows and column layout, reads it there
 * instead of launching its x prepare: one launch a layer fewer, the same
 * bits (the same values and additions, tc_xprep_kernel's). A hand-off lapses
 * at the next GEMV launch whether taken or not, and a hint at the next
 * GEMV launch of any kind. The batched rows' attention hands its output on
 * to the output projection alike (pt_cuda_tc_xo_begin: dec_rows1_kernel
 * writes it, attention_short.cu). PETREL_CUDA_TC_WG_XO: 2 (default) both,
 * 1 the GLU launch's alone, 0 neither (A/B; read once; bench/RESULTS.md:
 * served 64 streams of the 8B shape on an H100 +0.8% for the GLU's, +0.9%
 * more for the attention's). pt_cuda_tc_wg_xo(0..2) sets it (a negative argument:
 * back to the environment); the hand-offs taken so far are counted. */
static tc_wg_form g_tc_wg_xo = {"PETREL_CUDA_TC_WG_XO", 2, -1, 0};
extern "C" void pt_cuda_tc_wg_xo(int v) { g_tc_wg_xo.set(v); }
extern "C" unsigned long long pt_cuda_tc_wg_xo_count(void) { return g_tc_wg_xo.count(); }
/* a launch's hand-off: want (a GLU launch asked to make one), take (the one
 * the launch before made), made (the one this launch made) */
struct tc_xo {
    bool want;
    pt_cuda_xo take, made;
};
/* The hand-off's place: the second half of the matmul scratch. */
static size_t tc_xo_off(const pt_cuda *c) { return (c->tile_bytes / 2) & ~(size_t)255; }

/* The GLU and plain kernels by [refill form][unrolled]; the 32-column rings
 * have six weight stages, so no unrolled form there (tc_launch_wg asks for
 * it at 64 columns only). */
template <int NCOL>
static void (*const wg_glu_fns[2][2])(tc_args, tc_glu) = {
    {gemv_wg_glu_kernel<NCOL, false, false>, gemv_wg_glu_kernel<NCOL, false, NCOL == 64>},
    {gemv_wg_glu_kernel<NCOL, true, false>, gemv_wg_glu_kernel<NCOL, true, NCOL == 64>}};
template <int NCOL>
static void (*const wg_plain_fns[2][2])(wg_multi_args) = {
    {gemv_wg_kernel<NCOL, false, false>, gemv_wg_kernel<NCOL, false, NCOL == 64>},
    {gemv_wg_kernel<NCOL, true, false>, gemv_wg_kernel<NCOL, true, NCOL == 64>}};

/* The wgmma launch of m's weights (one item, no experts; clusters of CL <=
 * 8 blocks: a GLU launch's 2S, a plain one's largest split S, each weight's
 * split dividing it — one split for all unless PETREL_CUDA_TC_WG_MIXED; the
 * prepared x fits the scratch), else PT_ERR_UNSUPPORTED with nothing
 * launched: the x prepare in the wg layout, then the GEMV. */
template <int NCOL>
static pt_status tc_launch_wg(const pt_cuda *c, const tc_multi_args &m, const tc_glu *gl, tc_xo *xo) {
    using SH = wg_shape<NCOL>;
    const int K = m.a[0].K, S = m.a[0].S, nb = m.a[0].nb;
    int CL = gl ? 2 * S : S;
    bool mixed = false;
    for (int i = 1; i < m.n && !gl; i++)
        if (m.a[i].S != S) {
            if (!g_tc_wg_mixed.on()) return PT_ERR_UNSUPPORTED;
            mixed = true;
            if (m.a[i].S > CL) CL = m.a[i].S;
        }
    if (K % 64 || CL > 8 || !c->tile || (size_t)(K / 64) * SH::XU > c->tile_bytes) return PT_ERR_UNSUPPORTED;
    /* XO: x handed off by the GLU launch before this one (its output, these rows and columns, no norm) */
    const size_t xoff = tc_xo_off(c);
    const bool take = !gl && xo && xo->take.y && xo->take.y == m.a[0].x && xo->take.nb == nb && xo->take.K == K &&
                      xo->take.ncol == NCOL && !m.a[0].nsh.V;
    const bf16 *xb = (const bf16 *)((const char *)c->tile + (take ? xoff : 0));
    wg_multi_args w;
    memset(&w, 0, sizeof w);
    w.n = m.n;
    w.cl = CL;
    for (int i = 0; i < m.n; i++) {
        const tc_args &a = m.a[i];
        if ((gl ? a.S != S : CL % a.S != 0) || a.experts || a.expert != 0 || a.n_experts > 1 || a.K != K)
            return PT_ERR_UNSUPPORTED;
        w.a[i] = a;
        w.a[i].xb = xb;
        /* clusters: the weight's quads, CL / S of them a cluster (GLU: one) */
        const int qpc = gl ? 1 : CL / a.S;
        w.first[i + 1] = w.first[i] + (((a.N + 15) / 16 + 3) / 4 + qpc - 1) / qpc;
    }
    /* XO: this GLU launch hands its output on as the next GEMV's x where asked, its rows whole quads */
    tc_glu glx;
    if (gl) {
        glx = *gl;
        glx.xo = nullptr;
        const int N = m.a[0].N;
        if (xo && xo->want && g_tc_wg_xo.on(true) && S == 1 && N % 64 == 0 && m.a[0].ldy == N &&
            tc_wg_takes(false, nb, S) && (size_t)(K / 64) * SH::XU <= xoff &&
            xoff + (size_t)(N / 64) * SH::XU <= c->tile_bytes) {
            glx.xo = (char *)c->tile + xoff;
            xo->made = pt_cuda_xo{m.a[0].y, nb, N, NCOL};
        }
    }
    if (!take)
        PT_TRY(tc_xprep<64>(c, m.a[0], (bf16 *)c->tile, NCOL, 64, 64, (int64_t)SH::XU, (int64_t)NCOL * 128, 2));
    /* Blocks an SM, asked for through the dynamic shared memory (the layout
     * needs 32 KB at 64 columns; the registers allow five):
     * PETREL_CUDA_TC_WG_BPS_GLU (default 4) for the GLU launch,
     * PETREL_CUDA_TC_WG_BPS (default 0: as many as fit) for the others
     * (the unsplit ones padded for four, as the GLU launch is, measured 4%
     * slower on the 8b lm_head at 64 rows: bench/RESULTS.md). A/B only:
     * the same bits at any value. The
     * SM's shared memory and the block's reserve are the backend's (read at
     * creation). */
    static int bps_env[2] = {-1, -1};
    const int gi = gl ? 1 : 0;
    if (bps_env[gi] < 0)
        bps_env[gi] = pt_env_int(gl ? "PETREL_CUDA_TC_WG_BPS_GLU" : "PETREL_CUDA_TC_WG_BPS", 0, 16, gl ? 4 : 0);
    const int bps = bps_env[gi];
    size_t dyn = SH::SMEM;
    if (bps > 0 && c->sm_smem > 0) {
        /* the SM's share less the block's reserve, rounded down to the
         * allocation's 256 bytes (unrounded, five an SM got four) */
        const size_t want = ((size_t)c->sm_smem / (size_t)bps - (size_t)c->blk_rsv) & ~(size_t)255;
        if (want > dyn) dyn = want;
    }
    const int rf = g_tc_wg_rf.on(gl != nullptr), un = NCOL == 64 && g_tc_wg_un.on(gl != nullptr);
    void (*const gfn)(tc_args, tc_glu) = wg_glu_fns<NCOL>[rf][un];
    void (*const pfn)(wg_multi_args) = wg_plain_fns<NCOL>[rf][un];
    static size_t attr_set[2][2][2];
    if (dyn > 48 * 1024 && attr_set[gi][rf][un] < dyn) {
        if (gl) CUDA_CHECK(cudaFuncSetAttribute(gfn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
        else CUDA_CHECK(cudaFuncSetAttribute(pfn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
        attr_set[gi][rf][un] = dyn;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.stream = c->stream;
    cfg.gridDim = dim3((unsigned)(w.first[w.n] * CL));
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = dyn;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = (unsigned)CL;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = 1;
    if (tc_pdl_on()) cfg.attrs = at, cfg.numAttrs = 2;
    else cfg.attrs = at + 1, cfg.numAttrs = 1;
    if (gl) CUDA_CHECK(cudaLaunchKernelEx(&cfg, gfn, w.a[0], glx));
    else CUDA_CHECK(cudaLaunchKernelEx(&cfg, pfn, w));
    g_tc_wg.counted();
    if (take) g_tc_wg_xo.counted();
    if (mixed) g_tc_wg_mixed.counted();
    if (rf) g_tc_wg_rf.counted();
    if (un) g_tc_wg_un.counted();
    return PT_OK;
}

/* 2 to 8 rows through the XP kernels too (16-warp blocks, x prepared once
 * per launch; NT = 1): PETREL_CUDA_TC_XP8, pt_cuda_tc_xp8() (A/B, a
 * negative argument: back to the environment; the same bits either way:
 * the block size and x's staging only decide when x is staged and which
 * block a tile's S warps sit in). */
static pt_switch g_tc_xp8 = {"PETREL_CUDA_TC_XP8", 1, -1, 0};
extern "C" void pt_cuda_tc_xp8(int on) { g_tc_xp8.set(on); }

/* Whether a launch may take the XP kernels: above 8 rows (above 1 with
 * PETREL_CUDA_TC_XP8), 16-warp blocks, one item, and scratch that holds the
 * prepared x. */
static bool tc_xp_ok(const pt_cuda *c, int nb, int K, unsigned items) {
    if (nb <= (g_tc_xp8.on() ? 1 : 8) || items != 1 || !tc_xpre() || !c->tile) return false;
    const size_t need = (((size_t)nb * K * 2 + 255) & ~(size_t)255) + (size_t)(K / 32) * 64 * 4;
    return need <= c->tile_bytes;
}

/* Above 8 rows a block has PT_TC_WIDE_WARPS warps (twice the tiles per
 * block, so x is staged half as often per weight byte, by twice the threads),
 * or PETREL_CUDA_TC_WIDE=0 / pt_cuda_tc_wide(0): PT_TC_WARPS (A/B). The bits
 * are the same either way: the block size only decides which block a tile's
 * S warps sit in, not the unit assignment or the order of any addition. */
static int g_tc_wide = -1;
extern "C" void pt_cuda_tc_wide(int on) { g_tc_wide = on != 0; }
static int tc_wide(void) {
    if (g_tc_wide < 0) g_tc_wide = pt_env_on("PETREL_CUDA_TC_WIDE");
    return g_tc_wide;
}

/* tc_launch's 16-warp blocks for the one-row GLU launches of the folded
 * norm: PETREL_CUDA_TC_GLU16=0 or pt_cuda_tc_glu16(0) keeps 8-warp blocks
 * (A/B; read once; a negative argument: back to the environment). The
 * launches taken so far (tests check it ran). */
static pt_switch g_tc_glu16 = {"PETREL_CUDA_TC_GLU16", 1, -1, 0};
extern "C" void pt_cuda_tc_glu16(int on) { g_tc_glu16.set(on); }
extern "C" unsigned long long pt_cuda_tc_glu16_count(void) { return g_tc_glu16.count(); }
/* Code blocks a unit of bits-wide codes in groups of gs (tc_shape::BPU, at
 * run time); a unit spans bpu · 256 / bits values of K (tc_shape::UK). */
static int tc_bpu(int bits, int gs) { return gs * bits / 4 >= 64 ? gs * bits / 4 / 64 : 1; }

/* tc_launch's rule for the one-row GLU launch's 16-warp blocks, from the
 * gate weight's shape (N rows, K columns, bits, group size gs) and split S:
 * its 8-warp launch (TPB/2 = 8/S/2 tile pairs a block; an odd 8/S
 * declines) has more than two blocks an SM, and each warp streams more code
 * blocks than its ring holds (units per warp times blocks per unit). */
static bool tc_glu16_shape(const pt_cuda *c, int64_t N, int64_t K, int bits, int gs, int S) {
    if ((PT_TC_WARPS / S) % 2) return false;
    const int bpu = tc_bpu(bits, gs);
    const int64_t tpe = (N + 15) / 16, tpb = PT_TC_WARPS / S / 2, nu = K / (bpu * (256 / bits));
    return (tpe + tpb - 1) / tpb > 2 * (int64_t)c->sm_count && (nu + S - 1) / S * bpu > PT_TC_RING;
}

/* Sets each weight's units per stage (from its own S: whole rounds of S,
 * about PT_TC_XBUDGET bytes of x) and the block table for W warps per
 * block, then launches with the NT for the row count. */
template <int BITS, int GS>
static pt_status tc_launch(const pt_cuda *c, tc_multi_args &m, unsigned items, int grouped, const tc_glu *gl,
                           bool wide_only, tc_xo *xo) {
    using SH = tc_shape<BITS, GS>;
    const int nb = m.a[0].nb;
    /* 2..8 rows: XP (16-warp blocks) where it will be taken */
    const bool xp8 = nb >= 2 && nb <= 8 && tc_wide() && tc_xp_ok(c, nb, m.a[0].K, items);
    /* each weight's units per stage and the block table for W warps per block */
    auto table = [&](int W) -> pt_status {
        m.first[0] = 0;
        for (int i = 0; i < m.n; i++) {
            tc_args &a = m.a[i];
            const int NU = a.K / SH::UK;
            int su = (int)(PT_TC_XBUDGET(a.nb) / ((int64_t)a.nb * 2 * SH::UK));
            /* up to 8 rows with the unrolled ring loop (LV 2): whole steps of
             * PT_TC_RING blocks per warp in every stage but the last (the stage
             * size decides only when x is staged, not the bits) */
            const int rnd = nb <= 8 && tc_lv<BITS>(m) == 2 ? a.S * ((PT_TC_RING + SH::BPU - 1) / SH::BPU) : a.S;
            su = su / rnd * rnd;
            if (su < rnd) su = rnd;
            const int nu_r = (NU + a.S - 1) / a.S * a.S;
            a.SU = su < nu_r ? su : nu_r;
            /* GLU: half the block's warps per projection, so whole tiles of
             * both need an even number of tiles per block */
            if (gl && (W / a.S) % 2) return PT_ERR_UNSUPPORTED;
            const int tpe = (a.N + 15) / 16, tpb = gl ? W / a.S / 2 : W / a.S;
            m.first[i + 1] = m.first[i] + (tpe + tpb - 1) / tpb;
        }
        return PT_OK;
    };
    if (xp8 && table(PT_TC_WIDE_WARPS) == PT_OK) {
        const pt_status st = tc_launch_xp<BITS, GS, 1>(c, m, grouped, gl);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    if constexpr (BITS == 4 && GS == 64)
        if (nb > 16 && items == 1 && tc_xpre() && tc_wg_takes(gl != nullptr, nb, m.a[0].S)) {
            const pt_status st = nb <= 32 ? tc_launch_wg<32>(c, m, gl, xo) : tc_launch_wg<64>(c, m, gl, xo);
            if (st != PT_ERR_UNSUPPORTED) return st;
        }
    const int wide = nb > 8 && tc_wide();
    /* One row, the GLU epilogue with the folded norm, past two 8-warp blocks an SM, each warp streaming more
     * blocks than its ring holds (the 3B and 4B shapes' gate/up): 16-warp blocks, half as many, each warp
     * running the same tile, units and code (the same bits), the row's norm and staging once per 16 warps.
     * tg128 on the H200: llama-3.2-3b +9%, qwen3-4b +2%, gemma-3-4b within noise; the 1B shape's gate/up (a
     * warp's 8 blocks all in its ring) lost 2% with them and keeps 8-warp blocks (bench/RESULTS.md). */
    if (nb == 1 && gl && m.n == 1 && items == 1 && m.a[0].nsh.V && g_tc_glu16.on() &&
        tc_glu16_shape(c, m.a[0].N, m.a[0].K, BITS, GS, m.a[0].S) && table(PT_TC_WIDE_WARPS) == PT_OK) {
        const pt_status st = tc_launch_nt<BITS, GS, 1, PT_TC_WIDE_WARPS>(c, m, items, grouped, 1, gl);
        if (st == PT_OK) g_tc_glu16.counted();
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    if (wide_only) return PT_ERR_UNSUPPORTED; /* the folded GLU only on those blocks (tc_glu_launch) */
    PT_TRY(table(wide ? PT_TC_WIDE_WARPS : PT_TC_WARPS));
    if (nb <= 8) return tc_launch_nt<BITS, GS, 1, PT_TC_WARPS>(c, m, items, grouped, 1, gl);
    if (!wide) {
        if (nb <= 16) return tc_launch_nt<BITS, GS, 2, PT_TC_WARPS>(c, m, items, grouped, 1, gl);
        if (nb <= 32) return tc_launch_nt<BITS, GS, 4, PT_TC_WARPS>(c, m, items, grouped, 1, gl);
        return tc_launch_nt<BITS, GS, 8, PT_TC_WARPS>(c, m, items, grouped, 1, gl);
    }
    if (tc_xp_ok(c, nb, m.a[0].K, items)) {
        const pt_status st = nb <= 16   ? tc_launch_xp<BITS, GS, 2>(c, m, grouped, gl)
                             : nb <= 32 ? tc_launch_xp<BITS, GS, 4>(c, m, grouped, gl)
                                        : tc_launch_xp<BITS, GS, 8>(c, m, grouped, gl);
        if (st != PT_ERR_UNSUPPORTED) return st;
    }
    if (nb <= 16) return tc_launch_nt<BITS, GS, 2, PT_TC_WIDE_WARPS>(c, m, items, grouped, 1, gl);
    if (nb <= 32) return tc_launch_nt<BITS, GS, 4, PT_TC_WIDE_WARPS>(c, m, items, grouped, 1, gl);
    return tc_launch_nt<BITS, GS, 8, PT_TC_WIDE_WARPS>(c, m, items, grouped, 1, gl);
}

/* Warps per SM the split aims at: PT_TC_TARGET_WARPS, or
 * PETREL_CUDA_TC_WARPS (read once; for A/B runs), or pt_cuda_tc_warps(). */
static int g_tc_warps = 0;
extern "C" void pt_cuda_tc_warps(int w) { g_tc_warps = w >= 1 && w <= 64 ? w : PT_TC_TARGET_WARPS; }

/* A weight of at least PT_TC_S1_TILES tiles per SM is not split (one warp
 * per tile): its one-row launch then fills the SMs on the unrolled loop's
 * two-blocks-per-SM build (the 8B shape's gate/up, 896 tiles each: 224 GLU
 * blocks of 4 + 4 tiles, one wave, where split 2 ways its 448 blocks took
 * the four-per-SM build; tg128 +3%, its gate/up at 32 and 64 rows 7-8%
 * faster, and 1 to 64 served streams 1-3% faster, bench/RESULTS.md).
 * PETREL_CUDA_TC_S1=0 or pt_cuda_tc_s1(0): the
 * split as before (A/B; read once; a negative argument: back to the
 * environment). The split is part of the bits (the S partials are added in
 * warp order), so the switch changes them, alike at every row count. */
#define PT_TC_S1_TILES 6
static pt_switch g_tc_s1 = {"PETREL_CUDA_TC_S1", 1, -1, 0};
extern "C" void pt_cuda_tc_s1(int on) { g_tc_s1.set(on); }

/* Warps per SM the split of an attention input projection (q, k, v:
 * PT_ROLE_ATTN_IN) aims at where each warp then still streams at least
 * PT_TC_ATTN_UNITS units: they run grouped, one launch for the three, so q
 * needs fewer warps per tile than an output projection of its shape to
 * fill the SMs. The 8B shape's q (K 4096: 16 units a warp) splits 4 ways
 * instead of 8: its q/k/v launch 11.5 -> 10.3 us at one row and 32.1 ->
 * 26.2 us at 64, tg128 +2.7%, 1 to 64 served streams +2 to +5%; at K 3072
 * and 2560 (12 and 10 units a warp: the 3B and qwen3-4b shapes) the same
 * split lost 2.3% and 3.9% tg128, so they keep the common target
 * (bench/RESULTS.md). PETREL_CUDA_TC_ATTN_WARPS=N (read once; 0: as every
 * other weight, the A/B) or pt_cuda_tc_attn_warps();
 * PETREL_CUDA_TC_ATTN_UNITS=N the units a warp must keep (A/B). */
#define PT_TC_ATTN_WARPS 4
#define PT_TC_ATTN_UNITS 16
static int g_tc_attn_warps = -1, g_tc_attn_units = PT_TC_ATTN_UNITS;
extern "C" void pt_cuda_tc_attn_warps(int w) { g_tc_attn_warps = w >= 0 && w <= 64 ? w : PT_TC_ATTN_WARPS; }

/* Warps per tile from the weight's shape and role only (batch invariance:
 * the same for every call with the weight): enough warps for
 * ~PT_TC_TARGET_WARPS per SM (PT_TC_ATTN_WARPS for q, k, v), each keeping
 * >= 4 units; one from PT_TC_S1_TILES tiles per SM on. */
static int tc_split(const pt_cuda *c, int64_t N, int64_t K, int bits, int gs, int role) {
    if (!g_tc_warps) {
        pt_cuda_tc_warps(pt_env_int("PETREL_CUDA_TC_WARPS", 1, 64, 0));
    }
    if (g_tc_attn_warps < 0) {
        pt_cuda_tc_attn_warps(pt_env_int("PETREL_CUDA_TC_ATTN_WARPS", 0, 64, -1));
        /* the units a warp must keep (A/B) */
        g_tc_attn_units = pt_env_int("PETREL_CUDA_TC_ATTN_UNITS", 0, 1 << 20, g_tc_attn_units);
    }
    const int64_t tpe = (N + 15) / 16, uk = tc_bpu(bits, gs) * (256 / bits);
    const int64_t NU = K / uk;
    if (g_tc_s1.on() && tpe >= (int64_t)PT_TC_S1_TILES * c->sm_count) return 1;
    auto split_for = [&](int w) {
        const int64_t target = (int64_t)w * c->sm_count;
        int S = 1;
        while (S < PT_TC_WARPS && tpe * S < target && NU >= 4 * S) S *= 2;
        return S;
    };
    if (role == PT_ROLE_ATTN_IN && g_tc_attn_warps) {
        const int S = split_for(g_tc_attn_warps);
        if (NU >= (int64_t)g_tc_attn_units * S) return S;
    }
    return split_for(g_tc_warps);
}

/* The arguments of one weight's launch (SU and the block table: tc_launch). */
static void tc_args_of(const pt_cuda *c, tc_args &a, float *y, const float *x, int64_t nb, const pt_matrix *w,
                       int64_t expert, const int32_t *experts, int x_div, int64_t ldy) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    a.w = (const uint4 *)cw->data;
    a.sb = (const uint4 *)cw->scales;
    a.bias = cw->bias;
    a.bt = w->bias_dtype;
    a.x = x;
    a.y = y;
    a.ldy = ldy;
    a.N = (int)w->rows;
    a.K = (int)w->cols;
    a.nb = (int)nb;
    a.S = tc_split(c, w->rows, w->cols, w->bits, w->group_size, cw->role);
    a.SU = 0;
    a.x_div = x_div;
    a.expert = expert;
    a.n_experts = w->n_experts > 1 ? w->n_experts : 1;
    a.experts = experts;
    a.err = c->err_dev;
}

static pt_status tc_dispatch(pt_cuda *c, tc_multi_args &m, int bits, int gs, unsigned items, int grouped,
                             const tc_glu *gl = NULL, bool wide_only = false) {
    /* the hint and the hand-off (XO) lapse here: a GLU launch may make a new one, a plain one take the last */
    tc_xo xo = {c->xo_armed && gl, c->xo, {}};
    c->xo_armed = 0;
    c->xo = pt_cuda_xo{};
    pt_status st;
    switch (bits * 1000 + gs) {
    case 4032: st = tc_launch<4, 32>(c, m, items, grouped, gl, wide_only, &xo); break;
    case 4064: st = tc_launch<4, 64>(c, m, items, grouped, gl, wide_only, &xo); break;
    case 4128: st = tc_launch<4, 128>(c, m, items, grouped, gl, wide_only, &xo); break;
    case 8032: st = tc_launch<8, 32>(c, m, items, grouped, gl, wide_only, &xo); break;
    case 8064: st = tc_launch<8, 64>(c, m, items, grouped, gl, wide_only, &xo); break;
    default: st = tc_launch<8, 128>(c, m, items, grouped, gl, wide_only, &xo); break;
    }
    if (st == PT_OK && xo.made.y) c->xo = xo.made;
    return st;
}

void pt_cuda_handoff_hint(pt_backend *be) { pt_cuda_of(be)->xo_armed = 1; }

char *pt_cuda_tc_xo_begin(pt_cuda *c, int nb, int K, int *unit) {
    const bool armed = c->xo_armed;
    c->xo_armed = 0;
    using SH = wg_shape<64>;
    const size_t xoff = tc_xo_off(c);
    /* the GEMV after it takes the wgmma kernels at 64 columns (33..64 rows, tc_launch) */
    if (!armed || !g_tc_wg_xo.on(false) || nb <= 32 || nb > 64 || K % 64 || !c->tile || !tc_wg_takes(false, nb, 1) ||
        xoff + (size_t)(K / 64) * SH::XU > c->tile_bytes)
        return NULL;
    *unit = SH::XU;
    return (char *)c->tile + xoff;
}

void pt_cuda_tc_xo_made(pt_cuda *c, const float *x, int nb, int K) {
    c->xo = pt_cuda_xo{x, nb, K, 64};
}

pt_status pt_cuda_tc_gemv(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *w, int64_t expert,
                          const int32_t *experts, int64_t items, int x_div, int64_t ldy) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    if (!cw || !cw->tc) return pt_error(PT_ERR_INTERNAL, "gemv: weight not in the tensor-core layout");
    if (nb < 1 || nb > 64 || items < 1 || items > 65535 || (uintptr_t)x % 16)
        return pt_error(PT_ERR_INTERNAL, "gemv: %lld rows × %lld items (1..64 × 1..65535, 16-byte aligned x)",
                        (long long)nb, (long long)items);
    tc_multi_args m;
    memset(&m, 0, sizeof m);
    m.n = 1;
    tc_args_of(c, m.a[0], y, x, nb, w, expert, experts, x_div, ldy);
    return tc_dispatch(c, m, w->bits, w->group_size, (unsigned)items, 0);
}

/* Grouped launches made so far (tests check the grouped path was taken). */
static unsigned long long g_tc_multi_launches;
extern "C" unsigned long long pt_cuda_tc_multi_count(void) { return __atomic_load_n(&g_tc_multi_launches, __ATOMIC_RELAXED); }

int pt_cuda_tc_multi_ok(const pt_cuda *c, int n, const pt_matrix *const *w) {
    (void)c;
    if (n < 1 || n > PT_TC_MULTI) return 0;
    for (int i = 0; i < n; i++) {
        const pt_cuda_weight *cw = pt_cuda_w(w[i]);
        if (!cw || !cw->tc || w[i]->n_experts > 1 || w[i]->bits != w[0]->bits ||
            w[i]->group_size != w[0]->group_size || w[i]->cols != w[0]->cols)
            return 0;
    }
    return 1;
}

pt_status pt_cuda_tc_gemv_multi(pt_cuda *c, int n, float *const *y, const float *x, int64_t nb,
                                const pt_matrix *const *w) {
    if (!pt_cuda_tc_multi_ok(c, n, w))
        return pt_error(PT_ERR_INTERNAL, "gemv: %d weights not all in the tensor-core layout with one bits, group "
                                         "size and K (1..%d weights)", n, PT_TC_MULTI);
    if (nb < 1 || nb > 64 || (uintptr_t)x % 16)
        return pt_error(PT_ERR_INTERNAL, "gemv: %lld rows (1..64, 16-byte aligned x)", (long long)nb);
    tc_multi_args m;
    memset(&m, 0, sizeof m);
    m.n = n;
    __atomic_fetch_add(&g_tc_multi_launches, 1ull, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) tc_args_of(c, m.a[i], y[i], x, nb, w[i], 0, NULL, 1, w[i]->rows);
    return tc_dispatch(c, m, w[0]->bits, w[0]->group_size, 1, 1);
}

/* Launches made so far with the GLU epilogue (tests check it ran). */
static unsigned long long g_tc_glu_launches;
extern "C" unsigned long long pt_cuda_tc_glu_count(void) { return __atomic_load_n(&g_tc_glu_launches, __ATOMIC_RELAXED); }

/* The folded norm's arguments (tc_args::nw …, nadd) for a.nb rows of K
 * values, or false where the fold does not apply: a row past PT_TC_NRM_V
 * chunks a thread (4096 values), a weight missing or not 16-byte aligned,
 * f32 activations (not the GEMV's mode), a residual addend at one row (the
 * one-row kernels stage the norm themselves and add nothing) or not
 * 16-byte aligned. */
static bool tc_norm_of(const pt_cuda *c, tc_args &a, const pt_norm_in *nrm) {
    const norm_shape sh = norm_reg_shape(a.K);
    if (!sh.V || sh.V > PT_TC_NRM_V || sh.threads > PT_TC_NRM_R * PT_TC_WARPS * 32 || a.K % 4 ||
        c->base.act != PT_ACT_BF16 || (nrm->style != PT_RMS_NOSCALE && (!nrm->w || (uintptr_t)nrm->w % 16)) ||
        (nrm->add && (a.nb == 1 || (uintptr_t)nrm->add % 16)))
        return false;
    a.nadd = nrm->add;
    a.nw = nrm->w;
    a.nwt = nrm->wtype;
    a.nstyle = (int)nrm->style;
    a.nbf = 1;
    a.neps = nrm->eps;
    a.nsh = sh;
    return true;
}

/* A decode row's gate/up norm fold where the caller leaves it to the
 * backend (pt_norm_in.optional): 2 (default) only where the launch takes the
 * 16-warp blocks (tc_launch: the 3B and 4B shapes' gate/up), 1 always, 0
 * never; PETREL_CUDA_FOLD_GLU or pt_cuda_fold_glu() (read once; -1: back to
 * the environment). On the H200 the fold on 8-warp blocks lost to the
 * separate norm kernel (1B and 8B shapes), on 16-warp blocks it won (3B, 4B:
 * bench/RESULTS.md, "the one-row folds re-measured"). */
static int g_fold_glu = -1;
extern "C" void pt_cuda_fold_glu(int mode) { g_fold_glu = mode < 0 || mode > 2 ? -1 : mode; }
static int fold_glu_mode(void) {
    if (g_fold_glu < 0) {
        static const int fg[] = {0, 1};
        g_fold_glu = pt_env_pick("PETREL_CUDA_FOLD_GLU", fg, 2, 2);
    }
    return g_fold_glu;
}

static pt_status tc_glu_launch(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *wg,
                               const pt_matrix *wu, pt_glu_kind act, const pt_norm_in *nrm) {
    const int mode = nrm && nrm->optional && nb == 1 ? fold_glu_mode() : 1;
    if (mode == 0) return PT_ERR_UNSUPPORTED;
    const pt_matrix *w[2] = {wg, wu};
    /* the GLU kernels exist for the default inner loop only (PETREL_CUDA_TC_LOOP=0: the separate calls) */
    if (!pt_cuda_tc_multi_ok(c, 2, w) || wg->rows != wu->rows || nb < 1 || nb > 64 || (uintptr_t)x % 16 ||
        (act != PT_GLU_SILU && act != PT_GLU_GELU_TANH) || !tc_loop())
        return PT_ERR_UNSUPPORTED;
    tc_multi_args m;
    memset(&m, 0, sizeof m);
    m.n = 1;
    tc_args_of(c, m.a[0], y, x, nb, wg, 0, NULL, 1, wg->rows);
    if (nrm && !tc_norm_of(c, m.a[0], nrm)) return PT_ERR_UNSUPPORTED;
    const pt_cuda_weight *cu = pt_cuda_w(wu);
    tc_glu gl;
    gl.w2 = (const uint4 *)cu->data;
    gl.sb2 = (const uint4 *)cu->scales;
    gl.bias2 = cu->bias;
    gl.bt2 = wu->bias_dtype;
    gl.fn = (int)act;
    gl.bf = c->base.act == PT_ACT_BF16;
    gl.xo = nullptr; /* tc_launch_wg sets it where it hands off */
    const pt_status st = tc_dispatch(c, m, wg->bits, wg->group_size, 1, 0, &gl, mode == 2);
    if (st == PT_OK) __atomic_fetch_add(&g_tc_glu_launches, 1ull, __ATOMIC_RELAXED);
    return st;
}

pt_status pt_cuda_tc_gemv_glu(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *wg,
                              const pt_matrix *wu, pt_glu_kind act) {
    return tc_glu_launch(c, y, x, nb, wg, wu, act, NULL);
}

/* ---- the folded norm and residual add (backend.h matmul_norm, matmul_glu_norm, matmul_add) ----
 * One activation row. The norm: every block sums the row's squares itself
 * (norm_row_inv: the register kernel's order) and stages norm_out of each
 * value instead of the value, so x need not be normalized into a buffer
 * by a launch of its own; the add: the epilogue stores round(y + out) into
 * the residual stream y. Launches made so far (tests check they ran). */
static unsigned long long g_tc_fold_launches;
extern "C" unsigned long long pt_cuda_tc_fold_count(void) {
    return __atomic_load_n(&g_tc_fold_launches, __ATOMIC_RELAXED);
}

pt_status pt_cuda_tc_gemv_norm(pt_cuda *c, int n, float *const *y, const float *x, int64_t nb,
                               const pt_matrix *const *w, const pt_norm_in *nrm) {
    if (!pt_cuda_tc_multi_ok(c, n, w) || (uintptr_t)x % 16 || nb < 1 || nb > 64) return PT_ERR_UNSUPPORTED;
    tc_multi_args m;
    memset(&m, 0, sizeof m);
    m.n = n;
    for (int i = 0; i < n; i++) {
        tc_args_of(c, m.a[i], y[i], x, nb, w[i], 0, NULL, 1, w[i]->rows);
        if (!tc_norm_of(c, m.a[i], nrm)) return PT_ERR_UNSUPPORTED;
    }
    const pt_status st = tc_dispatch(c, m, w[0]->bits, w[0]->group_size, 1, n > 1);
    if (st == PT_OK) {
        __atomic_fetch_add(&g_tc_fold_launches, 1ull, __ATOMIC_RELAXED);
        if (n > 1) __atomic_fetch_add(&g_tc_multi_launches, 1ull, __ATOMIC_RELAXED);
    }
    return st;
}

pt_status pt_cuda_tc_gemv_glu_norm(pt_cuda *c, float *y, const float *x, int64_t nb, const pt_matrix *wg,
                                   const pt_matrix *wu, pt_glu_kind act, const pt_norm_in *nrm) {
    const pt_status st = tc_glu_launch(c, y, x, nb, wg, wu, act, nrm);
    if (st == PT_OK) __atomic_fetch_add(&g_tc_fold_launches, 1ull, __ATOMIC_RELAXED);
    return st;
}

/* PETREL_CUDA_FOLD_EARLY=0: the add's GEMV releases its dependent launch
 * after its main loop, as every GEMV does (A/B; read once). Default: right
 * after its first weight loads, so the folded GEMV after it (gate/up after
 * o, the next layer's q/k/v after down) streams its first weights while
 * this one runs. */
static int tc_rel_early(void) {
    static int v = -1;
    if (v < 0) v = pt_env_on("PETREL_CUDA_FOLD_EARLY");
    return v;
}

/* PETREL_CUDA_L2_PF=MB (default 16; 0: off; A/B, read once): the one-row
 * matmul_add after a prefetch_hint (the output projection, told the FFN's
 * weights) fetches up to MB MiB of the hinted weights into the L2 — whole
 * weights while they fit, then the same prefix of every tile of a run of
 * weights of one shape (gate and up alike) — from its blocks, right behind
 * their first weight loads (before the griddepcontrol.wait), so they
 * arrive during the attention's and the norm's latency-bound launches.
 * tg128 on an H100 (24 MiB): llama-3.1-8b +1.7% to +2.5%, llama-3.2-1b +1.5%; on an H200 16 MiB against
 * 24: llama-3.1-8b +0.8%, llama-3.2-1b +0.2% (bench/RESULTS.md).
 * pt_cuda_l2_pf(mb) overrides it (negative: back to the environment). */
static int g_pf_mb = -1;
extern "C" void pt_cuda_l2_pf(int mb) { g_pf_mb = mb < 0 ? -1 : mb; }
static int tc_pf_mb(void) {
    if (g_pf_mb < 0) g_pf_mb = pt_env_int("PETREL_CUDA_L2_PF", 0, 1024, 16);
    return g_pf_mb;
}
static unsigned long long g_pf_launches; /* launches that issued a prefetch (tests) */
extern "C" unsigned long long pt_cuda_l2_pf_count(void) { return __atomic_load_n(&g_pf_launches, __ATOMIC_RELAXED); }

/* Whether a decode row's GLU launch over gate weight wg folds the FFN's
 * norm (tc_glu_launch with fold_glu_mode, tc_launch's 16-warp rule), so no
 * norm launch runs between the output projection and it. */
static bool tc_glu_folds_norm(const pt_cuda *c, const pt_matrix *wg) {
    const int mode = fold_glu_mode();
    if (mode != 2) return mode == 1;
    const pt_cuda_weight *cw = pt_cuda_w(wg);
    if (!g_tc_glu16.on() || !cw || !cw->tc) return false;
    const int S = tc_split(c, wg->rows, wg->cols, wg->bits, wg->group_size, cw->role);
    return tc_glu16_shape(c, wg->rows, wg->cols, wg->bits, wg->group_size, S);
}

void pt_cuda_prefetch_hint(pt_backend *be, const pt_matrix *const *w, int n) {
    pt_cuda *c = pt_cuda_of(be);
    c->pf_n = 0;
    /* taken where a norm launch separates the output projection from the GLU launch: where the GLU launch
     * folds the norm (the 3B and 4B shapes) the prefetch's bytes queue ahead of its own first loads, and
     * tg128 lost 2.5% (bench/RESULTS.md) */
    if (tc_pf_mb() <= 0 || n < 1 || tc_glu_folds_norm(c, w[0])) return;
    for (int i = 0; i < n && c->pf_n < 4; i++) {
        const pt_cuda_weight *cw = pt_cuda_w(w[i]);
        if (cw && cw->tc && w[i]->n_experts <= 1) c->pf_w[c->pf_n++] = w[i];
    }
}

/* The pending hint's ranges within the budget (tc_pf; consumes the hint). */
static void tc_pf_take(pt_cuda *c, tc_pf &pf) {
    memset(&pf, 0, sizeof pf);
    const int nw = c->pf_n;
    c->pf_n = 0;
    double left = (double)tc_pf_mb() * 1048576.0;
    for (int i = 0; i < nw && left > 0;) {
        const pt_matrix *w = c->pf_w[i];
        int j = i + 1; /* a run of weights of one shape takes one prefix */
        while (j < nw && c->pf_w[j]->rows == w->rows && c->pf_w[j]->cols == w->cols &&
               c->pf_w[j]->bits == w->bits && c->pf_w[j]->group_size == w->group_size)
            j++;
        const size_t cb = pt_cuda_tc_codes_bytes(w), sbb = pt_cuda_tc_sb_bytes(w);
        const int64_t tiles = (w->rows + 15) / 16, kpb = 256 / w->bits, nbk = w->cols / kpb;
        const double all = (double)(cb + sbb) * (j - i);
        /* whole weights, or the first nb blocks of every tile (and the groups they reach) */
        const int64_t nb = all <= left ? nbk : (int64_t)((double)nbk * left / all);
        if (nb <= 0) break;
        const int64_t ng = (nb * kpb + w->group_size - 1) / w->group_size;
        for (int k = i; k < j && pf.n + 2 <= PT_TC_PF_N; k++) {
            const pt_cuda_weight *cw = pt_cuda_w(c->pf_w[k]);
            const bool whole = nb == nbk;
            const uint32_t plen[2] = {whole ? (uint32_t)cb : (uint32_t)(nb * 512),
                                      whole ? (uint32_t)sbb : (uint32_t)(ng * 64)};
            const char *pp[2] = {(const char *)cw->data, (const char *)cw->scales};
            const uint32_t pstr[2] = {(uint32_t)(nbk * 512), (uint32_t)(sbb / tiles)};
            for (int a = 0; a < 2; a++) {
                pf.p[pf.n] = pp[a];
                pf.len[pf.n] = plen[a];
                pf.str[pf.n] = whole ? 0u : pstr[a];
                pf.cnt[pf.n] = whole ? 1u : (uint32_t)tiles;
                pf.cpr[pf.n] = (plen[a] + PT_TC_PF_CHUNK - 1) / PT_TC_PF_CHUNK;
                pf.n++;
            }
            left -= whole ? (double)(cb + sbb) : (double)(nb * 512 + ng * 64) * tiles;
        }
        i = j;
    }
}

pt_status pt_cuda_tc_gemv_add(pt_cuda *c, float *xr, const float *a, const pt_matrix *w) {
    const pt_cuda_weight *cw = pt_cuda_w(w);
    tc_pf pf;
    tc_pf_take(c, pf); /* the hint is this launch's or nobody's */
    if (!cw || !cw->tc || w->n_experts > 1 || (uintptr_t)a % 16 || c->base.act != PT_ACT_BF16)
        return PT_ERR_UNSUPPORTED;
    tc_multi_args m;
    memset(&m, 0, sizeof m);
    m.n = 1;
    tc_args_of(c, m.a[0], xr, a, 1, w, 0, NULL, 1, w->rows);
    m.a[0].radd = 1;
    m.a[0].rel_early = tc_rel_early();
    m.a[0].pf = pf;
    const pt_status st = tc_dispatch(c, m, w->bits, w->group_size, 1, 0);
    if (st == PT_OK) __atomic_fetch_add(&g_tc_fold_launches, 1ull, __ATOMIC_RELAXED);
    if (st == PT_OK && pf.n) __atomic_fetch_add(&g_pf_launches, 1ull, __ATOMIC_RELAXED);
    return st;
}
