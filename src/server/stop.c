/* Stop-string matching with hold-back (see stop.h). */
#include "server/stop.h"

#include <stdlib.h>
#include <string.h>

int pt_stop_init(pt_stop *s, const char *const *stops, int n) {
    memset(s, 0, sizeof *s);
    s->matched = -1;
    if (n <= 0) return 1;
    s->stops = calloc((size_t)n, sizeof(char *));
    if (!s->stops) return 0;
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        if (!(s->stops[s->n] = strdup(stops[i]))) return 0;
        s->n++;
    }
    return 1;
}

void pt_stop_free(pt_stop *s) {
    for (int i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->stops);
    pt_sbuf_free(&s->pending);
    memset(s, 0, sizeof *s);
    s->matched = -1;
}

int pt_stop_feed(pt_stop *s, const char *text, size_t len, pt_sbuf *out) {
    if (s->matched >= 0) return 1;
    if (s->n == 0) {
        pt_sbuf_add(out, text, len);
        return 0;
    }
    pt_sbuf_add(&s->pending, text, len);
    const char *p = s->pending.data ? s->pending.data : "";
    size_t n = s->pending.len;
    /* earliest complete occurrence of any stop string */
    size_t best = (size_t)-1;
    for (int i = 0; i < s->n; i++) {
        size_t sl = strlen(s->stops[i]);
        const char *hit = sl <= n ? memmem(p, n, s->stops[i], sl) : NULL;
        if (hit && (size_t)(hit - p) < best) {
            best = (size_t)(hit - p);
            s->matched = i;
        }
    }
    if (s->matched >= 0) {
        pt_sbuf_add(out, p, best);
        s->pending.len = 0;
        return 1;
    }
    /* hold back the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t k = sl - 1 < n ? sl - 1 : n; k > hold; k--)
            if (memcmp(p + n - k, s->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    pt_sbuf_add(out, p, n - hold);
    pt_sbuf_consume(&s->pending, n - hold);
    return 0;
}

void pt_stop_flush(pt_stop *s, pt_sbuf *out) {
    if (s->matched < 0 && s->pending.len) pt_sbuf_add(out, s->pending.data, s->pending.len);
    s->pending.len = 0;
}
