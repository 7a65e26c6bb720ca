/* petrel — public C API.
 *
 * One header for applications embedding petrel. Opaque handles, `pt_` prefix,
 * every function returns a pt_status (0 ok, negative error) unless noted, and
 * on error a message naming what was wrong is available from pt_last_error()
 * (thread-local; valid until the next petrel call on the same thread).
 *
 * This header is the stable surface; everything under src/ is internal.
 */
#ifndef PETREL_H
#define PETREL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PT_VERSION_MAJOR 0
#define PT_VERSION_MINOR 1
#define PT_VERSION_PATCH 0
#define PT_VERSION_STRING "0.1.0"

/* Status codes. 0 is success; every error is negative. */
typedef enum pt_status {
    PT_OK = 0,
    PT_ERR_INVALID_ARG = -1,   /* a caller-supplied argument is invalid */
    PT_ERR_IO = -2,            /* a file could not be opened/read/written */
    PT_ERR_FORMAT = -3,        /* a file is malformed (truncated, lying header, bad JSON) */
    PT_ERR_UNSUPPORTED = -4,   /* valid input that petrel cannot handle (yet) */
    PT_ERR_NOMEM = -5,         /* allocation failed */
    PT_ERR_RANGE = -6,         /* a value is out of range (token id, context length) */
    PT_ERR_NOT_FOUND = -7,     /* a required file/tensor/field is missing */
    PT_ERR_INTERNAL = -8,      /* an internal invariant failed */
    PT_ERR_CANCELLED = -9,     /* the operation was cancelled by the caller */
    PT_ERR_DEVICE = -10,       /* a device (CUDA) call failed */
} pt_status;

/* The message describing the last error on this thread ("" if none).
 * The pointer stays valid until the next petrel call on this thread. */
const char *pt_last_error(void);

/* A short constant name for a status code ("PT_ERR_FORMAT"). */
const char *pt_status_name(pt_status s);

/* The library version string, e.g. "0.1.0". */
const char *pt_version(void);


/* ------------------------------------------------------------------------
 * Models and sessions.
 *
 * Lifetime: a pt_model is loaded once (weights mmapped / uploaded) and is
 * read-only afterwards; any number of pt_sessions may be created from it.
 * A session owns its KV cache and sampler state. A model and its sessions may
 * be used from different threads, but one session from one thread at a time.
 * Free every session before its model.
 * ---------------------------------------------------------------------- */

typedef struct pt_model pt_model;
typedef struct pt_session pt_session;

typedef enum pt_device { PT_DEVICE_AUTO = 0, PT_DEVICE_CPU = 1, PT_DEVICE_CUDA = 2 } pt_device;

/* Activation / compute dtype of a loaded model. */
typedef enum pt_compute_dtype {
    PT_COMPUTE_MODEL = 0, /* the checkpoint's dtype (bf16 for bf16 models, f32 for f32) */
    PT_COMPUTE_F32 = 1,
    PT_COMPUTE_BF16 = 2,  /* weights and activations cast to bf16 (like model.to(torch.bfloat16)) */
} pt_compute_dtype;

/* Lever values: PT_LEVER_DEFAULT lets the tier/default decide. */
#define PT_LEVER_DEFAULT (-1)
#define PT_LEVER_OFF 0
#define PT_LEVER_ON 1
/* kv_quant: 0 off, 4 or 8 = every layer at those bits, PT_KV_QUANT_CONFIG = kv_config.json */
#define PT_KV_QUANT_CONFIG (-2)

typedef struct pt_model_params {
    int n_threads;                  /* CPU threads; 0 = all online CPUs */
    pt_device device;               /* default PT_DEVICE_AUTO */
    pt_compute_dtype dtype;         /* default PT_COMPUTE_MODEL */
    const char *chat_template_path; /* overrides the model's chat template; NULL = model's */
    /* levers (DESIGN.md "Numerics and parity tiers"); PT_LEVER_DEFAULT = default */
    int kv_quant;           /* 0, 4, 8, PT_KV_QUANT_CONFIG, or PT_LEVER_DEFAULT */
    int kv_group_size;      /* default 64 */
    int quantized_kv_start; /* default 0 */
    int prefill_chunk;      /* default 2048 */
    int compiled_decode;    /* CUDA only */
    int fused_decode_attn;
    int int8_act;
    int gpu_sampling;       /* CUDA only: sample on the GPU when the request allows it (default on) */
} pt_model_params;

pt_model_params pt_model_default_params(void);

/* Loads and validates a model directory (config.json + weights; tokenizer and
 * other files optional). *out is NULL on error. */
pt_status pt_model_load(const char *dir, const pt_model_params *params, pt_model **out);
/* Frees the model and sets *model to NULL. NULL-safe. */
void pt_model_free(pt_model **model);

