/* Sessions: context tokens, chunked prefill, logits, sampling (petrel.h's
 * pt_session_*). The forward pass itself is src/model/llama.c; the generate
 * loop is generate.c. */
#include "runtime/session.h"

#include "backend/cuda/sample.h"
#include "base/error.h"
#include "runtime/batch.h"
#include "runtime/kv_cache.h"

#include <stdlib.h>
#include <string.h>

pt_session_params pt_session_default_params(void) {
    pt_session_params p = {0};
    return p;
}

pt_status pt_session_create(pt_model *model, const pt_session_params *params, pt_session **out) {
    if (!out) return pt_error(PT_ERR_INVALID_ARG, "pt_session_create: out is NULL");
    *out = NULL;
    if (!model) return pt_error(PT_ERR_INVALID_ARG, "pt_session_create: model is NULL");
    pt_session_params p = params ? *params : pt_session_default_params();
    int max = model->net.max_ctx;
    if (p.n_ctx < 0) return pt_error(PT_ERR_INVALID_ARG, "context length %d is negative", p.n_ctx);
    if (p.n_ctx == 0) p.n_ctx = max < 4096 ? max : 4096;
    if (p.n_ctx > max)
        return pt_error(PT_ERR_RANGE, "context length %d exceeds the model's maximum of %d tokens "
                                      "(max_position_embeddings in config.json)",
                        p.n_ctx, max);
    pt_session *s = calloc(1, sizeof *s);
    if (!s) return pt_error(PT_ERR_NOMEM, "out of memory for a session");
    s->m = model;
    s->n_ctx = p.n_ctx;
    s->tokens = malloc((size_t)p.n_ctx * sizeof *s->tokens);
    s->logits = malloc((size_t)model->net.vocab * sizeof *s->logits);
    if (!s->tokens || !s->logits) {
        pt_session_free(&s);
        return pt_error(PT_ERR_NOMEM, "out of memory for a session of %d tokens", p.n_ctx);
    }
    pt_status st = pt_sampler_init(&s->sampler, (int)model->net.vocab);
    if (st == PT_OK) {
        pthread_mutex_lock(&model->lock);
        st = pt_fwd_init(model, &s->fwd, p.n_ctx);
        pthread_mutex_unlock(&model->lock);
    }
    if (st != PT_OK) {
        pt_session_free(&s);
        return st;
    }
    if (model->device == PT_DEVICE_CUDA && model->params.gpu_sampling != PT_LEVER_OFF) {
        /* GPU sampling's buffers; without them the session samples on the host */
        pt_backend *be = model->be;
        size_t V = (size_t)model->net.vocab;
        s->hist_dev = be->ops->alloc(be, (size_t)p.n_ctx * sizeof(int32_t));
        s->work_dev = s->hist_dev ? be->ops->alloc(be, V * sizeof(float)) : NULL;
        s->counts_dev = s->work_dev ? be->ops->alloc(be, V * sizeof(uint32_t)) : NULL;
        s->ctl_dev = s->counts_dev ? be->ops->alloc(be, pt_gsample_ctl_bytes(1)) : NULL;
        s->gpu = s->ctl_dev != NULL;
    }
    *out = s;
    return PT_OK;
}

void pt_session_free(pt_session **session) {
    if (!session || !*session) return;
    pt_session *s = *session;
    pt_gsample_pipe_free(s->m->be, &s->pipe);
    if (s->fwd.kv) pt_fwd_free(s->m, &s->fwd);
    void *dev[] = {s->hist_dev, s->work_dev, s->counts_dev, s->ctl_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) s->m->be->ops->dealloc(s->m->be, dev[i]);
    pt_sampler_free(&s->sampler);
    free(s->tokens);
    free(s->logits);
    free(s);
    *session = NULL;
}

int pt_session_n_ctx(const pt_session *s) { return s ? s->n_ctx : 0; }
size_t pt_session_n_tokens(const pt_session *s) { return s ? s->n_tokens : 0; }
const int32_t *pt_session_tokens(const pt_session *s) { return s ? s->tokens : NULL; }

static pt_status run_tokens(pt_session *s, const int32_t *ids, size_t n, float *out_all);

