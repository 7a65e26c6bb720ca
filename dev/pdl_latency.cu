/* What a kernel boundary costs inside a CUDA graph, by the way the dependent
 * kernel waits for its primary. A chain of NK kernels, each a grid of B
 * blocks: block b of kernel k waits for kernel k − 1, reads that kernel's B
 * outputs (a full dependency, as a GEMV's x or the attention's q/k/v), spins
 * for `work` ns on one thread (the kernel's own work), and writes its own output. The
 * chain is captured into a graph and replayed; the time per kernel minus
 * `work` is what a boundary costs.
 *
 * Modes (the first column of the output):
 *   plain     launched without programmatic dependent launch
 *   wait-s    PDL, launch_dependents first thing, griddepcontrol.wait (the
 *             decode step's small kernels)
 *   wait-e    PDL, launch_dependents after the work, griddepcontrol.wait
 *             (the GEMVs: released after their main loop)
 *   poll-s    PDL, launch_dependents first thing; no griddepcontrol.wait:
 *             thread 0 polls kernel k − 1's arrival counter (ld.acquire.gpu)
 *             until its B blocks have arrived; each block arrives after its
 *             writes (bar.sync, then thread 0: red.release.gpu)
 *   poll-e    as poll-s, launch_dependents after the work
 * Outputs are read through L2 (ld.global.cg): with polling the data is
 * written while the reader runs. Every mode's final value is checked.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o dev/pdl_latency dev/pdl_latency.cu
 *   dev/pdl_latency [B threads NK replays] [work_ns ...]    (default 132 256 160 20, work 0 1000 3000 ns) */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ck.h"

enum { M_PLAIN, M_WAIT_S, M_WAIT_E, M_POLL_S, M_POLL_E, M_N };
static const char *mode_name[M_N] = {"plain", "wait-s", "wait-e", "poll-s", "poll-e"};

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void spin_ns(long long ns) {
    if (ns <= 0) return;
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

/* buf [NK + 1][B]: kernel k reads row k, writes row k + 1; cnt [NK + 1] arrivals (kernel 0 waits for nothing). */
__global__ void chain_kernel(float *buf, unsigned *cnt, int k, int mode, long long work) {
    const int B = gridDim.x;
    const bool early = mode == M_WAIT_S || mode == M_POLL_S;
    if (early) asm volatile("griddepcontrol.launch_dependents;\n" :::);
    if (mode == M_WAIT_S || mode == M_WAIT_E) asm volatile("griddepcontrol.wait;\n" ::: "memory");
    if ((mode == M_POLL_S || mode == M_POLL_E) && k > 0) {
        if (threadIdx.x == 0)
            while (ld_acquire(cnt + k) < (unsigned)B) __nanosleep(32);
        __syncthreads();
    }
    float s = 0.f;
    for (int i = threadIdx.x; i < B; i += blockDim.x) s += __ldcg(buf + (size_t)k * B + i);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __shared__ float ws[32];
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) spin_ns(work); /* one thread: the other warps wait at the barrier, not on the timer */
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += ws[w];
        /* each output is the mean of the inputs plus one: the chain's last row is NK + the first */
        __stcg(buf + (size_t)(k + 1) * B + blockIdx.x, t / (float)B + 1.f);
    }
    if (mode == M_POLL_S || mode == M_POLL_E) {
        __syncthreads();
        if (threadIdx.x == 0) red_release(cnt + k + 1, 1u);
    }
    if (!early && mode != M_PLAIN) asm volatile("griddepcontrol.launch_dependents;\n" :::);
}

int main(int argc, char **argv) {
    int B = 132, T = 256, NK = 160, R = 20, ai = 1;
    if (argc >= 5) B = atoi(argv[1]), T = atoi(argv[2]), NK = atoi(argv[3]), R = atoi(argv[4]), ai = 5;
    std::vector<long long> works;
    for (; ai < argc; ai++) works.push_back(atoll(argv[ai]));
    if (works.empty()) works = {0, 1000, 3000};
    float *buf;
    unsigned *cnt;
    CK(cudaMalloc(&buf, (size_t)(NK + 1) * B * sizeof(float)));
    CK(cudaMalloc(&cnt, (size_t)(NK + 1) * sizeof(unsigned)));
    std::vector<float> row0(B, 0.f);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("B %d threads %d kernels %d replays %d\n", B, T, NK, R);
    printf("%-8s %8s %12s %12s %8s\n", "mode", "work_ns", "us/kernel", "boundary_us", "check");
    for (long long work : works)
        for (int round = 0; round < 2; round++)
            for (int mode = 0; mode < M_N; mode++) {
                CK(cudaMemcpyAsync(buf, row0.data(), B * sizeof(float), cudaMemcpyHostToDevice, st));
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                CK(cudaMemsetAsync(cnt, 0, (NK + 1) * sizeof(unsigned), st));
                for (int k = 0; k < NK; k++) {
                    cudaLaunchConfig_t cfg = {};
                    cfg.gridDim = dim3(B);
                    cfg.blockDim = dim3(T);
                    cfg.stream = st;
                    cudaLaunchAttribute at[1];
                    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at[0].val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = at;
                    cfg.numAttrs = mode == M_PLAIN || k == 0 ? 0 : 1;
                    CK(cudaLaunchKernelEx(&cfg, chain_kernel, buf, cnt, k, mode, work));
                }
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphLaunch(ge, st)); /* warm-up */
                CK(cudaStreamSynchronize(st));
                std::vector<float> ms(R);
                for (int r = 0; r < R; r++) {
                    CK(cudaEventRecord(e0, st));
                    CK(cudaGraphLaunch(ge, st));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms[r], e0, e1));
                }
                std::sort(ms.begin(), ms.end());
                std::vector<float> last(B);
                CK(cudaMemcpy(last.data(), buf + (size_t)NK * B, B * sizeof(float), cudaMemcpyDeviceToHost));
                /* each replay starts from the previous replay's row 0 (never rewritten): row NK = NK */
                bool ok = true;
                for (int b = 0; b < B; b++) ok = ok && last[b] == (float)NK;
                const double per = 1000.0 * ms[R / 2] / NK;
                printf("%-8s %8lld %12.3f %12.3f %8s\n", mode_name[mode], work, per, per - work / 1000.0,
                       ok ? "ok" : "WRONG");
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
    return 0;
}
