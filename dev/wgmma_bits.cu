/* dev/wgmma_bits.cu — does a chain of wgmma.m64n8k16 (Hopper's warpgroup
 * MMA, A in registers, B from shared memory) give the same bits as the chain
 * of mma.sync.m16n8k16 the decode GEMV runs (gemv_tc_kernel.cuh)?
 *
 * The many-row GEMV keeps batch invariance by running the same mma.sync
 * chain per quantization group at every row count; a GEMV that took wgmma
 * for many rows would keep it only if, for the same operands, each 16-deep
 * step D = A·B + C rounds the same way in both instructions. This runs both
 * on the same operands and counts the outputs that differ in any bit:
 *   - A = 128 + q (q a random 4-bit code, as the GEMV feeds its codes), and
 *     A = random bf16 of mixed magnitudes;
 *   - B = random bf16 activations (normal-ish) and bf16 values spread over
 *     40 octaves with random signs (many alignment shifts in the adds);
 *   - the chain over 4 steps (a 64-value group), starting from C = 0 in
 *     registers (scale-d 1) and from scale-d 0.
 * A warp's 16 rows of the wgmma's 64 use the same register fragments as the
 * warp's mma.sync, so the two differ only in the instruction.
 *
 * Not part of the build or the tests (a question about the hardware, asked
 * once): nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o wgmma_bits
 * dev/wgmma_bits.cu && ./wgmma_bits
 * on an H100/H200. Prints one line per case and "differ" counts. */
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK_CUDA(x)                                                                 \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

enum { M = 64, K = 64, NMAX = 64, THREADS = 128 };

/* A [M][K] and B [K][NN] of one trial (NN <= NMAX), bf16 bits. */
struct trial {
    uint16_t a[M * K];
    uint16_t b[K * NMAX];
};

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* The mma.m16n8k16 A fragment of rows r0..r0+15, columns k0..k0+15 (row-major A). */
__device__ __forceinline__ void a_frag(const uint16_t *A, int r0, int k0, int lane, uint32_t (&a)[4]) {
    const int g = lane >> 2, t = lane & 3;
    const uint16_t *p0 = A + (r0 + g) * K + k0 + 2 * t, *p1 = A + (r0 + g + 8) * K + k0 + 2 * t;
    a[0] = pack2(p0[0], p0[1]);
    a[1] = pack2(p1[0], p1[1]);
    a[2] = pack2(p0[8], p0[9]);
    a[3] = pack2(p1[8], p1[9]);
}

/* One trial per block (one warpgroup): the mma.sync chains of each warp's
 * 16 rows over NN / 8 n-tiles, and the wgmma chain m64nNNk16, both from the
 * same A fragments. */
