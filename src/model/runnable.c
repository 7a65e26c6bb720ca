/* Which families petrel's engine can run today: the one table `petrel
 * inspect` (exit 2 = valid but not runnable) and model loading consult.
 * Add a family here when its forward pass lands. */
#include "model/spec.h"

static const pt_arch runnable[] = {
    PT_ARCH_LLAMA, PT_ARCH_QWEN2, PT_ARCH_QWEN3, PT_ARCH_QWEN3_MOE, PT_ARCH_MINICPM,
    PT_ARCH_GEMMA2, PT_ARCH_GEMMA3, /* parity: tests/test_parity.c, tests/test_kv_rotating.c */
    PT_ARCH_GEMMA4,                 /* parity: tests/test_parity_gemma.c */
    PT_ARCH_QWEN3_5,                /* parity: tests/test_parity_qwen35.c */
};

int pt_arch_runnable(pt_arch a) {
    for (unsigned i = 0; i < sizeof runnable / sizeof runnable[0]; i++)
        if (runnable[i] == a) return 1;
    return 0;
}

int pt_spec_runnable(const pt_model_spec *s) { return pt_arch_runnable(s->arch); }
