/* Thread-local error messages (see error.h). */
#include "base/error.h"

#include <stdarg.h>
#include <string.h>

#define PT_ERRBUF 2048
static _Thread_local char g_err[PT_ERRBUF];

pt_status pt_error(pt_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return status;
}

pt_status pt_error_prefix(pt_status status, const char *fmt, ...) {
    char prefix[PT_ERRBUF], old[PT_ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_err, sizeof old);
    size_t a = strnlen(prefix, sizeof g_err - 3);
    memcpy(g_err, prefix, a);
    g_err[a] = ':';
    g_err[a + 1] = ' ';
    size_t rest = sizeof g_err - a - 3;
    size_t b = strnlen(old, rest);
    memcpy(g_err + a + 2, old, b);
    g_err[a + 2 + b] = 0;
    return status;
}

void pt_clear_error(void) { g_err[0] = 0; }

const char *pt_last_error(void) { return g_err; }

const char *pt_status_name(pt_status s) {
    switch (s) {
    case PT_OK: return "PT_OK";
    case PT_ERR_INVALID_ARG: return "PT_ERR_INVALID_ARG";
    case PT_ERR_IO: return "PT_ERR_IO";
    case PT_ERR_FORMAT: return "PT_ERR_FORMAT";
    case PT_ERR_UNSUPPORTED: return "PT_ERR_UNSUPPORTED";
    case PT_ERR_NOMEM: return "PT_ERR_NOMEM";
    case PT_ERR_RANGE: return "PT_ERR_RANGE";
    case PT_ERR_NOT_FOUND: return "PT_ERR_NOT_FOUND";
    case PT_ERR_INTERNAL: return "PT_ERR_INTERNAL";
    case PT_ERR_CANCELLED: return "PT_ERR_CANCELLED";
    case PT_ERR_DEVICE: return "PT_ERR_DEVICE";
    }
    return "PT_ERR_UNKNOWN";
}

const char *pt_version(void) { return PT_VERSION_STRING; }
