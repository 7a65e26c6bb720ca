/* GPU sampling in a build without CUDA (sample.h): the entry points exist
 * and answer PT_ERR_UNSUPPORTED, so the runtime needs no #ifdefs. The
 * sampler itself is sample.cu; this file is empty in a CUDA build. */
#include "backend/cuda/sample.h"

#include "base/error.h"

#ifndef PT_HAVE_CUDA
size_t pt_gsample_ctl_bytes(int B) {
    /* the CUDA build's layout (sample.cu) is never used without CUDA; any
     * size works, this one matches its order of magnitude */
    return (size_t)(B > 0 ? B : 0) * (sizeof(pt_gsample_row) + sizeof(pt_gsample_out) + 24576) + 512;
}

pt_status pt_cuda_sample_rows(pt_backend *be, const pt_gsample_row *rows, int B, int64_t V, void *ctl_dev,
                              int rows_current, pt_gsample_out *out) {
    (void)rows_current;
    (void)be;
    (void)rows;
    (void)B;
    (void)V;
    (void)ctl_dev;
    (void)out;
    return pt_error(PT_ERR_UNSUPPORTED, "GPU sampling: this petrel was built without CUDA");
}

pt_status pt_gsample_pipe_create(pt_backend *be, pt_gsample_pipe **out) {
    (void)be;
    *out = NULL;
    return pt_error(PT_ERR_UNSUPPORTED, "pipelined decode: this petrel was built without CUDA");
}

void pt_gsample_pipe_free(pt_backend *be, pt_gsample_pipe **p) {
    (void)be;
    if (p) *p = NULL;
}

pt_status pt_cuda_sample_enqueue(pt_backend *be, pt_gsample_pipe *p, const pt_gsample_row *row, int64_t V,
                                 void *ctl_dev, int row_current, int32_t *pos_dev, int32_t pos) {
    (void)be, (void)p, (void)row, (void)V, (void)ctl_dev, (void)row_current, (void)pos_dev, (void)pos;
    return pt_error(PT_ERR_UNSUPPORTED, "pipelined decode: this petrel was built without CUDA");
}

size_t pt_gsample_step_bytes(void) { return pt_gsample_ctl_bytes(1) + 2 * sizeof(pt_gsample_step_out); }

pt_status pt_cuda_sample_greedy_launch(pt_backend *be, void *ctl_dev, int64_t V, int32_t *pos_next) {
    (void)be, (void)ctl_dev, (void)V, (void)pos_next;
    return pt_error(PT_ERR_UNSUPPORTED, "GPU sampling: this petrel was built without CUDA");
}

pt_status pt_cuda_sample_sampled_enqueue(pt_backend *be, pt_gsample_pipe *p, void *ctl_dev, int32_t pos) {
    (void)be, (void)p, (void)ctl_dev, (void)pos;
    return pt_error(PT_ERR_UNSUPPORTED, "pipelined decode: this petrel was built without CUDA");
}

pt_status pt_cuda_sample_wait(pt_backend *be, pt_gsample_pipe *p, pt_gsample_out *out) {
    (void)be, (void)p, (void)out;
    return pt_error(PT_ERR_UNSUPPORTED, "pipelined decode: this petrel was built without CUDA");
}

pt_status pt_cuda_sample_rows_enqueue(pt_backend *be, pt_gsample_pipe *p, const pt_gsample_row *rows, int B,
                                      int64_t V, void *ctl_dev) {
    (void)be, (void)p, (void)rows, (void)B, (void)V, (void)ctl_dev;
    return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: this petrel was built without CUDA");
}

pt_status pt_cuda_sample_rows_wait(pt_backend *be, pt_gsample_pipe *p, pt_gsample_out *out) {
    (void)be, (void)p, (void)out;
    return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: this petrel was built without CUDA");
}
#else
typedef int pt_sample_stub_unused; /* ISO C forbids an empty translation unit */
#endif
