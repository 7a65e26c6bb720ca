/* Where the one-launch short decode attention (src/backend/cuda/attention_short.cu,
 * dec2_short_kernel) spends its time: the kernel built with PT_DS_TRACE, one
 * sequence with the RoPE and cache write folded (as the decode step runs it),
 * a block per query head, for a list of key counts. Per key count it prints
 * the kernel's time by CUDA events (mean of back-to-back launches) and, from
 * thread 0 of every block, the SM clock at each phase boundary relative to
 * the end of griddepcontrol.wait (median over blocks and launches), and the
 * spread of the blocks' start and end on the global timer.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
 *        -DPT_DS_TRACE -DPT_DS_TRACE_BLOCKS=64 -o dev/ds_phases dev/ds_phases.cu \
 *        build-cuda/libpetrel.a -lcublas
 *   dev/ds_phases [nh nkv hd cap] [n ...]      (default 32 8 64 128: llama-3.2-1b)
 *   DS_NST=0|1|2 dev/ds_phases ...              (rows staged in shared memory; default 2)
 *   DS_COLD=1 dev/ds_phases ...                 (L2 evicted before each launch, PDL; see flush_kernel)
 *
 * Phases (DS_MARK numbers): 0 after the wait; 1 the step's rows in shared
 * memory, RoPE table; 2 rotated; 3 cache rows stored, staged keys waited
 * for; 4 scores; 5 split max, task sums; 6 split sums, staged values; 7 row
 * max and sum; 8 p·V partials; 9 merged and stored; 10 entry (before the
 * wait). */
#include "backend/cuda/attention_short.cu"

#include <algorithm>
#include <string>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ck.h"

/* The step's GEMVs stream far more than the L2 holds between two attention
 * launches of a layer: this kernel evicts it (writes 4 floats a thread over
 * `n` floats) and then writes the attention's inputs, q and the step's k
 * and v rows, as the q/k/v GEMV would (so those are in L2, the cache rows
 * are not). */
__global__ void flush_kernel(float4 *buf, int64_t n4, float *q, int nq, float *kn, float *vn, int nk, float salt) {
    pt_release_dependents(); /* the attention launch may start now and wait, as behind the q/k/v GEMV */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x)
        buf[i] = make_float4(salt, salt, salt, salt);
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < nq) q[t] = 0.01f * (float)((t * 37) % 101) - 0.5f + salt;
    if (t < nk) kn[t] = 0.01f * (float)((t * 53) % 97) - 0.5f, vn[t] = 0.01f * (float)((t * 71) % 89) - 0.5f;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

