/* Where the batched rows' short decode attention (src/backend/cuda/attention_short.cu,
 * dec2_short_kernel with FOLD false: continuous batching's step, every key read
 * from the cache, the queries rotated in the kernel) spends its time: the
 * kernel built with PT_DS_TRACE for the llama-3.1-8b shape (32 query heads, 8
 * KV heads, head_dim 128, bf16 cache), B rows each with its own caches, L
 * layers of caches launched in turn (so a launch's rows are not in the L2 from
 * the launch before, as in a step). Per key count and build it prints the
 * kernel's attributes (registers, local memory), its time by CUDA events (mean
 * over the layers' back-to-back launches) and, from thread 0 of the blocks of
 * a few rows, the SM clock at each phase boundary relative to the end of
 * griddepcontrol.wait (median), with the spread of those blocks' start and end.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
 *        -DPT_DS_TRACE -DPT_DS_TRACE_BLOCKS=8 -o dev/ds_rows_phases dev/ds_rows_phases.cu \
 *        build-cuda/libpetrel.a -lcublas
 *   dev/ds_rows_phases [rows [cap [layers]]] [-- n ...]   (default 64 1024 32 -- 80 200)
 *
 * Builds (the served rule: 8-warp blocks under the 128-key bound, 16 under
 * 256; the dense builds where the launch has more blocks than the plain
 * build's blocks an SM hold): dense, plain, dense staged by split (fl 4), and
 * dec_rows1_kernel (the splits of one task) dense and plain (it marks phases
 * 0, 3, 4 (scores and the split pairs), 6, 7 (p·V), 8, 9).
 * Phases (DS_MARK numbers, the batched rows' path): 0 after the wait; 3 the
 * rotated queries in shared memory; 4 scores; 5 split max, task sums; 6 split
 * sums (staged values waited for); 7 row max and sum; 8 p·V partials; 9
 * merged and stored; 10 entry (before the wait). */
#include "backend/cuda/attention_short.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ck.h"

typedef __nv_bfloat16 KT;

/* element i of a cache: a hash of (salt, i) in [-1, 1) as bf16 */
__global__ void fill_kernel(KT *p, int64_t n, uint32_t salt) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ salt;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2bfloat16((float)(h & 0xffff) / 32768.f - 1.f);
    }
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct build {
    const char *name;
    void (*kern)(pt_dec_rows, int); /* dec2_short_kernel, or */
    void (*kern1)(pt_dec_rows);     /* dec_rows1_kernel */
    int nw, fl;
};

