/* Bump allocator (see arena.h). */
#include "base/arena.h"

#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct pt_arena_block {
    pt_arena_block *next;
    size_t cap, off;
    _Alignas(64) unsigned char data[];
};

void pt_arena_init(pt_arena *a, size_t block_size) {
    a->head = NULL;
    a->block_size = block_size ? block_size : (size_t)1 << 20;
    a->used = 0;
}

void *pt_arena_alloc(pt_arena *a, size_t size) {
    size_t need = (size + 63) & ~(size_t)63;
    if (need < size) {
        pt_error(PT_ERR_NOMEM, "arena allocation of %zu bytes overflows", size);
        return NULL;
    }
    if (!a->head || a->head->cap - a->head->off < need) {
        size_t cap = need > a->block_size ? need : a->block_size;
        if (cap > SIZE_MAX - sizeof(pt_arena_block) - 64) {
            pt_error(PT_ERR_NOMEM, "arena allocation of %zu bytes overflows", size);
            return NULL;
        }
        pt_arena_block *b = aligned_alloc(64, (sizeof(pt_arena_block) + cap + 63) & ~(size_t)63);
        if (!b) {
            pt_error(PT_ERR_NOMEM, "out of memory allocating %zu bytes", cap);
            return NULL;
        }
        b->next = a->head;
        b->cap = cap;
        b->off = 0;
        a->head = b;
    }
    void *p = a->head->data + a->head->off;
    a->head->off += need;
    a->used += need;
    memset(p, 0, size);
    return p;
}

char *pt_arena_strndup(pt_arena *a, const char *s, size_t n) {
    char *d = pt_arena_alloc(a, n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *pt_arena_strdup(pt_arena *a, const char *s) { return pt_arena_strndup(a, s, strlen(s)); }

void pt_arena_free(pt_arena *a) {
    pt_arena_block *b = a->head;
    while (b) {
        pt_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->used = 0;
}
