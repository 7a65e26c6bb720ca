/* The tokenizers shipped with the model fixtures and the demo model: each
 * loads from its model directory (with tokenizer_config.json and
 * generation_config.json), reproduces the prompt-0 ids that the oracle
 * recorded with transformers' tokenizer ("In the beginning God created the
 * heaven and the earth.", no special tokens), and round-trips texts through
 * encode, decode and the streaming detokenizer. */
#include "test.h"

#include "base/error.h"
#include "base/mmap.h"
#include "golden.h"
#include "tokenizer/tokenizer.h"

#include <dirent.h>

static const char PROMPT0[] = "In the beginning God created the heaven and the earth.";
static const char *TEXTS[] = {
    "In the beginning God created the heaven and the earth.",
    "Hello, world! 123 4567",
    "na\xc3\xafve caf\xc3\xa9 \xf0\x9f\x98\x80 \xe0\xa7\xa7\xe0\xa7\xa8\n\tend  ",
    "\xe4\xb8\xad\xe6\x96\x87 \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7",
    "",
};

static int g_n_prompt0;

static int check_dir(const char *dir, const char *fixture) {
    pt_tokenizer *t = NULL;
    pt_status st = pt_tokenizer_load_dir(dir, &t);
    CHECK(st == PT_OK, "%s: %s", dir, pt_last_error());
    if (st) return 0;
    for (size_t k = 0; k < sizeof TEXTS / sizeof *TEXTS; k++) {
        const char *s = TEXTS[k];
        size_t n = strlen(s), ni = 0, bl = 0;
        int32_t *ids = NULL;
        char *back = NULL;
        st = pt_tokenizer_encode(t, s, n, 0, &ids, &ni);
        CHECK(st == PT_OK, "%s: encode: %s", dir, pt_last_error());
        if (st) continue;
        st = pt_tokenizer_decode(t, ids, ni, 0, &back, &bl);
        CHECK(st == PT_OK && bl == n && memcmp(back, s, n) == 0, "%s: text %zu does not round-trip", dir, k);
        pt_tok_stream *ts = NULL;
        pt_tok_stream_create(t, 0, &ts);
        char acc[512];
        size_t an = 0;
        for (size_t i = 0; i <= ni; i++) {
            const char *p;
            size_t pl;
            if (i < ni) pt_tok_stream_push(ts, ids[i], &p, &pl);
            else pt_tok_stream_flush(ts, &p, &pl);
            if (an + pl <= sizeof acc) memcpy(acc + an, p, pl);
            an += pl;
        }
        CHECK(an == bl && back && memcmp(acc, back, bl) == 0, "%s: streamed text %zu differs", dir, k);
        pt_tok_stream_free(&ts);
        free(back);
        free(ids);
    }
    if (fixture) {
        char err[256];
        golden *g = golden_open_fixture(fixture, err, sizeof err);
        if (g) {
            int n = 0;
            const int32_t *want = golden_prompt_ids(g, 0, &n);
            int32_t *ids = NULL;
            size_t ni = 0;
            st = pt_tokenizer_encode(t, PROMPT0, strlen(PROMPT0), 0, &ids, &ni);
            CHECK(want && st == PT_OK && (int)ni == n && memcmp(ids, want, ni * sizeof *ids) == 0,
                  "%s: prompt 0 ids differ from the oracle's (%zu vs %d ids)", fixture, ni, n);
            g_n_prompt0++;
            free(ids);
            golden_close(g);
        }
    }
    pt_tokenizer_free(&t);
    return 1;
}

static void test_fixture_tokenizers(void) {
    const char *root = "tests/fixtures";
    DIR *d = opendir(root);
    REQUIRE(d, "no %s", root);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[512], tj[600];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
        if (!pt_is_file(tj)) continue;
        n += check_dir(dir, e->d_name);
    }
    closedir(d);
    d = opendir("models");
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[512], tj[600];
        snprintf(dir, sizeof dir, "models/%s", e->d_name);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
        if (pt_is_file(tj)) n += check_dir(dir, NULL);
    }
    if (d) closedir(d);
    printf("INFO %d model tokenizers checked, %d against the oracle's prompt-0 ids\n", n, g_n_prompt0);
    if (n == 0) TEST_SKIP("no model fixture has a tokenizer.json");
}

int main(void) {
    TEST_RUN(test_fixture_tokenizers);
    return test_summary();
}
