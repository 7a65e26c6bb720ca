/* The decode GEMV for 4- and 8-bit MLX affine weights in the tensor-core
 * layout (matmul.cuh): y[n, N] = x[n, K] · Wᵀ (+ bias) for 1..64 activation
 * rows in one launch, bf16 activations. Not a GEMM for long prompts (T > 64
 * stays on matmul.cu's prefill path) and not for f32 activation mode.
 *
 * This header is the kernel: the launch arguments, the device helpers (mma,
 * cp.async, mbarrier, bulk copy, cluster), the x prepare tc_xprep_kernel (and
 * tc_xprep_norm_kernel, which prepares a folded RMSNorm's output), the
 * block function gemv_tc_block and its kernels (plain, GLU, grouped). It is
 * included by gemv_tc.cu only (the host launch code, launch sizing and env
 * switches), so each kernel is compiled in one object. Not here: the repack
 * that puts a weight into the tensor-core layout once, at upload, and the
 * dequantize of that layout (gemv_tc_repack.cu).
 *
 * Arithmetic (as the previous tensor-core GEMV): a 4-bit code costs ~1
 * integer instruction: codes are OR-ed into the mantissa of bf16 128.0
 * (0x4300 | q is exactly 128 + q), two per 32-bit register, and fed as the A
 * operand of mma.m16n8k16 (16 weight rows × 16 k); the B operand's 8 columns
 * are 8 activation rows. The offset is removed per quantization group in f32:
 *     Σ (s·q + b)·x = s·(D − C·Σx) + b·Σx = s·D + b'·Σx,   b' = b − C·s,
 * D = Σ (128 + q)·x', C = 128·c, where D is the tensor-core dot product of
 * one group (exact products, f32 accumulation); b' is rounded once per
 * weight row and group and each group folds into the row's total with two
 * fused multiply-adds, tot = fma(s, D, fma(b', Σx, tot)) (tc_fold4). An
 * 8-bit code is its two nibbles, lo against x and hi against 16·x (exact:
 * a power of two), so c = 17 (1 for 4-bit).
 *
 * Memory: the layout makes a warp's load of one block (16 rows × 64 nibbles)
 * 512 contiguous bytes whose 16-byte lane pieces are that lane's A fragments
 * for 4 mmas directly (no shuffles). Each warp streams its blocks through a
 * cp.async ring in shared memory of PT_TC_RING blocks (codes and the group's
 * 16 scale|bias words), so PT_TC_RING − 1 blocks (~3.5 KiB per warp, ~55 KiB
 * per SM at two blocks per SM) are always in flight, across the x-staging
 * barriers as well. Each lane reads back only what it copied, except the
 * scale words (4 lanes copy them, all read: the __syncwarp after the wait).
 *
 * Instructions: at one activation row the kernel is bound by the issue and
 * latency of the instructions per block, not by memory (ncu: DRAM ~33%,
 * ~150 SASS instructions per 512-byte block, ~6 cycles per issued
 * instruction with 3-4 warps per scheduler; the same weight stream with no
 * arithmetic runs in under half the time). So the inner loop keeps the
 * integer work per block small: per-lane pointers and shared addresses
 * computed once, unsigned index arithmetic, a code pair in one LOP3 (with
 * both masks as immediates the compiler emits an AND and an OR), the
 * scale|bias copy predicated instead of branched; and with one activation
 * row only the stored column (the even columns 2t) is folded. Every one of
 * these leaves the floating-point operations and their order as they were,
 * so the bits are the same; PETREL_CUDA_TC_LOOP=0 runs the loop as first
 * written (A/B).
 *
 * The ring loop unrolled (LV 2: by default at one activation row over
 * K >= 4096, tc_lv; PETREL_CUDA_TC_LOOP=2: up to 8 rows, =1: the loop
 * above everywhere): the loop steps PT_TC_RING blocks
 * at a time, so every ring slot's shared address is known at compile time
 * (a stage holds a multiple of PT_TC_RING blocks per warp: tc_launch sizes
 * the stages so), and both copies of a block are issued by every lane
 * without a branch: a copy of 0 source bytes past the warp's last block,
 * the 64 scale|bias bytes of a group copied by lanes l, l + 4, … alike.
 * Also per group: the first mma of a group starts from C = 0 instead of
 * clearing the accumulators after the fold (D = A·B + 0). The addresses
 * are per step, not per block: a block's copy sources and stage-local K
 * are the step's plus a compile-time multiple of a launch constant, and a
 * step that ends before the stage's last block runs without a test per
 * block (~70 instructions per block instead of ~83; compiled for four
 * blocks per SM, tc_minb). Same operations in the same order: the same
 * bits as LV 1 (test_gemv_batch). (Loading the blocks straight into
 * registers instead, 4 or 8 ahead, was slower: bench/RESULTS.md.)
 *
 * Work split: a block of W warps owns W/S tiles of 16 rows; the S warps of a
 * tile take the tile's units (one unit = whole blocks and whole groups)
 * round-robin: unit u goes to warp u mod S. W = 8 up to 8 activation rows
 * (2..8 rows: 16 and XP by default, PETREL_CUDA_TC_XP8), 16 above: every
 * block stages x for all its rows, so twice the tiles per block halve the x
 * traffic per weight byte (L2 reads of 64·K f32 per block dominated at 64
 * rows) and twice the threads stage it (fewer round trips). x is staged in
 * shared memory stage by stage (bf16, all n rows, a stage = a whole number of S-unit
 * rounds sized for the row count: 32 KiB of x up to 8 rows, 96 KiB above),
 * with Σx per (row, group). Up to 8 n-tiles
 * of 8 columns reuse each loaded A fragment (NT template: 1, 2, 4, 8).
 * Above 8 rows (16-warp blocks, one item) x is instead prepared once per
 * launch (XP: tc_xprep_kernel writes bf16 x and Σx per (row, group) to the
 * matmul scratch with the staging loop's own arithmetic, so the same bits;
 * a grouped launch prepares it once for all its weights) and each block
 * bulk-copies (TMA, on an mbarrier) stage k+1 into a second x buffer while
 * stage k computes; where two buffers of one S-round do not fit the shared
 * memory, the in-block staging serves (PETREL_CUDA_TC_XPRE=0: always). The
 * prepared x is stage-major (each stage laid out as the block's x buffer,
 * padding included), so a stage is ONE bulk copy: one per row and stage
 * kept the other 15 warps waiting at every stage's barrier while one thread
 * issued 65 copies (half the 64-row time of the S = 8 weights, which do one
 * unit per warp per stage; PETREL_CUDA_TC_XSTAGE=0: the row layout). The
 * blocks of a cluster can share the stage copies (multicast,
 * PETREL_CUDA_TC_CLUSTER; off by default). Without a cluster the warps do
 * not meet at a barrier per stage: the last warp done with a buffer issues
 * its refill, so warps drift up to a stage apart (PETREL_CUDA_TC_DRIFT=0:
 * the barrier per stage). Up to 32 rows, 4-bit, the XL kernels read x laid
 * out per 64-value K block (two 16-byte B loads per n-tile at offsets known
 * at compile time) (PETREL_CUDA_TC_XL=0: not).
 *
 * Batch invariance: S and the unit assignment depend only on N, K, bits,
 * group size and the weight's role (tc_split); the stage size and W (which depend on the row count) only
 * decide when x is staged and which block a tile's S warps sit in, not what
 * is added in which order. A column's result is
 * its tensor-core dot product per group (independent of the other columns),
 * folded per group in unit order with explicit-rounding intrinsics, then
 * the S partials added in warp order. So a row gives bit-identical results
 * alone or with up to 63 others, eager or in a graph.
 *
 * Grouped launch (pt_cuda_tc_gemv_multi, backend.h matmul_multi): up to 4
 * weights of one bits, group size and K over the same x (a layer's q, k, v;
 * gate and up) in one launch, each weight's blocks back to back in grid.x.
 * A block looks up its weight and runs the very code of that weight's own
 * launch with that weight's S and stage size, so the outputs are bit-identical
 * to separate launches; what changes is that small weights (k, v: 32 blocks
 * each on the 8B shape) share the machine with the large one instead of
 * running alone on a quarter of the SMs, and one launch gap instead of three.
 *
 * GLU epilogue (pt_cuda_tc_gemv_glu, backend.h matmul_glu): a dense
 * feed-forward's gate and up weights (one shape) in one launch whose blocks
 * each hold the same TPB/2 tiles of both, gate in the lower half of the
 * warps and up in the upper half, each warp running exactly the code (tile,
 * units, stages) it runs in the plain launch; the epilogue reduces both
 * partials as the plain launch does, rounds each, and writes glu(gate, up)
 * with matmul.cuh's pt_glu_val, the very function of glu_kernel: the bits of
 * matmul_multi + glu, one kernel and two [T, F] round trips fewer. Its own
 * kernel (gemv_tc_glu_kernel: a template flag of gemv_tc_block, the up
 * weight in its own argument tc_glu), so the plain kernels compile exactly
 * as they did without it.
 *
 * Launched with programmatic dependent launch (PETREL_CUDA_PDL=0: off): the
 * ring's first weight loads are issued before griddepcontrol.wait, every
 * read of x and write of y after it. Expert stacks are not repacked (the
 * MoE prefill's grouped GEMM, gemm_tc.cu, reads the MLX layout), but the
 * kernel takes per-item experts for when they are. */
