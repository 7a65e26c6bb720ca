/* The batched decode step (runtime/batch.h), pt_session_decode_batch and
 * pt_session_decode_rows (prompt rows: several consecutive tokens of one
 * session as rows of the step, docs/batching.md "Prompt rows").
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
 *     logits) is captured once per batch-size bucket (1, 2, 4, ..., 32
 *     rows, then multiples of 32: bucket_of) and key class (key_class: the
 *     rows' largest key count within 128, 256, or any) into a CUDA graph and
 *     replayed: a step of n rows runs the graph of the smallest bucket >= n with the extra rows as padding (id 0,
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
/* Graph buckets (bucket_of): 1, 2, 4, ..., 32 rows, then every multiple of
 * 32 up to 32·(BUCKETS - 5) rows. Above 32 rows a power of two would pad a
 * step of 72 rows (64 decoding slots and 8 prompt rows) to 128, and every
 * padding row costs what a live one does; multiples of 32 keep the padding
 * below a third while the number of graphs stays small. */
#define BUCKETS 40
/* Key classes of a graph (key_class): 0 captured without a bound on the
 * rows' keys, 1 for steps whose rows hold at most PT_DEC_SHORT_KEYS keys, 2
 * at most half that; the attention picks its kernels by the bound
 * (pt_attn.max_keys: the one-launch short decode, with fewer warps a block
 * under the smaller one), never the bits. */
#define KEY_CLASSES 3

typedef struct batch {
    pt_fwd_state st;   /* activation buffers for `cap` rows (its own KV cache is never used) */
    int cap;
    float *logits;     /* backend memory [cap, V]: every row's logits of a table-mode step */
    void **kvp_dev;    /* backend memory [n_layers · cap · 2]: the cache table, laid out [L][n][2] for n rows */
    void **kvp_host;   /* host mirror */
    int32_t *ids_host, *pos_host; /* [cap] */
    pt_fwd_state **seq;           /* [cap] rows' states (NULL: padding) */
    /* CUDA graphs of the table-mode step, one per key class and bucket, valid while the
     * backend's scratch generation and the cache shapes they were captured
     * with hold (graph_gen, sig_*). */
    pt_cuda_graph *graph[KEY_CLASSES][BUCKETS];
    uint64_t graph_gen;
    int64_t *sig_cap;  /* [n_layers] cache capacity per layer */
    int *sig_dtype;    /* [n_layers] */
    int no_table;      /* the multi-sequence ops refused this model's shapes: row mode from now on */
    int no_graph;      /* capturing failed once: table mode runs eagerly from now on */
    int force_pad;     /* tests: pad to buckets without graphs (pt_batch_set_padding) */
    int64_t n_graph, n_table, n_row; /* steps run from a graph, table mode eagerly, row mode */
    void *sample_ctl;  /* backend: GPU sampling's row table for sample_cap rows (the server's turn) */
    int sample_cap;
    /* The pipelined turn (pt_session_rows_ahead): */
    uint64_t gen;      /* steps run so far (carried over a reallocation): rows ahead are valid while it holds */
    pt_gsample_pipe *pipe; /* pinned memory and event of its sample; NULL until first used */
} batch;

/* A step run ahead (step_table): its rows' logits stay in b->logits (a later
 * step that takes the rows copies them out); rows[0..B) are sampled on the
 * GPU after the step's tables are uploaded and before the step, each into
 * its id's slot of the table (B = 0: every id is known). */
typedef struct ahead {
    const pt_gsample_row *rows;
    int B;
} ahead;

/* The bucket of a step of n rows: its index into batch.graph (-1: larger
 * than every bucket) and its row count in *rows (n when -1). */
static int bucket_of(int n, int *rows) {
    if (n <= 32) {
        int k = 0;
        while ((1 << k) < n) k++;
        *rows = 1 << k;
        return k;
    }
    int k = 5 + (n + 31) / 32 - 1;
    if (k >= BUCKETS) {
        *rows = n;
        return -1;
    }
    *rows = (n + 31) / 32 * 32;
    return k;
}

/* The key class of a step whose live rows' largest position is pmax, and
 * the bound its graph is captured with in *bound (-1: none). */
