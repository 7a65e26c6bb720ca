/* The HTTP layer of `petrel serve`: a libmicrohttpd daemon with one thread per
 * connection, a route table (exact paths; 404 for an unknown path, 405 with
 * Allow for a known path and a wrong method), bearer-token authentication,
 * request bodies buffered up to a cap (413 decided from Content-Length before
 * the body is read), and responses that are either a complete buffer or a
 * stream produced by a blocking callback (SSE).
 *
 * It knows nothing about models or the OpenAI API beyond the shape of an
 * error body; routes are supplied by server.c.
 */
#ifndef PT_SERVER_HTTP_H
#define PT_SERVER_HTTP_H

#include "petrel.h"
#include "server/sbuf.h"

#include <stddef.h>
#include <sys/types.h>

typedef struct pt_http_server pt_http_server;

typedef struct pt_http_request {
    const char *method;
    const char *path;
    const char *body; /* NUL-terminated copy; body_len bytes (may contain NULs) */
    size_t body_len;
    int fd;           /* the client socket, for pt_http_peer_closed() */
    void *mhd_conn;   /* struct MHD_Connection*, for pt_http_header() */
} pt_http_request;

/* A stream producer: writes up to `max` bytes into buf and returns the count,
 * 0 when the stream is complete, or -1 to abort the connection. It may block
 * (each connection has its own thread). */
typedef ssize_t (*pt_http_stream_fn)(void *ctx, char *buf, size_t max);

typedef struct pt_http_response {
    int status;                /* HTTP status; 0 = not set (500) */
    const char *content_type;  /* default application/json */
    pt_sbuf body;
    char header_name[32], header_value[96]; /* one extra header (Retry-After, Allow) */
    /* Streaming: when stream is set the body is produced by stream(stream_ctx),
     * and stream_free(stream_ctx) is called when the connection is done with
     * it (completed or disconnected). */
    pt_http_stream_fn stream;
    void *stream_ctx;
    void (*stream_free)(void *ctx);
} pt_http_response;

typedef void (*pt_http_handler)(void *user, const pt_http_request *req, pt_http_response *resp);

typedef struct pt_http_route {
    const char *method; /* "GET", "POST" */
    const char *path;   /* exact match */
    pt_http_handler fn;
    int no_auth;        /* served without the API key (/health) */
} pt_http_route;

typedef struct pt_http_config {
    const char *host; /* bind address; default 127.0.0.1 */
    int port;         /* 0 = an ephemeral port (see pt_http_port) */
    const char *api_key; /* NULL = no authentication */
    size_t max_body;  /* bytes; larger bodies get 413 */
    int max_connections;
    int timeout_s;    /* idle connection timeout (a stalled client is dropped) */
    void (*on_status)(void *user, int status); /* called for every response queued */
} pt_http_config;

pt_status pt_http_start(const pt_http_config *cfg, const pt_http_route *routes, int n_routes,
                        void *user, pt_http_server **out);
int pt_http_port(const pt_http_server *s);
void pt_http_stop(pt_http_server **s);

/* A request header (case-insensitive name), or NULL. */
const char *pt_http_header(const pt_http_request *req, const char *name);
/* 1 when the client has closed its side or the socket failed. */
int pt_http_peer_closed(int fd);

/* Error response in the API flavour of the path: OpenAI's
 * {"error":{"message","type","param","code"}} or, under /v1/messages,
 * Anthropic's {"type":"error","error":{"type","message"}}. */
void pt_http_error(pt_http_response *resp, const char *path, int status, const char *type,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The error JSON alone (for SSE error events); anthropic selects the shape. */
void pt_http_error_json(pt_sbuf *out, int anthropic, const char *type, const char *message);

/* Sets a JSON body from a cJSON-printed string (takes ownership of `json`). */
void pt_http_json(pt_http_response *resp, int status, char *json);

#endif