#ifndef PT_BACKEND_CUDA_GEMV_TC_KERNEL_CUH
#define PT_BACKEND_CUDA_GEMV_TC_KERNEL_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/wg_x.cuh" /* tc_bf2, tc_wg_xoff */

#define PT_TC_WARPS 8             /* warps per block up to 8 activation rows */
#define PT_TC_WIDE_WARPS 16       /* and above 8 rows (PETREL_CUDA_TC_WIDE=0: 8) */
#define PT_TC_RING 8               /* blocks per warp in the cp.async ring */
#define PT_TC_XBUDGET(nb) ((nb) > 8 ? 96 * 1024 : 32 * 1024) /* bytes of staged x per stage */
#define PT_TC_TARGET_WARPS 8       /* warps per SM the split aims at (16 before: at 64 rows the wide
                                      matrices' gate/up ran 26% slower with twice the splits, each
                                      block staging x for half the rows; T = 1 the same; RESULTS.md) */

/* ---- the GEMV -------------------------------------------------------------- */

/* Weights fetched into the L2 by a launch's blocks for the launches after
 * it (backend.h prefetch_hint; pt_cuda_tc_gemv_add): range r is cnt[r]
 * pieces of len[r] bytes at p[r] + i·str[r] (a whole array: one piece; a
 * prefix of every tile: a piece a tile), each piece issued in chunks of at
 * most PT_TC_PF_CHUNK bytes, one cp.async.bulk.prefetch.L2 a chunk, the
 * chunks dealt over the launch's threads block by block; issued before the
 * griddepcontrol.wait, behind the ring's first loads. n = 0: none. Changes
 * no result. */
#define PT_TC_PF_N 6
#define PT_TC_PF_CHUNK 65536u
struct tc_pf {
    const char *p[PT_TC_PF_N];
    uint32_t len[PT_TC_PF_N], str[PT_TC_PF_N], cnt[PT_TC_PF_N], cpr[PT_TC_PF_N]; /* cpr: chunks a piece */
    int n;
};

struct tc_args {
    const uint4 *w;          /* codes, tile-major (all experts) */
    const uint4 *sb;         /* [tiles][G] 64-byte scale|bias groups */
    const void *bias;        /* [E·N] of bias type, or NULL */
    pt_ftype bt;
    const float *x;          /* item b: x + (b / x_div)·nb·K, [nb, K] */
    float *y;                /* item b: y + b·nb·ldy, [nb, ldy] */
    int64_t ldy;
    int N, K, nb, S, SU;     /* rows, cols, activation rows, warps per tile, units per stage */
    int x_div;
    int64_t expert, n_experts;
    const int32_t *experts;  /* per item (grid.y), or NULL: expert */
    int *err;
    /* x prepared once per launch (tc_xprep_kernel; the XP kernels only):
     * x as bf16 [nb, K] and Σx per group [G][NCOL] (columns past nb unset);
     * or, when xst is set, stage-major: stage st at (char *)xb + st·XB, the
     * block's shared-memory x buffer byte for byte ([nb][XS] bf16, then
     * [KS/GS][NCOL] Σx; XB as gemv_tc_block computes it), one bulk copy */
    const bf16 *xb;
    const float *sxg;
    int xst;
    /* XP: drift = no block-wide barrier per stage: the last warp done with
     * a buffer issues its refill (gemv_tc_block) */
    int drift;
    /* The folded RMSNorm (the NRM kernels, one activation row, one stage):
     * x is the norm's input row and the block stages norm_out(x, inv, nw)
     * in its place, inv summed as the register kernel of shape nsh sums it
     * (norm.cuh; gemv_tc_block): the bits of rms_norm then the GEMV of its
     * output. nw 16-byte aligned, nsh.V <= PT_TC_NRM_V (K <= 4096). */
    const void *nw;
    pt_ftype nwt;
    int nstyle, nbf;
    float neps;
    norm_shape nsh;
    /* the residual add in the epilogue: y = round(y + out) instead of out
     * (the add of rms_norm's fused form, y the residual stream); its
     * residual value read right after the wait. rel_early: release the
     * dependent launch after the ring's first loads instead of after the
     * main loop (the folded GEMV that follows prefetches its weights
     * meanwhile; it reads nothing this kernel writes before its wait) */
    int radd, rel_early;
    /* Rows (nb > 1, the XP launches) with the norm set: its residual addend
     * (x = round(x + nadd) first, written back; NULL: none), applied by the
     * x prepare (tc_xprep_norm_kernel), which stages norm_out for the GEMV
     * (the launch then clears the norm: the XP kernels stage nothing) */
    const float *nadd;
    tc_pf pf; /* the L2 prefetch this launch issues for later ones (n = 0: none) */
};

/* The GLU epilogue's second weight (pt_cuda_tc_gemv_glu; gemv_tc_glu_kernel
 * only, so tc_args and the plain kernels stay as they were): tc_args's w,
 * sb, bias are the gate weight's and these the up weight's (same shape,
 * hence the same S and stages); a block's lower W/2 warps take TPB/2 tiles
 * of gate, its upper W/2 warps the same tiles of up, and y [nb, ldy]
 * receives glu(gate, up) (matmul.cuh pt_glu_val with fn, bf: bf16 mode)
 * instead of either projection. No experts. */
struct tc_glu {
    const uint4 *w2, *sb2;
    const void *bias2;
    pt_ftype bt2;
    int fn, bf;
    /* the wgmma GLU launch (S = 1) also writes its output as the next
     * GEMV's prepared x here (gemv_wg_kernel.cuh XO); NULL: not */
    char *xo;
};

__device__ __forceinline__ void tc_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The same mma as a plain (not volatile) asm: the compiler may schedule it
 * among other instructions (PETREL_CUDA_TC_LOOP=1); it has no side effects. */
__device__ __forceinline__ void tc_mma_nv(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The same mma with C = 0 (LV 2: the first mma of a group starts its
 * accumulators from zero instead of clearing them after the fold; the same
 * operation, D = A·B + 0). */
__device__ __forceinline__ void tc_mma_z(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    const float z = 0.f;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(z));
}

/* LV 2: a 16-byte copy of src_size bytes (16 or 0: nothing read, zeros
 * written), so a copy that is not needed costs no branch. */
__device__ __forceinline__ void tc_cp16z(unsigned d, const void *src, unsigned src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_size) : "memory");
}

/* Pair j (0..3) of a word as bf16x2 (128 + code): nibbles j and j+4. */
__device__ __forceinline__ uint32_t tc_pair(uint32_t w, int j) { return ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u; }

__device__ __forceinline__ void tc_cp16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
/* The same copy from a shared-memory address already computed, and with a
 * predicate instead of a branch (lanes that copy nothing issue nothing). */
__device__ __forceinline__ void tc_cp16s(unsigned d, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void tc_cp16p(unsigned d, const void *src, int p) {
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(d),
                 "l"(src), "r"(p)
                 : "memory");
}
/* tc_pair in one LOP3: (w >> 4j) & 0x000F000F | c, with c = 0x43004300 held
 * in a register (LOP3 takes one immediate, so with both masks as immediates
 * the compiler emits an AND and an OR). */
__device__ __forceinline__ uint32_t tc_pair_c(uint32_t w, int j, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;\n" : "=r"(d) : "r"(w >> (4 * j)), "r"(c));
    return d;
}
/* b' = b − C·s of one weight row and group (C = 128·c: the codes' offset
 * times the 8-bit nibble factor), one rounding: C·s is exact in f32 (s is
 * bf16, C has 5 significant bits), so this is round(b − C·s). */
__device__ __forceinline__ float tc_bp(float sc, float bi, float c128) { return __fmaf_rn(-c128, sc, bi); }
/* One group's fold of an n-tile's four accumulators: column pair (sx0,
 * sx1: its Σx), row pair (sc, bp: scale and b' = b − C·s of rows g, g + 8):
 *     tot += s·(D − C·Σx) + b·Σx  =  s·D + b'·Σx
 * as two fused multiply-adds, tot = fma(s, D, fma(b', Σx, tot)); acc
 * cleared for the next group. */
template <bool CLR = true> /* clear acc after (else the group's first mma starts from zero: LV 2) */
__device__ __forceinline__ void tc_fold4(float (&tot)[4], float (&acc)[4], float sc0, float bp0, float sc1, float bp1,
                                         float sx0, float sx1) {
    tot[0] = __fmaf_rn(sc0, acc[0], __fmaf_rn(bp0, sx0, tot[0]));
    tot[1] = __fmaf_rn(sc0, acc[1], __fmaf_rn(bp0, sx1, tot[1]));
    tot[2] = __fmaf_rn(sc1, acc[2], __fmaf_rn(bp1, sx0, tot[2]));
    tot[3] = __fmaf_rn(sc1, acc[3], __fmaf_rn(bp1, sx1, tot[3]));
    if constexpr (CLR)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[i] = 0.f;
}
__device__ __forceinline__ void tc_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tc_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* This thread's chunks of the launch's L2 prefetch (tc_pf): chunk q of
 * the whole list (ranges in order, pieces in order, chunks in order) is
 * issued by thread q / gridDim.x of block q % gridDim.x, so consecutive
 * chunks go to different SMs. */
