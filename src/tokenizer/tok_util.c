/* Tokenizer utilities: byte buffers, id vectors, UTF-8 encoding and Rust-style
 * lossy decoding, the character classes the reference library uses (Rust's
 * char predicates), hash maps (piece -> id, id pair -> merge) and pattern
 * matching (literal strings and PCRE2 regexes). Not the pipeline itself. */
#include "tokenizer/tok_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers --------------------------------------------------------------- */
pt_status tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return PT_OK;
    if (extra > SIZE_MAX / 2 - b->n) return pt_error(PT_ERR_NOMEM, "tokenizer: buffer too large");
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return PT_OK;
}
pt_status tok_buf_put(tok_buf *b, const void *s, size_t n) {
    PT_TRY(tok_buf_reserve(b, n + 1));
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0; /* always NUL-terminated for callers that hand it out */
    return PT_OK;
}
pt_status tok_buf_putc(tok_buf *b, char c) { return tok_buf_put(b, &c, 1); }
void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

pt_status tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return PT_OK;
}

/* ---- UTF-8 ----------------------------------------------------------------- */
int tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Rust's from_utf8_lossy replaces each "maximal subpart" of an ill-formed
 * sequence (the longest prefix of a well-formed sequence, or one byte) with one
 * U+FFFD; the second-byte ranges below are the Unicode well-formed table. */
pt_status tok_buf_put_lossy(tok_buf *b, const unsigned char *s, size_t n) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    if (n == 0) return PT_OK; /* s may be NULL for an empty piece */
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
        else if (c == 0xED) { need = 2; hi = 0x9F; }
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else need = -1;
        int k = 0; /* valid continuation bytes seen */
        if (need > 0 && i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi) {
            k = 1;
            while (k < need && i + 1 + k < n && s[i + 1 + k] >= 0x80 && s[i + 1 + k] <= 0xBF) k++;
        }
        if (need > 0 && k == need) { i += 1 + (size_t)need; continue; }
        PT_TRY(tok_buf_put(b, s + run, i - run));
        PT_TRY(tok_buf_put(b, fffd, 3));
        i += 1 + (size_t)k;
        run = i;
    }
    return tok_buf_put(b, s + run, n - run);
}

bool tok_is_whitespace(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}
/* UTS #18 \w, which the reference's regex engine uses for single_word:
 * letters, Nl, marks, Nd, Pc, the joiners and the circled/squared Latin letters. */
bool tok_is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') || c == '_';
    if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
        (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
        return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_NL ||
           (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_PC;
}
bool tok_is_punct(uint32_t c) {
    if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                         (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* ---- string map ------------------------------------------------------------ */
uint64_t tok_hash(const void *s, size_t n) {
    /* FNV-1a over 8-byte words then bytes, with a final mix: fast for the short
     * pieces (1-20 bytes) that dominate lookups. */
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *p++) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return h;
}

static pt_status strmap_grow(tok_strmap *m, size_t cap) {
    uint32_t *slots = calloc(cap, sizeof *slots), *hashes = malloc(cap * sizeof *hashes);
    if (!slots || !hashes) {
        free(slots);
        free(hashes);
        return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory (vocabulary map)");
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i]) continue;
        size_t j = m->hashes[i] & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
        hashes[j] = m->hashes[i];
    }
    free(m->slots);
    free(m->hashes);
    m->slots = slots;
    m->hashes = hashes;
    m->cap = cap;
    return PT_OK;
}

pt_status tok_strmap_reserve(tok_strmap *m, size_t n) {
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < 2 * n) cap *= 2;
    if (cap > m->cap) PT_TRY(strmap_grow(m, cap));
    if (n > m->ecap) {
        uint32_t *off = realloc(m->off, n * sizeof *off);
        if (off) m->off = off;
        uint32_t *len = realloc(m->len, n * sizeof *len);
        if (len) m->len = len;
        int32_t *v = realloc(m->val, n * sizeof *v);
        if (v) m->val = v;
        if (!off || !len || !v) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        m->ecap = n;
    }
    return PT_OK;
}