int main(int argc, char **argv) {
    const int nh = 32, nkv = 8, hd = 128, G = nh / nkv, R = hd * 2 / 16, half = hd / 2;
    int B = 64, L = 32;
    int64_t cap = 1024;
    int ai = 1;
    if (ai < argc && strcmp(argv[ai], "--")) B = atoi(argv[ai++]);
    if (ai < argc && strcmp(argv[ai], "--")) cap = atoll(argv[ai++]);
    if (ai < argc && strcmp(argv[ai], "--")) L = atoi(argv[ai++]);
    std::vector<int> ns;
    if (ai < argc && !strcmp(argv[ai], "--"))
        for (ai++; ai < argc; ai++) ns.push_back(atoi(argv[ai]));
    if (ns.empty()) ns = {80, 200};
    const size_t celems = (size_t)nkv * cap * hd;
    std::vector<void *> tabs(L);
    for (int l = 0; l < L; l++) {
        std::vector<void *> t(2 * B);
        for (int i = 0; i < 2 * B; i++) {
            KT *c;
            CK(cudaMalloc(&c, celems * sizeof(KT)));
            fill_kernel<<<256, 256>>>(c, (int64_t)celems, (uint32_t)(l * 2 * B + i) * 7919u + 1u);
            t[i] = c;
        }
        CK(cudaMalloc(&tabs[l], sizeof(void *) * 2 * B));
        CK(cudaMemcpy(tabs[l], t.data(), sizeof(void *) * 2 * B, cudaMemcpyHostToDevice));
    }
    float *q, *out, *fr;
    int32_t *pos;
    int *err;
    CK(cudaMalloc(&q, (size_t)B * nh * hd * 4));
    CK(cudaMalloc(&out, (size_t)B * nh * hd * 4));
    CK(cudaMalloc(&fr, (size_t)half * 4));
    CK(cudaMalloc(&pos, (size_t)B * 4));
    CK(cudaMalloc(&err, 8));
    CK(cudaMemset(err, 0, 8));
    {
        std::vector<float> f((size_t)B * nh * hd);
        srand(7);
        for (auto &x : f) x = 4.f * (rand() / (float)RAND_MAX) - 2.f;
        CK(cudaMemcpy(q, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < half; i++) f[i] = powf(500000.f, -2.f * i / hd);
        CK(cudaMemcpy(fr, f.data(), (size_t)half * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaDeviceSynchronize());
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    pt_dec_rows a = {};
    a.out = out, a.q = q, a.kvp = nullptr, a.pos = pos;
    a.nh = nh, a.nkv = nkv, a.hd = hd, a.cap = cap, a.scale = 1.f / sqrtf((float)hd), a.bf = 1;
    a.minper = 16, a.stride = cap; /* attention.cu: DEC_MINPER, dec_shape */
    a.nsplit = (2 * sms + nkv - 1) / nkv;
    if (a.nsplit > (cap + 63) / 64) a.nsplit = (cap + 63) / 64;
    a.kn = a.vn = nullptr, a.inv_freq = fr, a.rscale = 1.f, a.half = half, a.err = err;
    const d2_geom gm = d2_geometry(R, G);
    if (gm.LS != 4 || gm.LP != 16 || gm.CP != 1) return 1;
    typedef void (*k1)(pt_dec_rows);
    const build builds[] = {
        {"8w dense", dec2_short_kernel<KT, 4, 16, 1, 4, 4, 8, false, 4>, nullptr, 8, 0},
        {"8w plain", dec2_short_kernel<KT, 4, 16, 1, 4, 4, 8, false, 2>, nullptr, 8, 0},
        {"8w dense split", dec2_short_kernel<KT, 4, 16, 1, 4, 4, 8, false, 4>, nullptr, 8, 4},
        {"8w rows1 dense", nullptr, (k1)dec_rows1_kernel<KT, 4, 16, 1, 4, 8, 4>, 8, 0},
        {"8w rows1 plain", nullptr, (k1)dec_rows1_kernel<KT, 4, 16, 1, 4, 8, 2>, 8, 0},
        {"16w dense", dec2_short_kernel<KT, 4, 16, 1, 4, 4, 16, false, 2>, nullptr, 16, 0},
        {"16w plain", dec2_short_kernel<KT, 4, 16, 1, 4, 4, 16, false, 1>, nullptr, 16, 0},
        {"16w dense split", dec2_short_kernel<KT, 4, 16, 1, 4, 4, 16, false, 2>, nullptr, 16, 4},
        {"16w rows1 dense", nullptr, (k1)dec_rows1_kernel<KT, 4, 16, 1, 4, 16, 2>, 16, 0},
        {"16w rows1 plain", nullptr, (k1)dec_rows1_kernel<KT, 4, 16, 1, 4, 16, 1>, 16, 0},
    };
    for (const build &bd : builds) {
        cudaFuncAttributes fa;
        const void *kf = bd.kern ? (const void *)bd.kern : (const void *)bd.kern1;
        CK(cudaFuncGetAttributes(&fa, kf));
        CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, DS_SMEM_MAX));
        printf("%-16s %3d registers, %4zu bytes local, %5zu static shared\n", bd.name, fa.numRegs,
               (size_t)fa.localSizeBytes, (size_t)fa.sharedSizeBytes);
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("rows %d, cap %lld, %d layers of caches, nsplit %lld; phases: SM cycles from the end of the wait\n", B,
           (long long)cap, L, (long long)a.nsplit);
    printf("%-16s %5s %5s %8s |", "build", "keys", "blk/SM", "us/kern");
    const int shown[] = {3, 4, 5, 6, 7, 8, 9};
    for (int i : shown) printf(" %6s%d", "ph", i);
    printf(" | %6s %7s %7s %7s  %s\n", "pre", "startsp", "endsp", "life", "out hash");
    for (int n : ns) {
        std::vector<int32_t> hp(B, n - 1);
        CK(cudaMemcpy(pos, hp.data(), (size_t)B * 4, cudaMemcpyHostToDevice));
        a.max_keys = n <= 128 ? 128 : 256;
        int tsm;
        const int tp = ds_max_tasks(a, a.max_keys, gm, &tsm);
        for (const build &bd : builds) {
            if ((bd.nw == 8) != (tsm <= 8)) continue; /* the served rule's block size for this bound */
            int64_t per_max, used_max;
            dec_splits(a.max_keys, a.nsplit, a.minper, per_max, used_max);
            const int tkb = gm.SKB < gm.PKB ? gm.SKB : gm.PKB;
            if ((bd.fl & 4) && !ds_task_fits(per_max, tkb, G, hd, R)) continue;
            const size_t smem = (bd.fl & 4) ? ds_smem_task(G, hd, bd.nw, tkb, R) : ds_smem(G, hd, tp, R, 0);
            int per_sm = 0;
            const void *kf = bd.kern ? (const void *)bd.kern : (const void *)bd.kern1;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kf, bd.nw * 32, smem));
            auto launch = [&](int l) {
                a.kvp = (void *const *)tabs[l];
                if (bd.kern) bd.kern<<<dim3(nkv, B), bd.nw * 32, smem>>>(a, bd.fl);
                else bd.kern1<<<dim3(nkv, B), bd.nw * 32, smem>>>(a);
            };
            for (int l = 0; l < L; l++) launch(l);
            CK(cudaDeviceSynchronize());
            const int reps = 10;
            CK(cudaEventRecord(e0));
            for (int r = 0; r < reps; r++)
                for (int l = 0; l < L; l++) launch(l);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            std::vector<std::vector<double>> ph(11);
            std::vector<double> ssp, esp, life;
            const int rows[] = {0, B / 3, (2 * B) / 3, B - 1};
            for (int r = 0; r < 8; r++)
                for (int row : rows) {
                    CK(cudaMemcpyToSymbol(pt_ds_trace_row, &row, sizeof row));
                    static long long zero[PT_DS_TRACE_BLOCKS][16];
                    CK(cudaMemcpyToSymbol(pt_ds_trace, zero, sizeof zero)); /* a phase a build does not mark: 0 */
                    for (int l = 0; l < L; l++) launch(l); /* the last launch's record is read */
                    CK(cudaDeviceSynchronize());
                    long long t[PT_DS_TRACE_BLOCKS][16];
                    CK(cudaMemcpyFromSymbol(t, pt_ds_trace, sizeof t));
                    long long smin = t[0][14], smax = t[0][14], emin = t[0][15], emax = t[0][15];
                    for (int bk = 0; bk < nkv && bk < PT_DS_TRACE_BLOCKS; bk++) {
                        for (int i = 1; i <= 9; i++)
                            if (t[bk][i]) ph[i].push_back((double)(t[bk][i] - t[bk][0]));
                        ph[10].push_back((double)(t[bk][0] - t[bk][10]));
                        life.push_back((double)(t[bk][15] - t[bk][14]));
                        smin = std::min(smin, t[bk][14]), smax = std::max(smax, t[bk][14]);
                        emin = std::min(emin, t[bk][15]), emax = std::max(emax, t[bk][15]);
                    }
                    ssp.push_back((double)(smax - smin)), esp.push_back((double)(emax - emin));
                }
            launch(L - 1);
            std::vector<unsigned char> o((size_t)B * nh * hd * 4);
            CK(cudaMemcpy(o.data(), out, o.size(), cudaMemcpyDeviceToHost));
            uint64_t hsh = 1469598103934665603ull;
            for (unsigned char c : o) hsh = (hsh ^ c) * 1099511628211ull;
            int e[2];
            CK(cudaMemcpy(e, err, 8, cudaMemcpyDeviceToHost));
            if (e[0]) printf("error flag %d (%d)\n", e[0], e[1]);
            printf("%-16s %5d %5d %8.2f |", bd.name, n, per_sm, 1000.0 * ms / (reps * L));
            for (int i : shown) ph[i].empty() ? printf(" %7s", "-") : printf(" %7.0f", median(ph[i]));
            printf(" | %6.0f %5.0fns %5.0fns %5.0fns  %016llx\n", median(ph[10]), median(ssp), median(esp), median(life),
                   (unsigned long long)hsh);
        }
    }
    printf("(ph: median over the traced blocks; pre: entry to the end of the wait, cycles; startsp, endsp: the "
           "spread of one row's blocks' wait ends and ends on the global timer; life: a block's wait end to its end)\n");
    return 0;
}
