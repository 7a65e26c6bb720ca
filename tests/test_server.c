/* Server tests of the APIs, over loopback against the deterministic test
 * model (test_server_engine.h): OpenAI chat and completions (buffered and
 * SSE), long prompts run in chunks and short ones in pieces, stop strings,
 * tool calls (parsing, auto and forced), constrained JSON, logprobs, the
 * Anthropic messages shape, tokenize/detokenize, the prompt cache, and the
 * official openai / @anthropic-ai/sdk clients driven by node (tests/node).
 * Not the HTTP layer, limits and load (tests/test_server_http.c). */
#include "test_server_client.h"

#include "server/sched.h" /* pt_srv_now */
#include "server/toolcall.h"

static void test_server_chat_basic(void) {
    char *b = chat_body("SAY:Hi there \xe2\x9c\x93", "\"max_tokens\":50");
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    cJSON *j = json_body(&r);
    CHECK(r.status == 200, "status %d %s", r.status, r.body);
    const char *c = jstr(j, "choices.0.message.content");
    CHECK(c && !strcmp(c, "Hi there \xe2\x9c\x93"), "content '%s'", c ? c : "(null)");
    CHECK(jstr(j, "choices.0.finish_reason") && !strcmp(jstr(j, "choices.0.finish_reason"), "stop"), "finish");
    CHECK(jstr(j, "model") && !strcmp(jstr(j, "model"), "test-model"), "model echoed");
    CHECK(jstr(j, "object") && !strcmp(jstr(j, "object"), "chat.completion"), "object");
    CHECK(jnum(j, "usage.completion_tokens") == 12, "completion tokens %g", jnum(j, "usage.completion_tokens"));
    CHECK(jnum(j, "usage.prompt_tokens") > 10 && jnum(j, "usage.prompt_tokens_details.cached_tokens") >= 0,
          "usage %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);

    /* max_tokens -> length */
    b = chat_body("LOOP:ab", "\"max_tokens\":7");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    j = json_body(&r);
    c = jstr(j, "choices.0.message.content");
    CHECK(c && !strcmp(c, "abababa") && !strcmp(jstr(j, "choices.0.finish_reason"), "length"),
          "length: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
}

static void test_server_long_prompt_chunks(void) {
    /* 1500 prompt tokens run in chunks (1024 + the rest) and the reply follows */
    char *big = malloc(1600);
    memset(big, 'p', 1500);
    strcpy(big + 1500, " SAY:done");
    char *b = chat_body(big, NULL);
    long before = atomic_load(&g_model.prompt_tokens_run);
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    cJSON *j = json_body(&r);
    const char *c = jstr(j, "choices.0.message.content");
    CHECK(r.status == 200 && c && !strcmp(c, "done"), "long prompt: %d %.200s", r.status, r.body);
    CHECK(atomic_load(&g_model.prompt_tokens_run) - before >= 1500, "prompt ran");
    cJSON_Delete(j);
    resp_free(&r);
    free(b);
    free(big);
}

static void test_server_stream_sse(void) {
    char *b = chat_body("SAY:one two three", "\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    CHECK(r.status == 200 && strstr(r.head, "text/event-stream"), "sse head %s", r.head);
    pt_sbuf content = {0};
    char finish[32] = "";
    int done_last, n_events;
    cJSON *usage = NULL;
    CHECK(sse_collect(r.body, &content, finish, sizeof finish, &done_last, &n_events, &usage),
          "framing: %s", r.body);
    CHECK(content.data && !strcmp(content.data, "one two three"), "content '%s'", content.data);
    CHECK(!strcmp(finish, "stop") && done_last, "finish %s, [DONE] last %d", finish, done_last);
    CHECK(usage && jnum(usage, "completion_tokens") == 13, "usage chunk");
    cJSON_Delete(usage);
    pt_sbuf_free(&content);
    resp_free(&r);

    /* stop strings are never shown, even split across tokens */
    b = chat_body("SAY:one two three", "\"stream\":true,\"stop\":[\"two\",\"zzz\"]");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    content = (pt_sbuf){0};
    sse_collect(r.body, &content, finish, sizeof finish, &done_last, &n_events, NULL);
    CHECK(content.data && !strcmp(content.data, "one "), "stop stream '%s'", content.data);
    CHECK(!strstr(r.body, "\"tw"), "no part of the stop string leaked");
    CHECK(!strcmp(finish, "stop") && done_last, "finish");
    pt_sbuf_free(&content);
    resp_free(&r);

    /* failure mid-way: an error event, then [DONE] */
    b = chat_body("FAIL:3", "\"stream\":true");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    content = (pt_sbuf){0};
    CHECK(sse_collect(r.body, &content, finish, sizeof finish, &done_last, &n_events, NULL), "framing");
    CHECK(!strcmp(finish, "ERROR") && done_last && strstr(r.body, "scripted failure"),
          "error then [DONE]: %s", r.body);
    pt_sbuf_free(&content);
    resp_free(&r);

    /* the same failure without streaming: 500 with the message */
    b = chat_body("FAIL:2", NULL);
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    CHECK(r.status == 500 && strstr(r.body, "scripted failure"), "500: %d %s", r.status, r.body);
    resp_free(&r);
}

static void test_server_completions_logprobs(void) {
    resp r;
    http("POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":5,\"logprobs\":2,\"stop\":\"e\"}",
         NULL, &r);
    cJSON *j = json_body(&r);
    /* BOS + 'x' = 2 tokens: cycle position 2 -> "cd" then 'e' stops */
    const char *t = jstr(j, "choices.0.text");
    CHECK(r.status == 200 && t && !strcmp(t, "cd"), "text '%s' %s", t ? t : "", r.body);
    CHECK(jstr(j, "object") && !strcmp(jstr(j, "object"), "text_completion"), "object");
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(lp, "token_logprobs")) == 3, "3 token logprobs (stop token too)");
    cJSON_Delete(j);
    resp_free(&r);

    char *b = chat_body("SAY:ok", "\"logprobs\":true,\"top_logprobs\":2");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    j = json_body(&r);
    const char *tok = jstr(j, "choices.0.logprobs.content.1.token");
    CHECK(tok && !strcmp(tok, "k"), "logprob token '%s'", tok ? tok : "");
    CHECK(jnum(j, "choices.0.logprobs.content.0.logprob") == -0.25, "logprob value");
    CHECK(jnum(j, "choices.0.logprobs.content.0.top_logprobs.1.logprob") == -1.5, "top logprob");
    cJSON_Delete(j);
    resp_free(&r);

    /* a token that is part of a UTF-8 sequence: "token" stays valid UTF-8
     * (U+FFFD), "bytes" has the raw byte */
    b = chat_body("SAY:\xe2\x9c\x93", "\"logprobs\":true");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    j = json_body(&r);
    CHECK(r.status == 200 && pt_utf8_invalid_offset(r.body, r.body_len) < 0, "response is valid UTF-8");
    tok = jstr(j, "choices.0.logprobs.content.0.token");
    CHECK(tok && !strcmp(tok, "\xef\xbf\xbd") && jnum(j, "choices.0.logprobs.content.0.bytes.0") == 0xe2,
          "partial token: %s", r.body);
    CHECK(jnum(j, "choices.0.logprobs.content.0.logprob") == -0.25, "logprobs without top_logprobs: logprob %g",
          jnum(j, "choices.0.logprobs.content.0.logprob"));
    cJSON_Delete(j);
    resp_free(&r);

    /* a reply without logprobs samples without the log-probability; one with them, with it */
    const int lp0 = __atomic_load_n(&tm_samples_lp, __ATOMIC_RELAXED),
              nolp0 = __atomic_load_n(&tm_samples_nolp, __ATOMIC_RELAXED);
    b = chat_body("SAY:abc", NULL);
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    CHECK(r.status == 200 && !strstr(r.body, "\"logprobs\":{"), "no logprobs asked: %d %s", r.status, r.body);
    resp_free(&r);
    const int lp1 = __atomic_load_n(&tm_samples_lp, __ATOMIC_RELAXED),
              nolp1 = __atomic_load_n(&tm_samples_nolp, __ATOMIC_RELAXED);
    CHECK(lp1 == lp0 && nolp1 >= nolp0 + 4, "without logprobs: %d samples with the log-probability, %d without",
          lp1 - lp0, nolp1 - nolp0);
    b = chat_body("SAY:abc", "\"logprobs\":true");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    resp_free(&r);
    CHECK(__atomic_load_n(&tm_samples_lp, __ATOMIC_RELAXED) >= lp1 + 4 &&
              __atomic_load_n(&tm_samples_nolp, __ATOMIC_RELAXED) == nolp1,
          "with logprobs: %d samples with the log-probability, %d without",
          __atomic_load_n(&tm_samples_lp, __ATOMIC_RELAXED) - lp1,
          __atomic_load_n(&tm_samples_nolp, __ATOMIC_RELAXED) - nolp1);

    /* prompt as token ids */
    http("POST", "/v1/completions", "{\"prompt\":[104,105],\"max_tokens\":2}", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "\"text\":\"cd\""), "ids prompt %s", r.body);
    resp_free(&r);
    http("POST", "/v1/completions", "{\"prompt\":[104,99999],\"max_tokens\":2}", NULL, &r);
    CHECK(r.status == 400 && strstr(r.body, "prompt[1]"), "bad id %s", r.body);
    resp_free(&r);
}

