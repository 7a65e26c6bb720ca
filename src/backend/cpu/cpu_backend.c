/* The CPU backend: creation (thread pool, ISA choice), memory, scratch,
 * weight validation, and the op table wiring. The ops themselves live in
 * cpu_matmul.c, cpu_attention.c and cpu_ops.c; the SIMD leaf kernels in
 * kernels_{scalar,avx2,avx512}.c.
 *
 * ISA choice: the best of AVX-512 (F, BW, VL, DQ), AVX2 (+FMA, F16C) and
 * scalar that the CPU supports, unless PETREL_CPU_ISA or the params ask for
 * another one; asking for an ISA the CPU lacks is an error, not a crash. */
#include "backend/cpu/cpu_internal.h"

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static const char *isa_name(pt_cpu_isa isa) {
    switch (isa) {
    case PT_ISA_SCALAR: return "scalar";
    case PT_ISA_AVX2: return "avx2";
    case PT_ISA_AVX512: return "avx512";
    default: return "auto";
    }
}

static pt_status pick_isa(pt_cpu_isa want, pt_cpu_isa *out) {
    if (want == PT_ISA_AUTO) {
        const char *env = getenv("PETREL_CPU_ISA");
        if (env && *env) {
            if (!strcmp(env, "scalar")) want = PT_ISA_SCALAR;
            else if (!strcmp(env, "avx2")) want = PT_ISA_AVX2;
            else if (!strcmp(env, "avx512")) want = PT_ISA_AVX512;
            else if (strcmp(env, "auto") != 0)
                return pt_error(PT_ERR_INVALID_ARG, "PETREL_CPU_ISA: expected scalar, avx2, avx512 or auto, found '%s'",
                                env);
        }
    }
    if (want == PT_ISA_AUTO) {
        *out = cpu_has_avx512() ? PT_ISA_AVX512 : cpu_has_avx2() ? PT_ISA_AVX2 : PT_ISA_SCALAR;
        return PT_OK;
    }
    if ((want == PT_ISA_AVX512 && !cpu_has_avx512()) || (want == PT_ISA_AVX2 && !cpu_has_avx2()))
        return pt_error(PT_ERR_UNSUPPORTED, "CPU ISA %s requested but this CPU does not support it", isa_name(want));
    *out = want;
    return PT_OK;
}

/* ---- memory ---- */

/* Every block has a 64-byte header in front of it saying where it came
 * from. Blocks of PT_CPU_MAP_MIN bytes or more are anonymous mappings: the
 * kernel hands their pages out zeroed on first touch, so a session's
 * chunk-sized forward buffers (most of which a decode step never touches)
 * cost neither a memset nor resident memory when the session is made.
 * Smaller blocks come from the heap and are zeroed here. */
#define PT_CPU_MAP_MIN ((size_t)256 << 10)
#define PT_CPU_BLK_HEAP 0x70656150u /* header magic: heap block */
#define PT_CPU_BLK_MAP 0x70614d50u  /* header magic: mapped block */
typedef struct {
    uint32_t magic;
    uint32_t pad0;
    size_t len; /* a mapped block: the mapping's length, header included */
    uint8_t pad[48];
} cpu_blk;
_Static_assert(sizeof(cpu_blk) == 64, "a block's header keeps it 64-byte aligned");

static void *cpu_alloc(pt_backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n < bytes || n + sizeof(cpu_blk) < n) {
        pt_error(PT_ERR_NOMEM, "allocation of %zu bytes overflows", bytes);
        return NULL;
    }
    if (n == 0) n = 64;
    const size_t len = n + sizeof(cpu_blk);
    cpu_blk *h;
    if (n >= PT_CPU_MAP_MIN) {
        void *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b == MAP_FAILED) {
            pt_error(PT_ERR_NOMEM, "out of memory mapping %zu bytes", bytes);
            return NULL;
        }
        h = b;
        h->magic = PT_CPU_BLK_MAP;
        h->len = len;
    } else {
        h = aligned_alloc(64, len);
        if (!h) {
            pt_error(PT_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
            return NULL;
        }
        memset(h, 0, len);
        h->magic = PT_CPU_BLK_HEAP;
    }
    return h + 1;
}
static void cpu_dealloc(pt_backend *be, void *p) {
    (void)be;
    if (!p) return;
    cpu_blk *h = (cpu_blk *)p - 1;
    PT_ASSERT(h->magic == PT_CPU_BLK_MAP || h->magic == PT_CPU_BLK_HEAP);
    if (h->magic == PT_CPU_BLK_MAP) munmap(h, h->len);
    else free(h);
}
static pt_status cpu_copy(pt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return PT_OK;
}
static pt_status cpu_download(pt_backend *be, void *dst, const void *src, size_t bytes) {
    return cpu_copy(be, dst, src, bytes);
}
static pt_status cpu_sync(pt_backend *be) {
    (void)be;
    return PT_OK;
}