pt_status pt_session_truncate(pt_session *s, size_t n_keep) {
    if (!s) return pt_error(PT_ERR_INVALID_ARG, "pt_session_truncate: session is NULL");
    if (n_keep > s->n_tokens)
        return pt_error(PT_ERR_RANGE, "pt_session_truncate: keeping %zu tokens of %zu", n_keep, s->n_tokens);
    s->ahead = 0; /* a step ahead is dropped (pt_session_sample_ahead) */
    s->rows_ahead = 0; /* and rows ahead (pt_session_rows_ahead) */
    if (s->fwd.cache) PT_TRY(pt_kv_cache_truncate(s->m, s->fwd.cache, s->fwd.kv, (int64_t)n_keep));
    if (n_keep < s->n_tokens) s->has_logits = s->logits_dev = s->fwd.sampled = 0;
    if (n_keep < s->n_tokens && n_keep > 0 && s->fwd.conv_state) {
        /* Recurrent (Gated DeltaNet) state cannot be cut back like a KV
         * cache: recompute the kept prefix from position 0. */
        int32_t *keep = malloc(n_keep * sizeof *keep);
        if (!keep) return pt_error(PT_ERR_NOMEM, "out of memory truncating a session");
        memcpy(keep, s->tokens, n_keep * sizeof *keep);
        s->n_tokens = 0;
        pt_status st = run_tokens(s, keep, n_keep, NULL);
        free(keep);
        return st;
    }
    s->n_tokens = n_keep;
    return PT_OK;
}

pt_status pt_session_check_ids(const pt_session *s, const int32_t *ids, size_t n) {
    int64_t V = s->m->net.vocab;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return pt_error(PT_ERR_RANGE, "token id %d (at prompt position %zu) is outside the vocabulary [0, %lld)",
                            ids[i], i, (long long)V);
    if (n > (size_t)s->n_ctx - s->n_tokens)
        return pt_error(PT_ERR_RANGE,
                        "%zu tokens do not fit in the context: %zu already held, context length %d "
                        "(raise --ctx, up to the model's maximum %d)",
                        n, s->n_tokens, s->n_ctx, s->m->net.max_ctx);
    return PT_OK;
}

/* Runs ids through the model chunk by chunk. out_all: NULL (keep only the
 * last position's logits in s->logits) or [n, V] host memory for every row. */
static pt_status run_tokens(pt_session *s, const int32_t *ids, size_t n, float *out_all) {
    if (!ids && n) return pt_error(PT_ERR_INVALID_ARG, "token ids are NULL");
    if (n == 0) return pt_error(PT_ERR_INVALID_ARG, "the prompt is empty (no tokens to process)");
    PT_TRY(pt_session_check_ids(s, ids, n));
    pt_model *m = s->m;
    int64_t V = m->net.vocab;
    pt_status st = PT_OK;
    s->rows_ahead = 0; /* rows ahead (pt_session_rows_ahead) are dropped: this call writes those positions */
    if (s->ahead) {
        /* pt_session_sample_ahead enqueued the step of ahead_id at position
         * n_tokens: this one id takes it as it is; anything else drops it */
        s->ahead = 0;
        if (n == 1 && !out_all && ids[0] == s->ahead_id) {
            pthread_mutex_lock(&m->lock);
            st = pt_fwd_ahead_accept(m, &s->fwd, (int)s->n_tokens);
            pthread_mutex_unlock(&m->lock);
            if (st != PT_OK) {
                s->has_logits = s->logits_dev = 0;
                return st;
            }
            pt_session_hist_changed(s, s->n_tokens, 1);
            s->tokens[s->n_tokens++] = ids[0];
            s->has_logits = 1;
            s->logits_dev = 1; /* only GPU-sampling sessions step ahead */
            s->ahead_taken++;
            return PT_OK;
        }
    }
    pthread_mutex_lock(&m->lock);
    size_t done = 0;
    while (done < n) {
        int T = (int)(n - done < (size_t)s->fwd.chunk ? n - done : (size_t)s->fwd.chunk);
        int last = done + (size_t)T == n;
        int n_logits = out_all ? T : last ? 1 : 0;
        /* GPU sampling: the last logits stay on the device (dst NULL) */
        float *dst = out_all ? out_all + done * V : s->gpu ? NULL : s->logits;
        st = pt_fwd_run(m, &s->fwd, ids + done, T, (int)(s->n_tokens + done), n_logits, dst);
        if (st != PT_OK) break;
        pt_session_hist_changed(s, s->n_tokens + done, (size_t)T);
        memcpy(s->tokens + s->n_tokens + done, ids + done, (size_t)T * sizeof *ids);
        done += (size_t)T;
    }
    pthread_mutex_unlock(&m->lock);
    /* a failed chunk leaves the cache holding the chunks before it */
    s->n_tokens += done;
    if (st != PT_OK) {
        s->has_logits = s->logits_dev = 0;
        return st;
    }
    if (out_all) memcpy(s->logits, out_all + (n - 1) * V, (size_t)V * sizeof(float));
    s->has_logits = 1;
    s->logits_dev = !out_all && s->gpu;
    return PT_OK;
}