__device__ __forceinline__ void tc_prefetch_l2(const tc_pf &pf) {
    const uint32_t nb = gridDim.x, step = nb * blockDim.x;
    uint32_t q = blockIdx.x + threadIdx.x * nb; /* this thread's next chunk, counted from range r's first */
    for (int r = 0; r < pf.n; r++) {
        const uint32_t chunks = pf.cnt[r] * pf.cpr[r];
        for (; q < chunks; q += step) {
            const uint32_t i = q / pf.cpr[r], c = q - i * pf.cpr[r], o = c * PT_TC_PF_CHUNK;
            const uint32_t n = pf.len[r] - o < PT_TC_PF_CHUNK ? pf.len[r] - o : PT_TC_PF_CHUNK;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(pf.p[r] + (size_t)i * pf.str[r] + o),
                         "r"(n)
                         : "memory");
        }
        q -= chunks;
    }
}
__device__ __forceinline__ void tc_pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void tc_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;\n" :::); }

/* The mbarrier + bulk-copy (TMA, sm_90) pieces that stage the prepared x:
 * the copies complete on an mbarrier, not in the cp.async groups, so the
 * weight ring's wait counts are untouched. */
__device__ __forceinline__ unsigned tc_saddr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void tc_mbar_init(uint64_t *m) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(tc_saddr(m)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void tc_mbar_expect(uint64_t *m, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(tc_saddr(m)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_bulk(void *dst, const void *src, unsigned bytes, uint64_t *m) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     tc_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(tc_saddr(m))
                 : "memory");
}
/* One lane of the (converged, whole) warp: elect.sync's leader. */
__device__ __forceinline__ bool tc_elect(void) {
    unsigned p;
    asm volatile("{\n .reg .pred e;\n elect.sync _|e, 0xffffffff;\n selp.u32 %0, 1, 0, e;\n}\n" : "=r"(p));
    return p != 0;
}
__device__ __forceinline__ void tc_mbar_wait(uint64_t *m, unsigned parity) {
    unsigned ok = 0;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(tc_saddr(m)), "r"(parity)
                     : "memory");
    } while (!ok);
}

/* Clusters (XP kernels launched with a cluster dimension > 1): the blocks
 * of a cluster share each stage's x load. Rank r bulk-copies rows n ≡ r (mod
 * cluster size) and the last rank the Σx piece, each multicast into every
 * block of the cluster at the same offset, completing on each block's own
 * mbarrier (which expects the whole stage, as without a cluster): the L2
 * reads of x fall by the cluster size, the bytes each block receives and
 * all arithmetic stay the same. A cluster barrier (instead of
 * __syncthreads) at the top of each stage frees the buffer that the next
 * stage's copies fill in every block of the cluster. */