pt_status pt_cpu_need_scratch(pt_cpu *c, size_t per_thread, size_t shared) {
    if (per_thread > c->per_thread) {
        size_t n = per_thread * (size_t)c->nth;
        float *p = aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(size_t)63);
        if (!p) return pt_error(PT_ERR_NOMEM, "out of memory for CPU scratch (%zu floats)", n);
        free(c->scratch);
        c->scratch = p;
        c->per_thread = per_thread;
        PT_LOGD("cpu backend: per-thread scratch grown to %zu floats", per_thread);
    }
    if (shared > c->xbuf_floats) {
        float *p = aligned_alloc(64, ((shared * sizeof(float)) + 63) & ~(size_t)63);
        if (!p) return pt_error(PT_ERR_NOMEM, "out of memory for CPU scratch (%zu floats)", shared);
        free(c->xbuf);
        c->xbuf = p;
        c->xbuf_floats = shared;
        PT_LOGD("cpu backend: shared scratch grown to %zu floats", shared);
    }
    return PT_OK;
}

/* Scratch needs per op, in floats (kept in one place so reserve() and the ops agree). */
static pt_status cpu_reserve(pt_backend *be, const pt_backend_limits *lim) {
    pt_cpu *c = pt_cpu_of(be);
    size_t T = lim->max_tokens > 0 ? (size_t)lim->max_tokens : 1;
    size_t K = lim->max_cols > 0 ? (size_t)lim->max_cols : 0;
    size_t F = lim->max_ffn > 0 ? (size_t)lim->max_ffn : 0;
    size_t H = lim->max_heads > 0 ? (size_t)lim->max_heads : 0;
    size_t D = lim->max_head_dim > 0 ? (size_t)lim->max_head_dim : 0;
    size_t S = lim->max_ctx > 0 ? (size_t)lim->max_ctx : 0;
    /* these mirror the requests in cpu_matmul.c / cpu_attention.c / cpu_ops.c */
    size_t per = ((T + 11) / 12) * 12 * 256 + 256 * 32 + T * 32 + 64 * (K / 32 + 1) + 256; /* mm_gemm */
    if (8 * (K / 32 + 1) + K > per) per = 8 * (K / 32 + 1) + K;
    if (H * (S + D) > per) per = H * (S + D);
    if (D > per) per = D;
    size_t shared = T * (K + 2 * (K / 32) + K / 2 + 1);
    PT_TRY(pt_cpu_need_scratch(c, per, shared));
    if (F > 0) { /* moe_ffn: gate|up [2F], h [F], o [K] */
        size_t moe = 3 * F + K;
        if (moe > c->moe_floats) {
            float *p = aligned_alloc(64, ((moe * sizeof(float)) + 63) & ~(size_t)63);
            if (!p) return pt_error(PT_ERR_NOMEM, "out of memory for MoE scratch");
            free(c->moe);
            c->moe = p;
            c->moe_floats = moe;
        }
    }
    c->lim = *lim;
    return PT_OK;
}

/* ---- weights ---- */

static int ftype_ok(pt_ftype t) { return t == PT_FT_F32 || t == PT_FT_BF16 || t == PT_FT_F16; }

