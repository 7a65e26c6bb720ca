/* Internals of the safetensors reader, shared by its two files: the builder
 * that safetensors_header.c fills from each file's header and safetensors.c
 * turns into a pt_tensor_set. Not a public header: callers use safetensors.h. */
#ifndef PT_FORMAT_SAFETENSORS_INTERNAL_H
#define PT_FORMAT_SAFETENSORS_INTERNAL_H

#include "base/arena.h"
#include "format/safetensors.h"

#include <stddef.h>

/* Tensors and __metadata__ pairs gathered from every file of a set, in file
 * order; realloc'd arrays, owned by the builder until finish_set takes them. */
typedef struct {
    pt_tensor *v;
    int n, cap;
    pt_st_meta *meta;
    int n_meta, cap_meta;
} builder;

/* Grows the array *p of elem-sized items to hold `need` (doubling from 64). */
pt_status st_grow(void **p, int *cap, int need, size_t elem);

/* Parses the header of one file image into the builder: tensor names, keys
 * and values go into `arena`; tensor data points into `buf`. */
pt_status st_parse_file(const unsigned char *buf, size_t size, const char *what, int file_index,
                        pt_arena *arena, builder *b);

#endif