static void test_toolcall_parsing(void) {
    pt_tool_call *c;
    char *content;
    const char *q = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                    "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"t2\",\"arguments\":{}}</tool_call>";
    int n = pt_toolcall_parse(q, strlen(q), &c, &content);
    CHECK(n == 2 && !strcmp(c[0].name, "get_weather") && !strcmp(c[0].arguments, "{\"city\":\"Paris\"}") &&
              !strcmp(c[1].name, "t2") && !strcmp(content, "Let me check."),
          "qwen: n=%d content='%s'", n, content);
    pt_toolcall_free(c, n);
    free(content);
    const char *l = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}";
    n = pt_toolcall_parse(l, strlen(l), &c, &content);
    CHECK(n == 1 && !strcmp(c[0].name, "search") && !strcmp(c[0].arguments, "{\"q\":\"x\"}"), "llama: %d", n);
    pt_toolcall_free(c, n);
    free(content);
    const char *g = "```tool_code\nget_weather(city='Paris', days=3, units=None, tags=[\"a\", True])\n```";
    n = pt_toolcall_parse(g, strlen(g), &c, &content);
    CHECK(n == 1 && !strcmp(c[0].name, "get_weather") &&
              !strcmp(c[0].arguments, "{\"city\":\"Paris\",\"days\":3,\"units\":null,\"tags\":[\"a\",true]}"),
          "gemma: %d %s", n, n > 0 ? c[0].arguments : "");
    pt_toolcall_free(c, n);
    free(content);
    const char *plain = "{not a call} and <tool_call> broken";
    n = pt_toolcall_parse(plain, strlen(plain), &c, &content);
    CHECK(n == 0 && !strcmp(content, plain), "plain text stays content");
    pt_toolcall_free(c, 0);
    free(content);
    int in_call;
    CHECK(pt_toolcall_stream_safe("Hello <tool", 11, &in_call) == 6 && !in_call, "hold marker prefix");
    CHECK(pt_toolcall_stream_safe("Hi <tool_call>{", 15, &in_call) == 3 && in_call, "marker seen");
}

