/* Internal structures of the tokenizer shared by its .c files: the loaded
 * pipeline (normalizers, pre-tokenizers, BPE model, post-processor, decoders,
 * added tokens), hash maps, a growable byte buffer and UTF-8 helpers.
 * Not a public interface: only src/tokenizer/tok_*.c include it. */
#ifndef PT_TOK_INTERNAL_H
#define PT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/arena.h"
#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable byte buffer ---------------------------------------------- */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;
pt_status tok_buf_reserve(tok_buf *b, size_t extra);
pt_status tok_buf_put(tok_buf *b, const void *s, size_t n);
pt_status tok_buf_putc(tok_buf *b, char c);
void tok_buf_free(tok_buf *b);

/* ---- growable id vector -------------------------------------------------- */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
pt_status tok_ids_push(tok_ids *a, int32_t id);

/* ---- UTF-8 --------------------------------------------------------------- */
/* Decodes one code point at s[0..n) (input already validated); *adv = bytes. */
static inline uint32_t tok_utf8_next(const unsigned char *s, size_t n, int *adv) {
    unsigned c = s[0];
    if (c < 0x80 || n < 2) { *adv = 1; return c; }
    if (c < 0xE0) { *adv = 2; return ((c & 0x1F) << 6) | (s[1] & 0x3F); }
    if (c < 0xF0 || n < 4) {
        *adv = 3;
        return ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *adv = 4;
    return ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}
/* Length in bytes of the UTF-8 sequence starting with lead byte c (1 for continuation bytes). */
static inline int tok_utf8_len(unsigned char c) {
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
int tok_utf8_encode(uint32_t cp, char out[4]);
/* Appends bytes as Rust's String::from_utf8_lossy does (each maximal invalid
 * subpart becomes one U+FFFD). */
pt_status tok_buf_put_lossy(tok_buf *b, const unsigned char *s, size_t n);
bool tok_is_whitespace(uint32_t cp);   /* Rust char::is_whitespace */
bool tok_is_word(uint32_t cp);         /* the regex \w of the reference (UTS #18 word class) */
bool tok_is_punct(uint32_t cp);        /* ASCII punctuation or Unicode P* */

/* ---- string -> id hash map (open addressing, strings in one blob) -------- */
typedef struct tok_strmap {
    uint32_t *slots; /* [cap] entry index + 1, 0 = empty */
    uint32_t *hashes; /* [cap] */
    size_t cap, n;
    /* entries */
    uint32_t *off, *len; /* into blob */
    int32_t *val;
    size_t ecap;
    char *blob;
    size_t blob_n, blob_cap;
} tok_strmap;
uint64_t tok_hash(const void *s, size_t n);
/* Inserts (replacing the value of an existing key; *existed, if not NULL,
 * tells which). */
pt_status tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t val, bool *existed);
/* Sizes the map for n entries up front (no rehashing while loading). */
pt_status tok_strmap_reserve(tok_strmap *m, size_t n);
/* -1 if absent. */
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n);
void tok_strmap_free(tok_strmap *m);

/* ---- (id, id) -> (rank, new id) map for merges --------------------------- */
typedef struct tok_pairmap {
    uint64_t *keys; /* [cap] (a << 32 | b) + 1, 0 = empty */
    int32_t *rank, *merged;
    size_t cap, n;
} tok_pairmap;
pt_status tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
pt_status tok_pairmap_reserve(tok_pairmap *m, size_t n);
static inline bool tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank,
                                   int32_t *merged) {
    if (!m->cap) return false;
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (size_t)(h >> 20) & mask;
    for (;;) {
        uint64_t s = m->keys[i];
        if (s == k) { *rank = m->rank[i]; *merged = m->merged[i]; return true; }
        if (!s) return false;
        i = (i + 1) & mask;
    }
}
void tok_pairmap_free(tok_pairmap *m);

/* ---- patterns (Split, Replace) ------------------------------------------- */
typedef struct tok_pattern {
    char *literal; /* String pattern (may be ""), or NULL for a regex */
    size_t literal_len;
    pcre2_code *re;
} tok_pattern;
/* Compiles a JSON {"String": s} / {"Regex": r} pattern. */
pt_status tok_pattern_compile_regex(tok_pattern *p, const char *regex, const char *what);
void tok_pattern_free(tok_pattern *p);
/* Finds matches in s[0..n): calls cb(start, end) for each, left to right,
 * non-overlapping. Returns PT_OK or an error from the regex engine. */
typedef struct tok_match { size_t start, end; } tok_match;
pt_status tok_pattern_find(const tok_pattern *p, pcre2_match_data *md, pcre2_match_context *mc,
                           const char *s, size_t n,
                           tok_match **out, size_t *n_out, size_t *cap_out);

/* ---- pipeline components ------------------------------------------------- */
typedef enum {
    NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_STRIP, NORM_PREPEND,
    NORM_REPLACE, NORM_SEQUENCE, NORM_STRIP_ACCENTS
} tok_norm_kind;
typedef struct tok_norm {
    tok_norm_kind kind;
    bool strip_left, strip_right;
    char *str; /* prepend / replace content */
    size_t str_len;
    tok_pattern pat;
    struct tok_norm *items;
    size_t n_items;
} tok_norm;

