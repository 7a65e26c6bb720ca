/* Memory-pattern microbenchmark for the decode GEMV (gemv_tc.cu): how fast
 * can the H200 stream a weight laid out and walked the way the GEMV walks
 * it, with no arithmetic? Separates "the access pattern / bytes in flight"
 * from "the kernel's own work" when the GEMV runs below the read roofline.
 *   lin    : grid-stride 16-byte loads over the buffer (the roofline)
 *   ring   : warps stream 512-byte blocks through a cp.async ring of P slots
 *            in shared memory, as gemv_tc.cu does: a tile is nblk blocks,
 *            its S warps take blocks round-robin; layout tile-major (the
 *            repacked layout: a tile's blocks contiguous) or block-major
 *            (block b of every tile adjacent: warps at the same step read
 *            neighbouring bytes)
 * Each timed launch reads a fresh window of a 2 GiB buffer (no L2 reuse);
 * median of 15 launches timed with events. Not a test; standalone:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o cuda_stream_ab dev/cuda_stream_ab.cu
 * Usage: cuda_stream_ab (prints one line per configuration). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

__global__ void lin_kernel(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t st = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * st < n; i += 4 * st) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + st), c = __ldg(p + i + 2 * st), d = __ldg(p + i + 3 * st);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += st) acc ^= __ldg(p + i).x;
    if (acc == 0x12345678u) *sink = acc;
}

__device__ __forceinline__ void cp16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void waitg(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 8 warps per block; warp gw = tile·S + s streams blocks s, s+S, ... of its tile. */
template <int P>
__global__ void __launch_bounds__(256) ring_kernel(const uint4 *p, int nt, int nblk, int S, int layout,
                                                   unsigned *sink) {
    extern __shared__ __align__(16) unsigned char sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * 8 + warp, tile = gw / S, s = gw % S;
    if (tile >= nt) return;
    unsigned char *ring = sm + warp * P * 512;
    const int nj = s < nblk ? (nblk - s + S - 1) / S : 0;
    auto addr = [&](int j) {
        const int64_t b = s + (int64_t)j * S;
        return layout == 0 ? p + ((int64_t)tile * nblk + b) * 32 + lane : p + (b * nt + tile) * 32 + lane;
    };
    auto issue = [&](int j) {
        if (j < nj) cp16(ring + (j % P) * 512 + lane * 16, addr(j));
        commit();
    };
#pragma unroll
    for (int q = 0; q < P - 1; q++) issue(q);
    unsigned acc = 0;
    for (int j = 0; j < nj; j++) {
        waitg<P - 2>();
        __syncwarp();
        issue(j + P - 1);
        const uint4 v = *reinterpret_cast<const uint4 *>(ring + (j % P) * 512 + lane * 16);
        acc ^= v.x + v.y * 3 + v.z * 5 + v.w * 7;
    }
    waitg<0>();
    if (acc == 0x12345678u) *sink = acc;
}

static float med(float *t, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j], t[j] = x;
            }
    return t[n / 2];
}

static const size_t BUF = (size_t)2 << 30;

template <int P>
static void run_ring(const char *name, const uint4 *buf, unsigned *sink, int nt, int nblk, int S, int layout, int bpsm,
                     int sms) {
    const size_t bytes = (size_t)nt * nblk * 512;
    const int blocks = (nt * S + 7) / 8;
    /* shared memory padded so that at most bpsm blocks fit an SM */
    size_t smem = (size_t)8 * P * 512;
    const size_t pad = (228 * 1024) / bpsm - 1024;
    if (pad > smem) smem = pad;
    if (smem > 227 * 1024) smem = 227 * 1024;
    CK(cudaFuncSetAttribute(ring_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int nwin = (int)(BUF / bytes);
    float t[15];
    for (int r = 0; r < 17; r++) {
        const uint4 *p = buf + (size_t)(r % nwin) * (bytes / 16);
        CK(cudaEventRecord(a));
        ring_kernel<P><<<blocks, 256, smem>>>(p, nt, nblk, S, layout, sink);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 2) t[r - 2] = ms;
    }
    CK(cudaGetLastError());
    const float m = med(t, 15);
    printf("ring %-10s P=%2d S=%d layout=%s blocks/SM<=%d grid=%5d (%.2f waves) %6.1f MB: %7.2f us %6.0f GB/s\n", name,
           P, S, layout ? "blk-major " : "tile-major", bpsm, blocks, (double)blocks / (sms * bpsm), bytes / 1e6,
           m * 1e3, bytes / (m * 1e-3) / 1e9);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
}

int main(void) {
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    const int sms = pr.multiProcessorCount;
    printf("%s, %d SMs\n", pr.name, sms);
    uint4 *buf;
    unsigned *sink;
    CK(cudaMalloc(&buf, BUF));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 0x5a, BUF));
    {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        float t[7];
        for (int r = 0; r < 8; r++) {
            CK(cudaEventRecord(a));
            lin_kernel<<<sms * 8, 512>>>(buf, BUF / 16, sink);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            if (r) t[r - 1] = ms;
        }
        const float m = med(t, 7);
        printf("lin 2 GiB: %.1f us %6.0f GB/s\n", m * 1e3, BUF / (m * 1e-3) / 1e9);
    }
    /* shapes of the 8b q4 GEMVs: gate/up 896 tiles × 64 blocks, down 256 × 224, lm_head 8016 × 64,
     * q/o 256 × 64 */
    static const struct { const char *n; int nt, nblk, S; } sh[] = {
        {"gate/up", 896, 64, 2}, {"down", 256, 224, 8}, {"q/o", 256, 64, 8}, {"lm_head", 8016, 64, 1},
        {"gu-pair", 1792, 64, 2},
    };
    for (int i = 0; i < 5; i++)
        for (int layout = 0; layout < 2; layout++)
            for (int bpsm = 2; bpsm <= 4; bpsm += 2) {
                run_ring<8>(sh[i].n, buf, sink, sh[i].nt, sh[i].nblk, sh[i].S, layout, bpsm, sms);
                run_ring<16>(sh[i].n, buf, sink, sh[i].nt, sh[i].nblk, sh[i].S, layout, bpsm, sms);
            }
    /* more warps per tile at the same blocks per SM */
    run_ring<8>("gate/up", buf, sink, 896, 64, 4, 0, 4, sms);
    run_ring<8>("gate/up", buf, sink, 896, 64, 8, 0, 4, sms);
    run_ring<16>("gate/up", buf, sink, 896, 64, 4, 0, 4, sms);
    run_ring<4>("gate/up", buf, sink, 896, 64, 2, 0, 2, sms);
    run_ring<32>("gate/up", buf, sink, 896, 64, 2, 0, 2, sms);
    run_ring<16>("lm_head", buf, sink, 8016, 64, 1, 0, 8, sms);
    run_ring<32>("lm_head", buf, sink, 8016, 64, 1, 0, 4, sms);
    CK(cudaFree(buf));
    return 0;
}