int main(int argc, char **argv) {
    int nh = 32, nkv = 8, hd = 64;
    int64_t cap = 128;
    int ai = 1;
    if (argc >= 5) nh = atoi(argv[1]), nkv = atoi(argv[2]), hd = atoi(argv[3]), cap = atoll(argv[4]), ai = 5;
    std::vector<int> ns;
    for (; ai < argc; ai++) ns.push_back(atoi(argv[ai]));
    if (ns.empty()) ns = {1, 16, 32, 64, 96, 128};
    typedef __nv_bfloat16 KT;
    const int G = nh / nkv, R = hd * 2 / 16, half = hd / 2;
    KT *k, *v;
    float *q, *kn, *vn, *fr, *out;
    int32_t *pos;
    int *err;
    CK(cudaMalloc(&k, (size_t)nkv * cap * hd * sizeof(KT)));
    CK(cudaMalloc(&v, (size_t)nkv * cap * hd * sizeof(KT)));
    CK(cudaMalloc(&q, (size_t)nh * hd * 4));
    CK(cudaMalloc(&kn, (size_t)nkv * hd * 4));
    CK(cudaMalloc(&vn, (size_t)nkv * hd * 4));
    CK(cudaMalloc(&fr, (size_t)half * 4));
    CK(cudaMalloc(&out, (size_t)nh * hd * 4));
    CK(cudaMalloc(&pos, 4));
    CK(cudaMalloc(&err, 8));
    CK(cudaMemset(err, 0, 8));
    {
        std::vector<KT> h((size_t)nkv * cap * hd);
        srand(7);
        for (auto &x : h) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f));
        CK(cudaMemcpy(k, h.data(), h.size() * sizeof(KT), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(v, h.data(), h.size() * sizeof(KT), cudaMemcpyHostToDevice));
        std::vector<float> f((size_t)nh * hd);
        for (auto &x : f) x = rand() / (float)RAND_MAX - 0.5f;
        CK(cudaMemcpy(q, f.data(), (size_t)nh * hd * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(kn, f.data(), (size_t)nkv * hd * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(vn, f.data(), (size_t)nkv * hd * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < half; i++) f[i] = powf(500000.f, -2.f * i / hd);
        CK(cudaMemcpy(fr, f.data(), (size_t)half * 4, cudaMemcpyHostToDevice));
    }
    pt_dec_rows a = {};
    a.out = out, a.q = q, a.k = k, a.v = v, a.kvp = nullptr, a.pos = pos;
    a.nh = nh, a.nkv = nkv, a.hd = hd, a.cap = cap, a.scale = 1.f / sqrtf((float)hd), a.bf = 1;
    a.minper = 16, a.stride = cap; /* attention.cu DEC_MINPER */
    a.nsplit = (2 * 132 + nkv - 1) / nkv;
    if (a.nsplit > (cap + 63) / 64) a.nsplit = (cap + 63) / 64;
    a.kn = kn, a.vn = vn, a.inv_freq = fr, a.rscale = 1.f, a.half = half, a.max_keys = cap, a.err = err;
    const d2_geom gm = d2_geometry(R, G);
    int tsm;
    const int tp = ds_max_tasks(a, cap, gm, &tsm);
    const char *ns_env = getenv("DS_NST"); /* 0, 1, 2: rows staged in shared memory (c->dec_short_stage) */
    const int nst = ns_env ? atoi(ns_env) : 2;
    const size_t smem = ds_smem(1, hd, tp, R, nst);
    printf("shape nh %d nkv %d hd %d cap %lld: nsplit %lld, LS %d SKB %d LP %d PKB %d, tasks <= %d scores, %d p.V, "
           "smem %zu (staged %d)\n",
           nh, nkv, hd, (long long)cap, (long long)a.nsplit, gm.LS, gm.SKB, gm.LP, gm.PKB, tsm, tp, smem, nst);
    if (!tp) return 1;
    /* DS_COLD=1: every launch after flush_kernel (L2 evicted, q/k/v just written), launched with programmatic
     * dependent launch as the decode step does; the event times then include the flush */
    const bool cold = getenv("DS_COLD") && atoi(getenv("DS_COLD"));
    const int64_t fn4 = (int64_t)160 << 20 >> 2; /* 160 MB of floats, in float4s */
    float4 *fbuf = nullptr;
    if (cold) CK(cudaMalloc(&fbuf, fn4 * 16));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
#define LAUNCH(LS, LP, PG)                                                                                         \
    do {                                                                                                           \
        auto kf = dec2_short_kernel<KT, LS, LP, 1, PG, 1, 16, true>;                                               \
        CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, DS_SMEM_MAX));                     \
        if (cold) {                                                                                                \
            flush_kernel<<<528, 512>>>(fbuf, fn4, q, nh * hd, kn, vn, nkv * hd, 0.f);                              \
            pt_launch(kf, dim3(nh, 1), dim3(512), smem, 0, true, a, 0);                                            \
        } else                                                                                                     \
            kf<<<dim3(nh, 1), 512, smem>>>(a, 0);                                                                  \
    } while (0)
    auto launch = [&]() {
        if (R == 8 && G <= 4) LAUNCH(2, 8, 4);
        else if (R == 16 && G <= 4) LAUNCH(4, 16, 4);
        else if (R == 8) LAUNCH(2, 8, 8);
        else LAUNCH(4, 16, 8);
    };
    const int nb = nh < PT_DS_TRACE_BLOCKS ? nh : PT_DS_TRACE_BLOCKS, reps = 200;
    printf("%5s %8s |", "keys", "us/kern");
    for (int i = 1; i <= 9; i++) printf(" %6s", ("ph" + std::to_string(i)).c_str());
    printf(" | %7s %7s %7s %8s  %s\n", "pre", "startsp", "endsp", "span", "out+cache hash");
    for (int n : ns) {
        const int32_t p = n - 1;
        CK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < 20; i++) launch();
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; i++) launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        std::vector<std::vector<double>> ph(11);
        std::vector<double> ssp, esp, span;
        for (int r = 0; r < 20; r++) {
            launch();
            CK(cudaDeviceSynchronize());
            long long t[PT_DS_TRACE_BLOCKS][16];
            CK(cudaMemcpyFromSymbol(t, pt_ds_trace, sizeof t));
            long long smin = t[0][14], smax = t[0][14], emin = t[0][15], emax = t[0][15];
            for (int bk = 0; bk < nb; bk++) {
                for (int i = 1; i <= 9; i++) ph[i].push_back((double)(t[bk][i] - t[bk][0]));
                ph[10].push_back((double)(t[bk][0] - t[bk][10]));
                smin = std::min(smin, t[bk][14]), smax = std::max(smax, t[bk][14]);
                emin = std::min(emin, t[bk][15]), emax = std::max(emax, t[bk][15]);
            }
            ssp.push_back((double)(smax - smin)), esp.push_back((double)(emax - emin));
            span.push_back((double)(emax - smin));
        }
        /* the output and the cache (its new row), hashed: two builds of the kernel compare by these */
        uint64_t hsh = 1469598103934665603ull;
        {
            std::vector<unsigned char> o((size_t)nh * hd * 4 + (size_t)nkv * cap * hd * 4);
            CK(cudaMemcpy(o.data(), out, (size_t)nh * hd * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o.data() + (size_t)nh * hd * 4, k, (size_t)nkv * cap * hd * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o.data() + (size_t)nh * hd * 4 + (size_t)nkv * cap * hd * 2, v, (size_t)nkv * cap * hd * 2,
                          cudaMemcpyDeviceToHost));
            for (unsigned char c : o) hsh = (hsh ^ c) * 1099511628211ull;
        }
        int e[2];
        CK(cudaMemcpy(e, err, 8, cudaMemcpyDeviceToHost));
        if (e[0]) printf("error flag %d (%d)\n", e[0], e[1]);
        printf("%5d %8.2f |", n, 1000.0 * ms / reps);
        for (int i = 1; i <= 9; i++) printf(" %6.0f", median(ph[i]));
        printf(" | %7.0f %6.0fns %6.0fns %6.0fns  %016llx\n", median(ph[10]), median(ssp), median(esp), median(span),
               (unsigned long long)hsh);
    }
    printf("(ph: SM cycles from the end of the wait to each phase's end, median over blocks; pre: entry to the "
           "end of the wait; spreads: the blocks' first and last wait end and end on the global timer; span: the "
           "first wait end to the last end)\n");
    return 0;
}
