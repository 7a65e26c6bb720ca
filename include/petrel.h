/* petrel — public C API.
 *
 * One header for applications embedding petrel. Opaque handles, `pt_` prefix,
 * every function returns a pt_status (0 ok, negative error) unless noted, and
 * on error a message naming what was wrong is available from pt_last_error()
 * (thread-local; valid until the next petrel call on the same thread).
 *
 * This header is the stable surface; everything under src/ is internal.
 */
#ifndef PETREL_H
#define PETREL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PT_VERSION_MAJOR 0
#define PT_VERSION_MINOR 1
#define PT_VERSION_PATCH 0
#define PT_VERSION_STRING "0.1.0"

/* Status codes. 0 is success; every error is negative. */
typedef enum pt_status {
    PT_OK = 0,
    PT_ERR_INVALID_ARG = -1,   /* a caller-supplied argument is invalid */
    PT_ERR_IO = -2,            /* a file could not be opened/read/written */
    PT_ERR_FORMAT = -3,        /* a file is malformed (truncated, lying header, bad JSON) */
    PT_ERR_UNSUPPORTED = -4,   /* valid input that petrel cannot handle (yet) */
    PT_ERR_NOMEM = -5,         /* allocation failed */
    PT_ERR_RANGE = -6,         /* a value is out of range (token id, context length) */
    PT_ERR_NOT_FOUND = -7,     /* a required file/tensor/field is missing */
    PT_ERR_INTERNAL = -8,      /* an internal invariant failed */
    PT_ERR_CANCELLED = -9,     /* the operation was cancelled by the caller */
    PT_ERR_DEVICE = -10,       /* a device (CUDA) call failed */
} pt_status;

/* The message describing the last error on this thread ("" if none).
 * The pointer stays valid until the next petrel call on this thread. */
const char *pt_last_error(void);

/* A short constant name for a status code ("PT_ERR_FORMAT"). */
const char *pt_status_name(pt_status s);

/* The library version string, e.g. "0.1.0". */
const char *pt_version(void);

#ifdef __cplusplus
}
#endif
#endif /* PETREL_H */