__device__ __forceinline__ unsigned tc_cluster_size(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned tc_cluster_rank(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void tc_cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tc_bulk_mc(void *dst, const void *src, unsigned bytes, uint64_t *m, uint16_t mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, "
                 "[%3], %4;\n" ::"r"(tc_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(tc_saddr(m)), "h"(mask)
                 : "memory");
}

/* x [nb, K] f32 -> bf16 [nb, K] and Σx per (group, row) into sx [G][ncol],
 * once per launch for the XP kernels (and once for all the weights of a
 * grouped launch). The arithmetic is the GEMV block's own staging loop
 * (gemv_tc_block), step for step: 8 values per thread, the step's sum in
 * the same tree, then the same xor tree over the GS/8 consecutive lanes of
 * the group (i ≡ lane mod 32; groups are GS/8-aligned in i, since K and a
 * stage's width are multiples of GS), so the values are the same bits the
 * in-block staging produces. */
/* Where it writes: value k of row n at xb[st·XB/2 + n·XS + k − st·KS] and
 * the Σx of group gi at sx[(st·XB + sxoff)/4 + (gi − st·KS/GS)·ncol + n],
 * st = k / KS (bytes XB, sxoff). The row layout is KS = XS = K, XB = 0,
 * sx its own array (sxoff = its byte offset from xb); the stage-major one
 * is the shared-memory buffer of each stage (tc_args::xst). */
/* xl (4-bit, stage-major; the XL kernels, gemv_tc_block): each stage is
 * [KS/64 blocks of K][ncol rows][128 bytes]: a row's 64 values of a block
 * as 8 chunks of 16 bytes, chunk 2t + h holding the B values of lane t for
 * the mmas m = 2h and 2h + 1 (k = 16m + 4t … +3 each), stored at chunk
 * (2t + h) ^ (row & 1) (so the 8 lanes of a quarter-warp hit 8 distinct
 * chunks); rows nb … ncol−1 are not written (their columns are not
 * stored). Its Σx piece is [KS/GS][ncol], as the row layout's. */
/* wg (xl = 2, 4-bit, KS = 64: gemv_wg_kernel.cuh): each 64-value unit is
 * [4 k16 steps m][2 k halves h][ncol rows][16 bytes], row n's 16 bytes of
 * (m, h) holding values 16m + 4t + 2h + {0, 1}, t = 0..3 (wgmma's K-major
 * core matrices in the order of the codes' A fragments), then the Σx piece
 * as xl's. */
template <int GS>
__global__ void __launch_bounds__(256) tc_xprep_kernel(const float *x, bf16 *xb, int nb, int K, int ncol, int KS,
                                                       int XS, int64_t XB, int64_t sxoff, int xl) {
    pt_release_dependents(); /* the GEMV after it may start its weight loads */
    tc_pdl_wait();           /* x is written by the previous kernel */
    const int spr = K / 8, steps = nb * spr, padded = (steps + 31) & ~31;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= padded) return; /* whole warps only: padded is a multiple of 32 */
    const bool live = i < steps;
    const int n = live ? i / spr : 0, w8 = live ? i % spr : 0;
    const int st = w8 * 8 / KS, kk = w8 * 8 - st * KS; /* stage, and K within it */
    char *sb = reinterpret_cast<char *>(xb) + st * XB;
    float4 u = make_float4(0.f, 0.f, 0.f, 0.f), v = u;
    if (live) {
        const float4 *src = reinterpret_cast<const float4 *>(x + (int64_t)n * K + w8 * 8);
        u = __ldg(src), v = __ldg(src + 1);
        uint4 o;
        o.x = tc_bf2(u.x, u.y), o.y = tc_bf2(u.z, u.w), o.z = tc_bf2(v.x, v.y), o.w = tc_bf2(v.z, v.w);
        if (xl == 2) { /* wg: values kk + {0,1}, +{4,5} in k half 0, +{2,3}, +{6,7} in k half 1 */
            char *rb = sb + tc_wg_xoff(kk, n, ncol);
            *reinterpret_cast<uint2 *>(rb) = make_uint2(o.x, o.z);
            *reinterpret_cast<uint2 *>(rb + ncol * 16) = make_uint2(o.y, o.w);
        } else if (xl) { /* values kk … kk+3 are lane t's, kk+4 … kk+7 lane t+1's, both of mma m */
            const int kl = kk & 63, m = kl >> 4, t0 = (kl & 15) >> 2;
            char *rb = sb + (int64_t)(kk >> 6) * ncol * 128 + (int64_t)n * 128 + (m & 1) * 8;
            *reinterpret_cast<uint2 *>(rb + ((2 * t0 + (m >> 1)) ^ (n & 1)) * 16) = make_uint2(o.x, o.y);
            *reinterpret_cast<uint2 *>(rb + ((2 * t0 + 2 + (m >> 1)) ^ (n & 1)) * 16) = make_uint2(o.z, o.w);
        } else *reinterpret_cast<uint4 *>(reinterpret_cast<bf16 *>(sb) + (int64_t)n * XS + kk) = o;
    }
    float sum = __fadd_rn(__fadd_rn(__fadd_rn(u.x, u.y), __fadd_rn(u.z, u.w)),
                          __fadd_rn(__fadd_rn(v.x, v.y), __fadd_rn(v.z, v.w)));
#pragma unroll
    for (int o = 1; o < GS / 8; o <<= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    if (live && w8 % (GS / 8) == 0) reinterpret_cast<float *>(sb + sxoff)[(int64_t)(kk / GS) * ncol + n] = sum;
}

/* Compile-time shape: nibbles per group, blocks per unit, groups per block,
 * x padding (bf16) so the B loads of a warp hit distinct banks. */
template <int BITS, int GS>
struct tc_shape {
    static constexpr int GS2 = GS * BITS / 4;
    static constexpr int BPU = GS2 >= 64 ? GS2 / 64 : 1;
    static constexpr int GPB = GS2 >= 64 ? 1 : 64 / GS2;
    static constexpr int KPB = 256 / BITS;        /* K values per block: 64 or 32 */
    static constexpr int UK = BPU * KPB;          /* K values per unit */
    static constexpr int XPAD = BITS == 4 ? 16 : 8;
    static constexpr int SLOT = 512 + 64 * GPB;   /* ring slot bytes */
};

/* The folded norm's staging (NRM kernels; tc_args::nw): one row x [K], K
 * one stage. The block plays the register norm kernel of shape a.nsh
 * (norm.cuh): its thread t holds chunks c = k·threads + t (4 values each,
 * k < V), its warps sum with fma chunk by chunk, then an xor tree, then
 * pt_block_sum's tree over the warp sums; here warp w of the block plays
 * the kernel's warps w + r·W (r < PT_TC_NRM_R), a lane keeping that
 * thread's chunks in registers (all loads issued before the first add).
 * Each chunk is then staged by the lane that loaded it: norm_out of its
 * values (the kernel's function, so the kernel's outputs) as bf16, and
 * the Σx of each group in the staging loop's order — a step of 8 values
 * is two chunks in lanes 2s, 2s + 1: their sums added (one xor-1 shuffle;
 * IEEE addition commutes, so both lanes hold it), then the loop's xor
 * tree over the group's steps as lanes 2o apart. So x in shared memory is
 * bit for bit what rms_norm's output staged by the loop would be. The
 * norm weights are read once 1/rms is known (fetched into L2 before the
 * kernel's wait). Registers: the kernel must stay within 64 a thread, so
 * that four blocks share an SM as without the fold. */
#define PT_TC_NRM_R 2 /* the kernel's warps per warp of an 8-warp block: its 512 threads at most */
#define PT_TC_NRM_V 2 /* chunks per thread: rows up to 4096 values (4: 8192, at twice the registers) */
template <int GS, int W, int NCOL>
__device__ __forceinline__ void tc_stage_norm(const tc_args &a, const float *x, const int K, bf16 *xs, float *sxs) {
    __shared__ float nred[PT_TC_NRM_R * W];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nt = a.nsh.threads, nw = nt >> 5, V = a.nsh.V;
    float4 xv[PT_TC_NRM_R][PT_TC_NRM_V];
#pragma unroll
    for (int r = 0; r < PT_TC_NRM_R; r++)
#pragma unroll
        for (int k = 0; k < PT_TC_NRM_V; k++) {
            const int c = k * nt + (warp + r * W) * 32 + lane;
            xv[r][k] = warp + r * W < nw && k < V && 4 * c < K ? *reinterpret_cast<const float4 *>(x + 4 * c)
                                                            : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
    for (int r = 0; r < PT_TC_NRM_R; r++) {
        /* zero chunks add exact zeros: fma(0, 0, s) == s */
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < PT_TC_NRM_V; k++) {
            ss = __fmaf_rn(xv[r][k].x, xv[r][k].x, ss);
            ss = __fmaf_rn(xv[r][k].y, xv[r][k].y, ss);
            ss = __fmaf_rn(xv[r][k].z, xv[r][k].z, ss);
            ss = __fmaf_rn(xv[r][k].w, xv[r][k].w, ss);
        }
        ss = pt_warp_sum(ss);
        if (lane == 0 && warp + r * W < nw) nred[warp + r * W] = ss;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(pt_warp_sum(lane < nw ? nred[lane] : 0.f) / (float)K + a.neps);
    const int st = a.nstyle, bf = a.nbf;
#pragma unroll
    for (int r = 0; r < PT_TC_NRM_R; r++)
#pragma unroll
        for (int k = 0; k < PT_TC_NRM_V; k++) {
            if (!(warp + r * W < nw && k < V)) continue; /* the whole warp alike */
            const int c = k * nt + (warp + r * W) * 32 + lane;
            const bool live = 4 * c < K;
            const float4 v = xv[r][k];
            const float4 w = live && st != PT_RMS_NOSCALE ? pt_ld4(a.nwt, a.nw, 4 * c) : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
            if (live) {
                o = make_float4(norm_out(st, v.x, inv, w.x, bf), norm_out(st, v.y, inv, w.y, bf),
                                norm_out(st, v.z, inv, w.z, bf), norm_out(st, v.w, inv, w.w, bf));
                *reinterpret_cast<uint2 *>(xs + 4 * c) = make_uint2(tc_bf2(o.x, o.y), tc_bf2(o.z, o.w));
            }
            float sum = __fadd_rn(__fadd_rn(o.x, o.y), __fadd_rn(o.z, o.w));
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
#pragma unroll
            for (int o2 = 2; o2 < GS / 4; o2 <<= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o2));
            if (live && c % (GS / 4) == 0) sxs[(4 * c / GS) * NCOL] = sum;
        }
}

/* The x prepare of rows whose RMSNorm the GEMV's caller folded into it
 * (matmul_norm, matmul_glu_norm at 2..64 rows: the XP launches and the
 * wgmma kernels): x [nb, K] is the norm's input (with add, first x =
 * round(x + add), written back: rms_norm's fused residual add), and what is
 * prepared is norm_out of it, in tc_xprep_kernel's layouts (xl 0, 1 or 2,
 * the same arguments). One block
 * per row playing the register norm kernel of shape (nsh.V, blockDim.x)
 * (norm.cu norm_reg_row): thread t holds chunks c = k·threads + t, the
 * squares summed by fma chunk by chunk, then pt_block_sum, the same inv and
 * norm_out; then each chunk staged by the lane that holds it with the Σx
 * of tc_xprep_kernel's order (a step of 8 values is two chunks in lanes 2s,
 * 2s + 1: their sums added by one xor-1 shuffle, as tc_stage_norm does, then
 * the step tree as lanes 2o apart). So the prepared x is bit for bit
 * rms_norm's output prepared by tc_xprep_kernel, one launch and one [nb, K]
 * round trip fewer. nsh.V <= PT_TC_NRM_V. */
template <int GS>
__global__ void __launch_bounds__(PT_TC_NRM_R * PT_TC_WARPS * 32)
    tc_xprep_norm_kernel(float *x, const float *add, bf16 *xb, int K, int ncol, int KS, int XS, int64_t XB,
                         int64_t sxoff, int xl, const void *nw, pt_ftype nwt, int style, float eps, int V) {
    __shared__ float red[32];
    pt_release_dependents();
    const int n = blockIdx.x, nt = blockDim.x, t = threadIdx.x, bf = 1;
    /* the norm weights before the wait (model constants, never written by
     * the step: their latency hides under the kernel before, as
     * norm_reg_row loads them) */
    float4 wv[PT_TC_NRM_V];
#pragma unroll
    for (int k = 0; k < PT_TC_NRM_V; k++) {
        const int k4 = 4 * (k * nt + t);
        wv[k] = k < V && k4 < K && style != PT_RMS_NOSCALE ? pt_ld4(nwt, nw, k4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    tc_pdl_wait(); /* x (and add) are written by the kernels before */
    float *xr = x + (int64_t)n * K;
    const float *ar = add ? add + (int64_t)n * K : nullptr;
    float4 v[PT_TC_NRM_V];
#pragma unroll
    for (int k = 0; k < PT_TC_NRM_V; k++) {
        const int c = k * nt + t;
        v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k < V && 4 * c < K) {
            v[k] = *reinterpret_cast<const float4 *>(xr + 4 * c);
            if (ar) {
                const float4 h = *reinterpret_cast<const float4 *>(ar + 4 * c);
                v[k].x = pt_rnd(bf, __fadd_rn(v[k].x, h.x));
                v[k].y = pt_rnd(bf, __fadd_rn(v[k].y, h.y));
                v[k].z = pt_rnd(bf, __fadd_rn(v[k].z, h.z));
                v[k].w = pt_rnd(bf, __fadd_rn(v[k].w, h.w));
            }
        }
    }
    if (ar)
#pragma unroll
        for (int k = 0; k < PT_TC_NRM_V; k++)
            if (k < V && 4 * (k * nt + t) < K) *reinterpret_cast<float4 *>(xr + 4 * (k * nt + t)) = v[k];
    /* zero chunks add exact zeros: fma(0, 0, s) == s */
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < PT_TC_NRM_V; k++) {
        ss = __fmaf_rn(v[k].x, v[k].x, ss);
        ss = __fmaf_rn(v[k].y, v[k].y, ss);
        ss = __fmaf_rn(v[k].z, v[k].z, ss);
        ss = __fmaf_rn(v[k].w, v[k].w, ss);
    }
    ss = pt_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)K + eps);
#pragma unroll
    for (int k = 0; k < PT_TC_NRM_V; k++) {
        if (k >= V) break; /* the whole block alike */
        const int c = k * nt + t, k4 = 4 * c;
        const bool live = k4 < K;
        const float4 w = wv[k];
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        const int st = live ? k4 / KS : 0, kk = k4 - st * KS;
        char *sb = reinterpret_cast<char *>(xb) + st * XB;
        if (live) {
            o = make_float4(norm_out(style, v[k].x, inv, w.x, bf), norm_out(style, v[k].y, inv, w.y, bf),
                            norm_out(style, v[k].z, inv, w.z, bf), norm_out(style, v[k].w, inv, w.w, bf));
            const uint2 q = make_uint2(tc_bf2(o.x, o.y), tc_bf2(o.z, o.w));
            if (xl == 2) { /* wg: values k4 + {0,1} in k half 0, + {2,3} in k half 1 (tc_xprep_kernel's) */
                char *rb = sb + tc_wg_xoff(kk, n, ncol);
                *reinterpret_cast<uint32_t *>(rb) = q.x;
                *reinterpret_cast<uint32_t *>(rb + ncol * 16) = q.y;
            } else if (xl) { /* lane tq's 4 values of mma m (tc_xprep_kernel's xl chunks) */
                const int kl = kk & 63, m = kl >> 4, tq = (kl & 15) >> 2;
                char *rb = sb + (int64_t)(kk >> 6) * ncol * 128 + (int64_t)n * 128 + (m & 1) * 8;
                *reinterpret_cast<uint2 *>(rb + ((2 * tq + (m >> 1)) ^ (n & 1)) * 16) = q;
            } else *reinterpret_cast<uint2 *>(reinterpret_cast<bf16 *>(sb) + (int64_t)n * XS + kk) = q;
        }
        float sum = __fadd_rn(__fadd_rn(o.x, o.y), __fadd_rn(o.z, o.w));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
#pragma unroll
        for (int o2 = 2; o2 < GS / 4; o2 <<= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o2));
        if (live && k4 % GS == 0) reinterpret_cast<float *>(sb + sxoff)[(int64_t)(kk / GS) * ncol + n] = sum;
    }
}