static void test_server_tool_calls(void) {
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";
    char *b = chat_body("SAY:<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", tools);
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    cJSON *j = json_body(&r);
    CHECK(r.status == 200 && jstr(j, "choices.0.finish_reason") &&
              !strcmp(jstr(j, "choices.0.finish_reason"), "tool_calls"),
          "finish: %s", r.body);
    const char *args = jstr(j, "choices.0.message.tool_calls.0.function.arguments");
    CHECK(jstr(j, "choices.0.message.tool_calls.0.function.name") && args &&
              !strcmp(args, "{\"city\":\"Paris\"}") && jstr(j, "choices.0.message.tool_calls.0.id"),
          "call: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    /* streamed: no marker text leaks into content; tool_calls delta with index */
    char extra[1024];
    snprintf(extra, sizeof extra, "%s,\"stream\":true", tools);
    free(b);
    b = chat_body("SAY:Checking. <tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call>", extra);
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    pt_sbuf content = {0};
    char finish[32] = "";
    int done_last, n_ev;
    sse_collect(r.body, &content, finish, sizeof finish, &done_last, &n_ev, NULL);
    CHECK(content.data && !strcmp(content.data, "Checking. "), "content '%s'", content.data);
    CHECK(!strcmp(finish, "tool_calls") && done_last && strstr(r.body, "\"index\":0") &&
              strstr(r.body, "Oslo") && !strstr(r.body, "<tool_call"),
          "stream: %s", r.body);
    pt_sbuf_free(&content);
    resp_free(&r);
    /* a tool result goes back through the template */
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"content\":null,"
         "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
         "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
         "\"content\":\"sunny\"}],\"max_tokens\":3}",
         NULL, &r);
    CHECK(r.status == 200, "tool round trip: %d %s", r.status, r.body);
    resp_free(&r);
}

