/* Command-line flags shared by every command that runs a model (generate,
 * chat, serve, logits, perplexity, bench), and small value parsers.
 *
 * Common flags: -m/--model DIR, -t/--threads N, --device cuda|cpu|auto,
 * --ctx N, --chat-template FILE, the tier aliases --l1/--l2/--l3 and every
 * lever (--kv-quant, --kv-group-size, --quantized-kv-start, --prefill-chunk,
 * --compiled-decode, --fused-decode-attn, --int8-act; see runtime/levers.h).
 * Each has a PETREL_* environment mirror (PETREL_MODEL, PETREL_THREADS,
 * PETREL_DEVICE, PETREL_CTX, PETREL_CHAT_TEMPLATE, PETREL_TIER=l1|l2|l3,
 * PETREL_KV_QUANT, ...). Precedence: environment (tier first, then the
 * individual mirrors), then the flags from left to right — so a flag after an
 * alias overrides it. Values may be given as "--flag VALUE" or "--flag=VALUE".
 *
 * Usage in a command:
 *   cli_common c; if (cli_common_init(&c, "generate")) return 2;
 *   for (int i = 1; i < argc; i++) {
 *       int r = cli_common_parse(&c, "generate", argc, argv, &i);
 *       if (r < 0) return 2; if (r > 0) continue;
 *       ... command-specific flags; else cli_usage_error(unknown flag) ...
 *   }
 */
#ifndef PT_CLI_ARGS_H
#define PT_CLI_ARGS_H

#include "petrel.h"

#include <stdint.h>
#include <stdio.h>

typedef struct cli_common {
    pt_model_params mp;
    const char *model_dir; /* -m; NULL if not given */
    int n_ctx;             /* --ctx; 0 = default */
    int tier;              /* last alias (1..3), 0 if none */
} cli_common;

/* Defaults, then the environment mirrors. Returns 0, or 2 after printing an
 * error naming the bad variable. */
int cli_common_init(cli_common *c, const char *cmd);

/* If argv[*i] is a common flag, consumes it (and its value, advancing *i) and
 * returns 1; returns 0 if it is not one; returns -1 after printing an error
 * (bad value, missing value). */
int cli_common_parse(cli_common *c, const char *cmd, int argc, char **argv, int *i);

/* The common flags' help text. */
void cli_common_help(FILE *f);

/* Resolves the levers' defaults and prints them, one "name: value" line each
 * (plus device, threads and ctx). */
void cli_print_config(FILE *f, cli_common *c);

/* Flag value helpers. flag_value: for argv[*i] == name (value in argv[*i+1])
 * or "name=value"; returns the value and advances *i, or NULL when argv[*i]
 * is not this flag. Sets *missing when the flag is there without a value. */
const char *cli_flag_value(const char *name, int argc, char **argv, int *i, int *missing);
/* Parse with range checks; on failure print "petrel CMD: FLAG: bad value ..." and return 0. */
int cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);
int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
int cli_parse_float(const char *cmd, const char *flag, const char *s, double lo, double hi, float *out);
/* "1,2,3" or "1 2 3" -> malloc'd ids. Returns 0 with a printed error on bad input
 * (not a number, negative, empty). */
int cli_parse_ids(const char *cmd, const char *s, int32_t **ids, size_t *n);



/* Loads c->model_dir (error if -m is missing) and creates a session of
 * c->n_ctx tokens. Returns 0 on success; prints the error and returns the
 * exit code (2 without -m, 1 when loading fails). */
int cli_load(const char *cmd, cli_common *c, pt_model **model, pt_session **session);

/* The prompt flags of generate and logits: exactly one of -p TEXT (non-empty)
 * and --prompt-ids IDS must be given; the ids are parsed into *ids (malloc'd,
 * NULL for a text prompt), then the model and a session are loaded as
 * cli_load does. Returns 0, or the exit code after printing the error (*ids
 * freed then). */
int cli_load_prompt(const char *cmd, cli_common *c, const char *prompt, const char *ids_arg, int32_t **ids,
                    size_t *n_ids, pt_model **model, pt_session **session);

/* Sampling and generation flags shared by generate and chat:
 * --max-tokens N, --temp T, --top-k K, --top-p P, --min-p P, --seed S,
 * --repeat-penalty R, --repeat-last-n N, --presence-penalty P,
 * --frequency-penalty P, --stop STR (repeatable, up to 16). Values not given
 * keep the model's defaults (generation_config.json). */
#define CLI_MAX_STOP 16
typedef struct cli_sampling {
    pt_sampling_params v;
    unsigned set; /* bit per field given on the command line */
    int max_tokens;
    const char *stop[CLI_MAX_STOP];
    int n_stop;
} cli_sampling;

void cli_sampling_init(cli_sampling *s);
/* Like cli_common_parse for the sampling flags. */
int cli_sampling_parse(cli_sampling *s, const char *cmd, int argc, char **argv, int *i);
/* The model's defaults with the given flags applied. */
pt_generate_params cli_sampling_apply(const cli_sampling *s, const pt_model *m);
void cli_sampling_help(FILE *f);

#endif
