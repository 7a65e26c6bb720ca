/* The many-row decode GEMV on Hopper's warpgroup MMA (wgmma): the tensor-
 * core GEMV of gemv_tc_kernel.cuh for 4-bit weights with group size 64 and
 * 17..64 activation rows, with the very same floating-point operations in
 * the same order, so every output has the bits the mma.sync kernels give it
 * at any row count (batch invariance, matmul_rows).
 *
 * Why: at 64 rows the mma.sync kernels are latency-bound: one 16-warp block
 * per SM, ~450 instructions per 32 mma.sync (the B fragments of x loaded
 * from shared memory by every warp, the mma chains waited on in registers)
 * at ~0.5 instructions per cycle. Here one warpgroup (4 warps, 64 weight
 * rows: a "quad" of 4 tiles) issues per 64-value group four
 * wgmma.m64nNk16 (N = 32 or 64 columns: the activation rows) whose A
 * operands are the same register fragments the mma.sync kernels build
 * (codes OR-ed into bf16 128.0: tc_pair_c) and whose B operand is x read by
 * the tensor cores straight from shared memory; the wgmma runs
 * asynchronously and the next unit's copies are in flight. Each 64-deep
 * chain rounds exactly as the mma.sync chain of the same operands
 * (dev/wgmma_bits.cu: 0 of 75.5M outputs differ; its first step with
 * scale-d 0: wg_issue64 says why that is the same bits).
 *
 * Per-group fold, unit order, split and reduction: as gemv_tc_block. The
 * weight's split S (tc_split, from its shape and role only) gives the units of a
 * quad to S blocks, block s taking units s, s + S, ... in order and folding
 * each group into its totals with tc_fold4 (Σx from the x prepare, as
 * the XL kernels). The S blocks of a quad are one thread-block cluster (2S
 * with GLU: the upper S run the up weight over the same rows). After the
 * last unit every block stores its partial totals, piece by piece (16 rows
 * × 8 columns), into the receive buffer of the piece's owner in the
 * cluster (distributed shared memory); after one cluster barrier each owner
 * adds its pieces' S partials in split order from 0.f, adds the bias,
 * rounds, applies pt_glu_val (GLU), and stores: each output is the sum
 * gemv_tc_block's epilogue computes, term for term.
 *
 * x: tc_xprep_kernel's wg layout (xl = 2), one 64-value unit per stage:
 * [4 k16 steps][2 k halves][NCOL columns][16 bytes] — a column's 16 bytes
 * of k half h of step m hold the values 16m + 4t + 2h + {0, 1}, t = 0..3,
 * which are the logical k 8h + 2t + {0, 1} of the mma.sync B fragment the
 * tensor-core layout of the codes pairs them with — so wgmma's K-major core
 * matrices (8 columns × 16 bytes; k halves NCOL·16 bytes apart, column
 * octets 128) see each x value where mma.sync's lane t saw it; then Σx per
 * column as the XL layout.
 *
 * Memory: two rings per block, filled with bulk copies (TMA) completing on
 * each stage's mbarrier: x units (from L2: DX stages) and the weights of a
 * unit (per tile its 512-byte code block and 64-byte scale|bias group: DW
 * stages, deeper, since they come from memory). A unit's stages are
 * refilled once the next unit's wgmma is issued (see the main loop); the
 * first stages by warp 0.
 *
 * Where it runs by default (gemv_tc.cu): launches of 33..64 rows, where it
 * is faster than the mma.sync kernels — the GLU launch (gate and up) of an
 * unsplit weight (PETREL_CUDA_TC_WG_GLU) at four blocks an SM, and a plain
 * or grouped launch of weights of one split (PETREL_CUDA_TC_WG_PLAIN: the
 * 8B shape's o and down) at five, and a grouped launch of weights of
 * different splits (the 8B q/k/v; PETREL_CUDA_TC_WG_MIXED=0: not), each
 * cluster of the largest split holding quads of one weight (wg_multi_args);
 * every 17..64-row launch with PETREL_CUDA_TC_WG=1. */
