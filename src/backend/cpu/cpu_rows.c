/* The multi-sequence decode ops of backend.h (kv_append_rows,
 * attention_rows) on the CPU: row b runs the T = 1 kv_append / attention on
 * a cache descriptor made from the shape and the row's storage pointers
 * (kvp[2b], kvp[2b + 1]; CPU backend memory is host memory, so the pointer
 * table is read directly). Same calls as decoding each sequence alone, so
 * the results are bit-identical by construction. This lets the CPU run the
 * same batched step as the GPU (runtime/batch.c), whose CUDA version
 * (backend/cuda/batch_decode.cu) is one launch for all rows. Not a faster
 * kernel: there is nothing to share between rows on the CPU. */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <string.h>

static pt_status check_shape(const pt_kv_layer *shape, const char *op) {
    if (shape->bits)
        return pt_error(PT_ERR_UNSUPPORTED, "%s: quantized KV caches take the per-sequence ops", op);
    return PT_OK;
}

pt_status pt_cpu_kv_append_rows(pt_backend *be, const pt_kv_layer *shape, void *const *kvp, const float *k,
                                const float *v, int64_t B, const int32_t *pos) {
    PT_TRY(check_shape(shape, "kv_append_rows"));
    const size_t kd = (size_t)shape->n_kv * (size_t)shape->head_dim;
    for (int64_t b = 0; b < B; b++) {
        if (pos[b] < 0) continue; /* padding row */
        pt_kv_layer kv = *shape;
        kv.k = kvp[2 * b];
        kv.v = kvp[2 * b + 1];
        PT_TRY(pt_cpu_kv_append(be, &kv, k + (size_t)b * kd, v + (size_t)b * kd, 1, pos + b));
    }
    return PT_OK;
}

pt_status pt_cpu_attention_rows(pt_backend *be, float *out, const float *q, int64_t B, const int32_t *pos,
                                const pt_kv_layer *shape, void *const *kvp, const pt_attn *p) {
    PT_TRY(check_shape(shape, "attention_rows"));
    const size_t qd = (size_t)p->n_heads * (size_t)p->head_dim;
    for (int64_t b = 0; b < B; b++) {
        if (pos[b] < 0) { /* padding row */
            memset(out + (size_t)b * qd, 0, qd * sizeof(float));
            continue;
        }
        pt_kv_layer kv = *shape;
        kv.k = kvp[2 * b];
        kv.v = kvp[2 * b + 1];
        PT_TRY(pt_cpu_attention(be, out + (size_t)b * qd, q + (size_t)b * qd, 1, pos + b, &kv, p));
    }
    return PT_OK;
}
