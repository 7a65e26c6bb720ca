/* The Jinja engine's language features one by one: each case of
 * tests/fixtures/templates/features.json (written by
 * tools/templates/feature_cases.py, rendered by Python's jinja2 in
 * apply_chat_template's environment with tools/templates/render.py) must
 * render byte for byte, raise the same exception with the same message, or
 * fail to parse, as jinja2 did. Plus API-level checks (named templates,
 * loading from a model directory, variables from cJSON). */
#include "test.h"

#include "base/json.h"
#include "base/mmap.h"
#include "petrel.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>

#define FEATURES "tests/fixtures/templates/features.json"

/* One PASS/FAIL line per case, as TEST_RUN prints them. */
static void run_case(const cJSON *c, const struct tm *now) {
    const char *name = pt_json_get_str(c, "name");
    const char *src = pt_json_get_str(c, "template");
    static char label[256];
    snprintf(label, sizeof label, "feature_%s", name ? name : "?");
    test_current = label;
    test_failed_current = 0;
    test_skipped_current = 0;
    pt_jinja_template *t = NULL;
    pt_status st = pt_jinja_parse(src, strlen(src), name, &t);
    const char *exp_out = pt_json_get_str(c, "output");
    const char *exp_err = pt_json_get_str(c, "error");
    const char *exp_compile = pt_json_get_str(c, "compile_error");
    if (exp_compile) {
        CHECK(st != PT_OK, "jinja2 refuses to compile it (%s), petrel parsed it", exp_compile);
    } else if (st != PT_OK) {
        CHECK(0, "parse failed: %s", pt_last_error());
    } else {
        char *vars = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "vars"));
        pt_jinja_vars v = {.vars_json = vars, .vars_json_len = vars ? strlen(vars) : 0, .now = now};
        char *out = NULL;
        size_t out_len = 0;
        st = pt_jinja_render(t, &v, &out, &out_len);
        if (exp_out) {
            CHECK(st == PT_OK, "render failed: %s", pt_last_error());
            if (st == PT_OK) {
                int same = out_len == strlen(exp_out) && !memcmp(out, exp_out, out_len);
                CHECK(same, "output differs\n    got: [%.*s]\n    exp: [%s]", (int)out_len, out, exp_out);
            }
        } else if (exp_err) {
            CHECK(st == PT_ERR_FORMAT, "jinja2 raised %s; petrel rendered [%s]", exp_err, out ? out : "");
            if (st != PT_OK) {
                const char *msg = pt_last_error();
                size_t ml = strlen(msg), el = strlen(exp_err);
                CHECK(ml >= el && !strcmp(msg + ml - el, exp_err), "petrel raised '%s', jinja2 '%s'", msg, exp_err);
            }
        }
        free(out);
        cJSON_free(vars);
    }
    pt_jinja_free(&t);
    if (test_failed_current) test_n_fail++;
    else {
        test_n_pass++;
        printf("PASS %s\n", label);
    }
}

static void run_features(void) {
    cJSON *cases = NULL;
    test_current = "features_load";
    test_failed_current = 0;
    if (pt_json_load_file(FEATURES, 0, &cases) != PT_OK) {
        printf("FAIL features_load: %s\n", pt_last_error());
        test_n_fail++;
        return;
    }
    struct tm now;
    pt_chat_template_parse_time("2026-03-14T15:09:26", &now);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) run_case(c, &now);
    cJSON_Delete(cases);
}

static char *render(const pt_chat_template *t, const char *json) {
    cJSON *vars = cJSON_Parse(json);
    char *out = NULL;
    pt_status st = pt_chat_template_render(t, vars, NULL, &out, NULL);
    cJSON_Delete(vars);
    if (st != PT_OK) printf("    render: %s\n", pt_last_error());
    return out;
}

static void write_file(const char *dir, const char *name, const char *text) {
    char *p = pt_path_join(dir, name);
    pt_write_file(p, text, strlen(text));
    free(p);
}