pt_status pt_session_prompt(pt_session *s, const int32_t *ids, size_t n_ids) {
    if (!s) return pt_error(PT_ERR_INVALID_ARG, "pt_session_prompt: session is NULL");
    return run_tokens(s, ids, n_ids, NULL);
}

pt_status pt_session_sync(pt_session *s) {
    if (!s) return pt_error(PT_ERR_INVALID_ARG, "pt_session_sync: session is NULL");
    pt_model *m = s->m;
    pthread_mutex_lock(&m->lock);
    pt_status st = m->be->ops->sync(m->be);
    pthread_mutex_unlock(&m->lock);
    return st;
}

pt_status pt_session_eval_logits(pt_session *s, const int32_t *ids, size_t n_ids, float *out) {
    if (!s || !out) return pt_error(PT_ERR_INVALID_ARG, "pt_session_eval_logits: NULL argument");
    return run_tokens(s, ids, n_ids, out);
}

void pt_session_hist_changed(pt_session *s, size_t at, size_t n) {
    if (n > 0 && at < s->hist_dev_n) s->hist_dev_n = at;
}

/* Makes s->logits current (downloads the device copy GPU sampling left). */
static pt_status host_logits(pt_session *s) {
    if (!s->logits_dev) return PT_OK;
    pt_model *m = s->m;
    pthread_mutex_lock(&m->lock);
    pt_status st = m->be->ops->download(m->be, s->logits, s->fwd.logits, (size_t)m->net.vocab * sizeof(float));
    pthread_mutex_unlock(&m->lock);
    if (st == PT_OK) s->logits_dev = 0;
    return st;
}

const float *pt_session_logits(const pt_session *s) {
    if (!s || !s->has_logits) return NULL;
    /* the session is logically unchanged: only its host copy is refreshed */
    if (host_logits((pt_session *)s) != PT_OK) return NULL;
    return s->logits;
}

/* The GPU sampler's row for session s under sp (validated), with the draw
 * taken from the session's stream (*u; -1 when greedy). 0: s cannot sample
 * this on the GPU (logits on the host, top-n logprobs). */
int pt_session_gpu_row(pt_session *s, const pt_sampling_params *sp, pt_gsample_row *row, double *u) {
    if (!s->logits_dev || sp->n_logprobs != 0) return 0;
    const int pen = sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
    if (pen && s->hist_dev_n < s->n_tokens) {
        /* the penalties' window: upload the tokens the device copy lacks
         * (on failure the host samples this row) */
        pt_backend *be = s->m->be;
        pthread_mutex_lock(&s->m->lock);
        pt_status st = be->ops->upload(be, s->hist_dev + s->hist_dev_n, s->tokens + s->hist_dev_n,
                                       (s->n_tokens - s->hist_dev_n) * sizeof *s->tokens);
        pthread_mutex_unlock(&s->m->lock);
        if (st != PT_OK) return 0;
        s->hist_dev_n = s->n_tokens;
    }
    if (!s->sampler.seeded || s->sampler.seed != sp->seed) pt_sampler_seed(&s->sampler, sp->seed);
    const int greedy = pt_sampling_is_greedy(sp);
    *u = greedy ? -1.0 : pt_sampler_uniform(&s->sampler);
    memset(row, 0, sizeof *row);
    row->logits = s->fwd.logits;
    row->work = s->work_dev;
    row->counts = s->counts_dev;
    row->hist = s->hist_dev;
    if (pen && s->n_tokens > 0) {
        row->n_hist = (int64_t)s->n_tokens;
        row->window = sp->repeat_last_n > 0 && (size_t)sp->repeat_last_n < s->n_tokens ? sp->repeat_last_n
                                                                                       : (int64_t)s->n_tokens;
    }
    row->u = greedy ? 0.0 : *u;
    row->temperature = sp->temperature;
    row->top_p = sp->top_p;
    row->min_p = sp->min_p;
    row->rep = sp->repetition_penalty;
    row->presence = sp->presence_penalty;
    row->frequency = sp->frequency_penalty;
    row->top_k = sp->top_k;
    row->greedy = greedy;
    row->want_logprob = !sp->no_logprob;
    return 1;
}

