/* The 8-bit instantiations of the fused decode attention block kernel
 * (kv_fused.cuh), in a file of their own so the two widths compile in
 * parallel. */
#include "backend/cuda/kv_fused.cuh"

pt_status pt_cuda_fused_block8(pt_fd_args &a, dim3 grid, cudaStream_t st, int gs, int hd, int G, int *occ) {
    PT_FD_DISPATCH(8)
}
