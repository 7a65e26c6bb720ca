/* Backend selection for --device (cuda|cpu|auto), compiled in every build.
 * In a build without CUDA the device probes answer "none" here, so callers
 * never need #ifdefs. Not the op table: this only decides which one runs. */
#include "backend/cuda/cuda.h"

#include "base/error.h"

#include <stdio.h>
#include <string.h>

#ifdef PT_HAVE_CUDA
int pt_cuda_built(void) { return 1; }
#else
int pt_cuda_built(void) { return 0; }

int pt_cuda_device_count(char *why, size_t n) {
    if (why && n) snprintf(why, n, "this petrel was built without CUDA (build with make CUDA=1)");
    return 0;
}

pt_status pt_cuda_device_query(int index, pt_cuda_device_info *info) {
    memset(info, 0, sizeof *info);
    info->index = index;
    return pt_error(PT_ERR_UNSUPPORTED, "this petrel was built without CUDA (build with make CUDA=1)");
}

pt_status pt_cuda_read_bandwidth(size_t bytes, double *gbs) {
    (void)bytes;
    *gbs = 0;
    return pt_error(PT_ERR_UNSUPPORTED, "this petrel was built without CUDA (build with make CUDA=1)");
}

pt_status pt_cuda_matmul_rate(int n, double *tflops) {
    (void)n;
    *tflops = 0;
    return pt_error(PT_ERR_UNSUPPORTED, "this petrel was built without CUDA (build with make CUDA=1)");
}

pt_status pt_backend_cuda_create(pt_backend **out, const pt_cuda_params *params) {
    (void)params;
    *out = NULL;
    return pt_error(PT_ERR_UNSUPPORTED, "the CUDA backend: this petrel was built without CUDA (build with make CUDA=1)");
}

pt_status pt_cuda_graph_begin(pt_backend *be) {
    (void)be;
    return pt_error(PT_ERR_UNSUPPORTED, "CUDA graphs: this petrel was built without CUDA");
}
pt_status pt_cuda_graph_end(pt_backend *be, pt_cuda_graph **out) {
    (void)be;
    *out = NULL;
    return pt_error(PT_ERR_UNSUPPORTED, "CUDA graphs: this petrel was built without CUDA");
}
pt_status pt_cuda_graph_launch(pt_backend *be, pt_cuda_graph *g) {
    (void)be;
    (void)g;
    return pt_error(PT_ERR_UNSUPPORTED, "CUDA graphs: this petrel was built without CUDA");
}
void pt_cuda_graph_free(pt_cuda_graph **g) {
    if (g) *g = NULL;
}
uint64_t pt_cuda_scratch_gen(pt_backend *be) {
    (void)be;
    return 0;
}
#endif

void pt_cuda_device_describe(const pt_cuda_device_info *info, char *buf, size_t n) {
    snprintf(buf, n, "%s, sm_%d%d, %d SMs, %.1f GiB", info->name, info->cc_major, info->cc_minor,
             info->sm_count, (double)info->total_mem / (1024.0 * 1024.0 * 1024.0));
}

const char *pt_device_name(pt_device d) {
    switch (d) {
    case PT_DEVICE_AUTO: return "auto";
    case PT_DEVICE_CPU: return "cpu";
    case PT_DEVICE_CUDA: return "cuda";
    }
    return "?";
}

pt_status pt_device_parse(const char *s, pt_device *out) {
    if (s && !strcmp(s, "auto")) *out = PT_DEVICE_AUTO;
    else if (s && !strcmp(s, "cpu")) *out = PT_DEVICE_CPU;
    else if (s && !strcmp(s, "cuda")) *out = PT_DEVICE_CUDA;
    else return pt_error(PT_ERR_INVALID_ARG, "--device: expected cuda, cpu or auto, found '%s'", s ? s : "(none)");
    return PT_OK;
}

/* Device 0 is the one petrel uses; CUDA_VISIBLE_DEVICES picks it. */
pt_status pt_device_resolve(pt_device requested, pt_device *resolved, char *desc, size_t n) {
    char why[512] = "";
    if (desc && n) desc[0] = 0;
    if (requested == PT_DEVICE_CPU) {
        *resolved = PT_DEVICE_CPU;
        if (desc && n) snprintf(desc, n, "cpu");
        return PT_OK;
    }
    if (requested != PT_DEVICE_AUTO && requested != PT_DEVICE_CUDA)
        return pt_error(PT_ERR_INVALID_ARG, "device: unknown value %d", (int)requested);
    int count = pt_cuda_device_count(why, sizeof why);
    pt_cuda_device_info info;
    if (count > 0) {
        pt_status st = pt_cuda_device_query(0, &info);
        if (st == PT_OK) {
            *resolved = PT_DEVICE_CUDA;
            if (desc && n) {
                char d[400];
                pt_cuda_device_describe(&info, d, sizeof d);
                snprintf(desc, n, "cuda: %s", d);
            }
            return PT_OK;
        }
        snprintf(why, sizeof why, "%s", pt_last_error());
    }
    if (requested == PT_DEVICE_CUDA)
        return pt_error(pt_cuda_built() ? PT_ERR_DEVICE : PT_ERR_UNSUPPORTED,
                        "--device cuda: no usable CUDA device: %s", why);
    *resolved = PT_DEVICE_CPU;
    if (desc && n) {
        if (pt_cuda_built()) snprintf(desc, n, "cpu (no CUDA device: %s)", why);
        else snprintf(desc, n, "cpu");
    }
    return PT_OK;
}
