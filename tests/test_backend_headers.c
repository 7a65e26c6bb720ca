/* The op table's header must compile together with the model spec and the
 * format headers (a family file includes all of them): this test fails to
 * build if a name collides. It also checks the dtype helpers. */
#include "test.h"

#include "backend/backend.h"
#include "format/mlx_quant.h"
#include "format/safetensors.h"
#include "model/spec.h"

static void test_headers_and_ftype(void) {
    CHECK(pt_ftype_size(PT_FT_F32) == 4 && pt_ftype_size(PT_FT_BF16) == 2 && pt_ftype_size(PT_FT_F16) == 2, "sizes");
    CHECK(strcmp(pt_ftype_name(PT_FT_BF16), "bf16") == 0, "name");
    pt_matrix m = {0};
    pt_weight w = {0};
    CHECK(m.bits == 0 && w.bits == 0, "both weight descriptors usable side by side");
}

int main(void) {
    TEST_RUN(test_headers_and_ftype);
    return test_summary();
}
