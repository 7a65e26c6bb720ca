/* The batched decode step (runtime/batch.h) and pt_session_decode_batch.
 *
 * The pass itself is the model's forward pass (src/model/forward.c) over
 * rows that are each the next token of a different session; this file owns
 * the step's state (struct batch, one per model in m->batch: activation
 * buffers, the rows' cache table, the CUDA graphs) and the public entry
 * point's checks and session bookkeeping.
 *
 * Two ways to run a step:
 *   - table mode (the backend has the multi-sequence ops kv_append_rows /
 *     attention_rows, and every row's caches are full precision of one
 *     shape): the rows' K/V storage pointers go to backend memory as a table
 *     [n_layers][n][2], and KV append + attention are one op per layer over
 *     all rows. On CUDA with --compiled-decode the whole step (embedding to
 *     logits) is captured once per batch-size bucket (1, 2, 4, ... rows)
 *     into a CUDA graph and replayed: a step of n sessions runs the graph of
 *     the smallest bucket >= n with the extra rows as padding (id 0,
 *     position -1: they write no cache and their logits are dropped), after
 *     uploading the ids, positions and cache table. Since every op reads
 *     those from device memory, one graph serves any sessions;
 *   - row mode (otherwise: quantized KV caches, caches of different shapes,
 *     a backend without the ops): the per-sequence ops run row by row on
 *     each row's own caches (pt_fwd_run_rows).
 *
 * Batch invariance rests on three facts (tests/test_batch.c and
 * tests/cuda/test_cuda_batch.c check the result bit for bit):
 *   - matmuls go through the backend's matmul_rows, whose row t equals the
 *     T = 1 matmul bit for bit (falling back to T = 1 matmul calls when a
 *     backend has no matmul_rows);
 *   - every other per-token op computes each row (element) with code that
 *     does not depend on the number of rows (backend.h "Determinism"), so
 *     padding rows change nothing for the others;
 *   - per-sequence ops compute each row exactly as the single-session
 *     T = 1 calls do (the multi-sequence ops promise it; row mode makes
 *     those calls). */
#include "runtime/batch.h"

#include "backend/cuda/cuda.h"
#include "backend/cuda/sample.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/kv_cache.h"
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->be->ops)
/* Graph buckets: 2^k rows for k < BUCKETS (up to 2^15 rows). */
#define BUCKETS 16

typedef struct batch {
    pt_fwd_state st;   /* activation buffers for `cap` rows (its own KV cache is never used) */
    int cap;
    float *logits;     /* backend memory [cap, V]: every row's logits of a table-mode step */
    void **kvp_dev;    /* backend memory [n_layers · cap · 2]: the cache table, laid out [L][n][2] for n rows */
    void **kvp_host;   /* host mirror */
    int32_t *ids_host, *pos_host; /* [cap] */
    pt_fwd_state **seq;           /* [cap] rows' states (NULL: padding) */
    /* CUDA graphs of the table-mode step, one per bucket, valid while the
     * backend's scratch generation and the cache shapes they were captured
     * with hold (graph_gen, sig_*). */
    pt_cuda_graph *graph[BUCKETS];
    uint64_t graph_gen;
    int64_t *sig_cap;  /* [n_layers] cache capacity per layer */
    int *sig_dtype;    /* [n_layers] */
    int no_table;      /* the multi-sequence ops refused this model's shapes: row mode from now on */
    int no_graph;      /* capturing failed once: table mode runs eagerly from now on */
    int force_pad;     /* tests: pad to buckets without graphs (pt_batch_set_padding) */
    int64_t n_graph, n_table, n_row; /* steps run from a graph, table mode eagerly, row mode */
    void *sample_ctl;  /* backend: GPU sampling's row table for sample_cap rows (the server's turn) */
    int sample_cap;
} batch;

static void drop_graphs(batch *b) {
    for (int k = 0; k < BUCKETS; k++) pt_cuda_graph_free(&b->graph[k]);
}

void pt_batch_free(pt_model *m) {
    batch *b = m->batch;
    if (!b) return;
    drop_graphs(b);
    if (b->sample_ctl) OPS(m)->dealloc(m->be, b->sample_ctl);
    if (b->logits) OPS(m)->dealloc(m->be, b->logits);
    if (b->kvp_dev) OPS(m)->dealloc(m->be, b->kvp_dev);
    free(b->kvp_host);
    free(b->ids_host);
    free(b->pos_host);
    free(b->seq);
    free(b->sig_cap);
    free(b->sig_dtype);
    pt_fwd_free(m, &b->st);
    free(b);
    m->batch = NULL;
}

