/* Renders every real chat template in ../shared/data/chat-templates/ over the
 * reference's five conversations (../shared/data/chat-template-goldens.json,
 * made by Python's jinja2 in apply_chat_template's environment) and compares
 * byte for byte; records the reference refused must be refused too. Skips
 * with a notice when ../shared is absent. */
#include "test.h"

#include "base/json.h"
#include "petrel.h"
#include "tokenizer/chat_template.h"

#include <cjson/cJSON.h>

static void first_diff(const char *got, size_t got_len, const char *exp, size_t exp_len) {
    size_t i = 0;
    while (i < got_len && i < exp_len && got[i] == exp[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("    first difference at byte %zu\n    got: %.*s\n    exp: %.*s\n", i,
           (int)((got_len - from) > 80 ? 80 : got_len - from), got + from,
           (int)((exp_len - from) > 80 ? 80 : exp_len - from), exp + from);
}

static void test_reference_goldens(void) {
    const char *shared = test_shared_dir();
    if (!shared) TEST_SKIP("../shared is absent: the reference goldens are not available here");
    char path[4096], tdir[4096];
    snprintf(path, sizeof path, "%s/data/chat-template-goldens.json", shared);
    snprintf(tdir, sizeof tdir, "%s/data/chat-templates", shared);
    cJSON *goldens = NULL;
    REQUIRE(pt_json_load_file(path, 0, &goldens) == PT_OK, "%s", pt_last_error());
    struct tm now;
    REQUIRE(pt_chat_template_parse_time("2026-03-14T15:09:26", &now) == PT_OK, "%s", pt_last_error());
    int total = 0, ok = 0, outputs = 0, refusals = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, goldens) {
        const char *name = pt_json_get_str(r, "template");
        const cJSON *cs = cJSON_GetObjectItemCaseSensitive(r, "case");
        const char *cname = cJSON_IsString(cs) ? cs->valuestring : "(compile)";
        total++;
        char tpath[8192];
        snprintf(tpath, sizeof tpath, "%s/%s", tdir, name ? name : "?");
        pt_chat_template *t = NULL;
        pt_status st = pt_chat_template_from_file(tpath, &t);
        if (cJSON_GetObjectItemCaseSensitive(r, "compile_error")) {
            CHECK(st != PT_OK, "%s: the reference refuses to compile it, petrel parsed it", name);
            if (st != PT_OK) ok++, refusals++;
            pt_chat_template_free(&t);
            continue;
        }
        CHECK(st == PT_OK, "%s: %s", name, pt_last_error());
        if (st != PT_OK) continue;
        char *out = NULL;
        size_t out_len = 0;
        st = pt_chat_template_render(t, cJSON_GetObjectItemCaseSensitive(r, "input"), &now, &out, &out_len);
        const cJSON *exp = cJSON_GetObjectItemCaseSensitive(r, "output");
        if (cJSON_IsString(exp)) {
            size_t exp_len = strlen(exp->valuestring);
            int same = st == PT_OK && out_len == exp_len && !memcmp(out, exp->valuestring, exp_len);
            CHECK(same, "%s / %s: %s", name, cname, st == PT_OK ? "output differs" : pt_last_error());
            if (!same && st == PT_OK) first_diff(out, out_len, exp->valuestring, exp_len);
            if (same) ok++, outputs++;
        } else {
            const char *err = pt_json_get_str(r, "error");
            CHECK(st == PT_ERR_FORMAT, "%s / %s: the reference raised (%s), petrel rendered",
                  name, cname, err ? err : "?");
            if (st != PT_OK) {
                /* the same exception type and message as jinja2 ("TypeError: ...") */
                const char *msg = pt_last_error();
                size_t ml = strlen(msg), el = err ? strlen(err) : 0;
                int same = err && ml >= el && !strcmp(msg + ml - el, err);
                CHECK(same, "%s / %s: petrel raised '%s', the reference '%s'", name, cname, msg, err ? err : "?");
                if (same) ok++, refusals++;
            }
        }
        free(out);
        pt_chat_template_free(&t);
    }
    printf("INFO chat-template goldens: %d of %d match (%d outputs byte-identical, %d refusals)\n", ok, total,
           outputs, refusals);
    CHECK(total > 300, "expected the full golden set, found %d records", total);
    cJSON_Delete(goldens);
}

/* The same templates over more conversations (several tool calls, reasoning,
 * multimodal content, roles out of order...), rendered by jinja2 into
 * tests/fixtures/templates/shared-extra-goldens.json. Inputs are JSON text
 * rendered through the exact path (1.0 stays a float). */
static void test_extra_conversations(void) {
    const char *shared = test_shared_dir();
    if (!shared) TEST_SKIP("../shared is absent: the templates are not available here");
    cJSON *g = NULL;
    REQUIRE(pt_json_load_file("tests/fixtures/templates/shared-extra-goldens.json", 0, &g) == PT_OK, "%s",
            pt_last_error());
    struct tm now;
    pt_chat_template_parse_time("2026-03-14T15:09:26", &now);
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(g, "inputs");
    int total = 0, ok = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(g, "records")) {
        const char *name = pt_json_get_str(r, "template"), *cname = pt_json_get_str(r, "case");
        const char *input = cname ? pt_json_get_str(inputs, cname) : NULL;
        total++;
        char tpath[8192];
        snprintf(tpath, sizeof tpath, "%s/data/chat-templates/%s", shared, name ? name : "?");
        pt_chat_template *t = NULL;
        pt_status st = pt_chat_template_from_file(tpath, &t);
        if (cJSON_GetObjectItemCaseSensitive(r, "compile_error")) {
            CHECK(st != PT_OK, "%s: jinja2 refuses to compile it, petrel parsed it", name);
            ok += st != PT_OK;
            pt_chat_template_free(&t);
            continue;
        }
        CHECK(st == PT_OK && input, "%s / %s: %s", name, cname, st == PT_OK ? "no input" : pt_last_error());
        if (st != PT_OK || !input) {
            pt_chat_template_free(&t);
            continue;
        }
        char *out = NULL;
        size_t out_len = 0;
        st = pt_chat_template_render_json(t, input, strlen(input), &now, &out, &out_len);
        const char *exp = pt_json_get_str(r, "output"), *err = pt_json_get_str(r, "error");
        if (exp) {
            size_t exp_len = strlen(exp);
            int same = st == PT_OK && out_len == exp_len && !memcmp(out, exp, exp_len);
            CHECK(same, "%s / %s: %s", name, cname, st == PT_OK ? "output differs" : pt_last_error());
            if (!same && st == PT_OK) first_diff(out, out_len, exp, exp_len);
            ok += same;
        } else {
            const char *msg = st == PT_OK ? "" : pt_last_error();
            size_t ml = strlen(msg), el = err ? strlen(err) : 0;
            int same = st == PT_ERR_FORMAT && err && ml >= el && !strcmp(msg + ml - el, err);
            CHECK(same, "%s / %s: jinja2 raised '%s', petrel: '%s'", name, cname, err ? err : "?", msg);
            ok += same;
        }
        free(out);
        pt_chat_template_free(&t);
    }
    printf("INFO chat-template extra conversations: %d of %d match\n", ok, total);
    CHECK(total >= 500, "expected the full extra set, found %d records", total);
    cJSON_Delete(g);
}

int main(void) {
    TEST_RUN(test_reference_goldens);
    TEST_RUN(test_extra_conversations);
    return test_summary();
}
