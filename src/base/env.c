/* Switches read from the environment (see env.h). */
#include "base/env.h"

#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Whether this is the first warning about variable `name` in the process: a switch some path reads on every
 * call (the CUDA sampler's) says so once, not every step. */
static int first_warning(const char *name) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char seen[64][64];
    static int n_seen;
    int first = 1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_seen && first; i++)
        if (!strncmp(seen[i], name, sizeof seen[i] - 1)) first = 0;
    if (first && n_seen < 64) snprintf(seen[n_seen++], sizeof seen[0], "%s", name);
    pthread_mutex_unlock(&mu);
    return first;
}

int pt_env_flag(const char *name, int dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    static const char *on[] = {"1", "on", "true", "yes"}, *off[] = {"0", "off", "false", "no"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(e, on[i])) return 1;
        if (!strcasecmp(e, off[i])) return 0;
    }
    if (first_warning(name))
        PT_LOGW("%s=%s is not one of 1/on/true/yes or 0/off/false/no; keeping the default (%s)", name, e,
                dflt ? "on" : "off");
    return dflt;
}

/* The decimal integer e spells (blanks around it allowed) into *v; 0 when it is not one. */
static int parse_int(const char *e, long *v) {
    char *end = NULL;
    errno = 0;
    *v = strtol(e, &end, 10);
    if (end == e || errno) return 0;
    while (*end == ' ' || *end == '\t') end++;
    return *end == 0;
}

int pt_env_int(const char *name, int lo, int hi, int dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    long v;
    if (parse_int(e, &v) && v >= lo && v <= hi) return (int)v;
    if (first_warning(name))
        PT_LOGW("%s=%s is not a whole number from %d to %d; keeping the default (%d)", name, e, lo, hi, dflt);
    return dflt;
}

int pt_env_pick(const char *name, const int *allowed, int n, int dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    long v;
    if (parse_int(e, &v))
        for (int i = 0; i < n; i++)
            if (v == allowed[i]) return allowed[i];
    if (!first_warning(name)) return dflt;
    char list[128];
    size_t at = 0;
    list[0] = 0;
    for (int i = 0; i < n && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? ", " : "", allowed[i]);
    int listed = 0;
    for (int i = 0; i < n; i++) listed |= allowed[i] == dflt;
    if (listed) PT_LOGW("%s=%s is not one of %s; keeping the default (%d)", name, e, list, dflt);
    else PT_LOGW("%s=%s is not one of %s; keeping the default (the built-in choice)", name, e, list);
    return dflt;
}
