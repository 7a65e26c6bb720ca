/* The C side's view of the CUDA backend: device discovery and backend
 * selection. Everything declared here exists in every build; in a build
 * without CUDA (no `make CUDA=1`) the probes answer "no CUDA" and asking for
 * the CUDA device is an error that says how to build it. This header is not
 * the op table (src/backend/backend.h) and declares no kernels. */
#ifndef PT_BACKEND_CUDA_H
#define PT_BACKEND_CUDA_H

#include "petrel.h"
#include "backend/backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What one GPU reports. Sizes in bytes. */
typedef struct pt_cuda_device_info {
    int index;
    char name[256];
    int cc_major, cc_minor;      /* compute capability (9.0 for H100/H200) */
    int sm_count;                /* streaming multiprocessors */
    size_t total_mem, free_mem;  /* device memory */
    size_t l2_bytes;
    size_t smem_optin_per_block; /* max dynamic shared memory a block may opt in to */
    int driver_version;          /* e.g. 13000 */
    int runtime_version;
    int kernel_ok;               /* 1: a kernel of this build ran on the device and gave the right answer */
} pt_cuda_device_info;

/* 1 when this binary was built with the CUDA backend (make CUDA=1). */
int pt_cuda_built(void);

/* Number of usable CUDA devices. Never fails: a machine with no GPU, no
 * driver, or a build without CUDA answers 0 and, when why != NULL, writes the
 * reason (the CUDA call and its error code) into why[0..n). */
int pt_cuda_device_count(char *why, size_t n);

/* Fills *info for device `index`, and launches a small kernel of this build to
 * prove the binary's machine code (sm_90a) runs on it. PT_ERR_DEVICE naming
 * the failing CUDA call and its code; PT_ERR_UNSUPPORTED in a build without
 * CUDA. */
pt_status pt_cuda_device_query(int index, pt_cuda_device_info *info);

/* Measures the device's read bandwidth (GB/s, best of 5 passes over `bytes`
 * of device memory with 16-byte loads): the roofline the benchmarks report
 * fractions of. PT_ERR_DEVICE naming the failing call. */
pt_status pt_cuda_read_bandwidth(size_t bytes, double *gbs);

/* Measures the device's bf16 tensor-core rate (TFLOP/s): a cuBLAS bf16 GEMM
 * of n × n × n (f32 accumulation) on pseudo-random values, median of 5 runs
 * after a warm-up (matmul.cu); the roofline `petrel bench` reports prefill's
 * fraction of. PT_ERR_DEVICE naming the failing call. */
pt_status pt_cuda_matmul_rate(int n, double *tflops);

/* One line describing the device ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB"). */
void pt_cuda_device_describe(const pt_cuda_device_info *info, char *buf, size_t n);

/* Backend selection for --device. `requested` AUTO resolves to CUDA when this
 * build has CUDA and a device whose compute capability this build's code runs
 * on (9.0) is present, else to the CPU. CPU always resolves to CPU. CUDA
 * resolves to CUDA or fails: PT_ERR_UNSUPPORTED when built without CUDA,
 * PT_ERR_DEVICE when no suitable device is present (the message says why).
 * When desc != NULL a one-line description of the chosen backend is written
 * ("cuda: NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" / "cpu (no CUDA device: ...)"). */
pt_status pt_device_resolve(pt_device requested, pt_device *resolved, char *desc, size_t n);

/* Parses "cuda" | "cpu" | "auto" (the --device values). PT_ERR_INVALID_ARG
 * naming the value otherwise. */
pt_status pt_device_parse(const char *s, pt_device *out);

const char *pt_device_name(pt_device d);

/* ---- The CUDA backend (the op table of backend.h on a GPU) ---------------- */

typedef struct pt_cuda_params {
    int device;        /* CUDA device index (0 = the first visible one) */
    pt_act_dtype act;  /* activation rounding, as for the CPU backend */
} pt_cuda_params;

/* Creates the CUDA backend on params->device (NULL: device 0, bf16). Weights
 * prepared on it are copied to device memory once, in their MLX packed layout
 * (dense weights as they are). PT_ERR_UNSUPPORTED in a build without CUDA;
 * PT_ERR_DEVICE naming the CUDA call and code when the device is unusable. */
pt_status pt_backend_cuda_create(pt_backend **out, const pt_cuda_params *params);

/* ---- Compiled decode: CUDA graphs ------------------------------------------
 * The ops enqueued on a CUDA backend between pt_cuda_graph_begin and
 * pt_cuda_graph_end are captured (not run) into a graph; pt_cuda_graph_launch
 * replays it. Every op reads its per-token values (token ids, positions) from
 * backend memory, so one capture serves every decode step: upload the new
 * ids/positions (outside the capture), launch, download the result. Replay
 * is bit-identical to running the same ops eagerly (a test holds it).
 * Rules while capturing: no upload/download/sync/alloc/prepare_weight (they
 * synchronize; the error names the call), and the shapes and buffers must be
 * those of every later replay. PT_ERR_UNSUPPORTED on a non-CUDA backend or in
 * a build without CUDA. */
typedef struct pt_cuda_graph pt_cuda_graph;
pt_status pt_cuda_graph_begin(pt_backend *be);
pt_status pt_cuda_graph_end(pt_backend *be, pt_cuda_graph **out);
pt_status pt_cuda_graph_launch(pt_backend *be, pt_cuda_graph *g);
void pt_cuda_graph_free(pt_cuda_graph **g);
/* A counter that changes whenever the backend's scratch buffers or limits
 * change (reserve): a graph captured before bakes in the old buffers and
 * must be captured again. 0 for other backends and builds without CUDA. */
uint64_t pt_cuda_scratch_gen(pt_backend *be);

#ifdef __cplusplus
}
#endif

#endif
