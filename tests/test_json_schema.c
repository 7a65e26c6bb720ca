/* Tests for constrained JSON generation (src/server/json_schema.c): schema
 * compilation errors, the byte matcher on valid and invalid documents, and the
 * token mask driving random generation over a synthetic vocabulary (every
 * generated document must parse and satisfy its schema). */
#include "test.h"

#include "server/json_schema.h"
#include "server/stop.h"

#include <cjson/cJSON.h>
#include <stdint.h>

static pt_jschema *compile(const char *schema_json) {
    pt_jschema *s = NULL;
    if (!schema_json) {
        pt_jschema_compile(NULL, &s);
        return s;
    }
    cJSON *j = cJSON_Parse(schema_json);
    if (!j) return NULL;
    pt_status st = pt_jschema_compile(j, &s);
    cJSON_Delete(j);
    if (st != PT_OK) printf("    (compile: %s)\n", pt_last_error());
    return s;
}

static int matches(const pt_jschema *s, const char *doc) {
    pt_jsm m;
    pt_jsm_init(&m, s);
    if (!pt_jsm_feed(&m, doc, strlen(doc))) return 0;
    return pt_jsm_accepts(&m);
}

static void test_schema_matcher_types(void) {
    pt_jschema *s = compile("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                            "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                            "{\"type\":\"string\"},\"minItems\":1,\"maxItems\":2}},"
                            "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    REQUIRE(s, "compiles");
    CHECK(matches(s, "{\"name\":\"Ann\",\"age\":31}"), "minimal");
    CHECK(matches(s, "{ \"age\" : -4 , \"name\" : \"\\u00e9\\n\", \"tags\":[\"a\"] }"), "spaces, escapes");
    CHECK(matches(s, "{\"name\":\"caf\xc3\xa9\",\"age\":0}"), "utf-8 in string");
    CHECK(!matches(s, "{\"name\":\"Ann\"}"), "missing required age");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":1.5}"), "integer with fraction");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":01}"), "leading zero");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":1,\"x\":1}"), "additional property");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"name\":\"B\",\"age\":1}"), "duplicate key");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":1,\"tags\":[]}"), "minItems");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}"), "maxItems");
    CHECK(!matches(s, "{\"name\":\"a\x01\",\"age\":1}"), "control char in string");
    CHECK(!matches(s, "{\"name\":\"\xff\",\"age\":1}"), "invalid utf-8");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":1} x"), "trailing data");
    CHECK(!matches(s, "{\"name\":\"Ann\",\"age\":1"), "incomplete is not accepted");
    pt_jschema_free(&s);
}

static void test_schema_matcher_enum_anyof_ref(void) {
    pt_jschema *s = compile(
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":[1,12,\"x\",null,"
        "{\"k\":[true]}]},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
        "\"required\":[\"v\"],\"additionalProperties\":false}},"
        "\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"},{\"const\":\"fixed\"}]}");
    REQUIRE(s, "compiles");
    CHECK(matches(s, "null"), "anyOf null");
    CHECK(matches(s, "\"fixed\""), "const");
    CHECK(!matches(s, "\"fixe\""), "const prefix");
    CHECK(matches(s, "{\"v\":1}"), "enum 1");
    CHECK(matches(s, "{\"v\":12}"), "enum 12 (extends 1)");
    CHECK(!matches(s, "{\"v\":13}"), "not in enum");
    CHECK(matches(s, "{\"v\":{\"k\":[true]}}"), "enum object");
    CHECK(matches(s, "{\"v\":\"x\",\"kids\":[{\"v\":null,\"kids\":[{\"v\":12}]}]}"), "recursive $ref");
    CHECK(!matches(s, "{\"kids\":[]}"), "required through $ref");
    pt_jschema_free(&s);

    s = compile("{\"type\":[\"number\",\"boolean\"]}");
    REQUIRE(s, "type list");
    CHECK(matches(s, "-0.5e+3"), "number");
    CHECK(matches(s, "false"), "bool");
    CHECK(!matches(s, "\"s\""), "string not allowed");
    CHECK(!matches(s, "1."), "incomplete number");
    pt_jschema_free(&s);

    s = compile(NULL); /* json_object */
    REQUIRE(s, "json_object");
    CHECK(matches(s, "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}"), "any object");
    CHECK(!matches(s, "[1]"), "top must be an object");
    pt_jschema_free(&s);
}