/* Output i of a block's epilogue: its column (activation row), row within the tile and tile
 * of the block. XP: indexed over NCOL columns (a power of two), the 16 rows of a tile on
 * consecutive i; else over nb columns, consecutive i on consecutive columns. */
struct tc_out {
    int col, r16, tl;
};
template <bool XP, int NCOL>
__device__ __forceinline__ tc_out tc_out_of(int i, int nb) {
    tc_out o;
    o.col = XP ? (i >> 4) & (NCOL - 1) : i % nb;
    o.r16 = XP ? i & 15 : (i / nb) % 16;
    o.tl = XP ? i / (NCOL * 16) : i / (nb * 16);
    return o;
}

/* One block's work: block bx of the weight a describes (the tiles
 * [bx·TPB, (bx + 1)·TPB)), item blockIdx.y. Shared by the single-weight
 * kernel (bx = blockIdx.x) and the grouped one (bx counted from the
 * weight's first block): the same code, so the same bits. */
template <int BITS, int GS, int NT, int W, bool XP, int LV, bool ONE, bool XL = false, bool GLU = false,
          bool NRM = false>
__device__ __forceinline__ void gemv_tc_block(const tc_args &a, const int bx, const tc_glu &gl) {
    static_assert(!NRM || (ONE && !XP), "the folded norm is for one activation row, staged in the block");
    using SH = tc_shape<BITS, GS>;
    constexpr int BPU = SH::BPU, GPB = SH::GPB, KPB = SH::KPB, UK = SH::UK, P = PT_TC_RING, NCOL = NT * 8;
    /* LV 2: the ring loop unrolled by P (slots known at compile time,
     * copies without branches) */
    constexpr bool RG = LV >= 2; /* LV 4: LV 2 compiled for two blocks per SM (tc_minb) */
    constexpr size_t RINGB = (size_t)W * P * SH::SLOT; /* bytes of the rings */
    constexpr float C128 = BITS == 4 ? 128.f : 128.f * 17.f;
    /* the row stride of the final reduction red (XP: padded, see the epilogue) */
    constexpr int RS = XP ? NCOL + 4 : NCOL;
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int S = a.S, TPB = W / S, s = warp % S;
    const int K = a.K, N = a.N, nb = a.nb, SU = a.SU;
    /* GLU: TPO = TPB/2 output tiles per block, each computed twice (gate in
     * warp w < W/2, up in warp w + W/2: the same tile, unit and stage
     * schedule as in the plain launch, so each projection's bits are the
     * plain launch's); else TPO = TPB */
    const bool upw = GLU && warp >= W / 2;
    const int TPO = GLU ? TPB / 2 : TPB;
    const int tpe = (N + 15) / 16, tile = bx * TPO + (upw ? warp - W / 2 : warp) / S;
    const int G = K / GS, NU = K / UK, KS = SU * UK;    /* groups per row, units per tile, K values per stage */
    const int XS = KS + SH::XPAD;                      /* x row stride (bf16) */
    const int64_t b_item = blockIdx.y;

    unsigned char *ring = smem + (size_t)warp * P * SH::SLOT; /* [P] slots: 512 B codes, then GPB·64 B sb */
    bf16 *xs = reinterpret_cast<bf16 *>(smem + RINGB);           /* [nb][XS] */
    float *sxs = reinterpret_cast<float *>(xs + (size_t)nb * XS);                   /* [GPS][NCOL] Σx */
    float *red = reinterpret_cast<float *>(xs);        /* [W warps][16][RS], after the last stage */
    /* XP: two x buffers of XB bytes ([nb][XS] bf16, then [GPS][NCOL] Σx),
     * filled by bulk copies of the prepared x, stage st into buffer st & 1
     * (completing on mbar[st & 1]) while stage st − 1 computes; the
     * mbarriers after both buffers and red. */
    /* XL (4-bit XP): the stage buffer as tc_xprep_kernel's xl layout */
    const int XB = XL ? (KS / 64) * NCOL * 128 + (KS / GS) * NCOL * 4 : (nb * XS * 2 + (KS / GS) * NCOL * 4 + 15) & ~15;
    uint64_t *mbar = reinterpret_cast<uint64_t *>(smem + RINGB +
                                                  (2 * XB > W * 16 * RS * 4 ? 2 * XB : W * 16 * RS * 4));
    /* drift: warps done with buffer b so far, counted over the whole launch
     * (after the two mbarriers) */
    unsigned *xrel = reinterpret_cast<unsigned *>(mbar + 2);
    /* cluster size and rank (XP launches with a cluster dimension: the
     * stage copies are shared, see tc_bulk_mc; 1 and 0 otherwise) */
    const int ncl = XP ? (int)tc_cluster_size() : 1, crank = XP && ncl > 1 ? (int)tc_cluster_rank() : 0;
    auto xcopy = [&](int k0c, int buf) { /* one thread: x[:, k0c : k0c + kc] and its Σx into buffer buf */
        const int kc = K - k0c < KS ? K - k0c : KS;
        unsigned char *xd = smem + RINGB + (size_t)buf * XB;
        if (a.xst) { /* the whole buffer in one copy (ncl pieces in a cluster) */
            const char *src = reinterpret_cast<const char *>(a.xb) + (int64_t)(k0c / KS) * XB;
            tc_mbar_expect(&mbar[buf], (unsigned)XB);
            if (ncl == 1) tc_bulk(xd, src, (unsigned)XB, &mbar[buf]);
            else {
                const int ps = (XB / ncl + 15) & ~15, o = crank * ps, e = o + ps < XB ? o + ps : XB;
                if (e > o) tc_bulk_mc(xd + o, src + o, (unsigned)(e - o), &mbar[buf], (uint16_t)((1u << ncl) - 1u));
            }
            return;
        }
        tc_mbar_expect(&mbar[buf], (unsigned)(nb * kc * 2 + (kc / GS) * NCOL * 4));
        if (ncl == 1) {
            for (int n = 0; n < nb; n++)
                tc_bulk(xd + (size_t)n * XS * 2, a.xb + (int64_t)n * K + k0c, (unsigned)kc * 2, &mbar[buf]);
            tc_bulk(xd + (size_t)nb * XS * 2, a.sxg + (int64_t)(k0c / GS) * NCOL, (unsigned)((kc / GS) * NCOL * 4),
                    &mbar[buf]);
        } else { /* this rank's rows (and the last rank the Σx), into every block of the cluster */
            const uint16_t all = (uint16_t)((1u << ncl) - 1u);
            for (int n = crank; n < nb; n += ncl)
                tc_bulk_mc(xd + (size_t)n * XS * 2, a.xb + (int64_t)n * K + k0c, (unsigned)kc * 2, &mbar[buf], all);
            if (crank == ncl - 1)
                tc_bulk_mc(xd + (size_t)nb * XS * 2, a.sxg + (int64_t)(k0c / GS) * NCOL,
                           (unsigned)((kc / GS) * NCOL * 4), &mbar[buf], all);
        }
    };

    int64_t e = a.experts ? a.experts[b_item] : a.expert;
    const bool eok = e >= 0 && e < a.n_experts;
    if (!eok) {
        if (threadIdx.x == 0 && atomicCAS(a.err, 0, 2) == 0) a.err[1] = (int)e;
        e = 0;
    }
    const float *x = a.x + (b_item / a.x_div) * (int64_t)nb * K;
    const bool has_rows = tile < tpe;
    const int64_t gtile = e * tpe + (has_rows ? tile : 0);
    const uint4 *wt = (upw ? gl.w2 : a.w) + gtile * (int64_t)(K / KPB) * 32; /* block b of the tile: wt + b·32 (uint4) */
    const uint4 *sbt = (upw ? gl.sb2 : a.sb) + gtile * (int64_t)G * 4;       /* group gi: sbt + gi·4 (uint4) */
    const int nu_w = has_rows && s < NU ? (NU - s + S - 1) / S : 0; /* this warp's units */
    const int nj = nu_w * BPU;                                  /* and blocks */

    /* Block jj of this warp's sequence into ring slot jj % P (an empty group
     * past the end, so the wait counts stay uniform). */
    /* LV > 0: the same copies from per-lane pointers and shared addresses
     * computed once, unsigned index arithmetic, the scale|bias copy
     * predicated instead of branched */
    const char *wl = reinterpret_cast<const char *>(wt + lane), *sbl = reinterpret_cast<const char *>(sbt + lane);
    const unsigned ring_sa = tc_saddr(ring) + lane * 16;
    const int sbp = lane < 4 * GPB;
    auto issue = [&](int jj) {
        if constexpr (LV > 0) {
            if (jj < nj) {
                const unsigned u = (unsigned)jj;
                const unsigned b = ((unsigned)s + (u / BPU) * (unsigned)S) * BPU + u % BPU;
                const unsigned d = ring_sa + (u % P) * SH::SLOT;
                tc_cp16s(d, wl + (size_t)b * 512);
                tc_cp16p(d + 512, sbl + (size_t)(b * KPB / GS) * 64, sbp);
            }
            tc_commit();
            return;
        }
        if (jj < nj) {
            const int b = (s + (jj / BPU) * S) * BPU + jj % BPU;
            unsigned char *slot = ring + (jj % P) * SH::SLOT;
            tc_cp16(slot + lane * 16, wt + (int64_t)b * 32 + lane);
            if (lane < 4 * GPB) {
                const int gi = b * KPB / GS + (lane >> 2);
                tc_cp16(slot + 512 + lane * 16, sbt + (int64_t)gi * 4 + (lane & 3));
            }
        }
        tc_commit();
    };
    /* LV 2: block jn into slot jn % P = sl (known at compile time in the
     * unrolled loop): both copies always issued by every lane, of 0 bytes
     * past the warp's last block (zeros into a slot no longer read, as the
     * empty group of LV 1); the scale|bias copy's 4·GPB pieces are copied
     * by lanes l and l + 4·GPB, … alike (the same bytes to the same
     * address: one request per piece, no branch on the lane) */
    const int sbq = lane & (4 * GPB - 1);
    const unsigned sb_sa = tc_saddr(ring) + 512 + sbq * 16;
    const char *sbl2 = reinterpret_cast<const char *>(sbt + sbq);
    auto issue2 = [&](const int sl, const int jn) {
        const unsigned u = (unsigned)jn;
        const unsigned b = ((unsigned)s + (u / BPU) * (unsigned)S) * BPU + u % BPU;
        const unsigned n16 = jn < nj ? 16u : 0u;
        tc_cp16z(ring_sa + sl * SH::SLOT, wl + (size_t)b * 512, n16);
        tc_cp16z(sb_sa + sl * SH::SLOT, sbl2 + (size_t)(b * KPB / GS) * 64, n16);
        tc_commit();
    };
    if constexpr (RG) {
#pragma unroll
        for (int p = 0; p < P - 1; p++) issue2(p, p);
    } else {
#pragma unroll
        for (int p = 0; p < P - 1; p++) issue(p);
    }
    /* NRM: the norm's weights of this thread's chunks fetched into L2
     * before the wait (model constants, never written by the step: the
     * fetch hides under the previous kernel's tail; held in registers
     * instead, they cost the kernel half its blocks per SM) */
    if constexpr (NRM)
        if (a.nstyle != PT_RMS_NOSCALE)
#pragma unroll
            for (int r = 0; r < PT_TC_NRM_R; r++)
#pragma unroll
                for (int k = 0; k < PT_TC_NRM_V; k++) {
                    const int c = k * a.nsh.threads + (warp + r * W) * 32 + lane;
                    if ((warp + r * W) * 32 < a.nsh.threads && k < a.nsh.V && 4 * c < K)
                        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(
                            reinterpret_cast<const char *>(a.nw) + (size_t)4 * c * (a.nwt == PT_FT_F32 ? 4 : 2)));
                }
    if (a.pf.n) tc_prefetch_l2(a.pf); /* behind the ring's first loads */
    if (a.rel_early) tc_pdl_trigger();
    tc_pdl_wait(); /* x is written by the previous kernel */
    if constexpr (NRM) tc_stage_norm<GS, W, NCOL>(a, x, K, xs, sxs);
    /* radd: this thread's first output's residual value, loaded now so
     * its latency hides under the main loop (the epilogue's output i =
     * threadIdx.x; indices as there) */
    float rpre = 0.f;
    if (a.radd) {
        const int i = threadIdx.x, outs = TPO * 16 * (XP ? NCOL : nb);
        const tc_out o = tc_out_of<XP, NCOL>(i, nb);
        const int row = (bx * TPO + o.tl) * 16 + o.r16;
        if (i < outs && row < N && !(XP && o.col >= nb))
            rpre = a.y[b_item * (int64_t)nb * a.ldy + (int64_t)o.col * a.ldy + row];
    }
    if constexpr (XP) {
        if (threadIdx.x == 0) {
            tc_mbar_init(&mbar[0]);
            tc_mbar_init(&mbar[1]);
            xrel[0] = xrel[1] = 0;
        }
        /* in a cluster, every block's mbarriers are initialized before any
         * rank's copies signal them */
        if (ncl > 1) tc_cluster_sync();
        if (threadIdx.x == 0) xcopy(0, 0);
    }

    float tot[NT][4], acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[n][i] = acc[n][i] = 0.f;

    /* this lane's B rows: column 8n + g (columns past nb read row nb−1: their results are not stored) */
    int xrow[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) xrow[n] = (8 * n + g < nb ? 8 * n + g : nb - 1) * XS;

    uint32_t c43 = 0x43004300u; /* in a register (tc_pair_c) */
    asm volatile("mov.b32 %0, %0;\n" : "+r"(c43));
    int k0 = 0; /* the stage's first K */
    /* The 4 mmas of block jj (codes wv: this lane's A fragments; scale|bias
     * words sbq of the block's groups for row pair g) into acc, folding each
     * group that ends into tot. */
    /* stage-local K of this warp's block jj (>= 0) */
    auto kb_of = [&](const int jj) {
        const unsigned uj = (unsigned)jj;
        const int b = LV ? (int)(((unsigned)s + (uj / BPU) * (unsigned)S) * BPU + uj % BPU)
                         : (s + (jj / BPU) * S) * BPU + jj % BPU;
        return b * KPB - k0;
    };
    /* ub: the block's place in its unit (jj mod BPU) */
    auto block_math = [&](const uint4 &wv, const uint2 (&sbq)[GPB], const int kb, const unsigned ub) {
        constexpr int MPG = SH::GS2 / 16; /* mmas per group: 2, 4, 8, 16 */
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint32_t wd = m == 0 ? wv.x : m == 1 ? wv.y : m == 2 ? wv.z : wv.w;
            uint32_t a0, a1, a2, a3;
            if constexpr (LV > 0)
                a0 = tc_pair_c(wd, 0, c43), a1 = tc_pair_c(wd, 1, c43), a2 = tc_pair_c(wd, 2, c43),
                a3 = tc_pair_c(wd, 3, c43);
            else a0 = tc_pair(wd, 0), a1 = tc_pair(wd, 1), a2 = tc_pair(wd, 2), a3 = tc_pair(wd, 3);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                uint32_t b0, b1;
                if constexpr (BITS == 4) {
                    const uint2 bv = *reinterpret_cast<const uint2 *>(xs + xrow[n] + kb + m * 16 + 4 * t);
                    b0 = bv.x, b1 = bv.y;
                } else { /* (x_k, 16·x_k), (x_k+1, 16·x_k+1) */
                    const uint32_t v = *reinterpret_cast<const uint32_t *>(xs + xrow[n] + kb + m * 8 + 2 * t);
                    __nv_bfloat162 xv = *reinterpret_cast<const __nv_bfloat162 *>(&v);
                    __nv_bfloat162 x16 = __hmul2(xv, __floats2bfloat162_rn(16.f, 16.f));
                    const uint32_t v16 = *reinterpret_cast<uint32_t *>(&x16);
                    b0 = __byte_perm(v, v16, 0x5410);
                    b1 = __byte_perm(v, v16, 0x7632);
                }
                if constexpr (RG) {
                    /* the group's first mma starts from zero (the fold
                     * below does not clear acc) */
                    const bool gbeg = MPG <= 4 ? (m % MPG == 0) : (m == 0 && ub == 0);
                    if (gbeg) tc_mma_z(acc[n], a0, a1, a2, a3, b0, b1);
                    else tc_mma_nv(acc[n], a0, a1, a2, a3, b0, b1);
                } else if constexpr (LV > 0) tc_mma_nv(acc[n], a0, a1, a2, a3, b0, b1);
                else tc_mma(acc[n], a0, a1, a2, a3, b0, b1);
            }
            /* a group ends after this mma: fold it into the totals */
            const bool gend = MPG <= 4 ? ((m + 1) % MPG == 0) : (m == 3 && ub == BPU - 1);
            if (gend) {
                const int q = GPB == 2 ? m >> 1 : 0; /* group of the block */
                const uint2 sbv = sbq[q];
                const float sc0 = __uint_as_float(sbv.x << 16), bi0 = __uint_as_float(sbv.x & 0xFFFF0000u);
                const float sc1 = __uint_as_float(sbv.y << 16), bi1 = __uint_as_float(sbv.y & 0xFFFF0000u);
                const int gl = LV ? (int)((unsigned)(kb + m * (KPB / 4)) / GS)
                                  : (kb + m * (KPB / 4)) / GS; /* stage-local group */
                if constexpr (ONE) {
                    /* one activation row: only column 0 is stored, so only
                     * the even columns (2t) are folded, each exactly as
                     * below */
                    const float sx0 = sxs[gl * NCOL + 2 * t];
                    tot[0][0] = __fmaf_rn(sc0, acc[0][0], __fmaf_rn(tc_bp(sc0, bi0, C128), sx0, tot[0][0]));
                    tot[0][2] = __fmaf_rn(sc1, acc[0][2], __fmaf_rn(tc_bp(sc1, bi1, C128), sx0, tot[0][2]));
                    if constexpr (!RG)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[0][i] = 0.f;
                } else {
                    const float bp0 = tc_bp(sc0, bi0, C128), bp1 = tc_bp(sc1, bi1, C128);
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        const float2 sx = *reinterpret_cast<const float2 *>(sxs + gl * NCOL + 8 * n + 2 * t);
                        tc_fold4<!RG>(tot[n], acc[n], sc0, bp0, sc1, bp1, sx.x, sx.y);
                    }
                }
            }
        }
    };
    /* XL (4-bit, XP): the same mmas and folds from the xl layout of x
     * (tc_xprep_kernel): per n-tile two 16-byte loads at offsets known at
     * compile time from two per-lane bases (instead of 4 8-byte loads, each
     * with its row clamp and address arithmetic), and
     * n-tile by n-tile (each acc[n] still takes its mmas m = 0, 1, 2, 3 in
     * order and is folded where its group ends, as above; other n-tiles'
     * order does not matter: they are independent): the same bits. */
    unsigned xl_lo0 = 0, xl_lo1 = 0; /* this lane's chunks (h = 0, 1) in a row, plus its row g */
    if constexpr (XL) {
        xl_lo0 = g * 128 + (((2 * t) ^ (g & 1)) * 16);
        xl_lo1 = g * 128 + (((2 * t + 1) ^ (g & 1)) * 16);
    }
    auto block_math_xl = [&](const uint4 &wv, const uint2 (&sbq)[GPB], const int jj) {
        const unsigned uj = (unsigned)jj;
        const int b = (int)(((unsigned)s + (uj / BPU) * (unsigned)S) * BPU + uj % BPU);
        const int kb = b * KPB - k0; /* stage-local K of the block (>= 0, a multiple of 64) */
        const unsigned char *xk = reinterpret_cast<const unsigned char *>(xs) + (unsigned)(kb >> 6) * (NCOL * 128);
        uint32_t am[4][4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint32_t wd = m == 0 ? wv.x : m == 1 ? wv.y : m == 2 ? wv.z : wv.w;
            am[m][0] = tc_pair_c(wd, 0, c43), am[m][1] = tc_pair_c(wd, 1, c43), am[m][2] = tc_pair_c(wd, 2, c43),
            am[m][3] = tc_pair_c(wd, 3, c43);
        }
        constexpr int MPG = SH::GS2 / 16; /* mmas per group: 2, 4, 8 */
        const bool unit_end = MPG <= 4 || (uj % BPU) == BPU - 1;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint4 b01 = *reinterpret_cast<const uint4 *>(xk + xl_lo0 + n * 1024);
            const uint4 b23 = *reinterpret_cast<const uint4 *>(xk + xl_lo1 + n * 1024);
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const uint4 &bq = m < 2 ? b01 : b23;
                if (m & 1) tc_mma_nv(acc[n], am[m][0], am[m][1], am[m][2], am[m][3], bq.z, bq.w);
                else tc_mma_nv(acc[n], am[m][0], am[m][1], am[m][2], am[m][3], bq.x, bq.y);
                const bool gend = MPG <= 4 ? ((m + 1) % MPG == 0) : (m == 3 && unit_end);
                if (gend) {
                    const int q = GPB == 2 ? m >> 1 : 0; /* group of the block */
                    const uint2 sbv = sbq[q];
                    const float sc0 = __uint_as_float(sbv.x << 16), bi0 = __uint_as_float(sbv.x & 0xFFFF0000u);
                    const float sc1 = __uint_as_float(sbv.y << 16), bi1 = __uint_as_float(sbv.y & 0xFFFF0000u);
                    const int gl = (int)((unsigned)(kb + m * 16) / GS); /* stage-local group */
                    const float2 v = *reinterpret_cast<const float2 *>(sxs + gl * NCOL + 8 * n + 2 * t);
                    tc_fold4(tot[n], acc[n], sc0, tc_bp(sc0, bi0, C128), sc1, tc_bp(sc1, bi1, C128), v.x, v.y);
                }
            }
        }
    };
    int jj = 0;
    /* drift (XP, no cluster): only stage 0 starts with a block-wide barrier;
     * after that a warp done with stage st's buffer counts itself in
     * xrel[st & 1], and the last of the W warps to do so issues stage st + 2
     * into it, so warps run up to a stage apart instead of meeting at every
     * stage (the lockstep left them all in the mma or all in the fold at
     * once). Same bytes in the same buffers: the same bits. */
    const bool drift = XP && ncl == 1 && a.drift;
    /* XP: the stage number counted (st = k0 / KS) and a warp's blocks per
     * stage computed once: a stage is SU units, a whole number of S-unit
     * rounds (tc_xp_su), so this warp's blocks end at (st + 1)·SU/S·BPU
     * before the last stage and at nj in it — the blocks the division
     * below gives, without the per-stage integer divisions (at 64 rows a
     * stage of the S = 8 weights is one block per warp, and the divisions
     * and the block's bookkeeping were half its instructions) */
    int st = 0;
    const int jps = XP ? SU / S * BPU : 0;
    for (; k0 < K; k0 += KS, st++) {
        const int ks = K - k0 < KS ? K - k0 : KS;
        /* the previous stage's x is no longer read (in a cluster: in any
         * block of it, since the next copies fill every block's buffer) */
        if (XP && ncl > 1) tc_cluster_sync();
        else if (!drift || k0 == 0) __syncthreads();
        if constexpr (XP) {
            /* stage st = k0 / KS is in buffer st & 1; the next stage goes
             * into the other one, free since the barrier above (drift: from
             * stage 1 on, issued by the last warp done with stage st − 1) */
            if (threadIdx.x == 0 && k0 + KS < K && (!drift || k0 == 0)) xcopy(k0 + KS, (st + 1) & 1);
            xs = reinterpret_cast<bf16 *>(smem + RINGB + (size_t)(st & 1) * XB);
            sxs = XL ? reinterpret_cast<float *>(reinterpret_cast<unsigned char *>(xs) + (size_t)(KS / 64) * NCOL * 128)
                     : reinterpret_cast<float *>(xs + (size_t)nb * XS);
            tc_mbar_wait(&mbar[st & 1], (unsigned)(st >> 1) & 1u);
        } else if constexpr (NRM) {
            /* staged before the loop (tc_stage_norm: K is one stage) */
        } else
        /* x[:, k0 : k0+ks] as bf16, 8 values per thread-step, and Σx per
         * (row, group): the step's 8 values added in order, then a xor tree
         * over the GS/8 lanes of the group (the steps of a group are
         * consecutive lanes: i ≡ lane mod 32 and groups are GS/8-aligned in
         * i). The order depends on GS only, not on nb or the stage. */
        {
            const int spr = ks / 8, steps = nb * spr, padded = (steps + 31) & ~31;
#pragma unroll 4
            for (int i = threadIdx.x; i < padded; i += blockDim.x) {
                const bool live = i < steps;
                const int n = live ? i / spr : 0, w8 = live ? i % spr : 0;
                float4 u = make_float4(0.f, 0.f, 0.f, 0.f), v = u;
                if (live) {
                    const float4 *src = reinterpret_cast<const float4 *>(x + (int64_t)n * K + k0 + w8 * 8);
                    u = __ldg(src), v = __ldg(src + 1);
                    uint4 o;
                    o.x = tc_bf2(u.x, u.y), o.y = tc_bf2(u.z, u.w), o.z = tc_bf2(v.x, v.y), o.w = tc_bf2(v.z, v.w);
                    *reinterpret_cast<uint4 *>(xs + n * XS + w8 * 8) = o;
                }
                float sum = __fadd_rn(__fadd_rn(__fadd_rn(u.x, u.y), __fadd_rn(u.z, u.w)),
                                      __fadd_rn(__fadd_rn(v.x, v.y), __fadd_rn(v.z, v.w)));
#pragma unroll
                for (int o = 1; o < GS / 8; o <<= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
                if (live && w8 % (GS / 8) == 0) sxs[(w8 / (GS / 8)) * NCOL + n] = sum;
            }
        }
        if constexpr (!XP) __syncthreads();
        /* this warp's blocks in the stage: units below (k0 + ks) / UK */
        int jend;
        if constexpr (XP) jend = k0 + KS >= K ? nj : (st + 1) * jps;
        else {
            const int uend = (k0 + ks) / UK;
            jend = (uend > s ? (uend - s + S - 1) / S : 0) * BPU;
        }
        const int jstop = jend < nj ? jend : nj;
        if constexpr (RG) {
            /* LV 2: P blocks per step, block jj + i from slot i, slot
             * i − 1 refilled with block jj + i + P − 1. A stage's blocks
             * per warp are a multiple of P except in the last stage (the
             * launch sizes stages so: tc_rg_ok), so jj is a multiple of P
             * at every stage's start. */
            /* Addresses per step, not per block: with jj a multiple of
             * P (so of BPU), block jj + c of this warp (c known at
             * compile time) is tile block Bj + (c / BPU)·S·BPU + c mod
             * BPU, Bj = (s + (jj / BPU)·S)·BPU. So each copy's source is a
             * step base plus a multiple of a launch constant (one integer
             * multiply-add), the copy's predicate one compare with the
             * step's blocks left, and a block's stage-local K the step's
             * plus a multiple of another (the same blocks and values as
             * issue2 and kb_of give). A full step (P blocks before jstop)
             * runs without a test per block. */
            const unsigned SB = (unsigned)S * BPU;                          /* tile blocks from one unit to the warp's next */
            const unsigned SBW = SB * 512u;                                 /* their code bytes */
            const unsigned SBS = (unsigned)S * (BPU > 1 ? 64u : 64u * GPB); /* their scale|bias bytes */
            const int SBK = (int)SB * KPB;                                  /* their K values */
            for (; jj < jstop; jj += P) {
                const unsigned Bj = ((unsigned)s + ((unsigned)jj / BPU) * (unsigned)S) * BPU;
                const char *wj = wl + (size_t)Bj * 512;
                const char *sbj = sbl2 + (size_t)(BPU > 1 ? Bj / BPU : Bj * GPB) * 64;
                const int kbj = (int)Bj * KPB - k0, rem = nj - jj;
                auto step = [&](const int i) { /* block jj + i (i < P, known at compile time) */
                    tc_wait<P - 2>(); /* block jj + i has landed */
                    __syncwarp();     /* and every lane is done with slot i − 1 */
                    {                 /* block jj + c into slot c mod P (issue2) */
                        constexpr int Pm = P - 1;
                        const int c = i + Pm;
                        const unsigned sl = (unsigned)(c % P), n16 = c < rem ? 16u : 0u;
                        tc_cp16z(ring_sa + sl * SH::SLOT, wj + (size_t)(unsigned)(c / BPU) * SBW + (c % BPU) * 512,
                                 n16);
                        tc_cp16z(sb_sa + sl * SH::SLOT, sbj + (size_t)(unsigned)(c / BPU) * SBS, n16);
                        tc_commit();
                    }
                    const unsigned char *slot = ring + i * SH::SLOT;
                    const uint4 wv = *reinterpret_cast<const uint4 *>(slot + lane * 16);
                    uint2 qv[GPB];
#pragma unroll
                    for (int q = 0; q < GPB; q++) qv[q] = *reinterpret_cast<const uint2 *>(slot + 512 + q * 64 + g * 8);
                    block_math(wv, qv, kbj + (i / BPU) * SBK + (i % BPU) * KPB, (unsigned)(i % BPU));
                };
                if (jj + P <= jstop) {
#pragma unroll
                    for (int i = 0; i < P; i++) step(i);
                } else {
#pragma unroll
                    for (int i = 0; i < P; i++)
                        if (jj + i < jstop) step(i);
                }
            }
        } else
        for (; jj < jstop; jj++) {
            tc_wait<P - 2>(); /* block jj has landed */
            __syncwarp();     /* and every lane is done with the slot reloaded next */
            issue(jj + P - 1);
            const unsigned uj = (unsigned)jj;
            const unsigned char *slot = ring + (LV ? uj % P : jj % P) * SH::SLOT;
            const uint4 wv = *reinterpret_cast<const uint4 *>(slot + lane * 16);
            uint2 qv[GPB];
#pragma unroll
            for (int q = 0; q < GPB; q++) qv[q] = *reinterpret_cast<const uint2 *>(slot + 512 + q * 64 + g * 8);
            if constexpr (XL) block_math_xl(wv, qv, jj);
            else block_math(wv, qv, kb_of(jj), (unsigned)jj % BPU);
        }
        if constexpr (XP)
            if (drift) { /* this warp is done with the stage's buffer */
                __syncwarp();
                if (lane == 0) {
                    __threadfence_block();
                    const unsigned done = atomicAdd(&xrel[st & 1], 1u) + 1u;
                    if (done == (unsigned)W * ((unsigned)st / 2u + 1u) && k0 + 2 * KS < K) {
                        __threadfence_block();
                        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                        xcopy(k0 + 2 * KS, st & 1);
                    }
                }
            }
    }
    tc_wait<0>();
    tc_pdl_trigger();
    __syncthreads(); /* x no longer read: red aliases it */
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i >> 1), col = 8 * n + 2 * t + (i & 1);
            red[(warp * 16 + r) * RS + col] = tot[n][i];
        }
    __syncthreads();
    float *y = a.y + b_item * (int64_t)nb * a.ldy;
    /* XP (nb > NCOL / 2): outputs indexed over NCOL columns, a power of
     * two, so no division by nb (columns past nb skipped), the 16 rows of a
     * tile on consecutive threads, so a warp's stores are two runs of 16
     * consecutive outputs of y (not 32 rows ldy apart), and red's rows RS
     * apart so those threads' reads do not fall on one bank. The same value
     * per output (the same adds in the same order), stored by another
     * thread. */
    const int outs = TPO * 16 * (XP ? NCOL : nb);
    for (int i = threadIdx.x; i < outs; i += blockDim.x) {
        const tc_out oi = tc_out_of<XP, NCOL>(i, nb);
        const int col = oi.col, r16 = oi.r16, tl = oi.tl;
        const int row = (bx * TPO + tl) * 16 + r16;
        if (row >= N || (XP && col >= nb)) continue;
        float v = 0.f;
        for (int ss = 0; ss < S; ss++) v += red[((tl * S + ss) * 16 + r16) * RS + col];
        if (a.bias) v += pt_ld(a.bt, a.bias, e * N + row);
        float o = eok ? pt_round_bf(v) : 0.f;
        if constexpr (GLU) { /* up: the upper warps' partials, reduced as gate's; then the GLU of the two stored values */
            float u = 0.f;
            for (int ss = 0; ss < S; ss++) u += red[(((TPO + tl) * S + ss) * 16 + r16) * RS + col];
            if (gl.bias2) u += pt_ld(gl.bt2, gl.bias2, row);
            o = pt_glu_val(gl.fn, o, pt_round_bf(u), gl.bf);
        }
        if (a.radd) o = pt_round_bf(__fadd_rn(i == (int)threadIdx.x ? rpre : y[(int64_t)col * a.ldy + row], o));
        y[(int64_t)col * a.ldy + row] = o;
    }
}

