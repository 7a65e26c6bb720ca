/* Tokenizer parity: every committed tokenizer under tests/fixtures/tokenizers
 * encodes the hostile corpus to exactly the reference library's ids (with and
 * without special tokens), decodes to exactly the reference text (with and
 * without skip_special), and the streaming detokenizer's output concatenates
 * to the full decode. Goldens come from tools/tokenizer/make_fixtures.js. */
#include "test.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <dirent.h>

#define FIX "tests/fixtures/tokenizers/"

static cJSON *g_corpus;

static char *unhex(const char *h, size_t *n) {
    size_t L = strlen(h) / 2;
    char *s = malloc(L + 1);
    for (size_t i = 0; i < L; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[L] = 0;
    *n = L;
    return s;
}

static int ids_equal(const int32_t *a, size_t na, const cJSON *b, char *why, size_t wn) {
    size_t nb = (size_t)cJSON_GetArraySize(b);
    size_t i = 0;
    const cJSON *x = b->child;
    for (; i < na && x; i++, x = x->next)
        if ((double)a[i] != x->valuedouble) {
            snprintf(why, wn, "first difference at %zu: got %d, want %.0f (lengths %zu / %zu)", i, a[i],
                     x->valuedouble, na, nb);
            return 0;
        }
    if (na != nb) {
        snprintf(why, wn, "lengths differ: got %zu ids, want %zu", na, nb);
        return 0;
    }
    return 1;
}

static void show_text(const char *s, size_t n) {
    printf("    text (%zu bytes): \"", n);
    for (size_t i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 32 || c == '"') printf("\\x%02x", c);
        else putchar(c);
    }
    printf("%s\"\n", n > 120 ? "..." : "");
}

static void run_golden(const char *name) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s.json", name);
    pt_tokenizer *t = NULL;
    pt_status st = pt_tokenizer_load(path, &t);
    REQUIRE(st == PT_OK, "load %s: %s", path, pt_last_error());
    snprintf(path, sizeof path, FIX "%s.golden.json", name);
    cJSON *g = NULL;
    st = pt_json_load_file(path, 0, &g);
    REQUIRE(st == PT_OK, "%s", pt_last_error());
    const cJSON *cases = cJSON_GetObjectItem(g, "cases");
    const cJSON *corpus = cJSON_GetObjectItem(g_corpus, "cases");
    int n_case = 0, n_bad = 0;
    for (const cJSON *c = cases->child; c; c = c->next, n_case++) {
        const cJSON *ci = cJSON_GetObjectItem(c, "c");
        const char *h = ci ? cJSON_GetArrayItem(corpus, (int)ci->valuedouble)->valuestring
                           : cJSON_GetObjectItem(c, "x")->valuestring;
        size_t n;
        char *text = unhex(h, &n);
        const cJSON *want = cJSON_GetObjectItem(c, "ids");
        const cJSON *want_sp = cJSON_GetObjectItem(c, "ids_special");
        if (!want_sp) want_sp = want;
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = NULL;
            size_t nid = 0;
            char why[200];
            st = pt_tokenizer_encode(t, text, n, sp, &ids, &nid);
            if (st != PT_OK) {
                if (n_bad++ < 5) {
                    CHECK(0, "case %d (special %d): encode failed: %s", n_case, sp, pt_last_error());
                    show_text(text, n);
                }
            } else if (!ids_equal(ids, nid, sp ? want_sp : want, why, sizeof why)) {
                if (n_bad++ < 5) {
                    CHECK(0, "case %d (special %d): %s", n_case, sp, why);
                    show_text(text, n);
                }
            } else {
                /* decode: reference text */
                const cJSON *d = cJSON_GetObjectItem(c, sp ? "decoded_skip" : "decoded");
                char *exp;
                size_t en;
                if (sp && cJSON_IsNull(d)) d = cJSON_GetObjectItem(c, "decoded");
                if (cJSON_IsString(d)) exp = unhex(d->valuestring, &en);
                else { exp = malloc(n + 1); memcpy(exp, text, n + 1); en = n; }
                char *got = NULL;
                size_t gn = 0;
                st = pt_tokenizer_decode(t, ids, nid, sp, &got, &gn);
                if (st != PT_OK || gn != en || memcmp(got, exp, en) != 0) {
                    if (n_bad++ < 5) {
                        CHECK(0, "case %d: decode (skip_special %d) differs: %s", n_case, sp,
                              st ? pt_last_error() : "");
                        show_text(exp, en);
                        if (got) show_text(got, gn);
                    }
                } else {
                    /* streaming: concatenation equals the full decode */
                    pt_tok_stream *s = NULL;
                    pt_tok_stream_create(t, sp, &s);
                    char *acc = malloc(en + 64);
                    size_t an = 0, cap = en + 64;
                    int ok = 1;
                    for (size_t k = 0; k <= nid && ok; k++) {
                        const char *piece;
                        size_t pl;
                        st = k < nid ? pt_tok_stream_push(s, ids[k], &piece, &pl) : pt_tok_stream_flush(s, &piece, &pl);
                        if (st) { ok = 0; break; }
                        if (k < nid && pl && pt_utf8_invalid_offset(piece, pl) >= 0) ok = 0;
                        if (an + pl > cap) { cap = (an + pl) * 2; acc = realloc(acc, cap); }
                        memcpy(acc + an, piece, pl);
                        an += pl;
                    }
                    if (!ok || an != en || memcmp(acc, exp, en) != 0) {
                        if (n_bad++ < 5) {
                            CHECK(0, "case %d: streaming decode (skip_special %d) differs", n_case, sp);
                            show_text(exp, en);
                            show_text(acc, an);
                        }
                    }
                    free(acc);
                    pt_tok_stream_free(&s);
                }
                free(got);
                free(exp);
            }
            free(ids);
        }
        free(text);
    }
    printf("INFO %s: %d cases, %d mismatches\n", name, n_case, n_bad);
    CHECK(n_bad == 0, "%s: %d mismatches", name, n_bad);
    cJSON_Delete(g);
    pt_tokenizer_free(&t);
}

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    if (pt_json_load_file(FIX "corpus.json", 0, &g_corpus) != PT_OK) {
        printf("FAIL corpus: %s\n", pt_last_error());
        return 1;
    }
    /* every NAME.golden.json beside its NAME.json is one test */
    DIR *d = opendir(FIX);
    char *names[64];
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 64) {
        size_t l = strlen(e->d_name);
        if (l > 12 && !strcmp(e->d_name + l - 12, ".golden.json")) names[n++] = strndup(e->d_name, l - 12);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmpstr);
    for (int i = 0; i < n; i++) {
        char tname[96];
        snprintf(tname, sizeof tname, "test_golden_%s", names[i]);
        test_current = tname;
        test_failed_current = 0;
        run_golden(names[i]);
        if (test_failed_current) test_n_fail++;
        else {
            test_n_pass++;
            printf("PASS %s\n", tname);
        }
        fflush(stdout);
        free(names[i]);
    }
    if (n < 13) {
        printf("FAIL test_golden_count: found %d golden files in " FIX ", expected at least 13\n", n);
        test_n_fail++;
    }
    cJSON_Delete(g_corpus);
    return test_summary();
}
