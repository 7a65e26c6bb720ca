/* The public API over a tiny Llama written by the test itself (random f32
 * weights, no tokenizer): load, sessions, bad input errors, chunked prefill,
 * logits of every position, greedy determinism, thread-count independence,
 * truncate/reuse, generation stats and finish reasons, sampling defaults. */
#include "test.h"

#include "base/mmap.h"
#include "format/safetensors.h"
#include "petrel.h"

#include <stdint.h>

enum { H = 64, L = 2, NH = 4, NKV = 2, HD = 16, F = 96, V = 200 };

static char g_dir[512];

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)((*s >> 40) & 0xffffff) / 16777216.0f - 0.5f) * 0.4f;
}

static int write_model(const char *dir, int max_pos) {
    pt_st_entry e[64];
    int n = 0;
    uint64_t seed = 7;
    float *bufs[64];
#define ADD(nm, r, c, val)                                                                    \
    do {                                                                                      \
        int64_t cnt = (int64_t)(r) * ((c) ? (c) : 1);                                         \
        float *b = malloc((size_t)cnt * 4);                                                   \
        for (int64_t i = 0; i < cnt; i++) b[i] = (val) < 0 ? frand(&seed) * 3 : (val);       \
        bufs[n] = b;                                                                          \
        e[n].name = strdup(nm);                                                               \
        e[n].dtype = PT_DTYPE_F32;                                                            \
        e[n].ndim = (c) ? 2 : 1;                                                              \
        e[n].shape[0] = (r);                                                                  \
        e[n].shape[1] = (c);                                                                  \
        e[n].data = b;                                                                        \
        n++;                                                                                  \
    } while (0)
    ADD("model.embed_tokens.weight", V, H, -1.0f);
    ADD("model.norm.weight", H, 0, 1.0f);
    for (int l = 0; l < L; l++) {
        char nm[128];
#define NM(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        ADD(NM("input_layernorm.weight"), H, 0, 1.0f);
        ADD(NM("post_attention_layernorm.weight"), H, 0, 1.0f);
        ADD(NM("self_attn.q_proj.weight"), NH * HD, H, -1.0f);
        ADD(NM("self_attn.k_proj.weight"), NKV * HD, H, -1.0f);
        ADD(NM("self_attn.v_proj.weight"), NKV * HD, H, -1.0f);
        ADD(NM("self_attn.o_proj.weight"), H, NH * HD, -1.0f);
        ADD(NM("mlp.gate_proj.weight"), F, H, -1.0f);
        ADD(NM("mlp.up_proj.weight"), F, H, -1.0f);
        ADD(NM("mlp.down_proj.weight"), H, F, -1.0f);
#undef NM
    }
#undef ADD
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    pt_status st = pt_st_write_file(path, e, n, NULL, 0);
    for (int i = 0; i < n; i++) {
        free(bufs[i]);
        free((void *)e[i].name);
    }
    if (st != PT_OK) return 0;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"llama\", \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d,"
             " \"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
             " \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\", \"eos_token_id\": 3}",
             H, F, L, NH, NKV, HD, V, max_pos);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return pt_write_file(path, cfg, strlen(cfg)) == PT_OK;
}

static pt_model *load(int threads, pt_compute_dtype dt, int chunk) {
    pt_model_params mp = pt_model_default_params();
    mp.n_threads = threads;
    mp.dtype = dt;
    mp.device = PT_DEVICE_CPU;
    if (chunk) mp.prefill_chunk = chunk;
    pt_model *m = NULL;
    if (pt_model_load(g_dir, &mp, &m) != PT_OK) printf("    load: %s\n", pt_last_error());
    return m;
}

static const int32_t prompt[] = {5, 17, 42, 99, 150, 7, 8, 9, 120, 33, 1};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

