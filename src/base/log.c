/* stderr logging (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

static int level_from_env(void) {
    const char *e = getenv("PETREL_LOG");
    if (!e || !*e) return PT_LOG_WARN;
    if (!strcmp(e, "error")) return PT_LOG_ERROR;
    if (!strcmp(e, "warn")) return PT_LOG_WARN;
    if (!strcmp(e, "info")) return PT_LOG_INFO;
    if (!strcmp(e, "debug")) return PT_LOG_DEBUG;
    return PT_LOG_WARN;
}

void pt_log_set_level(pt_log_level level) { g_level = (int)level; }

pt_log_level pt_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (pt_log_level)g_level;
}

void pt_log(pt_log_level level, const char *fmt, ...) {
    if ((int)level > (int)pt_log_get_level()) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "petrel: %s: %s\n", names[level], buf);
}