/* A GPU result into out, or the host sampler with the same draw for a row
 * the GPU handed back. */
pt_status pt_session_gpu_result(pt_session *s, const pt_sampling_params *sp, const pt_gsample_out *o, double u,
                            pt_token_info *out) {
    if (o->status == 0) {
        memset(out, 0, sizeof *out);
        out->id = o->id;
        out->logprob = o->logprob;
        return PT_OK;
    }
    PT_TRY(host_logits(s));
    return pt_sampler_sample_u(&s->sampler, s->logits, sp, s->tokens, s->n_tokens, NULL, u, out);
}

pt_status pt_session_sample(pt_session *s, const pt_sampling_params *sp, const uint8_t *allowed,
                            pt_token_info *out) {
    if (!s || !sp || !out) return pt_error(PT_ERR_INVALID_ARG, "pt_session_sample: NULL argument");
    if (!s->has_logits)
        return pt_error(PT_ERR_INVALID_ARG, "pt_session_sample: no logits yet (prompt the session first)");
    s->ahead = 0; /* a step ahead is dropped (pt_session_sample_ahead) */
    if (!s->sampler.seeded || s->sampler.seed != sp->seed) pt_sampler_seed(&s->sampler, sp->seed);
    pt_gsample_row row;
    double u;
    if (!allowed && pt_sampling_validate(sp) == PT_OK && pt_session_gpu_row(s, sp, &row, &u)) {
        /* GPU sampling: the draw from the session's stream first (the host
         * fallback reuses it), then one launch, 16 bytes back */
        pt_model *m = s->m;
        pt_gsample_out o;
        /* a greedy loop without penalties repeats its row: no upload then */
        const int same = s->last_row_ok && !memcmp(&row, &s->last_row, sizeof row);
        pthread_mutex_lock(&m->lock);
        pt_status st = pt_cuda_sample_rows(m->be, &row, 1, m->net.vocab, s->ctl_dev, same, &o);
        pthread_mutex_unlock(&m->lock);
        s->last_row = row;
        s->last_row_ok = st == PT_OK;
        PT_TRY(st);
        return pt_session_gpu_result(s, sp, &o, u, out);
    }
    PT_TRY(host_logits(s));
    return pt_sampler_sample(&s->sampler, s->logits, sp, s->tokens, s->n_tokens, allowed, out);
}

void pt_session_sample_gpu_rows(pt_session *const *ss, const pt_sampling_params *const *sps, pt_token_info *outs,
                                pt_status *sts, char (*errs)[512], uint8_t *done, int n) {
    enum { MAXR = 64 };
    pt_gsample_row rows[MAXR];
    pt_gsample_out go[MAXR];
    double us[MAXR];
    int idx[MAXR], B = 0;
    for (int i = 0; i < n; i++) done[i] = 0;
    pt_model *m = n > 0 && ss[0] ? ss[0]->m : NULL;
    if (n < 2 || !m) return; /* one row: pt_session_sample is the same launch */
    for (int i = 0; i < n && B < MAXR; i++) {
        pt_session *s = ss[i];
        if (!s || s->m != m || !s->has_logits || pt_sampling_validate(sps[i]) != PT_OK) continue;
        s->ahead = 0; /* a step ahead is dropped (pt_session_sample_ahead) */
        if (!pt_session_gpu_row(s, sps[i], &rows[B], &us[B])) continue;
        idx[B++] = i;
    }
    if (B == 0) return;
    /* the table lives in the model's batch state: found and used under the
     * lock (a batched step may reallocate it); before the first batched
     * step, each row through its own session's table */
    pt_status st = PT_OK;
    pthread_mutex_lock(&m->lock);
    void *ctl = pt_batch_sample_ctl(m, B);
    if (ctl) {
        st = pt_cuda_sample_rows(m->be, rows, B, m->net.vocab, ctl, 0, go);
    } else {
        for (int b = 0; b < B && st == PT_OK; b++) {
            pt_session *s = ss[idx[b]];
            st = pt_cuda_sample_rows(m->be, &rows[b], 1, m->net.vocab, s->ctl_dev, 0, &go[b]);
            s->last_row = rows[b];
            s->last_row_ok = st == PT_OK;
        }
    }
    pthread_mutex_unlock(&m->lock);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st == PT_OK ? "" : pt_last_error());
    for (int b = 0; b < B; b++) {
        const int i = idx[b];
        done[i] = 1;
        sts[i] = st == PT_OK ? pt_session_gpu_result(ss[i], sps[i], &go[b], us[b], &outs[i]) : st;
        if (sts[i] != PT_OK) snprintf(errs[i], sizeof errs[i], "%s", st == PT_OK ? pt_last_error() : msg);
    }
}