int pt_model_vocab_size(const pt_model *model);
/* The model's maximum context (max_position_embeddings). */
int pt_model_max_ctx(const pt_model *model);
/* A short description of the backend running the model ("cpu (avx512, 2 threads)"). */
const char *pt_model_backend_name(const pt_model *model);
/* The model id (directory basename) echoed by the server. */
const char *pt_model_id(const pt_model *model);
/* 1 if `id` ends generation (generation_config eos set, else tokenizer eos). */
int pt_model_is_eos(const pt_model *model, int32_t id);
/* 1 if the model has a tokenizer (tokenizer.json). */
int pt_model_has_tokenizer(const pt_model *model);

/* Frees memory returned by petrel (token arrays, strings). NULL-safe. */
void pt_free(void *p);

/* Text -> ids. add_special: add what the post-processor adds (BOS...).
 * *ids is malloc'd (free with pt_free). PT_ERR_NOT_FOUND if no tokenizer;
 * PT_ERR_INVALID_ARG for invalid UTF-8. */
pt_status pt_tokenize(const pt_model *model, const char *text, size_t len, int add_special,
                      int32_t **ids, size_t *n_ids);
/* ids -> text (*text malloc'd, NUL-terminated). */
pt_status pt_detokenize(const pt_model *model, const int32_t *ids, size_t n_ids, int skip_special,
                        char **text);
/* The text of one token as it appears when decoded in isolation (for logprobs
 * and tool output); *text malloc'd. */
pt_status pt_token_text(const pt_model *model, int32_t id, char **text);

/* Streaming detokenizer: feeds ids one at a time and returns only complete
 * UTF-8 text (byte-fallback sequences split across steps are held back). */
typedef struct pt_detokenizer pt_detokenizer;
pt_status pt_detokenizer_create(const pt_model *model, int skip_special, pt_detokenizer **out);
/* *text points into the detokenizer (valid until the next call); *len may be 0. */
pt_status pt_detokenizer_push(pt_detokenizer *d, int32_t id, const char **text, size_t *len);
/* Returns held-back bytes at the end of a stream (invalid UTF-8 as U+FFFD). */
pt_status pt_detokenizer_flush(pt_detokenizer *d, const char **text, size_t *len);
void pt_detokenizer_free(pt_detokenizer **d);

/* Renders the model's chat template. messages_json: a JSON array of
 * {"role","content",...}; extra_json: NULL or a JSON object of additional
 * variables (tools, enable_thinking, ...). *out malloc'd. PT_ERR_NOT_FOUND if
 * the model has no chat template; PT_ERR_FORMAT with the template's message if
 * it raises. */
pt_status pt_chat_render(const pt_model *model, const char *messages_json,
                         int add_generation_prompt, const char *extra_json, char **out);

typedef struct pt_sampling_params {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off (applied over the last repeat_last_n tokens) */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    int repeat_last_n;        /* default 64; 0 = whole context */
    uint64_t seed;            /* reproducible sampling for a given seed */
    int n_logprobs;           /* number of top logprobs to report (0..20) */
    int no_logprob;           /* 1: leave pt_token_info.logprob 0 when n_logprobs is 0, sparing a
                                 pass over the vocabulary per token (0 = compute it) */
} pt_sampling_params;

/* Defaults: greedy-free sampling defaults from generation_config.json when a
 * model is given (NULL: temperature 1, top_p 1, top_k 0, min_p 0). */
pt_sampling_params pt_sampling_default_params(const pt_model *model);

typedef struct pt_session_params {
    int n_ctx; /* context length (tokens); 0 = min(model max, 4096) */
} pt_session_params;

pt_session_params pt_session_default_params(void);
pt_status pt_session_create(pt_model *model, const pt_session_params *params, pt_session **out);
void pt_session_free(pt_session **session);
int pt_session_n_ctx(const pt_session *s);
/* Tokens currently in the context (prompt + accepted tokens). */
size_t pt_session_n_tokens(const pt_session *s);
const int32_t *pt_session_tokens(const pt_session *s);
/* Drops everything after the first n_keep tokens (prompt-cache reuse). */
pt_status pt_session_truncate(pt_session *s, size_t n_keep);

/* Appends tokens to the context and runs them through the model (chunked
 * prefill); afterwards the logits of the last position are available.
 * PT_ERR_RANGE if a token id is outside the vocabulary or the context would
 * overflow (the session is left unchanged). */
pt_status pt_session_prompt(pt_session *s, const int32_t *ids, size_t n_ids);
/* Like pt_session_prompt, and writes the logits of every one of the n_ids
 * positions to out: f32 [n_ids x vocab], row-major (the caller allocates it).
 * Used by `petrel logits` and `petrel perplexity`. */
