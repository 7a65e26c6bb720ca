/* The BPE model: one pre-token (a "word") -> ids. Characters become initial
 * symbols (with continuing_subword_prefix / end_of_word_suffix, byte fallback
 * to <0xXX> pieces, unk and fuse_unk exactly as the reference orders them),
 * then the adjacent pair with the lowest merge rank (leftmost on ties) is
 * merged until no pair has a rank. Not the pre-tokenization or vocabulary
 * loading (tok_load.c). */
#include "tokenizer/tok_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

pt_status tok_bpe_init_tables(tok_bpe *b) {
    for (int c = 0; c < 128; c++) {
        char s = (char)c;
        b->ascii_ids[c] = tok_strmap_get(&b->vocab, &s, 1);
    }
    for (int c = 0; c < 256; c++) {
        char s[8];
        static const char hex[] = "0123456789ABCDEF";
        s[0] = '<'; s[1] = '0'; s[2] = 'x'; s[3] = hex[c >> 4]; s[4] = hex[c & 15]; s[5] = '>';
        b->byte_ids[c] = tok_strmap_get(&b->vocab, s, 6);
    }
    return PT_OK;
}

/* Merge loop for short words: ranks of adjacent pairs kept in an array and
 * scanned for the minimum. For the 1-20 symbol words that make up nearly all
 * text this beats a heap (no allocation, cache-resident). */
#define BPE_SMALL 48
static void merge_small(const tok_bpe *b, int32_t *ids, size_t *n_io) {
    size_t n = *n_io;
    int32_t rank[BPE_SMALL], merged[BPE_SMALL];
    for (size_t i = 0; i + 1 < n; i++)
        if (!tok_pairmap_get(&b->merges, ids[i], ids[i + 1], &rank[i], &merged[i])) rank[i] = INT32_MAX;
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT32_MAX) break;
        ids[best] = merged[best];
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof *ids);
        if (n >= best + 3) { /* pairs right of the merged one shift left by one */
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof *rank);
            memmove(merged + best + 1, merged + best + 2, (n - best - 3) * sizeof *merged);
        }
        n--;
        if (best > 0 && !tok_pairmap_get(&b->merges, ids[best - 1], ids[best], &rank[best - 1],
                                         &merged[best - 1]))
            rank[best - 1] = INT32_MAX;
        if (best + 1 < n && !tok_pairmap_get(&b->merges, ids[best], ids[best + 1], &rank[best],
                                             &merged[best]))
            rank[best] = INT32_MAX;
    }
    *n_io = n;
}

/* Merge loop for long words: a binary min-heap of candidate merges ordered by
 * (rank, position), symbols in a linked list; stale entries are detected when
 * popped (the pair there no longer produces the same merged id). O(n log n). */
