/* dev/trace_cupti.c — a kernel timeline of any CUDA process, graphs included:
 * a CUPTI injection library (the driver loads it when CUDA_INJECTION64_PATH
 * names it) that records every kernel's start and end on the GPU's clock
 * (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels that overlap, as with
 * programmatic dependent launch, keep their own times; graph nodes carry
 * their graph and the correlation id of the graph's launch) and writes them
 * at exit as tab-separated lines to $PETREL_TRACE_OUT (default
 * cuda_trace.tsv):
 *
 *   start_ns end_ns graph_id correlation_id grid_x grid_y block_x regs dyn_smem name
 *
 * Copies and memsets (CUPTI_ACTIVITY_KIND_MEMCPY, _MEMSET) are lines of the
 * same form named "[memcpy HtoD]", "[memcpy DtoD]", "[memset]", …, their byte
 * count in the grid_x column (dev/trace_cupti.py --gaps lists what runs
 * between two replays of a graph).
 *
 * Names demangled. dev/trace_cupti.py summarizes a file per decode step.
 *
 * Build (dev/build_cuda.sh does it):
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include -o trace_cupti.so dev/trace_cupti.c \
 *      -L/usr/local/cuda/targets/x86_64-linux/lib -lcupti -lstdc++
 * Run:
 *   CUDA_INJECTION64_PATH=$PWD/trace_cupti.so PETREL_TRACE_OUT=t.tsv petrel bench --device cuda ...
 */
#include <cupti.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status); /* libstdc++ */

typedef struct {
    uint64_t start, end, node;
    uint32_t graph, corr;
    int32_t gx, gy, bx, smem;
    uint16_t regs;
    int name; /* index into names */
} rec;

static rec *recs;
static size_t nrec, caprec;
static char **names;
static const char **raw; /* the CUPTI name pointer each entry of names came from */
static int nnames, capnames;

static int name_of(const char *mangled) {
    for (int i = nnames - 1; i >= 0; i--)
        if (raw[i] == mangled) return i;
    if (nnames == capnames) {
        capnames = capnames ? 2 * capnames : 256;
        names = realloc(names, (size_t)capnames * sizeof *names);
        raw = realloc(raw, (size_t)capnames * sizeof *raw);
        if (!names || !raw) abort();
    }
    int st = -1;
    char *d = mangled ? __cxa_demangle(mangled, NULL, NULL, &st) : NULL;
    names[nnames] = st == 0 && d ? d : strdup(mangled ? mangled : "?");
    raw[nnames] = mangled;
    return nnames++;
}

#define BUF_BYTES (8u << 20)

static void CUPTIAPI buf_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL &&
            r->kind != CUPTI_ACTIVITY_KIND_MEMCPY && r->kind != CUPTI_ACTIVITY_KIND_MEMSET)
            continue;
        if (nrec == caprec) {
            caprec = caprec ? 2 * caprec : 65536;
            recs = realloc(recs, caprec * sizeof *recs);
            if (!recs) abort();
        }
        if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            static const char *const kinds[] = {"[memcpy ?]",    "[memcpy HtoD]", "[memcpy DtoH]", "[memcpy HtoA]",
                                                "[memcpy AtoH]", "[memcpy AtoA]", "[memcpy AtoD]", "[memcpy DtoA]",
                                                "[memcpy DtoD]", "[memcpy HtoH]", "[memcpy PtoP]"};
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            const int kd = m->copyKind < 11 ? m->copyKind : 0;
            recs[nrec++] = (rec){m->start, m->end, m->graphNodeId, m->graphId, m->correlationId,
                                 (int32_t)m->bytes, 0, 0, 0, 0, name_of(kinds[kd])};
            continue;
        }
        if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            recs[nrec++] = (rec){m->start, m->end, m->graphNodeId, m->graphId, m->correlationId,
                                 (int32_t)m->bytes, 0, 0, 0, 0, name_of("[memset]")};
            continue;
        }
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        recs[nrec++] = (rec){k->start, k->end, k->graphNodeId, k->graphId, k->correlationId,
                             k->gridX, k->gridY, k->blockX, k->dynamicSharedMemory, k->registersPerThread,
                             name_of(k->name)};
    }
    free(buffer);
}

static void write_out(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const char *path = getenv("PETREL_TRACE_OUT");
    FILE *f = fopen(path && *path ? path : "cuda_trace.tsv", "w");
    if (!f) {
        perror("cuda_trace: output");
        return;
    }
    for (size_t i = 0; i < nrec; i++) {
        const rec *r = &recs[i];
        fprintf(f, "%llu\t%llu\t%u\t%u\t%d\t%d\t%d\t%u\t%d\t%s\n", (unsigned long long)r->start,
                (unsigned long long)r->end, r->graph, r->corr, r->gx, r->gy, r->bx, (unsigned)r->regs, r->smem,
                names[r->name]);
    }
    fclose(f);
    fprintf(stderr, "cuda_trace: %zu kernels written\n", nrec);
}

int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, "cuda_trace: CUPTI activity tracing not available\n");
        return 0;
    }
    atexit(write_out);
    return 1;
}