static void test_model_dir_loading(void) {
    char dir[512];
    test_tmpdir(dir, sizeof dir);
    pt_chat_template *t = NULL;
    CHECK(pt_chat_template_load(dir, NULL, &t) == PT_ERR_NOT_FOUND, "an empty dir has no template");
    /* chat_template.jinja */
    write_file(dir, "chat_template.jinja", "J{{ messages[0].content }}");
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    char *out = render(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    CHECK(out && !strcmp(out, "Jx"), "got %s", out ? out : "(null)");
    free(out);
    pt_chat_template_free(&t);
    CHECK(t == NULL, "free sets NULL");
    /* chat_template.json is the last resort */
    write_file(dir, "chat_template.json", "{\"chat_template\": \"P\"}");
    /* chat_template.jinja wins over tokenizer_config.json, which brings its special tokens */
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": \"C{{ bos_token }}\", \"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\"}");
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    out = render(t, "{\"messages\": [{\"content\": \"y\"}]}");
    CHECK(out && !strcmp(out, "Jy"), "chat_template.jinja first: got %s", out ? out : "(null)");
    free(out);
    pt_chat_template_free(&t);
    /* additional_chat_templates/NAME.jinja: named templates beside the default */
    char *extra = pt_path_join(dir, "additional_chat_templates");
    mkdir(extra, 0755);
    write_file(extra, "tool_use.jinja", "X{{ tools|length }}");
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    out = render(t, "{\"tools\": [1]}");
    CHECK(out && !strcmp(out, "X1"), "additional tool_use template: got %s", out ? out : "(null)");
    free(out);
    out = render(t, "{\"messages\": [{\"content\": \"z\"}]}");
    CHECK(out && !strcmp(out, "Jz"), "chat_template.jinja is the default: got %s", out ? out : "(null)");
    free(out);
    pt_chat_template_free(&t);
    char *extra_file = pt_path_join(extra, "tool_use.jinja");
    unlink(extra_file);
    rmdir(extra);
    free(extra_file);
    free(extra);
    char *jp = pt_path_join(dir, "chat_template.jinja");
    unlink(jp);
    free(jp);
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    CHECK(pt_chat_template_bos(t) && !strcmp(pt_chat_template_bos(t), "<s>"), "bos from {content}");
    CHECK(pt_chat_template_eos(t) && !strcmp(pt_chat_template_eos(t), "</s>"), "eos string");
    out = render(t, "{\"bos_token\": \"B\"}");
    CHECK(out && !strcmp(out, "CB"), "got %s", out ? out : "(null)");
    free(out);
    pt_chat_template_free(&t);
    /* named templates: tool_use with tools, default otherwise */
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    out = render(t, "{\"messages\": []}");
    CHECK(out && !strcmp(out, "D"), "default: got %s", out ? out : "(null)");
    free(out);
    out = render(t, "{\"tools\": [1, 2]}");
    CHECK(out && !strcmp(out, "T2"), "tool_use: got %s", out ? out : "(null)");
    free(out);
    char *o2 = NULL;
    CHECK(pt_chat_template_render_json(t, "{\"tools\": [1]}", 14, NULL, &o2, NULL) == PT_OK && o2 && !strcmp(o2, "T1"),
          "render_json picks tool_use");
    free(o2);
    pt_chat_template_free(&t);
    /* an explicit file overrides */
    write_file(dir, "override.jinja", "O");
    char *op = pt_path_join(dir, "override.jinja");
    REQUIRE(pt_chat_template_load(dir, op, &t) == PT_OK, "%s", pt_last_error());
    out = render(t, "{}");
    CHECK(out && !strcmp(out, "O"), "override: got %s", out ? out : "(null)");
    free(out);
    free(op);
    pt_chat_template_free(&t);
    /* malformed field and syntax errors name the file */
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": 5}");
    CHECK(pt_chat_template_load(dir, NULL, &t) == PT_ERR_FORMAT && strstr(pt_last_error(), "chat_template"),
          "bad type: %s", pt_last_error());
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"{% if %}\"}");
    CHECK(pt_chat_template_load(dir, NULL, &t) == PT_ERR_FORMAT && strstr(pt_last_error(), "tokenizer_config.json"),
          "syntax error names the file: %s", pt_last_error());
    write_file(dir, "tokenizer_config.json", "{}");
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    out = render(t, "{}");
    CHECK(out && !strcmp(out, "P"), "chat_template.json last: got %s", out ? out : "(null)");
    free(out);
    pt_chat_template_free(&t);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"other\", \"template\": \"x\"}]}");
    REQUIRE(pt_chat_template_load(dir, NULL, &t) == PT_OK, "%s", pt_last_error());
    out = NULL;
    CHECK(pt_chat_template_render(t, cJSON_GetObjectItem(NULL, "x"), NULL, &out, NULL) == PT_ERR_INVALID_ARG,
          "non-object variables refused");
    cJSON *empty = cJSON_CreateObject();
    CHECK(pt_chat_template_render(t, empty, NULL, &out, NULL) == PT_ERR_FORMAT, "no default template is an error");
    cJSON_Delete(empty);
    pt_chat_template_free(&t);
}