static int key_class(int64_t pmax, int64_t *bound) {
    int kc = 0;
    while (kc + 1 < KEY_CLASSES && pmax + 1 <= (PT_DEC_SHORT_KEYS >> kc)) kc++;
    *bound = kc ? PT_DEC_SHORT_KEYS >> (kc - 1) : -1;
    return kc;
}

static void drop_graphs(batch *b) {
    for (int c = 0; c < KEY_CLASSES; c++)
        for (int k = 0; k < BUCKETS; k++) pt_cuda_graph_free(&b->graph[c][k]);
}

void pt_batch_free(pt_model *m) {
    batch *b = m->batch;
    if (!b) return;
    drop_graphs(b);
    pt_gsample_pipe_free(m->be, &b->pipe);
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
    const uint64_t gen = b ? b->gen + 1 : 1; /* rows ahead in the old buffers are not taken */
    if (b) pt_batch_free(m);
    b = calloc(1, sizeof *b);
    if (!b) return pt_error(PT_ERR_NOMEM, "out of memory for the batch state");
    b->force_pad = force_pad;
    b->gen = gen;
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

/* Rows of a step's logits on their way out of b->logits: to host memory
 * (a download each) or to a session's device buffer, the latter gathered
 * into one launch per 64 rows where the backend can (copy_rows_to). */
enum { LOGITS_BATCH = 64 };
typedef struct logits_out {
    float *dst[LOGITS_BATCH];
    const float *src[LOGITS_BATCH];
    int n;
} logits_out;

static pt_status logits_flush(pt_model *m, logits_out *lo) {
    const int n = lo->n;
    lo->n = 0;
    return n ? OPS(m)->copy_rows_to(m->be, lo->dst, lo->src, n, m->net.vocab) : PT_OK;
}

/* One row, src (backend memory [V]) into host (when set) or dev. */
static pt_status logits_row(pt_model *m, logits_out *lo, float *host, float *dev, const float *src) {
    const int64_t V = m->net.vocab;
    if (host) return OPS(m)->download(m->be, host, src, (size_t)V * 4);
    if (!OPS(m)->copy_rows_to) return OPS(m)->copy_rows(m->be, dev, V, src, V, 1, V);
    lo->dst[lo->n] = dev, lo->src[lo->n] = src;
    return ++lo->n == LOGITS_BATCH ? logits_flush(m, lo) : PT_OK;
}

/* One table-mode step of n (<= b->st.chunk) rows. PT_ERR_UNSUPPORTED: the
 * backend's multi-sequence ops do not take these shapes (nothing was
 * committed: no session's state changed; caches may hold this step's rows,
 * which a rerun rewrites with the same values). */
static pt_status step_table(pt_model *m, batch *b, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos,
                            int n, float *const *outs, const uint8_t *need, const ahead *ah) {
    const int L = m->net.n_layers, V = m->net.vocab;
    b->gen++;
    const int use_graph = graphs_ok(m, b);
    int np = n, k = 0;
    if (use_graph || b->force_pad) { /* the bucket: the smallest one >= n, at most the chunk */
        k = bucket_of(n, &np);
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
    /* the sampled ids land in the table just uploaded, before the step reads it */
    if (ah && ah->B) {
        if (!b->pipe) PT_TRY(pt_gsample_pipe_create(m->be, &b->pipe));
        PT_TRY(pt_cuda_sample_rows_enqueue(m->be, b->pipe, ah->rows, ah->B, V, b->sample_ctl));
    }
    int ran = 0;
    if (use_graph && k >= 0 && k < BUCKETS) {
        graphs_validate(m, b, sts[0]);
        int64_t pmax = -1, bound;
        for (int t = 0; t < n; t++)
            if (pos[t] > pmax) pmax = pos[t];
        pt_cuda_graph **g = &b->graph[key_class(pmax, &bound)][k];
        if (!*g) {
            PT_TRY(pt_cuda_graph_begin(m->be));
            b->st.keys_bound = bound; /* every step this graph replays is within it */
            pt_status s = pt_fwd_rows_enqueue(m, &b->st, &r, b->logits);
            b->st.keys_bound = 0;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", s == PT_OK ? "" : pt_last_error());
            pt_status e = pt_cuda_graph_end(m->be, g);
            if (s != PT_OK) pt_cuda_graph_free(g); /* a partial capture */
            if (s == PT_ERR_UNSUPPORTED) return pt_error(s, "%s", msg);
            if (s != PT_OK) return pt_error(s, "batched decode: capturing the step of %d rows: %s", np, msg);
            if (e != PT_OK) { /* the capture itself failed: run eagerly from now on */
                PT_LOGW("batched decode: no CUDA graph (%s); running the step eagerly", pt_last_error());
                b->no_graph = 1;
            }
        }
        if (*g) {
            PT_TRY(pt_cuda_graph_launch(m->be, *g));
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
    for (int t = 0; t < n; t++) {
        PT_TRY(pt_kv_cache_step_done(m, sts[t]->cache, sts[t]->kv, (int64_t)pos[t] + 1));
        sts[t]->sampled = sts[t]->ahead_sampled = 0; /* model.h: the rows' states moved on */
    }
    if (ah) return PT_OK; /* the logits stay in b->logits (take_ahead) */
    /* GPU sampling: the rows' logits move to their sessions' device
     * buffers (session.h) */
    logits_out lo = {.n = 0};
    for (int t = 0; t < n; t++) {
        if (need && !need[t]) continue; /* a prompt row before its session's last: nobody reads its logits */
        PT_TRY(logits_row(m, &lo, outs[t], sts[t]->logits, b->logits + (size_t)t * V));
    }
    return logits_flush(m, &lo);
}

pt_status pt_batch_forward(pt_model *m, pt_fwd_state *const *sts, const int32_t *ids, const int32_t *pos, int B,
                           float *const *outs, const uint8_t *need) {
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
            pt_status s = step_table(m, b, sts + i, ids + i, pos + i, nb, outs + i, need ? need + i : NULL, NULL);
            if (s == PT_OK) continue;
            if (s != PT_ERR_UNSUPPORTED) return s;
            PT_LOGI("batched decode: %s; decoding row by row", pt_last_error());
            b->no_table = 1;
        }
        pt_fwd_rows r = {.n = nb, .seq = sts + i, .pos = pos + i, .kvp = NULL};
        b->gen++;
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

/* Checks shared by the two entry points: every session non-NULL, of one
 * model, distinct, with room for its counts[i] ids (PT_ERR_INVALID_ARG /
 * PT_ERR_RANGE naming the index). */
static pt_status check_sessions(const char *fn, pt_session *const *sessions, const int32_t *ids, const int *counts,
                                int n) {
    if (!sessions || !ids) return pt_error(PT_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (n < 1) return pt_error(PT_ERR_INVALID_ARG, "%s: %d sessions (need at least 1)", fn, n);
    pt_model *m = sessions[0] ? sessions[0]->m : NULL;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        if (!s) return pt_error(PT_ERR_INVALID_ARG, "%s: session %d is NULL", fn, i);
        if (s->m != m) return pt_error(PT_ERR_INVALID_ARG, "%s: session %d belongs to another model", fn, i);
        for (int j = 0; j < i; j++)
            if (sessions[j] == s)
                return pt_error(PT_ERR_INVALID_ARG, "%s: sessions %d and %d are the same session", fn, j, i);
        const int c = counts ? counts[i] : 1;
        if (c < 1) return pt_error(PT_ERR_INVALID_ARG, "%s: session %d is given %d tokens (need at least 1)", fn, i, c);
        if (pt_session_check_ids(s, ids + off, (size_t)c) != PT_OK) return pt_error_prefix(PT_ERR_RANGE, "%s: session %d", fn, i);
        off += (size_t)c;
    }
    return PT_OK;
}

/* How many of its next `want` rows session s may run in one step. Alone,
 * its caches convert to quantized KV right after the token that fills them
 * to --quantized-kv-start, and the tokens after it read the quantized rows;
 * so the rows of one step must not cross that point (only the step's last
 * row may reach it). */
static int rows_allowed(const pt_session *s, size_t at, int want) {
    const pt_kv_cache *c = s->fwd.cache;
    if (!c || !c->any_quant || c->converted) return want;
    int64_t room = (int64_t)c->start - (int64_t)at; /* rows before the one that converts, plus it */
    if (room < 1) room = 1;
    return room < want ? (int)room : want;
}

/* The step(s) behind both entry points (arguments checked): session i runs
 * counts[i] tokens (ids concatenated session by session) as rows at its next
 * positions; only each session's last row keeps its logits. Usually one
 * pt_batch_forward call; more only where a quantized-KV conversion falls
 * inside a session's rows (rows_allowed). */
static pt_status run_rows(pt_session *const *sessions, const int32_t *ids, const int *counts, int n) {
    pt_model *m = sessions[0]->m;
    int R = 0;
    for (int i = 0; i < n; i++) R += counts ? counts[i] : 1;
    /* small steps use the stack; larger ones one allocation per call */
    enum { SMALL = 16 };
    pt_fwd_state *sts_s[SMALL];
    float *outs_s[SMALL];
    int32_t pos_s[SMALL], ids_s[SMALL], done_s[SMALL];
    uint8_t need_s[SMALL];
    pt_fwd_state **sts = sts_s;
    float **outs = outs_s;
    int32_t *pos = pos_s, *rid = ids_s, *done = done_s; /* done: [n] rows of session i run so far */
    uint8_t *need = need_s;
    void *heap = NULL;
    if (R > SMALL || n > SMALL) {
        const size_t N = (size_t)(R > n ? R : n);
        heap = malloc(N * (sizeof *sts + sizeof *outs + 3 * sizeof(int32_t) + 1));
        if (!heap) return pt_error(PT_ERR_NOMEM, "out of memory for a step of %d rows", R);
        sts = heap;
        outs = (float **)(sts + N);
        pos = (int32_t *)(outs + N);
        rid = pos + N;
        done = rid + N;
        need = (uint8_t *)(done + N);
    }
    for (int i = 0; i < n; i++) done[i] = 0;
    pt_status st = PT_OK;
    pthread_mutex_lock(&m->lock);
    for (int left = R; st == PT_OK && left > 0;) {
        int nr = 0;
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            pt_session *s = sessions[i];
            const int c = counts ? counts[i] : 1;
            const int k = rows_allowed(s, s->n_tokens + (size_t)done[i], c - done[i]);
            for (int j = 0; j < k; j++) {
                sts[nr] = &s->fwd;
                /* every row of a session writes to the session's logits; only
                 * the last one's are kept (need), and in row mode, where every
                 * row is written, rows run in order so the last one wins */
                outs[nr] = s->gpu ? NULL : s->logits; /* GPU sampling: kept on the device */
                pos[nr] = (int32_t)(s->n_tokens + (size_t)done[i] + (size_t)j);
                rid[nr] = ids[off + (size_t)done[i] + (size_t)j];
                need[nr] = done[i] + j == c - 1;
                nr++;
            }
            off += (size_t)c;
            done[i] += k;
        }
        /* more than one part only when a conversion fell inside some
         * session's rows: the next part continues after it */
        st = pt_batch_forward(m, sts, rid, pos, nr, outs, need);
        left -= nr;
    }
    pthread_mutex_unlock(&m->lock);
    free(heap);
    return st;
}

/* After run_rows: the tokens join each session's context (or, on failure,
 * no session advances and every one loses its logits). */
static pt_status commit_rows(pt_session *const *sessions, const int32_t *ids, const int *counts, int n, pt_status st) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        const size_t c = (size_t)(counts ? counts[i] : 1);
        if (st != PT_OK) {
            s->has_logits = s->logits_dev = 0;
            continue;
        }
        pt_session_hist_changed(s, s->n_tokens, c);
        memcpy(s->tokens + s->n_tokens, ids + off, c * sizeof *ids);
        s->n_tokens += c;
        s->has_logits = 1;
        s->logits_dev = s->gpu;
        off += c;
    }
    return st;
}

/* pt_session_rows_ahead's checks, before anything is drawn or run (m->lock
 * held): the batch state holds the step's R rows in one table-mode part
 * (the only form that keeps every row's logits in b->logits), no cache
 * converts to quantized KV, and no row overwrites a rotating cache's slot
 * still in the context. */
static pt_status ahead_ok(pt_model *m, pt_fwd_state *const *sts, const int32_t *pos, int R) {
    PT_TRY(state_reserve(m, R));
    batch *b = m->batch;
    if (b->no_table || R > b->st.chunk || !table_ok(m, sts, R))
        return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: the rows do not run as one table-mode step");
    for (int t = 0; t < R; t++) {
        const pt_fwd_state *st = sts[t];
        if (st->cache && st->cache->any_quant)
            return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: a session converts to quantized KV");
        for (int l = 0; l < m->net.n_layers; l++)
            if (st->kv[l].k && st->kv[l].capacity < st->n_ctx && pos[t] >= st->kv[l].capacity)
                return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: a rotating cache has wrapped");
    }
    return PT_OK;
}

pt_status pt_session_rows_ahead(pt_session *const *dec, const pt_sampling_params *const *sps, const uint8_t *norow,
                                int nd, pt_session *const *prs, const int32_t *pids, const int *pcnt, int np,
                                pt_token_info *outs, pt_status *sts, char (*errs)[512], uint8_t *held) {
    enum { MAXS = 64 };
    if (nd < 1 || np < 0 || nd + np > MAXS || !dec || !sps || !outs || !sts || !errs || !held ||
        (np && (!prs || !pids || !pcnt)))
        return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: bad call (%d + %d sessions)", nd, np);
    pt_model *m = dec[0] ? dec[0]->m : NULL;
    if (!m || !pt_fwd_rows_supported(m)) return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: no batched rows");
    /* the step's rows: decode rows (norow: sampled, not run) then prompt rows */
    pt_fwd_state *rs[2 * MAXS + 256];
    int32_t rid[2 * MAXS + 256], rpos[2 * MAXS + 256];
    int R = 0;
    for (int i = 0; i < nd + np; i++) {
        pt_session *s = i < nd ? dec[i] : prs[i - nd];
        if (!s || s->m != m) return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: sessions of several models");
        for (int j = 0; j < i; j++)
            if ((j < nd ? dec[j] : prs[j - nd]) == s)
                return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: a session twice");
    }
    size_t off = 0;
    for (int i = 0; i < nd; i++) {
        pt_session *s = dec[i];
        if (!s->has_logits || pt_sampling_validate(sps[i]) != PT_OK)
            return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: session %d cannot sample", i);
        if (norow && norow[i]) continue;
        if (s->n_tokens + 1 > (size_t)s->n_ctx) return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: a context is full");
        rs[R] = &s->fwd, rid[R] = 0, rpos[R++] = (int32_t)s->n_tokens;
    }
    for (int i = 0; i < np; i++) {
        pt_session *s = prs[i];
        const int c = pcnt[i];
        if (c < 1 || R + c > (int)(sizeof rs / sizeof *rs) || pt_session_check_ids(s, pids + off, (size_t)c) != PT_OK) {
            pt_clear_error();
            return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: prompt rows of session %d", i);
        }
        for (int j = 0; j < c; j++) rs[R] = &s->fwd, rid[R] = pids[off + (size_t)j], rpos[R++] = (int32_t)(s->n_tokens + (size_t)j);
        off += (size_t)c;
    }
    if (R == 0) return pt_error(PT_ERR_UNSUPPORTED, "pipelined step: no rows");
    pthread_mutex_lock(&m->lock);
    pt_status st = ahead_ok(m, rs, rpos, R);
    pthread_mutex_unlock(&m->lock);
    PT_TRY(st);
    /* the draws: on the GPU where the session samples there (its id then
     * written into the step's table by the sampler), else on the host now
     * (the id uploaded with the table) */
    pt_gsample_row grow[MAXS];
    double gu[MAXS];
    uint8_t ong[MAXS];
    int B = 0, t = 0;
    for (int i = 0; i < nd; i++) {
        pt_session *s = dec[i];
        s->ahead = 0;
        s->rows_ahead = 0;
        sts[i] = PT_OK;
        errs[i][0] = 0;
        const int row = !(norow && norow[i]);
        ong[i] = m->device == PT_DEVICE_CUDA && s->gpu && s->logits_dev && sps[i]->n_logprobs == 0 &&
                 pt_session_gpu_row(s, sps[i], &grow[B], &gu[B]);
        if (ong[i]) {
            grow[B++].id_slot = row ? ((batch *)m->batch)->st.ids_dev + t : NULL;
        } else {
            sts[i] = pt_session_sample(s, sps[i], NULL, &outs[i]);
            if (sts[i] != PT_OK) snprintf(errs[i], sizeof errs[i], "%s", pt_last_error());
            if (row) rid[t] = sts[i] == PT_OK ? outs[i].id : 0;
        }
        t += row;
    }
    pt_status step_st = PT_OK;
    char msg[512] = "";
    pt_gsample_out go[MAXS];
    pthread_mutex_lock(&m->lock);
    batch *b = m->batch;
    if (B && !pt_batch_sample_ctl(m, B)) step_st = pt_error(PT_ERR_NOMEM, "pipelined step: the sampler's table");
    const ahead ah = {grow, B};
    float *no_outs[2 * MAXS + 256] = {0};
    if (step_st == PT_OK) step_st = step_table(m, b, rs, rid, rpos, R, no_outs, NULL, &ah);
    if (step_st != PT_OK) snprintf(msg, sizeof msg, "%s", pt_last_error());
    /* the sample, if enqueued, is waited for even when the step failed after it */
    pt_status wst = B && b->pipe ? pt_cuda_sample_rows_wait(m->be, b->pipe, go) : PT_OK;
    const uint64_t gen = b->gen;
    pthread_mutex_unlock(&m->lock);
    if (B && (step_st != PT_OK || wst != PT_OK)) {
        /* nothing sampled on the GPU: the host samples these rows (their
         * draws already taken: the same ones) */
        if (wst != PT_OK) snprintf(msg, sizeof msg, "%s", pt_last_error());
        for (int i = 0; i < B; i++) go[i].status = 1;
    }
    /* results, and what each session now holds ahead */
    int k = 0, r = 0;
    for (int i = 0; i < nd; i++) {
        pt_session *s = dec[i];
        const int row = !(norow && norow[i]);
        int ok = 0;
        if (ong[i]) {
            sts[i] = pt_session_gpu_result(s, sps[i], &go[k], gu[k], &outs[i]);
            if (sts[i] != PT_OK) snprintf(errs[i], sizeof errs[i], "%s", pt_last_error());
            ok = go[k].status == 0 && sts[i] == PT_OK;
            k++;
        } else {
            ok = sts[i] == PT_OK;
        }
        held[i] = row && ok && step_st == PT_OK;
        if (held[i]) {
            s->tokens[s->n_tokens] = outs[i].id;
            s->rows_ahead = 1;
            s->ahead_row = r;
            s->ahead_gen = gen;
        }
        r += row;
    }
    off = 0;
    for (int i = 0; i < np; i++) {
        pt_session *s = prs[i];
        const int c = pcnt[i];
        s->ahead = 0;
        s->rows_ahead = 0;
        held[nd + i] = step_st == PT_OK;
        if (step_st == PT_OK) {
            memcpy(s->tokens + s->n_tokens, pids + off, (size_t)c * sizeof *pids);
            s->rows_ahead = c;
            s->ahead_row = r + c - 1;
            s->ahead_gen = gen;
        }
        r += c;
        off += (size_t)c;
    }
    if (step_st != PT_OK) PT_LOGD("pipelined step: %s (the rows run again in the turn's step)", msg);
    return PT_OK;
}

/* Rows run ahead (pt_session_rows_ahead) that this call asks for: session
 * i's first s->rows_ahead ids, if they are those rows' tokens and no batch
 * step has run since theirs, join its context without being run again (the
 * step computed exactly what running them now would: the same rows over the
 * same cache); where they are all of its ids, its logits are copied out of
 * the batch buffer first (enqueued before any step of this call overwrites
 * it). taken[i]: how many of session i's ids were taken; every session's
 * rows ahead are dropped either way. A failed copy takes none (the caller
 * fails the call as a failed step). */
static pt_status take_ahead(pt_session *const *sessions, const int32_t *ids, const int *counts, int n, int *taken) {
    pt_model *m = sessions[0]->m;
    const batch *b = m->batch;
    const int64_t V = m->net.vocab;
    logits_out lo = {.n = 0};
    size_t off = 0;
    pt_status st = PT_OK;
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        const int c = counts ? counts[i] : 1;
        int k = s->rows_ahead;
        if (k < 1 || k > c || !b || b->gen != s->ahead_gen || memcmp(ids + off, s->tokens + s->n_tokens, (size_t)k * 4))
            k = 0;
        s->rows_ahead = 0;
        taken[i] = k;
        off += (size_t)c;
    }
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < n && st == PT_OK; i++) {
        pt_session *s = sessions[i];
        if (!taken[i] || taken[i] != (counts ? counts[i] : 1)) continue;
        s->fwd.sampled = s->fwd.ahead_sampled = 0; /* model.h: its logits change */
        st = logits_row(m, &lo, s->gpu ? NULL : s->logits, s->fwd.logits, b->logits + (size_t)s->ahead_row * V);
    }
    if (st == PT_OK) st = logits_flush(m, &lo);
    pthread_mutex_unlock(&m->lock);
    if (st != PT_OK) {
        for (int i = 0; i < n; i++) taken[i] = 0;
        return st;
    }
    for (int i = 0; i < n; i++) {
        pt_session *s = sessions[i];
        const int k = taken[i];
        if (!k) continue;
        pt_session_hist_changed(s, s->n_tokens, (size_t)k);
        s->n_tokens += (size_t)k;
        s->rows_taken += (uint64_t)k;
        if (k == (counts ? counts[i] : 1)) {
            s->has_logits = 1;
            s->logits_dev = s->gpu;
        }
    }
    return PT_OK;
}

