/* safetensors: memory-mapped tensor sets (one file or a sharded checkpoint
 * described by model.safetensors.index.json), lookup by name, and a writer.
 *
 * File layout (little-endian): u64 header length N, N bytes of UTF-8 JSON
 * (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]},
 * plus an optional "__metadata__" object of string -> string), then the data
 * section; offsets are relative to the start of the data section.
 *
 * The header is parsed by a strict parser of our own, not cJSON, so that
 * offsets and dimensions are read exactly as 64-bit integers (cJSON keeps
 * doubles) and duplicate names are caught. Validation, all in 64-bit checked
 * arithmetic: N bounded by the file size and PT_ST_MAX_HEADER; the header is
 * one JSON object followed only by padding spaces; every tensor has a known
 * dtype, non-negative dimensions, begin <= end <= data size, byte size ==
 * dtype size * product(shape); no two tensors overlap; no duplicate names
 * (within a file or across shards). Any failure is PT_ERR_FORMAT with a
 * message naming the file, the tensor and the expected vs found value.
 *
 * Tensor data points into the read-only mapping; it is aligned only as well as
 * the writer aligned it (petrel's writer aligns the data section to 8 bytes;
 * other writers may not). Consumers that need alignment check
 * ((uintptr_t)data % n). This file knows nothing of models: which tensors a
 * model needs is src/model/spec.c's business. */
#ifndef PT_FORMAT_SAFETENSORS_H
#define PT_FORMAT_SAFETENSORS_H

#include "petrel.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PT_ST_MAX_DIMS 8
/* The reference implementation's header cap (100 MB). */
#define PT_ST_MAX_HEADER 100000000ull

typedef enum pt_dtype {
    PT_DTYPE_F32 = 0,
    PT_DTYPE_F16,
    PT_DTYPE_BF16,
    PT_DTYPE_F8_E4M3,
    PT_DTYPE_F8_E5M2,
    PT_DTYPE_I8,
    PT_DTYPE_U8,
    PT_DTYPE_I16,
    PT_DTYPE_U16,
    PT_DTYPE_I32,
    PT_DTYPE_U32,
    PT_DTYPE_I64,
    PT_DTYPE_U64,
    PT_DTYPE_F64,
    PT_DTYPE_BOOL,
    PT_DTYPE_COUNT
} pt_dtype;

/* "F32", "BF16", ... (the safetensors spelling); "?" for an invalid value. */
const char *pt_dtype_name(pt_dtype dt);
/* Bytes per element. */
size_t pt_dtype_size(pt_dtype dt);
/* Parses a safetensors dtype name; -1 if unknown. */
int pt_dtype_from_name(const char *name, size_t len);

/* One tensor of a set. Views into the set: valid while the set is open. */
typedef struct pt_tensor {
    const char *name;         /* full name as stored in the file */
    pt_dtype dtype;
    int ndim;                 /* 0..PT_ST_MAX_DIMS (0 = scalar) */
    int64_t shape[PT_ST_MAX_DIMS];
    int64_t n_elements;       /* product(shape); 1 for a scalar */
    const void *data;         /* into the mapping; NULL when nbytes == 0 */
    uint64_t nbytes;
    int file_index;           /* which shard (index into pt_tensor_set.files) */
    uint64_t offset;          /* begin offset inside that file's data section */
} pt_tensor;

typedef struct pt_st_file pt_st_file;

/* A key/value pair of "__metadata__". */
typedef struct pt_st_meta {
    const char *key, *value;
} pt_st_meta;

typedef struct pt_tensor_set {
    int n_tensors;
    pt_tensor *tensors;       /* sorted by file, then offset */
    int n_files;
    pt_st_file **files;
    char **file_paths;        /* [n_files] */
    int n_meta;               /* __metadata__ of every file, file order */
    pt_st_meta *meta;
    /* internal: name hash table */
    int *hash;
    size_t hash_cap;
    struct pt_arena *arena;
} pt_tensor_set;

/* Opens one .safetensors file. On error *out is untouched and nothing leaks. */
pt_status pt_st_open_file(const char *path, pt_tensor_set *out);

/* Opens the weights of a model directory: model.safetensors.index.json when
 * present (every shard it names must exist, every mapped tensor must be in the
 * shard the map names, no tensor may appear in two shards), else
 * model.safetensors, else every *.safetensors file in the directory (sorted
 * by name; tensors must be unique across them). PT_ERR_NOT_FOUND naming the
 * directory when there are no weights at all. */
pt_status pt_st_open_dir(const char *dir, pt_tensor_set *out);

/* Parses a header in memory (what pt_st_open_file does after mapping; the
 * fuzz target calls it directly). `buf` is the whole file image. */
pt_status pt_st_open_memory(const void *buf, size_t size, const char *what, pt_tensor_set *out);

void pt_st_close(pt_tensor_set *set);

/* Lookup by exact name; NULL when absent (no error set). */
const pt_tensor *pt_st_find(const pt_tensor_set *set, const char *name);
/* Value of a __metadata__ key, NULL when absent. */
const char *pt_st_meta_get(const pt_tensor_set *set, const char *key);

/* "[2, 3, 4]" into buf (for messages). Returns buf. */
char *pt_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);

/* ---------------------------------------------------------------------
 * Writer. Two steps so that large checkpoints stream: declare every tensor
 * (name, dtype, shape) then write each tensor's bytes in declaration order.
 *
 *   pt_st_writer *w; pt_st_writer_create(&w);
 *   pt_st_writer_add(w, "a", PT_DTYPE_F32, 2, shape);      ... for each
 *   pt_st_writer_set_meta(w, "format", "mlx");             optional
 *   pt_st_writer_begin(w, "out.safetensors");              writes the header
 *   pt_st_writer_write(w, bytes, n);                       ... data, in order
 *   pt_st_writer_finish(w);                                checks the byte count, closes
 *   pt_st_writer_free(&w);
 *
 * The header is padded with spaces so the data section starts 8-byte aligned;
 * tensors are laid out back to back in declaration order. Tensor names must
 * be unique (checked at add). */
typedef struct pt_st_writer pt_st_writer;

pt_status pt_st_writer_create(pt_st_writer **out);
pt_status pt_st_writer_add(pt_st_writer *w, const char *name, pt_dtype dtype, int ndim,
                           const int64_t *shape);
pt_status pt_st_writer_set_meta(pt_st_writer *w, const char *key, const char *value);
/* Total bytes of declared tensor data so far. */
uint64_t pt_st_writer_data_bytes(const pt_st_writer *w);
pt_status pt_st_writer_begin(pt_st_writer *w, const char *path);
pt_status pt_st_writer_write(pt_st_writer *w, const void *data, size_t n);
pt_status pt_st_writer_finish(pt_st_writer *w);
void pt_st_writer_free(pt_st_writer **w);

/* Convenience for tests and small files: writes every tensor from memory.
 * data[i] holds the bytes of tensor i (dtype size * product(shape)). */
typedef struct pt_st_entry {
    const char *name;
    pt_dtype dtype;
    int ndim;
    int64_t shape[PT_ST_MAX_DIMS];
    const void *data;
} pt_st_entry;
pt_status pt_st_write_file(const char *path, const pt_st_entry *entries, int n,
                           const pt_st_meta *meta, int n_meta);

#endif