typedef enum {
    SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS
} tok_split_behavior;
typedef enum {
    PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE, PRE_DIGITS, PRE_WHITESPACE, PRE_WHITESPACE_SPLIT,
    PRE_PUNCTUATION, PRE_SEQUENCE, PRE_CHAR_DELIMITER
} tok_pre_kind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend_scheme;
typedef struct tok_pre {
    tok_pre_kind kind;
    tok_pattern pat;      /* Split (ByteLevel's use_regex uses the shared GPT-2 regex) */
    tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    bool individual_digits;           /* Digits */
    char replacement[5];              /* Metaspace (UTF-8, NUL-terminated) */
    uint32_t replacement_cp;
    tok_prepend_scheme prepend;
    bool split;
    uint32_t delimiter;               /* CharDelimiterSplit */
    struct tok_pre *items;
    size_t n_items;
} tok_pre;

typedef enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP,
               DEC_SEQUENCE } tok_dec_kind;
typedef struct tok_dec {
    tok_dec_kind kind;
    tok_pattern pat;   /* Replace */
    char *content;     /* Replace content */
    size_t content_len;
    uint32_t strip_cp; /* Strip content */
    int strip_start, strip_stop;
    uint32_t replacement_cp; /* Metaspace */
    tok_prepend_scheme prepend;
    struct tok_dec *items;
    size_t n_items;
} tok_dec;

/* Post-processor: what encode(add_special=true) adds. Only the single-sequence
 * template matters for petrel: ids before and after the sequence. */
typedef struct tok_post {
    int32_t *before, *after;
    size_t n_before, n_after;
} tok_post;

typedef struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    char *norm; /* content after the normalizer (normalized tokens) */
    size_t norm_len;
    bool special, single_word, lstrip, rstrip, normalized;
} tok_added;

/* A byte trie over added-token contents for leftmost-longest matching. */
typedef struct tok_trie_node {
    int32_t first_child, next_sibling;
    int32_t token; /* index into added[] or -1 */
    unsigned char byte;
} tok_trie_node;
typedef struct tok_trie {
    tok_trie_node *nodes;
    size_t n, cap;
    bool first_byte[256];
} tok_trie;

/* The BPE model. */
typedef struct tok_bpe {
    tok_strmap vocab;  /* piece -> id */
    tok_pairmap merges;
    int32_t unk_id;    /* -1 if none */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix / end_of_word_suffix (NULL if none) */
    size_t prefix_len, suffix_len;
    int32_t byte_ids[256];  /* <0xXX> ids for byte fallback (-1 if absent) */
    int32_t ascii_ids[128]; /* vocab id of each 1-byte char (no prefix/suffix), -1 if absent */
} tok_bpe;

struct pt_tokenizer {
    pt_arena arena;
    tok_bpe bpe;
    bool has_norm, has_pre, has_dec;
    tok_norm norm;
    tok_pre pre;
    tok_dec dec;
    tok_post post;
    tok_added *added;
    size_t n_added;
    tok_trie trie_raw, trie_norm; /* non-normalized / normalized added tokens */
    tok_strmap added_map; /* content -> id */
    /* id -> piece (model vocab or added token content) */
    const char **pieces;
    uint32_t *piece_len;
    uint8_t *flags; /* per id: 1 = added, 2 = special */
    int32_t vocab_size;
    pcre2_code *gpt2_re; /* ByteLevel use_regex */
    uint32_t byte_to_cp[256]; /* GPT-2 bytes_to_unicode */
    int16_t cp_to_byte[324];  /* inverse for code points < 324, -1 = none */
    /* config files */
    int32_t bos_id, eos_id, pad_id, unk_id_cfg;
    char *bos_token, *eos_token;
    int add_bos, add_eos;
    int32_t *eos_ids;
    size_t n_eos;
};

/* tok_load.c */
pt_status tok_load_root(pt_tokenizer *t, const void *root_json, const char *what);
void tok_free_components(pt_tokenizer *t);
/* tok_normalize.c: normalizes s[0..n) into out (appended). */
pt_status tok_normalize(const pt_tokenizer *t, const tok_norm *nm, const char *s, size_t n,
                        tok_buf *out);
/* tok_pretok.c */
typedef struct tok_piece {
    size_t off, len; /* into the work buffer */
    bool first;      /* starts at offset 0 of the original text */
} tok_piece;
typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
} tok_pieces;
pt_status tok_pieces_push(tok_pieces *p, size_t off, size_t len, bool first);
typedef struct tok_work {
    tok_buf buf;          /* bytes of all pieces */
    tok_pieces a, b;      /* ping-pong piece lists */
    tok_match *m;         /* match scratch */
    size_t m_cap;
    struct tok_span *sp;  /* span scratch */
    size_t sp_cap;
    pcre2_match_data *md;
    pcre2_match_context *mc; /* NULL: defaults (see tok_pattern_find) */
} tok_work;
pt_status tok_pretokenize(const pt_tokenizer *t, const tok_pre *pre, tok_work *w, tok_pieces *in,
                          tok_pieces *out);
/* tok_bpe.c */
pt_status tok_bpe_init_tables(tok_bpe *b);
pt_status tok_bpe_encode(const tok_bpe *b, const char *word, size_t n, tok_ids *out);
/* tok_decode.c */
pt_status tok_decode_tokens(const pt_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                            tok_buf *out);

#endif
