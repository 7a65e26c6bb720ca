/* stderr logging (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

int pt_log_level_parse(const char *s) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static int level_from_env(void) {
    const char *e = getenv("PETREL_LOG");
    if (!e || !*e) return PT_LOG_WARN;
    const int l = pt_log_level_parse(e);
    if (l >= 0) return l;
    fprintf(stderr, "petrel: warning: PETREL_LOG=%s is not one of error, warn, info, debug; logging warnings\n", e);
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
