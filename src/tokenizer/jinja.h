/* petrel's Jinja engine: parses a template and renders it with variables the
 * way Python's jinja2 does in transformers' apply_chat_template environment
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
 * transformers' tojson, raise_exception, strftime_now). Output is meant to be
 * byte-identical to jinja2's; see docs/templates.md for the language covered.
 *
 * It is not a general jinja2: no template inheritance or includes, no
 * autoescaping, no line statements. Chat-template specifics (which template a
 * model uses, which variables are passed) live in chat_template.h. */
#ifndef PT_TOKENIZER_JINJA_H
#define PT_TOKENIZER_JINJA_H

#include "petrel.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <time.h>

typedef struct pt_jinja_template pt_jinja_template;

/* Parses a template. `name` appears in error messages. On a syntax error
 * returns PT_ERR_FORMAT with "name:LINE: TemplateSyntaxError: ..." in
 * pt_last_error(). The source must be valid UTF-8. *out NULL on error. */
pt_status pt_jinja_parse(const char *src, size_t len, const char *name, pt_jinja_template **out);
void pt_jinja_free(pt_jinja_template **t);

/* Variables for a render, a JSON object whose members become the template's
 * variables. Exactly one of the two forms is used:
 *  - vars_json/vars_json_len: JSON text, parsed exactly (1 is an int, 1.0 a
 *    float, key order kept), or
 *  - vars: a cJSON object (cJSON keeps no int/float distinction: numbers with
 *    an integral value of magnitude below 2^53 become ints). */
typedef struct pt_jinja_vars {
    const char *vars_json;
    size_t vars_json_len;
    const cJSON *vars;
    const struct tm *now; /* strftime_now's time; NULL = the current local time */
    /* Guards against runaway templates (0 = the defaults): evaluation steps
     * (default 50 million) and bytes of values (default 512 MiB). */
    long max_steps;
    size_t max_bytes;
} pt_jinja_vars;

/* Renders. *out is malloc'd and NUL-terminated (the output may itself hold NUL
 * bytes: use *out_len). A template that raises (raise_exception, an undefined
 * value used where jinja2 raises, a sandbox refusal, a type error) returns
 * PT_ERR_FORMAT with "name:LINE: ErrorType: message" in pt_last_error(); bad
 * variables JSON returns PT_ERR_INVALID_ARG. */
pt_status pt_jinja_render(const pt_jinja_template *t, const pt_jinja_vars *vars, char **out,
                          size_t *out_len);

#endif