/* Transparent huge pages for weight memory. Decode streams every weight once
 * per token; with 4 KiB pages that is one TLB miss (a two-level page walk
 * under virtualization) per 64 cache lines, and the hardware prefetchers stop
 * at every 4 KiB boundary. Measured on the 2-vCPU workstation VM
 * (dev/bench_hugepage, 600 MiB of 4-bit weights, same process, interleaved):
 * streaming read 12-13.5 -> 15.5-16.4 GB/s, q4 decode matvec 7.9-8.6 -> 9.6-9.7
 * GB/s. Weights mmap'ed from files usually get PMD-mapped large folios from
 * the page cache by themselves (ext4/xfs readahead); anonymous weight memory
 * (converted or synthetic weights) gets 4 KiB pages unless advised, since the
 * system's THP mode is "madvise". The range is rounded out to 2 MiB: the
 * advice only changes page sizes, never contents, so covering a neighbour's
 * bytes is harmless. MADV_COLLAPSE (Linux 6.1+) turns already-populated pages
 * into huge pages now instead of waiting for khugepaged; it fails with EINVAL
 * on file mappings where the kernel cannot collapse them, which is fine.
 * Both calls are advice: errors are ignored. PETREL_CPU_HUGEPAGES=0 turns
 * this off (for A/B measurements). */
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define PT_HUGE_BYTES ((uintptr_t)2 << 20)

static int hugepages_on(void) {
    static _Atomic int on = -1;
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v < 0) {
        v = pt_env_flag("PETREL_CPU_HUGEPAGES", 1);
        atomic_store_explicit(&on, v, memory_order_relaxed);
    }
    return v;
}

static void advise_huge(const void *p, size_t bytes) {
#if defined(MADV_HUGEPAGE)
    if (!p || bytes < PT_HUGE_BYTES / 2) return; /* too small to matter */
    uintptr_t a = (uintptr_t)p & ~(PT_HUGE_BYTES - 1);
    uintptr_t e = ((uintptr_t)p + bytes + PT_HUGE_BYTES - 1) & ~(PT_HUGE_BYTES - 1);
    (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
    (void)madvise((void *)a, e - a, MADV_COLLAPSE);
#else
    (void)p;
    (void)bytes;
#endif
}

static void advise_weight(const pt_matrix *w) {
    if (!hugepages_on()) return;
    size_t E = w->n_experts > 1 ? (size_t)w->n_experts : 1, n = E * (size_t)w->rows;
    if (w->bits == 0) {
        advise_huge(w->data, n * (size_t)w->cols * pt_ftype_size(w->dtype));
        return;
    }
    advise_huge(w->data, n * (size_t)w->cols * (size_t)w->bits / 8);
    size_t pb = n * (size_t)(w->cols / w->group_size) * pt_ftype_size(w->dtype);
    advise_huge(w->scales, pb);
    advise_huge(w->biases, pb);
}

static pt_status cpu_prepare_weight(pt_backend *be, pt_matrix *w, const char *name) {
    (void)be;
    const char *nm = name ? name : "weight";
    if (w->rows <= 0 || w->cols <= 0 || w->n_experts < 0)
        return pt_error(PT_ERR_INVALID_ARG, "%s: invalid shape [%lld experts, %lld rows, %lld cols]", nm,
                        (long long)w->n_experts, (long long)w->rows, (long long)w->cols);
    if (!ftype_ok(w->dtype)) return pt_error(PT_ERR_INVALID_ARG, "%s: invalid dtype %d", nm, (int)w->dtype);
    if (!w->data) return pt_error(PT_ERR_INVALID_ARG, "%s: no data", nm);
    if (w->bias && !ftype_ok(w->bias_dtype))
        return pt_error(PT_ERR_INVALID_ARG, "%s: invalid bias dtype %d", nm, (int)w->bias_dtype);
    if (w->bits == 0) {
        advise_weight(w);
        return PT_OK;
    }
    int b = w->bits;
    if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8)
        return pt_error(PT_ERR_UNSUPPORTED, "%s: quantization bits %d not supported (expected 2, 3, 4, 5, 6 or 8)", nm,
                        b);
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
        return pt_error(PT_ERR_UNSUPPORTED, "%s: quantization group size %d not supported (expected 32, 64 or 128)", nm,
                        w->group_size);
    if (w->cols % w->group_size)
        return pt_error(PT_ERR_INVALID_ARG, "%s: %lld columns are not a multiple of the group size %d", nm,
                        (long long)w->cols, w->group_size);
    if (!w->scales || !w->biases) return pt_error(PT_ERR_INVALID_ARG, "%s: quantized weight without scales/biases", nm);
    advise_weight(w);
    return PT_OK;
}

