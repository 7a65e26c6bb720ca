/* Backend-independent helpers of the op table (see backend.h): dtype names
 * and sizes, and freeing any backend through its table. No kernels here. */
#include "backend/backend.h"

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
