/* Server tests of the HTTP layer and of the server under stress, over
 * loopback against the deterministic test model (test_server_engine.h):
 * routes, 404/405, 413 before the body and while reading a chunked one, bad
 * requests and their 400 messages, stalled clients, API keys, the queue's
 * 429 and the cancellation of a disconnected client's job, a load test of
 * concurrent streams with random disconnects, and curl for raw SSE over
 * HTTP/1.1. Not the API shapes (tests/test_server.c). */
#include "test_server_client.h"

#include <pthread.h>

static void test_http_routes(void) {
    resp r;
    REQUIRE(http("GET", "/health", NULL, NULL, &r) == 0, "connect");
    CHECK(r.status == 200 && strstr(r.body, "ok"), "health %d %s", r.status, r.body);
    resp_free(&r);
    http("GET", "/v1", NULL, NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "/v1/chat/completions") && strstr(r.body, "/metrics"),
          "index %s", r.body);
    resp_free(&r);
    http("GET", "/v1/models", NULL, NULL, &r);
    cJSON *j = json_body(&r);
    CHECK(r.status == 200 && jstr(j, "data.0.id") && !strcmp(jstr(j, "data.0.id"), "test-model"),
          "models %s", r.body);
    cJSON_Delete(j);
    resp_free(&r);
    http("GET", "/nope", NULL, NULL, &r);
    j = json_body(&r);
    CHECK(r.status == 404 && jstr(j, "error.message"), "404: %d %s", r.status, r.body);
    cJSON_Delete(j);
    resp_free(&r);
    http("GET", "/v1/chat/completions", NULL, NULL, &r);
    CHECK(r.status == 405 && strstr(r.head, "Allow: POST"), "405: %d %s", r.status, r.head);
    resp_free(&r);
    http("DELETE", "/health", NULL, NULL, &r);
    CHECK(r.status == 405, "405 on /health: %d", r.status);
    resp_free(&r);
}

static void test_http_413_before_body(void) {
    /* headers only, claiming a huge body: the answer must come without it */
    const char *req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 999999999\r\n\r\n";
    resp r;
    REQUIRE(raw(g_port, req, strlen(req), &r) == 0, "response");
    cJSON *j = json_body(&r);
    CHECK(r.status == 413 && jstr(j, "error.message") && strstr(jstr(j, "error.message"), "limit"),
          "413: %d %s", r.status, r.body);
    cJSON_Delete(j);
    resp_free(&r);
}