static void test_load_and_errors(void) {
    pt_model *m = load(1, PT_COMPUTE_MODEL, 0);
    REQUIRE(m, "load");
    CHECK(pt_model_vocab_size(m) == V, "vocab %d", pt_model_vocab_size(m));
    CHECK(pt_model_max_ctx(m) == 64, "max ctx %d", pt_model_max_ctx(m));
    CHECK(pt_model_is_eos(m, 3) && !pt_model_is_eos(m, 4), "eos from config.json");
    CHECK(!pt_model_has_tokenizer(m), "no tokenizer");
    int32_t *ids;
    size_t n;
    CHECK(pt_tokenize(m, "hi", 2, 1, &ids, &n) == PT_ERR_NOT_FOUND, "tokenize without tokenizer");
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = 65};
    CHECK(pt_session_create(m, &sp, &s) == PT_ERR_RANGE && strstr(pt_last_error(), "64"),
          "ctx over the maximum: %s", pt_last_error());
    sp.n_ctx = 16;
    REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "%s", pt_last_error());
    int32_t bad[2] = {5, V};
    CHECK(pt_session_prompt(s, bad, 2) == PT_ERR_RANGE && strstr(pt_last_error(), "vocabulary"),
          "id outside the vocabulary: %s", pt_last_error());
    CHECK(pt_session_n_tokens(s) == 0, "session unchanged");
    CHECK(pt_session_prompt(s, prompt, 0) == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "empty"),
          "empty prompt: %s", pt_last_error());
    int32_t many[17] = {0};
    CHECK(pt_session_prompt(s, many, 17) == PT_ERR_RANGE && strstr(pt_last_error(), "context"),
          "prompt longer than the context: %s", pt_last_error());
    CHECK(pt_session_logits(s) == NULL, "no logits yet");
    pt_session_free(&s);
    CHECK(s == NULL, "free sets NULL");
    pt_model_free(&m);
    CHECK(m == NULL, "free sets NULL");
    pt_model *none = NULL;
    CHECK(pt_model_load("/nonexistent/petrel-model", NULL, &none) == PT_ERR_NOT_FOUND && !none, "missing dir");
    pt_model_params mp = pt_model_default_params();
    mp.int8_act = PT_LEVER_ON; /* an L3 lever the CPU implements */
    CHECK(pt_model_load(g_dir, &mp, &none) == PT_OK && none, "int8-act loads: %s", pt_last_error());
    pt_model_free(&none);
    mp.int8_act = PT_LEVER_OFF;
    mp.device = PT_DEVICE_CUDA; /* not on CUDA: refused by name (or no CUDA device at all) */
    mp.kv_quant = 4;
    CHECK(pt_model_load(g_dir, &mp, &none) != PT_OK && !none, "kv-quant on CUDA refused");
}

/* logits of all positions, by one eval, by chunked prefill and by decoding one at a time */
static void test_chunking(void) {
    float *all = malloc((size_t)NP * V * 4), *step = malloc((size_t)NP * V * 4);
    pt_model *m1 = load(1, PT_COMPUTE_MODEL, 0), *m3 = load(1, PT_COMPUTE_MODEL, 3);
    REQUIRE(m1 && m3, "load");
    pt_session *s = NULL, *s3 = NULL;
    pt_session_params sp = {.n_ctx = 32};
    REQUIRE(pt_session_create(m1, &sp, &s) == PT_OK, "%s", pt_last_error());
    REQUIRE(pt_session_create(m3, &sp, &s3) == PT_OK, "%s", pt_last_error());
    REQUIRE(pt_session_eval_logits(s, prompt, NP, all) == PT_OK, "%s", pt_last_error());
    REQUIRE(pt_session_eval_logits(s3, prompt, NP, step) == PT_OK, "%s", pt_last_error());
    double md = 0, mx = 0;
    for (int i = 0; i < NP * V; i++) {
        md = fmax(md, fabs(all[i] - step[i]));
        mx = fmax(mx, fabs(all[i]));
    }
    CHECK(md <= 1e-5 * mx, "chunk 3 vs one chunk: max diff %g (max %g)", md, mx);
    printf("MEASURE api prefill chunk 3 vs whole: max|dlogit| %.3g of max|logit| %.3g\n", md, mx);
    CHECK(!memcmp(pt_session_logits(s), all + (NP - 1) * V, V * 4), "last logits kept");
    /* token by token (decode path) */
    pt_session_truncate(s, 0);
    md = 0;
    for (int t = 0; t < NP; t++) {
        REQUIRE(pt_session_prompt(s, prompt + t, 1) == PT_OK, "%s", pt_last_error());
        const float *lg = pt_session_logits(s);
        for (int v = 0; v < V; v++) md = fmax(md, fabs(lg[v] - all[t * V + v]));
    }
    CHECK(md <= 1e-5 * mx, "decode vs prefill: max diff %g", md);
    printf("MEASURE api decode vs prefill: max|dlogit| %.3g\n", md);
    /* truncate and re-run reproduces the logits exactly */
    pt_session_truncate(s, 4);
    REQUIRE(pt_session_prompt(s, prompt + 4, NP - 4) == PT_OK, "%s", pt_last_error());
    float *again = malloc(V * 4);
    memcpy(again, pt_session_logits(s), V * 4);
    pt_session_truncate(s, 4);
    REQUIRE(pt_session_prompt(s, prompt + 4, NP - 4) == PT_OK, "%s", pt_last_error());
    CHECK(!memcmp(again, pt_session_logits(s), V * 4), "truncate + re-prompt is deterministic");
    /* pt_session_sync: the CPU's calls are complete already, so it succeeds
     * and changes nothing; a NULL session is refused by name */
    CHECK(pt_session_sync(s) == PT_OK, "sync: %s", pt_last_error());
    CHECK(!memcmp(again, pt_session_logits(s), V * 4) && pt_session_n_tokens(s) == NP, "sync changed the session");
    CHECK(pt_session_sync(NULL) == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "pt_session_sync"),
          "sync(NULL): %s", pt_last_error());
    free(again);
    pt_session_free(&s);
    pt_session_free(&s3);
    pt_model_free(&m1);
    pt_model_free(&m3);
    free(all);
    free(step);
}