pt_status tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t val, bool *existed) {
    if (existed) *existed = false;
    if (n > UINT32_MAX / 2) return pt_error(PT_ERR_FORMAT, "tokenizer: token of %zu bytes", n);
    if ((m->n + 1) * 2 > m->cap) PT_TRY(strmap_grow(m, m->cap ? m->cap * 2 : 1024)); /* load factor <= 1/2 */
    uint32_t h = (uint32_t)tok_hash(s, n);
    size_t mask = m->cap - 1, i = h & mask;
    while (m->slots[i]) {
        uint32_t e = m->slots[i] - 1;
        if (m->hashes[i] == h && m->len[e] == n && memcmp(m->blob + m->off[e], s, n) == 0) {
            m->val[e] = val;
            if (existed) *existed = true;
            return PT_OK;
        }
        i = (i + 1) & mask;
    }
    if (m->n == m->ecap) {
        size_t ec = m->ecap ? m->ecap * 2 : 1024;
        uint32_t *off = realloc(m->off, ec * sizeof *off);
        if (off) m->off = off;
        uint32_t *len = realloc(m->len, ec * sizeof *len);
        if (len) m->len = len;
        int32_t *v = realloc(m->val, ec * sizeof *v);
        if (v) m->val = v;
        if (!off || !len || !v) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        m->ecap = ec;
    }
    if (m->blob_n + n + 1 > m->blob_cap) {
        size_t bc = m->blob_cap ? m->blob_cap : 4096;
        while (bc < m->blob_n + n + 1) bc *= 2;
        if (bc > UINT32_MAX) return pt_error(PT_ERR_FORMAT, "tokenizer: vocabulary text over 4 GiB");
        char *b = realloc(m->blob, bc);
        if (!b) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        m->blob = b;
        m->blob_cap = bc;
    }
    memcpy(m->blob + m->blob_n, s, n);
    m->blob[m->blob_n + n] = 0;
    m->off[m->n] = (uint32_t)m->blob_n;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = val;
    m->blob_n += n + 1;
    m->slots[i] = (uint32_t)(++m->n);
    m->hashes[i] = h;
    return PT_OK;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n) {
    if (!m->cap) return -1;
    uint32_t h = (uint32_t)tok_hash(s, n);
    size_t mask = m->cap - 1, i = h & mask;
    for (;;) {
        uint32_t e1 = m->slots[i];
        if (!e1) return -1;
        uint32_t e = e1 - 1;
        if (m->hashes[i] == h && m->len[e] == n && memcmp(m->blob + m->off[e], s, n) == 0)
            return m->val[e];
        i = (i + 1) & mask;
    }
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    free(m->hashes);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->blob);
    memset(m, 0, sizeof *m);
}

