/* JSON helpers over cJSON. cJSON keeps numbers as doubles and accepts
 * duplicate keys silently; these helpers reject duplicates where a format
 * forbids them and read integers through range-checked doubles (never
 * cJSON's valueint). */
#ifndef PT_BASE_JSON_H
#define PT_BASE_JSON_H

#include "petrel.h"
#include <cjson/cJSON.h>
#include <stdint.h>

/* Parses `len` bytes of text. `what` names the source in messages (a path).
 * With reject_duplicates, any object with a repeated key is an error. */
pt_status pt_json_parse(const char *text, size_t len, const char *what, int reject_duplicates,
                        cJSON **out);
/* Reads and parses a file. */
pt_status pt_json_load_file(const char *path, int reject_duplicates, cJSON **out);

/* Finds the first object member whose key has duplicates (NULL if none), recursively. */
const char *pt_json_find_duplicate(const cJSON *node);

/* Integer accessors: the member must be a number with an exact integer value
 * in [lo, hi]. PT_ERR_NOT_FOUND when absent (or null), PT_ERR_FORMAT otherwise. */
pt_status pt_json_get_i64(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          const char *what);
/* Like pt_json_get_i64 for a number node itself. */
pt_status pt_json_to_i64(const cJSON *node, int64_t lo, int64_t hi, int64_t *out, const char *what);
pt_status pt_json_get_f64(const cJSON *obj, const char *key, double *out, const char *what);
/* NULL when absent or not a string. */
const char *pt_json_get_str(const cJSON *obj, const char *key);
/* 1 true, 0 false, -1 absent/other type. */
int pt_json_get_bool(const cJSON *obj, const char *key);

/* Checks that `s` (length n) is valid UTF-8 (no overlongs, no surrogates,
 * <= U+10FFFF). Returns the byte offset of the first invalid byte, or -1. */
long pt_utf8_invalid_offset(const char *s, size_t n);

#endif