static void test_numbers_from_json(void) {
    pt_chat_template *t = NULL;
    const char *src = "{{ a }} {{ b }} {{ c }} {{ [a, b, c]|tojson }} {{ a is integer }} {{ b is float }}";
    REQUIRE(pt_chat_template_from_string(src, strlen(src), "nums", &t) == PT_OK, "%s", pt_last_error());
    const char *json = "{\"a\": 1, \"b\": 1.0, \"c\": -2.5e-3}";
    char *out = NULL;
    REQUIRE(pt_chat_template_render_json(t, json, strlen(json), NULL, &out, NULL) == PT_OK, "%s", pt_last_error());
    CHECK(!strcmp(out, "1 1.0 -0.0025 [1, 1.0, -0.0025] True True"), "exact JSON path: got %s", out);
    free(out);
    /* cJSON keeps no int/float distinction: integral values become ints */
    out = render(t, json);
    CHECK(out && !strcmp(out, "1 1 -0.0025 [1, 1, -0.0025] True False"), "cJSON path: got %s", out ? out : "(null)");
    free(out);
    CHECK(pt_chat_template_render_json(t, "{\"a\": ", 6, NULL, &out, NULL) == PT_ERR_INVALID_ARG, "truncated JSON");
    CHECK(pt_chat_template_render_json(t, "[1]", 3, NULL, &out, NULL) == PT_ERR_INVALID_ARG, "not an object");
    pt_chat_template_free(&t);
}

static void test_render_chat(void) {
    const char *src = "{{ bos_token }}|{{ eos_token }}|{% for m in messages %}{{ m.content }}{% endfor %}|"
                      "{{ add_generation_prompt }}|{{ tools|tojson if tools is defined }}|{{ enable_thinking is defined }}";
    pt_chat_template *t = NULL;
    REQUIRE(pt_chat_template_from_string(src, strlen(src), "chat", &t) == PT_OK, "%s", pt_last_error());
    char *out = NULL;
    const char *msgs = "[{\"role\": \"user\", \"content\": \"q\\\"\"}]";
    const char *extra = " { \"tools\": [{\"default\": 1.0, \"n\": 2}], \"eos_token\": \"E\", "
                        "\"messages\": [], \"add_generation_prompt\": false } ";
    REQUIRE(pt_chat_template_render_chat(t, msgs, 1, extra, "<\"b\">", "e", NULL, &out, NULL) == PT_OK, "%s",
            pt_last_error());
    CHECK(!strcmp(out, "<\"b\">|E|q\"|True|[{\"default\": 1.0, \"n\": 2}]|False"), "got %s", out);
    free(out);
    REQUIRE(pt_chat_template_render_chat(t, "[]", 0, NULL, NULL, NULL, NULL, &out, NULL) == PT_OK, "%s",
            pt_last_error());
    CHECK(!strcmp(out, "|||False||False"), "got %s", out);
    free(out);
    CHECK(pt_chat_template_render_chat(t, "{}", 0, NULL, NULL, NULL, NULL, &out, NULL) == PT_ERR_INVALID_ARG,
          "messages must be an array");
    CHECK(pt_chat_template_render_chat(t, "[]", 0, "[1]", NULL, NULL, NULL, &out, NULL) == PT_ERR_INVALID_ARG,
          "extra must be an object");
    CHECK(pt_chat_template_render_chat(t, "[]", 0, "{}", NULL, NULL, NULL, &out, NULL) == PT_OK, "empty extra");
    free(out);
    pt_chat_template_free(&t);
}

