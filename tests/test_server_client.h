/* What the server tests (tests/test_server*.c) share: the main server over
 * the deterministic test model (test_server_engine.h) and its port, and a
 * raw loopback HTTP/1.0 client (send bytes, read to EOF, split head and
 * body), with helpers to read JSON bodies by dotted path and to check and
 * collect OpenAI SSE streams. Header-only: each test binary includes it
 * once. Not the tests themselves. */
#ifndef TEST_SERVER_CLIENT_H
#define TEST_SERVER_CLIENT_H

#include "test.h"

#include "base/json.h"
#include "base/log.h"
#include "server/server.h"
#include "test_server_engine.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static tm_model g_model = {.max_ctx = 2048};
static pt_srv_engine g_engine;
static pt_server *g_srv;
static int g_port;

/* ----------------------------------------------------------- raw client */

typedef struct resp {
    int status;
    char *head; /* status line + headers */
    char *body;
    size_t body_len;
} resp;

static inline void resp_free(resp *r) {
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static inline int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline void send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* Sends raw bytes, reads to EOF (HTTP/1.0: the server closes). */
static inline int raw(int port, const char *req, size_t len, resp *r) {
    memset(r, 0, sizeof *r);
    int fd = dial(port);
    if (fd < 0) return -1;
    send_all(fd, req, len);
    pt_sbuf b = {0};
    char buf[8192];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) pt_sbuf_add(&b, buf, (size_t)n);
    close(fd);
    if (!b.data) return -1;
    char *sep = strstr(b.data, "\r\n\r\n");
    if (!sep) {
        pt_sbuf_free(&b);
        return -1;
    }
    *sep = 0;
    r->head = strdup(b.data);
    r->body_len = b.len - (size_t)(sep + 4 - b.data);
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, sep + 4, r->body_len);
    r->body[r->body_len] = 0;
    sscanf(r->head, "HTTP/1.%*d %d", &r->status);
    pt_sbuf_free(&b);
    return 0;
}

static inline int http(const char *method, const char *path, const char *body, const char *extra,
                       resp *r) {
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    snprintf(head, sizeof head, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             method, path, extra ? extra : "", bl);
    pt_sbuf q = {0};
    pt_sbuf_adds(&q, head);
    if (body) pt_sbuf_add(&q, body, bl);
    int rc = raw(g_port, q.data, q.len, r);
    pt_sbuf_free(&q);
    return rc;
}

static inline cJSON *json_body(const resp *r) { return r->body ? cJSON_Parse(r->body) : NULL; }

/* The item at a dotted path with numeric indices ("choices.0.message.content"), or NULL. */
static inline const cJSON *jpath(const cJSON *root, const char *path) {
    const cJSON *cur = root;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        if (*tok >= '0' && *tok <= '9') cur = cJSON_GetArrayItem(cur, atoi(tok));
        else cur = cJSON_GetObjectItem(cur, tok);
    }
    return cur;
}

static inline const char *jstr(const cJSON *root, const char *path) {
    const cJSON *cur = jpath(root, path);
    return cJSON_IsString(cur) ? cur->valuestring : NULL;
}

static inline double jnum(const cJSON *root, const char *path) {
    const cJSON *cur = jpath(root, path);
    return cJSON_IsNumber(cur) ? cur->valuedouble : -1;
}

/* A sample of a /metrics body: the value after "\nNAME " (the sample line,
 * not # HELP / # TYPE; NAME may carry labels), or -1 when absent. */
static inline double metric_value(const char *text, const char *name) {
    char pat[160];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = text ? strstr(text, pat) : NULL;
    return p ? strtod(p + strlen(pat), NULL) : -1.0;
}

static inline char *chat_body(const char *user, const char *extra_fields) {
    cJSON *u = cJSON_CreateString(user);
    char *us = cJSON_PrintUnformatted(u);
    cJSON_Delete(u);
    char *b = malloc(strlen(us) + (extra_fields ? strlen(extra_fields) : 0) + 200);
    sprintf(b, "{\"model\":\"anything\",\"messages\":[{\"role\":\"user\",\"content\":%s}]%s%s}", us,
            extra_fields ? "," : "", extra_fields ? extra_fields : "");
    free(us);
    return b;
}

/* Concatenates delta.content of every OpenAI SSE chunk; checks framing. */
static inline int sse_collect(const char *body, pt_sbuf *content, char *finish, size_t fn, int *done_last,
                              int *n_events, cJSON **last_usage) {
    *done_last = 0;
    *n_events = 0;
    const char *p = body;
    int ok = 1;
    while (*p) {
        const char *e = strstr(p, "\n\n");
        if (!e) {
            ok = 0;
            break;
        }
        if (strncmp(p, "data: ", 6) != 0) {
            ok = 0;
            break;
        }
        (*n_events)++;
        *done_last = 0;
        if (!strncmp(p + 6, "[DONE]", 6)) {
            *done_last = 1;
        } else {
            cJSON *j = cJSON_ParseWithLength(p + 6, (size_t)(e - p - 6));
            if (!j) ok = 0;
            const char *c = jstr(j, "choices.0.delta.content");
            if (!c) c = jstr(j, "choices.0.text");
            if (c) pt_sbuf_adds(content, c);
            const char *f = jstr(j, "choices.0.finish_reason");
            if (f) snprintf(finish, fn, "%s", f);
            if (cJSON_GetObjectItem(j, "usage") && last_usage) {
                cJSON_Delete(*last_usage);
                *last_usage = cJSON_Duplicate(cJSON_GetObjectItem(j, "usage"), 1);
            }
            if (cJSON_GetObjectItem(j, "error")) snprintf(finish, fn, "ERROR");
            cJSON_Delete(j);
        }
        p = e + 2;
    }
    return ok;
}

/* ------------------------------------------------------------ the server */

/* Starts the main server (4 slots, a queue of 16, a 1 MiB body cap) on a
 * free loopback port for the tests of one binary; prints a FAIL line and
 * returns 1 when it cannot start. pt_server_stop(&g_srv) ends it. */
static inline int srv_start(void) {
    signal(SIGPIPE, SIG_IGN);
    pt_log_set_level(PT_LOG_ERROR);
    tm_engine(&g_engine, &g_model);
    pt_server_params p = pt_server_default_params();
    p.port = 0;
    p.n_parallel = 4;
    p.max_queue = 16;
    p.max_body = 1 << 20;
    if (pt_server_start(&g_engine, &p, &g_srv) != PT_OK) {
        printf("FAIL server_start: %s\n", pt_last_error());
        return 1;
    }
    g_port = pt_server_port(g_srv);
    return 0;
}

#endif
