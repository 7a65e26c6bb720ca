/* Tokenizer API and bad input: invalid tokenizer.json files fail with a
 * message naming what is wrong (missing model, unknown component types, bad
 * regexes, merges naming unknown tokens...), invalid UTF-8 input and
 * out-of-range ids are rejected, model-directory config files resolve the
 * special ids, the streaming detokenizer holds back split byte sequences, and
 * edge inputs (empty, NUL bytes, a 200k-character word) round-trip. */
#include "test.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>

#define FIX "tests/fixtures/tokenizers/"

/* A minimal valid tokenizer body: vocab a b ab, merge "a b". */
#define MODEL_OK "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

static void expect_load_error(const char *json, pt_status want, const char *needle) {
    pt_tokenizer *t = NULL;
    pt_status st = pt_tokenizer_load_json(json, strlen(json), "test.json", &t);
    CHECK(st == want, "status %s, want %s for %s (message: %s)", pt_status_name(st), pt_status_name(want),
          json, pt_last_error());
    CHECK(t == NULL, "tokenizer returned on error");
    CHECK(strstr(pt_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", pt_last_error(), needle);
    pt_tokenizer_free(&t);
}

static void test_bad_files(void) {
    expect_load_error("not json", PT_ERR_FORMAT, "not valid JSON");
    expect_load_error("[]", PT_ERR_FORMAT, "expected a JSON object");
    expect_load_error("{}", PT_ERR_FORMAT, "missing \"model\"");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", PT_ERR_UNSUPPORTED, "WordPiece");
    expect_load_error("{\"model\":{\"type\":\"Nonsense\"}}", PT_ERR_FORMAT, "unknown model type \"Nonsense\"");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":[]}}", PT_ERR_FORMAT, "model.vocab");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1}}}", PT_ERR_FORMAT, "model.vocab[\"a\"]");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1}}}", PT_ERR_FORMAT, "duplicate token \"a\"");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a q\"]}}", PT_ERR_FORMAT,
                      "merges[0]: token \"q\" is not in the vocabulary");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}}", PT_ERR_FORMAT,
                      "merged token \"ab\" is not in the vocabulary");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b c\"]}}", PT_ERR_FORMAT,
                      "expected \"a b\"");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[42]}}", PT_ERR_FORMAT, "merges[0]");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"unk_token\":\"<unk>\"}}", PT_ERR_FORMAT,
                      "unk_token \"<unk>\" is not in the vocabulary");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"dropout\":0.1}}", PT_ERR_UNSUPPORTED, "dropout");
    expect_load_error("{\"normalizer\":{\"type\":\"Bogus\"}," MODEL_OK "}", PT_ERR_FORMAT,
                      "unknown normalizer type \"Bogus\"");
    expect_load_error("{\"normalizer\":{\"type\":\"Precompiled\"}," MODEL_OK "}", PT_ERR_UNSUPPORTED, "Precompiled");
    expect_load_error("{\"normalizer\":{\"kind\":\"NFC\"}," MODEL_OK "}", PT_ERR_FORMAT, "no \"type\"");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"}," MODEL_OK "}",
                      PT_ERR_FORMAT, "bad regex \"(unclosed\"");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"x\"},\"behavior\":\"Sideways\"}," MODEL_OK "}",
                      PT_ERR_FORMAT, "behavior");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Glob\":\"x\"},\"behavior\":\"Isolated\"}," MODEL_OK "}",
                      PT_ERR_FORMAT, "pattern");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Whitespace\"},{\"type\":\"Mystery\"}]}," MODEL_OK "}",
                      PT_ERR_FORMAT, "pre_tokenizer.pretokenizers[1]: unknown pre_tokenizer type \"Mystery\"");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\",\"prepend_scheme\":\"first\"}," MODEL_OK "}",
                      PT_ERR_FORMAT, "replacement: expected one character");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\",\"prepend_scheme\":\"sometimes\"}," MODEL_OK "}",
                      PT_ERR_FORMAT, "prepend_scheme");
    expect_load_error("{\"decoder\":{\"type\":\"Telepathy\"}," MODEL_OK "}", PT_ERR_FORMAT, "unknown decoder type \"Telepathy\"");
    expect_load_error("{\"decoder\":{\"type\":\"Strip\",\"content\":\" \",\"start\":1}," MODEL_OK "}", PT_ERR_NOT_FOUND, "decoder.stop");
    expect_load_error("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{}}," MODEL_OK "}",
                      PT_ERR_FORMAT, "no entry with ids for \"<s>\"");
    expect_load_error("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[99],\"tokens\":[\"<s>\"]}}}," MODEL_OK "}",
                      PT_ERR_FORMAT, "post_processor id 99 is outside the vocabulary");
    expect_load_error("{\"added_tokens\":[{\"id\":5}]," MODEL_OK "}", PT_ERR_FORMAT, "added_tokens[0].content");
    /* strings that would be inserted into text must be valid UTF-8 (found by the fuzzer) */
    expect_load_error("{\"normalizer\":{\"type\":\"Prepend\",\"prepend\":\"\xff_\"}," MODEL_OK "}", PT_ERR_FORMAT,
                      "normalizer.prepend: not valid UTF-8");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\xc3\":0}}}", PT_ERR_FORMAT, "not valid UTF-8");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"\xe2\x96\"},\"behavior\":\"Isolated\"}," MODEL_OK "}",
                      PT_ERR_FORMAT, "pattern: not valid UTF-8");
    expect_load_error("{\"added_tokens\":[{\"id\":-3,\"content\":\"x\"}]," MODEL_OK "}", PT_ERR_FORMAT, "added_tokens[0].id");

    pt_tokenizer *t = NULL;
    CHECK(pt_tokenizer_load("tests/fixtures/tokenizers/does-not-exist.json", &t) == PT_ERR_IO, "missing file");
    CHECK(strstr(pt_last_error(), "does-not-exist.json") != NULL, "message names the file: %s", pt_last_error());
}