#ifndef PT_BACKEND_CUDA_GEMV_WG_KERNEL_CUH
#define PT_BACKEND_CUDA_GEMV_WG_KERNEL_CUH

#include "backend/cuda/gemv_tc_kernel.cuh"


/* Bytes of one x unit (64 K values, NCOL columns), of a unit's weights,
 * and the shared-memory layout of a block. */
template <int NCOL>
struct wg_shape {
    static constexpr int DX = 3;                    /* x ring stages (x comes from L2) */
    static constexpr int DW = NCOL == 64 ? 3 : 6;   /* weight ring stages (deeper measured no faster) */
    static constexpr int XU = NCOL * 128 + NCOL * 4;
    static constexpr int NW = 4;                    /* tiles (warps) per block */
    static constexpr int WB = NW * 512 + NW * 64;   /* codes, then scale|bias, of the block's tiles */
    static constexpr int WO = DX * XU;              /* the weight ring's offset */
    static constexpr int MO = WO + DW * WB;         /* the mbarriers' (x ring, then weight ring) */
    static constexpr int SMEM = MO + 8 * (DX + DW);
    /* The partials received from the cluster: over the x ring, which is
     * free once every block of the cluster is past its last unit (a
     * cluster barrier), so a block needs 32 KB at 64 columns and five fit
     * an SM (four with a buffer of their own). */
    static constexpr int RB = NCOL * 256;
    static constexpr int RBO = 0;
    static_assert(RB <= DX * XU, "the receive buffer fits the x ring");
};

/* B descriptor (no swizzle, K-major core matrices): start, LBO (k halves)
 * NCOL·16 bytes, SBO (column octets) 128 bytes. */
template <int NCOL>
__device__ __forceinline__ uint64_t wg_desc(unsigned addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((NCOL * 16) >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}

#define WG_STEP64                                                                                                   \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, " \
    "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define WG_STEP32                                                                                                   \
    "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, " \
    "%13, %14, %15}, "

/* One group issued: D = Σ over the 4 k16 steps of A_m · B_m, the first step
 * with scale-d 0 (D = A·B), committed as one wgmma group, not waited on.
 * am: the codes' A fragments per step; desc: B of step 0 (steps are
 * 2·NCOL·16 bytes apart). The mma.sync chains start from a cleared
 * accumulator (D = A·B + 0), which differs from A·B only when A·B is −0 —
 * every x of the group −0 (the codes are positive) — and then the fold's
 * fma(s, D, t) is t either way (t = fma(b', Σx, tot) is never −0: tot
 * starts at +0): the same bits. */
__device__ __forceinline__ void wg_issue64(float (&d)[32], const uint32_t (&am)[4][4], uint64_t desc) {
    const uint64_t st = (uint64_t)((2 * 64 * 16) >> 4);
    asm volatile(
        "{\n.reg .pred pz;\nsetp.ne.b32 pz, %52, 0;\n"
        "wgmma.fence.sync.aligned;\n"
        WG_STEP64 "{%32,%33,%34,%35}, %48, pz, 1, 1, 0;\n"
        WG_STEP64 "{%36,%37,%38,%39}, %49, 1, 1, 1, 0;\n"
        WG_STEP64 "{%40,%41,%42,%43}, %50, 1, 1, 1, 0;\n"
        WG_STEP64 "{%44,%45,%46,%47}, %51, 1, 1, 1, 0;\n"
        "wgmma.commit_group.sync.aligned;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(am[0][0]), "r"(am[0][1]), "r"(am[0][2]), "r"(am[0][3]), "r"(am[1][0]), "r"(am[1][1]), "r"(am[1][2]),
          "r"(am[1][3]), "r"(am[2][0]), "r"(am[2][1]), "r"(am[2][2]), "r"(am[2][3]), "r"(am[3][0]), "r"(am[3][1]),
          "r"(am[3][2]), "r"(am[3][3]), "l"(desc), "l"(desc + st), "l"(desc + 2 * st), "l"(desc + 3 * st), "r"(0)
        : "memory");
}
__device__ __forceinline__ void wg_issue32(float (&d)[16], const uint32_t (&am)[4][4], uint64_t desc) {
    const uint64_t st = (uint64_t)((2 * 32 * 16) >> 4);
    asm volatile(
        "{\n.reg .pred pz;\nsetp.ne.b32 pz, %36, 0;\n"
        "wgmma.fence.sync.aligned;\n"
        WG_STEP32 "{%16,%17,%18,%19}, %32, pz, 1, 1, 0;\n"
        WG_STEP32 "{%20,%21,%22,%23}, %33, 1, 1, 1, 0;\n"
        WG_STEP32 "{%24,%25,%26,%27}, %34, 1, 1, 1, 0;\n"
        WG_STEP32 "{%28,%29,%30,%31}, %35, 1, 1, 1, 0;\n"
        "wgmma.commit_group.sync.aligned;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(am[0][0]), "r"(am[0][1]), "r"(am[0][2]), "r"(am[0][3]), "r"(am[1][0]), "r"(am[1][1]), "r"(am[1][2]),
          "r"(am[1][3]), "r"(am[2][0]), "r"(am[2][1]), "r"(am[2][2]), "r"(am[2][3]), "r"(am[3][0]), "r"(am[3][1]),
          "r"(am[3][2]), "r"(am[3][3]), "l"(desc), "l"(desc + st), "l"(desc + 2 * st), "l"(desc + 3 * st), "r"(0)
        : "memory");
}
/* Waits for the issued group, then pins its accumulators d (the compiler
 * may not read them before this point). */
