/* Levers and parity tiers (see levers.h for the table). */
#include "runtime/levers.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const pt_lever_names[] = {"kv-quant",        "kv-group-size",     "quantized-kv-start",
                                      "prefill-chunk",   "compiled-decode",   "fused-decode-attn",
                                      "int8-act",        "gpu-sampling",      NULL};

static const char *const env_names[] = {"PETREL_KV_QUANT",       "PETREL_KV_GROUP_SIZE",
                                        "PETREL_QUANTIZED_KV_START", "PETREL_PREFILL_CHUNK",
                                        "PETREL_COMPILED_DECODE", "PETREL_FUSED_DECODE_ATTN",
                                        "PETREL_INT8_ACT", "PETREL_GPU_SAMPLING"};

static int lever_index(const char *name) {
    for (int i = 0; pt_lever_names[i]; i++)
        if (!strcmp(pt_lever_names[i], name)) return i;
    return -1;
}

const char *pt_lever_env_name(const char *name) {
    int i = lever_index(name);
    return i < 0 ? NULL : env_names[i];
}

pt_status pt_levers_apply_tier(pt_model_params *p, int tier) {
    switch (tier) {
    case 1:
        p->kv_quant = 0;
        p->compiled_decode = PT_LEVER_ON;
        p->fused_decode_attn = PT_LEVER_OFF;
        p->int8_act = PT_LEVER_OFF;
        return PT_OK;
    case 2:
        p->kv_quant = PT_KV_QUANT_CONFIG;
        p->compiled_decode = PT_LEVER_ON;
        p->fused_decode_attn = PT_LEVER_OFF;
        p->int8_act = PT_LEVER_OFF;
        return PT_OK;
    case 3:
        p->kv_quant = 4;
        p->compiled_decode = PT_LEVER_ON;
        p->fused_decode_attn = PT_LEVER_ON;
        p->int8_act = PT_LEVER_TIER; /* on the CPU; n/a on CUDA (pt_levers_for_device) */
        return PT_OK;
    }
    return pt_error(PT_ERR_INVALID_ARG, "unknown parity tier %d (expected 1, 2 or 3)", tier);
}

