/* Levers and parity tiers (DESIGN.md "Numerics and parity tiers").
 *
 * A lever is one individually settable switch that lives in pt_model_params
 * (kv_quant, kv_group_size, quantized_kv_start, prefill_chunk,
 * compiled_decode, fused_decode_attn, int8_act). The tiers --l1/--l2/--l3 are
 * pure aliases: each writes a fixed value into every output-affecting lever
 * and nothing else; a lever set after the alias overrides it.
 *
 *   lever               --l1   --l2     --l3   default
 *   kv-quant            off    config   4      off
 *   compiled-decode     on     on       on     on (CUDA only; n/a on the CPU)
 *   fused-decode-attn   off    off      on     off
 *   int8-act            off    off      on*    off
 *
 * (*) int8 activations are a CPU kernel: --l3 turns them on where the device
 * has them (PT_LEVER_TIER, settled by pt_levers_for_device: on for the CPU,
 * not applicable on CUDA, as compiled-decode is on the CPU), while an
 * explicit --int8-act on with --device cuda is an error.
 *
 * kv-group-size (64), quantized-kv-start (0) and prefill-chunk (2048) are not
 * touched by the aliases, nor is gpu-sampling (default on; CUDA only): it
 * changes where a token is sampled, not which token (sampler.h).
 *
 * This file parses and resolves values and says which are implemented; it
 * does not read argv or the environment (src/cli/args.c does). */
#ifndef PT_RUNTIME_LEVERS_H
#define PT_RUNTIME_LEVERS_H

#include "petrel.h"

#include <stddef.h>

/* A lever value set by a tier alias: on where the running device implements
 * the lever, not applicable elsewhere (int8-act). */
#define PT_LEVER_TIER 2

/* Writes the tier's values (1, 2 or 3) into p. */
pt_status pt_levers_apply_tier(pt_model_params *p, int tier);

/* Sets one lever from its flag name without dashes ("kv-quant") and a string
 * value ("off", "4", "on", "2048"...). PT_ERR_NOT_FOUND if name is not a
 * lever; PT_ERR_INVALID_ARG naming the lever and the accepted values for a
 * bad value. */
pt_status pt_lever_set(pt_model_params *p, const char *name, const char *value);

/* The environment variable mirroring a lever ("PETREL_KV_QUANT"), NULL if
 * the name is not a lever. */
const char *pt_lever_env_name(const char *name);

/* The names of every lever, NULL-terminated. */
extern const char *const pt_lever_names[];

/* Replaces PT_LEVER_DEFAULT values by the defaults (see the table above). */
void pt_levers_resolve(pt_model_params *p);

/* Settles the levers whose meaning depends on the device the model runs on
 * (PT_LEVER_TIER values); call after pt_levers_resolve, before
 * pt_levers_check. */
void pt_levers_for_device(pt_model_params *p, pt_device device);

/* Checks resolved levers against what the running backend implements:
 * PT_ERR_UNSUPPORTED with a message naming the lever for one that is not
 * implemented yet; PT_ERR_INVALID_ARG for an inconsistent value. */
pt_status pt_levers_check(const pt_model_params *p, pt_device device);

/* One "name: value" line per lever into buf (NUL-terminated, truncated to n);
 * `device` makes compiled-decode print "not applicable" on the CPU. */
void pt_levers_format(const pt_model_params *p, pt_device device, char *buf, size_t n);

#endif