template <int NN>
__global__ void __launch_bounds__(THREADS) both_kernel(const trial *tr, float *out_mma, float *out_wg, int zero_by_scale) {
    const trial &T = tr[blockIdx.x];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* B in shared memory, K-major core matrices (8 n × 8 k, 16-byte rows):
     * element (k, n) at byte (k / 8)·NN·16 + (n / 8)·128 + (n % 8)·16 + (k % 8)·2,
     * so core matrices adjacent in K are NN·16 bytes apart (LBO), in N 128 (SBO) */
    __shared__ __align__(128) uint16_t bs[K * NN];
    for (int i = threadIdx.x; i < K * NN; i += THREADS) {
        const int k = i / NN, n = i % NN;
        bs[(k / 8) * NN * 8 + (n / 8) * 64 + (n % 8) * 8 + (k % 8)] = T.b[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    uint32_t a[4][4];
    for (int ks = 0; ks < 4; ks++) a_frag(T.a, 16 * warp, 16 * ks, lane, a[ks]);

    /* mma.sync chains, from C = 0 */
    float c[NN / 8][4];
    for (int nt = 0; nt < NN / 8; nt++) {
        for (int i = 0; i < 4; i++) c[nt][i] = 0.f;
        for (int ks = 0; ks < 4; ks++) {
            const int k0 = 16 * ks, n = 8 * nt + g;
            const uint32_t b0 = pack2(T.b[(k0 + 2 * t) * NN + n], T.b[(k0 + 2 * t + 1) * NN + n]);
            const uint32_t b1 = pack2(T.b[(k0 + 2 * t + 8) * NN + n], T.b[(k0 + 2 * t + 9) * NN + n]);
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%0,%1,%2,%3};\n"
                         : "+f"(c[nt][0]), "+f"(c[nt][1]), "+f"(c[nt][2]), "+f"(c[nt][3])
                         : "r"(a[ks][0]), "r"(a[ks][1]), "r"(a[ks][2]), "r"(a[ks][3]), "r"(b0), "r"(b1));
        }
    }

    /* wgmma chain: step ks reads B's core matrices of k blocks 2ks, 2ks + 1 */
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(bs);
    uint64_t desc[4];
    for (int ks = 0; ks < 4; ks++) {
        const uint32_t addr = base + ks * 2 * NN * 16;
        desc[ks] = (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((NN * 16) >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
    }
    float d[NN / 2];
    for (int i = 0; i < NN / 2; i++) d[i] = 0.f;
    const int s0 = zero_by_scale ? 0 : 1; /* the first step: D = A·B (scale-d 0) or D = A·B + 0 */
    if constexpr (NN == 8) {
        asm volatile("{\n .reg .pred p0;\n setp.ne.b32 p0, %20, 0;\n"
                     "wgmma.fence.sync.aligned;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %21, p0, 1, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%8,%9,%10,%11}, %22, 1, 1, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%12,%13,%14,%15}, %23, 1, 1, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%16,%17,%18,%19}, %24, 1, 1, 1, 0;\n"
                     "wgmma.commit_group.sync.aligned;\n"
                     "wgmma.wait_group.sync.aligned 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]), "r"(a[1][2]),
                       "r"(a[1][3]), "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]), "r"(a[3][0]), "r"(a[3][1]),
                       "r"(a[3][2]), "r"(a[3][3]), "r"(s0), "l"(desc[0]), "l"(desc[1]), "l"(desc[2]), "l"(desc[3])
                     : "memory");
    } else {
    asm volatile("{\n .reg .pred p0;\n setp.ne.b32 p0, %48, 0;\n"
                 "wgmma.fence.sync.aligned;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32,%33,%34,%35}, %49, p0, 1, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%36,%37,%38,%39}, %50, 1, 1, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%40,%41,%42,%43}, %51, 1, 1, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%44,%45,%46,%47}, %52, 1, 1, 1, 0;\n"
                 "wgmma.commit_group.sync.aligned;\n"
                 "wgmma.wait_group.sync.aligned 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]), "r"(a[1][2]), "r"(a[1][3]), "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]), "r"(a[3][0]), "r"(a[3][1]), "r"(a[3][2]), "r"(a[3][3]), "r"(s0), "l"(desc[0]), "l"(desc[1]), "l"(desc[2]), "l"(desc[3])
                 : "memory");
    }

    /* D fragments: n-tile j of the warp's 16 rows is c[j] / d[4j .. 4j + 3]:
     * (row g, col 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1) */
    float *om = out_mma + (size_t)blockIdx.x * M * NN, *ow = out_wg + (size_t)blockIdx.x * M * NN;
    const int r = 16 * warp + g;
    for (int j = 0; j < NN / 8; j++) {
        const int col = 8 * j + 2 * t;
        om[r * NN + col] = c[j][0], om[r * NN + col + 1] = c[j][1];
        om[(r + 8) * NN + col] = c[j][2], om[(r + 8) * NN + col + 1] = c[j][3];
        ow[r * NN + col] = d[4 * j], ow[r * NN + col + 1] = d[4 * j + 1];
        ow[(r + 8) * NN + col] = d[4 * j + 2], ow[(r + 8) * NN + col + 1] = d[4 * j + 3];
    }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t ru32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static uint16_t bf16_of(float v) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float rnorm(void) { /* sum of uniforms: roughly normal */
    float s = 0.f;
    for (int i = 0; i < 4; i++) s += (float)(ru32() & 0xFFFFFF) / 16777216.f;
    return (s - 2.f) * 1.7f;
}

int main(void) {
    const int NT = 2048; /* trials per case */
    trial *h = (trial *)malloc(sizeof(trial) * NT), *dtr;
    const size_t nout = (size_t)NT * M * NMAX;
    float *om, *ow, *hm = (float *)malloc(sizeof(float) * nout), *hw = (float *)malloc(sizeof(float) * nout);
    CHECK_CUDA(cudaMalloc(&dtr, sizeof(trial) * NT));
    CHECK_CUDA(cudaMalloc(&om, sizeof(float) * nout));
    CHECK_CUDA(cudaMalloc(&ow, sizeof(float) * nout));
    const char *aname[2] = {"A = 128 + q (4-bit codes)", "A = random bf16"};
    const char *bname[2] = {"B ~ normal activations", "B over 40 octaves, random signs"};
    int64_t total_diff = 0, total = 0;
    for (int nn = 8; nn <= 64; nn *= 8)
        for (int ak = 0; ak < 2; ak++)
            for (int bk = 0; bk < 2; bk++) {
                for (int i = 0; i < NT; i++) {
                    for (int j = 0; j < M * K; j++)
                        h[i].a[j] =
                            ak == 0 ? (uint16_t)(0x4300u | (ru32() & 15u)) : bf16_of(rnorm() * (float)(1 + (ru32() & 7)));
                    for (int j = 0; j < K * nn; j++) {
                        float v = rnorm();
                        if (bk == 1)
                            v = ((ru32() & 1) ? -1.f : 1.f) * (1.f + (float)(ru32() & 127) / 128.f) *
                                ldexpf(1.f, (int)(ru32() % 41) - 20);
                        h[i].b[j] = bf16_of(v);
                    }
                }
                CHECK_CUDA(cudaMemcpy(dtr, h, sizeof(trial) * NT, cudaMemcpyHostToDevice));
                for (int zs = 0; zs < 2; zs++) {
                    if (nn == 8) both_kernel<8><<<NT, THREADS>>>(dtr, om, ow, zs);
                    else both_kernel<64><<<NT, THREADS>>>(dtr, om, ow, zs);
                    CHECK_CUDA(cudaGetLastError());
                    const size_t n = (size_t)NT * M * nn;
                    CHECK_CUDA(cudaMemcpy(hm, om, sizeof(float) * n, cudaMemcpyDeviceToHost));
                    CHECK_CUDA(cudaMemcpy(hw, ow, sizeof(float) * n, cudaMemcpyDeviceToHost));
                    int64_t diff = 0, far = 0;
                    double worst = 0.0;
                    for (size_t i = 0; i < n; i++)
                        if (memcmp(&hm[i], &hw[i], 4)) {
                            diff++;
                            const double rel = fabs((double)hm[i] - hw[i]) / (fabs((double)hm[i]) + 1e-30);
                            if (rel > worst) worst = rel;
                            if (rel > 1e-3) far++; /* a layout error, not rounding */
                        }
                    printf("N %2d  %-26s %-32s first step %-11s: %lld of %lld differ (worst rel %.3g, %lld beyond 1e-3)\n",
                           nn, aname[ak], bname[bk], zs ? "scale-d 0" : "C = 0", (long long)diff, (long long)n, worst,
                           (long long)far);
                    total_diff += diff, total += (int64_t)n;
                }
            }
    printf("wgmma vs mma.sync: %lld of %lld outputs differ\n", (long long)total_diff, (long long)total);
    return 0;
}
