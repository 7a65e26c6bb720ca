/* The server's view of a model: a table of operations the HTTP server and its
 * scheduler call, so that the serving code depends on nothing but this table.
 *
 * engine_petrel.c fills it from the public API (include/petrel.h); the server
 * tests fill it with a small deterministic byte-level model so that every
 * route, queue and stream can be tested without weights. This is not a second
 * inference API: each entry is one petrel.h call with the same contract.
 *
 * Threading: model-level entries (tokenize, detokenize, token_text,
 * chat_render, the detokenizer) are called from HTTP threads concurrently;
 * session entries only from the one inference thread.
 * Memory returned through this table (ids, text) is malloc'd: free() it.
 */
#ifndef PT_SERVER_ENGINE_H
#define PT_SERVER_ENGINE_H

#include "petrel.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pt_srv_engine {
    void *model; /* opaque: a pt_model*, or the test model */

    const char *(*model_id)(void *model);
    int (*vocab_size)(void *model);
    int (*max_ctx)(void *model);
    int (*is_eos)(void *model, int32_t id);
    int (*has_tokenizer)(void *model);
    pt_sampling_params (*default_sampling)(void *model);

    pt_status (*tokenize)(void *model, const char *text, size_t len, int add_special,
                          int32_t **ids, size_t *n_ids);
    pt_status (*detokenize)(void *model, const int32_t *ids, size_t n_ids, int skip_special,
                            char **text);
    /* Raw text of one token; "" (not NULL) for control tokens that decode to
     * nothing with skip_special. *text malloc'd. */
    pt_status (*token_text)(void *model, int32_t id, int skip_special, char **text);
    pt_status (*chat_render)(void *model, const char *messages_json, int add_generation_prompt,
                             const char *extra_json, char **out);

    pt_status (*detok_create)(void *model, int skip_special, void **out);
    pt_status (*detok_push)(void *d, int32_t id, const char **text, size_t *len);
    pt_status (*detok_flush)(void *d, const char **text, size_t *len);
    void (*detok_free)(void *d);

    /* Sessions (inference thread only). */
    pt_status (*session_create)(void *model, int n_ctx, void **out);
    void (*session_free)(void *s);
    int (*session_n_ctx)(void *s);
    size_t (*session_n_tokens)(void *s);
    const int32_t *(*session_tokens)(void *s);
    pt_status (*session_truncate)(void *s, size_t n_keep);
    pt_status (*session_prompt)(void *s, const int32_t *ids, size_t n_ids);
    pt_status (*session_sample)(void *s, const pt_sampling_params *sp, const uint8_t *allowed,
                                pt_token_info *out);
    /* Optional (NULL: every row through session_sample): samples the rows
     * i < n of one turn (no masks) in one call — GPU sampling over the
     * batch; done[i] = 0 leaves row i to session_sample; st[i] / err[i] as
     * session_sample would report them. */
    void (*session_sample_many)(void *const *s, const pt_sampling_params *const *sp, pt_token_info *o,
                                pt_status *st, char (*err)[512], uint8_t *done, int n);
    /* Bytes of memory the session holds (its KV cache), for the prompt-cache cap. */
    size_t (*session_bytes)(void *s);
    /* Continuous batching (pt_session_decode_batch): appends ids[i] to
     * sessions[i] for i < n in one forward step. NULL = not available: the
     * scheduler then runs session_prompt(s, &id, 1) per session. */
    pt_status (*session_decode_batch)(void *const *sessions, const int32_t *ids, int n);
    /* Prompt rows (pt_session_decode_rows, runtime/batch.h): appends counts[i]
     * tokens (ids holds them session by session) to sessions[i] for i < n in
     * one batched step, every token computed as it would be alone, one at a
     * time; n <= 64. NULL = not available: prompts go through session_prompt
     * and the steps through session_decode_batch. */
    pt_status (*session_decode_rows)(void *const *sessions, const int32_t *ids, const int *counts, int n);
    /* Optional (NULL: no pipelined turns): the pipelined turn
     * (pt_session_rows_ahead, runtime/batch.h): samples dec[i] for i < nd
     * (no masks; results as session_sample gives them) and runs the next
     * step ahead — each dec[i]'s sampled token unless norow[i], then pcnt[i]
     * prompt tokens of each prs[i] (pids session by session) — while the
     * caller handles the tokens; the session_decode_rows that follows takes
     * the rows it asks for again (held[k]: session k, decode then prompt
     * sessions, holds its rows ahead). PT_OK: the samples were taken; any
     * other status: nothing was drawn or run. */
    pt_status (*session_rows_ahead)(void *const *dec, const pt_sampling_params *const *sp, const uint8_t *norow,
                                    int nd, void *const *prs, const int32_t *pids, const int *pcnt, int np,
                                    pt_token_info *o, pt_status *st, char (*err)[512], uint8_t *held);
    /* Whether turns are pipelined by default (with session_rows_ahead): 1 on
     * CUDA, where the host's part of a turn (handing out the tokens, the
     * next step's tables) otherwise leaves the GPU idle; 0 on the CPU, where
     * the host thread is the one computing. The server's
     * PETREL_SERVE_PIPELINE=0|1 overrides it. */
    int pipeline;
    /* Short prompts (a rest of at most 4 pieces) run in pieces of this many
     * tokens, all in one turn; 0 = one chunk. On CUDA 8: up to 8 tokens a
     * projection is one decode GEMV launch reading the weights once, while a
     * longer chunk dequantizes every weight for the GEMM (~85 ms on an 8B
     * model whatever the chunk's length). */
    int short_prompt_piece;
    /* Prompts with at most this many tokens left to run go through
     * session_decode_rows as rows of the batched steps; 0 = never. On CUDA
     * 64: a prompt row costs what a decode row does, and the tensor-core
     * GEMV reads each weight once per 64 rows, so joining prompts share the
     * weight reads. On the CPU 0: there a prompt is compute-bound and the
     * decode kernels over its rows cost several times the prefill GEMM
     * (bench/RESULTS.md). The server's PETREL_PROMPT_ROWS overrides it. */
    int prompt_rows_max;
} pt_srv_engine;

/* Fills `e` for a loaded petrel model (engine_petrel.c); `dir` is the model
 * directory (its config.json sizes the prompt-cache accounting). Release with
 * pt_srv_engine_release; the model itself stays the caller's. */
pt_status pt_srv_engine_from_model(pt_srv_engine *e, pt_model *model, const char *dir);
void pt_srv_engine_release(pt_srv_engine *e);

#endif
