/* A bump allocator: one allocation per category, with views into it.
 * pt_arena_alloc returns 64-byte aligned memory (SIMD-friendly); everything is
 * released at once by pt_arena_free. Not thread-safe. */
#ifndef PT_BASE_ARENA_H
#define PT_BASE_ARENA_H

#include <stddef.h>

typedef struct pt_arena_block pt_arena_block;
typedef struct pt_arena {
    pt_arena_block *head;
    size_t block_size; /* default size of new blocks */
    size_t used;       /* bytes handed out */
} pt_arena;

void pt_arena_init(pt_arena *a, size_t block_size);
/* NULL (and a pt_error message) on overflow/out of memory. Memory is zeroed. */
void *pt_arena_alloc(pt_arena *a, size_t size);
char *pt_arena_strdup(pt_arena *a, const char *s);
char *pt_arena_strndup(pt_arena *a, const char *s, size_t n);
void pt_arena_free(pt_arena *a);

#endif