static void test_server_forced_tool_call(void) {
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],"
                        "\"additionalProperties\":false}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"zone\":{\"enum\":[\"UTC\",\"CET\"]}},"
                        "\"required\":[\"zone\"],\"additionalProperties\":false}}}]";
    const char *choices[] = {"\"tool_choice\":\"required\"",
                             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"};
    for (int k = 0; k < 2; k++) {
        for (int stream = 0; stream < 2; stream++) {
            char extra[2048];
            snprintf(extra, sizeof extra, "%s,%s%s", tools, choices[k], stream ? ",\"stream\":true" : "");
            /* the scripted reply is plain text: the call is forced anyway */
            char *b = chat_body("SAY:I would rather chat.", extra);
            resp r;
            http("POST", "/v1/chat/completions", b, NULL, &r);
            free(b);
            char name[64] = "", args[512] = "", finish[32] = "";
            if (!stream) {
                cJSON *j = json_body(&r);
                const char *n = jstr(j, "choices.0.message.tool_calls.0.function.name");
                const char *a = jstr(j, "choices.0.message.tool_calls.0.function.arguments");
                const char *f = jstr(j, "choices.0.finish_reason");
                snprintf(name, sizeof name, "%s", n ? n : "");
                snprintf(args, sizeof args, "%s", a ? a : "");
                snprintf(finish, sizeof finish, "%s", f ? f : "");
                cJSON_Delete(j);
            } else {
                const char *p = r.body ? strstr(r.body, "\"tool_calls\"") : NULL;
                cJSON *j = NULL;
                if (p) {
                    const char *ln = p;
                    while (ln > r.body && ln[-1] != '\n') ln--;
                    const char *e = strstr(ln, "\n\n");
                    j = e ? cJSON_ParseWithLength(ln + 6, (size_t)(e - ln - 6)) : NULL;
                }
                const char *n = jstr(j, "choices.0.delta.tool_calls.0.function.name");
                const char *a = jstr(j, "choices.0.delta.tool_calls.0.function.arguments");
                snprintf(name, sizeof name, "%s", n ? n : "");
                snprintf(args, sizeof args, "%s", a ? a : "");
                if (r.body && strstr(r.body, "\"finish_reason\":\"tool_calls\"")) strcpy(finish, "tool_calls");
                cJSON_Delete(j);
            }
            cJSON *a = cJSON_Parse(args);
            int ok_name = k == 0 ? (!strcmp(name, "get_weather") || !strcmp(name, "get_time")) : !strcmp(name, "get_time");
            int ok_args = cJSON_IsObject(a) &&
                          (!strcmp(name, "get_weather") ? cJSON_IsString(cJSON_GetObjectItem(a, "city"))
                                                        : cJSON_IsString(cJSON_GetObjectItem(a, "zone")));
            CHECK(r.status == 200 && ok_name && ok_args && !strcmp(finish, "tool_calls"),
                  "choice %d stream %d: name '%s' args '%s' finish '%s': %.300s", k, stream, name, args, finish, r.body);
            cJSON_Delete(a);
            resp_free(&r);
        }
    }
    /* Anthropic: {"type":"tool","name":...} */
    resp r;
    http("POST", "/v1/messages",
         "{\"max_tokens\":200,\"tool_choice\":{\"type\":\"tool\",\"name\":\"calc\"},\"tools\":[{\"name\":\"calc\","
         "\"input_schema\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"],"
         "\"additionalProperties\":false}}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"SAY:no thanks\"}]}",
         NULL, &r);
    cJSON *j = json_body(&r);
    CHECK(r.status == 200 && jstr(j, "stop_reason") && !strcmp(jstr(j, "stop_reason"), "tool_use") &&
              jstr(j, "content.0.name") && !strcmp(jstr(j, "content.0.name"), "calc") &&
              cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "content"), 0), "input"), "x")),
          "anthropic forced: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    /* an unknown name is a 400 */
    char extra[1024];
    snprintf(extra, sizeof extra, "%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}", tools);
    char *b = chat_body("hi", extra);
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    CHECK(r.status == 400 && strstr(r.body, "nope"), "unknown tool: %d %s", r.status, r.body);
    resp_free(&r);
}

