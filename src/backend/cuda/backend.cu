/* The CUDA backend's op table (backend.h): creation on a device, memory
 * (plain cudaMalloc; never managed memory), scratch reservation, weight
 * upload, and the table wiring each op to its family's file. Ops enqueue on
 * one stream; download() and sync() synchronize. Not kernels: those live in
 * matmul.cu, norm.cu, rope.cu, attention.cu, kv_quant.cu, elementwise.cu,
 * moe.cu and deltanet.cu. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/decode_split.cuh"
#include "backend/cuda/gemv_tc.cuh"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Matmul weight tiles for the cuBLAS path hold this many elements (f32 at
 * most: 64 MiB). Larger weights are processed in row chunks. */
#define PT_CUDA_TILE_ELEMS (16u << 20)

static void stage_free(pt_cuda *c);

static void cuda_free(pt_backend *be) {
    pt_cuda *c = pt_cuda_of(be);
    stage_free(c);
    if (c->tile) cudaFree(c->tile);
    if (c->xconv) cudaFree(c->xconv);
    if (c->moe_h) cudaFree(c->moe_h);
    if (c->moe_g) cudaFree(c->moe_g);
    if (c->moe_o) cudaFree(c->moe_o);
    if (c->moe_idx) cudaFree(c->moe_idx);
    if (c->err_dev) cudaFree(c->err_dev);
    if (c->dec_s) cudaFree(c->dec_s);
    if (c->dec_ml) cudaFree(c->dec_ml);
    if (c->dec_p) cudaFree(c->dec_p);
    if (c->bdec_s) cudaFree(c->bdec_s);
    if (c->bdec_ml) cudaFree(c->bdec_ml);
    if (c->bdec_p) cudaFree(c->bdec_p);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

static void *cuda_alloc(pt_backend *be, size_t bytes) {
    pt_cuda *c = pt_cuda_of(be);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (p) cudaFree(p);
        pt_error(PT_ERR_NOMEM, "cudaMalloc/cudaMemsetAsync of %zu bytes failed: %s (code %d): %s", bytes,
                 cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cuda_dealloc(pt_backend *be, void *p) {
    if (!p) return;
    /* The stream may still use p: finish it first (frees are rare). */
    cudaStreamSynchronize(pt_cuda_of(be)->stream);
    cudaFree(p);
}

/* Uploads without waiting for the stream. A small upload (the batched
 * step's ids, positions and K/V pointer table, a step's token and
 * position) is copied into a ring of pinned host memory and enqueued from
 * there, so the host returns at once and can enqueue the next step while
 * the GPU still runs the one before: the server's turn used to block on
 * each of its three uploads until the previous step ended and issued the
 * rest of the turn with the GPU idle (one served stream of the 8B shape
 * ~2% faster without it: bench/RESULTS.md, "small uploads staged through
 * pinned memory"). A region of the ring is reused only after the copy out
 * of it has run (an event per upload, waited for when the ring comes
 * round). Larger uploads (weights, tables at load) stay synchronous.
 * PETREL_CUDA_UPLOAD_STAGE=0: every upload synchronous (A/B). An upload
 * inside a graph capture is an error (it would capture a copy from the
 * ring). */
#define PT_STAGE_BYTES (1u << 20) /* the ring */
#define PT_STAGE_MAX (PT_STAGE_BYTES / 4) /* the largest staged upload */
#define PT_STAGE_FENCES 64
struct pt_cuda_stage {
    pthread_mutex_t lock; /* the ring and its fences (callers on several threads) */
    char *ring; /* [PT_STAGE_BYTES] pinned */
    size_t head; /* next free byte */
    struct {
        cudaEvent_t ev;
        size_t lo, hi; /* the region the copy reads */
    } f[PT_STAGE_FENCES];
    int first, n; /* the fences in flight, oldest first (a circular list) */
    int sync;     /* PETREL_CUDA_UPLOAD_STAGE=0 */
};

static void stage_free(pt_cuda *c) {
    pt_cuda_stage *g = c->stage;
    if (!g) return;
    if (c->stream) cudaStreamSynchronize(c->stream); /* the copies still read the ring */
    for (int i = 0; i < PT_STAGE_FENCES; i++)
        if (g->f[i].ev) cudaEventDestroy(g->f[i].ev);
    if (g->ring) cudaFreeHost(g->ring);
    pthread_mutex_destroy(&g->lock);
    free(g);
    c->stage = NULL;
}

static pt_status stage_init(pt_cuda *c) {
    pt_cuda_stage *g = (pt_cuda_stage *)calloc(1, sizeof *g);
    if (!g) return pt_error(PT_ERR_NOMEM, "upload staging: out of host memory");
    pthread_mutex_init(&g->lock, NULL);
    c->stage = g;
    g->sync = !pt_env_on("PETREL_CUDA_UPLOAD_STAGE");
    pt_status st = PT_OK;
    CUDA_CHECK_GOTO(cudaHostAlloc((void **)&g->ring, PT_STAGE_BYTES, cudaHostAllocDefault), st, fail);
    for (int i = 0; i < PT_STAGE_FENCES; i++)
        CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&g->f[i].ev, cudaEventDisableTiming), st, fail);
    return PT_OK;
fail:
    stage_free(c);
    return st;
}

/* Waits for the fences in flight up to the newest one whose region meets
 * [lo, hi) (all of them when full: one slot is then needed), and drops
 * them: the stream runs the copies in order. */
static pt_status stage_reclaim(pt_cuda_stage *g, size_t lo, size_t hi) {
    int last = g->n == PT_STAGE_FENCES ? 0 : -1;
    for (int i = 0; i < g->n; i++) {
        const int k = (g->first + i) % PT_STAGE_FENCES;
        if (g->f[k].lo < hi && lo < g->f[k].hi) last = i;
    }
    if (last < 0) return PT_OK;
    CUDA_CHECK(cudaEventSynchronize(g->f[(g->first + last) % PT_STAGE_FENCES].ev));
    g->first = (g->first + last + 1) % PT_STAGE_FENCES;
    g->n -= last + 1;
    return PT_OK;
}

/* One staged upload (g->lock held). */
static pt_status stage_copy(pt_cuda *c, pt_cuda_stage *g, void *dst, const void *src, size_t bytes) {
    size_t lo = (g->head + 255) & ~(size_t)255;
    if (lo + bytes > PT_STAGE_BYTES) lo = 0; /* wrap */
    PT_TRY(stage_reclaim(g, lo, lo + bytes));
    memcpy(g->ring + lo, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, g->ring + lo, bytes, cudaMemcpyHostToDevice, c->stream));
    const int k = (g->first + g->n) % PT_STAGE_FENCES;
    CUDA_CHECK(cudaEventRecord(g->f[k].ev, c->stream));
    g->f[k].lo = lo;
    g->f[k].hi = lo + bytes;
    g->n++;
    g->head = lo + bytes;
    return PT_OK;
}