static void run_logits(int threads, pt_compute_dtype dt, float *out) {
    pt_model *m = load(threads, dt, 4);
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = 32};
    if (!m || pt_session_create(m, &sp, &s) != PT_OK || pt_session_eval_logits(s, prompt, NP, out) != PT_OK)
        printf("    run_logits: %s\n", pt_last_error());
    pt_session_free(&s);
    pt_model_free(&m);
}

static void test_threads_bit_identical(void) {
    float *a = malloc((size_t)NP * V * 4), *b = malloc((size_t)NP * V * 4);
    for (int dt = 0; dt < 2; dt++) {
        pt_compute_dtype d = dt ? PT_COMPUTE_BF16 : PT_COMPUTE_F32;
        memset(a, 0, (size_t)NP * V * 4);
        memset(b, 1, (size_t)NP * V * 4);
        run_logits(1, d, a);
        run_logits(2, d, b);
        CHECK(!memcmp(a, b, (size_t)NP * V * 4), "%s: 1 vs 2 threads differ", dt ? "bf16" : "f32");
    }
    /* bf16 differs from f32, but not by much */
    run_logits(1, PT_COMPUTE_F32, a);
    run_logits(1, PT_COMPUTE_BF16, b);
    double md = 0, mx = 0;
    for (int i = 0; i < NP * V; i++) {
        md = fmax(md, fabs(a[i] - b[i]));
        mx = fmax(mx, fabs(a[i]));
    }
    CHECK(md > 0 && md < 0.1 * mx, "bf16 vs f32: %g of %g", md, mx);
    printf("MEASURE api bf16 vs f32 on a random tiny llama: max|dlogit| %.3g of max|logit| %.3g\n", md, mx);
    free(a);
    free(b);
}

typedef struct {
    int n;
    int32_t ids[64];
    int cancel_at;
} cb_ctx;

static int on_tok(void *user, const pt_token_info *t, const char *text, size_t len) {
    (void)text;
    (void)len;
    cb_ctx *c = user;
    if (t->id >= 0 && c->n < 64) c->ids[c->n++] = t->id;
    return c->cancel_at && c->n >= c->cancel_at;
}