static void test_server_json_schema(void) {
    const char *rf = "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":"
                     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"
                     "\"integer\"}},\"required\":[\"name\",\"n\"],\"additionalProperties\":false}}}";
    /* a reply that already fits passes through unchanged */
    char *b = chat_body("SAY:{\"name\":\"Bo\",\"n\":7}", rf);
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    cJSON *j = json_body(&r);
    const char *c = jstr(j, "choices.0.message.content");
    CHECK(c && !strcmp(c, "{\"name\":\"Bo\",\"n\":7}"), "fits: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    /* a reply that does not fit is forced into the schema */
    b = chat_body("SAY:sure! here you go", rf);
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    j = json_body(&r);
    c = jstr(j, "choices.0.message.content");
    cJSON *doc = c ? cJSON_Parse(c) : NULL;
    CHECK(doc && cJSON_IsString(cJSON_GetObjectItem(doc, "name")) &&
              cJSON_IsNumber(cJSON_GetObjectItem(doc, "n")) && cJSON_GetArraySize(doc) == 2,
          "forced: %s", c ? c : r.body);
    cJSON_Delete(doc);
    cJSON_Delete(j);
    resp_free(&r);
    b = chat_body("SAY:no", "\"response_format\":{\"type\":\"json_object\"}");
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    j = json_body(&r);
    c = jstr(j, "choices.0.message.content");
    doc = c ? cJSON_Parse(c) : NULL;
    CHECK(cJSON_IsObject(doc), "json_object: %s", c ? c : r.body);
    cJSON_Delete(doc);
    cJSON_Delete(j);
    resp_free(&r);
}

static void test_server_anthropic(void) {
    resp r;
    http("POST", "/v1/messages",
         "{\"model\":\"x\",\"max_tokens\":64,\"system\":\"be brief\",\"messages\":[{\"role\":\"user\","
         "\"content\":[{\"type\":\"text\",\"text\":\"SAY:Bonjour\"}]}]}",
         NULL, &r);
    cJSON *j = json_body(&r);
    CHECK(r.status == 200 && jstr(j, "type") && !strcmp(jstr(j, "type"), "message") &&
              !strcmp(jstr(j, "content.0.text"), "Bonjour") && !strcmp(jstr(j, "stop_reason"), "end_turn") &&
              jnum(j, "usage.output_tokens") == 7,
          "message: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    http("POST", "/v1/messages", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", NULL, &r);
    j = json_body(&r);
    CHECK(r.status == 400 && jstr(j, "type") && !strcmp(jstr(j, "type"), "error") &&
              jstr(j, "error.type") && strstr(jstr(j, "error.message"), "max_tokens"),
          "anthropic error shape: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    /* streaming event grammar */
    http("POST", "/v1/messages",
         "{\"max_tokens\":64,\"stream\":true,\"stop_sequences\":[\"!\"],\"messages\":[{\"role\":\"user\","
         "\"content\":\"SAY:Hey you!\"}]}",
         NULL, &r);
    const char *order[] = {"event: message_start", "event: content_block_start", "event: content_block_delta",
                           "event: content_block_stop", "event: message_delta", "event: message_stop"};
    const char *p = r.body;
    for (int i = 0; i < 6; i++) {
        const char *q = p ? strstr(p, order[i]) : NULL;
        CHECK(q, "event %s in order: %s", order[i], r.body);
        p = q ? q + 1 : NULL;
    }
    CHECK(strstr(r.body, "\"stop_reason\":\"stop_sequence\"") && strstr(r.body, "\"stop_sequence\":\"!\"") &&
              !strstr(r.body, "[DONE]"),
          "stop_sequence: %s", r.body);
    resp_free(&r);
    /* tool use */
    http("POST", "/v1/messages",
         "{\"max_tokens\":200,\"tools\":[{\"name\":\"calc\",\"input_schema\":{\"type\":\"object\"}}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"SAY:<tool_call>{\\\"name\\\":\\\"calc\\\",\\\"arguments\\\":{\\\"x\\\":2}}</tool_call>\"}]}",
         NULL, &r);
    j = json_body(&r);
    CHECK(r.status == 200 && jstr(j, "stop_reason") && !strcmp(jstr(j, "stop_reason"), "tool_use") &&
              jstr(j, "content.0.type") && !strcmp(jstr(j, "content.0.type"), "tool_use") &&
              jnum(j, "content.0.input.x") == 2,
          "tool_use: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
}

static void test_server_tokenize(void) {
    resp r;
    http("POST", "/tokenize", "{\"content\":\"hi\",\"add_special\":true}", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "[258,104,105]"), "tokenize %s", r.body);
    resp_free(&r);
    http("POST", "/detokenize", "{\"tokens\":[104,105]}", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "\"content\":\"hi\""), "detokenize %s", r.body);
    resp_free(&r);
    http("POST", "/detokenize", "{\"tokens\":[-1]}", NULL, &r);
    CHECK(r.status == 400, "bad token %s", r.body);
    resp_free(&r);
    http("POST", "/tokenize", "{\"content\":3}", NULL, &r);
    CHECK(r.status == 400 && strstr(r.body, "content"), "bad content %s", r.body);
    resp_free(&r);
}

static void test_server_prompt_cache(void) {
    /* two turns of one conversation: the second re-runs only the new part */
    char big[300];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    char body[2000];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},{\"role\":\"user\",\"content\":\"SAY:a\"}]}", big);
    resp r;
    http("POST", "/v1/chat/completions", body, NULL, &r);
    resp_free(&r);
    long before = atomic_load(&g_model.prompt_tokens_run);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},{\"role\":\"user\",\"content\":\"SAY:a\"},"
             "{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"SAY:b\"}]}", big);
    http("POST", "/v1/chat/completions", body, NULL, &r);
    long ran = atomic_load(&g_model.prompt_tokens_run) - before;
    cJSON *j = json_body(&r);
    double cached = jnum(j, "usage.prompt_tokens_details.cached_tokens");
    double prompt = jnum(j, "usage.prompt_tokens");
    CHECK(r.status == 200 && cached >= 300 && cached < prompt, "cached %g of %g: %s", cached, prompt, r.body);
    CHECK(ran < 80, "only the new turn was run: %ld tokens", ran);
    printf("INFO prompt cache: %g of %g prompt tokens reused, %ld run\n", cached, prompt, ran);
    cJSON_Delete(j);
    resp_free(&r);
    http("GET", "/metrics", NULL, NULL, &r);
    CHECK(strstr(r.body, "petrel_prompt_cache_hits_total") && strstr(r.body, "petrel_generated_tokens_total") &&
              strstr(r.body, "petrel_time_to_first_token_seconds_bucket{le=\"+Inf\"}") &&
              strstr(r.head, "text/plain"),
          "metrics: %.300s", r.body);
    resp_free(&r);
}

