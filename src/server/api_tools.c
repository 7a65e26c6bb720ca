/* Forced tool calls: tool_choice "required" / a named function (OpenAI),
 * {"type":"any"} / {"type":"tool"} (Anthropic).
 *
 * The model's tool-call format is learned once from its chat template: an
 * assistant turn holding a probe call is rendered, and the text around the
 * probe says which form the template writes (Qwen/Hermes <tool_call> JSON, or
 * Llama 3.x bare JSON with "parameters"). A forced call then
 *   - appends the opening marker to the prompt (the reply starts inside it),
 *   - constrains the reply to the call's JSON: an anyOf over the offered
 *     tools, each {"name": const, "arguments": its parameters schema} (a tool
 *     whose schema petrel cannot enforce keeps an any-object; beyond
 *     PT_JSM_THREADS tools the name is an enum and the arguments any object),
 *   - and wraps the reply back in the markers before the tool-call parser.
 * Gemma's Python-call form is not JSON and cannot be forced (400).
 */
#include "server/api.h"

#include "base/error.h"
#include "base/json.h"

#include <stdlib.h>
#include <string.h>

#define PROBE "petrel_probe_fn"

static pt_tool_format detect_format(pt_server *srv) {
    const char *msgs =
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
        "[{\"id\":\"c0\",\"type\":\"function\",\"function\":{\"name\":\"" PROBE "\",\"arguments\":{\"a\":1}}}]}]";
    const char *extra = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"" PROBE
                        "\",\"parameters\":{\"type\":\"object\"}}}]}";
    char *out = NULL;
    if (srv->e->chat_render(srv->e->model, msgs, 0, extra, &out) != PT_OK || !out) {
        pt_clear_error();
        return PT_TOOLS_UNKNOWN;
    }
    pt_tool_format f = PT_TOOLS_UNKNOWN;
    const char *probe = strstr(out, PROBE);
    if (probe) {
        /* look only at the rendered call, after the tool list */
        const char *last = probe, *q;
        while ((q = strstr(last + 1, PROBE))) last = q;
        const char *open = NULL;
        for (const char *p = out; (p = strstr(p, "<tool_call>")) && p < last; p++) open = p;
        if (open) f = PT_TOOLS_QWEN;
        else if (strstr(out, "```tool_code")) f = PT_TOOLS_GEMMA;
        else if (strstr(last, "\"parameters\"") || strstr(last, "\"arguments\"")) f = PT_TOOLS_LLAMA;
    }
    free(out);
    return f;
}

pt_tool_format pt_api_tool_format(pt_server *srv) {
    pthread_mutex_lock(&srv->mu);
    int known = srv->tool_format_known;
    pt_tool_format f = srv->tool_format;
    pthread_mutex_unlock(&srv->mu);
    if (known) return f;
    f = detect_format(srv);
    pthread_mutex_lock(&srv->mu);
    srv->tool_format = f;
    srv->tool_format_known = 1;
    pthread_mutex_unlock(&srv->mu);
    return f;
}

/* tools: OpenAI-style [{"type":"function","function":{"name","parameters"}}];
 * only: NULL, or the one function name allowed. */
int pt_api_force_tool_call(pt_server *srv, pt_gen *g, const cJSON *tools, const char *only,
                           const char *path, pt_http_response *resp) {
    pt_tool_format f = pt_api_tool_format(srv);
    if (f != PT_TOOLS_QWEN && f != PT_TOOLS_LLAMA)
        return pt_api_bad(resp, path,
                          "'tool_choice': a forced tool call needs a chat template that writes tool "
                          "calls as JSON (<tool_call> or Llama 3.x); this model's %s",
                          f == PT_TOOLS_GEMMA ? "uses Python-call syntax" : "writes none petrel recognizes");
    if (g->job->schema) return pt_api_bad(resp, path, "'tool_choice' cannot be combined with 'response_format'");
    const char *args_key = f == PT_TOOLS_QWEN ? "arguments" : "parameters";
    cJSON *alts = cJSON_CreateArray(), *names = cJSON_CreateArray();
    int n = 0, found = 0;
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = pt_json_get_str(fn, "name");
        if (!name || (only && strcmp(only, name))) continue;
        found++;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        /* a parameters schema petrel cannot enforce becomes "any object" */
        pt_jschema *probe = NULL;
        int usable = cJSON_IsObject(params) && pt_jschema_compile(params, &probe) == PT_OK;
        pt_jschema_free(&probe);
        pt_clear_error();
        cJSON *alt = cJSON_CreateObject();
        cJSON_AddStringToObject(alt, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(alt, "properties");
        cJSON *nm = cJSON_AddObjectToObject(props, "name");
        cJSON_AddStringToObject(nm, "const", name);
        if (usable) cJSON_AddItemToObject(props, args_key, cJSON_Duplicate(params, 1));
        else cJSON_AddItemToObject(props, args_key, cJSON_Parse("{\"type\":\"object\"}"));
        cJSON *req = cJSON_AddArrayToObject(alt, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
        cJSON_AddFalseToObject(alt, "additionalProperties");
        cJSON_AddItemToArray(alts, alt);
        cJSON_AddItemToArray(names, cJSON_CreateString(name));
        n++;
    }
    if (!found) {
        cJSON_Delete(alts);
        cJSON_Delete(names);
        return pt_api_bad(resp, path, "'tool_choice': no offered tool named '%s'", only ? only : "");
    }
    cJSON *schema;
    if (n <= PT_JSM_THREADS) {
        schema = cJSON_CreateObject();
        cJSON_AddItemToObject(schema, "anyOf", alts);
        cJSON_Delete(names);
    } else {
        cJSON_Delete(alts);
        schema = cJSON_CreateObject();
        cJSON_AddStringToObject(schema, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(schema, "properties");
        cJSON *nm = cJSON_AddObjectToObject(props, "name");
        cJSON_AddItemToObject(nm, "enum", names);
        cJSON_AddItemToObject(props, args_key, cJSON_Parse("{\"type\":\"object\"}"));
        cJSON *req = cJSON_AddArrayToObject(schema, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
        cJSON_AddFalseToObject(schema, "additionalProperties");
    }
    pt_status st = pt_jschema_compile(schema, &g->job->schema);
    cJSON_Delete(schema);
    if (st != PT_OK) return pt_api_bad(resp, path, "'tool_choice': %s", pt_last_error());
    if (f == PT_TOOLS_QWEN) {
        g->call_prefix = "<tool_call>\n";
        g->call_suffix = "\n</tool_call>";
    }
    g->tools = 1;
    return 1;
}

/* Appends the call's opening marker to the rendered prompt. */
int pt_api_prompt_with_prefix(const pt_gen *g, char **prompt) {
    if (!g->call_prefix) return 1;
    size_t a = strlen(*prompt), b = strlen(g->call_prefix);
    char *p = realloc(*prompt, a + b + 1);
    if (!p) return 0;
    memcpy(p + a, g->call_prefix, b + 1);
    *prompt = p;
    return 1;
}
