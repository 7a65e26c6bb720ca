/* Tests for src/format/safetensors: round trips through the writer, every
 * dtype, sharded directories, and every malformed-header case (each must fail
 * with a message naming the file/tensor and what was expected). */
#include "test.h"

#include "base/error.h"
#include "base/mmap.h"
#include "format/safetensors.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[512];

/* Writes a raw safetensors image: 8-byte length (or `lie` if nonzero), header, data. */
static void write_raw(const char *path, const char *header, uint64_t lie, const void *data, size_t n) {
    size_t hl = strlen(header);
    uint64_t len = lie ? lie : hl;
    FILE *f = fopen(path, "wb");
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(header, 1, hl, f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* Opens a raw image and expects failure with every `needle` in the message. */
static int expect_bad(const char *header, uint64_t lie, size_t data_n, const char *n1, const char *n2) {
    char path[600];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmp);
    unsigned char data[256] = {0};
    write_raw(path, header, lie, data, data_n);
    pt_tensor_set set;
    pt_status s = pt_st_open_file(path, &set);
    if (s == PT_OK) {
        pt_st_close(&set);
        printf("    header accepted: %s\n", header);
        return 0;
    }
    const char *m = pt_last_error();
    int ok = strstr(m, "bad.safetensors") && (!n1 || strstr(m, n1)) && (!n2 || strstr(m, n2));
    if (!ok) printf("    message lacks '%s'/'%s': %s\n", n1 ? n1 : "", n2 ? n2 : "", m);
    return ok;
}

static void test_roundtrip_all_dtypes(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmp);
    pt_st_entry e[PT_DTYPE_COUNT + 1];
    unsigned char bufs[PT_DTYPE_COUNT][48];
    char names[PT_DTYPE_COUNT][32];
    for (int d = 0; d < PT_DTYPE_COUNT; d++) {
        size_t es = pt_dtype_size((pt_dtype)d);
        for (size_t i = 0; i < 6 * es; i++) bufs[d][i] = (unsigned char)(d * 31 + i);
        snprintf(names[d], sizeof names[d], "t.%s \"q\"", pt_dtype_name((pt_dtype)d));
        e[d] = (pt_st_entry){.name = names[d], .dtype = (pt_dtype)d, .ndim = 2, .shape = {2, 3}, .data = bufs[d]};
    }
    e[PT_DTYPE_COUNT] = (pt_st_entry){.name = "scalar", .dtype = PT_DTYPE_F32, .ndim = 0, .data = bufs[0]};
    pt_st_meta meta[] = {{"format", "pt"}, {"note", "a \"quoted\" value"}};
    REQUIRE(pt_st_write_file(path, e, PT_DTYPE_COUNT + 1, meta, 2) == PT_OK, "%s", pt_last_error());
    pt_tensor_set set;
    REQUIRE(pt_st_open_file(path, &set) == PT_OK, "%s", pt_last_error());
    CHECK(set.n_tensors == PT_DTYPE_COUNT + 1, "n=%d", set.n_tensors);
    for (int d = 0; d < PT_DTYPE_COUNT; d++) {
        const pt_tensor *t = pt_st_find(&set, names[d]);
        REQUIRE(t, "missing %s", names[d]);
        CHECK(t->dtype == (pt_dtype)d && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3, "%s", names[d]);
        CHECK(t->nbytes == 6 * pt_dtype_size((pt_dtype)d), "%s bytes", names[d]);
        CHECK(!memcmp(t->data, bufs[d], t->nbytes), "%s data", names[d]);
        CHECK(((uintptr_t)t->data) % 2 == 0 || pt_dtype_size((pt_dtype)d) == 1, "alignment");
    }
    const pt_tensor *sc = pt_st_find(&set, "scalar");
    REQUIRE(sc, "scalar");
    CHECK(sc->ndim == 0 && sc->n_elements == 1 && sc->nbytes == 4, "scalar shape");
    CHECK(((uintptr_t)set.tensors[0].data) % 8 == 0, "data section 8-byte aligned");
    CHECK(pt_st_find(&set, "nope") == NULL, "absent lookup");
    CHECK(pt_st_meta_get(&set, "format") && !strcmp(pt_st_meta_get(&set, "format"), "pt"), "meta");
    CHECK(pt_st_meta_get(&set, "note") && !strcmp(pt_st_meta_get(&set, "note"), "a \"quoted\" value"), "meta esc");
    pt_st_close(&set);
}

static void test_header_escapes_and_padding(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/esc.safetensors", tmp);
    float d[2] = {1, 2};
    write_raw(path, "{\"a\\u00e9\\ud83d\\ude00\":{\"shape\":[2],\"extra\":[1,{\"x\":null}],\"dtype\":\"F32\","
                    "\"data_offsets\":[0,8]}}   ",
              0, d, 8);
    pt_tensor_set set;
    REQUIRE(pt_st_open_file(path, &set) == PT_OK, "%s", pt_last_error());
    const pt_tensor *t = pt_st_find(&set, "a\xc3\xa9\xf0\x9f\x98\x80");
    CHECK(t && t->n_elements == 2, "escaped name decoded");
    pt_st_close(&set);
}

