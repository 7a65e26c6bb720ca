/* Tool calls in generated text, per model family, into OpenAI tool_calls.
 *
 * Recognized forms (detected from the text itself, so a fine-tune that uses
 * another family's convention still works):
 *   Qwen / Hermes  <tool_call>{"name": N, "arguments": {...}}</tool_call>, any
 *                  number of them, with ordinary text around them;
 *   Llama 3.x      the whole reply is {"name": N, "parameters": {...}} (or
 *                  "arguments"), optionally after <|python_tag|>, several
 *                  separated by ';' or newlines;
 *   Gemma          ```tool_code\nname(key=value, ...)\n``` with Python literal
 *                  arguments (strings, numbers, True/False/None, lists, dicts).
 * Text that merely resembles a call but does not parse stays content.
 */
#ifndef PT_SERVER_TOOLCALL_H
#define PT_SERVER_TOOLCALL_H

#include <stddef.h>

typedef struct pt_tool_call {
    char *name;
    char *arguments; /* compact JSON object text */
} pt_tool_call;

/* Parses tool calls out of `text`. Returns the number found (0 = none, and
 * *content is a copy of the text); *calls and *content are malloc'd. On
 * allocation failure returns -1. */
int pt_toolcall_parse(const char *text, size_t len, pt_tool_call **calls, char **content);
void pt_toolcall_free(pt_tool_call *calls, int n);

/* Streaming: how many leading bytes of `text` (the reply so far) can be sent
 * as content now. Bytes from the start of a possible call marker onwards are
 * held; *in_call is set once a marker has certainly begun (everything after
 * it stays held until the end). */
size_t pt_toolcall_stream_safe(const char *text, size_t len, int *in_call);

#endif