/* Makes m->batch a state whose buffers hold at least B rows (a power of
 * two, at least 8, so a server's growing batch reallocates rarely). */
static pt_status state_reserve(pt_model *m, int B) {
    batch *b = m->batch;
    if (b && b->cap >= B) return PT_OK;
    int cap = 8;
    while (cap < B) cap *= 2;
    int force_pad = b ? b->force_pad : 0;
    if (b) pt_batch_free(m);
    b = calloc(1, sizeof *b);
    if (!b) return pt_error(PT_ERR_NOMEM, "out of memory for the batch state");
    b->force_pad = force_pad;
    pt_status s = pt_fwd_init(m, &b->st, cap);
    if (s != PT_OK) {
        free(b);
        return pt_error_prefix(s, "batch buffers for %d rows", cap);
    }
    b->cap = cap;
    m->batch = b;
    m->batch_free = pt_batch_free;
    const size_t L = (size_t)m->net.n_layers, V = (size_t)m->net.vocab;
    b->kvp_host = calloc(L * (size_t)cap * 2, sizeof(void *));
    b->ids_host = calloc((size_t)cap, sizeof(int32_t));
    b->pos_host = calloc((size_t)cap, sizeof(int32_t));
    b->seq = calloc((size_t)cap, sizeof *b->seq);
    b->sig_cap = calloc(L, sizeof *b->sig_cap);
    b->sig_dtype = calloc(L, sizeof *b->sig_dtype);
    if (!b->kvp_host || !b->ids_host || !b->pos_host || !b->seq || !b->sig_cap || !b->sig_dtype) {
        pt_batch_free(m);
        return pt_error(PT_ERR_NOMEM, "out of memory for the batch state");
    }
    if (OPS(m)->kv_append_rows && OPS(m)->attention_rows) {
        b->logits = OPS(m)->alloc(m->be, (size_t)cap * V * 4);
        b->kvp_dev = b->logits ? OPS(m)->alloc(m->be, L * (size_t)cap * 2 * sizeof(void *)) : NULL;
        if (!b->logits || !b->kvp_dev) {
            pt_batch_free(m);
            return pt_error_prefix(PT_ERR_NOMEM, "batch logits for %d rows", cap);
        }
        /* the multi-sequence attention's scratch for cap rows */
        pt_backend_limits lim = {0};
        lim.max_rows = cap;
        s = OPS(m)->reserve(m->be, &lim);
        if (s != PT_OK) {
            pt_batch_free(m);
            return pt_error_prefix(s, "batch scratch for %d rows", cap);
        }
    }
    return PT_OK;
}

/* Table mode applies when every row's caches are full precision and, layer
 * by layer, of row 0's shape. */
static int table_ok(const pt_model *m, pt_fwd_state *const *sts, int n) {
    if (!OPS(m)->kv_append_rows || !OPS(m)->attention_rows) return 0;
    for (int l = 0; l < m->net.n_layers; l++) {
        const pt_kv_layer *k0 = &sts[0]->kv[l];
        for (int t = 0; t < n; t++) {
            const pt_kv_layer *k = &sts[t]->kv[l];
            if (k->bits || k->capacity != k0->capacity || k->dtype != k0->dtype || k->n_kv != k0->n_kv ||
                k->head_dim != k0->head_dim)
                return 0;
        }
    }
    return 1;
}

/* CUDA graphs for the table-mode step: on the CUDA backend with compiled
 * decode on, no debug callbacks, and no longrope layer (its table choice
 * depends on host-side positions). */
static int graphs_ok(const pt_model *m, const batch *b) {
    if (b->no_graph || m->device != PT_DEVICE_CUDA || m->params.compiled_decode != PT_LEVER_ON || m->hidden_cb ||
        m->route_cb)
        return 0;
    for (int l = 0; l < m->net.n_layers; l++)
        if (m->net.layers[l].inv_freq_long) return 0;
    return 1;
}

/* Drops the graphs when what they baked in changed: the backend's scratch
 * buffers (reallocated when a larger session reserves) or the cache shapes
 * (which fix the attention's split). */
static void graphs_validate(pt_model *m, batch *b, pt_fwd_state *s0) {
    uint64_t gen = pt_cuda_scratch_gen(m->be);
    int same = gen == b->graph_gen;
    for (int l = 0; l < m->net.n_layers; l++) {
        if (b->sig_cap[l] != s0->kv[l].capacity || b->sig_dtype[l] != (int)s0->kv[l].dtype) same = 0;
        b->sig_cap[l] = s0->kv[l].capacity;
        b->sig_dtype[l] = (int)s0->kv[l].dtype;
    }
    if (!same) drop_graphs(b);
    b->graph_gen = gen;
}

