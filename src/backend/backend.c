/* Backend-independent helpers of the op table (see backend.h): dtype names
 * and sizes, matmul_multi with its fallback to separate matmuls, and freeing
 * any backend through its table. No kernels here. */
#include "backend/backend.h"

#include "base/error.h"

const char *pt_ftype_name(pt_ftype t) {
    switch (t) {
    case PT_FT_F32: return "f32";
    case PT_FT_BF16: return "bf16";
    case PT_FT_F16: return "f16";
    }
    return "?";
}

size_t pt_ftype_size(pt_ftype t) { return t == PT_FT_F32 ? 4 : 2; }

void pt_backend_free(pt_backend **be) {
    if (!be || !*be) return;
    (*be)->ops->free(*be);
    *be = NULL;
}

pt_status pt_backend_matmul_multi(pt_backend *be, int n, float *const *y, const float *x, int64_t T,
                                  const pt_matrix *const *w, int rows) {
    const pt_backend_ops *o = be->ops;
    if (n < 1 || n > 4) return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: %d weights (1..4)", n);
    for (int i = 1; i < n; i++)
        if (w[i]->cols != w[0]->cols)
            return pt_error(PT_ERR_INVALID_ARG, "matmul_multi: weight %d has K %lld, weight 0 has %lld", i,
                            (long long)w[i]->cols, (long long)w[0]->cols);
    if (o->matmul_multi && (!rows || o->matmul_rows)) return o->matmul_multi(be, n, y, x, T, w, rows);
    for (int i = 0; i < n; i++) PT_TRY(pt_backend_matmul_as(be, y[i], x, T, w[i], rows));
    return PT_OK;
}

pt_status pt_backend_matmul_as(pt_backend *be, float *y, const float *x, int64_t T, const pt_matrix *w, int rows) {
    const pt_backend_ops *o = be->ops;
    if (!rows) return o->matmul(be, y, x, T, w, 0);
    if (o->matmul_rows) return o->matmul_rows(be, y, x, T, w, 0);
    for (int64_t t = 0; t < T; t++) PT_TRY(o->matmul(be, y + t * w->rows, x + t * w->cols, 1, w, 0));
    return PT_OK;
}