/* Both entry points: rows ahead taken first, the rest run as one step. */
static pt_status decode_rows(pt_session *const *sessions, const int32_t *ids, const int *counts, int n) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= sessions[i]->rows_ahead > 0;
    if (!any || n > 64) {
        for (int i = 0; i < n; i++) sessions[i]->rows_ahead = 0;
        return commit_rows(sessions, ids, counts, n, run_rows(sessions, ids, counts, n));
    }
    int taken[64], cnt[64];
    pt_session *rest[64];
    pt_status st = take_ahead(sessions, ids, counts, n, taken);
    if (st != PT_OK) return commit_rows(sessions, ids, counts, n, st);
    size_t R = 0;
    for (int i = 0; i < n; i++) R += (size_t)((counts ? counts[i] : 1) - taken[i]);
    if (R == 0) return PT_OK; /* every row ran ahead */
    int32_t *left = malloc(R * sizeof *left);
    if (!left) return pt_error(PT_ERR_NOMEM, "out of memory for a step of %zu rows", R);
    int nr = 0;
    size_t off = 0, w = 0;
    for (int i = 0; i < n; i++) {
        const int c = counts ? counts[i] : 1;
        if (c > taken[i]) {
            rest[nr] = sessions[i];
            cnt[nr++] = c - taken[i];
            memcpy(left + w, ids + off + taken[i], (size_t)(c - taken[i]) * sizeof *ids);
            w += (size_t)(c - taken[i]);
        }
        off += (size_t)c;
    }
    st = commit_rows(rest, left, cnt, nr, run_rows(rest, left, cnt, nr));
    free(left);
    return st;
}

pt_status pt_session_decode_batch(pt_session *const *sessions, const int32_t *ids, int n) {
    PT_TRY(check_sessions("pt_session_decode_batch", sessions, ids, NULL, n));
    return decode_rows(sessions, ids, NULL, n);
}

pt_status pt_session_decode_rows(pt_session *const *sessions, const int32_t *ids, const int *counts, int n) {
    if (!counts) return pt_error(PT_ERR_INVALID_ARG, "pt_session_decode_rows: NULL argument");
    PT_TRY(check_sessions("pt_session_decode_rows", sessions, ids, counts, n));
    return decode_rows(sessions, ids, counts, n);
}
