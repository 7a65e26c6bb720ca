/* Stop strings matched on decoded text, with hold-back for streaming.
 *
 * Text arrives in pieces (one token's worth at a time). Whatever could still
 * be the beginning of a stop string is held back until it is decided, so a
 * stream never shows the client part of a stop string; when a stop string
 * appears, the text before it is released and the rest is dropped.
 */
#ifndef PT_SERVER_STOP_H
#define PT_SERVER_STOP_H

#include "server/sbuf.h"

typedef struct pt_stop {
    char **stops; /* [n] NUL-terminated, non-empty; owned */
    int n;
    pt_sbuf pending; /* decoded text not yet released */
    int matched;     /* index of the stop string that matched, or -1 */
} pt_stop;

/* Copies the stop strings (empty ones are ignored). Returns 0 on allocation failure. */
int pt_stop_init(pt_stop *s, const char *const *stops, int n);
void pt_stop_free(pt_stop *s);
/* Adds decoded text; appends what is now safe to release to `out`. Returns 1
 * when a stop string matched (generation should end; nothing more is released). */
int pt_stop_feed(pt_stop *s, const char *text, size_t len, pt_sbuf *out);
/* At the end of generation: releases whatever is still held back. */
void pt_stop_flush(pt_stop *s, pt_sbuf *out);

#endif
