/* Logging to stderr with levels. The level comes from PETREL_LOG
 * (error|warn|info|debug, default warn; any other value keeps warn and says
 * so once on stderr) or pt_log_set_level(). */
#ifndef PT_BASE_LOG_H
#define PT_BASE_LOG_H

typedef enum { PT_LOG_ERROR = 0, PT_LOG_WARN = 1, PT_LOG_INFO = 2, PT_LOG_DEBUG = 3 } pt_log_level;

/* The level a PETREL_LOG value names ("error", "warn", "info", "debug"),
 * or -1 for anything else (NULL and "" included). */
int pt_log_level_parse(const char *s);
void pt_log_set_level(pt_log_level level);
pt_log_level pt_log_get_level(void);
void pt_log(pt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define PT_LOGE(...) pt_log(PT_LOG_ERROR, __VA_ARGS__)
#define PT_LOGW(...) pt_log(PT_LOG_WARN, __VA_ARGS__)
#define PT_LOGI(...) pt_log(PT_LOG_INFO, __VA_ARGS__)
#define PT_LOGD(...) pt_log(PT_LOG_DEBUG, __VA_ARGS__)

#endif