/* Blocks per SM the kernels are compiled for (registers: 65536 / (32·W·n)
 * a thread at most). The one-column unrolled loop (LV 2, NT 1) is held to
 * four, 64 registers: left at two, the compiler overlaps the blocks of a
 * step (~115 registers) and an SM holds half the blocks. Its 16-warp
 * blocks (the one-row GLU launches of more than two blocks an SM,
 * tc_launch) likewise to two. */
constexpr int tc_minb(int W, int NT, int LV) {
    return W > 8 ? (NT == 1 && LV == 2 ? 2 : 1) : NT >= 8 ? 1 : NT == 1 && LV == 2 ? 4 : 2;
}
/* (LV 4: the same loop at two blocks per SM, ~115 registers: the blocks of
 * a step overlap without spilling; tc_launch_nt takes it at one row where
 * the launch has between one and two blocks per SM, tc_lv4.) */

template <int BITS, int GS, int NT, int W, bool XP, int LV, bool ONE, bool XL = false, bool NRM = false>
__global__ void __launch_bounds__(W * 32, tc_minb(W, NT, LV)) gemv_tc_kernel(tc_args a) {
    gemv_tc_block<BITS, GS, NT, W, XP, LV, ONE, XL, false, NRM>(a, blockIdx.x, tc_glu());
}