static void test_schema_compile_errors(void) {
    const char *bad[][2] = {
        {"{\"type\":\"strnig\"}", "unknown type"},
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "pattern"},
        {"{\"$ref\":\"#/$defs/missing\"}", "cannot resolve"},
        {"{\"$ref\":\"http://x/y\"}", "cannot resolve"},
        {"{\"enum\":[]}", "non-empty"},
        {"{\"type\":\"object\",\"required\":[\"a\"],\"additionalProperties\":false}", "required"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", "minItems"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *j = cJSON_Parse(bad[i][0]);
        pt_jschema *s = NULL;
        pt_status st = pt_jschema_compile(j, &s);
        CHECK(st != PT_OK && s == NULL, "%s should fail", bad[i][0]);
        CHECK(strstr(pt_last_error(), bad[i][1]) != NULL, "message for %s: %s", bad[i][0],
              pt_last_error());
        cJSON_Delete(j);
    }
}

/* A synthetic vocabulary: every printable byte, common JSON pieces and words,
 * multi-byte UTF-8, a control token ("") and an eos. */
static const char *vocab_words[] = {
    "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "  ", "{\"", "\":", "\",", "\"}", "\":\"",
    "name", "age", "tags", "true", "false", "null", "nul", "12", "0", "-", ".", "e", "\\", "\\n",
    "\\u00", "caf\xc3\xa9", "\xc3", "\xa9", "x\"}", "\"name\"", "\"age\":", "1}", "]}", "kids", "v",
};

static void build_vocab(pt_vocab_index *vi, int *eos_id) {
    int n_words = (int)(sizeof vocab_words / sizeof vocab_words[0]);
    int n = 95 + n_words + 2;
    char **text = calloc((size_t)n, sizeof(char *));
    uint8_t *eos = calloc((size_t)n, 1);
    int k = 0;
    for (int c = 32; c < 127; c++) {
        char b[2] = {(char)c, 0};
        text[k++] = strdup(b);
    }
    for (int i = 0; i < n_words; i++) text[k++] = strdup(vocab_words[i]);
    text[k++] = strdup(""); /* control token */
    *eos_id = k;
    eos[k] = 1;
    text[k++] = strdup("</s>");
    pt_status st = pt_vocab_index_build(vi, n, text, eos);
    free(eos);
    if (st != PT_OK) abort();
}

/* Reference mask: feed every token separately (no prefix sharing). */
static void slow_mask(const pt_jsm *m, const pt_vocab_index *vi, uint8_t *allowed) {
    int acc = pt_jsm_accepts(m);
    for (int id = 0; id < vi->n_vocab; id++) {
        if (vi->is_eos[id]) {
            allowed[id] = (uint8_t)acc;
            continue;
        }
        if (!vi->len[id]) {
            allowed[id] = 0;
            continue;
        }
        pt_jsm c;
        pt_jsm_copy(&c, m);
        allowed[id] = (uint8_t)pt_jsm_feed(&c, vi->text[id], vi->len[id]);
    }
}

static void test_schema_mask_generation(void) {
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},"
        "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
        "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2},{\"type\":"
        "\"boolean\"}]}",
        NULL,
    };
    pt_vocab_index vi;
    int eos_id;
    build_vocab(&vi, &eos_id);
    uint8_t *fast = malloc((size_t)vi.n_vocab), *slow = malloc((size_t)vi.n_vocab);
    uint64_t rng = 12345;
    int n_docs = 0;
    for (size_t si = 0; si < sizeof schemas / sizeof schemas[0]; si++) {
        pt_jschema *s = compile(schemas[si]);
        REQUIRE(s, "compile %zu", si);
        for (int trial = 0; trial < 40; trial++) {
            pt_jsm m;
            pt_jsm_init(&m, s);
            char doc[4096];
            size_t len = 0;
            int ended = 0;
            for (int stepi = 0; stepi < 400 && !ended; stepi++) {
                size_t na = pt_jsm_mask(&m, &vi, fast);
                slow_mask(&m, &vi, slow);
                if (memcmp(fast, slow, (size_t)vi.n_vocab) != 0) {
                    CHECK(0, "fast mask differs from per-token mask at '%.*s'", (int)len, doc);
                    break;
                }
                REQUIRE(na > 0, "no token allowed after '%.*s'", (int)len, doc);
                /* pick a random allowed token; prefer eos once allowed after 30 steps */
                int pick = -1;
                if (fast[eos_id] && stepi > 30) pick = eos_id;
                while (pick < 0) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    int id = (int)((rng >> 33) % (uint64_t)vi.n_vocab);
                    if (fast[id]) pick = id;
                }
                if (pick == eos_id) {
                    ended = 1;
                    break;
                }
                REQUIRE(len + vi.len[pick] < sizeof doc, "document too long");
                memcpy(doc + len, vi.text[pick], vi.len[pick]);
                len += vi.len[pick];
                REQUIRE(pt_jsm_feed(&m, vi.text[pick], vi.len[pick]), "allowed token rejected");
            }
            if (!ended) continue; /* a long document that did not end in the step budget */
            n_docs++;
            doc[len] = 0;
            cJSON *j = cJSON_Parse(doc);
            CHECK(j != NULL, "generated document does not parse: %s", doc);
            if (j && si == 0) {
                CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "name")), "name: %s", doc);
                const cJSON *age = cJSON_GetObjectItem(j, "age");
                CHECK(cJSON_IsNumber(age) && age->valuedouble == (double)(long long)age->valuedouble,
                      "age integer: %s", doc);
                for (const cJSON *c = j->child; c; c = c->next)
                    CHECK(!strcmp(c->string, "name") || !strcmp(c->string, "age") ||
                              !strcmp(c->string, "tags"),
                          "unexpected key %s", c->string);
            }
            if (j && si == 1)
                CHECK(cJSON_IsBool(j) || (cJSON_IsArray(j) && cJSON_GetArraySize(j) >= 2), "%s", doc);
            if (j && si == 2) CHECK(cJSON_IsObject(j), "%s", doc);
            cJSON_Delete(j);
        }
        pt_jschema_free(&s);
    }
    CHECK(n_docs >= 40, "only %d documents completed", n_docs);
    printf("INFO json_schema: %d random constrained documents generated and validated\n", n_docs);
    free(fast);
    free(slow);
    pt_vocab_index_free(&vi);
}