static void cpu_release_weight(pt_backend *be, pt_matrix *w) {
    (void)be;
    w->backend_data = NULL;
}

/* ---- lifetime ---- */

static void cpu_free(pt_backend *be) {
    pt_cpu *c = pt_cpu_of(be);
    pt_pool_free(&c->pool);
    free(c->scratch);
    free(c->xbuf);
    free(c->moe);
    free(c);
}

static const pt_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .upload = cpu_copy,
    .download = cpu_download,
    .sync = cpu_sync,
    .reserve = cpu_reserve,
    .prepare_weight = cpu_prepare_weight,
    .release_weight = cpu_release_weight,
    .embed = pt_cpu_embed,
    .rms_norm = pt_cpu_rms_norm,
    .matmul = pt_cpu_matmul,
    .rope = pt_cpu_rope,
    .kv_append = pt_cpu_kv_append,
    .kv_quantize = pt_cpu_kv_quantize,
    .attention = pt_cpu_attention,
    .glu = pt_cpu_glu,
    .add = pt_cpu_add,
    .mul = pt_cpu_mul,
    .add_scaled = pt_cpu_add_scaled,
    .scale = pt_cpu_scale,
    .softcap = pt_cpu_softcap,
    .moe_route = pt_cpu_moe_route,
    .moe_ffn = pt_cpu_moe_ffn,
    .argmax = pt_cpu_argmax,
    .conv1d_silu = pt_cpu_conv1d_silu,
    .delta_rule = pt_cpu_delta_rule,
    .rms_norm_gated = pt_cpu_rms_norm_gated,
    .copy_rows = pt_cpu_copy_rows,
    .sigmoid_mul = pt_cpu_sigmoid_mul,
    .matmul_rows = pt_cpu_matmul_rows,
    .kv_append_rows = pt_cpu_kv_append_rows,
    .attention_rows = pt_cpu_attention_rows,
    .matmul_multi = pt_cpu_matmul_multi,
};

pt_status pt_backend_cpu_create(pt_backend **out, const pt_cpu_params *params) {
    *out = NULL;
    pt_cpu_params p = params ? *params : (pt_cpu_params){0};
    if (p.act != PT_ACT_F32 && p.act != PT_ACT_BF16)
        return pt_error(PT_ERR_INVALID_ARG, "activation dtype %d invalid", (int)p.act);
    int nth = p.n_threads > 0 ? p.n_threads : pt_cpu_count();
    pt_cpu_isa isa = PT_ISA_SCALAR;
    PT_TRY(pick_isa(p.isa, &isa));
    pt_cpu *c = calloc(1, sizeof *c);
    if (!c) return pt_error(PT_ERR_NOMEM, "out of memory");
    pt_status s = pt_pool_create(&c->pool, nth);
    if (s != PT_OK) {
        free(c);
        return s;
    }
    c->base.ops = &cpu_ops;
    c->base.act = p.act;
    c->base.impl = c;
    c->nth = nth;
    c->isa = isa;
    c->int8_act = p.int8_act != 0;
    c->k = isa == PT_ISA_AVX512 ? &pt_cpu_kernels_avx512 : isa == PT_ISA_AVX2 ? &pt_cpu_kernels_avx2
                                                                                : &pt_cpu_kernels_scalar;
    *out = &c->base;
    return PT_OK;
}

const char *pt_backend_cpu_isa_name(const pt_backend *be) {
    if (!be || be->ops != &cpu_ops) return "none";
    return ((const pt_cpu *)be)->k->name;
}

void pt_ft_load_row(pt_ftype t, const void *p, float *dst, int64_t n) {
    switch (t) {
    case PT_FT_F32: memcpy(dst, p, (size_t)n * sizeof(float)); break;
    case PT_FT_BF16: pt_bf16_to_f32_row(p, dst, (size_t)n); break;
    case PT_FT_F16: pt_f16_to_f32_row(p, dst, (size_t)n); break;
    }
}