static pt_tokenizer *load(const char *name) {
    char p[256];
    snprintf(p, sizeof p, FIX "%s.json", name);
    pt_tokenizer *t = NULL;
    if (pt_tokenizer_load(p, &t) != PT_OK) printf("    load %s: %s\n", p, pt_last_error());
    return t;
}

static void test_bad_input(void) {
    pt_tokenizer *t = load("gpt2");
    REQUIRE(t, "load");
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(pt_tokenizer_encode(t, "abc\xff" "def", 7, 0, &ids, &n) == PT_ERR_INVALID_ARG, "invalid UTF-8 accepted");
    CHECK(strstr(pt_last_error(), "byte offset 3") != NULL, "message: %s", pt_last_error());
    CHECK(pt_tokenizer_encode(t, "\xed\xa0\x80", 3, 0, &ids, &n) == PT_ERR_INVALID_ARG, "surrogate accepted");
    CHECK(pt_tokenizer_encode(t, "\xc0\xaf", 2, 0, &ids, &n) == PT_ERR_INVALID_ARG, "overlong accepted");
    CHECK(ids == NULL, "ids set on error");
    int32_t bad[2] = {1, 1 << 30};
    char *text = NULL;
    CHECK(pt_tokenizer_decode(t, bad, 2, 0, &text, NULL) == PT_ERR_RANGE, "out-of-range id accepted");
    CHECK(strstr(pt_last_error(), "position 1") != NULL, "message: %s", pt_last_error());
    int32_t neg = -1;
    CHECK(pt_tokenizer_decode(t, &neg, 1, 0, &text, NULL) == PT_ERR_RANGE, "negative id accepted");
    pt_tok_stream *s = NULL;
    REQUIRE(pt_tok_stream_create(t, 0, &s) == PT_OK, "stream");
    const char *p;
    size_t pl;
    CHECK(pt_tok_stream_push(s, 1 << 30, &p, &pl) == PT_ERR_RANGE, "stream accepted a bad id");
    pt_tok_stream_free(&s);
    CHECK(s == NULL, "free sets NULL");
    pt_tokenizer_free(&t);
    CHECK(t == NULL, "free sets NULL");
    pt_tokenizer_free(&t); /* NULL-safe */
}