static void test_empty_and_truncated(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/empty.safetensors", tmp);
    FILE *f = fopen(path, "wb");
    fclose(f);
    pt_tensor_set set;
    CHECK(pt_st_open_file(path, &set) != PT_OK, "empty accepted");
    CHECK(strstr(pt_last_error(), "empty.safetensors") && strstr(pt_last_error(), "too short"), "%s",
          pt_last_error());
    f = fopen(path, "wb");
    fwrite("\x10\0\0", 1, 3, f);
    fclose(f);
    CHECK(pt_st_open_file(path, &set) != PT_OK, "3-byte file accepted");
    /* a valid file cut short inside the data */
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 10, "'w'",
                     "outside the data section"), "truncated data");
}

static void test_lying_header_length(void) {
    CHECK(expect_bad("{}", 1000, 0, "header length 1000", "exceeds the file"), "too long");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 18, 4, "unterminated",
                     NULL), "too short (cut JSON)");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xxxx", 0, 4,
                     "unexpected bytes after", NULL), "garbage after JSON");
    CHECK(expect_bad("[]", 0, 0, "does not start with '{'", NULL), "not an object");
    CHECK(expect_bad("{\"a\":1", 0, 0, "expected", NULL), "unclosed object");
}

static void test_lying_offsets(void) {
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 8, "'w'",
                     "outside the data section"), "end past data");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 0, 16, "span 12 bytes",
                     "expected 8"), "size mismatch");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 16, "begin > end",
                     NULL), "begin > end");
    /* 2^64 - 8 + 8 would wrap; exact 64-bit parsing reports the numbers */
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[18446744073709551608,"
                     "18446744073709551615]}}", 0, 16, "'w'", NULL), "huge offsets");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551616]}}", 0, 16,
                     "does not fit in 64 bits", NULL), "offset > 2^64");
    /* 2^53 + 1: a double would round it to 2^53; exact parsing keeps the odd value */
    CHECK(expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[9007199254740993],\"data_offsets\":[0,9007199254740992]}}",
                     0, 16, "span 9007199254740992", "expected 9007199254740993"), "exact > 2^53");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8]}}", 0, 16, "fraction",
                     NULL), "fractional offset");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", 0, 16, "more than 2",
                     NULL), "three offsets");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 16, "missing field 'data_offsets'", NULL),
          "missing offsets");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
                     0, 16, "overflows", NULL), "shape overflow");
}

static void test_overlap_and_duplicates(void) {
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     0, 16, "overlap", "'a'"), "overlap");
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                     0, 16, "duplicate tensor name 'a'", NULL), "duplicate");
    /* zero-size tensors may share an offset */
    char path[600];
    snprintf(path, sizeof path, "%s/zero.safetensors", tmp);
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1,0],\"data_offsets\":[0,0]}}", 0, NULL, 0);
    pt_tensor_set set;
    CHECK(pt_st_open_file(path, &set) == PT_OK, "%s", pt_last_error());
    if (!test_failed_current) pt_st_close(&set);
}

static void test_bad_dtype_and_dims(void) {
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "unknown dtype 'F12'",
                     "'w'"), "unknown dtype");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8, "negative dimension",
                     "'w'"), "negative dim");
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 0, 8,
                     "more than 8 dimensions", NULL), "too many dims");
    CHECK(expect_bad("{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "expected a string", NULL),
          "dtype not a string");
    CHECK(expect_bad("{\"__metadata__\":{\"k\":1}}", 0, 0, "__metadata__ 'k'", NULL), "non-string metadata");
    CHECK(expect_bad("{\"w\\u0000\":{}}", 0, 0, "NUL", NULL), "NUL in name");
    CHECK(expect_bad("{\"\xff\":{}}", 0, 0, "UTF-8", NULL), "bad UTF-8");
}

static void write_tensor_file(const char *path, const char *n1, const char *n2) {
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    pt_st_entry e[2] = {{.name = n1, .dtype = PT_DTYPE_F32, .ndim = 1, .shape = {2}, .data = a},
                        {.name = n2, .dtype = PT_DTYPE_F32, .ndim = 1, .shape = {3}, .data = b}};
    pt_status s = pt_st_write_file(path, e, n2 ? 2 : 1, NULL, 0);
    if (s) printf("    write failed: %s\n", pt_last_error());
}

