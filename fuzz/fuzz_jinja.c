/* libFuzzer target for the Jinja engine: the input is a template source; it
 * is parsed and, when it parses, rendered over a small conversation. Any
 * crash, sanitizer report or hang is a bug: every input must end in output
 * or a clean error. */
#include "tokenizer/jinja.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"t0\", \"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"arguments\": {\"x\": 1, \"y\": [1.5, null, true]}}}]}, {\"role\": \"tool\", \"content\": \"ok\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    pt_jinja_template *t = NULL;
    if (pt_jinja_parse((const char *)data, size, "fuzz", &t) != PT_OK) return 0;
    struct tm now = {.tm_year = 126, .tm_mon = 2, .tm_mday = 14, .tm_hour = 15, .tm_min = 9, .tm_sec = 26};
    /* tighter guards than the defaults keep each run well under the fuzzer's timeout */
    pt_jinja_vars v = {.vars_json = VARS, .vars_json_len = sizeof VARS - 1, .now = &now, .max_steps = 2000000,
                       .max_bytes = (size_t)64 << 20};
    char *out = NULL;
    size_t len = 0;
    if (pt_jinja_render(t, &v, &out, &len) == PT_OK) free(out);
    pt_jinja_free(&t);
    return 0;
}
