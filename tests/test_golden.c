/* Tests of the golden-file reader (tests/golden.c) against hand-made files and
 * against every committed fixture: each golden.bin parses, and its records are
 * consistent with each other (margins = top-1 minus top-2 of the stored
 * logits, greedy continuations start at the argmax of the last position,
 * quantized-KV steps chain argmax to argmax, MLX test vectors reproduce their
 * group edges).  Not parity tests: those compare petrel with these files. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "golden.h"
#include "test.h"

static const char *FIXTURES[] = {
    "llama", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gemma4_e", "gemma4_moe",
    "gemma4_dense", "qwen3_5_text", "gemma4_mm", "llama_mlx_q4", "llama_mlx_q8", "llama_mlx_mixed_3_6",
    "gemma4_moe_mlx_q4", "minicpm", "qwen3_moe_mlx_q4",
};

/* ---- hand-made files ---- */

typedef struct {
    unsigned char b[4096];
    size_t n;
} buf_t;

static void put(buf_t *b, const void *p, size_t n) {
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put16(buf_t *b, uint16_t v) { put(b, &v, 2); }
static void put32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put64(buf_t *b, uint64_t v) { put(b, &v, 8); }

/* One file with arrays "a" (i32 [3]) and "b" (bf16 [2]); knobs break it. */
static size_t make_file(buf_t *b, const char *magic, const char *name2, int dtype2, uint64_t off2_delta,
                        uint64_t size2_delta, size_t truncate) {
    memset(b, 0, sizeof *b);
    put(b, magic, 8);
    put32(b, 2);
    put32(b, 0);
    size_t index = 2 + 1 + 2 + 4 + 16 + 2 + strlen(name2) + 2 + 4 + 16;
    uint64_t off1 = (16 + index + 15) & ~(uint64_t)15, off2 = off1 + 16;
    put16(b, 1);
    put(b, "a", 1);
    b->b[b->n++] = 1; /* i32 */
    b->b[b->n++] = 1;
    put32(b, 3);
    put64(b, off1);
    put64(b, 12);
    put16(b, (uint16_t)strlen(name2));
    put(b, name2, strlen(name2));
    b->b[b->n++] = (unsigned char)dtype2;
    b->b[b->n++] = 1;
    put32(b, 2);
    put64(b, off2 + off2_delta);
    put64(b, 4 + size2_delta);
    b->n = off1;
    int32_t a[3] = {7, -1, 300};
    put(b, a, 12);
    b->n = off2;
    put16(b, 0x3f80); /* 1.0 */
    put16(b, 0xc040); /* -3.0 */
    b->n += 32;         /* trailing bytes, so misaligned offsets stay inside the file */
    return truncate ? truncate : b->n;
}

static golden *open_bytes(const buf_t *b, size_t n, char *err, size_t errlen) {
    char dir[512], path[600];
    test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/g.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fwrite(b->b, 1, n, f);
    fclose(f);
    return golden_open(path, err, errlen);
}

static void test_golden_reads_handmade_file(void) {
    buf_t b;
    char err[512] = "";
    size_t n = make_file(&b, "PTGOLD1\0", "b", 2, 0, 0, 0);
    golden *g = open_bytes(&b, n, err, sizeof err);
    REQUIRE(g, "open failed: %s", err);
    CHECK(golden_count(g) == 2, "count %d", golden_count(g));
    const golden_array *a = golden_get(g, "a", 0, GOLDEN_I32, 1);
    REQUIRE(a && a->count == 3, "a missing");
    CHECK(((const int32_t *)a->data)[2] == 300, "a[2]");
    CHECK(golden_int(g, "a", -5) == -5, "golden_int of a 3-element array must fall back");
    const golden_array *bb = golden_get(g, "b", 1, GOLDEN_F32, 1);
    REQUIRE(bb && bb->f32, "b missing");
    CHECK(bb->f32[0] == 1.0f && bb->f32[1] == -3.0f, "bf16 widening: %g %g", bb->f32[0], bb->f32[1]);
    CHECK(golden_find(g, "c") == NULL, "absent name found");
    golden_close(g);
}

static void expect_reject(const char *what, const buf_t *b, size_t n, const char *needle) {
    char err[512] = "";
    golden *g = open_bytes(b, n, err, sizeof err);
    CHECK(g == NULL, "%s: accepted", what);
    CHECK(strstr(err, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, needle);
    golden_close(g);
}

static void test_golden_rejects_malformed_files(void) {
    buf_t b;
    size_t n;
    n = make_file(&b, "PTGOLD2\0", "b", 2, 0, 0, 0);
    expect_reject("bad magic", &b, n, "magic");
    n = make_file(&b, "PTGOLD1\0", "b", 2, 0, 0, 0);
    expect_reject("truncated header", &b, 12, "shorter");
    expect_reject("truncated index", &b, 30, "truncated");
    n = make_file(&b, "PTGOLD1\0", "b", 2, 4096, 0, 0);
    expect_reject("data outside", &b, n, "outside the file");
    n = make_file(&b, "PTGOLD1\0", "b", 2, 0, 2, 0);
    expect_reject("size mismatch", &b, n, "expected");
    n = make_file(&b, "PTGOLD1\0", "a", 2, 0, 0, 0);
    expect_reject("duplicate name", &b, n, "duplicate");
    n = make_file(&b, "PTGOLD1\0", "b", 9, 0, 0, 0);
    expect_reject("unknown dtype", &b, n, "dtype");
    n = make_file(&b, "PTGOLD1\0", "b", 2, 2, 0, 0);
    expect_reject("misaligned", &b, n, "aligned");
    char err[256] = "";
    CHECK(golden_open("tests/fixtures/does-not-exist/golden.bin", err, sizeof err) == NULL, "missing file");
    CHECK(strstr(err, "does-not-exist") != NULL, "message names the file: %s", err);
}

/* ---- committed fixtures ---- */

static int file_exists(const char *dir, const char *name) {
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static float top2_margin(const float *x, int n) {
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) { b = a; a = x[i]; }
        else if (x[i] > b) b = x[i];
    }
    return a - b;
}

/* Checks one fixture directory (files present, goldens consistent). */
static void check_fixture(const char *name) {
    char dir[512], err[512] = "";
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    CHECK(file_exists(dir, "config.json"), "%s: config.json missing", name);
    CHECK(file_exists(dir, "model.safetensors"), "%s: model.safetensors missing", name);
    CHECK(file_exists(dir, "tokenizer.json"), "%s: tokenizer.json missing", name);
    golden *g = golden_open_fixture(name, err, sizeof err);
    REQUIRE(g, "%s", err);
    int np = golden_n_prompts(g), glen = golden_int(g, "meta.greedy_len", 0);
    CHECK(np >= 3, "%s: %d prompts", name, np);
    CHECK(glen == 32, "%s: greedy_len %d", name, glen);
    int vocab0 = 0, saw_hidden = 0;
    for (int p = 0; p < np; p++) {
        int n = 0, npos = 0, V = 0, npos16 = 0, V16 = 0, nm = 0, nm16 = 0, ng = 0, ng16 = 0, ngm = 0;
        const int32_t *ids = golden_prompt_ids(g, p, &n);
        const float *l32 = golden_logits(g, p, GOLDEN_REF_F32, &npos, &V);
        const float *l16 = golden_logits(g, p, GOLDEN_REF_BF16, &npos16, &V16);
        const float *m32 = golden_margins(g, p, GOLDEN_REF_F32, &nm);
        const float *m16 = golden_margins(g, p, GOLDEN_REF_BF16, &nm16);
        const int32_t *g32 = golden_greedy(g, p, GOLDEN_REF_F32, &ng);
        const int32_t *g16 = golden_greedy(g, p, GOLDEN_REF_BF16, &ng16);
        const float *gm32 = golden_greedy_margins(g, p, GOLDEN_REF_F32, &ngm);
        REQUIRE(ids && l32 && l16 && m32 && m16 && g32 && g16 && gm32, "%s: prompt %d incomplete", name, p);
        CHECK(n > 0 && npos == n && npos16 == n && nm == n && nm16 == n, "%s p%d: lengths %d %d %d", name, p, n,
              npos, nm);
        CHECK(V == V16 && V > 0 && (vocab0 == 0 || V == vocab0), "%s p%d: vocab %d/%d", name, p, V, V16);
        vocab0 = V;
        CHECK(ng == glen && ng16 == glen && ngm == glen, "%s p%d: greedy lengths", name, p);
        for (int i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < V, "%s p%d: id %d out of range", name, p, ids[i]);
        for (int i = 0; i < ng; i++)
            CHECK(g32[i] >= 0 && g32[i] < V && g16[i] >= 0 && g16[i] < V, "%s p%d: greedy id out of range", name, p);
        CHECK(all_finite(l32, (size_t)n * V) && all_finite(l16, (size_t)n * V), "%s p%d: non-finite logit", name, p);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            if (top2_margin(l32 + (size_t)i * V, V) != m32[i]) bad++;
            if (top2_margin(l16 + (size_t)i * V, V) != m16[i]) bad++;
        }
        CHECK(bad == 0, "%s p%d: %d stored margins differ from the stored logits", name, p, bad);
        const float *last32 = l32 + (size_t)(n - 1) * V, *last16 = l16 + (size_t)(n - 1) * V;
        if (m32[n - 1] > 0)
            CHECK(g32[0] == golden_argmax(last32, V), "%s p%d: greedy f32 starts at %d, argmax %d", name, p, g32[0],
                  golden_argmax(last32, V));
        if (m16[n - 1] > 0)
            CHECK(g16[0] == golden_argmax(last16, V), "%s p%d: greedy bf16 starts at %d, argmax %d", name, p, g16[0],
                  golden_argmax(last16, V));
        CHECK(fabsf(gm32[0] - m32[n - 1]) <= 1e-5f * (1 + fabsf(m32[n - 1])), "%s p%d: first greedy margin %g vs %g",
              name, p, gm32[0], m32[n - 1]);
        if (p == golden_hidden_prompt(g)) {
            int hp = 0, H = 0, E = 0;
            const float *h0 = golden_hidden(g, p, 0, &hp, &H, &E);
            REQUIRE(h0, "%s: hidden states missing", name);
            CHECK(E >= 3 && hp == n && H > 0, "%s: hidden shape %d x %d x %d", name, E, hp, H);
            CHECK(all_finite(h0, (size_t)E * hp * H), "%s: non-finite hidden state", name);
            CHECK(golden_hidden(g, p, E, NULL, NULL, NULL) == NULL, "%s: hidden entry past the end", name);
            saw_hidden = 1;
        }
    }
    CHECK(saw_hidden, "%s: no hidden states", name);
    for (int s = 0; s < golden_n_qkv(g); s++) {
        golden_qkv q;
        REQUIRE(golden_qkv_get(g, s, &q) == 0, "%s: qkv scenario %d malformed", name, s);
        CHECK(q.vocab == vocab0 && q.group_size == 64 && q.prefill_chunk > 0, "%s qkv%d: params", name, s);
        CHECK(q.greedy[0] == golden_argmax(q.prompt_logits + (size_t)(q.n_prompt - 1) * q.vocab, q.vocab),
              "%s qkv%d: first token", name, s);
        for (int j = 0; j + 1 < q.n_greedy; j++)
            CHECK(q.greedy[j + 1] == golden_argmax(q.step_logits + (size_t)j * q.vocab, q.vocab),
                  "%s qkv%d: step %d", name, s, j);
        if (q.kv_bits == 0) CHECK(file_exists(dir, "kv_config.json"), "%s: kv_config.json missing", name);
    }
    golden_close(g);
}

