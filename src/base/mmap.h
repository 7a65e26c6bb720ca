/* Read-only file mapping. An empty file maps to data=NULL, size=0 (valid). */
#ifndef PT_BASE_MMAP_H
#define PT_BASE_MMAP_H

#include "petrel.h"
#include <stddef.h>

typedef struct pt_mmap {
    const unsigned char *data;
    size_t size;
    char *path; /* owned copy of the path, for messages */
} pt_mmap;

/* Maps `path` read-only. PT_ERR_IO with the path and errno text on failure. */
pt_status pt_mmap_open(pt_mmap *m, const char *path);
void pt_mmap_close(pt_mmap *m);

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len excludes the NUL). */
pt_status pt_read_file(const char *path, char **out, size_t *len);
/* Writes a whole buffer to a file (truncating). */
pt_status pt_write_file(const char *path, const void *data, size_t len);
/* 1 if the path exists and is a regular file / a directory. */
int pt_is_file(const char *path);
int pt_is_dir(const char *path);
/* Joins dir + "/" + name into a malloc'd string. */
char *pt_path_join(const char *dir, const char *name);

#endif