typedef struct { int32_t rank, pos, merged; } heap_ent;
static int heap_less(heap_ent a, heap_ent b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}
static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}
static heap_ent heap_pop(heap_ent *h, size_t *n) {
    heap_ent top = h[0], e = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        heap_ent best = e;
        if (l < *n && heap_less(h[l], best)) { m = l; best = h[l]; }
        if (r < *n && heap_less(h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = e;
    return top;
}
static pt_status merge_large(const tok_bpe *b, int32_t *ids, size_t *n_io) {
    size_t n = *n_io;
    int32_t *prev = malloc(n * sizeof *prev), *next = malloc(n * sizeof *next);
    heap_ent *h = malloc(n * 2 * sizeof *h); /* each merge pushes <= 2, pops 1: n + n bounds it */
    if (!prev || !next || !h) {
        free(prev); free(next); free(h);
        return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory (word of %zu symbols)", n);
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        heap_ent e = {0, (int32_t)i, 0};
        if (tok_pairmap_get(&b->merges, ids[i], ids[i + 1], &e.rank, &e.merged)) heap_push(h, &hn, e);
    }
    while (hn) {
        heap_ent e = heap_pop(h, &hn);
        int32_t p = e.pos;
        if (ids[p] < 0 || next[p] < 0) continue; /* consumed by an earlier merge */
        int32_t q = next[p], r, m;
        if (!tok_pairmap_get(&b->merges, ids[p], ids[q], &r, &m) || m != e.merged) continue;
        ids[p] = m;
        ids[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            heap_ent f = {0, prev[p], 0};
            if (tok_pairmap_get(&b->merges, ids[prev[p]], ids[p], &f.rank, &f.merged)) heap_push(h, &hn, f);
        }
        if (next[p] >= 0) {
            heap_ent f = {0, p, 0};
            if (tok_pairmap_get(&b->merges, ids[p], ids[next[p]], &f.rank, &f.merged)) heap_push(h, &hn, f);
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0) ids[k++] = ids[i];
    *n_io = k;
    free(prev); free(next); free(h);
    return PT_OK;
}

pt_status tok_bpe_encode(const tok_bpe *b, const char *word, size_t n, tok_ids *out) {
    if (n == 0) return PT_OK;
    if (b->ignore_merges) {
        int32_t id = tok_strmap_get(&b->vocab, word, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    size_t start = out->n;
    /* Initial symbols are appended to `out` and merged in place. */
    int32_t unk_pending = 0; /* 1 while an unk symbol waits to be emitted */
    char stack_s[64];
    for (size_t i = 0; i < n;) {
        int clen = tok_utf8_len((unsigned char)word[i]);
        if (i + (size_t)clen > n) clen = (int)(n - i);
        bool first = i == 0, last = i + (size_t)clen == n;
        bool plain = (first || !b->prefix) && (!last || !b->suffix);
        int32_t id;
        const char *s = word + i;
        size_t sl = (size_t)clen;
        char *heap_s = NULL;
        if (plain && clen == 1 && (unsigned char)word[i] < 128) {
            id = b->ascii_ids[(unsigned char)word[i]];
        } else if (plain) {
            id = tok_strmap_get(&b->vocab, s, sl);
        } else {
            size_t pl = first ? 0 : b->prefix_len, xl = last ? b->suffix_len : 0;
            sl = pl + (size_t)clen + xl;
            char *d = stack_s;
            if (sl > sizeof stack_s) {
                d = heap_s = malloc(sl);
                if (!d) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
            }
            if (pl) memcpy(d, b->prefix, pl);
            memcpy(d + pl, word + i, (size_t)clen);
            if (xl) memcpy(d + pl + (size_t)clen, b->suffix, xl);
            s = d;
            id = tok_strmap_get(&b->vocab, s, sl);
        }
        pt_status st = PT_OK;
        if (id >= 0) {
            if (unk_pending) { st = tok_ids_push(out, b->unk_id); unk_pending = 0; }
            if (!st) st = tok_ids_push(out, id);
        } else {
            bool done = false;
            if (b->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < sl; k++)
                    if (b->byte_ids[(unsigned char)s[k]] < 0) { all = false; break; }
                if (all) {
                    /* As in the reference, a pending unk is not flushed here:
                     * it is emitted after these bytes, at the next known
                     * character or the end of the word. */
                    for (size_t k = 0; k < sl && !st; k++) st = tok_ids_push(out, b->byte_ids[(unsigned char)s[k]]);
                    done = true;
                }
            }
            if (!done && b->unk_id >= 0) {
                if (unk_pending && !b->fuse_unk) st = tok_ids_push(out, b->unk_id);
                unk_pending = 1;
            }
            /* no unk token: the character is dropped, as the reference does */
        }
        free(heap_s);
        if (st) return st;
        i += (size_t)clen;
    }
    if (unk_pending) PT_TRY(tok_ids_push(out, b->unk_id));
    size_t m = out->n - start;
    if (m < 2 || !b->merges.n) return PT_OK;
    if (m <= BPE_SMALL) merge_small(b, out->v + start, &m);
    else PT_TRY(merge_large(b, out->v + start, &m));
    out->n = start + m;
    return PT_OK;
}