static pt_status cuda_upload(pt_backend *be, void *dst, const void *src, size_t bytes) {
    pt_cuda *c = pt_cuda_of(be);
    pt_cuda_stage *g = c->stage;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) /* a copy from the ring would be captured as a graph node */
        return pt_error(PT_ERR_INTERNAL, "upload of %zu bytes inside a CUDA graph capture", bytes);
    if (g->sync || bytes > PT_STAGE_MAX || bytes == 0) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        return PT_OK;
    }
    pthread_mutex_lock(&g->lock);
    const pt_status st = stage_copy(c, g, dst, src, bytes);
    pthread_mutex_unlock(&g->lock);
    return st;
}

pt_status pt_cuda_check_errors(pt_cuda *c) {
    int h[2];
    CUDA_CHECK(cudaMemcpyAsync(h, c->err_dev, sizeof h, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (h[0]) {
        CUDA_CHECK(cudaMemsetAsync(c->err_dev, 0, 2 * sizeof(int), c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        if (h[0] == 2) return pt_error(PT_ERR_RANGE, "moe_ffn: expert index %d outside the expert stack", h[1]);
        if (h[0] == 3)
            return pt_error(PT_ERR_INTERNAL, "decode attention: a row of %d keys ran past its launch's bound on the keys",
                            h[1]);
        return pt_error(PT_ERR_RANGE, "embed: token id %d outside the vocabulary", h[1]);
    }
    return PT_OK;
}

static pt_status cuda_download(pt_backend *be, void *dst, const void *src, size_t bytes) {
    pt_cuda *c = pt_cuda_of(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return pt_cuda_check_errors(c);
}

static pt_status cuda_sync(pt_backend *be) {
    pt_cuda *c = pt_cuda_of(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return pt_cuda_check_errors(c);
}

static pt_status grow(void **p, size_t *have, size_t need) {
    if (need <= *have) return PT_OK;
    if (*p) CUDA_CHECK(cudaFree(*p));
    *p = NULL;
    *have = 0;
    CUDA_CHECK(cudaMalloc(p, need));
    *have = need;
    return PT_OK;
}

static pt_status cuda_reserve(pt_backend *be, const pt_backend_limits *lim) {
    pt_cuda *c = pt_cuda_of(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    pt_backend_limits l = c->lim;
    if (lim->max_tokens > l.max_tokens) l.max_tokens = lim->max_tokens;
    if (lim->max_ctx > l.max_ctx) l.max_ctx = lim->max_ctx;
    if (lim->max_heads > l.max_heads) l.max_heads = lim->max_heads;
    if (lim->max_head_dim > l.max_head_dim) l.max_head_dim = lim->max_head_dim;
    if (lim->max_cols > l.max_cols) l.max_cols = lim->max_cols;
    if (lim->max_ffn > l.max_ffn) l.max_ffn = lim->max_ffn;
    if (lim->max_top_k > l.max_top_k) l.max_top_k = lim->max_top_k;
    if (lim->max_rows > l.max_rows) l.max_rows = lim->max_rows;
    if (memcmp(&l, &c->lim, sizeof l)) c->scratch_gen++; /* any new limit may move a buffer or a split */
    if (l.max_tokens < 0 || l.max_cols < 0 || l.max_ffn < 0 || l.max_top_k < 0)
        return pt_error(PT_ERR_INVALID_ARG, "reserve: negative limit");
    PT_TRY(grow(&c->tile, &c->tile_bytes, (size_t)PT_CUDA_TILE_ELEMS * 4));
    PT_TRY(grow(&c->xconv, &c->xconv_bytes, (size_t)l.max_tokens * (size_t)l.max_cols * 4 + 256));
    size_t rows = (size_t)l.max_tokens * (size_t)(l.max_top_k > 0 ? l.max_top_k : 0);
    if (rows && l.max_ffn) {
        if (rows > c->moe_rows || (size_t)l.max_ffn > c->moe_ffn || (size_t)l.max_cols > c->moe_cols) {
            if (c->moe_h) CUDA_CHECK(cudaFree(c->moe_h));
            if (c->moe_g) CUDA_CHECK(cudaFree(c->moe_g));
            if (c->moe_o) CUDA_CHECK(cudaFree(c->moe_o));
            c->moe_h = c->moe_g = c->moe_o = NULL;
            CUDA_CHECK(cudaMalloc((void **)&c->moe_h, rows * (size_t)l.max_ffn * 4));
            CUDA_CHECK(cudaMalloc((void **)&c->moe_g, rows * (size_t)l.max_ffn * 8));
            CUDA_CHECK(cudaMalloc((void **)&c->moe_o, rows * (size_t)l.max_cols * 4));
            c->moe_rows = rows;
            c->moe_ffn = (size_t)l.max_ffn;
            c->moe_cols = (size_t)l.max_cols;
        }
    }
    /* decode attention: scores per head and key, partials per split */
    if (l.max_heads > 0 && l.max_ctx > 0) {
        size_t splits = 2 * (size_t)c->sm_count, hd = l.max_head_dim > 0 ? (size_t)l.max_head_dim : 256;
        size_t have_s = c->dec_s_floats * 4, have_ml = c->dec_ml_count * 8, have_p = c->dec_p_floats * 4;
        PT_TRY(grow((void **)&c->dec_s, &have_s, (size_t)l.max_heads * (size_t)l.max_ctx * 4));
        PT_TRY(grow((void **)&c->dec_ml, &have_ml, (size_t)l.max_heads * splits * 8));
        PT_TRY(grow((void **)&c->dec_p, &have_p, (size_t)l.max_heads * splits * hd * 4));
        c->dec_s_floats = have_s / 4;
        c->dec_ml_count = have_ml / 8;
        c->dec_p_floats = have_p / 4;
        if (l.max_rows > 0) { /* the multi-sequence decode attention: the same per row */
            const size_t R = (size_t)l.max_rows;
            have_s = c->bdec_s_floats * 4, have_ml = c->bdec_ml_count * 8, have_p = c->bdec_p_floats * 4;
            PT_TRY(grow((void **)&c->bdec_s, &have_s, R * (size_t)l.max_heads * (size_t)l.max_ctx * 4));
            PT_TRY(grow((void **)&c->bdec_ml, &have_ml, R * (size_t)l.max_heads * splits * 8));
            PT_TRY(grow((void **)&c->bdec_p, &have_p, R * (size_t)l.max_heads * splits * hd * 4));
            c->bdec_s_floats = have_s / 4;
            c->bdec_ml_count = have_ml / 8;
            c->bdec_p_floats = have_p / 4;
        }
    }
    c->lim = l;
    return PT_OK;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static pt_status cuda_prepare_weight(pt_backend *be, pt_matrix *w, const char *name) {
    pt_cuda *c = pt_cuda_of(be);
    const char *nm = name ? name : "weight";
    if (w->backend_data) return pt_error(PT_ERR_INVALID_ARG, "%s: weight already prepared", nm);
    if (w->rows <= 0 || w->cols <= 0 || w->n_experts < 0)
        return pt_error(PT_ERR_INVALID_ARG, "%s: bad shape rows %lld cols %lld experts %lld", nm,
                        (long long)w->rows, (long long)w->cols, (long long)w->n_experts);
    if (w->dtype != PT_FT_F32 && w->dtype != PT_FT_BF16 && w->dtype != PT_FT_F16)
        return pt_error(PT_ERR_UNSUPPORTED, "%s: dtype %d not supported", nm, (int)w->dtype);
    if (!w->data) return pt_error(PT_ERR_INVALID_ARG, "%s: no data", nm);
    int64_t E = w->n_experts > 1 ? w->n_experts : 1;
    size_t es = pt_ftype_size(w->dtype);
    size_t data_b, sc_b = 0;
    if (w->bits == 0) {
        data_b = (size_t)E * (size_t)w->rows * (size_t)w->cols * es;
    } else {
        if (w->bits != 2 && w->bits != 3 && w->bits != 4 && w->bits != 5 && w->bits != 6 && w->bits != 8)
            return pt_error(PT_ERR_UNSUPPORTED, "%s: quantized bits %d (CUDA kernels exist for 2, 3, 4, 5, 6, 8)",
                            nm, w->bits);
        if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
            return pt_error(PT_ERR_UNSUPPORTED, "%s: group size %d (CUDA kernels exist for 32, 64, 128)", nm,
                            w->group_size);
        if (w->cols % w->group_size)
            return pt_error(PT_ERR_INVALID_ARG, "%s: cols %lld not a multiple of the group size %d", nm,
                            (long long)w->cols, w->group_size);
        if (!w->scales || !w->biases) return pt_error(PT_ERR_INVALID_ARG, "%s: quantized weight without scales/biases", nm);
        data_b = (size_t)E * (size_t)w->rows * (size_t)(w->cols * w->bits / 32) * 4;
        sc_b = (size_t)E * (size_t)w->rows * (size_t)(w->cols / w->group_size) * es;
    }
    /* 4/8-bit weights the decode GEMV reads are stored in its tensor-core
     * layout instead (gemv_tc_repack.cu): codes and scale|bias words, no biases */
    const int tc = w->bits && pt_cuda_tc_eligible(c, w);
    if (tc) data_b = pt_cuda_tc_codes_bytes(w), sc_b = pt_cuda_tc_sb_bytes(w);
    size_t bias_b = w->bias ? (size_t)E * (size_t)w->rows * pt_ftype_size(w->bias_dtype) : 0;
    size_t total = align256(data_b) + (tc ? 1 : 2) * align256(sc_b) + align256(bias_b);
    pt_cuda_weight *cw = (pt_cuda_weight *)calloc(1, sizeof *cw);
    if (!cw) return pt_error(PT_ERR_NOMEM, "%s: out of host memory", nm);
    cudaError_t e = cudaMalloc(&cw->mem, total);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(cw);
        return pt_error(PT_ERR_NOMEM, "%s: cudaMalloc of %zu bytes failed: %s (code %d)", nm, total,
                        cudaGetErrorName(e), (int)e);
    }
    cw->bytes = total;
    char *p = (char *)cw->mem;
    struct { const void *src; size_t n; const void **dst; } parts[4] = {
        {tc ? NULL : w->data, data_b, &cw->data},
        {tc ? NULL : w->scales, sc_b, &cw->scales},
        {tc ? NULL : w->biases, tc ? 0 : sc_b, &cw->biases},
        {w->bias, bias_b, &cw->bias},
    };
    for (int i = 0; i < 4; i++) {
        if (!parts[i].n || (!parts[i].src && !tc)) continue;
        *parts[i].dst = p;
        p += align256(parts[i].n);
        if (parts[i].src) {
            e = cudaMemcpyAsync((void *)*parts[i].dst, parts[i].src, parts[i].n, cudaMemcpyHostToDevice, c->stream);
            if (e != cudaSuccess) break;
        }
    }
    cw->tc = tc;
    cw->role = w->role;
    if (tc && e == cudaSuccess) {
        pt_status st = pt_cuda_tc_pack(c, w, (void *)cw->data, (void *)cw->scales, nm);
        if (st != PT_OK) {
            cudaFree(cw->mem);
            free(cw);
            return st;
        }
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(cw->mem);
        free(cw);
        return pt_error(PT_ERR_DEVICE, "%s: upload of %zu bytes failed: %s (code %d)", nm, total,
                        cudaGetErrorName(e), (int)e);
    }
    w->backend_data = cw;
    return PT_OK;
}

static void cuda_release_weight(pt_backend *be, pt_matrix *w) {
    pt_cuda_weight *cw = (pt_cuda_weight *)w->backend_data;
    if (!cw) return;
    cudaStreamSynchronize(pt_cuda_of(be)->stream);
    cudaFree(cw->mem);
    free(cw);
    w->backend_data = NULL;
}

/* ---- CUDA graphs (cuda.h) ---- */

struct pt_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

static pt_status need_cuda(pt_backend *be) {
    if (!be || strcmp(be->ops->name, "cuda"))
        return pt_error(PT_ERR_UNSUPPORTED, "CUDA graphs need the CUDA backend (this one is %s)",
                        be ? be->ops->name : "none");
    return PT_OK;
}

extern "C" pt_status pt_cuda_graph_begin(pt_backend *be) {
    PT_TRY(need_cuda(be));
    /* Thread-local mode: a synchronizing call from this thread during the
     * capture fails loudly instead of silently breaking the graph. */
    CUDA_CHECK(cudaStreamBeginCapture(pt_cuda_of(be)->stream, cudaStreamCaptureModeThreadLocal));
    return PT_OK;
}

extern "C" pt_status pt_cuda_graph_end(pt_backend *be, pt_cuda_graph **out) {
    *out = NULL;
    PT_TRY(need_cuda(be));
    pt_cuda *c = pt_cuda_of(be);
    pt_cuda_graph *g = (pt_cuda_graph *)calloc(1, sizeof *g);
    if (!g) return pt_error(PT_ERR_NOMEM, "CUDA graph: out of host memory");
    cudaError_t e = cudaStreamEndCapture(c->stream, &g->graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (g->graph) cudaGraphDestroy(g->graph);
        free(g);
        return pt_error(PT_ERR_DEVICE, "CUDA graph capture failed: %s (code %d): %s (an op inside the capture "
                        "synchronized, or it failed)", cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
    }
    *out = g;
    return PT_OK;
}

extern "C" pt_status pt_cuda_graph_launch(pt_backend *be, pt_cuda_graph *g) {
    PT_TRY(need_cuda(be));
    CUDA_CHECK(cudaGraphLaunch(g->exec, pt_cuda_of(be)->stream));
    return PT_OK;
}

extern "C" uint64_t pt_cuda_scratch_gen(pt_backend *be) {
    if (!be || strcmp(be->ops->name, "cuda")) return 0;
    return pt_cuda_of(be)->scratch_gen;
}

extern "C" void pt_cuda_graph_free(pt_cuda_graph **g) {
    if (!g || !*g) return;
    cudaGraphExecDestroy((*g)->exec);
    cudaGraphDestroy((*g)->graph);
    free(*g);
    *g = NULL;
}

/* Designated initializers (in declaration order, as C++ requires); ops this
 * backend does not implement stay NULL. */
static const pt_backend_ops cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .alloc = cuda_alloc,
    .dealloc = cuda_dealloc,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .reserve = cuda_reserve,
    .prepare_weight = cuda_prepare_weight,
    .release_weight = cuda_release_weight,
    .embed = pt_cuda_embed,
    .rms_norm = pt_cuda_rms_norm,
    .rms_norm2 = pt_cuda_rms_norm2,
    .matmul = pt_cuda_matmul,
    .rope = pt_cuda_rope,
    .kv_append = pt_cuda_kv_append,
    .kv_quantize = pt_cuda_kv_quantize,
    .attention = pt_cuda_attention,
    .glu = pt_cuda_glu,
    .add = pt_cuda_add,
    .mul = pt_cuda_mul,
    .add_scaled = pt_cuda_add_scaled,
    .scale = pt_cuda_scale,
    .softcap = pt_cuda_softcap,
    .moe_route = pt_cuda_moe_route,
    .moe_ffn = pt_cuda_moe_ffn,
    .argmax = pt_cuda_argmax,
    .conv1d_silu = pt_cuda_conv1d_silu,
    .delta_rule = pt_cuda_delta_rule,
    .rms_norm_gated = pt_cuda_rms_norm_gated,
    .copy_rows = pt_cuda_copy_rows,
    .copy_rows_to = pt_cuda_copy_rows_to,
    .sigmoid_mul = pt_cuda_sigmoid_mul,
    .matmul_rows = pt_cuda_matmul_rows,
    .kv_append_rows = pt_cuda_kv_append_rows,
    .attention_rows = pt_cuda_attention_rows,
    .rope_qk = pt_cuda_rope_qk,
    .rope_qk_kv_append = pt_cuda_rope_qk_kv_append,
    .matmul_multi = pt_cuda_matmul_multi,
    .matmul_glu = pt_cuda_matmul_glu,
    .rope_kv_attention = pt_cuda_rope_kv_attention,
    .matmul_norm = pt_cuda_matmul_norm,
    .matmul_glu_norm = pt_cuda_matmul_glu_norm,
    .matmul_add = pt_cuda_matmul_add,
    .prefetch_hint = pt_cuda_prefetch_hint,
    .handoff_hint = pt_cuda_handoff_hint,
};

static pt_status create(pt_cuda *c, const pt_cuda_params *p) {
    pt_cuda_device_info info;
    PT_TRY(pt_cuda_device_query(p->device, &info));
    c->device = p->device;
    c->no_fast_gemv = !pt_env_on("PETREL_CUDA_FAST_GEMV");
    c->dec_short_heads = pt_env_on("PETREL_CUDA_DEC_SHORT_HEADS");
    c->dec_heads = pt_env_int("PETREL_CUDA_DEC_HEADS", 0, 64, -1);
    c->dec_short_stage = pt_env_int("PETREL_CUDA_DEC_SHORT_STAGE", 0, 2, 2);
    c->dec_short_rows = pt_env_on("PETREL_CUDA_DEC_SHORT_ROWS");
    c->dec_short_rows_stage = pt_env_int("PETREL_CUDA_DEC_SHORT_ROWS_STAGE", 0, 4, 0);
    c->dec_short_rows_heads = pt_env_int("PETREL_CUDA_DEC_SHORT_ROWS_HEADS", 0, 1, -1);
    c->sm_count = info.sm_count;
    CUDA_CHECK(cudaSetDevice(p->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&c->sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, p->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&c->blk_rsv, cudaDevAttrReservedSharedMemoryPerBlock, p->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&c->blas));
    CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    /* Exact f32 products in f32 mode: never TF32. */
    CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH));
    PT_TRY(stage_init(c)); /* cuda_upload's pinned ring */
    CUDA_CHECK(cudaMalloc((void **)&c->err_dev, 2 * sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(c->err_dev, 0, 2 * sizeof(int), c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return PT_OK;
}

extern "C" pt_status pt_backend_cuda_create(pt_backend **out, const pt_cuda_params *params) {
    *out = NULL;
    pt_cuda_params def = {0, PT_ACT_BF16};
    const pt_cuda_params *p = params ? params : &def;
    if (p->act != PT_ACT_F32 && p->act != PT_ACT_BF16)
        return pt_error(PT_ERR_INVALID_ARG, "cuda backend: unknown activation dtype %d", (int)p->act);
    pt_cuda *c = (pt_cuda *)calloc(1, sizeof *c);
    if (!c) return pt_error(PT_ERR_NOMEM, "cuda backend: out of host memory");
    c->base.ops = &cuda_ops;
    c->base.act = p->act;
    c->base.impl = c;
    pt_status st = create(c, p);
    if (st != PT_OK) {
        pt_error_prefix(st, "cuda backend on device %d", p->device);
        cuda_free(&c->base);
        return st;
    }
    *out = &c->base;
    return PT_OK;
}
