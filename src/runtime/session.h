/* struct pt_session (behind include/petrel.h): the tokens in the context,
 * the forward state (KV cache + activation buffers), the last logits and the
 * sampler. Internal to the runtime; applications use petrel.h. */
#ifndef PT_RUNTIME_SESSION_H
#define PT_RUNTIME_SESSION_H

#include "petrel.h"

#include "model/model.h"
#include "runtime/sampler.h"

struct pt_session {
    pt_model *m;
    int n_ctx;
    int32_t *tokens;   /* [n_ctx] the context */
    size_t n_tokens;
    pt_fwd_state fwd;
    float *logits;     /* [V] host copy of the last position's logits */
    int has_logits;
    pt_sampler sampler;
};

/* Checks ids against the vocabulary and the context (PT_ERR_RANGE naming the
 * offending id / the lengths). */
pt_status pt_session_check_ids(const pt_session *s, const int32_t *ids, size_t n);

#endif