static void roundtrip(pt_tokenizer *t, const char *text, size_t len, const char *what) {
    int32_t *ids = NULL;
    size_t n = 0;
    pt_status st = pt_tokenizer_encode(t, text, len, 0, &ids, &n);
    CHECK(st == PT_OK, "%s: encode: %s", what, pt_last_error());
    CHECK(ids != NULL, "%s: ids NULL", what);
    char *back = NULL;
    size_t bl = 0;
    st = pt_tokenizer_decode(t, ids, n, 0, &back, &bl);
    CHECK(st == PT_OK && bl == len && memcmp(back, text, len) == 0, "%s: round trip differs (%zu vs %zu bytes)",
          what, bl, len);
    free(back);
    free(ids);
}

static void test_edge_inputs(void) {
    pt_tokenizer *t = load("gpt2");
    REQUIRE(t, "load");
    roundtrip(t, "", 0, "empty");
    roundtrip(t, "a\0b\0\0c", 6, "NUL bytes");
    size_t L = 200000;
    char *w = malloc(L);
    for (size_t i = 0; i < L; i++) w[i] = (char)('a' + (i * 7 + i / 13) % 26);
    roundtrip(t, w, L, "200k-letter word");
    memset(w, ' ', L);
    roundtrip(t, w, L, "200k spaces");
    free(w);
    pt_tokenizer_free(&t);
    /* A regex whose JIT match needs more than the default 32 KiB stack on a
     * 200k-byte subject: the match is retried with a large stack. */
    const char *js = "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?:ab|ba)+\"},"
                     "\"behavior\":\"Isolated\",\"invert\":false}," MODEL_OK "}";
    REQUIRE(pt_tokenizer_load_json(js, strlen(js), "t.json", &t) == PT_OK, "%s", pt_last_error());
    w = malloc(L);
    for (size_t i = 0; i < L; i++) w[i] = "ab"[i % 2];
    int32_t *big = NULL;
    size_t nb = 0;
    CHECK(pt_tokenizer_encode(t, w, L, 0, &big, &nb) == PT_OK, "deep regex: %s", pt_last_error());
    CHECK(nb == L / 2, "deep regex: %zu ids", nb);
    for (size_t i = 0; i < nb; i++)
        if (big[i] != 2) { CHECK(0, "id %zu is %d, want 2 (\"ab\")", i, big[i]); break; }
    free(big);
    free(w);
    pt_tokenizer_free(&t);
    t = load("gemma");
    REQUIRE(t, "load gemma");
    roundtrip(t, "", 0, "gemma empty");
    int32_t *ids = NULL;
    size_t n = 5;
    CHECK(pt_tokenizer_encode(t, "", 0, 1, &ids, &n) == PT_OK && n == 1 && ids[0] == 2, "empty + special = [<bos>]");
    free(ids);
    pt_tokenizer_free(&t);
}

static void test_lookups(void) {
    pt_tokenizer *t = load("llama3");
    REQUIRE(t, "load");
    int32_t eot = pt_tokenizer_piece_to_id(t, "<|eot_id|>", 10);
    CHECK(eot > 0, "eot id");
    CHECK(pt_tokenizer_is_special(t, eot), "eot special");
    size_t l;
    const char *p = pt_tokenizer_id_to_piece(t, eot, &l);
    CHECK(p && l == 10 && !memcmp(p, "<|eot_id|>", 10), "piece of eot");
    CHECK(pt_tokenizer_vocab_size(t) == eot + 1, "vocab size %d (eot is the last added token, %d)", pt_tokenizer_vocab_size(t), eot);
    CHECK(pt_tokenizer_piece_to_id(t, "\xc4\xa0", 2) >= 0, "'Ġ' is in the byte alphabet");
    CHECK(pt_tokenizer_piece_to_id(t, "no such piece", 13) == -1, "unknown piece");
    CHECK(pt_tokenizer_id_to_piece(t, -5, NULL) == NULL, "negative id");
    CHECK(!pt_tokenizer_is_special(t, 0), "byte token not special");
    char *txt = NULL;
    CHECK(pt_tokenizer_token_text(t, pt_tokenizer_piece_to_id(t, "\xc4\xa0", 2), &txt, &l) == PT_OK && l == 1 &&
              txt[0] == ' ', "token text of 'Ġ' is a space");
    free(txt);
    /* no config files: nothing resolved */
    CHECK(pt_tokenizer_bos_id(t) == -1 && pt_tokenizer_eos_id(t) == -1, "no config, no specials");
    pt_tokenizer_free(&t);
}