static void test_stop_holdback(void) {
    const char *stops[] = {"END", "\n\nUser:"};
    pt_stop s;
    REQUIRE(pt_stop_init(&s, stops, 2), "init");
    pt_sbuf out = {0};
    const char *pieces[] = {"Hello", " E", "N", "d\n", "\nUse", "r", ":", "ignored"};
    int stopped = 0, i = 0;
    for (; i < 8 && !stopped; i++) {
        size_t before = out.len;
        stopped = pt_stop_feed(&s, pieces[i], strlen(pieces[i]), &out);
        if (i == 1) CHECK(out.len == before + 0 || strcmp(out.data, "Hello ") == 0, "E held back");
    }
    CHECK(stopped && i == 7, "stopped at the ':' piece (i=%d)", i);
    CHECK(out.data && strcmp(out.data, "Hello ENd") == 0, "released text: '%s'", out.data);
    CHECK(s.matched == 1, "which stop");
    pt_sbuf_free(&out);
    pt_stop_free(&s);

    REQUIRE(pt_stop_init(&s, stops, 2), "init");
    pt_stop_feed(&s, "abc EN", 6, &out);
    CHECK(strcmp(out.data, "abc ") == 0, "prefix held: '%s'", out.data);
    pt_stop_flush(&s, &out);
    CHECK(strcmp(out.data, "abc EN") == 0, "flushed at the end: '%s'", out.data);
    pt_sbuf_free(&out);
    pt_stop_free(&s);
}

int main(void) {
    TEST_RUN(test_schema_matcher_types);
    TEST_RUN(test_schema_matcher_enum_anyof_ref);
    TEST_RUN(test_schema_compile_errors);
    TEST_RUN(test_schema_mask_generation);
    TEST_RUN(test_stop_holdback);
    return test_summary();
}