static void test_golden_every_fixture_is_consistent(void) {
    size_t nf = sizeof FIXTURES / sizeof FIXTURES[0];
    for (size_t i = 0; i < nf; i++) check_fixture(FIXTURES[i]);
    /* Any other directory with a golden.bin must at least parse. */
    DIR *d = opendir("tests/fixtures");
    REQUIRE(d, "tests/fixtures missing");
    struct dirent *e;
    int extra = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024], err[512];
        snprintf(path, sizeof path, "tests/fixtures/%s/golden.bin", e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        golden *g = golden_open(path, err, sizeof err);
        CHECK(g, "%s", err);
        golden_close(g);
        extra++;
    }
    closedir(d);
    printf("INFO golden: %zu fixtures checked, %d golden files parsed\n", nf, extra);
}

/* ---- MLX quantization vectors ---- */

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void test_golden_quant_vectors(void) {
    char err[512];
    golden *g = golden_open("tests/fixtures/quant/vectors.bin", err, sizeof err);
    REQUIRE(g, "%s", err);
    int nc = golden_int(g, "meta.n_cases", 0);
    CHECK(nc >= 24, "%d cases", nc);
    int edges_checked = 0;
    for (int k = 0; k < nc; k++) {
        char nm[64];
        snprintf(nm, sizeof nm, "case.%d.params", k);
        const golden_array *pa = golden_get(g, nm, 0, GOLDEN_I32, 1);
        snprintf(nm, sizeof nm, "case.%d.input", k);
        const golden_array *in = golden_get(g, nm, 1, GOLDEN_F32, 2);
        snprintf(nm, sizeof nm, "case.%d.words", k);
        const golden_array *wd = golden_get(g, nm, 0, GOLDEN_U32, 2);
        snprintf(nm, sizeof nm, "case.%d.scales", k);
        const golden_array *sc = golden_get(g, nm, 1, GOLDEN_F32, 2);
        snprintf(nm, sizeof nm, "case.%d.biases", k);
        const golden_array *bi = golden_get(g, nm, 1, GOLDEN_F32, 2);
        REQUIRE(pa && pa->count == 3 && in && wd && sc && bi, "case %d incomplete", k);
        const int32_t *prm = pa->data;
        int bits = prm[0], gs = prm[1], is_bf16 = prm[2] == 0;
        int64_t R = in->dims[0], C = in->dims[1];
        CHECK(wd->dims[0] == R && wd->dims[1] == C * bits / 32, "case %d: words shape", k);
        CHECK(sc->dims[0] == R && sc->dims[1] == C / gs && bi->dims[1] == C / gs, "case %d: scales shape", k);
        CHECK((in->dtype == GOLDEN_BF16) == is_bf16 && sc->dtype == in->dtype, "case %d: dtypes", k);
        const uint32_t *words = wd->data;
        for (int64_t r = 0; r < R; r++) {
            for (int64_t gi = 0; gi < C / gs; gi++) {
                const float *w = in->f32 + r * C + gi * gs;
                float wmin = w[0], wmax = 0;
                for (int j = 0; j < gs; j++) {
                    if (w[j] < wmin) wmin = w[j];
                    if (w[j] > wmax) wmax = w[j];
                }
                float edge = fabsf(wmin) > fabsf(wmax) ? wmin : wmax;
                float b = bi->f32[r * (C / gs) + gi], s = sc->f32[r * (C / gs) + gi];
                if (b != 0) {
                    /* The bias is the group's edge value (Metal rule), rounded to the dtype. */
                    CHECK(b == (is_bf16 ? bf16_round(edge) : edge), "case %d r%lld g%lld: bias %g, edge %g", k,
                          (long long)r, (long long)gi, b, edge);
                    edges_checked++;
                }
                CHECK(s != 0 && isfinite(s), "case %d: scale %g", k, s);
                /* Codes unpacked LSB-first must lie in range and dequantize finitely. */
                for (int j = 0; j < gs; j++) {
                    int64_t i = gi * gs + j, bit = i * bits;
                    uint64_t lo = words[r * (C * bits / 32) + bit / 32];
                    uint64_t hi = (bit % 32 + bits > 32) ? words[r * (C * bits / 32) + bit / 32 + 1] : 0;
                    uint32_t q = (uint32_t)(((lo | (hi << 32)) >> (bit % 32)) & ((1u << bits) - 1));
                    CHECK(isfinite(s * (float)q + b), "case %d: dequant", k);
                    if (w[j] == edge && b != 0) CHECK(q == 0, "case %d: the edge value must get code 0, got %u", k, q);
                }
            }
        }
    }
    CHECK(edges_checked > 100, "only %d groups with a bias", edges_checked);
    golden_close(g);
}

