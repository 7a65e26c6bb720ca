/* HTTP layer over libmicrohttpd (see http.h).
 *
 * Mode: MHD_USE_THREAD_PER_CONNECTION, so a handler and a stream producer may
 * block (a non-streaming completion waits for its generation; an SSE producer
 * waits for the next token) without holding up other connections, and a slow
 * or stalled client only ever occupies its own thread until the connection
 * timeout drops it.
 *
 * Request flow inside the access callback (called several times per request):
 *   1st call   route, method, API key and Content-Length are checked; any
 *              failure queues the error response at once, so an oversized
 *              body is refused (413) before a byte of it is read.
 *   next calls the body arrives in pieces and is appended, capped.
 *   last call  (upload size 0) the route handler runs and its response is queued.
 */
#include "server/http.h"

#include "base/error.h"
#include "base/log.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

struct pt_http_server {
    struct MHD_Daemon *daemon;
    const pt_http_route *routes;
    int n_routes;
    void *user;
    char *api_key;
    size_t max_body;
    int port;
    void (*on_status)(void *user, int status);
};

/* Per-request state, created on the first access call, freed on completion. */
typedef struct conn_ctx {
    const pt_http_route *route;
    pt_sbuf body;
    int refused; /* an error response was queued early: ignore the body */
    int too_big; /* a body without Content-Length passed the cap */
} conn_ctx;

/* ---------------------------------------------------------------- errors */

void pt_http_error_json(pt_sbuf *out, int anthropic, const char *type, const char *message) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_CreateObject();
    if (anthropic) {
        cJSON_AddStringToObject(root, "type", "error");
        cJSON_AddStringToObject(err, "type", type);
        cJSON_AddStringToObject(err, "message", message);
        cJSON_AddItemToObject(root, "error", err);
    } else {
        cJSON_AddStringToObject(err, "message", message);
        cJSON_AddStringToObject(err, "type", type);
        cJSON_AddNullToObject(err, "param");
        cJSON_AddNullToObject(err, "code");
        cJSON_AddItemToObject(root, "error", err);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (s) pt_sbuf_adds(out, s);
    else pt_sbuf_adds(out, "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    free(s);
}

void pt_http_error(pt_http_response *resp, const char *path, int status, const char *type,
                   const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    resp->status = status;
    resp->content_type = "application/json";
    resp->body.len = 0;
    int anthropic = path && strncmp(path, "/v1/messages", 12) == 0;
    pt_http_error_json(&resp->body, anthropic, type, msg);
}

void pt_http_json(pt_http_response *resp, int status, char *json) {
    resp->status = status;
    resp->content_type = "application/json";
    resp->body.len = 0;
    if (json) pt_sbuf_adds(&resp->body, json);
    else pt_http_error(resp, "", 500, "server_error", "out of memory building the response");
    free(json);
}

/* --------------------------------------------------------------- helpers */

const char *pt_http_header(const pt_http_request *req, const char *name) {
    return MHD_lookup_connection_value((struct MHD_Connection *)req->mhd_conn, MHD_HEADER_KIND,
                                       name);
}

int pt_http_peer_closed(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int r = poll(&p, 1, 0);
    if (r < 0) return 0;
    return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* Constant-time comparison of the presented key with the configured one. */
static int key_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}

static int authorized(const pt_http_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return 1;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        const char *k = auth + 7;
        while (*k == ' ') k++;
        return key_equal(k, s->api_key);
    }
    /* Anthropic clients send the key as x-api-key. */
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && key_equal(x, s->api_key);
}

/* ------------------------------------------------------------- responses */

typedef struct stream_wrap {
    pt_http_stream_fn fn;
    void *ctx;
    void (*free_fn)(void *);
} stream_wrap;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_wrap *w = cls;
    ssize_t n = w->fn(w->ctx, buf, max);
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void stream_free(void *cls) {
    stream_wrap *w = cls;
    if (w->free_fn) w->free_fn(w->ctx);
    free(w);
}

static enum MHD_Result queue(pt_http_server *s, struct MHD_Connection *c, pt_http_response *r) {
    struct MHD_Response *mr;
    int status = r->status ? r->status : 500;
    if (s->on_status) s->on_status(s->user, status);
    if (r->stream) {
        stream_wrap *w = malloc(sizeof *w);
        if (!w) {
            if (r->stream_free) r->stream_free(r->stream_ctx);
            return MHD_NO;
        }
        *w = (stream_wrap){r->stream, r->stream_ctx, r->stream_free};
        mr = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, w,
                                               stream_free);
        if (!mr) {
            stream_free(w);
            return MHD_NO;
        }
        MHD_add_response_header(mr, "Cache-Control", "no-cache");
        MHD_add_response_header(mr, "X-Accel-Buffering", "no");
    } else {
        if (r->body.oom) {
            pt_sbuf_free(&r->body);
            pt_http_error(r, "", 500, "server_error", "out of memory building the response");
            status = 500;
        }
        mr = MHD_create_response_from_buffer(r->body.len, r->body.data ? r->body.data : (char *)"",
                                             MHD_RESPMEM_MUST_COPY);
        if (!mr) return MHD_NO;
    }
    MHD_add_response_header(mr, "Content-Type",
                            r->content_type ? r->content_type : "application/json");
    if (r->header_name[0]) MHD_add_response_header(mr, r->header_name, r->header_value);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, mr);
    MHD_destroy_response(mr);
    return ok;
}