/* One table-mode step of n (<= b->st.chunk) rows. PT_ERR_UNSUPPORTED: the
 * backend's multi-sequence ops do not take these shapes (nothing was
 * committed: no session's state changed; caches may hold this step's rows,
 * which a rerun rewrites with the same values). */
static pt_status step_table(pt_model *m, batch *b, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos,
                            int n, float *const *outs) {
    const int L = m->net.n_layers, V = m->net.vocab;
    const int use_graph = graphs_ok(m, b);
    int np = n, k = 0;
    if (use_graph || b->force_pad) { /* the bucket: the smallest power of two >= n, at most the chunk */
        while ((1 << k) < n) k++;
        np = 1 << k;
        if (np > b->st.chunk) np = n, k = -1;
    }
    for (int t = 0; t < np; t++) {
        const int live = t < n;
        b->ids_host[t] = live ? ids[t] : 0;
        b->pos_host[t] = live ? pos[t] : -1;
        b->seq[t] = live ? sts[t] : NULL;
        const pt_fwd_state *s = live ? sts[t] : sts[0]; /* padding rows point at row 0's caches, untouched */
        for (int l = 0; l < L; l++) {
            b->kvp_host[((size_t)l * np + t) * 2] = s->kv[l].k;
            b->kvp_host[((size_t)l * np + t) * 2 + 1] = s->kv[l].v;
        }
    }
    PT_TRY(OPS(m)->upload(m->be, b->st.ids_dev, b->ids_host, (size_t)np * 4));
    PT_TRY(OPS(m)->upload(m->be, b->st.pos_dev, b->pos_host, (size_t)np * 4));
    PT_TRY(OPS(m)->upload(m->be, b->kvp_dev, b->kvp_host, (size_t)L * np * 2 * sizeof(void *)));
    pt_fwd_rows r = {.n = np, .seq = b->seq, .pos = b->pos_host, .kvp = b->kvp_dev};
    int ran = 0;
    if (use_graph && k >= 0 && k < BUCKETS) {
        graphs_validate(m, b, sts[0]);
        if (!b->graph[k]) {
            PT_TRY(pt_cuda_graph_begin(m->be));
            pt_status s = pt_fwd_rows_enqueue(m, &b->st, &r, b->logits);
            char msg[512];
            snprintf(msg, sizeof msg, "%s", s == PT_OK ? "" : pt_last_error());
            pt_status e = pt_cuda_graph_end(m->be, &b->graph[k]);
            if (s != PT_OK) pt_cuda_graph_free(&b->graph[k]); /* a partial capture */
            if (s == PT_ERR_UNSUPPORTED) return pt_error(s, "%s", msg);
            if (s != PT_OK) return pt_error(s, "batched decode: capturing the step of %d rows: %s", np, msg);
            if (e != PT_OK) { /* the capture itself failed: run eagerly from now on */
                PT_LOGW("batched decode: no CUDA graph (%s); running the step eagerly", pt_last_error());
                b->no_graph = 1;
            }
        }
        if (b->graph[k]) {
            PT_TRY(pt_cuda_graph_launch(m->be, b->graph[k]));
            ran = 1;
            b->n_graph++;
        }
    }
    if (!ran) {
        PT_TRY(pt_fwd_rows_enqueue(m, &b->st, &r, b->logits));
        b->n_table++;
    }
    /* quantized KV: a cache reaching --quantized-kv-start converts (the
     * logits below do not read the caches) */
    for (int t = 0; t < n; t++) PT_TRY(pt_kv_cache_step_done(m, sts[t]->cache, sts[t]->kv, (int64_t)pos[t] + 1));
    for (int t = 0; t < n; t++) {
        if (outs[t])
            PT_TRY(OPS(m)->download(m->be, outs[t], b->logits + (size_t)t * V, (size_t)V * 4));
        else /* GPU sampling: the row's logits move to its session's device buffer (session.h) */
            PT_TRY(OPS(m)->copy_rows(m->be, sts[t]->logits, V, b->logits + (size_t)t * V, V, 1, V));
    }
    return PT_OK;
}