static void test_golden_demo_model(void) {
    char err[512];
    struct stat st;
    if (stat("tests/fixtures/demo/golden.bin", &st) != 0) TEST_SKIP("no demo goldens yet");
    golden *g = golden_open("tests/fixtures/demo/golden.bin", err, sizeof err);
    REQUIRE(g, "%s", err);
    int np = golden_n_prompts(g);
    CHECK(np >= 2, "%d demo prompts", np);
    for (int p = 0; p < np; p++) {
        int n = 0, ng = 0;
        const int32_t *ids = golden_prompt_ids(g, p, &n);
        const int32_t *gr = golden_greedy(g, p, GOLDEN_REF_F32, &ng);
        CHECK(ids && n > 0 && gr && ng > 0, "demo prompt %d incomplete", p);
        for (int i = 0; gr && i < ng; i++) CHECK(gr[i] >= 0 && gr[i] < 8192, "demo greedy id %d", gr[i]);
    }
    golden_close(g);
}

int main(void) {
    TEST_RUN(test_golden_reads_handmade_file);
    TEST_RUN(test_golden_rejects_malformed_files);
    TEST_RUN(test_golden_every_fixture_is_consistent);
    TEST_RUN(test_golden_quant_vectors);
    TEST_RUN(test_golden_demo_model);
    return test_summary();
}
