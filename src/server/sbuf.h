/* A growable byte buffer for building responses and SSE frames. Header-only:
 * a handful of small inline helpers, not a general string library. An append
 * that cannot allocate sets the sticky `oom` flag instead of failing loudly;
 * the owner checks it once when the buffer is used. */
#ifndef PT_SERVER_SBUF_H
#define PT_SERVER_SBUF_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pt_sbuf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
    int oom;    /* set when an append could not allocate; the buffer is then truncated */
} pt_sbuf;

static inline int pt_sbuf_reserve(pt_sbuf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = (char *)realloc(b->data, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

static inline void pt_sbuf_add(pt_sbuf *b, const char *s, size_t n) {
    if (!pt_sbuf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static inline void pt_sbuf_adds(pt_sbuf *b, const char *s) { pt_sbuf_add(b, s, strlen(s)); }

static inline void pt_sbuf_printf(pt_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void pt_sbuf_printf(pt_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        pt_sbuf_add(b, tmp, (size_t)n);
        return;
    }
    if (!pt_sbuf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Drops the first n bytes. */
static inline void pt_sbuf_consume(pt_sbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        if (b->data) b->data[0] = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

static inline void pt_sbuf_free(pt_sbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

#endif