pt_status pt_batch_forward(pt_model *m, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos, int B,
                           float *const *outs) {
    if (B < 1) return pt_error(PT_ERR_INTERNAL, "batched forward: %d rows", B);
    if (!pt_fwd_rows_supported(m)) { /* Qwen3.5: one session at a time (same results, no weight sharing) */
        for (int i = 0; i < B; i++) PT_TRY(pt_fwd_run(m, sts[i], &ids[i], 1, pos[i], 1, outs[i]));
        return PT_OK;
    }
    PT_TRY(state_reserve(m, B));
    batch *b = m->batch;
    for (int i = 0; i < B; i++)
        if (pos[i] < 0 || pos[i] >= sts[i]->n_ctx)
            return pt_error(PT_ERR_INTERNAL, "batched forward: row %d at position %d of a %d-token context", i, pos[i],
                            sts[i]->n_ctx);
    /* the buffers hold st.chunk rows (fewer than B only when the prefill
     * chunk is set below B): larger batches run in parts */
    for (int i = 0; i < B; i += b->st.chunk) {
        int nb = B - i < b->st.chunk ? B - i : b->st.chunk;
        if (!b->no_table && table_ok(m, sts + i, nb)) {
            pt_status s = step_table(m, b, sts + i, ids + i, pos + i, nb, outs + i);
            if (s == PT_OK) continue;
            if (s != PT_ERR_UNSUPPORTED) return s;
            PT_LOGI("batched decode: %s; decoding row by row", pt_last_error());
            b->no_table = 1;
        }
        pt_fwd_rows r = {.n = nb, .seq = sts + i, .pos = pos + i, .kvp = NULL};
        PT_TRY(pt_fwd_run_rows(m, &b->st, &r, ids + i, outs + i));
        b->n_row++;
    }
    return PT_OK;
}

void *pt_batch_sample_ctl(pt_model *m, int B) {
    batch *b = m->batch;
    if (!b || B < 1) return NULL;
    if (b->sample_cap < B) {
        int cap = b->sample_cap ? b->sample_cap : 8;
        while (cap < B) cap *= 2;
        if (b->sample_ctl) OPS(m)->dealloc(m->be, b->sample_ctl);
        b->sample_ctl = OPS(m)->alloc(m->be, pt_gsample_ctl_bytes(cap));
        b->sample_cap = b->sample_ctl ? cap : 0;
    }
    return b->sample_ctl;
}

pt_status pt_batch_set_padding(pt_model *m, int on) {
    PT_TRY(state_reserve(m, 1));
    ((batch *)m->batch)->force_pad = on;
    return PT_OK;
}

void pt_batch_counts(const pt_model *m, int64_t counts[3]) {
    const batch *b = m->batch;
    counts[0] = b ? b->n_graph : 0;
    counts[1] = b ? b->n_table : 0;
    counts[2] = b ? b->n_row : 0;
}

pt_status pt_session_decode_batch(pt_session *const *sessions, const int32_t *ids, int n) {
    if (!sessions || !ids) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: NULL argument");
    if (n < 1) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: %d sessions (need at least 1)", n);
    pt_model *m = sessions[0] ? sessions[0]->m : NULL;
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        if (!s) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: session %d is NULL", i);
        if (s->m != m)
            return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: session %d belongs to another model", i);
        for (int j = 0; j < i; j++)
            if (sessions[j] == s)
                return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_batch: sessions %d and %d are the same session",
                                j, i);
        if (pt_session_check_ids(s, &ids[i], 1) != PT_OK)
            return pt_error_prefix(PT_ERR_RANGE, "pt_session_decode_batch: session %d", i);
    }
    /* small batches use the stack; larger ones one allocation per call */
    enum { SMALL = 16 };
    pt_fwd_state *sts_s[SMALL];
    float *outs_s[SMALL];
    int32_t pos_s[SMALL];
    pt_fwd_state **sts = sts_s;
    float **outs = outs_s;
    int32_t *pos = pos_s;
    void *heap = NULL;
    if (n > SMALL) {
        heap = malloc((size_t)n * (sizeof *sts + sizeof *outs + sizeof *pos));
        if (!heap) return pt_error(PT_ERR_NOMEM, "out of memory for a batch of %d sessions", n);
        sts = heap;
        outs = (float **)(sts + n);
        pos = (int32_t *)(outs + n);
    }
    for (int i = 0; i < n; i++) {
        sts[i] = &sessions[i]->fwd;
        outs[i] = sessions[i]->gpu ? NULL : sessions[i]->logits; /* GPU sampling: kept on the device */
        pos[i] = (int32_t)sessions[i]->n_tokens;
    }
    pthread_mutex_lock(&m->lock);
    pt_status st = pt_batch_forward(m, sts, ids, pos, n, outs);
    pthread_mutex_unlock(&m->lock);
    free(heap);
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        if (st == PT_OK) st = pt_session_hist_push(s, s->n_tokens, &ids[i], 1);
        if (st != PT_OK) {
            s->has_logits = s->logits_dev = 0;
            continue;
        }
        s->tokens[s->n_tokens++] = ids[i];
        s->has_logits = 1;
        s->logits_dev = s->gpu;
    }
    return st;
}