static void test_http_413_chunked(void) {
    /* no Content-Length: the cap is found while reading; the 413 still comes */
    pt_sbuf q = {0};
    pt_sbuf_adds(&q, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n");
    char *chunk = malloc(65536);
    memset(chunk, 'a', 65536);
    for (int i = 0; i < 24; i++) { /* 1.5 MiB against a 1 MiB cap */
        pt_sbuf_adds(&q, "10000\r\n");
        pt_sbuf_add(&q, chunk, 65536);
        pt_sbuf_adds(&q, "\r\n");
    }
    pt_sbuf_adds(&q, "0\r\n\r\n");
    free(chunk);
    resp r;
    REQUIRE(raw(g_port, q.data, q.len, &r) == 0, "response");
    pt_sbuf_free(&q);
    CHECK(r.status == 413 && strstr(r.body, "limit"), "chunked 413: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
}

static void test_http_bad_requests(void) {
    struct {
        const char *body, *want;
    } cases[] = {
        {"{\"messages\": [", "not valid JSON"},
        {"[1,2]", "expected a JSON object"},
        {"", "empty"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":\"hot\"}", "'temperature'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1.5}", "'max_tokens'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_p\":7}", "'top_p'"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", "role"},
        {"{\"messages\":[]}", "'messages'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[1]}", "'stop[0]'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":3}", "n = 1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"a\":1,\"a\":2}", "duplicate"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":"
         "\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\",\"pattern\":\"x\"}}}}",
         "pattern"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", "UTF-8"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", "UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        resp r;
        http("POST", "/v1/chat/completions", cases[i].body, NULL, &r);
        cJSON *j = json_body(&r);
        const char *msg = jstr(j, "error.message");
        CHECK(r.status == 400 && msg && strstr(msg, cases[i].want) &&
                  jstr(j, "error.type") && !strcmp(jstr(j, "error.type"), "invalid_request_error"),
              "case %zu: %d %s", i, r.status, r.body);
        cJSON_Delete(j);
        resp_free(&r);
    }
    /* a prompt longer than the context */
    char *big = malloc(3000);
    memset(big, 'a', 2999);
    big[2999] = 0;
    char *b = chat_body(big, NULL);
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    CHECK(r.status == 400 && strstr(r.body, "context"), "long prompt: %d %s", r.status, r.body);
    resp_free(&r);
    free(b);
    free(big);
    /* the server still answers */
    http("GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "still serving");
    resp_free(&r);
}

/* -------------------------------------------------- concurrency & load */

typedef struct stream_client {
    int port, disconnect_after, max_tokens;
    int status, got_done, ok;
    char retry_after;
} stream_client;

static void *stream_worker(void *arg) {
    stream_client *c = arg;
    char body[256], req[600];
    snprintf(body, sizeof body,
             "{\"stream\":true,\"max_tokens\":%d,\"messages\":[{\"role\":\"user\",\"content\":\"SLOW LOOP:xy\"}]}",
             c->max_tokens);
    snprintf(req, sizeof req,
             "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    int fd = dial(c->port);
    if (fd < 0) return NULL;
    send_all(fd, req, strlen(req));
    pt_sbuf b = {0};
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
        pt_sbuf_add(&b, buf, (size_t)n);
        if (c->disconnect_after && b.len >= (size_t)c->disconnect_after) break;
    }
    close(fd);
    if (b.data) {
        sscanf(b.data, "HTTP/1.%*d %d", &c->status);
        const char *end = b.len >= 14 ? b.data + b.len - 14 : b.data;
        c->got_done = strstr(end, "data: [DONE]") != NULL;
        c->retry_after = strstr(b.data, "Retry-After: 1") != NULL;
        if (c->disconnect_after) c->ok = 1; /* we left; nothing to assert on the body */
        else if (c->status == 200) c->ok = c->got_done;
        else if (c->status == 429) c->ok = c->retry_after && strstr(b.data, "\"error\"") != NULL;
    }
    pt_sbuf_free(&b);
    return NULL;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

static int metric_at(int port, const char *name) {
    resp r;
    int saved = g_port;
    g_port = port;
    http("GET", "/metrics", NULL, NULL, &r);
    g_port = saved;
    const int v = (int)metric_value(r.body, name);
    resp_free(&r);
    return v;
}

static int metric(const char *name) { return metric_at(g_port, name); }

static void test_server_queue_429_and_disconnect(void) {
    /* a second server with one slot and a queue of one */
    pt_server_params p = pt_server_default_params();
    p.port = 0;
    p.n_parallel = 1;
    p.max_queue = 1;
    pt_server *s2;
    REQUIRE(pt_server_start(&g_engine, &p, &s2) == PT_OK, "start: %s", pt_last_error());
    int port = pt_server_port(s2);
    stream_client c[3] = {{port, 40000, 2000, 0, 0, 0, 0}, {port, 0, 20, 0, 0, 0, 0}, {port, 0, 20, 0, 0, 0, 0}};
    pthread_t t[3];
    pthread_create(&t[0], NULL, stream_worker, &c[0]); /* occupies the slot, then disconnects */
    usleep(100000);
    pthread_create(&t[1], NULL, stream_worker, &c[1]); /* waits in the queue */
    usleep(100000);
    pthread_create(&t[2], NULL, stream_worker, &c[2]); /* queue full: 429 */
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    CHECK(c[2].status == 429 && c[2].ok, "third: %d (Retry-After %d)", c[2].status, c[2].retry_after);
    /* the first client left after ~40 kB, long before its 2000 tokens: its
     * job is cancelled, which frees the slot for the queued one */
    CHECK(c[1].status == 200 && c[1].ok, "queued one completed after the disconnect: %d", c[1].status);
    CHECK(metric_at(port, "petrel_requests_cancelled_total") == 1, "one cancellation counted");
    CHECK(metric_at(port, "petrel_requests_rejected_total") == 1, "one 429 counted");
    pt_server_stop(&s2);
}

#define N_LOAD 48

static void test_server_load_streams(void) {
    long rss0 = -1;
    int n_ok = 0, n_429 = 0, n_left = 0;
    for (int round = 0; round < 3; round++) {
        stream_client c[N_LOAD];
        pthread_t t[N_LOAD];
        unsigned seed = 1234u + (unsigned)round;
        for (int i = 0; i < N_LOAD; i++) {
            seed = seed * 1103515245u + 12345u;
            c[i] = (stream_client){g_port, (seed >> 16) % 3 == 0 ? 200 + (int)((seed >> 8) % 500) : 0,
                                   5 + (int)((seed >> 4) % 30), 0, 0, 0, 0};
            pthread_create(&t[i], NULL, stream_worker, &c[i]);
        }
        for (int i = 0; i < N_LOAD; i++) {
            pthread_join(t[i], NULL);
            CHECK(c[i].ok, "round %d client %d: status %d done %d", round, i, c[i].status, c[i].got_done);
            if (c[i].disconnect_after) n_left++;
            else if (c[i].status == 200) n_ok++;
            else n_429++;
        }
        if (round == 0) rss0 = rss_kb();
    }
    /* every slot comes back */
    int busy = -1;
    for (int k = 0; k < 100 && busy != 0; k++) {
        busy = metric("petrel_slots_busy");
        if (busy) usleep(20000);
    }
    long rss1 = rss_kb();
    CHECK(busy == 0, "slots still busy: %d", busy);
    CHECK(rss1 - rss0 < 64 * 1024, "memory grew by %ld kB over two rounds", rss1 - rss0);
    printf("INFO load: %d streams completed, %d refused with 429, %d disconnected early; RSS %ld -> %ld kB\n",
           n_ok, n_429, n_left, rss0, rss1);
    resp r;
    http("GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "healthy after load");
    resp_free(&r);
}

static void test_http_stalled_clients(void) {
    /* one client stalls mid-body, another never reads its stream */
    int stall = dial(g_port);
    const char *part = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"mess";
    send_all(stall, part, strlen(part));
    int deaf = dial(g_port);
    const char *body = "{\"stream\":true,\"max_tokens\":300,\"messages\":[{\"role\":\"user\",\"content\":\"LOOP:zzzz\"}]}";
    char req[512];
    snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.0\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    send_all(deaf, req, strlen(req));
    char *b = chat_body("SAY:not blocked", NULL);
    resp r;
    http("POST", "/v1/chat/completions", b, NULL, &r);
    free(b);
    CHECK(r.status == 200 && strstr(r.body, "not blocked"), "served beside stalled clients: %d", r.status);
    resp_free(&r);
    close(stall);
    close(deaf);
}

static void test_server_api_key(void) {
    pt_server_params p = pt_server_default_params();
    p.port = 0;
    p.api_key = "sekret";
    pt_server *s2;
    REQUIRE(pt_server_start(&g_engine, &p, &s2) == PT_OK, "start");
    int saved = g_port;
    g_port = pt_server_port(s2);
    resp r;
    http("GET", "/v1/models", NULL, NULL, &r);
    CHECK(r.status == 401 && strstr(r.body, "API key"), "no key: %d", r.status);
    resp_free(&r);
    http("GET", "/v1/models", NULL, "Authorization: Bearer wrong\r\n", &r);
    CHECK(r.status == 401, "wrong key: %d", r.status);
    resp_free(&r);
    http("GET", "/v1/models", NULL, "Authorization: Bearer sekret\r\n", &r);
    CHECK(r.status == 200, "right key: %d", r.status);
    resp_free(&r);
    http("GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "health is open: %d", r.status);
    resp_free(&r);
    g_port = saved;
    pt_server_stop(&s2);
}

static void test_server_curl(void) {
    if (system("command -v curl >/dev/null 2>&1") != 0) TEST_SKIP("curl not installed");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "curl -sN --max-time 10 http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
             "-d '{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"SAY:curl ok\"}]}'",
             g_port);
    FILE *f = popen(cmd, "r");
    REQUIRE(f, "popen");
    pt_sbuf b = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) pt_sbuf_add(&b, buf, n);
    pclose(f);
    pt_sbuf content = {0};
    char finish[32] = "";
    int done_last = 0, n_ev = 0;
    CHECK(b.data && sse_collect(b.data, &content, finish, sizeof finish, &done_last, &n_ev, NULL) &&
              content.data && !strcmp(content.data, "curl ok") && done_last,
          "curl SSE (HTTP/1.1 chunked): %s", b.data ? b.data : "");
    pt_sbuf_free(&content);
    pt_sbuf_free(&b);
    snprintf(cmd, sizeof cmd,
             "curl -s -o /dev/null -w '%%{http_code}' --max-time 10 http://127.0.0.1:%d/v1/chat/completions "
             "-H 'Content-Type: application/json' --data-binary '{\"messages\": oops}'",
             g_port);
    f = popen(cmd, "r");
    char code[8] = "";
    if (f) {
        if (!fgets(code, sizeof code, f)) code[0] = 0;
        pclose(f);
    }
    CHECK(!strcmp(code, "400"), "curl malformed: %s", code);
}

int main(void) {
    if (srv_start()) return 1;
    TEST_RUN(test_http_routes);
    TEST_RUN(test_http_413_before_body);
    TEST_RUN(test_http_413_chunked);
    TEST_RUN(test_http_bad_requests);
    TEST_RUN(test_http_stalled_clients);
    TEST_RUN(test_server_api_key);
    TEST_RUN(test_server_queue_429_and_disconnect);
    TEST_RUN(test_server_load_streams);
    TEST_RUN(test_server_curl);
    pt_server_stop(&g_srv);
    return test_summary();
}