static void write(const char *dir, const char *name, const char *text) {
    char *p = pt_path_join(dir, name);
    pt_write_file(p, text, strlen(text));
    free(p);
}

static void test_model_dir(void) {
    char dir[512];
    test_tmpdir(dir, sizeof dir);
    pt_tokenizer *t = NULL;
    CHECK(pt_tokenizer_load_dir(dir, &t) == PT_ERR_NOT_FOUND, "empty dir");
    CHECK(strstr(pt_last_error(), "tokenizer.json") != NULL, "message: %s", pt_last_error());
    char *src;
    size_t n;
    REQUIRE(pt_read_file(FIX "llama3.json", &src, &n) == PT_OK, "read");
    char *dst = pt_path_join(dir, "tokenizer.json");
    pt_write_file(dst, src, n);
    free(dst);
    free(src);
    REQUIRE(pt_tokenizer_load_dir(dir, &t) == PT_OK, "load without configs: %s", pt_last_error());
    pt_tokenizer_free(&t);
    write(dir, "tokenizer_config.json",
          "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": {\"content\": \"<|eot_id|>\", \"special\": true},"
          " \"pad_token\": null, \"add_bos_token\": true, \"chat_template\": \"{{ x }}\"}");
    REQUIRE(pt_tokenizer_load_dir(dir, &t) == PT_OK, "load: %s", pt_last_error());
    int32_t bos = pt_tokenizer_piece_to_id(t, "<|begin_of_text|>", 17);
    int32_t eot = pt_tokenizer_piece_to_id(t, "<|eot_id|>", 10);
    int32_t eom = pt_tokenizer_piece_to_id(t, "<|eom_id|>", 10);
    CHECK(pt_tokenizer_bos_id(t) == bos, "bos %d", pt_tokenizer_bos_id(t));
    CHECK(pt_tokenizer_eos_id(t) == eot, "eos %d", pt_tokenizer_eos_id(t));
    CHECK(pt_tokenizer_add_bos(t) == 1 && pt_tokenizer_add_eos(t) == -1, "add_bos/add_eos");
    CHECK(pt_tokenizer_bos_token(t) && !strcmp(pt_tokenizer_bos_token(t), "<|begin_of_text|>"), "bos token");
    CHECK(pt_tokenizer_is_eos(t, eot) && !pt_tokenizer_is_eos(t, eom), "eos set from tokenizer_config");
    pt_tokenizer_free(&t);
    char gc[128];
    snprintf(gc, sizeof gc, "{\"bos_token_id\": %d, \"eos_token_id\": [%d, %d]}", bos, eom, eot);
    write(dir, "generation_config.json", gc);
    REQUIRE(pt_tokenizer_load_dir(dir, &t) == PT_OK, "load: %s", pt_last_error());
    const int32_t *e;
    CHECK(pt_tokenizer_eos_ids(t, &e) == 2 && e[0] == eom && e[1] == eot, "eos set from generation_config");
    CHECK(pt_tokenizer_is_eos(t, eom) && pt_tokenizer_is_eos(t, eot) && !pt_tokenizer_is_eos(t, bos), "is_eos");
    pt_tokenizer_free(&t);
    write(dir, "generation_config.json", "{\"eos_token_id\": 99999999}");
    CHECK(pt_tokenizer_load_dir(dir, &t) == PT_ERR_FORMAT, "eos id out of range accepted");
    CHECK(strstr(pt_last_error(), "eos_token_id") != NULL, "message: %s", pt_last_error());
    write(dir, "generation_config.json", "{\"eos_token_id\": null}");
    write(dir, "tokenizer_config.json", "{\"eos_token\": ");
    CHECK(pt_tokenizer_load_dir(dir, &t) == PT_ERR_FORMAT, "broken tokenizer_config accepted");
    CHECK(strstr(pt_last_error(), "tokenizer_config.json") != NULL, "message: %s", pt_last_error());
}

/* "১২৩" falls back to nine <0xXX> tokens in the gemma fixture: the stream
 * must emit nothing until a character completes, then exactly it. */
static void test_stream_byte_fallback(void) {
    pt_tokenizer *t = load("gemma");
    REQUIRE(t, "load");
    const char *text = "x \xe0\xa7\xa7\xe0\xa7\xa8 y";
    int32_t *ids = NULL;
    size_t n = 0;
    REQUIRE(pt_tokenizer_encode(t, text, strlen(text), 0, &ids, &n) == PT_OK, "encode");
    int n_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = pt_tokenizer_id_to_piece(t, ids[i], &l);
        n_bytes += l == 6 && !memcmp(p, "<0x", 3);
    }
    REQUIRE(n_bytes == 6, "expected 6 byte-fallback tokens, found %d", n_bytes);
    pt_tok_stream *s = NULL;
    REQUIRE(pt_tok_stream_create(t, 0, &s) == PT_OK, "create");
    char acc[64];
    size_t an = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        REQUIRE(pt_tok_stream_push(s, ids[i], &p, &l) == PT_OK, "push");
        CHECK(pt_utf8_invalid_offset(p, l) < 0, "push %zu emitted incomplete UTF-8", i);
        CHECK(memmem(p, l, "\xef\xbf\xbd", 3) == NULL, "U+FFFD emitted mid-stream");
        memcpy(acc + an, p, l);
        an += l;
    }
    const char *p;
    size_t l;
    REQUIRE(pt_tok_stream_flush(s, &p, &l) == PT_OK, "flush");
    memcpy(acc + an, p, l);
    an += l;
    CHECK(an == strlen(text) && !memcmp(acc, text, an), "stream text differs");
    /* a dangling lead byte is released as U+FFFD at flush */
    int32_t e0 = pt_tokenizer_piece_to_id(t, "<0xE0>", 6);
    REQUIRE(pt_tok_stream_push(s, e0, &p, &l) == PT_OK && l == 0, "lead byte held");
    REQUIRE(pt_tok_stream_flush(s, &p, &l) == PT_OK, "flush");
    CHECK(l == 3 && !memcmp(p, "\xef\xbf\xbd", 3), "flush gives U+FFFD");
    pt_tok_stream_free(&s);
    free(ids);
    pt_tokenizer_free(&t);
}

