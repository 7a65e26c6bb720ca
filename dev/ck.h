/* CK(x): the dev tools' check of a CUDA runtime call — on an error, the call,
 * the error's text and the line, then exit(1). */
#ifndef PT_DEV_CK_H
#define PT_DEV_CK_H

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        cudaError_t e_ = (x);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);                          \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

#endif