static void test_generate(void) {
    pt_model *m = load(2, PT_COMPUTE_MODEL, 0);
    REQUIRE(m, "load");
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = 40};
    REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "%s", pt_last_error());
    pt_generate_params gp = pt_generate_default_params(m);
    CHECK(gp.sampling.temperature == 1.0f && gp.sampling.top_p == 1.0f && gp.max_tokens == 256, "defaults");
    gp.sampling.temperature = 0;
    gp.max_tokens = 12;
    cb_ctx a = {0}, b = {0};
    pt_finish_reason fin;
    pt_generate_stats st;
    REQUIRE(pt_generate(s, prompt, 5, &gp, on_tok, &a, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(st.n_prompt == 5 && st.prompt_seconds > 0 && st.first_token_seconds > 0, "stats");
    if (fin == PT_FINISH_LENGTH) {
        CHECK(a.n == 12 && st.n_generated == 12, "12 tokens: %d", a.n);
        CHECK(pt_session_n_tokens(s) == 5 + 11, "context holds prompt + 11: %zu", pt_session_n_tokens(s));
    } else {
        CHECK(fin == PT_FINISH_EOS, "finish %d", (int)fin);
    }
    /* greedy is reproducible, and matches argmax of the logits */
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, prompt, 5, &gp, on_tok, &b, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n), "greedy reproducible");
    pt_session_truncate(s, 0);
    REQUIRE(pt_session_prompt(s, prompt, 5) == PT_OK, "%s", pt_last_error());
    const float *lg = pt_session_logits(s);
    int best = 0;
    for (int v = 1; v < V; v++)
        if (lg[v] > lg[best]) best = v;
    CHECK(a.n > 0 && a.ids[0] == best, "first greedy token %d is the argmax %d", a.n ? a.ids[0] : -1, best);
    /* seeded sampling is reproducible */
    gp.sampling.temperature = 1.5f;
    gp.sampling.seed = 11;
    gp.max_tokens = 10;
    cb_ctx c1 = {0}, c2 = {0};
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, prompt, 5, &gp, on_tok, &c1, &fin, &st) == PT_OK, "%s", pt_last_error());
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, prompt, 5, &gp, on_tok, &c2, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(c1.n == c2.n && !memcmp(c1.ids, c2.ids, sizeof(int32_t) * (size_t)c1.n), "seeded sampling reproducible");
    /* cancellation */
    cb_ctx c3 = {.cancel_at = 3};
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, prompt, 5, &gp, on_tok, &c3, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(fin == PT_FINISH_CANCELLED || fin == PT_FINISH_EOS, "cancelled: %d", (int)fin);
    /* the context fills up: generation ends with LENGTH, not an error */
    gp.max_tokens = 100;
    gp.sampling.temperature = 0;
    cb_ctx c4 = {0};
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, prompt, 5, &gp, on_tok, &c4, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(pt_session_n_tokens(s) <= 40, "context bound");
    /* stop strings need a tokenizer */
    const char *stop[] = {"x"};
    gp.stop = stop;
    gp.n_stop = 1;
    pt_session_truncate(s, 0);
    CHECK(pt_generate(s, prompt, 5, &gp, NULL, NULL, &fin, &st) == PT_ERR_NOT_FOUND, "stop without tokenizer");
    /* logprobs */
    pt_sampling_params smp = pt_sampling_default_params(m);
    smp.temperature = 0;
    smp.n_logprobs = 5;
    pt_token_info ti;
    REQUIRE(pt_session_prompt(s, prompt, 3) == PT_OK, "%s", pt_last_error());
    REQUIRE(pt_session_sample(s, &smp, NULL, &ti) == PT_OK, "%s", pt_last_error());
    CHECK(ti.n_top == 5 && ti.top_ids[0] == ti.id && ti.logprob <= 0 && ti.top_logprobs[0] == ti.logprob,
          "logprobs: n_top %d id %d top %d lp %g", ti.n_top, ti.id, ti.top_ids[0], ti.logprob);
    pt_session_free(&s);
    pt_model_free(&m);
}

typedef struct {
    char text[4096];
    size_t len;
    int32_t ids[256];
    int n;
} text_ctx;

static int on_text(void *user, const pt_token_info *t, const char *text, size_t len) {
    text_ctx *c = user;
    if (t->id >= 0 && c->n < 256) c->ids[c->n++] = t->id;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    return 0;
}

/* Streaming text and stop strings on the bundled demo model (real tokenizer). */
static void test_stream_and_stop(void) {
    const char *dir = "models/kjv-llama-4bit";
    if (!pt_is_dir(dir)) TEST_SKIP("demo model absent");
    pt_model_params mp = pt_model_default_params();
    mp.n_threads = 1;
    pt_model *m = NULL;
    REQUIRE(pt_model_load(dir, &mp, &m) == PT_OK, "%s", pt_last_error());
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = 128};
    REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "%s", pt_last_error());
    int32_t *ids = NULL;
    size_t n = 0;
    const char *prompt = "In the beginning God";
    REQUIRE(pt_tokenize(m, prompt, strlen(prompt), 1, &ids, &n) == PT_OK, "%s", pt_last_error());
    pt_generate_params gp = pt_generate_default_params(m);
    gp.sampling.temperature = 0;
    gp.max_tokens = 24;
    text_ctx a = {0};
    pt_finish_reason fin;
    pt_generate_stats st;
    REQUIRE(pt_generate(s, ids, n, &gp, on_text, &a, &fin, &st) == PT_OK, "%s", pt_last_error());
    /* the streamed text is the detokenized ids */
    char *whole = NULL;
    REQUIRE(pt_detokenize(m, a.ids, (size_t)a.n, 1, &whole) == PT_OK, "%s", pt_last_error());
    CHECK(!strcmp(whole, a.text), "stream '%s' vs decode '%s'", a.text, whole);
    const char *at = strstr(whole, "heaven and");
    REQUIRE(at, "expected the Genesis text, got '%s'", whole);
    /* stop strings: the earliest of several wins, nothing of it is emitted */
    const char *stops[] = {"the earth", "heaven and"};
    gp.stop = stops;
    gp.n_stop = 2;
    text_ctx b = {0};
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, ids, n, &gp, on_text, &b, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(fin == PT_FINISH_STOP, "finish %d", (int)fin);
    CHECK(b.len == (size_t)(at - whole) && !strncmp(b.text, whole, b.len), "stopped text '%s'", b.text);
    /* a stop string that never occurs: everything arrives, held-back text included */
    const char *never[] = {"heaven and hell"};
    gp.stop = never;
    gp.n_stop = 1;
    text_ctx c = {0};
    pt_session_truncate(s, 0);
    REQUIRE(pt_generate(s, ids, n, &gp, on_text, &c, &fin, &st) == PT_OK, "%s", pt_last_error());
    CHECK(fin == PT_FINISH_LENGTH && !strcmp(c.text, whole), "held-back text flushed: '%s'", c.text);
    pt_free(whole);
    pt_free(ids);
    pt_session_free(&s);
    pt_model_free(&m);
}