/* One loaded tokenizer is read-only: two threads encoding at once get the
 * same ids as one thread alone. */
typedef struct { const pt_tokenizer *t; const char *text; size_t len; int32_t *ids; size_t n; int rc; } enc_job;
static void *enc_thread(void *p) {
    enc_job *j = p;
    for (int r = 0; r < 20 && j->rc == 0; r++) {
        free(j->ids);
        j->ids = NULL;
        j->rc = pt_tokenizer_encode(j->t, j->text, j->len, 1, &j->ids, &j->n);
    }
    return NULL;
}
static void test_threads(void) {
    pt_tokenizer *t = load("qwen2");
    REQUIRE(t, "load");
    const char *texts[2] = {"Hello world, it's <|im_start|> 12345 \xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9 \xf0\x9f\x98\x80\n\n",
                            "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 they'll   go<think>x</think>"};
    enc_job ref[2], j[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        ref[k] = (enc_job){t, texts[k], strlen(texts[k]), NULL, 0, 0};
        ref[k].rc = pt_tokenizer_encode(t, ref[k].text, ref[k].len, 1, &ref[k].ids, &ref[k].n);
        j[k] = (enc_job){t, texts[k], strlen(texts[k]), NULL, 0, 0};
    }
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, enc_thread, &j[k]);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        CHECK(ref[k].rc == 0 && j[k].rc == 0, "encode failed");
        CHECK(j[k].n == ref[k].n && !memcmp(j[k].ids, ref[k].ids, ref[k].n * sizeof(int32_t)), "thread %d ids differ", k);
        free(ref[k].ids);
        free(j[k].ids);
    }
    pt_tokenizer_free(&t);
}

int main(void) {
    TEST_RUN(test_threads);
    TEST_RUN(test_bad_files);
    TEST_RUN(test_bad_input);
    TEST_RUN(test_edge_inputs);
    TEST_RUN(test_lookups);
    TEST_RUN(test_model_dir);
    TEST_RUN(test_stream_byte_fallback);
    return test_summary();
}