template <int ND>
__device__ __forceinline__ void wg_wait(float (&d)[ND]) {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < ND; k++) asm volatile("" : "+f"(d[k])::"memory");
}

/* The grouped launch's table: weight i owns clusters [first[i], first[i+1]),
 * each of cl blocks: cl / S quads of the weight's split S, the quad's S
 * blocks at consecutive ranks (cl the largest S of the launch: the weights
 * of a layer's q/k/v may split differently, MX below). */
struct wg_multi_args {
    tc_args a[PT_TC_MULTI];
    int first[PT_TC_MULTI + 1];
    int n, cl;
};

/* One quad's work: quad qg (64 rows) of weight a, whose CL = S blocks (or
 * 2S with GLU: the upper S run the up weight) are cluster ranks r0 ..
 * r0 + CL − 1; this block is rank r0 + r. */
template <int NCOL, bool GLU, bool RF = false, bool UN = false>
__device__ __forceinline__ void gemv_wg_block(const tc_args &a, const int qg, const tc_glu &gl, const int r0 = 0) {
    using SH = wg_shape<NCOL>;
    constexpr int NT = NCOL / 8, NW = SH::NW, NTH = NW * 32;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int S = a.S, CL = GLU ? 2 * S : S;
    const int r = (int)tc_cluster_rank() - r0;
    const bool upw = GLU && r >= S;
    const int s = upw ? r - S : r;
    const int K = a.K, N = a.N, nb = a.nb;
    const int tpe = (N + 15) / 16, NU = K / 64;
    const int nu = s < NU ? (NU - s + S - 1) / S : 0; /* this block's units: s, s + S, ... */
    uint64_t *xbar = reinterpret_cast<uint64_t *>(smem + SH::MO), *wbar = xbar + SH::DX;
    const uint4 *wbase = upw ? gl.w2 : a.w, *sbbase = upw ? gl.sb2 : a.sb;

    /* The copies of this block's unit i (its i-th: unit s + i·S of the
     * weight): tile w's 512-byte code block (sbw false) or 64-byte
     * scale|bias group (sbw true) into weight slot sl; its x into x slot sl,
     * the expected bytes set first (one thread). */
    auto copy_tile = [&](int sl, int i, int w, bool sbw) {
        unsigned char *st = smem + SH::WO + sl * SH::WB;
        const int64_t u = (int64_t)s + (int64_t)i * S;
        const int tq = qg * NW + w, tile = tq < tpe ? tq : tpe - 1; /* past N: loaded, not stored */
        if (!sbw) tc_bulk(st + w * 512, wbase + ((int64_t)tile * NU + u) * 32, 512u, &wbar[sl]);
        else tc_bulk(st + NW * 512 + w * 64, sbbase + ((int64_t)tile * NU + u) * 4, 64u, &wbar[sl]);
    };
    auto copy_x = [&](int sl, int i) {
        const int64_t u = (int64_t)s + (int64_t)i * S;
        tc_mbar_expect(&xbar[sl], (unsigned)SH::XU);
        tc_bulk(smem + sl * SH::XU, reinterpret_cast<const char *>(a.xb) + u * SH::XU, (unsigned)SH::XU, &xbar[sl]);
    };
    /* warp 0, the first stages: unit i's weights into weight slot i (lane
     * l < NW: tile l's codes, NW <= l < 2·NW: its scale|bias group; lane 0
     * sets the expected bytes first), its x into x slot i (lane 2·NW) */
    auto issue_w = [&](int i) {
        if (lane == 0) tc_mbar_expect(&wbar[i], (unsigned)SH::WB);
        __syncwarp();
        if (lane < 2 * NW) copy_tile(i, i, lane % NW, lane >= NW);
    };
    auto issue_x = [&](int i) {
        if (lane == 2 * NW) copy_x(i, i);
    };
    if (warp == 0) {
        if (lane == 0)
            for (int i = 0; i < SH::DX + SH::DW; i++) tc_mbar_init(&xbar[i]);
        __syncwarp();
        /* the weights of the first stages before the wait (constants), x after */
        for (int i = 0; i < SH::DW && i < nu; i++) issue_w(i);
    }
    tc_pdl_wait(); /* x is written by the previous kernels */
    if (warp == 0)
        for (int i = 0; i < SH::DX && i < nu; i++) issue_x(i);
    __syncthreads(); /* the mbarriers are initialized before anyone waits on them */

    float tot[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[n][i] = 0.f;
    uint32_t c43 = 0x43004300u; /* in a register (tc_pair_c) */
    asm volatile("mov.b32 %0, %0;\n" : "+r"(c43));
    const unsigned sbase = tc_saddr(smem);

    /* Unit i's stages: weight slot ws (phase wp), x slot xs (phase xp), counted
     * from unit to unit rather than divided (DW = DX = 3 at 64 columns). */
    int ws = 0, xs = 0;
    unsigned wp = 0, xp = 0;
    /* a unit's A fragments and scale|bias words from weight slot sl, its
     * stage waited on at phase ph */
    auto load_a = [&](uint32_t (&am)[4][4], uint2 &sbv, const int sl, const unsigned ph) {
        const unsigned char *wst = smem + SH::WO + sl * SH::WB;
        tc_mbar_wait(&wbar[sl], ph);
        const uint4 wv = *reinterpret_cast<const uint4 *>(wst + warp * 512 + lane * 16);
        sbv = *reinterpret_cast<const uint2 *>(wst + NW * 512 + warp * 64 + g * 8);
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint32_t wd = m == 0 ? wv.x : m == 1 ? wv.y : m == 2 ? wv.z : wv.w;
            am[m][0] = tc_pair_c(wd, 0, c43), am[m][1] = tc_pair_c(wd, 1, c43), am[m][2] = tc_pair_c(wd, 2, c43),
            am[m][3] = tc_pair_c(wd, 3, c43);
        }
    };
    /* unit i's wgmma group into d (its x stage waited on) */
    auto issue_mma = [&](float (&d)[NCOL / 2], const uint32_t (&am)[4][4]) {
        tc_mbar_wait(&xbar[xs], xp);
        const uint64_t desc = wg_desc<NCOL>(sbase + (unsigned)(xs * SH::XU));
        if constexpr (NCOL == 64) wg_issue64(d, am, desc);
        else wg_issue32(d, am, desc);
    };
    /* unit i's fold of d into tot (its Σx in x slot x) */
    auto fold = [&](const int x, const float (&d)[NCOL / 2], const uint2 sbv) {
        const float sc0 = __uint_as_float(sbv.x << 16), bi0 = __uint_as_float(sbv.x & 0xFFFF0000u);
        const float sc1 = __uint_as_float(sbv.y << 16), bi1 = __uint_as_float(sbv.y & 0xFFFF0000u);
        const float bp0 = tc_bp(sc0, bi0, 128.f), bp1 = tc_bp(sc1, bi1, 128.f); /* 4-bit only */
        const float *sxs = reinterpret_cast<const float *>(smem + x * SH::XU + NCOL * 128);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float2 v = *reinterpret_cast<const float2 *>(sxs + 8 * n + 2 * t);
            float acc[4] = {d[4 * n], d[4 * n + 1], d[4 * n + 2], d[4 * n + 3]};
            tc_fold4<false>(tot[n], acc, sc0, bp0, sc1, bp1, v.x, v.y);
        }
    };
    /* No block barrier per unit: a warp passes a unit's first wgmma only once
     * all four warps have reached it (the warpgroup's arrive: ncu shows the
     * warps waiting there), so after issuing unit i every warp has read unit
     * i − 1's weight stage and folded its Σx; unit i − 1's stages are then
     * refilled while unit i's wgmma runs: with RF every copy by one lane
     * of the last warp (elect.sync), its addresses from block-uniform
     * values only; without, spread over the warps (tile w's codes and
     * scale|bias by lanes 0 and 1 of warp w, in a branch per tile that
     * every warp tests; x by the last warp). A copy issued under a
     * per-lane condition compiles to a loop over the warp's active lanes
     * (ELECT, R2UR, UBLKCP, BRA.U.ANY) that every warp walks; under the
     * elected lane of one warp the other warps skip it (the 8B layer's
     * GEMVs at 64 rows 140.4 -> 137.1 µs on an H100). The same operations
     * per output in the same order: the same bits. (Before: a block
     * barrier after each fold and warp 0 issuing every copy — 87.1 against
     * 73.7 µs for the 8B gate/up at 64 rows on an H100, bench/RESULTS.md.) */
    uint32_t am[4][4];
    float d[NCOL / 2];
    /* unit i − 1's stages refilled (slots pw, px) with units j + DW (its
     * weights) and j + DX (its x), j = i − 1, while unit i's wgmma runs */
    auto refill = [&](const int j, const int pw, const int px) {
        if constexpr (RF) {
            /* RF: one lane of the last warp (elect.sync) issues every copy —
             * each tile's codes and scale|bias group, then the x — their
             * addresses depending on no thread index */
            if (j >= 0 && warp == NW - 1 && (j + SH::DW < nu || j + SH::DX < nu) && tc_elect()) {
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                if (j + SH::DW < nu) {
                    tc_mbar_expect(&wbar[pw], (unsigned)SH::WB);
#pragma unroll
                    for (int w = 0; w < NW; w++) {
                        copy_tile(pw, j + SH::DW, w, false);
                        copy_tile(pw, j + SH::DW, w, true);
                    }
                }
                if (j + SH::DX < nu) copy_x(px, j + SH::DX);
            }
        } else if (j >= 0) {
            if (j + SH::DW < nu)
#pragma unroll
                for (int w = 0; w < NW; w++)
                    if (warp == w && lane < 2) {
                        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                        if (w == 0 && lane == 0) tc_mbar_expect(&wbar[pw], (unsigned)SH::WB);
                        copy_tile(pw, j + SH::DW, w, lane == 1);
                    }
            if (warp == NW - 1 && lane == 2 * NW && j + SH::DX < nu) {
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                copy_x(px, j + SH::DX);
            }
        }
    };
    if constexpr (UN) {
        /* UN: the loop unrolled over the rings' three stages (DW = DX = 3
         * at 64 columns): unit i's slot is i mod 3 and its phase (i / 3)
         * mod 2, so within an unrolled step every slot, its shared-memory
         * addresses and descriptor, and its mbarrier are constants, and the
         * slot counters are gone. The same units in the same order with the
         * same copies: the same bits. */
        static_assert(SH::DW == 3 && SH::DX == 3, "the unrolled loop walks three-stage rings");
        const uint64_t xd0 = wg_desc<NCOL>(sbase); /* slot k's: xd0 + k·XU/16 (no carry: smem < 256 KB) */
        auto unit = [&](auto kc, const int i, const unsigned ph) {
            constexpr int k = decltype(kc)::value, pk = (k + 2) % 3; /* unit i's slots, unit i − 1's */
            uint2 sbv;
            load_a(am, sbv, k, ph);
            tc_mbar_wait(&xbar[k], ph);
            const uint64_t desc = xd0 + (uint64_t)(k * SH::XU / 16);
            if constexpr (NCOL == 64) wg_issue64(d, am, desc);
            else wg_issue32(d, am, desc);
            refill(i - 1, pk, pk);
            wg_wait(d);
            fold(k, d, sbv);
        };
        using k0 = std::integral_constant<int, 0>;
        using k1 = std::integral_constant<int, 1>;
        using k2 = std::integral_constant<int, 2>;
        int i = 0;
        unsigned ph = 0;
        for (; i + 3 <= nu; i += 3, ph ^= 1u) {
            unit(k0(), i, ph);
            unit(k1(), i + 1, ph);
            unit(k2(), i + 2, ph);
        }
        if (i < nu) unit(k0(), i, ph);
        if (i + 1 < nu) unit(k1(), i + 1, ph);
    } else {
        int pws = 0, pxs = 0; /* unit i − 1's slots */
        for (int i = 0; i < nu; i++) {
            uint2 sbv;
            load_a(am, sbv, ws, wp);
            issue_mma(d, am);
            refill(i - 1, pws, pxs); /* the unit whose stages are free: slots pws, pxs */
            wg_wait(d);
            fold(xs, d, sbv);
            pws = ws, pxs = xs;
            if (++ws == SH::DW) ws = 0, wp ^= 1u;
            if (++xs == SH::DX) xs = 0, xp ^= 1u;
        }
    }
    tc_pdl_trigger();

    /* The reduction: the block's (n-tile n, warp w) pieces of 16 rows × 8
     * columns, pi = n·NW + w, are owned by the quad's rank pi mod CL; once
     * every block of the cluster is past its last unit (a cluster barrier:
     * its wgmma groups waited on, its x stages all arrived, so its x ring
     * is free), every block stores its partials of each piece into the
     * owner's receive buffer [CL sources][PP pieces][16][8] (distributed
     * shared memory, over the owner's x ring), one more cluster barrier,
     * then each owner adds its pieces' S partials in split order from 0.f.
     * The barriers are the whole cluster's (every quad of it alike); the
     * stores go to the quad's own ranks (r0 + owner). */
    tc_cluster_sync();
    constexpr int PP = NW * NT; /* pieces per block; CL divides it (CL <= 8 <= PP) */
    const int pp = PP / CL;
    /* XO (GLU, S = 1, gl.xo set): column tile n's pieces owned by rank n mod 2, so each owner holds all 64 rows
     * (the down projection's K values of unit qg) of its columns; which block adds a piece changes no bit */
    const bool xo = GLU && gl.xo != nullptr;
    const unsigned rbuf = sbase + (unsigned)SH::RBO;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const int pi = n * NW + warp, own = xo ? n % CL : pi % CL, lp = xo ? n / CL * NW + warp : pi / CL;
        const unsigned la = rbuf + (unsigned)((((r * pp + lp) * 16 + g) * 8 + 2 * t) * 4);
        unsigned ra;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(la), "r"(r0 + own));
        asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(ra), "f"(tot[n][0]), "f"(tot[n][1]) : "memory");
        asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(ra + 8 * 8 * 4), "f"(tot[n][2]), "f"(tot[n][3])
                     : "memory");
    }
    tc_cluster_sync();
    const float *rb = reinterpret_cast<const float *>(smem + SH::RBO);
    float *y = a.y;
    /* the output of row `row` (of the weight), column `col`, from receive-buffer piece lp */
    auto result = [&](const int lp, const int r16, const int c8, const int row) {
        const float *q = rb + (lp * 16 + r16) * 8 + c8;
        float v = 0.f;
        for (int ss = 0; ss < S; ss++) v += q[ss * pp * 128];
        if (a.bias) v += pt_ld(a.bt, a.bias, row);
        float out = pt_round_bf(v);
        if constexpr (GLU) {
            float u = 0.f;
            for (int ss = 0; ss < S; ss++) u += q[(S + ss) * pp * 128];
            if (gl.bias2) u += pt_ld(gl.bt2, gl.bias2, row);
            out = pt_glu_val(gl.fn, out, pt_round_bf(u), gl.bf);
        }
        return out;
    };
    if (GLU && xo) {
        /* XO: the outputs also written as the down projection's prepared x (tc_xprep_kernel's wg layout, its
         * unit qg): thread tid holds rows 16w + r16 of column col for w = 0..NW-1; the bf16 pair (r16, r16 + 1)
         * stored by the even lane, and Σx in tc_xprep_kernel's order — each 8 rows' sum as its tree (the xor
         * butterfly over lanes 1, 2, 4: ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))), then the group's
         * 8 sums as its xor tree over steps (xor 8 here, then the pieces' pairs in registers). IEEE addition
         * commutes, so every lane's sum has the same bits. The same values and additions: the same bits. */
        const int r16 = tid & 15, c8 = (tid >> 4) & 7;
        char *xu = gl.xo + (int64_t)qg * SH::XU;
#pragma unroll 1
        for (int nn = 0; nn < NT / 2; nn++) {
            const int col = 8 * (2 * nn + r) + c8;
            float part[NW];
#pragma unroll
            for (int w = 0; w < NW; w++) {
                const int row = (qg * NW + w) * 16 + r16;
                const float out = result(nn * NW + w, r16, c8, row);
                if (col < nb) y[(int64_t)col * a.ldy + row] = out;
                const float sm = wg_x_put(xu, 16 * w + r16, col, NCOL, out, col < nb);
                part[w] = __fadd_rn(sm, __shfl_xor_sync(0xffffffffu, sm, 8));
            }
            static_assert(NW == 4, "XO: a unit's 64 rows are four warps' 16");
            if (r16 == 0 && col < nb)
                *wg_x_sum(xu, col, NCOL) = __fadd_rn(__fadd_rn(part[0], part[1]), __fadd_rn(part[2], part[3]));
        }
        return;
    }
    for (int o = tid; o < pp * 128; o += NTH) {
        const int lp = o >> 7, c8 = (o >> 4) & 7, r16 = o & 15;
        const int pi = lp * CL + r, n = pi / NW, w = pi % NW;
        const int row = (qg * NW + w) * 16 + r16, col = 8 * n + c8;
        if (row >= N || col >= nb) continue;
        y[(int64_t)col * a.ldy + row] = result(lp, r16, c8, row);
    }
}