static int parse_int(const char *s, long lo, long hi, int *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_onoff(const char *s, int *out) {
    if (!strcmp(s, "on") || !strcmp(s, "1") || !strcmp(s, "true")) return *out = PT_LEVER_ON, 1;
    if (!strcmp(s, "off") || !strcmp(s, "0") || !strcmp(s, "false")) return *out = PT_LEVER_OFF, 1;
    return 0;
}

pt_status pt_lever_set(pt_model_params *p, const char *name, const char *value) {
    int i = lever_index(name);
    if (i < 0) return pt_error(PT_ERR_NOT_FOUND, "'%s' is not a lever", name);
    if (!value) return pt_error(PT_ERR_INVALID_ARG, "--%s needs a value", name);
    int v;
    switch (i) {
    case 0: /* kv-quant */
        if (!strcmp(value, "off") || !strcmp(value, "0")) p->kv_quant = 0;
        else if (!strcmp(value, "4")) p->kv_quant = 4;
        else if (!strcmp(value, "8")) p->kv_quant = 8;
        else if (!strcmp(value, "config")) p->kv_quant = PT_KV_QUANT_CONFIG;
        else
            return pt_error(PT_ERR_INVALID_ARG, "--kv-quant: bad value '%s' (expected off, 4, 8 or config)",
                            value);
        return PT_OK;
    case 1: /* kv-group-size */
        if (!parse_int(value, 1, 1 << 20, &v) || (v != 32 && v != 64 && v != 128))
            return pt_error(PT_ERR_INVALID_ARG, "--kv-group-size: bad value '%s' (expected 32, 64 or 128)",
                            value);
        p->kv_group_size = v;
        return PT_OK;
    case 2: /* quantized-kv-start */
        if (!parse_int(value, 0, 1L << 30, &v))
            return pt_error(PT_ERR_INVALID_ARG,
                            "--quantized-kv-start: bad value '%s' (expected a token count >= 0)", value);
        p->quantized_kv_start = v;
        return PT_OK;
    case 3: /* prefill-chunk */
        if (!parse_int(value, 1, 1L << 24, &v))
            return pt_error(PT_ERR_INVALID_ARG, "--prefill-chunk: bad value '%s' (expected a token count >= 1)",
                            value);
        p->prefill_chunk = v;
        return PT_OK;
    default: /* on|off levers */
        if (!parse_onoff(value, &v))
            return pt_error(PT_ERR_INVALID_ARG, "--%s: bad value '%s' (expected on or off)", name, value);
        if (i == 4) p->compiled_decode = v;
        else if (i == 5) p->fused_decode_attn = v;
        else if (i == 7) p->gpu_sampling = v;
        else p->int8_act = v;
        return PT_OK;
    }
}

void pt_levers_resolve(pt_model_params *p) {
    if (p->kv_quant == PT_LEVER_DEFAULT) p->kv_quant = 0;
    if (p->kv_group_size == PT_LEVER_DEFAULT || p->kv_group_size == 0) p->kv_group_size = 64;
    if (p->quantized_kv_start == PT_LEVER_DEFAULT) p->quantized_kv_start = 0;
    if (p->prefill_chunk == PT_LEVER_DEFAULT || p->prefill_chunk == 0) p->prefill_chunk = 2048;
    if (p->compiled_decode == PT_LEVER_DEFAULT) p->compiled_decode = PT_LEVER_ON;
    if (p->fused_decode_attn == PT_LEVER_DEFAULT) p->fused_decode_attn = PT_LEVER_OFF;
    if (p->int8_act == PT_LEVER_DEFAULT) p->int8_act = PT_LEVER_OFF;
    if (p->gpu_sampling == PT_LEVER_DEFAULT) p->gpu_sampling = PT_LEVER_ON;
}

void pt_levers_for_device(pt_model_params *p, pt_device device) {
    if (p->int8_act == PT_LEVER_TIER) p->int8_act = device == PT_DEVICE_CUDA ? PT_LEVER_OFF : PT_LEVER_ON;
}

pt_status pt_levers_check(const pt_model_params *p, pt_device device) {
    /* the quantized KV cache (runtime/kv_cache.c) and --fused-decode-attn run on both backends */
    if (p->int8_act == PT_LEVER_ON && device == PT_DEVICE_CUDA)
        return pt_error(PT_ERR_UNSUPPORTED,
                        "--int8-act on: int8 activations are a CPU kernel (use --int8-act off, --device cpu, or --l1)");
    if (p->prefill_chunk < 1) return pt_error(PT_ERR_INVALID_ARG, "prefill_chunk must be >= 1");
    return PT_OK;
}

void pt_levers_format(const pt_model_params *p, pt_device device, char *buf, size_t n) {
    const char *kv = p->kv_quant == 0 ? "off"
                     : p->kv_quant == 4 ? "4"
                     : p->kv_quant == 8 ? "8"
                     : p->kv_quant == PT_KV_QUANT_CONFIG ? "config"
                                                         : "default";
#define ONOFF(v)                                                                                                     \
    ((v) == PT_LEVER_ON ? "on" : (v) == PT_LEVER_OFF ? "off" : (v) == PT_LEVER_TIER ? "on (CPU only)" : "default")
    snprintf(buf, n,
             "kv-quant: %s\nkv-group-size: %d\nquantized-kv-start: %d\nprefill-chunk: %d\n"
             "compiled-decode: %s%s\nfused-decode-attn: %s\nint8-act: %s\ngpu-sampling: %s%s\n",
             kv, p->kv_group_size, p->quantized_kv_start, p->prefill_chunk, ONOFF(p->compiled_decode),
             device == PT_DEVICE_CUDA ? "" : " (not applicable on the cpu)", ONOFF(p->fused_decode_attn),
             ONOFF(p->int8_act), ONOFF(p->gpu_sampling), device == PT_DEVICE_CUDA ? "" : " (not applicable on the cpu)");
#undef ONOFF
}