/* ---- pair map ---------------------------------------------------------------- */
static pt_status pairmap_grow(tok_pairmap *m, size_t cap) {
    uint64_t *keys = calloc(cap, sizeof *keys);
    int32_t *r = malloc(cap * sizeof *r), *mg = malloc(cap * sizeof *mg);
    if (!keys || !r || !mg) {
        free(keys);
        free(r);
        free(mg);
        return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory (merges)");
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = (size_t)((m->keys[i] * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        r[j] = m->rank[i];
        mg[j] = m->merged[i];
    }
    free(m->keys);
    free(m->rank);
    free(m->merged);
    m->keys = keys;
    m->rank = r;
    m->merged = mg;
    m->cap = cap;
    return PT_OK;
}

pt_status tok_pairmap_reserve(tok_pairmap *m, size_t n) {
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < 2 * n) cap *= 2;
    return cap > m->cap ? pairmap_grow(m, cap) : PT_OK;
}

pt_status tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    if ((m->n + 1) * 2 > m->cap) PT_TRY(pairmap_grow(m, m->cap ? m->cap * 2 : 1024));
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = m->cap - 1, i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
    if (m->keys[i] == k) return PT_OK; /* the reference keeps the first (lowest) rank of a pair */
    m->keys[i] = k;
    m->rank[i] = rank;
    m->merged[i] = merged;
    m->n++;
    return PT_OK;
}
void tok_pairmap_free(tok_pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

/* ---- patterns -------------------------------------------------------------------- */
/* The reference's regex engine (Oniguruma) follows Unicode's UTS #18 for
 * \s (the White_Space property, which has U+0085) and \w (Alphabetic, marks,
 * decimal digits, connector punctuation and the joiners U+200C/U+200D — not
 * No like '²'); PCRE2 10.42 with UCP uses other sets. The pattern is rewritten
 * so both engines agree; inside a class only the members are spliced in.
 * Alphabetic symbols outside L/Nl/M are the circled and squared Latin letters. */
#define W_MEMBERS "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\x{24B6}-\\x{24E9}" \
                  "\\x{1F130}-\\x{1F149}\\x{1F150}-\\x{1F169}\\x{1F170}-\\x{1F189}"
#define S_MEMBERS "\\s\\x{85}"
static pt_status rewrite_regex(const char *re, tok_buf *out) {
    int in_class = 0;
    for (size_t i = 0; re[i]; i++) {
        char c = re[i];
        if (c == '\\' && re[i + 1]) {
            char d = re[i + 1];
            const char *rep = NULL;
            if (d == 's') rep = in_class ? S_MEMBERS : "[" S_MEMBERS "]";
            else if (d == 'S' && !in_class) rep = "[^" S_MEMBERS "]";
            else if (d == 'w') rep = in_class ? W_MEMBERS : "[" W_MEMBERS "]";
            else if (d == 'W' && !in_class) rep = "[^" W_MEMBERS "]";
            if (rep) PT_TRY(tok_buf_put(out, rep, strlen(rep)));
            else PT_TRY(tok_buf_put(out, re + i, 2));
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            PT_TRY(tok_buf_putc(out, c));
            /* a ']' right after '[' or '[^' is a literal member */
            if (re[i + 1] == '^') { PT_TRY(tok_buf_putc(out, '^')); i++; }
            if (re[i + 1] == ']') { PT_TRY(tok_buf_putc(out, ']')); i++; }
            continue;
        }
        if (c == '[' && in_class && re[i + 1] == ':') { /* POSIX class [:alpha:] */
            const char *e = strstr(re + i + 2, ":]");
            if (e) {
                PT_TRY(tok_buf_put(out, re + i, (size_t)(e + 2 - (re + i))));
                i = (size_t)(e + 1 - re);
                continue;
            }
        }
        if (c == ']' && in_class) in_class = 0;
        PT_TRY(tok_buf_putc(out, c));
    }
    return tok_buf_put(out, "", 0);
}

pt_status tok_pattern_compile_regex(tok_pattern *p, const char *regex, const char *what) {
    tok_buf b = {0};
    pt_status st = rewrite_regex(regex, &b);
    if (st) return st;
    int err;
    PCRE2_SIZE eoff;
    p->re = pcre2_compile((PCRE2_SPTR)b.p, b.n, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
    tok_buf_free(&b);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return pt_error(PT_ERR_FORMAT, "%s: bad regex \"%s\": %s", what, regex, (char *)msg);
    }
    /* JIT is an accelerator only: without it (unsupported CPU) matching still works. */
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return PT_OK;
}

void tok_pattern_free(tok_pattern *p) {
    free(p->literal);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

pt_status tok_pattern_find(const tok_pattern *p, pcre2_match_data *md, pcre2_match_context *mc,
                           const char *s, size_t n,
                           tok_match **out, size_t *n_out, size_t *cap_out) {
    size_t k = 0;
#define PUSH_MATCH(a, b)                                                            \
    do {                                                                            \
        if (k == *cap_out) {                                                        \
            size_t c_ = *cap_out ? *cap_out * 2 : 64;                               \
            tok_match *m_ = realloc(*out, c_ * sizeof *m_);                         \
            if (!m_) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");     \
            *out = m_;                                                              \
            *cap_out = c_;                                                          \
        }                                                                           \
        (*out)[k].start = (a);                                                      \
        (*out)[k].end = (b);                                                        \
        k++;                                                                        \
    } while (0)
    if (!p->re) {
        size_t L = p->literal_len;
        if (L > 0) {
            size_t i = 0;
            while (i + L <= n) {
                const char *f = memmem(s + i, n - i, p->literal, L);
                if (!f) break;
                size_t st = (size_t)(f - s);
                PUSH_MATCH(st, st + L);
                i = st + L;
            }
        }
        *n_out = k;
        return PT_OK;
    }
    size_t pos = 0;
    while (pos <= n) {
        /* The subject was validated once up front; PCRE2_NO_UTF_CHECK avoids
         * re-validating the whole subject at every call (quadratic otherwise). */
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !mc) {
            /* A very long match (e.g. a 100k-letter word under \p{L}+)
             * outgrew the default 32 KiB JIT stack: retry this match with a
             * large one. Rare, so it is not set up for every call. */
            pcre2_match_context *c2 = pcre2_match_context_create(NULL);
            pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 256 * 1024 * 1024, NULL);
            if (c2 && js) {
                pcre2_jit_stack_assign(c2, NULL, js);
                rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, c2);
            }
            if (js) pcre2_jit_stack_free(js);
            if (c2) pcre2_match_context_free(c2);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return pt_error(PT_ERR_INTERNAL, "tokenizer: regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b > a) {
            PUSH_MATCH(a, b);
            pos = b;
        } else {
            /* An empty match splits nothing; step over one character. */
            if (a >= n) break;
            pos = a + (size_t)tok_utf8_len((unsigned char)s[a]);
        }
    }
#undef PUSH_MATCH
    *n_out = k;
    return PT_OK;
}