static void test_error_has_line(void) {
    pt_jinja_template *t = NULL;
    const char *src = "line1\n{% if true %}\n{{ raise_exception('boom') }}\n{% endif %}";
    REQUIRE(pt_jinja_parse(src, strlen(src), "tpl", &t) == PT_OK, "%s", pt_last_error());
    char *out = NULL;
    pt_jinja_vars v = {0};
    CHECK(pt_jinja_render(t, &v, &out, NULL) == PT_ERR_FORMAT, "raises");
    CHECK(!strcmp(pt_last_error(), "tpl:3: TemplateError: boom"), "got %s", pt_last_error());
    pt_jinja_free(&t);
    const char *bad = "a\nb\n{% for x in %}";
    CHECK(pt_jinja_parse(bad, strlen(bad), "bad", &t) == PT_ERR_FORMAT, "syntax error");
    CHECK(!strncmp(pt_last_error(), "bad:3: TemplateSyntaxError", 26), "got %s", pt_last_error());
    const char *inv = "\xff\xfe";
    CHECK(pt_jinja_parse(inv, 2, "inv", &t) == PT_ERR_FORMAT, "invalid UTF-8 refused");
}

static void test_resource_limits(void) {
    pt_jinja_template *t = NULL;
    const char *src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    REQUIRE(pt_jinja_parse(src, strlen(src), "rec", &t) == PT_OK, "%s", pt_last_error());
    char *out = NULL;
    pt_jinja_vars v = {0};
    CHECK(pt_jinja_render(t, &v, &out, NULL) == PT_ERR_FORMAT && strstr(pt_last_error(), "RecursionError"),
          "unbounded recursion is an error: %s", pt_last_error());
    pt_jinja_free(&t);
    const char *big = "{{ 'x' * 100000000 }}";
    REQUIRE(pt_jinja_parse(big, strlen(big), "big", &t) == PT_OK, "%s", pt_last_error());
    CHECK(pt_jinja_render(t, &v, &out, NULL) == PT_ERR_FORMAT, "huge strings are refused");
    pt_jinja_free(&t);
    char deep[4000];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k] = 0;
    CHECK(pt_jinja_parse(deep, k, "deep", &t) == PT_ERR_FORMAT, "deep nesting refused without a crash");
}

/* str.format field names: digits only are a positional index, bounded
 * without overflow (an index past INT_MAX once read a negative slot); digits
 * followed by letters are a keyword name, as in Python. */
static void test_format_field_names(void) {
    static const struct {
        const char *src, *out, *err;
    } cases[] = {
        {"{{ '{2222222222f}'.format(1) }}", NULL, "KeyError: '2222222222f'"},
        {"{{ '{0f}'.format(1) }}", NULL, "KeyError: '0f'"},
        {"{{ '{2222222222}'.format(1) }}", NULL, "IndexError: tuple index out of range"},
        {"{{ '{99999999999999999999999}'.format(1) }}", NULL, "IndexError: tuple index out of range"},
        {"{{ '{1}'.format(1) }}", NULL, "IndexError: tuple index out of range"},
        {"{{ '{0}-{0}:{1}'.format(7, 'a') }}", "7-7:a", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_jinja_template *t = NULL;
        REQUIRE(pt_jinja_parse(cases[i].src, strlen(cases[i].src), "fmt", &t) == PT_OK, "%s", pt_last_error());
        char *out = NULL;
        pt_jinja_vars v = {0};
        pt_status st = pt_jinja_render(t, &v, &out, NULL);
        if (cases[i].out) CHECK(st == PT_OK && out && !strcmp(out, cases[i].out), "%s: got '%s'", cases[i].src, out ? out : "");
        else CHECK(st == PT_ERR_FORMAT && strstr(pt_last_error(), cases[i].err), "%s: %s", cases[i].src, pt_last_error());
        free(out);
        pt_jinja_free(&t);
    }
}

int main(void) {
    run_features();
    TEST_RUN(test_model_dir_loading);
    TEST_RUN(test_numbers_from_json);
    TEST_RUN(test_render_chat);
    TEST_RUN(test_error_has_line);
    TEST_RUN(test_resource_limits);
    TEST_RUN(test_format_field_names);
    return test_summary();
}
