/* libFuzzer target for the safetensors reader: the input is a whole file
 * image. Parsing must end in a tensor set or a clean error; on success every
 * tensor's bytes must lie inside the input (ASan checks the first and last
 * byte of each) and every name must be found again by lookup. */
#include "format/mlx_quant.h"
#include "format/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_tensor_set set;
    if (pt_st_open_memory(data, size, "fuzz.safetensors", &set) != PT_OK) return 0;
    volatile unsigned char sink = 0;
    for (int i = 0; i < set.n_tensors; i++) {
        const pt_tensor *t = &set.tensors[i];
        if (pt_st_find(&set, t->name) != t) abort();
        if (t->nbytes) {
            const unsigned char *p = t->data;
            if (p < data || p + t->nbytes > data + size) abort();
            sink ^= p[0] ^ p[t->nbytes - 1];
        }
        /* a 2-D U32 tensor read as packed 4-bit codes touches every word */
        if (t->dtype == PT_DTYPE_U32 && t->ndim == 2 && t->shape[1] > 0 && t->nbytes)
            sink ^= (unsigned char)pt_mlx_code(t->data, t->shape[1] * 8 - 1, 4);
    }
    for (int i = 0; i < set.n_meta; i++)
        if (pt_st_meta_get(&set, set.meta[i].key) == NULL) abort();
    (void)sink;
    pt_st_close(&set);
    return 0;
}