int pt_pipeline_on(void) {
    const char *e = getenv("PETREL_CUDA_PIPELINE");
    return !(e && !strcmp(e, "0"));
}

int pt_step_sample_on(void) {
    const char *e = getenv("PETREL_CUDA_STEP_SAMPLE");
    return e && !strcmp(e, "1");
}

pt_status pt_session_sample_ahead(pt_session *s, const pt_sampling_params *sp, pt_token_info *out) {
    if (!s || !sp || !out) return pt_error(PT_ERR_INVALID_ARG, "pt_session_sample_ahead: NULL argument");
    s->ahead = 0;
    s->rows_ahead = 0; /* the step below writes the position rows ahead would hold */
    pt_model *m = s->m;
    const int pos = (int)s->n_tokens;
    if (!s->gpu || !s->has_logits || !s->logits_dev || sp->n_logprobs != 0 || !pt_pipeline_on() ||
        pt_sampling_validate(sp) != PT_OK || !pt_fwd_ahead_ok(m, &s->fwd, pos))
        return pt_session_sample(s, sp, NULL, out);
    if (!s->pipe && pt_gsample_pipe_create(m->be, &s->pipe) != PT_OK) {
        pt_clear_error();
        return pt_session_sample(s, sp, NULL, out);
    }
    pt_gsample_row row;
    double u;
    if (!pt_session_gpu_row(s, sp, &row, &u)) return pt_session_sample(s, sp, NULL, out);
    row.id_slot = s->fwd.ids_dev; /* the id the step below embeds */
    /* a greedy row without penalties or a log-probability: the step below
     * samples its own logits at its end (the same kernels, so the same id),
     * and when the step these logits came from did so, its id is already
     * in ids_dev[0] and the next position in pos_dev[0]: only its result
     * comes back (PETREL_CUDA_STEP_SAMPLE=1; by default the sampler runs
     * after each step: bench/RESULTS.md) */
    const int in_step = row.greedy && row.window == 0 && !row.want_logprob && pt_step_sample_on();
    const int sampled = in_step && s->fwd.sampled;
    const int same = s->last_row_ok && !memcmp(&row, &s->last_row, sizeof row);
    pt_gsample_out o;
    pthread_mutex_lock(&m->lock);
    /* on the stream, in order: position, sample (id into ids_dev[0]), the
     * result's copy back, the step; then the host waits for the result only */
    pt_status st = sampled ? pt_cuda_sample_sampled_enqueue(m->be, s->pipe, s->fwd.gs_ctl, pos - 1)
                           : pt_cuda_sample_enqueue(m->be, s->pipe, &row, m->net.vocab, s->ctl_dev, same,
                                                    s->fwd.pos_dev, pos);
    pt_status st_step = st == PT_OK ? pt_fwd_ahead_enqueue(m, &s->fwd, pos, in_step) : PT_OK;
    char msg[512] = "";
    if (st_step != PT_OK) snprintf(msg, sizeof msg, "%s", pt_last_error());
    if (st == PT_OK) st = pt_cuda_sample_wait(m->be, s->pipe, &o);
    pthread_mutex_unlock(&m->lock);
    if (!sampled) { /* the row table in ctl_dev */
        s->last_row = row;
        s->last_row_ok = st == PT_OK;
    }
    s->step_sampled += sampled && st == PT_OK;
    PT_TRY(st);
    if (st_step != PT_OK) return pt_error(st_step, "%s", msg);
    /* status 1: the host samples this row, and the step ran on a stale id */
    s->ahead = o.status == 0;
    s->ahead_id = o.id;
    return pt_session_gpu_result(s, sp, &o, u, out);
}
