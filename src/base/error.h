/* Error reporting: a thread-local message behind pt_last_error(), and
 * PT_ASSERT for internal invariants. Library code never exits or prints to
 * stdout; it returns a pt_status and leaves a message here. */
#ifndef PT_BASE_ERROR_H
#define PT_BASE_ERROR_H

#include "petrel.h"
#include <stdio.h>
#include <stdlib.h>

/* Sets the thread's error message (printf-style) and returns `status`,
 * so callers can write `return pt_error(PT_ERR_FORMAT, "...", ...)`. */
pt_status pt_error(pt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the current message (adds context while unwinding). */
pt_status pt_error_prefix(pt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void pt_clear_error(void);

#define PT_ASSERT(cond)                                                                   \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "petrel: internal assertion failed at %s:%d: %s\n", __FILE__, \
                    __LINE__, #cond);                                                     \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* Propagate a non-OK status. */
#define PT_TRY(expr)                         \
    do {                                     \
        pt_status pt_try_s_ = (expr);        \
        if (pt_try_s_ != PT_OK) return pt_try_s_; \
    } while (0)

#endif