static enum MHD_Result queue_error(pt_http_server *s, struct MHD_Connection *c, const char *path, int status,
                                   const char *type, const char *msg, const char *hname,
                                   const char *hval) {
    pt_http_response r = {0};
    pt_http_error(&r, path, status, type, "%s", msg);
    if (hname) {
        snprintf(r.header_name, sizeof r.header_name, "%s", hname);
        snprintf(r.header_value, sizeof r.header_value, "%s", hval);
    }
    enum MHD_Result ok = queue(s, c, &r);
    pt_sbuf_free(&r.body);
    return ok;
}

/* ---------------------------------------------------------------- access */

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    pt_http_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        const pt_http_route *path_match = NULL;
        for (int i = 0; i < s->n_routes; i++) {
            if (strcmp(s->routes[i].path, url) != 0) continue;
            path_match = &s->routes[i];
            if (strcmp(s->routes[i].method, method) == 0) {
                cc->route = &s->routes[i];
                break;
            }
        }
        if (!cc->route) {
            cc->refused = 1;
            if (!path_match) {
                char msg[600];
                snprintf(msg, sizeof msg, "no route for %s %.500s (GET /v1 lists the endpoints)",
                         method, url);
                return queue_error(s, c, url, 404, "not_found_error", msg, NULL, NULL);
            }
            char allow[64] = "", msg[600];
            for (int i = 0; i < s->n_routes; i++)
                if (strcmp(s->routes[i].path, url) == 0 && strlen(allow) + 8 < sizeof allow) {
                    if (allow[0]) strcat(allow, ", ");
                    strcat(allow, s->routes[i].method);
                }
            snprintf(msg, sizeof msg, "method %s is not allowed on %.400s (allowed: %s)", method,
                     url, allow);
            return queue_error(s, c, url, 405, "invalid_request_error", msg, "Allow", allow);
        }
        if (!cc->route->no_auth && !authorized(s, c)) {
            cc->refused = 1;
            return queue_error(s, c, url, 401, "authentication_error",
                               "invalid or missing API key: send 'Authorization: Bearer <key>'",
                               "WWW-Authenticate", "Bearer");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (end == cl || *end != 0 || n > s->max_body) {
                cc->refused = 1;
                char msg[200];
                snprintf(msg, sizeof msg, "request body of %.30s bytes exceeds the limit of %zu bytes",
                         cl, s->max_body);
                return queue_error(s, c, url, 413, "invalid_request_error", msg, NULL, NULL);
            }
        }
        return MHD_YES;
    }
    if (cc->refused) {
        *upload_size = 0; /* discard; the error response is already queued */
        return MHD_YES;
    }
    if (cc->too_big) {
        /* A chunked upload (no Content-Length) grew past the cap: the rest is
         * discarded and the 413 goes out once the upload ends — libmicrohttpd
         * does not send a response queued in the middle of an upload. */
        if (*upload_size) {
            *upload_size = 0;
            return MHD_YES;
        }
        char msg[120];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", s->max_body);
        cc->refused = 1;
        return queue_error(s, c, url, 413, "invalid_request_error", msg, NULL, NULL);
    }
    if (*upload_size) {
        if (cc->body.len + *upload_size > s->max_body) {
            cc->too_big = 1;
            pt_sbuf_free(&cc->body);
            *upload_size = 0;
            return MHD_YES;
        }
        pt_sbuf_add(&cc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->body.oom) return queue_error(s, c, url, 500, "server_error", "out of memory", NULL, NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pt_http_request req = {
        .method = method,
        .path = url,
        .body = cc->body.data ? cc->body.data : "",
        .body_len = cc->body.len,
        .fd = ci ? ci->connect_fd : -1,
        .mhd_conn = c,
    };
    pt_http_response resp = {0};
    cc->route->fn(s->user, &req, &resp);
    enum MHD_Result ok = queue(s, c, &resp);
    pt_sbuf_free(&resp.body);
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    pt_sbuf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    PT_LOGD("http: %s", msg);
}

/* ---------------------------------------------------------------- daemon */

pt_status pt_http_start(const pt_http_config *cfg, const pt_http_route *routes, int n_routes,
                        void *user, pt_http_server **out) {
    *out = NULL;
    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    if (cfg->port < 0 || cfg->port > 65535)
        return pt_error(PT_ERR_INVALID_ARG, "port %d is outside 0..65535", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || !ai)
        return pt_error(PT_ERR_INVALID_ARG, "cannot resolve host '%s': %s", host, gai_strerror(gai));

    pt_http_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    s->routes = routes;
    s->n_routes = n_routes;
    s->user = user;
    s->max_body = cfg->max_body ? cfg->max_body : (size_t)16 << 20;
    s->on_status = cfg->on_status;
    if (cfg->api_key && *cfg->api_key) s->api_key = strdup(cfg->api_key);

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_access, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(cfg->max_connections > 0 ? cfg->max_connections : 256),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(cfg->timeout_s > 0 ? cfg->timeout_s : 600),
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        free(s->api_key);
        free(s);
        return pt_error(PT_ERR_IO, "cannot listen on %s:%d (address in use or not available)",
                        host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return PT_OK;
}

int pt_http_port(const pt_http_server *s) { return s ? s->port : 0; }

void pt_http_stop(pt_http_server **ps) {
    pt_http_server *s = *ps;
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    free(s->api_key);
    free(s);
    *ps = NULL;
}