/* A model whose embedding has more rows than its tokenizer has tokens (the
 * qwen2 fixture: 320 rows, 300 tokens, like Qwen2's 151936 for ~151665):
 * the padded ids are valid model outputs that decode to nothing, as the
 * reference tokenizer's decode skips them; ids past the model's vocabulary
 * stay an error; generation through such an id keeps going. */
static void test_padded_vocab(void) {
    const char *dir = "tests/fixtures/qwen2";
    if (!pt_is_dir(dir)) TEST_SKIP("qwen2 fixture absent");
    pt_model_params mp = pt_model_default_params();
    mp.n_threads = 1;
    pt_model *m = NULL;
    REQUIRE(pt_model_load(dir, &mp, &m) == PT_OK, "%s", pt_last_error());
    int V = pt_model_vocab_size(m);
    CHECK(V == 320, "fixture vocab %d", V);
    int32_t ids[3] = {20, 318, 21}, only[2] = {20, 21};
    char *a = NULL, *b = NULL;
    CHECK(pt_detokenize(m, ids, 3, 1, &a) == PT_OK, "padded id decodes: %s", pt_last_error());
    CHECK(pt_detokenize(m, only, 2, 1, &b) == PT_OK, "%s", pt_last_error());
    CHECK(a && b && !strcmp(a, b), "padded id adds no text: '%s' vs '%s'", a ? a : "", b ? b : "");
    pt_free(a);
    pt_free(b);
    int32_t bad = 320;
    a = NULL;
    CHECK(pt_detokenize(m, &bad, 1, 1, &a) == PT_ERR_RANGE, "id past the model vocabulary refused");
    pt_free(a);
    pt_detokenizer *d = NULL;
    REQUIRE(pt_detokenizer_create(m, 1, &d) == PT_OK, "%s", pt_last_error());
    const char *t = NULL;
    size_t tl = 1;
    CHECK(pt_detokenizer_push(d, 318, &t, &tl) == PT_OK && tl == 0, "stream: padded id gives no text");
    CHECK(pt_detokenizer_push(d, 320, &t, &tl) == PT_ERR_RANGE, "stream: id past the model vocabulary refused");
    pt_detokenizer_free(&d);
    /* greedy from this prompt picks padded ids (random weights): generation completes */
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = 64};
    REQUIRE(pt_session_create(m, &sp, &s) == PT_OK, "%s", pt_last_error());
    int32_t prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = i + 1;
    pt_generate_params gp = pt_generate_default_params(m);
    gp.sampling.temperature = 0;
    gp.max_tokens = 16;
    text_ctx c = {0};
    pt_finish_reason fin;
    pt_generate_stats st;
    CHECK(pt_generate(s, prompt, 24, &gp, on_text, &c, &fin, &st) == PT_OK, "generate: %s", pt_last_error());
    int padded = 0;
    for (int i = 0; i < c.n; i++) padded += c.ids[i] >= 300;
    CHECK(padded > 0 && c.n == 16, "%d tokens, %d of them padded ids", c.n, padded);
    pt_session_free(&s);
    pt_model_free(&m);
}

int main(void) {
    test_tmpdir(g_dir, sizeof g_dir);
    if (!write_model(g_dir, 64)) {
        printf("FAIL setup: cannot write the test model: %s\n", pt_last_error());
        return 1;
    }
    TEST_RUN(test_load_and_errors);
    TEST_RUN(test_chunking);
    TEST_RUN(test_threads_bit_identical);
    TEST_RUN(test_generate);
    TEST_RUN(test_stream_and_stop);
    TEST_RUN(test_padded_vocab);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("INFO could not remove %s\n", g_dir);
    return test_summary();
}