static void test_sharded(void) {
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/sharded", tmp);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_tensor_file(p, "x.a", "x.b");
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_tensor_file(p, "y.a", NULL);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\":{\"total_size\":28},\"weight_map\":{\"x.a\":\"model-00001-of-00002.safetensors\","
                      "\"x.b\":\"model-00001-of-00002.safetensors\",\"y.a\":\"model-00002-of-00002.safetensors\"}}";
    pt_write_file(p, idx, strlen(idx));
    pt_tensor_set set;
    REQUIRE(pt_st_open_dir(dir, &set) == PT_OK, "%s", pt_last_error());
    CHECK(set.n_files == 2 && set.n_tensors == 3, "files %d tensors %d", set.n_files, set.n_tensors);
    const pt_tensor *t = pt_st_find(&set, "y.a");
    CHECK(t && t->file_index == 1 && ((const float *)t->data)[1] == 2.0f, "y.a");
    t = pt_st_find(&set, "x.b");
    CHECK(t && ((const float *)t->data)[2] == 5.0f, "x.b");
    pt_st_close(&set);

    /* a tensor mapped to the wrong shard */
    idx = "{\"weight_map\":{\"x.a\":\"model-00002-of-00002.safetensors\",\"y.a\":\"model-00002-of-00002.safetensors\"}}";
    pt_write_file(p, idx, strlen(idx));
    CHECK(pt_st_open_dir(dir, &set) != PT_OK, "wrong shard accepted");
    CHECK(strstr(pt_last_error(), "'x.a'"), "%s", pt_last_error());
    /* a missing shard */
    idx = "{\"weight_map\":{\"x.a\":\"model-00003-of-00002.safetensors\"}}";
    pt_write_file(p, idx, strlen(idx));
    CHECK(pt_st_open_dir(dir, &set) != PT_OK, "missing shard accepted");
    CHECK(strstr(pt_last_error(), "model-00003-of-00002.safetensors") && strstr(pt_last_error(), "does not exist"),
          "%s", pt_last_error());
    /* path traversal */
    idx = "{\"weight_map\":{\"x.a\":\"../x.safetensors\"}}";
    pt_write_file(p, idx, strlen(idx));
    CHECK(pt_st_open_dir(dir, &set) != PT_OK, "traversal accepted");
    /* the same tensor in two shards */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_tensor_file(p, "x.a", NULL);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    idx = "{\"weight_map\":{\"x.a\":\"model-00001-of-00002.safetensors\",\"x.b\":\"model-00002-of-00002.safetensors\"}}";
    pt_write_file(p, idx, strlen(idx));
    CHECK(pt_st_open_dir(dir, &set) != PT_OK, "duplicate across shards accepted");
    CHECK(strstr(pt_last_error(), "two files"), "%s", pt_last_error());
    /* no index: every *.safetensors file, still unique */
    unlink(p);
    CHECK(pt_st_open_dir(dir, &set) != PT_OK, "duplicate across files accepted");
}

static void test_no_weights(void) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/noweights", tmp);
    mkdir(dir, 0755);
    pt_tensor_set set;
    CHECK(pt_st_open_dir(dir, &set) == PT_ERR_NOT_FOUND, "status");
    CHECK(strstr(pt_last_error(), "noweights") && strstr(pt_last_error(), "no weights"), "%s", pt_last_error());
}

static void test_writer_errors(void) {
    pt_st_writer *w;
    REQUIRE(pt_st_writer_create(&w) == PT_OK, "create");
    int64_t sh[2] = {2, 2};
    CHECK(pt_st_writer_add(w, "a", PT_DTYPE_F32, 2, sh) == PT_OK, "add");
    CHECK(pt_st_writer_add(w, "a", PT_DTYPE_F32, 2, sh) != PT_OK, "duplicate add accepted");
    CHECK(pt_st_writer_data_bytes(w) == 16, "bytes");
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", tmp);
    CHECK(pt_st_writer_begin(w, path) == PT_OK, "%s", pt_last_error());
    float d[5] = {0};
    CHECK(pt_st_writer_write(w, d, 20) != PT_OK, "overlong write accepted");
    CHECK(pt_st_writer_write(w, d, 8) == PT_OK, "write");
    CHECK(pt_st_writer_finish(w) != PT_OK, "short data accepted");
    pt_st_writer_free(&w);
    CHECK(w == NULL, "free sets NULL");
}

int main(void) {
    test_tmpdir(tmp, sizeof tmp);
    TEST_RUN(test_roundtrip_all_dtypes);
    TEST_RUN(test_header_escapes_and_padding);
    TEST_RUN(test_empty_and_truncated);
    TEST_RUN(test_lying_header_length);
    TEST_RUN(test_lying_offsets);
    TEST_RUN(test_overlap_and_duplicates);
    TEST_RUN(test_bad_dtype_and_dims);
    TEST_RUN(test_sharded);
    TEST_RUN(test_no_weights);
    TEST_RUN(test_writer_errors);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) { /* best effort */
    }
    return test_summary();
}
