/* Chat templates: finding a model's template and rendering a conversation
 * with it exactly as transformers' apply_chat_template does.
 *
 * Where the template comes from (first match wins, as in transformers):
 *   1. an explicit file (`--chat-template FILE`, pt_model_params.chat_template_path);
 *   2. chat_template.jinja in the model directory (it overrides the config's),
 *      with additional_chat_templates/NAME.jinja as more named templates;
 *   3. tokenizer_config.json "chat_template": a string, or a list of
 *      {"name", "template"} objects;
 *   4. chat_template.json ({"chat_template": "..."}, a processor's file).
 * With named templates, transformers' rule picks: "tool_use" when the render
 * has non-null tools and there is one, else "default".
 *
 * Variables: the caller passes one JSON object whose members are the
 * template's variables, as apply_chat_template passes them: messages, tools,
 * documents, add_generation_prompt, bos_token, eos_token, and any extra
 * keyword (enable_thinking, reasoning_effort, ...). Members that are absent
 * are undefined in the template (apply_chat_template passes tools=None and
 * documents=None only when the caller does).
 *
 * Not here: tokenizing the result (the tokenizer does that), and deciding
 * which special tokens to pass (pt_chat_template_bos/eos give the ones
 * tokenizer_config.json names, for callers that want them). */
#ifndef PT_TOKENIZER_CHAT_TEMPLATE_H
#define PT_TOKENIZER_CHAT_TEMPLATE_H

#include "petrel.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <time.h>

typedef struct pt_chat_template pt_chat_template;

/* Loads the model's chat template by the rule above. override_path: NULL or
 * a template file that wins over the model's. PT_ERR_NOT_FOUND when the
 * model has none; PT_ERR_FORMAT for a malformed tokenizer_config.json field
 * or a template with a syntax error (message names the file and line). */
pt_status pt_chat_template_load(const char *model_dir, const char *override_path,
                                pt_chat_template **out);
/* A template from a file / from text (name: for messages). */
pt_status pt_chat_template_from_file(const char *path, pt_chat_template **out);
pt_status pt_chat_template_from_string(const char *src, size_t len, const char *name,
                                       pt_chat_template **out);
/* NULL-safe; sets *t to NULL. */
void pt_chat_template_free(pt_chat_template **t);

/* bos_token / eos_token named by tokenizer_config.json (as a string or as
 * {"content": ...}); NULL when absent or when loaded from a file. Owned by t. */
const char *pt_chat_template_bos(const pt_chat_template *t);
const char *pt_chat_template_eos(const pt_chat_template *t);

/* Renders with `vars` (a JSON object, see above). now: strftime_now's time;
 * NULL = current local time. *out malloc'd, NUL-terminated, *out_len bytes
 * (out_len may be NULL). Errors: PT_ERR_INVALID_ARG when vars is not an
 * object; PT_ERR_FORMAT when the template raises — the message is
 * "TEMPLATE:LINE: ErrorType: message" (e.g. "TemplateError: System role not
 * supported"), as jinja2 would raise it. */
pt_status pt_chat_template_render(const pt_chat_template *t, const cJSON *vars,
                                  const struct tm *now, char **out, size_t *out_len);
/* The same from JSON text; exact for numbers (1 stays an int, 1.0 a float),
 * which cJSON cannot tell apart. */
pt_status pt_chat_template_render_json(const pt_chat_template *t, const char *vars_json,
                                       size_t len, const struct tm *now, char **out,
                                       size_t *out_len);

/* The chat call in one piece, exact for numbers: messages_json (a JSON
 * array), add_generation_prompt, and extra_json (NULL or a JSON object of
 * more variables: tools, documents, enable_thinking, ...). bos_token /
 * eos_token: NULL = the ones tokenizer_config.json names (when it does);
 * extra_json's members override them; messages and add_generation_prompt
 * always come from the arguments. Errors as pt_chat_template_render, with
 * PT_ERR_INVALID_ARG naming which JSON argument is malformed. */
pt_status pt_chat_template_render_chat(const pt_chat_template *t, const char *messages_json,
                                       int add_generation_prompt, const char *extra_json,
                                       const char *bos_token, const char *eos_token,
                                       const struct tm *now, char **out, size_t *out_len);

/* Parses "YYYY-MM-DDTHH:MM:SS" (a local time) into *tm. PT_ERR_INVALID_ARG
 * naming the text otherwise. */
pt_status pt_chat_template_parse_time(const char *text, struct tm *tm);

#endif
