/* CUDA device discovery: how many GPUs, what each one is, and a self-test
 * kernel proving this build's machine code (sm_90a) runs on the device. Used
 * by backend selection (device_select.c) and by `make check-cuda`. Not the
 * op table and no model code. */
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda.h"
}

#include <stdio.h>
#include <string.h>

/* out[i] = i * 3 + 1 for i < n: trivially checkable, and any index error or
 * missing write shows up (the buffer is poisoned first). */
__global__ void pt_cuda_selftest_kernel(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * 3 + 1;
}

extern "C" int pt_cuda_device_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        if (why && n)
            snprintf(why, n, "cudaGetDeviceCount failed: %s (code %d): %s", cudaGetErrorName(e),
                     (int)e, cudaGetErrorString(e));
        (void)cudaGetLastError(); /* reset the last-error state for later calls */
        return 0;
    }
    if (count == 0 && why && n) snprintf(why, n, "cudaGetDeviceCount reports no devices");
    return count;
}

extern "C" pt_status pt_cuda_device_query(int index, pt_cuda_device_info *info) {
    memset(info, 0, sizeof *info);
    info->index = index;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->l2_bytes = (size_t)p.l2CacheSize;
    info->smem_optin_per_block = p.sharedMemPerBlockOptin;
    CUDA_CHECK(cudaDriverGetVersion(&info->driver_version));
    CUDA_CHECK(cudaRuntimeGetVersion(&info->runtime_version));
    CUDA_CHECK(cudaSetDevice(index));
    CUDA_CHECK(cudaMemGetInfo(&info->free_mem, &info->total_mem));

    /* The self-test: does a kernel of this build run here? On a device of
     * another architecture the launch fails with "no kernel image". */
    enum { N = 1000 };
    int *d = NULL, h[N];
    CUDA_CHECK(cudaMalloc(&d, N * sizeof(int)));
    pt_status st = PT_OK;
    cudaError_t e = cudaMemset(d, 0xff, N * sizeof(int));
    if (e == cudaSuccess) {
        pt_cuda_selftest_kernel<<<(N + 255) / 256, 256>>>(d, N);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    }
    cudaFree(d);
    if (e != cudaSuccess) {
        st = pt_error(PT_ERR_DEVICE,
                      "self-test kernel on device %d (%s, sm_%d%d) failed: %s (code %d): %s "
                      "(this build carries sm_90a code only)",
                      index, p.name, p.major, p.minor, cudaGetErrorName(e), (int)e,
                      cudaGetErrorString(e));
        (void)cudaGetLastError();
        return st;
    }
    for (int i = 0; i < N; i++)
        if (h[i] != i * 3 + 1)
            return pt_error(PT_ERR_DEVICE, "self-test kernel on device %d wrote %d at %d, expected %d",
                            index, h[i], i, i * 3 + 1);
    info->kernel_ok = 1;
    return PT_OK;
}

/* Streams `bytes` of device memory with 16-byte loads (each block keeps
 * several loads in flight) and folds them into one word so the reads cannot
 * be dropped: the read-bandwidth roofline for the benchmarks. */
__global__ void pt_cuda_read_kernel(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678u) *sink = acc; /* practically never: keeps the loads alive */
}

extern "C" pt_status pt_cuda_read_bandwidth(size_t bytes, double *gbs) {
    *gbs = 0;
    void *buf = NULL;
    unsigned *sink = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    pt_status st = PT_OK;
    cudaDeviceProp prop;
    float best = 1e30f;
    const size_t n = bytes / 16;
#define PT_RB(call) CUDA_CHECK_GOTO(call, st, done)
    PT_RB(cudaGetDeviceProperties(&prop, 0));
    PT_RB(cudaMalloc(&buf, n * 16));
    PT_RB(cudaMalloc((void **)&sink, sizeof(unsigned)));
    PT_RB(cudaMemset(buf, 0x5a, n * 16));
    PT_RB(cudaEventCreate(&e0));
    PT_RB(cudaEventCreate(&e1));
    for (int r = 0; r < 6; r++) {
        PT_RB(cudaEventRecord(e0));
        pt_cuda_read_kernel<<<prop.multiProcessorCount * 8, 512>>>((const uint4 *)buf, n, sink);
        PT_RB(cudaGetLastError());
        PT_RB(cudaEventRecord(e1));
        PT_RB(cudaEventSynchronize(e1));
        float ms = 0;
        PT_RB(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0 && ms < best) best = ms; /* the first run warms up */
    }
    *gbs = (double)(n * 16) / (best * 1e-3) / 1e9;
done:
#undef PT_RB
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (buf) cudaFree(buf);
    if (sink) cudaFree(sink);
    return st;
}