/* RF or UN compiled for five blocks an SM, as the plain launches run
 * (RF: 96 registers, no spill; UN spills 84 bytes) */
template <int NCOL, bool RF = false, bool UN = false>
__global__ void __launch_bounds__(128, RF || UN ? 5 : 4) gemv_wg_kernel(wg_multi_args m) {
    const int c = (int)(blockIdx.x / (unsigned)m.cl), rk = (int)(blockIdx.x % (unsigned)m.cl);
    int i = 0;
#pragma unroll
    for (int j = 1; j < PT_TC_MULTI; j++)
        if (j < m.n && c >= m.first[j]) i = j;
    /* MX: cluster c of weight i holds cl / S of its quads, quad sub at ranks sub·S .. sub·S + S − 1 (a quad
     * past the weight's last loads its last tile and stores nothing) */
    const int S = m.a[i].S, sub = rk / S;
    gemv_wg_block<NCOL, false, RF, UN>(m.a[i], (c - m.first[i]) * (m.cl / S) + sub, tc_glu(), sub * S);
}

template <int NCOL, bool RF = false, bool UN = false>
__global__ void __launch_bounds__(128, 4) gemv_wg_glu_kernel(tc_args a, tc_glu g) {
    gemv_wg_block<NCOL, true, RF, UN>(a, (int)(blockIdx.x / (unsigned)(2 * a.S)), g);
}

#endif
