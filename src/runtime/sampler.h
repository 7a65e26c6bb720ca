/* The token sampler: turns one row of logits into a token id.
 *
 * Pipeline, in this order (the order transformers' generate applies its
 * logits processors and warpers):
 *   1. penalties over the recent history (repetition, presence, frequency);
 *   2. the allowed-token mask (constrained decoding), if any;
 *   3. greedy (temperature 0): argmax, ties to the lowest id — done;
 *   4. temperature scaling, top-k, softmax, top-p, min-p, renormalize;
 *   5. one uniform draw from the sampler's own RNG (xoshiro256**, seeded by
 *      splitmix64 from the seed), so a seed reproduces a run exactly.
 * Orders: top-k and top-p take the candidates by (scaled logit descending,
 * id ascending); without those filters the draw walks the ids in order.
 * The exponentials and the double-precision sums follow sample_math.h, which
 * the GPU sampler (src/backend/cuda/sample.cu) shares: given the same logits,
 * history and draw, both choose the same token.
 * Log-probabilities reported in pt_token_info are the log-softmax of the
 * model's raw logits (before penalties, temperature and filters).
 *
 * All scratch memory is sized at init for the vocabulary, so sampling a token
 * allocates nothing. This is not the forward pass and knows nothing of models
 * beyond the vocabulary size. */
#ifndef PT_RUNTIME_SAMPLER_H
#define PT_RUNTIME_SAMPLER_H

#include "petrel.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pt_sampler {
    int vocab;
    float *work;      /* [vocab] penalised / scaled logits, then probabilities */
    int32_t *idx;     /* [vocab] candidate ids */
    uint32_t *count;  /* [vocab] occurrences in the penalty window */
    float *prob;      /* [vocab] probabilities relative to the max (0: not a candidate) */
    float *seq;       /* [vocab] the probabilities in the order the sums run over */
    uint64_t rng[4];  /* xoshiro256** state */
    uint64_t seed;    /* the seed the state was derived from */
    int seeded;
} pt_sampler;

pt_status pt_sampler_init(pt_sampler *s, int vocab);
void pt_sampler_free(pt_sampler *s);
/* Resets the RNG from `seed` (a fixed seed gives a fixed stream of draws). */
void pt_sampler_seed(pt_sampler *s, uint64_t seed);
/* Uniform double in [0, 1) from the sampler's stream. */
double pt_sampler_uniform(pt_sampler *s);

/* Checks sampling parameters (temperature >= 0, top_p in (0,1], min_p in
 * [0,1], repetition_penalty > 0, n_logprobs 0..20, top_k >= 0, finite).
 * PT_ERR_INVALID_ARG naming the field. */
pt_status pt_sampling_validate(const pt_sampling_params *sp);

/* Samples one token. logits: [vocab] f32 (not modified). history: the
 * context so far (penalties look at its last repeat_last_n tokens; 0 = all).
 * allowed: NULL or [vocab] bytes, non-zero = allowed (PT_ERR_INVALID_ARG if
 * nothing is allowed). out->logprob and out->top_* follow sp->n_logprobs. */
pt_status pt_sampler_sample(pt_sampler *s, const float *logits, const pt_sampling_params *sp,
                            const int32_t *history, size_t n_history, const uint8_t *allowed,
                            pt_token_info *out);

/* pt_sampler_sample with the uniform draw given: u_drawn in [0, 1) is used
 * instead of drawing from the sampler's stream (a negative u_drawn draws as
 * pt_sampler_sample does). The GPU sampler draws on the host before its
 * launch and falls back here with that same draw, so the stream advances
 * once per sampled token either way. */
pt_status pt_sampler_sample_u(pt_sampler *s, const float *logits, const pt_sampling_params *sp,
                              const int32_t *history, size_t n_history, const uint8_t *allowed, double u_drawn,
                              pt_token_info *out);

/* 1 when sp samples greedily (no draw from the stream). */
static inline int pt_sampling_is_greedy(const pt_sampling_params *sp) {
    return sp->temperature == 0.0f || sp->top_k == 1;
}

/* log-softmax value of logits[id] over [vocab] (double accumulation). */
float pt_logprob_of(const float *logits, int vocab, int32_t id);

#endif