/* Short prompts in pieces (engine.h short_prompt_piece, 8 on CUDA): a
 * second server whose engine runs a short prompt rest in pieces of 3 tokens
 * replies exactly as the main one (the test model does not depend on the
 * chunking) and runs as many tokens. */
static double phase_seconds(const char *text) {
    static const char *const names[3] = {"petrel_scheduler_seconds_total{phase=\"sample\"}",
                                         "petrel_scheduler_seconds_total{phase=\"tokens\"}",
                                         "petrel_scheduler_seconds_total{phase=\"step\"}"};
    double sum = 0.0;
    for (int i = 0; i < 3; i++) {
        const double v = metric_value(text, names[i]);
        if (v < 0.0) return -1.0;
        sum += v;
    }
    return sum;
}

/* /metrics: the scheduler's turns and their seconds by phase. A request of
 * N generated tokens runs at least N turns (each samples one token and runs
 * one step; the response may leave before its last turn is counted), and
 * the seconds the phases gained lie within the request's wall time. */
static void test_server_metrics_scheduler(void) {
    resp r;
    http("GET", "/metrics", NULL, NULL, &r);
    const double turns0 = metric_value(r.body, "petrel_scheduler_turns_total"), sec0 = phase_seconds(r.body);
    resp_free(&r);
    CHECK(turns0 >= 0.0 && sec0 >= 0.0, "scheduler metrics present");
    char *b = chat_body("LOOP:ab", "\"max_tokens\":20");
    const double t0 = pt_srv_now();
    http("POST", "/v1/chat/completions", b, NULL, &r);
    const double t1 = pt_srv_now();
    free(b);
    cJSON *j = json_body(&r);
    const double gen = jnum(j, "usage.completion_tokens");
    CHECK(r.status == 200 && gen == 20, "20 tokens: %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    http("GET", "/metrics", NULL, NULL, &r);
    const double turns = metric_value(r.body, "petrel_scheduler_turns_total") - turns0;
    const double sec = phase_seconds(r.body) - sec0;
    resp_free(&r);
    CHECK(turns >= gen - 1, "%g turns for %g tokens", turns, gen);
    CHECK(sec > 0.0 && sec <= (t1 - t0) + 0.05, "phases %.6f s within the request's %.6f s", sec, t1 - t0);
}

static void test_server_short_prompt_pieces(void) {
    static pt_srv_engine e2; /* the server keeps a pointer to it */
    e2 = g_engine;
    e2.short_prompt_piece = 3;
    pt_server_params p = pt_server_default_params();
    p.port = 0;
    p.n_parallel = 2;
    pt_server *s2;
    REQUIRE(pt_server_start(&e2, &p, &s2) == PT_OK, "start: %s", pt_last_error());
    const char *body = "{\"prompt\":[97,98,99,100,101,102,103,104,105,106],\"max_tokens\":3}";
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    resp a, b;
    long n0 = atomic_load(&g_model.prompt_tokens_run);
    REQUIRE(raw(g_port, req, strlen(req), &a) == 0, "main server");
    long n1 = atomic_load(&g_model.prompt_tokens_run);
    REQUIRE(raw(pt_server_port(s2), req, strlen(req), &b) == 0, "pieces server");
    long n2 = atomic_load(&g_model.prompt_tokens_run);
    cJSON *ja = json_body(&a), *jb = json_body(&b);
    const char *ta = jstr(ja, "choices.0.text"), *tb = jstr(jb, "choices.0.text");
    CHECK(a.status == 200 && b.status == 200 && ta && tb && !strcmp(ta, tb), "pieces reply %s vs %s", a.body, b.body);
    /* the counter also sees the generated tokens decoded after the prompt */
    CHECK(n1 - n0 >= 10 && n2 - n1 == n1 - n0, "tokens run: %ld and %ld (the same, >= 10)", n1 - n0, n2 - n1);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    resp_free(&a);
    resp_free(&b);
    pt_server_stop(&s2);
}

static void test_server_node_sdks(void) {
    if (getenv("PETREL_SKIP_NODE")) TEST_SKIP("PETREL_SKIP_NODE is set");
    if (system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
        TEST_SKIP("node/npm not installed: the official-client tests did not run");
    if (system("test -d tests/node/node_modules/openai && test -d tests/node/node_modules/@anthropic-ai/sdk") != 0) {
        if (system("cd tests/node && timeout 300 npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1") != 0)
            TEST_SKIP("npm ci failed (registry unreachable?): the official-client tests did not run");
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "timeout 60 node tests/node/sdk.mjs http://127.0.0.1:%d 2>&1", g_port);
    FILE *f = popen(cmd, "r");
    REQUIRE(f, "popen");
    char line[2048];
    int pass = 0, fail = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "PASS ", 5)) pass++;
        else if (!strncmp(line, "FAIL ", 5)) {
            fail++;
            CHECK(0, "node: %s", line + 5);
        }
        printf("INFO node: %s\n", line);
    }
    int rc = pclose(f);
    CHECK(rc == 0 && fail == 0 && pass >= 8, "node exit %d, %d passed, %d failed", rc, pass, fail);
}

int main(void) {
    if (srv_start()) return 1;
    TEST_RUN(test_server_chat_basic);
    TEST_RUN(test_server_long_prompt_chunks);
    TEST_RUN(test_server_short_prompt_pieces);
    TEST_RUN(test_server_stream_sse);
    TEST_RUN(test_server_completions_logprobs);
    TEST_RUN(test_toolcall_parsing);
    TEST_RUN(test_server_tool_calls);
    TEST_RUN(test_server_json_schema);
    TEST_RUN(test_server_forced_tool_call);
    TEST_RUN(test_server_anthropic);
    TEST_RUN(test_server_tokenize);
    TEST_RUN(test_server_prompt_cache);
    TEST_RUN(test_server_metrics_scheduler);
    TEST_RUN(test_server_node_sdks);
    pt_server_stop(&g_srv);
    return test_summary();
}