pt_status pt_session_eval_logits(pt_session *s, const int32_t *ids, size_t n_ids, float *out);
/* Waits until the device work the session's calls have enqueued is done. On
 * CUDA a prompt (its logits left on the GPU for sampling there) and a
 * pipelined decode step return once their kernels are enqueued; timing them
 * needs this at the end (`petrel bench` does). On the CPU every call is
 * already complete when it returns, and this returns PT_OK at once. */
pt_status pt_session_sync(pt_session *s);

/* Continuous batching: appends ids[i] to sessions[i] for every i < n and
 * runs all n tokens through the model in one forward step (the per-token
 * matmuls, norms and activations over [n, ...] rows, so the weights are read
 * once for all n; attention per session over its own cache at its own
 * position). Afterwards each session's logits are those of its new token,
 * bit-identical to what pt_session_prompt(sessions[i], &ids[i], 1) would
 * have computed: a request's results never depend on which other requests
 * share its steps (docs/batching.md). Sessions must be distinct and of one
 * model; n >= 1 (any n; large n is simply more rows). Everything is checked
 * before anything runs: a bad id, a full context, a repeated or NULL session
 * or one of another model is PT_ERR_RANGE / PT_ERR_INVALID_ARG naming the
 * index i, and no session is changed. If the forward itself fails, no
 * session's token count advances and every session loses its logits. */
pt_status pt_session_decode_batch(pt_session *const *sessions, const int32_t *ids, int n);

/* Logits of the last processed position [vocab] (f32), or NULL if none. */
const float *pt_session_logits(const pt_session *s);

typedef struct pt_token_info {
    int32_t id;
    float logprob;      /* log-softmax of the chosen token (before sampling filters) */
    int n_top;          /* number of entries in top_ids/top_logprobs */
    int32_t top_ids[20];
    float top_logprobs[20];
} pt_token_info;

/* Samples the next token from the current logits. allowed: NULL, or a
 * vocab-sized byte mask (non-zero = allowed) for constrained decoding.
 * Does not append the token: call pt_session_prompt(s, &id, 1) for that.
 * The session's RNG is seeded from sp->seed on first use and whenever the
 * seed changes; successive calls with one seed continue one stream.
 * Penalties look at the session's tokens. logprob/top_logprobs are the
 * log-softmax of the raw logits (before penalties, temperature, filters);
 * with sp->no_logprob set and sp->n_logprobs 0, logprob is 0 (not
 * computed). The chosen id never depends on either. */
pt_status pt_session_sample(pt_session *s, const pt_sampling_params *sp, const uint8_t *allowed,
                            pt_token_info *out);

typedef struct pt_generate_stats {
    size_t n_prompt, n_generated;
    double prompt_seconds, generate_seconds, first_token_seconds;
} pt_generate_stats;

typedef enum pt_finish_reason {
    PT_FINISH_LENGTH = 0, PT_FINISH_EOS = 1, PT_FINISH_STOP = 2, PT_FINISH_CANCELLED = 3
} pt_finish_reason;

/* Called for each generated token with the newly complete text (may be empty).
 * Return non-zero to stop generation (finish reason CANCELLED). Text held
 * back (an incomplete UTF-8 sequence, or a possible start of a stop string)
 * arrives with a later token, or in a final call whose tok->id is -1. An eos
 * token does not produce a call; a stop string is never passed on. */
typedef int (*pt_token_callback)(void *user, const pt_token_info *tok, const char *text, size_t len);

typedef struct pt_generate_params {
    int max_tokens;              /* default 256 */
    pt_sampling_params sampling;
    const char *const *stop;     /* stop strings (matched on decoded text), may be NULL */
    int n_stop;
} pt_generate_params;

pt_generate_params pt_generate_default_params(const pt_model *model);

/* Prompts the session with `prompt` (appended to what it holds) and
 * generates until eos, a stop string, max_tokens or cancellation. n_prompt 0
 * continues from the session's current logits. The sampler is re-seeded from
 * params->sampling.seed at the start. Afterwards the session holds the prompt
 * and every generated token except the last one (the eos, the token that
 * completed a stop string, or the max_tokens-th), which was sampled but not
 * run through the model. Stop strings need a tokenizer (PT_ERR_NOT_FOUND
 * otherwise). stats: prompt_seconds covers the prefill, generate_seconds the
 * rest, first_token_seconds from the call to the first sampled token. */
pt_status pt_generate(pt_session *s, const int32_t *prompt, size_t n_prompt,
                      const pt_generate_params *params, pt_token_callback cb, void *user,
                      pt_finish_reason *finish, pt_generate_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* PETREL_H */