/* The GLU epilogue's launch (pt_cuda_tc_gemv_glu): inner loops 1 and 2. */
template <int BITS, int GS, int NT, int W, bool XP, bool ONE, bool XL = false, int LV = 1, bool NRM = false>
__global__ void __launch_bounds__(W * 32, tc_minb(W, NT, LV)) gemv_tc_glu_kernel(tc_args a, tc_glu g) {
    gemv_tc_block<BITS, GS, NT, W, XP, LV, ONE, XL, true, NRM>(a, blockIdx.x, g);
}

/* The grouped launch (pt_cuda_tc_gemv_multi): up to PT_TC_MULTI weights of
 * the same bits, group size and K over the same x, their blocks back to back
 * in grid.x (weight i owns blocks [first[i], first[i + 1])). Each block runs
 * gemv_tc_block with its own weight's arguments (its own S and stage size),
 * so every output is bit-identical to that weight's own launch. */
#define PT_TC_MULTI 4
struct tc_multi_args {
    tc_args a[PT_TC_MULTI];
    int first[PT_TC_MULTI + 1];
    int n;
};

template <int BITS, int GS, int NT, int W, bool XP, int LV, bool ONE, bool XL = false, bool NRM = false>
__global__ void __launch_bounds__(W * 32, tc_minb(W, NT, LV)) gemv_tc_multi_kernel(tc_multi_args m) {
    const int bx = blockIdx.x;
    int i = 0;
#pragma unroll
    for (int j = 1; j < PT_TC_MULTI; j++)
        if (j < m.n && bx >= m.first[j]) i = j;
    gemv_tc_block<BITS, GS, NT, W, XP, LV, ONE, XL, false, NRM>(m.a[i], bx - m.first[i], tc_glu());
}

#endif
