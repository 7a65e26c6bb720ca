/* libFuzzer target for model loading past the parsers: the input is a
 * config.json and a safetensors image (u32 little-endian length of the JSON,
 * the JSON, then the file image). When both parse, the model spec is built:
 * binding must end in a spec or a clean error, and every bound weight's bytes
 * (and scales/biases) must lie inside the image. */
#include "format/safetensors.h"
#include "model/config.h"
#include "model/spec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *lo, *hi;
} bounds;

static void in_bounds(const void *p, int64_t n, const bounds *b) {
    const uint8_t *q = p;
    if (n > 0 && (q < b->lo || q + n > b->hi)) abort();
}

static void visit(void *ctx, const pt_weight *w, int layer) {
    const bounds *b = ctx;
    (void)layer;
    int64_t n = pt_weight_numel(w);
    if (!w->bits) {
        in_bounds(w->data, n * (int64_t)pt_dtype_size(w->dtype), b);
        return;
    }
    in_bounds(w->data, n * w->bits / 8, b);
    in_bounds(w->scales, n / w->group_size * (int64_t)pt_dtype_size(w->qdtype), b);
    in_bounds(w->biases, n / w->group_size * (int64_t)pt_dtype_size(w->qdtype), b);
    if (w->ndim == 2 && w->shape[1] <= 4096) { /* read the last row through the public helper */
        float row[4096];
        pt_weight_row_f32(w, w->shape[0] - 1, row);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4 || size > (1 << 21)) return 0;
    uint32_t cl = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    if (cl > size - 4) return 0;
    pt_config cfg;
    if (pt_config_parse((const char *)data + 4, cl, "config.json", &cfg) != PT_OK) return 0;
    /* keep allocations proportional to the input */
    if (cfg.n_layers > 64 || cfg.n_experts > 256) {
        pt_config_free(&cfg);
        return 0;
    }
    pt_tensor_set ts;
    const uint8_t *img = data + 4 + cl;
    size_t n = size - 4 - cl;
    if (pt_st_open_memory(img, n, "model.safetensors", &ts) == PT_OK) {
        pt_model_spec s;
        if (pt_spec_build(&cfg, &ts, NULL, &s) == PT_OK) {
            bounds b = {img, img + n};
            pt_spec_for_each_weight(&s, visit, &b);
            (void)pt_spec_kv_bytes_per_token(&s, 4, 64);
            pt_spec_free(&s);
        }
        pt_st_close(&ts);
    }
    pt_config_free(&cfg);
    return 0;
}
